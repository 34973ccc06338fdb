/* passes/loss_parallel.c — loss parallel (torchtitan's loss_parallel): rewrites the cross
 * entropy of a joint graph, forward and backward, into ops every one of which has a
 * vocab-sharded form, so that with output.weight placed tp:Shard(0) (colwise: vocab-sharded
 * logits) the spmd pass never gathers the [N, V] logits: the row max and the sum of
 * exponentials become Partial(max) / Partial(sum) of N elements, all-reduced across tp.
 *
 *   _log_softmax(z, d)                 m = amax(z, d, keepdim); zs = z - m;
 *                                      zs - log(sum(exp(zs), d, keepdim))
 *   nll_loss_forward(logp, t)          onehot = (vocab_index == t[:, None]); w = t != ignore;
 *                                      picked = sum(logp * onehot, 1);
 *                                      none: -picked·w   sum: -Σ picked·w   mean: that / Σ w;
 *                                      total_weight = Σ w
 *   nll_loss_backward(g, logp, t, tw)  -onehot · (w·g [/ tw])[:, None]
 *   _log_softmax_backward_data(g, y)   g - exp(y) · sum(g, d, keepdim)
 *
 * The rank's vocab offset is the one thing a sharded cross entropy needs that the IR has no
 * op for: it comes from a non-trainable buffer, `hp.vocab_index` f32[V] with init arange,
 * which placed tp:Shard(0) holds exactly the rank's global vocab indices (the runtime fills
 * every buffer from the global flat indices it holds). f32 is exact for V < 2^24; targets are
 * compared in f32 too. Targets outside [0, V) that are not ignore_index contribute 0 here
 * where the reference evaluator refuses them.
 *
 * Under a bf16 policy (f32_logits) the logits are cast to f32 first, as torchtitan's
 * `pred.float()`: the mixed-precision pass, which runs after spmd, narrows everything computed
 * from the parameters but keeps that cast, so the max, the sum of exponentials, their
 * all-reduces and the gradient of the logits stay f32 (that gradient is narrowed where it meets
 * the output projection's bf16 weight).
 *
 * What it does not do: the vocab-parallel embedding (docs/placements.md says why), and any
 * placement: the pass is global (1 rank), and equals the original on the reference evaluator.
 */
#include "hp/build.h"
#include "passes/passes_internal.h"

#include <string.h>

/* Per target (old value) and ignore_index: the f32 one-hot [N, V] and the row weights [N]
 * (0 on ignored rows), shared by the forward and the backward. */
typedef struct onehot_entry {
    hp_value target, onehot, w;
    int64_t ignore;
} onehot_entry;

typedef struct lp {
    hp__rewrite rw;
    hp_value vocab_index; /* in the new graph */
    int64_t vocab;
    bool f32_logits;
    onehot_entry cache[8];
    int n_cache;
} lp;

static bool is_loss_op(hp_op op) {
    return op == HP_OP_LOG_SOFTMAX || op == HP_OP_LOG_SOFTMAX_BACKWARD ||
           op == HP_OP_NLL_LOSS_FORWARD || op == HP_OP_NLL_LOSS_BACKWARD;
}

/* The class count of the graph's nll ops (0: none); they must agree. */
static hp_status find_vocab(const hp_graph *in, int64_t *vocab, hp_err *err) {
    *vocab = 0;
    for (int i = 0; i < in->n_nodes; i++) {
        const hp_node *n = &in->nodes[i];
        if (n->op != HP_OP_NLL_LOSS_FORWARD && n->op != HP_OP_NLL_LOSS_BACKWARD) continue;
        const hp_type *logp = hp_graph_type(in, n->in[n->op == HP_OP_NLL_LOSS_FORWARD ? 0 : 1]);
        int64_t c = logp->shape[1];
        if (*vocab && c != *vocab)
            return hp_errf(err, HP_UNSUPPORTED,
                           "loss_parallel: node %d (%s) has %lld classes, an earlier one %lld: "
                           "one vocab_index serves one vocabulary",
                           i, hp_op_get(n->op)->name, (long long)c, (long long)*vocab);
        *vocab = c;
    }
    if (*vocab >= ((int64_t)1 << 24))
        return hp_errf(err, HP_UNSUPPORTED,
                       "loss_parallel: a vocabulary of %lld is not exact in f32 (at most 2^24)",
                       (long long)*vocab);
    return HP_OK;
}

