/* tests/util/fsdp_fixture.c — see fsdp_fixture.h. */
#include "tests/util/fsdp_fixture.h"

#include "hp/build.h"
#include "hp/models.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_state {
    const hp_graph *g;
    hp_graph *o;
    int world;
    int32_t *map;
    bool *marked;
    hp_value *fwd, *bwd; /* the gathered (and unpadded) value of each marked parameter */
} fx_state;

/* group_size, group, reduce_op (avg): gathers take the first two. */
static void coll_attrs(int world, hp_attr a[3]) {
    a[0] = hp_attr_int(HP_ATTR_GROUP_SIZE, world);
    a[1] = hp_attr_str(HP_ATTR_GROUP, "dp");
    a[2] = hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_AVG);
}

static hp_value gathered(fx_state *s, int32_t p, bool backward) {
    hp_value *cache = backward ? s->bwd : s->fwd;
    if (hp_value_ok(cache[p])) return cache[p];
    hp_attr a[3];
    coll_attrs(s->world, a);
    hp_value shard = {s->map[p], 0};
    hp_value w = hp_un(s->o, HP_OP_WAIT_TENSOR, hp_build(s->o, HP_OP_ALL_GATHER, &shard, 1, a, 2));
    int64_t d0 = s->g->nodes[p].out[0].shape[0];
    if (d0 % s->world) w = hp_slice(s->o, w, 0, 0, d0, 1);
    return cache[p] = w;
}

static void copy_placeholder(fx_state *s, int32_t i, const char *pattern) {
    const hp_node *nd = &s->g->nodes[i];
    const hp_attr *fqn = hp_node_attr(nd, HP_ATTR_FQN);
    bool mark = s->world > 1 && hp_node_int(nd, HP_ATTR_KIND, -1) == HP_INPUT_PARAM && fqn &&
                (!pattern || hp_fqn_match(pattern, fqn->s));
    hp_attr attrs[HP_ATTR_COUNT];
    memcpy(attrs, nd->attrs, (size_t)nd->n_attrs * sizeof *attrs);
    int na = nd->n_attrs;
    hp_type t = nd->out[0];
    if (mark) {
        attrs[na++] = hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, t.rank, t.shape);
        attrs[na++] = hp_attr_int(HP_ATTR_GROUP_SIZE, s->world);
        attrs[na++] = hp_attr_str(HP_ATTR_GROUP, "dp");
        t.shape[0] = (t.shape[0] + s->world - 1) / s->world;
    }
    hp_err e;
    s->map[i] = hp_graph_append(s->o, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, attrs, na, &e);
    cr_assert_geq(s->map[i], 0, "%s", e.msg);
    s->marked[i] = mark;
}

static hp_value reduce_output(fx_state *s, hp_op op, hp_value v) {
    hp_attr a[3];
    coll_attrs(s->world, a);
    hp_value in[1] = {v};
    return hp_un(s->o, HP_OP_WAIT_TENSOR, hp_build(s->o, op, in, 1, a, 3));
}

hp_graph *hp_fx_fsdp(const hp_graph *g, int world, bool reshard, const char *pattern) {
    int n = g->n_nodes;
    fx_state s = {.g = g, .o = hp_graph_new(), .world = world};
    s.map = calloc((size_t)n, sizeof *s.map);
    s.marked = calloc((size_t)n, sizeof *s.marked);
    s.fwd = malloc((size_t)n * sizeof *s.fwd);
    s.bwd = malloc((size_t)n * sizeof *s.bwd);
    cr_assert(s.o && s.map && s.marked && s.fwd && s.bwd);
    for (int i = 0; i < n; i++) s.fwd[i] = s.bwd[i] = HP_NO_VALUE;
    int32_t loss = g->outputs[0].node;
    hp_value ins[HP_MAX_INPUTS];
    for (int32_t i = 0; i < n; i++) {
        const hp_node *nd = &g->nodes[i];
        if (nd->op == HP_OP_PLACEHOLDER) {
            copy_placeholder(&s, i, pattern);
            continue;
        }
        for (int k = 0; k < nd->n_in; k++) {
            hp_value v = nd->in[k];
            ins[k] = s.marked[v.node] ? gathered(&s, v.node, reshard && i > loss)
                                      : (hp_value){s.map[v.node], v.out};
        }
        hp_err e;
        s.map[i] = hp_graph_append(s.o, nd->op, ins, nd->n_in, nd->out, nd->n_out, nd->attrs,
                                   nd->n_attrs, &e);
        cr_assert_geq(s.map[i], 0, "%s", e.msg);
    }
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int k = 0; k < g->n_outputs; k++) {
        hp_value v = {s.map[g->outputs[k].node], g->outputs[k].out};
        if (world > 1 && k == 0) {
            int64_t one = 1;
            v = hp_view(s.o, v, 1, &one);
            v = hp_view(s.o, reduce_output(&s, HP_OP_ALL_REDUCE, v), 0, &one);
        } else if (world > 1 && k - 1 < gi.n_params && s.marked[k - 1]) {
            hp_type t = g->nodes[k - 1].out[0];
            int64_t d0 = t.shape[0], sh = (d0 + world - 1) / world;
            if (d0 % world) {
                t.shape[0] = sh * world;
                hp_attr a[4] = {hp_attr_ints(HP_ATTR_SHAPE, t.rank, t.shape),
                                hp_attr_int(HP_ATTR_DIM, 0), hp_attr_int(HP_ATTR_START, 0),
                                hp_attr_int(HP_ATTR_END, d0)};
                v = hp_build(s.o, HP_OP_SLICE_BACKWARD, &v, 1, a, 4);
            }
            v = reduce_output(&s, HP_OP_REDUCE_SCATTER, v);
        } else if (world > 1) {
            v = reduce_output(&s, HP_OP_ALL_REDUCE, v);
        }
        cr_assert(!hp_graph_failed(s.o), "%s", s.o->err.msg);
        cr_assert_eq(hp_graph_add_output(s.o, v, NULL), HP_OK);
    }
    hp_err e;
    cr_assert_eq(hp_graph_verify(s.o, &e), HP_OK, "%s", e.msg);
    free(s.map);
    free(s.marked);
    free(s.fwd);
    free(s.bwd);
    return s.o;
}

