/* tests/daemon/test_hpctl_remote.c — the real hpctl against the real hpd on 127.0.0.1 (port 0,
 * a temp state dir; the token comes from STATE_DIR/token through $HP_STATE_DIR): submit
 * --watch to SUCCEEDED with the loss falling, list and paging, cancel of a long job, errors
 * (unknown id, wrong token, usage), a cuda job refused at submit where there is no CUDA. Each test
 * starts its own daemon and stops it with SIGTERM, expecting exit 0. */
#include "hp/device.h"
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"
#include "tests/util/run_compare.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <errno.h>
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

static char g_dir[256];   /* temp dir: state/, job files, captured output */
static char g_addr[64];   /* 127.0.0.1:PORT */
static const char *g_bin; /* the build dir */

/* `hpctl ARGS` in g_dir, output captured (tests/util/cli_harness.h). */
#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)
#define run_free   hp_th_run_free

static void new_job(const char *name, int steps) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d -o %s/%s",
                  steps, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    run_free(&r);
}

static hp_th_hpd g_h = {.pid = -1};
/* --gpus 1: a cuda job gets past the GPU count to the build's own refusal (no CUDA). */
static const char *const k_hpd_args[] = {"--http", "127.0.0.1:0", "--slots", "2",
                                         "--gpus", "1",           NULL};

