/* tests/daemon/test_http.c — hpd's HTTP interface against the real things: runs
 * tests/daemon/http_test.py with /usr/bin/python3 (the JSON API's schema, paging and errors,
 * `promtool check metrics`, a real Prometheus server scraping hpd and the loss series read
 * back through its query API, a profiled step's trace). The script starts and stops hpd and
 * Prometheus itself; a missing prometheus package is a failure, never a skip. */
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

Test(http, json_api_prometheus_and_traces_against_real_hpd, .timeout = 600) {
    const char *src = dir_env("HP_SOURCE_DIR", HP_SOURCE_DIR);
    const char *bin = dir_env("HP_BINARY_DIR", HP_BINARY_DIR);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 540 /usr/bin/python3 %s/tests/daemon/http_test.py --hpd %s/daemon/hpd "
             "--hpctl %s/client/hpctl",
             src, bin, bin);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "http_test.py killed by a signal: %s", cmd);
    cr_assert_eq(WEXITSTATUS(st), 0, "http_test.py failed (exit %d): %s", WEXITSTATUS(st), cmd);
}
