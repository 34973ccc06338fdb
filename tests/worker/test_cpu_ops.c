/* tests/worker/test_cpu_ops.c — every op of the op table on the cpu backend against the
 * reference evaluator (F32 precision), on random inputs of several shapes: broadcasting,
 * negative dims, empty and scalar tensors, integer and bool dtypes where the op takes them,
 * TRANS_A/TRANS_B matrix products, shapes large enough to take the parallel paths. A test fails
 * when an op of the table has no case here. Attention has its own file (test_cpu_attention.c).
 *
 * Tolerances (cpu_check.h): 1e-5 for elementwise, shape, cast, embedding and loss ops; 1e-4
 * for matmul, reductions, softmax and norms — absolute below magnitude 1, relative above.
 * bf16_matches_eval runs every case with its floating tensors in bf16, within 1e-2.
 */
#include "cpu_check.h"

#include "hp/build.h"

/* The floating dtype the cases build their tensors in: f32 for matches_eval, bf16 for
 * bf16_matches_eval (the cpu backend's bf16 storage: f32 compute, rounded on store). */
static hp_dtype FT = HP_F32;

/* bf16 keeps 8 significant bits: the kernel (f32 compute, one rounding) and the evaluator
 * (f64 compute, one rounding) may land one bf16 ulp (<= 2^-7 relative) apart. */
#define TOL_BF16 1e-2
#undef TOL_SIMPLE
#undef TOL_REDUCE
#define TOL_SIMPLE (FT == HP_F32 ? 1e-5 : TOL_BF16)
#define TOL_REDUCE (FT == HP_F32 ? 1e-4 : TOL_BF16)

#define TH 3 /* threads: more than the cores of a small CI machine, to exercise the pool */

typedef void (*case_fn)(hp_backend *be, hp_op op);

/* ---- helpers -------------------------------------------------------------------------------- */

static hp_value node1(hp_th *h, hp_op op, const hp_value *in, int n_in, const hp_attr *a, int na) {
    hp_value v = hp_build(h->g, op, in, n_in, a, na);
    cr_assert(!hp_graph_failed(h->g), "%s: %s", hp_op_get(op)->name, h->g->err.msg);
    return v;
}

/* One single-op graph over random inputs of the given types, checked. */
static void one(hp_backend *be, hp_op op, const hp_type *types, int n_in, const hp_attr *a, int na,
                double lo, double hi, double tol) {
    hp_th h;
    hp_th_init(&h);
    hp_value in[8];
    for (int i = 0; i < n_in; i++) in[i] = cc_rand_input(&h, types[i], 100 + (uint64_t)i, lo, hi);
    hp_value v = node1(&h, op, in, n_in, a, na);
    cc_check(be, &h, v, 0, tol);
    hp_th_fini(&h);
}

static hp_attr ints(hp_attr_key k, int n, const int64_t *v) {
    return hp_attr_ints(k, n, v);
}

/* ---- creation ------------------------------------------------------------------------------- */

static void case_creation(hp_backend *be, hp_op op) {
    const hp_dtype dts[] = {FT, HP_I32, HP_I64, HP_BOOL};
    const int64_t shapes[][3] = {{3, 5, 0}, {0, 4, 0}, {70000, 0, 0}};
    const int ranks[] = {2, 2, 1};
    for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++)
        for (size_t s = 0; s < HP_ARRAY_LEN(ranks); s++)
            for (int r0 = 0; r0 < 2; r0++) {
                hp_th h;
                hp_th_init(&h);
                int rank = r0 ? 0 : ranks[s];
                hp_attr a[3] = {ints(HP_ATTR_SHAPE, rank, shapes[s]),
                                hp_attr_dtype(HP_ATTR_DTYPE, dts[d]),
                                hp_attr_float(HP_ATTR_VALUE, d % 2 ? -1.7 : 2.5)};
                hp_value v = node1(&h, op, NULL, 0, a, op == HP_OP_FULL ? 3 : 2);
                cc_check(be, &h, v, 0, TOL_SIMPLE);
                hp_th_fini(&h);
            }
}

/* ---- elementwise ---------------------------------------------------------------------------- */

/* Pairs of broadcastable shapes (rank 0..3). */
static const struct {
    int ra, rb;
    int64_t a[4], b[4];
} bshapes[] = {
    {2, 2, {4, 5}, {4, 5}},    {2, 1, {4, 5}, {5}},          {3, 2, {3, 1, 5}, {4, 1}},
    {0, 2, {0}, {2, 3}},       {3, 3, {2, 3, 1}, {1, 1, 4}}, {2, 1, {400, 97}, {97}},
    {2, 2, {300, 1}, {1, 77}}, {1, 1, {70001}, {70001}},     {2, 2, {0, 3}, {1, 3}},
};

static void case_binary(hp_backend *be, hp_op op) {
    bool cmp = op == HP_OP_EQ || op == HP_OP_LT;
    hp_dtype dts[] = {FT, HP_I32, HP_I64, HP_BOOL};
    for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++) {
        if (dts[d] == HP_BOOL && !cmp) continue;
        for (size_t s = 0; s < HP_ARRAY_LEN(bshapes); s++) {
            hp_type t[2] = {hp_type_make(dts[d], bshapes[s].ra, bshapes[s].a),
                            hp_type_make(dts[d], bshapes[s].rb, bshapes[s].b)};
            /* comparisons on a coarse grid so that ties happen; divisors kept away from 0 */
            hp_th h;
            hp_th_init(&h);
            double lo = cmp ? -3 : -9, hi = cmp ? 3 : 9;
            hp_value a = cc_rand_input(&h, t[0], 7 + s, lo, hi);
            hp_value b =
                cc_rand_input(&h, t[1], 9 + s, op == HP_OP_DIV ? 1 : lo, op == HP_OP_DIV ? 7 : hi);
            if (cmp && dts[d] == FT) {
                for (int k = 0; k < 2; k++) {
                    int64_t n = hp_type_numel(&h.in[k].type);
                    for (int64_t i = 0; i < n; i++) h.in[k].data[i] = floor(h.in[k].data[i]);
                }
            }
            hp_value v = node1(&h, op, (hp_value[]){a, b}, 2, NULL, 0);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
    }
}

static void case_where(hp_backend *be, hp_op op) {
    const hp_dtype dts[] = {FT, HP_I64, HP_BOOL};
    for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++)
        for (size_t s = 0; s < HP_ARRAY_LEN(bshapes); s++) {
            hp_th h;
            hp_th_init(&h);
            hp_value c =
                cc_rand_input(&h, hp_type_make(HP_BOOL, bshapes[s].ra, bshapes[s].a), s, -1, 1);
            hp_value a =
                cc_rand_input(&h, hp_type_make(dts[d], bshapes[s].rb, bshapes[s].b), s + 1, -5, 5);
            hp_value b = cc_rand_input(&h, hp_type_make(dts[d], 1, (int64_t[]){1}), s + 2, -5, 5);
            hp_value v = node1(&h, op, (hp_value[]){c, a, b}, 3, NULL, 0);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
}

