/* bench/bench_comm_shm.c — bandwidth of the shm communicator next to a plain memcpy of the
 * same bytes measured in the same run.
 *
 * Part 1, world 2 (this process and a forked child). For a size S: all_gather gathers S bytes
 * in all (each rank sends S/2), reduce_scatter and all_reduce reduce S bytes of f32 (sum),
 * all_to_all exchanges S bytes per rank (S/2 to each). GB/s = S / time per call (nccl-tests'
 * "algbw"); the last columns are each collective / memcpy. A collective moves more than S
 * through memory (copy into the slot, copy or reduce out of every slot), so its ceiling is
 * below memcpy.
 *
 * Part 2, world 4 as a (dp=2, tp=2) mesh: all_reduce of S bytes on the world communicator,
 * then on the tp groups and on the dp groups (split; both groups of a dimension at once, as
 * in a training step), and the ratio group / world. A group's all_reduce touches half the
 * ranks' slots, so it should be faster than the world's; on a host with fewer than 4 free
 * cores the ranks share cores and every figure drops.
 *
 * Usage: bench_comm_shm [slot_bytes]   (default: the communicator's own choice)
 */
#define _GNU_SOURCE
#include "hp/comm.h"
#include "worker/comm/shm_internal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)64 << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(int rank, const char *what, const hp_err *e) {
    fprintf(stderr, "bench_comm_shm: rank %d: %s: %s\n", rank, what, e ? e->msg : "failed");
    exit(1);
}

/* Calls per measurement: about 256 MB moved, at least 3, at most 20000 (both ranks agree). */
static int iters_for(size_t bytes) {
    size_t n = ((size_t)256 << 20) / (bytes ? bytes : 1);
    return n < 3 ? 3 : n > 20000 ? 20000 : (int)n;
}

typedef enum { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL } coll;

static double time_coll(hp_comm *c, coll k, size_t bytes, void *send, void *recv) {
    hp_err e = {0};
    int iters = iters_for(bytes);
    int64_t count = (int64_t)(bytes / sizeof(float));
    size_t part = bytes / (size_t)c->world;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) { /* best of 3, each after a barrier */
        if (c->vt->barrier(c, &e) != HP_OK) die(c->rank, "barrier", &e);
        double t0 = now_s();
        for (int i = 0; i < iters; i++) {
            hp_status s = HP_OK;
            switch (k) {
            case ALL_GATHER:
                s = c->vt->all_gather(c, send, recv, part, &e);
                break;
            case REDUCE_SCATTER:
                s = c->vt->reduce_scatter(c, send, recv, count / c->world, HP_COMM_F32,
                                          HP_REDUCE_SUM, &e);
                break;
            case ALL_REDUCE:
                s = c->vt->all_reduce(c, send, recv, count, HP_COMM_F32, HP_REDUCE_SUM, &e);
                break;
            case ALL_TO_ALL:
                s = c->vt->all_to_all(c, send, recv, part, &e);
                break;
            }
            if (s != HP_OK) die(c->rank, "collective", &e);
        }
        double dt = (now_s() - t0) / iters;
        if (dt < best) best = dt;
    }
    return best;
}

static double time_memcpy(size_t bytes, void *dst, const void *src) {
    int iters = iters_for(bytes);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        for (int i = 0; i < iters; i++) {
            memcpy(dst, src, bytes);
            __asm__ __volatile__("" : : "r"(dst) : "memory"); /* keep every copy */
        }
        double dt = (now_s() - t0) / iters;
        if (dt < best) best = dt;
    }
    return best;
}

static float *filled(void) {
    float *p = malloc(MAX_BYTES);
    if (!p) return NULL;
    for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++) p[i] = (float)(i % 1000) * 0.5f;
    return p;
}

