/* tests/passes/test_fsdp.c — the FSDP pass (passes/fsdp.c) against its contract, docs/fsdp.md:
 * the structure it emits for the tiny Llama at world 2 and 3 (3 pads several parameters), the
 * simulated-rank check in f64 (HyperParallel's: one rank's transformed graph replayed on the
 * reference evaluator, all-gather returning the full tensor and reduce-scatter this rank's
 * chunk, matched against the unsharded gradients), bad input and a fault-injection loop.
 * The golden .hpir cases (tests/golden/passes/fsdp/) run in tests/passes/test_golden.c.
 */
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 6
#define SEQ   16
#define VOCAB 128

/* ---- fixtures -------------------------------------------------------------------------------- */

/* llama3:debugmodel cut down: dim 64, 2 layers, 4 heads, 2 kv heads, ffn 96, vocab 128. */
static hp_graph *tiny_llama(int64_t batch) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, &err), HP_OK, "%s", err.msg);
    spec.dim = 64, spec.n_layers = 2, spec.n_heads = 4, spec.n_kv_heads = 2;
    spec.ffn_hidden = 96, spec.vocab = VOCAB, spec.batch = batch, spec.seq = SEQ;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    return g;
}

static const char *const ALL[] = {"layers.*", "tok_embeddings.*", "output.*", "norm.*"};
static const char *const SOME[] = {"layers.*", "output.*"}; /* embeddings and norm replicated */

static hp_job *make_job(const char *const *patterns, int n, bool reshard) {
    hp_job *job = hp_job_new();
    cr_assert_not_null(job);
    hp_err err = {0};
    for (int i = 0; i < n; i++)
        cr_assert_eq(hp_job_add_fsdp_pattern(job, patterns[i], &err), HP_OK, "%s", err.msg);
    job->plan.reshard_after_forward = reshard;
    return job;
}

static hp_pass_ctx *make_ctx(const hp_job *job, int world) {
    hp_pass_ctx *ctx = calloc(1, sizeof *ctx);
    cr_assert_not_null(ctx);
    ctx->job = job;
    ctx->world = world;
    return ctx;
}

/* Runs the pass, asserting success and a verified result. */
static hp_graph *fsdp(const hp_graph *g, hp_pass_ctx *ctx) {
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_OK, "%s", err.msg);
    cr_assert_not_null(out);
    cr_assert_eq(hp_graph_verify(out, &err), HP_OK, "%s", err.msg);
    return out;
}

static const char *fqn(const hp_graph *g, int id) {
    const hp_attr *a = hp_node_attr(&g->nodes[id], HP_ATTR_FQN);
    return a ? a->s : "";
}

static bool marked(const char *name, const char *const *patterns, int n) {
    for (int i = 0; i < n; i++)
        if (hp_fqn_match(patterns[i], name)) return true;
    return false;
}

