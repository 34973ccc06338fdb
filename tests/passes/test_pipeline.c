/* The pass manager (passes/pipeline.c) and what it reports (passes/cost.c): the verifier
 * passes after every pass on every model builder, at world 1 and with FSDP; DCE and
 * canonicalize keep the graph's values (reference evaluator, f64) and are idempotent; the
 * memory report shrinks to 1/N (+ padding) with FSDP on everything; the cost model counts the
 * model's FLOPs; world/mesh/batch errors name the values; switches, dumps and a fault
 * injection loop.
 */
#include "hp/autoshard.h"
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "passes/passes_internal.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void force_verify(void) {
    setenv("HP_VERIFY_PASSES", "1", 1);
    unsetenv("HP_DUMP");
}

TestSuite(pipeline, .init = force_verify, .timeout = 300);

/* ---- fixtures -------------------------------------------------------------------------------- */

typedef struct model_case {
    const char *spec;
    int64_t dim, layers, heads, kv_heads, ffn, vocab, batch, seq;
} model_case;

static hp_job *make_job(const model_case *m, int world, bool fsdp_all) {
    hp_job *job = hp_job_new();
    cr_assert_not_null(job);
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse(m->spec, &job->model, &err), HP_OK, "%s", err.msg);
    hp_model_spec *s = &job->model;
    s->dim = m->dim, s->n_layers = m->layers, s->n_heads = m->heads, s->n_kv_heads = m->kv_heads;
    s->ffn_hidden = m->ffn, s->vocab = m->vocab, s->batch = m->batch, s->seq = m->seq;
    cr_assert_eq(hp_model_build_joint(s, &job->graph, &err), HP_OK, "%s: %s", m->spec, err.msg);
    job->plan.mesh[0].size = job->resources.world_size = world;
    if (fsdp_all) {
        static const char *const pats[] = {"layers.*", "tok_embeddings.*", "output.*", "norm.*",
                                           "fc*"};
        for (size_t i = 0; i < HP_ARRAY_LEN(pats); i++)
            cr_assert_eq(hp_job_add_fsdp_pattern(job, pats[i], &err), HP_OK, "%s", err.msg);
    }
    return job;
}

/* The report of the pass (or "lower") by name. */
static const hp_pass_report *report(const hp_compiled *c, const char *name) {
    for (int i = 0; i < c->n_passes; i++)
        if (!strcmp(c->passes[i].name, name)) return &c->passes[i];
    cr_assert_fail("no pass named %s", name);
    return NULL;
}

static hp_compiled *compile_ok(const hp_job *job, int world) {
    hp_compiled *c = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_compile(job, world, &c, &err), HP_OK, "%s at world %d: %s", job->model.flavor,
                 world, err.msg);
    return c;
}

static const model_case DEBUGMODEL = {"llama3:debugmodel", .batch = 4, .seq = 64};
static const model_case TINY = {"llama3:debugmodel", 64, 2, 4, 2, 96, 128, 6, 16};
static const model_case TINY_ODD = {"llama3:debugmodel", 48, 1, 2, 1, 40, 50, 3, 8}; /* pads */
static const model_case MLP = {"mlp", .batch = 8};
static const model_case LLAMA_8B = {"llama3:8B", .batch = 8, .seq = 2048};

