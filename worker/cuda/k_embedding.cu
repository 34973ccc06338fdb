/* worker/cuda/k_embedding.cu — embedding lookup and its dense backward, and the vocab-parallel
 * chunked forms; f32 or bf16 storage, f32 sums, bf16 rounded once on store.
 *
 * The backwards are deterministic, with no atomics, and sum as the cpu backend does: each
 * (row, position) pair the forward read becomes a 64-bit key row << 32 | position; a bitonic
 * sort orders the keys by row, then position; one block per run of equal rows sums that run's
 * gradient rows in position order in f32 (0 + g[p0] + g[p1] + ...). The result is the cpu
 * backend's to the bit, run after run. Indices outside [0, V) are recorded in the fault word
 * (reported at the next synchronize), never read. */
#include "worker/cuda/k_common.cuh"

#define NO_KEY       0xffffffffffffffffull /* sorts last: a position that adds to no row */
#define SORT_TILE    1024                  /* keys a block sorts in shared memory (8 KiB) */
#define SORT_THREADS (SORT_TILE / 2)       /* one compare-exchange each per stage */

typedef unsigned long long key_t_;

/* ---- lookup --------------------------------------------------------------------------------- */

template <typename T>
__global__ void embedding_k(T *y, const T *w, const void *idx, int is64, int64_t n, int64_t v,
                            int64_t d, hp__cu_fault *fault) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, k = i - p * d;
        int64_t r = hp__index(idx, is64, p);
        if (r < 0 || r >= v) {
            if (k == 0) hp__fault(fault, HP__CU_FAULT_EMBEDDING_INDEX, r, p, v);
            hp__st(y, i, 0.0f);
        } else {
            y[i] = w[r * d + k];
        }
    }
}

extern "C" int hp__cu_embedding(cudaStream_t s, int dtype, void *y, const void *w, const void *idx,
                                int is64, int64_t n, int64_t v, int64_t d, hp__cu_fault *fault) {
    if (n * d == 0) return 0;
    if (dtype == HP__CU_BF16)
        embedding_k<__nv_bfloat16><<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)w, idx, is64, n, v, d, fault);
    else
        embedding_k<float><<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(
            (float *)y, (const float *)w, idx, is64, n, v, d, fault);
    return HP__CU_LAUNCHED();
}

/* chunked_embedding: w holds k chunks of `rows` rows; chunk c covers the indices
 * [base[c], base[c] + rows). A position sums the rows of the chunks holding its index, in chunk
 * order, so an index no chunk holds reads zeros (the vocab-parallel embedding: the partial sums
 * are reduced across ranks afterwards). */
template <typename T>
__global__ void chunked_embedding_k(T *y, const T *w, const void *idx, int idx64, const void *base,
                                    int base64, int64_t n, int64_t k, int64_t rows, int64_t d) {
    HP__CU_FOR(i, n * d) {
        int64_t p = i / d, x = i - p * d;
        int64_t id = hp__index(idx, idx64, p);
        float acc = 0.0f;
        for (int64_t c = 0; c < k; c++) {
            int64_t at = id - hp__index(base, base64, c);
            if (at >= 0 && at < rows) acc += hp__ld(w, (c * rows + at) * d + x);
        }
        hp__st(y, i, acc);
    }
}

extern "C" int hp__cu_chunked_embedding(cudaStream_t s, int dtype, void *y, const void *w,
                                        const void *idx, int idx64, const void *base, int base64,
                                        int64_t n, int64_t k, int64_t rows, int64_t d) {
    if (n * d == 0) return 0;
    if (dtype == HP__CU_BF16)
        chunked_embedding_k<__nv_bfloat16><<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)w, idx, idx64, base, base64, n, k, rows, d);
    else
        chunked_embedding_k<float><<<hp__cu_blocks(n * d), HP__CU_THREADS, 0, s>>>(
            (float *)y, (const float *)w, idx, idx64, base, base64, n, k, rows, d);
    return HP__CU_LAUNCHED();
}

/* ---- the keys ------------------------------------------------------------------------------- */

/* keys[p] for p < n2: row idx[p] << 32 | p when the index is in [0, v) and not pad; NO_KEY for
 * the padding row, a faulting index and the tail past n. */
