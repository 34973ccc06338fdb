/* graph/placement.c — placement words (parse, print) and what a placement means for a
 * tensor's local piece: the local shape on a mesh, the attributes that spell sizes. */
#include "graph/graph_internal.h"
#include "graph/proto_internal.h"

#include <stdio.h>
#include <string.h>

bool hp_placement_eq(hp_placement a, hp_placement b) {
    if (a.kind != b.kind) return false;
    if (a.kind == HP_PLACE_SHARD) return a.dim == b.dim;
    if (a.kind == HP_PLACE_PARTIAL) return a.reduce == b.reduce;
    return true;
}

static const char *reduce_word(hp_reduce_op op) {
    return op == HP_REDUCE_AVG ? "avg" : op == HP_REDUCE_MAX ? "max" : "sum";
}

/* "(sum)" / "(avg)" / "(max)" after a Partial; "" or "()" is sum. */
static bool parse_reduce(const char *s, hp_reduce_op *op) {
    if (!*s || !strcmp(s, "()") || !strcmp(s, "(sum)")) {
        *op = HP_REDUCE_SUM;
        return true;
    }
    if (!strcmp(s, "(avg)")) {
        *op = HP_REDUCE_AVG;
        return true;
    }
    if (!strcmp(s, "(max)")) {
        *op = HP_REDUCE_MAX;
        return true;
    }
    return false;
}

/* "(d)" with 0 <= d < HP_MAX_RANK. */
static bool parse_dim(const char *s, int *d) {
    if (s[0] != '(' || s[1] < '0' || s[1] > '9') return false;
    int v = 0;
    const char *c = s + 1;
    while (*c >= '0' && *c <= '9' && v < HP_MAX_RANK) v = v * 10 + (*c++ - '0');
    if (strcmp(c, ")") || v >= HP_MAX_RANK) return false;
    *d = v;
    return true;
}

hp_status hp_placement_parse(const char *s, hp_placement *p, hp_err *err) {
    char q[HP__QUOTE_MAX];
    memset(p, 0, sizeof *p);
    if (!s) s = "";
    if (!strcmp(s, "Replicate") || !strcmp(s, "Replicate()") || !strcmp(s, "R")) {
        p->kind = HP_PLACE_REPLICATE;
        return HP_OK;
    }
    const char *rest = !strncmp(s, "Shard", 5) ? s + 5 : s[0] == 'S' ? s + 1 : NULL;
    if (rest && parse_dim(rest, &p->dim)) {
        p->kind = HP_PLACE_SHARD;
        return HP_OK;
    }
    rest = !strncmp(s, "Partial", 7) ? s + 7 : s[0] == 'P' && s[1] == '(' ? s + 1 : NULL;
    if (rest && parse_reduce(rest, &p->reduce)) {
        p->kind = HP_PLACE_PARTIAL;
        return HP_OK;
    }
    return hp_errf(err, HP_PARSE,
                   "placement '%s': expected Replicate, Shard(d) with 0 <= d < %d or "
                   "Partial(sum|avg|max) (short: R, S(d), P(sum))",
                   hp__quote(s, q), HP_MAX_RANK);
}

char *hp_placement_str(const hp_placement *p, char *buf, size_t len) {
    switch (p->kind) {
    case HP_PLACE_REPLICATE:
        snprintf(buf, len, "Replicate");
        break;
    case HP_PLACE_SHARD:
        snprintf(buf, len, "Shard(%d)", p->dim);
        break;
    case HP_PLACE_PARTIAL:
        snprintf(buf, len, "Partial(%s)", reduce_word(p->reduce));
        break;
    default:
        snprintf(buf, len, "?%d", (int)p->kind);
    }
    return buf;
}

