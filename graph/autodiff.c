/* graph/autodiff.c — reverse-mode autodiff over the IR: hp_autodiff turns a forward graph with
 * a scalar loss into the joint graph (forward + backward nodes; outputs = loss, then one
 * gradient per parameter in parameter order).
 *
 * Three steps, as in ggml:
 *   1. a forward sweep marks the values that vary with some parameter. Only floating values
 *      vary: gradients of integers and bools never flow (eq, lt and integer casts end a path);
 *   2. a reverse sweep from the loss calls each op's gradient rule (grad_rules*.c) with the
 *      gradients of its outputs and accumulates what it returns for its varying inputs,
 *      summing several uses with `add` and casting to the value's dtype where a rule returns
 *      another one. Since nodes are in topological order, a value's gradient is complete by
 *      the time the sweep reaches its producer;
 *   3. the outputs are set, with a `zeros` gradient for a parameter the loss ignores.
 * Nodes after the loss are left alone. The result is not simplified: DCE and CSE are passes.
 */
#include "graph/grad_internal.h"

#include "hp/build.h"

#include <stdio.h>
#include <string.h>

/* How an op's output takes part in differentiation. */
typedef enum {
    OUT_DIFF,    /* an ordinary output: its gradient flows to the inputs */
    OUT_CONST,   /* constant with respect to the inputs: never varies */
    OUT_NO_GRAD, /* varies, but no rule gives its gradient: a path through it is refused */
} out_kind;

/* nll_loss's total_weight counts targets, and detach stops the gradient: constant, so they
 * never vary. The rstd of rms_norm and
 * the logsumexp of attention do vary, but (as in PyTorch) their gradient is not defined: a
 * path from a parameter to the loss through them is an error, not a silent zero. */
static out_kind output_kind(hp_op op, int k) {
    switch (op) {
    case HP_OP_NLL_LOSS_FORWARD:
        return k == 1 ? OUT_CONST : OUT_DIFF;
    case HP_OP_DETACH:
        return OUT_CONST;
    case HP_OP_RMS_NORM:
    case HP_OP_SDPA:
        return k == 1 ? OUT_NO_GRAD : OUT_DIFF;
    case HP_OP_LAYER_NORM:
        return k >= 1 ? OUT_NO_GRAD : OUT_DIFF;
    default:
        return OUT_DIFF;
    }
}

hp_status hp__grad_fail(hp_graph *g, hp_status s, const char *fmt, ...) {
    if (g->failed) return g->err.status;
    va_list ap;
    va_start(ap, fmt);
    g->failed = true;
    g->err.status = s;
    vsnprintf(g->err.msg, sizeof g->err.msg, fmt, ap);
    va_end(ap);
    return s;
}

/* Per-run state: flat [node * HP_MAX_OUTS + out] tables over the forward nodes. */
typedef struct ad_state {
    int n_fwd;      /* nodes considered: [0, loss.node] */
    bool *varies;   /* [n_fwd * HP_MAX_OUTS] */
    hp_value *grad; /* [n_fwd * HP_MAX_OUTS]: accumulated gradient, HP_NO_VALUE if none */
    bool *need;     /* [max inputs of a node] scratch */
    hp_value *gin;  /* [max inputs of a node] scratch */
    hp_value *outs; /* [1 + n_params] */
} ad_state;

static void ad_free(ad_state *s) {
    hp_free(s->varies);
    hp_free(s->grad);
    hp_free(s->need);
    hp_free(s->gin);
    hp_free(s->outs);
}

static size_t slot(int node, int out) {
    return (size_t)node * HP_MAX_OUTS + (size_t)out;
}

/* The error of a failed builder call inside the reverse sweep, with the forward node named. */
static hp_status rule_error(hp_graph *g, int id, hp_op op, hp_err *err) {
    return hp_errf(err, g->err.status, "autodiff of node %d (%s): %s", id, hp_op_get(op)->name,
                   g->err.msg);
}

/* Adds `contrib` to the gradient accumulated in *acc for a value of type `want`. The shape
 * must match (a rule's contract); the dtype is cast when it differs. */
static hp_status accumulate(hp_graph *g, int input, hp_value *acc, hp_value contrib,
                            const hp_type *want) {
    const hp_type *t = hp_graph_type(g, contrib);
    if (!t)
        return hp__grad_fail(g, HP_INTERNAL, "gradient rule returned no valid value for input %d",
                             input);
    if (t->rank != want->rank || memcmp(t->shape, want->shape, sizeof(int64_t) * t->rank) != 0) {
        char a[96], b[96];
        return hp__grad_fail(g, HP_INTERNAL, "gradient rule gave %s for input %d of type %s",
                             hp_type_str(t, a, sizeof a), input, hp_type_str(want, b, sizeof b));
    }
    if (t->dtype != want->dtype) contrib = hp_to(g, contrib, want->dtype);
    *acc = hp_value_ok(*acc) ? hp_add(g, *acc, contrib) : contrib;
    return g->failed ? g->err.status : HP_OK;
}

