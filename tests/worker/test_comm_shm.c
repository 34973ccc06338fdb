/* tests/worker/test_comm_shm.c — the shm communicator (worker/comm/shm.c, shm_coll.c).
 *
 * Ranks are forked processes (world 1..4, tests/util/shm_harness.h). Covered: every collective
 * over sizes 0, 1, odd, not divisible by world, many slot steps (a 1 KiB slot) and larger
 * than the default slot (20 MB), all dtypes and ops, in place, checked bitwise against a
 * plain rank-order computation and across ranks; call/size mismatches; a hung peer (timeout)
 * and a SIGKILLed peer (reported within 1 s, naming the rank); failed peers making the others
 * fail fast; join failures; stale and live segments under the same name; nothing left in
 * /dev/shm. An in-process group (threads) runs the same suite.
 */
#define _GNU_SOURCE
#include "hp/comm.h"
#include "tests/util/shm_harness.h"
#include "worker/comm/shm_internal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A deliberate delay (a hung peer, a rank past its init), never synchronization. */
static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- the collective suite (one rank's part) -------------------------------------------------- */

typedef struct suite {
    int big; /* 20 MB messages with the default slot instead of many small steps */
} suite;

static int suite_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    const suite *su = ctx;
    uint64_t salt = 1;
    if (su->big) {
        /* Larger than the default slot: many 1 MiB steps, ragged last step. */
        if (hp_sh_check_all_gather(c, rank, 20000003, 0, salt++, o)) return 1;
        if (hp_sh_check_all_reduce(c, rank, 2000003, HP_COMM_F32, HP_REDUCE_AVG, 0, salt++, o))
            return 1;
        if (hp_sh_check_all_reduce(c, rank, 600011, HP_COMM_F64, HP_REDUCE_SUM, 1, salt++, o))
            return 1;
        if (hp_sh_check_reduce_scatter(c, rank, 2000003 / (size_t)c->world, HP_COMM_F32,
                                       HP_REDUCE_SUM, 0, salt++, o)) {
            return 1;
        }
        if (hp_sh_check_broadcast(c, rank, 5000011, c->world - 1, salt++, o)) return 1;
        CALL(c->vt->barrier(c, err), "barrier");
        return 0;
    }
    static const size_t counts[] = {0, 1, 3, 7, 64, 100, 1000, 4097};
    static const size_t bytes[] = {0, 1, 5, 255, 256, 257, 1000, 4099, 10007};
    for (int dt = 0; dt < 3; dt++) {
        for (int op = 0; op < 3; op++) {
            for (size_t k = 0; k < HP_ARRAY_LEN(counts); k++) {
                int in_place = (int)k % 2;
                if (hp_sh_check_all_reduce(c, rank, counts[k], dt, op, in_place, salt++, o))
                    return 1;
                if (hp_sh_check_reduce_scatter(c, rank, counts[k], dt, op, !in_place, salt++, o)) {
                    return 1;
                }
            }
        }
    }
    for (size_t k = 0; k < HP_ARRAY_LEN(bytes); k++) {
        if (hp_sh_check_all_gather(c, rank, bytes[k], (int)k % 2, salt++, o)) return 1;
        for (int root = 0; root < c->world; root++) {
            if (hp_sh_check_broadcast(c, rank, bytes[k], root, salt++, o)) return 1;
        }
        CALL(c->vt->barrier(c, err), "barrier");
    }
    return 0;
}

static void run_suite(int world, size_t slot, int big) {
    suite su = {big};
    hp_sh_group g;
    hp_sh_group_init(&g, world, 20, slot, suite_body, &su);
    hp_sh_out outs[HP_SH_MAX_WORLD];
    hp_sh_run_group(&g, outs);
    for (int r = 0; r < world; r++) {
        cr_assert(outs[r].ok, "world %d rank %d: %s", world, r, outs[r].msg);
        cr_assert_eq(outs[r].hash, outs[0].hash, "world %d: rank %d's results differ from rank 0's",
                     world, r);
    }
    hp_sh_assert_clean();
}

Test(comm_shm, collectives_small_slot, .timeout = 120) {
    /* A 1 KiB slot: every size above 512 bytes takes many steps. */
    for (int world = 1; world <= HP_SH_MAX_WORLD; world++) run_suite(world, 1024, 0);
}

