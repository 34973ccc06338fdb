/* passes/canonicalize_attention.c — the fuse_attention pass, canonicalize's second half: the
 * unfused causal attention an exported PyTorch model carries (make_fx records
 * `q @ k.transpose(-2, -1) * scale`, a causal masked_fill, softmax and `@ v` as separate ATen
 * ops, and their backward the same way) becomes hp's fused attention and its backward
 * (_scaled_dot_product_flash_attention[_backward]), so the model gets the flash kernel.
 *
 * It runs after canonicalize (views collapsed, clones and same-type expands folded) and matches,
 * with q4 [B,H,T,D], kt4 [B,H,D,S] (k transposed), v4 [B,H,S,Dv], T == S:
 *
 *   forward   O3 = bmm(view(P), view(v4))            P = _softmax(M, dim=3)
 *             M  = where(~tril(ones[T,S]), fill, X)   or where(tril(ones), X, fill)
 *                  fill a scalar full() <= -1e30 (-inf as masked_fill writes it); the mask
 *                  [T, S], possibly viewed/expanded to leading 1s and broadcast, or
 *                  tril(ones) == 0 (any dtype), or the top-left [T, T] corner of a larger
 *                  tril(ones) (nanoGPT's bias[:, :, :T, :T] == 0)
 *             X  = mul_scalar(S4, scale) | div(S4, full(c)) (scale 1/c) | S4 (scale 1)
 *             S4 = view(bmm(view(q4), view(kt4)))     [B,H,T,S]
 *   backward  dP = view(bmm(dO3, transpose(view(v4))))
 *             dS = scale · where(mask, 0, _softmax_backward_data(dP, P))   (the same mask,
 *                  orientation, scale; the where optional)
 *             dQ3 = bmm(view(dS), transpose(view(kt4))), dKT3 = bmm(transpose(view(q4)),
 *             view(dS)), dV3 = bmm(transpose(view(P)), dO3)
 *
 * and replaces O3 by view(out), dQ3/dKT3/dV3 by views of grad_q, transpose(grad_k) and grad_v
 * of the fused ops (the scale as the op's attribute, causal = 1). It never changes what a graph
 * computes: a pattern fuses only when every node of it (scores, scaled scores, masked scores,
 * probabilities, their views, the softmax gradient chain) is used by nothing outside it and is
 * no graph output, so the unfused nodes all die; anything else (a non-causal or offset mask,
 * a mask from a buffer, a scale by a tensor, a backward that reads P elsewhere) is left as it is.
 * The rewritten graph is canonicalized again (views of views, transposes that cancel, DCE).
 * The report counts the forwards and backwards fused (hpctl plan shows them).
 */
#include "passes/passes_internal.h"
#include "passes/sched_util.h"

#include <math.h>
#include <string.h>

/* ---- matching helpers ----------------------------------------------------------------------- */

static const hp_node *nd(const hp_graph *g, hp_value v) {
    return &g->nodes[v.node];
}

static bool is(const hp_graph *g, hp_value v, hp_op op) {
    return hp_value_ok(v) && g->nodes[v.node].op == op;
}

static bool same(hp_value a, hp_value b) {
    return a.node == b.node && a.out == b.out;
}

