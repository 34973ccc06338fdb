/* worker/cuda/k_flash.cu — fused causal attention on the tensor cores, bf16 q/k/v/out with f32
 * softmax statistics and accumulators (FlashAttention-2's algorithm; mma.sync m16n8k16 through
 * k_mma.cuh). Head dims 16, 32, 48, 64, 80, 96 and 128 (d == dv; FLASH_DIMS), grouped-query heads
 * (query head h reads kv head h / (H / Hkv)), causal or not, any T and S (rows past the end read
 * zeros and are not stored). The T x S matrix never exists. Each operand is [B, H, T, D] or
 * [B, T, H, D] (hp_attn_lay: the lowering folds the heads' transposes into the call, and a row is
 * D contiguous elements either way; lse and delta are [B, H, T]).
 *
 * Forward: a block of 4 warps per (batch, head, 128 queries), each warp 32 query rows (two
 * 16-row atoms sharing every K and V fragment; 64 queries and 16 rows with HP_CUDA_FLASH_ROWS=16);
 * K and V tiles of 64 keys (32 at D = 128 with 32 rows: fwd_kn) in shared memory (rows padded by
 * 16 bytes: ldmatrix without bank conflicts); S = Q·Kᵀ in registers, the online softmax in the log2
 * domain, P rounded to bf16 and fed back as the A operand of P·V. lse = ln Σ exp(scale·s), f32.
 * Every kernel double-buffers its streamed tiles: the next tile's cp.async copies are in flight
 * while the tensor cores work on this one (k_mma.cuh; two stages, one commit group a tile).
 * Causal query blocks run longest first (the grid's first blocks take the last queries), so
 * the last wave is of short blocks.
 * Backward, deterministic (every output element is summed by one thread in a fixed order, no
 * atomics), with delta = rowsum(dO ∘ O):
 *   dK, dV: a block per (batch, kv head, 64 keys), each warp 16 keys, walking the group's
 *           query heads and every visible query in tiles of 16 or 32 (kv_qt): Sᵀ = K·Qᵀ and
 *           dPᵀ = V·dOᵀ recomputed, Pᵀ = exp(scale·Sᵀ − lse), dV += Pᵀ·dO,
 *           dSᵀ = Pᵀ ∘ (dPᵀ − delta), dK += dSᵀ·Q;
 *   dQ:     a block per (batch, head, 64 queries), key tiles of 32: dQ += dS·K.
 * (FlashAttention-2 sums dQ with atomics inside the dK/dV pass; recomputing S and dP in a
 * second pass costs two more products of seven and keeps the result bit-reproducible.)
 *
 * The entry (cuda_ops_nn.c) takes this path for bf16 operands of those head dims; f32 and other
 * head dims run k_attention.cu's kernels. */
#include "worker/cuda/k_mma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PAD   8 /* bf16 per shared-memory row beyond the head dim: 16 bytes */
#define NT    128
#define LOG2E 1.4426950408889634f
#define LN2   0.6931471805599453f

#define BQ 64 /* queries per forward and dQ block; keys per forward tile and dK/dV block */
#define KT 32 /* keys per dQ tile */
/* Queries per dK/dV tile: 32 where that costs no occupancy (ptxas, sm_90: D = 128 takes 238
 * registers against 230 at 16, two blocks of 128 threads a multiprocessor either way; D <= 32 stays
 * under 128), else 16 (at 32, D = 64 would need 158 and D = 96 218: a block less each). Each K
 * and V fragment a warp loads then serves twice the products, and a tile's barrier and copy
 * wait twice the queries. */
template <int D> constexpr int kv_qt() {
    return D == 128 || D <= 32 ? 32 : 16;
}

/* Rows [r0, r0 + R) of an [n][D] matrix whose rows start ld elements apart (ld a multiple of
 * 8: 16-byte aligned rows) into s[R][D + PAD], asynchronously (one hp__cp_async16 per 16
 * bytes; the caller commits and waits); rows past n are zeros. */
