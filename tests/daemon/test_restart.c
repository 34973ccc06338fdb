/* tests/daemon/test_restart.c — hpd SIGKILLed under running jobs (issue #14): each test runs one
 * case of tests/daemon/restart_test.py (Python grpcio) with /usr/bin/python3 against a real hpd
 * and real hp-worker ranks on 127.0.0.1 port 0. See the script for the cases. */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

static void run_case(const char *name) {
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(580, "tests/daemon/restart_test.py",
                          "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --desc %s/proto/hp.desc "
                          "--case %s",
                          bin, bin, bin, name);
    cr_assert_eq(rc, 0, "restart_test.py --case %s failed (exit %d; its output is above)", name,
                 rc);
}

/* A world-2 job, hpd SIGKILLed 3 times while it trains: SUCCEEDED, every step of every rank
 * in the store exactly once. */
Test(restart, hpd_killed_every_step_stored_once, .timeout = 600) {
    run_case("restart");
}

/* A full disk under a real hpd (its store capped at the pages it has): SubmitJob answers
 * RESOURCE_EXHAUSTED naming hpd.db, hpd keeps serving, a restart finds every job as it was. */
Test(restart, full_store_refused_resource_exhausted, .timeout = 300) {
    run_case("full");
}