static const struct {
    int rank;
    int64_t s[3];
} ushapes[] = {{0, {0}}, {1, {7}}, {2, {33, 65}}, {2, {300, 101}}, {1, {0}}};

static void unary_range(hp_backend *be, hp_op op, const hp_attr *a, int na, double lo, double hi) {
    for (size_t s = 0; s < HP_ARRAY_LEN(ushapes); s++) {
        hp_type t = hp_type_make(FT, ushapes[s].rank, ushapes[s].s);
        one(be, op, &t, 1, a, na, lo, hi, TOL_SIMPLE);
    }
}

static void case_unary(hp_backend *be, hp_op op) {
    switch (op) {
    case HP_OP_ADD_SCALAR:
    case HP_OP_MUL_SCALAR: {
        hp_attr a = hp_attr_float(HP_ATTR_VALUE, -0.37);
        unary_range(be, op, &a, 1, -4, 4);
        break;
    }
    case HP_OP_POW: {
        const double e[] = {2, 0.5, 3, -1.5, 1.7, -1, 0, 1};
        for (size_t i = 0; i < HP_ARRAY_LEN(e); i++) {
            hp_attr a = hp_attr_float(HP_ATTR_EXPONENT, e[i]);
            unary_range(be, op, &a, 1, 0.1, 3);
        }
        hp_attr a = hp_attr_float(HP_ATTR_EXPONENT, 2);
        unary_range(be, op, &a, 1, -3, 3);
        break;
    }
    case HP_OP_LOG:
    case HP_OP_SQRT:
    case HP_OP_RSQRT:
        unary_range(be, op, NULL, 0, 0.01, 20);
        break;
    case HP_OP_EXP:
        unary_range(be, op, NULL, 0, -20, 20);
        break;
    case HP_OP_SIN: /* RoPE's angles: position × frequency, up to thousands */
    case HP_OP_COS:
        unary_range(be, op, NULL, 0, -8, 8);
        unary_range(be, op, NULL, 0, -3000, 3000);
        break;
    case HP_OP_GELU:
        for (int ap = 0; ap < 2; ap++) {
            hp_attr a = hp_attr_int(HP_ATTR_APPROXIMATE, ap);
            unary_range(be, op, &a, 1, -6, 6);
        }
        break;
    default:
        unary_range(be, op, NULL, 0, -8, 8);
        break;
    }
}

static void case_backward_pair(hp_backend *be, hp_op op) {
    double lo = -6, hi = 6;
    if (op == HP_OP_TANH_BACKWARD) lo = -1, hi = 1;
    if (op == HP_OP_SIGMOID_BACKWARD) lo = 0, hi = 1;
    int variants = op == HP_OP_GELU_BACKWARD || op == HP_OP_THRESHOLD_BACKWARD ? 2 : 1;
    for (int var = 0; var < variants; var++)
        for (size_t s = 0; s < HP_ARRAY_LEN(ushapes); s++) {
            hp_type t = hp_type_make(FT, ushapes[s].rank, ushapes[s].s);
            hp_attr a = op == HP_OP_GELU_BACKWARD ? hp_attr_int(HP_ATTR_APPROXIMATE, var)
                                                  : hp_attr_float(HP_ATTR_VALUE, var * 0.3);
            hp_th h;
            hp_th_init(&h);
            hp_value g = cc_rand_input(&h, t, 1, -2, 2);
            hp_value x = cc_rand_input(&h, t, 2, lo, hi);
            hp_value v = node1(&h, op, (hp_value[]){g, x}, 2, &a, variants > 1 ? 1 : 0);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
}

static void case_to_copy(hp_backend *be, hp_op op) {
    const hp_dtype all[] = {HP_F32, HP_I32, HP_I64, HP_BOOL, HP_BF16, HP_F16};
    for (size_t f = 0; f < HP_ARRAY_LEN(all); f++)
        for (size_t t = 0; t < HP_ARRAY_LEN(all); t++) {
            hp_th h;
            hp_th_init(&h);
            hp_type ty = hp_type_make(all[f], 2, (int64_t[]){37, 29});
            hp_value x = cc_rand_input(&h, ty, f * 7 + t, -60, 60);
            int64_t n = hp_type_numel(&ty);
            for (int64_t i = 0; i < n; i += 5) h.in[0].data[i] = 0; /* zeros for ->bool */
            hp_attr a = hp_attr_dtype(HP_ATTR_DTYPE, all[t]);
            hp_value v = node1(&h, op, &x, 1, &a, 1);
            cc_check(be, &h, v, 0, TOL_SIMPLE);
            hp_th_fini(&h);
        }
}

/* ---- reductions ----------------------------------------------------------------------------- */

static void case_reduce(hp_backend *be, hp_op op) {
    static const struct {
        int rank;
        int64_t s[4];
        int nd;
        int64_t dims[3];
    } cases[] = {
        {3, {4, 5, 6}, 0, {0}},       {3, {4, 5, 6}, 1, {0}},       {3, {4, 5, 6}, 1, {1}},
        {3, {4, 5, 6}, 1, {-1}},      {3, {4, 5, 6}, 2, {0, 2}},    {3, {4, 5, 6}, 2, {-2, -1}},
        {4, {3, 1, 4, 5}, 2, {1, 3}}, {2, {300, 200}, 1, {0}},      {2, {300, 200}, 1, {1}},
        {2, {300, 200}, 0, {0}},      {1, {70001}, 1, {0}},         {0, {0}, 0, {0}},
        {3, {2, 9000, 3}, 1, {1}},    {3, {5000, 3, 7}, 2, {0, 2}}, {2, {3, 0}, 1, {1}},
    };
    hp_dtype dts[] = {FT, HP_I32, HP_I64};
    for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++) {
        if (op == HP_OP_MEAN && dts[d] != FT) continue;
        for (size_t c = 0; c < HP_ARRAY_LEN(cases); c++)
            for (int keep = 0; keep < 2; keep++) {
                hp_type t = hp_type_make(dts[d], cases[c].rank, cases[c].s);
                if (op == HP_OP_AMAX && hp_type_numel(&t) == 0) continue; /* refused */
                hp_attr a[2] = {ints(HP_ATTR_DIMS, cases[c].nd, cases[c].dims),
                                hp_attr_int(HP_ATTR_KEEPDIM, keep)};
                one(be, op, &t, 1, a, 2, -9, 9, TOL_REDUCE);
            }
    }
}

/* ---- shapes --------------------------------------------------------------------------------- */

