/* tests/worker/test_comm_shm.c — the shm communicator (worker/comm/shm.c, shm_coll.c).
 *
 * Ranks are forked processes (world 1..4); each child runs its part and sends a fixed-size
 * record (ok, status, hash of what must agree across ranks, a timestamp, a message) back
 * through a pipe, then _exits. The parent asserts on the records. Covered: every collective
 * over sizes 0, 1, odd, not divisible by world, many slot steps (a 1 KiB slot) and larger
 * than the default slot (20 MB), all dtypes and ops, in place, checked bitwise against a
 * plain rank-order computation and across ranks; call/size mismatches; a hung peer (timeout)
 * and a SIGKILLed peer (reported within 1 s, naming the rank); failed peers making the others
 * fail fast; join failures; stale and live segments under the same name; nothing left in
 * /dev/shm. An in-process group (threads) runs the same suite.
 */
#define _GNU_SOURCE
#include "hp/comm.h"
#include "worker/comm/shm_internal.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORLD 4

/* ---- process harness ----------------------------------------------------------------------- */

typedef struct child_out {
    int32_t ok;     /* the child's checks passed */
    int32_t status; /* hp_status of the call under test */
    uint64_t hash;  /* of outputs every rank must share */
    int64_t t_ns;   /* CLOCK_MONOTONIC of the event under test */
    char msg[1024];
} child_out;