static int count_op(const hp_graph *g, hp_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static bool is_view(hp_op op) {
    return op == HP_OP_T || op == HP_OP_VIEW || op == HP_OP_TRANSPOSE || op == HP_OP_PERMUTE ||
           op == HP_OP_RESHAPE || op == HP_OP_TO_COPY || op == HP_OP_EXPAND;
}

/* With reshard_after_forward nothing after the loss reads a forward gather of a parameter, or
 * a view of one: the backward re-gathers, so the forward copy can die with the forward. */
static void expect_forward_copies_die(const hp_graph *out) {
    int loss = out->outputs[0].node;
    bool *fwd = calloc((size_t)out->n_nodes, sizeof *fwd);
    for (int i = 0; i <= loss; i++) {
        const hp_node *nd = &out->nodes[i];
        if (nd->op == HP_OP_ALL_GATHER && out->nodes[i + 1].op == HP_OP_WAIT_TENSOR) {
            fwd[i + 1] = true;
            if (out->nodes[i + 2].op == HP_OP_SLICE) fwd[i + 2] = true;
        } else if (nd->n_in == 1 && is_view(nd->op) && fwd[nd->in[0].node]) {
            fwd[i] = true;
        }
    }
    for (int i = loss + 1; i < out->n_nodes; i++)
        for (int k = 0; k < out->nodes[i].n_in; k++)
            cr_assert_not(fwd[out->nodes[i].in[k].node],
                          "node %d (%s) in the backward reads forward copy %%%d", i,
                          hp_op_get(out->nodes[i].op)->name, out->nodes[i].in[k].node);
    free(fwd);
}

/* ---- structure ------------------------------------------------------------------------------- */

static void check_structure(int world, const char *const *patterns, int n_pat, bool reshard) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(patterns, n_pat, reshard);
    hp_pass_ctx *ctx = make_ctx(job, world);
    hp_pass_report report = {0};
    ctx->report = &report;
    hp_graph *out = fsdp(g, ctx);
    cr_assert_eq(ctx->n_warnings, 0, "%s", ctx->warnings[0]);

    hp_graph_inputs gi = hp_graph_count_inputs(g), go = hp_graph_count_inputs(out);
    cr_assert_eq(go.n_params, gi.n_params);
    cr_assert_eq(go.n_data, gi.n_data);
    cr_assert_eq(out->n_outputs, g->n_outputs);
    int n_marked = 0, want_gathers = 0, n_padded = 0;
    for (int p = 0; p < gi.n_params; p++) {
        const hp_node *a = &g->nodes[p], *b = &out->nodes[p];
        cr_assert_str_eq(fqn(g, p), fqn(out, p));
        cr_assert_eq(hp_node_int(a, HP_ATTR_KIND, -1), hp_node_int(b, HP_ATTR_KIND, -2));
        const hp_type *gt = &a->out[0], *st = &b->out[0];
        /* the gradient output keeps the local parameter's type */
        cr_assert(hp_type_eq(hp_graph_type(out, out->outputs[1 + p]), st), "%s", fqn(g, p));
        const hp_node *w = &out->nodes[out->outputs[1 + p].node];
        cr_assert_eq(w->op, HP_OP_WAIT_TENSOR);
        const hp_node *coll = &out->nodes[w->in[0].node];
        if (!marked(fqn(g, p), patterns, n_pat)) {
            cr_assert(hp_type_eq(gt, st));
            cr_assert_null(hp_node_attr(b, HP_ATTR_GLOBAL_SHAPE));
            cr_assert_eq(coll->op, HP_OP_ALL_REDUCE, "%s", fqn(g, p));
            cr_assert_eq(hp_node_int(coll, HP_ATTR_REDUCE_OP, -1), HP_REDUCE_AVG);
            continue;
        }
        n_marked++;
        int64_t s = (gt->shape[0] + world - 1) / world;
        bool padded = s * world != gt->shape[0];
        n_padded += padded;
        cr_assert_eq(st->shape[0], s, "%s: dim 0 %lld", fqn(g, p), (long long)st->shape[0]);
        for (int d = 1; d < gt->rank; d++) cr_assert_eq(st->shape[d], gt->shape[d]);
        const hp_attr *gs = hp_node_attr(b, HP_ATTR_GLOBAL_SHAPE);
        cr_assert_not_null(gs, "%s", fqn(g, p));
        cr_assert_eq(gs->ints.n, gt->rank);
        for (int d = 0; d < gt->rank; d++) cr_assert_eq(gs->ints.v[d], gt->shape[d]);
        cr_assert_eq(hp_node_int(b, HP_ATTR_GROUP_SIZE, 0), world);
        cr_assert_str_eq(hp_node_attr(b, HP_ATTR_GROUP)->s, "dp");
        cr_assert_eq(coll->op, HP_OP_REDUCE_SCATTER, "%s", fqn(g, p));
        cr_assert_eq(hp_node_int(coll, HP_ATTR_REDUCE_OP, -1), HP_REDUCE_AVG);
        cr_assert_eq(hp_node_int(coll, HP_ATTR_GROUP_SIZE, 0), world);
        const hp_node *pad = &out->nodes[coll->in[0].node];
        cr_assert_eq(pad->op == HP_OP_SLICE_BACKWARD, padded, "%s", fqn(g, p));
        if (padded) cr_assert_eq(pad->out[0].shape[0], s * world);

        /* gathers of this parameter: one per region that reads it, or one with no reshard */
        int gathers = 0;
        for (int i = 0; i < out->n_nodes; i++) {
            const hp_node *nd = &out->nodes[i];
            if (nd->op != HP_OP_ALL_GATHER || nd->in[0].node != p) continue;
            gathers++;
            cr_assert_eq(hp_node_int(nd, HP_ATTR_GROUP_SIZE, 0), world);
            cr_assert_eq(nd->out[0].shape[0], s * world);
            /* wait, then a slice back to d0 when padded, next in the graph */
            cr_assert_eq(out->nodes[i + 1].op, HP_OP_WAIT_TENSOR);
            if (padded) {
                cr_assert_eq(out->nodes[i + 2].op, HP_OP_SLICE);
                cr_assert(hp_type_eq(&out->nodes[i + 2].out[0], gt));
            }
        }
        /* the embedding's backward (embedding_dense_backward) does not read the weight */
        int want = reshard && strcmp(fqn(g, p), "tok_embeddings.weight") ? 2 : 1;
        cr_assert_eq(gathers, want, "%s: %d gathers, want %d", fqn(g, p), gathers, want);
        want_gathers += want;
    }
    cr_assert_eq(count_op(out, HP_OP_ALL_GATHER), want_gathers);
    cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), n_marked);
    cr_assert_eq(count_op(out, HP_OP_ALL_REDUCE), 1 + gi.n_params - n_marked);
    int colls = want_gathers + n_marked + 1 + gi.n_params - n_marked;
    cr_assert_eq(count_op(out, HP_OP_WAIT_TENSOR), colls);
    cr_assert_eq(report.collectives, colls);
    cr_assert_gt(report.comm_bytes, 0);
    if (world == 3) cr_assert_gt(n_padded, 0, "world 3 should pad some parameter");
    if (reshard) expect_forward_copies_die(out);

    /* tok_embeddings is not read by the backward (embedding_dense_backward needs no weight) */
    if (n_marked == gi.n_params) cr_assert_eq(want_gathers, reshard ? 2 * n_marked - 1 : n_marked);

    /* the loss: wait(all_reduce(loss){avg}) */
    const hp_node *lw = &out->nodes[out->outputs[0].node];
    cr_assert_eq(lw->op, HP_OP_WAIT_TENSOR);
    cr_assert_eq(out->nodes[lw->in[0].node].op, HP_OP_ALL_REDUCE);

    /* data inputs [B/N, T] with global_shape [B, T] */
    for (int i = gi.n_params + gi.n_buffers; i < gi.n_params + gi.n_buffers + gi.n_data; i++) {
        const hp_node *d = &out->nodes[i];
        cr_assert_eq(d->out[0].shape[0], BATCH / world, "%s", fqn(out, i));
        cr_assert_eq(d->out[0].shape[1], SEQ);
        const hp_attr *gs = hp_node_attr(d, HP_ATTR_GLOBAL_SHAPE);
        cr_assert_not_null(gs);
        cr_assert_eq(gs->ints.v[0], BATCH);
        cr_assert_eq(gs->ints.v[1], SEQ);
        cr_assert_eq(hp_node_int(d, HP_ATTR_GROUP_SIZE, 0), world);
    }

    /* the text form round-trips */
    char *text = NULL;
    size_t len = 0;
    hp_err err = {0};
    cr_assert_eq(hp_graph_print(out, &text, &len, &err), HP_OK);
    hp_graph *back = NULL;
    cr_assert_eq(hp_graph_parse(text, len, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_graph_eq(out, back));
    hp_graph_free(back);
    hp_free(text);

    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, structure_world2) {
    check_structure(2, ALL, 4, true);
}
Test(fsdp, structure_world3_padded) {
    check_structure(3, ALL, 4, true);
}
Test(fsdp, structure_no_reshard) {
    check_structure(3, ALL, 4, false);
}
Test(fsdp, structure_some_replicated) {
    check_structure(2, SOME, 2, true);
    check_structure(3, SOME, 2, false);
}

