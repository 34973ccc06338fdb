/* tests/cuemu/include/cuda_fp16.h — __half for cuemu (IEEE binary16 through the host compiler's
 * _Float16, which rounds to nearest even). */
#ifndef HP_CUEMU_CUDA_FP16_H
#define HP_CUEMU_CUDA_FP16_H
#include <string.h>

struct __half {
    unsigned short __x;
};

static inline float __half2float(__half h) {
    _Float16 v;
    memcpy(&v, &h.__x, sizeof v);
    return (float)v;
}
static inline __half __float2half_rn(float f) {
    _Float16 v = (_Float16)f;
    __half h;
    memcpy(&h.__x, &v, sizeof v);
    return h;
}
static inline __half __float2half(float f) {
    return __float2half_rn(f);
}
#endif
