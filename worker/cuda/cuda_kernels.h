/* worker/cuda/cuda_kernels.h — the launchers of the cuda backend's own kernels (k_*.cu, one op
 * family per file), in plain C types so that the C side (cuda_ops*.c, which checks every call
 * against its node) and the CUDA side share nothing but this header.
 *
 * Every launcher enqueues its kernels on `s` and returns the cudaError_t of the launch (as an
 * int: cudaSuccess is 0); it never synchronizes. Shapes and strides are in elements. Sizes were
 * checked by the caller; data-dependent faults (an index out of range) are recorded in the
 * device fault word (hp__cu_fault) and reported by the backend at the next synchronize.
 *
 * Element types: HP__CU_F32, HP__CU_BF16, HP__CU_F16, HP__CU_I32, HP__CU_I64, HP__CU_BOOL (the
 * codes of hp_dtype are not used so that this header needs no hp header).
 */
#ifndef HP_WORKER_CUDA_KERNELS_H
#define HP_WORKER_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "worker/attn_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP__CU_MAX_RANK 8

enum { HP__CU_F32 = 0, HP__CU_BF16, HP__CU_F16, HP__CU_I32, HP__CU_I64, HP__CU_BOOL };

/* An index space of `rank` dims with one stride per operand (at most 4 operands). fast,
 * magic and shift are set by the kernel launchers (hp__cu_walk_fast), not by the walk's maker. */
typedef struct hp__cu_walk {
    int rank;
    int64_t shape[HP__CU_MAX_RANK];
    int64_t st[4][HP__CU_MAX_RANK];
    int fast; /* every linear index < 2^31: hp__walk_off divides with magic numbers */
    uint32_t magic[HP__CU_MAX_RANK];
    uint32_t shift[HP__CU_MAX_RANK];
} hp__cu_walk;

/* Unsigned division by d in [1, 2^31) of any i < 2^31 by magic number (Granlund and
 * Montgomery's round-up method, as PyTorch's IntDivider): q = (umulhi(i, magic) + i) >> shift,
 * a multiply-high and an add instead of a 64-bit divide, whose software sequence made index
 * math, not memory, the cost of strided kernels. hp__udiv (k_common.cuh) applies it. */
typedef struct hp__cu_div {
    uint32_t d, magic, shift;
} hp__cu_div;

static inline hp__cu_div hp__cu_div_make(uint32_t d) {
    uint32_t sh = 0;
    while (((uint64_t)1 << sh) < d) sh++;
    hp__cu_div v = {d, (uint32_t)(((((uint64_t)1 << 32) * (((uint64_t)1 << sh) - d)) / d) + 1), sh};
    return v;
}

/* Prepares w for indices [0, n): fast when n and every dim are below 2^31 (hp__cu_div). */
static inline void hp__cu_walk_fast(hp__cu_walk *w, int64_t n) {
    w->fast = n >= 0 && n < 0x7fffffff && w->rank >= 0 && w->rank <= HP__CU_MAX_RANK;
    for (int d = 0; w->fast && d < w->rank; d++) {
        if (w->shape[d] < 1 || w->shape[d] >= 0x7fffffff) {
            w->fast = 0;
            break;
        }
        hp__cu_div v = hp__cu_div_make((uint32_t)w->shape[d]);
        w->magic[d] = v.magic;
        w->shift[d] = v.shift;
    }
}

/* The device fault word: the first data-dependent fault of a kernel since the last
 * synchronize. op is the kernel's code below (0: no fault). */
enum {
    HP__CU_FAULT_NONE = 0,
    HP__CU_FAULT_EMBEDDING_INDEX,
    HP__CU_FAULT_NLL_TARGET,
    HP__CU_FAULT_INJECTED,
};
typedef struct hp__cu_fault {
    long long code, value, position, limit;
} hp__cu_fault;

/* ---- k_elementwise.cu ---------------------------------------------------------------------- */