static void run(hp_comm *c) {
    float *send = filled(), *recv = filled();
    if (!send || !recv) die(c->rank, "malloc", NULL);
    hp_err e = {0};
    if (c->rank == 0) {
        printf("%10s %12s %12s %12s %12s %12s %8s %8s %8s %8s\n", "bytes", "memcpy GB/s",
               "gather GB/s", "rs GB/s", "ar GB/s", "a2a GB/s", "gather/m", "rs/m", "ar/m",
               "a2a/m");
    }
    for (size_t bytes = 1024; bytes <= MAX_BYTES; bytes *= 4) {
        double t_ag = time_coll(c, ALL_GATHER, bytes, send, recv);
        double t_rs = time_coll(c, REDUCE_SCATTER, bytes, send, recv);
        double t_ar = time_coll(c, ALL_REDUCE, bytes, send, recv);
        double t_a2a = time_coll(c, ALL_TO_ALL, bytes, send, recv);
        /* Rank 1 sleeps in the barrier while rank 0 times memcpy alone. */
        double t_mc = c->rank == 0 ? time_memcpy(bytes, recv, send) : 1;
        if (c->vt->barrier(c, &e) != HP_OK) die(c->rank, "barrier", &e);
        if (c->rank == 0) {
            double gb = (double)bytes / 1e9;
            printf("%10zu %12.2f %12.2f %12.2f %12.2f %12.2f %8.2f %8.2f %8.2f %8.2f\n", bytes,
                   gb / t_mc, gb / t_ag, gb / t_rs, gb / t_ar, gb / t_a2a, t_mc / t_ag, t_mc / t_rs,
                   t_mc / t_ar, t_mc / t_a2a);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
}

/* World 4 as (dp=2, tp=2): all_reduce on the world, the tp groups and the dp groups. */
static void run_mesh(hp_comm *c) {
    hp_comm *tp = NULL, *dp = NULL;
    hp_err e = {0};
    if (c->vt->split(c, c->rank / 2, c->rank, &tp, &e) != HP_OK) die(c->rank, "split tp", &e);
    if (c->vt->split(c, c->rank % 2, c->rank, &dp, &e) != HP_OK) die(c->rank, "split dp", &e);
    float *send = filled(), *recv = filled();
    if (!send || !recv) die(c->rank, "malloc", NULL);
    if (c->rank == 0) {
        printf("\nshm world 4 as (dp=2, tp=2): all_reduce of f32 (sum)\n");
        printf("%10s %12s %12s %12s %8s %8s\n", "bytes", "world GB/s", "tp GB/s", "dp GB/s",
               "tp/world", "dp/world");
    }
    for (size_t bytes = 4096; bytes <= MAX_BYTES / 4; bytes *= 4) {
        double t_w = time_coll(c, ALL_REDUCE, bytes, send, recv);
        double t_tp = time_coll(tp, ALL_REDUCE, bytes, send, recv);
        double t_dp = time_coll(dp, ALL_REDUCE, bytes, send, recv);
        if (c->vt->barrier(c, &e) != HP_OK) die(c->rank, "barrier", &e);
        if (c->rank == 0) {
            double gb = (double)bytes / 1e9;
            printf("%10zu %12.2f %12.2f %12.2f %8.2f %8.2f\n", bytes, gb / t_w, gb / t_tp,
                   gb / t_dp, t_w / t_tp, t_w / t_dp);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    hp_comm_free(tp);
    hp_comm_free(dp);
}

/* Forks world - 1 children; every rank joins "<base>-w<world>" and runs fn. Returns 0 when
 * every child succeeded (children never return). */
static int run_world(const char *base, int world, size_t slot, void (*fn)(hp_comm *)) {
    char name[64];
    snprintf(name, sizeof name, "%s-w%d", base, world);
    fflush(stdout);
    pid_t kids[8];
    int rank = 0;
    for (int r = 1; r < world; r++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            rank = r;
            break;
        }
        kids[r] = p;
    }
    hp_comm *c = NULL;
    hp_err e = {0};
    if (hp__shm_comm_new_ex(name, rank, world, 60, slot, &c, &e) != HP_OK) die(rank, "join", &e);
    if (rank == 0 && world == 2) {
        hp__shm_comm *sc = (hp__shm_comm *)c;
        printf("shm world 2, slot %zu bytes per rank (steps of %zu)\n", sc->slot_bytes, sc->half);
    }
    fn(c);
    hp_comm_free(c);
    if (rank != 0) _exit(0);
    int bad = 0;
    for (int r = 1; r < world; r++) {
        int ws = 0;
        waitpid(kids[r], &ws, 0);
        bad |= !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    return bad;
}

int main(int argc, char **argv) {
    size_t slot = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : 0;
    char base[48];
    snprintf(base, sizeof base, "bench-%d", (int)getpid());
    if (run_world(base, 2, slot, run) != 0) return 1;
    return run_world(base, 4, slot, run_mesh);
}
