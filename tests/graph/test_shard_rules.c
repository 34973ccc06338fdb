/* tests/graph/test_shard_rules.c — every sharding rule of every op, checked the way the
 * HyperParallel and AutoParallel tests check theirs: on the reference evaluator in f64, split
 * each full input into simulated ranks' local pieces as the rule's input placements say
 * (Shard: even chunks; Partial: random terms that sum / average / max to the value), run the
 * op on each rank's pieces with its localized attributes, redistribute the outputs to
 * Replicate as the rule's output placements say, and compare with the op on full tensors
 * (1e-12). On 1-D meshes of 2 and 3 ranks and on 2-D meshes (2, 2) and (2, 3), where each mesh
 * dim's rules are asked about the piece the dims before it left (DTensor's order).
 * An op with no case here, or whose cases give no rule while it is not declared
 * replicate-only, fails.
 */
#include "hp/build.h"
#include "hp/eval.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 6
#define MAX_IN    6

/* ---- cases: one node with global input types ------------------------------------------------ */

enum { V_FLOAT = 0, V_POS, V_INDEX, V_BOOL };

typedef struct in_spec {
    hp_type t;
    int kind;   /* V_* */
    int64_t hi; /* V_INDEX: values in [0, hi) */
} in_spec;

typedef struct op_case {
    hp_op op;
    int n_in;
    in_spec in[MAX_IN];
    int n_attrs;
    hp_attr attrs[4];
} op_case;

#define F(...)                                                                                     \
    { TY(HP_F32, __VA_ARGS__), V_FLOAT, 0 }
#define POS(...)                                                                                   \
    { TY(HP_F32, __VA_ARGS__), V_POS, 0 }
#define IDX(hi, ...)                                                                               \
    { TY(HP_I64, __VA_ARGS__), V_INDEX, hi }
#define BOOLS(...)                                                                                 \
    { TY(HP_BOOL, __VA_ARGS__), V_BOOL, 0 }
#define F0                                                                                         \
    { TY0(HP_F32), V_FLOAT, 0 }
#define POS0                                                                                       \
    { TY0(HP_F32), V_POS, 0 }
#define AI(k, v)      hp_attr_int(HP_ATTR_##k, v)
#define AF(k, v)      hp_attr_float(HP_ATTR_##k, v)
#define AS(k, n, ...) hp_attr_ints(HP_ATTR_##k, n, (int64_t[]){__VA_ARGS__})

