/* fuse_attention (passes/canonicalize_attention.c): the unfused causal attention an exported
 * model carries — bmm, scale, causal mask, _softmax, bmm, in the view/transpose forms make_fx
 * emits, with hp's autodiff deriving its backward — becomes the fused attention and its
 * backward, and the fused graph computes the same values (reference evaluator, f64). What is
 * not exactly that (a mask that is not causal tril, a scale by a tensor, a fill that is not
 * -inf, probabilities read elsewhere) is left alone: no fusion, the canonicalized graph itself.
 */
#include "hp/eval.h"
#include "hp/passes.h"
#include "passes/passes_internal.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define H 3
#define T 5
#define D 4

TestSuite(fuse_attention, .timeout = 120);

typedef enum variant {
    PLAIN,        /* where(~tril, -inf, s * scale), as masked_fill records it */
    KEEP_DIV,     /* where(tril, s / sqrt(D), -inf), the mask viewed to [1, 1, T, T] */
    FORWARD_ONLY, /* no backward: the output is the attention itself */
    CORNER_EQ0,   /* nanoGPT: bias[:, :, :T, :T] == 0, bias = tril(ones(8, 8)).view(1, 1, 8, 8) */
    /* negatives: must not fuse */
    CORNER_OFF,   /* the same corner starting at row 1: not causal */
    TRIL_OFFSET,  /* tril(ones, diagonal=1): a query sees one key ahead */
    MASK_INPUT,   /* the mask is a data input (its values unknown) */
    SCALE_TENSOR, /* scaled by a parameter (a learned temperature) */
    FILL_ZERO,    /* masked with 0, not -inf */
    P_ESCAPES,    /* the probabilities are also a graph output */
} variant;

static hp_value full(hp_graph *g, double value) {
    hp_attr a[3] = {hp_attr_ints(HP_ATTR_SHAPE, 0, NULL), hp_attr_float(HP_ATTR_VALUE, value),
                    hp_attr_dtype(HP_ATTR_DTYPE, HP_F32)};
    return hp_build(g, HP_OP_FULL, NULL, 0, a, 3);
}

static hp_value view(hp_graph *g, hp_value x, int rank, const int64_t *shape) {
    hp_attr a = hp_attr_ints(HP_ATTR_SHAPE, rank, shape);
    return hp_build(g, HP_OP_VIEW, &x, 1, &a, 1);
}

static hp_value transpose(hp_graph *g, hp_value x, int d0, int d1) {
    hp_attr a[2] = {hp_attr_int(HP_ATTR_DIM0, d0), hp_attr_int(HP_ATTR_DIM1, d1)};
    return hp_build(g, HP_OP_TRANSPOSE, &x, 1, a, 2);
}

/* The attention of q, k, v (params [B, H, T, D]) as make_fx records it; the loss sum(o^2)
 * differentiated by hp's autodiff unless FORWARD_ONLY. */
