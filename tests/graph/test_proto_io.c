/* tests/graph/test_proto_io.c — hp_graph <-> hp.v1.Graph: round trips of hand-built graphs and
 * of every model builder; hostile input (truncation at every length, random and mutated bytes,
 * oversized counts, wrong attribute kinds, unknown ops and attributes, forward references and
 * cycles, bad dims and dtypes), each with an error naming the offender; the decode memory
 * budget; and an allocation fault loop over unpack + import (run the ASan build for leaks).
 */
#include "hp/build.h"
#include "hp/models.h"
#include "hp/proto_io.h"
#include "hp/text.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* ---- fixtures -------------------------------------------------------------------------------- */

static hp_graph *check_built(hp_graph *g) {
    hp_err err = {0};
    cr_assert_not(hp_graph_failed(g), "build: %s", g->err.msg);
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "verify: %s", err.msg);
    return g;
}

/* A small joint-style graph: params with init specs, data, mm/add/relu, a reduction with an
 * empty dims list, and outputs. Nodes: 0 w, 1 b, 2 x, 3 mm, 4 add, 5 relu, 6 sum. */
static hp_graph *graph_mlp(void) {
    hp_graph *g = hp_graph_new();
    cr_assert_not_null(g);
    hp_init normal = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 0.02};
    hp_init zeros = {.kind = HP_INIT_ZEROS};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "layer.weight",
                                      hp_type_make(HP_F32, 2, (int64_t[]){4, 3}), &normal);
    hp_value b = hp_build_placeholder(g, HP_INPUT_PARAM, "layer.bias",
                                      hp_type_make(HP_F32, 1, (int64_t[]){3}), &zeros);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x",
                                      hp_type_make(HP_F32, 2, (int64_t[]){2, 4}), NULL);
    hp_value y = hp_relu(g, hp_add(g, hp_mm(g, x, w), b));
    hp_value loss = hp_sum(g, y, 0, NULL, false);
    cr_assert_eq(hp_graph_add_output(g, loss, NULL), HP_OK);
    cr_assert_eq(hp_graph_add_output(g, w, NULL), HP_OK);
    return check_built(g);
}

/* Every attribute kind, a multi-output op used through output 1, a variadic op, casts and
 * collectives. */
static hp_graph *graph_kinds(void) {
    hp_graph *g = hp_graph_new();
    cr_assert_not_null(g);
    hp_init tn = {.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 0.02, .a = -0.06, .b = 0.06};
    hp_init ones = {.kind = HP_INIT_ONES};
    hp_value w = hp_build_placeholder(g, HP_INPUT_PARAM, "norm.weight",
                                      hp_type_make(HP_F32, 1, (int64_t[]){8}), &ones);
    hp_value p = hp_build_placeholder(g, HP_INPUT_PARAM, "proj.weight",
                                      hp_type_make(HP_F32, 2, (int64_t[]){8, 8}), &tn);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x",
                                      hp_type_make(HP_F32, 2, (int64_t[]){4, 8}), NULL);
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, 1e-5);
    hp_value in2[2] = {x, w};
    hp_value y = hp_build(g, HP_OP_RMS_NORM, in2, 2, &eps, 1);
    hp_value rstd = hp_out(y, 1);
    hp_value f = hp_full(g, 2, (int64_t[]){4, 8}, -0.5, HP_F32);
    hp_value cat_in[3] = {y, f, hp_mm(g, y, p)};
    hp_value c = hp_cat(g, cat_in, 3, 0);
    hp_value t = hp_transpose(g, c, 0, 1);
    hp_value bf = hp_to(g, t, HP_BF16);
    hp_attr ag[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2), hp_attr_str(HP_ATTR_GROUP, "dp")};
    hp_value gathered = hp_build(g, HP_OP_ALL_GATHER, &bf, 1, ag, 2);
    hp_value waited = hp_un(g, HP_OP_WAIT_TENSOR, gathered);
    const int64_t dims[2] = {0, -1};
    hp_value s = hp_sum(g, hp_to(g, waited, HP_F32), 2, dims, true);
    cr_assert_eq(hp_graph_add_output(g, s, NULL), HP_OK);
    cr_assert_eq(hp_graph_add_output(g, rstd, NULL), HP_OK);
    return check_built(g);
}