static op_case *cases_new(int *n) {
    static op_case c[128];
    int k = 0;
#define CASE(o, ni, ins, na, ...)                                                                  \
    c[k++] = (op_case) {                                                                           \
        .op = HP_OP_##o, .n_in = ni, .in = ins, .n_attrs = na, .attrs = { __VA_ARGS__ }            \
    }
#define IN(...)                                                                                    \
    { __VA_ARGS__ }
    CASE(FULL, 0, IN(), 2, AS(SHAPE, 2, 12, 6), AF(VALUE, 1.5));
    CASE(ZEROS, 0, IN(), 1, AS(SHAPE, 2, 6, 12));
    CASE(ONES, 0, IN(), 1, AS(SHAPE, 3, 4, 6, 12));
    static const hp_op binary[] = {HP_OP_ADD, HP_OP_SUB, HP_OP_MUL, HP_OP_DIV, HP_OP_MAXIMUM};
    for (size_t i = 0; i < HP_ARRAY_LEN(binary); i++) {
        c[k++] = (op_case){.op = binary[i], .n_in = 2, .in = IN(F(12, 6), POS(12, 6))};
        c[k++] = (op_case){.op = binary[i], .n_in = 2, .in = IN(F(4, 12, 6), POS(6))};
        c[k++] = (op_case){.op = binary[i], .n_in = 2, .in = IN(POS(12, 1), F(12, 6))};
    }
    CASE(EQ, 2, IN(IDX(3, 12, 6), IDX(3, 6)), 0);
    CASE(LT, 2, IN(F(12, 6), F(12, 6)), 0);
    CASE(WHERE, 3, IN(BOOLS(12, 6), F(12, 6), F(6)), 0);
    CASE(ADD_SCALAR, 1, IN(F(12, 6)), 1, AF(VALUE, 0.5));
    CASE(MUL_SCALAR, 1, IN(F(12, 6)), 1, AF(VALUE, -2.5));
    CASE(POW, 1, IN(POS(12, 6)), 1, AF(EXPONENT, 1.5));
    static const hp_op unary[] = {HP_OP_NEG,  HP_OP_EXP,     HP_OP_LOG,  HP_OP_SQRT,  HP_OP_RSQRT,
                                  HP_OP_TANH, HP_OP_SIGMOID, HP_OP_SILU, HP_OP_GELU,  HP_OP_RELU,
                                  HP_OP_SIN,  HP_OP_COS,     HP_OP_ERF,  HP_OP_CLONE, HP_OP_DETACH};
    for (size_t i = 0; i < HP_ARRAY_LEN(unary); i++)
        c[k++] = (op_case){.op = unary[i], .n_in = 1, .in = IN(POS(12, 6))};
    CASE(GELU, 1, IN(F(6, 12)), 1, AI(APPROXIMATE, 1));
    CASE(TO_COPY, 1, IN(F(12, 6)), 1, hp_attr_dtype(HP_ATTR_DTYPE, HP_F32));
    CASE(TO_COPY, 1, IN(F(12, 6)), 1, hp_attr_dtype(HP_ATTR_DTYPE, HP_I64));
    static const hp_op pair[] = {HP_OP_TANH_BACKWARD, HP_OP_SIGMOID_BACKWARD, HP_OP_SILU_BACKWARD,
                                 HP_OP_GELU_BACKWARD};
    for (size_t i = 0; i < HP_ARRAY_LEN(pair); i++)
        c[k++] = (op_case){.op = pair[i], .n_in = 2, .in = IN(F(12, 6), F(12, 6))};
    CASE(THRESHOLD_BACKWARD, 2, IN(F(12, 6), F(12, 6)), 1, AF(VALUE, 0));
    static const hp_op red[] = {HP_OP_SUM, HP_OP_MEAN, HP_OP_AMAX};
    for (size_t i = 0; i < HP_ARRAY_LEN(red); i++) {
        c[k++] = (op_case){.op = red[i],
                           .n_in = 1,
                           .in = IN(F(12, 6, 6)),
                           .n_attrs = 1,
                           .attrs = {AS(DIMS, 1, 1)}};
        c[k++] = (op_case){.op = red[i],
                           .n_in = 1,
                           .in = IN(F(12, 6, 6)),
                           .n_attrs = 2,
                           .attrs = {AS(DIMS, 2, 0, 2), AI(KEEPDIM, 1)}};
        c[k++] = (op_case){
            .op = red[i], .n_in = 1, .in = IN(F(12, 6)), .n_attrs = 1, .attrs = {AS(DIMS, 0)}};
    }
    CASE(VIEW, 1, IN(F(4, 6, 12)), 1, AS(SHAPE, 2, 24, 12));     /* merge */
    CASE(VIEW, 1, IN(F(24, 12)), 1, AS(SHAPE, 3, 6, 4, 12));     /* split */
    CASE(RESHAPE, 1, IN(F(6, 12)), 1, AS(SHAPE, 4, 6, 1, 3, 4)); /* split the last */
    CASE(RESHAPE, 1, IN(F(6, 4, 6)), 1, AS(SHAPE, 2, 6, -1));
    CASE(PERMUTE, 1, IN(F(6, 4, 12)), 1, AS(PERM, 3, 2, 0, 1));
    CASE(TRANSPOSE, 1, IN(F(6, 4, 12)), 2, AI(DIM0, 0), AI(DIM1, 2));
    CASE(T, 1, IN(F(12, 6)), 0);
    CASE(EXPAND, 1, IN(F(12, 1)), 1, AS(SHAPE, 2, 12, 6));
    CASE(EXPAND, 1, IN(F(6)), 1, AS(SHAPE, 3, 4, 12, 6));
    CASE(SLICE, 1, IN(F(12, 7)), 3, AI(DIM, 1), AI(START, 1), AI(END, 6));
    CASE(SLICE_BACKWARD, 1, IN(F(12, 5)), 4, AS(SHAPE, 2, 12, 7), AI(DIM, 1), AI(START, 1),
         AI(END, 6));
    CASE(CAT, 3, IN(F(12, 2), F(12, 3), F(12, 1)), 1, AI(DIM, 1));
    CASE(UNSQUEEZE, 1, IN(F(12, 6)), 1, AI(DIM, 1));
    CASE(SQUEEZE, 1, IN(F(12, 1, 6)), 1, AI(DIM, 1));
    CASE(MM, 2, IN(F(12, 6), F(6, 12)), 0);
    CASE(BMM, 2, IN(F(6, 4, 12), F(6, 12, 6)), 0);
    CASE(ADDMM, 3, IN(F(6), F(12, 6), F(6, 6)), 2, AF(ALPHA, 0.5), AF(BETA, 2));
    CASE(ADDMM, 3, IN(F(12, 6), F(12, 12), F(12, 6)), 0);
    CASE(EMBEDDING, 2, IN(F(10, 12), IDX(10, 6, 4)), 0);
    CASE(EMBEDDING_DENSE_BACKWARD, 2, IN(F(6, 4, 12), IDX(10, 6, 4)), 1, AI(NUM_WEIGHTS, 10));
    /* 12 rows in 6 chunks of 2, at arbitrary starts (overlapping, or holding no index) */
    CASE(CHUNKED_EMBEDDING, 3, IN(F(12, 12), IDX(12, 6, 4), IDX(12, 6)), 0);
    CASE(CHUNKED_EMBEDDING_BACKWARD, 3, IN(F(6, 4, 12), IDX(12, 6, 4), IDX(12, 6)), 1,
         AI(NUM_WEIGHTS, 12));
    CASE(LOG_SOFTMAX, 1, IN(F(12, 6)), 1, AI(DIM, 1));
    CASE(SOFTMAX, 1, IN(F(6, 12, 4)), 1, AI(DIM, 1));
    CASE(LOG_SOFTMAX_BACKWARD, 2, IN(F(12, 6), F(12, 6)), 1, AI(DIM, 1));
    CASE(SOFTMAX_BACKWARD, 2, IN(F(12, 6), POS(12, 6)), 1, AI(DIM, -1));
    CASE(NLL_LOSS_FORWARD, 2, IN(F(12, 5), IDX(5, 12)), 0);
    CASE(NLL_LOSS_FORWARD, 2, IN(F(12, 5), IDX(5, 12)), 1, AI(REDUCTION, HP_NLL_SUM));
    CASE(NLL_LOSS_FORWARD, 2, IN(F(12, 5), IDX(5, 12)), 1, AI(REDUCTION, HP_NLL_NONE));
    CASE(NLL_LOSS_BACKWARD, 4, IN(F0, F(12, 5), IDX(5, 12), POS0), 0);
    CASE(NLL_LOSS_BACKWARD, 4, IN(F(12), F(12, 5), IDX(5, 12), POS0), 1,
         AI(REDUCTION, HP_NLL_NONE));
    CASE(FUSED_CROSS_ENTROPY, 2, IN(F(12, 5), IDX(5, 12)), 0);
    CASE(FUSED_CROSS_ENTROPY, 2, IN(F(12, 5), IDX(5, 12)), 1, AI(REDUCTION, HP_NLL_SUM));
    CASE(FUSED_CROSS_ENTROPY_BACKWARD, 5, IN(F0, F(12, 5), IDX(5, 12), F(12), POS0), 0);
    CASE(SWIGLU, 2, IN(F(6, 12), F(6, 12)), 0);
    CASE(SWIGLU_BACKWARD, 3, IN(F(6, 12), F(6, 12), F(6, 12)), 0);
    CASE(FUSED_CROSS_ENTROPY_BACKWARD, 5, IN(F0, F(12, 5), IDX(5, 12), F(12), POS0), 1,
         AI(REDUCTION, HP_NLL_SUM));
    CASE(RMS_NORM, 2, IN(F(6, 4, 5), POS(5)), 1, AF(EPS, 1e-5));
    CASE(RMS_NORM_BACKWARD, 4, IN(F(6, 4, 5), F(6, 4, 5), POS(5), POS(6, 4)), 0);
    CASE(ROTARY_EMB, 1, IN(F(6, 4, 6, 4)), 1, AF(THETA, 10000));
    CASE(SDPA, 3, IN(F(6, 12, 4, 4), F(6, 6, 4, 4), F(6, 6, 4, 4)), 2, AF(SCALE, 0.5),
         AI(CAUSAL, 1));
    CASE(SDPA, 3, IN(F(2, 6, 6, 4), F(2, 6, 5, 4), F(2, 6, 5, 4)), 1, AF(SCALE, 0.5));
    CASE(SDPA_BACKWARD, 6,
         IN(F(6, 12, 4, 4), F(6, 12, 4, 4), F(6, 6, 4, 4), F(6, 6, 4, 4), F(6, 12, 4, 4),
            F(6, 12, 4)),
         2, AF(SCALE, 0.5), AI(CAUSAL, 1));
    CASE(LAYER_NORM, 3, IN(F(6, 4, 5), POS(5), F(5)), 1, AF(EPS, 1e-5));
    CASE(LAYER_NORM_BACKWARD, 5, IN(F(6, 4, 5), F(6, 4, 5), F(6, 4, 1), POS(6, 4, 1), POS(5)), 0);
    CASE(TRIL, 1, IN(F(6, 4, 5)), 1, AI(DIAGONAL, 1));
    CASE(TRIL, 1, IN(BOOLS(12, 6, 6)), 0);
    CASE(BITWISE_NOT, 1, IN(BOOLS(12, 6)), 0);
    CASE(ARANGE, 0, IN(), 3, AI(START, 1), AI(END, 13), AI(STEP, 1));
    CASE(NATIVE_DROPOUT, 1, IN(F(6, 4, 6)), 2, AF(P, 0.4), hp_attr_str(HP_ATTR_FQN, "drop"));
    CASE(NATIVE_DROPOUT_BACKWARD, 2, IN(F(6, 4, 6), BOOLS(6, 4, 6)), 1, AF(SCALE, 1.0 / 0.6));
#undef CASE
#undef IN
    *n = k;
    return c;
}

