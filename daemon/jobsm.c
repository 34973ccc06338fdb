/* daemon/jobsm.c — the job state machine (see jobsm.h). One switch, no side effects. */
#include "daemon/jobsm.h"

const char *hpd_sm_event_str(hpd_sm_event ev) {
    static const char *const names[] = {
#define X(name, text) text,
        HPD_SM_EVENTS(X)
#undef X
    };
    return (unsigned)ev < HPD_EV_COUNT ? names[ev] : "?";
}

const char *hpd_sm_state_str(Hp__V1__JobState s) {
    switch (s) {
    case HP__V1__JOB_STATE__JOB_STATE_QUEUED:
        return "QUEUED";
    case HP__V1__JOB_STATE__JOB_STATE_COMPILING:
        return "COMPILING";
    case HP__V1__JOB_STATE__JOB_STATE_LAUNCHING:
        return "LAUNCHING";
    case HP__V1__JOB_STATE__JOB_STATE_RUNNING:
        return "RUNNING";
    case HP__V1__JOB_STATE__JOB_STATE_RESTARTING:
        return "RESTARTING";
    case HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED:
        return "SUCCEEDED";
    case HP__V1__JOB_STATE__JOB_STATE_FAILED:
        return "FAILED";
    case HP__V1__JOB_STATE__JOB_STATE_CANCELLED:
        return "CANCELLED";
    default:
        return "?";
    }
}

bool hpd_sm_is_final(Hp__V1__JobState s) {
    return s == HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
           s == HP__V1__JOB_STATE__JOB_STATE_FAILED || s == HP__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

hp_status hpd_sm_next(Hp__V1__JobState from, hpd_sm_event ev, int restarts, int max_restarts,
                      Hp__V1__JobState *to, hp_err *err) {
    const Hp__V1__JobState failed_to = restarts < max_restarts
                                           ? HP__V1__JOB_STATE__JOB_STATE_RESTARTING
                                           : HP__V1__JOB_STATE__JOB_STATE_FAILED;
    Hp__V1__JobState next = HP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
    switch (from) {
    case HP__V1__JOB_STATE__JOB_STATE_QUEUED:
        if (ev == HPD_EV_SCHEDULE) next = HP__V1__JOB_STATE__JOB_STATE_COMPILING;
        if (ev == HPD_EV_RECOVER) next = HP__V1__JOB_STATE__JOB_STATE_QUEUED;
        break;
    case HP__V1__JOB_STATE__JOB_STATE_COMPILING:
        if (ev == HPD_EV_COMPILED) next = HP__V1__JOB_STATE__JOB_STATE_LAUNCHING;
        if (ev == HPD_EV_COMPILE_FAILED) next = HP__V1__JOB_STATE__JOB_STATE_FAILED;
        if (ev == HPD_EV_RECOVER) next = HP__V1__JOB_STATE__JOB_STATE_QUEUED;
        break;
    case HP__V1__JOB_STATE__JOB_STATE_LAUNCHING:
        if (ev == HPD_EV_LAUNCHED) next = HP__V1__JOB_STATE__JOB_STATE_LAUNCHING;
        if (ev == HPD_EV_ALL_STARTED) next = HP__V1__JOB_STATE__JOB_STATE_RUNNING;
        if (ev == HPD_EV_LAUNCH_FAILED || ev == HPD_EV_RANK_FAILED || ev == HPD_EV_RECOVER)
            next = failed_to;
        break;
    case HP__V1__JOB_STATE__JOB_STATE_RUNNING:
        if (ev == HPD_EV_ALL_DONE) next = HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
        if (ev == HPD_EV_RANK_FAILED || ev == HPD_EV_RECOVER) next = failed_to;
        break;
    case HP__V1__JOB_STATE__JOB_STATE_RESTARTING:
        if (ev == HPD_EV_RESTART_READY) next = HP__V1__JOB_STATE__JOB_STATE_LAUNCHING;
        /* The daemon died while the old ranks were being torn down: the restart it had
         * committed to is still owed (the count was taken on entering RESTARTING). */
        if (ev == HPD_EV_RECOVER) next = HP__V1__JOB_STATE__JOB_STATE_RESTARTING;
        /* A straggler of the old attempt failing changes nothing. */
        if (ev == HPD_EV_RANK_FAILED) next = HP__V1__JOB_STATE__JOB_STATE_RESTARTING;
        break;
    default:
        break;
    }
    if (ev == HPD_EV_CANCEL && !hpd_sm_is_final(from) &&
        from != HP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED)
        next = HP__V1__JOB_STATE__JOB_STATE_CANCELLED;
    if (next == HP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED)
        return hp_errf(err, HP_INVALID, "illegal transition: %s + %s", hpd_sm_state_str(from),
                       hpd_sm_event_str(ev));
    *to = next;
    return HP_OK;
}
