/* passes/fuse_cross_entropy.c — the fuse_cross_entropy pass: the loss's log-softmax and
 * nll_loss, and their backwards, become fused_cross_entropy and its backward (graph/ops.def),
 * so no [N, C] log-probabilities, their gradient, or f32 copy of bf16 logits are ever stored.
 * On the ~1B Llama (N = 4096 tokens, C = 128256) those are 2 GiB each, and their kernels move
 * ~20 GB a step; the fused kernels read the logits twice and write their gradient once.
 *
 * It runs after mixed_precision, on graphs without placements (world 1, FSDP/DDP; loss
 * parallel rewrites the loss into other ops first), and matches, with X [N, C] the logits:
 *
 *   forward   L = _log_softmax(X0, dim=1)        X0 = X, f32; or X0 = _to_copy(X) to f32
 *             (loss, tw) = nll_loss_forward(L, T){mean | sum, ignore_index}
 *   backward  B = nll_loss_backward(g, L, T, tw)  (the same attributes)     optional
 *             GX = _log_softmax_backward_data(B, L, dim=1)
 *             used as is when X is f32, else only through _to_copy casts to X's dtype
 *
 * where L is used by those nodes alone, B by GX alone, and none of them is a graph output; and
 * replaces them with (loss, tw, lse) = fused_cross_entropy(X, T) and fused_cross_entropy_
 * backward(g, X, T, lse, tw) in X's dtype (standing for GX, or for its casts). The fused ops
 * compute the same values (the evaluator's and both backends' kernels, tested against the
 * chain): the gradient rounds once to X's dtype, as GX's cast did. Anything else (reduction
 * none, a second user of L, a backward read elsewhere in f32) is left as it is. The report's
 * fused_cross_entropy counts the losses fused (hpctl plan shows it).
 */
#include "passes/passes_internal.h"
#include "passes/sched_util.h"

#include <string.h>

typedef struct ce_match {
    int nll, lsm_bwd, nll_bwd; /* node ids; -1 for no backward */
    hp_value logits, target;
    int casts[8], n_casts; /* GX's casts to the logits' dtype, which the backward replaces */
} ce_match;

static bool same(hp_value a, hp_value b) {
    return a.node == b.node && a.out == b.out;
}

static bool same_loss_attrs(const hp_node *a, const hp_node *b) {
    return hp_node_int(a, HP_ATTR_REDUCTION, HP_NLL_MEAN) ==
               hp_node_int(b, HP_ATTR_REDUCTION, HP_NLL_MEAN) &&
           hp_node_int(a, HP_ATTR_IGNORE_INDEX, -100) == hp_node_int(b, HP_ATTR_IGNORE_INDEX, -100);
}

/* The backward part at GX = lsm_bwd (B = nll_bwd): GX's users, when X is not f32, are all
 * casts to X's dtype (and at most HP_ARRAY_LEN(casts) of them). */
static bool match_grad_users(const hp_graph *g, const hp__users *u, ce_match *m, hp_dtype x_dt) {
    if (u->is_output[m->lsm_bwd]) return x_dt == HP_F32;
    m->n_casts = 0;
    if (x_dt == HP_F32) return true;
    for (int k = u->off[m->lsm_bwd]; k < u->off[m->lsm_bwd + 1]; k++) {
        const hp_node *c = &g->nodes[u->user[k]];
        if (c->op != HP_OP_TO_COPY || c->out[0].dtype != x_dt ||
            m->n_casts == (int)HP_ARRAY_LEN(m->casts))
            return false;
        m->casts[m->n_casts++] = u->user[k];
    }
    return m->n_casts > 0;
}

