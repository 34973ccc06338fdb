/* The rank runtime end to end: the executor on the cpu backend computes what the reference
 * evaluator computes (in f32, and in bf16 under the mixed-precision policy); training matches
 * PyTorch's AdamW run step for step; a resumed run equals an uninterrupted one bit for bit; the
 * debugmodel's loss falls on the built-in corpus; a backend whose memory the host cannot see
 * (staged I/O) trains the same bits; a cuda job without CUDA is refused. */
#include "hp/data.h"
#include "hp/device.h"
#include "hp/eval.h"
#include "hp/job.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/program.h"
#include "hp/safetensors.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/bf16.h"
#include "worker/executor.h"
#include "worker/train.h"

#include "tests/util/cli_harness.h"
#include "tests/util/run_compare.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/hp-train-XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(train, .init = setup, .fini = teardown, .timeout = 600);

static hp_model_spec tiny_spec(void) {
    hp_model_spec s;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, NULL), HP_OK);
    s.dim = 64, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.ffn_hidden = 96;
    s.vocab = 128, s.batch = 2, s.seq = 16;
    return s;
}

static hp_job *tiny_job(hp_model_spec spec, int64_t steps) {
    hp_job *job = hp_job_new();
    cr_assert(job);
    job->model = spec;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &job->graph, &e), HP_OK, "%s", e.msg);
    job->train.steps = steps;
    job->train.local_batch = spec.batch;
    job->train.seq = spec.seq;
    job->train.log_interval = 1;
    job->train.warmup_steps = 2;
    job->train.lr = 1e-3;
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    return job;
}

static double urand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) & 0xffffff) / (double)0x1000000;
}

/* ---- executor vs the reference evaluator ---------------------------------------------------- */

/* One step of the tiny Llama's joint graph (bf16: after the mixed-precision pass) on the
 * executor and the cpu backend against the reference evaluator of the same graph: the loss
 * within loss_rel, each gradient within grad_rel of its largest element. */
static void exec_vs_eval(bool bf16, double loss_rel, double grad_rel) {
    hp_model_spec spec = tiny_spec();
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    if (bf16) {
        hp_job *job = hp_job_new();
        cr_assert(job);
        job->plan.param_dtype = HP_BF16;
        hp_pass_ctx ctx = {.job = job, .world = 1};
        hp_graph *mp = NULL;
        cr_assert_eq(hp_pass_mixed_precision(g, &ctx, &mp, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(hp_graph_verify(mp, &e), HP_OK, "%s", e.msg);
        hp_graph_free(g);
        hp_job_free(job);
        g = mp;
    }
    hp_program *p = NULL;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    hp_backend *be = NULL;
    cr_assert_eq(hp_cpu_backend_new(2, &be, &e), HP_OK, "%s", e.msg);
    hp_exec *ex = NULL;
    cr_assert_eq(hp_exec_new(p, be, &ex, &e), HP_OK, "%s", e.msg);

    /* the same random inputs to both */
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_in = gi.n_params + gi.n_buffers + gi.n_data;
    hp_tensor *in = calloc((size_t)n_in, sizeof *in);
    unsigned seed = 42;
    for (int i = 0; i < n_in; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, NULL), HP_OK);
        int64_t n = hp_type_numel(t);
        for (int64_t k = 0; k < n; k++)
            in[i].data[k] = t->dtype == HP_I64
                                ? floor(urand(&seed) * 128)
                                : (float)(t->rank == 1 ? 1 + 0.1 * (urand(&seed) - 0.5)
                                                       : 0.2 * (urand(&seed) - 0.5));
    }
    for (int i = 0; i < gi.n_params; i++) {
        float *dst = hp_exec_ptr(ex, p->params[i].buffer);
        for (int64_t k = 0; k < hp_type_numel(&g->nodes[i].out[0]); k++)
            dst[k] = (float)in[i].data[k];
    }
    for (int i = 0; i < p->n_data; i++) {
        int64_t *dst = hp_exec_ptr(ex, p->data[i].buffer);
        const hp_tensor *src = &in[p->data[i].node];
        for (int64_t k = 0; k < hp_type_numel(&src->type); k++) dst[k] = (int64_t)src->data[k];
    }
    cr_assert_eq(hp_exec_step(ex, &e), HP_OK, "%s", e.msg);
    double loss;
    cr_assert_eq(hp_exec_loss(ex, &loss, &e), HP_OK);

    hp_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
    cr_assert_eq(hp_eval(g, in, n_in, NULL, out, &e), HP_OK, "%s", e.msg);
    cr_expect(fabs(loss - out[0].data[0]) <= loss_rel * fabs(out[0].data[0]), "loss %.9g vs %.9g",
              loss, out[0].data[0]);
    double worst = 0;
    /* gradients: |hp - ref| <= grad_rel * max|ref| per tensor */
    for (int i = 0; i < gi.n_params; i++) {
        const float *got = hp_exec_ptr(ex, p->params[i].grad);
        const hp_tensor *want = &out[1 + i];
        double maxabs = 0, maxerr = 0;
        for (int64_t k = 0; k < hp_type_numel(&want->type); k++) {
            maxabs = fmax(maxabs, fabs(want->data[k]));
            maxerr = fmax(maxerr, fabs(got[k] - want->data[k]));
        }
        cr_expect(maxerr <= grad_rel * maxabs + 1e-12, "grad of %s: error %g vs max %g",
                  p->params[i].fqn, maxerr, maxabs);
        worst = fmax(worst, maxerr / (maxabs + 1e-30));
    }
    cr_log_info("%s: loss %.9g vs %.9g, worst gradient error %.3g of its max",
                bf16 ? "bf16" : "f32", loss, out[0].data[0], worst);
    for (int i = 0; i < g->n_outputs; i++) hp_tensor_free(&out[i]);
    for (int i = 0; i < n_in; i++) hp_tensor_free(&in[i]);
    free(out);
    free(in);
    hp_exec_free(ex);
    hp_backend_free(be);
    hp_program_free(p);
    hp_graph_free(g);
}

