/* passes/passes_internal.h — what the files of passes/ share (hp__ prefix). */
#ifndef HP_PASSES_INTERNAL_H
#define HP_PASSES_INTERNAL_H

#include "hp/program.h"

/* Memory plan: gives every own-storage buffer an offset in its class's arena. Activations
 * (HP_MEM_ACT) reuse space: two buffers share bytes only if their live ranges (producing
 * instruction to last reader, aliases included; graph outputs live to the end) are disjoint.
 * Fills p->arena_bytes and p->stats. */
hp_status hp__memplan(hp_program *p, hp_err *err);

#endif
