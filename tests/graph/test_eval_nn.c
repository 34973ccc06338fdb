/* tests/graph/test_eval_nn.c — the reference evaluator's neural-network kernels: embedding,
 * (log_)softmax, nll_loss, RMSNorm, rotary embedding and attention, against hand-computed or
 * independently written naive formulas, and every backward op against central differences of
 * its forward in F64. */
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F64 HP_EVAL_F64
#define F32 HP_EVAL_F32

/* Asserts that the analytic gradient `got` of input k matches a central difference of the
 * harness graph's output 0 (a scalar). */
static void expect_numeric_grad(hp_th *h, int k, const double *got, double tol, const char *what) {
    int64_t n = hp_type_numel(&h->in[k].type);
    double *num = calloc((size_t)n, sizeof(double));
    cr_assert(num);
    hp_th_numeric_grad(h->g, h->in, h->n_in, k, 1e-6, num);
    hp_th_expect_close(got, num, n, tol, what);
    free(num);
}

/* loss = sum(y * r): a scalar whose gradient with respect to y is r. */
static hp_value project(hp_graph *g, hp_value y, hp_value r) {
    return hp_sum(g, hp_mul(g, y, r), 0, NULL, false);
}

/* ---- embedding ------------------------------------------------------------------------------ */

Test(eval_nn, embedding_lookup) {
    hp_th h;
    hp_th_init(&h);
    double w[12];
    for (int i = 0; i < 12; i++) w[i] = i;
    hp_value wt = hp_th_input(&h, TY(HP_F32, 4, 3), w);
    hp_value idx = hp_th_input(&h, TY(HP_I64, 2, 2), (double[]){3, 0, 1, 3});
    hp_value in[2] = {wt, idx};
    hp_value e = hp_build(h.g, HP_OP_EMBEDDING, in, 2, NULL, 0);
    hp_th_run_ok(&h, &e, 1, F32);
    hp_th_expect(&h.out[0], (double[]){9, 10, 11, 0, 1, 2, 3, 4, 5, 9, 10, 11}, 12, 0);
    cr_expect(h.out[0].type.rank == 3 && h.out[0].type.shape[2] == 3);
    hp_th_fini(&h);
}

Test(eval_nn, embedding_index_out_of_range) {
    const double bad[2] = {5, -1};
    for (int c = 0; c < 2; c++) {
        hp_th h;
        hp_th_init(&h);
        hp_value wt = hp_th_input(&h, TY(HP_F32, 4, 3), NULL);
        hp_value idx = hp_th_input(&h, TY(HP_I32, 3), (double[]){1, bad[c], 2});
        hp_value in[2] = {wt, idx};
        hp_value e = hp_build(h.g, HP_OP_EMBEDDING, in, 2, NULL, 0);
        cr_assert_eq(hp_th_run(&h, &e, 1, F32), HP_INVALID);
        char want[96];
        snprintf(want, sizeof want,
                 "node 2 (embedding): index %g at position 1 out of range [0, 4)", bad[c]);
        cr_expect(strstr(h.err.msg, want), "got '%s', want '%s'", h.err.msg, want);
        cr_expect_null(h.out[0].data);
        hp_th_fini(&h);
    }
}

Test(eval_nn, embedding_dense_backward_padding) {
    hp_th h;
    hp_th_init(&h);
    hp_value g = hp_th_input(&h, TY(HP_F32, 3, 2), (double[]){1, 2, 3, 4, 5, 6});
    hp_value idx = hp_th_input(&h, TY(HP_I64, 3), (double[]){2, 0, 2});
    hp_value in[2] = {g, idx};
    hp_attr a1[1] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 4)};
    hp_attr a2[2] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 4), hp_attr_int(HP_ATTR_PADDING_IDX, 0)};
    hp_attr a3[2] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 4), hp_attr_int(HP_ATTR_PADDING_IDX, 2)};
    hp_value outs[3] = {hp_build(h.g, HP_OP_EMBEDDING_DENSE_BACKWARD, in, 2, a1, 1),
                        hp_build(h.g, HP_OP_EMBEDDING_DENSE_BACKWARD, in, 2, a2, 2),
                        hp_build(h.g, HP_OP_EMBEDDING_DENSE_BACKWARD, in, 2, a3, 2)};
    hp_th_run_ok(&h, outs, 3, F32);
    hp_th_expect(&h.out[0], (double[]){3, 4, 0, 0, 6, 8, 0, 0}, 8, 0);
    hp_th_expect(&h.out[1], (double[]){0, 0, 0, 0, 6, 8, 0, 0}, 8, 0);
    hp_th_expect(&h.out[2], (double[]){3, 4, 0, 0, 0, 0, 0, 0}, 8, 0);
    hp_th_fini(&h);
}

