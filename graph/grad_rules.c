/* graph/grad_rules.c — the gradient rules of the elementwise ops, reductions and shape ops
 * (hp__grad_* named in graph/ops.def); matrix products and the fused NN ops are in
 * grad_rules_nn.c.
 *
 * Each rule follows hp_grad_fn (include/hp/graph.h): it appends the nodes computing the
 * gradient of each input that needs one (hp__grad_need) from the gradients of the outputs,
 * using the ops PyTorch's derivatives.yaml uses, so that the joint graph reads like a make_fx
 * trace. Rules do not cast (autodiff casts a result whose dtype differs from its input's)
 * and do not check their node: autodiff only differentiates verified graphs, and every node a
 * rule builds goes through the shape rules again. Builder failures are sticky on the graph.
 */
#include "graph/grad_internal.h"

#include "hp/build.h"

#include <string.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static const hp_type *in_type(const hp_graph *g, const hp_node *n, int i) {
    return hp_graph_type(g, n->in[i]); /* arena memory: stays valid as nodes are added */
}

static hp_value scalar_zero(hp_graph *g, hp_dtype dt) {
    int64_t none[1] = {0};
    return hp_zeros(g, 0, none, dt);
}

hp_value hp__grad_sum_to(hp_graph *g, hp_value x, const hp_type *to) {
    const hp_type *xt = hp_graph_type(g, x);
    if (!xt) return HP_NO_VALUE;
    int lead = xt->rank - to->rank;
    if (lead < 0) {
        hp__grad_fail(g, HP_INTERNAL, "cannot sum a gradient of rank %d to rank %d", xt->rank,
                      to->rank);
        return HP_NO_VALUE;
    }
    int64_t dims[HP_MAX_RANK];
    int nd = 0;
    for (int d = 0; d < lead; d++) dims[nd++] = d;
    for (int i = 0; i < to->rank; i++) {
        int64_t have = xt->shape[lead + i];
        if (to->shape[i] == have) continue;
        if (to->shape[i] != 1) {
            hp__grad_fail(g, HP_INTERNAL, "cannot sum a gradient dim %d of size %lld to %lld",
                          lead + i, (long long)have, (long long)to->shape[i]);
            return HP_NO_VALUE;
        }
        dims[nd++] = lead + i;
    }
    if (nd == 0) return x;
    /* keepdim when some kept dims are ones, so the view below restores them */
    bool keep = nd > lead;
    x = hp_sum(g, x, nd, dims, keep);
    if (keep && lead > 0) x = hp_view(g, x, to->rank, to->shape);
    return x;
}

void hp__grad_keepdim_shape(const hp_node *n, const hp_type *in, int64_t shape[HP_MAX_RANK]) {
    bool mask[HP_MAX_RANK];
    hp__reduce_mask(n, in->rank, mask);
    for (int d = 0; d < in->rank; d++) shape[d] = mask[d] ? 1 : in->shape[d];
}

/* ---- elementwise binary (broadcasting: reduce back to each operand) ------------------------ */

hp_status hp__grad_add(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    for (int i = 0; i < 2; i++)
        if (hp__grad_need(fwd, i)) gin[i] = hp__grad_sum_to(g, gout[0], in_type(g, n, i));
    return HP_OK;
}

hp_status hp__grad_sub(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (hp__grad_need(fwd, 0)) gin[0] = hp__grad_sum_to(g, gout[0], in_type(g, n, 0));
    if (hp__grad_need(fwd, 1)) gin[1] = hp__grad_sum_to(g, hp_neg(g, gout[0]), in_type(g, n, 1));
    return HP_OK;
}

hp_status hp__grad_mul(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value a = n->in[0], b = n->in[1];
    if (hp__grad_need(fwd, 0)) gin[0] = hp__grad_sum_to(g, hp_mul(g, gout[0], b), in_type(g, n, 0));
    if (hp__grad_need(fwd, 1)) gin[1] = hp__grad_sum_to(g, hp_mul(g, gout[0], a), in_type(g, n, 1));
    return HP_OK;
}

