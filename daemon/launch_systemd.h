/* daemon/launch_systemd.h — the pieces of the systemd launcher (launch_systemd.c) that are pure
 * and so tested on their own (tests/daemon/test_systemd.c): a rank's unit name, the
 * systemd-run command line that starts it, and the parse of `systemctl show` output into unit
 * states. The launcher itself is hpd_launcher_systemd_new (launch.h).
 */
#ifndef HP_DAEMON_LAUNCH_SYSTEMD_H
#define HP_DAEMON_LAUNCH_SYSTEMD_H

#include "daemon/launch.h"

#include <stdbool.h>
#include <stddef.h>

#define HPD_SD_UNIT_MAX 128 /* a unit name's bytes, with the NUL */

/* "hp-JOB-ATTEMPT-RANK.service" into out (rank < 0: the attempt's prefix "hp-JOB-ATTEMPT",
 * which is also the launch ref stored for adoption). HP_INVALID when the job id has a byte a
 * unit name cannot hold verbatim (only [A-Za-z0-9_.-] is taken) or the name is too long. */
hp_status hpd__sd_unit_name(const char *job_id, int attempt, int rank, char *out, size_t len,
                            hp_err *err);

/* What the command lines are built from. */
typedef struct hpd__sd_conf {
    const char *systemd_run; /* the binary (a path or a name PATH finds) */
    const char *worker;      /* hp-worker */
    bool user;               /* --user: the calling user's manager */
    bool token_file;         /* pass $HP_TOKEN_FILE (the 0600 file) instead of a credential */
    const char *slice;       /* Slice= ("": the manager's default) */
} hpd__sd_conf;

/* A command line and the storage its strings live in. */
typedef struct hpd__sd_argv {
    char *argv[40];
    int argc;
    char store[8 * 4096 + 1024];
    size_t used;
} hpd__sd_argv;

/* The systemd-run command that starts rank `rank` of attempt a as a transient service:
 * `systemd-run [--user] --unit=hp-J-A-R.service --property=Type=exec
 * --property=RemainAfterExit=yes (the exit status stays readable until hpd collected it) ...
 * --property=LoadCredential=hp-token:TOKEN_FILE WORKER --coordinator C --job J --rank R
 * --token-file ${CREDENTIALS_DIRECTORY}/hp-token` (the manager expands ${...}); with
 * token_file, `--setenv=HP_TOKEN_FILE=PATH` instead. The token itself is never in it.
 * HP_INVALID when a value cannot go into a unit property (a newline, too long). */
hp_status hpd__sd_run_argv(const hpd__sd_conf *c, const hpd_attempt_spec *a, int rank,
                           hpd__sd_argv *out, hp_err *err);

/* One unit as `systemctl show -p Id,LoadState,ActiveState,SubState,Result,ExecMainCode,
 * ExecMainStatus` prints it. main_code: CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3 (0: none). */
typedef struct hpd__sd_unit {
    char id[HPD_SD_UNIT_MAX];
    char load[32], active[32], sub[32], result[32];
    int main_code, main_status;
} hpd__sd_unit;

/* Parses text (len bytes; blocks of KEY=VALUE lines, one per unit, separated by blank lines)
 * into out[0..max), the count in *n. HP_INVALID, naming the line, for anything else: a line
 * without '=', a block without Id=, a number that is not one, a value too long, a NUL byte, more
 * than max blocks. Unknown keys are ignored. */
hp_status hpd__sd_parse_show(const char *text, size_t len, hpd__sd_unit *out, int max, int *n,
                             hp_err *err);

typedef enum {
    HPD_SD_RUNNING, /* starting, running or stopping */
    HPD_SD_ENDED,   /* its main process ended: *status is the rank's exit status */
    HPD_SD_GONE,    /* the manager does not know it (never started, or collected) */
} hpd__sd_phase;

/* What a unit's state says about its rank; *status: the exit code, 128 + the signal, or
 * HPD_EXIT_UNKNOWN. */
hpd__sd_phase hpd__sd_unit_phase(const hpd__sd_unit *u, int *status);

#endif
