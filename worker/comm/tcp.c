/* worker/comm/tcp.c — the tcp communicator's connections: rendezvous, the authenticated
 * handshake, the full mesh, the progress engine that moves a collective's frames, errors and
 * teardown. The collectives are in tcp_coll.c; the frame format in tcp_internal.h.
 *
 * Rendezvous. Rank 0 listens on its bind host (port 0: the kernel picks) and hands its
 * "host:port" to the caller's publish callback (a file in the run directory, or hpd's
 * CommSetup relay). Every other rank connects to it, opens a listener of its own on the local
 * address of that connection (the interface its peers reach it on) and tells rank 0 the port;
 * once all have come, rank 0 sends everyone the table of hosts and ports, and the ranks
 * connect pairwise (rank i to every rank j < i, accepting from j > i). connect() completes in
 * the kernel's backlog, so the order cannot deadlock.
 *
 * Handshake (every connection, both directions authenticated with the job's secret, which
 * never crosses the wire). The connector sends HELLO (magic, communicator id, its rank, the
 * world, its listening port, a random nonce); the acceptor answers with its own nonce and
 * HMAC(secret, "acc" | HELLO | nonce_a); the connector checks that and answers
 * HMAC(secret, "con" | HELLO | nonce_a). A connection that fails any of it (a stranger on
 * the port, a rank of another job, a duplicate rank) is logged to stderr and closed, and the
 * acceptor goes on waiting for the real peer until the deadline.
 *
 * Errors. A peer that closes its connection is HP_IO at once; one that sends nothing for the
 * timeout is HP_IO naming the collective, its sequence number and the rank. After an error
 * the communicator is broken: every later call returns HP_IO with the first message.
 */
#define _GNU_SOURCE
#include "worker/comm/tcp_internal.h"

#include "worker/comm/sha256.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S        1000000000LL
#define HELLO_MAGIC     0x31307670635470ull /* "pTcpv01" */
#define HELLO_BYTES     48
#define CHALLENGE_BYTES (16 + HP__SHA256_BYTES)
#define TABLE_ROW       (HP__TCP_HOST_MAX + 2)
/* A connection must finish its handshake this fast: a silent stranger cannot hold the
 * acceptor for long (a real peer sends HELLO right after connect). */
#define HANDSHAKE_NS (5 * NS_PER_S)
#define MIN_SECRET   16

/* ---- small helpers --------------------------------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static int64_t deadline_after(double s) {
    return now_ns() + (int64_t)(s * (double)NS_PER_S);
}

static int ms_left(int64_t deadline) {
    int64_t left = deadline - now_ns();
    if (left <= 0) return 0;
    return left / 1000000 > 100000 ? 100000 : (int)(left / 1000000) + 1;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Best-effort, for stderr only: the process never waits on the log. */
static void log_refused(const char *who, const char *why) {
    fprintf(stderr, "hp tcp comm: refused a connection from %s: %s\n", who, why);
}

static void peer_text(int fd, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[HP__TCP_HOST_MAX] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    }
    snprintf(out, cap, "%s:%s", host, port);
}

/* The numeric host of fd's local (local = 1) or remote end. */
static hp_status sock_host(int fd, int local, char out[HP__TCP_HOST_MAX], hp_err *err) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int rc = local ? getsockname(fd, (struct sockaddr *)&ss, &len)
                   : getpeername(fd, (struct sockaddr *)&ss, &len);
    if (rc != 0) return hp_errf(err, HP_IO, "getsockname: %s", strerror(errno));
    int g =
        getnameinfo((struct sockaddr *)&ss, len, out, HP__TCP_HOST_MAX, NULL, 0, NI_NUMERICHOST);
    if (g != 0) return hp_errf(err, HP_IO, "getnameinfo: %s", gai_strerror(g));
    return HP_OK;
}

static void tune(int fd) {
    int one = 1;
    /* Small frames (barriers, split's exchange, headers) must not wait for Nagle. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Splits "host:port" or "[v6]:port". */
static hp_status parse_addr(const char *addr, char host[HP__TCP_HOST_MAX], char port[8],
                            hp_err *err) {
    if (!addr) return hp_errf(err, HP_INVALID, "no rank-0 address");
    const char *colon = strrchr(addr, ':');
    const char *h = addr;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') h = addr + 1, hl -= 2;
    char *end = NULL;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || hl == 0 || hl >= HP__TCP_HOST_MAX || !end || *end || end == colon + 1 || p < 1 ||
        p > 65535) {
        char q[HP_QUOTE_MAX];
        return hp_errf(err, HP_INVALID, "address %s is not host:port",
                       hp_quote(q, sizeof q, addr, 64));
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, 8, "%ld", p);
    return HP_OK;
}

