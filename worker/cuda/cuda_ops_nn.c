/* worker/cuda/cuda_ops_nn.c — the cuda backend's entries for the neural-network ops: embedding
 * (+ dense backward), the vocab-parallel chunked embedding (+ backward), (log_)softmax (+
 * backward), nll_loss (+ backward), the fused cross entropy (+ backward), fused RMSNorm
 * (+ backward), rotary embedding, and the fused causal attention (+ backward). Each checks its
 * call as the cpu kernel does and enqueues the kernels of k_embedding.cu, k_softmax.cu,
 * k_nll.cu, k_cross_entropy.cu, k_rmsnorm.cu, k_rope.cu, k_attention.cu / k_flash.cu. f32
 * values (bf16 where cuda_backend.c's launch says); i32/i64 indices. Index and
 * target ranges are checked on the device (the fault word), not here: reading them would
 * synchronize. */
#include "worker/cuda/cuda_internal.h"

#include <math.h>

#define LAUNCH(call, what) HP__CUDA_TRY((call), (what))

/* ---- embedding ------------------------------------------------------------------------------
 * f32 or bf16 tables and gradients in any mix (a bf16 gradient summed into an f32 weight
 * gradient: embedding_dense_backward{dtype=f32}); the backwards sort (row, position) keys in
 * scratch, HP_STREAM_COMPUTE's, and sum in position order, as the cpu backend does. */

static int cu_dt(hp_dtype t) {
    return t == HP_BF16 ? HP__CU_BF16 : HP__CU_F32;
}

/* The keys pack a row and a position into 32 bits each (k_embedding.cu). */
static hp_status key_room(int64_t n, int64_t rows, hp_err *err) {
    if (n < ((int64_t)1 << 32) && rows < (int64_t)0xffffffff) return HP_OK;
    return hp_errf(err, HP_UNSUPPORTED,
                   "%lld positions over %lld rows: the cuda backward takes fewer than 2^32 of "
                   "each",
                   (long long)n, (long long)rows);
}

HP__CUDA_ENTRY(hp__cuda_embedding) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err));
    const hp_type *w = &c->in_type[0];
    if (w->rank != 2) return hp_errf(err, HP_INVALID, "weight must be [V, D]");
    int64_t n = hp_type_numel(&c->in_type[1]);
    HP_TRY(hp__cuda_out_numel(c, 0, n * w->shape[1], err));
    LAUNCH(hp__cu_embedding(s, cu_dt(w->dtype), c->out[0], c->in[0], c->in[1],
                            c->in_type[1].dtype == HP_I64, n, w->shape[0], w->shape[1], cu->fault),
           "embedding kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_embedding_backward) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CFP, err));
    const hp_type *o = &c->out_type[0];
    if (o->rank != 2) return hp_errf(err, HP_INVALID, "output must be [num_weights, D]");
    int64_t v = o->shape[0], d = o->shape[1], n = hp_type_numel(&c->in_type[1]);
    if (hp_type_numel(&c->in_type[0]) != n * d)
        return hp_errf(err, HP_INVALID, "grad has %lld elements, expected %lld x %lld",
                       (long long)hp_type_numel(&c->in_type[0]), (long long)n, (long long)d);
    HP_TRY(key_room(n, v, err));
    void *keys = NULL;
    if (n > 0 && !(keys = hp__cuda_scratch(cu, HP_STREAM_COMPUTE,
                                           hp__cu_embedding_backward_scratch(n), err)))
        return err ? err->status : HP_NOMEM;
    LAUNCH(hp__cu_embedding_backward(s, cu_dt(c->in_type[0].dtype), cu_dt(o->dtype), c->out[0],
                                     c->in[0], c->in[1], c->in_type[1].dtype == HP_I64, n, v, d,
                                     hp_node_int(c->node, HP_ATTR_PADDING_IDX, -1), keys,
                                     cu->fault),
           "embedding backward kernels");
    return HP_OK;
}

