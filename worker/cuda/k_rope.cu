/* worker/cuda/k_rope.cu — rotary position embedding on [B, T, H, D]: pair (2i, 2i+1) of
 * position t rotated by a = t·theta^(−2i/D) (−a for the inverse, the gradient). The angle and
 * its cos/sin are computed in double and rounded to f32, as the cpu backend's table: once per
 * (t, i) into a table (scratch), then applied to every batch and head. f32 or bf16 storage. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void rope_table_k(float *cs, int64_t nt, int64_t d, double theta, float sign) {
    int64_t half = d / 2;
    HP__CU_FOR(j, nt * half) {
        int64_t i = j % half, t = j / half;
        double f = pow(theta, -2.0 * (double)i / (double)d);
        double a = (double)t * f;
        cs[2 * j] = (float)cos(a);
        cs[2 * j + 1] = sign * (float)sin(a);
    }
}

/* Rows (b, t) of h·half pairs: a row's position t = row % nt once, a pair's index i = q % half
 * through hp__cu_div (q < 2^31), no 64-bit division per element. */
template <typename T>
__global__ void rope_k(T *y, const T *x, const float *cs, int64_t rows, hp__cu_div nt,
                       uint32_t pairs, hp__cu_div half) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        uint32_t t = (uint32_t)(r % nt.d);
        const float *ct = cs + 2 * (int64_t)t * half.d;
        T *yr = y + r * 2 * (int64_t)pairs;
        const T *xr = x + r * 2 * (int64_t)pairs;
        for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < pairs;
             q += gridDim.x * blockDim.x) {
            uint32_t i = q - hp__udiv(q, half.magic, half.shift) * half.d;
            float c = ct[2 * i], s = ct[2 * i + 1];
            float x0 = hp__ld(xr, 2 * q), x1 = hp__ld(xr, 2 * q + 1);
            hp__st(yr, 2 * q, x0 * c - x1 * s);
            hp__st(yr, 2 * q + 1, x0 * s + x1 * c);
        }
    }
}

extern "C" size_t hp__cu_rotary_scratch(int64_t t, int64_t d) {
    return (size_t)t * (size_t)(d / 2) * 2 * sizeof(float);
}

extern "C" int hp__cu_rotary(cudaStream_t s, int dtype, void *y, const void *x, int64_t b,
                             int64_t t, int64_t h, int64_t d, double theta, float sign,
                             float *table) {
    int64_t rows = b * t, pairs = h * (d / 2);
    if (rows == 0 || pairs == 0) return 0;
    if (pairs >= 0x7fffffff || t >= 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    rope_table_k<<<hp__cu_blocks(t * (d / 2)), HP__CU_THREADS, 0, s>>>(table, t, d, theta, sign);
    int64_t gx = (pairs + HP__CU_THREADS - 1) / HP__CU_THREADS;
    dim3 g((unsigned)(gx < 64 ? gx : 64), (unsigned)(rows < 65535 ? rows : 65535));
    hp__cu_div nt = hp__cu_div_make((uint32_t)t), half = hp__cu_div_make((uint32_t)(d / 2));
    if (dtype == HP__CU_BF16)
        rope_k<__nv_bfloat16><<<g, HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, table, rows, nt, (uint32_t)pairs, half);
    else
        rope_k<float><<<g, HP__CU_THREADS, 0, s>>>((float *)y, (const float *)x, table, rows, nt,
                                                   (uint32_t)pairs, half);
    return HP__CU_LAUNCHED();
}