Test(train, executor_matches_reference_evaluator) {
    exec_vs_eval(false, 1e-5, 1e-4);
}

/* Under the bf16 policy both round every bf16 node's output to bf16; they differ in computing
 * in f32 (kernels) vs f64 (evaluator), which flips an occasional rounding (measured: the loss equal
 * to 9 digits, gradients within 0.7% of their largest element). */
Test(train, bf16_executor_matches_reference_evaluator) {
    exec_vs_eval(true, 1e-3, 2e-2);
}

/* The bf16 policy's parameter casts keep their copies between steps (HP_INSTR_PARAM_CAST into
 * PARAM memory) and the optimizer rewrites them: four steps that skip the casts give the bits of
 * four that cast every time, and each copy is its parameter rounded to nearest even. A flag on
 * any other instruction fails the program's verification. */
Test(train, bf16_param_copies_are_written_by_the_optimizer) {
    hp_model_spec spec = tiny_spec();
    hp_graph *g = NULL, *mp = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    hp_job *job = hp_job_new();
    job->plan.param_dtype = HP_BF16;
    hp_pass_ctx ctx = {.job = job, .world = 1};
    cr_assert_eq(hp_pass_mixed_precision(g, &ctx, &mp, &e), HP_OK, "%s", e.msg);
    hp_program *p = NULL;
    cr_assert_eq(hp_lower(mp, &p, &e), HP_OK, "%s", e.msg);
    for (int i = 0; i < p->n_params; i++) {
        int32_t c = hp_program_param_cast(p, i);
        cr_assert(c >= 0, "parameter %s has no kept bf16 copy", p->params[i].fqn);
        cr_expect_eq(p->buffers[c].mem, HP_MEM_PARAM);
        cr_expect_eq(p->buffers[c].type->dtype, HP_BF16);
    }
    for (int32_t k = 0; k < p->n_instrs; k++) {
        if (p->graph->nodes[p->instrs[k].node].op != HP_OP_MM) continue;
        uint32_t f = p->instrs[k].flags;
        p->instrs[k].flags |= HP_INSTR_PARAM_CAST;
        cr_expect_eq(hp_program_verify(p, &e), HP_INVALID, "a param-copy flag on an mm");
        p->instrs[k].flags = f;
        break;
    }
    cr_assert_eq(hp_program_verify(p, &e), HP_OK, "%s", e.msg);

    enum { RUNS = 2, STEPS = 4 };
    hp_backend *be = NULL;
    cr_assert_eq(hp_cpu_backend_new(2, &be, &e), HP_OK, "%s", e.msg);
    double loss[RUNS][STEPS];
    hp_exec *ex[RUNS] = {NULL, NULL};
    for (int r = 0; r < RUNS; r++) { /* r 0: copies kept; r 1: cast every step */
        cr_assert_eq(hp_exec_new(p, be, &ex[r], &e), HP_OK, "%s", e.msg);
        int n = p->n_params;
        hp_adamw_param *ap = calloc((size_t)n, sizeof *ap);
        unsigned seed = 7;
        for (int i = 0; i < p->n_params + p->n_bufs; i++) {
            float *dst = hp_exec_ptr(ex[r], p->params[i].buffer);
            for (int64_t k = 0; k < hp_type_numel(p->buffers[p->params[i].buffer].type); k++)
                dst[k] = i < n ? (float)(0.2 * (urand(&seed) - 0.5)) : 1.0f;
        }
        for (int i = 0; i < n; i++) {
            int64_t k = hp_type_numel(p->buffers[p->params[i].buffer].type);
            ap[i] =
                (hp_adamw_param){hp_exec_ptr(ex[r], p->params[i].buffer),
                                 hp_exec_ptr(ex[r], p->params[i].grad),
                                 calloc((size_t)k, 4),
                                 calloc((size_t)k, 4),
                                 k,
                                 r == 0 ? hp_exec_ptr(ex[r], hp_program_param_cast(p, i)) : NULL};
        }
        for (int step = 0; step < STEPS; step++) {
            for (int i = 0; i < p->n_data; i++) {
                int64_t *dst = hp_exec_ptr(ex[r], p->data[i].buffer);
                for (int64_t k = 0; k < hp_type_numel(p->buffers[p->data[i].buffer].type); k++)
                    dst[k] = (k * 7 + step * 3 + i) % 128;
            }
            cr_assert_eq(hp_exec_step(ex[r], &e), HP_OK, "%s", e.msg);
            cr_assert_eq(hp_exec_loss(ex[r], &loss[r][step], &e), HP_OK, "%s", e.msg);
            hp_adamw_config cfg = hp_adamw_defaults();
            cr_assert_eq(be->vt->adamw(be, &cfg, 1e-2, 1.0f, step + 1, ap, n, &e), HP_OK, "%s",
                         e.msg);
            if (r == 0) hp_exec_param_copies_current(ex[r]);
        }
        if (r == 0)
            for (int i = 0; i < n; i++) {
                const uint16_t *c = hp_exec_ptr(ex[r], hp_program_param_cast(p, i));
                for (int64_t k = 0; k < ap[i].numel; k++)
                    cr_assert_eq(c[k], hp__bf16_round(ap[i].param[k]), "%s: copy element %lld",
                                 p->params[i].fqn, (long long)k);
            }
        for (int i = 0; i < n; i++) free(ap[i].exp_avg), free(ap[i].exp_avg_sq);
        free(ap);
    }
    for (int step = 0; step < STEPS; step++)
        cr_expect_eq(memcmp(&loss[0][step], &loss[1][step], sizeof(double)), 0,
                     "step %d: loss %.9g with kept copies, %.9g casting", step, loss[0][step],
                     loss[1][step]);
    cr_expect(loss[0][STEPS - 1] != loss[0][0], "the parameters moved");
    for (int r = 0; r < RUNS; r++) hp_exec_free(ex[r]);
    hp_backend_free(be);
    hp_program_free(p);
    hp_graph_free(mp);
    hp_graph_free(g);
    hp_job_free(job);
}

