/* worker/fsio.h — file-system helpers shared by the worker's I/O units (safetensors,
 * checkpoints, data): durable atomic writes from several buffers, directory fsync, path
 * joins, and routing jansson's allocations through hp_malloc so fault injection covers them.
 * Folder-internal (hp__ names); not a public header.
 */
#ifndef HP_WORKER_FSIO_H
#define HP_WORKER_FSIO_H

#include <stdbool.h>
#include <stddef.h>

#include "hp/base.h"

/* One piece of a file being written. */
typedef struct hp__iov {
    const void *p;
    size_t n;
} hp__iov;

/* Writes the concatenation of v[0..n) to path durably and atomically: a temp file beside it
 * (`path.tmp.PID`), write, fsync, close, rename over path, fsync the directory. On failure
 * the temp file is removed and path is untouched. Errors name the path and the errno text. */
hp_status hp__write_atomic_iov(const char *path, const hp__iov *v, int n, hp_err *err);

/* fsyncs a directory (so that a rename or create in it is durable). */
hp_status hp__fsync_dir(const char *dir, hp_err *err);

/* Creates dir and its missing parents (mkdir -p); an existing directory is fine. */
hp_status hp__mkdir(const char *dir, hp_err *err);

/* "a/b" as a fresh hp_malloc'd string; NULL when out of memory. */
char *hp__path_join(const char *a, const char *b);

/* Makes jansson allocate through hp_malloc/hp_free (idempotent, thread-safe). Both are plain
 * malloc/free in production, so objects made before the switch are freed correctly. */
void hp__json_init(void);

/* True when an hp_malloc fails right now. jansson reports some failed allocations as syntax
 * errors (its lexer cannot tell), so a parse failure is re-classified as out of memory when
 * this probe fails too. */
bool hp__alloc_failing(void);

#endif