static void pack(const hp_graph *g, uint8_t **data, size_t *len) {
    hp_err err = {0};
    cr_assert_eq(hp_graph_pack(g, data, len, &err), HP_OK, "pack: %s", err.msg);
}

static void assert_round_trip(const hp_graph *g, const char *what) {
    uint8_t *data, *again;
    size_t len, len2;
    hp_graph *back = NULL;
    hp_err err = {0};
    pack(g, &data, &len);
    cr_assert_eq(hp_graph_unpack(data, len, &back, &err), HP_OK, "%s: unpack: %s", what, err.msg);
    cr_assert(hp_graph_eq(g, back), "%s: round trip differs", what);
    pack(back, &again, &len2); /* deterministic encoding */
    cr_assert(len == len2 && memcmp(data, again, len) == 0, "%s: re-encoding differs", what);
    hp_free(again);
    hp_free(data);
    hp_graph_free(back);
}

/* ---- round trips ----------------------------------------------------------------------------- */

Test(proto_io, round_trip_hand_built) {
    hp_graph *g = graph_mlp();
    assert_round_trip(g, "mlp");
    hp_graph_free(g);
    g = graph_kinds();
    assert_round_trip(g, "kinds");
    hp_graph_free(g);
}

Test(proto_io, round_trip_empty_graph_bytes_are_refused_without_version) {
    hp_graph *g = NULL;
    hp_err err = {0};
    /* zero bytes decode to an all-default message: format_version 0 */
    cr_assert_eq(hp_graph_unpack(NULL, 0, &g, &err), HP_INVALID);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "format_version"), "%s", err.msg);
}

static hp_model_spec spec(const char *text) {
    hp_model_spec s;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse(text, &s, &err), HP_OK, "%s: %s", text, err.msg);
    return s;
}

/* Every model builder and flavor (graphs carry shapes, not weights, so even 405B is cheap),
 * plus small overrides: the joint graph survives the wire, and decoding it stays well inside
 * the memory budget. */
Test(proto_io, round_trip_every_model) {
    hp_model_spec specs[8];
    specs[0] = spec("llama3:debugmodel");
    specs[1] = spec("llama3:8B");
    specs[2] = spec("llama3:70B");
    specs[3] = spec("llama3:405B");
    specs[4] = spec("llama3:debugmodel"); /* tiny, grouped-query */
    specs[4].dim = 64, specs[4].n_layers = 2, specs[4].n_heads = 4, specs[4].n_kv_heads = 2;
    specs[4].ffn_hidden = 96, specs[4].vocab = 128, specs[4].batch = 2, specs[4].seq = 16;
    specs[5] = spec("mlp");
    specs[6] = spec("mlp:tiny");
    specs[7] = spec("mlp:tiny");
    specs[7].n_layers = 5;
    for (size_t i = 0; i < HP_ARRAY_LEN(specs); i++) {
        char what[2 * HP_MODEL_NAME_MAX + 2];
        hp_graph *g = NULL;
        hp_err err = {0};
        snprintf(what, sizeof what, "%.31s:%.31s", specs[i].family, specs[i].flavor);
        cr_assert_eq(hp_model_build_joint(&specs[i], &g, &err), HP_OK, "%s: %s", what, err.msg);
        assert_round_trip(g, what);

        uint8_t *data;
        size_t len;
        pack(g, &data, &len);
        hp_proto_alloc a;
        hp_proto_alloc_init(&a, len);
        Hp__V1__Graph *m = hp__v1__graph__unpack(&a.base, len, data);
        cr_assert_not_null(m);
        double ratio = (double)a.used / (double)len;
        cr_log_info("%s: %d nodes, %zu bytes, decode %.1fx", what, g->n_nodes, len, ratio);
        cr_assert_lt(ratio, HP_PROTO_DECODE_FACTOR / 2.0, "%s: decode takes %.1fx", what, ratio);
        hp__v1__graph__free_unpacked(m, &a.base);
        hp_free(data);
        hp_graph_free(g);
    }
}

