/* tests/daemon/test_launchers.c — the launcher choice and what surrounds it, through the real
 * hpd, hpctl and hp-worker on 127.0.0.1: --launcher external (the printed per-rank commands
 * train a job; a wrong token, a stale attempt and a rank out of range are refused and logged;
 * the launch timeout), --comm tcp (a late rank still gets rank 0's address; the run equals
 * the shm run bit for bit), --advertise (hpd bound to 0.0.0.0, workers dial 127.0.0.1), the
 * sd_notify messages on a test datagram socket, the systemd units (systemd-analyze verify
 * with nothing on stderr, security scores) and the deploy scripts (shellcheck). */
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"
#include "tests/util/run_compare.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef hp_th_run run;

static char g_dir[256];
static char g_log[300];
static hp_th_hpd g_h = {.pid = -1};

#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)

static void setup(void) {
    hp_th_tmpdir_make(g_dir, sizeof g_dir, "hp-launchers");
    snprintf(g_log, sizeof g_log, "%s/hpd.log", g_dir);
    unsetenv("HP_TOKEN");
    unsetenv("SLURM_JOB_ID");
    /* the printed commands name hp-worker: find it on PATH */
    char path[4096];
    snprintf(path, sizeof path, "%s/worker:%s", hp_th_binary_dir(), getenv("PATH"));
    setenv("PATH", path, 1);
}

static void teardown(void) {
    if (g_h.pid > 0) {
        int code = hp_th_hpd_stop(&g_h);
        cr_expect_eq(code, 0, "hpd exit status %d on SIGTERM", code);
    }
    hp_th_tmpdir_remove(g_dir);
}

TestSuite(launchers, .init = setup, .fini = teardown, .timeout = 180);

static void start(const char *const *extra) {
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    mkdir(state, 0700);
    hp_th_hpd_start(&g_h, state, g_log, extra);
    setenv("HP_SERVER", g_h.grpc, 1);
    setenv("HP_STATE_DIR", state, 1);
}

static json_t *parse_json(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, s);
    return j;
}

static void new_job(const char *name, int world, int steps, const char *extra) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d %s%s%s -o %s/%s",
                  steps, world > 1 ? "--fsdp 'layers.*' --mesh dp=" : "",
                  world > 1 ? (world == 2 ? "2 " : "4 ") : "", extra, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
}

static char *submit(const char *job) {
    return hp_th_hpctl_submit(g_dir, job);
}

static char *state_of(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_t *j = parse_json(r.out);
    char *s = strdup(json_string_value(json_object_get(j, "state")));
    json_decref(j);
    hp_th_run_free(&r);
    return s;
}

static char *wait_state(const char *id, const char *want, int seconds) {
    char *st = NULL;
    for (int i = 0; i < seconds * 20; i++) {
        free(st);
        st = state_of(id);
        if (!strcmp(st, want) || !strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED") ||
            !strcmp(st, "CANCELLED"))
            return st;
        usleep(50000);
    }
    return st;
}

/* The commands hpctl status --worker-cmd prints, one per rank (n of them). */
static int worker_cmds(const char *id, char cmds[][1024], int max) {
    run r = hpctl("status %s --worker-cmd", id);
    cr_assert_eq(r.code, 0, "status --worker-cmd: %s", r.err);
    int n = 0;
    for (char *save = NULL, *l = strtok_r(r.out, "\n", &save); l && n < max;
         l = strtok_r(NULL, "\n", &save))
        snprintf(cmds[n++], 1024, "%s", l);
    hp_th_run_free(&r);
    return n;
}