template <int D, int R>
__device__ __forceinline__ void load_rows(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t ld,
                                          int64_t r0, int64_t n) {
    constexpr int CH = D / 8;
    HP__UNROLL
    for (int i = threadIdx.x; i < R * CH; i += NT) {
        int r = i / CH, c = i % CH;
        hp__cp_async16(s + r * (D + PAD) + c * 8, r0 + r < n ? g + (r0 + r) * ld + c * 8 : nullptr,
                       g);
    }
}

/* Row (b, h, t) of an operand laid out as l (hp_attn_lay). */
__device__ __forceinline__ __nv_bfloat16 *row_at(const __nv_bfloat16 *base, hp_attn_lay l,
                                                 int64_t b, int64_t h, int64_t t) {
    return (__nv_bfloat16 *)base + b * l.sb + h * l.sh + t * l.st;
}

/* Key rows [s0, s0 + R) of K and of V into stage `stage` of a two-stage buffer (K at tile
 * 2·stage, V after it), committed as one group with any copies issued before. */
template <int D, int R>
__device__ __forceinline__ void load_kv_stage(__nv_bfloat16 *sm, int stage, const hp__cu_attn &a,
                                              const __nv_bfloat16 *kb, const __nv_bfloat16 *vb,
                                              int64_t s0) {
    constexpr int TILE = R * (D + PAD);
    __nv_bfloat16 *st = sm + stage * 2 * TILE;
    load_rows<D, R>(st, kb, a.l.k.st, s0, a.s);
    load_rows<D, R>(st + TILE, vb, a.l.v.st, s0, a.s);
    hp__cp_async_commit();
}

/* Waits for tile j of n (its group committed one iteration before the next one's): leaves the
 * next tile's group in flight when there is one. Then a barrier makes it the block's. */
