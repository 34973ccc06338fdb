/* tests/worker/test_cuda_train.c — whole training runs on the cuda backend: a small Llama
 * (the debugmodel's layout, reduced) trained on cuda equals the same run on the cpu backend
 * within 1e-4 (losses of every step, final weights; with gradient accumulation too; the eval
 * loss of held-out batches), and the debugmodel trains 20 steps on one
 * GPU with the loss falling. With the real binaries, on NCCL: FSDP at world 2 and the Llama TP
 * plan on a dp=2 x tp=2 mesh (one NCCL communicator per mesh dim) equal world 1 within 1e-4,
 * and two ranks on one GPU fail with NCCL's refusal. A cuda job on a machine without a device
 * fails at setup with one line (runs everywhere). GPU runs skip cleanly without a device, or
 * without a GPU a rank (cuda_check.h); on cuemu every rank gets an emulated device. */
#include "cuda_check.h"
#include "tests/util/cli_harness.h"

#include "hp/data.h"
#include "hp/device.h"
#include "hp/job.h"
#include "hp/models.h"
#include "worker/train.h"

#include "tests/util/run_compare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/hp-cuda-train-XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

/* Each test makes its temp dir after its skip check (Criterion runs no .fini after a skip). */
TestSuite(cuda_train, .timeout = 600);

static hp_job *job_of(hp_model_spec spec, int64_t steps, hp_device_kind dev) {
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
    job->resources.device = dev;
    if (dev == HP_DEVICE_CUDA) job->resources.gpus_per_node = 1;
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    return job;
}

static hp_model_spec small_spec(void) {
    hp_model_spec s;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, NULL), HP_OK);
    s.dim = 64, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.ffn_hidden = 96;
    s.vocab = 128, s.batch = 2, s.seq = 32;
    return s;
}

Test(cuda_train, cuda_job_without_a_device_fails_at_setup_with_one_line) {
    char why[200];
    if (cu_present(why, sizeof why)) cr_skip_test("a CUDA device is present");
    setup();
    hp_job *job = job_of(small_spec(), 2, HP_DEVICE_CUDA);
    hp_train_opts o = {.out_dir = tmp, .threads = 1, .log = stderr};
    hp_train_result res;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &o, &res, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "device cuda"), "%s", e.msg);
    cr_assert(strstr(e.msg, hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK ? "no CUDA device"
                                                                           : "without CUDA"),
              "%s", e.msg);
    cr_assert_null(strchr(e.msg, '\n'), "not one line: %s", e.msg);
    cr_assert_eq(res.last_step, 0);
    hp_job_free(job);
    teardown();
}

/* The small Llama 5 steps on cpu and on cuda with parameters in param_dtype: the losses of every
 * step and the final weights agree within tol (relative and absolute). */
static void cuda_vs_cpu_ac(hp_model_spec spec, hp_dtype param_dtype, int64_t global_batch,
                           hp_ac_mode gpu_ac, double loss_tol, double weight_tol) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/cpu", tmp);
    snprintf(b, sizeof b, "%s/cuda", tmp);
    hp_train_result res;
    hp_err e = {0};
    hp_job *cpu = job_of(spec, 5, HP_DEVICE_CPU);
    cpu->plan.param_dtype = param_dtype;
    cpu->train.global_batch = global_batch;
    hp_train_opts oc = {.out_dir = a, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(cpu, &oc, &res, &e), HP_OK, "cpu: %s", e.msg);
    hp_job *gpu = job_of(spec, 5, HP_DEVICE_CUDA);
    gpu->plan.param_dtype = param_dtype;
    gpu->train.global_batch = global_batch;
    gpu->plan.ac_mode = gpu_ac;
    hp_train_opts og = {.out_dir = b, .threads = 2, .log = stderr};
    cr_assert_eq(hp_train(gpu, &og, &res, &e), HP_OK, "cuda: %s", e.msg);
    hp_th_expect_losses_close(a, b, loss_tol, loss_tol, "cuda vs cpu");
    hp_th_expect_weights_close(a, b, weight_tol, weight_tol, "cuda vs cpu");
    hp_job_free(cpu);
    hp_job_free(gpu);
}

static void cuda_vs_cpu(hp_model_spec spec, hp_dtype param_dtype, int64_t global_batch,
                        double loss_tol, double weight_tol) {
    cuda_vs_cpu_ac(spec, param_dtype, global_batch, HP_AC_NONE, loss_tol, weight_tol);
}

