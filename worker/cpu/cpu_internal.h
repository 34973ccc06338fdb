/* worker/cpu/cpu_internal.h — what the cpu backend's files share (hp__cpu_ prefix): the
 * backend object, the kernel signature and the kernels by family, dtype checks, scratch
 * memory, the strided-copy engine, vectorizable expf / sums / max, and HP__CPU_TWIN (a hot
 * loop built for AVX2 and for the baseline target, with identical results).
 *
 * A kernel computes one hp_kernel_call synchronously on the calling thread plus the backend's
 * pool. It trusts the op and attributes (the graph verified) but checks the buffer types it
 * relies on, so a wrong call is an error, never an out-of-bounds access. Messages name the
 * operand and the cause; cpu_backend.c prefixes "cpu: OP: ".
 *
 * Determinism: every kernel's result depends only on its inputs and shapes, never on the
 * number of threads: work is split into pieces whose size is a constant of the kernel, and
 * partial results are combined in a fixed order (never atomics on floats).
 */
#ifndef HP_WORKER_CPU_INTERNAL_H
#define HP_WORKER_CPU_INTERNAL_H

/* The kernels are written as plain loops for the vectorizer: GCC needs -O3's vectorizer and
 * no-trapping-math (to if-convert float selects) for that, in every file that includes this
 * one and before the inline helpers below (GCC does not inline across optimize settings).
 * fp-contract=off keeps a*b+c unfused whatever -march says, so results do not depend on the
 * build's target. Clang vectorizes these loops at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math", "fp-contract=off")
#endif

#include "hp/threads.h"
#include "worker/backend.h"
#include "worker/bf16.h"
#include "worker/cpu/cpu_comm.h"
#include "worker/simd.h"

#include <stdint.h>
#include <string.h>

/* Elementwise work below this many elements runs as one chunk: waking the pool costs more. */
#define HP__CPU_GRAIN 16384

/* Cached rotary tables: (T, D, theta) -> cos/sin [T, D/2]. */
#define HP__CPU_ROPE_SLOTS 4

typedef struct hp__cpu_rope {
    int64_t t, d;
    double theta;
    float *cs;     /* [T, D/2, 2]: cos, sin of t * theta^(-2i/D); NULL when the slot is empty */
    uint64_t used; /* LRU clock */
} hp__cpu_rope;

typedef struct hp__cpu {
    hp_backend base; /* first: hp_backend * <-> hp__cpu * */
    hp_pool *pool;   /* `threads` threads, the caller's included (1: runs inline) */
    int threads;
    void *scratch; /* reusable kernel scratch, 64-byte aligned, grown on demand */
    size_t scratch_cap;
    void *stage; /* f32 copies of a staged call's bf16 operands (cpu_backend.c), grown */
    size_t stage_cap;
    hp__cpu_rope rope[HP__CPU_ROPE_SLOTS];
    uint64_t rope_clock;
    hp__cpu_comm *comm; /* the comm stream; NULL: no communicator */
    double peak_flops;  /* hp_cpu_peak_flops(threads), measured at the first info(); 0: unknown */
    bool peak_done;
} hp__cpu;

typedef hp_status (*hp__cpu_kernel)(hp__cpu *cpu, const hp_kernel_call *c, hp_err *err);

/* ---- helpers (cpu_backend.c) ---------------------------------------------------------------- */

/* Dtype masks for the checks below. */
#define HP__M(dt)  (1u << (dt))
#define HP__F32    HP__M(HP_F32)
#define HP__INTS   (HP__M(HP_I32) | HP__M(HP_I64))
#define HP__NUM    (HP__F32 | HP__INTS)
#define HP__ANY    (HP__NUM | HP__M(HP_BOOL))
#define HP__ANY_FP (HP__ANY | HP__M(HP_BF16) | HP__M(HP_F16))

/* Input k (out == 0) or output k (out == 1) must have a dtype in `allowed`. A floating dtype
 * outside it is HP_UNSUPPORTED ("dtype f16 of input 0 is not supported: the cpu backend
 * computes floating ops in f32 and stores f32 or bf16"), anything else HP_INVALID. bf16
 * operands never reach a kernel that computes: cpu_backend.c stages them in f32. */
