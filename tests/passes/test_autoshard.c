/* Auto-sharding (passes/autoshard*.c, docs/autoshard.md): on 1-D dp the solver replicates
 * every parameter without a budget (DDP) and shards every one with high = 1/N (FSDP); on a
 * 2-D (dp, tp) Llama with a budget it finds a plan no dearer than the hand-written FSDP x TP
 * one; its objective equals the exact minimum (dynamic programming over the same cost tables,
 * no GLPK) on the MLP (1-D and 2-D, with and without a budget), on 1-layer Llamas of odd sizes
 * and on a 1-layer Llama of the debugmodel's shape scaled down, on dp=2 and dp=4 with and
 * without a budget, and on (dp=2, tp=2) without a budget (with one, not yet: docs); past its
 * limit the exhaustive search refuses with an error; the same job gives
 * the same plan; classes do not grow with the layers; infeasible constraints name themselves;
 * explain says why; the pipeline compiles an auto plan. Priced on the h100 profile, whose
 * figures are fixed (the cpu profile is this machine's).
 */
#include "hp/autoshard.h"
#include "hp/models.h"
#include "hp/passes.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(autoshard, .timeout = 300);

typedef struct model_case {
    const char *spec;
    int64_t dim, layers, heads, kv_heads, ffn, vocab, batch, seq;
} model_case;

static const model_case MLP = {"mlp", .batch = 8};
static const model_case LLAMA1 = {"llama3:debugmodel", 64, 1, 4, 2, 96, 128, 4, 16};
static const model_case LLAMA2 = {"llama3:debugmodel", 64, 2, 4, 2, 96, 128, 4, 16};
static const model_case LLAMA8 = {"llama3:debugmodel", 64, 8, 4, 2, 96, 128, 4, 16};
/* 1-layer Llamas whose odd sizes leave few splits: small enough to search exhaustively */
static const model_case LLAMA1_ODD = {"llama3:debugmodel", 6, 1, 3, 3, 9, 15, 2, 3};
static const model_case LLAMA1_GQA = {"llama3:debugmodel", 8, 1, 2, 2, 12, 16, 2, 4};

/* A job of model m on mesh "dp=2,tp=2"-like dims (names[i], sizes[i]). */
static hp_job *make_job(const model_case *m, int nd, const char *const *names, const int *sizes) {
    hp_job *job = hp_job_new();
    cr_assert_not_null(job);
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse(m->spec, &job->model, &err), HP_OK, "%s", err.msg);
    hp_model_spec *s = &job->model;
    if (m->dim) {
        s->dim = m->dim, s->n_layers = m->layers, s->n_heads = m->heads;
        s->n_kv_heads = m->kv_heads, s->ffn_hidden = m->ffn, s->vocab = m->vocab;
    }
    s->batch = m->batch, s->seq = m->seq;
    cr_assert_eq(hp_model_build_joint(s, &job->graph, &err), HP_OK, "%s", err.msg);
    int world = 1;
    job->plan.n_mesh = nd;
    for (int i = 0; i < nd; i++) {
        snprintf(job->plan.mesh[i].name, sizeof job->plan.mesh[i].name, "%s", names[i]);
        job->plan.mesh[i].size = sizes[i];
        job->plan.mesh[i].link = HP_LINK_INTRA_NODE;
        world *= sizes[i];
    }
    job->resources.world_size = world;
    job->plan.mode = HP_PLAN_AUTO;
    snprintf(job->plan.device_profile, sizeof job->plan.device_profile, "h100");
    return job;
}

static const char *const DP[] = {"dp"}, *const DPTP[] = {"dp", "tp"};

static hp_autoshard *solve(const hp_job *job, double gap) {
    hp_device_profile prof;
    hp_err err = {0};
    cr_assert_eq(hp_device_profile_for_job(job, &prof, &err), HP_OK, "%s", err.msg);
    /* proving optimality may take a while on a loaded machine; a default plan must not */
    hp_autoshard_opts o = {.mip_gap = gap, .time_limit_s = gap == 0 ? 120 : 3};
    hp_autoshard *a = NULL;
    cr_assert_eq(hp_autoshard_solve(job->graph, job, &prof, &o, &a, &err), HP_OK, "%s", err.msg);
    return a;
}

