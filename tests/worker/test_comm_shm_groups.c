/* tests/worker/test_comm_shm_groups.c — the shm communicator's sub-communicators (split) and
 * all_to_all (worker/comm/shm_coll.c), with forked ranks (tests/util/shm_harness.h).
 *
 * Covered: a (dp=2, tp=2) mesh split into its dp and tp groups, 4x1 and 1x4 splits, keys that
 * reorder the ranks, ranks outside every group, nested splits; each group's collectives equal
 * the rank-order reference over the group's own ranks (bitwise), interleaved with the parent
 * and the other group, and a tp-then-dp i64 sum equal to the parent's; a peer killed inside a
 * group reported at once by its group and by the parent; a group member that dies before
 * joining; bad arguments and mismatched calls; all_to_all on 1..4 ranks over odd sizes, many
 * slot steps and in place, and all_to_all_single through the cpu backend's comm stream; the
 * same splits in an in-process (threads) group; nothing left in /dev/shm.
 */
#define _GNU_SOURCE
#include "hp/build.h"
#include "hp/comm.h"
#include "tests/util/shm_harness.h"
#include "worker/comm/shm_internal.h"
#include "worker/cpu/cpu_backend.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- all_to_all ------------------------------------------------------------------------------ */

/* Rank r's send chunk d, byte b, is gbyte(r, d * bytes + b): recv chunk j of rank me must then
 * hold gbyte(j, me * bytes + b). */
static int check_all_to_all(hp_comm *c, int rank, size_t bytes, int in_place, uint64_t salt,
                            hp_sh_out *o) {
    int world = c->world;
    size_t total = bytes * (size_t)world;
    uint8_t *send = calloc(total + 1, 1), *recv = calloc(total + 1, 1);
    for (size_t b = 0; b < total; b++) send[b] = hp_sh_gbyte(rank, b, salt);
    memset(recv, 0xa5, total);
    uint8_t *out = in_place ? send : recv;
    hp_err e = {0};
    hp_status s = c->vt->all_to_all(c, send, out, bytes, &e);
    long bad = -1;
    for (int j = 0; s == HP_OK && j < world && bad < 0; j++) {
        for (size_t b = 0; b < bytes; b++) {
            if (out[(size_t)j * bytes + b] != hp_sh_gbyte(j, (size_t)rank * bytes + b, salt)) {
                bad = (long)((size_t)j * bytes + b);
                break;
            }
        }
    }
    if (s == HP_OK) o->hash = hp_sh_fnv(o->hash, out, total);
    free(send);
    free(recv);
    CHECK(s == HP_OK, "all_to_all(%zu bytes per rank): %s", bytes, e.msg);
    CHECK(bad < 0, "all_to_all(%zu bytes per rank%s): byte %ld wrong", bytes,
          in_place ? ", in place" : "", bad);
    return 0;
}

static int a2a_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    const int *big = ctx;
    uint64_t salt = 1;
    if (*big) { /* 3 MB per rank with the default slot: several steps, a ragged last one */
        if (check_all_to_all(c, rank, 3000017, 0, salt++, o)) return 1;
        return check_all_to_all(c, rank, 3000017, 1, salt++, o);
    }
    static const size_t bytes[] = {0, 1, 3, 7, 64, 255, 256, 257, 1000, 4099, 10007};
    for (size_t k = 0; k < HP_ARRAY_LEN(bytes); k++) {
        if (check_all_to_all(c, rank, bytes[k], (int)k % 2, salt++, o)) return 1;
    }
    return 0;
}

Test(comm_shm_groups, all_to_all_sizes, .timeout = 120) {
    for (int big = 0; big < 2; big++) {
        for (int world = 1; world <= HP_SH_MAX_WORLD; world++) {
            hp_sh_group g;
            hp_sh_group_init(&g, world, 20, big ? 0 : 1024, a2a_body, &big);
            hp_sh_out outs[HP_SH_MAX_WORLD];
            hp_sh_run_group(&g, outs);
            for (int r = 0; r < world; r++) {
                cr_assert(outs[r].ok, "world %d rank %d: %s", world, r, outs[r].msg);
            }
        }
    }
    hp_sh_assert_clean();
}

/* ---- splits ---------------------------------------------------------------------------------- */

