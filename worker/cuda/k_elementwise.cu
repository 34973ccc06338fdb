/* worker/cuda/k_elementwise.cu — elementwise kernels: broadcasting binary ops (add sub mul div
 * maximum eq lt), where, creation (full zeros ones), scalar and unary math, the elementwise
 * backward pairs, and _to_copy between any two dtypes. The formulas are the cpu backend's
 * (worker/cpu/k_elementwise.c, docs/op-semantics.md): f32 math, bf16/f16 loaded to f32 and
 * rounded to nearest even on store. Every output element depends on its inputs only. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

#define SQRT_2_OVER_PI 0.79788456080286535588f
#define INV_SQRT_2     0.70710678118654752440f
#define INV_SQRT_2PI   0.39894228040143267794f
#define GELU_C         0.044715f

/* ---- binary --------------------------------------------------------------------------------- */

__device__ __forceinline__ float binary_op(int op, float a, float b) {
    switch (op) {
    case HP__CU_ADD:
        return a + b;
    case HP__CU_SUB:
        return a - b;
    case HP__CU_MUL:
        return a * b;
    case HP__CU_DIV:
        return a / b;
    default: /* maximum: NaN propagates (a NaN a is kept; a > NaN is false, giving b) */
        return (a != a || a > b) ? a : b;
    }
}

template <typename T>
__global__ void binary_k(int op, T *y, const T *a, const T *b, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) {
        float x0 = hp__ld(a, hp__walk_off(w, 1, i)), x1 = hp__ld(b, hp__walk_off(w, 2, i));
        hp__st(y, i, binary_op(op, x0, x1));
    }
}

/* y = f(a, b) over n same-shape contiguous elements (b NULL: f(a, a) reading a once), 8 a
 * thread (hp__ld8 / hp__st8: every pointer 16-byte aligned), the tail one by one; f takes and
 * gives f32. The 16-byte form of binary, unary and backward-pair ops. */
template <typename T, typename F>
__global__ void map8_k(F f, T *y, const T *a, const T *b, int64_t n) {
    int64_t n8 = n / 8;
    HP__CU_FOR(i, n8) {
        float x0[8], x1[8];
        hp__ld8(a + 8 * i, x0);
        if (b) hp__ld8(b + 8 * i, x1);
        HP__UNROLL
        for (int j = 0; j < 8; j++) x0[j] = f(x0[j], b ? x1[j] : x0[j]);
        hp__st8(y + 8 * i, x0);
    }
    HP__CU_FOR(i, n - 8 * n8) {
        int64_t k = 8 * n8 + i;
        float x = hp__ld(a, k);
        hp__st(y, k, f(x, b ? hp__ld(b, k) : x));
    }
}

/* map8_k on f32 or bf16 storage; false (nothing launched) when the dtype or the pointers do not
 * allow it. */
template <typename F>
static bool launch_map8(cudaStream_t s, int dtype, F f, void *y, const void *a, const void *b,
                        int64_t n) {
    if (!hp__vec8_ok(y, a, b ? b : a) || (dtype != HP__CU_F32 && dtype != HP__CU_BF16))
        return false;
    unsigned g = hp__cu_blocks(n / 8 > 0 ? n / 8 : 1);
    if (dtype == HP__CU_BF16)
        map8_k<__nv_bfloat16, F><<<g, HP__CU_THREADS, 0, s>>>(
            f, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, n);
    else
        map8_k<float, F>
            <<<g, HP__CU_THREADS, 0, s>>>(f, (float *)y, (const float *)a, (const float *)b, n);
    return true;
}

struct binary_f {
    int op;
    __device__ float operator()(float x, float y) const {
        return binary_op(op, x, y);
    }
};

/* Whether every operand of the walk is laid out as the output: contiguous, no broadcast. */
static bool walk_is_flat(const hp__cu_walk *w, int n_ops) {
    for (int k = 0; k < n_ops; k++) {
        int64_t st = 1;
        for (int d = w->rank - 1; d >= 0; d--) {
            if (w->shape[d] != 1 && w->st[k][d] != st) return false;
            st *= w->shape[d];
        }
    }
    return true;
}

template <typename T>
__global__ void compare_k(int op, uint8_t *y, const T *a, const T *b, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) {
        T x0 = a[hp__walk_off(w, 1, i)], x1 = b[hp__walk_off(w, 2, i)];
        y[i] = op == HP__CU_EQ ? x0 == x1 : x0 < x1;
    }
}

