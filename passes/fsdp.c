/* passes/fsdp.c — the FSDP pass: turns the joint graph into the per-rank (SPMD) graph of a 1-D
 * data-parallel mesh of N = ctx->world ranks, as docs/fsdp.md specifies.
 *
 * * A marked parameter (plan.fsdp_fqns, plan.fsdp_patterns) becomes the rank's dim-0 shard
 *   [ceil(d0/N), ...] (global_shape, group_size, group attributes); all_gather_into_tensor +
 *   wait_tensor (+ slice when padded) just before its first forward use, and again before its
 *   first backward use with reshard_after_forward (else the backward reuses the forward copy).
 *   A backward node that reads a forward view of the parameter (the t(W) a linear layer's
 *   gradient reuses, a cast) counts as a use: the view is recomputed on the re-gathered copy,
 *   so the forward copy dies after the forward, as FSDP's reshard does.
 *   Its gradient is slice_backward-padded (when padded), reduce_scatter_tensor(avg) + wait.
 * * An unmarked parameter stays replicated; its gradient gets all_reduce(avg) + wait.
 * * Data inputs are split on dim 0 (the batch); the loss gets all_reduce(avg) + wait.
 *
 * Splitting the batch changes the shapes of everything computed from the data, so the nodes
 * downstream of a data input are re-inferred at the local batch, each value tracking which of
 * its dims carries the batch. Attributes that spell a batch-carrying size are rewritten
 * (view/reshape/expand/slice_backward shapes); what cannot be re-specialised safely is refused
 * naming the node: a slice of the batch dim, a mean over the batch dim in a graph with
 * gradients (its gradient's 1/count is a constant of the global batch), and any other forward
 * reduction over the batch (a sum: each rank would sum its slice). Losses that are a mean must
 * come from nll_loss_forward's mean, whose divisor is computed at run time. The pipeline places
 * a graph this pass refuses with spmd instead (passes/pipeline.c).
 *
 * Collectives go right after the value they reduce and gathers right before their use;
 * the overlap and bucketing passes move and merge them. The input graph is not modified.
 */
#include "hp/passes.h"

#include <stdlib.h>
#include <string.h>

enum { REGION_FWD = 0, REGION_BWD = 1 };

typedef struct param_info {
    bool marked;
    int64_t d0, s;        /* global dim 0; shard rows ceil(d0 / N) */
    int32_t first_use[2]; /* first forward / backward user (input node id), -1: none */
    hp_value w[2];        /* the gathered full parameter for each region (output graph) */
} param_info;

typedef struct fsdp {
    const hp_graph *in;
    hp_graph *out;
    hp_pass_ctx *ctx;
    int64_t n;         /* ranks */
    const char *group; /* the mesh dim's name */
    bool reshard;
    int n_ph, n_params;
    int32_t loss;     /* input node of output 0: the forward region is nodes <= loss */
    param_info *p;    /* [n_params] */
    int32_t *newid;   /* [in->n_nodes]: the copy of each input node */
    int32_t *derived; /* [in->n_nodes]: the marked parameter a forward view is of, -1 none */
    int32_t *recomp;  /* [in->n_nodes]: a derived view recomputed for the backward, -1 none */
    int8_t *sd;       /* [in->n_nodes * HP_MAX_OUTS]: the batch dim of each value, -1 none */
    int64_t *sq;      /* [the same]: the batch's inner factor in that dim (see view_batch_dim) */
    int64_t batch;    /* the global batch (the data inputs' dim 0); -1 if they disagree */
    int32_t *gathers; /* [in->n_nodes]: first gather event before the node (2*param+region) */
    int32_t *gnext;   /* [2 * n_params] */
    int32_t *chains;  /* [in->n_nodes]: first graph output whose collectives follow the node */
    int32_t *cnext;   /* [in->n_outputs] */
    hp_value *outs;   /* [in->n_outputs]: the new graph outputs */
    hp_value *ins;    /* scratch [max inputs] */
    hp_type *types;   /* scratch [max inputs] */
} fsdp;

/* ---- small helpers --------------------------------------------------------------------------- */

static int attr_cmp(const void *a, const void *b) {
    const hp_attr *x = a, *y = b;
    return (x->key > y->key) - (x->key < y->key);
}

static hp_attr *find_attr(hp_attr *attrs, int n, hp_attr_key k) {
    for (int i = 0; i < n; i++)
        if (attrs[i].key == k) return &attrs[i];
    return NULL;
}

static const char *fqn_of(const hp_node *n) {
    const hp_attr *a = hp_node_attr(n, HP_ATTR_FQN);
    return a && a->s ? a->s : "?";
}

