/* graph/grad_internal.h — what autodiff hands a gradient rule beyond hp_grad_fn's arguments,
 * and helpers shared by the gradient rule files (hp__grad_ prefix).
 *
 * Rules get an hp_grad_node: the forward node, its id (to reuse its outputs, as exp's
 * gradient reuses exp's result) and which inputs receive a gradient (so that no dead nodes are
 * emitted, like PyTorch's output_mask).
 */
#ifndef HP_GRAD_INTERNAL_H
#define HP_GRAD_INTERNAL_H

#include "graph/graph_internal.h"

/* Output k of the forward node being differentiated. */
static inline hp_value hp__grad_self(const hp_grad_node *fwd, int k) {
    return (hp_value){fwd->id, k};
}

/* Whether input i takes a gradient (a floating value that varies with some parameter). */
static inline bool hp__grad_need(const hp_grad_node *fwd, int i) {
    return fwd->need[i];
}

/* Records a sticky error on g (the first one wins), for inconsistencies a rule detects itself;
 * returns the status. */
hp_status hp__grad_fail(hp_graph *g, hp_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reduces a gradient of a broadcast result back to the operand type `to`: sums the leading
 * dims and the dims where `to` has 1, then views to `to`'s shape (ATen's sum_to_size).
 * Returns x unchanged when nothing is broadcast; HP_NO_VALUE passes through. */
hp_value hp__grad_sum_to(hp_graph *g, hp_value x, const hp_type *to);

/* The keepdim shape of a reduction's output over `in` (reduced dims become 1): the shape a
 * reduction's gradient is viewed to before it expands back. */
void hp__grad_keepdim_shape(const hp_node *n, const hp_type *in, int64_t shape[HP_MAX_RANK]);

#endif
