/* Evaluation (train.eval_interval, eval_steps, eval_data_path; hpctl new --eval-interval
 * --eval-steps --eval-data): the executor's forward pass gives the full step's loss bit for
 * bit while running only the instructions the loss needs (no backward op); the loss a run
 * reports after its last step is the reference evaluator's on the final weights and the first
 * eval_steps batches of the held-out data, in order; evaluating does not change training; FSDP
 * at world 2 evaluates what world 1 does; dropout is off while evaluating (a graph with dropout
 * p=0.5 evaluates as the same graph with p=0); under hpd the evaluations reach hpctl watch, the
 * JSON API and Prometheus; hpctl and hp-worker refuse what cannot work. */
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"
#include "tests/util/run_compare.h"
#include "tests/util/train_fixture.h"

#include "hp/data.h"
#include "hp/eval.h"
#include "hp/job.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/safetensors.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/executor.h"
#include "worker/train.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[256];

static void setup(void) {
    hp_th_tmpdir_make(tmp, sizeof tmp, "hp-eval");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmp);
}

TestSuite(evaluation, .init = setup, .fini = teardown, .timeout = 600);

static hp_model_spec tiny_spec(void) {
    return hp_th_tiny_spec(2);
}

/* A held-out llm.c shard of n tokens < vocab at tmp/NAME. */
static void write_shard(const char *name, int64_t n, int64_t vocab, char *path, size_t len) {
    snprintf(path, len, "%s/%s", tmp, name);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    uint32_t x = 12345;
    for (int64_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        tok[i] = (x >> 16) % (uint32_t)vocab;
    }
    hp_err e;
    cr_assert_eq(hp_data_write_shard(path, tok, n, 1, &e), HP_OK, "%s", e.msg);
    free(tok);
}

/* ---- the executor's forward pass ------------------------------------------------------------- */

static int n_run, n_backward;
static const hp_program *traced;

static void count(void *ctx, int32_t i, double start_s, double end_s) {
    (void)ctx, (void)start_s, (void)end_s;
    n_run++;
    const char *op = hp_op_get(traced->graph->nodes[traced->instrs[i].node].op)->name;
    if (strstr(op, "backward")) n_backward++;
}

static void fill_data(hp_exec *ex, const hp_program *p, const hp_model_spec *spec) {
    for (int i = 0; i < p->n_data; i++) {
        int64_t *d = hp_exec_ptr(ex, p->data[i].buffer);
        for (int64_t k = 0; k < spec->batch * spec->seq; k++) d[k] = (k * 37 + i) % spec->vocab;
    }
}

