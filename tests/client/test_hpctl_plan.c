/* `hpctl plan` and the plan flags of `hpctl new`, as a user runs them: the real binary, its
 * exit codes and one-line errors, the text report's sections, and the --json report read back
 * (per-rank parameter + gradient + optimizer memory at world N is 1/N of world 1's, plus
 * padding; communication appears exactly when there is more than one rank). */
#include "hp/job.h"
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmpdir[256];

static void setup(void) {
    hp_th_tmpdir_make(tmpdir, sizeof tmpdir, "hpctl-plan-test");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmpdir);
}

#define hpctl(...) hp_th_run_bin(tmpdir, "client/hpctl", __VA_ARGS__)

static void ok(hp_th_run r) {
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    hp_th_run_free(&r);
}

static void expect_error(hp_th_run r, int code, const char *want) {
    hp_th_expect_cli_error(r, code, "hpctl", want);
}

/* `hpctl plan ... --json`, parsed. */
static json_t *plan_json(const char *job, const char *extra) {
    hp_th_run r = hpctl("plan %s/%s --json %s", tmpdir, job, extra);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    json_error_t je;
    json_t *root = json_loads(r.out, 0, &je);
    cr_assert(root, "invalid JSON (%s): %s", je.text, r.out);
    hp_th_run_free(&r);
    return root;
}

static int64_t mem(json_t *root, const char *key) {
    json_t *v = json_object_get(json_object_get(root, "memory"), key);
    cr_assert(json_is_integer(v), "memory.%s missing", key);
    return json_integer_value(v);
}

TestSuite(hpctl_plan, .init = setup, .fini = teardown, .timeout = 120);

#define ALL_FSDP                                                                                   \
    "--fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp output.weight --fsdp norm.weight"

Test(hpctl_plan, text_report) {
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 32 --mesh dp=2 " ALL_FSDP " -o %s/j.pb",
             tmpdir));
    hp_th_run r = hpctl("plan %s/j.pb", tmpdir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    static const char *const want[] = {"world 2, mesh dp=2",
                                       "pass ",
                                       "dce ",
                                       "canonicalize ",
                                       "fsdp ",
                                       "overlap ",
                                       "bucketing ",
                                       "lower ",
                                       "instr",
                                       "memory per rank",
                                       "params",
                                       "grads",
                                       "optimizer",
                                       "activations",
                                       "total",
                                       "communication per step per rank",
                                       "estimate",
                                       "step ",
                                       "compute by op (roofline):",
                                       "assumptions",
                                       "(N-1)/N"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(strstr(r.out, want[i]), "no '%s' in:\n%s", want[i], r.out);
    hp_th_run_free(&r);
    r = hpctl("plan --help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "--world N"));
    hp_th_run_free(&r);
}

/* The issue's memory claim: FSDP leaves 1/N of the parameter, gradient and optimizer bytes on
 * each rank (exactly, when every dim 0 divides; plus at most one padded row per parameter and
 * rank otherwise). */
/* Per parameter: its placements and local shape; communication per mesh dim and op. */
Test(hpctl_plan, json_parameters_and_comm_per_mesh_dim) {
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2 --fsdp layers "
             "--fsdp tok_embeddings -o %s/p.pb",
             tmpdir));
    json_t *root = plan_json("p.pb", "");
    json_t *params = json_object_get(root, "parameters");
    cr_assert_eq(json_array_size(params), 57);
    int sharded = 0, replicated = 0;
    for (size_t i = 0; i < json_array_size(params); i++) {
        json_t *p = json_array_get(params, i);
        const char *fqn = json_string_value(json_object_get(p, "fqn"));
        const char *dp = json_string_value(json_object_get(json_object_get(p, "placements"), "dp"));
        int64_t gb = json_integer_value(json_object_get(p, "global_bytes"));
        int64_t lb = json_integer_value(json_object_get(p, "local_bytes"));
        bool marked = !strncmp(fqn, "layers.", 7) || !strncmp(fqn, "tok_embeddings.", 15);
        cr_expect_str_eq(dp, marked ? "S(0)" : "R", "%s", fqn);
        cr_expect_eq(lb * (marked ? 2 : 1), gb, "%s: local %lld of %lld", fqn, (long long)lb,
                     (long long)gb);
        json_t *ls = json_object_get(p, "local_shape"), *gs = json_object_get(p, "global_shape");
        cr_expect_eq(json_integer_value(json_array_get(ls, 0)) * (marked ? 2 : 1),
                     json_integer_value(json_array_get(gs, 0)), "%s", fqn);
        marked ? sharded++ : replicated++;
    }
    cr_expect_eq(sharded, 55);
    cr_expect_eq(replicated, 2, "norm.weight and output.weight");
    json_t *comm = json_object_get(root, "communication");
    json_t *dp = json_object_get(json_object_get(comm, "by_mesh_dim"), "dp");
    cr_assert(json_is_object(dp));
    int64_t sum = 0;
    const char *op;
    json_t *v;
    json_object_foreach(dp, op, v) sum += json_integer_value(json_object_get(v, "bytes"));
    cr_expect_eq(sum, json_integer_value(json_object_get(comm, "bytes_per_step")));
    cr_expect(json_object_get(dp, "all_gather_into_tensor"));
    cr_expect(json_object_get(dp, "reduce_scatter_tensor"));
    json_decref(root);
    hp_th_run r = hpctl("plan %s/p.pb", tmpdir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "layers.0.attention.wq.weight             f32[256,256]     {dp:S(0)} "
                            "-> f32[128,256]"),
              "%s", r.out);
    cr_expect(strstr(r.out, "communication on mesh dim dp (2 ranks): all_gather_into_tensor x"),
              "%s", r.out);
    hp_th_run_free(&r);
}

