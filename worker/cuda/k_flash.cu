/* worker/cuda/k_flash.cu — fused causal attention on the tensor cores, bf16 q/k/v/out with f32
 * softmax statistics and accumulators (FlashAttention-2's algorithm; mma.sync m16n8k16 through
 * k_mma.cuh). Head dims 64 and 128 (d == dv), grouped-query heads (query head h reads kv head
 * h / (H / Hkv)), causal or not, any T and S (rows past the end read zeros and are not
 * stored). The T x S matrix never exists.
 *
 * Forward: a block of 4 warps per (batch, head, 64 queries), each warp 16 query rows; K and V
 * tiles of 64 keys in shared memory (rows padded by 16 bytes: ldmatrix without bank
 * conflicts); S = Q·Kᵀ in registers, the online softmax in the log2 domain, P rounded to bf16
 * and fed back as the A operand of P·V. lse = ln Σ exp(scale·s), f32.
 * Backward, deterministic (every output element is summed by one thread in a fixed order, no
 * atomics), with delta = rowsum(dO ∘ O):
 *   dK, dV: a block per (batch, kv head, 64 keys), each warp 16 keys, walking the group's query
 *           heads and every visible query in tiles of 16: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ recomputed,
 *           Pᵀ = exp(scale·Sᵀ − lse), dV += Pᵀ·dO, dSᵀ = Pᵀ ∘ (dPᵀ − delta), dK += dSᵀ·Q;
 *   dQ:     a block per (batch, head, 64 queries), key tiles of 32: dQ += dS·K.
 * (FlashAttention-2 sums dQ with atomics inside the dK/dV pass; recomputing S and dP in a
 * second pass costs two more products of seven and keeps the result bit-reproducible.)
 *
 * The entry (cuda_ops_nn.c) takes this path for bf16 operands of those head dims; f32 and other
 * head dims run k_attention.cu's kernels. */
#include "worker/cuda/k_mma.cuh"

#include <math.h>

#define PAD   8 /* bf16 per shared-memory row beyond the head dim: 16 bytes */
#define NT    128
#define LOG2E 1.4426950408889634f
#define LN2   0.6931471805599453f

/* 16 bytes from global to shared memory (both 16-byte aligned), or zeros. */
__device__ __forceinline__ void copy16(__nv_bfloat16 *dst, const __nv_bfloat16 *src) {
#ifdef HP_CUDA_EMU
    if (src)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
#else
    *(uint4 *)dst = src ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#endif
}

/* Rows [r0, r0 + R) of a row-major [n][D] matrix into s[R][D + PAD]; rows past n are zeros. */
template <int D, int R>
__device__ __forceinline__ void load_rows(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t r0,
                                          int64_t n) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < R * CH; i += NT) {
        int r = i / CH, c = i % CH;
        copy16(s + r * (D + PAD) + c * 8, r0 + r < n ? g + (r0 + r) * D + c * 8 : nullptr);
    }
}

/* The address lane l gives ldmatrix for a 16x16 A fragment (rows m0.., cols k0..) of a tile
 * stored [m][k], or for a B fragment pair (two n-tiles of 8: rows n0.., cols k0..) of a tile
 * stored [n][k], or (trans) for a B fragment pair of a tile stored [k][n]. */
