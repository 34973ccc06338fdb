/* graph/shape_rules.c — one shape rule per op family (named in graph/ops.def), and the shared
 * dim / broadcast / slice helpers. A rule checks its inputs' dtypes and shapes and its
 * attributes' ranges, then fills the output types. Messages name the offending dim or
 * attribute; hp__check_node prefixes the node. Semantics: docs/op-semantics.md. */
#include "graph/graph_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* "[8,256]" into a caller buffer. */
static const char *dims(const hp_type *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}
#define DIMS(t) dims((t), (char[128]){0}, 128)

static const hp_attr *attr(const hp_node *n, hp_attr_key k) {
    return hp_node_attr(n, k);
}

/* ---- shared helpers ------------------------------------------------------------------------- */

hp_status hp__norm_dim(int64_t d, int rank, const char *what, int *out, hp_err *err) {
    *out = 0;
    if (d < -rank || d >= rank || rank == 0)
        return hp_errf(err, HP_INVALID, "%s %lld is out of range for rank %d", what, (long long)d,
                       rank);
    *out = (int)(d < 0 ? d + rank : d);
    return HP_OK;
}

hp_status hp__broadcast(const hp_type *a, const hp_type *b, hp_type *out, hp_err *err) {
    int r = a->rank > b->rank ? a->rank : b->rank;
    hp_type t = {.dtype = a->dtype, .rank = r};
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return hp_errf(err, HP_INVALID,
                           "shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", DIMS(a),
                           DIMS(b), i, (long long)da, (long long)db);
        t.shape[i] = da == 1 ? db : da;
    }
    *out = t;
    return HP_OK;
}

void hp__slice_bounds(int64_t n, int64_t start, int64_t end, int64_t step, int64_t *s,
                      int64_t *len) {
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (start > n) start = n;
    if (end < 0) end = 0;
    if (end > n) end = n;
    if (step < 1) step = 1;
    *s = start;
    *len = end > start ? (end - start + step - 1) / step : 0;
}

void hp__reduce_mask(const hp_node *n, int rank, bool mask[HP_MAX_RANK]) {
    const hp_attr *a = attr(n, HP_ATTR_DIMS);
    for (int i = 0; i < HP_MAX_RANK; i++) mask[i] = !a || a->ints.n == 0;
    if (!a) return;
    for (int i = 0; i < a->ints.n; i++) {
        int d;
        if (hp__norm_dim(a->ints.v[i], rank, "dim", &d, NULL) == HP_OK) mask[d] = true;
    }
}

static hp_status need_float(const hp_type *t, const char *what, hp_err *err) {
    if (!hp_dtype_is_float(t->dtype))
        return hp_errf(err, HP_INVALID, "%s must be floating, got %s", what,
                       hp_dtype_name(t->dtype));
    return HP_OK;
}

static hp_status need_int(const hp_type *t, const char *what, hp_err *err) {
    if (t->dtype != HP_I32 && t->dtype != HP_I64)
        return hp_errf(err, HP_INVALID, "%s must be i32 or i64, got %s", what,
                       hp_dtype_name(t->dtype));
    return HP_OK;
}

static hp_status need_rank(const hp_type *t, int rank, const char *what, hp_err *err) {
    if (t->rank != rank)
        return hp_errf(err, HP_INVALID, "%s must have rank %d, got %s", what, rank, DIMS(t));
    return HP_OK;
}

static hp_status same_dtype(const hp_type *a, const hp_type *b, hp_err *err) {
    if (a->dtype != b->dtype)
        return hp_errf(err, HP_INVALID, "dtypes differ: %s vs %s", hp_dtype_name(a->dtype),
                       hp_dtype_name(b->dtype));
    return HP_OK;
}

static hp_status same_type(const hp_type *a, const hp_type *b, const char *what, hp_err *err) {
    if (!hp_type_eq(a, b)) {
        char x[96], y[96];
        return hp_errf(err, HP_INVALID, "%s: %s vs %s", what, hp_type_str(a, x, sizeof x),
                       hp_type_str(b, y, sizeof y));
    }
    return HP_OK;
}

static hp_status finite_attr(const hp_node *n, hp_attr_key k, bool positive, hp_err *err) {
    const hp_attr *a = attr(n, k);
    if (!a) return HP_OK;
    if (!isfinite(a->f) || (positive && !(a->f > 0)))
        return hp_errf(err, HP_INVALID, "attribute '%s' is %g, must be %s", hp_attr_key_name(k),
                       a->f, positive ? "finite and > 0" : "finite");
    return HP_OK;
}

static hp_status bool_attr(const hp_node *n, hp_attr_key k, hp_err *err) {
    const hp_attr *a = attr(n, k);
    if (a && a->i != 0 && a->i != 1)
        return hp_errf(err, HP_INVALID, "attribute '%s' is %lld, must be 0 or 1",
                       hp_attr_key_name(k), (long long)a->i);
    return HP_OK;
}