Test(cuda_train, small_llama_on_cuda_equals_cpu_within_1e4) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    cuda_vs_cpu(small_spec(), HP_F32, 0, 1e-4, 1e-4);
    teardown();
}

/* Gradient accumulation (three micro-steps a step: the backend's accumulate, the update's
 * 1/3) on cuda equals it on the cpu backend as closely as one micro-step does. */
Test(cuda_train, gradient_accumulation_on_cuda_equals_cpu_within_1e4) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    cuda_vs_cpu(small_spec(), HP_F32, 3 * small_spec().batch, 1e-4, 1e-4);
    teardown();
}

/* Activation checkpointing (the blocks' forward recomputed in the backward, the arena planned
 * for it) on cuda equals the cpu backend without it as closely as a plain step does. */
Test(cuda_train, activation_checkpointing_on_cuda_equals_cpu_within_1e4) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    cuda_vs_cpu_ac(small_spec(), HP_F32, 0, HP_AC_FULL, 1e-4, 1e-4);
    teardown();
}

/* Evaluation (the executor's forward pass on held-out batches) on cuda gives the cpu backend's
 * eval loss within 1e-4. */
Test(cuda_train, evaluation_on_cuda_equals_cpu_within_1e4) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    char shard[512];
    snprintf(shard, sizeof shard, "%s/val.bin", tmp);
    uint32_t tok[3000];
    for (int i = 0; i < 3000; i++) tok[i] = (uint32_t)(i * 7919 % 128);
    hp_err e = {0};
    cr_assert_eq(hp_data_write_shard(shard, tok, 3000, 1, &e), HP_OK, "%s", e.msg);
    double got[2];
    for (int d = 0; d < 2; d++) {
        hp_job *job = job_of(small_spec(), 3, d ? HP_DEVICE_CUDA : HP_DEVICE_CPU);
        job->train.eval_interval = 3;
        job->train.eval_steps = 2;
        snprintf(job->train.eval_data_path, sizeof job->train.eval_data_path, "%s", shard);
        char out[600];
        snprintf(out, sizeof out, "%s/%s", tmp, d ? "cuda" : "cpu");
        hp_train_opts o = {.out_dir = out, .threads = 2, .log = stderr};
        hp_train_result res;
        cr_assert_eq(hp_train(job, &o, &res, &e), HP_OK, "%s", e.msg);
        got[d] = res.last_eval_loss;
        hp_job_free(job);
    }
    cr_expect(isfinite(got[0]) && fabs(got[1] - got[0]) <= 1e-4 * fabs(got[0]),
              "eval loss: cuda %.9g, cpu %.9g", got[1], got[0]);
    teardown();
}

/* The mixed-precision policy (bf16 parameters and compute, f32 gradient reduction and master
 * weights) on cuda against the same policy on the cpu backend: both compute in f32 and round
 * each stored bf16 element once, so they differ by summation order and the rare element that
 * rounds the other way. */
Test(cuda_train, small_llama_bf16_on_cuda_follows_cpu_bf16) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    cuda_vs_cpu(small_spec(), HP_BF16, 0, 1e-2, 2e-2);
    teardown();
}

/* The same with head dim 64, where attention runs on the tensor-core kernels (k_flash.cu), which
 * also round the softmax probabilities to bf16 before P·V, as FlashAttention does. */
Test(cuda_train, small_llama_bf16_flash_attention_follows_cpu_bf16) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    hp_model_spec s = small_spec();
    s.dim = 128, s.n_heads = 2, s.n_kv_heads = 1;
    cuda_vs_cpu(s, HP_BF16, 0, 1e-2, 2e-2);
    teardown();
}

Test(cuda_train, debugmodel_20_steps_loss_falls) {
    CU_SKIP_WITHOUT_DEVICE();
    setup();
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.batch = 8, spec.seq = 256;
#ifdef HP_CUDA_EMU
    /* cuemu runs the kernels as host fibers (~30 s a step at 8 x 256): the same model and
     * 20 steps on 64 tokens a step */
    spec.batch = 2, spec.seq = 32;
#endif
    hp_job *job = job_of(spec, 20, HP_DEVICE_CUDA);
    job->train.lr = 3e-3;
    hp_train_opts o = {.out_dir = tmp, .threads = 2, .log = stderr};
    hp_train_result res;
    hp_err e = {0};
    cr_assert_eq(hp_train(job, &o, &res, &e), HP_OK, "%s", e.msg);
    cr_expect_gt(res.first_loss, 7.0, "first loss %.4f", res.first_loss);
    cr_expect_lt(res.last_loss, res.first_loss - 1.0, "loss %.4f -> %.4f", res.first_loss,
                 res.last_loss);
    hp_job_free(job);
    teardown();
}