/* ---- tensors -------------------------------------------------------------------------------- */

static void strides(const hp_type *t, int64_t *st) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->shape[d];
    }
}

static hp_tensor tensor(hp_type t) {
    hp_tensor x = {0};
    hp_err e = {0};
    cr_assert_eq(hp_tensor_alloc(&x, t, &e), HP_OK, "%s", e.msg);
    return x;
}

/* piece <-> chunk r of n of full along dim d (copy in either direction). */
static void chunk_copy(hp_tensor *full, hp_tensor *piece, int d, int r, bool to_piece) {
    int64_t fst[HP_MAX_RANK], pst[HP_MAX_RANK], n = hp_type_numel(&piece->type);
    strides(&full->type, fst);
    strides(&piece->type, pst);
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, at = 0;
        for (int k = 0; k < piece->type.rank; k++) {
            int64_t i = rem / pst[k];
            rem %= pst[k];
            if (k == d) i += r * piece->type.shape[d];
            at += i * fst[k];
        }
        if (to_piece)
            piece->data[e] = full->data[at];
        else
            full->data[at] = piece->data[e];
    }
}

static uint64_t rng_state = 42;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static bool is_float(const hp_tensor *t) {
    return hp_dtype_is_float(t->type.dtype);
}

/* The n local pieces of x under placement p (Shard: chunks; Partial: random terms). */
static void split(const hp_tensor *x, hp_placement p, int n, hp_tensor *pieces) {
    hp_type t = x->type;
    if (p.kind == HP_PLACE_SHARD) t.shape[p.dim] /= n;
    int64_t numel = hp_type_numel(&t);
    for (int r = 0; r < n; r++) pieces[r] = tensor(t);
    if (p.kind == HP_PLACE_REPLICATE) {
        for (int r = 0; r < n; r++) memcpy(pieces[r].data, x->data, sizeof(double) * numel);
    } else if (p.kind == HP_PLACE_SHARD) {
        for (int r = 0; r < n; r++) chunk_copy((hp_tensor *)x, &pieces[r], p.dim, r, true);
    } else {
        cr_assert(is_float(x), "Partial of a %s input", hp_dtype_name(x->type.dtype));
        for (int64_t e = 0; e < numel; e++) {
            double v = x->data[e], acc = 0;
            if (p.reduce == HP_REDUCE_MAX) {
                int owner = (int)(e % n);
                for (int r = 0; r < n; r++) pieces[r].data[e] = r == owner ? v : v - urand();
                continue;
            }
            double total = p.reduce == HP_REDUCE_AVG ? v * n : v;
            for (int r = 0; r < n - 1; r++) acc += pieces[r].data[e] = 2 * urand() - 1;
            pieces[n - 1].data[e] = total - acc;
        }
    }
}

/* The value the n pieces hold under placement p (Replicate: all must agree). */
static hp_tensor combine(hp_tensor *pieces, hp_placement p, int n, const char *what) {
    hp_type t = pieces[0].type;
    if (p.kind == HP_PLACE_SHARD) {
        cr_assert(p.dim < t.rank, "%s: S(%d) of a rank-%d output", what, p.dim, t.rank);
        t.shape[p.dim] *= n;
    }
    hp_tensor x = tensor(t);
    int64_t numel = hp_type_numel(&pieces[0].type);
    if (p.kind == HP_PLACE_SHARD) {
        for (int r = 0; r < n; r++) chunk_copy(&x, &pieces[r], p.dim, r, false);
        return x;
    }
    for (int64_t e = 0; e < numel; e++) {
        double v = pieces[0].data[e];
        for (int r = 1; r < n; r++) {
            double w = pieces[r].data[e];
            if (p.kind == HP_PLACE_REPLICATE)
                cr_assert(fabs(w - v) <= 1e-12 * (1 + fabs(v)),
                          "%s: Replicate output differs between ranks 0 and %d at %lld: %.17g vs "
                          "%.17g",
                          what, r, (long long)e, v, w);
            else if (p.reduce == HP_REDUCE_MAX)
                v = w > v ? w : v;
            else
                v += w;
        }
        x.data[e] = p.kind == HP_PLACE_PARTIAL && p.reduce == HP_REDUCE_AVG ? v / n : v;
    }
    return x;
}