/* The verifier accepts the pass's output on every model builder (shapes only: no evaluation). */
Test(fsdp, every_model_builder_verifies) {
    static const struct {
        const char *model;
        int64_t batch, seq;
    } cases[] = {
        {"llama3:debugmodel", 8, 64}, {"llama3:8B", 8, 32}, {"llama3:405B", 8, 16}, {"mlp", 64, 0}};
    static const char *const all[] = {"*"};
    for (size_t c = 0; c < HP_ARRAY_LEN(cases); c++) {
        hp_model_spec spec;
        hp_err err = {0};
        cr_assert_eq(hp_model_spec_parse(cases[c].model, &spec, &err), HP_OK, "%s", err.msg);
        spec.batch = cases[c].batch, spec.seq = cases[c].seq;
        hp_graph *g = NULL;
        cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
        for (int world = 2; world <= 8; world *= 4) {
            for (int reshard = 0; reshard < 2; reshard++) {
                hp_job *job = make_job(all, 1, reshard);
                hp_pass_ctx *ctx = make_ctx(job, world);
                hp_graph *out = fsdp(g, ctx);
                hp_graph_inputs gi = hp_graph_count_inputs(g);
                cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), gi.n_params, "%s",
                             cases[c].model);
                hp_graph_free(out);
                free(ctx);
                hp_job_free(job);
            }
        }
        hp_graph_free(g);
    }
}

