/* worker/cpu/k_elementwise.c — elementwise kernels: creation (full, zeros, ones), broadcasting
 * binary ops (add sub mul div maximum eq lt) and where, scalar and unary math, _to_copy
 * between any two dtypes, and the elementwise backward pairs (tanh/sigmoid/silu/gelu/
 * threshold). Formulas follow docs/op-semantics.md.
 *
 * Floating math is f32; integer arithmetic (i32/i64) wraps instead of overflowing and integer
 * division truncates (a zero divisor is an error); comparisons take any dtype. Broadcasting
 * collapses the output's dims to the fewest runs, then walks chunks of output elements with
 * each input's inner stride 0 or 1, so the inner loops are plain vectorizable loops. Every
 * output element depends on its inputs only: the chunking cannot change a result. The unary
 * and backward-pair loops (exp, sigmoid, silu, ...) are also built for AVX2 (HP__CPU_TWIN).
 */
#include "worker/cpu/cpu_internal.h"

#include <math.h>
#include <stdio.h>

#define SQRT_2_OVER_PI 0.79788456080286535588f /* gelu's tanh approximation */
#define INV_SQRT_2     0.70710678118654752440f
#define INV_SQRT_2PI   0.39894228040143267794f
#define GELU_C         0.044715f

/* Work per element of the transcendental ops, relative to an add: smaller parallel chunks. */
#define MATH_COST 8

/* ---- creation ------------------------------------------------------------------------------- */

typedef struct fill_job {
    void *y;
    hp_dtype dt;
    double v;
} fill_job;

static void fill_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const fill_job *j = ctx;
    switch (j->dt) {
    case HP_F32: {
        float v = (float)j->v, *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = v;
        break;
    }
    case HP_I32: {
        int32_t v = (int32_t)j->v, *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = v;
        break;
    }
    case HP_I64: {
        int64_t v = (int64_t)j->v, *y = j->y;
        for (int64_t i = b; i < e; i++) y[i] = v;
        break;
    }
    default:
        memset((uint8_t *)j->y + b, j->v != 0, (size_t)(e - b));
        break;
    }
}

/* Clamps v into an integer dtype's range after truncation (C leaves out-of-range casts
 * undefined); NaN becomes 0. */
static double int_range(hp_dtype dt, double v) {
    double lo = dt == HP_I32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dt == HP_I32 ? 2147483647.0 : 9223372036854774784.0; /* largest double < 2^63 */
    if (v != v) return 0;
    v = trunc(v);
    return v < lo ? lo : v > hi ? hi : v;
}

HP__CPU_KERNEL(hp__cpu_creation) {
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__ANY, err));
    double v = c->node->op == HP_OP_FULL ? hp_node_float(c->node, HP_ATTR_VALUE, 0)
                                         : (double)(c->node->op == HP_OP_ONES);
    fill_job j = {c->out[0], c->out_type[0].dtype, v};
    if (j.dt == HP_I32 || j.dt == HP_I64) j.v = int_range(j.dt, v);
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), HP__CPU_GRAIN, fill_chunk, &j);
    return HP_OK;
}

/* ---- broadcasting walker -------------------------------------------------------------------- */

/* The output's index space collapsed to the fewest dims; input k is read at stride st[k][d]
 * (0 on broadcast dims); the inner (last) dim has input strides 0 or 1. */
typedef struct bwalk {
    int rank, n_in;
    int64_t shape[HP_MAX_RANK];
    int64_t st[3][HP_MAX_RANK];
    int64_t inner;
} bwalk;

