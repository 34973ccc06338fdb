/* worker/optim.c — AdamW, gradient norms and clipping, the LR schedule (hp/optim.h).
 *
 * Bit-exactness with torch hangs on two things: every rounding step is written out (fmaf
 * where torch's AVX2 kernels use a fused multiply-add, a separate multiply and add where
 * they do not), and the compiler must not fuse anything else — hence fp-contract=off for
 * this file. Work over a list of tensors is split over their concatenation, so a pool
 * balances one huge embedding and many small norms alike, without allocating.
 */
#include "hp/optim.h"
#include "worker/bf16.h"

#include "simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HP_OPTIM_AVX2 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#define ELEM_GRAIN 32768 /* elementwise work per parallel-for chunk, at least */
#define NORM_BLOCK 16384 /* elements per grad-norm block: fixes the summation order */
#define NORM_ROUND 512   /* blocks per pool run (their sums sit on the stack) */
#define NORM_GRAIN 4     /* blocks per task, at least */

/* ---- walking a list of tensors as one concatenation ------------------------------------------ */

/* Runs the statements (the trailing macro arguments) for every piece of [begin, end) of the
 * concatenation of n_items tensors whose sizes numel_of gives (an expression in t_), with piece_t
 * (tensor index), piece_off (offset in it) and piece_len in scope. They must not `continue` or
 * `break`. */
#define FOR_EACH_PIECE(n_items, numel_of, begin, end, ...)                                         \
    do {                                                                                           \
        int64_t base_ = 0, b_ = (begin), e_ = (end);                                               \
        for (int t_ = 0; t_ < (n_items) && base_ < e_; t_++) {                                     \
            int64_t len_ = (numel_of);                                                             \
            int64_t lo_ = b_ > base_ ? b_ - base_ : 0;                                             \
            int64_t hi_ = e_ - base_ < len_ ? e_ - base_ : len_;                                   \
            if (lo_ < hi_) {                                                                       \
                int piece_t = t_;                                                                  \
                int64_t piece_off = lo_, piece_len = hi_ - lo_;                                    \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
            base_ += len_;                                                                         \
        }                                                                                          \
    } while (0)

/* ---- AdamW ----------------------------------------------------------------------------------- */

hp_adamw_config hp_adamw_defaults(void) {
    return (hp_adamw_config){.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
}

/* The per-step scalars, rounded to float where torch rounds them. */
typedef struct adamw_k {
    float decay;    /* 1 - lr * wd */
    float b1, omb1; /* beta1, 1 - beta1 */
    float b2, omb2; /* beta2, 1 - beta2 */
    float bc2_sqrt; /* sqrt(1 - beta2^step) */
    float eps;      /* eps */
    float neg_step; /* -lr / (1 - beta1^step) */
    float g_scale;  /* each gradient is read times this (clipping; 1: as is) */
} adamw_k;

static void adamw_scalar(const adamw_k *k, float *p, const float *g, float *m, float *v,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i] * k->decay;
        float gi = g[i] * k->g_scale;
        float mi = fmaf(gi, k->omb1, m[i] * k->b1);
        float vi = fmaf(k->omb2 * gi, gi, v[i] * k->b2);
        float den = sqrtf(vi) / k->bc2_sqrt + k->eps;
        p[i] = pi + (k->neg_step * mi) / den;
        m[i] = mi;
        v[i] = vi;
    }
}

#ifdef HP_OPTIM_AVX2
__attribute__((target("avx2,fma"))) static void
adamw_avx2(const adamw_k *k, float *p, const float *g, float *m, float *v, int64_t n) {
    const __m256 decay = _mm256_set1_ps(k->decay), b1 = _mm256_set1_ps(k->b1),
                 omb1 = _mm256_set1_ps(k->omb1), b2 = _mm256_set1_ps(k->b2),
                 omb2 = _mm256_set1_ps(k->omb2), bc2 = _mm256_set1_ps(k->bc2_sqrt),
                 eps = _mm256_set1_ps(k->eps), step = _mm256_set1_ps(k->neg_step),
                 gs = _mm256_set1_ps(k->g_scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
        __m256 mi = _mm256_fmadd_ps(gi, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
        __m256 vi =
            _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        pi = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), den));
        _mm256_storeu_ps(p + i, pi);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
    }
    adamw_scalar(k, p + i, g + i, m + i, v + i, n - i);
}
#endif

