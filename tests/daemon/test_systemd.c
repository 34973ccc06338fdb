/* tests/daemon/test_systemd.c — hpd's systemd launcher (daemon/launch_systemd.c).
 *
 * Always run: the unit names and systemd-run command lines it builds, and its parse of
 * `systemctl show` output, garbage included (a clear error, no crash).
 *
 * Always run, against a FAKE: the real hpd, hpctl and hp-worker with --launcher systemd and a
 * fake systemd-run/systemctl pair first on PATH (tests/daemon/fake_systemd/: shell scripts that
 * record their arguments and simulate transient units — a process per unit, its state as
 * systemd 252 reports it for Type=exec RemainAfterExit=yes). It is not systemd: no cgroups, no
 * sandbox, no D-Bus; it exists because this project's machines (containers) run no systemd
 * manager, and it exercises the launcher's whole state machine: start, poll, per-rank exit
 * codes, kill on cancel, cleanup (stop + reset-failed), adoption by a restarted hpd.
 *
 * Socket activation: hpd under systemd-socket-activate (the worker and HTTP sockets passed as
 * fds 3 and 4, named) runs a job; a passed fd that is no listening socket is refused; the
 * socket units verify clean.
 *
 * Run where a systemd manager is running (`systemctl --user is-system-running` answers and
 * `systemd-run --user --wait true` works), skipped with the reason elsewhere: the same world-2
 * job through the real user manager.
 */
#include "daemon/launch_systemd.h"
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the pure pieces ------------------------------------------------------------------------ */
static const hpd_attempt_spec k_spec = {.job_id = "j-000007",
                                        .attempt = 2,
                                        .world = 4,
                                        .token = "s3cr3t-token",
                                        .token_file = "/var/lib/hp/jobs/j-000007/attempt-2/token",
                                        .coordinator = "10.0.0.1:7000",
                                        .job_dir = "/var/lib/hp/jobs/j-000007",
                                        .attempt_dir = "/var/lib/hp/jobs/j-000007/attempt-2"};

static bool has_arg(const hpd__sd_argv *a, const char *want) {
    for (int i = 0; i < a->argc; i++)
        if (!strcmp(a->argv[i], want)) return true;
    return false;
}

Test(systemd_units, names) {
    char n[HPD_SD_UNIT_MAX];
    hp_err e = {0};
    cr_assert_eq(hpd__sd_unit_name("j-000007", 2, 3, n, sizeof n, &e), HP_OK);
    cr_expect_str_eq(n, "hp-j-000007-2-3.service");
    cr_assert_eq(hpd__sd_unit_name("j-000007", 2, -1, n, sizeof n, &e), HP_OK);
    cr_expect_str_eq(n, "hp-j-000007-2");
    cr_expect_eq(hpd__sd_unit_name("a/b", 0, 0, n, sizeof n, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "0x2f"), "%s", e.msg);
    cr_expect_eq(hpd__sd_unit_name("", 0, 0, n, sizeof n, &e), HP_INVALID);
    cr_expect_eq(hpd__sd_unit_name("a b", 0, 0, n, sizeof n, &e), HP_INVALID);
    char longid[200];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    cr_expect_eq(hpd__sd_unit_name(longid, 0, 0, n, sizeof n, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "too long"), "%s", e.msg);
}

