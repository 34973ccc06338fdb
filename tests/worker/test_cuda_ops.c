/* tests/worker/test_cuda_ops.c — every op the cuda backend has a kernel for, against the
 * reference evaluator (F32 precision: 1e-5 for elementwise, shape, cast, embedding and loss
 * ops, 1e-4 for matmul, reductions, softmax, norms and attention; bf16 within bf16 rounding),
 * on random inputs: broadcasting, negative dims, empty and scalar tensors, TRANS_A/TRANS_B
 * products, the Llama shapes' head dims (16, 64, 128) and GQA for attention. An op without a
 * kernel is HP_UNSUPPORTED naming the op and dtype. Every test skips cleanly without a CUDA
 * device (cuda_check.h). */
#include "cpu_check.h"
#include "cuda_check.h"

#include "hp/build.h"

#define TOL_BF16 2e-2 /* bf16 keeps 8 significant bits */

static hp_value node1(hp_th *h, hp_op op, const hp_value *in, int n_in, const hp_attr *a, int na) {
    hp_value v = hp_build(h->g, op, in, n_in, a, na);
    cr_assert(!hp_graph_failed(h->g), "%s: %s", hp_op_get(op)->name, h->g->err.msg);
    return v;
}

/* bf16 inputs exactly representable, so that the evaluator and the device see the same
 * operands and only the output's rounding and the summation order differ. */
static void round_inputs(hp_th *h) {
    for (int k = 0; k < h->n_in; k++) {
        hp_tensor *t = &h->in[k];
        if (t->type.dtype != HP_BF16 && t->type.dtype != HP_F16) continue;
        for (int64_t i = 0; i < hp_type_numel(&t->type); i++)
            t->data[i] = hp_eval_round(t->type.dtype, t->data[i]);
    }
}

static void one(hp_backend *be, hp_op op, const hp_type *types, int n_in, const hp_attr *a, int na,
                double lo, double hi, double tol) {
    hp_th h;
    hp_th_init(&h);
    hp_value in[8];
    for (int i = 0; i < n_in; i++) in[i] = cc_rand_input(&h, types[i], 100 + (uint64_t)i, lo, hi);
    round_inputs(&h);
    hp_value v = node1(&h, op, in, n_in, a, na);
    cc_check(be, &h, v, 0, tol);
    hp_th_fini(&h);
}

static const struct {
    int ra, rb;
    int64_t a[4], b[4];
} bshapes[] = {
    {2, 2, {4, 5}, {4, 5}},   {2, 1, {4, 5}, {5}},          {3, 2, {3, 1, 5}, {4, 1}},
    {0, 2, {0}, {2, 3}},      {3, 3, {2, 3, 1}, {1, 1, 4}}, {2, 1, {400, 97}, {97}},
    {1, 1, {70001}, {70001}}, {2, 2, {0, 3}, {1, 3}},
};

Test(cuda_ops, creation_and_elementwise) {
    hp_backend *be = cu_backend();
    const hp_op cre[] = {HP_OP_FULL, HP_OP_ZEROS, HP_OP_ONES};
    const hp_dtype cdt[] = {HP_F32, HP_I32, HP_I64, HP_BOOL, HP_BF16};
    for (size_t o = 0; o < HP_ARRAY_LEN(cre); o++)
        for (size_t d = 0; d < HP_ARRAY_LEN(cdt); d++) {
            hp_th h;
            hp_th_init(&h);
            hp_attr a[3] = {hp_attr_ints(HP_ATTR_SHAPE, 2, (int64_t[]){3, 70001}),
                            hp_attr_dtype(HP_ATTR_DTYPE, cdt[d]),
                            hp_attr_float(HP_ATTR_VALUE, -1.75)};
            hp_value v = node1(&h, cre[o], NULL, 0, a, cre[o] == HP_OP_FULL ? 3 : 2);
            cc_check(be, &h, v, 0, 0);
            hp_th_fini(&h);
        }
    const hp_op bin[] = {HP_OP_ADD,     HP_OP_SUB, HP_OP_MUL, HP_OP_DIV,
                         HP_OP_MAXIMUM, HP_OP_EQ,  HP_OP_LT};
    for (size_t o = 0; o < HP_ARRAY_LEN(bin); o++)
        for (int bf = 0; bf < 2; bf++)
            for (size_t s = 0; s < HP_ARRAY_LEN(bshapes); s++) {
                hp_dtype dt = bf ? HP_BF16 : HP_F32;
                bool cmp = bin[o] == HP_OP_EQ || bin[o] == HP_OP_LT;
                hp_th h;
                hp_th_init(&h);
                hp_value a = cc_rand_input(&h, hp_type_make(dt, bshapes[s].ra, bshapes[s].a), 7,
                                           cmp ? -3 : -9, cmp ? 3 : 9);
                hp_value b = cc_rand_input(&h, hp_type_make(dt, bshapes[s].rb, bshapes[s].b), 9,
                                           bin[o] == HP_OP_DIV ? 1 : -9, 9);
                if (cmp)
                    for (int k = 0; k < 2; k++)
                        for (int64_t i = 0; i < hp_type_numel(&h.in[k].type); i++)
                            h.in[k].data[i] = floor(h.in[k].data[i]);
                round_inputs(&h);
                hp_value v = node1(&h, bin[o], (hp_value[]){a, b}, 2, NULL, 0);
                cc_check(be, &h, v, 0, bf && !cmp ? TOL_BF16 : TOL_SIMPLE);
                hp_th_fini(&h);
            }
    /* comparisons of integers */
    for (size_t s = 0; s < HP_ARRAY_LEN(bshapes); s++) {
        hp_type t[2] = {hp_type_make(HP_I64, bshapes[s].ra, bshapes[s].a),
                        hp_type_make(HP_I64, bshapes[s].rb, bshapes[s].b)};
        one(be, HP_OP_LT, t, 2, NULL, 0, -3, 3, 0);
    }
    /* where */
    for (size_t s = 0; s < HP_ARRAY_LEN(bshapes); s++) {
        hp_th h;
        hp_th_init(&h);
        hp_value c =
            cc_rand_input(&h, hp_type_make(HP_BOOL, bshapes[s].ra, bshapes[s].a), s, -1, 1);
        hp_value a =
            cc_rand_input(&h, hp_type_make(HP_F32, bshapes[s].rb, bshapes[s].b), s + 1, -5, 5);
        hp_value b = cc_rand_input(&h, TY(HP_F32, 1), s + 2, -5, 5);
        hp_value v = node1(&h, HP_OP_WHERE, (hp_value[]){c, a, b}, 3, NULL, 0);
        cc_check(be, &h, v, 0, 0);
        hp_th_fini(&h);
    }
    hp_backend_free(be);
}

