/* daemon/jobsm.h — the job state machine, a pure module: no I/O, no allocation, no clock.
 *
 * QUEUED → COMPILING → LAUNCHING → RUNNING → SUCCEEDED | FAILED | CANCELLED, with RESTARTING
 * after a worker failure (back to LAUNCHING, at most max_restarts times, then FAILED). The
 * caller commits the returned transition to the store before acting on it, and counts the
 * restarts (the machine only reads the count).
 */
#ifndef HP_DAEMON_JOBSM_H
#define HP_DAEMON_JOBSM_H

#include "hp/base.h"

#include "hp/v1/control.pb-c.h"

#include <stdbool.h>

/* X(NAME, "text") */
#define HPD_SM_EVENTS(X)                                                                           \
    X(SCHEDULE, "schedule")             /* QUEUED: the scheduler took it (slots free) */           \
    X(COMPILED, "compiled")             /* COMPILING: hp_compile succeeded */                      \
    X(COMPILE_FAILED, "compile_failed") /* COMPILING: hp_compile failed */                         \
    X(LAUNCHED, "launched")             /* LAUNCHING: every rank's process started */              \
    X(LAUNCH_FAILED, "launch_failed")   /* LAUNCHING: a process could not start */                 \
    X(ALL_STARTED, "all_started")       /* LAUNCHING: every rank said hello */                     \
    X(RANK_FAILED, "rank_failed")       /* a rank died, missed heartbeats or sent Done(error) */   \
    X(ALL_DONE, "all_done")             /* RUNNING: every rank sent Done(ok) */                    \
    X(CANCEL, "cancel")                 /* a user asked */                                         \
    X(RESTART_READY, "restart_ready")   /* RESTARTING: old ranks gone, slots held */               \
    X(RECOVER, "recover")               /* the daemon restarted with the job in flight */

typedef enum {
#define X(name, text) HPD_EV_##name,
    HPD_SM_EVENTS(X)
#undef X
        HPD_EV_COUNT
} hpd_sm_event;

const char *hpd_sm_event_str(hpd_sm_event ev);
/* "QUEUED", "RUNNING", ... ("?" for a value outside the enum). */
const char *hpd_sm_state_str(Hp__V1__JobState s);
/* A final state: SUCCEEDED, FAILED, CANCELLED. */
bool hpd_sm_is_final(Hp__V1__JobState s);

/* The state after `ev` in `from`, given the restarts used so far and the job's max_restarts.
 * A failure (RANK_FAILED, LAUNCH_FAILED, RECOVER while running) goes to RESTARTING when
 * restarts < max_restarts, else FAILED. RECOVER sends COMPILING back to QUEUED (compiling is
 * pure: redo it). An event a state does not accept is HP_INVALID naming both
 * ("illegal transition: SUCCEEDED + cancel"); *to is then left unchanged. */
hp_status hpd_sm_next(Hp__V1__JobState from, hpd_sm_event ev, int restarts, int max_restarts,
                      Hp__V1__JobState *to, hp_err *err);

#endif
