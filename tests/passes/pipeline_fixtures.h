/* tests/passes/pipeline_fixtures.h — what the pipeline tests (test_pipeline.c,
 * test_pipeline_precision.c) share: small model jobs, compiling one, a pass's report, the
 * structural checks of any compile, and evaluating a compiled graph. */
#ifndef HP_TESTS_PASSES_PIPELINE_FIXTURES_H
#define HP_TESTS_PASSES_PIPELINE_FIXTURES_H

#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline void force_verify(void) {
    setenv("HP_VERIFY_PASSES", "1", 1);
    unsetenv("HP_DUMP");
}

/* ---- fixtures -------------------------------------------------------------------------------- */

typedef struct model_case {
    const char *spec;
    int64_t dim, layers, heads, kv_heads, ffn, vocab, batch, seq;
} model_case;

static inline hp_job *make_job(const model_case *m, int world, bool fsdp_all) {
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
static inline const hp_pass_report *report(const hp_compiled *c, const char *name) {
    for (int i = 0; i < c->n_passes; i++)
        if (!strcmp(c->passes[i].name, name)) return &c->passes[i];
    cr_assert_fail("no pass named %s", name);
    return NULL;
}

static inline hp_compiled *compile_ok(const hp_job *job, int world) {
    hp_compiled *c = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_compile(job, world, &c, &err), HP_OK, "%s at world %d: %s", job->model.flavor,
                 world, err.msg);
    return c;
}

static const model_case TINY = {"llama3:debugmodel", 64, 2, 4, 2, 96, 128, 6, 16};

/* The structural invariants of any compile. */
static inline void check_reports(const hp_compiled *c, const hp_job *job, int world) {
    static const char *const names[] = {"dce",
                                        "canonicalize",
                                        "fuse_attention",
                                        "activation_checkpoint",
                                        "loss_parallel",
                                        "spmd",
                                        "fsdp",
                                        "mixed_precision",
                                        "fuse_cross_entropy",
                                        "fuse_swiglu",
                                        "overlap",
                                        "bucketing",
                                        "lower"};
    cr_assert_eq(c->n_passes, 13);
    for (int i = 0; i < c->n_passes; i++) {
        const hp_pass_report *r = &c->passes[i];
        cr_expect_str_eq(r->name, names[i]);
        cr_expect_geq(r->seconds, 0);
        if (i > 0 && i < 11) cr_expect_eq(r->nodes_in, c->passes[i - 1].nodes_out, "%s", r->name);
        if (!r->ran && i < 11) cr_expect_eq(r->nodes_in, r->nodes_out, "%s", r->name);
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
    cr_expect_eq(m->total,
                 m->params + m->grads + m->optimizer + m->param_copies + m->activations + m->comm);
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

/* Evaluates g in f64 on deterministic inputs (tokens/labels in [0, vocab)). */
static inline void eval_graph(const hp_graph *g, int64_t vocab, hp_tensor *outs) {
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

#endif
