/* worker/probe.c — `hp-worker --probe-profile`: measures this machine's cpu device profile for
 * the cost model (hp/autoshard.h) and caches it where `hpctl plan` and hpd read it:
 *   * peak: hp_cpu_peak_flops with the run's threads (the kernels' own GEMM path);
 *   * memory bandwidth: bytes read + written per second by memcpy of 64 MiB, best of runs;
 *   * link: the shm communicator between two ranks (two threads of this process), an f32
 *     all-reduce of 8 MiB for the bandwidth (hp_collective_bytes' convention: 2(N-1)/N of the
 *     tensor) and of one element for the latency, best of runs;
 *   * kernel: the fixed cost of one instruction, the time of dispatching a kernel of no work to
 *     the run's compute threads (hp_pool_parallel_for, as every cpu kernel does), mean of
 *     many, best of runs;
 *   * oversubscribed latency: what a collective costs when more ranks than CPUs share the
 *     host (spinning is off then: a waiting rank sleeps on the futex, and a woken one waits for
 *     a CPU the others compute on). 2 x CPUs ranks (threads of this process) each compute a
 *     fixed burst and then all-reduce one element, 100 rounds; the excess of a round over the
 *     bursts' CPU time shared over the CPUs is the latency. Best of runs (other processes'
 *     load only raises it);
 *   * attention: the cpu backend's fused causal attention, forward then backward, on
 *     [1, 8, 512, D] at D = 16, 32, 64, 128: the FLOPs of the pairs the mask leaves (12 B H D
 *     T (T + 1) / 2) over the wall time, best of 7 runs (the least disturbed), as a fraction
 *     of the peak;
 *   * efficiency: a 512 x 512 x 512 mm on the cpu backend, best of 11 runs' wall time, as a
 *     fraction of the peak (at most 1: a large GEMM on the same path sets the peak).
 * Prints the figures; exit 0, or 1 with the reason.
 */
#include "worker/probe.h"

#include "worker/backend.h"
#include "worker/cpu/cpu_backend.h"

#include "hp/autoshard.h"
#include "hp/comm.h"
#include "hp/metrics.h"
#include "hp/threads.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double memcpy_bw(void) {
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = INFINITY;
    for (int r = 0; r < 6; r++) {
        double t0 = now_s();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, n);
        best = fmin(best, now_s() - t0);
    }
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return 2.0 * (double)n / best;
}

typedef struct link_probe {
    char name[64];
    int rank;
    double bw, lat;
    hp_status st;
    hp_err err;
} link_probe;

static void *link_thread(void *arg) {
    link_probe *p = arg;
    hp_comm *c = NULL;
    p->st = hp_shm_comm_new(p->name, p->rank, 2, 30, &c, &p->err);
    if (p->st != HP_OK) return NULL;
    int64_t big = (int64_t)2 << 20; /* 8 MiB of f32 */
    float *buf = calloc((size_t)big, sizeof *buf);
    if (!buf) {
        p->st = hp_errf(&p->err, HP_NOMEM, "out of memory");
        hp_comm_free(c);
        return NULL;
    }
    double best_big = INFINITY, best_small = INFINITY;
    for (int r = 0; r < 8 && p->st == HP_OK; r++) {
        double t0 = now_s();
        p->st = c->vt->all_reduce(c, buf, buf, big, HP_COMM_F32, HP_REDUCE_SUM, &p->err);
        best_big = fmin(best_big, now_s() - t0);
    }
    for (int r = 0; r < 200 && p->st == HP_OK; r++) {
        double t0 = now_s();
        p->st = c->vt->all_reduce(c, buf, buf, 1, HP_COMM_F32, HP_REDUCE_SUM, &p->err);
        best_small = fmin(best_small, now_s() - t0);
    }
    /* all-reduce of N = 2 moves 2(N-1)/N = 1 times the tensor per rank */
    p->bw = (double)big * sizeof(float) / fmax(best_big - best_small, 1e-9);
    p->lat = best_small;
    free(buf);
    hp_comm_free(c);
    return NULL;
}

/* ---- a collective's latency on an oversubscribed host --------------------------------- */

#define OVERSUB_ROUNDS 100

typedef struct oversub_rank {
    const char *name;
    int rank, world;
    int64_t burst; /* iterations of spin_work per round */
    double elapsed;
    hp_status st;
    hp_err err;
} oversub_rank;

static volatile double spin_sink;