static void bwalk_init(bwalk *w, const hp_type *out, int n_in, const hp_type *const *in) {
    int64_t st[3][HP_MAX_RANK];
    for (int k = 0; k < n_in; k++) hp__cpu_bcast_strides(in[k], out, st[k]);
    *w = (bwalk){.n_in = n_in};
    for (int d = 0; d < out->rank; d++) {
        if (out->shape[d] == 1) continue;
        bool merge = w->rank > 0;
        for (int k = 0; merge && k < n_in; k++)
            merge = w->st[k][w->rank - 1] == st[k][d] * out->shape[d];
        if (merge) {
            w->shape[w->rank - 1] *= out->shape[d];
            for (int k = 0; k < n_in; k++) w->st[k][w->rank - 1] = st[k][d];
        } else {
            w->shape[w->rank] = out->shape[d];
            for (int k = 0; k < n_in; k++) w->st[k][w->rank] = st[k][d];
            w->rank++;
        }
    }
    if (w->rank == 0) { /* a scalar, or all dims 1 */
        w->rank = 1;
        w->shape[0] = 1;
        for (int k = 0; k < n_in; k++) w->st[k][0] = 0;
    }
    w->inner = w->shape[w->rank - 1];
}

/* Calls seg(ctx, out_pos, off[], inner_st[], n) for the runs covering output elements [b, e):
 * off[k] is input k's element offset at out_pos, inner_st[k] its stride (0 or 1) along the
 * run. Returns the OR of the seg results. */
typedef int (*bseg_fn)(void *ctx, int64_t pos, const int64_t *off, const int64_t *ist, int64_t n);

static int bwalk_run(const bwalk *w, int64_t b, int64_t e, bseg_fn seg, void *ctx) {
    int64_t idx[HP_MAX_RANK], off[3] = {0, 0, 0}, ist[3];
    int64_t u = b / w->inner, col = b % w->inner;
    for (int d = w->rank - 2; d >= 0; d--) {
        idx[d] = u % w->shape[d];
        u /= w->shape[d];
        for (int k = 0; k < w->n_in; k++) off[k] += idx[d] * w->st[k][d];
    }
    for (int k = 0; k < w->n_in; k++) ist[k] = w->st[k][w->rank - 1];
    int bad = 0;
    for (int64_t p = b; p < e;) {
        int64_t n = w->inner - col < e - p ? w->inner - col : e - p, o[3];
        for (int k = 0; k < w->n_in; k++) o[k] = off[k] + col * ist[k];
        bad |= seg(ctx, p, o, ist, n);
        p += n;
        col = 0;
        for (int d = w->rank - 2; d >= 0 && p < e; d--) { /* odometer */
            idx[d]++;
            for (int k = 0; k < w->n_in; k++) off[k] += w->st[k][d];
            if (idx[d] < w->shape[d]) break;
            for (int k = 0; k < w->n_in; k++) off[k] -= w->st[k][d] * w->shape[d];
            idx[d] = 0;
        }
    }
    return bad;
}

/* ---- binary --------------------------------------------------------------------------------- */

/* y[i] = f(a[i·sa], b[i·sb]) with sa, sb in {0, 1}; returns nonzero on an integer division by
 * zero. The four stride cases are separate loops so each vectorizes. */
typedef int (*bin_fn)(void *y, const void *a, const void *b, int64_t sa, int64_t sb, int64_t n);

