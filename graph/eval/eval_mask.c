/* graph/eval/eval_mask.c — reference kernels for the masking and index ops exported PyTorch
 * models use: tril, bitwise_not, arange, native_dropout (+ backward). Outputs are rounded by the
 * driver, not here. */
#include "graph/eval/eval_internal.h"
#include "hp/rng.h"

/* tril(x [..., M, N]){diagonal}: element (i, j) of each matrix kept where j − i <= diagonal,
 * else 0. */
HP__EVAL_KERNEL(hp__eval_tril) {
    (void)cx, (void)err;
    const hp_type *t = &in[0]->type;
    int64_t m = t->shape[t->rank - 2], nn = t->shape[t->rank - 1];
    int64_t k = hp_node_int(n, HP_ATTR_DIAGONAL, 0), total = hp__eval_numel(in[0]);
    for (int64_t p = 0; p < total; p++) {
        int64_t j = p % nn, i = nn > 0 ? (p / nn) % m : 0;
        out[0].data[p] = j - i <= k ? in[0]->data[p] : 0;
    }
    return HP_OK;
}

/* bitwise_not: !x on bool, ~x (two's complement: −x − 1) on integers. */
HP__EVAL_KERNEL(hp__eval_bitwise_not) {
    (void)cx, (void)n, (void)err;
    bool b = in[0]->type.dtype == HP_BOOL;
    int64_t total = hp__eval_numel(in[0]);
    for (int64_t p = 0; p < total; p++) {
        double x = in[0]->data[p];
        out[0].data[p] = b ? (x == 0) : -x - 1;
    }
    return HP_OK;
}

/* arange{start, end, step}: element i = start + i·step. */
HP__EVAL_KERNEL(hp__eval_arange) {
    (void)cx, (void)in, (void)err;
    int64_t s = hp_node_int(n, HP_ATTR_START, 0), step = hp_node_int(n, HP_ATTR_STEP, 1);
    int64_t total = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < total; i++) out[0].data[i] = (double)(s + i * step);
    return HP_OK;
}

/* native_dropout{p, fqn}: the mask of hp/rng.h at the run's (seed, step) and the elements'
 * global indices (the dropout hook's box, else the whole tensor); y = x / (1 - p) where kept. */
HP__EVAL_KERNEL(hp__eval_dropout) {
    const hp_type *t = &in[0]->type;
    const hp_attr *f = hp_node_attr(n, HP_ATTR_FQN);
    hp_dropout_site s = {.seed = cx->opts->seed,
                         .step = cx->opts->step,
                         .stream = hp_rng_stream_id(f && f->s ? f->s : ""),
                         .rank = t->rank};
    for (int d = 0; d < t->rank; d++) s.local[d] = s.global[d] = t->shape[d];
    if (cx->opts->dropout_site)
        HP_TRY(cx->opts->dropout_site(cx->opts->dropout_ctx, n, s.off, s.global, err));
    double p = hp_node_float(n, HP_ATTR_P, 0.0), scale = 1.0 / (1.0 - p);
    int64_t total = hp__eval_numel(in[0]);
    uint8_t *keep = hp_malloc((size_t)total + 1);
    if (!keep) return hp_errf(err, HP_NOMEM, "out of memory for the mask");
    hp_dropout_keep(&s, hp_dropout_threshold(p), 0, total, keep);
    for (int64_t i = 0; i < total; i++) {
        out[0].data[i] = keep[i] ? in[0]->data[i] * scale : 0;
        out[1].data[i] = keep[i];
    }
    hp_free(keep);
    return HP_OK;
}

/* native_dropout_backward(grad, mask){scale}: grad * mask * scale. */
HP__EVAL_KERNEL(hp__eval_dropout_backward) {
    (void)cx, (void)err;
    double scale = hp_node_float(n, HP_ATTR_SCALE, 1.0);
    int64_t total = hp__eval_numel(in[0]);
    for (int64_t i = 0; i < total; i++)
        out[0].data[i] = in[1]->data[i] != 0 ? in[0]->data[i] * scale : 0;
    return HP_OK;
}