hp_status hp__grad_div(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value a = n->in[0], b = n->in[1];
    if (hp__grad_need(fwd, 0)) gin[0] = hp__grad_sum_to(g, hp_div(g, gout[0], b), in_type(g, n, 0));
    if (hp__grad_need(fwd, 1)) {
        /* -grad * a / (b * b) */
        hp_value num = hp_mul(g, hp_neg(g, gout[0]), a);
        gin[1] = hp__grad_sum_to(g, hp_div(g, num, hp_mul(g, b, b)), in_type(g, n, 1));
    }
    return HP_OK;
}

/* Where a == b the gradient is split evenly, as PyTorch does. */
hp_status hp__grad_maximum(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value a = n->in[0], b = n->in[1];
    hp_value zero = scalar_zero(g, n->out[0].dtype);
    hp_value tied = hp_where(g, hp_bin(g, HP_OP_EQ, a, b), hp_mul_scalar(g, gout[0], 0.5), gout[0]);
    if (hp__grad_need(fwd, 0))
        gin[0] = hp__grad_sum_to(g, hp_where(g, hp_bin(g, HP_OP_LT, a, b), zero, tied),
                                 in_type(g, n, 0));
    if (hp__grad_need(fwd, 1))
        gin[1] = hp__grad_sum_to(g, hp_where(g, hp_bin(g, HP_OP_LT, b, a), zero, tied),
                                 in_type(g, n, 1));
    return HP_OK;
}

hp_status hp__grad_where(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                         hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value c = n->in[0];
    hp_value zero = scalar_zero(g, n->out[0].dtype);
    if (hp__grad_need(fwd, 1))
        gin[1] = hp__grad_sum_to(g, hp_where(g, c, gout[0], zero), in_type(g, n, 1));
    if (hp__grad_need(fwd, 2))
        gin[2] = hp__grad_sum_to(g, hp_where(g, c, zero, gout[0]), in_type(g, n, 2));
    return HP_OK;
}

/* ---- scalar operand ------------------------------------------------------------------------- */

hp_status hp__grad_add_scalar(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                              hp_value *gin) {
    gin[0] = gout[0];
    return HP_OK;
}

hp_status hp__grad_mul_scalar(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                              hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp_mul_scalar(g, gout[0], hp_node_float(n, HP_ATTR_VALUE, 1.0));
    return HP_OK;
}

/* grad * (e * x^(e-1)); zero for e == 0 (x^-1 * 0 would be NaN at x = 0). */
hp_status hp__grad_pow(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    double e = hp_node_float(n, HP_ATTR_EXPONENT, 1.0);
    const hp_type *t = in_type(g, n, 0);
    if (e == 0.0) {
        gin[0] = hp_zeros(g, t->rank, t->shape, t->dtype);
        return HP_OK;
    }
    gin[0] = hp_mul(g, gout[0], hp_mul_scalar(g, hp_pow(g, n->in[0], e - 1.0), e));
    return HP_OK;
}

/* ---- unary math ------------------------------------------------------------------------------ */

hp_status hp__grad_neg(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_neg(g, gout[0]);
    return HP_OK;
}

hp_status hp__grad_exp(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_mul(g, gout[0], hp__grad_self(fwd, 0));
    return HP_OK;
}

hp_status hp__grad_log(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp_div(g, gout[0], n->in[0]);
    return HP_OK;
}

/* grad / (2 sqrt(x)) */
hp_status hp__grad_sqrt(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_div(g, gout[0], hp_mul_scalar(g, hp__grad_self(fwd, 0), 2.0));
    return HP_OK;
}

/* -0.5 * grad * rsqrt(x)^3 */
hp_status hp__grad_rsqrt(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                         hp_value *gin) {
    hp_value cube = hp_pow(g, hp__grad_self(fwd, 0), 3.0);
    gin[0] = hp_mul(g, hp_mul_scalar(g, gout[0], -0.5), cube);
    return HP_OK;
}

/* grad · cos(x) */
hp_status hp__grad_sin(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_mul(g, gout[0], hp_un(g, HP_OP_COS, fwd->node.in[0]));
    return HP_OK;
}

/* −grad · sin(x) */
hp_status hp__grad_cos(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_neg(g, hp_mul(g, gout[0], hp_un(g, HP_OP_SIN, fwd->node.in[0])));
    return HP_OK;
}