static int n_params(const hp_job *job) {
    return hp_graph_count_inputs(job->graph).n_params;
}

static const char *fqn(const hp_job *job, int i) {
    return hp_node_attr(&job->graph->nodes[i], HP_ATTR_FQN)->s;
}

Test(autoshard, dp_without_budget_is_ddp_with_1_over_n_is_fsdp) {
    int four[] = {4};
    hp_job *job = make_job(&LLAMA2, 1, DP, four);
    hp_autoshard *a = solve(job, 0);
    hp_placement st[HP_MESH_MAX_DIMS], cp[HP_MESH_MAX_DIMS];
    for (int i = 0; i < n_params(job); i++) {
        cr_assert(hp_autoshard_placeholder(a, i, st, cp));
        cr_expect(st[0].kind == HP_PLACE_REPLICATE, "no budget: %s replicated (DDP)", fqn(job, i));
    }
    cr_expect(hp_autoshard_get_stats(a)->optimal);
    hp_autoshard_free(a);
    job->plan.mem_high = 0.25;
    a = solve(job, 0);
    for (int i = 0; i < n_params(job); i++) {
        cr_assert(hp_autoshard_placeholder(a, i, st, cp));
        cr_expect(st[0].kind == HP_PLACE_SHARD, "high = 1/4: %s stored sharded (FSDP)",
                  fqn(job, i));
    }
    hp_autoshard_free(a);
    hp_job_free(job);
}

/* The plan's modelled step with every parameter's storage fixed as `plan` says (the
 * hand-written plan priced by the same cost model). */
static double priced(hp_job *job, const char *const *plan, int n) {
    hp_err err = {0};
    for (int k = 0; k < n; k++) {
        char pat[128];
        const char *eq = strchr(plan[k], '=');
        snprintf(pat, sizeof pat, "%.*s", (int)(eq - plan[k]), plan[k]);
        hp_placement pl[2] = {HP_REPLICATE, HP_REPLICATE};
        char spec[64];
        snprintf(spec, sizeof spec, "%s", eq + 1);
        char *comma = strchr(spec, ',');
        *comma = 0;
        cr_assert_eq(hp_placement_parse(spec, &pl[0], &err), HP_OK, "%s", err.msg);
        cr_assert_eq(hp_placement_parse(comma + 1, &pl[1], &err), HP_OK, "%s", err.msg);
        cr_assert_eq(hp_job_add_place_pattern(job, pat, pl, 2, &err), HP_OK, "%s", err.msg);
    }
    hp_autoshard *a = solve(job, 0);
    double s = hp_autoshard_get_stats(a)->objective_s;
    hp_autoshard_free(a);
    return s;
}

Test(autoshard, llama_dp_tp_with_a_budget_is_no_dearer_than_fsdp_x_tp) {
    int sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA2, 2, DPTP, sizes);
    job->plan.mem_high = 0.26; /* a quarter, and the norms' halves */
    hp_autoshard *a = solve(job, 0);
    double mine = hp_autoshard_get_stats(a)->objective_s;
    printf("auto plan of a 2-layer Llama on (dp=2, tp=2), budget (0, 0.26), h100 profile:\n");
    for (int i = 0; i < n_params(job); i++) {
        hp_placement st[2], cp[2];
        hp_autoshard_placeholder(a, i, st, cp);
        char w[4][24];
        printf("  %-36s stored (dp:%s, tp:%s) computed (dp:%s, tp:%s)\n", fqn(job, i),
               hp_placement_short(&st[0], w[0], 24), hp_placement_short(&st[1], w[1], 24),
               hp_placement_short(&cp[0], w[2], 24), hp_placement_short(&cp[1], w[3], 24));
        /* every parameter holds a quarter (the budget) */
        cr_expect((st[0].kind == HP_PLACE_SHARD) + (st[1].kind == HP_PLACE_SHARD) == 2 ||
                      job->graph->nodes[i].out[0].rank < 2,
                  "%s split twice", fqn(job, i));
    }
    hp_autoshard_free(a);
    /* torchtitan's TP plan with FSDP over dp, priced by the same model */
    static const char *const tp[] = {
        "layers.*.attention.wq.weight=S(1),S(0)",
        "layers.*.attention.wk.weight=S(1),S(0)",
        "layers.*.attention.wv.weight=S(1),S(0)",
        "layers.*.attention.wo.weight=S(0),S(1)",
        "layers.*.feed_forward.w1.weight=S(1),S(0)",
        "layers.*.feed_forward.w3.weight=S(1),S(0)",
        "layers.*.feed_forward.w2.weight=S(0),S(1)",
        "tok_embeddings.weight=S(1),S(0)",
        "output.weight=S(1),S(0)",
        "*norm.weight=S(0),R",
    };
    hp_job *hand = make_job(&LLAMA2, 2, DPTP, sizes);
    hand->plan.mem_high = 0.26;
    double fsdp_tp = priced(hand, tp, (int)HP_ARRAY_LEN(tp));
    printf("modelled step: auto %.6g s, FSDP x TP %.6g s\n", mine, fsdp_tp);
    cr_expect_leq(mine, fsdp_tp * (1 + 1e-9), "auto %.9g vs FSDP x TP %.9g", mine, fsdp_tp);
    hp_job_free(hand);
    hp_job_free(job);
}

