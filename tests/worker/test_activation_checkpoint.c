/* Activation checkpointing (plan.ac_mode, hpctl new --ac full|selective [--ac-every N]; the
 * activation_checkpoint pass): the backward recomputes the repeated blocks' forward instead of
 * keeping it, and nothing else changes.
 *
 * The pass alone: on the tiny Llama's joint graph every output (loss and gradients) is bit for
 * bit the input graph's on the reference evaluator, in full and selective mode, every block or
 * every other; the copies come after the loss, are of the blocks' nodes only (no embedding,
 * final norm or output projection), selective copies no matrix product or attention, and a
 * graph without blocks is left alone. Compiled: the activation arena shrinks (full below
 * selective below none) while the FLOPs grow, and `hpctl plan` says what is recomputed.
 * Trained: runs with and without checkpointing end on the same bits (losses and weights) at
 * world 1, FSDP world 2 with the bf16 policy, tp=2, and on an exported-style graph with dropout
 * in its blocks (the copies draw the forward's masks again). hpctl refuses what cannot work. */
#include "tests/util/cli_harness.h"
#include "tests/util/run_compare.h"
#include "tests/util/train_fixture.h"

#include "hp/eval.h"
#include "hp/job.h"
#include "hp/models.h"
#include "hp/passes.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmp[256];

static void setup(void) {
    hp_th_tmpdir_make(tmp, sizeof tmp, "hp-ac");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmp);
}

TestSuite(activation_checkpoint, .init = setup, .fini = teardown, .timeout = 600);

/* ---- the pass on the reference evaluator ---------------------------------------------------- */

static hp_graph *tiny_joint(int64_t layers) {
    hp_model_spec s = hp_th_tiny_spec(2);
    s.n_layers = layers;
    hp_graph *g = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_model_build_joint(&s, &g, &e), HP_OK, "%s", e.msg);
    return g;
}

/* Uniform in [lo, hi) from a fixed 64-bit LCG seeded by seed. */
static void rand_fill(double *x, int64_t n, uint64_t seed, double lo, double hi) {
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (double)(s >> 11) / 9007199254740992.0;
    }
}

/* Random parameters (small; every third around 1, as norm weights), tokens and labels in the
 * vocabulary. */
static void feeds(const hp_graph *g, hp_tensor *in, int n) {
    for (int i = 0; i < n; i++) {
        hp_err e = {0};
        cr_assert_eq(hp_tensor_alloc(&in[i], g->nodes[i].out[0], &e), HP_OK, "%s", e.msg);
        int64_t k = hp_type_numel(&in[i].type);
        double *x = malloc((size_t)(k ? k : 1) * sizeof *x);
        bool ints = in[i].type.dtype == HP_I64;
        rand_fill(x, k, 1234 + (uint64_t)i, ints ? 0 : -0.2, ints ? 127.99 : 0.2);
        for (int64_t j = 0; j < k; j++) {
            if (ints)
                ((int64_t *)in[i].data)[j] = (int64_t)x[j];
            else if (in[i].type.dtype == HP_F32)
                ((float *)in[i].data)[j] = (float)(x[j] + (i % 3 == 0 ? 1.0 : 0.0));
        }
        free(x);
    }
}

static void eval_all(const hp_graph *g, const hp_tensor *in, int n_in, hp_tensor *out) {
    hp_err e = {0};
    hp_eval_opts o = {.precision = HP_EVAL_F32, .seed = 7, .step = 1};
    cr_assert_eq(hp_eval(g, in, n_in, &o, out, &e), HP_OK, "%s", e.msg);
}

static int count_inputs(const hp_graph *g) {
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    return gi.n_params + gi.n_buffers + gi.n_data;
}

/* The nodes after the loss that read a parameter whose FQN starts with prefix. */
static int backward_readers(const hp_graph *g, const char *prefix) {
    int n = 0, loss = g->outputs[0].node;
    for (int i = loss + 1; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            const hp_attr *f = hp_node_attr(&g->nodes[g->nodes[i].in[k].node], HP_ATTR_FQN);
            n += g->nodes[g->nodes[i].in[k].node].op == HP_OP_PLACEHOLDER && f && f->s &&
                 !strncmp(f->s, prefix, strlen(prefix));
        }
    return n;
}