/* ---- running one node ----------------------------------------------------------------------- */

/* Where a simulated rank's piece of output 0 sits in the whole tensor (dropout draws there). */
typedef struct piece_box {
    int64_t off[HP_MAX_RANK], global[HP_MAX_RANK];
    int rank;
} piece_box;

static hp_status box_site(void *ctx, const hp_node *n, int64_t *off, int64_t *global, hp_err *err) {
    (void)n, (void)err;
    const piece_box *b = ctx;
    for (int d = 0; d < b->rank; d++) off[d] = b->off[d], global[d] = b->global[d];
    return HP_OK;
}

/* The box of output 0 on the rank at coord[ndim] of a mesh sizes[ndim] with placements pl. */
static piece_box box_of(const hp_type *gout, const hp_placement *pl, const int64_t *sizes,
                        const int64_t *coord, int ndim) {
    piece_box b = {.rank = gout->rank};
    int64_t len[HP_MAX_RANK];
    hp_err e = {0};
    cr_assert_eq(hp_local_box(gout, pl, sizes, coord, ndim, b.off, len, &e), HP_OK, "%s", e.msg);
    for (int d = 0; d < gout->rank; d++) b.global[d] = gout->shape[d];
    return b;
}

/* Runs c's op on inputs of the given types (localizing the size attributes to out_local when
 * given). Checks the shape rule infers out_local. outs[] receive the results. box: where the
 * piece sits in the whole output (NULL: it is the whole). */
static void run_node_at(const op_case *c, hp_tensor *ins, const hp_type *out_local, hp_tensor *outs,
                        int *n_out, const char *what, const piece_box *box) {
    hp_graph *g = hp_graph_new();
    cr_assert(g);
    hp_value v[MAX_IN];
    for (int i = 0; i < c->n_in; i++)
        v[i] = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ins[i].type, NULL);
    hp_attr attrs[4];
    memcpy(attrs, c->attrs, sizeof attrs);
    if (out_local) {
        hp_node n = {.op = c->op, .n_attrs = c->n_attrs, .attrs = (hp_attr *)c->attrs};
        hp_localize_attrs(&n, out_local, attrs);
    }
    hp_value y = hp_build(g, c->op, v, c->n_in, attrs, c->n_attrs);
    cr_assert(!hp_graph_failed(g), "%s: %s", what, g->err.msg);
    const hp_node *node = &g->nodes[y.node];
    *n_out = node->n_out;
    for (int k = 0; k < node->n_out; k++) {
        if (out_local) {
            char a[64], b[64];
            cr_assert(hp_type_eq(&node->out[k], &out_local[k]),
                      "%s: output %d is %s on a rank, the placements say %s", what, k,
                      hp_type_str(&node->out[k], a, sizeof a),
                      hp_type_str(&out_local[k], b, sizeof b));
        }
        hp_err e = {0};
        cr_assert_eq(hp_graph_add_output(g, hp_out(y, k), &e), HP_OK, "%s", e.msg);
    }
    hp_err e = {0};
    hp_eval_opts o = {.precision = HP_EVAL_F64,
                      .seed = 7,
                      .step = 3,
                      .dropout_site = box ? box_site : NULL,
                      .dropout_ctx = (void *)box};
    cr_assert_eq(hp_eval(g, ins, c->n_in, &o, outs, &e), HP_OK, "%s: %s", what, e.msg);
    hp_graph_free(g);
}

static void run_node(const op_case *c, hp_tensor *ins, const hp_type *out_local, hp_tensor *outs,
                     int *n_out, const char *what) {
    run_node_at(c, ins, out_local, outs, n_out, what, NULL);
}

static void fill(hp_tensor *x, const in_spec *s) {
    int64_t n = hp_type_numel(&x->type);
    for (int64_t e = 0; e < n; e++) {
        double u = urand();
        x->data[e] = s->kind == V_FLOAT  ? 2 * u - 1
                     : s->kind == V_POS  ? 0.5 + 1.5 * u
                     : s->kind == V_BOOL ? (u < 0.5)
                                         : (double)(int64_t)(u * (double)s->hi);
    }
}

static void rule_str(const op_case *c, int n_out, const hp_shard_rule *r, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "%s(", hp_op_get(c->op)->name);
    for (int i = 0; i < c->n_in && at < len; i++) {
        char p[24];
        hp_placement pl = r->in[i < HP_SHARD_MAX_IN ? i : 0];
        if (hp_op_get(c->op)->n_in == HP_VARIADIC) pl = r->in[0];
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "",
                               hp_placement_short(&pl, p, sizeof p));
    }
    for (int k = 0; k < n_out && at < len; k++) {
        char p[24];
        at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? ", " : ") -> ",
                               hp_placement_short(&r->out[k], p, sizeof p));
    }
}

static hp_placement in_pl(const op_case *c, const hp_shard_rule *r, int i) {
    if (hp_op_get(c->op)->n_in == HP_VARIADIC || i >= HP_SHARD_MAX_IN) return r->in[0];
    return r->in[i];
}

/* The rules of c's op on a mesh dim of size n for inputs of types in (outputs out). */
static int rules_of(const op_case *c, const hp_type *in, const hp_type *out, int n,
                    hp_shard_rule *rules) {
    hp_node node = {.op = c->op,
                    .n_in = c->n_in,
                    .n_out = hp_op_get(c->op)->n_out,
                    .n_attrs = c->n_attrs,
                    .attrs = (hp_attr *)c->attrs};
    hp_shard_query q = {.node = &node, .in = in, .out = out, .mesh_size = n, .mesh_dim = "x"};
    int k = hp_op_get(c->op)->shard(&q, rules, HP_SHARD_MAX_RULES);
    cr_assert(k <= HP_SHARD_MAX_RULES, "%s: %d rules", hp_op_get(c->op)->name, k);
    return k;
}