/* `hpctl inspect TMPDIR/PB` prints want. */
static void inspect_says(const char *pb, const char *want) {
    hp_th_run r = hpctl("inspect %s/%s", tmpdir, pb);
    cr_expect(strstr(r.out, want), "%s", r.out);
    hp_th_run_free(&r);
}

/* --loss-parallel: the plan field is set (inspect says so), and with --tp-plan llama the
 * output projection is colwise: each rank holds half the vocabulary's rows. */
Test(hpctl_plan, tp2_llama_loss_parallel) {
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 --tp-plan llama "
             "--loss-parallel -o %s/lp.pb",
             tmpdir));
    inspect_says("lp.pb", "loss parallel on");
    json_t *root = plan_json("lp.pb", "");
    json_t *params = json_object_get(root, "parameters");
    bool seen = false;
    for (size_t i = 0; i < json_array_size(params); i++) {
        json_t *p = json_array_get(params, i);
        if (strcmp(json_string_value(json_object_get(p, "fqn")), "output.weight")) continue;
        seen = true;
        const char *tp = json_string_value(json_object_get(json_object_get(p, "placements"), "tp"));
        cr_expect_str_eq(tp, "S(0)");
        cr_expect_eq(2 * json_integer_value(json_object_get(p, "local_bytes")),
                     json_integer_value(json_object_get(p, "global_bytes")));
    }
    cr_expect(seen, "no output.weight in the plan");
    json_decref(root);
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 --tp-plan llama "
             "-o %s/nolp.pb",
             tmpdir));
    inspect_says("nolp.pb", "loss parallel off");
}

/* torchtitan's Llama TP plan at tp=2: every TP'd weight holds half its bytes, and the
 * communication is Megatron's: per block two all-reduces of B·T·d in the forward and two in
 * the backward (no sequence parallel), 2(n-1)/n of the tensor each per rank — nothing else.
 * hp-worker runs it (tests/worker/test_tp_train.c checks it computes what world 1 does). */