/* Moves exactly n bytes (send or receive) on a non-blocking socket before deadline. */
static hp_status io_all(int fd, void *buf, size_t n, int sending, int64_t deadline,
                        const char *what, hp_err *err) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k == 0) return hp_errf(err, HP_IO, "%s: connection closed", what);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return hp_errf(err, HP_IO, "%s: %s", what, strerror(errno));
        struct pollfd pf = {fd, sending ? POLLOUT : POLLIN, 0};
        int left = ms_left(deadline);
        if (left == 0 || poll(&pf, 1, left) == 0) return hp_errf(err, HP_IO, "%s: timed out", what);
    }
    return HP_OK;
}

/* ---- handshake ------------------------------------------------------------------------------- */

typedef struct hello {
    uint64_t comm_id;
    uint32_t rank, world, port;
    uint8_t nonce[16];
} hello;

static void hello_encode(const hello *h, uint8_t b[HELLO_BYTES]) {
    memset(b, 0, HELLO_BYTES);
    put_u64(b, HELLO_MAGIC);
    put_u64(b + 8, h->comm_id);
    put_u32(b + 16, h->rank);
    put_u32(b + 20, h->world);
    put_u32(b + 24, h->port);
    memcpy(b + 32, h->nonce, 16);
}

static void mac(const char *secret, const char *role, const uint8_t *hello_b,
                const uint8_t nonce[16], uint8_t out[HP__SHA256_BYTES]) {
    const void *parts[3] = {role, hello_b, nonce};
    const size_t lens[3] = {3, HELLO_BYTES, 16};
    hp__hmac_sha256(secret, strlen(secret), parts, lens, 3, out);
}

static int mac_equal(const uint8_t *a, const uint8_t *b) {
    uint8_t diff = 0; /* constant time: a prober learns nothing from the timing */
    for (int i = 0; i < HP__SHA256_BYTES; i++) diff |= a[i] ^ b[i];
    return diff == 0;
}

static void random_bytes(uint8_t *b, size_t n) {
    if (getrandom(b, n, 0) == (ssize_t)n) return;
    /* getrandom does not fail for small sizes on Linux >= 3.17; a fallback anyway */
    uint64_t t = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((t >> (i % 8 * 8)) ^ (i * 131));
}

/* The connector's side on a connected fd. */
static hp_status handshake_connect(int fd, const char *secret, const hello *me, int64_t deadline,
                                   hp_err *err) {
    uint8_t hb[HELLO_BYTES], ch[CHALLENGE_BYTES], want[HP__SHA256_BYTES], proof[HP__SHA256_BYTES];
    hello_encode(me, hb);
    HP_TRY(io_all(fd, hb, sizeof hb, 1, deadline, "handshake", err));
    HP_TRY(io_all(fd, ch, sizeof ch, 0, deadline, "handshake", err));
    mac(secret, "acc", hb, ch, want);
    if (!mac_equal(want, ch + 16)) {
        return hp_errf(err, HP_IO, "handshake: the peer does not hold this job's secret");
    }
    mac(secret, "con", hb, ch, proof);
    return io_all(fd, proof, sizeof proof, 1, deadline, "handshake", err);
}

/* The acceptor's side: 0 and *from filled on success, else the reason in why. */
static int handshake_accept(int fd, const char *secret, uint64_t comm_id, int world,
                            int64_t deadline, hello *from, char *why, size_t why_cap) {
    uint8_t hb[HELLO_BYTES], ch[CHALLENGE_BYTES], proof[HP__SHA256_BYTES], want[HP__SHA256_BYTES];
    hp_err e = {0};
    if (io_all(fd, hb, sizeof hb, 0, deadline, "hello", &e) != HP_OK) {
        snprintf(why, why_cap, "%s", e.msg);
        return -1;
    }
    if (get_u64(hb) != HELLO_MAGIC) {
        snprintf(why, why_cap, "not an hp tcp hello");
        return -1;
    }
    from->comm_id = get_u64(hb + 8);
    from->rank = get_u32(hb + 16);
    from->world = get_u32(hb + 20);
    from->port = get_u32(hb + 24);
    random_bytes(ch, 16);
    mac(secret, "acc", hb, ch, ch + 16);
    if (io_all(fd, ch, sizeof ch, 1, deadline, "challenge", &e) != HP_OK ||
        io_all(fd, proof, sizeof proof, 0, deadline, "proof", &e) != HP_OK) {
        snprintf(why, why_cap, "%s", e.msg);
        return -1;
    }
    mac(secret, "con", hb, ch, want);
    if (!mac_equal(want, proof)) {
        snprintf(why, why_cap, "wrong secret");
        return -1;
    }
    if (from->comm_id != comm_id || (int)from->world != world || from->port > 65535) {
        snprintf(why, why_cap, "communicator %llx world %u (expected %llx world %d)",
                 (unsigned long long)from->comm_id, from->world, (unsigned long long)comm_id,
                 world);
        return -1;
    }
    return 0;
}

/* Accepts until a peer whose rank has want[rank] set (cleared then) has authenticated; logs and
 * drops everything else. */