hp_graph *hp_fx_llama(int layers) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.dim = 64, spec.n_layers = layers, spec.n_heads = 4, spec.n_kv_heads = 2;
    spec.ffn_hidden = 96, spec.vocab = 128, spec.batch = 2, spec.seq = 8;
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    return g;
}

static double combine(int64_t op, double acc, double x) {
    return op == HP_REDUCE_MAX ? fmax(acc, x) : acc + x;
}

hp_status hp_fx_collective(void *ctx, const hp_node *n, const hp_tensor *in, hp_tensor *out,
                           hp_err *err) {
    (void)ctx, (void)err;
    int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1), op = hp_node_int(n, HP_ATTR_REDUCE_OP, 0);
    int64_t ni = hp_type_numel(&in->type), no = hp_type_numel(&out->type);
    switch (n->op) {
    case HP_OP_ALL_GATHER:
        for (int64_t j = 0; j < gs; j++)
            for (int64_t k = 0; k < ni; k++) out->data[j * ni + k] = in->data[k] + (double)j;
        break;
    case HP_OP_REDUCE_SCATTER:
        for (int64_t k = 0; k < no; k++) {
            double acc = in->data[k];
            for (int64_t j = 1; j < gs; j++) acc = combine(op, acc, in->data[j * no + k]);
            out->data[k] = op == HP_REDUCE_AVG ? acc / (double)gs : acc;
        }
        break;
    case HP_OP_ALL_REDUCE:
        for (int64_t k = 0; k < no; k++) {
            double acc = in->data[k];
            for (int64_t j = 1; j < gs; j++) acc = combine(op, acc, in->data[k] + (double)j);
            out->data[k] = op == HP_REDUCE_AVG ? acc / (double)gs : acc;
        }
        break;
    default:
        memcpy(out->data, in->data, (size_t)no * sizeof(double));
    }
    return HP_OK;
}

static int count_placeholders(const hp_graph *g) {
    int k = 0;
    while (k < g->n_nodes && g->nodes[k].op == HP_OP_PLACEHOLDER) k++;
    return k;
}

void hp_fx_expect_same_values(const hp_graph *a, const hp_graph *b, int64_t int_bound) {
    int np = count_placeholders(a);
    cr_assert_eq(np, count_placeholders(b), "the graphs have different placeholders");
    cr_assert_eq(a->n_outputs, b->n_outputs);
    hp_tensor *in = calloc((size_t)np, sizeof *in);
    hp_tensor *oa = calloc((size_t)a->n_outputs, sizeof *oa);
    hp_tensor *ob = calloc((size_t)b->n_outputs, sizeof *ob);
    cr_assert(in && oa && ob);
    hp_err e;
    for (int i = 0; i < np; i++) {
        const hp_type *t = &a->nodes[i].out[0];
        cr_assert(hp_type_eq(t, &b->nodes[i].out[0]), "placeholder %d differs", i);
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, &e), HP_OK, "%s", e.msg);
        int64_t m = hp_type_numel(t);
        hp_th_rand(in[i].data, m, (uint64_t)i + 1, -1, 1);
        if (!hp_dtype_is_float(t->dtype))
            for (int64_t k = 0; k < m; k++)
                in[i].data[k] = floor((in[i].data[k] + 1) / 2 * (double)int_bound);
    }
    hp_eval_opts o = {.precision = HP_EVAL_F32, .collective = hp_fx_collective};
    cr_assert_eq(hp_eval(a, in, np, &o, oa, &e), HP_OK, "before: %s", e.msg);
    cr_assert_eq(hp_eval(b, in, np, &o, ob, &e), HP_OK, "after: %s", e.msg);
    for (int k = 0; k < a->n_outputs; k++) {
        cr_assert(hp_type_eq(&oa[k].type, &ob[k].type), "output %d: types differ", k);
        size_t bytes = (size_t)hp_type_numel(&oa[k].type) * sizeof(double);
        cr_assert(memcmp(oa[k].data, ob[k].data, bytes) == 0, "output %d: values differ", k);
        hp_tensor_free(&oa[k]);
        hp_tensor_free(&ob[k]);
    }
    for (int i = 0; i < np; i++) hp_tensor_free(&in[i]);
    free(in);
    free(oa);
    free(ob);
}

void hp_fx_job(hp_job *job, bool overlap, int prefetch, int64_t bucket_bytes) {
    hp_job_init_defaults(job);
    job->passes.enable_overlap = overlap;
    job->passes.prefetch_depth = prefetch;
    job->passes.bucket_bytes = bucket_bytes;
}

hp_graph *hp_fx_run_pass(hp_pass_fn pass, const hp_graph *g, const hp_job *job) {
    hp_pass_ctx ctx = {.job = job, .world = 2};
    hp_graph *out = NULL;
    hp_err e = {0};
    cr_assert_eq(pass(g, &ctx, &out, &e), HP_OK, "%s", e.msg);
    cr_assert_not_null(out);
    cr_assert_eq(hp_graph_verify(out, &e), HP_OK, "%s", e.msg);
    return out;
}