/* The gradient of embedding equals embedding_dense_backward (numerically, in F64). */
Test(eval_nn, embedding_backward_vs_numeric) {
    hp_th h;
    hp_th_init(&h);
    double w[15], r[8];
    hp_th_rand(w, 15, 11, -1, 1);
    hp_th_rand(r, 8, 12, -1, 1);
    hp_value wt = hp_th_input(&h, TY(HP_F32, 5, 2), w);
    hp_value idx = hp_th_input(&h, TY(HP_I64, 4), (double[]){4, 1, 4, 0});
    hp_value rr = hp_th_input(&h, TY(HP_F32, 4, 2), r);
    hp_value in[2] = {wt, idx};
    hp_value loss = project(h.g, hp_build(h.g, HP_OP_EMBEDDING, in, 2, NULL, 0), rr);
    hp_value gin[2] = {rr, idx};
    hp_attr nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 5);
    hp_value outs[2] = {loss, hp_build(h.g, HP_OP_EMBEDDING_DENSE_BACKWARD, gin, 2, &nw, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    double gw[10];
    memcpy(gw, h.out[1].data, sizeof gw);
    expect_numeric_grad(&h, 0, gw, 1e-8, "d loss / d weight");
    hp_th_fini(&h);
}

/* ---- softmax -------------------------------------------------------------------------------- */

/* softmax and log_softmax along dim -1 and 0, checked with p_j = 1 / Σ_k exp(x_k − x_j), which
 * shares nothing with the kernel's max-shift. Large logits must not overflow. */
Test(eval_nn, softmax_values) {
    hp_th h;
    hp_th_init(&h);
    const double x[6] = {1, 2, 3, 1000, 1001, 999.5};
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 3), x);
    hp_attr last = hp_attr_int(HP_ATTR_DIM, -1), first = hp_attr_int(HP_ATTR_DIM, 0);
    hp_value outs[4] = {
        hp_un1(h.g, HP_OP_SOFTMAX, in, last), hp_un1(h.g, HP_OP_LOG_SOFTMAX, in, last),
        hp_un1(h.g, HP_OP_SOFTMAX, in, first), hp_un1(h.g, HP_OP_LOG_SOFTMAX, in, first)};
    hp_th_run_ok(&h, outs, 4, F64);
    double p[6], lp[6], pc[6], lpc[6];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            double s = 0;
            for (int k = 0; k < 3; k++) s += exp(x[r * 3 + k] - x[r * 3 + j]);
            p[r * 3 + j] = 1 / s;
            lp[r * 3 + j] = -log(s);
            double sc = 0;
            for (int k = 0; k < 2; k++) sc += exp(x[k * 3 + j] - x[r * 3 + j]);
            pc[r * 3 + j] = 1 / sc;
            lpc[r * 3 + j] = -log(sc);
        }
    hp_th_expect(&h.out[0], p, 6, 1e-14);
    hp_th_expect(&h.out[1], lp, 6, 1e-12);
    hp_th_expect(&h.out[2], pc, 6, 1e-14);
    hp_th_expect(&h.out[3], lpc, 6, 1e-12);
    hp_th_fini(&h);
}

static void softmax_backward_case(hp_op fwd, hp_op bwd, int64_t dim) {
    hp_th h;
    hp_th_init(&h);
    double x[24], r[24];
    hp_th_rand(x, 24, 21, -2, 2);
    hp_th_rand(r, 24, 22, -1, 1);
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 3, 4), x);
    hp_value rr = hp_th_input(&h, TY(HP_F32, 2, 3, 4), r);
    hp_attr d = hp_attr_int(HP_ATTR_DIM, dim);
    hp_value y = hp_un1(h.g, fwd, in, d);
    hp_value pair[2] = {rr, y};
    hp_value outs[2] = {project(h.g, y, rr), hp_build(h.g, bwd, pair, 2, &d, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    double gx[24];
    memcpy(gx, h.out[1].data, sizeof gx);
    expect_numeric_grad(&h, 0, gx, 1e-8, hp_op_get(bwd)->name);
    hp_th_fini(&h);
}

Test(eval_nn, log_softmax_backward_vs_numeric) {
    softmax_backward_case(HP_OP_LOG_SOFTMAX, HP_OP_LOG_SOFTMAX_BACKWARD, 1);
    softmax_backward_case(HP_OP_LOG_SOFTMAX, HP_OP_LOG_SOFTMAX_BACKWARD, -1);
}

Test(eval_nn, softmax_backward_vs_numeric) {
    softmax_backward_case(HP_OP_SOFTMAX, HP_OP_SOFTMAX_BACKWARD, 0);
    softmax_backward_case(HP_OP_SOFTMAX, HP_OP_SOFTMAX_BACKWARD, -1);
}

/* ---- nll_loss ------------------------------------------------------------------------------- */

static hp_value nll(hp_graph *g, hp_value logp, hp_value t, int reduction, int ignore) {
    hp_value in[2] = {logp, t};
    hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, reduction),
                    hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
    return hp_build(g, HP_OP_NLL_LOSS_FORWARD, in, 2, a, 2);
}

