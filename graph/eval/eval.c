/* graph/eval/eval.c — the reference evaluator's driver: tensor storage, rounding to a dtype,
 * the kernel table (one entry per op of graph/ops.def) and hp_eval itself, which verifies the
 * graph, checks the feeds, runs the nodes in order and frees each intermediate after its last
 * use. The kernels live beside it, one file per family; none of them rounds or allocates its
 * outputs: this file does both, so that every op gets the same treatment.
 */
#include "graph/eval/eval_internal.h"

#include <math.h>
#include <string.h>

/* ---- tensors -------------------------------------------------------------------------------- */

hp_status hp_tensor_alloc(hp_tensor *t, hp_type type, hp_err *err) {
    t->type = type;
    t->data = NULL;
    int64_t numel = hp_type_numel(&type);
    if (numel < 0 || numel > HP_EVAL_MAX_NUMEL) {
        char buf[128];
        return hp_errf(err, HP_LIMIT, "tensor %s has %lld elements, more than the evaluator's %lld",
                       hp_type_str(&type, buf, sizeof buf), (long long)numel,
                       (long long)HP_EVAL_MAX_NUMEL);
    }
    t->data = hp_calloc((size_t)(numel > 0 ? numel : 1), sizeof(double));
    if (!t->data) {
        char buf[128];
        return hp_errf(err, HP_NOMEM, "out of memory allocating %s (%lld bytes)",
                       hp_type_str(&type, buf, sizeof buf),
                       (long long)numel * (long long)sizeof(double));
    }
    return HP_OK;
}

void hp_tensor_free(hp_tensor *t) {
    if (!t) return;
    hp_free(t->data);
    t->data = NULL;
}

/* ---- rounding ------------------------------------------------------------------------------- */

/* Rounds x to a binary floating format with p significand bits (the implicit one included),
 * minimum normal exponent emin and maximum exponent emax, to nearest with ties to even.
 * Below 2^emin the quantum stays 2^(emin-p+1), which gives the subnormals; a result above the
 * largest finite value overflows to infinity, as IEEE 754 rounding does. */
static double round_binary(double x, int p, int emin, int emax) {
    if (x == 0 || !isfinite(x)) return x;
    double a = fabs(x);
    int e;
    (void)frexp(a, &e); /* a = f · 2^e, f in [0.5, 1): the unbiased exponent is e - 1 */
    int exp = e - 1 < emin ? emin : e - 1;
    int shift = exp - (p - 1);
    double r = ldexp(nearbyint(ldexp(a, -shift)), shift);
    double max_finite = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
    if (r > max_finite) r = INFINITY;
    return copysign(r, x);
}

double hp_eval_round(hp_dtype dt, double x) {
    switch (dt) {
    case HP_F32:
        return (double)(float)x;
    case HP_BF16:
        return round_binary(x, 8, -126, 127);
    case HP_F16:
        return round_binary(x, 11, -14, 15);
    case HP_I32:
    case HP_I64:
        return trunc(x);
    case HP_BOOL:
        return x != 0 ? 1.0 : 0.0;
    case HP_DTYPE_COUNT:
        break;
    }
    return x;
}

/* ---- the kernel table ----------------------------------------------------------------------- */

/* placeholder: the feed, copied (the driver then rounds it like any other output). */
static HP__EVAL_KERNEL(eval_placeholder) {
    const hp_tensor *feed = &cx->inputs[cx->node];
    memcpy(out[0].data, feed->data, (size_t)hp__eval_numel(&out[0]) * sizeof(double));
    return HP_OK;
}