/* grad · 2/√π · exp(−x²) */
hp_status hp__grad_erf(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    hp_value x = fwd->node.in[0];
    hp_value e = hp_exp(g, hp_neg(g, hp_mul(g, x, x)));
    gin[0] = hp_mul(g, gout[0], hp_mul_scalar(g, e, 1.1283791670955126)); /* 2/√π */
    return HP_OK;
}

hp_status hp__grad_tanh(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_bin(g, HP_OP_TANH_BACKWARD, gout[0], hp__grad_self(fwd, 0));
    return HP_OK;
}

hp_status hp__grad_sigmoid(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    gin[0] = hp_bin(g, HP_OP_SIGMOID_BACKWARD, gout[0], hp__grad_self(fwd, 0));
    return HP_OK;
}

hp_status hp__grad_silu(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp_bin(g, HP_OP_SILU_BACKWARD, gout[0], n->in[0]);
    return HP_OK;
}

/* gelu_backward(grad, x) with the forward's `approximate` (its only attribute). */
hp_status hp__grad_gelu(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value in[2] = {gout[0], n->in[0]};
    gin[0] = hp_build(g, HP_OP_GELU_BACKWARD, in, 2, n->attrs, n->n_attrs);
    return HP_OK;
}

/* threshold_backward(grad, relu(x), 0): as PyTorch, on the result. */
hp_status hp__grad_relu(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    hp_value in[2] = {gout[0], hp__grad_self(fwd, 0)};
    hp_attr a = hp_attr_float(HP_ATTR_VALUE, 0.0);
    gin[0] = hp_build(g, HP_OP_THRESHOLD_BACKWARD, in, 2, &a, 1);
    return HP_OK;
}

hp_status hp__grad_to_copy(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp_to(g, gout[0], in_type(g, n, 0)->dtype);
    return HP_OK;
}

/* ---- reductions ------------------------------------------------------------------------------ */

/* The gradient of a reduction's output viewed to the keepdim shape (when keepdim was 0). */
static hp_value to_keepdim(hp_graph *g, const hp_node *n, hp_value v, const hp_type *in) {
    if (n->out[0].rank == in->rank) return v;
    int64_t ks[HP_MAX_RANK];
    hp__grad_keepdim_shape(n, in, ks);
    return hp_view(g, v, in->rank, ks);
}

/* Expands a keepdim-shaped value back to the reduction's input shape. */
static hp_value expand_to(hp_graph *g, hp_value v, const hp_type *in) {
    const hp_type *t = hp_graph_type(g, v);
    if (!t || (t->rank == in->rank && !memcmp(t->shape, in->shape, sizeof(int64_t) * in->rank)))
        return v;
    return hp_expand(g, v, in->rank, in->shape);
}

hp_status hp__grad_sum(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_type *in = in_type(g, n, 0);
    gin[0] = expand_to(g, to_keepdim(g, n, gout[0], in), in);
    return HP_OK;
}

/* The sum's gradient over the count of reduced elements. Scaling before the expand keeps the
 * multiply on the small tensor. */
hp_status hp__grad_mean(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_type *in = in_type(g, n, 0);
    bool mask[HP_MAX_RANK];
    hp__reduce_mask(n, in->rank, mask);
    int64_t count = 1;
    for (int d = 0; d < in->rank; d++)
        if (mask[d]) count *= in->shape[d];
    /* count 0: the input is empty, so is its gradient; any finite scale will do */
    hp_value scaled = hp_mul_scalar(g, gout[0], count ? 1.0 / (double)count : 0.0);
    gin[0] = expand_to(g, to_keepdim(g, n, scaled, in), in);
    return HP_OK;
}

