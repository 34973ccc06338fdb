/* tests/graph/test_eval.c — the reference evaluator's driver and its elementwise, reduction,
 * shape and matrix kernels, against values computed by hand; the driver's checks (feeds,
 * precision, collectives), output ownership, and a fault-injection loop. NN ops are in
 * test_eval_nn.c, rounding in test_eval_round.c. */
#include "graph/eval/eval_internal.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define F64 HP_EVAL_F64
#define F32 HP_EVAL_F32

/* Runs one output in F64 and checks it. */
static void expect1(hp_th *h, hp_value v, const double *want, int64_t n) {
    hp_th_run_ok(h, &v, 1, F64);
    hp_th_expect(&h->out[0], want, n, 1e-12);
}

/* ---- the kernel table ----------------------------------------------------------------------- */

Test(eval, every_op_has_a_kernel) {
    for (int op = 0; op < HP_OP_COUNT; op++)
        cr_expect(hp__eval_kernel_for((hp_op)op) != NULL, "op %s has no evaluator kernel",
                  hp_op_get((hp_op)op)->name);
    cr_expect_null(hp__eval_kernel_for(HP_OP_COUNT));
}

/* ---- creation ------------------------------------------------------------------------------- */

Test(eval, creation) {
    hp_th h;
    hp_th_init(&h);
    int64_t s[2] = {2, 2};
    hp_value f = hp_full(h.g, 2, s, 2.5, HP_F32);
    hp_value z = hp_zeros(h.g, 2, s, HP_I64);
    hp_value o = hp_ones(h.g, 1, s, HP_BF16);
    hp_value outs[3] = {f, z, o};
    hp_th_run_ok(&h, outs, 3, F32);
    hp_th_expect(&h.out[0], (double[]){2.5, 2.5, 2.5, 2.5}, 4, 0);
    hp_th_expect(&h.out[1], (double[]){0, 0, 0, 0}, 4, 0);
    hp_th_expect(&h.out[2], (double[]){1, 1}, 2, 0);
    cr_expect_eq(h.out[1].type.dtype, HP_I64);
    hp_th_fini(&h);
}

/* ---- binary with broadcasting --------------------------------------------------------------- */

Test(eval, add_broadcast_row) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 2, 3), (double[]){1, 2, 3, 4, 5, 6});
    hp_value b = hp_th_input(&h, TY(HP_F32, 3), (double[]){10, 20, 30});
    expect1(&h, hp_add(h.g, a, b), (double[]){11, 22, 33, 14, 25, 36}, 6);
    hp_th_fini(&h);
}

Test(eval, mul_broadcast_outer) {
    /* [2,1] * [1,3] -> [2,3]: an outer product */
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 2, 1), (double[]){2, 3});
    hp_value b = hp_th_input(&h, TY(HP_F32, 1, 3), (double[]){1, 10, 100});
    expect1(&h, hp_mul(h.g, a, b), (double[]){2, 20, 200, 3, 30, 300}, 6);
    hp_th_fini(&h);
}

Test(eval, sub_div_scalar_broadcast) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 2, 2), (double[]){1, 2, 3, 4});
    hp_value s = hp_th_input(&h, TY0(HP_F32), (double[]){2});
    hp_value outs[2] = {hp_sub(h.g, s, a), hp_div(h.g, a, s)};
    hp_th_run_ok(&h, outs, 2, F64);
    hp_th_expect(&h.out[0], (double[]){1, 0, -1, -2}, 4, 0);
    hp_th_expect(&h.out[1], (double[]){0.5, 1, 1.5, 2}, 4, 0);
    hp_th_fini(&h);
}

Test(eval, int_div_truncates_and_rejects_zero) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_I32, 3), (double[]){7, -7, 6});
    hp_value b = hp_th_input(&h, TY(HP_I32, 3), (double[]){2, 2, 0});
    hp_value d = hp_div(h.g, a, b);
    cr_assert_eq(hp_th_run(&h, &d, 1, F64), HP_INVALID);
    cr_expect(strstr(h.err.msg, "node 2 (div)") && strstr(h.err.msg, "division by zero"), "%s",
              h.err.msg);
    h.in[1].data[2] = 4;
    hp_th_run_ok(&h, &d, 1, F64);
    hp_th_expect(&h.out[0], (double[]){3, -3, 1}, 3, 0);
    hp_th_fini(&h);
}

