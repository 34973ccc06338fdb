/* tests/passes/test_loss_parallel.c — loss parallel: the cross entropy rewritten into
 * vocab-shardable ops equals the original on the reference evaluator in f64 at one rank
 * (1e-12: loss and every gradient, each reduction, ignore_index inside and outside the
 * vocabulary); and placed by spmd with torchtitan's TP plan plus a vocab-sharded output
 * (colwise output.weight, vocab_index Shard(0)) on simulated ranks it equals the 1-rank graph
 * (1e-10) without ever gathering the [N, V] logits.
 */
#include "hp/build.h"
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "tests/util/eval_harness.h"
#include "tests/util/spmd_sim.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM   64
#define BATCH 2
#define SEQ   8
#define VOCAB HP_TH_SPMD_VOCAB

static hp_graph *tiny_llama(int layers, int kv_heads) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, &err), HP_OK, "%s", err.msg);
    spec.dim = DIM, spec.n_layers = layers, spec.n_heads = 4, spec.n_kv_heads = kv_heads;
    spec.ffn_hidden = 96, spec.vocab = VOCAB, spec.batch = BATCH, spec.seq = SEQ;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    return g;
}

static hp_graph *loss_parallel(const hp_graph *g) {
    hp_graph *lp = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_loss_parallel(g, NULL, &lp, &err), HP_OK, "%s", err.msg);
    for (int i = 0; i < lp->n_nodes; i++) {
        hp_op op = lp->nodes[i].op;
        cr_assert(op != HP_OP_LOG_SOFTMAX && op != HP_OP_LOG_SOFTMAX_BACKWARD &&
                      op != HP_OP_NLL_LOSS_FORWARD && op != HP_OP_NLL_LOSS_BACKWARD,
                  "node %d (%s) left in", i, hp_op_get(op)->name);
    }
    return lp;
}

/* Evaluates g (inputs in[]: params, buffers, data) and lp (the same, the vocab_index buffer
 * inserted after g's buffers, filled with arange) and expects every output to agree. */
static void expect_same(const hp_graph *g, const hp_graph *lp, hp_tensor *in) {
    hp_graph_inputs gi = hp_graph_count_inputs(g), li = hp_graph_count_inputs(lp);
    int n = gi.n_params + gi.n_buffers + gi.n_data, at = gi.n_params + gi.n_buffers;
    cr_assert_eq(li.n_buffers, gi.n_buffers + 1);
    cr_assert_eq(li.n_params, gi.n_params);
    int vi = hp_graph_find_fqn(lp, HP_VOCAB_INDEX_FQN);
    cr_assert_eq(vi, at, "vocab_index after the buffers, before the data");
    cr_assert_eq(hp_node_attr(&lp->nodes[vi], HP_ATTR_INIT)->init.kind, HP_INIT_ARANGE);
    hp_tensor *lin = calloc((size_t)n + 1, sizeof *lin);
    hp_err err = {0};
    for (int i = 0, j = 0; j < n + 1; j++) {
        if (j == at) {
            cr_assert_eq(hp_tensor_alloc(&lin[j], lp->nodes[j].out[0], &err), HP_OK);
            for (int64_t e = 0; e < hp_type_numel(&lp->nodes[j].out[0]); e++)
                lin[j].data[e] = (double)e;
        } else {
            lin[j] = in[i++];
        }
    }
    hp_tensor *want = calloc((size_t)g->n_outputs, sizeof *want);
    hp_tensor *got = calloc((size_t)lp->n_outputs, sizeof *got);
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, in, n, &o, want, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_eval(lp, lin, n + 1, &o, got, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(g->n_outputs, lp->n_outputs);
    for (int k = 0; k < g->n_outputs; k++) {
        char what[64];
        snprintf(what, sizeof what, "output %d", k);
        cr_assert(hp_type_eq(&want[k].type, &got[k].type), "%s: type", what);
        hp_th_expect_close(got[k].data, want[k].data, hp_type_numel(&want[k].type), 1e-12, what);
        hp_tensor_free(&want[k]);
        hp_tensor_free(&got[k]);
    }
    hp_tensor_free(&lin[at]);
    free(lin);
    free(want);
    free(got);
}

/* Random inputs for g: floats in [-0.5, 0.5) (rank-1 ones near 1: norm weights), indices in
 * [0, VOCAB) with every 5th set to `ignore`. */
static hp_tensor *inputs(const hp_graph *g, int64_t ignore) {
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n = gi.n_params + gi.n_buffers + gi.n_data;
    hp_tensor *in = calloc((size_t)n, sizeof *in);
    for (int i = 0; i < n; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, NULL), HP_OK);
        bool idx = !hp_dtype_is_float(t->dtype);
        hp_th_rand(in[i].data, hp_type_numel(t), 7 + (uint64_t)i, idx ? 0 : -0.5,
                   idx ? VOCAB : 0.5);
        for (int64_t e = 0; e < hp_type_numel(t); e++) {
            if (idx) in[i].data[e] = e % 5 == 3 ? (double)ignore : floor(in[i].data[e]);
            if (!idx && t->rank == 1) in[i].data[e] += 1;
        }
    }
    return in;
}