/* (grad / count of maxima) * mask, mask = (x == amax(x)): ties share the gradient evenly. */
hp_status hp__grad_amax(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_type *in = in_type(g, n, 0);
    bool mask[HP_MAX_RANK];
    hp__reduce_mask(n, in->rank, mask);
    int64_t dims[HP_MAX_RANK];
    int nd = 0;
    for (int d = 0; d < in->rank; d++)
        if (mask[d]) dims[nd++] = d;
    hp_value out_k = to_keepdim(g, n, hp__grad_self(fwd, 0), in);
    hp_value grad_k = to_keepdim(g, n, gout[0], in);
    hp_value hit = hp_to(g, hp_bin(g, HP_OP_EQ, n->in[0], out_k), in->dtype);
    /* nd == 0 only for a rank-0 input, where "all dims" is the same empty set */
    hp_value count = hp_sum(g, hit, nd, dims, true);
    gin[0] = hp_mul(g, hp_div(g, grad_k, count), hit);
    return HP_OK;
}

/* ---- shape ops ------------------------------------------------------------------------------- */

/* view and reshape: back to the input shape with the same op. */
hp_status hp__grad_view(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_type *in = in_type(g, n, 0);
    gin[0] = hp_un1(g, n->op, gout[0], hp_attr_ints(HP_ATTR_SHAPE, in->rank, in->shape));
    return HP_OK;
}

hp_status hp__grad_permute(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_attr *p = hp_node_attr(n, HP_ATTR_PERM);
    int rank = in_type(g, n, 0)->rank;
    int64_t inv[HP_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        int64_t d = p->ints.v[i] < 0 ? p->ints.v[i] + rank : p->ints.v[i];
        inv[d] = i;
    }
    gin[0] = hp_permute(g, gout[0], rank, inv);
    return HP_OK;
}

hp_status hp__grad_transpose(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                             hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] =
        hp_transpose(g, gout[0], hp_node_int(n, HP_ATTR_DIM0, 0), hp_node_int(n, HP_ATTR_DIM1, 0));
    return HP_OK;
}

hp_status hp__grad_t(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    gin[0] = hp_t(g, gout[0]);
    return HP_OK;
}

hp_status hp__grad_expand(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                          hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp__grad_sum_to(g, gout[0], in_type(g, n, 0));
    return HP_OK;
}

/* slice_backward(grad){shape = input shape, dim, start, end, step}. */
hp_status hp__grad_slice(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                         hp_value *gin) {
    const hp_node *n = &fwd->node;
    const hp_type *in = in_type(g, n, 0);
    hp_attr a[HP_ATTR_COUNT];
    int na = 0;
    a[na++] = hp_attr_ints(HP_ATTR_SHAPE, in->rank, in->shape);
    for (int i = 0; i < n->n_attrs; i++) a[na++] = n->attrs[i];
    gin[0] = hp_build(g, HP_OP_SLICE_BACKWARD, &gout[0], 1, a, na);
    return HP_OK;
}

/* Each input's gradient is its slice of the output's. */
hp_status hp__grad_cat(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    int rank = n->out[0].rank, dim;
    hp_err e;
    if (hp__norm_dim(hp_node_int(n, HP_ATTR_DIM, 0), rank, "dim", &dim, &e) != HP_OK)
        return hp__grad_fail(g, e.status, "%s", e.msg);
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
        int64_t len = in_type(g, n, i)->shape[dim];
        if (hp__grad_need(fwd, i)) gin[i] = hp_slice(g, gout[0], dim, off, off + len, 1);
        off += len;
    }
    return HP_OK;
}

hp_status hp__grad_unsqueeze(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                             hp_value *gin) {
    const hp_node *n = &fwd->node;
    int dim;
    hp_err e;
    if (hp__norm_dim(hp_node_int(n, HP_ATTR_DIM, 0), n->out[0].rank, "dim", &dim, &e) != HP_OK)
        return hp__grad_fail(g, e.status, "%s", e.msg);
    gin[0] = hp_squeeze(g, gout[0], dim);
    return HP_OK;
}

hp_status hp__grad_squeeze(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    int dim;
    hp_err e;
    if (hp__norm_dim(hp_node_int(n, HP_ATTR_DIM, 0), in_type(g, n, 0)->rank, "dim", &dim, &e) !=
        HP_OK)
        return hp__grad_fail(g, e.status, "%s", e.msg);
    gin[0] = hp_unsqueeze(g, gout[0], dim);
    return HP_OK;
}

/* clone */
hp_status hp__grad_identity(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                            hp_value *gin) {
    gin[0] = gout[0];
    return HP_OK;
}
