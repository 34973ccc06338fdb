/* client/hpctl.h — what hpctl's verbs share: exit codes, error printing, flag parsing. */
#ifndef HP_CLIENT_HPCTL_H
#define HP_CLIENT_HPCTL_H

#include <stdint.h>

enum { HPCTL_OK = 0, HPCTL_ERROR = 1, HPCTL_USAGE = 2 };

/* Prints "hpctl: VERB: message" on stderr; returns code. */
int hpctl_fail(int code, const char *verb, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse a flag's value, with range; on failure print one line and return HPCTL_USAGE. */
int hpctl_parse_i64(const char *verb, const char *flag, const char *s, int64_t lo, int64_t hi,
                    int64_t *out);
int hpctl_parse_f64(const char *verb, const char *flag, const char *s, double lo, double hi,
                    double *out);

/* Verbs: argv[0] is the verb. Return an exit code. */
int hpctl_new(int argc, char **argv);
int hpctl_inspect(int argc, char **argv);
int hpctl_plan(int argc, char **argv);
/* Remote verbs (hpctl_remote.c): talk to hpd over gRPC. */
/* The remote verbs' common flags (--server, --token, --tls-ca, --timeout, --json): how many
 * values arg takes (0 or 1), or -1 when it is not one of them. */
int hpctl_common_flag_arity(const char *arg);
int hpctl_submit(int argc, char **argv);
int hpctl_status(int argc, char **argv);
int hpctl_list(int argc, char **argv);
int hpctl_cancel(int argc, char **argv);
int hpctl_watch(int argc, char **argv);
int hpctl_logs(int argc, char **argv);
int hpctl_trace(int argc, char **argv);
int hpctl_checkpoint(int argc, char **argv);

#endif