Test(hpctl_plan, tp2_llama_plan_is_megatron) {
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 --tp-plan llama "
             "-o %s/tp.pb",
             tmpdir));
    json_t *root = plan_json("tp.pb", "");
    json_t *params = json_object_get(root, "parameters");
    int tp_weights = 0;
    for (size_t i = 0; i < json_array_size(params); i++) {
        json_t *p = json_array_get(params, i);
        const char *fqn = json_string_value(json_object_get(p, "fqn"));
        const char *tp = json_string_value(json_object_get(json_object_get(p, "placements"), "tp"));
        int64_t gb = json_integer_value(json_object_get(p, "global_bytes"));
        int64_t lb = json_integer_value(json_object_get(p, "local_bytes"));
        bool col = strstr(fqn, ".wq.") || strstr(fqn, ".wk.") || strstr(fqn, ".wv.") ||
                   strstr(fqn, ".w1.") || strstr(fqn, ".w3.");
        bool row = strstr(fqn, ".wo.") || strstr(fqn, ".w2.");
        /* vocab-sharded: the embedding's table (rowwise) and the output projection (colwise) */
        bool vocab = !strcmp(fqn, "tok_embeddings.weight") || !strcmp(fqn, "output.weight");
        cr_expect_str_eq(tp, col || vocab ? "S(0)" : row ? "S(1)" : "R", "%s", fqn);
        cr_expect_eq(lb * (col || row || vocab ? 2 : 1), gb, "%s", fqn);
        tp_weights += col || row || vocab;
    }
    cr_expect_eq(tp_weights, 6 * 7 + 2);
    json_t *comm = json_object_get(root, "communication");
    json_t *tp = json_object_get(json_object_get(comm, "by_mesh_dim"), "tp");
    json_t *ar = json_object_get(tp, "all_reduce");
    cr_assert(ar, "no all_reduce on tp");
    /* plus the embedding's Partial output and the output projection's input gradient; the
     * logits gathered before the cross entropy (no loss parallel), (n-1)/n of [B·T, V] f32;
     * local chunks (the embedding's chunk start, the logits' and output.weight's gradients)
     * move nothing */
    int64_t btd = 4 * 16 * 256, per = btd * 4 * 2 * (2 - 1) / 2; /* f32, 2(n-1)/n */
    int64_t logits = 4 * 16 * 2048 * 4 / 2;
    cr_expect_eq(json_integer_value(json_object_get(ar, "count")), 4 * 6 + 2);
    cr_expect_eq(json_integer_value(json_object_get(ar, "bytes")), (4 * 6 + 2) * per);
    json_t *ag = json_object_get(tp, "all_gather_into_tensor"),
           *lc = json_object_get(tp, "local_chunk");
    cr_expect_eq(json_integer_value(json_object_get(ag, "count")), 1, "the logits");
    cr_expect_eq(json_integer_value(json_object_get(ag, "bytes")), logits);
    cr_expect_eq(json_integer_value(json_object_get(lc, "bytes")), 0);
    cr_expect_eq(json_object_size(tp), 3, "all-reduces, the logits' gather, local chunks");
    cr_expect_eq(json_integer_value(json_object_get(comm, "bytes_per_step")),
                 (4 * 6 + 2) * per + logits);
    json_decref(root);
    hp_th_run r = hp_th_run_bin(tmpdir, "worker/hp-worker", "--standalone %s/tp.pb --out %s/run",
                                tmpdir, tmpdir);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "done: steps 1.."), "%s", r.out);
    hp_th_run_free(&r);
    /* dp x tp plans too: the batch over dp, Megatron's all-reduces at the local batch on tp */
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2,tp=2 --tp-plan llama "
             "-o %s/dptp.pb",
             tmpdir));
    root = plan_json("dptp.pb", "");
    ar = json_object_get(
        json_object_get(json_object_get(json_object_get(root, "communication"), "by_mesh_dim"),
                        "tp"),
        "all_reduce");
    cr_expect_eq(json_integer_value(json_object_get(ar, "bytes")), (4 * 6 + 2) * per / 2);
    json_decref(root);
}

