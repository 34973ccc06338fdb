/* daemon/workers.c — the worker protocol server: libuv TCP, length-prefixed hp.v1.Frame
 * messages (hp/frame.h). A connection's first frame must be a Hello the core accepts; after
 * that its frames go to the core tagged with (job, attempt, rank). Anything bad — a frame
 * over the bound, bytes that are not a Frame, a frame before Hello, a wrong token, a second
 * Hello — is logged on one line and the connection dropped. This file knows nothing of job
 * states; core.c decides what a frame means.
 *
 * Lifetimes: a connection lives from accept to its close callback; while closing it is
 * detached (c->job NULL) so the core never hears of it again. Writes own their buffer until
 * their callback.
 */
#include "daemon/core.h"
#include "daemon/pbcheck.h"

#include "hp/frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_CHUNK      65536
#define HELLO_FRAME_MAX ((size_t)64 << 10) /* before Hello only a small frame is accepted */

struct hpd_conn {
    hpd_conn *next, *prev;
    hpd_workers *ws;
    uv_tcp_t tcp;
    hp_frame_reader rd;
    hpd_job *job; /* NULL until hello (and again once detached) */
    int attempt, rank;
    bool closing;
    uint64_t seq, opened_ms;
    char peer[64];
    char rbuf[READ_CHUNK];
};

struct hpd_workers {
    hpd *d;
    uv_tcp_t server;
    hpd_conn *conns;
    uv_timer_t timer; /* drops connections that never say hello */
    int open_handles;
};

typedef struct wreq {
    uv_write_t req;
    uint8_t *data;
} wreq;

static void on_closed(uv_handle_t *h) {
    hpd_conn *c = h->data;
    hp_frame_reader_fini(&c->rd);
    hp_free(c);
}

