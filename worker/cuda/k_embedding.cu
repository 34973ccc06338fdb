/* worker/cuda/k_embedding.cu — embedding lookup and its dense backward. The backward
 * accumulates rows with atomicAdd (f32), so its sums may differ from the cpu backend's
 * position-order sums in the last bits; indices outside [0, V) are recorded in the fault word
 * (reported at the next synchronize), never read. */
#include "worker/cuda/k_common.cuh"

__global__ void embedding_k(float *y, const float *w, const void *idx, int is64, int64_t n,
                            int64_t v, int64_t d, hp__cu_fault *fault) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, k = i - p * d;
        int64_t r = hp__index(idx, is64, p);
        if (r < 0 || r >= v) {
            if (k == 0) hp__fault(fault, HP__CU_FAULT_EMBEDDING_INDEX, r, p, v);
            y[i] = 0.0f;
        } else {
            y[i] = w[r * d + k];
        }
    }
}

extern "C" int hp__cu_embedding(cudaStream_t s, float *y, const float *w, const void *idx, int is64,
                                int64_t n, int64_t v, int64_t d, hp__cu_fault *fault) {
    if (n * d == 0) return 0;
    embedding_k<<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(y, w, idx, is64, n, v, d, fault);
    return HP__CU_LAUNCHED();
}

__global__ void embedding_bw_k(float *gw, const float *g, const void *idx, int is64, int64_t n,
                               int64_t v, int64_t d, int64_t pad, hp__cu_fault *fault) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, k = i - p * d;
        int64_t r = hp__index(idx, is64, p);
        if (r < 0 || r >= v) {
            if (k == 0) hp__fault(fault, HP__CU_FAULT_EMBEDDING_INDEX, r, p, v);
        } else if (r != pad) {
            atomicAdd(&gw[r * d + k], g[i]);
        }
    }
}

extern "C" int hp__cu_embedding_backward(cudaStream_t s, float *gw, const float *g, const void *idx,
                                         int is64, int64_t n, int64_t v, int64_t d, int64_t pad,
                                         hp__cu_fault *fault) {
    cudaError_t e = cudaMemsetAsync(gw, 0, (size_t)(v * d) * sizeof(float), s);
    if (e != cudaSuccess || n * d == 0) return (int)e;
    embedding_bw_k<<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(gw, g, idx, is64, n, v, d, pad,
                                                                   fault);
    return HP__CU_LAUNCHED();
}

/* chunked_embedding: w holds k chunks of `rows` rows; chunk c covers the indices
 * [base[c], base[c] + rows). A position sums the rows of the chunks holding its index, so an
 * index no chunk holds reads zeros (the vocab-parallel embedding: the partial sums are reduced
 * across ranks afterwards). */
__global__ void chunked_embedding_k(float *y, const float *w, const void *idx, int idx64,
                                    const void *base, int base64, int64_t n, int64_t k,
                                    int64_t rows, int64_t d) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, x = i - p * d;
        int64_t id = hp__index(idx, idx64, p);
        float acc = 0.0f;
        for (int64_t c = 0; c < k; c++) {
            int64_t at = id - hp__index(base, base64, c);
            if (at >= 0 && at < rows) acc += w[(c * rows + at) * d + x];
        }
        y[i] = acc;
    }
}

extern "C" int hp__cu_chunked_embedding(cudaStream_t s, float *y, const float *w, const void *idx,
                                        int idx64, const void *base, int base64, int64_t n,
                                        int64_t k, int64_t rows, int64_t d) {
    if (n * d == 0) return 0;
    chunked_embedding_k<<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(y, w, idx, idx64, base,
                                                                        base64, n, k, rows, d);
    return HP__CU_LAUNCHED();
}

__global__ void chunked_embedding_bw_k(float *gw, const float *g, const void *idx, int idx64,
                                       const void *base, int base64, int64_t n, int64_t k,
                                       int64_t rows, int64_t d) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, x = i - p * d;
        int64_t id = hp__index(idx, idx64, p);
        for (int64_t c = 0; c < k; c++) {
            int64_t at = id - hp__index(base, base64, c);
            if (at >= 0 && at < rows) atomicAdd(&gw[(c * rows + at) * d + x], g[i]);
        }
    }
}

extern "C" int hp__cu_chunked_embedding_backward(cudaStream_t s, float *gw, const float *g,
                                                 const void *idx, int idx64, const void *base,
                                                 int base64, int64_t n, int64_t k, int64_t rows,
                                                 int64_t d) {
    cudaError_t e = cudaMemsetAsync(gw, 0, (size_t)(k * rows * d) * sizeof(float), s);
    if (e != cudaSuccess || n * d == 0) return (int)e;
    chunked_embedding_bw_k<<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(gw, g, idx, idx64, base,
                                                                           base64, n, k, rows, d);
    return HP__CU_LAUNCHED();
}