/* The local types after one mesh dim of n with rule r. */
static void local_types(const op_case *c, const hp_shard_rule *r, int n, const hp_type *in,
                        const hp_type *out, int n_out, hp_type *lin, hp_type *lout) {
    for (int i = 0; i < c->n_in; i++) {
        hp_placement p = in_pl(c, r, i);
        hp_err e = {0};
        int64_t sz = n;
        cr_assert_eq(hp_local_type(&in[i], &p, &sz, 1, true, &lin[i], &e), HP_OK, "%s", e.msg);
    }
    for (int k = 0; k < n_out; k++) {
        hp_err e = {0};
        int64_t sz = n;
        cr_assert_eq(hp_local_type(&out[k], &r->out[k], &sz, 1, true, &lout[k], &e), HP_OK, "%s",
                     e.msg);
    }
}

static void expect_equal(const hp_tensor *got, const hp_tensor *want, const char *what) {
    char a[64], b[64];
    cr_assert(hp_type_eq(&got->type, &want->type), "%s: %s, want %s", what,
              hp_type_str(&got->type, a, sizeof a), hp_type_str(&want->type, b, sizeof b));
    int64_t n = hp_type_numel(&want->type);
    for (int64_t e = 0; e < n; e++) {
        double x = got->data[e], y = want->data[e];
        if (isnan(y) && isnan(x)) continue;
        cr_assert(fabs(x - y) <= 1e-12 * (1 + fabs(y)), "%s: element %lld is %.17g, want %.17g",
                  what, (long long)e, x, y);
    }
}

static void free_all(hp_tensor *t, int n) {
    for (int i = 0; i < n; i++) hp_tensor_free(&t[i]);
}

/* ---- the property ---------------------------------------------------------------------------- */

/* One rule on a 1-D mesh of n: split, run per rank, combine, compare with the full result. */
static void check_1d(const op_case *c, hp_tensor *full_in, hp_tensor *full_out, int n_out,
                     const hp_shard_rule *r, int n) {
    char what[256];
    rule_str(c, n_out, r, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " on %d ranks", n);
    hp_tensor pieces[MAX_IN][MAX_RANKS], outs[HP_MAX_OUTS][MAX_RANKS];
    for (int i = 0; i < c->n_in; i++) split(&full_in[i], in_pl(c, r, i), n, pieces[i]);
    hp_type gin[MAX_IN], gout[HP_MAX_OUTS], lin[MAX_IN], lout[HP_MAX_OUTS];
    for (int i = 0; i < c->n_in; i++) gin[i] = full_in[i].type;
    for (int k = 0; k < n_out; k++) gout[k] = full_out[k].type;
    local_types(c, r, n, gin, gout, n_out, lin, lout);
    for (int rank = 0; rank < n; rank++) {
        hp_tensor ins[MAX_IN], res[HP_MAX_OUTS];
        for (int i = 0; i < c->n_in; i++) ins[i] = pieces[i][rank];
        int no;
        piece_box box = box_of(&gout[0], &r->out[0], (int64_t[]){n}, (int64_t[]){rank}, 1);
        run_node_at(c, ins, lout, res, &no, what, &box);
        for (int k = 0; k < n_out; k++) outs[k][rank] = res[k];
    }
    for (int k = 0; k < n_out; k++) {
        hp_tensor got = combine(outs[k], r->out[k], n, what);
        expect_equal(&got, &full_out[k], what);
        hp_tensor_free(&got);
        free_all(outs[k], n);
    }
    for (int i = 0; i < c->n_in; i++) free_all(pieces[i], n);
}

/* Rule a on mesh dim 0 (n0), then rule b on dim 1 (n1) asked about dim 0's local pieces. */
static void check_2d(const op_case *c, hp_tensor *full_in, hp_tensor *full_out, int n_out,
                     const hp_shard_rule *a, int n0, const hp_shard_rule *b, int n1) {
    char what[512], wa[200], wb[200];
    rule_str(c, n_out, a, wa, sizeof wa);
    rule_str(c, n_out, b, wb, sizeof wb);
    snprintf(what, sizeof what, "mesh (%d, %d): %s then %s", n0, n1, wa, wb);
    hp_tensor p0[MAX_IN][MAX_RANKS], p1[MAX_IN][MAX_RANKS][MAX_RANKS];
    hp_tensor outs[HP_MAX_OUTS][MAX_RANKS][MAX_RANKS];
    for (int i = 0; i < c->n_in; i++) {
        split(&full_in[i], in_pl(c, a, i), n0, p0[i]);
        for (int r0 = 0; r0 < n0; r0++) split(&p0[i][r0], in_pl(c, b, i), n1, p1[i][r0]);
    }
    hp_type gin[MAX_IN], gout[HP_MAX_OUTS], min[MAX_IN], mout[HP_MAX_OUTS];
    hp_type lin[MAX_IN], lout[HP_MAX_OUTS];
    for (int i = 0; i < c->n_in; i++) gin[i] = full_in[i].type;
    for (int k = 0; k < n_out; k++) gout[k] = full_out[k].type;
    local_types(c, a, n0, gin, gout, n_out, min, mout);
    local_types(c, b, n1, min, mout, n_out, lin, lout);
    for (int r0 = 0; r0 < n0; r0++) {
        for (int r1 = 0; r1 < n1; r1++) {
            hp_tensor ins[MAX_IN], res[HP_MAX_OUTS];
            for (int i = 0; i < c->n_in; i++) ins[i] = p1[i][r0][r1];
            int no;
            piece_box box = box_of(&gout[0], (hp_placement[]){a->out[0], b->out[0]},
                                   (int64_t[]){n0, n1}, (int64_t[]){r0, r1}, 2);
            run_node_at(c, ins, lout, res, &no, what, &box);
            for (int k = 0; k < n_out; k++) outs[k][r0][r1] = res[k];
        }
    }
    for (int k = 0; k < n_out; k++) {
        hp_tensor mid[MAX_RANKS];
        for (int r0 = 0; r0 < n0; r0++) {
            mid[r0] = combine(outs[k][r0], b->out[k], n1, what);
            free_all(outs[k][r0], n1);
        }
        hp_tensor got = combine(mid, a->out[k], n0, what);
        expect_equal(&got, &full_out[k], what);
        hp_tensor_free(&got);
        free_all(mid, n0);
    }
    for (int i = 0; i < c->n_in; i++) {
        for (int r0 = 0; r0 < n0; r0++) free_all(p1[i][r0], n1);
        free_all(p0[i], n0);
    }
}

