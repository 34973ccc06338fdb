/* passes/passes_internal.h — what the files of passes/ share (hp__ prefix). */
#ifndef HP_PASSES_INTERNAL_H
#define HP_PASSES_INTERNAL_H

#include "hp/program.h"

/* Memory plan: gives every own-storage buffer an offset in its class's arena. Activations
 * (HP_MEM_ACT) reuse space: two buffers share bytes only if their live ranges (producing
 * instruction to last reader, aliases included; graph outputs live to the end) are disjoint.
 * Fills p->arena_bytes and p->stats. */
hp_status hp__memplan(hp_program *p, hp_err *err);

/* Fills what a parameter slot takes from its placeholder node `id`: fqn, global type (its
 * global_shape when FSDP sharded it), init, shard count and padded dim 0. shard_index is 0:
 * the worker uses its own rank. Buffers are left to the caller. */
void hp__param_slot_init(hp_param_slot *ps, const hp_node *n, int32_t id);

#endif
