/* tests/graph/test_autodiff.c — hp_autodiff's contract: accumulation over several uses, zeros
 * for unused parameters, the outputs convention, rejected losses, refused paths through ops
 * without a gradient, non-float values stopping gradients, ties (maximum, amax), padding_idx,
 * a small transformer block's joint graph (verifies, matches finite differences), and a
 * fault-injection loop that leaves the graph as it was.
 * Per-op finite-difference checks are in test_gradcheck.c.
 */
#include "hp/build.h"
#include "hp/eval.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define T(dt, ...)                                                                                 \
    hp_type_make((dt), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                  \
                 (int64_t[]){__VA_ARGS__})
#define T0(dt) hp_type_make((dt), 0, NULL)
#define F      HP_F32

static hp_value sum_all(hp_graph *g, hp_value x) {
    return hp_sum(g, x, 0, (int64_t[]){0}, false);
}
static hp_value param(hp_graph *g, const char *fqn, hp_type t) {
    return hp_build_placeholder(g, HP_INPUT_PARAM, fqn, t, NULL);
}
static hp_value data(hp_graph *g, hp_type t) {
    return hp_build_placeholder(g, HP_INPUT_DATA, NULL, t, NULL);
}

/* Feeds for every placeholder of g: data[k] (numel values) or, when NULL, a ramp. */
typedef struct feeds {
    int n;
    hp_tensor t[16];
} feeds;

static void feeds_make(feeds *f, const hp_graph *g, const double *const *vals) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) {
        hp_err e;
        cr_assert_lt(f->n, 16);
        cr_assert_eq(hp_tensor_alloc(&f->t[f->n], g->nodes[i].out[0], &e), HP_OK, "%s", e.msg);
        int64_t n = hp_type_numel(&g->nodes[i].out[0]);
        for (int64_t j = 0; j < n; j++)
            f->t[f->n].data[j] = vals && vals[f->n] ? vals[f->n][j] : 0.1 * (double)(j + 1);
        f->n++;
    }
}

static void feeds_free(feeds *f) {
    for (int i = 0; i < f->n; i++) hp_tensor_free(&f->t[i]);
}

/* Evaluates g in f64; out must hold g->n_outputs tensors (free with outs_free). */
static void run(const hp_graph *g, feeds *f, hp_tensor *out) {
    hp_err e = {0};
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, f->t, f->n, &o, out, &e), HP_OK, "eval failed: %s", e.msg);
}

static void outs_free(hp_tensor *out, int n) {
    for (int i = 0; i < n; i++) hp_tensor_free(&out[i]);
}

static void expect_values(const hp_tensor *t, const double *want, int n, const char *what) {
    cr_assert_eq(hp_type_numel(&t->type), n, "%s: %lld elements, expected %d", what,
                 (long long)hp_type_numel(&t->type), n);
    for (int i = 0; i < n; i++)
        cr_expect(fabs(t->data[i] - want[i]) <= 1e-12 * fmax(1, fabs(want[i])),
                  "%s[%d] = %.17g, expected %.17g", what, i, t->data[i], want[i]);
}

static int count_op(const hp_graph *g, hp_op op, int from) {
    int c = 0;
    for (int i = from; i < g->n_nodes; i++) c += g->nodes[i].op == op;
    return c;
}

static void autodiff_ok(hp_graph *g, hp_value loss) {
    hp_err e = {0};
    cr_assert(!hp_graph_failed(g), "building failed: %s", g->err.msg);
    cr_assert_eq(hp_autodiff(g, loss, &e), HP_OK, "autodiff failed: %s", e.msg);
    cr_assert_eq(hp_graph_verify(g, &e), HP_OK, "joint graph does not verify: %s", e.msg);
}

/* Expects hp_autodiff to fail with status st and a message containing `text`, leaving the graph
 * exactly as it was. */
