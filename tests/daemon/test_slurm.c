/* tests/daemon/test_slurm.c — hpd --launcher slurm against a real single-node Slurm cluster
 * (munged, slurmctld, slurmd on 127.0.0.1, no cgroups; tests/daemon/slurm_cluster.sh starts
 * and stops its own per test). Through the real hpd, hpctl and hp-worker: a world-2 FSDP job
 * to SUCCEEDED with the loss falling; hpctl cancel ending the Slurm job; a rank killed with
 * SIGKILL → RESTARTING → resumed → SUCCEEDED with the final weights of an uninterrupted run;
 * hpd killed with SIGKILL while a Slurm job runs → restarted → the job found, cancelled and
 * relaunched; deploy/slurm/train.sbatch submitted to the same cluster to completion; a job
 * whose Slurm record is gone while hpd was down (sacct unavailable: no accounting here) lost
 * and restarted; hpd inside an allocation (hpd.sbatch) reporting a SIGKILLed rank as its own
 * 137 and resuming. Skips (saying why) where Slurm is not installed or the test is not root.
 * The sacct output parser (suite slurm_parse) runs everywhere, on recorded outputs. */
#include "daemon/launch_slurm.h"
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef hp_th_run run;

static char g_dir[256];   /* temp dir: slurm/, state/, job files */
static char g_slurm[300]; /* the cluster's dir */
static char g_skip[256];  /* why the cluster cannot run here ("": it can) */
static int g_base;        /* the cluster's first port */
static hp_th_hpd g_h = {.pid = -1};
static char g_log[300]; /* hpd's stderr */
static const char *const k_hpd_args[] = {"--http", "127.0.0.1:0",     "--slots", "4", "--launcher",
                                         "slurm",  "--slurm-poll-ms", "200",     NULL};

#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)

