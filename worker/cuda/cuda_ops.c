/* worker/cuda/cuda_ops.c — the cuda backend's entries for elementwise ops (creation, binary,
 * where, unary, backward pairs, swiglu and its backward, _to_copy), reductions and data
 * movement (copies, permutes, expand, slice, slice_backward, cat): each checks its call as the
 * cpu kernel does, builds the index walk, and enqueues the kernel of k_elementwise.cu /
 * k_swiglu.cu / k_reduce.cu / k_shape.cu.
 * Floating math runs on f32 and bf16 (loaded to f32, rounded on store); comparisons, where and
 * data movement take any dtype. */
#include "worker/cuda/cuda_internal.h"

#include <math.h>
#include <string.h>

#define LAUNCH(call, what) HP__CUDA_TRY((call), (what))

static size_t type_bytes(const hp_type *t) {
    return (size_t)hp_type_numel(t) * hp_dtype_size(t->dtype);
}

/* A walk over out's shape with each operand's strides (out first). */
static hp__cu_walk walk_of(const hp_type *out, int n_ops, const hp_type *const *ins) {
    hp__cu_walk w;
    memset(&w, 0, sizeof w);
    w.rank = out->rank;
    for (int d = 0; d < out->rank; d++) w.shape[d] = out->shape[d];
    hp__cuda_strides(out, w.st[0]);
    for (int k = 0; k < n_ops; k++) hp__cuda_bcast_strides(ins[k], out, w.st[k + 1]);
    return w;
}

/* ---- elementwise ---------------------------------------------------------------------------- */

