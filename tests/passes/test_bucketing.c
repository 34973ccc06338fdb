/* Bucketing (passes/bucketing.c): runs of gathers of one FSDP unit and runs of reduce-scatters
 * / all-reduces become one collective per bucket of at most bucket_bytes, computing
 * bit-identical values (checked on the reference evaluator with a hook that simulates ranks
 * holding different data); nothing merges across kinds, groups or units, or where a member's
 * wait comes first; 0 disables; every allocation failure is clean. */
#include "hp/build.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"
#include "passes/sched_util.h"
#include "tests/util/fsdp_fixture.h"
#include "tests/util/spmd_sim.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static hp_graph *run(hp_pass_fn pass, const hp_graph *g, bool overlap, int64_t bucket) {
    hp_job job;
    hp_fx_job(&job, overlap, 1, bucket);
    hp_graph *o = hp_fx_run_pass(pass, g, &job);
    hp_job_fini(&job);
    return o;
}

static int count_op(const hp_graph *g, hp_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* A sharded parameter placeholder of global shape [d0, d1] (d1 = 0: rank 1) over `world`. */
static hp_value shard(hp_graph *g, const char *fqn, int64_t d0, int64_t d1, int world) {
    int64_t gshape[2] = {d0, d1}, sshape[2] = {(d0 + world - 1) / world, d1};
    int rank = d1 ? 2 : 1;
    hp_attr a[5] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_PARAM), hp_attr_str(HP_ATTR_FQN, fqn),
                    hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, rank, gshape),
                    hp_attr_int(HP_ATTR_GROUP_SIZE, world), hp_attr_str(HP_ATTR_GROUP, "dp")};
    hp_type t = hp_type_make(HP_F32, rank, sshape);
    int id = hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, a, 5, NULL);
    cr_assert_geq(id, 0);
    return (hp_value){id, 0};
}

static hp_value data(hp_graph *g, int rank, const int64_t *shape) {
    return hp_build_placeholder(g, HP_INPUT_DATA, NULL, hp_type_make(HP_F32, rank, shape), NULL);
}

static hp_value coll(hp_graph *g, hp_op op, hp_value x, int world, const char *group) {
    hp_attr a[3] = {hp_attr_int(HP_ATTR_GROUP_SIZE, world), hp_attr_str(HP_ATTR_GROUP, group),
                    hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_AVG)};
    return hp_build(g, op, &x, 1, a, op == HP_OP_ALL_GATHER ? 2 : 3);
}

static hp_value wait(hp_graph *g, hp_value x) {
    return hp_un(g, HP_OP_WAIT_TENSOR, x);
}

static void finish(hp_graph *g, const hp_value *outs, int n) {
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    cr_assert_eq(hp_graph_set_outputs(g, outs, n, NULL), HP_OK);
    hp_err e;
    cr_assert_eq(hp_graph_verify(g, &e), HP_OK, "%s", e.msg);
}

/* Gathers of unit blk.0 (one padded, one rank 1) sit together with one of another unit. */
static hp_graph *gathers_graph(void) {
    hp_graph *g = hp_graph_new();
    hp_value a = shard(g, "blk.0.a", 4, 3, 2), b = shard(g, "blk.0.b", 5, 0, 2);
    hp_value c = shard(g, "blk.0.c", 2, 2, 2), d = shard(g, "other.w", 4, 0, 2);
    hp_value x = data(g, 2, (int64_t[]){4, 3});
    hp_value ga = coll(g, HP_OP_ALL_GATHER, a, 2, "dp"), gb = coll(g, HP_OP_ALL_GATHER, b, 2, "dp");
    hp_value gc = coll(g, HP_OP_ALL_GATHER, c, 2, "dp"), gd = coll(g, HP_OP_ALL_GATHER, d, 2, "dp");
    hp_value y = hp_mul(g, x, wait(g, ga));
    hp_value wb = hp_slice(g, wait(g, gb), 0, 0, 5, 1);
    hp_value wc = wait(g, gc);
    hp_value outs[4] = {y, hp_mul_scalar(g, wb, 3), hp_add(g, wc, wc), wait(g, gd)};
    finish(g, outs, 4);
    return g;
}