static void free_inputs(const hp_graph *g, hp_tensor *in) {
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int i = 0; i < gi.n_params + gi.n_buffers + gi.n_data; i++) hp_tensor_free(&in[i]);
    free(in);
}

/* The tiny Llama's joint graph (mean over the non-ignored tokens): tokens are never -100 in
 * range, and labels are -100 on every 5th row. */
Test(loss_parallel, llama_equals_original_at_one_rank) {
    hp_graph *g = tiny_llama(2, 2);
    hp_graph *lp = loss_parallel(g);
    hp_tensor *in = inputs(g, -100);
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int tokens = gi.n_params + gi.n_buffers; /* keep the tokens in range */
    for (int64_t e = 0; e < hp_type_numel(&in[tokens].type); e++)
        if (in[tokens].data[e] < 0) in[tokens].data[e] = 1;
    expect_same(g, lp, in);
    free_inputs(g, in);
    hp_graph_free(lp);
    hp_graph_free(g);
}

/* logits z [N, V] as a parameter, the loss nll(log_softmax(z), t) under `reduction` (none:
 * summed after), ignore_index `ignore`. */
static hp_graph *ce_graph(int64_t reduction, int64_t ignore) {
    hp_graph *g = hp_graph_new();
    int64_t zs[2] = {12, 16}, ts = 12;
    hp_init init = {.kind = HP_INIT_NORMAL, .std = 1};
    hp_value z = hp_build_placeholder(g, HP_INPUT_PARAM, "z", hp_type_make(HP_F32, 2, zs), &init);
    hp_value t = hp_build_placeholder(g, HP_INPUT_DATA, "t", hp_type_make(HP_I64, 1, &ts), NULL);
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, z, hp_attr_int(HP_ATTR_DIM, 1));
    hp_attr a[2] = {hp_attr_int(HP_ATTR_REDUCTION, reduction),
                    hp_attr_int(HP_ATTR_IGNORE_INDEX, ignore)};
    hp_value loss = hp_build(g, HP_OP_NLL_LOSS_FORWARD, (hp_value[]){logp, t}, 2, a, 2);
    if (reduction == HP_NLL_NONE) loss = hp_sum(g, loss, 0, (int64_t[]){0}, false);
    hp_err err = {0};
    cr_assert_eq(hp_graph_status(g, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    return g;
}

/* Every reduction, with ignore_index outside the vocabulary (-100) and inside it (3: rows
 * whose target is 3 count for nothing): loss, total_weight's effect and the gradient exact. */
Test(loss_parallel, every_reduction_and_ignore_index) {
    const int64_t reds[] = {HP_NLL_NONE, HP_NLL_MEAN, HP_NLL_SUM}, ignores[] = {-100, 3};
    for (size_t r = 0; r < HP_ARRAY_LEN(reds); r++)
        for (size_t k = 0; k < HP_ARRAY_LEN(ignores); k++) {
            hp_graph *g = ce_graph(reds[r], ignores[k]);
            hp_graph *lp = loss_parallel(g);
            hp_tensor *in = inputs(g, ignores[k]);
            for (int64_t e = 0; e < 12; e++) /* targets in [0, 16) */
                if (in[1].data[e] >= 0) in[1].data[e] = (double)((int64_t)in[1].data[e] % 16);
            expect_same(g, lp, in);
            free_inputs(g, in);
            hp_graph_free(lp);
            hp_graph_free(g);
        }
}

/* Run again, the pass finds no cross entropy left and changes nothing; a placed graph is
 * refused. */
Test(loss_parallel, idempotent_and_global_only) {
    hp_graph *g = ce_graph(HP_NLL_MEAN, -100), *lp = loss_parallel(g), *again = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_loss_parallel(lp, NULL, &again, &err), HP_OK, "%s", err.msg);
    cr_expect(hp_graph_eq(lp, again));
    hp_graph_free(again);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {2}};
    hp_placement pl[3] = {HP_REPLICATE, HP_SHARD(0), HP_REPLICATE};
    hp_graph *spmd = NULL;
    cr_assert_eq(hp_pass_spmd(lp, &mesh, pl, NULL, &spmd, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_pass_loss_parallel(spmd, NULL, &again, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "already placed"), "%s", err.msg);
    hp_graph_free(spmd);
    hp_graph_free(lp);
    hp_graph_free(g);
}

/* ---- on simulated ranks --------------------------------------------------------------------- */