HP__CUDA_ENTRY(hp__cuda_creation) {
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CANY, err));
    double v = c->node->op == HP_OP_ZEROS  ? 0
               : c->node->op == HP_OP_ONES ? 1
                                           : hp_node_float(c->node, HP_ATTR_VALUE, 0);
    LAUNCH(hp__cu_fill(s, hp__cuda_dt(o->dtype), c->out[0], v, hp_type_numel(o)), "fill");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_binary) {
    int op;
    switch (c->node->op) {
    case HP_OP_ADD:
        op = HP__CU_ADD;
        break;
    case HP_OP_SUB:
        op = HP__CU_SUB;
        break;
    case HP_OP_MUL:
        op = HP__CU_MUL;
        break;
    case HP_OP_DIV:
        op = HP__CU_DIV;
        break;
    case HP_OP_MAXIMUM:
        op = HP__CU_MAXIMUM;
        break;
    case HP_OP_EQ:
        op = HP__CU_EQ;
        break;
    default:
        op = HP__CU_LT;
        break;
    }
    bool cmp = op == HP__CU_EQ || op == HP__CU_LT;
    hp_dtype dt = c->in_type[0].dtype;
    HP_TRY(hp__cuda_dtype(c, 0, 0, cmp ? (HP__CFP | HP__CINTS | HP__CM(HP_BOOL)) : HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CM(dt), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, cmp ? HP__CM(HP_BOOL) : HP__CM(dt), err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cuda_check_bcast(&c->in_type[0], o, "input 0", err));
    HP_TRY(hp__cuda_check_bcast(&c->in_type[1], o, "input 1", err));
    const hp_type *ins[2] = {&c->in_type[0], &c->in_type[1]};
    hp__cu_walk w = walk_of(o, 2, ins);
    LAUNCH(
        hp__cu_binary(s, op, hp__cuda_dt(dt), c->out[0], c->in[0], c->in[1], &w, hp_type_numel(o)),
        "binary kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_where) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CM(HP_BOOL), err));
    hp_dtype dt = c->out_type[0].dtype;
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CANY, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CM(dt), err));
    HP_TRY(hp__cuda_dtype(c, 0, 2, HP__CM(dt), err));
    const hp_type *o = &c->out_type[0];
    for (int k = 0; k < 3; k++) HP_TRY(hp__cuda_check_bcast(&c->in_type[k], o, "an input", err));
    const hp_type *ins[3] = {&c->in_type[0], &c->in_type[1], &c->in_type[2]};
    hp__cu_walk w = walk_of(o, 3, ins);
    LAUNCH(hp__cu_where(s, hp_dtype_size(dt), c->out[0], c->in[0], c->in[1], c->in[2], &w,
                        hp_type_numel(o)),
           "where kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_unary) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    const hp_node *n = c->node;
    int op;
    double p = 0;
    switch (n->op) {
    case HP_OP_ADD_SCALAR:
        op = HP__CU_ADD_SCALAR, p = hp_node_float(n, HP_ATTR_VALUE, 0);
        break;
    case HP_OP_MUL_SCALAR:
        op = HP__CU_MUL_SCALAR, p = hp_node_float(n, HP_ATTR_VALUE, 0);
        break;
    case HP_OP_POW:
        op = HP__CU_POW, p = hp_node_float(n, HP_ATTR_EXPONENT, 1);
        break;
    case HP_OP_NEG:
        op = HP__CU_NEG;
        break;
    case HP_OP_EXP:
        op = HP__CU_EXP;
        break;
    case HP_OP_LOG:
        op = HP__CU_LOG;
        break;
    case HP_OP_SQRT:
        op = HP__CU_SQRT;
        break;
    case HP_OP_RSQRT:
        op = HP__CU_RSQRT;
        break;
    case HP_OP_TANH:
        op = HP__CU_TANH;
        break;
    case HP_OP_SIN:
        op = HP__CU_SIN;
        break;
    case HP_OP_COS:
        op = HP__CU_COS;
        break;
    case HP_OP_ERF:
        op = HP__CU_ERF;
        break;
    case HP_OP_SIGMOID:
        op = HP__CU_SIGMOID;
        break;
    case HP_OP_SILU:
        op = HP__CU_SILU;
        break;
    case HP_OP_GELU:
        op = HP__CU_GELU, p = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0;
        break;
    default:
        op = HP__CU_RELU;
        break;
    }
    LAUNCH(hp__cu_unary(s, op, hp__cuda_dt(c->in_type[0].dtype), c->out[0], c->in[0], p,
                        hp_type_numel(&c->out_type[0])),
           "unary kernel");
    return HP_OK;
}

/* swiglu(a, b), swiglu_backward(g, a, b): every operand of one type, f32 or bf16 (as is). */
HP__CUDA_ENTRY(hp__cuda_swiglu) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32 | HP__CM(HP_BF16), err));
    hp_dtype dt = c->in_type[0].dtype;
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CM(dt), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(dt), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    LAUNCH(hp__cu_swiglu(s, hp__cuda_dt(dt), c->out[0], c->in[0], c->in[1],
                         hp_type_numel(&c->out_type[0])),
           "swiglu kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_swiglu_backward) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32 | HP__CM(HP_BF16), err));
    hp_dtype dt = c->in_type[0].dtype;
    for (int k = 1; k < 3; k++) {
        HP_TRY(hp__cuda_dtype(c, 0, k, HP__CM(dt), err));
        HP_TRY(hp__cuda_same_shape(c, 0, k, 0, err));
    }
    for (int k = 0; k < 2; k++) {
        HP_TRY(hp__cuda_dtype(c, 1, k, HP__CM(dt), err));
        HP_TRY(hp__cuda_same_shape(c, 0, k, 1, err));
    }
    LAUNCH(hp__cu_swiglu_backward(s, hp__cuda_dt(dt), c->out[0], c->out[1], c->in[0], c->in[1],
                                  c->in[2], hp_type_numel(&c->out_type[0])),
           "swiglu backward kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_backward_pair) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    hp_dtype dt = c->in_type[0].dtype;
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CM(dt), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(dt), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    const hp_node *n = c->node;
    int op;
    double p = 0;
    switch (n->op) {
    case HP_OP_TANH_BACKWARD:
        op = HP__CU_TANH_BW;
        break;
    case HP_OP_SIGMOID_BACKWARD:
        op = HP__CU_SIGMOID_BW;
        break;
    case HP_OP_SILU_BACKWARD:
        op = HP__CU_SILU_BW;
        break;
    case HP_OP_GELU_BACKWARD:
        op = HP__CU_GELU_BW, p = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0;
        break;
    default:
        op = HP__CU_THRESHOLD_BW, p = hp_node_float(n, HP_ATTR_VALUE, 0);
        break;
    }
    LAUNCH(hp__cu_backward_pair(s, op, hp__cuda_dt(dt), c->out[0], c->in[0], c->in[1], p,
                                hp_type_numel(&c->out_type[0])),
           "backward kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_to_copy) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CANY, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CANY, err));
    HP_TRY(hp__cuda_out_numel(c, 0, hp_type_numel(&c->in_type[0]), err));
    hp_dtype from = c->in_type[0].dtype, to = c->out_type[0].dtype;
    if (from == to) return hp__cuda_copy(s, c->out[0], c->in[0], type_bytes(&c->out_type[0]), err);
    LAUNCH(hp__cu_cast(s, hp__cuda_dt(to), c->out[0], hp__cuda_dt(from), c->in[0],
                       hp_type_numel(&c->out_type[0])),
           "cast kernel");
    return HP_OK;
}

/* ---- reductions ----------------------------------------------------------------------------- */

HP__CUDA_ENTRY(hp__cuda_reduce) {
    const hp_node *n = c->node;
    const hp_type *t = &c->in_type[0];
    HP_TRY(hp__cuda_dtype(c, 0, 0, n->op == HP_OP_MEAN ? HP__CF32 : (HP__CF32 | HP__CINTS), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(t->dtype), err));
    bool mask[HP_MAX_RANK] = {false};
    const hp_attr *dims = hp_node_attr(n, HP_ATTR_DIMS);
    int nd = dims ? dims->ints.n : 0;
    for (int i = 0; i < nd; i++) {
        int64_t d = dims->ints.v[i] < 0 ? dims->ints.v[i] + t->rank : dims->ints.v[i];
        if (d < 0 || d >= t->rank)
            return hp_errf(err, HP_INVALID, "dims entry %lld is out of range for rank %d",
                           (long long)dims->ints.v[i], t->rank);
        mask[d] = true;
    }
    if (nd == 0)
        for (int d = 0; d < t->rank; d++) mask[d] = true;
    int64_t ist[HP_MAX_RANK];
    hp__cuda_strides(t, ist);
    hp__cu_walk kept, red;
    memset(&kept, 0, sizeof kept);
    memset(&red, 0, sizeof red);
    int64_t n_out = 1, count = 1;
    for (int d = 0; d < t->rank; d++) {
        hp__cu_walk *w = mask[d] ? &red : &kept;
        w->shape[w->rank] = t->shape[d];
        w->st[0][w->rank] = ist[d];
        w->rank++;
        if (mask[d])
            count *= t->shape[d];
        else
            n_out *= t->shape[d];
    }
    HP_TRY(hp__cuda_out_numel(c, 0, n_out, err));
    if (n_out == 0) return HP_OK;
    if (count == 0) { /* sums are 0, means NaN (as torch); amax of nothing is refused */
        if (n->op == HP_OP_AMAX) return hp_errf(err, HP_INVALID, "amax over an empty dimension");
        LAUNCH(
            hp__cu_fill(s, hp__cuda_dt(t->dtype), c->out[0], n->op == HP_OP_MEAN ? NAN : 0, n_out),
            "fill");
        return HP_OK;
    }
    int op = n->op == HP_OP_SUM ? HP__CU_SUM : n->op == HP_OP_MEAN ? HP__CU_MEAN : HP__CU_AMAX;
    LAUNCH(
        hp__cu_reduce(s, op, hp__cuda_dt(t->dtype), c->out[0], c->in[0], &kept, n_out, &red, count),
        "reduce kernel");
    return HP_OK;
}

/* ---- data movement -------------------------------------------------------------------------- */

static hp_status same_dtype(const hp_kernel_call *c, hp_err *err) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CANY, err));
    return hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err);
}

