/* tests/client/test_hp_export.c — bring your own PyTorch model: a GPT-2-style model written in
 * tests/client/export_ref.py (learned positions, LayerNorm with bias, GELU-tanh MLP, causal
 * attention with a mask, weight-tied lm_head) is exported by hp_export both ways (make_fx of
 * the joint step, and the forward with hp's autodiff), checked by `hpctl inspect`, and trained
 * 10 steps by `hp-worker --standalone` from the same weights and tokens as PyTorch's own AdamW
 * run: every loss within 1e-4 relative, the final weights within 1e-4. The same at world 2
 * with FSDP. With dropout (p = 0.1) the world-2 FSDP run drops what the world-1 run drops. A
 * model with a ConvTranspose2d fails the export with one message listing what hp lacks. */
#include "hp/base.h"
#include "hp/checkpoint.h"
#include "hp/data.h"

#include "tests/util/cli_harness.h"
#include "tests/util/run_compare.h"
#include "tests/worker/cuda_check.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define B     4
#define T     16
#define V     64
#define STEPS 10

static char dir[256];

static void setup(void) {
    hp_th_tmpdir_make(dir, sizeof dir, "hp-export");
}
static void teardown(void) {
    hp_th_tmpdir_remove(dir);
}

TestSuite(hp_export, .init = setup, .fini = teardown, .timeout = 600);

/* /usr/bin/python3 tests/client/export_ref.py ARGS with $HPCTL set, output to dir/py.out;
 * the exit status. */
