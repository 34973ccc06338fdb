/* graph/proto_io.c — hp_graph <-> hp.v1.Graph (proto/hp/v1/graph.proto).
 *
 * Export walks the graph and builds protobuf-c messages in a caller's arena (no frees, no
 * partial cleanup). Import treats the message as hostile: every count is bounded before
 * anything is sized from it, every reference must point backwards, every attribute must be
 * a known key of the right kind that the op takes, every type must pass hp_type_check; then
 * hp_graph_verify checks the semantics (shapes, placeholder order). Decoding goes through a
 * budgeted allocator over hp_malloc, so fault injection reaches protobuf-c too.
 * Job-level conversion lives in job_proto.c.
 */
#include "hp/proto_io.h"

#include "graph/proto_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- the allocator --------------------------------------------------------------------------- */

/* What one allocation really costs: malloc's header and rounding included, so that floods of
 * tiny allocations (empty repeated messages) count for what they take. */
#define PA_OVERHEAD 16

static void *pa_alloc(void *data, size_t n) {
    hp_proto_alloc *a = data;
    if (n > a->budget - a->used || a->budget - a->used - n < PA_OVERHEAD) {
        a->over_budget = true;
        return NULL;
    }
    void *p = a->arena ? hp_arena_alloc(a->arena, n ? n : 1) : hp_malloc(n ? n : 1);
    if (!p) {
        a->nomem = true;
        return NULL;
    }
    a->used += n + PA_OVERHEAD;
    return p;
}

static void pa_free(void *data, void *p) {
    const hp_proto_alloc *a = data;
    if (!a->arena) hp_free(p);
}

void hp_proto_alloc_init(hp_proto_alloc *a, size_t msg_len) {
    memset(a, 0, sizeof *a);
    a->base.alloc = pa_alloc;
    a->base.free = pa_free;
    a->base.allocator_data = a;
    if (msg_len > HP_PROTO_MAX_BYTES) msg_len = HP_PROTO_MAX_BYTES; /* callers refuse it anyway */
    a->budget = msg_len * HP_PROTO_DECODE_FACTOR + HP_PROTO_DECODE_SLACK;
}

void hp_proto_alloc_init_arena(hp_proto_alloc *a, size_t msg_len, hp_arena *arena) {
    hp_proto_alloc_init(a, msg_len);
    a->arena = arena;
}

hp_status hp_proto_unpack_error(const hp_proto_alloc *a, const char *what, size_t len,
                                hp_err *err) {
    if (a->nomem) return hp_errf(err, HP_NOMEM, "%s: out of memory decoding the message", what);
    if (a->over_budget)
        return hp_errf(err, HP_LIMIT,
                       "%s: decoding the %zu-byte message would take over %zu bytes of memory",
                       what, len, a->budget);
    return hp_errf(err, HP_PARSE, "%s: not a valid message (%zu bytes): truncated or corrupt", what,
                   len);
}

/* ---- strings on the wire --------------------------------------------------------------------- */

static bool wire_varint(const uint8_t *p, size_t n, size_t *at, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *at < n; shift += 7) {
        uint8_t b = p[(*at)++];
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

static hp_status check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                               int depth, const char *what, hp_err *err) {
    if (depth > HP_PROTO_MAX_DEPTH)
        return hp_errf(err, HP_LIMIT, "%s: messages nested more than %d deep", what,
                       HP_PROTO_MAX_DEPTH);
    size_t at = 0;
    while (at < n) {
        uint64_t tag, v;
        if (!wire_varint(p, n, &at, &tag)) return HP_OK; /* unpack accepted it: cannot happen */
        switch (tag & 7) {
        case 0:
            if (!wire_varint(p, n, &at, &v)) return HP_OK;
            continue;
        case 1:
            at += 8;
            continue;
        case 5:
            at += 4;
            continue;
        case 2:
            break;
        default:
            return HP_OK; /* groups: protobuf-c refuses them before we get here */
        }
        if (!wire_varint(p, n, &at, &v) || v > n - at) return HP_OK;
        const uint8_t *b = p + at;
        size_t len = (size_t)v;
        at += len;
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
                : NULL;
        if (!f) continue;
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            size_t bad = hp_utf8_check((const char *)b, len, false);
            if (bad < len)
                return hp_errf(err, HP_INVALID, "%s: %s.%s: string has %s at byte %zu", what,
                               d->short_name, f->name,
                               b[bad] ? "a byte that is not valid UTF-8" : "a NUL byte", bad);
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            HP_TRY(check_strings(f->descriptor, b, len, depth + 1, what, err));
        }
    }
    return HP_OK;
}

hp_status hp_proto_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                 size_t len, const char *what, hp_err *err) {
    return check_strings(desc, data, len, 0, what, err);
}

/* ---- strings --------------------------------------------------------------------------------- */