/* Expects c (NULL: no group) to be rank want_rank of a group whose parent ranks, in group
 * order, are members[0 .. n): an all_gather of the parent ranks shows the order. */
static int check_group(hp_comm *c, int parent_rank, const int *members, int n, hp_sh_out *o) {
    if (n == 0) {
        CHECK(c == NULL, "rank %d: a group where none was asked for", parent_rank);
        return 0;
    }
    CHECK(c != NULL, "rank %d: no group", parent_rank);
    CHECK(c->world == n, "rank %d: group of %d, want %d", parent_rank, c->world, n);
    CHECK(c->rank >= 0 && c->rank < n && members[c->rank] == parent_rank,
          "rank %d: group rank %d is the wrong place", parent_rank, c->rank);
    int32_t mine = parent_rank, got[HP_SH_MAX_WORLD] = {0};
    CALL(c->vt->all_gather(c, &mine, got, sizeof mine, err), "all_gather of parent ranks");
    for (int i = 0; i < n; i++) {
        CHECK(got[i] == members[i], "group rank %d is parent rank %d, want %d", i, got[i],
              members[i]);
    }
    return 0;
}

/* The (dp=2, tp=2) mesh of 4 ranks, rank = dp * 2 + tp: tp groups {0,1} {2,3} (color dp),
 * dp groups {0,2} {1,3} (color tp). */
static int mesh_split(hp_comm *c, int rank, hp_comm **tp, hp_comm **dp, hp_sh_out *o) {
    int dpi = rank / 2, tpi = rank % 2;
    CALL(c->vt->split(c, dpi, rank, tp, err), "split tp");
    CALL(c->vt->split(c, tpi, rank, dp, err), "split dp");
    int tp_members[2] = {dpi * 2, dpi * 2 + 1}, dp_members[2] = {tpi, tpi + 2};
    if (check_group(*tp, rank, tp_members, 2, o)) return 1;
    return check_group(*dp, rank, dp_members, 2, o);
}

/* Collectives on the parent and both groups, interleaved; every one checked against the
 * reference over its own communicator's ranks (salts differ per group, so a rank reading
 * another group's data would show). */
static int mesh_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    hp_comm *tp = NULL, *dp = NULL;
    int rc = mesh_split(c, rank, &tp, &dp, o);
    uint64_t ts = 1000 + 100 * (uint64_t)(rank / 2), ds = 2000 + 100 * (uint64_t)(rank % 2);
    uint64_t ps = 3000;
    static const size_t counts[] = {0, 1, 7, 100, 1000, 4097};
    for (size_t k = 0; rc == 0 && k < HP_ARRAY_LEN(counts); k++) {
        size_t n = counts[k];
        int ip = (int)k % 2;
        for (int dt = 0; rc == 0 && dt < 3; dt++) {
            rc = hp_sh_check_all_reduce(tp, tp->rank, n, dt, HP_REDUCE_SUM, ip, ts++, o) ||
                 hp_sh_check_all_reduce(c, rank, n, dt, HP_REDUCE_AVG, ip, ps++, o) ||
                 hp_sh_check_all_reduce(dp, dp->rank, n, dt, HP_REDUCE_MAX, !ip, ds++, o) ||
                 hp_sh_check_reduce_scatter(dp, dp->rank, n, dt, HP_REDUCE_SUM, ip, ds++, o) ||
                 hp_sh_check_reduce_scatter(tp, tp->rank, n, dt, HP_REDUCE_AVG, !ip, ts++, o);
        }
        rc = rc || hp_sh_check_all_gather(tp, tp->rank, n * 3 + 1, ip, ts++, o) ||
             hp_sh_check_broadcast(dp, dp->rank, n + 5, (int)k % 2, ds++, o) ||
             check_all_to_all(tp, tp->rank, n + 3, ip, ts++, o) ||
             check_all_to_all(c, rank, n, !ip, ps++, o) ||
             check_all_to_all(dp, dp->rank, n * 2 + 1, !ip, ds++, o);
    }
    /* Hierarchical i64 sum (exact): over tp, then over dp, equals the parent's sum. */
    int64_t x[5], y[5];
    for (int i = 0; i < 5; i++) x[i] = y[i] = (int64_t)(rank + 1) * 1000003 * (i + 1) - 7 * i;
    if (rc == 0) {
        CALL(tp->vt->all_reduce(tp, x, x, 5, HP_COMM_I64, HP_REDUCE_SUM, err), "tp sum");
        CALL(dp->vt->all_reduce(dp, x, x, 5, HP_COMM_I64, HP_REDUCE_SUM, err), "dp sum");
        CALL(c->vt->all_reduce(c, y, y, 5, HP_COMM_I64, HP_REDUCE_SUM, err), "world sum");
        CHECK(memcmp(x, y, sizeof x) == 0, "tp-then-dp sum differs from the world sum");
    }
    hp_comm_free(tp);
    hp_comm_free(dp);
    return rc;
}

