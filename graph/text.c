/* graph/text.c — the .hpir text form's hand-written lexer and parser, and the file reader
 * (the printer is text_print.c).
 *
 * The printer writes one node per line (grammar in docs/hpir.md); the parser reads it back
 * token by token, checks what it can name a line and column for (syntax, names, references,
 * arity, attribute keys and kinds, bounds), builds the graph with hp_graph_append and then
 * runs hp_graph_verify, so a parsed graph is always a valid one. What this file does not do:
 * shape inference (the verifier runs the shape rules) or any I/O beyond the file helpers.
 */
#include "graph/text_internal.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== lexer ================================================================================= */

typedef enum { T_EOF, T_NL, T_IDENT, T_NUM, T_VALUE, T_STR, T_PUNCT } tok_kind;

typedef struct token {
    tok_kind kind;
    int line, col;
    const char *p; /* source span (for T_STR including the quotes) */
    size_t n;
    hp_value v;   /* T_VALUE */
    bool has_out; /* T_VALUE written %N.K */
} token;

typedef struct parser {
    const char *src;
    size_t len, pos;
    int line;
    size_t line_start;
    token tok; /* the current token */
    hp_err *err;
    hp_graph *g;
    int *node_line; /* [g->n_nodes]: the line each node came from, for verifier messages */
    int cap_lines;
    int return_line;
    /* per-node scratch */
    hp_value in[HP_MAX_INPUTS];
    hp_type out[HP_MAX_OUTS];
    hp_placement pl[HP_MAX_OUTS * HP_MESH_MAX_DIMS];
    int n_pl; /* outputs whose placements were given */
    hp_attr attrs[HP_ATTR_COUNT];
    char strs[HP_ATTR_COUNT][HP_MAX_STR + 1];
} parser;