/* Step 1: which values vary with a parameter. Also checks refs, which the tables index by. */
static hp_status mark_varying(const hp_graph *g, ad_state *s, int *max_in, hp_err *err) {
    *max_in = 1;
    for (int i = 0; i < s->n_fwd; i++) {
        const hp_node *n = &g->nodes[i];
        if (n->n_out < 1 || n->n_out > HP_MAX_OUTS || !hp_op_get(n->op))
            return hp_errf(err, HP_INVALID, "autodiff: node %d is malformed (verify the graph)", i);
        if (n->n_in > *max_in) *max_in = n->n_in;
        if (n->op == HP_OP_PLACEHOLDER) {
            s->varies[slot(i, 0)] = hp_node_int(n, HP_ATTR_KIND, -1) == HP_INPUT_PARAM &&
                                    hp_dtype_is_float(n->out[0].dtype);
            continue;
        }
        bool any = false;
        for (int j = 0; j < n->n_in; j++) {
            hp_value v = n->in[j];
            if (v.node < 0 || v.node >= i || v.out < 0 || v.out >= g->nodes[v.node].n_out)
                return hp_errf(err, HP_INVALID,
                               "autodiff: node %d (%s): input %d refers to (%d, %d), not an "
                               "earlier value (verify the graph)",
                               i, hp_op_get(n->op)->name, j, (int)v.node, (int)v.out);
            any |= s->varies[slot(v.node, v.out)];
        }
        for (int k = 0; k < n->n_out; k++)
            s->varies[slot(i, k)] =
                any && hp_dtype_is_float(n->out[k].dtype) && output_kind(n->op, k) != OUT_CONST;
    }
    return HP_OK;
}

/* Step 2 for one node: calls its rule and accumulates into its inputs' gradients. */
static hp_status backprop_node(hp_graph *g, ad_state *s, int id, hp_err *err) {
    hp_grad_node fwd = {.node = g->nodes[id], .id = id, .need = s->need};
    const hp_node *n = &fwd.node; /* a copy: g->nodes moves as nodes are added */
    const hp_op_info *info = hp_op_get(n->op);
    hp_value gout[HP_MAX_OUTS];
    bool any = false;
    for (int k = 0; k < HP_MAX_OUTS; k++) {
        gout[k] = k < n->n_out ? s->grad[slot(id, k)] : HP_NO_VALUE;
        if (!hp_value_ok(gout[k])) continue;
        any = true;
        if (output_kind(n->op, k) == OUT_NO_GRAD)
            return hp_errf(err, HP_UNSUPPORTED,
                           "autodiff: node %d (%s): output %d has no gradient rule, and it lies "
                           "on a path from a parameter to the loss",
                           id, info->name, k);
    }
    if (!any || n->op == HP_OP_PLACEHOLDER) return HP_OK;
    if (!info->grad)
        return hp_errf(err, HP_UNSUPPORTED,
                       "autodiff: node %d (%s) has no gradient rule, and it lies on a path from "
                       "a parameter to the loss",
                       id, info->name);
    for (int j = 0; j < n->n_in; j++) {
        s->need[j] = s->varies[slot(n->in[j].node, n->in[j].out)];
        s->gin[j] = HP_NO_VALUE;
    }
    hp_status st = info->grad(g, &fwd, gout, s->gin);
    if (g->failed) return rule_error(g, id, n->op, err);
    if (st != HP_OK)
        return hp_errf(err, st, "autodiff of node %d (%s): gradient rule failed: %s", id,
                       info->name, hp_status_str(st));
    for (int j = 0; j < n->n_in; j++) {
        if (!s->need[j] || !hp_value_ok(s->gin[j])) continue;
        hp_value v = n->in[j];
        const hp_type *want = &g->nodes[v.node].out[v.out]; /* arena: stable */
        if (accumulate(g, j, &s->grad[slot(v.node, v.out)], s->gin[j], want) != HP_OK)
            return rule_error(g, id, n->op, err);
    }
    return HP_OK;
}

