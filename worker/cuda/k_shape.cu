/* worker/cuda/k_shape.cu — the strided copy behind every data-movement op of the cuda backend
 * (permute, transpose, t, expand, slice, slice_backward, cat; contiguous copies go through
 * cudaMemcpyAsync instead). Pure data movement: bits in, bits out.
 *
 * Three forms, picked by the launcher from the walk: rows that stay contiguous on both sides
 * (a [B,T,H,D] <-> [B,H,T,D] transpose, a slice of whole rows) move 16 bytes a thread; a swap
 * of the last two dims with the destination contiguous (t, a batched matrix transpose) goes
 * through a 32x32 tile in shared memory, so that reads and writes are both coalesced; anything
 * else walks element by element. */
#include "worker/cuda/k_common.cuh"

#include <string.h>

template <typename T>
__global__ void strided_copy_k(T *dst, const T *src, hp__cu_walk w, int64_t n) {
    HP__CU_FOR(i, n) dst[hp__walk_off(w, 0, i)] = src[hp__walk_off(w, 1, i)];
}

/* dst[b][r][c] = src[off(b) + r + c·cs] for batches b of the leading dims (lead: their walk,
 * operand 0 dst's and 1 src's strides), rows × cols each; dst rows contiguous. */
#define TILE 32
template <typename T>
__global__ void transpose_k(T *dst, const T *src, hp__cu_walk lead, int64_t batches, int64_t rows,
                            int64_t cols, int64_t cs) {
    __shared__ T tile[TILE][TILE + 1];
    int64_t r0 = (int64_t)blockIdx.y * TILE, c0 = (int64_t)blockIdx.x * TILE;
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
        const T *sb = src + hp__walk_off(lead, 1, b);
        T *db = dst + hp__walk_off(lead, 0, b);
        __syncthreads(); /* the last batch's tile is read */
        for (int c = ty; c < TILE; c += blockDim.y)
            if (r0 + tx < rows && c0 + c < cols) tile[c][tx] = sb[(r0 + tx) + (c0 + c) * cs];
        __syncthreads();
        for (int r = ty; r < TILE; r += blockDim.y)
            if (r0 + r < rows && c0 + tx < cols) db[(r0 + r) * cols + c0 + tx] = tile[tx][r];
    }
}

template <typename T>
static void launch_walk(cudaStream_t s, void *dst, const void *src, const hp__cu_walk *w,
                        int64_t n) {
    hp__cu_walk f = *w;
    hp__cu_walk_fast(&f, n);
    strided_copy_k<T><<<hp__cu_blocks(n), HP__CU_THREADS, 0, s>>>((T *)dst, (const T *)src, f, n);
}

template <typename T>
static void launch_transpose(cudaStream_t s, void *dst, const void *src, const hp__cu_walk *lead,
                             int64_t batches, int64_t rows, int64_t cols, int64_t cs) {
    dim3 g((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE),
           (unsigned)(batches < 65535 ? batches : 65535));
    hp__cu_walk f = *lead;
    hp__cu_walk_fast(&f, batches);
    transpose_k<T>
        <<<g, dim3(TILE, 8), 0, s>>>((T *)dst, (const T *)src, f, batches, rows, cols, cs);
}

static void walk_typed(cudaStream_t s, size_t esize, void *dst, const void *src,
                       const hp__cu_walk *w, int64_t n) {
    switch (esize) {
    case 1:
        launch_walk<uint8_t>(s, dst, src, w, n);
        break;
    case 2:
        launch_walk<uint16_t>(s, dst, src, w, n);
        break;
    case 4:
        launch_walk<uint32_t>(s, dst, src, w, n);
        break;
    case 16:
        launch_walk<uint4>(s, dst, src, w, n);
        break;
    default:
        launch_walk<uint64_t>(s, dst, src, w, n);
        break;
    }
}

/* The walk in 16-byte units when the last dim is contiguous on both sides and every stride,
 * both pointers and the row are 16-byte multiples. */
static bool as_vec16(const hp__cu_walk *w, size_t esize, const void *dst, const void *src,
                     hp__cu_walk *v, int64_t *n) {
    int last = w->rank - 1;
    if (last < 0 || w->st[0][last] != 1 || w->st[1][last] != 1) return false;
    if ((w->shape[last] * (int64_t)esize) % 16 || ((uintptr_t)dst | (uintptr_t)src) % 16)
        return false;
    int64_t per = 16 / (int64_t)esize;
    *v = *w;
    *n = 1;
    for (int d = 0; d < w->rank; d++) {
        for (int k = 0; k < 2 && d < last; k++) {
            if (w->st[k][d] % per) return false;
            v->st[k][d] = w->st[k][d] / per;
        }
        if (d == last) v->shape[d] = w->shape[d] / per;
        *n *= v->shape[d];
    }
    return true;
}

/* The last two dims swapped into a contiguous destination: src's stride along dst's rows is 1. */
static bool as_transpose(const hp__cu_walk *w, hp__cu_walk *lead, int64_t *batches, int64_t *rows,
                         int64_t *cols, int64_t *cs) {
    int r = w->rank - 2, c = w->rank - 1;
    if (r < 0 || w->st[1][r] != 1 || w->st[0][c] != 1 || w->st[0][r] != w->shape[c] ||
        w->shape[r] < 2 || w->shape[c] < 2)
        return false;
    memset(lead, 0, sizeof *lead);
    lead->rank = r;
    *batches = 1;
    for (int d = 0; d < r; d++) {
        lead->shape[d] = w->shape[d];
        lead->st[0][d] = w->st[0][d];
        lead->st[1][d] = w->st[1][d];
        *batches *= w->shape[d];
    }
    *rows = w->shape[r];
    *cols = w->shape[c];
    *cs = w->st[1][c];
    return (*cols + TILE - 1) / TILE <= 0x7fffffff && (*rows + TILE - 1) / TILE <= 65535;
}

extern "C" int hp__cu_strided_copy(cudaStream_t s, size_t esize, void *dst, const void *src,
                                   const hp__cu_walk *w, int64_t n) {
    if (n == 0) return 0;
    hp__cu_walk v;
    int64_t nv, batches, rows, cols, cs;
    if (as_vec16(w, esize, dst, src, &v, &nv)) {
        walk_typed(s, 16, dst, src, &v, nv);
    } else if ((esize == 2 || esize == 4) && as_transpose(w, &v, &batches, &rows, &cols, &cs)) {
        if (esize == 2)
            launch_transpose<uint16_t>(s, dst, src, &v, batches, rows, cols, cs);
        else
            launch_transpose<uint32_t>(s, dst, src, &v, batches, rows, cols, cs);
    } else {
        walk_typed(s, esize, dst, src, w, n);
    }
    return HP__CU_LAUNCHED();
}