Test(evaluation, forward_pass_gives_the_step_loss_without_the_backward) {
    hp_model_spec spec = tiny_spec();
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    hp_program *p = NULL;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    hp_backend *be = NULL;
    cr_assert_eq(hp_cpu_backend_new(2, &be, &e), HP_OK, "%s", e.msg);
    hp_exec *ex = NULL;
    cr_assert_eq(hp_exec_new(p, be, &ex, &e), HP_OK, "%s", e.msg);
    unsigned s = 7;
    for (int i = 0; i < p->n_params; i++) {
        float *w = hp_exec_ptr(ex, p->params[i].buffer);
        for (int64_t k = 0; k < hp_type_numel(&p->params[i].global); k++) {
            s = s * 1664525u + 1013904223u;
            w[k] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
        }
    }
    traced = p;
    hp_exec_set_trace(ex, count, NULL);
    fill_data(ex, p, &spec); /* the data buffers' memory is the step's to reuse */
    cr_assert_eq(hp_exec_step(ex, &e), HP_OK, "%s", e.msg);
    int step_instrs = n_run, step_backward = n_backward;
    double step_loss, fwd_loss;
    cr_assert_eq(hp_exec_loss(ex, &step_loss, &e), HP_OK);
    n_run = n_backward = 0;
    fill_data(ex, p, &spec);
    cr_assert_eq(hp_exec_forward(ex, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_exec_loss(ex, &fwd_loss, &e), HP_OK);
    cr_expect(memcmp(&step_loss, &fwd_loss, sizeof step_loss) == 0, "forward %.17g vs step %.17g",
              fwd_loss, step_loss);
    cr_expect_gt(step_backward, 0);
    cr_expect_eq(n_backward, 0, "the forward pass ran %d backward ops", n_backward);
    cr_expect_lt(n_run, step_instrs / 2, "forward %d of the step's %d instructions", n_run,
                 step_instrs);
    cr_log_info("forward: %d of %d instructions", n_run, step_instrs);
    hp_exec_free(ex);
    hp_backend_free(be);
    hp_program_free(p);
    hp_graph_free(g);
}

/* ---- the trainer's evaluation ---------------------------------------------------------------- */

static const char *g_eval_data; /* eval_job's, for edit_eval */
static int64_t g_every;

static void edit_eval(hp_job *job) {
    job->train.eval_interval = g_every;
    job->train.eval_steps = 3;
    if (g_eval_data)
        snprintf(job->train.eval_data_path, sizeof job->train.eval_data_path, "%s", g_eval_data);
}

static hp_job *eval_job(const char *eval_data, int64_t steps, int64_t every) {
    g_eval_data = eval_data;
    g_every = every;
    return hp_th_tiny_job(2, 0, steps, edit_eval);
}

/* The reference evaluator's loss of job's graph at the weights of dir/model.safetensors over
 * the first n batches of the shard, in order. */
static double reference_eval_loss(const hp_job *job, const char *dir, const char *shard, int n) {
    const hp_graph *g = job->graph;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_in = gi.n_params + gi.n_buffers + gi.n_data;
    hp_tensor *in = calloc((size_t)n_in, sizeof *in);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    hp_st_file *f = NULL;
    hp_err e;
    cr_assert_eq(hp_st_open(path, &f, &e), HP_OK, "%s", e.msg);
    for (int i = 0; i < n_in; i++) {
        const hp_node *nd = &g->nodes[i];
        cr_assert_eq(hp_tensor_alloc(&in[i], nd->out[0], NULL), HP_OK);
        if (i >= gi.n_params) continue;
        const hp_st_tensor *t;
        const hp_attr *fqn = hp_node_attr(nd, HP_ATTR_FQN);
        cr_assert_eq(hp_st_get(f, fqn->s, &t, &e), HP_OK, "%s", e.msg);
        int64_t k = hp_type_numel(&nd->out[0]);
        float *w = malloc((size_t)k * sizeof *w);
        cr_assert_eq(hp_st_to_f32(t, w, k, &e), HP_OK, "%s", e.msg);
        for (int64_t j = 0; j < k; j++) in[i].data[j] = w[j];
        free(w);
    }
    hp_st_close(f);
    const hp_model_spec *m = &job->model;
    hp_data_config dc = {.path = shard,
                         .vocab = m->vocab,
                         .batch = m->batch,
                         .seq = m->seq,
                         .world = 1,
                         .sequential = true};
    hp_data *d = NULL;
    cr_assert_eq(hp_data_open(&dc, &d, &e), HP_OK, "%s", e.msg);
    int64_t nt = m->batch * m->seq;
    int64_t *tok = malloc((size_t)nt * sizeof *tok), *lab = malloc((size_t)nt * sizeof *lab);
    hp_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
    double sum = 0;
    for (int b = 0; b < n; b++) {
        cr_assert_eq(hp_data_next(d, 0, b, tok, lab, &e), HP_OK, "%s", e.msg);
        for (int i = gi.n_params + gi.n_buffers; i < n_in; i++) {
            const hp_attr *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
            const int64_t *src = !strcmp(fqn->s, "tokens") ? tok : lab;
            for (int64_t j = 0; j < nt; j++) in[i].data[j] = (double)src[j];
        }
        cr_assert_eq(hp_eval(g, in, n_in, NULL, out, &e), HP_OK, "%s", e.msg);
        sum += out[0].data[0];
        for (int i = 0; i < g->n_outputs; i++) hp_tensor_free(&out[i]);
    }
    hp_data_free(d);
    for (int i = 0; i < n_in; i++) hp_tensor_free(&in[i]);
    free(in);
    free(out);
    free(tok);
    free(lab);
    return sum / n;
}

Test(evaluation, the_eval_loss_is_the_reference_evaluators_and_training_is_unchanged) {
    char shard[512], a[512], b[512];
    write_shard("val.bin", 4000, 128, shard, sizeof shard);
    snprintf(a, sizeof a, "%s/eval", tmp);
    snprintf(b, sizeof b, "%s/plain", tmp);
    hp_job *job = eval_job(shard, 5, 2); /* evaluates after steps 2, 4 and 5 */
    hp_train_result r;
    hp_err e = {0};
    hp_train_opts o = {.out_dir = a, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(job, &o, &r, &e), HP_OK, "%s", e.msg);
    double want = reference_eval_loss(job, a, shard, 3);
    cr_expect(fabs(r.last_eval_loss - want) <= 1e-5 * fabs(want),
              "eval loss %.9g vs reference %.9g", r.last_eval_loss, want);
    double ev[8];
    int n = 0;
    char path[600], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", a);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"eval_loss\":");
        cr_assert(p, "%s", line);
        if (strncmp(p + 12, "null", 4)) ev[n++] = strtod(p + 12, NULL);
    }
    fclose(f);
    cr_expect_eq(n, 3, "evaluations logged: %d (after steps 2, 4 and 5)", n);
    cr_expect_eq(ev[n - 1], r.last_eval_loss);
    /* the same run without evaluating trains to the same bits */
    hp_job *plain = eval_job(NULL, 5, 0);
    hp_train_opts op = {.out_dir = b, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(plain, &op, &r, &e), HP_OK, "%s", e.msg);
    cr_expect(isnan(r.last_eval_loss));
    hp_th_expect_losses_close(a, b, 0, 0, "training with evaluation");
    hp_th_expect_weights_close(a, b, 0, 0, "training with evaluation");
    hp_job_free(job);
    hp_job_free(plain);
}