static int ref(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "HPCTL='%s/client/hpctl' /usr/bin/python3 '%s/tests/client/export_ref.py' %s "
             ">'%s/py.out' 2>&1",
             hp_th_binary_dir(), hp_th_source_dir(), args, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ref(args), which must succeed; `what` names the step in the failure, with py.out. */
static void ref_ok(const char *args, const char *what) {
    int rc = ref(args);
    cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
    char out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    cr_assert_eq(rc, 0, "%s failed:\n%s", what, hp_th_slurp_or_empty(out));
}

/* exactly B windows of T+1 tokens: every step's batch is the same samples */
static void write_tokens(void) {
    uint32_t toks[B * T + 1];
    unsigned s = 9;
    for (size_t i = 0; i < HP_ARRAY_LEN(toks); i++) {
        s = s * 1664525u + 1013904223u;
        toks[i] = (s >> 8) % V;
    }
    char path[320];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    hp_err e;
    cr_assert_eq(hp_data_write_shard(path, toks, HP_ARRAY_LEN(toks), 1, &e), HP_OK, "%s", e.msg);
}

static void train_hp(const char *job, const char *out, int world) {
    hp_th_run r = hp_th_run_bin(dir, "worker/hp-worker",
                                "--standalone '%s/%s' --world %d --out '%s/%s' "
                                "--data '%s/tokens.bin' --threads 1",
                                dir, job, world, dir, out, dir);
    cr_assert_eq(r.code, 0, "hp-worker %s: %s", job, r.err);
    hp_th_run_free(&r);
}

/* Trains `one` at world 1 and `many` at `world` ranks; expects the same losses (1e-5) and
 * weights. */
static void expect_trains_like_world_1(const char *one, const char *many, int world,
                                       const char *what) {
    train_hp(one, "w1", 1);
    train_hp(many, "wn", world);
    char a[320], b[320];
    snprintf(a, sizeof a, "%s/w1", dir);
    snprintf(b, sizeof b, "%s/wn", dir);
    cr_assert_eq(hp_th_read_losses(b, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
    hp_th_expect_losses_close(a, b, 0, 1e-5, what);
    hp_th_expect_weights_close(a, b, 1e-7, 1e-4, what);
}

static void inspect_ok(const char *job) {
    hp_th_run r = hp_th_hpctl(dir, 60, "inspect '%s/%s'", dir, job);
    cr_assert_eq(r.code, 0, "hpctl inspect %s: %s", job, r.err);
    cr_expect(strstr(r.out, "native_layer_norm"), "%s", r.out);
    cr_expect(strstr(r.out, "27 outputs (loss + 26 gradients)"), "%s", r.out);
    cr_expect(strstr(r.out, "26 params, 0 buffers, 2 data"), "tied weights stay one: %s", r.out);
    hp_th_run_free(&r);
}

Test(hp_export, gpt_both_ways_trains_like_pytorch) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "export '%s' torch --steps %d", dir, STEPS);
    int rc = ref(args);
    cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
    char out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    cr_assert_eq(rc, 0, "export (torch autodiff) failed:\n%s", hp_th_slurp_or_empty(out));
    snprintf(args, sizeof args, "export '%s' hp --steps %d", dir, STEPS);
    ref_ok(args, "export (hp autodiff)");
    snprintf(args, sizeof args, "train '%s' %d", dir, STEPS);
    ref_ok(args, "PyTorch's run");
    char ref_dir[320], hp_dir[320];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", dir);
    const char *modes[] = {"torch", "hp"};
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        char job[64], run[64];
        snprintf(job, sizeof job, "job-%s.pb", modes[i]);
        snprintf(run, sizeof run, "hp-%s", modes[i]);
        inspect_ok(job);
        train_hp(job, run, 1);
        snprintf(hp_dir, sizeof hp_dir, "%s/%s", dir, run);
        cr_assert_eq(hp_th_read_losses(hp_dir, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(ref_dir, hp_dir, 0, 1e-4, modes[i]);
        hp_th_expect_weights_close(ref_dir, hp_dir, 1e-7, 1e-4, modes[i]);
    }
}

/* The exported GPT-2's attention (make_fx's bmm, scale, masked_fill, softmax, bmm and their
 * backward) is fused by the compiler's fuse_attention pass in both capture modes, `hpctl plan`
 * says so, and the fused job trains to the unfused one's losses (--no-fuse-attention) within
 * 1e-5. */
Test(hp_export, gpt_attention_fuses_and_trains_like_unfused) {
    write_tokens();
    const char *modes[] = {"torch", "hp"};
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(args, sizeof args, "export '%s' %s --steps %d", dir, modes[i], STEPS);
        int rc = ref(args);
        cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
        cr_assert_eq(rc, 0, "export (%s) failed:\n%s", modes[i], hp_th_slurp_or_empty(out));
        snprintf(args, sizeof args, "export '%s' %s --as %s-unfused --steps %d --no-fuse-attention",
                 dir, modes[i], modes[i], STEPS);
        cr_assert_eq(ref(args), 0, "export (%s, unfused) failed:\n%s", modes[i],
                     hp_th_slurp_or_empty(out));
        hp_th_run r = hp_th_hpctl(dir, 60, "plan '%s/job-%s.pb'", dir, modes[i]);
        cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
        cr_expect(strstr(r.out, "fuse_attention: fused 2 causal attentions and 2 backwards into "
                                "_scaled_dot_product_flash_attention"),
                  "%s: %s", modes[i], r.out);
        hp_th_run_free(&r);
        r = hp_th_hpctl(dir, 60, "plan '%s/job-%s.pb' --json", dir, modes[i]);
        cr_assert_eq(r.code, 0, "hpctl plan --json: %s", r.err);
        cr_expect(strstr(r.out, "\"name\": \"fuse_attention\"") &&
                      strstr(r.out, "\"fused_attention\": 2") &&
                      strstr(r.out, "\"fused_attention_backward\": 2"),
                  "%s: %s", modes[i], r.out);
        hp_th_run_free(&r);
        r = hp_th_hpctl(dir, 60, "plan '%s/job-%s-unfused.pb'", dir, modes[i]);
        cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
        cr_expect(strstr(r.out, "\nfuse_attention         no "), "%s: %s", modes[i], r.out);
        cr_expect(!strstr(r.out, "fused 2 causal"), "%s: %s", modes[i], r.out);
        hp_th_run_free(&r);
        char job[64], run[64], fused_dir[320], unfused_dir[320];
        snprintf(job, sizeof job, "job-%s.pb", modes[i]);
        snprintf(run, sizeof run, "fused-%s", modes[i]);
        train_hp(job, run, 1);
        snprintf(fused_dir, sizeof fused_dir, "%s/%s", dir, run);
        snprintf(job, sizeof job, "job-%s-unfused.pb", modes[i]);
        snprintf(run, sizeof run, "unfused-%s", modes[i]);
        train_hp(job, run, 1);
        snprintf(unfused_dir, sizeof unfused_dir, "%s/%s", dir, run);
        cr_assert_eq(hp_th_read_losses(fused_dir, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(unfused_dir, fused_dir, 0, 1e-5, modes[i]);
        hp_th_expect_weights_close(unfused_dir, fused_dir, 1e-7, 1e-4, modes[i]);
    }
}

/* A Llama written in PyTorch with torchtitan's FQNs (RMSNorm, RoPE from cos/sin buffers,
 * grouped-query attention, SwiGLU; export_ref.py), exported both ways, trains 10 steps to the
 * losses and weights of hp's own llama3 builder at the same shape from the same weights; its
 * attention is fused like the builder's. */
Test(hp_export, llama_in_torchtitan_fqns_trains_like_hp_llama3) {
    write_tokens();
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    const char *modes[] = {"torch", "hp"};
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(args, sizeof args, "llama '%s' %s --steps %d", dir, modes[i], STEPS);
        int rc = ref(args);
        cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
        cr_assert_eq(rc, 0, "llama export (%s) failed:\n%s", modes[i], hp_th_slurp_or_empty(out));
    }
    /* hp's builder at the model's shape, from the exported state (the buffers are ignored) */
    hp_th_run r = hp_th_hpctl(dir, 60,
                              "new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 "
                              "--kv-heads 2 --ffn-hidden 96 --vocab %d --batch %d --seq %d "
                              "--steps %d --lr 1e-3 --warmup 2 --weight-decay 0.1 --grad-clip 1 "
                              "--log-interval 1 --init-from '%s/llama.safetensors' -o '%s/own.pb'",
                              V, B, T, STEPS, dir, dir);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
    train_hp("own.pb", "own", 1);
    char own_dir[320];
    snprintf(own_dir, sizeof own_dir, "%s/own", dir);
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        char job[64], run[64], run_dir[320];
        snprintf(job, sizeof job, "job-llama-%s.pb", modes[i]);
        snprintf(run, sizeof run, "llama-%s", modes[i]);
        r = hp_th_hpctl(dir, 60, "inspect '%s/%s'", dir, job);
        cr_assert_eq(r.code, 0, "hpctl inspect: %s", r.err);
        cr_expect(strstr(r.out, "21 params, 2 buffers, 2 data"), "%s", r.out);
        hp_th_run_free(&r);
        r = hp_th_hpctl(dir, 60, "plan '%s/%s'", dir, job);
        cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
        cr_expect(strstr(r.out, "fuse_attention: fused 2 causal attentions and 2 backwards"),
                  "%s: %s", modes[i], r.out);
        hp_th_run_free(&r);
        train_hp(job, run, 1);
        snprintf(run_dir, sizeof run_dir, "%s/%s", dir, run);
        cr_assert_eq(hp_th_read_losses(run_dir, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(own_dir, run_dir, 0, 1e-5, modes[i]);
        hp_th_expect_weights_close(own_dir, run_dir, 1e-7, 1e-4, modes[i]);
    }
}

/* Auto-sharding of the exported Llama at dp=2 x tp=2: its unfused layers (RoPE as real and
 * imaginary products, RMSNorm as mul/rsqrt/mean) make an LP of 20k rows x 142k columns, past
 * GLPK's simplex in minutes; Clp's dual simplex plans it in seconds (autoshard_clp.c). The
 * plan trains to world 1's losses and weights. */
/* The exported Llama's RoPE tables are buffers from its weights file. A checkpoint holds what
 * training changes; a run resumed from one reloads the buffers from the job's --init-from, so
 * it trains on as the uninterrupted run did, bit for bit (not from the tables' init spec, a
 * normal distribution of their mean and deviation). */
Test(hp_export, resumed_run_reloads_buffers_from_init_from) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "llama '%s' torch --steps %d --checkpoint-interval 5", dir, STEPS);
    ref_ok(args, "llama export");
    train_hp("job-llama-torch.pb", "full", 1);
    train_hp("job-llama-torch.pb", "split", 1);
    char root[320];
    snprintf(root, sizeof root, "%s/split/checkpoints", dir);
    hp_err e;
    cr_assert_eq(hp_ckpt_remove_from(root, 6, &e), HP_OK, "%s", e.msg); /* back to step 5 */
    hp_th_run r = hp_th_run_bin(dir, "worker/hp-worker",
                                "--standalone '%s/job-llama-torch.pb' --out '%s/split' "
                                "--resume '%s/split' --data '%s/tokens.bin' --threads 1",
                                dir, dir, dir, dir);
    cr_assert_eq(r.code, 0, "hp-worker --resume: %s", r.err);
    cr_expect(strstr(r.out, "resumed from step 5"), "%s", r.out);
    hp_th_run_free(&r);
    char a[320], b[320];
    snprintf(a, sizeof a, "%s/full", dir);
    snprintf(b, sizeof b, "%s/split", dir);
    cr_assert_eq(hp_th_read_losses(b, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
    hp_th_expect_losses_close(a, b, 0, 0, "resumed at step 5");
    hp_th_expect_weights_close(a, b, 0, 0, "resumed at step 5");
}

Test(hp_export, llama_auto_sharded_at_dp_2_tp_2_trains_like_world_1) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "llama '%s' torch --steps %d", dir, STEPS);
    ref_ok(args, "llama export (world 1)");
    char from[320], to[320];
    snprintf(from, sizeof from, "%s/job-llama-torch.pb", dir);
    snprintf(to, sizeof to, "%s/job-llama-1.pb", dir);
    cr_assert_eq(rename(from, to), 0);
    snprintf(args, sizeof args, "llama '%s' torch --steps %d --mesh dp=2,tp=2 --mode auto", dir,
             STEPS);
    ref_ok(args, "llama export (dp=2 x tp=2, auto)");
    hp_th_run r = hp_th_hpctl(dir, 120, "plan '%s/job-llama-torch.pb'", dir);
    cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
    cr_expect(strstr(r.out, "LP relaxation by Clp's dual simplex") && strstr(r.out, "optimal"),
              "%s", r.out);
    hp_th_run_free(&r);
    expect_trains_like_world_1("job-llama-1.pb", "job-llama-torch.pb", 4, "llama auto dp x tp");
}

/* TP placements by FQN apply to an exported job: the GPT-2 MLP column-parallel (c_fc weight and
 * bias Shard(0)) and row-parallel (c_proj weight Shard(1)) at tp=2 trains to the world-1 run's
 * losses and weights. */
Test(hp_export, gpt_mlp_tp_2_plan_matches_world_1) {
    write_tokens();
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    snprintf(args, sizeof args, "export '%s' torch --steps %d", dir, STEPS);
    ref_ok(args, "export");
    snprintf(args, sizeof args,
             "export '%s' torch --as tp --steps %d --mesh tp=2 "
             "--place 'transformer.h.*.mlp.c_fc.weight=tp:S(0)' "
             "--place 'transformer.h.*.mlp.c_fc.bias=tp:S(0)' "
             "--place 'transformer.h.*.mlp.c_proj.weight=tp:S(1)'",
             dir, STEPS);
    ref_ok(args, "export (tp)");
    hp_th_run r = hp_th_hpctl(dir, 60, "plan '%s/job-tp.pb'", dir);
    cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
    cr_expect(strstr(r.out, "{tp:S(0)} -> f32[64,32]"), "c_fc column-parallel: %s", r.out);
    cr_expect(strstr(r.out, "{tp:S(1)} -> f32[32,64]"), "c_proj row-parallel: %s", r.out);
    cr_expect(strstr(r.out, "communication on mesh dim tp (2 ranks): "), "%s", r.out);
    hp_th_run_free(&r);
    expect_trains_like_world_1("job-torch.pb", "job-tp.pb", 2, "tp=2");
}

/* nanoGPT's own mask, a tril(ones) buffer compared with 0: hp_export computes it in the graph,
 * the attention fuses, and the job trains like the mask-in-forward model. */
Test(hp_export, gpt_with_nanogpt_bias_buffer_fuses_too) {
    write_tokens();
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    snprintf(args, sizeof args, "export '%s' torch --steps %d", dir, STEPS);
    ref_ok(args, "export");
    snprintf(args, sizeof args, "export '%s' torch --as bias --bias-buffer --steps %d", dir, STEPS);
    ref_ok(args, "export (bias buffer)");
    hp_th_run r = hp_th_hpctl(dir, 60, "plan '%s/job-bias.pb'", dir);
    cr_assert_eq(r.code, 0, "hpctl plan: %s", r.err);
    cr_expect(strstr(r.out, "fuse_attention: fused 2 causal attentions and 2 backwards"), "%s",
              r.out);
    hp_th_run_free(&r);
    train_hp("job-torch.pb", "plain", 1);
    train_hp("job-bias.pb", "bias", 1);
    char a[320], b[320];
    snprintf(a, sizeof a, "%s/plain", dir);
    snprintf(b, sizeof b, "%s/bias", dir);
    cr_assert_eq(hp_th_read_losses(b, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
    hp_th_expect_losses_close(a, b, 0, 1e-6, "bias buffer");
}

/* Exports export_ref.py's model with each of n `variants[k]` flags under autodiff `modes[k]`
 * (job-NAME-k.pb), trains PyTorch's run of `train_flags` once, and expects every export to
 * train to its losses and weights. */
static void expect_exports_train_like_pytorch(const char *name, const char *const *modes,
                                              const char *const *variants, size_t n,
                                              const char *train_flags) {
    write_tokens();
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    for (size_t k = 0; k < n; k++) {
        snprintf(args, sizeof args, "export '%s' %s --as %s-%zu %s --steps %d", dir, modes[k], name,
                 k, variants[k], STEPS);
        int rc = ref(args);
        cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
        cr_assert_eq(rc, 0, "export %s (%s autodiff) failed:\n%s", variants[k], modes[k],
                     hp_th_slurp_or_empty(out));
    }
    snprintf(args, sizeof args, "train '%s' %d %s", dir, STEPS, train_flags);
    ref_ok(args, "PyTorch's run");
    char ref_dir[320], hp_dir[320], job[64], run[64];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", dir);
    for (size_t k = 0; k < n; k++) {
        snprintf(job, sizeof job, "job-%s-%zu.pb", name, k);
        snprintf(run, sizeof run, "%s-%zu", name, k);
        train_hp(job, run, 1);
        snprintf(hp_dir, sizeof hp_dir, "%s/%s", dir, run);
        cr_assert_eq(hp_th_read_losses(hp_dir, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(ref_dir, hp_dir, 0, 1e-4, run);
        hp_th_expect_weights_close(ref_dir, hp_dir, 1e-7, 1e-4, run);
    }
}

/* torch's nn.MultiheadAttention with an additive causal mask buffer (triu(full(-inf), 1)):
 * make_fx records baddbmm(mask, q, kᵀ), which hp_export maps to bmm + add; the mask, recognized
 * as causal, is computed in the graph, and its -inf values load as a buffer's from the weights
 * file. Exported both ways, and with the mask made in forward (triu), the model trains to
 * PyTorch's losses and weights. */
Test(hp_export, gpt_with_multihead_attention_trains_like_pytorch) {
    const char *modes[] = {"torch", "hp", "hp"},
               *variants[] = {"--mha", "--mha", "--mha-forward-mask"};
    expect_exports_train_like_pytorch("mha", modes, variants, HP_ARRAY_LEN(modes), "--mha");
}

/* nn.MultiheadAttention merges the batch with other dims in its views ([T, B, C] as
 * [T, B·H, C/H], then [T·B, C]): FSDP at world 2 follows the batch through them (passes/fsdp.c's
 * view_batch_dim) and trains to world 1's losses. */
Test(hp_export, multihead_attention_fsdp_world_2_equals_world_1) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "export '%s' torch --as mha1 --mha --steps %d", dir, STEPS);
    ref_ok(args, "export");
    snprintf(args, sizeof args,
             "export '%s' torch --as mha2 --mha --steps %d --mesh dp=2 --fsdp 'transformer.h.*'",
             dir, STEPS);
    ref_ok(args, "export (dp=2)");
    expect_trains_like_world_1("job-mha1.pb", "job-mha2.pb", 2, "dp=2");
}

/* The ops hp_export decomposes (var, clamp, leaky_relu, softplus, ge/le/gt/ne, logical_and,
 * scalar_tensor, index_put with a bool mask; export_ref.py's OpsNet), exported both ways, train
 * to PyTorch's losses and weights. */
Test(hp_export, decomposed_ops_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops", "--ops"};
    expect_exports_train_like_pytorch("ops", modes, variants, HP_ARRAY_LEN(modes), "--ops");
}

/* OpsNet2: rotary embeddings computed in forward as Hugging Face's Llama does (sin, cos of
 * position × inv_freq), sin and cos of activations, a GELU written with erf, and the
 * decompositions (abs, sign,
 * minimum/maximum, reciprocal, logsumexp, std, normalize, pad, roll, hardtanh, elu, mish, amax
 * with its sum-of-bools backward), exported both ways, train to PyTorch's losses and weights. */
Test(hp_export, more_decomposed_ops_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops2", "--ops2"};
    expect_exports_train_like_pytorch("ops2", modes, variants, HP_ARRAY_LEN(modes), "--ops2");
}

/* OpsNet3: the less common ops (client/hp_export/aten_extra.py): index_select of a parameter
 * table by the tokens and of a dim by a descending arange (index_add backwards), indexing by
 * an integer tensor (table[idx], u[:, positions]; index_put backwards), cumsum and
 * flip over the positions, repeat, amin, log1p, expm1, logsigmoid, hardswish, hardsigmoid,
 * exported both ways, train to PyTorch's losses and weights. */
Test(hp_export, less_common_ops_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops3", "--ops3"};
    expect_exports_train_like_pytorch("ops3", modes, variants, HP_ARRAY_LEN(modes), "--ops3");
}

/* OpsNet4: repeat_interleave (grouped-query keys along the heads, along the positions, and
 * flattened; client/hp_export/aten_extra.py makes it a view, expand and reshape, its backward a
 * sum) and GroupNorm (with and without affine, over [B, C, T] and [B·T, C]; layer norm over the
 * groups), exported both ways, train to PyTorch's losses and weights. */
Test(hp_export, repeat_interleave_and_group_norm_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops4", "--ops4"};
    expect_exports_train_like_pytorch("ops4", modes, variants, HP_ARRAY_LEN(modes), "--ops4");
}

/* OpsNet5: the ops of models beyond the GPT (client/hp_export/aten_more.py): regression,
 * distillation and binary losses, GLU, max/min over a dim (their scatter backward), boolean
 * logic, rounding, a one-hot by scatter_, elementwise math, and integer arithmetic on constants
 * folded to buffers, exported both ways, train to PyTorch's losses and weights. */
Test(hp_export, losses_logic_and_math_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops5", "--ops5"};
    expect_exports_train_like_pytorch("ops5", modes, variants, HP_ARRAY_LEN(modes), "--ops5");
}

/* OpsNet6: selection by data (client/hp_export/aten_select.py): a top-2 mixture of experts
 * (topk, the gates scattered back by two indices), sort and argsort, topk of the smallest,
 * gather and scatter_add with several indices along a dim, exported both ways, train to
 * PyTorch's losses and weights; a sort longer than the rounds hp composes is refused by name. */
Test(hp_export, topk_router_sort_and_multi_index_gather_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops6", "--ops6"};
    expect_exports_train_like_pytorch("ops6", modes, variants, HP_ARRAY_LEN(modes), "--ops6");
    char args[512], out[320];
    snprintf(args, sizeof args, "longsort '%s'", dir);
    int rc = ref(args);
    snprintf(out, sizeof out, "%s/py.out", dir);
    char *msg = hp_th_slurp_or_empty(out);
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, msg);
    cr_expect(strstr(msg, "sort of 512 entries along a dim (hp composes it of one round per "
                          "entry, 64 at most)"),
              "%s", msg);
    free(msg);
}

/* OpsNet8: Conv1d (causal depthwise as Mamba's, padded, dilated, grouped) and Conv2d (strided,
 * dilated, grouped, with and without bias) as matrix products of the input's patches, and avg,
 * max and adaptive pooling over the same patches (client/hp_export/aten_conv.py), exported both
 * ways (torch's backwards composed the same way), train to PyTorch's losses and weights. */
Test(hp_export, convolutions_and_pooling_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--ops8", "--ops8"};
    expect_exports_train_like_pytorch("ops8", modes, variants, HP_ARRAY_LEN(modes), "--ops8");
}

/* export_ref.py refused DIR ARGS: exit 1 with `want` in the message (nothing written). */
static void expect_refused(const char *args, const char *want) {
    char cmd[512], out[320];
    snprintf(cmd, sizeof cmd, "refused '%s' %s", dir, args);
    int rc = ref(cmd);
    snprintf(out, sizeof out, "%s/py.out", dir);
    char *msg = hp_th_slurp_or_empty(out);
    cr_expect_eq(rc, 1, "%s: exit %d:\n%s", args, rc, msg);
    cr_expect(strstr(msg, want), "%s: want '%s' in:\n%s", args, want, msg);
    free(msg);
}

/* OpsNet7: nn.LSTM and nn.GRU read their weights through their own _flat_weights lists, which
 * make_fx captures as constants (they would never train: hp_export maps them back to the
 * parameters), write into the pieces of their gates in place, and GRU turns its output with
 * transpose_; with in-place ops on fresh values, exported with autodiff="hp" it trains to
 * PyTorch's losses and weights. With torch's traced backward
 * (no gradient through those constants) it is refused naming the parameter, as are a write
 * through a view whose base is read afterwards and a view of a parameter kept aside. */
Test(hp_export, lstm_and_in_place_ops_train_like_pytorch) {
    const char *modes[] = {"hp"}, *variants[] = {"--ops7"};
    expect_exports_train_like_pytorch("ops7", modes, variants, HP_ARRAY_LEN(modes), "--ops7");
    expect_refused("lstm torch", "the parameter rnn.weight_ih_l0 is read other than through its "
                                 "module attribute");
    expect_refused("inplace-view hp", "in place on a value read afterwards through another view");
    expect_refused("param-view hp", "is a view of the parameter out.weight");
}

/* A model in bf16 (model.to(torch.bfloat16)): hp holds its parameters in f32 (the weights
 * file gets f32 of the bf16 values) and computes in bf16 from a cast of them, the loss and the
 * gradients cast back to f32. Exported both ways, it trains: its first loss is PyTorch's f32
 * loss of the same weights within bf16's rounding, its losses fall, and the two exports agree.
 * A graph with bf16 parameters written by hand is refused with one line naming the fix. */
Test(hp_export, bf16_model_trains_from_f32_masters) {
    write_tokens();
    char args[1024];
    const char *modes[] = {"torch", "hp"};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "export '%s' %s --as half-%d --bf16 --steps %d", dir, modes[k],
                 k, STEPS);
        ref_ok(args, "bf16 export");
    }
    char hpir[320];
    snprintf(hpir, sizeof hpir, "%s/job-half-0.hpir", dir);
    char *text = hp_th_slurp_or_empty(hpir);
    cr_expect(strstr(text, "f32[64,32] = placeholder() {fqn=\"transformer.wte.weight\""),
              "the parameters are not f32 placeholders:\n%.600s", text);
    cr_expect(strstr(text, "_to_copy") && strstr(text, "{dtype=bf16}"), "no cast to bf16");
    free(text);
    snprintf(args, sizeof args, "train '%s' %d", dir, STEPS);
    ref_ok(args, "PyTorch's f32 run");
    double ref[STEPS + 1], hp[2][STEPS + 1];
    char path[320];
    snprintf(path, sizeof path, "%s/ref", dir);
    cr_assert_eq(hp_th_read_losses(path, ref, STEPS + 1), STEPS);
    for (int k = 0; k < 2; k++) {
        char job[64], run[64];
        snprintf(job, sizeof job, "job-half-%d.pb", k);
        snprintf(run, sizeof run, "half-%d", k);
        train_hp(job, run, 1);
        snprintf(path, sizeof path, "%s/%s", dir, run);
        cr_assert_eq(hp_th_read_losses(path, hp[k], STEPS + 1), STEPS);
        cr_expect(fabs(hp[k][0] - ref[0]) <= 0.02 * ref[0], "%s: first loss %g, PyTorch f32 %g",
                  modes[k], hp[k][0], ref[0]);
        cr_expect(hp[k][STEPS - 1] < hp[k][0], "%s: loss %g -> %g", modes[k], hp[k][0],
                  hp[k][STEPS - 1]);
    }
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(hp[0][i] - hp[1][i]) <= 0.02 * fabs(hp[0][i]),
                  "step %d: torch autodiff %g, hp autodiff %g", i + 1, hp[0][i], hp[1][i]);
    /* the same graph with its parameters left in bf16 */
    char bad[320];
    snprintf(bad, sizeof bad, "%s/bad.hpir", dir);
    FILE *f = fopen(bad, "w");
    cr_assert(f);
    fputs("hpir 1\n%0: bf16[4] = placeholder() {fqn=\"w\", init=ones, kind=param}\n"
          "%1: bf16[] = sum(%0) {dims=[]}\n%2: f32[] = _to_copy(%1) {dtype=f32}\nreturn %2\n",
          f);
    fclose(f);
    hp_th_run r = hp_th_hpctl(dir, 60, "new --graph '%s' -o '%s/bad.pb'", bad, dir);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "parameter 'w' is bf16") && strstr(r.err, "--param-dtype bf16"), "%s",
              r.err);
    hp_th_run_free(&r);
}