/* Runs a shell command, its stdout captured (malloc'd); *code its exit status. */
static char *sh(int *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *sh(int *code, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    size_t k;
    while ((k = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (cap - len < 2) out = realloc(out, cap *= 2);
    }
    out[len] = 0;
    int st = pclose(p);
    if (code) *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static void start_hpd_with(const char *const *args) {
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    hp_th_hpd_start(&g_h, state, g_log, args);
    setenv("HP_SERVER", g_h.grpc, 1);
    setenv("HP_STATE_DIR", state, 1);
}

static void start_hpd(void) {
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    hp_th_hpd_start(&g_h, state, g_log, k_hpd_args);
    setenv("HP_SERVER", g_h.grpc, 1);
    setenv("HP_STATE_DIR", state, 1);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hp-slurm-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    chmod(g_dir, 0755);
    g_skip[0] = 0;
    int code;
    char *why = sh(&code, "%s/tests/daemon/slurm_cluster.sh check", hp_th_source_dir());
    if (code != 0) {
        snprintf(g_skip, sizeof g_skip, "%.*s", (int)strcspn(why, "\n"), why);
        free(why);
        return;
    }
    free(why);
    snprintf(g_slurm, sizeof g_slurm, "%s/slurm", g_dir);
    /* own ports per process: tests of other worktrees may run a cluster at the same time. A
     * start that fails (a port taken after all) is stopped, so nothing is left running, and
     * tried again on other ports; .fini does not run when .init fails. */
    char *out = NULL;
    for (int attempt = 0; attempt < 3; attempt++) {
        /* below the kernel's ephemeral ports (32768..), where the tests' port-0 sockets live */
        g_base = 17000 + (int)((getpid() + attempt * 37) % 140) * 110;
        free(out);
        out = sh(&code, "%s/tests/daemon/slurm_cluster.sh start %s %d 2>&1", hp_th_source_dir(),
                 g_slurm, g_base);
        if (code == 0) break;
        free(sh(NULL, "%s/tests/daemon/slurm_cluster.sh stop %s", hp_th_source_dir(), g_slurm));
    }
    cr_assert_eq(code, 0, "the Slurm cluster did not start: %s", out);
    free(out);
    char conf[400];
    snprintf(conf, sizeof conf, "%s/slurm.conf", g_slurm);
    setenv("SLURM_CONF", conf, 1);
    unsetenv("SLURM_JOB_ID"); /* hpd must submit jobs, not srun inside ours */
    unsetenv("HP_TOKEN");
    snprintf(g_log, sizeof g_log, "%s/hpd.log", g_dir);
    mkdir(g_dir, 0755);
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    cr_assert_eq(mkdir(state, 0700), 0);
    start_hpd();
}

static void teardown(void) {
    if (g_h.pid > 0) {
        int code = hp_th_hpd_stop(&g_h);
        cr_expect_eq(code, 0, "hpd exit status %d on SIGTERM", code);
    }
    if (!g_skip[0]) {
        int code;
        char *o =
            sh(&code, "%s/tests/daemon/slurm_cluster.sh stop %s", hp_th_source_dir(), g_slurm);
        free(o);
    }
    hp_th_tmpdir_remove(g_dir);
}

TestSuite(slurm, .init = setup, .fini = teardown, .timeout = 240);

#define NEED_SLURM()                                                                               \
    do {                                                                                           \
        if (g_skip[0]) cr_skip_test("no real Slurm here: %s", g_skip);                             \
    } while (0)

static json_t *parse_json(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, s);
    return j;
}

static void new_job(const char *name, int steps, const char *extra) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d --fsdp 'layers.*' "
                  "--mesh dp=2 %s -o %s/%s",
                  steps, extra, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
}

static char *submit(const char *job) {
    return hp_th_hpctl_submit(g_dir, job);
}

/* The job's JSON status (hpctl status --json). */
static json_t *status(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_t *j = parse_json(r.out);
    hp_th_run_free(&r);
    return j;
}

static char *field(const char *id, const char *key) {
    json_t *j = status(id);
    json_t *v = json_object_get(j, key);
    char *s = json_is_string(v) ? strdup(json_string_value(v))
                                : (char *)calloc(1, 1); /* integers are read with step() */
    json_decref(j);
    return s;
}

static long step(const char *id) {
    json_t *j = status(id);
    long s = (long)json_integer_value(json_object_get(j, "step"));
    json_decref(j);
    return s;
}

/* Waits are bounded by a deadline in seconds, not by a count of tries: each try runs hpctl or
 * squeue, which takes far longer on a loaded machine. */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits until the job's step is at least `at_least` (or `seconds` pass); its last step. */
static long wait_step(const char *id, long at_least, int seconds) {
    double end = mono_s() + seconds;
    long s = step(id);
    while (s < at_least && mono_s() < end) {
        usleep(10000);
        s = step(id);
    }
    return s;
}

static char *wait_state(const char *id, const char *want, int seconds) {
    char *st = NULL;
    for (double end = mono_s() + seconds; mono_s() < end;) {
        free(st);
        st = field(id, "state");
        if (!strcmp(st, want) || !strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED") ||
            !strcmp(st, "CANCELLED"))
            return st;
        usleep(100000);
    }
    return st;
}

/* The Slurm job's state as squeue lists active jobs ("" once it left them). */
static char *squeue_active(const char *ref) {
    int code;
    char *o = sh(&code, "squeue -h -j %s -o %%T 2>/dev/null", ref);
    o[strcspn(o, "\n")] = 0;
    return o;
}

static bool wait_gone(const char *ref, int seconds) {
    for (double end = mono_s() + seconds; mono_s() < end;) {
        char *s = squeue_active(ref);
        bool gone = !s[0];
        free(s);
        if (gone) return true;
        usleep(100000);
    }
    return false;
}

/* For a failure message: what Slurm and hpd say about job `id` (leaked: the test ends). */
static char *diag(const char *id) {
    char *q = sh(NULL, "squeue -h -t all -o '%%i %%j %%T %%r'; sinfo -h -o '%%n %%T %%E'");
    char *lines =
        sh(NULL, "grep -E 'job=%s ' %s | grep -v event=checkpoint | cut -c1-300", id, g_log);
    size_t n = strlen(q) + strlen(lines) + 32;
    char *out = malloc(n);
    if (out) snprintf(out, n, "\nslurm:\n%s\nhpd:\n%s", q, lines);
    free(q);
    free(lines);
    return out ? out : "";
}

static char *read_weights(const char *id) {
    char path[600];
    snprintf(path, sizeof path, "%s/state/jobs/%s/run/model.safetensors", g_dir, id);
    return hp_th_slurp_or_empty(path);
}

Test(slurm, world2_fsdp_job_succeeds_with_the_loss_falling) {
    NEED_SLURM();
    new_job("job.pb", 12, "");
    run r = hpctl("submit %s/job.pb --watch", g_dir);
    cr_assert_eq(r.code, 0, "submit --watch: %s\n%s", r.out, r.err);
    cr_expect(strstr(r.out, "SUCCEEDED"), "%s", r.out);
    double loss[64];
    int n = 0;
    for (char *l = r.out; l && *l && n < 64; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        char *p = strstr(l, " loss ");
        if (!strncmp(l, "step ", 5) && p && sscanf(p, " loss %lf", &loss[n]) == 1) n++;
    }
    cr_assert_geq(n, 6, "fewer than 6 metric lines: %s", r.out);
    double first = (loss[0] + loss[1] + loss[2]) / 3,
           last = (loss[n - 1] + loss[n - 2] + loss[n - 3]) / 3;
    cr_expect_lt(last, first, "loss did not fall: %g -> %g", first, last);
    char *id = strdup(r.out);
    id[strcspn(id, "\n")] = 0;
    hp_th_run_free(&r);
    /* The Slurm job id in hpctl status (JSON and text) and the JSON API. */
    char *launcher = field(id, "launcher"), *ref = field(id, "launch_ref");
    cr_expect_str_eq(launcher, "slurm");
    cr_assert(ref[0] && strspn(ref, "0123456789") == strlen(ref), "launch_ref '%s'", ref);
    r = hpctl("status %s", id);
    char want[64];
    snprintf(want, sizeof want, "slurm job %s", ref);
    cr_expect(strstr(r.out, want), "no '%s' in: %s", want, r.out);
    hp_th_run_free(&r);
    int code;
    char *api = sh(&code, "curl -sf http://%s/api/v1/jobs/%s | tr -d ' '", g_h.http, id);
    char key[96];
    snprintf(key, sizeof key, "\"launch_ref\":\"%s\"", ref);
    cr_expect(strstr(api, key), "no %s in the JSON API's job: %s", key, api);
    free(api);
    /* It ran as one job of two tasks, named hp-ID-0, and completed. */
    char *q = sh(&code, "squeue -h -t all -j %s -o '%%j|%%D|%%T'", ref);
    char expect[128];
    snprintf(expect, sizeof expect, "hp-%s-0|1|", id);
    cr_expect(!strncmp(q, expect, strlen(expect)), "squeue: %s", q);
    free(q);
    /* Each rank read its rank from SLURM_PROCID and recorded its exit status. The job is
     * SUCCEEDED on the ranks' done frames, so the wrapper may write the file a moment later. */
    char log[600];
    snprintf(log, sizeof log, "%s/state/jobs/%s/attempt-0/rank-1.exit", g_dir, id);
    char *ex = hp_th_slurp_or_empty(log);
    for (double end = mono_s() + 30; !ex[0] && mono_s() < end; usleep(100000)) {
        free(ex);
        ex = hp_th_slurp_or_empty(log);
    }
    cr_expect_eq(atoi(ex), 0, "rank 1's exit file: '%s'", ex);
    cr_expect(ex[0], "rank 1 recorded no exit status");
    free(ex);
    free(launcher);
    free(ref);
    free(id);
}

Test(slurm, cancel_ends_the_slurm_job) {
    NEED_SLURM();
    new_job("long.pb", 1000000, "");
    char *id = submit("long.pb");
    char *st = wait_state(id, "RUNNING", 60);
    cr_assert_str_eq(st, "RUNNING");
    free(st);
    char *ref = field(id, "launch_ref");
    cr_assert(ref[0], "no Slurm job id while RUNNING");
    char *active = squeue_active(ref);
    cr_expect_str_eq(active, "RUNNING");
    free(active);
    run r = hpctl("cancel %s", id);
    cr_expect_eq(r.code, 0, "cancel: %s", r.err);
    hp_th_run_free(&r);
    st = field(id, "state");
    cr_expect_str_eq(st, "CANCELLED");
    free(st);
    cr_expect(wait_gone(ref, 30), "Slurm job %s still in squeue 30 s after the cancel", ref);
    free(ref);
    free(id);
}

/* The pid of rank `rank`'s hp-worker of job id (its environment says SLURM_PROCID). */
static pid_t worker_pid(const char *id, int rank) {
    int code;
    char *pids = sh(&code, "pgrep -f -- '^[^ ]*hp-worker [-]-coordinator .* [-]-job %s$'", id);
    pid_t found = 0;
    for (char *save = NULL, *p = strtok_r(pids, "\n", &save); p && !found;
         p = strtok_r(NULL, "\n", &save)) {
        char path[64], want[32];
        snprintf(path, sizeof path, "/proc/%s/environ", p);
        snprintf(want, sizeof want, "SLURM_PROCID=%d", rank);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            buf[n] = 0;
            if (!strcmp(buf + i, want)) found = (pid_t)atoi(p);
        }
    }
    free(pids);
    return found;
}

