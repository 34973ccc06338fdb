/* hp/threads.h — a small static thread pool with a parallel-for, for the worker's CPU math.
 *
 * A pool of n threads is the calling thread plus n - 1 workers that sleep on a condition
 * variable between runs. hp_pool_run hands out task indices 0..n_tasks-1 dynamically and
 * returns when all have finished; which thread ran which task is not deterministic, so a
 * caller that wants thread-count-independent floating-point results makes each task's
 * result depend only on the task index (fixed-size blocks, partials combined in order),
 * never on the number of threads.
 *
 * Not here: work stealing, task graphs, futures. A NULL pool everywhere means "run on the
 * calling thread", so single-threaded callers need no pool at all.
 */
#ifndef HP_THREADS_H
#define HP_THREADS_H

#include "hp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_POOL_MAX_THREADS 1024

typedef struct hp_pool hp_pool;

/* One task. `thread` is in [0, hp_pool_size(pool)): the calling thread is 0; use it to index
 * per-thread scratch, never to decide what the task computes. */
typedef void (*hp_pool_fn)(void *ctx, int64_t task, int thread);
/* One chunk [begin, end) of a parallel-for. */
typedef void (*hp_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Creates a pool of n_threads threads in all (n_threads - 1 are started; 1 starts none).
 * n_threads outside [1, HP_POOL_MAX_THREADS] is HP_INVALID; failing to allocate or to start a
 * thread is HP_NOMEM / HP_INTERNAL with nothing left behind. *out is owned by the caller. */
hp_status hp_pool_new(int n_threads, hp_pool **out, hp_err *err);
/* Stops and joins the workers. NULL is a no-op. Must not be called from inside a task. */
void hp_pool_free(hp_pool *pool);
/* Threads in the pool, counting the caller; 1 for NULL. */
int hp_pool_size(const hp_pool *pool);

/* Runs fn(ctx, t, thread) for every t in [0, n_tasks) and returns when all have returned.
 * Callers from several threads are serialized. A call from inside a task of the same pool runs
 * its tasks on the calling thread (no deadlock). n_tasks <= 0 does nothing. */
void hp_pool_run(hp_pool *pool, int64_t n_tasks, hp_pool_fn fn, void *ctx);

/* Parallel-for over [0, n): chunks of at least `grain` indices (grain < 1 counts as 1), at most
 * about 4 per thread, in any order. The chunking depends on the thread count, so fn must be
 * elementwise (or otherwise chunk-independent). */
void hp_pool_parallel_for(hp_pool *pool, int64_t n, int64_t grain, hp_range_fn fn, void *ctx);

/* Threads to use by default: $HP_NUM_THREADS if it is a positive integer, else the CPUs this
 * process may run on (at least 1). */
int hp_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
