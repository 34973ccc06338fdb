/* tests/passes/test_spmd.c — the placement propagation and redistribution pass: Megatron
 * tensor parallelism on a tiny Llama-3 with grouped-query attention, run as N simulated ranks
 * (one thread each, collectives exchanged through a barrier) on the reference evaluator in
 * f64, must compute the loss and every gradient the 1-rank joint graph computes; and it must
 * put exactly Megatron's all-reduces in: two of B·T·d per block in the forward, two in the
 * backward, nothing else. FSDP on the same mesh (parameters stored Shard on dp, gathered
 * before use) is the same step, with one gather (two with reshard_after_forward) and one
 * reduce-scatter per parameter on dp. A value split on one dim that is wanted split on another
 * (Shard(a) -> Shard(b)) is one all_to_all_single on its mesh dim's group, never a gather.
 */
#include "hp/build.h"
#include "hp/eval.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "tests/util/eval_harness.h"
#include "tests/util/spmd_sim.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define DIM   64
#define BATCH 2
#define SEQ   8
#define VOCAB HP_TH_SPMD_VOCAB

static int count_on(const hp_graph *g, hp_op op, const char *group);

static hp_graph *tiny_llama_batch(int layers, int kv_heads, int batch) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, &err), HP_OK, "%s", err.msg);
    spec.dim = DIM, spec.n_layers = layers, spec.n_heads = 4, spec.n_kv_heads = kv_heads;
    spec.ffn_hidden = 96, spec.vocab = VOCAB, spec.batch = batch, spec.seq = SEQ;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    return g;
}

static hp_graph *tiny_llama_kv(int layers, int kv_heads) {
    return tiny_llama_batch(layers, kv_heads, BATCH);
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
 * gradient comes out whole while wk is stored split: each rank keeps its own chunk
 * (local_chunk), nothing reduce-scattered. Still the 1-rank step. */
Test(spmd, tp4_with_fewer_kv_heads_than_ranks, .timeout = 120) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {4}};
    hp_placement *pl = plan_for(g, &mesh, 0, -1);
    hp_graph *spmd = hp_th_spmd_check(g, &mesh, pl);
    int scatters = 0, chunks = 0;
    for (int i = 0; i < spmd->n_nodes; i++) {
        scatters += spmd->nodes[i].op == HP_OP_REDUCE_SCATTER;
        chunks += spmd->nodes[i].op == HP_OP_LOCAL_CHUNK;
    }
    cr_expect_eq(scatters, 0, "no reduce-scatter: a replicated value is chunked locally");
    cr_expect_gt(chunks, 0, "wk/wv gradients chunked to their shards");
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

/* ---- torchtitan's full plan: the vocab-parallel embedding and the colwise output --------- */

/* The TP plan plus tok_embeddings (rowwise: vocab-sharded table) and output (colwise:
 * vocab-sharded logits) Shard(0) on tp, and loss parallel's vocab_index with output. */
static hp_placement *full_plan(const hp_graph *g, const hp_graph_mesh *mesh, int tp, int dp) {
    hp_placement *pl = plan_for(g, mesh, tp, dp);
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int i = 0; i < gi.n_params + gi.n_buffers; i++) {
        const char *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s;
        if (!strcmp(fqn, "tok_embeddings.weight") || !strcmp(fqn, "output.weight") ||
            !strcmp(fqn, HP_VOCAB_INDEX_FQN))
            pl[i * mesh->ndim + tp] = HP_SHARD(0);
    }
    return pl;
}

/* The full plan on mesh (tp the mesh dim named tp, dp the one named dp or -1), with or
 * without loss parallel: the 1-rank step; the embedding is the masked local lookup (no
 * embedding, its table never gathered), its gradient the rank's rows; on tp Megatron's
 * all-reduces plus the embedding's output and the output projection's input gradient;
 * nothing reduce-scattered; gathered on tp only the logits, and only without loss parallel. */