Test(slurm, killed_rank_restarts_from_the_checkpoint_with_the_same_weights) {
    NEED_SLURM();
    new_job("r.pb", 300, "--checkpoint-interval 25 --max-restarts 2");
    char *ref_id = submit("r.pb");
    char *st = wait_state(ref_id, "SUCCEEDED", 120);
    cr_assert_str_eq(st, "SUCCEEDED", "the uninterrupted run");
    free(st);
    char *id = submit("r.pb");
    long at = wait_step(id, 40, 60);
    cr_assert_geq(at, 40, "no progress");
    pid_t pid = worker_pid(id, 1);
    cr_assert(pid > 0, "no hp-worker of %s rank 1", id);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    st = wait_state(id, "RESTARTING", 30);
    cr_expect(!strcmp(st, "RESTARTING") || !strcmp(st, "LAUNCHING") || !strcmp(st, "RUNNING") ||
                  !strcmp(st, "SUCCEEDED"),
              "after the kill: %s", st);
    free(st);
    st = wait_state(id, "SUCCEEDED", 120);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    json_t *j = status(id);
    cr_expect_geq(json_integer_value(json_object_get(j, "restarts")), 1);
    json_decref(j);
    /* The rank's own status (128 + SIGKILL), not srun's. */
    char *log = hp_th_slurp(g_log);
    char want[160];
    snprintf(want, sizeof want, "event=worker_exit job=%s attempt=0 rank=1 status=137", id);
    cr_expect(strstr(log, want), "no '%s' in hpd's log", want);
    snprintf(want, sizeof want, "job=%s from=RUNNING to=RESTARTING", id);
    cr_expect(strstr(log, want), "no '%s' in hpd's log", want);
    free(log);
    char *a = read_weights(ref_id), *b = read_weights(id);
    cr_expect(strlen(a) > 0 && !strcmp(a, b), "final weights differ from the uninterrupted run's");
    free(a);
    free(b);
    free(id);
    free(ref_id);
}

