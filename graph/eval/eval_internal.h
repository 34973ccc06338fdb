/* graph/eval/eval_internal.h — what the reference evaluator's files share (hp__eval_ prefix):
 * the kernel signature, the per-run context, the kernel table lookup and the index helpers
 * (row-major strides, broadcast strides, unravel, line decomposition around one dim).
 *
 * A kernel computes one node: `in` points at the node's input tensors, `out` at its n_out
 * outputs, already allocated (zeroed) with the node's output types. Kernels work in double and
 * never round: the driver rounds every output afterwards. They may assume the graph verified
 * (types agree with the shape rules); they check only what depends on data (indices, targets)
 * and return a message without the node prefix, which the driver adds.
 */
#ifndef HP_EVAL_INTERNAL_H
#define HP_EVAL_INTERNAL_H

#include "graph/graph_internal.h"
#include "hp/eval.h"

typedef struct hp__eval_ctx {
    const hp_graph *g;
    const hp_eval_opts *opts; /* never NULL inside a run */
    const hp_tensor *inputs;  /* placeholder feeds, [number of placeholders] */
    int node;                 /* id of the node being run */
} hp__eval_ctx;

typedef hp_status (*hp__eval_kernel)(const hp__eval_ctx *cx, const hp_node *n,
                                     const hp_tensor *const *in, hp_tensor *out, hp_err *err);

/* The kernel registered for op (NULL if none, or op out of range). */
hp__eval_kernel hp__eval_kernel_for(hp_op op);

/* ---- index helpers (eval_index.c) ---------------------------------------------------------- */

/* Row-major strides of t, in elements. */
void hp__eval_strides(const hp_type *t, int64_t st[HP_MAX_RANK]);
/* Strides of `in` addressed with an index of `out` (numpy broadcasting: `in` aligned right,
 * stride 0 on dims where in has size 1 or is missing). */
void hp__eval_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]);
/* The multi-index of linear position i in t. */
void hp__eval_unravel(const hp_type *t, int64_t i, int64_t idx[HP_MAX_RANK]);
/* Σ idx[d] · st[d]. */
int64_t hp__eval_offset(int rank, const int64_t *idx, const int64_t *st);
/* Views t as [outer, n, inner] around dim (0 <= dim < rank). */
void hp__eval_split(const hp_type *t, int dim, int64_t *outer, int64_t *n, int64_t *inner);
/* numel of a tensor. */
int64_t hp__eval_numel(const hp_tensor *t);

/* ---- kernels, by family -------------------------------------------------------------------- */
#define HP__EVAL_KERNEL(name)                                                                      \
    hp_status name(const hp__eval_ctx *cx, const hp_node *n, const hp_tensor *const *in,           \
                   hp_tensor *out, hp_err *err)

/* eval_elementwise.c */
HP__EVAL_KERNEL(hp__eval_creation);
HP__EVAL_KERNEL(hp__eval_binary);
HP__EVAL_KERNEL(hp__eval_where);
HP__EVAL_KERNEL(hp__eval_unary);
HP__EVAL_KERNEL(hp__eval_backward_pair);

/* eval_reduce_shape.c */
HP__EVAL_KERNEL(hp__eval_reduce);
HP__EVAL_KERNEL(hp__eval_copy);
HP__EVAL_KERNEL(hp__eval_permute);
HP__EVAL_KERNEL(hp__eval_expand);
HP__EVAL_KERNEL(hp__eval_slice);
HP__EVAL_KERNEL(hp__eval_slice_backward);
HP__EVAL_KERNEL(hp__eval_cat);
HP__EVAL_KERNEL(hp__eval_mm);
HP__EVAL_KERNEL(hp__eval_bmm);
HP__EVAL_KERNEL(hp__eval_addmm);

/* eval_nn.c */
HP__EVAL_KERNEL(hp__eval_embedding);
HP__EVAL_KERNEL(hp__eval_embedding_backward);
HP__EVAL_KERNEL(hp__eval_chunked_embedding);
HP__EVAL_KERNEL(hp__eval_chunked_embedding_backward);
HP__EVAL_KERNEL(hp__eval_softmax);
HP__EVAL_KERNEL(hp__eval_softmax_backward);
HP__EVAL_KERNEL(hp__eval_nll_loss);
HP__EVAL_KERNEL(hp__eval_nll_loss_backward);
HP__EVAL_KERNEL(hp__eval_fused_cross_entropy);
HP__EVAL_KERNEL(hp__eval_fused_cross_entropy_backward);
HP__EVAL_KERNEL(hp__eval_swiglu);
HP__EVAL_KERNEL(hp__eval_swiglu_backward);
HP__EVAL_KERNEL(hp__eval_rms_norm);
HP__EVAL_KERNEL(hp__eval_rms_norm_backward);
HP__EVAL_KERNEL(hp__eval_rotary);
HP__EVAL_KERNEL(hp__eval_layer_norm);
HP__EVAL_KERNEL(hp__eval_layer_norm_backward);

/* eval_mask.c */
HP__EVAL_KERNEL(hp__eval_tril);
HP__EVAL_KERNEL(hp__eval_dropout);
HP__EVAL_KERNEL(hp__eval_dropout_backward);
HP__EVAL_KERNEL(hp__eval_bitwise_not);
HP__EVAL_KERNEL(hp__eval_arange);

/* eval_attention.c */
HP__EVAL_KERNEL(hp__eval_sdpa);
HP__EVAL_KERNEL(hp__eval_sdpa_backward);

/* eval_collective.c */
HP__EVAL_KERNEL(hp__eval_collective);
HP__EVAL_KERNEL(hp__eval_wait);

#endif