Test(cuda_ops, unary_backward_pairs_and_casts) {
    hp_backend *be = cu_backend();
    const hp_type shapes[] = {TY0(HP_F32), TY(HP_F32, 7), TY(HP_F32, 300, 101), TY(HP_F32, 0)};
    static const struct {
        hp_op op;
        double lo, hi, p;
        hp_attr_key k;
    } un[] = {
        {HP_OP_ADD_SCALAR, -4, 4, -0.37, HP_ATTR_VALUE},
        {HP_OP_MUL_SCALAR, -4, 4, 1.5, HP_ATTR_VALUE},
        {HP_OP_POW, 0.1, 3, 2, HP_ATTR_EXPONENT},
        {HP_OP_POW, 0.1, 3, 1.7, HP_ATTR_EXPONENT},
        {HP_OP_NEG, -8, 8, 0, 0},
        {HP_OP_EXP, -20, 20, 0, 0},
        {HP_OP_LOG, 0.01, 20, 0, 0},
        {HP_OP_SQRT, 0.01, 20, 0, 0},
        {HP_OP_RSQRT, 0.01, 20, 0, 0},
        {HP_OP_TANH, -8, 8, 0, 0},
        {HP_OP_SIN, -8, 8, 0, 0},
        {HP_OP_COS, -3000, 3000, 0, 0},
        {HP_OP_ERF, -4, 4, 0, 0},
        {HP_OP_SIGMOID, -8, 8, 0, 0},
        {HP_OP_SILU, -8, 8, 0, 0},
        {HP_OP_GELU, -6, 6, 0, HP_ATTR_APPROXIMATE},
        {HP_OP_GELU, -6, 6, 1, HP_ATTR_APPROXIMATE},
        {HP_OP_RELU, -8, 8, 0, 0},
    };
    for (size_t i = 0; i < HP_ARRAY_LEN(un); i++)
        for (size_t s = 0; s < HP_ARRAY_LEN(shapes); s++) {
            hp_attr a = un[i].k == HP_ATTR_APPROXIMATE ? hp_attr_int(un[i].k, (int64_t)un[i].p)
                                                       : hp_attr_float(un[i].k, un[i].p);
            one(be, un[i].op, &shapes[s], 1, &a, un[i].k ? 1 : 0, un[i].lo, un[i].hi, TOL_SIMPLE);
        }
    hp_type bt = TY(HP_BF16, 300, 101); /* the bf16 path of the elementwise kernels */
    one(be, HP_OP_SILU, &bt, 1, NULL, 0, -8, 8, TOL_BF16);
    const hp_op pairs[] = {HP_OP_TANH_BACKWARD, HP_OP_SIGMOID_BACKWARD, HP_OP_SILU_BACKWARD,
                           HP_OP_GELU_BACKWARD, HP_OP_THRESHOLD_BACKWARD};
    for (size_t i = 0; i < HP_ARRAY_LEN(pairs); i++)
        for (size_t s = 0; s < HP_ARRAY_LEN(shapes); s++) {
            hp_th h;
            hp_th_init(&h);
            hp_value g = cc_rand_input(&h, shapes[s], 1, -2, 2);
            hp_value x =
                cc_rand_input(&h, shapes[s], 2, pairs[i] == HP_OP_TANH_BACKWARD ? -1 : 0, 1);
            bool attr = pairs[i] == HP_OP_GELU_BACKWARD || pairs[i] == HP_OP_THRESHOLD_BACKWARD;
            hp_attr a = pairs[i] == HP_OP_GELU_BACKWARD ? hp_attr_int(HP_ATTR_APPROXIMATE, 1)
                                                        : hp_attr_float(HP_ATTR_VALUE, 0.3);
            hp_value v = node1(&h, pairs[i], (hp_value[]){g, x}, 2, &a, attr ? 1 : 0);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
    const hp_dtype all[] = {HP_F32, HP_I32, HP_I64, HP_BOOL, HP_BF16, HP_F16};
    for (size_t f = 0; f < HP_ARRAY_LEN(all); f++)
        for (size_t t = 0; t < HP_ARRAY_LEN(all); t++) {
            hp_th h;
            hp_th_init(&h);
            hp_type ty = hp_type_make(all[f], 2, (int64_t[]){37, 29});
            hp_value x = cc_rand_input(&h, ty, f * 7 + t, -60, 60);
            for (int64_t i = 0; i < hp_type_numel(&ty); i += 5) h.in[0].data[i] = 0;
            hp_attr a = hp_attr_dtype(HP_ATTR_DTYPE, all[t]);
            hp_value v = node1(&h, HP_OP_TO_COPY, &x, 1, &a, 1);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
    hp_backend_free(be);
}

Test(cuda_ops, reductions_and_data_movement) {
    hp_backend *be = cu_backend();
    static const struct {
        int rank;
        int64_t s[4];
        int nd;
        int64_t dims[3];
    } rc[] = {
        {3, {4, 5, 6}, 0, {0}},       {3, {4, 5, 6}, 1, {1}},
        {3, {4, 5, 6}, 2, {0, 2}},    {3, {4, 5, 6}, 1, {-1}},
        {4, {3, 1, 4, 5}, 2, {1, 3}}, {2, {300, 200}, 1, {0}},
        {1, {70001}, 1, {0}},         {0, {0}, 0, {0}},
        {3, {2, 9000, 3}, 1, {1}},    {2, {3, 0}, 1, {1}},
    };
    const hp_op red[] = {HP_OP_SUM, HP_OP_MEAN, HP_OP_AMAX};
    for (size_t o = 0; o < HP_ARRAY_LEN(red); o++)
        for (size_t c = 0; c < HP_ARRAY_LEN(rc); c++)
            for (int keep = 0; keep < 2; keep++) {
                hp_type t = hp_type_make(HP_F32, rc[c].rank, rc[c].s);
                if (red[o] == HP_OP_AMAX && hp_type_numel(&t) == 0) continue;
                hp_attr a[2] = {hp_attr_ints(HP_ATTR_DIMS, rc[c].nd, rc[c].dims),
                                hp_attr_int(HP_ATTR_KEEPDIM, keep)};
                one(be, red[o], &t, 1, a, 2, -9, 9, TOL_REDUCE);
            }
    hp_type ti = TY(HP_I64, 40, 30);
    hp_attr sa[2] = {hp_attr_ints(HP_ATTR_DIMS, 1, (int64_t[]){0}),
                     hp_attr_int(HP_ATTR_KEEPDIM, 0)};
    one(be, HP_OP_SUM, &ti, 1, sa, 2, -9, 9, 0);

    hp_type t4 = TY(HP_F32, 2, 70, 8, 33);
    hp_attr perm = hp_attr_ints(HP_ATTR_PERM, 4, (int64_t[]){0, 2, 1, 3});
    one(be, HP_OP_PERMUTE, &t4, 1, &perm, 1, -1, 1, 0);
    hp_attr tr[2] = {hp_attr_int(HP_ATTR_DIM0, 1), hp_attr_int(HP_ATTR_DIM1, -1)};
    hp_type t3 = TY(HP_BF16, 6, 65, 40);
    one(be, HP_OP_TRANSPOSE, &t3, 1, tr, 2, -1, 1, 0);
    hp_type t2 = TY(HP_F32, 130, 70);
    one(be, HP_OP_T, &t2, 1, NULL, 0, -1, 1, 0);
    /* rows that stay contiguous (attention's [B,T,H,D] <-> [B,H,T,D]) move 16 bytes a thread; a
     * batched swap of the last two dims goes through shared-memory tiles */
    hp_type t5 = TY(HP_BF16, 2, 37, 4, 64);
    one(be, HP_OP_PERMUTE, &t5, 1, &perm, 1, -1, 1, 0);
    hp_attr tr2[2] = {hp_attr_int(HP_ATTR_DIM0, 1), hp_attr_int(HP_ATTR_DIM1, 2)};
    hp_type t6 = TY(HP_F32, 3, 33, 65);
    one(be, HP_OP_TRANSPOSE, &t6, 1, tr2, 2, -1, 1, 0);
    hp_attr vs = hp_attr_ints(HP_ATTR_SHAPE, 2, (int64_t[]){70, -1});
    one(be, HP_OP_VIEW, &t2, 1, &vs, 1, -1, 1, 0);
    one(be, HP_OP_RESHAPE, &t2, 1, &vs, 1, -1, 1, 0);
    one(be, HP_OP_CLONE, &t2, 1, NULL, 0, -1, 1, 0);
    one(be, HP_OP_DETACH, &t2, 1, NULL, 0, -1, 1, 0);
    hp_attr d0 = hp_attr_int(HP_ATTR_DIM, 0);
    one(be, HP_OP_UNSQUEEZE, &t2, 1, &d0, 1, -1, 1, 0);
    hp_type t1 = TY(HP_F32, 1, 7);
    one(be, HP_OP_SQUEEZE, &t1, 1, &d0, 1, -1, 1, 0);
    hp_type te = TY(HP_F32, 2, 1, 7);
    hp_attr ex = hp_attr_ints(HP_ATTR_SHAPE, 3, (int64_t[]){-1, 4, 7});
    one(be, HP_OP_EXPAND, &te, 1, &ex, 1, -1, 1, 0);
    hp_attr sl[4] = {hp_attr_int(HP_ATTR_DIM, -1), hp_attr_int(HP_ATTR_START, 1),
                     hp_attr_int(HP_ATTR_END, 100), hp_attr_int(HP_ATTR_STEP, 2)};
    one(be, HP_OP_SLICE, &t3, 1, sl, 4, -1, 1, 0);
    {
        hp_th h;
        hp_th_init(&h);
        hp_value g = cc_rand_input(&h, TY(HP_F32, 6, 65, 20), 3, -1, 1);
        hp_attr b[5] = {sl[0], sl[1], sl[2], sl[3],
                        hp_attr_ints(HP_ATTR_SHAPE, 3, (int64_t[]){6, 65, 40})};
        hp_value v = node1(&h, HP_OP_SLICE_BACKWARD, &g, 1, b, 5);
        cc_check(be, &h, v, 0, 0);
        hp_th_fini(&h);
    }
    {
        hp_th h;
        hp_th_init(&h);
        hp_value in[3];
        for (int k = 0; k < 3; k++)
            in[k] = cc_rand_input(&h, TY(HP_F32, 4, k == 1 ? 0 : 3 + 40 * k, 6), k, -9, 9);
        hp_attr a = hp_attr_int(HP_ATTR_DIM, 1);
        hp_value v = node1(&h, HP_OP_CAT, in, 3, &a, 1);
        cc_check(be, &h, v, 0, 0);
        hp_th_fini(&h);
    }
    /* group_size-1 collectives are copies */
    hp_type tc = TY(HP_F32, 6, 5);
    hp_attr gs[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 1), hp_attr_int(HP_ATTR_REDUCE_OP, 1)};
    one(be, HP_OP_ALL_GATHER, &tc, 1, gs, 1, -3, 3, 0);
    one(be, HP_OP_REDUCE_SCATTER, &tc, 1, gs, 2, -3, 3, 0);
    one(be, HP_OP_ALL_REDUCE, &tc, 1, gs, 2, -3, 3, 0);
    one(be, HP_OP_WAIT_TENSOR, &tc, 1, NULL, 0, -3, 3, 0);
    hp_backend_free(be);
}

/* wide: mm{dtype=f32} (bf16 operands, the f32 accumulators stored) */
static void matmul_one(hp_backend *be, hp_op op, hp_dtype dt, int64_t bt, int64_t m, int64_t k,
                       int64_t n, unsigned flags, double tol, bool wide) {
    hp_th h;
    hp_th_init(&h);
    bool batched = op == HP_OP_BMM, ta = flags & HP_CALL_TRANS_A, tb = flags & HP_CALL_TRANS_B;
    hp_value bias = HP_NO_VALUE;
    if (op == HP_OP_ADDMM) bias = cc_rand_input(&h, TY(dt, n), 5, -1, 1);
    hp_type at =
        batched ? (ta ? TY(dt, bt, k, m) : TY(dt, bt, m, k)) : (ta ? TY(dt, k, m) : TY(dt, m, k));
    hp_type btp =
        batched ? (tb ? TY(dt, bt, n, k) : TY(dt, bt, k, n)) : (tb ? TY(dt, n, k) : TY(dt, k, n));
    hp_value a = cc_rand_input(&h, at, 1, -1, 1), b = cc_rand_input(&h, btp, 2, -1, 1);
    round_inputs(&h);
    if (ta) a = batched ? hp_transpose(h.g, a, 1, 2) : hp_t(h.g, a);
    if (tb) b = batched ? hp_transpose(h.g, b, -1, -2) : hp_t(h.g, b);
    hp_value v;
    if (op == HP_OP_ADDMM) {
        hp_attr ab[2] = {hp_attr_float(HP_ATTR_ALPHA, 0.5), hp_attr_float(HP_ATTR_BETA, -2.0)};
        v = node1(&h, op, (hp_value[]){bias, a, b}, 3, ab, 2);
    } else {
        hp_attr w = hp_attr_dtype(HP_ATTR_DTYPE, HP_F32);
        v = node1(&h, op, (hp_value[]){a, b}, 2, wide ? &w : NULL, wide);
    }
    cc_check(be, &h, v, flags, tol);
    hp_th_fini(&h);
}

Test(cuda_ops, matrix_products_on_cublaslt) {
    hp_backend *be = cu_backend();
    static const int64_t dims[][4] = {{1, 3, 4, 5},  {2, 70, 130, 90}, {3, 1, 1, 1},
                                      {2, 17, 0, 9}, {4, 33, 16, 64},  {1, 256, 512, 384}};
    for (size_t d = 0; d < HP_ARRAY_LEN(dims); d++)
        for (unsigned f = 0; f < 4; f++) {
            matmul_one(be, HP_OP_MM, HP_F32, 1, dims[d][1], dims[d][2], dims[d][3], f, TOL_REDUCE,
                       false);
            matmul_one(be, HP_OP_BMM, HP_F32, dims[d][0], dims[d][1], dims[d][2], dims[d][3], f,
                       TOL_REDUCE, false);
            matmul_one(be, HP_OP_ADDMM, HP_F32, 1, dims[d][1], dims[d][2], dims[d][3], f,
                       TOL_REDUCE, false);
            /* bf16 inputs, f32 accumulation: only the output's rounding, or none (wide) */
            matmul_one(be, HP_OP_MM, HP_BF16, 1, dims[d][1], dims[d][2], dims[d][3], f, TOL_BF16,
                       false);
            matmul_one(be, HP_OP_MM, HP_BF16, 1, dims[d][1], dims[d][2], dims[d][3], f, TOL_REDUCE,
                       true);
        }
    hp_backend_free(be);
}

/* The nn ops with every floating operand of type fp (bf16: staged through f32, as the cpu
 * backend, within bf16 rounding of the f32 reference). */
static void nn_ops_in(hp_backend *be, hp_dtype fp, double tol_s, double tol_r) {
    const hp_dtype its[] = {HP_I64, HP_I32};
    for (size_t d = 0; d < HP_ARRAY_LEN(its); d++) {
        hp_th h;
        hp_th_init(&h);
        hp_value w = cc_rand_input(&h, TY(fp, 100, 64), 1, -1, 1);
        hp_value idx = cc_rand_input(&h, TY(its[d], 2000), 2, 0, 100);
        hp_value y = node1(&h, HP_OP_EMBEDDING, (hp_value[]){w, idx}, 2, NULL, 0);
        round_inputs(&h);
        cc_check(be, &h, y, 0, tol_s);
        hp_th_fini(&h);
        hp_th_init(&h);
        hp_value g = cc_rand_input(&h, TY(fp, 2000, 64), 1, -1, 1);
        idx = cc_rand_input(&h, TY(its[d], 2000), 2, 0, 20); /* repeats */
        hp_attr a[3] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, 100), hp_attr_int(HP_ATTR_PADDING_IDX, 5),
                        hp_attr_dtype(HP_ATTR_DTYPE, HP_F32)};
        y = node1(&h, HP_OP_EMBEDDING_DENSE_BACKWARD, (hp_value[]){g, idx}, 2, a, 2);
        round_inputs(&h);
        cc_check(be, &h, y, 0, tol_r);
        hp_th_fini(&h);
        /* {dtype=f32}: the rows summed in f32 and stored so, also from bf16 gradients */
        hp_th_init(&h);
        g = cc_rand_input(&h, TY(fp, 2000, 64), 1, -1, 1);
        idx = cc_rand_input(&h, TY(its[d], 2000), 2, 0, 20);
        y = node1(&h, HP_OP_EMBEDDING_DENSE_BACKWARD, (hp_value[]){g, idx}, 2, a, 3);
        round_inputs(&h);
        cc_check(be, &h, y, 0, 1e-4);
        hp_th_fini(&h);
        /* the vocab-parallel form (the TP plan's): 4 chunks of 5 rows at starts that overlap,
         * leave gaps and hold indices past the vocabulary (those read zeros) */
        hp_th_init(&h);
        hp_value cw = cc_rand_input(&h, TY(fp, 20, 8), 1, -1, 1);
        idx = cc_rand_input(&h, TY(its[d], 3, 7), 2, 0, 30);
        hp_value base = cc_rand_input(&h, TY(its[d], 4), 3, 0, 25);
        y = node1(&h, HP_OP_CHUNKED_EMBEDDING, (hp_value[]){cw, idx, base}, 3, NULL, 0);
        round_inputs(&h);
        cc_check(be, &h, y, 0, tol_s);
        hp_th_fini(&h);
        hp_th_init(&h);
        g = cc_rand_input(&h, TY(fp, 3, 7, 8), 1, -1, 1);
        idx = cc_rand_input(&h, TY(its[d], 3, 7), 2, 0, 30);
        base = cc_rand_input(&h, TY(its[d], 4), 3, 0, 25);
        hp_attr nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 20);
        y = node1(&h, HP_OP_CHUNKED_EMBEDDING_BACKWARD, (hp_value[]){g, idx, base}, 3, &nw, 1);
        round_inputs(&h);
        cc_check(be, &h, y, 0, tol_r);
        hp_th_fini(&h);
    }
    static const struct {
        int rank;
        int64_t s[3];
        int64_t dim;
    } sc[] = {{2, {8, 50}, -1},
              {3, {5, 7, 3}, 0},
              {3, {5, 7, 3}, 1},
              {2, {64, 2048}, 1},
              {2, {3, 0}, -1}};
    const hp_op sm[] = {HP_OP_SOFTMAX, HP_OP_LOG_SOFTMAX};
    for (size_t i = 0; i < HP_ARRAY_LEN(sc); i++)
        for (int o = 0; o < 2; o++) {
            hp_type t = hp_type_make(fp, sc[i].rank, sc[i].s);
            hp_attr a = hp_attr_int(HP_ATTR_DIM, sc[i].dim);
            one(be, sm[o], &t, 1, &a, 1, -20, 20, tol_r);
            hp_th h;
            hp_th_init(&h);
            hp_value g = cc_rand_input(&h, t, 3, -1, 1);
            hp_value y = cc_rand_input(&h, t, 4, o ? -8 : 0, o ? 0 : 1);
            hp_op bop = o ? HP_OP_LOG_SOFTMAX_BACKWARD : HP_OP_SOFTMAX_BACKWARD;
            hp_value v = node1(&h, bop, (hp_value[]){g, y}, 2, &a, 1);
            round_inputs(&h);
            cc_check(be, &h, v, 0, tol_r);
            hp_th_fini(&h);
        }
    for (int red = 0; red < 3; red++)
        for (int ig = 0; ig < 2; ig++) {
            int64_t n = 3000, c = 11, ignore = ig ? 4 : -100;
            double count, *tg = cc_targets(n, c, (uint64_t)(n + red), ignore, &count);
            hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, red),
                            hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
            hp_th h;
            hp_th_init(&h);
            hp_value lp = cc_rand_input(&h, TY(fp, n, c), 1, -9, 0);
            hp_value t = cc_input(&h, TY(its[ig], n), tg);
            hp_value v = node1(&h, HP_OP_NLL_LOSS_FORWARD, (hp_value[]){lp, t}, 2, a, 2);
            round_inputs(&h);
            cc_check(be, &h, v, 0, tol_s);
            hp_th_fini(&h);
            hp_th_init(&h);
            hp_value g = cc_rand_input(&h, red ? TY0(fp) : TY(fp, n), 1, 0.5, 2);
            lp = cc_rand_input(&h, TY(fp, n, c), 2, -9, 0);
            t = cc_input(&h, TY(its[ig], n), tg);
            hp_value tw = cc_input(&h, TY0(fp), &count);
            v = node1(&h, HP_OP_NLL_LOSS_BACKWARD, (hp_value[]){g, lp, t, tw}, 4, a, 2);
            round_inputs(&h);
            cc_check(be, &h, v, 0, tol_s);
            hp_th_fini(&h);
            free(tg);
        }
    /* swiglu and its backward: sizes around the 8-element vectors */
    const int64_t sw_n[] = {1, 8, 33, 4099};
    for (size_t i = 0; i < HP_ARRAY_LEN(sw_n); i++) {
        hp_th h;
        hp_th_init(&h);
        hp_type t = TY(fp, sw_n[i]);
        hp_value a = cc_rand_input(&h, t, 1, -6, 6), b = cc_rand_input(&h, t, 2, -2, 2);
        hp_value g = cc_rand_input(&h, t, 3, -1, 1);
        hp_value v = node1(&h, HP_OP_SWIGLU, (hp_value[]){a, b}, 2, NULL, 0);
        hp_value w = node1(&h, HP_OP_SWIGLU_BACKWARD, (hp_value[]){g, a, b}, 3, NULL, 0);
        round_inputs(&h);
        cc_check(be, &h, v, 0, tol_s);
        cc_check(be, &h, w, 0, tol_s);
        hp_th_fini(&h);
    }
    /* the fused cross entropy: logits in fp (16-byte rows at 1024 and 4096 classes), lse /
     * grad / total_weight f32; any lse for the backward */
    const int64_t ce_c[] = {11, 1024, 4096};
    for (size_t ci = 0; ci < HP_ARRAY_LEN(ce_c); ci++)
        for (int red = 1; red < 3; red++) {
            int64_t n = ci == 2 ? 33 : 300, c = ce_c[ci], ignore = red == 1 ? -100 : 4;
            double count, *tg = cc_targets(n, c, (uint64_t)(n + red), ignore, &count);
            hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, red),
                            hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
            hp_th h;
            hp_th_init(&h);
            hp_value x = cc_rand_input(&h, TY(fp, n, c), 1, -6, 6);
            hp_value t = cc_input(&h, TY(its[red - 1], n), tg);
            hp_value v = node1(&h, HP_OP_FUSED_CROSS_ENTROPY, (hp_value[]){x, t}, 2, a, 2);
            round_inputs(&h);
            cc_check(be, &h, v, 0, tol_r);
            hp_th_fini(&h);
            hp_th_init(&h);
            hp_value g = cc_rand_input(&h, TY0(HP_F32), 1, 0.5, 2);
            x = cc_rand_input(&h, TY(fp, n, c), 2, -3, 3);
            t = cc_input(&h, TY(its[red - 1], n), tg);
            hp_value lse = cc_rand_input(&h, TY(HP_F32, n), 3, 2, 8);
            hp_value tw = cc_input(&h, TY0(HP_F32), &count);
            v = node1(&h, HP_OP_FUSED_CROSS_ENTROPY_BACKWARD, (hp_value[]){g, x, t, lse, tw}, 5, a,
                      2);
            round_inputs(&h);
            cc_check(be, &h, v, 0, tol_r);
            hp_th_fini(&h);
            free(tg);
        }
    static const struct {
        int rank;
        int64_t s[3];
    } nc[] = {{3, {4, 6, 32}}, {2, {3, 256}}, {2, {300, 2048}}, {1, {7}}, {2, {129, 5}}};
    for (size_t i = 0; i < HP_ARRAY_LEN(nc); i++) {
        hp_type t = hp_type_make(fp, nc[i].rank, nc[i].s), w = TY(fp, nc[i].s[nc[i].rank - 1]);
        hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
        hp_th h;
        hp_th_init(&h);
        hp_value x = cc_rand_input(&h, t, 1, -2, 2), wv = cc_rand_input(&h, w, 2, 0.5, 1.5);
        hp_value v = node1(&h, HP_OP_RMS_NORM, (hp_value[]){x, wv}, 2, &eps, 1);
        round_inputs(&h);
        cc_check(be, &h, v, 0, tol_r);
        hp_th_fini(&h);
        hp_th_init(&h);
        hp_type rt = t;
        rt.rank--;
        rt.dtype = HP_F32; /* rstd is f32 whatever x is */
        hp_value gy = cc_rand_input(&h, t, 1, -1, 1);
        x = cc_rand_input(&h, t, 2, -2, 2);
        wv = cc_rand_input(&h, w, 3, 0.5, 1.5);
        hp_value r = cc_rand_input(&h, rt, 4, 0.5, 2);
        v = node1(&h, HP_OP_RMS_NORM_BACKWARD, (hp_value[]){gy, x, wv, r}, 4, NULL, 0);
        round_inputs(&h);
        cc_check(be, &h, v, 0, tol_r);
        hp_th_fini(&h);
    }
    for (int inv = 0; inv < 2; inv++) {
        /* the last: a row of more pairs than one pass of the grid covers */
        hp_type ts[] = {TY(fp, 2, 9, 3, 8), TY(fp, 1, 2048, 4, 128), TY(fp, 1, 3, 130, 256)};
        for (size_t k = 0; k < HP_ARRAY_LEN(ts); k++) {
            hp_attr a[2] = {hp_attr_float(HP_ATTR_THETA, 500000),
                            hp_attr_int(HP_ATTR_INVERSE, inv)};
            one(be, HP_OP_ROTARY_EMB, &ts[k], 1, a, 2, -2, 2, tol_s);
        }
    }
}