__global__ void emb_keys_k(key_t_ *keys, const void *idx, int is64, int64_t n, int64_t n2,
                           int64_t v, int64_t pad, hp__cu_fault *fault) {
    HP__CU_FOR(p, n2) {
        key_t_ key = NO_KEY;
        if (p < n) {
            int64_t r = hp__index(idx, is64, p);
            if (r < 0 || r >= v)
                hp__fault(fault, HP__CU_FAULT_EMBEDDING_INDEX, r, p, v);
            else if (r != pad)
                key = (key_t_)r << 32 | (key_t_)p;
        }
        keys[p] = key;
    }
}

/* keys[p·k + c] for chunk c holding position p's index: (c·rows + index − base[c]) << 32 | p. */
__global__ void chunked_keys_k(key_t_ *keys, const void *idx, int idx64, const void *base,
                               int base64, int64_t n, int64_t k, int64_t rows, int64_t n2) {
    HP__CU_FOR(j, n2) {
        key_t_ key = NO_KEY;
        if (j < n * k) {
            int64_t p = j / k, c = j - p * k;
            int64_t at = hp__index(idx, idx64, p) - hp__index(base, base64, c);
            if (at >= 0 && at < rows) key = (key_t_)(c * rows + at) << 32 | (key_t_)p;
        }
        keys[j] = key;
    }
}

/* ---- the bitonic sort ------------------------------------------------------------------------
 * Stage (k, j) compare-exchanges keys i and i + j (i's bit j clear), ascending where i & k is 0.
 * Stages with j below the tile run in shared memory, a tile a block; the others one launch
 * each. n2, the key count, is a power of two. */

__device__ __forceinline__ void cmp_swap(key_t_ *a, key_t_ *b, bool up) {
    key_t_ x = *a, y = *b;
    if ((x > y) == up) {
        *a = y;
        *b = x;
    }
}

/* Stages k = k0, 2·k0, ..., k1 of the block's tile, each for j from min(k / 2, tile / 2) to 1. */
__global__ void bitonic_tile_k(key_t_ *keys, int tile, int64_t k0, int64_t k1) {
    __shared__ key_t_ sk[SORT_TILE];
    int64_t base = (int64_t)blockIdx.x * tile;
    for (int t = threadIdx.x; t < tile; t += blockDim.x) sk[t] = keys[base + t];
    __syncthreads();
    for (int64_t k = k0; k <= k1; k <<= 1) {
        for (int j = (k >> 1) < tile ? (int)(k >> 1) : tile >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < tile / 2; t += blockDim.x) {
                int i = 2 * j * (t / j) + t % j;
                cmp_swap(&sk[i], &sk[i + j], ((base + i) & k) == 0);
            }
            __syncthreads();
        }
    }
    for (int t = threadIdx.x; t < tile; t += blockDim.x) keys[base + t] = sk[t];
}

__global__ void bitonic_step_k(key_t_ *keys, int64_t n2, int64_t j, int64_t k) {
    HP__CU_FOR(t, n2 / 2) {
        int64_t i = 2 * j * (t / j) + t % j;
        cmp_swap(&keys[i], &keys[i + j], (i & k) == 0);
    }
}

static void sort_keys(cudaStream_t s, key_t_ *keys, int64_t n2) {
    if (n2 < 2) return;
    int tile = n2 < SORT_TILE ? (int)n2 : SORT_TILE;
    unsigned tiles = (unsigned)(n2 / tile);
    bitonic_tile_k<<<tiles, SORT_THREADS, 0, s>>>(keys, tile, 2, tile);
    for (int64_t k = 2 * (int64_t)tile; k <= n2; k <<= 1) {
        for (int64_t j = k >> 1; j >= tile; j >>= 1)
            bitonic_step_k<<<hp__cu_blocks(n2 / 2), HP__CU_THREADS, 0, s>>>(keys, n2, j, k);
        bitonic_tile_k<<<tiles, SORT_THREADS, 0, s>>>(keys, tile, k, k);
    }
}

/* ---- the sums ------------------------------------------------------------------------------- */

/* A block per key that starts a run of its row: gw[row, :] = 0 + g[p0, :] + g[p1, :] + ... over
 * the run's positions, in order. The rows no key names were zeroed before. */
