/* tests/cuemu/cuemu_internal.h — what cuemu's files share: the error state (a launch's
 * configuration error is returned once by cudaGetLastError; a fault inside a kernel is sticky,
 * returned by every later synchronizing call, as a device's), the device-memory map (every
 * cudaMalloc'd range, so a copy's direction is checked against where its pointers live), and
 * stream handles. */
#ifndef HP_CUEMU_INTERNAL_H
#define HP_CUEMU_INTERNAL_H

#include "include/cuemu_device.h"

#include <stddef.h>
#include <functional>

namespace hp_emu {

void set_launch_error(cudaError_t e, const char *kernel, const char *why);
void set_sticky_error(cudaError_t e, const char *kernel, const char *why);
cudaError_t sticky_error();
bool stream_ok(cudaStream_t s);
/* Whether [p, p + bytes) lies inside one cudaMalloc'd allocation. */
bool on_device(const void *p, size_t bytes);
/* Stream s (null: the legacy one) now waits behind a collective of communicator `by` that can
 * never finish: queries say not ready, synchronizing on it (or on an event recorded on it
 * after this, or on a stream that waits for such an event) fails with a message, as a device
 * would wait forever. release_hangs(by) (ncclCommAbort) lets them run again. */
/* Runs fn as stream s's next work: now, unless s lags (it carries collectives: make_lagging),
 * then when the program makes it run (cuemu_runtime.cpp). drain(s) runs what s has queued:
 * false if it is stuck. drain_all() runs every stream's. */
void submit(cudaStream_t s, std::function<void()> fn);
void make_lagging(cudaStream_t s);
bool drain(cudaStream_t s);
void drain_all();
/* The machine's ordinal of visible device `ordinal` (CUDA_VISIBLE_DEVICES maps them), -1 if
 * there is none; the current device (cudaSetDevice). */
int machine_device(int ordinal);
int current();
void stream_hang(cudaStream_t s, const void *by);
void release_hangs(const void *by);

} // namespace hp_emu

#endif
