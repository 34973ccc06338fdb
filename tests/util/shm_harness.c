/* tests/util/shm_harness.c — forked ranks, deterministic inputs and checked collectives for
 * the shm communicator's tests (see shm_harness.h). */
#define _GNU_SOURCE
#include "tests/util/shm_harness.h"

#include "worker/comm/shm_internal.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const size_t hp_sh_esz[3] = {4, 8, 8};
const char *const hp_sh_dtn[3] = {"f32", "f64", "i64"};
const char *const hp_sh_opn[3] = {"sum", "avg", "max"};

int64_t hp_sh_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

pid_t hp_sh_spawn(hp_sh_fn f, int rank, void *ctx, int *rfd) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        hp_sh_out o;
        memset(&o, 0, sizeof o);
        f(rank, ctx, &o);
        const char *b = (const char *)&o;
        size_t left = sizeof o;
        while (left > 0) {
            ssize_t n = write(p[1], b, left);
            if (n <= 0) break;
            b += n;
            left -= (size_t)n;
        }
        _exit(o.ok ? 0 : 1); /* no Criterion atexit handlers in the child */
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

/* Reads the child's record (a child that died sends none: ok = 0) and reaps it. */
void hp_sh_collect(pid_t pid, int fd, hp_sh_out *o) {
    memset(o, 0, sizeof *o);
    char *b = (char *)o;
    size_t got = 0;
    while (got < sizeof *o) {
        ssize_t n = read(fd, b + got, sizeof *o - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (got < sizeof *o) {
        memset(o, 0, sizeof *o);
        snprintf(o->msg, sizeof o->msg, "child died (wait status %#x)", ws);
    }
}

static int name_counter;

void hp_sh_fresh_name(char *buf, size_t cap) {
    snprintf(buf, cap, "t%d-%d", (int)getpid(), name_counter++);
}

int hp_sh_exists(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/hp-%s", name);
    return access(path, F_OK) == 0;
}

/* Every test ends with nothing of its own in /dev/shm. */
void hp_sh_assert_clean(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "hp-t%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        cr_expect(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "left in /dev/shm: %s",
                  e->d_name);
    }
    closedir(d);
}

void hp_sh_group_child(int rank, void *ctx, hp_sh_out *o) {
    hp_sh_group *g = ctx;
    hp_comm *c = NULL;
    hp_err e = {0};
    hp_status s = hp__shm_comm_new_ex(g->name, rank, g->world, g->timeout_s, g->slot, &c, &e);
    o->status = s;
    o->t_ns = hp_sh_now_ns();
    if (s != HP_OK) {
        snprintf(o->msg, sizeof o->msg, "%s", e.msg);
        return;
    }
    o->ok = g->body(c, rank, g->ctx, o) == 0;
    hp_comm_free(c);
}