#define BIN(NAME, T, R, EXPR, BAD)                                                                 \
    static int NAME(void *y_, const void *a_, const void *b_, int64_t sa, int64_t sb, int64_t n) { \
        R *y = y_;                                                                                 \
        const T *a = a_, *b = b_;                                                                  \
        int bad = 0;                                                                               \
        if (sa && sb) {                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x0 = a[i], x1 = b[i];                                                            \
                bad |= BAD;                                                                        \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else if (sa) {                                                                           \
            T x1 = b[0];                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x0 = a[i];                                                                       \
                bad |= BAD;                                                                        \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else if (sb) {                                                                           \
            T x0 = a[0];                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x1 = b[i];                                                                       \
                bad |= BAD;                                                                        \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            T x0 = a[0], x1 = b[0];                                                                \
            bad |= BAD;                                                                            \
            R v = EXPR;                                                                            \
            for (int64_t i = 0; i < n; i++) y[i] = v;                                              \
        }                                                                                          \
        return bad;                                                                                \
    }

/* torch.maximum propagates NaN: a NaN x0 is kept, and x0 > NaN is false, giving x1. */
#define FMAX(x0, x1) ((x0) > (x1) || (x0) != (x0) ? (x0) : (x1))
/* Wrapping integer arithmetic through the unsigned type; division truncates, and the one
 * overflowing quotient (MIN / -1) wraps too. A zero divisor yields 0 and reports. */
#define IADD(T, U) ((T)((U)x0 + (U)x1))
#define ISUB(T, U) ((T)((U)x0 - (U)x1))
#define IMUL(T, U) ((T)((U)x0 * (U)x1))
#define IDIV(T, U) (x1 == 0 ? (T)0 : x1 == -1 ? (T)(0 - (U)x0) : (T)(x0 / x1))

BIN(f32_add, float, float, x0 + x1, 0)
BIN(f32_sub, float, float, x0 - x1, 0)
BIN(f32_mul, float, float, x0 *x1, 0)
BIN(f32_div, float, float, x0 / x1, 0)
BIN(f32_max, float, float, FMAX(x0, x1), 0)
BIN(f32_eq, float, uint8_t, x0 == x1, 0)
BIN(f32_lt, float, uint8_t, x0 < x1, 0)
BIN(i32_add, int32_t, int32_t, IADD(int32_t, uint32_t), 0)
BIN(i32_sub, int32_t, int32_t, ISUB(int32_t, uint32_t), 0)
BIN(i32_mul, int32_t, int32_t, IMUL(int32_t, uint32_t), 0)
BIN(i32_div, int32_t, int32_t, IDIV(int32_t, uint32_t), x1 == 0)
BIN(i32_max, int32_t, int32_t, x0 > x1 ? x0 : x1, 0)
BIN(i32_eq, int32_t, uint8_t, x0 == x1, 0)
BIN(i32_lt, int32_t, uint8_t, x0 < x1, 0)
BIN(i64_add, int64_t, int64_t, IADD(int64_t, uint64_t), 0)
BIN(i64_sub, int64_t, int64_t, ISUB(int64_t, uint64_t), 0)
BIN(i64_mul, int64_t, int64_t, IMUL(int64_t, uint64_t), 0)
BIN(i64_div, int64_t, int64_t, IDIV(int64_t, uint64_t), x1 == 0)
BIN(i64_max, int64_t, int64_t, x0 > x1 ? x0 : x1, 0)
BIN(i64_eq, int64_t, uint8_t, x0 == x1, 0)
BIN(i64_lt, int64_t, uint8_t, x0 < x1, 0)
BIN(b8_eq, uint8_t, uint8_t, (x0 != 0) == (x1 != 0), 0)
BIN(b8_lt, uint8_t, uint8_t, (x0 != 0) < (x1 != 0), 0)

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_EQ, B_LT, B_COUNT };

/* [op][dtype]; NULL where the op does not take the dtype. */
static const bin_fn bin_table[B_COUNT][HP_DTYPE_COUNT] = {
    [B_ADD] = {[HP_F32] = f32_add, [HP_I32] = i32_add, [HP_I64] = i64_add},
    [B_SUB] = {[HP_F32] = f32_sub, [HP_I32] = i32_sub, [HP_I64] = i64_sub},
    [B_MUL] = {[HP_F32] = f32_mul, [HP_I32] = i32_mul, [HP_I64] = i64_mul},
    [B_DIV] = {[HP_F32] = f32_div, [HP_I32] = i32_div, [HP_I64] = i64_div},
    [B_MAX] = {[HP_F32] = f32_max, [HP_I32] = i32_max, [HP_I64] = i64_max},
    [B_EQ] = {[HP_F32] = f32_eq, [HP_I32] = i32_eq, [HP_I64] = i64_eq, [HP_BOOL] = b8_eq},
    [B_LT] = {[HP_F32] = f32_lt, [HP_I32] = i32_lt, [HP_I64] = i64_lt, [HP_BOOL] = b8_lt},
};

typedef struct bin_job {
    bwalk w;
    bin_fn fn;
    char *y;
    const char *a, *b;
    size_t ys, es; /* element sizes of the output and the inputs */
    _Atomic int bad;
} bin_job;

static int bin_seg(void *ctx, int64_t pos, const int64_t *off, const int64_t *ist, int64_t n) {
    bin_job *j = ctx;
    return j->fn(j->y + (size_t)pos * j->ys, j->a + (size_t)off[0] * j->es,
                 j->b + (size_t)off[1] * j->es, ist[0], ist[1], n);
}

static void bin_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    bin_job *j = ctx;
    if (bwalk_run(&j->w, b, e, bin_seg, j)) j->bad = 1;
}

