/* tests/graph/test_gradcheck.c — finite-difference gradient checks of every op with a gradient
 * rule, on the reference evaluator in f64.
 *
 * Each case builds  params (+ data) -> op -> loss = sum(op(x)[0] * r)  with r a random data
 * weighting, runs hp_autodiff, evaluates the joint graph and compares every parameter
 * gradient with central differences of the forward graph. A coverage test fails when an op of
 * the table has a gradient rule but no case here. Inputs stay away from kinks (relu at 0,
 * ties of maximum/amax); ties are checked against exact values in test_autodiff.c.
 */
#include "hp/build.h"
#include "hp/eval.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- cases ---------------------------------------------------------------------------------- */

#define T(dt, ...)                                                                                 \
    hp_type_make((dt), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                  \
                 (int64_t[]){__VA_ARGS__})
#define T0(dt) hp_type_make((dt), 0, NULL)
#define F      HP_F32

typedef enum {
    IN_UNIFORM, /* param, uniform in [lo, hi) */
    IN_AWAY,    /* param, |x| uniform in [lo, hi) with a random sign: away from 0 */
    IN_DATA,    /* data, uniform in [lo, hi) (floats not differentiated) */
    IN_INT,     /* data, integers uniform in [lo, hi) */
    IN_BOOL,    /* data, 0 or 1 */
    IN_FIXED,   /* data, the given values */
} in_kind;

typedef struct gc_in {
    hp_type t;
    in_kind kind;
    double lo, hi;
    const double *fixed;
} gc_in;

#define MAX_CASE_IN    4
#define MAX_CASE_ATTRS 6

typedef struct gc_case {
    char name[96];
    hp_op op;
    int n_in;
    gc_in in[MAX_CASE_IN];
    int n_attrs;
    hp_attr attrs[MAX_CASE_ATTRS];
} gc_case;

static gc_in P(hp_type t) {
    return (gc_in){t, IN_UNIFORM, -1, 1, NULL};
}
static gc_in Ppos(hp_type t) { /* for log, sqrt, rsqrt, div, fractional pow */
    return (gc_in){t, IN_UNIFORM, 0.5, 2, NULL};
}
static gc_in Paway(hp_type t) { /* for relu */
    return (gc_in){t, IN_AWAY, 0.1, 1, NULL};
}
static gc_in Dfloat(hp_type t) {
    return (gc_in){t, IN_DATA, -1, 1, NULL};
}
static gc_in Dint(hp_type t, int lo, int hi) {
    return (gc_in){t, IN_INT, lo, hi, NULL};
}
static gc_in Dbool(hp_type t) {
    return (gc_in){t, IN_BOOL, 0, 2, NULL};
}
static gc_in Dfixed(hp_type t, const double *v) {
    return (gc_in){t, IN_FIXED, 0, 0, v};
}

#define MAX_CASES 256
static gc_case cases[MAX_CASES];
static int n_cases;

