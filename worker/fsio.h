/* worker/fsio.h — file-system helpers shared by the worker's I/O units (safetensors,
 * checkpoints, data): path joins, and routing jansson's allocations through hp_malloc so
 * fault injection covers them. Durable atomic writes, directory fsync and mkdir -p are the
 * libraries' one set in hp/base.h (hp_file_write_atomic_iov, hp_fsync_dir, hp_mkdir_p).
 * Folder-internal (hp__ names); not a public header.
 */
#ifndef HP_WORKER_FSIO_H
#define HP_WORKER_FSIO_H

#include <stdbool.h>
#include <stddef.h>

#include "hp/base.h"

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
