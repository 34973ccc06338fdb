/* tests/client/test_hpctl_trace.c — `hpctl trace` and `hpctl checkpoint`: usage errors exit 2
 * without a daemon; against a real hpd (127.0.0.1 port 0, a temp state dir, the token from
 * STATE_DIR/token through $HP_STATE_DIR) an unknown job exits 1 with NOT_FOUND, a checkpoint
 * without the token exits 1 with UNAUTHENTICATED; a real job with --profile-steps gives a
 * Chrome trace file, and a step without a trace names the traced ones. */
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

typedef hp_th_run run;

static char g_dir[256];

/* `hpctl ARGS` in g_dir, output captured (tests/util/cli_harness.h). */
#define hpctl(...) hp_th_hpctl(g_dir, 120, __VA_ARGS__)
#define run_free   hp_th_run_free

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hp-hpctl-trace-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    /* No daemon at this address: a usage error must be found before any call. */
    setenv("HP_SERVER", "127.0.0.1:1", 1);
    unsetenv("HP_TOKEN");
}

static void rm_dir(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", g_dir);
}

static hp_th_hpd g_h = {.pid = -1};

static void start_hpd(void) {
    make_dir();
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    cr_assert_eq(mkdir(state, 0700), 0);
    static const char *const args[] = {"--http", "127.0.0.1:0", "--slots", "1", NULL};
    hp_th_hpd_start(&g_h, state, NULL, args);
    setenv("HP_SERVER", g_h.grpc, 1);
    setenv("HP_STATE_DIR", state, 1);
}

static void stop_hpd(void) {
    if (g_h.pid > 0 && hp_th_hpd_stop(&g_h) == -1)
        cr_expect(0, "hpd did not exit within 30 s of SIGTERM");
    rm_dir();
}

TestSuite(hpctl_trace, .timeout = 300);

/* hpctl ARGS exits 2 with `want` in its one stderr line. */
static void usage_error(const char *args, const char *want) {
    run r = hpctl("%s", args);
    cr_expect_eq(r.code, 2, "hpctl %s: exit %d, want 2 (stderr: %s)", args, r.code, r.err);
    cr_expect(strstr(r.err, want), "hpctl %s: stderr %s lacks '%s'", args, r.err, want);
    cr_expect_str_empty(r.out, "hpctl %s printed %s", args, r.out);
    run_free(&r);
}