Test(hpctl_plan, json_memory_is_one_nth) {
    ok(hpctl("new --model llama3:debugmodel --batch 6 --seq 32 --mesh dp=2 " ALL_FSDP " -o %s/j.pb",
             tmpdir));
    json_t *w1 = plan_json("j.pb", "--world 1"), *w2 = plan_json("j.pb", ""),
           *w3 = plan_json("j.pb", "--world 3");
    cr_expect_eq(json_integer_value(json_object_get(w1, "world")), 1);
    cr_expect_eq(json_integer_value(json_object_get(w2, "world")), 2);
    static const char *const keys[] = {"params", "grads", "optimizer"};
    for (size_t i = 0; i < 3; i++) {
        int64_t m1 = mem(w1, keys[i]), m2 = mem(w2, keys[i]), m3 = mem(w3, keys[i]);
        cr_expect_gt(m1, 0);
        /* debugmodel: every dim 0 is even, so world 2 is exactly half */
        cr_expect_eq(2 * m2, m1, "%s: world 2 %lld, world 1 %lld", keys[i], (long long)m2,
                     (long long)m1);
        /* 256 and 768 rows do not split in 3: padding, at most one row (<= 768 f32) per
         * parameter (57) per rank, x2 for the optimizer's moments */
        int64_t pad = 57 * 768 * 4 * (i == 2 ? 2 : 1);
        cr_expect(3 * m3 >= m1 && m3 <= m1 / 3 + pad, "%s: world 3 %lld, world 1 %lld", keys[i],
                  (long long)m3, (long long)m1);
    }
    int64_t p1 = mem(w1, "params"), g1 = mem(w1, "grads"), o1 = mem(w1, "optimizer");
    int64_t p2 = mem(w2, "params"), g2 = mem(w2, "grads"), o2 = mem(w2, "optimizer");
    cr_expect_eq(2 * (p2 + g2 + o2), p1 + g1 + o1);
    /* communication only with more than one rank */
    json_t *c1 = json_object_get(w1, "communication"), *c2 = json_object_get(w2, "communication");
    cr_expect_eq(json_integer_value(json_object_get(c1, "bytes_per_step")), 0);
    cr_expect_gt(json_integer_value(json_object_get(c2, "bytes_per_step")), 0);
    cr_expect_gt(json_integer_value(json_object_get(c2, "collectives")), 0);
    json_t *e2 = json_object_get(w2, "estimate");
    cr_expect_gt(json_real_value(json_object_get(e2, "step_s")), 0);
    /* the compute time by op adds up to the compute time; the GEMMs hold every FLOP but the
     * attention's (the debugmodel's is fused) */
    json_t *by_op = json_object_get(e2, "compute_by_op"), *v;
    const char *op;
    double sum = 0, flops = 0;
    json_object_foreach(by_op, op, v) {
        cr_expect_gt(json_integer_value(json_object_get(v, "kernels")), 0, "%s", op);
        sum += json_real_value(json_object_get(v, "seconds"));
        if (strcmp(op, "mm") && !strstr(op, "attention"))
            flops += json_real_value(json_object_get(v, "flops"));
    }
    double compute = json_real_value(json_object_get(e2, "compute_s"));
    cr_expect(fabs(sum - compute) <= 1e-9 * compute, "by op %.9g s, compute %.9g s", sum, compute);
    cr_expect_eq(flops, 0);
    cr_expect_gt(json_real_value(json_object_get(json_object_get(by_op, "mm"), "flops")), 0);
    cr_expect_gt(json_array_size(json_object_get(w2, "assumptions")), 3);
    cr_expect_eq(json_array_size(json_object_get(w2, "passes")), 13); /* 12 passes + lower */
    json_decref(w1);
    json_decref(w2);
    json_decref(w3);
}

/* Does `hpctl plan --json TMPDIR/PB` warn with a line holding want? */
static bool plan_warns(const char *pb, const char *want) {
    json_t *root = plan_json(pb, "");
    json_t *w = json_object_get(root, "warnings");
    bool found = false;
    for (size_t i = 0; i < json_array_size(w); i++)
        found |= strstr(json_string_value(json_array_get(w, i)), want) != NULL;
    json_decref(root);
    return found;
}

Test(hpctl_plan, unmatched_pattern_is_a_warning) {
    ok(hpctl("new --model mlp --mesh dp=2 --fsdp 'layer.*' --fsdp 'layers.*' -o %s/j.pb", tmpdir));
    cr_expect(plan_warns("j.pb", "layer.*"), "no warning names 'layer.*'");
}

/* --no-reshard-after-forward where nothing is sharded changes nothing: said, not silent */
Test(hpctl_plan, reshard_flag_without_sharding_is_a_warning) {
    ok(hpctl("new --model mlp --mesh dp=2 --no-reshard-after-forward -o %s/r.pb", tmpdir));
    cr_expect(plan_warns("r.pb", "changes nothing: no parameter is sharded (no --fsdp marks)"));
    ok(hpctl("new --model mlp --no-reshard-after-forward -o %s/r1.pb", tmpdir));
    cr_expect(plan_warns("r1.pb", "no parameter is sharded (world 1)"));
    ok(hpctl("new --model mlp --mesh dp=2 --fsdp 'layers.*' --no-reshard-after-forward -o %s/r2.pb",
             tmpdir));
    cr_expect(!plan_warns("r2.pb", "reshard_after_forward"));
}

