/* worker/cuda/k_cross_entropy.cu — the fused cross entropy (fused_cross_entropy and its
 * backward, made by passes/fuse_cross_entropy.c): the loss's _log_softmax, nll_loss and their
 * backwards in three kernels that read the logits as they are (f32 or bf16), so neither the
 * f32 copy of the logits nor the [N, C] log-probabilities and their gradient exist.
 *
 *   ce_lse_k   a block a row: each thread's online (max, sum of exp) over its columns in one
 *              pass (16-byte loads when the row allows), then the block's; lse = m + ln s
 *              (−inf for a row of −inf, NaN from any NaN)
 *   ce_loss_k  one block: Σ (lse − logits[r, target]) over the rows not ignored, in double,
 *              and their count (total_weight); mean divides
 *   ce_back_k  a block a row: g'·(exp(logits − lse) − onehot(target)) rounded once to the
 *              logits' dtype, g' = grad (÷ total_weight for mean); ignored rows zeros
 *
 * A target outside [0, C) other than ignore_index is a fault (reported at synchronize), as in
 * nll_loss. */
#include "worker/cuda/k_common.cuh"

#include <math.h>

/* (m, s) += v: the running max and the sum of exp(x − m) over what was seen. */
__device__ __forceinline__ void online_add(float &m, double &s, float v) {
    if (v > m) {
        s = s * (double)expf(m - v) + 1.0; /* m = −inf: exp(−inf) = 0 */
        m = v;
    } else if (v != -INFINITY) {
        s += (double)expf(v - m); /* NaN stays NaN */
    }
}

template <typename T>
__global__ void ce_lse_k(float *lse, const T *x, int64_t rows, int64_t classes, int vec) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * classes;
        float m = -INFINITY;
        double s = 0.0;
        if (vec) {
            for (int64_t c = 8 * (int64_t)threadIdx.x; c < classes; c += 8 * (int64_t)blockDim.x) {
                float f[8];
                hp__ld8<T>(xr + c, f);
                HP__UNROLL
                for (int k = 0; k < 8; k++) online_add(m, s, f[k]);
            }
        } else {
            for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
                online_add(m, s, hp__ld<T>(xr, c));
        }
        float mb = hp__block_max(m);
        double part = s == 0.0 ? 0.0 : s * (double)expf(m - mb); /* s NaN: NaN */
        double sum = hp__block_sum(part);
        if (threadIdx.x == 0) lse[r] = mb == -INFINITY ? -INFINITY : (float)((double)mb + log(sum));
    }
}

template <typename T>
__global__ void ce_loss_k(float *loss, float *total_weight, const float *lse, const T *x,
                          const void *target, int is64, int64_t rows, int64_t classes, int mean,
                          int64_t ignore, hp__cu_fault *fault) {
    double sum = 0, count = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        int64_t t = hp__index(target, is64, r);
        if (t == ignore) continue;
        if (t < 0 || t >= classes) {
            hp__fault(fault, HP__CU_FAULT_NLL_TARGET, t, r, classes);
            continue;
        }
        sum += (double)lse[r] - (double)hp__ld<T>(x, r * classes + t);
        count += 1;
    }
    sum = hp__block_sum(sum);
    count = hp__block_sum(count);
    if (threadIdx.x == 0) {
        *loss = (float)(mean ? sum / count : sum); /* all ignored: 0/0 = NaN, as torch */
        *total_weight = (float)count;
    }
}

template <typename T>
__global__ void ce_back_k(T *gx, const float *grad, const T *x, const void *target, int is64,
                          const float *lse, const float *total_weight, int64_t rows,
                          int64_t classes, int mean, int64_t ignore, int vec, hp__cu_fault *fault) {
    float g = mean ? (float)((double)*grad / (double)*total_weight) : *grad;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = hp__index(target, is64, r);
        bool zero = t == ignore;
        if (!zero && (t < 0 || t >= classes)) {
            if (threadIdx.x == 0) hp__fault(fault, HP__CU_FAULT_NLL_TARGET, t, r, classes);
            zero = true;
        }
        const T *xr = x + r * classes;
        T *gr = gx + r * classes;
        float l = lse[r], gz = zero ? 0.0f : g;
        if (vec) {
            for (int64_t c = 8 * (int64_t)threadIdx.x; c < classes; c += 8 * (int64_t)blockDim.x) {
                float f[8];
                hp__ld8<T>(xr + c, f);
                HP__UNROLL
                for (int k = 0; k < 8; k++)
                    f[k] = zero ? 0.0f : gz * (expf(f[k] - l) - (c + k == t ? 1.0f : 0.0f));
                hp__st8<T>(gr + c, f);
            }
        } else {
            for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
                hp__st<T>(gr, c,
                          zero ? 0.0f : gz * (expf(hp__ld<T>(xr, c) - l) - (c == t ? 1.0f : 0.0f)));
        }
    }
}

static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16);
}

template <typename T>
static int ce_forward(cudaStream_t s, float *loss, float *total_weight, float *lse, const T *x,
                      const void *target, int is64, int64_t rows, int64_t classes, int mean,
                      int64_t ignore, hp__cu_fault *fault) {
    int vec = classes % 8 == 0 && hp__vec8_ok(x, x, x);
    if (rows > 0) {
        ce_lse_k<T><<<row_blocks(rows), HP__CU_THREADS, 0, s>>>(lse, x, rows, classes, vec);
        int e = HP__CU_LAUNCHED();
        if (e) return e;
    }
    ce_loss_k<T><<<1, 1024, 0, s>>>(loss, total_weight, lse, x, target, is64, rows, classes, mean,
                                    ignore, fault);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_cross_entropy(cudaStream_t s, int dt, float *loss, float *total_weight,
                                    float *lse, const void *x, const void *target, int is64,
                                    int64_t rows, int64_t classes, int mean, int64_t ignore,
                                    hp__cu_fault *fault) {
    if (dt == HP__CU_BF16)
        return ce_forward(s, loss, total_weight, lse, (const __nv_bfloat16 *)x, target, is64, rows,
                          classes, mean, ignore, fault);
    return ce_forward(s, loss, total_weight, lse, (const float *)x, target, is64, rows, classes,
                      mean, ignore, fault);
}

extern "C" int hp__cu_cross_entropy_backward(cudaStream_t s, int dt, void *gx, const float *grad,
                                             const void *x, const void *target, int is64,
                                             const float *lse, const float *total_weight,
                                             int64_t rows, int64_t classes, int mean,
                                             int64_t ignore, hp__cu_fault *fault) {
    if (rows == 0 || classes == 0) return 0;
    int vec = classes % 8 == 0 && hp__vec8_ok(x, gx, gx);
    if (dt == HP__CU_BF16)
        ce_back_k<__nv_bfloat16><<<row_blocks(rows), HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)gx, grad, (const __nv_bfloat16 *)x, target, is64, lse, total_weight,
            rows, classes, mean, ignore, vec, fault);
    else
        ce_back_k<float><<<row_blocks(rows), HP__CU_THREADS, 0, s>>>(
            (float *)gx, grad, (const float *)x, target, is64, lse, total_weight, rows, classes,
            mean, ignore, vec, fault);
    return HP__CU_LAUNCHED();
}
