/* bench/bench_cpu_kernels.c — GFLOP/s of the cpu backend's matmul (OpenBLAS) and flash-style
 * attention forward/backward, each next to a naive single-threaded C reference measured in the
 * same run; the last column is backend / naive. mm also runs with bf16 operands (widened into
 * f32 staging, the same sgemm, rounded on store) and prints its rate as a ratio to f32's.
 *
 * mm: 2·M·N·K FLOPs. Attention: only the (query, key) pairs the mask lets through count:
 * forward 4·D per pair (q·k and p·v), backward 10·D (q·k recomputed, dO·v, pᵀdO, dSᵀq, dS·k).
 * The naive attention is the textbook loop with one score row of length S per query.
 *
 * Usage: bench_cpu_kernels [threads] [reps]   (defaults: hp_default_threads(), 5)
 */
#include "hp/build.h"
#include "hp/threads.h"
#include "worker/cpu/cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const hp_err *e) {
    fprintf(stderr, "bench_cpu_kernels: %s: %s\n", what, e ? e->msg : "failed");
    exit(1);
}

static float *rand_buf(int64_t n, unsigned seed) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) die("malloc", NULL);
    uint64_t s = seed * 0x9E3779B97F4A7C15u + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    return p;
}

/* Best time of `reps` launches of node `node` of g with the given buffers. */
static double time_launch(hp_backend *be, const hp_graph *g, int node, void **in,
                          const hp_type *in_type, void **out, int reps) {
    const hp_node *n = &g->nodes[node];
    hp_kernel_call c = {.node = n,
                        .n_in = n->n_in,
                        .n_out = n->n_out,
                        .in = (const void *const *)in,
                        .in_type = in_type,
                        .out = out,
                        .out_type = n->out};
    double best = 1e30;
    hp_err e = {0};
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        if (be->vt->launch(be, HP_STREAM_COMPUTE, &c, &e) != HP_OK) die("launch", &e);
        double dt = now_s() - t0;
        if (r > 0 && dt < best) best = dt; /* launch 0 warms caches, threads, tables */
    }
    return best;
}

/* ---- mm ------------------------------------------------------------------------------------- */

static void naive_mm(float *y, const float *a, const float *b, int64_t m, int64_t k, int64_t n) {
    for (int64_t i = 0; i < m; i++) {
        float *yi = y + i * n;
        for (int64_t j = 0; j < n; j++) yi[j] = 0;
        for (int64_t p = 0; p < k; p++) {
            float aip = a[i * k + p];
            const float *bp = b + p * n;
            for (int64_t j = 0; j < n; j++) yi[j] += aip * bp[j];
        }
    }
}

/* The time of one mm launch on [m, k] x [k, n] operands of dtype dt. */
static double time_mm(hp_backend *be, hp_dtype dt, void *da, void *db, void *dy, int64_t m,
                      int64_t k, int64_t n, int reps) {
    hp_graph *g = hp_graph_new();
    hp_type at = hp_type_make(dt, 2, (int64_t[]){m, k});
    hp_type bt = hp_type_make(dt, 2, (int64_t[]){k, n});
    hp_value a = hp_build_placeholder(g, HP_INPUT_DATA, NULL, at, NULL);
    hp_value b = hp_build_placeholder(g, HP_INPUT_DATA, NULL, bt, NULL);
    hp_value y = hp_mm(g, a, b);
    if (hp_graph_failed(g)) die("graph", &g->err);
    void *in[2] = {da, db}, *out[1] = {dy};
    hp_type types[2] = {at, bt};
    double t = time_launch(be, g, y.node, in, types, out, reps);
    hp_graph_free(g);
    return t;
}

/* bf16 (the top half of each f32: the values themselves do not matter for timing) */
static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) die("malloc", NULL);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        h[i] = (uint16_t)(u >> 16);
    }
    return h;
}

