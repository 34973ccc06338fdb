/* Gradient accumulation (train.global_batch a multiple of one micro-step's batch; hpctl new
 * --global-batch): a step of k micro-steps computes the step one micro-step over the whole
 * global batch would, to float rounding: the losses and grad norms (gradient clipping
 * included) of batch 4, of batch 2 x 2 micro-steps and of batch 1 x 4 agree to 1e-5, their
 * final weights to 1e-4;
 * FSDP at world 2 with accumulation equals world 1 over the same global batch, in f32 and with
 * the bf16 policy; a run killed mid-way resumes to the uninterrupted run's bits; a trace shows
 * the micro-steps; hpctl refuses a global batch that is not a whole number of micro-steps and
 * shows the accumulation in inspect and plan. */
#include "tests/util/cli_harness.h"
#include "tests/util/run_compare.h"
#include "tests/util/train_fixture.h"

#include "hp/base.h"
#include "hp/job.h"
#include "hp/models.h"
#include "worker/train.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmp[256];

static void setup(void) {
    hp_th_tmpdir_make(tmp, sizeof tmp, "hp-accum");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmp);
}

TestSuite(grad_accum, .init = setup, .fini = teardown, .timeout = 600);

/* ---- through the library (world 1) ---------------------------------------------------------- */

/* The tiny Llama with `batch` sequences a micro-step and `global` an optimizer step. */
static hp_job *job_of(int64_t batch, int64_t global, int64_t steps) {
    return hp_th_tiny_job(batch, global, steps, NULL);
}

static void train_into(hp_job *job, const char *name, const hp_train_opts *base) {
    char out[512];
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    hp_train_opts o = base ? *base : (hp_train_opts){.threads = 2, .log = stderr};
    o.out_dir = out;
    hp_train_result r;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &o, &r, &e), HP_OK, "%s: %s", name, e.msg);
}

/* Every "key": number of dir/metrics.jsonl, at most max; how many. */
static int read_field(const char *name, const char *key, double *v, int max) {
    char path[600], line[8192], pat[64];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tmp, name);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, pat);
        cr_assert(p, "%s: no %s in %s", path, key, line);
        v[n++] = strtod(p + strlen(pat), NULL);
    }
    fclose(f);
    return n;
}

/* Losses and grad norms within rel, weights within wrel of each tensor's largest element. */
static void expect_runs_close(const char *a, const char *b, double rel, double wrel) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s", tmp, a);
    snprintf(pb, sizeof pb, "%s/%s", tmp, b);
    hp_th_expect_losses_close(pa, pb, 0, rel, b);
    hp_th_expect_weights_close(pa, pb, 0, wrel, b);
    double na[32], nb[32];
    int n = read_field(a, "grad_norm", na, 32);
    cr_assert_eq(read_field(b, "grad_norm", nb, 32), n);
    for (int i = 0; i < n; i++)
        cr_expect(fabs(na[i] - nb[i]) <= rel * fabs(na[i]), "%s: step %d grad norm %.9g vs %.9g", b,
                  i + 1, nb[i], na[i]);
}

Test(grad_accum, micro_steps_equal_one_big_batch) {
    /* grad clip 0.5: the norm is the mean gradient's, and the clipping scales that */
    const int64_t shapes[3][2] = {{4, 0}, {2, 4}, {1, 4}};
    const char *names[3] = {"b4", "b2x2", "b1x4"};
    for (int i = 0; i < 3; i++) {
        hp_job *job = job_of(shapes[i][0], shapes[i][1], 8);
        job->train.grad_clip = 0.5;
        cr_assert_eq(hp_job_grad_accum(job), i == 0 ? 1 : 4 / shapes[i][0]);
        train_into(job, names[i], NULL);
        hp_job_free(job);
    }
    double norms[8];
    cr_assert_eq(read_field("b4", "grad_norm", norms, 8), 8);
    int clipped = 0;
    for (int i = 0; i < 8; i++) clipped += norms[i] > 0.5;
    cr_expect_gt(clipped, 0, "no step was clipped: the test would not check clipping");
    /* weights to 1e-4: AdamW's update of an element whose gradient is tiny turns the rounding
     * of another summation order into up to 1.3e-5 of a tensor's largest element (measured,
     * OpenBLAS's SkylakeX kernels) */
    expect_runs_close("b4", "b2x2", 1e-5, 1e-4);
    expect_runs_close("b4", "b1x4", 1e-5, 1e-4);
    /* a step's tokens are the global batch's */
    double ta[8], tb[8];
    cr_assert_eq(read_field("b4", "tokens", ta, 8), 8);
    cr_assert_eq(read_field("b1x4", "tokens", tb, 8), 8);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(ta[i], tb[i], "step %d: tokens %g vs %g", i + 1, tb[i], ta[i]);
}

