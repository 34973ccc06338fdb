/* graph/models/llama3.c — the Llama-3 forward graph, as torchtitan defines the model.
 *
 * Flavors are torchtitan's (debugmodel, 8B, 70B, 405B); batch and sequence defaults are its
 * train configs' local batch and seq_len (debug_model.toml: 8 x 2048; llama3_8b.toml:
 * 1 x 8192; llama3_70b.toml: 8 x 8192; llama3_405b.toml: 2 x 8192). Every field can be
 * overridden through hp_model_spec.
 *
 * The graph reads as make_fx traces torchtitan's Transformer (f32 throughout):
 *
 *   h = embedding(tok_embeddings, tokens)                              [B, T, D]
 *   per layer:  h = h + wo(attn(rope(wq x), rope(wk x), wv x)),  x = attention_norm(h)
 *               h = h + w2(silu(w1 x) * w3 x),                   x = ffn_norm(h)
 *   logits = output(norm(h))                                           [B*T, V]
 *   loss = nll_loss_forward(_log_softmax(logits), labels), mean over B*T tokens
 *
 * Linear weights are stored [out, in] as nn.Linear holds them, applied as x @ t(W) on
 * [B*T, in] views. RMSNorm is _fused_rms_norm, RoPE the rotary_emb op on [B, T, H, Dh]
 * (adjacent pairs, torchtitan's complex form without Llama-3.1 frequency scaling), attention
 * the fused flash op on [B, H, T, Dh] with Hkv key/value heads (grouped-query, no repeat_kv
 * materialised), causal, scale 1/sqrt(Dh).
 *
 * Parameters come first in torchtitan's named_parameters order (module registration order):
 * tok_embeddings; per layer attention.{wq,wk,wv,wo}, feed_forward.{w1,w2,w3},
 * attention_norm, ffn_norm; then norm, output. Then the data inputs tokens and labels.
 * Init specs follow torchtitan's init_weights with depth_init.
 */
#include "hp/build.h"
#include "hp/models.h"

#include "graph/models/models_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- flavors -------------------------------------------------------------------------------- */

typedef struct llama3_flavor {
    const char *name;
    hp_llama3_config cfg;
} llama3_flavor;

#define EPS   1e-5     /* norm_eps */
#define THETA 500000.0 /* rope_theta */

/* clang-format off */
static const llama3_flavor flavors[] = {
    /*              dim    layers heads kv   ffn_hidden vocab   batch seq   eps  theta */
    {"debugmodel", {256,   6,     16,   16,  768,       2048,   8,    2048, EPS, THETA}},
    {"8B",         {4096,  32,    32,   8,   14336,     128256, 1,    8192, EPS, THETA}},
    {"70B",        {8192,  80,    64,   8,   28672,     128256, 8,    8192, EPS, THETA}},
    {"405B",       {16384, 126,   128,  8,   53248,     128256, 2,    8192, EPS, THETA}},
};
/* clang-format on */

const char *hp__llama3_flavor_name(int i) {
    return i >= 0 && i < (int)HP_ARRAY_LEN(flavors) ? flavors[i].name : NULL;
}

/* More layers than any real model; keeps the joint graph far below HP_MAX_NODES. */
#define LLAMA3_MAX_LAYERS 4096
/* Total parameters: keeps every sum over them comfortably inside int64. */
#define LLAMA3_MAX_PARAMS ((int64_t)1 << 56)

/* ---- validation ----------------------------------------------------------------------------- */

#define FIELD_POSITIVE(c, f)                                                                       \
    do {                                                                                           \
        if ((c)->f <= 0)                                                                           \
            return hp_errf(err, HP_INVALID, "llama3: " #f " must be positive (got %lld)",          \
                           (long long)(c)->f);                                                     \
        if ((c)->f > HP_MAX_DIM)                                                                   \
            return hp_errf(err, HP_LIMIT, "llama3: " #f " = %lld exceeds the IR's dim limit %lld", \
                           (long long)(c)->f, (long long)HP_MAX_DIM);                              \
    } while (0)

/* One tensor the graph will hold: a product of sizes that must stay within the IR's limit
 * on elements. `what` names the tensor and the fields it is made of. */