/* ---- hostile messages, built field by field -------------------------------------------------- */

/* A valid graph exported to a message the test may edit (shape arrays are copied so that
 * editing them leaves the graph alone). */
typedef struct fixture {
    hp_graph *g;
    hp_arena arena;
    Hp__V1__Graph *m;
} fixture;

static void fixture_init(fixture *f, hp_graph *(*make)(void)) {
    hp_err err = {0};
    f->g = make();
    hp_arena_init(&f->arena);
    cr_assert_eq(hp_graph_export(f->g, &f->arena, &f->m, &err), HP_OK, "%s", err.msg);
    for (size_t i = 0; i < f->m->n_nodes; i++) {
        Hp__V1__Node *n = f->m->nodes[i];
        for (size_t k = 0; k < n->n_outputs; k++)
            if (n->outputs[k]->n_shape)
                n->outputs[k]->shape = hp_arena_memdup(&f->arena, n->outputs[k]->shape,
                                                       n->outputs[k]->n_shape * sizeof(int64_t));
    }
}

static void fixture_fini(fixture *f) {
    hp_arena_fini(&f->arena);
    hp_graph_free(f->g);
}

/* Imports the (edited) message both directly and through bytes; both must fail with `want`
 * and a message containing every one of the NULL-terminated substrings. */
static void expect_import_error(fixture *f, hp_status want, ...) {
    hp_graph *g = NULL;
    hp_err err = {0}, err2 = {0};
    hp_status s = hp_graph_import(f->m, &g, &err);
    cr_assert_null(g);
    cr_assert_eq(s, want, "status %s, want %s: %s", hp_status_str(s), hp_status_str(want), err.msg);

    size_t len = hp__v1__graph__get_packed_size(f->m);
    uint8_t *buf = hp_malloc(len ? len : 1);
    cr_assert_not_null(buf);
    hp__v1__graph__pack(f->m, buf);
    s = hp_graph_unpack(buf, len, &g, &err2);
    hp_free(buf);
    cr_assert_null(g);
    cr_assert_eq(s, want, "bytes: status %s: %s", hp_status_str(s), err2.msg);
    cr_assert_str_eq(err.msg, err2.msg);

    va_list ap;
    va_start(ap, want);
    for (const char *sub; (sub = va_arg(ap, const char *));)
        cr_assert(strstr(err.msg, sub), "error '%s' lacks '%s'", err.msg, sub);
    va_end(ap);
}

#define EXPECT(f, status, ...) expect_import_error(f, status, __VA_ARGS__, (const char *)NULL)

static Hp__V1__Node *node(fixture *f, int i) {
    return f->m->nodes[i];
}

Test(proto_io_bad, unknown_op) {
    fixture f;
    fixture_init(&f, graph_mlp);
    node(&f, 5)->op = "foo";
    EXPECT(&f, HP_NOT_FOUND, "node 5: unknown op 'foo'");
    node(&f, 5)->op = "";
    EXPECT(&f, HP_INVALID, "node 5: no op name");
    node(&f, 5)->op = "m\x01m";
    EXPECT(&f, HP_NOT_FOUND, "node 5: unknown op 'm\\x01m'");
    fixture_fini(&f);
}

Test(proto_io_bad, forward_refs_and_cycles) {
    fixture f;
    fixture_init(&f, graph_mlp);
    Hp__V1__ValueRef *r = node(&f, 4)->inputs[1]; /* add(mm, b) */
    r->node = 6;
    EXPECT(&f, HP_INVALID, "node 4 (add): input 1 refers to node 6",
           "forward reference or a cycle");
    r->node = 4; /* itself */
    EXPECT(&f, HP_INVALID, "node 4 (add): input 1 refers to node 4");
    r->node = -1;
    EXPECT(&f, HP_INVALID, "node 4 (add): input 1 refers to node -1");
    r->node = 1 << 30;
    EXPECT(&f, HP_INVALID, "refers to node 1073741824");
    r->node = 1;
    r->output = 1;
    EXPECT(&f, HP_INVALID, "node 4 (add): input 1 refers to output 1 of node 1 (placeholder)");
    r->output = -3;
    EXPECT(&f, HP_INVALID, "refers to output -3");
    fixture_fini(&f);
}

