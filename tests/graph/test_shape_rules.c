/* Shape rules: for every op in the table, at least one accepted case (with its inferred type)
 * and one rejected case (with the message naming the offender). A test fails if an op has
 * no case, so adding an op to ops.def without shape tests breaks the build's tests. */
#include "hp/build.h"
#include "hp/graph.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses "f32[2,3]" (test input only: trusted). */
static hp_type ty(const char *s) {
    hp_type t = {0};
    char name[8] = {0};
    size_t k = strcspn(s, "[");
    memcpy(name, s, k);
    cr_assert(hp_dtype_parse(name, &t.dtype, NULL) == HP_OK, "bad dtype in %s", s);
    const char *p = s + k + 1;
    while (*p && *p != ']') {
        t.shape[t.rank++] = strtoll(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    return t;
}

#define MAXA 6
typedef struct {
    hp_op op;
    const char *in[6];
    hp_attr attrs[MAXA];
    int n_attrs;
    const char *out[3]; /* expected output types, or NULL */
    const char *err;    /* expected error substring, or NULL */
} shape_case;

/* Constant attribute initializers (the table is static). */
#define I(k, v)                                                                                    \
    { .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_INT, .i = (v) }
#define F(k, v)                                                                                    \
    { .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_FLOAT, .f = (v) }
#define L(k, ...)                                                                                  \
    {                                                                                              \
        .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_INTS, .ints = {                                   \
            .n = sizeof((int64_t[]){__VA_ARGS__}) / 8,                                             \
            .v = {__VA_ARGS__}                                                                     \
        }                                                                                          \
    }
#define L0(k)                                                                                      \
    {                                                                                              \
        .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_INTS, .ints = {.n = 0 }                           \
    }
#define S(k, v)                                                                                    \
    { .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_STR, .s = (v) }
#define D(k, v)                                                                                    \
    { .key = HP_ATTR_##k, .kind = HP_ATTR_KIND_DTYPE, .dtype = (v) }

static const shape_case cases[] = {
    /* creation */
    {HP_OP_FULL, {0}, {L(SHAPE, 2, 3), F(VALUE, 1.5)}, 2, {"f32[2,3]"}, NULL},
    {HP_OP_FULL, {0}, {L(SHAPE, 2, -3), F(VALUE, 1.5)}, 2, {0}, "dim 1 is -3"},
    {HP_OP_ZEROS, {0}, {L0(SHAPE), D(DTYPE, HP_BF16)}, 2, {"bf16[]"}, NULL},
    {HP_OP_ZEROS, {0}, {D(DTYPE, HP_BF16)}, 1, {0}, "missing required attribute 'shape'"},
    {HP_OP_ONES, {0}, {L(SHAPE, 4), D(DTYPE, HP_I64)}, 2, {"i64[4]"}, NULL},
    {HP_OP_ONES, {0}, {L(SHAPE, 4), F(VALUE, 2)}, 2, {0}, "'value' is not accepted by ones"},
    /* elementwise */
    {HP_OP_ADD, {"f32[2,1,3]", "f32[4,1]"}, {{0}}, 0, {"f32[2,4,3]"}, NULL},
    {HP_OP_ADD, {"f32[2,3]", "f32[4]"}, {{0}}, 0, {0}, "do not broadcast"},
    {HP_OP_SUB, {"f32[3]", "f32[]"}, {{0}}, 0, {"f32[3]"}, NULL},
    {HP_OP_SUB, {"f32[3]", "bf16[3]"}, {{0}}, 0, {0}, "dtypes differ: f32 vs bf16"},
    {HP_OP_MUL, {"bf16[5,6]", "bf16[6]"}, {{0}}, 0, {"bf16[5,6]"}, NULL},
    {HP_OP_MUL, {"bool[2]", "bool[2]"}, {{0}}, 0, {0}, "bool"},
    {HP_OP_DIV, {"f32[2]", "f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_DIV, {"f32[2]", "f32[3]"}, {{0}}, 0, {0}, "do not broadcast"},
    {HP_OP_MAXIMUM, {"f32[2,2]", "f32[1]"}, {{0}}, 0, {"f32[2,2]"}, NULL},
    {HP_OP_MAXIMUM, {"f32[2]", "i64[2]"}, {{0}}, 0, {0}, "dtypes differ"},
    {HP_OP_EQ, {"i64[3]", "i64[3]"}, {{0}}, 0, {"bool[3]"}, NULL},
    {HP_OP_EQ, {"i64[3]", "i32[3]"}, {{0}}, 0, {0}, "dtypes differ"},
    {HP_OP_LT, {"f32[3,1]", "f32[2]"}, {{0}}, 0, {"bool[3,2]"}, NULL},
    {HP_OP_LT, {"f32[3]", "f32[2]"}, {{0}}, 0, {0}, "do not broadcast"},
    {HP_OP_WHERE, {"bool[2,1]", "f32[3]", "f32[]"}, {{0}}, 0, {"f32[2,3]"}, NULL},
    {HP_OP_WHERE, {"f32[2]", "f32[2]", "f32[2]"}, {{0}}, 0, {0}, "condition must be bool"},
    {HP_OP_ADD_SCALAR, {"f32[2]"}, {F(VALUE, 1)}, 1, {"f32[2]"}, NULL},
    {HP_OP_ADD_SCALAR, {"i64[2]"}, {F(VALUE, 1)}, 1, {0}, "must be floating"},
    {HP_OP_MUL_SCALAR, {"f16[2]"}, {F(VALUE, 3)}, 1, {"f16[2]"}, NULL},
    {HP_OP_MUL_SCALAR, {"f16[2]"}, {{0}}, 0, {0}, "missing required attribute 'value'"},
    {HP_OP_POW, {"f32[2]"}, {F(EXPONENT, 2)}, 1, {"f32[2]"}, NULL},
    {HP_OP_POW, {"f32[2]"}, {F(EXPONENT, 1.0 / 0.0)}, 1, {0}, "'exponent' is inf"},
    {HP_OP_NEG, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_NEG, {"i32[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_EXP, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_EXP, {"bool[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_LOG, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_LOG, {"f32[2]"}, {I(DIM, 0)}, 1, {0}, "'dim' is not accepted by log"},
    {HP_OP_SQRT, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_SQRT, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_RSQRT, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_RSQRT, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_TANH, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_TANH, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_SIN, {"bf16[2]"}, {{0}}, 0, {"bf16[2]"}, NULL},
    {HP_OP_SIN, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_COS, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_COS, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_ERF, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_ERF, {"bool[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_SIGMOID, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_SIGMOID, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_SILU, {"bf16[2]"}, {{0}}, 0, {"bf16[2]"}, NULL},
    {HP_OP_SILU, {"i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_GELU, {"f32[2]"}, {I(APPROXIMATE, 1)}, 1, {"f32[2]"}, NULL},
    {HP_OP_GELU, {"f32[2]"}, {I(APPROXIMATE, 2)}, 1, {0}, "approximate is 2"},
    {HP_OP_RELU, {"f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_RELU, {"i32[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_TO_COPY, {"f32[2,3]"}, {D(DTYPE, HP_BF16)}, 1, {"bf16[2,3]"}, NULL},
    {HP_OP_TO_COPY, {"f32[2,3]"}, {I(DTYPE, 1)}, 1, {0}, "'dtype' has the wrong kind"},
    {HP_OP_TANH_BACKWARD, {"f32[2]", "f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_TANH_BACKWARD, {"f32[2]", "f32[3]"}, {{0}}, 0, {0}, "grad and saved tensor differ"},
    {HP_OP_SIGMOID_BACKWARD, {"f32[2]", "f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_SIGMOID_BACKWARD, {"f32[2]"}, {{0}}, 0, {0}, "takes 2 inputs, got 1"},
    {HP_OP_SILU_BACKWARD, {"f32[2]", "f32[2]"}, {{0}}, 0, {"f32[2]"}, NULL},
    {HP_OP_SILU_BACKWARD, {"i64[2]", "i64[2]"}, {{0}}, 0, {0}, "must be floating"},
    {HP_OP_GELU_BACKWARD, {"f32[2]", "f32[2]"}, {I(APPROXIMATE, 0)}, 1, {"f32[2]"}, NULL},
    {HP_OP_GELU_BACKWARD, {"f32[2]", "f32[2]"}, {I(APPROXIMATE, -1)}, 1, {0}, "approximate"},
    {HP_OP_THRESHOLD_BACKWARD, {"f32[2]", "f32[2]"}, {F(VALUE, 0)}, 1, {"f32[2]"}, NULL},
    {HP_OP_THRESHOLD_BACKWARD, {"f32[2]", "f32[2]"}, {{0}}, 0, {0}, "'value'"},
    /* reductions */
    {HP_OP_SUM, {"f32[2,3,4]"}, {L(DIMS, -1, 0)}, 1, {"f32[3]"}, NULL},
    {HP_OP_SUM, {"f32[2,3,4]"}, {L(DIMS, 1), I(KEEPDIM, 1)}, 2, {"f32[2,1,4]"}, NULL},
    {HP_OP_SUM, {"f32[2,3]"}, {L0(DIMS)}, 1, {"f32[]"}, NULL},
    {HP_OP_SUM, {"f32[2,3]"}, {L(DIMS, 2)}, 1, {0}, "dims entry 2 is out of range for rank 2"},
    {HP_OP_SUM, {"f32[2,3]"}, {L(DIMS, 1, -1)}, 1, {0}, "listed twice"},
    {HP_OP_MEAN, {"f32[2,3]"}, {L(DIMS, 1)}, 1, {"f32[2]"}, NULL},
    {HP_OP_MEAN, {"i64[2,3]"}, {L(DIMS, 1)}, 1, {0}, "must be floating"},
    {HP_OP_AMAX, {"f32[2,3]"}, {L(DIMS, 0), I(KEEPDIM, 1)}, 2, {"f32[1,3]"}, NULL},
    {HP_OP_AMAX, {"f32[2,0]"}, {L(DIMS, 1)}, 1, {0}, "empty dim 1"},
    /* shapes */
    {HP_OP_VIEW, {"f32[2,3,4]"}, {L(SHAPE, 6, -1)}, 1, {"f32[6,4]"}, NULL},
    {HP_OP_VIEW, {"f32[2,3,4]"}, {L(SHAPE, 5, 5)}, 1, {0}, "cannot view [2,3,4] (24 elements)"},
    {HP_OP_VIEW, {"f32[2,3,4]"}, {L(SHAPE, -1, -1)}, 1, {0}, "more than one -1"},
    {HP_OP_RESHAPE, {"f32[6]"}, {L(SHAPE, 2, 3)}, 1, {"f32[2,3]"}, NULL},
    {HP_OP_RESHAPE, {"f32[6]"}, {L(SHAPE, 4, -1)}, 1, {0}, "cannot infer the -1"},
    {HP_OP_PERMUTE, {"f32[2,3,4]"}, {L(PERM, 2, 0, 1)}, 1, {"f32[4,2,3]"}, NULL},
    {HP_OP_PERMUTE, {"f32[2,3,4]"}, {L(PERM, 0, 0, 1)}, 1, {0}, "perm repeats dim 0"},
    {HP_OP_PERMUTE, {"f32[2,3,4]"}, {L(PERM, 0, 1)}, 1, {0}, "perm has 2 entries for rank 3"},
    {HP_OP_TRANSPOSE, {"f32[2,3,4]"}, {I(DIM0, 1), I(DIM1, -1)}, 2, {"f32[2,4,3]"}, NULL},
    {HP_OP_TRANSPOSE, {"f32[2,3,4]"}, {I(DIM0, 3), I(DIM1, 0)}, 2, {0}, "dim0 3 is out of range"},
    {HP_OP_T, {"f32[2,3]"}, {{0}}, 0, {"f32[3,2]"}, NULL},
    {HP_OP_T, {"f32[2,3,4]"}, {{0}}, 0, {0}, "t expects rank <= 2"},
    {HP_OP_EXPAND, {"f32[3,1]"}, {L(SHAPE, 2, -1, 4)}, 1, {"f32[2,3,4]"}, NULL},
    {HP_OP_EXPAND, {"f32[3,2]"}, {L(SHAPE, 3, 4)}, 1, {0}, "cannot expand [3,2]: dim 1 is 2"},
    {HP_OP_EXPAND, {"f32[3,2]"}, {L(SHAPE, 2)}, 1, {0}, "fewer dims"},
    {HP_OP_SLICE,
     {"f32[10,4]"},
     {I(DIM, 0), I(START, 1), I(END, 100), I(STEP, 2)},
     4,
     {"f32[5,4]"},
     NULL},
    {HP_OP_SLICE, {"f32[10,4]"}, {I(DIM, 1), I(START, -3), I(END, -1)}, 3, {"f32[10,2]"}, NULL},
    {HP_OP_SLICE,
     {"f32[10,4]"},
     {I(DIM, 0), I(START, 0), I(END, 1), I(STEP, 0)},
     4,
     {0},
     "step 0 must be >= 1"},
    {HP_OP_SLICE_BACKWARD,
     {"f32[5,4]"},
     {L(SHAPE, 10, 4), I(DIM, 0), I(START, 1), I(END, 100), I(STEP, 2)},
     5,
     {"f32[10,4]"},
     NULL},
    {HP_OP_SLICE_BACKWARD,
     {"f32[4,4]"},
     {L(SHAPE, 10, 4), I(DIM, 0), I(START, 1), I(END, 100), I(STEP, 2)},
     5,
     {0},
     "grad does not match the slice"},
    {HP_OP_CAT, {"f32[2,3]", "f32[2,5]"}, {I(DIM, -1)}, 1, {"f32[2,8]"}, NULL},
    {HP_OP_CAT,
     {"f32[2,3]", "f32[3,5]"},
     {I(DIM, 1)},
     1,
     {0},
     "input 1 is [3,5], input 0 is [2,3] (dim 0 differs)"},
    {HP_OP_UNSQUEEZE, {"f32[2,3]"}, {I(DIM, -1)}, 1, {"f32[2,3,1]"}, NULL},
    {HP_OP_UNSQUEEZE, {"f32[2,3]"}, {I(DIM, 3)}, 1, {0}, "dim 3 is out of range for rank 3"},
    {HP_OP_SQUEEZE, {"f32[2,1,3]"}, {I(DIM, 1)}, 1, {"f32[2,3]"}, NULL},
    {HP_OP_SQUEEZE, {"f32[2,1,3]"}, {I(DIM, 0)}, 1, {0}, "cannot squeeze dim 0"},
    {HP_OP_CLONE, {"i64[2]"}, {{0}}, 0, {"i64[2]"}, NULL},
    {HP_OP_CLONE, {"i64[2]", "i64[2]"}, {{0}}, 0, {0}, "takes 1 inputs, got 2"},
    {HP_OP_DETACH, {"f32[2,3]"}, {{0}}, 0, {"f32[2,3]"}, NULL},
    {HP_OP_DETACH, {"f32[2]", "f32[2]"}, {{0}}, 0, {0}, "takes 1 inputs, got 2"},
    /* matrix products */
    {HP_OP_MM, {"f32[8,256]", "f32[256,768]"}, {{0}}, 0, {"f32[8,768]"}, NULL},
    {HP_OP_MM,
     {"f32[8,256]", "f32[128,768]"},
     {{0}},
     0,
     {0},
     "inner dims differ: [8,256] x [128,768]"},
    {HP_OP_MM, {"i64[2,2]", "i64[2,2]"}, {{0}}, 0, {0}, "lhs must be floating"},
    {HP_OP_MM, {"bf16[8,16]", "bf16[16,4]"}, {D(DTYPE, HP_F32)}, 1, {"f32[8,4]"}, NULL},
    {HP_OP_MM,
     {"f32[8,16]", "f32[16,4]"},
     {D(DTYPE, HP_BF16)},
     1,
     {0},
     "dtype bf16: a product's output is its operands' dtype or f32"},
    {HP_OP_BMM, {"f32[4,2,3]", "f32[4,3,5]"}, {{0}}, 0, {"f32[4,2,5]"}, NULL},
    {HP_OP_BMM, {"f32[4,2,3]", "f32[2,3,5]"}, {{0}}, 0, {0}, "batch dims differ"},
    {HP_OP_ADDMM, {"f32[5]", "f32[2,3]", "f32[3,5]"}, {F(BETA, 0.5)}, 1, {"f32[2,5]"}, NULL},
    {HP_OP_ADDMM, {"f32[4]", "f32[2,3]", "f32[3,5]"}, {{0}}, 0, {0}, "do not broadcast"},
    /* embedding, softmax, loss */
    {HP_OP_EMBEDDING, {"f32[100,16]", "i64[2,7]"}, {{0}}, 0, {"f32[2,7,16]"}, NULL},
    {HP_OP_EMBEDDING, {"f32[100,16]", "f32[2,7]"}, {{0}}, 0, {0}, "indices must be i32 or i64"},
    {HP_OP_EMBEDDING,
     {"f32[100,16]", "i64[2]"},
     {I(PADDING_IDX, 100)},
     1,
     {0},
     "padding_idx 100 outside"},
    {HP_OP_EMBEDDING_DENSE_BACKWARD,
     {"f32[2,7,16]", "i64[2,7]"},
     {I(NUM_WEIGHTS, 100)},
     1,
     {"f32[100,16]"},
     NULL},
    {HP_OP_EMBEDDING_DENSE_BACKWARD,
     {"bf16[2,7,16]", "i64[2,7]"},
     {I(NUM_WEIGHTS, 100), D(DTYPE, HP_F32)},
     2,
     {"f32[100,16]"},
     NULL},
    {HP_OP_EMBEDDING_DENSE_BACKWARD,
     {"f32[2,7,16]", "i64[2,7]"},
     {I(NUM_WEIGHTS, 100), D(DTYPE, HP_BF16)},
     2,
     {0},
     "dtype bf16: the weight gradient is grad's dtype or f32"},
    {HP_OP_CHUNKED_EMBEDDING,
     {"f32[100,16]", "i64[2,7]", "i64[4]"},
     {{0}},
     0,
     {"f32[2,7,16]"},
     NULL},
    {HP_OP_CHUNKED_EMBEDDING,
     {"f32[100,16]", "i64[2,7]", "i64[3]"},
     {{0}},
     0,
     {0},
     "100 weight rows do not split into 3 chunks"},
    {HP_OP_CHUNKED_EMBEDDING_BACKWARD,
     {"f32[2,7,16]", "i64[2,7]", "i32[2]"},
     {I(NUM_WEIGHTS, 100)},
     1,
     {"f32[100,16]"},
     NULL},
    {HP_OP_CHUNKED_EMBEDDING_BACKWARD,
     {"f32[2,7,16]", "i64[2,7]", "f32[2]"},
     {I(NUM_WEIGHTS, 100)},
     1,
     {0},
     "base must be i32 or i64"},
    {HP_OP_EMBEDDING_DENSE_BACKWARD,
     {"f32[2,7,16]", "i64[2,6]"},
     {I(NUM_WEIGHTS, 100)},
     1,
     {0},
     "does not match indices"},
    {HP_OP_LOG_SOFTMAX, {"f32[4,10]"}, {I(DIM, -1)}, 1, {"f32[4,10]"}, NULL},
    {HP_OP_LOG_SOFTMAX, {"f32[4,10]"}, {I(DIM, 2)}, 1, {0}, "dim 2 is out of range"},
    {HP_OP_LOG_SOFTMAX_BACKWARD, {"f32[4,10]", "f32[4,10]"}, {I(DIM, 1)}, 1, {"f32[4,10]"}, NULL},
    {HP_OP_LOG_SOFTMAX_BACKWARD,
     {"f32[4,10]", "f32[4,9]"},
     {I(DIM, 1)},
     1,
     {0},
     "grad and output differ"},
    {HP_OP_SOFTMAX, {"f32[4,10]"}, {I(DIM, 0)}, 1, {"f32[4,10]"}, NULL},
    {HP_OP_SOFTMAX, {"i32[4,10]"}, {I(DIM, 0)}, 1, {0}, "must be floating"},
    {HP_OP_SOFTMAX_BACKWARD, {"f32[4,10]", "f32[4,10]"}, {I(DIM, 0)}, 1, {"f32[4,10]"}, NULL},
    {HP_OP_SOFTMAX_BACKWARD, {"f32[4,10]", "bf16[4,10]"}, {I(DIM, 0)}, 1, {0}, "differ"},
    {HP_OP_NLL_LOSS_FORWARD, {"f32[6,10]", "i64[6]"}, {{0}}, 0, {"f32[]", "f32[]"}, NULL},
    {HP_OP_NLL_LOSS_FORWARD,
     {"f32[6,10]", "i64[6]"},
     {I(REDUCTION, 0)},
     1,
     {"f32[6]", "f32[]"},
     NULL},
    {HP_OP_NLL_LOSS_FORWARD, {"f32[6,10]", "i64[5]"}, {{0}}, 0, {0}, "target [5] does not match"},
    {HP_OP_NLL_LOSS_FORWARD, {"f32[6,10]", "i64[6]"}, {I(REDUCTION, 3)}, 1, {0}, "reduction 3"},
    {HP_OP_NLL_LOSS_BACKWARD,
     {"f32[]", "f32[6,10]", "i64[6]", "f32[]"},
     {{0}},
     0,
     {"f32[6,10]"},
     NULL},
    {HP_OP_NLL_LOSS_BACKWARD,
     {"f32[6]", "f32[6,10]", "i64[6]", "f32[]"},
     {{0}},
     0,
     {0},
     "does not match the loss"},
    {HP_OP_FUSED_CROSS_ENTROPY,
     {"bf16[6,10]", "i64[6]"},
     {{0}},
     0,
     {"f32[]", "f32[]", "f32[6]"},
     NULL},
    {HP_OP_FUSED_CROSS_ENTROPY,
     {"f32[6,10]", "i32[6]"},
     {I(REDUCTION, 2)},
     1,
     {"f32[]", "f32[]", "f32[6]"},
     NULL},
    {HP_OP_FUSED_CROSS_ENTROPY,
     {"f32[6,10]", "i64[6]"},
     {I(REDUCTION, 0)},
     1,
     {0},
     "reduction 0 is not mean"},
    {HP_OP_FUSED_CROSS_ENTROPY,
     {"f32[6,10]", "f32[6]"},
     {{0}},
     0,
     {0},
     "target must be i32 or i64"},
    {HP_OP_FUSED_CROSS_ENTROPY, {"f32[6]", "i64[6]"}, {{0}}, 0, {0}, "logits must have rank 2"},
    {HP_OP_FUSED_CROSS_ENTROPY_BACKWARD,
     {"f32[]", "bf16[6,10]", "i64[6]", "f32[6]", "f32[]"},
     {{0}},
     0,
     {"bf16[6,10]"},
     NULL},
    {HP_OP_FUSED_CROSS_ENTROPY_BACKWARD,
     {"f32[]", "f32[6,10]", "i64[6]", "f32[5]", "f32[]"},
     {{0}},
     0,
     {0},
     "lse must be f32 [6]"},
    {HP_OP_FUSED_CROSS_ENTROPY_BACKWARD,
     {"bf16[]", "f32[6,10]", "i64[6]", "f32[6]", "f32[]"},
     {{0}},
     0,
     {0},
     "grad must be an f32 scalar"},
    {HP_OP_SWIGLU, {"bf16[4,6]", "bf16[4,6]"}, {{0}}, 0, {"bf16[4,6]"}, NULL},
    {HP_OP_SWIGLU, {"f32[4,6]", "f32[4,1]"}, {{0}}, 0, {0}, "a and b differ"},
    {HP_OP_SWIGLU, {"i32[4,6]", "i32[4,6]"}, {{0}}, 0, {0}, "a must be floating"},
    {HP_OP_SWIGLU_BACKWARD,
     {"f32[4,6]", "f32[4,6]", "f32[4,6]"},
     {{0}},
     0,
     {"f32[4,6]", "f32[4,6]"},
     NULL},
    {HP_OP_SWIGLU_BACKWARD,
     {"f32[4,6]", "f32[4,6]", "bf16[4,6]"},
     {{0}},
     0,
     {0},
     "grad and b differ"},
    /* ops for exported PyTorch models */
    {HP_OP_LAYER_NORM,
     {"f32[2,5,8]", "f32[8]", "f32[8]"},
     {F(EPS, 1e-5)},
     1,
     {"f32[2,5,8]", "f32[2,5,1]", "f32[2,5,1]"},
     NULL},
    {HP_OP_LAYER_NORM, {"f32[2,8]", "f32[8]", "f32[7]"}, {F(EPS, 1e-5)}, 1, {0}, "bias [7]"},
    {HP_OP_LAYER_NORM, {"i64[2,8]", "i64[8]", "i64[8]"}, {F(EPS, 1e-5)}, 1, {0}, "floating"},
    {HP_OP_LAYER_NORM_BACKWARD,
     {"f32[2,8]", "f32[2,8]", "f32[2,1]", "f32[2,1]", "f32[8]"},
     {{0}},
     0,
     {"f32[2,8]", "f32[8]", "f32[8]"},
     NULL},
    {HP_OP_LAYER_NORM_BACKWARD,
     {"f32[2,8]", "f32[2,8]", "f32[2]", "f32[2,1]", "f32[8]"},
     {{0}},
     0,
     {0},
     "mean does not match"},
    {HP_OP_TRIL, {"bool[4,4]"}, {{0}}, 0, {"bool[4,4]"}, NULL},
    {HP_OP_NATIVE_DROPOUT,
     {"bf16[2,8]"},
     {F(P, 0.1), S(FQN, "h.0.drop#0")},
     2,
     {"bf16[2,8]", "bool[2,8]"},
     NULL},
    {HP_OP_NATIVE_DROPOUT,
     {"f32[2,8]"},
     {F(P, 0.1), S(FQN, "d"), L(GLOBAL_SHAPE, 6, 8)},
     3,
     {"f32[2,8]", "bool[2,8]"},
     NULL},
    {HP_OP_NATIVE_DROPOUT, {"f32[2,8]"}, {F(P, 1), S(FQN, "d")}, 2, {0}, "must be in [0, 1)"},
    {HP_OP_NATIVE_DROPOUT, {"i64[2,8]"}, {F(P, 0.5), S(FQN, "d")}, 2, {0}, "floating"},
    {HP_OP_NATIVE_DROPOUT, {"f32[2]"}, {F(P, 0.5), S(FQN, "")}, 2, {0}, "must not be empty"},
    {HP_OP_NATIVE_DROPOUT,
     {"f32[2,8]"},
     {F(P, 0.1), S(FQN, "d"), L(GLOBAL_SHAPE, 5, 8)},
     3,
     {0},
     "multiple of the local 2"},
    {HP_OP_NATIVE_DROPOUT, {"f32[2,8]"}, {F(P, 0.1)}, 1, {0}, "missing required attribute 'fqn'"},
    {HP_OP_NATIVE_DROPOUT_BACKWARD,
     {"f32[2,8]", "bool[2,8]"},
     {F(SCALE, 1.25)},
     1,
     {"f32[2,8]"},
     NULL},
    {HP_OP_NATIVE_DROPOUT_BACKWARD, {"f32[2,8]", "f32[2,8]"}, {F(SCALE, 1)}, 1, {0}, "bool"},
    {HP_OP_NATIVE_DROPOUT_BACKWARD, {"f32[2,8]", "bool[8]"}, {F(SCALE, 1)}, 1, {0}, "differ"},
    {HP_OP_TRIL, {"f32[2,3,5]"}, {I(DIAGONAL, -1)}, 1, {"f32[2,3,5]"}, NULL},
    {HP_OP_TRIL, {"f32[5]"}, {{0}}, 0, {0}, "rank >= 2"},
    {HP_OP_BITWISE_NOT, {"bool[3,4]"}, {{0}}, 0, {"bool[3,4]"}, NULL},
    {HP_OP_BITWISE_NOT, {"i32[3]"}, {{0}}, 0, {"i32[3]"}, NULL},
    {HP_OP_BITWISE_NOT, {"f32[3]"}, {{0}}, 0, {0}, "must be i32 or i64"},
    {HP_OP_ARANGE, {0}, {I(END, 7)}, 1, {"i64[7]"}, NULL},
    {HP_OP_ARANGE,
     {0},
     {I(START, 2), I(END, 9), I(STEP, 3), D(DTYPE, HP_F32)},
     4,
     {"f32[3]"},
     NULL},
    {HP_OP_ARANGE, {0}, {I(START, 5), I(END, 2)}, 2, {"i64[0]"}, NULL},
    {HP_OP_ARANGE, {0}, {I(END, 4), I(STEP, 0)}, 2, {0}, "step 0"},
    /* fused transformer ops */
    {HP_OP_RMS_NORM, {"f32[2,5,8]", "f32[8]"}, {F(EPS, 1e-5)}, 1, {"f32[2,5,8]", "f32[2,5]"}, NULL},
    {HP_OP_RMS_NORM, {"bf16[2,8]", "bf16[8]"}, {F(EPS, 1e-5)}, 1, {"bf16[2,8]", "f32[2]"}, NULL},
    {HP_OP_RMS_NORM, {"f32[2,5,8]", "f32[7]"}, {F(EPS, 1e-5)}, 1, {0}, "weight [7] does not match"},
    {HP_OP_RMS_NORM, {"f32[2,8]", "f32[8]"}, {F(EPS, -1)}, 1, {0}, "'eps' is -1"},
    {HP_OP_RMS_NORM_BACKWARD,
     {"f32[2,8]", "f32[2,8]", "f32[8]", "f32[2]"},
     {{0}},
     0,
     {"f32[2,8]", "f32[8]"},
     NULL},
    {HP_OP_RMS_NORM_BACKWARD,
     {"f32[2,8]", "f32[2,8]", "f32[8]", "f32[3]"},
     {{0}},
     0,
     {0},
     "rstd does not match"},
    {HP_OP_ROTARY_EMB, {"f32[2,5,4,8]"}, {F(THETA, 500000)}, 1, {"f32[2,5,4,8]"}, NULL},
    {HP_OP_ROTARY_EMB, {"f32[2,5,4,7]"}, {F(THETA, 500000)}, 1, {0}, "head dim 7 must be even"},
    {HP_OP_ROTARY_EMB, {"f32[5,4,8]"}, {F(THETA, 500000)}, 1, {0}, "must have rank 4"},
    {HP_OP_SDPA,
     {"f32[2,8,5,16]", "f32[2,2,5,16]", "f32[2,2,5,16]"},
     {F(SCALE, 0.25), I(CAUSAL, 1)},
     2,
     {"f32[2,8,5,16]", "f32[2,8,5]"},
     NULL},
    {HP_OP_SDPA,
     {"f32[2,8,5,16]", "f32[2,3,5,16]", "f32[2,3,5,16]"},
     {F(SCALE, 0.25)},
     1,
     {0},
     "q heads 8 are not a multiple of kv heads 3"},
    {HP_OP_SDPA,
     {"f32[2,8,5,16]", "f32[2,2,5,8]", "f32[2,2,5,16]"},
     {F(SCALE, 0.25)},
     1,
     {0},
     "differ in head dim"},
    {HP_OP_SDPA_BACKWARD,
     {"f32[2,8,5,16]", "f32[2,8,5,16]", "f32[2,2,5,16]", "f32[2,2,5,16]", "f32[2,8,5,16]",
      "f32[2,8,5]"},
     {F(SCALE, 0.25), I(CAUSAL, 1)},
     2,
     {"f32[2,8,5,16]", "f32[2,2,5,16]", "f32[2,2,5,16]"},
     NULL},
    {HP_OP_SDPA_BACKWARD,
     {"f32[2,8,5,16]", "f32[2,8,5,16]", "f32[2,2,5,16]", "f32[2,2,5,16]", "f32[2,8,5,16]",
      "f32[2,8,4]"},
     {F(SCALE, 0.25)},
     1,
     {0},
     "logsumexp does not match"},
    /* collectives */
    {HP_OP_ALL_GATHER, {"f32[3,4]"}, {I(GROUP_SIZE, 4)}, 1, {"f32[12,4]"}, NULL},
    {HP_OP_ALL_GATHER, {"f32[3,4]"}, {I(GROUP_SIZE, 0)}, 1, {0}, "group_size 0"},
    {HP_OP_REDUCE_SCATTER,
     {"f32[12,4]"},
     {I(GROUP_SIZE, 4), I(REDUCE_OP, 1)},
     2,
     {"f32[3,4]"},
     NULL},
    {HP_OP_REDUCE_SCATTER,
     {"f32[10,4]"},
     {I(GROUP_SIZE, 4), I(REDUCE_OP, 1)},
     2,
     {0},
     "not divisible by group_size 4"},
    {HP_OP_ALL_REDUCE, {"f32[10]"}, {I(GROUP_SIZE, 4), I(REDUCE_OP, 0)}, 2, {"f32[10]"}, NULL},
    {HP_OP_ALL_REDUCE, {"f32[10]"}, {I(GROUP_SIZE, 4), I(REDUCE_OP, 7)}, 2, {0}, "reduce_op 7"},
    {HP_OP_ALL_TO_ALL, {"f32[8,3]"}, {I(GROUP_SIZE, 4)}, 1, {"f32[8,3]"}, NULL},
    {HP_OP_ALL_TO_ALL, {"f32[]"}, {I(GROUP_SIZE, 1)}, 1, {0}, "rank >= 1"},
    {HP_OP_ALL_TO_ALL, {"f32[1,4,3]"}, {I(GROUP_SIZE, 4)}, 1, {"f32[1,4,3]"}, NULL},
    {HP_OP_ALL_TO_ALL, {"f32[2,3]"}, {I(GROUP_SIZE, 4)}, 1, {0}, "not divisible"},
    {HP_OP_LOCAL_CHUNK, {"f32[8,6]"}, {I(DIM, 1), I(GROUP_SIZE, 3)}, 2, {"f32[8,2]"}, NULL},
    {HP_OP_LOCAL_CHUNK, {"f32[8,6]"}, {I(DIM, 1), I(GROUP_SIZE, 4)}, 2, {0}, "not divisible"},
    {HP_OP_WAIT_TENSOR, {"f32[8,3]"}, {{0}}, 0, {"f32[8,3]"}, NULL},
    {HP_OP_WAIT_TENSOR, {0}, {{0}}, 0, {0}, "takes 1 inputs, got 0"},
};

/* Builds data placeholders for the inputs, then the op; returns the graph. */
static hp_graph *run_case(const shape_case *c, hp_value *v) {
    hp_graph *g = hp_graph_new();
    hp_value in[6];
    int n_in = 0;
    while (n_in < 6 && c->in[n_in]) {
        in[n_in] = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ty(c->in[n_in]), NULL);
        n_in++;
    }
    cr_assert(!hp_graph_failed(g), "placeholder: %s", g->err.msg);
    *v = hp_build(g, c->op, in, n_in, c->attrs, c->n_attrs);
    return g;
}

Test(shape_rules, every_case) {
    for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) {
        const shape_case *c = &cases[i];
        const char *name = hp_op_get(c->op)->name;
        hp_value v;
        hp_graph *g = run_case(c, &v);
        if (c->err) {
            cr_expect(hp_graph_failed(g), "case %zu (%s): accepted, expected '%s'", i, name,
                      c->err);
            if (hp_graph_failed(g)) {
                cr_expect(strstr(g->err.msg, c->err), "case %zu (%s): message '%s' lacks '%s'", i,
                          name, g->err.msg, c->err);
                cr_expect(strstr(g->err.msg, name), "case %zu: message '%s' does not name the op",
                          i, g->err.msg);
            }
        } else {
            cr_expect(!hp_graph_failed(g), "case %zu (%s): rejected: %s", i, name, g->err.msg);
            if (!hp_graph_failed(g)) {
                const hp_node *n = &g->nodes[v.node];
                for (int k = 0; k < n->n_out; k++) {
                    char buf[96];
                    cr_expect_str_eq(hp_type_str(&n->out[k], buf, sizeof buf), c->out[k],
                                     "case %zu (%s) output %d", i, name, k);
                }
                hp_err e;
                cr_expect(hp_graph_verify(g, &e) == HP_OK, "case %zu: verify: %s", i, e.msg);
            }
        }
        hp_graph_free(g);
    }
}

Test(shape_rules, every_op_has_accept_and_reject_cases) {
    for (int op = 0; op < HP_OP_COUNT; op++) {
        if (op == HP_OP_PLACEHOLDER) continue; /* covered in test_graph.c */
        bool ok = false, bad = false;
        for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) {
            if ((int)cases[i].op != op) continue;
            if (cases[i].err)
                bad = true;
            else
                ok = true;
        }
        cr_expect(ok && bad, "op %s lacks an %s case", hp_op_get((hp_op)op)->name,
                  ok ? "rejecting" : "accepting");
    }
}

Test(shape_rules, sticky_error_keeps_the_first_failure) {
    hp_graph *g = hp_graph_new();
    hp_value a = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ty("f32[8,256]"), NULL);
    hp_value b = hp_build_placeholder(g, HP_INPUT_DATA, NULL, ty("f32[128,768]"), NULL);
    hp_value c = hp_mm(g, a, b);
    cr_assert(!hp_value_ok(c));
    hp_value d = hp_neg(g, c);
    cr_assert(!hp_value_ok(d));
    hp_err e;
    cr_assert_eq(hp_graph_status(g, &e), HP_INVALID);
    cr_assert_str_eq(e.msg, "node 2 (mm): inner dims differ: [8,256] x [128,768]");
    cr_assert_eq(g->n_nodes, 2);
    hp_graph_free(g);
}