static void check_vocab(const hp_graph_mesh *mesh, int tp, int dp, bool loss_par) {
    const int layers = 2;
    hp_graph *g0 = tiny_llama(layers), *g = g0;
    hp_err err = {0};
    if (loss_par) cr_assert_eq(hp_pass_loss_parallel(g0, NULL, &g, &err), HP_OK, "%s", err.msg);
    hp_placement *pl = full_plan(g, mesh, tp, dp);
    hp_graph *spmd = hp_th_spmd_check(g, mesh, pl);
    int n = (int)mesh->size[tp], batch = dp >= 0 ? BATCH / (int)mesh->size[dp] : BATCH;
    int chunked = 0, chunked_back = 0, plain = 0, scatters = 0, tp_gathers = 0;
    for (int i = 0; i < spmd->n_nodes; i++) {
        hp_op op = spmd->nodes[i].op;
        chunked += op == HP_OP_CHUNKED_EMBEDDING;
        chunked_back += op == HP_OP_CHUNKED_EMBEDDING_BACKWARD;
        plain += op == HP_OP_EMBEDDING || op == HP_OP_EMBEDDING_DENSE_BACKWARD;
        scatters += op == HP_OP_REDUCE_SCATTER;
    }
    tp_gathers = count_on(spmd, HP_OP_ALL_GATHER, "tp");
    cr_expect_eq(chunked, 1, "the masked local lookup");
    cr_expect_eq(chunked_back, 1, "its gradient: the rank's rows");
    cr_expect_eq(plain, 0, "no whole-table embedding left");
    cr_expect_eq(scatters, 0);
    cr_expect_eq(tp_gathers, loss_par ? 0 : 1, "gathers on tp: %d", tp_gathers);
    cr_expect_eq(hp_th_spmd_count_all_reduces(spmd, batch * SEQ * DIM, "tp"), 4 * layers + 2);
    int emb = hp_graph_find_fqn(spmd, "tok_embeddings.weight");
    cr_expect_eq(spmd->nodes[emb].out[0].shape[0], VOCAB / n, "tok_embeddings vocab-sharded");
    free(pl);
    hp_graph_free(spmd);
    if (g != g0) hp_graph_free(g);
    hp_graph_free(g0);
}

Test(spmd, vocab_parallel_tp2_equals_one_rank, .timeout = 120) {
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {2}};
    check_vocab(&mesh, 0, -1, false);
    check_vocab(&mesh, 0, -1, true);
}

Test(spmd, vocab_parallel_dp2_tp2_equals_one_rank, .timeout = 120) {
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    check_vocab(&mesh, 1, 0, false);
    check_vocab(&mesh, 1, 0, true);
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

/* ---- FSDP in spmd: parameters stored Shard on dp, gathered before use ---------------------- */

/* FSDP on every non-scalar parameter over mesh dim dp, on top of base (the TP plan; NULL:
 * nothing else placed): stored Shard(k) there, k the first tensor dim no other mesh dim
 * shards (colwise [out, in] tp:S(0) stores dp:S(1)); consumed Replicate on dp. Data inputs
 * split on the batch over dp. *compute gets the compute placements. */
static hp_placement *fsdp_plan(const hp_graph *g, const hp_graph_mesh *mesh, int dp,
                               const hp_placement *base, hp_placement **compute) {
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_placement *pl = calloc((size_t)(n_ph * nd), sizeof *pl);
    *compute = calloc((size_t)(n_ph * nd), sizeof **compute);
    if (base) memcpy(pl, base, sizeof *pl * (size_t)(n_ph * nd));
    for (int i = 0; i < n_ph; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        for (int k = 0; i < gi.n_params && k < t->rank; k++) {
            bool taken = false;
            for (int m = 0; m < nd; m++)
                taken |=
                    m != dp && pl[i * nd + m].kind == HP_PLACE_SHARD && pl[i * nd + m].dim == k;
            if (taken) continue;
            pl[i * nd + dp] = HP_SHARD(k);
            break;
        }
        if (i >= gi.n_params + gi.n_buffers) pl[i * nd + dp] = HP_SHARD(0);
        memcpy(*compute + i * nd, pl + i * nd, sizeof *pl * (size_t)nd);
        if (i < gi.n_params) (*compute)[i * nd + dp] = HP_REPLICATE;
    }
    return pl;
}

/* Does parameter p have a backward use (a node after the loss reading it or a forward view
 * of it)? Then reshard_after_forward gathers it twice. */
static bool used_in_backward(const hp_graph *g, int p) {
    int loss = g->outputs[0].node;
    bool *of = calloc((size_t)g->n_nodes, sizeof *of);
    of[p] = true;
    bool used = false;
    for (int i = p + 1; i < g->n_nodes && !used; i++) {
        const hp_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            if (!of[n->in[j].node]) continue;
            if (i > loss) used = true;
            if (n->n_in == 1 && n->n_out == 1 && n->op != HP_OP_MM) of[i] = true;
        }
    }
    free(of);
    return used;
}

