/* worker/cuda/k_attention.cu — fused scaled dot-product attention, forward and backward,
 * FlashAttention-style: no [T, S] matrix is ever built. Grouped-query heads (query head h reads
 * kv head h / (H / Hkv)), optional causal mask (key s hidden from query t when s > t).
 *
 * Forward: a block per (batch, head, BQ queries), a thread per query row; key/value tiles of
 * BK rows staged in shared memory; per tile the scores of the row, the tile max, one rescale
 * of the running sum and output accumulator (online softmax). lse = m + log(l).
 * Backward (with delta = rowsum(g_out ∘ out), so `out` must be the forward's output):
 *   gq: the forward's layout, recomputing p = exp(scale·q·k − lse) per key;
 *   gk, gv: a block per (batch, kv head, BQ keys), a thread per key row, walking every query
 *           head of the group and every visible query in tiles staged in shared memory.
 * Each output element is summed by one thread in a fixed order: deterministic, no atomics.
 * Simple first (a row per thread, rows in local memory); the head dim is at most
 * HP__CU_ATTN_MAX_D. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

#define MAXD HP__CU_ATTN_MAX_D
#define BQ   64 /* query rows (forward, gq) or key rows (gk, gv) per block: one per thread */
#define BK   16 /* key (forward, gq) or query (gk, gv) rows per shared-memory tile */

/* Row (b, h, t) of an operand laid out as l. */
__device__ __forceinline__ float *row(const float *base, hp_attn_lay l, int64_t b, int64_t h,
                                      int64_t t) {
    return (float *)base + b * l.sb + h * l.sh + t * l.st;
}

/* Rows [r0, r0 + n) of w floats, ld apart from rows0, into the block's s[n][w]. */
__device__ __forceinline__ void load_tile(float *s, const float *rows0, int64_t ld, int64_t r0,
                                          int n, int64_t w) {
    for (int64_t i = threadIdx.x; i < (int64_t)n * w; i += blockDim.x)
        s[i] = rows0[(r0 + i / w) * ld + i % w];
}

/* ---- forward -------------------------------------------------------------------------------- */