/* ---- the simulated rank ---------------------------------------------------------------------- */

typedef struct sim {
    int rank, world, n_params;
    const hp_tensor *padded; /* [n_params] full parameters padded to s*N rows (zeros) */
    const hp_tensor *shards; /* [n_params] this rank's shards as fed */
    int gathers, scatters, reduces;
} sim;

/* One simulated rank: all_gather returns the full (padded) parameter its input placeholder
 * holds a shard of, reduce_scatter this rank's chunk of its input, all_reduce its input. */
static hp_status sim_collective(void *cx, const hp_node *n, const hp_tensor *in, hp_tensor *out,
                                hp_err *err) {
    sim *s = cx;
    int64_t numel = hp_type_numel(&out->type);
    switch (n->op) {
    case HP_OP_ALL_GATHER: {
        int p = n->in[0].node;
        cr_assert(p >= 0 && p < s->n_params, "all_gather of node %d", p);
        cr_assert_eq(hp_type_numel(&in->type), hp_type_numel(&s->shards[p].type));
        cr_assert_eq(memcmp(in->data, s->shards[p].data, (size_t)hp_type_numel(&in->type) * 8), 0,
                     "the gather's input is not this rank's shard");
        cr_assert_eq(numel, hp_type_numel(&s->padded[p].type));
        memcpy(out->data, s->padded[p].data, (size_t)numel * sizeof(double));
        s->gathers++;
        return HP_OK;
    }
    case HP_OP_REDUCE_SCATTER:
        memcpy(out->data, in->data + (size_t)s->rank * (size_t)numel, (size_t)numel * 8);
        s->scatters++;
        return HP_OK;
    case HP_OP_ALL_REDUCE:
        memcpy(out->data, in->data, (size_t)numel * sizeof(double));
        s->reduces++;
        return HP_OK;
    default:
        return hp_errf(err, HP_UNSUPPORTED, "simulated rank: no %s", hp_op_get(n->op)->name);
    }
}

static int64_t row_numel(const hp_type *t) {
    int64_t r = 1;
    for (int d = 1; d < t->rank; d++) r *= t->shape[d];
    return r;
}

/* max |got - want| / max |want| (0 when both are zero) */
static double rel_err(const double *got, const double *want, int64_t n) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

/* A model for the simulated rank: its builder at a batch, the global batch, and the bound of
 * its integer inputs (token ids, labels). */
typedef struct model {
    hp_graph *(*build)(int64_t batch);
    int64_t batch, int_hi;
} model;

