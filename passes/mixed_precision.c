/* passes/mixed_precision.c — the mixed-precision pass: FSDP2's MixedPrecisionPolicy on the
 * per-rank graph (plan.param_dtype, plan.reduce_dtype; docs/fsdp.md "Mixed precision").
 *
 * It runs after fsdp or spmd (or on the joint graph at world 1) and before overlap and
 * bucketing, so the collectives it retypes are the ones those passes schedule and merge:
 *
 * * Each floating parameter placeholder (the f32 master, or its FSDP shard) is cast to
 *   param_dtype right after the placeholders: an FSDP all-gather then reads the cast shard and
 *   moves param_dtype bytes (half of f32 for bf16), and everything computed from parameters is
 *   re-inferred in param_dtype (the op table's shape rules give each node's dtype).
 * * Where a node's floating inputs then disagree (an f32 constant or buffer meeting a bf16
 *   activation, an f32 gradient meeting a bf16 weight), the f32 ones are cast to the narrower
 *   dtype, as PyTorch autocasts a bf16 module's inputs. Values an op makes wider on purpose
 *   (RMSNorm's saved rstd, attention's f32 logsumexp) are never narrowed.
 * * The cross entropy runs in f32: _log_softmax's input is cast to f32 (torchtitan's
 *   `pred.float()`), so the loss and its first gradients are f32.
 * * Every reduction collective (reduce_scatter_tensor, all_reduce: the gradients and the loss)
 *   reads its input cast to reduce_dtype; each graph output is cast back to the dtype the
 *   optimizer expects (the parameter's, f32), so master weights and AdamW state stay f32.
 *   Each such cast is placed right after the node that makes the output, so a weight gradient
 *   is finished (and its inputs freed) where the backward reaches its layer.
 * * A matrix product (or an embedding's weight gradient) read by nothing but its f32 cast,
 *   which only graph outputs and gradient reductions read (each weight gradient, on its way to
 *   the optimizer or a reduce-scatter), becomes mm{dtype=f32} (embedding_dense_backward
 *   {dtype=f32}): its f32 sums are stored as they are (cuBLASLt's f32 D), which skips a bf16
 *   rounding, the cast kernel and the bf16 buffer. Graphs with placements keep op and cast.
 *
 * On a placed graph (tensor parallelism, N-D meshes: the spmd pass's output) every node keeps
 * its placements and a cast takes its input's (elementwise, so Partial stays Partial); the
 * all-reduces of Partial activations then run in reduce_dtype too (the shm communicator
 * reduces f32 only). Loss parallel's cross entropy, decomposed before spmd, starts from the
 * logits cast to f32 (passes/loss_parallel.c, f32_logits): that cast is kept like any other, so
 * the vocab-sharded loss runs in f32 as the fused one does.
 *
 * (f32, f32) returns a clone: the pass is the identity.
 */
#include "passes/passes_internal.h"

#include <string.h>

typedef struct mp {
    hp__rewrite rw;
    hp_dtype param, reduce;
    int n_params;
    hp_value *cast; /* [n_params]: the placeholder cast to param_dtype, once made */
    /* memo[w][node * HP_MAX_OUTS + out] of the output graph: that value cast to f32 (w 0) or
     * to param_dtype (w 1), so that a value read by several nodes is cast once */
    hp_value *memo[2];
    size_t memo_cap;
} mp;

/* The memo slot of new value x for dtype dt, grown to cover x; NULL when out of memory. */
static hp_value *memo_slot(mp *m, hp_value x, hp_dtype dt) {
    size_t k = (size_t)x.node * HP_MAX_OUTS + (size_t)x.out;
    if (k >= m->memo_cap) {
        size_t cap = m->memo_cap ? m->memo_cap : 1024;
        while (cap <= k) cap *= 2;
        for (int w = 0; w < 2; w++) {
            hp_value *p = hp_realloc(m->memo[w], cap * sizeof *p);
            if (!p) return NULL;
            for (size_t i = m->memo_cap; i < cap; i++) p[i] = HP_NO_VALUE;
            m->memo[w] = p;
        }
        m->memo_cap = cap;
    }
    return &m->memo[dt == HP_F32 ? 0 : 1][k];
}