static void case_view(hp_backend *be, hp_op op) {
    hp_type t = TY(FT, 4, 6);
    const int64_t s1[] = {2, 12}, s2[] = {-1, 3}, s3[] = {24};
    const int64_t *shapes[] = {s1, s2, s3};
    const int ranks[] = {2, 2, 1};
    for (int i = 0; i < 3; i++) {
        hp_attr a = ints(HP_ATTR_SHAPE, ranks[i], shapes[i]);
        one(be, op, &t, 1, &a, 1, -1, 1, TOL_SIMPLE);
    }
    hp_type ti = TY(HP_I64, 1000, 70);
    hp_attr a = ints(HP_ATTR_SHAPE, 2, (int64_t[]){70, -1});
    one(be, op, &ti, 1, &a, 1, -100, 100, TOL_SIMPLE);
}

static void case_simple_copy(hp_backend *be, hp_op op) {
    hp_type ts[] = {TY(FT, 3, 1, 4), TY(HP_I32, 1, 300, 200), TY(HP_BOOL, 5, 1)};
    for (size_t i = 0; i < HP_ARRAY_LEN(ts); i++) {
        const int64_t squeeze_dims[] = {-2, 0, -1};
        hp_attr a = hp_attr_int(HP_ATTR_DIM, op == HP_OP_SQUEEZE ? squeeze_dims[i] : -1);
        one(be, op, &ts[i], 1, &a, op == HP_OP_SQUEEZE || op == HP_OP_UNSQUEEZE ? 1 : 0, -5, 5,
            TOL_SIMPLE);
    }
}

static void case_permute(hp_backend *be, hp_op op) {
    if (op == HP_OP_PERMUTE) {
        const int64_t perms[][4] = {{0, 2, 1, 3}, {3, 2, 1, 0}, {-1, 0, 1, 2}, {1, 0, 2, 3}};
        for (size_t i = 0; i < HP_ARRAY_LEN(perms); i++) {
            hp_type t = TY(FT, 2, 3, 4, 5);
            hp_attr a = ints(HP_ATTR_PERM, 4, perms[i]);
            one(be, op, &t, 1, &a, 1, -1, 1, TOL_SIMPLE);
            hp_type big = TY(FT, 2, 70, 8, 33); /* [B, T, H, D] -> [B, H, T, D] and more */
            one(be, op, &big, 1, &a, 1, -1, 1, TOL_SIMPLE);
        }
        hp_type t2 = TY(HP_I64, 130, 70);
        hp_attr a = ints(HP_ATTR_PERM, 2, (int64_t[]){1, 0});
        one(be, op, &t2, 1, &a, 1, -50, 50, TOL_SIMPLE);
    } else if (op == HP_OP_TRANSPOSE) {
        const int64_t d[][2] = {{0, 1}, {1, -1}, {-3, 2}, {1, 1}};
        for (size_t i = 0; i < HP_ARRAY_LEN(d); i++) {
            hp_type t = TY(FT, 6, 65, 40);
            hp_attr a[2] = {hp_attr_int(HP_ATTR_DIM0, d[i][0]), hp_attr_int(HP_ATTR_DIM1, d[i][1])};
            one(be, op, &t, 1, a, 2, -1, 1, TOL_SIMPLE);
        }
    } else {
        hp_type ts[] = {TY(FT, 130, 70), TY(FT, 5), TY(FT, 3, 1), TY(HP_BF16, 40, 33)};
        for (size_t i = 0; i < HP_ARRAY_LEN(ts); i++) one(be, op, &ts[i], 1, NULL, 0, -1, 1, 0);
    }
}

static void case_expand(hp_backend *be, hp_op op) {
    static const struct {
        int ri, ro;
        int64_t in[3], out[3];
    } c[] = {{2, 3, {3, 1}, {2, 3, 4}},
             {1, 1, {1}, {5}},
             {2, 2, {1, 300}, {200, -1}},
             {0, 2, {0}, {3, 3}},
             {2, 3, {1, 7}, {-1, 4, 7}}};
    for (size_t i = 0; i < HP_ARRAY_LEN(c); i++) {
        hp_type t = hp_type_make(FT, c[i].ri, c[i].in);
        if (i == 4) t = hp_type_make(FT, 3, (int64_t[]){2, 1, 7});
        hp_attr a = ints(HP_ATTR_SHAPE, c[i].ro, c[i].out);
        one(be, op, &t, 1, &a, 1, -1, 1, TOL_SIMPLE);
    }
}

static const struct {
    int64_t dim, start, end, step;
} slices[] = {{-1, 1, 100, 2}, {0, -3, 100, 1}, {1, 0, 5, 3},
              {1, 4, 2, 1},    {2, 0, -1, 1},   {0, 1, 2, 1}};

static void case_slice(hp_backend *be, hp_op op) {
    for (size_t i = 0; i < HP_ARRAY_LEN(slices); i++) {
        hp_type t = TY(FT, 6, 65, 40);
        hp_attr a[4] = {
            hp_attr_int(HP_ATTR_DIM, slices[i].dim), hp_attr_int(HP_ATTR_START, slices[i].start),
            hp_attr_int(HP_ATTR_END, slices[i].end), hp_attr_int(HP_ATTR_STEP, slices[i].step)};
        if (op == HP_OP_SLICE) {
            one(be, op, &t, 1, a, 4, -1, 1, TOL_SIMPLE);
            continue;
        }
        /* slice_backward: the grad has the slice's shape */
        hp_th h;
        hp_th_init(&h);
        hp_graph *probe = hp_graph_new();
        hp_value x = hp_build_placeholder(probe, HP_INPUT_DATA, NULL, t, NULL);
        hp_value s = hp_build(probe, HP_OP_SLICE, &x, 1, a, 4);
        hp_type st = *hp_graph_type(probe, s);
        hp_graph_free(probe);
        hp_value g = cc_rand_input(&h, st, i, -1, 1);
        hp_attr b[5] = {a[0], a[1], a[2], a[3], ints(HP_ATTR_SHAPE, 3, t.shape)};
        hp_value v = node1(&h, op, &g, 1, b, 5);
        cc_check(be, &h, v, 0, TOL_SIMPLE);
        hp_th_fini(&h);
    }
}

static void case_cat(hp_backend *be, hp_op op) {
    const int64_t dims[] = {0, 1, -1};
    for (size_t d = 0; d < HP_ARRAY_LEN(dims); d++) {
        hp_th h;
        hp_th_init(&h);
        hp_value in[3];
        for (int k = 0; k < 3; k++) {
            int64_t s[3] = {4, 5, 6};
            s[(dims[d] + 3) % 3] = k == 1 ? 0 : 3 + k * 40; /* one empty input */
            in[k] = cc_rand_input(&h, hp_type_make(d == 2 ? HP_I64 : FT, 3, s), k, -9, 9);
        }
        hp_attr a = hp_attr_int(HP_ATTR_DIM, dims[d]);
        hp_value v = node1(&h, op, in, 3, &a, 1);
        cc_check(be, &h, v, 0, TOL_SIMPLE);
        hp_th_fini(&h);
    }
}

