/* graph/shape_rules.c — one shape rule per op family (named in graph/ops.def), and the shared
 * dim / broadcast / slice helpers; the neural-network ops' rules are in shape_rules_nn.c, the
 * checks both use in shape_rules_internal.h. A rule checks its inputs' dtypes and shapes and its
 * attributes' ranges, then fills the output types. Messages name the offending dim or
 * attribute; hp__check_node prefixes the node. Semantics: docs/op-semantics.md. */
#include "graph/shape_rules_internal.h"

#include <string.h>

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
