/* worker/cpu/k_layer_norm.c — LayerNorm (ATen's native_layer_norm over the last dim, with
 * weight and bias) forward and backward, f32.
 *
 * The forward takes each row's mean and biased variance in double (two passes), then scales.
 * The backward computes each row's input gradient and, per fixed block of rows, partial weight
 * and bias gradients in double; the blocks combine in order, so the result does not depend on
 * the thread count (as for RMSNorm, k_norm_rope.c).
 */
#include "worker/cpu/cpu_internal.h"

#include <math.h>

#define LN_BLOCK 64 /* rows per weight-gradient partial (a constant: fixes the sum order) */

typedef struct ln_job {
    const float *x, *w, *b, *gy, *mean_in, *rstd_in;
    float *y, *mean, *rstd, *gx;
    double *part; /* backward: [n_blocks][2][D]: gw, gb partials */
    int64_t rows, d;
    double eps;
} ln_job;

static void ln_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const ln_job *j = ctx;
    int64_t d = j->d;
    for (int64_t r = b; r < e; r++) {
        const float *x = j->x + r * d;
        float *y = j->y + r * d;
        double s = 0, v = 0;
        for (int64_t k = 0; k < d; k++) s += x[k];
        double mu = d > 0 ? s / (double)d : 0;
        for (int64_t k = 0; k < d; k++) v += ((double)x[k] - mu) * ((double)x[k] - mu);
        double var = d > 0 ? v / (double)d : 0;
        float rstd = (float)(1.0 / sqrt(var + j->eps)), m = (float)mu;
        const float *w = j->w, *bias = j->b; /* locals: a store to y might change *j */
        for (int64_t k = 0; k < d; k++) y[k] = (x[k] - m) * rstd * w[k] + bias[k];
        j->mean[r] = m;
        j->rstd[r] = rstd;
    }
}

static hp_status ln_check(const hp_kernel_call *c, int x, int w, hp_err *err) {
    const hp_type *t = &c->in_type[x];
    if (t->rank < 1 || c->in_type[w].rank != 1 || c->in_type[w].shape[0] != t->shape[t->rank - 1])
        return hp_errf(err, HP_INVALID, "weight must be [D] for input [..., D]");
    return HP_OK;
}

/* native_layer_norm(x [..., D], w [D], b [D]){eps} -> (y, mean [..., 1], rstd [..., 1]). */
HP__CPU_KERNEL(hp__cpu_layer_norm) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(ln_check(c, 0, 1, err));
    HP_TRY(hp__cpu_same_shape(c, 1, 2, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_type *t = &c->in_type[0];
    ln_job j = {.x = c->in[0],
                .w = c->in[1],
                .b = c->in[2],
                .y = c->out[0],
                .mean = c->out[1],
                .rstd = c->out[2],
                .d = t->shape[t->rank - 1],
                .eps = hp_node_float(c->node, HP_ATTR_EPS, 1e-5)};
    j.rows = hp_type_numel(&c->out_type[1]);
    HP_TRY(hp__cpu_out_numel(c, 1, j.d > 0 ? hp_type_numel(t) / j.d : j.rows, err));
    HP_TRY(hp__cpu_out_numel(c, 2, j.rows, err));
    hp_pool_parallel_for(cpu->pool, j.rows, hp__cpu_grain(3 * j.d), ln_rows, &j);
    return HP_OK;
}

/* Block of rows: gx for each, and the block's partial gw = Σ gy·x̂ and gb = Σ gy. */
static void ln_back_block(void *ctx, int64_t blk, int thread) {
    (void)thread;
    const ln_job *j = ctx;
    int64_t d = j->d, r0 = blk * LN_BLOCK;
    int64_t r1 = r0 + LN_BLOCK < j->rows ? r0 + LN_BLOCK : j->rows;
    double *gw = j->part + blk * 2 * d, *gb = gw + d;
    for (int64_t k = 0; k < 2 * d; k++) gw[k] = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *gy = j->gy + r * d, *x = j->x + r * d, *w = j->w;
        float *gx = j->gx + r * d;
        float mu = j->mean_in[r], rstd = j->rstd_in[r];
        double sg = 0, sgx = 0;
        for (int64_t k = 0; k < d; k++) {
            double xh = (double)((x[k] - mu) * rstd), g = (double)gy[k] * (double)w[k];
            sg += g;
            sgx += g * xh;
            gw[k] += (double)gy[k] * xh;
            gb[k] += (double)gy[k];
        }
        float a = (float)(sg / (double)d), bcoef = (float)(sgx / (double)d);
        for (int64_t k = 0; k < d; k++) {
            float xh = (x[k] - mu) * rstd;
            gx[k] = rstd * (gy[k] * w[k] - a - xh * bcoef);
        }
    }
}

typedef struct ln_sum_job {
    const double *part;
    float *gw, *gb;
    int64_t d, blocks;
} ln_sum_job;

static void ln_sum_cols(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const ln_sum_job *j = ctx;
    for (int64_t k = b; k < e; k++) {
        double sw = 0, sb = 0;
        for (int64_t blk = 0; blk < j->blocks; blk++) {
            sw += j->part[blk * 2 * j->d + k];
            sb += j->part[blk * 2 * j->d + j->d + k];
        }
        j->gw[k] = (float)sw;
        j->gb[k] = (float)sb;
    }
}

/* (gy, x, mean, rstd, w) -> (gx, gw, gb): x̂ = (x − mean)·rstd, g = gy·w,
 * gx = rstd·(g − mean(g) − x̂·mean(g·x̂)), gw = Σ_rows gy·x̂, gb = Σ_rows gy. */
HP__CPU_KERNEL(hp__cpu_layer_norm_backward) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(ln_check(c, 1, 4, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 1, 0, 1, err));
    HP_TRY(hp__cpu_same_shape(c, 2, 3, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 4, 1, 1, err));
    HP_TRY(hp__cpu_same_shape(c, 4, 2, 1, err));
    const hp_type *t = &c->in_type[1];
    ln_job j = {.gy = c->in[0],
                .x = c->in[1],
                .mean_in = c->in[2],
                .rstd_in = c->in[3],
                .w = c->in[4],
                .gx = c->out[0],
                .d = t->shape[t->rank - 1]};
    j.rows = hp_type_numel(&c->in_type[2]);
    if (j.d > 0 && j.rows != hp_type_numel(t) / j.d)
        return hp_errf(err, HP_INVALID, "rstd has %lld rows, the input %lld", (long long)j.rows,
                       (long long)(hp_type_numel(t) / j.d));
    int64_t blocks = (j.rows + LN_BLOCK - 1) / LN_BLOCK;
    j.part = hp__cpu_scratch(cpu, (size_t)(blocks * 2 * j.d + 1) * sizeof(double), err);
    if (!j.part) return err ? err->status : HP_NOMEM;
    hp_pool_run(cpu->pool, blocks, ln_back_block, &j);
    ln_sum_job s = {j.part, c->out[1], c->out[2], j.d, blocks};
    hp_pool_parallel_for(cpu->pool, j.d, hp__cpu_grain(2 * blocks), ln_sum_cols, &s);
    return HP_OK;
}
