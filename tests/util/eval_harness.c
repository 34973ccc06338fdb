/* tests/util/eval_harness.c — see eval_harness.h. */
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

void hp_th_init(hp_th *h) {
    memset(h, 0, sizeof *h);
    h->g = hp_graph_new();
    cr_assert(h->g, "hp_graph_new failed");
}

static void free_outputs(hp_th *h) {
    for (int i = 0; i < h->n_out; i++) hp_tensor_free(&h->out[i]);
    h->n_out = 0;
}

void hp_th_fini(hp_th *h) {
    free_outputs(h);
    for (int i = 0; i < h->n_in; i++) hp_tensor_free(&h->in[i]);
    hp_graph_free(h->g);
    h->g = NULL;
}

hp_value hp_th_input(hp_th *h, hp_type t, const double *data) {
    cr_assert_lt(h->n_in, HP_TH_MAX_IN, "too many harness inputs");
    hp_tensor *f = &h->in[h->n_in];
    hp_err e = {0};
    cr_assert_eq(hp_tensor_alloc(f, t, &e), HP_OK, "%s", e.msg);
    if (data) memcpy(f->data, data, (size_t)hp_type_numel(&t) * sizeof(double));
    h->n_in++;
    return hp_build_placeholder(h->g, HP_INPUT_DATA, NULL, t, NULL);
}

hp_status hp_th_run(hp_th *h, const hp_value *outs, int n, hp_eval_precision prec) {
    cr_assert_leq(n, HP_TH_MAX_OUT, "too many harness outputs");
    cr_assert(!hp_graph_failed(h->g), "building the graph failed: %s", h->g->err.msg);
    free_outputs(h);
    cr_assert_eq(hp_graph_set_outputs(h->g, outs, n, NULL), HP_OK);
    hp_eval_opts o = {.precision = prec};
    memset(&h->err, 0, sizeof h->err);
    hp_status st = hp_eval(h->g, h->in, h->n_in, &o, h->out, &h->err);
    h->n_out = n;
    return st;
}

void hp_th_run_ok(hp_th *h, const hp_value *outs, int n, hp_eval_precision prec) {
    hp_status st = hp_th_run(h, outs, n, prec);
    cr_assert_eq(st, HP_OK, "hp_eval failed: %s", h->err.msg);
}

void hp_th_expect_close(const double *got, const double *want, int64_t n, double tol,
                        const char *what) {
    for (int64_t i = 0; i < n; i++) {
        double scale = fabs(want[i]) > 1 ? fabs(want[i]) : 1;
        bool same_inf = isinf(want[i]) && got[i] == want[i];
        bool both_nan = isnan(want[i]) && isnan(got[i]);
        cr_assert(same_inf || both_nan || fabs(got[i] - want[i]) <= tol * scale,
                  "%s: element %lld is %.17g, expected %.17g (tol %g)", what, (long long)i, got[i],
                  want[i], tol);
    }
}

void hp_th_expect(const hp_tensor *t, const double *want, int64_t n, double tol) {
    cr_assert(t->data, "tensor has no data");
    cr_assert_eq(hp_type_numel(&t->type), n, "tensor has %lld elements, expected %lld",
                 (long long)hp_type_numel(&t->type), (long long)n);
    hp_th_expect_close(t->data, want, n, tol, "value");
}

void hp_th_rand(double *x, int64_t n, uint64_t seed, double lo, double hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15u + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; /* xorshift64 */
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = lo + (hi - lo) * (double)(s >> 11) / 9007199254740992.0;
    }
}

static double eval_scalar(const hp_graph *g, hp_tensor *inputs, int n_inputs) {
    hp_tensor out[HP_TH_MAX_OUT];
    cr_assert_leq(g->n_outputs, HP_TH_MAX_OUT);
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    hp_err e = {0};
    cr_assert_eq(hp_eval(g, inputs, n_inputs, &o, out, &e), HP_OK, "%s", e.msg);
    double v = out[0].data[0];
    for (int i = 0; i < g->n_outputs; i++) hp_tensor_free(&out[i]);
    return v;
}

void hp_th_numeric_grad(const hp_graph *g, hp_tensor *inputs, int n_inputs, int k, double h,
                        double *grad) {
    int64_t n = hp_type_numel(&inputs[k].type);
    for (int64_t i = 0; i < n; i++) {
        double x = inputs[k].data[i];
        inputs[k].data[i] = x + h;
        double up = eval_scalar(g, inputs, n_inputs);
        inputs[k].data[i] = x - h;
        double down = eval_scalar(g, inputs, n_inputs);
        inputs[k].data[i] = x;
        grad[i] = (up - down) / (2 * h);
    }
}