/* The placeholder collective node c gathers or scatters, through transposes and waits; -1
 * when it is not a placeholder. */
static int source_placeholder(const hp_graph *g, int c) {
    hp_value v = g->nodes[c].in[0];
    while (g->nodes[v.node].op == HP_OP_TRANSPOSE) v = g->nodes[v.node].in[0];
    return g->nodes[v.node].op == HP_OP_PLACEHOLDER ? v.node : -1;
}

static int count_on(const hp_graph *g, hp_op op, const char *group) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_GROUP);
        k += g->nodes[i].op == op && a && !strcmp(a->s, group);
    }
    return k;
}

/* FSDP over dp (with the TP plan over tp when tp_plan_on), checked against 1 rank; then the
 * collectives on dp: every all-gather is of a parameter placeholder (never an activation),
 * one per parameter (two for those the backward reads, with reshard_after_forward), one
 * reduce-scatter per parameter, and only scalar all-reduces (the loss, total_weight). */
static void check_fsdp(const hp_graph *g, const hp_graph_mesh *mesh, bool tp_plan_on,
                       bool reshard) {
    int nd = mesh->ndim, dp = 0;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    hp_placement *compute = NULL;
    hp_placement *tp = tp_plan_on ? plan_for(g, mesh, 1, -1) : NULL;
    hp_placement *pl = fsdp_plan(g, mesh, dp, tp, &compute);
    hp_spmd_opts opts = {.compute = compute, .reshard_after_forward = reshard};
    hp_graph *spmd = hp_th_spmd_check_opts(g, mesh, pl, &opts);
    int want_gathers = 0;
    for (int i = 0; i < gi.n_params; i++) want_gathers += reshard && used_in_backward(g, i) ? 2 : 1;
    const char *grp = mesh->name[dp];
    cr_expect_eq(count_on(spmd, HP_OP_ALL_GATHER, grp), want_gathers);
    cr_expect_eq(count_on(spmd, HP_OP_REDUCE_SCATTER, grp), gi.n_params);
    for (int i = 0; i < spmd->n_nodes; i++) {
        const hp_node *n = &spmd->nodes[i];
        const hp_attr *a = hp_node_attr(n, HP_ATTR_GROUP);
        if (!a || strcmp(a->s, grp)) continue;
        if (n->op == HP_OP_ALL_GATHER) {
            int p = source_placeholder(spmd, i);
            cr_expect(p >= 0 && p < gi.n_params, "node %d: an all-gather on dp of no parameter", i);
        }
        if (n->op == HP_OP_ALL_REDUCE)
            cr_expect_eq(hp_type_numel(&n->out[0]), 1, "node %d: a non-scalar all-reduce on dp", i);
    }
    /* every parameter's placeholder carries its storage placements */
    for (int i = 0; i < gi.n_params; i++) {
        const hp_placement *p = hp_value_placements(spmd, (hp_value){i, 0});
        for (int m = 0; m < nd; m++)
            cr_expect(hp_placement_eq(p[m], mesh->size[m] > 1 ? pl[i * nd + m] : HP_REPLICATE),
                      "%s on %s", hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s, mesh->name[m]);
    }
    if (tp_plan_on) { /* Megatron's on tp, and nothing else there */
        int on_tp = 0;
        for (int i = 0; i < spmd->n_nodes; i++) {
            const hp_attr *a = hp_node_attr(&spmd->nodes[i], HP_ATTR_GROUP);
            on_tp += (hp_op_get(spmd->nodes[i].op)->flags & HP_OPF_COLLECTIVE) && a &&
                     !strcmp(a->s, "tp");
        }
        cr_expect_eq(hp_th_spmd_count_all_reduces(spmd, BATCH / 2 * SEQ * DIM, "tp"), 4 * 2);
        cr_expect_eq(on_tp, 4 * 2, "collectives on tp: %d", on_tp);
    }
    free(tp);
    free(pl);
    free(compute);
    hp_graph_free(spmd);
}