static void add_case(const char *name, hp_op op, int n_in, const gc_in *in, int n_attrs,
                     const hp_attr *attrs) {
    cr_assert_lt(n_cases, MAX_CASES);
    gc_case *c = &cases[n_cases++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s: %s", hp_op_get(op)->name, name);
    c->op = op;
    c->n_in = n_in;
    memcpy(c->in, in, (size_t)n_in * sizeof *in);
    c->n_attrs = n_attrs;
    if (n_attrs) memcpy(c->attrs, attrs, (size_t)n_attrs * sizeof *attrs);
}

#define CASE(name, op, ins, ...)                                                                   \
    add_case(name, op, (int)(sizeof((gc_in[])ins) / sizeof(gc_in)), (gc_in[])ins,                  \
             (int)(sizeof((hp_attr[]){{0}, __VA_ARGS__}) / sizeof(hp_attr)) - 1,                   \
             (hp_attr[]){{0}, __VA_ARGS__} + 1)
#define IN(...)                                                                                    \
    { __VA_ARGS__ }

static hp_attr A_int(hp_attr_key k, int64_t v) {
    return hp_attr_int(k, v);
}
static hp_attr A_f(hp_attr_key k, double v) {
    return hp_attr_float(k, v);
}
#define A_ints(k, ...)                                                                             \
    hp_attr_ints(k, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                     \
                 (int64_t[]){__VA_ARGS__})
#define A_none(k) hp_attr_ints(k, 0, (int64_t[]){0})

static const double targets_ignore[] = {1, -100, 4, 0};
static const double targets_plain[] = {3, 0, 2, 2};
static const double emb_idx[] = {0, 2, 2, 5, 1, 0};

static void build_cases(void) {
    n_cases = 0;
    /* elementwise binary, incl. broadcasting */
    hp_op bin[] = {HP_OP_ADD, HP_OP_SUB, HP_OP_MUL, HP_OP_MAXIMUM};
    for (unsigned i = 0; i < HP_ARRAY_LEN(bin); i++) {
        CASE("same shape", bin[i], IN(P(T(F, 3, 4)), P(T(F, 3, 4))));
        CASE("broadcast [3,4] x [4]", bin[i], IN(P(T(F, 3, 4)), P(T(F, 4))));
        CASE("broadcast [2,1,4] x [3,1]", bin[i], IN(P(T(F, 2, 1, 4)), P(T(F, 3, 1))));
        CASE("broadcast [] x [2,3]", bin[i], IN(P(T0(F)), P(T(F, 2, 3))));
    }
    CASE("same shape", HP_OP_DIV, IN(P(T(F, 3, 4)), Ppos(T(F, 3, 4))));
    CASE("broadcast [2,1,4] / [3,1]", HP_OP_DIV, IN(P(T(F, 2, 1, 4)), Ppos(T(F, 3, 1))));
    CASE("broadcast [4] / [3,4]", HP_OP_DIV, IN(P(T(F, 4)), Ppos(T(F, 3, 4))));
    CASE("param x data", HP_OP_MUL, IN(P(T(F, 3, 4)), Dfloat(T(F, 3, 4))));
    CASE("data x param", HP_OP_SUB, IN(Dfloat(T(F, 4)), P(T(F, 2, 4))));
    CASE("same shape", HP_OP_WHERE, IN(Dbool(T(HP_BOOL, 3, 4)), P(T(F, 3, 4)), P(T(F, 3, 4))));
    CASE("broadcast", HP_OP_WHERE, IN(Dbool(T(HP_BOOL, 4)), P(T(F, 2, 4)), P(T0(F))));
    CASE("broadcast cond", HP_OP_WHERE, IN(Dbool(T(HP_BOOL, 3, 1)), P(T(F, 1, 4)), P(T(F, 3, 4))));

    /* scalar operand */
    CASE("", HP_OP_ADD_SCALAR, IN(P(T(F, 3, 4))), A_f(HP_ATTR_VALUE, 0.75));
    CASE("", HP_OP_MUL_SCALAR, IN(P(T(F, 3, 4))), A_f(HP_ATTR_VALUE, -1.5));
    CASE("scalar input", HP_OP_MUL_SCALAR, IN(P(T0(F))), A_f(HP_ATTR_VALUE, 3));
    double exps[] = {2, 3, 1, 0, 0.5, -1.5};
    for (unsigned i = 0; i < HP_ARRAY_LEN(exps); i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "exponent %g", exps[i]);
        CASE(nm, HP_OP_POW, IN(Ppos(T(F, 2, 3))), A_f(HP_ATTR_EXPONENT, exps[i]));
    }
    CASE("exponent 3, negative base", HP_OP_POW, IN(P(T(F, 2, 3))), A_f(HP_ATTR_EXPONENT, 3));

    /* unary math */
    hp_op un[] = {HP_OP_NEG, HP_OP_EXP, HP_OP_TANH, HP_OP_SIGMOID, HP_OP_SILU,
                  HP_OP_SIN, HP_OP_COS, HP_OP_ERF,  HP_OP_CLONE};
    for (unsigned i = 0; i < HP_ARRAY_LEN(un); i++) {
        CASE("[3,4]", un[i], IN(P(T(F, 3, 4))));
        CASE("scalar", un[i], IN(P(T0(F))));
    }
    hp_op pos[] = {HP_OP_LOG, HP_OP_SQRT, HP_OP_RSQRT};
    for (unsigned i = 0; i < HP_ARRAY_LEN(pos); i++) CASE("[3,4]", pos[i], IN(Ppos(T(F, 3, 4))));
    CASE("exact", HP_OP_GELU, IN(P(T(F, 3, 4))));
    CASE("exact, explicit", HP_OP_GELU, IN(P(T(F, 3, 4))), A_int(HP_ATTR_APPROXIMATE, 0));
    CASE("tanh", HP_OP_GELU, IN(P(T(F, 3, 4))), A_int(HP_ATTR_APPROXIMATE, 1));
    CASE("[3,4]", HP_OP_RELU, IN(Paway(T(F, 3, 4))));
    CASE("f32 -> bf16", HP_OP_TO_COPY, IN(P(T(F, 3, 4))), hp_attr_dtype(HP_ATTR_DTYPE, HP_BF16));
    CASE("bf16 -> f32", HP_OP_TO_COPY, IN(P(T(HP_BF16, 3, 4))),
         hp_attr_dtype(HP_ATTR_DTYPE, HP_F32));
    CASE("f32 -> f16", HP_OP_TO_COPY, IN(P(T(F, 2))), hp_attr_dtype(HP_ATTR_DTYPE, HP_F16));

    /* reductions */
    hp_op red[] = {HP_OP_SUM, HP_OP_MEAN, HP_OP_AMAX};
    for (unsigned i = 0; i < HP_ARRAY_LEN(red); i++) {
        CASE("dims [1]", red[i], IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_DIMS, 1));
        CASE("dims [-1] keepdim", red[i], IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_DIMS, -1),
             A_int(HP_ATTR_KEEPDIM, 1));
        CASE("dims [0, 2]", red[i], IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_DIMS, 0, 2));
        CASE("dims [2, -3] keepdim", red[i], IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_DIMS, 2, -3),
             A_int(HP_ATTR_KEEPDIM, 1));
        CASE("all dims", red[i], IN(P(T(F, 3, 4))), A_none(HP_ATTR_DIMS));
        CASE("all dims keepdim", red[i], IN(P(T(F, 3, 4))), A_none(HP_ATTR_DIMS),
             A_int(HP_ATTR_KEEPDIM, 1));
        CASE("scalar", red[i], IN(P(T0(F))), A_none(HP_ATTR_DIMS));
    }

    /* shape ops */
    CASE("[2,6] -> [3,4]", HP_OP_VIEW, IN(P(T(F, 2, 6))), A_ints(HP_ATTR_SHAPE, 3, 4));
    CASE("[2,3,4] -> [-1,4]", HP_OP_VIEW, IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_SHAPE, -1, 4));
    CASE("[1] -> []", HP_OP_VIEW, IN(P(T(F, 1))), A_none(HP_ATTR_SHAPE));
    CASE("[2,3,4] -> [4,6]", HP_OP_RESHAPE, IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_SHAPE, 4, 6));
    CASE("[6] -> [2,-1,1]", HP_OP_RESHAPE, IN(P(T(F, 6))), A_ints(HP_ATTR_SHAPE, 2, -1, 1));
    CASE("[2,0,1]", HP_OP_PERMUTE, IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_PERM, 2, 0, 1));
    CASE("[-1,0,-2]", HP_OP_PERMUTE, IN(P(T(F, 2, 3, 4))), A_ints(HP_ATTR_PERM, -1, 0, -2));
    CASE("(0,-1)", HP_OP_TRANSPOSE, IN(P(T(F, 2, 3, 4))), A_int(HP_ATTR_DIM0, 0),
         A_int(HP_ATTR_DIM1, -1));
    CASE("(1,1)", HP_OP_TRANSPOSE, IN(P(T(F, 2, 3))), A_int(HP_ATTR_DIM0, 1),
         A_int(HP_ATTR_DIM1, 1));
    CASE("[3,4]", HP_OP_T, IN(P(T(F, 3, 4))));
    CASE("[5]", HP_OP_T, IN(P(T(F, 5))));
    CASE("[3,1] -> [2,3,4]", HP_OP_EXPAND, IN(P(T(F, 3, 1))), A_ints(HP_ATTR_SHAPE, 2, 3, 4));
    CASE("[4] -> [3,-1]", HP_OP_EXPAND, IN(P(T(F, 4))), A_ints(HP_ATTR_SHAPE, 3, -1));
    CASE("[] -> [2,2]", HP_OP_EXPAND, IN(P(T0(F))), A_ints(HP_ATTR_SHAPE, 2, 2));
    CASE("[1,3] -> [2,3] (no new dims)", HP_OP_EXPAND, IN(P(T(F, 1, 3))),
         A_ints(HP_ATTR_SHAPE, 2, 3));
    CASE("dim 0 [1:4]", HP_OP_SLICE, IN(P(T(F, 5, 4))), A_int(HP_ATTR_DIM, 0),
         A_int(HP_ATTR_START, 1), A_int(HP_ATTR_END, 4));
    CASE("dim -1 [-3:100:2]", HP_OP_SLICE, IN(P(T(F, 3, 5))), A_int(HP_ATTR_DIM, -1),
         A_int(HP_ATTR_START, -3), A_int(HP_ATTR_END, 100), A_int(HP_ATTR_STEP, 2));
    CASE("empty", HP_OP_SLICE, IN(P(T(F, 3, 5))), A_int(HP_ATTR_DIM, 1), A_int(HP_ATTR_START, 2),
         A_int(HP_ATTR_END, 2));
    CASE("three inputs dim -1", HP_OP_CAT, IN(P(T(F, 2, 3)), P(T(F, 2, 1)), P(T(F, 2, 2))),
         A_int(HP_ATTR_DIM, -1));
    CASE("dim 0", HP_OP_CAT, IN(P(T(F, 1, 3)), P(T(F, 2, 3))), A_int(HP_ATTR_DIM, 0));
    CASE("param and data", HP_OP_CAT, IN(Dfloat(T(F, 2, 2)), P(T(F, 2, 3))), A_int(HP_ATTR_DIM, 1));
    CASE("one input", HP_OP_CAT, IN(P(T(F, 2, 3))), A_int(HP_ATTR_DIM, 1));
    CASE("dim 0", HP_OP_UNSQUEEZE, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, 0));
    CASE("dim -1", HP_OP_UNSQUEEZE, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, -1));
    CASE("dim 1", HP_OP_UNSQUEEZE, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, 1));
    CASE("of a scalar", HP_OP_UNSQUEEZE, IN(P(T0(F))), A_int(HP_ATTR_DIM, 0));
    CASE("dim 1", HP_OP_SQUEEZE, IN(P(T(F, 3, 1, 4))), A_int(HP_ATTR_DIM, 1));
    CASE("dim -1", HP_OP_SQUEEZE, IN(P(T(F, 3, 1))), A_int(HP_ATTR_DIM, -1));
    CASE("to a scalar", HP_OP_SQUEEZE, IN(P(T(F, 1))), A_int(HP_ATTR_DIM, 0));

    /* matrix products */
    CASE("[3,4] x [4,5]", HP_OP_MM, IN(P(T(F, 3, 4)), P(T(F, 4, 5))));
    CASE("data x param", HP_OP_MM, IN(Dfloat(T(F, 2, 3)), P(T(F, 3, 2))));
    CASE("[2,3,4] x [2,4,5]", HP_OP_BMM, IN(P(T(F, 2, 3, 4)), P(T(F, 2, 4, 5))));
    CASE("bias [5]", HP_OP_ADDMM, IN(P(T(F, 5)), P(T(F, 3, 4)), P(T(F, 4, 5))));
    CASE("bias [3,5] beta alpha", HP_OP_ADDMM, IN(P(T(F, 3, 5)), P(T(F, 3, 4)), P(T(F, 4, 5))),
         A_f(HP_ATTR_BETA, 0.5), A_f(HP_ATTR_ALPHA, 2));
    CASE("bias [3,1]", HP_OP_ADDMM, IN(P(T(F, 3, 1)), P(T(F, 3, 2)), P(T(F, 2, 4))),
         A_f(HP_ATTR_ALPHA, -0.5));
    CASE("bias []", HP_OP_ADDMM, IN(P(T0(F)), P(T(F, 2, 2)), P(T(F, 2, 3))), A_f(HP_ATTR_BETA, 3));

    /* embedding and the softmax family */
    CASE("repeated indices", HP_OP_EMBEDDING, IN(P(T(F, 6, 3)), Dfixed(T(HP_I64, 2, 3), emb_idx)));
    CASE("i32 indices", HP_OP_EMBEDDING, IN(P(T(F, 4, 2)), Dint(T(HP_I32, 5), 0, 4)));
    CASE("dim -1", HP_OP_LOG_SOFTMAX, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, -1));
    CASE("dim 0", HP_OP_LOG_SOFTMAX, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, 0));
    CASE("dim 1 of rank 3", HP_OP_LOG_SOFTMAX, IN(P(T(F, 2, 3, 4))), A_int(HP_ATTR_DIM, 1));
    CASE("dim -1", HP_OP_SOFTMAX, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, -1));
    CASE("dim 0", HP_OP_SOFTMAX, IN(P(T(F, 3, 4))), A_int(HP_ATTR_DIM, 0));
    CASE("dim 1 of rank 3", HP_OP_SOFTMAX, IN(P(T(F, 2, 3, 4))), A_int(HP_ATTR_DIM, 1));
    CASE("mean", HP_OP_NLL_LOSS_FORWARD, IN(P(T(F, 4, 5)), Dfixed(T(HP_I64, 4), targets_plain)));
    for (int red = 0; red <= 2; red++) {
        char nm[48];
        snprintf(nm, sizeof nm, "reduction %d, ignore_index", red);
        CASE(nm, HP_OP_NLL_LOSS_FORWARD, IN(P(T(F, 4, 5)), Dfixed(T(HP_I64, 4), targets_ignore)),
             A_int(HP_ATTR_REDUCTION, red));
    }
    CASE("custom ignore_index", HP_OP_NLL_LOSS_FORWARD,
         IN(P(T(F, 4, 5)), Dfixed(T(HP_I32, 4), targets_plain)), A_int(HP_ATTR_IGNORE_INDEX, 2));

    /* fused ops */
    CASE("[2,3,4]", HP_OP_RMS_NORM, IN(P(T(F, 2, 3, 4)), P(T(F, 4))), A_f(HP_ATTR_EPS, 1e-5));
    CASE("[5], large eps", HP_OP_RMS_NORM, IN(P(T(F, 5)), P(T(F, 5))), A_f(HP_ATTR_EPS, 0.5));
    CASE("x only", HP_OP_RMS_NORM, IN(P(T(F, 3, 4)), Dfloat(T(F, 4))), A_f(HP_ATTR_EPS, 1e-5));
    CASE("[2,3,4]", HP_OP_LAYER_NORM, IN(P(T(F, 2, 3, 4)), P(T(F, 4)), P(T(F, 4))),
         A_f(HP_ATTR_EPS, 1e-5));
    CASE("x only, large eps", HP_OP_LAYER_NORM, IN(P(T(F, 3, 5)), Dfloat(T(F, 5)), Dfloat(T(F, 5))),
         A_f(HP_ATTR_EPS, 0.5));
    CASE("[2,3,5], diagonal 1", HP_OP_TRIL, IN(P(T(F, 2, 3, 5))), A_int(HP_ATTR_DIAGONAL, 1));
    CASE("[4,4]", HP_OP_TRIL, IN(P(T(F, 4, 4))));
    /* the mask is fixed by (seed, step, fqn, index): a linear map the differences see */
    CASE("p 0.3", HP_OP_NATIVE_DROPOUT, IN(P(T(F, 3, 5))), A_f(HP_ATTR_P, 0.3),
         hp_attr_str(HP_ATTR_FQN, "drop"));
    CASE("p 0", HP_OP_NATIVE_DROPOUT, IN(P(T(F, 4))), A_f(HP_ATTR_P, 0),
         hp_attr_str(HP_ATTR_FQN, "drop"));
    CASE("forward", HP_OP_ROTARY_EMB, IN(P(T(F, 2, 3, 2, 4))), A_f(HP_ATTR_THETA, 10000));
    CASE("inverse", HP_OP_ROTARY_EMB, IN(P(T(F, 1, 4, 1, 6))), A_f(HP_ATTR_THETA, 500000),
         A_int(HP_ATTR_INVERSE, 1));
    CASE("causal GQA", HP_OP_SDPA,
         IN(P(T(F, 1, 4, 3, 2)), P(T(F, 1, 2, 3, 2)), P(T(F, 1, 2, 3, 2))), A_f(HP_ATTR_SCALE, 0.7),
         A_int(HP_ATTR_CAUSAL, 1));
    CASE("non-causal, S != T, Dv != D", HP_OP_SDPA,
         IN(P(T(F, 2, 2, 3, 4)), P(T(F, 2, 2, 5, 4)), P(T(F, 2, 2, 5, 3))),
         A_f(HP_ATTR_SCALE, 0.5));
    CASE("causal, only k and v", HP_OP_SDPA,
         IN(Dfloat(T(F, 1, 2, 4, 2)), P(T(F, 1, 1, 4, 2)), P(T(F, 1, 1, 4, 2))),
         A_f(HP_ATTR_SCALE, 1.0), A_int(HP_ATTR_CAUSAL, 1));
}

