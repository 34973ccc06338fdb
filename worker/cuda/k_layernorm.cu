/* worker/cuda/k_layernorm.cu — LayerNorm (ATen's native_layer_norm over the last dim, with
 * weight and bias) forward and backward in f32, the cpu backend's formulas
 * (worker/cpu/k_layer_norm.c): each row's mean and biased variance in double (two passes);
 * gx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = gy·w; gw = Σ gy·x̂ and gb = Σ gy per fixed
 * block of 64 rows in double, the blocks then added in order (the cpu's blocking: the same
 * sums). One block per row elsewhere. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

#define LN_BLOCK 64

__global__ void ln_k(float *y, float *mean, float *rstd, const float *x, const float *w,
                     const float *b, int64_t d, double eps) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double s = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) s += xr[k];
    s = hp__block_sum(s);
    double mu = d > 0 ? s / (double)d : 0, v = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        v += ((double)xr[k] - mu) * ((double)xr[k] - mu);
    v = hp__block_sum(v);
    double var = d > 0 ? v / (double)d : 0;
    float rs = (float)(1.0 / sqrt(var + eps)), m = (float)mu;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
        yr[k] = __fadd_rn(__fmul_rn(__fmul_rn(__fadd_rn(xr[k], -m), rs), w[k]), b[k]);
    if (threadIdx.x == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

extern "C" int hp__cu_layer_norm(cudaStream_t s, float *y, float *mean, float *rstd, const float *x,
                                 const float *w, const float *b, int64_t rows, int64_t d,
                                 double eps) {
    if (rows == 0) return 0;
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    ln_k<<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(y, mean, rstd, x, w, b, d, eps);
    return HP__CU_LAUNCHED();
}

__global__ void ln_bw_k(float *gx, const float *gy, const float *x, const float *mean,
                        const float *rstd, const float *w, int64_t d) {
    int64_t r = blockIdx.x;
    const float *gr = gy + r * d, *xr = x + r * d;
    float mu = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        double xh = (double)__fmul_rn(__fadd_rn(xr[k], -mu), rs), g = (double)gr[k] * (double)w[k];
        sg += g;
        sgx += g * xh;
    }
    sg = hp__block_sum(sg);
    sgx = hp__block_sum(sgx);
    float a = (float)(sg / (double)d), bc = (float)(sgx / (double)d);
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        float xh = __fmul_rn(__fadd_rn(xr[k], -mu), rs);
        gx[r * d + k] =
            __fmul_rn(rs, __fadd_rn(__fadd_rn(__fmul_rn(gr[k], w[k]), -a), -__fmul_rn(xh, bc)));
    }
}

/* part[blk][0][k] = Σ gy·x̂, part[blk][1][k] = Σ gy over the block's rows, in row order. */
__global__ void ln_part_k(double *part, const float *gy, const float *x, const float *mean,
                          const float *rstd, int64_t rows, int64_t d) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= d) return;
    for (int64_t blk = blockIdx.y; blk * LN_BLOCK < rows; blk += gridDim.y) {
        int64_t r1 = (blk + 1) * LN_BLOCK < rows ? (blk + 1) * LN_BLOCK : rows;
        double gw = 0, gb = 0;
        for (int64_t r = blk * LN_BLOCK; r < r1; r++) {
            double xh = (double)__fmul_rn(__fadd_rn(x[r * d + k], -mean[r]), rstd[r]);
            gw += (double)gy[r * d + k] * xh;
            gb += (double)gy[r * d + k];
        }
        part[blk * 2 * d + k] = gw;
        part[blk * 2 * d + d + k] = gb;
    }
}

__global__ void ln_sum_k(float *gw, float *gb, const double *part, int64_t blocks, int64_t d) {
    HP__CU_FOR(k, d) {
        double sw = 0, sb = 0;
        for (int64_t blk = 0; blk < blocks; blk++) {
            sw += part[blk * 2 * d + k];
            sb += part[blk * 2 * d + d + k];
        }
        gw[k] = (float)sw;
        gb[k] = (float)sb;
    }
}

extern "C" size_t hp__cu_layer_norm_backward_scratch(int64_t rows, int64_t d) {
    return (size_t)((rows + LN_BLOCK - 1) / LN_BLOCK) * 2 * (size_t)d * sizeof(double);
}

extern "C" int hp__cu_layer_norm_backward(cudaStream_t s, float *gx, float *gw, float *gb,
                                          const float *gy, const float *x, const float *mean,
                                          const float *rstd, const float *w, int64_t rows,
                                          int64_t d, double *scratch) {
    int64_t blocks = (rows + LN_BLOCK - 1) / LN_BLOCK;
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    if (rows > 0 && d > 0)
        ln_bw_k<<<(unsigned)rows, HP__CU_THREADS, 0, s>>>(gx, gy, x, mean, rstd, w, d);
    if (d == 0) return HP__CU_LAUNCHED();
    if (blocks > 0) {
        dim3 g((unsigned)((d + HP__CU_THREADS - 1) / HP__CU_THREADS),
               (unsigned)(blocks < 65535 ? blocks : 65535));
        ln_part_k<<<g, HP__CU_THREADS, 0, s>>>(scratch, gy, x, mean, rstd, rows, d);
    }
    ln_sum_k<<<hp__cu_blocks(d), HP__CU_THREADS, 0, s>>>(gw, gb, scratch, blocks, d);
    return HP__CU_LAUNCHED();
}