Test(eval_nn, nll_loss_reductions_and_ignore_index) {
    hp_th h;
    hp_th_init(&h);
    double lp[12];
    for (int i = 0; i < 12; i++) lp[i] = -0.1 * (i + 1);
    hp_value logp = hp_th_input(&h, TY(HP_F32, 4, 3), lp);
    hp_value t = hp_th_input(&h, TY(HP_I64, 4), (double[]){0, 2, -100, 1});
    hp_value t2 = hp_th_input(&h, TY(HP_I32, 4), (double[]){0, 2, 2, 1});
    hp_value mean = nll(h.g, logp, t, HP_NLL_MEAN, -100);
    hp_value outs[6] = {mean,
                        hp_out(mean, 1),
                        nll(h.g, logp, t, HP_NLL_SUM, -100),
                        nll(h.g, logp, t, HP_NLL_NONE, -100),
                        nll(h.g, logp, t2, HP_NLL_MEAN, 2),
                        hp_out(nll(h.g, logp, t2, HP_NLL_MEAN, 2), 1)};
    hp_th_run_ok(&h, outs, 6, F64);
    /* picked: lp[0] = -0.1, lp[5] = -0.6, lp[10] = -1.1 */
    hp_th_expect(&h.out[0], (double[]){(0.1 + 0.6 + 1.1) / 3}, 1, 1e-15);
    hp_th_expect(&h.out[1], (double[]){3}, 1, 0);
    hp_th_expect(&h.out[2], (double[]){0.1 + 0.6 + 1.1}, 1, 1e-15);
    hp_th_expect(&h.out[3], (double[]){0.1, 0.6, 0, 1.1}, 4, 1e-15);
    hp_th_expect(&h.out[4], (double[]){(0.1 + 1.1) / 2}, 1, 1e-15);
    hp_th_expect(&h.out[5], (double[]){2}, 1, 0);
    hp_th_fini(&h);
}

Test(eval_nn, nll_loss_all_ignored_is_nan) {
    hp_th h;
    hp_th_init(&h);
    hp_value logp = hp_th_input(&h, TY(HP_F32, 2, 3), NULL);
    hp_value t = hp_th_input(&h, TY(HP_I64, 2), (double[]){-100, -100});
    hp_value l = nll(h.g, logp, t, HP_NLL_MEAN, -100);
    hp_th_run_ok(&h, &l, 1, F32);
    cr_expect(isnan(h.out[0].data[0]));
    hp_th_fini(&h);
}

Test(eval_nn, nll_target_out_of_range) {
    hp_th h;
    hp_th_init(&h);
    hp_value logp = hp_th_input(&h, TY(HP_F32, 2, 3), NULL);
    hp_value t = hp_th_input(&h, TY(HP_I64, 2), (double[]){1, 3});
    hp_value l = nll(h.g, logp, t, HP_NLL_MEAN, -100);
    cr_assert_eq(hp_th_run(&h, &l, 1, F32), HP_INVALID);
    cr_expect(
        strstr(h.err.msg, "node 2 (nll_loss_forward): target 3 at position 1 out of range [0, 3)"),
        "%s", h.err.msg);
    hp_th_fini(&h);
}

/* loss = 1.7 · nll(logp, t): the backward with grad 1.7 against a central difference. */
static void nll_backward_case(int reduction) {
    hp_th h;
    hp_th_init(&h);
    double lp[15];
    hp_th_rand(lp, 15, 31, -3, 0);
    hp_value logp = hp_th_input(&h, TY(HP_F32, 5, 3), lp);
    hp_value t = hp_th_input(&h, TY(HP_I64, 5), (double[]){2, -100, 0, 1, 2});
    hp_value loss = nll(h.g, logp, t, reduction, -100);
    hp_value g = hp_full(h.g, 0, NULL, 1.7, HP_F32);
    hp_value in[4] = {g, logp, t, hp_out(loss, 1)};
    hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, reduction),
                    hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
    hp_value outs[2] = {hp_mul_scalar(h.g, loss, 1.7),
                        hp_build(h.g, HP_OP_NLL_LOSS_BACKWARD, in, 4, a, 2)};
    hp_th_run_ok(&h, outs, 2, F64);
    double gl[15];
    memcpy(gl, h.out[1].data, sizeof gl);
    for (int c = 0; c < 3; c++) cr_expect_eq(gl[3 + c], 0, "the ignored row gets no gradient");
    expect_numeric_grad(&h, 0, gl, 1e-8, "nll_loss_backward");
    hp_th_fini(&h);
}

Test(eval_nn, nll_loss_backward_vs_numeric) {
    nll_backward_case(HP_NLL_MEAN);
    nll_backward_case(HP_NLL_SUM);
}

/* reduction none needs its grad as a data input, declared before any other node. */
Test(eval_nn, nll_loss_backward_none) {
    hp_th h;
    hp_th_init(&h);
    hp_value logp = hp_th_input(&h, TY(HP_F32, 3, 2), NULL);
    hp_value t = hp_th_input(&h, TY(HP_I64, 3), (double[]){1, -100, 0});
    hp_value g = hp_th_input(&h, TY(HP_F32, 3), (double[]){2, 3, 4});
    hp_value tw = hp_out(nll(h.g, logp, t, HP_NLL_NONE, -100), 1);
    hp_value in[4] = {g, logp, t, tw};
    hp_attr a[1] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_NONE)};
    hp_value gl = hp_build(h.g, HP_OP_NLL_LOSS_BACKWARD, in, 4, a, 1);
    hp_th_run_ok(&h, &gl, 1, F64);
    hp_th_expect(&h.out[0], (double[]){0, -2, 0, 0, -4, 0}, 6, 0);
    hp_th_fini(&h);
}