/* ---- several ranks, through hpctl and hp-worker -----------------------------------------------
 */

#define MESH_MODEL                                                                                 \
    "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 96 "        \
    "--vocab 256 --batch 4 --seq 32 --steps 6 --log-interval 1 --lr 5e-4 --device cuda "

/* How many GPUs there are for the runs below; on cuemu, makes it `want` emulated ones. */
static int cuda_devices(int want) {
#ifdef HP_CUDA_EMU
    char n[8];
    snprintf(n, sizeof n, "%d", want);
    setenv("HP_CUEMU_DEVICES", n, 1);
#else
    (void)want;
#endif
    return hp_cuda_device_count(NULL, 0);
}

/* Trains `plan` (hpctl new flags) standalone on `devices` GPUs into tmp/out-NAME: its exit. */
static hp_th_run train_mesh(const char *name, const char *plan, int devices) {
    hp_th_run r =
        hp_th_run_bin(tmp, "client/hpctl", "new " MESH_MODEL "%s -o %s/%s.pb", plan, tmp, name);
    cr_assert_eq(r.code, 0, "hpctl new %s: %s", plan, r.err);
    hp_th_run_free(&r);
    cuda_devices(devices);
    return hp_th_run_bin_timeout(tmp, 300, "worker/hp-worker",
                                 "--standalone %s/%s.pb --threads 1 --out %s/out-%s", tmp, name,
                                 tmp, name);
}

static void expect_trains(const char *name, const char *plan, int devices) {
    hp_th_run r = train_mesh(name, plan, devices);
    cr_assert_eq(r.code, 0, "%s: exit %d: %s", name, r.code, r.err);
    hp_th_run_free(&r);
}

Test(cuda_train, fsdp_world_2_and_a_dp2_tp2_mesh_on_nccl_equal_world_1) {
    CU_SKIP_WITHOUT_DEVICE();
    int have = cuda_devices(4);
    if (have < 2) cr_skip_test("needs 2 GPUs, one a rank; this machine has %d", have);
    setup();
    const char *fsdp = "--fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp 'output.*' "
                       "--fsdp 'norm.*' ";
    char plan[512], a[512], b[512];
    snprintf(plan, sizeof plan, "%s--mesh dp=1", fsdp);
    expect_trains("w1", plan, 1);
    snprintf(plan, sizeof plan, "%s--mesh dp=2", fsdp);
    expect_trains("w2", plan, 2);
    snprintf(a, sizeof a, "%s/out-w1", tmp);
    snprintf(b, sizeof b, "%s/out-w2", tmp);
    hp_th_expect_losses_close(a, b, 1e-4, 1e-4, "cuda FSDP world 2");
    hp_th_expect_weights_close(a, b, 1e-4, 1e-4, "cuda FSDP world 2");
    if (have >= 4) { /* dp and tp communicators split from the world's */
        expect_trains("w4", "--fsdp 'layers.*' --mesh dp=2,tp=2 --tp-plan llama --loss-parallel",
                      4);
        snprintf(b, sizeof b, "%s/out-w4", tmp);
        hp_th_expect_losses_close(a, b, 1e-4, 1e-4, "cuda dp=2 x tp=2");
        hp_th_expect_weights_close(a, b, 1e-4, 1e-4, "cuda dp=2 x tp=2");
    } else {
        fprintf(stderr, "cuda_train: dp=2 x tp=2 not run: %d GPUs\n", have);
    }
    teardown();
}

/* NCCL refuses a communicator with two ranks on one device: the run fails at setup with its
 * reason, rather than training two ranks on one GPU. */
Test(cuda_train, two_ranks_on_one_gpu_fail_at_setup) {
    CU_SKIP_WITHOUT_DEVICE();
    if (cuda_devices(1) != 1) cr_skip_test("the machine has more than one GPU");
    setup();
    hp_th_run r = train_mesh("dup", "--fsdp 'layers.*' --mesh dp=2", 1);
    cr_expect_neq(r.code, 0, "two ranks trained on one GPU");
    cr_expect(strstr(r.err, "ncclCommInitRank") &&
                  strstr(r.err, "each rank needs a GPU of its own"),
              "%s", r.err);
    hp_th_run_free(&r);
    teardown();
}