Test(slurm, hpd_killed_and_restarted_finds_its_slurm_job) {
    NEED_SLURM();
    new_job("k.pb", 400, "--checkpoint-interval 25 --max-restarts 2");
    char *id = submit("k.pb");
    long at = wait_step(id, 30, 60);
    cr_assert_geq(at, 30, "no progress");
    char *ref = field(id, "launch_ref");
    cr_assert(ref[0]);
    kill(g_h.pid, SIGKILL);
    waitpid(g_h.pid, NULL, 0);
    g_h.pid = -1;
    start_hpd();
    /* The new hpd adopts the old Slurm job, stops it and relaunches from the checkpoint. */
    cr_expect(wait_gone(ref, 60), "the old Slurm job %s still runs", ref);
    char *st = wait_state(id, "SUCCEEDED", 180);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    char *ref2 = field(id, "launch_ref");
    cr_expect(ref2[0] && strcmp(ref, ref2), "the restart ran as Slurm job '%s' (old %s)", ref2,
              ref);
    char *log = hp_th_slurp(g_log);
    char want[160];
    snprintf(want, sizeof want, "event=adopted job=%s attempt=0 launcher=slurm ref=%s", id, ref);
    cr_expect(strstr(log, want), "no '%s' in hpd's log", want);
    free(log);
    json_t *j = status(id);
    cr_expect_geq(json_integer_value(json_object_get(j, "restarts")), 1);
    json_decref(j);
    free(ref2);
    free(ref);
    free(id);
}

Test(slurm, train_sbatch_runs_to_completion) {
    NEED_SLURM();
    new_job("t.pb", 8, "");
    int code;
    char *out =
        sh(&code,
           "cd %s && HP_WORKER=%s/worker/hp-worker sbatch --parsable --wait --ntasks=2 "
           "--output=%s/train-%%j.log %s/deploy/slurm/train.sbatch %s/t.pb %s/trainout 2>&1",
           g_dir, hp_th_binary_dir(), g_dir, hp_th_source_dir(), g_dir, g_dir);
    cr_expect_eq(code, 0, "sbatch --wait train.sbatch: %s", out);
    char *jobid = strdup(out);
    jobid[strcspn(jobid, "\n;")] = 0;
    char log[600];
    snprintf(log, sizeof log, "%s/train-%s.log", g_dir, jobid);
    char *text = hp_th_slurp_or_empty(log);
    cr_expect(strstr(text, "done: steps 1..8"), "train.sbatch's output: %s", text);
    free(text);
    snprintf(log, sizeof log, "%s/trainout/model.safetensors", g_dir);
    struct stat sb;
    cr_expect(stat(log, &sb) == 0 && sb.st_size > 0, "no %s", log);
    free(jobid);
    free(out);
}

/* hpd inside an allocation (deploy/slurm/hpd.sbatch): it launches the ranks as srun steps of
 * that allocation and the script ends when the job SUCCEEDED. */
Test(slurm, hpd_sbatch_runs_the_ranks_as_steps_of_its_allocation) {
    NEED_SLURM();
    new_job("h.pb", 8, "");
    int code;
    char *out = sh(&code,
                   "cd %s && HPD=%s/daemon/hpd HPCTL=%s/client/hpctl HP_WORKER=%s/worker/hp-worker "
                   "HP_ADVERTISE=127.0.0.1 HP_STATE_DIR=%s/hstate sbatch --parsable --wait "
                   "--ntasks=2 --output=%s/hpd-%%j.log %s/deploy/slurm/hpd.sbatch %s/h.pb 2>&1",
                   g_dir, hp_th_binary_dir(), hp_th_binary_dir(), hp_th_binary_dir(), g_dir, g_dir,
                   hp_th_source_dir(), g_dir);
    cr_expect_eq(code, 0, "sbatch --wait hpd.sbatch: %s", out);
    char *jobid = strdup(out);
    jobid[strcspn(jobid, "\n;")] = 0;
    char path[600];
    snprintf(path, sizeof path, "%s/hpd-%s.log", g_dir, jobid);
    char *text = hp_th_slurp_or_empty(path);
    cr_expect(strstr(text, "SUCCEEDED"), "hpd.sbatch's output: %s", text);
    free(text);
    snprintf(path, sizeof path, "%s/hstate/hpd.log", g_dir);
    text = hp_th_slurp_or_empty(path);
    char want[80];
    snprintf(want, sizeof want, "RUNNING (srun in allocation %s)", jobid);
    cr_expect(strstr(text, want), "no '%s' in hpd's log: %s", want, text);
    free(text);
    /* One Slurm job only: the ranks ran as a step of the allocation, not as a new job. */
    char *q = sh(&code, "squeue -h -t all -o %%i | wc -l");
    cr_expect_eq(atoi(q), 1, "Slurm jobs: %s", q);
    free(q);
    free(jobid);
    free(out);
}