/* Binary ops and their codes (f32 or bf16 operands, the output of the same type, or bool for
 * eq / lt). The walk's operand 0 is the output, 1 and 2 the inputs (broadcast strides 0). */
enum { HP__CU_ADD = 0, HP__CU_SUB, HP__CU_MUL, HP__CU_DIV, HP__CU_MAXIMUM, HP__CU_EQ, HP__CU_LT };
int hp__cu_binary(cudaStream_t s, int op, int dtype, void *y, const void *a, const void *b,
                  const hp__cu_walk *w, int64_t n);

/* Unary ops with one scalar parameter p (add_scalar, mul_scalar, pow's exponent, gelu's
 * approximate flag); y and x of one float dtype, n elements. */
enum {
    HP__CU_ADD_SCALAR = 0,
    HP__CU_MUL_SCALAR,
    HP__CU_POW,
    HP__CU_NEG,
    HP__CU_EXP,
    HP__CU_LOG,
    HP__CU_SQRT,
    HP__CU_RSQRT,
    HP__CU_TANH,
    HP__CU_SIGMOID,
    HP__CU_SILU,
    HP__CU_GELU,
    HP__CU_RELU,
    HP__CU_SIN,
    HP__CU_COS,
    HP__CU_ERF,
};
int hp__cu_unary(cudaStream_t s, int op, int dtype, void *y, const void *x, double p, int64_t n);

/* Backward pairs (grad, saved) -> grad_in: tanh (saved = y), sigmoid (saved = y), silu
 * (saved = x), gelu (saved = x, p = approximate), threshold (saved = x, p = threshold). */
enum { HP__CU_TANH_BW = 0, HP__CU_SIGMOID_BW, HP__CU_SILU_BW, HP__CU_GELU_BW, HP__CU_THRESHOLD_BW };
int hp__cu_backward_pair(cudaStream_t s, int op, int dtype, void *y, const void *g,
                         const void *saved, double p, int64_t n);

/* y[0..n) = v in dtype (full, zeros, ones). */
int hp__cu_fill(cudaStream_t s, int dtype, void *y, double v, int64_t n);

/* where(cond, a, b): walk operands 0 = y, 1 = cond (bool), 2 = a, 3 = b; esize bytes each. */
int hp__cu_where(cudaStream_t s, size_t esize, void *y, const void *cond, const void *a,
                 const void *b, const hp__cu_walk *w, int64_t n);

/* _to_copy between any two dtypes (torch's rules: float -> int truncates and saturates, NaN
 * -> 0; -> bool is x != 0; -> bf16/f16 rounds to nearest even). */
int hp__cu_cast(cudaStream_t s, int to, void *y, int from, const void *x, int64_t n);

/* ---- k_shape.cu ---------------------------------------------------------------------------- */

/* dst[Σ idx·st[0]] = src[Σ idx·st[1]] over the walk; esize 1, 2, 4 or 8. */
int hp__cu_strided_copy(cudaStream_t s, size_t esize, void *dst, const void *src,
                        const hp__cu_walk *w, int64_t n);

/* ---- k_reduce.cu --------------------------------------------------------------------------- */

/* sum / mean / amax: output o (n_out of them) reduces the input elements at
 * base(o) + Σ r·red_st over the reduced space (red_shape); base(o) walks the kept dims
 * (kept.shape, kept.st[0] input strides). f32 (double accumulation) or i32/i64 (sum only). */
enum { HP__CU_SUM = 0, HP__CU_MEAN, HP__CU_AMAX };
int hp__cu_reduce(cudaStream_t s, int op, int dtype, void *y, const void *x,
                  const hp__cu_walk *kept, int64_t n_out, const hp__cu_walk *red, int64_t n_red);

/* ---- k_embedding.cu ------------------------------------------------------------------------- */

/* y[i, :] = w[idx[i], :] for n positions of d, w and y of dtype (HP__CU_F32 or HP__CU_BF16);
 * idx i32 or i64 (is64); an index outside [0, v) faults (and its row reads zeros). */