static void check_simulated_ranks(model m, int world, const char *const *patterns, int n_pat,
                                  bool reshard) {
    hp_graph *g = m.build(m.batch), *ref = m.build(m.batch / world);
    hp_job *job = make_job(patterns, n_pat, reshard);
    hp_pass_ctx *ctx = make_ctx(job, world);
    hp_graph *out = fsdp(g, ctx);
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    cr_assert_eq(gi.n_buffers, 0);
    hp_err err = {0};

    /* the full parameters (global) and their padded forms */
    hp_tensor *full = calloc((size_t)n_ph, sizeof *full);
    hp_tensor *padded = calloc((size_t)gi.n_params, sizeof *padded);
    hp_tensor *local = calloc((size_t)n_ph, sizeof *local); /* the rank's feeds */
    hp_tensor *ref_out = calloc((size_t)ref->n_outputs, sizeof *ref_out);
    hp_tensor *got = calloc((size_t)out->n_outputs, sizeof *got);
    for (int p = 0; p < gi.n_params; p++) {
        const hp_type *t = &g->nodes[p].out[0];
        cr_assert_eq(hp_tensor_alloc(&full[p], *t, &err), HP_OK);
        bool is_norm = strstr(fqn(g, p), "norm") != NULL;
        hp_th_rand(full[p].data, hp_type_numel(t), 1000 + (uint64_t)p, is_norm ? 0.5 : -0.2,
                   is_norm ? 1.5 : 0.2);
        hp_type pt = out->nodes[p].out[0];
        pt.shape[0] *= world;
        cr_assert_eq(hp_tensor_alloc(&padded[p], pt, &err), HP_OK);
        memcpy(padded[p].data, full[p].data, (size_t)hp_type_numel(t) * sizeof(double));
    }
    /* data: tokens and labels [B, T] (or features and labels) */
    for (int i = gi.n_params; i < n_ph; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&full[i], *t, &err), HP_OK);
        hp_th_rand(full[i].data, hp_type_numel(t), 77 + (uint64_t)i, 0, (double)m.int_hi);
        if (!hp_dtype_is_float(t->dtype))
            for (int64_t k = 0; k < hp_type_numel(t); k++) full[i].data[k] = floor(full[i].data[k]);
    }

    for (int r = 0; r < world; r++) {
        /* the rank's shards and data rows */
        for (int i = 0; i < n_ph; i++) {
            const hp_type *t = &out->nodes[i].out[0];
            cr_assert_eq(hp_tensor_alloc(&local[i], *t, &err), HP_OK);
            bool sharded = hp_node_attr(&out->nodes[i], HP_ATTR_GLOBAL_SHAPE) != NULL;
            const hp_tensor *src = i < gi.n_params ? &padded[i] : &full[i];
            int64_t n = hp_type_numel(t), at = sharded ? r * n : 0;
            memcpy(local[i].data, src->data + at, (size_t)n * sizeof(double));
        }
        sim s = {
            .rank = r, .world = world, .n_params = gi.n_params, .padded = padded, .shards = local};
        hp_eval_opts opts = {
            .precision = HP_EVAL_F64, .collective = sim_collective, .collective_ctx = &s};
        cr_assert_eq(hp_eval(out, local, n_ph, &opts, got, &err), HP_OK, "rank %d: %s", r, err.msg);

        /* the reference: the unsharded graph at the local batch, full parameters, same rows */
        hp_tensor ref_in[64];
        cr_assert_lt(n_ph, 64);
        for (int i = 0; i < n_ph; i++) ref_in[i] = i < gi.n_params ? full[i] : local[i];
        hp_eval_opts ropts = {.precision = HP_EVAL_F64};
        cr_assert_eq(hp_eval(ref, ref_in, n_ph, &ropts, ref_out, &err), HP_OK, "%s", err.msg);

        double e = rel_err(got[0].data, ref_out[0].data, 1);
        cr_assert_lt(e, 1e-10, "rank %d: loss %.17g vs %.17g", r, got[0].data[0],
                     ref_out[0].data[0]);
        for (int p = 0; p < gi.n_params; p++) {
            const hp_tensor *gv = &got[1 + p], *rv = &ref_out[1 + p];
            if (!marked(fqn(g, p), patterns, n_pat)) {
                e = rel_err(gv->data, rv->data, hp_type_numel(&rv->type));
                cr_assert_lt(e, 1e-10, "rank %d: replicated %s: rel err %g", r, fqn(g, p), e);
                continue;
            }
            /* rows [r*s, (r+1)*s) of the zero-padded unsharded gradient */
            int64_t s_rows = gv->type.shape[0], row = row_numel(&gv->type);
            int64_t d0 = rv->type.shape[0], n = s_rows * row;
            double *want = calloc((size_t)n, sizeof *want);
            for (int64_t k = 0; k < s_rows; k++) {
                int64_t src = r * s_rows + k;
                if (src < d0)
                    memcpy(want + k * row, rv->data + src * row, (size_t)row * sizeof *want);
            }
            double scale = 0;
            for (int64_t k = 0; k < hp_type_numel(&rv->type); k++)
                scale = fmax(scale, fabs(rv->data[k]));
            double diff = 0;
            for (int64_t k = 0; k < n; k++) diff = fmax(diff, fabs(gv->data[k] - want[k]));
            cr_assert(scale > 0, "%s: zero gradient", fqn(g, p));
            cr_assert_lt(diff / scale, 1e-10, "rank %d: %s: rel err %g", r, fqn(g, p),
                         diff / scale);
            free(want);
        }
        cr_assert_gt(s.gathers, 0);
        cr_assert_eq(s.reduces, 1 + gi.n_params - s.scatters);
        for (int i = 0; i < out->n_outputs; i++) hp_tensor_free(&got[i]);
        for (int i = 0; i < ref->n_outputs; i++) hp_tensor_free(&ref_out[i]);
        for (int i = 0; i < n_ph; i++) hp_tensor_free(&local[i]);
    }
    for (int i = 0; i < n_ph; i++) hp_tensor_free(&full[i]);
    for (int p = 0; p < gi.n_params; p++) hp_tensor_free(&padded[p]);
    free(full), free(padded), free(local), free(ref_out), free(got);
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(ref);
    hp_graph_free(g);
}

