/* worker/cuda/k_reduce.cu — sum, mean, amax over any set of dims: one block per output, its
 * threads striding over the reduced elements (double accumulation for f32, int64 wrapping for
 * integers), combined by a fixed tree, so a result depends only on the shape and the values. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void reduce_f32_k(int op, float *y, const float *x, hp__cu_walk kept, hp__cu_walk red,
                             int64_t n_red) {
    int64_t o = blockIdx.x;
    const float *base = x + hp__walk_off(kept, 0, o);
    if (op == HP__CU_AMAX) {
        float m = -INFINITY;
        for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x)
            m = hp__fmax_nan(m, base[hp__walk_off(red, 0, r)]);
        m = hp__block_max(m);
        if (threadIdx.x == 0) y[o] = m;
        return;
    }
    double acc = 0;
    for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x)
        acc += (double)base[hp__walk_off(red, 0, r)];
    acc = hp__block_sum(acc);
    if (threadIdx.x == 0) y[o] = (float)(op == HP__CU_MEAN ? acc / (double)n_red : acc);
}

template <typename T>
__global__ void reduce_int_k(int op, T *y, const T *x, hp__cu_walk kept, hp__cu_walk red,
                             int64_t n_red) {
    int64_t o = blockIdx.x;
    const T *base = x + hp__walk_off(kept, 0, o);
    __shared__ unsigned long long part[HP__CU_THREADS];
    __shared__ long long mx[HP__CU_THREADS];
    unsigned long long acc = 0;
    long long m = LLONG_MIN;
    for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x) {
        long long v = (long long)base[hp__walk_off(red, 0, r)];
        acc += (unsigned long long)v;
        m = v > m ? v : m;
    }
    part[threadIdx.x] = acc;
    mx[threadIdx.x] = m;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            part[threadIdx.x] += part[threadIdx.x + w];
            mx[threadIdx.x] =
                mx[threadIdx.x + w] > mx[threadIdx.x] ? mx[threadIdx.x + w] : mx[threadIdx.x];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (op == HP__CU_AMAX)
            y[o] = (T)mx[0];
        else if (op == HP__CU_MEAN)
            y[o] = (T)((long long)part[0] / (n_red > 0 ? n_red : 1));
        else
            y[o] = (T)(long long)part[0];
    }
}

extern "C" int hp__cu_reduce(cudaStream_t s, int op, int dtype, void *y, const void *x,
                             const hp__cu_walk *kept_walk, int64_t n_out,
                             const hp__cu_walk *red_walk, int64_t n_red) {
    if (n_out == 0) return 0;
    if (n_out > 0x7fffffff) return (int)cudaErrorInvalidConfiguration;
    hp__cu_walk kw = *kept_walk, rw = *red_walk, *kept = &kw, *red = &rw;
    hp__cu_walk_fast(kept, n_out);
    hp__cu_walk_fast(red, n_red);
    unsigned g = (unsigned)n_out;
    if (dtype == HP__CU_F32)
        reduce_f32_k<<<g, HP__CU_THREADS, 0, s>>>(op, (float *)y, (const float *)x, *kept, *red,
                                                  n_red);
    else if (dtype == HP__CU_I32)
        reduce_int_k<int32_t>
            <<<g, HP__CU_THREADS, 0, s>>>(op, (int32_t *)y, (const int32_t *)x, *kept, *red, n_red);
    else
        reduce_int_k<int64_t>
            <<<g, HP__CU_THREADS, 0, s>>>(op, (int64_t *)y, (const int64_t *)x, *kept, *red, n_red);
    return HP__CU_LAUNCHED();
}
