/* daemon/launch_slurm.h — the pieces of the Slurm launcher (launch_slurm.c) that are pure and so
 * tested on their own (tests/daemon/test_slurm.c, suite slurm_parse): the parse of
 * `sacct -j ID --format=JobID,State,ExitCode -P -n`, which the launcher runs when a job left
 * squeue before hpd saw its end. The launcher itself is hpd_launcher_slurm_new (launch.h).
 */
#ifndef HP_DAEMON_LAUNCH_SLURM_H
#define HP_DAEMON_LAUNCH_SLURM_H

#include "hp/base.h"

#include <stddef.h>

/* What sacct says of one job. */
typedef struct hpd__sacct_job {
    char state[32];       /* the job's State, its first word ("CANCELLED by 0" → "CANCELLED") */
    int exit_code;        /* the job's ExitCode "CODE:SIGNAL": the batch script's status */
    int exit_signal;      /*   ... and the signal that ended it (0: none) */
    int steps;            /* numbered steps listed (ID.0, ID.1, ...; not .batch / .extern) */
    char step_state[32];  /* the last numbered step's State ("" when none) */
    int step_exit_code;   /* its ExitCode: the highest of its tasks' codes, not a rank's own */
    int step_exit_signal; /*   ... and its signal */
    int steps_bad;        /* numbered steps not COMPLETED with 0:0 */
} hpd__sacct_job;

/* Parses sacct's -P -n output (text, len bytes) for job ref ("1234") into out. Lines of other
 * jobs are skipped. HP_NOT_FOUND when no line is ref's (accounting off, or the record is gone),
 * HP_INVALID for a line that is not JobID|State|CODE:SIGNAL (the message quotes it). */
hp_status hpd__slurm_parse_sacct(const char *text, size_t len, const char *ref, hpd__sacct_job *out,
                                 hp_err *err);

#endif