typedef struct tally {
    int rules[HP_OP_COUNT];  /* distinct 1-D rules checked */
    int cases[HP_OP_COUNT];  /* cases run */
    int checks[HP_OP_COUNT]; /* (rule, mesh) combinations checked */
} tally;

static void check_case(const op_case *c, tally *t) {
    hp_tensor full_in[MAX_IN], full_out[HP_MAX_OUTS];
    for (int i = 0; i < c->n_in; i++) {
        full_in[i] = tensor(c->in[i].t);
        fill(&full_in[i], &c->in[i]);
    }
    int n_out;
    char what[64];
    snprintf(what, sizeof what, "%s on full tensors", hp_op_get(c->op)->name);
    run_node(c, full_in, NULL, full_out, &n_out, what);
    hp_type gin[MAX_IN], gout[HP_MAX_OUTS];
    for (int i = 0; i < c->n_in; i++) gin[i] = full_in[i].type;
    for (int k = 0; k < n_out; k++) gout[k] = full_out[k].type;
    t->cases[c->op]++;
    static const int sizes[] = {2, 3};
    for (size_t s = 0; s < HP_ARRAY_LEN(sizes); s++) {
        hp_shard_rule rules[HP_SHARD_MAX_RULES];
        int nr = rules_of(c, gin, gout, sizes[s], rules);
        if (s == 0) t->rules[c->op] += nr;
        for (int k = 0; k < nr; k++) {
            check_1d(c, full_in, full_out, n_out, &rules[k], sizes[s]);
            t->checks[c->op]++;
        }
    }
    /* 2-D: (2, 2) and (2, 3) */
    static const int second[] = {2, 3};
    hp_shard_rule ra[HP_SHARD_MAX_RULES + 1];
    int na = rules_of(c, gin, gout, 2, ra);
    ra[na] = (hp_shard_rule){0}; /* all Replicate on dim 0 too */
    for (int ia = 0; ia <= na; ia++) {
        hp_type min[MAX_IN], mout[HP_MAX_OUTS];
        local_types(c, &ra[ia], 2, gin, gout, n_out, min, mout);
        for (size_t s = 0; s < HP_ARRAY_LEN(second); s++) {
            hp_shard_rule rb[HP_SHARD_MAX_RULES];
            int nb = rules_of(c, min, mout, second[s], rb);
            for (int ib = 0; ib < nb; ib++) {
                check_2d(c, full_in, full_out, n_out, &ra[ia], 2, &rb[ib], second[s]);
                t->checks[c->op]++;
            }
            if (ia < na) { /* rule a then all Replicate */
                hp_shard_rule repl = {0};
                check_2d(c, full_in, full_out, n_out, &ra[ia], 2, &repl, second[s]);
            }
        }
    }
    free_all(full_in, c->n_in);
    free_all(full_out, n_out);
}

static bool is_comm_or_given(hp_op op) {
    return op == HP_OP_PLACEHOLDER || op == HP_OP_WAIT_TENSOR ||
           (hp_op_get(op)->flags & HP_OPF_COLLECTIVE);
}

Test(shard_rules, every_rule_of_every_op_matches_the_full_computation, .timeout = 300) {
    int n;
    op_case *cases = cases_new(&n);
    static tally t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < n; i++) check_case(&cases[i], &t);
    for (int op = 0; op < HP_OP_COUNT; op++) {
        const hp_op_info *info = hp_op_get((hp_op)op);
        if (is_comm_or_given((hp_op)op)) continue;
        if (getenv("HP_SHARD_RULES_VERBOSE"))
            fprintf(stderr, "%-45s cases %d rules %d checks %d\n", info->name, t.cases[op],
                    t.rules[op], t.checks[op]);
        cr_expect(t.cases[op] > 0, "op %s has no case in this test", info->name);
        if (info->flags & HP_OPF_REPLICATE_ONLY)
            cr_expect(t.rules[op] == 0, "op %s is replicate-only but declares rules", info->name);
        else
            cr_expect(t.rules[op] > 0,
                      "op %s declares no sharding rule and is not declared replicate-only",
                      info->name);
    }
}

/* Rules that must be there (the ones TP, FSDP and loss handling stand on). */
static bool has_rule(hp_op op, const hp_type *in, int n_in, const hp_type *out, int n_out,
                     const hp_attr *attrs, int n_attrs, const char *want) {
    op_case c = {.op = op, .n_in = n_in, .n_attrs = n_attrs};
    for (int i = 0; i < n_attrs; i++) c.attrs[i] = attrs[i];
    hp_shard_rule rules[HP_SHARD_MAX_RULES];
    int k = rules_of(&c, in, out, 2, rules);
    for (int i = 0; i < k; i++) {
        char s[256];
        rule_str(&c, n_out, &rules[i], s, sizeof s);
        if (!strcmp(s, want)) return true;
    }
    return false;
}

Test(shard_rules, megatron_and_data_parallel_rules_are_declared) {
    hp_type x = TY(HP_F32, 8, 16), w = TY(HP_F32, 16, 32), y = TY(HP_F32, 8, 32);
    hp_type in[2] = {x, w};
    cr_expect(has_rule(HP_OP_MM, in, 2, &y, 1, NULL, 0, "mm(S(0), R) -> S(0)"));
    cr_expect(has_rule(HP_OP_MM, in, 2, &y, 1, NULL, 0, "mm(R, S(1)) -> S(1)"));
    cr_expect(has_rule(HP_OP_MM, in, 2, &y, 1, NULL, 0, "mm(S(1), S(0)) -> P(sum)"));
    hp_type nin[2] = {TY(HP_F32, 8, 5), TY(HP_I64, 8)}, nout[2] = {TY0(HP_F32), TY0(HP_F32)};
    cr_expect(has_rule(HP_OP_NLL_LOSS_FORWARD, nin, 2, nout, 2, NULL, 0,
                       "nll_loss_forward(S(0), S(0)) -> P(avg), P(sum)"));
    hp_type sum_in = TY(HP_F32, 8, 4), sum_out = TY(HP_F32, 4);
    hp_attr dims = hp_attr_ints(HP_ATTR_DIMS, 1, (int64_t[]){0});
    cr_expect(has_rule(HP_OP_SUM, &sum_in, 1, &sum_out, 1, &dims, 1, "sum(S(0)) -> P(sum)"));
    hp_type q[3] = {TY(HP_F32, 2, 8, 4, 4), TY(HP_F32, 2, 2, 4, 4), TY(HP_F32, 2, 2, 4, 4)};
    hp_type qo[2] = {TY(HP_F32, 2, 8, 4, 4), TY(HP_F32, 2, 8, 4)};
    hp_attr sc = hp_attr_float(HP_ATTR_SCALE, 1);
    cr_expect(has_rule(HP_OP_SDPA, q, 3, qo, 2, &sc, 1,
                       "_scaled_dot_product_flash_attention(S(1), S(1), S(1)) -> S(1), S(1)"),
              "GQA heads split");
    /* odd sizes never get an uneven Shard */
    hp_type odd[2] = {TY(HP_F32, 7, 16), w};
    hp_type oy = TY(HP_F32, 7, 32);
    cr_expect(!has_rule(HP_OP_MM, odd, 2, &oy, 1, NULL, 0, "mm(S(0), R) -> S(0)"));
}