static int count_op_after_loss(const hp_graph *g, hp_op op) {
    int n = 0;
    for (int i = g->outputs[0].node + 1; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

Test(activation_checkpoint, outputs_are_the_input_graphs_bit_for_bit) {
    hp_graph *g = tiny_joint(4);
    int n_in = count_inputs(g);
    hp_tensor in[64] = {0}, want[64] = {0};
    cr_assert_leq(n_in, 64);
    cr_assert_leq(g->n_outputs, 64);
    feeds(g, in, n_in);
    eval_all(g, in, n_in, want);
    const struct {
        hp_ac_mode mode;
        int every, blocks;
    } cases[] = {{HP_AC_FULL, 1, 4},
                 {HP_AC_SELECTIVE, 1, 4},
                 {HP_AC_FULL, 2, 2},
                 {HP_AC_SELECTIVE, 3, 1},
                 {HP_AC_FULL, 5, 0}};
    int recomputed[5] = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hp_pass_report r = {0};
        hp_graph *h = NULL;
        hp_err e = {0};
        cr_assert_eq(hp_activation_checkpoint(g, cases[c].mode, cases[c].every, &r, &h, &e), HP_OK,
                     "%s", e.msg);
        cr_expect_eq(r.ac_blocks, cases[c].blocks, "case %zu: %d blocks", c, r.ac_blocks);
        recomputed[c] = r.ac_recomputed;
        cr_expect_eq(h->n_nodes, g->n_nodes + r.ac_recomputed, "case %zu", c);
        cr_assert_eq(hp_graph_verify(h, &e), HP_OK, "case %zu: %s", c, e.msg);
        /* the head and the embedding are never recomputed: their parameters are read by the
         * backward exactly as often as before */
        const char *heads[3] = {"output.", "norm.", "tok_embeddings."};
        for (int k = 0; k < 3; k++)
            cr_expect_eq(backward_readers(h, heads[k]), backward_readers(g, heads[k]),
                         "case %zu: %s read again", c, heads[k]);
        if (cases[c].mode == HP_AC_SELECTIVE) {
            cr_expect_eq(count_op_after_loss(h, HP_OP_MM), count_op_after_loss(g, HP_OP_MM),
                         "case %zu: selective recomputed a matrix product", c);
            cr_expect_eq(count_op_after_loss(h, HP_OP_SDPA), count_op_after_loss(g, HP_OP_SDPA));
        } else if (cases[c].blocks) {
            /* full: every checkpointed block's attention and 6 of its 7 products run again
             * (not w2, whose output only the block's last residual add reads) */
            cr_expect_eq(count_op_after_loss(h, HP_OP_SDPA), cases[c].blocks);
            cr_expect_eq(count_op_after_loss(h, HP_OP_MM) - count_op_after_loss(g, HP_OP_MM),
                         6 * cases[c].blocks, "case %zu: %d more products", c,
                         count_op_after_loss(h, HP_OP_MM) - count_op_after_loss(g, HP_OP_MM));
        }
        hp_tensor got[64] = {0};
        eval_all(h, in, n_in, got);
        for (int o = 0; o < g->n_outputs; o++) {
            size_t bytes = (size_t)hp_type_numel(&want[o].type) * hp_dtype_size(want[o].type.dtype);
            cr_expect(hp_type_eq(&got[o].type, &want[o].type) &&
                          !memcmp(got[o].data, want[o].data, bytes),
                      "case %zu: output %d differs", c, o);
            hp_tensor_free(&got[o]);
        }
        hp_graph_free(h);
    }
    cr_expect_gt(recomputed[0], recomputed[1], "full %d vs selective %d copies", recomputed[0],
                 recomputed[1]);
    cr_expect_gt(recomputed[1], 0);
    cr_expect_eq(recomputed[4], 0);
    for (int i = 0; i < n_in; i++) hp_tensor_free(&in[i]);
    for (int o = 0; o < g->n_outputs; o++) hp_tensor_free(&want[o]);
    hp_graph_free(g);
}

/* ---- compiled: memory and FLOPs ------------------------------------------------------------- */

static void set_mode(hp_job *job, hp_ac_mode m) {
    job->plan.ac_mode = m;
}

Test(activation_checkpoint, the_arena_shrinks_and_the_flops_grow) {
    hp_job *job = hp_th_tiny_job(4, 0, 2, NULL);
    job->model.n_layers = 4;
    hp_graph_free(job->graph);
    job->graph = tiny_joint(4);
    hp_err e = {0};
    int64_t act[3];
    double flops[3];
    for (int m = 0; m < 3; m++) {
        set_mode(job, (hp_ac_mode)m);
        hp_compiled *c = NULL;
        cr_assert_eq(hp_compile(job, 1, &c, &e), HP_OK, "%s", e.msg);
        act[m] = c->memory.activations;
        flops[m] = c->cost.flops;
        bool ran = false;
        for (int i = 0; i < c->n_passes; i++)
            if (!strcmp(c->passes[i].name, "activation_checkpoint")) {
                ran = c->passes[i].ran;
                if (m != HP_AC_NONE) cr_expect_eq(c->passes[i].ac_blocks, 4);
            }
        cr_expect_eq(ran, m != HP_AC_NONE, "mode %d: the pass ran %d", m, ran);
        hp_compiled_free(c);
    }
    cr_expect_lt(act[HP_AC_FULL], act[HP_AC_SELECTIVE], "full %lld selective %lld",
                 (long long)act[HP_AC_FULL], (long long)act[HP_AC_SELECTIVE]);
    cr_expect_lt(act[HP_AC_SELECTIVE], act[HP_AC_NONE], "selective %lld none %lld",
                 (long long)act[HP_AC_SELECTIVE], (long long)act[HP_AC_NONE]);
    cr_expect_gt(flops[HP_AC_FULL], flops[HP_AC_NONE]);
    cr_expect_eq(flops[HP_AC_SELECTIVE], flops[HP_AC_NONE], "selective recomputes no product");
    hp_job_free(job);
}

/* ---- trained: the same bits ----------------------------------------------------------------- */

#define MODEL                                                                                      \
    "--model llama3:debugmodel --dim 64 --layers 3 --heads 4 --kv-heads 2 --ffn-hidden 96 "        \
    "--vocab 256 --seq 32 --steps 4 --log-interval 1 --lr 1e-3"

static void run(const char *cmd) {
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "failed (%d): %s", st, cmd);
}