/* torchtitan's Llama TP plan with loss parallel: colwise wq/wk/wv/w1/w3 and output (Shard(0) of
 * [out, in]: the logits vocab-sharded), rowwise wo/w2 (Shard(1)), vocab_index Shard(0);
 * everything else replicated. */
static hp_placement tp_plan(const char *fqn) {
    static const char *const col[] = {".wq.", ".wk.", ".wv.", ".w1.", ".w3."};
    static const char *const row[] = {".wo.", ".w2."};
    if (!strcmp(fqn, "output.weight") || !strcmp(fqn, HP_VOCAB_INDEX_FQN)) return HP_SHARD(0);
    for (size_t i = 0; i < HP_ARRAY_LEN(col); i++)
        if (strstr(fqn, col[i])) return HP_SHARD(0);
    for (size_t i = 0; i < HP_ARRAY_LEN(row); i++)
        if (strstr(fqn, row[i])) return HP_SHARD(1);
    return HP_REPLICATE;
}

static hp_placement *plan_for(const hp_graph *g, const hp_graph_mesh *mesh, int tp, int dp) {
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_placement *pl = calloc((size_t)(n_ph * nd), sizeof *pl);
    for (int i = 0; i < gi.n_params + gi.n_buffers; i++)
        pl[i * nd + tp] = tp_plan(hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s);
    for (int i = gi.n_params + gi.n_buffers; dp >= 0 && i < n_ph; i++)
        pl[i * nd + dp] = HP_SHARD(0);
    return pl;
}

static int count_op(const hp_graph *g, hp_op op, int64_t numel, hp_reduce_op rop) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        k += n->op == op && hp_type_numel(&n->out[0]) == numel &&
             (op != HP_OP_ALL_REDUCE || hp_node_int(n, HP_ATTR_REDUCE_OP, -1) == rop);
    }
    return k;
}

/* The loss-parallel Llama at tp=n equals one rank; the collectives are Megatron's 4 per block
 * plus loss parallel's: the row max and the sum of exponentials (N each) forward, the loss
 * (a scalar), the row sums of the logits' gradient (N) and the gradient of the last norm's
 * output (N·D, the output projection being colwise) backward; no gather of the logits. */
static void check_tp(int layers, int kv_heads, int n) {
    hp_graph *g = tiny_llama(layers, kv_heads);
    hp_graph *lp = loss_parallel(g);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {n}};
    hp_placement *pl = plan_for(lp, &mesh, 0, -1);
    hp_graph *spmd = hp_th_spmd_check(lp, &mesh, pl);
    const int64_t N = BATCH * SEQ;
    int gathers = 0, collectives = 0;
    for (int i = 0; i < spmd->n_nodes; i++) {
        gathers += spmd->nodes[i].op == HP_OP_ALL_GATHER;
        collectives += (hp_op_get(spmd->nodes[i].op)->flags & HP_OPF_COLLECTIVE) != 0;
    }
    cr_expect_eq(gathers, 0, "nothing gathered (the logits above all)");
    cr_expect_eq(count_op(spmd, HP_OP_ALL_REDUCE, N, HP_REDUCE_MAX), 1, "the row max");
    cr_expect_eq(count_op(spmd, HP_OP_ALL_REDUCE, N, HP_REDUCE_SUM), 2, "sum exp, grad row sums");
    cr_expect_eq(count_op(spmd, HP_OP_ALL_REDUCE, 1, HP_REDUCE_SUM), 1, "the loss");
    cr_expect_eq(hp_th_spmd_count_all_reduces(spmd, N * DIM, "tp"), 4 * layers + 1);
    cr_expect_eq(collectives, 4 * layers + 5, "collectives in all: %d", collectives);
    int out_w = hp_graph_find_fqn(spmd, "output.weight");
    cr_expect_eq(spmd->nodes[out_w].out[0].shape[0], VOCAB / n, "output.weight vocab-sharded");
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(lp);
    hp_graph_free(g);
}

Test(loss_parallel, tp2_equals_one_rank, .timeout = 120) {
    check_tp(2, 2, 2);
}

Test(loss_parallel, tp4_equals_one_rank, .timeout = 120) {
    check_tp(1, 4, 4);
}

/* dp=2 x tp=2: the batch split over dp, the vocabulary over tp. */
Test(loss_parallel, dp2_tp2_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(1, 2);
    hp_graph *lp = loss_parallel(g);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_placement *pl = plan_for(lp, &mesh, 1, 0);
    hp_graph *spmd = hp_th_spmd_check(lp, &mesh, pl);
    for (int i = 0; i < spmd->n_nodes; i++) {
        const hp_node *n = &spmd->nodes[i];
        const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
        cr_expect(n->op != HP_OP_ALL_GATHER || strcmp(grp->s, "tp"), "node %d: a tp gather", i);
    }
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(lp);
    hp_graph_free(g);
}