static bool is_ident0(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(int c) {
    return c >= '0' && c <= '9';
}
static bool is_ident(int c) {
    return is_ident0(c) || is_digit(c);
}

/* A printable, bounded rendering of a token for "got '...'" in messages. */
static const char *tok_desc(const token *t, char *buf, size_t len) {
    if (t->kind == T_EOF) return "end of input";
    if (t->kind == T_NL) return "end of line";
    size_t n = t->n < 24 ? t->n : 24, o = 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < n && o + 5 < len; i++) {
        unsigned char c = (unsigned char)t->p[i];
        buf[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (n < t->n) buf[o++] = '.', buf[o++] = '.', buf[o++] = '.';
    buf[o++] = '\'';
    buf[o] = 0;
    return buf;
}

static hp_status err_at(parser *ps, int line, int col, hp_status s, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static hp_status err_at(parser *ps, int line, int col, hp_status s, const char *fmt, ...) {
    char msg[HP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (col > 0) return hp_errf(ps->err, s, "line %d:%d: %s", line, col, msg);
    return hp_errf(ps->err, s, "line %d: %s", line, msg);
}

/* "expected X, got Y" at the current token. */
static hp_status expected(parser *ps, const char *what) {
    char buf[40];
    return err_at(ps, ps->tok.line, ps->tok.col, HP_PARSE, "expected %s, got %s", what,
                  tok_desc(&ps->tok, buf, sizeof buf));
}

static hp_status lex_value(parser *ps, token *t) {
    const char *s = ps->src;
    size_t i = ps->pos + 1;
    int64_t parts[2] = {0, 0};
    for (int part = 0; part < 2; part++) {
        if (i >= ps->len || !is_digit(s[i]))
            return err_at(ps, t->line, t->col, HP_PARSE, "expected a number after '%s'",
                          part ? "." : "%");
        for (; i < ps->len && is_digit(s[i]); i++) {
            parts[part] = parts[part] * 10 + (s[i] - '0');
            if (parts[part] > INT32_MAX)
                return err_at(ps, t->line, t->col, HP_LIMIT, "value reference out of range");
        }
        if (part == 0 && !(i + 1 < ps->len && s[i] == '.' && is_digit(s[i + 1]))) break;
        if (part == 0) {
            i++; /* the '.' */
            t->has_out = true;
        }
    }
    t->v = (hp_value){(int32_t)parts[0], (int32_t)parts[1]};
    ps->pos = i;
    return HP_OK;
}

static hp_status lex_string(parser *ps, token *t) {
    size_t i = ps->pos + 1;
    for (;;) {
        if (i >= ps->len || ps->src[i] == '\n')
            return err_at(ps, t->line, t->col, HP_PARSE, "unterminated string");
        unsigned char c = (unsigned char)ps->src[i];
        if (c == '"') break;
        if (c == '\\' && (i + 1 >= ps->len || ps->src[i + 1] == '\n'))
            return err_at(ps, t->line, t->col, HP_PARSE, "unterminated string");
        if (c == '\\')
            i++;
        else if (c < 0x20 || c == 0x7f)
            return err_at(ps, t->line, (int)(i - ps->line_start) + 1, HP_PARSE,
                          "control byte 0x%02x in a string (write it as \\x%02x)", c, c);
        i++;
    }
    ps->pos = i + 1;
    return HP_OK;
}

/* Reads the next token into ps->tok. */
static hp_status lex(parser *ps) {
    const char *s = ps->src;
    while (ps->pos < ps->len) {
        char c = s[ps->pos];
        if (c == ' ' || c == '\t' || c == '\r')
            ps->pos++;
        else if (c == '#')
            while (ps->pos < ps->len && s[ps->pos] != '\n') ps->pos++;
        else
            break;
    }
    token *t = &ps->tok;
    memset(t, 0, sizeof *t);
    t->line = ps->line;
    t->col = (int)(ps->pos - ps->line_start) + 1;
    t->p = s + ps->pos;
    if (ps->pos >= ps->len) {
        t->kind = T_EOF;
        return HP_OK;
    }
    size_t start = ps->pos;
    unsigned char c = (unsigned char)s[ps->pos];
    if (c == '\n') {
        t->kind = T_NL;
        ps->pos++;
        ps->line++;
        ps->line_start = ps->pos;
    } else if (is_ident0(c)) {
        t->kind = T_IDENT;
        while (ps->pos < ps->len && is_ident(s[ps->pos])) ps->pos++;
    } else if (is_digit(c) || c == '-' || c == '+' || c == '.') {
        /* A number in the loose sense; its form is checked where it is converted. */
        t->kind = T_NUM;
        ps->pos++;
        while (ps->pos < ps->len) {
            char d = s[ps->pos];
            char prev = s[ps->pos - 1];
            if (is_ident(d) || d == '.' || ((d == '-' || d == '+') && (prev == 'e' || prev == 'E')))
                ps->pos++;
            else
                break;
        }
    } else if (c == '%') {
        t->kind = T_VALUE;
        HP_TRY(lex_value(ps, t));
    } else if (c == '"') {
        t->kind = T_STR;
        HP_TRY(lex_string(ps, t));
    } else if (c && strchr(":=()[]{},", c)) {
        t->kind = T_PUNCT;
        ps->pos++;
    } else if (c >= 0x20 && c < 0x7f) {
        return err_at(ps, t->line, t->col, HP_PARSE, "unexpected character '%c'", c);
    } else {
        return err_at(ps, t->line, t->col, HP_PARSE, "unexpected byte 0x%02x", c);
    }
    t->n = ps->pos - start;
    return HP_OK;
}

static bool is_punct(const token *t, char c) {
    return t->kind == T_PUNCT && t->p[0] == c;
}
static bool is_word(const token *t, const char *w) {
    return t->kind == T_IDENT && t->n == strlen(w) && memcmp(t->p, w, t->n) == 0;
}

/* Expects punctuation c (then advances); `what` completes "expected 'c' <what>". */
static hp_status expect_punct(parser *ps, char c, const char *what) {
    if (!is_punct(&ps->tok, c)) {
        char buf[64];
        snprintf(buf, sizeof buf, "'%c'%s%s", c, *what ? " " : "", what);
        return expected(ps, buf);
    }
    return lex(ps);
}

/* Copies an identifier token into buf (NUL-terminated); false if it does not fit. */
static bool tok_copy(const token *t, char *buf, size_t len) {
    if (t->n >= len) return false;
    memcpy(buf, t->p, t->n);
    buf[t->n] = 0;
    return true;
}

/* ==== scalars =============================================================================== */

static hp_status parse_int(parser *ps, const char *what, int64_t *v) {
    const token *t = &ps->tok;
    if (t->kind != T_NUM) return expected(ps, what);
    size_t i = 0;
    bool neg = false;
    if (t->p[0] == '-' || t->p[0] == '+') neg = t->p[i++] == '-';
    if (i == t->n) return expected(ps, what);
    uint64_t mag = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < t->n; i++) {
        if (!is_digit(t->p[i])) return expected(ps, what);
        unsigned d = (unsigned)(t->p[i] - '0');
        if (mag > (limit - d) / 10) {
            char buf[40];
            return err_at(ps, t->line, t->col, HP_LIMIT, "integer %s out of range",
                          tok_desc(t, buf, sizeof buf));
        }
        mag = mag * 10 + d;
    }
    *v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return lex(ps);
}

/* A decimal float (digits, optional fraction and exponent) or inf / nan with a sign. */
static bool float_form_ok(const char *p, size_t n) {
    size_t i = 0;
    if (n && (p[0] == '-' || p[0] == '+')) i++;
    if (n - i == 3 && (memcmp(p + i, "inf", 3) == 0 || memcmp(p + i, "nan", 3) == 0)) return true;
    size_t digits = 0;
    while (i < n && is_digit(p[i])) i++, digits++;
    if (i < n && p[i] == '.')
        for (i++; i < n && is_digit(p[i]); i++) digits++;
    if (digits == 0) return false;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '-' || p[i] == '+')) i++;
        size_t exp_digits = 0;
        while (i < n && is_digit(p[i])) i++, exp_digits++;
        if (exp_digits == 0) return false;
    }
    return i == n;
}