Test(bucketing, gathers_of_one_unit_merge) {
    hp_graph *g = gathers_graph();
    hp_graph *o = run(hp_pass_bucketing, g, false, 1 << 20);
    cr_expect_eq(count_op(o, HP_OP_ALL_GATHER), 2, "blk.0's three gathers and other.w's");
    cr_expect_eq(count_op(o, HP_OP_WAIT_TENSOR), 2);
    cr_expect_eq(count_op(o, HP_OP_CAT), 1);
    /* the bucket: cat of [6], [3], [2] -> [11] -> gather [22] -> view [2, 11] */
    for (int i = 0; i < o->n_nodes; i++) {
        const hp_node *n = &o->nodes[i];
        if (n->op == HP_OP_CAT) {
            cr_expect_eq(n->n_in, 3);
            cr_expect_eq(n->out[0].shape[0], 11);
        }
        if (n->op == HP_OP_ALL_GATHER && o->nodes[n->in[0].node].op == HP_OP_CAT)
            cr_expect_eq(n->out[0].shape[0], 22);
    }
    hp_fx_expect_same_values(g, o, 1);
    /* too small a bucket: nothing merges */
    hp_graph *p = run(hp_pass_bucketing, g, false, 8);
    cr_expect(hp_graph_eq(p, g));
    hp_graph_free(p);
    hp_graph_free(o);
    hp_graph_free(g);
}

/* Gradients [4,3], [6], [2,2] scattered (and two all-reduced), waited at the end. */
static hp_graph *scatters_graph(void) {
    hp_graph *g = hp_graph_new();
    hp_value y1 = data(g, 2, (int64_t[]){4, 3}), y2 = data(g, 1, (int64_t[]){6});
    hp_value y3 = data(g, 2, (int64_t[]){2, 2});
    hp_value r1 = coll(g, HP_OP_REDUCE_SCATTER, hp_mul_scalar(g, y1, 2), 2, "dp");
    hp_value r2 = coll(g, HP_OP_REDUCE_SCATTER, hp_mul_scalar(g, y2, 3), 2, "dp");
    hp_value r3 = coll(g, HP_OP_REDUCE_SCATTER, hp_mul_scalar(g, y3, 4), 2, "dp");
    hp_value a1 = coll(g, HP_OP_ALL_REDUCE, hp_neg(g, y2), 2, "dp");
    hp_value a2 = coll(g, HP_OP_ALL_REDUCE, hp_neg(g, y3), 2, "dp");
    hp_value outs[5] = {wait(g, r1), wait(g, r2), wait(g, r3), wait(g, a1), wait(g, a2)};
    finish(g, outs, 5);
    return g;
}

Test(bucketing, scatters_and_all_reduces_merge) {
    hp_graph *g = scatters_graph();
    hp_graph *o = run(hp_pass_bucketing, g, false, 1 << 20);
    cr_expect_eq(count_op(o, HP_OP_REDUCE_SCATTER), 1);
    cr_expect_eq(count_op(o, HP_OP_ALL_REDUCE), 1);
    cr_expect_eq(count_op(o, HP_OP_WAIT_TENSOR), 2);
    for (int i = 0; i < o->n_nodes; i++) {
        const hp_node *n = &o->nodes[i];
        if (n->op == HP_OP_REDUCE_SCATTER) /* [2, 6+3+2] flat */
            cr_expect_eq(hp_graph_type(o, n->in[0])->shape[0], 22);
    }
    hp_fx_expect_same_values(g, o, 1);
    /* 72 bytes: [4,3] and [6] fill one bucket, [2,2] goes alone; the all-reduces fit */
    hp_graph *p = run(hp_pass_bucketing, g, false, 72);
    cr_expect_eq(count_op(p, HP_OP_REDUCE_SCATTER), 2);
    cr_expect_eq(count_op(p, HP_OP_ALL_REDUCE), 1);
    hp_fx_expect_same_values(g, p, 1);
    hp_graph_free(p);
    hp_graph_free(o);
    hp_graph_free(g);
}

