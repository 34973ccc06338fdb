/* passes/canonicalize.c — puts a graph in one normal form so that later passes (and CSE)
 * match patterns reliably, and folds what does nothing:
 *
 *   normal form   reshape, squeeze, unsqueeze → view; view and expand carry their explicit
 *                 output shape (no -1); a transpose, t or permute becomes the composition of
 *                 any chain of them: nothing (identity), t (a swap of a rank-2 value),
 *                 transpose {dim0 < dim1} (one swap) or permute; dims attributes are
 *                 non-negative (reductions' dims sorted, all dims written as []); slices
 *                 carry clamped non-negative bounds and an explicit step; the operands of
 *                 add, mul, maximum and eq are ordered by value id.
 *   folds         view/expand to the same type, view of view, expand of expand, clone,
 *                 _to_copy to the same dtype, t(t(x)), transposes that cancel, full slices
 *                 (and their slice_backward), reductions that reduce nothing, cat of one
 *                 input, mul_scalar by 1, pow by 1.
 *   products      t(mm(a, b)) whose mm has no other use becomes mm(t(b), t(a)): the transpose
 *                 of a weight gradient's product (autodiff's t(mm(t(x), g))) is then no copy,
 *                 since lowering folds transposed operands into the product (mm(t(g), x)).
 *   CSE           nodes with the same op, inputs (after the above) and attributes are one node
 *                 (hash-consing); never placeholders, collectives or wait_tensor, whose
 *                 identity matters.
 *
 * Nodes made dead by a fold are removed (hp__dce). The pass is idempotent. It does not do
 * algebra beyond the identities above (no constant folding: values are never known here).
 */
#include "passes/passes_internal.h"

#include <string.h>

/* A node about to be emitted: the old node with its inputs mapped and its form normalized. */
typedef struct cand {
    hp_op op;
    int n_in, n_out, n_attrs;
    hp_value *in; /* [n_in], scratch owned by the pass */
    const hp_type *out;
    hp_attr attrs[HP_ATTR_COUNT];
} cand;

static int norm_dim(int64_t d, int rank) {
    return (int)(d < 0 ? d + rank : d);
}

static void set_attr(cand *c, hp_attr a) {
    int i = 0;
    while (i < c->n_attrs && c->attrs[i].key < a.key) i++;
    if (i < c->n_attrs && c->attrs[i].key == a.key) {
        c->attrs[i] = a;
        return;
    }
    memmove(&c->attrs[i + 1], &c->attrs[i], (size_t)(c->n_attrs - i) * sizeof *c->attrs);
    c->attrs[i] = a;
    c->n_attrs++;
}

static const hp_attr *get_attr(const cand *c, hp_attr_key k) {
    for (int i = 0; i < c->n_attrs; i++)
        if (c->attrs[i].key == k) return &c->attrs[i];
    return NULL;
}

static int64_t get_int(const cand *c, hp_attr_key k, int64_t dflt) {
    const hp_attr *a = get_attr(c, k);
    return a ? a->i : dflt;
}

static void become(cand *c, hp_op op) {
    c->op = op;
    c->n_attrs = 0;
}

/* Python slice bounds on a dim of size n (step >= 1): clamped start and element count. */
static void slice_bounds(int64_t n, int64_t start, int64_t end, int64_t step, int64_t *s,
                         int64_t *len) {
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < 0 ? 0 : end > n ? n : end;
    *s = start;
    *len = end > start ? (end - start + step - 1) / step : 0;
}

/* Normalizes a slice's attributes against the sliced dim's rank/sizes; true if it selects
 * everything (a no-op). */
static bool norm_slice(cand *c, const hp_type *full) {
    int dim = norm_dim(get_int(c, HP_ATTR_DIM, 0), full->rank);
    int64_t step = get_int(c, HP_ATTR_STEP, 1), s, len, n = full->shape[dim];
    slice_bounds(n, get_int(c, HP_ATTR_START, 0), get_int(c, HP_ATTR_END, 0), step, &s, &len);
    set_attr(c, hp_attr_int(HP_ATTR_DIM, dim));
    set_attr(c, hp_attr_int(HP_ATTR_START, s));
    set_attr(c, hp_attr_int(HP_ATTR_END, len > 0 ? s + (len - 1) * step + 1 : s));
    set_attr(c, hp_attr_int(HP_ATTR_STEP, step));
    return s == 0 && len == n && step == 1;
}