static hp_status accept_one(int lfd, const char *secret, uint64_t comm_id, int world,
                            unsigned char *want, int64_t deadline, int *fd_out, hello *from,
                            hp_err *err) {
    for (;;) {
        struct pollfd pf = {lfd, POLLIN, 0};
        int left = ms_left(deadline);
        if (left == 0 || poll(&pf, 1, left) == 0) return HP_IO; /* caller names who is missing */
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return hp_errf(err, HP_IO, "accept: %s", strerror(errno));
        }
        tune(fd);
        char who[HP__TCP_HOST_MAX + 16], why[HP_ERR_MSG_MAX];
        peer_text(fd, who, sizeof who);
        int64_t hs_deadline =
            now_ns() + HANDSHAKE_NS < deadline ? now_ns() + HANDSHAKE_NS : deadline;
        if (handshake_accept(fd, secret, comm_id, world, hs_deadline, from, why, sizeof why) != 0) {
            log_refused(who, why);
            close(fd);
            continue;
        }
        if (from->rank >= (uint32_t)world || !want[from->rank]) {
            snprintf(why, sizeof why, "rank %u is not expected here", from->rank);
            log_refused(who, why);
            close(fd);
            continue;
        }
        want[from->rank] = 0;
        *fd_out = fd;
        return HP_OK;
    }
}

/* Connects to host:port, retrying refusals until deadline (the peer may not listen yet). */
static hp_status connect_to(const char *host, const char *port, int64_t deadline, int *fd_out,
                            hp_err *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0) return hp_errf(err, HP_IO, "resolve %s: %s", host, gai_strerror(g));
    hp_status st = HP_IO;
    int last = ETIMEDOUT;
    while (st != HP_OK) {
        /* Non-blocking: an unreachable host (SYNs dropped) must not outlast the deadline. */
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            last = errno;
            break;
        }
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            int left = ms_left(deadline);
            socklen_t len = sizeof last;
            if (left > 0 && poll(&pf, 1, left) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &last, &len) == 0) {
                rc = last == 0 ? 0 : -1;
            } else {
                last = ETIMEDOUT;
            }
            errno = last;
        }
        if (rc == 0) {
            tune(fd);
            *fd_out = fd;
            st = HP_OK;
            break;
        }
        last = errno;
        close(fd);
        if ((last != ECONNREFUSED && last != EINTR && last != EAGAIN) || now_ns() >= deadline)
            break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(res);
    if (st != HP_OK) return hp_errf(err, HP_IO, "connect %s:%s: %s", host, port, strerror(last));
    return HP_OK;
}

hp_status hp__tcp_listen_on(const char *host, int want_port, int *lfd, uint16_t *port,
                            hp_err *err) {
    struct addrinfo hints = {0}, *res = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", want_port);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return hp_errf(err, HP_INVALID, "bind address %s: %s", host, gai_strerror(g));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int e = errno;
    if (fd >= 0 &&
        (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, HP__TCP_MAX_WORLD) != 0)) {
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return hp_errf(err, HP_IO, "listen on %s:%d: %s", host, want_port, strerror(e));
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    *lfd = fd;
    return HP_OK;
}

/* ---- communicator lifetime ------------------------------------------------------------------- */

static hp__tcp_comm *comm_alloc(int rank, int world, double timeout_s, const char *secret,
                                uint64_t comm_id) {
    hp__tcp_comm *c = hp_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.vt = &hp__tcp_vtable;
    c->base.rank = rank;
    c->base.world = world;
    c->timeout_s = timeout_s;
    c->comm_id = comm_id;
    c->fds = hp_calloc((size_t)world, sizeof *c->fds);
    c->hosts = hp_calloc((size_t)world, sizeof *c->hosts);
    c->xfers = hp_calloc((size_t)world, sizeof *c->xfers);
    c->secret = hp_strdup(secret);
    if (!c->fds || !c->hosts || !c->xfers || !c->secret) {
        hp_free(c->fds), hp_free(c->hosts), hp_free(c->xfers), hp_free(c->secret), hp_free(c);
        return NULL;
    }
    for (int r = 0; r < world; r++) c->fds[r] = -1;
    return c;
}

void hp__tcp_destroy(hp_comm *base) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    if (!c) return;
    for (int r = 0; r < base->world; r++)
        if (c->fds[r] >= 0) close(c->fds[r]);
    hp_free(c->fds);
    hp_free(c->hosts);
    hp_free(c->xfers);
    if (c->secret) memset(c->secret, 0, strlen(c->secret));
    hp_free(c->secret);
    hp_free(c->stage);
    hp_free(c);
}

const char *hp__tcp_kind_name(int kind) {
    static const char *const names[] = {"join",      "all_gather", "reduce_scatter", "all_reduce",
                                        "broadcast", "barrier",    "all_to_all",     "split"};
    return kind >= 1 && kind <= 7 ? names[kind] : names[0];
}