HP__CPU_KERNEL(hp__cpu_binary) {
    int op = 0;
    switch (c->node->op) {
    case HP_OP_ADD:
        op = B_ADD;
        break;
    case HP_OP_SUB:
        op = B_SUB;
        break;
    case HP_OP_MUL:
        op = B_MUL;
        break;
    case HP_OP_DIV:
        op = B_DIV;
        break;
    case HP_OP_MAXIMUM:
        op = B_MAX;
        break;
    case HP_OP_EQ:
        op = B_EQ;
        break;
    default:
        op = B_LT;
        break;
    }
    bool cmp = op == B_EQ || op == B_LT;
    hp_dtype dt = c->in_type[0].dtype;
    HP_TRY(hp__cpu_dtype(c, 0, 0, cmp ? HP__ANY : HP__NUM, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__M(dt), err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, cmp ? HP__M(HP_BOOL) : HP__M(dt), err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cpu_check_bcast(&c->in_type[0], o, "input 0", err));
    HP_TRY(hp__cpu_check_bcast(&c->in_type[1], o, "input 1", err));
    bin_job j = {.fn = bin_table[op][dt],
                 .y = c->out[0],
                 .a = c->in[0],
                 .b = c->in[1],
                 .ys = hp_dtype_size(o->dtype),
                 .es = hp_dtype_size(dt)};
    HP_ASSERT(j.fn);
    const hp_type *ins[2] = {&c->in_type[0], &c->in_type[1]};
    bwalk_init(&j.w, o, 2, ins);
    hp_pool_parallel_for(cpu->pool, hp_type_numel(o), HP__CPU_GRAIN, bin_chunk, &j);
    if (j.bad) return hp_errf(err, HP_INVALID, "integer division by zero");
    return HP_OK;
}

/* ---- where ---------------------------------------------------------------------------------- */

typedef struct where_job {
    bwalk w;
    char *y;
    const uint8_t *cond;
    const char *a, *b;
    size_t es;
} where_job;

static int where_seg(void *ctx, int64_t pos, const int64_t *off, const int64_t *ist, int64_t n) {
    where_job *j = ctx;
    const uint8_t *cd = j->cond + off[0];
    int64_t sc = ist[0], sa = ist[1], sb = ist[2];
#define WHERE(T)                                                                                   \
    do {                                                                                           \
        T *y = (T *)(j->y + (size_t)pos * sizeof(T));                                              \
        const T *a = (const T *)(j->a + (size_t)off[1] * sizeof(T));                               \
        const T *b = (const T *)(j->b + (size_t)off[2] * sizeof(T));                               \
        if (sc && sa && sb)                                                                        \
            for (int64_t i = 0; i < n; i++) y[i] = cd[i] ? a[i] : b[i];                            \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++) y[i] = cd[i * sc] ? a[i * sa] : b[i * sb];             \
    } while (0)
    switch (j->es) {
    case 1:
        WHERE(uint8_t);
        break;
    case 2:
        WHERE(uint16_t);
        break;
    case 4:
        WHERE(uint32_t);
        break;
    default:
        WHERE(uint64_t);
        break;
    }
#undef WHERE
    return 0;
}

