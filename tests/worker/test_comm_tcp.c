/* tests/worker/test_comm_tcp.c — the tcp communicator (worker/comm/tcp.c, tcp_coll.c) on
 * 127.0.0.1, port 0 only.
 *
 * Ranks are forked processes (tests/util/shm_harness.h); they meet through the address file
 * (rank 0 writes it, the others poll). Covered: SHA-256 / HMAC test vectors; every collective
 * at world 1..4 over odd sizes, all dtypes and ops, in place, checked bitwise against the
 * rank-order reference the shm tests use; results bitwise equal to a shm communicator's on the
 * same inputs in the same process; split into a 2x2 mesh's groups (and color -1); a call
 * mismatch; a rank that never comes to a collective (timeout naming it); a killed peer
 * (HP_IO for a closed connection, not a timeout); garbage and wrong-secret connections
 * refused while the real peer still joins; forged frames (junk, a huge length) from a peer;
 * bad options.
 */
#define _GNU_SOURCE
#include "hp/comm.h"
#include "tests/util/shm_harness.h"
#include "worker/comm/sha256.h"
#include "worker/comm/shm_internal.h"
#include "worker/comm/tcp_internal.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SECRET "0123456789abcdef0123456789abcdef"

/* ---- SHA-256 --------------------------------------------------------------------------------- */