/* chunked_embedding(weight [V, D], idx [...], base [k]) -> [..., D] (graph/ops.def): weight holds
 * k chunks of V / k rows, chunk c the indices from base[c]; an index no chunk holds reads
 * zeros, so none is out of range. */
HP__CUDA_ENTRY(hp__cuda_chunked_embedding) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 0, 2, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err));
    const hp_type *w = &c->in_type[0], *bt = &c->in_type[2];
    if (w->rank != 2 || bt->rank != 1 || bt->shape[0] < 1 || w->shape[0] % bt->shape[0])
        return hp_errf(err, HP_INVALID, "weight must be [V, D] and base [k], k dividing V");
    int64_t n = hp_type_numel(&c->in_type[1]), k = bt->shape[0];
    HP_TRY(hp__cuda_out_numel(c, 0, n * w->shape[1], err));
    LAUNCH(hp__cu_chunked_embedding(s, cu_dt(w->dtype), c->out[0], c->in[0], c->in[1],
                                    c->in_type[1].dtype == HP_I64, c->in[2], bt->dtype == HP_I64, n,
                                    k, w->shape[0] / k, w->shape[1]),
           "chunked embedding kernel");
    return HP_OK;
}

/* chunked_embedding_backward(g [..., D], idx [...], base [k]){num_weights} -> [V, D]. */
HP__CUDA_ENTRY(hp__cuda_chunked_embedding_backward) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CFP, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 0, 2, HP__CINTS, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CFP, err));
    const hp_type *o = &c->out_type[0], *bt = &c->in_type[2];
    if (o->rank != 2 || bt->rank != 1 || bt->shape[0] < 1 || o->shape[0] % bt->shape[0])
        return hp_errf(err, HP_INVALID,
                       "output must be [num_weights, D] and base [k], k dividing num_weights");
    int64_t v = o->shape[0], d = o->shape[1], n = hp_type_numel(&c->in_type[1]);
    int64_t k = bt->shape[0];
    if (hp_type_numel(&c->in_type[0]) != n * d)
        return hp_errf(err, HP_INVALID, "grad has %lld elements, expected %lld x %lld",
                       (long long)hp_type_numel(&c->in_type[0]), (long long)n, (long long)d);
    HP_TRY(key_room(n, v, err));
    if (n > INT64_MAX / k)
        return hp_errf(err, HP_INVALID, "%lld positions x %lld chunks overflow", (long long)n,
                       (long long)k);
    void *keys = NULL;
    if (n > 0 && !(keys = hp__cuda_scratch(cu, HP_STREAM_COMPUTE,
                                           hp__cu_embedding_backward_scratch(n * k), err)))
        return err ? err->status : HP_NOMEM;
    LAUNCH(hp__cu_chunked_embedding_backward(
               s, cu_dt(c->in_type[0].dtype), cu_dt(o->dtype), c->out[0], c->in[0], c->in[1],
               c->in_type[1].dtype == HP_I64, c->in[2], bt->dtype == HP_I64, n, k, v / k, d, keys),
           "chunked embedding backward kernels");
    return HP_OK;
}

/* ---- softmax family ------------------------------------------------------------------------- */

static hp_status sm_lines(const hp_kernel_call *c, const hp_type *t, int64_t *outer, int64_t *len,
                          int64_t *inner, hp_err *err) {
    int dim = 0;
    *len = *inner = 1;
    if (t->rank > 0) {
        HP_TRY(hp__cuda_attr_dim(c->node, HP_ATTR_DIM, t->rank, &dim, err));
        *len = t->shape[dim];
        for (int d = dim + 1; d < t->rank; d++) *inner *= t->shape[d];
    }
    int64_t n = hp_type_numel(t);
    *outer = *len * *inner > 0 ? n / (*len * *inner) : 0;
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_softmax) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CF32, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    int64_t outer, len, inner;
    HP_TRY(sm_lines(c, &c->in_type[0], &outer, &len, &inner, err));
    LAUNCH(
        hp__cu_softmax(s, c->node->op == HP_OP_LOG_SOFTMAX, c->out[0], c->in[0], outer, len, inner),
        "softmax kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_softmax_backward) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CF32, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    int64_t outer, len, inner;
    HP_TRY(sm_lines(c, &c->out_type[0], &outer, &len, &inner, err));
    LAUNCH(hp__cu_softmax_backward(s, c->node->op == HP_OP_LOG_SOFTMAX_BACKWARD, c->out[0],
                                   c->in[0], c->in[1], outer, len, inner),
           "softmax backward kernel");
    return HP_OK;
}

