/* graph/eval/eval_mask.c — reference kernels for the masking and index ops exported PyTorch
 * models use: tril, bitwise_not, arange. Outputs are rounded by the driver, not here. */
#include "graph/eval/eval_internal.h"

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