Test(cuda_ops, nn_ops) {
    hp_backend *be = cu_backend();
    nn_ops_in(be, HP_F32, TOL_SIMPLE, TOL_REDUCE);
    hp_backend_free(be);
}

Test(cuda_ops, nn_ops_in_bf16) {
    hp_backend *be = cu_backend();
    nn_ops_in(be, HP_BF16, TOL_BF16, TOL_BF16);
    hp_backend_free(be);
}

/* Runs node v on the cuda backend twice and on the cpu backend once: the same bits each time. */
static void expect_cpu_bits(hp_backend *be, hp_th *h, hp_value v, const char *what) {
    hp_backend *cpu = cc_backend(2);
    cc_result a, b, c;
    hp_err e = {0};
    cr_assert_eq(cc_run(be, h, v.node, 0, &a, NULL, &e), HP_OK, "%s: %s", what, e.msg);
    cr_assert_eq(cc_run(be, h, v.node, 0, &b, NULL, &e), HP_OK, "%s: %s", what, e.msg);
    cr_assert_eq(cc_run(cpu, h, v.node, 0, &c, NULL, &e), HP_OK, "%s (cpu): %s", what, e.msg);
    cr_expect(memcmp(a.out[0], b.out[0], a.bytes[0]) == 0, "%s: two cuda runs differ", what);
    cr_expect(memcmp(a.out[0], c.out[0], a.bytes[0]) == 0, "%s: cuda and cpu differ", what);
    cc_result_free(&a);
    cc_result_free(&b);
    cc_result_free(&c);
    hp_backend_free(cpu);
}

