/* tests/cuemu/include/cuemu_device.h — the device side of cuemu, for the kernel files
 * (worker/cuda/k_*.cu, translated to C++ by tests/cuemu/cu2cpp.cmake: `k<<<g, b, smem, s>>>(args)`
 * becomes `::hp_emu::launcher("k", g, b, smem, s).run(k, args)` and `extern __shared__ T x[];`
 * becomes a pointer to the block's dynamic shared memory).
 *
 * A launch runs every block in turn; a block's threads are fibers on one host thread, each
 * running until it finishes or waits at __syncthreads or a warp shuffle, so the barrier and
 * shuffle semantics are the device's. Each release runs the threads in the opposite order of
 * the last, so a read of shared memory that lacks its __syncthreads sees the wrong value.
 * Dynamic shared memory starts as 0xff bytes (f32 NaN) in every block. __shared__ variables
 * are per host thread (blocks run one at a time). A deadlock (threads at __syncthreads while
 * others wait at a shuffle) or a shuffle with an exited lane fails the launch: the error is
 * sticky, as a device fault is, and the reason goes to stderr. */
#ifndef HP_CUEMU_DEVICE_H
#define HP_CUEMU_DEVICE_H

#include "cuda_runtime_api.h"

#include <float.h>
#include <functional>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static thread_local
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) {
    return uint2{x, y};
}
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
struct alignas(16) float4 {
    float x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace hp_emu {

struct block_ctx {
    uint3 idx;
    dim3 dim, grid;
};
struct thread_ctx {
    uint3 idx;
    int linear; /* x + y·dim.x + z·dim.x·dim.y: lane = linear % 32, warp = linear / 32 */
};
extern thread_local block_ctx *cur_block;
extern thread_local thread_ctx *cur_thread;

void syncthreads();
void syncwarp();
/* Lane deposits v; once every live lane of its warp has, returns lane src's deposit. */
uint64_t warp_exchange(uint64_t v, int src);
void *dyn_smem();
unsigned long long block_serial(); /* distinct for every block run on this host thread */
void launch(const char *name, const void *kernel, dim3 g, dim3 b, size_t smem, cudaStream_t s,
            const std::function<void()> &body);

struct launcher {
    const char *name;
    dim3 g, b;
    size_t smem;
    cudaStream_t s;
    launcher(const char *n, dim3 g_, dim3 b_, size_t sm = 0, cudaStream_t st = nullptr)
        : name(n), g(g_), b(b_), smem(sm), s(st) {}
    template <class K, class... A> void run(K kernel, A... args) {
        launch(name, (const void *)kernel, g, b, smem, s, [=]() { kernel(args...); });
    }
};

template <class T> inline T exchange(T v, int src) {
    static_assert(sizeof(T) <= 8, "cuemu shuffles move at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = warp_exchange(u, src);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}

} // namespace hp_emu

#define threadIdx (::hp_emu::cur_thread->idx)
#define blockIdx  (::hp_emu::cur_block->idx)
#define blockDim  (::hp_emu::cur_block->dim)
#define gridDim   (::hp_emu::cur_block->grid)
static constexpr int warpSize = 32;

inline void __syncthreads() {
    ::hp_emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    ::hp_emu::syncwarp();
}

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
    (void)mask;
    int lane = ::hp_emu::cur_thread->linear & 31;
    return ::hp_emu::exchange(v, (lane & ~(width - 1)) | ((lane ^ lm) & (width - 1)));
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    (void)mask;
    int lane = ::hp_emu::cur_thread->linear & 31;
    return ::hp_emu::exchange(v, (lane & ~(width - 1)) | (src & (width - 1)));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    (void)mask;
    int lane = ::hp_emu::cur_thread->linear & 31;
    int in = lane & (width - 1);
    return ::hp_emu::exchange(v, in + (int)d < width ? lane + (int)d : lane);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    (void)mask;
    int lane = ::hp_emu::cur_thread->linear & 31;
    int in = lane & (width - 1);
    return ::hp_emu::exchange(v, in >= (int)d ? lane - (int)d : lane);
}

/* ---- atomics (the host's, so that blocks could run on several threads) ---------------------- */

inline float atomicAdd(float *p, float v) {
    uint32_t *u = (uint32_t *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
    do {
        float f;
        memcpy(&f, &old, sizeof f);
        f += v;
        memcpy(&nw, &f, sizeof nw);
    } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    float r;
    memcpy(&r, &old, sizeof r);
    return r;
}
inline double atomicAdd(double *p, double v) {
    uint64_t *u = (uint64_t *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
    do {
        double f;
        memcpy(&f, &old, sizeof f);
        f += v;
        memcpy(&nw, &f, sizeof nw);
    } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    double r;
    memcpy(&r, &old, sizeof r);
    return r;
}
inline int atomicAdd(int *p, int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp,
                                    unsigned long long v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
inline int atomicCAS(int *p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
inline int atomicExch(int *p, int v) {
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}

/* ---- intrinsics --------------------------------------------------------------------------- */

inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline unsigned __float_as_uint(float f) {
    unsigned i;
    memcpy(&i, &f, sizeof i);
    return i;
}
inline float __uint_as_float(unsigned i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
inline float __frcp_rn(float a) {
    return 1.0f / a;
}
inline float __expf(float a) {
    return expf(a);
}
inline float __logf(float a) {
    return logf(a);
}
inline float rsqrtf(float a) {
    return 1.0f / sqrtf(a);
}
inline double rsqrt(double a) {
    return 1.0 / sqrt(a);
}
template <class T> inline T __ldg(const T *p) {
    return *p;
}
/* The device's min / max overloads: mixed integer types meet in the wider one. */
inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
inline long min(long a, long b) {
    return a < b ? a : b;
}
inline long max(long a, long b) {
    return a > b ? a : b;
}
inline int min(int a, int b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}

#endif