static hp_status strided(cudaStream_t s, const hp_type *o, void *dst, const int64_t *dst_st,
                         const void *src, const int64_t *src_st, hp_err *err) {
    hp__cu_walk w;
    memset(&w, 0, sizeof w);
    w.rank = o->rank;
    for (int d = 0; d < o->rank; d++) {
        w.shape[d] = o->shape[d];
        w.st[0][d] = dst_st[d];
        w.st[1][d] = src_st[d];
    }
    LAUNCH(hp__cu_strided_copy(s, hp_dtype_size(o->dtype), dst, src, &w, hp_type_numel(o)),
           "strided copy kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_copy_op) {
    HP_TRY(same_dtype(c, err));
    HP_TRY(hp__cuda_out_numel(c, 0, hp_type_numel(&c->in_type[0]), err));
    return hp__cuda_copy(s, c->out[0], c->in[0], type_bytes(&c->out_type[0]), err);
}

HP__CUDA_ENTRY(hp__cuda_permute) {
    HP_TRY(same_dtype(c, err));
    const hp_type *t = &c->in_type[0], *o = &c->out_type[0];
    int perm[HP_MAX_RANK];
    for (int d = 0; d < t->rank; d++) perm[d] = d;
    const hp_node *n = c->node;
    if (n->op == HP_OP_PERMUTE) {
        const hp_attr *a = hp_node_attr(n, HP_ATTR_PERM);
        if (!a || a->ints.n != t->rank)
            return hp_errf(err, HP_INVALID, "perm does not match the input's rank %d", t->rank);
        bool seen[HP_MAX_RANK] = {false};
        for (int d = 0; d < t->rank; d++) {
            int64_t p = a->ints.v[d] < 0 ? a->ints.v[d] + t->rank : a->ints.v[d];
            if (p < 0 || p >= t->rank || seen[p])
                return hp_errf(err, HP_INVALID, "perm entry %lld is invalid",
                               (long long)a->ints.v[d]);
            seen[p] = true;
            perm[d] = (int)p;
        }
    } else if (n->op == HP_OP_TRANSPOSE) {
        int d0, d1;
        HP_TRY(hp__cuda_attr_dim(n, HP_ATTR_DIM0, t->rank, &d0, err));
        HP_TRY(hp__cuda_attr_dim(n, HP_ATTR_DIM1, t->rank, &d1, err));
        if (t->rank > 0) {
            perm[d0] = d1;
            perm[d1] = d0;
        }
    } else if (t->rank == 2) {
        perm[0] = 1;
        perm[1] = 0;
    }
    bool ok = o->rank == t->rank;
    for (int d = 0; ok && d < t->rank; d++) ok = o->shape[d] == t->shape[perm[d]];
    if (!ok) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "output %s is not a permutation of input %s",
                       hp_type_str(o, x, sizeof x), hp_type_str(t, y, sizeof y));
    }
    int64_t ist[HP_MAX_RANK], sst[HP_MAX_RANK], ost[HP_MAX_RANK];
    hp__cuda_strides(t, ist);
    hp__cuda_strides(o, ost);
    for (int d = 0; d < t->rank; d++) sst[d] = ist[perm[d]];
    return strided(s, o, c->out[0], ost, c->in[0], sst, err);
}