/* Cross entropy with label smoothing (0.1), which torch 1.13 records with index_put_,
 * masked_select, masked_scatter over `labels == -100` and 0-d f64 constants: exported both ways,
 * the GPT trains to PyTorch's losses and weights (the mask is false everywhere for token ids,
 * so the data-dependent ops are views). */
Test(hp_export, label_smoothing_trains_like_pytorch) {
    const char *modes[] = {"torch", "hp"},
               *variants[] = {"--label-smoothing 0.1", "--label-smoothing 0.1"};
    expect_exports_train_like_pytorch("ls", modes, variants, HP_ARRAY_LEN(modes),
                                      "--label-smoothing 0.1");
}

/* Graphs the per-rank batch rewrite (passes/fsdp.c) cannot split, data-parallel at world 2:
 * label smoothing's plain mean over the batch; a sum over it (reduction='sum'), which the
 * rewrite once averaged over the ranks, training on half the loss; OpsNet's constant of the
 * global batch's shape. Each plan is placed by spmd instead (hpctl plan says so) and trains to
 * world 1's losses and weights, with FSDP and without. So do plan.mode auto ones: at dp=2 (the
 * worker looks the token embedding up through the tokens' redistribution) and label smoothing
 * at dp=2 × tp=2. */
Test(hp_export, losses_over_the_batch_train_at_world_n_like_world_1) {
    write_tokens();
    static const struct {
        const char *name, *loss, *plan;
        int world;
    } cases[] = {
        {"ls", "--label-smoothing 0.1", "--mesh dp=2 --fsdp 'transformer.*'", 2},
        {"sum", "--sum-loss", "--mesh dp=2", 2},
        {"ops", "--ops", "--mesh dp=2 --fsdp '*'", 2}, /* a full() of the global batch's shape */
        {"auto", "", "--mesh dp=2 --mode auto", 2},
        /* the smoothing term's gradient, a scalar expanded to [B·T] and then [B·T, V]: with
         * views following their inputs the expand took a split over both mesh dims that
         * nothing redistributes, and auto-sharding found no plan */
        {"lsauto", "--label-smoothing 0.1", "--mesh dp=2,tp=2 --mode auto", 4},
    };
    for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) {
        char args[1024], one[64], many[64];
        snprintf(args, sizeof args, "export '%s' torch --as %s1 %s --steps %d", dir, cases[i].name,
                 cases[i].loss, STEPS);
        ref_ok(args, "export (world 1)");
        snprintf(args, sizeof args, "export '%s' torch --as %s2 %s --steps %d %s", dir,
                 cases[i].name, cases[i].loss, STEPS, cases[i].plan);
        ref_ok(args, "export (world 2)");
        snprintf(one, sizeof one, "job-%s1.pb", cases[i].name);
        snprintf(many, sizeof many, "job-%s2.pb", cases[i].name);
        hp_th_run r = hp_th_hpctl(dir, 60, "plan '%s/%s'", dir, many);
        cr_assert_eq(r.code, 0, "hpctl plan %s: %s", many, r.err);
        if (cases[i].world == 2 && strcmp(cases[i].name, "auto"))
            cr_expect(strstr(r.out, "fsdp: placed by spmd"), "%s: %s", many, r.out);
        hp_th_run_free(&r);
        expect_trains_like_world_1(one, many, cases[i].world, cases[i].name);
    }
}