/* The permutation a t / transpose / permute node applies (out dim i = in dim perm[i]).
 * `attrs` are the node's (possibly negative) attributes; rank is the output rank. */
static void perm_of(hp_op op, const hp_attr *dim0, const hp_attr *dim1, const hp_attr *perm,
                    int rank, int *p) {
    for (int i = 0; i < rank; i++) p[i] = i;
    if (op == HP_OP_T) {
        if (rank == 2) p[0] = 1, p[1] = 0;
    } else if (op == HP_OP_TRANSPOSE) {
        int a = norm_dim(dim0->i, rank), b = norm_dim(dim1->i, rank);
        p[a] = b;
        p[b] = a;
    } else {
        for (int i = 0; i < rank; i++) p[i] = norm_dim(perm->ints.v[i], rank);
    }
}

static bool is_perm_op(hp_op op) {
    return op == HP_OP_T || op == HP_OP_TRANSPOSE || op == HP_OP_PERMUTE;
}

/* t, transpose and permute: compose with a producing chain, then emit the normal form.
 * Returns true when the result is the identity (*fold set). */
static bool norm_perm(cand *c, const hp_graph *g, hp_value *fold) {
    int rank = c->out[0].rank, p[HP_MAX_RANK];
    perm_of(c->op, get_attr(c, HP_ATTR_DIM0), get_attr(c, HP_ATTR_DIM1), get_attr(c, HP_ATTR_PERM),
            rank, p);
    for (;;) {
        const hp_node *src = &g->nodes[c->in[0].node];
        if (!is_perm_op(src->op)) break;
        int q[HP_MAX_RANK], r[HP_MAX_RANK] = {0};
        perm_of(src->op, hp_node_attr(src, HP_ATTR_DIM0), hp_node_attr(src, HP_ATTR_DIM1),
                hp_node_attr(src, HP_ATTR_PERM), rank, q);
        for (int i = 0; i < rank; i++) r[i] = q[p[i]];
        memcpy(p, r, (size_t)rank * sizeof *r);
        c->in[0] = src->in[0];
    }
    int moved[HP_MAX_RANK], n_moved = 0;
    for (int i = 0; i < rank; i++)
        if (p[i] != i) moved[n_moved++] = i;
    if (n_moved == 0) {
        *fold = c->in[0];
        return true;
    }
    if (n_moved == 2 && rank == 2) {
        become(c, HP_OP_T);
    } else if (n_moved == 2) {
        become(c, HP_OP_TRANSPOSE);
        set_attr(c, hp_attr_int(HP_ATTR_DIM0, moved[0]));
        set_attr(c, hp_attr_int(HP_ATTR_DIM1, moved[1]));
    } else {
        int64_t v[HP_MAX_RANK];
        for (int i = 0; i < rank; i++) v[i] = p[i];
        become(c, HP_OP_PERMUTE);
        set_attr(c, hp_attr_ints(HP_ATTR_PERM, rank, v));
    }
    return false;
}

/* A reduction's dims: non-negative, sorted, [] when every dim is reduced. */
static void norm_reduce_dims(cand *c, int rank) {
    const hp_attr *a = get_attr(c, HP_ATTR_DIMS);
    bool mask[HP_MAX_RANK] = {false};
    int n = 0;
    for (int i = 0; i < a->ints.n; i++) mask[norm_dim(a->ints.v[i], rank)] = true;
    int64_t v[HP_MAX_RANK];
    for (int d = 0; d < rank; d++)
        if (mask[d]) v[n++] = d;
    set_attr(c, hp_attr_ints(HP_ATTR_DIMS, n == rank ? 0 : n, v));
}

