/* hp/device.h — the job's device kind as people and builds name it: "cpu" / "cuda" for
 * `hpctl new --device` and the plan's output, and which kinds this build's hp-worker has a
 * backend for (hpd asks before it accepts a job: its local launcher starts the hp-worker of
 * the same build).
 *
 * A CUDA backend is compiled in when the build defines HP_CUDA_BACKEND (the CUDA issue adds
 * it under worker/cuda/); until then only `cpu` is built, and a `cuda` job is refused with
 * one line, never run on the CPU.
 */
#ifndef HP_DEVICE_H
#define HP_DEVICE_H

#include "hp/base.h"
#include "hp/job.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "cpu", "cuda"; "?" for a value outside the enum. */
const char *hp_device_name(hp_device_kind d);

/* "cpu" or "cuda" (exactly) -> *out. HP_INVALID naming the text otherwise. */
hp_status hp_device_parse(const char *name, hp_device_kind *out, hp_err *err);

/* HP_OK when this build has a backend for d; else HP_UNSUPPORTED with one line for the user
 * ("device cuda: this hp-worker was built without CUDA (...)"), HP_INVALID for a value
 * outside the enum. Says nothing about whether a device exists on this machine: the worker's
 * backend factory (worker/backend.h) checks that when it starts. */
hp_status hp_device_built(hp_device_kind d, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