Test(eval, maximum_compare_where) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 4), (double[]){1, 5, NAN, -2});
    hp_value b = hp_th_input(&h, TY(HP_F32, 4), (double[]){3, 5, 0, -3});
    hp_value c = hp_th_input(&h, TY(HP_BOOL, 2, 1), (double[]){1, 0});
    hp_value outs[4] = {hp_bin(h.g, HP_OP_MAXIMUM, a, b), hp_bin(h.g, HP_OP_EQ, a, b),
                        hp_bin(h.g, HP_OP_LT, a, b), hp_where(h.g, c, a, b)};
    hp_th_run_ok(&h, outs, 4, F64);
    hp_th_expect(&h.out[0], (double[]){3, 5, NAN, -2}, 4, 0);
    hp_th_expect(&h.out[1], (double[]){0, 1, 0, 0}, 4, 0);
    hp_th_expect(&h.out[2], (double[]){1, 0, 0, 0}, 4, 0);
    cr_expect_eq(h.out[1].type.dtype, HP_BOOL);
    /* where broadcasts cond [2,1] against [4]: row 0 takes a, row 1 takes b */
    hp_th_expect(&h.out[3], (double[]){1, 5, NAN, -2, 3, 5, 0, -3}, 8, 0);
    hp_th_fini(&h);
}

/* ---- unary and scalar ----------------------------------------------------------------------- */

Test(eval, unary_math) {
    const double x[4] = {-1.5, -0.25, 0.5, 2};
    struct {
        hp_op op;
        double (*f)(double);
    } cases[] = {{HP_OP_NEG, NULL},  {HP_OP_EXP, exp},      {HP_OP_TANH, tanh},
                 {HP_OP_RELU, NULL}, {HP_OP_SIGMOID, NULL}, {HP_OP_SILU, NULL},
                 {HP_OP_SIN, sin},   {HP_OP_COS, cos},      {HP_OP_ERF, erf}};
    for (size_t c = 0; c < HP_ARRAY_LEN(cases); c++) {
        hp_th h;
        hp_th_init(&h);
        hp_value in = hp_th_input(&h, TY(HP_F32, 4), x);
        double want[4];
        for (int i = 0; i < 4; i++) {
            double s = 1 / (1 + exp(-x[i]));
            switch (cases[c].op) {
            case HP_OP_NEG:
                want[i] = -x[i];
                break;
            case HP_OP_RELU:
                want[i] = x[i] > 0 ? x[i] : 0;
                break;
            case HP_OP_SIGMOID:
                want[i] = s;
                break;
            case HP_OP_SILU:
                want[i] = x[i] * s;
                break;
            default:
                want[i] = cases[c].f(x[i]);
            }
        }
        expect1(&h, hp_un(h.g, cases[c].op, in), want, 4);
        hp_th_fini(&h);
    }
}

Test(eval, positive_domain_math) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 3), (double[]){0.25, 1, 4});
    hp_value outs[5] = {hp_log(h.g, x), hp_sqrt(h.g, x), hp_rsqrt(h.g, x), hp_pow(h.g, x, 1.5),
                        hp_add_scalar(h.g, hp_mul_scalar(h.g, x, -2), 0.5)};
    hp_th_run_ok(&h, outs, 5, F64);
    hp_th_expect(&h.out[0], (double[]){log(0.25), 0, log(4)}, 3, 1e-15);
    hp_th_expect(&h.out[1], (double[]){0.5, 1, 2}, 3, 0);
    hp_th_expect(&h.out[2], (double[]){2, 1, 0.5}, 3, 0);
    hp_th_expect(&h.out[3], (double[]){0.125, 1, 8}, 3, 1e-15);
    hp_th_expect(&h.out[4], (double[]){0, -1.5, -7.5}, 3, 0);
    hp_th_fini(&h);
}

Test(eval, gelu_exact_and_tanh) {
    hp_th h;
    hp_th_init(&h);
    const double x[3] = {-1, 0.5, 2};
    hp_value in = hp_th_input(&h, TY(HP_F32, 3), x);
    hp_value outs[2] = {hp_un(h.g, HP_OP_GELU, in),
                        hp_un1(h.g, HP_OP_GELU, in, hp_attr_int(HP_ATTR_APPROXIMATE, 1))};
    hp_th_run_ok(&h, outs, 2, F64);
    double exact[3], approx[3];
    for (int i = 0; i < 3; i++) {
        exact[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
        double u = sqrt(2 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3));
        approx[i] = 0.5 * x[i] * (1 + tanh(u));
    }
    hp_th_expect(&h.out[0], exact, 3, 1e-15);
    hp_th_expect(&h.out[1], approx, 3, 1e-15);
    cr_expect(fabs(exact[0] - approx[0]) > 1e-6, "the two gelu variants should differ");
    hp_th_fini(&h);
}

