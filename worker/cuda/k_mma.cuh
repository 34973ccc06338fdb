/* worker/cuda/k_mma.cuh — warp-level tensor-core building blocks (sm_80 and later): ldmatrix
 * loads of 8x8 bf16 tiles from shared memory and the m16n8k16 bf16 MMA with f32 accumulators,
 * in the register layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16"). Lane l of a
 * warp, g = l / 4 and q = l % 4:
 *   A (16x16, row-major) a[0] = A[g][2q..2q+1]   a[1] = A[g+8][2q..]  a[2] = A[g][2q+8..]
 *                        a[3] = A[g+8][2q+8..]
 *   B (16x8, k x n)      b[0] = B[2q..2q+1][g]   b[1] = B[2q+8..2q+9][g]
 *   C (16x8, f32)        c[0..1] = C[g][2q..2q+1]   c[2..3] = C[g+8][2q..2q+1]
 * Each 32-bit register holds two bf16, the lower index in the low half. Two C tiles side by side
 * (16x16) are exactly an A fragment once rounded to bf16 (hp__pack_bf16): the flash-attention
 * kernels feed their probabilities back into the next product this way.
 *
 * Under cuemu (HP_CUDA_EMU) the same functions are plain C++ over warp shuffles, lane by lane
 * in the layouts above, so that the kernels run, unchanged, in CI. Compiled for a device
 * older than sm_80 (the build's default archs include sm_75) the MMA and ldmatrix trap: the
 * entries never launch these kernels there (hp__cuda_sdpa_native asks compute capability 8). */
#ifndef HP_WORKER_CUDA_K_MMA_CUH
#define HP_WORKER_CUDA_K_MMA_CUH

#include "worker/cuda/k_common.cuh"

#if !defined(HP_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define HP__MMA_NONE 1 /* no bf16 tensor-core instructions on this target */
#endif

/* Two f32 as a bf16 pair (round to nearest even): lo in the low half. */
__device__ __forceinline__ uint32_t hp__pack_bf16(float lo, float hi) {
#if defined(HP_CUDA_EMU) || defined(HP__MMA_NONE)
    return hp__bf16_bits(lo) | (hp__bf16_bits(hi) << 16);
#else
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

/* ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte
 * aligned, in shared memory); r[i] is this lane's part of matrix i (row l / 4, elements
 * 2(l % 4), +1). */
__device__ __forceinline__ void hp__ldsm_x4(uint32_t r[4], const __nv_bfloat16 *row) {
#ifdef HP_CUDA_EMU
    int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat16 *p = __shfl_sync(0xffffffffu, row, 8 * i + lane / 4);
        const __nv_bfloat16 *e = p + 2 * (lane % 4);
        r[i] = (uint32_t)e[0].__x | ((uint32_t)e[1].__x << 16);
    }
#elif defined(HP__MMA_NONE)
    (void)r, (void)row;
    __trap();
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

/* ldmatrix .x4 .trans: as above, but lane l gets column l / 4 of matrix i, rows 2(l % 4)
 * and 2(l % 4) + 1: a B fragment from a tile stored [k][n]. */
__device__ __forceinline__ void hp__ldsm_x4_t(uint32_t r[4], const __nv_bfloat16 *row) {
#ifdef HP_CUDA_EMU
    int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat16 *p0 = __shfl_sync(0xffffffffu, row, 8 * i + 2 * (lane % 4));
        const __nv_bfloat16 *p1 = __shfl_sync(0xffffffffu, row, 8 * i + 2 * (lane % 4) + 1);
        r[i] = (uint32_t)p0[lane / 4].__x | ((uint32_t)p1[lane / 4].__x << 16);
    }
#elif defined(HP__MMA_NONE)
    (void)r, (void)row;
    __trap();
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

/* cp.async (sm_80 and later): 16 (or 4) bytes from global to shared memory without passing
 * through registers, completing in commit groups: hp__cp_async_wait<N>() returns once at most
 * the N most recent groups are still in flight (then a barrier makes the data the block's).
 * src NULL writes zeros (a source size of 0; `any` is a valid global address the instruction
 * names but does not read). Below sm_80 the copies are plain and synchronous. Under cuemu the
 * destination holds undefined bytes (all ones: NaN) from the issue until the wait that covers
 * the copy's group, when the data lands: a tile read before its wait (or by another thread
 * before the barrier after it) reads NaN and fails the tests; a prefetch into a stage other
 * warps still read poisons it too, caught where the fibers happen to interleave there. */
#ifdef HP_CUDA_EMU
#include <memory>

struct hp__emu_cp {
    unsigned char *dst;
    unsigned char data[16];
    int size;
    long group;
};
struct hp__emu_cpq {
    unsigned long long serial;
    long next; /* the group copies issued now join (commits so far) */
    int n;
    hp__emu_cp q[64];
};
/* This thread's queue, emptied when a new block starts (a block's queues made on first use
 * by each host thread that runs blocks, freed with it). */
static inline hp__emu_cpq &hp__emu_cpq_of() {
    static thread_local std::unique_ptr<hp__emu_cpq[]> qs;
    if (!qs) qs.reset(new hp__emu_cpq[1024]());
    hp__emu_cpq &q = qs[::hp_emu::cur_thread->linear];
    unsigned long long s = ::hp_emu::block_serial();
    if (q.serial != s) {
        q.serial = s;
        q.next = 0;
        q.n = 0;
    }
    return q;
}
static inline void hp__emu_cp_issue(void *dst, const void *src, int size) {
    hp__emu_cpq &q = hp__emu_cpq_of();
    if (q.n == (int)(sizeof q.q / sizeof q.q[0])) { /* deeper than the kernels go: land now */
        if (src)
            memcpy(dst, src, (size_t)size);
        else
            memset(dst, 0, (size_t)size);
        return;
    }
    hp__emu_cp &c = q.q[q.n++];
    c.dst = (unsigned char *)dst;
    c.size = size;
    c.group = q.next;
    if (src)
        memcpy(c.data, src, (size_t)size);
    else
        memset(c.data, 0, (size_t)size);
    memset(dst, 0xff, (size_t)size); /* in flight: undefined until the wait */
}
static inline void hp__emu_cp_wait(int n_newest) {
    hp__emu_cpq &q = hp__emu_cpq_of();
    int keep = 0;
    for (int i = 0; i < q.n; i++) {
        if (q.q[i].group < q.next - n_newest)
            memcpy(q.q[i].dst, q.q[i].data, (size_t)q.q[i].size);
        else
            q.q[keep++] = q.q[i];
    }
    q.n = keep;
}
#endif

__device__ __forceinline__ void hp__cp_async16(void *dst, const void *src, const void *any) {
#ifdef HP_CUDA_EMU
    (void)any;
    hp__emu_cp_issue(dst, src, 16);
#elif defined(HP__MMA_NONE)
    (void)any;
    *(uint4 *)dst = src ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#else
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src ? src : any),
                 "r"(src ? 16 : 0)
                 : "memory");
