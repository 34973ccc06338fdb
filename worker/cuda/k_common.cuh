/* worker/cuda/k_common.cuh — what the kernel files share: element loads and stores by dtype
 * (compute in f32, bf16/f16 rounded to nearest even on store), grid sizing, the walk's index
 * decode, block reductions in double, and the fault word. Device code only; no hp headers. */
#ifndef HP_WORKER_CUDA_K_COMMON_CUH
#define HP_WORKER_CUDA_K_COMMON_CUH

#include "worker/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define HP__CU_THREADS 256

/* Blocks for n elements, one per thread, at most 65535·8 blocks (loops stride the rest). */
static inline unsigned hp__cu_blocks(int64_t n) {
    int64_t b = (n + HP__CU_THREADS - 1) / HP__CU_THREADS;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)b;
}

#define HP__CU_FOR(i, n)                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

template <typename T> __device__ __forceinline__ float hp__ld(const T *p, int64_t i);
template <> __device__ __forceinline__ float hp__ld<float>(const float *p, int64_t i) {
    return p[i];
}
template <>
__device__ __forceinline__ float hp__ld<__nv_bfloat16>(const __nv_bfloat16 *p, int64_t i) {
    return __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ float hp__ld<__half>(const __half *p, int64_t i) {
    return __half2float(p[i]);
}

template <typename T> __device__ __forceinline__ void hp__st(T *p, int64_t i, float v);
template <> __device__ __forceinline__ void hp__st<float>(float *p, int64_t i, float v) {
    p[i] = v;
}
template <>
__device__ __forceinline__ void hp__st<__nv_bfloat16>(__nv_bfloat16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ void hp__st<__half>(__half *p, int64_t i, float v) {
    p[i] = __float2half_rn(v);
}

/* Offset of operand k at linear index i of the walk (row-major over shape). */
__device__ __forceinline__ int64_t hp__walk_off(const hp__cu_walk &w, int k, int64_t i) {
    int64_t off = 0;
    for (int d = w.rank - 1; d >= 0; d--) {
        int64_t sz = w.shape[d];
        int64_t q = i / sz;
        off += (i - q * sz) * w.st[k][d];
        i = q;
    }
    return off;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ __forceinline__ double hp__block_sum(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    double t = lane < nw ? part[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* Max of v over the block (NaN-propagating); every thread gets it. */
__device__ __forceinline__ float hp__fmax_nan(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}
__device__ __forceinline__ float hp__block_max(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v = hp__fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    float t = lane < nw ? part[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) t = hp__fmax_nan(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

/* Records the first fault since the word was cleared. */
__device__ __forceinline__ void hp__fault(hp__cu_fault *f, long long code, long long value,
                                          long long pos, long long limit) {
    if (!f) return;
    if (atomicCAS((unsigned long long *)&f->code, 0ull, (unsigned long long)code) == 0ull) {
        f->value = value;
        f->position = pos;
        f->limit = limit;
    }
}

__device__ __forceinline__ int64_t hp__index(const void *idx, int is64, int64_t i) {
    return is64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

#define HP__CU_LAUNCHED() ((int)cudaGetLastError())

#endif