/* Each backward pair against a central difference of its forward op (F64). */
Test(eval, backward_pairs_match_numeric_derivatives) {
    const double x[5] = {-2.5, -0.7, 0.1, 0.9, 3};
    struct {
        hp_op fwd, bwd;
        int approximate;
        bool saved_is_output; /* tanh/sigmoid save y, silu/gelu save x */
    } cases[] = {{HP_OP_TANH, HP_OP_TANH_BACKWARD, -1, true},
                 {HP_OP_SIGMOID, HP_OP_SIGMOID_BACKWARD, -1, true},
                 {HP_OP_SILU, HP_OP_SILU_BACKWARD, -1, false},
                 {HP_OP_GELU, HP_OP_GELU_BACKWARD, 0, false},
                 {HP_OP_GELU, HP_OP_GELU_BACKWARD, 1, false},
                 {HP_OP_RELU, HP_OP_THRESHOLD_BACKWARD, -1, false}};
    for (size_t c = 0; c < HP_ARRAY_LEN(cases); c++) {
        hp_th h;
        hp_th_init(&h);
        const double gdata[5] = {1, 2, -1, 0.5, 3};
        hp_value xin = hp_th_input(&h, TY(HP_F32, 5), x);
        hp_value g = hp_th_input(&h, TY(HP_F32, 5), gdata);
        hp_attr ap = hp_attr_int(HP_ATTR_APPROXIMATE, cases[c].approximate);
        int na = cases[c].approximate >= 0;
        hp_value y = hp_build(h.g, cases[c].fwd, &xin, 1, &ap, na);
        hp_value saved = cases[c].saved_is_output ? y : xin;
        hp_value pair[2] = {g, saved};
        hp_value gx;
        if (cases[c].bwd == HP_OP_THRESHOLD_BACKWARD) {
            hp_attr v = hp_attr_float(HP_ATTR_VALUE, 0);
            gx = hp_build(h.g, cases[c].bwd, pair, 2, &v, 1);
        } else {
            gx = hp_build(h.g, cases[c].bwd, pair, 2, &ap, na);
        }
        hp_th_run_ok(&h, &gx, 1, F64);
        double want[5];
        for (int i = 0; i < 5; i++) {
            hp_th f;
            hp_th_init(&f);
            double step = 1e-6, xs[2] = {x[i] + step, x[i] - step};
            hp_value fx = hp_th_input(&f, TY(HP_F32, 2), xs);
            hp_value fy = hp_build(f.g, cases[c].fwd, &fx, 1, &ap, na);
            hp_th_run_ok(&f, &fy, 1, F64);
            want[i] = gdata[i] * (f.out[0].data[0] - f.out[0].data[1]) / (2 * step);
            hp_th_fini(&f);
        }
        hp_th_expect_close(h.out[0].data, want, 5, 1e-7, hp_op_get(cases[c].bwd)->name);
        hp_th_fini(&h);
    }
}

/* ---- casts ---------------------------------------------------------------------------------- */

Test(eval, to_copy_casts) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 5), (double[]){-2.7, -0.5, 0, 2.7, 1.00390625});
    hp_value outs[3] = {hp_to(h.g, x, HP_I32), hp_to(h.g, x, HP_BOOL), hp_to(h.g, x, HP_BF16)};
    hp_th_run_ok(&h, outs, 3, F32);
    hp_th_expect(&h.out[0], (double[]){-2, -0, 0, 2, 1}, 5, 0);
    hp_th_expect(&h.out[1], (double[]){1, 1, 0, 1, 1}, 5, 0);
    /* bf16 keeps 8 significant bits: 2.7 -> 2.703125, 1 + 2^-8 ties to 1 */
    hp_th_expect(&h.out[2], (double[]){-2.703125, -0.5, 0, 2.703125, 1}, 5, 0);
    /* F64 never rounds floats, but integers still truncate */
    hp_th_run_ok(&h, outs, 3, F64);
    hp_th_expect(&h.out[0], (double[]){-2, 0, 0, 2, 1}, 5, 0);
    cr_expect_eq(h.out[2].data[0], -2.7);
    hp_th_fini(&h);
}

Test(eval, f32_rounds_every_floating_output) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 1), (double[]){1});
    hp_value third = hp_mul_scalar(h.g, x, 1.0 / 3.0);
    hp_th_run_ok(&h, &third, 1, F32);
    cr_expect_eq(h.out[0].data[0], (double)(float)(1.0 / 3.0));
    hp_th_run_ok(&h, &third, 1, F64);
    cr_expect_eq(h.out[0].data[0], 1.0 / 3.0);
    hp_th_fini(&h);
}

/* ---- reductions ----------------------------------------------------------------------------- */

