/* tests/cuemu/include/cuda_runtime.h — the runtime API, and in C++ (the kernel files) the device
 * side of cuemu: built-in variables, __syncthreads, warp shuffles, atomics, launches. */
#ifndef HP_CUEMU_CUDA_RUNTIME_H
#define HP_CUEMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "cuemu_device.h"
#endif
#endif