/* hpctl new SOURCE FLAGS, then hp-worker into tmp/name. */
static void train(const char *name, const char *source, const char *flags) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new %s %s -o %s/%s.pb >/dev/null && "
             "%s/worker/hp-worker --standalone %s/%s.pb --threads 1 --out %s/%s >/dev/null",
             hp_th_binary_dir(), source, flags, tmp, name, hp_th_binary_dir(), tmp, name, tmp,
             name);
    run(cmd);
}

static void expect_same_bits(const char *a, const char *b) {
    char pa[512], pb[512], cmd[1200];
    snprintf(pa, sizeof pa, "%s/%s", tmp, a);
    snprintf(pb, sizeof pb, "%s/%s", tmp, b);
    hp_th_expect_losses_close(pa, pb, 0, 0, b);
    snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", pa, pb);
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: the weights differ from %s's", b, a);
}

Test(activation_checkpoint, training_ends_on_the_same_bits) {
    const char *plans[3] = {"", "--mesh dp=2 --fsdp 'layers.*' --param-dtype bf16 --batch 4",
                            "--mesh tp=2 --tp-plan llama --loss-parallel"};
    for (int p = 0; p < 3; p++) {
        char none[32], full[32], sel[32], flags[512];
        snprintf(none, sizeof none, "p%d-none", p);
        snprintf(full, sizeof full, "p%d-full", p);
        snprintf(sel, sizeof sel, "p%d-selective", p);
        train(none, MODEL, plans[p]);
        snprintf(flags, sizeof flags, "%s --ac full", plans[p]);
        train(full, MODEL, flags);
        snprintf(flags, sizeof flags, "%s --ac selective --ac-every 2", plans[p]);
        train(sel, MODEL, flags);
        expect_same_bits(none, full);
        expect_same_bits(none, sel);
    }
}

/* Two blocks, b0 and b1 (FQN prefixes), of mm, tanh and dropout (p = 0.3) with a residual
 * add, between an embedding and an output projection: tmp/name, its path in path. */