/* sbatch refusing the job (an unknown partition) is the attempt's failure, with sbatch's own
 * words. */
Test(slurm, sbatch_refusal_fails_the_job_with_its_message) {
    NEED_SLURM();
    cr_assert_eq(hp_th_hpd_stop(&g_h), 0);
    const char *args[] = {
        "--http",          "off", "--launcher", "slurm", "--slurm-partition", "nope",
        "--slurm-poll-ms", "200", NULL};
    start_hpd_with(args);
    new_job("p.pb", 3, "");
    char *id = submit("p.pb");
    char *st = wait_state(id, "FAILED", 30);
    cr_expect_str_eq(st, "FAILED");
    free(st);
    run r = hpctl("status %s --json", id);
    cr_expect(strstr(r.out, "sbatch failed: sbatch: error:") && strstr(r.out, "nope"),
              "the error names sbatch's complaint: %s", r.out);
    hp_th_run_free(&r);
    free(id);
}

/* Time in the queue does not count against launch-timeout-s; a node failure under a running
 * job (the node set DOWN) is a restart from the last checkpoint once the node is back. */
Test(slurm, queue_wait_is_not_late_and_node_failure_restarts) {
    NEED_SLURM();
    cr_assert_eq(hp_th_hpd_stop(&g_h), 0);
    /* the launch timeout (from RUNNING to every rank's hello) must hold a worker's start on a
     * loaded machine; the job then waits in the queue for longer than it */
    const char *args[] = {
        "--http",          "off", "--launcher", "slurm", "--launch-timeout-s", "6",
        "--slurm-poll-ms", "200", NULL};
    start_hpd_with(args);
    int code;
    free(sh(&code, "scontrol update nodename=localhost state=drain reason=hp-test"));
    cr_assert_eq(code, 0, "drain");
    /* long enough never to finish by itself: it is cancelled once the restart runs */
    new_job("n.pb", 1000000, "--checkpoint-interval 25 --max-restarts 2");
    char *id = submit("n.pb");
    char *ls = NULL;
    for (double end = mono_s() + 30; mono_s() < end; usleep(100000)) {
        free(ls);
        ls = field(id, "launch_state");
        if (!strncmp(ls, "PENDING", 7)) break;
    }
    cr_assert(!strncmp(ls, "PENDING", 7), "launch_state '%s', not PENDING", ls);
    free(ls);
    /* pending for 8 s, past the 6 s launch timeout: the job stays LAUNCHING all along */
    for (double end = mono_s() + 8; mono_s() < end; usleep(200000)) {
        char *st = field(id, "state");
        ls = field(id, "launch_state");
        bool ok = !strcmp(st, "LAUNCHING") && !strncmp(ls, "PENDING", 7);
        cr_assert(ok, "a job waiting in Slurm's queue: state %s, launch_state '%s'%s", st, ls,
                  diag(id));
        free(st);
        free(ls);
    }
    free(sh(&code, "scontrol update nodename=localhost state=resume"));
    long at = wait_step(id, 30, 60);
    if (at < 30) cr_assert_fail("no progress after the node came back (step %ld)%s", at, diag(id));
    char *ref = field(id, "launch_ref");
    free(sh(&code, "scontrol update nodename=localhost state=down reason=hp-node-fail"));
    cr_assert_eq(code, 0, "down");
    /* the Slurm job ends NODE_FAIL; hpd restarts the job, whose new Slurm job runs once the
     * node is back */
    char *ref2 = NULL;
    for (double end = mono_s() + 30; mono_s() < end;) {
        free(ref2);
        ref2 = field(id, "launch_ref");
        if (ref2[0] && strcmp(ref2, ref) != 0) break;
        usleep(100000);
    }
    cr_expect(strcmp(ref2, ref) != 0, "no new Slurm job after the node failure");
    free(sh(&code, "scontrol update nodename=localhost state=resume 2>/dev/null"));
    char *st = wait_state(id, "RUNNING", 60);
    if (strcmp(st, "RUNNING") != 0) cr_expect_fail("the restart did not run (%s)%s", st, diag(id));
    free(st);
    json_t *j = status(id);
    int restarts = (int)json_integer_value(json_object_get(j, "restarts"));
    json_decref(j);
    char *log = hp_th_slurp(g_log);
    char want[160];
    snprintf(want, sizeof want, "why=\"slurm job %s: NODE_FAIL", ref);
    bool lost = strstr(log, want) != NULL;
    free(log);
    if (!lost || restarts < 1) {
        char *lines = sh(NULL, "grep -E 'job=%s ' %s | cut -c1-300", id, g_log);
        cr_expect_fail("NODE_FAIL seen: %d, restarts %d; hpd's log:\n%s", lost, restarts, lines);
        free(lines);
    }
    run r = hpctl("cancel %s", id);
    cr_expect_eq(r.code, 0, "cancel: %s", r.err);
    hp_th_run_free(&r);
    cr_expect(wait_gone(ref2, 30), "Slurm job %s still runs after the cancel", ref2);
    free(ref2);
    free(ref);
    free(id);
}

