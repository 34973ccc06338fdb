/* graph/eval/eval_reduce_shape.c — reference kernels for reductions (sum, mean, amax), the
 * shape ops (view, reshape, permute, transpose, t, expand, slice and its backward, cat,
 * (un)squeeze, clone, _to_copy) and the matrix products (mm, bmm, addmm). Data movement only
 * where possible: a view-like op here always produces a fresh contiguous copy.
 */
#include "graph/eval/eval_internal.h"

#include <math.h>
#include <string.h>

/* Normalised dim attribute; the graph verified, so the value is in range. */
static int attr_dim(const hp_node *n, hp_attr_key k, int rank) {
    int d = 0;
    hp_status st = hp__norm_dim(hp_node_int(n, k, 0), rank, hp_attr_key_name(k), &d, NULL);
    HP_ASSERT(st == HP_OK);
    return d;
}

/* ---- reductions ----------------------------------------------------------------------------- */

HP__EVAL_KERNEL(hp__eval_reduce) {
    const hp_type *t = &in[0]->type;
    bool mask[HP_MAX_RANK] = {0};
    hp__reduce_mask(n, t->rank, mask);
    /* ost: the output offset contributed by each input dim (0 on reduced dims). The kept dims
     * keep their order, so the layout is the same with or without keepdim. */
    int64_t ost[HP_MAX_RANK], count = 1, s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        if (mask[d]) {
            ost[d] = 0;
            count *= t->shape[d];
        } else {
            ost[d] = s;
            s *= t->shape[d];
        }
    }
    double *y = out[0].data;
    int64_t n_out = hp__eval_numel(&out[0]), n_in = hp__eval_numel(in[0]);
    if (n->op == HP_OP_AMAX) {
        if (count == 0 && n_out > 0) { /* the shape rule refuses this; stay safe anyway */
            char buf[128];
            return hp_errf(err, HP_INVALID, "amax over an empty dimension of %s",
                           hp_type_str(t, buf, sizeof buf));
        }
        for (int64_t i = 0; i < n_out; i++) y[i] = -INFINITY;
    }
    int64_t idx[HP_MAX_RANK];
    for (int64_t i = 0; i < n_in; i++) {
        hp__eval_unravel(t, i, idx);
        int64_t o = hp__eval_offset(t->rank, idx, ost);
        double x = in[0]->data[i];
        if (n->op == HP_OP_AMAX)
            y[o] = (isnan(x) || isnan(y[o])) ? NAN : (x > y[o] ? x : y[o]);
        else
            y[o] += x;
    }
    if (n->op == HP_OP_MEAN)
        for (int64_t i = 0; i < n_out; i++) y[i] /= (double)count; /* 0/0: NaN, as torch */
    return HP_OK;
}

/* ---- pure copies: view, reshape, (un)squeeze, clone, _to_copy ------------------------------- */

HP__EVAL_KERNEL(hp__eval_copy) {
    memcpy(out[0].data, in[0]->data, (size_t)hp__eval_numel(&out[0]) * sizeof(double));
    return HP_OK;
}

/* ---- permute, transpose, t ------------------------------------------------------------------ */

HP__EVAL_KERNEL(hp__eval_permute) {
    const hp_type *t = &in[0]->type;
    int perm[HP_MAX_RANK]; /* output dim d is input dim perm[d] */
    for (int d = 0; d < t->rank; d++) perm[d] = d;
    if (n->op == HP_OP_PERMUTE) {
        const hp_attr *a = hp_node_attr(n, HP_ATTR_PERM);
        for (int d = 0; d < t->rank; d++) {
            hp_status st = hp__norm_dim(a->ints.v[d], t->rank, "perm", &perm[d], NULL);
            HP_ASSERT(st == HP_OK);
        }
    } else if (n->op == HP_OP_TRANSPOSE) {
        int d0 = attr_dim(n, HP_ATTR_DIM0, t->rank), d1 = attr_dim(n, HP_ATTR_DIM1, t->rank);
        perm[d0] = d1;
        perm[d1] = d0;
    } else if (t->rank == 2) { /* t: a no-op below rank 2 */
        perm[0] = 1;
        perm[1] = 0;
    }
    int64_t ist[HP_MAX_RANK], st[HP_MAX_RANK], idx[HP_MAX_RANK];
    hp__eval_strides(t, ist);
    for (int d = 0; d < t->rank; d++) st[d] = ist[perm[d]];
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++) {
        hp__eval_unravel(&out[0].type, i, idx);
        out[0].data[i] = in[0]->data[hp__eval_offset(t->rank, idx, st)];
    }
    return HP_OK;
}

/* ---- expand --------------------------------------------------------------------------------- */

HP__EVAL_KERNEL(hp__eval_expand) {
    int64_t st[HP_MAX_RANK], idx[HP_MAX_RANK];
    hp__eval_bcast_strides(&in[0]->type, &out[0].type, st);
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++) {
        hp__eval_unravel(&out[0].type, i, idx);
        out[0].data[i] = in[0]->data[hp__eval_offset(out[0].type.rank, idx, st)];
    }
    return HP_OK;
}