/* Killed after step 5 (no checkpoint of its own), resumed from the step-3 checkpoint: the
 * micro-steps read the same data and the run ends on the uninterrupted run's bits. */
Test(grad_accum, resume_equals_uninterrupted_bit_for_bit) {
    hp_job *job = job_of(1, 3, 8);
    job->train.checkpoint_interval = 3;
    train_into(job, "full", NULL);
    hp_train_opts crash = {.threads = 2, .log = stderr, .halt_after = 5};
    train_into(job, "cut", &crash);
    char cut[512];
    snprintf(cut, sizeof cut, "%s/cut", tmp);
    hp_train_opts resume = {.threads = 2, .log = stderr, .resume = cut};
    train_into(job, "cut", &resume);
    double a[16], b[16];
    char full[512];
    snprintf(full, sizeof full, "%s/full", tmp);
    cr_assert_eq(hp_th_read_losses(full, a, 16), 8);
    cr_assert_eq(hp_th_read_losses(cut, b, 16), 8);
    for (int i = 0; i < 8; i++)
        cr_expect(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "step %d: %.17g vs %.17g", i + 1, b[i],
                  a[i]);
    hp_th_expect_weights_close(full, cut, 0, 0, "resumed");
    hp_job_free(job);
}

/* A profiled step shows its micro-steps: each one's data slice, and the additions between. */
Test(grad_accum, a_trace_shows_the_micro_steps) {
    hp_job *job = job_of(1, 3, 2);
    int64_t steps[1] = {2};
    hp_train_opts o = {.threads = 1, .log = stderr, .profile_steps = steps, .n_profile_steps = 1};
    train_into(job, "traced", &o);
    char path[600];
    snprintf(path, sizeof path, "%s/traced/traces/step-2-rank-0.json", tmp);
    char *json = hp_th_slurp_or_empty(path);
    int data = 0, adds = 0;
    for (const char *p = json; (p = strstr(p, "\"name\":\"data\"")); p++) data++;
    for (const char *p = json; (p = strstr(p, "\"name\":\"grad_accumulate\"")); p++) adds++;
    cr_expect_eq(data, 3, "data slices: %d", data);
    cr_expect_eq(adds, 3, "grad_accumulate slices: %d", adds);
    free(json);
    hp_job_free(job);
}

/* ---- through hpctl and hp-worker ------------------------------------------------------------ */

#define MODEL                                                                                      \
    "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 96 "        \
    "--vocab 256 --seq 32 --steps 6 --log-interval 1 --lr 5e-4"
#define MARKS "--fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp 'output.*' --fsdp 'norm.*'"

static void run(const char *cmd) {
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "failed (%d): %s", st, cmd);
}

static void cli_train_on(const char *name, const char *flags, const char *worker_flags) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " " MARKS " %s -o %s/%s.pb >/dev/null && "
             "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/%s.pb --threads 1 %s "
             "--out %s/%s >/dev/null",
             hp_th_binary_dir(), flags, tmp, name, hp_th_binary_dir(), tmp, name, worker_flags, tmp,
             name);
    run(cmd);
}

static void cli_train(const char *name, const char *flags) {
    cli_train_on(name, flags, "");
}

/* FSDP at world 2, 1 sequence a rank a micro-step and 3 micro-steps, equals world 1 over the
 * global batch of 6 in one micro-step; a dp=2 job run on 3 ranks keeps its micro-steps. With the
 * bf16 policy its losses follow that run within 1e-3, and its weights those of world 1 with the
 * same micro-steps within bf16 tolerance (measured: 1e-8): against the one-micro-step run the
 * weights differ by up to 2.5% of a tensor's largest element, as much as world 3 without
 * accumulation does (2 sequences a rank: gradients of smaller batches round differently, and
 * AdamW's first steps move an element by about lr whatever its gradient's size). */
