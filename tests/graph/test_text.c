/* The .hpir text form: print/parse round trips over every op, every attribute kind, special
 * floats and every model builder; the golden file; the file helpers. Bad input, fuzzing and
 * fault injection live in test_text_errors.c. */
#include "hp/build.h"
#include "hp/models.h"
#include "hp/text.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TY(dt, ...)                                                                                \
    hp_type_make(HP_##dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),               \
                 (int64_t[]){__VA_ARGS__})
#define TY0(dt) hp_type_make(HP_##dt, 0, NULL)
#define INTS(k, ...)                                                                               \
    hp_attr_ints(HP_ATTR_##k, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),           \
                 (int64_t[]){__VA_ARGS__})

static hp_value data(hp_graph *g, hp_type t) {
    return hp_build_placeholder(g, HP_INPUT_DATA, NULL, t, NULL);
}

static hp_value op_n(hp_graph *g, hp_op op, const hp_value *in, int n_in, const hp_attr *a,
                     int n_a) {
    return hp_build(g, op, in, n_in, a, n_a);
}
#define OP(g, op, ins, attrs)                                                                      \
    op_n(g, HP_OP_##op, ins, (int)HP_ARRAY_LEN(ins), attrs, (int)HP_ARRAY_LEN(attrs))
#define OPI(g, op, ins) op_n(g, HP_OP_##op, ins, (int)HP_ARRAY_LEN(ins), NULL, 0)

/* Prints g, parses it back, and checks the graph and the text both survive. Returns the text
 * (caller frees). */
static char *round_trip(const hp_graph *g) {
    hp_err err = {0};
    char *text = NULL, *again = NULL;
    size_t len = 0;
    hp_graph *back = NULL;
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "input graph invalid: %s", err.msg);
    cr_assert_eq(hp_graph_print(g, &text, &len, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(strlen(text), len);
    hp_status s = hp_graph_parse(text, len, &back, &err);
    cr_assert_eq(s, HP_OK, "parse failed: %s\n%s", err.msg, text);
    cr_assert(hp_graph_eq(g, back), "round trip changed the graph:\n%s", text);
    cr_assert_eq(hp_graph_print(back, &again, NULL, &err), HP_OK);
    cr_assert_str_eq(again, text);
    hp_free(again);
    hp_graph_free(back);
    return text;
}

/* One small valid instance of op, on fresh data placeholders; returns its output 0. */
static hp_value build_op(hp_graph *g, hp_op op) {
    switch (op) {
    case HP_OP_PLACEHOLDER: {
        /* an FSDP shard too: rows of a [7, 3] parameter split over 2 ranks */
        hp_attr sh[5] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_PARAM),
                         hp_attr_str(HP_ATTR_FQN, "w_shard"),
                         hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, 2, (int64_t[]){7, 3}),
                         hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_str(HP_ATTR_GROUP, "dp")};
        hp_type shard = TY(F32, 4, 3);
        cr_assert_geq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &shard, 1, sh, 5, NULL), 0);
        hp_init init = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 0.02};
        return hp_build_placeholder(g, HP_INPUT_PARAM, "w", TY(F32, 4, 3), &init);
    }
    case HP_OP_FULL:
        return hp_full(g, 2, (int64_t[]){2, 3}, 0.5, HP_F16);
    case HP_OP_ZEROS:
        return hp_zeros(g, 1, (int64_t[]){5}, HP_BF16);
    case HP_OP_ONES:
        return hp_ones(g, 0, NULL, HP_I32);
    case HP_OP_ADD:
    case HP_OP_SUB:
    case HP_OP_MUL:
    case HP_OP_DIV:
    case HP_OP_MAXIMUM:
    case HP_OP_EQ:
    case HP_OP_LT: {
        hp_value a = data(g, TY(F32, 2, 3)), b = data(g, TY(F32, 3));
        return hp_bin(g, op, a, b);
    }
    case HP_OP_WHERE: {
        hp_value c = data(g, TY(BOOL, 2, 3)), a = data(g, TY(F32, 2, 3)), b = data(g, TY0(F32));
        return hp_where(g, c, a, b);
    }
    case HP_OP_ADD_SCALAR:
        return hp_add_scalar(g, data(g, TY(F32, 2, 3)), -1.5);
    case HP_OP_MUL_SCALAR:
        return hp_mul_scalar(g, data(g, TY(BF16, 2, 3)), 0.1);
    case HP_OP_POW:
        return hp_pow(g, data(g, TY(F32, 2, 3)), 1.0 / 3.0);
    case HP_OP_NEG:
    case HP_OP_EXP:
    case HP_OP_LOG:
    case HP_OP_SQRT:
    case HP_OP_RSQRT:
    case HP_OP_TANH:
    case HP_OP_SIN:
    case HP_OP_COS:
    case HP_OP_ERF:
    case HP_OP_SIGMOID:
    case HP_OP_SILU:
    case HP_OP_RELU:
    case HP_OP_CLONE:
    case HP_OP_DETACH:
    case HP_OP_T:
        return hp_un(g, op, data(g, TY(F32, 2, 3)));
    case HP_OP_GELU:
        return hp_un1(g, op, data(g, TY(F32, 2, 3)), hp_attr_int(HP_ATTR_APPROXIMATE, 1));
    case HP_OP_TO_COPY:
        return hp_to(g, data(g, TY(F32, 2, 3)), HP_BF16);
    case HP_OP_TANH_BACKWARD:
    case HP_OP_SIGMOID_BACKWARD:
    case HP_OP_SILU_BACKWARD: {
        hp_value a = data(g, TY(F32, 2, 3)), b = data(g, TY(F32, 2, 3));
        return hp_bin(g, op, a, b);
    }
    case HP_OP_GELU_BACKWARD:
    case HP_OP_THRESHOLD_BACKWARD: {
        hp_value in[2] = {data(g, TY(F32, 2, 3)), data(g, TY(F32, 2, 3))};
        hp_attr a[1] = {op == HP_OP_GELU_BACKWARD ? hp_attr_int(HP_ATTR_APPROXIMATE, 0)
                                                  : hp_attr_float(HP_ATTR_VALUE, 0)};
        return hp_build(g, op, in, 2, a, 1);
    }
    case HP_OP_SUM:
        return hp_sum(g, data(g, TY(F32, 2, 3, 4)), 2, ((int64_t[]){0, -1}), true);
    case HP_OP_MEAN:
        return hp_mean(g, data(g, TY(F32, 2, 3)), 0, NULL, false);
    case HP_OP_AMAX:
        return hp_amax(g, data(g, TY(F32, 2, 3)), 1, ((int64_t[]){1}), false);
    case HP_OP_VIEW:
        return hp_view(g, data(g, TY(F32, 2, 3)), 2, (int64_t[]){3, -1});
    case HP_OP_RESHAPE: {
        hp_attr a[] = {INTS(SHAPE, 6)};
        hp_value in[] = {data(g, TY(F32, 2, 3))};
        return OP(g, RESHAPE, in, a);
    }
    case HP_OP_PERMUTE:
        return hp_permute(g, data(g, TY(F32, 2, 3, 4)), 3, (int64_t[]){2, 0, 1});
    case HP_OP_TRANSPOSE:
        return hp_transpose(g, data(g, TY(F32, 2, 3, 4)), 0, -1);
    case HP_OP_EXPAND:
        return hp_expand(g, data(g, TY(F32, 1, 3)), 3, (int64_t[]){5, 4, -1});
    case HP_OP_SLICE:
        return hp_slice(g, data(g, TY(F32, 2, 7)), 1, 1, -1, 2);
    case HP_OP_SLICE_BACKWARD: {
        hp_attr a[] = {INTS(SHAPE, 2, 7), hp_attr_int(HP_ATTR_DIM, 1),
                       hp_attr_int(HP_ATTR_START, 1), hp_attr_int(HP_ATTR_END, -1),
                       hp_attr_int(HP_ATTR_STEP, 2)};
        hp_value in[] = {data(g, TY(F32, 2, 3))};
        return OP(g, SLICE_BACKWARD, in, a);
    }
    case HP_OP_CAT: {
        hp_value xs[3] = {data(g, TY(F32, 2, 3)), data(g, TY(F32, 1, 3)), data(g, TY(F32, 4, 3))};
        return hp_cat(g, xs, 3, 0);
    }
    case HP_OP_UNSQUEEZE:
        return hp_unsqueeze(g, data(g, TY(F32, 2, 3)), -1);
    case HP_OP_SQUEEZE:
        return hp_squeeze(g, data(g, TY(F32, 2, 1, 3)), 1);
    case HP_OP_MM: {
        hp_value a = data(g, TY(F32, 2, 3)), b = data(g, TY(F32, 3, 4));
        return hp_mm(g, a, b);
    }
    case HP_OP_BMM: {
        hp_value a = data(g, TY(F32, 5, 2, 3)), b = data(g, TY(F32, 5, 3, 4));
        return hp_bmm(g, a, b);
    }
    case HP_OP_ADDMM: {
        hp_value in[] = {data(g, TY(F32, 4)), data(g, TY(F32, 2, 3)), data(g, TY(F32, 3, 4))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_ALPHA, 0.5), hp_attr_float(HP_ATTR_BETA, 2)};
        return OP(g, ADDMM, in, a);
    }
    case HP_OP_EMBEDDING: {
        hp_value in[] = {data(g, TY(F32, 10, 4)), data(g, TY(I64, 2, 3))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_PADDING_IDX, -1)};
        return OP(g, EMBEDDING, in, a);
    }
    case HP_OP_EMBEDDING_DENSE_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(I32, 2, 3))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 10), hp_attr_int(HP_ATTR_PADDING_IDX, 0)};
        return OP(g, EMBEDDING_DENSE_BACKWARD, in, a);
    }
    case HP_OP_CHUNKED_EMBEDDING: {
        hp_value in[] = {data(g, TY(F32, 10, 4)), data(g, TY(I64, 2, 3)), data(g, TY(I64, 2))};
        return hp_build(g, op, in, 3, NULL, 0);
    }
    case HP_OP_CHUNKED_EMBEDDING_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(I32, 2, 3)), data(g, TY(I32, 5))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 10)};
        return OP(g, CHUNKED_EMBEDDING_BACKWARD, in, a);
    }
    case HP_OP_LOCAL_CHUNK: {
        hp_value in[] = {data(g, TY(F32, 2, 6))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_DIM, 1), hp_attr_int(HP_ATTR_GROUP_SIZE, 3),
                       hp_attr_str(HP_ATTR_GROUP, "tp")};
        return OP(g, LOCAL_CHUNK, in, a);
    }
    case HP_OP_LOG_SOFTMAX:
    case HP_OP_SOFTMAX:
        return hp_un1(g, op, data(g, TY(F32, 2, 3)), hp_attr_int(HP_ATTR_DIM, -1));
    case HP_OP_LOG_SOFTMAX_BACKWARD:
    case HP_OP_SOFTMAX_BACKWARD: {
        hp_value in[2] = {data(g, TY(F32, 2, 3)), data(g, TY(F32, 2, 3))};
        hp_attr a = hp_attr_int(HP_ATTR_DIM, 1);
        return hp_build(g, op, in, 2, &a, 1);
    }
    case HP_OP_NLL_LOSS_FORWARD: {
        hp_value in[] = {data(g, TY(F32, 4, 5)), data(g, TY(I64, 4))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_MEAN),
                       hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
        return OP(g, NLL_LOSS_FORWARD, in, a);
    }
    case HP_OP_NLL_LOSS_BACKWARD: {
        hp_value in[] = {data(g, TY0(F32)), data(g, TY(F32, 4, 5)), data(g, TY(I64, 4)),
                         data(g, TY0(F32))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_SUM)};
        return OP(g, NLL_LOSS_BACKWARD, in, a);
    }
    case HP_OP_FUSED_CROSS_ENTROPY: {
        hp_value in[] = {data(g, TY(BF16, 4, 5)), data(g, TY(I32, 4))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_SUM),
                       hp_attr_int(HP_ATTR_IGNORE_INDEX, 3)};
        return OP(g, FUSED_CROSS_ENTROPY, in, a);
    }
    case HP_OP_SWIGLU: {
        hp_value in[] = {data(g, TY(BF16, 3, 8)), data(g, TY(BF16, 3, 8))};
        return hp_build(g, HP_OP_SWIGLU, in, 2, NULL, 0);
    }
    case HP_OP_SWIGLU_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 3, 8)), data(g, TY(F32, 3, 8)), data(g, TY(F32, 3, 8))};
        return hp_build(g, HP_OP_SWIGLU_BACKWARD, in, 3, NULL, 0);
    }
    case HP_OP_FUSED_CROSS_ENTROPY_BACKWARD: {
        hp_value in[] = {data(g, TY0(F32)), data(g, TY(F32, 4, 5)), data(g, TY(I64, 4)),
                         data(g, TY(F32, 4)), data(g, TY0(F32))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_MEAN)};
        return OP(g, FUSED_CROSS_ENTROPY_BACKWARD, in, a);
    }
    case HP_OP_RMS_NORM: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(F32, 4))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_EPS, 1e-5)};
        return OP(g, RMS_NORM, in, a);
    }
    case HP_OP_RMS_NORM_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(F32, 2, 3, 4)), data(g, TY(F32, 4)),
                         data(g, TY(F32, 2, 3))};
        return OPI(g, RMS_NORM_BACKWARD, in);
    }
    case HP_OP_LAYER_NORM: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(F32, 4)), data(g, TY(F32, 4))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_EPS, 1e-5)};
        return OP(g, LAYER_NORM, in, a);
    }
    case HP_OP_LAYER_NORM_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 2, 3, 4)), data(g, TY(F32, 2, 3, 4)),
                         data(g, TY(F32, 2, 3, 1)), data(g, TY(F32, 2, 3, 1)), data(g, TY(F32, 4))};
        return OPI(g, LAYER_NORM_BACKWARD, in);
    }
    case HP_OP_TRIL:
        return hp_un1(g, op, data(g, TY(BOOL, 4, 4)), hp_attr_int(HP_ATTR_DIAGONAL, -1));
    case HP_OP_NATIVE_DROPOUT: { /* an FSDP-split one: global_shape */
        hp_attr a[] = {hp_attr_float(HP_ATTR_P, 0.1), hp_attr_str(HP_ATTR_FQN, "h.0.drop#0"),
                       INTS(GLOBAL_SHAPE, 4, 3)};
        hp_value in[] = {data(g, TY(BF16, 2, 3))};
        return OP(g, NATIVE_DROPOUT, in, a);
    }
    case HP_OP_NATIVE_DROPOUT_BACKWARD: {
        hp_attr a[] = {hp_attr_float(HP_ATTR_SCALE, 1.0 / 0.9)};
        hp_value in[] = {data(g, TY(F32, 2, 3)), data(g, TY(BOOL, 2, 3))};
        return OP(g, NATIVE_DROPOUT_BACKWARD, in, a);
    }
    case HP_OP_BITWISE_NOT: {
        hp_value x = data(g, TY(BOOL, 2, 3));
        return hp_build(g, op, &x, 1, NULL, 0);
    }
    case HP_OP_ARANGE: {
        hp_attr a[] = {hp_attr_int(HP_ATTR_START, 2), hp_attr_int(HP_ATTR_END, 11),
                       hp_attr_int(HP_ATTR_STEP, 3), hp_attr_dtype(HP_ATTR_DTYPE, HP_I32)};
        return hp_build(g, op, NULL, 0, a, 4);
    }
    case HP_OP_ROTARY_EMB: {
        hp_value in[] = {data(g, TY(F32, 1, 4, 2, 6))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_THETA, 500000), hp_attr_int(HP_ATTR_INVERSE, 1)};
        return OP(g, ROTARY_EMB, in, a);
    }
    case HP_OP_SDPA: {
        hp_value in[] = {data(g, TY(F32, 1, 4, 3, 8)), data(g, TY(F32, 1, 2, 3, 8)),
                         data(g, TY(F32, 1, 2, 3, 8))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_SCALE, 1 / sqrt(8.0)), hp_attr_int(HP_ATTR_CAUSAL, 1)};
        return OP(g, SDPA, in, a);
    }
    case HP_OP_SDPA_BACKWARD: {
        hp_value in[] = {data(g, TY(F32, 1, 4, 3, 8)), data(g, TY(F32, 1, 4, 3, 8)),
                         data(g, TY(F32, 1, 2, 3, 8)), data(g, TY(F32, 1, 2, 3, 8)),
                         data(g, TY(F32, 1, 4, 3, 8)), data(g, TY(F32, 1, 4, 3))};
        hp_attr a[] = {hp_attr_float(HP_ATTR_SCALE, 0.125), hp_attr_int(HP_ATTR_CAUSAL, 0)};
        return OP(g, SDPA_BACKWARD, in, a);
    }
    case HP_OP_ALL_GATHER: {
        hp_value in[] = {data(g, TY(F32, 2, 3))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 4), hp_attr_str(HP_ATTR_GROUP, "dp")};
        return OP(g, ALL_GATHER, in, a);
    }
    case HP_OP_REDUCE_SCATTER:
    case HP_OP_ALL_REDUCE: {
        hp_value in[] = {data(g, TY(F32, 8, 3))};
        hp_attr a[] = {
            hp_attr_int(HP_ATTR_GROUP_SIZE, 4),
            hp_attr_int(HP_ATTR_REDUCE_OP, op == HP_OP_ALL_REDUCE ? HP_REDUCE_MAX : HP_REDUCE_AVG)};
        return hp_build(g, op, in, 1, a, 2);
    }
    case HP_OP_ALL_TO_ALL: {
        hp_value in[] = {data(g, TY(BF16, 8, 3))};
        hp_attr a[] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 4), hp_attr_str(HP_ATTR_GROUP, "tp")};
        return OP(g, ALL_TO_ALL, in, a);
    }
    case HP_OP_WAIT_TENSOR: {
        hp_value x = data(g, TY(F32, 2, 3));
        hp_attr a[] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_int(HP_ATTR_REDUCE_OP, 0)};
        hp_value pending = hp_build(g, HP_OP_ALL_REDUCE, &x, 1, a, 2);
        return hp_un(g, op, pending);
    }
    case HP_OP_COUNT:
        break;
    }
    return HP_NO_VALUE;
}

