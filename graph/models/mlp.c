/* graph/models/mlp.c — a small MLP classifier: the second model family, small enough for
 * exhaustive numeric checks and fast end-to-end tests of the runtime.
 *
 *   h = x                                                   [B, in]
 *   n_layers times:  h = relu(addmm(b_i, h, t(W_i)))        [B, hidden]
 *   logits = addmm(head.bias, h, t(head.weight))            [B, C]
 *   loss = nll_loss_forward(_log_softmax(logits), labels), mean over B
 *
 * Parameters (nn.Linear layout, weight [out, in]): layers.{i}.weight, layers.{i}.bias, ...,
 * head.weight, head.bias, with nn.Linear's default init (uniform ±1/sqrt(fan_in) for weight
 * and bias). Data: `x` f32 [B, in] and `labels` i64 [B].
 *
 * Spec fields used: batch, dim (input features), ffn_hidden (hidden width), n_layers (hidden
 * layers), vocab (classes). The attention-only fields (seq, n_heads, n_kv_heads, norm_eps,
 * rope_theta) are refused rather than ignored.
 */
#include "hp/build.h"
#include "hp/models.h"

#include "graph/models/models_internal.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>

typedef struct mlp_flavor {
    const char *name;
    hp_mlp_config cfg;
} mlp_flavor;

static const mlp_flavor flavors[] = {
    /* MNIST-shaped: 784 pixels, 10 classes. */
    {"small", {.batch = 64, .in_dim = 784, .hidden = 256, .n_classes = 10, .n_layers = 2}},
    {"tiny", {.batch = 4, .in_dim = 8, .hidden = 16, .n_classes = 4, .n_layers = 2}},
};

const char *hp__mlp_flavor_name(int i) {
    return i >= 0 && i < (int)HP_ARRAY_LEN(flavors) ? flavors[i].name : NULL;
}

#define MLP_MAX_LAYERS 1024

static hp_status check_config(const hp_mlp_config *c, hp_err *err) {
    const struct {
        const char *name;
        int64_t v;
    } fields[] = {{"batch", c->batch},
                  {"in_dim", c->in_dim},
                  {"hidden", c->hidden},
                  {"n_classes", c->n_classes},
                  {"n_layers", c->n_layers}};
    for (size_t i = 0; i < HP_ARRAY_LEN(fields); i++) {
        if (fields[i].v <= 0)
            return hp_errf(err, HP_INVALID, "mlp: %s must be positive (got %lld)", fields[i].name,
                           (long long)fields[i].v);
        if (fields[i].v > HP_MAX_DIM)
            return hp_errf(err, HP_LIMIT, "mlp: %s = %lld exceeds the IR's dim limit %lld",
                           fields[i].name, (long long)fields[i].v, (long long)HP_MAX_DIM);
    }
    if (c->n_layers > MLP_MAX_LAYERS)
        return hp_errf(err, HP_LIMIT, "mlp: n_layers = %lld exceeds the limit %d",
                       (long long)c->n_layers, MLP_MAX_LAYERS);
    int64_t widest = c->in_dim > c->hidden ? c->in_dim : c->hidden, n;
    if (c->n_classes > widest) widest = c->n_classes;
    if (!hp__mul_within(c->batch, widest, HP_MAX_NUMEL, &n) ||
        !hp__mul_within(widest, widest, HP_MAX_NUMEL, &n))
        return hp_errf(err, HP_LIMIT, "mlp: a tensor has more than the IR's %lld elements",
                       (long long)HP_MAX_NUMEL);
    return HP_OK;
}