static void autodiff_fails(hp_graph *g, hp_value loss, hp_status st, const char *text) {
    cr_assert(!hp_graph_failed(g), "building failed: %s", g->err.msg);
    hp_graph *before = hp_graph_clone(g);
    cr_assert(before);
    hp_err e = {0};
    cr_assert_eq(hp_autodiff(g, loss, &e), st, "status %s, expected %s (%s)",
                 hp_status_str(e.status), hp_status_str(st), e.msg);
    cr_expect(strstr(e.msg, text), "message '%s' does not contain '%s'", e.msg, text);
    cr_expect(hp_graph_eq(g, before), "the failed autodiff changed the graph");
    cr_expect(!hp_graph_failed(g), "the failed autodiff left a sticky error: %s", g->err.msg);
    hp_graph_free(before);
}

/* ---- accumulation, unused parameters, outputs ----------------------------------------------- */

Test(autodiff, several_uses_accumulate) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value loss = sum_all(g, hp_add(g, hp_mul(g, x, x), x)); /* x^2 + x */
    int n0 = g->n_nodes;
    autodiff_ok(g, loss);
    cr_expect_geq(count_op(g, HP_OP_ADD, n0), 1, "no accumulating add");
    double xv[3] = {1.5, -2, 0.25};
    feeds f;
    feeds_make(&f, g, (const double *[]){xv});
    hp_tensor out[2] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){4, -3, 1.5}, 3, "grad x"); /* 2x + 1 */
    outs_free(out, 2);
    feeds_free(&f);
    hp_graph_free(g);
}

/* detach(x) is x with no gradient through it (torch's .detach(), a straight-through
 * estimator): x * detach(x) has gradient x, not 2x; a loss all through detach gives zeros. */
Test(autodiff, detach_stops_the_gradient) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value y = param(g, "y", T(F, 3));
    hp_value d = hp_un(g, HP_OP_DETACH, x);
    hp_value loss = hp_add(g, sum_all(g, hp_mul(g, x, d)), sum_all(g, hp_un(g, HP_OP_DETACH, y)));
    autodiff_ok(g, loss);
    double xv[3] = {1.5, -2, 0.25};
    feeds f;
    feeds_make(&f, g, (const double *[]){xv, xv});
    hp_tensor out[3] = {0};
    run(g, &f, out);
    expect_values(&out[0], (double[]){1.5 * 1.5 + 4 + 0.0625 + 1.5 - 2 + 0.25}, 1, "loss");
    expect_values(&out[1], xv, 3, "grad x");
    expect_values(&out[2], (double[]){0, 0, 0}, 3, "grad y");
    outs_free(out, 3);
    feeds_free(&f);
    hp_graph_free(g);
}

Test(autodiff, unused_param_gets_zeros) {
    hp_graph *g = hp_graph_new();
    hp_value a = param(g, "a", T(F, 2));
    param(g, "b", T(F, 3, 1));
    hp_value loss = sum_all(g, hp_mul_scalar(g, a, 3));
    autodiff_ok(g, loss);
    cr_assert_eq(g->n_outputs, 3);
    cr_expect_eq(g->nodes[g->outputs[2].node].op, HP_OP_ZEROS);
    feeds f;
    feeds_make(&f, g, NULL);
    hp_tensor out[3] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){3, 3}, 2, "grad a");
    expect_values(&out[2], (double[]){0, 0, 0}, 3, "grad b");
    hp_type tb = T(F, 3, 1);
    cr_expect(hp_type_eq(&out[2].type, &tb));
    outs_free(out, 3);
    feeds_free(&f);
    hp_graph_free(g);
}

Test(autodiff, loss_without_params_gives_zeros) {
    hp_graph *g = hp_graph_new();
    param(g, "w", T(F, 2));
    hp_value d = data(g, T(F, 4));
    hp_value loss = sum_all(g, hp_exp(g, d));
    autodiff_ok(g, loss);
    cr_assert_eq(g->n_outputs, 2);
    cr_expect_eq(g->nodes[g->outputs[1].node].op, HP_OP_ZEROS);
    hp_graph_free(g);
}

Test(autodiff, loss_is_a_param) {
    hp_graph *g = hp_graph_new();
    hp_value p = param(g, "p", T0(F));
    autodiff_ok(g, p);
    feeds f;
    feeds_make(&f, g, NULL);
    hp_tensor out[2] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){1}, 1, "grad p");
    outs_free(out, 2);
    feeds_free(&f);
    hp_graph_free(g);
}

