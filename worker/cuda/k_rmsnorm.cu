/* worker/cuda/k_rmsnorm.cu — fused RMSNorm forward and backward, the cpu backend's formulas
 * (worker/cpu/k_norm_rope.c): rstd = 1/sqrt(mean(x²) + eps) with the sum in double;
 * gx = rstd·(gy·w − x·rstd²·mean(gy·w·x)); gw = Σ_rows gy·x·rstd, one thread per column
 * summing the rows in order (deterministic, no atomics). One block per row elsewhere. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void rms_k(float *y, float *rstd, const float *x, const float *w, int64_t d,
                      double eps) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double ss = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) ss += (double)xr[k] * (double)xr[k];
    ss = hp__block_sum(ss);
    float rs = (float)(1.0 / sqrt(ss / (double)d + eps));
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) yr[k] = xr[k] * rs * w[k];
    if (threadIdx.x == 0) rstd[r] = rs;
}

extern "C" int hp__cu_rms_norm(cudaStream_t s, float *y, float *rstd, const float *x,
                               const float *w, int64_t rows, int64_t d, double eps) {
    if (rows == 0) return 0;
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    rms_k<<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(y, rstd, x, w, d, eps);
    return HP__CU_LAUNCHED();
}

__global__ void rms_bw_k(float *gx, const float *gy, const float *x, const float *w,
                         const float *rstd, int64_t d) {
    int64_t r = blockIdx.x;
    const float *gr = gy + r * d, *xr = x + r * d;
    float *gxr = gx + r * d;
    double dot = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        dot += (double)gr[k] * (double)w[k] * (double)xr[k];
    dot = hp__block_sum(dot);
    float rs = rstd[r];
    float coef = (float)((double)rs * rs * (dot / (double)d));
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        gxr[k] = rs * (gr[k] * w[k] - xr[k] * coef);
}

__global__ void rms_gw_k(float *gw, const float *gy, const float *x, const float *rstd,
                         int64_t rows, int64_t d) {
    HP__CU_FOR(k, d) {
        double acc = 0;
        for (int64_t r = 0; r < rows; r++) acc += (double)(gy[r * d + k] * x[r * d + k]) * rstd[r];
        gw[k] = (float)acc;
    }
}

extern "C" int hp__cu_rms_norm_backward(cudaStream_t s, float *gx, float *gw, const float *gy,
                                        const float *x, const float *w, const float *rstd,
                                        int64_t rows, int64_t d) {
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    if (rows > 0) rms_bw_k<<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(gx, gy, x, w, rstd, d);
    if (d > 0) rms_gw_k<<<hp__cu_blocks(d), HP__CU_THREADS, 0, s>>>(gw, gy, x, rstd, rows, d);
    return HP__CU_LAUNCHED();
}