/* The structural invariants of any compile. */
static void check_reports(const hp_compiled *c, const hp_job *job, int world) {
    static const char *const names[] = {
        "dce",         "canonicalize", "fuse_attention",  "loss_parallel",
        "spmd",        "fsdp",         "mixed_precision", "fuse_cross_entropy",
        "fuse_swiglu", "overlap",      "bucketing",       "lower"};
    cr_assert_eq(c->n_passes, 12);
    for (int i = 0; i < c->n_passes; i++) {
        const hp_pass_report *r = &c->passes[i];
        cr_expect_str_eq(r->name, names[i]);
        cr_expect_geq(r->seconds, 0);
        if (i > 0 && i < 10) cr_expect_eq(r->nodes_in, c->passes[i - 1].nodes_out, "%s", r->name);
        if (!r->ran && i < 10) cr_expect_eq(r->nodes_in, r->nodes_out, "%s", r->name);
    }
    cr_expect(report(c, "dce")->ran && report(c, "canonicalize")->ran && report(c, "lower")->ran);
    cr_expect(!report(c, "spmd")->ran, "spmd runs only for placed plans");
    cr_expect_eq(report(c, "fsdp")->ran, world > 1, "fsdp runs exactly when world > 1");
    cr_expect_eq(report(c, "lower")->nodes_in, c->graph->n_nodes);
    cr_expect_eq(report(c, "lower")->nodes_out, c->program->n_instrs);
    cr_expect_eq(c->world, world);
    hp_err err = {0};
    cr_expect_eq(hp_graph_verify(c->graph, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_program_verify(c->program, &err), HP_OK, "%s", err.msg);
    const hp_memory_report *m = &c->memory;
    cr_expect_eq(m->total, m->params + m->grads + m->optimizer + m->activations + m->comm);
    cr_expect_gt(m->params, 0);
    cr_expect_gt(m->activations, 0);
    cr_expect_gt(c->cost.flops, 0);
    cr_expect(fabs(c->cost.step_s - c->cost.compute_s - c->cost.exposed_comm_s -
                   c->cost.optimizer_s) <= 1e-12 * c->cost.step_s);
    cr_expect_leq(c->cost.exposed_comm_s, c->cost.comm_s + 1e-15);
    if (world == 1) {
        cr_expect_eq(report(c, "lower")->collectives, 0);
        cr_expect_eq(c->cost.comm_s, 0);
    } else {
        /* FSDP has run: every gradient is reduced (reduce-scatter or all-reduce) and the loss
         * averaged, so a multi-rank graph always communicates */
        cr_expect_gt(report(c, "fsdp")->collectives, 0, "%s: no collectives after fsdp at world %d",
                     job->model.flavor, world);
        cr_expect_gt(report(c, "fsdp")->comm_bytes, 0);
        cr_expect_gt(c->cost.comm_s, 0);
    }
}

/* ---- the verifier after every pass, on every builder ---------------------------------------- */

static void compile_case(const model_case *m, int world, bool fsdp_all) {
    hp_job *job = make_job(m, world, fsdp_all);
    hp_compiled *c = compile_ok(job, world);
    check_reports(c, job, world);
    hp_compiled_free(c);
    hp_job_free(job);
}

Test(pipeline, debugmodel_world1_and_2) {
    compile_case(&DEBUGMODEL, 1, false);
    compile_case(&DEBUGMODEL, 2, true);
    compile_case(&DEBUGMODEL, 2, false); /* nothing marked: plain data parallelism */
}

Test(pipeline, small_configs) {
    compile_case(&TINY, 1, false);
    compile_case(&TINY, 2, true);
    compile_case(&TINY, 3, true);
    compile_case(&TINY_ODD, 3, true);
}

Test(pipeline, mlp) {
    compile_case(&MLP, 1, false);
    compile_case(&MLP, 2, true);
    compile_case(&MLP, 4, false);
}

Test(pipeline, llama8b_world8_compile_only) {
    compile_case(&LLAMA_8B, 8, true);
}

/* ---- memory: FSDP on everything leaves 1/N per rank, plus padding --------------------------- */

static int64_t sharded_param_bytes(const hp_graph *g, int world) {
    hp_graph_inputs in = hp_graph_count_inputs(g);
    int64_t bytes = 0;
    for (int i = 0; i < in.n_params; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        int64_t d0 = t->rank ? t->shape[0] : 1, row = hp_type_numel(t) / (d0 ? d0 : 1);
        bytes += (d0 + world - 1) / world * row * (int64_t)hp_dtype_size(t->dtype);
    }
    return bytes;
}

Test(pipeline, memory_is_one_nth_with_fsdp) {
    const model_case *cases[] = {&TINY, &TINY_ODD};
    const int worlds[] = {2, 3};
    for (size_t k = 0; k < HP_ARRAY_LEN(cases); k++) {
        hp_job *j1 = make_job(cases[k], 1, false);
        hp_compiled *c1 = compile_ok(j1, 1);
        int n = worlds[k];
        hp_job *jn = make_job(cases[k], n, true);
        hp_compiled *cn = compile_ok(jn, n);
        int64_t want = sharded_param_bytes(j1->graph, n);
        cr_expect_eq(cn->memory.params, want, "world %d: params %lld, want %lld (1/N + padding)", n,
                     (long long)cn->memory.params, (long long)want);
        cr_expect_eq(cn->memory.grads, want);
        cr_expect_eq(cn->memory.optimizer, 2 * want); /* f32 parameters: 2 moments each */
        cr_expect_lt(cn->memory.params, c1->memory.params / n + c1->memory.params / 10);
        cr_expect_eq(c1->memory.params, 4 * hp_graph_param_count(j1->graph)); /* f32 */
        cr_expect_eq(c1->memory.optimizer, 2 * c1->memory.params);
        hp_compiled_free(c1);
        hp_compiled_free(cn);
        hp_job_free(j1);
        hp_job_free(jn);
    }
}

/* ---- the cost model -------------------------------------------------------------------------- */

Test(pipeline, cost_model_counts_the_models_flops) {
    hp_job *job = make_job(&DEBUGMODEL, 1, false);
    hp_compiled *c = compile_ok(job, 1);
    double want =
        hp_model_flops_per_token(&job->model) * (double)(DEBUGMODEL.batch * DEBUGMODEL.seq);
    /* the graph's count and torchtitan's 6N + 12LdT formula agree up to the small terms the
     * formula drops */
    cr_expect(fabs(c->cost.flops - want) < 0.02 * want, "graph %g vs formula %g", c->cost.flops,
              want);
    /* on the cpu profile (this machine's probe, or the assumed figures): each kernel at least
     * its FLOPs at peak (the roofline; a causal attention computes about half the pairs the
     * count includes, so its counted FLOPs may go at up to twice the peak) */
    hp_device_profile cpu;
    hp_err err = {0};
    cr_assert_eq(hp_device_profile_get("cpu", 0, &cpu, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(c->cost.peak_flops, cpu.peak_flops);
    cr_expect_eq(c->cost.efficiency, cpu.efficiency);
    cr_expect_str_eq(c->cost.profile, "cpu");
    cr_expect_geq(c->cost.compute_s, c->cost.flops / (2 * cpu.peak_flops));
    cr_expect_gt(c->cost.optimizer_s, 0);
    /* what runs is priced: the program's materialized views (transposes not folded into a GEMM)
     * are copies, so the estimate from the program exceeds the graph-only one by them */
    int views = 0;
    double copies = 0;
    for (int k = 0; k < c->program->n_instrs; k++) {
        const hp_node *n = &c->graph->nodes[c->program->instrs[k].node];
        if (!(hp_op_get(n->op)->flags & HP_OPF_VIEW)) continue;
        views++;
        copies +=
            2.0 * (double)(hp_type_numel(&n->out[0]) * (int64_t)hp_dtype_size(n->out[0].dtype)) /
                cpu.mem_bw +
            cpu.kernel_s;
    }
    cr_expect_gt(views, 0, "the debugmodel lowers no view to a copy");
    hp_cost_estimate again, graph_only;
    cr_assert_eq(hp__cost_estimate(c->graph, c->program, job, &again, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp__cost_estimate(c->graph, NULL, job, &graph_only, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(again.compute_s, c->cost.compute_s);
    cr_expect_float_eq(c->cost.compute_s - graph_only.compute_s, copies, 1e-9 + 1e-9 * copies,
                       "%d views: %g s of copies, estimates %g vs %g", views, copies,
                       c->cost.compute_s, graph_only.compute_s);
    hp_job *j2 = make_job(&DEBUGMODEL, 2, true);
    j2->resources.device = HP_DEVICE_CUDA;
    j2->resources.gpus_per_node = 8;
    hp_compiled *c2 = compile_ok(j2, 2);
    /* the batch is split: half the FLOPs per rank */
    cr_expect(fabs(c2->cost.flops - c->cost.flops / 2) < 1e-6 * c->cost.flops);
    cr_expect_eq(c2->cost.peak_flops, 989e12);
    hp_device_profile h100;
    cr_assert_eq(hp_device_profile_get("h100", 0, &h100, &err), HP_OK, "%s", err.msg);
    cr_expect_str_eq(c2->cost.profile, "h100");
    cr_expect_eq(c2->cost.bandwidth, h100.intra.bandwidth, "2 ranks fit in a node: NVLink");
    hp_compiled_free(c);
    hp_compiled_free(c2);
    hp_job_free(job);
    hp_job_free(j2);
}

Test(pipeline, comm_bytes_convention) {
    const char *text = "hpir 1\n"
                       "%0: f32[2,4] = placeholder() {kind=data, fqn=\"x\"}\n"
                       "%1: f32[8,4] = all_gather_into_tensor(%0) {group_size=4}\n"
                       "%2: f32[2,4] = reduce_scatter_tensor(%1) {group_size=4, reduce_op=avg}\n"
                       "%3: f32[8,4] = all_reduce(%1) {group_size=4, reduce_op=sum}\n"
                       "%4: f32[8,4] = all_reduce(%1) {group_size=1, reduce_op=sum}\n"
                       "%5: f32[8,4] = wait_tensor(%3)\n"
                       "return %5, %2, %4\n";
    hp_graph *g = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_graph_parse(text, strlen(text), &g, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_collective_bytes(g, 0), 0);
    cr_expect_eq(hp_collective_bytes(g, 1), 128 * 3 / 4); /* receives (N-1)/N of its output */
    cr_expect_eq(hp_collective_bytes(g, 2), 128 * 3 / 4); /* sends (N-1)/N of its input */
    cr_expect_eq(hp_collective_bytes(g, 3), 2 * 128 * 3 / 4);
    cr_expect_eq(hp_collective_bytes(g, 4), 0);
    cr_expect_eq(hp_collective_bytes(g, 5), 0);
    hp_graph_free(g);
}

/* ---- DCE and canonicalize keep values and are idempotent ------------------------------------ */

static hp_graph *run_pass(hp_pass_fn fn, const hp_graph *g) {
    hp_job job;
    hp_job_init_defaults(&job);
    hp_pass_ctx *ctx = calloc(1, sizeof *ctx);
    ctx->job = &job;
    ctx->world = 1;
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(fn(g, ctx, &out, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_verify(out, &err), HP_OK, "%s", err.msg);
    free(ctx);
    hp_job_fini(&job);
    return out;
}

/* Evaluates g in f64 on deterministic inputs (tokens/labels in [0, vocab)). */
static void eval_graph(const hp_graph *g, int64_t vocab, hp_tensor *outs) {
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n = gi.n_params + gi.n_buffers + gi.n_data;
    hp_tensor *in = calloc((size_t)n, sizeof *in);
    hp_err err = {0};
    for (int i = 0; i < n; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, &err), HP_OK, "%s", err.msg);
        int64_t k = hp_type_numel(t);
        if (hp_dtype_is_float(t->dtype)) {
            hp_th_rand(in[i].data, k, 1000 + (uint64_t)i, -0.5, 0.5);
        } else {
            for (int64_t e = 0; e < k; e++) in[i].data[e] = (double)((e * 7 + i) % vocab);
        }
    }
    hp_eval_opts opts = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, in, n, &opts, outs, &err), HP_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) hp_tensor_free(&in[i]);
    free(in);
}

Test(pipeline, dce_and_canonicalize_keep_values) {
    hp_job *job = make_job(&TINY, 1, false);
    const hp_graph *g = job->graph;
    hp_graph *d = run_pass(hp_pass_dce, g);
    hp_graph *c = run_pass(hp_pass_canonicalize, d);
    cr_expect_lt(c->n_nodes, g->n_nodes, "canonicalize found nothing to fold in a joint graph");
    cr_assert_eq(c->n_outputs, g->n_outputs);
    hp_tensor *want = calloc((size_t)g->n_outputs, sizeof *want);
    hp_tensor *got = calloc((size_t)g->n_outputs, sizeof *got);
    eval_graph(g, TINY.vocab, want);
    eval_graph(c, TINY.vocab, got);
    for (int i = 0; i < g->n_outputs; i++) {
        cr_assert(hp_type_eq(&want[i].type, &got[i].type), "output %d changed type", i);
        char what[32];
        snprintf(what, sizeof what, "output %d", i);
        hp_th_expect_close(got[i].data, want[i].data, hp_type_numel(&want[i].type), 1e-12, what);
        hp_tensor_free(&want[i]);
        hp_tensor_free(&got[i]);
    }
    free(want);
    free(got);
    hp_graph_free(d);
    hp_graph_free(c);
    hp_job_free(job);
}

Test(pipeline, dce_and_canonicalize_are_idempotent) {
    const model_case *cases[] = {&TINY, &MLP, &TINY_ODD};
    for (size_t k = 0; k < HP_ARRAY_LEN(cases); k++) {
        hp_job *job = make_job(cases[k], 1, false);
        hp_graph *d1 = run_pass(hp_pass_dce, job->graph), *d2 = run_pass(hp_pass_dce, d1);
        cr_expect(hp_graph_eq(d1, d2), "%s: dce twice differs from once", cases[k]->spec);
        hp_graph *c1 = run_pass(hp_pass_canonicalize, d1), *c2 = run_pass(hp_pass_canonicalize, c1);
        cr_expect(hp_graph_eq(c1, c2), "%s: canonicalize twice differs from once", cases[k]->spec);
        /* the normal form: no reshape, squeeze, unsqueeze, clone, t(t(x)) left */
        for (int i = 0; i < c1->n_nodes; i++) {
            const hp_node *n = &c1->nodes[i];
            cr_expect(n->op != HP_OP_RESHAPE && n->op != HP_OP_SQUEEZE &&
                          n->op != HP_OP_UNSQUEEZE && n->op != HP_OP_CLONE,
                      "node %d (%s) survived canonicalize", i, hp_op_get(n->op)->name);
            if (n->op == HP_OP_T)
                cr_expect_neq(c1->nodes[n->in[0].node].op, HP_OP_T, "t(t(x)) at node %d", i);
        }
        hp_graph_free(d1);
        hp_graph_free(d2);
        hp_graph_free(c1);
        hp_graph_free(c2);
        hp_job_free(job);
    }
}

/* ---- validation ------------------------------------------------------------------------------ */

static void expect_compile_error(const hp_job *job, int world, const char *w1, const char *w2) {
    hp_compiled *c = (hp_compiled *)1;
    hp_err err = {0};
    cr_expect_neq(hp_compile(job, world, &c, &err), HP_OK);
    cr_expect_null(c);
    cr_expect(strstr(err.msg, w1) && strstr(err.msg, w2), "'%s' lacks '%s' or '%s'", err.msg, w1,
              w2);
}

Test(pipeline, world_must_match_the_mesh) {
    hp_job *job = make_job(&MLP, 2, false);
    expect_compile_error(job, 4, "world 4", "dp=2");
    hp_compiled *c = compile_ok(job, 0); /* 0: the job's world */
    cr_expect_eq(c->world, 2);
    hp_compiled_free(c);
    hp_job_free(job);
}

/* Explicit placements go through the placement passes; a memory budget,
 * which only auto-sharding would honour, is refused, never silently dropped. */
Test(pipeline, placements_are_planned_and_a_budget_refused) {
    hp_job *job = make_job(&MLP, 2, false);
    snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "tp");
    hp_err err = {0};
    hp_placement p = HP_SHARD(0); /* column-parallel first layer */
    cr_assert_eq(hp_job_add_place_pattern(job, "layers.0.*", &p, 1, &err), HP_OK, "%s", err.msg);
    hp_compiled *c = compile_ok(job, 2);
    cr_expect(report(c, "spmd")->ran && !report(c, "fsdp")->ran, "spmd instead of fsdp");
    const hp_placement *w = hp_value_placements(c->graph, (hp_value){0, 0});
    cr_assert(w && hp_placement_eq(w[0], HP_SHARD(0)), "layers.0.weight placed");
    /* rank 1 holds the second half of its rows */
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
    cr_assert_eq(hp_program_box(c->program, 0, 1, off, len, &err), HP_OK, "%s", err.msg);
    cr_expect(off[0] == len[0] && len[0] * 2 == c->program->params[0].global.shape[0]);
    hp_compiled_free(c);
    /* a parameter placed Shard on the data-parallel dim is FSDP's storage: gathered before use */
    snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "dp");
    c = compile_ok(job, 2);
    w = hp_value_placements(c->graph, (hp_value){0, 0});
    cr_assert(w && hp_placement_eq(w[0], HP_SHARD(0)), "layers.0.weight stored dp:S(0)");
    cr_expect_eq(hp_type_numel(&c->graph->nodes[0].out[0]) * 2,
                 hp_type_numel(&job->graph->nodes[0].out[0]));
    int gathers = 0;
    for (int i = 0; i < c->graph->n_nodes; i++)
        gathers += c->graph->nodes[i].op == HP_OP_ALL_GATHER;
    cr_expect_gt(gathers, 0);
    hp_compiled_free(c);
    /* a Partial parameter is no storage */
    p = HP_PARTIAL(HP_REDUCE_SUM);
    cr_assert_eq(hp_job_add_place_pattern(job, "layers.0.*", &p, 1, &err), HP_OK, "%s", err.msg);
    expect_compile_error(job, 2, "'layers.0.weight' is placed P(sum) on the data-parallel dim dp",
                         "stored Replicate or Shard there");
    hp_job_free(job);
    job = make_job(&MLP, 2, false);
    cr_assert_eq(hp_job_add_constraint(job, NULL, 0, &p, 1, &err), HP_OK, "%s", err.msg);
    expect_compile_error(job, 2, "plan.constraints[0]: a constraint on graph output 0",
                         "is not applied yet");
    hp_job_free(job);
    job = make_job(&MLP, 2, false);
    job->plan.mem_low = 0.1, job->plan.mem_high = 0.5;
    expect_compile_error(job, 2, "plan.param_memory_budget: (0.1, 0.5)",
                         "only honoured by auto-sharding");
    hp_job_free(job);
}

/* FSDP x TP on one 2-D mesh: torchtitan's TP plan on tp and FSDP marks on everything compile
 * through spmd; every parameter is stored Shard on dp (on the first tensor dim tp leaves
 * whole: colwise [out, in] dp:S(1), rowwise dp:S(0)), a quarter of it per rank when tp splits
 * it too, half otherwise. */
static void fsdp_x_tp_job(bool reshard) {
    hp_job *job = make_job(&TINY, 4, true);
    job->plan.n_mesh = 2;
    job->plan.mesh[0].size = 2;
    snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "dp");
    job->plan.mesh[1].size = 2;
    snprintf(job->plan.mesh[1].name, sizeof job->plan.mesh[1].name, "tp");
    job->plan.reshard_after_forward = reshard;
    job->passes.bucket_bytes = 0; /* spmd's collectives, one per parameter, are counted below */
    static const struct {
        const char *pattern;
        int dim;
    } tp[] = {{"layers.*.attention.wq.weight", 0},    {"layers.*.attention.wk.weight", 0},
              {"layers.*.attention.wv.weight", 0},    {"layers.*.attention.wo.weight", 1},
              {"layers.*.feed_forward.w1.weight", 0}, {"layers.*.feed_forward.w3.weight", 0},
              {"layers.*.feed_forward.w2.weight", 1}};
    hp_err err = {0};
    for (size_t i = 0; i < HP_ARRAY_LEN(tp); i++) {
        hp_placement pl[2] = {HP_REPLICATE, HP_SHARD(tp[i].dim)};
        cr_assert_eq(hp_job_add_place_pattern(job, tp[i].pattern, pl, 2, &err), HP_OK, "%s",
                     err.msg);
    }
    hp_compiled *c = compile_ok(job, 4);
    cr_expect(report(c, "spmd")->ran && !report(c, "fsdp")->ran, "spmd instead of fsdp");
    hp_graph_inputs gi = hp_graph_count_inputs(job->graph);
    for (int i = 0; i < gi.n_params; i++) {
        const hp_node *n = &c->graph->nodes[i];
        const char *fqn = hp_node_attr(n, HP_ATTR_FQN)->s;
        const hp_placement *w = hp_value_placements(c->graph, (hp_value){i, 0});
        cr_assert(w, "%s has no placements", fqn);
        bool col = false, row = false;
        for (size_t k = 0; k < HP_ARRAY_LEN(tp); k++)
            if (hp_fqn_match(tp[k].pattern, fqn)) *(tp[k].dim ? &row : &col) = true;
        hp_placement want_dp = HP_SHARD(col ? 1 : 0);
        hp_placement want_tp = col ? HP_SHARD(0) : row ? HP_SHARD(1) : HP_REPLICATE;
        char a[24], b[24];
        cr_expect(hp_placement_eq(w[0], want_dp) && hp_placement_eq(w[1], want_tp),
                  "%s: {dp:%s, tp:%s}", fqn, hp_placement_short(&w[0], a, sizeof a),
                  hp_placement_short(&w[1], b, sizeof b));
        cr_expect_eq(hp_type_numel(&n->out[0]) * (col || row ? 4 : 2),
                     hp_type_numel(&job->graph->nodes[i].out[0]), "%s", fqn);
    }
    int gathers = 0, scatters = 0;
    for (int i = 0; i < c->graph->n_nodes; i++) {
        const hp_attr *g = hp_node_attr(&c->graph->nodes[i], HP_ATTR_GROUP);
        if (!g || strcmp(g->s, "dp")) continue;
        gathers += c->graph->nodes[i].op == HP_OP_ALL_GATHER;
        scatters += c->graph->nodes[i].op == HP_OP_REDUCE_SCATTER;
    }
    cr_expect_eq(scatters, gi.n_params);
    if (reshard) /* all but tok_embeddings, which the backward does not read, twice */
        cr_expect_eq(gathers, 2 * gi.n_params - 1);
    else
        cr_expect_eq(gathers, gi.n_params);
    hp_compiled_free(c);
    hp_job_free(job);
}