static const char *op_name(hp_op op) {
    return hp_op_get(op)->name;
}

/* Appends a node, inferring its output types with the op's shape rule unless `types` is given.
 * attrs are sorted in place (the rule looks keys up in a node's sorted array). */
static hp_status add_node(fsdp *f, hp_op op, const hp_value *in, int n_in, hp_attr *attrs,
                          int n_attrs, const hp_type *types, int *id, hp_err *err) {
    const hp_op_info *info = hp_op_get(op);
    hp_type inferred[HP_MAX_OUTS];
    if (n_attrs > 1) qsort(attrs, (size_t)n_attrs, sizeof *attrs, attr_cmp);
    if (!types) {
        for (int i = 0; i < n_in; i++) f->types[i] = *hp_graph_type(f->out, in[i]);
        memset(inferred, 0, sizeof inferred);
        hp_node scratch = {.op = op,
                           .n_in = n_in,
                           .n_out = info->n_out,
                           .n_attrs = n_attrs,
                           .in = (hp_value *)in,
                           .out = inferred,
                           .attrs = attrs};
        HP_TRY(info->shape(&scratch, f->types, inferred, err));
        types = inferred;
    }
    *id = hp_graph_append(f->out, op, in, n_in, types, info->n_out, attrs, n_attrs, err);
    return *id < 0 ? (err ? err->status : HP_NOMEM) : HP_OK;
}

/* A collective or wait on one value; returns its output in *v. */
static hp_status add_comm(fsdp *f, hp_op op, hp_value x, bool avg, hp_value *v, hp_err *err) {
    hp_attr a[3];
    int na = 0, id;
    if (op != HP_OP_WAIT_TENSOR) {
        a[na++] = hp_attr_int(HP_ATTR_GROUP_SIZE, f->n);
        a[na++] = hp_attr_str(HP_ATTR_GROUP, f->group);
        if (avg) a[na++] = hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_AVG);
    }
    HP_TRY(add_node(f, op, &x, 1, a, na, NULL, &id, err));
    *v = (hp_value){id, 0};
    return HP_OK;
}

/* x -> wait(collective(x)). */
static hp_status add_comm_wait(fsdp *f, hp_op op, hp_value x, bool avg, hp_value *v, hp_err *err) {
    hp_value c;
    HP_TRY(add_comm(f, op, x, avg, &c, err));
    return add_comm(f, HP_OP_WAIT_TENSOR, c, false, v, err);
}

static int8_t *sd_of(fsdp *f, hp_value v) {
    return &f->sd[(size_t)v.node * HP_MAX_OUTS + (size_t)v.out];
}

static int64_t *sq_of(fsdp *f, hp_value v) {
    return &f->sq[(size_t)v.node * HP_MAX_OUTS + (size_t)v.out];
}

/* ---- the plan: which parameters are sharded ------------------------------------------------- */

/* Marks the parameters the plan names. An exact FQN or module prefix that names no parameter
 * is an error (as in hp_job_validate); a pattern that matches none is a warning naming it. */
static hp_status resolve_marks(fsdp *f, hp_err *err) {
    const hp_plan *plan = f->ctx->job ? &f->ctx->job->plan : NULL;
    if (!plan || f->n_params == 0) return HP_OK;
    const hp_graph *g = f->in;
    if (plan->n_fsdp_fqns > 0) {
        bool *marked = hp_calloc((size_t)f->n_params, sizeof *marked);
        if (!marked) return hp_errf(err, HP_NOMEM, "out of memory resolving FSDP marks");
        hp_status st = hp_plan_mark_names(g, plan->fsdp_fqns, plan->n_fsdp_fqns, marked, err);
        for (int i = 0; i < f->n_params && st == HP_OK; i++) f->p[i].marked |= marked[i];
        hp_free(marked);
        HP_TRY(st);
    }
    for (int k = 0; k < plan->n_fsdp_patterns; k++) {
        bool hit = false;
        for (int i = 0; i < f->n_params; i++) {
            if (hit && f->p[i].marked) continue; /* nothing left to learn from this pair */
            if (hp_fqn_match(plan->fsdp_patterns[k], fqn_of(&g->nodes[i])))
                hit = f->p[i].marked = true;
        }
        if (!hit)
            hp_pass_warn(f->ctx, "fsdp: pattern '%.200s' matches no parameter",
                         plan->fsdp_patterns[k]);
    }
    for (int i = 0; i < f->n_params; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        if (f->p[i].marked && t->rank == 0) {
            hp_pass_warn(f->ctx, "fsdp: parameter '%.200s' is a scalar; it stays replicated",
                         fqn_of(&g->nodes[i]));
            f->p[i].marked = false;
        }
        if (!f->p[i].marked) continue;
        f->p[i].d0 = t->shape[0];
        f->p[i].s = (t->shape[0] + f->n - 1) / f->n;
    }
    return HP_OK;
}