/* A shape attribute: rank <= HP_MAX_RANK, dims >= 0 (allow_minus1: one -1 or any -1). */
static hp_status shape_attr(const hp_node *n, hp_attr_key k, hp_type *t, hp_err *err) {
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

/* ---- inputs and creation -------------------------------------------------------------------- */

hp_status hp__shape_placeholder(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    out[0] = n->out[0];
    HP_TRY(hp_type_check(&out[0], err));
    int64_t kind = hp_node_int(n, HP_ATTR_KIND, -1);
    if (kind < HP_INPUT_PARAM || kind > HP_INPUT_DATA)
        return hp_errf(err, HP_INVALID, "kind %lld is not param (0), buffer (1) or data (2)",
                       (long long)kind);
    const hp_attr *fqn = attr(n, HP_ATTR_FQN);
    if (kind != HP_INPUT_DATA && (!fqn || !fqn->s || !fqn->s[0]))
        return hp_errf(err, HP_INVALID, "a %s needs a non-empty fqn",
                       kind == HP_INPUT_PARAM ? "parameter" : "buffer");
    if (fqn && (!fqn->s || !fqn->s[0]))
        return hp_errf(err, HP_INVALID, "a data input's fqn is empty");
    if (kind == HP_INPUT_PARAM) HP_TRY(need_float(&out[0], "a parameter", err));
    if (attr(n, HP_ATTR_INIT) && kind == HP_INPUT_DATA)
        return hp_errf(err, HP_INVALID, "a data input takes no init spec");
    const hp_attr *gs = attr(n, HP_ATTR_GLOBAL_SHAPE), *gz = attr(n, HP_ATTR_GROUP_SIZE);
    if (gz && !gs) return hp_errf(err, HP_INVALID, "group_size needs a global_shape");
    if (!gs) return HP_OK;
    hp_type global = {.dtype = out[0].dtype};
    HP_TRY(shape_attr(n, HP_ATTR_GLOBAL_SHAPE, &global, err));
    HP_TRY(hp_type_check(&global, err));
    if (!gz) { /* an N-D shard: its placements say the split (the verifier checks them) */
        if (global.rank != out[0].rank)
            return hp_errf(err, HP_INVALID, "global_shape %s and shard %s differ in rank",
                           DIMS(&global), DIMS(&out[0]));
        return HP_OK;
    }
    int64_t g = gz->i;
    if (g < 1 || g > 65536)
        return hp_errf(err, HP_INVALID, "group_size %lld outside [1, 65536]", (long long)g);
    if (global.rank != out[0].rank || global.rank < 1)
        return hp_errf(err, HP_INVALID, "global_shape %s and shard %s differ in rank",
                       DIMS(&global), DIMS(&out[0]));
    for (int d = 1; d < global.rank; d++)
        if (global.shape[d] != out[0].shape[d])
            return hp_errf(err, HP_INVALID, "global_shape %s and shard %s differ in dim %d",
                           DIMS(&global), DIMS(&out[0]), d);
    int64_t want = (global.shape[0] + g - 1) / g;
    if (out[0].shape[0] != want)
        return hp_errf(err, HP_INVALID, "a shard of %s over %lld ranks has dim 0 %lld, not %lld",
                       DIMS(&global), (long long)g, (long long)want, (long long)out[0].shape[0]);
    return HP_OK;
}

hp_status hp__shape_creation(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    const hp_attr *dt = attr(n, HP_ATTR_DTYPE);
    out[0].dtype = dt ? dt->dtype : HP_F32;
    return shape_attr(n, HP_ATTR_SHAPE, &out[0], err);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

hp_status hp__shape_binary(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(same_dtype(&in[0], &in[1], err));
    if (in[0].dtype == HP_BOOL) return hp_errf(err, HP_INVALID, "arithmetic on bool operands");
    return hp__broadcast(&in[0], &in[1], &out[0], err);
}

hp_status hp__shape_compare(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(same_dtype(&in[0], &in[1], err));
    HP_TRY(hp__broadcast(&in[0], &in[1], &out[0], err));
    out[0].dtype = HP_BOOL;
    return HP_OK;
}

hp_status hp__shape_where(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (in[0].dtype != HP_BOOL)
        return hp_errf(err, HP_INVALID, "condition must be bool, got %s",
                       hp_dtype_name(in[0].dtype));
    HP_TRY(same_dtype(&in[1], &in[2], err));
    hp_type t;
    HP_TRY(hp__broadcast(&in[1], &in[2], &t, err));
    HP_TRY(hp__broadcast(&t, &in[0], &out[0], err));
    out[0].dtype = in[1].dtype;
    return HP_OK;
}

hp_status hp__shape_unary_float(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    if (n->op == HP_OP_GELU) {
        const hp_attr *a = attr(n, HP_ATTR_APPROXIMATE);
        if (a && (a->i < 0 || a->i > 1))
            return hp_errf(err, HP_INVALID, "approximate is %lld, must be 0 (none) or 1 (tanh)",
                           (long long)a->i);
    }
    HP_TRY(finite_attr(n, HP_ATTR_EXPONENT, false, err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_to_copy(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    out[0] = in[0];
    out[0].dtype = attr(n, HP_ATTR_DTYPE)->dtype;
    return HP_OK;
}

hp_status hp__shape_backward_pair(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "grad", err));
    HP_TRY(same_type(&in[0], &in[1], "grad and saved tensor differ", err));
    if (n->op == HP_OP_GELU_BACKWARD) {
        const hp_attr *a = attr(n, HP_ATTR_APPROXIMATE);
        if (a && (a->i < 0 || a->i > 1))
            return hp_errf(err, HP_INVALID, "approximate is %lld, must be 0 or 1", (long long)a->i);
    }
    out[0] = in[0];
    return HP_OK;
}

/* ---- reductions ----------------------------------------------------------------------------- */

hp_status hp__shape_reduce(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (n->op == HP_OP_MEAN) HP_TRY(need_float(&in[0], "input", err));
    if (in[0].dtype == HP_BOOL) return hp_errf(err, HP_INVALID, "cannot reduce a bool tensor");
    HP_TRY(bool_attr(n, HP_ATTR_KEEPDIM, err));
    const hp_attr *a = attr(n, HP_ATTR_DIMS);
    bool mask[HP_MAX_RANK] = {false};
    for (int i = 0; i < a->ints.n; i++) {
        int d;
        HP_TRY(hp__norm_dim(a->ints.v[i], in[0].rank, "dims entry", &d, err));
        if (mask[d]) return hp_errf(err, HP_INVALID, "dim %d listed twice in dims", d);
        mask[d] = true;
    }
    if (a->ints.n == 0)
        for (int i = 0; i < in[0].rank; i++) mask[i] = true;
    bool keep = hp_node_int(n, HP_ATTR_KEEPDIM, 0) != 0;
    hp_type t = {.dtype = in[0].dtype, .rank = 0};
    for (int i = 0; i < in[0].rank; i++) {
        if (!mask[i])
            t.shape[t.rank++] = in[0].shape[i];
        else if (keep)
            t.shape[t.rank++] = 1;
    }
    if (n->op == HP_OP_AMAX) {
        for (int i = 0; i < in[0].rank; i++)
            if (mask[i] && in[0].shape[i] == 0)
                return hp_errf(err, HP_INVALID, "amax over an empty dim %d", i);
    }
    out[0] = t;
    return HP_OK;
}

/* ---- shapes --------------------------------------------------------------------------------- */

hp_status hp__shape_view(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    const hp_attr *a = attr(n, HP_ATTR_SHAPE);
    hp_type t = {.dtype = in[0].dtype, .rank = a->ints.n};
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < a->ints.n; i++) {
        int64_t d = a->ints.v[i];
        if (d == -1) {
            if (infer >= 0) return hp_errf(err, HP_INVALID, "shape has more than one -1");
            infer = i;
            continue;
        }
        if (d < 0 || d > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "shape dim %d is %lld", i, (long long)d);
        if (d && known > HP_MAX_NUMEL / d)
            return hp_errf(err, HP_INVALID, "shape has more than 2^50 elements");
        known *= d;
        t.shape[i] = d;
    }
    int64_t numel = hp_type_numel(&in[0]);
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return hp_errf(err, HP_INVALID, "cannot infer the -1 in the view of %s", DIMS(&in[0]));
        t.shape[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return hp_errf(err, HP_INVALID, "cannot view %s (%lld elements) as %s", DIMS(&in[0]),
                       (long long)numel, DIMS(&t));
    out[0] = t;
    return HP_OK;
}

hp_status hp__shape_permute(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    const hp_attr *a = attr(n, HP_ATTR_PERM);
    if (a->ints.n != in[0].rank)
        return hp_errf(err, HP_INVALID, "perm has %d entries for rank %d", a->ints.n, in[0].rank);
    bool seen[HP_MAX_RANK] = {false};
    hp_type t = {.dtype = in[0].dtype, .rank = in[0].rank};
    for (int i = 0; i < a->ints.n; i++) {
        int d;
        HP_TRY(hp__norm_dim(a->ints.v[i], in[0].rank, "perm entry", &d, err));
        if (seen[d]) return hp_errf(err, HP_INVALID, "perm repeats dim %d", d);
        seen[d] = true;
        t.shape[i] = in[0].shape[d];
    }
    out[0] = t;
    return HP_OK;
}

hp_status hp__shape_transpose(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int d0, d1;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM0)->i, in[0].rank, "dim0", &d0, err));
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM1)->i, in[0].rank, "dim1", &d1, err));
    out[0] = in[0];
    out[0].shape[d0] = in[0].shape[d1];
    out[0].shape[d1] = in[0].shape[d0];
    return HP_OK;
}