static void expect_exhaustive(const model_case *m, int nd, const char *const *names,
                              const int *sizes, double high) {
    hp_job *job = make_job(m, nd, names, sizes);
    job->plan.mem_high = high;
    hp_autoshard *a = solve(job, 0);
    cr_expect(hp_autoshard_get_stats(a)->optimal, "%s on %d dims, high %g: the ILP proved optimal",
              m->spec, nd, high);
    double best = 0;
    hp_err err = {0};
    cr_assert_eq(hp_autoshard_exhaustive(a, (int64_t)4e9, &best, &err), HP_OK, "%s: %s", m->spec,
                 err.msg);
    double ilp = hp_autoshard_get_stats(a)->objective_s;
    cr_expect(fabs(ilp - best) <= 1e-9 * best + 1e-12,
              "%s on %d dims, high %g: ILP %.12g, "
              "exhaustive %.12g",
              m->spec, nd, high, ilp, best);
    hp_autoshard_free(a);
    hp_job_free(job);
}

Test(autoshard, ilp_objective_equals_exhaustive_search) {
    int two[] = {2}, four[] = {4}, twotwo[] = {2, 2};
    expect_exhaustive(&MLP, 1, DP, two, 1);
    expect_exhaustive(&MLP, 1, DP, four, 0.25);
    expect_exhaustive(&MLP, 2, DPTP, twotwo, 1);
    expect_exhaustive(&MLP, 2, DPTP, twotwo, 0.3);
    expect_exhaustive(&LLAMA1_ODD, 1, DP, two, 1);
    expect_exhaustive(&LLAMA1_GQA, 1, DP, two, 1);
}

/* The debugmodel's shape scaled down (dim 64, 4 heads, 2 kv heads), one layer: every dim
 * splits, so every strategy of the mesh is in play; with budgets that bind (a knapsack over
 * the parameters' bytes). The exhaustive minimum is exact dynamic programming over the same
 * cost tables, without GLPK (passes/autoshard_exhaust.c). */
Test(autoshard, ilp_objective_equals_exhaustive_search_on_a_1_layer_llama) {
    int two[] = {2}, four[] = {4};
    expect_exhaustive(&LLAMA1, 1, DP, two, 1);
    expect_exhaustive(&LLAMA1, 1, DP, two, 0.75);
    expect_exhaustive(&LLAMA1, 1, DP, four, 1);
    expect_exhaustive(&LLAMA1, 1, DP, four, 0.5);
}

/* The same Llama on (dp=2, tp=2), without a budget: 25-64 strategies per class, 2365 after
 * dominance, 1188 after bound pruning (mini-bucket lower bounds against an upper bound of its
 * own); the tables key on the placement groups an edge prices (docs/autoshard.md). */
Test(autoshard, ilp_objective_equals_exhaustive_search_on_a_2d_1_layer_llama) {
    int twotwo[] = {2, 2};
    expect_exhaustive(&LLAMA1, 2, DPTP, twotwo, 1);
}

/* And with a budget that binds (half the parameters' bytes): the Pareto search, pruned against
 * the ILP's own assignment as the upper bound (priced by the search's sums), ~12 s. */