static hp_status parse_float(parser *ps, const char *what, double *v) {
    const token *t = &ps->tok;
    char buf[128];
    bool ident = t->kind == T_IDENT && (is_word(t, "inf") || is_word(t, "nan"));
    if ((t->kind != T_NUM && !ident) || !tok_copy(t, buf, sizeof buf) || !float_form_ok(buf, t->n))
        return expected(ps, what);
    const char *body = buf + (buf[0] == '-' || buf[0] == '+');
    if (strcmp(body, "nan") == 0) {
        *v = buf[0] == '-' ? -NAN : NAN;
    } else {
        errno = 0;
        *v = strtod(buf, NULL);
        if (errno == ERANGE && isinf(*v))
            return err_at(ps, t->line, t->col, HP_PARSE, "float '%s' out of range", buf);
    }
    return lex(ps);
}

/* Decodes a T_STR token (escapes \" \\ \n \t \r \xHH) into buf[HP_MAX_STR + 1]. */
static hp_status parse_string(parser *ps, char *buf) {
    const token *t = &ps->tok;
    if (t->kind != T_STR) return expected(ps, "a string");
    size_t o = 0;
    for (size_t i = 1; i + 1 < t->n; i++) {
        char c = t->p[i];
        int col = t->col + (int)i;
        if (c == '\\') {
            char e = t->p[++i];
            if (e == '"' || e == '\\')
                c = e;
            else if (e == 'n')
                c = '\n';
            else if (e == 't')
                c = '\t';
            else if (e == 'r')
                c = '\r';
            else if (e == 'x') {
                /* exactly two hex digits, not 00 (strings are NUL-terminated) */
                size_t avail = t->n - 1 - (i + 1); /* bytes before the closing quote */
                char hex[3] = {avail > 0 ? t->p[i + 1] : 0, avail > 1 ? t->p[i + 2] : 0, 0};
                if (!isxdigit((unsigned char)hex[0]) || !isxdigit((unsigned char)hex[1]) ||
                    strtol(hex, NULL, 16) == 0)
                    return err_at(ps, t->line, col, HP_PARSE, "bad escape '\\x%s' in string", hex);
                c = (char)strtol(hex, NULL, 16);
                i += 2;
            } else {
                return err_at(ps, t->line, col, HP_PARSE, "unknown escape in string");
            }
        }
        if (o == HP_MAX_STR)
            return err_at(ps, t->line, t->col, HP_LIMIT, "string longer than %d bytes", HP_MAX_STR);
        buf[o++] = c;
    }
    buf[o] = 0;
    size_t bad = hp_utf8_check(buf, o, false); /* strings go out as proto `string`s */
    if (bad < o)
        return err_at(ps, t->line, t->col, HP_PARSE,
                      "string is not valid UTF-8 (byte %zu of its value, 0x%02x)", bad,
                      (unsigned char)buf[bad]);
    return lex(ps);
}

/* ==== types, references, attributes ======================================================== */

static void list_dtypes(char *buf, size_t len) {
    strbuf b = {.p = buf, .cap = len, .fixed = true};
    buf[0] = 0;
    for (int d = 0; d < HP_DTYPE_COUNT; d++) {
        if (d) hp__sb_puts(&b, ", ");
        hp__sb_puts(&b, hp_dtype_name((hp_dtype)d));
    }
}

static hp_status parse_dtype(parser *ps, hp_dtype *dt) {
    const token *t = &ps->tok;
    char name[16], known[64], desc[40];
    if (t->kind != T_IDENT) return expected(ps, "a dtype");
    if (!tok_copy(t, name, sizeof name) || hp_dtype_parse(name, dt, NULL) != HP_OK) {
        list_dtypes(known, sizeof known);
        return err_at(ps, t->line, t->col, HP_PARSE, "unknown dtype %s (known: %s)",
                      tok_desc(t, desc, sizeof desc), known);
    }
    return lex(ps);
}

