/* daemon/http.h — hpd's read-only HTTP interface (libmicrohttpd on its own threads): the
 * dashboard, the JSON API under /api/v1 and the Prometheus exposition at /metrics. See
 * docs/http-api.md for the paths and objects.
 *
 * The HTTP threads never touch the loop's structures: they read the snapshot the loop
 * publishes every 250 ms (daemon/observe.h), the store through their own read-only SQLite
 * connection (WAL lets it read while the loop writes), and log/trace files.
 */
#ifndef HP_DAEMON_HTTP_H
#define HP_DAEMON_HTTP_H

#include "daemon/hpd.h"

#include <stddef.h>

typedef struct hpd_http_config {
    const char *addr;      /* "HOST:PORT" (port 0: any); loopback unless told otherwise */
    int fd;                /* > 0: serve on this listening socket instead (socket activation;
                              the server owns it from here) */
    double retention_s;    /* finished jobs stay in /metrics this long */
    const char *share_dir; /* the dashboard's files; NULL: $HP_SHARE_DIR, beside the binary, the
                              source tree */
} hpd_http_config;

/* Starts the server (loop thread). bound gets "HOST:PORT" as bound. */
hp_status hpd_http_start(hpd *d, const hpd_http_config *cfg, char *bound, size_t bound_len,
                         hp_err *err);
/* A new retention for finished jobs in /metrics (SIGHUP). */
void hpd_http_set_retention(hpd *d, double seconds);
/* Stops the server and the snapshot timer (loop thread; waits for requests in flight). NULL-
 * and twice-safe. */
void hpd_http_stop(hpd *d);

#endif