/* Starts `cmd` in the background through sh, output to g_dir/NAME.log; its pid. */
static pid_t spawn(const char *cmd, const char *name) {
    char log[400];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, name);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (!freopen(log, "w", stdout) || !freopen(log, "a", stderr)) _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid, int seconds) {
    int st = 0;
    for (int i = 0; i < seconds * 20; i++) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(50000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static bool log_has(const char *what) {
    for (int i = 0; i < 40; i++) { /* hpd logs it a moment after the refusal */
        char *log = hp_th_slurp(g_log);
        bool found = strstr(log, what) != NULL;
        free(log);
        if (found) return true;
        usleep(50000);
    }
    return false;
}

Test(launchers, external_workers_started_from_the_printed_commands) {
    const char *args[] = {"--http", "off", "--launcher", "external", NULL};
    start(args);
    /* 300 tiny steps: long enough that attempt 0 is still running when rank 1 is killed (a
     * 12-step job could finish between seeing RUNNING and the kill on an idle machine) */
    new_job("job.pb", 2, 300, "--checkpoint-interval 4 --max-restarts 1 ");
    char *id = submit("job.pb");
    char *st = wait_state(id, "LAUNCHING", 30);
    cr_assert_str_eq(st, "LAUNCHING", "external: the job waits for its workers");
    free(st);
    char cmds[4][1024];
    cr_assert_eq(worker_cmds(id, cmds, 4), 2, "want one command per rank");
    for (int r = 0; r < 2; r++) {
        char want[64];
        snprintf(want, sizeof want, "--job %s --rank %d", id, r);
        cr_expect(strstr(cmds[r], want), "rank %d: %s", r, cmds[r]);
        cr_expect(strstr(cmds[r], g_h.workers), "rank %d does not dial %s: %s", r, g_h.workers,
                  cmds[r]);
    }
    /* The commands carry the token: the call needs the bearer token. */
    run r = hpctl("status %s --worker-cmd --token not-the-token", id);
    cr_expect_eq(r.code, 1);
    cr_expect(strstr(r.err, "UNAUTHENTICATED"), "%s", r.err);
    hp_th_run_free(&r);

    /* Refused and logged: a wrong token, a rank out of range. */
    char bad[1200];
    snprintf(bad, sizeof bad,
             "HP_WELCOME_TIMEOUT_S=5 hp-worker --coordinator %s --job %s --rank 0 "
             "--token 0000",
             g_h.workers, id);
    fprintf(stderr, "T0 %ld\n", (long)time(NULL));
    cr_expect_neq(wait_exit(spawn(bad, "bad-token"), 30), 0, "a wrong token was accepted");
    char want[200];
    snprintf(want, sizeof want, "bad token for job %s attempt 0", id);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    snprintf(bad, sizeof bad, "%s", cmds[1]);
    char *rk = strstr(bad, "--rank 1");
    cr_assert(rk);
    rk[7] = '7';
    cr_expect_neq(wait_exit(spawn(bad, "bad-rank"), 30), 0, "rank 7 of 2 was accepted");
    cr_expect(log_has("rank 7 out of range [0, 2)"), "no rank-out-of-range line in hpd's log");

    /* Attempt 0: rank 1 is killed, the job restarts (attempt 1) with a new token. */
    pid_t p0 = spawn(cmds[0], "a0-rank0"), p1 = spawn(cmds[1], "a0-rank1");
    st = wait_state(id, "RUNNING", 60);
    cr_assert_str_eq(st, "RUNNING");
    free(st);
    kill(-p1, SIGKILL);
    wait_exit(p1, 10);
    for (int i = 0; i < 600; i++) { /* RESTARTING may pass quickly: anything but RUNNING */
        st = state_of(id);
        bool moved = strcmp(st, "RUNNING") != 0;
        free(st);
        if (moved) break;
        usleep(50000);
    }
    wait_exit(p0, 30);
    st = wait_state(id, "LAUNCHING", 30);
    cr_assert_str_eq(st, "LAUNCHING", "the restart waits for workers again (state %s)", st);
    free(st);
    /* A worker of the finished attempt is refused. */
    cr_expect_neq(wait_exit(spawn(cmds[0], "stale"), 30), 0, "attempt 0's token was accepted");
    snprintf(want, sizeof want, "stale token for job %s: it belongs to attempt 0", id);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    char cmds2[4][1024];
    cr_assert_eq(worker_cmds(id, cmds2, 4), 2);
    cr_expect(strcmp(cmds[0], cmds2[0]), "the new attempt kept the old token");
    p0 = spawn(cmds2[0], "a1-rank0");
    p1 = spawn(cmds2[1], "a1-rank1");
    st = wait_state(id, "SUCCEEDED", 120);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    cr_expect_eq(wait_exit(p0, 30), 0, "rank 0 of attempt 1");
    cr_expect_eq(wait_exit(p1, 30), 0, "rank 1 of attempt 1");
    free(id);
}

/* --comm tcp through the real hpd: rank 0 starts alone and sends its address before rank 1
 * has said Hello (hpd keeps it for the late rank); the world-2 FSDP run logs the losses of
 * the same job trained standalone over shm, bit for bit, and leaves the same weights. */
Test(launchers, tcp_comm_through_hpd_equals_shm_bitwise) {
    const char *args[] = {"--http", "off", "--launcher", "external", "--comm", "tcp", NULL};
    start(args);
    new_job("tcp.pb", 2, 8, "--log-interval 1 ");
    char *id = submit("tcp.pb");
    char *st = wait_state(id, "LAUNCHING", 30);
    cr_assert_str_eq(st, "LAUNCHING");
    free(st);
    char cmds[4][1024];
    cr_assert_eq(worker_cmds(id, cmds, 4), 2);
    pid_t p0 = spawn(cmds[0], "tcp-rank0");
    /* rank 1 comes late: after rank 0 has listened and sent its CommSetup (a delay that makes
     * the case likely, not synchronization: an early rank 1 passes as well) */
    usleep(1500 * 1000);
    pid_t p1 = spawn(cmds[1], "tcp-rank1");
    st = wait_state(id, "SUCCEEDED", 120);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    cr_expect_eq(wait_exit(p0, 30), 0, "rank 0");
    cr_expect_eq(wait_exit(p1, 30), 0, "rank 1");
    run r = hp_th_run_bin(g_dir, "worker/hp-worker",
                          "--standalone %s/tcp.pb --threads 1 --out %s/shm", g_dir, g_dir);
    cr_assert_eq(r.code, 0, "standalone shm run: %s", r.err);
    hp_th_run_free(&r);
    char run_dir[512], shm_dir[512];
    snprintf(run_dir, sizeof run_dir, "%s/state/jobs/%s/run", g_dir, id);
    snprintf(shm_dir, sizeof shm_dir, "%s/shm", g_dir);
    double a[16], b[16];
    int n = hp_th_read_losses(shm_dir, a, 16);
    cr_assert_eq(n, 8);
    cr_assert_eq(hp_th_read_losses(run_dir, b, 16), n);
    for (int i = 0; i < n; i++)
        cr_expect(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "step %d: shm %.17g, tcp %.17g", i + 1,
                  a[i], b[i]);
    hp_th_expect_weights_close(shm_dir, run_dir, 0, 0, "tcp through hpd");
    free(id);
}

Test(launchers, external_launch_timeout_fails_the_job) {
    const char *args[] = {"--http", "off", "--launcher", "external", "--launch-timeout-s",
                          "2",      NULL};
    start(args);
    new_job("job.pb", 1, 3, "");
    char *id = submit("job.pb");
    char *st = wait_state(id, "FAILED", 30);
    cr_expect_str_eq(st, "FAILED");
    free(st);
    run r = hpctl("status %s --json", id);
    cr_expect(strstr(r.out, "never said hello within launch-timeout-s 2"), "%s", r.out);
    hp_th_run_free(&r);
    r = hpctl("status %s --worker-cmd", id);
    cr_expect_eq(r.code, 1, "worker commands of a failed job");
    cr_expect(strstr(r.err, "no attempt is accepting workers"), "%s", r.err);
    hp_th_run_free(&r);
    free(id);
}

Test(launchers, workers_dial_the_advertised_address) {
    const char *args[] = {"--http",    "off", "--worker-listen", "0.0.0.0:0", "--advertise",
                          "127.0.0.1", NULL};
    start(args);
    cr_expect(!strncmp(g_h.workers, "127.0.0.1:", 10), "ready line workers=%s", g_h.workers);
    char want[100];
    snprintf(want, sizeof want, "worker_bind=0.0.0.0:%s", strchr(g_h.workers, ':') + 1);
    cr_expect(log_has(want), "no '%s' in hpd's log", want);
    new_job("job.pb", 1, 3, "");
    char *id = submit("job.pb");
    char *st = wait_state(id, "SUCCEEDED", 60);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    free(id);
    /* A wildcard bind with workers elsewhere and nothing to advertise: refused at start. */
    hp_th_run rr = hp_th_run_bin(g_dir, "daemon/hpd",
                                 "--state-dir %s/s2 --listen 127.0.0.1:0 --http off "
                                 "--worker-listen 0.0.0.0:0 --launcher external",
                                 g_dir);
    cr_expect_eq(rr.code, 2);
    cr_expect(strstr(rr.err, "give the address they dial with --advertise"), "%s", rr.err);
    hp_th_run_free(&rr);
    rr = hp_th_run_bin(g_dir, "daemon/hpd", "--state-dir %s/s2 --launcher pbs", g_dir);
    cr_expect_eq(rr.code, 2);
    cr_expect(strstr(rr.err, "--launcher: 'pbs' is not local|slurm|systemd|external"), "%s",
              rr.err);
    hp_th_run_free(&rr);
    rr = hp_th_run_bin(g_dir, "daemon/hpd", "--state-dir %s/s2 --advertise 0.0.0.0:7000", g_dir);
    cr_expect_eq(rr.code, 2);
    cr_expect(strstr(rr.err, "a wildcard is not an address workers can dial"), "%s", rr.err);
    hp_th_run_free(&rr);
}

/* READY=1, WATCHDOG=1 and STOPPING=1 arrive on NOTIFY_SOCKET. */
Test(launchers, sd_notify_ready_watchdog_stopping) {
    char sock[300];
    snprintf(sock, sizeof sock, "%s/notify.sock", g_dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", sock);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setenv("NOTIFY_SOCKET", sock, 1);
    setenv("WATCHDOG_USEC", "200000", 1);
    const char *args[] = {"--http", "off", NULL};
    start(args);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    int ready = 0, watchdog = 0, stopping = 0;
    char buf[1024];
    for (int i = 0; i < 20 && !(ready && watchdog >= 3); i++) {
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n <= 0) continue;
        buf[n] = 0;
        if (strstr(buf, "READY=1")) {
            ready++;
            char pid[32];
            snprintf(pid, sizeof pid, "MAINPID=%d", (int)g_h.pid);
            cr_expect(strstr(buf, pid), "READY without %s: %s", pid, buf);
        }
        if (strstr(buf, "WATCHDOG=1")) watchdog++;
    }
    cr_expect_eq(ready, 1, "READY=1 messages: %d", ready);
    cr_expect_geq(watchdog, 3, "WATCHDOG=1 messages in 4 s at a 200 ms watchdog: %d", watchdog);
    kill(g_h.pid, SIGTERM);
    for (int i = 0; i < 50 && !stopping; i++) {
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n <= 0) continue;
        buf[n] = 0;
        if (strstr(buf, "STOPPING=1")) stopping++;
    }
    cr_expect_eq(stopping, 1, "no STOPPING=1 after SIGTERM");
    int wst = 0; /* a second SIGTERM would kill it: wait for the first to end it */
    pid_t w = 0;
    for (int i = 0; i < 300 && (w = waitpid(g_h.pid, &wst, WNOHANG)) == 0; i++) usleep(100000);
    cr_expect(w == g_h.pid && WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "hpd after SIGTERM: 0x%x",
              wst);
    if (w != g_h.pid) hp_th_hpd_stop(&g_h);
    g_h.pid = -1;
    close(fd);
    /* Without NOTIFY_SOCKET nothing is sent and nothing fails. */
    start(args);
}

static char *sh(int *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *sh(int *code, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t cap = 65536, len = 0, k;
    char *out = malloc(cap);
    while ((k = fread(out + len, 1, cap - len - 1, p)) > 0) len += k;
    out[len] = 0;
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* Every unit verifies with nothing on stderr (misplaced keys are only warnings there), and the
 * offline security scores are printed; hpd.service must rate OK or better. */
Test(launchers, systemd_units_verify_and_score) {
    int code;
    char *o = sh(&code, "command -v systemd-analyze");
    free(o);
    if (code != 0) cr_skip_test("no systemd-analyze (apt-get install systemd)");
    const char *units[] = {"hpd.service", "hp-worker@.service"};
    for (size_t i = 0; i < 2; i++) {
        /* ExecStart names the installed binaries: point it at the build's */
        o = sh(&code,
               "cd %s && sed -e 's|/usr/bin/hpd|%s/daemon/hpd|' -e "
               "'s|/usr/bin/hp-worker|%s/worker/hp-worker|' %s/deploy/systemd/%s > '%s' && "
               "systemd-analyze verify --man=no ./'%s' 2>&1 >/dev/null",
               g_dir, hp_th_binary_dir(), hp_th_binary_dir(), hp_th_source_dir(), units[i],
               units[i], units[i]);
        cr_expect_eq(code, 0, "%s: verify failed: %s", units[i], o);
        cr_expect_str_eq(o, "", "%s: systemd-analyze verify said something", units[i]);
        free(o);
        o = sh(&code, "cd %s && systemd-analyze security --offline=yes ./'%s' 2>&1 | tail -n 1",
               g_dir, units[i]);
        printf("systemd-analyze security %s: %s", units[i], o);
        cr_expect(strstr(o, "Overall exposure level"), "%s: %s", units[i], o);
        free(o);
    }
    /* OK or better: exposure below 5 (systemd's scale: OK < 5 < MEDIUM < 7 < EXPOSED) */
    o = sh(&code,
           "cd %s && systemd-analyze security --offline=yes --threshold=49 ./hpd.service "
           ">/dev/null 2>&1",
           g_dir);
    cr_expect_eq(code, 0, "hpd.service rates worse than OK");
    free(o);
}

Test(launchers, deploy_scripts_are_shellcheck_clean) {
    int code;
    char *o = sh(&code, "command -v shellcheck");
    free(o);
    if (code != 0) cr_skip_test("no shellcheck (apt-get install shellcheck)");
    const char *scripts[] = {"deploy/slurm/hpd.sbatch", "deploy/slurm/train.sbatch",
                             "tests/daemon/slurm_cluster.sh"};
    for (size_t i = 0; i < 3; i++) {
        o = sh(&code, "shellcheck %s/%s 2>&1", hp_th_source_dir(), scripts[i]);
        cr_expect_eq(code, 0, "shellcheck %s:\n%s", scripts[i], o);
        free(o);
    }
}
