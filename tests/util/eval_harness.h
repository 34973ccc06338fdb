/* tests/util/eval_harness.h — helpers for tests that run graphs on the reference evaluator:
 * a harness that declares data placeholders together with their feeds and runs hp_eval,
 * value comparison with tolerances, deterministic random fills, and a central-difference
 * gradient for finite-difference checks. Test code only: failures are Criterion assertions.
 */
#ifndef HP_TEST_EVAL_HARNESS_H
#define HP_TEST_EVAL_HARNESS_H

#include "hp/build.h"
#include "hp/eval.h"

#define HP_TH_MAX_IN  32
#define HP_TH_MAX_OUT 16

typedef struct hp_th {
    hp_graph *g;
    int n_in;
    hp_tensor in[HP_TH_MAX_IN]; /* feeds, one per placeholder */
    int n_out;
    hp_tensor out[HP_TH_MAX_OUT]; /* results of the last hp_th_run */
    hp_err err;                   /* error of the last hp_th_run */
} hp_th;

/* TY(HP_F32, 2, 3) is f32[2,3]; TY0(HP_F32) is the scalar f32[]. */
#define TY(dt, ...)                                                                                \
    hp_type_make((dt), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                  \
                 (int64_t[]){__VA_ARGS__})
#define TY0(dt) hp_type_make((dt), 0, NULL)

void hp_th_init(hp_th *h);
void hp_th_fini(hp_th *h);
/* Declares a data placeholder of type t fed with data (copied; NULL feeds zeros). Placeholders
 * must be declared before any other node. */
hp_value hp_th_input(hp_th *h, hp_type t, const double *data);
/* Sets the graph outputs to outs and evaluates; results in h->out, the error in h->err. Asserts
 * that building the graph did not fail. Frees the results of a previous run first. */
hp_status hp_th_run(hp_th *h, const hp_value *outs, int n, hp_eval_precision prec);
/* hp_th_run that must succeed (asserts, printing the error). */
void hp_th_run_ok(hp_th *h, const hp_value *outs, int n, hp_eval_precision prec);

/* Asserts t has n elements, each within tol of want (absolute, or relative above 1). */
void hp_th_expect(const hp_tensor *t, const double *want, int64_t n, double tol);
/* Asserts a and b (n elements each) agree within tol (absolute, or relative above 1). */
void hp_th_expect_close(const double *got, const double *want, int64_t n, double tol,
                        const char *what);

/* Fills x with values uniform in [lo, hi) from a fixed generator seeded by seed. */
void hp_th_rand(double *x, int64_t n, uint64_t seed, double lo, double hi);

/* Central-difference gradient of output 0 of g (a scalar) with respect to every element of
 * inputs[k], evaluated in F64 with step h. grad has numel(inputs[k]) entries. */
void hp_th_numeric_grad(const hp_graph *g, hp_tensor *inputs, int n_inputs, int k, double h,
                        double *grad);

#endif