Test(proto_io_bad, graph_outputs) {
    fixture f;
    fixture_init(&f, graph_mlp);
    f.m->outputs[1]->node = 7;
    EXPECT(&f, HP_INVALID, "graph: output 1 refers to node 7");
    f.m->outputs[1]->node = 0;
    f.m->outputs[1]->output = 2;
    EXPECT(&f, HP_INVALID, "graph: output 1 refers to output 2 of node 0");
    fixture_fini(&f);
}

Test(proto_io_bad, arity) {
    fixture f;
    fixture_init(&f, graph_mlp);
    node(&f, 3)->n_inputs = 1; /* mm with one input */
    EXPECT(&f, HP_INVALID, "node 3 (mm): 1 inputs, the op takes 2");
    node(&f, 3)->n_inputs = 2;
    node(&f, 3)->n_outputs = 0;
    EXPECT(&f, HP_INVALID, "node 3 (mm): 0 outputs, the op has 1");
    fixture_fini(&f);
}

Test(proto_io_bad, attributes) {
    fixture f;
    fixture_init(&f, graph_mlp);
    Hp__V1__Node *sum = node(&f, 6);
    cr_assert_str_eq(sum->op, "sum");
    Hp__V1__Attribute *a = sum->attrs[0];
    cr_assert_str_eq(a->name, "dims");
    Hp__V1__IntList *l = a->ints; /* the value union is overwritten below */

    a->name = "bogus";
    EXPECT(&f, HP_NOT_FOUND, "node 6 (sum): unknown attribute 'bogus'");
    a->name = "perm"; /* a real key, not one sum takes */
    EXPECT(&f, HP_INVALID, "node 6 (sum): op 'sum' takes no attribute 'perm'");
    a->name = "keepdim"; /* now keepdim twice */
    a->value_case = HP__V1__ATTRIBUTE__VALUE_INT_VALUE;
    a->int_value = 0;
    EXPECT(&f, HP_INVALID, "duplicate attribute 'keepdim'");
    sum->attrs[1]->name = "dims"; /* dims given as an int */
    EXPECT(&f, HP_INVALID, "node 6 (sum): attribute 'dims' must be an int list, got an int");
    a->name = "dims";
    a->value_case = HP__V1__ATTRIBUTE__VALUE_INTS;
    a->ints = l;
    sum->attrs[1]->name = "keepdim";
    sum->attrs[1]->value_case = HP__V1__ATTRIBUTE__VALUE_FLOAT_VALUE;
    EXPECT(&f, HP_INVALID, "attribute 'keepdim' must be an int, got a float");
    sum->attrs[1]->value_case = HP__V1__ATTRIBUTE__VALUE__NOT_SET;
    EXPECT(&f, HP_INVALID, "attribute 'keepdim' must be an int, got no value");
    sum->attrs[1]->value_case = HP__V1__ATTRIBUTE__VALUE_INT_VALUE;

    int64_t nine[9] = {0};
    l->values = nine;
    l->n_values = 9;
    EXPECT(&f, HP_LIMIT, "node 6 (sum): attribute 'dims': 9 values, over the limit of 8");
    l->n_values = 0;
    sum->n_attrs = 1; /* keepdim is optional */
    a->name = "keepdim";
    a->value_case = HP__V1__ATTRIBUTE__VALUE_INT_VALUE;
    EXPECT(&f, HP_INVALID, "node 6 (sum): missing attribute 'dims'");
    fixture_fini(&f);
}