Test(pipeline, fsdp_x_tp_compiles_through_spmd) {
    fsdp_x_tp_job(true);
    fsdp_x_tp_job(false);
}

/* FSDP marks on a mesh without a dp dim have nothing to shard over: refused by name. */
Test(pipeline, fsdp_marks_need_a_dp_dim) {
    hp_job *job = make_job(&TINY, 2, true);
    snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "tp");
    hp_err err = {0};
    hp_placement p = HP_SHARD(0);
    cr_assert_eq(hp_job_add_place_pattern(job, "layers.*.attention.wq.weight", &p, 1, &err), HP_OK,
                 "%s", err.msg);
    expect_compile_error(job, 2, "FSDP marks shard parameters over the mesh dim named dp",
                         "mesh tp=2");
    hp_job_free(job);
}

Test(pipeline, batch_must_divide_by_the_world) {
    model_case m = TINY;
    m.batch = 2;
    hp_job *job = make_job(&m, 3, true);
    expect_compile_error(job, 3, "batch 2", "world 3");
    hp_job_free(job);
}

Test(pipeline, switches_and_warnings) {
    hp_job *job = make_job(&TINY, 2, true);
    snprintf(job->passes.switches[0].name, HP_PASS_NAME_MAX, "canonicalize");
    job->passes.switches[0].enabled = false;
    snprintf(job->passes.switches[1].name, HP_PASS_NAME_MAX, "canonicalise");
    job->passes.switches[1].enabled = true;
    job->passes.n_switches = 2;
    job->passes.enable_overlap = false;
    hp_compiled *c = compile_ok(job, 2);
    cr_expect(!report(c, "canonicalize")->ran);
    cr_expect(!report(c, "overlap")->ran, "overlap honours enable_overlap");
    bool warned = false;
    for (int i = 0; i < c->n_warnings; i++) warned |= strstr(c->warnings[i], "canonicalise") != 0;
    cr_expect(warned, "no warning for a switch naming no pass");
    hp_compiled_free(c);
    /* an explicit switch turns fsdp off even at world 2 */
    snprintf(job->passes.switches[0].name, HP_PASS_NAME_MAX, "fsdp");
    job->passes.n_switches = 1;
    c = compile_ok(job, 2);
    cr_expect(!report(c, "fsdp")->ran);
    cr_expect_eq(report(c, "lower")->collectives, 0);
    hp_compiled_free(c);
    hp_job_free(job);
}