/* No merging across groups, reduce ops, or past a member's wait. */
Test(bucketing, respects_groups_and_waits) {
    hp_graph *g = hp_graph_new();
    hp_value y1 = data(g, 1, (int64_t[]){4}), y2 = data(g, 1, (int64_t[]){4});
    hp_value r1 = coll(g, HP_OP_REDUCE_SCATTER, y1, 2, "dp");
    hp_value r2 = coll(g, HP_OP_REDUCE_SCATTER, y2, 2, "tp"); /* another group */
    hp_value w1 = wait(g, r1);
    hp_value r3 = coll(g, HP_OP_REDUCE_SCATTER, hp_neg(g, y1), 2, "tp"); /* after r1's wait */
    hp_value outs[3] = {w1, wait(g, r2), wait(g, r3)};
    finish(g, outs, 3);
    hp_graph *o = run(hp_pass_bucketing, g, false, 1 << 20);
    /* r2 and r3 share a group but r1's wait does not stop them: they merge; r1 stays */
    cr_expect_eq(count_op(o, HP_OP_REDUCE_SCATTER), 2);
    hp_fx_expect_same_values(g, o, 1);
    hp_graph_free(o);
    hp_graph_free(g);

    /* r1's own wait comes before r2: r1 and r2 (same group) stay apart */
    g = hp_graph_new();
    y1 = data(g, 1, (int64_t[]){4});
    r1 = coll(g, HP_OP_REDUCE_SCATTER, y1, 2, "dp");
    w1 = wait(g, r1);
    r2 = coll(g, HP_OP_REDUCE_SCATTER, hp_neg(g, y1), 2, "dp");
    hp_value outs2[2] = {w1, wait(g, r2)};
    finish(g, outs2, 2);
    o = run(hp_pass_bucketing, g, false, 1 << 20);
    cr_expect(hp_graph_eq(o, g));
    hp_graph_free(o);
    hp_graph_free(g);
}

/* FSDP's own layout (each gather waited before the next, each scatter waited in turn): nothing
 * is consecutive, nothing merges. */
Test(bucketing, fsdp_layout_without_overlap_is_unchanged) {
    hp_graph *j = hp_fx_llama(2), *g = hp_fx_fsdp(j, 2, true, NULL);
    hp_graph *o = run(hp_pass_bucketing, g, false, 1 << 30);
    cr_expect(hp_graph_eq(o, g));
    hp_graph_free(o);
    hp_graph_free(g);
    hp_graph_free(j);
}

Test(bucketing, disabled_is_identity) {
    hp_graph *g = gathers_graph();
    hp_job job;
    hp_fx_job(&job, true, 1, 0);
    hp_pass_report rep = {0};
    hp_pass_ctx ctx = {.job = &job, .world = 2, .report = &rep};
    hp_graph *o = NULL;
    hp_err e;
    cr_assert_eq(hp_pass_bucketing(g, &ctx, &o, &e), HP_OK, "%s", e.msg);
    cr_expect(hp_graph_eq(o, g));
    cr_expect(!rep.ran);
    cr_expect_eq(rep.collectives, 4);
    hp_graph_free(o);
    hp_job_fini(&job);
    hp_graph_free(g);
}

/* After overlap: one gather per FSDP unit group, scatters merged up to the bucket size, every
 * value bit-identical to the unscheduled graph's. */