static const model LLAMA = {tiny_llama, BATCH, VOCAB};

Test(fsdp, simulated_rank_world2) {
    check_simulated_ranks(LLAMA, 2, ALL, 4, true);
}
Test(fsdp, simulated_rank_world3_padded) {
    check_simulated_ranks(LLAMA, 3, ALL, 4, true);
}
Test(fsdp, simulated_rank_no_reshard_some_replicated) {
    check_simulated_ranks(LLAMA, 3, SOME, 2, false);
    check_simulated_ranks(LLAMA, 2, SOME, 2, true);
}

/* Two layers whose second weight reaches its matmul through a chain of views, which the
 * backward reads (grad_h = g @ t(B2)): with reshard the chain is recomputed on the re-gathered
 * weight. x [B, 6] -> relu(x @ w1) -> @ t(view(w2)) -> log_softmax -> nll. */
static hp_graph *view_chain(int64_t batch) {
    hp_graph *g = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value w1 = hp_build_placeholder(g, HP_INPUT_PARAM, "w1", TY(HP_F32, 6, 5), &init);
    hp_value w2 = hp_build_placeholder(g, HP_INPUT_PARAM, "w2", TY(HP_F32, 3, 5), &init);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, batch, 6), NULL);
    hp_value y = hp_build_placeholder(g, HP_INPUT_DATA, "labels", TY(HP_I64, batch), NULL);
    hp_value h = hp_relu(g, hp_mm(g, x, w1));
    hp_value b2 = hp_t(g, hp_view(g, w2, 2, (int64_t[]){3, 5}));
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, hp_mm(g, h, b2), hp_attr_int(HP_ATTR_DIM, 1));
    hp_value loss = hp_bin(g, HP_OP_NLL_LOSS_FORWARD, logp, y);
    hp_err err = {0};
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    return g;
}

Test(fsdp, simulated_rank_view_chain) {
    static const char *const w2[] = {"w2"}, *const both[] = {"w?"};
    model m = {view_chain, 4, 3};
    check_simulated_ranks(m, 2, w2, 1, true); /* w2 [3, 5] pads to 4 rows */
    check_simulated_ranks(m, 2, both, 1, false);
    hp_graph *g = view_chain(4);
    hp_job *job = make_job(w2, 1, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = fsdp(g, ctx);
    expect_forward_copies_die(out);
    /* the backward's gather of w2 feeds a recomputed view and t */
    int loss = out->outputs[0].node, seen = 0;
    for (int i = loss + 1; i < out->n_nodes; i++) {
        const hp_node *nd = &out->nodes[i];
        if (nd->op != HP_OP_ALL_GATHER) continue;
        cr_assert_eq(out->nodes[i + 2].op, HP_OP_SLICE);
        cr_assert_eq(out->nodes[i + 3].op, HP_OP_VIEW);
        cr_assert_eq(out->nodes[i + 4].op, HP_OP_T);
        seen++;
    }
    cr_assert_eq(seen, 1);
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

/* nn.MultiheadAttention's views, which merge the batch with other dims: x [B, 3, 6] ->
 * transpose -> [3, B, 6] -> view [3, B·2, 3] (the batch outer, inner factor 2) -> transpose ->
 * [B·2, 3, 3] -> bmm with itself transposed -> transpose back -> view [3·B, 6] (the batch
 * inner: [T·B]) -> @ w -> view [3, B, 5] -> transpose -> view [B·3, 5] -> log_softmax -> nll
 * against labels [B, 3] viewed [B·3]. FSDP finds the batch through every view. */
static hp_graph *merged_views(int64_t batch) {
    hp_graph *g = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", TY(HP_F32, 6, 5), &init);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, batch, 3, 6), NULL);
    hp_value y = hp_build_placeholder(g, HP_INPUT_DATA, "labels", TY(HP_I64, batch, 3), NULL);
    hp_value h = hp_view(g, hp_transpose(g, x, 0, 1), 3, (int64_t[]){3, batch * 2, 3});
    hp_value a = hp_transpose(g, h, 0, 1); /* [B·2, 3, 3] */
    a = hp_bmm(g, a, hp_transpose(g, a, 1, 2));
    hp_value z = hp_view(g, hp_transpose(g, a, 0, 1), 2, (int64_t[]){3 * batch, 6}); /* [T·B] */
    z = hp_mm(g, hp_relu(g, z), w);
    z = hp_transpose(g, hp_view(g, z, 3, (int64_t[]){3, batch, 5}), 0, 1); /* [B, 3, 5] */
    z = hp_view(g, z, 2, (int64_t[]){batch * 3, 5});
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, z, hp_attr_int(HP_ATTR_DIM, 1));
    hp_value t = hp_view(g, y, 1, (int64_t[]){batch * 3});
    hp_value loss = hp_bin(g, HP_OP_NLL_LOSS_FORWARD, logp, t);
    hp_err err = {0};
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    return g;
}

Test(fsdp, simulated_rank_merged_batch_views) {
    static const char *const w[] = {"w"};
    model m = {merged_views, 4, 5};
    check_simulated_ranks(m, 2, w, 1, true);
    check_simulated_ranks(m, 4, w, 1, false);
}

/* ---- world 1, bad input, faults -------------------------------------------------------------- */

Test(fsdp, world1_is_a_copy) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(ALL, 4, true);
    hp_pass_ctx *ctx = make_ctx(job, 1);
    hp_graph *out = fsdp(g, ctx);
    cr_assert(hp_graph_eq(g, out));
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, batch_not_divisible) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(ALL, 4, true);
    hp_pass_ctx *ctx = make_ctx(job, 4);
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_INVALID);
    cr_assert_null(out);
    cr_assert(strstr(err.msg, "batch 6 is not divisible by the world size 4"), "%s", err.msg);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