/* ---- the check ------------------------------------------------------------------------------ */

static uint64_t rng_state;
static double rnd(void) {
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void fill(hp_tensor *t, const gc_in *in) {
    int64_t n = hp_type_numel(&t->type);
    for (int64_t i = 0; i < n; i++) {
        double u = rnd();
        switch (in->kind) {
        case IN_UNIFORM:
        case IN_DATA:
            t->data[i] = in->lo + (in->hi - in->lo) * u;
            break;
        case IN_AWAY:
            t->data[i] = (in->lo + (in->hi - in->lo) * u) * (rnd() < 0.5 ? -1 : 1);
            break;
        case IN_INT:
            t->data[i] = floor(in->lo + (in->hi - in->lo) * u);
            break;
        case IN_BOOL:
            t->data[i] = u < 0.5 ? 0 : 1;
            break;
        case IN_FIXED:
            t->data[i] = in->fixed[i];
            break;
        }
    }
}

static bool is_param(const gc_in *in) {
    return in->kind == IN_UNIFORM || in->kind == IN_AWAY;
}

/* Declares the placeholders (params first, then data, as the convention wants) and returns,
 * in x[i], the value feeding op input i; ph[k] is the case input of placeholder k. */
static int declare(hp_graph *g, const gc_case *c, hp_value *x, int *ph) {
    int k = 0;
    char fqn[16];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n_in; i++) {
            if (is_param(&c->in[i]) != (pass == 0)) continue;
            snprintf(fqn, sizeof fqn, "p%d", i);
            x[i] = pass == 0 ? hp_build_placeholder(g, HP_INPUT_PARAM, fqn, c->in[i].t, NULL)
                             : hp_build_placeholder(g, HP_INPUT_DATA, NULL, c->in[i].t, NULL);
            ph[k++] = i;
        }
    }
    return k;
}

