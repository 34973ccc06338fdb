/* tests/daemon/test_checkpoint_now.c — checkpoint-now end to end inside one process: the
 * daemon's core on a private loop with the real local launcher and the real hp-worker, a
 * two-rank job with checkpoint_interval 0. hpd_checkpoint sends CheckpointNow; both ranks
 * write the same step (a normal, complete checkpoint) and report CheckpointDone; after the
 * ranks are killed the job restarts and resumes from that step. Also: hpd_checkpoint's errors
 * (unknown id, a job that is not RUNNING). */
#include "daemon/core.h"
#include "daemon/jobsm.h"

#include "hp/checkpoint.h"
#include "hp/models.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

static char dir[256];
static uv_loop_t loop;
static hpd *d;
static char ids[2][HPD_ID_MAX];

static uint8_t *job_bytes(int world, int64_t steps, size_t *len) {
    hp_model_spec s;
    hp_err e = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &e), HP_OK, "%s", e.msg);
    s.dim = 32, s.n_layers = 1, s.n_heads = 2, s.n_kv_heads = 1, s.ffn_hidden = 48;
    s.vocab = 64, s.batch = world, s.seq = 8;
    hp_job *job = hp_job_new();
    cr_assert(job);
    snprintf(job->name, sizeof job->name, "ckpt-now-test");
    job->model = s;
    cr_assert_eq(hp_model_build_joint(&s, &job->graph, &e), HP_OK, "%s", e.msg);
    job->train.steps = steps;
    job->train.local_batch = 1;
    job->train.seq = s.seq;
    job->train.checkpoint_interval = 0; /* only asked-for checkpoints */
    job->train.log_interval = 1;        /* the daemon's step follows rank 0's metrics */
    job->resources.world_size = world;
    if (world > 1) { /* FSDP over every parameter, one data-parallel mesh dim */
        job->plan.mesh[0].size = world;
        const char *marks[] = {"layers.*", "tok_embeddings.*", "output.*", "norm.*"};
        for (int i = 0; i < 4; i++)
            cr_assert_eq(hp_job_add_fsdp_pattern(job, marks[i], &e), HP_OK, "%s", e.msg);
    }
    job->resources.max_restarts = 1;
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    uint8_t *b;
    cr_assert_eq(hp_job_pack(job, &b, len, &e), HP_OK, "%s", e.msg);
    hp_job_free(job);
    return b;
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/hp-test-ckpt-now-XXXXXX");
    cr_assert(mkdtemp(dir));
    char state[300], worker[600];
    snprintf(state, sizeof state, "%s/state", dir);
    const char *b = getenv("HP_BINARY_DIR");
    snprintf(worker, sizeof worker, "%s/worker/hp-worker", b && *b ? b : HP_BINARY_DIR);
    cr_assert_eq(access(worker, X_OK), 0, "no %s", worker);
    uv_loop_init(&loop);
    hpd_config cfg = {.state_dir = state, .slots = 2, .worker_path = worker, .heartbeat_ms = 200};
    hp_err e = {0};
    cr_assert_eq(hpd_new(&loop, &cfg, &d, &e), HP_OK, "%s", e.msg);
    int wport;
    cr_assert_eq(hp__workers_start(d, "127.0.0.1:0", &wport, &e), HP_OK, "%s", e.msg);
    snprintf(d->worker_addr, sizeof d->worker_addr, "127.0.0.1:%d", wport);
    ids[0][0] = ids[1][0] = 0;
}