static void write_blocks_graph(char *path, size_t len, const char *name, const char *b0,
                               const char *b1) {
    snprintf(path, len, "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f,
            "hpir 1\n"
            "%%0: f32[32,16] = placeholder() {kind=param, fqn=\"emb.weight\", "
            "init=normal(0,1)}\n"
            "%%1: f32[16,16] = placeholder() {kind=param, fqn=\"%s.w\", "
            "init=normal(0,0.3)}\n"
            "%%2: f32[16,16] = placeholder() {kind=param, fqn=\"%s.w\", "
            "init=normal(0,0.3)}\n"
            "%%3: f32[16,32] = placeholder() {kind=param, fqn=\"out.weight\", "
            "init=normal(0,0.3)}\n"
            "%%4: i64[4,8] = placeholder() {kind=data, fqn=\"tokens\"}\n"
            "%%5: i64[4,8] = placeholder() {kind=data, fqn=\"labels\"}\n"
            "%%6: f32[4,8,16] = embedding(%%0, %%4)\n"
            "%%7: f32[32,16] = view(%%6) {shape=[32,16]}\n"
            "%%8: f32[32,16] = mm(%%7, %%1)\n"
            "%%9: f32[32,16] = tanh(%%8)\n"
            "%%10: (f32[32,16], bool[32,16]) = native_dropout(%%9) {p=0.3, "
            "fqn=\"%s.drop\"}\n"
            "%%11: f32[32,16] = add(%%7, %%10)\n"
            "%%12: f32[32,16] = mm(%%11, %%2)\n"
            "%%13: f32[32,16] = tanh(%%12)\n"
            "%%14: (f32[32,16], bool[32,16]) = native_dropout(%%13) {p=0.3, "
            "fqn=\"%s.drop\"}\n"
            "%%15: f32[32,16] = add(%%11, %%14)\n"
            "%%16: f32[32,32] = mm(%%15, %%3)\n"
            "%%17: f32[32,32] = _log_softmax(%%16) {dim=1}\n"
            "%%18: i64[32] = view(%%5) {shape=[32]}\n"
            "%%19: (f32[], f32[]) = nll_loss_forward(%%17, %%18) {reduction=1, "
            "ignore_index=-100}\n"
            "return %%19\n",
            b0, b1, b0, b1);
    fclose(f);
}

/* Two blocks with dropout (p = 0.3) in each, as an exported GPT-2's: the recomputed dropout
 * draws the forward's mask, so the gradients are the ones without checkpointing, at world 1
 * and on two ranks (each its batch slice of the masks). */
Test(activation_checkpoint, recomputed_dropout_draws_the_same_mask) {
    char path[600];
    write_blocks_graph(path, sizeof path, "drop.hpir", "layers.0", "layers.1");
    char src[700];
    snprintf(src, sizeof src, "--graph %s --steps 3 --log-interval 1 --lr 1e-2", path);
    train("d-none", src, "");
    train("d-full", src, "--ac full");
    expect_same_bits("d-none", "d-full");
    train("d2-none", src, "--mesh dp=2");
    train("d2-full", src, "--mesh dp=2 --ac full");
    expect_same_bits("d2-none", "d2-full");
    /* the plan names the two blocks */
    hp_th_run r = hp_th_run_bin(tmp, "client/hpctl", "plan %s/d-full.pb", tmp);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "activation_checkpoint: the backward recomputes 2 blocks' forward "
                            "(full)"),
              "%s", r.out);
    hp_th_run_free(&r);
}

/* A graph whose parameters name no repeated block: --ac full recomputes nothing, and the plan
 * says so rather than accepting the flag in silence. */
Test(activation_checkpoint, a_graph_without_blocks_gets_a_warning) {
    char path[600];
    write_blocks_graph(path, sizeof path, "flat.hpir", "first", "second");
    hp_th_run r =
        hp_th_run_bin(tmp, "client/hpctl", "new --graph %s --ac full -o %s/flat.pb", path, tmp);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "plan %s/flat.pb", tmp);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "activation_checkpoint: the graph has no repeated blocks"), "%s",
              r.out);
    cr_expect(!strstr(r.out, "the backward recomputes"), "%s", r.out);
    hp_th_run_free(&r);
}

/* ---- hpctl ---------------------------------------------------------------------------------- */

/* hpctl new NEW_ARGS -o tmp/NAME.pb, then hpctl plan [--json] on it: the plan's output (free). */
static char *plan_of(const char *new_args, const char *name, bool json) {
    hp_th_run r = hp_th_run_bin(tmp, "client/hpctl", "new %s -o %s/%s.pb", new_args, tmp, name);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "plan %s%s/%s.pb", json ? "--json " : "", tmp, name);
    cr_assert_eq(r.code, 0, "%s", r.err);
    char *out = r.out;
    r.out = NULL;
    hp_th_run_free(&r);
    return out;
}

/* The plan compares a rank's memory with what the profile's device holds; over it, it prices
 * the checkpointing modes that would need less (the 8B on one H100 needs about 196 GiB; full
 * checkpointing takes 64 GiB of activations off it, still too much). */