/* The embedding backwards sum each row's positions in order, as the cpu backend does, with no
 * atomics: the cpu's bits, run after run. 5000 positions (an 8192-key sort: tiles and global
 * merge stages), skewed indices (a few rows take hundreds of positions), a padding row; f32,
 * bf16 into f32 ({dtype=f32}) and bf16; and the vocab-parallel chunked form. */
Test(cuda_ops, embedding_backward_is_deterministic_and_the_cpus) {
    hp_backend *be = cu_backend();
    const int64_t n = 5000, v = 300, d = 40;
    double *ix = malloc((size_t)n * sizeof *ix);
    hp_th_rand(ix, n, 21, 0, 1);
    for (int64_t i = 0; i < n; i++) ix[i] = floor(ix[i] * ix[i] * ix[i] * (double)v);
    const struct {
        hp_dtype g;
        bool wide;
    } dts[] = {{HP_F32, false}, {HP_BF16, true}, {HP_BF16, false}};
    for (size_t t = 0; t < HP_ARRAY_LEN(dts); t++) {
        hp_th h;
        hp_th_init(&h);
        hp_value g = cc_rand_input(&h, TY(dts[t].g, n, d), 22, -1, 1);
        hp_value idx = cc_input(&h, TY(HP_I64, n), ix);
        hp_attr a[3] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, v), hp_attr_int(HP_ATTR_PADDING_IDX, 1),
                        hp_attr_dtype(HP_ATTR_DTYPE, HP_F32)};
        hp_value y = node1(&h, HP_OP_EMBEDDING_DENSE_BACKWARD, (hp_value[]){g, idx}, 2, a,
                           dts[t].wide ? 3 : 2);
        round_inputs(&h);
        char what[64];
        snprintf(what, sizeof what, "embedding backward (%s%s)", hp_dtype_name(dts[t].g),
                 dts[t].wide ? ", f32 out" : "");
        expect_cpu_bits(be, &h, y, what);
        hp_th_fini(&h);
    }
    hp_th h;
    hp_th_init(&h);
    hp_value g = cc_rand_input(&h, TY(HP_F32, n, d), 23, -1, 1);
    hp_value idx = cc_input(&h, TY(HP_I64, n), ix);
    hp_value base = cc_input(&h, TY(HP_I64, 3), (double[]){0, 50, 200}); /* overlapping, a gap */
    hp_attr nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 3 * 80);
    hp_value y = node1(&h, HP_OP_CHUNKED_EMBEDDING_BACKWARD, (hp_value[]){g, idx, base}, 3, &nw, 1);
    round_inputs(&h);
    expect_cpu_bits(be, &h, y, "chunked embedding backward");
    cc_check(be, &h, y, 0, TOL_REDUCE);
    hp_th_fini(&h);
    free(ix);
    hp_backend_free(be);
}