Test(proto_io_bad, placeholder_attributes) {
    fixture f;
    fixture_init(&f, graph_mlp);
    Hp__V1__Node *w = node(&f, 0);
    Hp__V1__Attribute *fqn = NULL, *init = NULL;
    for (size_t i = 0; i < w->n_attrs; i++) {
        if (!strcmp(w->attrs[i]->name, "fqn")) fqn = w->attrs[i];
        if (!strcmp(w->attrs[i]->name, "init")) init = w->attrs[i];
    }
    cr_assert(fqn && init);
    char long_name[HP_MAX_STR + 10];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    fqn->str = long_name;
    EXPECT(&f, HP_LIMIT, "node 0 (placeholder): attribute 'fqn'", "over the limit of 255");
    fqn->str = "bad name";
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): attribute 'fqn'", "bad character (byte 0x20");
    fqn->str = "layer.weight";

    Hp__V1__Attribute *kind = w->attrs[0];
    cr_assert_str_eq(kind->name, "kind");
    kind->int_value = 7; /* a range the verifier owns */
    EXPECT(&f, HP_INVALID, "node 0 (placeholder)");
    kind->int_value = HP_INPUT_DATA; /* a data input with an init spec, before the params */
    EXPECT(&f, HP_INVALID, "node 0 (placeholder)");
    kind->int_value = HP_INPUT_PARAM;

    init->init->kind = 99;
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): attribute 'init': unknown init kind 99");
    init->init->kind = HP__V1__INIT_KIND__INIT_NORMAL;
    init->init->std = -1;
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): attribute 'init'");
    fixture_fini(&f);
}

Test(proto_io_bad, types_and_dims) {
    fixture f;
    fixture_init(&f, graph_mlp);
    Hp__V1__TensorType *t = node(&f, 0)->outputs[0]; /* w f32[4,3] */
    t->shape[1] = -5;
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): output 0: dim 1 is -5");
    t->shape[1] = HP_MAX_DIM + 1;
    EXPECT(&f, HP_LIMIT, "node 0 (placeholder): output 0: dim 1 is 1099511627777");
    t->shape[0] = (int64_t)1 << 30;
    t->shape[1] = (int64_t)1 << 30; /* each dim fine, numel 2^60 is not */
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): output 0");
    t->shape[0] = 4;
    t->shape[1] = 3;

    int64_t big_rank[HP_MAX_RANK + 1];
    for (int i = 0; i <= HP_MAX_RANK; i++) big_rank[i] = 1;
    int64_t *saved = t->shape;
    t->shape = big_rank;
    t->n_shape = HP_MAX_RANK + 1;
    EXPECT(&f, HP_LIMIT, "node 0 (placeholder): output 0: rank 9 is over the limit of 8");
    t->shape = saved;
    t->n_shape = 2;

    t->dtype = 42;
    EXPECT(&f, HP_INVALID, "node 0 (placeholder): output 0: unknown dtype 42");
    t->dtype = HP__V1__DTYPE__DTYPE_UNSPECIFIED;
    EXPECT(&f, HP_INVALID, "unknown dtype 0");
    t->dtype = HP__V1__DTYPE__DTYPE_F32;

    /* a stored type that disagrees with the shape rule: the verifier names the node */
    node(&f, 3)->outputs[0]->shape[1] = 5;
    EXPECT(&f, HP_INVALID, "node 3 (mm)");
    fixture_fini(&f);
}

Test(proto_io_bad, format_version) {
    fixture f;
    fixture_init(&f, graph_mlp);
    f.m->format_version = 0;
    EXPECT(&f, HP_INVALID, "graph: format_version is 0");
    f.m->format_version = HP_GRAPH_FORMAT_VERSION + 1;
    EXPECT(&f, HP_UNSUPPORTED, "is newer than this build reads");
    fixture_fini(&f);
}

/* Counts over their bounds are refused before the arrays are touched (message level: a peer
 * cannot send these cheaply, but an in-process caller could). */