static hp_status check_numel(const char *what, int n, const int64_t *dims, hp_err *err) {
    int64_t numel = 1;
    for (int i = 0; i < n; i++) {
        if (!hp__mul_within(numel, dims[i], HP_MAX_NUMEL, &numel))
            return hp_errf(err, HP_LIMIT, "llama3: %s has more than the IR's %lld elements", what,
                           (long long)HP_MAX_NUMEL);
    }
    return HP_OK;
}

static hp_status check_config(const hp_llama3_config *c, hp_err *err) {
    FIELD_POSITIVE(c, dim);
    FIELD_POSITIVE(c, n_layers);
    FIELD_POSITIVE(c, n_heads);
    FIELD_POSITIVE(c, n_kv_heads);
    FIELD_POSITIVE(c, ffn_hidden);
    FIELD_POSITIVE(c, vocab);
    FIELD_POSITIVE(c, batch);
    FIELD_POSITIVE(c, seq);
    if (c->n_layers > LLAMA3_MAX_LAYERS)
        return hp_errf(err, HP_LIMIT, "llama3: n_layers = %lld exceeds the limit %d",
                       (long long)c->n_layers, LLAMA3_MAX_LAYERS);
    if (c->dim % c->n_heads != 0)
        return hp_errf(err, HP_INVALID, "llama3: dim %lld is not divisible by n_heads %lld",
                       (long long)c->dim, (long long)c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return hp_errf(err, HP_INVALID, "llama3: n_heads %lld is not divisible by n_kv_heads %lld",
                       (long long)c->n_heads, (long long)c->n_kv_heads);
    int64_t hd = c->dim / c->n_heads;
    if (hd % 2 != 0)
        return hp_errf(err, HP_INVALID,
                       "llama3: head_dim = dim / n_heads = %lld must be even for RoPE",
                       (long long)hd);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return hp_errf(err, HP_INVALID, "llama3: norm_eps must be positive and finite (got %g)",
                       c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return hp_errf(err, HP_INVALID, "llama3: rope_theta must be positive and finite (got %g)",
                       c->rope_theta);

    /* The largest tensors of each kind; everything else is smaller than one of these. */
    int64_t bt;
    if (!hp__mul_within(c->batch, c->seq, HP_MAX_DIM, &bt))
        return hp_errf(err, HP_LIMIT,
                       "llama3: batch * seq = %lld * %lld exceeds the IR's dim "
                       "limit %lld",
                       (long long)c->batch, (long long)c->seq, (long long)HP_MAX_DIM);
    HP_TRY(
        check_numel("tok_embeddings.weight [vocab, dim]", 2, (int64_t[]){c->vocab, c->dim}, err));
    HP_TRY(check_numel("feed_forward.w1.weight [ffn_hidden, dim]", 2,
                       (int64_t[]){c->ffn_hidden, c->dim}, err));
    HP_TRY(check_numel("attention.wq.weight [dim, dim]", 2, (int64_t[]){c->dim, c->dim}, err));
    HP_TRY(check_numel("logits [batch*seq, vocab]", 2, (int64_t[]){bt, c->vocab}, err));
    HP_TRY(check_numel("ffn activations [batch*seq, ffn_hidden]", 2, (int64_t[]){bt, c->ffn_hidden},
                       err));
    HP_TRY(check_numel("activations [batch*seq, dim]", 2, (int64_t[]){bt, c->dim}, err));

    /* Total parameters, checked: each tensor fits, but n_layers copies of them might not. */
    int64_t d = c->dim, kv = c->n_kv_heads * hd; /* both within limits: kv <= dim */
    int64_t layer = 2 * d * d + 2 * d * kv + 2 * d, ffn, layers, emb = c->vocab * d;
    int64_t total = 0;
    if (!hp__mul_within(3 * d, c->ffn_hidden, LLAMA3_MAX_PARAMS, &ffn) ||
        !hp__mul_within(layer + ffn, c->n_layers, LLAMA3_MAX_PARAMS, &layers) ||
        __builtin_add_overflow(layers, 2 * emb + d, &total) || total > LLAMA3_MAX_PARAMS)
        return hp_errf(err, HP_LIMIT, "llama3: the model has more than %lld parameters",
                       (long long)LLAMA3_MAX_PARAMS);
    return HP_OK;
}

hp_status hp_llama3_resolve(const hp_model_spec *spec, hp_llama3_config *cfg, hp_err *err) {
    if (spec->family[0] && strcasecmp(spec->family, "llama3") != 0)
        return hp_errf(err, HP_INVALID, "llama3: spec is for family '%.*s'", HP_MODEL_NAME_MAX,
                       spec->family);
    int idx;
    char flavor[HP_MODEL_NAME_MAX + 1];
    snprintf(flavor, sizeof flavor, "%.*s", HP_MODEL_NAME_MAX, spec->flavor);
    HP_TRY(hp__flavor_find("llama3", hp__llama3_flavor_name, flavor, &idx, err));
    hp_llama3_config c = flavors[idx].cfg;
    HP_TRY(hp__override_i64("llama3", "batch", spec->batch, &c.batch, err));
    HP_TRY(hp__override_i64("llama3", "seq", spec->seq, &c.seq, err));
    HP_TRY(hp__override_i64("llama3", "dim", spec->dim, &c.dim, err));
    HP_TRY(hp__override_i64("llama3", "n_layers", spec->n_layers, &c.n_layers, err));
    HP_TRY(hp__override_i64("llama3", "n_heads", spec->n_heads, &c.n_heads, err));
    HP_TRY(hp__override_i64("llama3", "n_kv_heads", spec->n_kv_heads, &c.n_kv_heads, err));
    HP_TRY(hp__override_i64("llama3", "ffn_hidden", spec->ffn_hidden, &c.ffn_hidden, err));
    HP_TRY(hp__override_i64("llama3", "vocab", spec->vocab, &c.vocab, err));
    /* 0 keeps the default; anything else must be a usable value (checked below). */
    if (spec->norm_eps != 0) c.norm_eps = spec->norm_eps;
    if (spec->rope_theta != 0) c.rope_theta = spec->rope_theta;
    /* Overriding n_heads alone (as on a command line) keeps plain multi-head attention
     * when the flavor had it, rather than failing on the flavor's kv heads. */
    if (spec->n_heads > 0 && spec->n_kv_heads == 0 &&
        flavors[idx].cfg.n_kv_heads == flavors[idx].cfg.n_heads)
        c.n_kv_heads = c.n_heads;
    HP_TRY(check_config(&c, err));
    *cfg = c;
    return HP_OK;
}

/* ---- the graph ------------------------------------------------------------------------------ */

/* One transformer block's parameters, in registration order. */
typedef struct layer_params {
    hp_value wq, wk, wv, wo;           /* [H*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D], [D, H*Dh] */
    hp_value w1, w2, w3;               /* [F, D], [D, F], [F, D] */
    hp_value attention_norm, ffn_norm; /* [D] */
} layer_params;

typedef struct builder {
    hp_graph *g;
    const hp_llama3_config *c;
    int64_t B, T, D, H, Hkv, Dh, F, V;
} builder;

static hp_value param(builder *b, const char *fqn, int rank, int64_t d0, int64_t d1, hp_init init) {
    int64_t shape[2] = {d0, d1};
    return hp_build_placeholder(b->g, HP_INPUT_PARAM, fqn, hp_type_make(HP_F32, rank, shape),
                                &init);
}

static hp_value layer_param(builder *b, int64_t layer, const char *name, int rank, int64_t d0,
                            int64_t d1, hp_init init) {
    char fqn[HP_MAX_STR];
    snprintf(fqn, sizeof fqn, "layers.%lld.%s.weight", (long long)layer, name);
    return param(b, fqn, rank, d0, d1, init);
}

/* torch.nn.init.trunc_normal_ with its default absolute bounds [-2, 2]. */
static hp_init trunc_normal(double std) {
    return (hp_init){.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = std, .a = -2, .b = 2};
}

static void declare_params(builder *b, hp_value *tok_emb, layer_params *lp, hp_value *norm,
                           hp_value *output) {
    const int64_t D = b->D, F = b->F, V = b->V, q = b->H * b->Dh, kv = b->Hkv * b->Dh;
    const hp_init ones = {.kind = HP_INIT_ONES};
    *tok_emb = param(b, "tok_embeddings.weight", 2, V, D,
                     (hp_init){.kind = HP_INIT_NORMAL, .mean = 0, .std = 1});
    for (int64_t i = 0; i < b->c->n_layers; i++) {
        /* depth_init: the output projections shrink with depth. */
        double depth_std = 0.02 / sqrt(2.0 * (double)(i + 1));
        layer_params *p = &lp[i];
        p->wq = layer_param(b, i, "attention.wq", 2, q, D, trunc_normal(0.02));
        p->wk = layer_param(b, i, "attention.wk", 2, kv, D, trunc_normal(0.02));
        p->wv = layer_param(b, i, "attention.wv", 2, kv, D, trunc_normal(0.02));
        p->wo = layer_param(b, i, "attention.wo", 2, D, q, trunc_normal(depth_std));
        p->w1 = layer_param(b, i, "feed_forward.w1", 2, F, D, trunc_normal(0.02));
        p->w2 = layer_param(b, i, "feed_forward.w2", 2, D, F, trunc_normal(depth_std));
        p->w3 = layer_param(b, i, "feed_forward.w3", 2, F, D, trunc_normal(depth_std));
        p->attention_norm = layer_param(b, i, "attention_norm", 1, D, 0, ones);
        p->ffn_norm = layer_param(b, i, "ffn_norm", 1, D, 0, ones);
    }
    *norm = param(b, "norm.weight", 1, D, 0, ones);
    /* The output projection: std dim^-0.5, cut off at 3 std. */
    double out_std = 1.0 / sqrt((double)D);
    *output = param(b, "output.weight", 2, V, D,
                    (hp_init){.kind = HP_INIT_TRUNC_NORMAL,
                              .mean = 0,
                              .std = out_std,
                              .a = -3 * out_std,
                              .b = 3 * out_std});
}

static hp_value view2(hp_graph *g, hp_value x, int64_t d0, int64_t d1) {
    return hp_view(g, x, 2, (int64_t[]){d0, d1});
}

static hp_value view3(hp_graph *g, hp_value x, int64_t d0, int64_t d1, int64_t d2) {
    return hp_view(g, x, 3, (int64_t[]){d0, d1, d2});
}

/* nn.Linear without bias on a 2-D activation: x [N, in] @ t(w [out, in]) -> [N, out]. */
static hp_value linear(hp_graph *g, hp_value x, hp_value w) {
    return hp_mm(g, x, hp_t(g, w));
}

/* RMSNorm over the last dim; output 0 of the fused op ([..., D]; output 1 is rstd). */
static hp_value rms_norm(builder *b, hp_value x, hp_value w) {
    hp_value in[2] = {x, w};
    hp_attr eps = hp_attr_float(HP_ATTR_EPS, b->c->norm_eps);
    return hp_build(b->g, HP_OP_RMS_NORM, in, 2, &eps, 1);
}

static hp_value rope(builder *b, hp_value x) {
    return hp_un1(b->g, HP_OP_ROTARY_EMB, x, hp_attr_float(HP_ATTR_THETA, b->c->rope_theta));
}

/* x [B, T, D] (already normed) -> attention output [B, T, D]. */
static hp_value attention(builder *b, hp_value x, const layer_params *p) {
    hp_graph *g = b->g;
    const int64_t B = b->B, T = b->T, H = b->H, Hkv = b->Hkv, Dh = b->Dh;
    hp_value x2 = view2(g, x, B * T, b->D);                                       /* [B*T, D] */
    hp_value q = hp_view(g, linear(g, x2, p->wq), 4, (int64_t[]){B, T, H, Dh});   /* [B,T,H,Dh] */
    hp_value k = hp_view(g, linear(g, x2, p->wk), 4, (int64_t[]){B, T, Hkv, Dh}); /* [B,T,Hkv,Dh] */
    hp_value v = hp_view(g, linear(g, x2, p->wv), 4, (int64_t[]){B, T, Hkv, Dh}); /* [B,T,Hkv,Dh] */
    q = rope(b, q);
    k = rope(b, k);
    hp_value in[3] = {
        hp_transpose(g, q, 1, 2), /* [B, H, T, Dh] */
        hp_transpose(g, k, 1, 2), /* [B, Hkv, T, Dh] */
        hp_transpose(g, v, 1, 2), /* [B, Hkv, T, Dh] */
    };
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 1.0 / sqrt((double)Dh)),
                    hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value o = hp_build(g, HP_OP_SDPA, in, 3, a, 2); /* [B, H, T, Dh] */
    o = hp_transpose(g, o, 1, 2);                      /* [B, T, H, Dh] */
    o = hp_un(g, HP_OP_CLONE, o);                      /* .contiguous() before the view */
    o = view2(g, o, B * T, H * Dh);                    /* [B*T, H*Dh] */
    return view3(g, linear(g, o, p->wo), B, T, b->D);  /* [B, T, D] */
}

/* SwiGLU: x [B, T, D] -> w2(silu(w1 x) * w3 x) [B, T, D]. */
static hp_value feed_forward(builder *b, hp_value x, const layer_params *p) {
    hp_graph *g = b->g;
    hp_value x2 = view2(g, x, b->B * b->T, b->D);          /* [B*T, D] */
    hp_value gate = hp_silu(g, linear(g, x2, p->w1));      /* [B*T, F] */
    hp_value up = linear(g, x2, p->w3);                    /* [B*T, F] */
    hp_value down = linear(g, hp_mul(g, gate, up), p->w2); /* [B*T, D] */
    return view3(g, down, b->B, b->T, b->D);               /* [B, T, D] */
}

hp_status hp_llama3_build(const hp_llama3_config *cfg, hp_graph **out, hp_err *err) {
    *out = NULL;
    HP_TRY(check_config(cfg, err));
    builder b = {.c = cfg,
                 .B = cfg->batch,
                 .T = cfg->seq,
                 .D = cfg->dim,
                 .H = cfg->n_heads,
                 .Hkv = cfg->n_kv_heads,
                 .Dh = cfg->dim / cfg->n_heads,
                 .F = cfg->ffn_hidden,
                 .V = cfg->vocab};
    layer_params *lp = hp_calloc((size_t)cfg->n_layers, sizeof *lp);
    b.g = hp_graph_new();
    if (!lp || !b.g) {
        hp_free(lp);
        hp_graph_free(b.g);
        return hp_errf(err, HP_NOMEM, "llama3: out of memory starting the graph");
    }
    hp_graph *g = b.g;

    hp_value tok_emb, norm_w, out_w;
    declare_params(&b, &tok_emb, lp, &norm_w, &out_w);
    int64_t bt_shape[2] = {b.B, b.T};
    hp_value tokens = hp_build_placeholder(g, HP_INPUT_DATA, "tokens",
                                           hp_type_make(HP_I64, 2, bt_shape), NULL); /* [B, T] */
    hp_value labels = hp_build_placeholder(g, HP_INPUT_DATA, "labels",
                                           hp_type_make(HP_I64, 2, bt_shape), NULL); /* [B, T] */

    hp_value h = hp_bin(g, HP_OP_EMBEDDING, tok_emb, tokens); /* [B, T, D] */
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        h = hp_add(g, h, attention(&b, rms_norm(&b, h, lp[i].attention_norm), &lp[i]));
        h = hp_add(g, h, feed_forward(&b, rms_norm(&b, h, lp[i].ffn_norm), &lp[i]));
    }
    hp_value hn = view2(g, rms_norm(&b, h, norm_w), b.B * b.T, b.D); /* [B*T, D] */
    hp_value logits = linear(g, hn, out_w);                          /* [B*T, V] */
    hp_value logp = hp_un1(g, HP_OP_LOG_SOFTMAX, logits, hp_attr_int(HP_ATTR_DIM, 1));
    hp_value nll_in[2] = {logp, hp_view(g, labels, 1, (int64_t[]){b.B * b.T})}; /* [B*T] */
    hp_attr nll_attrs[2] = {hp_attr_int(HP_ATTR_REDUCTION, HP_NLL_MEAN),
                            hp_attr_int(HP_ATTR_IGNORE_INDEX, -100)};
    hp_value loss = hp_build(g, HP_OP_NLL_LOSS_FORWARD, nll_in, 2, nll_attrs, 2); /* [] */
    hp_free(lp);

    hp_status s = hp_graph_status(g, err);
    if (s == HP_OK) s = hp_graph_set_outputs(g, &loss, 1, err);
    if (s != HP_OK) {
        hp_err_prefix(err, "llama3");
        hp_graph_free(g);
        return s;
    }
    *out = g;
    return HP_OK;
}