static bool shape_is(const hp_type *t, int rank, const int64_t *s) {
    if (t->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (t->shape[i] != s[i]) return false;
    return true;
}

/* A scalar constant of full() (any shape of one element): its value. */
static bool scalar_full(const hp_graph *g, hp_value v, double *value) {
    if (!hp_value_ok(v)) return false;
    const hp_node *n = nd(g, v);
    if (hp_type_numel(&n->out[0]) != 1) return false;
    if (n->op == HP_OP_ZEROS) return *value = 0, true;
    if (n->op == HP_OP_ONES) return *value = 1, true;
    if (n->op != HP_OP_FULL) return false;
    *value = hp_node_float(n, HP_ATTR_VALUE, NAN);
    return true;
}

/* Strips views and expands that only add or broadcast leading dims of size 1 over the last two
 * dims [T, S] (mask[None, None], expand to [B, H, T, S]). */
static hp_value strip_leading(const hp_graph *g, hp_value v) {
    while (is(g, v, HP_OP_VIEW) || is(g, v, HP_OP_EXPAND)) {
        const hp_type *o = &nd(g, v)->out[0], *x = hp_graph_type(g, nd(g, v)->in[0]);
        if (o->rank < 2 || x->rank < 2 || o->shape[o->rank - 1] != x->shape[x->rank - 1] ||
            o->shape[o->rank - 2] != x->shape[x->rank - 2])
            break;
        bool ones = true;
        for (int i = 0; i < x->rank - 2; i++) ones &= x->shape[i] == 1;
        if (nd(g, v)->op == HP_OP_VIEW)
            for (int i = 0; i < o->rank - 2; i++) ones &= o->shape[i] == 1;
        if (!ones) break;
        v = nd(g, v)->in[0];
    }
    return v;
}

/* Is v tril(ones [N, N]) with diagonal 0 (nonzero on and below the diagonal), or its top-left
 * [T, T] corner (slices from 0 of the last two dims: nanoGPT's bias[:, :, :T, :T]), with its
 * last two dims [T, T]? Any dtype. */
static bool causal_keep(const hp_graph *g, hp_value v, int64_t T) {
    v = strip_leading(g, v);
    const hp_type *t = hp_graph_type(g, v);
    if (t->rank < 2 || t->shape[t->rank - 1] != T || t->shape[t->rank - 2] != T) return false;
    while (is(g, v, HP_OP_SLICE)) {
        const hp_node *s = nd(g, v);
        int rank = s->out[0].rank;
        int64_t dim = hp_node_int(s, HP_ATTR_DIM, -1);
        if ((dim != rank - 1 && dim != rank - 2) || hp_node_int(s, HP_ATTR_START, -1) != 0 ||
            hp_node_int(s, HP_ATTR_STEP, 1) != 1)
            return false;
        v = strip_leading(g, s->in[0]);
    }
    if (!is(g, v, HP_OP_TRIL) || hp_node_int(nd(g, v), HP_ATTR_DIAGONAL, 0) != 0) return false;
    t = &nd(g, v)->out[0];
    if (t->rank != 2 || t->shape[0] != t->shape[1] || t->shape[0] < T) return false;
    return is(g, nd(g, v)->in[0], HP_OP_ONES);
}

/* Is v the drop mask of a causal keep mask: ~keep (bool), or keep == 0? */
static bool causal_drop(const hp_graph *g, hp_value v, int64_t T) {
    v = strip_leading(g, v);
    if (is(g, v, HP_OP_BITWISE_NOT))
        return hp_graph_type(g, v)->dtype == HP_BOOL && causal_keep(g, nd(g, v)->in[0], T);
    if (!is(g, v, HP_OP_EQ)) return false;
    double z;
    for (int k = 0; k < 2; k++)
        if (scalar_full(g, nd(g, v)->in[1 - k], &z) && z == 0 && causal_keep(g, nd(g, v)->in[k], T))
            return true;
    return false;
}

/* where(cond, a, b) masking x causally with fill: *mask gets cond, *keep_first whether cond is
 * the keep mask (where(keep, x, fill)) rather than the drop mask (where(~keep, fill, x)). */
static bool causal_where(const hp_graph *g, const hp_node *w, int64_t T, hp_value *x,
                         hp_value *fill, hp_value *mask, bool *keep_first) {
    if (w->op != HP_OP_WHERE) return false;
    hp_value c = w->in[0];
    if (hp_graph_type(g, c)->dtype == HP_BOOL && causal_keep(g, c, T)) {
        *keep_first = true, *x = w->in[1], *fill = w->in[2];
    } else if (causal_drop(g, c, T)) {
        *keep_first = false, *x = w->in[2], *fill = w->in[1];
    } else {
        return false;
    }
    *mask = c;
    return true;
}

/* X = scale · S: mul_scalar, div by a scalar full(), or S itself (scale 1). */
static hp_value unscale(const hp_graph *g, hp_value x, double *scale, int *scale_node) {
    *scale_node = -1;
    double c;
    if (is(g, x, HP_OP_MUL_SCALAR)) {
        *scale = hp_node_float(nd(g, x), HP_ATTR_VALUE, NAN);
        *scale_node = x.node;
        return nd(g, x)->in[0];
    }
    if (is(g, x, HP_OP_DIV) && scalar_full(g, nd(g, x)->in[1], &c) && c != 0) {
        *scale = 1.0 / c;
        *scale_node = x.node;
        return nd(g, x)->in[0];
    }
    *scale = 1.0;
    return x;
}

/* v = view(x) with x [A, B, m, n] and v [A*B, m, n]: x, else no value. */
static hp_value unmerge(const hp_graph *g, hp_value v) {
    if (!is(g, v, HP_OP_VIEW)) return HP_NO_VALUE;
    const hp_type *o = &nd(g, v)->out[0];
    hp_value x = nd(g, v)->in[0];
    const hp_type *t = hp_graph_type(g, x);
    if (o->rank != 3 || t->rank != 4 || t->shape[0] * t->shape[1] != o->shape[0] ||
        t->shape[2] != o->shape[1] || t->shape[3] != o->shape[2])
        return HP_NO_VALUE;
    return x;
}

/* transpose(x) {1, 2} of a rank-3 value: x. */
static hp_value untranspose(const hp_graph *g, hp_value v) {
    if (!is(g, v, HP_OP_TRANSPOSE) || nd(g, v)->out[0].rank != 3 ||
        hp_node_int(nd(g, v), HP_ATTR_DIM0, -1) != 1 ||
        hp_node_int(nd(g, v), HP_ATTR_DIM1, -1) != 2)
        return HP_NO_VALUE;
    return nd(g, v)->in[0];
}

/* A user of node `of` with op `op` reading `in0`/`in1` (HP_NO_VALUE: any) as inputs 0/1. */
static int find_user(const hp_graph *g, const hp__users *u, int of, hp_op op, hp_value in0,
                     hp_value in1) {
    for (int k = u->off[of]; k < u->off[of + 1]; k++) {
        const hp_node *n = &g->nodes[u->user[k]];
        if (n->op != op) continue;
        if (hp_value_ok(in0) && !same(n->in[0], in0)) continue;
        if (hp_value_ok(in1) && (n->n_in < 2 || !same(n->in[1], in1))) continue;
        return u->user[k];
    }
    return -1;
}

/* ---- one attention -------------------------------------------------------------------------- */

#define MAX_INTERIOR 24

typedef struct attn {
    hp_value q4, kt4, v4; /* old values */
    double scale;
    int bmm2;           /* forward output O3 */
    bool bwd;           /* the backward matched */
    hp_value dO3;       /* [B*H, T, Dv] */
    int dq3, dkt3, dv3; /* backward outputs */
    int interior[MAX_INTERIOR], n_interior;
    /* new-graph values once emitted */
    hp_value out, lse, k4;
    bool fwd_done, bwd_done;
} attn;

static void add_interior(attn *a, int id) {
    for (int i = 0; i < a->n_interior; i++)
        if (a->interior[i] == id) return;
    if (a->n_interior < MAX_INTERIOR) a->interior[a->n_interior++] = id;
}

static bool in_pattern(const attn *a, int id) {
    if (id == a->bmm2 || (a->bwd && (id == a->dq3 || id == a->dkt3 || id == a->dv3))) return true;
    for (int i = 0; i < a->n_interior; i++)
        if (a->interior[i] == id) return true;
    return false;
}

/* Every interior node is used only inside the pattern and is no graph output. */
static bool closed(const attn *a, const hp__users *u) {
    for (int i = 0; i < a->n_interior; i++) {
        int id = a->interior[i];
        if (u->is_output[id]) return false;
        for (int k = u->off[id]; k < u->off[id + 1]; k++)
            if (!in_pattern(a, u->user[k])) return false;
    }
    return a->n_interior < MAX_INTERIOR;
}

/* The backward of a matched forward (P the probabilities, pv = view(P), vv = view(v4), qv,
 * kv the views bmm1 reads, mask/keep_first/scale as the forward's). */
static bool match_backward(const hp_graph *g, const hp__users *u, attn *a, hp_value P, hp_value pv,
                           hp_value vv, hp_value qv, hp_value kv, hp_value mask, bool keep_first,
                           int scale_node) {
    int sb = find_user(g, u, P.node, HP_OP_SOFTMAX_BACKWARD, HP_NO_VALUE, P);
    if (sb < 0 || hp_node_int(&g->nodes[sb], HP_ATTR_DIM, -1) != 3) return false;
    hp_value dP4 = g->nodes[sb].in[0];
    if (!is(g, dP4, HP_OP_VIEW)) return false;
    hp_value dP3 = nd(g, dP4)->in[0];
    if (!is(g, dP3, HP_OP_BMM) || !same(untranspose(g, nd(g, dP3)->in[1]), vv)) return false;
    a->dO3 = nd(g, dP3)->in[0];
    /* dV3 = bmm(transpose(view(P)), dO3) */
    int pt = find_user(g, u, pv.node, HP_OP_TRANSPOSE, pv, HP_NO_VALUE);
    if (pt < 0 || !hp_value_ok(untranspose(g, (hp_value){pt, 0}))) return false;
    a->dv3 = find_user(g, u, pt, HP_OP_BMM, (hp_value){pt, 0}, a->dO3);
    if (a->dv3 < 0) return false;
    /* dS = scale · where(mask, 0, sb) */
    hp_value d = {sb, 0};
    add_interior(a, dP4.node), add_interior(a, dP3.node), add_interior(a, pt), add_interior(a, sb);
    int w = find_user(g, u, sb, HP_OP_WHERE, HP_NO_VALUE, HP_NO_VALUE);
    if (w >= 0) {
        const hp_node *wn = &g->nodes[w];
        double zero = 1;
        hp_value fill = keep_first ? wn->in[2] : wn->in[1], x = keep_first ? wn->in[1] : wn->in[2];
        if (!same(wn->in[0], mask) || !same(x, d) || !scalar_full(g, fill, &zero) || zero != 0)
            return false;
        d = (hp_value){w, 0};
        add_interior(a, w);
    }
    if (scale_node >= 0) {
        const hp_node *f = &g->nodes[scale_node];
        int s = f->op == HP_OP_MUL_SCALAR
                    ? find_user(g, u, d.node, HP_OP_MUL_SCALAR, d, HP_NO_VALUE)
                    : find_user(g, u, d.node, HP_OP_DIV, d, HP_NO_VALUE);
        if (s < 0) return false;
        const hp_node *sn = &g->nodes[s];
        if (f->op == HP_OP_MUL_SCALAR && hp_node_float(sn, HP_ATTR_VALUE, NAN) != a->scale)
            return false;
        double c;
        if (f->op == HP_OP_DIV && (!scalar_full(g, sn->in[1], &c) || 1.0 / c != a->scale))
            return false;
        d = (hp_value){s, 0};
        add_interior(a, s);
    }
    int dsv = find_user(g, u, d.node, HP_OP_VIEW, d, HP_NO_VALUE);
    if (dsv < 0 || !same(unmerge(g, (hp_value){dsv, 0}), d)) return false;
    add_interior(a, dsv);
    hp_value ds3 = {dsv, 0};
    /* dQ3 = bmm(dS3, transpose(view(kt4))), dKT3 = bmm(transpose(view(q4)), dS3) */
    a->dq3 = a->dkt3 = -1;
    for (int k = u->off[dsv]; k < u->off[dsv + 1]; k++) {
        const hp_node *b = &g->nodes[u->user[k]];
        if (b->op != HP_OP_BMM) continue;
        if (same(b->in[0], ds3) && same(untranspose(g, b->in[1]), kv)) a->dq3 = u->user[k];
        if (same(b->in[1], ds3) && same(untranspose(g, b->in[0]), qv)) a->dkt3 = u->user[k];
    }
    return a->dq3 >= 0 && a->dkt3 >= 0;
}

/* Matches the attention whose output is bmm node `id`; true with *a filled. */
static bool match(const hp_graph *g, const hp__users *u, int id, attn *a) {
    memset(a, 0, sizeof *a);
    a->bmm2 = id;
    const hp_node *o = &g->nodes[id];
    if (o->op != HP_OP_BMM) return false;
    hp_value pv = o->in[0], vv = o->in[1];
    hp_value P = unmerge(g, pv), v4 = unmerge(g, vv);
    if (!is(g, P, HP_OP_SOFTMAX) || !hp_value_ok(v4) || nd(g, P)->n_out != 1 ||
        hp_node_int(nd(g, P), HP_ATTR_DIM, -1) != 3)
        return false;
    const hp_type *pt = hp_graph_type(g, P), *vt = hp_graph_type(g, v4);
    int64_t B = pt->shape[0], H = pt->shape[1], T = pt->shape[2], S = pt->shape[3];
    if (T != S || vt->shape[0] != B || vt->shape[1] != H || vt->shape[2] != S) return false;
    hp_value x, fill, mask;
    bool keep_first;
    double f;
    if (!causal_where(g, nd(g, nd(g, P)->in[0]), T, &x, &fill, &mask, &keep_first) ||
        !scalar_full(g, fill, &f) || !(f <= -1e30) ||
        !shape_is(hp_graph_type(g, nd(g, P)->in[0]), 4, pt->shape))
        return false;
    int scale_node;
    hp_value s4 = unscale(g, x, &a->scale, &scale_node);
    if (!(isfinite(a->scale) && a->scale > 0) || !is(g, s4, HP_OP_VIEW)) return false;
    if (!shape_is(hp_graph_type(g, s4), 4, pt->shape)) return false;
    hp_value s3 = nd(g, s4)->in[0]; /* s4 = view(s3), s3 [B*H, T, S] */
    int64_t s3s[3] = {B * H, T, S};
    if (!is(g, s3, HP_OP_BMM) || !shape_is(hp_graph_type(g, s3), 3, s3s)) return false;
    hp_value qv = nd(g, s3)->in[0], kv = nd(g, s3)->in[1];
    a->q4 = unmerge(g, qv), a->kt4 = unmerge(g, kv), a->v4 = v4;
    if (!hp_value_ok(a->q4) || !hp_value_ok(a->kt4)) return false;
    const hp_type *qt = hp_graph_type(g, a->q4), *kt = hp_graph_type(g, a->kt4);
    int64_t D = qt->shape[3];
    int64_t qs[4] = {B, H, T, D}, ks[4] = {B, H, D, S};
    if (!shape_is(qt, 4, qs) || !shape_is(kt, 4, ks) || qt->dtype != kt->dtype ||
        qt->dtype != vt->dtype || pt->dtype != qt->dtype)
        return false;
    a->n_interior = 0;
    add_interior(a, s3.node), add_interior(a, s4.node), add_interior(a, nd(g, P)->in[0].node);
    if (scale_node >= 0) add_interior(a, scale_node);
    add_interior(a, P.node), add_interior(a, pv.node);
    attn fwd_only = *a;
    a->bwd = match_backward(g, u, a, P, pv, vv, qv, kv, mask, keep_first, scale_node);
    if (a->bwd && closed(a, u)) return true;
    *a = fwd_only; /* a forward whose probabilities nothing else reads */
    a->bwd = false;
    return closed(a, u);
}

/* ---- the rewrite ---------------------------------------------------------------------------- */

static hp_value view_as(hp__rewrite *rw, hp_value x, const hp_type *t, hp_err *err) {
    hp_attr s = hp_attr_ints(HP_ATTR_SHAPE, t->rank, t->shape);
    return hp__rewrite_build(rw, HP_OP_VIEW, &x, 1, &s, 1, err);
}

static hp_value swap23(hp__rewrite *rw, hp_value x, hp_err *err) {
    hp_attr d[2] = {hp_attr_int(HP_ATTR_DIM0, 2), hp_attr_int(HP_ATTR_DIM1, 3)};
    return hp__rewrite_build(rw, HP_OP_TRANSPOSE, &x, 1, d, 2, err);
}

static hp_status emit_forward(hp__rewrite *rw, const hp_graph *g, attn *a, hp_err *err) {
    if (a->fwd_done) return HP_OK;
    hp_value in[3] = {hp__rewrite_get(rw, a->q4), HP_NO_VALUE, hp__rewrite_get(rw, a->v4)};
    a->k4 = in[1] = swap23(rw, hp__rewrite_get(rw, a->kt4), err);
    if (!hp_value_ok(in[1])) return err ? err->status : HP_INTERNAL;
    hp_attr at[2] = {hp_attr_float(HP_ATTR_SCALE, a->scale), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value o = hp__rewrite_build(rw, HP_OP_SDPA, in, 3, at, 2, err);
    if (!hp_value_ok(o)) return err ? err->status : HP_INTERNAL;
    a->out = o, a->lse = hp_out(o, 1);
    hp_value o3 = view_as(rw, o, &g->nodes[a->bmm2].out[0], err);
    if (!hp_value_ok(o3)) return err ? err->status : HP_INTERNAL;
    hp__rewrite_set(rw, (hp_value){a->bmm2, 0}, o3);
    a->fwd_done = true;
    return HP_OK;
}

static hp_status emit_backward(hp__rewrite *rw, const hp_graph *g, attn *a, hp_err *err) {
    if (a->bwd_done) return HP_OK;
    HP_TRY(emit_forward(rw, g, a, err));
    hp_type o4 = *hp_graph_type(rw->out, a->out);
    hp_value in[6] = {view_as(rw, hp__rewrite_get(rw, a->dO3), &o4, err),
                      hp__rewrite_get(rw, a->q4),
                      a->k4,
                      hp__rewrite_get(rw, a->v4),
                      a->out,
                      a->lse};
    if (!hp_value_ok(in[0])) return err ? err->status : HP_INTERNAL;
    hp_attr at[2] = {hp_attr_float(HP_ATTR_SCALE, a->scale), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value d = hp__rewrite_build(rw, HP_OP_SDPA_BACKWARD, in, 6, at, 2, err);
    if (!hp_value_ok(d)) return err ? err->status : HP_INTERNAL;
    hp_value dq = view_as(rw, d, &g->nodes[a->dq3].out[0], err);
    hp_value dkt = swap23(rw, hp_out(d, 1), err);
    if (hp_value_ok(dkt)) dkt = view_as(rw, dkt, &g->nodes[a->dkt3].out[0], err);
    hp_value dv = view_as(rw, hp_out(d, 2), &g->nodes[a->dv3].out[0], err);
    if (!hp_value_ok(dq) || !hp_value_ok(dkt) || !hp_value_ok(dv))
        return err ? err->status : HP_INTERNAL;
    hp__rewrite_set(rw, (hp_value){a->dq3, 0}, dq);
    hp__rewrite_set(rw, (hp_value){a->dkt3, 0}, dkt);
    hp__rewrite_set(rw, (hp_value){a->dv3, 0}, dv);
    a->bwd_done = true;
    return HP_OK;
}

hp_status hp_pass_fuse_attention(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                 hp_err *err) {
    *out = NULL;
    hp__users u = {0};
    HP_TRY(hp__users_init(&u, in, err));
    int n = in->n_nodes;
    /* role[i]: 1 + the attention node i is an output of, 0 none */
    int32_t *role = hp_calloc((size_t)(n ? n : 1), sizeof *role);
    attn *m = NULL;
    int n_m = 0, cap = 0;
    hp_status st = role ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory in fuse_attention");
    for (int i = 0; i < n && st == HP_OK; i++) {
        attn a;
        if (in->nodes[i].op != HP_OP_BMM || !match(in, &u, i, &a)) continue;
        bool taken = role[a.bmm2] != 0;
        for (int k = 0; k < a.n_interior; k++) taken |= role[a.interior[k]] != 0;
        if (taken) continue;
        if (n_m == cap) {
            cap = cap ? 2 * cap : 8;
            attn *grown = hp_realloc(m, (size_t)cap * sizeof *m);
            if (!grown) {
                st = hp_errf(err, HP_NOMEM, "out of memory in fuse_attention");
                break;
            }
            m = grown;
        }
        m[n_m] = a;
        role[a.bmm2] = n_m + 1;
        for (int k = 0; k < a.n_interior; k++) role[a.interior[k]] = -1;
        if (a.bwd) role[a.dq3] = role[a.dkt3] = role[a.dv3] = n_m + 1;
        n_m++;
    }
    hp__users_fini(&u);
    int fwd = 0, bwd = 0;
    hp__rewrite rw;
    if (st == HP_OK && n_m == 0) {
        st = hp__dce(in, out, NULL, err); /* a copy: nothing to fuse */
        goto done;
    }
    if (st != HP_OK || (st = hp__rewrite_start(&rw, in, err)) != HP_OK) goto done;
    for (int i = 0; i < n && st == HP_OK; i++) {
        if (role[i] > 0) {
            attn *a = &m[role[i] - 1];
            st = i == a->bmm2 ? emit_forward(&rw, in, a, err) : emit_backward(&rw, in, a, err);
        } else if (hp__rewrite_copy(&rw, i, err) < 0) {
            st = err ? err->status : HP_INTERNAL;
        }
    }
    if (st != HP_OK) {
        hp__rewrite_abort(&rw);
        goto done;
    }
    for (int k = 0; k < n_m; k++) fwd += m[k].fwd_done, bwd += m[k].bwd_done;
    hp_graph *mid = NULL;
    if ((st = hp__rewrite_finish(&rw, &mid, err)) == HP_OK) {
        st = hp_pass_canonicalize(mid, ctx, out, err);
        hp_graph_free(mid);
    }
done:
    if (st == HP_OK && ctx && ctx->report) {
        ctx->report->fused_attention = fwd;
        ctx->report->fused_attention_backward = bwd;
    }
    hp_free(role);
    hp_free(m);
    return st;
}