/* ---- nll_loss ------------------------------------------------------------------------------- */

static hp_status nll_args(const hp_kernel_call *c, int lp, int64_t *rows, int64_t *classes,
                          hp_err *err) {
    HP_TRY(hp__cuda_dtype(c, 0, lp, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 0, lp + 1, HP__CINTS, err));
    const hp_type *l = &c->in_type[lp], *t = &c->in_type[lp + 1];
    if (l->rank != 2 || t->rank != 1 || t->shape[0] != l->shape[0]) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "log-probabilities %s and target %s must be [N, C], [N]",
                       hp_type_str(l, x, sizeof x), hp_type_str(t, y, sizeof y));
    }
    *rows = l->shape[0];
    *classes = l->shape[1];
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (red != HP_NLL_NONE && red != HP_NLL_MEAN && red != HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not 0, 1 or 2", (long long)red);
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_nll_loss) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 0, &rows, &classes, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 1, 1, HP__CF32, err));
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    HP_TRY(hp__cuda_out_numel(c, 0, red == HP_NLL_NONE ? rows : 1, err));
    HP_TRY(hp__cuda_out_numel(c, 1, 1, err));
    LAUNCH(hp__cu_nll(s, c->out[0], c->out[1], c->in[0], c->in[1], c->in_type[1].dtype == HP_I64,
                      rows, classes, (int)red, hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100),
                      cu->fault),
           "nll_loss kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_nll_loss_backward) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 1, &rows, &classes, err));
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 0, 3, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CF32, err));
    HP_TRY(hp__cuda_out_numel(c, 0, rows * classes, err));
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (hp_type_numel(&c->in_type[0]) != (red == HP_NLL_NONE ? rows : 1) ||
        hp_type_numel(&c->in_type[3]) != 1)
        return hp_errf(err, HP_INVALID, "grad or total_weight has the wrong size");
    LAUNCH(hp__cu_nll_backward(s, c->out[0], c->in[0], c->in[2], c->in_type[2].dtype == HP_I64,
                               c->in[3], rows, classes, (int)red,
                               hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100), cu->fault),
           "nll_loss backward kernel");
    return HP_OK;
}

/* ---- the fused cross entropy ---------------------------------------------------------------- */

/* logits (input lg) f32 or bf16 [N, C], target (lg + 1) [N] of i32/i64, reduction mean or sum:
 * the kernels read bf16 logits as they are (cuda_backend.c never stages this op). */
