/* worker/cuda/k_rope.cu — rotary position embedding on [B, T, H, D]: pair (2i, 2i+1) of
 * position t rotated by a = t·theta^(−2i/D) (−a for the inverse, the gradient). The angle and
 * its cos/sin are computed in double and rounded to f32, as the cpu backend's table. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void rope_k(float *y, const float *x, int64_t nt, int64_t h, int64_t d, double theta,
                       float sign, int64_t n_pairs) {
    int64_t half = d / 2;
    HP__CU_FOR(p, n_pairs) {
        int64_t i = p % half, row = p / half / h; /* row = (b, t) */
        int64_t t = row % nt;
        double f = pow(theta, -2.0 * (double)i / (double)d);
        double a = (double)t * f;
        float c = (float)cos(a), s = sign * (float)sin(a);
        float x0 = x[2 * p], x1 = x[2 * p + 1];
        y[2 * p] = x0 * c - x1 * s;
        y[2 * p + 1] = x0 * s + x1 * c;
    }
}

extern "C" int hp__cu_rotary(cudaStream_t s, float *y, const float *x, int64_t b, int64_t t,
                             int64_t h, int64_t d, double theta, float sign) {
    int64_t n_pairs = b * t * h * (d / 2);
    if (n_pairs == 0) return 0;
    rope_k<<<hp__cu_blocks(n_pairs), HP__CU_THREADS, 0, s>>>(y, x, t, h, d, theta, sign, n_pairs);
    return HP__CU_LAUNCHED();
}
