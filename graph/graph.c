/* graph/graph.c — dtypes, tensor types, attributes, init specs, graph storage and the builder.
 * Checking lives in verify.c (shared by the builder and the verifier); shape rules in
 * shape_rules.c. */
#include "graph/graph_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

/* ---- dtypes --------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtypes[] = {
#define X(e, name, size, is_float) {name, size, is_float},
    HP_DTYPE_LIST(X)
#undef X
};

const char *hp_dtype_name(hp_dtype dt) {
    return (unsigned)dt < HP_DTYPE_COUNT ? dtypes[dt].name : "?";
}
size_t hp_dtype_size(hp_dtype dt) {
    return (unsigned)dt < HP_DTYPE_COUNT ? dtypes[dt].size : 0;
}
bool hp_dtype_is_float(hp_dtype dt) {
    return (unsigned)dt < HP_DTYPE_COUNT && dtypes[dt].is_float;
}
hp_status hp_dtype_parse(const char *s, hp_dtype *dt, hp_err *err) {
    for (int i = 0; i < HP_DTYPE_COUNT; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *dt = (hp_dtype)i;
            return HP_OK;
        }
    }
    return hp_errf(err, HP_PARSE, "unknown dtype '%.64s' (expected f32, bf16, f16, i32, i64, bool)",
                   s);
}

/* ---- types ---------------------------------------------------------------------------------- */

hp_type hp_type_make(hp_dtype dt, int rank, const int64_t *shape) {
    hp_type t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    for (int i = 0; i < rank && i < HP_MAX_RANK; i++) t.shape[i] = shape[i];
    return t;
}