static void drop(hpd_conn *c, const char *reason, bool notify) {
    if (c->closing) return;
    c->closing = true;
    if (reason)
        hp__log("warn", "event=worker_dropped peer=%s job=%s rank=%d reason=\"%s\"", c->peer,
                c->job ? c->job->v.id : "-", c->job ? c->rank : -1, reason);
    hpd_job *j = c->job;
    c->job = NULL;
    if (notify && j) hp__core_conn_lost(c->ws->d, j, c->attempt, c->rank);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->ws->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->next = c->prev = NULL;
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void hp__conn_close(hpd_conn *c, const char *reason) {
    if (!c) return;
    drop(c, NULL, false);
    (void)reason;
}

static void on_written(uv_write_t *req, int status) {
    wreq *w = (wreq *)req;
    hpd_conn *c = req->handle->data;
    hp_free(w->data);
    hp_free(w);
    if (status < 0 && status != UV_ECANCELED) drop(c, uv_strerror(status), true);
}

hp_status hp__conn_send(hpd_conn *c, const Hp__V1__Frame *f, hp_err *err) {
    if (c->closing) return hp_errf(err, HP_IO, "connection %s is closing", c->peer);
    Hp__V1__Frame copy = *f;
    copy.seq = ++c->seq;
    wreq *w = hp_malloc(sizeof *w);
    if (!w) return hp_errf(err, HP_NOMEM, "out of memory");
    size_t len = 0;
    hp_status st = hp_frame_encode(&copy, &w->data, &len, err);
    if (st != HP_OK) {
        hp_free(w);
        return st;
    }
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written);
    if (rc < 0) {
        hp_free(w->data);
        hp_free(w);
        drop(c, uv_strerror(rc), true);
        return hp_errf(err, HP_IO, "write to %s: %s", c->peer, uv_strerror(rc));
    }
    return HP_OK;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    hpd_conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void handle_frame(hpd_conn *c, Hp__V1__Frame *f) {
    hpd *d = c->ws->d;
    if (!c->job) {
        if (f->body_case != HP__V1__FRAME__BODY_HELLO) {
            drop(c, "first frame is not hello", false);
            return;
        }
        hp_err err = {0};
        hpd_job *j = NULL;
        int attempt = 0;
        if (hp__core_hello(d, c, f->hello, &j, &attempt, &err) != HP_OK) {
            drop(c, err.msg, false);
            return;
        }
        c->job = j;
        c->attempt = attempt;
        c->rank = f->hello->rank;
        /* A rank's program can be megabytes; past hello the full bound applies. */
        c->rd.max = HP_FRAME_MAX;
        return;
    }
    if (f->body_case == HP__V1__FRAME__BODY_HELLO) {
        drop(c, "second hello", true);
        return;
    }
    hp__core_frame(d, c->job, c->attempt, c->rank, f);
}

/* Before Hello: the next buffered frame's strings (its job id, token, host) hold no NUL byte and
 * are UTF-8, checked on the wire bytes, since the decoded char * ends at a NUL ("j-2\0x" would
 * be welcomed as "j-2"). True also when the frame is not complete yet. */
static bool hello_strings_ok(hpd_conn *c, hp_err *err) {
    const hp_frame_reader *r = &c->rd;
    size_t avail = r->len - r->off;
    if (avail < 4) return true;
    const uint8_t *p = r->buf + r->off;
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (n > r->max || avail - 4 < n) return true; /* the reader refuses it, or waits */
    hpd_pb_limits lim = {.max_alloc = HELLO_FRAME_MAX * 64, .max_depth = 8, .check_strings = true};
    hp_status st = hp__pb_check(&hp__v1__frame__descriptor, p + 4, n, &lim, NULL, err);
    return st != HP_INVALID && st != HP_LIMIT;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
    hpd_conn *c = s->data;
    if (c->closing) return;
    if (n < 0) {
        drop(c, n == UV_EOF ? NULL : uv_strerror((int)n), true);
        return;
    }
    hp_err err = {0};
    /* One transaction for the metrics of one read (ingest at 10^5 records/s); transitions
     * inside still commit before they are acted on (store.h). */
    hpd_store *store = c->ws->d->store;
    bool batch = hpd_store_begin(store, NULL) == HP_OK;
    if (hp_frame_reader_feed(&c->rd, buf->base, (size_t)n, &err) != HP_OK) {
        drop(c, err.msg, true);
    } else {
        while (!c->closing) {
            Hp__V1__Frame *f = NULL;
            if (!c->job && !hello_strings_ok(c, &err)) {
                drop(c, err.msg, true);
                break;
            }
            if (hp_frame_reader_next(&c->rd, &f, &err) != HP_OK) {
                drop(c, err.msg, true);
                break;
            }
            if (!f) break;
            handle_frame(c, f);
            hp_frame_free(f);
        }
    }
    hp__core_flush_steps(c->ws->d);
    if (batch && hpd_store_commit(store, &err) != HP_OK)
        hp__log("error", "event=store_commit_failed error=\"%s\"", err.msg);
}

static void free_handle(uv_handle_t *h) {
    hp_free(h);
}

static void on_connection(uv_stream_t *server, int status) {
    hpd_workers *ws = server->data;
    if (status < 0) {
        hp__log("warn", "event=worker_accept_failed error=\"%s\"", uv_strerror(status));
        return;
    }
    hpd_conn *c = hp_calloc(1, sizeof *c);
    if (!c) {
        /* Accept and close at once, or the listener would spin on the pending connection. */
        uv_tcp_t *t = hp_malloc(sizeof *t);
        if (t && uv_tcp_init(server->loop, t) == 0) {
            (void)uv_accept(server, (uv_stream_t *)t);
            uv_close((uv_handle_t *)t, free_handle);
        } else {
            hp_free(t);
        }
        hp__log("error", "event=worker_accept_failed error=\"out of memory\"");
        return;
    }
    c->ws = ws;
    c->opened_ms = hp__now_ms();
    hp_frame_reader_init(&c->rd, HELLO_FRAME_MAX);
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        char ip[48] = "?";
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            snprintf(c->peer, sizeof c->peer, "%s:%d", ip,
                     ntohs(((struct sockaddr_in *)&ss)->sin_port));
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip,
                     ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
        }
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->next = ws->conns;
    if (ws->conns) ws->conns->prev = c;
    ws->conns = c;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0) drop(c, uv_strerror(rc), false);
}