static void where_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    where_job *j = ctx;
    bwalk_run(&j->w, b, e, where_seg, j);
}

/* where(cond bool, a, b): pure selection, so any dtype. */
HP__CPU_KERNEL(hp__cpu_where) {
    hp_dtype dt = c->in_type[1].dtype;
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__M(HP_BOOL), err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__ANY_FP, err));
    HP_TRY(hp__cpu_dtype(c, 0, 2, HP__M(dt), err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__M(dt), err));
    const hp_type *o = &c->out_type[0];
    for (int k = 0; k < 3; k++) {
        char what[16];
        snprintf(what, sizeof what, "input %d", k);
        HP_TRY(hp__cpu_check_bcast(&c->in_type[k], o, what, err));
    }
    where_job j = {
        .y = c->out[0], .cond = c->in[0], .a = c->in[1], .b = c->in[2], .es = hp_dtype_size(dt)};
    const hp_type *ins[3] = {&c->in_type[0], &c->in_type[1], &c->in_type[2]};
    bwalk_init(&j.w, o, 3, ins);
    hp_pool_parallel_for(cpu->pool, hp_type_numel(o), HP__CPU_GRAIN, where_chunk, &j);
    return HP_OK;
}

/* ---- unary ---------------------------------------------------------------------------------- */

typedef struct un_job {
    hp_op op;
    float *y;
    const float *x, *g; /* g: the backward pairs' incoming gradient */
    double v, e;        /* value, exponent */
    bool approx;
} un_job;

HP__CPU_INLINE float sigmoidf_(float x) {
    return 1.0f / (1.0f + hp__cpu_expf(-x));
}

/* pow with the common exponents exact or cheap; the rest through double pow. */
HP__CPU_INLINE void pow_loop(float *y, const float *x, double e, int64_t n) {
    if (e == 2) {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i];
    } else if (e == 1) {
        memmove(y, x, (size_t)n * sizeof *y);
    } else if (e == 0.5) {
        for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
    } else if (e == -1) {
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / x[i];
    } else if (e == 0) {
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f; /* pow(x, 0) = 1, even for NaN */
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = (float)pow(x[i], e);
    }
}

HP__CPU_INLINE void unary_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const un_job *j = ctx;
    float *y = j->y + b;
    const float *x = j->x + b;
    int64_t n = e - b;
    switch (j->op) {
    case HP_OP_ADD_SCALAR: /* in double, as the scalar is a double: exact like the reference */
        for (int64_t i = 0; i < n; i++) y[i] = (float)((double)x[i] + j->v);
        break;
    case HP_OP_MUL_SCALAR:
        for (int64_t i = 0; i < n; i++) y[i] = (float)((double)x[i] * j->v);
        break;
    case HP_OP_POW:
        pow_loop(y, x, j->e, n);
        break;
    case HP_OP_NEG:
        for (int64_t i = 0; i < n; i++) y[i] = -x[i];
        break;
    case HP_OP_EXP:
        for (int64_t i = 0; i < n; i++) y[i] = hp__cpu_expf(x[i]);
        break;
    case HP_OP_LOG:
        for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]);
        break;
    case HP_OP_SQRT:
        for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        break;
    case HP_OP_RSQRT:
        for (int64_t i = 0; i < n; i++) y[i] = (float)(1.0 / sqrt((double)x[i]));
        break;
    case HP_OP_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = hp__cpu_tanhf(x[i]);
        break;
    case HP_OP_SIN: /* in double: sinf's argument reduction differs between libms */
        for (int64_t i = 0; i < n; i++) y[i] = (float)sin((double)x[i]);
        break;
    case HP_OP_COS:
        for (int64_t i = 0; i < n; i++) y[i] = (float)cos((double)x[i]);
        break;
    case HP_OP_ERF:
        for (int64_t i = 0; i < n; i++) y[i] = erff(x[i]);
        break;
    case HP_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = sigmoidf_(x[i]);
        break;
    case HP_OP_SILU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf_(x[i]);
        break;
    case HP_OP_GELU:
        if (j->approx)
            for (int64_t i = 0; i < n; i++) {
                float a = x[i];
                y[i] = 0.5f * a * (1.0f + hp__cpu_tanhf(SQRT_2_OVER_PI * (a + GELU_C * a * a * a)));
            }
        else
            for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT_2));
        break;
    case HP_OP_RELU: /* NaN stays NaN, as torch.relu */
        for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? 0.0f : x[i];
        break;
    default:
        HP_ASSERT(!"not a unary op");
    }
}