typedef struct adamw_ctx {
    const adamw_k *k;
    const hp_adamw_param *params;
    int n;
    int avx2;
} adamw_ctx;

/* The bf16 copy of n updated elements: the cpu backend's _to_copy rounding. */
static void round_bf16(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = hp__bf16_round(x[i]);
}

static void adamw_chunk(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const adamw_ctx *c = ctx;
    FOR_EACH_PIECE(c->n, c->params[t_].numel, begin, end, {
        const hp_adamw_param *q = &c->params[piece_t];
        float *p = q->param + piece_off, *m = q->exp_avg + piece_off;
        float *v = q->exp_avg_sq + piece_off;
        const float *g = q->grad + piece_off;
#ifdef HP_OPTIM_AVX2
        if (c->avx2)
            adamw_avx2(c->k, p, g, m, v, piece_len);
        else
#endif
            adamw_scalar(c->k, p, g, m, v, piece_len);
        if (q->param_bf16) round_bf16(q->param_bf16 + piece_off, p, piece_len);
    });
}

static hp_status check_config(const hp_adamw_config *cfg, hp_err *err) {
    if (!cfg) return hp_errf(err, HP_INVALID, "adamw: config is NULL");
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1))
        return hp_errf(err, HP_INVALID, "adamw: beta1 %g is outside [0, 1)", cfg->beta1);
    if (!(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return hp_errf(err, HP_INVALID, "adamw: beta2 %g is outside [0, 1)", cfg->beta2);
    if (!(cfg->eps >= 0 && isfinite(cfg->eps)))
        return hp_errf(err, HP_INVALID, "adamw: eps %g must be finite and >= 0", cfg->eps);
    if (!(cfg->weight_decay >= 0 && isfinite(cfg->weight_decay)))
        return hp_errf(err, HP_INVALID, "adamw: weight_decay %g must be finite and >= 0",
                       cfg->weight_decay);
    return HP_OK;
}

hp_status hp_adamw_step(const hp_adamw_config *cfg, double lr, int64_t step,
                        const hp_adamw_param *params, int n_params, hp_pool *pool, hp_err *err) {
    return hp_adamw_step_scaled(cfg, lr, 1.0f, step, params, n_params, pool, err);
}

hp_status hp_adamw_step_scaled(const hp_adamw_config *cfg, double lr, float grad_scale,
                               int64_t step, const hp_adamw_param *params, int n_params,
                               hp_pool *pool, hp_err *err) {
    HP_TRY(check_config(cfg, err));
    if (!(grad_scale > 0 && isfinite(grad_scale)))
        return hp_errf(err, HP_INVALID, "adamw: grad_scale %g must be finite and > 0",
                       (double)grad_scale);
    if (!(lr >= 0 && isfinite(lr)))
        return hp_errf(err, HP_INVALID, "adamw: lr %g must be finite and >= 0", lr);
    if (step < 1) return hp_errf(err, HP_INVALID, "adamw: step %lld must be >= 1", (long long)step);
    if (n_params < 0 || (n_params > 0 && !params))
        return hp_errf(err, HP_INVALID, "adamw: bad tensor list (%d tensors)", n_params);
    int64_t total = 0;
    for (int i = 0; i < n_params; i++) {
        const hp_adamw_param *q = &params[i];
        if (q->numel < 0 || q->numel > INT64_MAX - total)
            return hp_errf(err, HP_INVALID, "adamw: tensor %d has numel %lld", i,
                           (long long)q->numel);
        if (q->numel > 0 && (!q->param || !q->grad || !q->exp_avg || !q->exp_avg_sq))
            return hp_errf(err, HP_INVALID,
                           "adamw: tensor %d (numel %lld) has a NULL param, grad or state buffer",
                           i, (long long)q->numel);
        total += q->numel;
    }
    /* As _single_tensor_adamw: Python doubles, then the tensor kernels' float scalars. */
    double bc1 = 1 - pow(cfg->beta1, (double)step);
    double bc2 = 1 - pow(cfg->beta2, (double)step);
    adamw_k k = {
        .decay = (float)(1 - lr * cfg->weight_decay),
        .b1 = (float)cfg->beta1,
        .omb1 = (float)(1 - cfg->beta1),
        .b2 = (float)cfg->beta2,
        .omb2 = (float)(1 - cfg->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)cfg->eps,
        .neg_step = (float)(-(lr / bc1)),
        .g_scale = grad_scale,
    };
    adamw_ctx c = {&k, params, n_params, hp__simd_avx2()};
    hp_pool_parallel_for(pool, total, ELEM_GRAIN, adamw_chunk, &c);
    return HP_OK;
}

/* ---- gradient norm --------------------------------------------------------------------------- */

static hp_status check_spans(const char *what, const hp_fspan *s, int n, int64_t *total,
                             hp_err *err) {
    if (n < 0 || (n > 0 && !s))
        return hp_errf(err, HP_INVALID, "%s: bad span list (%d spans)", what, n);
    int64_t t = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].n < 0 || s[i].n > INT64_MAX - t)
            return hp_errf(err, HP_INVALID, "%s: span %d has length %lld", what, i,
                           (long long)s[i].n);
        if (s[i].n > 0 && !s[i].data)
            return hp_errf(err, HP_INVALID, "%s: span %d (length %lld) has NULL data", what, i,
                           (long long)s[i].n);
        t += s[i].n;
    }
    *total = t;
    return HP_OK;
}

