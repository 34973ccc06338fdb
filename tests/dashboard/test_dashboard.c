/* tests/dashboard/test_dashboard.c — the dashboard (share/hp/dashboard/) in headless Chromium
 * against a real hpd: runs tests/dashboard/dashboard_test.py with /usr/bin/python3, which
 * starts hpd on 127.0.0.1 port 0 (gRPC and --http), submits a 2-rank job with hpctl, and checks
 * the dumped DOM (the job's row and state, the loss chart's points and last step) and a
 * screenshot, kept as BUILD/test-artifacts/dashboard.png. Skipped only when chromium is not
 * installed (scripts/install-deps.sh installs it). */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

Test(dashboard, chromium_renders_a_live_job, .timeout = 600) {
    if (system("command -v chromium >/dev/null 2>&1") != 0)
        cr_skip_test("chromium is not installed (scripts/install-deps.sh installs it)");
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(
        560, "tests/dashboard/dashboard_test.py",
        "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --artifacts %s/test-artifacts", bin, bin, bin);
    if (rc == 77) cr_skip_test("dashboard_test.py: chromium is not installed");
    cr_assert_eq(rc, 0, "tests/dashboard/dashboard_test.py failed (exit %d; its output is above)",
                 rc);
}

/* hpd --auth all: the API needs the bearer header, and the page, loaded as #token=T&job=ID,
 * takes the token from the fragment and renders the live job. */
Test(dashboard, chromium_with_auth_all_token_from_fragment, .timeout = 600) {
    if (system("command -v chromium >/dev/null 2>&1") != 0)
        cr_skip_test("chromium is not installed (scripts/install-deps.sh installs it)");
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(560, "tests/dashboard/dashboard_test.py",
                          "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --artifacts "
                          "%s/test-artifacts --auth",
                          bin, bin, bin);
    if (rc == 77) cr_skip_test("dashboard_test.py: chromium is not installed");
    cr_assert_eq(rc, 0, "dashboard_test.py --auth failed (exit %d; its output is above)", rc);
}