/* ---- matrix products ------------------------------------------------------------------------ */

/* a @ b with operands given transposed when the flags say so (a transpose node the backend
 * call folds). dims: m, k, n (and batch for bmm). */
/* wide: mm{dtype=f32}, the product's f32 accumulators stored (also from bf16 operands) */
static void matmul_one(hp_backend *be, hp_op op, int64_t bt, int64_t m, int64_t k, int64_t n,
                       unsigned flags, int bias_kind, double alpha, double beta, bool wide) {
    hp_th h;
    hp_th_init(&h);
    bool batched = op == HP_OP_BMM, ta = flags & HP_CALL_TRANS_A, tb = flags & HP_CALL_TRANS_B;
    hp_value bias = HP_NO_VALUE;
    if (op == HP_OP_ADDMM) {
        hp_type bts[] = {TY(FT, n), TY(FT, 1, n), TY(FT, m, 1), TY(FT, m, n), TY0(FT)};
        bias = cc_rand_input(&h, bts[bias_kind], 5, -1, 1);
    }
    hp_type at =
        batched ? (ta ? TY(FT, bt, k, m) : TY(FT, bt, m, k)) : (ta ? TY(FT, k, m) : TY(FT, m, k));
    hp_type btp =
        batched ? (tb ? TY(FT, bt, n, k) : TY(FT, bt, k, n)) : (tb ? TY(FT, n, k) : TY(FT, k, n));
    hp_value a = cc_rand_input(&h, at, 1, -1, 1), b = cc_rand_input(&h, btp, 2, -1, 1);
    if (ta) a = batched ? hp_transpose(h.g, a, 1, 2) : hp_t(h.g, a);
    if (tb) b = batched ? hp_transpose(h.g, b, -1, -2) : hp_t(h.g, b);
    hp_value v;
    if (op == HP_OP_ADDMM) {
        hp_attr at2[2] = {hp_attr_float(HP_ATTR_ALPHA, alpha), hp_attr_float(HP_ATTR_BETA, beta)};
        v = node1(&h, op, (hp_value[]){bias, a, b}, 3, at2, 2);
    } else {
        hp_attr w = hp_attr_dtype(HP_ATTR_DTYPE, HP_F32);
        v = node1(&h, op, (hp_value[]){a, b}, 2, wide ? &w : NULL, wide);
    }
    cc_check(be, &h, v, flags, wide ? 1e-4 : TOL_REDUCE);
    hp_th_fini(&h);
}

static void case_matmul(hp_backend *be, hp_op op) {
    static const int64_t dims[][4] = {{1, 3, 4, 5},  {2, 70, 130, 90}, {3, 1, 1, 1},
                                      {2, 17, 0, 9}, {1, 0, 5, 3},     {4, 33, 16, 64}};
    for (size_t d = 0; d < HP_ARRAY_LEN(dims); d++)
        for (unsigned f = 0; f < 4; f++) {
            if (op == HP_OP_ADDMM) {
                for (int bk = 0; bk < 5; bk++)
                    matmul_one(be, op, 1, dims[d][1], dims[d][2], dims[d][3], f, bk,
                               bk == 2 ? 1.0 : 0.5,
                               bk == 3   ? 0.0
                               : bk == 4 ? 1.0
                                         : -2.0,
                               false);
            } else {
                matmul_one(be, op, dims[d][0], dims[d][1], dims[d][2], dims[d][3], f, 0, 1, 1,
                           false);
                if (op == HP_OP_MM)
                    matmul_one(be, op, 1, dims[d][1], dims[d][2], dims[d][3], f, 0, 1, 1, true);
            }
        }
}

/* ---- neural-network ops --------------------------------------------------------------------- */

static void case_embedding(hp_backend *be, hp_op op) {
    const hp_dtype its[] = {HP_I64, HP_I32};
    for (size_t d = 0; d < HP_ARRAY_LEN(its); d++)
        for (int big = 0; big < 2; big++) {
            int64_t v = big ? 100 : 50, dm = big ? 64 : 8;
            hp_type it = big ? TY(its[d], 2000) : TY(its[d], 3, 7);
            hp_th h;
            hp_th_init(&h);
            hp_value v0;
            hp_value idx;
            if (op == HP_OP_EMBEDDING) {
                v0 = cc_rand_input(&h, TY(FT, v, dm), 1, -1, 1);
                idx = cc_rand_input(&h, it, 2, 0, (double)v);
                hp_attr a = hp_attr_int(HP_ATTR_PADDING_IDX, 3);
                hp_value y = node1(&h, op, (hp_value[]){v0, idx}, 2, &a, big);
                cc_check(be, &h, y, 0, TOL_SIMPLE);
            } else {
                hp_type gt = it;
                gt.dtype = FT;
                gt.shape[gt.rank++] = dm;
                v0 = cc_rand_input(&h, gt, 1, -1, 1);
                idx = cc_rand_input(&h, it, 2, 0, big ? 20 : (double)v); /* repeats */
                /* big: {dtype=f32}, the rows summed without a rounding to FT */
                hp_attr a[3] = {hp_attr_int(HP_ATTR_NUM_WEIGHTS, v),
                                hp_attr_int(HP_ATTR_PADDING_IDX, big ? 5 : -1),
                                hp_attr_dtype(HP_ATTR_DTYPE, HP_F32)};
                hp_value y = node1(&h, op, (hp_value[]){v0, idx}, 2, a, big ? 3 : 2);
                cc_check(be, &h, y, 0, big ? 1e-4 : TOL_REDUCE);
            }
            hp_th_fini(&h);
        }
}

/* chunked_embedding(_backward): 4 chunks of 5 rows at starts that overlap, leave gaps and
 * hold indices past the vocabulary (those read zeros). */
static void case_chunked_embedding(hp_backend *be, hp_op op) {
    const hp_dtype its[] = {HP_I64, HP_I32};
    for (size_t d = 0; d < HP_ARRAY_LEN(its); d++) {
        hp_th h;
        hp_th_init(&h);
        hp_type it = TY(its[d], 3, 7);
        hp_value idx = cc_rand_input(&h, it, 2, 0, 30);
        hp_value base = cc_rand_input(&h, TY(its[d], 4), 3, 0, 25);
        if (op == HP_OP_CHUNKED_EMBEDDING) {
            hp_value w = cc_rand_input(&h, TY(FT, 20, 8), 1, -1, 1);
            hp_value y = node1(&h, op, (hp_value[]){w, idx, base}, 3, NULL, 0);
            cc_check(be, &h, y, 0, TOL_SIMPLE);
        } else {
            hp_value g = cc_rand_input(&h, TY(FT, 3, 7, 8), 1, -1, 1);
            hp_attr a = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 20);
            hp_value y = node1(&h, op, (hp_value[]){g, idx, base}, 3, &a, 1);
            cc_check(be, &h, y, 0, TOL_REDUCE);
        }
        hp_th_fini(&h);
    }
}