static const hp__eval_kernel kernels[HP_OP_COUNT] = {
    [HP_OP_PLACEHOLDER] = eval_placeholder,
    [HP_OP_FULL] = hp__eval_creation,
    [HP_OP_ZEROS] = hp__eval_creation,
    [HP_OP_ONES] = hp__eval_creation,
    [HP_OP_ADD] = hp__eval_binary,
    [HP_OP_SUB] = hp__eval_binary,
    [HP_OP_MUL] = hp__eval_binary,
    [HP_OP_DIV] = hp__eval_binary,
    [HP_OP_MAXIMUM] = hp__eval_binary,
    [HP_OP_EQ] = hp__eval_binary,
    [HP_OP_LT] = hp__eval_binary,
    [HP_OP_WHERE] = hp__eval_where,
    [HP_OP_ADD_SCALAR] = hp__eval_unary,
    [HP_OP_MUL_SCALAR] = hp__eval_unary,
    [HP_OP_POW] = hp__eval_unary,
    [HP_OP_NEG] = hp__eval_unary,
    [HP_OP_EXP] = hp__eval_unary,
    [HP_OP_LOG] = hp__eval_unary,
    [HP_OP_SQRT] = hp__eval_unary,
    [HP_OP_RSQRT] = hp__eval_unary,
    [HP_OP_TANH] = hp__eval_unary,
    [HP_OP_SIN] = hp__eval_unary,
    [HP_OP_COS] = hp__eval_unary,
    [HP_OP_ERF] = hp__eval_unary,
    [HP_OP_SIGMOID] = hp__eval_unary,
    [HP_OP_SILU] = hp__eval_unary,
    [HP_OP_GELU] = hp__eval_unary,
    [HP_OP_RELU] = hp__eval_unary,
    [HP_OP_TO_COPY] = hp__eval_copy, /* the driver's rounding is the cast */
    [HP_OP_TANH_BACKWARD] = hp__eval_backward_pair,
    [HP_OP_SIGMOID_BACKWARD] = hp__eval_backward_pair,
    [HP_OP_SILU_BACKWARD] = hp__eval_backward_pair,
    [HP_OP_GELU_BACKWARD] = hp__eval_backward_pair,
    [HP_OP_THRESHOLD_BACKWARD] = hp__eval_backward_pair,
    [HP_OP_SUM] = hp__eval_reduce,
    [HP_OP_MEAN] = hp__eval_reduce,
    [HP_OP_AMAX] = hp__eval_reduce,
    [HP_OP_VIEW] = hp__eval_copy,
    [HP_OP_RESHAPE] = hp__eval_copy,
    [HP_OP_PERMUTE] = hp__eval_permute,
    [HP_OP_TRANSPOSE] = hp__eval_permute,
    [HP_OP_T] = hp__eval_permute,
    [HP_OP_EXPAND] = hp__eval_expand,
    [HP_OP_SLICE] = hp__eval_slice,
    [HP_OP_SLICE_BACKWARD] = hp__eval_slice_backward,
    [HP_OP_CAT] = hp__eval_cat,
    [HP_OP_UNSQUEEZE] = hp__eval_copy,
    [HP_OP_SQUEEZE] = hp__eval_copy,
    [HP_OP_CLONE] = hp__eval_copy,
    [HP_OP_DETACH] = hp__eval_copy,
    [HP_OP_MM] = hp__eval_mm,
    [HP_OP_BMM] = hp__eval_bmm,
    [HP_OP_ADDMM] = hp__eval_addmm,
    [HP_OP_EMBEDDING] = hp__eval_embedding,
    [HP_OP_EMBEDDING_DENSE_BACKWARD] = hp__eval_embedding_backward,
    [HP_OP_LOG_SOFTMAX] = hp__eval_softmax,
    [HP_OP_LOG_SOFTMAX_BACKWARD] = hp__eval_softmax_backward,
    [HP_OP_SOFTMAX] = hp__eval_softmax,
    [HP_OP_SOFTMAX_BACKWARD] = hp__eval_softmax_backward,
    [HP_OP_NLL_LOSS_FORWARD] = hp__eval_nll_loss,
    [HP_OP_NLL_LOSS_BACKWARD] = hp__eval_nll_loss_backward,
    [HP_OP_FUSED_CROSS_ENTROPY] = hp__eval_fused_cross_entropy,
    [HP_OP_FUSED_CROSS_ENTROPY_BACKWARD] = hp__eval_fused_cross_entropy_backward,
    [HP_OP_SWIGLU] = hp__eval_swiglu,
    [HP_OP_SWIGLU_BACKWARD] = hp__eval_swiglu_backward,
    [HP_OP_RMS_NORM] = hp__eval_rms_norm,
    [HP_OP_RMS_NORM_BACKWARD] = hp__eval_rms_norm_backward,
    [HP_OP_LAYER_NORM] = hp__eval_layer_norm,
    [HP_OP_LAYER_NORM_BACKWARD] = hp__eval_layer_norm_backward,
    [HP_OP_TRIL] = hp__eval_tril,
    [HP_OP_NATIVE_DROPOUT] = hp__eval_dropout,
    [HP_OP_NATIVE_DROPOUT_BACKWARD] = hp__eval_dropout_backward,
    [HP_OP_BITWISE_NOT] = hp__eval_bitwise_not,
    [HP_OP_ARANGE] = hp__eval_arange,
    [HP_OP_ROTARY_EMB] = hp__eval_rotary,
    [HP_OP_SDPA] = hp__eval_sdpa,
    [HP_OP_SDPA_BACKWARD] = hp__eval_sdpa_backward,
    [HP_OP_ALL_GATHER] = hp__eval_collective,
    [HP_OP_REDUCE_SCATTER] = hp__eval_collective,
    [HP_OP_ALL_REDUCE] = hp__eval_collective,
    [HP_OP_ALL_TO_ALL] = hp__eval_collective,
    [HP_OP_LOCAL_CHUNK] = hp__eval_collective,
    [HP_OP_CHUNKED_EMBEDDING] = hp__eval_chunked_embedding,
    [HP_OP_CHUNKED_EMBEDDING_BACKWARD] = hp__eval_chunked_embedding_backward,
    [HP_OP_WAIT_TENSOR] = hp__eval_wait,
};