Test(systemd_units, run_command_with_a_credential) {
    hpd__sd_conf c = {.systemd_run = "systemd-run", .worker = "/usr/bin/hp-worker", .user = true};
    hpd__sd_argv *a = malloc(sizeof *a);
    hp_err e = {0};
    cr_assert_eq(hpd__sd_run_argv(&c, &k_spec, 1, a, &e), HP_OK, "%s", e.msg);
    cr_expect_str_eq(a->argv[0], "systemd-run");
    cr_expect_null(a->argv[a->argc]);
    cr_expect(has_arg(a, "--user"));
    cr_expect(has_arg(a, "--unit=hp-j-000007-2-1.service"));
    cr_expect(has_arg(a, "--property=Type=exec"));
    cr_expect(has_arg(a, "--property=RemainAfterExit=yes"));
    cr_expect(has_arg(a, "--property=StandardOutput=append:/var/lib/hp/jobs/j-000007/rank-1.log"));
    cr_expect(has_arg(a, "--property=WorkingDirectory=/var/lib/hp/jobs/j-000007/attempt-2"));
    cr_expect(has_arg(a, "--property=LoadCredential=hp-token:"
                         "/var/lib/hp/jobs/j-000007/attempt-2/token"));
    cr_expect(has_arg(a, "${CREDENTIALS_DIRECTORY}/hp-token"));
    /* the worker's own arguments come after its path, in order */
    int w = 0;
    while (w < a->argc && strcmp(a->argv[w], "/usr/bin/hp-worker")) w++;
    cr_assert_lt(w + 6, a->argc);
    const char *want[] = {"--coordinator", "10.0.0.1:7000", "--job", "j-000007", "--rank", "1"};
    for (int i = 0; i < 6; i++) cr_expect_str_eq(a->argv[w + 1 + i], want[i]);
    for (int i = 0; i < a->argc; i++) {
        cr_expect_null(strstr(a->argv[i], "s3cr3t"), "the token on the command line: %s",
                       a->argv[i]);
        cr_expect(strncmp(a->argv[i], "--property=Slice", 16), "no slice was asked for");
    }
    free(a);
}

Test(systemd_units, run_command_with_the_token_file_and_a_slice) {
    hpd__sd_conf c = {.systemd_run = "/usr/bin/systemd-run",
                      .worker = "hp-worker",
                      .token_file = true,
                      .slice = "hp.slice"};
    hpd__sd_argv *a = malloc(sizeof *a);
    hp_err e = {0};
    cr_assert_eq(hpd__sd_run_argv(&c, &k_spec, 0, a, &e), HP_OK, "%s", e.msg);
    cr_expect(!has_arg(a, "--user"));
    cr_expect(has_arg(a, "--setenv=HP_TOKEN_FILE=/var/lib/hp/jobs/j-000007/attempt-2/token"));
    cr_expect(has_arg(a, "--property=Slice=hp.slice"));
    cr_expect(!has_arg(a, "--token-file"));
    for (int i = 0; i < a->argc; i++) cr_expect_null(strstr(a->argv[i], "LoadCredential"));
    free(a);
}

Test(systemd_units, run_command_refuses_what_a_unit_cannot_hold) {
    hpd__sd_conf c = {.systemd_run = "systemd-run", .worker = "hp-worker"};
    hpd__sd_argv *a = malloc(sizeof *a);
    hp_err e = {0};
    hpd_attempt_spec s = k_spec;
    s.job_dir = "/tmp/a\nb";
    cr_expect_eq(hpd__sd_run_argv(&c, &s, 0, a, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "job dir"), "%s", e.msg);
    s = k_spec;
    s.attempt_dir = "/tmp/$HOME";
    cr_expect_eq(hpd__sd_run_argv(&c, &s, 0, a, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "attempt dir"), "%s", e.msg);
    s = k_spec;
    s.coordinator = "host%n:1";
    cr_expect_eq(hpd__sd_run_argv(&c, &s, 0, a, &e), HP_INVALID);
    s = k_spec;
    cr_expect_eq(hpd__sd_run_argv(&c, &s, 4, a, &e), HP_INVALID, "rank 4 of world 4");
    cr_expect(strstr(e.msg, "out of range"), "%s", e.msg);
    char big[5000];
    memset(big, 'd', sizeof big - 1);
    big[0] = '/';
    big[sizeof big - 1] = 0;
    s.job_dir = big;
    cr_expect_eq(hpd__sd_run_argv(&c, &s, 0, a, &e), HP_INVALID);
    free(a);
}

static const char k_show[] = "Result=success\nExecMainCode=0\nExecMainStatus=0\nLoadState=loaded\n"
                             "ActiveState=active\nSubState=running\nId=hp-j-1-0-0.service\n"
                             "\n"
                             "Id=hp-j-1-0-1.service\nLoadState=loaded\nActiveState=failed\n"
                             "SubState=failed\nResult=signal\nExecMainCode=2\nExecMainStatus=9\n"
                             "\n"
                             "Id=hp-j-1-0-2.service\nLoadState=loaded\nActiveState=active\n"
                             "SubState=exited\nResult=success\nExecMainCode=1\nExecMainStatus=0\n"
                             "ExecMainPID=0\n"
                             "\n"
                             "Id=hp-j-1-0-3.service\nLoadState=loaded\nActiveState=failed\n"
                             "SubState=failed\nResult=exit-code\nExecMainCode=1\n"
                             "ExecMainStatus=3\n"
                             "\n"
                             "Id=hp-j-1-0-4.service\nLoadState=not-found\nActiveState=inactive\n"
                             "SubState=dead\nResult=success\nExecMainCode=0\nExecMainStatus=0\n";