int hp__cu_embedding(cudaStream_t s, int dtype, void *y, const void *w, const void *idx, int is64,
                     int64_t n, int64_t v, int64_t d, hp__cu_fault *fault);
/* Scratch bytes of the backwards below for n_keys keys: n positions (k · n for the chunked). */
size_t hp__cu_embedding_backward_scratch(int64_t n_keys);
/* gw [v, d] (ydt) = Σ over positions with index r of g[i, :] (gdt), in position order in f32,
 * deterministic (no atomics); rows no position names and row `pad` are 0. Needs n < 2^32 and
 * v < 2^32 − 1 (the entry checks). */
int hp__cu_embedding_backward(cudaStream_t s, int gdt, int ydt, void *gw, const void *g,
                              const void *idx, int is64, int64_t n, int64_t v, int64_t d,
                              int64_t pad, void *scratch, hp__cu_fault *fault);
/* y[i, :] = Σ over chunks c with base[c] <= idx[i] < base[c] + rows of w[c·rows + idx[i] −
 * base[c], :]: w holds k chunks of rows rows; idx and base i32 or i64 (idx64, base64). */
int hp__cu_chunked_embedding(cudaStream_t s, int dtype, void *y, const void *w, const void *idx,
                             int idx64, const void *base, int base64, int64_t n, int64_t k,
                             int64_t rows, int64_t d);
/* gw [k · rows, d] = the sum, over positions in order, of g[i, :] into each row the forward
 * read; deterministic as the dense backward. */
int hp__cu_chunked_embedding_backward(cudaStream_t s, int gdt, int ydt, void *gw, const void *g,
                                      const void *idx, int idx64, const void *base, int base64,
                                      int64_t n, int64_t k, int64_t rows, int64_t d, void *scratch);

/* ---- k_softmax.cu --------------------------------------------------------------------------- */

/* Lines of len elements inner apart, outer · inner of them. log: log_softmax. */
int hp__cu_softmax(cudaStream_t s, int log, float *y, const float *x, int64_t outer, int64_t len,
                   int64_t inner);
/* log: gx = g − exp(out)·Σg; else gx = out·(g − Σ g·out). */
int hp__cu_softmax_backward(cudaStream_t s, int log, float *gx, const float *g, const float *out,
                            int64_t outer, int64_t len, int64_t inner);

/* ---- k_nll.cu ------------------------------------------------------------------------------- */

/* reduction: 0 none, 1 mean, 2 sum. loss [rows] or [1]; total_weight [1]. */
int hp__cu_nll(cudaStream_t s, float *loss, float *total_weight, const float *logp,
               const void *target, int is64, int64_t rows, int64_t classes, int reduction,
               int64_t ignore, hp__cu_fault *fault);
int hp__cu_nll_backward(cudaStream_t s, float *gx, const float *g, const void *target, int is64,
                        const float *total_weight, int64_t rows, int64_t classes, int reduction,
                        int64_t ignore, hp__cu_fault *fault);

/* ---- k_cross_entropy.cu --------------------------------------------------------------------- */

/* logits x [rows, classes] of dt (HP__CU_F32 or HP__CU_BF16); lse [rows], loss, total_weight
 * f32. mean: 1 for reduction mean, 0 for sum. */
int hp__cu_cross_entropy(cudaStream_t s, int dt, float *loss, float *total_weight, float *lse,
                         const void *x, const void *target, int is64, int64_t rows, int64_t classes,
                         int mean, int64_t ignore, hp__cu_fault *fault);
/* gx (dt, as x) = g'·(exp(x − lse) − onehot(target)). */
int hp__cu_cross_entropy_backward(cudaStream_t s, int dt, void *gx, const float *grad,
                                  const void *x, const void *target, int is64, const float *lse,
                                  const float *total_weight, int64_t rows, int64_t classes,
                                  int mean, int64_t ignore, hp__cu_fault *fault);

