/* worker/cpu/k_matmul.c — mm, bmm and addmm on OpenBLAS's cblas_sgemm, f32 only.
 *
 * HP_CALL_TRANS_A / TRANS_B mean the lowering folded a transpose into the call: the buffer
 * holds the operand untransposed (in_type[] describes that buffer), and sgemm reads it
 * transposed.
 *
 * Results do not depend on the thread count, by construction: OpenBLAS always runs
 * single-threaded (how a threaded OpenBLAS splits a product, and whether it splits K, differs
 * between its per-core-type kernels), and a product is cut into tiles of the output whose
 * shapes are a function of (M, N) alone (tile_dims). Each tile is one single-threaded sgemm
 * over the whole K, run as one task of the backend's pool; which thread runs a tile changes
 * nothing in its bits. A bmm's tasks are (batch entry, tile) pairs.
 *
 * Also the CPU peak probe (hp__cpu_gemm_probe): the same tiles on the same pool, so the peak
 * MFU is measured against is the rate of the path the kernels run.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "worker/cpu/cpu_internal.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <time.h>

void hp__cpu_blas_single_threaded(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* The logical product [M, K] x [K, N] of a call's operands a = in[ia], b = in[ia + 1], given
 * the output type; checks every dim against the buffers' types. */
typedef struct gemm_dims {
    int64_t batch, m, n, k;
    bool ta, tb;
} gemm_dims;