HP__CPU_TWIN(unary_chunk, unary_body)

static bool is_transcendental(hp_op op) {
    return op == HP_OP_EXP || op == HP_OP_LOG || op == HP_OP_TANH || op == HP_OP_SIGMOID ||
           op == HP_OP_SIN || op == HP_OP_COS || op == HP_OP_ERF || op == HP_OP_SILU ||
           op == HP_OP_GELU || op == HP_OP_POW || op == HP_OP_GELU_BACKWARD ||
           op == HP_OP_SILU_BACKWARD;
}

HP__CPU_KERNEL(hp__cpu_unary) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_node *n = c->node;
    un_job j = {.op = n->op,
                .y = c->out[0],
                .x = c->in[0],
                .v = hp_node_float(n, HP_ATTR_VALUE, 0),
                .e = hp_node_float(n, HP_ATTR_EXPONENT, 1),
                .approx = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0};
    int64_t grain = is_transcendental(n->op) ? HP__CPU_GRAIN / MATH_COST : HP__CPU_GRAIN;
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), grain, unary_chunk_pick(), &j);
    return HP_OK;
}

/* ---- backward pairs: (grad, saved) -> grad_in ------------------------------------------------ */

HP__CPU_INLINE void pair_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const un_job *j = ctx;
    float *y = j->y + b;
    const float *g = j->g + b, *s = j->x + b;
    int64_t n = e - b;
    switch (j->op) {
    case HP_OP_TANH_BACKWARD:
        for (int64_t i = 0; i < n; i++) y[i] = g[i] * (1.0f - s[i] * s[i]);
        break;
    case HP_OP_SIGMOID_BACKWARD:
        for (int64_t i = 0; i < n; i++) y[i] = g[i] * s[i] * (1.0f - s[i]);
        break;
    case HP_OP_SILU_BACKWARD:
        for (int64_t i = 0; i < n; i++) {
            float sg = sigmoidf_(s[i]);
            y[i] = g[i] * sg * (1.0f + s[i] * (1.0f - sg));
        }
        break;
    case HP_OP_GELU_BACKWARD:
        if (j->approx)
            for (int64_t i = 0; i < n; i++) {
                float x = s[i];
                float u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
                float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
                float t = hp__cpu_tanhf(u);
                y[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
            }
        else
            for (int64_t i = 0; i < n; i++) {
                float x = s[i];
                float cdf = 0.5f * (1.0f + erff(x * INV_SQRT_2));
                float pdf = INV_SQRT_2PI * hp__cpu_expf(-0.5f * x * x);
                y[i] = g[i] * (cdf + x * pdf);
            }
        break;
    case HP_OP_THRESHOLD_BACKWARD: /* compared in double: the threshold is a double */
        for (int64_t i = 0; i < n; i++) y[i] = (double)s[i] > j->v ? g[i] : 0.0f;
        break;
    default:
        HP_ASSERT(!"not a backward pair");
    }
}

HP__CPU_TWIN(pair_chunk, pair_body)