Test(autodiff, outputs_follow_the_convention) {
    hp_graph *g = hp_graph_new();
    hp_type types[3] = {T(F, 2), T(HP_BF16, 3, 1), T(F, 1, 2)};
    hp_value p[3];
    p[0] = param(g, "layers.0.w", types[0]);
    p[1] = param(g, "layers.1.w", types[1]);
    p[2] = param(g, "norm.weight", types[2]);
    hp_value buf = hp_build_placeholder(g, HP_INPUT_BUFFER, "freqs", T(F, 2), NULL);
    hp_value d = data(g, T(F, 2));
    hp_value a = hp_mul(g, hp_add(g, p[0], buf), d);           /* [2] */
    hp_value b = hp_to(g, sum_all(g, p[1]), HP_F32);           /* [] */
    hp_value c = hp_view(g, p[2], 1, (int64_t[]){2});          /* [2] */
    hp_value loss = sum_all(g, hp_mul(g, hp_add(g, a, c), b)); /* [] */
    /* a node after the loss is left alone */
    hp_value after = hp_mul_scalar(g, loss, 2);
    hp_graph_add_output(g, after, NULL);
    autodiff_ok(g, loss);
    cr_assert_eq(g->n_outputs, 4);
    cr_expect(g->outputs[0].node == loss.node && g->outputs[0].out == loss.out);
    for (int k = 0; k < 3; k++) {
        const hp_type *t = hp_graph_type(g, g->outputs[1 + k]);
        cr_expect(hp_type_eq(t, &types[k]), "gradient %d has the wrong type", k);
    }
    hp_graph_free(g);
}

/* ---- rejected losses and refused paths ------------------------------------------------------ */

Test(autodiff, non_scalar_loss_rejected) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value y = hp_mul(g, x, x);
    autodiff_fails(g, y, HP_INVALID, "not a scalar");
    hp_graph_free(g);
}

Test(autodiff, non_float_loss_rejected) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value y = hp_to(g, sum_all(g, x), HP_I32);
    autodiff_fails(g, y, HP_INVALID, "not floating");
    hp_graph_free(g);
}

Test(autodiff, loss_outside_the_graph_rejected) {
    hp_graph *g = hp_graph_new();
    param(g, "x", T0(F));
    autodiff_fails(g, (hp_value){7, 0}, HP_INVALID, "not a value");
    autodiff_fails(g, (hp_value){0, 1}, HP_INVALID, "not a value");
    autodiff_fails(g, HP_NO_VALUE, HP_INVALID, "not a value");
    hp_graph_free(g);
}

Test(autodiff, failed_graph_rejected) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value loss = sum_all(g, x);
    hp_mm(g, x, x); /* rank 1: a builder error */
    cr_assert(hp_graph_failed(g));
    hp_err e = {0};
    cr_expect_neq(hp_autodiff(g, loss, &e), HP_OK);
    cr_expect(strstr(e.msg, "mm"), "message: %s", e.msg);
    cr_expect_neq(hp_autodiff(g, loss, NULL), HP_OK);
    hp_graph_free(g);
}

Test(autodiff, op_without_gradient_on_the_path_refused) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value y = hp_bin(g, HP_OP_SILU_BACKWARD, x, x); /* node 1 */
    hp_value loss = sum_all(g, y);
    autodiff_fails(g, loss, HP_UNSUPPORTED, "node 1 (silu_backward)");
    hp_graph_free(g);

    g = hp_graph_new();
    x = param(g, "x", T(F, 4));
    hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_int(HP_ATTR_REDUCE_OP, 0)};
    hp_value r = hp_build(g, HP_OP_ALL_REDUCE, &x, 1, a, 2);
    hp_value w = hp_un(g, HP_OP_WAIT_TENSOR, r); /* node 2 */
    loss = sum_all(g, hp_exp(g, w));
    autodiff_fails(g, loss, HP_UNSUPPORTED, "node 2 (wait_tensor)");
    hp_graph_free(g);
}