const char *hp__quote(const char *s, char buf[HP__QUOTE_MAX]) {
    size_t o = 0;
    buf[0] = 0;
    if (!s) return buf;
    for (size_t i = 0; s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 8 >= HP__QUOTE_MAX) { /* room for one escape, "..." and the NUL */
            memcpy(buf + o, "...", 4);
            return buf;
        }
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
            buf[o++] = (char)c;
        } else {
            snprintf(buf + o, HP__QUOTE_MAX - o, "\\x%02x", c);
            o += 4;
        }
    }
    buf[o] = 0;
    return buf;
}

hp_status hp__check_str(const char *s, size_t max, const char *what, hp_err *err) {
    char q[HP__QUOTE_MAX];
    size_t n = 0;
    if (!s) return HP_OK;
    for (; s[n]; n++) {
        if (n + 1 >= max)
            return hp_errf(err, HP_LIMIT, "%s: '%s' is over the limit of %zu characters", what,
                           hp__quote(s, q), max - 1);
        unsigned char c = (unsigned char)s[n];
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\'' || c == '\\')
            return hp_errf(err, HP_INVALID, "%s: '%s' has a bad character (byte 0x%02x at %zu)",
                           what, hp__quote(s, q), c, n);
    }
    return HP_OK;
}

/* ---- enums ----------------------------------------------------------------------------------- */

static Hp__V1__DType dtype_to_proto(hp_dtype dt) {
    switch (dt) {
#define X(e, name, size, is_float)                                                                 \
    case HP_##e:                                                                                   \
        return HP__V1__DTYPE__DTYPE_##e;
        HP_DTYPE_LIST(X)
#undef X
    default:
        return HP__V1__DTYPE__DTYPE_UNSPECIFIED;
    }
}

static bool dtype_from_proto(int p, hp_dtype *dt) {
    switch (p) {
#define X(e, name, size, is_float)                                                                 \
    case HP__V1__DTYPE__DTYPE_##e:                                                                 \
        *dt = HP_##e;                                                                              \
        return true;
        HP_DTYPE_LIST(X)
#undef X
    default:
        return false;
    }
}

static const struct {
    hp_init_kind hp;
    Hp__V1__InitKind pb;
} init_kinds[] = {
    {HP_INIT_NONE, HP__V1__INIT_KIND__INIT_NONE},
    {HP_INIT_ZEROS, HP__V1__INIT_KIND__INIT_ZEROS},
    {HP_INIT_ONES, HP__V1__INIT_KIND__INIT_ONES},
    {HP_INIT_CONSTANT, HP__V1__INIT_KIND__INIT_CONSTANT},
    {HP_INIT_NORMAL, HP__V1__INIT_KIND__INIT_NORMAL},
    {HP_INIT_TRUNC_NORMAL, HP__V1__INIT_KIND__INIT_TRUNC_NORMAL},
    {HP_INIT_UNIFORM, HP__V1__INIT_KIND__INIT_UNIFORM},
    {HP_INIT_ARANGE, HP__V1__INIT_KIND__INIT_ARANGE},
};

static const char *attr_kind_name(hp_attr_kind k) {
    switch (k) {
    case HP_ATTR_KIND_INT:
        return "an int";
    case HP_ATTR_KIND_FLOAT:
        return "a float";
    case HP_ATTR_KIND_INTS:
        return "an int list";
    case HP_ATTR_KIND_DTYPE:
        return "a dtype";
    case HP_ATTR_KIND_STR:
        return "a string";
    case HP_ATTR_KIND_INIT:
        return "an init spec";
    }
    return "?";
}

static const char *value_case_name(Hp__V1__Attribute__ValueCase c) {
    switch (c) {
    case HP__V1__ATTRIBUTE__VALUE_INT_VALUE:
        return attr_kind_name(HP_ATTR_KIND_INT);
    case HP__V1__ATTRIBUTE__VALUE_FLOAT_VALUE:
        return attr_kind_name(HP_ATTR_KIND_FLOAT);
    case HP__V1__ATTRIBUTE__VALUE_INTS:
        return attr_kind_name(HP_ATTR_KIND_INTS);
    case HP__V1__ATTRIBUTE__VALUE_DTYPE:
        return attr_kind_name(HP_ATTR_KIND_DTYPE);
    case HP__V1__ATTRIBUTE__VALUE_STR:
        return attr_kind_name(HP_ATTR_KIND_STR);
    case HP__V1__ATTRIBUTE__VALUE_INIT:
        return attr_kind_name(HP_ATTR_KIND_INIT);
    default:
        return "no value";
    }
}

/* ---- export ---------------------------------------------------------------------------------- */

/* Arena allocation of n objects of `size` (NULL for n == 0, which protobuf-c accepts). */
static void *arena_array(hp_arena *a, size_t n, size_t size, bool *ok) {
    if (n == 0) return NULL;
    void *p = hp_arena_alloc(a, n * size);
    if (!p) *ok = false;
    return p;
}

static Hp__V1__TensorType *export_type(hp_arena *a, const hp_type *t, bool *ok) {
    Hp__V1__TensorType *m = hp_arena_alloc(a, sizeof *m);
    if (!m) {
        *ok = false;
        return NULL;
    }
    hp__v1__tensor_type__init(m);
    m->dtype = dtype_to_proto(t->dtype);
    m->n_shape = (size_t)t->rank;
    m->shape = t->rank ? (int64_t *)t->shape : NULL; /* borrowed from the graph */
    return m;
}