hp__eval_kernel hp__eval_kernel_for(hp_op op) {
    if ((int)op < 0 || op >= HP_OP_COUNT) return NULL;
    return kernels[op];
}

/* ---- the driver ----------------------------------------------------------------------------- */

/* Per-run bookkeeping, all indexed by value slot: node j's output k is slot first[j] + k. */
typedef struct run {
    int *first;             /* [n_nodes + 1] */
    int *last_use;          /* [slots]: last consuming node, -1 if none */
    int *out_dest;          /* [slots]: first graph output taking the slot, -1 if none */
    hp_tensor *vals;        /* [slots] */
    const hp_tensor **args; /* [max n_in], the current node's inputs */
} run;

static void run_fini(run *r, int slots) {
    if (r->vals)
        for (int i = 0; i < slots; i++) hp_tensor_free(&r->vals[i]);
    hp_free(r->first);
    hp_free(r->last_use);
    hp_free(r->out_dest);
    hp_free(r->vals);
    hp_free(r->args);
}

static int slot_of(const run *r, hp_value v) {
    return r->first[v.node] + v.out;
}

static hp_status nomem(hp_err *err, const char *what) {
    return hp_errf(err, HP_NOMEM, "eval: out of memory allocating %s", what);
}

/* Numbers the value slots and records each one's last use and whether a graph output takes
 * it (such slots are never freed early). */
static hp_status run_plan(run *r, const hp_graph *g, int *slots_out, hp_err *err) {
    r->first = hp_calloc((size_t)g->n_nodes + 1, sizeof(int));
    if (!r->first) return nomem(err, "the value table");
    int max_in = 1;
    for (int j = 0; j < g->n_nodes; j++) {
        r->first[j + 1] = r->first[j] + g->nodes[j].n_out;
        if (g->nodes[j].n_in > max_in) max_in = g->nodes[j].n_in;
    }
    int slots = r->first[g->n_nodes];
    *slots_out = slots;
    r->last_use = hp_calloc((size_t)slots, sizeof(int));
    r->out_dest = hp_calloc((size_t)slots, sizeof(int));
    r->vals = hp_calloc((size_t)slots, sizeof(hp_tensor));
    r->args = hp_calloc((size_t)max_in, sizeof(*r->args));
    if (!r->last_use || !r->out_dest || !r->vals || !r->args) return nomem(err, "the value table");
    for (int i = 0; i < slots; i++) r->last_use[i] = r->out_dest[i] = -1;
    for (int j = 0; j < g->n_nodes; j++) {
        const hp_node *n = &g->nodes[j];
        for (int i = 0; i < n->n_in; i++) r->last_use[slot_of(r, n->in[i])] = j;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int s = slot_of(r, g->outputs[i]);
        if (r->out_dest[s] < 0) r->out_dest[s] = i;
    }
    return HP_OK;
}

static hp_status check_feeds(const hp_graph *g, const hp_tensor *inputs, int n_inputs,
                             hp_err *err) {
    int n_ph = 0;
    while (n_ph < g->n_nodes && g->nodes[n_ph].op == HP_OP_PLACEHOLDER) n_ph++;
    if (n_inputs != n_ph)
        return hp_errf(err, HP_INVALID,
                       "eval: the graph has %d placeholders but %d inputs were given", n_ph,
                       n_inputs);
    if (n_inputs > 0 && !inputs) return hp_errf(err, HP_INVALID, "eval: inputs is NULL");
    for (int i = 0; i < n_inputs; i++) {
        const hp_node *n = &g->nodes[i];
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        char want[128], got[128];
        if (!hp_type_eq(&inputs[i].type, &n->out[0]))
            return hp_errf(err, HP_INVALID,
                           "eval: input %d (%s) has type %s, the placeholder is %s", i,
                           fqn ? fqn->s : "data", hp_type_str(&inputs[i].type, got, sizeof got),
                           hp_type_str(&n->out[0], want, sizeof want));
        if (!inputs[i].data && hp_type_numel(&n->out[0]) > 0)
            return hp_errf(err, HP_INVALID, "eval: input %d (%s) has no data", i,
                           fqn ? fqn->s : "data");
    }
    return HP_OK;
}

