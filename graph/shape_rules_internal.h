/* graph/shape_rules_internal.h — what the shape rules (shape_rules.c, shape_rules_nn.c) share:
 * dims for messages, and the checks of dtypes, ranks and attributes each rule starts with.
 * Private to graph/. */
#ifndef HP_GRAPH_SHAPE_RULES_INTERNAL_H
#define HP_GRAPH_SHAPE_RULES_INTERNAL_H

#include "graph/graph_internal.h"

#include <math.h>
#include <stdio.h>

/* "[8,256]" into a caller buffer. */
static inline const char *dims(const hp_type *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}
#define DIMS(t) dims((t), (char[128]){0}, 128)

static inline const hp_attr *attr(const hp_node *n, hp_attr_key k) {
    return hp_node_attr(n, k);
}

static inline hp_status need_float(const hp_type *t, const char *what, hp_err *err) {
    if (!hp_dtype_is_float(t->dtype))
        return hp_errf(err, HP_INVALID, "%s must be floating, got %s", what,
                       hp_dtype_name(t->dtype));
    return HP_OK;
}

static inline hp_status need_int(const hp_type *t, const char *what, hp_err *err) {
    if (t->dtype != HP_I32 && t->dtype != HP_I64)
        return hp_errf(err, HP_INVALID, "%s must be i32 or i64, got %s", what,
                       hp_dtype_name(t->dtype));
    return HP_OK;
}

static inline hp_status need_rank(const hp_type *t, int rank, const char *what, hp_err *err) {
    if (t->rank != rank)
        return hp_errf(err, HP_INVALID, "%s must have rank %d, got %s", what, rank, DIMS(t));
    return HP_OK;
}

static inline hp_status same_dtype(const hp_type *a, const hp_type *b, hp_err *err) {
    if (a->dtype != b->dtype)
        return hp_errf(err, HP_INVALID, "dtypes differ: %s vs %s", hp_dtype_name(a->dtype),
                       hp_dtype_name(b->dtype));
    return HP_OK;
}

static inline hp_status same_type(const hp_type *a, const hp_type *b, const char *what,
                                  hp_err *err) {
    if (!hp_type_eq(a, b)) {
        char x[96], y[96];
        return hp_errf(err, HP_INVALID, "%s: %s vs %s", what, hp_type_str(a, x, sizeof x),
                       hp_type_str(b, y, sizeof y));
    }
    return HP_OK;
}

static inline hp_status finite_attr(const hp_node *n, hp_attr_key k, bool positive, hp_err *err) {
    const hp_attr *a = attr(n, k);
    if (!a) return HP_OK;
    if (!isfinite(a->f) || (positive && !(a->f > 0)))
        return hp_errf(err, HP_INVALID, "attribute '%s' is %g, must be %s", hp_attr_key_name(k),
                       a->f, positive ? "finite and > 0" : "finite");
    return HP_OK;
}

static inline hp_status bool_attr(const hp_node *n, hp_attr_key k, hp_err *err) {
    const hp_attr *a = attr(n, k);
    if (a && a->i != 0 && a->i != 1)
        return hp_errf(err, HP_INVALID, "attribute '%s' is %lld, must be 0 or 1",
                       hp_attr_key_name(k), (long long)a->i);
    return HP_OK;
}

/* A shape attribute: rank <= HP_MAX_RANK, dims >= 0 (allow_minus1: one -1 or any -1). */
static inline hp_status shape_attr(const hp_node *n, hp_attr_key k, hp_type *t, hp_err *err) {
    const hp_attr *a = attr(n, k);
    t->rank = a->ints.n;
    for (int i = 0; i < a->ints.n; i++) {
        if (a->ints.v[i] < 0 || a->ints.v[i] > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "attribute '%s': dim %d is %lld", hp_attr_key_name(k),
                           i, (long long)a->ints.v[i]);
        t->shape[i] = a->ints.v[i];
    }
    return HP_OK;
}

/* An op's optional {dtype=f32}: its f32 sums stored as they are (mm, embedding_dense_backward
 * of bf16 operands); what, the message for any other dtype. */
static inline hp_status widened(const hp_node *n, hp_type *out, const char *what, hp_err *err) {
    const hp_attr *dt = attr(n, HP_ATTR_DTYPE);
    if (!dt) return HP_OK;
    if (dt->dtype != HP_F32)
        return hp_errf(err, HP_INVALID, "dtype %s: %s", hp_dtype_name(dt->dtype), what);
    out->dtype = HP_F32;
    return HP_OK;
}

#endif