static void start_hpd(void) {
    const char *b = getenv("HP_BINARY_DIR");
    g_bin = b && *b ? b : HP_BINARY_DIR;
    snprintf(g_dir, sizeof g_dir, "/tmp/hp-hpctl-remote-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    cr_assert_eq(mkdir(state, 0700), 0);
    hp_th_hpd_start(&g_h, state, NULL, k_hpd_args);
    snprintf(g_addr, sizeof g_addr, "%s", g_h.grpc);
    setenv("HP_SERVER", g_addr, 1);
    setenv("HP_STATE_DIR", state, 1);
    unsetenv("HP_TOKEN");
}

static void stop_hpd(void) {
    if (g_h.pid > 0) {
        int code = hp_th_hpd_stop(&g_h);
        cr_expect_eq(code, 0, "hpd exit status %d on SIGTERM (-1: killed after 30 s)", code);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(hpctl_remote, .init = start_hpd, .fini = stop_hpd, .timeout = 600);

static json_t *parse_json(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, s);
    return j;
}

static char *submit(const char *job) {
    return hp_th_hpctl_submit(g_dir, job);
}

static char *job_state(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_t *j = parse_json(r.out);
    char *s = strdup(json_string_value(json_object_get(j, "state")));
    json_decref(j);
    run_free(&r);
    return s;
}

Test(hpctl_remote, submit_watch_succeeds_with_falling_loss) {
    new_job("job.pb", 10);
    run r = hpctl("submit %s/job.pb --watch", g_dir);
    cr_assert_eq(r.code, 0, "submit --watch exit %d\nstdout: %s\nstderr: %s", r.code, r.out, r.err);
    cr_expect(strstr(r.out, "SUCCEEDED"), "no SUCCEEDED in: %s", r.out);
    /* Not a TTY: plain lines "step S/T loss L tps ... mfu ...% eta ...". */
    double loss[1024];
    int steps = 0;
    for (char *l = r.out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        char *p = strstr(l, " loss ");
        if (!strncmp(l, "step ", 5) && p && steps < 1024 &&
            sscanf(p, " loss %lf", &loss[steps]) == 1)
            steps++;
    }
    cr_assert_geq(steps, 6, "fewer than 6 metric lines: %s", r.out);
    /* Noisy at this size: compare the means of the first and the last three steps. */
    double first = (loss[0] + loss[1] + loss[2]) / 3,
           last = (loss[steps - 1] + loss[steps - 2] + loss[steps - 3]) / 3;
    cr_expect_lt(last, first, "loss did not fall: first %g last %g\n%s", first, last, r.out);
    cr_expect_eq(strchr(r.out, '\r'), NULL, "\\r in non-TTY output");
    char *id = strdup(r.out);
    id[strcspn(id, "\n")] = 0;
    run_free(&r);
    char *st = job_state(id);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    /* Watching a finished job replays and exits 0; --json gives one object per line. */
    r = hpctl("watch %s --json", id);
    cr_expect_eq(r.code, 0, "watch of a finished job: %s", r.err);
    int n_state = 0, n_lines = 0;
    for (char *save = NULL, *l = strtok_r(r.out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *j = parse_json(l);
        const char *st = json_string_value(json_object_get(j, "state"));
        if (st && !strcmp(st, "SUCCEEDED")) n_state++;
        n_lines++;
        json_decref(j);
    }
    cr_expect_eq(n_state, 1, "want one SUCCEEDED state event");
    cr_expect_geq(n_lines, 11, "want the state and 10 replayed metrics, got %d lines", n_lines);
    run_free(&r);
    /* The rank's log, read from STATE_DIR/jobs/ID/rank-0.log. */
    r = hpctl("logs %s --rank 0", id);
    cr_expect_eq(r.code, 0, "logs: %s", r.err);
    cr_expect(strlen(r.out) > 0, "empty log");
    run_free(&r);
    r = hpctl("logs %s --rank 0 --follow --json", id); /* a final job: prints and ends */
    cr_expect_eq(r.code, 0, "logs --follow: %s", r.err);
    cr_expect(!strncmp(r.out, "{\"rank\":0,\"text\":", 17), "logs --json: %s", r.out);
    run_free(&r);
    r = hpctl("logs %s --rank 7", id);
    cr_expect_eq(r.code, 1, "logs of a rank that does not exist: exit %d", r.code);
    run_free(&r);
    free(id);
}

Test(hpctl_remote, list_and_paging) {
    new_job("job.pb", 3);
    char *ids[3];
    for (int i = 0; i < 3; i++) ids[i] = submit("job.pb");
    run r = hpctl("list --json --page-size 2");
    cr_assert_eq(r.code, 0, "list: %s", r.err);
    json_t *p1 = parse_json(r.out);
    run_free(&r);
    json_t *jobs1 = json_object_get(p1, "jobs");
    const char *tok = json_string_value(json_object_get(p1, "next_page_token"));
    cr_assert_eq(json_array_size(jobs1), 2);
    cr_assert(tok && *tok, "no next_page_token after a full page");
    r = hpctl("list --json --page-size 2 --page-token %s", tok);
    cr_assert_eq(r.code, 0, "list page 2: %s", r.err);
    json_t *p2 = parse_json(r.out);
    run_free(&r);
    json_t *jobs2 = json_object_get(p2, "jobs");
    cr_assert_eq(json_array_size(jobs2), 1);
    cr_expect_str_eq(json_string_value(json_object_get(p2, "next_page_token")), "");
    /* Newest first, each exactly once. */
    const char *seen[3] = {
        json_string_value(json_object_get(json_array_get(jobs1, 0), "id")),
        json_string_value(json_object_get(json_array_get(jobs1, 1), "id")),
        json_string_value(json_object_get(json_array_get(jobs2, 0), "id")),
    };
    for (int i = 0; i < 3; i++) cr_expect_str_eq(seen[i], ids[2 - i]);
    json_decref(p1);
    json_decref(p2);
    /* Plain table and the state filter. */
    r = hpctl("list");
    cr_expect_eq(r.code, 0);
    for (int i = 0; i < 3; i++) cr_expect(strstr(r.out, ids[i]), "%s not in: %s", ids[i], r.out);
    run_free(&r);
    r = hpctl("list --state failed --json");
    cr_expect_eq(r.code, 0);
    json_t *f = parse_json(r.out);
    cr_expect_eq(json_array_size(json_object_get(f, "jobs")), 0);
    json_decref(f);
    run_free(&r);
    r = hpctl("list --state sleeping");
    cr_expect_eq(r.code, 2, "bad --state: exit %d", r.code);
    run_free(&r);
    for (int i = 0; i < 3; i++) free(ids[i]);
}

Test(hpctl_remote, cancel_a_long_job) {
    new_job("long.pb", 100000);
    char *id = submit("long.pb");
    char *st = NULL;
    for (int i = 0; i < 1200; i++) { /* up to 120 s to start running */
        free(st);
        st = job_state(id);
        if (!strcmp(st, "RUNNING") || !strcmp(st, "FAILED")) break;
        usleep(100000);
    }
    cr_assert_str_eq(st, "RUNNING");
    free(st);
    run r = hpctl("cancel %s", id);
    cr_assert_eq(r.code, 0, "cancel: %s", r.err);
    run_free(&r);
    r = hpctl("watch %s", id);
    cr_expect_eq(r.code, 1, "watch of a cancelled job exits 1, got %d: %s", r.code, r.err);
    cr_expect(strstr(r.out, "CANCELLED"), "no CANCELLED in: %s", r.out);
    run_free(&r);
    st = job_state(id);
    cr_expect_str_eq(st, "CANCELLED");
    free(st);
    free(id);
}

Test(hpctl_remote, errors) {
    run r = hpctl("status j-does-not-exist");
    cr_expect_eq(r.code, 1);
    cr_expect(!strncmp(r.err, "hpctl: status: NOT_FOUND: ", strlen("hpctl: status: NOT_FOUND: ")),
              "stderr: %s", r.err);
    cr_expect(strchr(r.err, '\n') && strchr(r.err, '\n')[1] == 0, "not one line: %s", r.err);
    run_free(&r);
    r = hpctl("cancel j-does-not-exist");
    cr_expect_eq(r.code, 1);
    cr_expect(strstr(r.err, "NOT_FOUND"), "stderr: %s", r.err);
    run_free(&r);
    new_job("job.pb", 3);
    r = hpctl("submit %s/job.pb --token not-the-token", g_dir);
    cr_expect_eq(r.code, 1);
    cr_expect(strstr(r.err, "hpctl: submit: UNAUTHENTICATED"), "stderr: %s", r.err);
    run_free(&r);
    r = hpctl("status");
    cr_expect_eq(r.code, 2);
    run_free(&r);
    r = hpctl("list --page-size 0");
    cr_expect_eq(r.code, 2);
    run_free(&r);
    r = hpctl("status j-1 --server 127.0.0.1:1 --timeout 2");
    cr_expect_eq(r.code, 1);
    cr_expect(strstr(r.err, "UNAVAILABLE"), "stderr: %s", r.err);
    run_free(&r);
}

/* Common flags before the verb, as kubectl/docker/git take them, act as after it: a wrong
 * --token before submit is refused by hpd, the right server and token submit the job. */
Test(hpctl_remote, common_flags_before_the_verb) {
    new_job("job.pb", 2);
    run r = hpctl("--server %s --token not-the-token submit %s/job.pb", g_addr, g_dir);
    cr_expect_eq(r.code, 1);
    cr_expect(strstr(r.err, "hpctl: submit: UNAUTHENTICATED"), "stderr: %s", r.err);
    run_free(&r);
    r = hpctl("--server %s --json --timeout 30 submit %s/job.pb", g_addr, g_dir);
    cr_assert_eq(r.code, 0, "stderr: %s", r.err);
    json_t *j = parse_json(r.out);
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert(id && !strncmp(id, "j-", 2), "%s", r.out);
    run_free(&r);
    r = hpctl("--server %s status %s", g_addr, id);
    cr_expect_eq(r.code, 0, "stderr: %s", r.err);
    cr_expect(strstr(r.out, id), "%s", r.out);
    run_free(&r);
    json_decref(j);
}

/* `hpctl new ARGS` then `submit`: refused with the gRPC status `code` and one line holding
 * `want`, and no job created. */
static void expect_job_refused_at_submit(const char *args, const char *code, const char *want) {
    run r = hpctl("new %s -o %s/refused.pb", args, g_dir);
    cr_assert_eq(r.code, 0, "hpctl new %s: %s", args, r.err);
    run_free(&r);
    r = hpctl("submit %s/refused.pb", g_dir);
    cr_expect_eq(r.code, 1, "submit of a %s job: exit %d, out %s", args, r.code, r.out);
    char head[64];
    snprintf(head, sizeof head, "hpctl: submit: %s: ", code);
    cr_expect(strstr(r.err, head) && strstr(r.err, want), "stderr: %s", r.err);
    cr_expect(strchr(r.err, '\n') && strchr(r.err, '\n')[1] == 0, "not one line: %s", r.err);
    run_free(&r);
    r = hpctl("list --json");
    cr_assert_eq(r.code, 0, "list: %s", r.err);
    json_t *j = parse_json(r.out);
    cr_expect_eq(json_array_size(json_object_get(j, "jobs")), 0, "a job was created: %s", r.out);
    json_decref(j);
    run_free(&r);
}

/* The same for a tiny GQA Llama made with FLAGS. */
static void expect_refused_at_submit(const char *flags, const char *code, const char *want) {
    char args[1024];
    snprintf(args, sizeof args,
             "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
             "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps 2 %s",
             flags);
    expect_job_refused_at_submit(args, code, want);
}

/* A graph the data loader cannot feed (the mlp's data inputs are 'x' and 'y', not token data)
 * is refused at submit, not launched to fail at every rank's setup. */
Test(hpctl_remote, untrainable_job_refused_at_submit) {
    expect_job_refused_at_submit("--model mlp --steps 2", "UNIMPLEMENTED",
                                 "data input 'x': training reads token data into inputs named "
                                 "'tokens' and 'labels' only");
}

/* A cuda job where hpd's workers (this build's hp-worker) have no CUDA: refused at submit
 * with one line naming the cause, and no job is created. Unsupported here, not a bad request:
 * UNIMPLEMENTED (hp/status.def). */
Test(hpctl_remote, cuda_job_refused_at_submit) {
    if (hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK) {
        stop_hpd(); /* Criterion runs no .fini after a skip: hpd would outlive the test */
        cr_skip_test("this build has CUDA");
    }
    expect_refused_at_submit("--device cuda", "UNIMPLEMENTED",
                             "device cuda: this hp-worker was built without CUDA");
}

/* A job that compiles to HP_UNSUPPORTED (a plan hp cannot carry out yet) keeps its kind through
 * hpd: UNIMPLEMENTED, not INVALID_ARGUMENT. */
Test(hpctl_remote, unsupported_plan_is_unimplemented) {
    expect_refused_at_submit("--mesh tp=2 --tp-plan llama --fsdp 'layers.*'", "UNIMPLEMENTED",
                             "FSDP marks shard parameters over the mesh dim named dp");
}

/* The step of a job as the daemon reports it. */
static long job_step(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_t *j = parse_json(r.out);
    long step = (long)json_integer_value(json_object_get(j, "step"));
    json_decref(j);
    run_free(&r);
    return step;
}

static char *wait_final(const char *id) {
    for (int i = 0; i < 1200; i++) {
        char *st = job_state(id);
        if (!strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED") || !strcmp(st, "CANCELLED"))
            return st;
        free(st);
        usleep(100000);
    }
    cr_assert(0, "job %s did not finish", id);
    return NULL;
}

static char *read_weights(const char *id) {
    char path[600];
    snprintf(path, sizeof path, "%s/state/jobs/%s/run/model.safetensors", g_dir, id);
    return hp_th_slurp_or_empty(path);
}

/* A tensor-parallel job (torchtitan's Llama plan at tp=2) runs through hpd on two workers and
 * ends with the weights of the same job at world 1. */
Test(hpctl_remote, tensor_parallel_job_runs_like_world1) {
    static const char *const plans[2] = {"", "--mesh tp=2 --tp-plan llama"};
    char dirs[2][600];
    for (int k = 0; k < 2; k++) {
        run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                      "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps 4 %s -o %s/tp%d.pb",
                      plans[k], g_dir, k);
        cr_assert_eq(r.code, 0, "hpctl new %s: %s", plans[k], r.err);
        run_free(&r);
        char job[32];
        snprintf(job, sizeof job, "tp%d.pb", k);
        char *id = submit(job);
        char *st = wait_final(id);
        cr_assert_str_eq(st, "SUCCEEDED", "job %s (%s)", id, plans[k]);
        free(st);
        snprintf(dirs[k], sizeof dirs[k], "%s/state/jobs/%s/run", g_dir, id);
        free(id);
    }
    hp_th_expect_weights_close(dirs[0], dirs[1], 1e-5, 0, "tp=2 through hpd");
}

/* A worker killed with SIGKILL mid-run: the job goes RESTARTING, resumes from its last
 * checkpoint and SUCCEEDS with the final weights of an uninterrupted run, byte for byte. The
 * job is long (400 tiny steps) so that it is still running when the kill comes: on an idle
 * machine 40 steps ended between seeing step 8 and the pkill. */
Test(hpctl_remote, killed_worker_restarts_from_the_checkpoint) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 2 --seq 64 --steps 400 "
                  "--checkpoint-interval 5 --max-restarts 2 -o %s/r.pb",
                  g_dir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    run_free(&r);
    char *ref = submit("r.pb");
    char *st = wait_final(ref);
    cr_assert_str_eq(st, "SUCCEEDED");
    free(st);

    char *id = submit("r.pb");
    for (int i = 0; i < 3000 && job_step(id) < 8; i++) usleep(10000);
    cr_assert_geq(job_step(id), 8, "the job made no progress");
    char cmd[512];
    /* this hpd's worker only: other tests' daemons number their jobs the same way */
    snprintf(cmd, sizeof cmd, "pkill -KILL -f -- '[-]-coordinator %s [-]-job %s [-]-rank 0'",
             g_h.workers, id);
    cr_assert_eq(system(cmd), 0, "no worker of %s to kill", id);
    st = wait_final(id);
    cr_expect_str_eq(st, "SUCCEEDED");
    free(st);
    r = hpctl("status %s --json", id);
    json_t *j = parse_json(r.out);
    cr_expect_geq(json_integer_value(json_object_get(j, "restarts")), 1, "%s", r.out);
    json_decref(j);
    run_free(&r);
    char *a = read_weights(ref), *b = read_weights(id);
    cr_expect(strlen(a) > 0 && !strcmp(a, b) && !memcmp(a, b, strlen(a)),
              "final weights differ from the uninterrupted run's");
    free(a);
    free(b);
    free(id);
    free(ref);
}

/* hpd killed with SIGKILL and started again on the same state dir: every job is there with
 * its state; a finished job stays finished. */
Test(hpctl_remote, daemon_killed_and_restarted_keeps_every_job) {
    new_job("a.pb", 3);
    char *done = submit("a.pb");
    char *st = wait_final(done);
    cr_assert_str_eq(st, "SUCCEEDED");
    free(st);
    new_job("b.pb", 100000);
    char *running = submit("b.pb");
    for (int i = 0; i < 3000 && job_step(running) < 2; i++) usleep(10000);

    kill(g_h.pid, SIGKILL);
    waitpid(g_h.pid, NULL, 0);
    g_h.pid = -1;
    /* the orphaned workers lose their coordinator and stop on their own; restart hpd */
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    hp_th_hpd_start(&g_h, state, NULL, k_hpd_args);
    snprintf(g_addr, sizeof g_addr, "%s", g_h.grpc);
    setenv("HP_SERVER", g_addr, 1);
    st = job_state(done);
    cr_expect_str_eq(st, "SUCCEEDED", "a finished job after the restart");
    free(st);
    st = job_state(running);
    cr_expect(strcmp(st, "SUCCEEDED") && strcmp(st, "QUEUED"),
              "a running job after the restart is %s (restarting, running or failed with a "
              "reason, never lost)",
              st);
    free(st);
    run r = hpctl("cancel %s", running);
    run_free(&r);
    free(done);
    free(running);
}