/* ---- setup: regions, first uses, where collectives go --------------------------------------- */

/* Cheap one-input ops on a parameter (views and casts) that the backward recomputes on the
 * re-gathered copy instead of keeping the forward's alive. */
static bool is_param_view(hp_op op) {
    switch (op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE:
    case HP_OP_PERMUTE:
    case HP_OP_TRANSPOSE:
    case HP_OP_T:
    case HP_OP_EXPAND:
    case HP_OP_SLICE:
    case HP_OP_UNSQUEEZE:
    case HP_OP_SQUEEZE:
    case HP_OP_TO_COPY:
        return true;
    default:
        return false;
    }
}

/* The marked parameter that value v is (or is a forward view of), -1 none. */
static int32_t param_of(const fsdp *f, hp_value v) {
    if (v.node < f->n_params) return f->p[v.node].marked ? v.node : -1;
    return v.out == 0 ? f->derived[v.node] : -1;
}

static hp_status check_outputs(fsdp *f, hp_err *err) {
    const hp_graph *g = f->in;
    if (g->n_outputs != 1 && g->n_outputs != 1 + f->n_params)
        return hp_errf(err, HP_INVALID,
                       "the graph has %d outputs; FSDP needs the loss, then one gradient per "
                       "parameter (%d), or the loss alone",
                       g->n_outputs, f->n_params);
    for (int o = 0; o < g->n_outputs; o++) {
        hp_value v = g->outputs[o];
        if (v.node < f->n_params && f->p[v.node].marked)
            return hp_errf(err, HP_UNSUPPORTED,
                           "output %d is the sharded parameter '%.200s' itself", o,
                           fqn_of(&g->nodes[v.node]));
        if (o == 0) continue;
        const hp_type *want = &g->nodes[o - 1].out[0], *have = hp_graph_type(g, v);
        if (!have || !hp_type_eq(want, have)) {
            char a[96] = "?", b[96];
            if (have) hp_type_str(have, a, sizeof a);
            return hp_errf(err, HP_INVALID,
                           "output %d: the gradient of parameter '%.200s' is %s, the parameter %s",
                           o, fqn_of(&g->nodes[o - 1]), a, hp_type_str(want, b, sizeof b));
        }
    }
    f->loss = g->outputs[0].node;
    return HP_OK;
}

static void plan_events(fsdp *f) {
    const hp_graph *g = f->in;
    for (int i = 0; i < g->n_nodes; i++) f->gathers[i] = f->chains[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) f->derived[i] = f->recomp[i] = -1;
    for (int i = f->n_ph; i < g->n_nodes; i++) {
        const hp_node *nd = &g->nodes[i];
        int region = i <= f->loss ? REGION_FWD : REGION_BWD;
        for (int k = 0; k < nd->n_in; k++) {
            int32_t j = param_of(f, nd->in[k]);
            /* a forward view is a use only where it is recomputed: in the backward */
            if (j < 0 || (region == REGION_FWD && nd->in[k].node != j)) continue;
            if (f->p[j].first_use[region] < 0) f->p[j].first_use[region] = i;
        }
        if (region == REGION_FWD && nd->n_in == 1 && is_param_view(nd->op))
            f->derived[i] = param_of(f, nd->in[0]);
    }
    /* lists built back to front so that each runs in parameter (output) order */
    for (int j = f->n_params - 1; j >= 0; j--) {
        param_info *p = &f->p[j];
        if (!p->marked) continue;
        for (int r = REGION_BWD; r >= REGION_FWD; r--) {
            if (p->first_use[r] < 0) continue;
            if (r == REGION_BWD && !f->reshard && p->first_use[REGION_FWD] >= 0) continue;
            int32_t ev = 2 * j + r;
            f->gnext[ev] = f->gathers[p->first_use[r]];
            f->gathers[p->first_use[r]] = ev;
        }
    }
    for (int o = g->n_outputs - 1; o >= 0; o--) {
        int32_t at = g->outputs[o].node;
        f->cnext[o] = f->chains[at];
        f->chains[at] = o;
    }
}

/* ---- placeholders ---------------------------------------------------------------------------- */

