/* worker/comm/fold.c — the reduction both host communicators fold with (shm_coll.c,
 * tcp_coll.c), so that shm and tcp give bitwise the same results: pieces combined in rank
 * order, ((x0 + x1) + x2) ..., a block of BLOCK elements at a time so the destination stays in
 * L1. HP_REDUCE_AVG divides the sum by world (i64: C division, truncating toward zero); i64
 * sums wrap (two's complement); HP_REDUCE_MAX propagates NaN.
 */
#include "worker/comm/fold.h"

#define BLOCK 1024 /* elements reduced at a time: dst block stays in L1 */

static inline float add_f32(float a, float b) {
    return a + b;
}
static inline double add_f64(double a, double b) {
    return a + b;
}
static inline int64_t add_i64(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a + (uint64_t)b);
}
/* a if a is NaN or not below b, else b (NaN in b propagates through the failed compare). */
static inline float max_f32(float a, float b) {
    return (a >= b || a != a) ? a : b;
}
static inline double max_f64(double a, double b) {
    return (a >= b || a != a) ? a : b;
}
static inline int64_t max_i64(int64_t a, int64_t b) {
    return a >= b ? a : b;
}

/* dst[0..m) = op over j = 0..world-1 of src[j][0..m), folded in rank order. Called with
 * m == BLOCK for all but the last block: a constant trip count lets GCC's -O2 (very cheap
 * cost model) vectorize the loops; elementwise, so the vector and scalar paths agree. */
#define DEFINE_REDUCE(T, SUFFIX)                                                                   \
    static inline void block_##SUFFIX(T *restrict d, const void *const *src, size_t b, int world,  \
                                      size_t m, hp_reduce_op op) {                                 \
        const T *restrict s0 = (const T *)src[0] + b;                                              \
        for (size_t i = 0; i < m; i++) d[i] = s0[i];                                               \
        for (int j = 1; j < world; j++) {                                                          \
            const T *restrict sj = (const T *)src[j] + b;                                          \
            if (op == HP_REDUCE_MAX) {                                                             \
                for (size_t i = 0; i < m; i++) d[i] = max_##SUFFIX(d[i], sj[i]);                   \
            } else {                                                                               \
                for (size_t i = 0; i < m; i++) d[i] = add_##SUFFIX(d[i], sj[i]);                   \
            }                                                                                      \
        }                                                                                          \
        if (op == HP_REDUCE_AVG) {                                                                 \
            const T w = (T)world;                                                                  \
            for (size_t i = 0; i < m; i++) d[i] = d[i] / w;                                        \
        }                                                                                          \
    }                                                                                              \
    static void reduce_##SUFFIX(T *dst, const void *const *src, int world, size_t n,               \
                                hp_reduce_op op) {                                                 \
        size_t b = 0;                                                                              \
        for (; b + BLOCK <= n; b += BLOCK) block_##SUFFIX(dst + b, src, b, world, BLOCK, op);      \
        if (b < n) block_##SUFFIX(dst + b, src, b, world, n - b, op);                              \
    }
DEFINE_REDUCE(float, f32)
DEFINE_REDUCE(double, f64)
DEFINE_REDUCE(int64_t, i64)

void hp__comm_fold(void *dst, const void *const *src, int world, size_t n, hp_comm_dtype dt,
                   hp_reduce_op op) {
    switch (dt) {
    case HP_COMM_F32:
        reduce_f32(dst, src, world, n, op);
        break;
    case HP_COMM_F64:
        reduce_f64(dst, src, world, n, op);
        break;
    case HP_COMM_I64:
        reduce_i64(dst, src, world, n, op);
        break;
    }
}