int64_t hp_type_numel(const hp_type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

bool hp_type_eq(const hp_type *a, const hp_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *hp_type_str(const hp_type *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "%s[", hp_dtype_name(t->dtype));
    for (int i = 0; i < t->rank && i < HP_MAX_RANK && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

hp_status hp_type_check(const hp_type *t, hp_err *err) {
    if ((unsigned)t->dtype >= HP_DTYPE_COUNT)
        return hp_errf(err, HP_INVALID, "dtype %d out of range", (int)t->dtype);
    if (t->rank < 0 || t->rank > HP_MAX_RANK)
        return hp_errf(err, HP_INVALID, "rank %d out of range [0, %d]", t->rank, HP_MAX_RANK);
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->shape[i];
        if (d < 0 || d > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "dim %d is %lld, outside [0, 2^40]", i, (long long)d);
        if (d && n > HP_MAX_NUMEL / d)
            return hp_errf(err, HP_INVALID, "shape has more than 2^50 elements");
        n *= d;
    }
    return HP_OK;
}

/* ---- attributes ----------------------------------------------------------------------------- */

static const struct {
    const char *name;
    hp_attr_kind kind;
} attr_keys[] = {
#define X(e, name, kind) {name, HP_ATTR_KIND_##kind},
    HP_ATTR_LIST(X)
#undef X
};

const char *hp_attr_key_name(hp_attr_key k) {
    return (unsigned)k < HP_ATTR_COUNT ? attr_keys[k].name : "?";
}
hp_attr_kind hp_attr_key_kind(hp_attr_key k) {
    return (unsigned)k < HP_ATTR_COUNT ? attr_keys[k].kind : HP_ATTR_KIND_INT;
}
/* Keys sorted by name for hp_attr_key_parse's binary search (every attribute of a job file is
 * looked up by name). Built once. */
static int keys_by_name[HP_ATTR_COUNT];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static int key_name_cmp(const void *a, const void *b) {
    return strcmp(attr_keys[*(const int *)a].name, attr_keys[*(const int *)b].name);
}

static void keys_init(void) {
    for (int i = 0; i < HP_ATTR_COUNT; i++) keys_by_name[i] = i;
    qsort(keys_by_name, HP_ATTR_COUNT, sizeof *keys_by_name, key_name_cmp);
}

hp_status hp_attr_key_parse(const char *name, hp_attr_key *k, hp_err *err) {
    pthread_once(&keys_once, keys_init);
    int lo = 0, hi = HP_ATTR_COUNT - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, attr_keys[keys_by_name[mid]].name);
        if (c == 0) {
            *k = (hp_attr_key)keys_by_name[mid];
            return HP_OK;
        }
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return hp_errf(err, HP_NOT_FOUND, "unknown attribute '%.64s'", name);
}

static hp_attr attr_of(hp_attr_key k) {
    hp_attr a;
    memset(&a, 0, sizeof a);
    a.key = k;
    a.kind = hp_attr_key_kind(k);
    return a;
}
hp_attr hp_attr_int(hp_attr_key k, int64_t v) {
    hp_attr a = attr_of(k);
    a.i = v;
    return a;
}
hp_attr hp_attr_float(hp_attr_key k, double v) {
    hp_attr a = attr_of(k);
    a.f = v;
    return a;
}
hp_attr hp_attr_ints(hp_attr_key k, int n, const int64_t *v) {
    hp_attr a = attr_of(k);
    a.ints.n = n;
    for (int i = 0; i < n && i < HP_MAX_ATTR_INTS; i++) a.ints.v[i] = v[i];
    if (n > HP_MAX_ATTR_INTS) a.ints.n = HP_MAX_ATTR_INTS + 1; /* rejected by the checker */
    return a;
}
hp_attr hp_attr_dtype(hp_attr_key k, hp_dtype dt) {
    hp_attr a = attr_of(k);
    a.dtype = dt;
    return a;
}
hp_attr hp_attr_str(hp_attr_key k, const char *s) {
    hp_attr a = attr_of(k);
    a.s = s;
    return a;
}
hp_attr hp_attr_initspec(hp_init init) {
    hp_attr a = attr_of(HP_ATTR_INIT);
    a.init = init;
    return a;
}

/* ---- init specs ----------------------------------------------------------------------------- */

static const char *init_names[] = {"none",   "zeros",        "ones",    "constant",
                                   "normal", "trunc_normal", "uniform", "arange"};
static const int init_nargs[] = {0, 0, 0, 1, 2, 4, 2, 0};

/* The shortest %g text that reads back to exactly x (0.02, not 0.020000000000000000416). */
static void shortest(double x, char *buf, size_t len) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

char *hp_init_str(const hp_init *init, char *buf, size_t len) {
    unsigned k = (unsigned)init->kind;
    if (k >= HP_ARRAY_LEN(init_names)) {
        snprintf(buf, len, "?");
        return buf;
    }
    double args[4];
    int n = init_nargs[k];
    switch (init->kind) {
    case HP_INIT_CONSTANT:
        args[0] = init->a;
        break;
    case HP_INIT_NORMAL:
        args[0] = init->mean, args[1] = init->std;
        break;
    case HP_INIT_TRUNC_NORMAL:
        args[0] = init->mean, args[1] = init->std, args[2] = init->a, args[3] = init->b;
        break;
    case HP_INIT_UNIFORM:
        args[0] = init->a, args[1] = init->b;
        break;
    default:
        break;
    }
    size_t o = (size_t)snprintf(buf, len, "%s", init_names[k]);
    for (int i = 0; i < n && o < len; i++) {
        char num[32];
        shortest(args[i], num, sizeof num);
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "," : "(", num);
    }
    if (n && o < len) snprintf(buf + o, len - o, ")");
    return buf;
}