/* ---- k_swiglu.cu ---------------------------------------------------------------------------- */

/* y = silu(a)·b; (ga, gb) = (g·b·silu'(a), g·silu(a)); n elements of dt (f32 or bf16). */
int hp__cu_swiglu(cudaStream_t s, int dt, void *y, const void *a, const void *b, int64_t n);
int hp__cu_swiglu_backward(cudaStream_t s, int dt, void *ga, void *gb, const void *g, const void *a,
                           const void *b, int64_t n);

/* ---- k_rmsnorm.cu --------------------------------------------------------------------------- */

/* x, w, y (gy, gx, gw) of one dtype, f32 or bf16; rstd f32. The backward's scratch holds
 * hp__cu_rms_norm_backward_scratch(rows, d) bytes. */
int hp__cu_rms_norm(cudaStream_t s, int dtype, void *y, float *rstd, const void *x, const void *w,
                    int64_t rows, int64_t d, double eps);
size_t hp__cu_rms_norm_backward_scratch(int64_t rows, int64_t d);
int hp__cu_rms_norm_backward(cudaStream_t s, int dtype, void *gx, void *gw, const void *gy,
                             const void *x, const void *w, const float *rstd, int64_t rows,
                             int64_t d, double *scratch);

/* ---- k_rope.cu ------------------------------------------------------------------------------ */

/* x, y [B, T, H, D] of one dtype, f32 or bf16: pair i of position t rotated by
 * t·theta^(−2i/D) (sign −1: inverse). table: scratch of hp__cu_rotary_scratch(t, d) bytes. */
size_t hp__cu_rotary_scratch(int64_t t, int64_t d);
int hp__cu_rotary(cudaStream_t s, int dtype, void *y, const void *x, int64_t b, int64_t t,
                  int64_t h, int64_t d, double theta, float sign, float *table);

/* ---- k_attention.cu ------------------------------------------------------------------------- */

/* The most head dim the attention kernels take. */
#define HP__CU_ATTN_MAX_D 256

typedef struct hp__cu_attn {
    int64_t b, h, hkv, t, s, d, dv;
    float scale;
    int causal;
    hp_attn_lays l; /* the operands' layouts (worker/attn_layout.h) */
} hp__cu_attn;

/* q [B, H, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] -> out [B, H, T, Dv], lse [B, H, T] (each
 * operand as its layout in a says; lse and the backward's delta [B, H, T] contiguous). */
int hp__cu_attention(cudaStream_t s, const hp__cu_attn *a, float *out, float *lse, const float *q,
                     const float *k, const float *v);
/* delta: scratch [B, H, T] floats. */
int hp__cu_attention_backward(cudaStream_t s, const hp__cu_attn *a, float *gq, float *gk, float *gv,
                              const float *gout, const float *q, const float *k, const float *v,
                              const float *out, const float *lse, float *delta);

/* ---- k_layernorm.cu ------------------------------------------------------------------------ */

/* native_layer_norm over the last dim (f32): mean, rstd [rows]. The backward's scratch holds
 * hp__cu_layer_norm_backward_scratch(rows, d) bytes. */
int hp__cu_layer_norm(cudaStream_t s, float *y, float *mean, float *rstd, const float *x,
                      const float *w, const float *b, int64_t rows, int64_t d, double eps);
size_t hp__cu_layer_norm_backward_scratch(int64_t rows, int64_t d);
int hp__cu_layer_norm_backward(cudaStream_t s, float *gx, float *gw, float *gb, const float *gy,
                               const float *x, const float *mean, const float *rstd, const float *w,
                               int64_t rows, int64_t d, double *scratch);

/* ---- k_mask.cu ------------------------------------------------------------------------------ */

/* tril over `total` elements of [..., m, n] matrices: (i, j) kept where j − i <= diag. */
int hp__cu_tril(cudaStream_t s, size_t esize, void *y, const void *x, int64_t m, int64_t n,
                int64_t diag, int64_t total);
