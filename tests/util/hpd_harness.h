/* tests/util/hpd_harness.h — a real hpd for Criterion tests: started from the build dir on
 * 127.0.0.1 port 0 (gRPC and workers), its "hpd listening ..." line parsed, stopped with
 * SIGTERM. Together with cli_harness.h (running hpctl and friends). */
#ifndef HP_TEST_HPD_HARNESS_H
#define HP_TEST_HPD_HARNESS_H

#include <sys/types.h>

typedef struct hp_th_hpd {
    pid_t pid;        /* -1: not running */
    char grpc[64];    /* "127.0.0.1:PORT" */
    char http[64];    /* "127.0.0.1:PORT" or "off" ("" : hpd did not say) */
    char workers[64]; /* the worker protocol's "127.0.0.1:PORT" (its workers' --coordinator) */
} hp_th_hpd;

/* Starts BUILD/daemon/hpd --listen 127.0.0.1:0 --worker-listen 127.0.0.1:0 --state-dir
 * STATE then the NULL-terminated extra args (pass "--http", "127.0.0.1:0" unless a config
 * file decides), stderr appended to log_path (NULL: inherited). Returns once hpd printed its
 * listening line (30 s at most); asserts otherwise, showing the log. */
void hp_th_hpd_start(hp_th_hpd *h, const char *state_dir, const char *log_path,
                     const char *const *extra);
/* SIGTERM, then waits up to 30 s (SIGKILL after). Returns the exit status, -1 when it had to be
 * killed or died of a signal, -2 when it was not running. */
int hp_th_hpd_stop(hp_th_hpd *h);

#endif