/* Views of an empty batch-carrying tensor (a zero-size dim): one that keeps the batch at its
 * offset is followed ([4, 0, 3] as [4, 0]); one that moves it is refused naming the node; never
 * a division by zero. */
Test(fsdp, empty_tensor_views) {
    hp_graph *g = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", TY(HP_F32, 3, 2), &init);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, 4, 0, 3), NULL);
    hp_value e = hp_view(g, x, 2, (int64_t[]){4, 0}); /* followed: the batch stays in dim 0 */
    hp_value y =
        hp_mm(g, hp_view(g, hp_view(g, e, 3, (int64_t[]){4, 0, 3}), 2, (int64_t[]){0, 3}), w);
    hp_value loss = hp_reduce(g, HP_OP_SUM, y, 0, NULL, false);
    hp_err err = {0};
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    static const char *const pat[] = {"w"};
    hp_job *job = make_job(pat, 1, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = NULL;
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_UNSUPPORTED);
    cr_assert_null(out);
    cr_expect(strstr(err.msg, "cannot find the batch (dim 0 of its input)") &&
                  strstr(err.msg, "(view)"),
              "%s", err.msg);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, unmatched_pattern_warns) {
    hp_graph *g = tiny_llama(BATCH);
    const char *pats[] = {"layers.*", "layer.*", "nothing?"};
    hp_job *job = make_job(pats, 3, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = fsdp(g, ctx);
    cr_assert_eq(ctx->n_warnings, 2);
    cr_assert_str_eq(ctx->warnings[0], "fsdp: pattern 'layer.*' matches no parameter");
    cr_assert_str_eq(ctx->warnings[1], "fsdp: pattern 'nothing?' matches no parameter");
    cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), 18); /* 9 per layer */
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, exact_fqns) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(NULL, 0, true);
    hp_err err = {0};
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "output.weight", &err), HP_OK);
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "layers.1.attention.wq.weight", &err), HP_OK);
    hp_pass_ctx *ctx = make_ctx(job, 3);
    hp_graph *out = fsdp(g, ctx);
    cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), 2);
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    /* a module name marks every parameter under it, as HyperParallel's fsdp_mark does */
    job = make_job(NULL, 0, true);
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "layers.1.attention", &err), HP_OK);
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "tok_embeddings", &err), HP_OK);
    ctx = make_ctx(job, 3);
    out = fsdp(g, ctx);
    cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), 5, "wq, wk, wv, wo and the embedding");
    hp_graph_free(out);
    /* a mark that names no parameter is an error naming it */
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "layers.9.attention.wq.weight", &err), HP_OK);
    out = NULL;
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_INVALID);
    cr_assert_null(out);
    cr_assert(strstr(err.msg, "plan.fsdp_fqns[2]: 'layers.9.attention.wq.weight' names no "
                              "parameter or module"),
              "%s", err.msg);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