template <int LD>
__device__ __forceinline__ const __nv_bfloat16 *a_addr(const __nv_bfloat16 *s, int m0, int k0) {
    int l = threadIdx.x & 31;
    return s + (m0 + (l % 8) + ((l / 8) % 2) * 8) * LD + k0 + (l / 16) * 8;
}
template <int LD>
__device__ __forceinline__ const __nv_bfloat16 *b_addr(const __nv_bfloat16 *s, int n0, int k0) {
    int l = threadIdx.x & 31;
    return s + (n0 + (l % 8) + (l / 16) * 8) * LD + k0 + ((l / 8) % 2) * 8;
}
template <int LD>
__device__ __forceinline__ const __nv_bfloat16 *bt_addr(const __nv_bfloat16 *s, int k0, int n0) {
    int l = threadIdx.x & 31;
    return s + (k0 + (l % 8) + ((l / 8) % 2) * 8) * LD + n0 + (l / 16) * 8;
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Two 16x8 f32 C tiles side by side (k 0-7 in lo, 8-15 in hi) as the bf16 A fragment of the
 * 16x16 they make. */
__device__ __forceinline__ void a_of_c(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = hp__pack_bf16(lo[0], lo[1]);
    a[1] = hp__pack_bf16(lo[2], lo[3]);
    a[2] = hp__pack_bf16(hi[0], hi[1]);
    a[3] = hp__pack_bf16(hi[2], hi[3]);
}

/* acc [16 x D] += A [16 x 16] · rows k0 .. k0 + 15 of a tile s stored [k][D] (row stride LD). */
template <int D, int LD>
__device__ __forceinline__ void mma_rows(float acc[][4], const uint32_t a[4],
                                         const __nv_bfloat16 *s, int k0) {
    HP__UNROLL
    for (int n = 0; n < D / 16; n++) {
        uint32_t bf[4];
        hp__ldsm_x4_t(bf, bt_addr<LD>(s, k0, n * 16));
        hp__mma_bf16(acc[2 * n], a, bf[0], bf[1]);
        hp__mma_bf16(acc[2 * n + 1], a, bf[2], bf[3]);
    }
}

/* Two bf16 at p (4-byte aligned). */
__device__ __forceinline__ void store_pair(__nv_bfloat16 *p, float lo, float hi) {
    uint32_t v = hp__pack_bf16(lo, hi);
#ifdef HP_CUDA_EMU
    memcpy(p, &v, sizeof v);
#else
    *(uint32_t *)p = v;
#endif
}

/* ---- forward -------------------------------------------------------------------------------- */

template <int D>
__global__ void __launch_bounds__(NT)
    flash_fwd_k(hp__cu_attn a, __nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                const __nv_bfloat16 *k, const __nv_bfloat16 *v) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8;
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)fl_sm, *vs = ks + 64 * LD;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)blockIdx.x * 64;
    int64_t hk = h / (a.h / a.hkv);
    const __nv_bfloat16 *qb = q + (b * a.h + h) * a.t * D;
    const __nv_bfloat16 *kb = k + (b * a.hkv + hk) * a.s * D;
    const __nv_bfloat16 *vb = v + (b * a.hkv + hk) * a.s * D;

    load_rows<D, 64>(ks, qb, t0, a.t); /* Q through shared memory into registers */
    __syncthreads();
    uint32_t qa[KC][4];
    HP__UNROLL
    for (int kc = 0; kc < KC; kc++) hp__ldsm_x4(qa[kc], a_addr<LD>(ks, warp * 16, kc * 16));
    __syncthreads();

    float o[NO][4];
    HP__UNROLL
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float c2 = a.scale * LOG2E;
    int64_t row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
    int64_t t_last = t0 + 63 < a.t - 1 ? t0 + 63 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    for (int64_t s0 = 0; s0 < kend; s0 += 64) {
        load_rows<D, 64>(ks, kb, s0, a.s);
        load_rows<D, 64>(vs, vb, s0, a.s);
        __syncthreads();
        float sc[8][4];
        HP__UNROLL
        for (int n = 0; n < 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        HP__UNROLL
        for (int kc = 0; kc < KC; kc++) {
            HP__UNROLL
            for (int np = 0; np < 4; np++) {
                uint32_t bf[4];
                hp__ldsm_x4(bf, b_addr<LD>(ks, np * 16, kc * 16));
                hp__mma_bf16(sc[2 * np], qa[kc], bf[0], bf[1]);
                hp__mma_bf16(sc[2 * np + 1], qa[kc], bf[2], bf[3]);
            }
        }
        bool mask = s0 + 64 > a.s || (a.causal && s0 + 63 > t0 + warp * 16);
        float mx[2] = {-INFINITY, -INFINITY};
        HP__UNROLL
        for (int n = 0; n < 8; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) {
                int r = e / 2;
                int64_t key = s0 + n * 8 + 2 * qd + (e % 2);
                float x = sc[n][e] * c2;
                if (mask && (key >= a.s || (a.causal && key > row[r]))) x = -INFINITY;
                sc[n][e] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        }
        float base[2], corr[2], ls[2] = {0.0f, 0.0f};
        HP__UNROLL
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            base[r] = mn == -INFINITY ? 0.0f : mn; /* a row that sees no key yet: p = 0 */
            corr[r] = exp2f(m[r] - base[r]);
            m[r] = mn;
        }
        HP__UNROLL
        for (int n = 0; n < 8; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) {
                float p = exp2f(sc[n][e] - base[e / 2]);
                sc[n][e] = p;
                ls[e / 2] += p;
            }
        }
        HP__UNROLL
        for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + ls[r];
        HP__UNROLL
        for (int n = 0; n < NO; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        HP__UNROLL
        for (int kc = 0; kc < 4; kc++) { /* O += P·V, P in bf16 */
            uint32_t pa[4];
            a_of_c(pa, sc[2 * kc], sc[2 * kc + 1]);
            mma_rows<D, LD>(o, pa, vs, kc * 16);
        }
        __syncthreads();
    }
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(l[r]);
        if (row[r] >= a.t) continue;
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        __nv_bfloat16 *orow = out + ((b * a.h + h) * a.t + row[r]) * D;
        HP__UNROLL
        for (int n = 0; n < NO; n++)
            store_pair(orow + n * 8 + 2 * qd, o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (qd == 0)
            lse[(b * a.h + h) * a.t + row[r]] = sum > 0.0f ? (m[r] + log2f(sum)) * LN2 : -INFINITY;
    }
}

