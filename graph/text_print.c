/* graph/text_print.c — the .hpir printer (grammar in docs/hpir.md): one node per line, the
 * mesh and placements of a compiled graph, attributes in key order; and the file writer.
 * The parser is in text.c. */
#include "graph/text_internal.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== output buffer ========================================================================= */

static bool hp__sb_reserve(strbuf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    if (b->fixed) return false;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = hp_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void hp__sb_putn(strbuf *b, const char *s, size_t n) {
    if (!hp__sb_reserve(b, n)) {
        if (!b->fixed || b->cap == 0) return;
        n = b->cap - 1 - b->len; /* truncate into the fixed buffer */
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void hp__sb_puts(strbuf *b, const char *s) {
    hp__sb_putn(b, s, strlen(s));
}

void hp__sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        hp__sb_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = hp_malloc((size_t)n + 1); /* rare: items here are numbers and names */
    if (!big) {
        b->oom = !b->fixed;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    hp__sb_putn(b, big, (size_t)n);
    hp_free(big);
}

/* ==== printer =============================================================================== */

const char *const hp__input_kind_names[3] = {"param", "buffer", "data"};
const char *const hp__reduce_op_names[3] = {"sum", "avg", "max"};

/* The shortest form that reads back as exactly v: integers in full below 1e15, else the
 * shortest %g; inf, -inf, nan, -nan spelled out. */
static void fmt_double(double v, char buf[40]) {
    if (isnan(v)) {
        strcpy(buf, signbit(v) ? "-nan" : "nan");
        return;
    }
    if (isinf(v)) {
        strcpy(buf, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, 40, "%.0f", v); /* 500000, not 5e+05; "-0" keeps the sign */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, 40, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void put_double(strbuf *b, double v) {
    char buf[40];
    fmt_double(v, buf);
    hp__sb_puts(b, buf);
}

static void put_type(strbuf *b, const hp_type *t) {
    if ((int)t->dtype >= 0 && t->dtype < HP_DTYPE_COUNT)
        hp__sb_puts(b, hp_dtype_name(t->dtype));
    else
        hp__sb_printf(b, "?dtype%d", (int)t->dtype);
    hp__sb_puts(b, "[");
    int rank = t->rank < 0 ? 0 : t->rank > HP_MAX_RANK ? HP_MAX_RANK : t->rank;
    for (int d = 0; d < rank; d++) hp__sb_printf(b, d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
    hp__sb_puts(b, "]");
}

static void put_value(strbuf *b, hp_value v) {
    if (v.node < 0)
        hp__sb_puts(b, "none");
    else if (v.out == 0)
        hp__sb_printf(b, "%%%" PRId32, v.node);
    else
        hp__sb_printf(b, "%%%" PRId32 ".%" PRId32, v.node, v.out);
}

static void put_string(strbuf *b, const char *s) {
    hp__sb_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            hp__sb_printf(b, "\\%c", *p);
        else if (*p == '\n')
            hp__sb_puts(b, "\\n");
        else if (*p < 0x20 || *p >= 0x7f)
            hp__sb_printf(b, "\\x%02x", *p);
        else
            hp__sb_putn(b, (const char *)p, 1);
    }
    hp__sb_puts(b, "\"");
}

static void put_attr(strbuf *b, const hp_attr *a) {
    if ((int)a->key >= 0 && a->key < HP_ATTR_COUNT)
        hp__sb_puts(b, hp_attr_key_name(a->key));
    else
        hp__sb_printf(b, "?attr%d", (int)a->key);
    hp__sb_puts(b, "=");
    switch (a->kind) {
    case HP_ATTR_KIND_INT:
        if (a->key == HP_ATTR_KIND && a->i >= 0 &&
            a->i < (int64_t)HP_ARRAY_LEN(hp__input_kind_names))
            hp__sb_puts(b, hp__input_kind_names[a->i]);
        else if (a->key == HP_ATTR_REDUCE_OP && a->i >= 0 &&
                 a->i < (int64_t)HP_ARRAY_LEN(hp__reduce_op_names))
            hp__sb_puts(b, hp__reduce_op_names[a->i]);
        else
            hp__sb_printf(b, "%" PRId64, a->i);
        return;
    case HP_ATTR_KIND_FLOAT:
        put_double(b, a->f);
        return;
    case HP_ATTR_KIND_INTS: {
        int n = a->ints.n < 0 ? 0 : a->ints.n > HP_MAX_ATTR_INTS ? HP_MAX_ATTR_INTS : a->ints.n;
        hp__sb_puts(b, "[");
        for (int i = 0; i < n; i++) hp__sb_printf(b, i ? ",%" PRId64 : "%" PRId64, a->ints.v[i]);
        hp__sb_puts(b, "]");
        return;
    }
    case HP_ATTR_KIND_DTYPE:
        if ((int)a->dtype >= 0 && a->dtype < HP_DTYPE_COUNT)
            hp__sb_puts(b, hp_dtype_name(a->dtype));
        else
            hp__sb_printf(b, "?dtype%d", (int)a->dtype);
        return;
    case HP_ATTR_KIND_STR:
        put_string(b, a->s);
        return;
    case HP_ATTR_KIND_INIT: {
        char buf[256];
        hp__sb_puts(b, hp_init_str(&a->init, buf, sizeof buf));
        return;
    }
    }
    hp__sb_printf(b, "?kind%d", (int)a->kind);
}

/* " {dp:S(0), tp:R}" after output k's type, when the node carries placements. */
static void put_placements(strbuf *b, const hp_graph *g, const hp_node *n, int k) {
    if (!n->pl) return;
    hp__sb_puts(b, " {");
    for (int i = 0; i < g->mesh.ndim; i++) {
        char w[32];
        hp__sb_printf(b, "%s%s:%s", i ? ", " : "", g->mesh.name[i],
                      hp_placement_short(&n->pl[k * g->mesh.ndim + i], w, sizeof w));
    }
    hp__sb_puts(b, "}");
}

static void put_node(strbuf *b, const hp_graph *g, int id) {
    const hp_node *n = &g->nodes[id];
    hp__sb_printf(b, "%%%d: ", id);
    if (n->n_out == 1) {
        put_type(b, &n->out[0]);
        put_placements(b, g, n, 0);
    } else {
        hp__sb_puts(b, "(");
        for (int k = 0; k < n->n_out; k++) {
            if (k) hp__sb_puts(b, ", ");
            put_type(b, &n->out[k]);
            put_placements(b, g, n, k);
        }
        hp__sb_puts(b, ")");
    }
    hp__sb_puts(b, " = ");
    if ((int)n->op >= 0 && n->op < HP_OP_COUNT)
        hp__sb_puts(b, hp_op_get(n->op)->name);
    else
        hp__sb_printf(b, "?op%d", (int)n->op);
    hp__sb_puts(b, "(");
    for (int i = 0; i < n->n_in; i++) {
        if (i) hp__sb_puts(b, ", ");
        put_value(b, n->in[i]);
    }
    hp__sb_puts(b, ")");
    if (n->n_attrs > 0) {
        hp__sb_puts(b, " {");
        for (int i = 0; i < n->n_attrs; i++) {
            if (i) hp__sb_puts(b, ", ");
            put_attr(b, &n->attrs[i]);
        }
        hp__sb_puts(b, "}");
    }
}

static void put_graph(strbuf *b, const hp_graph *g) {
    hp__sb_printf(b, "hpir %d\n", HP_TEXT_VERSION);
    if (g->mesh.ndim > 0) {
        hp__sb_puts(b, "mesh");
        for (int i = 0; i < g->mesh.ndim; i++)
            hp__sb_printf(b, " %s=%" PRId64, g->mesh.name[i], g->mesh.size[i]);
        hp__sb_puts(b, "\n");
    }
    for (int id = 0; id < g->n_nodes && !b->oom; id++) {
        put_node(b, g, id);
        hp__sb_puts(b, "\n");
    }
    hp__sb_puts(b, "return");
    for (int i = 0; i < g->n_outputs; i++) {
        hp__sb_puts(b, i ? ", " : " ");
        put_value(b, g->outputs[i]);
    }
    hp__sb_puts(b, "\n");
}

hp_status hp_graph_print(const hp_graph *g, char **text, size_t *len, hp_err *err) {
    strbuf b = {0};
    put_graph(&b, g);
    if (b.oom) {
        hp_free(b.p);
        *text = NULL;
        if (len) *len = 0;
        return hp_errf(err, HP_NOMEM, "out of memory printing a graph of %d nodes", g->n_nodes);
    }
    *text = b.p;
    if (len) *len = b.len;
    return HP_OK;
}

hp_status hp_graph_fprint(const hp_graph *g, FILE *f, hp_err *err) {
    char *text;
    size_t len;
    HP_TRY(hp_graph_print(g, &text, &len, err));
    size_t wrote = fwrite(text, 1, len, f);
    hp_free(text);
    if (wrote != len || ferror(f))
        return hp_errf(err, HP_IO, "writing graph text: %s", strerror(errno));
    return HP_OK;
}

char *hp_node_str(const hp_graph *g, int id, char *buf, size_t len) {
    if (len == 0) return buf;
    buf[0] = 0;
    strbuf b = {.p = buf, .cap = len, .fixed = true};
    if (id < 0 || id >= g->n_nodes)
        hp__sb_printf(&b, "%%%d: <no such node>", id);
    else
        put_node(&b, g, id);
    return buf;
}

hp_status hp_graph_write_file(const hp_graph *g, const char *path, hp_err *err) {
    char *text;
    size_t len;
    HP_TRY(hp_graph_print(g, &text, &len, err));
    hp_status s = hp_file_write_atomic(path, text, len, err);
    hp_free(text);
    return s;
}