char *hp_placement_short(const hp_placement *p, char *buf, size_t len) {
    switch (p->kind) {
    case HP_PLACE_REPLICATE:
        snprintf(buf, len, "R");
        break;
    case HP_PLACE_SHARD:
        snprintf(buf, len, "S(%d)", p->dim);
        break;
    case HP_PLACE_PARTIAL:
        snprintf(buf, len, "P(%s)", reduce_word(p->reduce));
        break;
    default:
        snprintf(buf, len, "?%d", (int)p->kind);
    }
    return buf;
}

/* ---- local pieces --------------------------------------------------------------------------- */

hp_status hp_local_type(const hp_type *global, const hp_placement *pl, const int64_t *sizes,
                        int ndim, bool even, hp_type *local, hp_err *err) {
    *local = *global;
    for (int i = 0; i < ndim; i++) {
        if (pl[i].kind != HP_PLACE_SHARD) continue;
        int d = pl[i].dim;
        char b[16];
        if (d < 0 || d >= global->rank)
            return hp_errf(err, HP_INVALID, "mesh dim %d: %s of a rank-%d tensor", i,
                           hp_placement_short(&pl[i], b, sizeof b), global->rank);
        if (sizes[i] < 1)
            return hp_errf(err, HP_INVALID, "mesh dim %d has size %lld", i, (long long)sizes[i]);
        int64_t len = local->shape[d];
        if (even && len % sizes[i])
            return hp_errf(err, HP_INVALID,
                           "mesh dim %d: dim %d of size %lld does not split "
                           "evenly over %lld ranks",
                           i, d, (long long)len, (long long)sizes[i]);
        local->shape[d] = (len + sizes[i] - 1) / sizes[i];
    }
    return HP_OK;
}

hp_status hp_local_box(const hp_type *global, const hp_placement *pl, const int64_t *sizes,
                       const int64_t *coord, int ndim, int64_t *off, int64_t *len, hp_err *err) {
    int64_t ext[HP_MAX_RANK]; /* the current piece's extent, padding included */
    for (int d = 0; d < global->rank; d++) {
        off[d] = 0;
        len[d] = ext[d] = global->shape[d];
    }
    for (int i = 0; i < ndim; i++) {
        if (pl[i].kind != HP_PLACE_SHARD) continue;
        int d = pl[i].dim;
        if (d < 0 || d >= global->rank || sizes[i] < 1 || coord[i] < 0 || coord[i] >= sizes[i])
            return hp_errf(err, HP_INVALID, "mesh dim %d: coordinate %lld of %lld, shard dim %d", i,
                           (long long)coord[i], (long long)sizes[i], d);
        int64_t chunk = (ext[d] + sizes[i] - 1) / sizes[i], start = coord[i] * chunk;
        int64_t real = len[d] - start;
        off[d] += start;
        len[d] = real < 0 ? 0 : real > chunk ? chunk : real;
        ext[d] = chunk;
    }
    return HP_OK;
}

void hp_localize_attrs(const hp_node *n, const hp_type *local_out, hp_attr *attrs) {
    for (int i = 0; i < n->n_attrs; i++) {
        attrs[i] = n->attrs[i];
        hp_attr *a = &attrs[i];
        switch (n->op) {
        case HP_OP_VIEW:
        case HP_OP_RESHAPE:
        case HP_OP_EXPAND:
        case HP_OP_FULL:
        case HP_OP_ZEROS:
        case HP_OP_ONES:
        case HP_OP_SLICE_BACKWARD:
            if (a->key == HP_ATTR_SHAPE && a->ints.n == local_out[0].rank)
                memcpy(a->ints.v, local_out[0].shape, sizeof(int64_t) * (size_t)a->ints.n);
            break;
        case HP_OP_EMBEDDING_DENSE_BACKWARD:
        case HP_OP_CHUNKED_EMBEDDING_BACKWARD:
            if (a->key == HP_ATTR_NUM_WEIGHTS && local_out[0].rank == 2)
                a->i = local_out[0].shape[0];
            break;
        default:
            break;
        }
    }
}