static hp_graph *build(variant var) {
    hp_graph *g = hp_graph_new();
    cr_assert_not_null(g);
    hp_type t = {.dtype = HP_F32, .rank = 4, .shape = {B, H, T, D}};
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value q = hp_build_placeholder(g, HP_INPUT_PARAM, "q", t, &init);
    hp_value k = hp_build_placeholder(g, HP_INPUT_PARAM, "k", t, &init);
    hp_value v = hp_build_placeholder(g, HP_INPUT_PARAM, "v", t, &init);
    hp_value temp = HP_NO_VALUE, mask_in = HP_NO_VALUE;
    if (var == SCALE_TENSOR)
        temp = hp_build_placeholder(g, HP_INPUT_PARAM, "temp",
                                    (hp_type){.dtype = HP_F32, .rank = 1, .shape = {1}}, &init);
    if (var == MASK_INPUT)
        mask_in =
            hp_build_placeholder(g, HP_INPUT_DATA, "mask",
                                 (hp_type){.dtype = HP_BOOL, .rank = 2, .shape = {T, T}}, NULL);
    int64_t bh_td[3] = {B * H, T, D}, bh_dt[3] = {B * H, D, T}, bhtt[4] = {B, H, T, T},
            bh_tt[3] = {B * H, T, T}, bhtd[4] = {B, H, T, D}, tt[2] = {T, T}, m4[4] = {1, 1, T, T};
    hp_value kt = transpose(g, k, 2, 3);
    hp_value in2[2] = {view(g, q, 3, bh_td), view(g, kt, 3, bh_dt)};
    hp_value s = view(g, hp_build(g, HP_OP_BMM, in2, 2, NULL, 0), 4, bhtt);
    double scale = 1.0 / sqrt((double)D);
    hp_value x;
    if (var == KEEP_DIV) {
        hp_value dv[2] = {s, full(g, sqrt((double)D))};
        x = hp_build(g, HP_OP_DIV, dv, 2, NULL, 0);
    } else if (var == SCALE_TENSOR) {
        hp_value m[2] = {s, temp};
        x = hp_build(g, HP_OP_MUL, m, 2, NULL, 0);
    } else {
        hp_attr a = hp_attr_float(HP_ATTR_VALUE, scale);
        x = hp_build(g, HP_OP_MUL_SCALAR, &s, 1, &a, 1);
    }
    hp_attr oa[2] = {hp_attr_ints(HP_ATTR_SHAPE, 2, tt), hp_attr_dtype(HP_ATTR_DTYPE, HP_BOOL)};
    hp_value keep = hp_build(g, HP_OP_ONES, NULL, 0, oa, 2);
    hp_attr diag = hp_attr_int(HP_ATTR_DIAGONAL, var == TRIL_OFFSET ? 1 : 0);
    keep = hp_build(g, HP_OP_TRIL, &keep, 1, &diag, 1);
    hp_value fill = full(g, var == FILL_ZERO ? 0.0 : -INFINITY), w;
    if (var == CORNER_EQ0 || var == CORNER_OFF) {
        int64_t nn[2] = {8, 8}, b4[4] = {1, 1, 8, 8};
        hp_attr fa[2] = {hp_attr_ints(HP_ATTR_SHAPE, 2, nn), hp_attr_dtype(HP_ATTR_DTYPE, HP_F32)};
        hp_value bias = hp_build(g, HP_OP_ONES, NULL, 0, fa, 2);
        bias = view(g, hp_build(g, HP_OP_TRIL, &bias, 1, NULL, 0), 4, b4);
        for (int d = 2; d < 4; d++) {
            int64_t s0 = var == CORNER_OFF && d == 2 ? 1 : 0;
            hp_attr sa[3] = {hp_attr_int(HP_ATTR_DIM, d), hp_attr_int(HP_ATTR_START, s0),
                             hp_attr_int(HP_ATTR_END, s0 + T)};
            bias = hp_build(g, HP_OP_SLICE, &bias, 1, sa, 3);
        }
        hp_value eq[2] = {bias, full(g, 0.0)};
        hp_value wi[3] = {hp_build(g, HP_OP_EQ, eq, 2, NULL, 0), fill, x};
        w = hp_build(g, HP_OP_WHERE, wi, 3, NULL, 0);
    } else if (var == KEEP_DIV) {
        hp_value wi[3] = {view(g, keep, 4, m4), x, fill};
        w = hp_build(g, HP_OP_WHERE, wi, 3, NULL, 0);
    } else {
        hp_value drop =
            var == MASK_INPUT ? mask_in : hp_build(g, HP_OP_BITWISE_NOT, &keep, 1, 0, 0);
        hp_value wi[3] = {drop, fill, x};
        w = hp_build(g, HP_OP_WHERE, wi, 3, NULL, 0);
    }
    hp_attr dim = hp_attr_int(HP_ATTR_DIM, -1);
    hp_value p = hp_build(g, HP_OP_SOFTMAX, &w, 1, &dim, 1);
    hp_value in3[2] = {view(g, p, 3, bh_tt), view(g, v, 3, bh_td)};
    hp_value o = view(g, hp_build(g, HP_OP_BMM, in3, 2, NULL, 0), 4, bhtd);
    hp_err err = {0};
    if (var == FORWARD_ONLY) {
        cr_assert_eq(hp_graph_set_outputs(g, &o, 1, &err), HP_OK, "%s", err.msg);
    } else {
        hp_attr two = hp_attr_float(HP_ATTR_EXPONENT, 2.0), all = hp_attr_ints(HP_ATTR_DIMS, 0, 0);
        hp_value sq = hp_build(g, HP_OP_POW, &o, 1, &two, 1);
        hp_value loss = hp_build(g, HP_OP_SUM, &sq, 1, &all, 1);
        cr_assert_eq(hp_graph_status(g, &err), HP_OK, "%s", err.msg);
        cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
        if (var == P_ESCAPES) cr_assert_eq(hp_graph_add_output(g, p, &err), HP_OK, "%s", err.msg);
    }
    cr_assert_eq(hp_graph_status(g, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "%s", err.msg);
    return g;
}

static hp_graph *run(hp_pass_fn fn, const hp_graph *g, hp_pass_report *r) {
    hp_job job;
    hp_job_init_defaults(&job);
    hp_pass_ctx *ctx = calloc(1, sizeof *ctx);
    cr_assert_not_null(ctx);
    ctx->job = &job;
    ctx->world = 1;
    ctx->report = r;
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(fn(g, ctx, &out, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_verify(out, &err), HP_OK, "%s", err.msg);
    free(ctx);
    hp_job_fini(&job);
    return out;
}

static int count_op(const hp_graph *g, hp_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* Every output of a and b equal in f64 on the same random inputs (the mask input causal). */
static void expect_same_values(const hp_graph *a, const hp_graph *b) {
    cr_assert_eq(a->n_outputs, b->n_outputs);
    hp_graph_inputs gi = hp_graph_count_inputs(a);
    int n = gi.n_params + gi.n_buffers + gi.n_data;
    hp_tensor in[8] = {0}, ra[8] = {0}, rb[8] = {0};
    cr_assert_leq(n, 8);
    cr_assert_leq(a->n_outputs, 8);
    hp_err err = {0};
    for (int i = 0; i < n; i++) {
        const hp_type *t = &a->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, &err), HP_OK, "%s", err.msg);
        hp_th_rand(in[i].data, hp_type_numel(t), 77 + (uint64_t)i, -1.0, 1.0);
    }
    hp_eval_opts opts = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(a, in, n, &opts, ra, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_eval(b, in, n, &opts, rb, &err), HP_OK, "%s", err.msg);
    for (int i = 0; i < a->n_outputs; i++) {
        cr_assert(hp_type_eq(&ra[i].type, &rb[i].type), "output %d changed type", i);
        char what[32];
        snprintf(what, sizeof what, "output %d", i);
        hp_th_expect_close(rb[i].data, ra[i].data, hp_type_numel(&ra[i].type), 1e-10, what);
        hp_tensor_free(&ra[i]);
        hp_tensor_free(&rb[i]);
    }
    for (int i = 0; i < n; i++) hp_tensor_free(&in[i]);
}

/* canonicalize then fuse_attention; the fused counts and the graphs */
static void fuse(variant var, int want_fwd, int want_bwd) {
    hp_graph *g = build(var);
    hp_pass_report r0 = {0}, r = {0};
    hp_graph *c = run(hp_pass_canonicalize, g, &r0);
    hp_graph *f = run(hp_pass_fuse_attention, c, &r);
    cr_expect_eq(r.fused_attention, want_fwd, "variant %d: forwards fused", var);
    cr_expect_eq(r.fused_attention_backward, want_bwd, "variant %d: backwards fused", var);
    cr_expect_eq(count_op(f, HP_OP_SDPA), want_fwd);
    cr_expect_eq(count_op(f, HP_OP_SDPA_BACKWARD), want_bwd);
    if (want_fwd) {
        cr_expect_eq(count_op(f, HP_OP_BMM), 0, "variant %d: an unfused bmm survived", var);
        cr_expect_eq(count_op(f, HP_OP_SOFTMAX) + count_op(f, HP_OP_SOFTMAX_BACKWARD), 0);
        expect_same_values(g, f);
        /* fused once is fused: running it again changes nothing */
        hp_pass_report r2 = {0};
        hp_graph *f2 = run(hp_pass_fuse_attention, f, &r2);
        cr_expect(hp_graph_eq(f, f2), "variant %d: fuse_attention is not idempotent", var);
        cr_expect_eq(r2.fused_attention, 0);
        hp_graph_free(f2);
    } else {
        cr_expect(hp_graph_eq(c, f), "variant %d: a graph with nothing to fuse changed", var);
    }
    hp_graph_free(f);
    hp_graph_free(c);
    hp_graph_free(g);
}

Test(fuse_attention, masked_fill_form_with_backward) {
    fuse(PLAIN, 1, 1);
}

Test(fuse_attention, where_keep_mask_and_div_scale) {
    fuse(KEEP_DIV, 1, 1);
}

Test(fuse_attention, forward_only) {
    fuse(FORWARD_ONLY, 1, 0);
}

Test(fuse_attention, corner_of_a_float_tril_buffer_eq_0) {
    fuse(CORNER_EQ0, 1, 1);
}

Test(fuse_attention, mask_not_causal_tril_does_not_fuse) {
    fuse(TRIL_OFFSET, 0, 0);
    fuse(MASK_INPUT, 0, 0);
    fuse(CORNER_OFF, 0, 0);
}

Test(fuse_attention, scale_by_a_tensor_does_not_fuse) {
    fuse(SCALE_TENSOR, 0, 0);
}

Test(fuse_attention, fill_not_minus_inf_does_not_fuse) {
    fuse(FILL_ZERO, 0, 0);
}

Test(fuse_attention, probabilities_read_elsewhere_do_not_fuse) {
    fuse(P_ESCAPES, 0, 0);
}