static void case_softmax(hp_backend *be, hp_op op) {
    static const struct {
        int rank;
        int64_t s[3];
        int64_t dim;
    } c[] = {{2, {8, 50}, -1},   {3, {5, 7, 3}, 0}, {3, {5, 7, 3}, 1},
             {2, {64, 2048}, 1}, {2, {3, 0}, -1},   {1, {1}, 0}};
    bool back = op == HP_OP_SOFTMAX_BACKWARD || op == HP_OP_LOG_SOFTMAX_BACKWARD;
    for (size_t i = 0; i < HP_ARRAY_LEN(c); i++) {
        hp_type t = hp_type_make(FT, c[i].rank, c[i].s);
        hp_attr a = hp_attr_int(HP_ATTR_DIM, c[i].dim);
        if (!back) {
            one(be, op, &t, 1, &a, 1, -20, 20, TOL_REDUCE);
            continue;
        }
        hp_th h;
        hp_th_init(&h);
        hp_value g = cc_rand_input(&h, t, 3, -1, 1);
        hp_value y = cc_rand_input(&h, t, 4, op == HP_OP_SOFTMAX_BACKWARD ? 0 : -8,
                                   op == HP_OP_SOFTMAX_BACKWARD ? 1 : 0);
        hp_value v = node1(&h, op, (hp_value[]){g, y}, 2, &a, 1);
        cc_check(be, &h, v, 0, TOL_REDUCE);
        hp_th_fini(&h);
    }
}

static void case_nll(hp_backend *be, hp_op op) {
    const int64_t ns[] = {1, 37, 3000};
    const hp_dtype its[] = {HP_I64, HP_I32};
    for (size_t ni = 0; ni < HP_ARRAY_LEN(ns); ni++)
        for (int red = 0; red < 3; red++)
            for (int ig = 0; ig < 2; ig++) {
                int64_t n = ns[ni], c = 11, ignore = ig ? 4 : -100;
                hp_th h;
                hp_th_init(&h);
                double count, *tg = cc_targets(n, c, (uint64_t)(n + red), ignore, &count);
                hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, red),
                                hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
                hp_value v;
                if (op == HP_OP_NLL_LOSS_FORWARD) {
                    hp_value lp = cc_rand_input(&h, TY(FT, n, c), 1, -9, 0);
                    hp_value t = cc_input(&h, TY(its[ig], n), tg);
                    v = node1(&h, op, (hp_value[]){lp, t}, 2, a, 2);
                } else {
                    hp_value g = cc_rand_input(&h, red ? TY0(FT) : TY(FT, n), 1, 0.5, 2);
                    hp_value lp = cc_rand_input(&h, TY(FT, n, c), 2, -9, 0);
                    hp_value t = cc_input(&h, TY(its[ig], n), tg);
                    hp_value tw = cc_input(&h, TY0(FT), &count);
                    v = node1(&h, op, (hp_value[]){g, lp, t, tw}, 4, a, 2);
                }
                cc_check(be, &h, v, 0, TOL_SIMPLE);
                free(tg);
                hp_th_fini(&h);
            }
}

/* fused_cross_entropy(_backward): rows with ignored targets, both reductions, i32 and i64
 * targets, a row of 1000 classes; logits in FT, lse / grad / total_weight f32 (any lse: the
 * backward's formula holds for it). */
static void case_cross_entropy(hp_backend *be, hp_op op) {
    const int64_t ns[] = {1, 37, 300}, cs[] = {11, 1000};
    const hp_dtype its[] = {HP_I64, HP_I32};
    for (size_t ni = 0; ni < HP_ARRAY_LEN(ns); ni++)
        for (size_t ci = 0; ci < HP_ARRAY_LEN(cs); ci++)
            for (int red = 1; red < 3; red++) {
                int64_t n = ns[ni], c = cs[ci], ignore = red == 1 ? -100 : 4;
                hp_th h;
                hp_th_init(&h);
                double count, *tg = cc_targets(n, c, (uint64_t)(n + red), ignore, &count);
                hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, red),
                                hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
                hp_value v;
                const hp_dtype it = its[(ni + ci) % 2];
                if (op == HP_OP_FUSED_CROSS_ENTROPY) {
                    hp_value x = cc_rand_input(&h, TY(FT, n, c), 1, -6, 6);
                    hp_value t = cc_input(&h, TY(it, n), tg);
                    v = node1(&h, op, (hp_value[]){x, t}, 2, a, 2);
                } else {
                    hp_value g = cc_rand_input(&h, TY0(HP_F32), 1, 0.5, 2);
                    hp_value x = cc_rand_input(&h, TY(FT, n, c), 2, -3, 3);
                    hp_value t = cc_input(&h, TY(it, n), tg);
                    hp_value lse = cc_rand_input(&h, TY(HP_F32, n), 3, 2, 8);
                    hp_value tw = cc_input(&h, TY0(HP_F32), &count);
                    v = node1(&h, op, (hp_value[]){g, x, t, lse, tw}, 5, a, 2);
                }
                cc_check(be, &h, v, 0, TOL_REDUCE);
                free(tg);
                hp_th_fini(&h);
            }
}

/* swiglu(_backward): one type for every operand, sizes around the vector widths. */
static void case_swiglu(hp_backend *be, hp_op op) {
    const int64_t ns[] = {1, 7, 8, 33, 4099};
    for (size_t i = 0; i < HP_ARRAY_LEN(ns); i++) {
        hp_th h;
        hp_th_init(&h);
        hp_type t = TY(FT, ns[i]);
        hp_value a = cc_rand_input(&h, t, 1, -6, 6), b = cc_rand_input(&h, t, 2, -2, 2);
        hp_value v;
        if (op == HP_OP_SWIGLU) {
            v = node1(&h, op, (hp_value[]){a, b}, 2, NULL, 0);
        } else {
            hp_value g = cc_rand_input(&h, t, 3, -1, 1);
            v = node1(&h, op, (hp_value[]){g, a, b}, 3, NULL, 0);
        }
        cc_check(be, &h, v, 0, TOL_SIMPLE);
        hp_th_fini(&h);
    }
}