HP__CPU_KERNEL(hp__cpu_backward_pair) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_node *n = c->node;
    un_job j = {.op = n->op,
                .y = c->out[0],
                .g = c->in[0],
                .x = c->in[1],
                .v = hp_node_float(n, HP_ATTR_VALUE, 0),
                .approx = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0};
    int64_t grain = is_transcendental(n->op) ? HP__CPU_GRAIN / MATH_COST : HP__CPU_GRAIN;
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), grain, pair_chunk_pick(), &j);
    return HP_OK;
}

/* ---- swiglu ---------------------------------------------------------------------------------- */

typedef struct sw_job {
    float *y, *ga, *gb;
    const float *g, *a, *b;
} sw_job;

/* swiglu(a, b) = silu(a)·b. The operands in restrict locals: read through the job on every
 * iteration (a store to y might change *j, as far as the compiler knows), the loop would not
 * vectorize. */
HP__CPU_INLINE void swiglu_body(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const sw_job *j = ctx;
    float *restrict y = j->y;
    const float *restrict a = j->a, *restrict b = j->b;
    for (int64_t i = lo; i < hi; i++) y[i] = a[i] * sigmoidf_(a[i]) * b[i];
}
HP__CPU_TWIN(swiglu_chunk, swiglu_body)

/* swiglu_backward(g, a, b) = (g·b·σ(a)·(1 + a·(1 − σ(a))), g·a·σ(a)) */
HP__CPU_INLINE void swiglu_back_body(void *ctx, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const sw_job *j = ctx;
    float *restrict ga = j->ga, *restrict gb = j->gb;
    const float *restrict g = j->g, *restrict a = j->a, *restrict b = j->b;
    for (int64_t i = lo; i < hi; i++) {
        float ai = a[i], sg = sigmoidf_(ai);
        ga[i] = g[i] * b[i] * (sg * (1.0f + ai * (1.0f - sg)));
        gb[i] = g[i] * (ai * sg);
    }
}
HP__CPU_TWIN(swiglu_back_chunk, swiglu_back_body)

HP__CPU_KERNEL(hp__cpu_swiglu) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    sw_job j = {.y = c->out[0], .a = c->in[0], .b = c->in[1]};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), HP__CPU_GRAIN / MATH_COST,
                         swiglu_chunk_pick(), &j);
    return HP_OK;
}

HP__CPU_KERNEL(hp__cpu_swiglu_backward) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    for (int k = 1; k < 3; k++) HP_TRY(hp__cpu_same_shape(c, 0, k, 0, err));
    for (int k = 0; k < 2; k++) HP_TRY(hp__cpu_same_shape(c, 0, k, 1, err));
    sw_job j = {.ga = c->out[0], .gb = c->out[1], .g = c->in[0], .a = c->in[1], .b = c->in[2]};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(&c->out_type[0]), HP__CPU_GRAIN / MATH_COST,
                         swiglu_back_chunk_pick(), &j);
    return HP_OK;
}

/* ---- _to_copy -------------------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return hp__cpu_bits_f32(sign | 0x7F800000u | (m << 13)); /* inf, NaN */
    if (e == 0) { /* zero or subnormal: m · 2^-24 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return hp__cpu_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* Round to nearest even, overflow to inf, subnormals kept. */
static uint16_t f32_to_f16(float f) {
    uint32_t u = hp__cpu_f32_bits(f), sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00);  /* NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: subnormal */
        float v = hp__cpu_bits_f32(a) * 16777216.0f;        /* in units of 2^-24 */
        return (uint16_t)(sign | (uint32_t)nearbyintf(v));  /* ties to even (default mode) */
    }
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1) - (112u << 23); /* rebias, round */
    return (uint16_t)(sign | (r >> 13));
}

typedef struct cast_job {
    const char *x;
    char *y;
    hp_dtype from, to;
} cast_job;

#define CAST_BLOCK 256