Test(proto_io_bad, oversized_counts) {
    fixture f;
    fixture_init(&f, graph_mlp);
    hp_graph *g = NULL;
    hp_err err = {0};

    size_t n = f.m->n_nodes;
    f.m->n_nodes = (size_t)HP_MAX_NODES + 1;
    cr_assert_eq(hp_graph_import(f.m, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "graph: 4194305 nodes, over the limit"), "%s", err.msg);
    f.m->n_nodes = n;

    f.m->n_outputs = (size_t)1 << 40;
    cr_assert_eq(hp_graph_import(f.m, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "outputs, over the limit"), "%s", err.msg);
    f.m->n_outputs = 2;

    node(&f, 4)->n_inputs = (size_t)HP_MAX_INPUTS + 1;
    cr_assert_eq(hp_graph_import(f.m, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "node 4 (add): 1025 inputs, over the limit of 1024"), "%s", err.msg);
    node(&f, 4)->n_inputs = 2;

    node(&f, 4)->n_attrs = 1000;
    cr_assert_eq(hp_graph_import(f.m, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "node 4 (add): 1000 attributes"), "%s", err.msg);
    node(&f, 4)->n_attrs = 0;

    node(&f, 4)->n_outputs = 1000;
    cr_assert_eq(hp_graph_import(f.m, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "node 4 (add): 1000 outputs"), "%s", err.msg);
    node(&f, 4)->n_outputs = 1;
    cr_assert_null(g);

    /* a variadic op over the input limit, through bytes */
    Hp__V1__ValueRef **refs = hp_arena_alloc(&f.arena, (HP_MAX_INPUTS + 1) * sizeof *refs);
    for (int i = 0; i <= HP_MAX_INPUTS; i++) refs[i] = node(&f, 4)->inputs[0];
    node(&f, 4)->op = "cat";
    node(&f, 4)->inputs = refs;
    node(&f, 4)->n_inputs = HP_MAX_INPUTS + 1;
    EXPECT(&f, HP_LIMIT, "node 4 (cat): 1025 inputs, over the limit of 1024");
    fixture_fini(&f);
}

/* ---- hostile bytes --------------------------------------------------------------------------- */

Test(proto_io_bytes, message_size_cap) {
    hp_graph *g = NULL;
    hp_err err = {0};
    static const uint8_t one = 0;
    cr_assert_eq(hp_graph_unpack(&one, HP_PROTO_MAX_BYTES + 1, &g, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "over the limit"), "%s", err.msg);
    cr_assert_eq(hp_graph_unpack(NULL, 10, &g, &err), HP_INVALID);
}

/* A length prefix far beyond the data, and an absurd varint: parse errors, nothing sized from
 * them. */
Test(proto_io_bytes, lying_lengths) {
    hp_graph *g = NULL;
    hp_err err = {0};
    /* field 2 (nodes), length-delimited, length 2^40 */
    const uint8_t huge_len[] = {0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x00};
    cr_assert_eq(hp_graph_unpack(huge_len, sizeof huge_len, &g, &err), HP_PARSE);
    cr_assert(strstr(err.msg, "graph: not a valid message"), "%s", err.msg);
    /* an 11-byte varint */
    const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cr_assert_eq(hp_graph_unpack(long_varint, sizeof long_varint, &g, &err), HP_PARSE);
    cr_assert_null(g);
}

/* A flood of empty nodes decodes to far more memory than it sends: the budget stops it. */
Test(proto_io_bytes, decode_budget) {
    size_t n = 200000, len = 2 * n;
    uint8_t *buf = hp_malloc(len);
    cr_assert_not_null(buf);
    for (size_t i = 0; i < n; i++) buf[2 * i] = 0x12, buf[2 * i + 1] = 0; /* nodes: {} */
    hp_graph *g = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_graph_unpack(buf, len, &g, &err), HP_LIMIT, "%s", err.msg);
    cr_assert(strstr(err.msg, "would take over"), "%s", err.msg);
    /* a few of them fit and fail on content instead */
    cr_assert_eq(hp_graph_unpack(buf, 20, &g, &err), HP_INVALID, "%s", err.msg);
    hp_free(buf);
}