/* bf16 FSDP of an exported GPT: bucketing gathers the embedding's bf16 shard with others into
 * one flat buffer, so the lookup reads a view of a slice of it; the worker sizes the vocab from
 * the job's own graph (it once failed: "no embedding of 'tokens'"). World 2 trains to world
 * 1's losses with the same policy, within bf16's rounding of differently ordered sums. */
/* Cross entropy of [B, V, T] scores (the class dim second), which torch records as
 * nll_loss2d_forward/backward over a [B, V, 1, T] view: exported both ways, with the mean and
 * with reduction='none' then averaged, the GPT trains to PyTorch's losses and weights. */
Test(hp_export, cross_entropy_over_the_class_dim_1_trains_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--loss-3d", "--loss-3d"};
    expect_exports_train_like_pytorch("l3", modes, variants, HP_ARRAY_LEN(modes), "--loss-3d");
    const char *none[] = {"--loss-3d-none", "--loss-3d-none"};
    expect_exports_train_like_pytorch("l3n", modes, none, HP_ARRAY_LEN(modes), "--loss-3d-none");
}

/* Log-probabilities picked with gather (and its backward, scatter_add into new_zeros), which
 * hp_export maps to nll_loss's per-row pick: exported both ways, the GPT trains to PyTorch's
 * losses and weights; and at dp=2 with FSDP, to world 1's (the mean over the batch is placed by
 * spmd). */