/* The call flags of an attention whose operands are stored [B, T, H, D]: none, every one (the
 * Llama graphs, their head transposes folded by the lowering), some. */
static const unsigned ATTN_BTHD_FWD[3] = {
    0, HP_CALL_BTHD_IN(0) | HP_CALL_BTHD_IN(1) | HP_CALL_BTHD_IN(2) | HP_CALL_BTHD_OUT(0),
    HP_CALL_BTHD_IN(1) | HP_CALL_BTHD_OUT(0)};
static const unsigned ATTN_BTHD_BWD[3] = {0, HP_CALL_BTHD_MASK,
                                          HP_CALL_BTHD_IN(0) | HP_CALL_BTHD_IN(2) |
                                              HP_CALL_BTHD_IN(4) | HP_CALL_BTHD_OUT(1)};

/* Attention: causal and not, GQA, T != S, head dims of the debugmodel (16) and the ~1B (128). */
static void attention_in(hp_backend *be, hp_dtype fp, double tol) {
    static const struct {
        int64_t b, h, hkv, t, s, d, dv;
        int causal;
    } ac[] = {
        {2, 4, 2, 37, 37, 16, 8, 1},  {1, 4, 4, 70, 70, 64, 64, 0},
        {2, 8, 2, 33, 50, 32, 32, 0}, {1, 2, 1, 130, 130, 128, 128, 1},
        {1, 3, 1, 1, 1, 16, 16, 1},
    };
    for (size_t i = 0; i < HP_ARRAY_LEN(ac); i++) {
        hp_th h;
        hp_th_init(&h);
        hp_value go = cc_rand_input(&h, TY(fp, ac[i].b, ac[i].h, ac[i].t, ac[i].dv), 1, -1, 1);
        hp_value q = cc_rand_input(&h, TY(fp, ac[i].b, ac[i].h, ac[i].t, ac[i].d), 2, -1, 1);
        hp_value k = cc_rand_input(&h, TY(fp, ac[i].b, ac[i].hkv, ac[i].s, ac[i].d), 3, -1, 1);
        hp_value v = cc_rand_input(&h, TY(fp, ac[i].b, ac[i].hkv, ac[i].s, ac[i].dv), 4, -1, 1);
        hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 1.0 / sqrt((double)ac[i].d)),
                        hp_attr_int(HP_ATTR_CAUSAL, ac[i].causal)};
        hp_value o = node1(&h, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, 2);
        round_inputs(&h);
        hp_value gb =
            node1(&h, HP_OP_SDPA_BACKWARD, (hp_value[]){go, q, k, v, o, hp_out(o, 1)}, 6, a, 2);
        /* [B, H, T, D] operands, then [B, T, H, D] ones (HP_CALL_BTHD_*: the lowering's folded
         * head transposes): all of them, then a mix */
        for (int f = 0; f < 3; f++) {
            cc_check(be, &h, o, ATTN_BTHD_FWD[f], tol);
            cc_check(be, &h, gb, ATTN_BTHD_BWD[f], tol);
        }
        hp_th_fini(&h);
    }
}