Test(activation_checkpoint, the_plan_says_what_fits_the_device) {
    char *out = plan_of("--model llama3:8B --device-profile h100", "big", false);
    cr_expect(strstr(out, "  device           79.6 GiB   the profile's GPU memory: 246% used"),
              "%s", out);
    cr_expect(strstr(out, "more than the h100 device holds (79.6 GiB); activation "
                          "checkpointing would need: --ac selective 173.9 GiB (over too), "
                          "--ac full 131.9 GiB (over too)"),
              "%s", out);
    free(out);
    out = plan_of("--model llama3:8B --device-profile h100", "big", true);
    cr_expect(strstr(out, "\"fits\": false") && strstr(out, "\"total_with_ac\""), "%s", out);
    free(out);
    /* the tiny job fits this host's RAM: no note, nothing priced twice */
    out = plan_of(MODEL, "small", false);
    cr_expect(strstr(out, "a rank's share of this host's RAM"), "%s", out);
    cr_expect(!strstr(out, "note: a rank needs"), "%s", out);
    free(out);
}

/* --ac auto: the fastest of none, selective and full every 4th, 2nd or every block that fits
 * 90% of the profile's memory. The 8B at dp=8 and one sequence a rank on H100s needs 106.6 GiB
 * without checkpointing, 84.6 selective, 90.6 and 74.4 every 4th and 2nd block: only full (43.2)
 * fits 71.6; the tiny job fits as it is and compiles once; a batch no mode fits gets the
 * smallest and a warning. Through the library too: hp_compile reports the choice. */
Test(activation_checkpoint, auto_picks_the_fastest_mode_that_fits) {
#define BIG "--model llama3:8B --mesh dp=8 --fsdp 'layers.*' --device cuda --device-profile h100 "
    char *out = plan_of(BIG "--ac auto --batch 8", "a8", false);
    cr_expect(strstr(out, "--ac auto chose full: the shortest estimated step within 90% of the "
                          "h100 profile's 79.6 GiB"),
              "%s", out);
    cr_expect(strstr(out, "the backward recomputes 32 blocks' forward (full)"), "%s", out);
    free(out);
    out = plan_of(BIG "--ac auto --batch 64", "a64", true);
    cr_expect(strstr(out, "auto: no mode fits 90% of the h100 profile's 79.6 GiB a rank; the "
                          "smallest, full every 1"),
              "%s", out);
    cr_expect(strstr(out, "\"activation_checkpoint_auto\"") && strstr(out, "\"fits\": false"), "%s",
              out);
    free(out);
#undef BIG

    /* the tiny job on this host: none fits, one compile, the pass does not run */
    hp_job *job = hp_th_tiny_job(2, 0, 2, NULL);
    job->plan.ac_mode = HP_AC_AUTO;
    hp_compiled *c = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_compile(job, 1, &c, &e), HP_OK, "%s", e.msg);
    cr_expect(c->ac_auto && c->ac_fits);
    cr_expect_eq(c->ac_mode, HP_AC_NONE);
    for (int i = 0; i < c->n_passes; i++)
        if (!strcmp(c->passes[i].name, "activation_checkpoint")) cr_expect(!c->passes[i].ran);
    hp_compiled_free(c);
    hp_job_free(job);
}

Test(activation_checkpoint, hpctl_shows_it_and_refuses_what_cannot_work) {
    hp_th_run r = hp_th_run_bin(tmp, "client/hpctl",
                                "new " MODEL " --ac selective --ac-every 2 "
                                "-o %s/j.pb",
                                tmp);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "inspect %s/j.pb", tmp);
    cr_expect(strstr(r.out, "activation checkpointing selective, every 2-th block"), "%s", r.out);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "inspect --json %s/j.pb", tmp);
    cr_expect(strstr(r.out, "\"mode\": \"selective\"") && strstr(r.out, "\"every\": 2"), "%s",
              r.out);
    hp_th_run_free(&r);
    r = hp_th_run_bin(tmp, "client/hpctl", "plan --json %s/j.pb", tmp);
    cr_expect(strstr(r.out, "\"ac_blocks\": 1"), "%s", r.out);
    hp_th_run_free(&r);
    hp_th_expect_cli_error(hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --ac most -o j.pb"), 2,
                           "hpctl", "'most' is not one of none, full, selective");
    hp_th_expect_cli_error(hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --ac-every 2 -o j.pb"),
                           2, "hpctl", "with mode none checkpoints nothing");
    hp_th_expect_cli_error(
        hp_th_run_bin(tmp, "client/hpctl", "new " MODEL " --ac full --ac-every 0 -o j.pb"), 2,
        "hpctl", "--ac-every");
}
