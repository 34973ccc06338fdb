/* worker/cuda/k_swiglu.cu — swiglu(a, b) = silu(a)·b and its backward (made by
 * passes/fuse_swiglu.c from the Llama MLP's silu, mul and their backward muls): f32 or bf16
 * storage, f32 math, each output rounded once; 16-byte loads and stores, eight elements a
 * thread, when every pointer allows, one element a thread for the rest. The forward reads two
 * tensors and writes one (silu(a) is never stored); the backward reads three and writes two,
 * where the unfused ops moved 5 and 9 tensors. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__device__ __forceinline__ float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}

template <typename T> __global__ void swiglu_k(T *y, const T *a, const T *b, int64_t n, int vec) {
    int64_t n8 = vec ? n / 8 : 0;
    HP__CU_FOR(i, n8) {
        float x[8], z[8];
        hp__ld8(a + 8 * i, x);
        hp__ld8(b + 8 * i, z);
        HP__UNROLL
        for (int k = 0; k < 8; k++) x[k] = x[k] * sig(x[k]) * z[k];
        hp__st8(y + 8 * i, x);
    }
    HP__CU_FOR(i, n - 8 * n8) {
        int64_t k = 8 * n8 + i;
        float x = hp__ld(a, k);
        hp__st(y, k, x * sig(x) * hp__ld(b, k));
    }
}

/* (ga, gb) = (g·b·σ(a)·(1 + a·(1 − σ(a))), g·a·σ(a)) */
template <typename T>
__global__ void swiglu_bw_k(T *ga, T *gb, const T *g, const T *a, const T *b, int64_t n, int vec) {
    int64_t n8 = vec ? n / 8 : 0;
    HP__CU_FOR(i, n8) {
        float gv[8], x[8], z[8], oa[8], ob[8];
        hp__ld8(g + 8 * i, gv);
        hp__ld8(a + 8 * i, x);
        hp__ld8(b + 8 * i, z);
        HP__UNROLL
        for (int k = 0; k < 8; k++) {
            float s = sig(x[k]);
            oa[k] = gv[k] * z[k] * (s * (1.0f + x[k] * (1.0f - s)));
            ob[k] = gv[k] * (x[k] * s);
        }
        hp__st8(ga + 8 * i, oa);
        hp__st8(gb + 8 * i, ob);
    }
    HP__CU_FOR(i, n - 8 * n8) {
        int64_t k = 8 * n8 + i;
        float gv = hp__ld(g, k), x = hp__ld(a, k), s = sig(x);
        hp__st(ga, k, gv * hp__ld(b, k) * (s * (1.0f + x * (1.0f - s))));
        hp__st(gb, k, gv * (x * s));
    }
}

extern "C" int hp__cu_swiglu(cudaStream_t s, int dt, void *y, const void *a, const void *b,
                             int64_t n) {
    if (n == 0) return 0;
    int vec = hp__vec8_ok(y, a, b);
    unsigned g = hp__cu_blocks(vec && n >= 8 ? n / 8 : n);
    if (dt == HP__CU_BF16)
        swiglu_k<__nv_bfloat16><<<g, HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, n, vec);
    else
        swiglu_k<float>
            <<<g, HP__CU_THREADS, 0, s>>>((float *)y, (const float *)a, (const float *)b, n, vec);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_swiglu_backward(cudaStream_t s, int dt, void *ga, void *gb, const void *g,
                                      const void *a, const void *b, int64_t n) {
    if (n == 0) return 0;
    int vec = hp__vec8_ok(ga, gb, g) && hp__vec8_ok(a, b, b);
    unsigned grid = hp__cu_blocks(vec && n >= 8 ? n / 8 : n);
    if (dt == HP__CU_BF16)
        swiglu_bw_k<__nv_bfloat16><<<grid, HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)ga, (__nv_bfloat16 *)gb, (const __nv_bfloat16 *)g,
            (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, n, vec);
    else
        swiglu_bw_k<float><<<grid, HP__CU_THREADS, 0, s>>>(
            (float *)ga, (float *)gb, (const float *)g, (const float *)a, (const float *)b, n, vec);
    return HP__CU_LAUNCHED();
}
