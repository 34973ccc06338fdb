/* worker/simd.h — which vector paths the worker's CPU kernels may take (private to worker/).
 *
 * Kernels with a hand-written AVX2+FMA path ask hp__simd_avx2() once per call; the answer is
 * the CPU's, unless a test has forced the portable scalar path. The two paths of every kernel
 * use the same IEEE operations in the same order, so they give bit-identical results.
 */
#ifndef HP_WORKER_SIMD_H
#define HP_WORKER_SIMD_H

/* 1 if the CPU has AVX2 and FMA and the scalar path is not forced. Thread-safe. */
int hp__simd_avx2(void);
/* Forces the scalar path (on != 0) or restores detection (on == 0). For tests. */
void hp__simd_force_scalar(int on);

#endif