hp_status hp_init_parse(const char *s, hp_init *init, hp_err *err) {
    memset(init, 0, sizeof *init);
    size_t nl = strcspn(s, "(");
    int kind = -1;
    for (unsigned i = 0; i < HP_ARRAY_LEN(init_names); i++)
        if (strlen(init_names[i]) == nl && strncmp(s, init_names[i], nl) == 0) kind = (int)i;
    if (kind < 0)
        return hp_errf(err, HP_PARSE,
                       "unknown init '%.*s' (expected zeros, ones, constant, normal, "
                       "trunc_normal, uniform, arange)",
                       (int)(nl > 64 ? 64 : nl), s);
    double args[4] = {0};
    int n = 0;
    const char *p = s + nl;
    if (*p == '(') {
        p++;
        while (*p != ')') {
            if (n == 4)
                return hp_errf(err, HP_PARSE, "init '%s': too many arguments", init_names[kind]);
            char *end;
            args[n++] = strtod(p, &end);
            if (end == p)
                return hp_errf(err, HP_PARSE, "init '%s': expected a number", init_names[kind]);
            p = end;
            if (*p == ',')
                p++;
            else if (*p != ')')
                return hp_errf(err, HP_PARSE, "init '%s': expected ',' or ')'", init_names[kind]);
        }
        p++;
    }
    if (*p) return hp_errf(err, HP_PARSE, "init '%s': trailing text", init_names[kind]);
    if (n != init_nargs[kind])
        return hp_errf(err, HP_PARSE, "init '%s' takes %d arguments, got %d", init_names[kind],
                       init_nargs[kind], n);
    init->kind = (hp_init_kind)kind;
    switch (init->kind) {
    case HP_INIT_CONSTANT:
        init->a = args[0];
        break;
    case HP_INIT_NORMAL:
        init->mean = args[0], init->std = args[1];
        break;
    case HP_INIT_TRUNC_NORMAL:
        init->mean = args[0], init->std = args[1], init->a = args[2], init->b = args[3];
        break;
    case HP_INIT_UNIFORM:
        init->a = args[0], init->b = args[1];
        break;
    default:
        break;
    }
    return hp_init_check(init, err);
}

hp_status hp_init_check(const hp_init *init, hp_err *err) {
    if ((unsigned)init->kind >= HP_ARRAY_LEN(init_names))
        return hp_errf(err, HP_INVALID, "init kind %d out of range", (int)init->kind);
    double v[4] = {init->mean, init->std, init->a, init->b};
    for (int i = 0; i < 4; i++)
        if (!isfinite(v[i]))
            return hp_errf(err, HP_INVALID, "init %s: non-finite argument", init_names[init->kind]);
    switch (init->kind) {
    case HP_INIT_NORMAL:
    case HP_INIT_TRUNC_NORMAL:
        if (!(init->std > 0))
            return hp_errf(err, HP_INVALID, "init %s: std %g must be > 0", init_names[init->kind],
                           init->std);
        if (init->kind == HP_INIT_TRUNC_NORMAL && !(init->a < init->b))
            return hp_errf(err, HP_INVALID, "init trunc_normal: bounds [%g, %g] are empty", init->a,
                           init->b);
        break;
    case HP_INIT_UNIFORM:
        if (!(init->a < init->b))
            return hp_errf(err, HP_INVALID, "init uniform: range [%g, %g) is empty", init->a,
                           init->b);
        break;
    default:
        break;
    }
    return HP_OK;
}

/* ---- graphs --------------------------------------------------------------------------------- */

hp_graph *hp_graph_new(void) {
    hp_graph *g = hp_calloc(1, sizeof *g);
    if (!g) return NULL;
    hp_arena_init(&g->arena);
    hp_arena_init(&g->inputs);
    return g;
}

void hp_graph_free(hp_graph *g) {
    if (!g) return;
    hp__intern_free(g);
    hp_arena_fini(&g->arena);
    hp_arena_fini(&g->inputs);
    hp_free(g->nodes); /* kept in a compile for its next pass graph (hp_graph_reserve) */
    hp_free(g->outputs);
    hp_free(g);
}

hp_status hp_graph_status(const hp_graph *g, hp_err *err) {
    if (!g->failed) return HP_OK;
    if (err) *err = g->err;
    return g->err.status;
}

const hp_attr *hp_node_attr(const hp_node *n, hp_attr_key k) {
    for (int i = 0; i < n->n_attrs; i++)
        if (n->attrs[i].key == k) return &n->attrs[i];
    return NULL;
}
int64_t hp_node_int(const hp_node *n, hp_attr_key k, int64_t dflt) {
    const hp_attr *a = hp_node_attr(n, k);
    return a && a->kind == HP_ATTR_KIND_INT ? a->i : dflt;
}
double hp_node_float(const hp_node *n, hp_attr_key k, double dflt) {
    const hp_attr *a = hp_node_attr(n, k);
    return a && a->kind == HP_ATTR_KIND_FLOAT ? a->f : dflt;
}