static bool commutative(hp_op op) {
    return op == HP_OP_ADD || op == HP_OP_MUL || op == HP_OP_MAXIMUM || op == HP_OP_EQ;
}

static bool value_lt(hp_value a, hp_value b) {
    return a.node != b.node ? a.node < b.node : a.out < b.out;
}

/* Applies the rules to c (whose inputs are new-graph values). Returns true when the node
 * folds away into *fold (then its only output is *fold). */
static bool simplify(cand *c, const hp_graph *g, hp_value *fold) {
    if (c->n_in == 0) return false; /* creation ops: nothing to fold, only CSE */
    const hp_type *x = hp_graph_type(g, c->in[0]);
    switch (c->op) {
    case HP_OP_RESHAPE:
    case HP_OP_SQUEEZE:
    case HP_OP_UNSQUEEZE:
    case HP_OP_VIEW:
        become(c, HP_OP_VIEW);
        set_attr(c, hp_attr_ints(HP_ATTR_SHAPE, c->out[0].rank, c->out[0].shape));
        while (g->nodes[c->in[0].node].op == HP_OP_VIEW) c->in[0] = g->nodes[c->in[0].node].in[0];
        break;
    case HP_OP_EXPAND:
        set_attr(c, hp_attr_ints(HP_ATTR_SHAPE, c->out[0].rank, c->out[0].shape));
        while (g->nodes[c->in[0].node].op == HP_OP_EXPAND) c->in[0] = g->nodes[c->in[0].node].in[0];
        break;
    case HP_OP_CLONE:
    case HP_OP_DETACH: /* its work was done in autodiff */
        *fold = c->in[0];
        return true;
    case HP_OP_TO_COPY:
        if (x->dtype == c->out[0].dtype) {
            *fold = c->in[0];
            return true;
        }
        return false;
    case HP_OP_T:
    case HP_OP_TRANSPOSE:
    case HP_OP_PERMUTE:
        return norm_perm(c, g, fold);
    case HP_OP_SLICE:
        if (norm_slice(c, x)) {
            *fold = c->in[0];
            return true;
        }
        return false;
    case HP_OP_SLICE_BACKWARD:
        if (norm_slice(c, &c->out[0])) {
            *fold = c->in[0];
            return true;
        }
        return false;
    case HP_OP_SUM:
    case HP_OP_MEAN:
    case HP_OP_AMAX:
        norm_reduce_dims(c, x->rank);
        break; /* reducing nothing (size-1 dims kept): same type, folds below */
    case HP_OP_LOG_SOFTMAX:
    case HP_OP_SOFTMAX:
    case HP_OP_LOG_SOFTMAX_BACKWARD:
    case HP_OP_SOFTMAX_BACKWARD:
        set_attr(c, hp_attr_int(HP_ATTR_DIM, norm_dim(get_int(c, HP_ATTR_DIM, 0), x->rank)));
        return false;
    case HP_OP_CAT:
        if (c->n_in == 1) {
            *fold = c->in[0];
            return true;
        }
        set_attr(c, hp_attr_int(HP_ATTR_DIM, norm_dim(get_int(c, HP_ATTR_DIM, 0), x->rank)));
        return false;
    case HP_OP_MUL_SCALAR:
    case HP_OP_POW: {
        const hp_attr *a = get_attr(c, c->op == HP_OP_POW ? HP_ATTR_EXPONENT : HP_ATTR_VALUE);
        if (a->f == 1.0) {
            *fold = c->in[0];
            return true;
        }
        return false;
    }
    default:
        if (commutative(c->op) && value_lt(c->in[1], c->in[0])) {
            hp_value t = c->in[0];
            c->in[0] = c->in[1];
            c->in[1] = t;
        }
        return false;
    }
    /* views, expands and reductions: a result of the input's very type is the input */
    if (hp_type_eq(hp_graph_type(g, c->in[0]), &c->out[0])) {
        *fold = c->in[0];
        return true;
    }
    return false;
}

/* ---- CSE: a hash set of new-graph node ids, keyed by (op, inputs, attributes) ---------------- */