hp_status hp__tcp_fail(hp__tcp_comm *c, hp_err *err, hp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->broken_msg, sizeof c->broken_msg, fmt, ap);
    va_end(ap);
    c->broken = 1;
    return hp_errf(err, status, "tcp rank %d/%d: %s", c->base.rank, c->base.world, c->broken_msg);
}

hp_status hp__tcp_stage(hp__tcp_comm *c, size_t bytes, const char *what, hp_err *err) {
    if (bytes <= c->stage_cap) return HP_OK;
    void *p = hp_malloc(bytes);
    if (!p) {
        return hp__tcp_fail(c, err, HP_NOMEM, "%s #%llu: out of memory for %zu staging bytes", what,
                            (unsigned long long)c->seq, bytes);
    }
    hp_free(c->stage);
    c->stage = p;
    c->stage_cap = bytes;
    return HP_OK;
}

/* Connects to members [0, rank) and accepts members (rank, world) of a mesh whose member i
 * listens on hosts[i]:ports[i]; fds[] receives the connections. Errors name the member. */
static hp_status build_mesh(hp__tcp_comm *c, const uint16_t *ports, int lfd, int first,
                            int64_t deadline, const char *what, hp_err *err) {
    const int me = c->base.rank, world = c->base.world;
    hello h = {.comm_id = c->comm_id, .rank = (uint32_t)me, .world = (uint32_t)world};
    for (int j = first; j < me; j++) {
        char port[8];
        hp_err e = {0};
        snprintf(port, sizeof port, "%u", ports[j]);
        random_bytes(h.nonce, sizeof h.nonce);
        if (connect_to(c->hosts[j], port, deadline, &c->fds[j], &e) != HP_OK ||
            handshake_connect(c->fds[j], c->secret, &h, deadline, &e) != HP_OK) {
            return hp__tcp_fail(c, err, HP_IO, "%s: rank %d (%s:%s): %s", what, j, c->hosts[j],
                                port, e.msg);
        }
    }
    unsigned char *want = hp_calloc((size_t)world, 1);
    if (!want) return hp__tcp_fail(c, err, HP_NOMEM, "%s: out of memory", what);
    for (int j = me + 1; j < world; j++) want[j] = 1;
    hp_status st = HP_OK;
    for (int k = me + 1; k < world && st == HP_OK; k++) {
        hello from;
        int fd = -1;
        hp_err e = {0};
        st = accept_one(lfd, c->secret, c->comm_id, world, want, deadline, &fd, &from, &e);
        if (st == HP_OK) {
            c->fds[from.rank] = fd;
        } else if (e.msg[0]) {
            st = hp__tcp_fail(c, err, st, "%s: %s", what, e.msg);
        } else {
            int missing = me + 1;
            while (missing < world && !want[missing]) missing++;
            st = hp__tcp_fail(c, err, HP_IO, "%s: rank %d did not connect within %g s", what,
                              missing, c->timeout_s);
        }
    }
    hp_free(want);
    return st;
}

/* Rank 0: listen, publish, take every rank's hello, send the table. */
static hp_status bootstrap_root(hp__tcp_comm *c, const hp_tcp_opts *o, uint16_t *ports,
                                int64_t deadline, hp_err *err) {
    const int world = c->base.world;
    const char *host = o->bind_host && o->bind_host[0] ? o->bind_host : "127.0.0.1";
    int lfd = -1;
    HP_TRY(hp__tcp_listen_on(host, o->port, &lfd, &ports[0], err));
    hp_status st = sock_host(lfd, 1, c->hosts[0], err);
    char addr[HP__TCP_HOST_MAX + 16];
    int v6 = strchr(c->hosts[0], ':') != NULL;
    snprintf(addr, sizeof addr, v6 ? "[%s]:%u" : "%s:%u", c->hosts[0], ports[0]);
    if (st == HP_OK && o->publish) st = o->publish(addr, o->publish_ctx, err);
    unsigned char *want = hp_calloc((size_t)world, 1);
    if (st == HP_OK && !want) st = hp_errf(err, HP_NOMEM, "out of memory");
    for (int j = 1; j < world && want; j++) want[j] = 1;
    for (int k = 1; k < world && st == HP_OK; k++) {
        hello from;
        int fd = -1;
        hp_err e = {0};
        st = accept_one(lfd, c->secret, c->comm_id, world, want, deadline, &fd, &from, &e);
        if (st != HP_OK) {
            if (e.msg[0]) {
                st = hp__tcp_fail(c, err, st, "join: %s", e.msg);
            } else {
                int missing = 1;
                while (missing < world && !want[missing]) missing++;
                st = hp__tcp_fail(c, err, HP_IO, "join: rank %d did not connect to %s within %g s",
                                  missing, addr, c->timeout_s);
            }
            break;
        }
        c->fds[from.rank] = fd;
        ports[from.rank] = (uint16_t)from.port;
        st = sock_host(fd, 0, c->hosts[from.rank], err);
    }
    hp_free(want);
    close(lfd);
    if (st != HP_OK) return st;
    uint8_t *table = hp_calloc((size_t)world, TABLE_ROW);
    if (!table) return hp__tcp_fail(c, err, HP_NOMEM, "join: out of memory");
    for (int j = 0; j < world; j++) {
        memcpy(table + (size_t)j * TABLE_ROW, c->hosts[j], HP__TCP_HOST_MAX);
        table[(size_t)j * TABLE_ROW + HP__TCP_HOST_MAX] = (uint8_t)ports[j];
        table[(size_t)j * TABLE_ROW + HP__TCP_HOST_MAX + 1] = (uint8_t)(ports[j] >> 8);
    }
    for (int j = 1; j < world && st == HP_OK; j++) {
        hp_err e = {0};
        if (io_all(c->fds[j], table, (size_t)world * TABLE_ROW, 1, deadline, "table", &e) != HP_OK)
            st = hp__tcp_fail(c, err, HP_IO, "join: rank %d: %s", j, e.msg);
    }
    hp_free(table);
    return st;
}

