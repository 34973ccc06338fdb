/* tests/worker/test_threads.c — the static thread pool: every task runs exactly once, thread
 * indices stay in range, late workers skip finished runs, nested runs and concurrent callers do not
 * deadlock, bad sizes and failed allocations are clean errors. */
#include "hp/threads.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct count_ctx {
    _Atomic int *hits;
    int size;
    _Atomic int bad_thread;
} count_ctx;

static void count_task(void *ctx, int64_t t, int thread) {
    count_ctx *c = ctx;
    atomic_fetch_add(&c->hits[t], 1);
    if (thread < 0 || thread >= c->size) atomic_store(&c->bad_thread, 1);
}

Test(threads, every_task_runs_once) {
    for (int n = 1; n <= 4; n++) {
        hp_pool *pool;
        hp_err e;
        cr_assert_eq(hp_pool_new(n, &pool, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(hp_pool_size(pool), n);
        for (int64_t tasks = 0; tasks < 300; tasks += 37) {
            _Atomic int *hits = calloc((size_t)tasks + 1, sizeof *hits);
            count_ctx c = {hits, n, 0};
            for (int rep = 0; rep < 3; rep++) hp_pool_run(pool, tasks, count_task, &c);
            for (int64_t t = 0; t < tasks; t++) cr_assert_eq(hits[t], 3, "task %lld", (long long)t);
            cr_assert_eq(c.bad_thread, 0);
            free(hits);
        }
        hp_pool_free(pool);
    }
}

/* A run's ctx dies when hp_pool_run returns: a worker that wakes after the run is over must
 * skip it, and one that joined must be done with it before the call returns. Many short runs
 * back to back (workers often arrive late), each ctx marked dead right after its run. */
typedef struct live_ctx {
    _Atomic int alive, hits;
} live_ctx;

static _Atomic int stale_touches;

static void live_task(void *ctx, int64_t t, int thread) {
    (void)t, (void)thread;
    live_ctx *c = ctx;
    for (volatile int spin = 0; spin < 20000; spin++) { /* widens the window a race needs */
    }
    if (!atomic_load(&c->alive)) atomic_fetch_add(&stale_touches, 1);
    atomic_fetch_add(&c->hits, 1);
}

Test(threads, late_workers_never_touch_a_finished_run, .timeout = 60) {
    hp_pool *pool;
    hp_err e;
    cr_assert_eq(hp_pool_new(4, &pool, &e), HP_OK, "%s", e.msg);
    enum { RUNS = 4000 };
    live_ctx *ctx = calloc(RUNS, sizeof *ctx);
    for (int r = 0; r < RUNS; r++) {
        atomic_store(&ctx[r].alive, 1);
        int64_t tasks = 2 + r % 5;
        hp_pool_run(pool, tasks, live_task, &ctx[r]);
        atomic_store(&ctx[r].alive, 0);
        cr_assert_eq(atomic_load(&ctx[r].hits), tasks, "run %d", r);
    }
    hp_pool_free(pool);
    cr_assert_eq(atomic_load(&stale_touches), 0);
    for (int r = 0; r < RUNS; r++) cr_assert_eq(atomic_load(&ctx[r].hits), 2 + r % 5, "run %d", r);
    free(ctx);
}

Test(threads, null_pool_runs_inline) {
    _Atomic int hits[5] = {0};
    count_ctx c = {hits, 1, 0};
    hp_pool_run(NULL, 5, count_task, &c);
    for (int t = 0; t < 5; t++) cr_assert_eq(hits[t], 1);
    cr_assert_eq(hp_pool_size(NULL), 1);
}

typedef struct sum_ctx {
    int64_t *out;
} sum_ctx;

static void square_range(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    sum_ctx *c = ctx;
    for (int64_t i = b; i < e; i++) c->out[i] = i * i;
}

Test(threads, parallel_for_covers_the_range) {
    hp_pool *pool;
    cr_assert_eq(hp_pool_new(3, &pool, NULL), HP_OK);
    int64_t sizes[] = {0, 1, 2, 11, 1000, 4097};
    int64_t grains[] = {0, 1, 7, 1000, 100000};
    for (size_t s = 0; s < HP_ARRAY_LEN(sizes); s++)
        for (size_t g = 0; g < HP_ARRAY_LEN(grains); g++) {
            int64_t n = sizes[s];
            int64_t *out = calloc((size_t)n + 1, sizeof *out);
            for (int64_t i = 0; i < n; i++) out[i] = -1;
            sum_ctx c = {out};
            hp_pool_parallel_for(pool, n, grains[g], square_range, &c);
            for (int64_t i = 0; i < n; i++) cr_assert_eq(out[i], i * i);
            free(out);
        }
    hp_pool_free(pool);
}

typedef struct nest_ctx {
    hp_pool *pool;
    _Atomic int inner_hits;
} nest_ctx;

static void inner_task(void *ctx, int64_t t, int thread) {
    (void)t, (void)thread;
    nest_ctx *c = ctx;
    atomic_fetch_add(&c->inner_hits, 1);
}

static void outer_task(void *ctx, int64_t t, int thread) {
    (void)t, (void)thread;
    nest_ctx *c = ctx;
    hp_pool_run(c->pool, 10, inner_task, c); /* same pool: runs inline */
}

Test(threads, nested_run_does_not_deadlock, .timeout = 20) {
    hp_pool *pool;
    cr_assert_eq(hp_pool_new(2, &pool, NULL), HP_OK);
    nest_ctx c = {pool, 0};
    hp_pool_run(pool, 8, outer_task, &c);
    cr_assert_eq(c.inner_hits, 80);
    hp_pool_free(pool);
}

typedef struct caller_arg {
    hp_pool *pool;
    int ok;
} caller_arg;

static void *caller_main(void *arg) {
    caller_arg *a = arg;
    a->ok = 1;
    for (int rep = 0; rep < 200; rep++) {
        _Atomic int hits[16] = {0};
        count_ctx c = {hits, hp_pool_size(a->pool), 0};
        hp_pool_run(a->pool, 16, count_task, &c);
        for (int t = 0; t < 16; t++)
            if (hits[t] != 1 || c.bad_thread) a->ok = 0;
    }
    return NULL;
}

Test(threads, concurrent_callers_are_serialized, .timeout = 30) {
    hp_pool *pool;
    cr_assert_eq(hp_pool_new(2, &pool, NULL), HP_OK);
    pthread_t th[3];
    caller_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (caller_arg){pool, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, caller_main, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert(args[i].ok, "caller %d saw a task run twice or not at all", i);
    }
    hp_pool_free(pool);
}

Test(threads, bad_sizes_are_errors) {
    hp_pool *pool = (hp_pool *)1;
    hp_err e;
    cr_assert_eq(hp_pool_new(0, &pool, &e), HP_INVALID);
    cr_assert_null(pool);
    cr_assert_eq(hp_pool_new(-3, &pool, &e), HP_INVALID);
    cr_assert_eq(hp_pool_new(HP_POOL_MAX_THREADS + 1, &pool, &e), HP_INVALID);
    cr_assert_eq(hp_pool_new(2, NULL, &e), HP_INVALID);
    hp_pool_free(NULL);
}

Test(threads, allocation_failures_are_clean) {
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hp_pool *pool = NULL;
        hp_err e;
        hp_status s = hp_pool_new(3, &pool, &e);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            _Atomic int hits[7] = {0};
            count_ctx c = {hits, 3, 0};
            hp_pool_run(pool, 7, count_task, &c);
            for (int t = 0; t < 7; t++) cr_assert_eq(hits[t], 1);
            hp_pool_free(pool);
            cr_assert(n > 0, "hp_pool_new allocated nothing");
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "allocation %ld: %s", n, e.msg);
        cr_assert_null(pool);
        cr_assert(n < 100);
    }
}

Test(threads, default_threads_reads_the_environment) {
    setenv("HP_NUM_THREADS", "3", 1);
    cr_assert_eq(hp_default_threads(), 3);
    setenv("HP_NUM_THREADS", "zero", 1);
    cr_assert(hp_default_threads() >= 1);
    unsetenv("HP_NUM_THREADS");
    cr_assert(hp_default_threads() >= 1);
}