static void cast_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const cast_job *j = ctx;
    if (j->from == HP_BF16 && j->to == HP_F32) { /* exact: the staging path's hot cases */
        const uint16_t *x = (const uint16_t *)j->x;
        float *y = (float *)j->y;
        for (int64_t i = b; i < e; i++) y[i] = hp__cpu_bf16_f32(x[i]);
        return;
    }
    if (j->from == HP_F32 && j->to == HP_BF16) {
        const float *x = (const float *)j->x;
        uint16_t *y = (uint16_t *)j->y;
        for (int64_t i = b; i < e; i++) y[i] = hp__cpu_f32_bf16(x[i]);
        return;
    }
    double buf[CAST_BLOCK]; /* every dtype converts through double */
    for (int64_t p = b; p < e; p += CAST_BLOCK) {
        int64_t n = e - p < CAST_BLOCK ? e - p : CAST_BLOCK;
        const void *x = j->x + (size_t)p * hp_dtype_size(j->from);
        void *y = j->y + (size_t)p * hp_dtype_size(j->to);
        switch (j->from) {
        case HP_F32:
            for (int64_t i = 0; i < n; i++) buf[i] = ((const float *)x)[i];
            break;
        case HP_BF16:
            for (int64_t i = 0; i < n; i++) buf[i] = hp__cpu_bf16_f32(((const uint16_t *)x)[i]);
            break;
        case HP_F16:
            for (int64_t i = 0; i < n; i++) buf[i] = f16_to_f32(((const uint16_t *)x)[i]);
            break;
        case HP_I32:
            for (int64_t i = 0; i < n; i++) buf[i] = ((const int32_t *)x)[i];
            break;
        case HP_I64:
            for (int64_t i = 0; i < n; i++) buf[i] = (double)((const int64_t *)x)[i];
            break;
        default:
            for (int64_t i = 0; i < n; i++) buf[i] = ((const uint8_t *)x)[i] != 0;
            break;
        }
        switch (j->to) {
        case HP_F32:
            for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)buf[i];
            break;
        case HP_BF16:
            for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = hp__cpu_f32_bf16((float)buf[i]);
            break;
        case HP_F16:
            for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = f32_to_f16((float)buf[i]);
            break;
        case HP_I32:
            for (int64_t i = 0; i < n; i++) ((int32_t *)y)[i] = (int32_t)int_range(HP_I32, buf[i]);
            break;
        case HP_I64:
            for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = (int64_t)int_range(HP_I64, buf[i]);
            break;
        default:
            for (int64_t i = 0; i < n; i++) ((uint8_t *)y)[i] = buf[i] != 0;
            break;
        }
    }
}

void hp__cpu_cast(hp__cpu *cpu, void *y, hp_dtype to, const void *x, hp_dtype from, int64_t n) {
    cast_job j = {x, y, from, to};
    hp_pool_parallel_for(cpu->pool, n, HP__CPU_GRAIN / 4, cast_chunk, &j);
}

/* _to_copy{dtype}: a cast between any two dtypes. Float -> int truncates toward zero and
 * saturates (NaN -> 0); -> bool is x != 0; -> bf16/f16 rounds to nearest even (via f32, so an
 * i64 beyond 2^24 may round twice). The same dtype is a copy. */
HP__CPU_KERNEL(hp__cpu_to_copy) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__ANY_FP, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__ANY_FP, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    const hp_type *o = &c->out_type[0];
    if (o->dtype == c->in_type[0].dtype) {
        hp__cpu_copy(cpu, c->out[0], c->in[0], (size_t)hp_type_numel(o) * hp_dtype_size(o->dtype));
        return HP_OK;
    }
    cast_job j = {c->in[0], c->out[0], c->in_type[0].dtype, o->dtype};
    hp_pool_parallel_for(cpu->pool, hp_type_numel(o), HP__CPU_GRAIN / 4, cast_chunk, &j);
    return HP_OK;
}