static void on_timer(uv_timer_t *t) {
    hpd_workers *ws = t->data;
    uint64_t now = hp__now_ms();
    for (hpd_conn *c = ws->conns, *next; c; c = next) {
        next = c->next;
        if (!c->job && now - c->opened_ms > 10000) drop(c, "no hello within 10 s", false);
    }
}

/* Both handles live in ws: it is freed after the last close callback. */
static void on_server_closed(uv_handle_t *h) {
    hpd_workers *ws = h->data;
    if (--ws->open_handles == 0) hp_free(ws);
}

static hp_status parse_addr(const char *addr, struct sockaddr_storage *ss, hp_err *err) {
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host)
        return hp_errf(err, HP_INVALID, "worker listen address '%s': want HOST:PORT", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535 || end == colon + 1)
        return hp_errf(err, HP_INVALID, "worker listen address '%s': bad port", addr);
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0) return HP_OK;
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        if (uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss) == 0) return HP_OK;
    }
    return hp_errf(err, HP_INVALID, "worker listen address '%s': not an IP address", addr);
}

/* Listens on addr, or on fd (> 0: a listening socket systemd passed) when addr is NULL. */
static hp_status workers_start(hpd *d, const char *addr, int fd, int *port, hp_err *err) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (addr) HP_TRY(parse_addr(addr, &ss, err));
    hpd_workers *ws = hp_calloc(1, sizeof *ws);
    if (!ws) return hp_errf(err, HP_NOMEM, "out of memory");
    ws->d = d;
    uv_tcp_init(d->loop, &ws->server);
    ws->server.data = ws;
    int rc = addr ? uv_tcp_bind(&ws->server, (struct sockaddr *)&ss, 0)
                  : uv_tcp_open(&ws->server, (uv_os_sock_t)fd);
    if (!addr) addr = "(the socket systemd passed)";
    if (rc == 0) rc = uv_listen((uv_stream_t *)&ws->server, 128, on_connection);
    if (rc < 0) {
        /* the handle lives in ws: free ws once its close callback ran */
        ws->open_handles = 1;
        uv_close((uv_handle_t *)&ws->server, on_server_closed);
        return hp_errf(err, HP_IO, "worker listen %s: %s", addr, uv_strerror(rc));
    }
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&ws->server, (struct sockaddr *)&bound, &len);
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    uv_timer_init(d->loop, &ws->timer);
    ws->timer.data = ws;
    uv_timer_start(&ws->timer, on_timer, 1000, 1000);
    ws->open_handles = 2;
    d->workers = ws;
    return HP_OK;
}

hp_status hp__workers_start(hpd *d, const char *addr, int *port, hp_err *err) {
    return workers_start(d, addr, -1, port, err);
}

hp_status hp__workers_start_fd(hpd *d, int fd, char *host, size_t host_len, int *port,
                               hp_err *err) {
    HP_TRY(workers_start(d, NULL, fd, port, err));
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(host, host_len, "0.0.0.0");
    if (uv_tcp_getsockname(&d->workers->server, (struct sockaddr *)&ss, &len) == 0) {
        char ip[64] = "";
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            snprintf(host, host_len, "[%s]", ip);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            snprintf(host, host_len, "%s", ip);
        }
    }
    return HP_OK;
}

void hp__workers_stop(hpd *d) {
    hpd_workers *ws = d->workers;
    if (!ws) return;
    d->workers = NULL;
    while (ws->conns) drop(ws->conns, NULL, true);
    uv_close((uv_handle_t *)&ws->timer, on_server_closed);
    uv_close((uv_handle_t *)&ws->server, on_server_closed);
}