Test(autodiff, op_without_gradient_off_the_path_is_fine) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 3));
    hp_value d = data(g, T(F, 3));
    hp_value k = hp_bin(g, HP_OP_SILU_BACKWARD, d, d); /* data only: not on a param path */
    hp_value loss = sum_all(g, hp_mul(g, x, k));
    autodiff_ok(g, loss);
    hp_graph_free(g);
}

Test(autodiff, saved_outputs_on_the_path_refused) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 2, 4));
    hp_value w = param(g, "w", T(F, 4));
    hp_value in[2] = {x, w};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(g, HP_OP_RMS_NORM, in, 2, &eps, 1); /* node 2 */
    hp_value loss = hp_add(g, sum_all(g, y), sum_all(g, hp_out(y, 1)));
    autodiff_fails(g, loss, HP_UNSUPPORTED, "node 2 (_fused_rms_norm): output 1");
    hp_graph_free(g);
}

/* Gradients of bools and integers never flow: d/dx (x * (x < 0)) = (x < 0). */
Test(autodiff, non_float_values_stop_gradients) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 4));
    hp_value zero = hp_zeros(g, 0, (int64_t[]){0}, F);
    hp_value m = hp_to(g, hp_bin(g, HP_OP_LT, x, zero), F);
    hp_value i = hp_to(g, hp_to(g, hp_mul_scalar(g, x, 10), HP_I64), F); /* truncation */
    hp_value loss = sum_all(g, hp_add(g, hp_mul(g, x, m), i));
    autodiff_ok(g, loss);
    double xv[4] = {-1, 2, -0.5, 3};
    feeds f;
    feeds_make(&f, g, (const double *[]){xv});
    hp_tensor out[2] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){1, 0, 1, 0}, 4, "grad x");
    outs_free(out, 2);
    feeds_free(&f);
    hp_graph_free(g);
}

/* total_weight is constant: sum-reduced loss / total_weight has the mean's gradient. */
Test(autodiff, nll_total_weight_is_constant) {
    double logits[12], targets[3] = {2, -100, 0};
    for (int i = 0; i < 12; i++) logits[i] = sin(1.0 + i);
    hp_tensor got[2][2];
    memset(got, 0, sizeof got);
    for (int variant = 0; variant < 2; variant++) {
        hp_graph *g = hp_graph_new();
        hp_value x = param(g, "x", T(F, 3, 4));
        hp_value t = data(g, T(HP_I64, 3));
        hp_value lp = hp_un1(g, HP_OP_LOG_SOFTMAX, x, hp_attr_int(HP_ATTR_DIM, -1));
        hp_value in[2] = {lp, t};
        hp_attr red = hp_attr_int(HP_ATTR_REDUCTION, variant ? HP_NLL_SUM : HP_NLL_MEAN);
        hp_value nll = hp_build(g, HP_OP_NLL_LOSS_FORWARD, in, 2, &red, 1);
        hp_value loss = variant ? hp_div(g, nll, hp_out(nll, 1)) : nll;
        autodiff_ok(g, loss);
        feeds f;
        feeds_make(&f, g, (const double *[]){logits, targets});
        run(g, &f, got[variant]);
        feeds_free(&f);
        hp_graph_free(g);
    }
    expect_values(&got[1][0], got[0][0].data, 1, "loss");
    expect_values(&got[1][1], got[0][1].data, 12, "grad x");
    for (int v = 0; v < 2; v++) outs_free(got[v], 2);
}

/* ---- ties and padding: where PyTorch's convention, not the limit, defines the gradient ------ */

Test(autodiff, maximum_splits_ties_evenly) {
    hp_graph *g = hp_graph_new();
    hp_value a = param(g, "a", T(F, 4));
    hp_value b = param(g, "b", T(F, 4));
    hp_value loss = sum_all(g, hp_bin(g, HP_OP_MAXIMUM, a, b));
    autodiff_ok(g, loss);
    feeds f;
    feeds_make(&f, g, (const double *[]){(double[]){1, 2, 3, 4}, (double[]){0, 2, 5, 4}});
    hp_tensor out[3] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){1, 0.5, 0, 0.5}, 4, "grad a");
    expect_values(&out[2], (double[]){0, 0.5, 1, 0.5}, 4, "grad b");
    outs_free(out, 3);
    feeds_free(&f);
    hp_graph_free(g);
}