/* dtype '[' dims ']', e.g. f32[8,256]; scalars f32[]. */
static hp_status parse_type(parser *ps, hp_type *ty) {
    token start = ps->tok;
    memset(ty, 0, sizeof *ty);
    if (start.kind != T_IDENT) return expected(ps, "a type such as f32[8,256]");
    HP_TRY(parse_dtype(ps, &ty->dtype));
    HP_TRY(expect_punct(ps, '[', "after the dtype"));
    while (!is_punct(&ps->tok, ']')) {
        token d = ps->tok;
        int64_t v;
        if (ty->rank == HP_MAX_RANK)
            return err_at(ps, d.line, d.col, HP_LIMIT, "more than %d dimensions", HP_MAX_RANK);
        HP_TRY(parse_int(ps, "a dimension", &v));
        if (v < 0 || v > HP_MAX_DIM)
            return err_at(ps, d.line, d.col, HP_LIMIT,
                          "dimension %" PRId64 " out of range [0, %" PRId64 "]", v, HP_MAX_DIM);
        ty->shape[ty->rank++] = v;
        if (!is_punct(&ps->tok, ',')) break;
        HP_TRY(lex(ps));
    }
    HP_TRY(expect_punct(ps, ']', "after the dimensions"));
    hp_err e;
    hp_status s = hp_type_check(ty, &e);
    if (s != HP_OK) return err_at(ps, start.line, start.col, s, "%s", e.msg);
    return HP_OK;
}

/* {dp:S(0), tp:R} after output k's type: every mesh dim, in mesh order. */
static hp_status parse_placements(parser *ps, int k) {
    const hp_graph *g = ps->g;
    const token open = ps->tok;
    if (g->mesh.ndim == 0)
        return err_at(ps, open.line, open.col, HP_PARSE,
                      "placements need a 'mesh NAME=N ...' line after the header");
    HP_TRY(lex(ps));
    for (int i = 0; i < g->mesh.ndim; i++) {
        const token name = ps->tok;
        char desc[40];
        if (!is_word(&name, g->mesh.name[i]))
            return err_at(ps, name.line, name.col, HP_PARSE,
                          "expected mesh dim '%s' (placements follow the mesh order), got %s",
                          g->mesh.name[i], tok_desc(&name, desc, sizeof desc));
        HP_TRY(lex(ps));
        HP_TRY(expect_punct(ps, ':', "after the mesh dim"));
        /* R | S(d) | P(op), also the long words: rebuilt and handed to hp_placement_parse */
        const token w = ps->tok;
        char text[48];
        if (w.kind != T_IDENT || !tok_copy(&w, text, 16))
            return expected(ps, "a placement such as R, S(0) or P(sum)");
        HP_TRY(lex(ps));
        if (is_punct(&ps->tok, '(')) {
            HP_TRY(lex(ps));
            char arg[16] = "";
            if (!is_punct(&ps->tok, ')')) {
                if ((ps->tok.kind != T_NUM && ps->tok.kind != T_IDENT) ||
                    !tok_copy(&ps->tok, arg, sizeof arg))
                    return expected(ps, "a dim or sum|avg|max inside the placement");
                HP_TRY(lex(ps));
            }
            HP_TRY(expect_punct(ps, ')', "after the placement's argument"));
            size_t len = strlen(text);
            snprintf(text + len, sizeof text - len, "(%s)", arg);
        }
        hp_err e;
        if (hp_placement_parse(text, &ps->pl[k * g->mesh.ndim + i], &e) != HP_OK)
            return err_at(ps, w.line, w.col, HP_PARSE, "%s", e.msg);
        if (i + 1 < g->mesh.ndim) HP_TRY(expect_punct(ps, ',', "between placements"));
    }
    return expect_punct(ps, '}', "after the placements");
}

/* A reference to an earlier node's output: %N or %N.K. */
static hp_status parse_ref(parser *ps, hp_value *v) {
    const token *t = &ps->tok;
    if (t->kind != T_VALUE) return expected(ps, "a value such as %3 or %3.1");
    const hp_graph *g = ps->g;
    if (t->v.node >= g->n_nodes)
        return err_at(ps, t->line, t->col, HP_PARSE,
                      "%%%" PRId32 " is used before it is defined (forward reference)", t->v.node);
    const hp_node *n = &g->nodes[t->v.node];
    if (t->v.out >= n->n_out)
        return err_at(ps, t->line, t->col, HP_PARSE,
                      "%%%" PRId32 ".%" PRId32 ": %%%" PRId32 " (%s) has %d output%s", t->v.node,
                      t->v.out, t->v.node, hp_op_get(n->op)->name, n->n_out,
                      n->n_out == 1 ? "" : "s");
    *v = t->v;
    return lex(ps);
}

