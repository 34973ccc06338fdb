/* Tensor parallelism end to end, with the real binaries: a tiny Llama-3 with grouped-query
 * attention (4 heads, 2 kv heads) trained 10 steps with torchtitan's TP plan gives the losses
 * and final weights of world 1 over the same global batch, within 1e-5: at tp=2 and on a
 * dp=2 x tp=2 mesh, with loss parallel off and on, and with FSDP over dp (parameters stored
 * split over dp, gathered before use) with and without resharding after the forward. A
 * checkpoint written at step 5 on dp=2 x tp=2 resumes at dp=4 (FSDP) and at world 1 and ends
 * where the uninterrupted world-1 run does. Under the bf16 mixed-precision policy, tp=2 and
 * dp=2 x tp=2 with FSDP (with loss parallel too) equal world 1 under the same policy within bf16
 * tolerance. Auto-sharded plans on dp=2 x tp=2 too. dp=2 x tp=2 over the tcp communicator equals
 * the shm run bit for bit. */
#include "tests/util/cli_harness.h"
#include "tests/util/run_compare.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/hp-tp-XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tp_train, .init = setup, .fini = teardown, .timeout = 600);

#define MODEL                                                                                      \
    "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 96 "        \
    "--vocab 256 --batch 4 --seq 32 --steps 10 --log-interval 1 --lr 5e-4"
#define FSDP "--fsdp layers --fsdp tok_embeddings --fsdp output --fsdp norm"
#define TOL  1e-5

static void run(const char *cmd) {
    fflush(stdout);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "failed (%d): %s", st, cmd);
}

/* Trains `name` with plan flags `plan` into tmp/name; the run's directory. */
static const char *train(const char *name, const char *plan) {
    static char out[512];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/client/hpctl new " MODEL " %s -o %s/%s.pb >/dev/null",
             hp_th_binary_dir(), plan, tmp, name);
    run(cmd);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    snprintf(cmd, sizeof cmd,
             "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/%s.pb --threads 1 "
             "--out %s >/dev/null",
             hp_th_binary_dir(), tmp, name, out);
    run(cmd);
    return out;
}

static void expect_world1(const char *name, const char *plan) {
    char ref[512], got[512];
    snprintf(ref, sizeof ref, "%s", train("w1", ""));
    snprintf(got, sizeof got, "%s", train(name, plan));
    hp_th_expect_losses_close(ref, got, TOL, 0, name);
    hp_th_expect_weights_close(ref, got, TOL, 0, name);
}

Test(tp_train, tp2_equals_world1) {
    expect_world1("tp2", "--mesh tp=2 --tp-plan llama");
}

Test(tp_train, dp2_tp2_equals_world1) {
    expect_world1("dp2tp2", "--mesh dp=2,tp=2 --tp-plan llama");
}

Test(tp_train, loss_parallel_tp2_equals_world1) {
    expect_world1("lp", "--mesh tp=2 --tp-plan llama --loss-parallel");
}

Test(tp_train, loss_parallel_dp2_tp2_equals_world1) {
    expect_world1("dplp", "--mesh dp=2,tp=2 --tp-plan llama --loss-parallel");
}

Test(tp_train, fsdp_dp2_tp2_equals_world1) {
    expect_world1("fsdptp", "--mesh dp=2,tp=2 --tp-plan llama " FSDP);
}

Test(tp_train, fsdp_dp2_tp2_no_reshard_loss_parallel_equals_world1) {
    expect_world1(
        "fsdptplp",
        "--mesh dp=2,tp=2 --tp-plan llama --loss-parallel --no-reshard-after-forward " FSDP);
}

/* Auto-sharding's plans (the ILP chooses every placement; docs/autoshard.md) compute what
 * world 1 does: with a budget that makes it split every parameter over dp and tp, and without
 * one (the h100 profile's figures are fixed: the same plan on every machine). */
Test(tp_train, auto_dp2_tp2_with_a_budget_equals_world1) {
    expect_world1("auto22b",
                  "--mesh dp=2,tp=2 --mode auto --device-profile h100 --param-memory-budget 0,0.3");
}

Test(tp_train, auto_dp2_tp2_equals_world1) {
    expect_world1("auto22", "--mesh dp=2,tp=2 --mode auto --device-profile h100");
}

/* --tp-plan and --fsdp in auto mode: the plan's tp placements and FSDP over dp fixed, the
 * solver choosing the rest */
Test(tp_train, auto_with_tp_plan_and_fsdp_equals_world1) {
    expect_world1("auto22tf", "--mesh dp=2,tp=2 --mode auto --device-profile h100 --tp-plan llama "
                              "--loss-parallel " FSDP);
}