static Hp__V1__Attribute *export_attr(hp_arena *a, const hp_attr *at, bool *ok) {
    Hp__V1__Attribute *m = hp_arena_alloc(a, sizeof *m);
    if (!m) {
        *ok = false;
        return NULL;
    }
    hp__v1__attribute__init(m);
    m->name = (char *)hp_attr_key_name(at->key);
    switch (at->kind) {
    case HP_ATTR_KIND_INT:
        m->value_case = HP__V1__ATTRIBUTE__VALUE_INT_VALUE;
        m->int_value = at->i;
        break;
    case HP_ATTR_KIND_FLOAT:
        m->value_case = HP__V1__ATTRIBUTE__VALUE_FLOAT_VALUE;
        m->float_value = at->f;
        break;
    case HP_ATTR_KIND_INTS: {
        Hp__V1__IntList *l = hp_arena_alloc(a, sizeof *l);
        if (!l) break;
        hp__v1__int_list__init(l);
        l->n_values = (size_t)at->ints.n;
        l->values = at->ints.n ? (int64_t *)at->ints.v : NULL;
        m->value_case = HP__V1__ATTRIBUTE__VALUE_INTS;
        m->ints = l;
        return m;
    }
    case HP_ATTR_KIND_DTYPE:
        m->value_case = HP__V1__ATTRIBUTE__VALUE_DTYPE;
        m->dtype = dtype_to_proto(at->dtype);
        break;
    case HP_ATTR_KIND_STR:
        m->value_case = HP__V1__ATTRIBUTE__VALUE_STR;
        m->str = (char *)(at->s ? at->s : "");
        break;
    case HP_ATTR_KIND_INIT: {
        Hp__V1__InitSpec *s = hp_arena_alloc(a, sizeof *s);
        if (!s) break;
        hp__v1__init_spec__init(s);
        for (size_t k = 0; k < HP_ARRAY_LEN(init_kinds); k++)
            if (init_kinds[k].hp == at->init.kind) s->kind = init_kinds[k].pb;
        s->mean = at->init.mean;
        s->std = at->init.std;
        s->a = at->init.a;
        s->b = at->init.b;
        m->value_case = HP__V1__ATTRIBUTE__VALUE_INIT;
        m->init = s;
        return m;
    }
    }
    if (m->value_case == HP__V1__ATTRIBUTE__VALUE__NOT_SET) *ok = false; /* an allocation failed */
    return m;
}

static void export_ref(Hp__V1__ValueRef *m, hp_value v) {
    hp__v1__value_ref__init(m);
    m->node = v.node;
    m->output = v.out;
}

static int pb_place_kind(hp_place_kind k) {
    return k == HP_PLACE_SHARD     ? HP__V1__PLACEMENT__KIND__SHARD
           : k == HP_PLACE_PARTIAL ? HP__V1__PLACEMENT__KIND__PARTIAL
                                   : HP__V1__PLACEMENT__KIND__REPLICATE;
}

static int pb_reduce(hp_reduce_op r) {
    return r == HP_REDUCE_AVG   ? HP__V1__REDUCE_KIND__REDUCE_KIND_AVG
           : r == HP_REDUCE_MAX ? HP__V1__REDUCE_KIND__REDUCE_KIND_MAX
                                : HP__V1__REDUCE_KIND__REDUCE_KIND_SUM;
}

static void export_placements(hp_arena *a, const hp_graph *g, const hp_node *n, Hp__V1__Node *m,
                              bool *ok) {
    if (!n->pl || g->mesh.ndim == 0) return;
    size_t count = (size_t)(n->n_out * g->mesh.ndim);
    Hp__V1__Placement *ps = arena_array(a, count, sizeof *ps, ok);
    m->placements = arena_array(a, count, sizeof *m->placements, ok);
    if (!*ok) return;
    for (size_t i = 0; i < count; i++) {
        hp__v1__placement__init(&ps[i]);
        ps[i].kind = pb_place_kind(n->pl[i].kind);
        ps[i].dim = n->pl[i].kind == HP_PLACE_SHARD ? n->pl[i].dim : 0;
        if (n->pl[i].kind == HP_PLACE_PARTIAL) ps[i].reduce = pb_reduce(n->pl[i].reduce);
        m->placements[i] = &ps[i];
    }
    m->n_placements = count;
}