/* Sum of squares of x[0..n) in double: four lanes by position, combined ((0+1)+(2+3)). */
static double sumsq_run(const float *x, int64_t n) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        double x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];
        a0 += x0 * x0;
        a1 += x1 * x1;
        a2 += x2 * x2;
        a3 += x3 * x3;
    }
    for (; i < n; i++) {
        double xi = x[i];
        a0 += xi * xi;
    }
    return (a0 + a1) + (a2 + a3);
}

typedef struct norm_ctx {
    const hp_fspan *s;
    int n;
    int64_t total;
    int64_t first_block; /* of this round */
    double *block_sums;  /* [NORM_ROUND] */
} norm_ctx;

static void norm_blocks(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    norm_ctx *c = ctx;
    for (int64_t b = begin; b < end; b++) {
        int64_t lo = (c->first_block + b) * NORM_BLOCK;
        int64_t hi = c->total - lo < NORM_BLOCK ? c->total : lo + NORM_BLOCK;
        double sum = 0;
        FOR_EACH_PIECE(c->n, c->s[t_].n, lo, hi,
                       { sum += sumsq_run(c->s[piece_t].data + piece_off, piece_len); });
        c->block_sums[b] = sum;
    }
}

hp_status hp_grad_sumsq(const hp_fspan *grads, int n, hp_pool *pool, double *sumsq, hp_err *err) {
    int64_t total = 0;
    HP_TRY(check_spans("grad norm", grads, n, &total, err));
    if (!sumsq) return hp_errf(err, HP_INVALID, "grad norm: sumsq is NULL");
    double block_sums[NORM_ROUND];
    int64_t n_blocks = total / NORM_BLOCK + (total % NORM_BLOCK != 0);
    double acc = 0;
    for (int64_t first = 0; first < n_blocks; first += NORM_ROUND) {
        int64_t count = n_blocks - first < NORM_ROUND ? n_blocks - first : NORM_ROUND;
        norm_ctx c = {grads, n, total, first, block_sums};
        hp_pool_parallel_for(pool, count, NORM_GRAIN, norm_blocks, &c);
        for (int64_t b = 0; b < count; b++) acc += block_sums[b];
    }
    *sumsq = acc;
    return HP_OK;
}