static void case_rms_norm(hp_backend *be, hp_op op) {
    static const struct {
        int rank;
        int64_t s[3];
    } c[] = {{3, {4, 6, 32}}, {2, {3, 256}}, {2, {300, 64}}, {1, {7}}, {2, {129, 5}}};
    for (size_t i = 0; i < HP_ARRAY_LEN(c); i++) {
        hp_type t = hp_type_make(FT, c[i].rank, c[i].s);
        hp_type w = TY(FT, c[i].s[c[i].rank - 1]);
        hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
        hp_th h;
        hp_th_init(&h);
        hp_value v;
        if (op == HP_OP_RMS_NORM) {
            hp_value x = cc_rand_input(&h, t, 1, -2, 2), wv = cc_rand_input(&h, w, 2, 0.5, 1.5);
            v = node1(&h, op, (hp_value[]){x, wv}, 2, &eps, 1);
        } else {
            hp_type rt = t;
            rt.rank--;
            rt.dtype = HP_F32; /* the saved statistics stay f32 under bf16 */
            hp_value gy = cc_rand_input(&h, t, 1, -1, 1), x = cc_rand_input(&h, t, 2, -2, 2);
            hp_value wv = cc_rand_input(&h, w, 3, 0.5, 1.5), r = cc_rand_input(&h, rt, 4, 0.5, 2);
            v = node1(&h, op, (hp_value[]){gy, x, wv, r}, 4, NULL, 0);
        }
        cc_check(be, &h, v, 0, TOL_REDUCE);
        hp_th_fini(&h);
    }
}

static void case_layer_norm(hp_backend *be, hp_op op) {
    static const struct {
        int rank;
        int64_t s[3];
    } c[] = {{3, {4, 6, 32}}, {2, {3, 256}}, {2, {300, 64}}, {1, {7}}, {2, {129, 5}}};
    for (size_t i = 0; i < HP_ARRAY_LEN(c); i++) {
        hp_type t = hp_type_make(FT, c[i].rank, c[i].s);
        hp_type w = TY(FT, c[i].s[c[i].rank - 1]), st = t;
        st.shape[st.rank - 1] = 1;
        st.dtype = HP_F32; /* the saved statistics stay f32 under bf16 */
        hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
        hp_th h;
        hp_th_init(&h);
        hp_value v;
        if (op == HP_OP_LAYER_NORM) {
            hp_value x = cc_rand_input(&h, t, 1, -2, 3), wv = cc_rand_input(&h, w, 2, 0.5, 1.5);
            hp_value b = cc_rand_input(&h, w, 3, -1, 1);
            v = node1(&h, op, (hp_value[]){x, wv, b}, 3, &eps, 1);
        } else {
            hp_value gy = cc_rand_input(&h, t, 1, -1, 1), x = cc_rand_input(&h, t, 2, -2, 2);
            hp_value mu = cc_rand_input(&h, st, 3, -0.5, 0.5), r = cc_rand_input(&h, st, 4, 0.5, 2);
            hp_value wv = cc_rand_input(&h, w, 5, 0.5, 1.5);
            v = node1(&h, op, (hp_value[]){gy, x, mu, r, wv}, 5, NULL, 0);
        }
        cc_check(be, &h, v, 0, TOL_REDUCE);
        hp_th_fini(&h);
    }
}

/* tril (every dtype, diagonals inside and outside the matrix), bitwise_not, arange. */
static void case_mask(hp_backend *be, hp_op op) {
    if (op == HP_OP_TRIL) {
        const hp_dtype dts[] = {FT, HP_I64, HP_BOOL};
        const int64_t diags[] = {0, -2, 3, 9};
        hp_type ts[] = {TY(FT, 5, 5), TY(FT, 3, 4, 7), TY(FT, 2, 0, 3)};
        for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++)
            for (size_t k = 0; k < HP_ARRAY_LEN(diags); k++)
                for (size_t s = 0; s < HP_ARRAY_LEN(ts); s++) {
                    hp_type t = ts[s];
                    t.dtype = dts[d];
                    hp_attr a = hp_attr_int(HP_ATTR_DIAGONAL, diags[k]);
                    one(be, op, &t, 1, &a, 1, -5, 5, TOL_SIMPLE);
                }
    } else if (op == HP_OP_BITWISE_NOT) {
        hp_type ts[] = {TY(HP_BOOL, 3, 70000), TY(HP_I32, 5), TY(HP_I64, 2, 3), TY0(HP_BOOL)};
        for (size_t s = 0; s < HP_ARRAY_LEN(ts); s++) one(be, op, &ts[s], 1, NULL, 0, -9, 9, 0);
    } else {
        const hp_dtype dts[] = {HP_I64, HP_I32, FT};
        const int64_t r[][3] = {{0, 16, 1}, {-3, 40000, 7}, {5, 2, 1}};
        for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++)
            for (size_t k = 0; k < HP_ARRAY_LEN(r); k++) {
                hp_th h;
                hp_th_init(&h);
                hp_attr a[4] = {
                    hp_attr_int(HP_ATTR_START, r[k][0]), hp_attr_int(HP_ATTR_END, r[k][1]),
                    hp_attr_int(HP_ATTR_STEP, r[k][2]), hp_attr_dtype(HP_ATTR_DTYPE, dts[d])};
                hp_value v = node1(&h, op, NULL, 0, a, 4);
                cc_check(be, &h, v, 0, TOL_SIMPLE);
                hp_th_fini(&h);
            }
    }
}

static void case_dropout(hp_backend *be, hp_op op) {
    const double ps[] = {0, 0.1, 0.5};
    hp_type ts[] = {TY(FT, 3, 70001), TY(FT, 2, 3, 5), TY0(FT), TY(FT, 0, 4)};
    for (size_t i = 0; i < HP_ARRAY_LEN(ps); i++)
        for (size_t k = 0; k < HP_ARRAY_LEN(ts); k++) {
            if (op == HP_OP_NATIVE_DROPOUT) {
                hp_attr a[2] = {hp_attr_float(HP_ATTR_P, ps[i]), hp_attr_str(HP_ATTR_FQN, "d")};
                one(be, op, &ts[k], 1, a, 2, -2, 2, TOL_SIMPLE);
            } else {
                hp_type m = ts[k];
                m.dtype = HP_BOOL;
                hp_type in[2] = {ts[k], m};
                hp_attr a = hp_attr_float(HP_ATTR_SCALE, 1.0 / (1.0 - ps[i]));
                one(be, op, in, 2, &a, 1, -2, 2, TOL_SIMPLE);
            }
        }
}

static void case_rotary(hp_backend *be, hp_op op) {
    const double thetas[] = {10000, 500000};
    for (int inv = 0; inv < 2; inv++)
        for (size_t i = 0; i < HP_ARRAY_LEN(thetas); i++) {
            hp_type ts[] = {TY(FT, 2, 9, 3, 8), TY(FT, 1, 300, 4, 16)};
            for (size_t k = 0; k < HP_ARRAY_LEN(ts); k++) {
                hp_attr a[2] = {hp_attr_float(HP_ATTR_THETA, thetas[i]),
                                hp_attr_int(HP_ATTR_INVERSE, inv)};
                one(be, op, &ts[k], 1, a, 2, -2, 2, TOL_SIMPLE);
            }
        }
}