Test(autoshard, ilp_objective_equals_exhaustive_search_on_a_2d_1_layer_llama_with_a_budget) {
    int twotwo[] = {2, 2};
    expect_exhaustive(&LLAMA1, 2, DPTP, twotwo, 0.5);
}

/* Past its limit the search stops with an error saying so, at once. */
Test(autoshard, exhaustive_search_refuses_past_its_limit) {
    int twotwo[] = {2, 2};
    hp_job *job = make_job(&LLAMA1, 2, DPTP, twotwo);
    hp_autoshard *a = solve(job, -1);
    double best = -1;
    hp_err err = {0};
    cr_expect_eq(hp_autoshard_exhaustive(a, 1000, &best, &err), HP_UNSUPPORTED);
    cr_expect(strstr(err.msg, "exhaustive search: ") && strstr(err.msg, "(the limit)"), "%s",
              err.msg);
    cr_expect_eq(best, -1, "no answer on refusal");
    hp_autoshard_free(a);
    hp_job_free(job);
}

Test(autoshard, same_job_same_plan_and_classes_do_not_grow_with_layers) {
    int sizes[] = {2, 2};
    hp_job *j2 = make_job(&LLAMA2, 2, DPTP, sizes), *j8 = make_job(&LLAMA8, 2, DPTP, sizes);
    hp_autoshard *a = solve(j2, -1), *b = solve(j2, -1), *c = solve(j8, -1);
    cr_expect_eq(hp_autoshard_get_stats(a)->objective_s, hp_autoshard_get_stats(b)->objective_s);
    for (int i = 0; i < n_params(j2); i++) {
        hp_placement s1[2], c1[2], s2[2], c2[2];
        hp_autoshard_placeholder(a, i, s1, c1);
        hp_autoshard_placeholder(b, i, s2, c2);
        for (int d = 0; d < 2; d++)
            cr_expect(hp_placement_eq(s1[d], s2[d]) && hp_placement_eq(c1[d], c2[d]),
                      "%s differs between two solves", fqn(j2, i));
    }
    cr_expect_eq(hp_autoshard_get_stats(a)->classes, hp_autoshard_get_stats(c)->classes,
                 "2 layers: %d classes, 8 layers: %d", hp_autoshard_get_stats(a)->classes,
                 hp_autoshard_get_stats(c)->classes);
    cr_expect_gt(hp_autoshard_get_stats(c)->nodes, 3 * hp_autoshard_get_stats(a)->nodes);
    hp_autoshard_free(a);
    hp_autoshard_free(b);
    hp_autoshard_free(c);
    hp_job_free(j2);
    hp_job_free(j8);
}

static void expect_solve_error(const hp_job *job, const char *want1, const char *want2) {
    hp_device_profile prof;
    hp_err err = {0};
    cr_assert_eq(hp_device_profile_for_job(job, &prof, &err), HP_OK, "%s", err.msg);
    hp_autoshard *a = NULL;
    hp_status st = hp_autoshard_solve(job->graph, job, &prof, NULL, &a, &err);
    cr_expect_neq(st, HP_OK);
    cr_expect_null(a);
    cr_expect(strstr(err.msg, want1) && strstr(err.msg, want2), "got: %s", err.msg);
    hp_autoshard_free(a);
}

/* An LP relaxation past its limit (GLPK's simplex slows sharply at ~10^5 columns) is refused
 * naming the problem's size and the way around it, not solved for hours, nor refolded. */
Test(autoshard, an_lp_past_its_limit_is_refused) {
    int sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA2, 2, DPTP, sizes);
    hp_device_profile prof;
    hp_err err = {0};
    cr_assert_eq(hp_device_profile_for_job(job, &prof, &err), HP_OK, "%s", err.msg);
    hp_autoshard_opts o = {.mip_gap = -1, .lp_time_limit_s = 1e-4};
    hp_autoshard *a = NULL;
    cr_expect_eq(hp_autoshard_solve(job->graph, job, &prof, &o, &a, &err), HP_LIMIT);
    cr_expect_null(a);
    cr_expect(strstr(err.msg, "the LP relaxation (") && strstr(err.msg, "was not solved within") &&
                  strstr(err.msg, "a plan written by hand (--tp-plan, --place, --fsdp)"),
              "%s", err.msg);
    hp_autoshard_free(a);
    hp_job_free(job);
}

