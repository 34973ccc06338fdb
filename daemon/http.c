/* daemon/http.c — hpd's HTTP server: libmicrohttpd with a pool of its own threads, routing,
 * the dashboard's static files, JSON replies and errors. The loop side is only the start, the
 * stop and the timer that publishes the snapshot (observe.c) every 250 ms.
 *
 * Read-only by construction: GET and HEAD only (405 otherwise); every failure is a JSON error
 * with a 4xx/5xx status. Requests larger than MHD's connection memory (32 KiB of headers and
 * URL) are answered 414/431 by MHD itself.
 */
#include "daemon/http_internal.h"
#include "daemon/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define PUBLISH_MS      250
#define HTTP_THREADS    4
#define STATIC_MAX      (8u << 20)
#define HTTP_CONN_LIMIT 512

/* ---- replies ------------------------------------------------------------------------------ */
static void set_body(http_reply *r, unsigned status, const char *type, char *body, size_t len) {
    free(r->body);
    r->status = status;
    r->type = type;
    r->body = body;
    r->len = len;
}

void http_json(http_reply *r, unsigned status, json_t *doc) {
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        static const char oom[] = "{\"error\":{\"code\":500,\"message\":\"out of memory\"}}";
        char *b = strdup(oom);
        set_body(r, 500, "application/json", b, b ? strlen(b) : 0);
        return;
    }
    set_body(r, status, "application/json", text, strlen(text));
}

void http_error(http_reply *r, unsigned status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *doc =
        json_pack("{s:{s:i, s:o}}", "error", "code", (int)status, "message", http_jstr(msg));
    http_json(r, status, doc);
}