Test(systemd_units, show_output_parsed_into_phases) {
    hpd__sd_unit u[8];
    int n = 0;
    hp_err e = {0};
    cr_assert_eq(hpd__sd_parse_show(k_show, strlen(k_show), u, 8, &n, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(n, 5);
    int st;
    cr_expect_str_eq(u[0].id, "hp-j-1-0-0.service");
    cr_expect_eq(hpd__sd_unit_phase(&u[0], &st), HPD_SD_RUNNING);
    cr_expect_eq(hpd__sd_unit_phase(&u[1], &st), HPD_SD_ENDED);
    cr_expect_eq(st, 137, "SIGKILL is 128 + 9");
    cr_expect_eq(hpd__sd_unit_phase(&u[2], &st), HPD_SD_ENDED);
    cr_expect_eq(st, 0);
    cr_expect_eq(hpd__sd_unit_phase(&u[3], &st), HPD_SD_ENDED);
    cr_expect_eq(st, 3);
    cr_expect_eq(hpd__sd_unit_phase(&u[4], &st), HPD_SD_GONE);
    cr_expect_eq(st, HPD_EXIT_UNKNOWN);
    /* CRLF and a trailing blank line are fine; so is the last block without a newline */
    const char crlf[] = "Id=a.service\r\nActiveState=activating\r\n\r\n";
    cr_expect_eq(hpd__sd_parse_show(crlf, strlen(crlf), u, 8, &n, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(n, 1);
    cr_expect_eq(hpd__sd_unit_phase(&u[0], &st), HPD_SD_RUNNING);
    cr_expect_eq(hpd__sd_parse_show("", 0, u, 8, &n, &e), HP_OK);
    cr_expect_eq(n, 0);
}

Test(systemd_units, show_garbage_is_a_clear_error) {
    const struct {
        const char *text, *want;
    } bad[] = {
        {"Id=a.service\nthis is not a property\n", "line 2"},
        {"ActiveState=active\n\nId=b.service\n", "without Id="},
        {"Id=a.service\nExecMainStatus=abc\n", "not a number"},
        {"Id=a.service\nExecMainStatus=99999999999999999999\n", "not a number"},
        {"Id=a.service\nExecMainCode=-1\n", "not a number"},
        {"Id=a.service\nActiveState=" /* too long */
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
         "longer than"},
        {"=x\nId=a\n", "bad key"},
        {"Id=a\n\nId=b\n\nId=c\n", "more than 2 units"},
        {"ActiveState=active", "without Id="},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hpd__sd_unit u[2];
        int n = 0;
        hp_err e = {0};
        cr_expect_eq(hpd__sd_parse_show(bad[i].text, strlen(bad[i].text), u, 2, &n, &e), HP_INVALID,
                     "case %zu accepted", i);
        cr_expect(strstr(e.msg, bad[i].want), "case %zu: '%s' does not say '%s'", i, e.msg,
                  bad[i].want);
    }
    hpd__sd_unit u[2];
    int n;
    hp_err e = {0};
    const char nul[] = "Id=a\0\n";
    cr_expect_eq(hpd__sd_parse_show(nul, sizeof nul - 1, u, 2, &n, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "NUL"), "%s", e.msg);
    /* random bytes: an error or a parse, never a crash */
    unsigned seed = 7;
    for (int round = 0; round < 2000; round++) {
        char buf[256];
        size_t len = (size_t)(rand_r(&seed) % (int)sizeof buf);
        for (size_t k = 0; k < len; k++) {
            const char alphabet[] = "Id=ExecMainCode\nStatus0129-\r xActiveState=failed";
            buf[k] = rand_r(&seed) % 8 ? alphabet[rand_r(&seed) % (int)(sizeof alphabet - 1)]
                                       : (char)rand_r(&seed);
        }
        hpd__sd_unit us[4];
        (void)hpd__sd_parse_show(buf, len, us, 4, &n, &e);
    }
}

/* ---- hpd with the launcher, against the fake (and the real manager where there is one) ---- */
typedef hp_th_run run;
static char g_dir[256], g_log[300], g_fake[300], g_state[300];
static hp_th_hpd g_h = {.pid = -1};
#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)

static char *sh(int *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *sh(int *code, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t cap = 1 << 16, n = 0;
    char *out = calloc(1, cap);
    size_t got;
    while ((got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static void setup_fake(void) {
    hp_th_tmpdir_make(g_dir, sizeof g_dir, "hp-systemd");
    snprintf(g_log, sizeof g_log, "%s/hpd.log", g_dir);
    snprintf(g_fake, sizeof g_fake, "%s/fake", g_dir);
    snprintf(g_state, sizeof g_state, "%s/state", g_dir);
    mkdir(g_fake, 0700);
    mkdir(g_state, 0700);
    unsetenv("HP_TOKEN");
    setenv("HP_FAKE_SYSTEMD_DIR", g_fake, 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/daemon/fake_systemd:%s", hp_th_source_dir(),
             getenv("PATH"));
    setenv("PATH", path, 1);
    setenv("HP_STATE_DIR", g_state, 1);
}

static void teardown_fake(void) {
    if (g_h.pid > 0) hp_th_hpd_stop(&g_h);
    g_h.pid = -1;
    /* whatever a failed test left running in the fake's units */
    int code;
    free(sh(&code,
            "for f in %s/units/*/mainpid; do [ -f \"$f\" ] && kill -9 $(cat \"$f\"); "
            "done 2>/dev/null; true",
            g_fake));
    hp_th_tmpdir_remove(g_dir);
}

TestSuite(systemd_fake, .init = setup_fake, .fini = teardown_fake, .timeout = 240);

static void start_hpd(const char *manager) {
    const char *args[] = {"--http",
                          "off",
                          "--slots",
                          "4",
                          "--launcher",
                          "systemd",
                          "--systemd-manager",
                          manager,
                          "--systemd-poll-ms",
                          "200",
                          NULL};
    hp_th_hpd_start(&g_h, g_state, g_log, args);
    setenv("HP_SERVER", g_h.grpc, 1);
}

static json_t *status(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert(j, "not JSON: %s", r.out);
    hp_th_run_free(&r);
    return j;
}

static char *field(const char *id, const char *key) {
    json_t *j = status(id);
    const char *v = json_string_value(json_object_get(j, key));
    char *s = strdup(v ? v : "");
    json_decref(j);
    return s;
}

static long step_of(const char *id) {
    json_t *j = status(id);
    long s = (long)json_integer_value(json_object_get(j, "step"));
    json_decref(j);
    return s;
}

static char *wait_state(const char *id, const char *want, int seconds) {
    char *st = NULL;
    for (int i = 0; i < seconds * 10; i++) {
        free(st);
        st = field(id, "state");
        if (!strcmp(st, want) || !strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED") ||
            !strcmp(st, "CANCELLED"))
            return st;
        usleep(100000);
    }
    return st;
}

static char *new_job_and_submit(const char *name, int steps, const char *extra) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d --fsdp 'layers.*' "
                  "--mesh dp=2 %s -o %s/%s",
                  steps, extra, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
    return hp_th_hpctl_submit(g_dir, name);
}

static bool log_has(const char *what) {
    char *log = hp_th_slurp_or_empty(g_log);
    bool found = strstr(log, what) != NULL;
    free(log);
    return found;
}

/* The units left in the fake manager ("" : none). */
static char *units_left(void) {
    int code;
    return sh(&code, "ls %s/units 2>/dev/null | tr '\\n' ' '", g_fake);
}

static bool wait_no_units(int seconds) {
    for (int i = 0; i < seconds * 10; i++) {
        char *u = units_left();
        bool none = !u[0];
        free(u);
        if (none) return true;
        usleep(100000);
    }
    return false;
}

/* The fake's calls.log once it holds `needle` (or after `seconds`): hpd runs `stop` and then
 * `reset-failed` as one command, so the units are gone before the second call is logged. */
static char *calls_with(const char *needle, int seconds) {
    char path[400];
    snprintf(path, sizeof path, "%s/calls.log", g_fake);
    char *calls = hp_th_slurp_or_empty(path);
    for (int i = 0; i < seconds * 10 && !strstr(calls, needle); i++) {
        usleep(100000);
        free(calls);
        calls = hp_th_slurp_or_empty(path);
    }
    return calls;
}

static char *token_of(const char *id, int attempt) {
    char p[600];
    snprintf(p, sizeof p, "%s/jobs/%s/attempt-%d/token", g_state, id, attempt);
    char *t = hp_th_slurp(p);
    t[strcspn(t, "\n")] = 0;
    return t;
}

Test(systemd_fake, world2_job_succeeds_with_one_unit_per_rank_and_the_units_cleaned) {
    start_hpd("user");
    char *id = new_job_and_submit("a.pb", 12, "");
    char *st = wait_state(id, "SUCCEEDED", 120);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    char *ref = field(id, "launch_ref"), want[300];
    snprintf(want, sizeof want, "hp-%s-0", id);
    cr_expect_str_eq(ref, want, "the launch ref names the attempt's units");
    free(ref);
    cr_expect(wait_no_units(10), "units left after the job ended");
    char *calls = calls_with("systemctl --user reset-failed --", 10);
    for (int r = 0; r < 2; r++) {
        snprintf(want, sizeof want, "systemd-run --user --unit=hp-%s-0-%d.service", id, r);
        cr_expect(strstr(calls, want), "no '%s' in:\n%s", want, calls);
    }
    cr_expect(strstr(calls, "--property=LoadCredential=hp-token:"), "no credential");
    cr_expect(strstr(calls, "systemctl --user show -p Id,LoadState"), "never polled");
    cr_expect(strstr(calls, "systemctl --user stop --"), "units not stopped");
    cr_expect(strstr(calls, "systemctl --user reset-failed --"), "units not reset");
    char *tok = token_of(id, 0);
    cr_expect(strlen(tok) >= 16);
    cr_expect_null(strstr(calls, tok), "the token is on a command line:\n%s", calls);
    free(tok);
    free(calls);
    for (int r = 0; r < 2; r++) {
        snprintf(want, sizeof want, "event=worker_exit job=%s attempt=0 rank=%d status=0", id, r);
        cr_expect(log_has(want), "no '%s' in hpd's log", want);
    }
    /* each rank logs to its file, as with the local launcher (rank 0 says the most) */
    for (int r = 0; r < 2; r++) {
        char rlog[700];
        snprintf(rlog, sizeof rlog, "%s/jobs/%s/rank-%d.log", g_state, id, r);
        struct stat sb;
        cr_expect(stat(rlog, &sb) == 0 && (r || sb.st_size > 0), "no rank log %s", rlog);
    }
    free(id);
}

Test(systemd_fake, killed_rank_is_reported_with_its_own_status_and_the_job_resumes) {
    start_hpd("system");
    char *id = new_job_and_submit("k.pb", 200, "--checkpoint-interval 20 --max-restarts 2");
    for (int i = 0; i < 1200 && step_of(id) < 30; i++) usleep(50000);
    cr_assert_geq(step_of(id), 30, "no progress");
    char p[600];
    snprintf(p, sizeof p, "%s/units/hp-%s-0-1.service/mainpid", g_fake, id);
    char *pid = hp_th_slurp(p);
    cr_assert_eq(kill(atoi(pid), SIGKILL), 0);
    free(pid);
    char *st = wait_state(id, "SUCCEEDED", 180);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    char want[200];
    snprintf(want, sizeof want, "event=worker_exit job=%s attempt=0 rank=1 status=137", id);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    snprintf(want, sizeof want, "job=%s from=RUNNING to=RESTARTING", id);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    char *ref = field(id, "launch_ref");
    snprintf(want, sizeof want, "hp-%s-1", id);
    cr_expect_str_eq(ref, want, "the restart is attempt 1");
    free(ref);
    cr_expect(wait_no_units(10), "units left after the job ended");
    free(id);
}

Test(systemd_fake, cancel_kills_and_removes_the_units) {
    start_hpd("user");
    char *id = new_job_and_submit("c.pb", 100000, "");
    for (int i = 0; i < 1200 && step_of(id) < 3; i++) usleep(50000);
    cr_assert_geq(step_of(id), 3, "no progress");
    run r = hpctl("cancel %s", id);
    cr_expect_eq(r.code, 0, "cancel: %s", r.err);
    hp_th_run_free(&r);
    char *st = wait_state(id, "CANCELLED", 60);
    cr_expect_str_eq(st, "CANCELLED");
    free(st);
    cr_expect(wait_no_units(30), "units left after the cancel");
    char calls_path[400];
    snprintf(calls_path, sizeof calls_path, "%s/calls.log", g_fake);
    char *calls = hp_th_slurp(calls_path);
    cr_expect(strstr(calls, "systemctl --user kill --signal=SIGTERM --"), "no kill:\n%s", calls);
    free(calls);
    free(id);
}

Test(systemd_fake, hpd_killed_and_restarted_finds_its_units) {
    start_hpd("user");
    char *id = new_job_and_submit("h.pb", 300, "--checkpoint-interval 20 --max-restarts 2");
    for (int i = 0; i < 1200 && step_of(id) < 25; i++) usleep(50000);
    cr_assert_geq(step_of(id), 25, "no progress");
    kill(g_h.pid, SIGKILL);
    waitpid(g_h.pid, NULL, 0);
    g_h.pid = -1;
    start_hpd("user");
    char *st = wait_state(id, "SUCCEEDED", 180);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    char want[200];
    snprintf(want, sizeof want, "event=adopted job=%s attempt=0 launcher=systemd ref=hp-%s-0", id,
             id);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    cr_expect(wait_no_units(10), "units left after the job ended");
    free(id);
}

Test(systemd_fake, a_unit_that_cannot_start_fails_the_attempt_clearly) {
    /* a worker path systemd-run cannot execute (Type=exec): the attempt is lost, not hung */
    const char *args[] = {"--http",
                          "off",
                          "--slots",
                          "4",
                          "--launcher",
                          "systemd",
                          "--systemd-poll-ms",
                          "200",
                          "--worker",
                          "/nonexistent/hp-worker",
                          NULL};
    hp_th_hpd_start(&g_h, g_state, g_log, args);
    setenv("HP_SERVER", g_h.grpc, 1);
    char *id = new_job_and_submit("f.pb", 4, "--max-restarts 0");
    char *st = wait_state(id, "FAILED", 60);
    cr_expect_str_eq(st, "FAILED");
    free(st);
    cr_expect(log_has("event=systemd_run_failed"), "no systemd_run_failed in hpd's log");
    cr_expect(log_has("No such file or directory"), "the reason is not in hpd's log");
    cr_expect(wait_no_units(10), "units left");
    free(id);
}

/* ---- the real manager ---------------------------------------------------------------------- */
Test(systemd_real, world2_job_through_the_user_manager, .init = setup_fake, .fini = teardown_fake,
     .timeout = 240) {
    /* The real tools, not the fake: PATH back as it was. */
    char *path = strdup(getenv("PATH"));
    char *colon = strchr(path, ':');
    setenv("PATH", colon ? colon + 1 : path, 1);
    free(path);
    unsetenv("HP_FAKE_SYSTEMD_DIR");
    int code;
    char *out = sh(&code, "systemctl --user is-system-running 2>&1");
    bool manager = code == 0 || strstr(out, "degraded") || strstr(out, "starting");
    free(out);
    if (manager) {
        free(sh(&code, "timeout 20 systemd-run --user --quiet --wait true 2>&1"));
        manager = code == 0;
    }
    if (!manager)
        cr_skip_test("no running systemd user manager here (systemctl --user is-system-running "
                     "or systemd-run --user --wait true failed): the launcher was tested "
                     "against the fake only");
    start_hpd("user");
    char *id = new_job_and_submit("r.pb", 12, "");
    char *st = wait_state(id, "SUCCEEDED", 120);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    free(sh(&code,
            "sleep 2; systemctl --user list-units --all --plain --no-legend 'hp-%s-*' "
            "| grep -q . && exit 1; exit 0",
            id));
    cr_expect_eq(code, 0, "units of %s left in the user manager", id);
    free(id);
}

/* ---- socket activation ------------------------------------------------------------------- */
/* A TCP port free on 127.0.0.1 a moment ago. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

Test(systemd_fake, socket_activation_with_systemd_socket_activate) {
    int code;
    free(sh(&code, "command -v systemd-socket-activate"));
    if (code != 0) cr_skip_test("no systemd-socket-activate (apt-get install systemd)");
    int wp = free_port(), hp = free_port();
    char out[400];
    snprintf(out, sizeof out, "%s/sa.out", g_dir);
    /* It binds both ports, then starts hpd on the first connection, the sockets as fds 3, 4. */
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (!freopen(out, "w", stdout) || !freopen(g_log, "w", stderr)) _exit(127);
        char l1[64], l2[64], hpd[600];
        snprintf(l1, sizeof l1, "127.0.0.1:%d", wp);
        snprintf(l2, sizeof l2, "127.0.0.1:%d", hp);
        snprintf(hpd, sizeof hpd, "%s/daemon/hpd", hp_th_binary_dir());
        execlp("systemd-socket-activate", "systemd-socket-activate", "-l", l1, "-l", l2,
               "--fdname=workers:http", hpd, "--listen", "127.0.0.1:0", "--state-dir", g_state,
               "--worker-listen", "127.0.0.1:1", "--http", "127.0.0.1:1", (char *)NULL);
        _exit(127);
    }
    /* the first connection (to the HTTP socket) starts hpd */
    char *o = NULL;
    for (int i = 0; i < 100; i++) {
        free(o);
        o = sh(&code, "curl -s -m 2 -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/ 2>&1", hp);
        if (code == 0 && o[0] != '0') break;
        usleep(100000);
    }
    char *line = NULL;
    for (int i = 0; i < 100; i++) {
        free(line);
        line = hp_th_slurp_or_empty(out);
        if (strstr(line, "hpd listening")) break;
        usleep(100000);
    }
    char want[64];
    snprintf(want, sizeof want, "workers=127.0.0.1:%d ", wp);
    cr_expect(strstr(line, want), "hpd did not take the passed worker socket: %s", line);
    snprintf(want, sizeof want, "http=127.0.0.1:%d ", hp);
    cr_expect(strstr(line, want), "hpd did not take the passed HTTP socket: %s", line);
    cr_expect(log_has("event=socket_activation workers=passed http=passed"));
    /* and a job runs through it: its worker dials the passed socket */
    const char *g = strstr(line, "grpc=");
    cr_assert(g, "%s", line);
    char grpc[64];
    snprintf(grpc, sizeof grpc, "%.*s", (int)strcspn(g + 5, " \n"), g + 5);
    setenv("HP_SERVER", grpc, 1);
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps 4 -o %s/s.pb",
                  g_dir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    char *id = hp_th_hpctl_submit(g_dir, "s.pb");
    char *st = wait_state(id, "SUCCEEDED", 60);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    free(id);
    free(line);
    free(o);
    kill(-pid, SIGTERM);
    int ws;
    waitpid(pid, &ws, 0);
}

Test(systemd_fake, a_passed_fd_that_is_not_a_listening_socket_is_refused) {
    int code;
    /* sd_listen_fds semantics by hand: LISTEN_PID is hpd's own pid (exec keeps sh's), fd 3 a
     * file */
    char *o = sh(&code,
                 "exec 3</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=workers exec "
                 "%s/daemon/hpd --listen 127.0.0.1:0 --http off --state-dir %s 2>&1",
                 hp_th_binary_dir(), g_state);
    cr_expect_neq(code, 0);
    cr_expect(strstr(o, "fd 3 ('workers', for workers) is not a listening stream socket"), "%s", o);
    free(o);
}

Test(systemd_fake, socket_units_verify) {
    int code;
    free(sh(&code, "command -v systemd-analyze"));
    if (code != 0) cr_skip_test("no systemd-analyze (apt-get install systemd)");
    char *o =
        sh(&code,
           "cd %s && sed -e 's|/usr/bin/hpd|%s/daemon/hpd|' %s/deploy/systemd/hpd.service "
           "> hpd.service && cp %s/deploy/systemd/hpd.socket %s/deploy/systemd/hpd-http.socket "
           ". && systemd-analyze verify --man=no ./hpd.socket ./hpd-http.socket 2>&1 "
           ">/dev/null",
           g_dir, hp_th_binary_dir(), hp_th_source_dir(), hp_th_source_dir(), hp_th_source_dir());
    cr_expect_eq(code, 0, "verify failed: %s", o);
    cr_expect_str_eq(o, "", "systemd-analyze verify said something");
    free(o);
}