static void after_overlap(int world, bool reshard, int64_t bucket) {
    hp_graph *j = hp_fx_llama(2), *g = hp_fx_fsdp(j, world, reshard, NULL);
    hp_graph *s = run(hp_pass_overlap, g, true, bucket);
    hp_graph *o = run(hp_pass_bucketing, s, true, bucket);
    int ag_before = count_op(s, HP_OP_ALL_GATHER), ag_after = count_op(o, HP_OP_ALL_GATHER);
    int rs_before = count_op(s, HP_OP_REDUCE_SCATTER), rs_after = count_op(o, HP_OP_REDUCE_SCATTER);
    cr_expect_lt(ag_after, ag_before);
    cr_expect_lt(rs_after, rs_before);
    for (int i = 0; i < o->n_nodes; i++) {
        const hp_node *n = &o->nodes[i];
        if (!(hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE)) continue;
        const hp_node *src = &o->nodes[n->in[0].node];
        if (src->op != HP_OP_CAT &&
            !(src->op == HP_OP_VIEW && o->nodes[src->in[0].node].op == HP_OP_CAT))
            continue; /* not a bucket */
        int64_t bytes = n->op == HP_OP_ALL_GATHER ? hp__type_bytes(&n->out[0])
                                                  : hp__type_bytes(hp_graph_type(o, n->in[0]));
        cr_expect_leq(bytes, bucket, "bucket %d holds %lld bytes", i, (long long)bytes);
        if (n->op != HP_OP_ALL_GATHER) continue;
        /* a gather bucket holds parameters of one unit */
        int32_t ph0 = -1;
        for (int k = 0; k < src->n_in; k++) {
            int32_t p = src->in[k].node;
            if (o->nodes[p].op == HP_OP_VIEW) p = o->nodes[p].in[0].node;
            cr_assert_eq(o->nodes[p].op, HP_OP_PLACEHOLDER);
            if (ph0 < 0) ph0 = p;
            cr_expect(hp__same_unit(o, ph0, p), "bucket %d mixes units", i);
        }
    }
    hp_fx_expect_same_values(g, o, 128);
    hp_fx_expect_same_values(s, o, 128);
    hp_graph_free(o);
    hp_graph_free(s);
    hp_graph_free(g);
    hp_graph_free(j);
}

Test(bucketing, after_overlap_large_buckets) {
    after_overlap(2, true, 1 << 30);
}
Test(bucketing, after_overlap_small_buckets_padded) {
    after_overlap(3, true, 40000);
}
Test(bucketing, after_overlap_no_reshard) {
    after_overlap(2, false, 100000);
}

Test(bucketing, fault_injection) {
    hp_graph *j = hp_fx_llama(1), *g0 = hp_fx_fsdp(j, 3, true, NULL);
    hp_graph *g = run(hp_pass_overlap, g0, true, 1 << 20);
    hp_graph *ref = run(hp_pass_bucketing, g, true, 1 << 20);
    cr_assert(!hp_graph_eq(ref, g));
    hp_job job;
    hp_fx_job(&job, true, 1, 1 << 20);
    hp_pass_ctx ctx = {.job = &job, .world = 3};
    for (long k = 0;; k++) {
        cr_assert_lt(k, 100000, "never succeeded");
        hp_graph *o = (hp_graph *)1;
        hp_err e = {0};
        hp_alloc_fail_at(k);
        hp_status st = hp_pass_bucketing(g, &ctx, &o, &e);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            cr_expect(hp_graph_eq(o, ref));
            hp_graph_free(o);
            break;
        }
        cr_assert_eq(st, HP_NOMEM, "allocation %ld: %s", k, e.msg);
        cr_assert_null(o);
    }
    hp_job_fini(&job);
    hp_graph_free(ref);
    hp_graph_free(g);
    hp_graph_free(g0);
    hp_graph_free(j);
}

/* ---- placed graphs: FSDP x TP on simulated ranks --------------------------------------------- */

/* torchtitan's Llama TP plan on tp (colwise S(0), rowwise S(1) of [out, in]) and FSDP on every
 * non-scalar parameter over dp, stored on the first tensor dim tp leaves whole (as
 * passes/pipeline.c places it); the batch split over dp. *compute: consumed Replicate on dp. */
static hp_placement *fsdp_x_tp_plan(const hp_graph *g, hp_placement **compute) {
    static const char *const col[] = {".wq.", ".wk.", ".wv.", ".w1.", ".w3."};
    static const char *const row[] = {".wo.", ".w2."};
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_placement *pl = calloc((size_t)n_ph * 2, sizeof *pl);
    *compute = calloc((size_t)n_ph * 2, sizeof **compute);
    for (int i = 0; i < n_ph; i++) {
        hp_placement *p = pl + 2 * i;
        p[0] = p[1] = HP_REPLICATE;
        if (i >= gi.n_params) {
            if (i >= gi.n_params + gi.n_buffers) p[0] = HP_SHARD(0);
        } else {
            const char *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s;
            for (size_t k = 0; k < HP_ARRAY_LEN(col); k++)
                if (strstr(fqn, col[k])) p[1] = HP_SHARD(0);
            for (size_t k = 0; k < HP_ARRAY_LEN(row); k++)
                if (strstr(fqn, row[k])) p[1] = HP_SHARD(1);
            p[0] = HP_SHARD(p[1].kind == HP_PLACE_SHARD && p[1].dim == 0 ? 1 : 0);
        }
        memcpy(*compute + 2 * i, p, 2 * sizeof *p);
        if (i < gi.n_params) (*compute)[2 * i] = HP_REPLICATE;
    }
    return pl;
}