Test(pipeline, dumps_by_name) {
    char dir[] = "/tmp/hp-dump-XXXXXX";
    cr_assert(mkdtemp(dir));
    setenv("HP_DUMP", "dce,lower,input", 1);
    setenv("HP_DUMP_DIR", dir, 1);
    hp_job *job = make_job(&MLP, 1, false);
    snprintf(job->passes.dump[0], HP_PASS_NAME_MAX, "canonicalize");
    job->passes.n_dump = 1;
    hp_compiled *c = compile_ok(job, 1);
    static const char *const want[] = {"00-input.hpir", "01-dce.hpir", "02-canonicalize.hpir",
                                       "12-lower.txt"};
    char path[256];
    for (size_t i = 0; i < HP_ARRAY_LEN(want); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, want[i]);
        struct stat st;
        cr_expect(stat(path, &st) == 0 && st.st_size > 0, "%s missing", path);
    }
    snprintf(path, sizeof path, "%s/06-fsdp.hpir", dir);
    cr_expect_neq(access(path, F_OK), 0, "fsdp did not run, yet it was dumped");
    /* the canonicalize dump is the graph that pass produced (lowering starts from it) */
    hp_graph *g = NULL;
    hp_err err = {0};
    snprintf(path, sizeof path, "%s/02-canonicalize.hpir", dir);
    cr_assert_eq(hp_graph_read_file(path, &g, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(g->n_nodes, report(c, "canonicalize")->nodes_out);
    hp_graph_free(g);
    hp_compiled_free(c);
    hp_job_free(job);
    unsetenv("HP_DUMP");
    unsetenv("HP_DUMP_DIR");
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(pipeline, builds_the_graph_from_the_model) {
    hp_job *job = make_job(&MLP, 1, false);
    hp_graph_free(job->graph);
    job->graph = NULL;
    hp_compiled *c = compile_ok(job, 1);
    cr_expect_gt(c->graph->n_nodes, 0);
    hp_compiled_free(c);
    hp_job_free(job);
}

/* Every allocation failing in turn: an error each time, never a crash or (under ASan) a leak. */
Test(pipeline, fault_injection) {
    hp_job *job = make_job(&MLP, 2, true);
    hp_alloc_fail_at(-1);
    hp_compiled *c = compile_ok(job, 2);
    long total = hp_alloc_fail_at(-1);
    hp_compiled_free(c);
    cr_assert_gt(total, 10);
    for (long n = 0; n < total; n++) {
        hp_alloc_fail_at(n);
        hp_err err = {0};
        c = NULL;
        hp_status st = hp_compile(job, 2, &c, &err);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            hp_compiled_free(c);
            continue;
        }
        cr_expect_null(c);
        cr_expect(err.msg[0], "allocation %ld: an error without a message", n);
    }
    hp_job_free(job);
}

/* ---- overlap and bucketing on a placed plan ---------------------------------------------------
 */

/* The dp=2,tp=2 job of fsdp_x_tp_job with the given bucket size and overlap switch. */
/* TINY on (dp=2, tp=2): FSDP over dp, Megatron's column/row splits over tp. */
static hp_job *fsdp_x_tp_plan(int64_t bucket, bool overlap) {
    hp_job *job = make_job(&TINY, 4, true);
    job->plan.n_mesh = 2;
    job->plan.mesh[0].size = job->plan.mesh[1].size = 2;
    snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "dp");
    snprintf(job->plan.mesh[1].name, sizeof job->plan.mesh[1].name, "tp");
    job->passes.bucket_bytes = bucket;
    job->passes.enable_overlap = overlap;
    static const struct {
        const char *pattern;
        int dim;
    } tp[] = {{"layers.*.attention.wq.weight", 0},    {"layers.*.attention.wk.weight", 0},
              {"layers.*.attention.wv.weight", 0},    {"layers.*.attention.wo.weight", 1},
              {"layers.*.feed_forward.w1.weight", 0}, {"layers.*.feed_forward.w3.weight", 0},
              {"layers.*.feed_forward.w2.weight", 1}};
    hp_err err = {0};
    for (size_t i = 0; i < HP_ARRAY_LEN(tp); i++) {
        hp_placement pl[2] = {HP_REPLICATE, HP_SHARD(tp[i].dim)};
        cr_assert_eq(hp_job_add_place_pattern(job, tp[i].pattern, pl, 2, &err), HP_OK, "%s",
                     err.msg);
    }
    return job;
}

