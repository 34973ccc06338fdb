/* bench/bench_comm_tcp.c — bus bandwidth of the tcp communicator (over 127.0.0.1) next to the
 * shm communicator, measured in the same run by the same ranks.
 *
 * World N (default 2; this process and N-1 forked children), each rank joined to both a shm
 * and a tcp communicator. For a size S: all_reduce of S bytes of f32 (sum) and all_gather of
 * S bytes in all (S/N per rank). Columns: time per call, algbw = S / time, busbw as
 * nccl-tests defines it (all_reduce algbw * 2(N-1)/N, all_gather algbw * (N-1)/N: what each
 * rank's link carries), and tcp / shm. Loopback TCP copies every byte through the kernel
 * twice (send, receive), shm once or twice through the slot, so tcp's ceiling is below shm's
 * on one host; across hosts the NIC bounds it instead.
 *
 * Usage: bench_comm_tcp [world]
 */
#define _GNU_SOURCE
#include "hp/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)64 << 20)
#define SECRET    "bench-secret-0123456789abcdef"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(int rank, const char *what, const hp_err *e) {
    fprintf(stderr, "bench_comm_tcp: rank %d: %s: %s\n", rank, what, e ? e->msg : "failed");
    exit(1);
}

/* Calls per measurement: about 128 MB moved, at least 3, at most 5000 (every rank agrees). */
static int iters_for(size_t bytes) {
    size_t n = ((size_t)128 << 20) / (bytes ? bytes : 1);
    return n < 3 ? 3 : n > 5000 ? 5000 : (int)n;
}

/* Best of 3 of the mean time per call; all_gather when gather, else all_reduce. */
static double time_coll(hp_comm *c, int gather, size_t bytes, float *send, float *recv) {
    hp_err e = {0};
    int iters = iters_for(bytes);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        if (c->vt->barrier(c, &e) != HP_OK) die(c->rank, "barrier", &e);
        double t0 = now_s();
        for (int i = 0; i < iters; i++) {
            hp_status st = gather
                               ? c->vt->all_gather(c, send, recv, bytes / (size_t)c->world, &e)
                               : c->vt->all_reduce(c, send, recv, (int64_t)(bytes / sizeof(float)),
                                                   HP_COMM_F32, HP_REDUCE_SUM, &e);
            if (st != HP_OK) die(c->rank, gather ? "all_gather" : "all_reduce", &e);
        }
        double t = (now_s() - t0) / iters;
        if (t < best) best = t;
    }
    return best;
}

typedef struct publish_pipe {
    int fds[2];
    int world;
} publish_pipe;

/* Rank 0's address goes to the children through a pipe (one line per child). */
static hp_status publish(const char *addr, void *ctx, hp_err *err) {
    publish_pipe *p = ctx;
    char line[128];
    int n = snprintf(line, sizeof line, "%-127s", addr);
    for (int r = 1; r < p->world; r++)
        if (write(p->fds[1], line, (size_t)n) != n)
            return hp_errf(err, HP_IO, "bench: writing the address failed");
    return HP_OK;
}

static void rank_main(int rank, int world, publish_pipe *pp, const char *shm_name) {
    hp_err e = {0};
    hp_comm *shm = NULL, *tcp = NULL;
    if (hp_shm_comm_new(shm_name, rank, world, 30, &shm, &e) != HP_OK) die(rank, "shm join", &e);
    char addr[128] = "";
    if (rank > 0) {
        if (read(pp->fds[0], addr, 127) != 127) die(rank, "reading rank 0's address", NULL);
        addr[127] = '\0';
        for (int i = 126; i >= 0 && addr[i] == ' '; i--) addr[i] = '\0';
    }
    hp_tcp_opts o = {.rank = rank,
                     .world = world,
                     .timeout_s = 60,
                     .secret = SECRET,
                     .addr = addr,
                     .publish = publish,
                     .publish_ctx = pp};
    if (hp_tcp_comm_new(&o, &tcp, &e) != HP_OK) die(rank, "tcp join", &e);
    float *send = malloc(MAX_BYTES), *recv = malloc(MAX_BYTES);
    if (!send || !recv) die(rank, "out of memory", NULL);
    for (size_t i = 0; i < MAX_BYTES / sizeof(float); i++) send[i] = (float)(i % 1000) * 0.5f;
    static const size_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    if (rank == 0) {
        printf("world %d, 127.0.0.1; busbw as nccl-tests (all_reduce 2(N-1)/N, all_gather "
               "(N-1)/N)\n",
               world);
        printf("%-10s %10s | %10s %9s %9s | %10s %9s %9s | %7s\n", "collective", "bytes", "shm us",
               "algbw", "busbw", "tcp us", "algbw", "busbw", "tcp/shm");
    }
    for (int gather = 0; gather < 2; gather++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t s = sizes[k];
            double ts = time_coll(shm, gather, s, send, recv);
            double tt = time_coll(tcp, gather, s, send, recv);
            double f = gather ? (double)(world - 1) / world : 2.0 * (world - 1) / world;
            if (rank == 0) {
                printf("%-10s %10zu | %10.1f %8.2fG %8.2fG | %10.1f %8.2fG %8.2fG | %7.2f\n",
                       gather ? "all_gather" : "all_reduce", s, ts * 1e6, s / ts / 1e9,
                       s / ts / 1e9 * f, tt * 1e6, s / tt / 1e9, s / tt / 1e9 * f, ts / tt);
                fflush(stdout);
            }
        }
    }
    free(send);
    free(recv);
    hp_comm_free(tcp);
    hp_comm_free(shm);
}

int main(int argc, char **argv) {
    int world = argc > 1 ? atoi(argv[1]) : 2;
    if (world < 2 || world > 16) {
        fprintf(stderr, "usage: bench_comm_tcp [world in 2..16]\n");
        return 2;
    }
    publish_pipe pp = {.world = world};
    if (pipe(pp.fds) != 0) return 1;
    char shm_name[64];
    snprintf(shm_name, sizeof shm_name, "bench-tcp-%d", (int)getpid());
    pid_t kids[16];
    for (int r = 1; r < world; r++) {
        kids[r] = fork();
        if (kids[r] < 0) return 1;
        if (kids[r] == 0) {
            rank_main(r, world, &pp, shm_name);
            _exit(0);
        }
    }
    rank_main(0, world, &pp, shm_name);
    int rc = 0;
    for (int r = 1; r < world; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
    }
    return rc;
}