/* Rank > 0: connect to rank 0, listen for the higher ranks, get the table, build the mesh. */
static hp_status bootstrap_peer(hp__tcp_comm *c, const hp_tcp_opts *o, uint16_t *ports,
                                int64_t deadline, hp_err *err) {
    const int me = c->base.rank, world = c->base.world;
    char host0[HP__TCP_HOST_MAX], port0[8], mine[HP__TCP_HOST_MAX];
    HP_TRY(parse_addr(o->addr, host0, port0, err));
    hp_err e = {0};
    if (connect_to(host0, port0, deadline, &c->fds[0], &e) != HP_OK)
        return hp__tcp_fail(c, err, HP_IO, "join: rank 0: %s", e.msg);
    HP_TRY(sock_host(c->fds[0], 1, mine, err));
    const char *host = o->bind_host && o->bind_host[0] ? o->bind_host : mine;
    int lfd = -1;
    uint16_t my_port = 0;
    HP_TRY(hp__tcp_listen_on(host, 0, &lfd, &my_port, err));
    hello h = {
        .comm_id = c->comm_id, .rank = (uint32_t)me, .world = (uint32_t)world, .port = my_port};
    random_bytes(h.nonce, sizeof h.nonce);
    hp_status st = HP_OK;
    uint8_t *table = hp_calloc((size_t)world, TABLE_ROW);
    if (!table) st = hp__tcp_fail(c, err, HP_NOMEM, "join: out of memory");
    if (st == HP_OK && (handshake_connect(c->fds[0], c->secret, &h, deadline, &e) != HP_OK ||
                        io_all(c->fds[0], table, (size_t)world * TABLE_ROW, 0, deadline,
                               "waiting for every rank to join", &e) != HP_OK)) {
        st = hp__tcp_fail(c, err, HP_IO, "join: rank 0 at %s: %s", o->addr, e.msg);
    }
    for (int j = 0; j < world && st == HP_OK; j++) {
        const uint8_t *row = table + (size_t)j * TABLE_ROW;
        if (memchr(row, '\0', HP__TCP_HOST_MAX) == NULL) {
            st = hp__tcp_fail(c, err, HP_IO, "join: rank 0 sent a bad address table");
            break;
        }
        memcpy(c->hosts[j], row, HP__TCP_HOST_MAX);
        ports[j] = (uint16_t)(row[HP__TCP_HOST_MAX] | row[HP__TCP_HOST_MAX + 1] << 8);
    }
    hp_free(table);
    /* Rank 0 reports the address it is bound to, a wildcard (0.0.0.0) if so bound; the one
     * we reached it at is the one its groups' listeners are reachable at too. */
    snprintf(c->hosts[0], HP__TCP_HOST_MAX, "%s", host0);
    if (st == HP_OK) st = build_mesh(c, ports, lfd, 1, deadline, "join", err);
    close(lfd);
    return st;
}

/* The world communicator's id in handshakes; groups derive theirs (tcp_coll.c). Jobs are told
 * apart by their secrets, which the MACs cover. */
#define WORLD_COMM_ID 1