/* ---- backward: delta ------------------------------------------------------------------------ */

/* delta[r] = Σ_c gout[r, c] · out[r, c], a warp per row. */
__global__ void flash_delta_k(float *delta, const __nv_bfloat16 *gout, const __nv_bfloat16 *out,
                              int64_t rows, int64_t d) {
    int lane = threadIdx.x % 32;
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
         r += warps) {
        float acc = 0.0f;
        for (int64_t c = lane; c < d; c += 32)
            acc += __bfloat162float(gout[r * d + c]) * __bfloat162float(out[r * d + c]);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) delta[r] = acc;
    }
}

/* ---- backward: dK, dV ----------------------------------------------------------------------- */

template <int D>
__global__ void __launch_bounds__(NT)
    flash_bwd_kv_k(hp__cu_attn a, __nv_bfloat16 *gk, __nv_bfloat16 *gv, const __nv_bfloat16 *gout,
                   const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                   const float *lse, const float *delta) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8;
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)fl_sm, *vs = ks + 64 * LD, *qs = vs + 64 * LD,
                  *dos = qs + 16 * LD;
    float *ls_s = (float *)(dos + 16 * LD), *dl_s = ls_s + 16;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, hk = blockIdx.y, s_0 = (int64_t)blockIdx.x * 64;
    int64_t group = a.h / a.hkv;
    const __nv_bfloat16 *kb = k + (b * a.hkv + hk) * a.s * D;
    const __nv_bfloat16 *vb = v + (b * a.hkv + hk) * a.s * D;
    load_rows<D, 64>(ks, kb, s_0, a.s);
    load_rows<D, 64>(vs, vb, s_0, a.s);

    float dk[NO][4], dv[NO][4];
    HP__UNROLL
    for (int n = 0; n < NO; n++) {
        HP__UNROLL
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    }
    const float c2 = a.scale * LOG2E;
    int64_t key[2] = {s_0 + warp * 16 + g, s_0 + warp * 16 + g + 8};
    /* causal: a query before the block's first key sees none of its keys */
    int64_t qbeg = a.causal ? (s_0 / 16) * 16 : 0;
    for (int64_t gh = 0; gh < group; gh++) {
        int64_t rb = (b * a.h + hk * group + gh) * a.t;
        for (int64_t q0 = qbeg; q0 < a.t; q0 += 16) {
            __syncthreads(); /* the last tile's readers are done (and K, V are in) */
            load_rows<D, 16>(qs, q + rb * D, q0, a.t);
            load_rows<D, 16>(dos, gout + rb * D, q0, a.t);
            if (threadIdx.x < 16) {
                bool in = q0 + threadIdx.x < a.t;
                ls_s[threadIdx.x] = in ? lse[rb + q0 + threadIdx.x] * LOG2E : INFINITY;
                dl_s[threadIdx.x] = in ? delta[rb + q0 + threadIdx.x] : 0.0f;
            }
            __syncthreads();
            float st[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}}, dpt[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            HP__UNROLL
            for (int kc = 0; kc < KC; kc++) {
                uint32_t ka[4], va[4], qf[4], of[4];
                hp__ldsm_x4(ka, a_addr<LD>(ks, warp * 16, kc * 16));
                hp__ldsm_x4(va, a_addr<LD>(vs, warp * 16, kc * 16));
                hp__ldsm_x4(qf, b_addr<LD>(qs, 0, kc * 16));
                hp__ldsm_x4(of, b_addr<LD>(dos, 0, kc * 16));
                hp__mma_bf16(st[0], ka, qf[0], qf[1]);
                hp__mma_bf16(st[1], ka, qf[2], qf[3]);
                hp__mma_bf16(dpt[0], va, of[0], of[1]);
                hp__mma_bf16(dpt[1], va, of[2], of[3]);
            }
            HP__UNROLL
            for (int n = 0; n < 2; n++) {
                HP__UNROLL
                for (int e = 0; e < 4; e++) {
                    int col = n * 8 + 2 * qd + (e % 2);
                    float p = exp2f(st[n][e] * c2 - ls_s[col]);
                    if (a.causal && key[e / 2] > q0 + col) p = 0.0f;
                    st[n][e] = p;
                    dpt[n][e] = p * (dpt[n][e] - dl_s[col]);
                }
            }
            uint32_t pa[4], sa[4];
            a_of_c(pa, st[0], st[1]);
            a_of_c(sa, dpt[0], dpt[1]);
            mma_rows<D, LD>(dv, pa, dos, 0); /* dV += Pᵀ·dO */
            mma_rows<D, LD>(dk, sa, qs, 0);  /* dK += dSᵀ·Q */
        }
    }
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        if (key[r] >= a.s) continue;
        int64_t off = ((b * a.hkv + hk) * a.s + key[r]) * D;
        HP__UNROLL
        for (int n = 0; n < NO; n++) {
            store_pair(gk + off + n * 8 + 2 * qd, dk[n][2 * r] * a.scale,
                       dk[n][2 * r + 1] * a.scale);
            store_pair(gv + off + n * 8 + 2 * qd, dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* ---- backward: dQ --------------------------------------------------------------------------- */

template <int D>
__global__ void __launch_bounds__(NT)
    flash_bwd_q_k(hp__cu_attn a, __nv_bfloat16 *gq, const __nv_bfloat16 *gout,
                  const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                  const float *lse, const float *delta) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8;
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)fl_sm, *vs = ks + 64 * LD;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)blockIdx.x * 64;
    int64_t hk = h / (a.h / a.hkv), rb = (b * a.h + h) * a.t;
    const __nv_bfloat16 *kb = k + (b * a.hkv + hk) * a.s * D;
    const __nv_bfloat16 *vb = v + (b * a.hkv + hk) * a.s * D;

    load_rows<D, 64>(ks, q + rb * D, t0, a.t); /* Q and dO into registers */
    load_rows<D, 64>(vs, gout + rb * D, t0, a.t);
    __syncthreads();
    uint32_t qa[KC][4], oa[KC][4];
    HP__UNROLL
    for (int kc = 0; kc < KC; kc++) {
        hp__ldsm_x4(qa[kc], a_addr<LD>(ks, warp * 16, kc * 16));
        hp__ldsm_x4(oa[kc], a_addr<LD>(vs, warp * 16, kc * 16));
    }
    int64_t row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
    float ls[2], dl[2];
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        ls[r] = row[r] < a.t ? lse[rb + row[r]] * LOG2E : INFINITY;
        dl[r] = row[r] < a.t ? delta[rb + row[r]] : 0.0f;
    }
    float dq[NO][4];
    HP__UNROLL
    for (int n = 0; n < NO; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const float c2 = a.scale * LOG2E;
    int64_t t_last = t0 + 63 < a.t - 1 ? t0 + 63 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    for (int64_t s0 = 0; s0 < kend; s0 += 32) {
        __syncthreads(); /* Q/dO taken, or the last tile's readers done */
        load_rows<D, 32>(ks, kb, s0, a.s);
        load_rows<D, 32>(vs, vb, s0, a.s);
        __syncthreads();
        float sc[4][4], dp[4][4];
        HP__UNROLL
        for (int n = 0; n < 4; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) sc[n][e] = dp[n][e] = 0.0f;
        }
        HP__UNROLL
        for (int kc = 0; kc < KC; kc++) {
            HP__UNROLL
            for (int np = 0; np < 2; np++) {
                uint32_t bf[4];
                hp__ldsm_x4(bf, b_addr<LD>(ks, np * 16, kc * 16));
                hp__mma_bf16(sc[2 * np], qa[kc], bf[0], bf[1]);
                hp__mma_bf16(sc[2 * np + 1], qa[kc], bf[2], bf[3]);
                hp__ldsm_x4(bf, b_addr<LD>(vs, np * 16, kc * 16));
                hp__mma_bf16(dp[2 * np], oa[kc], bf[0], bf[1]);
                hp__mma_bf16(dp[2 * np + 1], oa[kc], bf[2], bf[3]);
            }
        }
        HP__UNROLL
        for (int n = 0; n < 4; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) {
                int r = e / 2;
                int64_t key = s0 + n * 8 + 2 * qd + (e % 2);
                float p = exp2f(sc[n][e] * c2 - ls[r]);
                if (key >= a.s || (a.causal && key > row[r])) p = 0.0f;
                sc[n][e] = p * (dp[n][e] - dl[r]); /* dS */
            }
        }
        HP__UNROLL
        for (int kc = 0; kc < 2; kc++) { /* dQ += dS·K */
            uint32_t sa[4];
            a_of_c(sa, sc[2 * kc], sc[2 * kc + 1]);
            mma_rows<D, LD>(dq, sa, ks, kc * 16);
        }
    }
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        if (row[r] >= a.t) continue;
        __nv_bfloat16 *qrow = gq + (rb + row[r]) * D;
        HP__UNROLL
        for (int n = 0; n < NO; n++)
            store_pair(qrow + n * 8 + 2 * qd, dq[n][2 * r] * a.scale, dq[n][2 * r + 1] * a.scale);
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