/* Every op, and through them every attribute key, prints and parses back. */
Test(text, every_op_round_trips) {
    uint64_t keys = 0;
    for (int op = 0; op < HP_OP_COUNT; op++) {
        const char *name = hp_op_get((hp_op)op)->name;
        hp_graph *g = hp_graph_new();
        cr_assert(g);
        hp_value v = build_op(g, (hp_op)op);
        hp_err err = {0};
        hp_graph_status(g, &err);
        cr_assert(hp_value_ok(v), "no valid test case for op %s: %s", name, err.msg);
        cr_assert_eq(g->nodes[v.node].op, (hp_op)op, "case for %s builds another op", name);
        for (int k = 0; k < g->nodes[v.node].n_out; k++)
            cr_assert_eq(hp_graph_add_output(g, hp_out(v, k), &err), HP_OK);
        char *text = round_trip(g);
        cr_assert(strstr(text, name), "%s not printed:\n%s", name, text);
        for (int i = 0; i < g->n_nodes; i++)
            for (int k = 0; k < g->nodes[i].n_attrs; k++)
                keys |= UINT64_C(1) << g->nodes[i].attrs[k].key;
        hp_free(text);
        hp_graph_free(g);
    }
    for (int k = 0; k < HP_ATTR_COUNT; k++)
        cr_expect(keys & (UINT64_C(1) << k), "no op case uses attribute '%s'",
                  hp_attr_key_name((hp_attr_key)k));
}