/* ---- the fused cross entropy ---------------------------------------------------------------- */

/* fused_cross_entropy and its backward equal nll_loss over _log_softmax and the chain of their
 * backwards (what passes/fuse_cross_entropy.c replaces), with an ignored row, both reductions;
 * lse is each row's logsumexp. */
static void fused_ce_case(int reduction) {
    hp_th h;
    hp_th_init(&h);
    double x[35];
    hp_th_rand(x, 35, 41, -4, 4);
    x[7] = 30; /* a large logit: the max shift matters */
    hp_value logits = hp_th_input(&h, TY(HP_F32, 5, 7), x);
    hp_value t = hp_th_input(&h, TY(HP_I64, 5), (double[]){6, 0, -100, 3, 0});
    hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, reduction),
                    hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
    hp_value lp = hp_un1(h.g, HP_OP_LOG_SOFTMAX, logits, hp_attr_int(HP_ATTR_DIM, 1));
    hp_value loss = nll(h.g, lp, t, reduction, -100);
    hp_value g = hp_full(h.g, 0, NULL, 1.7, HP_F32);
    hp_value nb =
        hp_build(h.g, HP_OP_NLL_LOSS_BACKWARD, (hp_value[]){g, lp, t, hp_out(loss, 1)}, 4, a, 2);
    hp_value gx = hp_build(h.g, HP_OP_LOG_SOFTMAX_BACKWARD, (hp_value[]){nb, lp}, 2,
                           (hp_attr[]){hp_attr_int(HP_ATTR_DIM, 1)}, 1);
    hp_value ce = hp_build(h.g, HP_OP_FUSED_CROSS_ENTROPY, (hp_value[]){logits, t}, 2, a, 2);
    hp_value cb = hp_build(h.g, HP_OP_FUSED_CROSS_ENTROPY_BACKWARD,
                           (hp_value[]){g, logits, t, hp_out(ce, 2), hp_out(ce, 1)}, 5, a, 2);
    hp_value outs[7] = {loss, hp_out(loss, 1), gx, ce, hp_out(ce, 1), cb, hp_out(ce, 2)};
    hp_th_run_ok(&h, outs, 7, F64);
    hp_th_expect(&h.out[3], h.out[0].data, 1, 1e-13);
    hp_th_expect(&h.out[4], h.out[1].data, 1, 0);
    hp_th_expect(&h.out[5], h.out[2].data, 35, 1e-13);
    for (int r = 0; r < 5; r++) {
        double m = -INFINITY, s = 0;
        for (int c = 0; c < 7; c++) m = fmax(m, x[r * 7 + c]);
        for (int c = 0; c < 7; c++) s += exp(x[r * 7 + c] - m);
        cr_expect(fabs(h.out[6].data[r] - (m + log(s))) < 1e-12, "lse of row %d", r);
    }
    for (int c = 0; c < 7; c++) cr_expect_eq(h.out[5].data[2 * 7 + c], 0, "the ignored row");
    hp_th_fini(&h);
}

Test(eval_nn, fused_cross_entropy_equals_log_softmax_and_nll_loss) {
    fused_ce_case(HP_NLL_MEAN);
    fused_ce_case(HP_NLL_SUM);
}

Test(eval_nn, fused_cross_entropy_target_out_of_range) {
    hp_th h;
    hp_th_init(&h);
    hp_value logits = hp_th_input(&h, TY(HP_F32, 2, 3), NULL);
    hp_value t = hp_th_input(&h, TY(HP_I64, 2), (double[]){0, 3});
    hp_value ce = hp_build(h.g, HP_OP_FUSED_CROSS_ENTROPY, (hp_value[]){logits, t}, 2, NULL, 0);
    cr_assert_neq(hp_th_run(&h, &ce, 1, F64), HP_OK);
    cr_expect(strstr(h.err.msg, "target 3 at position 1 out of range [0, 3)"), "%s", h.err.msg);
    hp_th_fini(&h);
}

/* ---- swiglu --------------------------------------------------------------------------------- */

/* swiglu(a, b) = mul(silu(a), b); swiglu_backward(g, a, b) against central differences of
 * sum(swiglu(a, b) · r) in a and in b. */