hp_status hp_mlp_resolve(const hp_model_spec *spec, hp_mlp_config *cfg, hp_err *err) {
    if (spec->family[0] && strcasecmp(spec->family, "mlp") != 0)
        return hp_errf(err, HP_INVALID, "mlp: spec is for family '%.*s'", HP_MODEL_NAME_MAX,
                       spec->family);
    const struct {
        const char *name;
        bool set;
    } unused[] = {{"seq", spec->seq != 0},
                  {"n_heads", spec->n_heads != 0},
                  {"n_kv_heads", spec->n_kv_heads != 0},
                  {"norm_eps", spec->norm_eps != 0},
                  {"rope_theta", spec->rope_theta != 0}};
    for (size_t i = 0; i < HP_ARRAY_LEN(unused); i++)
        if (unused[i].set)
            return hp_errf(err, HP_INVALID, "mlp: %s does not apply to an MLP", unused[i].name);
    int idx;
    char flavor[HP_MODEL_NAME_MAX + 1];
    snprintf(flavor, sizeof flavor, "%.*s", HP_MODEL_NAME_MAX, spec->flavor);
    HP_TRY(hp__flavor_find("mlp", hp__mlp_flavor_name, flavor, &idx, err));
    hp_mlp_config c = flavors[idx].cfg;
    HP_TRY(hp__override_i64("mlp", "batch", spec->batch, &c.batch, err));
    HP_TRY(hp__override_i64("mlp", "dim (input features)", spec->dim, &c.in_dim, err));
    HP_TRY(hp__override_i64("mlp", "ffn_hidden (hidden width)", spec->ffn_hidden, &c.hidden, err));
    HP_TRY(hp__override_i64("mlp", "n_layers", spec->n_layers, &c.n_layers, err));
    HP_TRY(hp__override_i64("mlp", "vocab (classes)", spec->vocab, &c.n_classes, err));
    HP_TRY(check_config(&c, err));
    *cfg = c;
    return HP_OK;
}

/* nn.Linear's default init for a layer with fan_in inputs: kaiming_uniform(a=sqrt(5)) on the
 * weight and uniform on the bias both come to ±1/sqrt(fan_in). */
static hp_init linear_init(int64_t fan_in) {
    double bound = 1.0 / sqrt((double)fan_in);
    return (hp_init){.kind = HP_INIT_UNIFORM, .a = -bound, .b = bound};
}

static void linear_params(hp_graph *g, const char *prefix, int64_t in, int64_t out, hp_value *w,
                          hp_value *bias) {
    char fqn[HP_MAX_STR];
    hp_init init = linear_init(in);
    snprintf(fqn, sizeof fqn, "%s.weight", prefix);
    *w = hp_build_placeholder(g, HP_INPUT_PARAM, fqn, hp_type_make(HP_F32, 2, (int64_t[]){out, in}),
                              &init);
    snprintf(fqn, sizeof fqn, "%s.bias", prefix);
    *bias = hp_build_placeholder(g, HP_INPUT_PARAM, fqn, hp_type_make(HP_F32, 1, &out), &init);
}

hp_status hp_mlp_build(const hp_mlp_config *cfg, hp_graph **out, hp_err *err) {
    *out = NULL;
    HP_TRY(check_config(cfg, err));
    const int64_t B = cfg->batch, L = cfg->n_layers;
    hp_value *w = hp_calloc((size_t)(L + 1) * 2, sizeof *w); /* (weight, bias) per layer */
    hp_graph *g = hp_graph_new();
    if (!w || !g) {
        hp_free(w);
        hp_graph_free(g);
        return hp_errf(err, HP_NOMEM, "mlp: out of memory starting the graph");
    }

    int64_t in = cfg->in_dim;
    for (int64_t i = 0; i < L; i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "layers.%lld", (long long)i);
        linear_params(g, prefix, in, cfg->hidden, &w[2 * i], &w[2 * i + 1]);
        in = cfg->hidden;
    }
    linear_params(g, "head", in, cfg->n_classes, &w[2 * L], &w[2 * L + 1]);
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, "x",
                                      hp_type_make(HP_F32, 2, (int64_t[]){B, cfg->in_dim}),
                                      NULL); /* [B, in] */
    hp_value labels =
        hp_build_placeholder(g, HP_INPUT_DATA, "labels", hp_type_make(HP_I64, 1, &B), NULL);

    hp_value h = x;
    for (int64_t i = 0; i <= L; i++) {
        hp_value in3[3] = {w[2 * i + 1], h, hp_t(g, w[2 * i])};
        h = hp_build(g, HP_OP_ADDMM, in3, 3, NULL, 0); /* [B, hidden] or [B, C] */
        if (i < L) h = hp_relu(g, h);
    }
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, h, hp_attr_int(HP_ATTR_DIM, 1)); /* [B, C] */
    hp_value nll_in[2] = {logp, labels};
    hp_attr nll_attrs[2] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_MEAN),
                            hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
    hp_value loss = hp_build(g, HP_OP_NLL_LOSS_FORWARD, nll_in, 2, nll_attrs, 2); /* [] */
    hp_free(w);

    hp_status s = hp_graph_status(g, err);
    if (s == HP_OK) s = hp_graph_set_outputs(g, &loss, 1, err);
    if (s != HP_OK) {
        hp_err_prefix(err, "mlp");
        hp_graph_free(g);
        return s;
    }
    *out = g;
    return HP_OK;
}