static hp_status copy_placeholder(fsdp *f, int i, hp_err *err) {
    const hp_node *nd = &f->in->nodes[i];
    hp_attr attrs[HP_ATTR_COUNT];
    int na = nd->n_attrs;
    if (na) memcpy(attrs, nd->attrs, (size_t)na * sizeof *attrs);
    hp_type t = nd->out[0];
    int64_t kind = hp_node_int(nd, HP_ATTR_KIND, -1);
    bool shard = false;
    *sd_of(f, (hp_value){i, 0}) = -1;
    if (hp_node_attr(nd, HP_ATTR_GLOBAL_SHAPE))
        return hp_errf(err, HP_INVALID, "node %d (placeholder '%.200s'): already sharded", i,
                       fqn_of(nd));
    if (kind == HP_INPUT_PARAM && f->p[i].marked) {
        t.shape[0] = f->p[i].s;
        shard = true;
    } else if (kind == HP_INPUT_DATA && t.rank >= 1) {
        if (t.shape[0] % f->n)
            return hp_errf(err, HP_INVALID,
                           "data input '%.200s': batch %lld is not divisible by the world size "
                           "%lld",
                           fqn_of(nd), (long long)t.shape[0], (long long)f->n);
        t.shape[0] /= f->n;
        *sd_of(f, (hp_value){i, 0}) = 0;
        *sq_of(f, (hp_value){i, 0}) = 1;
        if (f->batch >= 0)
            f->batch = !f->batch || f->batch == nd->out[0].shape[0] ? nd->out[0].shape[0] : -1;
        shard = true;
    }
    if (shard) {
        attrs[na++] = hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, nd->out[0].rank, nd->out[0].shape);
        attrs[na++] = hp_attr_int(HP_ATTR_GROUP_SIZE, f->n);
        if (!find_attr(attrs, na, HP_ATTR_GROUP))
            attrs[na++] = hp_attr_str(HP_ATTR_GROUP, f->group);
    }
    int id;
    HP_TRY(add_node(f, HP_OP_PLACEHOLDER, NULL, 0, attrs, na, &t, &id, err));
    f->newid[i] = id;
    return HP_OK;
}

/* ---- gathers and output collectives --------------------------------------------------------- */

static hp_status emit_gather(fsdp *f, int32_t ev, hp_err *err) {
    int j = ev / 2, region = ev % 2;
    param_info *p = &f->p[j];
    hp_value w;
    HP_TRY(add_comm_wait(f, HP_OP_ALL_GATHER, (hp_value){f->newid[j], 0}, false, &w, err));
    if (p->s * f->n != p->d0) {
        hp_attr a[3] = {hp_attr_int(HP_ATTR_DIM, 0), hp_attr_int(HP_ATTR_START, 0),
                        hp_attr_int(HP_ATTR_END, p->d0)};
        int id;
        HP_TRY(add_node(f, HP_OP_SLICE, &w, 1, a, 3, NULL, &id, err));
        w = (hp_value){id, 0};
    }
    p->w[region] = w;
    return HP_OK;
}

static hp_status emit_chain(fsdp *f, int o, hp_err *err) {
    hp_value v = f->in->outputs[o];
    if (*sd_of(f, v) >= 0)
        return hp_errf(err, HP_UNSUPPORTED, "output %d (node %d) carries the batch dim", o, v.node);
    hp_value x = {f->newid[v.node], v.out};
    if (o == 0 || !f->p[o - 1].marked)
        return add_comm_wait(f, HP_OP_ALL_REDUCE, x, true, &f->outs[o], err);
    const param_info *p = &f->p[o - 1];
    if (p->s * f->n != p->d0) {
        hp_type padded = *hp_graph_type(f->out, x);
        padded.shape[0] = p->s * f->n;
        hp_attr a[4] = {hp_attr_ints(HP_ATTR_SHAPE, padded.rank, padded.shape),
                        hp_attr_int(HP_ATTR_DIM, 0), hp_attr_int(HP_ATTR_START, 0),
                        hp_attr_int(HP_ATTR_END, p->d0)};
        int id;
        HP_TRY(add_node(f, HP_OP_SLICE_BACKWARD, &x, 1, a, 4, NULL, &id, err));
        x = (hp_value){id, 0};
    }
    return add_comm_wait(f, HP_OP_REDUCE_SCATTER, x, true, &f->outs[o], err);
}

static hp_status emit_chains(fsdp *f, int i, hp_err *err) {
    for (int32_t o = f->chains[i]; o >= 0; o = f->cnext[o]) HP_TRY(emit_chain(f, o, err));
    return HP_OK;
}