/* x cast to dt (x itself when it has that dtype already; the same cast when made before). */
static hp_value cast_to(mp *m, hp_value x, hp_dtype dt, hp_err *err) {
    const hp_type *t = hp_graph_type(m->rw.out, x);
    if (!t || t->dtype == dt) return x;
    hp_value *slot = memo_slot(m, x, dt);
    if (!slot) {
        hp_errf(err, HP_NOMEM, "out of memory casting to %s", hp_dtype_name(dt));
        return HP_NO_VALUE;
    }
    if (hp_value_ok(*slot)) return *slot;
    const hp_node *xn = &m->rw.out->nodes[x.node];
    hp_value c;
    if (xn->op == HP_OP_T && xn->n_in == 1) {
        /* the cast of a matrix transpose is the transpose of its input's cast: one cast shared
         * with the input's other readers, and lowering folds the transpose into a product */
        hp_value src = xn->in[0], inner = cast_to(m, src, dt, err);
        if (!hp_value_ok(inner)) return HP_NO_VALUE;
        c = hp__rewrite_build(&m->rw, HP_OP_T, &inner, 1, NULL, 0, err);
    } else {
        hp_attr a = hp_attr_dtype(HP_ATTR_DTYPE, dt);
        c = hp__rewrite_build(&m->rw, HP_OP_TO_COPY, &x, 1, &a, 1, err);
    }
    /* on a placed graph the cast is placed as its input (elementwise: Partial stays Partial) */
    const hp_placement *pl = hp_value_ok(c) ? hp_value_placements(m->rw.out, x) : NULL;
    if (pl && hp_node_set_placements(m->rw.out, c.node, pl, err) != HP_OK) return HP_NO_VALUE;
    *memo_slot(m, x, dt) = c; /* the slot is covered: x precedes c */
    return c;
}

/* The narrowest floating dtype among the node's inputs (bf16 / f16 over f32); -1 when fewer
 * than two floating dtypes meet. */
static int narrowest(const hp_type *t, int n) {
    int lo = -1;
    bool mixed = false;
    for (int k = 0; k < n; k++) {
        if (!hp_dtype_is_float(t[k].dtype)) continue;
        if (lo >= 0 && (hp_dtype)lo != t[k].dtype) mixed = true;
        if (lo < 0 || hp_dtype_size(t[k].dtype) < hp_dtype_size((hp_dtype)lo)) lo = t[k].dtype;
    }
    return mixed ? lo : -1;
}

/* A value an op makes wider than its floating inputs on purpose (RMSNorm's saved rstd,
 * attention's logsumexp: f32 from bf16 inputs): harmonizing never narrows it. */
static bool wide_by_design(const mp *m, hp_value v) {
    const hp_graph *g = m->rw.out;
    const hp_node *n = &g->nodes[v.node];
    if (n->op == HP_OP_TO_COPY || !n->n_in) return false;
    size_t have = hp_dtype_size(n->out[v.out].dtype);
    for (int k = 0; k < n->n_in; k++) {
        hp_dtype d = hp_graph_type(g, n->in[k])->dtype;
        if (hp_dtype_is_float(d) && hp_dtype_size(d) < have) return true;
    }
    return false;
}

/* Whether operand k of op is f32 by the op's contract whatever its other operands are (the
 * statistics a forward saved for its backward): harmonizing never narrows it. In an N-D plan
 * such a statistic may reach its backward through a redistribution (the rstd chunked over 'tp'
 * for a sequence-parallel backward), or its forward may run in f32 (its inputs out of an f32
 * reduction) and its backward in bf16. */
static bool f32_operand(hp_op op, int k) {
    switch (op) {
    case HP_OP_RMS_NORM_BACKWARD:
        return k == 3; /* rstd */
    case HP_OP_LAYER_NORM_BACKWARD:
        return k == 2 || k == 3; /* mean, rstd */
    case HP_OP_SDPA_BACKWARD:
        return k == 5; /* logsumexp */
    case HP_OP_FUSED_CROSS_ENTROPY_BACKWARD:
        return k == 0 || k == 3 || k == 4;
    default:
        return false;
    }
}

static hp_status infer(const hp_node *nd, const hp_type *in, hp_type *out, hp_err *err) {
    hp_node tmp = *nd;
    tmp.out = out;
    memcpy(out, nd->out, (size_t)nd->n_out * sizeof *out);
    return hp_op_get(nd->op)->shape(&tmp, in, out, err);
}

