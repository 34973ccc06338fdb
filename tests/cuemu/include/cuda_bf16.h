/* tests/cuemu/include/cuda_bf16.h — __nv_bfloat16 for cuemu: 16 bits, conversions that round to
 * nearest even (NaN to the canonical 0x7fff, as the device does). */
#ifndef HP_CUEMU_CUDA_BF16_H
#define HP_CUEMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short __x;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
    return __float2bfloat16_rn(f);
}
#endif