const hp_type *hp_graph_type(const hp_graph *g, hp_value v) {
    if (v.node < 0 || v.node >= g->n_nodes) return NULL;
    const hp_node *n = &g->nodes[v.node];
    if (v.out < 0 || v.out >= n->n_out) return NULL;
    return &n->out[v.out];
}

/* Sorts a node's attributes by key: an insertion sort, as lists are short (at most
 * HP_ATTR_COUNT) and usually sorted already (copies of graph nodes), where it only compares;
 * qsort moved the large hp_attr through a merge buffer and was a tenth of a compile. */
static void sort_attrs(hp_attr *a, int n) {
    for (int i = 1; i < n; i++) {
        if (a[i - 1].key <= a[i].key) continue;
        hp_attr x = a[i];
        int j = i;
        for (; j > 0 && a[j - 1].key > x.key; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

hp_status hp_graph_reserve(hp_graph *g, int n_nodes, hp_err *err) {
    if (n_nodes <= g->cap_nodes) return HP_OK;
    if (n_nodes > HP_MAX_NODES) n_nodes = HP_MAX_NODES;
    size_t got = 0;
    hp_node *spare = g->nodes ? NULL : hp_cache_take((size_t)n_nodes * sizeof *spare, &got);
    if (spare) { /* a freed pass graph's array, pages faulted in already */
        g->nodes = spare;
        g->cap_nodes = (int)(got / sizeof *spare);
        return HP_OK;
    }
    hp_node *nodes = hp_realloc(g->nodes, (size_t)n_nodes * sizeof *nodes);
    if (!nodes) return hp_errf(err, HP_NOMEM, "out of memory reserving %d nodes", n_nodes);
    g->nodes = nodes;
    g->cap_nodes = n_nodes;
    return HP_OK;
}

int hp_graph_append(hp_graph *g, hp_op op, const hp_value *in, int n_in, const hp_type *out,
                    int n_out, const hp_attr *attrs, int n_attrs, hp_err *err) {
    if (g->n_nodes >= HP_MAX_NODES) {
        hp_errf(err, HP_LIMIT, "graph has more than %d nodes", HP_MAX_NODES);
        return -1;
    }
    if (n_in < 0 || n_in > HP_MAX_INPUTS || n_out < 0 || n_out > HP_MAX_OUTS || n_attrs < 0 ||
        n_attrs > HP_ATTR_COUNT) {
        hp_errf(err, HP_LIMIT, "node %d: %d inputs, %d outputs, %d attributes exceed the limits",
                g->n_nodes, n_in, n_out, n_attrs);
        return -1;
    }
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        hp_node *nodes = hp_realloc(g->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) goto nomem;
        g->nodes = nodes;
        g->cap_nodes = cap;
    }
    hp_node n = {.op = op, .n_in = n_in, .n_out = n_out, .n_attrs = n_attrs};
    if (n_attrs) {
        hp_attr sorted[HP_ATTR_COUNT];
        memcpy(sorted, attrs, (size_t)n_attrs * sizeof *attrs);
        for (int i = 0; i < n_attrs; i++) {
            const hp_attr *a = &sorted[i];
            if ((unsigned)a->key >= HP_ATTR_COUNT) {
                hp_errf(err, HP_INVALID, "node %d: attribute key %d out of range", g->n_nodes,
                        (int)a->key);
                return -1;
            }
            if (a->kind == HP_ATTR_KIND_STR && !a->s) {
                hp_errf(err, HP_INVALID, "node %d: attribute '%s' has no string", g->n_nodes,
                        hp_attr_key_name(a->key));
                return -1;
            }
        }
        sort_attrs(sorted, n_attrs);
        for (int i = 1; i < n_attrs; i++) {
            if (sorted[i].key == sorted[i - 1].key) {
                hp_errf(err, HP_INVALID, "node %d: duplicate attribute '%s'", g->n_nodes,
                        hp_attr_key_name(sorted[i].key));
                return -1;
            }
        }
        /* an equal list appended before is shared (graph/intern.c), strings and all */
        if (!(n.attrs = hp__intern_attrs(g, sorted, n_attrs))) goto nomem;
    }
    if (n_out && !(n.out = hp__intern_types(g, out, n_out))) goto nomem;
    /* inputs are the node's own: no other graph points at them (hp_graph_append_like gives
     * a rewrite's nodes lists of their own), so they go with the graph */
    if (n_in && !(n.in = hp_arena_memdup(&g->inputs, in, (size_t)n_in * sizeof *in))) goto nomem;
    g->nodes[g->n_nodes] = n;
    return g->n_nodes++;
nomem:
    hp_errf(err, HP_NOMEM, "out of memory adding node %d", g->n_nodes);
    return -1;
}

int hp_graph_append_like(hp_graph *g, const hp_graph *src, const hp_node *n, const hp_value *in,
                         hp_err *err) {
    if (!src->lends)
        return hp_graph_append(g, n->op, in, n->n_in, n->out, n->n_out, n->attrs, n->n_attrs, err);
    /* n's types and attributes were checked, sorted and their strings copied when n was
     * appended to src: only the inputs (new ids) need storage of g's own */
    if (g->n_nodes >= HP_MAX_NODES) {
        hp_errf(err, HP_LIMIT, "graph has more than %d nodes", HP_MAX_NODES);
        return -1;
    }
    if (g->n_nodes == g->cap_nodes &&
        hp_graph_reserve(g, g->cap_nodes ? g->cap_nodes * 2 : 64, err) != HP_OK)
        return -1;
    hp_node copy = *n;
    copy.pl = NULL;
    copy.in = NULL;
    if (n->n_in && !(copy.in = hp_arena_memdup(&g->inputs, in, (size_t)n->n_in * sizeof *in))) {
        hp_errf(err, HP_NOMEM, "out of memory adding node %d", g->n_nodes);
        return -1;
    }
    g->nodes[g->n_nodes] = copy;
    return g->n_nodes++;
}

void hp_graph_adopt_storage(hp_graph *g, hp_graph *lender) {
    hp_arena_adopt(&g->arena, &lender->arena);
}

hp_status hp_graph_set_outputs(hp_graph *g, const hp_value *outs, int n, hp_err *err) {
    if (n < 0 || n > HP_MAX_NODES) return hp_errf(err, HP_LIMIT, "%d graph outputs", n);
    g->n_outputs = 0;
    for (int i = 0; i < n; i++) HP_TRY(hp_graph_add_output(g, outs[i], err));
    return HP_OK;
}

hp_status hp_graph_add_output(hp_graph *g, hp_value v, hp_err *err) {
    if (g->n_outputs == g->cap_outputs) {
        int cap = g->cap_outputs ? g->cap_outputs * 2 : 16;
        hp_value *o = hp_realloc(g->outputs, (size_t)cap * sizeof *o);
        if (!o) return hp_errf(err, HP_NOMEM, "out of memory adding a graph output");
        g->outputs = o;
        g->cap_outputs = cap;
    }
    g->outputs[g->n_outputs++] = v;
    return HP_OK;
}

/* Records the builder's sticky error: "node N (op): cause". */
static hp_value build_fail(hp_graph *g, hp_op op, const hp_err *e) {
    g->failed = true;
    g->err = *e;
    hp_err_prefix(&g->err, "node %d (%s)", g->n_nodes, hp_op_get(op) ? hp_op_get(op)->name : "?");
    return HP_NO_VALUE;
}

static hp_value build_node(hp_graph *g, hp_op op, const hp_value *in, int n_in,
                           const hp_attr *attrs, int n_attrs, const hp_type *declared) {
    if (g->failed) return HP_NO_VALUE;
    hp_err e = {0};
    const hp_op_info *info = hp_op_get(op);
    if (!info) {
        hp_errf(&e, HP_INVALID, "op %d out of range", (int)op);
        return build_fail(g, op, &e);
    }
    if (n_attrs > HP_ATTR_COUNT || n_in > HP_MAX_INPUTS || n_in < 0) {
        hp_errf(&e, HP_LIMIT, "too many inputs or attributes");
        return build_fail(g, op, &e);
    }
    for (int i = 0; i < n_in; i++) {
        if (!hp_value_ok(in[i])) {
            hp_errf(&e, HP_INVALID, "input %d is no value", i);
            return build_fail(g, op, &e);
        }
    }
    /* A scratch node (attrs sorted, as the graph stores them) to check before appending. */
    hp_attr sorted[HP_ATTR_COUNT];
    if (n_attrs) memcpy(sorted, attrs, (size_t)n_attrs * sizeof *attrs);
    sort_attrs(sorted, n_attrs);
    hp_type out[HP_MAX_OUTS];
    memset(out, 0, sizeof out);
    if (declared) out[0] = *declared;
    hp_node scratch = {.op = op,
                       .n_in = n_in,
                       .n_out = info->n_out,
                       .n_attrs = n_attrs,
                       .in = (hp_value *)in,
                       .out = out,
                       .attrs = sorted};
    hp_type inferred[HP_MAX_OUTS];
    if (hp__check_node(g, g->n_nodes, &scratch, inferred, &e) != HP_OK) {
        /* hp__check_node already names the node */
        g->failed = true;
        g->err = e;
        return HP_NO_VALUE;
    }
    int id = hp_graph_append(g, op, in, n_in, inferred, info->n_out, attrs, n_attrs, &e);
    if (id < 0) {
        g->failed = true;
        g->err = e;
        return HP_NO_VALUE;
    }
    return (hp_value){id, 0};
}

hp_value hp_build(hp_graph *g, hp_op op, const hp_value *in, int n_in, const hp_attr *attrs,
                  int n_attrs) {
    if (op == HP_OP_PLACEHOLDER) {
        hp_err e;
        hp_errf(&e, HP_INVALID, "use hp_build_placeholder");
        return g->failed ? HP_NO_VALUE : build_fail(g, op, &e);
    }
    return build_node(g, op, in, n_in, attrs, n_attrs, NULL);
}

hp_value hp_build_placeholder(hp_graph *g, hp_input_kind kind, const char *fqn, hp_type type,
                              const hp_init *init) {
    hp_attr a[3];
    int n = 0;
    a[n++] = hp_attr_int(HP_ATTR_KIND, kind);
    if (fqn) a[n++] = hp_attr_str(HP_ATTR_FQN, fqn);
    if (init && init->kind != HP_INIT_NONE) a[n++] = hp_attr_initspec(*init);
    return build_node(g, HP_OP_PLACEHOLDER, NULL, 0, a, n, &type);
}

/* ---- comparison, copies, queries ------------------------------------------------------------ */

static bool attr_eq(const hp_attr *a, const hp_attr *b) {
    if (a->key != b->key || a->kind != b->kind) return false;
    switch (a->kind) {
    case HP_ATTR_KIND_INT:
        return a->i == b->i;
    case HP_ATTR_KIND_FLOAT:
        return (isnan(a->f) && isnan(b->f)) || memcmp(&a->f, &b->f, sizeof a->f) == 0;
    case HP_ATTR_KIND_INTS:
        if (a->ints.n != b->ints.n) return false;
        for (int i = 0; i < a->ints.n && i < HP_MAX_ATTR_INTS; i++)
            if (a->ints.v[i] != b->ints.v[i]) return false;
        return true;
    case HP_ATTR_KIND_DTYPE:
        return a->dtype == b->dtype;
    case HP_ATTR_KIND_STR:
        return strcmp(a->s, b->s) == 0;
    case HP_ATTR_KIND_INIT:
        return a->init.kind == b->init.kind && a->init.mean == b->init.mean &&
               a->init.std == b->init.std && a->init.a == b->init.a && a->init.b == b->init.b;
    }
    return false;
}

static bool mesh_eq(const hp_graph_mesh *a, const hp_graph_mesh *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (strcmp(a->name[i], b->name[i]) || a->size[i] != b->size[i]) return false;
    return true;
}

static bool pl_eq(const hp_graph *a, const hp_node *x, const hp_node *y) {
    if (!x->pl || !y->pl) return !x->pl && !y->pl;
    for (int i = 0; i < x->n_out * a->mesh.ndim; i++)
        if (!hp_placement_eq(x->pl[i], y->pl[i])) return false;
    return true;
}

bool hp_graph_eq(const hp_graph *a, const hp_graph *b) {
    if (a->n_nodes != b->n_nodes || a->n_outputs != b->n_outputs) return false;
    if (!mesh_eq(&a->mesh, &b->mesh)) return false;
    for (int i = 0; i < a->n_nodes; i++) {
        const hp_node *x = &a->nodes[i], *y = &b->nodes[i];
        if (x->op != y->op || x->n_in != y->n_in || x->n_out != y->n_out ||
            x->n_attrs != y->n_attrs)
            return false;
        for (int k = 0; k < x->n_in; k++)
            if (x->in[k].node != y->in[k].node || x->in[k].out != y->in[k].out) return false;
        for (int k = 0; k < x->n_out; k++)
            if (!hp_type_eq(&x->out[k], &y->out[k])) return false;
        for (int k = 0; k < x->n_attrs; k++)
            if (!attr_eq(&x->attrs[k], &y->attrs[k])) return false;
        if (!pl_eq(a, x, y)) return false;
    }
    for (int i = 0; i < a->n_outputs; i++)
        if (a->outputs[i].node != b->outputs[i].node || a->outputs[i].out != b->outputs[i].out)
            return false;
    return true;
}

hp_graph *hp_graph_clone(const hp_graph *g) {
    return hp_graph_clone_room(g, 0);
}

hp_graph *hp_graph_clone_room(const hp_graph *g, int extra) {
    hp_graph *c = hp_graph_new();
    int room = extra > 0 && extra <= HP_MAX_NODES - g->n_nodes ? g->n_nodes + extra : g->n_nodes;
    if (!c || hp_graph_reserve(c, room, NULL) != HP_OK) {
        hp_graph_free(c);
        return NULL;
    }
    c->mesh = g->mesh;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (hp_graph_append(c, n->op, n->in, n->n_in, n->out, n->n_out, n->attrs, n->n_attrs,
                            NULL) < 0)
            goto fail;
        if (n->pl && hp_node_set_placements(c, i, n->pl, NULL) != HP_OK) goto fail;
    }
    if (hp_graph_set_outputs(c, g->outputs, g->n_outputs, NULL) != HP_OK) goto fail;
    c->failed = g->failed;
    c->err = g->err;
    return c;
fail:
    hp_graph_free(c);
    return NULL;
}

hp_graph_inputs hp_graph_count_inputs(const hp_graph *g) {
    hp_graph_inputs r = {0, 0, 0};
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) {
        switch (hp_node_int(&g->nodes[i], HP_ATTR_KIND, -1)) {
        case HP_INPUT_PARAM:
            r.n_params++;
            break;
        case HP_INPUT_BUFFER:
            r.n_buffers++;
            break;
        default:
            r.n_data++;
            break;
        }
    }
    return r;
}