/* (a) FSDP alone on a 2-D mesh: tp of one rank, and tp=2 with nothing placed on it. */
Test(spmd, fsdp_dp2_tp1_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(2);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 1}};
    check_fsdp(g, &mesh, false, true);
    check_fsdp(g, &mesh, false, false);
    hp_graph_free(g);
}

Test(spmd, fsdp_dp2_tp2_without_tp_plan_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    check_fsdp(g, &mesh, false, true);
    hp_graph_free(g);
}

/* (b, c) FSDP x TP: torchtitan's TP plan over tp, FSDP over dp; the 1-rank step, one gather
 * (two with reshard_after_forward) and one reduce-scatter per parameter on dp, Megatron's
 * all-reduces on tp. */
Test(spmd, fsdp_dp2_x_tp2_reshard_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(2);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    check_fsdp(g, &mesh, true, true);
    hp_graph_free(g);
}

Test(spmd, fsdp_dp2_x_tp2_no_reshard_equals_one_rank, .timeout = 120) {
    hp_graph *g = tiny_llama(2);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    check_fsdp(g, &mesh, true, false);
    hp_graph_free(g);
}

/* (d) Uneven storage: dp=3 splits no dim of the model evenly (64 -> 3 x 22, vocab 128 -> 3 x
 * 43): each rank stores a zero-padded ceil chunk, the gathered copy is sliced back, the
 * gradient padded before its reduce-scatter; still the 1-rank step. */
Test(spmd, fsdp_uneven_storage_is_padded, .timeout = 120) {
    hp_graph *g = tiny_llama_batch(1, 2, 3);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {3, 1}};
    check_fsdp(g, &mesh, false, true);
    hp_graph_mesh one = {.ndim = 1, .name = {"dp"}, .size = {3}};
    check_fsdp(g, &one, false, false);
    hp_graph_free(g);
}

/* A compute placement that is no gather of the storage one is refused naming the input. */
Test(spmd, compute_must_gather_the_storage) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 1, .name = {"dp"}, .size = {2}};
    hp_placement *compute = NULL;
    hp_placement *pl = fsdp_plan(g, &mesh, 0, NULL, &compute);
    compute[0] = HP_SHARD(1); /* stored S(0), computed S(1) */
    hp_spmd_opts opts = {.compute = compute};
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd_ex(g, &mesh, pl, NULL, &opts, &out, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'tok_embeddings.weight': stored S(0) but computed S(1) on mesh "
                              "dim dp"),
              "%s", err.msg);
    cr_assert_null(out);
    free(pl);
    free(compute);
    hp_graph_free(g);
}

/* Gathering a storage split of a tensor dim another mesh dim also splits (DTensor's strided
 * shard) is refused naming the parameter and both mesh dims. */
Test(spmd, gathering_a_doubly_split_dim_is_refused) {
    hp_graph *g = tiny_llama(1);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_placement *tp = plan_for(g, &mesh, 1, 0), *compute = NULL;
    hp_placement *pl = fsdp_plan(g, &mesh, 0, tp, &compute);
    int wq = 1; /* layers.0.attention.wq.weight: tp:S(0), stored dp:S(0) too */
    cr_assert_str_eq(hp_node_attr(&g->nodes[wq], HP_ATTR_FQN)->s, "layers.0.attention.wq.weight");
    pl[wq * 2] = HP_SHARD(0);
    hp_spmd_opts opts = {.compute = compute};
    hp_graph *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd_ex(g, &mesh, pl, NULL, &opts, &out, &err), HP_UNSUPPORTED);
    cr_expect(strstr(err.msg, "'layers.0.attention.wq.weight': tensor dim 0 is stored split by "
                              "mesh dims tp and dp"),
              "%s", err.msg);
    cr_assert_null(out);
    free(tp);
    free(pl);
    free(compute);
    hp_graph_free(g);
}

/* ---- Shard(a) -> Shard(b): all_to_all_single ---------------------------------------------- */