Test(autoshard, infeasible_constraints_name_themselves) {
    int two[] = {2}, sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA1, 1, DP, two);
    job->plan.mem_high = 0.2; /* below the half every split leaves */
    expect_solve_error(job, "plan.param_memory_budget (0, 0.2) cannot be met", "between 0.5 and 1");
    job->plan.mem_high = 1;
    job->plan.mem_low = 0.6; /* and a glob forcing them all split */
    hp_err err = {0};
    hp_placement s0 = HP_SHARD(0);
    cr_assert_eq(hp_job_add_place_pattern(job, "*", &s0, 1, &err), HP_OK, "%s", err.msg);
    expect_solve_error(job, "plan.param_memory_budget (0.6, 1)", "cannot be met");
    hp_job_free(job);
    job = make_job(&LLAMA1, 2, DPTP, sizes);
    hp_placement bad[2] = {HP_REPLICATE, HP_SHARD(5)}; /* a dim the weight does not have */
    cr_assert_eq(hp_job_add_place_pattern(job, "output.weight", bad, 2, &err), HP_OK, "%s",
                 err.msg);
    expect_solve_error(job, "plan.constraints[0] (output.weight=R,S(5)) cannot be met",
                       "'output.weight'");
    hp_job_free(job);
}

Test(autoshard, constraints_hold_and_explain_says_why) {
    int sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA2, 2, DPTP, sizes);
    hp_err err = {0};
    hp_placement row[2] = {HP_REPLICATE, HP_SHARD(1)};
    cr_assert_eq(hp_job_add_place_pattern(job, "layers.*.attention.wq.weight", row, 2, &err), HP_OK,
                 "%s", err.msg);
    cr_assert_eq(hp_job_add_fsdp_pattern(job, "output.weight", &err), HP_OK, "%s", err.msg);
    hp_autoshard *a = solve(job, -1);
    for (int i = 0; i < n_params(job); i++) {
        hp_placement st[2], cp[2];
        hp_autoshard_placeholder(a, i, st, cp);
        if (strstr(fqn(job, i), "attention.wq"))
            cr_expect(hp_placement_eq(st[0], row[0]) && hp_placement_eq(st[1], row[1]),
                      "%s constrained", fqn(job, i));
        if (!strcmp(fqn(job, i), "output.weight"))
            cr_expect(st[0].kind == HP_PLACE_SHARD && cp[0].kind == HP_PLACE_REPLICATE,
                      "FSDP mark: stored split on dp, gathered");
    }
    char *text = NULL;
    cr_assert_eq(hp_autoshard_explain(a, "layers.1.attention.wq.weight", &text, &err), HP_OK, "%s",
                 err.msg);
    cr_expect(strstr(text, "chosen: stored (dp:R, tp:S(1))") && strstr(text, "alternative 1") &&
                  strstr(text, "bound by: plan.constraints[0]"),
              "%s", text);
    hp_free(text);
    cr_assert_eq(hp_autoshard_explain(a, "output.weight", &text, &err), HP_OK, "%s", err.msg);
    cr_expect(strstr(text, "bound by: an FSDP mark"), "%s", text);
    hp_free(text);
    cr_assert_eq(hp_autoshard_explain(a, "7", &text, &err), HP_OK, "%s", err.msg);
    cr_expect(strstr(text, "(node 7, ") && strstr(text, "cost "), "%s", text);
    hp_free(text);
    cr_expect_eq(hp_autoshard_explain(a, "no.such.weight", &text, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "'no.such.weight' is neither"), "%s", err.msg);
    /* the chosen plan applies: a verified per-rank graph */
    hp_graph *g = NULL;
    cr_assert_eq(hp_autoshard_apply(a, &g, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(g->mesh.ndim, 2);
    hp_graph_free(g);
    hp_autoshard_free(a);
    hp_job_free(job);
}

/* A constraint that leaves dp Replicate on a parameter FSDP marks (--tp-plan with --fsdp) keeps
 * its tp placement and is stored split over dp, as the hand-written plan does: not refused as
 * a contradiction. */
Test(autoshard, an_fsdp_mark_splits_over_dp_what_a_constraint_leaves_replicate) {
    int sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA2, 2, DPTP, sizes);
    hp_err err = {0};
    hp_placement col[2] = {HP_REPLICATE, HP_SHARD(0)};
    cr_assert_eq(hp_job_add_place_pattern(job, "layers.*.attention.wq.weight", col, 2, &err), HP_OK,
                 "%s", err.msg);
    cr_assert_eq(hp_job_add_fsdp_pattern(job, "layers.*", &err), HP_OK, "%s", err.msg);
    hp_autoshard *a = solve(job, -1);
    int seen = 0;
    for (int i = 0; i < n_params(job); i++) {
        hp_placement st[2], cp[2];
        hp_autoshard_placeholder(a, i, st, cp);
        if (strncmp(fqn(job, i), "layers.", 7)) continue;
        cr_expect(st[0].kind == HP_PLACE_SHARD && cp[0].kind == HP_PLACE_REPLICATE,
                  "%s: FSDP: stored split on dp, gathered", fqn(job, i));
        if (!strstr(fqn(job, i), "attention.wq")) continue;
        seen++;
        cr_expect(hp_placement_eq(st[1], col[1]), "%s: tp:S(0) as constrained", fqn(job, i));
        cr_expect(st[0].dim != 0, "%s: dp splits a dim tp does not", fqn(job, i));
    }
    cr_expect_eq(seen, 2);
    hp_autoshard_free(a);
    hp_job_free(job);
}