hp_status hp_tcp_comm_new(const hp_tcp_opts *o, hp_comm **out, hp_err *err) {
    if (out) *out = NULL;
    if (!o || !out) return hp_errf(err, HP_INVALID, "tcp comm: no options or out");
    if (o->world < 1 || o->world > HP__TCP_MAX_WORLD)
        return hp_errf(err, HP_INVALID, "tcp comm: world %d not in [1, %d]", o->world,
                       HP__TCP_MAX_WORLD);
    if (o->rank < 0 || o->rank >= o->world)
        return hp_errf(err, HP_INVALID, "tcp comm: rank %d not in [0, %d)", o->rank, o->world);
    if (!(o->timeout_s > 0) || o->timeout_s > 1e6)
        return hp_errf(err, HP_INVALID, "tcp comm: timeout %g s must be in (0, 1e6]", o->timeout_s);
    if (!o->secret || strlen(o->secret) < MIN_SECRET)
        return hp_errf(err, HP_INVALID, "tcp comm: the secret must have at least %d characters",
                       MIN_SECRET);
    if (o->port < 0 || o->port > 65535)
        return hp_errf(err, HP_INVALID, "tcp comm: port %d not in [0, 65535]", o->port);
    if (o->rank > 0 && o->world > 1 && !o->addr)
        return hp_errf(err, HP_INVALID, "tcp comm: rank %d needs rank 0's address", o->rank);
    hp__tcp_comm *c = comm_alloc(o->rank, o->world, o->timeout_s, o->secret, WORLD_COMM_ID);
    uint16_t *ports = hp_calloc((size_t)o->world, sizeof *ports);
    if (!c || !ports) {
        hp__tcp_destroy(c ? &c->base : NULL);
        hp_free(ports);
        return hp_errf(err, HP_NOMEM, "tcp comm: out of memory for world %d", o->world);
    }
    int64_t deadline = deadline_after(o->timeout_s);
    hp_status st = HP_OK;
    if (o->world == 1) {
        /* Nobody to meet: the host only names where a split's group would listen. */
        snprintf(c->hosts[0], HP__TCP_HOST_MAX, "%s",
                 o->bind_host && o->bind_host[0] ? o->bind_host : "127.0.0.1");
    } else if (o->rank == 0) {
        st = bootstrap_root(c, o, ports, deadline, err);
    } else {
        st = bootstrap_peer(c, o, ports, deadline, err);
    }
    hp_free(ports);
    if (st != HP_OK) {
        hp__tcp_destroy(&c->base);
        return st;
    }
    *out = &c->base;
    return HP_OK;
}

hp_status hp__tcp_group_new(hp__tcp_comm *parent, int rank, int world, const int *members,
                            const uint16_t *ports, int lfd, uint64_t comm_id, hp_comm **out,
                            hp_err *err) {
    hp__tcp_comm *c = comm_alloc(rank, world, parent->timeout_s, parent->secret, comm_id);
    if (!c) {
        close(lfd);
        return hp_errf(err, HP_NOMEM, "tcp split: out of memory for a group of %d", world);
    }
    for (int i = 0; i < world; i++)
        memcpy(c->hosts[i], parent->hosts[members[i]], HP__TCP_HOST_MAX);
    hp_status st = build_mesh(c, ports, lfd, 0, deadline_after(parent->timeout_s), "split", err);
    close(lfd);
    if (st != HP_OK) {
        hp__tcp_destroy(&c->base);
        return st;
    }
    *out = &c->base;
    return HP_OK;
}

/* ---- the progress engine --------------------------------------------------------------------- */

void hp__tcp_run_reset(hp__tcp_comm *c) {
    memset(c->xfers, 0, (size_t)c->base.world * sizeof *c->xfers);
}

static void encode_hdr(uint8_t *b, const hp__tcp_desc *d, uint32_t phase, uint64_t len) {
    put_u32(b, HP__TCP_FRAME_MAGIC);
    put_u32(b + 4, d->kind);
    put_u64(b + 8, d->seq);
    put_u64(b + 16, d->size);
    put_u32(b + 24, (uint32_t)d->dtype);
    put_u32(b + 28, (uint32_t)d->op);
    put_u32(b + 32, (uint32_t)d->root);
    put_u32(b + 36, phase);
    put_u64(b + 40, len);
}

static void describe(char *out, size_t cap, uint32_t kind, uint64_t size, int32_t dtype, int32_t op,
                     int32_t root) {
    static const char *const dt[] = {"f32", "f64", "i64"}, *const ops[] = {"sum", "avg", "max"};
    const char *k = hp__tcp_kind_name((int)kind);
    if (kind == HP__TCP_REDUCE_SCATTER || kind == HP__TCP_ALL_REDUCE) {
        snprintf(out, cap, "%s(%llu x %s, %s)", k, (unsigned long long)size,
                 dtype >= 0 && dtype < 3 ? dt[dtype] : "?", op >= 0 && op < 3 ? ops[op] : "?");
    } else if (kind == HP__TCP_BROADCAST) {
        snprintf(out, cap, "%s(%llu bytes, root %d)", k, (unsigned long long)size, root);
    } else {
        snprintf(out, cap, "%s(%llu bytes)", k, (unsigned long long)size);
    }
}