/* !x (bool) or ~x (i32, i64). */
int hp__cu_bitwise_not(cudaStream_t s, int dtype, void *y, const void *x, int64_t n);
/* element i = start + i·step, as i32, i64 or f32. */
int hp__cu_arange(cudaStream_t s, int dtype, void *y, int64_t start, int64_t step, int64_t n);

/* One dropout draw (hp/rng.h): stream is hp_rng_stream_id(fqn) moved by the step; local
 * element idx[] of this rank's piece is global element off[d] + idx[d] of shape global[]. */
typedef struct hp__cu_dropout_draw {
    uint64_t seed, stream;
    uint32_t threshold;
    float scale;
    int rank;
    int64_t local[HP__CU_MAX_RANK], off[HP__CU_MAX_RANK], global[HP__CU_MAX_RANK];
} hp__cu_dropout_draw;
int hp__cu_dropout(cudaStream_t s, const hp__cu_dropout_draw *d, float *y, uint8_t *mask,
                   const float *x, int64_t n);
int hp__cu_dropout_backward(cudaStream_t s, float *gx, const float *g, const uint8_t *mask,
                            float scale, int64_t n);

/* ---- k_flash.cu ---------------------------------------------------------------------------- */

/* The tensor-core attention for bf16 q, k, v, out (lse f32): 1 when it takes these shapes
 * (head dims 16, 32, 48, 64, 80, 96 or 128, d == dv). */
int hp__cu_flash_ok(const hp__cu_attn *a);
/* As hp__cu_attention, bf16 operands (s ≥ 1, every pointer 16-byte aligned). */
int hp__cu_flash(cudaStream_t s, const hp__cu_attn *a, void *out, float *lse, const void *q,
                 const void *k, const void *v);
/* As hp__cu_attention_backward, bf16 operands; gq, gk, gv are written whole. */
int hp__cu_flash_backward(cudaStream_t s, const hp__cu_attn *a, void *gq, void *gk, void *gv,
                          const void *gout, const void *q, const void *k, const void *v,
                          const void *out, const float *lse, float *delta);

/* ---- k_optim.cu ----------------------------------------------------------------------------- */

/* The per-step scalars of hp_adamw_step (worker/optim.c), rounded there. */
typedef struct hp__cu_adamw {
    float decay, b1, omb1, b2, omb2, bc2_sqrt, eps, neg_step;
    float g_scale; /* each gradient is read times this (clipping; 1: as is) */
} hp__cu_adamw;
/* pb: NULL, or the parameter's bf16 copy, each updated element stored there too (rounded to
 * nearest even: the bits of the cast kernel). */
int hp__cu_adamw_step(cudaStream_t s, const hp__cu_adamw *k, float *p, const float *g, float *m,
                      float *v, uint16_t *pb, int64_t n);
/* For each of n spans (a device table), partial[span · HP__CU_SUMSQ_BLOCKS + 0..BLOCKS) = sums
 * of squares (double) of fixed slices of the span (a block per 4096 elements; the partials past
 * the last block are zeros): every span in one launch. */
#define HP__CU_SUMSQ_BLOCKS 256
typedef struct hp__cu_span {
    const float *x;
    int64_t n;
} hp__cu_span;
int hp__cu_sumsq(cudaStream_t s, double *partial, const hp__cu_span *spans, int n);
int hp__cu_scale(cudaStream_t s, float *x, int64_t n, float coef);
/* dst += src (first: dst = src), n floats: gradient accumulation. */
int hp__cu_accumulate(cudaStream_t s, float *dst, const float *src, int64_t n, bool first);
/* Records fault `code` with value v (the injected-error test's kernel). */
int hp__cu_inject_fault(cudaStream_t s, hp__cu_fault *fault, long long code, long long v);

#ifdef __cplusplus
}
#endif
#endif