static hp_value param(hp_graph *g, const char *fqn, hp_type t, hp_init init) {
    return hp_build_placeholder(g, HP_INPUT_PARAM, fqn, t, &init);
}

Test(text, attribute_kinds_and_names) {
    hp_graph *g = hp_graph_new();
    /* every init kind, strings needing escapes and a name of the maximum length */
    char longname[HP_MAX_STR + 1];
    memset(longname, 'n', HP_MAX_STR);
    longname[HP_MAX_STR] = 0;
    hp_value p[7];
    p[0] = param(g, "a.weight", TY(F32, 3), (hp_init){.kind = HP_INIT_ZEROS});
    p[1] = param(g, "b\"q\\uo\nte", TY(F32, 3), (hp_init){.kind = HP_INIT_ONES});
    p[2] =
        param(g, "c\x01\x7f\xc3\xa9", TY(F32, 3), (hp_init){.kind = HP_INIT_CONSTANT, .a = -2.5});
    p[3] = param(g, longname, TY(F32, 3),
                 (hp_init){.kind = HP_INIT_NORMAL, .mean = 0.1, .std = 0.02 / sqrt(6.0)});
    p[4] = param(
        g, "e", TY(BF16, 3),
        (hp_init){.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 0.02, .a = -0.06, .b = 0.06});
    p[5] =
        param(g, "f", TY(F16, 3), (hp_init){.kind = HP_INIT_UNIFORM, .a = -1.0 / 3, .b = 1e-300});
    hp_value buf = hp_build_placeholder(g, HP_INPUT_BUFFER, "freqs", TY(F32, 3), NULL);
    hp_value tok = hp_build_placeholder(g, HP_INPUT_DATA, "tokens", TY(I64, 2, 3), NULL);
    p[6] = hp_add(g, p[0], p[1]);
    hp_value rs = hp_build(g, HP_OP_REDUCE_SCATTER, &buf, 1,
                           (hp_attr[]){hp_attr_int(HP_ATTR_GROUP_SIZE, 3),
                                       hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_SUM),
                                       hp_attr_str(HP_ATTR_GROUP, "")},
                           3);
    hp_value outs[] = {p[6], p[2], p[3], p[4], p[5], rs, tok};
    cr_assert_eq(hp_graph_set_outputs(g, outs, (int)HP_ARRAY_LEN(outs), NULL), HP_OK);
    hp_err err = {0};
    cr_assert_eq(hp_graph_status(g, &err), HP_OK, "%s", err.msg);
    char *text = round_trip(g);
    cr_assert(strstr(text, "fqn=\"b\\\"q\\\\uo\\nte\""), "%s", text);
    cr_assert(strstr(text, "fqn=\"c\\x01\\x7f\\xc3\\xa9\""), "%s", text);
    cr_assert(strstr(text, "kind=buffer"), "%s", text);
    cr_assert(strstr(text, "kind=data"), "%s", text);
    cr_assert(strstr(text, "reduce_op=sum"), "%s", text);
    cr_assert(strstr(text, "group=\"\""), "%s", text);
    cr_assert(strstr(text, "init=uniform("), "%s", text);
    cr_assert(strstr(text, "init=trunc_normal("), "%s", text);
    hp_free(text);
    hp_graph_free(g);
}

