/* worker/probe.c — `hp-worker --probe-profile`: measures this machine's cpu device profile for
 * the cost model (hp/autoshard.h) and caches it where `hpctl plan` and hpd read it:
 *   * peak: hp_cpu_peak_flops with the run's threads (the kernels' own GEMM path);
 *   * memory bandwidth: bytes read + written per second by memcpy of 64 MiB, best of runs;
 *   * link: the shm communicator between two ranks (two threads of this process), an f32
 *     all-reduce of 8 MiB for the bandwidth (hp_collective_bytes' convention: 2(N-1)/N of the
 *     tensor) and of one element for the latency, best of runs;
 *   * kernel: a fixed cost per instruction, assumed 5 us (not measured).
 * Prints the figures; exit 0, or 1 with the reason.
 */
#include "worker/probe.h"

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
    p.kernel_s = 5e-6;
    p.measured = true;
    if (hp_cpu_profile_store(&p, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: probe: %s\n", err.msg);
        return 1;
    }
    if (!quiet)
        printf("cpu profile (%d threads): peak %.4g FLOP/s, memory %.4g B/s, shm link %.4g B/s, "
               "latency %.3g us, kernel %.3g us (cached for hpctl plan and hpd)\n",
               threads, p.peak_flops, p.mem_bw, p.intra.bandwidth, p.intra.latency * 1e6,
               p.kernel_s * 1e6);
    return 0;
}