static void teardown(void) {
    hpd_job_view v;
    for (int i = 0; i < 2; i++)
        if (ids[i][0]) hpd_cancel(d, ids[i], "test over", &v, NULL);
    hpd_shutdown(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    hpd_free(d);
    cr_expect_eq(uv_loop_close(&loop), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(checkpoint_now, .init = setup, .fini = teardown, .timeout = 240);

/* Runs the loop until cond holds (true) or ms pass (false). */
static bool pump_until(bool (*cond)(hpd_job *), hpd_job *j, int ms) {
    for (int i = 0; i < ms / 2; i++) {
        if (cond(j)) return true;
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    return cond(j);
}

static bool running_a_few_steps(hpd_job *j) {
    return j->v.state == HP__V1__JOB_STATE__JOB_STATE_RUNNING && j->v.step >= 3;
}
static bool ckpt_done(hpd_job *j) {
    return j->ckpt_step > 0;
}
static int64_t g_first;
static bool ckpt_newer(hpd_job *j) {
    return j->ckpt_step > g_first;
}
static bool restarted(hpd_job *j) {
    return j->v.restarts >= 1 && j->v.state == HP__V1__JOB_STATE__JOB_STATE_RUNNING;
}
static char g_log[PATH_MAX + 64];
static char g_want[64];
static bool log_says(hpd_job *j) {
    (void)j;
    FILE *f = fopen(g_log, "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, g_want) != NULL;
    fclose(f);
    return found;
}

static hpd_job *submit(int slot, int world, int64_t steps) {
    size_t len;
    uint8_t *b = job_bytes(world, steps, &len);
    hpd_job_view v;
    hp_err e = {0};
    cr_assert_eq(hpd_submit(d, b, len, NULL, &v, &e), HP_OK, "%s", e.msg);
    hp_free(b);
    snprintf(ids[slot], sizeof ids[slot], "%s", v.id);
    hpd_job *j = hp__job_find(d, v.id);
    cr_assert(j);
    return j;
}

Test(checkpoint_now, ranks_checkpoint_one_step_and_a_restart_resumes_from_it) {
    hpd_job *j = submit(0, 2, 1000000);
    cr_assert(pump_until(running_a_few_steps, j, 60000), "job is %s at step %lld",
              hpd_sm_state_str(j->v.state), (long long)j->v.step);
    cr_expect_eq(j->ckpt_step, 0, "checkpoint_interval 0 wrote a checkpoint");

    hpd_job_view v;
    hp_err e = {0};
    int64_t asked_at = j->v.step;
    cr_assert_eq(hpd_checkpoint(d, j->v.id, &v, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_RUNNING);
    cr_assert(pump_until(ckpt_done, j, 30000), "no CheckpointDone from every rank");
    cr_expect_geq(j->ckpt_step, asked_at, "checkpointed step %lld before the ask (step %lld)",
                  (long long)j->ckpt_step, (long long)asked_at);
    cr_expect_eq(j->ranks[0].ckpt_step, j->ranks[1].ckpt_step, "ranks checkpointed %lld and %lld",
                 (long long)j->ranks[0].ckpt_step, (long long)j->ranks[1].ckpt_step);
    cr_expect_eq(j->v.state, HP__V1__JOB_STATE__JOB_STATE_RUNNING, "the job goes on training");

    /* a normal, complete checkpoint: index.json is written last, hp_ckpt_latest finds it */
    char root[HPD_STORE_PATH_MAX + 32], idx[HPD_STORE_PATH_MAX + 64];
    snprintf(root, sizeof root, "%s/checkpoints", j->run_dir);
    snprintf(idx, sizeof idx, "%s/step-%08lld/index.json", root, (long long)j->ckpt_step);
    cr_expect_eq(access(idx, R_OK), 0, "no %s", idx);
    int64_t latest = 0;
    cr_assert_eq(hp_ckpt_latest(root, &latest, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(latest, j->ckpt_step);

    /* asking again checkpoints a later step */
    g_first = j->ckpt_step;
    cr_assert_eq(hpd_checkpoint(d, j->v.id, &v, &e), HP_OK, "%s", e.msg);
    cr_assert(pump_until(ckpt_newer, j, 30000), "the second CheckpointNow wrote nothing");
    int64_t resume = j->ckpt_step;

    /* both ranks die: the job restarts and resumes from the asked-for checkpoint */
    d->launcher->vt->stop(d->launcher, j->v.id, j->attempt, SIGKILL);
    cr_assert(pump_until(restarted, j, 60000), "job is %s (restarts %d)",
              hpd_sm_state_str(j->v.state), j->v.restarts);
    snprintf(g_log, sizeof g_log, "%s/jobs/%s/rank-0.log", d->state_dir, j->v.id);
    snprintf(g_want, sizeof g_want, "resumed from step %lld", (long long)resume);
    cr_expect(pump_until(log_says, j, 60000), "%s does not say '%s'", g_log, g_want);
}

Test(checkpoint_now, errors) {
    hpd_job_view v;
    hp_err e = {0};
    cr_expect_eq(hpd_checkpoint(d, "no-such-job", &v, &e), HP_NOT_FOUND);
    cr_expect(strstr(e.msg, "no-such-job"), "%s", e.msg);
    /* a 2-rank job fills the slots; the next one waits in the queue */
    hpd_job *a = submit(0, 2, 1000000), *q = submit(1, 1, 10);
    cr_expect_eq(q->v.state, HP__V1__JOB_STATE__JOB_STATE_QUEUED);
    cr_expect_eq(hpd_checkpoint(d, q->v.id, &v, &e), HP_STATE);
    cr_expect(strstr(e.msg, "QUEUED"), "%s", e.msg);
    (void)a;
}