/* ---- collectives on their own mesh dim ------------------------------------------------------- */

Test(shard_rules, collectives_redistribute_on_their_own_dim_and_pass_others) {
    hp_attr a[3] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_str(HP_ATTR_GROUP, "dp"),
                    hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_AVG)};
    hp_node ag = {.op = HP_OP_ALL_GATHER, .n_in = 1, .n_out = 1, .n_attrs = 2, .attrs = a};
    hp_node rs = {.op = HP_OP_REDUCE_SCATTER, .n_in = 1, .n_out = 1, .n_attrs = 3, .attrs = a};
    hp_type in = TY(HP_F32, 4, 6), gathered = TY(HP_F32, 8, 6), scattered = TY(HP_F32, 2, 6);
    hp_shard_rule r[HP_SHARD_MAX_RULES];
    hp_shard_query q = {.node = &ag, .in = &in, .out = &gathered, .mesh_size = 2, .mesh_dim = "dp"};
    cr_assert_eq(hp_op_get(HP_OP_ALL_GATHER)->shard(&q, r, HP_SHARD_MAX_RULES), 1);
    cr_expect(hp_placement_eq(r[0].in[0], HP_SHARD(0)) &&
              hp_placement_eq(r[0].out[0], HP_REPLICATE));
    q.mesh_dim = "tp"; /* another dim: its shard of dim 1 passes, dim 0 would interleave */
    int k = hp_op_get(HP_OP_ALL_GATHER)->shard(&q, r, HP_SHARD_MAX_RULES);
    bool s1 = false, s0 = false;
    for (int i = 0; i < k; i++) {
        s1 |= hp_placement_eq(r[i].in[0], HP_SHARD(1)) && hp_placement_eq(r[i].out[0], HP_SHARD(1));
        s0 |= hp_placement_eq(r[i].in[0], HP_SHARD(0));
    }
    cr_expect(s1 && !s0);
    q = (hp_shard_query){
        .node = &rs, .in = &in, .out = &scattered, .mesh_size = 2, .mesh_dim = "dp"};
    cr_assert_eq(hp_op_get(HP_OP_REDUCE_SCATTER)->shard(&q, r, HP_SHARD_MAX_RULES), 2);
    cr_expect(hp_placement_eq(r[0].in[0], HP_PARTIAL(HP_REDUCE_AVG)) &&
              hp_placement_eq(r[0].out[0], HP_SHARD(0)));
    /* averaging identical replicas: a rank's chunk of a replicated value */
    cr_expect(hp_placement_eq(r[1].in[0], HP_REPLICATE) &&
              hp_placement_eq(r[1].out[0], HP_SHARD(0)));
}

/* local_chunk on its own dim: Replicate -> Shard(dim), a rank's own chunk; on another dim
 * every Shard but of dim passes, and Partial passes (a chunk is linear). */
Test(shard_rules, local_chunk_is_replicate_to_shard_on_its_own_dim) {
    hp_attr a[3] = {hp_attr_int(HP_ATTR_DIM, 1), hp_attr_int(HP_ATTR_GROUP_SIZE, 2),
                    hp_attr_str(HP_ATTR_GROUP, "tp")};
    hp_node lc = {.op = HP_OP_LOCAL_CHUNK, .n_in = 1, .n_out = 1, .n_attrs = 3, .attrs = a};
    hp_type in = TY(HP_F32, 4, 6), out = TY(HP_F32, 4, 3);
    hp_shard_rule r[HP_SHARD_MAX_RULES];
    hp_shard_query q = {.node = &lc, .in = &in, .out = &out, .mesh_size = 2, .mesh_dim = "tp"};
    cr_assert_eq(hp_op_get(HP_OP_LOCAL_CHUNK)->shard(&q, r, HP_SHARD_MAX_RULES), 1);
    cr_expect(hp_placement_eq(r[0].in[0], HP_REPLICATE) &&
              hp_placement_eq(r[0].out[0], HP_SHARD(1)));
    q.mesh_dim = "dp";
    int k = hp_op_get(HP_OP_LOCAL_CHUNK)->shard(&q, r, HP_SHARD_MAX_RULES);
    bool s0 = false, s1 = false, p = false;
    for (int i = 0; i < k; i++) {
        s0 |= hp_placement_eq(r[i].in[0], HP_SHARD(0)) && hp_placement_eq(r[i].out[0], HP_SHARD(0));
        s1 |= hp_placement_eq(r[i].in[0], HP_SHARD(1));
        p |= hp_placement_eq(r[i].in[0], HP_PARTIAL(HP_REDUCE_SUM)) &&
             hp_placement_eq(r[i].out[0], HP_PARTIAL(HP_REDUCE_SUM));
    }
    cr_expect(s0 && !s1 && p);
}

/* all_to_all_single on its own dim: a global [n, n, m] Shard(0) -> Shard(0), the transpose of
 * dims 0 and 1. Checked numerically: each simulated rank's piece [1, n, m] exchanged as the
 * primitive does (n equal flat parts, part j to rank j, output part k from rank k), the pieces
 * put together, against the transpose of the full tensor; n = 2, 3. On another mesh dim only
 * a Shard(2) (and Partial) passes. */
