/* graph/models/models.c — model specs: parsing "family:flavor", dispatch to the family's
 * resolver and builder, the joint graph (forward + autodiff), and training FLOPs per token.
 *
 * The families themselves live beside this file (llama3.c, mlp.c); each owns its flavor
 * table and its validation. Nothing here allocates beyond what the builders do.
 */
#include "hp/models.h"

#include "graph/models/models_internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- families ------------------------------------------------------------------------------- */

typedef struct family {
    const char *name;
    hp__flavor_name_fn flavor_name;
} family;

static const family families[] = {
    {"llama3", hp__llama3_flavor_name},
    {"mlp", hp__mlp_flavor_name},
};

/* Writes "a, b, c" into buf. */
static void join_names(hp__flavor_name_fn names, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; names(i) && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names(i));
        if (w < 0) break;
        used += (size_t)w;
    }
}

static const char *family_name(int i) {
    return i < (int)HP_ARRAY_LEN(families) ? families[i].name : NULL;
}

static int family_find(const char *name) {
    for (int i = 0; i < (int)HP_ARRAY_LEN(families); i++)
        if (strcasecmp(families[i].name, name) == 0) return i;
    return -1;
}

hp_status hp__flavor_find(const char *family, hp__flavor_name_fn names, const char *flavor,
                          int *idx, hp_err *err) {
    if (!flavor || !flavor[0]) {
        *idx = 0;
        return HP_OK;
    }
    for (int i = 0; names(i); i++) {
        if (strcasecmp(names(i), flavor) == 0) {
            *idx = i;
            return HP_OK;
        }
    }
    char known[256];
    join_names(names, known, sizeof known);
    return hp_errf(err, HP_NOT_FOUND, "unknown %s flavor '%s' (known: %s)", family, flavor, known);
}

bool hp__mul_within(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > limit) return false;
    *out = r;
    return true;
}

hp_status hp__override_i64(const char *family, const char *field, int64_t v, int64_t *dst,
                           hp_err *err) {
    if (v < 0)
        return hp_errf(err, HP_INVALID, "%s: %s must be positive (got %lld)", family, field,
                       (long long)v);
    if (v > 0) *dst = v;
    return HP_OK;
}

/* ---- spec parsing --------------------------------------------------------------------------- */

hp_status hp_model_spec_parse(const char *text, hp_model_spec *spec, hp_err *err) {
    memset(spec, 0, sizeof *spec);
    if (!text || !text[0])
        return hp_errf(err, HP_PARSE,
                       "empty model spec (expected family[:flavor], e.g. "
                       "llama3:debugmodel)");
    const char *colon = strchr(text, ':');
    size_t flen = colon ? (size_t)(colon - text) : strlen(text);
    char known[128];
    join_names(family_name, known, sizeof known);
    if (flen == 0 || flen >= HP_MODEL_NAME_MAX)
        return hp_errf(err, HP_PARSE, "model spec '%.64s': bad family name (known: %s)", text,
                       known);
    char fam[HP_MODEL_NAME_MAX];
    memcpy(fam, text, flen);
    fam[flen] = '\0';
    int fi = family_find(fam);
    if (fi < 0)
        return hp_errf(err, HP_NOT_FOUND, "unknown model family '%s' (known: %s)", fam, known);
    const family *f = &families[fi];

    const char *flavor = colon ? colon + 1 : "";
    if (colon && !flavor[0])
        return hp_errf(err, HP_PARSE, "model spec '%.64s': empty flavor after ':'", text);
    if (strlen(flavor) >= HP_MODEL_NAME_MAX)
        return hp_errf(err, HP_PARSE, "model spec '%.64s': flavor name too long", text);
    int idx;
    HP_TRY(hp__flavor_find(f->name, f->flavor_name, flavor, &idx, err));
    /* Canonical spelling: "llama3:8b" becomes family "llama3", flavor "8B". */
    snprintf(spec->family, sizeof spec->family, "%s", f->name);
    snprintf(spec->flavor, sizeof spec->flavor, "%s", f->flavor_name(idx));
    return HP_OK;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

hp_status hp_model_build(const hp_model_spec *spec, hp_graph **out, hp_err *err) {
    *out = NULL;
    if (strcasecmp(spec->family, "llama3") == 0) {
        hp_llama3_config cfg;
        HP_TRY(hp_llama3_resolve(spec, &cfg, err));
        return hp_llama3_build(&cfg, out, err);
    }
    if (strcasecmp(spec->family, "mlp") == 0) {
        hp_mlp_config cfg;
        HP_TRY(hp_mlp_resolve(spec, &cfg, err));
        return hp_mlp_build(&cfg, out, err);
    }
    char known[128];
    join_names(family_name, known, sizeof known);
    return hp_errf(err, HP_NOT_FOUND, "unknown model family '%.*s' (known: %s)", HP_MODEL_NAME_MAX,
                   spec->family, known);
}

hp_status hp_model_build_joint(const hp_model_spec *spec, hp_graph **out, hp_err *err) {
    hp_graph *g;
    HP_TRY(hp_model_build(spec, &g, err));
    HP_ASSERT(g->n_outputs == 1);
    hp_status s = hp_autodiff(g, g->outputs[0], err);
    if (s != HP_OK) {
        hp_err_prefix(err, "%s autodiff", spec->family);
        hp_graph_free(g);
        return s;
    }
    *out = g;
    return HP_OK;
}

/* ---- FLOPs ---------------------------------------------------------------------------------- */

/* Parameter counts from the configuration alone (no graph): the same sums the builders'
 * placeholders give, which the tests check against hp_graph_param_count. */
static double llama3_params(const hp_llama3_config *c) {
    double d = (double)c->dim, hd = d / (double)c->n_heads;
    double attn = d * (double)c->n_heads * hd * 2 + 2 * d * (double)c->n_kv_heads * hd;
    double layer = attn + 3 * d * (double)c->ffn_hidden + 2 * d;
    return 2 * (double)c->vocab * d + (double)c->n_layers * layer + d;
}

static double mlp_params(const hp_mlp_config *c) {
    double n = 0, in = (double)c->in_dim;
    for (int64_t i = 0; i < c->n_layers; i++) {
        n += (in + 1) * (double)c->hidden;
        in = (double)c->hidden;
    }
    return n + (in + 1) * (double)c->n_classes;
}

double hp_model_flops_per_token(const hp_model_spec *spec) {
    if (strcasecmp(spec->family, "llama3") == 0) {
        hp_llama3_config c;
        if (hp_llama3_resolve(spec, &c, NULL) != HP_OK) return 0;
        double emb = (double)c.vocab * (double)c.dim;
        return 6 * (llama3_params(&c) - emb) +
               12 * (double)c.n_layers * (double)c.dim * (double)c.seq;
    }
    if (strcasecmp(spec->family, "mlp") == 0) {
        hp_mlp_config c;
        if (hp_mlp_resolve(spec, &c, NULL) != HP_OK) return 0;
        return 6 * mlp_params(&c);
    }
    return 0;
}