/* An enum spelled by name (kind=param) or by number. */
static hp_status parse_named_int(parser *ps, const char *const *names, int n_names,
                                 const char *what, int64_t *v) {
    const token *t = &ps->tok;
    if (t->kind != T_IDENT) return parse_int(ps, what, v);
    for (int i = 0; i < n_names; i++) {
        if (is_word(t, names[i])) {
            *v = i;
            return lex(ps);
        }
    }
    char desc[40], known[64];
    strbuf b = {.p = known, .cap = sizeof known, .fixed = true};
    for (int i = 0; i < n_names; i++) hp__sb_printf(&b, "%s%s", i ? ", " : "", names[i]);
    return err_at(ps, t->line, t->col, HP_PARSE, "expected %s (%s), got %s", what, known,
                  tok_desc(t, desc, sizeof desc));
}

/* name ['(' number (',' number)* ')'], handed to hp_init_parse without spaces. */
static hp_status parse_init(parser *ps, hp_init *init) {
    token start = ps->tok;
    char text[256];
    strbuf b = {.p = text, .cap = sizeof text, .fixed = true};
    text[0] = 0;
    if (start.kind != T_IDENT) return expected(ps, "an init spec such as normal(0,0.02)");
    hp__sb_putn(&b, start.p, start.n);
    HP_TRY(lex(ps));
    if (is_punct(&ps->tok, '(')) {
        hp__sb_puts(&b, "(");
        HP_TRY(lex(ps));
        while (!is_punct(&ps->tok, ')')) {
            const token *t = &ps->tok;
            if (t->kind != T_NUM && !(is_word(t, "inf") || is_word(t, "nan")))
                return expected(ps, "a number in the init spec");
            hp__sb_putn(&b, t->p, t->n);
            HP_TRY(lex(ps));
            if (!is_punct(&ps->tok, ',')) break;
            hp__sb_puts(&b, ",");
            HP_TRY(lex(ps));
        }
        HP_TRY(expect_punct(ps, ')', "after the init arguments"));
        hp__sb_puts(&b, ")");
    }
    if (b.len + 1 >= b.cap)
        return err_at(ps, start.line, start.col, HP_LIMIT, "init spec too long");
    hp_err e;
    if (hp_init_parse(text, init, &e) != HP_OK)
        return err_at(ps, start.line, start.col, HP_PARSE, "%s", e.msg);
    return HP_OK;
}

static hp_status parse_attr_value(parser *ps, hp_attr_key key, hp_attr *a, char *str) {
    const char *name = hp_attr_key_name(key);
    char what[64];
    memset(a, 0, sizeof *a);
    a->key = key;
    a->kind = hp_attr_key_kind(key);
    switch (a->kind) {
    case HP_ATTR_KIND_INT:
        snprintf(what, sizeof what, "an integer for '%s'", name);
        if (key == HP_ATTR_KIND)
            return parse_named_int(ps, hp__input_kind_names,
                                   (int)HP_ARRAY_LEN(hp__input_kind_names), "an input kind", &a->i);
        if (key == HP_ATTR_REDUCE_OP)
            return parse_named_int(ps, hp__reduce_op_names, (int)HP_ARRAY_LEN(hp__reduce_op_names),
                                   "a reduce op", &a->i);
        return parse_int(ps, what, &a->i);
    case HP_ATTR_KIND_FLOAT:
        snprintf(what, sizeof what, "a number for '%s'", name);
        return parse_float(ps, what, &a->f);
    case HP_ATTR_KIND_INTS:
        snprintf(what, sizeof what, "an integer list such as [0,1] for '%s'", name);
        if (!is_punct(&ps->tok, '[')) return expected(ps, what);
        HP_TRY(lex(ps));
        snprintf(what, sizeof what, "an integer in '%s'", name);
        while (!is_punct(&ps->tok, ']')) {
            if (a->ints.n == HP_MAX_ATTR_INTS)
                return err_at(ps, ps->tok.line, ps->tok.col, HP_LIMIT,
                              "more than %d integers in '%s'", HP_MAX_ATTR_INTS, name);
            HP_TRY(parse_int(ps, what, &a->ints.v[a->ints.n++]));
            if (!is_punct(&ps->tok, ',')) break;
            HP_TRY(lex(ps));
        }
        return expect_punct(ps, ']', "after the list");
    case HP_ATTR_KIND_DTYPE:
        return parse_dtype(ps, &a->dtype);
    case HP_ATTR_KIND_STR:
        a->s = str;
        return parse_string(ps, str);
    case HP_ATTR_KIND_INIT:
        return parse_init(ps, &a->init);
    }
    return err_at(ps, ps->tok.line, ps->tok.col, HP_INTERNAL, "attribute '%s' has no kind", name);
}

