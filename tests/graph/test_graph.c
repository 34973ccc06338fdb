/* The graph core: types, attributes, init specs, placeholders, the raw append API and the
 * verifier's whole-graph checks, clone/eq, and a fault-injection loop over building. */
#include "hp/build.h"
#include "hp/graph.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

static hp_type f32(int rank, const int64_t *s) {
    return hp_type_make(HP_F32, rank, s);
}

Test(graph, dtype_names_round_trip) {
    for (int i = 0; i < HP_DTYPE_COUNT; i++) {
        hp_dtype dt;
        cr_assert_eq(hp_dtype_parse(hp_dtype_name((hp_dtype)i), &dt, NULL), HP_OK);
        cr_assert_eq(dt, i);
    }
    hp_err e;
    hp_dtype dt;
    cr_assert_eq(hp_dtype_parse("f64", &dt, &e), HP_PARSE);
    cr_assert(strstr(e.msg, "'f64'"));
    cr_assert_eq(hp_dtype_size(HP_BF16), 2);
    cr_assert(hp_dtype_is_float(HP_F16) && !hp_dtype_is_float(HP_I64));
}

Test(graph, type_check_bounds) {
    hp_err e;
    hp_type t = hp_type_make(HP_F32, 2, (int64_t[]){-1, 3});
    cr_assert_eq(hp_type_check(&t, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "dim 0 is -1"), "%s", e.msg);
    t = hp_type_make(HP_F32, 3, (int64_t[]){1 << 20, 1 << 20, 1 << 20});
    cr_assert_eq(hp_type_check(&t, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "2^50"), "%s", e.msg);
    t.rank = 9;
    cr_assert_eq(hp_type_check(&t, &e), HP_INVALID);
    char buf[64];
    t = hp_type_make(HP_BF16, 0, NULL);
    cr_assert_str_eq(hp_type_str(&t, buf, sizeof buf), "bf16[]");
}

Test(graph, init_specs_round_trip) {
    const char *good[] = {"zeros",
                          "ones",
                          "constant(0.5)",
                          "normal(0,0.02)",
                          "trunc_normal(0,0.02,-2,2)",
                          "uniform(-0.1,0.5)",
                          "arange"};
    for (size_t i = 0; i < HP_ARRAY_LEN(good); i++) {
        hp_init init;
        hp_err e;
        cr_assert_eq(hp_init_parse(good[i], &init, &e), HP_OK, "%s: %s", good[i], e.msg);
        char buf[128];
        hp_init back;
        cr_assert_eq(hp_init_parse(hp_init_str(&init, buf, sizeof buf), &back, NULL), HP_OK);
        cr_assert(memcmp(&init, &back, sizeof init) == 0, "%s -> %s", good[i], buf);
    }
    struct {
        const char *text, *msg;
    } bad[] = {{"gauss(0,1)", "unknown init 'gauss"},  {"normal(0)", "takes 2 arguments, got 1"},
               {"normal(0,-1)", "std -1 must be > 0"}, {"uniform(1,1)", "is empty"},
               {"normal(0,1", "expected ',' or ')'"},  {"normal(0,x)", "expected a number"},
               {"ones()x", "trailing text"},           {"normal(0,nan)", "non-finite"}};
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        hp_init init;
        hp_err e;
        cr_assert_neq(hp_init_parse(bad[i].text, &init, &e), HP_OK, "%s accepted", bad[i].text);
        cr_assert(strstr(e.msg, bad[i].msg), "%s: '%s' lacks '%s'", bad[i].text, e.msg, bad[i].msg);
    }
}

