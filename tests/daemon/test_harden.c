/* tests/daemon/test_harden.c — hostile peers against a real hpd (issue #14, the daemon side):
 * each test runs one case of tests/daemon/harden_test.py (Python grpcio, raw sockets, raw HTTP)
 * with /usr/bin/python3 against a real hpd on 127.0.0.1 port 0. See the script for the cases. */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

static void run_case(const char *name) {
    const char *bin = hp_th_binary_dir();
    int rc = hp_th_python(280, "tests/daemon/harden_test.py",
                          "--hpd %s/daemon/hpd --hpctl %s/client/hpctl --desc %s/proto/hp.desc "
                          "--case %s",
                          bin, bin, bin, name);
    cr_assert_eq(rc, 0, "harden_test.py --case %s failed (exit %d; its output is above)", name, rc);
}

/* A GetPlan / SubmitJob of millions of empty nodes: RESOURCE_EXHAUSTED, bounded peak RSS. */
Test(harden, decode_bomb_refused_within_budget, .timeout = 300) {
    run_case("bomb");
}

/* GetPlan needs the token and compiles off the loop: a ListJobs meanwhile answers at once. */
Test(harden, getplan_token_and_off_loop, .timeout = 300) {
    run_case("plan");
}

/* Embedded NUL bytes (gRPC ids, a worker Hello, HTTP %00) and a non-UTF-8 job name are refused. */
Test(harden, nul_bytes_and_utf8_refused, .timeout = 300) {
    run_case("nul");
}

/* A rank reporting step INT64_MAX (metrics, Done) does not push its job past the end. */
Test(harden, rank_step_bounded, .timeout = 300) {
    run_case("step");
}

/* A job id with a newline (`j-000001\nlevel=error event=fake`) is echoed escaped: the gRPC error
 * has no raw newline and the log no forged line. */
Test(harden, peer_input_escaped_in_errors_and_logs, .timeout = 300) {
    run_case("quote");
}

/* HTTP requests with 33..16000 query arguments get a prompt 400/414/431 (≈ 500 were held 30 s). */
Test(harden, http_many_query_args_answered, .timeout = 300) {
    run_case("args");
}

/* Six 20 MB requests at once are decoded on the pool: a ListJobs poller meanwhile never waits
 * most of their time (on the loop it waited 3.8 s of 4.75 s). */
Test(harden, large_requests_decoded_off_loop, .timeout = 300) {
    run_case("decode");
}

/* --auth all (flag and config key): every RPC and HTTP path but /healthz needs the token, never
 * from a query string; hpctl reads send it; beyond loopback without TLS hpd warns. */
Test(harden, auth_all_and_exposure_warning, .timeout = 300) {
    run_case("auth");
}
