/* daemon/http_internal.h — what http.c (server, routing, static files), http_api.c (the JSON
 * API) and http_prom.c (the Prometheus exposition) share. HTTP threads only, except
 * where noted.
 */
#ifndef HP_DAEMON_HTTP_INTERNAL_H
#define HP_DAEMON_HTTP_INTERNAL_H

#include "daemon/http.h"
#include "daemon/observe.h"
#include "daemon/store.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>

typedef struct hpd_http {
    struct MHD_Daemon *mhd;
    hpd_obs *obs;
    uv_timer_t publish;   /* loop thread */
    double retention_s;   /* atomic (SIGHUP changes it while HTTP threads read it) */
    char share_dir[1024]; /* "" : no dashboard files found */
    char chartjs[1024];   /* Debian's Chart.js */
    char state_dir[1024];
    pthread_mutex_t store_mu; /* guards rstore */
    hpd_store *rstore;        /* read-only connection; NULL until first use */
    int listen_fd;
    pthread_mutex_t cache_mu; /* guards cache */
    struct http_cached {
        hpd_snap *snap; /* a reference: the entry is valid while this is the current one */
        char key[512];
        unsigned status;
        const char *type;
        char *body;
        size_t len;
        uint64_t used;
    } cache[8];
    uint64_t cache_clock;
    bool auth_all;  /* --auth all: every path but /healthz and the static files needs token */
    char token[65]; /* STATE_DIR/token (set before the threads start, never changed) */
} hpd_http;

/* A response being built: status, content type, body (malloc'd: MHD frees it). */
typedef struct http_reply {
    unsigned status;
    const char *type;
    char *body;
    size_t len;
} http_reply;

/* The query arguments, decoded and checked to hold no NUL. */
#define HTTP_ARGS_MAX 32
typedef struct http_args {
    int n;
    const char *key[HTTP_ARGS_MAX];
    const char *val[HTTP_ARGS_MAX];
} http_args;

/* Sets r to a JSON error {"error": {"code": status, "message": ...}}. */
void http_error(http_reply *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets r to the JSON document (stolen: decref'd here). */
void http_json(http_reply *r, unsigned status, json_t *doc);
/* A JSON string of s with invalid UTF-8 replaced (never NULL unless out of memory). */
json_t *http_jstr(const char *s);
/* The value of key (first occurrence) or NULL. */
const char *http_arg(const http_args *a, const char *key);

/* http_api.c: path is what follows "/api/v1/". */
void http_api(hpd_http *h, const hpd_snap *s, const char *path, const http_args *a, http_reply *r);
/* http_prom.c */
void http_prom(hpd_http *h, const hpd_snap *s, http_reply *r);

#endif