/* Rounds every output of a node as the precision says: floats to their dtype in F32 (never in
 * F64), integers and bools always. */
static void round_outputs(const hp_node *n, hp_tensor *out, hp_eval_precision prec) {
    for (int k = 0; k < n->n_out; k++) {
        hp_dtype dt = out[k].type.dtype;
        if (hp_dtype_is_float(dt) && prec == HP_EVAL_F64) continue;
        int64_t numel = hp__eval_numel(&out[k]);
        for (int64_t i = 0; i < numel; i++) out[k].data[i] = hp_eval_round(dt, out[k].data[i]);
    }
}

static hp_status run_node(run *r, const hp__eval_ctx *cx, hp_err *err) {
    const hp_node *n = &cx->g->nodes[cx->node];
    hp__eval_kernel k = hp__eval_kernel_for(n->op);
    if (!k) return hp_errf(err, HP_UNSUPPORTED, "no evaluator kernel for this op");
    hp_tensor *out = &r->vals[r->first[cx->node]];
    for (int o = 0; o < n->n_out; o++) HP_TRY(hp_tensor_alloc(&out[o], n->out[o], err));
    for (int i = 0; i < n->n_in; i++) r->args[i] = &r->vals[slot_of(r, n->in[i])];
    HP_TRY(k(cx, n, r->args, out, err));
    round_outputs(n, out, cx->opts->precision);
    return HP_OK;
}

/* Frees what node j was the last user of, and its own outputs nobody uses. */
static void run_release(run *r, const hp_graph *g, int j) {
    const hp_node *n = &g->nodes[j];
    for (int i = 0; i < n->n_in; i++) {
        int s = slot_of(r, n->in[i]);
        if (r->last_use[s] == j && r->out_dest[s] < 0) hp_tensor_free(&r->vals[s]);
    }
    for (int o = 0; o < n->n_out; o++) {
        int s = r->first[j] + o;
        if (r->last_use[s] < 0 && r->out_dest[s] < 0) hp_tensor_free(&r->vals[s]);
    }
}

/* Moves each output slot into outputs[] (the first time it appears) or copies it (a repeat). */
static hp_status run_collect(run *r, const hp_graph *g, hp_tensor *outputs, hp_err *err) {
    for (int i = 0; i < g->n_outputs; i++) {
        int s = slot_of(r, g->outputs[i]);
        if (r->out_dest[s] == i) {
            outputs[i] = r->vals[s];
            r->vals[s].data = NULL;
            continue;
        }
        const hp_tensor *src = &outputs[r->out_dest[s]];
        HP_ASSERT(src->data); /* moved there by an earlier iteration */
        HP_TRY(hp_tensor_alloc(&outputs[i], src->type, err));
        memcpy(outputs[i].data, src->data, (size_t)hp__eval_numel(src) * sizeof(double));
    }
    return HP_OK;
}

hp_status hp_eval(const hp_graph *g, const hp_tensor *inputs, int n_inputs,
                  const hp_eval_opts *opts, hp_tensor *outputs, hp_err *err) {
    static const hp_eval_opts default_opts = {.precision = HP_EVAL_F32};
    if (!g) return hp_errf(err, HP_INVALID, "eval: graph is NULL");
    if (g->n_outputs > 0 && !outputs) return hp_errf(err, HP_INVALID, "eval: outputs is NULL");
    for (int i = 0; i < g->n_outputs; i++) outputs[i] = (hp_tensor){0};
    if (!opts) opts = &default_opts;
    if (opts->precision != HP_EVAL_F32 && opts->precision != HP_EVAL_F64)
        return hp_errf(err, HP_INVALID, "eval: unknown precision %d", (int)opts->precision);
    HP_TRY(hp_graph_verify(g, err));
    HP_TRY(check_feeds(g, inputs, n_inputs, err));

    run r = {0};
    int slots = 0;
    hp_status st = run_plan(&r, g, &slots, err);
    if (st != HP_OK) goto done;
    hp__eval_ctx cx = {g, opts, inputs, 0};
    for (int j = 0; j < g->n_nodes; j++) {
        cx.node = j;
        st = run_node(&r, &cx, err);
        if (st != HP_OK) {
            hp_err_prefix(err, "node %d (%s)", j, hp_op_get(g->nodes[j].op)->name);
            goto done;
        }
        run_release(&r, g, j);
    }
    st = run_collect(&r, g, outputs, err);
done:
    run_fini(&r, slots);
    if (st != HP_OK)
        for (int i = 0; i < g->n_outputs; i++) {
            hp_tensor_free(&outputs[i]);
            outputs[i] = (hp_tensor){0};
        }
    return st;
}