int hp_graph_find_fqn(const hp_graph *g, const char *fqn) {
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        if (a && strcmp(a->s, fqn) == 0) return i;
    }
    return -1;
}

int64_t hp_graph_param_count(const hp_graph *g) {
    int64_t n = 0;
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++)
        if (hp_node_int(&g->nodes[i], HP_ATTR_KIND, -1) == HP_INPUT_PARAM)
            n += hp_type_numel(&g->nodes[i].out[0]);
    return n;
}

/* ---- mesh and placements -------------------------------------------------------------------- */

hp_status hp_graph_set_mesh(hp_graph *g, const hp_graph_mesh *m, hp_err *err) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].pl)
            return hp_errf(err, HP_INVALID, "the mesh cannot change once node %d has placements",
                           i);
    if (m->ndim < 0 || m->ndim > HP_MESH_MAX_DIMS)
        return hp_errf(err, HP_INVALID, "mesh: %d dims (at most %d)", m->ndim, HP_MESH_MAX_DIMS);
    for (int i = 0; i < m->ndim; i++) {
        size_t len = strnlen(m->name[i], HP_MESH_NAME_MAX);
        bool ok = len > 0 && len < HP_MESH_NAME_MAX;
        for (size_t k = 0; ok && k < len; k++) {
            char c = m->name[i][k];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_';
        }
        if (!ok)
            return hp_errf(err, HP_INVALID,
                           "mesh dim %d: its name must be 1..%d characters of [A-Za-z0-9_]", i,
                           HP_MESH_NAME_MAX - 1);
        for (int j = 0; j < i; j++)
            if (!strcmp(m->name[i], m->name[j]))
                return hp_errf(err, HP_INVALID, "mesh dim %d: '%s' repeats dim %d", i, m->name[i],
                               j);
        if (m->size[i] < 1 || m->size[i] > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "mesh dim %d (%s): size %lld is outside [1, %lld]", i,
                           m->name[i], (long long)m->size[i], (long long)HP_MAX_DIM);
    }
    g->mesh = *m;
    return HP_OK;
}