template <typename T>
__global__ void compare_f_k(int op, uint8_t *y, const T *a, const T *b, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) {
        float x0 = hp__ld(a, hp__walk_off(w, 1, i)), x1 = hp__ld(b, hp__walk_off(w, 2, i));
        y[i] = op == HP__CU_EQ ? x0 == x1 : x0 < x1;
    }
}

extern "C" int hp__cu_binary(cudaStream_t s, int op, int dtype, void *y, const void *a,
                             const void *b, const hp__cu_walk *walk, int64_t n) {
    if (n == 0) return 0;
    unsigned g = hp__cu_blocks(n);
    bool cmp = op == HP__CU_EQ || op == HP__CU_LT;
    if (!cmp && walk_is_flat(walk, 3) && launch_map8(s, dtype, binary_f{op}, y, a, b, n))
        return HP__CU_LAUNCHED();
    hp__cu_walk fw = *walk, *w = &fw;
    hp__cu_walk_fast(w, n);
    switch (dtype) {
    case HP__CU_F32:
        if (cmp)
            compare_f_k<float><<<g, HP__CU_THREADS, 0, s>>>(op, (uint8_t *)y, (const float *)a,
                                                            (const float *)b, *w, n);
        else
            binary_k<float><<<g, HP__CU_THREADS, 0, s>>>(op, (float *)y, (const float *)a,
                                                         (const float *)b, *w, n);
        break;
    case HP__CU_BF16:
        if (cmp)
            compare_f_k<__nv_bfloat16><<<g, HP__CU_THREADS, 0, s>>>(
                op, (uint8_t *)y, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, *w, n);
        else
            binary_k<__nv_bfloat16><<<g, HP__CU_THREADS, 0, s>>>(
                op, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, *w, n);
        break;
    case HP__CU_I32:
        compare_k<int32_t><<<g, HP__CU_THREADS, 0, s>>>(op, (uint8_t *)y, (const int32_t *)a,
                                                        (const int32_t *)b, *w, n);
        break;
    case HP__CU_I64:
        compare_k<int64_t><<<g, HP__CU_THREADS, 0, s>>>(op, (uint8_t *)y, (const int64_t *)a,
                                                        (const int64_t *)b, *w, n);
        break;
    default:
        compare_k<uint8_t><<<g, HP__CU_THREADS, 0, s>>>(op, (uint8_t *)y, (const uint8_t *)a,
                                                        (const uint8_t *)b, *w, n);
        break;
    }
    return HP__CU_LAUNCHED();
}

/* ---- where ---------------------------------------------------------------------------------- */

template <typename T>
__global__ void where_k(T *y, const uint8_t *c, const T *a, const T *b, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) {
        y[i] = c[hp__walk_off(w, 1, i)] ? a[hp__walk_off(w, 2, i)] : b[hp__walk_off(w, 3, i)];
    }
}

extern "C" int hp__cu_where(cudaStream_t s, size_t esize, void *y, const void *cond, const void *a,
                            const void *b, const hp__cu_walk *walk, int64_t n) {
    if (n == 0) return 0;
    unsigned g = hp__cu_blocks(n);
    const uint8_t *c = (const uint8_t *)cond;
    hp__cu_walk fw = *walk, *w = &fw;
    hp__cu_walk_fast(w, n);
    switch (esize) {
    case 1:
        where_k<uint8_t><<<g, HP__CU_THREADS, 0, s>>>((uint8_t *)y, c, (const uint8_t *)a,
                                                      (const uint8_t *)b, *w, n);
        break;
    case 2:
        where_k<uint16_t><<<g, HP__CU_THREADS, 0, s>>>((uint16_t *)y, c, (const uint16_t *)a,
                                                       (const uint16_t *)b, *w, n);
        break;
    case 4:
        where_k<uint32_t><<<g, HP__CU_THREADS, 0, s>>>((uint32_t *)y, c, (const uint32_t *)a,
                                                       (const uint32_t *)b, *w, n);
        break;
    default:
        where_k<uint64_t><<<g, HP__CU_THREADS, 0, s>>>((uint64_t *)y, c, (const uint64_t *)a,
                                                       (const uint64_t *)b, *w, n);
        break;
    }
    return HP__CU_LAUNCHED();
}

/* ---- unary ---------------------------------------------------------------------------------- */

__device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float pow_f(float x, double e) {
    if (e == 2) return x * x;
    if (e == 1) return x;
    if (e == 0.5) return sqrtf(x);
    if (e == -1) return 1.0f / x;
    if (e == 0) return 1.0f;
    return (float)pow((double)x, e);
}

