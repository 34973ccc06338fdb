/* worker/cuda/cuda_backend.h — the cuda backend (backend.h's vtable on one CUDA device): device
 * memory by cudaMalloc (one allocation per request: the executor asks for one arena per memory
 * class), a compute stream and a comm stream ordered by CUDA events, kernels launched
 * asynchronously, GEMMs on cuBLASLt, the other ops on the kernels of k_*.cu, collectives on
 * NCCL (cuda_nccl.c). Built only where the toolkit and NCCL are found (HP_CUDA_BACKEND).
 *
 * Errors name the op and carry the CUDA/cuBLAS/NCCL error string; nothing exits. Asynchronous
 * errors (a faulting kernel, an index out of range found on the device) surface at the next
 * synchronize (or copy_out), naming the op that recorded them where known.
 */
#ifndef HP_WORKER_CUDA_BACKEND_H
#define HP_WORKER_CUDA_BACKEND_H

#include "worker/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The number of CUDA devices this process sees (0 when there is no device or no driver:
 * never an error; *why then says what cudaGetDeviceCount answered, when why is not NULL). */
int hp_cuda_device_count(char *why, size_t why_len);

/* A backend on device `device` (0: the first visible one; the factory picks rank % the
 * visible devices, and a launcher may narrow them with CUDA_VISIBLE_DEVICES — hpd's local
 * launcher does not yet). HP_UNSUPPORTED "device cuda: no CUDA device (...)" when there
 * is none; HP_INVALID for a device number outside [0, count); HP_INTERNAL with the CUDA error
 * otherwise. *out is the caller's (hp_backend_free). */
hp_status hp_cuda_backend_new(int device, hp_backend **out, hp_err *err);

/* Collectives of more than one rank through NCCL, bootstrapped over the host communicators
 * of hp_backend_opts (the world's and one per mesh group, as the cpu backend gets them):
 * world rank 0 makes the NCCL unique id and broadcasts it over `comm`; each mesh group's NCCL
 * communicator is split from the world one (ncclCommSplit; color: the world rank of the
 * group's first member, key: the rank in the group). Every rank calls it with the same groups
 * in the same order. Collectives then run on the comm stream; a peer that dies turns into
 * HP_IO at the next synchronize (async error polling, then ncclCommAbort), not a hang. */
hp_status hp_cuda_backend_set_comm(hp_backend *b, hp_comm *comm, const hp_comm_group *groups,
                                   int n_groups, hp_err *err);

/* Tests: records an injected fault on the compute stream, reported at the next synchronize
 * as "cuda: injected kernel fault (value V)". */
hp_status hp_cuda_backend_inject_fault(hp_backend *b, long long value, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