static double eval_scalar(const hp_graph *g, hp_tensor *in, int n_in) {
    hp_tensor out = {0};
    hp_err e = {0};
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    hp_status st = hp_eval(g, in, n_in, &o, &out, &e);
    cr_assert_eq(st, HP_OK, "forward eval failed: %s", e.msg);
    double v = out.data[0];
    hp_tensor_free(&out);
    return v;
}

#define FD_H    1e-6
#define FD_RTOL 1e-6
#define FD_ATOL 1e-6

/* Builds, differentiates and checks one case; returns the number of gradient elements
 * compared. */
static int check_case(const gc_case *c, uint64_t seed) {
    rng_state = seed;
    hp_value x[MAX_CASE_IN];
    int ph[MAX_CASE_IN + 1];

    /* probe: the op's output type, for the weighting placeholder */
    hp_graph *probe = hp_graph_new();
    cr_assert(probe);
    declare(probe, c, x, ph);
    hp_value y = hp_build(probe, c->op, x, c->n_in, c->attrs, c->n_attrs);
    cr_assert(!hp_graph_failed(probe), "%s: building the op failed: %s", c->name, probe->err.msg);
    hp_type yt = *hp_graph_type(probe, y);
    hp_graph_free(probe);

    hp_graph *g = hp_graph_new();
    int n_ph = declare(g, c, x, ph);
    hp_value r = hp_build_placeholder(g, HP_INPUT_DATA, NULL, yt, NULL);
    y = hp_build(g, c->op, x, c->n_in, c->attrs, c->n_attrs);
    hp_value loss = hp_sum(g, hp_mul(g, y, r), 0, (int64_t[]){0}, false);
    cr_assert(!hp_graph_failed(g), "%s: %s", c->name, g->err.msg);

    hp_graph *fwd = hp_graph_clone(g);
    cr_assert(fwd);
    cr_assert_eq(hp_graph_set_outputs(fwd, &loss, 1, NULL), HP_OK);

    hp_err e = {0};
    cr_assert_eq(hp_autodiff(g, loss, &e), HP_OK, "%s: autodiff failed: %s", c->name, e.msg);
    cr_assert_eq(hp_graph_verify(g, &e), HP_OK, "%s: joint graph does not verify: %s", c->name,
                 e.msg);
    int n_params = hp_graph_count_inputs(g).n_params;
    cr_assert_eq(g->n_outputs, 1 + n_params, "%s", c->name);

    /* feeds */
    hp_tensor in[MAX_CASE_IN + 1];
    memset(in, 0, sizeof in);
    for (int k = 0; k <= n_ph; k++) {
        hp_type t = k < n_ph ? c->in[ph[k]].t : yt;
        cr_assert_eq(hp_tensor_alloc(&in[k], t, &e), HP_OK, "%s", e.msg);
        gc_in weight = {yt, IN_DATA, -1, 1, NULL};
        fill(&in[k], k < n_ph ? &c->in[ph[k]] : &weight);
    }

    hp_tensor out[1 + MAX_CASE_IN];
    memset(out, 0, sizeof out);
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, in, n_ph + 1, &o, out, &e), HP_OK, "%s: joint eval failed: %s", c->name,
                 e.msg);
    double l0 = eval_scalar(fwd, in, n_ph + 1);
    cr_assert(fabs(out[0].data[0] - l0) <= 1e-12 * fmax(1, fabs(l0)),
              "%s: joint loss %.17g != forward loss %.17g", c->name, out[0].data[0], l0);

    int compared = 0;
    for (int p = 0; p < n_params; p++) {
        const hp_tensor *gt = &out[1 + p];
        cr_assert(hp_type_eq(&gt->type, &in[p].type), "%s: gradient %d has the wrong type", c->name,
                  p);
        int64_t n = hp_type_numel(&in[p].type);
        for (int64_t j = 0; j < n; j++) {
            double x0 = in[p].data[j];
            in[p].data[j] = x0 + FD_H;
            double fp = eval_scalar(fwd, in, n_ph + 1);
            in[p].data[j] = x0 - FD_H;
            double fm = eval_scalar(fwd, in, n_ph + 1);
            in[p].data[j] = x0;
            double fd = (fp - fm) / (2 * FD_H), an = gt->data[j];
            double tol = FD_ATOL + FD_RTOL * fmax(fabs(fd), fabs(an));
            cr_expect(fabs(fd - an) <= tol,
                      "%s: d loss / d %s[%lld] = %.12g by autodiff, %.12g by finite differences",
                      c->name, hp_node_attr(&g->nodes[p], HP_ATTR_FQN)->s, (long long)j, an, fd);
            compared++;
        }
    }
    for (int k = 0; k < g->n_outputs; k++) hp_tensor_free(&out[k]);
    for (int k = 0; k <= n_ph; k++) hp_tensor_free(&in[k]);
    hp_graph_free(fwd);
    hp_graph_free(g);
    return compared;
}

