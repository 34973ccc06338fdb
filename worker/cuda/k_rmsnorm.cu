/* worker/cuda/k_rmsnorm.cu — fused RMSNorm forward and backward, the cpu backend's formulas
 * (worker/cpu/k_norm_rope.c): rstd = 1/sqrt(mean(x²) + eps) with the sum in double;
 * gx = rstd·(gy·w − x·rstd²·mean(gy·w·x)); gw = Σ_rows gy·x·rstd in double. f32 or bf16
 * storage (x, w, y, gy, gx, gw of one type; rstd f32), f32 math, bf16 rounded once on store.
 * One block per row; gw in two deterministic passes: each block sums a fixed chunk of rows
 * for 256 columns (coalesced), then one thread per column adds the chunks in order. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

#define GW_ROWS 64 /* rows per gw partial */

template <typename T>
__global__ void rms_k(T *y, float *rstd, const T *x, const T *w, int64_t d, double eps) {
    int64_t r = blockIdx.x;
    const T *xr = x + r * d;
    T *yr = y + r * d;
    double ss = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        double v = hp__ld(xr, k);
        ss += v * v;
    }
    ss = hp__block_sum(ss);
    float rs = (float)(1.0 / sqrt(ss / (double)d + eps));
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        hp__st(yr, k, hp__ld(xr, k) * rs * hp__ld(w, k));
    if (threadIdx.x == 0) rstd[r] = rs;
}

extern "C" int hp__cu_rms_norm(cudaStream_t s, int dtype, void *y, float *rstd, const void *x,
                               const void *w, int64_t rows, int64_t d, double eps) {
    if (rows == 0) return 0;
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    if (dtype == HP__CU_BF16)
        rms_k<__nv_bfloat16><<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, rstd, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, d, eps);
    else
        rms_k<float><<<(unsigned)rows, HP__CU_THREADS, 0, s>>>((float *)y, rstd, (const float *)x,
                                                               (const float *)w, d, eps);
    return HP__CU_LAUNCHED();
}

template <typename T>
__global__ void rms_bw_k(T *gx, const T *gy, const T *x, const T *w, const float *rstd, int64_t d) {
    int64_t r = blockIdx.x;
    const T *gr = gy + r * d, *xr = x + r * d;
    T *gxr = gx + r * d;
    double dot = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        dot += (double)hp__ld(gr, k) * (double)hp__ld(w, k) * (double)hp__ld(xr, k);
    dot = hp__block_sum(dot);
    float rs = rstd[r];
    float coef = (float)((double)rs * rs * (dot / (double)d));
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        hp__st(gxr, k, rs * (hp__ld(gr, k) * hp__ld(w, k) - hp__ld(xr, k) * coef));
}

/* part[c, k] = Σ over rows [c·GW_ROWS, (c+1)·GW_ROWS) of (gy·x)·rstd, in row order. */
template <typename T>
__global__ void rms_gw_part_k(double *part, const T *gy, const T *x, const float *rstd,
                              int64_t rows, int64_t d) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= d) return;
    for (int64_t c = blockIdx.y; c * GW_ROWS < rows; c += gridDim.y) {
        int64_t r1 = (c + 1) * GW_ROWS < rows ? (c + 1) * GW_ROWS : rows;
        double acc = 0;
        for (int64_t r = c * GW_ROWS; r < r1; r++)
            acc += (double)(hp__ld(gy, r * d + k) * hp__ld(x, r * d + k)) * rstd[r];
        part[c * d + k] = acc;
    }
}

template <typename T>
__global__ void rms_gw_sum_k(T *gw, const double *part, int64_t chunks, int64_t d) {
    HP__CU_FOR(k, d) {
        double acc = 0;
        for (int64_t c = 0; c < chunks; c++) acc += part[c * d + k];
        hp__st(gw, k, (float)acc);
    }
}

extern "C" size_t hp__cu_rms_norm_backward_scratch(int64_t rows, int64_t d) {
    return (size_t)((rows + GW_ROWS - 1) / GW_ROWS) * (size_t)d * sizeof(double);
}

template <typename T>
static void rms_backward(cudaStream_t s, T *gx, T *gw, const T *gy, const T *x, const T *w,
                         const float *rstd, int64_t rows, int64_t d, double *part) {
    if (rows > 0) rms_bw_k<T><<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(gx, gy, x, w, rstd, d);
    if (d == 0) return;
    int64_t chunks = (rows + GW_ROWS - 1) / GW_ROWS;
    if (chunks > 0) {
        dim3 g((unsigned)((d + HP__CU_THREADS - 1) / HP__CU_THREADS),
               (unsigned)(chunks < 65535 ? chunks : 65535));
        rms_gw_part_k<T><<<g, HP__CU_THREADS, 0, s>>>(part, gy, x, rstd, rows, d);
    }
    rms_gw_sum_k<T><<<hp__cu_blocks(d), HP__CU_THREADS, 0, s>>>(gw, part, chunks, d);
}

extern "C" int hp__cu_rms_norm_backward(cudaStream_t s, int dtype, void *gx, void *gw,
                                        const void *gy, const void *x, const void *w,
                                        const float *rstd, int64_t rows, int64_t d,
                                        double *scratch) {
    if (rows > 0x7fffffff || (d + HP__CU_THREADS - 1) / HP__CU_THREADS > 0x7fffffff)
        return (int)cudaErrorInvalidConfiguration;
    if (dtype == HP__CU_BF16) {
        typedef __nv_bfloat16 B;
        rms_backward<B>(s, (B *)gx, (B *)gw, (const B *)gy, (const B *)x, (const B *)w, rstd, rows,
                        d, scratch);
    } else {
        rms_backward<float>(s, (float *)gx, (float *)gw, (const float *)gy, (const float *)x,
                            (const float *)w, rstd, rows, d, scratch);
    }
    return HP__CU_LAUNCHED();
}