Test(text, special_floats_round_trip_exactly) {
    const double vals[] = {0.0,
                           -0.0,
                           INFINITY,
                           -INFINITY,
                           NAN,
                           -NAN,
                           0.1,
                           1.0 / 3,
                           1e-5,
                           5e-324,
                           DBL_MIN,
                           DBL_MAX,
                           -1e300,
                           123456789.0,
                           1e22,
                           2.5e-8,
                           0.30000000000000004};
    hp_graph *g = hp_graph_new();
    hp_value x = data(g, TY(F32, 2));
    hp_value outs[HP_ARRAY_LEN(vals)];
    for (size_t i = 0; i < HP_ARRAY_LEN(vals); i++) outs[i] = hp_mul_scalar(g, x, vals[i]);
    cr_assert_eq(hp_graph_set_outputs(g, outs, (int)HP_ARRAY_LEN(outs), NULL), HP_OK);
    char *text = round_trip(g);
    const char *want[] = {"value=0}",      "value=-0}",   "value=inf}", "value=-inf}",
                          "value=nan}",    "value=-nan}", "value=0.1}", "value=1e-05}",
                          "value=5e-324}", "value=1e+22}"};
    for (size_t i = 0; i < HP_ARRAY_LEN(want); i++)
        cr_assert(strstr(text, want[i]), "%s not in\n%s", want[i], text);
    /* the sign of zero and of nan survive (hp_graph_eq treats all nans alike) */
    hp_graph *back;
    cr_assert_eq(hp_graph_parse(text, strlen(text), &back, NULL), HP_OK);
    for (size_t i = 0; i < HP_ARRAY_LEN(vals); i++) {
        double v = back->nodes[outs[i].node].attrs[0].f;
        cr_assert_eq(signbit(v), signbit(vals[i]), "sign of value %zu", i);
        cr_assert(isnan(vals[i]) ? isnan(v) : v == vals[i], "value %zu", i);
    }
    hp_graph_free(back);
    hp_free(text);
    hp_graph_free(g);
}