static Hp__V1__Node *export_node(hp_arena *a, const hp_node *n, bool *ok) {
    Hp__V1__Node *m = hp_arena_alloc(a, sizeof *m);
    if (!m) {
        *ok = false;
        return NULL;
    }
    hp__v1__node__init(m);
    m->op = (char *)hp_op_get(n->op)->name;

    Hp__V1__ValueRef *refs = arena_array(a, (size_t)n->n_in, sizeof *refs, ok);
    m->inputs = arena_array(a, (size_t)n->n_in, sizeof *m->inputs, ok);
    if (!*ok) return m;
    for (int i = 0; i < n->n_in; i++) {
        export_ref(&refs[i], n->in[i]);
        m->inputs[i] = &refs[i];
    }
    m->n_inputs = (size_t)n->n_in;

    m->attrs = arena_array(a, (size_t)n->n_attrs, sizeof *m->attrs, ok);
    for (int i = 0; *ok && i < n->n_attrs; i++) m->attrs[i] = export_attr(a, &n->attrs[i], ok);
    if (!*ok) return m;
    m->n_attrs = (size_t)n->n_attrs;

    m->outputs = arena_array(a, (size_t)n->n_out, sizeof *m->outputs, ok);
    for (int i = 0; *ok && i < n->n_out; i++) m->outputs[i] = export_type(a, &n->out[i], ok);
    if (!*ok) return m;
    m->n_outputs = (size_t)n->n_out;
    return m;
}

hp_status hp_graph_export(const hp_graph *g, hp_arena *arena, Hp__V1__Graph **msg, hp_err *err) {
    *msg = NULL;
    bool ok = true;
    if (hp_graph_failed(g))
        return hp_errf(err, HP_INVALID, "graph export: the graph failed to build: %s", g->err.msg);
    Hp__V1__Graph *m = hp_arena_alloc(arena, sizeof *m);
    if (!m) return hp_errf(err, HP_NOMEM, "graph export: out of memory");
    hp__v1__graph__init(m);
    m->format_version = HP_GRAPH_FORMAT_VERSION;
    m->nodes = arena_array(arena, (size_t)g->n_nodes, sizeof *m->nodes, &ok);
    for (int i = 0; ok && i < g->n_nodes; i++) {
        m->nodes[i] = export_node(arena, &g->nodes[i], &ok);
        if (ok) export_placements(arena, g, &g->nodes[i], m->nodes[i], &ok);
    }
    m->n_nodes = (size_t)g->n_nodes;
    if (ok && g->mesh.ndim > 0) {
        Hp__V1__GraphMesh *gm = hp_arena_alloc(arena, sizeof *gm);
        if (!gm) return hp_errf(err, HP_NOMEM, "graph export: out of memory");
        hp__v1__graph_mesh__init(gm);
        size_t nd = (size_t)g->mesh.ndim;
        gm->names = arena_array(arena, nd, sizeof *gm->names, &ok);
        gm->sizes = arena_array(arena, nd, sizeof *gm->sizes, &ok);
        for (size_t i = 0; ok && i < nd; i++) {
            gm->names[i] = (char *)g->mesh.name[i];
            gm->sizes[i] = g->mesh.size[i];
        }
        gm->n_names = gm->n_sizes = nd;
        m->mesh = gm;
    }

    Hp__V1__ValueRef *refs = arena_array(arena, (size_t)g->n_outputs, sizeof *refs, &ok);
    m->outputs = arena_array(arena, (size_t)g->n_outputs, sizeof *m->outputs, &ok);
    if (!ok) return hp_errf(err, HP_NOMEM, "graph export: out of memory");
    for (int i = 0; i < g->n_outputs; i++) {
        export_ref(&refs[i], g->outputs[i]);
        m->outputs[i] = &refs[i];
    }
    m->n_outputs = (size_t)g->n_outputs;
    *msg = m;
    return HP_OK;
}

/* ---- import ---------------------------------------------------------------------------------- */

/* Attributes are tracked in a 64-bit mask. */
_Static_assert(HP_ATTR_COUNT <= 64, "attribute keys must fit a uint64_t mask");

/* Scratch space for one node, so that importing allocates only what the graph keeps. */
typedef struct node_scratch {
    hp_value in[HP_MAX_INPUTS];
    hp_attr attrs[HP_ATTR_COUNT];
    hp_type out[HP_MAX_OUTS];
} node_scratch;

static hp_status import_init(const Hp__V1__InitSpec *m, hp_init *init, const char *ctx,
                             hp_err *err) {
    bool known = false;
    memset(init, 0, sizeof *init);
    for (size_t k = 0; k < HP_ARRAY_LEN(init_kinds); k++) {
        if ((int)init_kinds[k].pb == (int)m->kind) {
            init->kind = init_kinds[k].hp;
            known = true;
        }
    }
    if (!known) return hp_errf(err, HP_INVALID, "%s: unknown init kind %d", ctx, (int)m->kind);
    init->mean = m->mean;
    init->std = m->std;
    init->a = m->a;
    init->b = m->b;
    hp_status s = hp_init_check(init, err);
    if (s != HP_OK) hp_err_prefix(err, "%s", ctx);
    return s;
}

/* Error contexts ("node 12 (mm): output 0") are built for every node before anything fails;
 * snprintf made that a tenth of reading a job. These append by hand, cut at the buffer's end. */
static void ctx_put(char *buf, size_t n, size_t *o, const char *s) {
    while (*s && *o + 1 < n) buf[(*o)++] = *s++;
    buf[*o] = 0;
}