Test(hp_export, gathered_log_probabilities_train_like_pytorch) {
    const char *modes[] = {"torch", "hp"}, *variants[] = {"--gather-loss", "--gather-loss"};
    expect_exports_train_like_pytorch("ga", modes, variants, HP_ARRAY_LEN(modes), "--gather-loss");
    char args[1024];
    snprintf(args, sizeof args,
             "export '%s' torch --as ga2 --gather-loss --steps %d --mesh dp=2 --fsdp '*'", dir,
             STEPS);
    ref_ok(args, "export (dp=2)");
    expect_trains_like_world_1("job-ga-0.pb", "job-ga2.pb", 2, "gather at dp=2");
}

Test(hp_export, gpt_bf16_fsdp_world_2_trains_like_world_1) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "export '%s' torch --as bf1 --steps %d --param-dtype bf16", dir,
             STEPS);
    ref_ok(args, "export (world 1)");
    snprintf(args, sizeof args,
             "export '%s' torch --as bf2 --steps %d --param-dtype bf16 --mesh dp=2 --fsdp '*'", dir,
             STEPS);
    ref_ok(args, "export (world 2)");
    train_hp("job-bf1.pb", "w1", 1);
    train_hp("job-bf2.pb", "wn", 2);
    char a[320], b[320];
    snprintf(a, sizeof a, "%s/w1", dir);
    snprintf(b, sizeof b, "%s/wn", dir);
    hp_th_expect_losses_close(a, b, 0, 2e-3, "bf16 fsdp world 2");
}

