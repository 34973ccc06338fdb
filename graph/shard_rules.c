/* graph/shard_rules.c — the sharding rules of the op table (hp/graph.h, "sharding rules"):
 * for one mesh dimension of n ranks, which input placements each op accepts and what its
 * outputs then are. The propagation and redistribution passes and the auto-sharding solver
 * read them; nothing else decides what an op can do sharded.
 *
 * Conventions. A rule function sees the node with its GLOBAL input and output types. Shard(d)
 * is offered only where dim d divides by n (an even split), so a local op never sees padding.
 * Partial(sum) and Partial(avg) pass through ops linear in that input (and Partial(max) through
 * max-like ones); everything else needs its Partial resolved first. All-Replicate is always
 * valid (except for a collective on its own mesh dim) and is never listed. Variadic ops (cat)
 * spell one input placement, in[0], for all their inputs.
 *
 * Shapes and math are those of graph/shape_rules.c and graph/eval/; tests/graph/
 * test_shard_rules.c checks every rule of every op by running it on simulated ranks' local
 * pieces in f64 and comparing the redistributed result with the op on full tensors.
 */
#include "graph/graph_internal.h"

#include <string.h>

/* ---- the rule list being written ------------------------------------------------------------ */

typedef struct rb {
    const hp_shard_query *q;
    hp_shard_rule *rules;
    int cap, n;
    hp_shard_rule scratch; /* where rules past cap go (counted, not kept) */
} rb;

static rb rb_init(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    return (rb){.q = q, .rules = rules, .cap = cap < 0 ? 0 : cap};
}

/* A new rule, all Replicate. */
static hp_shard_rule *add(rb *b) {
    hp_shard_rule *r = b->n < b->cap ? &b->rules[b->n] : &b->scratch;
    b->n++;
    for (int i = 0; i < HP_SHARD_MAX_IN; i++) r->in[i] = HP_REPLICATE;
    for (int k = 0; k < HP_MAX_OUTS; k++) r->out[k] = HP_REPLICATE;
    return r;
}

static int n_in(const hp_shard_query *q) {
    return q->node->n_in < HP_SHARD_MAX_IN ? q->node->n_in : HP_SHARD_MAX_IN;
}

/* Does dim d of t split evenly over the mesh dim? */
static bool divs(const hp_shard_query *q, const hp_type *t, int d) {
    return d >= 0 && d < t->rank && t->shape[d] % q->mesh_size == 0;
}

static int attr_dim(const hp_shard_query *q, hp_attr_key k, int rank, int dflt) {
    const hp_attr *a = hp_node_attr(q->node, k);
    int d;
    if (!a || hp__norm_dim(a->i, rank, "dim", &d, NULL) != HP_OK) return dflt;
    return d;
}

static const hp_reduce_op LINEAR[] = {HP_REDUCE_SUM, HP_REDUCE_AVG};

/* Partial(op) on input `which` (the others Replicate) gives Partial(op) on every output. */
static void partial_through(rb *b, int which) {
    for (size_t i = 0; i < HP_ARRAY_LEN(LINEAR); i++) {
        hp_shard_rule *r = add(b);
        r->in[which] = HP_PARTIAL(LINEAR[i]);
        for (int k = 0; k < b->q->node->n_out; k++) r->out[k] = HP_PARTIAL(LINEAR[i]);
    }
}

/* Partial(op) on all inputs gives Partial(op) (sums of sums). */
static void partial_all(rb *b) {
    for (size_t i = 0; i < HP_ARRAY_LEN(LINEAR); i++) {
        hp_shard_rule *r = add(b);
        for (int j = 0; j < n_in(b->q); j++) r->in[j] = HP_PARTIAL(LINEAR[i]);
        r->out[0] = HP_PARTIAL(LINEAR[i]);
    }
}

/* Where output dim d of a broadcasting op comes from in input t: Shard of the matching input
 * dim, or Replicate when the input broadcasts along it (size 1 or absent). */