Test(cuda_ops, attention_forward_and_backward) {
    hp_backend *be = cu_backend();
    attention_in(be, HP_F32, TOL_REDUCE);
    hp_backend_free(be);
}

Test(cuda_ops, attention_in_bf16) {
    hp_backend *be = cu_backend();
    attention_in(be, HP_BF16, TOL_BF16);
    hp_backend_free(be);
}

/* Runs node v and checks every output element within tol (as cc_check) and the whole within
 * rel in relative norm, ||got - ref|| / ||ref||. */
static void check_rel(hp_backend *be, hp_th *h, hp_value v, unsigned flags, double tol,
                      double rel) {
    cc_result r;
    hp_tensor ref[HP_MAX_OUTS];
    hp_err e = {0};
    const char *name = hp_op_get(h->g->nodes[v.node].op)->name;
    cr_assert_eq(cc_run(be, h, v.node, flags, &r, ref, &e), HP_OK, "%s: %s", name, e.msg);
    for (int k = 0; k < r.n_out; k++) {
        int64_t n = hp_type_numel(&r.type[k]);
        double *got = malloc((size_t)(n > 0 ? n : 1) * sizeof *got), e2 = 0, r2 = 0;
        for (int64_t i = 0; i < n; i++) {
            got[i] = cc_unpack1(r.out[k], i, r.type[k].dtype);
            e2 += (got[i] - ref[k].data[i]) * (got[i] - ref[k].data[i]);
            r2 += ref[k].data[i] * ref[k].data[i];
        }
        char what[96];
        snprintf(what, sizeof what, "%s output %d", name, k);
        hp_th_expect_close(got, ref[k].data, n, tol, what);
        cr_assert(e2 <= rel * rel * r2, "%s: relative error %.3g over %g", what, sqrt(e2 / r2),
                  rel);
        free(got);
        hp_tensor_free(&ref[k]);
    }
    cc_result_free(&r);
}

