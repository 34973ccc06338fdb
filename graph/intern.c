/* graph/intern.c — one copy per graph of each distinct array of output types, attributes or
 * placements that its nodes point at.
 *
 * A model repeats itself: the 4096 layers of a deep Llama have the same shapes and the same
 * attributes, and every pass's new nodes (gathers, waits, slices of a bucket) repeat them
 * again. Storing them once per node cost a 4096-layer compile ~340 MB of fresh arena, and
 * fresh pages are what a first compile pays for most (a fault and the kernel's zeroing per
 * page). Node storage is immutable once appended (a pass builds a new graph instead of
 * editing one), so equal arrays can be shared: hp_graph_append and hp_node_set_placements
 * look each array up here and point at the graph's earlier copy when there is one.
 *
 * The table is open addressing over (kind, length, contents), with equality by value (types up
 * to their rank, attributes by kind, strings by content), and grows at half full. It holds
 * pointers into the graph's arena, which outlives it (an adopting graph takes the arena;
 * hp_graph_free frees the table).
 */
#include "graph/graph_internal.h"

#include <string.h>

enum { K_TYPES, K_ATTRS, K_PLACEMENTS };

typedef struct {
    const void *p; /* NULL: empty slot */
    uint32_t hash;
    uint16_t n;
    uint16_t kind;
} intern_slot;

typedef struct hp_intern {
    intern_slot *slot;
    uint32_t cap, used; /* cap a power of two */
} hp_intern;

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h = (h ^ v) * UINT64_C(0x9E3779B97F4A7C15);
    return h ^ (h >> 29);
}

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = mix(h, v);
    }
    uint64_t last = 0;
    memcpy(&last, s, n);
    return mix(h, last ^ ((uint64_t)n << 56));
}

static uint64_t mix_f64(uint64_t h, double f) {
    uint64_t v;
    memcpy(&v, &f, 8);
    return mix(h, v);
}

static uint64_t hash_types(const hp_type *t, int n) {
    uint64_t h = mix(K_TYPES, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        h = mix(h, (uint64_t)t[i].dtype << 32 | (uint32_t)t[i].rank);
        for (int d = 0; d < t[i].rank && d < HP_MAX_RANK; d++) h = mix(h, (uint64_t)t[i].shape[d]);
    }
    return h;
}

static bool types_eq(const hp_type *a, const hp_type *b, int n) {
    for (int i = 0; i < n; i++) /* a rank out of range (refused later) is never shared */
        if (a[i].rank < 0 || a[i].rank > HP_MAX_RANK || !hp_type_eq(&a[i], &b[i])) return false;
    return true;
}

static uint64_t hash_attrs(const hp_attr *a, int n) {
    uint64_t h = mix(K_ATTRS, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        h = mix(h, (uint64_t)a[i].key << 8 | (uint64_t)a[i].kind);
        switch (a[i].kind) {
        case HP_ATTR_KIND_INT:
            h = mix(h, (uint64_t)a[i].i);
            break;
        case HP_ATTR_KIND_FLOAT:
            h = mix_f64(h, a[i].f);
            break;
        case HP_ATTR_KIND_INTS:
            h = mix(h, (uint64_t)a[i].ints.n);
            for (int k = 0; k < a[i].ints.n && k < HP_MAX_ATTR_INTS; k++)
                h = mix(h, (uint64_t)a[i].ints.v[k]);
            break;
        case HP_ATTR_KIND_DTYPE:
            h = mix(h, (uint64_t)a[i].dtype);
            break;
        case HP_ATTR_KIND_STR:
            h = mix_bytes(h, a[i].s, strlen(a[i].s));
            break;
        case HP_ATTR_KIND_INIT:
            h = mix(h, (uint64_t)a[i].init.kind);
            h = mix_f64(mix_f64(h, a[i].init.mean), a[i].init.std);
            h = mix_f64(mix_f64(h, a[i].init.a), a[i].init.b);
            break;
        }
    }
    return h;
}

static bool same_f64(double x, double y) { /* bitwise: -0 and NaN payloads kept apart */
    return !memcmp(&x, &y, sizeof x);
}

/* Stricter than hp_graph_eq's attribute test (graph.c), which takes any two NaNs, and an init's
 * -0 and 0, as equal: right for comparing graphs, but a shared copy must keep every bit. */