/* The cases split into one test per family, so a failure names the family. */
static const hp_op fam_elementwise[] = {
    HP_OP_ADD,        HP_OP_SUB,        HP_OP_MUL,  HP_OP_DIV,     HP_OP_MAXIMUM, HP_OP_WHERE,
    HP_OP_ADD_SCALAR, HP_OP_MUL_SCALAR, HP_OP_POW,  HP_OP_NEG,     HP_OP_EXP,     HP_OP_LOG,
    HP_OP_SQRT,       HP_OP_RSQRT,      HP_OP_TANH, HP_OP_SIGMOID, HP_OP_SILU,    HP_OP_GELU,
    HP_OP_RELU,       HP_OP_SIN,        HP_OP_COS,  HP_OP_ERF,     HP_OP_TO_COPY, HP_OP_CLONE};
static const hp_op fam_reductions[] = {HP_OP_SUM, HP_OP_MEAN, HP_OP_AMAX};
static const hp_op fam_shapes[] = {HP_OP_VIEW,      HP_OP_RESHAPE, HP_OP_PERMUTE, HP_OP_TRANSPOSE,
                                   HP_OP_T,         HP_OP_EXPAND,  HP_OP_SLICE,   HP_OP_CAT,
                                   HP_OP_UNSQUEEZE, HP_OP_SQUEEZE, HP_OP_TRIL};