Test(eval, sum_mean_dims_keepdim) {
    hp_th h;
    hp_th_init(&h);
    /* x [2,3] = [[1,2,3],[4,5,6]] */
    hp_value x = hp_th_input(&h, TY(HP_F32, 2, 3), (double[]){1, 2, 3, 4, 5, 6});
    int64_t d1[1] = {1}, dneg[1] = {-2};
    hp_value outs[5] = {hp_sum(h.g, x, 1, d1, false), hp_sum(h.g, x, 1, dneg, true),
                        hp_sum(h.g, x, 0, NULL, false), hp_mean(h.g, x, 1, d1, true),
                        hp_mean(h.g, x, 0, NULL, true)};
    hp_th_run_ok(&h, outs, 5, F64);
    hp_th_expect(&h.out[0], (double[]){6, 15}, 2, 0);
    cr_expect_eq(h.out[0].type.rank, 1);
    hp_th_expect(&h.out[1], (double[]){5, 7, 9}, 3, 0);
    cr_expect(h.out[1].type.rank == 2 && h.out[1].type.shape[0] == 1);
    hp_th_expect(&h.out[2], (double[]){21}, 1, 0);
    cr_expect_eq(h.out[2].type.rank, 0);
    hp_th_expect(&h.out[3], (double[]){2, 5}, 2, 0);
    hp_th_expect(&h.out[4], (double[]){3.5}, 1, 0);
    cr_expect_eq(h.out[4].type.rank, 2);
    hp_th_fini(&h);
}

Test(eval, reduce_middle_dims_of_rank3) {
    hp_th h;
    hp_th_init(&h);
    double x[24];
    for (int i = 0; i < 24; i++) x[i] = i;
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 3, 4), x);
    int64_t dims[2] = {0, 2};
    hp_value s = hp_sum(h.g, in, 2, dims, false);
    /* out[j] = Σ_{i,k} (12 i + 4 j + k) = 2·4·4j + 4·12 + 2·6 = 32 j + 60 */
    expect1(&h, s, (double[]){60, 92, 124}, 3);
    hp_th_fini(&h);
}

Test(eval, amax_nan_and_ties) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 3, 3), (double[]){1, 7, 7, -5, NAN, 2, -3, -1, -2});
    int64_t d[1] = {-1};
    expect1(&h, hp_amax(h.g, x, 1, d, false), (double[]){7, NAN, -1}, 3);
    hp_th_fini(&h);
}

Test(eval, integer_sum) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_I64, 3), (double[]){4000000000, 3, -1});
    expect1(&h, hp_sum(h.g, x, 0, NULL, false), (double[]){4000000002}, 1);
    hp_th_fini(&h);
}

/* ---- shape ops ------------------------------------------------------------------------------ */

Test(eval, view_reshape_squeeze_clone) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 2, 3), (double[]){1, 2, 3, 4, 5, 6});
    int64_t s[3] = {3, -1, 1};
    hp_value v = hp_view(h.g, x, 3, s);
    hp_value r = hp_un1(h.g, HP_OP_RESHAPE, x, hp_attr_ints(HP_ATTR_SHAPE, 1, (int64_t[]){6}));
    hp_value q = hp_squeeze(h.g, v, -1);
    hp_value u = hp_unsqueeze(h.g, x, 0);
    hp_value c = hp_un(h.g, HP_OP_CLONE, x);
    hp_value outs[5] = {v, r, q, u, c};
    hp_th_run_ok(&h, outs, 5, F64);
    for (int i = 0; i < 5; i++) hp_th_expect(&h.out[i], (double[]){1, 2, 3, 4, 5, 6}, 6, 0);
    cr_expect(h.out[0].type.rank == 3 && h.out[0].type.shape[1] == 2);
    cr_expect(h.out[2].type.rank == 2 && h.out[2].type.shape[0] == 3);
    cr_expect(h.out[3].type.rank == 3 && h.out[3].type.shape[0] == 1);
    hp_th_fini(&h);
}

Test(eval, permute_transpose_t) {
    hp_th h;
    hp_th_init(&h);
    double x[24];
    for (int i = 0; i < 24; i++) x[i] = i;
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 3, 4), x);
    hp_value m = hp_th_input(&h, TY(HP_F32, 2, 3), x);
    hp_value v = hp_th_input(&h, TY(HP_F32, 3), x);
    int64_t perm[3] = {2, 0, -2};
    hp_value outs[4] = {hp_permute(h.g, in, 3, perm), hp_transpose(h.g, in, -1, 0), hp_t(h.g, m),
                        hp_t(h.g, v)};
    hp_th_run_ok(&h, outs, 4, F64);
    /* permute (2,0,1): out[k][i][j] = x[i][j][k] = 12 i + 4 j + k */
    double want[24], want_t[24];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                want[(k * 2 + i) * 3 + j] = 12 * i + 4 * j + k;
                want_t[(k * 3 + j) * 2 + i] = 12 * i + 4 * j + k; /* transpose(-1, 0): [4,3,2] */
            }
    hp_th_expect(&h.out[0], want, 24, 0);
    hp_th_expect(&h.out[1], want_t, 24, 0);
    cr_expect(h.out[1].type.shape[0] == 4 && h.out[1].type.shape[2] == 2);
    hp_th_expect(&h.out[2], (double[]){0, 3, 1, 4, 2, 5}, 6, 0);
    hp_th_expect(&h.out[3], (double[]){0, 1, 2}, 3, 0);
    hp_th_fini(&h);
}