/* loss = sum(a * b) for parameters a, b [4, 6, 4] (autodiff's joint graph). */
static hp_graph *product_sum(void) {
    hp_graph *g = hp_graph_new();
    hp_init init = {.kind = HP_INIT_ZEROS};
    hp_value a = hp_build_placeholder(g, HP_INPUT_PARAM, "a", TY(HP_F32, 4, 6, 4), &init);
    hp_value b = hp_build_placeholder(g, HP_INPUT_PARAM, "b", TY(HP_F32, 4, 6, 4), &init);
    hp_value loss = hp_un1(g, HP_OP_SUM, hp_bin(g, HP_OP_MUL, a, b),
                           hp_attr_ints(HP_ATTR_DIMS, 3, (int64_t[]){0, 1, 2}));
    hp_err err = {0};
    cr_assert_eq(hp_autodiff(g, loss, &err), HP_OK, "%s", err.msg);
    return g;
}

/* a stored Shard(0) and b Shard(1) on tp (and both Shard(2) on dp when there is one): the
 * product needs one of them moved to the other's split, and each gradient (the other factor)
 * comes out in the other's split and goes to its parameter's: all-to-alls on tp, no gather,
 * the 1-rank step. */
static void check_a2a(const hp_graph_mesh *mesh, int tp, int dp) {
    hp_graph *g = product_sum();
    int nd = mesh->ndim;
    hp_placement *pl = calloc((size_t)(2 * nd), sizeof *pl);
    pl[0 * nd + tp] = HP_SHARD(0);
    pl[1 * nd + tp] = HP_SHARD(1);
    if (dp >= 0) pl[0 * nd + dp] = pl[1 * nd + dp] = HP_SHARD(2);
    hp_graph *spmd = hp_th_spmd_check(g, mesh, pl);
    int a2a = count_on(spmd, HP_OP_ALL_TO_ALL, "tp"), gathers = 0, reduces = 0;
    for (int i = 0; i < spmd->n_nodes; i++) {
        gathers += spmd->nodes[i].op == HP_OP_ALL_GATHER;
        reduces += spmd->nodes[i].op == HP_OP_ALL_REDUCE;
    }
    /* the forward's move of b to a's split; in the backward each gradient (g * the other
     * factor, computed where that factor is stored: the ones are chunked locally) moved to its
     * parameter's split; each a rank's [1, n, ...] piece */
    cr_expect_eq(a2a, 3, "all_to_all_single on tp: %d", a2a);
    cr_expect_eq(gathers, 0, "nothing gathered");
    cr_expect_eq(reduces, dp >= 0 ? 2 : 1, "only the loss all-reduced (once per split mesh dim)");
    for (int i = 0; i < spmd->n_nodes; i++) {
        if (spmd->nodes[i].op != HP_OP_ALL_TO_ALL) continue;
        const hp_type *t = &spmd->nodes[i].out[0];
        cr_expect(t->rank >= 2 && t->shape[0] == 1 && t->shape[1] == mesh->size[tp]);
    }
    free(pl);
    hp_graph_free(spmd);
    hp_graph_free(g);
}

Test(spmd, shard_to_shard_is_all_to_all_tp2, .timeout = 60) {
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {2}};
    check_a2a(&mesh, 0, -1);
}

Test(spmd, shard_to_shard_is_all_to_all_dp2_tp2, .timeout = 60) {
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    check_a2a(&mesh, 1, 0);
}

/* An explicit output target: the loss Replicate, a's gradient (b, stored Shard(1)) asked
 * Shard(2) on tp: one more all-to-all, placed as asked. */
Test(spmd, shard_to_shard_output_target) {
    hp_graph *g = product_sum();
    hp_graph_mesh mesh = {.ndim = 1, .name = {"tp"}, .size = {2}};
    hp_placement in[2] = {HP_SHARD(0), HP_SHARD(1)};
    hp_placement out[3] = {HP_REPLICATE, HP_SHARD(2), HP_SHARD(1)};
    hp_graph *spmd = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd(g, &mesh, in, out, &spmd, &err), HP_OK, "%s", err.msg);
    const hp_placement *p = hp_value_placements(spmd, spmd->outputs[1]);
    cr_expect(hp_placement_eq(p[0], HP_SHARD(2)));
    cr_expect_eq(hp_graph_type(spmd, spmd->outputs[1])->shape[2], 2);
    cr_expect_eq(count_on(spmd, HP_OP_ALL_GATHER, "tp"), 0);
    cr_expect_geq(count_on(spmd, HP_OP_ALL_TO_ALL, "tp"), 2);
    hp_graph_free(spmd);
    hp_graph_free(g);
}