static const hp_op fam_matmul[] = {HP_OP_MM, HP_OP_BMM, HP_OP_ADDMM};
static const hp_op fam_nn[] = {
    HP_OP_EMBEDDING,  HP_OP_LOG_SOFTMAX, HP_OP_SOFTMAX,    HP_OP_NLL_LOSS_FORWARD, HP_OP_RMS_NORM,
    HP_OP_ROTARY_EMB, HP_OP_SDPA,        HP_OP_LAYER_NORM, HP_OP_NATIVE_DROPOUT};
#define FAMILY(f) f, (int)HP_ARRAY_LEN(f)

static bool in_family(hp_op op, const hp_op *ops, int n) {
    for (int i = 0; i < n; i++)
        if (ops[i] == op) return true;
    return false;
}

/* Runs every case whose op is in ops. */
static void run_family(const hp_op *ops, int n) {
    build_cases();
    int ran = 0;
    for (int i = 0; i < n_cases; i++) {
        if (!in_family(cases[i].op, ops, n)) continue;
        cr_expect_gt(check_case(&cases[i], 1000 + (uint64_t)i), 0, "%s: nothing compared",
                     cases[i].name);
        ran++;
    }
    cr_assert_gt(ran, 0);
}

Test(gradcheck, every_differentiable_op_has_a_case) {
    build_cases();
    for (int op = 0; op < HP_OP_COUNT; op++) {
        const hp_op_info *info = hp_op_get((hp_op)op);
        bool found = false;
        for (int i = 0; i < n_cases && !found; i++) found = cases[i].op == (hp_op)op;
        if (info->grad)
            cr_expect(found, "op %s has a gradient rule but no gradient check case", info->name);
        else
            cr_expect(!found, "op %s has no gradient rule but a gradient check case", info->name);
    }
}

/* Every case runs in exactly one family test. */
Test(gradcheck, every_case_is_in_one_family) {
    build_cases();
    for (int i = 0; i < n_cases; i++) {
        hp_op op = cases[i].op;
        int n = in_family(op, FAMILY(fam_elementwise)) + in_family(op, FAMILY(fam_reductions)) +
                in_family(op, FAMILY(fam_shapes)) + in_family(op, FAMILY(fam_matmul)) +
                in_family(op, FAMILY(fam_nn));
        cr_expect_eq(n, 1, "case %s is in %d families", cases[i].name, n);
    }
}

Test(gradcheck, elementwise) {
    run_family(FAMILY(fam_elementwise));
}
Test(gradcheck, reductions) {
    run_family(FAMILY(fam_reductions));
}
Test(gradcheck, shapes) {
    run_family(FAMILY(fam_shapes));
}
Test(gradcheck, matmul) {
    run_family(FAMILY(fam_matmul));
}
Test(gradcheck, nn) {
    run_family(FAMILY(fam_nn));
}