Test(eval, expand_with_minus_one_and_new_dims) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 2, 1), (double[]){1, 2});
    int64_t s[3] = {2, -1, 3};
    expect1(&h, hp_expand(h.g, x, 3, s), (double[]){1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2}, 12);
    hp_th_fini(&h);
}

Test(eval, slice_steps_and_negative_bounds) {
    hp_th h;
    hp_th_init(&h);
    double x[14];
    for (int i = 0; i < 14; i++) x[i] = i;
    hp_value in = hp_th_input(&h, TY(HP_F32, 2, 7), x);
    hp_value outs[5] = {
        hp_slice(h.g, in, 1, 1, 6, 2),      /* cols 1,3,5 */
        hp_slice(h.g, in, -1, -3, 1000, 1), /* end clamps: cols 4,5,6 */
        hp_slice(h.g, in, 1, -100, -5, 1),  /* start clamps to 0: cols 0,1 */
        hp_slice(h.g, in, 0, 1, 2, 1),      /* row 1 */
        hp_slice(h.g, in, 1, 5, 2, 1),      /* empty */
    };
    hp_th_run_ok(&h, outs, 5, F64);
    hp_th_expect(&h.out[0], (double[]){1, 3, 5, 8, 10, 12}, 6, 0);
    hp_th_expect(&h.out[1], (double[]){4, 5, 6, 11, 12, 13}, 6, 0);
    hp_th_expect(&h.out[2], (double[]){0, 1, 7, 8}, 4, 0);
    hp_th_expect(&h.out[3], (double[]){7, 8, 9, 10, 11, 12, 13}, 7, 0);
    cr_expect_eq(hp_type_numel(&h.out[4].type), 0);
    hp_th_fini(&h);
}

Test(eval, slice_backward_scatters) {
    hp_th h;
    hp_th_init(&h);
    hp_value g = hp_th_input(&h, TY(HP_F32, 2, 2), (double[]){1, 2, 3, 4});
    hp_attr a[5] = {hp_attr_ints(HP_ATTR_SHAPE, 2, (int64_t[]){2, 5}), hp_attr_int(HP_ATTR_DIM, -1),
                    hp_attr_int(HP_ATTR_START, -4), hp_attr_int(HP_ATTR_END, 5),
                    hp_attr_int(HP_ATTR_STEP, 2)};
    hp_value sb = hp_build(h.g, HP_OP_SLICE_BACKWARD, &g, 1, a, 5);
    expect1(&h, sb, (double[]){0, 1, 0, 2, 0, 0, 3, 0, 4, 0}, 10);
    hp_th_fini(&h);
}

Test(eval, cat_along_last_and_first) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 2, 1), (double[]){1, 2});
    hp_value b = hp_th_input(&h, TY(HP_F32, 2, 2), (double[]){3, 4, 5, 6});
    hp_value c = hp_th_input(&h, TY(HP_F32, 2, 0), NULL);
    hp_value xs[3] = {a, c, b}, ys[2] = {b, b};
    hp_value outs[2] = {hp_cat(h.g, xs, 3, -1), hp_cat(h.g, ys, 2, 0)};
    hp_th_run_ok(&h, outs, 2, F64);
    hp_th_expect(&h.out[0], (double[]){1, 3, 4, 2, 5, 6}, 6, 0);
    hp_th_expect(&h.out[1], (double[]){3, 4, 5, 6, 3, 4, 5, 6}, 8, 0);
    hp_th_fini(&h);
}

/* ---- matrix products ------------------------------------------------------------------------ */

Test(eval, mm_bmm_addmm) {
    hp_th h;
    hp_th_init(&h);
    hp_value a = hp_th_input(&h, TY(HP_F32, 2, 3), (double[]){1, 2, 3, 4, 5, 6});
    hp_value b = hp_th_input(&h, TY(HP_F32, 3, 2), (double[]){7, 8, 9, 10, 11, 12});
    hp_value ba = hp_th_input(&h, TY(HP_F32, 2, 1, 2), (double[]){1, 2, 3, 4});
    hp_value bb = hp_th_input(&h, TY(HP_F32, 2, 2, 1), (double[]){5, 6, 7, 8});
    hp_value bias = hp_th_input(&h, TY(HP_F32, 2), (double[]){100, 200});
    hp_value in3[3] = {bias, a, b};
    hp_attr ab[2] = {hp_attr_float(HP_ATTR_ALPHA, 2), hp_attr_float(HP_ATTR_BETA, 0.5)};
    hp_value outs[4] = {hp_mm(h.g, a, b), hp_bmm(h.g, ba, bb),
                        hp_build(h.g, HP_OP_ADDMM, in3, 3, NULL, 0),
                        hp_build(h.g, HP_OP_ADDMM, in3, 3, ab, 2)};
    hp_th_run_ok(&h, outs, 4, F64);
    hp_th_expect(&h.out[0], (double[]){58, 64, 139, 154}, 4, 0);
    hp_th_expect(&h.out[1], (double[]){17, 53}, 2, 0);
    hp_th_expect(&h.out[2], (double[]){158, 264, 239, 354}, 4, 0);
    hp_th_expect(&h.out[3], (double[]){166, 228, 328, 408}, 4, 0);
    hp_th_fini(&h);
}