/* ---- copying a node at the local batch ------------------------------------------------------ */

static int norm_dim(int64_t d, int rank) {
    return (int)(d < 0 ? d + rank : d);
}

/* For a view of `in` (batch in dim k) as `out`: the output dim that holds the batch, and its
 * inner factor there (*q), -1 if none. A batch dim may be merged with others (nn.MultiheadAttention
 * views [T, B, C] as [T, B·H, C/H] and [T·B, C]): the dim's index is then a·(B·q) + b·q + c for
 * batch index b, q the inner factor (H above, and 1 in [T·B]). In the flat order the batch index
 * steps by q_in · (the size of the dims after k); the output dim that takes it is the first whose
 * stride does not exceed that step, if its stride divides the step (q = step / stride) and its
 * size is a multiple of q·B: then each rank's slice of the batch is that dim divided by N, as
 * every rank computes the same view of its own contiguous batch slice. B unknown (data inputs
 * of different batches) or an empty tensor: only an unmerged dim at the same offset. */
static int view_batch_dim(const hp_type *in, int k, int64_t q_in, const hp_type *out, int64_t n,
                          int64_t batch, int64_t *q) {
    *q = 1;
    int64_t step = q_in, st[HP_MAX_RANK], acc = 1;
    for (int d = k + 1; d < in->rank; d++) step *= in->shape[d];
    if (batch <= 0 || step <= 0) { /* unknown B, or an empty tensor: the same offset only */
        int64_t outer = 1;
        for (int d = 0; d < k; d++) outer *= in->shape[d];
        for (int j = 0; j < out->rank && acc <= outer; j++) {
            if (acc == outer && out->shape[j] > 0 && out->shape[j] % n == 0) return j;
            acc *= out->shape[j];
        }
        return -1;
    }
    for (int j = out->rank - 1; j >= 0; j--) {
        st[j] = acc;
        acc *= out->shape[j];
    }
    for (int j = 0; j < out->rank; j++) {
        if (st[j] > step) continue; /* dim j is above the batch */
        if (st[j] == 0 || step % st[j]) return -1;
        *q = step / st[j];
        return out->shape[j] % (*q * batch) == 0 ? j : -1;
    }
    return -1;
}

/* Rewrites the attributes of node i (a copy in attrs) that spell a batch-carrying size; k is
 * the batch dim of its input 0 (-1 if that input has none) and q_in its inner factor; *q_out
 * is the output's (a view's own, else q_in). */
static hp_status rewrite_attrs(fsdp *f, int i, int k, int64_t q_in, hp_attr *attrs, int na,
                               int64_t *q_out, hp_err *err) {
    const hp_node *nd = &f->in->nodes[i];
    const hp_type *in0 = nd->n_in ? hp_graph_type(f->in, nd->in[0]) : NULL;
    const char *name = op_name(nd->op);
    if (k < 0) return HP_OK;
    hp_attr *shape = find_attr(attrs, na, HP_ATTR_SHAPE);
    *q_out = q_in;
    switch (nd->op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE: {
        int j = view_batch_dim(in0, k, q_in, &nd->out[0], f->n, f->batch, q_out);
        if (j < 0)
            return hp_errf(err, HP_UNSUPPORTED,
                           "node %d (%s): cannot find the batch (dim %d of its input) in its "
                           "output over %lld ranks",
                           i, name, k, (long long)f->n);
        if (shape->ints.v[j] != -1) shape->ints.v[j] /= f->n;
        return HP_OK;
    }
    case HP_OP_EXPAND: {
        int j = k + nd->out[0].rank - in0->rank;
        if (shape->ints.v[j] != -1) shape->ints.v[j] = nd->out[0].shape[j] / f->n;
        return HP_OK;
    }
    case HP_OP_SLICE:
    case HP_OP_SLICE_BACKWARD: {
        const hp_type *full = nd->op == HP_OP_SLICE ? in0 : &nd->out[0];
        int dim = norm_dim(hp_node_int(nd, HP_ATTR_DIM, 0), full->rank);
        int64_t start = hp_node_int(nd, HP_ATTR_START, 0), end = hp_node_int(nd, HP_ATTR_END, 0);
        bool whole = (start == 0 || start <= -full->shape[dim]) && end >= full->shape[dim] &&
                     hp_node_int(nd, HP_ATTR_STEP, 1) == 1;
        if (dim == k && !whole)
            return hp_errf(err, HP_UNSUPPORTED, "node %d (%s): slices the batch dim %d", i, name,
                           k);
        if (shape) shape->ints.v[k] /= f->n;
        return HP_OK;
    }
    case HP_OP_MEAN: {
        const hp_attr *dims = hp_node_attr(nd, HP_ATTR_DIMS);
        bool reduces = !dims || dims->ints.n == 0;
        for (int d = 0; dims && d < dims->ints.n; d++)
            reduces |= norm_dim(dims->ints.v[d], in0->rank) == k;
        if (reduces && f->in->n_outputs > 1)
            return hp_errf(err, HP_UNSUPPORTED,
                           "node %d (mean): a mean over the batch dim; its gradient's 1/count is "
                           "fixed for the global batch",
                           i);
        return HP_OK;
    }
    default:
        return HP_OK;
    }
}