__device__ __forceinline__ float unary_op(int op, float x, double p) {
    switch (op) {
    case HP__CU_ADD_SCALAR:
        return (float)((double)x + p);
    case HP__CU_MUL_SCALAR:
        return (float)((double)x * p);
    case HP__CU_POW:
        return pow_f(x, p);
    case HP__CU_NEG:
        return -x;
    case HP__CU_EXP:
        return expf(x);
    case HP__CU_LOG:
        return logf(x);
    case HP__CU_SQRT:
        return sqrtf(x);
    case HP__CU_RSQRT:
        return (float)(1.0 / sqrt((double)x));
    case HP__CU_TANH:
        return tanhf(x);
    case HP__CU_SIN: /* full-range reduction (not __sinf): RoPE's angles reach thousands */
        return sinf(x);
    case HP__CU_COS:
        return cosf(x);
    case HP__CU_ERF:
        return erff(x);
    case HP__CU_SIGMOID:
        return sigmoid_f(x);
    case HP__CU_SILU:
        return x * sigmoid_f(x);
    case HP__CU_GELU:
        if (p != 0) return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
        return 0.5f * x * (1.0f + erff(x * INV_SQRT_2));
    default: /* relu: NaN stays NaN */
        return x < 0 ? 0.0f : x;
    }
}

template <typename T> __global__ void unary_k(int op, T *y, const T *x, double p, int64_t n) {
    HP__CU_FOR(i, n) hp__st(y, i, unary_op(op, hp__ld(x, i), p));
}

struct unary_f {
    int op;
    double p;
    __device__ float operator()(float x, float) const {
        return unary_op(op, x, p);
    }
};

extern "C" int hp__cu_unary(cudaStream_t s, int op, int dtype, void *y, const void *x, double p,
                            int64_t n) {
    if (n == 0) return 0;
    unsigned g = hp__cu_blocks(n);
    if (launch_map8(s, dtype, unary_f{op, p}, y, x, NULL, n)) return HP__CU_LAUNCHED();
    if (dtype == HP__CU_BF16)
        unary_k<__nv_bfloat16>
            <<<g, HP__CU_THREADS, 0, s>>>(op, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, p, n);
    else
        unary_k<float><<<g, HP__CU_THREADS, 0, s>>>(op, (float *)y, (const float *)x, p, n);
    return HP__CU_LAUNCHED();
}

/* ---- backward pairs ------------------------------------------------------------------------- */

__device__ __forceinline__ float pair_op(int op, float g, float s, double p) {
    switch (op) {
    case HP__CU_TANH_BW:
        return g * (1.0f - s * s);
    case HP__CU_SIGMOID_BW:
        return g * s * (1.0f - s);
    case HP__CU_SILU_BW: {
        float sg = sigmoid_f(s);
        return g * sg * (1.0f + s * (1.0f - sg));
    }
    case HP__CU_GELU_BW:
        if (p != 0) {
            float u = SQRT_2_OVER_PI * (s + GELU_C * s * s * s);
            float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * s * s);
            float t = tanhf(u);
            return g * (0.5f * (1.0f + t) + 0.5f * s * (1.0f - t * t) * du);
        } else {
            float cdf = 0.5f * (1.0f + erff(s * INV_SQRT_2));
            float pdf = INV_SQRT_2PI * expf(-0.5f * s * s);
            return g * (cdf + s * pdf);
        }
    default: /* threshold: compared in double, the threshold is a double */
        return (double)s > p ? g : 0.0f;
    }
}

template <typename T>
__global__ void pair_k(int op, T *y, const T *g, const T *sv, double p, int64_t n) {
    HP__CU_FOR(i, n) hp__st(y, i, pair_op(op, hp__ld(g, i), hp__ld(sv, i), p));
}

struct pair_f {
    int op;
    double p;
    __device__ float operator()(float g, float saved) const {
        return pair_op(op, g, saved, p);
    }
};

extern "C" int hp__cu_backward_pair(cudaStream_t s, int op, int dtype, void *y, const void *g,
                                    const void *saved, double p, int64_t n) {
    if (n == 0) return 0;
    unsigned b = hp__cu_blocks(n);
    if (launch_map8(s, dtype, pair_f{op, p}, y, g, saved, n)) return HP__CU_LAUNCHED();
    if (dtype == HP__CU_BF16)
        pair_k<__nv_bfloat16><<<b, HP__CU_THREADS, 0, s>>>(
            op, (__nv_bfloat16 *)y, (const __nv_bfloat16 *)g, (const __nv_bfloat16 *)saved, p, n);
    else
        pair_k<float><<<b, HP__CU_THREADS, 0, s>>>(op, (float *)y, (const float *)g,
                                                   (const float *)saved, p, n);
    return HP__CU_LAUNCHED();
}