HP__CUDA_ENTRY(hp__cuda_expand) {
    HP_TRY(same_dtype(c, err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cuda_check_bcast(&c->in_type[0], o, "input", err));
    int64_t sst[HP_MAX_RANK], ost[HP_MAX_RANK];
    hp__cuda_bcast_strides(&c->in_type[0], o, sst);
    hp__cuda_strides(o, ost);
    return strided(s, o, c->out[0], ost, c->in[0], sst, err);
}

static hp_status slice_geometry(const hp_node *n, const hp_type *full, const hp_type *part,
                                int *dim, int64_t *start, int64_t *step, hp_err *err) {
    HP_TRY(hp__cuda_attr_dim(n, HP_ATTR_DIM, full->rank, dim, err));
    if (full->rank == 0) return hp_errf(err, HP_INVALID, "cannot slice a scalar");
    *step = hp_node_int(n, HP_ATTR_STEP, 1);
    if (*step < 1) return hp_errf(err, HP_INVALID, "step %lld must be >= 1", (long long)*step);
    int64_t len = full->shape[*dim], s = hp_node_int(n, HP_ATTR_START, 0);
    if (s < 0) s += len;
    *start = s < 0 ? 0 : s > len ? len : s;
    bool ok = part->rank == full->rank;
    for (int d = 0; ok && d < full->rank; d++)
        ok = d == *dim ? part->shape[d] == 0 || *start + (part->shape[d] - 1) * *step < len
                       : part->shape[d] == full->shape[d];
    if (!ok) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "slice %s does not fit in %s at dim %d",
                       hp_type_str(part, x, sizeof x), hp_type_str(full, y, sizeof y), *dim);
    }
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_slice) {
    HP_TRY(same_dtype(c, err));
    const hp_type *full = &c->in_type[0], *part = &c->out_type[0];
    int dim;
    int64_t start, step, fst[HP_MAX_RANK], pst[HP_MAX_RANK];
    HP_TRY(slice_geometry(c->node, full, part, &dim, &start, &step, err));
    hp__cuda_strides(full, fst);
    hp__cuda_strides(part, pst);
    size_t es = hp_dtype_size(full->dtype);
    const char *src = (const char *)c->in[0] + (size_t)(start * fst[dim]) * es;
    fst[dim] *= step;
    return strided(s, part, c->out[0], pst, src, fst, err);
}