Test(graph, placeholder_rules) {
    int64_t s[2] = {4, 4};
    hp_graph *g = hp_graph_new();
    hp_init n01 = {.kind = HP_INIT_NORMAL, .std = 0.02};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", f32(2, s), &n01);
    cr_assert(hp_value_ok(w));
    hp_value nameless = hp_build_placeholder(g, HP_INPUT_PARAM, NULL, f32(2, s), NULL);
    cr_assert(!hp_value_ok(nameless));
    cr_assert(strstr(g->err.msg, "node 1 (placeholder): a parameter needs a non-empty fqn"), "%s",
              g->err.msg);
    hp_graph_free(g);

    /* an empty fqn names nothing either (a job file could carry one) */
    g = hp_graph_new();
    hp_value empty = hp_build_placeholder(g, HP_INPUT_BUFFER, "", f32(2, s), NULL);
    cr_assert(!hp_value_ok(empty));
    cr_assert(strstr(g->err.msg, "node 0 (placeholder): a buffer needs a non-empty fqn"), "%s",
              g->err.msg);
    hp_graph_free(g);
    g = hp_graph_new();
    empty = hp_build_placeholder(g, HP_INPUT_DATA, "", hp_type_make(HP_I64, 2, s), NULL);
    cr_assert(!hp_value_ok(empty));
    cr_assert(strstr(g->err.msg, "a data input's fqn is empty"), "%s", g->err.msg);
    hp_graph_free(g);

    g = hp_graph_new();
    hp_value tok =
        hp_build_placeholder(g, HP_INPUT_DATA, "tokens", hp_type_make(HP_I64, 2, s), NULL);
    cr_assert(hp_value_ok(tok));
    hp_value ip = hp_build_placeholder(g, HP_INPUT_PARAM, "ip", hp_type_make(HP_I64, 2, s), NULL);
    cr_assert(!hp_value_ok(ip));
    cr_assert(strstr(g->err.msg, "a parameter must be floating"), "%s", g->err.msg);
    hp_graph_free(g);
}

/* An FSDP shard declares the global shape it is a piece of: dim 0 is ceil(d0 / group_size). */
Test(graph, sharded_placeholder_rules) {
    struct {
        int64_t local0, global0, group;
        int64_t global1;
        const char *msg;
    } cases[] = {{4, 7, 2, 3, NULL},
                 {3, 9, 3, 3, NULL},
                 {3, 7, 2, 3, "has dim 0 4, not 3"},
                 {4, 7, 2, 5, "differ in dim 1"},
                 {4, 7, 0, 3, "group_size 0"}};
    for (size_t i = 0; i < HP_ARRAY_LEN(cases); i++) {
        hp_graph *g = hp_graph_new();
        hp_attr a[4] = {
            hp_attr_int(HP_ATTR_KIND, HP_INPUT_PARAM), hp_attr_str(HP_ATTR_FQN, "w"),
            hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, 2, (int64_t[]){cases[i].global0, cases[i].global1}),
            hp_attr_int(HP_ATTR_GROUP_SIZE, cases[i].group)};
        hp_type t = f32(2, (int64_t[]){cases[i].local0, 3});
        cr_assert_eq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, a, 4, NULL), 0);
        hp_err e;
        hp_status st = hp_graph_verify(g, &e);
        if (!cases[i].msg)
            cr_expect_eq(st, HP_OK, "case %zu: %s", i, e.msg);
        else
            cr_expect(st != HP_OK && strstr(e.msg, cases[i].msg), "case %zu: '%s'", i, e.msg);
        hp_graph_free(g);
    }
    /* global_shape without group_size */
    hp_graph *g = hp_graph_new();
    hp_attr a[3] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_DATA),
                    hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, 1, (int64_t[]){8})};
    hp_type t = hp_type_make(HP_I64, 1, (int64_t[]){4});
    hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, a, 2, NULL);
    hp_err e;
    cr_expect_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "a global_shape without group_size needs the graph's mesh"), "%s",
              e.msg);
    hp_graph_free(g);
}

/* A graph of 300k nodes is checked in ranges on several threads: a node that breaks its rule is
 * found wherever it lies, and with two broken the message is the first one's, as one thread
 * would give it. */