/* ---- golden file ----------------------------------------------------------------------------- */

/* A two-layer MLP classifier (forward): the shape of what the model builders emit. */
static hp_graph *small_mlp(void) {
    hp_graph *g = hp_graph_new();
    hp_value w1 = param(g, "fc1.weight", TY(F32, 16, 8),
                        (hp_init){.kind = HP_INIT_NORMAL, .mean = 0, .std = 0.02});
    hp_value b1 = param(g, "fc1.bias", TY(F32, 16), (hp_init){.kind = HP_INIT_ZEROS});
    hp_value w2 = param(g, "fc2.weight", TY(F32, 3, 16),
                        (hp_init){.kind = HP_INIT_UNIFORM, .a = -0.25, .b = 0.25});
    hp_value b2 = param(g, "fc2.bias", TY(F32, 3), (hp_init){.kind = HP_INIT_ZEROS});
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", TY(F32, 4, 8), NULL);
    hp_value y = hp_build_placeholder(g, HP_INPUT_DATA, "labels", TY(I64, 4), NULL);
    hp_value in1[] = {b1, x, hp_t(g, w1)};
    hp_value h = hp_relu(g, OPI(g, ADDMM, in1));
    hp_value in2[] = {b2, h, hp_t(g, w2)};
    hp_value logits = OPI(g, ADDMM, in2);
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, logits, hp_attr_int(HP_ATTR_DIM, 1));
    hp_value nll_in[] = {logp, y};
    hp_attr nll_a[] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_MEAN),
                       hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
    hp_value loss = OP(g, NLL_LOSS_FORWARD, nll_in, nll_a);
    hp_value outs[] = {loss, hp_out(loss, 1)};
    cr_assert_eq(hp_graph_set_outputs(g, outs, 2, NULL), HP_OK);
    hp_err err = {0};
    cr_assert_eq(hp_graph_status(g, &err), HP_OK, "%s", err.msg);
    return g;
}