/* The backward's copy of forward view d (of parameter j): the chain of views from j to d
 * recomputed on the re-gathered parameter, each emitted on first need (just before the node
 * that reads it). Iterative: while walking up, recomp[u] = -2 - (the view below u) links the
 * chain back down, so a long chain costs no stack. */
static hp_status recompute(fsdp *f, int32_t d, int32_t j, hp_value *v, hp_err *err) {
    int32_t u = d, below = -1;
    while (u != j && f->recomp[u] < 0) {
        f->recomp[u] = -2 - below;
        below = u;
        u = f->in->nodes[u].in[0].node;
    }
    hp_value x = u == j ? f->p[j].w[REGION_BWD] : (hp_value){f->recomp[u], 0};
    for (int32_t c = below; c >= 0;) {
        const hp_node *nd = &f->in->nodes[c];
        int32_t next = -2 - f->recomp[c];
        hp_attr attrs[HP_ATTR_COUNT];
        if (nd->n_attrs) memcpy(attrs, nd->attrs, (size_t)nd->n_attrs * sizeof *attrs);
        int id;
        HP_TRY(add_node(f, nd->op, &x, 1, attrs, nd->n_attrs, nd->out, &id, err));
        f->recomp[c] = id;
        x = (hp_value){id, 0};
        c = next;
    }
    *v = x;
    return HP_OK;
}

/* Input v of node i in the output graph: a marked parameter reads its gathered copy for i's
 * region; a backward read of a forward view of one reads the view recomputed when the
 * parameter was re-gathered. */
static hp_status map_input(fsdp *f, int i, hp_value v, hp_value *m, hp_err *err) {
    int32_t j = param_of(f, v);
    if (j >= 0 && i > f->loss && hp_value_ok(f->p[j].w[REGION_BWD]))
        return recompute(f, v.node, j, m, err);
    if (j >= 0 && v.node == j) {
        *m = f->p[j].w[REGION_FWD];
        return HP_OK;
    }
    *m = (hp_value){f->newid[v.node], v.out};
    return HP_OK;
}

/* A forward node that takes the batch and gives values without it reduces over the batch: each
 * rank reduces only its slice, and the loss's all_reduce(avg) and the gradients' avg are world
 * 1's values only for a mean whose divisor is the local count: nll_loss_forward's mean, and a
 * mean in a graph without gradients (mean's own gradient is refused in rewrite_attrs). A sum
 * over the batch (reduction='sum', an auxiliary x.sum()), a max, or a product contracting the
 * batch would train on 1/N of the loss's value and gradient: refused, so the pipeline places the
 * graph with spmd, whose Partial placements keep world 1's values. */