/* A job whose Slurm record is gone while hpd was down (as after MinJobAge, or a controller that
 * lost its state) and whose ranks left no exit files: squeue does not list it, sacct cannot say
 * how it ended (this cluster has no accounting), so the attempt is lost, logged with sacct's own
 * words, and restarted from the checkpoint. */
Test(slurm, job_gone_from_slurm_while_hpd_was_down_is_lost_and_restarted) {
    NEED_SLURM();
    /* ~15 s at 100 steps/s: 200 steps could end between seeing step 30 and the kill (seen in
     * an ASan CI run: SUCCEEDED, nothing lost) */
    new_job("g.pb", 1500, "--checkpoint-interval 25 --max-restarts 2");
    char *id = submit("g.pb");
    long at = wait_step(id, 30, 60);
    cr_assert_geq(at, 30, "no progress");
    char *before = field(id, "state");
    cr_assert_str_eq(before, "RUNNING", "the job ended before hpd was killed (step %ld)", at);
    free(before);
    char *ref = field(id, "launch_ref");
    cr_assert(ref[0]);
    kill(g_h.pid, SIGKILL);
    waitpid(g_h.pid, NULL, 0);
    g_h.pid = -1;
    /* the controller restarts with an empty state: job REF is unknown to squeue and sacct; the
     * exit files go too, as when the node died before the wrappers could write them */
    int code;
    free(sh(&code, "%s/tests/daemon/slurm_cluster.sh stop %s", hp_th_source_dir(), g_slurm));
    free(sh(&code, "rm -rf %s/state/* %s/spool/* %s/state/jobs/%s/attempt-0/rank-*.exit", g_slurm,
            g_slurm, g_dir, id));
    char *out = sh(&code, "%s/tests/daemon/slurm_cluster.sh start %s %d 2>&1", hp_th_source_dir(),
                   g_slurm, g_base);
    cr_assert_eq(code, 0, "the Slurm cluster did not restart: %s", out);
    free(out);
    start_hpd();
    char *st = wait_state(id, "SUCCEEDED", 150);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    char *log = hp_th_slurp(g_log);
    char want[200];
    snprintf(want, sizeof want, "event=slurm_sacct_unavailable job=%s attempt=0 ref=%s why=\"sacct",
             id, ref);
    char *line = strstr(log, want);
    cr_expect(line, "no '%s' in hpd's log", want);
    cr_expect(strstr(log, "why=\"slurm job ") && strstr(log, "left squeue before hpd saw its end"),
              "the attempt was not lost for it");
    if (line) {
        line[strcspn(line, "\n")] = 0; /* the rest of the log is gone from here on */
        cr_expect(strstr(line, "accounting"), "the line does not say why: %s", line);
    }
    free(log);
    json_t *j = status(id);
    cr_expect_geq(json_integer_value(json_object_get(j, "restarts")), 1);
    json_decref(j);
    free(ref);
    free(id);
}

/* hpd inside an allocation (hpd.sbatch, srun mode): rank 1 SIGKILLed is reported as rank 1's
 * own 137 (not srun's aggregate status), the job goes RESTARTING and resumes to SUCCEEDED in a
 * new step of the same allocation. */