hp_status hp__cpu_dtype(const hp_kernel_call *c, int out, int k, unsigned allowed, hp_err *err);
/* hp__cpu_dtype on every input and output. */
hp_status hp__cpu_dtypes_all(const hp_kernel_call *c, unsigned allowed, hp_err *err);
/* Output k's element count must equal n. */
hp_status hp__cpu_out_numel(const hp_kernel_call *c, int k, int64_t n, hp_err *err);
/* Input a and output b (or input b when b_out is 0) must have equal shapes. */
hp_status hp__cpu_same_shape(const hp_kernel_call *c, int a, int b, int b_out, hp_err *err);
/* in must broadcast (numpy rules) to out. `what` names it in the message. */
hp_status hp__cpu_check_bcast(const hp_type *in, const hp_type *out, const char *what, hp_err *err);
/* A dim attribute normalised against rank; HP_INVALID when out of range. */
hp_status hp__cpu_attr_dim(const hp_node *n, hp_attr_key k, int rank, int *out, hp_err *err);

/* Scratch of at least `bytes` (64-byte aligned, contents undefined), valid until the next
 * call; kernels carve all their temporaries out of one request. */
void *hp__cpu_scratch(hp__cpu *cpu, size_t bytes, hp_err *err);

/* Chunks for a parallel-for over n items costing ~`cost` units each: at least HP__CPU_GRAIN
 * units per chunk. */
static inline int64_t hp__cpu_grain(int64_t cost) {
    if (cost < 1) cost = 1;
    int64_t g = HP__CPU_GRAIN / cost;
    return g < 1 ? 1 : g;
}

/* Row-major strides of t, in elements. */
void hp__cpu_strides(const hp_type *t, int64_t st[HP_MAX_RANK]);
/* Strides of `in` addressed with an index of `out` (broadcast: stride 0 where in has size 1
 * or lacks the dim). Assumes hp__cpu_check_bcast passed. */
void hp__cpu_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]);

/* ---- the strided-copy engine (k_shape.c) ---------------------------------------------------- */

/* dst[Σ idx·dst_st] = src[Σ idx·src_st] for every index of shape (strides in elements, src
 * strides may be 0 for broadcasting). Elements are esize bytes (1, 2, 4 or 8). Parallel over
 * the pool; pure data movement, so deterministic. */
void hp__cpu_strided_copy(hp__cpu *cpu, void *dst, const int64_t *dst_st, const void *src,
                          const int64_t *src_st, const int64_t *shape, int rank, size_t esize);
/* memcpy of n bytes, in parallel chunks; a no-op when dst == src. */
void hp__cpu_copy(hp__cpu *cpu, void *dst, const void *src, size_t n);
/* memset(dst, 0, n) in parallel chunks. */
void hp__cpu_zero(hp__cpu *cpu, void *dst, size_t n);

/* n elements of x (dtype from) cast to y (dtype to), as _to_copy does, on the pool
 * (k_elementwise.c). bf16 <-> f32 takes a direct path (exact one way, round to nearest even
 * the other). */
void hp__cpu_cast(hp__cpu *cpu, void *y, hp_dtype to, const void *x, hp_dtype from, int64_t n);

/* ---- kernels, by family --------------------------------------------------------------------- */
#define HP__CPU_KERNEL(name) hp_status name(hp__cpu *cpu, const hp_kernel_call *c, hp_err *err)

/* k_elementwise.c: full zeros ones, add sub mul div maximum eq lt where, scalar and unary
 * math, _to_copy, the elementwise backward pairs */
HP__CPU_KERNEL(hp__cpu_creation);
HP__CPU_KERNEL(hp__cpu_binary);
HP__CPU_KERNEL(hp__cpu_where);
HP__CPU_KERNEL(hp__cpu_unary);
HP__CPU_KERNEL(hp__cpu_to_copy);
HP__CPU_KERNEL(hp__cpu_backward_pair);

/* k_reduce.c: sum mean amax */
HP__CPU_KERNEL(hp__cpu_reduce);

/* k_shape.c: copies (view reshape unsqueeze squeeze clone wait_tensor), permute transpose t,
 * expand, slice, slice_backward, cat */
