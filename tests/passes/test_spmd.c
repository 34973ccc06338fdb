/* tests/passes/test_spmd.c — the placement propagation and redistribution pass: Megatron
 * tensor parallelism on a tiny Llama-3 with grouped-query attention, run as N simulated ranks
 * (one thread each, collectives exchanged through a barrier) on the reference evaluator in
 * f64, must compute the loss and every gradient the 1-rank joint graph computes; and it must
 * put exactly Megatron's all-reduces in: two of B·T·d per block in the forward, two in the
 * backward, nothing else.
 */
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "tests/util/spmd_sim.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define DIM   64
#define BATCH 2
#define SEQ   8
#define VOCAB HP_TH_SPMD_VOCAB

static hp_graph *tiny_llama_kv(int layers, int kv_heads) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, &err), HP_OK, "%s", err.msg);
    spec.dim = DIM, spec.n_layers = layers, spec.n_heads = 4, spec.n_kv_heads = kv_heads;
    spec.ffn_hidden = 96, spec.vocab = VOCAB, spec.batch = BATCH, spec.seq = SEQ;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    return g;
}

static hp_graph *tiny_llama(int layers) {
    return tiny_llama_kv(layers, 2); /* grouped-query: 4 heads, 2 kv heads */
}

/* torchtitan's Llama TP plan without sequence parallel: colwise wq/wk/wv/w1/w3 (Shard(0) of
 * [out, in]), rowwise wo/w2 (Shard(1)); everything else replicated. */
static hp_placement tp_plan(const char *fqn) {
    static const char *const col[] = {".wq.", ".wk.", ".wv.", ".w1.", ".w3."};
    static const char *const row[] = {".wo.", ".w2."};
    for (size_t i = 0; i < HP_ARRAY_LEN(col); i++)
        if (strstr(fqn, col[i])) return HP_SHARD(0);
    for (size_t i = 0; i < HP_ARRAY_LEN(row); i++)
        if (strstr(fqn, row[i])) return HP_SHARD(1);
    return HP_REPLICATE;
}

/* torchtitan's TP plan on mesh dim `tp`, the batch split over `dp` (-1: none). */
static hp_placement *plan_for(const hp_graph *g, const hp_graph_mesh *mesh, int tp, int dp) {
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_placement *pl = calloc((size_t)(n_ph * nd), sizeof *pl);
    for (int i = 0; i < gi.n_params; i++)
        pl[i * nd + tp] = tp_plan(hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s);
    for (int i = gi.n_params + gi.n_buffers; dp >= 0 && i < n_ph; i++)
        pl[i * nd + dp] = HP_SHARD(0);
    return pl;
}

static void check_tp(int layers, int kv_heads, int n) {
    hp_graph *g = tiny_llama_kv(layers, kv_heads);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {n}};
    hp_placement *pl = plan_for(g, &mesh, 0, -1);
    hp_graph *spmd = hp_th_spmd_check(g, &mesh, pl);
    /* Megatron: 2 all-reduces of B·T·d per block forward, 2 backward; and no other collective */
    int collectives = 0;
    for (int i = 0; i < spmd->n_nodes; i++)
        collectives += (hp_op_get(spmd->nodes[i].op)->flags & HP_OPF_COLLECTIVE) != 0;
    cr_expect_eq(hp_th_spmd_count_all_reduces(spmd, BATCH * SEQ * DIM, "tp"), 4 * layers);
    cr_expect_eq(collectives, 4 * layers, "collectives in all: %d", collectives);
    /* every TP'd weight holds 1/n of its rows or columns */
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int i = 0; i < gi.n_params; i++) {
        const hp_type *gt = &g->nodes[i].out[0], *lt = &spmd->nodes[i].out[0];
        cr_expect_eq(hp_type_numel(lt) * (pl[i].kind == HP_PLACE_SHARD ? n : 1), hp_type_numel(gt),
                     "%s", hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s);
    }
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

Test(spmd, megatron_tp2_equals_one_rank, .timeout = 120) {
    check_tp(2, 2, 2);
}

Test(spmd, megatron_tp2_one_layer, .timeout = 120) {
    check_tp(1, 2, 2);
}

Test(spmd, megatron_tp4_one_head_per_rank, .timeout = 120) {
    check_tp(1, 4, 4);
}

/* dp=2 x tp=2: the batch split over dp (each dp rank's loss a mean of its half, gradients
 * summed over dp), the TP plan over tp; every rank's loss and gradient pieces equal the
 * 1-rank graph's over the whole batch, and the tp all-reduces are Megatron's at the local
 * batch. */
Test(spmd, dp2_tp2_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(2);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_placement *pl = plan_for(g, &mesh, 1, 0);
    hp_graph *spmd = hp_th_spmd_check(g, &mesh, pl);
    cr_expect_eq(hp_th_spmd_count_all_reduces(spmd, BATCH / 2 * SEQ * DIM, "tp"), 4 * 2);
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

/* tp=4 with 2 kv heads: attention cannot split its heads 4 ways and runs replicated, so wk's
 * gradient comes out whole while wk is stored split: it is brought to its shard by an
 * averaging reduce-scatter. Still the 1-rank step. */
Test(spmd, tp4_with_fewer_kv_heads_than_ranks, .timeout = 120) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {4}};
    hp_placement *pl = plan_for(g, &mesh, 0, -1);
    hp_graph *spmd = hp_th_spmd_check(g, &mesh, pl);
    int scatters = 0;
    for (int i = 0; i < spmd->n_nodes; i++) scatters += spmd->nodes[i].op == HP_OP_REDUCE_SCATTER;
    cr_expect_gt(scatters, 0, "wk/wv gradients scattered to their shards");
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

/* A mesh dim of one rank splits nothing: placements asked there become Replicate, and no
 * collective of one rank is inserted. */
Test(spmd, a_size_one_dim_places_nothing) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 1}};
    hp_placement *pl = plan_for(g, &mesh, 1, 0); /* the TP plan on a tp of 1 */
    hp_graph *spmd = hp_th_spmd_check(g, &mesh, pl);
    for (int i = 0; i < spmd->n_nodes; i++) {
        const hp_attr *grp = hp_node_attr(&spmd->nodes[i], HP_ATTR_GROUP);
        cr_expect(!grp || strcmp(grp->s, "tp"), "node %d: a collective on tp (1 rank)", i);
        const hp_placement *p = hp_value_placements(spmd, (hp_value){i, 0});
        cr_expect(p && p[1].kind == HP_PLACE_REPLICATE, "node %d placed on tp", i);
    }
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

/* An uneven split is refused naming the parameter, never padded into compute. */
Test(spmd, uneven_split_is_refused) {
    hp_graph *g = tiny_llama(1);
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_placement *pl = calloc((size_t)n_ph, sizeof *pl);
    for (int i = 0; i < gi.n_params; i++)
        pl[i] = tp_plan(hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {3}};
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd(g, &mesh, pl, NULL, &out, &err), HP_UNSUPPORTED);
    cr_assert_null(out);
    cr_expect(strstr(err.msg, "spmd: 'layers.0.attention.wq.weight': mesh dim 0: dim 0 of size 64 "
                              "does not split evenly over 3 ranks"),
              "%s", err.msg);
    free(pl);
    hp_graph_free(g);
}