Test(slurm, srun_mode_killed_rank_is_its_own_failure_and_restarts) {
    NEED_SLURM();
    new_job("s.pb", 1500, "--checkpoint-interval 25 --max-restarts 2"); /* ~15 s at 100 steps/s */
    int code;
    char *alloc =
        sh(&code,
           "cd %s && HPD=%s/daemon/hpd HPCTL=%s/client/hpctl HP_WORKER=%s/worker/hp-worker "
           "HP_ADVERTISE=127.0.0.1 HP_STATE_DIR=%s/sstate sbatch --parsable --ntasks=2 "
           "--output=%s/hpd-s.log %s/deploy/slurm/hpd.sbatch %s/s.pb 2>&1",
           g_dir, hp_th_binary_dir(), hp_th_binary_dir(), hp_th_binary_dir(), g_dir, g_dir,
           hp_th_source_dir(), g_dir);
    cr_assert_eq(code, 0, "sbatch hpd.sbatch: %s", alloc);
    alloc[strcspn(alloc, "\n;")] = 0;
    /* the job hpd.sbatch submitted, and hpd's address */
    char id[64] = "";
    char path[600];
    snprintf(path, sizeof path, "%s/sstate/hpd.ready", g_dir);
    for (double end = mono_s() + 60; !id[0] && mono_s() < end;) {
        char *o = sh(&code, "ls %s/sstate/jobs 2>/dev/null | head -n 1", g_dir);
        snprintf(id, sizeof id, "%.*s", (int)strcspn(o, "\n"), o);
        free(o);
        if (!id[0]) usleep(100000);
    }
    cr_assert(id[0], "hpd.sbatch submitted no job");
    char *ready = hp_th_slurp_or_empty(path);
    char server[128] = "";
    char *g = strstr(ready, "grpc=");
    if (g) snprintf(server, sizeof server, "%.*s", (int)strcspn(g + 5, " \n"), g + 5);
    free(ready);
    cr_assert(server[0], "no grpc= in %s", path);
    char old_server[128], old_state[300];
    snprintf(old_server, sizeof old_server, "%s", getenv("HP_SERVER"));
    snprintf(old_state, sizeof old_state, "%s", getenv("HP_STATE_DIR"));
    setenv("HP_SERVER", server, 1);
    snprintf(path, sizeof path, "%s/sstate", g_dir);
    setenv("HP_STATE_DIR", path, 1);
    long at = wait_step(id, 30, 60);
    cr_assert_geq(at, 30, "no progress");
    pid_t pid = worker_pid(id, 1);
    cr_assert(pid > 0, "no hp-worker of %s rank 1", id);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    setenv("HP_SERVER", old_server, 1);
    setenv("HP_STATE_DIR", old_state, 1);
    /* hpd.sbatch (and its hpd) ends once the job SUCCEEDED: watch the allocation, not hpd */
    bool ended = false;
    for (double end = mono_s() + 150; !ended && mono_s() < end;) {
        char *q = sh(&code, "squeue -h -t all -j %s -o %%T", alloc);
        ended = !strncmp(q, "COMPLETED", 9) || !strncmp(q, "FAILED", 6);
        free(q);
        if (!ended) usleep(100000);
    }
    cr_expect(ended, "allocation %s did not end", alloc);
    snprintf(path, sizeof path, "%s/hpd-s.log", g_dir);
    char *text = hp_th_slurp_or_empty(path);
    char done[96];
    snprintf(done, sizeof done, "%s SUCCEEDED", id);
    cr_expect(strstr(text, done), "hpd.sbatch's output: %s", text);
    free(text);
    snprintf(path, sizeof path, "%s/sstate/hpd.log", g_dir);
    char *log = hp_th_slurp_or_empty(path);
    char want[200];
    snprintf(want, sizeof want, "event=worker_exit job=%s attempt=0 rank=1 status=137", id);
    cr_expect(strstr(log, want), "no '%s' in hpd's log:\n%s", want, log);
    snprintf(want, sizeof want, "job=%s from=RUNNING to=RESTARTING", id);
    cr_expect(strstr(log, want), "no '%s' in hpd's log", want);
    /* rank 0 ends with its own status: Slurm ends the step once a task dies of a signal
     * (SIGKILLing rank 0's wrapper too), so that is "unknown" (-1), or what rank 0 exited with
     * first (1 when its collective saw the peer die); never srun's aggregate 137 */
    snprintf(want, sizeof want, "event=worker_exit job=%s attempt=0 rank=0 status=", id);
    char *r0 = strstr(log, want);
    cr_expect(r0, "no exit of rank 0 in hpd's log");
    if (r0) {
        int s0 = atoi(r0 + strlen(want));
        cr_expect(s0 != 137, "rank 0 was given srun's status %d", s0);
    }
    snprintf(want, sizeof want, "event=launch_state job=%s attempt=1 state=RUNNING (srun", id);
    cr_expect(strstr(log, want), "no '%s' in hpd's log", want);
    free(log);
    free(alloc);
}

/* ---- the sacct parser, on recorded outputs (no cluster needed) ----------------------------- */
static hp_status parse(const char *text, const char *ref, hpd__sacct_job *a, hp_err *e) {
    return hpd__slurm_parse_sacct(text, strlen(text), ref, a, e);
}