hp_status hp__shape_t(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (in[0].rank > 2)
        return hp_errf(err, HP_INVALID, "t expects rank <= 2, got %s", DIMS(&in[0]));
    out[0] = in[0];
    if (in[0].rank == 2) {
        out[0].shape[0] = in[0].shape[1];
        out[0].shape[1] = in[0].shape[0];
    }
    return HP_OK;
}

hp_status hp__shape_expand(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    const hp_attr *a = attr(n, HP_ATTR_SHAPE);
    int r = a->ints.n, off = r - in[0].rank;
    if (off < 0)
        return hp_errf(err, HP_INVALID, "cannot expand %s to fewer dims (%d)", DIMS(&in[0]), r);
    hp_type t = {.dtype = in[0].dtype, .rank = r};
    for (int i = 0; i < r; i++) {
        int64_t want = a->ints.v[i];
        int64_t have = i >= off ? in[0].shape[i - off] : -2;
        if (want == -1) {
            if (have == -2) return hp_errf(err, HP_INVALID, "expand: -1 at new leading dim %d", i);
            want = have;
        }
        if (want < 0 || want > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "expand: dim %d is %lld", i, (long long)want);
        if (have >= 0 && have != want && have != 1)
            return hp_errf(err, HP_INVALID, "cannot expand %s: dim %d is %lld, not 1 or %lld",
                           DIMS(&in[0]), i, (long long)have, (long long)want);
        t.shape[i] = want;
    }
    out[0] = t;
    return HP_OK;
}

static hp_status slice_args(const hp_node *n, const hp_type *t, int *dim, int64_t *start,
                            int64_t *len, hp_err *err) {
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, t->rank, "dim", dim, err));
    int64_t step = hp_node_int(n, HP_ATTR_STEP, 1);
    if (step < 1 || step > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "step %lld must be >= 1", (long long)step);
    int64_t s = attr(n, HP_ATTR_START)->i, e = attr(n, HP_ATTR_END)->i;
    if (s < -HP_MAX_NUMEL || s > HP_MAX_NUMEL || e < -HP_MAX_NUMEL || e > HP_MAX_NUMEL)
        return hp_errf(err, HP_INVALID, "slice bounds [%lld, %lld) out of range", (long long)s,
                       (long long)e);
    hp__slice_bounds(t->shape[*dim], s, e, step, start, len);
    return HP_OK;
}