/* A slot: a new-graph node id (-1 empty) and the high bits of its hash, so that most probes
 * of a full slot end here without reading the node (a cache miss each at 4096 layers). */
typedef struct cse_slot {
    int32_t id;
    uint32_t tag;
} cse_slot;

typedef struct cse_table {
    cse_slot *slot;
    uint64_t mask;
} cse_table;

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t hash_attr(uint64_t h, const hp_attr *a) {
    h = mix(h, (uint64_t)a->key);
    switch (a->kind) {
    case HP_ATTR_KIND_INT:
        return mix(h, (uint64_t)a->i);
    case HP_ATTR_KIND_FLOAT: {
        uint64_t bits;
        memcpy(&bits, &a->f, sizeof bits);
        return mix(h, bits);
    }
    case HP_ATTR_KIND_INTS:
        for (int i = 0; i < a->ints.n; i++) h = mix(h, (uint64_t)a->ints.v[i]);
        return mix(h, (uint64_t)a->ints.n);
    case HP_ATTR_KIND_DTYPE:
        return mix(h, (uint64_t)a->dtype);
    case HP_ATTR_KIND_STR:
        for (const char *s = a->s; *s; s++) h = mix(h, (uint64_t)(unsigned char)*s);
        return h;
    case HP_ATTR_KIND_INIT:
        return mix(h, (uint64_t)a->init.kind);
    }
    return h;
}

static bool attr_same(const hp_attr *a, const hp_attr *b) {
    if (a->key != b->key || a->kind != b->kind) return false;
    switch (a->kind) {
    case HP_ATTR_KIND_INT:
        return a->i == b->i;
    case HP_ATTR_KIND_FLOAT:
        return memcmp(&a->f, &b->f, sizeof a->f) == 0;
    case HP_ATTR_KIND_INTS:
        return a->ints.n == b->ints.n &&
               !memcmp(a->ints.v, b->ints.v, (size_t)a->ints.n * sizeof a->ints.v[0]);
    case HP_ATTR_KIND_DTYPE:
        return a->dtype == b->dtype;
    case HP_ATTR_KIND_STR:
        return strcmp(a->s, b->s) == 0;
    case HP_ATTR_KIND_INIT:
        return !memcmp(&a->init, &b->init, sizeof a->init);
    }
    return false;
}

static uint64_t hash_cand(const cand *c) {
    uint64_t h = mix((uint64_t)c->op, (uint64_t)c->n_in);
    for (int i = 0; i < c->n_in; i++)
        h = mix(h, (uint64_t)(uint32_t)c->in[i].node << 8 | (uint64_t)(uint32_t)c->in[i].out);
    for (int i = 0; i < c->n_attrs; i++) h = hash_attr(h, &c->attrs[i]);
    return h;
}

static bool same_node(const cand *c, const hp_node *n) {
    if (c->op != n->op || c->n_in != n->n_in || c->n_out != n->n_out || c->n_attrs != n->n_attrs)
        return false;
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i].node != n->in[i].node || c->in[i].out != n->in[i].out) return false;
    for (int i = 0; i < c->n_attrs; i++)
        if (!attr_same(&c->attrs[i], &n->attrs[i])) return false;
    for (int i = 0; i < c->n_out; i++)
        if (!hp_type_eq(&c->out[i], &n->out[i])) return false;
    return true;
}

static bool cse_ok(hp_op op) {
    return op != HP_OP_PLACEHOLDER && op != HP_OP_WAIT_TENSOR &&
           !(hp_op_get(op)->flags & HP_OPF_COLLECTIVE);
}

/* The slot for c: an existing equal node's, or the empty one where it would go. */
static cse_slot *cse_find(const cse_table *t, const hp_graph *g, const cand *c) {
    /* mix's multiply carries only upwards: the low bits the mask keeps needed a final
     * avalanche (splitmix64's), or similar nodes clustered (6 probes a lookup at 4096 layers) */
    uint64_t h = hash_cand(c);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;; h++) {
        cse_slot *s = &t->slot[h & t->mask];
        if (s->id < 0) {
            s->tag = tag; /* for the caller's insert */
            return s;
        }
        if (s->tag == tag && same_node(c, &g->nodes[s->id])) return s;
    }
}

