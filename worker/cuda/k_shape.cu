/* worker/cuda/k_shape.cu — the strided copy behind every data-movement op of the cuda backend
 * (permute, transpose, t, expand, slice, slice_backward, cat; contiguous copies go through
 * cudaMemcpyAsync instead). Pure data movement: bits in, bits out. */
#include "worker/cuda/k_common.cuh"

template <typename T>
__global__ void strided_copy_k(T *dst, const T *src, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) dst[hp__walk_off(w, 0, i)] = src[hp__walk_off(w, 1, i)];
}

extern "C" int hp__cu_strided_copy(cudaStream_t s, size_t esize, void *dst, const void *src,
                                   const hp__cu_walk *w, int64_t n) {
    if (n == 0) return 0;
    unsigned g = hp__cu_blocks(n);
    switch (esize) {
    case 1:
        strided_copy_k<uint8_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, *w, n);
        break;
    case 2:
        strided_copy_k<uint16_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, *w, n);
        break;
    case 4:
        strided_copy_k<uint32_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, *w, n);
        break;
    default:
        strided_copy_k<uint64_t>
            <<<g, HP__CU_THREADS, 0, s>>>((uint64_t *)dst, (const uint64_t *)src, *w, n);
        break;
    }
    return HP__CU_LAUNCHED();
}