/* Copies s replacing every byte that does not start a valid UTF-8 sequence with U+FFFD. */
json_t *http_jstr(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s);
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    for (; i < n; i++) { /* fast path: plain ASCII */
        if (p[i] >= 0x80) break;
    }
    if (i == n) return json_stringn(s, n);
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (i = 0; i < n;) {
        unsigned c = p[i];
        int len = c < 0x80             ? 1
                  : (c & 0xE0) == 0xC0 ? 2
                  : (c & 0xF0) == 0xE0 ? 3
                  : (c & 0xF8) == 0xF0 ? 4
                                       : 0;
        bool ok = len > 0 && i + (size_t)len <= n;
        for (int k = 1; ok && k < len; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && len == 2) ok = c >= 0xC2;
        if (ok && len == 3) {
            unsigned cp = (c & 0x0F) << 12 | (p[i + 1] & 0x3F) << 6 | (p[i + 2] & 0x3F);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && len == 4) {
            unsigned cp = (c & 0x07) << 18 | (p[i + 1] & 0x3F) << 12 | (p[i + 2] & 0x3F) << 6 |
                          (p[i + 3] & 0x3F);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            memcpy(out + o, p + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

const char *http_arg(const http_args *a, const char *key) {
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->key[i], key) == 0) return a->val[i];
    return NULL;
}

/* ---- arguments ---------------------------------------------------------------------------- */
static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

typedef struct args_ctx {
    http_args *a;
    const char *bad; /* why they are refused */
    char dup[96];
} args_ctx;

/* MHD's unescaping, but %00 stays as the three characters: a decoded NUL would end the path
 * ("/metrics%00" read as "/metrics"); on_request and on_arg refuse what still holds "%00". */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls;
    (void)conn;
    char *o = s;
    for (const char *p = s; *p;) {
        int hi, lo;
        if (p[0] == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0 && (hi | lo)) {
            *o++ = (char)(hi << 4 | lo);
            p += 3;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return (size_t)(o - s);
}

static enum MHD_Result on_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                              const char *value, size_t value_size) {
    args_ctx *c = cls;
    (void)kind;
    if (!key || strlen(key) != key_size || (value && strlen(value) != value_size)) {
        c->bad = "a query argument holds a NUL byte";
        return MHD_NO;
    }
    if (strstr(key, "%00") || (value && strstr(value, "%00"))) {
        c->bad = "a query argument holds a NUL byte (%00)";
        return MHD_NO;
    }
    if (strcmp(key, "token") == 0 || strcmp(key, "access_token") == 0) {
        c->bad = "a token goes in the 'Authorization: Bearer' header (the dashboard: in the URL "
                 "fragment, #token=...), never in the query string";
        return MHD_NO;
    }
    /* one value per argument, except `state`, a documented list (state=A&state=B,C) */
    for (int i = 0; strcmp(key, "state") != 0 && i < c->a->n; i++)
        if (strcmp(c->a->key[i], key) == 0) {
            snprintf(c->dup, sizeof c->dup, "query argument '%.40s' given more than once", key);
            c->bad = c->dup;
            return MHD_NO;
        }
    if (c->a->n == HTTP_ARGS_MAX) {
        c->bad = "more than 32 query arguments"; /* on_uri refuses most of these first */
        return MHD_NO;
    }
    c->a->key[c->a->n] = key;
    c->a->val[c->a->n] = value ? value : "";
    c->a->n++;
    return MHD_YES;
}

/* ---- static files ------------------------------------------------------------------------- */
static const char *content_type(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    if (!strcmp(dot, ".png")) return "image/png";
    if (!strcmp(dot, ".ico")) return "image/x-icon";
    if (!strcmp(dot, ".json")) return "application/json";
    return "application/octet-stream";
}

/* A file name of the share dir: letters, digits, '.', '_', '-', not starting with '.'. */
static bool safe_name(const char *s) {
    if (!*s || *s == '.' || strlen(s) > 128) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

static void serve_file(hpd_http *h, const char *name, http_reply *r) {
    char path[2200];
    if (!strcmp(name, "chart.min.js") || !strcmp(name, "chart.js")) {
        snprintf(path, sizeof path, "%s", h->chartjs);
    } else {
        if (!h->share_dir[0]) {
            http_error(r, 404,
                       "the dashboard's files were not found (install share/hp/dashboard or set "
                       "HP_SHARE_DIR)");
            return;
        }
        snprintf(path, sizeof path, "%s/%s", h->share_dir, name);
    }
    uint8_t *data = NULL;
    size_t len = 0;
    hp_err e = {0};
    if (hp_file_read(path, STATIC_MAX, &data, &len, &e) != HP_OK) {
        if (access(path, F_OK) != 0)
            http_error(r, 404, "no file '%s'", name);
        else
            http_error(r, 500, "%s", e.msg);
        return;
    }
    char *body = malloc(len ? len : 1);
    if (!body) {
        hp_free(data);
        http_error(r, 500, "out of memory");
        return;
    }
    memcpy(body, data, len);
    hp_free(data);
    set_body(r, 200, content_type(name), body, len);
}

/* ---- the render cache ---------------------------------------------------------------------
 * /metrics and the job list depend on the snapshot and the query only, and dashboards and
 * scrapers ask for them over and over: each is rendered once per snapshot (published every
 * 250 ms at most) and copied out after. */
static bool cache_get(hpd_http *h, const hpd_snap *s, const char *key, http_reply *r) {
    bool hit = false;
    pthread_mutex_lock(&h->cache_mu);
    for (size_t i = 0; i < HP_ARRAY_LEN(h->cache); i++) {
        struct http_cached *c = &h->cache[i];
        if (c->snap != s || strcmp(c->key, key) != 0) continue;
        char *b = malloc(c->len ? c->len : 1);
        if (b) {
            memcpy(b, c->body, c->len);
            set_body(r, c->status, c->type, b, c->len);
            c->used = ++h->cache_clock;
            hit = true;
        }
        break;
    }
    pthread_mutex_unlock(&h->cache_mu);
    return hit;
}

static void cache_put(hpd_http *h, hpd_snap *s, const char *key, const http_reply *r) {
    if (r->status != 200 || !r->body) return;
    char *b = malloc(r->len ? r->len : 1);
    if (!b) return;
    memcpy(b, r->body, r->len);
    pthread_mutex_lock(&h->cache_mu);
    struct http_cached *victim = NULL, *c;
    size_t n = HP_ARRAY_LEN(h->cache);
    for (size_t i = 0; !victim && i < n; i++) /* the same key (rendered twice at once) */
        if (c = &h->cache[i], c->snap == s && strcmp(c->key, key) == 0) victim = c;
    for (size_t i = 0; !victim && i < n; i++) /* empty, or of an older snapshot */
        if (c = &h->cache[i], c->snap != s) victim = c;
    if (!victim) { /* the least recently used */
        victim = &h->cache[0];
        for (size_t i = 1; i < n; i++)
            if (h->cache[i].used < victim->used) victim = &h->cache[i];
    }
    hpd_snap *old = victim->snap;
    free(victim->body);
    victim->snap = s;
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    snprintf(victim->key, sizeof victim->key, "%s", key);
    victim->status = r->status;
    victim->type = r->type;
    victim->body = b;
    victim->len = r->len;
    victim->used = ++h->cache_clock;
    pthread_mutex_unlock(&h->cache_mu);
    hpd_snap_put(old);
}

static void cache_clear(hpd_http *h) {
    for (size_t i = 0; i < HP_ARRAY_LEN(h->cache); i++) {
        hpd_snap_put(h->cache[i].snap);
        free(h->cache[i].body);
        memset(&h->cache[i], 0, sizeof h->cache[i]);
    }
}

/* The cache key of a cacheable request ("" : not cacheable). */
static void cache_key(const char *url, const http_args *a, char *key, size_t n) {
    key[0] = 0;
    if (strcmp(url, "/metrics") != 0 && strcmp(url, "/api/v1/jobs") != 0 &&
        strcmp(url, "/api/v1/jobs/") != 0)
        return;
    size_t o = (size_t)snprintf(key, n, "%s", url);
    for (int i = 0; i < a->n && o < n; i++)
        o += (size_t)snprintf(key + o, n - o, "%c%s=%s", i ? '&' : '?', a->key[i], a->val[i]);
    if (o >= n) key[0] = 0; /* too long to cache: rendered each time */
}

/* ---- routing ------------------------------------------------------------------------------ */
static void route(hpd_http *h, const char *url, const http_args *a, http_reply *r) {
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
        serve_file(h, "index.html", r);
        return;
    }
    if (!strncmp(url, "/static/", 8)) {
        if (!safe_name(url + 8)) {
            http_error(r, 404, "no file '%.100s'", url + 8);
            return;
        }
        serve_file(h, url + 8, r);
        return;
    }
    if (!strcmp(url, "/healthz")) {
        http_json(r, 200, json_pack("{s:s}", "status", "ok"));
        return;
    }
    hpd_snap *s = hpd_snap_get(h->obs);
    if (!s) {
        http_error(r, 503, "starting up: no snapshot published yet");
        return;
    }
    char key[512];
    cache_key(url, a, key, sizeof key);
    if (key[0] && cache_get(h, s, key, r)) {
        hpd_snap_put(s);
        return;
    }
    if (!strcmp(url, "/metrics"))
        http_prom(h, s, r);
    else if (!strncmp(url, "/api/v1/", 8))
        http_api(h, s, url + 8, a, r);
    else if (!strcmp(url, "/api/v1"))
        http_api(h, s, "", a, r);
    else
        http_error(r, 404, "no such path '%.200s' (see /api/v1/jobs, /metrics, /)", url);
    if (key[0]) cache_put(h, s, key, r);
    hpd_snap_put(s);
}

/* ---- too many query arguments ------------------------------------------------------------
 * MHD stores every query argument as a record in the connection's 32 KiB memory pool while it
 * parses the request line, before any callback of ours sees one. A URL of ≈ 500 short
 * arguments fits the pool as text but not as records: MHD 0.9.75 then fails to build its own
 * 431 in the exhausted pool and holds the connection until the 30 s timeout. So the arguments
 * are counted here, in MHD's URI callback (called with the raw request target before MHD
 * parses the arguments, in the connection's own writable read buffer), and past HTTP_ARGS_MAX
 * the query string is cut to "" so that MHD stores none; on_request then answers 400. The
 * per-request context is one of these markers (no allocation, nothing to free). */
static int req_fresh, req_fresh_too_many, req_seen, req_seen_too_many;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)cls;
    (void)conn;
    char *q = uri ? strchr(uri, '?') : NULL;
    if (!q || !q[1]) return &req_fresh;
    int n = 1;
    for (const char *p = q + 1; *p; p++) n += *p == '&';
    if (n <= HTTP_ARGS_MAX) return &req_fresh;
    q[1] = 0; /* MHD's buffer: MHD itself writes the '\0' over the '?' next */
    return &req_fresh_too_many;
}