static bool attr_eq(const hp_attr *x, const hp_attr *y) {
    if (x->key != y->key || x->kind != y->kind) return false;
    switch (x->kind) {
    case HP_ATTR_KIND_INT:
        return x->i == y->i;
    case HP_ATTR_KIND_FLOAT:
        return same_f64(x->f, y->f);
    case HP_ATTR_KIND_INTS:
        if (x->ints.n != y->ints.n || x->ints.n < 0 || x->ints.n > HP_MAX_ATTR_INTS) return false;
        return !memcmp(x->ints.v, y->ints.v, (size_t)x->ints.n * sizeof x->ints.v[0]);
    case HP_ATTR_KIND_DTYPE:
        return x->dtype == y->dtype;
    case HP_ATTR_KIND_STR:
        return !strcmp(x->s, y->s);
    case HP_ATTR_KIND_INIT:
        return x->init.kind == y->init.kind && same_f64(x->init.mean, y->init.mean) &&
               same_f64(x->init.std, y->init.std) && same_f64(x->init.a, y->init.a) &&
               same_f64(x->init.b, y->init.b);
    }
    return false;
}

static bool attrs_eq(const hp_attr *a, const hp_attr *b, int n) {
    for (int i = 0; i < n; i++)
        if (!attr_eq(&a[i], &b[i])) return false;
    return true;
}

static uint64_t hash_placements(const hp_placement *p, int n) {
    uint64_t h = mix(K_PLACEMENTS, (uint64_t)n);
    for (int i = 0; i < n; i++)
        h = mix(h, (uint64_t)p[i].kind << 40 | (uint64_t)(uint32_t)p[i].dim << 8 |
                       (uint64_t)p[i].reduce);
    return h;
}

static bool placements_eq(const hp_placement *a, const hp_placement *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].kind != b[i].kind || a[i].dim != b[i].dim || a[i].reduce != b[i].reduce)
            return false;
    return true;
}

static bool grow(hp_intern *t) {
    uint32_t cap = t->cap ? t->cap * 2 : 1024;
    intern_slot *s = hp_calloc(cap, sizeof *s);
    if (!s) return false;
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!t->slot[i].p) continue;
        uint32_t j = t->slot[i].hash & (cap - 1);
        while (s[j].p) j = (j + 1) & (cap - 1);
        s[j] = t->slot[i];
    }
    hp_free(t->slot);
    t->slot = s;
    t->cap = cap;
    return true;
}

/* The slot where (kind, n, hash) is or would go: *found says which. NULL: out of memory. */
static intern_slot *find(hp_graph *g, int kind, const void *p, int n, uint32_t hash, bool *found) {
    hp_intern *t = g->intern;
    if (!t) {
        if (!(t = g->intern = hp_calloc(1, sizeof *t))) return NULL;
    }
    if ((t->used + 1) * 2 > t->cap && !grow(t)) return NULL;
    for (uint32_t j = hash & (t->cap - 1);; j = (j + 1) & (t->cap - 1)) {
        intern_slot *s = &t->slot[j];
        if (!s->p) {
            *found = false;
            return s;
        }
        if (s->hash != hash || s->n != n || s->kind != kind) continue;
        bool eq = kind == K_TYPES   ? types_eq(s->p, p, n)
                  : kind == K_ATTRS ? attrs_eq(s->p, p, n)
                                    : placements_eq(s->p, p, n);
        if (eq) {
            *found = true;
            return s;
        }
    }
}

/* The graph's copy of p[0..n) of the given kind: an equal one it holds, or a new one in its
 * arena (an attribute list's strings copied too). */
static void *intern(hp_graph *g, int kind, const void *p, int n, size_t size) {
    if (n <= 0) return NULL;
    uint32_t h = (uint32_t)(kind == K_TYPES   ? hash_types(p, n)
                            : kind == K_ATTRS ? hash_attrs(p, n)
                                              : hash_placements(p, n));
    bool found;
    intern_slot *s = find(g, kind, p, n, h, &found);
    if (!s) return NULL;
    if (found) return (void *)s->p;
    void *copy = hp_arena_memdup(&g->arena, p, (size_t)n * size);
    if (!copy) return NULL;
    if (kind == K_ATTRS) {
        hp_attr *a = copy;
        for (int i = 0; i < n; i++)
            if (a[i].kind == HP_ATTR_KIND_STR && !(a[i].s = hp_arena_strdup(&g->arena, a[i].s)))
                return NULL;
    }
    *s = (intern_slot){.p = copy, .hash = h, .n = (uint16_t)n, .kind = (uint16_t)kind};
    g->intern->used++;
    return copy;
}

hp_type *hp__intern_types(hp_graph *g, const hp_type *t, int n) {
    return intern(g, K_TYPES, t, n, sizeof *t);
}

hp_attr *hp__intern_attrs(hp_graph *g, const hp_attr *a, int n) {
    return intern(g, K_ATTRS, a, n, sizeof *a);
}

hp_placement *hp__intern_placements(hp_graph *g, const hp_placement *p, int n) {
    return intern(g, K_PLACEMENTS, p, n, sizeof *p);
}

void hp__intern_free(hp_graph *g) {
    if (!g->intern) return;
    hp_free(g->intern->slot);
    hp_free(g->intern);
    g->intern = NULL;
}