static hp_status check_forward_reduction(fsdp *f, int i, hp_err *err) {
    const hp_node *nd = &f->in->nodes[i];
    if (i > f->loss || nd->n_out == 0) return HP_OK;
    for (int o = 0; o < nd->n_out; o++)
        if (*sd_of(f, (hp_value){i, o}) >= 0) return HP_OK;
    if (nd->op == HP_OP_MEAN || (nd->op == HP_OP_NLL_LOSS_FORWARD &&
                                 hp_node_int(nd, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_MEAN))
        return HP_OK;
    return hp_errf(err, HP_UNSUPPORTED,
                   "node %d (%s): reduces over the batch dim in the forward, so each rank would "
                   "reduce only its slice (only a mean averages across ranks)",
                   i, op_name(nd->op));
}

static hp_status copy_node(fsdp *f, int i, hp_err *err) {
    const hp_node *nd = &f->in->nodes[i];
    int k0 = -1;
    int64_t q = 1; /* the inner factor of the first batched input's batch dim */
    bool batched = false;
    for (int k = 0; k < nd->n_in; k++) {
        HP_TRY(map_input(f, i, nd->in[k], &f->ins[k], err));
        int8_t s = *sd_of(f, nd->in[k]);
        if (s >= 0 && !batched) q = *sq_of(f, nd->in[k]);
        if (s >= 0) batched = true;
        if (k == 0) k0 = s;
    }
    for (int o = 0; o < nd->n_out; o++) *sd_of(f, (hp_value){i, o}) = -1;
    int id;
    if (!batched) { /* unchanged but for its inputs */
        if ((id = hp_graph_append_like(f->out, f->in, nd, f->ins, err)) < 0)
            return err ? err->status : HP_NOMEM;
        f->newid[i] = id;
        return HP_OK;
    }
    hp_attr attrs[HP_ATTR_COUNT];
    if (nd->n_attrs) memcpy(attrs, nd->attrs, (size_t)nd->n_attrs * sizeof *attrs);
    int64_t q_out = q;
    HP_TRY(rewrite_attrs(f, i, k0, k0 >= 0 ? *sq_of(f, nd->in[0]) : 1, attrs, nd->n_attrs, &q_out,
                         err));
    int na = nd->n_attrs;
    if (nd->op == HP_OP_NATIVE_DROPOUT && !find_attr(attrs, na, HP_ATTR_GLOBAL_SHAPE))
        /* its mask is drawn at global indices: the runtime places the local batch in it */
        attrs[na++] = hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, nd->out[0].rank, nd->out[0].shape);
    hp_status st = add_node(f, nd->op, f->ins, nd->n_in, attrs, na, NULL, &id, err);
    if (st == HP_NOMEM || st == HP_LIMIT) return st;
    if (st != HP_OK) { /* the graph is valid at the global batch: what fails is the rewrite's */
        hp_err_prefix(err, "node %d (%s) at the local batch (1/%lld)", i, op_name(nd->op),
                      (long long)f->n);
        return err->status = HP_UNSUPPORTED; /* (a constant of the global batch's shape, say) */
    }
    f->newid[i] = id;
    const hp_node *got = &f->out->nodes[id];
    for (int o = 0; o < nd->n_out; o++) {
        const hp_type *gl = &nd->out[o], *lo = &got->out[o];
        int at = -1, diffs = 0;
        for (int d = 0; d < gl->rank && lo->rank == gl->rank; d++) {
            if (gl->shape[d] == lo->shape[d]) continue;
            diffs++;
            if (lo->shape[d] * f->n == gl->shape[d]) at = d;
        }
        if (lo->rank != gl->rank || diffs > 1 || (diffs == 1 && at < 0)) {
            char a[96], b[96];
            return hp_errf(err, HP_UNSUPPORTED,
                           "node %d (%s): at the local batch it gives %s, not %s with one dim "
                           "divided by %lld",
                           i, op_name(nd->op), hp_type_str(lo, a, sizeof a),
                           hp_type_str(gl, b, sizeof b), (long long)f->n);
        }
        *sd_of(f, (hp_value){i, o}) = (int8_t)at;
        *sq_of(f, (hp_value){i, o}) = q_out;
    }
    return check_forward_reduction(f, i, err);
}

/* ---- the pass -------------------------------------------------------------------------------- */

/* The report's counters, in hp_collective_bytes' convention (the pipeline recounts the same). */
static void fill_report(const hp_graph *g, hp_pass_ctx *ctx) {
    if (!ctx->report) return;
    int count = 0;
    int64_t bytes = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!(hp_op_get(g->nodes[i].op)->flags & HP_OPF_COLLECTIVE)) continue;
        count++;
        bytes += hp_collective_bytes(g, i);
    }
    ctx->report->collectives = count;
    ctx->report->comm_bytes = bytes;
}

static void fsdp_fini(fsdp *f) {
    hp_free(f->p);
    hp_free(f->newid);
    hp_free(f->derived);
    hp_free(f->recomp);
    hp_free(f->sd);
    hp_free(f->sq);
    hp_free(f->gathers);
    hp_free(f->gnext);
    hp_free(f->chains);
    hp_free(f->cnext);
    hp_free(f->outs);
    hp_free(f->ins);
    hp_free(f->types);
}