Test(slurm_parse, completed_job_with_its_steps) {
    hpd__sacct_job a;
    hp_err e = {0};
    cr_assert_eq(parse("1234|COMPLETED|0:0\n1234.batch|COMPLETED|0:0\n"
                       "1234.extern|COMPLETED|0:0\n1234.0|COMPLETED|0:0\n",
                       "1234", &a, &e),
                 HP_OK, "%s", e.msg);
    cr_expect_str_eq(a.state, "COMPLETED");
    cr_expect_eq(a.exit_code, 0);
    cr_expect_eq(a.steps, 1, "batch and extern are not srun steps");
    cr_expect_str_eq(a.step_state, "COMPLETED");
    cr_expect_eq(a.steps_bad, 0);
}

Test(slurm_parse, failures_cancels_and_lost_states) {
    hpd__sacct_job a;
    hp_err e = {0};
    /* a rank SIGKILLed: the step says 0:9 or 137:0, never which rank */
    cr_assert_eq(
        parse("77|FAILED|137:0\r\n77.batch|FAILED|137:0\r\n77.0|FAILED|0:9\r\n", "77", &a, &e),
        HP_OK, "%s", e.msg);
    cr_expect_str_eq(a.state, "FAILED");
    cr_expect_eq(a.exit_code, 137);
    cr_expect_eq(a.step_exit_signal, 9);
    cr_expect_eq(a.steps_bad, 1);
    cr_assert_eq(parse("99|CANCELLED by 0|0:15\n99.0|CANCELLED by 0|0:15\n", "99", &a, &e), HP_OK);
    cr_expect_str_eq(a.state, "CANCELLED", "the first word of 'CANCELLED by 0'");
    cr_expect_eq(a.exit_signal, 15);
    const char *lost[] = {"NODE_FAIL", "PREEMPTED", "TIMEOUT", "OUT_OF_MEMORY"};
    for (size_t i = 0; i < sizeof lost / sizeof *lost; i++) {
        char text[128];
        snprintf(text, sizeof text, "5|%s|0:0\n5.0|CANCELLED|0:9\n", lost[i]);
        cr_assert_eq(parse(text, "5", &a, &e), HP_OK, "%s: %s", lost[i], e.msg);
        cr_expect_str_eq(a.state, lost[i]);
        cr_expect_eq(a.steps_bad, 1);
    }
    /* another job's lines (12345 is not 1234), then 1234 itself */
    cr_assert_eq(parse("12345|FAILED|1:0\n1234|PENDING|0:0\n", "1234", &a, &e), HP_OK);
    cr_expect_str_eq(a.state, "PENDING");
    cr_expect_eq(a.steps, 0);
}

Test(slurm_parse, no_record_and_garbage_are_clear_errors) {
    hpd__sacct_job a;
    hp_err e = {0};
    cr_expect_eq(parse("", "1234", &a, &e), HP_NOT_FOUND);
    cr_expect(strstr(e.msg, "no record of job 1234"), "%s", e.msg);
    cr_expect_eq(parse("12345|COMPLETED|0:0\n", "1234", &a, &e), HP_NOT_FOUND);
    const char *bad[] = {
        "sacct: error: Slurm accounting storage is disabled\n",
        "1234|COMPLETED\n",
        "1234|COMPLETED|x:0\n",
        "1234|completed|0:0\n",
        "1234|COMPLETED|0:0|extra\n",
        "|COMPLETED|0:0\n",
        "1234||0:0\n",
        "1234|COMPLETED|999:0\n",
        "1234|COMPLETED|:\n",
        "1234|COMPLETED|-1:0\n",
        "1234|\"COMPLETED\"|0:0\n",
        "1234|COMPLETED|0:0\n\x01\x02|\xff|\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = 0;
        cr_expect_eq(parse(bad[i], "1234", &a, &e), HP_INVALID, "accepted: %s", bad[i]);
        cr_expect(strstr(e.msg, "not JobID|State|CODE:SIGNAL"), "%s", e.msg);
        cr_expect(!strchr(e.msg, '"') && !strchr(e.msg, '\n'), "unquoted: %s", e.msg);
    }
    /* NUL bytes and a line far over any buffer: bounded by len, an error, no crash */
    char big[9000];
    memset(big, 'A', sizeof big);
    cr_expect_eq(hpd__slurm_parse_sacct(big, sizeof big, "1234", &a, &e), HP_INVALID);
    cr_expect_lt(strlen(e.msg), 200u);
    const char nul[] = "1234|COMP\0LETED|0:0\n";
    cr_expect_eq(hpd__slurm_parse_sacct(nul, sizeof nul - 1, "1234", &a, &e), HP_INVALID);
    cr_expect_eq(parse("1234|COMPLETED|0:0\n", "12a", &a, &e), HP_INVALID);
    cr_expect_eq(parse("1234|COMPLETED|0:0\n", "", &a, &e), HP_INVALID);
}