/* The tensor-core attention (bf16, head dims 16, 32, 48, 64, 80, 96 and 128) over several key tiles
 * (each kernel's double-buffered stages reused several times): rows and keys past a tile's end,
 * GQA, T != S (causal with S > T: key blocks no query sees, whose dK and dV are zeros), and scores
 * of a wide range (the online softmax rescales); the forward in both of its shapes (32 query rows
 * a warp, the default, and 16: HP_CUDA_FLASH_ROWS). */
Test(cuda_ops, flash_attention_in_bf16_over_tiles) {
    hp_backend *be = cu_backend();
    static const struct {
        int64_t b, h, hkv, t, s, d;
        int causal;
        double range;
    } ac[] = {
        {1, 4, 1, 200, 200, 64, 1, 3},  {1, 2, 2, 130, 190, 128, 0, 3},
        {2, 4, 2, 150, 150, 128, 1, 1}, {1, 2, 1, 64, 64, 64, 1, 4},
        {1, 2, 1, 70, 200, 64, 1, 2},   {2, 4, 2, 100, 100, 16, 1, 3},
        {1, 3, 1, 90, 150, 32, 0, 2},   {1, 2, 1, 140, 140, 96, 1, 3},
        {1, 4, 2, 130, 130, 48, 1, 3},  {1, 2, 1, 100, 170, 80, 0, 2},
    };
    /* both forward shapes: 32 query rows a warp (the default) and 16 */
    for (size_t i = 0; i < 2 * HP_ARRAY_LEN(ac); i++) {
        if (i % HP_ARRAY_LEN(ac) == 0) setenv("HP_CUDA_FLASH_ROWS", i ? "16" : "32", 1);
        size_t c = i % HP_ARRAY_LEN(ac);
        hp_th h;
        hp_th_init(&h);
        double x = ac[c].range;
        hp_value go = cc_rand_input(&h, TY(HP_BF16, ac[c].b, ac[c].h, ac[c].t, ac[c].d), 11, -1, 1);
        hp_value q = cc_rand_input(&h, TY(HP_BF16, ac[c].b, ac[c].h, ac[c].t, ac[c].d), 12, -x, x);
        hp_value k =
            cc_rand_input(&h, TY(HP_BF16, ac[c].b, ac[c].hkv, ac[c].s, ac[c].d), 13, -x, x);
        hp_value v =
            cc_rand_input(&h, TY(HP_BF16, ac[c].b, ac[c].hkv, ac[c].s, ac[c].d), 14, -1, 1);
        hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 1.0 / sqrt((double)ac[c].d)),
                        hp_attr_int(HP_ATTR_CAUSAL, ac[c].causal)};
        hp_value o = node1(&h, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, 2);
        round_inputs(&h);
        /* operands [B, H, T, D], then (the lowering's folded head transposes) [B, T, H, D] */
        int f = (int)(c % 3);
        check_rel(be, &h, o, ATTN_BTHD_FWD[f], TOL_BF16, 1e-2);
        hp_value gb =
            node1(&h, HP_OP_SDPA_BACKWARD, (hp_value[]){go, q, k, v, o, hp_out(o, 1)}, 6, a, 2);
        check_rel(be, &h, gb, ATTN_BTHD_BWD[f], TOL_BF16, 1e-2);
        hp_th_fini(&h);
    }
    unsetenv("HP_CUDA_FLASH_ROWS");
    hp_backend_free(be);
}

/* The ops of exported PyTorch models (GPT-2 style) that the Llama graphs do not use: LayerNorm
 * and its backward, tril, bitwise_not, arange, native_dropout and its backward (whose mask is
 * the reference evaluator's: hp/rng.h's Philox draw), in f32 and bf16. */
