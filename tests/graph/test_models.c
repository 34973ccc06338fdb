/* tests/graph/test_models.c — the model builders: spec parsing, flavor resolution and its
 * errors, parameter counts (8B = 8,030,261,248), FQN order and init specs as torchtitan has
 * them, FLOPs per token, every builder's forward and joint graph verifying, the 405B joint
 * graph (its node count and build + autodiff + verify time are printed), and an allocation
 * fault loop. Numerics against PyTorch live in test_llama_torch.c.
 */
#include "hp/eval.h"
#include "hp/models.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static hp_model_spec spec_of(const char *text) {
    hp_model_spec s;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse(text, &s, &err), HP_OK, "%s: %s", text, err.msg);
    return s;
}

/* A small Llama for structural tests: 2 layers, GQA. */
static hp_model_spec tiny_llama(void) {
    hp_model_spec s = spec_of("llama3:debugmodel");
    s.dim = 64;
    s.n_layers = 2;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.ffn_hidden = 96;
    s.vocab = 128;
    s.batch = 2;
    s.seq = 16;
    return s;
}

static hp_graph *build(const hp_model_spec *s, bool joint) {
    hp_graph *g = NULL;
    hp_err err = {0};
    hp_status st = joint ? hp_model_build_joint(s, &g, &err) : hp_model_build(s, &g, &err);
    cr_assert_eq(st, HP_OK, "%s:%s build: %s", s->family, s->flavor, err.msg);
    cr_assert_not_null(g);
    return g;
}

static void assert_verifies(const hp_graph *g, const char *what) {
    hp_err err = {0};
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "%s: %s", what, err.msg);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- spec parsing --------------------------------------------------------------------------- */

Test(models_spec, parses_known_specs) {
    hp_model_spec s = spec_of("llama3:debugmodel");
    cr_assert_str_eq(s.family, "llama3");
    cr_assert_str_eq(s.flavor, "debugmodel");
    cr_assert_eq(s.batch, 0);
    s = spec_of("llama3:8b"); /* case-insensitive, stored canonically */
    cr_assert_str_eq(s.flavor, "8B");
    s = spec_of("llama3");
    cr_assert_str_eq(s.flavor, "debugmodel");
    s = spec_of("llama3:405B");
    cr_assert_str_eq(s.flavor, "405B");
    s = spec_of("mlp");
    cr_assert_str_eq(s.family, "mlp");
    cr_assert_str_eq(s.flavor, "small");
    s = spec_of("mlp:tiny");
    cr_assert_str_eq(s.flavor, "tiny");
}

static void assert_parse_fails(const char *text, const char *needle) {
    hp_model_spec s;
    hp_err err = {0};
    cr_assert_neq(hp_model_spec_parse(text, &s, &err), HP_OK, "'%s' parsed", text);
    cr_assert(strstr(err.msg, needle), "'%s': message '%s' lacks '%s'", text, err.msg, needle);
}

Test(models_spec, rejects_bad_specs) {
    assert_parse_fails("", "empty model spec");
    assert_parse_fails("gpt2:small", "unknown model family 'gpt2' (known: llama3, mlp)");
    assert_parse_fails("llama3:7B",
                       "unknown llama3 flavor '7B' (known: debugmodel, 8B, 70B, 405B)");
    assert_parse_fails("llama3:", "empty flavor");
    assert_parse_fails(":8B", "bad family name");
    assert_parse_fails("mlp:huge", "unknown mlp flavor 'huge'");
    assert_parse_fails("llama3:debugmodeldebugmodeldebugmodeldebugmodel", "too long");
    assert_parse_fails("llama3llama3llama3llama3llama3llama3:8B", "bad family name");
    hp_model_spec s = {0};
    hp_graph *g = NULL;
    hp_err err = {0};
    snprintf(s.family, sizeof s.family, "gpt2");
    cr_assert_eq(hp_model_build(&s, &g, &err), HP_NOT_FOUND);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "gpt2"), "%s", err.msg);
}