Test(autodiff, amax_splits_ties_evenly) {
    hp_graph *g = hp_graph_new();
    hp_value x = param(g, "x", T(F, 2, 4));
    hp_value w = data(g, T(F, 2));
    hp_value m = hp_amax(g, x, 1, (int64_t[]){-1}, false);
    hp_value loss = sum_all(g, hp_mul(g, m, w));
    autodiff_ok(g, loss);
    feeds f;
    feeds_make(&f, g, (const double *[]){(double[]){1, 3, 3, 2, 7, 7, 7, 0}, (double[]){2, 3}});
    hp_tensor out[2] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){0, 1, 1, 0, 1, 1, 1, 0}, 8, "grad x");
    outs_free(out, 2);
    feeds_free(&f);
    hp_graph_free(g);
}

Test(autodiff, embedding_padding_row_gets_no_gradient) {
    hp_graph *g = hp_graph_new();
    hp_value w = param(g, "w", T(F, 4, 2));
    hp_value idx = data(g, T(HP_I64, 5));
    hp_value in[2] = {w, idx};
    hp_attr pad = hp_attr_int(HP_ATTR_PADDING_IDX, 1);
    hp_value e = hp_build(g, HP_OP_EMBEDDING, in, 2, &pad, 1);
    hp_value loss = sum_all(g, e);
    autodiff_ok(g, loss);
    feeds f;
    feeds_make(&f, g, (const double *[]){NULL, (double[]){1, 0, 1, 3, 0}});
    hp_tensor out[2] = {0};
    run(g, &f, out);
    expect_values(&out[1], (double[]){2, 2, 0, 0, 0, 0, 1, 1}, 8, "grad w");
    outs_free(out, 2);
    feeds_free(&f);
    hp_graph_free(g);
}

/* ---- a transformer block: joint graph verifies and matches finite differences -------------- */

enum { B = 1, S = 4, D = 8, H = 2, HKV = 1, HD = 4, V = 6, FF = 6 };

/* tokens -> embedding -> rmsnorm -> q/k/v (mm) -> rotary -> causal GQA sdpa -> wo -> residual
 * -> rmsnorm -> SwiGLU -> residual -> rmsnorm -> output -> log_softmax -> nll (mean). */