__device__ __forceinline__ void tile_ready(int64_t j, int64_t n) {
    if (j + 1 < n)
        hp__cp_async_wait<1>();
    else
        hp__cp_async_wait<0>();
    __syncthreads();
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

/* MA 16-row atoms a warp, KN keys a tile: a block of 4 warps takes 64·MA queries. At MA = 2
 * (FlashAttention-2's 128-query blocks) every K and V fragment a warp loads from shared memory
 * serves two atoms, and each K/V tile read from global memory serves twice the queries. At MA = 1
 * a warp reads 62 bytes of K and V fragments per KFLOP, by estimate about what a multiprocessor's
 * shared memory delivers at the mma rate; at MA = 2 with Q read again each tile, 47 (D = 128, KN
 * = 32) or 39 (KN = 64). Q stays in shared memory at MA = 2 (at D = 128 its fragments beside two
 * atoms' accumulators would not fit the registers); at MA = 1 it is held in registers.
 * Unmeasured on a device yet: HP_CUDA_FLASH_ROWS=16 keeps MA = 1 for comparison. */
template <int D, int MA, int KN>
__global__ void __launch_bounds__(NT)
    flash_fwd_k(hp__cu_attn a, __nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                const __nv_bfloat16 *k, const __nv_bfloat16 *v) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8, TILE = KN * LD, QB = BQ * MA;
    constexpr bool QREG = MA == 1;
    static_assert(!QREG || KN == BQ, "at MA 1, Q passes through a K tile of BQ rows");
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)fl_sm;     /* stage i: K at 2i tiles, V at 2i + 1 */
    __nv_bfloat16 *sq = sm + (QREG ? 2 : 4) * TILE; /* Q: through stage 1 (MA 1), or after it */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * QB;
    int64_t hk = h / (a.h / a.hkv);
    const __nv_bfloat16 *qb = row_at(q, a.l.q, b, h, 0);
    const __nv_bfloat16 *kb = row_at(k, a.l.k, b, hk, 0), *vb = row_at(v, a.l.v, b, hk, 0);
    int64_t t_last = t0 + QB - 1 < a.t - 1 ? t0 + QB - 1 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    int64_t tiles = (kend + KN - 1) / KN;
    int64_t w0 = t0 + warp * 16 * MA; /* the warp's first query */

    load_rows<D, QB>(sq, qb, a.l.q.st, t0, a.t);
    load_kv_stage<D, KN>(sm, 0, a, kb, vb, 0);
    hp__cp_async_wait<0>();
    __syncthreads();
    [[maybe_unused]] uint32_t qa[QREG ? KC : 1][4];
    if constexpr (QREG) {
        HP__UNROLL
        for (int kc = 0; kc < KC; kc++) hp__ldsm_x4(qa[kc], a_addr<LD>(sq, warp * 16, kc * 16));
        __syncthreads(); /* Q's rows are stage 1's K tile */
    }

    float o[MA][NO][4];
    float m[MA][2], l[MA][2];
    HP__UNROLL
    for (int ma = 0; ma < MA; ma++) {
        HP__UNROLL
        for (int n = 0; n < NO; n++) o[ma][n][0] = o[ma][n][1] = o[ma][n][2] = o[ma][n][3] = 0.0f;
        m[ma][0] = m[ma][1] = -INFINITY;
        l[ma][0] = l[ma][1] = 0.0f;
    }
    const float c2 = a.scale * LOG2E;
    for (int64_t j = 0; j < tiles; j++) {
        int64_t s0 = j * KN;
        if (j + 1 < tiles) /* the next K and V tiles into the other stage */
            load_kv_stage<D, KN>(sm, (int)((j + 1) & 1), a, kb, vb, s0 + KN);
        tile_ready(j, tiles);
        const __nv_bfloat16 *ks = sm + (j & 1) * 2 * TILE, *vs = ks + TILE;
        float sc[MA][KN / 8][4];
        HP__UNROLL
        for (int ma = 0; ma < MA; ma++) {
            HP__UNROLL
            for (int n = 0; n < KN / 8; n++)
                sc[ma][n][0] = sc[ma][n][1] = sc[ma][n][2] = sc[ma][n][3] = 0.0f;
        }
        HP__UNROLL
        for (int kc = 0; kc < KC; kc++) {
            uint32_t qf[MA][4];
            HP__UNROLL
            for (int ma = 0; ma < MA; ma++) {
                if constexpr (QREG) {
                    HP__UNROLL
                    for (int e = 0; e < 4; e++) qf[ma][e] = qa[kc][e];
                } else {
                    hp__ldsm_x4(qf[ma], a_addr<LD>(sq, warp * 16 * MA + ma * 16, kc * 16));
                }
            }
            HP__UNROLL
            for (int np = 0; np < KN / 16; np++) {
                uint32_t bf[4];
                hp__ldsm_x4(bf, b_addr<LD>(ks, np * 16, kc * 16));
                HP__UNROLL
                for (int ma = 0; ma < MA; ma++) {
                    hp__mma_bf16(sc[ma][2 * np], qf[ma], bf[0], bf[1]);
                    hp__mma_bf16(sc[ma][2 * np + 1], qf[ma], bf[2], bf[3]);
                }
            }
        }
        uint32_t pa[MA][KN / 16][4]; /* P in bf16, the A fragments of P·V */
        HP__UNROLL
        for (int ma = 0; ma < MA; ma++) {
            bool mask = s0 + KN > a.s || (a.causal && s0 + KN - 1 > w0 + ma * 16);
            float mx[2] = {-INFINITY, -INFINITY};
            HP__UNROLL
            for (int n = 0; n < KN / 8; n++) {
                HP__UNROLL
                for (int e = 0; e < 4; e++) {
                    int r = e / 2;
                    int64_t key = s0 + n * 8 + 2 * qd + (e % 2);
                    float x = sc[ma][n][e] * c2;
                    if (mask && (key >= a.s || (a.causal && key > w0 + ma * 16 + g + 8 * r)))
                        x = -INFINITY;
                    sc[ma][n][e] = x;
                    mx[r] = fmaxf(mx[r], x);
                }
            }
            float base[2], corr[2], ls[2] = {0.0f, 0.0f};
            HP__UNROLL
            for (int r = 0; r < 2; r++) {
                float mn = fmaxf(m[ma][r], quad_max(mx[r]));
                base[r] = mn == -INFINITY ? 0.0f : mn; /* a row that sees no key yet: p = 0 */
                corr[r] = exp2f(m[ma][r] - base[r]);
                m[ma][r] = mn;
            }
            HP__UNROLL
            for (int n = 0; n < KN / 8; n++) {
                HP__UNROLL
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(sc[ma][n][e] - base[e / 2]);
                    sc[ma][n][e] = p;
                    ls[e / 2] += p;
                }
            }
            HP__UNROLL
            for (int r = 0; r < 2; r++) l[ma][r] = l[ma][r] * corr[r] + ls[r];
            HP__UNROLL
            for (int n = 0; n < NO; n++) {
                o[ma][n][0] *= corr[0];
                o[ma][n][1] *= corr[0];
                o[ma][n][2] *= corr[1];
                o[ma][n][3] *= corr[1];
            }
            HP__UNROLL
            for (int kc = 0; kc < KN / 16; kc++)
                a_of_c(pa[ma][kc], sc[ma][2 * kc], sc[ma][2 * kc + 1]);
        }
        HP__UNROLL
        for (int kc = 0; kc < KN / 16; kc++) { /* O += P·V: each V fragment serves every atom */
            HP__UNROLL
            for (int n = 0; n < D / 16; n++) {
                uint32_t bf[4];
                hp__ldsm_x4_t(bf, bt_addr<LD>(vs, kc * 16, n * 16));
                HP__UNROLL
                for (int ma = 0; ma < MA; ma++) {
                    hp__mma_bf16(o[ma][2 * n], pa[ma][kc], bf[0], bf[1]);
                    hp__mma_bf16(o[ma][2 * n + 1], pa[ma][kc], bf[2], bf[3]);
                }
            }
        }
        __syncthreads(); /* this stage's readers are done before the next prefetch lands in it */
    }
    HP__UNROLL
    for (int ma = 0; ma < MA; ma++) {
        HP__UNROLL
        for (int r = 0; r < 2; r++) {
            float sum = quad_sum(l[ma][r]);
            int64_t row = w0 + ma * 16 + g + 8 * r;
            if (row >= a.t) continue;
            float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            __nv_bfloat16 *orow = row_at(out, a.l.o, b, h, row);
            HP__UNROLL
            for (int n = 0; n < NO; n++)
                store_pair(orow + n * 8 + 2 * qd, o[ma][n][2 * r] * inv, o[ma][n][2 * r + 1] * inv);
            if (qd == 0)
                lse[(b * a.h + h) * a.t + row] =
                    sum > 0.0f ? (m[ma][r] + log2f(sum)) * LN2 : -INFINITY;
        }
    }
}