/* ---- resolution ----------------------------------------------------------------------------- */

Test(models_resolve, flavor_defaults_and_overrides) {
    hp_llama3_config c;
    hp_err err = {0};
    hp_model_spec s = spec_of("llama3:debugmodel");
    cr_assert_eq(hp_llama3_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(c.dim, 256);
    cr_assert_eq(c.n_layers, 6);
    cr_assert_eq(c.n_heads, 16);
    cr_assert_eq(c.n_kv_heads, 16);
    cr_assert_eq(c.ffn_hidden, 768);
    cr_assert_eq(c.vocab, 2048);
    cr_assert_eq(c.batch, 8);
    cr_assert_eq(c.seq, 2048);
    cr_assert_float_eq(c.norm_eps, 1e-5, 1e-12);
    cr_assert_float_eq(c.rope_theta, 500000.0, 1e-6);

    s = spec_of("llama3:405B");
    cr_assert_eq(hp_llama3_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(c.dim, 16384);
    cr_assert_eq(c.n_layers, 126);
    cr_assert_eq(c.n_heads, 128);
    cr_assert_eq(c.n_kv_heads, 8);
    cr_assert_eq(c.ffn_hidden, 53248);
    cr_assert_eq(c.vocab, 128256);

    s = spec_of("llama3:8B");
    s.batch = 3;
    s.seq = 100;
    s.n_layers = 2;
    s.norm_eps = 1e-6;
    s.rope_theta = 10000;
    cr_assert_eq(hp_llama3_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(c.batch, 3);
    cr_assert_eq(c.seq, 100);
    cr_assert_eq(c.n_layers, 2);
    cr_assert_eq(c.dim, 4096);
    cr_assert_eq(c.n_kv_heads, 8);
    cr_assert_float_eq(c.norm_eps, 1e-6, 1e-15);
    cr_assert_float_eq(c.rope_theta, 10000.0, 1e-9);

    /* Overriding only n_heads on a multi-head flavor keeps it multi-head. */
    s = spec_of("llama3:debugmodel");
    s.n_heads = 4;
    cr_assert_eq(hp_llama3_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(c.n_kv_heads, 4);
}

static void assert_resolve_fails(hp_model_spec s, const char *needle) {
    hp_llama3_config c;
    hp_err err = {0};
    cr_assert_neq(hp_llama3_resolve(&s, &c, &err), HP_OK, "resolved (wanted '%s')", needle);
    cr_assert(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    hp_graph *g = NULL;
    cr_assert_neq(hp_model_build(&s, &g, &err), HP_OK);
    cr_assert_null(g);
    cr_assert_eq(hp_model_flops_per_token(&s), 0.0);
}

Test(models_resolve, llama3_errors_name_the_field) {
    hp_model_spec s = spec_of("llama3:debugmodel");
#define BAD(field, value, needle)                                                                  \
    do {                                                                                           \
        hp_model_spec t = s;                                                                       \
        t.field = value;                                                                           \
        assert_resolve_fails(t, needle);                                                           \
    } while (0)
    BAD(batch, -1, "batch must be positive (got -1)");
    BAD(seq, -5, "seq must be positive");
    BAD(dim, -1, "dim must be positive");
    BAD(n_layers, -1, "n_layers must be positive");
    BAD(ffn_hidden, -1, "ffn_hidden must be positive");
    BAD(vocab, -1, "vocab must be positive");
    BAD(n_kv_heads, -2, "n_kv_heads must be positive");
    BAD(dim, 100, "dim 100 is not divisible by n_heads 16");
    BAD(n_kv_heads, 3, "n_heads 16 is not divisible by n_kv_heads 3");
    BAD(dim, 48, "head_dim = dim / n_heads = 3 must be even");
    BAD(norm_eps, -1e-5, "norm_eps must be positive");
    BAD(norm_eps, NAN, "norm_eps");
    BAD(rope_theta, INFINITY, "rope_theta");
    BAD(rope_theta, -1, "rope_theta");
    BAD(n_layers, 100000, "n_layers = 100000 exceeds");
    BAD(vocab, (int64_t)1 << 45, "vocab = 35184372088832 exceeds the IR's dim limit");
    BAD(seq, (int64_t)1 << 37, "logits [batch*seq, vocab]");
    BAD(batch, (int64_t)1 << 39, "batch * seq");
#undef BAD
    hp_model_spec t = s;
    t.dim = 65536;
    t.vocab = (int64_t)1 << 36;
    assert_resolve_fails(t, "tok_embeddings.weight [vocab, dim] has more than");
    t = s;
    snprintf(t.flavor, sizeof t.flavor, "13B");
    assert_resolve_fails(t, "unknown llama3 flavor '13B'");
    t = s;
    snprintf(t.family, sizeof t.family, "mlp");
    hp_llama3_config c;
    hp_err err = {0};
    cr_assert_neq(hp_llama3_resolve(&t, &c, &err), HP_OK);
    cr_assert(strstr(err.msg, "family 'mlp'"), "%s", err.msg);

    /* hp_llama3_build checks a hand-made config as well. */
    hp_llama3_config bad = {.dim = 64,
                            .n_layers = 1,
                            .n_heads = 3,
                            .n_kv_heads = 1,
                            .ffn_hidden = 8,
                            .vocab = 8,
                            .batch = 1,
                            .seq = 1,
                            .norm_eps = 1e-5,
                            .rope_theta = 1e4};
    hp_graph *g = NULL;
    cr_assert_neq(hp_llama3_build(&bad, &g, &err), HP_OK);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "n_heads"), "%s", err.msg);
}

Test(models_resolve, mlp_defaults_and_errors) {
    hp_mlp_config c;
    hp_err err = {0};
    hp_model_spec s = spec_of("mlp:tiny");
    s.dim = 5;
    s.ffn_hidden = 7;
    s.vocab = 3;
    s.n_layers = 1;
    cr_assert_eq(hp_mlp_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(c.in_dim, 5);
    cr_assert_eq(c.hidden, 7);
    cr_assert_eq(c.n_classes, 3);
    cr_assert_eq(c.n_layers, 1);
    cr_assert_eq(c.batch, 4);

    s = spec_of("mlp");
    s.seq = 16;
    cr_assert_neq(hp_mlp_resolve(&s, &c, &err), HP_OK);
    cr_assert(strstr(err.msg, "mlp: seq does not apply"), "%s", err.msg);
    s = spec_of("mlp");
    s.batch = -4;
    cr_assert_neq(hp_mlp_resolve(&s, &c, &err), HP_OK);
    cr_assert(strstr(err.msg, "batch must be positive"), "%s", err.msg);
    s = spec_of("mlp");
    s.n_layers = 5000;
    cr_assert_neq(hp_mlp_resolve(&s, &c, &err), HP_OK);
    cr_assert(strstr(err.msg, "n_layers"), "%s", err.msg);
}

/* ---- parameters ----------------------------------------------------------------------------- */

static int64_t params_of(const char *text) {
    hp_model_spec s = spec_of(text);
    s.batch = 1; /* parameters do not depend on the data shape */
    if (strcmp(s.family, "llama3") == 0) s.seq = 16;
    hp_graph *g = build(&s, false);
    int64_t n = hp_graph_param_count(g);
    hp_graph_free(g);
    return n;
}

Test(models_params, counts_match_torchtitan) {
    cr_assert_eq(params_of("llama3:8B"), INT64_C(8030261248));
    cr_assert_eq(params_of("llama3:debugmodel"), INT64_C(6163712));
    cr_assert_eq(params_of("llama3:70B"), INT64_C(70553706496));
    cr_assert_eq(params_of("llama3:405B"), INT64_C(405853388800));
    /* mlp small: (784+1)*256 + (256+1)*256 + (256+1)*10 */
    cr_assert_eq(params_of("mlp"), INT64_C(269322));
}

static const char *fqn_of(const hp_graph *g, int node) {
    const hp_attr *a = hp_node_attr(&g->nodes[node], HP_ATTR_FQN);
    return a ? a->s : "(none)";
}

Test(models_params, fqn_order_is_torchtitans) {
    hp_model_spec s = tiny_llama();
    hp_graph *g = build(&s, false);
    static const char *const want[] = {
        "tok_embeddings.weight",
        "layers.0.attention.wq.weight",
        "layers.0.attention.wk.weight",
        "layers.0.attention.wv.weight",
        "layers.0.attention.wo.weight",
        "layers.0.feed_forward.w1.weight",
        "layers.0.feed_forward.w2.weight",
        "layers.0.feed_forward.w3.weight",
        "layers.0.attention_norm.weight",
        "layers.0.ffn_norm.weight",
        "layers.1.attention.wq.weight",
        "layers.1.attention.wk.weight",
        "layers.1.attention.wv.weight",
        "layers.1.attention.wo.weight",
        "layers.1.feed_forward.w1.weight",
        "layers.1.feed_forward.w2.weight",
        "layers.1.feed_forward.w3.weight",
        "layers.1.attention_norm.weight",
        "layers.1.ffn_norm.weight",
        "norm.weight",
        "output.weight",
        "tokens",
        "labels",
    };
    hp_graph_inputs in = hp_graph_count_inputs(g);
    cr_assert_eq(in.n_params, 21);
    cr_assert_eq(in.n_buffers, 0);
    cr_assert_eq(in.n_data, 2);
    for (int i = 0; i < (int)HP_ARRAY_LEN(want); i++) {
        cr_assert_eq(g->nodes[i].op, HP_OP_PLACEHOLDER);
        cr_assert_str_eq(fqn_of(g, i), want[i], "placeholder %d", i);
    }
    /* Shapes as nn.Linear holds them: [out, in]. */
    int64_t wk[2] = {32, 64}, wo[2] = {64, 64}, w2[2] = {64, 96}, tok[2] = {2, 16};
    hp_type t = hp_type_make(HP_F32, 2, wk);
    cr_assert(hp_type_eq(&g->nodes[2].out[0], &t));
    t = hp_type_make(HP_F32, 2, wo);
    cr_assert(hp_type_eq(&g->nodes[4].out[0], &t));
    t = hp_type_make(HP_F32, 2, w2);
    cr_assert(hp_type_eq(&g->nodes[6].out[0], &t));
    t = hp_type_make(HP_I64, 2, tok);
    cr_assert(hp_type_eq(&g->nodes[21].out[0], &t));
    cr_assert(hp_type_eq(&g->nodes[22].out[0], &t));
    /* One output: the scalar f32 loss. */
    cr_assert_eq(g->n_outputs, 1);
    const hp_type *loss = hp_graph_type(g, g->outputs[0]);
    cr_assert_eq(loss->rank, 0);
    cr_assert_eq(loss->dtype, HP_F32);
    hp_graph_free(g);

    s = spec_of("mlp:tiny");
    g = build(&s, false);
    static const char *const mlp_want[] = {"layers.0.weight",
                                           "layers.0.bias",
                                           "layers.1.weight",
                                           "layers.1.bias",
                                           "head.weight",
                                           "head.bias",
                                           "x",
                                           "labels"};
    for (int i = 0; i < (int)HP_ARRAY_LEN(mlp_want); i++)
        cr_assert_str_eq(fqn_of(g, i), mlp_want[i], "mlp placeholder %d", i);
    hp_graph_free(g);
}

static hp_init init_of(const hp_graph *g, const char *fqn) {
    int id = hp_graph_find_fqn(g, fqn);
    cr_assert_geq(id, 0, "%s missing", fqn);
    const hp_attr *a = hp_node_attr(&g->nodes[id], HP_ATTR_INIT);
    cr_assert_not_null(a, "%s has no init", fqn);
    return a->init;
}

static void assert_trunc(hp_init in, double std, double a, double b, const char *what) {
    cr_assert_eq(in.kind, HP_INIT_TRUNC_NORMAL, "%s", what);
    cr_assert_float_eq(in.mean, 0.0, 1e-15, "%s", what);
    cr_assert_float_eq(in.std, std, 1e-15, "%s std %g", what, in.std);
    cr_assert_float_eq(in.a, a, 1e-15, "%s a %g", what, in.a);
    cr_assert_float_eq(in.b, b, 1e-15, "%s b %g", what, in.b);
}

Test(models_params, init_specs_are_torchtitans) {
    hp_model_spec s = tiny_llama();
    hp_graph *g = build(&s, false);
    hp_init e = init_of(g, "tok_embeddings.weight");
    cr_assert_eq(e.kind, HP_INIT_NORMAL);
    cr_assert_float_eq(e.std, 1.0, 1e-15);
    for (int l = 0; l < 2; l++) {
        char fqn[128];
        double depth = 0.02 / sqrt(2.0 * (l + 1));
        static const char *const plain[] = {"attention.wq", "attention.wk", "attention.wv",
                                            "feed_forward.w1"};
        static const char *const deep[] = {"attention.wo", "feed_forward.w2", "feed_forward.w3"};
        for (int i = 0; i < 4; i++) {
            snprintf(fqn, sizeof fqn, "layers.%d.%s.weight", l, plain[i]);
            assert_trunc(init_of(g, fqn), 0.02, -2, 2, fqn);
        }
        for (int i = 0; i < 3; i++) {
            snprintf(fqn, sizeof fqn, "layers.%d.%s.weight", l, deep[i]);
            assert_trunc(init_of(g, fqn), depth, -2, 2, fqn);
        }
        snprintf(fqn, sizeof fqn, "layers.%d.attention_norm.weight", l);
        cr_assert_eq(init_of(g, fqn).kind, HP_INIT_ONES);
        snprintf(fqn, sizeof fqn, "layers.%d.ffn_norm.weight", l);
        cr_assert_eq(init_of(g, fqn).kind, HP_INIT_ONES);
    }
    cr_assert_eq(init_of(g, "norm.weight").kind, HP_INIT_ONES);
    assert_trunc(init_of(g, "output.weight"), 0.125, -0.375, 0.375, "output.weight");
    hp_graph_free(g);

    s = spec_of("mlp:tiny");
    g = build(&s, false);
    hp_init w = init_of(g, "layers.0.weight"); /* fan_in 8 */
    cr_assert_eq(w.kind, HP_INIT_UNIFORM);
    cr_assert_float_eq(w.b, 1 / sqrt(8.0), 1e-15);
    cr_assert_float_eq(w.a, -1 / sqrt(8.0), 1e-15);
    hp_init b = init_of(g, "head.bias"); /* fan_in 16 */
    cr_assert_float_eq(b.b, 0.25, 1e-15);
    hp_graph_free(g);
}

/* ---- FLOPs ---------------------------------------------------------------------------------- */

Test(models_flops, torchtitan_convention) {
    /* 8B, seq 8192: 6 * (8030261248 - 128256*4096) + 12 * 32 * 4096 * 8192 */
    hp_model_spec s = spec_of("llama3:8B");
    cr_assert_float_eq(hp_model_flops_per_token(&s), 57914449920.0, 0.5);
    s.seq = 2048;
    cr_assert_float_eq(hp_model_flops_per_token(&s),
                       6.0 * (8030261248.0 - 525336576.0) + 12.0 * 32 * 4096 * 2048, 0.5);
    s = spec_of("mlp");
    cr_assert_float_eq(hp_model_flops_per_token(&s), 6.0 * 269322, 0.5);
    hp_model_spec none = {0};
    cr_assert_eq(hp_model_flops_per_token(&none), 0.0);
}

/* ---- every builder verifies, forward and joint ----------------------------------------------- */

static void check_builder(hp_model_spec s, bool joint) {
    char what[96];
    snprintf(what, sizeof what, "%s:%s", s.family, s.flavor);
    hp_graph *f = build(&s, false);
    assert_verifies(f, what);
    hp_graph_inputs in = hp_graph_count_inputs(f);
    if (joint) {
        hp_graph *g = build(&s, true);
        assert_verifies(g, what);
        cr_assert_eq(g->n_outputs, 1 + in.n_params, "%s: outputs", what);
        for (int i = 0; i < in.n_params; i++) {
            const hp_type *gt = hp_graph_type(g, g->outputs[1 + i]);
            cr_assert_not_null(gt);
            cr_assert(hp_type_eq(gt, &g->nodes[i].out[0]), "%s: gradient %d (%s) type", what, i,
                      fqn_of(g, i));
        }
        hp_graph_free(g);
    }
    hp_graph_free(f);
}

Test(models_verify, every_builder_forward_and_joint) {
    check_builder(tiny_llama(), true);
    check_builder(spec_of("llama3:debugmodel"), true);
    check_builder(spec_of("llama3:8B"), true);
    check_builder(spec_of("llama3:70B"), false);
    check_builder(spec_of("mlp"), true);
    check_builder(spec_of("mlp:tiny"), true);
    hp_model_spec s = spec_of("mlp:tiny");
    s.n_layers = 1;
    check_builder(s, true);
    s = tiny_llama();
    s.n_kv_heads = 4; /* plain multi-head */
    s.n_layers = 1;
    check_builder(s, true);
}

Test(models_verify, llama3_405b_joint_builds_and_verifies, .timeout = 600) {
    hp_model_spec s = spec_of("llama3:405B");
    hp_graph *g = NULL;
    hp_err err = {0};
    double t0 = now_s();
    cr_assert_eq(hp_model_build(&s, &g, &err), HP_OK, "%s", err.msg);
    int fwd_nodes = g->n_nodes;
    double t1 = now_s();
    cr_assert_eq(hp_autodiff(g, g->outputs[0], &err), HP_OK, "%s", err.msg);
    double t2 = now_s();
    cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "%s", err.msg);
    double t3 = now_s();
    cr_assert_eq(g->n_outputs, 1 + 126 * 9 + 3);
    fprintf(stderr,
            "llama3:405B joint graph: nodes=%d (forward %d) build=%.3fs autodiff=%.3fs "
            "verify=%.3fs total=%.3fs\n",
            g->n_nodes, fwd_nodes, t1 - t0, t2 - t1, t3 - t2, t3 - t0);
    hp_graph_free(g);
}

/* ---- MLP numerics -----------------------------------------------------------------------------
 */

/* The MLP's loss by hand (f64 loops over the same inputs): checks the builder's wiring
 * (addmm orientation, relu placement, mean over the batch). Its gradients are checked by
 * central differences on the same loops. */
static double mlp_loss_by_hand(const hp_mlp_config *c, const hp_tensor *in) {
    double h[64][64], next[64][64];
    int64_t width = c->in_dim, t = 0;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t j = 0; j < c->in_dim; j++)
            h[b][j] = in[2 * c->n_layers + 2].data[b * c->in_dim + j];
    for (int64_t l = 0; l <= c->n_layers; l++) {
        const hp_tensor *w = &in[2 * l], *bias = &in[2 * l + 1];
        int64_t out = w->type.shape[0];
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t o = 0; o < out; o++) {
                double acc = bias->data[o];
                for (int64_t j = 0; j < width; j++) acc += h[b][j] * w->data[o * width + j];
                next[b][o] = l < c->n_layers && acc < 0 ? 0 : acc;
            }
        memcpy(h, next, sizeof h);
        width = out;
    }
    double loss = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        double m = -INFINITY, z = 0;
        for (int64_t k = 0; k < width; k++) m = fmax(m, h[b][k]);
        for (int64_t k = 0; k < width; k++) z += exp(h[b][k] - m);
        t = (int64_t)in[2 * c->n_layers + 3].data[b];
        loss -= h[b][t] - m - log(z);
    }
    return loss / (double)c->batch;
}