hp_status hp_node_set_placements(hp_graph *g, int id, const hp_placement *pl, hp_err *err) {
    if (id < 0 || id >= g->n_nodes) return hp_errf(err, HP_INVALID, "node %d does not exist", id);
    hp_node *n = &g->nodes[id];
    if (!pl) {
        n->pl = NULL;
        return HP_OK;
    }
    int nd = g->mesh.ndim;
    if (nd == 0) return hp_errf(err, HP_INVALID, "node %d: placements without a mesh", id);
    for (int k = 0; k < n->n_out; k++) {
        for (int i = 0; i < nd; i++) {
            hp_placement p = pl[k * nd + i];
            bool ok = p.kind == HP_PLACE_REPLICATE ||
                      (p.kind == HP_PLACE_SHARD && p.dim >= 0 && p.dim < n->out[k].rank) ||
                      (p.kind == HP_PLACE_PARTIAL &&
                       (p.reduce == HP_REDUCE_SUM || p.reduce == HP_REDUCE_AVG ||
                        p.reduce == HP_REDUCE_MAX));
            if (!ok)
                return hp_errf(err, HP_INVALID,
                               "node %d: output %d: placement on mesh dim %s is not Replicate, "
                               "Shard(d) with d below its rank %d, or Partial(sum|avg|max)",
                               id, k, g->mesh.name[i], n->out[k].rank);
        }
    }
    /* normalise the fields a kind does not use, so equality and printing are canonical */
    hp_placement norm[HP_MAX_OUTS * HP_MESH_MAX_DIMS];
    int n_pl = n->n_out * nd;
    for (int i = 0; i < n_pl; i++) {
        norm[i] = pl[i];
        if (norm[i].kind != HP_PLACE_SHARD) norm[i].dim = 0;
        if (norm[i].kind != HP_PLACE_PARTIAL) norm[i].reduce = HP_REDUCE_SUM;
    }
    n->pl = NULL;
    if (n_pl && !(n->pl = hp__intern_placements(g, norm, n_pl)))
        return hp_errf(err, HP_NOMEM, "out of memory for placements");
    return HP_OK;
}

const hp_placement *hp_value_placements(const hp_graph *g, hp_value v) {
    if (v.node < 0 || v.node >= g->n_nodes) return NULL;
    const hp_node *n = &g->nodes[v.node];
    if (!n->pl || v.out < 0 || v.out >= n->n_out) return NULL;
    return n->pl + (size_t)v.out * (size_t)g->mesh.ndim;
}