static hp_placement bcast_in(const hp_type *t, const hp_type *out, int d) {
    int k = d - (out->rank - t->rank);
    if (k < 0 || t->shape[k] != out->shape[d]) return HP_REPLICATE;
    return HP_SHARD(k);
}

/* Shard(d) of the output for every dim that divides, inputs following by broadcasting. */
static void pointwise(rb *b) {
    const hp_shard_query *q = b->q;
    for (int d = 0; d < q->out[0].rank; d++) {
        if (!divs(q, &q->out[0], d)) continue;
        hp_shard_rule *r = add(b);
        for (int i = 0; i < n_in(q); i++) r->in[i] = bcast_in(&q->in[i], &q->out[0], d);
        r->out[0] = HP_SHARD(d);
    }
}

/* ---- inputs, creation, elementwise ---------------------------------------------------------- */

/* A placeholder's placement is given (its attribute), not derived. */
int hp__shard_given(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    (void)q, (void)rules, (void)cap;
    return 0;
}

/* full/zeros/ones: each rank makes its piece. */
int hp__shard_creation(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    return b.n;
}

int hp__shard_pointwise(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    return b.n;
}

/* Unary and linear (neg, mul_scalar, clone, float casts): Partial passes. */
int hp__shard_linear(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    bool cast_to_int = q->node->op == HP_OP_TO_COPY && !hp_dtype_is_float(q->out[0].dtype);
    if (!cast_to_int) partial_through(&b, 0);
    return b.n;
}

/* add, sub: a sum of partial sums is a partial sum. */
int hp__shard_add(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    partial_all(&b);
    return b.n;
}

/* mul: linear in either operand, not both. */
int hp__shard_mul(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    partial_through(&b, 0);
    partial_through(&b, 1);
    return b.n;
}

/* div: linear in the numerator. */
int hp__shard_div(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    partial_through(&b, 0);
    return b.n;
}

/* (grad, saved) -> grad_in, linear in grad. */
int hp__shard_grad_pair(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    partial_through(&b, 0);
    return b.n;
}

/* wait_tensor: whatever came in. */
int hp__shard_passthrough(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    static const hp_reduce_op all[] = {HP_REDUCE_SUM, HP_REDUCE_AVG, HP_REDUCE_MAX};
    for (size_t i = 0; i < HP_ARRAY_LEN(all); i++) {
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_PARTIAL(all[i]);
    }
    return b.n;
}

/* ---- reductions ----------------------------------------------------------------------------- */

/* sum / mean / amax over dims: a sharded reduced dim leaves a Partial (sum, avg, max); a
 * sharded kept dim stays sharded (renumbered without keepdim). Partial sums and averages pass
 * through sum and mean, partial maxima through amax. */
int hp__shard_reduce(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *x = &q->in[0];
    bool mask[HP_MAX_RANK];
    hp__reduce_mask(q->node, x->rank, mask);
    bool keep = hp_node_int(q->node, HP_ATTR_KEEPDIM, 0) != 0;
    hp_op op = q->node->op;
    hp_reduce_op pop = op == HP_OP_SUM    ? HP_REDUCE_SUM
                       : op == HP_OP_MEAN ? HP_REDUCE_AVG
                                          : HP_REDUCE_MAX;
    for (int d = 0, kept = 0; d < x->rank; d++) {
        bool reduced = mask[d];
        if (divs(q, x, d)) {
            hp_shard_rule *r = add(&b);
            r->in[0] = HP_SHARD(d);
            r->out[0] = reduced ? HP_PARTIAL(pop) : HP_SHARD(keep ? d : kept);
        }
        if (!reduced) kept++;
    }
    if (op == HP_OP_AMAX) {
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_PARTIAL(HP_REDUCE_MAX);
    } else {
        partial_through(&b, 0);
    }
    return b.n;
}

/* ---- shapes --------------------------------------------------------------------------------- */

static int64_t prefix(const hp_type *t, int d) {
    int64_t p = 1;
    for (int i = 0; i < d; i++) p *= t->shape[i];
    return p;
}