Test(graph, verify_a_large_graph_reports_its_first_bad_node) {
    int64_t s[1] = {4};
    hp_type t = f32(1, s), wrong = f32(1, (int64_t[]){5});
    hp_attr data = hp_attr_int(HP_ATTR_KIND, HP_INPUT_DATA);
    hp_graph *g = hp_graph_new();
    cr_assert_eq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, &data, 1, NULL), 0);
    enum { N = 300000 };
    for (int i = 1; i < N; i++) {
        hp_value in = {i - 1, 0};
        cr_assert_eq(hp_graph_append(g, HP_OP_NEG, &in, 1, &t, 1, NULL, 0, NULL), i);
    }
    hp_err e;
    cr_assert_eq(hp_graph_verify(g, &e), HP_OK, "%s", e.msg);
    /* node storage is shared between equal nodes (graph/intern.c): a broken node gets a type
     * of its own rather than a change to the shared one */
    hp_type *shared = g->nodes[290000].out;
    g->nodes[290000].out = &wrong; /* in the last range */
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "node 290000 (neg): output 0 is declared f32[5]"), "%s", e.msg);
    g->nodes[290000].out = shared;
    hp_value far = {N + 5, 0};
    hp_value *own_in = g->nodes[200000].in; /* inputs are each node's own */
    own_in[0] = far;                        /* a dangling input, in a later range than ... */
    g->nodes[100000].out = &wrong;          /* ... this, reported first */
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "node 100000 (neg): output 0 is declared f32[5]"), "%s", e.msg);
    g->nodes[100000].out = shared;
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "node 200000 (neg): input 0 refers to node 300005"), "%s", e.msg);
    hp_graph_free(g);
}

Test(graph, verify_whole_graph_rules) {
    int64_t s[1] = {4};
    hp_type t = f32(1, s);
    hp_err e;
    hp_attr data = hp_attr_int(HP_ATTR_KIND, HP_INPUT_DATA);
    hp_attr par[2] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_PARAM), hp_attr_str(HP_ATTR_FQN, "w")};

    /* data before a parameter */
    hp_graph *g = hp_graph_new();
    cr_assert_eq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, &data, 1, NULL), 0);
    cr_assert_eq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, par, 2, NULL), 1);
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "ordered parameters, buffers, then data"), "%s", e.msg);
    hp_graph_free(g);

    /* duplicate FQN */
    g = hp_graph_new();
    hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, par, 2, NULL);
    hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, par, 2, NULL);
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "'w' is used twice"), "%s", e.msg);
    hp_graph_free(g);

    /* forward reference (a cycle through order) and a dangling one */
    g = hp_graph_new();
    hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, &data, 1, NULL);
    hp_value fwd = {2, 0}, dang = {99, 0}, self = {0, 0};
    hp_graph_append(g, HP_OP_NEG, &fwd, 1, &t, 1, NULL, 0, NULL);
    hp_graph_append(g, HP_OP_NEG, &self, 1, &t, 1, NULL, 0, NULL);
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "node 1 (neg): input 0 refers to node 2, which does not come before"),
              "%s", e.msg);
    g->nodes[1].in[0] = dang;
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "node 99, which does not exist"), "%s", e.msg);
    g->nodes[1].in[0] = (hp_value){0, 3};
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "output 3 of node 0, which has 1"), "%s", e.msg);
    g->nodes[1].in[0] = self;
    cr_assert_eq(hp_graph_verify(g, &e), HP_OK, "%s", e.msg);

    /* declared type differs from the shape rule */
    hp_type *shared = g->nodes[2].out, own = shared[0]; /* (shared: graph/intern.c) */
    own.shape[0] = 5;
    g->nodes[2].out = &own;
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "node 2 (neg): output 0 is declared f32[5] but its shape rule gives "
                            "f32[4]"),
              "%s", e.msg);
    g->nodes[2].out = shared;

    /* bad graph output */
    hp_graph_add_output(g, (hp_value){7, 0}, NULL);
    cr_assert_eq(hp_graph_verify(g, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "graph output 0 refers to 7.0"), "%s", e.msg);
    hp_graph_free(g);

    /* duplicate attribute, unknown arity */
    g = hp_graph_new();
    hp_attr two[2] = {hp_attr_int(HP_ATTR_KIND, 2), hp_attr_int(HP_ATTR_KIND, 2)};
    cr_assert_eq(hp_graph_append(g, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, two, 2, &e), -1);
    cr_assert(strstr(e.msg, "duplicate attribute 'kind'"), "%s", e.msg);
    hp_graph_free(g);
}