static const int64_t ALL[1] = {0}; /* dims of a full reduction: none named */

static hp_value get(const lp *s, hp_value old) {
    return hp__rewrite_get(&s->rw, old);
}

/* The one-hot of target (old value) over the vocabulary and the row weights, built once. */
static void onehot_of(lp *s, hp_value target, int64_t ignore, hp_value *onehot, hp_value *w) {
    for (int k = 0; k < s->n_cache; k++)
        if (s->cache[k].target.node == target.node && s->cache[k].target.out == target.out &&
            s->cache[k].ignore == ignore) {
            *onehot = s->cache[k].onehot;
            *w = s->cache[k].w;
            return;
        }
    hp_graph *g = s->rw.out;
    hp_value t = hp_to(g, get(s, target), HP_F32); /* [N] */
    hp_value hit = hp_bin(g, HP_OP_EQ, hp_unsqueeze(g, t, 1), s->vocab_index);
    *onehot = hp_to(g, hit, HP_F32); /* [N, V] */
    int64_t one = 1;
    hp_value ignored = hp_bin(g, HP_OP_EQ, t, hp_full(g, 1, &one, (double)ignore, HP_F32));
    *w = hp_where(g, ignored, hp_zeros(g, 1, &one, HP_F32), hp_ones(g, 1, &one, HP_F32)); /* [N] */
    if (s->n_cache < (int)HP_ARRAY_LEN(s->cache))
        s->cache[s->n_cache++] = (onehot_entry){target, *onehot, *w, ignore};
}

/* Node id of the input graph in its vocab-shardable form; outputs mapped. */
static void rewrite(lp *s, int id) {
    const hp_node *n = &s->rw.in->nodes[id];
    hp_graph *g = s->rw.out;
    int64_t red = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(n, HP_ATTR_IGNORE_INDEX, -100);
    hp_value r0 = HP_NO_VALUE, r1 = HP_NO_VALUE;
    switch (n->op) {
    case HP_OP_LOG_SOFTMAX: {
        hp_value z = get(s, n->in[0]);
        if (s->f32_logits) z = hp_to(g, z, HP_F32); /* kept by mixed precision, which narrows z */
        int64_t d = hp_node_int(n, HP_ATTR_DIM, -1);
        hp_value zs = hp_sub(g, z, hp_amax(g, z, 1, &d, true));
        r0 = hp_sub(g, zs, hp_log(g, hp_sum(g, hp_exp(g, zs), 1, &d, true)));
        break;
    }
    case HP_OP_LOG_SOFTMAX_BACKWARD: {
        hp_value gy = get(s, n->in[0]), y = get(s, n->in[1]);
        int64_t d = hp_node_int(n, HP_ATTR_DIM, -1);
        r0 = hp_sub(g, gy, hp_mul(g, hp_exp(g, y), hp_sum(g, gy, 1, &d, true)));
        break;
    }
    case HP_OP_NLL_LOSS_FORWARD: {
        hp_value onehot, w;
        onehot_of(s, n->in[1], ignore, &onehot, &w);
        int64_t one = 1;
        hp_value picked = hp_sum(g, hp_mul(g, get(s, n->in[0]), onehot), 1, &one, false);
        hp_value lw = hp_neg(g, hp_mul(g, picked, w)); /* [N]: each row's loss, 0 if ignored */
        r1 = hp_sum(g, w, 0, ALL, false);              /* total_weight: the counted rows */
        r0 = red == HP_NLL_NONE ? lw : hp_sum(g, lw, 0, ALL, false);
        if (red == HP_NLL_MEAN) r0 = hp_div(g, r0, r1);
        break;
    }
    case HP_OP_NLL_LOSS_BACKWARD: {
        hp_value onehot, w;
        onehot_of(s, n->in[2], ignore, &onehot, &w);
        hp_value c = hp_neg(g, get(s, n->in[0])); /* [] or [N] (none) */
        if (red == HP_NLL_MEAN) c = hp_div(g, c, get(s, n->in[3]));
        r0 = hp_mul(g, onehot, hp_unsqueeze(g, hp_mul(g, w, c), 1));
        break;
    }
    default:
        HP_ASSERT(0 && "is_loss_op");
    }
    if (hp_graph_failed(g)) return;
    hp__rewrite_set(&s->rw, (hp_value){id, 0}, r0);
    if (n->n_out > 1) hp__rewrite_set(&s->rw, (hp_value){id, 1}, r1);
}

