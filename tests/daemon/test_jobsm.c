/* tests/daemon/test_jobsm.c — every (state, event) pair of the job state machine: the legal
 * ones give the documented next state, every other one is HP_INVALID naming both. */
#include "daemon/jobsm.h"

#include <criterion/criterion.h>
#include <string.h>

#define Q  HP__V1__JOB_STATE__JOB_STATE_QUEUED
#define C  HP__V1__JOB_STATE__JOB_STATE_COMPILING
#define L  HP__V1__JOB_STATE__JOB_STATE_LAUNCHING
#define R  HP__V1__JOB_STATE__JOB_STATE_RUNNING
#define RS HP__V1__JOB_STATE__JOB_STATE_RESTARTING
#define S  HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED
#define F  HP__V1__JOB_STATE__JOB_STATE_FAILED
#define X  HP__V1__JOB_STATE__JOB_STATE_CANCELLED
#define U  HP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED
#define NO ((Hp__V1__JobState)-1)

static const Hp__V1__JobState states[] = {U, Q, C, L, R, RS, S, F, X};

/* Expected next state with a restart left (restartable) and without (exhausted). */
static Hp__V1__JobState expect(Hp__V1__JobState s, hpd_sm_event ev, bool restartable) {
    Hp__V1__JobState fail = restartable ? RS : F;
    if (ev == HPD_EV_CANCEL) return (s == U || s == S || s == F || s == X) ? NO : X;
    switch (s) {
    case Q:
        return ev == HPD_EV_SCHEDULE ? C : ev == HPD_EV_RECOVER ? Q : NO;
    case C:
        return ev == HPD_EV_COMPILED         ? L
               : ev == HPD_EV_COMPILE_FAILED ? F
               : ev == HPD_EV_RECOVER        ? Q
                                             : NO;
    case L:
        return ev == HPD_EV_LAUNCHED      ? L
               : ev == HPD_EV_ALL_STARTED ? R
               : (ev == HPD_EV_LAUNCH_FAILED || ev == HPD_EV_RANK_FAILED || ev == HPD_EV_RECOVER)
                   ? fail
                   : NO;
    case R:
        return ev == HPD_EV_ALL_DONE                                ? S
               : (ev == HPD_EV_RANK_FAILED || ev == HPD_EV_RECOVER) ? fail
                                                                    : NO;
    case RS:
        return ev == HPD_EV_RESTART_READY                           ? L
               : (ev == HPD_EV_RECOVER || ev == HPD_EV_RANK_FAILED) ? RS
                                                                    : NO;
    default:
        return NO;
    }
}

Test(jobsm, every_pair) {
    int legal = 0, illegal = 0;
    for (int restartable = 0; restartable < 2; restartable++) {
        for (size_t i = 0; i < HP_ARRAY_LEN(states); i++) {
            for (int ev = 0; ev < HPD_EV_COUNT; ev++) {
                Hp__V1__JobState want = expect(states[i], (hpd_sm_event)ev, restartable);
                Hp__V1__JobState got = (Hp__V1__JobState)1234;
                hp_err err = {0};
                /* restarts 1 of 3: restartable; 3 of 3: exhausted */
                hp_status st =
                    hpd_sm_next(states[i], (hpd_sm_event)ev, restartable ? 1 : 3, 3, &got, &err);
                if (want == NO) {
                    cr_expect_eq(st, HP_INVALID, "%s + %s should be illegal",
                                 hpd_sm_state_str(states[i]), hpd_sm_event_str(ev));
                    cr_expect_eq(got, (Hp__V1__JobState)1234, "out untouched on error");
                    cr_expect(strstr(err.msg, hpd_sm_state_str(states[i])) != NULL, "%s", err.msg);
                    cr_expect(strstr(err.msg, hpd_sm_event_str(ev)) != NULL, "%s", err.msg);
                    illegal++;
                } else {
                    cr_expect_eq(st, HP_OK, "%s + %s: %s", hpd_sm_state_str(states[i]),
                                 hpd_sm_event_str(ev), err.msg);
                    cr_expect_eq(got, want, "%s + %s -> %s, want %s", hpd_sm_state_str(states[i]),
                                 hpd_sm_event_str(ev), hpd_sm_state_str(got),
                                 hpd_sm_state_str(want));
                    legal++;
                }
            }
        }
    }
    cr_expect(legal > 20 && illegal > 50);
}

Test(jobsm, happy_path) {
    Hp__V1__JobState s = Q;
    const hpd_sm_event path[] = {HPD_EV_SCHEDULE, HPD_EV_COMPILED, HPD_EV_LAUNCHED,
                                 HPD_EV_ALL_STARTED, HPD_EV_ALL_DONE};
    for (size_t i = 0; i < HP_ARRAY_LEN(path); i++)
        cr_assert_eq(hpd_sm_next(s, path[i], 0, 0, &s, NULL), HP_OK);
    cr_expect_eq(s, S);
    cr_expect(hpd_sm_is_final(s));
}

Test(jobsm, max_restarts) {
    /* max_restarts 2: two failures restart, the third fails the job. */
    Hp__V1__JobState s = R;
    int restarts = 0;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(hpd_sm_next(s, HPD_EV_RANK_FAILED, restarts, 2, &s, NULL), HP_OK);
        cr_assert_eq(s, RS);
        restarts++;
        cr_assert_eq(hpd_sm_next(s, HPD_EV_RESTART_READY, restarts, 2, &s, NULL), HP_OK);
        cr_assert_eq(hpd_sm_next(s, HPD_EV_ALL_STARTED, restarts, 2, &s, NULL), HP_OK);
    }
    cr_assert_eq(hpd_sm_next(s, HPD_EV_RANK_FAILED, restarts, 2, &s, NULL), HP_OK);
    cr_expect_eq(s, F);
    /* max_restarts 0: the first failure is final. */
    s = R;
    cr_assert_eq(hpd_sm_next(s, HPD_EV_RANK_FAILED, 0, 0, &s, NULL), HP_OK);
    cr_expect_eq(s, F);
}

Test(jobsm, names) {
    cr_expect_str_eq(hpd_sm_state_str(RS), "RESTARTING");
    cr_expect_str_eq(hpd_sm_state_str((Hp__V1__JobState)99), "?");
    cr_expect_str_eq(hpd_sm_event_str(HPD_EV_ALL_DONE), "all_done");
    cr_expect_str_eq(hpd_sm_event_str((hpd_sm_event)99), "?");
}
