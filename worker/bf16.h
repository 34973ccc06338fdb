/* worker/bf16.h — f32 -> bf16 rounding on the host, shared by the cpu backend's kernels
 * (cpu_internal.h) and the optimizer's bf16 parameter copies (optim.c), so both give the same
 * bits. */
#ifndef HP_WORKER_BF16_H
#define HP_WORKER_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest even; NaN stays a (quiet) NaN, infinities and overflow give infinity. */
static inline uint16_t hp__bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#endif
