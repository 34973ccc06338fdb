/* tests/dashboard/test_dashboard.c — the dashboard (share/hp/dashboard/) in headless Chromium
 * against a real hpd: runs tests/dashboard/dashboard_test.py with /usr/bin/python3, which
 * starts hpd on 127.0.0.1 port 0 (gRPC and --http), submits a 2-rank job with hpctl, and checks
 * the dumped DOM (the job's row and state, the loss chart's points and last step) and a
 * screenshot, kept as BUILD/test-artifacts/dashboard.png. Skipped only when chromium is not
 * installed (scripts/install-deps.sh installs it). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#ifndef HP_SOURCE_DIR
#define HP_SOURCE_DIR "."
#endif
#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

static const char *dir_env(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

Test(dashboard, chromium_renders_a_live_job, .timeout = 600) {
    if (system("command -v chromium >/dev/null 2>&1") != 0)
        cr_skip_test("chromium is not installed (scripts/install-deps.sh installs it)");
    const char *src = dir_env("HP_SOURCE_DIR", HP_SOURCE_DIR);
    const char *bin = dir_env("HP_BINARY_DIR", HP_BINARY_DIR);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 560 /usr/bin/python3 %s/tests/dashboard/dashboard_test.py "
             "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --artifacts %s/test-artifacts",
             src, bin, bin, bin);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "dashboard_test.py killed by a signal: %s", cmd);
    if (WEXITSTATUS(st) == 77) cr_skip_test("dashboard_test.py: chromium is not installed");
    cr_assert_eq(WEXITSTATUS(st), 0, "dashboard_test.py failed (exit %d): %s", WEXITSTATUS(st),
                 cmd);
}