/* A [8,2048] x [2048,256] product must take well under a second or two. */
Test(eval, mm_large_is_fast_enough) {
    hp_th h;
    hp_th_init(&h);
    int64_t m = 8, k = 2048, n = 256;
    double *a = malloc(sizeof(double) * (size_t)(m * k)),
           *b = malloc(sizeof(double) * (size_t)(k * n));
    hp_th_rand(a, m * k, 1, -1, 1);
    hp_th_rand(b, k * n, 2, -1, 1);
    /* the feeds are rounded to f32 on the way in, so the reference uses f32 values too */
    for (int64_t i = 0; i < m * k; i++) a[i] = (double)(float)a[i];
    for (int64_t i = 0; i < k * n; i++) b[i] = (double)(float)b[i];
    hp_value y =
        hp_mm(h.g, hp_th_input(&h, TY(HP_F32, m, k), a), hp_th_input(&h, TY(HP_F32, k, n), b));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    hp_th_run_ok(&h, &y, 1, F32);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(secs, 10.0, "mm took %.2f s", secs);
    for (int64_t i = 0; i < m; i += 3)
        for (int64_t j = 0; j < n; j += 37) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
            cr_expect_eq(h.out[0].data[i * n + j], (double)(float)s, "y[%lld,%lld]", (long long)i,
                         (long long)j);
        }
    free(a);
    free(b);
    hp_th_fini(&h);
}

/* ---- the driver ----------------------------------------------------------------------------- */

Test(eval, wrong_input_count_and_type) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 2), (double[]){1, 2});
    hp_value y = hp_th_input(&h, TY(HP_F32, 2), (double[]){3, 4});
    hp_value s = hp_add(h.g, x, y);
    cr_assert_eq(hp_graph_set_outputs(h.g, &s, 1, NULL), HP_OK);
    hp_tensor out[1];
    hp_err e = {0};
    cr_expect_eq(hp_eval(h.g, h.in, 1, NULL, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "2 placeholders") && strstr(e.msg, "1 input"), "%s", e.msg);
    cr_expect_null(out[0].data);

    hp_tensor bad[2] = {h.in[0], h.in[1]};
    bad[1].type = TY(HP_F32, 3);
    cr_expect_eq(hp_eval(h.g, bad, 2, NULL, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "input 1") && strstr(e.msg, "f32[3]") && strstr(e.msg, "f32[2]"), "%s",
              e.msg);
    bad[1].type = TY(HP_BF16, 2);
    cr_expect_eq(hp_eval(h.g, bad, 2, NULL, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "bf16[2]"), "%s", e.msg);
    bad[1] = h.in[1];
    bad[1].data = NULL;
    cr_expect_eq(hp_eval(h.g, bad, 2, NULL, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "no data"), "%s", e.msg);
    cr_expect_eq(hp_eval(h.g, NULL, 2, NULL, out, &e), HP_INVALID);
    hp_eval_opts o = {.precision = (hp_eval_precision)7};
    cr_expect_eq(hp_eval(h.g, h.in, 2, &o, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "precision"), "%s", e.msg);
    cr_expect_eq(hp_eval(NULL, h.in, 2, NULL, out, &e), HP_INVALID);
    /* and the happy path with default options (NULL: F32) */
    cr_assert_eq(hp_eval(h.g, h.in, 2, NULL, out, &e), HP_OK, "%s", e.msg);
    hp_th_expect(&out[0], (double[]){4, 6}, 2, 0);
    hp_tensor_free(&out[0]);
    hp_tensor_free(&out[0]); /* idempotent */
    hp_th_fini(&h);
}

Test(eval, unverifiable_graph_is_rejected) {
    hp_graph *g = hp_graph_new();
    hp_type t = TY(HP_F32, 2), wrong = TY(HP_F32, 3);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, t, NULL);
    hp_value in[2] = {x, x};
    /* appended raw with a wrong output type: the verifier must catch it before any kernel */
    int id = hp_graph_append(g, HP_OP_ADD, in, 2, &wrong, 1, NULL, 0, NULL);
    cr_assert_geq(id, 0);
    hp_value o = {id, 0};
    cr_assert_eq(hp_graph_set_outputs(g, &o, 1, NULL), HP_OK);
    hp_tensor feed, out[1];
    cr_assert_eq(hp_tensor_alloc(&feed, t, NULL), HP_OK);
    hp_err e = {0};
    cr_expect_eq(hp_eval(g, &feed, 1, NULL, out, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "node 1"), "%s", e.msg);
    hp_tensor_free(&feed);
    hp_graph_free(g);
}