HP__CPU_KERNEL(hp__cpu_copy_op);
HP__CPU_KERNEL(hp__cpu_permute);
HP__CPU_KERNEL(hp__cpu_expand);
HP__CPU_KERNEL(hp__cpu_slice);
HP__CPU_KERNEL(hp__cpu_slice_backward);
HP__CPU_KERNEL(hp__cpu_cat);

/* k_matmul.c: mm bmm addmm (OpenBLAS) */
HP__CPU_KERNEL(hp__cpu_mm);
HP__CPU_KERNEL(hp__cpu_bmm);
HP__CPU_KERNEL(hp__cpu_addmm);
/* Makes OpenBLAS run single-threaded (GEMMs are tiled on the pool instead: k_matmul.c). */
void hp__cpu_blas_single_threaded(void);
/* The peak probe: a 1024^3 SGEMM cut into the kernels' tiles, enough copies that each of the
 * pool's threads gets two tiles, run on the pool reps + 1 times (the first warms up; it stops
 * after budget_s seconds once two have run). *rate: the best repetition's FLOPs per thread-CPU
 * second (CLOCK_THREAD_CPUTIME_ID: time the scheduler gives other processes is not counted)
 * times the pool's size (at most the CPUs this process may run on), in FLOP/s. Errors: HP_NOMEM,
 * HP_INTERNAL (no time measured). */
hp_status hp__cpu_gemm_probe(hp_pool *pool, int reps, double budget_s, double *rate, hp_err *err);

/* k_nn.c: embedding (+ dense backward), (log_)softmax (+ backward), nll_loss (+ backward) */
HP__CPU_KERNEL(hp__cpu_embedding);
HP__CPU_KERNEL(hp__cpu_embedding_backward);
HP__CPU_KERNEL(hp__cpu_chunked_embedding);
HP__CPU_KERNEL(hp__cpu_chunked_embedding_backward);
HP__CPU_KERNEL(hp__cpu_softmax);
HP__CPU_KERNEL(hp__cpu_softmax_backward);
HP__CPU_KERNEL(hp__cpu_nll_loss);
HP__CPU_KERNEL(hp__cpu_nll_loss_backward);
HP__CPU_KERNEL(hp__cpu_fused_cross_entropy);
HP__CPU_KERNEL(hp__cpu_fused_cross_entropy_backward);
HP__CPU_KERNEL(hp__cpu_swiglu);
HP__CPU_KERNEL(hp__cpu_swiglu_backward);

/* k_norm_rope.c: fused RMSNorm (+ backward), rotary embedding */
HP__CPU_KERNEL(hp__cpu_rms_norm);
HP__CPU_KERNEL(hp__cpu_rms_norm_backward);
HP__CPU_KERNEL(hp__cpu_layer_norm); /* k_layer_norm.c */
HP__CPU_KERNEL(hp__cpu_layer_norm_backward);
HP__CPU_KERNEL(hp__cpu_tril); /* k_mask.c */
HP__CPU_KERNEL(hp__cpu_bitwise_not);
HP__CPU_KERNEL(hp__cpu_arange);
HP__CPU_KERNEL(hp__cpu_dropout); /* k_mask.c: native_dropout (+ backward) */
HP__CPU_KERNEL(hp__cpu_dropout_backward);
HP__CPU_KERNEL(hp__cpu_rotary);
/* Frees the cached rotary tables. */
void hp__cpu_rope_fini(hp__cpu *cpu);

/* k_attention.c: _scaled_dot_product_flash_attention (+ backward) */
HP__CPU_KERNEL(hp__cpu_sdpa);
HP__CPU_KERNEL(hp__cpu_sdpa_backward);
/* Backward strategy, for tests: 0 automatic, 1 one task per (batch, kv head), 2 two passes
 * (key blocks, then query blocks). All give bit-identical results. */
void hp__cpu_sdpa_backward_mode(int mode);

/* ---- vectorizable math ---------------------------------------------------------------------- */

static inline float hp__cpu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t hp__cpu_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float hp__cpu_bf16_f32(uint16_t h) {
    return hp__cpu_bits_f32((uint32_t)h << 16);
}

/* f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN (worker/bf16.h). */
static inline uint16_t hp__cpu_f32_bf16(float f) {
    return hp__bf16_round(f);
}