/* ---- clipping -------------------------------------------------------------------------------- */

float hp_clip_coef(double total_norm, double max_norm) {
    /* torch: clip_coef = max_norm / (total_norm + 1e-6) on a float32 0-dim tensor, where
     * scalar / tensor is tensor.reciprocal() * scalar; then clamp(max=1). */
    float den = (float)total_norm + 1e-6f;
    float coef = (1.0f / den) * (float)max_norm;
    return coef > 1.0f ? 1.0f : coef;
}

typedef struct scale_ctx {
    const hp_fspan *s;
    int n;
    float coef;
} scale_ctx;

static void scale_chunk(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const scale_ctx *c = ctx;
    FOR_EACH_PIECE(c->n, c->s[t_].n, begin, end, {
        float *x = c->s[piece_t].data + piece_off;
        for (int64_t i = 0; i < piece_len; i++) x[i] *= c->coef;
    });
}

hp_status hp_grad_scale(const hp_fspan *grads, int n, float coef, hp_pool *pool, hp_err *err) {
    int64_t total = 0;
    HP_TRY(check_spans("grad scale", grads, n, &total, err));
    if (coef == 1.0f) return HP_OK;
    scale_ctx c = {grads, n, coef};
    hp_pool_parallel_for(pool, total, ELEM_GRAIN, scale_chunk, &c);
    return HP_OK;
}

/* ---- gradient accumulation -------------------------------------------------------------- */

typedef struct accum_ctx {
    const hp_fspan *dst, *src;
    int n;
    bool first;
} accum_ctx;

static void accumulate_chunk(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const accum_ctx *c = ctx;
    FOR_EACH_PIECE(c->n, c->dst[t_].n, begin, end, {
        float *d = c->dst[piece_t].data + piece_off;
        const float *x = c->src[piece_t].data + piece_off;
        if (c->first)
            memcpy(d, x, (size_t)piece_len * sizeof *d);
        else
            for (int64_t i = 0; i < piece_len; i++) d[i] += x[i];
    });
}

hp_status hp_grad_accumulate(const hp_fspan *dst, const hp_fspan *src, int n, bool first,
                             hp_pool *pool, hp_err *err) {
    int64_t total = 0, src_total = 0;
    HP_TRY(check_spans("grad accumulate", dst, n, &total, err));
    HP_TRY(check_spans("grad accumulate", src, n, &src_total, err));
    for (int i = 0; i < n; i++)
        if (dst[i].n != src[i].n)
            return hp_errf(err, HP_INVALID,
                           "grad accumulate: span %d has %lld elements, its source %lld", i,
                           (long long)dst[i].n, (long long)src[i].n);
    accum_ctx c = {dst, src, n, first};
    hp_pool_parallel_for(pool, total, ELEM_GRAIN, accumulate_chunk, &c);
    return HP_OK;
}

hp_status hp_clip_grad_norm(const hp_fspan *grads, int n, double max_norm, hp_pool *pool,
                            double *total_norm, hp_err *err) {
    if (!(max_norm > 0 && isfinite(max_norm)))
        return hp_errf(err, HP_INVALID, "clip grad norm: max_norm %g must be finite and > 0",
                       max_norm);
    double sumsq;
    HP_TRY(hp_grad_sumsq(grads, n, pool, &sumsq, err));
    double norm = sqrt(sumsq);
    if (total_norm) *total_norm = norm;
    float coef = hp_clip_coef(norm, max_norm);
    if (!(coef >= 1.0f)) HP_TRY(hp_grad_scale(grads, n, coef, pool, err)); /* NaN too, as torch */
    return HP_OK;
}

/* ---- LR schedule ----------------------------------------------------------------------------- */

static const char *const decay_names[] = {"linear", "sqrt", "cosine", "none"};

const char *hp_lr_decay_name(hp_lr_decay d) {
    return (unsigned)d < HP_ARRAY_LEN(decay_names) ? decay_names[d] : "?";
}