/* ---- training against PyTorch --------------------------------------------------------------- */

/* Reads DIR/metrics.jsonl's "loss" fields, in order. */
static int run_py(const char *mode, const char *cfg) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/worker/train_ref.py %s %s %s",
             HP_SOURCE_DIR, mode, tmp, cfg);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* hp and train_ref.py train the same tiny Llama from the same weights on the same batch;
 * losses must agree within loss_rel, final weights within w_rel of each tensor's largest |w|.
 * bf16: both run the mixed-precision policy (param_dtype bf16, reduce_dtype f32). */
static void pytorch_check(int steps, bool bf16, double loss_rel, double w_rel) {
    hp_model_spec spec = tiny_spec();
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "dim=64 n_layers=2 n_heads=4 n_kv_heads=2 ffn_hidden=96 vocab=128 batch=2 seq=16 "
             "steps=%d warmup=2 lr=0.001 wd=0.1 clip=1.0 min_lr=0 bf16=%d",
             steps, (int)bf16);
    int rc = run_py("init", cfg);
    cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
    cr_assert_eq(rc, 0, "train_ref.py init failed");
    /* exactly B windows of T+1 tokens: every step's batch is the same set of samples */
    uint32_t toks[2 * 16 + 1];
    unsigned seed = 9;
    for (size_t i = 0; i < HP_ARRAY_LEN(toks); i++) toks[i] = (uint32_t)(urand(&seed) * 128);
    char path[640], init[512];
    snprintf(path, sizeof path, "%s/tokens.bin", tmp);
    hp_err e;
    cr_assert_eq(hp_data_write_shard(path, toks, HP_ARRAY_LEN(toks), 1, &e), HP_OK, "%s", e.msg);
    rc = run_py("train", cfg);
    cr_assert_eq(rc, 0, "train_ref.py train failed");

    hp_job *job = tiny_job(spec, steps);
    if (bf16) job->plan.param_dtype = HP_BF16;
    snprintf(init, sizeof init, "%s/init.safetensors", tmp);
    char out[300];
    snprintf(out, sizeof out, "%s/hp", tmp);
    hp_train_opts o = {
        .out_dir = out, .init_from = init, .data = path, .threads = 2, .log = stderr};
    hp_train_result res;
    cr_assert_eq(hp_train(job, &o, &res, &e), HP_OK, "%s", e.msg);

    double got[16], want[16];
    cr_assert_eq(hp_th_read_losses(out, got, 16), steps);
    snprintf(path, sizeof path, "%s/ref_losses.txt", tmp);
    FILE *f = fopen(path, "r");
    for (int i = 0; i < steps; i++) cr_assert_eq(fscanf(f, "%lf", &want[i]), 1);
    fclose(f);
    double worst = 0;
    for (int i = 0; i < steps; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]) / fabs(want[i]));
        cr_expect(fabs(got[i] - want[i]) <= loss_rel * fabs(want[i]),
                  "step %d: loss %.9g vs torch %.9g", i + 1, got[i], want[i]);
    }
    cr_log_info("%s: worst loss difference %.3g relative", bf16 ? "bf16" : "f32", worst);

    /* final weights */
    hp_st_file *a = NULL, *b = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    cr_assert_eq(hp_st_open(path, &a, &e), HP_OK, "%s", e.msg);
    snprintf(path, sizeof path, "%s/ref_final.safetensors", tmp);
    cr_assert_eq(hp_st_open(path, &b, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_st_count(a), hp_st_count(b));
    for (int i = 0; i < hp_st_count(b); i++) {
        const hp_st_tensor *w = hp_st_at(b, i), *h = hp_st_find(a, w->name);
        cr_assert(h, "%s missing from hp's export", w->name);
        int64_t n = hp_st_numel(w);
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        cr_assert_eq(hp_st_to_f32(h, x, n, NULL), HP_OK);
        cr_assert_eq(hp_st_to_f32(w, y, n, NULL), HP_OK);
        double maxabs = 0, maxerr = 0;
        for (int64_t k = 0; k < n; k++) {
            maxabs = fmax(maxabs, fabs(y[k]));
            maxerr = fmax(maxerr, fabs(x[k] - y[k]));
        }
        cr_expect(maxerr <= w_rel * maxabs, "%s: error %g vs max %g", w->name, maxerr, maxabs);
        free(x);
        free(y);
    }
    hp_st_close(a);
    hp_st_close(b);
    hp_job_free(job);
}