Test(autoshard, the_pipeline_compiles_an_auto_plan) {
    int sizes[] = {2, 2};
    hp_job *job = make_job(&LLAMA2, 2, DPTP, sizes);
    job->plan.mem_high = 0.5;
    hp_err err = {0};
    hp_compiled *c = NULL;
    cr_assert_eq(hp_compile(job, 4, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_not_null(c->autoshard);
    const hp_autoshard_stats *st = hp_autoshard_get_stats(c->autoshard);
    cr_expect(st->variables > 0 && st->constraints > 0 && st->objective_s > 0);
    cr_expect_eq(c->graph->mesh.ndim, 2);
    cr_expect_leq(c->memory.params, (int64_t)(0.5 * 4 * hp_graph_param_count(job->graph) * 1.01));
    hp_compiled_free(c);
    /* a budget without mode auto is refused */
    job->plan.mode = HP_PLAN_FSDP;
    cr_expect_neq(hp_compile(job, 4, &c, &err), HP_OK);
    cr_expect(strstr(err.msg, "only honoured by auto-sharding"), "%s", err.msg);
    hp_job_free(job);
}

/* A plan whose LP relaxation is fractional and whose branch and bound stops at the requested
 * MIP gap (GLPK's GLP_EMIPGAP, its "gap reached" return): the incumbent is the plan. It was
 * discarded as "cannot be met together", so `--mode auto` refused every (dp=8, tp=4) Llama on
 * a cpu job. Priced on the unprobed cpu profile's figures (fixed here, not this machine's),
 * each of 32 ranks on a share of one host. */
Test(autoshard, a_search_stopped_at_the_mip_gap_keeps_its_plan) {
    static const model_case m = {"llama3:debugmodel", 256, 1, 8, 8, 768, 4096, 64, 2048};
    int sizes[] = {8, 4};
    hp_job *job = make_job(&m, 2, DPTP, sizes);
    hp_device_profile cpu = {.name = "cpu",
                             .peak_flops = 1e11 / 32,
                             .efficiency = 0.8,
                             .mem_bw = 1e10 / 32,
                             .kernel_s = 5e-6,
                             .intra = {4e9, 30e-6},
                             .inter = {4e9, 30e-6}};
    hp_autoshard_opts o = {.mip_gap = 0.02, .time_limit_s = 60};
    hp_autoshard *a = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_autoshard_solve(job->graph, job, &cpu, &o, &a, &err), HP_OK, "%s", err.msg);
    const hp_autoshard_stats *st = hp_autoshard_get_stats(a);
    cr_expect(isfinite(st->objective_s) && st->objective_s > 0, "objective %g", st->objective_s);
    cr_expect(st->gap <= 0.02 + 1e-12, "gap %g", st->gap);
    hp_graph *placed = NULL;
    cr_expect_eq(hp_autoshard_apply(a, &placed, &err), HP_OK, "%s", err.msg);
    hp_graph_free(placed);
    hp_autoshard_free(a);
    hp_job_free(job);
}
