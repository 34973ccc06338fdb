/* worker/simd.c — CPU feature detection for the worker's kernels (see simd.h). */
#include "simd.h"

#include <stdatomic.h>

static atomic_int force_scalar;

int hp__simd_avx2(void) {
    if (atomic_load_explicit(&force_scalar, memory_order_relaxed)) return 0;
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

void hp__simd_force_scalar(int on) {
    atomic_store_explicit(&force_scalar, on != 0, memory_order_relaxed);
}