Test(proto_io_bytes, truncated_at_every_length) {
    hp_graph *g = graph_kinds();
    uint8_t *data;
    size_t len;
    pack(g, &data, &len);
    for (size_t n = 0; n < len; n++) {
        hp_graph *back = NULL;
        hp_err err = {0};
        hp_status s = hp_graph_unpack(data, n, &back, &err);
        if (s == HP_OK) {
            /* a cut at a field boundary can be a valid, smaller graph; never the same one */
            cr_assert(!hp_graph_eq(g, back), "prefix %zu decodes to the whole graph", n);
            hp_graph_free(back);
        } else {
            cr_assert_null(back);
            cr_assert(err.msg[0], "prefix %zu: empty error message", n);
        }
    }
    hp_free(data);
    hp_graph_free(g);
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void unpack_any(const uint8_t *buf, size_t len, int *ok, int *bad) {
    hp_graph *g = NULL;
    hp_err err = {0};
    hp_status s = hp_graph_unpack(buf, len, &g, &err);
    if (s == HP_OK) {
        hp_err e2 = {0};
        cr_assert_eq(hp_graph_verify(g, &e2), HP_OK, "accepted an unverified graph: %s", e2.msg);
        hp_graph_free(g);
        ++*ok;
    } else {
        cr_assert_null(g);
        cr_assert(err.msg[0]);
        ++*bad;
    }
}

Test(proto_io_bytes, random_bytes) {
    uint64_t seed = 12345;
    uint8_t buf[512];
    int ok = 0, bad = 0;
    for (int it = 0; it < 5000; it++) {
        size_t len = rng_next(&seed) % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rng_next(&seed);
        unpack_any(buf, len, &ok, &bad);
    }
    cr_log_info("random bytes: %d accepted, %d refused", ok, bad);
}

/* Mutations of a valid encoding get deep into the importer: flipped bytes, changed varints. */
Test(proto_io_bytes, mutated_bytes) {
    hp_graph *g = graph_kinds();
    uint8_t *data;
    size_t len;
    pack(g, &data, &len);
    uint8_t *buf = hp_malloc(len);
    uint64_t seed = 777;
    int ok = 0, bad = 0;
    for (int it = 0; it < 5000; it++) {
        memcpy(buf, data, len);
        int flips = 1 + (int)(rng_next(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = rng_next(&seed) % len;
            uint64_t r = rng_next(&seed);
            buf[at] = (r & 1) ? (uint8_t)(buf[at] ^ (1u << ((r >> 1) % 8))) : (uint8_t)(r >> 8);
        }
        unpack_any(buf, len, &ok, &bad);
    }
    cr_log_info("mutated bytes: %d accepted, %d refused", ok, bad);
    cr_assert_gt(bad, 0);
    hp_free(buf);
    hp_free(data);
    hp_graph_free(g);
}

/* ---- allocation faults ----------------------------------------------------------------------- */

/* Fail the Nth allocation of unpack + import for every N until it succeeds: each failure is a
 * clean HP_NOMEM with nothing leaked (the ASan build checks that). */
Test(proto_io_faults, unpack_fault_loop) {
    hp_graph *g = graph_kinds();
    uint8_t *data;
    size_t len;
    pack(g, &data, &len);
    int failures = 0;
    for (long n = 0;; n++) {
        hp_graph *back = NULL;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_graph_unpack(data, len, &back, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            cr_assert(hp_graph_eq(g, back));
            hp_graph_free(back);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "fail at %ld: %s (%s)", n, hp_status_str(s), err.msg);
        cr_assert_null(back);
        failures++;
        cr_assert_lt(n, 100000, "unpack never succeeds");
    }
    /* the decode takes its message from one arena (a chunk per 64 KiB), the import its
     * graph: a few allocations, each failed once above */
    cr_assert_gt(failures, 3);
    hp_free(data);
    hp_graph_free(g);
}

Test(proto_io_faults, pack_fault_loop) {
    hp_graph *g = graph_kinds();
    for (long n = 0;; n++) {
        uint8_t *data = NULL;
        size_t len = 0;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_graph_pack(g, &data, &len, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            hp_free(data);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "fail at %ld: %s", n, err.msg);
        cr_assert_null(data);
    }
    hp_graph_free(g);
}

/* A graph whose builder failed is not written out. */
Test(proto_io, failed_graph_is_not_packed) {
    hp_graph *g = hp_graph_new();
    hp_value a = hp_build_placeholder(g, HP_INPUT_DATA, "a",
                                      hp_type_make(HP_F32, 2, (int64_t[]){2, 3}), NULL);
    hp_mm(g, a, a); /* [2,3] x [2,3] */
    cr_assert(hp_graph_failed(g));
    uint8_t *data = NULL;
    size_t len = 0;
    hp_err err = {0};
    cr_assert_eq(hp_graph_pack(g, &data, &len, &err), HP_INVALID);
    cr_assert_null(data);
    cr_assert(strstr(err.msg, "failed to build"), "%s", err.msg);
    hp_graph_free(g);
}

/* A compiled graph's mesh and placements survive the wire; malformed ones are refused. */
Test(proto_io, placements_round_trip) {
    const char *text = "hpir 1\nmesh dp=2 tp=2\n"
                       "%0: f32[16,8] {dp:R, tp:S(0)} = placeholder() {kind=param, fqn=\"w\"}\n"
                       "%1: f32[4,8] {dp:S(0), tp:R} = placeholder() {kind=data, fqn=\"x\"}\n"
                       "%2: f32[8,16] {dp:R, tp:S(1)} = t(%0)\n"
                       "%3: f32[4,16] {dp:S(0), tp:S(1)} = mm(%1, %2)\n"
                       "%4: f32[4] {dp:S(0), tp:P(sum)} = sum(%3) {dims=[1]}\n"
                       "%5: f32[16] {dp:P(max), tp:S(0)} = amax(%3) {dims=[0]}\n"
                       "return %4, %5\n";
    hp_graph *g = NULL, *back = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_graph_parse(text, strlen(text), &g, &err), HP_OK, "%s", err.msg);
    uint8_t *data;
    size_t len;
    cr_assert_eq(hp_graph_pack(g, &data, &len, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_unpack(data, len, &back, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_graph_eq(g, back));
    cr_assert_eq(back->mesh.ndim, 2);
    cr_assert_str_eq(back->mesh.name[1], "tp");
    hp_free(data);
    hp_graph_free(back);

    /* a placement count that is not outputs x mesh dims, a bad kind, an oversized mesh */
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Graph *m;
    cr_assert_eq(hp_graph_export(g, &arena, &m, &err), HP_OK);
    m->nodes[3]->n_placements = 1;
    cr_assert_eq(hp_graph_import(m, &back, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "node 3 (mm): 1 placements, want 2"), "%s", err.msg);
    m->nodes[3]->n_placements = 2;
    m->nodes[3]->placements[0]->kind = 9;
    cr_assert_eq(hp_graph_import(m, &back, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "kind 9 is not Replicate"), "%s", err.msg);
    m->nodes[3]->placements[0]->kind = HP__V1__PLACEMENT__KIND__SHARD;
    m->nodes[3]->placements[0]->dim = 7;
    cr_assert_eq(hp_graph_import(m, &back, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "Shard(d) with d below its rank 2"), "%s", err.msg);
    m->nodes[3]->placements[0]->dim = 1; /* valid words, but not mm's rule */
    cr_assert_eq(hp_graph_import(m, &back, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "is none of its sharding rules"), "%s", err.msg);
    m->mesh->sizes[0] = 0;
    cr_assert_eq(hp_graph_import(m, &back, &err), HP_INVALID);
    cr_assert(strstr(err.msg, "graph.mesh: mesh dim 0 (dp): size 0"), "%s", err.msg);
    hp_arena_fini(&arena);
    hp_graph_free(g);
}