/* ---- through hpctl and hp-worker ------------------------------------------------------------ */

static void run(const char *cmd) {
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "failed (%d): %s", st, cmd);
}

/* The last "eval_loss" that is not null in dir/metrics.jsonl. */
static double last_eval(const char *dir) {
    char path[600], line[8192];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tmp, dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"eval_loss\":");
        if (p && strncmp(p + 12, "null", 4)) v = strtod(p + 12, NULL);
    }
    fclose(f);
    return v;
}

#define MODEL                                                                                      \
    "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 96 "        \
    "--vocab 256 --batch 6 --seq 32 --steps 4 --log-interval 1"

Test(evaluation, fsdp_world_2_evaluates_as_world_1) {
    char shard[512], cmd[3000];
    write_shard("val.bin", 6000, 256, shard, sizeof shard);
    for (int w = 1; w <= 2; w++) {
        snprintf(cmd, sizeof cmd,
                 "%s/client/hpctl new " MODEL " --fsdp 'layers.*' --mesh dp=%d --eval-interval 2 "
                 "--eval-steps 2 --eval-data %s -o %s/w%d.pb >/dev/null && "
                 "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/w%d.pb --threads 1 "
                 "--out %s/w%d >/dev/null",
                 hp_th_binary_dir(), w, shard, tmp, w, hp_th_binary_dir(), tmp, w, tmp, w);
        run(cmd);
    }
    double e1 = last_eval("w1"), e2 = last_eval("w2");
    cr_expect(isfinite(e1) && fabs(e1 - e2) <= 1e-5 * fabs(e1), "world 2 %.9g vs world 1 %.9g", e2,
              e1);
}