__global__ void attn_fwd_k(hp__cu_attn a, float *out, float *lse, const float *q, const float *k,
                           const float *v) {
    extern __shared__ float sm[];
    float *ks = sm, *vs = sm + BK * a.d;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)blockIdx.x * BQ;
    int64_t t = t0 + threadIdx.x, hk = h / (a.h / a.hkv);
    bool live = t < a.t;
    const float *qr = row(q, a.l.q, b, h, live ? t : 0);
    const float *kb = row(k, a.l.k, b, hk, 0), *vb = row(v, a.l.v, b, hk, 0);
    float qv[MAXD], acc[MAXD];
    for (int c = 0; c < a.d; c++) qv[c] = live ? qr[c] : 0.0f;
    for (int c = 0; c < a.dv; c++) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int64_t t_last = t0 + BQ - 1 < a.t - 1 ? t0 + BQ - 1 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    for (int64_t s0 = 0; s0 < kend; s0 += BK) {
        int nk = kend - s0 < BK ? (int)(kend - s0) : BK;
        load_tile(ks, kb, a.l.k.st, s0, nk, a.d);
        load_tile(vs, vb, a.l.v.st, s0, nk, a.dv);
        __syncthreads();
        if (live) {
            float sc[BK];
            float tm = -INFINITY;
            int vis = nk;
            if (a.causal && s0 + nk - 1 > t) vis = t - s0 + 1 > 0 ? (int)(t - s0 + 1) : 0;
            for (int j = 0; j < vis; j++) {
                float dot = 0.0f;
                for (int c = 0; c < a.d; c++) dot += qv[c] * ks[j * a.d + c];
                sc[j] = a.scale * dot;
                tm = fmaxf(tm, sc[j]);
            }
            if (vis > 0) {
                float mn = fmaxf(m, tm);
                float corr = expf(m - mn); /* m = -inf at the start: 0 */
                l *= corr;
                for (int c = 0; c < a.dv; c++) acc[c] *= corr;
                for (int j = 0; j < vis; j++) {
                    float p = expf(sc[j] - mn);
                    l += p;
                    for (int c = 0; c < a.dv; c++) acc[c] += p * vs[j * a.dv + c];
                }
                m = mn;
            }
        }
        __syncthreads();
    }
    if (live) {
        float *orow = row(out, a.l.o, b, h, t);
        float inv = 1.0f / l;
        for (int c = 0; c < a.dv; c++) orow[c] = acc[c] * inv;
        lse[(b * a.h + h) * a.t + t] = m + logf(l);
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

__global__ void attn_delta_k(hp__cu_attn a, float *delta, const float *gout, const float *out) {
    HP__CU_FOR(r, a.b * a.h * a.t) {
        int64_t t = r % a.t, h = r / a.t % a.h, b = r / a.t / a.h;
        const float *g = row(gout, a.l.go, b, h, t), *o = row(out, a.l.o, b, h, t);
        double acc = 0;
        for (int64_t c = 0; c < a.dv; c++) acc += (double)g[c] * (double)o[c];
        delta[r] = (float)acc;
    }
}

__global__ void attn_gq_k(hp__cu_attn a, float *gq, const float *gout, const float *q,
                          const float *k, const float *v, const float *lse, const float *delta) {
    extern __shared__ float sm[];
    float *ks = sm, *vs = sm + BK * a.d;
    int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)blockIdx.x * BQ;
    int64_t t = t0 + threadIdx.x, hk = h / (a.h / a.hkv);
    bool live = t < a.t;
    int64_t r = (b * a.h + h) * a.t + (live ? t : 0); /* lse's and delta's */
    const float *qr = row(q, a.l.q, b, h, live ? t : 0),
                *gr = row(gout, a.l.go, b, h, live ? t : 0);
    const float *kb = row(k, a.l.k, b, hk, 0), *vb = row(v, a.l.v, b, hk, 0);
    float qv[MAXD], go[MAXD], dq[MAXD];
    for (int c = 0; c < a.d; c++) {
        qv[c] = live ? qr[c] : 0.0f;
        dq[c] = 0.0f;
    }
    for (int c = 0; c < a.dv; c++) go[c] = live ? gr[c] : 0.0f;
    float ls = live ? lse[r] : 0.0f, dl = live ? delta[r] : 0.0f;
    int64_t t_last = t0 + BQ - 1 < a.t - 1 ? t0 + BQ - 1 : a.t - 1;
    int64_t kend = a.causal ? (t_last + 1 < a.s ? t_last + 1 : a.s) : a.s;
    for (int64_t s0 = 0; s0 < kend; s0 += BK) {
        int nk = kend - s0 < BK ? (int)(kend - s0) : BK;
        load_tile(ks, kb, a.l.k.st, s0, nk, a.d);
        load_tile(vs, vb, a.l.v.st, s0, nk, a.dv);
        __syncthreads();
        if (live) {
            int vis = nk;
            if (a.causal && s0 + nk - 1 > t) vis = t - s0 + 1 > 0 ? (int)(t - s0 + 1) : 0;
            for (int j = 0; j < vis; j++) {
                float dot = 0.0f, dp = 0.0f;
                for (int c = 0; c < a.d; c++) dot += qv[c] * ks[j * a.d + c];
                for (int c = 0; c < a.dv; c++) dp += go[c] * vs[j * a.dv + c];
                float p = expf(a.scale * dot - ls);
                float ds = p * (dp - dl);
                for (int c = 0; c < a.d; c++) dq[c] += ds * ks[j * a.d + c];
            }
        }
        __syncthreads();
    }
    if (live) {
        float *gqr = row(gq, a.l.gq, b, h, t);
        for (int c = 0; c < a.d; c++) gqr[c] = dq[c] * a.scale;
    }
}

