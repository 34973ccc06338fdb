/* tests/daemon/test_hpd_config.c — the real hpd with a config file (--config, $HPD_CONFIG)
 * and signals, driven by the real hpctl on 127.0.0.1 (port 0, a temp state dir): a bad file
 * stops the start with exit 2 naming FILE:LINE; flags win over the file; SIGHUP applies
 * log-level and slots live (a queued job starts), logs restart-only keys as "needs a restart",
 * and keeps the old config when the file is broken; --on-sigterm cancel (also set by SIGHUP)
 * leaves the running jobs CANCELLED after a restart. */
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

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

static char g_dir[256];  /* temp dir: state/, config, job files, captured output */
static char g_conf[300]; /* g_dir/hpd.conf */
static char g_log[300];  /* hpd's stderr (appended across starts) */
static char g_addr[64];
static pid_t g_hpd = -1;
static const char *g_bin;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* `hpctl ARGS` in g_dir, output captured (tests/util/cli_harness.h). */
#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)
#define run_free   hp_th_run_free

static void setup(void) {
    const char *b = getenv("HP_BINARY_DIR");
    g_bin = b && *b ? b : HP_BINARY_DIR;
    snprintf(g_dir, sizeof g_dir, "/tmp/hp-hpd-config-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    cr_assert_eq(mkdir(state, 0700), 0);
    snprintf(g_conf, sizeof g_conf, "%s/hpd.conf", g_dir);
    snprintf(g_log, sizeof g_log, "%s/hpd.err", g_dir);
    setenv("HP_STATE_DIR", state, 1);
    unsetenv("HP_TOKEN");
    unsetenv("HPD_CONFIG");
}

static hp_th_hpd g_h = {.pid = -1};

/* Starts hpd with the state dir, port 0 and extra (NULL-terminated) args; stderr goes to
 * g_log. Returns once it printed its listening line. */
static void start_hpd(const char *arg, ...) {
    const char *extra[32];
    int n = 0;
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && n < 31; a = va_arg(ap, const char *)) extra[n++] = a;
    va_end(ap);
    extra[n] = NULL;
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    hp_th_hpd_start(&g_h, state, g_log, extra);
    g_hpd = g_h.pid;
    snprintf(g_addr, sizeof g_addr, "%s", g_h.grpc);
    setenv("HP_SERVER", g_addr, 1);
}

/* SIGTERM, then expects exit 0 within 30 s. */
static void stop_hpd(void) {
    if (g_h.pid <= 0) return;
    int code = hp_th_hpd_stop(&g_h);
    cr_expect_eq(code, 0, "hpd exit status %d on SIGTERM (-1: killed or not exited in 30 s)", code);
    g_hpd = -1;
}

static void teardown(void) {
    stop_hpd();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(hpd_config, .init = setup, .fini = teardown, .timeout = 300);

/* Runs hpd to its exit (a start that must fail); *err gets its stderr. */
static int hpd_exit_code(const char *args, char **err) {
    char cmd[2048], p[400];
    snprintf(p, sizeof p, "%s/start.err", g_dir);
    snprintf(cmd, sizeof cmd,
             "timeout 30 %s/daemon/hpd --listen 127.0.0.1:0 --worker-listen 127.0.0.1:0 %s "
             ">/dev/null 2>%s",
             g_bin, args, p);
    int st = system(cmd);
    *err = hp_th_slurp_or_empty(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void new_job(const char *name, int steps) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d -o %s/%s",
                  steps, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    run_free(&r);
}

static char *submit(const char *job) {
    return hp_th_hpctl_submit(g_dir, job);
}

static char *job_state(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert(j, "not JSON: %s", r.out);
    char *s = strdup(json_string_value(json_object_get(j, "state")));
    json_decref(j);
    run_free(&r);
    return s;
}

/* The job's error text (why it FAILED), for messages. */
static char *job_error(const char *id) {
    run r = hpctl("status %s --json", id);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    const char *v = j ? json_string_value(json_object_get(j, "error")) : NULL;
    char *s = strdup(v ? v : r.out);
    json_decref(j);
    run_free(&r);
    return s;
}

/* Waits up to ms for job id to be in state want. */
static bool wait_state(const char *id, const char *want, int ms) {
    for (int i = 0; i < ms / 100; i++) {
        char *st = job_state(id);
        bool ok = strcmp(st, want) == 0;
        free(st);
        if (ok) return true;
        usleep(100000);
    }
    return false;
}

/* Waits up to ms for hpd's stderr to contain s. */
static bool log_has(const char *s, int ms) {
    for (int i = 0;; i++) {
        char *log = hp_th_slurp_or_empty(g_log);
        bool ok = strstr(log, s) != NULL;
        free(log);
        if (ok || i >= ms / 50) return ok;
        usleep(50000);
    }
}

/* The SigBlk mask in /proc/PID/status; 0 when unreadable. */
static unsigned long long sig_blocked(const char *pid) {
    char p[300], line[256];
    snprintf(p, sizeof p, "/proc/%s/status", pid);
    FILE *f = fopen(p, "r");
    unsigned long long m = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &m) == 1) break;
    fclose(f);
    return m;
}