Test(comm_shm, collectives_default_slot_large, .timeout = 120) {
    for (int world = 2; world <= HP_SH_MAX_WORLD; world++) run_suite(world, 0, 1);
}

Test(comm_shm, collectives_default_slot_small_sizes, .timeout = 120) {
    run_suite(3, 0, 0);
}

/* ---- in-process group (threads over one mapping) --------------------------------------------- */

typedef struct thread_arg {
    hp_comm *c;
    hp_sh_out o;
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

static int nan_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
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
    o->hash = hp_sh_fnv(0, x, sizeof x);
    return 0;
}

Test(comm_shm, max_nan_and_i64_avg) {
    hp_sh_group g;
    hp_sh_group_init(&g, 3, 10, 0, nan_body, NULL);
    hp_sh_out outs[3];
    hp_sh_run_group(&g, outs);
    for (int r = 0; r < 3; r++) {
        cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
        cr_assert_eq(outs[r].hash, outs[0].hash, "rank %d: NaN bits differ", r);
    }
    hp_sh_assert_clean();
}

/* ---- mismatched calls ------------------------------------------------------------------------ */

typedef struct mismatch {
    int variant;
} mismatch;

static int mismatch_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
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
        hp_sh_group g;
        hp_sh_group_init(&g, 3, 10, 0, mismatch_body, &m);
        hp_sh_out outs[3];
        int64_t t0 = hp_sh_now_ns();
        hp_sh_run_group(&g, outs);
        cr_expect(hp_sh_now_ns() - t0 < 5000000000LL, "mismatch took the full timeout");
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
    hp_sh_assert_clean();
}

/* ---- bad arguments on one rank make the others fail fast ------------------------------------- */

static int badarg_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    float x[4] = {0};
    hp_err e = {0};
    int64_t t0 = hp_sh_now_ns();
    if (rank == 0) {
        o->status = c->vt->all_reduce(c, x, x, 4, (hp_comm_dtype)9, HP_REDUCE_SUM, &e);
    } else {
        o->status = c->vt->all_reduce(c, x, x, 4, HP_COMM_F32, HP_REDUCE_SUM, &e);
    }
    o->t_ns = hp_sh_now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    return 0;
}

Test(comm_shm, bad_argument_fails_peers_fast, .timeout = 30) {
    hp_sh_group g;
    hp_sh_group_init(&g, 2, 20, 0, badarg_body, NULL);
    hp_sh_out outs[2];
    hp_sh_run_group(&g, outs);
    cr_assert_eq(outs[0].status, HP_INVALID, "%s", outs[0].msg);
    cr_assert(strstr(outs[0].msg, "all_reduce #1: bad dtype 9"), "%s", outs[0].msg);
    cr_assert_eq(outs[1].status, HP_IO, "%s", outs[1].msg);
    cr_assert(strstr(outs[1].msg, "all_reduce #1 aborted: rank 0 failed: all_reduce #1: bad dtype"),
              "%s", outs[1].msg);
    cr_assert(outs[1].t_ns < 1000000000LL, "peer took %lld ns", (long long)outs[1].t_ns);
    hp_sh_assert_clean();
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

static int badarg_after_join_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    badarg_body(c, rank, ctx, o);
    if (rank == 0 && write(race_pipe[1], "x", 1) != 1) return 1;
    return 0;
}

static void race_child(int rank, void *ctx, hp_sh_out *o) {
    hp__shm_join_hook = hold_joiner;
    hp_sh_group_child(rank, ctx, o);
}

Test(comm_shm, failure_right_after_join_is_not_a_join_failure, .timeout = 30) {
    cr_assert_eq(pipe(race_pipe), 0);
    hp_sh_group g;
    hp_sh_group_init(&g, 2, 20, 0, badarg_after_join_body, NULL);
    pid_t pids[2];
    int fds[2];
    hp_sh_out outs[2];
    for (int r = 0; r < 2; r++) pids[r] = hp_sh_spawn(race_child, r, &g, &fds[r]);
    for (int r = 0; r < 2; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    close(race_pipe[0]);
    close(race_pipe[1]);
    cr_assert_eq(outs[0].status, HP_INVALID, "%s", outs[0].msg);
    cr_assert_eq(outs[1].status, HP_IO, "%s", outs[1].msg);
    cr_assert(strstr(outs[1].msg, "all_reduce #1 aborted: rank 0 failed: all_reduce #1: bad dtype"),
              "%s", outs[1].msg);
    cr_assert(!hp_sh_exists(g.name));
    hp_sh_assert_clean();
}

/* ---- a hung peer: timeout -------------------------------------------------------------------- */

static int hung_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    CALL(c->vt->barrier(c, err), "barrier #1");
    if (rank == 2) nap_ms(1000);
    hp_err e = {0};
    int64_t t0 = hp_sh_now_ns();
    o->status = c->vt->barrier(c, &e);
    o->t_ns = hp_sh_now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    return 0;
}