Test(train, matches_pytorch_adamw_five_steps) {
    pytorch_check(5, false, 1e-4, 1e-4);
}

/* FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32) on both sides, 10 steps:
 * bf16 compute differs in rounding order only, so losses agree within 1e-2. */
Test(train, matches_pytorch_bf16_policy_ten_steps) {
    pytorch_check(10, true, 1e-2, 2e-2);
}

/* ---- resume -----------------------------------------------------------------------------------
 */

static void read_file(const char *path, uint8_t **data, size_t *len) {
    cr_assert_eq(hp_file_read(path, 1 << 30, data, len, NULL), HP_OK, "%s", path);
}

/* The model.safetensors two runs exported are the same bytes. */
static void expect_same_weights(const char *a, const char *b) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    uint8_t *da, *db;
    size_t na, nb;
    read_file(pa, &da, &na);
    read_file(pb, &db, &nb);
    cr_expect(na == nb && memcmp(da, db, na) == 0, "final weights differ");
    hp_free(da);
    hp_free(db);
}

Test(train, resume_equals_uninterrupted_bit_for_bit) {
    hp_job *job = tiny_job(tiny_spec(), 20);
    job->train.checkpoint_interval = 10;
    hp_err e;
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/full", tmp);
    snprintf(b, sizeof b, "%s/split", tmp);
    hp_train_result res;
    hp_train_opts full = {.out_dir = a, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(job, &full, &res, &e), HP_OK, "%s", e.msg);

    /* the same run dies after step 15 (no checkpoint of its own: as kill -9 would leave it),
     * then resumes from the step-10 checkpoint and redoes 11..20 */
    hp_train_opts crash = {.out_dir = b, .threads = 2, .log = stderr, .halt_after = 15};
    cr_assert_eq(hp_train(job, &crash, &res, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(res.last_step, 15);
    hp_train_opts resume = {.out_dir = b, .resume = b, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(job, &resume, &res, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(res.first_step, 11);
    cr_assert_eq(res.last_step, 20);

    double la[32], lb[32];
    cr_assert_eq(hp_th_read_losses(a, la, 32), 20);
    /* 1..10, then 11..20 from the resume: it dropped the records of 11..15 the crashed run
     * wrote (metrics.jsonl holds each step once) */
    cr_assert_eq(hp_th_read_losses(b, lb, 32), 20);
    for (int i = 0; i < 20; i++)
        cr_expect(memcmp(&la[i], &lb[i], sizeof(double)) == 0,
                  "step %d: %.17g vs uninterrupted %.17g", i + 1, lb[i], la[i]);
    expect_same_weights(a, b);
    hp_job_free(job);
}

/* ---- the loss falls ------------------------------------------------------------------------- */

Test(train, debugmodel_loss_falls_on_builtin_corpus) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.batch = 4, spec.seq = 64, spec.n_layers = 2;
    hp_job *job = tiny_job(spec, 40);
    job->train.lr = 3e-3;
    job->train.log_interval = 10;
    hp_train_opts o = {.out_dir = tmp, .threads = 2, .log = stderr};
    hp_train_result res;
    hp_err e;
    cr_assert_eq(hp_train(job, &o, &res, &e), HP_OK, "%s", e.msg);
    /* from ln(2048) = 7.6 for random init; 40 steps of byte-level English get well below */
    cr_expect_gt(res.first_loss, 7.0, "first loss %.4f", res.first_loss);
    cr_expect_lt(res.last_loss, res.first_loss - 2.0, "loss %.4f -> %.4f", res.first_loss,
                 res.last_loss);
    hp_job_free(job);
}

/* ---- a backend whose memory the host cannot see ----------------------------------------------
 * Forwards everything to a cpu backend but says host_visible = false, so the training loop
 * must stage checkpoints, resume and the export through copy_in / copy_out (the path a GPU
 * backend takes). The run must equal the cpu one bit for bit. */

typedef struct opaque {
    hp_backend base;
    hp_backend *in;
    int copies_in, copies_out;
    int sumsq_calls, poison_sumsq; /* the poison_sumsq'th sum of squares (1-based) is NaN */
    int adamw_calls;
} opaque;

#define IN(b) (((opaque *)(b))->in)
static hp_status o_info(hp_backend *b, hp_device_info *out, hp_err *err) {
    hp_status st = IN(b)->vt->info(IN(b), out, err);
    out->host_visible = false;
    return st;
}
static hp_status o_alloc(hp_backend *b, size_t n, void **out, hp_err *err) {
    return IN(b)->vt->alloc(IN(b), n, out, err);
}
static void o_free(hp_backend *b, void *p) {
    IN(b)->vt->free(IN(b), p);
}
static hp_status o_copy_in(hp_backend *b, void *d, const void *s, size_t n, hp_err *err) {
    ((opaque *)b)->copies_in++;
    return IN(b)->vt->copy_in(IN(b), d, s, n, err);
}
static hp_status o_copy_out(hp_backend *b, void *d, const void *s, size_t n, hp_err *err) {
    ((opaque *)b)->copies_out++;
    return IN(b)->vt->copy_out(IN(b), d, s, n, err);
}
static hp_status o_launch(hp_backend *b, int s, const hp_kernel_call *c, hp_err *err) {
    return IN(b)->vt->launch(IN(b), s, c, err);
}
static hp_status o_collective(hp_backend *b, int s, const hp_kernel_call *c, hp_err *err) {
    return IN(b)->vt->collective(IN(b), s, c, err);
}
static hp_status o_event_new(hp_backend *b, hp_event **e, hp_err *err) {
    return IN(b)->vt->event_new(IN(b), e, err);
}
static void o_event_free(hp_backend *b, hp_event *e) {
    IN(b)->vt->event_free(IN(b), e);
}
static hp_status o_event_record(hp_backend *b, hp_event *e, int s, hp_err *err) {
    return IN(b)->vt->event_record(IN(b), e, s, err);
}
static hp_status o_event_wait(hp_backend *b, hp_event *e, int s, hp_err *err) {
    return IN(b)->vt->event_wait(IN(b), e, s, err);
}
static hp_status o_sync(hp_backend *b, hp_err *err) {
    return IN(b)->vt->synchronize(IN(b), err);
}
static void o_destroy(hp_backend *b) {
    hp_backend_free(IN(b));
    free(b);
}
static hp_status o_adamw(hp_backend *b, const hp_adamw_config *cfg, double lr, float gs,
                         int64_t step, const hp_adamw_param *p, int n, hp_err *err) {
    ((opaque *)b)->adamw_calls++;
    return IN(b)->vt->adamw(IN(b), cfg, lr, gs, step, p, n, err);
}
static hp_status o_sumsq(hp_backend *b, const hp_fspan *x, int n, double *out, hp_err *err) {
    opaque *o = (opaque *)b;
    hp_status st = IN(b)->vt->sum_squares(IN(b), x, n, out, err);
    if (++o->sumsq_calls == o->poison_sumsq) *out = NAN; /* as an overflowed gradient would */
    return st;
}
static hp_status o_scale(hp_backend *b, const hp_fspan *x, int n, float coef, hp_err *err) {
    return IN(b)->vt->scale(IN(b), x, n, coef, err);
}
static hp_status o_fill(hp_backend *b, float *dst, const hp_init *spec, uint64_t seed,
                        const char *fqn, int64_t first, int64_t count, hp_err *err) {
    return IN(b)->vt->fill_init(IN(b), dst, spec, seed, fqn, first, count, err);
}
static hp_status o_mem(hp_backend *b, uint64_t *bytes, hp_err *err) {
    return IN(b)->vt->memory_peak(IN(b), bytes, err);
}
static double o_busy(hp_backend *b) {
    return IN(b)->vt->comm_busy(IN(b));
}
static void o_trace(hp_backend *b, hp_comm_trace_fn fn, void *ctx) {
    IN(b)->vt->set_comm_trace(IN(b), fn, ctx);
}
static const hp_backend_vtable opaque_vt = {
    .name = "opaque",
    .info = o_info,
    .alloc = o_alloc,
    .free = o_free,
    .copy_in = o_copy_in,
    .copy_out = o_copy_out,
    .launch = o_launch,
    .collective = o_collective,
    .event_new = o_event_new,
    .event_free = o_event_free,
    .event_record = o_event_record,
    .event_wait = o_event_wait,
    .synchronize = o_sync,
    .destroy = o_destroy,
    .adamw = o_adamw,
    .sum_squares = o_sumsq,
    .scale = o_scale,
    .fill_init = o_fill,
    .memory_peak = o_mem,
    .comm_busy = o_busy,
    .set_comm_trace = o_trace,
};

static opaque *opaque_new(void) {
    opaque *o = calloc(1, sizeof *o);
    cr_assert(o);
    o->base.vt = &opaque_vt;
    hp_backend_opts bo = {.threads = 2};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CPU, &bo, &o->in, NULL), HP_OK);
    return o;
}

Test(train, staged_backend_equals_cpu_bit_for_bit) {
    hp_job *job = tiny_job(tiny_spec(), 10);
    job->train.checkpoint_interval = 5;
    hp_err e;
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/cpu", tmp);
    snprintf(b, sizeof b, "%s/staged", tmp);
    hp_train_result res;
    hp_train_opts plain = {.out_dir = a, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(job, &plain, &res, &e), HP_OK, "%s", e.msg);

    /* staged: crash after 7, resume from the step-5 checkpoint (written and read through
     * copy_out / copy_in), export through copy_out */
    opaque *o = opaque_new();
    hp_train_opts crash = {
        .out_dir = b, .threads = 2, .log = stderr, .halt_after = 7, .backend = &o->base};
    cr_assert_eq(hp_train(job, &crash, &res, &e), HP_OK, "%s", e.msg);
    int outs_after_save = o->copies_out;
    cr_assert_gt(outs_after_save, 10, "the checkpoint was not staged (%d copies out)",
                 outs_after_save);
    int ins = o->copies_in;
    hp_train_opts resume = {
        .out_dir = b, .resume = b, .threads = 2, .log = stderr, .backend = &o->base};
    cr_assert_eq(hp_train(job, &resume, &res, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(res.first_step, 6);
    cr_assert_gt(o->copies_in - ins, 3 * 3, "the resume was not staged");
    hp_backend_free(&o->base);

    double la[16], lb[32];
    cr_assert_eq(hp_th_read_losses(a, la, 16), 10);
    cr_assert_eq(hp_th_read_losses(b, lb, 32), 10); /* 1..5, then 6..10 (each step once) */
    for (int i = 0; i < 10; i++)
        cr_expect(memcmp(&la[i], &lb[i], sizeof(double)) == 0, "step %d: %.17g vs %.17g", i + 1,
                  lb[i], la[i]);
    expect_same_weights(a, b);
    hp_job_free(job);
}

/* A cuda job where no CUDA backend is built: setup fails with one line, nothing runs. */
Test(train, cuda_job_is_refused_not_run_on_the_cpu) {
    hp_job *job = tiny_job(tiny_spec(), 2);
    job->resources.device = HP_DEVICE_CUDA;
    job->resources.gpus_per_node = 1;
    if (hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK) {
        hp_job_free(job);
        teardown(); /* Criterion runs no .fini after a skip */
        cr_skip_test("this build has CUDA (tests/worker/test_cuda_train.c covers it)");
    }
    hp_train_opts o = {.out_dir = tmp, .threads = 1, .log = stderr};
    hp_train_result res;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &o, &res, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "device cuda") && strstr(e.msg, "without CUDA"), "%s", e.msg);
    cr_assert_null(strchr(e.msg, '\n'), "not one line: %s", e.msg);
    cr_assert_eq(res.last_step, 0);
    hp_job_free(job);
}

/* A step whose grad norm is NaN stops the run with an error naming the step (the default, and
 * what hpctl new writes); nothing of that step is applied. */
Test(train, nonfinite_grad_norm_stops_naming_the_step) {
    hp_job *job = tiny_job(tiny_spec(), 4);
    opaque *o = opaque_new();
    o->poison_sumsq = 2;
    hp_train_opts opts = {.threads = 2, .log = stderr, .backend = &o->base};
    hp_train_result res;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &opts, &res, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "step 2: non-finite grad norm"), "%s", e.msg);
    cr_expect(strstr(e.msg, "--on-nonfinite skip"), "%s", e.msg);
    cr_expect_eq(o->adamw_calls, 1, "the NaN step was applied");
    hp_backend_free(&o->base);
    hp_job_free(job);
}