#define SIGBIT(s) (1ull << ((s)-1))
#define STOP_SIGS (SIGBIT(SIGTERM) | SIGBIT(SIGINT) | SIGBIT(SIGHUP))

Test(hpd_config, bad_file_stops_the_start_naming_file_and_line) {
    write_file(g_conf, "# hpd\nslots = 2\n\nbogus = 1\n");
    char args[600], want[400], *err;
    snprintf(args, sizeof args, "--config %s", g_conf);
    cr_expect_eq(hpd_exit_code(args, &err), 2);
    snprintf(want, sizeof want, "%s:4: unknown key 'bogus'", g_conf);
    cr_expect(strstr(err, want), "stderr: %s", err);
    free(err);

    write_file(g_conf, "slots = many\n");
    setenv("HPD_CONFIG", g_conf, 1); /* the environment names the file */
    cr_expect_eq(hpd_exit_code("", &err), 2);
    snprintf(want, sizeof want, "%s:1: slots: 'many' must be an integer", g_conf);
    cr_expect(strstr(err, want), "stderr: %s", err);
    free(err);
    unsetenv("HPD_CONFIG");

    write_file(g_conf, "log-level\n");
    snprintf(args, sizeof args, "--config %s", g_conf);
    cr_expect_eq(hpd_exit_code(args, &err), 2);
    snprintf(want, sizeof want, "%s:1: expected 'key = value', got 'log-level'", g_conf);
    cr_expect(strstr(err, want), "stderr: %s", err);
    free(err);

    cr_expect_eq(hpd_exit_code("--on-sigterm leave", &err), 2);
    cr_expect(strstr(err, "--on-sigterm: 'leave' is not checkpoint|cancel"), "stderr: %s", err);
    free(err);
    /* a flag without its value: getopt would take the next flag for it */
    cr_expect_eq(hpd_exit_code("--gpus --slots 2", &err), 2);
    cr_expect(strstr(err, "--gpus: missing value (got the flag '--slots')"), "stderr: %s", err);
    free(err);
    snprintf(args, sizeof args, "--config %s/nope.conf", g_dir);
    cr_expect_eq(hpd_exit_code(args, &err), 2);
    cr_expect(strstr(err, "nope.conf: No such file"), "stderr: %s", err);
    free(err);
}

/* An HTTP address asked for and taken stops the start, naming it; with http = off in the file
 * (the flag absent) hpd starts without HTTP. */
Test(hpd_config, a_taken_http_address_asked_for_stops_the_start) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    char args[600], want[200], *err;
    snprintf(args, sizeof args, "--state-dir %s/state --http 127.0.0.1:%d", g_dir,
             ntohs(sa.sin_port));
    cr_expect_eq(hpd_exit_code(args, &err), 1);
    snprintf(want, sizeof want, "--http 127.0.0.1:%d: bind", ntohs(sa.sin_port));
    cr_expect(strstr(err, want) && strstr(err, "in use"), "stderr: %s", err);
    free(err);
    write_file(g_conf, "http = off\n");
    start_hpd("--config", g_conf, (char *)NULL);
    cr_expect_str_eq(g_h.http, "off");
    close(fd);
}

Test(hpd_config, flags_win_over_the_file) {
    write_file(g_conf, "slots = 1\nlog-level = info\nhttp = off\n");
    start_hpd("--config", g_conf, "--slots", "3", (char *)NULL);
    cr_expect(log_has("event=ready", 5000) && log_has(" slots=3 ", 0), "the flag did not win");
}