Test(comm_shm, hung_peer_times_out, .timeout = 30) {
    hp_sh_group g;
    hp_sh_group_init(&g, 3, 0.5, 0, hung_body, NULL);
    hp_sh_out outs[3];
    hp_sh_run_group(&g, outs);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(outs[r].status, HP_IO, "rank %d: %s", r, outs[r].msg);
        cr_assert(strstr(outs[r].msg, "rank 2 did not reach barrier #2 within 0.5 s"),
                  "rank %d: %s", r, outs[r].msg);
        cr_assert(outs[r].t_ns > 400000000LL && outs[r].t_ns < 1000000000LL, "rank %d: %lld ns", r,
                  (long long)outs[r].t_ns);
    }
    /* The late rank arrives to a broken hp_sh_group and fails at once. */
    cr_assert_eq(outs[2].status, HP_IO, "%s", outs[2].msg);
    cr_assert(strstr(outs[2].msg, "barrier #2 aborted: rank"), "%s", outs[2].msg);
    cr_assert(outs[2].t_ns < 200000000LL, "late rank took %lld ns", (long long)outs[2].t_ns);
    hp_sh_assert_clean();
}

/* ---- a killed peer: reported within 1 s, no hang --------------------------------------------- */

typedef struct kill_ctx {
    int victim;
    int ready[2]; /* the victim writes a byte once it is inside the collective loop */
} kill_ctx;

static int kill_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    kill_ctx *k = ctx;
    size_t bytes = 1 << 20;
    uint8_t *send = calloc(1, bytes), *recv = malloc(bytes * (size_t)c->world);
    hp_err e = {0};
    hp_status s = HP_OK;
    int64_t end = hp_sh_now_ns() + 15000000000LL;
    for (int it = 0; s == HP_OK && hp_sh_now_ns() < end; it++) {
        s = c->vt->all_gather(c, send, recv, bytes, &e);
        if (it == 3 && rank == k->victim) {
            char b = 1;
            if (write(k->ready[1], &b, 1) != 1) break;
        }
    }
    o->t_ns = hp_sh_now_ns();
    o->status = s;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    free(send);
    free(recv);
    return 0;
}

static void run_kill(int world, int victim) {
    kill_ctx k = {victim, {-1, -1}};
    cr_assert_eq(pipe(k.ready), 0);
    hp_sh_group g;
    hp_sh_group_init(&g, world, 30, 0, kill_body, &k);
    pid_t pids[HP_SH_MAX_WORLD];
    int fds[HP_SH_MAX_WORLD];
    for (int r = 0; r < world; r++) pids[r] = hp_sh_spawn(hp_sh_group_child, r, &g, &fds[r]);
    char b;
    cr_assert_eq(read(k.ready[0], &b, 1), 1);
    nap_ms(50);
    int64_t t_kill = hp_sh_now_ns();
    kill(pids[victim], SIGKILL);
    hp_sh_out outs[HP_SH_MAX_WORLD];
    for (int r = 0; r < world; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
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
    cr_expect(!hp_sh_exists(g.name));
}

Test(comm_shm, killed_peer_detected, .timeout = 60) {
    run_kill(2, 1);
    run_kill(4, 2);
    run_kill(3, 0);
    hp_sh_assert_clean();
}

/* A process whose main thread has exited while another thread still runs is alive, though its
 * leader shows as a zombie; it is dead once the last thread is gone, reaped or not. */
static int gate[2] = {-1, -1};

static void *gated_thread(void *arg) {
    (void)arg;
    char b;
    ssize_t n = read(gate[0], &b, 1);
    _exit(n == 1 ? 0 : 1); /* not exit(): no Criterion atexit handlers in the child */
}

static char proc_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

Test(comm_shm, liveness_waits_for_every_thread, .timeout = 30) {
    cr_assert_eq(pipe(gate), 0);
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) {
        close(gate[1]); /* a test that fails early closes the gate: the thread reads EOF */
        pthread_t t;
        if (pthread_create(&t, NULL, gated_thread, NULL) != 0) _exit(2);
        syscall(SYS_exit, 0); /* the main thread only */
    }
    /* Polls a condition, bounded; not a sleep standing in for synchronization. */
    for (int i = 0; i < 5000 && proc_state(p) != 'Z'; i++) nap_ms(1);
    cr_assert_eq(proc_state(p), 'Z', "the leader did not exit");
    cr_assert(!hp__shm_pid_dead(p), "a process with a running thread reported dead");
    cr_assert_eq(write(gate[1], "x", 1), 1);
    siginfo_t si;
    cr_assert_eq(waitid(P_PID, (id_t)p, &si, WEXITED | WNOWAIT), 0); /* reapable, not reaped */
    cr_assert(hp__shm_pid_dead(p), "an exited, unreaped process reported alive");
    int ws = 0;
    cr_assert_eq(waitpid(p, &ws, 0), p);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %#x", ws);
    cr_assert(hp__shm_pid_dead(p));
    close(gate[0]);
    close(gate[1]);
}

