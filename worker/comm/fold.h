/* worker/comm/fold.h — the host communicators' reduction (fold.c). */
#ifndef HP_WORKER_COMM_FOLD_H
#define HP_WORKER_COMM_FOLD_H

#include "hp/comm.h"

#include <stddef.h>
#include <stdint.h>

/* dst[0..n) = op over j = 0..world-1 of src[j][0..n) (elements of dt), folded in rank order.
 * dst must not alias any src (callers stage an aliased piece first). */
void hp__comm_fold(void *dst, const void *const *src, int world, size_t n, hp_comm_dtype dt,
                   hp_reduce_op op);

#endif