static hp_compiled *fsdp_x_tp_compile(int64_t bucket, bool overlap) {
    hp_job *job = fsdp_x_tp_plan(bucket, overlap);
    hp_compiled *c = compile_ok(job, 4);
    hp_job_free(job);
    return c;
}

/* hp_compile lends each graph of its own to the next pass, whose output shares the types and
 * attributes of the nodes it leaves as they were (and the program's graph the compiled
 * graph's), and DCE that removes nothing hands its input on: the compiled graph and program
 * equal those of the same passes run one by one on graphs that lend nothing, and outlive the
 * job's graph. */
static void expect_same_as_pass_by_pass(hp_job *job, int world) {
    hp_compiled *c = compile_ok(job, world);
    hp_pass_ctx ctx = {.job = job, .world = world};
    hp_graph *g = hp_graph_clone(job->graph);
    cr_assert_not_null(g);
    hp_err err = {0};
    int n, ran = 0;
    const hp__pass_entry *e = hp__passes(&n);
    for (int i = 0; i < n; i++) {
        if (!report(c, e[i].name)->ran) continue;
        hp_pass_report r = {0};
        ctx.report = &r;
        hp_graph *next = NULL;
        cr_assert_eq(e[i].fn(g, &ctx, &next, &err), HP_OK, "%s: %s", e[i].name, err.msg);
        hp_graph_free(g);
        g = next;
        ran++;
    }
    cr_expect_geq(ran, 5, "dce, canonicalize, fuse_attention, fsdp|spmd, overlap, bucketing");
    hp_autoshard_free(ctx.autoshard);
    hp_program *p = NULL;
    cr_assert_eq(hp_lower(g, &p, &err), HP_OK, "%s", err.msg);
    hp_graph_free(job->graph);
    job->graph = NULL;
    cr_expect(hp_graph_eq(c->graph, g), "the compiled graph differs from the passes' own");
    cr_expect(hp_graph_eq(c->program->graph, p->graph), "the program's graph differs");
    cr_expect_eq(c->program->n_instrs, p->n_instrs);
    cr_expect_eq(c->program->n_buffers, p->n_buffers);
    char *a = NULL, *b = NULL;
    cr_assert_eq(hp_graph_print(c->graph, &a, NULL, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_print(g, &b, NULL, &err), HP_OK, "%s", err.msg);
    cr_expect_str_eq(a, b);
    hp_free(a);
    hp_free(b);
    hp_program_free(p);
    hp_graph_free(g);
    hp_compiled_free(c);
}

Test(pipeline, shared_storage_changes_nothing) {
    hp_job *job = make_job(&TINY, 2, true);
    job->passes.bucket_bytes = (int64_t)1 << 20;
    job->passes.enable_overlap = true;
    expect_same_as_pass_by_pass(job, 2);
    hp_job_free(job);
    job = fsdp_x_tp_plan((int64_t)25 << 20, true);
    expect_same_as_pass_by_pass(job, 4);
    hp_job_free(job);
}

typedef struct group_count {
    int n;
    int64_t bytes;
} group_count;

static group_count on_group(const hp_graph *g, const char *group) {
    group_count k = {0};
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (!(hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE)) continue;
        const hp_attr *a = hp_node_attr(n, HP_ATTR_GROUP);
        cr_assert(a && (!strcmp(a->s, "dp") || !strcmp(a->s, "tp")), "node %d: no mesh dim", i);
        if (strcmp(a->s, group)) continue;
        k.n++;
        k.bytes += hp_collective_bytes(g, i);
    }
    return k;
}