Test(eval, tensor_alloc_limit) {
    hp_tensor t;
    hp_err e = {0};
    int64_t s[2] = {(int64_t)1 << 20, (int64_t)1 << 12};
    cr_expect_eq(hp_tensor_alloc(&t, hp_type_make(HP_F32, 2, s), &e), HP_LIMIT);
    cr_expect(strstr(e.msg, "f32[1048576,4096]"), "%s", e.msg);
    cr_expect_null(t.data);
    cr_expect_eq(hp_tensor_alloc(&t, TY(HP_F32, 0), &e), HP_OK);
    cr_expect_not_null(t.data);
    hp_tensor_free(&t);
}

Test(eval, repeated_and_placeholder_outputs_are_independent) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 2), (double[]){1, 2});
    hp_value y = hp_neg(h.g, x);
    hp_value outs[4] = {y, x, y, x};
    hp_th_run_ok(&h, outs, 4, F64);
    hp_th_expect(&h.out[0], (double[]){-1, -2}, 2, 0);
    hp_th_expect(&h.out[2], (double[]){-1, -2}, 2, 0);
    hp_th_expect(&h.out[1], (double[]){1, 2}, 2, 0);
    cr_expect_neq(h.out[0].data, h.out[2].data);
    cr_expect_neq(h.out[1].data, h.out[3].data);
    cr_expect_neq(h.out[1].data, h.in[0].data);
    h.out[0].data[0] = 42;
    cr_expect_eq(h.out[2].data[0], -1);
    hp_th_fini(&h);
}

/* ---- collectives ---------------------------------------------------------------------------- */

/* A fake group of two ranks whose peer holds 10x our values. */
static hp_status fake_collective(void *ctx, const hp_node *n, const hp_tensor *in, hp_tensor *out,
                                 hp_err *err) {
    int *calls = ctx;
    (*calls)++;
    int64_t k = hp_type_numel(&in->type);
    switch (n->op) {
    case HP_OP_ALL_GATHER:
        for (int64_t i = 0; i < k; i++) {
            out->data[i] = in->data[i];
            out->data[k + i] = 10 * in->data[i];
        }
        return HP_OK;
    case HP_OP_ALL_REDUCE:
        for (int64_t i = 0; i < k; i++) out->data[i] = 11 * in->data[i];
        return HP_OK;
    default:
        return hp_errf(err, HP_UNSUPPORTED, "fake group: no %s", hp_op_get(n->op)->name);
    }
}