/* A graph with dropout (p = 0.5) and the same graph with p = 0, trained one step at the
 * smallest learning rate: their training losses differ (dropout is on), their evaluations agree
 * (dropout is off). */
Test(evaluation, dropout_is_off_while_evaluating) {
    char shard[512], cmd[4000];
    write_shard("val.bin", 2000, 16, shard, sizeof shard);
    const char *ps[2] = {"0.5", "0"};
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/g%d.hpir", tmp, i);
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f,
                "hpir 1\n"
                "%%0: f32[16,8] = placeholder() {kind=param, fqn=\"emb.weight\", "
                "init=normal(0,1)}\n"
                "%%1: f32[8,16] = placeholder() {kind=param, fqn=\"out.weight\", "
                "init=normal(0,0.3)}\n"
                "%%2: i64[2,4] = placeholder() {kind=data, fqn=\"tokens\"}\n"
                "%%3: i64[2,4] = placeholder() {kind=data, fqn=\"labels\"}\n"
                "%%4: f32[2,4,8] = embedding(%%0, %%2)\n"
                "%%5: (f32[2,4,8], bool[2,4,8]) = native_dropout(%%4) {p=%s, fqn=\"drop\"}\n"
                "%%6: f32[8,8] = view(%%5) {shape=[8,8]}\n"
                "%%7: f32[8,16] = mm(%%6, %%1)\n"
                "%%8: f32[8,16] = _log_softmax(%%7) {dim=1}\n"
                "%%9: i64[8] = view(%%3) {shape=[8]}\n"
                "%%10: (f32[], f32[]) = nll_loss_forward(%%8, %%9) {reduction=1, "
                "ignore_index=-100}\n"
                "return %%10\n",
                ps[i]);
        fclose(f);
        snprintf(cmd, sizeof cmd,
                 "%s/client/hpctl new --graph %s --steps 1 --lr 1e-12 --eval-interval 1 "
                 "--eval-steps 3 --eval-data %s -o %s/d%d.pb >/dev/null && "
                 "%s/worker/hp-worker --standalone %s/d%d.pb --threads 1 --out %s/d%d >/dev/null",
                 hp_th_binary_dir(), path, shard, tmp, i, hp_th_binary_dir(), tmp, i, tmp, i);
        run(cmd);
    }
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/d0", tmp);
    snprintf(b, sizeof b, "%s/d1", tmp);
    double la[2], lb[2];
    cr_assert_eq(hp_th_read_losses(a, la, 2), 1);
    cr_assert_eq(hp_th_read_losses(b, lb, 2), 1);
    cr_expect(fabs(la[0] - lb[0]) > 1e-4, "training losses %.9g and %.9g: dropout did nothing?",
              la[0], lb[0]);
    double ea = last_eval("d0"), eb = last_eval("d1");
    cr_expect(isfinite(ea) && fabs(ea - eb) <= 1e-6 * fabs(eb),
              "eval with dropout p=0.5 %.9g vs p=0 %.9g", ea, eb);
}