/* exp(x) in f32 within ~2 ulp (Cephes' polynomial), written so that loops over it vectorize:
 * no calls, no branches. x < -86.6 gives 0 (true values below 2.4e-38), x > 88.72 gives +inf,
 * NaN stays NaN. Identical bits on every path (no FMA contraction: see the files' pragmas). */
static inline float hp__cpu_expf(float x) {
    const float lo = -86.6f, hi = 88.72283f;
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    float t = xc * 1.44269504088896341f + 12582912.0f; /* + 1.5·2^23 rounds to an integer */
    float fn = t - 12582912.0f;
    uint32_t n = hp__cpu_f32_bits(t) - 0x4B400000u; /* that integer, two's complement */
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n as 2^(n-1) · 2 so that n = 128 (x near hi) does not overflow the exponent field */
    float y = p * hp__cpu_bits_f32((n + 126u) << 23) * 2.0f;
    y = x < lo ? 0.0f : y;
    y = x > hi ? __builtin_inff() : y;
    return y;
}

/* tanh(x) in f32 within ~2 ulp (Cephes' tanhf), vectorizable like hp__cpu_expf: the odd
 * polynomial for |x| < 0.625 and 1 - 2 / (exp(2|x|) + 1) above, both computed and one
 * selected; |x| > 44 gives ±1 exactly (exp saturates), NaN stays NaN. */
static inline float hp__cpu_tanhf(float x) {
    float a = x < 0 ? -x : x;
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = p * z * x + x;
    float ac = a > 44.0f ? 44.0f : a; /* also keeps exp finite; NaN passes through */
    float big = 1.0f - 2.0f / (hp__cpu_expf(ac + ac) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}

/* Σ x[i] in double: 8 lanes (lane k takes i ≡ k mod 8), folded in lane order. The result
 * depends on n and the values only, and vectorizes. */
static inline double hp__cpu_sum_d(const float *x, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += (double)x[i];
    double s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

/* Σ a[i]·b[i] in double, lanes as hp__cpu_sum_d. */
static inline double hp__cpu_dot_d(const float *a, const float *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)a[i + k] * (double)b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += (double)a[i] * (double)b[i];
    double s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    return s;
}

/* max(m, x[0..n)), NaN if any is NaN. Eight independent lanes (GCC will not vectorize a float
 * max reduction without finite-math, but the lanes at least do not wait on each other). */
static inline float hp__cpu_max(const float *x, int64_t n, float m) {
    int nan = m != m;
    for (int64_t i = 0; i < n; i++) nan |= x[i] != x[i];
    float lane[8];
    for (int k = 0; k < 8; k++) lane[k] = m;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
    for (; i < n; i++) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
    for (int k = 0; k < 8; k++) m = lane[k] > m ? lane[k] : m;
    return nan ? __builtin_nanf("") : m;
}

/* ---- two builds of a hot loop ---------------------------------------------------------------
 * HP__CPU_TWIN(name, body) defines name_avx2 (compiled for AVX2+FMA) and name_base around the
 * same always-inline body, and name_pick() returning the one this CPU runs (worker/simd.h).
 * With FMA contraction off and no reassociation, both give the same bits: the AVX2 build is
 * just wider. `body` has the hp_range_fn signature (ctx, begin, end, thread). */
#define HP__CPU_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define HP__CPU_TWIN(name, body)                                                                   \
    __attribute__((target("avx2,fma"))) static void name##_avx2(void *ctx, int64_t b, int64_t e,   \
                                                                int thread) {                      \
        body(ctx, b, e, thread);                                                                   \
    }                                                                                              \
    static void name##_base(void *ctx, int64_t b, int64_t e, int thread) {                         \
        body(ctx, b, e, thread);                                                                   \
    }                                                                                              \
    static hp_range_fn name##_pick(void) {                                                         \
        return hp__simd_avx2() ? name##_avx2 : name##_base;                                        \
    }
#else
#define HP__CPU_TWIN(name, body)                                                                   \
    static void name##_base(void *ctx, int64_t b, int64_t e, int thread) {                         \
        body(ctx, b, e, thread);                                                                   \
    }                                                                                              \
    static hp_range_fn name##_pick(void) {                                                         \
        return name##_base;                                                                        \
    }
#endif

#endif