HP__CUDA_ENTRY(hp__cuda_slice_backward) {
    HP_TRY(same_dtype(c, err));
    const hp_type *full = &c->out_type[0], *part = &c->in_type[0];
    int dim;
    int64_t start, step, fst[HP_MAX_RANK], pst[HP_MAX_RANK];
    HP_TRY(slice_geometry(c->node, full, part, &dim, &start, &step, err));
    hp__cuda_strides(full, fst);
    hp__cuda_strides(part, pst);
    size_t es = hp_dtype_size(full->dtype);
    HP__CUDA_TRY(cudaMemsetAsync(c->out[0], 0, type_bytes(full), s), "cudaMemsetAsync");
    char *dst = (char *)c->out[0] + (size_t)(start * fst[dim]) * es;
    fst[dim] *= step;
    return strided(s, part, dst, fst, c->in[0], pst, err);
}

HP__CUDA_ENTRY(hp__cuda_cat) {
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CANY, err));
    int dim;
    HP_TRY(hp__cuda_attr_dim(c->node, HP_ATTR_DIM, o->rank, &dim, err));
    if (o->rank == 0) return hp_errf(err, HP_INVALID, "cannot concatenate scalars");
    int64_t ost[HP_MAX_RANK], at = 0;
    hp__cuda_strides(o, ost);
    size_t es = hp_dtype_size(o->dtype);
    for (int k = 0; k < c->n_in; k++) {
        const hp_type *t = &c->in_type[k];
        HP_TRY(hp__cuda_dtype(c, 0, k, HP__CM(o->dtype), err));
        bool ok = t->rank == o->rank && at + t->shape[dim] <= o->shape[dim];
        for (int d = 0; ok && d < o->rank; d++) ok = d == dim || t->shape[d] == o->shape[d];
        if (!ok) {
            char x[128], y[128];
            return hp_errf(err, HP_INVALID, "input %d %s does not fit output %s at dim %d", k,
                           hp_type_str(t, x, sizeof x), hp_type_str(o, y, sizeof y), dim);
        }
        at += t->shape[dim];
    }
    if (at != o->shape[dim])
        return hp_errf(err, HP_INVALID, "inputs fill %lld of the %lld entries of dim %d",
                       (long long)at, (long long)o->shape[dim], dim);
    at = 0;
    for (int k = 0; k < c->n_in; k++) {
        const hp_type *t = &c->in_type[k];
        int64_t ist[HP_MAX_RANK];
        hp__cuda_strides(t, ist);
        char *dst = (char *)c->out[0] + (size_t)(at * ost[dim]) * es;
        HP_TRY(strided(s, t, dst, ost, c->in[k], ist, err));
        at += t->shape[dim];
    }
    return HP_OK;
}