Test(eval_nn, swiglu_is_silu_times_b_and_its_backward_the_numeric_gradient) {
    for (int wrt = 0; wrt < 2; wrt++) {
        hp_th h;
        hp_th_init(&h);
        double av[12], bv[12], rv[12];
        hp_th_rand(av, 12, 51, -4, 4);
        hp_th_rand(bv, 12, 52, -2, 2);
        hp_th_rand(rv, 12, 53, -1, 1);
        hp_value a = hp_th_input(&h, TY(HP_F32, 3, 4), av);
        hp_value b = hp_th_input(&h, TY(HP_F32, 3, 4), bv);
        hp_value r = hp_th_input(&h, TY(HP_F32, 3, 4), rv);
        hp_value y = hp_build(h.g, HP_OP_SWIGLU, (hp_value[]){a, b}, 2, NULL, 0);
        hp_value gy = hp_build(h.g, HP_OP_SWIGLU_BACKWARD, (hp_value[]){r, a, b}, 3, NULL, 0);
        hp_value outs[4] = {project(h.g, y, r), hp_mul(h.g, hp_un(h.g, HP_OP_SILU, a), b), y,
                            hp_out(gy, wrt)};
        hp_th_run_ok(&h, outs, 4, F64);
        hp_th_expect(&h.out[2], h.out[1].data, 12, 1e-15);
        double got[12];
        memcpy(got, h.out[3].data, sizeof got);
        expect_numeric_grad(&h, wrt, got, 1e-7,
                            wrt ? "swiglu_backward (b)" : "swiglu_backward (a)");
        hp_th_fini(&h);
    }
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */

Test(eval_nn, rms_norm_forward) {
    hp_th h;
    hp_th_init(&h);
    const double x[8] = {1, 2, 3, 4, -1, 0, 1, 0}, w[4] = {1, 0.5, 2, -1};
    hp_value xin = hp_th_input(&h, TY(HP_F32, 2, 4), x);
    hp_value win = hp_th_input(&h, TY(HP_F32, 4), w);
    hp_value in[2] = {xin, win};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(h.g, HP_OP_RMS_NORM, in, 2, &eps, 1);
    hp_value outs[2] = {y, hp_out(y, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    double r0 = 1 / sqrt(30.0 / 4 + 1e-5), r1 = 1 / sqrt(2.0 / 4 + 1e-5);
    hp_th_expect(&h.out[0], (double[]){r0, r0, 6 * r0, -4 * r0, -r1, 0, 2 * r1, 0}, 8, 1e-15);
    hp_th_expect(&h.out[1], (double[]){r0, r1}, 2, 1e-15);
    /* in F32 rstd is an f32 output */
    hp_th_run_ok(&h, outs, 2, F32);
    cr_expect_eq(h.out[1].data[0], (double)(float)r0);
    cr_expect_eq(h.out[1].type.dtype, HP_F32);
    hp_th_fini(&h);
}

Test(eval_nn, rms_norm_backward_vs_numeric) {
    hp_th h;
    hp_th_init(&h);
    double x[30], w[5], r[30];
    hp_th_rand(x, 30, 41, -2, 2);
    hp_th_rand(w, 5, 42, 0.5, 1.5);
    hp_th_rand(r, 30, 43, -1, 1);
    hp_value xin = hp_th_input(&h, TY(HP_F32, 2, 3, 5), x);
    hp_value win = hp_th_input(&h, TY(HP_F32, 5), w);
    hp_value rr = hp_th_input(&h, TY(HP_F32, 2, 3, 5), r);
    hp_value in[2] = {xin, win};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(h.g, HP_OP_RMS_NORM, in, 2, &eps, 1);
    hp_value bin[4] = {rr, xin, win, hp_out(y, 1)};
    hp_value gb = hp_build(h.g, HP_OP_RMS_NORM_BACKWARD, bin, 4, NULL, 0);
    hp_value outs[3] = {project(h.g, y, rr), gb, hp_out(gb, 1)};
    hp_th_run_ok(&h, outs, 3, F64);
    double gx[30], gw[5];
    memcpy(gx, h.out[1].data, sizeof gx);
    memcpy(gw, h.out[2].data, sizeof gw);
    expect_numeric_grad(&h, 0, gx, 1e-8, "rms_norm gx");
    expect_numeric_grad(&h, 1, gw, 1e-8, "rms_norm gw");
    hp_th_fini(&h);
}

/* ---- LayerNorm, tril, bitwise_not, arange ---------------------------------------------------- */

Test(eval_nn, layer_norm_forward) {
    hp_th h;
    hp_th_init(&h);
    const double x[8] = {1, 2, 3, 6, -1, 1, -1, 1}, w[4] = {1, 0.5, 2, -1}, b[4] = {0, 1, 0, -2};
    hp_value in[3] = {hp_th_input(&h, TY(HP_F32, 2, 4), x), hp_th_input(&h, TY(HP_F32, 4), w),
                      hp_th_input(&h, TY(HP_F32, 4), b)};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(h.g, HP_OP_LAYER_NORM, in, 3, &eps, 1);
    hp_value outs[3] = {y, hp_out(y, 1), hp_out(y, 2)};
    hp_th_run_ok(&h, outs, 3, F64);
    /* row 0: mean 3, var (4+1+0+9)/4 = 3.5; row 1: mean 0, var 1 */
    double r0 = 1 / sqrt(3.5 + 1e-5), r1 = 1 / sqrt(1 + 1e-5);
    hp_th_expect(
        &h.out[0],
        (double[]){-2 * r0, 1 - 0.5 * r0, 0, -3 * r0 - 2, -r1, 1 + 0.5 * r1, -2 * r1, -r1 - 2}, 8,
        1e-15);
    hp_th_expect(&h.out[1], (double[]){3, 0}, 2, 1e-15);
    hp_th_expect(&h.out[2], (double[]){r0, r1}, 2, 1e-15);
    hp_th_fini(&h);
}

Test(eval_nn, layer_norm_backward_vs_numeric) {
    hp_th h;
    hp_th_init(&h);
    double x[30], w[5], b[5], r[30];
    hp_th_rand(x, 30, 41, -2, 2);
    hp_th_rand(w, 5, 42, 0.5, 1.5);
    hp_th_rand(b, 5, 44, -1, 1);
    hp_th_rand(r, 30, 43, -1, 1);
    hp_value xin = hp_th_input(&h, TY(HP_F32, 2, 3, 5), x);
    hp_value win = hp_th_input(&h, TY(HP_F32, 5), w);
    hp_value bi = hp_th_input(&h, TY(HP_F32, 5), b);
    hp_value rr = hp_th_input(&h, TY(HP_F32, 2, 3, 5), r);
    hp_value in[3] = {xin, win, bi};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(h.g, HP_OP_LAYER_NORM, in, 3, &eps, 1);
    hp_value bin[5] = {rr, xin, hp_out(y, 1), hp_out(y, 2), win};
    hp_value gb = hp_build(h.g, HP_OP_LAYER_NORM_BACKWARD, bin, 5, NULL, 0);
    hp_value outs[4] = {project(h.g, y, rr), gb, hp_out(gb, 1), hp_out(gb, 2)};
    hp_th_run_ok(&h, outs, 4, F64);
    double gx[30], gw[5], gbias[5];
    memcpy(gx, h.out[1].data, sizeof gx);
    memcpy(gw, h.out[2].data, sizeof gw);
    memcpy(gbias, h.out[3].data, sizeof gbias);
    expect_numeric_grad(&h, 0, gx, 1e-8, "layer_norm gx");
    expect_numeric_grad(&h, 1, gw, 1e-8, "layer_norm gw");
    expect_numeric_grad(&h, 2, gbias, 1e-8, "layer_norm gb");
    hp_th_fini(&h);
}

Test(eval_nn, tril_bitwise_not_arange) {
    hp_th h;
    hp_th_init(&h);
    const double x[6] = {1, 2, 3, 4, 5, 6};
    hp_value xin = hp_th_input(&h, TY(HP_F32, 2, 3), x);
    hp_value bin = hp_th_input(&h, TY(HP_BOOL, 3), (double[]){1, 0, 1});
    hp_value iin = hp_th_input(&h, TY(HP_I64, 2), (double[]){0, -7});
    hp_attr k = hp_attr_int(HP_ATTR_DIAGONAL, 0), k1 = hp_attr_int(HP_ATTR_DIAGONAL, 1);
    hp_value t0 = hp_build(h.g, HP_OP_TRIL, &xin, 1, &k, 1);
    hp_value t1 = hp_build(h.g, HP_OP_TRIL, &xin, 1, &k1, 1);
    hp_value nb = hp_build(h.g, HP_OP_BITWISE_NOT, &bin, 1, NULL, 0);
    hp_value ni = hp_build(h.g, HP_OP_BITWISE_NOT, &iin, 1, NULL, 0);
    hp_attr ar[3] = {hp_attr_int(HP_ATTR_START, 3), hp_attr_int(HP_ATTR_END, 10),
                     hp_attr_int(HP_ATTR_STEP, 3)};
    hp_value a = hp_build(h.g, HP_OP_ARANGE, NULL, 0, ar, 3);
    hp_value outs[5] = {t0, t1, nb, ni, a};
    hp_th_run_ok(&h, outs, 5, F64);
    hp_th_expect(&h.out[0], (double[]){1, 0, 0, 4, 5, 0}, 6, 0);
    hp_th_expect(&h.out[1], (double[]){1, 2, 0, 4, 5, 6}, 6, 0);
    hp_th_expect(&h.out[2], (double[]){0, 1, 0}, 3, 0);
    hp_th_expect(&h.out[3], (double[]){-1, 6}, 2, 0);
    hp_th_expect(&h.out[4], (double[]){3, 6, 9}, 3, 0);
    cr_expect_eq(h.out[4].type.dtype, HP_I64);
    hp_th_fini(&h);
}

/* ---- rotary --------------------------------------------------------------------------------- */

static hp_value rotary(hp_graph *g, hp_value x, double theta, int inverse) {
    hp_attr a[2] = {hp_attr_float(HP_ATTR_THETA, theta), hp_attr_int(HP_ATTR_INVERSE, inverse)};
    return hp_build(g, HP_OP_ROTARY_EMB, &x, 1, a, 2);
}

Test(eval_nn, rotary_by_hand_and_inverse) {
    hp_th h;
    hp_th_init(&h);
    /* x [B=1, T=3, H=2, D=4]; theta 100: pair 0 turns by t, pair 1 by t/10 */
    double x[24];
    hp_th_rand(x, 24, 51, -1, 1);
    hp_value in = hp_th_input(&h, TY(HP_F32, 1, 3, 2, 4), x);
    hp_value y = rotary(h.g, in, 100, 0);
    hp_value outs[2] = {y, rotary(h.g, y, 100, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    double want[24];
    for (int t = 0; t < 3; t++)
        for (int hh = 0; hh < 2; hh++)
            for (int i = 0; i < 2; i++) {
                double a = i == 0 ? t : t / 10.0;
                int o = (t * 2 + hh) * 4 + 2 * i;
                want[o] = x[o] * cos(a) - x[o + 1] * sin(a);
                want[o + 1] = x[o] * sin(a) + x[o + 1] * cos(a);
            }
    hp_th_expect(&h.out[0], want, 24, 1e-14);
    hp_th_expect_close(h.out[0].data, x, 8, 0, "position 0 is unrotated");
    hp_th_expect(&h.out[1], x, 24, 1e-14);
    hp_th_fini(&h);
}

Test(eval_nn, rotary_inverse_is_the_gradient) {
    hp_th h;
    hp_th_init(&h);
    double x[32], r[32];
    hp_th_rand(x, 32, 52, -1, 1);
    hp_th_rand(r, 32, 53, -1, 1);
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 2, 2, 4), x);
    hp_value rr = hp_th_input(&h, TY(HP_F32, 2, 2, 2, 4), r);
    hp_value outs[2] = {project(h.g, rotary(h.g, in, 500000, 0), rr), rotary(h.g, rr, 500000, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    double gx[32];
    memcpy(gx, h.out[1].data, sizeof gx);
    expect_numeric_grad(&h, 0, gx, 1e-8, "rotary gradient");
    hp_th_fini(&h);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* Naive attention written independently of the kernel: a full score matrix, the causal mask
 * as −inf entries, softmax by exp / sum, kv head = h * Hkv / H. */
static void naive_attention(const double *q, const double *k, const double *v, int B, int H,
                            int Hkv, int T, int S, int D, int Dv, double scale, bool causal,
                            double *out, double *lse) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h * Hkv / H;
            for (int t = 0; t < T; t++) {
                double sc[16], mx = -INFINITY, z = 0;
                for (int s = 0; s < S; s++) {
                    double d = 0;
                    for (int c = 0; c < D; c++)
                        d += q[((b * H + h) * T + t) * D + c] * k[((b * Hkv + kh) * S + s) * D + c];
                    sc[s] = (causal && s > t) ? -INFINITY : scale * d;
                    mx = fmax(mx, sc[s]);
                }
                for (int s = 0; s < S; s++) z += exp(sc[s] - mx);
                lse[(b * H + h) * T + t] = mx + log(z);
                for (int c = 0; c < Dv; c++) {
                    double acc = 0;
                    for (int s = 0; s < S; s++)
                        acc += exp(sc[s] - mx) / z * v[((b * Hkv + kh) * S + s) * Dv + c];
                    out[((b * H + h) * T + t) * Dv + c] = acc;
                }
            }
        }
}

static hp_value sdpa(hp_graph *g, hp_value q, hp_value k, hp_value v, double scale, int causal) {
    hp_value in[3] = {q, k, v};
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, scale), hp_attr_int(HP_ATTR_CAUSAL, causal)};
    return hp_build(g, HP_OP_SDPA, in, 3, a, 2);
}

static void sdpa_forward_case(int B, int H, int Hkv, int T, int S, int D, int Dv, bool causal) {
    hp_th h;
    hp_th_init(&h);
    int nq = B * H * T * D, nk = B * Hkv * S * D, nv = B * Hkv * S * Dv;
    double q[256], k[256], v[256], out[256], lse[64];
    hp_th_rand(q, nq, 61, -1, 1);
    hp_th_rand(k, nk, 62, -1, 1);
    hp_th_rand(v, nv, 63, -1, 1);
    double scale = 1 / sqrt((double)D);
    hp_value qi = hp_th_input(&h, TY(HP_F32, B, H, T, D), q);
    hp_value ki = hp_th_input(&h, TY(HP_F32, B, Hkv, S, D), k);
    hp_value vi = hp_th_input(&h, TY(HP_F32, B, Hkv, S, Dv), v);
    hp_value o = sdpa(h.g, qi, ki, vi, scale, causal);
    hp_value outs[2] = {o, hp_out(o, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    naive_attention(q, k, v, B, H, Hkv, T, S, D, Dv, scale, causal, out, lse);
    hp_th_expect(&h.out[0], out, B * H * T * Dv, 1e-13);
    hp_th_expect(&h.out[1], lse, B * H * T, 1e-13);
    hp_th_fini(&h);
}

Test(eval_nn, sdpa_gqa_causal_vs_naive) {
    sdpa_forward_case(2, 4, 2, 4, 4, 3, 2, true); /* two query heads per kv head */
    sdpa_forward_case(1, 3, 1, 3, 3, 2, 3, true); /* multi-query */
    sdpa_forward_case(1, 2, 2, 2, 5, 4, 2, false);
    sdpa_forward_case(1, 2, 2, 3, 3, 4, 4, false);
}

Test(eval_nn, sdpa_first_causal_row_copies_v0) {
    hp_th h;
    hp_th_init(&h);
    hp_value q = hp_th_input(&h, TY(HP_F32, 1, 1, 2, 2), (double[]){5, -3, 1, 1});
    hp_value k = hp_th_input(&h, TY(HP_F32, 1, 1, 2, 2), (double[]){1, 2, 3, 4});
    hp_value v = hp_th_input(&h, TY(HP_F32, 1, 1, 2, 1), (double[]){7, 9});
    hp_value o = sdpa(h.g, q, k, v, 0.5, 1);
    hp_value outs[2] = {o, hp_out(o, 1)};
    hp_th_run_ok(&h, outs, 2, F64);
    /* row 0 sees key 0 only: out = v0, lse = 0.5·(5 − 6); row 1: scores 1.5 and 3.5 */
    double p1 = 1 / (1 + exp(2.0));
    hp_th_expect(&h.out[0], (double[]){7, 7 * p1 + 9 * (1 - p1)}, 2, 1e-14);
    hp_th_expect(&h.out[1], (double[]){-0.5, 3.5 + log(1 + exp(-2.0))}, 2, 1e-14);
    hp_th_fini(&h);
}

static void sdpa_backward_case(int H, int Hkv, int T, int S, bool causal) {
    const int B = 2, D = 3, Dv = 2;
    hp_th h;
    hp_th_init(&h);
    int nq = B * H * T * D, nk = B * Hkv * S * D, nv = B * Hkv * S * Dv, no = B * H * T * Dv;
    double q[256], k[256], v[256], r[256];
    hp_th_rand(q, nq, 71, -1, 1);
    hp_th_rand(k, nk, 72, -1, 1);
    hp_th_rand(v, nv, 73, -1, 1);
    hp_th_rand(r, no, 74, -1, 1);
    double scale = 0.8;
    hp_value qi = hp_th_input(&h, TY(HP_F32, B, H, T, D), q);
    hp_value ki = hp_th_input(&h, TY(HP_F32, B, Hkv, S, D), k);
    hp_value vi = hp_th_input(&h, TY(HP_F32, B, Hkv, S, Dv), v);
    hp_value rr = hp_th_input(&h, TY(HP_F32, B, H, T, Dv), r);
    hp_value o = sdpa(h.g, qi, ki, vi, scale, causal);
    hp_value bin[6] = {rr, qi, ki, vi, o, hp_out(o, 1)};
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, scale), hp_attr_int(HP_ATTR_CAUSAL, causal)};
    hp_value gb = hp_build(h.g, HP_OP_SDPA_BACKWARD, bin, 6, a, 2);
    hp_value outs[4] = {project(h.g, o, rr), gb, hp_out(gb, 1), hp_out(gb, 2)};
    hp_th_run_ok(&h, outs, 4, F64);
    double gq[256], gk[256], gv[256];
    memcpy(gq, h.out[1].data, sizeof(double) * (size_t)nq);
    memcpy(gk, h.out[2].data, sizeof(double) * (size_t)nk);
    memcpy(gv, h.out[3].data, sizeof(double) * (size_t)nv);
    expect_numeric_grad(&h, 0, gq, 1e-8, "sdpa gq");
    expect_numeric_grad(&h, 1, gk, 1e-8, "sdpa gk");
    expect_numeric_grad(&h, 2, gv, 1e-8, "sdpa gv");
    hp_th_fini(&h);
}

Test(eval_nn, sdpa_backward_vs_numeric) {
    sdpa_backward_case(4, 2, 3, 3, true);  /* GQA, causal */
    sdpa_backward_case(2, 1, 2, 4, false); /* MQA, T != S */
    sdpa_backward_case(2, 2, 4, 4, true);
}

/* In F32 a bf16 attention rounds out to bf16 and keeps logsumexp in f32. */
Test(eval_nn, sdpa_bf16_rounding) {
    hp_th h;
    hp_th_init(&h);
    double q[8], k[8], v[8];
    hp_th_rand(q, 8, 81, -1, 1);
    hp_th_rand(k, 8, 82, -1, 1);
    hp_th_rand(v, 8, 83, -1, 1);
    hp_value qi = hp_th_input(&h, TY(HP_BF16, 1, 2, 2, 2), q);
    hp_value ki = hp_th_input(&h, TY(HP_BF16, 1, 2, 2, 2), k);
    hp_value vi = hp_th_input(&h, TY(HP_BF16, 1, 2, 2, 2), v);
    hp_value o = sdpa(h.g, qi, ki, vi, 0.7, 1);
    hp_value outs[2] = {o, hp_out(o, 1)};
    hp_th_run_ok(&h, outs, 2, F32);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(h.out[0].data[i], hp_eval_round(HP_BF16, h.out[0].data[i]));
    cr_expect_eq(h.out[1].type.dtype, HP_F32);
    for (int i = 0; i < 4; i++) cr_expect_eq(h.out[1].data[i], (double)(float)h.out[1].data[i]);
    hp_th_fini(&h);
}