Test(hpctl_plan, new_writes_the_plan_flags) {
    ok(hpctl("new --model llama3:debugmodel --batch 8 --seq 16 --mesh dp=4 --fsdp 'layers.*' "
             "--fsdp output.weight --bucket-mb 2.5 --prefetch 3 --no-overlap "
             "--no-reshard-after-forward -o %s/j.pb",
             tmpdir));
    char path[300];
    snprintf(path, sizeof path, "%s/j.pb", tmpdir);
    hp_job *job = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_job_read_file(path, &job, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(job->plan.n_mesh, 1);
    cr_expect_str_eq(job->plan.mesh[0].name, "dp");
    cr_expect_eq(job->plan.mesh[0].size, 4);
    cr_expect_eq(job->resources.world_size, 4);
    cr_assert_eq(job->plan.n_fsdp_patterns, 1);
    cr_expect_str_eq(job->plan.fsdp_patterns[0], "layers.*");
    cr_assert_eq(job->plan.n_fsdp_fqns, 1);
    cr_expect_str_eq(job->plan.fsdp_fqns[0], "output.weight");
    cr_expect_eq(job->passes.bucket_bytes, (int64_t)(2.5 * (1 << 20)));
    cr_expect_eq(job->passes.prefetch_depth, 3);
    cr_expect(!job->passes.enable_overlap);
    cr_expect(!job->plan.reshard_after_forward);
    hp_job_free(job);
    /* and the defaults without them */
    ok(hpctl("new --model mlp -o %s/d.pb", tmpdir));
    snprintf(path, sizeof path, "%s/d.pb", tmpdir);
    cr_assert_eq(hp_job_read_file(path, &job, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(job->resources.world_size, 1);
    cr_expect(job->passes.enable_overlap);
    cr_expect(job->plan.reshard_after_forward);
    hp_job_free(job);
}

Test(hpctl_plan, errors) {
    expect_error(hpctl("plan"), 2, "which job file");
    expect_error(hpctl("plan a.pb --bogus"), 2, "unknown flag '--bogus'");
    expect_error(hpctl("plan a.pb --world 0"), 2, "--world: 0 is outside");
    expect_error(hpctl("plan a.pb --world x"), 2, "'x' is not an integer");
    expect_error(hpctl("plan a.pb --world"), 2, "--world: missing value");
    expect_error(hpctl("plan %s/missing.pb", tmpdir), 1, "missing.pb");
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 -o %s/j.pb", tmpdir));
    expect_error(hpctl("plan %s/j.pb --world 3", tmpdir), 1, "batch 4 is not divisible by world 3");
    /* FSDP marks with tensor parallelism are planned (FSDP in spmd, docs/placements.md); on a
     * mesh with no dp dim they have nothing to shard over: refused by name, never ignored */
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2,tp=2 --tp-plan llama "
             "--fsdp layers -o %s/nd.pb",
             tmpdir));
    ok(hpctl("plan %s/nd.pb", tmpdir));
    /* new writes the job as asked and warns, in one line, that the plan does not compile */
    hp_th_run w = hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 "
                        "--tp-plan llama --fsdp layers -o %s/nodp.pb",
                        tmpdir);
    cr_assert_eq(w.code, 0, "exit %d: %s", w.code, w.err);
    cr_expect(strstr(w.err, "hpctl: new: warning: the plan does not compile: plan (mesh "
                            "tp=2): FSDP marks shard parameters over the mesh dim named dp") &&
                  strchr(w.err, '\n') == w.err + strlen(w.err) - 1,
              "%s", w.err);
    hp_th_run_free(&w);
    expect_error(hpctl("plan %s/nodp.pb", tmpdir), 1,
                 "FSDP marks shard parameters over the mesh dim named dp");
    /* a dim nothing is placed on would only repeat work; one named for a parallelism hp does
     * not implement is refused by name, never run as something else */
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2,tp=2 -o %s/idle.pb",
             tmpdir));
    expect_error(hpctl("plan %s/idle.pb", tmpdir), 1,
                 "nothing is split over mesh dim 'tp' (2 ranks)");
    expect_error(hpctl("new --model llama3:debugmodel --mesh pp=2 -o x.pb"), 2,
                 "plan.mesh[0]: 'pp' names pipeline parallelism, which hp does not support yet");
    expect_error(hpctl("new --model llama3:debugmodel --mesh dp=2,cp=2 -o x.pb"), 2,
                 "'cp' names context parallelism");
    expect_error(hpctl("new --model mlp --mesh dp=2 --place 'nope.*=dp:S(0)' -o x.pb"), 2,
                 "plan.constraints[0]: pattern 'nope.*' matches no graph input");
    expect_error(hpctl("new --model mlp --mesh dp=2 --place 'layers.0.weight=tp:S(0)' -o x.pb"), 2,
                 "--place: 'tp' is not a dim of the mesh");
    expect_error(hpctl("new --model mlp --mesh dp=2 --place 'layers.0.weight=dp:S(5)' -o x.pb"), 2,
                 "Shard(5) outside rank 2");
    expect_error(hpctl("new --model mlp --mesh dp=2 --place 'layers.0.weight' -o x.pb"), 2,
                 "is not PATTERN=DIM:PLACEMENT");
    expect_error(hpctl("new --model mlp --mesh dp=2 --tp-plan llama -o x.pb"), 2,
                 "--tp-plan: the mesh has no 'tp' dim");
    expect_error(hpctl("new --model mlp --mesh tp=2 --tp-plan gpt -o x.pb"), 2,
                 "--tp-plan: 'gpt' is not a known plan");
    expect_error(hpctl("new --model mlp --mesh dp=2 --loss-parallel -o x.pb"), 2,
                 "--loss-parallel: the mesh has no 'tp' dim to split the vocabulary over");

    expect_error(hpctl("new --model mlp --mesh dp -o x.pb"), 2, "--mesh: 'dp' is not NAME=N");
    expect_error(hpctl("new --model mlp --mesh dp=0 -o x.pb"), 2, "--mesh: 0 is outside");
    expect_error(hpctl("new --model mlp --mesh =2 -o x.pb"), 2, "--mesh");
    expect_error(hpctl("new --model mlp --fsdp no.such.weight -o x.pb"), 2,
                 "'no.such.weight' names no parameter or module");
    expect_error(hpctl("new --model mlp --bucket-mb -1 -o x.pb"), 2, "--bucket-mb: -1 is outside");
    expect_error(hpctl("new --model mlp --prefetch 99 -o x.pb"), 2, "--prefetch: 99 is outside");
    expect_error(hpctl("new --model llama3:debugmodel --batch 3 --mesh dp=2 -o x.pb"), 2,
                 "do not split over the mesh's 2 data-parallel ranks");
    /* tensor-parallel ranks share their batch: a 1-D tp mesh does not split it, a dp x tp one
     * splits it over dp only */
    ok(hpctl("new --model llama3:debugmodel --dim 48 --heads 3 --kv-heads 3 --batch 2 --seq 16 "
             "--vocab 300 --ffn-hidden 96 --mesh tp=3 --tp-plan llama -o %s/tp3.pb",
             tmpdir));
    inspect_says("tp3.pb", "(2 per rank over 1 data-parallel rank)");
    expect_error(hpctl("new --model llama3:debugmodel --heads 4 --kv-heads 2 --batch 3 "
                       "--mesh dp=2,tp=2 --tp-plan llama -o x.pb"),
                 2, "--batch: 3 sequences do not split over the mesh's 2 data-parallel ranks");
    /* a tensor-parallel split that does not divide what it splits is refused by new, naming the
     * flag that placed it and the one that sized it, not when the job compiles */
    expect_error(hpctl("new --model llama3:debugmodel --dim 48 --heads 3 --kv-heads 3 --vocab 301 "
                       "--mesh tp=3 --tp-plan llama -o x.pb"),
                 2,
                 "--tp-plan: 'tok_embeddings.weight' splits its dim 0 of size 301 over mesh dim "
                 "'tp' into 3 pieces, which does not divide it (sized by --vocab)");
    expect_error(hpctl("new --model llama3:debugmodel --dim 48 --heads 6 --kv-heads 2 --vocab 300 "
                       "--mesh tp=3 --tp-plan llama -o x.pb"),
                 2,
                 "'layers.0.attention.wk.weight' splits its dim 0 of size 16 over mesh dim "
                 "'tp' into 3 pieces, which does not divide it (sized by --kv-heads)");
    expect_error(hpctl("new --model mlp --mesh dp=2,tp=3 --place 'layers.0.weight=tp:S(1)' "
                       "-o x.pb"),
                 2, "--place: 'layers.0.weight' splits its dim 1 of size 784 over mesh dim 'tp'");
    /* on dp a parameter's uneven split is FSDP's padded storage: accepted */
    ok(hpctl(
        "new --model mlp --batch 63 --mesh dp=3,tp=2 --place 'layers.0.weight=tp:S(0),dp:S(1)' "
        "-o %s/m.pb",
        tmpdir));
}