Test(hp_export, gpt_fsdp_world_2_trains_like_pytorch) {
    write_tokens();
    char args[1024];
    snprintf(args, sizeof args, "export '%s' torch --steps %d --mesh dp=2 --fsdp 'transformer.*'",
             dir, STEPS);
    ref_ok(args, "export");
    snprintf(args, sizeof args, "train '%s' %d", dir, STEPS);
    ref_ok(args, "PyTorch's run");
    train_hp("job-torch.pb", "hp", 2);
    char ref_dir[320], hp_dir[320];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", dir);
    snprintf(hp_dir, sizeof hp_dir, "%s/hp", dir);
    hp_th_expect_losses_close(ref_dir, hp_dir, 0, 1e-4, "fsdp world 2");
    hp_th_expect_weights_close(ref_dir, hp_dir, 1e-7, 1e-4, "fsdp world 2");
}

/* Occurrences of `what` in the file dir/name. */
static int count_in(const char *name, const char *what) {
    char path[320];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = hp_th_slurp_or_empty(path);
    int n = 0;
    for (const char *at = text; (at = strstr(at, what)); at++) n++;
    free(text);
    return n;
}

/* nanoGPT's dropouts at p = 0.1 in the train-mode model (embeddings, attention weights, both
 * residual branches): exported both ways they become hp's native_dropout (7 of them, named by
 * module path), train alike (the same masks: forward-only capture names them as the joint one
 * does), and the FSDP world-2 run (and a tp=2 MLP) drops the elements the world-1 run drops:
 * every loss within 1e-5. PyTorch's AdamW run with hp's masks (export_ref.py ports hp/rng.h) gives
 * the same losses (1e-4 relative) and weights. At p = 0 they fold away, and the losses differ from
 * p = 0.1's. torch.native_dropout (aten.native_dropout + its backward, what a GPU trace
 * records) exports to the same job: the same losses. */