static void ctx_put_int(char *buf, size_t n, size_t *o, long long v) {
    char d[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do d[k++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) d[k++] = '-';
    char r[24];
    for (int i = 0; i < k; i++) r[i] = d[k - 1 - i];
    r[k] = 0;
    ctx_put(buf, n, o, r);
}

/* buf = "a" "b" "c" "d" (NULL parts skipped). */
static void ctx_cat(char *buf, size_t n, const char *a, const char *b, const char *c,
                    const char *d) {
    size_t o = 0;
    buf[0] = 0;
    const char *parts[] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (parts[i]) ctx_put(buf, n, &o, parts[i]);
}

/* buf = "ctx: what k". */
static void ctx_index(char *buf, size_t n, const char *ctx, const char *what, long long k) {
    size_t o = 0;
    buf[0] = 0;
    ctx_put(buf, n, &o, ctx);
    ctx_put(buf, n, &o, ": ");
    ctx_put(buf, n, &o, what);
    ctx_put(buf, n, &o, " ");
    ctx_put_int(buf, n, &o, k);
}

static hp_status import_attr(const Hp__V1__Attribute *m, const hp_op_info *info, uint64_t *seen,
                             hp_attr *out, const char *ctx, hp_err *err) {
    char q[HP__QUOTE_MAX], actx[HP_ERR_MSG_MAX];
    hp_attr_key key;
    if (!m) return hp_errf(err, HP_INVALID, "%s: missing", ctx);
    if (!m->name || hp_attr_key_parse(m->name, &key, NULL) != HP_OK)
        return hp_errf(err, HP_NOT_FOUND, "%s: unknown attribute '%s'", ctx, hp__quote(m->name, q));
    const char *name = hp_attr_key_name(key);
    uint64_t bit = UINT64_C(1) << key;
    if (*seen & bit) return hp_errf(err, HP_INVALID, "%s: duplicate attribute '%s'", ctx, name);
    *seen |= bit;
    if (!((info->required | info->optional) & bit))
        return hp_errf(err, HP_INVALID, "%s: op '%s' takes no attribute '%s'", ctx, info->name,
                       name);
    hp_attr_kind kind = hp_attr_key_kind(key);
    static const Hp__V1__Attribute__ValueCase want[] = {
        [HP_ATTR_KIND_INT] = HP__V1__ATTRIBUTE__VALUE_INT_VALUE,
        [HP_ATTR_KIND_FLOAT] = HP__V1__ATTRIBUTE__VALUE_FLOAT_VALUE,
        [HP_ATTR_KIND_INTS] = HP__V1__ATTRIBUTE__VALUE_INTS,
        [HP_ATTR_KIND_DTYPE] = HP__V1__ATTRIBUTE__VALUE_DTYPE,
        [HP_ATTR_KIND_STR] = HP__V1__ATTRIBUTE__VALUE_STR,
        [HP_ATTR_KIND_INIT] = HP__V1__ATTRIBUTE__VALUE_INIT,
    };
    if (m->value_case != want[kind])
        return hp_errf(err, HP_INVALID, "%s: attribute '%s' must be %s, got %s", ctx, name,
                       attr_kind_name(kind), value_case_name(m->value_case));
    ctx_cat(actx, sizeof actx, ctx, ": attribute '", name, "'");
    switch (kind) {
    case HP_ATTR_KIND_INT:
        *out = hp_attr_int(key, m->int_value);
        break;
    case HP_ATTR_KIND_FLOAT:
        *out = hp_attr_float(key, m->float_value);
        break;
    case HP_ATTR_KIND_INTS: {
        size_t n = m->ints ? m->ints->n_values : 0;
        if (n > HP_MAX_ATTR_INTS)
            return hp_errf(err, HP_LIMIT, "%s: %zu values, over the limit of %d", actx, n,
                           HP_MAX_ATTR_INTS);
        if (n && !m->ints->values) return hp_errf(err, HP_INVALID, "%s: missing values", actx);
        *out = hp_attr_ints(key, (int)n, n ? m->ints->values : NULL);
        break;
    }
    case HP_ATTR_KIND_DTYPE: {
        hp_dtype dt;
        if (!dtype_from_proto((int)m->dtype, &dt))
            return hp_errf(err, HP_INVALID, "%s: unknown dtype %d", actx, (int)m->dtype);
        *out = hp_attr_dtype(key, dt);
        break;
    }
    case HP_ATTR_KIND_STR:
        HP_TRY(hp__check_str(m->str, HP_MAX_STR, actx, err));
        *out = hp_attr_str(key, m->str ? m->str : ""); /* hp_graph_append copies it */
        break;
    case HP_ATTR_KIND_INIT: {
        hp_init init;
        if (!m->init) return hp_errf(err, HP_INVALID, "%s: missing", actx);
        HP_TRY(import_init(m->init, &init, actx, err));
        *out = hp_attr_initspec(init);
        out->key = key;
        break;
    }
    }
    return HP_OK;
}

static hp_status import_type(const Hp__V1__TensorType *m, hp_type *t, const char *ctx,
                             hp_err *err) {
    if (!m) return hp_errf(err, HP_INVALID, "%s: missing", ctx);
    memset(t, 0, sizeof *t);
    if (!dtype_from_proto((int)m->dtype, &t->dtype))
        return hp_errf(err, HP_INVALID, "%s: unknown dtype %d", ctx, (int)m->dtype);
    if (m->n_shape > HP_MAX_RANK)
        return hp_errf(err, HP_LIMIT, "%s: rank %zu is over the limit of %d", ctx, m->n_shape,
                       HP_MAX_RANK);
    if (m->n_shape && !m->shape) return hp_errf(err, HP_INVALID, "%s: missing shape", ctx);
    t->rank = (int)m->n_shape;
    for (int d = 0; d < t->rank; d++) {
        int64_t v = m->shape[d];
        if (v < 0 || v > HP_MAX_DIM)
            return hp_errf(err, v < 0 ? HP_INVALID : HP_LIMIT,
                           "%s: dim %d is %lld, must be in [0, %lld]", ctx, d, (long long)v,
                           (long long)HP_MAX_DIM);
        t->shape[d] = v;
    }
    hp_status s = hp_type_check(t, err); /* numel bound */
    if (s != HP_OK) hp_err_prefix(err, "%s", ctx);
    return s;
}

static hp_status import_node(hp_graph *g, const Hp__V1__Node *m, int i, node_scratch *sc,
                             hp_err *err) {
    char q[HP__QUOTE_MAX], ctx[128], sub[HP_ERR_MSG_MAX];
    hp_op op;
    if (!m) return hp_errf(err, HP_INVALID, "node %d: missing", i);
    if (!m->op || !m->op[0]) return hp_errf(err, HP_INVALID, "node %d: no op name", i);
    if (hp_op_parse(m->op, &op, NULL) != HP_OK)
        return hp_errf(err, HP_NOT_FOUND, "node %d: unknown op '%s'", i, hp__quote(m->op, q));
    const hp_op_info *info = hp_op_get(op);
    size_t co = 0; /* "node %d (%s)" */
    ctx[0] = 0;
    ctx_put(ctx, sizeof ctx, &co, "node ");
    ctx_put_int(ctx, sizeof ctx, &co, i);
    ctx_put(ctx, sizeof ctx, &co, " (");
    ctx_put(ctx, sizeof ctx, &co, info->name);
    ctx_put(ctx, sizeof ctx, &co, ")");

    /* inputs: bounded, backwards, and naming an output the producer has */
    if (m->n_inputs > HP_MAX_INPUTS)
        return hp_errf(err, HP_LIMIT, "%s: %zu inputs, over the limit of %d", ctx, m->n_inputs,
                       HP_MAX_INPUTS);
    if (info->n_in != HP_VARIADIC && m->n_inputs != (size_t)info->n_in)
        return hp_errf(err, HP_INVALID, "%s: %zu inputs, the op takes %d", ctx, m->n_inputs,
                       info->n_in);
    if (info->n_in == HP_VARIADIC && m->n_inputs == 0)
        return hp_errf(err, HP_INVALID, "%s: no inputs, the op takes at least 1", ctx);
    for (size_t k = 0; k < m->n_inputs; k++) {
        const Hp__V1__ValueRef *r = m->inputs ? m->inputs[k] : NULL;
        if (!r) return hp_errf(err, HP_INVALID, "%s: input %zu missing", ctx, k);
        if (r->node < 0 || r->node >= i)
            return hp_errf(err, HP_INVALID,
                           "%s: input %zu refers to node %d, not an earlier node (a forward "
                           "reference or a cycle)",
                           ctx, k, (int)r->node);
        const hp_node *src = &g->nodes[r->node];
        if (r->output < 0 || r->output >= src->n_out)
            return hp_errf(err, HP_INVALID,
                           "%s: input %zu refers to output %d of node %d (%s), which has %d", ctx,
                           k, (int)r->output, (int)r->node, hp_op_get(src->op)->name, src->n_out);
        sc->in[k] = (hp_value){r->node, r->output};
    }

    /* attributes: known keys of the right kind, each once, all the op requires */
    if (m->n_attrs > HP_ATTR_COUNT)
        return hp_errf(err, HP_LIMIT, "%s: %zu attributes, over the limit of %d", ctx, m->n_attrs,
                       (int)HP_ATTR_COUNT);
    uint64_t seen = 0;
    for (size_t k = 0; k < m->n_attrs; k++) {
        bool present = m->attrs && m->attrs[k];
        if (!present) ctx_index(sub, sizeof sub, ctx, "attribute", (long long)k);
        HP_TRY(import_attr(present ? m->attrs[k] : NULL, info, &seen, &sc->attrs[k],
                           present ? ctx : sub, err));
    }
    uint64_t missing = info->required & ~seen;
    if (missing) {
        int key = 0;
        while (!(missing & (UINT64_C(1) << key))) key++;
        return hp_errf(err, HP_INVALID, "%s: missing attribute '%s'", ctx,
                       hp_attr_key_name((hp_attr_key)key));
    }

    /* outputs: the op's count, each a checked type */
    if (m->n_outputs != (size_t)info->n_out)
        return hp_errf(err, m->n_outputs > HP_MAX_OUTS ? HP_LIMIT : HP_INVALID,
                       "%s: %zu outputs, the op has %d", ctx, m->n_outputs, info->n_out);
    for (size_t k = 0; k < m->n_outputs; k++) {
        ctx_index(sub, sizeof sub, ctx, "output", (long long)k);
        HP_TRY(import_type(m->outputs ? m->outputs[k] : NULL, &sc->out[k], sub, err));
    }

    hp_err e;
    int id = hp_graph_append(g, op, sc->in, (int)m->n_inputs, sc->out, (int)m->n_outputs, sc->attrs,
                             (int)m->n_attrs, &e);
    if (id < 0) return hp_errf(err, e.status, "%s: %s", ctx, e.msg);
    HP_ASSERT(id == i);

    /* placements: none, or one per output and mesh dim */
    int nd = g->mesh.ndim;
    if (m->n_placements == 0) return HP_OK;
    if (nd == 0 || m->n_placements != (size_t)(info->n_out * nd))
        return hp_errf(err, HP_INVALID, "%s: %zu placements, want %d (outputs x mesh dims)", ctx,
                       m->n_placements, info->n_out * nd);
    hp_placement pl[HP_MAX_OUTS * HP_MESH_MAX_DIMS];
    for (size_t k = 0; k < m->n_placements; k++) {
        const Hp__V1__Placement *p = m->placements ? m->placements[k] : NULL;
        if (!p) return hp_errf(err, HP_INVALID, "%s: placement %zu missing", ctx, k);
        pl[k] = HP_REPLICATE;
        switch (p->kind) {
        case HP__V1__PLACEMENT__KIND__REPLICATE:
            break;
        case HP__V1__PLACEMENT__KIND__SHARD:
            if (p->dim < 0 || p->dim >= HP_MAX_RANK)
                return hp_errf(err, HP_INVALID, "%s: placement %zu: Shard(%d) outside [0, %d)", ctx,
                               k, (int)p->dim, HP_MAX_RANK);
            pl[k] = HP_SHARD(p->dim);
            break;
        case HP__V1__PLACEMENT__KIND__PARTIAL:
            if (p->reduce == HP__V1__REDUCE_KIND__REDUCE_KIND_SUM)
                pl[k] = HP_PARTIAL(HP_REDUCE_SUM);
            else if (p->reduce == HP__V1__REDUCE_KIND__REDUCE_KIND_AVG)
                pl[k] = HP_PARTIAL(HP_REDUCE_AVG);
            else if (p->reduce == HP__V1__REDUCE_KIND__REDUCE_KIND_MAX)
                pl[k] = HP_PARTIAL(HP_REDUCE_MAX);
            else
                return hp_errf(err, HP_INVALID, "%s: placement %zu: Partial of reduce kind %d", ctx,
                               k, (int)p->reduce);
            break;
        default:
            return hp_errf(err, HP_INVALID,
                           "%s: placement %zu: kind %d is not Replicate, Shard "
                           "or Partial",
                           ctx, k, (int)p->kind);
        }
    }
    if (hp_node_set_placements(g, id, pl, &e) != HP_OK)
        return hp_errf(err, e.status, "%s: %s", ctx, e.msg);
    return HP_OK;
}

static hp_status import_graph(const Hp__V1__Graph *msg, hp_graph *g, hp_err *err) {
    if (msg->format_version == 0)
        return hp_errf(err, HP_INVALID, "graph: format_version is 0 (unset); this build reads %d",
                       HP_GRAPH_FORMAT_VERSION);
    if (msg->format_version > HP_GRAPH_FORMAT_VERSION)
        return hp_errf(err, HP_UNSUPPORTED,
                       "graph: format_version %u is newer than this build reads (%d)",
                       (unsigned)msg->format_version, HP_GRAPH_FORMAT_VERSION);
    if (msg->n_nodes > HP_MAX_NODES)
        return hp_errf(err, HP_LIMIT, "graph: %zu nodes, over the limit of %d", msg->n_nodes,
                       HP_MAX_NODES);
    if (msg->n_outputs > HP_MAX_NODES)
        return hp_errf(err, HP_LIMIT, "graph: %zu outputs, over the limit of %d", msg->n_outputs,
                       HP_MAX_NODES);
    if ((msg->n_nodes && !msg->nodes) || (msg->n_outputs && !msg->outputs))
        return hp_errf(err, HP_INVALID, "graph: missing node or output array");

    if (msg->mesh) {
        const Hp__V1__GraphMesh *gm = msg->mesh;
        if (gm->n_names != gm->n_sizes || gm->n_names > HP_MESH_MAX_DIMS ||
            (gm->n_names && (!gm->names || !gm->sizes)))
            return hp_errf(err, HP_INVALID, "graph.mesh: %zu names and %zu sizes (at most %d dims)",
                           gm->n_names, gm->n_sizes, HP_MESH_MAX_DIMS);
        hp_graph_mesh mesh = {.ndim = (int)gm->n_names};
        for (size_t i = 0; i < gm->n_names; i++) {
            char q[HP__QUOTE_MAX];
            const char *nm = gm->names[i] ? gm->names[i] : "";
            if (strlen(nm) >= HP_MESH_NAME_MAX)
                return hp_errf(err, HP_INVALID, "graph.mesh: dim %zu's name '%s' is too long", i,
                               hp__quote(nm, q));
            snprintf(mesh.name[i], sizeof mesh.name[i], "%s", nm);
            mesh.size[i] = gm->sizes[i];
        }
        hp_status ms = hp_graph_set_mesh(g, &mesh, err);
        if (ms != HP_OK) return hp_err_prefix(err, "graph.mesh");
    }
    node_scratch *sc = hp_malloc(sizeof *sc);
    if (!sc) return hp_errf(err, HP_NOMEM, "graph import: out of memory");
    hp_status s = HP_OK;
    for (size_t i = 0; s == HP_OK && i < msg->n_nodes; i++)
        s = import_node(g, msg->nodes[i], (int)i, sc, err);
    hp_free(sc);
    HP_TRY(s);

    for (size_t k = 0; k < msg->n_outputs; k++) {
        const Hp__V1__ValueRef *r = msg->outputs[k];
        if (!r) return hp_errf(err, HP_INVALID, "graph: output %zu missing", k);
        if (r->node < 0 || (size_t)r->node >= msg->n_nodes)
            return hp_errf(err, HP_INVALID, "graph: output %zu refers to node %d, outside [0, %zu)",
                           k, (int)r->node, msg->n_nodes);
        const hp_node *src = &g->nodes[r->node];
        if (r->output < 0 || r->output >= src->n_out)
            return hp_errf(err, HP_INVALID,
                           "graph: output %zu refers to output %d of node %d (%s), which has %d", k,
                           (int)r->output, (int)r->node, hp_op_get(src->op)->name, src->n_out);
        HP_TRY(hp_graph_add_output(g, (hp_value){r->node, r->output}, err));
    }
    return hp_graph_verify(g, err);
}

hp_status hp_graph_import(const Hp__V1__Graph *msg, hp_graph **out, hp_err *err) {
    *out = NULL;
    if (!msg) return hp_errf(err, HP_INVALID, "graph: missing");
    hp_graph *g = hp_graph_new();
    if (!g) return hp_errf(err, HP_NOMEM, "graph import: out of memory");
    hp_status s = import_graph(msg, g, err);
    if (s != HP_OK) {
        hp_graph_free(g);
        return s;
    }
    *out = g;
    return HP_OK;
}

/* ---- bytes ----------------------------------------------------------------------------------- */

hp_status hp_graph_pack(const hp_graph *g, uint8_t **data, size_t *len, hp_err *err) {
    *data = NULL;
    *len = 0;
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Graph *msg;
    hp_status s = hp_graph_export(g, &arena, &msg, err);
    if (s == HP_OK) {
        size_t n = hp__v1__graph__get_packed_size(msg);
        uint8_t *buf = NULL;
        if (n > HP_PROTO_MAX_BYTES)
            s = hp_errf(err, HP_LIMIT, "graph: encodes to %zu bytes, over the limit of %zu", n,
                        HP_PROTO_MAX_BYTES);
        else if (!(buf = hp_malloc(n ? n : 1)))
            s = hp_errf(err, HP_NOMEM, "graph: out of memory packing %zu bytes", n);
        if (s == HP_OK) {
            size_t wrote = hp__v1__graph__pack(msg, buf);
            HP_ASSERT(wrote == n);
            *data = buf;
            *len = n;
        }
    }
    hp_arena_fini(&arena);
    return s;
}

hp_status hp_graph_unpack(const uint8_t *data, size_t len, hp_graph **out, hp_err *err) {
    static const uint8_t empty[1];
    *out = NULL;
    if (len > HP_PROTO_MAX_BYTES)
        return hp_errf(err, HP_LIMIT, "graph: message of %zu bytes is over the limit of %zu", len,
                       HP_PROTO_MAX_BYTES);
    if (!data && len) return hp_errf(err, HP_INVALID, "graph: no data");
    hp_proto_alloc a;
    hp_arena arena;
    hp_arena_init(&arena);
    hp_proto_alloc_init_arena(&a, len, &arena);
    Hp__V1__Graph *msg = hp__v1__graph__unpack(&a.base, len, data ? data : empty);
    hp_status s = msg ? hp_proto_check_strings(&hp__v1__graph__descriptor, data, len, "graph", err)
                      : hp_proto_unpack_error(&a, "graph", len, err);
    if (s == HP_OK) s = hp_graph_import(msg, out, err);
    hp_arena_fini(&arena); /* the whole message */
    return s;
}