/* "dims, keepdim" for an attribute mask; "none" when empty. */
static void list_attrs(uint64_t mask, char *buf, size_t len) {
    strbuf b = {.p = buf, .cap = len, .fixed = true};
    buf[0] = 0;
    for (int k = 0; k < HP_ATTR_COUNT; k++)
        if (mask & (UINT64_C(1) << k))
            hp__sb_printf(&b, "%s%s", b.len ? ", " : "", hp_attr_key_name(k));
    if (!b.len) hp__sb_puts(&b, "none");
}

/* ==== nodes and the file ==================================================================== */

static hp_status parse_attrs(parser *ps, const hp_op_info *info, int *n_attrs, uint64_t *seen) {
    HP_TRY(lex(ps)); /* the '{' */
    while (!is_punct(&ps->tok, '}')) {
        const token at = ps->tok;
        char name[32], desc[40], known[256];
        hp_attr_key key;
        if (at.kind != T_IDENT) return expected(ps, "an attribute name");
        if (!tok_copy(&at, name, sizeof name) || hp_attr_key_parse(name, &key, NULL) != HP_OK)
            return err_at(ps, at.line, at.col, HP_PARSE, "unknown attribute %s for %s",
                          tok_desc(&at, desc, sizeof desc), info->name);
        uint64_t bit = UINT64_C(1) << key;
        if (!((info->required | info->optional) & bit)) {
            list_attrs(info->required | info->optional, known, sizeof known);
            return err_at(ps, at.line, at.col, HP_PARSE,
                          "unknown attribute '%s' for %s (it takes: %s)", name, info->name, known);
        }
        if (*seen & bit)
            return err_at(ps, at.line, at.col, HP_PARSE, "duplicate attribute '%s'", name);
        *seen |= bit;
        HP_TRY(lex(ps));
        HP_TRY(expect_punct(ps, '=', "after the attribute name"));
        HP_TRY(parse_attr_value(ps, key, &ps->attrs[*n_attrs], ps->strs[*n_attrs]));
        (*n_attrs)++;
        if (!is_punct(&ps->tok, ',')) break;
        HP_TRY(lex(ps));
    }
    return expect_punct(ps, '}', "after the attributes");
}