hp_status hp__shape_slice(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int dim;
    int64_t start, len;
    HP_TRY(slice_args(n, &in[0], &dim, &start, &len, err));
    out[0] = in[0];
    out[0].shape[dim] = len;
    return HP_OK;
}

hp_status hp__shape_slice_backward(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    hp_type full = {.dtype = in[0].dtype};
    HP_TRY(shape_attr(n, HP_ATTR_SHAPE, &full, err));
    if (full.rank != in[0].rank)
        return hp_errf(err, HP_INVALID, "shape %s and grad %s differ in rank", DIMS(&full),
                       DIMS(&in[0]));
    int dim;
    int64_t start, len;
    HP_TRY(slice_args(n, &full, &dim, &start, &len, err));
    hp_type expect = full;
    expect.shape[dim] = len;
    HP_TRY(same_type(&in[0], &expect, "grad does not match the slice", err));
    out[0] = full;
    return HP_OK;
}

hp_status hp__shape_cat(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int dim;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank, "dim", &dim, err));
    hp_type t = in[0];
    for (int i = 1; i < n->n_in; i++) {
        HP_TRY(same_dtype(&in[0], &in[i], err));
        if (in[i].rank != in[0].rank)
            return hp_errf(err, HP_INVALID, "input %d has rank %d, input 0 has %d", i, in[i].rank,
                           in[0].rank);
        for (int d = 0; d < t.rank; d++)
            if (d != dim && in[i].shape[d] != in[0].shape[d])
                return hp_errf(err, HP_INVALID, "input %d is %s, input 0 is %s (dim %d differs)", i,
                               DIMS(&in[i]), DIMS(&in[0]), d);
        t.shape[dim] += in[i].shape[dim];
        if (t.shape[dim] > HP_MAX_DIM) return hp_errf(err, HP_INVALID, "cat dim too large");
    }
    out[0] = t;
    return HP_OK;
}

hp_status hp__shape_unsqueeze(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (in[0].rank >= HP_MAX_RANK)
        return hp_errf(err, HP_INVALID, "rank would exceed %d", HP_MAX_RANK);
    int d;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank + 1, "dim", &d, err));
    hp_type t = {.dtype = in[0].dtype, .rank = in[0].rank + 1};
    for (int i = 0, j = 0; i < t.rank; i++) t.shape[i] = i == d ? 1 : in[0].shape[j++];
    out[0] = t;
    return HP_OK;
}

hp_status hp__shape_squeeze(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int d;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank, "dim", &d, err));
    if (in[0].shape[d] != 1)
        return hp_errf(err, HP_INVALID, "cannot squeeze dim %d of %s (size is not 1)", d,
                       DIMS(&in[0]));
    hp_type t = {.dtype = in[0].dtype, .rank = in[0].rank - 1};
    for (int i = 0, j = 0; i < in[0].rank; i++)
        if (i != d) t.shape[j++] = in[0].shape[i];
    out[0] = t;
    return HP_OK;
}

hp_status hp__shape_identity(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (n->op == HP_OP_ALL_REDUCE) {
        int64_t gs = attr(n, HP_ATTR_GROUP_SIZE)->i, op = attr(n, HP_ATTR_REDUCE_OP)->i;
        if (gs < 1 || gs > 65536)
            return hp_errf(err, HP_INVALID, "group_size %lld outside [1, 65536]", (long long)gs);
        if (op < HP_REDUCE_SUM || op > HP_REDUCE_MAX)
            return hp_errf(err, HP_INVALID, "reduce_op %lld is not sum (0), avg (1) or max (2)",
                           (long long)op);
    }
    out[0] = in[0];
    return HP_OK;
}

/* ---- matrix products ------------------------------------------------------------------------ */

static hp_status mm_dtypes(const hp_type *a, const hp_type *b, hp_err *err) {
    HP_TRY(need_float(a, "lhs", err));
    return same_dtype(a, b, err);
}

/* An op's optional {dtype=f32}: its f32 sums stored as they are (mm, embedding_dense_backward
 * of bf16 operands); what, the message for any other dtype. */
static hp_status widened(const hp_node *n, hp_type *out, const char *what, hp_err *err) {
    const hp_attr *dt = attr(n, HP_ATTR_DTYPE);
    if (!dt) return HP_OK;
    if (dt->dtype != HP_F32)
        return hp_errf(err, HP_INVALID, "dtype %s: %s", hp_dtype_name(dt->dtype), what);
    out->dtype = HP_F32;
    return HP_OK;
}

hp_status hp__shape_mm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_rank(&in[0], 2, "lhs", err));
    HP_TRY(need_rank(&in[1], 2, "rhs", err));
    HP_TRY(mm_dtypes(&in[0], &in[1], err));
    if (in[0].shape[1] != in[1].shape[0])
        return hp_errf(err, HP_INVALID, "inner dims differ: %s x %s", DIMS(&in[0]), DIMS(&in[1]));
    int64_t s[2] = {in[0].shape[0], in[1].shape[1]};
    out[0] = hp_type_make(in[0].dtype, 2, s);
    return widened(n, &out[0], "a product's output is its operands' dtype or f32", err);
}