void hp_sh_run_group(hp_sh_group *g, hp_sh_out *outs) {
    pid_t pids[HP_SH_MAX_WORLD];
    int fds[HP_SH_MAX_WORLD];
    for (int r = 0; r < g->world; r++) pids[r] = hp_sh_spawn(hp_sh_group_child, r, g, &fds[r]);
    for (int r = 0; r < g->world; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    cr_expect(!hp_sh_exists(g->name), "segment hp-%s left behind", g->name);
}

void hp_sh_group_init(hp_sh_group *g, int world, double timeout_s, size_t slot, hp_sh_body body,
                      void *ctx) {
    memset(g, 0, sizeof *g);
    hp_sh_fresh_name(g->name, sizeof g->name);
    g->world = world;
    g->timeout_s = timeout_s;
    g->slot = slot;
    g->body = body;
    g->ctx = ctx;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t key(int rank, uint64_t i, uint64_t salt) {
    return mix64((salt * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)rank << 56) ^ i);
}

/* Byte b of rank's all_gather / broadcast input: cheap (20 MB messages), and different for
 * every rank and for positions a step (a power of two) apart. */
uint8_t hp_sh_gbyte(int rank, size_t b, uint64_t salt) {
    uint32_t x = (uint32_t)b * 2654435761u ^ (uint32_t)(b >> 12) * 40503u;
    return (uint8_t)((x >> 13) ^ (x >> 24) ^ (uint32_t)(rank * 37) ^ (uint32_t)(salt * 11));
}

/* Element i of rank's input: floats of varied magnitude (so the summation order shows in the
 * bits), i64 within +-2^39. */
static double elem_f(int rank, uint64_t i, uint64_t salt) {
    static const double scale[16] = {0x1p-8, 0x1p-7, 0x1p-6, 0x1p-5, 0x1p-4, 0x1p-3, 0x1p-2, 0x1p-1,
                                     0x1p0,  0x1p1,  0x1p2,  0x1p3,  0x1p4,  0x1p5,  0x1p6,  0x1p7};
    uint64_t k = key(rank, i, salt);
    return ((double)(k >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale[k & 15];
}

void hp_sh_elem(void *out, hp_comm_dtype dt, int rank, uint64_t i, uint64_t salt) {
    switch (dt) {
    case HP_COMM_F32:
        *(float *)out = (float)elem_f(rank, i, salt);
        break;
    case HP_COMM_F64:
        *(double *)out = elem_f(rank, i, salt);
        break;
    case HP_COMM_I64:
        *(int64_t *)out = (int64_t)(key(rank, i, salt) >> 24) - ((int64_t)1 << 39);
        break;
    }
}

static double ref_max_d(double a, double b) {
    return (a >= b || isnan(a)) ? a : b;
}

/* The rank-order fold of element i over `world` ranks. */
void hp_sh_ref_elem(void *out, hp_comm_dtype dt, hp_reduce_op op, int world, uint64_t i,
                    uint64_t salt) {
    if (dt == HP_COMM_F32) {
        float acc = 0, x = 0;
        hp_sh_elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            hp_sh_elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? (float)ref_max_d(acc, x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / (float)world;
        *(float *)out = acc;
    } else if (dt == HP_COMM_F64) {
        double acc = 0, x = 0;
        hp_sh_elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            hp_sh_elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? ref_max_d(acc, x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / (double)world;
        *(double *)out = acc;
    } else {
        int64_t acc = 0, x = 0;
        hp_sh_elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            hp_sh_elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? (acc >= x ? acc : x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / world;
        *(int64_t *)out = acc;
    }
}

uint64_t hp_sh_fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* First differing element of got vs want, or -1. */
long hp_sh_first_diff(const void *got, const void *want, size_t n, size_t es) {
    if (memcmp(got, want, n * es) == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            return (long)i;
        }
    }
    return -1;
}

int hp_sh_check_all_reduce(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                           int in_place, uint64_t salt, hp_sh_out *o) {
    int world = c->world;
    size_t es = hp_sh_esz[dt];
    char *send = malloc(n * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    for (size_t i = 0; i < n; i++) {
        hp_sh_elem(send + i * es, dt, rank, i, salt);
        hp_sh_ref_elem(want + i * es, dt, op, world, i, salt);
    }
    hp_err e = {0};
    hp_status s = c->vt->all_reduce(c, send, in_place ? send : recv, (int64_t)n, dt, op, &e);
    const char *got = in_place ? send : recv;
    long bad = s == HP_OK ? hp_sh_first_diff(got, want, n, es) : -1;
    if (s == HP_OK) o->hash = hp_sh_fnv(o->hash, got, n * es);
    free(send);
    free(recv);
    free(want);
    CHECK(s == HP_OK, "all_reduce(%zu %s %s): %s", n, hp_sh_dtn[dt], hp_sh_opn[op], e.msg);
    CHECK(bad < 0, "all_reduce(%zu %s %s%s): element %ld differs from the reference", n,
          hp_sh_dtn[dt], hp_sh_opn[op], in_place ? ", in place" : "", bad);
    return 0;
}

int hp_sh_check_reduce_scatter(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                               int in_place, uint64_t salt, hp_sh_out *o) {
    int world = c->world;
    size_t es = hp_sh_esz[dt], total = n * (size_t)world;
    char *send = malloc(total * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    for (size_t i = 0; i < total; i++) hp_sh_elem(send + i * es, dt, rank, i, salt);
    for (size_t i = 0; i < n; i++) {
        hp_sh_ref_elem(want + i * es, dt, op, world, (uint64_t)rank * n + i, salt);
    }
    char *out = in_place ? send + (size_t)rank * n * es : recv;
    hp_err e = {0};
    hp_status s = c->vt->reduce_scatter(c, send, out, (int64_t)n, dt, op, &e);
    long bad = s == HP_OK ? hp_sh_first_diff(out, want, n, es) : -1;
    free(send);
    free(recv);
    free(want);
    CHECK(s == HP_OK, "reduce_scatter(%zu %s %s): %s", n, hp_sh_dtn[dt], hp_sh_opn[op], e.msg);
    CHECK(bad < 0, "reduce_scatter(%zu %s %s%s): element %ld differs from the reference", n,
          hp_sh_dtn[dt], hp_sh_opn[op], in_place ? ", in place" : "", bad);
    return 0;
}

int hp_sh_check_all_gather(hp_comm *c, int rank, size_t bytes, int in_place, uint64_t salt,
                           hp_sh_out *o) {
    int world = c->world;
    uint8_t *recv = malloc(bytes * (size_t)world + 1), *send = malloc(bytes + 1);
    uint8_t *src = in_place ? recv + (size_t)rank * bytes : send;
    memset(recv, 0xa5, bytes * (size_t)world);
    for (size_t b = 0; b < bytes; b++) src[b] = hp_sh_gbyte(rank, b, salt);
    hp_err e = {0};
    hp_status s = c->vt->all_gather(c, src, recv, bytes, &e);
    long bad = -1;
    for (int j = 0; s == HP_OK && j < world && bad < 0; j++) {
        for (size_t b = 0; b < bytes; b++) {
            if (recv[(size_t)j * bytes + b] != hp_sh_gbyte(j, b, salt)) {
                bad = (long)((size_t)j * bytes + b);
                break;
            }
        }
    }
    if (s == HP_OK) o->hash = hp_sh_fnv(o->hash, recv, bytes * (size_t)world);
    free(recv);
    free(send);
    CHECK(s == HP_OK, "all_gather(%zu bytes): %s", bytes, e.msg);
    CHECK(bad < 0, "all_gather(%zu bytes%s): byte %ld wrong", bytes, in_place ? ", in place" : "",
          bad);
    return 0;
}

int hp_sh_check_broadcast(hp_comm *c, int rank, size_t bytes, int root, uint64_t salt,
                          hp_sh_out *o) {
    uint8_t *buf = malloc(bytes + 1);
    for (size_t b = 0; b < bytes; b++) buf[b] = hp_sh_gbyte(rank, b, salt);
    hp_err e = {0};
    hp_status s = c->vt->broadcast(c, buf, bytes, root, &e);
    long bad = -1;
    for (size_t b = 0; s == HP_OK && b < bytes; b++) {
        if (buf[b] != hp_sh_gbyte(root, b, salt)) {
            bad = (long)b;
            break;
        }
    }
    if (s == HP_OK) o->hash = hp_sh_fnv(o->hash, buf, bytes);
    free(buf);
    CHECK(s == HP_OK, "broadcast(%zu bytes, root %d): %s", bytes, root, e.msg);
    CHECK(bad < 0, "broadcast(%zu bytes, root %d): byte %ld wrong", bytes, root, bad);
    return 0;
}