Test(graph, clone_eq_and_queries) {
    int64_t s[2] = {3, 4};
    hp_graph *g = hp_graph_new();
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", f32(2, s), NULL);
    hp_value b = hp_build_placeholder(g, HP_INPUT_BUFFER, "b", f32(2, s), NULL);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", f32(2, s), NULL);
    hp_value y = hp_mul(g, hp_add(g, w, b), x);
    hp_value l = hp_sum(g, y, 0, NULL, false);
    cr_assert_eq(hp_graph_add_output(g, l, NULL), HP_OK);
    cr_assert_eq(hp_graph_verify(g, NULL), HP_OK);
    hp_graph_inputs in = hp_graph_count_inputs(g);
    cr_assert(in.n_params == 1 && in.n_buffers == 1 && in.n_data == 1);
    cr_assert_eq(hp_graph_find_fqn(g, "b"), 1);
    cr_assert_eq(hp_graph_find_fqn(g, "nope"), -1);
    cr_assert_eq(hp_graph_param_count(g), 12);
    hp_graph *c = hp_graph_clone(g);
    cr_assert(c && hp_graph_eq(g, c));
    c->nodes[5].attrs[0].ints.n = 1; /* sum over dim 0 now */
    cr_assert(!hp_graph_eq(g, c));
    hp_graph_free(c);
    hp_graph_free(g);
}

/* Equal node storage is one copy per graph (graph/intern.c): nodes with equal output types,
 * attributes (strings by content, floats bitwise) or placements point at the same array, and
 * different ones never do; a clone holds copies of its own and still compares equal. */
Test(graph, equal_node_storage_is_shared) {
    int64_t s[2] = {3, 4};
    hp_graph *g = hp_graph_new();
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", f32(2, s), NULL);
    hp_value a = hp_neg(g, x), b = hp_neg(g, a);
    int64_t d0[1] = {0}, d1[1] = {1}, d1_again[1] = {1};
    hp_value c = hp_sum(g, b, 1, d1, false), d = hp_sum(g, b, 1, d1_again, false);
    hp_value e = hp_sum(g, b, 1, d0, false);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    const hp_node *n = g->nodes;
    cr_expect_eq(n[a.node].out, n[b.node].out, "equal types are one array");
    cr_expect_eq(n[x.node].out, n[a.node].out, "whatever the op");
    cr_expect_eq(n[c.node].attrs, n[d.node].attrs, "equal attributes are one array");
    cr_expect_eq(n[c.node].out, n[d.node].out);
    cr_expect_neq(n[c.node].attrs, n[e.node].attrs, "sum over dim 0 is not over dim 1");
    cr_expect_neq(n[c.node].out, n[e.node].out, "f32[3] is not f32[4]");
    cr_expect_eq(n[e.node].attrs[0].ints.v[0], 0);
    cr_expect_eq(n[c.node].attrs[0].ints.v[0], 1);

    /* floats bitwise: 0.0 and -0.0 are different attributes */
    hp_value z1 = hp_add_scalar(g, x, 0.0), z2 = hp_add_scalar(g, x, 0.0);
    hp_value z3 = hp_add_scalar(g, x, -0.0);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    n = g->nodes;
    cr_expect_eq(n[z1.node].attrs, n[z2.node].attrs);
    cr_expect_neq(n[z1.node].attrs, n[z3.node].attrs);
    cr_expect(signbit(n[z3.node].attrs[0].f));

    /* inputs stay each node's own */
    cr_expect_neq(n[c.node].in, n[d.node].in);

    cr_assert_eq(hp_graph_add_output(g, c, NULL), HP_OK);
    hp_err err;
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "%s", err.msg);
    hp_graph *k = hp_graph_clone(g);
    cr_assert(k && hp_graph_eq(g, k));
    cr_expect_neq(k->nodes[c.node].attrs, g->nodes[c.node].attrs, "a clone has its own copies");
    cr_expect_eq(k->nodes[c.node].attrs, k->nodes[d.node].attrs, "shared within the clone");
    hp_graph_free(k);
    hp_graph_free(g);

    /* strings by content: two fqns spelled in different buffers share; another does not (a
     * graph of its own: the verifier refuses a repeated fqn) */
    hp_graph *sg = hp_graph_new();
    char n1[] = "layers.0.w", n2[] = "layers.0.w";
    hp_attr p1[2] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_BUFFER), hp_attr_str(HP_ATTR_FQN, n1)};
    hp_attr p2[2] = {hp_attr_str(HP_ATTR_FQN, n2), hp_attr_int(HP_ATTR_KIND, HP_INPUT_BUFFER)};
    hp_attr p3[2] = {hp_attr_int(HP_ATTR_KIND, HP_INPUT_BUFFER), hp_attr_str(HP_ATTR_FQN, "w2")};
    hp_type t = f32(2, s);
    int i1 = hp_graph_append(sg, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, p1, 2, NULL);
    int i2 = hp_graph_append(sg, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, p2, 2, NULL);
    int i3 = hp_graph_append(sg, HP_OP_PLACEHOLDER, NULL, 0, &t, 1, p3, 2, NULL);
    cr_assert(i1 >= 0 && i2 >= 0 && i3 >= 0);
    const hp_node *sn = sg->nodes;
    cr_expect_eq(sn[i1].attrs, sn[i2].attrs, "sorted, equal by content");
    cr_expect_neq(sn[i1].attrs, sn[i3].attrs);
    n1[0] = 'X'; /* the graph holds its own copy of the string */
    cr_expect_str_eq(sn[i1].attrs[1].s, "layers.0.w");
    cr_expect_str_eq(sn[i3].attrs[1].s, "w2");
    hp_graph_free(sg);

    /* placements: equal (after normalising the fields a kind does not use) are one array */
    g = hp_graph_new();
    hp_graph_mesh m = {.ndim = 1, .name = {"dp"}, .size = {2}};
    cr_assert_eq(hp_graph_set_mesh(g, &m, NULL), HP_OK);
    hp_value w1 = hp_build_placeholder(g, HP_INPUT_BUFFER, "w1", f32(2, s), NULL);
    hp_value w2 = hp_build_placeholder(g, HP_INPUT_BUFFER, "w2", f32(2, s), NULL);
    hp_value w3 = hp_build_placeholder(g, HP_INPUT_BUFFER, "w3", f32(2, s), NULL);
    hp_placement r1 = {HP_PLACE_REPLICATE, 1, HP_REDUCE_MAX}; /* unused fields: normalised */
    cr_assert_eq(hp_node_set_placements(g, w1.node, &r1, NULL), HP_OK);
    cr_assert_eq(hp_node_set_placements(g, w2.node, &HP_REPLICATE, NULL), HP_OK);
    cr_assert_eq(hp_node_set_placements(g, w3.node, &HP_SHARD(1), NULL), HP_OK);
    n = g->nodes;
    cr_expect_eq(n[w1.node].pl, n[w2.node].pl);
    cr_expect_neq(n[w1.node].pl, n[w3.node].pl);
    cr_expect_eq(n[w1.node].pl[0].dim, 0);
    cr_expect_eq(n[w3.node].pl[0].dim, 1);
    hp_graph_free(g);
}

