/* worker/cuda/cuda_ops_mask.c — the entries of k_mask.cu: tril, bitwise_not, arange,
 * native_dropout and its backward, the ops of exported PyTorch models (GPT-2 style graphs)
 * that the Llama builders do not make. Checks as the cpu backend's (worker/cpu/k_mask.c); bf16
 * dropout and arange run staged (cuda_backend.c). */
#include "worker/cuda/cuda_internal.h"

#include "hp/rng.h"

#define LAUNCH(call, what) HP__CUDA_TRY((call), (what))

/* tril(x [..., M, N]){diagonal}: (i, j) kept where j − i <= diagonal, else 0; any dtype. */
HP__CUDA_ENTRY(hp__cuda_tril) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CANY, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    if (t->rank < 2) return hp_errf(err, HP_INVALID, "input must have rank >= 2");
    LAUNCH(hp__cu_tril(s, hp_dtype_size(t->dtype), c->out[0], c->in[0], t->shape[t->rank - 2],
                       t->shape[t->rank - 1], hp_node_int(c->node, HP_ATTR_DIAGONAL, 0),
                       hp_type_numel(t)),
           "tril kernel");
    return HP_OK;
}

/* bitwise_not: !x on bool, ~x on integers. */
HP__CUDA_ENTRY(hp__cuda_bitwise_not) {
    HP_TRY(hp__cuda_dtypes_all(c, HP__CINTS | HP__CM(HP_BOOL), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    LAUNCH(hp__cu_bitwise_not(s, hp__cuda_dt(c->in_type[0].dtype), c->out[0], c->in[0],
                              hp_type_numel(&c->in_type[0])),
           "bitwise_not kernel");
    return HP_OK;
}

/* arange{start, end, step}: element i = start + i·step (i32, i64, f32). */
HP__CUDA_ENTRY(hp__cuda_arange) {
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CF32 | HP__CINTS, err));
    LAUNCH(hp__cu_arange(s, hp__cuda_dt(c->out_type[0].dtype), c->out[0],
                         hp_node_int(c->node, HP_ATTR_START, 0),
                         hp_node_int(c->node, HP_ATTR_STEP, 1), hp_type_numel(&c->out_type[0])),
           "arange kernel");
    return HP_OK;
}

/* native_dropout{p, fqn} -> (y, mask): the mask of hp/rng.h at the call's site (the global
 * indices of this rank's piece), y = x · 1/(1 − p) where kept, else 0. */
HP__CUDA_ENTRY(hp__cuda_dropout) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 1, 1, HP__CM(HP_BOOL), err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    HP_TRY(hp__cuda_out_numel(c, 1, hp_type_numel(&c->in_type[0]), err));
    const hp_type *t = &c->in_type[0];
    hp_dropout_site site;
    double p;
    HP_TRY(hp_dropout_site_of(c, &site, &p, err));
    hp__cu_dropout_draw d = {.seed = site.seed,
                             .stream = hp_dropout_stream(&site),
                             .threshold = hp_dropout_threshold(p),
                             .scale = (float)(1.0 / (1.0 - p)),
                             .rank = t->rank};
    for (int k = 0; k < t->rank; k++) {
        d.local[k] = site.local[k];
        d.off[k] = site.off[k];
        d.global[k] = site.global[k];
    }
    LAUNCH(hp__cu_dropout(s, &d, c->out[0], c->out[1], c->in[0], hp_type_numel(t)),
           "dropout kernel");
    return HP_OK;
}

/* native_dropout_backward(grad, mask){scale}: grad · scale where the mask kept, else 0. */
HP__CUDA_ENTRY(hp__cuda_dropout_backward) {
    HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CF32, err));
    HP_TRY(hp__cuda_dtype(c, 0, 1, HP__CM(HP_BOOL), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CF32, err));
    HP_TRY(hp__cuda_same_shape(c, 0, 0, 1, err));
    HP_TRY(hp__cuda_out_numel(c, 0, hp_type_numel(&c->in_type[1]), err));
    LAUNCH(hp__cu_dropout_backward(s, c->out[0], c->in[0], c->in[1],
                                   (float)hp_node_float(c->node, HP_ATTR_SCALE, 1.0),
                                   hp_type_numel(&c->in_type[0])),
           "dropout backward kernel");
    return HP_OK;
}