/* f32 and bf16 storage (f32 staging + the same sgemm) against naive loops. */
static void bench_mm(hp_backend *be, int64_t m, int64_t k, int64_t n, int reps) {
    float *da = rand_buf(m * k, 1), *db = rand_buf(k * n, 2), *dy = malloc((size_t)(m * n) * 4);
    double t = time_mm(be, HP_F32, da, db, dy, m, k, n, reps);
    uint16_t *ha = to_bf16(da, m * k), *hb = to_bf16(db, k * n);
    double th = time_mm(be, HP_BF16, ha, hb, dy, m, k, n, reps);
    double t0 = now_s();
    naive_mm(dy, da, db, m, k, n);
    double tn = now_s() - t0;
    double flops = 2.0 * (double)m * (double)n * (double)k;
    printf("mm %5lldx%5lldx%5lld          %9.2f GFLOP/s   naive %7.2f GFLOP/s   x%.1f   "
           "bf16 %7.2f GFLOP/s (x%.2f of f32)\n",
           (long long)m, (long long)k, (long long)n, flops / t * 1e-9, flops / tn * 1e-9, tn / t,
           flops / th * 1e-9, t / th);
    free(da), free(db), free(dy), free(ha), free(hb);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct acfg {
    int64_t b, h, hkv, t, s, d;
    bool causal;
} acfg;

static double pairs(const acfg *c) {
    double p = 0;
    for (int64_t t = 0; t < c->t; t++) p += c->causal ? (t + 1 < c->s ? t + 1 : c->s) : c->s;
    return p * (double)(c->b * c->h);
}

/* Textbook attention forward, one score row per query; returns lse into lse. */
static void naive_fwd(const acfg *c, const float *q, const float *k, const float *v, float *o,
                      float *lse, float *row) {
    float scale = 1.0f / sqrtf((float)c->d);
    int64_t g = c->h / c->hkv;
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t t = 0; t < c->t; t++) {
                const float *qr = q + ((b * c->h + h) * c->t + t) * c->d;
                const float *kb = k + (b * c->hkv + h / g) * c->s * c->d;
                const float *vb = v + (b * c->hkv + h / g) * c->s * c->d;
                int64_t keys = c->causal ? (t + 1 < c->s ? t + 1 : c->s) : c->s;
                float m = -INFINITY, sum = 0;
                for (int64_t s = 0; s < keys; s++) {
                    float acc = 0;
                    for (int64_t x = 0; x < c->d; x++) acc += qr[x] * kb[s * c->d + x];
                    row[s] = acc * scale;
                    m = row[s] > m ? row[s] : m;
                }
                for (int64_t s = 0; s < keys; s++) sum += row[s] = expf(row[s] - m);
                float *orow = o + ((b * c->h + h) * c->t + t) * c->d;
                for (int64_t x = 0; x < c->d; x++) orow[x] = 0;
                for (int64_t s = 0; s < keys; s++)
                    for (int64_t x = 0; x < c->d; x++) orow[x] += row[s] / sum * vb[s * c->d + x];
                lse[(b * c->h + h) * c->t + t] = m + logf(sum);
            }
}

/* Textbook backward, one row of P and dP per query. */
static void naive_bwd(const acfg *c, const float *go, const float *q, const float *k,
                      const float *v, const float *o, const float *lse, float *gq, float *gk,
                      float *gv, float *p, float *dp) {
    float scale = 1.0f / sqrtf((float)c->d);
    int64_t g = c->h / c->hkv, d = c->d;
    memset(gq, 0, (size_t)(c->b * c->h * c->t * d) * 4);
    memset(gk, 0, (size_t)(c->b * c->hkv * c->s * d) * 4);
    memset(gv, 0, (size_t)(c->b * c->hkv * c->s * d) * 4);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t t = 0; t < c->t; t++) {
                int64_t row = (b * c->h + h) * c->t + t, kv = (b * c->hkv + h / g) * c->s;
                const float *qr = q + row * d, *gr = go + row * d, *orow = o + row * d;
                int64_t keys = c->causal ? (t + 1 < c->s ? t + 1 : c->s) : c->s;
                float delta = 0;
                for (int64_t x = 0; x < d; x++) delta += gr[x] * orow[x];
                for (int64_t s = 0; s < keys; s++) {
                    float sc = 0, dd = 0;
                    for (int64_t x = 0; x < d; x++) {
                        sc += qr[x] * k[(kv + s) * d + x];
                        dd += gr[x] * v[(kv + s) * d + x];
                    }
                    p[s] = expf(sc * scale - lse[row]);
                    dp[s] = p[s] * (dd - delta) * scale;
                }
                for (int64_t s = 0; s < keys; s++)
                    for (int64_t x = 0; x < d; x++) {
                        gq[row * d + x] += dp[s] * k[(kv + s) * d + x];
                        gk[(kv + s) * d + x] += dp[s] * qr[x];
                        gv[(kv + s) * d + x] += p[s] * gr[x];
                    }
            }
}