/* Resumes the checkpoint of step 5 in `from` under plan `plan` into tmp/name. */
static const char *resume(const char *from, const char *name, const char *plan) {
    static char out[512];
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/%s-ck/checkpoints && cp -r %s/checkpoints/step-00000005 "
             "%s/%s-ck/checkpoints/",
             tmp, name, from, tmp, name);
    run(cmd);
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new " MODEL " --checkpoint-interval 5 %s -o %s/%s.pb >/dev/null",
             hp_th_binary_dir(), plan, tmp, name);
    run(cmd);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    snprintf(cmd, sizeof cmd,
             "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/%s.pb --threads 1 "
             "--resume %s/%s-ck --out %s >/dev/null",
             hp_th_binary_dir(), tmp, name, tmp, name, out);
    run(cmd);
    return out;
}

/* The resumed run logged steps 6..10: equal to the last five of the reference. */
static void expect_resumed(const char *ref, const char *got, const char *what) {
    double a[16], b[16];
    cr_assert_eq(hp_th_read_losses(ref, a, 16), 10);
    cr_assert_eq(hp_th_read_losses(got, b, 16), 5, "%s: steps after the resume", what);
    for (int i = 0; i < 5; i++)
        cr_expect(fabs(a[5 + i] - b[i]) <= TOL, "%s: step %d: loss %.9g vs %.9g", what, 6 + i, b[i],
                  a[5 + i]);
    hp_th_expect_weights_close(ref, got, TOL, 0, what);
}

Test(tp_train, checkpoint_at_dp2_tp2_resumes_at_dp4_and_world1) {
    char ref[512], mesh[512];
    snprintf(ref, sizeof ref, "%s", train("w1", "--checkpoint-interval 5"));
    snprintf(mesh, sizeof mesh, "%s",
             train("ck22", "--checkpoint-interval 5 --mesh dp=2,tp=2 --tp-plan llama " FSDP));
    expect_resumed(ref, resume(mesh, "r4", "--mesh dp=4 " FSDP), "dp=4 from dp=2,tp=2");
    expect_resumed(ref, resume(mesh, "r1", ""), "world 1 from dp=2,tp=2");
}

/* --param-dtype bf16 on placed plans: casts keep their input's placements, the all-reduces of
 * Partial activations and of gradients run in f32 (reduce_dtype). Measured: losses within
 * 2e-4 relative, weights within 1.6% of each tensor's largest element. */
static void expect_world1_bf16(const char *name, const char *plan) {
    char ref[512], got[512], flags[512];
    snprintf(ref, sizeof ref, "%s", train("w1bf16", "--param-dtype bf16"));
    snprintf(flags, sizeof flags, "%s --param-dtype bf16", plan);
    snprintf(got, sizeof got, "%s", train(name, flags));
    hp_th_expect_losses_close(ref, got, 0, 1e-3, name);
    hp_th_expect_weights_close(ref, got, 0, 3e-2, name);
}

Test(tp_train, bf16_tp2_and_dp2_tp2_fsdp_equal_world1) {
    expect_world1_bf16("tp2bf16", "--mesh tp=2 --tp-plan llama");
    expect_world1_bf16("dp2tp2bf16", "--mesh dp=2,tp=2 --tp-plan llama " FSDP);
}

/* Loss parallel under the policy: the vocab-sharded cross entropy runs in f32 from the logits'
 * cast (passes/loss_parallel.c), as the fused one does at world 1. */
Test(tp_train, bf16_loss_parallel_equals_world1) {
    expect_world1_bf16("lpbf16", "--mesh dp=2,tp=2 --tp-plan llama --loss-parallel " FSDP);
}

/* dp=2 x tp=2 with FSDP over the tcp communicator (its mesh groups are tcp splits) logs the
 * shm run's losses and leaves its weights, bit for bit. */
Test(tp_train, dp2_tp2_over_tcp_equals_shm_bitwise) {
    char shm[512], cmd[2048];
    snprintf(shm, sizeof shm, "%s", train("m22", "--mesh dp=2,tp=2 --tp-plan llama " FSDP));
    snprintf(cmd, sizeof cmd,
             "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/m22.pb --threads 1 "
             "--comm-backend tcp --out %s/m22tcp >/dev/null",
             hp_th_binary_dir(), tmp, tmp);
    run(cmd);
    char tcp[512];
    snprintf(tcp, sizeof tcp, "%s/m22tcp", tmp);
    double a[16], b[16];
    cr_assert_eq(hp_th_read_losses(shm, a, 16), 10);
    cr_assert_eq(hp_th_read_losses(tcp, b, 16), 10);
    for (int i = 0; i < 10; i++)
        cr_expect(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "step %d: shm %.17g, tcp %.17g", i + 1,
                  a[i], b[i]);
    hp_th_expect_weights_close(shm, tcp, 0, 0, "dp2 x tp2 over tcp");
}