/* ---- --auth all --------------------------------------------------------------------------
 * Exactly one `Authorization: Bearer <token>` header, compared in constant time, as rpc.c
 * does for gRPC. Never from the query string (URLs end up in logs and browser history): the
 * dashboard reads it from the URL fragment, which browsers do not send, and puts it in this
 * header. /healthz (probes) and the dashboard's static files (no job data; the page must load
 * before it can send the header) need none. */
typedef struct auth_ctx {
    int seen;
    const char *val;
} auth_ctx;

static enum MHD_Result on_auth_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    auth_ctx *a = cls;
    (void)kind;
    if (key && strcasecmp(key, "Authorization") == 0) {
        a->seen++;
        a->val = value;
    }
    return MHD_YES;
}

static bool needs_token(const char *url) {
    return strcmp(url, "/healthz") != 0 && strcmp(url, "/") != 0 &&
           strcmp(url, "/index.html") != 0 && strncmp(url, "/static/", 8) != 0;
}

static bool http_authorized(hpd_http *h, struct MHD_Connection *conn) {
    auth_ctx a = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, on_auth_header, &a);
    if (a.seen != 1 || !a.val || !h->token[0]) return false;
    static const char prefix[] = "Bearer ";
    size_t plen = sizeof prefix - 1, tlen = strlen(h->token), vlen = strlen(a.val);
    size_t want = plen + tlen;
    unsigned diff = vlen != want;
    for (size_t i = 0; i < want; i++) {
        char e = i < plen ? prefix[i] : h->token[i - plen];
        char g = i < vlen ? a.val[i] : 0;
        diff |= (unsigned)(unsigned char)(e ^ g);
    }
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_ctx) {
    hpd_http *h = cls;
    (void)version;
    (void)upload;
    if (*req_ctx == &req_fresh || *req_ctx == &req_fresh_too_many || !*req_ctx) {
        /* first call: headers only; answer on the next */
        *req_ctx = *req_ctx == &req_fresh_too_many ? &req_seen_too_many : &req_seen;
        if (*upload_size == 0) goto answer;
        return MHD_YES;
    }
    if (*upload_size) { /* a body on a read-only API: drop it, answer 405/400 below */
        *upload_size = 0;
        return MHD_YES;
    }
answer:;
    http_reply r = {0};
    http_args a = {0};
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        http_error(&r, 405, "method %.20s not allowed: the HTTP interface is read-only", method);
    } else if (h->auth_all && url && needs_token(url) && !http_authorized(h, conn)) {
        http_error(&r, 401,
                   "missing or wrong bearer token: hpd runs with --auth all (send "
                   "'Authorization: Bearer <STATE_DIR/token>'; the dashboard: "
                   "http://HOST:PORT/#token=<token>)");
    } else if (*req_ctx == &req_seen_too_many) {
        http_error(&r, 400, "more than %d query arguments", HTTP_ARGS_MAX);
    } else {
        args_ctx ac = {.a = &a};
        MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, on_arg, &ac);
        if (ac.bad)
            http_error(&r, 400, "%s", ac.bad);
        else if (!url || url[0] != '/')
            http_error(&r, 400, "bad request target");
        else if (strstr(url, "%00"))
            http_error(&r, 400, "path: holds a NUL byte (%%00)");
        else
            route(h, url, &a, &r);
    }
    if (!r.body) http_error(&r, 500, "no reply");
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        r.len, r.body, r.body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(r.body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r.type ? r.type : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (r.status == 405) MHD_add_response_header(resp, "Allow", "GET, HEAD");
    if (r.status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"hpd\"");
    enum MHD_Result ret = MHD_queue_response(conn, r.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    for (char *p = msg; *p; p++)
        if (*p == '"') *p = '\'';
    hp__log("debug", "event=http_error what=\"%s\"", msg);
}

/* ---- start/stop (loop thread) ------------------------------------------------------------- */
static void on_publish(uv_timer_t *t) {
    hp__obs_publish(t->data);
}

/* The share dir: $HP_SHARE_DIR, BINDIR/../share/hp/dashboard, the source tree's. */
static void find_share(char *out, size_t n) {
    const char *env = getenv("HP_SHARE_DIR");
    char cand[3][1000];
    int nc = 0;
    if (env && *env) snprintf(cand[nc++], sizeof cand[0], "%.990s", env);
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(cand[nc++], sizeof cand[0], "%.960s/../share/hp/dashboard", exe);
    }
#ifdef HP_SOURCE_SHARE_DIR
    snprintf(cand[nc++], sizeof cand[0], "%.990s", HP_SOURCE_SHARE_DIR);
#endif
    out[0] = 0;
    for (int i = 0; i < nc; i++) {
        char f[1100];
        snprintf(f, sizeof f, "%.990s/index.html", cand[i]);
        if (access(f, R_OK) == 0) {
            snprintf(out, n, "%.990s", cand[i]);
            return;
        }
    }
}

