/* worker/cpu/k_norm_rope.c — fused RMSNorm forward and backward, rotary position embedding.
 *
 * RMSNorm: one pass per row for the forward (sum of squares in double, then scale); the
 * backward computes each row's input gradient and, per fixed block of rows, a partial weight
 * gradient in double; the blocks combine in order, so gw does not depend on the thread count.
 * Rotary: cos/sin tables [T, D/2] computed in double once per (T, D, theta) and cached in the
 * backend (a few slots, least recently used evicted); the inverse rotation (the gradient) reads
 * the same table with sin negated.
 */
#include "worker/cpu/cpu_internal.h"

#include <math.h>

#define NORM_BLOCK 64 /* rows per weight-gradient partial (a constant: fixes the sum order) */

/* ---- RMSNorm -------------------------------------------------------------------------------- */

typedef struct rms_job {
    const float *x, *w, *gy, *rstd_in;
    float *y, *rstd, *gx;
    double *gw_part; /* backward: [n_blocks][D] */
    int64_t rows, d;
    double eps;
} rms_job;

/* Σ a[i]·b[i] in double, 8 lanes. */
static double dot_d(const float *a, const float *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)a[i + k] * (double)b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += (double)a[i] * (double)b[i];
    double s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

static void rms_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const rms_job *j = ctx;
    int64_t d = j->d;
    for (int64_t r = b; r < e; r++) {
        const float *x = j->x + r * d;
        float *y = j->y + r * d;
        double ss = dot_d(x, x, d);
        float rstd = (float)(1.0 / sqrt(ss / (double)d + j->eps));
        const float *w = j->w; /* a local: a store to y might change *j */
        for (int64_t k = 0; k < d; k++) y[k] = x[k] * rstd * w[k];
        j->rstd[r] = rstd;
    }
}

/* _fused_rms_norm(x [..., D], w [D]){eps} -> (y = x·rstd·w, rstd [...] f32),
 * rstd = 1/sqrt(mean(x², last dim) + eps). */
HP__CPU_KERNEL(hp__cpu_rms_norm) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    const hp_type *t = &c->in_type[0];
    if (t->rank < 1 || c->in_type[1].rank != 1 || c->in_type[1].shape[0] != t->shape[t->rank - 1])
        return hp_errf(err, HP_INVALID, "weight must be [D] for input [..., D]");
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    rms_job j = {.x = c->in[0],
                 .w = c->in[1],
                 .y = c->out[0],
                 .rstd = c->out[1],
                 .d = t->shape[t->rank - 1],
                 .eps = hp_node_float(c->node, HP_ATTR_EPS, 1e-6)};
    j.rows = hp_type_numel(&c->out_type[1]);
    HP_TRY(hp__cpu_out_numel(c, 1, j.d > 0 ? hp_type_numel(t) / j.d : j.rows, err));
    hp_pool_parallel_for(cpu->pool, j.rows, hp__cpu_grain(2 * j.d), rms_rows, &j);
    return HP_OK;
}

/* Block of rows: gx for each, and the block's partial gw = Σ gy·x·rstd. */
static void rms_back_block(void *ctx, int64_t blk, int thread) {
    (void)thread;
    const rms_job *j = ctx;
    int64_t d = j->d, r0 = blk * NORM_BLOCK;
    int64_t r1 = r0 + NORM_BLOCK < j->rows ? r0 + NORM_BLOCK : j->rows;
    double *gw = j->gw_part + blk * d;
    for (int64_t k = 0; k < d; k++) gw[k] = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *gy = j->gy + r * d, *x = j->x + r * d, *w = j->w;
        float *gx = j->gx + r * d;
        float rstd = j->rstd_in[r];
        double acc[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= d; i += 8)
            for (int k = 0; k < 8; k++)
                acc[k] += (double)gy[i + k] * (double)w[i + k] * (double)x[i + k];
        for (int k = 0; i < d; i++, k++) acc[k] += (double)gy[i] * (double)w[i] * (double)x[i];
        double dot = 0;
        for (int k = 0; k < 8; k++) dot += acc[k];
        float coef = (float)((double)rstd * rstd * (dot / (double)d));
        for (int64_t k = 0; k < d; k++) {
            gx[k] = rstd * (gy[k] * w[k] - x[k] * coef);
            gw[k] += (double)(gy[k] * x[k]) * rstd;
        }
    }
}

typedef struct gw_job {
    const double *part;
    float *gw;
    int64_t d, blocks;
} gw_job;

static void gw_cols(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const gw_job *j = ctx;
    for (int64_t k = b; k < e; k++) {
        double s = 0;
        for (int64_t blk = 0; blk < j->blocks; blk++) s += j->part[blk * j->d + k];
        j->gw[k] = (float)s;
    }
}

/* (gy, x, w, rstd) -> (gx, gw): gw = Σ_rows gy·x·rstd;
 * gx = rstd·(gy·w − x·rstd²·mean(gy·w·x, last dim)). */