hp_status hp__shape_bmm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_rank(&in[0], 3, "lhs", err));
    HP_TRY(need_rank(&in[1], 3, "rhs", err));
    HP_TRY(mm_dtypes(&in[0], &in[1], err));
    if (in[0].shape[0] != in[1].shape[0])
        return hp_errf(err, HP_INVALID, "batch dims differ: %s x %s", DIMS(&in[0]), DIMS(&in[1]));
    if (in[0].shape[2] != in[1].shape[1])
        return hp_errf(err, HP_INVALID, "inner dims differ: %s x %s", DIMS(&in[0]), DIMS(&in[1]));
    int64_t s[3] = {in[0].shape[0], in[0].shape[1], in[1].shape[2]};
    out[0] = hp_type_make(in[0].dtype, 3, s);
    return HP_OK;
}

hp_status hp__shape_addmm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(hp__shape_mm(n, in + 1, out, err));
    HP_TRY(same_dtype(&in[0], &in[1], err));
    HP_TRY(finite_attr(n, HP_ATTR_ALPHA, false, err));
    HP_TRY(finite_attr(n, HP_ATTR_BETA, false, err));
    hp_type b;
    HP_TRY(hp__broadcast(&in[0], &out[0], &b, err));
    if (!hp_type_eq(&b, &out[0]))
        return hp_errf(err, HP_INVALID, "bias %s does not broadcast to %s", DIMS(&in[0]),
                       DIMS(&out[0]));
    return HP_OK;
}

/* ---- embedding, softmax, loss --------------------------------------------------------------- */

static hp_status padding_idx(const hp_node *n, int64_t rows, hp_err *err) {
    const hp_attr *a = attr(n, HP_ATTR_PADDING_IDX);
    if (a && (a->i < -1 || a->i >= rows))
        return hp_errf(err, HP_INVALID, "padding_idx %lld outside [-1, %lld)", (long long)a->i,
                       (long long)rows);
    return HP_OK;
}

hp_status hp__shape_embedding(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_rank(&in[0], 2, "weight", err));
    HP_TRY(need_float(&in[0], "weight", err));
    HP_TRY(need_int(&in[1], "indices", err));
    if (in[1].rank >= HP_MAX_RANK) return hp_errf(err, HP_INVALID, "indices rank too large");
    HP_TRY(padding_idx(n, in[0].shape[0], err));
    out[0] = in[1];
    out[0].dtype = in[0].dtype;
    out[0].shape[out[0].rank++] = in[0].shape[1];
    return HP_OK;
}

hp_status hp__shape_embedding_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                       hp_err *err) {
    HP_TRY(need_float(&in[0], "grad", err));
    HP_TRY(need_int(&in[1], "indices", err));
    if (in[0].rank != in[1].rank + 1)
        return hp_errf(err, HP_INVALID, "grad %s must be indices %s plus one dim", DIMS(&in[0]),
                       DIMS(&in[1]));
    for (int i = 0; i < in[1].rank; i++)
        if (in[0].shape[i] != in[1].shape[i])
            return hp_errf(err, HP_INVALID, "grad %s does not match indices %s", DIMS(&in[0]),
                           DIMS(&in[1]));
    int64_t rows = attr(n, HP_ATTR_NUM_WEIGHTS)->i;
    if (rows < 1 || rows > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "num_weights %lld must be >= 1", (long long)rows);
    HP_TRY(padding_idx(n, rows, err));
    int64_t s[2] = {rows, in[0].shape[in[0].rank - 1]};
    out[0] = hp_type_make(in[0].dtype, 2, s);
    return widened(n, &out[0], "the weight gradient is grad's dtype or f32", err);
}

hp_status hp__shape_softmax(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    int d;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank, "dim", &d, err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_softmax_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                     hp_err *err) {
    HP_TRY(same_type(&in[0], &in[1], "grad and output differ", err));
    return hp__shape_softmax(n, in, out, err);
}

static hp_status nll_args(const hp_node *n, const hp_type *logp, const hp_type *target,
                          hp_err *err) {
    HP_TRY(need_rank(logp, 2, "log-probabilities", err));
    HP_TRY(need_float(logp, "log-probabilities", err));
    HP_TRY(need_rank(target, 1, "target", err));
    HP_TRY(need_int(target, "target", err));
    if (target->shape[0] != logp->shape[0])
        return hp_errf(err, HP_INVALID, "target %s does not match log-probabilities %s",
                       DIMS(target), DIMS(logp));
    int64_t r = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (r < HP_NLL_NONE || r > HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not none (0), mean (1) or sum (2)",
                       (long long)r);
    return HP_OK;
}

hp_status hp__shape_nll_loss(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(nll_args(n, &in[0], &in[1], err));
    out[0] = (hp_type){.dtype = in[0].dtype, .rank = 0};
    if (hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_NONE) {
        out[0].rank = 1;
        out[0].shape[0] = in[0].shape[0];
    }
    out[1] = (hp_type){.dtype = in[0].dtype, .rank = 0};
    return HP_OK;
}

hp_status hp__shape_nll_loss_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                      hp_err *err) {
    HP_TRY(nll_args(n, &in[1], &in[2], err));
    HP_TRY(same_dtype(&in[0], &in[1], err));
    bool none = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_NONE;
    if (none ? (in[0].rank != 1 || in[0].shape[0] != in[1].shape[0]) : in[0].rank != 0)
        return hp_errf(err, HP_INVALID, "grad %s does not match the loss", DIMS(&in[0]));
    if (in[3].rank != 0) return hp_errf(err, HP_INVALID, "total_weight must be a scalar");
    out[0] = in[1];
    return HP_OK;
}