/* The received header of peer j against what we expect. */
static hp_status check_hdr(hp__tcp_comm *c, int j, const hp__tcp_desc *d, uint32_t phase,
                           const hp__tcp_xfer *x, hp_err *err) {
    const uint8_t *b = x->hdr_in;
    const char *k = hp__tcp_kind_name((int)d->kind);
    const unsigned long long seq = (unsigned long long)d->seq;
    if (get_u32(b) != HP__TCP_FRAME_MAGIC)
        return hp__tcp_fail(c, err, HP_IO, "%s #%llu: rank %d sent a bad frame (magic %08x)", k,
                            seq, j, get_u32(b));
    uint32_t kind = get_u32(b + 4);
    uint64_t pseq = get_u64(b + 8), size = get_u64(b + 16);
    int32_t dtype = (int32_t)get_u32(b + 24), op = (int32_t)get_u32(b + 28);
    int32_t root = (int32_t)get_u32(b + 32);
    if (pseq != d->seq) {
        return hp__tcp_fail(c, err, HP_IO,
                            "ranks out of step: rank %d is at collective #%llu, rank %d at #%llu",
                            c->base.rank, seq, j, (unsigned long long)pseq);
    }
    if (kind != d->kind || size != d->size || dtype != d->dtype || op != d->op || root != d->root) {
        char a[128], bb[128];
        describe(a, sizeof a, kind, size, dtype, op, root);
        describe(bb, sizeof bb, d->kind, d->size, d->dtype, d->op, d->root);
        return hp__tcp_fail(c, err, HP_IO,
                            "collective #%llu differs: rank %d called %s, rank %d called %s", seq,
                            j, a, c->base.rank, bb);
    }
    if (get_u32(b + 36) != phase || get_u64(b + 40) != x->recv_len) {
        return hp__tcp_fail(c, err, HP_IO,
                            "%s #%llu: rank %d sent a bad frame (phase %u, %llu bytes; expected "
                            "phase %u, %llu bytes)",
                            k, seq, j, get_u32(b + 36), (unsigned long long)get_u64(b + 40), phase,
                            (unsigned long long)x->recv_len);
    }
    return HP_OK;
}

static hp_status peer_gone(hp__tcp_comm *c, const hp__tcp_desc *d, int j, int e, hp_err *err) {
    return hp__tcp_fail(c, err, HP_IO, "%s #%llu: rank %d %s", hp__tcp_kind_name((int)d->kind),
                        (unsigned long long)d->seq, j,
                        e ? strerror(e) : "closed its connection (it died or failed)");
}