/* ---- creation and casts --------------------------------------------------------------------- */

/* Truncates toward zero and clamps into [lo, hi]; NaN -> 0. */
__device__ __forceinline__ double int_range(double v, double lo, double hi) {
    if (v != v) return 0;
    v = trunc(v);
    return v < lo ? lo : v > hi ? hi : v;
}

__device__ __forceinline__ double load_any(int dt, const void *x, int64_t i) {
    switch (dt) {
    case HP__CU_F32:
        return ((const float *)x)[i];
    case HP__CU_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)x)[i]);
    case HP__CU_F16:
        return __half2float(((const __half *)x)[i]);
    case HP__CU_I32:
        return ((const int32_t *)x)[i];
    case HP__CU_I64:
        return (double)((const int64_t *)x)[i];
    default:
        return ((const uint8_t *)x)[i] != 0;
    }
}

__device__ __forceinline__ void store_any(int dt, void *y, int64_t i, double v) {
    switch (dt) {
    case HP__CU_F32:
        ((float *)y)[i] = (float)v;
        break;
    case HP__CU_BF16: /* via f32, as the cpu backend */
        ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn((float)v);
        break;
    case HP__CU_F16:
        ((__half *)y)[i] = __float2half_rn((float)v);
        break;
    case HP__CU_I32:
        ((int32_t *)y)[i] = (int32_t)int_range(v, -2147483648.0, 2147483647.0);
        break;
    case HP__CU_I64: {
        /* 2^63 is not an int64: the clamp's upper end is the largest double below it */
        double c = int_range(v, -9223372036854775808.0, 9223372036854774784.0);
        ((int64_t *)y)[i] = (int64_t)c;
        break;
    }
    default:
        ((uint8_t *)y)[i] = v != 0;
        break;
    }
}

__global__ void fill_k(int dt, void *y, double v, int64_t n) {
    HP__CU_FOR(i, n) store_any(dt, y, i, v);
}

extern "C" int hp__cu_fill(cudaStream_t s, int dtype, void *y, double v, int64_t n) {
    if (n == 0) return 0;
    fill_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(dtype, y, v, n);
    return HP__CU_LAUNCHED();
}

__global__ void cast_k(int to, void *y, int from, const void *x, int64_t n) {
    HP__CU_FOR(i, n) {
        if (from == HP__CU_I64 && to == HP__CU_I32) /* exact: no trip through double */
            ((int32_t *)y)[i] =
                (int32_t)max((int64_t)INT32_MIN, min((int64_t)INT32_MAX, ((const int64_t *)x)[i]));
        else if (from == HP__CU_I32 && to == HP__CU_I64)
            ((int64_t *)y)[i] = ((const int32_t *)x)[i];
        else
            store_any(to, y, i, load_any(from, x, i));
    }
}

/* f32 <-> bf16, 8 elements a thread: the mixed-precision casts of every parameter and gradient. */
template <typename To, typename From> __global__ void cast8_k(To *y, const From *x, int64_t n) {
    int64_t n8 = n / 8;
    HP__CU_FOR(i, n8) {
        float v[8];
        hp__ld8(x + 8 * i, v);
        hp__st8(y + 8 * i, v);
    }
    HP__CU_FOR(i, n - 8 * n8) hp__st(y, 8 * n8 + i, hp__ld(x, 8 * n8 + i));
}

extern "C" int hp__cu_cast(cudaStream_t s, int to, void *y, int from, const void *x, int64_t n) {
    if (n == 0) return 0;
    if (hp__vec8_ok(y, x, x) &&
        ((to == HP__CU_BF16 && from == HP__CU_F32) || (to == HP__CU_F32 && from == HP__CU_BF16))) {
        unsigned g8 = hp__cu_blocks(n / 8 > 0 ? n / 8 : 1);
        if (to == HP__CU_BF16)
            cast8_k<__nv_bfloat16, float>
                <<<g8, HP__CU_THREADS, 0, s>>>((__nv_bfloat16 *)y, (const float *)x, n);
        else
            cast8_k<float, __nv_bfloat16>
                <<<g8, HP__CU_THREADS, 0, s>>>((float *)y, (const __nv_bfloat16 *)x, n);
        return HP__CU_LAUNCHED();
    }
    cast_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(to, y, from, x, n);
    return HP__CU_LAUNCHED();
}