/* --on-nonfinite skip (the job's train.on_nonfinite, or the option over it): the NaN step
 * skips its optimizer update, the run goes on, and metrics count the skipped steps. */
Test(train, on_nonfinite_skip_skips_the_update_and_counts_it) {
    for (int via_opts = 0; via_opts < 2; via_opts++) {
        hp_job *job = tiny_job(tiny_spec(), 4);
        if (!via_opts) job->train.on_nonfinite = HP_NONFINITE_SKIP;
        opaque *o = opaque_new();
        o->poison_sumsq = 2;
        char out[300], path[400];
        snprintf(out, sizeof out, "%s/skip%d", tmp, via_opts);
        hp_train_opts opts = {.out_dir = out,
                              .threads = 2,
                              .log = stderr,
                              .backend = &o->base,
                              .on_nonfinite = via_opts ? HP_TRAIN_NONFINITE_SKIP : 0};
        hp_train_result res;
        hp_err e = {0};
        cr_assert_eq(hp_train(job, &opts, &res, &e), HP_OK, "%s", e.msg);
        cr_expect_eq(res.skipped_steps, 1);
        cr_expect_eq(res.last_step, 4);
        cr_expect_eq(o->adamw_calls, 3, "updates: %d", o->adamw_calls);
        cr_expect(isfinite(res.last_loss));
        snprintf(path, sizeof path, "%s/metrics.jsonl", out);
        FILE *f = fopen(path, "r");
        cr_assert(f, "%s", path);
        char line[8192];
        int64_t want[] = {0, 1, 1, 1};
        for (int i = 0; i < 4; i++) {
            cr_assert(fgets(line, sizeof line, f), "line %d", i + 1);
            char key[64];
            snprintf(key, sizeof key, "\"skipped_steps\":%lld", (long long)want[i]);
            cr_expect(strstr(line, key), "step %d: %s", i + 1, line);
        }
        fclose(f);
        hp_backend_free(&o->base);
        hp_job_free(job);
    }
}