Test(shard_rules, all_to_all_is_the_transpose_of_its_two_leading_dims) {
    hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_str(HP_ATTR_GROUP, "tp")};
    hp_node n2a = {.op = HP_OP_ALL_TO_ALL, .n_in = 1, .n_out = 1, .n_attrs = 2, .attrs = a};
    for (int n = 2; n <= 3; n++) {
        enum { M = 5 };
        a[0] = hp_attr_int(HP_ATTR_GROUP_SIZE, n);
        hp_type t = TY(HP_F32, n, n, M);
        hp_shard_rule r[HP_SHARD_MAX_RULES];
        hp_shard_query q = {.node = &n2a, .in = &t, .out = &t, .mesh_size = n, .mesh_dim = "tp"};
        cr_assert_eq(hp_op_get(HP_OP_ALL_TO_ALL)->shard(&q, r, HP_SHARD_MAX_RULES), 1);
        cr_assert(hp_placement_eq(r[0].in[0], HP_SHARD(0)) &&
                  hp_placement_eq(r[0].out[0], HP_SHARD(0)));
        /* the local shape rule takes the [1, n, m] piece */
        hp_type lt = TY(HP_F32, 1, n, M), lo;
        hp_err e = {0};
        cr_assert_eq(hp_op_get(HP_OP_ALL_TO_ALL)->shape(&n2a, &lt, &lo, &e), HP_OK, "%s", e.msg);
        cr_assert(hp_type_eq(&lo, &lt));
        double full[3 * 3 * M], got[3 * 3 * M];
        hp_th_rand(full, n * n * M, 7 + (uint64_t)n, -1, 1);
        int part = n * M / n;                       /* a rank holds n * M elements, n parts */
        for (int rank = 0; rank < n; rank++)        /* receiver */
            for (int k = 0; k < n; k++)             /* its output part k, from rank k */
                for (int e2 = 0; e2 < part; e2++) { /* rank k's piece is full[k] */
                    double v = full[k * n * M + rank * part + e2];
                    got[rank * n * M + k * part + e2] = v; /* piece rank of the Shard(0) out */
                }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                for (int m = 0; m < M; m++)
                    cr_assert_eq(got[(i * n + j) * M + m], full[(j * n + i) * M + m],
                                 "n %d: out[%d, %d, %d]", n, i, j, m);
        q.mesh_dim = "dp"; /* another dim: dims 0 and 1 are exchanged, dim 2 passes */
        hp_type o = TY(HP_F32, n, n, 6);
        q.in = q.out = &o;
        int k = hp_op_get(HP_OP_ALL_TO_ALL)->shard(&q, r, HP_SHARD_MAX_RULES);
        bool s2 = false, s01 = false, p = false;
        for (int i = 0; i < k; i++) {
            s2 |= hp_placement_eq(r[i].in[0], HP_SHARD(2)) &&
                  hp_placement_eq(r[i].out[0], HP_SHARD(2));
            s01 |= hp_placement_eq(r[i].in[0], HP_SHARD(0)) ||
                   hp_placement_eq(r[i].in[0], HP_SHARD(1));
            p |= hp_placement_eq(r[i].in[0], HP_PARTIAL(HP_REDUCE_SUM));
        }
        cr_expect(s2 && !s01 && p, "n %d", n);
    }
    /* not [n, n, ...] globally: no rule of its own */
    hp_type bad = TY(HP_F32, 4, 2, 3);
    hp_shard_rule r[HP_SHARD_MAX_RULES];
    hp_shard_query q = {.node = &n2a, .in = &bad, .out = &bad, .mesh_size = 3, .mesh_dim = "tp"};
    a[0] = hp_attr_int(HP_ATTR_GROUP_SIZE, 3);
    cr_expect_eq(hp_op_get(HP_OP_ALL_TO_ALL)->shard(&q, r, HP_SHARD_MAX_RULES), 0);
}

/* The vocab-parallel lookup and its gradient are rules of chunked_embedding(_backward). */
Test(shard_rules, chunked_embedding_is_vocab_parallel) {
    hp_type in[3] = {TY(HP_F32, 16, 8), TY(HP_I64, 4, 3), TY(HP_I64, 2)}, out = TY(HP_F32, 4, 3, 8);
    cr_expect(has_rule(HP_OP_CHUNKED_EMBEDDING, in, 3, &out, 1, NULL, 0,
                       "chunked_embedding(S(0), R, S(0)) -> P(sum)"));
    hp_type bin[3] = {TY(HP_F32, 4, 3, 8), TY(HP_I64, 4, 3), TY(HP_I64, 2)},
            bout = TY(HP_F32, 16, 8);
    hp_attr nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 16);
    cr_expect(has_rule(HP_OP_CHUNKED_EMBEDDING_BACKWARD, bin, 3, &bout, 1, &nw, 1,
                       "chunked_embedding_backward(R, R, S(0)) -> S(0)"));
}

/* ---- placement words ------------------------------------------------------------------------- */

Test(shard_rules, placement_words_parse_in_both_forms) {
    static const char *good[][2] = {{"R", "R"},           {"Replicate", "R"},
                                    {"S(0)", "S(0)"},     {"Shard(3)", "S(3)"},
                                    {"P(sum)", "P(sum)"}, {"Partial", "P(sum)"},
                                    {"P(avg)", "P(avg)"}, {"Partial(max)", "P(max)"}};
    for (size_t i = 0; i < HP_ARRAY_LEN(good); i++) {
        hp_placement p;
        hp_err e = {0};
        char buf[32];
        cr_assert_eq(hp_placement_parse(good[i][0], &p, &e), HP_OK, "%s: %s", good[i][0], e.msg);
        cr_expect_str_eq(hp_placement_short(&p, buf, sizeof buf), good[i][1]);
    }
    static const char *bad[] = {"", "S", "S(8)", "S(-1)", "P(min)", "Shard(x)", "r", "S(0) "};
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        hp_placement p;
        hp_err e = {0};
        cr_expect_eq(hp_placement_parse(bad[i], &p, &e), HP_PARSE, "'%s' parsed", bad[i]);
    }
}