/* The fused cross entropy's (logits, target): nll_loss's, over logits, and a scalar loss. */
static hp_status ce_args(const hp_node *n, const hp_type *logits, const hp_type *target,
                         hp_err *err) {
    HP_TRY(need_rank(logits, 2, "logits", err));
    HP_TRY(need_float(logits, "logits", err));
    HP_TRY(need_rank(target, 1, "target", err));
    HP_TRY(need_int(target, "target", err));
    if (target->shape[0] != logits->shape[0])
        return hp_errf(err, HP_INVALID, "target %s does not match logits %s", DIMS(target),
                       DIMS(logits));
    int64_t r = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (r != HP_NLL_MEAN && r != HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not mean (1) or sum (2)", (long long)r);
    return HP_OK;
}

static hp_status need_f32_scalar(const hp_type *t, const char *what, hp_err *err) {
    if (t->dtype != HP_F32 || t->rank != 0)
        return hp_errf(err, HP_INVALID, "%s must be an f32 scalar, got %s %s", what,
                       hp_dtype_name(t->dtype), DIMS(t));
    return HP_OK;
}

hp_status hp__shape_fused_cross_entropy(const hp_node *n, const hp_type *in, hp_type *out,
                                        hp_err *err) {
    HP_TRY(ce_args(n, &in[0], &in[1], err));
    out[0] = out[1] = (hp_type){.dtype = HP_F32, .rank = 0};
    out[2] = (hp_type){.dtype = HP_F32, .rank = 1, .shape = {in[0].shape[0]}};
    return HP_OK;
}

hp_status hp__shape_fused_cross_entropy_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                                 hp_err *err) {
    HP_TRY(ce_args(n, &in[1], &in[2], err));
    HP_TRY(need_f32_scalar(&in[0], "grad", err));
    HP_TRY(need_f32_scalar(&in[4], "total_weight", err));
    if (in[3].dtype != HP_F32 || in[3].rank != 1 || in[3].shape[0] != in[1].shape[0])
        return hp_errf(err, HP_INVALID, "lse must be f32 [%lld] for logits %s, got %s %s",
                       (long long)in[1].shape[0], DIMS(&in[1]), hp_dtype_name(in[3].dtype),
                       DIMS(&in[3]));
    out[0] = in[1];
    return HP_OK;
}