static hp_status fsdp_init(fsdp *f, const hp_graph *in, hp_pass_ctx *ctx, hp_err *err) {
    memset(f, 0, sizeof *f);
    f->in = in;
    f->ctx = ctx;
    f->n = ctx->world;
    const hp_job *job = ctx->job;
    f->reshard = job ? job->plan.reshard_after_forward : true;
    f->group =
        job && job->plan.n_mesh == 1 && job->plan.mesh[0].name[0] ? job->plan.mesh[0].name : "dp";
    hp_graph_inputs gi = hp_graph_count_inputs(in);
    f->n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    f->n_params = gi.n_params;
    int max_in = 1;
    for (int i = 0; i < in->n_nodes; i++)
        if (in->nodes[i].n_in > max_in) max_in = in->nodes[i].n_in;
    size_t nn = (size_t)in->n_nodes, np = (size_t)(f->n_params ? f->n_params : 1);
    size_t no = (size_t)(in->n_outputs ? in->n_outputs : 1);
    f->p = hp_calloc(np, sizeof *f->p);
    f->newid = hp_calloc(nn + 1, sizeof *f->newid);
    f->derived = hp_calloc(nn + 1, sizeof *f->derived);
    f->recomp = hp_calloc(nn + 1, sizeof *f->recomp);
    f->sd = hp_calloc(nn + 1, HP_MAX_OUTS);
    f->sq = hp_calloc((nn + 1) * HP_MAX_OUTS, sizeof *f->sq);
    f->gathers = hp_calloc(nn + 1, sizeof *f->gathers);
    f->gnext = hp_calloc(2 * np, sizeof *f->gnext);
    f->chains = hp_calloc(nn + 1, sizeof *f->chains);
    f->cnext = hp_calloc(no, sizeof *f->cnext);
    f->outs = hp_calloc(no, sizeof *f->outs);
    f->ins = hp_calloc((size_t)max_in, sizeof *f->ins);
    f->types = hp_calloc((size_t)max_in, sizeof *f->types);
    if (!f->p || !f->newid || !f->derived || !f->recomp || !f->sd || !f->sq || !f->gathers ||
        !f->gnext || !f->chains || !f->cnext || !f->outs || !f->ins || !f->types)
        return hp_errf(err, HP_NOMEM, "out of memory (%d nodes)", in->n_nodes);
    for (int j = 0; j < f->n_params; j++) {
        f->p[j].first_use[0] = f->p[j].first_use[1] = -1;
        f->p[j].w[0] = f->p[j].w[1] = HP_NO_VALUE;
    }
    return HP_OK;
}

static hp_status rewrite(fsdp *f, hp_err *err) {
    const hp_graph *g = f->in;
    /* room for the copy and the collectives (unused room costs no pages) */
    if (!(f->out = hp_graph_new()) || hp_graph_reserve(f->out, g->n_nodes * 2, NULL) != HP_OK)
        return hp_errf(err, HP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_nodes; i++) {
        if (i < f->n_ph) {
            HP_TRY(copy_placeholder(f, i, err));
        } else {
            for (int32_t ev = f->gathers[i]; ev >= 0; ev = f->gnext[ev])
                HP_TRY(emit_gather(f, ev, err));
            HP_TRY(copy_node(f, i, err));
        }
        /* collectives on placeholder values wait until the placeholders are all declared */
        if (i == f->n_ph - 1)
            for (int j = 0; j < f->n_ph; j++) HP_TRY(emit_chains(f, j, err));
        else if (i >= f->n_ph)
            HP_TRY(emit_chains(f, i, err));
    }
    return hp_graph_set_outputs(f->out, f->outs, g->n_outputs, err);
}

hp_status hp_pass_fsdp(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    hp_err local;
    if (!err) err = &local; /* the helpers read the status back from it */
    *out = NULL;
    if (ctx->world < 1 || ctx->world > HP_MAX_WORLD)
        return hp_errf(err, HP_INVALID, "world size %d must be in [1, %d]", ctx->world,
                       HP_MAX_WORLD);
    fsdp f;
    hp_status st = fsdp_init(&f, in, ctx, err);
    if (st == HP_OK) st = resolve_marks(&f, err);
    if (st == HP_OK && ctx->world == 1) {
        fsdp_fini(&f);
        if (!(*out = hp_graph_clone(in))) return hp_errf(err, HP_NOMEM, "out of memory");
        fill_report(*out, ctx);
        return HP_OK;
    }
    if (st == HP_OK && in->n_outputs < 1)
        st = hp_errf(err, HP_INVALID, "the graph has no outputs (FSDP needs the loss first)");
    if (st == HP_OK) st = check_outputs(&f, err);
    if (st == HP_OK) {
        plan_events(&f);
        st = rewrite(&f, err);
    }
    if (st == HP_OK) {
        *out = f.out;
        fill_report(f.out, ctx);
    } else {
        hp_graph_free(f.out);
    }
    fsdp_fini(&f);
    return st;
}