/* bytes_per_step of one collective kind in a --json report (0 when absent), and its dtype. */
static int64_t comm_kind_bytes(json_t *root, const char *op, const char **dtype) {
    json_t *k =
        json_object_get(json_object_get(json_object_get(root, "communication"), "by_op"), op);
    if (dtype) *dtype = k ? json_string_value(json_object_get(k, "dtype")) : NULL;
    return k ? json_integer_value(json_object_get(k, "bytes")) : 0;
}

/* --param-dtype bf16: the FSDP all-gathers move bf16, exactly half the f32 plan's bytes; the
 * reduce-scatters stay f32 (reduce_dtype) and keep their bytes; the report says so. */
Test(hpctl_plan, bf16_param_dtype_halves_all_gather_bytes) {
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2 " ALL_FSDP
             " --bucket-mb 0 -o %s/f32.pb",
             tmpdir));
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2 " ALL_FSDP
             " --bucket-mb 0 --param-dtype bf16 --reduce-dtype f32 -o %s/bf16.pb",
             tmpdir));
    json_t *a = plan_json("f32.pb", ""), *b = plan_json("bf16.pb", "");
    const char *da, *db;
    int64_t ga = comm_kind_bytes(a, "all_gather_into_tensor", &da);
    int64_t gb = comm_kind_bytes(b, "all_gather_into_tensor", &db);
    cr_assert_gt(ga, 0);
    cr_expect_eq(gb * 2, ga, "bf16 all-gathers %lld bytes, f32 %lld", (long long)gb, (long long)ga);
    cr_expect_str_eq(da, "f32");
    cr_expect_str_eq(db, "bf16");
    int64_t ra = comm_kind_bytes(a, "reduce_scatter_tensor", &da);
    int64_t rb = comm_kind_bytes(b, "reduce_scatter_tensor", &db);
    cr_expect_eq(rb, ra, "reduce-scatters stay f32");
    cr_expect_str_eq(db, "f32");
    json_t *mp = json_object_get(b, "mixed_precision");
    cr_expect_str_eq(json_string_value(json_object_get(mp, "param_dtype")), "bf16");
    cr_expect_str_eq(json_string_value(json_object_get(mp, "reduce_dtype")), "f32");
    /* the master shards (and so the optimizer) stay f32 */
    cr_expect_eq(mem(b, "params"), mem(a, "params"));
    cr_expect_eq(mem(b, "optimizer"), mem(a, "optimizer"));
    /* the bf16 copies of the (sharded) parameters persist: half the f32 shards' bytes or more
     * (each shard's copy is padded to the buffer alignment) */
    cr_expect_eq(mem(a, "param_copies"), 0);
    cr_expect_geq(2 * mem(b, "param_copies"), mem(b, "params"));
    cr_expect_lt(mem(b, "param_copies"), mem(b, "params"));
    json_decref(a);
    json_decref(b);
    hp_th_run r = hpctl("plan %s/bf16.pb", tmpdir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "precision   param bf16"), "%s", r.out);
    cr_expect(strstr(r.out, "param copies"), "%s", r.out);
    cr_expect(strstr(r.out, "mixed_precision        yes"), "%s", r.out);
    cr_expect(strstr(r.out, "fuse_cross_entropy: fused 1 loss (_log_softmax, nll_loss and their "
                            "backwards) into fused_cross_entropy"),
              "%s", r.out);
    /* "communication per step per rank: ... (all_gather_into_tensor 57: 11.3 MiB bf16, ...)" */
    const char *line = strstr(r.out, "communication per step per rank:");
    cr_assert(line, "%s", r.out);
    const char *eol = strchr(line, '\n'), *ag = strstr(line, "all_gather_into_tensor ");
    cr_assert(ag && eol && ag < eol, "%s", line);
    const char *comma = strchr(ag, ',');
    const char *bf = strstr(ag, " bf16");
    cr_expect(bf && bf < eol && (!comma || bf < comma), "the all-gathers' dtype: %.*s",
              (int)(eol - line), line);
    hp_th_run_free(&r);
}