static hp_graph *build_block(hp_value *loss_out) {
    hp_graph *g = hp_graph_new();
    hp_value emb = param(g, "tok_embeddings.weight", T(F, V, D));
    hp_value an = param(g, "layers.0.attention_norm.weight", T(F, D));
    hp_value wq = param(g, "layers.0.attention.wq.weight", T(F, H * HD, D));
    hp_value wk = param(g, "layers.0.attention.wk.weight", T(F, HKV * HD, D));
    hp_value wv = param(g, "layers.0.attention.wv.weight", T(F, HKV * HD, D));
    hp_value wo = param(g, "layers.0.attention.wo.weight", T(F, D, H * HD));
    hp_value fn = param(g, "layers.0.ffn_norm.weight", T(F, D));
    hp_value w1 = param(g, "layers.0.feed_forward.w1.weight", T(F, FF, D));
    hp_value w2 = param(g, "layers.0.feed_forward.w2.weight", T(F, D, FF));
    hp_value w3 = param(g, "layers.0.feed_forward.w3.weight", T(F, FF, D));
    hp_value nw = param(g, "norm.weight", T(F, D));
    hp_value ow = param(g, "output.weight", T(F, V, D));
    hp_value tok = data(g, T(HP_I64, B, S));
    hp_value lab = data(g, T(HP_I64, B * S));
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);

    hp_value x = hp_view(g, hp_bin(g, HP_OP_EMBEDDING, emb, tok), 2, (int64_t[]){B * S, D});
    hp_value h = hp_build(g, HP_OP_RMS_NORM, (hp_value[]){x, an}, 2, &eps, 1);
    hp_value q = hp_mm(g, h, hp_t(g, wq));
    hp_value k = hp_mm(g, h, hp_t(g, wk));
    hp_value v = hp_mm(g, h, hp_t(g, wv));
    hp_attr th = hp_attr_float(HP_ATTR_THETA, 500000);
    q = hp_un1(g, HP_OP_ROTARY_EMB, hp_view(g, q, 4, (int64_t[]){B, S, H, HD}), th);
    k = hp_un1(g, HP_OP_ROTARY_EMB, hp_view(g, k, 4, (int64_t[]){B, S, HKV, HD}), th);
    v = hp_view(g, v, 4, (int64_t[]){B, S, HKV, HD});
    int64_t perm[4] = {0, 2, 1, 3};
    hp_attr sa[2] = {hp_attr_float(HP_ATTR_SCALE, 0.5), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value qkv[3] = {hp_permute(g, q, 4, perm), hp_permute(g, k, 4, perm),
                       hp_permute(g, v, 4, perm)};
    hp_value o = hp_build(g, HP_OP_SDPA, qkv, 3, sa, 2);
    o = hp_view(g, hp_un(g, HP_OP_CLONE, hp_transpose(g, o, 1, 2)), 2, (int64_t[]){B * S, H * HD});
    x = hp_add(g, x, hp_mm(g, o, hp_t(g, wo)));
    h = hp_build(g, HP_OP_RMS_NORM, (hp_value[]){x, fn}, 2, &eps, 1);
    hp_value gate = hp_silu(g, hp_mm(g, h, hp_t(g, w1)));
    hp_value up = hp_mm(g, h, hp_t(g, w3));
    x = hp_add(g, x, hp_mm(g, hp_mul(g, gate, up), hp_t(g, w2)));
    h = hp_build(g, HP_OP_RMS_NORM, (hp_value[]){x, nw}, 2, &eps, 1);
    hp_value logits = hp_mm(g, h, hp_t(g, ow));
    hp_value lp = hp_un1(g, HP_OP_LOG_SOFTMAX, logits, hp_attr_int(HP_ATTR_DIM, -1));
    *loss_out = hp_build(g, HP_OP_NLL_LOSS_FORWARD, (hp_value[]){lp, lab}, 2, NULL, 0);
    cr_assert(!hp_graph_failed(g), "building the block failed: %s", g->err.msg);
    return g;
}

static void block_feeds(feeds *f, const hp_graph *g) {
    feeds_make(f, g, NULL);
    for (int i = 0; i < f->n - 2; i++) {
        int64_t n = hp_type_numel(&f->t[i].type);
        for (int64_t j = 0; j < n; j++) f->t[i].data[j] = 0.5 * sin(0.7 * (double)(j + 1) + i);
    }
    double tok[S] = {1, 5, 0, 3}, lab[S] = {5, 0, 3, 2};
    memcpy(f->t[f->n - 2].data, tok, sizeof tok);
    memcpy(f->t[f->n - 1].data, lab, sizeof lab);
}