/* ---- the pass ---------------------------------------------------------------------------------
 */

static hp_status emit(hp__rewrite *rw, cse_table *t, int old, cand *c, hp_err *err) {
    hp_value fold;
    if (simplify(c, rw->out, &fold)) {
        hp__rewrite_set(rw, (hp_value){old, 0}, fold);
        return HP_OK;
    }
    cse_slot *slot = NULL;
    if (cse_ok(c->op)) {
        slot = cse_find(t, rw->out, c);
        if (slot->id >= 0) {
            for (int k = 0; k < c->n_out; k++)
                hp__rewrite_set(rw, (hp_value){old, k}, (hp_value){slot->id, k});
            return HP_OK;
        }
    }
    /* a node simplify left as it was is copied as such (sharing a lending graph's storage) */
    const hp_node *n = &rw->in->nodes[old];
    bool unchanged =
        c->op == n->op && c->n_in == n->n_in && c->out == n->out && c->n_out == n->n_out &&
        c->n_attrs == n->n_attrs &&
        (!n->n_attrs || !memcmp(c->attrs, n->attrs, (size_t)n->n_attrs * sizeof *n->attrs));
    int id = unchanged ? hp_graph_append_like(rw->out, rw->in, n, c->in, err)
                       : hp__rewrite_append(rw, c->op, c->in, c->n_in, c->out, c->n_out, c->attrs,
                                            c->n_attrs, err);
    if (id < 0) return err ? err->status : HP_NOMEM;
    if (slot) slot->id = id;
    for (int k = 0; k < c->n_out; k++) hp__rewrite_set(rw, (hp_value){old, k}, (hp_value){id, k});
    return HP_OK;
}

/* Emits a node the input graph does not have (simplified and CSE'd like the others); *v is its
 * first output, or what it folded into. */
static hp_status emit_new(hp__rewrite *rw, cse_table *t, cand *c, hp_value *v, hp_err *err) {
    if (simplify(c, rw->out, v)) return HP_OK;
    cse_slot *slot = cse_ok(c->op) ? cse_find(t, rw->out, c) : NULL;
    if (slot && slot->id >= 0) {
        *v = (hp_value){slot->id, 0};
        return HP_OK;
    }
    int id =
        hp__rewrite_append(rw, c->op, c->in, c->n_in, c->out, c->n_out, c->attrs, c->n_attrs, err);
    if (id < 0) return err ? err->status : HP_NOMEM;
    if (slot) slot->id = id;
    *v = (hp_value){id, 0};
    return HP_OK;
}

/* Old node i is a swap of a rank-2 value that is an mm's product no other node (or output) uses. */
static bool is_product_transpose(const hp_graph *g, int i, const int32_t *uses) {
    const hp_node *n = &g->nodes[i];
    if (!is_perm_op(n->op) || n->n_in != 1 || n->out[0].rank != 2) return false;
    const hp_node *m = &g->nodes[n->in[0].node];
    if (m->op != HP_OP_MM || m->n_out != 1 || uses[n->in[0].node] != 1) return false;
    int p[HP_MAX_RANK];
    perm_of(n->op, hp_node_attr(n, HP_ATTR_DIM0), hp_node_attr(n, HP_ATTR_DIM1),
            hp_node_attr(n, HP_ATTR_PERM), 2, p);
    return p[0] == 1 && p[1] == 0;
}