/* HP_CUDA_PROFILE=1: the device-time table per op at the end of the run, then the GEMMs by
 * shape with their TFLOP/s (the rows bench/gpu/torch_gemm.py reads): the small model's output
 * projection, out [128 x 256] = h [128 x 64] . W^T, is one of them. Then HP_CUDA_GEMM_TUNE. */
Test(cuda_train, profile_tables_and_gemm_tuning) {
    CU_SKIP_WITHOUT_DEVICE();
    cuda_devices(1);
    setup();
    hp_th_run r =
        hp_th_run_bin(tmp, "client/hpctl", "new " MESH_MODEL "--steps 2 -o %s/prof.pb", tmp);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
    setenv("HP_CUDA_PROFILE", "1", 1);
    r = hp_th_run_bin_timeout(tmp, 300, "worker/hp-worker",
                              "--standalone %s/prof.pb --threads 1 --out %s/out-prof", tmp, tmp);
    unsetenv("HP_CUDA_PROFILE");
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    const char *ops = strstr(r.err, "cuda profile (HP_CUDA_PROFILE=1)");
    const char *gemms = strstr(r.err, "cuda profile GEMMs by shape");
    cr_assert(ops && gemms && gemms > ops, "no profile tables: %s", r.err);
    cr_expect(strstr(ops, "\n  mm "), "no mm row: %s", ops);
    int found = 0;
    for (const char *l = strchr(gemms, '\n'); l && *l; l = strchr(l + 1, '\n')) {
        long long batch, m, n, k, calls;
        char trans[8], dt[24];
        double ms, tflops;
        if (sscanf(l + 1, " gemm %lld %lld %lld %lld %7s %23s %lld %lf %lf", &batch, &m, &n, &k,
                   trans, dt, &calls, &ms, &tflops) != 9)
            continue;
        cr_expect(calls > 0 && ms > 0 && tflops > 0, "row: %.80s", l + 1);
        found += batch == 1 && m == 128 && n == 256 && k == 64 && !strcmp(trans, "B") &&
                 !strcmp(dt, "f32>f32");
    }
    cr_expect_eq(found, 1, "the output projection's row is missing: %s", gemms);
    hp_th_run_free(&r);

    /* HP_CUDA_GEMM_TUNE=1: each shape's candidates timed once (cuemu offers three, computing
     * alike), the same losses, and a line a tuned shape; the trials stay out of the profile */
    setenv("HP_CUDA_PROFILE", "1", 1);
    setenv("HP_CUDA_GEMM_TUNE", "1", 1);
    r = hp_th_run_bin_timeout(tmp, 300, "worker/hp-worker",
                              "--standalone %s/prof.pb --threads 1 --out %s/out-tuned", tmp, tmp);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
#ifdef HP_CUDA_EMU
    const char *tuned = strstr(r.err, "cuda GEMM tuning (HP_CUDA_GEMM_TUNE=1)");
    cr_assert(tuned, "no tuning report: %s", r.err);
    cr_expect(strstr(tuned, "\n  tune       1     128     256      64 B  f32>f32: first "),
              "the output projection was not tuned: %s", tuned);
#endif /* a device's heuristic may offer one candidate for shapes this small: none to time */
    cr_expect(strstr(r.err, "cuda profile GEMMs by shape"), "%s", r.err);
    hp_th_run_free(&r);
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/out-prof", tmp);
    snprintf(b, sizeof b, "%s/out-tuned", tmp);
    hp_th_expect_losses_close(a, b, 1e-4, 1e-4, "tuned GEMMs");
    setenv("HP_CUDA_GEMM_TUNE", "2", 1); /* neither 0 nor 1: refused */
    r = hp_th_run_bin_timeout(tmp, 300, "worker/hp-worker",
                              "--standalone %s/prof.pb --threads 1 --out %s/out-bad", tmp, tmp);
    unsetenv("HP_CUDA_GEMM_TUNE");
    unsetenv("HP_CUDA_PROFILE");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "HP_CUDA_GEMM_TUNE must be 0 or 1, not '2'"), "%s", r.err);
    hp_th_run_free(&r);
    setenv("HP_CUDA_FLASH_ROWS", "24", 1); /* the forward attention's rows a warp: 16 or 32 */
    r = hp_th_run_bin_timeout(tmp, 300, "worker/hp-worker",
                              "--standalone %s/prof.pb --threads 1 --out %s/out-bad", tmp, tmp);
    unsetenv("HP_CUDA_FLASH_ROWS");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "HP_CUDA_FLASH_ROWS must be 16 or 32, not '24'"), "%s", r.err);
    hp_th_run_free(&r);
    teardown();
}