/* Initial weights holding a NaN or an infinity are refused on load, naming the tensor. */
Test(train, init_from_with_nan_is_refused_naming_the_tensor) {
    hp_job *job = tiny_job(tiny_spec(), 2);
    char out[300], path[400], bad[400];
    snprintf(out, sizeof out, "%s/first", tmp);
    hp_train_opts opts = {.out_dir = out, .threads = 2, .log = stderr};
    hp_train_result res;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &opts, &res, &e), HP_OK, "%s", e.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    hp_st_file *f = NULL;
    cr_assert_eq(hp_st_open(path, &f, &e), HP_OK, "%s", e.msg);
    const float poison[] = {NAN, INFINITY};
    for (int p = 0; p < 2; p++) {
        int n = hp_st_count(f);
        hp_st_tensor *ts = calloc((size_t)n, sizeof *ts);
        float *victim = NULL;
        const char *name = NULL;
        for (int i = 0; i < n; i++) {
            ts[i] = *hp_st_at(f, i);
            if (strstr(ts[i].name, "layers.1.attention.wq")) {
                victim = malloc(ts[i].nbytes);
                memcpy(victim, ts[i].data, ts[i].nbytes);
                victim[3] = poison[p];
                ts[i].data = victim;
                name = ts[i].name;
            }
        }
        cr_assert(victim, "no layers.1.attention.wq in the export");
        snprintf(bad, sizeof bad, "%s/bad%d.safetensors", tmp, p);
        cr_assert_eq(hp_st_write(bad, ts, n, NULL, 0, &e), HP_OK, "%s", e.msg);
        hp_train_opts o2 = {.init_from = bad, .threads = 2, .log = stderr};
        cr_assert_eq(hp_train(job, &o2, &res, &e), HP_INVALID);
        char want[200];
        snprintf(want, sizeof want, "tensor '%s' holds %s at element 3", name, p ? "inf" : "nan");
        cr_expect(strstr(e.msg, want), "%s", e.msg);
        free(victim);
        free(ts);
    }
    hp_st_close(f);
    hp_job_free(job);
}