Test(eval, collectives_use_the_hook_and_wait_is_identity) {
    hp_th h;
    hp_th_init(&h);
    hp_value x = hp_th_input(&h, TY(HP_F32, 1, 2), (double[]){1, 2});
    hp_attr ag[1] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2)};
    hp_attr ar[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_int(HP_ATTR_REDUCE_OP, 0)};
    hp_value g = hp_un(h.g, HP_OP_WAIT_TENSOR, hp_build(h.g, HP_OP_ALL_GATHER, &x, 1, ag, 1));
    hp_value r = hp_un(h.g, HP_OP_WAIT_TENSOR, hp_build(h.g, HP_OP_ALL_REDUCE, &x, 1, ar, 2));
    hp_value outs[2] = {g, r};
    cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
    cr_assert_eq(hp_graph_set_outputs(h.g, outs, 2, NULL), HP_OK);
    hp_tensor out[2];
    hp_err e = {0};
    /* without a hook: unsupported, naming the node */
    cr_expect_eq(hp_eval(h.g, h.in, 1, NULL, out, &e), HP_UNSUPPORTED);
    cr_expect(strstr(e.msg, "node 1 (all_gather_into_tensor)") && strstr(e.msg, "hook"), "%s",
              e.msg);
    int calls = 0;
    hp_eval_opts o = {
        .precision = HP_EVAL_F32, .collective = fake_collective, .collective_ctx = &calls};
    cr_assert_eq(hp_eval(h.g, h.in, 1, &o, out, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(calls, 2);
    hp_th_expect(&out[0], (double[]){1, 2, 10, 20}, 4, 0);
    hp_th_expect(&out[1], (double[]){11, 22}, 2, 0);
    hp_tensor_free(&out[0]);
    hp_tensor_free(&out[1]);
    /* a hook error travels up with the node prefixed */
    hp_value o3 = hp_build(h.g, HP_OP_REDUCE_SCATTER, &g, 1, ar, 2);
    cr_assert_eq(hp_graph_set_outputs(h.g, &o3, 1, NULL), HP_OK);
    cr_expect_eq(hp_eval(h.g, h.in, 1, &o, out, &e), HP_UNSUPPORTED);
    cr_expect(strstr(e.msg, "node 5 (reduce_scatter_tensor): fake group"), "%s", e.msg);
    cr_expect_null(out[0].data);
    hp_th_fini(&h);
}

/* ---- fault injection ------------------------------------------------------------------------ */

/* Fails every allocation hp_eval makes on the harness graph in turn: each run must report
 * HP_NOMEM and leave the outputs empty; with no failure injected the result is unchanged. ASan
 * builds (-DHP_SANITIZE=ON) check that nothing leaks. */
static void fault_loop(hp_th *h, const hp_value *outs, int n_outs) {
    hp_th_run_ok(h, outs, n_outs, F32);
    double want = h->out[0].data[0];
    hp_tensor out[HP_TH_MAX_OUT];
    hp_err e = {0};
    hp_alloc_fail_at(-1);
    cr_assert_eq(hp_eval(h->g, h->in, h->n_in, NULL, out, &e), HP_OK);
    long n_allocs = hp_alloc_fail_at(-1);
    for (int i = 0; i < n_outs; i++) hp_tensor_free(&out[i]);
    cr_assert_gt(n_allocs, 10);
    for (long k = 0; k < n_allocs; k++) {
        hp_alloc_fail_at(k);
        hp_status st = hp_eval(h->g, h->in, h->n_in, NULL, out, &e);
        hp_alloc_fail_at(-1);
        cr_assert_eq(st, HP_NOMEM, "allocation %ld: status %d (%s)", k, (int)st, e.msg);
        for (int i = 0; i < n_outs; i++)
            cr_expect_null(out[i].data, "allocation %ld: output %d", k, i);
    }
    hp_alloc_fail_at(n_allocs);
    cr_assert_eq(hp_eval(h->g, h->in, h->n_in, NULL, out, &e), HP_OK, "%s", e.msg);
    hp_alloc_fail_at(-1);
    cr_expect_eq(out[0].data[0], want);
    for (int i = 0; i < n_outs; i++) hp_tensor_free(&out[i]);
}

Test(eval, fault_injection_mlp) {
    hp_th h;
    hp_th_init(&h);
    double xd[12], wd[12];
    hp_th_rand(xd, 12, 3, -1, 1);
    hp_th_rand(wd, 12, 4, -1, 1);
    hp_value x = hp_th_input(&h, TY(HP_F32, 3, 4), xd);
    hp_value w = hp_th_input(&h, TY(HP_F32, 4, 3), wd);
    hp_value t = hp_th_input(&h, TY(HP_I64, 3), (double[]){0, 2, 1});
    hp_value logits = hp_silu(h.g, hp_mm(h.g, x, w));
    hp_value logp = hp_un1(h.g, HP_OP_LOG_SOFTMAX, logits, hp_attr_int(HP_ATTR_DIM, 1));
    hp_value in2[2] = {logp, t};
    hp_value loss = hp_build(h.g, HP_OP_NLL_LOSS_FORWARD, in2, 2, NULL, 0);
    int64_t d0[1] = {0};
    hp_value outs[4] = {loss, hp_sum(h.g, logits, 1, d0, false), logp, logp};
    fault_loop(&h, outs, 4);
    hp_th_fini(&h);
}

/* Attention forward and backward (they allocate score rows of their own), RMSNorm, cat. */
Test(eval, fault_injection_attention) {
    hp_th h;
    hp_th_init(&h);
    double q[48];
    hp_th_rand(q, 48, 5, -1, 1);
    hp_value qi = hp_th_input(&h, TY(HP_F32, 1, 4, 3, 4), q);
    hp_value ki = hp_th_input(&h, TY(HP_F32, 1, 2, 3, 4), q);
    hp_value w = hp_th_input(&h, TY(HP_F32, 4), q);
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 0.5), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value in3[3] = {qi, ki, ki};
    hp_value o = hp_build(h.g, HP_OP_SDPA, in3, 3, a, 2);
    hp_value bin[6] = {o, qi, ki, ki, o, hp_out(o, 1)};
    hp_value gb = hp_build(h.g, HP_OP_SDPA_BACKWARD, bin, 6, a, 2);
    hp_value rin[2] = {hp_out(gb, 1), w};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value y = hp_build(h.g, HP_OP_RMS_NORM, rin, 2, &eps, 1);
    hp_value parts[2] = {y, hp_out(gb, 2)};
    hp_value c = hp_cat(h.g, parts, 2, 2);
    hp_value outs[3] = {hp_sum(h.g, c, 0, NULL, false), gb, hp_out(y, 1)};
    fault_loop(&h, outs, 3);
    hp_th_fini(&h);
}