Test(hp_export, gpt_dropout_world_2_fsdp_drops_what_world_1_drops) {
    write_tokens();
    char args[1024], out[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    const char *modes[] = {"torch", "hp"};
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(args, sizeof args, "export '%s' %s --dropout 0.1 --steps %d", dir, modes[i],
                 STEPS);
        int rc = ref(args);
        cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
        cr_assert_eq(rc, 0, "export (%s) failed:\n%s", modes[i], hp_th_slurp_or_empty(out));
        snprintf(args, sizeof args,
                 "export '%s' %s --as %s-fsdp --dropout 0.1 --steps %d --mesh dp=2 "
                 "--fsdp 'transformer.*'",
                 dir, modes[i], modes[i], STEPS);
        cr_assert_eq(ref(args), 0, "export (%s, fsdp) failed:\n%s", modes[i],
                     hp_th_slurp_or_empty(out));
        char hpir[64];
        snprintf(hpir, sizeof hpir, "job-%s.hpir", modes[i]);
        cr_expect_eq(count_in(hpir, " = native_dropout("), 7, "%s", modes[i]);
        cr_expect_eq(count_in(hpir, "fqn=\"transformer.h.1.attn.attn_dropout#0\", "
                                    "p=0.09999999999999998}"),
                     1, "%s", modes[i]);
    }
    snprintf(args, sizeof args, "export '%s' torch --as p0 --steps %d", dir, STEPS);
    ref_ok(args, "export (p = 0)");
    cr_expect_eq(count_in("job-p0.hpir", "native_dropout"), 0, "p = 0 folds away");
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(args, sizeof args,
                 "export '%s' %s --as native-%s --dropout 0.1 --native-dropout "
                 "--steps %d",
                 dir, modes[i], modes[i], STEPS);
        cr_assert_eq(ref(args), 0, "export (%s, native_dropout) failed:\n%s", modes[i],
                     hp_th_slurp_or_empty(out));
    }
    /* tensor parallel on a mesh: the MLP column/row-parallel (its dropout reads a Partial) */
    snprintf(args, sizeof args,
             "export '%s' torch --as tp --dropout 0.1 --steps %d --mesh tp=2 "
             "--place 'transformer.h.*.mlp.c_fc.weight=tp:S(0)' "
             "--place 'transformer.h.*.mlp.c_fc.bias=tp:S(0)' "
             "--place 'transformer.h.*.mlp.c_proj.weight=tp:S(1)'",
             dir, STEPS);
    ref_ok(args, "export (tp)");
    train_hp("job-tp.pb", "tp2", 2);
    cr_expect_eq(count_in("job-native-torch.hpir", " = native_dropout_backward("), 7);
    cr_expect_eq(count_in("job-native-hp.hpir", " = native_dropout("), 7);
    train_hp("job-native-torch.pb", "native-torch", 1);
    train_hp("job-native-hp.pb", "native-hp", 1);
    train_hp("job-torch.pb", "w1-torch", 1);
    train_hp("job-hp.pb", "w1-hp", 1);
    train_hp("job-torch-fsdp.pb", "w2-torch", 2);
    train_hp("job-hp-fsdp.pb", "w2-hp", 2);
    train_hp("job-p0.pb", "p0", 1);
    char a[320], b[320];
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(a, sizeof a, "%s/w1-%s", dir, modes[i]);
        snprintf(b, sizeof b, "%s/w2-%s", dir, modes[i]);
        cr_assert_eq(hp_th_read_losses(b, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(a, b, 0, 1e-5, modes[i]);
    }
    snprintf(a, sizeof a, "%s/w1-torch", dir);
    snprintf(b, sizeof b, "%s/w1-hp", dir);
    hp_th_expect_losses_close(a, b, 0, 1e-5, "joint capture vs hp autodiff");
    snprintf(b, sizeof b, "%s/tp2", dir);
    hp_th_expect_losses_close(a, b, 0, 1e-5, "tp=2");
    for (size_t i = 0; i < HP_ARRAY_LEN(modes); i++) {
        snprintf(b, sizeof b, "%s/native-%s", dir, modes[i]);
        hp_th_expect_losses_close(a, b, 0, 1e-5, "torch.native_dropout");
    }
    /* PyTorch's own AdamW run, its dropouts drawing hp's masks (a port of hp/rng.h) on hp's
     * sample order: the same losses and weights as hp's */
    snprintf(args, sizeof args, "train '%s' %d --dropout 0.1", dir, STEPS);
    ref_ok(args, "PyTorch's run");
    char ref_dir[320];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", dir);
    hp_th_expect_losses_close(ref_dir, a, 0, 1e-4, "PyTorch with hp's masks");
    hp_th_expect_weights_close(ref_dir, a, 1e-7, 1e-4, "PyTorch with hp's masks");
    double with[STEPS + 1], without[STEPS + 1];
    snprintf(b, sizeof b, "%s/p0", dir);
    cr_assert_eq(hp_th_read_losses(a, with, STEPS + 1), STEPS);
    cr_assert_eq(hp_th_read_losses(b, without, STEPS + 1), STEPS);
    cr_expect(fabs(with[0] - without[0]) > 1e-3, "dropout changed nothing: %.7f vs %.7f", with[0],
              without[0]);
}