/* Binds addr ("HOST:PORT", HOST a name or address, [v6] in brackets) and listens. */
/* "IP:PORT" / "[IP6]:PORT" of a bound socket. */
static void bound_name(int fd, char *bound, size_t bound_len) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    char ip[INET6_ADDRSTRLEN] = "?";
    int p = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof ip);
        p = ntohs(v4->sin_port);
        snprintf(bound, bound_len, "%s:%d", ip, p);
    } else {
        struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof ip);
        p = ntohs(v6->sin6_port);
        snprintf(bound, bound_len, "[%s]:%d", ip, p);
    }
}

static int bind_listen(const char *addr, char *bound, size_t bound_len, hp_err *err) {
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return hp_errf(err, HP_INVALID, "'%s' is not HOST:PORT", addr), -1;
    char host[256], *end;
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host) return hp_errf(err, HP_INVALID, "host too long"), -1;
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return hp_errf(err, HP_INVALID, "port '%s' is not in [0, 65535]", colon + 1), -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai) return hp_errf(err, HP_INVALID, "%s: %s", host, gai_strerror(gai)), -1;
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            last = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return hp_errf(err, HP_IO, "bind %s: %s", addr, strerror(last)), -1;
    bound_name(fd, bound, bound_len);
    return fd;
}