static void spin_work(int64_t n) {
    double x = 1.0;
    for (int64_t i = 0; i < n; i++) x = x * 1.0000001 + 1e-9;
    spin_sink = x;
}

static void *oversub_thread(void *arg) {
    oversub_rank *o = arg;
    hp_comm *c = NULL;
    o->st = hp_shm_comm_new(o->name, o->rank, o->world, 30, &c, &o->err);
    if (o->st != HP_OK) return NULL;
    float x = 1;
    o->st = c->vt->barrier(c, &o->err);
    double t0 = now_s();
    for (int r = 0; r < OVERSUB_ROUNDS && o->st == HP_OK; r++) {
        spin_work(o->burst);
        o->st = c->vt->all_reduce(c, &x, &x, 1, HP_COMM_F32, HP_REDUCE_MAX, &o->err);
    }
    o->elapsed = now_s() - t0;
    hp_comm_free(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b) { /* ascending */
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Iterations of spin_work that take about `s` seconds of one CPU's time. */
static int64_t spin_iters(double s) {
    int64_t n = 1 << 12;
    for (;;) {
        double t0 = thread_cpu_s();
        spin_work(n);
        double t = thread_cpu_s() - t0;
        if (t >= 2e-3 || n >= ((int64_t)1 << 34)) return (int64_t)((double)n * s / fmax(t, 1e-9));
        n *= 4;
    }
}

/* ---- the dispatch cost of one kernel --------------------------------------------------- */

static void spin_chunk(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    for (int64_t i = begin; i < end; i++) spin_work(*(const int64_t *)ctx);
}

/* One kernel's fixed cost: a parallel-for of one ~20 us chunk per thread, less the chunk. */
static double dispatch_s(int threads) {
    hp_pool *pool = NULL;
    hp_err err;
    if (hp_pool_new(threads, &pool, &err) != HP_OK) return NAN;
    int64_t iters = spin_iters(20e-6);
    double t0 = thread_cpu_s();
    for (int i = 0; i < 100; i++) spin_work(iters);
    double chunk = (thread_cpu_s() - t0) / 100, best = INFINITY;
    for (int r = 0; r < 5; r++) {
        double w0 = now_s();
        for (int i = 0; i < 200; i++) hp_pool_parallel_for(pool, threads, 1, spin_chunk, &iters);
        best = fmin(best, (now_s() - w0) / 200 - chunk);
    }
    hp_pool_free(pool);
    return fmax(best, 0);
}

/* The latency, or NAN with the reason in err. */
static double oversubscribed_latency(int cpus, hp_err *err) {
    int world = 2 * cpus > 8 ? 8 : 2 * cpus;
    if (world < 2) world = 2;
    int64_t burst = spin_iters(5e-4); /* about 0.5 ms of one CPU's time */
    double t0 = thread_cpu_s();
    for (int i = 0; i < 10; i++) spin_work(burst);
    double burst_s = (thread_cpu_s() - t0) / 10;
    double lat[5];
    for (int run = 0; run < 5; run++) {
        oversub_rank o[8];
        pthread_t th[8];
        char name[64];
        snprintf(name, sizeof name, "hp-probe-o-%ld-%d", (long)getpid(), run);
        int started = 0;
        for (int r = 0; r < world; r++) {
            o[r] = (oversub_rank){.name = name, .rank = r, .world = world, .burst = burst};
            if (pthread_create(&th[r], NULL, oversub_thread, &o[r]) != 0) break;
            started++;
        }
        for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
        if (started < world) {
            hp_errf(err, HP_IO, "cannot start %d threads", world);
            return NAN;
        }
        double slowest = 0;
        for (int r = 0; r < world; r++) {
            if (o[r].st != HP_OK) {
                *err = o[r].err;
                return NAN;
            }
            slowest = fmax(slowest, o[r].elapsed);
        }
        double round = slowest / OVERSUB_ROUNDS, shared = burst_s * world / cpus;
        lat[run] = fmax(round - shared, 0);
    }
    qsort(lat, 5, sizeof lat[0], cmp_double);
    return lat[0];
}

/* ---- kernels on the cpu backend, timed ------------------------------------------------- */

/* n floats of device memory, filled with a fixed pattern in [-1, 1]. */
static hp_status device_floats(hp_backend *be, size_t n, float **out, hp_err *err) {
    float *host = malloc(n * sizeof *host), *buf = NULL;
    if (!host) return hp_errf(err, HP_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) host[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-3f;
    hp_status st = be->vt->alloc(be, n * sizeof *host, (void **)&buf, err);
    if (st == HP_OK) st = be->vt->copy_in(be, buf, host, n * sizeof *host, err);
    free(host);
    if (st != HP_OK && buf) be->vt->free(be, buf);
    *out = st == HP_OK ? buf : NULL;
    return st;
}

/* The best wall time of `runs` runs of calls[0..n) (after one that warms up): the least
 * disturbed run. (Rating by the process's CPU time over the threads, as the peak is,
 * overstates a kernel when other processes keep a pool thread off its CPU and the caller runs
 * its share.) */
static hp_status best_time(hp_backend *be, const hp_kernel_call *const *calls, int n, int runs,
                           double *best, hp_err *err) {
    *best = INFINITY;
    for (int r = 0; r <= runs; r++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++) HP_TRY(be->vt->launch(be, 0, calls[i], err));
        HP_TRY(be->vt->synchronize(be, err));
        if (r > 0) *best = fmin(*best, now_s() - t0);
    }
    return HP_OK;
}

/* ---- attention's efficiency ------------------------------------------------------------ */

#define ATTN_H 8
#define ATTN_T 512

/* The fraction of `peak` the causal attention forward + backward reaches at head dim d. */
static hp_status attn_efficiency(hp_backend *be, int64_t d, double peak, double *eff, hp_err *err) {
    int64_t n = (int64_t)ATTN_H * ATTN_T * d, rows = (int64_t)ATTN_H * ATTN_T;
    hp_type qt = {.dtype = HP_F32, .rank = 4, .shape = {1, ATTN_H, ATTN_T, d}};
    hp_type lt = {.dtype = HP_F32, .rank = 3, .shape = {1, ATTN_H, ATTN_T}};
    float *buf = NULL; /* q k v out go gq gk gv lse, one allocation */
    HP_TRY(device_floats(be, (size_t)(8 * n + rows), &buf, err));
    float *q = buf, *k = q + n, *v = k + n, *o = v + n, *go = o + n, *gq = go + n, *gk = gq + n,
          *gv = gk + n, *lse = gv + n;
    hp_attr causal = {.key = HP_ATTR_CAUSAL, .kind = hp_attr_key_kind(HP_ATTR_CAUSAL), .i = 1};
    const void *fin[3] = {q, k, v}, *bin[6] = {go, q, k, v, o, lse};
    void *fout[2] = {o, lse}, *bout[3] = {gq, gk, gv};
    hp_type fin_t[3] = {qt, qt, qt}, fout_t[2] = {qt, lt}, bin_t[6] = {qt, qt, qt, qt, qt, lt},
            bout_t[3] = {qt, qt, qt};
    hp_node fwd = {
        .op = HP_OP_SDPA, .n_in = 3, .n_out = 2, .n_attrs = 1, .out = fout_t, .attrs = &causal};
    hp_node bwd = {.op = HP_OP_SDPA_BACKWARD,
                   .n_in = 6,
                   .n_out = 3,
                   .n_attrs = 1,
                   .out = bout_t,
                   .attrs = &causal};
    hp_kernel_call fc = {.node = &fwd,
                         .n_in = 3,
                         .n_out = 2,
                         .in = fin,
                         .in_type = fin_t,
                         .out = fout,
                         .out_type = fout_t};
    hp_kernel_call bc = {.node = &bwd,
                         .n_in = 6,
                         .n_out = 3,
                         .in = bin,
                         .in_type = bin_t,
                         .out = bout,
                         .out_type = bout_t};
    const hp_kernel_call *calls[2] = {&fc, &bc};
    double best;
    hp_status st = best_time(be, calls, 2, 7, &best, err);
    be->vt->free(be, buf);
    if (st != HP_OK) return st;
    /* the pairs the causal mask leaves: T (T + 1) / 2 per head */
    double flops = 12.0 * (double)ATTN_H * ATTN_T * (ATTN_T + 1) / 2 * (double)d;
    *eff = flops / best / peak;
    return HP_OK;
}

/* ---- a medium GEMM's efficiency --------------------------------------------------------- */

#define GEMM_N 512

/* The fraction of `peak` (measured on a large GEMM) an mm of [512, 512] x [512, 512] on the
 * cpu backend reaches, best of runs (wall time). */
static hp_status gemm_efficiency(hp_backend *be, double peak, double *eff, hp_err *err) {
    size_t n = (size_t)GEMM_N * GEMM_N;
    float *buf = NULL;
    HP_TRY(device_floats(be, 3 * n, &buf, err));
    hp_type t = {.dtype = HP_F32, .rank = 2, .shape = {GEMM_N, GEMM_N}};
    hp_type in_t[2] = {t, t};
    const void *in[2] = {buf, buf + n};
    void *out[1] = {buf + 2 * n};
    hp_node mm = {.op = HP_OP_MM, .n_in = 2, .n_out = 1, .out = &t};
    hp_kernel_call call = {
        .node = &mm, .n_in = 2, .n_out = 1, .in = in, .in_type = in_t, .out = out, .out_type = &t};
    const hp_kernel_call *calls[1] = {&call};
    double best;
    hp_status st = best_time(be, calls, 1, 11, &best, err);
    be->vt->free(be, buf);
    if (st != HP_OK) return st;
    /* at most the peak: a large GEMM on the same path sets it */
    *eff = fmin(2.0 * GEMM_N * GEMM_N * GEMM_N / best / peak, 1.0);
    return HP_OK;
}

int hp__probe_profile(int threads, bool quiet) {
    if (threads <= 0) threads = hp_default_threads();
    hp_device_profile p;
    hp_err err = {0};
    if (hp_device_profile_get("cpu", 0, &p, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: %s\n", err.msg);
        return 1;
    }
    if (hp_cpu_peak_flops(threads, &p.peak_flops, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: probe: %s\n", err.msg);
        return 1;
    }
    p.mem_bw = memcpy_bw();
    link_probe lp[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&lp[r], 0, sizeof lp[r]);
        snprintf(lp[r].name, sizeof lp[r].name, "hp-probe-%ld", (long)getpid());
        lp[r].rank = r;
        if (pthread_create(&th[r], NULL, link_thread, &lp[r]) != 0) {
            fprintf(stderr, "hp-worker: probe: cannot start a thread\n");
            if (r) pthread_join(th[0], NULL);
            return 1;
        }
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        if (lp[r].st != HP_OK) {
            fprintf(stderr, "hp-worker: probe: shm link: %s\n", lp[r].err.msg);
            return 1;
        }
    p.intra = p.inter = (hp_link_class){fmin(lp[0].bw, lp[1].bw), fmax(lp[0].lat, lp[1].lat)};
    p.kernel_s = dispatch_s(threads);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p.cpus = cpus > 0 ? (int)cpus : 1;
    p.oversubscribed_latency = oversubscribed_latency(p.cpus, &err);
    if (!isfinite(p.kernel_s) || !isfinite(p.oversubscribed_latency)) {
        fprintf(stderr, "hp-worker: probe: %s\n",
                isfinite(p.kernel_s) ? err.msg : "cannot start the compute threads");
        return 1;
    }
    hp_backend *be = NULL;
    hp_status ast = hp_cpu_backend_new(threads, &be, &err);
    for (int i = 0; i < 4 && ast == HP_OK; i++)
        ast = attn_efficiency(be, (int64_t)16 << i, p.peak_flops, &p.attn_efficiency[i], &err);
    if (ast == HP_OK) ast = gemm_efficiency(be, p.peak_flops, &p.efficiency, &err);
    if (be) be->vt->destroy(be);
    if (ast != HP_OK) {
        fprintf(stderr, "hp-worker: probe: attention or GEMM: %s\n", err.msg);
        return 1;
    }
    p.measured = true;
    if (hp_cpu_profile_store(&p, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: probe: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        printf("cpu profile (%d threads): peak %.4g FLOP/s, memory %.4g B/s, shm link %.4g B/s, "
               "latency %.3g us (%.3g us with more ranks than the %d CPUs), kernel %.3g us, "
               "attention at head dim 16/32/64/128 %.0f%%/%.0f%%/%.0f%%/%.0f%% of peak, "
               "a 512^3 GEMM %.0f%% (cached for hpctl plan and hpd)\n",
               threads, p.peak_flops, p.mem_bw, p.intra.bandwidth, p.intra.latency * 1e6,
               p.oversubscribed_latency * 1e6, p.cpus, p.kernel_s * 1e6, 100 * p.attn_efficiency[0],
               100 * p.attn_efficiency[1], 100 * p.attn_efficiency[2], 100 * p.attn_efficiency[3],
               100 * p.efficiency);
    return 0;
}