template <typename TG, typename TY>
__global__ void run_sums_k(TY *gw, const TG *g, const key_t_ *keys, int64_t n_keys, int64_t d) {
    for (int64_t i = blockIdx.x; i < n_keys; i += gridDim.x) {
        key_t_ row = keys[i] >> 32;
        if (keys[i] == NO_KEY || (i > 0 && (keys[i - 1] >> 32) == row)) continue;
        for (int64_t x = threadIdx.x; x < d; x += blockDim.x) {
            float acc = 0.0f;
            for (int64_t j = i; j < n_keys && (keys[j] >> 32) == row; j++)
                acc += hp__ld(g, (int64_t)(keys[j] & 0xffffffffull) * d + x);
            hp__st(gw, (int64_t)row * d + x, acc);
        }
    }
}

static int64_t pow2_at_least(int64_t n) {
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

extern "C" size_t hp__cu_embedding_backward_scratch(int64_t n_keys) {
    return (size_t)pow2_at_least(n_keys) * sizeof(key_t_);
}

template <typename TG, typename TY>
static void sums(cudaStream_t s, void *gw, const void *g, const key_t_ *keys, int64_t n_keys,
                 int64_t d) {
    unsigned blocks = (unsigned)(n_keys < (1 << 20) ? n_keys : (1 << 20));
    run_sums_k<TG, TY><<<blocks, HP__CU_THREADS, 0, s>>>((TY *)gw, (const TG *)g, keys, n_keys, d);
}

/* Zeroes gw [rows, d] of ydt, sorts the n_keys keys (scratch: their power-of-two padding) and
 * sums the runs. */
static int sort_and_sum(cudaStream_t s, int gdt, int ydt, void *gw, const void *g, key_t_ *keys,
                        int64_t n_keys, int64_t rows, int64_t d) {
    size_t ysz = ydt == HP__CU_BF16 ? 2 : 4;
    cudaError_t e = cudaMemsetAsync(gw, 0, (size_t)(rows * d) * ysz, s);
    if (e != cudaSuccess || n_keys == 0 || d == 0) return (int)e;
    sort_keys(s, keys, pow2_at_least(n_keys));
    typedef __nv_bfloat16 B;
    if (gdt == HP__CU_BF16 && ydt == HP__CU_BF16)
        sums<B, B>(s, gw, g, keys, n_keys, d);
    else if (gdt == HP__CU_BF16)
        sums<B, float>(s, gw, g, keys, n_keys, d);
    else if (ydt == HP__CU_BF16)
        sums<float, B>(s, gw, g, keys, n_keys, d);
    else
        sums<float, float>(s, gw, g, keys, n_keys, d);
    return HP__CU_LAUNCHED();
}

extern "C" int hp__cu_embedding_backward(cudaStream_t s, int gdt, int ydt, void *gw, const void *g,
                                         const void *idx, int is64, int64_t n, int64_t v, int64_t d,
                                         int64_t pad, void *scratch, hp__cu_fault *fault) {
    key_t_ *keys = (key_t_ *)scratch;
    if (n > 0) {
        int64_t n2 = pow2_at_least(n);
        emb_keys_k<<<hp__cu_blocks(n2), HP__CU_THREADS, 0, s>>>(keys, idx, is64, n, n2, v, pad,
                                                                fault);
        int e = HP__CU_LAUNCHED();
        if (e) return e;
    }
    return sort_and_sum(s, gdt, ydt, gw, g, keys, n, v, d);
}

extern "C" int hp__cu_chunked_embedding_backward(cudaStream_t s, int gdt, int ydt, void *gw,
                                                 const void *g, const void *idx, int idx64,
                                                 const void *base, int base64, int64_t n, int64_t k,
                                                 int64_t rows, int64_t d, void *scratch) {
    key_t_ *keys = (key_t_ *)scratch;
    if (n * k > 0) {
        int64_t n2 = pow2_at_least(n * k);
        chunked_keys_k<<<hp__cu_blocks(n2), HP__CU_THREADS, 0, s>>>(keys, idx, idx64, base, base64,
                                                                    n, k, rows, n2);
        int e = HP__CU_LAUNCHED();
        if (e) return e;
    }
    return sort_and_sum(s, gdt, ydt, gw, g, keys, n * k, k * rows, d);
}