hp_status hp_pass_loss_parallel(const hp_graph *in, const hp_loss_parallel_opts *o, hp_graph **out,
                                hp_err *err) {
    *out = NULL;
    const char *fqn = o && o->vocab_index_fqn ? o->vocab_index_fqn : HP_VOCAB_INDEX_FQN;
    if (in->mesh.ndim)
        return hp_errf(err, HP_INVALID, "loss_parallel: the input graph is already placed");
    lp s = {.vocab_index = HP_NO_VALUE, .f32_logits = o && o->f32_logits};
    HP_TRY(find_vocab(in, &s.vocab, err));
    if (!s.vocab) { /* no cross entropy: nothing to do */
        *out = hp_graph_clone(in);
        return *out ? HP_OK : hp_errf(err, HP_NOMEM, "loss_parallel: out of memory");
    }
    if (hp_graph_find_fqn(in, fqn) >= 0)
        return hp_errf(err, HP_INVALID, "loss_parallel: the graph already has a placeholder '%s'",
                       fqn);
    HP_TRY(hp__rewrite_start(&s.rw, in, err));
    hp_status st = HP_OK;
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) {
        const hp_node *n = &in->nodes[i];
        bool ph = n->op == HP_OP_PLACEHOLDER;
        bool data = ph && hp_node_int(n, HP_ATTR_KIND, HP_INPUT_PARAM) == HP_INPUT_DATA;
        if (!hp_value_ok(s.vocab_index) && (!ph || data)) { /* after the params and buffers */
            hp_init arange = {.kind = HP_INIT_ARANGE};
            s.vocab_index = hp_build_placeholder(s.rw.out, HP_INPUT_BUFFER, fqn,
                                                 hp_type_make(HP_F32, 1, &s.vocab), &arange);
        }
        if (hp_graph_failed(s.rw.out)) break;
        if (is_loss_op(n->op))
            rewrite(&s, i);
        else if (hp__rewrite_copy(&s.rw, i, err) < 0)
            st = err ? err->status : HP_INTERNAL;
    }
    if (st == HP_OK && hp_graph_failed(s.rw.out)) st = hp_graph_status(s.rw.out, err);
    if (st != HP_OK) {
        hp_err_prefix(err, "loss_parallel");
        hp__rewrite_abort(&s.rw);
        return st;
    }
    HP_TRY(hp__rewrite_finish(&s.rw, out, err));
    if ((st = hp_graph_verify(*out, err)) != HP_OK) {
        hp_err_prefix(err, "loss_parallel: the rewritten graph does not verify");
        hp_graph_free(*out);
        *out = NULL;
    }
    return st;
}

hp_status hp_pass_loss_parallel_run(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                    hp_err *err) {
    hp_loss_parallel_opts o = {.f32_logits =
                                   ctx && ctx->job && ctx->job->plan.param_dtype != HP_F32};
    return hp_pass_loss_parallel(in, &o, out, err);
}