/* HP_UPDATE_GOLDEN=1 rewrites the file from the printer (then review the diff). */
Test(text, golden_small_mlp) {
    const char *path = HP_SOURCE_DIR "/tests/golden/small_mlp.hpir";
    hp_graph *g = small_mlp();
    char *text;
    hp_err err = {0};
    cr_assert_eq(hp_graph_print(g, &text, NULL, &err), HP_OK);
    if (getenv("HP_UPDATE_GOLDEN"))
        cr_assert_eq(hp_file_write_atomic(path, text, strlen(text), &err), HP_OK, "%s", err.msg);
    uint8_t *want;
    size_t len;
    cr_assert_eq(hp_file_read(path, 1 << 20, &want, &len, &err), HP_OK, "%s", err.msg);
    cr_assert_str_eq(text, (const char *)want, "printer output differs from %s", path);
    hp_graph *back;
    cr_assert_eq(hp_graph_read_file(path, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_graph_eq(g, back));
    hp_graph_free(back);
    hp_free(want);
    hp_free(text);
    hp_graph_free(g);
}

/* The reader is liberal in what people write by hand: comments, blank lines, CRLF, spacing,
 * attribute order, %N.0. */
Test(text, hand_written_forms) {
    const char *text = "# a comment before the header\n"
                       "\n"
                       "hpir 1   # version\r\n"
                       "%0:f32[2,3]=placeholder(){fqn=\"x\",kind=2}\r\n"
                       "\t%1 : f32[3] = sum ( %0.0 ) { keepdim = 0 , dims = [ 0 ] }\n"
                       "  # indented comment\n"
                       "%2: f32[3] = mul_scalar(%1) {value=+2.5e0}\n"
                       "%3: f32[3] = mul_scalar(%2) {value=-.5}\n"
                       "%4: f32[3] = all_reduce(%3) {group_size=2, reduce_op=1}\n"
                       "return %4, %1.0   # trailing comment\n"
                       "\n# end\n";
    hp_graph *g;
    hp_err err = {0};
    cr_assert_eq(hp_graph_parse(text, strlen(text), &g, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(g->n_nodes, 5);
    cr_assert_eq(hp_node_int(&g->nodes[0], HP_ATTR_KIND, -1), HP_INPUT_DATA);
    cr_assert_eq(hp_node_float(&g->nodes[2], HP_ATTR_VALUE, 0), 2.5);
    cr_assert_eq(hp_node_float(&g->nodes[3], HP_ATTR_VALUE, 0), -0.5);
    cr_assert_eq(hp_node_int(&g->nodes[4], HP_ATTR_REDUCE_OP, -1), HP_REDUCE_AVG);
    cr_assert_eq(g->n_outputs, 2);
    cr_assert_eq(g->outputs[1].node, 1);
    hp_free(round_trip(g));
    hp_graph_free(g);
    /* without a final newline, and with no outputs */
    const char *bare = "hpir 1\n%0: f32[] = zeros() {shape=[]}\nreturn";
    cr_assert_eq(hp_graph_parse(bare, strlen(bare), &g, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(g->n_outputs, 0);
    hp_graph_free(g);
}

Test(text, node_str) {
    hp_graph *g = small_mlp();
    char buf[128], tiny[12];
    cr_assert_str_eq(hp_node_str(g, 6, buf, sizeof buf), "%6: f32[8,16] = t(%0)");
    cr_assert_str_eq(hp_node_str(g, 1, buf, sizeof buf),
                     "%1: f32[16] = placeholder() {kind=param, fqn=\"fc1.bias\", init=zeros}");
    cr_assert_str_eq(hp_node_str(g, 6, tiny, sizeof tiny), "%6: f32[8,1");
    cr_assert_str_eq(hp_node_str(g, 99, buf, sizeof buf), "%99: <no such node>");
    hp_graph_free(g);
}

Test(text, files) {
    char dir[] = "/tmp/hp_text_XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256], bad[256], missing[256];
    snprintf(path, sizeof path, "%s/g.hpir", dir);
    snprintf(bad, sizeof bad, "%s/bad.hpir", dir);
    snprintf(missing, sizeof missing, "%s/missing.hpir", dir);
    hp_graph *g = small_mlp(), *back;
    hp_err err = {0};

    cr_assert_eq(hp_graph_write_file(g, path, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_read_file(path, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_graph_eq(g, back));
    hp_graph_free(back);

    /* errors carry the path */
    FILE *f = fopen(bad, "w");
    fputs("hpir 1\n%0: f32[] = frobnicate()\n", f);
    fclose(f);
    cr_assert_eq(hp_graph_read_file(bad, &back, &err), HP_PARSE);
    cr_assert_null(back);
    cr_assert(strstr(err.msg, bad) && strstr(err.msg, "line 2:13: unknown op 'frobnicate'"), "%s",
              err.msg);
    cr_assert_eq(hp_graph_read_file(missing, &back, &err), HP_IO);
    cr_assert(strstr(err.msg, missing), "%s", err.msg);

    /* fprint writes what print returns */
    char *text;
    cr_assert_eq(hp_graph_print(g, &text, NULL, &err), HP_OK);
    f = fopen(path, "w+");
    cr_assert_eq(hp_graph_fprint(g, f, &err), HP_OK);
    rewind(f);
    char got[4096] = {0};
    cr_assert_eq(fread(got, 1, sizeof got - 1, f), strlen(text));
    cr_assert_str_eq(got, text);
    fclose(f);

    hp_free(text);
    hp_graph_free(g);
    unlink(path);
    unlink(bad);
    rmdir(dir);
}

/* ---- every model builder --------------------------------------------------------------------- */

static void model_round_trip(const char *name, bool joint, void (*tweak)(hp_model_spec *)) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse(name, &spec, &err), HP_OK, "%s", err.msg);
    if (tweak) tweak(&spec);
    hp_graph *g;
    hp_status s = joint ? hp_model_build_joint(&spec, &g, &err) : hp_model_build(&spec, &g, &err);
    cr_assert_eq(s, HP_OK, "%s: %s", name, err.msg);
    hp_free(round_trip(g));
    hp_graph_free(g);
}

static void tiny_llama(hp_model_spec *s) {
    s->batch = 2, s->seq = 8, s->dim = 64, s->n_layers = 2, s->n_heads = 4, s->n_kv_heads = 2;
    s->ffn_hidden = 96, s->vocab = 128;
}

Test(text, models_round_trip) {
    model_round_trip("llama3:debugmodel", false, tiny_llama);
    model_round_trip("llama3:debugmodel", true, tiny_llama);
    model_round_trip("llama3:debugmodel", true, NULL);
    model_round_trip("llama3:8B", true, NULL);
    model_round_trip("llama3:405B", true, NULL); /* ~13k nodes, well under a second */
    model_round_trip("mlp", false, NULL);
    model_round_trip("mlp", true, NULL);
}

/* ---- placements ------------------------------------------------------------------------------ */

Test(text, placements_and_the_mesh_print_and_parse_back) {
    /* the text above is syntax only: check it parses into the right structures, then that a
     * printed graph reads back equal */
    hp_graph *g = hp_graph_new();
    hp_graph_mesh m = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_err err = {0};
    cr_assert_eq(hp_graph_set_mesh(g, &m, &err), HP_OK, "%s", err.msg);
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w",
                                      hp_type_make(HP_F32, 2, (int64_t[]){16, 8}), NULL);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x",
                                      hp_type_make(HP_F32, 2, (int64_t[]){4, 8}), NULL);
    hp_value y = hp_mm(g, x, hp_t(g, w));
    cr_assert(!hp_graph_failed(g));
    /* x: the batch split over dp; w: column-parallel over tp (rows of [out, in]) */
    hp_placement pw[2] = {HP_REPLICATE, HP_SHARD(0)}, px[2] = {HP_SHARD(0), HP_REPLICATE};
    hp_placement pt[2] = {HP_REPLICATE, HP_SHARD(1)};
    hp_placement py[2] = {HP_SHARD(0), HP_SHARD(1)};
    cr_assert_eq(hp_node_set_placements(g, w.node, pw, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_node_set_placements(g, x.node, px, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_node_set_placements(g, w.node + 2, pt, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_node_set_placements(g, y.node, py, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_add_output(g, y, &err), HP_OK);
    char *text;
    size_t len;
    cr_assert_eq(hp_graph_print(g, &text, &len, &err), HP_OK);
    cr_assert(strstr(text, "mesh dp=2 tp=2\n"), "%s", text);
    cr_assert(strstr(text, "%0: f32[16,8] {dp:R, tp:S(0)} = placeholder()"), "%s", text);
    cr_assert(strstr(text, "%3: f32[4,16] {dp:S(0), tp:S(1)} = mm(%1, %2)"), "%s", text);
    hp_graph *back = NULL;
    cr_assert_eq(hp_graph_parse(text, len, &back, &err), HP_OK, "%s\n%s", err.msg, text);
    cr_assert(hp_graph_eq(g, back), "%s", text);
    cr_assert(hp_placement_eq(hp_value_placements(back, y)[1], HP_SHARD(1)));
    /* the verifier holds every value to its op's rules */
    hp_placement wrong[2] = {HP_PARTIAL(HP_REDUCE_AVG), HP_SHARD(1)};
    cr_assert_eq(hp_node_set_placements(g, y.node, wrong, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_verify(g, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "node 3 (mm): on mesh dim dp, (S(0), R) -> (P(avg)) is none of its "
                              "sharding rules"),
              "%s", err.msg);
    hp_free(text);
    hp_graph_free(back);
    hp_graph_free(g);
    /* several outputs each carry theirs; long words parse too */
    const char *multi = "hpir 1\nmesh dp=2\n"
                        "%0: f32[4,8] {dp:Shard(0)} = placeholder() {kind=data, fqn=\"x\"}\n"
                        "%1: f32[8] {dp:Replicate} = placeholder() {kind=data, fqn=\"w\"}\n"
                        "%2: (f32[4,8] {dp:S(0)}, f32[4] {dp:S(0)}) = _fused_rms_norm(%0, %1) "
                        "{eps=1e-05}\n"
                        "return %2.1\n";
    cr_assert_eq(hp_graph_parse(multi, strlen(multi), &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_placement_eq(hp_value_placements(back, (hp_value){2, 1})[0], HP_SHARD(0)));
    hp_graph_free(back);
}

Test(text, placement_errors_name_the_line) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"hpir 1\n%0: f32[4] {dp:R} = placeholder() {kind=data, fqn=\"x\"}\nreturn %0\n",
         "line 2:12: placements need a 'mesh NAME=N ...' line"},
        {"hpir 1\nmesh dp=2 tp=2\n%0: f32[4] {tp:R, dp:R} = placeholder() {kind=data, "
         "fqn=\"x\"}\nreturn %0\n",
         "expected mesh dim 'dp' (placements follow the mesh order)"},
        {"hpir 1\nmesh dp=2\n%0: f32[4] {dp:S(1)} = placeholder() {kind=data, fqn=\"x\"}\n"
         "return %0\n",
         "Shard(d) with d below its rank 1"},
        {"hpir 1\nmesh dp=2\n%0: f32[4] {dp:Q} = placeholder() {kind=data, fqn=\"x\"}\n"
         "return %0\n",
         "placement 'Q': expected Replicate"},
        {"hpir 1\nmesh dp=2 dp=4\n%0: f32[4] = placeholder() {kind=data, fqn=\"x\"}\n"
         "return %0\n",
         "mesh dim 1: 'dp' repeats dim 0"},
        {"hpir 1\nmesh dp=0\nreturn\n", "size 0 is outside"},
        {"hpir 1\nmesh\nreturn\n", "expected mesh dims"},
        {"hpir 1\nmesh dp=2\n%0: f32[3,8] {dp:S(0)} = placeholder() {kind=data, fqn=\"x\", "
         "global_shape=[8,8]}\nreturn %0\n",
         "local type f32[3,8] does not match global f32[4,8] under its placements"},
        {"hpir 1\nmesh dp=2\n%0: f32[4,8] = placeholder() {kind=data, fqn=\"x\"}\nreturn %0\n",
         "node 0 (placeholder): no placements"},
        {"hpir 1\nmesh dp=2\n%0: f32[4,8] {dp:S(0)} = placeholder() {kind=data, fqn=\"x\"}\n"
         "%1: f32[8] {dp:R} = placeholder() {kind=data, fqn=\"w\"}\n"
         "%2: (f32[4,8] {dp:S(0)}, f32[4]) = _fused_rms_norm(%0, %1) {eps=1e-05}\nreturn %2\n",
         "placements are given for 1 of _fused_rms_norm's 2 outputs"},
    };
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        hp_graph *g = NULL;
        hp_err err = {0};
        cr_expect_neq(hp_graph_parse(bad[i].text, strlen(bad[i].text), &g, &err), HP_OK,
                      "case %zu parsed", i);
        cr_expect(strstr(err.msg, bad[i].want), "case %zu: %s", i, err.msg);
        hp_graph_free(g);
    }
}