hp_status hp__shape_swiglu(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)n;
    HP_TRY(need_float(&in[0], "a", err));
    HP_TRY(same_type(&in[0], &in[1], "a and b differ", err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_swiglu_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                    hp_err *err) {
    (void)n;
    HP_TRY(need_float(&in[0], "grad", err));
    HP_TRY(same_type(&in[0], &in[1], "grad and a differ", err));
    HP_TRY(same_type(&in[0], &in[2], "grad and b differ", err));
    out[0] = out[1] = in[0];
    return HP_OK;
}

/* ---- fused transformer ops ------------------------------------------------------------------ */

static hp_type drop_last(const hp_type *t, hp_dtype dt) {
    hp_type r = *t;
    r.dtype = dt;
    r.rank = t->rank - 1;
    return r;
}

hp_status hp__shape_rms_norm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    if (in[0].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(need_rank(&in[1], 1, "weight", err));
    HP_TRY(same_dtype(&in[0], &in[1], err));
    if (in[1].shape[0] != in[0].shape[in[0].rank - 1])
        return hp_errf(err, HP_INVALID, "weight %s does not match the last dim of %s", DIMS(&in[1]),
                       DIMS(&in[0]));
    HP_TRY(finite_attr(n, HP_ATTR_EPS, true, err));
    out[0] = in[0];
    out[1] = drop_last(&in[0], HP_F32);
    return HP_OK;
}

hp_status hp__shape_rms_norm_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                      hp_err *err) {
    HP_TRY(same_type(&in[0], &in[1], "grad and input differ", err));
    hp_type f[2];
    HP_TRY(need_float(&in[1], "input", err));
    if (in[1].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(need_rank(&in[2], 1, "weight", err));
    if (in[2].shape[0] != in[1].shape[in[1].rank - 1])
        return hp_errf(err, HP_INVALID, "weight %s does not match the last dim of %s", DIMS(&in[2]),
                       DIMS(&in[1]));
    HP_TRY(same_dtype(&in[1], &in[2], err));
    f[1] = drop_last(&in[1], HP_F32);
    HP_TRY(same_type(&in[3], &f[1], "rstd does not match the input", err));
    out[0] = in[1];
    out[1] = in[2];
    return HP_OK;
}

/* native_layer_norm's statistics: the input's shape with the normalized (last) dim 1, f32. */
static hp_type keep_last_1(const hp_type *t) {
    hp_type r = *t;
    r.dtype = HP_F32;
    r.shape[t->rank - 1] = 1;
    return r;
}

static hp_status layer_norm_affine(const hp_type *x, const hp_type *p, const char *what,
                                   hp_err *err) {
    HP_TRY(need_rank(p, 1, what, err));
    HP_TRY(same_dtype(x, p, err));
    if (p->shape[0] != x->shape[x->rank - 1])
        return hp_errf(err, HP_INVALID, "%s %s does not match the last dim of %s", what, DIMS(p),
                       DIMS(x));
    return HP_OK;
}

hp_status hp__shape_layer_norm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    if (in[0].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(layer_norm_affine(&in[0], &in[1], "weight", err));
    HP_TRY(layer_norm_affine(&in[0], &in[2], "bias", err));
    HP_TRY(finite_attr(n, HP_ATTR_EPS, true, err));
    out[0] = in[0];
    out[1] = out[2] = keep_last_1(&in[0]);
    return HP_OK;
}

hp_status hp__shape_layer_norm_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                        hp_err *err) {
    (void)n;
    HP_TRY(same_type(&in[0], &in[1], "grad and input differ", err));
    HP_TRY(need_float(&in[1], "input", err));
    if (in[1].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    hp_type stat = keep_last_1(&in[1]);
    HP_TRY(same_type(&in[2], &stat, "mean does not match the input", err));
    HP_TRY(same_type(&in[3], &stat, "rstd does not match the input", err));
    HP_TRY(layer_norm_affine(&in[1], &in[4], "weight", err));
    out[0] = in[1];
    out[1] = out[2] = in[4];
    return HP_OK;
}

hp_status hp__shape_tril(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (in[0].rank < 2)
        return hp_errf(err, HP_INVALID, "input must have rank >= 2, got %s", DIMS(&in[0]));
    int64_t k = hp_node_int(n, HP_ATTR_DIAGONAL, 0);
    if (k < -HP_MAX_DIM || k > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "diagonal %lld out of range", (long long)k);
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_bitwise_not(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)n;
    if (in[0].dtype != HP_BOOL) HP_TRY(need_int(&in[0], "input (or bool)", err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_arange(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)in;
    int64_t s = hp_node_int(n, HP_ATTR_START, 0), e = attr(n, HP_ATTR_END)->i;
    int64_t step = hp_node_int(n, HP_ATTR_STEP, 1);
    if (step < 1 || step > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "step %lld must be >= 1", (long long)step);
    if (s < -HP_MAX_NUMEL || s > HP_MAX_NUMEL || e < -HP_MAX_NUMEL || e > HP_MAX_NUMEL)
        return hp_errf(err, HP_INVALID, "range [%lld, %lld) out of bounds", (long long)s,
                       (long long)e);
    int64_t len = e > s ? (e - s + step - 1) / step : 0;
    if (len > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "range [%lld, %lld) has more than %lld elements",
                       (long long)s, (long long)e, (long long)HP_MAX_DIM);
    const hp_attr *dt = attr(n, HP_ATTR_DTYPE);
    out[0].dtype = dt ? dt->dtype : HP_I64;
    if (out[0].dtype == HP_BOOL) return hp_errf(err, HP_INVALID, "arange of bool");
    out[0].rank = 1;
    out[0].shape[0] = len;
    return HP_OK;
}

hp_status hp__shape_rotary(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    HP_TRY(need_rank(&in[0], 4, "input [B, T, H, D]", err));
    if (in[0].shape[3] % 2)
        return hp_errf(err, HP_INVALID, "head dim %lld must be even", (long long)in[0].shape[3]);
    HP_TRY(finite_attr(n, HP_ATTR_THETA, true, err));
    HP_TRY(bool_attr(n, HP_ATTR_INVERSE, err));
    out[0] = in[0];
    return HP_OK;
}

/* q [B,H,T,D], k [B,Hkv,S,D], v [B,Hkv,S,Dv] */
static hp_status sdpa_args(const hp_node *n, const hp_type *q, const hp_type *k, const hp_type *v,
                           hp_err *err) {
    HP_TRY(need_float(q, "q", err));
    HP_TRY(need_rank(q, 4, "q [B, H, T, D]", err));
    HP_TRY(need_rank(k, 4, "k [B, Hkv, S, D]", err));
    HP_TRY(need_rank(v, 4, "v [B, Hkv, S, Dv]", err));
    HP_TRY(same_dtype(q, k, err));
    HP_TRY(same_dtype(q, v, err));
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
        return hp_errf(err, HP_INVALID, "batch dims differ: q %s, k %s, v %s", DIMS(q), DIMS(k),
                       DIMS(v));
    if (k->shape[1] != v->shape[1] || k->shape[2] != v->shape[2])
        return hp_errf(err, HP_INVALID, "k %s and v %s differ in heads or length", DIMS(k),
                       DIMS(v));
    if (k->shape[3] != q->shape[3])
        return hp_errf(err, HP_INVALID, "q %s and k %s differ in head dim", DIMS(q), DIMS(k));
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1])
        return hp_errf(err, HP_INVALID, "q heads %lld are not a multiple of kv heads %lld",
                       (long long)q->shape[1], (long long)k->shape[1]);
    HP_TRY(finite_attr(n, HP_ATTR_SCALE, true, err));
    HP_TRY(bool_attr(n, HP_ATTR_CAUSAL, err));
    return HP_OK;
}

hp_status hp__shape_sdpa(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(sdpa_args(n, &in[0], &in[1], &in[2], err));
    out[0] = in[0];
    out[0].shape[3] = in[2].shape[3];
    out[1] = drop_last(&in[0], HP_F32);
    return HP_OK;
}

hp_status hp__shape_sdpa_backward(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(sdpa_args(n, &in[1], &in[2], &in[3], err));
    hp_type o[2];
    HP_TRY(hp__shape_sdpa(n, in + 1, o, err));
    HP_TRY(same_type(&in[0], &o[0], "grad_out does not match the output", err));
    HP_TRY(same_type(&in[4], &o[0], "out does not match q and v", err));
    HP_TRY(same_type(&in[5], &o[1], "logsumexp does not match q", err));
    out[0] = in[1];
    out[1] = in[2];
    out[2] = in[3];
    return HP_OK;
}

/* ---- collectives ---------------------------------------------------------------------------- */

static hp_status group_size(const hp_node *n, int64_t *gs, hp_err *err) {
    *gs = attr(n, HP_ATTR_GROUP_SIZE)->i;
    if (*gs < 1 || *gs > 65536)
        return hp_errf(err, HP_INVALID, "group_size %lld outside [1, 65536]", (long long)*gs);
    const hp_attr *op = attr(n, HP_ATTR_REDUCE_OP);
    if (op && (op->i < HP_REDUCE_SUM || op->i > HP_REDUCE_MAX))
        return hp_errf(err, HP_INVALID, "reduce_op %lld is not sum (0), avg (1) or max (2)",
                       (long long)op->i);
    return HP_OK;
}

static hp_status need_dim0(const hp_type *t, hp_err *err) {
    if (t->rank < 1) return hp_errf(err, HP_INVALID, "a collective needs rank >= 1");
    return HP_OK;
}

hp_status hp__shape_all_gather(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int64_t gs;
    HP_TRY(group_size(n, &gs, err));
    HP_TRY(need_dim0(&in[0], err));
    out[0] = in[0];
    if (in[0].shape[0] > HP_MAX_DIM / gs)
        return hp_errf(err, HP_INVALID, "gathered dim 0 too large");
    out[0].shape[0] *= gs;
    return HP_OK;
}

hp_status hp__shape_reduce_scatter(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int64_t gs;
    HP_TRY(group_size(n, &gs, err));
    HP_TRY(need_dim0(&in[0], err));
    if (in[0].shape[0] % gs)
        return hp_errf(err, HP_INVALID, "dim 0 of %s is not divisible by group_size %lld",
                       DIMS(&in[0]), (long long)gs);
    out[0] = in[0];
    out[0].shape[0] /= gs;
    return HP_OK;
}

/* all_to_all_single: the bytes are group_size equal contiguous parts, part j to rank j. The
 * parts are dim 0's chunks, or, where dim 0 is 1 (spmd's Shard(a) -> Shard(b): a rank's
 * [1, n, ...] piece of a global [n, n, ...]), dim 1's. */
hp_status hp__shape_all_to_all(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int64_t gs;
    HP_TRY(group_size(n, &gs, err));
    HP_TRY(need_dim0(&in[0], err));
    bool by1 = in[0].shape[0] == 1 && in[0].rank >= 2 && in[0].shape[1] % gs == 0;
    if (in[0].shape[0] % gs && !by1)
        return hp_errf(err, HP_INVALID,
                       "dim 0 of %s is not divisible by group_size %lld (nor is it 1 with dim 1 "
                       "divisible)",
                       DIMS(&in[0]), (long long)gs);
    out[0] = in[0];
    return HP_OK;
}

/* ---- mesh-coordinate ops ----------------------------------------------------------------------
 */

hp_status hp__shape_local_chunk(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    int64_t gs;
    HP_TRY(group_size(n, &gs, err));
    int d;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank, "dim", &d, err));
    if (in[0].shape[d] % gs)
        return hp_errf(err, HP_INVALID, "dim %d of %s is not divisible by group_size %lld", d,
                       DIMS(&in[0]), (long long)gs);
    out[0] = in[0];
    out[0].shape[d] /= gs;
    return HP_OK;
}

