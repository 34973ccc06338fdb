/* Tensor parallelism end to end, with the real binaries: a tiny Llama-3 with grouped-query
 * attention (4 heads, 2 kv heads) trained 10 steps with torchtitan's TP plan at tp=2 and on a
 * dp=2 x tp=2 mesh gives the losses and final weights of world 1 over the same global batch,
 * within 1e-5. */
#include "tests/util/run_compare.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
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
#define TOL 1e-5

static void run(const char *cmd) {
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "failed (%d): %s", st, cmd);
}

/* Trains `name` with plan flags `plan` into tmp/name; the run's directory. */
static const char *train(const char *name, const char *plan) {
    static char out[512];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/client/hpctl new " MODEL " %s -o %s/%s.pb >/dev/null",
             HP_BINARY_DIR, plan, tmp, name);
    run(cmd);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    snprintf(cmd, sizeof cmd,
             "HP_CPU_PEAK_FLOPS=1e11 %s/worker/hp-worker --standalone %s/%s.pb --threads 1 "
             "--out %s >/dev/null",
             HP_BINARY_DIR, tmp, name, out);
    run(cmd);
    return out;
}

static void expect_world1(const char *name, const char *plan) {
    char ref[512], got[512];
    snprintf(ref, sizeof ref, "%s", train("w1", ""));
    snprintf(got, sizeof got, "%s", train(name, plan));
    hp_th_expect_losses_close(ref, got, TOL, name);
    hp_th_expect_weights_close(ref, got, TOL, name);
}

Test(tp_train, tp2_equals_world1) {
    expect_world1("tp2", "--mesh tp=2 --tp-plan llama");
}

Test(tp_train, dp2_tp2_equals_world1) {
    expect_world1("dp2tp2", "--mesh dp=2,tp=2 --tp-plan llama");
}