static hp_status rewrite_node(mp *m, int i, hp_value *ins, hp_type *types, hp_err *err) {
    const hp_node *nd = &m->rw.in->nodes[i];
    for (int k = 0; k < nd->n_in; k++) {
        hp_value v = nd->in[k];
        ins[k] = v.node < m->n_params && hp_value_ok(m->cast[v.node]) ? m->cast[v.node]
                                                                      : hp__rewrite_get(&m->rw, v);
    }
    hp_dtype want = (hp_dtype)-1; /* a dtype input 0 must have, by the policy */
    if (nd->op == HP_OP_LOG_SOFTMAX) want = HP_F32;
    if (nd->op == HP_OP_REDUCE_SCATTER || nd->op == HP_OP_ALL_REDUCE) want = m->reduce;
    if ((int)want >= 0 && hp_dtype_is_float(hp_graph_type(m->rw.out, ins[0])->dtype)) {
        ins[0] = cast_to(m, ins[0], want, err);
        if (!hp_value_ok(ins[0])) return err->status;
    }
    for (int k = 0; k < nd->n_in; k++) types[k] = *hp_graph_type(m->rw.out, ins[k]);
    hp_type out[HP_MAX_OUTS];
    hp_err first = {0};
    if (infer(nd, types, out, &first) != HP_OK) {
        int lo = narrowest(types, nd->n_in);
        if (lo < 0) {
            *err = first;
            hp_err_prefix(err, "node %d (%s) in %s", i, hp_op_get(nd->op)->name,
                          hp_dtype_name(m->param));
            return first.status;
        }
        for (int k = 0; k < nd->n_in; k++) {
            if (!hp_dtype_is_float(types[k].dtype) || types[k].dtype == (hp_dtype)lo) continue;
            if (f32_operand(nd->op, k) || wide_by_design(m, ins[k])) continue;
            ins[k] = cast_to(m, ins[k], (hp_dtype)lo, err);
            if (!hp_value_ok(ins[k])) return err->status;
            types[k].dtype = (hp_dtype)lo;
        }
        hp_status st = infer(nd, types, out, err);
        if (st != HP_OK) {
            hp_err_prefix(err, "node %d (%s) in %s", i, hp_op_get(nd->op)->name,
                          hp_dtype_name(m->param));
            return st;
        }
    }
    int id = hp__rewrite_append(&m->rw, nd->op, ins, nd->n_in, out, nd->n_out, nd->attrs,
                                nd->n_attrs, err);
    if (id < 0) return err->status;
    if (nd->pl) HP_TRY(hp_node_set_placements(m->rw.out, id, nd->pl, err));
    for (int k = 0; k < nd->n_out; k++)
        hp__rewrite_set(&m->rw, (hp_value){i, k}, (hp_value){id, k});
    return HP_OK;
}

/* Graph output k in the dtype the optimizer and the loss report expect: the loss in f32,
 * gradient k - 1 in its parameter's dtype (memoized: the same cast each call). */
static hp_value output_cast(mp *m, const hp_graph *in, int k, hp_err *err) {
    hp_value o = in->outputs[k];
    hp_dtype want = in->nodes[o.node].out[o.out].dtype;
    if (k == 0 && hp_dtype_is_float(want)) want = HP_F32;
    if (k >= 1 && k - 1 < m->n_params) want = in->nodes[k - 1].out[0].dtype;
    return cast_to(m, hp__rewrite_get(&m->rw, o), want, err);
}

/* An op that takes {dtype=f32} and has not got it. */
static bool widens(const hp_node *p) {
    if (p->out[0].dtype == HP_F32 || hp_node_attr(p, HP_ATTR_DTYPE)) return false;
    return p->op == HP_OP_MM || p->op == HP_OP_EMBEDDING_DENSE_BACKWARD;
}