/* sdpa and its backward: test_cpu_attention.c covers them in depth; one case here keeps the
 * op table complete. */
static void case_sdpa(hp_backend *be, hp_op op) {
    hp_th h;
    hp_th_init(&h);
    hp_value go = cc_rand_input(&h, TY(FT, 2, 4, 37, 8), 1, -1, 1);
    hp_value q = cc_rand_input(&h, TY(FT, 2, 4, 37, 16), 2, -1, 1);
    hp_value k = cc_rand_input(&h, TY(FT, 2, 2, 37, 16), 3, -1, 1);
    hp_value v = cc_rand_input(&h, TY(FT, 2, 2, 37, 8), 4, -1, 1);
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 0.25), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value o = node1(&h, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, 2);
    if (op == HP_OP_SDPA) {
        cc_check(be, &h, o, 0, TOL_REDUCE);
    } else {
        hp_value gb = node1(&h, op, (hp_value[]){go, q, k, v, o, hp_out(o, 1)}, 6, a, 2);
        cc_check(be, &h, gb, 0, TOL_REDUCE);
    }
    hp_th_fini(&h);
}

/* Collectives with group_size 1 (a copy on one rank) and wait_tensor. */
static void case_collective(hp_backend *be, hp_op op) {
    hp_type t = TY(FT, 6, 5);
    hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 1), hp_attr_int(HP_ATTR_REDUCE_OP, 1)};
    bool reduce = op == HP_OP_REDUCE_SCATTER || op == HP_OP_ALL_REDUCE;
    if (op == HP_OP_LOCAL_CHUNK) { /* one rank: its chunk is the whole */
        hp_attr c[2] = {hp_attr_int(HP_ATTR_DIM, 1), hp_attr_int(HP_ATTR_GROUP_SIZE, 1)};
        one(be, op, &t, 1, c, 2, -3, 3, 0);
        return;
    }
    one(be, op, &t, 1, a, op == HP_OP_WAIT_TENSOR ? 0 : reduce ? 2 : 1, -3, 3, 0);
}

/* ---- the case table ------------------------------------------------------------------------- */

typedef struct op_case {
    hp_op op;
    case_fn fn;
} op_case;

static const op_case cases[] = {
    {HP_OP_FULL, case_creation},
    {HP_OP_ZEROS, case_creation},
    {HP_OP_ONES, case_creation},
    {HP_OP_ADD, case_binary},
    {HP_OP_SUB, case_binary},
    {HP_OP_MUL, case_binary},
    {HP_OP_DIV, case_binary},
    {HP_OP_MAXIMUM, case_binary},
    {HP_OP_EQ, case_binary},
    {HP_OP_LT, case_binary},
    {HP_OP_WHERE, case_where},
    {HP_OP_ADD_SCALAR, case_unary},
    {HP_OP_MUL_SCALAR, case_unary},
    {HP_OP_POW, case_unary},
    {HP_OP_NEG, case_unary},
    {HP_OP_EXP, case_unary},
    {HP_OP_LOG, case_unary},
    {HP_OP_SQRT, case_unary},
    {HP_OP_RSQRT, case_unary},
    {HP_OP_TANH, case_unary},
    {HP_OP_SIN, case_unary},
    {HP_OP_COS, case_unary},
    {HP_OP_ERF, case_unary},
    {HP_OP_SIGMOID, case_unary},
    {HP_OP_SILU, case_unary},
    {HP_OP_GELU, case_unary},
    {HP_OP_RELU, case_unary},
    {HP_OP_TO_COPY, case_to_copy},
    {HP_OP_TANH_BACKWARD, case_backward_pair},
    {HP_OP_SIGMOID_BACKWARD, case_backward_pair},
    {HP_OP_SILU_BACKWARD, case_backward_pair},
    {HP_OP_GELU_BACKWARD, case_backward_pair},
    {HP_OP_THRESHOLD_BACKWARD, case_backward_pair},
    {HP_OP_SUM, case_reduce},
    {HP_OP_MEAN, case_reduce},
    {HP_OP_AMAX, case_reduce},
    {HP_OP_VIEW, case_view},
    {HP_OP_RESHAPE, case_view},
    {HP_OP_PERMUTE, case_permute},
    {HP_OP_TRANSPOSE, case_permute},
    {HP_OP_T, case_permute},
    {HP_OP_EXPAND, case_expand},
    {HP_OP_SLICE, case_slice},
    {HP_OP_SLICE_BACKWARD, case_slice},
    {HP_OP_CAT, case_cat},
    {HP_OP_UNSQUEEZE, case_simple_copy},
    {HP_OP_SQUEEZE, case_simple_copy},
    {HP_OP_CLONE, case_simple_copy},
    {HP_OP_DETACH, case_simple_copy},
    {HP_OP_MM, case_matmul},
    {HP_OP_BMM, case_matmul},
    {HP_OP_ADDMM, case_matmul},
    {HP_OP_EMBEDDING, case_embedding},
    {HP_OP_EMBEDDING_DENSE_BACKWARD, case_embedding},
    {HP_OP_CHUNKED_EMBEDDING, case_chunked_embedding},
    {HP_OP_CHUNKED_EMBEDDING_BACKWARD, case_chunked_embedding},
    {HP_OP_LOG_SOFTMAX, case_softmax},
    {HP_OP_LOG_SOFTMAX_BACKWARD, case_softmax},
    {HP_OP_SOFTMAX, case_softmax},
    {HP_OP_SOFTMAX_BACKWARD, case_softmax},
    {HP_OP_NLL_LOSS_FORWARD, case_nll},
    {HP_OP_NLL_LOSS_BACKWARD, case_nll},
    {HP_OP_FUSED_CROSS_ENTROPY, case_cross_entropy},
    {HP_OP_FUSED_CROSS_ENTROPY_BACKWARD, case_cross_entropy},
    {HP_OP_SWIGLU, case_swiglu},
    {HP_OP_SWIGLU_BACKWARD, case_swiglu},
    {HP_OP_RMS_NORM, case_rms_norm},
    {HP_OP_RMS_NORM_BACKWARD, case_rms_norm},
    {HP_OP_ROTARY_EMB, case_rotary},
    {HP_OP_SDPA, case_sdpa},
    {HP_OP_SDPA_BACKWARD, case_sdpa},
    {HP_OP_ALL_GATHER, case_collective},
    {HP_OP_LOCAL_CHUNK, case_collective},
    {HP_OP_REDUCE_SCATTER, case_collective},
    {HP_OP_ALL_REDUCE, case_collective},
    {HP_OP_ALL_TO_ALL, case_collective},
    {HP_OP_WAIT_TENSOR, case_collective},
    {HP_OP_LAYER_NORM, case_layer_norm},
    {HP_OP_LAYER_NORM_BACKWARD, case_layer_norm},
    {HP_OP_TRIL, case_mask},
    {HP_OP_NATIVE_DROPOUT, case_dropout},
    {HP_OP_NATIVE_DROPOUT_BACKWARD, case_dropout},
    {HP_OP_BITWISE_NOT, case_mask},
    {HP_OP_ARANGE, case_mask},
};