static void hex(const uint8_t *b, char *out) {
    for (int i = 0; i < HP__SHA256_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

Test(comm_tcp, sha256_vectors) {
    uint8_t d[HP__SHA256_BYTES];
    char h[65];
    hp__sha256 s;
    hp__sha256_init(&s);
    hp__sha256_update(&s, "abc", 3);
    hp__sha256_final(&s, d);
    hex(d, h);
    cr_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 2 blocks */
    hp__sha256_init(&s);
    hp__sha256_update(&s, two, strlen(two));
    hp__sha256_final(&s, d);
    hex(d, h);
    cr_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* RFC 4231 test case 2, the message in two parts */
    const void *parts[2] = {"what do ya want ", "for nothing?"};
    const size_t lens[2] = {16, 12};
    hp__hmac_sha256("Jefe", 4, parts, lens, 2, d);
    hex(d, h);
    cr_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

/* ---- forked ranks meeting through the address file ------------------------------------------- */

typedef struct group {
    char path[256];
    int world;
    double timeout_s;
    const char *secret; /* NULL: SECRET */
    hp_sh_body body;
    void *ctx;
    int kill_rank; /* >= 0: this rank SIGKILLs itself right after joining */
} group;

static hp_status publish_file(const char *addr, void *ctx, hp_err *err) {
    const group *g = ctx;
    return hp_tcp_addr_file_write(g->path, addr, SECRET, err);
}

/* Joins g as `rank`: rank 0 listens and writes the file, the others read it. */
static hp_status join(group *g, int rank, hp_comm **c, hp_err *e) {
    char addr[128] = "", secret[128] = SECRET;
    if (rank > 0 && g->world > 1)
        HP_TRY(hp_tcp_addr_file_wait(g->path, g->timeout_s, addr, sizeof addr, secret,
                                     sizeof secret, e));
    hp_tcp_opts o = {.rank = rank,
                     .world = g->world,
                     .timeout_s = g->timeout_s,
                     .secret = g->secret ? g->secret : secret,
                     .addr = addr,
                     .publish = publish_file,
                     .publish_ctx = g};
    return hp_tcp_comm_new(&o, c, e);
}

static void group_child(int rank, void *ctx, hp_sh_out *o) {
    group *g = ctx;
    hp_comm *c = NULL;
    hp_err e = {0};
    hp_status s = join(g, rank, &c, &e);
    o->status = s;
    if (s != HP_OK) {
        snprintf(o->msg, sizeof o->msg, "join: %s", e.msg);
        return;
    }
    if (rank == g->kill_rank) raise(SIGKILL);
    o->ok = g->body(c, rank, g->ctx, o) == 0;
    hp_comm_free(c);
}

static void group_init(group *g, int world, double timeout_s, hp_sh_body body, void *ctx) {
    memset(g, 0, sizeof *g);
    char name[64];
    hp_sh_fresh_name(name, sizeof name);
    snprintf(g->path, sizeof g->path, "/tmp/hp-tcp-%s.addr", name);
    unlink(g->path);
    g->world = world;
    g->timeout_s = timeout_s;
    g->body = body;
    g->ctx = ctx;
    g->kill_rank = -1;
}

static void run_group(group *g, hp_sh_out *outs) {
    pid_t pids[HP_SH_MAX_WORLD];
    int fds[HP_SH_MAX_WORLD];
    for (int r = 0; r < g->world; r++) pids[r] = hp_sh_spawn(group_child, r, g, &fds[r]);
    for (int r = 0; r < g->world; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    unlink(g->path);
}

/* ---- every collective ------------------------------------------------------------------------ */

static int check_all_to_all(hp_comm *c, int rank, size_t bytes, int in_place, uint64_t salt,
                            hp_sh_out *o) {
    const int world = c->world;
    size_t total = bytes * (size_t)world;
    uint8_t *send = malloc(total + 1), *recv = in_place ? send : malloc(total + 1);
    CHECK(send && recv, "out of memory");
    for (int d = 0; d < world; d++)
        for (size_t b = 0; b < bytes; b++)
            send[(size_t)d * bytes + b] = hp_sh_gbyte(rank * 16 + d, b, salt);
    CALL(c->vt->all_to_all(c, send, recv, bytes, err), "all_to_all");
    for (int j = 0; j < world; j++)
        for (size_t b = 0; b < bytes; b++)
            CHECK(recv[(size_t)j * bytes + b] == hp_sh_gbyte(j * 16 + rank, b, salt),
                  "all_to_all %zu bytes: chunk %d byte %zu differs", bytes, j, b);
    o->hash = hp_sh_fnv(o->hash, &bytes, sizeof bytes);
    if (!in_place) free(recv);
    free(send);
    return 0;
}

static int suite_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    uint64_t salt = 1;
    static const size_t counts[] = {0, 1, 3, 7, 100, 4097, 300001};
    static const size_t bytes[] = {0, 1, 5, 257, 10007, 3000017};
    for (int dt = 0; dt < 3; dt++) {
        for (int op = 0; op < 3; op++) {
            for (size_t k = 0; k < HP_ARRAY_LEN(counts); k++) {
                int in_place = (int)k % 2;
                if (hp_sh_check_all_reduce(c, rank, counts[k], dt, op, in_place, salt++, o))
                    return 1;
                if (hp_sh_check_reduce_scatter(c, rank, counts[k], dt, op, !in_place, salt++, o))
                    return 1;
            }
        }
    }
    for (size_t k = 0; k < HP_ARRAY_LEN(bytes); k++) {
        if (hp_sh_check_all_gather(c, rank, bytes[k], (int)k % 2, salt++, o)) return 1;
        for (int root = 0; root < c->world; root++)
            if (hp_sh_check_broadcast(c, rank, bytes[k], root, salt++, o)) return 1;
        if (check_all_to_all(c, rank, bytes[k] / 4, (int)k % 2, salt++, o)) return 1;
        CALL(c->vt->barrier(c, err), "barrier");
    }
    return 0;
}

Test(comm_tcp, collectives_world_1_to_4, .timeout = 240) {
    for (int world = 1; world <= HP_SH_MAX_WORLD; world++) {
        group g;
        group_init(&g, world, 30, suite_body, NULL);
        hp_sh_out outs[HP_SH_MAX_WORLD];
        run_group(&g, outs);
        for (int r = 0; r < world; r++) {
            cr_assert(outs[r].ok, "world %d rank %d: %s", world, r, outs[r].msg);
            cr_assert_eq(outs[r].hash, outs[0].hash, "world %d: rank %d differs from rank 0", world,
                         r);
        }
    }
}

/* ---- bitwise the same as shm ----------------------------------------------------------------- */

typedef struct vs_shm {
    char shm_name[64];
} vs_shm;

static int vs_shm_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    const vs_shm *v = ctx;
    hp_comm *s = NULL;
    CALL(hp_shm_comm_new(v->shm_name, rank, c->world, 30, &s, err), "shm join");
    const size_t n = 100003;
    for (int dt = 0; dt < 3; dt++) {
        for (int op = 0; op < 3; op++) {
            size_t es = hp_sh_esz[dt];
            uint8_t *in = malloc(n * es), *a = malloc(n * es), *b = malloc(n * es);
            uint8_t *ra = malloc(n * es / (size_t)c->world + 8);
            uint8_t *rb = malloc(n * es / (size_t)c->world + 8);
            CHECK(in && a && b && ra && rb, "out of memory");
            for (size_t i = 0; i < n; i++) hp_sh_elem(in + i * es, dt, rank, i, 7 + (uint64_t)op);
            CALL(c->vt->all_reduce(c, in, a, (int64_t)n, dt, op, err), "tcp all_reduce");
            CALL(s->vt->all_reduce(s, in, b, (int64_t)n, dt, op, err), "shm all_reduce");
            CHECK(memcmp(a, b, n * es) == 0, "all_reduce %s %s: tcp and shm differ", hp_sh_dtn[dt],
                  hp_sh_opn[op]);
            int64_t per = (int64_t)(n / (size_t)c->world);
            CALL(c->vt->reduce_scatter(c, in, ra, per, dt, op, err), "tcp reduce_scatter");
            CALL(s->vt->reduce_scatter(s, in, rb, per, dt, op, err), "shm reduce_scatter");
            CHECK(memcmp(ra, rb, (size_t)per * es) == 0, "reduce_scatter %s %s: tcp and shm differ",
                  hp_sh_dtn[dt], hp_sh_opn[op]);
            o->hash = hp_sh_fnv(o->hash, a, n * es);
            free(in), free(a), free(b), free(ra), free(rb);
        }
    }
    hp_comm_free(s);
    return 0;
}

Test(comm_tcp, bitwise_equal_to_shm, .timeout = 120) {
    for (int world = 2; world <= HP_SH_MAX_WORLD; world++) {
        vs_shm v;
        hp_sh_fresh_name(v.shm_name, sizeof v.shm_name);
        group g;
        group_init(&g, world, 30, vs_shm_body, &v);
        hp_sh_out outs[HP_SH_MAX_WORLD];
        run_group(&g, outs);
        for (int r = 0; r < world; r++) {
            cr_assert(outs[r].ok, "world %d rank %d: %s", world, r, outs[r].msg);
            cr_assert_eq(outs[r].hash, outs[0].hash);
        }
    }
    hp_sh_assert_clean();
}

/* ---- split: a 2x2 mesh ----------------------------------------------------------------------- */

static int mesh_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    /* rank = dp * 2 + tp: the tp group holds the ranks of one dp index, and the reverse. */
    hp_comm *tp = NULL, *dp = NULL, *none = NULL, *odd = NULL;
    CALL(c->vt->split(c, rank / 2, rank, &tp, err), "split tp");
    CALL(c->vt->split(c, rank % 2, -rank, &dp, err), "split dp");
    CALL(c->vt->split(c, rank == 3 ? 5 : -1, 0, &none, err), "split one");
    CHECK(tp && dp && tp->world == 2 && dp->world == 2, "group sizes");
    CHECK(tp->rank == rank % 2, "tp rank %d", tp->rank);
    CHECK(dp->rank == 1 - rank / 2, "dp rank %d (keys reverse the order)", dp->rank);
    CHECK((rank == 3) == (none != NULL) && (!none || none->world == 1), "color -1");
    /* The groups run the checked collectives with their own ranks, interleaved with the parent. */
    if (hp_sh_check_all_reduce(tp, tp->rank, 1001, HP_COMM_F32, HP_REDUCE_SUM, 0, 11, o)) return 1;
    if (hp_sh_check_all_reduce(dp, dp->rank, 1001, HP_COMM_F64, HP_REDUCE_AVG, 1, 12, o)) return 1;
    if (hp_sh_check_all_reduce(c, rank, 77, HP_COMM_I64, HP_REDUCE_MAX, 0, 13, o)) return 1;
    if (hp_sh_check_all_gather(dp, dp->rank, 999, 0, 14, o)) return 1;
    CALL(tp->vt->split(tp, 0, 0, &odd, err), "nested split");
    CHECK(odd && odd->world == 2, "nested group");
    if (hp_sh_check_broadcast(odd, odd->rank, 4096, 1, 15, o)) return 1;
    hp_comm_free(odd);
    hp_comm_free(none);
    hp_comm_free(tp); /* the parent stays usable with a group gone */
    CALL(c->vt->barrier(c, err), "barrier");
    hp_comm_free(dp);
    return 0;
}

Test(comm_tcp, split_2x2_mesh, .timeout = 60) {
    group g;
    group_init(&g, 4, 20, mesh_body, NULL);
    hp_sh_out outs[HP_SH_MAX_WORLD];
    run_group(&g, outs);
    for (int r = 0; r < 4; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* Rank 1 calls a different size; the others must say so. */
static int mismatch_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    float x[16] = {0};
    hp_err e = {0};
    hp_status s = c->vt->all_reduce(c, x, x, rank == 1 ? 11 : 10, HP_COMM_F32, HP_REDUCE_SUM, &e);
    CHECK(s == HP_IO, "mismatch: status %d (%s)", s, e.msg);
    CHECK(strstr(e.msg, "differs") || strstr(e.msg, "closed"), "mismatch: %s", e.msg);
    s = c->vt->barrier(c, &e);
    CHECK(s == HP_IO && strstr(e.msg, "broken"), "after an error: %s", e.msg);
    return 0;
}

Test(comm_tcp, call_mismatch_is_an_error, .timeout = 60) {
    group g;
    group_init(&g, 3, 10, mismatch_body, NULL);
    hp_sh_out outs[HP_SH_MAX_WORLD];
    run_group(&g, outs);
    for (int r = 0; r < 3; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
}

/* Rank 2 joins but does not come to the all_reduce until the others have timed out. */
static int missing_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    double x[4] = {1, 2, 3, 4};
    hp_err e = {0};
    if (rank == 2) {
        /* A hung rank: it reads nothing while the others time out (not synchronization). */
        struct timespec ts = {3, 0};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        return 0;
    }
    hp_status s = c->vt->all_reduce(c, x, x, 4, HP_COMM_F64, HP_REDUCE_SUM, &e);
    CHECK(s == HP_IO, "status %d (%s)", s, e.msg);
    CHECK(strstr(e.msg, "all_reduce #1") && strstr(e.msg, "rank 2 did not arrive"),
          "the error must name the collective and the missing rank: %s", e.msg);
    return 0;
}

Test(comm_tcp, timeout_names_the_missing_rank, .timeout = 60) {
    group g;
    group_init(&g, 3, 1, missing_body, NULL);
    hp_sh_out outs[HP_SH_MAX_WORLD];
    run_group(&g, outs);
    for (int r = 0; r < 3; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
}

static int killed_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    float x[1000] = {0};
    hp_err e = {0};
    hp_status s = c->vt->all_reduce(c, x, x, 1000, HP_COMM_F32, HP_REDUCE_SUM, &e);
    CHECK(s == HP_IO, "status %d (%s)", s, e.msg);
    /* The 60 s timeout never fires: a closed connection is reported as such at once. */
    CHECK(strstr(e.msg, "all_reduce #1") && strstr(e.msg, "closed its connection"), "%s (rank %d)",
          e.msg, rank);
    return 0;
}

Test(comm_tcp, killed_peer_is_an_io_error_at_once, .timeout = 50) {
    group g;
    group_init(&g, 3, 60, killed_body, NULL);
    g.kill_rank = 2;
    hp_sh_out outs[HP_SH_MAX_WORLD];
    run_group(&g, outs);
    for (int r = 0; r < 2; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
    cr_assert(!outs[2].ok, "rank 2 was killed");
}

/* ---- bad frames from a peer ----------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rank 1 writes a forged frame where rank 0 expects its barrier: junk (ctx "junk"), or a
 * barrier header claiming a terabyte of payload. Rank 0 must fail naming rank 1. */
static int bad_frame_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    const int junk = !strcmp(ctx, "junk");
    hp_err e = {0};
    if (rank == 1) {
        uint8_t h[HP__TCP_HDR_BYTES];
        memset(h, 0xab, sizeof h);
        if (!junk) {
            memset(h, 0, sizeof h);
            put_le(h, HP__TCP_FRAME_MAGIC, 4);
            put_le(h + 4, HP__TCP_BARRIER, 4);
            put_le(h + 8, 1, 8);                  /* seq */
            put_le(h + 40, (uint64_t)1 << 40, 8); /* payload bytes */
        }
        int fd = ((hp__tcp_comm *)c)->fds[0];
        CHECK(write(fd, h, sizeof h) == (ssize_t)sizeof h, "write: %s", strerror(errno));
        (void)c->vt->barrier(c, &e); /* fails once rank 0 drops us; either way is fine */
        return 0;
    }
    hp_status s = c->vt->barrier(c, &e);
    CHECK(s == HP_IO, "status %d (%s)", s, e.msg);
    CHECK(strstr(e.msg, "barrier #1: rank 1 sent a bad frame"), "%s", e.msg);
    return 0;
}

Test(comm_tcp, bad_frames_are_errors, .timeout = 60) {
    const char *kinds[] = {"junk", "huge"};
    for (int k = 0; k < 2; k++) {
        group g;
        group_init(&g, 2, 10, bad_frame_body, (void *)kinds[k]);
        hp_sh_out outs[HP_SH_MAX_WORLD];
        run_group(&g, outs);
        for (int r = 0; r < 2; r++)
            cr_assert(outs[r].ok, "%s: rank %d: %s", kinds[k], r, outs[r].msg);
    }
}

/* ---- strangers on the port ------------------------------------------------------------------- */

static int connect_raw(const char *addr) {
    char host[64];
    int port = 0;
    if (sscanf(addr, "%63[^:]:%d", host, &port) != 2) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int simple_body(hp_comm *c, int rank, void *ctx, hp_sh_out *o) {
    (void)ctx;
    return hp_sh_check_all_reduce(c, rank, 1000, HP_COMM_F32, HP_REDUCE_SUM, 0, 3, o);
}

/* Rank 1's child: first a garbage connection and a wrong-secret join, both refused; then the
 * real join. */
static void stranger_child(int rank, void *ctx, hp_sh_out *o) {
    group *g = ctx;
    if (rank == 0) {
        group_child(rank, ctx, o);
        return;
    }
    char addr[128], secret[128];
    hp_err e = {0};
    if (hp_tcp_addr_file_wait(g->path, 10, addr, sizeof addr, secret, sizeof secret, &e)) {
        snprintf(o->msg, sizeof o->msg, "%s", e.msg);
        return;
    }
    int fd = connect_raw(addr);
    if (fd < 0) {
        snprintf(o->msg, sizeof o->msg, "raw connect to %s failed", addr);
        return;
    }
    char junk[64], buf[64];
    memset(junk, 'x', sizeof junk);
    ssize_t w = write(fd, junk, sizeof junk);
    /* rank 0 drops us without an answer: end of file, or a reset for the bytes it left unread */
    ssize_t got = read(fd, buf, sizeof buf);
    close(fd);
    if (w != (ssize_t)sizeof junk || got > 0) {
        snprintf(o->msg, sizeof o->msg, "garbage connection: wrote %zd, read %zd (want none)", w,
                 got);
        return;
    }
    hp_comm *c = NULL;
    hp_tcp_opts bad = {
        .rank = 1, .world = 2, .timeout_s = 5, .secret = "not the secret at all", .addr = addr};
    if (hp_tcp_comm_new(&bad, &c, &e) != HP_IO || !strstr(e.msg, "secret")) {
        snprintf(o->msg, sizeof o->msg, "wrong secret joined or failed oddly: %s", e.msg);
        hp_comm_free(c);
        return;
    }
    group_child(rank, ctx, o);
}

Test(comm_tcp, strangers_are_refused, .timeout = 60) {
    group g;
    group_init(&g, 2, 15, simple_body, NULL);
    pid_t pids[2];
    int fds[2];
    hp_sh_out outs[2];
    for (int r = 0; r < 2; r++) pids[r] = hp_sh_spawn(stranger_child, r, &g, &fds[r]);
    for (int r = 0; r < 2; r++) hp_sh_collect(pids[r], fds[r], &outs[r]);
    unlink(g.path);
    for (int r = 0; r < 2; r++) cr_assert(outs[r].ok, "rank %d: %s", r, outs[r].msg);
}

/* ---- options --------------------------------------------------------------------------------- */

Test(comm_tcp, bad_options) {
    hp_comm *c = (hp_comm *)1;
    hp_err e = {0};
    hp_tcp_opts o = {.rank = 0, .world = 2, .timeout_s = 1, .secret = "short"};
    cr_assert_eq(hp_tcp_comm_new(&o, &c, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "secret") && c == NULL, "%s", e.msg);
    o.secret = SECRET;
    o.rank = 2;
    cr_assert_eq(hp_tcp_comm_new(&o, &c, &e), HP_INVALID);
    o.rank = 1;
    cr_assert_eq(hp_tcp_comm_new(&o, &c, &e), HP_INVALID, "rank 1 without addr");
    o.addr = "no-port-here";
    cr_assert_eq(hp_tcp_comm_new(&o, &c, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "host:port"), "%s", e.msg);
    o.rank = 0;
    o.bind_host = "not an address";
    cr_assert_neq(hp_tcp_comm_new(&o, &c, &e), HP_OK);
    o.bind_host = NULL;
    o.timeout_s = 0;
    cr_assert_eq(hp_tcp_comm_new(&o, &c, &e), HP_INVALID);
    /* world 1 needs nobody; bad arguments are errors, not crashes */
    hp_tcp_opts one = {.rank = 0, .world = 1, .timeout_s = 1, .secret = SECRET};
    cr_assert_eq(hp_tcp_comm_new(&one, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->all_reduce(c, NULL, NULL, 4, HP_COMM_F32, HP_REDUCE_SUM, &e), HP_INVALID);
    hp_comm_free(c);
    cr_assert_eq(hp_tcp_comm_new(&one, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(c->vt->broadcast(c, &e, 4, 1, &e), HP_INVALID);
    hp_comm_free(c);
}

Test(comm_tcp, addr_file_errors) {
    char addr[64], secret[80];
    hp_err e = {0};
    cr_assert_eq(hp_tcp_addr_file_wait("/tmp/hp-tcp-no-such-file", 0.05, addr, sizeof addr, secret,
                                       sizeof secret, &e),
                 HP_IO);
    cr_assert(strstr(e.msg, "hp-tcp-no-such-file"), "%s", e.msg);
    char path[64];
    snprintf(path, sizeof path, "/tmp/hp-tcp-bad-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("only-one-field\n", f);
    fclose(f);
    cr_assert_eq(hp_tcp_addr_file_wait(path, 1, addr, sizeof addr, secret, sizeof secret, &e),
                 HP_PARSE);
    unlink(path);
}