#endif
}
__device__ __forceinline__ void hp__cp_async4(void *dst, const void *src, const void *any) {
#ifdef HP_CUDA_EMU
    (void)any;
    hp__emu_cp_issue(dst, src, 4);
#elif defined(HP__MMA_NONE)
    (void)any;
    *(uint32_t *)dst = src ? *(const uint32_t *)src : 0u;
#else
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src ? src : any),
                 "r"(src ? 4 : 0)
                 : "memory");
#endif
}
__device__ __forceinline__ void hp__cp_async_commit() {
#ifdef HP_CUDA_EMU
    hp__emu_cpq_of().next++;
#elif !defined(HP__MMA_NONE)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void hp__cp_async_wait() {
#ifdef HP_CUDA_EMU
    hp__emu_cp_wait(N);
#elif !defined(HP__MMA_NONE)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

#ifdef HP_CUDA_EMU
static inline float hp__emu_bf16_lo(uint32_t r) {
    return __bfloat162float(__nv_bfloat16{(unsigned short)(r & 0xffffu)});
}
static inline float hp__emu_bf16_hi(uint32_t r) {
    return __bfloat162float(__nv_bfloat16{(unsigned short)(r >> 16)});
}
#endif

/* c += A · B for one 16x16 A and one 16x8 B fragment (bf16 products, f32 sums). */
__device__ __forceinline__ void hp__mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
#ifdef HP_CUDA_EMU
    int lane = threadIdx.x & 31, g = lane / 4, q = lane % 4;
    float arow[2][16], bcol[2][16]; /* A rows g, g + 8; B columns 2q, 2q + 1 */
    for (int j = 0; j < 4; j++) {
        /* lane 4g + j holds A[g][2j..], A[g+8][2j..], A[g][2j+8..], A[g+8][2j+8..] */
        uint64_t lo = __shfl_sync(0xffffffffu, (uint64_t)a[0] | ((uint64_t)a[1] << 32), 4 * g + j);
        uint64_t hi = __shfl_sync(0xffffffffu, (uint64_t)a[2] | ((uint64_t)a[3] << 32), 4 * g + j);
        arow[0][2 * j] = hp__emu_bf16_lo((uint32_t)lo);
        arow[0][2 * j + 1] = hp__emu_bf16_hi((uint32_t)lo);
        arow[1][2 * j] = hp__emu_bf16_lo((uint32_t)(lo >> 32));
        arow[1][2 * j + 1] = hp__emu_bf16_hi((uint32_t)(lo >> 32));
        arow[0][2 * j + 8] = hp__emu_bf16_lo((uint32_t)hi);
        arow[0][2 * j + 9] = hp__emu_bf16_hi((uint32_t)hi);
        arow[1][2 * j + 8] = hp__emu_bf16_lo((uint32_t)(hi >> 32));
        arow[1][2 * j + 9] = hp__emu_bf16_hi((uint32_t)(hi >> 32));
        /* lane 4n + j holds B[2j..2j+1][n] and B[2j+8..2j+9][n] */
        uint64_t bb = (uint64_t)b0 | ((uint64_t)b1 << 32);
        for (int e = 0; e < 2; e++) {
            uint64_t v = __shfl_sync(0xffffffffu, bb, 4 * (2 * q + e) + j);
            bcol[e][2 * j] = hp__emu_bf16_lo((uint32_t)v);
            bcol[e][2 * j + 1] = hp__emu_bf16_hi((uint32_t)v);
            bcol[e][2 * j + 8] = hp__emu_bf16_lo((uint32_t)(v >> 32));
            bcol[e][2 * j + 9] = hp__emu_bf16_hi((uint32_t)(v >> 32));
        }
    }
    for (int r = 0; r < 2; r++)
        for (int e = 0; e < 2; e++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += arow[r][k] * bcol[e][k];
            c[2 * r + e] += s;
        }
#elif defined(HP__MMA_NONE)
    (void)c, (void)a, (void)b0, (void)b1;
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

#endif