/* %N: types = op(refs) {attrs} */
static hp_status parse_node(parser *ps) {
    hp_graph *g = ps->g;
    const token id = ps->tok;
    if (id.has_out)
        return err_at(ps, id.line, id.col, HP_PARSE, "a node is defined as %%N, not %%N.K");
    if (id.v.node < g->n_nodes)
        return err_at(ps, id.line, id.col, HP_PARSE,
                      "duplicate node id %%%" PRId32 " (the next node is %%%d)", id.v.node,
                      g->n_nodes);
    if (id.v.node > g->n_nodes)
        return err_at(ps, id.line, id.col, HP_PARSE,
                      "node id %%%" PRId32 " out of order (the next node is %%%d)", id.v.node,
                      g->n_nodes);
    if (g->n_nodes >= HP_MAX_NODES)
        return err_at(ps, id.line, id.col, HP_LIMIT, "more than %d nodes", HP_MAX_NODES);
    HP_TRY(lex(ps));
    HP_TRY(expect_punct(ps, ':', "after the node id"));

    const token types = ps->tok;
    int n_out = 0, n_pl = 0;
    if (is_punct(&types, '(')) {
        HP_TRY(lex(ps));
        for (;;) {
            if (n_out == HP_MAX_OUTS)
                return err_at(ps, ps->tok.line, ps->tok.col, HP_LIMIT, "more than %d outputs",
                              HP_MAX_OUTS);
            HP_TRY(parse_type(ps, &ps->out[n_out++]));
            if (is_punct(&ps->tok, '{')) {
                HP_TRY(parse_placements(ps, n_out - 1));
                n_pl++;
            }
            if (!is_punct(&ps->tok, ',')) break;
            HP_TRY(lex(ps));
        }
        HP_TRY(expect_punct(ps, ')', "after the output types"));
    } else {
        HP_TRY(parse_type(ps, &ps->out[n_out++]));
        if (is_punct(&ps->tok, '{')) {
            HP_TRY(parse_placements(ps, 0));
            n_pl++;
        }
    }
    HP_TRY(expect_punct(ps, '=', "after the output types"));

    const token opt = ps->tok;
    char name[64], desc[40];
    hp_op op;
    if (opt.kind != T_IDENT) return expected(ps, "an op name");
    if (!tok_copy(&opt, name, sizeof name) || hp_op_parse(name, &op, NULL) != HP_OK)
        return err_at(ps, opt.line, opt.col, HP_PARSE, "unknown op %s",
                      tok_desc(&opt, desc, sizeof desc));
    const hp_op_info *info = hp_op_get(op);
    HP_TRY(lex(ps));
    HP_TRY(expect_punct(ps, '(', "after the op name"));
    int n_in = 0;
    while (!is_punct(&ps->tok, ')')) {
        if (n_in == HP_MAX_INPUTS)
            return err_at(ps, ps->tok.line, ps->tok.col, HP_LIMIT, "more than %d inputs",
                          HP_MAX_INPUTS);
        HP_TRY(parse_ref(ps, &ps->in[n_in++]));
        if (!is_punct(&ps->tok, ',')) break;
        HP_TRY(lex(ps));
    }
    HP_TRY(expect_punct(ps, ')', "after the inputs"));

    int n_attrs = 0;
    uint64_t seen = 0;
    if (is_punct(&ps->tok, '{')) HP_TRY(parse_attrs(ps, info, &n_attrs, &seen));
    if (ps->tok.kind != T_NL && ps->tok.kind != T_EOF) return expected(ps, "end of line");

    if (info->n_in != HP_VARIADIC && n_in != info->n_in)
        return err_at(ps, opt.line, opt.col, HP_PARSE, "%s takes %d input%s, got %d", name,
                      info->n_in, info->n_in == 1 ? "" : "s", n_in);
    if (n_out != info->n_out)
        return err_at(ps, types.line, types.col, HP_PARSE, "%s has %d output%s, got %d type%s",
                      name, info->n_out, info->n_out == 1 ? "" : "s", n_out, n_out == 1 ? "" : "s");
    uint64_t missing = info->required & ~seen;
    if (missing) {
        char list[256];
        list_attrs(missing, list, sizeof list);
        return err_at(ps, opt.line, opt.col, HP_PARSE, "%s requires attribute%s %s", name,
                      (missing & (missing - 1)) ? "s" : "", list);
    }

    if (g->n_nodes == ps->cap_lines) {
        int cap = ps->cap_lines ? ps->cap_lines * 2 : 256;
        int *lines = hp_realloc(ps->node_line, (size_t)cap * sizeof *lines);
        if (!lines) return err_at(ps, id.line, 0, HP_NOMEM, "out of memory");
        ps->node_line = lines;
        ps->cap_lines = cap;
    }
    hp_err e;
    if (n_pl != 0 && n_pl != n_out)
        return err_at(ps, types.line, types.col, HP_PARSE,
                      "placements are given for %d of %s's %d outputs (all or none)", n_pl, name,
                      n_out);
    int nid = hp_graph_append(g, op, ps->in, n_in, ps->out, n_out, ps->attrs, n_attrs, &e);
    if (nid < 0) return err_at(ps, id.line, 0, e.status, "%s", e.msg);
    if (n_pl && hp_node_set_placements(g, nid, ps->pl, &e) != HP_OK)
        return err_at(ps, types.line, types.col, e.status, "%s", e.msg);
    ps->node_line[nid] = id.line;
    return HP_OK;
}

/* return [ref (',' ref)*], then nothing but blank lines and comments. */
static hp_status parse_return(parser *ps) {
    ps->return_line = ps->tok.line;
    HP_TRY(lex(ps));
    while (ps->tok.kind != T_NL && ps->tok.kind != T_EOF) {
        const token t = ps->tok;
        hp_value v;
        hp_err e;
        HP_TRY(parse_ref(ps, &v));
        if (hp_graph_add_output(ps->g, v, &e) != HP_OK)
            return err_at(ps, t.line, t.col, e.status, "%s", e.msg);
        if (ps->tok.kind == T_NL || ps->tok.kind == T_EOF) break;
        HP_TRY(expect_punct(ps, ',', "between outputs"));
    }
    while (ps->tok.kind == T_NL) HP_TRY(lex(ps));
    if (ps->tok.kind != T_EOF) return expected(ps, "end of input after 'return'");
    return HP_OK;
}