/* The exported GPT-2 on the cuda backend (cuemu in CI, a GPU where there is one): LayerNorm,
 * GELU-tanh, learned positions (arange), dropout at p = 0.1 (the device draws hp/rng.h's masks)
 * and the fused attention; and, with --no-fuse-attention, make_fx's own attention (tril,
 * bitwise_not, masked fill, softmax, bmm). 10 steps give the cpu run's losses and weights
 * within 1e-4. */
Test(hp_export, gpt_trains_on_cuda_as_on_cpu) {
    CU_SKIP_WITHOUT_DEVICE();
    write_tokens();
    char args[1024], out[320], a[320], b[320];
    snprintf(out, sizeof out, "%s/py.out", dir);
    const char *jobs[][2] = {{"cpu", ""},
                             {"cuda", "--device cuda"},
                             {"cuda-unfused", "--device cuda --no-fuse-attention"}};
    for (size_t i = 0; i < HP_ARRAY_LEN(jobs); i++) {
        snprintf(args, sizeof args, "export '%s' torch --as %s --dropout 0.1 --steps %d %s", dir,
                 jobs[i][0], STEPS, jobs[i][1]);
        int rc = ref(args);
        cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
        cr_assert_eq(rc, 0, "export (%s) failed:\n%s", jobs[i][0], hp_th_slurp_or_empty(out));
        char job[64];
        snprintf(job, sizeof job, "job-%s.pb", jobs[i][0]);
        train_hp(job, jobs[i][0], 1);
    }
    cr_expect_gt(count_in("job-cuda-unfused.hpir", " = tril("), 0);
    cr_expect_gt(count_in("job-cuda-unfused.hpir", " = bitwise_not("), 0);
    snprintf(a, sizeof a, "%s/cpu", dir);
    for (size_t i = 1; i < HP_ARRAY_LEN(jobs); i++) {
        snprintf(b, sizeof b, "%s/%s", dir, jobs[i][0]);
        cr_assert_eq(hp_th_read_losses(b, (double[STEPS + 1]){0}, STEPS + 1), STEPS);
        hp_th_expect_losses_close(a, b, 0, 1e-4, jobs[i][0]);
        hp_th_expect_weights_close(a, b, 1e-6, 1e-4, jobs[i][0]);
    }
}

Test(hp_export, unsupported_op_lists_every_one_and_writes_nothing) {
    char args[512], out[320], job[320];
    snprintf(args, sizeof args, "conv '%s'", dir);
    int rc = ref(args);
    cr_assert_neq(rc, 3, "python3-torch is missing: run scripts/install-deps.sh");
    snprintf(out, sizeof out, "%s/py.out", dir);
    char *msg = hp_th_slurp_or_empty(out);
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, msg);
    const char *why = "(a transposed convolution: hp composes the forward kind only)";
    char fwd[200];
    snprintf(fwd, sizeof fwd, "conv: aten.convolution x1 %s", why);
    cr_expect(strstr(msg, fwd), "%s", msg);
    /* the forward op names the model's own line (make_fx's stack trace) */
    char src[320], want[800];
    snprintf(src, sizeof src, "%s/tests/client/export_ref.py", hp_th_source_dir());
    char *text = hp_th_slurp_or_empty(src);
    const char *at = strstr(text, "x = self.conv(");
    cr_assert(at, "export_ref.py changed: no conv call");
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    snprintf(want, sizeof want, "%s at %s:%d\n", fwd, src, line);
    cr_expect(strstr(msg, want), "want '%s' in:\n%s", want, msg);
    free(text);
    free(msg);
    snprintf(job, sizeof job, "%s/conv.pb", dir);
    struct stat st;
    cr_expect_neq(stat(job, &st), 0, "a job was written");
    snprintf(job, sizeof job, "%s/conv.safetensors", dir);
    cr_expect_neq(stat(job, &st), 0, "weights were written");
}

Test(hp_export, the_command_exports_and_refuses_a_conv_model) {
    char cmd[2048], out[320];
    snprintf(out, sizeof out, "%s/cli.out", dir);
    snprintf(cmd, sizeof cmd,
             "cd '%s/tests/client' && HPCTL='%s/client/hpctl' PYTHONPATH='%s/client' "
             "/usr/bin/python3 -m hp_export export_ref.py:make --batch 2 --seq 16 -o '%s/m.pb' "
             "--steps 3 >'%s' 2>&1",
             hp_th_source_dir(), hp_th_binary_dir(), hp_th_source_dir(), dir, out);
    int st = system(cmd);
    char *msg = hp_th_slurp_or_empty(out);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", msg);
    free(msg);
    hp_th_run r = hp_th_hpctl(dir, 60, "inspect '%s/m.pb'", dir);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "3 steps"), "%s", r.out);
    hp_th_run_free(&r);
    snprintf(cmd, sizeof cmd,
             "cd '%s/tests/client' && HPCTL='%s/client/hpctl' PYTHONPATH='%s/client' "
             "/usr/bin/python3 -m hp_export export_ref.py:ConvNet --batch 2 --seq 16 "
             "-o '%s/c.pb' >'%s' 2>&1",
             hp_th_source_dir(), hp_th_binary_dir(), hp_th_source_dir(), dir, out);
    st = system(cmd);
    msg = hp_th_slurp_or_empty(out);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s", msg);
    cr_expect(strstr(msg, "hp_export: the model uses what hp cannot run yet"), "%s", msg);
    cr_expect(strstr(msg, "conv: aten.convolution x1"), "%s", msg);
    free(msg);
}

Test(hp_export, hpctl_new_graph_refuses_model_shape_flags) {
    hp_th_run r = hp_th_hpctl(dir, 30, "new --graph x.hpir --dim 8 -o j.pb");
    hp_th_expect_cli_error(r, 2, "hpctl", "--dim: the graph fixes the model's shapes");
    r = hp_th_hpctl(dir, 30, "new --graph x.hpir --model mlp -o j.pb");
    hp_th_expect_cli_error(r, 2, "hpctl", "--model and --graph exclude each other");
}
