/* client/hpctl.c — the command-line client: verb dispatch, usage, and the flag helpers the
 * verbs share. The verbs that talk to the coordinator are in hpctl_remote.c (over
 * rpc_client.c); the offline ones are in hpctl_job.c (new, inspect) and hpctl_plan.c (plan).
 *
 * Conventions: one line on stderr per error ("hpctl: new: --batch: 'x' is not an integer"),
 * exit 0 ok, 1 an error (bad file, failed operation), 2 a usage error. */
#include "client/hpctl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HPCTL_VERSION "0.1.0"

int hpctl_fail(int code, const char *verb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "hpctl: %s: ", verb);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int hpctl_parse_i64(const char *verb, const char *flag, const char *s, int64_t lo, int64_t hi,
                    int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: %lld is outside [%lld, %lld]", flag, v,
                          (long long)lo, (long long)hi);
    *out = v;
    return HPCTL_OK;
}

int hpctl_parse_f64(const char *verb, const char *flag, const char *s, double lo, double hi,
                    double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not a finite number", flag, s);
    if (v < lo || v > hi)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: %g is outside [%g, %g]", flag, v, lo, hi);
    *out = v;
    return HPCTL_OK;
}

static void usage(FILE *f) {
    fputs("usage: hpctl [common flags] <verb> [flags]\n"
          "\n"
          "offline verbs:\n"
          "  new --model FAMILY[:FLAVOR] [model and training flags] -o JOB.pb\n"
          "                        write a job file (see `hpctl new --help`)\n"
          "  inspect JOB.pb [--hpir] [--json]\n"
          "                        print a job's summary (params, FLOPs/token, graph size);\n"
          "                        --hpir prints the graph's text form\n"
          "  plan JOB.pb [--world N] [--json]\n"
          "                        compile offline: passes, per-rank memory, communication,\n"
          "                        estimated step time (see `hpctl plan --help`)\n"
          "\n"
          "coordinator verbs (common flags, before or after the verb: --server HOST:PORT\n"
          "(default $HP_SERVER or 127.0.0.1:7070), --token T ($HP_TOKEN, STATE_DIR/token),\n"
          "--tls-ca PEM, --timeout SECONDS, --json):\n"
          "  submit JOB.pb [--watch] [--request-id ID]\n"
          "                        submit a job; prints its id (--watch: then watch it)\n"
          "  status ID [--worker-cmd]  one job's state, step, loss; --worker-cmd: the command\n"
          "                        that starts each rank by hand (--launcher external)\n"
          "  list [--state S[,S]] [--page-size N] [--page-token T]\n"
          "                        jobs, newest first\n"
          "  cancel ID [--reason TEXT]\n"
          "                        stop a job\n"
          "  watch ID [--from-step N]\n"
          "                        live step, loss, tokens/s, MFU, ETA; exit 0 when the job\n"
          "                        SUCCEEDED, 1 when it FAILED or was CANCELLED\n"
          "  logs ID [--rank R] [--follow]\n"
          "                        a rank's log (STATE_DIR/jobs/ID/rank-R.log on the daemon's\n"
          "                        host; --follow without the file streams live lines)\n"
          "  trace ID --step S [--rank R ...] [-o FILE]\n"
          "                        write the Chrome trace of a profiled step (ranks merged) to\n"
          "                        FILE (default ID-step-S.trace.json); prints the path\n"
          "  checkpoint ID         ask the running job to write a checkpoint now\n"
          "\n"
          "  --help, -h            this text\n"
          "  --version             print the version\n"
          "\n"
          "exit codes: 0 ok, 1 error, 2 usage error\n",
          f);
}

/* Common flags before the verb (`hpctl --server X submit job.pb`, as kubectl, docker and git
 * take them) move to just after it, where the verb parses them as its own: a verb that takes
 * none (new, inspect, plan take only --json) refuses them by name, never ignores them. Returns
 * the verb's index in the rewritten argv, or -1 on a usage error (printed). */
static int hoist_common_flags(int argc, char **argv) {
    int i = 1;
    while (i < argc && argv[i][0] == '-' && strcmp(argv[i], "--help") && strcmp(argv[i], "-h") &&
           strcmp(argv[i], "--version")) {
        int n = hpctl_common_flag_arity(argv[i]);
        if (n < 0) {
            fprintf(stderr,
                    "hpctl: unknown flag '%s' before the verb (before it hpctl takes "
                    "--server, --token, --tls-ca, --timeout, --json; try hpctl --help)\n",
                    argv[i]);
            return -1;
        }
        if (i + n >= argc) {
            fprintf(stderr, "hpctl: %s needs a value\n", argv[i]);
            return -1;
        }
        i += 1 + n;
    }
    if (i == 1) return 1;
    if (i >= argc) {
        fputs("hpctl: missing verb after the flags (try hpctl --help)\n", stderr);
        return -1;
    }
    /* argv[1..i) are the flags, argv[i] the verb: rotate to verb, flags, rest */
    char *verb = argv[i];
    memmove(&argv[2], &argv[1], (size_t)(i - 1) * sizeof *argv);
    argv[1] = verb;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("hpctl: missing verb (try hpctl --help)\n", stderr);
        return HPCTL_USAGE;
    }
    if (hoist_common_flags(argc, argv) < 0) return HPCTL_USAGE;
    const char *verb = argv[1];
    if (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
        usage(stdout);
        return HPCTL_OK;
    }
    if (!strcmp(verb, "--version")) {
        printf("hpctl %s\n", HPCTL_VERSION);
        return HPCTL_OK;
    }
    if (!strcmp(verb, "new")) return hpctl_new(argc - 1, argv + 1);
    if (!strcmp(verb, "inspect")) return hpctl_inspect(argc - 1, argv + 1);
    if (!strcmp(verb, "plan")) return hpctl_plan(argc - 1, argv + 1);
    if (!strcmp(verb, "submit")) return hpctl_submit(argc - 1, argv + 1);
    if (!strcmp(verb, "status")) return hpctl_status(argc - 1, argv + 1);
    if (!strcmp(verb, "list")) return hpctl_list(argc - 1, argv + 1);
    if (!strcmp(verb, "cancel")) return hpctl_cancel(argc - 1, argv + 1);
    if (!strcmp(verb, "watch")) return hpctl_watch(argc - 1, argv + 1);
    if (!strcmp(verb, "logs")) return hpctl_logs(argc - 1, argv + 1);
    if (!strcmp(verb, "trace")) return hpctl_trace(argc - 1, argv + 1);
    if (!strcmp(verb, "checkpoint")) return hpctl_checkpoint(argc - 1, argv + 1);
    fprintf(stderr, "hpctl: unknown verb '%s' (try hpctl --help)\n", verb);
    return HPCTL_USAGE;
}
