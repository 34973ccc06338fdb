/* worker/cuda/k_softmax.cu — _softmax / _log_softmax and their backwards over one dim: one
 * block per line (lines of len elements inner apart), the max and the sums by block reductions
 * (sums in double), the formulas of the cpu backend (worker/cpu/k_nn.c). */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void softmax_k(int log_out, float *y, const float *x, int64_t len, int64_t inner) {
    int64_t l = blockIdx.x;
    int64_t base = l / inner * len * inner + l % inner;
    const float *xl = x + base;
    float *yl = y + base;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) m = hp__fmax_nan(m, xl[i * inner]);
    m = hp__block_max(m);
    double acc = 0;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) acc += (double)expf(xl[i * inner] - m);
    double sum = hp__block_sum(acc);
    if (log_out) {
        float lse = (float)((double)m + log(sum));
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x) yl[i * inner] = xl[i * inner] - lse;
    } else {
        float inv = (float)(1.0 / sum);
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
            yl[i * inner] = expf(xl[i * inner] - m) * inv;
    }
}

__global__ void softmax_bw_k(int log_out, float *gx, const float *g, const float *out, int64_t len,
                             int64_t inner) {
    int64_t l = blockIdx.x;
    int64_t base = l / inner * len * inner + l % inner;
    const float *gl = g + base, *ol = out + base;
    float *yl = gx + base;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        acc += log_out ? (double)gl[i * inner] : (double)gl[i * inner] * (double)ol[i * inner];
    float sum = (float)hp__block_sum(acc);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
        int64_t k = i * inner;
        yl[k] = log_out ? gl[k] - expf(ol[k]) * sum : ol[k] * (gl[k] - sum);
    }
}

static int lines_grid(int64_t outer, int64_t inner, unsigned *g) {
    int64_t lines = outer * inner;
    if (lines > 0x7fffffff) return 0;
    *g = (unsigned)lines;
    return 1;
}

extern "C" int hp__cu_softmax(cudaStream_t s, int log, float *y, const float *x, int64_t outer,
                              int64_t len, int64_t inner) {
    unsigned g;
    if (outer * inner == 0 || len == 0) return 0;
    if (!lines_grid(outer, inner, &g)) return (int)cudaErrorInvalidConfiguration;
    softmax_k<<<g, HP__CU_THREADS, 0, s>>>(log, y, x, len, inner);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_softmax_backward(cudaStream_t s, int log, float *gx, const float *g,
                                       const float *out, int64_t outer, int64_t len,
                                       int64_t inner) {
    unsigned grid;
    if (outer * inner == 0 || len == 0) return 0;
    if (!lines_grid(outer, inner, &grid)) return (int)cudaErrorInvalidConfiguration;
    softmax_bw_k<<<grid, HP__CU_THREADS, 0, s>>>(log, gx, g, out, len, inner);
    return HP__CU_LAUNCHED();
}