/* ---- backward: delta ------------------------------------------------------------------------ */

/* delta[r] = Σ_c gout[r, c] · out[r, c] (rows r in [B, H, T] order), a warp per row. */
__global__ void flash_delta_k(hp__cu_attn a, float *delta, const __nv_bfloat16 *gout,
                              const __nv_bfloat16 *out) {
    int lane = threadIdx.x % 32;
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), rows = a.b * a.h * a.t, d = a.dv;
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
         r += warps) {
        int64_t t = r % a.t, h = r / a.t % a.h, b = r / a.t / a.h;
        const __nv_bfloat16 *g = row_at(gout, a.l.go, b, h, t), *o = row_at(out, a.l.o, b, h, t);
        float acc = 0.0f;
        for (int64_t c = lane; c < d; c += 32)
            acc += __bfloat162float(g[c]) * __bfloat162float(o[c]);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) delta[r] = acc;
    }
}

/* ---- backward: dK, dV ----------------------------------------------------------------------- */

/* One dK/dV tile's stage: Q and dO rows [q0, q0 + QT) of batch b, query head h, and their lse
 * and delta (zeros past T), asynchronously. */
template <int D, int QT>
__device__ __forceinline__ void kv_stage_load(unsigned char *st, const hp__cu_attn &a,
                                              const __nv_bfloat16 *q, const __nv_bfloat16 *gout,
                                              const float *lse, const float *delta, int64_t b,
                                              int64_t h, int64_t q0) {
    constexpr int TILE = QT * (D + PAD);
    __nv_bfloat16 *qs = (__nv_bfloat16 *)st, *dos = qs + TILE;
    float *ls = (float *)(dos + TILE), *dl = ls + QT;
    int64_t rb = (b * a.h + h) * a.t; /* lse's and delta's */
    load_rows<D, QT>(qs, row_at(q, a.l.q, b, h, 0), a.l.q.st, q0, a.t);
    load_rows<D, QT>(dos, row_at(gout, a.l.go, b, h, 0), a.l.go.st, q0, a.t);
    if (threadIdx.x < QT) {
        bool in = q0 + threadIdx.x < a.t;
        hp__cp_async4(ls + threadIdx.x, in ? lse + rb + q0 + threadIdx.x : nullptr, lse);
        hp__cp_async4(dl + threadIdx.x, in ? delta + rb + q0 + threadIdx.x : nullptr, delta);
    }
}