hp_status hpd_http_start(hpd *d, const hpd_http_config *cfg, char *bound, size_t bound_len,
                         hp_err *err) {
    if (d->http) return hp_errf(err, HP_INVALID, "http: already started");
    hpd_http *h = hp_calloc(1, sizeof *h);
    if (!h) return hp_errf(err, HP_NOMEM, "http: out of memory");
    h->retention_s = cfg->retention_s;
    h->listen_fd = -1;
    pthread_mutex_init(&h->store_mu, NULL);
    pthread_mutex_init(&h->cache_mu, NULL);
    snprintf(h->state_dir, sizeof h->state_dir, "%.1000s", d->state_dir);
    h->auth_all = d->auth_all;
    snprintf(h->token, sizeof h->token, "%s", d->token);
    if (cfg->share_dir)
        snprintf(h->share_dir, sizeof h->share_dir, "%.1000s", cfg->share_dir);
    else
        find_share(h->share_dir, sizeof h->share_dir);
    const char *cj = getenv("HP_CHARTJS");
    snprintf(h->chartjs, sizeof h->chartjs, "%s",
             cj && *cj ? cj : "/usr/share/javascript/chart.js/chart.min.js");
    if (!d->obs && hp__obs_new(&d->obs, err) != HP_OK) goto fail;
    h->obs = d->obs;
    if (cfg->fd > 0) { /* socket activation: systemd bound it */
        h->listen_fd = cfg->fd;
        bound_name(cfg->fd, bound, bound_len);
    } else {
        h->listen_fd = bind_listen(cfg->addr, bound, bound_len, err);
    }
    if (h->listen_fd < 0) goto fail;
    h->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET,
        h->listen_fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL,
        MHD_OPTION_END);
    if (!h->mhd) {
        hp_errf(err, HP_IO, "http: the server did not start (libmicrohttpd)");
        goto fail;
    }
    d->http = h;
    hp__obs_publish(d);
    uv_timer_init(d->loop, &h->publish);
    h->publish.data = d;
    uv_timer_start(&h->publish, on_publish, PUBLISH_MS, PUBLISH_MS);
    hp__log("info", "event=http_listening addr=%s dashboard=%s", bound,
            h->share_dir[0] ? h->share_dir : "(not found)");
    return HP_OK;
fail:
    if (h->listen_fd >= 0) close(h->listen_fd);
    pthread_mutex_destroy(&h->store_mu);
    pthread_mutex_destroy(&h->cache_mu);
    hp_free(h);
    return err ? err->status : HP_IO;
}

void hpd_http_set_retention(hpd *d, double seconds) {
    if (!d || !d->http) return;
    hpd_http *h = d->http;
    __atomic_store(&h->retention_s, &seconds, __ATOMIC_RELAXED);
    pthread_mutex_lock(&h->cache_mu); /* /metrics was rendered with the old one */
    cache_clear(h);
    pthread_mutex_unlock(&h->cache_mu);
}

static void on_timer_closed(uv_handle_t *t) {
    hp_free(t->data);
}

void hpd_http_stop(hpd *d) {
    if (!d || !d->http) return;
    hpd_http *h = d->http;
    d->http = NULL;
    MHD_stop_daemon(h->mhd); /* joins its threads and closes the listening socket */
    hpd_store_close(h->rstore);
    pthread_mutex_destroy(&h->store_mu);
    cache_clear(h);
    pthread_mutex_destroy(&h->cache_mu);
    uv_timer_stop(&h->publish);
    h->publish.data = h;
    uv_close((uv_handle_t *)&h->publish, on_timer_closed);
}