/* {dtype=f32} for each such op whose one reader is its cast to f32 (the header); takes g. */
static hp_status widen_products(hp_graph *g, hp_graph **out, hp_err *err) {
    *out = g;
    int n = g->n_nodes;
    if (g->mesh.ndim > 0 || n == 0) return HP_OK;
    int32_t *readers = hp_calloc((size_t)n, sizeof *readers);
    /* fuse[i]: 1 for a cast to fold into its product, 2 for that product (left out) */
    uint8_t *fuse = hp_calloc((size_t)n, sizeof *fuse);
    if (!readers || !fuse) {
        hp_free(readers);
        hp_free(fuse);
        *out = NULL;
        hp_graph_free(g);
        return hp_errf(err, HP_NOMEM, "out of memory widening products");
    }
    /* readers[i]: nodes and graph outputs reading node i; bit 30 set when one of them is
     * neither a graph output nor a gradient reduction */
    enum { OTHER = 1 << 30 };
    for (int i = 0; i < n; i++) {
        const hp_node *r = &g->nodes[i];
        bool reduction = r->op == HP_OP_REDUCE_SCATTER || r->op == HP_OP_ALL_REDUCE;
        for (int k = 0; k < r->n_in; k++) {
            readers[r->in[k].node]++;
            if (!reduction) readers[r->in[k].node] |= OTHER;
        }
    }
    for (int k = 0; k < g->n_outputs; k++) readers[g->outputs[k].node]++;
    int found = 0;
    for (int i = 0; i < n; i++) {
        const hp_node *c = &g->nodes[i];
        /* a gradient's cast: read only by graph outputs and reductions (the logits' cast
         * for the loss, say, stays: the loss reads bf16 logits as they are) */
        if (c->op != HP_OP_TO_COPY || c->out[0].dtype != HP_F32 || (readers[i] & OTHER)) continue;
        const hp_node *p = &g->nodes[c->in[0].node];
        if (!widens(p) || (readers[c->in[0].node] & ~OTHER) != 1) continue;
        fuse[i] = 1;
        fuse[c->in[0].node] = 2;
        found++;
    }
    hp_free(readers);
    hp_status st = HP_OK;
    if (found) {
        hp__rewrite rw;
        if ((st = hp__rewrite_start(&rw, g, err)) != HP_OK) goto done;
        for (int i = 0; i < n && st == HP_OK; i++) {
            const hp_node *c = &g->nodes[i];
            if (fuse[i] == 2) continue; /* the op its cast alone reads: remade there */
            if (fuse[i] == 0) {
                if (hp__rewrite_copy(&rw, i, err) < 0) st = err->status ? err->status : HP_INTERNAL;
                continue;
            }
            const hp_node *p = &g->nodes[c->in[0].node];
            hp_value ab[2] = {hp__rewrite_get(&rw, p->in[0]), hp__rewrite_get(&rw, p->in[1])};
            hp_attr at[HP_ATTR_COUNT];
            int na = 0;
            for (int k = 0; k < p->n_attrs && na < HP_ATTR_COUNT - 1; k++) at[na++] = p->attrs[k];
            at[na++] = hp_attr_dtype(HP_ATTR_DTYPE, HP_F32);
            hp_value w = hp__rewrite_build(&rw, p->op, ab, 2, at, na, err);
            if (!hp_value_ok(w))
                st = err->status ? err->status : HP_INTERNAL;
            else
                hp__rewrite_set(&rw, (hp_value){i, 0}, w);
        }
        if (st != HP_OK) {
            hp__rewrite_abort(&rw);
            goto done;
        }
        hp_graph *wide = NULL;
        if ((st = hp__rewrite_finish(&rw, &wide, err)) == HP_OK) {
            hp_graph_free(g);
            *out = wide;
        }
    }
done:
    hp_free(fuse);
    if (st != HP_OK) {
        hp_graph_free(g);
        *out = NULL;
    }
    return st;
}