typedef void (*child_fn)(int rank, void *ctx, child_out *out);

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static pid_t spawn(child_fn f, int rank, void *ctx, int *rfd) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        child_out o;
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
static void collect(pid_t pid, int fd, child_out *o) {
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

static void fresh_name(char *buf, size_t cap) {
    snprintf(buf, cap, "t%d-%d", (int)getpid(), name_counter++);
}

static int shm_exists(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/hp-%s", name);
    return access(path, F_OK) == 0;
}

/* Every test ends with nothing of its own in /dev/shm. */
static void assert_shm_clean(void) {
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

/* A group: every rank joins `name`, then runs body. */
typedef int (*rank_body)(hp_comm *c, int rank, void *ctx, child_out *o);

typedef struct group {
    char name[64];
    int world;
    double timeout_s;
    size_t slot;
    rank_body body;
    void *ctx;
} group;

static void group_child(int rank, void *ctx, child_out *o) {
    group *g = ctx;
    hp_comm *c = NULL;
    hp_err e = {0};
    hp_status s = hp__shm_comm_new_ex(g->name, rank, g->world, g->timeout_s, g->slot, &c, &e);
    o->status = s;
    o->t_ns = now_ns();
    if (s != HP_OK) {
        snprintf(o->msg, sizeof o->msg, "%s", e.msg);
        return;
    }
    o->ok = g->body(c, rank, g->ctx, o) == 0;
    hp_comm_free(c);
}

static void run_group(group *g, child_out *outs) {
    pid_t pids[MAX_WORLD];
    int fds[MAX_WORLD];
    for (int r = 0; r < g->world; r++) pids[r] = spawn(group_child, r, g, &fds[r]);
    for (int r = 0; r < g->world; r++) collect(pids[r], fds[r], &outs[r]);
    cr_expect(!shm_exists(g->name), "segment hp-%s left behind", g->name);
}

static void group_init(group *g, int world, double timeout_s, size_t slot, rank_body body,
                       void *ctx) {
    memset(g, 0, sizeof *g);
    fresh_name(g->name, sizeof g->name);
    g->world = world;
    g->timeout_s = timeout_s;
    g->slot = slot;
    g->body = body;
    g->ctx = ctx;
}

/* ---- deterministic data and the plain reference -------------------------------------------- */

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
static uint8_t gbyte(int rank, size_t b, uint64_t salt) {
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

static void elem(void *out, hp_comm_dtype dt, int rank, uint64_t i, uint64_t salt) {
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

static const size_t esz[] = {4, 8, 8};
static const char *const dtn[] = {"f32", "f64", "i64"};
static const char *const opn[] = {"sum", "avg", "max"};

static double ref_max_d(double a, double b) {
    return (a >= b || isnan(a)) ? a : b;
}

/* The rank-order fold of element i over `world` ranks. */
static void ref_elem(void *out, hp_comm_dtype dt, hp_reduce_op op, int world, uint64_t i,
                     uint64_t salt) {
    if (dt == HP_COMM_F32) {
        float acc, x;
        elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? (float)ref_max_d(acc, x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / (float)world;
        *(float *)out = acc;
    } else if (dt == HP_COMM_F64) {
        double acc, x;
        elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? ref_max_d(acc, x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / (double)world;
        *(double *)out = acc;
    } else {
        int64_t acc, x;
        elem(&acc, dt, 0, i, salt);
        for (int j = 1; j < world; j++) {
            elem(&x, dt, j, i, salt);
            acc = op == HP_REDUCE_MAX ? (acc >= x ? acc : x) : acc + x;
        }
        if (op == HP_REDUCE_AVG) acc = acc / world;
        *(int64_t *)out = acc;
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* First differing element of got vs want, or -1. */
static long first_diff(const void *got, const void *want, size_t n, size_t es) {
    if (memcmp(got, want, n * es) == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            return (long)i;
        }
    }
    return -1;
}

/* CALL(expr, what): expr may use `err`; on failure the child reports what and the message. */

/* ---- the collective suite (one rank's part) -------------------------------------------------- */

typedef struct suite {
    int big; /* 20 MB messages with the default slot instead of many small steps */
} suite;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(o->msg, sizeof o->msg, __VA_ARGS__);                                          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define CALL(expr, what)                                                                           \
    do {                                                                                           \
        hp_err e_ = {0};                                                                           \
        hp_err *err = &e_;                                                                         \
        hp_status s_ = (expr);                                                                     \
        CHECK(s_ == HP_OK, "%s: %s", what, e_.msg);                                                \
    } while (0)

static int check_all_reduce(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                            int in_place, uint64_t salt, child_out *o) {
    int world = c->world;
    size_t es = esz[dt];
    char *send = malloc(n * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    for (size_t i = 0; i < n; i++) {
        elem(send + i * es, dt, rank, i, salt);
        ref_elem(want + i * es, dt, op, world, i, salt);
    }
    hp_err e = {0};
    hp_status s = c->vt->all_reduce(c, send, in_place ? send : recv, (int64_t)n, dt, op, &e);
    const char *got = in_place ? send : recv;
    long bad = s == HP_OK ? first_diff(got, want, n, es) : -1;
    if (s == HP_OK) o->hash = fnv(o->hash, got, n * es);
    free(send);
    free(recv);
    free(want);
    CHECK(s == HP_OK, "all_reduce(%zu %s %s): %s", n, dtn[dt], opn[op], e.msg);
    CHECK(bad < 0, "all_reduce(%zu %s %s%s): element %ld differs from the reference", n, dtn[dt],
          opn[op], in_place ? ", in place" : "", bad);
    return 0;
}

static int check_reduce_scatter(hp_comm *c, int rank, size_t n, hp_comm_dtype dt, hp_reduce_op op,
                                int in_place, uint64_t salt, child_out *o) {
    int world = c->world;
    size_t es = esz[dt], total = n * (size_t)world;
    char *send = malloc(total * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    for (size_t i = 0; i < total; i++) elem(send + i * es, dt, rank, i, salt);
    for (size_t i = 0; i < n; i++) {
        ref_elem(want + i * es, dt, op, world, (uint64_t)rank * n + i, salt);
    }
    char *out = in_place ? send + (size_t)rank * n * es : recv;
    hp_err e = {0};
    hp_status s = c->vt->reduce_scatter(c, send, out, (int64_t)n, dt, op, &e);
    long bad = s == HP_OK ? first_diff(out, want, n, es) : -1;
    free(send);
    free(recv);
    free(want);
    CHECK(s == HP_OK, "reduce_scatter(%zu %s %s): %s", n, dtn[dt], opn[op], e.msg);
    CHECK(bad < 0, "reduce_scatter(%zu %s %s%s): element %ld differs from the reference", n,
          dtn[dt], opn[op], in_place ? ", in place" : "", bad);
    return 0;
}

static int check_all_gather(hp_comm *c, int rank, size_t bytes, int in_place, uint64_t salt,
                            child_out *o) {
    int world = c->world;
    uint8_t *recv = malloc(bytes * (size_t)world + 1), *send = malloc(bytes + 1);
    uint8_t *src = in_place ? recv + (size_t)rank * bytes : send;
    memset(recv, 0xa5, bytes * (size_t)world);
    for (size_t b = 0; b < bytes; b++) src[b] = gbyte(rank, b, salt);
    hp_err e = {0};
    hp_status s = c->vt->all_gather(c, src, recv, bytes, &e);
    long bad = -1;
    for (int j = 0; s == HP_OK && j < world && bad < 0; j++) {
        for (size_t b = 0; b < bytes; b++) {
            if (recv[(size_t)j * bytes + b] != gbyte(j, b, salt)) {
                bad = (long)((size_t)j * bytes + b);
                break;
            }
        }
    }
    if (s == HP_OK) o->hash = fnv(o->hash, recv, bytes * (size_t)world);
    free(recv);
    free(send);
    CHECK(s == HP_OK, "all_gather(%zu bytes): %s", bytes, e.msg);
    CHECK(bad < 0, "all_gather(%zu bytes%s): byte %ld wrong", bytes, in_place ? ", in place" : "",
          bad);
    return 0;
}

static int check_broadcast(hp_comm *c, int rank, size_t bytes, int root, uint64_t salt,
                           child_out *o) {
    uint8_t *buf = malloc(bytes + 1);
    for (size_t b = 0; b < bytes; b++) buf[b] = gbyte(rank, b, salt);
    hp_err e = {0};
    hp_status s = c->vt->broadcast(c, buf, bytes, root, &e);
    long bad = -1;
    for (size_t b = 0; s == HP_OK && b < bytes; b++) {
        if (buf[b] != gbyte(root, b, salt)) {
            bad = (long)b;
            break;
        }
    }
    if (s == HP_OK) o->hash = fnv(o->hash, buf, bytes);
    free(buf);
    CHECK(s == HP_OK, "broadcast(%zu bytes, root %d): %s", bytes, root, e.msg);
    CHECK(bad < 0, "broadcast(%zu bytes, root %d): byte %ld wrong", bytes, root, bad);
    return 0;
}

static int suite_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    const suite *su = ctx;
    uint64_t salt = 1;
    if (su->big) {
        /* Larger than the default slot: many 1 MiB steps, ragged last step. */
        if (check_all_gather(c, rank, 20000003, 0, salt++, o)) return 1;
        if (check_all_reduce(c, rank, 2000003, HP_COMM_F32, HP_REDUCE_AVG, 0, salt++, o)) return 1;
        if (check_all_reduce(c, rank, 600011, HP_COMM_F64, HP_REDUCE_SUM, 1, salt++, o)) return 1;
        if (check_reduce_scatter(c, rank, 2000003 / (size_t)c->world, HP_COMM_F32, HP_REDUCE_SUM, 0,
                                 salt++, o)) {
            return 1;
        }
        if (check_broadcast(c, rank, 5000011, c->world - 1, salt++, o)) return 1;
        CALL(c->vt->barrier(c, err), "barrier");
        return 0;
    }
    static const size_t counts[] = {0, 1, 3, 7, 64, 100, 1000, 4097};
    static const size_t bytes[] = {0, 1, 5, 255, 256, 257, 1000, 4099, 10007};
    for (int dt = 0; dt < 3; dt++) {
        for (int op = 0; op < 3; op++) {
            for (size_t k = 0; k < HP_ARRAY_LEN(counts); k++) {
                int in_place = (int)k % 2;
                if (check_all_reduce(c, rank, counts[k], dt, op, in_place, salt++, o)) return 1;
                if (check_reduce_scatter(c, rank, counts[k], dt, op, !in_place, salt++, o)) {
                    return 1;
                }
            }
        }
    }
    for (size_t k = 0; k < HP_ARRAY_LEN(bytes); k++) {
        if (check_all_gather(c, rank, bytes[k], (int)k % 2, salt++, o)) return 1;
        for (int root = 0; root < c->world; root++) {
            if (check_broadcast(c, rank, bytes[k], root, salt++, o)) return 1;
        }
        CALL(c->vt->barrier(c, err), "barrier");
    }
    return 0;
}

static void run_suite(int world, size_t slot, int big) {
    suite su = {big};
    group g;
    group_init(&g, world, 20, slot, suite_body, &su);
    child_out outs[MAX_WORLD];
    run_group(&g, outs);
    for (int r = 0; r < world; r++) {
        cr_assert(outs[r].ok, "world %d rank %d: %s", world, r, outs[r].msg);
        cr_assert_eq(outs[r].hash, outs[0].hash, "world %d: rank %d's results differ from rank 0's",
                     world, r);
    }
    assert_shm_clean();
}

Test(comm_shm, collectives_small_slot, .timeout = 120) {
    /* A 1 KiB slot: every size above 512 bytes takes many steps. */
    for (int world = 1; world <= MAX_WORLD; world++) run_suite(world, 1024, 0);
}

Test(comm_shm, collectives_default_slot_large, .timeout = 120) {
    for (int world = 2; world <= MAX_WORLD; world++) run_suite(world, 0, 1);
}

Test(comm_shm, collectives_default_slot_small_sizes, .timeout = 120) {
    run_suite(3, 0, 0);
}

/* ---- in-process group (threads over one mapping) --------------------------------------------- */

typedef struct thread_arg {
    hp_comm *c;
    child_out o;
    pthread_t t;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    suite su = {0};
    a->o.ok = suite_body(a->c, a->c->rank, &su, &a->o) == 0;
    return NULL;
}

Test(comm_shm, local_threads, .timeout = 60) {
    for (int world = 1; world <= 3; world++) {
        hp_comm *cs[3];
        hp_err e;
        cr_assert_eq(hp__shm_comm_new_local(world, 10, 512, cs, &e), HP_OK, "%s", e.msg);
        thread_arg a[3];
        memset(a, 0, sizeof a);
        for (int r = 0; r < world; r++) {
            a[r].c = cs[r];
            cr_assert_eq(pthread_create(&a[r].t, NULL, thread_main, &a[r]), 0);
        }
        for (int r = 0; r < world; r++) pthread_join(a[r].t, NULL);
        for (int r = 0; r < world; r++) {
            cr_assert(a[r].o.ok, "world %d rank %d: %s", world, r, a[r].o.msg);
            cr_assert_eq(a[r].o.hash, a[0].o.hash);
            hp_comm_free(cs[r]);
        }
    }
}

/* ---- NaN in max ------------------------------------------------------------------------------ */

static int nan_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    (void)ctx;
    /* Element i is NaN on rank i % 3 only; max must be NaN everywhere, on every rank. */
    double x[6];
    for (int i = 0; i < 6; i++) x[i] = i % 3 == rank ? NAN : (double)(rank * 10 + i);
    CALL(c->vt->all_reduce(c, x, x, 6, HP_COMM_F64, HP_REDUCE_MAX, err), "all_reduce max");
    for (int i = 0; i < 6; i++) CHECK(isnan(x[i]), "element %d = %g, want NaN", i, x[i]);
    float y[4] = {(float)rank, -(float)rank, rank == 1 ? -0.0f : 0.0f, 1e30f * (float)rank};
    CALL(c->vt->all_reduce(c, y, y, 4, HP_COMM_F32, HP_REDUCE_MAX, err), "all_reduce max f32");
    CHECK(y[0] == 2.0f && y[1] == 0.0f && y[3] == 2e30f, "max f32 = %g %g %g", y[0], y[1], y[3]);
    int64_t z[2] = {rank == 2 ? INT64_MAX : 1, -7 - rank};
    CALL(c->vt->all_reduce(c, z, z, 2, HP_COMM_I64, HP_REDUCE_AVG, err), "all_reduce avg i64");
    /* i64 avg: the wrapped sum divided by world, truncating toward zero. */
    int64_t want0 = (int64_t)((uint64_t)INT64_MAX + 2u) / 3;
    CHECK(z[0] == want0 && z[1] == (-7 - 8 - 9) / 3, "avg i64 = %lld %lld", (long long)z[0],
          (long long)z[1]);
    o->hash = fnv(0, x, sizeof x);
    return 0;
}

Test(comm_shm, max_nan_and_i64_avg) {
    group g;
    group_init(&g, 3, 10, 0, nan_body, NULL);
    child_out outs[3];
    run_group(&g, outs);
    for (int r = 0; r < 3; r++) {
        cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
        cr_assert_eq(outs[r].hash, outs[0].hash, "rank %d: NaN bits differ", r);
    }
    assert_shm_clean();
}

/* ---- mismatched calls ------------------------------------------------------------------------ */

typedef struct mismatch {
    int variant;
} mismatch;

static int mismatch_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    const mismatch *m = ctx;
    char buf[64] = {0}, out[256];
    hp_err e = {0};
    CALL(c->vt->barrier(c, err), "barrier #1");
    if (m->variant == 0) { /* same call, different size on the last rank */
        size_t n = rank == c->world - 1 ? 32 : 16;
        o->status = c->vt->all_gather(c, buf, out, n, &e);
    } else { /* different calls */
        if (rank == 1) {
            o->status = c->vt->all_reduce(c, buf, buf, 4, HP_COMM_F32, HP_REDUCE_SUM, &e);
        } else {
            o->status = c->vt->barrier(c, &e);
        }
    }
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    /* Broken now: the next call fails at once. */
    hp_err e2 = {0};
    CHECK(c->vt->barrier(c, &e2) == HP_IO && strstr(e2.msg, "unusable"), "after: %s", e2.msg);
    return 0;
}

Test(comm_shm, mismatch_detected, .timeout = 30) {
    for (int variant = 0; variant < 2; variant++) {
        mismatch m = {variant};
        group g;
        group_init(&g, 3, 10, 0, mismatch_body, &m);
        child_out outs[3];
        int64_t t0 = now_ns();
        run_group(&g, outs);
        cr_expect(now_ns() - t0 < 5000000000LL, "mismatch took the full timeout");
        for (int r = 0; r < 3; r++) {
            cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
            cr_assert_eq(outs[r].status, HP_IO, "rank %d: %s", r, outs[r].msg);
            cr_assert(strstr(outs[r].msg, "#2"), "rank %d: %s", r, outs[r].msg);
        }
        if (variant == 0) {
            cr_assert(strstr(outs[0].msg, "rank 0 called all_gather(16 bytes), rank 2 called "
                                          "all_gather(32 bytes)"),
                      "%s", outs[0].msg);
            cr_assert(strstr(outs[2].msg, "rank 2 called all_gather(32 bytes)"), "%s", outs[2].msg);
        } else {
            cr_assert(strstr(outs[0].msg, "rank 0 called barrier, rank 1 called all_reduce(4 x "
                                          "f32, sum)"),
                      "%s", outs[0].msg);
        }
    }
    assert_shm_clean();
}

/* ---- bad arguments on one rank make the others fail fast ------------------------------------- */

static int badarg_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    (void)ctx;
    float x[4] = {0};
    hp_err e = {0};
    int64_t t0 = now_ns();
    if (rank == 0) {
        o->status = c->vt->all_reduce(c, x, x, 4, (hp_comm_dtype)9, HP_REDUCE_SUM, &e);
    } else {
        o->status = c->vt->all_reduce(c, x, x, 4, HP_COMM_F32, HP_REDUCE_SUM, &e);
    }
    o->t_ns = now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    return 0;
}

Test(comm_shm, bad_argument_fails_peers_fast, .timeout = 30) {
    group g;
    group_init(&g, 2, 20, 0, badarg_body, NULL);
    child_out outs[2];
    run_group(&g, outs);
    cr_assert_eq(outs[0].status, HP_INVALID, "%s", outs[0].msg);
    cr_assert(strstr(outs[0].msg, "all_reduce #1: bad dtype 9"), "%s", outs[0].msg);
    cr_assert_eq(outs[1].status, HP_IO, "%s", outs[1].msg);
    cr_assert(strstr(outs[1].msg, "all_reduce #1 aborted: rank 0 failed: all_reduce #1: bad dtype"),
              "%s", outs[1].msg);
    cr_assert(outs[1].t_ns < 1000000000LL, "peer took %lld ns", (long long)outs[1].t_ns);
    assert_shm_clean();
}

/* The race behind a flaky run of the test above: rank 1 registered, rank 0 saw the join
 * complete, failed its all_reduce and published that, all before rank 1 left the join loop,
 * which then reported "join aborted" for a join that had succeeded. Rank 1 is held right after
 * registering until rank 0's failed call has returned, which makes that order certain. */
static int race_pipe[2] = {-1, -1};

static void hold_joiner(int rank) {
    char b;
    if (rank == 1 && read(race_pipe[0], &b, 1) != 1) _exit(3);
}

static int badarg_after_join_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    badarg_body(c, rank, ctx, o);
    if (rank == 0 && write(race_pipe[1], "x", 1) != 1) return 1;
    return 0;
}

static void race_child(int rank, void *ctx, child_out *o) {
    hp__shm_join_hook = hold_joiner;
    group_child(rank, ctx, o);
}

Test(comm_shm, failure_right_after_join_is_not_a_join_failure, .timeout = 30) {
    cr_assert_eq(pipe(race_pipe), 0);
    group g;
    group_init(&g, 2, 20, 0, badarg_after_join_body, NULL);
    pid_t pids[2];
    int fds[2];
    child_out outs[2];
    for (int r = 0; r < 2; r++) pids[r] = spawn(race_child, r, &g, &fds[r]);
    for (int r = 0; r < 2; r++) collect(pids[r], fds[r], &outs[r]);
    close(race_pipe[0]);
    close(race_pipe[1]);
    cr_assert_eq(outs[0].status, HP_INVALID, "%s", outs[0].msg);
    cr_assert_eq(outs[1].status, HP_IO, "%s", outs[1].msg);
    cr_assert(strstr(outs[1].msg, "all_reduce #1 aborted: rank 0 failed: all_reduce #1: bad dtype"),
              "%s", outs[1].msg);
    cr_assert(!shm_exists(g.name));
    assert_shm_clean();
}

/* ---- a hung peer: timeout -------------------------------------------------------------------- */

static int hung_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    (void)ctx;
    CALL(c->vt->barrier(c, err), "barrier #1");
    if (rank == 2) nap_ms(1000);
    hp_err e = {0};
    int64_t t0 = now_ns();
    o->status = c->vt->barrier(c, &e);
    o->t_ns = now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    return 0;
}

Test(comm_shm, hung_peer_times_out, .timeout = 30) {
    group g;
    group_init(&g, 3, 0.5, 0, hung_body, NULL);
    child_out outs[3];
    run_group(&g, outs);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(outs[r].status, HP_IO, "rank %d: %s", r, outs[r].msg);
        cr_assert(strstr(outs[r].msg, "rank 2 did not reach barrier #2 within 0.5 s"),
                  "rank %d: %s", r, outs[r].msg);
        cr_assert(outs[r].t_ns > 400000000LL && outs[r].t_ns < 1000000000LL, "rank %d: %lld ns", r,
                  (long long)outs[r].t_ns);
    }
    /* The late rank arrives to a broken group and fails at once. */
    cr_assert_eq(outs[2].status, HP_IO, "%s", outs[2].msg);
    cr_assert(strstr(outs[2].msg, "barrier #2 aborted: rank"), "%s", outs[2].msg);
    cr_assert(outs[2].t_ns < 200000000LL, "late rank took %lld ns", (long long)outs[2].t_ns);
    assert_shm_clean();
}

/* ---- a killed peer: reported within 1 s, no hang --------------------------------------------- */

typedef struct kill_ctx {
    int victim;
    int ready[2]; /* the victim writes a byte once it is inside the collective loop */
} kill_ctx;

static int kill_body(hp_comm *c, int rank, void *ctx, child_out *o) {
    kill_ctx *k = ctx;
    size_t bytes = 1 << 20;
    uint8_t *send = calloc(1, bytes), *recv = malloc(bytes * (size_t)c->world);
    hp_err e = {0};
    hp_status s = HP_OK;
    int64_t end = now_ns() + 15000000000LL;
    for (int it = 0; s == HP_OK && now_ns() < end; it++) {
        s = c->vt->all_gather(c, send, recv, bytes, &e);
        if (it == 3 && rank == k->victim) {
            char b = 1;
            if (write(k->ready[1], &b, 1) != 1) break;
        }
    }
    o->t_ns = now_ns();
    o->status = s;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    free(send);
    free(recv);
    return 0;
}

static void run_kill(int world, int victim) {
    kill_ctx k = {victim, {-1, -1}};
    cr_assert_eq(pipe(k.ready), 0);
    group g;
    group_init(&g, world, 30, 0, kill_body, &k);
    pid_t pids[MAX_WORLD];
    int fds[MAX_WORLD];
    for (int r = 0; r < world; r++) pids[r] = spawn(group_child, r, &g, &fds[r]);
    char b;
    cr_assert_eq(read(k.ready[0], &b, 1), 1);
    nap_ms(50);
    int64_t t_kill = now_ns();
    kill(pids[victim], SIGKILL);
    child_out outs[MAX_WORLD];
    for (int r = 0; r < world; r++) collect(pids[r], fds[r], &outs[r]);
    close(k.ready[0]);
    close(k.ready[1]);
    char want[32];
    snprintf(want, sizeof want, "rank %d (pid %d) died", victim, (int)pids[victim]);
    for (int r = 0; r < world; r++) {
        if (r == victim) continue;
        cr_assert_eq(outs[r].status, HP_IO, "rank %d: %s", r, outs[r].msg);
        cr_assert(strstr(outs[r].msg, want), "rank %d: %s", r, outs[r].msg);
        cr_assert(strstr(outs[r].msg, "all_gather #"), "rank %d: %s", r, outs[r].msg);
        cr_assert(outs[r].t_ns - t_kill < 1000000000LL, "rank %d noticed after %lld ns", r,
                  (long long)(outs[r].t_ns - t_kill));
    }
    cr_expect(!shm_exists(g.name));
}

Test(comm_shm, killed_peer_detected, .timeout = 60) {
    run_kill(2, 1);
    run_kill(4, 2);
    run_kill(3, 0);
    assert_shm_clean();
}

/* ---- joining --------------------------------------------------------------------------------- */

typedef struct join_ctx {
    char name[64];
    int world;
    double timeout_s;
} join_ctx;

static void join_child(int rank, void *ctx, child_out *o) {
    join_ctx *j = ctx;
    hp_comm *c = NULL;
    hp_err e = {0};
    int64_t t0 = now_ns();
    o->status = hp_shm_comm_new(j->name, rank, j->world, j->timeout_s, &c, &e);
    o->t_ns = now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    if (o->status == HP_OK) {
        hp_err e2 = {0};
        o->ok = c->vt->barrier(c, &e2) == HP_OK;
        if (!o->ok) snprintf(o->msg, sizeof o->msg, "barrier: %s", e2.msg);
        hp_comm_free(c);
    }
}

Test(comm_shm, join_missing_rank_times_out, .timeout = 30) {
    join_ctx j;
    fresh_name(j.name, sizeof j.name);
    j.world = 3;
    j.timeout_s = 0.4;
    int fds[2];
    pid_t p0 = spawn(join_child, 0, &j, &fds[0]);
    pid_t p1 = spawn(join_child, 1, &j, &fds[1]);
    child_out o0, o1;
    collect(p0, fds[0], &o0);
    collect(p1, fds[1], &o1);
    cr_assert_eq(o0.status, HP_IO, "%s", o0.msg);
    cr_assert(strstr(o0.msg, "rank 2 of 3 did not join within 0.4 s"), "%s", o0.msg);
    cr_assert_eq(o1.status, HP_IO, "%s", o1.msg);
    cr_assert(!shm_exists(j.name));
    /* Rank 0 never comes. */
    fresh_name(j.name, sizeof j.name);
    j.world = 2;
    j.timeout_s = 0.3;
    p1 = spawn(join_child, 1, &j, &fds[1]);
    collect(p1, fds[1], &o1);
    cr_assert_eq(o1.status, HP_IO, "%s", o1.msg);
    cr_assert(strstr(o1.msg, "rank 0 did not create /dev/shm/hp-"), "%s", o1.msg);
    assert_shm_clean();
}

Test(comm_shm, join_world_mismatch, .timeout = 30) {
    join_ctx a, b;
    fresh_name(a.name, sizeof a.name);
    a.world = 2;
    a.timeout_s = 0.3;
    b = a;
    b.world = 3;
    int fds[2];
    pid_t p0 = spawn(join_child, 0, &a, &fds[0]);
    pid_t p1 = spawn(join_child, 1, &b, &fds[1]);
    child_out o0, o1;
    collect(p0, fds[0], &o0);
    collect(p1, fds[1], &o1);
    cr_assert_eq(o1.status, HP_INVALID, "%s", o1.msg);
    cr_assert(strstr(o1.msg, "is for 2 ranks"), "%s", o1.msg);
    cr_assert_eq(o0.status, HP_IO, "%s", o0.msg);
    assert_shm_clean();
}

/* A rank 0 that dies while waiting for the others leaves a stale segment behind. */
static void make_stale(const char *name, int world) {
    join_ctx j;
    snprintf(j.name, sizeof j.name, "%s", name);
    j.world = world;
    j.timeout_s = 30;
    int fd;
    pid_t p = spawn(join_child, 0, &j, &fd);
    for (int i = 0; i < 2000 && !shm_exists(name); i++) nap_ms(1);
    cr_assert(shm_exists(name));
    nap_ms(20); /* past init */
    kill(p, SIGKILL);
    child_out o;
    collect(p, fd, &o);
    cr_assert(shm_exists(name), "the dead rank 0 should have left its segment");
}

static void run_join_pair(const char *name, int rank1_first, child_out *o) {
    join_ctx j;
    snprintf(j.name, sizeof j.name, "%s", name);
    j.world = 2;
    j.timeout_s = 5;
    int fds[2];
    pid_t p[2];
    if (rank1_first) {
        p[1] = spawn(join_child, 1, &j, &fds[1]);
        nap_ms(30); /* rank 1 finds the stale segment first */
        p[0] = spawn(join_child, 0, &j, &fds[0]);
    } else {
        p[0] = spawn(join_child, 0, &j, &fds[0]);
        p[1] = spawn(join_child, 1, &j, &fds[1]);
    }
    for (int r = 0; r < 2; r++) collect(p[r], fds[r], &o[r]);
}

Test(comm_shm, stale_segment_replaced, .timeout = 60) {
    char name[64];
    child_out o[2];
    for (int rank1_first = 0; rank1_first < 2; rank1_first++) {
        fresh_name(name, sizeof name);
        make_stale(name, 2 + rank1_first); /* the dead run may have had another world */
        run_join_pair(name, rank1_first, o);
        for (int r = 0; r < 2; r++) cr_assert(o[r].ok, "rank %d: %s", r, o[r].msg);
        cr_assert(!shm_exists(name));
    }
    /* Garbage under the name (not even a header). */
    fresh_name(name, sizeof name);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/hp-%s", name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("junk", f);
    fclose(f);
    run_join_pair(name, 1, o);
    for (int r = 0; r < 2; r++) cr_assert(o[r].ok, "rank %d: %s", r, o[r].msg);
    cr_assert(!shm_exists(name));
    assert_shm_clean();
}

Test(comm_shm, live_segment_refused, .timeout = 30) {
    join_ctx j;
    fresh_name(j.name, sizeof j.name);
    j.world = 2;
    j.timeout_s = 0.5;
    int fd;
    pid_t p = spawn(join_child, 0, &j, &fd); /* a live rank 0 waiting for its rank 1 */
    for (int i = 0; i < 2000 && !shm_exists(j.name); i++) nap_ms(1);
    nap_ms(20);
    hp_comm *c = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_shm_comm_new(j.name, 0, 2, 1, &c, &e), HP_IO);
    cr_assert_null(c);
    char want[64];
    snprintf(want, sizeof want, "its rank 0 is pid %d", (int)p);
    cr_assert(strstr(e.msg, "belongs to a live run") && strstr(e.msg, want), "%s", e.msg);
    child_out o;
    collect(p, fd, &o); /* times out on its own and unlinks */
    cr_assert_eq(o.status, HP_IO, "%s", o.msg);
    cr_assert(!shm_exists(j.name));
    assert_shm_clean();
}

Test(comm_shm, bad_arguments) {
    hp_comm *c = (hp_comm *)1;
    hp_err e;
    cr_assert_eq(hp_shm_comm_new("a/b", 0, 1, 1, &c, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "bad segment name 'a/b'"), "%s", e.msg);
    cr_assert_null(c);
    cr_assert_eq(hp_shm_comm_new("", 0, 1, 1, &c, &e), HP_INVALID);
    char longname[80];
    memset(longname, 'x', 65);
    longname[65] = '\0';
    cr_assert_eq(hp_shm_comm_new(longname, 0, 1, 1, &c, &e), HP_INVALID);
    cr_assert_eq(hp_shm_comm_new(NULL, 0, 1, 1, &c, &e), HP_INVALID);
    cr_assert_eq(hp_shm_comm_new("ok", 2, 2, 1, &c, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "rank 2 out of range [0, 2)"), "%s", e.msg);
    cr_assert_eq(hp_shm_comm_new("ok", 0, 0, 1, &c, &e), HP_INVALID);
    cr_assert_eq(hp_shm_comm_new("ok", 0, 2, 0, &c, &e), HP_INVALID);
    cr_assert_eq(hp_shm_comm_new("ok", 0, 2, NAN, &c, &e), HP_INVALID);
    cr_assert_eq(hp__shm_comm_new_ex("ok", 0, 2, 1, 100, &c, &e), HP_INVALID);
    cr_assert_eq(hp_shm_comm_new("ok", 0, 2, 1, NULL, &e), HP_INVALID);

    /* World 1 needs nobody; bad collective arguments break it. */
    char name[64];
    fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert(!shm_exists(name));
    cr_assert_str_eq(c->vt->name, "shm");
    cr_assert_eq(c->vt->broadcast(c, NULL, 0, 0, &e), HP_OK);
    cr_assert_eq(c->vt->broadcast(c, NULL, 0, 1, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "broadcast #2: root 1 out of range [0, 1)"), "%s", e.msg);
    cr_assert_eq(c->vt->barrier(c, &e), HP_IO);
    cr_assert(strstr(e.msg, "unusable after an earlier error: broadcast #2"), "%s", e.msg);
    hp_comm_free(c);
    fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_reduce(c, NULL, NULL, -1, HP_COMM_F32, HP_REDUCE_SUM, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "bad count -1"), "%s", e.msg);
    hp_comm_free(c);
    fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_gather(c, NULL, NULL, 5, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "send is NULL"), "%s", e.msg);
    hp_comm_free(c);
    hp_comm_free(NULL);
    assert_shm_clean();
}