/* Policies the compiler does not implement are refused, naming the flag or the plan; TP, DDP
 * and world 1 compile. */
Test(hpctl_plan, mixed_precision_errors) {
    expect_error(hpctl("new --model mlp --param-dtype f16 -o x.pb"), 2,
                 "--param-dtype: 'f16' is not f32 or bf16");
    expect_error(hpctl("new --model mlp --param-dtype i32 -o x.pb"), 2,
                 "--param-dtype: 'i32' is not f32 or bf16");
    expect_error(hpctl("new --model mlp --reduce-dtype bf16 -o x.pb"), 2,
                 "--reduce-dtype: 'bf16' is not supported; gradients are reduced in f32");
    expect_error(hpctl("new --model mlp --param-dtype -o x.pb"), 2, "--param-dtype");
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 --tp-plan llama "
             "--param-dtype bf16 -o %s/tp.pb",
             tmpdir));
    ok(hpctl("plan %s/tp.pb", tmpdir)); /* TP compiles (test_tp_train trains it) */
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh tp=2 --tp-plan llama "
             "--loss-parallel --param-dtype bf16 -o %s/lp.pb",
             tmpdir));
    ok(hpctl("plan %s/lp.pb", tmpdir)); /* its cross entropy in f32 (test_pipeline_precision) */
    /* DDP (nothing marked) and world 1 compile */
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --mesh dp=2 --param-dtype bf16 "
             "-o %s/ddp.pb",
             tmpdir));
    json_t *d = plan_json("ddp.pb", "");
    const char *dt;
    cr_expect_gt(comm_kind_bytes(d, "all_reduce", &dt), 0);
    cr_expect_str_eq(dt, "f32", "DDP's gradient all-reduces run in reduce_dtype");
    json_decref(d);
    ok(hpctl("new --model llama3:debugmodel --batch 4 --seq 16 --param-dtype bf16 -o %s/one.pb",
             tmpdir));
    ok(hpctl("plan %s/one.pb", tmpdir));
}