template <int D, int QT> __host__ __device__ constexpr size_t kv_stage_bytes() {
    return (size_t)2 * QT * (D + PAD) * sizeof(__nv_bfloat16) + 2 * QT * sizeof(float);
}

/* QT queries a tile (kv_qt). */
template <int D, int QT>
__global__ void __launch_bounds__(NT)
    flash_bwd_kv_k(hp__cu_attn a, __nv_bfloat16 *gk, __nv_bfloat16 *gv, const __nv_bfloat16 *gout,
                   const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                   const float *lse, const float *delta) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8, TILE = QT * LD, NQ = QT / 8;
    constexpr size_t STAGE = kv_stage_bytes<D, QT>();
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)fl_sm, *vs = ks + BQ * LD;
    unsigned char *stages = (unsigned char *)(vs + BQ * LD); /* two stages */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, hk = blockIdx.y, s_0 = (int64_t)blockIdx.x * BQ;
    int64_t group = a.h / a.hkv;
    const __nv_bfloat16 *kb = row_at(k, a.l.k, b, hk, 0), *vb = row_at(v, a.l.v, b, hk, 0);
    /* the tiles: each query head of the group, its visible queries in steps of QT (causal: a
     * query before the block's first key sees none of its keys) */
    int64_t qbeg = a.causal ? (s_0 / QT) * QT : 0;
    int64_t nq = a.t > qbeg ? (a.t - qbeg + QT - 1) / QT : 0, tiles = group * nq;
    load_rows<D, BQ>(ks, kb, a.l.k.st, s_0, a.s);
    load_rows<D, BQ>(vs, vb, a.l.v.st, s_0, a.s);
    if (tiles > 0) kv_stage_load<D, QT>(stages, a, q, gout, lse, delta, b, hk * group, qbeg);
    hp__cp_async_commit();

    float dk[NO][4], dv[NO][4];
    HP__UNROLL
    for (int n = 0; n < NO; n++) {
        HP__UNROLL
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    }
    const float c2 = a.scale * LOG2E;
    int64_t key[2] = {s_0 + warp * 16 + g, s_0 + warp * 16 + g + 8};
    for (int64_t i = 0; i < tiles; i++) {
        if (i + 1 < tiles) {
            int64_t gh = (i + 1) / nq, q0 = qbeg + (i + 1) % nq * QT;
            kv_stage_load<D, QT>(stages + ((i + 1) & 1) * STAGE, a, q, gout, lse, delta, b,
                                 hk * group + gh, q0);
            hp__cp_async_commit();
        }
        tile_ready(i, tiles);
        int64_t q0 = qbeg + i % nq * QT;
        const __nv_bfloat16 *qs = (const __nv_bfloat16 *)(stages + (i & 1) * STAGE);
        const __nv_bfloat16 *dos = qs + TILE;
        const float *ls_s = (const float *)(dos + TILE), *dl_s = ls_s + QT;
        float st[NQ][4], dpt[NQ][4]; /* Sᵀ and dPᵀ: this warp's 16 keys x QT queries */
        HP__UNROLL
        for (int n = 0; n < NQ; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.0f;
        }
        HP__UNROLL
        for (int kc = 0; kc < KC; kc++) {
            uint32_t ka[4], va[4];
            hp__ldsm_x4(ka, a_addr<LD>(ks, warp * 16, kc * 16));
            hp__ldsm_x4(va, a_addr<LD>(vs, warp * 16, kc * 16));
            HP__UNROLL
            for (int np = 0; np < NQ / 2; np++) {
                uint32_t qf[4], of[4];
                hp__ldsm_x4(qf, b_addr<LD>(qs, np * 16, kc * 16));
                hp__ldsm_x4(of, b_addr<LD>(dos, np * 16, kc * 16));
                hp__mma_bf16(st[2 * np], ka, qf[0], qf[1]);
                hp__mma_bf16(st[2 * np + 1], ka, qf[2], qf[3]);
                hp__mma_bf16(dpt[2 * np], va, of[0], of[1]);
                hp__mma_bf16(dpt[2 * np + 1], va, of[2], of[3]);
            }
        }
        HP__UNROLL
        for (int n = 0; n < NQ; n++) {
            HP__UNROLL
            for (int e = 0; e < 4; e++) {
                int col = n * 8 + 2 * qd + (e % 2);
                float ls = q0 + col < a.t ? ls_s[col] * LOG2E : INFINITY;
                float p = exp2f(st[n][e] * c2 - ls);
                if (a.causal && key[e / 2] > q0 + col) p = 0.0f;
                st[n][e] = p;
                dpt[n][e] = p * (dpt[n][e] - dl_s[col]);
            }
        }
        HP__UNROLL
        for (int kk = 0; kk < NQ / 2; kk++) {
            uint32_t pa[4], sa[4];
            a_of_c(pa, st[2 * kk], st[2 * kk + 1]);
            a_of_c(sa, dpt[2 * kk], dpt[2 * kk + 1]);
            mma_rows<D, LD>(dv, pa, dos, kk * 16); /* dV += Pᵀ·dO */
            mma_rows<D, LD>(dk, sa, qs, kk * 16);  /* dK += dSᵀ·Q */
        }
        __syncthreads(); /* this stage's readers are done before the next prefetch lands in it */
    }
    hp__cp_async_wait<0>(); /* no tile: K and V were never waited for */
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        if (key[r] >= a.s) continue;
        __nv_bfloat16 *gkr = row_at(gk, a.l.gk, b, hk, key[r]),
                      *gvr = row_at(gv, a.l.gv, b, hk, key[r]);
        HP__UNROLL
        for (int n = 0; n < NO; n++) {
            store_pair(gkr + n * 8 + 2 * qd, dk[n][2 * r] * a.scale, dk[n][2 * r + 1] * a.scale);
            store_pair(gvr + n * 8 + 2 * qd, dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* ---- backward: dQ --------------------------------------------------------------------------- */

template <int D>
__global__ void __launch_bounds__(NT)
    flash_bwd_q_k(hp__cu_attn a, __nv_bfloat16 *gq, const __nv_bfloat16 *gout,
                  const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                  const float *lse, const float *delta) {
    constexpr int LD = D + PAD, KC = D / 16, NO = D / 8, TILE = KT * LD;
    extern __shared__ uint4 fl_sm[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)fl_sm; /* stage i: K at 2i tiles, V at 2i + 1 */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BQ;
    int64_t hk = h / (a.h / a.hkv), rb = (b * a.h + h) * a.t; /* rb: lse's and delta's */
    const __nv_bfloat16 *kb = row_at(k, a.l.k, b, hk, 0), *vb = row_at(v, a.l.v, b, hk, 0);
    int64_t t_last = t0 + BQ - 1 < a.t - 1 ? t0 + BQ - 1 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    int64_t tiles = (kend + KT - 1) / KT;

    /* Q and dO into registers through the four tiles (BQ = 2 KT rows each) */
    load_rows<D, BQ>(sm, row_at(q, a.l.q, b, h, 0), a.l.q.st, t0, a.t);
    load_rows<D, BQ>(sm + 2 * TILE, row_at(gout, a.l.go, b, h, 0), a.l.go.st, t0, a.t);
    hp__cp_async_commit();
    hp__cp_async_wait<0>();
    __syncthreads();
    uint32_t qa[KC][4], oa[KC][4];
    HP__UNROLL
    for (int kc = 0; kc < KC; kc++) {
        hp__ldsm_x4(qa[kc], a_addr<LD>(sm, warp * 16, kc * 16));
        hp__ldsm_x4(oa[kc], a_addr<LD>(sm + 2 * TILE, warp * 16, kc * 16));
    }
    __syncthreads();
    load_kv_stage<D, KT>(sm, 0, a, kb, vb, 0);

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
    for (int64_t j = 0; j < tiles; j++) {
        int64_t s0 = j * KT;
        if (j + 1 < tiles) load_kv_stage<D, KT>(sm, (int)((j + 1) & 1), a, kb, vb, s0 + KT);
        tile_ready(j, tiles);
        const __nv_bfloat16 *ks = sm + (j & 1) * 2 * TILE, *vs = ks + TILE;
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
        __syncthreads(); /* this stage's readers are done before the next prefetch lands in it */
    }
    HP__UNROLL
    for (int r = 0; r < 2; r++) {
        if (row[r] >= a.t) continue;
        __nv_bfloat16 *qrow = row_at(gq, a.l.gq, b, h, row[r]);
        HP__UNROLL
        for (int n = 0; n < NO; n++)
            store_pair(qrow + n * 8 + 2 * qd, dq[n][2 * r] * a.scale, dq[n][2 * r + 1] * a.scale);
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

/* Keys per forward tile at MA 2: 32 at D = 96 and 128, where the scores of two atoms over 64
 * keys would spill registers (ptxas, sm_90: D = 96 at 255 registers and 56 bytes of spills once
 * the operands took row strides), else 64; BQ at MA 1. */
template <int D, int MA> constexpr int fwd_kn() {
    return MA == 2 && D >= 96 ? 32 : BQ;
}
template <int D, int MA> constexpr size_t fwd_smem() { /* two stages of K and V; Q at MA 2 */
    return (size_t)(4 * fwd_kn<D, MA>() + (MA == 1 ? 0 : BQ * MA)) * (D + PAD) *
           sizeof(__nv_bfloat16);
}
template <int D> constexpr size_t dq_smem() { /* two stages of K and V; Q and dO before them */
    return (size_t)4 * KT * (D + PAD) * sizeof(__nv_bfloat16);
}
template <int D, int QT> constexpr size_t kv_smem() { /* K, V; two stages of Q, dO, lse, delta */
    return (size_t)2 * BQ * (D + PAD) * sizeof(__nv_bfloat16) + 2 * kv_stage_bytes<D, QT>();
}

/* A kernel's launch with more than the default 48 KiB of dynamic shared memory raises its
 * limit first (every sm_80+ device has at least 99 KiB). */
template <class K> static int smem_limit(K *kernel, size_t bytes) {
    if (bytes <= ((size_t)48 << 10)) return 0;
    return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)bytes);
}

static int grid_of(int64_t rows, int64_t heads, int64_t batch, dim3 *g, int64_t per = BQ) {
    int64_t x = (rows + per - 1) / per;
    if (x < 1 || x > 0x7fffffff || heads > 65535 || batch > 65535) return 0;
    *g = dim3((unsigned)x, (unsigned)heads, (unsigned)batch);
    return 1;
}

/* The head dims the kernels are built for (multiples of 16: the mma's k step). */
#define FLASH_DIMS(X) X(16) X(32) X(48) X(64) X(80) X(96) X(128)

extern "C" int hp__cu_flash_ok(const hp__cu_attn *a) {
    bool dim = false;
#define IS_DIM(D) dim = dim || a->d == D;
    FLASH_DIMS(IS_DIM)
#undef IS_DIM
    return dim && a->dv == a->d && a->hkv > 0 && a->h % a->hkv == 0;
}

typedef const __nv_bfloat16 *cbf;
typedef __nv_bfloat16 *bfp;

/* Query rows a forward warp takes: 32 (two atoms; FlashAttention-2's 128-query blocks) by
 * default, 16 where $HP_CUDA_FLASH_ROWS=16 (the kernel before, for comparison; bench/gpu). */
static int fwd_atoms() {
    const char *v = getenv("HP_CUDA_FLASH_ROWS");
    return v && !strcmp(v, "16") ? 1 : 2;
}

template <int D, int MA>
static int flash_fwd(cudaStream_t s, const hp__cu_attn *a, void *out, float *lse, const void *q,
                     const void *k, const void *v) {
    constexpr size_t SM = fwd_smem<D, MA>();
    dim3 g;
    if (!grid_of(a->t, a->h, a->b, &g, (int64_t)BQ * MA)) return (int)cudaErrorInvalidConfiguration;
    constexpr int KN = fwd_kn<D, MA>();
    int e = smem_limit(flash_fwd_k<D, MA, KN>, SM);
    if (e) return e;
    flash_fwd_k<D, MA, KN><<<g, NT, SM, s>>>(*a, (bfp)out, lse, (cbf)q, (cbf)k, (cbf)v);
    return HP__CU_LAUNCHED();
}

template <int D>
static int flash_bwd(cudaStream_t s, dim3 gq, dim3 gkv, const hp__cu_attn *a, void *dq, void *dk,
                     void *dv, const void *gout, const void *q, const void *k, const void *v,
                     const float *lse, const float *delta) {
    constexpr int QT = kv_qt<D>();
    constexpr size_t SKV = kv_smem<D, QT>(), SQ = dq_smem<D>();
    int e = smem_limit(flash_bwd_kv_k<D, QT>, SKV);
    if (!e) e = smem_limit(flash_bwd_q_k<D>, SQ);
    if (e) return e;
    flash_bwd_kv_k<D, QT>
        <<<gkv, NT, SKV, s>>>(*a, (bfp)dk, (bfp)dv, (cbf)gout, (cbf)q, (cbf)k, (cbf)v, lse, delta);
    if ((e = HP__CU_LAUNCHED())) return e;
    flash_bwd_q_k<D><<<gq, NT, SQ, s>>>(*a, (bfp)dq, (cbf)gout, (cbf)q, (cbf)k, (cbf)v, lse, delta);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_flash(cudaStream_t s, const hp__cu_attn *a, void *out, float *lse,
                            const void *q, const void *k, const void *v) {
    dim3 g;
    if (!hp__cu_flash_ok(a) || !grid_of(a->t, a->h, a->b, &g) || a->s < 1)
        return (int)cudaErrorInvalidConfiguration;
    switch (a->d) {
#define FWD(D)                                                                                     \
    case D:                                                                                        \
        return fwd_atoms() == 2 ? flash_fwd<D, 2>(s, a, out, lse, q, k, v)                         \
                                : flash_fwd<D, 1>(s, a, out, lse, q, k, v);
        FLASH_DIMS(FWD)
#undef FWD
    }
    return (int)cudaErrorInvalidConfiguration;
}

extern "C" int hp__cu_flash_backward(cudaStream_t s, const hp__cu_attn *a, void *gq, void *gk,
                                     void *gv, const void *gout, const void *q, const void *k,
                                     const void *v, const void *out, const float *lse,
                                     float *delta) {
    dim3 gq_grid, gkv_grid;
    if (!hp__cu_flash_ok(a) || !grid_of(a->t, a->h, a->b, &gq_grid) ||
        !grid_of(a->s, a->hkv, a->b, &gkv_grid))
        return (int)cudaErrorInvalidConfiguration;
    int64_t rows = a->b * a->h * a->t;
    unsigned blocks = (unsigned)((rows + 7) / 8 < 65535 * 8 ? (rows + 7) / 8 : 65535 * 8);
    flash_delta_k<<<blocks, 256, 0, s>>>(*a, delta, (cbf)gout, (cbf)out);
    int e = HP__CU_LAUNCHED();
    if (e) return e;
    switch (a->d) {
#define BWD(D)                                                                                     \
    case D:                                                                                        \
        return flash_bwd<D>(s, gq_grid, gkv_grid, a, gq, gk, gv, gout, q, k, v, lse, delta);
        FLASH_DIMS(BWD)
#undef BWD
    }
    return (int)cudaErrorInvalidConfiguration;
}
