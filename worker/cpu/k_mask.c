/* worker/cpu/k_mask.c — the masking and index ops exported PyTorch models use: tril (any
 * dtype), bitwise_not (bool, i32, i64), arange (i32, i64, f32), native_dropout (+ backward; f32,
 * bf16 staged by cpu_backend.c). Plain loops, split over the
 * pool by fixed chunks. */
#include "worker/cpu/cpu_internal.h"

typedef struct mask_job {
    const void *x;
    void *y;
    size_t esz;      /* element bytes */
    int64_t m, n, k; /* tril: matrix rows, cols, diagonal */
    hp_dtype dt;
    int64_t start, step;         /* arange */
    const hp_dropout_site *site; /* native_dropout */
    uint32_t threshold;
    float scale;
    const uint8_t *mask; /* native_dropout_backward */
    uint8_t *keep;       /* native_dropout */
} mask_job;

/* tril over whole matrices b..e. */
static void tril_mats(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const mask_job *j = ctx;
    for (int64_t mat = b; mat < e; mat++)
        for (int64_t i = 0; i < j->m; i++) {
            size_t row = (size_t)((mat * j->m + i) * j->n) * j->esz;
            int64_t keep = i + j->k + 1; /* columns [0, keep) stay */
            keep = keep < 0 ? 0 : keep > j->n ? j->n : keep;
            const uint8_t *x = (const uint8_t *)j->x + row;
            uint8_t *y = (uint8_t *)j->y + row;
            if (y != x) memcpy(y, x, (size_t)keep * j->esz);
            memset(y + (size_t)keep * j->esz, 0, (size_t)(j->n - keep) * j->esz);
        }
}

/* tril(x [..., M, N]){diagonal}: (i, j) kept where j − i <= diagonal, else 0. */
HP__CPU_KERNEL(hp__cpu_tril) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__ANY, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    if (t->rank < 2) return hp_errf(err, HP_INVALID, "input must have rank >= 2");
    mask_job j = {.x = c->in[0],
                  .y = c->out[0],
                  .esz = hp_dtype_size(t->dtype),
                  .m = t->shape[t->rank - 2],
                  .n = t->shape[t->rank - 1],
                  .k = hp_node_int(c->node, HP_ATTR_DIAGONAL, 0)};
    int64_t mats = j.m * j.n > 0 ? hp_type_numel(t) / (j.m * j.n) : 0;
    hp_pool_parallel_for(cpu->pool, mats, hp__cpu_grain(j.m * j.n), tril_mats, &j);
    return HP_OK;
}

static void not_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const mask_job *j = ctx;
    if (j->dt == HP_BOOL) {
        const uint8_t *x = j->x;
        uint8_t *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = x[i] == 0;
    } else if (j->dt == HP_I32) {
        const int32_t *x = j->x;
        int32_t *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = ~x[i];
    } else {
        const int64_t *x = j->x;
        int64_t *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = ~x[i];
    }
}

/* bitwise_not: !x on bool, ~x on integers. */
HP__CPU_KERNEL(hp__cpu_bitwise_not) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__INTS | HP__M(HP_BOOL), err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    mask_job j = {.x = c->in[0], .y = c->out[0], .dt = c->in_type[0].dtype};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->in_type[0]), HP__CPU_GRAIN, not_chunk, &j);
    return HP_OK;
}

static void arange_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const mask_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        int64_t v = j->start + i * j->step;
        if (j->dt == HP_I64)
            ((int64_t *)j->y)[i] = v;
        else if (j->dt == HP_I32)
            ((int32_t *)j->y)[i] = (int32_t)v;
        else
            ((float *)j->y)[i] = (float)v;
    }
}

/* arange{start, end, step}: element i = start + i·step. */
HP__CPU_KERNEL(hp__cpu_arange) {
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__NUM, err));
    mask_job j = {.y = c->out[0],
                  .dt = c->out_type[0].dtype,
                  .start = hp_node_int(c->node, HP_ATTR_START, 0),
                  .step = hp_node_int(c->node, HP_ATTR_STEP, 1)};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), HP__CPU_GRAIN, arange_chunk,
                         &j);
    return HP_OK;
}

static void dropout_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const mask_job *j = ctx;
    hp_dropout_keep(j->site, j->threshold, b, e - b, j->keep + b);
    const float *x = j->x;
    float *y = j->y;
    const uint8_t *keep = j->keep;
    const float scale = j->scale; /* locals: a store to y might change *j */
    for (int64_t i = b; i < e; i++) y[i] = keep[i] ? x[i] * scale : 0.0f;
}

/* native_dropout{p, fqn} -> (y, mask): the mask of hp/rng.h at the call's site (the global
 * indices of this rank's piece), y = x * (1 / (1 - p)) where kept, else 0. */
HP__CPU_KERNEL(hp__cpu_dropout) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 1, HP__M(HP_BOOL), err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    HP_TRY(hp__cpu_out_numel(c, 1, hp_type_numel(&c->in_type[0]), err));
    const hp_type *t = &c->in_type[0];
    hp_dropout_site s;
    double p;
    HP_TRY(hp_dropout_site_of(c, &s, &p, err));
    mask_job j = {.x = c->in[0],
                  .y = c->out[0],
                  .keep = c->out[1],
                  .site = &s,
                  .threshold = hp_dropout_threshold(p),
                  .scale = (float)(1.0 / (1.0 - p))};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(t), HP__CPU_GRAIN, dropout_chunk, &j);
    return HP_OK;
}

static void dropout_bwd_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const mask_job *j = ctx;
    const float *g = j->x;
    float *y = j->y;
    const uint8_t *mask = j->mask;
    const float scale = j->scale; /* locals: a store to y might change *j */
    for (int64_t i = b; i < e; i++) y[i] = mask[i] ? g[i] * scale : 0.0f;
}

/* native_dropout_backward(grad, mask){scale}: grad * scale where the mask kept, else 0. */
HP__CPU_KERNEL(hp__cpu_dropout_backward) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__M(HP_BOOL), err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    HP_TRY(hp__cpu_out_numel(c, 0, hp_type_numel(&c->in_type[1]), err));
    mask_job j = {.x = c->in[0],
                  .y = c->out[0],
                  .mask = c->in[1],
                  .scale = (float)hp_node_float(c->node, HP_ATTR_SCALE, 1.0)};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->in_type[0]), HP__CPU_GRAIN, dropout_bwd_chunk,
                         &j);
    return HP_OK;
}