/* Flips one byte near the end of path (inside its last tensor's data). */
static void flip_last_bytes(const char *path) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    cr_assert_eq(fseek(f, -3, SEEK_END), 0);
    int ch = fgetc(f);
    cr_assert_eq(fseek(f, -3, SEEK_END), 0);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

/* A corrupt tensor in the latest checkpoint: the resume falls back to the one before it and
 * says why on the log; every checkpoint corrupt: a clear error, nothing trained. */
Test(train, resume_falls_back_past_a_corrupt_checkpoint) {
    hp_job *job = tiny_job(tiny_spec(), 8);
    job->train.checkpoint_interval = 2;
    hp_err e = {0};
    char out[300], path[600], logp[400];
    snprintf(out, sizeof out, "%s/run", tmp);
    hp_train_result res;
    hp_train_opts first = {.out_dir = out, .threads = 2, .log = stderr, .halt_after = 6};
    cr_assert_eq(hp_train(job, &first, &res, &e), HP_OK, "%s", e.msg); /* checkpoints 2, 4, 6 */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000006/rank-00000.safetensors", out);
    flip_last_bytes(path);

    snprintf(logp, sizeof logp, "%s/resume.log", tmp);
    FILE *log = fopen(logp, "w+");
    hp_train_opts again = {.out_dir = out, .resume = out, .threads = 2, .log = log};
    cr_assert_eq(hp_train(job, &again, &res, &e), HP_OK, "%s", e.msg);
    fclose(log);
    cr_expect_eq(res.first_step, 5, "resumed at %lld", (long long)res.first_step);
    char *text = hp_th_slurp(logp);
    cr_expect(strstr(text, "warning: resume: checkpoint step=6 fails verification") &&
                  strstr(text, "is corrupt: CRC-32C") &&
                  strstr(text, "falling back to the previous one"),
              "%s", text);
    cr_expect(strstr(text, "resumed from step 4"), "%s", text);
    free(text);

    /* now every complete checkpoint is corrupt (the run above wrote 6 and 8 again) */
    for (int s = 2; s <= 8; s += 2) {
        snprintf(path, sizeof path, "%s/checkpoints/step-%08d/rank-00000.safetensors", out, s);
        if (access(path, F_OK) == 0) flip_last_bytes(path);
    }
    again.log = stderr;
    cr_assert_eq(hp_train(job, &again, &res, &e), HP_PARSE);
    cr_expect(strstr(e.msg, "resume") && strstr(e.msg, "no usable checkpoint in") &&
                  strstr(e.msg, "3 complete ones failed verification") &&
                  strstr(e.msg, "step-00000008/rank-00000.safetensors"),
              "%s", e.msg);
    hp_job_free(job);
}