Test(models_numerics, mlp_matches_hand_computation) {
    hp_model_spec s = spec_of("mlp:tiny");
    hp_mlp_config c;
    hp_err err = {0};
    cr_assert_eq(hp_mlp_resolve(&s, &c, &err), HP_OK, "%s", err.msg);
    cr_assert(c.batch <= 64 && c.in_dim <= 64 && c.hidden <= 64 && c.n_classes <= 64 &&
              c.n_layers <= 6); /* the hand computation's fixed buffers */
    hp_graph *g = build(&s, true);
    int n_in = hp_graph_count_inputs(g).n_params + 2;
    hp_tensor in[16] = {0};
    uint64_t x = 12345;
    for (int i = 0; i < n_in; i++) {
        cr_assert_eq(hp_tensor_alloc(&in[i], g->nodes[i].out[0], &err), HP_OK, "%s", err.msg);
        for (int64_t k = 0; k < hp_type_numel(&in[i].type); k++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            double u = (double)(x >> 11) * 0x1.0p-53;
            in[i].data[k] = i == n_in - 1 ? (double)(int64_t)(u * (double)c.n_classes) : 2 * u - 1;
        }
    }
    hp_tensor out[16] = {0};
    hp_eval_opts opts = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, in, n_in, &opts, out, &err), HP_OK, "%s", err.msg);
    double want = mlp_loss_by_hand(&c, in);
    cr_assert_float_eq(out[0].data[0], want, 1e-12 * fabs(want), "loss %.17g vs %.17g",
                       out[0].data[0], want);
    for (int i = 0; i < n_in - 2; i++) {
        for (int64_t k = 0; k < hp_type_numel(&in[i].type); k += 3) {
            double v = in[i].data[k], h = 1e-6;
            in[i].data[k] = v + h;
            double up = mlp_loss_by_hand(&c, in);
            in[i].data[k] = v - h;
            double down = mlp_loss_by_hand(&c, in);
            in[i].data[k] = v;
            double fd = (up - down) / (2 * h), ad = out[1 + i].data[k];
            cr_assert(fabs(fd - ad) <= 1e-6 * fmax(1, fabs(fd)),
                      "%s[%lld]: autodiff %.9g vs fd %.9g", fqn_of(g, i), (long long)k, ad, fd);
        }
    }
    for (int i = 0; i < g->n_outputs; i++) hp_tensor_free(&out[i]);
    for (int i = 0; i < n_in; i++) hp_tensor_free(&in[i]);
    hp_graph_free(g);
}

/* ---- allocation failures --------------------------------------------------------------------- */

/* Fails each allocation of a joint build in turn: every run either succeeds or reports an
 * error, and (under ASan) leaks nothing. */
Test(models_faults, every_failed_allocation_is_reported) {
    hp_model_spec s = tiny_llama();
    s.n_layers = 1;
    hp_alloc_fail_at(-1);
    hp_graph *g = build(&s, true);
    long total = hp_alloc_fail_at(-1);
    hp_graph_free(g);
    cr_assert_gt(total, 0);
    for (long n = 0; n < total; n++) {
        hp_err err = {0};
        hp_graph *h = NULL;
        hp_alloc_fail_at(n);
        hp_status st = hp_model_build_joint(&s, &h, &err);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            hp_graph_free(h);
            continue;
        }
        cr_assert_null(h, "allocation %ld", n);
        cr_assert(err.msg[0], "allocation %ld failed without a message", n);
    }
}