static hp_status ce_args(const hp_kernel_call *c, int lg, int64_t *rows, int64_t *classes, int *dt,
                         int *mean, hp_err *err) {
    HP_TRY(hp__cuda_dtype(c, 0, lg, HP__CF32 | HP__CM(HP_BF16), err));
    HP_TRY(hp__cuda_dtype(c, 0, lg + 1, HP__CINTS, err));
    const hp_type *l = &c->in_type[lg], *t = &c->in_type[lg + 1];
    if (l->rank != 2 || t->rank != 1 || t->shape[0] != l->shape[0]) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "logits %s and target %s must be [N, C], [N]",
                       hp_type_str(l, x, sizeof x), hp_type_str(t, y, sizeof y));
    }
    *rows = l->shape[0];
    *classes = l->shape[1];
    *dt = l->dtype == HP_BF16 ? HP__CU_BF16 : HP__CU_F32;
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (red != HP_NLL_MEAN && red != HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not mean (1) or sum (2)",
                       (long long)red);
    *mean = red == HP_NLL_MEAN;
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_cross_entropy) {
    int64_t rows, classes;
    int dt, mean;
    HP_TRY(ce_args(c, 0, &rows, &classes, &dt, &mean, err));
    for (int k = 0; k < 3; k++) HP_TRY(hp__cuda_dtype(c, 1, k, HP__CF32, err));
    HP_TRY(hp__cuda_out_numel(c, 0, 1, err));
    HP_TRY(hp__cuda_out_numel(c, 1, 1, err));
    HP_TRY(hp__cuda_out_numel(c, 2, rows, err));
    LAUNCH(hp__cu_cross_entropy(s, dt, c->out[0], c->out[1], c->out[2], c->in[0], c->in[1],
                                c->in_type[1].dtype == HP_I64, rows, classes, mean,
                                hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100), cu->fault),
           "cross entropy kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_cross_entropy_backward) {
    int64_t rows, classes;
    int dt, mean;
    HP_TRY(ce_args(c, 1, &rows, &classes, &dt, &mean, err));
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 0, 3, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 0, 4, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, dt == HP__CU_BF16 ? HP__CM(HP_BF16) : HP__CF32, err));
    HP_TRY(hp__cuda_out_numel(c, 0, rows * classes, err));
    if (hp_type_numel(&c->in_type[0]) != 1 || hp_type_numel(&c->in_type[3]) != rows ||
        hp_type_numel(&c->in_type[4]) != 1)
        return hp_errf(err, HP_INVALID, "grad, lse or total_weight has the wrong size");
    LAUNCH(hp__cu_cross_entropy_backward(
               s, dt, c->out[0], c->in[0], c->in[1], c->in[2], c->in_type[2].dtype == HP_I64,
               c->in[3], c->in[4], rows, classes, mean,
               hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100), cu->fault),
           "cross entropy backward kernel");
    return HP_OK;
}

/* ---- RMSNorm, rotary ------------------------------------------------------------------------ */

/* The storage type (f32 or bf16) of the first listed input, which every listed input and output
 * must share (rstd and other f32 operands are checked by the caller). */
static hp_status one_float_type(const hp_kernel_call *c, const int *ins, int n_ins, const int *outs,
                                int n_outs, int *cu_dt, hp_err *err) {
    hp_dtype t = c->in_type[ins[0]].dtype;
    unsigned m = t == HP_BF16 ? HP__CM(HP_BF16) : HP__CF32;
    for (int i = 0; i < n_ins; i++) HP_TRY(hp__cuda_dtype(c, 0, ins[i], m, err));
    for (int i = 0; i < n_outs; i++) HP_TRY(hp__cuda_dtype(c, 1, outs[i], m, err));
    *cu_dt = t == HP_BF16 ? HP__CU_BF16 : HP__CU_F32;
    return HP_OK;
}