hp_status hp_pass_mixed_precision(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                  hp_err *err) {
    *out = NULL;
    hp_err local;
    if (!err) err = &local; /* the helpers below read err->status */
    const hp_plan *p = &ctx->job->plan;
    HP_TRY(hp_plan_check_precision(p->param_dtype, p->reduce_dtype, err));
    if (p->param_dtype == HP_F32 && p->reduce_dtype == HP_F32) {
        if (!(*out = hp_graph_clone(in))) return hp_errf(err, HP_NOMEM, "out of memory");
        return HP_OK;
    }
    mp m = {.param = p->param_dtype, .reduce = p->reduce_dtype};
    m.n_params = hp_graph_count_inputs(in).n_params;
    int max_in = 1;
    for (int i = 0; i < in->n_nodes; i++)
        if (in->nodes[i].n_in > max_in) max_in = in->nodes[i].n_in;
    m.cast = hp_malloc((size_t)(m.n_params ? m.n_params : 1) * sizeof *m.cast);
    int *first_out = NULL, *next_out = NULL;
    hp_value *ins = hp_malloc((size_t)max_in * sizeof *ins);
    hp_type *types = hp_malloc((size_t)max_in * sizeof *types);
    hp_status st = HP_OK;
    if (!m.cast || !ins || !types) {
        st = hp_errf(err, HP_NOMEM, "out of memory");
        goto done;
    }
    for (int k = 0; k < m.n_params; k++) m.cast[k] = HP_NO_VALUE;
    if ((st = hp__rewrite_start(&m.rw, in, err)) != HP_OK) goto done;
    int n_ph = 0;
    while (n_ph < in->n_nodes && in->nodes[n_ph].op == HP_OP_PLACEHOLDER) n_ph++;
    if (in->mesh.ndim > 0) st = hp_graph_set_mesh(m.rw.out, &in->mesh, err);
    for (int i = 0; i < n_ph && st == HP_OK; i++) {
        int id = hp__rewrite_copy(&m.rw, i, err);
        if (id < 0)
            st = err->status;
        else if (in->nodes[i].pl)
            st = hp_node_set_placements(m.rw.out, id, in->nodes[i].pl, err);
    }
    /* every cast right after the placeholders, so that overlap may hoist a gather anywhere */
    for (int k = 0; k < m.n_params && st == HP_OK; k++) {
        if (!hp_dtype_is_float(in->nodes[k].out[0].dtype)) continue;
        m.cast[k] = cast_to(&m, hp__rewrite_get(&m.rw, (hp_value){k, 0}), m.param, err);
        if (!hp_value_ok(m.cast[k])) st = err->status;
    }
    /* next_out[k]: the next graph output made by the same node as output k; first_out[i] the
     * first made by node i (-1: none) */
    first_out = hp_malloc((size_t)in->n_nodes * sizeof *first_out);
    next_out = hp_malloc((size_t)(in->n_outputs ? in->n_outputs : 1) * sizeof *next_out);
    if (st == HP_OK && (!first_out || !next_out)) st = hp_errf(err, HP_NOMEM, "out of memory");
    if (st == HP_OK) {
        for (int i = 0; i < in->n_nodes; i++) first_out[i] = -1;
        for (int k = in->n_outputs - 1; k >= 0; k--) {
            next_out[k] = first_out[in->outputs[k].node];
            first_out[in->outputs[k].node] = k;
        }
    }
    /* each output's cast right after its producer: a weight gradient's cast (and the f32 mm
     * widen_products makes of it) then runs where the gradient is made, so its bf16 buffer and
     * the activations it reads are freed there, not held to the end of the step */
    for (int i = n_ph; i < in->n_nodes && st == HP_OK; i++) {
        st = rewrite_node(&m, i, ins, types, err);
        for (int k = first_out[i]; k >= 0 && st == HP_OK; k = next_out[k])
            if (!hp_value_ok(output_cast(&m, in, k, err))) st = err->status;
    }
    /* outputs back in the dtype the optimizer and the loss report expect (the casts made
     * above are found in the memo) */
    for (int k = 0; k < in->n_outputs && st == HP_OK; k++) {
        hp_value v = output_cast(&m, in, k, err);
        if (!hp_value_ok(v))
            st = err->status;
        else
            hp__rewrite_set(&m.rw, in->outputs[k], v);
    }
    hp_graph *mid = NULL;
    if (st == HP_OK) {
        st = hp__rewrite_finish(&m.rw, &mid, err);
        /* a transpose whose every reader took its cast (cast_to) is left unread */
        hp_graph *live = NULL;
        if (st == HP_OK) st = hp__dce_take(mid, &live, err);
        if (st == HP_OK) st = widen_products(live, out, err);
    } else {
        hp__rewrite_abort(&m.rw);
    }
done:
    hp_free(first_out);
    hp_free(next_out);
    hp_free(m.cast);
    hp_free(m.memo[0]);
    hp_free(m.memo[1]);
    hp_free(ins);
    hp_free(types);
    return st;
}