static size_t fwd_smem(int64_t d) {
    return (size_t)2 * 64 * (size_t)(d + PAD) * sizeof(__nv_bfloat16);
}
static size_t kv_smem(int64_t d) {
    return (size_t)(64 + 64 + 16 + 16) * (size_t)(d + PAD) * sizeof(__nv_bfloat16) +
           32 * sizeof(float);
}

static int grid_of(int64_t rows, int64_t heads, int64_t batch, dim3 *g) {
    int64_t x = (rows + 63) / 64;
    if (x < 1 || x > 0x7fffffff || heads > 65535 || batch > 65535) return 0;
    *g = dim3((unsigned)x, (unsigned)heads, (unsigned)batch);
    return 1;
}

extern "C" int hp__cu_flash_ok(const hp__cu_attn *a) {
    return (a->d == 64 || a->d == 128) && a->dv == a->d && a->hkv > 0 && a->h % a->hkv == 0;
}

extern "C" int hp__cu_flash(cudaStream_t s, const hp__cu_attn *a, void *out, float *lse,
                            const void *q, const void *k, const void *v) {
    dim3 g;
    if (!hp__cu_flash_ok(a) || !grid_of(a->t, a->h, a->b, &g) || a->s < 1)
        return (int)cudaErrorInvalidConfiguration;
    typedef const __nv_bfloat16 *cb;
    if (a->d == 64)
        flash_fwd_k<64>
            <<<g, NT, fwd_smem(64), s>>>(*a, (__nv_bfloat16 *)out, lse, (cb)q, (cb)k, (cb)v);
    else
        flash_fwd_k<128>
            <<<g, NT, fwd_smem(128), s>>>(*a, (__nv_bfloat16 *)out, lse, (cb)q, (cb)k, (cb)v);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_flash_backward(cudaStream_t s, const hp__cu_attn *a, void *gq, void *gk,
                                     void *gv, const void *gout, const void *q, const void *k,
                                     const void *v, const void *out, const float *lse,
                                     float *delta) {
    dim3 gq_grid, gkv_grid;
    if (!hp__cu_flash_ok(a) || !grid_of(a->t, a->h, a->b, &gq_grid) ||
        !grid_of(a->s, a->hkv, a->b, &gkv_grid))
        return (int)cudaErrorInvalidConfiguration;
    typedef const __nv_bfloat16 *cb;
    typedef __nv_bfloat16 *bp;
    int64_t rows = a->b * a->h * a->t;
    unsigned blocks = (unsigned)((rows + 7) / 8 < 65535 * 8 ? (rows + 7) / 8 : 65535 * 8);
    flash_delta_k<<<blocks, 256, 0, s>>>(delta, (cb)gout, (cb)out, rows, a->dv);
    if (a->d == 64) {
        flash_bwd_kv_k<64><<<gkv_grid, NT, kv_smem(64), s>>>(*a, (bp)gk, (bp)gv, (cb)gout, (cb)q,
                                                             (cb)k, (cb)v, lse, delta);
        flash_bwd_q_k<64><<<gq_grid, NT, fwd_smem(64), s>>>(*a, (bp)gq, (cb)gout, (cb)q, (cb)k,
                                                            (cb)v, lse, delta);
    } else {
        flash_bwd_kv_k<128><<<gkv_grid, NT, kv_smem(128), s>>>(*a, (bp)gk, (bp)gv, (cb)gout, (cb)q,
                                                               (cb)k, (cb)v, lse, delta);
        flash_bwd_q_k<128><<<gq_grid, NT, fwd_smem(128), s>>>(*a, (bp)gq, (cb)gout, (cb)q, (cb)k,
                                                              (cb)v, lse, delta);
    }
    return HP__CU_LAUNCHED();
}