static hp_status pump_out(hp__tcp_comm *c, const hp__tcp_desc *d, int j, int *moved, hp_err *err) {
    hp__tcp_xfer *x = &c->xfers[j];
    for (;;) {
        uint64_t total = HP__TCP_HDR_BYTES + x->send_len;
        if (x->out_done == total) return HP_OK;
        struct iovec iov[2];
        int n = 0;
        if (x->out_done < HP__TCP_HDR_BYTES) {
            iov[n].iov_base = x->hdr_out + x->out_done;
            iov[n++].iov_len = HP__TCP_HDR_BYTES - x->out_done;
        }
        uint64_t pdone = x->out_done > HP__TCP_HDR_BYTES ? x->out_done - HP__TCP_HDR_BYTES : 0;
        if (x->send_len > pdone) {
            iov[n].iov_base = (void *)(x->send + pdone);
            iov[n++].iov_len = x->send_len - pdone;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(c->fds[j], &m, MSG_NOSIGNAL);
        if (k > 0) {
            x->out_done += (uint64_t)k;
            *moved = 1;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return HP_OK;
        int e = k < 0 ? errno : 0;
        return peer_gone(c, d, j, e == EPIPE || e == ECONNRESET ? 0 : e, err);
    }
}

static hp_status pump_in(hp__tcp_comm *c, const hp__tcp_desc *d, uint32_t phase, int j, int *moved,
                         hp_err *err) {
    hp__tcp_xfer *x = &c->xfers[j];
    for (;;) {
        uint64_t total = HP__TCP_HDR_BYTES + x->recv_len;
        if (x->in_done == total) return HP_OK;
        ssize_t k;
        if (x->in_done < HP__TCP_HDR_BYTES) {
            k = recv(c->fds[j], x->hdr_in + x->in_done, HP__TCP_HDR_BYTES - x->in_done, 0);
        } else {
            uint64_t pdone = x->in_done - HP__TCP_HDR_BYTES;
            k = recv(c->fds[j], x->recv + pdone, x->recv_len - pdone, 0);
        }
        if (k > 0) {
            int hdr_was_open = x->in_done < HP__TCP_HDR_BYTES;
            x->in_done += (uint64_t)k;
            *moved = 1;
            if (hdr_was_open && x->in_done == HP__TCP_HDR_BYTES)
                HP_TRY(check_hdr(c, j, d, phase, x, err));
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return HP_OK;
        int e = k < 0 ? errno : 0;
        return peer_gone(c, d, j, e == ECONNRESET ? 0 : e, err);
    }
}

hp_status hp__tcp_run(hp__tcp_comm *c, const hp__tcp_desc *d, uint32_t phase, hp_err *err) {
    const int world = c->base.world;
    struct pollfd pfds[HP__TCP_MAX_WORLD];
    int peer[HP__TCP_MAX_WORLD];
    for (int j = 0; j < world; j++) {
        hp__tcp_xfer *x = &c->xfers[j];
        if (x->sending) encode_hdr(x->hdr_out, d, phase, x->send_len);
        if (!x->sending) x->out_done = HP__TCP_HDR_BYTES + x->send_len;
        if (!x->receiving) x->in_done = HP__TCP_HDR_BYTES + x->recv_len;
    }
    int64_t deadline = deadline_after(c->timeout_s);
    for (;;) {
        int n = 0;
        for (int j = 0; j < world; j++) {
            const hp__tcp_xfer *x = &c->xfers[j];
            short ev = 0;
            if (x->out_done < HP__TCP_HDR_BYTES + x->send_len) ev |= POLLOUT;
            if (x->in_done < HP__TCP_HDR_BYTES + x->recv_len) ev |= POLLIN;
            if (!ev) continue;
            pfds[n] = (struct pollfd){c->fds[j], ev, 0};
            peer[n++] = j;
        }
        if (n == 0) return HP_OK;
        int left = ms_left(deadline);
        int ready = left > 0 ? poll(pfds, (nfds_t)n, left) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return hp__tcp_fail(c, err, HP_IO, "poll: %s", strerror(errno));
        if (ready == 0) {
            /* The lowest rank we still wait on: one that sent nothing is missing, one that
             * stopped mid-frame hung, and one we cannot send to is not reading. */
            for (int i = 0; i < n; i++) {
                const hp__tcp_xfer *x = &c->xfers[peer[i]];
                if (!(pfds[i].events & POLLIN)) continue;
                return hp__tcp_fail(c, err, HP_IO, "%s #%llu: rank %d %s within %g s",
                                    hp__tcp_kind_name((int)d->kind), (unsigned long long)d->seq,
                                    peer[i], x->in_done == 0 ? "did not arrive" : "stopped sending",
                                    c->timeout_s);
            }
            return hp__tcp_fail(
                c, err, HP_IO, "%s #%llu: rank %d did not take our data within %g s",
                hp__tcp_kind_name((int)d->kind), (unsigned long long)d->seq, peer[0], c->timeout_s);
        }
        int moved = 0;
        for (int i = 0; i < n; i++) {
            if (!pfds[i].revents) continue;
            if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR) && pfds[i].events & POLLIN)
                HP_TRY(pump_in(c, d, phase, peer[i], &moved, err));
            if (pfds[i].revents & (POLLOUT | POLLHUP | POLLERR) && pfds[i].events & POLLOUT)
                HP_TRY(pump_out(c, d, peer[i], &moved, err));
        }
        if (moved) deadline = deadline_after(c->timeout_s);
    }
}

/* ---- standalone rendezvous: the address file ------------------------------------------------- */

hp_status hp_tcp_secret_new(char out[HP_TCP_SECRET_LEN + 1]) {
    uint8_t b[HP_TCP_SECRET_LEN / 2];
    random_bytes(b, sizeof b);
    for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return HP_OK;
}

hp_status hp_tcp_addr_file_write(const char *path, const char *addr, const char *secret,
                                 hp_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return hp_errf(err, HP_INVALID, "address file path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return hp_errf(err, HP_IO, "open %s: %s", tmp, strerror(errno));
    char line[512];
    int n = snprintf(line, sizeof line, "%s %s\n", addr, secret);
    int ok = n > 0 && n < (int)sizeof line && write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    int e = errno;
    close(fd);
    /* rename is atomic: a reader sees no file or the whole line, never half of it */
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        return hp_errf(err, HP_IO, "write %s: %s", path, strerror(e));
    }
    return HP_OK;
}

hp_status hp_tcp_addr_file_wait(const char *path, double timeout_s, char *addr, size_t addr_cap,
                                char *secret, size_t secret_cap, hp_err *err) {
    int64_t deadline = deadline_after(timeout_s);
    for (;;) {
        FILE *f = fopen(path, "re");
        if (f) {
            char line[512] = {0}, a[256], s[256];
            int got = fgets(line, sizeof line, f) != NULL;
            fclose(f);
            if (!got || sscanf(line, "%255s %255s", a, s) != 2 || strlen(a) >= addr_cap ||
                strlen(s) >= secret_cap) {
                return hp_errf(err, HP_PARSE, "%s: not \"host:port secret\"", path);
            }
            snprintf(addr, addr_cap, "%s", a);
            snprintf(secret, secret_cap, "%s", s);
            return HP_OK;
        }
        if (errno != ENOENT) return hp_errf(err, HP_IO, "open %s: %s", path, strerror(errno));
        if (now_ns() >= deadline) {
            return hp_errf(err, HP_IO, "rank 0 did not write %s within %g s", path, timeout_s);
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
