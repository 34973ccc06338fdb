/* The pass manager (passes/pipeline.c) and what it reports (passes/cost.c): the verifier
 * passes after every pass on every model builder, at world 1 and with FSDP; DCE and
 * canonicalize keep the graph's values (reference evaluator, f64) and are idempotent; the
 * memory report shrinks to 1/N (+ padding) with FSDP on everything; the cost model counts the
 * model's FLOPs; world/mesh/batch errors name the values; switches, dumps and a fault
 * injection loop. Mixed precision and the fusion passes: test_pipeline_precision.c.
 */
#include "hp/autoshard.h"
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "passes/passes_internal.h"
#include "tests/passes/pipeline_fixtures.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(pipeline, .init = force_verify, .timeout = 300);

static const model_case DEBUGMODEL = {"llama3:debugmodel", .batch = 4, .seq = 64};
static const model_case TINY_ODD = {"llama3:debugmodel", 48, 1, 2, 1, 40, 50, 3, 8}; /* pads */
static const model_case MLP = {"mlp", .batch = 8};
static const model_case LLAMA_8B = {"llama3:8B", .batch = 8, .seq = 2048};

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
    /* what runs is priced: the program's materialized views (transposes folded neither into a
     * GEMM nor into an attention) are copies, so the estimate from the program exceeds the
     * graph-only one by them; the debugmodel has none left (its q/k/v/out and gradient head
     * transposes fold into the attention's calls, HP_INSTR_BTHD_*) */
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
    cr_expect_eq(views, 0, "the debugmodel lowers %d views to copies", views);
    cr_expect_geq(c->program->stats.n_folded_transposes, 8 * job->model.n_layers,
                  "each layer's eight head transposes fold into its attention");
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

/* The joint graph of loss(x·w), x the data [4, 3], w the parameter [3, 2], as a job. */
static hp_job *graph_job(hp_value (*loss)(hp_graph *, hp_value), int world) {
    hp_job *job = make_job(&MLP, world, false);
    hp_graph_free(job->graph);
    hp_graph *g = job->graph = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", TY(HP_F32, 3, 2), &init);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, 4, 3), NULL);
    hp_err err = {0};
    cr_assert_eq(hp_autodiff(g, loss(g, hp_mm(g, x, w)), &err), HP_OK, "%s", err.msg);
    return job;
}
static hp_value sum_all(hp_graph *g, hp_value v) {
    return hp_sum(g, v, 0, NULL, false);
}

/* A 1-D data-parallel plan whose graph the FSDP rewrite refuses (a sum over the batch, which
 * each rank would sum over its slice alone) is placed by spmd, the report saying why. */
Test(pipeline, fsdp_refusals_are_placed_by_spmd) {
    hp_job *job = graph_job(sum_all, 2);
    hp_compiled *c = compile_ok(job, 2);
    check_reports(c, job, 2);
    const hp_pass_report *r = report(c, "fsdp");
    cr_expect(r->ran && strstr(r->placed_by_spmd, "(sum): reduces over the batch dim"), "%s",
              r->placed_by_spmd);
    cr_expect_eq(c->graph->mesh.ndim, 1);
    cr_expect_str_eq(c->graph->mesh.name[0], "dp");
    cr_expect_eq(c->graph->mesh.size[0], 2);
    cr_expect(!report(c, "fuse_cross_entropy")->ran, "a placed graph keeps its unfused loss");
    hp_compiled_free(c);
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
                                       "13-lower.txt"};
    char path[256];
    for (size_t i = 0; i < HP_ARRAY_LEN(want); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, want[i]);
        struct stat st;
        cr_expect(stat(path, &st) == 0 && st.st_size > 0, "%s missing", path);
    }
    snprintf(path, sizeof path, "%s/07-fsdp.hpir", dir);
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

/* The overlap pass keeps communication behind compute without holding memory in proportion
 * to the model's depth: a reduce-scatter's wait comes no later than the issue of the reductions
 * two positions and two buckets' bytes after it, so what it holds beyond the unreordered graph
 * (one prefetched layer's gathered parameters, a few buckets of unsharded gradients) is the
 * same at 8 and 16 layers. (Waits sunk to the gradients' use at the end of the step kept every
 * layer's alive: 9.9 layers more at 8.) */
Test(pipeline, overlap_holds_memory_independent_of_depth) {
    int64_t excess[2], layer = (4 * 512 * 512 + 3 * 512 * 2048) * 4; /* a layer's f32 weights */
    for (int d = 0; d < 2; d++) {
        const model_case wide = {"llama3:debugmodel", 512, 8 << d, 8, 8, 2048, 128, 2, 16};
        hp_job *job = make_job(&wide, 2, true);
        int64_t arena[2];
        for (int on = 0; on < 2; on++) {
            job->passes.enable_overlap = on;
            hp_compiled *c = compile_ok(job, 2);
            arena[on] = c->memory.activations;
            hp_compiled_free(c);
        }
        excess[d] = arena[1] - arena[0];
        hp_job_free(job);
    }
    cr_expect_lt(excess[1] - excess[0], layer / 2,
                 "overlap holds %.1f layers more at 8 layers, %.1f at 16",
                 (double)excess[0] / (double)layer, (double)excess[1] / (double)layer);
    cr_expect_lt(excess[0], layer + 4 * (int64_t)(25 << 20), "%.1f layers more at 8",
                 (double)excess[0] / (double)layer);
}