/* ---- slice and slice_backward --------------------------------------------------------------- */

/* The sliced dim and its first index; `full` is the unsliced type. */
static int slice_params(const hp_node *n, const hp_type *full, int64_t *start, int64_t *step) {
    int dim = attr_dim(n, HP_ATTR_DIM, full->rank);
    int64_t len;
    *step = hp_node_int(n, HP_ATTR_STEP, 1);
    hp__slice_bounds(full->shape[dim], hp_node_int(n, HP_ATTR_START, 0),
                     hp_node_int(n, HP_ATTR_END, INT64_MAX), *step, start, &len);
    return dim;
}

/* Copies between a tensor of type `full` and its slice `part` (type of the slice), element by
 * element: full -> part for slice, part -> full for slice_backward. */
static void slice_walk(const hp_node *n, const hp_type *full, const hp_type *part,
                       const double *src, double *dst, bool to_full) {
    int64_t start, step, fst[HP_MAX_RANK], idx[HP_MAX_RANK];
    int dim = slice_params(n, full, &start, &step);
    hp__eval_strides(full, fst);
    int64_t numel = hp_type_numel(part);
    for (int64_t i = 0; i < numel; i++) {
        hp__eval_unravel(part, i, idx);
        idx[dim] = start + idx[dim] * step;
        int64_t f = hp__eval_offset(full->rank, idx, fst);
        if (to_full)
            dst[f] = src[i];
        else
            dst[i] = src[f];
    }
}

HP__EVAL_KERNEL(hp__eval_slice) {
    slice_walk(n, &in[0]->type, &out[0].type, in[0]->data, out[0].data, false);
    return HP_OK;
}

HP__EVAL_KERNEL(hp__eval_slice_backward) {
    slice_walk(n, &out[0].type, &in[0]->type, in[0]->data, out[0].data, true);
    return HP_OK;
}

/* ---- cat ------------------------------------------------------------------------------------ */

HP__EVAL_KERNEL(hp__eval_cat) {
    const hp_type *t = &out[0].type;
    int dim = attr_dim(n, HP_ATTR_DIM, t->rank);
    int64_t outer, total, inner, at = 0; /* at: where along dim the next input goes */
    hp__eval_split(t, dim, &outer, &total, &inner);
    for (int k = 0; k < n->n_in; k++) {
        int64_t nk = in[k]->type.shape[dim];
        for (int64_t o = 0; o < outer; o++)
            memcpy(out[0].data + (o * total + at) * inner, in[k]->data + o * nk * inner,
                   (size_t)(nk * inner) * sizeof(double));
        at += nk;
    }
    return HP_OK;
}

/* ---- matrix products ------------------------------------------------------------------------ */

/* y[M,N] += a[M,K] @ b[K,N], i-k-j order so the inner loop runs along rows of b and y. */
static void matmul_acc(double *y, const double *a, const double *b, int64_t m, int64_t k,
                       int64_t nn) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++) {
            double aip = a[i * k + p];
            const double *brow = b + p * nn;
            double *yrow = y + i * nn;
            for (int64_t j = 0; j < nn; j++) yrow[j] += aip * brow[j];
        }
}

HP__EVAL_KERNEL(hp__eval_mm) {
    const int64_t *as = in[0]->type.shape, *bs = in[1]->type.shape;
    matmul_acc(out[0].data, in[0]->data, in[1]->data, as[0], as[1], bs[1]);
    return HP_OK;
}

HP__EVAL_KERNEL(hp__eval_bmm) {
    const int64_t *as = in[0]->type.shape, *bs = in[1]->type.shape;
    int64_t m = as[1], k = as[2], nn = bs[2];
    for (int64_t b = 0; b < as[0]; b++)
        matmul_acc(out[0].data + b * m * nn, in[0]->data + b * m * k, in[1]->data + b * k * nn, m,
                   k, nn);
    return HP_OK;
}

/* addmm(bias, a, b){beta, alpha} = beta · bias + alpha · (a @ b). beta = 0 ignores bias
 * entirely (NaN in it does not propagate), as torch documents. */
HP__EVAL_KERNEL(hp__eval_addmm) {
    double alpha = hp_node_float(n, HP_ATTR_ALPHA, 1), beta = hp_node_float(n, HP_ATTR_BETA, 1);
    const int64_t *as = in[1]->type.shape, *bs = in[2]->type.shape;
    double *y = out[0].data;
    int64_t numel = hp__eval_numel(&out[0]);
    matmul_acc(y, in[1]->data, in[2]->data, as[0], as[1], bs[1]);
    int64_t st[HP_MAX_RANK], idx[HP_MAX_RANK];
    hp__eval_bcast_strides(&in[0]->type, &out[0].type, st);
    for (int64_t i = 0; i < numel; i++) {
        hp__eval_unravel(&out[0].type, i, idx);
        double bias = beta == 0 ? 0.0 : beta * in[0]->data[hp__eval_offset(2, idx, st)];
        y[i] = bias + alpha * y[i];
    }
    return HP_OK;
}