/* Input x's weight w is [D] for x [..., D] (RMSNorm, LayerNorm). */
static hp_status norm_weight(const hp_kernel_call *c, int x, int w, hp_err *err) {
    const hp_type *t = &c->in_type[x];
    if (t->rank < 1 || c->in_type[w].rank != 1 || c->in_type[w].shape[0] != t->shape[t->rank - 1])
        return hp_errf(err, HP_INVALID, "weight must be [D] for input [..., D]");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_rms_norm) {
    int dt;
    HP_TRY(one_float_type(c, (int[]){0, 1}, 2, (int[]){0}, 1, &dt, err));
    HP_TRY(hp__cuda_dtype(c, 1, 1, HP__CF32, err));
    HP_TRY(norm_weight(c, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    int64_t d = t->shape[t->rank - 1], rows = hp_type_numel(&c->out_type[1]);
    HP_TRY(hp__cuda_out_numel(c, 1, d > 0 ? hp_type_numel(t) / d : rows, err));
    LAUNCH(hp__cu_rms_norm(s, dt, c->out[0], c->out[1], c->in[0], c->in[1], rows, d,
                           hp_node_float(c->node, HP_ATTR_EPS, 1e-6)),
           "rms_norm kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_rms_norm_backward) {
    int dt;
    HP_TRY(one_float_type(c, (int[]){0, 1, 2}, 3, (int[]){0, 1}, 2, &dt, err));
    HP_TRY(hp__cuda_dtype(c, 0, 3, HP__CF32, err));
    HP_TRY(norm_weight(c, 1, 2, err));
    const hp_type *t = &c->in_type[1];
    HP_TRY(hp__cuda_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 1, 0, 1, err));
    HP_TRY(hp__cuda_same_shape(c, 2, 1, 1, err));
    int64_t d = t->shape[t->rank - 1], rows = hp_type_numel(&c->in_type[3]);
    if (d > 0 && rows != hp_type_numel(t) / d)
        return hp_errf(err, HP_INVALID, "rstd has %lld rows, the input %lld", (long long)rows,
                       (long long)(hp_type_numel(t) / d));
    double *part = NULL;
    size_t sb = hp__cu_rms_norm_backward_scratch(rows, d);
    if (sb > 0 && !(part = hp__cuda_scratch(cu, HP_STREAM_COMPUTE, sb, err)))
        return err ? err->status : HP_NOMEM;
    LAUNCH(hp__cu_rms_norm_backward(s, dt, c->out[0], c->out[1], c->in[0], c->in[1], c->in[2],
                                    c->in[3], rows, d, part),
           "rms_norm backward kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_rotary) {
    int dt;
    HP_TRY(one_float_type(c, (int[]){0}, 1, (int[]){0}, 1, &dt, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    if (t->rank != 4 || t->shape[3] % 2)
        return hp_errf(err, HP_INVALID, "input must be [B, T, H, D] with D even");
    float sign = hp_node_int(c->node, HP_ATTR_INVERSE, 0) ? -1.0f : 1.0f;
    float *table = NULL;
    size_t tb = hp__cu_rotary_scratch(t->shape[1], t->shape[3]);
    if (tb > 0 && !(table = hp__cuda_scratch(cu, HP_STREAM_COMPUTE, tb, err)))
        return err ? err->status : HP_NOMEM;
    LAUNCH(hp__cu_rotary(s, dt, c->out[0], c->in[0], t->shape[0], t->shape[1], t->shape[2],
                         t->shape[3], hp_node_float(c->node, HP_ATTR_THETA, 10000.0), sign, table),
           "rotary kernel");
    return HP_OK;
}

/* ---- LayerNorm (exported models) ------------------------------------------------------------ */

/* native_layer_norm(x [..., D], w [D], b [D]){eps} -> (y, mean, rstd [..., 1]). */
HP__CUDA_ENTRY(hp__cuda_layer_norm) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CF32, err));
    HP_TRY(norm_weight(c, 0, 1, err));
    HP_TRY(hp__cuda_same_shape(c, 1, 2, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    int64_t d = t->shape[t->rank - 1], rows = hp_type_numel(&c->out_type[1]);
    HP_TRY(hp__cuda_out_numel(c, 1, d > 0 ? hp_type_numel(t) / d : rows, err));
    HP_TRY(hp__cuda_out_numel(c, 2, rows, err));
    LAUNCH(hp__cu_layer_norm(s, c->out[0], c->out[1], c->out[2], c->in[0], c->in[1], c->in[2], rows,
                             d, hp_node_float(c->node, HP_ATTR_EPS, 1e-5)),
           "layer_norm kernel");
    return HP_OK;
}

/* (gy, x, mean, rstd, w) -> (gx, gw, gb). */
HP__CUDA_ENTRY(hp__cuda_layer_norm_backward) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CF32, err));
    HP_TRY(norm_weight(c, 1, 4, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 1, 0, 1, err));
    HP_TRY(hp__cuda_same_shape(c, 2, 3, 0, err));
    HP_TRY(hp__cuda_same_shape(c, 4, 1, 1, err));
    HP_TRY(hp__cuda_same_shape(c, 4, 2, 1, err));
    const hp_type *t = &c->in_type[1];
    int64_t d = t->shape[t->rank - 1], rows = hp_type_numel(&c->in_type[2]);
    if (d > 0 && rows != hp_type_numel(t) / d)
        return hp_errf(err, HP_INVALID, "rstd has %lld rows, the input %lld", (long long)rows,
                       (long long)(hp_type_numel(t) / d));
    double *part = NULL;
    size_t sb = hp__cu_layer_norm_backward_scratch(rows, d);
    if (sb > 0 && !(part = hp__cuda_scratch(cu, HP_STREAM_COMPUTE, sb, err)))
        return err ? err->status : HP_NOMEM;
    LAUNCH(hp__cu_layer_norm_backward(s, c->out[0], c->out[1], c->out[2], c->in[0], c->in[1],
                                      c->in[2], c->in[3], c->in[4], rows, d, part),
           "layer_norm backward kernel");
    return HP_OK;
}

/* bf16 operands the kernels take as they are (cuda_backend.c launches these without staging):
 * RMSNorm and rotary with every float operand bf16 but rstd (f32), and the tensor-core
 * attention (hp__cuda_sdpa_native). */
bool hp__cuda_native_bf16(const hp__cuda *cu, const hp_kernel_call *c) {
    static const struct {
        hp_op op;
        int n_in, n_out;
        unsigned f32_in, f32_out; /* bit k: operand k is f32; every other one bf16 */
    } pat[] = {
        {HP_OP_RMS_NORM, 2, 2, 0, 2},
        {HP_OP_RMS_NORM_BACKWARD, 4, 2, 8, 0},
        {HP_OP_ROTARY_EMB, 1, 1, 0, 0},
    };
    hp_op op = c->node->op;
    if (op == HP_OP_SDPA || op == HP_OP_SDPA_BACKWARD) return hp__cuda_sdpa_native(cu, c);
    for (size_t i = 0; i < sizeof pat / sizeof pat[0]; i++) {
        if (pat[i].op != op) continue;
        if (c->n_in != pat[i].n_in || c->n_out != pat[i].n_out) return false;
        for (int k = 0; k < c->n_in; k++)
            if (c->in_type[k].dtype != ((pat[i].f32_in >> k) & 1 ? HP_F32 : HP_BF16)) return false;
        for (int k = 0; k < c->n_out; k++)
            if (c->out_type[k].dtype != ((pat[i].f32_out >> k) & 1 ? HP_F32 : HP_BF16))
                return false;
        return true;
    }
    return false;
}

/* ---- attention ------------------------------------------------------------------------------ */

static hp_status attn_check(const hp_kernel_call *c, int iq, unsigned dt, hp__cu_attn *a,
                            hp_err *err) {
    for (int k = iq; k < iq + 3; k++) HP_TRY(hp__cuda_dtype(c, 0, k, dt, err));
    const hp_type *q = &c->in_type[iq], *k = &c->in_type[iq + 1], *v = &c->in_type[iq + 2];
    bool ok = q->rank == 4 && k->rank == 4 && v->rank == 4;
    ok = ok && k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0];
    ok = ok && k->shape[1] == v->shape[1] && k->shape[2] == v->shape[2];
    ok = ok && k->shape[3] == q->shape[3] && k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0;
    if (!ok) {
        char x[128], y[128], z[128];
        return hp_errf(err, HP_INVALID,
                       "q %s, k %s, v %s are not [B,H,T,D], [B,Hkv,S,D], "
                       "[B,Hkv,S,Dv] with H a multiple of Hkv",
                       hp_type_str(q, x, sizeof x), hp_type_str(k, y, sizeof y),
                       hp_type_str(v, z, sizeof z));
    }
    *a = (hp__cu_attn){.b = q->shape[0],
                       .h = q->shape[1],
                       .hkv = k->shape[1],
                       .t = q->shape[2],
                       .s = k->shape[2],
                       .d = q->shape[3],
                       .dv = v->shape[3],
                       .causal = hp_node_int(c->node, HP_ATTR_CAUSAL, 0) != 0};
    a->scale = (float)hp_node_float(c->node, HP_ATTR_SCALE, 1.0 / sqrt((double)(a->d ? a->d : 1)));
    a->l = hp_attn_lays_of(c->flags, iq == 1, a->h, a->hkv, a->t, a->s, a->d, a->dv);
    if (a->d > HP__CU_ATTN_MAX_D || a->dv > HP__CU_ATTN_MAX_D)
        return hp_errf(err, HP_UNSUPPORTED,
                       "head dims %lld / %lld: the cuda attention kernels take at most %d",
                       (long long)a->d, (long long)a->dv, HP__CU_ATTN_MAX_D);
    if (a->h > 65535 || a->b > 65535)
        return hp_errf(err, HP_UNSUPPORTED, "%lld heads x %lld batch is beyond the grid",
                       (long long)a->h, (long long)a->b);
    return HP_OK;
}

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