Test(evaluation, what_cannot_work_is_refused) {
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --eval-data x.bin -o j.pb"), 2, "hpctl",
        "--eval-data: evaluation needs --eval-interval N");
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --eval-steps 3 -o j.pb"), 2, "hpctl",
        "--eval-steps: evaluation needs --eval-interval N");
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --eval-interval 2 -o j.pb"), 2, "hpctl",
        "--eval-interval: evaluation needs held-out data: --eval-data PATH");
    /* held-out data that is not there: the run fails at start, naming it */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " --eval-interval 2 --eval-data %s/missing.bin -o "
             "%s/m.pb >/dev/null",
             hp_th_binary_dir(), tmp, tmp);
    run(cmd);
    hp_th_run r = hp_th_run_bin(tmp, "worker/hp-worker", "--standalone %s/m.pb --threads 1", tmp);
    cr_expect_eq(r.code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "eval data (train.eval_data_path)") && strstr(r.err, "missing.bin"),
              "%s", r.err);
    hp_th_run_free(&r);
    hp_th_run s = hp_th_run_bin(tmp, "client/hpctl", "inspect %s/m.pb", tmp);
    cr_expect(strstr(s.out, "eval        every 2 steps and after the last: 20 batches of"), "%s",
              s.out);
    hp_th_run_free(&s);
    /* the plan prices an evaluated batch: the forward pass, about a third of a step */
    s = hp_th_run_bin(tmp, "client/hpctl", "plan %s/m.pb --json", tmp);
    const char *fb = strstr(s.out, "\"eval_batch_s\":"), *cs = strstr(s.out, "\"compute_s\":");
    cr_assert(fb && cs, "%s", s.out);
    double fwd = strtod(fb + 15, NULL), comp = strtod(cs + 12, NULL);
    cr_expect(fwd > 0.2 * comp && fwd < 0.5 * comp, "an eval batch %g s, a step's compute %g s",
              fwd, comp);
    hp_th_run_free(&s);
    s = hp_th_run_bin(tmp, "client/hpctl", "plan %s/m.pb", tmp);
    cr_expect(strstr(s.out, "evaluation every 2 steps: 20 batches x forward "), "%s", s.out);
    hp_th_run_free(&s);
}

/* GET http://addr/path with curl: the body (malloc'd, "" on failure), spaces removed. */
static char *http_get(const char *addr, const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "curl -sf -m 10 'http://%s%s' | tr -d ' '", addr, path);
    FILE *f = popen(cmd, "r");
    cr_assert(f);
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while ((k = fread(buf + n, 1, cap - 1 - n, f)) > 0) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    pclose(f);
    return buf;
}

/* The evaluations of a job under hpd: a line each in `hpctl submit --watch`, the record's
 * eval_loss and the job's latest "eval" in the JSON API, hp_job_eval_loss in /metrics. */
Test(evaluation, under_hpd_the_eval_loss_reaches_watch_the_api_and_prometheus) {
    char shard[512], state[512], cmd[3000];
    write_shard("val.bin", 6000, 256, shard, sizeof shard);
    snprintf(state, sizeof state, "%s/state", tmp);
    cr_assert_eq(mkdir(state, 0700), 0);
    static const char *const args[] = {"--http", "127.0.0.1:0", NULL};
    hp_th_hpd h = {.pid = -1};
    hp_th_hpd_start(&h, state, NULL, args);
    setenv("HP_STATE_DIR", state, 1); /* hpctl's token */
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " --fsdp 'layers.*' --mesh dp=2 --eval-interval 2 "
             "--eval-steps 2 --eval-data %s -o %s/j.pb >/dev/null",
             hp_th_binary_dir(), shard, tmp);
    run(cmd);
    hp_th_run r =
        hp_th_run_bin(tmp, "client/hpctl", "--server %s submit %s/j.pb --watch", h.grpc, tmp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "eval after step 2: loss ") &&
                  strstr(r.out, "eval after step 4: loss "),
              "%s", r.out);
    hp_th_run_free(&r);
    /* the snapshot HTTP reads is refreshed by the loop: wait for the final one */
    bool api_ok = false, prom_ok = false;
    char *api = NULL;
    for (int i = 0; i < 100 && !(api_ok && prom_ok); i++) {
        free(api);
        api = http_get(h.http, "/api/v1/jobs");
        api_ok = strstr(api, "\"eval\":{\"loss\":") && strstr(api, "\"step\":4}");
        char *prom = http_get(h.http, "/metrics");
        prom_ok = strstr(prom, "hp_job_eval_loss{job_id=\"j-000001\"}") != NULL;
        free(prom);
        if (!(api_ok && prom_ok)) usleep(100000);
    }
    cr_expect(api_ok, "/api/v1/jobs: %s", api);
    free(api);
    bool seen = prom_ok;
    cr_expect(seen, "no hp_job_eval_loss in /metrics");
    cr_expect_eq(hp_th_hpd_stop(&h), 0);
}
