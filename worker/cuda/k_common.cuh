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
#include <string.h>

#define HP__CU_THREADS 256

/* Loops over register arrays must be unrolled (a run-time index puts the array in local memory);
 * cuemu's C++ compiler does without. */
#ifdef HP_CUDA_EMU
#define HP__UNROLL
#else
#define HP__UNROLL _Pragma("unroll")
#endif

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

/* Eight consecutive elements at p (16-byte aligned for bf16, 32 for f32) as f32, and back:
 * one or two 16-byte accesses. */
template <typename T> __device__ __forceinline__ void hp__ld8(const T *p, float f[8]);
template <> __device__ __forceinline__ void hp__ld8<float>(const float *p, float f[8]) {
#ifdef HP_CUDA_EMU
    memcpy(f, p, 8 * sizeof(float));
#else
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
#endif
}
template <>
__device__ __forceinline__ void hp__ld8<__nv_bfloat16>(const __nv_bfloat16 *p, float f[8]) {
    uint32_t u[4];
#ifdef HP_CUDA_EMU
    memcpy(u, (const void *)p, sizeof u);
#else
    uint4 v = *(const uint4 *)p;
    u[0] = v.x, u[1] = v.y, u[2] = v.z, u[3] = v.w;
#endif
    HP__UNROLL
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}
template <typename T> __device__ __forceinline__ void hp__st8(T *p, const float f[8]);
template <> __device__ __forceinline__ void hp__st8<float>(float *p, const float f[8]) {
#ifdef HP_CUDA_EMU
    memcpy(p, f, 8 * sizeof(float));
#else
    ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
#endif
}
__device__ __forceinline__ uint32_t hp__bf16_bits(float f) {
#ifdef HP_CUDA_EMU
    return __float2bfloat16_rn(f).__x;
#else
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}
template <>
__device__ __forceinline__ void hp__st8<__nv_bfloat16>(__nv_bfloat16 *p, const float f[8]) {
    uint32_t u[4];
    HP__UNROLL
    for (int i = 0; i < 4; i++)
        u[i] = hp__bf16_bits(f[2 * i]) | (hp__bf16_bits(f[2 * i + 1]) << 16);
#ifdef HP_CUDA_EMU
    memcpy((void *)p, u, sizeof u);
#else
    *(uint4 *)p = make_uint4(u[0], u[1], u[2], u[3]);
#endif
}
/* Whether pointers may take hp__ld8 / hp__st8 (every group of 8 at a multiple of 8). */
static inline bool hp__vec8_ok(const void *a, const void *b, const void *c) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

/* i / d for i < 2^31 (hp__cu_div). */
__device__ __forceinline__ uint32_t hp__udiv(uint32_t i, uint32_t magic, uint32_t shift) {
    return (__umulhi(i, magic) + i) >> shift;
}

/* Offset of operand k at linear index i of the walk (row-major over shape); a walk prepared by
 * hp__cu_walk_fast divides in 32 bits by magic numbers. */
__device__ __forceinline__ int64_t hp__walk_off(const hp__cu_walk &w, int k, int64_t i) {
    int64_t off = 0;
    if (w.fast) {
        uint32_t j = (uint32_t)i;
        for (int d = w.rank - 1; d >= 0; d--) {
            uint32_t q = hp__udiv(j, w.magic[d], w.shift[d]);
            off += (int64_t)(j - q * (uint32_t)w.shape[d]) * w.st[k][d];
            j = q;
        }
        return off;
    }
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