/* ---- joining --------------------------------------------------------------------------------- */

typedef struct join_ctx {
    char name[64];
    int world;
    double timeout_s;
} join_ctx;

static void join_child(int rank, void *ctx, hp_sh_out *o) {
    join_ctx *j = ctx;
    hp_comm *c = NULL;
    hp_err e = {0};
    int64_t t0 = hp_sh_now_ns();
    o->status = hp_shm_comm_new(j->name, rank, j->world, j->timeout_s, &c, &e);
    o->t_ns = hp_sh_now_ns() - t0;
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
    hp_sh_fresh_name(j.name, sizeof j.name);
    j.world = 3;
    j.timeout_s = 0.4;
    int fds[2];
    pid_t p0 = hp_sh_spawn(join_child, 0, &j, &fds[0]);
    pid_t p1 = hp_sh_spawn(join_child, 1, &j, &fds[1]);
    hp_sh_out o0, o1;
    hp_sh_collect(p0, fds[0], &o0);
    hp_sh_collect(p1, fds[1], &o1);
    cr_assert_eq(o0.status, HP_IO, "%s", o0.msg);
    cr_assert(strstr(o0.msg, "rank 2 of 3 did not join within 0.4 s"), "%s", o0.msg);
    cr_assert_eq(o1.status, HP_IO, "%s", o1.msg);
    cr_assert(!hp_sh_exists(j.name));
    /* Rank 0 never comes. */
    hp_sh_fresh_name(j.name, sizeof j.name);
    j.world = 2;
    j.timeout_s = 0.3;
    p1 = hp_sh_spawn(join_child, 1, &j, &fds[1]);
    hp_sh_collect(p1, fds[1], &o1);
    cr_assert_eq(o1.status, HP_IO, "%s", o1.msg);
    cr_assert(strstr(o1.msg, "rank 0 did not create /dev/shm/hp-"), "%s", o1.msg);
    hp_sh_assert_clean();
}

Test(comm_shm, join_world_mismatch, .timeout = 30) {
    join_ctx a, b;
    hp_sh_fresh_name(a.name, sizeof a.name);
    a.world = 2;
    a.timeout_s = 0.3;
    b = a;
    b.world = 3;
    int fds[2];
    pid_t p0 = hp_sh_spawn(join_child, 0, &a, &fds[0]);
    pid_t p1 = hp_sh_spawn(join_child, 1, &b, &fds[1]);
    hp_sh_out o0, o1;
    hp_sh_collect(p0, fds[0], &o0);
    hp_sh_collect(p1, fds[1], &o1);
    cr_assert_eq(o1.status, HP_INVALID, "%s", o1.msg);
    cr_assert(strstr(o1.msg, "is for 2 ranks"), "%s", o1.msg);
    cr_assert_eq(o0.status, HP_IO, "%s", o0.msg);
    hp_sh_assert_clean();
}

