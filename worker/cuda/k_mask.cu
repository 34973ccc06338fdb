/* worker/cuda/k_mask.cu — the masking and index ops exported PyTorch models use (GPT-2 style
 * graphs; the Llama builders make none of them), the cpu backend's formulas
 * (worker/cpu/k_mask.c): tril (any element size), bitwise_not (bool, i32, i64), arange (i32,
 * i64, f32), native_dropout and its backward (f32). The dropout mask is hp/rng.h's: element g
 * of the whole tensor (this rank's piece sits at the site's offsets) is dropped when word g % 4
 * of Philox4x32-10 at (seed, stream + step·φ, g / 4) is below round(p·2^32), so a cuda rank
 * drops exactly the elements a cpu rank drops. */
#include "worker/cuda/k_common.cuh"

/* ---- tril ----------------------------------------------------------------------------------- */

template <typename T>
__global__ void tril_k(T *y, const T *x, int64_t m, int64_t n, int64_t diag, int64_t total) {
    HP__CU_FOR(i, total) {
        int64_t col = i % n, row = (i / n) % m;
        y[i] = col - row <= diag ? x[i] : T(0);
    }
}

extern "C" int hp__cu_tril(cudaStream_t s, size_t esize, void *y, const void *x, int64_t m,
                           int64_t n, int64_t diag, int64_t total) {
    if (total == 0) return 0;
    unsigned g = hp__cu_blocks(total);
    switch (esize) {
    case 1:
        tril_k<uint8_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint8_t *)y, (const uint8_t *)x, m, n, diag, total);
        break;
    case 2:
        tril_k<uint16_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint16_t *)y, (const uint16_t *)x, m, n, diag, total);
        break;
    case 4:
        tril_k<uint32_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint32_t *)y, (const uint32_t *)x, m, n, diag, total);
        break;
    default:
        tril_k<uint64_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint64_t *)y, (const uint64_t *)x, m, n, diag, total);
        break;
    }
    return HP__CU_LAUNCHED();
}

/* ---- bitwise_not, arange -------------------------------------------------------------------- */

__global__ void not_k(int dtype, void *y, const void *x, int64_t n) {
    HP__CU_FOR(i, n) {
        if (dtype == HP__CU_BOOL)
            ((uint8_t *)y)[i] = ((const uint8_t *)x)[i] == 0;
        else if (dtype == HP__CU_I32)
            ((int32_t *)y)[i] = ~((const int32_t *)x)[i];
        else
            ((int64_t *)y)[i] = ~((const int64_t *)x)[i];
    }
}

extern "C" int hp__cu_bitwise_not(cudaStream_t s, int dtype, void *y, const void *x, int64_t n) {
    if (n == 0) return 0;
    not_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(dtype, y, x, n);
    return HP__CU_LAUNCHED();
}

__global__ void arange_k(int dtype, void *y, int64_t start, int64_t step, int64_t n) {
    HP__CU_FOR(i, n) {
        int64_t v = start + i * step;
        if (dtype == HP__CU_I64)
            ((int64_t *)y)[i] = v;
        else if (dtype == HP__CU_I32)
            ((int32_t *)y)[i] = (int32_t)v;
        else
            ((float *)y)[i] = (float)v;
    }
}

extern "C" int hp__cu_arange(cudaStream_t s, int dtype, void *y, int64_t start, int64_t step,
                             int64_t n) {
    if (n == 0) return 0;
    arange_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(dtype, y, start, step, n);
    return HP__CU_LAUNCHED();
}

/* ---- dropout -------------------------------------------------------------------------------- */

/* graph/rng.c's Philox4x32-10 (the paper's constants). */
__device__ __forceinline__ void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    HP__UNROLL
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (uint32_t)p1;
        c[2] = n2;
        c[3] = (uint32_t)p0;
    }
}

/* Element i of this rank's piece kept? (hp_dropout_keep, one element) */
__device__ __forceinline__ bool keep_at(const hp__cu_dropout_draw &d, int64_t i) {
    uint64_t g = 0;
    int64_t rem = i, gst = 1;
    for (int k = d.rank - 1; k >= 0; k--) {
        int64_t idx = d.local[k] ? rem % d.local[k] : 0;
        rem = d.local[k] ? rem / d.local[k] : 0;
        g += (uint64_t)(d.off[k] + idx) * (uint64_t)gst;
        gst *= d.global[k];
    }
    uint64_t q = g >> 2;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)d.stream,
                     (uint32_t)(d.stream >> 32)};
    philox(c, (uint32_t)d.seed, (uint32_t)(d.seed >> 32));
    uint32_t w = (g & 3) == 0 ? c[0] : (g & 3) == 1 ? c[1] : (g & 3) == 2 ? c[2] : c[3];
    return w >= d.threshold;
}

__global__ void dropout_k(hp__cu_dropout_draw d, float *y, uint8_t *mask, const float *x,
                          int64_t n) {
    HP__CU_FOR(i, n) {
        bool k = keep_at(d, i);
        mask[i] = k;
        y[i] = k ? x[i] * d.scale : 0.0f;
    }
}

extern "C" int hp__cu_dropout(cudaStream_t s, const hp__cu_dropout_draw *d, float *y, uint8_t *mask,
                              const float *x, int64_t n) {
    if (n == 0) return 0;
    dropout_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(*d, y, mask, x, n);
    return HP__CU_LAUNCHED();
}

__global__ void dropout_bw_k(float *gx, const float *g, const uint8_t *mask, float scale,
                             int64_t n) {
    HP__CU_FOR(i, n) gx[i] = mask[i] ? g[i] * scale : 0.0f;
}

extern "C" int hp__cu_dropout_backward(cudaStream_t s, float *gx, const float *g,
                                       const uint8_t *mask, float scale, int64_t n) {
    if (n == 0) return 0;
    dropout_bw_k<<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>(gx, g, mask, scale, n);
    return HP__CU_LAUNCHED();
}
