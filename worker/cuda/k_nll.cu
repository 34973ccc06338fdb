/* worker/cuda/k_nll.cu — nll_loss forward (one block: the sum over rows in double, the count
 * of rows not ignored) and backward (−g, ÷ total_weight for mean, at each row's target). A
 * target outside [0, C) other than ignore_index is a fault (reported at synchronize). */
#include "worker/cuda/k_common.cuh"

#include <math.h>

__global__ void nll_k(float *loss, float *total_weight, const float *logp, const void *target,
                      int is64, int64_t rows, int64_t classes, int reduction, int64_t ignore,
                      hp__cu_fault *fault) {
    double sum = 0, count = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        int64_t t = hp__index(target, is64, r);
        bool skip = t == ignore;
        float l = 0.0f;
        if (!skip && (t < 0 || t >= classes)) {
            hp__fault(fault, HP__CU_FAULT_NLL_TARGET, t, r, classes);
            skip = true;
        } else if (!skip) {
            l = -logp[r * classes + t];
        }
        if (reduction == 0) loss[r] = l;
        sum += l;
        count += !skip;
    }
    sum = hp__block_sum(sum);
    count = hp__block_sum(count);
    if (threadIdx.x == 0) {
        if (reduction == 1) loss[0] = (float)(sum / count); /* all ignored: NaN, as torch */
        if (reduction == 2) loss[0] = (float)sum;
        *total_weight = (float)count;
    }
}

extern "C" int hp__cu_nll(cudaStream_t s, float *loss, float *total_weight, const float *logp,
                          const void *target, int is64, int64_t rows, int64_t classes,
                          int reduction, int64_t ignore, hp__cu_fault *fault) {
    nll_k<<<1, 1024, 0, s>>>(loss, total_weight, logp, target, is64, rows, classes, reduction,
                             ignore, fault);
    return HP__CU_LAUNCHED();
}

__global__ void nll_bw_k(float *gx, const float *g, const void *target, int is64,
                         const float *total_weight, int64_t rows, int64_t classes, int reduction,
                         int64_t ignore, hp__cu_fault *fault) {
    HP__CU_FOR(r, rows) {
        int64_t t = hp__index(target, is64, r);
        if (t == ignore) continue;
        if (t < 0 || t >= classes) {
            hp__fault(fault, HP__CU_FAULT_NLL_TARGET, t, r, classes);
            continue;
        }
        float gr = reduction == 0 ? g[r] : g[0];
        if (reduction == 1) gr = (float)((double)gr / (double)*total_weight);
        gx[r * classes + t] = -gr;
    }
}

extern "C" int hp__cu_nll_backward(cudaStream_t s, float *gx, const float *g, const void *target,
                                   int is64, const float *total_weight, int64_t rows,
                                   int64_t classes, int reduction, int64_t ignore,
                                   hp__cu_fault *fault) {
    cudaError_t e = cudaMemsetAsync(gx, 0, (size_t)(rows * classes) * sizeof(float), s);
    if (e != cudaSuccess || rows == 0) return (int)e;
    nll_bw_k<<<hp__cu_blocks(rows), HP__CU_THREADS, 0, s>>>(gx, g, target, is64, total_weight, rows,
                                                            classes, reduction, ignore, fault);
    return HP__CU_LAUNCHED();
}