/* mesh NAME=N [NAME=N ...] */
static hp_status parse_mesh(parser *ps) {
    const token mt = ps->tok;
    hp_graph_mesh m = {0};
    HP_TRY(lex(ps));
    while (ps->tok.kind == T_IDENT) {
        if (m.ndim == HP_MESH_MAX_DIMS)
            return err_at(ps, ps->tok.line, ps->tok.col, HP_LIMIT, "more than %d mesh dims",
                          HP_MESH_MAX_DIMS);
        if (!tok_copy(&ps->tok, m.name[m.ndim], HP_MESH_NAME_MAX))
            return err_at(ps, ps->tok.line, ps->tok.col, HP_PARSE,
                          "mesh dim name longer than %d characters", HP_MESH_NAME_MAX - 1);
        HP_TRY(lex(ps));
        HP_TRY(expect_punct(ps, '=', "after the mesh dim's name"));
        HP_TRY(parse_int(ps, "the mesh dim's size", &m.size[m.ndim]));
        m.ndim++;
    }
    if (m.ndim == 0) return expected(ps, "mesh dims such as 'dp=2 tp=2'");
    if (ps->tok.kind != T_NL) return expected(ps, "end of line after the mesh");
    hp_err e;
    if (hp_graph_set_mesh(ps->g, &m, &e) != HP_OK)
        return err_at(ps, mt.line, mt.col, e.status, "%s", e.msg);
    return HP_OK;
}

static hp_status parse_file(parser *ps) {
    HP_TRY(lex(ps));
    while (ps->tok.kind == T_NL) HP_TRY(lex(ps));
    if (!is_word(&ps->tok, "hpir")) return expected(ps, "the header 'hpir 1'");
    HP_TRY(lex(ps));
    const token vt = ps->tok;
    int64_t version;
    HP_TRY(parse_int(ps, "a version number after 'hpir'", &version));
    if (version != HP_TEXT_VERSION)
        return err_at(ps, vt.line, vt.col, HP_UNSUPPORTED,
                      "unsupported hpir version %" PRId64 " (this reader knows %d)", version,
                      HP_TEXT_VERSION);
    if (ps->tok.kind != T_NL) return expected(ps, "end of line after the header");
    while (ps->tok.kind == T_NL) HP_TRY(lex(ps));
    if (is_word(&ps->tok, "mesh")) HP_TRY(parse_mesh(ps));
    for (;;) {
        while (ps->tok.kind == T_NL) HP_TRY(lex(ps));
        if (ps->tok.kind == T_VALUE)
            HP_TRY(parse_node(ps));
        else if (is_word(&ps->tok, "return"))
            return parse_return(ps);
        else if (ps->tok.kind == T_EOF)
            return err_at(ps, ps->tok.line, 0, HP_PARSE,
                          "missing 'return' line at end of input (after %d nodes)", ps->g->n_nodes);
        else
            return expected(ps, "a node ('%N: ...') or 'return'");
    }
}

/* Runs the verifier, putting the line of the node (or of 'return') it names in front. */
static hp_status verify_with_lines(parser *ps) {
    hp_err e;
    hp_status s = hp_graph_verify(ps->g, &e);
    if (s == HP_OK) return HP_OK;
    int id;
    if (sscanf(e.msg, "node %d", &id) == 1 && id >= 0 && id < ps->g->n_nodes)
        return err_at(ps, ps->node_line[id], 0, s, "%s", e.msg);
    if (strncmp(e.msg, "graph output", 12) == 0)
        return err_at(ps, ps->return_line, 0, s, "%s", e.msg);
    return hp_errf(ps->err, s, "%s", e.msg);
}

hp_status hp_graph_parse(const char *text, size_t len, hp_graph **out, hp_err *err) {
    *out = NULL;
    if (len > HP_TEXT_MAX_FILE)
        return hp_errf(err, HP_LIMIT, "graph text is %zu bytes, over the limit of %zu", len,
                       HP_TEXT_MAX_FILE);
    parser *ps = hp_calloc(1, sizeof *ps);
    if (!ps) return hp_errf(err, HP_NOMEM, "out of memory parsing graph text");
    ps->src = text;
    ps->len = len;
    ps->line = 1;
    ps->err = err;
    ps->g = hp_graph_new();
    hp_status s = ps->g ? parse_file(ps) : hp_errf(err, HP_NOMEM, "out of memory");
    if (s == HP_OK) s = verify_with_lines(ps);
    if (s == HP_OK)
        *out = ps->g;
    else
        hp_graph_free(ps->g);
    hp_free(ps->node_line);
    hp_free(ps);
    return s;
}

hp_status hp_graph_read_file(const char *path, hp_graph **out, hp_err *err) {
    uint8_t *data;
    size_t len;
    *out = NULL;
    HP_TRY(hp_file_read(path, HP_TEXT_MAX_FILE, &data, &len, err));
    hp_status s = hp_graph_parse((const char *)data, len, out, err);
    hp_free(data);
    if (s != HP_OK) hp_err_prefix(err, "%s", path);
    return s;
}