Test(cpu_ops, every_op_has_a_case) {
    for (int op = 0; op < HP_OP_COUNT; op++) {
        if (op == HP_OP_PLACEHOLDER) continue; /* fed by the executor, never launched */
        bool found = false;
        for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) found |= (int)cases[i].op == op;
        cr_expect(found, "op %s has no cpu backend test case", hp_op_get((hp_op)op)->name);
    }
}

/* Criterion may run each parameter in a fresh process image, so a parameter must not hold a
 * pointer: pass the case's index and look the case up in this process's table. */
static size_t case_index[HP_ARRAY_LEN(cases)];

ParameterizedTestParameters(cpu_ops, matches_eval) {
    for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) case_index[i] = i;
    return cr_make_param_array(size_t, case_index, HP_ARRAY_LEN(cases));
}

ParameterizedTest(size_t *i, cpu_ops, matches_eval, .timeout = 60) {
    const op_case *c = &cases[*i];
    cr_log_info("op %s", hp_op_get(c->op)->name);
    hp_backend *be = cc_backend(TH);
    c->fn(be, c->op);
    hp_backend_free(be);
}

/* Every case again with its floating tensors in bf16: inputs, outputs and the evaluator's
 * rounding all bf16 (integer and bool tensors as before). */
ParameterizedTestParameters(cpu_ops, bf16_matches_eval) {
    for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) case_index[i] = i;
    return cr_make_param_array(size_t, case_index, HP_ARRAY_LEN(cases));
}

ParameterizedTest(size_t *i, cpu_ops, bf16_matches_eval, .timeout = 60) {
    const op_case *c = &cases[*i];
    cr_log_info("op %s in bf16", hp_op_get(c->op)->name);
    FT = HP_BF16;
    hp_backend *be = cc_backend(TH);
    c->fn(be, c->op);
    hp_backend_free(be);
}

/* ---- dropout at a site ---------------------------------------------------------------------- */

static void launch_raw(hp_backend *be, const hp_node *n, const void *const *in, const hp_type *ti,
                       int n_in, void *const *out, const hp_dropout_site *site) {
    hp_kernel_call c = {.node = n,
                        .n_in = n_in,
                        .n_out = n->n_out,
                        .in = in,
                        .in_type = ti,
                        .out = out,
                        .out_type = n->out,
                        .site = site};
    hp_err e = {0};
    cr_assert_eq(be->vt->launch(be, HP_STREAM_COMPUTE, &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(be->vt->synchronize(be, &e), HP_OK, "%s", e.msg);
}

/* A rank's piece (rows [2, 4) of [4, 6, 8]) at its site drops exactly the whole tensor's
 * elements there; y = x / (1 - p) where kept, 0 elsewhere; the backward with that mask is
 * grad / (1 - p) on the same elements. (The cpu backend's memory is the host's.) */
Test(cpu_ops, dropout_piece_matches_the_whole_and_backward_uses_its_mask) {
    hp_backend *be = cc_backend(TH);
    hp_graph *g = hp_graph_new();
    const double p = 0.25;
    hp_attr a[2] = {hp_attr_float(HP_ATTR_P, p), hp_attr_str(HP_ATTR_FQN, "blk.drop#0")};
    hp_type tw = TY(HP_F32, 4, 6, 8), tp = TY(HP_F32, 2, 6, 8), tm = TY(HP_BOOL, 4, 6, 8);
    hp_value xw = hp_build_placeholder(g, HP_INPUT_DATA, NULL, tw, NULL);
    hp_value xp = hp_build_placeholder(g, HP_INPUT_DATA, NULL, tp, NULL);
    hp_value gr = hp_build_placeholder(g, HP_INPUT_DATA, NULL, tw, NULL);
    hp_value mk = hp_build_placeholder(g, HP_INPUT_DATA, NULL, tm, NULL);
    hp_value dw = hp_build(g, HP_OP_NATIVE_DROPOUT, &xw, 1, a, 2);
    hp_value dp = hp_build(g, HP_OP_NATIVE_DROPOUT, &xp, 1, a, 2);
    hp_attr sc = hp_attr_float(HP_ATTR_SCALE, 1 / (1 - p));
    hp_value bw = hp_build(g, HP_OP_NATIVE_DROPOUT_BACKWARD, (hp_value[]){gr, mk}, 2, &sc, 1);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    enum { N = 4 * 6 * 8, NP = 2 * 6 * 8 };
    static float x[N], y[N], yp[NP], grad[N], gx[N];
    static uint8_t m[N], mp[NP];
    double xs[N];
    hp_th_rand(xs, N, 11, -2, 2);
    for (int i = 0; i < N; i++) x[i] = (float)xs[i], grad[i] = (float)(xs[(i * 7) % N] + 3);
    hp_dropout_site whole = {.seed = 5, .step = 3, .rank = 3};
    hp_dropout_site piece = whole;
    for (int d = 0; d < 3; d++) {
        whole.global[d] = piece.global[d] = tw.shape[d];
        whole.local[d] = tw.shape[d];
        piece.local[d] = tp.shape[d];
    }
    piece.off[0] = 2;
    launch_raw(be, &g->nodes[dw.node], (const void *[]){x}, &tw, 1, (void *[]){y, m}, &whole);
    launch_raw(be, &g->nodes[dp.node], (const void *[]){x + NP}, &tp, 1, (void *[]){yp, mp},
               &piece);
    int dropped = 0;
    float scale = (float)(1 / (1 - p));
    for (int i = 0; i < N; i++) {
        cr_assert(m[i] <= 1);
        dropped += !m[i];
        cr_expect_eq(y[i], m[i] ? x[i] * scale : 0.0f, "y[%d]", i);
        if (i >= NP) {
            cr_expect_eq(mp[i - NP], m[i], "the piece's mask at %d", i);
            cr_expect_eq(yp[i - NP], y[i], "the piece's y at %d", i);
        }
    }
    cr_expect(dropped > 0 && dropped < N, "dropped %d of %d", dropped, N);
    launch_raw(be, &g->nodes[bw.node], (const void *[]){grad, m}, (hp_type[]){tw, tm}, 2,
               (void *[]){gx}, NULL);
    for (int i = 0; i < N; i++) cr_expect_eq(gx[i], m[i] ? grad[i] * scale : 0.0f, "gx[%d]", i);
    hp_graph_free(g);
    hp_backend_free(be);
}