/* base [k] int, the weight's rows k equal chunks */
static hp_status chunk_base(const hp_type *base, int64_t rows, hp_err *err) {
    HP_TRY(need_int(base, "base", err));
    HP_TRY(need_rank(base, 1, "base", err));
    if (base->shape[0] < 1 || rows % base->shape[0])
        return hp_errf(err, HP_INVALID, "%lld weight rows do not split into %lld chunks (base %s)",
                       (long long)rows, (long long)base->shape[0], DIMS(base));
    return HP_OK;
}

hp_status hp__shape_chunked_embedding(const hp_node *n, const hp_type *in, hp_type *out,
                                      hp_err *err) {
    HP_TRY(hp__shape_embedding(n, in, out, err));
    return chunk_base(&in[2], in[0].shape[0], err);
}

hp_status hp__shape_chunked_embedding_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                               hp_err *err) {
    HP_TRY(hp__shape_embedding_backward(n, in, out, err));
    return chunk_base(&in[2], out[0].shape[0], err);
}

/* ---- dropout -------------------------------------------------------------------------------- */

hp_status hp__shape_dropout(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    double p = attr(n, HP_ATTR_P)->f;
    if (!(p >= 0 && p < 1)) return hp_errf(err, HP_INVALID, "p is %g, must be in [0, 1)", p);
    const hp_attr *f = attr(n, HP_ATTR_FQN);
    if (!f->s || !f->s[0])
        return hp_errf(err, HP_INVALID, "fqn (the mask's stream name) must not be empty");
    const hp_attr *gs = attr(n, HP_ATTR_GLOBAL_SHAPE);
    if (gs) {
        if (gs->ints.n != in[0].rank)
            return hp_errf(err, HP_INVALID, "global_shape has %d dims, the input %d", gs->ints.n,
                           in[0].rank);
        for (int d = 0; d < gs->ints.n; d++) {
            int64_t l = in[0].shape[d], g = gs->ints.v[d];
            if (g < l || g > HP_MAX_DIM || (l > 0 && g % l) || (l == 0 && g != 0))
                return hp_errf(err, HP_INVALID,
                               "global_shape dim %d is %lld: must be a multiple of the local %lld",
                               d, (long long)g, (long long)l);
        }
    }
    out[0] = in[0];
    out[1] = in[0];
    out[1].dtype = HP_BOOL;
    return HP_OK;
}

hp_status hp__shape_dropout_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                     hp_err *err) {
    HP_TRY(need_float(&in[0], "grad", err));
    if (in[1].dtype != HP_BOOL)
        return hp_errf(err, HP_INVALID, "mask must be bool, not %s", hp_dtype_name(in[1].dtype));
    hp_type m = in[1];
    m.dtype = in[0].dtype;
    HP_TRY(same_type(&in[0], &m, "grad and mask shapes differ", err));
    double s = attr(n, HP_ATTR_SCALE)->f;
    if (!isfinite(s) || s < 0)
        return hp_errf(err, HP_INVALID, "scale is %g, must be finite and >= 0", s);
    out[0] = in[0];
    return HP_OK;
}
