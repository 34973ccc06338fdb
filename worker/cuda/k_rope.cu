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

template <typename T>
__global__ void rope_k(T *y, const T *x, const float *cs, int64_t nt, int64_t h, int64_t d,
                       int64_t n_pairs) {
    int64_t half = d / 2;
    HP__CU_FOR(p, n_pairs) {
        int64_t i = p % half, t = (p / half / h) % nt; /* p / half / h = (b, t) */
        float c = cs[2 * (t * half + i)], s = cs[2 * (t * half + i) + 1];
        float x0 = hp__ld(x, 2 * p), x1 = hp__ld(x, 2 * p + 1);
        hp__st(y, 2 * p, x0 * c - x1 * s);
        hp__st(y, 2 * p + 1, x0 * s + x1 * c);
    }
}

extern "C" size_t hp__cu_rotary_scratch(int64_t t, int64_t d) {
    return (size_t)t * (size_t)(d / 2) * 2 * sizeof(float);
}

extern "C" int hp__cu_rotary(cudaStream_t s, int dtype, void *y, const void *x, int64_t b,
                             int64_t t, int64_t h, int64_t d, double theta, float sign,
                             float *table) {
    int64_t n_pairs = b * t * h * (d / 2);
    if (n_pairs == 0) return 0;
    rope_table_k<<<hp__cu_blocks(t * (d / 2)), HP__CU_THREADS, 0, s>>>(table, t, d, theta, sign);
    unsigned g = hp__cu_blocks(n_pairs);
    if (dtype == HP__CU_BF16)
        rope_k<__nv_bfloat16><<<g, HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, table, t, h, d, n_pairs);
    else
        rope_k<float>
            <<<g, HP__CU_THREADS, 0, s>>>((float *)y, (const float *)x, table, t, h, d, n_pairs);
    return HP__CU_LAUNCHED();
}