hp_status hp_lr_decay_parse(const char *name, hp_lr_decay *out, hp_err *err) {
    if (!name || !out) return hp_errf(err, HP_INVALID, "lr decay: NULL argument");
    for (unsigned i = 0; i < HP_ARRAY_LEN(decay_names); i++)
        if (strcmp(name, decay_names[i]) == 0) {
            *out = (hp_lr_decay)i;
            return HP_OK;
        }
    if (strcmp(name, "constant") == 0) {
        *out = HP_LR_DECAY_NONE;
        return HP_OK;
    }
    return hp_errf(err, HP_INVALID,
                   "lr decay '%s' is unknown (expected linear, sqrt, cosine or none)", name);
}

hp_status hp_lr_schedule_init(hp_lr_schedule *s, double base_lr, int64_t total_steps,
                              int64_t warmup_steps, double decay_ratio, hp_lr_decay decay,
                              double min_lr_factor, hp_err *err) {
    if (!s) return hp_errf(err, HP_INVALID, "lr schedule: NULL schedule");
    if (!(base_lr >= 0 && isfinite(base_lr)))
        return hp_errf(err, HP_INVALID, "lr schedule: lr %g must be finite and >= 0", base_lr);
    if (total_steps < 1)
        return hp_errf(err, HP_INVALID, "lr schedule: total steps %lld must be >= 1",
                       (long long)total_steps);
    if (warmup_steps < 0)
        return hp_errf(err, HP_INVALID, "lr schedule: warmup steps %lld must be >= 0",
                       (long long)warmup_steps);
    if (isnan(decay_ratio) || decay_ratio > 1)
        return hp_errf(err, HP_INVALID, "lr schedule: decay ratio %g must be <= 1 (< 0: none)",
                       decay_ratio);
    if (!(min_lr_factor >= 0 && min_lr_factor <= 1))
        return hp_errf(err, HP_INVALID, "lr schedule: min lr factor %g is outside [0, 1]",
                       min_lr_factor);
    if ((unsigned)decay >= HP_ARRAY_LEN(decay_names))
        return hp_errf(err, HP_INVALID, "lr schedule: decay kind %d is unknown", (int)decay);
    int64_t warmup = warmup_steps > total_steps ? total_steps : warmup_steps;
    int64_t decay_steps;
    if (decay == HP_LR_DECAY_NONE) {
        decay_steps = 0;
    } else if (decay_ratio >= 0) {
        decay_steps = (int64_t)rint((double)total_steps * decay_ratio); /* half to even, as round */
        if (warmup + decay_steps > total_steps) decay_steps = total_steps - warmup;
    } else {
        decay_steps = total_steps - warmup;
    }
    *s = (hp_lr_schedule){
        .base_lr = base_lr,
        .warmup_steps = warmup,
        .stable_steps = total_steps + 1 - warmup - decay_steps,
        .decay_steps = decay_steps,
        .decay = decay,
        .min_lr_factor = min_lr_factor,
    };
    return HP_OK;
}

double hp_lr_at(const hp_lr_schedule *s, int64_t step) {
    int64_t c = step < 1 ? 0 : step - 1; /* LambdaLR's last_epoch */
    int64_t warmup_stable = s->warmup_steps + s->stable_steps;
    double f;
    if (c < s->warmup_steps) {
        f = (double)(c + 1) / (double)s->warmup_steps;
    } else if (c < warmup_stable || s->decay_steps == 0) {
        f = 1.0;
    } else {
        double progress = (double)(c + 1 - warmup_stable) / (double)s->decay_steps;
        if (progress > 1) progress = 1; /* past the planned end: hold the minimum */
        double adj;
        switch (s->decay) {
        case HP_LR_DECAY_SQRT:
            adj = 1 - sqrt(progress);
            break;
        case HP_LR_DECAY_COSINE:
            adj = 0.5 * (1.0 + cos(M_PI * progress));
            break;
        default:
            adj = 1 - progress;
            break;
        }
        f = s->min_lr_factor + (1 - s->min_lr_factor) * adj;
    }
    return s->base_lr * f;
}