bool hp__cuda_sdpa_native(const hp__cuda *cu, const hp_kernel_call *c) {
    hp_op op = c->node->op;
    if (cu->prop.major < 8) return false; /* bf16 mma.sync and ldmatrix: sm_80 on */
    bool bw = op == HP_OP_SDPA_BACKWARD;
    if ((op != HP_OP_SDPA && !bw) || c->n_in != (bw ? 6 : 3) || c->n_out != (bw ? 3 : 2))
        return false;
    hp__cu_attn a;
    if (attn_check(c, bw ? 1 : 0, HP__CM(HP_BF16), &a, NULL) != HP_OK || !hp__cu_flash_ok(&a) ||
        a.t < 1 || a.s < 1)
        return false;
    int n_bf = bw ? 5 : 3; /* inputs in bf16: (gout,) q, k, v(, out); then lse in f32 */
    for (int k = 0; k < n_bf; k++)
        if (c->in_type[k].dtype != HP_BF16 || !aligned16(c->in[k])) return false;
    if (bw && (c->in_type[5].dtype != HP_F32 || hp_type_numel(&c->in_type[5]) != a.b * a.h * a.t ||
               hp_type_numel(&c->in_type[0]) != a.b * a.h * a.t * a.dv ||
               hp_type_numel(&c->in_type[4]) != a.b * a.h * a.t * a.dv))
        return false;
    for (int k = 0; k < c->n_out; k++) {
        bool lse = !bw && k == 1; /* f32, read and written a float at a time */
        if (c->out_type[k].dtype != (lse ? HP_F32 : HP_BF16) || (!lse && !aligned16(c->out[k])))
            return false;
    }
    return true;
}