/* FSDP over dp with TP over tp is one plan, and overlap and bucketing run on it: the compiled
 * graph verifies with its placements; bucketing merges dp's gathers and scatters (fewer
 * collectives, the same bytes) and moves no byte between the mesh dims; overlap issues dp's
 * parameter gathers ahead of the compute that needs them (their waits are not next to them). */
Test(pipeline, overlap_and_bucketing_on_fsdp_x_tp) {
    hp_compiled *plain = fsdp_x_tp_compile(0, false);
    hp_compiled *both = fsdp_x_tp_compile((int64_t)25 << 20, true);
    cr_expect(!report(plain, "overlap")->ran && !report(plain, "bucketing")->ran);
    cr_expect(report(both, "spmd")->ran && report(both, "overlap")->ran &&
              report(both, "bucketing")->ran);
    hp_err err = {0};
    cr_expect_eq(hp_graph_verify(both->graph, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_program_verify(both->program, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(both->graph->mesh.ndim, 2);
    group_count dp0 = on_group(plain->graph, "dp"), dp1 = on_group(both->graph, "dp");
    group_count tp0 = on_group(plain->graph, "tp"), tp1 = on_group(both->graph, "tp");
    cr_expect_lt(dp1.n, dp0.n, "dp collectives %d with bucketing, %d without", dp1.n, dp0.n);
    cr_expect_eq(dp1.bytes, dp0.bytes);
    cr_expect_eq(tp1.bytes, tp0.bytes);
    cr_expect_leq(tp1.n, tp0.n);
    /* every parameter placeholder keeps its storage placements */
    hp_graph_inputs gi = hp_graph_count_inputs(plain->graph);
    for (int i = 0; i < gi.n_params; i++) {
        const hp_placement *a = hp_value_placements(plain->graph, (hp_value){i, 0});
        const hp_placement *b = hp_value_placements(both->graph, (hp_value){i, 0});
        cr_assert(a && b);
        cr_expect(hp_placement_eq(a[0], b[0]) && hp_placement_eq(a[1], b[1]), "param %d", i);
    }
    /* prefetch: some dp gather has compute between it and its wait */
    const hp_graph *g = both->graph;
    int ahead = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_GROUP);
        if (g->nodes[i].op != HP_OP_ALL_GATHER || !a || strcmp(a->s, "dp")) continue;
        int w = i + 1;
        while (w < g->n_nodes &&
               !(g->nodes[w].op == HP_OP_WAIT_TENSOR && g->nodes[w].in[0].node == i))
            w++;
        for (int k = i + 1; k < w; k++)
            if (g->nodes[k].op == HP_OP_MM || g->nodes[k].op == HP_OP_BMM) {
                ahead++;
                break;
            }
    }
    cr_expect_gt(ahead, 0, "no dp gather is prefetched");
    /* overlap alone changes no collective, bucketing alone merges */
    hp_compiled *ov = fsdp_x_tp_compile(0, true);
    cr_expect_eq(on_group(ov->graph, "dp").n, dp0.n);
    cr_expect_eq(report(ov, "overlap")->collectives, report(ov, "spmd")->collectives);
    hp_compiled_free(ov);
    hp_compiled_free(plain);
    hp_compiled_free(both);
}

/* hp/pass_names.def (what hp_job_validate lets a switch name) lists the pipeline's passes, in
 * order: a pass added to one and not the other fails here. */
Test(pipeline, pass_names_def_matches_the_pipeline) {
    static const char *const names[] = {
#define X(name) #name,
#include "hp/pass_names.def"
#undef X
    };
    int n = 0;
    const hp__pass_entry *e = hp__passes(&n);
    cr_assert_eq(n, (int)HP_ARRAY_LEN(names), "pipeline %d passes, pass_names.def %zu", n,
                 HP_ARRAY_LEN(names));
    for (int i = 0; i < n; i++) cr_expect_str_eq(e[i].name, names[i], "pass %d", i);
}

/* ---- mixed precision (plan.param_dtype bf16, reduce_dtype f32) --------------------------------
 */

/* Bytes of every collective of kind op in g, and whether each one's input had dtype dt. */
static int64_t kind_bytes(const hp_graph *g, hp_op op, hp_dtype dt, bool *all_dt) {
    int64_t b = 0;
    *all_dt = true;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != op) continue;
        b += hp_collective_bytes(g, i);
        *all_dt &= hp_graph_type(g, g->nodes[i].in[0])->dtype == dt;
    }
    return b;
}

/* FSDP at world 2: the all-gathers read the cast bf16 shard (half the f32 plan's bytes), the
 * reduce-scatters and all-reduces read f32; every matmul computes in bf16; the graph outputs
 * (loss, gradients) and parameter placeholders stay what the f32 plan has. */