/* Node lsm (an _log_softmax) heads the pattern? */
static bool match(const hp_graph *g, const hp__users *u, int lsm, ce_match *m) {
    const hp_node *l = &g->nodes[lsm];
    if (l->op != HP_OP_LOG_SOFTMAX || l->out[0].rank != 2 || l->out[0].dtype != HP_F32 ||
        hp_node_int(l, HP_ATTR_DIM, -1) != 1 || u->is_output[lsm])
        return false;
    hp_value x = l->in[0];
    const hp_node *xn = &g->nodes[x.node];
    if (xn->op == HP_OP_TO_COPY && hp_graph_type(g, xn->in[0])->dtype == HP_BF16)
        x = xn->in[0]; /* the kernels read bf16 logits as they are (f16 stays cast) */
    *m = (ce_match){.nll = -1, .lsm_bwd = -1, .nll_bwd = -1, .logits = x};
    /* L's users: one nll_loss_forward, at most one nll_loss_backward and one log-softmax
     * backward reading it */
    for (int k = u->off[lsm]; k < u->off[lsm + 1]; k++) {
        int id = u->user[k];
        const hp_node *n = &g->nodes[id];
        int *slot = n->op == HP_OP_NLL_LOSS_FORWARD       ? &m->nll
                    : n->op == HP_OP_NLL_LOSS_BACKWARD    ? &m->nll_bwd
                    : n->op == HP_OP_LOG_SOFTMAX_BACKWARD ? &m->lsm_bwd
                                                          : NULL;
        if (!slot || (*slot >= 0 && *slot != id)) return false;
        *slot = id;
    }
    if (m->nll < 0) return false;
    const hp_node *f = &g->nodes[m->nll];
    int64_t red = hp_node_int(f, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (!same(f->in[0], (hp_value){lsm, 0}) || (red != HP_NLL_MEAN && red != HP_NLL_SUM))
        return false;
    m->target = f->in[1];
    if (m->nll_bwd < 0 && m->lsm_bwd < 0) return true; /* a forward alone (no gradient) */
    if (m->nll_bwd < 0 || m->lsm_bwd < 0) return false;
    const hp_node *b = &g->nodes[m->nll_bwd], *s = &g->nodes[m->lsm_bwd];
    if (!same(b->in[1], (hp_value){lsm, 0}) || !same(b->in[2], m->target) ||
        !same(b->in[3], (hp_value){m->nll, 1}) || !same_loss_attrs(b, f) ||
        u->is_output[m->nll_bwd])
        return false;
    if (u->off[m->nll_bwd + 1] - u->off[m->nll_bwd] != 1 ||
        u->user[u->off[m->nll_bwd]] != m->lsm_bwd)
        return false;
    if (!same(s->in[0], (hp_value){m->nll_bwd, 0}) || !same(s->in[1], (hp_value){lsm, 0}) ||
        hp_node_int(s, HP_ATTR_DIM, -1) != 1)
        return false;
    if (hp_graph_type(g, b->in[0])->dtype != HP_F32 || hp_graph_type(g, b->in[0])->rank != 0)
        return false;
    return match_grad_users(g, u, m, hp_graph_type(g, x)->dtype);
}

/* Builds match role - 1's fused op at node i: the forward at its nll_loss_forward, the
 * backward at its _log_softmax_backward_data (after the forward: it reads L, which follows X
 * and T), standing for that node's value or for its casts. */
static hp_status emit(hp__rewrite *rw, int i, int role, void *ctx, hp_err *err) {
    const ce_match *a = &((const ce_match *)ctx)[role - 1];
    const hp_node *f = &rw->in->nodes[a->nll];
    hp_attr at[2] = {hp_attr_int(HP_ATTR_REDUCTION, hp_node_int(f, HP_ATTR_REDUCTION, HP_NLL_MEAN)),
                     hp_attr_int(HP_ATTR_IGNORE_INDEX, hp_node_int(f, HP_ATTR_IGNORE_INDEX, -100))};
    hp_value x = hp__rewrite_get(rw, a->logits), t = hp__rewrite_get(rw, a->target);
    if (i == a->nll) {
        hp_value ce =
            hp__rewrite_build(rw, HP_OP_FUSED_CROSS_ENTROPY, (hp_value[]){x, t}, 2, at, 2, err);
        if (!hp_value_ok(ce)) return err ? err->status : HP_INTERNAL;
        hp__rewrite_set(rw, (hp_value){i, 0}, ce);
        hp__rewrite_set(rw, (hp_value){i, 1}, hp_out(ce, 1));
        return HP_OK;
    }
    hp_value ce = hp__rewrite_get(rw, (hp_value){a->nll, 0}); /* the fused forward's loss */
    hp_value in[5] = {hp__rewrite_get(rw, rw->in->nodes[a->nll_bwd].in[0]), x, t, hp_out(ce, 2),
                      hp_out(ce, 1)};
    hp_value gx = hp__rewrite_build(rw, HP_OP_FUSED_CROSS_ENTROPY_BACKWARD, in, 5, at, 2, err);
    if (!hp_value_ok(gx)) return err ? err->status : HP_INTERNAL;
    hp__rewrite_set(rw, (hp_value){i, 0}, gx);
    for (int k = 0; k < a->n_casts; k++) hp__rewrite_set(rw, (hp_value){a->casts[k], 0}, gx);
    return HP_OK;
}

hp_status hp_pass_fuse_cross_entropy(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                     hp_err *err) {
    *out = NULL;
    int n = in->n_nodes, heads = 0;
    if (in->mesh.ndim > 0) return hp__dce(in, out, NULL, err); /* placed: left as it is */
    for (int i = 0; i < n; i++) heads += in->nodes[i].op == HP_OP_LOG_SOFTMAX;
    hp__users u = {0};
    HP_TRY(hp__users_init(&u, in, err));
    /* role[i]: 1 + the match whose forward (nll) or backward (lsm_bwd) node i is, -1 a node
     * the match replaces without a value of its own, 0 none */
    int32_t *role = hp_calloc((size_t)(n ? n : 1), sizeof *role);
    ce_match *m = hp_calloc((size_t)(heads ? heads : 1), sizeof *m);
    int n_m = 0;
    hp_status st =
        role && m ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory in fuse_cross_entropy");
    for (int i = 0; i < n && st == HP_OK; i++) {
        ce_match *a = &m[n_m];
        if (in->nodes[i].op != HP_OP_LOG_SOFTMAX || !match(in, &u, i, a)) continue;
        role[a->nll] = ++n_m;
        if (a->lsm_bwd >= 0) {
            role[a->lsm_bwd] = n_m;
            role[a->nll_bwd] = -1;
            for (int k = 0; k < a->n_casts; k++) role[a->casts[k]] = -1;
        }
    }
    hp__users_fini(&u);
    if (st == HP_OK) st = hp__rewrite_fused(in, role, emit, m, out, err);
    if (st == HP_OK && ctx && ctx->report) ctx->report->fused_cross_entropy = n_m;
    hp_free(role);
    hp_free(m);
    return st;
}