/* The launch stages bf16 attention operands to f32 unless hp__cuda_sdpa_native takes them as
 * they are: bf16 here means the tensor-core kernels (k_flash.cu), f32 k_attention.cu's. The
 * checks are the same for both; logsumexp is f32 either way. */
HP__CUDA_ENTRY(hp__cuda_sdpa) {
    hp__cu_attn a;
    bool bf = c->in_type[0].dtype == HP_BF16;
    unsigned dt = bf ? HP__CM(HP_BF16) : HP__CF32;
    HP_TRY(attn_check(c, 0, dt, &a, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, dt, err));
    HP_TRY(hp__cuda_dtype(c, 1, 1, HP__CF32, err));
    HP_TRY(hp__cuda_out_numel(c, 0, a.b * a.h * a.t * a.dv, err));
    HP_TRY(hp__cuda_out_numel(c, 1, a.b * a.h * a.t, err));
    if (bf) {
        LAUNCH(hp__cu_flash(s, &a, c->out[0], c->out[1], c->in[0], c->in[1], c->in[2]),
               "flash attention kernel");
        return HP_OK;
    }
    if (a.s == 0) { /* no keys: zeros, and lse -inf (as the empty sum) */
        HP__CUDA_TRY(cudaMemsetAsync(c->out[0], 0, (size_t)(a.b * a.h * a.t * a.dv) * 4, s),
                     "cudaMemsetAsync");
        LAUNCH(hp__cu_fill(s, HP__CU_F32, c->out[1], -INFINITY, a.b * a.h * a.t), "fill");
        return HP_OK;
    }
    LAUNCH(hp__cu_attention(s, &a, c->out[0], c->out[1], c->in[0], c->in[1], c->in[2]),
           "attention kernel");
    return HP_OK;
}