Test(hpd_config, sighup_applies_live_keys_and_keeps_a_broken_config_out) {
    write_file(g_conf, "# live test\nlog-level = warn\nslots = 1\nhttp = off\n");
    start_hpd("--config", g_conf, (char *)NULL);
    /* hpd logs event=ready (info) before its loop runs: once a call is answered, the line
     * would be in the log. A condition, not a sleep. */
    run l = hpctl("list");
    cr_assert_eq(l.code, 0, "hpctl list: %s", l.err);
    run_free(&l);
    cr_expect_not(log_has("event=ready", 0), "log-level warn still logs info lines");

    new_job("long.pb", 1000000);
    char *a = submit("long.pb"), *b = submit("long.pb");
    cr_assert(wait_state(a, "RUNNING", 60000), "the first job never ran");
    /* The scheduler ran when b was committed (hp__core_tick at submit), with a holding the one
     * slot: b stays QUEUED until a slot frees, and a runs 10^6 steps. No sleep needed. */
    char *st = job_state(b);
    cr_expect_str_eq(st, "QUEUED", "one slot: the second job waits");
    free(st);
    /* hpd blocks the stop signals in its threads (one sigwait()s them for the loop); the
     * worker it spawned must not inherit that mask, or SIGTERM would not stop it. */
    char cmd[200], wp[32] = "";
    snprintf(cmd, sizeof cmd, "pgrep -f -- 'hp-worker [-]-coordinator .* [-]-job %s [-]-rank 0'",
             a);
    FILE *pg = popen(cmd, "r");
    cr_assert(pg);
    cr_assert(fgets(wp, sizeof wp, pg) && atoi(wp) > 0, "no hp-worker for %s", a);
    pclose(pg);
    wp[strcspn(wp, "\n")] = 0;
    cr_expect_eq(sig_blocked(wp) & STOP_SIGS, 0ull, "the worker %s inherited blocked signals: %llx",
                 wp, sig_blocked(wp));

    write_file(g_conf, "log-level = info\nslots = 2\nhttp = off\nworker = /nonexistent/hp-worker\n"
                       "on-sigterm = cancel\nheartbeat-ms = 3000\nlauncher = external\n"
                       "launch-timeout-s = 30\n");
    kill(g_hpd, SIGHUP);
    cr_expect(wait_state(b, "RUNNING", 60000),
              "slots 2 after SIGHUP: the queued job did not start");
    cr_expect(log_has("event=config_changed key=slots from=1 to=2", 5000));
    cr_expect(log_has("event=config_changed key=log-level from=warn to=info", 0));
    cr_expect(log_has("event=config_changed key=on-sigterm from=checkpoint to=cancel", 0));
    cr_expect(log_has("event=config_changed key=heartbeat-ms from=0 to=3000", 0));
    cr_expect(
        log_has("key=worker from=\"\" to=\"/nonexistent/hp-worker\" note=\"needs a restart\"", 0));
    cr_expect(log_has("key=launcher from=\"local\" to=\"external\" note=\"needs a restart\"", 0),
              "a launcher change is not applied live");
    cr_expect(log_has("event=config_changed key=launch-timeout-s from=120 to=30", 0));
    cr_expect(log_has("event=reload signal=SIGHUP", 0), "info lines show after the reload");

    write_file(g_conf, "slots = 2\nslots = 3\n");
    kill(g_hpd, SIGHUP);
    char want[400];
    snprintf(want, sizeof want, "%s:2: slots: given twice", g_conf);
    cr_expect(log_has("event=reload_failed", 5000) && log_has(want, 0), "no reload_failed line");
    cr_expect_eq(kill(g_hpd, 0), 0, "hpd died of a broken config");
    st = job_state(a);
    cr_expect_str_eq(st, "RUNNING", "the running jobs are not touched");
    free(st);

    /* on-sigterm became cancel: SIGTERM cancels both; a restarted hpd shows them CANCELLED */
    stop_hpd();
    cr_expect(log_has("reason=\"cancelled: coordinator shut down\"", 0));
    write_file(g_conf, "http = off\n");
    start_hpd("--config", g_conf, (char *)NULL);
    for (int k = 0; k < 2; k++) {
        const char *id = k ? b : a;
        st = job_state(id);
        char *why = job_error(id);
        cr_expect_str_eq(st, "CANCELLED", "job %s is %s: %s", id, st, why);
        free(why);
        free(st);
    }
    free(a);
    free(b);
}

Test(hpd_config, on_sigterm_cancel_leaves_jobs_cancelled_after_a_restart) {
    write_file(g_conf, "http = off\n");
    start_hpd("--config", g_conf, "--on-sigterm", "cancel", (char *)NULL);
    new_job("long.pb", 1000000);
    new_job("short.pb", 3);
    char *done = submit("short.pb");
    cr_assert(wait_state(done, "SUCCEEDED", 60000));
    char *id = submit("long.pb");
    cr_assert(wait_state(id, "RUNNING", 60000), "the job never ran");
    stop_hpd();
    start_hpd("--config", g_conf, (char *)NULL); /* the default policy again: nothing to do */
    char *st = job_state(id);
    cr_expect_str_eq(st, "CANCELLED");
    free(st);
    st = job_state(done);
    cr_expect_str_eq(st, "SUCCEEDED", "a finished job stays as it was");
    free(st);
    cr_expect(log_has("to=CANCELLED reason=\"cancelled: coordinator shut down\"", 0));
    free(id);
    free(done);
}

/* A SIGTERM or SIGINT the moment hpd is ready stops it, every time (a process-wide signal that
 * the kernel gave a gRPC thread once stayed pending for good under ThreadSanitizer). */
Test(hpd_config, a_stop_signal_right_after_ready_always_stops_hpd) {
    write_file(g_conf, "http = off\n");
    for (int i = 0; i < 12; i++) {
        start_hpd("--config", g_conf, (char *)NULL);
        if (i % 3 == 2) {
            cr_assert_eq(kill(g_h.pid, SIGINT), 0);
            int st = 0;
            pid_t w = -1;
            for (int k = 0; k < 3000 && (w = waitpid(g_h.pid, &st, WNOHANG)) == 0; k++)
                usleep(10000);
            cr_expect(w == g_h.pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "start %d: hpd did not exit 0 within 30 s of SIGINT", i);
            if (w != g_h.pid) kill(g_h.pid, SIGKILL), waitpid(g_h.pid, NULL, 0);
            g_h.pid = g_hpd = -1;
        } else {
            stop_hpd();
        }
        cr_assert(log_has("event=shutdown signal=SIG", 0), "start %d: no shutdown line", i);
    }
}