/* A rank 0 that dies while waiting for the others leaves a stale segment behind. */
static void make_stale(const char *name, int world) {
    join_ctx j;
    snprintf(j.name, sizeof j.name, "%s", name);
    j.world = world;
    j.timeout_s = 30;
    int fd;
    pid_t p = hp_sh_spawn(join_child, 0, &j, &fd);
    for (int i = 0; i < 2000 && !hp_sh_exists(name); i++) nap_ms(1);
    cr_assert(hp_sh_exists(name));
    nap_ms(20); /* past init */
    kill(p, SIGKILL);
    hp_sh_out o;
    hp_sh_collect(p, fd, &o);
    cr_assert(hp_sh_exists(name), "the dead rank 0 should have left its segment");
}

static void run_join_pair(const char *name, int rank1_first, hp_sh_out *o) {
    join_ctx j;
    snprintf(j.name, sizeof j.name, "%s", name);
    j.world = 2;
    j.timeout_s = 5;
    int fds[2];
    pid_t p[2];
    if (rank1_first) {
        p[1] = hp_sh_spawn(join_child, 1, &j, &fds[1]);
        nap_ms(30); /* rank 1 finds the stale segment first */
        p[0] = hp_sh_spawn(join_child, 0, &j, &fds[0]);
    } else {
        p[0] = hp_sh_spawn(join_child, 0, &j, &fds[0]);
        p[1] = hp_sh_spawn(join_child, 1, &j, &fds[1]);
    }
    for (int r = 0; r < 2; r++) hp_sh_collect(p[r], fds[r], &o[r]);
}

Test(comm_shm, stale_segment_replaced, .timeout = 60) {
    char name[64];
    hp_sh_out o[2];
    for (int rank1_first = 0; rank1_first < 2; rank1_first++) {
        hp_sh_fresh_name(name, sizeof name);
        make_stale(name, 2 + rank1_first); /* the dead run may have had another world */
        run_join_pair(name, rank1_first, o);
        for (int r = 0; r < 2; r++) cr_assert(o[r].ok, "rank %d: %s", r, o[r].msg);
        cr_assert(!hp_sh_exists(name));
    }
    /* Garbage under the name (not even a header). */
    hp_sh_fresh_name(name, sizeof name);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/hp-%s", name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("junk", f);
    fclose(f);
    run_join_pair(name, 1, o);
    for (int r = 0; r < 2; r++) cr_assert(o[r].ok, "rank %d: %s", r, o[r].msg);
    cr_assert(!hp_sh_exists(name));
    hp_sh_assert_clean();
}

Test(comm_shm, live_segment_refused, .timeout = 30) {
    join_ctx j;
    hp_sh_fresh_name(j.name, sizeof j.name);
    j.world = 2;
    j.timeout_s = 0.5;
    int fd;
    pid_t p = hp_sh_spawn(join_child, 0, &j, &fd); /* a live rank 0 waiting for its rank 1 */
    for (int i = 0; i < 2000 && !hp_sh_exists(j.name); i++) nap_ms(1);
    nap_ms(20);
    hp_comm *c = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_shm_comm_new(j.name, 0, 2, 1, &c, &e), HP_IO);
    cr_assert_null(c);
    char want[64];
    snprintf(want, sizeof want, "its rank 0 is pid %d", (int)p);
    cr_assert(strstr(e.msg, "belongs to a live run") && strstr(e.msg, want), "%s", e.msg);
    hp_sh_out o;
    hp_sh_collect(p, fd, &o); /* times out on its own and unlinks */
    cr_assert_eq(o.status, HP_IO, "%s", o.msg);
    cr_assert(!hp_sh_exists(j.name));
    hp_sh_assert_clean();
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
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert(!hp_sh_exists(name));
    cr_assert_str_eq(c->vt->name, "shm");
    cr_assert_eq(c->vt->broadcast(c, NULL, 0, 0, &e), HP_OK);
    cr_assert_eq(c->vt->broadcast(c, NULL, 0, 1, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "broadcast #2: root 1 out of range [0, 1)"), "%s", e.msg);
    cr_assert_eq(c->vt->barrier(c, &e), HP_IO);
    cr_assert(strstr(e.msg, "unusable after an earlier error: broadcast #2"), "%s", e.msg);
    hp_comm_free(c);
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_reduce(c, NULL, NULL, -1, HP_COMM_F32, HP_REDUCE_SUM, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "bad count -1"), "%s", e.msg);
    hp_comm_free(c);
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_gather(c, NULL, NULL, 5, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "send is NULL"), "%s", e.msg);
    hp_comm_free(c);
    hp_comm_free(NULL);
    hp_sh_assert_clean();
}
