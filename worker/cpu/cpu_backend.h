/* worker/cpu/cpu_backend.h — the `cpu` backend: host memory, OpenBLAS GEMMs, fused C kernels
 * parallelized over a thread pool. Public to the worker (the executor picks a backend); the
 * kernels themselves are private to worker/cpu/.
 *
 * Compute launches run synchronously inside launch(), so events are trivial and
 * synchronize() has nothing to wait for. Floating ops compute in f32 (other floating dtypes
 * are HP_UNSUPPORTED naming the op and dtype); integer and bool tensors are handled where the
 * op allows them. Results do not depend on the thread count. Collectives of group_size 1 are
 * a copy; larger groups run through the communicator given by hp_cpu_backend_set_comm, on a
 * comm thread, so that communication overlaps compute (events order the two streams).
 * Its info() reports the measured peak (hp_cpu_peak_flops with its thread count) and the
 * machine's RAM; memory_peak is the process's peak RSS.
 */
#ifndef HP_WORKER_CPU_BACKEND_H
#define HP_WORKER_CPU_BACKEND_H

#include "hp/comm.h"
#include "worker/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a cpu backend computing with `threads` threads (the caller's plus threads - 1 pool
 * workers; threads <= 0 means hp_default_threads()). It also makes OpenBLAS single-threaded
 * (a process-wide setting, re-applied before each GEMM if something else changed it: GEMMs
 * are tiled on the pool, k_matmul.c). *out is owned by the caller: hp_backend_free. Errors: more
 * than HP_POOL_MAX_THREADS threads (HP_INVALID), no memory or no thread (HP_NOMEM, HP_INTERNAL).
 * One executor thread uses a backend at a time. */
hp_status hp_cpu_backend_new(int threads, hp_backend **out, hp_err *err);

/* Attaches a communicator (borrowed: it must outlive the backend) and starts the comm thread.
 * The caller may use the communicator directly only while the backend is synchronized.
 * (hp_backend_new(HP_DEVICE_CPU, ...) does both; the training loop goes through it.) */
hp_status hp_cpu_backend_set_comm(hp_backend *b, hp_comm *comm, hp_err *err);

/* After set_comm, before the first collective: the communicators of the mesh dims (copied;
 * each communicator borrowed). A collective then runs on the group its HP_ATTR_GROUP names;
 * one naming no group runs on the world communicator. HP_INVALID: no communicator yet, more
 * than HP_MESH_MAX_DIMS groups, an empty or repeated name. */
hp_status hp_cpu_backend_set_groups(hp_backend *b, const hp_comm_group *groups, int n, hp_err *err);

/* The comm stream's per-collective hook (backend.h's set_comm_trace). */
typedef hp_comm_trace_fn hp_cpu_comm_trace_fn;

#ifdef __cplusplus
}
#endif
#endif