static hp_status gemm_check(const hp_kernel_call *c, int ia, int rank, gemm_dims *g, hp_err *err) {
    HP_TRY(hp__cpu_dtype(c, 0, ia, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, ia + 1, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *a = &c->in_type[ia], *b = &c->in_type[ia + 1], *o = &c->out_type[0];
    g->ta = c->flags & HP_CALL_TRANS_A;
    g->tb = c->flags & HP_CALL_TRANS_B;
    if (a->rank != rank || b->rank != rank || o->rank != rank)
        return hp_errf(err, HP_INVALID, "operands must have rank %d", rank);
    int r = rank - 2;
    int64_t am = a->shape[r + g->ta], ak = a->shape[r + !g->ta];
    int64_t bk = b->shape[r + g->tb], bn = b->shape[r + !g->tb];
    g->batch = rank == 3 ? o->shape[0] : 1;
    g->m = o->shape[r];
    g->n = o->shape[r + 1];
    g->k = ak;
    bool ok = am == g->m && bn == g->n && bk == ak;
    if (rank == 3) ok = ok && a->shape[0] == g->batch && b->shape[0] == g->batch;
    /* cblas takes int dims */
    ok = ok && g->m <= INT32_MAX && g->n <= INT32_MAX && g->k <= INT32_MAX;
    if (!ok) {
        char x[128], y[128], z[128];
        return hp_errf(err, HP_INVALID, "%s%s x %s%s does not give %s", hp_type_str(a, x, sizeof x),
                       g->ta ? "^T" : "", hp_type_str(b, y, sizeof y), g->tb ? "^T" : "",
                       hp_type_str(o, z, sizeof z));
    }
    return HP_OK;
}

/* Output tiles: row panels of about an eighth of M (at least 128 rows, a multiple of
 * OpenBLAS's x86-64 micro-tile height 16, so edges stay off the hot kernel) across the whole
 * width up to 2048 columns. Each tile is one sgemm call that packs its own panels of A and B,
 * so fewer, larger tiles pack less: wide row panels pack A once and B once per panel (about
 * 1.3x the rate of 32 small tiles on 256..4096-wide products), and 8 of them still balance
 * over the pool's claiming. Depends on M and N only. */
#define TILE_ROUND   16
#define TILE_M_PARTS 8
#define TILE_M_MIN   128
#define TILE_M_MAX   1024
#define TILE_N_MAX   2048

static int64_t tile_len(int64_t dim, int64_t parts, int64_t lo, int64_t hi) {
    int64_t t = (dim + parts - 1) / parts;
    t = (t + TILE_ROUND - 1) / TILE_ROUND * TILE_ROUND;
    return t < lo ? lo : t > hi ? hi : t;
}

typedef struct gemm_task {
    const gemm_dims *g;
    const float *a, *b;
    float *y;
    float alpha, beta;
    const float *bias;        /* addmm: y's tile starts as bias (then sgemm scales it by beta) */
    int64_t bias_st[2];       /* bias's element strides along y's rows and columns (0: broadcast) */
    int64_t tm, tn;           /* tile dims */
    int64_t tiles_m, tiles_n; /* tiles per batch entry: tiles_m x tiles_n */
} gemm_task;

static void gemm_tiling(gemm_task *t) {
    const gemm_dims *g = t->g;
    t->tm = tile_len(g->m, TILE_M_PARTS, TILE_M_MIN, TILE_M_MAX);
    t->tn = tile_len(g->n, 1, 1, TILE_N_MAX);
    t->tiles_m = (g->m + t->tm - 1) / t->tm;
    t->tiles_n = (g->n + t->tn - 1) / t->tn;
}

/* One tile: rows [m0, m0 + mt) x columns [n0, n0 + nt) of one batch entry's y, from the
 * matching rows of op(a) and columns of op(b) over all of K. */
static void gemm_tile(void *ctx, int64_t task, int thread) {
    (void)thread;
    const gemm_task *t = ctx;
    const gemm_dims *g = t->g;
    int64_t per = t->tiles_m * t->tiles_n, i = task / per, r = task % per;
    int64_t m0 = r / t->tiles_n * t->tm, n0 = r % t->tiles_n * t->tn;
    int64_t mt = g->m - m0 < t->tm ? g->m - m0 : t->tm;
    int64_t nt = g->n - n0 < t->tn ? g->n - n0 : t->tn;
    const float *a = t->a + i * g->m * g->k, *b = t->b + i * g->k * g->n;
    float *y = t->y + i * g->m * g->n + m0 * g->n + n0;
    /* op(a) rows m0..: a is [M, K] (rows) or [K, M] (columns); op(b) columns n0..: b is
     * [K, N] (columns) or [N, K] (rows). Leading dims stay those of the whole operands. */
    if (t->bias) { /* the bias rows of this tile, while they are about to be used */
        const float *bs = t->bias + m0 * t->bias_st[0] + n0 * t->bias_st[1];
        for (int64_t r = 0; r < mt; r++) {
            const float *br = bs + r * t->bias_st[0];
            float *yr = y + r * g->n;
            if (t->bias_st[1] == 1)
                memcpy(yr, br, (size_t)nt * sizeof *yr);
            else
                for (int64_t j = 0; j < nt; j++) yr[j] = br[j * t->bias_st[1]];
        }
    }
    const float *ap = g->ta ? a + m0 : a + m0 * g->k;
    const float *bp = g->tb ? b + n0 * g->k : b + n0;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (int)mt, (int)nt, (int)g->k, t->alpha, ap, (int)(g->ta ? g->m : g->k), bp,
                (int)(g->tb ? g->k : g->n), t->beta, y, (int)g->n);
}

/* The batched product into out (zeros when K is 0, which sgemm may not touch). */
static void gemm_run(hp__cpu *cpu, gemm_task *t) {
    const gemm_dims *g = t->g;
    float *y = t->y, beta = t->beta;
    if (g->m == 0 || g->n == 0) return;
    if (g->k == 0 && t->bias) { /* beta · bias, which sgemm is not called to form */
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++)
                y[i * g->n + j] = beta * t->bias[i * t->bias_st[0] + j * t->bias_st[1]];
        return;
    }
    if (g->k == 0) {
        if (beta == 0)
            hp__cpu_zero(cpu, y, (size_t)(g->batch * g->m * g->n) * sizeof *y);
        else
            for (int64_t i = 0; i < g->batch * g->m * g->n; i++) y[i] *= beta;
        return;
    }
    hp__cpu_blas_single_threaded();
    gemm_tiling(t);
    hp_pool_run(cpu->pool, g->batch * t->tiles_m * t->tiles_n, gemm_tile, t);
}

/* mm(a [M, K], b [K, N]) -> [M, N] */
HP__CPU_KERNEL(hp__cpu_mm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 0, 2, &g, err));
    gemm_task t = {.g = &g, .a = c->in[0], .b = c->in[1], .y = c->out[0], .alpha = 1, .beta = 0};
    gemm_run(cpu, &t);
    return HP_OK;
}

/* bmm(a [B, M, K], b [B, K, N]) -> [B, M, N] */
HP__CPU_KERNEL(hp__cpu_bmm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 0, 3, &g, err));
    gemm_task t = {.g = &g, .a = c->in[0], .b = c->in[1], .y = c->out[0], .alpha = 1, .beta = 0};
    gemm_run(cpu, &t);
    return HP_OK;
}

/* addmm(bias, a, b){beta = 1, alpha = 1} = beta · bias + alpha · (a @ b), bias broadcast to
 * [M, N]. beta = 0 ignores bias entirely (NaN in it does not propagate), as torch documents. */