typedef struct post_cfg {
    int64_t bucket;
    int prefetch;
} post_cfg;

/* Overlap, then bucketing, as the pipeline runs them after spmd. */
static hp_graph *overlap_then_bucket(const hp_graph *placed, void *ctx) {
    const post_cfg *c = ctx;
    hp_job job;
    hp_fx_job(&job, true, c->prefetch, c->bucket);
    hp_graph *o = hp_fx_run_pass(hp_pass_overlap, placed, &job);
    hp_graph *b = hp_fx_run_pass(hp_pass_bucketing, o, &job);
    hp_graph_free(o);
    hp_job_fini(&job);
    return b;
}

static int on_group(const hp_graph *g, hp_op op, const char *group) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_GROUP);
        k += g->nodes[i].op == op && a && !strcmp(a->s, group);
    }
    return k;
}

static int64_t bytes_on(const hp_graph *g, const char *group) {
    int64_t b = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_GROUP);
        if ((hp_op_get(g->nodes[i].op)->flags & HP_OPF_COLLECTIVE) && a && !strcmp(a->s, group))
            b += hp_collective_bytes(g, i);
    }
    return b;
}

/* spmd's FSDP x TP graph on (dp=2, tp=2), then overlap and bucketing: every rank's loss and
 * gradient pieces still equal the 1-rank graph's (1e-10, f64); the gathers and scatters on dp
 * merge (fewer of them, the same bytes), tp keeps its bytes (nothing moves between mesh dims). */
static void check_placed(bool reshard, int64_t bucket) {
    hp_model_spec spec;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, &err), HP_OK, "%s", err.msg);
    spec.dim = 64, spec.n_layers = 2, spec.n_heads = 4, spec.n_kv_heads = 2;
    spec.ffn_hidden = 96, spec.vocab = HP_TH_SPMD_VOCAB, spec.batch = 2, spec.seq = 8;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_placement *compute = NULL, *pl = fsdp_x_tp_plan(g, &compute);
    hp_spmd_opts opts = {.compute = compute, .reshard_after_forward = reshard};
    hp_graph *spmd = NULL;
    cr_assert_eq(hp_pass_spmd_ex(g, &mesh, pl, NULL, &opts, &spmd, &err), HP_OK, "%s", err.msg);
    post_cfg cfg = {.bucket = bucket, .prefetch = 1};
    hp_graph *post = hp_th_spmd_check_post(g, &mesh, pl, &opts, overlap_then_bucket, &cfg);
    int ag0 = on_group(spmd, HP_OP_ALL_GATHER, "dp"), ag1 = on_group(post, HP_OP_ALL_GATHER, "dp");
    int rs0 = on_group(spmd, HP_OP_REDUCE_SCATTER, "dp");
    int rs1 = on_group(post, HP_OP_REDUCE_SCATTER, "dp");
    cr_expect_lt(ag1, ag0, "dp all-gathers %d -> %d", ag0, ag1);
    cr_expect_lt(rs1, rs0, "dp reduce-scatters %d -> %d", rs0, rs1);
    cr_expect_eq(bytes_on(post, "dp"), bytes_on(spmd, "dp"));
    cr_expect_eq(bytes_on(post, "tp"), bytes_on(spmd, "tp"));
    free(pl);
    free(compute);
    hp_graph_free(spmd);
    hp_graph_free(post);
    hp_graph_free(g);
}

Test(bucketing, placed_fsdp_x_tp_equals_one_rank, .timeout = 240) {
    check_placed(true, (int64_t)1 << 30);
    check_placed(false, (int64_t)1 << 30);
    check_placed(true, 24 << 10); /* small buckets: several per unit */
}