HP__CPU_KERNEL(hp__cpu_rms_norm_backward) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    const hp_type *t = &c->in_type[1];
    if (t->rank < 1 || c->in_type[2].rank != 1 || c->in_type[2].shape[0] != t->shape[t->rank - 1])
        return hp_errf(err, HP_INVALID, "weight must be [D] for input [..., D]");
    HP_TRY(hp__cpu_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 1, 0, 1, err));
    HP_TRY(hp__cpu_same_shape(c, 2, 1, 1, err));
    rms_job j = {.gy = c->in[0],
                 .x = c->in[1],
                 .w = c->in[2],
                 .rstd_in = c->in[3],
                 .gx = c->out[0],
                 .d = t->shape[t->rank - 1]};
    j.rows = hp_type_numel(&c->in_type[3]);
    if (j.d > 0 && j.rows != hp_type_numel(t) / j.d)
        return hp_errf(err, HP_INVALID, "rstd has %lld rows, the input %lld", (long long)j.rows,
                       (long long)(hp_type_numel(t) / j.d));
    int64_t blocks = (j.rows + NORM_BLOCK - 1) / NORM_BLOCK;
    j.gw_part = hp__cpu_scratch(cpu, (size_t)(blocks * j.d + 1) * sizeof(double), err);
    if (!j.gw_part) return err ? err->status : HP_NOMEM;
    hp_pool_run(cpu->pool, blocks, rms_back_block, &j);
    gw_job g = {j.gw_part, c->out[1], j.d, blocks};
    hp_pool_parallel_for(cpu->pool, j.d, hp__cpu_grain(blocks), gw_cols, &g);
    return HP_OK;
}

/* ---- rotary embedding ----------------------------------------------------------------------- */

void hp__cpu_rope_fini(hp__cpu *cpu) {
    for (int i = 0; i < HP__CPU_ROPE_SLOTS; i++) {
        hp_free(cpu->rope[i].cs);
        cpu->rope[i] = (hp__cpu_rope){0};
    }
}

/* The table for (T, D, theta): cs[(t · D/2 + i) · 2 + {0, 1}] = cos, sin of t·theta^(−2i/D). */
static const float *rope_table(hp__cpu *cpu, int64_t nt, int64_t d, double theta, hp_err *err) {
    hp__cpu_rope *slot = &cpu->rope[0]; /* empty slots have used == 0: they go first */
    for (int i = 0; i < HP__CPU_ROPE_SLOTS; i++) {
        hp__cpu_rope *r = &cpu->rope[i];
        if (r->cs && r->t == nt && r->d == d && r->theta == theta) {
            r->used = ++cpu->rope_clock;
            return r->cs;
        }
        if (r->used < slot->used) slot = r;
    }
    int64_t half = d / 2;
    float *cs = hp_malloc((size_t)(nt * half * 2 + 1) * sizeof *cs);
    if (!cs) {
        hp_errf(err, HP_NOMEM, "out of memory for a rotary table [%lld, %lld]", (long long)nt,
                (long long)half);
        return NULL;
    }
    for (int64_t i = 0; i < half; i++) {
        double f = pow(theta, -2.0 * (double)i / (double)d);
        for (int64_t t = 0; t < nt; t++) {
            double a = (double)t * f;
            cs[(t * half + i) * 2] = (float)cos(a);
            cs[(t * half + i) * 2 + 1] = (float)sin(a);
        }
    }
    hp_free(slot->cs);
    *slot = (hp__cpu_rope){.t = nt, .d = d, .theta = theta, .cs = cs, .used = ++cpu->rope_clock};
    return cs;
}

typedef struct rope_job {
    const float *x, *cs;
    float *y;
    int64_t nt, h, d;
    float sign; /* -1: inverse rotation */
} rope_job;

/* Rows (b, t): H heads of D, each pair (2i, 2i+1) rotated by the angle of (t, i). */
static void rope_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const rope_job *j = ctx;
    int64_t half = j->d / 2;
    for (int64_t row = b; row < e; row++) {
        const float *cs = j->cs + row % j->nt * half * 2;
        for (int64_t h = 0; h < j->h; h++) {
            const float *x = j->x + (row * j->h + h) * j->d;
            float *y = j->y + (row * j->h + h) * j->d;
            for (int64_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = j->sign * cs[2 * i + 1];
                float x0 = x[2 * i], x1 = x[2 * i + 1];
                y[2 * i] = x0 * c - x1 * s;
                y[2 * i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

/* rotary_emb(x [B, T, H, D]){theta, inverse}: pair i of position t rotated by
 * a = t·theta^(−2i/D) (−a when inverse). */
HP__CPU_KERNEL(hp__cpu_rotary) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    if (t->rank != 4 || t->shape[3] % 2)
        return hp_errf(err, HP_INVALID, "input must be [B, T, H, D] with D even");
    rope_job j = {.x = c->in[0],
                  .y = c->out[0],
                  .nt = t->shape[1],
                  .h = t->shape[2],
                  .d = t->shape[3],
                  .sign = hp_node_int(c->node, HP_ATTR_INVERSE, 0) ? -1.0f : 1.0f};
    int64_t rows = t->shape[0] * t->shape[1];
    if (rows == 0 || j.h == 0 || j.d == 0) return HP_OK;
    j.cs = rope_table(cpu, j.nt, j.d, hp_node_float(c->node, HP_ATTR_THETA, 10000.0), err);
    if (!j.cs) return err ? err->status : HP_NOMEM;
    hp_pool_parallel_for(cpu->pool, rows, hp__cpu_grain(2 * j.h * j.d), rope_rows, &j);
    return HP_OK;
}