Test(hpctl_trace, usage_errors_exit_2, .init = make_dir, .fini = rm_dir) {
    usage_error("trace", "missing job ID");
    usage_error("trace --step 3", "missing job ID");
    usage_error("trace j-000001", "missing --step");
    usage_error("trace j-000001 --step", "--step needs a value");
    usage_error("trace j-000001 --step x", "--step: 'x' is not an integer");
    usage_error("trace j-000001 --step -1", "--step: -1 is outside");
    usage_error("trace j-000001 --step 3 --rank -2", "--rank: -2 is outside");
    usage_error("trace j-000001 --step 3 --rank", "--rank needs a value");
    usage_error("trace j-000001 --step 3 -o", "-o needs a value");
    usage_error("trace j-000001 j-000002 --step 3", "unexpected argument 'j-000002'");
    usage_error("trace j-000001 --step 3 --bogus", "unexpected argument '--bogus'");
    usage_error("trace ../x --step 3", "is not a job ID");
    usage_error("checkpoint", "missing job ID");
    usage_error("checkpoint a b", "unexpected argument 'b'");
    usage_error("checkpoint a --bogus", "unexpected argument '--bogus'");
    usage_error("checkpoint a --server", "--server needs a value");
    run r = hpctl("--help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "trace ID --step S") && strstr(r.out, "checkpoint ID"),
              "usage lacks the verbs: %s", r.out);
    run_free(&r);
    r = hpctl("trace --help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "usage: hpctl trace"), "%s", r.out);
    run_free(&r);
}

Test(hpctl_trace, unknown_job_exits_1, .init = start_hpd, .fini = stop_hpd) {
    run r = hpctl("trace j-nope --step 1");
    cr_expect_eq(r.code, 1, "exit %d (stderr: %s)", r.code, r.err);
    cr_expect(strstr(r.err, "hpctl: trace: NOT_FOUND"), "stderr: %s", r.err);
    run_free(&r);
    char path[400];
    snprintf(path, sizeof path, "%s/j-nope-step-1.trace.json", g_dir);
    cr_expect(access(path, F_OK) != 0, "a failed trace left %s", path);
    r = hpctl("checkpoint j-nope");
    cr_expect_eq(r.code, 1, "exit %d (stderr: %s)", r.code, r.err);
    cr_expect(strstr(r.err, "hpctl: checkpoint: NOT_FOUND"), "stderr: %s", r.err);
    run_free(&r);
    r = hpctl("checkpoint j-nope --json");
    cr_expect_eq(r.code, 1, "exit %d (stderr: %s)", r.code, r.err);
    run_free(&r);
    /* A mutating call: a wrong token is refused before the job is looked up. */
    r = hpctl("checkpoint j-nope --token wrong");
    cr_expect_eq(r.code, 1, "exit %d (stderr: %s)", r.code, r.err);
    cr_expect(strstr(r.err, "UNAUTHENTICATED"), "stderr: %s", r.err);
    run_free(&r);
}

Test(hpctl_trace, trace_of_a_profiled_job, .init = start_hpd, .fini = stop_hpd) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps 4 --profile-steps 2 "
                  "-o job.pb");
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    run_free(&r);
    r = hpctl("submit job.pb --watch");
    cr_assert_eq(r.code, 0, "submit --watch: exit %d: %s", r.code, r.err);
    char id[64] = "";
    sscanf(r.out, "%63s", id);
    run_free(&r);
    cr_assert(id[0]);

    r = hpctl("trace %s --step 2", id);
    cr_assert_eq(r.code, 0, "trace: exit %d: %s", r.code, r.err);
    char want[128], path[512];
    snprintf(want, sizeof want, "%s-step-2.trace.json\n", id);
    cr_expect_str_eq(r.out, want);
    run_free(&r);
    snprintf(path, sizeof path, "%s/%s-step-2.trace.json", g_dir, id);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    cr_assert(doc, "%s: %s", path, je.text);
    json_t *evs = json_object_get(doc, "traceEvents");
    cr_expect(json_is_array(evs) && json_array_size(evs) > 0, "no traceEvents in %s", path);
    json_decref(doc);

    r = hpctl("trace %s --step 2 --rank 0 -o sub.json --json", id);
    cr_assert_eq(r.code, 0, "trace -o --json: exit %d: %s", r.code, r.err);
    doc = json_loads(r.out, 0, &je);
    cr_assert(doc, "--json output: %s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "path")), "sub.json");
    json_t *steps = json_object_get(doc, "steps");
    cr_expect(json_is_array(steps) && json_array_size(steps) == 1 &&
                  json_integer_value(json_array_get(steps, 0)) == 2,
              "steps: %s", r.out);
    json_decref(doc);
    run_free(&r);
    snprintf(path, sizeof path, "%s/sub.json", g_dir);
    cr_expect(access(path, F_OK) == 0, "-o sub.json not written");

    r = hpctl("trace %s --step 3", id);
    cr_expect_eq(r.code, 1, "a step without a trace: exit %d", r.code);
    cr_expect(strstr(r.err, "NOT_FOUND") && strstr(r.err, "steps: 2"),
              "the error names the traced steps: %s", r.err);
    run_free(&r);

    r = hpctl("checkpoint %s", id);
    cr_expect_eq(r.code, 1, "checkpoint of a finished job: exit %d", r.code);
    cr_expect(strstr(r.err, "FAILED_PRECONDITION"), "stderr: %s", r.err);
    run_free(&r);
}