static void bench_attention(hp_backend *be, const acfg *c, int reps) {
    hp_graph *g = hp_graph_new();
    hp_type qt = hp_type_make(HP_F32, 4, (int64_t[]){c->b, c->h, c->t, c->d});
    hp_type kt = hp_type_make(HP_F32, 4, (int64_t[]){c->b, c->hkv, c->s, c->d});
    hp_type lt = hp_type_make(HP_F32, 3, (int64_t[]){c->b, c->h, c->t});
    hp_value go = hp_build_placeholder(g, HP_INPUT_DATA, NULL, qt, NULL);
    hp_value q = hp_build_placeholder(g, HP_INPUT_DATA, NULL, qt, NULL);
    hp_value k = hp_build_placeholder(g, HP_INPUT_DATA, NULL, kt, NULL);
    hp_value v = hp_build_placeholder(g, HP_INPUT_DATA, NULL, kt, NULL);
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 1.0 / sqrt((double)c->d)),
                    hp_attr_int(HP_ATTR_CAUSAL, c->causal)};
    hp_value o = hp_build(g, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, 2);
    hp_value gb =
        hp_build(g, HP_OP_SDPA_BACKWARD, (hp_value[]){go, q, k, v, o, hp_out(o, 1)}, 6, a, 2);
    if (hp_graph_failed(g)) die("graph", &g->err);
    int64_t nq = hp_type_numel(&qt), nk = hp_type_numel(&kt), nl = hp_type_numel(&lt);
    float *dgo = rand_buf(nq, 3), *dq = rand_buf(nq, 4), *dk = rand_buf(nk, 5),
          *dv = rand_buf(nk, 6);
    float *dout = malloc((size_t)nq * 4), *dlse = malloc((size_t)nl * 4);
    float *gq = malloc((size_t)nq * 4), *gk = malloc((size_t)nk * 4), *gv = malloc((size_t)nk * 4);
    float *row = malloc((size_t)(c->s + 1) * 4), *row2 = malloc((size_t)(c->s + 1) * 4);
    void *fin[3] = {dq, dk, dv}, *fout[2] = {dout, dlse};
    hp_type ft[3] = {qt, kt, kt};
    double tf = time_launch(be, g, o.node, fin, ft, fout, reps);
    void *bin[6] = {dgo, dq, dk, dv, dout, dlse}, *bout[3] = {gq, gk, gv};
    hp_type bt[6] = {qt, qt, kt, kt, qt, lt};
    double tb = time_launch(be, g, gb.node, bin, bt, bout, reps);
    double t0 = now_s();
    naive_fwd(c, dq, dk, dv, dout, dlse, row);
    double tnf = now_s() - t0;
    t0 = now_s();
    naive_bwd(c, dgo, dq, dk, dv, dout, dlse, gq, gk, gv, row, row2);
    double tnb = now_s() - t0;
    double pf = 4.0 * (double)c->d * pairs(c), pb = 10.0 * (double)c->d * pairs(c);
    char name[96];
    snprintf(name, sizeof name, "B%lld H%lld/%lld T%lld S%lld D%lld%s", (long long)c->b,
             (long long)c->h, (long long)c->hkv, (long long)c->t, (long long)c->s, (long long)c->d,
             c->causal ? " causal" : "");
    printf("attn fwd %-30s %7.2f GFLOP/s   naive %7.2f GFLOP/s   x%.1f\n", name, pf / tf * 1e-9,
           pf / tnf * 1e-9, tnf / tf);
    printf("attn bwd %-30s %7.2f GFLOP/s   naive %7.2f GFLOP/s   x%.1f\n", name, pb / tb * 1e-9,
           pb / tnb * 1e-9, tnb / tb);
    free(dgo), free(dq), free(dk), free(dv), free(dout), free(dlse);
    free(gq), free(gk), free(gv), free(row), free(row2);
    hp_graph_free(g);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1) reps = 1;
    hp_backend *be = NULL;
    hp_err e = {0};
    if (hp_cpu_backend_new(threads, &be, &e) != HP_OK) die("backend", &e);
    hp_device_info info;
    be->vt->info(be, &info, NULL);
    printf("%s; naive = one thread, plain loops\n", info.name);
    bench_mm(be, 256, 256, 256, reps);
    bench_mm(be, 512, 512, 512, reps);
    bench_mm(be, 2048, 256, 768, reps); /* debugmodel FFN: [B·T, dim] x [dim, ffn] */
    bench_mm(be, 1024, 1024, 1024, reps);
    static const acfg attn[] = {
        {4, 16, 16, 256, 256, 16, true}, /* debugmodel: dim 256, 16 heads */
        {1, 8, 8, 1024, 1024, 64, true},
        {1, 8, 2, 512, 512, 128, true},
        {1, 8, 8, 512, 512, 64, false},
    };
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) bench_attention(be, &attn[i], reps);
    hp_backend_free(be);
    return 0;
}
