/* worker/threads.c — the static thread pool behind hp/threads.h.
 *
 * One run at a time: the caller publishes (fn, ctx, n_tasks) under `mu`, opens the run, bumps
 * the generation and wakes every worker; all threads, the caller included, claim task indices
 * from an atomic counter. A worker joins the run (under `mu`) only while it is open; when the
 * caller has no task left to claim it closes the run and waits for the workers that joined, so
 * no worker can still be touching the run's ctx when hp_pool_run returns. A worker the
 * scheduler wakes late (a loaded machine) finds the run closed and skips it, instead of the
 * caller waiting a time slice for a thread that has nothing left to do. Sleeping on condition
 * variables rather than spinning keeps idle pools free on a shared machine.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "hp/threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct worker {
    struct hp_pool *pool;
    int id;
} worker;

struct hp_pool {
    int n;              /* threads in all, caller included */
    int started;        /* workers actually started */
    pthread_t *threads; /* [n - 1] */
    worker *workers;    /* [n - 1] */

    pthread_mutex_t run_lock; /* serializes hp_pool_run callers */
    pthread_mutex_t mu;       /* guards everything below but `next` */
    pthread_cond_t wake;      /* gen changed or stop */
    pthread_cond_t done;      /* the closed run's last joined worker left */
    uint64_t gen;
    int stop;
    int open;   /* the current run still takes workers */
    int joined; /* workers inside the current run */

    hp_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    _Atomic int64_t next;
};

/* The pool whose task this thread is running (workers: always their pool). A nested
 * hp_pool_run on the same pool runs inline instead of deadlocking on run_lock. */
static _Thread_local const hp_pool *tls_pool;
static _Thread_local int tls_thread; /* this thread's index in tls_pool */

static void drain(hp_pool *p, int thread) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    hp_pool *p = w->pool;
    tls_pool = p;
    tls_thread = w->id;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        if (!p->open) continue; /* over before this thread got to it */
        p->joined++;
        pthread_mutex_unlock(&p->mu);
        drain(p, w->id);
        pthread_mutex_lock(&p->mu);
        if (--p->joined == 0 && !p->open) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void stop_workers(hp_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    p->started = 0;
}

static void destroy(hp_pool *p) {
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_lock);
    hp_free(p->workers);
    hp_free(p->threads);
    hp_free(p);
}

hp_status hp_pool_new(int n_threads, hp_pool **out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "hp_pool_new: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > HP_POOL_MAX_THREADS)
        return hp_errf(err, HP_INVALID, "thread pool: %d threads is outside [1, %d]", n_threads,
                       HP_POOL_MAX_THREADS);
    hp_pool *p = hp_calloc(1, sizeof *p);
    if (!p) return hp_errf(err, HP_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->threads = hp_calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = hp_calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            destroy(p);
            return hp_errf(err, HP_NOMEM, "thread pool: out of memory for %d threads", n_threads);
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i] = (worker){p, i + 1};
        int rc = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
        if (rc != 0) {
            stop_workers(p);
            destroy(p);
            return hp_errf(err, HP_INTERNAL, "thread pool: starting thread %d of %d: %s", i + 1,
                           n_threads, strerror(rc));
        }
        p->started++;
    }
    *out = p;
    return HP_OK;
}

void hp_pool_free(hp_pool *pool) {
    if (!pool) return;
    stop_workers(pool);
    destroy(pool);
}

int hp_pool_size(const hp_pool *pool) {
    return pool ? pool->n : 1;
}

void hp_pool_run(hp_pool *pool, int64_t n_tasks, hp_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!pool || tls_pool == pool) {
        /* No pool, or nested inside one of its tasks: inline, keeping this thread's index so
         * per-thread scratch stays private. */
        int thread = pool ? tls_thread : 0;
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, thread);
        return;
    }
    pthread_mutex_lock(&pool->run_lock);
    const hp_pool *outer_pool = tls_pool;
    int outer_thread = tls_thread;
    tls_pool = pool;
    tls_thread = 0;

    if (pool->started == 0 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    } else {
        pthread_mutex_lock(&pool->mu);
        pool->fn = fn;
        pool->ctx = ctx;
        pool->n_tasks = n_tasks;
        atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
        pool->open = 1;
        pool->joined = 0;
        pool->gen++;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);

        drain(pool, 0);

        pthread_mutex_lock(&pool->mu);
        pool->open = 0;
        while (pool->joined > 0) pthread_cond_wait(&pool->done, &pool->mu);
        pool->fn = NULL;
        pool->ctx = NULL;
        pthread_mutex_unlock(&pool->mu);
    }

    tls_pool = outer_pool;
    tls_thread = outer_thread;
    pthread_mutex_unlock(&pool->run_lock);
}

typedef struct pfor {
    hp_range_fn fn;
    void *ctx;
    int64_t n, chunk;
} pfor;

static void pfor_task(void *ctx, int64_t task, int thread) {
    const pfor *f = ctx;
    int64_t b = task * f->chunk;
    int64_t e = f->n - b < f->chunk ? f->n : b + f->chunk;
    f->fn(f->ctx, b, e, thread);
}

void hp_pool_parallel_for(hp_pool *pool, int64_t n, int64_t grain, hp_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t want = 4 * (int64_t)hp_pool_size(pool);
    int64_t chunk = n / want + (n % want != 0);
    if (chunk < grain) chunk = grain;
    pfor f = {fn, ctx, n, chunk};
    hp_pool_run(pool, n / chunk + (n % chunk != 0), pfor_task, &f);
}

int hp_default_threads(void) {
    const char *env = getenv("HP_NUM_THREADS");
    if (env && *env) {
        char *end;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno == 0 && *end == '\0' && v >= 1 && v <= HP_POOL_MAX_THREADS) return (int)v;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c >= 1) return c > HP_POOL_MAX_THREADS ? HP_POOL_MAX_THREADS : c;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c >= 1 ? (c > HP_POOL_MAX_THREADS ? HP_POOL_MAX_THREADS : (int)c) : 1;
}
