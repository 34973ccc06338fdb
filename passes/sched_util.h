/* passes/sched_util.h — what the scheduling passes (overlap.c, bucketing.c) share: user lists
 * of a graph, the FSDP unit a parameter belongs to, and their report counters. Private to
 * passes/ (hp__ prefix); no I/O.
 */
#ifndef HP_PASSES_SCHED_UTIL_H
#define HP_PASSES_SCHED_UTIL_H

#include "hp/passes.h"

#include <stdbool.h>
#include <stddef.h>

/* The users of every node as a CSR table: the users of node i are user[off[i] .. off[i+1]),
 * one entry per input edge (a node reading i twice appears twice), in ascending node order.
 * is_output[i]: some graph output refers to node i. Caller storage; arrays hp_malloc'd. */
typedef struct hp__users {
    int32_t *off;    /* [n_nodes + 1] */
    int32_t *user;   /* [off[n_nodes]] */
    bool *is_output; /* [n_nodes] */
} hp__users;

/* Builds the table for g, checking on the way that every op exists and every input and output
 * refers to an existing output of an earlier node (the only graph property the scheduling passes
 * rely on before the verifier has run). HP_INVALID naming the node, HP_LIMIT, HP_NOMEM; on failure
 * u holds nothing to free (hp__users_fini is still safe). */
hp_status hp__users_init(hp__users *u, const hp_graph *g, hp_err *err);
void hp__users_fini(hp__users *u); /* idempotent */

/* The FSDP unit of a parameter, by its FQN, as FSDP2 wraps a transformer: a repeated block
 * "<name>.<index>" ("layers.3" for "layers.3.attention.wq.weight"), otherwise the FQN
 * without its last component ("tok_embeddings" for "tok_embeddings.weight", "norm" for
 * "norm.weight"; a one-component FQN is its own unit). Returns the prefix length. */
size_t hp__fsdp_unit_len(const char *fqn);

/* The repeated block of a parameter: the length of its FQN's prefix through the first
 * all-digit component that is neither the first nor the last ("layers.3" of
 * "layers.3.attention.wq.weight", "model.layers.0" of "model.layers.0.mlp.w1"); 0 when there is
 * none ("tok_embeddings.weight", "norm.weight"). */
size_t hp__block_len(const char *fqn);

/* Do placeholders a and b of g belong to the same FSDP unit? A placeholder without an FQN is
 * a unit of its own. */
bool hp__same_unit(const hp_graph *g, int32_t a, int32_t b);

/* Ops that only re-index one input (views, permutes, transposes): what spmd puts between a
 * stored parameter and its gather when the storage split is not dim 0. */
bool hp__is_data_movement(hp_op op);

/* The placeholder node id gathers, directly (fsdp) or through a chain of data-movement ops
 * (spmd's transpose of a dp:S(k) storage, k != 0); -1 when id is no such gather. */
int32_t hp__gathered_param(const hp_graph *g, int32_t id);

/* Is node id an all-gather of a parameter shard (hp__gathered_param >= 0)? */
bool hp__is_param_gather(const hp_graph *g, int32_t id);

/* Gives o (new, no node placed yet) g's mesh, when g has one: a rebuilt graph sets it before
 * copying any node's placements (hp_graph_set_mesh's contract). */
hp_status hp__copy_mesh(hp_graph *o, const hp_graph *g, hp_err *err);

/* Fills a pass report's counters for the pass's output graph: nodes in and out, the
 * collectives and their bytes per step (hp_collective_bytes). r may be NULL. */
void hp__sched_report(hp_pass_report *r, const hp_graph *in, const hp_graph *out, bool ran);

/* Bytes of a value of type t. */
int64_t hp__type_bytes(const hp_type *t);

#endif