Test(comm_shm_groups, mesh_2x2_collectives, .timeout = 120) {
    /* 1 KiB slots (inherited by the groups): everything above 512 bytes takes many steps. */
    for (int slot = 0; slot < 2; slot++) {
        hp_sh_group g;
        hp_sh_group_init(&g, 4, 20, slot ? 0 : 1024, mesh_body, NULL);
        hp_sh_out outs[4];
        hp_sh_run_group(&g, outs);
        for (int r = 0; r < 4; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
    }
    hp_sh_assert_clean();
}

/* 4x1 with reversed keys, 1x4, ranks outside every group, equal keys (parent order), a nested
 * split; then the parent is freed and the groups go on without it. */
static void orders_child(int rank, void *ctx, hp_sh_out *o) {
    const hp_sh_group *g = ctx;
    hp_comm *c = NULL, *all = NULL, *solo = NULL, *odd = NULL, *even = NULL, *nest = NULL;
    hp_err e = {0};
    if (hp__shm_comm_new_ex(g->name, rank, 4, g->timeout_s, 0, &c, &e) != HP_OK) {
        snprintf(o->msg, sizeof o->msg, "join: %s", e.msg);
        return;
    }
    int rc = 0;
#define STEP(expr, what)                                                                           \
    do {                                                                                           \
        hp_err e_ = {0};                                                                           \
        if (rc == 0 && (expr) != HP_OK) {                                                          \
            snprintf(o->msg, sizeof o->msg, "rank %d: %s: %s", rank, what, e_.msg);                \
            rc = 1;                                                                                \
        }                                                                                          \
    } while (0)
    STEP(c->vt->split(c, 7, 3 - rank, &all, &e_), "split 4x1 reversed");
    STEP(c->vt->split(c, rank, 0, &solo, &e_), "split 1x4");
    STEP(c->vt->split(c, rank % 2 ? 5 : -1, 0, &odd, &e_), "split odd ranks");
    STEP(c->vt->split(c, rank % 2 ? -3 : 0, 0, &even, &e_), "split even ranks");
    int rev[4] = {3, 2, 1, 0}, odds[2] = {1, 3}, evens[2] = {0, 2};
    if (rc == 0) rc = check_group(all, rank, rev, 4, o);
    if (rc == 0) rc = check_group(solo, rank, &rank, 1, o);
    if (rc == 0) rc = check_group(odd, rank, rank % 2 ? odds : NULL, rank % 2 ? 2 : 0, o);
    if (rc == 0) rc = check_group(even, rank, rank % 2 ? NULL : evens, rank % 2 ? 0 : 2, o);
    /* The reversed group reduces in its own rank order: its rank 0 is parent rank 3. */
    if (rc == 0) rc = hp_sh_check_all_reduce(all, all->rank, 1000, HP_COMM_F32, 0, 0, 77, o);
    if (rc == 0) rc = hp_sh_check_all_reduce(solo, 0, 9, HP_COMM_F64, HP_REDUCE_AVG, 1, 78, o);
    if (rc == 0) rc = check_all_to_all(solo, 0, 9, 0, 79, o);
    /* Nested: split the reversed group again, reversing back (its group ranks 3..0 are parent
     * ranks 0..3). */
    if (rc == 0) STEP(all->vt->split(all, 0, -all->rank, &nest, &e_), "nested split");
    int fwd[4] = {0, 1, 2, 3};
    if (rc == 0) rc = check_group(nest, rank, fwd, 4, o);
    hp_comm_free(c);
    if (rc == 0) rc = hp_sh_check_all_reduce(nest, nest->rank, 300, HP_COMM_I64, 0, 0, 80, o);
    if (rc == 0) rc = hp_sh_check_broadcast(all, all->rank, 3000, 1, 81, o);
    if (odd && rc == 0) STEP(odd->vt->barrier(odd, &e_), "odd barrier");
    if (even && rc == 0) STEP(even->vt->barrier(even, &e_), "even barrier");
#undef STEP
    hp_comm_free(all);
    hp_comm_free(solo);
    hp_comm_free(odd);
    hp_comm_free(even);
    hp_comm_free(nest);
    o->ok = rc == 0;
}

Test(comm_shm_groups, split_orders_and_lifetimes, .timeout = 60) {
    hp_sh_group g;
    hp_sh_group_init(&g, 4, 20, 0, NULL, NULL);
    pid_t pids[4];
    int fds[4];
    hp_sh_out outs[4];
    for (int r = 0; r < 4; r++) pids[r] = hp_sh_spawn(orders_child, r, &g, &fds[r]);
    for (int r = 0; r < 4; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    for (int r = 0; r < 4; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
    hp_sh_assert_clean();
}

/* ---- a peer killed inside a group ------------------------------------------------------------ */

typedef struct kill_ctx {
    int ready[2]; /* the victim writes a byte once it is inside the loop */
} kill_ctx;

/* Victim: parent rank 3, group rank 1 of tp group {2, 3}. Ranks 2 and 3 loop all_gathers in
 * their tp group; ranks 0 and 1 run a few in theirs. Then every survivor waits in a parent
 * barrier, which the victim never reaches. o->status and o->t_ns are the first failure's. */
static int kill_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    kill_ctx *k = ctx;
    hp_comm *tp = NULL, *dp = NULL;
    if (mesh_split(c, rank, &tp, &dp, o)) return 1;
    size_t bytes = 1 << 18;
    uint8_t *send = calloc(1, bytes), *recv = malloc(bytes * 2);
    hp_err e = {0};
    hp_status s = HP_OK;
    int64_t end = hp_sh_now_ns() + 15000000000LL;
    for (int it = 0; s == HP_OK && hp_sh_now_ns() < end && (rank >= 2 || it < 10); it++) {
        s = tp->vt->all_gather(tp, send, recv, bytes, &e);
        if (it == 3 && rank == 3) {
            char b = 1;
            if (write(k->ready[1], &b, 1) != 1) break;
        }
    }
    o->t_ns = hp_sh_now_ns();
    hp_err e2 = {0};
    hp_status ps = c->vt->barrier(c, &e2);
    if (s == HP_OK) o->t_ns = hp_sh_now_ns();
    o->status = s != HP_OK ? s : ps;
    snprintf(o->msg, sizeof o->msg, "%s", s != HP_OK ? e.msg : e2.msg);
    free(send);
    free(recv);
    hp_comm_free(tp);
    hp_comm_free(dp);
    CHECK(ps != HP_OK, "the parent barrier passed without rank 3");
    return 0;
}

Test(comm_shm_groups, killed_peer_in_group, .timeout = 60) {
    kill_ctx k;
    cr_assert_eq(pipe(k.ready), 0);
    hp_sh_group g;
    hp_sh_group_init(&g, 4, 30, 0, kill_body, &k);
    pid_t pids[4];
    int fds[4];
    for (int r = 0; r < 4; r++) pids[r] = hp_sh_spawn(hp_sh_group_child, r, &g, &fds[r]);
    char b;
    cr_assert_eq(read(k.ready[0], &b, 1), 1);
    int64_t t_kill = hp_sh_now_ns();
    kill(pids[3], SIGKILL);
    hp_sh_out outs[4];
    for (int r = 0; r < 4; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    close(k.ready[0]);
    close(k.ready[1]);
    char want[64];
    /* Its group names it by its group rank, the parent by its parent rank. */
    snprintf(want, sizeof want, "rank 1 (pid %d) died before reaching all_gather #", (int)pids[3]);
    cr_assert_eq(outs[2].status, HP_IO, "%s", outs[2].msg);
    cr_assert(strstr(outs[2].msg, want), "%s", outs[2].msg);
    cr_assert(strstr(outs[2].msg, ".s1c1'"), "names the tp group's segment: %s", outs[2].msg);
    snprintf(want, sizeof want, "rank 3 (pid %d) died before reaching barrier #", (int)pids[3]);
    for (int r = 0; r < 3; r++) {
        if (r < 2) {
            cr_assert_eq(outs[r].status, HP_IO, "rank %d: %s", r, outs[r].msg);
            cr_assert(strstr(outs[r].msg, want), "rank %d: %s", r, outs[r].msg);
        }
        cr_assert(outs[r].t_ns - t_kill < 1000000000LL, "rank %d noticed after %lld ns", r,
                  (long long)(outs[r].t_ns - t_kill));
    }
    cr_expect(!hp_sh_exists(g.name));
    hp_sh_assert_clean();
}

/* A group member known to be dead (the parent's pid of it) is reported without waiting for
 * the timeout, whether it is the group's rank 0 (which would create the segment) or not. */
Test(comm_shm_groups, member_dead_before_joining, .timeout = 30) {
    pid_t dead = fork();
    cr_assert(dead >= 0);
    if (dead == 0) _exit(0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    char name[64];
    hp_sh_fresh_name(name, sizeof name);
    int32_t pids[2] = {(int32_t)dead, (int32_t)getpid()};
    hp_comm *c = (hp_comm *)1;
    hp_err e = {0};
    int64_t t0 = hp_sh_now_ns();
    cr_assert_eq(hp__shm_group_new(name, 1, 2, 10, 0, pids, &c, &e), HP_IO, "%s", e.msg);
    cr_assert_null(c);
    char want[64];
    snprintf(want, sizeof want, "rank 0 (pid %d) died before creating", (int)dead);
    cr_assert(strstr(e.msg, want), "%s", e.msg);
    pids[0] = (int32_t)getpid();
    pids[1] = (int32_t)dead;
    cr_assert_eq(hp__shm_group_new(name, 0, 2, 10, 0, pids, &c, &e), HP_IO, "%s", e.msg);
    snprintf(want, sizeof want, "rank 1 (pid %d) died while the ranks joined", (int)dead);
    cr_assert(strstr(e.msg, want), "%s", e.msg);
    cr_assert(hp_sh_now_ns() - t0 < 2000000000LL, "took the timeout");
    cr_assert(!hp_sh_exists(name));
    hp_sh_assert_clean();
}

/* ---- bad arguments and mismatches ------------------------------------------------------------ */

typedef struct bad_ctx {
    int variant;
} bad_ctx;

static int bad_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    const bad_ctx *b = ctx;
    hp_comm *sub = NULL;
    hp_err e = {0};
    int64_t t0 = hp_sh_now_ns();
    uint8_t buf[64] = {0};
    switch (b->variant) {
    case 0: /* out NULL on rank 0 */
        o->status = c->vt->split(c, 0, 0, rank == 0 ? NULL : &sub, &e);
        break;
    case 1: /* split against a barrier */
        o->status = rank == 1 ? c->vt->barrier(c, &e) : c->vt->split(c, 0, 0, &sub, &e);
        break;
    case 2: /* all_to_all with a size that overflows, against a valid one */
        o->status = c->vt->all_to_all(c, buf, buf, rank == 0 ? SIZE_MAX / 2 + 1 : 8, &e);
        break;
    default: /* all_to_all sizes differ */
        o->status = c->vt->all_to_all(c, buf, buf, rank == 0 ? 8 : 16, &e);
        break;
    }
    o->t_ns = hp_sh_now_ns() - t0;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    CHECK(sub == NULL, "a group after a failed split");
    hp_err e2 = {0};
    CHECK(c->vt->split(c, 0, 0, &sub, &e2) == HP_IO && strstr(e2.msg, "unusable") && !sub,
          "split on a broken communicator: %s", e2.msg);
    return 0;
}

Test(comm_shm_groups, bad_arguments_fail_peers_fast, .timeout = 60) {
    static const char *const want0[] = {
        "split #1: out is NULL",
        "collective #1 differs: rank 0 called split, rank 1 called barrier",
        "all_to_all #1: size overflows",
        "rank 0 called all_to_all(8 bytes per rank), rank 1 called all_to_all(16 bytes per rank)"};
    static const char *const want1[] = {"split #1 aborted: rank 0 failed: split #1: out is NULL",
                                        "rank 0 called split, rank 1 called barrier",
                                        "all_to_all #1 aborted: rank 0 failed: all_to_all #1: size",
                                        "rank 1 called all_to_all(16 bytes per rank)"};
    for (int v = 0; v < 4; v++) {
        bad_ctx b = {v};
        hp_sh_group g;
        hp_sh_group_init(&g, 2, 20, 0, bad_body, &b);
        hp_sh_out outs[2];
        hp_sh_run_group(&g, outs);
        for (int r = 0; r < 2; r++)
            cr_assert(outs[r].ok, "variant %d rank %d: %s", v, r, outs[r].msg);
        cr_assert_eq(outs[0].status, v == 0 || v == 2 ? HP_INVALID : HP_IO, "%s", outs[0].msg);
        cr_assert(strstr(outs[0].msg, want0[v]), "variant %d: %s", v, outs[0].msg);
        cr_assert_eq(outs[1].status, HP_IO, "%s", outs[1].msg);
        cr_assert(strstr(outs[1].msg, want1[v]), "variant %d: %s", v, outs[1].msg);
        cr_assert(outs[1].t_ns < 1000000000LL, "variant %d: peer took %lld ns", v,
                  (long long)outs[1].t_ns);
    }
    hp_sh_assert_clean();
}

Test(comm_shm_groups, bad_arguments_one_rank) {
    char name[64];
    hp_comm *c = NULL, *sub = (hp_comm *)1;
    hp_err e = {0};
    uint8_t buf[16] = {0};
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->split(c, -5, 0, &sub, &e), HP_OK, "%s", e.msg);
    cr_assert_null(sub);
    cr_assert_eq(c->vt->all_to_all(c, NULL, NULL, 0, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_to_all(c, buf, buf + 1, 8, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "all_to_all #3: send and recv overlap"), "%s", e.msg);
    hp_comm_free(c);
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_to_all(c, NULL, buf, 4, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "all_to_all #1: send is NULL"), "%s", e.msg);
    hp_comm_free(c);
    hp_sh_fresh_name(name, sizeof name);
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->split(c, 0, 0, NULL, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "split #1: out is NULL"), "%s", e.msg);
    hp_comm_free(c);
    cr_assert_eq(hp__shm_group_new("a/b", 0, 1, 1, 0, NULL, &c, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "bad group name 'a/b'"), "%s", e.msg);
    hp_sh_assert_clean();
}

/* ---- in-process group (threads) -------------------------------------------------------------- */

typedef struct thread_arg {
    hp_comm *c;
    hp_sh_out o;
    pthread_t t;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    a->o.ok = mesh_body(a->c, a->c->rank, NULL, &a->o) == 0;
    return NULL;
}

Test(comm_shm_groups, local_threads_mesh, .timeout = 60) {
    hp_comm *cs[4];
    hp_err e;
    cr_assert_eq(hp__shm_comm_new_local(4, 10, 1024, cs, &e), HP_OK, "%s", e.msg);
    thread_arg a[4];
    memset(a, 0, sizeof a);
    for (int r = 0; r < 4; r++) {
        a[r].c = cs[r];
        cr_assert_eq(pthread_create(&a[r].t, NULL, thread_main, &a[r]), 0);
    }
    for (int r = 0; r < 4; r++) pthread_join(a[r].t, NULL);
    for (int r = 0; r < 4; r++) {
        cr_assert(a[r].o.ok, "rank %d: %s", r, a[r].o.msg);
        hp_comm_free(cs[r]);
    }
}

/* ---- all_to_all_single through the cpu backend's comm stream --------------------------------- */

typedef struct cpu_arg {
    hp_comm *c;
    const hp_graph *g;
    int node;
    hp_status st;
    hp_err err;
    float out[12];
    pthread_t t;
} cpu_arg;

/* Rank r's input element i is 100 r + i, f32[4, 3] in two chunks of 6 over 2 ranks. */
static void *cpu_rank(void *p) {
    cpu_arg *a = p;
    hp_backend *be = NULL;
    float in[12];
    for (int i = 0; i < 12; i++) in[i] = (float)(100 * a->c->rank + i);
    hp_type t = *hp_graph_type(a->g, a->g->nodes[a->node].in[0]);
    hp_type ot = hp_graph_type(a->g, (hp_value){a->node, 0})[0];
    const void *ins[1] = {in};
    void *outs[1] = {a->out};
    hp_kernel_call call = {.node = &a->g->nodes[a->node],
                           .n_in = 1,
                           .n_out = 1,
                           .in = ins,
                           .in_type = &t,
                           .out = outs,
                           .out_type = &ot};
    a->st = hp_cpu_backend_new(1, &be, &a->err);
    if (a->st == HP_OK) a->st = hp_cpu_backend_set_comm(be, a->c, &a->err);
    if (a->st == HP_OK) a->st = be->vt->collective(be, HP_STREAM_COMM, &call, &a->err);
    if (a->st == HP_OK) a->st = be->vt->synchronize(be, &a->err);
    hp_backend_free(be);
    return NULL;
}

/* ty: 12 f32 elements, two parts of 6 over 2 ranks: [4, 3] (dim 0's chunks) or [1, 2, 6]
 * (spmd's Shard(a) -> Shard(b) piece: dim 0 is 1, dim 1's chunks). */
static void cpu_all_to_all_single(hp_type ty) {
    hp_graph *g = hp_graph_new();
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ty, NULL);
    hp_value y =
        hp_build(g, HP_OP_ALL_TO_ALL, &x, 1, (hp_attr[]){hp_attr_int(HP_ATTR_GROUP_SIZE, 2)}, 1);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    hp_comm *cs[2];
    hp_err e;
    cr_assert_eq(hp__shm_comm_new_local(2, 10, 0, cs, &e), HP_OK, "%s", e.msg);
    cpu_arg a[2];
    memset(a, 0, sizeof a);
    for (int r = 0; r < 2; r++) {
        a[r] = (cpu_arg){.c = cs[r], .g = g, .node = y.node};
        cr_assert_eq(pthread_create(&a[r].t, NULL, cpu_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(a[r].t, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(a[r].st, HP_OK, "rank %d: %s", r, a[r].err.msg);
        /* out chunk j = rank j's input chunk r */
        for (int j = 0; j < 2; j++) {
            for (int k = 0; k < 6; k++) {
                cr_assert_eq(a[r].out[j * 6 + k], (float)(100 * j + 6 * r + k), "rank %d out[%d]",
                             r, j * 6 + k);
            }
        }
        hp_comm_free(cs[r]);
    }
    hp_graph_free(g);
}

/* local_chunk through the comm stream: each rank keeps its own chunk along dim 1, nothing
 * exchanged. f32[3, 4] -> f32[3, 2]: rank r's row i is its input's columns 2r, 2r + 1. */
Test(comm_shm_groups, cpu_backend_local_chunk, .timeout = 30) {
    hp_graph *g = hp_graph_new();
    hp_type ty = {.dtype = HP_F32, .rank = 2, .shape = {3, 4}};
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ty, NULL);
    hp_attr la[3] = {hp_attr_int(HP_ATTR_DIM, 1), hp_attr_int(HP_ATTR_GROUP_SIZE, 2),
                     hp_attr_str(HP_ATTR_GROUP, "tp")};
    hp_value y = hp_build(g, HP_OP_LOCAL_CHUNK, &x, 1, la, 3);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    hp_comm *cs[2];
    hp_err e;
    cr_assert_eq(hp__shm_comm_new_local(2, 10, 0, cs, &e), HP_OK, "%s", e.msg);
    cpu_arg a[2];
    memset(a, 0, sizeof a);
    for (int r = 0; r < 2; r++) {
        a[r] = (cpu_arg){.c = cs[r], .g = g, .node = y.node};
        cr_assert_eq(pthread_create(&a[r].t, NULL, cpu_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(a[r].t, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(a[r].st, HP_OK, "rank %d: %s", r, a[r].err.msg);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 2; j++)
                cr_assert_eq(a[r].out[i * 2 + j], (float)(100 * r + i * 4 + 2 * r + j),
                             "rank %d out[%d][%d]", r, i, j);
        hp_comm_free(cs[r]);
    }
    hp_graph_free(g);
}

Test(comm_shm_groups, cpu_backend_all_to_all_single, .timeout = 30) {
    cpu_all_to_all_single((hp_type){.dtype = HP_F32, .rank = 2, .shape = {4, 3}});
    cpu_all_to_all_single((hp_type){.dtype = HP_F32, .rank = 3, .shape = {1, 2, 6}});
}