/* t(mm(a, b)) -> mm(t(b), t(a)) for old node i (is_product_transpose). */
static hp_status emit_transposed_product(hp__rewrite *rw, cse_table *t, int i, hp_err *err) {
    const hp_graph *g = rw->in;
    const hp_node *n = &g->nodes[i], *m = &g->nodes[n->in[0].node];
    hp_value ab[2], tt[2];
    hp_type ty[2];
    for (int k = 0; k < 2; k++) {
        ab[k] = hp__rewrite_get(rw, m->in[k]);
        if (!hp_value_ok(ab[k]))
            return hp_errf(err, HP_INTERNAL, "node %d: input %d has no rewritten value",
                           n->in[0].node, k);
        ty[k] = *hp_graph_type(rw->out, ab[k]);
        ty[k].shape[0] = ty[k].shape[1];
        ty[k].shape[1] = hp_graph_type(rw->out, ab[k])->shape[0];
        cand c = {.op = HP_OP_T, .n_in = 1, .n_out = 1, .in = &ab[k], .out = &ty[k]};
        HP_TRY(emit_new(rw, t, &c, &tt[k], err));
    }
    hp_value in[2] = {tt[1], tt[0]}, v;
    cand c = {
        .op = HP_OP_MM, .n_in = 2, .n_out = 1, .n_attrs = m->n_attrs, .in = in, .out = n->out};
    if (m->n_attrs) memcpy(c.attrs, m->attrs, (size_t)m->n_attrs * sizeof *m->attrs);
    HP_TRY(emit_new(rw, t, &c, &v, err));
    hp__rewrite_set(rw, (hp_value){i, 0}, v);
    return HP_OK;
}

hp_status hp_pass_canonicalize(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    (void)ctx;
    *out = NULL;
    int max_in = 1;
    for (int i = 0; i < in->n_nodes; i++)
        if (in->nodes[i].n_in > max_in) max_in = in->nodes[i].n_in;
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)in->n_nodes) cap *= 2;
    cse_table t = {.slot = hp_malloc(cap * sizeof *t.slot), .mask = cap - 1};
    hp_value *ins = hp_malloc((size_t)max_in * sizeof *ins);
    int32_t *uses = hp_calloc((size_t)in->n_nodes + 1, sizeof *uses);
    hp__rewrite rw;
    hp_err e = {0};
    hp_status st = HP_NOMEM;
    if (!t.slot || !ins || !uses) {
        st = hp_errf(&e, HP_NOMEM, "out of memory in canonicalize");
        goto done;
    }
    memset(t.slot, 0xff, cap * sizeof *t.slot);
    for (int i = 0; i < in->n_nodes; i++)
        for (int k = 0; k < in->nodes[i].n_in; k++) uses[in->nodes[i].in[k].node]++;
    for (int i = 0; i < in->n_outputs; i++) uses[in->outputs[i].node]++;
    if ((st = hp__rewrite_start(&rw, in, &e)) != HP_OK) goto done;
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) {
        const hp_node *n = &in->nodes[i];
        if (n->op == HP_OP_PLACEHOLDER) {
            if (hp__rewrite_copy(&rw, i, &e) < 0) st = e.status;
            continue;
        }
        if (is_product_transpose(in, i, uses)) {
            st = emit_transposed_product(&rw, &t, i, &e);
            continue;
        }
        cand c = {.op = n->op,
                  .n_in = n->n_in,
                  .n_out = n->n_out,
                  .n_attrs = n->n_attrs,
                  .in = ins,
                  .out = n->out};
        if (n->n_attrs) memcpy(c.attrs, n->attrs, (size_t)n->n_attrs * sizeof *n->attrs);
        for (int k = 0; k < n->n_in && st == HP_OK; k++) {
            ins[k] = hp__rewrite_get(&rw, n->in[k]);
            if (!hp_value_ok(ins[k]))
                st = hp_errf(&e, HP_INTERNAL, "node %d: input %d has no rewritten value", i, k);
        }
        if (st == HP_OK) st = emit(&rw, &t, i, &c, &e);
    }
    hp_graph *mid = NULL;
    if (st != HP_OK) {
        hp__rewrite_abort(&rw);
        goto done;
    }
    if ((st = hp__rewrite_finish(&rw, &mid, &e)) != HP_OK) goto done;
    st = hp__dce_take(mid, out, &e);
done:
    hp_free(t.slot);
    hp_free(ins);
    hp_free(uses);
    if (st != HP_OK && err) *err = e;
    return st;
}
