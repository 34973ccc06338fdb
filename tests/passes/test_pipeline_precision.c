/* The pipeline under the mixed-precision policy and the fusions after it
 * (passes/mixed_precision.c, fuse_cross_entropy.c, fuse_swiglu.c): bf16 gathers and f32
 * reductions, f32 weight-gradient products, transposes folded into products, the loss and the
 * MLP gates fused, each graph computing what the unfused one does (reference evaluator, f64).
 */
#include "hp/passes.h"
#include "passes/passes_internal.h"
#include "tests/passes/pipeline_fixtures.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(pipeline, .init = force_verify, .timeout = 300);

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
    /* each weight gradient is made where the backward reaches its layer, not held to the end
     * of the step: every f32 product comes before the embedding's gradient, the backward's
     * last (the output casts are placed after their producers) */
    const hp_graph *g1 = c1->graph;
    int emb = -1, wide = 0;
    for (int i = 0; i < g1->n_nodes; i++)
        if (g1->nodes[i].op == HP_OP_EMBEDDING_DENSE_BACKWARD) emb = i;
    cr_assert_geq(emb, 0);
    for (int i = 0; i < g1->n_nodes; i++) {
        const hp_node *n = &g1->nodes[i];
        if (n->op != HP_OP_MM || n->out[0].dtype != HP_F32) continue;
        wide++;
        cr_expect_lt(i, emb, "weight gradient node %d after the embedding's gradient %d", i, emb);
    }
    cr_expect_eq(wide, TINY.layers * 7 + 1, "every weight gradient's product is f32");
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

/* Loss parallel under the bf16 policy (torchtitan's FSDP x TP with loss parallel and bf16
 * parameters): the vocab-sharded logits (bf16, from the bf16 output projection) are cast to f32
 * once, and the cross entropy's ops after that cast, their all-reduces (row max, sum of
 * exponentials, the loss) and the logits' gradient up to the output projection run in f32.
 * The f32 plan gets no such cast. */
Test(pipeline, loss_parallel_runs_in_f32_under_bf16) {
    hp_err err = {0};
    hp_job *jobs[2];
    hp_compiled *c[2];
    for (int k = 0; k < 2; k++) {
        hp_job *job = jobs[k] = make_job(&TINY, 2, false);
        snprintf(job->plan.mesh[0].name, sizeof job->plan.mesh[0].name, "tp");
        hp_placement col = HP_SHARD(0), row = HP_SHARD(1);
        static const char *const cols[] = {
            "layers.*.attention.wq.weight",    "layers.*.attention.wk.weight",
            "layers.*.attention.wv.weight",    "layers.*.feed_forward.w1.weight",
            "layers.*.feed_forward.w3.weight", "output.weight"};
        for (size_t i = 0; i < HP_ARRAY_LEN(cols); i++)
            cr_assert_eq(hp_job_add_place_pattern(job, cols[i], &col, 1, &err), HP_OK, "%s",
                         err.msg);
        cr_assert_eq(hp_job_add_place_pattern(job, "layers.*.attention.wo.weight", &row, 1, &err),
                     HP_OK);
        cr_assert_eq(
            hp_job_add_place_pattern(job, "layers.*.feed_forward.w2.weight", &row, 1, &err), HP_OK);
        job->plan.loss_parallel = true;
        if (k) job->plan.param_dtype = HP_BF16;
        c[k] = compile_ok(job, 2);
    }
    const int64_t n = TINY.batch * TINY.seq, v = TINY.vocab / 2;
    for (int k = 0; k < 2; k++) {
        const hp_graph *g = c[k]->graph;
        int logits_casts = 0, f32_max = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const hp_node *nd = &g->nodes[i];
            const hp_type *in0 = nd->n_in ? hp_graph_type(g, nd->in[0]) : NULL;
            if (nd->op == HP_OP_TO_COPY && nd->out[0].rank == 2 && nd->out[0].shape[0] == n &&
                nd->out[0].shape[1] == v && nd->out[0].dtype == HP_F32 && in0->dtype == HP_BF16)
                logits_casts++;
            int64_t numel = hp_type_numel(&nd->out[0]);
            if ((nd->op == HP_OP_AMAX || nd->op == HP_OP_EXP || nd->op == HP_OP_LOG) &&
                (numel == n || numel == n * v)) { /* the cross entropy's */
                cr_expect_eq(nd->out[0].dtype, HP_F32, "plan %d: node %d (%s) in %s", k, i,
                             hp_op_get(nd->op)->name, hp_dtype_name(nd->out[0].dtype));
                f32_max += nd->op == HP_OP_AMAX;
            }
            if (nd->op == HP_OP_ALL_REDUCE && hp_type_numel(&nd->out[0]) <= n)
                cr_expect_eq(in0->dtype, HP_F32, "plan %d: all-reduce %d of %lld in %s", k, i,
                             (long long)hp_type_numel(&nd->out[0]), hp_dtype_name(in0->dtype));
        }
        cr_expect_eq(logits_casts, k, "plan %d: %d casts of the bf16 logits to f32", k,
                     logits_casts);
        cr_expect_geq(f32_max, 1, "plan %d: the row max", k);
    }
    for (int k = 0; k < 2; k++) {
        hp_compiled_free(c[k]);
        hp_job_free(jobs[k]);
    }
}