/* The joint graph of loss = reduce(x @ w) over the whole (batched) product, split over 2
 * ranks: the pass refuses it with `want` in the message. */
static void expect_batch_reduction_refused(hp_op reduce, const char *want) {
    hp_graph *g = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", TY(HP_F32, 3, 2), &init);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, 4, 3), NULL);
    hp_value loss = hp_reduce(g, reduce, hp_mm(g, x, w), 0, NULL, false);
    hp_err err = {0};
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    hp_job *job = make_job(NULL, 0, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = NULL;
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_UNSUPPORTED);
    cr_assert_null(out);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

/* loss = mean(x @ w): the gradient's 1/count is a constant of the global batch, so the pass
 * refuses to split that batch rather than scale the gradient wrongly. */
Test(fsdp, mean_over_batch_refused) {
    expect_batch_reduction_refused(HP_OP_MEAN, "(mean): a mean over the batch dim");
}

/* loss = sum(x @ w): each rank would sum its slice, and the loss's and gradients' averages
 * would be world 1's halved; the pass refuses, naming the node (the pipeline then places the
 * graph with spmd: test_pipeline). A mean in a graph without gradients stays fine. */
Test(fsdp, sum_over_batch_refused) {
    expect_batch_reduction_refused(HP_OP_SUM, "(sum): reduces over the batch dim in the forward");
    hp_graph *g = hp_graph_new(); /* the forward alone: its mean averages across ranks */
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(HP_F32, 4, 3), NULL);
    hp_value mean = hp_mean(g, x, 0, NULL, false);
    hp_err err = {0};
    cr_assert_eq(hp_graph_set_outputs(g, &mean, 1, &err), HP_OK, "%s", err.msg);
    hp_job *job = make_job(NULL, 0, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = fsdp(g, ctx);
    cr_assert_eq(count_op(out, HP_OP_ALL_REDUCE), 1);
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, outputs_must_be_loss_then_gradients) {
    hp_graph *g = tiny_llama(BATCH);
    hp_err err = {0};
    g->n_outputs = 3;
    hp_job *job = make_job(ALL, 4, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *out = NULL;
    cr_assert_eq(hp_pass_fsdp(g, ctx, &out, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "the graph has 3 outputs"), "%s", err.msg);
    /* the loss alone (a forward graph) is fine: nothing to reduce but the loss */
    g->n_outputs = 1;
    out = fsdp(g, ctx);
    cr_assert_eq(count_op(out, HP_OP_REDUCE_SCATTER), 0);
    cr_assert_eq(count_op(out, HP_OP_ALL_REDUCE), 1);
    hp_graph_free(out);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, sharding_twice_refused) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(ALL, 4, true);
    hp_pass_ctx *ctx = make_ctx(job, 2);
    hp_graph *once = fsdp(g, ctx), *twice = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_fsdp(once, ctx, &twice, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "already sharded"), "%s", err.msg);
    hp_graph_free(once);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}

Test(fsdp, fault_injection) {
    hp_graph *g = tiny_llama(BATCH);
    hp_job *job = make_job(ALL, 4, true);
    hp_err err = {0};
    cr_assert_eq(hp_job_add_fsdp_fqn(job, "norm.weight", &err), HP_OK);
    hp_pass_ctx *ctx = make_ctx(job, 3);
    hp_graph *ref = fsdp(g, ctx);
    int failures = 0;
    for (long n = 0;; n++) {
        cr_assert_lt(n, 100000, "the pass never succeeded");
        hp_graph *out = NULL;
        ctx->n_warnings = 0;
        hp_alloc_fail_at(n);
        hp_status st = hp_pass_fsdp(g, ctx, &out, &err);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            cr_assert(hp_graph_eq(out, ref));
            hp_graph_free(out);
            break;
        }
        failures++;
        cr_assert_eq(st, HP_NOMEM, "allocation %ld: %s: %s", n, hp_status_str(st), err.msg);
        cr_assert_null(out);
    }
    cr_assert_gt(failures, 0);
    hp_graph_free(ref);
    free(ctx);
    hp_job_free(job);
    hp_graph_free(g);
}
