/* worker/cuda/k_optim.cu — the training loop's math on device buffers: AdamW with the scalars
 * of hp_adamw_step (worker/optim.c, the same float operations per element), sums of squares
 * into fixed per-block partials in double (combined in order on the host: the norm does not
 * depend on timing), scaling, and the kernel that records an injected fault (tests). */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void adamw_k(hp__cu_adamw k, float *p, const float *g, float *m, float *v, int64_t n) {
    HP__CU_FOR(i, n) {
        float pi = p[i] * k.decay;
        float gi = __fmul_rn(g[i], k.g_scale);
        float mi = fmaf(gi, k.omb1, m[i] * k.b1);
        float vi = fmaf(k.omb2 * gi, gi, v[i] * k.b2);
        float den = __fadd_rn(__fdiv_rn(sqrtf(vi), k.bc2_sqrt), k.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step, mi), den));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" int hp__cu_adamw_step(cudaStream_t s, const hp__cu_adamw *k, float *p, const float *g,
                                 float *m, float *v, int64_t n) {
    if (n == 0) return 0;
    adamw_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(*k, p, g, m, v, n);
    return HP__CU_LAUNCHED();
}

/* Block b sums elements [b·chunk, (b+1)·chunk) with its threads striding; the tree is fixed. */
__global__ void sumsq_k(double *partial, const float *x, int64_t n) {
    int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
    int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) acc += (double)x[i] * (double)x[i];
    acc = hp__block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* A block per 4096 elements, at most HP__CU_SUMSQ_BLOCKS; the partials past the last block are
 * zeros (a fixed function of n: the same bits every step). */
extern "C" int hp__cu_sumsq(cudaStream_t s, double *partial, const float *x, int64_t n) {
    int64_t blocks = (n + 4095) / 4096;
    if (blocks < 1) blocks = 1;
    if (blocks > HP__CU_SUMSQ_BLOCKS) blocks = HP__CU_SUMSQ_BLOCKS;
    if (blocks < HP__CU_SUMSQ_BLOCKS) {
        cudaError_t e = cudaMemsetAsync(partial + blocks, 0,
                                        (size_t)(HP__CU_SUMSQ_BLOCKS - blocks) * sizeof(double), s);
        if (e != cudaSuccess) return (int)e;
    }
    sumsq_k<<<(unsigned)blocks, HP__CU_THREADS, 0, s>>>(partial, x, n);
    return HP__CU_LAUNCHED();
}

__global__ void scale_k(float *x, int64_t n, float coef) {
    HP__CU_FOR(i, n) x[i] *= coef;
}

extern "C" int hp__cu_scale(cudaStream_t s, float *x, int64_t n, float coef) {
    if (n == 0) return 0;
    scale_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(x, n, coef);
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