HP__CUDA_ENTRY(hp__cuda_sdpa_backward) {
    hp__cu_attn a;
    bool bf = c->in_type[1].dtype == HP_BF16;
    unsigned dt = bf ? HP__CM(HP_BF16) : HP__CF32;
    HP_TRY(attn_check(c, 1, dt, &a, err));
    for (int k = 0; k < 3; k++) HP_TRY(hp__cuda_dtype(c, 1, k, dt, err));
    HP_TRY(hp__cuda_dtype(c, 0, 0, dt, err));
    HP_TRY(hp__cuda_dtype(c, 0, 4, dt, err));
    HP_TRY(hp__cuda_dtype(c, 0, 5, HP__CF32, err));
    int64_t rows = a.b * a.h * a.t;
    if (hp_type_numel(&c->in_type[0]) != rows * a.dv ||
        hp_type_numel(&c->in_type[4]) != rows * a.dv || hp_type_numel(&c->in_type[5]) != rows)
        return hp_errf(err, HP_INVALID, "g_out, out or logsumexp does not match q and v");
    HP_TRY(hp__cuda_out_numel(c, 0, rows * a.d, err));
    HP_TRY(hp__cuda_out_numel(c, 1, a.b * a.hkv * a.s * a.d, err));
    HP_TRY(hp__cuda_out_numel(c, 2, a.b * a.hkv * a.s * a.dv, err));
    if (!bf) {
        HP__CUDA_TRY(cudaMemsetAsync(c->out[0], 0, (size_t)(rows * a.d) * 4, s), "cudaMemsetAsync");
        if (rows == 0 || a.s == 0) {
            HP__CUDA_TRY(cudaMemsetAsync(c->out[1], 0, (size_t)(a.b * a.hkv * a.s * a.d) * 4, s),
                         "cudaMemsetAsync");
            HP__CUDA_TRY(cudaMemsetAsync(c->out[2], 0, (size_t)(a.b * a.hkv * a.s * a.dv) * 4, s),
                         "cudaMemsetAsync");
            return HP_OK;
        }
    }
    float *delta = hp__cuda_scratch(cu, HP_STREAM_COMPUTE, (size_t)rows * sizeof(float), err);
    if (!delta) return err ? err->status : HP_NOMEM;
    if (bf) /* gq, gk and gv written whole */
        LAUNCH(hp__cu_flash_backward(s, &a, c->out[0], c->out[1], c->out[2], c->in[0], c->in[1],
                                     c->in[2], c->in[3], c->in[4], c->in[5], delta),
               "flash attention backward kernel");
    else
        LAUNCH(hp__cu_attention_backward(s, &a, c->out[0], c->out[1], c->out[2], c->in[0], c->in[1],
                                         c->in[2], c->in[3], c->in[4], c->in[5], delta),
               "attention backward kernel");
    return HP_OK;
}