/* Steps 2 and 3. */
static hp_status run(hp_graph *g, ad_state *s, hp_value loss, hp_err *err) {
    int max_in;
    HP_TRY(mark_varying(g, s, &max_in, err));
    s->need = hp_calloc((size_t)max_in, sizeof *s->need);
    s->gin = hp_calloc((size_t)max_in, sizeof *s->gin);
    if (!s->need || !s->gin) return hp_errf(err, HP_NOMEM, "autodiff: out of memory");

    const hp_type lt = g->nodes[loss.node].out[loss.out];
    if (s->varies[slot(loss.node, loss.out)]) {
        /* d loss / d loss */
        int64_t none[1] = {0};
        s->grad[slot(loss.node, loss.out)] = hp_ones(g, 0, none, lt.dtype);
        if (g->failed) return hp_errf(err, g->err.status, "autodiff: seed: %s", g->err.msg);
    }
    for (int i = s->n_fwd - 1; i >= 0; i--) HP_TRY(backprop_node(g, s, i, err));

    hp_graph_inputs gi = hp_graph_count_inputs(g);
    s->outs = hp_calloc((size_t)gi.n_params + 1, sizeof *s->outs);
    if (!s->outs) return hp_errf(err, HP_NOMEM, "autodiff: out of memory");
    int n = 0;
    s->outs[n++] = loss;
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) {
        if (hp_node_int(&g->nodes[i], HP_ATTR_KIND, -1) != HP_INPUT_PARAM) continue;
        hp_value gp = i < s->n_fwd ? s->grad[slot(i, 0)] : HP_NO_VALUE;
        if (!hp_value_ok(gp)) {
            hp_type t = g->nodes[i].out[0];
            gp = hp_zeros(g, t.rank, t.shape, t.dtype);
            if (g->failed)
                return hp_errf(err, g->err.status, "autodiff: zero gradient of node %d: %s", i,
                               g->err.msg);
        }
        s->outs[n++] = gp;
    }
    /* Keep the old outputs: set_outputs can fail half-way, and restoring them needs no memory
     * (the output array already held that many). */
    int n_old = g->n_outputs;
    hp_value *old = hp_malloc((size_t)(n_old ? n_old : 1) * sizeof *old);
    if (!old) return hp_errf(err, HP_NOMEM, "autodiff: out of memory");
    if (n_old) memcpy(old, g->outputs, (size_t)n_old * sizeof *old);
    hp_status st = hp_graph_set_outputs(g, s->outs, n, err);
    if (st != HP_OK) {
        hp_err_prefix(err, "autodiff");
        hp_status restored = hp_graph_set_outputs(g, old, n_old, NULL);
        HP_ASSERT(restored == HP_OK);
    }
    hp_free(old);
    return st;
}

hp_status hp_autodiff(hp_graph *g, hp_value loss, hp_err *err) {
    if (!g) return hp_errf(err, HP_INVALID, "autodiff: no graph");
    if (hp_graph_failed(g)) {
        hp_status st = hp_graph_status(g, err);
        hp_err_prefix(err, "autodiff: the graph has a builder error");
        return st;
    }
    const hp_type *lt = hp_graph_type(g, loss);
    char tb[96];
    if (!lt)
        return hp_errf(err, HP_INVALID, "autodiff: loss (%d, %d) is not a value of the graph",
                       (int)loss.node, (int)loss.out);
    if (lt->rank != 0)
        return hp_errf(err, HP_INVALID,
                       "autodiff: loss (node %d (%s), output %d) is %s, not a scalar",
                       (int)loss.node, hp_op_get(g->nodes[loss.node].op)->name, (int)loss.out,
                       hp_type_str(lt, tb, sizeof tb));
    if (!hp_dtype_is_float(lt->dtype))
        return hp_errf(err, HP_INVALID,
                       "autodiff: loss (node %d (%s), output %d) is %s, not floating",
                       (int)loss.node, hp_op_get(g->nodes[loss.node].op)->name, (int)loss.out,
                       hp_type_str(lt, tb, sizeof tb));

    /* On failure the graph is restored: appended nodes dropped (their arena bytes stay until
     * the graph is freed), outputs untouched (set last), no sticky error. */
    const int n0 = g->n_nodes;
    ad_state s = {.n_fwd = loss.node + 1};
    s.varies = hp_calloc((size_t)s.n_fwd * HP_MAX_OUTS, sizeof *s.varies);
    s.grad = hp_malloc((size_t)s.n_fwd * HP_MAX_OUTS * sizeof *s.grad);
    hp_status st;
    if (!s.varies || !s.grad) {
        st = hp_errf(err, HP_NOMEM, "autodiff: out of memory for %d nodes", s.n_fwd);
    } else {
        for (size_t i = 0; i < (size_t)s.n_fwd * HP_MAX_OUTS; i++) s.grad[i] = HP_NO_VALUE;
        st = run(g, &s, loss, err);
    }
    ad_free(&s);
    if (st != HP_OK) {
        g->n_nodes = n0;
        g->failed = false;
        memset(&g->err, 0, sizeof g->err);
    }
    return st;
}