Test(pipeline, mixed_precision_bf16_gathers_f32_reductions) {
    hp_job *f32 = make_job(&TINY, 2, true), *bf = make_job(&TINY, 2, true);
    f32->passes.bucket_bytes = bf->passes.bucket_bytes = 0;
    bf->plan.param_dtype = HP_BF16;
    hp_compiled *a = compile_ok(f32, 2), *b = compile_ok(bf, 2);
    check_reports(b, bf, 2);
    cr_expect(!report(a, "mixed_precision")->ran && report(b, "mixed_precision")->ran);
    bool all;
    int64_t ga = kind_bytes(a->graph, HP_OP_ALL_GATHER, HP_F32, &all);
    cr_expect(all);
    int64_t gb = kind_bytes(b->graph, HP_OP_ALL_GATHER, HP_BF16, &all);
    cr_expect(all, "every all-gather moves bf16");
    cr_expect(ga > 0 && gb * 2 == ga, "all-gather bytes %lld (bf16) vs %lld (f32)", (long long)gb,
              (long long)ga);
    int64_t ra = kind_bytes(a->graph, HP_OP_REDUCE_SCATTER, HP_F32, &all);
    int64_t rb = kind_bytes(b->graph, HP_OP_REDUCE_SCATTER, HP_F32, &all);
    cr_expect(all && ra == rb && rb > 0, "reduce-scatters stay f32");
    kind_bytes(b->graph, HP_OP_ALL_REDUCE, HP_F32, &all);
    cr_expect(all, "all-reduces stay f32");
    /* every product multiplies bf16; a weight gradient's (read only by its reduce-scatter)
     * stores its f32 accumulators, mm{dtype=f32}, instead of a bf16 product and a cast */
    int mm_bf16 = 0, mm_wide = 0;
    for (int i = 0; i < b->graph->n_nodes; i++) {
        const hp_node *n = &b->graph->nodes[i];
        if (n->op != HP_OP_MM && n->op != HP_OP_BMM) continue;
        cr_expect_eq(hp_graph_type(b->graph, n->in[0])->dtype, HP_BF16, "node %d (%s) reads %s", i,
                     hp_op_get(n->op)->name,
                     hp_dtype_name(hp_graph_type(b->graph, n->in[0])->dtype));
        bool wide = n->out[0].dtype == HP_F32;
        cr_expect(!wide || hp_node_attr(n, HP_ATTR_DTYPE), "node %d: f32 without dtype=f32", i);
        mm_bf16 += !wide;
        mm_wide += wide;
    }
    cr_expect_gt(mm_bf16, 0);
    cr_expect_gt(mm_wide, 0);
    for (int i = 0; i < b->graph->n_nodes; i++) {
        const hp_node *n = &b->graph->nodes[i];
        const hp_node *src = n->n_in ? &b->graph->nodes[n->in[0].node] : NULL;
        cr_expect(!(n->op == HP_OP_TO_COPY && n->out[0].dtype == HP_F32 && src &&
                    (src->op == HP_OP_MM || src->op == HP_OP_EMBEDDING_DENSE_BACKWARD) &&
                    src->out[0].dtype == HP_BF16),
                  "node %d casts %s %d to f32", i, src ? hp_op_get(src->op)->name : "?",
                  n->in[0].node);
    }
    cr_assert_eq(a->graph->n_outputs, b->graph->n_outputs);
    for (int k = 0; k < a->graph->n_outputs; k++)
        cr_expect(hp_type_eq(hp_graph_type(a->graph, a->graph->outputs[k]),
                             hp_graph_type(b->graph, b->graph->outputs[k])),
                  "output %d", k);
    hp_graph_inputs in = hp_graph_count_inputs(b->graph);
    for (int i = 0; i < in.n_params; i++)
        cr_expect(hp_type_eq(&a->graph->nodes[i].out[0], &b->graph->nodes[i].out[0]),
                  "parameter %d keeps its f32 master shard", i);
    /* parameters, gradients and AdamW state are f32 bytes; activations shrink (2-byte bf16) */
    cr_expect_eq(b->memory.params, a->memory.params);
    cr_expect_eq(b->memory.grads, a->memory.grads);
    cr_expect_eq(b->memory.optimizer, a->memory.optimizer);
    cr_expect_lt(b->memory.activations, a->memory.activations);
    hp_compiled_free(a);
    hp_compiled_free(b);
    hp_job_free(f32);
    hp_job_free(bf);
}

/* Graphs a and b (TINY's) give the same outputs on the evaluator, in f64. */
static void expect_same_outputs(const hp_graph *a, const hp_graph *b) {
    cr_assert_eq(a->n_outputs, b->n_outputs);
    int n_out = a->n_outputs;
    hp_tensor *ra = calloc((size_t)n_out, sizeof *ra), *rb = calloc((size_t)n_out, sizeof *rb);
    eval_graph(a, TINY.vocab, ra);
    eval_graph(b, TINY.vocab, rb);
    for (int k = 0; k < n_out; k++) {
        char what[32];
        snprintf(what, sizeof what, "output %d", k);
        hp_th_expect_close(ra[k].data, rb[k].data, hp_type_numel(&rb[k].type), 1e-12, what);
        hp_tensor_free(&ra[k]);
        hp_tensor_free(&rb[k]);
    }
    free(ra);
    free(rb);
}

/* Switches pass `name` off in job. */
static void switch_off(hp_job *job, const char *name) {
    int k = job->passes.n_switches++;
    snprintf(job->passes.switches[k].name, HP_PASS_NAME_MAX, "%s", name);
    job->passes.switches[k].enabled = false;
}

/* No matrix transpose costs a copy: autodiff's weight gradients t(mm(t(x), g)) become
 * mm(t(g), x) (canonicalize), the cast of a transposed f32 operand under the bf16 policy is the
 * transpose of the shared cast (the output layer's logits gradient: the fused cross entropy's
 * bf16 output, or the cast of the log-softmax gradient when fuse_cross_entropy is off), and
 * lowering folds every rank-2 transpose into the product that reads it. */
Test(pipeline, matrix_transposes_are_folded_into_products) {
    for (int bf = 0; bf < 2; bf++)
        for (int fuse = 0; fuse < 2; fuse++) {
            hp_job *job = make_job(&TINY, 1, false);
            if (bf) job->plan.param_dtype = HP_BF16;
            if (!fuse) switch_off(job, "fuse_cross_entropy");
            hp_compiled *c = compile_ok(job, 1);
            const hp_program *p = c->program;
            int casts_of_logits_grad = 0, fused = 0;
            for (int32_t i = 0; i < p->n_instrs; i++) {
                const hp_node *n = &p->graph->nodes[p->instrs[i].node];
                cr_expect(n->op != HP_OP_T, "%s: instruction %d copies a transpose (node %d)",
                          bf ? "bf16" : "f32", i, p->instrs[i].node);
                const hp_node *src = n->n_in ? &p->graph->nodes[n->in[0].node] : NULL;
                if (n->op == HP_OP_TO_COPY && src && src->op == HP_OP_LOG_SOFTMAX_BACKWARD)
                    casts_of_logits_grad++;
                if (n->op == HP_OP_FUSED_CROSS_ENTROPY_BACKWARD) {
                    cr_expect_eq(n->out[0].dtype, bf ? HP_BF16 : HP_F32);
                    fused++;
                }
            }
            cr_expect_eq(casts_of_logits_grad, bf && !fuse ? 1 : 0);
            cr_expect_eq(fused, fuse);
            cr_expect_gt(p->stats.n_folded_transposes, 0);
            hp_compiled_free(c);
            hp_job_free(job);
        }
}

