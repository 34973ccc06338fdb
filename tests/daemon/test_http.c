/* tests/daemon/test_http.c — hpd's HTTP interface against the real things: runs
 * tests/daemon/http_test.py with /usr/bin/python3 (the JSON API's schema, paging and errors,
 * `promtool check metrics`, a real Prometheus server scraping hpd and the loss series read
 * back through its query API, a profiled step's trace). The script starts and stops hpd and
 * Prometheus itself; a missing prometheus package is a failure, never a skip. */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

Test(http, json_api_prometheus_and_traces_against_real_hpd, .timeout = 600) {
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(540, "tests/daemon/http_test.py",
                          "--hpd %s/daemon/hpd --hpctl %s/client/hpctl", bin, bin);
    cr_assert_eq(rc, 0, "tests/daemon/http_test.py failed (exit %d; its output is above)", rc);
}