Test(grad_accum, fsdp_world_2_with_accumulation_equals_world_1) {
    cli_train("w1", "--batch 6 --mesh dp=1");
    cli_train("w2", "--batch 2 --global-batch 6 --mesh dp=2");
    expect_runs_close("w1", "w2", 1e-5, 1e-4);
    /* the same job run on 3 ranks (hp-worker --world 3: 2 sequences a rank a micro-step) */
    cli_train_on("w3", "--batch 6 --global-batch 12 --mesh dp=2", "--world 3");
    cli_train("w1x2", "--batch 6 --global-batch 12 --mesh dp=1");
    expect_runs_close("w1x2", "w3", 1e-5, 1e-4);
    cli_train("m1", "--batch 6 --mesh dp=1 --param-dtype bf16");
    cli_train("m1x3", "--batch 2 --global-batch 6 --mesh dp=1 --param-dtype bf16");
    cli_train("m2", "--batch 2 --global-batch 6 --mesh dp=2 --param-dtype bf16");
    char a[512], b[512], c[512];
    snprintf(a, sizeof a, "%s/m1", tmp);
    snprintf(b, sizeof b, "%s/m1x3", tmp);
    snprintf(c, sizeof c, "%s/m2", tmp);
    hp_th_expect_losses_close(a, c, 0, 1e-3, "bf16 world 2 with accumulation vs world 1");
    hp_th_expect_losses_close(b, c, 0, 1e-3, "bf16 world 2 vs world 1, both with accumulation");
    hp_th_expect_weights_close(b, c, 0, 2e-2, "bf16 world 2 vs world 1, both with accumulation");
}

Test(grad_accum, hpctl_checks_and_shows_the_global_batch) {
    char cmd[2048];
    /* not a whole number of micro-steps, and too many of them: refused naming the flag */
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --batch 4 --global-batch 6 -o x.pb"), 2,
        "hpctl", "--global-batch: 6 is not a multiple of the batch of a micro-step, 4");
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --batch 1 --global-batch 100000 -o x.pb"),
        2, "hpctl", "--global-batch: 100000 is 100000 micro-steps of 1 sequences; at most 65536");
    /* accepted: inspect and plan say how a step is made */
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " " MARKS " --batch 4 --global-batch 12 --mesh dp=2 -o "
             "%s/ok.pb >/dev/null",
             hp_th_binary_dir(), tmp);
    run(cmd);
    hp_th_run r = hp_th_run_bin(tmp, "client/hpctl", "inspect %s/ok.pb", tmp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "4 x seq 32 per micro-step (2 per rank over 2 data-parallel ranks)"),
              "%s", r.out);
    cr_expect(strstr(r.out, "gradient accumulation: 3 micro-steps an optimizer step, global batch "
                            "12 (384 tokens a step)"),
              "%s", r.out);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "inspect %s/ok.pb --json", tmp);
    cr_expect(strstr(r.out, "\"grad_accum_steps\": 3") && strstr(r.out, "\"global_batch\": 12"),
              "%s", r.out);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "plan %s/ok.pb", tmp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "grad accum ") && strstr(r.out, "= 3 micro-steps x (compute ") &&
                  strstr(r.out, "communication per micro-step per rank"),
              "%s", r.out);
    hp_th_run_free(&r);
    /* the estimate is three micro-steps' and the additions': against a one-micro-step job */
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " " MARKS " --batch 4 --mesh dp=2 -o %s/one.pb "
             ">/dev/null",
             hp_th_binary_dir(), tmp);
    run(cmd);
    hp_th_run a = hp_th_run_bin(tmp, "client/hpctl", "plan %s/one.pb --json", tmp);
    hp_th_run b = hp_th_run_bin(tmp, "client/hpctl", "plan %s/ok.pb --json", tmp);
    cr_assert_eq(a.code, 0, "%s", a.err);
    cr_assert_eq(b.code, 0, "%s", b.err);
    const char *sa = strstr(a.out, "\"step_s\":"), *sb = strstr(b.out, "\"step_s\":");
    const char *ca = strstr(a.out, "\"compute_s\":"), *cb = strstr(b.out, "\"compute_s\":");
    cr_assert(sa && sb && ca && cb);
    double step1 = strtod(sa + 9, NULL), step3 = strtod(sb + 9, NULL);
    double comp1 = strtod(ca + 12, NULL), comp3 = strtod(cb + 12, NULL);
    cr_expect(fabs(comp1 - comp3) <= 1e-12 + 1e-9 * comp1, "a micro-step's compute %g vs %g", comp3,
              comp1);
    cr_expect(step3 > step1 + 2 * comp1, "step %g with 3 micro-steps vs %g with one (compute %g)",
              step3, step1, comp1);
    const char *ma = strstr(a.out, "\"total\":"), *mb = strstr(b.out, "\"total\":");
    const char *ga = strstr(b.out, "\"grad_accum\":");
    cr_assert(ma && mb && ga);
    cr_expect(strtod(ga + 13, NULL) > 0);
    cr_expect_eq(strtod(mb + 8, NULL) - strtod(ma + 8, NULL), strtod(ga + 13, NULL),
                 "the accumulation buffer is what the memory adds");
    hp_th_run_free(&a);
    hp_th_run_free(&b);
}