Test(autodiff, transformer_block_matches_finite_differences) {
    hp_value loss;
    hp_graph *g = build_block(&loss);
    hp_graph *fwd = hp_graph_clone(g);
    cr_assert_eq(hp_graph_set_outputs(fwd, &loss, 1, NULL), HP_OK);
    autodiff_ok(g, loss);
    int n_params = hp_graph_count_inputs(g).n_params;
    cr_assert_eq(n_params, 12);
    cr_assert_eq(g->n_outputs, 13);
    hp_op want[] = {HP_OP_EMBEDDING_DENSE_BACKWARD, HP_OP_RMS_NORM_BACKWARD, HP_OP_SDPA_BACKWARD,
                    HP_OP_LOG_SOFTMAX_BACKWARD,     HP_OP_NLL_LOSS_BACKWARD, HP_OP_SILU_BACKWARD};
    for (unsigned i = 0; i < HP_ARRAY_LEN(want); i++)
        cr_expect_gt(count_op(g, want[i], 0), 0, "no %s in the joint graph",
                     hp_op_get(want[i])->name);
    cr_expect_eq(count_op(g, HP_OP_ROTARY_EMB, 0), 4, "rotary forward x2 and inverse x2");

    feeds f;
    block_feeds(&f, g);
    hp_tensor out[13] = {0};
    run(g, &f, out);
    const double h = 1e-6;
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    for (int p = 0; p < n_params; p++) {
        int64_t n = hp_type_numel(&f.t[p].type);
        for (int64_t j = 0; j < n; j++) {
            double x0 = f.t[p].data[j], fpm[2];
            for (int s = 0; s < 2; s++) {
                f.t[p].data[j] = x0 + (s ? -h : h);
                hp_tensor l = {0};
                cr_assert_eq(hp_eval(fwd, f.t, f.n, &o, &l, NULL), HP_OK);
                fpm[s] = l.data[0];
                hp_tensor_free(&l);
            }
            f.t[p].data[j] = x0;
            double fd = (fpm[0] - fpm[1]) / (2 * h), an = out[1 + p].data[j];
            cr_expect(fabs(fd - an) <= 1e-6 + 1e-6 * fmax(fabs(fd), fabs(an)),
                      "%s[%lld]: autodiff %.12g, finite differences %.12g",
                      hp_node_attr(&g->nodes[p], HP_ATTR_FQN)->s, (long long)j, an, fd);
        }
    }
    outs_free(out, 13);
    feeds_free(&f);
    hp_graph_free(fwd);
    hp_graph_free(g);
}

/* ---- fault injection ------------------------------------------------------------------------ */

/* 20 parameters (so that the outputs array must grow) summed into the loss, with a graph output
 * already set that a failed autodiff must leave in place. */
static hp_graph *build_wide(hp_value *loss_out) {
    hp_graph *g = hp_graph_new();
    hp_value p[20];
    char fqn[16];
    for (int i = 0; i < 20; i++) {
        snprintf(fqn, sizeof fqn, "p%d", i);
        p[i] = param(g, fqn, T(F, 2));
    }
    hp_value acc = p[0];
    for (int i = 1; i < 20; i++) acc = hp_mul(g, acc, hp_un(g, HP_OP_TANH, p[i]));
    *loss_out = sum_all(g, acc);
    cr_assert_eq(hp_graph_add_output(g, acc, NULL), HP_OK);
    cr_assert(!hp_graph_failed(g), "building failed: %s", g->err.msg);
    return g;
}

/* Fails allocation N of hp_autodiff for N = 0, 1, ... until it succeeds: every failure must be
 * HP_NOMEM and leave the graph as it was (ASan builds check that nothing leaks), and the final
 * joint graph must equal one built without faults. */
static void fault_loop(hp_graph *(*build)(hp_value *)) {
    hp_value loss;
    hp_graph *ref = build(&loss);
    autodiff_ok(ref, loss);
    hp_graph *g = build(&loss);
    hp_graph *before = hp_graph_clone(g);
    cr_assert(before);
    int failures = 0;
    for (long n = 0;; n++) {
        cr_assert_lt(n, 100000, "autodiff never succeeded");
        hp_err e = {0};
        hp_alloc_fail_at(n);
        hp_status st = hp_autodiff(g, loss, &e);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) break;
        failures++;
        cr_assert_eq(st, HP_NOMEM, "allocation %ld: status %s: %s", n, hp_status_str(st), e.msg);
        cr_assert(hp_graph_eq(g, before), "allocation %ld: the graph changed", n);
        cr_assert(!hp_graph_failed(g), "allocation %ld: sticky error left: %s", n, g->err.msg);
    }
    cr_expect_gt(failures, 0);
    cr_expect(hp_graph_eq(g, ref), "the joint graph differs from one built without faults");
    hp_graph_free(before);
    hp_graph_free(g);
    hp_graph_free(ref);
}

Test(autodiff, fault_injection_block) {
    fault_loop(build_block);
}

Test(autodiff, fault_injection_outputs_grow) {
    fault_loop(build_wide);
}