/* Where input dim d of a view lands: output dim j with the same prefix of elements, where
 * either the two dims are equal, or input dim d splits into output dims j.. (the shard must
 * divide out[j]), or input dims d.. merge into output dim j (the shard divides in[d], the
 * leading factor, so each rank's rows stay contiguous). -1 when the split is not a block. */
static int view_target(const hp_shard_query *q, int d) {
    const hp_type *in = &q->in[0], *out = &q->out[0];
    int64_t n = q->mesh_size, pre = prefix(in, d);
    for (int j = 0; j < out->rank; j++) {
        if (prefix(out, j) != pre || out->shape[j] == 1) continue;
        if (out->shape[j] == in->shape[d]) return j;
        if (in->shape[d] > out->shape[j]) { /* split: out[j] * out[j+1] * ... == in[d] */
            int64_t p = 1;
            for (int k = j; k < out->rank && p < in->shape[d]; k++) p *= out->shape[k];
            return p == in->shape[d] && out->shape[j] % n == 0 ? j : -1;
        }
        int64_t p = 1; /* merge: in[d] * in[d+1] * ... == out[j] */
        for (int k = d; k < in->rank && p < out->shape[j]; k++) p *= in->shape[k];
        return p == out->shape[j] && in->shape[d] % n == 0 ? j : -1;
    }
    return -1;
}

int hp__shard_view(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank; d++) {
        if (q->in[0].shape[d] == 1 || !divs(q, &q->in[0], d)) continue;
        int j = view_target(q, d);
        if (j < 0 || !divs(q, &q->out[0], j)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = HP_SHARD(d);
        r->out[0] = HP_SHARD(j);
    }
    partial_through(&b, 0);
    return b.n;
}

int hp__shard_permute(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_attr *a = hp_node_attr(q->node, HP_ATTR_PERM);
    int rank = q->in[0].rank;
    for (int j = 0; a && j < a->ints.n && j < rank; j++) {
        int d;
        if (hp__norm_dim(a->ints.v[j], rank, "perm", &d, NULL) != HP_OK) continue;
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = HP_SHARD(d);
        r->out[0] = HP_SHARD(j);
    }
    partial_through(&b, 0);
    return b.n;
}

