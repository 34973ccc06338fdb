/* graph/graph_internal.h — helpers shared inside graph/ (hp__ prefix): dim normalisation,
 * broadcasting and slice bounds, used by shape rules, the evaluator and gradient rules so
 * that all three agree on the semantics. */
#ifndef HP_GRAPH_INTERNAL_H
#define HP_GRAPH_INTERNAL_H

#include "hp/graph.h"

/* Normalises a possibly negative dim against rank (d in [-rank, rank)); HP_INVALID naming the
 * attribute otherwise. */
hp_status hp__norm_dim(int64_t d, int rank, const char *what, int *out, hp_err *err);

/* Numpy broadcasting of a and b into out (dtype taken from a). HP_INVALID naming the dims. */
hp_status hp__broadcast(const hp_type *a, const hp_type *b, hp_type *out, hp_err *err);

/* Python slice semantics on a dim of size n with step >= 1: negative start/end count from
 * the end, both clamp to [0, n]; *len is the number of selected elements (0 if end <= start). */
void hp__slice_bounds(int64_t n, int64_t start, int64_t end, int64_t step, int64_t *s,
                      int64_t *len);

/* The reduction mask of a sum/mean/amax node: mask[d] = 1 if dim d is reduced (dims empty =
 * all). Assumes the node verified. */
void hp__reduce_mask(const hp_node *n, int rank, bool mask[HP_MAX_RANK]);

/* Checks node `id` (which may not be in g yet: the builder checks before appending) against
 * the graph's first `id` nodes: refs point backwards, arity, attribute keys/kinds/presence,
 * string lengths, then runs the shape rule into inferred[0..n_out). The message is prefixed
 * "node ID (op)". */
hp_status hp__check_node(const hp_graph *g, int id, const hp_node *n, hp_type *inferred,
                         hp_err *err);

/* The graph's copy of an array of n output types, attributes (sorted and checked; their
 * strings are copied too) or placements (normalised): an equal one it holds already, or a new
 * copy in its arena (graph/intern.c). NULL for n == 0 or out of memory. */
hp_type *hp__intern_types(hp_graph *g, const hp_type *t, int n);
hp_attr *hp__intern_attrs(hp_graph *g, const hp_attr *a, int n);
hp_placement *hp__intern_placements(hp_graph *g, const hp_placement *p, int n);
void hp__intern_free(hp_graph *g);

/* The ops' rules, declared from the op table (defined in shape_rules.c, grad_rules*.c and
 * shard_rules*.c). */
#define HP_OP(e, name, n_in, n_out, req, opt, shape_fn, grad_fn, shard_fn, flags)                  \
    hp_status hp__##shape_fn(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err);      \
    hp_status hp__##grad_fn(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,            \
                            hp_value *gin);                                                        \
    int hp__##shard_fn(const hp_shard_query *q, hp_shard_rule *rules, int cap);
#include "graph/ops.def"
#undef HP_OP

#endif