static void exported_ops_in(hp_backend *be, hp_dtype fp, double tol) {
    static const struct {
        int rank;
        int64_t s[3];
    } ln[] = {{3, {4, 6, 32}}, {2, {3, 256}}, {2, {300, 64}}, {1, {7}}, {2, {129, 5}}};
    for (size_t i = 0; i < HP_ARRAY_LEN(ln); i++) {
        hp_type t = hp_type_make(fp, ln[i].rank, ln[i].s), w = TY(fp, ln[i].s[ln[i].rank - 1]);
        hp_type st = t;
        st.shape[st.rank - 1] = 1;
        st.dtype = HP_F32; /* the saved statistics stay f32 under bf16 */
        hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
        hp_th h;
        hp_th_init(&h);
        hp_value x = cc_rand_input(&h, t, 1, -2, 3), wv = cc_rand_input(&h, w, 2, 0.5, 1.5);
        hp_value b = cc_rand_input(&h, w, 3, -1, 1);
        hp_value v = node1(&h, HP_OP_LAYER_NORM, (hp_value[]){x, wv, b}, 3, &eps, 1);
        round_inputs(&h);
        cc_check(be, &h, v, 0, tol);
        hp_th_fini(&h);
        hp_th_init(&h);
        hp_value gy = cc_rand_input(&h, t, 1, -1, 1);
        x = cc_rand_input(&h, t, 2, -2, 2);
        hp_value mu = cc_rand_input(&h, st, 3, -0.5, 0.5), r = cc_rand_input(&h, st, 4, 0.5, 2);
        wv = cc_rand_input(&h, w, 5, 0.5, 1.5);
        v = node1(&h, HP_OP_LAYER_NORM_BACKWARD, (hp_value[]){gy, x, mu, r, wv}, 5, NULL, 0);
        round_inputs(&h);
        cc_check(be, &h, v, 0, tol);
        hp_th_fini(&h);
    }
    const hp_dtype tdt[] = {fp, HP_I64, HP_BOOL};
    const int64_t diags[] = {0, -2, 3, 9};
    for (size_t d = 0; d < HP_ARRAY_LEN(tdt); d++)
        for (size_t k = 0; k < HP_ARRAY_LEN(diags); k++) {
            hp_type ts[] = {TY(tdt[d], 5, 5), TY(tdt[d], 3, 4, 7), TY(tdt[d], 2, 0, 3)};
            for (size_t i = 0; i < HP_ARRAY_LEN(ts); i++) {
                hp_attr a = hp_attr_int(HP_ATTR_DIAGONAL, diags[k]);
                one(be, HP_OP_TRIL, &ts[i], 1, &a, 1, -5, 5, 0);
            }
        }
    hp_type nt[] = {TY(HP_BOOL, 3, 70000), TY(HP_I32, 5), TY(HP_I64, 2, 3), TY0(HP_BOOL)};
    for (size_t i = 0; i < HP_ARRAY_LEN(nt); i++)
        one(be, HP_OP_BITWISE_NOT, &nt[i], 1, NULL, 0, -9, 9, 0);
    const hp_dtype adt[] = {HP_I64, HP_I32, HP_F32};
    const int64_t ar[][3] = {{0, 16, 1}, {-3, 40000, 7}, {5, 2, 1}};
    for (size_t d = 0; d < HP_ARRAY_LEN(adt); d++)
        for (size_t k = 0; k < HP_ARRAY_LEN(ar); k++) {
            hp_th h;
            hp_th_init(&h);
            hp_attr a[4] = {hp_attr_int(HP_ATTR_START, ar[k][0]),
                            hp_attr_int(HP_ATTR_END, ar[k][1]), hp_attr_int(HP_ATTR_STEP, ar[k][2]),
                            hp_attr_dtype(HP_ATTR_DTYPE, adt[d])};
            cc_check(be, &h, node1(&h, HP_OP_ARANGE, NULL, 0, a, 4), 0, 0);
            hp_th_fini(&h);
        }
    const double ps[] = {0, 0.1, 0.5};
    for (size_t i = 0; i < HP_ARRAY_LEN(ps); i++) {
        hp_type ts[] = {TY(fp, 3, 70001), TY(fp, 2, 3, 5), TY0(fp), TY(fp, 0, 4)};
        for (size_t k = 0; k < HP_ARRAY_LEN(ts); k++) {
            hp_attr a[2] = {hp_attr_float(HP_ATTR_P, ps[i]), hp_attr_str(HP_ATTR_FQN, "d")};
            one(be, HP_OP_NATIVE_DROPOUT, &ts[k], 1, a, 2, -2, 2, tol);
            hp_type in[2] = {ts[k], ts[k]};
            in[1].dtype = HP_BOOL;
            hp_attr sc = hp_attr_float(HP_ATTR_SCALE, 1.0 / (1.0 - ps[i]));
            one(be, HP_OP_NATIVE_DROPOUT_BACKWARD, in, 2, &sc, 1, -2, 2, tol);
        }
    }
}

Test(cuda_ops, exported_model_ops) {
    hp_backend *be = cu_backend();
    exported_ops_in(be, HP_F32, TOL_REDUCE);
    hp_backend_free(be);
}

Test(cuda_ops, exported_model_ops_in_bf16) {
    hp_backend *be = cu_backend();
    exported_ops_in(be, HP_BF16, TOL_BF16);
    hp_backend_free(be);
}

/* A node no kernel runs: HP_UNSUPPORTED naming the op and its dtype, nothing launched. */
Test(cuda_ops, an_op_without_a_kernel_is_unsupported_naming_it) {
    hp_backend *be = cu_backend();
    hp_th h;
    hp_th_init(&h);
    hp_value x = cc_rand_input(&h, TY(HP_F32, 4, 4), 1, -1, 1);
    cc_result r;
    hp_err e = {0};
    cr_assert_eq(cc_run(be, &h, x.node, 0, &r, NULL, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "cuda: placeholder (f32) has no kernel"), "%s", e.msg);
    hp_th_fini(&h);
    /* a dtype a kernel does not take */
    hp_th_init(&h);
    hp_value i = cc_rand_input(&h, TY(HP_I64, 4), 1, -9, 9);
    hp_value v = node1(&h, HP_OP_ADD, (hp_value[]){i, i}, 2, NULL, 0);
    cr_assert_eq(cc_run(be, &h, v.node, 0, &r, NULL, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "cuda: add: dtype i64 of input 0 is not supported"), "%s", e.msg);
    hp_th_fini(&h);
    hp_backend_free(be);
}