/* transpose{dim0, dim1} and t (rank 2: dims 0 and 1; rank < 2: the identity). */
int hp__shard_transpose(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->in[0].rank, d0 = 0, d1 = rank >= 2 ? 1 : 0;
    if (q->node->op == HP_OP_TRANSPOSE) {
        d0 = attr_dim(q, HP_ATTR_DIM0, rank, 0);
        d1 = attr_dim(q, HP_ATTR_DIM1, rank, 0);
    }
    for (int d = 0; d < rank; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = HP_SHARD(d);
        r->out[0] = HP_SHARD(d == d0 ? d1 : d == d1 ? d0 : d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* expand: a kept dim stays sharded; a broadcast dim can be made sharded from a Replicate
 * input (each rank expands into its piece). */
int hp__shard_expand(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *in = &q->in[0], *out = &q->out[0];
    int off = out->rank - in->rank;
    for (int j = 0; j < out->rank; j++) {
        if (!divs(q, out, j)) continue;
        hp_shard_rule *r = add(&b);
        bool bcast = j < off || in->shape[j - off] != out->shape[j];
        r->in[0] = bcast ? HP_REPLICATE : HP_SHARD(j - off);
        r->out[0] = HP_SHARD(j);
    }
    partial_through(&b, 0);
    return b.n;
}

/* slice and slice_backward{dim}: any other dim may be sharded. */
int hp__shard_slice(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->in[0].rank, dim = attr_dim(q, HP_ATTR_DIM, rank, -1);
    for (int d = 0; d < rank; d++) {
        if (d == dim || !divs(q, &q->in[0], d) || !divs(q, &q->out[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* cat{dim}: every input sharded the same way on another dim. */
int hp__shard_cat(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->out[0].rank, dim = attr_dim(q, HP_ATTR_DIM, rank, -1);
    for (int d = 0; d < rank; d++) {
        bool ok = d != dim && divs(q, &q->out[0], d);
        for (int i = 0; ok && i < q->node->n_in; i++) ok = divs(q, &q->in[i], d);
        if (!ok) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    partial_all(&b);
    return b.n;
}

int hp__shard_unsqueeze(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int at = attr_dim(q, HP_ATTR_DIM, q->out[0].rank, 0);
    for (int d = 0; d < q->in[0].rank; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = HP_SHARD(d);
        r->out[0] = HP_SHARD(d < at ? d : d + 1);
    }
    partial_through(&b, 0);
    return b.n;
}

int hp__shard_squeeze(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->in[0].rank, at = attr_dim(q, HP_ATTR_DIM, rank, 0);
    bool gone = rank > 0 && q->in[0].shape[at] == 1;
    for (int d = 0; d < rank; d++) {
        if ((gone && d == at) || !divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = HP_SHARD(d);
        r->out[0] = HP_SHARD(gone && d > at ? d - 1 : d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* ---- matrix products ------------------------------------------------------------------------ */

/* mm [M, K] x [K, N]: rows of a, columns of b, or the contraction (a Partial sum). */
int hp__shard_mm(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *a = &q->in[0], *w = &q->in[1];
    hp_shard_rule *r;
    if (divs(q, a, 0)) {
        r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(0);
    }
    if (divs(q, w, 1)) {
        r = add(&b);
        r->in[1] = r->out[0] = HP_SHARD(1);
    }
    if (divs(q, a, 1)) {
        r = add(&b);
        r->in[0] = HP_SHARD(1);
        r->in[1] = HP_SHARD(0);
        r->out[0] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    partial_through(&b, 0);
    partial_through(&b, 1);
    return b.n;
}

/* bmm [B, M, K] x [B, K, N]: the batch, rows, columns, or the contraction. */
int hp__shard_bmm(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *a = &q->in[0], *w = &q->in[1];
    hp_shard_rule *r;
    if (divs(q, a, 0)) {
        r = add(&b);
        r->in[0] = r->in[1] = r->out[0] = HP_SHARD(0);
    }
    if (divs(q, a, 1)) {
        r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(1);
    }
    if (divs(q, w, 2)) {
        r = add(&b);
        r->in[1] = r->out[0] = HP_SHARD(2);
    }
    if (divs(q, a, 2)) {
        r = add(&b);
        r->in[0] = HP_SHARD(2);
        r->in[1] = HP_SHARD(1);
        r->out[0] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    partial_through(&b, 0);
    partial_through(&b, 1);
    return b.n;
}

/* addmm(bias, a, b) = beta·bias + alpha·a@b: as mm, the bias following the output by
 * broadcasting; a contraction split needs the bias as a partial term too. */
int hp__shard_addmm(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *bias = &q->in[0], *a = &q->in[1], *w = &q->in[2], *o = &q->out[0];
    hp_shard_rule *r;
    if (divs(q, a, 0)) {
        r = add(&b);
        r->in[0] = bcast_in(bias, o, 0);
        r->in[1] = r->out[0] = HP_SHARD(0);
    }
    if (divs(q, w, 1)) {
        r = add(&b);
        r->in[0] = bcast_in(bias, o, 1);
        r->in[2] = r->out[0] = HP_SHARD(1);
    }
    if (divs(q, a, 1)) {
        r = add(&b);
        r->in[0] = r->out[0] = HP_PARTIAL(HP_REDUCE_SUM);
        r->in[1] = HP_SHARD(1);
        r->in[2] = HP_SHARD(0);
    }
    for (size_t i = 0; i < HP_ARRAY_LEN(LINEAR); i++) {
        for (int j = 1; j <= 2; j++) {
            r = add(&b);
            r->in[0] = r->in[j] = r->out[0] = HP_PARTIAL(LINEAR[i]);
        }
    }
    return b.n;
}

/* ---- nn ------------------------------------------------------------------------------------- */

/* embedding(weight [V, D], indices [...]) -> [..., D]: the embedding dim, or any index dim.
 * A vocab-sharded weight needs a masked lookup at each rank's row offset: not a local op. */
int hp__shard_embedding(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *w = &q->in[0], *idx = &q->in[1];
    hp_shard_rule *r;
    if (divs(q, w, 1)) {
        r = add(&b);
        r->in[0] = HP_SHARD(1);
        r->out[0] = HP_SHARD(idx->rank);
    }
    for (int d = 0; d < idx->rank; d++) {
        if (!divs(q, idx, d)) continue;
        r = add(&b);
        r->in[1] = r->out[0] = HP_SHARD(d);
    }
    return b.n;
}

/* embedding_dense_backward(grad [..., D], indices [...]) -> [V, D]: the embedding dim, or an
 * index dim (each rank scatters its rows: a Partial sum); linear in grad. */
int hp__shard_embedding_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *g = &q->in[0], *idx = &q->in[1];
    hp_shard_rule *r;
    if (divs(q, g, g->rank - 1)) {
        r = add(&b);
        r->in[0] = HP_SHARD(g->rank - 1);
        r->out[0] = HP_SHARD(1);
    }
    for (int d = 0; d < idx->rank; d++) {
        if (!divs(q, idx, d)) continue;
        r = add(&b);
        r->in[0] = r->in[1] = HP_SHARD(d);
        r->out[0] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    partial_through(&b, 0);
    return b.n;
}

/* chunked_embedding(weight [V, D], indices [...], base [k]): weight and base Shard(0) together
 * is the vocab-parallel lookup (a rank's chunks of rows, the entries its bases name, the masked
 * lookup summed over ranks: Partial(sum)); otherwise as embedding (the embedding dim, an index
 * dim) with base whole, and linear in weight. */
int hp__shard_chunked_embedding(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *w = &q->in[0], *idx = &q->in[1], *base = &q->in[2];
    hp_shard_rule *r;
    if (divs(q, w, 0) && divs(q, base, 0)) {
        r = add(&b);
        r->in[0] = r->in[2] = HP_SHARD(0);
        r->out[0] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    if (divs(q, w, 1)) {
        r = add(&b);
        r->in[0] = HP_SHARD(1);
        r->out[0] = HP_SHARD(idx->rank);
    }
    for (int d = 0; d < idx->rank; d++) {
        if (!divs(q, idx, d)) continue;
        r = add(&b);
        r->in[1] = r->out[0] = HP_SHARD(d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* chunked_embedding_backward(grad [..., D], indices [...], base [k]) -> [V, D]: base Shard(0)
 * gives each rank the gradient of its chunks of rows (Shard(0)); otherwise as
 * embedding_dense_backward with base whole. */
int hp__shard_chunked_embedding_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_type *base = &q->in[2];
    if (divs(q, &q->out[0], 0) && divs(q, base, 0)) {
        hp_shard_rule *r = add(&b);
        r->in[2] = r->out[0] = HP_SHARD(0);
    }
    int n = hp__shard_embedding_backward(q, b.n < b.cap ? b.rules + b.n : NULL,
                                         b.n < b.cap ? b.cap - b.n : 0);
    return b.n + n;
}

/* _softmax / _log_softmax{dim}: any other dim. */
int hp__shard_softmax(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->in[0].rank, dim = attr_dim(q, HP_ATTR_DIM, rank, -1);
    for (int d = 0; d < rank; d++) {
        if (d == dim || !divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    return b.n;
}

/* (grad, output){dim}: any other dim; linear in grad. */
int hp__shard_softmax_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    int rank = q->in[0].rank, dim = attr_dim(q, HP_ATTR_DIM, rank, -1);
    for (int d = 0; d < rank; d++) {
        if (d == dim || !divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = r->out[0] = HP_SHARD(d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* nll_loss_forward(logp [N, C], target [N]) -> (loss, total_weight): the batch. The loss of a
 * sum is a Partial sum; of a mean, a Partial average — exact when every rank counts as many
 * targets (no ignore_index among them, or equally many), which is the data-parallel
 * assumption every FSDP/DDP run makes; total_weight is a Partial sum. Vocab-sharded logp
 * (loss parallel) needs each rank's column offset: not a local op. */
int hp__shard_nll_loss(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    if (q->in[0].rank == 2 && divs(q, &q->in[0], 0)) {
        int64_t red = hp_node_int(q->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = HP_SHARD(0);
        r->out[0] = red == HP_NLL_NONE  ? HP_SHARD(0)
                    : red == HP_NLL_SUM ? HP_PARTIAL(HP_REDUCE_SUM)
                                        : HP_PARTIAL(HP_REDUCE_AVG);
        r->out[1] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    return b.n;
}

/* nll_loss_backward(grad, logp [N, C], target [N], total_weight) -> [N, C]: the batch, with
 * the global total_weight (Replicate); linear in grad. */
int hp__shard_nll_loss_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    if (q->in[1].rank == 2 && divs(q, &q->in[1], 0)) {
        bool none = hp_node_int(q->node, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_NONE;
        hp_shard_rule *r = add(&b);
        r->in[0] = none ? HP_SHARD(0) : HP_REPLICATE;
        r->in[1] = r->in[2] = r->out[0] = HP_SHARD(0);
    }
    partial_through(&b, 0);
    return b.n;
}

/* fused_cross_entropy(logits [N, C], target [N]) -> (loss, total_weight, lse [N]): the batch,
 * as nll_loss (the loss a Partial sum or average, total_weight a Partial sum), lse split with
 * it. The vocab dim is not local (each row's lse sums over it). */
int hp__shard_fused_cross_entropy(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    if (q->in[0].rank == 2 && divs(q, &q->in[0], 0)) {
        int64_t red = hp_node_int(q->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = r->out[2] = HP_SHARD(0);
        r->out[0] = red == HP_NLL_SUM ? HP_PARTIAL(HP_REDUCE_SUM) : HP_PARTIAL(HP_REDUCE_AVG);
        r->out[1] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    return b.n;
}

/* fused_cross_entropy_backward(grad, logits [N, C], target [N], lse [N], total_weight) ->
 * [N, C]: the batch, with the global grad and total_weight (Replicate); linear in grad. */
int hp__shard_fused_cross_entropy_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    if (q->in[1].rank == 2 && divs(q, &q->in[1], 0)) {
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[4] = HP_REPLICATE;
        r->in[1] = r->in[2] = r->in[3] = r->out[0] = HP_SHARD(0);
    }
    partial_through(&b, 0);
    return b.n;
}

/* swiglu_backward(g, a, b) -> (ga, gb): elementwise, any dim split alike; linear in g. */
int hp__shard_swiglu_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = r->in[2] = r->out[0] = r->out[1] = HP_SHARD(d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* _fused_rms_norm(x [..., D], w [D]) -> (y, rstd [...]): any dim but the normalized one. */
int hp__shard_rms_norm(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank - 1; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = r->out[1] = HP_SHARD(d);
    }
    return b.n;
}

/* (grad_y, x, w, rstd) -> (grad_x, grad_w): rows split, grad_w a Partial sum; linear in
 * grad_y. */
int hp__shard_rms_norm_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank - 1; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = r->in[3] = r->out[0] = HP_SHARD(d);
        r->out[1] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    partial_through(&b, 0);
    return b.n;
}

/* native_layer_norm(x [..., D], w, b) -> (y, mean, rstd [..., 1]): any dim but the normalized
 * one; weight and bias whole. */
int hp__shard_layer_norm(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank - 1; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = r->out[1] = r->out[2] = HP_SHARD(d);
    }
    return b.n;
}

/* (grad_y, x, mean, rstd, w) -> (grad_x, grad_w, grad_b): rows split, the affine gradients
 * Partial sums; linear in grad_y. */
int hp__shard_layer_norm_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank - 1; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->in[1] = r->in[2] = r->in[3] = r->out[0] = HP_SHARD(d);
        r->out[1] = r->out[2] = HP_PARTIAL(HP_REDUCE_SUM);
    }
    partial_through(&b, 0);
    return b.n;
}

/* tril(x [..., M, N]): the leading (batch) dims; the mask needs whole rows and columns. A mask
 * is linear. */
int hp__shard_tril(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank - 2; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    if (hp_dtype_is_float(q->in[0].dtype)) partial_through(&b, 0);
    return b.n;
}

/* Replicate-only ops (HP_OPF_REPLICATE_ONLY): no rule. */
int hp__shard_none(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    (void)q, (void)rules, (void)cap;
    return 0;
}

/* rotary_emb(x [B, T, H, D]): the batch or the heads (positions and pairs stay whole);
 * a rotation is linear. */
int hp__shard_rotary(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    static const int dims[] = {0, 2};
    for (size_t i = 0; i < HP_ARRAY_LEN(dims); i++) {
        if (!divs(q, &q->in[0], dims[i])) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(dims[i]);
    }
    partial_through(&b, 0);
    return b.n;
}

/* Attention on q [B, H, T, D], k/v [B, Hkv, S, D]: the batch, or the heads when both H and
 * Hkv divide (rank i's query heads then use exactly rank i's kv heads). Non-causal attention
 * may also split the queries (T). */
static void sdpa_rules(rb *b, int n_in, int n_out, bool forward) {
    const hp_shard_query *q = b->q;
    const hp_type *qt = &q->in[forward ? 0 : 1], *kt = &q->in[forward ? 1 : 2];
    if (divs(q, qt, 0)) {
        hp_shard_rule *r = add(b);
        for (int i = 0; i < n_in; i++) r->in[i] = HP_SHARD(0);
        for (int k = 0; k < n_out; k++) r->out[k] = HP_SHARD(0);
    }
    if (divs(q, qt, 1) && divs(q, kt, 1)) {
        hp_shard_rule *r = add(b);
        for (int i = 0; i < n_in; i++) r->in[i] = HP_SHARD(1);
        for (int k = 0; k < n_out; k++) r->out[k] = HP_SHARD(1);
    }
    if (forward && !hp_node_int(q->node, HP_ATTR_CAUSAL, 0) && divs(q, qt, 2)) {
        hp_shard_rule *r = add(b);
        r->in[0] = r->out[0] = r->out[1] = HP_SHARD(2);
    }
}

int hp__shard_sdpa(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    sdpa_rules(&b, 3, 2, true);
    return b.n;
}

int hp__shard_sdpa_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    sdpa_rules(&b, 6, 3, false);
    return b.n;
}

/* ---- collectives ---------------------------------------------------------------------------- */

/* On their own mesh dim a collective IS a redistribution: all_gather Shard(0) -> Replicate,
 * reduce_scatter Partial(op) -> Shard(0) (and, averaging, Replicate -> Shard(0): a rank's
 * chunk of a replicated value), all_reduce Partial(op) -> Replicate (op the node's reduce_op);
 * local_chunk Replicate -> Shard(dim) (a rank's own chunk);
 * all_to_all_single of a global [n, n, ...] (n the group's size) is in.transpose(0, 1),
 * Shard(0) -> Shard(0): rank r holds in[r] (local [1, n, ...]), sends in[r, j] to rank j and
 * receives out[r, k] = in[k, r] from rank k, exactly the primitive's exchange of n equal flat
 * parts (spmd composes it with views into Shard(a) -> Shard(b)). On every other mesh dim the
 * data passes through unchanged, except a Shard(0) under a gather or scatter along dim 0 (that
 * would interleave), a Shard(0) or Shard(1) under all_to_all_single (the exchanged dims) or a
 * Shard(dim) under local_chunk. */
int hp__shard_collective(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    const hp_attr *g = hp_node_attr(q->node, HP_ATTR_GROUP);
    bool own = g && g->s && q->mesh_dim && !strcmp(g->s, q->mesh_dim);
    hp_reduce_op op = (hp_reduce_op)hp_node_int(q->node, HP_ATTR_REDUCE_OP, HP_REDUCE_SUM);
    hp_op kind = q->node->op;
    hp_shard_rule *r;
    if (own) {
        if (kind == HP_OP_ALL_GATHER) {
            r = add(&b);
            r->in[0] = HP_SHARD(0);
        } else if (kind == HP_OP_REDUCE_SCATTER) {
            r = add(&b);
            r->in[0] = HP_PARTIAL(op);
            r->out[0] = HP_SHARD(0);
            if (op == HP_REDUCE_AVG) { /* the average of identical replicas is the value */
                r = add(&b);
                r->out[0] = HP_SHARD(0);
            }
        } else if (kind == HP_OP_ALL_REDUCE) {
            r = add(&b);
            r->in[0] = HP_PARTIAL(op);
        } else if (kind == HP_OP_LOCAL_CHUNK) {
            r = add(&b);
            r->out[0] = HP_SHARD(attr_dim(q, HP_ATTR_DIM, q->in[0].rank, 0));
        } else if (kind == HP_OP_ALL_TO_ALL && q->in[0].rank >= 2 &&
                   q->in[0].shape[0] == q->mesh_size && q->in[0].shape[1] == q->mesh_size) {
            r = add(&b);
            r->in[0] = r->out[0] = HP_SHARD(0);
        }
        return b.n;
    }
    bool along0 = kind != HP_OP_ALL_REDUCE && kind != HP_OP_LOCAL_CHUNK;
    int chunked = kind == HP_OP_LOCAL_CHUNK ? attr_dim(q, HP_ATTR_DIM, q->in[0].rank, 0) : 0;
    int from = kind == HP_OP_ALL_TO_ALL ? 2 : along0 ? 1 : 0;
    for (int d = from; d < q->in[0].rank; d++) {
        if (kind == HP_OP_LOCAL_CHUNK && d == chunked) continue; /* a chunk of a shard */
        if (!divs(q, &q->in[0], d) || !divs(q, &q->out[0], d)) continue;
        r = add(&b);
        r->in[0] = r->out[0] = HP_SHARD(d);
    }
    partial_through(&b, 0);
    return b.n;
}

/* ---- dropout -------------------------------------------------------------------------------- */

/* native_dropout: the mask of an element depends on its global index only, so every rank's
 * piece drops what the whole tensor drops: Shard(d) passes (mask Shard(d)), and Partial(op)
 * passes too (every rank draws the same, Replicate, mask, and x * m / (1 - p) with m >= 0 is
 * linear and monotone in x). */
int hp__shard_dropout(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    for (int d = 0; d < q->in[0].rank; d++) {
        if (!divs(q, &q->in[0], d)) continue;
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = r->out[1] = HP_SHARD(d);
    }
    static const hp_reduce_op all[] = {HP_REDUCE_SUM, HP_REDUCE_AVG, HP_REDUCE_MAX};
    for (size_t i = 0; i < HP_ARRAY_LEN(all); i++) {
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_PARTIAL(all[i]);
    }
    return b.n;
}

/* native_dropout_backward(grad, mask): elementwise; a Partial gradient passes with a
 * Replicate mask (the rule above gives one). */
int hp__shard_dropout_backward(const hp_shard_query *q, hp_shard_rule *rules, int cap) {
    rb b = rb_init(q, rules, cap);
    pointwise(&b);
    static const hp_reduce_op all[] = {HP_REDUCE_SUM, HP_REDUCE_AVG, HP_REDUCE_MAX};
    for (size_t i = 0; i < HP_ARRAY_LEN(all); i++) {
        hp_shard_rule *r = add(&b);
        r->in[0] = r->out[0] = HP_PARTIAL(all[i]);
    }
    return b.n;
}