HP__CPU_KERNEL(hp__cpu_addmm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 1, 2, &g, err));
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cpu_check_bcast(&c->in_type[0], o, "bias", err));
    float alpha = (float)hp_node_float(c->node, HP_ATTR_ALPHA, 1);
    float beta = (float)hp_node_float(c->node, HP_ATTR_BETA, 1);
    gemm_task t = {
        .g = &g, .a = c->in[1], .b = c->in[2], .y = c->out[0], .alpha = alpha, .beta = beta};
    if (beta != 0) { /* each tile starts from its block of the broadcast bias */
        int64_t sst[HP_MAX_RANK];
        hp__cpu_bcast_strides(&c->in_type[0], o, sst);
        t.bias = c->in[0];
        t.bias_st[0] = sst[0];
        t.bias_st[1] = sst[1];
    }
    gemm_run(cpu, &t);
    return HP_OK;
}

/* ---- the peak probe (cpu_peak.c) ------------------------------------------------------------ */

/* Product dims of the probe: square, the size of the model's larger GEMMs. */
#define PROBE_N 1024

typedef struct probe_ctx {
    gemm_task t;   /* one product's tiling */
    int64_t tiles; /* tiles per product */
    float *y;      /* [copies, N, N]: each copy of a tile writes its own output */
    double *cpu_s; /* [threads] thread CPU seconds inside tiles */
    double *flops; /* [threads] FLOPs of those tiles */
} probe_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void probe_tile(void *ctx, int64_t task, int thread) {
    probe_ctx *p = ctx;
    gemm_task t = p->t;
    const gemm_dims *g = t.g;
    t.y = p->y + task / p->tiles * g->m * g->n;
    int64_t r = task % p->tiles, m0 = r / t.tiles_n * t.tm, n0 = r % t.tiles_n * t.tn;
    int64_t mt = g->m - m0 < t.tm ? g->m - m0 : t.tm, nt = g->n - n0 < t.tn ? g->n - n0 : t.tn;
    double c0 = thread_cpu_s();
    gemm_tile(&t, r, thread);
    p->cpu_s[thread] += thread_cpu_s() - c0;
    p->flops[thread] += 2.0 * (double)mt * (double)nt * (double)g->k;
}

hp_status hp__cpu_gemm_probe(hp_pool *pool, int reps, double budget_s, double *rate, hp_err *err) {
    int threads = hp_pool_size(pool);
    gemm_dims g = {.batch = 1, .m = PROBE_N, .n = PROBE_N, .k = PROBE_N};
    probe_ctx p = {.t = {.g = &g, .alpha = 1.0f, .beta = 0.0f}};
    gemm_tiling(&p.t);
    p.tiles = p.t.tiles_m * p.t.tiles_n;
    /* at least two tiles per thread, so that every thread computes while the others do */
    int64_t copies = (2 * (int64_t)threads + p.tiles - 1) / p.tiles;
    size_t nn = (size_t)PROBE_N * PROBE_N;
    float *a = hp_malloc(nn * sizeof *a), *b = hp_malloc(nn * sizeof *b);
    p.y = hp_malloc(nn * (size_t)copies * sizeof *p.y);
    p.cpu_s = hp_calloc((size_t)threads, sizeof *p.cpu_s);
    p.flops = hp_calloc((size_t)threads, sizeof *p.flops);
    hp_status st = HP_OK;
    if (!a || !b || !p.y || !p.cpu_s || !p.flops) {
        st = hp_errf(err, HP_NOMEM, "cpu peak flops: no memory for a %dx%d SGEMM probe", PROBE_N,
                     PROBE_N);
        goto done;
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    p.t.a = a;
    p.t.b = b;
    hp__cpu_blas_single_threaded();
    /* more threads than CPUs this process may run on share them: they add no FLOP/s */
    int busy = threads;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 &&
        CPU_COUNT(&set) < busy)
        busy = CPU_COUNT(&set);
    /* Each thread's rate is its FLOPs over its own CPU time, so time the scheduler gave to
     * other processes does not count against it; the probe's figure is the best repetition's
     * mean rate per busy thread times the threads that can run at once. Repetition 0 warms caches
     * up. */
    double best = 0, start = now_s();
    for (int r = 0; r <= reps && (r < 2 || now_s() - start < budget_s); r++) {
        memset(p.cpu_s, 0, (size_t)threads * sizeof *p.cpu_s);
        memset(p.flops, 0, (size_t)threads * sizeof *p.flops);
        hp_pool_run(pool, copies * p.tiles, probe_tile, &p);
        double cpu = 0, flops = 0;
        for (int i = 0; i < threads; i++) cpu += p.cpu_s[i], flops += p.flops[i];
        double x = cpu > 0 ? (double)busy * flops / cpu : 0;
        if (r > 0 && x > best && isfinite(x)) best = x;
    }
    if (!(best > 0)) st = hp_errf(err, HP_INTERNAL, "cpu peak flops: the SGEMM probe took no time");
    *rate = best;
done:
    hp_free(a), hp_free(b), hp_free(p.y), hp_free(p.cpu_s), hp_free(p.flops);
    return st;
}