__global__ void attn_gkv_k(hp__cu_attn a, float *gk, float *gv, const float *gout, const float *q,
                           const float *k, const float *v, const float *lse, const float *delta) {
    extern __shared__ float sm[];
    float *qs = sm, *gs = sm + BK * a.d, *ls = gs + BK * a.dv, *ds_ = ls + BK;
    int64_t b = blockIdx.z, hk = blockIdx.y, s_0 = (int64_t)blockIdx.x * BQ;
    int64_t s = s_0 + threadIdx.x, group = a.h / a.hkv;
    bool live = s < a.s;
    const float *kr = row(k, a.l.k, b, hk, live ? s : 0), *vr = row(v, a.l.v, b, hk, live ? s : 0);
    float kv[MAXD], vv[MAXD], dk[MAXD], dv[MAXD];
    for (int c = 0; c < a.d; c++) {
        kv[c] = live ? kr[c] : 0.0f;
        dk[c] = 0.0f;
    }
    for (int c = 0; c < a.dv; c++) {
        vv[c] = live ? vr[c] : 0.0f;
        dv[c] = 0.0f;
    }
    /* causal: queries before the block's first key see none of its keys */
    int64_t tbeg = a.causal ? s_0 : 0;
    for (int64_t g = 0; g < group; g++) {
        int64_t h = hk * group + g;
        int64_t rbase = (b * a.h + h) * a.t;
        for (int64_t q0 = tbeg; q0 < a.t; q0 += BK) {
            int nq = a.t - q0 < BK ? (int)(a.t - q0) : BK;
            load_tile(qs, row(q, a.l.q, b, h, 0), a.l.q.st, q0, nq, a.d);
            load_tile(gs, row(gout, a.l.go, b, h, 0), a.l.go.st, q0, nq, a.dv);
            for (int i = threadIdx.x; i < nq; i += blockDim.x) {
                ls[i] = lse[rbase + q0 + i];
                ds_[i] = delta[rbase + q0 + i];
            }
            __syncthreads();
            if (live) {
                for (int j = 0; j < nq; j++) {
                    if (a.causal && s > q0 + j) continue;
                    float dot = 0.0f, dp = 0.0f;
                    for (int c = 0; c < a.d; c++) dot += qs[j * a.d + c] * kv[c];
                    for (int c = 0; c < a.dv; c++) dp += gs[j * a.dv + c] * vv[c];
                    float p = expf(a.scale * dot - ls[j]);
                    float dsc = p * (dp - ds_[j]);
                    for (int c = 0; c < a.dv; c++) dv[c] += p * gs[j * a.dv + c];
                    for (int c = 0; c < a.d; c++) dk[c] += dsc * qs[j * a.d + c];
                }
            }
            __syncthreads();
        }
    }
    if (live) {
        float *gkr = row(gk, a.l.gk, b, hk, s), *gvr = row(gv, a.l.gv, b, hk, s);
        for (int c = 0; c < a.d; c++) gkr[c] = dk[c] * a.scale;
        for (int c = 0; c < a.dv; c++) gvr[c] = dv[c];
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

static int grid_of(int64_t rows, int64_t heads, int64_t batch, dim3 *g) {
    int64_t x = (rows + BQ - 1) / BQ;
    if (x > 0x7fffffff || heads > 65535 || batch > 65535) return 0;
    *g = dim3((unsigned)x, (unsigned)heads, (unsigned)batch);
    return 1;
}

extern "C" int hp__cu_attention(cudaStream_t s, const hp__cu_attn *a, float *out, float *lse,
                                const float *q, const float *k, const float *v) {
    dim3 g;
    if (a->b * a->h * a->t == 0) return 0;
    if (a->d > MAXD || a->dv > MAXD || !grid_of(a->t, a->h, a->b, &g))
        return (int)cudaErrorInvalidConfiguration;
    size_t smem = (size_t)BK * (size_t)(a->d + a->dv) * sizeof(float);
    attn_fwd_k<<<g, BQ, smem, s>>>(*a, out, lse, q, k, v);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_attention_backward(cudaStream_t s, const hp__cu_attn *a, float *gq, float *gk,
                                         float *gv, const float *gout, const float *q,
                                         const float *k, const float *v, const float *out,
                                         const float *lse, float *delta) {
    dim3 gq_grid, gkv_grid;
    if (a->d > MAXD || a->dv > MAXD || !grid_of(a->t, a->h, a->b, &gq_grid) ||
        !grid_of(a->s, a->hkv, a->b, &gkv_grid))
        return (int)cudaErrorInvalidConfiguration;
    int64_t rows = a->b * a->h * a->t;
    if (rows > 0) {
        attn_delta_k<<<hp__cu_blocks(rows), HP__CU_THREADS, 0, s>>>(*a, delta, gout, out);
        size_t smem = (size_t)BK * (size_t)(a->d + a->dv) * sizeof(float);
        attn_gq_k<<<gq_grid, BQ, smem, s>>>(*a, gq, gout, q, k, v, lse, delta);
    }
    if (a->b * a->hkv * a->s > 0) {
        size_t smem = ((size_t)BK * (size_t)(a->d + a->dv) + 2 * BK) * sizeof(float);
        attn_gkv_k<<<gkv_grid, BQ, smem, s>>>(*a, gk, gv, gout, q, k, v, lse, delta);
    }
    return HP__CU_LAUNCHED();
}