/* Auto-sharding from the command line: the flags, the solver section (text and JSON), explain,
 * and each refusal in one line. */
Test(hpctl_plan, auto_sharding_flags_solver_and_explain) {
    const char *model = "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                        "--ffn-hidden 96 --vocab 128 --batch 4 --seq 16";
    ok(hpctl("new %s --mesh dp=2,tp=2 --mode auto --device-profile h100 --constrain "
             "'output.weight=tp:S(0)' -o %s/a.pb",
             model, tmpdir));
    hp_th_run r = hpctl("plan %s/a.pb", tmpdir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "auto-sharding (plan.mode auto) on profile h100") &&
                  strstr(r.out, "modelled step") && strstr(r.out, "variables"),
              "%s", r.out);
    hp_th_run_free(&r);
    json_t *root = plan_json("a.pb", "");
    json_t *sv = json_object_get(root, "solver");
    cr_assert(json_is_object(sv), "no solver section");
    cr_expect_gt(json_integer_value(json_object_get(sv, "variables")), 0);
    cr_expect_gt(json_integer_value(json_object_get(sv, "constraints")), 0);
    cr_expect_gt(json_real_value(json_object_get(sv, "objective_s")), 0);
    cr_expect(json_is_real(json_object_get(sv, "gap")));
    json_decref(root);
    r = hpctl("plan %s/a.pb --explain output.weight", tmpdir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "chosen: stored") && strstr(r.out, "tp:S(0)") &&
                  strstr(r.out, "bound by: plan.constraints[0]"),
              "%s", r.out);
    hp_th_run_free(&r);
    expect_error(hpctl("plan %s/a.pb --explain no.such", tmpdir), 2, "'no.such' is neither");
    expect_error(hpctl("plan %s/a.pb --device-profile tpu", tmpdir), 2,
                 "device profile 'tpu' is unknown");
    expect_error(hpctl("new %s --mesh dp=2 --mode magic -o %s/b.pb", model, tmpdir), 2,
                 "--mode: 'magic' is not fsdp or auto");
    expect_error(
        hpctl("new %s --mesh dp=2 --mode auto --param-memory-budget 0.5 -o %s/b.pb", model, tmpdir),
        2, "is not LOW,HIGH");
    expect_error(hpctl("new %s --mesh dp=2 --param-memory-budget 0,0.5 -o %s/b.pb", model, tmpdir),
                 2, "add --mode auto");
    ok(hpctl("new %s --mesh dp=2 -o %s/f.pb", model, tmpdir));
    expect_error(hpctl("plan %s/f.pb --explain output.weight", tmpdir), 2, "not auto-sharded");
    ok(hpctl("new %s --mesh dp=2 --mode auto --device-profile h100 --param-memory-budget 0,0.1 -o "
             "%s/c.pb",
             model, tmpdir));
    expect_error(hpctl("plan %s/c.pb", tmpdir), 1,
                 "plan.param_memory_budget (0, 0.1) cannot be met");
}