/* fuse_cross_entropy: the loss's _log_softmax and nll_loss and their backwards become the
 * fused ops, at world 1 and under FSDP, f32 and bf16 (whose f32 casts of the logits and bf16
 * cast of their gradient go too); the graph computes what it did (the reference evaluator, at
 * world 1); a placed graph (tp) keeps its loss unfused. */
Test(pipeline, the_loss_is_fused_into_cross_entropy) {
    for (int world = 1; world <= 2; world++)
        for (int bf = 0; bf < 2; bf++) {
            hp_job *job = make_job(&TINY, world, true);
            if (bf) job->plan.param_dtype = HP_BF16;
            hp_compiled *c = compile_ok(job, world);
            cr_expect_eq(report(c, "fuse_cross_entropy")->fused_cross_entropy, 1);
            int fwd = 0, bwd = 0;
            for (int i = 0; i < c->graph->n_nodes; i++) {
                hp_op op = c->graph->nodes[i].op;
                cr_expect(op != HP_OP_LOG_SOFTMAX && op != HP_OP_NLL_LOSS_FORWARD &&
                              op != HP_OP_NLL_LOSS_BACKWARD && op != HP_OP_LOG_SOFTMAX_BACKWARD,
                          "world %d %s: node %d is still %s", world, bf ? "bf16" : "f32", i,
                          hp_op_get(op)->name);
                fwd += op == HP_OP_FUSED_CROSS_ENTROPY;
                bwd += op == HP_OP_FUSED_CROSS_ENTROPY_BACKWARD;
                if (op == HP_OP_FUSED_CROSS_ENTROPY)
                    cr_expect_eq(hp_graph_type(c->graph, c->graph->nodes[i].in[0])->dtype,
                                 bf ? HP_BF16 : HP_F32, "the logits are read as they are");
            }
            cr_expect(fwd == 1 && bwd == 1);
            hp_compiled_free(c);
            hp_job_free(job);
        }
    /* the same values: the unfused and the fused graph on the evaluator */
    hp_job *job = make_job(&TINY, 1, false), *off = make_job(&TINY, 1, false);
    switch_off(off, "fuse_cross_entropy");
    hp_compiled *a = compile_ok(job, 1), *b = compile_ok(off, 1);
    cr_expect_eq(report(b, "fuse_cross_entropy")->fused_cross_entropy, 0);
    expect_same_outputs(a->graph, b->graph);
    hp_compiled_free(a);
    hp_compiled_free(b);
    hp_job_free(job);
    hp_job_free(off);
}

/* fuse_swiglu: each layer's gate, mul(silu(A), B), and its backward (two muls and
 * silu_backward) become swiglu and swiglu_backward, at world 1 and under FSDP, f32 and bf16;
 * the graph computes what it did (the evaluator, f64, with the pass switched off for the
 * reference). */
Test(pipeline, the_mlp_gate_is_fused_into_swiglu) {
    for (int world = 1; world <= 2; world++)
        for (int bf = 0; bf < 2; bf++) {
            hp_job *job = make_job(&TINY, world, true);
            if (bf) job->plan.param_dtype = HP_BF16;
            hp_compiled *c = compile_ok(job, world);
            cr_expect_eq(report(c, "fuse_swiglu")->fused_swiglu, (int)TINY.layers);
            int fwd = 0, bwd = 0;
            for (int i = 0; i < c->graph->n_nodes; i++) {
                hp_op op = c->graph->nodes[i].op;
                cr_expect(op != HP_OP_SILU && op != HP_OP_SILU_BACKWARD, "node %d is still %s", i,
                          hp_op_get(op)->name);
                fwd += op == HP_OP_SWIGLU;
                bwd += op == HP_OP_SWIGLU_BACKWARD;
            }
            cr_expect(fwd == TINY.layers && bwd == TINY.layers, "%d / %d", fwd, bwd);
            hp_compiled_free(c);
            hp_job_free(job);
        }
    hp_job *job = make_job(&TINY, 1, false), *off = make_job(&TINY, 1, false);
    switch_off(off, "fuse_swiglu");
    hp_compiled *a = compile_ok(job, 1), *b = compile_ok(off, 1);
    cr_expect_eq(report(b, "fuse_swiglu")->fused_swiglu, 0);
    cr_expect_lt(a->memory.activations, b->memory.activations, "silu(A) is no longer kept");
    expect_same_outputs(a->graph, b->graph);
    hp_compiled_free(a);
    hp_compiled_free(b);
    hp_job_free(job);
    hp_job_free(off);
}

/* World 1 and DDP compile with the policy too; the f32 policy is no pass at all (switched on,
 * it is the identity); switching the pass off under a bf16 policy is refused, never ignored. */
Test(pipeline, mixed_precision_world_1_ddp_and_switches) {
    hp_job *one = make_job(&TINY, 1, false), *ddp = make_job(&TINY, 2, false);
    one->plan.param_dtype = ddp->plan.param_dtype = HP_BF16;
    hp_compiled *c1 = compile_ok(one, 1), *c2 = compile_ok(ddp, 2);
    cr_expect(report(c1, "mixed_precision")->ran && report(c2, "mixed_precision")->ran);
    bool all;
    cr_expect_gt(kind_bytes(c2->graph, HP_OP_ALL_REDUCE, HP_F32, &all), 0);
    cr_expect(all, "DDP's gradient all-reduces run in f32");
    hp_compiled_free(c1);
    hp_compiled_free(c2);

    hp_job *f = make_job(&TINY, 1, false);
    snprintf(f->passes.switches[0].name, HP_PASS_NAME_MAX, "mixed_precision");
    f->passes.switches[0].enabled = true;
    f->passes.n_switches = 1;
    hp_compiled *c = compile_ok(f, 1);
    const hp_pass_report *r = report(c, "mixed_precision");
    cr_expect(r->ran && r->nodes_in == r->nodes_out, "f32 policy: the identity");
    hp_compiled_free(c);

    one->passes.n_switches = 1;
    snprintf(one->passes.switches[0].name, HP_PASS_NAME_MAX, "mixed_precision");
    one->passes.switches[0].enabled = false;
    hp_err err = {0};
    c = NULL;
    cr_expect_neq(hp_compile(one, 1, &c, &err), HP_OK);
    cr_expect(strstr(err.msg, "mixed_precision is switched off but the plan sets param_dtype bf16"),
              "%s", err.msg);
    hp_compiled_free(c);
    hp_job_free(one);
    hp_job_free(ddp);
    hp_job_free(f);
}
