/* worker/cuda/k_optim.cu — the training loop's math on device buffers: AdamW with the scalars
 * of hp_adamw_step (worker/optim.c, the same float operations per element), sums of squares
 * into fixed per-block partials in double (combined in order on the host: the norm does not
 * depend on timing), scaling, and the kernel that records an injected fault (tests). */
#include "worker/cuda/k_common.cuh"

#include <math.h>

/* One element's AdamW: the float operations of hp_adamw_step, in its order. */
__device__ __forceinline__ void adamw_1(const hp__cu_adamw &k, float &p, float g, float &m,
                                        float &v) {
    float pi = p * k.decay;
    float gi = __fmul_rn(g, k.g_scale);
    float mi = fmaf(gi, k.omb1, m * k.b1);
    float vi = fmaf(k.omb2 * gi, gi, v * k.b2);
    float den = __fadd_rn(__fdiv_rn(sqrtf(vi), k.bc2_sqrt), k.eps);
    p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step, mi), den));
    m = mi;
    v = vi;
}

__global__ void adamw_k(hp__cu_adamw k, float *p, const float *g, float *m, float *v, uint16_t *pb,
                        int64_t n) {
    HP__CU_FOR(i, n) {
        adamw_1(k, p[i], g[i], m[i], v[i]);
        if (pb) pb[i] = (uint16_t)hp__bf16_bits(p[i]);
    }
}

/* Four elements a thread through 16-byte loads and stores (every pointer 16-byte aligned, the
 * bf16 copy 8-byte aligned; n4 = n / 4 groups): four streams read, three (four with the copy)
 * written, at the device's bandwidth. */
__global__ void adamw4_k(hp__cu_adamw k, float4 *p, const float4 *g, float4 *m, float4 *v,
                         uint2 *pb, int64_t n4) {
    HP__CU_FOR(i, n4) {
        float4 pi = p[i], gi = g[i], mi = m[i], vi = v[i];
        adamw_1(k, pi.x, gi.x, mi.x, vi.x);
        adamw_1(k, pi.y, gi.y, mi.y, vi.y);
        adamw_1(k, pi.z, gi.z, mi.z, vi.z);
        adamw_1(k, pi.w, gi.w, mi.w, vi.w);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (pb)
            pb[i] = make_uint2(hp__bf16_bits(pi.x) | hp__bf16_bits(pi.y) << 16,
                               hp__bf16_bits(pi.z) | hp__bf16_bits(pi.w) << 16);
    }
}

extern "C" int hp__cu_adamw_step(cudaStream_t s, const hp__cu_adamw *k, float *p, const float *g,
                                 float *m, float *v, uint16_t *pb, int64_t n) {
    if (n == 0) return 0;
    bool vec = hp__vec8_ok(p, g, m) && hp__vec8_ok(v, v, v) && ((uintptr_t)pb & 7) == 0;
    int64_t n4 = vec ? n / 4 : 0, done = 4 * n4;
    if (n4 > 0)
        adamw4_k<<<hp__cu_blocks(n4), HP__CU_THREADS, 0, s>>>(
            *k, (float4 *)p, (const float4 *)g, (float4 *)m, (float4 *)v, (uint2 *)pb, n4);
    if (done < n) /* the last n % 4, or all of an unaligned span */
        adamw_k<<<hp__cu_blocks(n - done), HP__CU_THREADS, 0, s>>>(
            *k, p + done, g + done, m + done, v + done, pb ? pb + done : NULL, n - done);
    return HP__CU_LAUNCHED();
}

/* Span blockIdx.y's block b of `blocks` (a block per 4096 elements, at most
 * HP__CU_SUMSQ_BLOCKS) sums elements [b·chunk, (b+1)·chunk) (chunk a multiple of 4) with its
 * threads striding, four elements a step through 16-byte loads when x is 16-byte aligned; the
 * tree is a fixed function of n and the alignment, so every step gives the same bits. Blocks
 * past `blocks` write zeros. */
__global__ void sumsq_k(double *partials, const hp__cu_span *spans) {
    const float *x = spans[blockIdx.y].x;
    int64_t n = spans[blockIdx.y].n;
    int64_t blocks = (n + 4095) / 4096;
    blocks = blocks < 1 ? 1 : blocks > HP__CU_SUMSQ_BLOCKS ? HP__CU_SUMSQ_BLOCKS : blocks;
    double *partial = partials + (int64_t)blockIdx.y * HP__CU_SUMSQ_BLOCKS;
    if (blockIdx.x >= blocks) {
        if (threadIdx.x == 0) partial[blockIdx.x] = 0;
        return;
    }
    int64_t chunk = ((n + blocks - 1) / blocks + 3) / 4 * 4;
    int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double acc = 0;
    int64_t i = lo;
    if (((uintptr_t)x & 15) == 0) {
        for (int64_t j = lo + 4 * (int64_t)threadIdx.x; j + 4 <= hi; j += 4 * (int64_t)blockDim.x) {
            float4 q = *(const float4 *)(x + j);
            acc += (double)q.x * (double)q.x + (double)q.y * (double)q.y +
                   (double)q.z * (double)q.z + (double)q.w * (double)q.w;
        }
        i = hi > lo ? lo + (hi - lo) / 4 * 4 : lo; /* the tail, below */
    }
    for (int64_t j = i + threadIdx.x; j < hi; j += blockDim.x) acc += (double)x[j] * (double)x[j];
    acc = hp__block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" int hp__cu_sumsq(cudaStream_t s, double *partial, const hp__cu_span *spans, int n) {
    for (int i = 0; i < n; i += 65535) { /* gridDim.y's limit */
        int k = n - i < 65535 ? n - i : 65535;
        sumsq_k<<<dim3(HP__CU_SUMSQ_BLOCKS, (unsigned)k), HP__CU_THREADS, 0, s>>>(
            partial + (size_t)i * HP__CU_SUMSQ_BLOCKS, spans + i);
        int e = HP__CU_LAUNCHED();
        if (e) return e;
    }
    return 0;
}

__global__ void scale_k(float *x, int64_t n, float coef) {
    HP__CU_FOR(i, n) x[i] *= coef;
}

extern "C" int hp__cu_scale(cudaStream_t s, float *x, int64_t n, float coef) {
    if (n == 0) return 0;
    scale_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(x, n, coef);
    return HP__CU_LAUNCHED();
}

__global__ void accumulate_k(float *dst, const float *src, int64_t n, bool first) {
    HP__CU_FOR(i, n) dst[i] = first ? src[i] : dst[i] + src[i];
}

extern "C" int hp__cu_accumulate(cudaStream_t s, float *dst, const float *src, int64_t n,
                                 bool first) {
    if (n == 0) return 0;
    accumulate_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(dst, src, n, first);
    return HP__CU_LAUNCHED();
}

__global__ void inject_k(hp__cu_fault *fault, long long code, long long v) {
    hp__fault(fault, code, v, 0, 0);
}

extern "C" int hp__cu_inject_fault(cudaStream_t s, hp__cu_fault *fault, long long code,
                                   long long v) {
    inject_k<<<1, 1, 0, s>>>(fault, code, v);
    return HP__CU_LAUNCHED();
}