/* Building fails cleanly at every allocation: no crash, a sticky HP_NOMEM, no leak (ASan). */
Test(graph, build_fault_injection) {
    int64_t s[2] = {3, 4};
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hp_graph *g = hp_graph_new();
        if (!g) continue;
        hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "w", f32(2, s), NULL);
        hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x", f32(2, s), NULL);
        hp_value l = hp_sum(g, hp_mul(g, w, x), 0, NULL, false);
        hp_status st = hp_graph_failed(g) ? g->err.status : hp_graph_add_output(g, l, NULL);
        hp_graph *c = st == HP_OK ? hp_graph_clone(g) : NULL;
        hp_alloc_fail_at(-1);
        hp_graph_free(c);
        hp_graph_free(g);
        if (st == HP_OK && c) break;
        cr_assert(st == HP_NOMEM || st == HP_OK, "step %ld: status %d", n, st);
        cr_assert(n < 10000);
    }
}

Test(graph, op_table_is_consistent) {
    for (int i = 0; i < HP_OP_COUNT; i++) {
        const hp_op_info *info = hp_op_get((hp_op)i);
        cr_assert(info->name && info->shape, "op %d", i);
        hp_op back;
        cr_assert_eq(hp_op_parse(info->name, &back, NULL), HP_OK);
        cr_assert_eq(back, i, "op name %s is not unique", info->name);
        cr_assert_eq(info->required & info->optional, 0, "%s", info->name);
        cr_assert(info->n_out >= 1 && info->n_out <= HP_MAX_OUTS);
        if (info->flags & HP_OPF_BACKWARD) cr_assert_null(info->grad, "%s", info->name);
    }
    hp_err e;
    hp_op op;
    cr_assert_eq(hp_op_parse("matmul", &op, &e), HP_NOT_FOUND);
    cr_assert_str_eq(e.msg, "unknown op 'matmul'");
}
