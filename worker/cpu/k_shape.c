/* worker/cpu/k_shape.c — data movement: the strided-copy engine (cpu_internal.h) and the shape
 * ops built on it: pure copies (view, reshape, (un)squeeze, clone, wait_tensor), permute /
 * transpose / t, expand, slice, slice_backward, cat.
 *
 * The lowering may give a view-like op (view, squeeze, ...) an output that aliases its input;
 * then the copy is skipped. Called with distinct buffers every op still produces a fresh
 * contiguous copy, so the executor may use either. Any dtype moves (bf16/f16 included): no
 * arithmetic happens here.
 *
 * The engine collapses dims that are contiguous in both source and destination, then copies
 * contiguous runs (memcpy), fills (broadcast source), 32x32 tiles (transposes) or plain
 * strided elements, split over the pool in chunks of output elements.
 */
#include "worker/cpu/cpu_internal.h"

#define TILE       32
#define SUPER      256                /* TILE multiple */
#define COPY_GRAIN ((int64_t)1 << 18) /* bytes per chunk of a parallel memcpy / memset */

/* ---- plain copies --------------------------------------------------------------------------- */

typedef struct bytes_job {
    char *dst;
    const char *src; /* NULL: zero-fill */
} bytes_job;

static void bytes_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const bytes_job *j = ctx;
    if (j->src)
        memcpy(j->dst + b, j->src + b, (size_t)(e - b));
    else
        memset(j->dst + b, 0, (size_t)(e - b));
}

void hp__cpu_copy(hp__cpu *cpu, void *dst, const void *src, size_t n) {
    if (n == 0 || dst == src) return;
    bytes_job j = {dst, src};
    hp_pool_parallel_for(cpu->pool, (int64_t)n, COPY_GRAIN, bytes_chunk, &j);
}

void hp__cpu_zero(hp__cpu *cpu, void *dst, size_t n) {
    if (n == 0) return;
    bytes_job j = {dst, NULL};
    hp_pool_parallel_for(cpu->pool, (int64_t)n, COPY_GRAIN, bytes_chunk, &j);
}

/* ---- the strided-copy engine ---------------------------------------------------------------- */

typedef struct scopy {
    char *dst;
    const char *src;
    size_t es;
    int rank; /* after collapsing, >= 1; the last dim is the inner one */
    int64_t shape[HP_MAX_RANK], dst_st[HP_MAX_RANK], src_st[HP_MAX_RANK];
    int64_t inner, n_units;   /* units: index combinations of dims [0, rank-1) */
    int tdim;                 /* tiled mode: the dim where src is contiguous; -1 otherwise */
    int64_t t_super, j_super; /* tiled mode: SUPER blocks along tdim and the inner dim */
} scopy;

/* Copies n elements with strides ds (dst) and ss (src, 0 = fill). */
static void copy_elems(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t es) {
    if (ds == 1 && ss == 1) {
        memcpy(d, s, (size_t)n * es);
        return;
    }
#define LOOP(T)                                                                                    \
    do {                                                                                           \
        T *dd = (T *)d;                                                                            \
        const T *sp = (const T *)s;                                                                \
        if (ss == 0) {                                                                             \
            T v = sp[0];                                                                           \
            for (int64_t i = 0; i < n; i++) dd[i * ds] = v;                                        \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) dd[i * ds] = sp[i * ss];                               \
        }                                                                                          \
    } while (0)
    switch (es) {
    case 1:
        LOOP(uint8_t);
        break;
    case 2:
        LOOP(uint16_t);
        break;
    case 4:
        LOOP(uint32_t);
        break;
    default:
        LOOP(uint64_t);
        break;
    }
#undef LOOP
}

/* The offsets (in elements) of unit u, i.e. of index (unravel(u), 0) over dims [0, rank-1). */
static void unit_offsets(const scopy *s, int64_t u, int64_t idx[HP_MAX_RANK], int64_t *doff,
                         int64_t *soff) {
    *doff = *soff = 0;
    for (int d = s->rank - 2; d >= 0; d--) {
        idx[d] = u % s->shape[d];
        u /= s->shape[d];
        *doff += idx[d] * s->dst_st[d];
        *soff += idx[d] * s->src_st[d];
    }
}

/* Next unit: odometer over dims [0, rank-1). */
static void unit_next(const scopy *s, int64_t idx[HP_MAX_RANK], int64_t *doff, int64_t *soff) {
    for (int d = s->rank - 2; d >= 0; d--) {
        idx[d]++;
        *doff += s->dst_st[d];
        *soff += s->src_st[d];
        if (idx[d] < s->shape[d]) return;
        *doff -= s->dst_st[d] * s->shape[d];
        *soff -= s->src_st[d] * s->shape[d];
        idx[d] = 0;
    }
}

/* Elements [b, e) of the flattened index space. */
static void scopy_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const scopy *s = ctx;
    int64_t idx[HP_MAX_RANK], doff, soff, inner = s->inner;
    int64_t u = b / inner, off = b % inner;
    unit_offsets(s, u, idx, &doff, &soff);
    int64_t ds = s->dst_st[s->rank - 1], ss = s->src_st[s->rank - 1];
    for (int64_t p = b; p < e;) {
        int64_t n = inner - off < e - p ? inner - off : e - p;
        copy_elems(s->dst + (size_t)(doff + off * ds) * s->es, ds,
                   s->src + (size_t)(soff + off * ss) * s->es, ss, n, s->es);
        p += n;
        off = 0;
        if (p < e) unit_next(s, idx, &doff, &soff);
    }
}

/* One tile: dst[i · ds + j] = src[i + j · ss] for i < ni, j < nj (ni, nj <= TILE), through a
 * buffer so that both sides are read and written along their contiguous rows. */
#define TILE_COPY(T)                                                                               \
    do {                                                                                           \
        T buf[TILE][TILE];                                                                         \
        const T *sp = (const T *)src;                                                              \
        T *dp = (T *)dst;                                                                          \
        for (int64_t j = 0; j < nj; j++)                                                           \
            for (int64_t i = 0; i < ni; i++) buf[j][i] = sp[j * ss + i];                           \
        for (int64_t i = 0; i < ni; i++)                                                           \
            for (int64_t j = 0; j < nj; j++) dp[i * ds + j] = buf[j][i];                           \
    } while (0)

static void tile_copy(char *dst, int64_t ds, const char *src, int64_t ss, int64_t ni, int64_t nj,
                      size_t es) {
    switch (es) {
    case 1:
        TILE_COPY(uint8_t);
        break;
    case 2:
        TILE_COPY(uint16_t);
        break;
    case 4:
        TILE_COPY(uint32_t);
        break;
    default:
        TILE_COPY(uint64_t);
        break;
    }
}
#undef TILE_COPY

/* Tiled transpose. A task is one SUPER x SUPER block (of the dims tdim and inner, for one index
 * of the other dims), copied as TILE x TILE tiles: the block's rows on both sides stay within
 * a few hundred pages, so a big transpose does not miss the TLB on every row. */
static void scopy_tiles(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const scopy *s = ctx;
    int t = s->tdim, in = s->rank - 1;
    int64_t nt = s->shape[t], nj = s->shape[in];
    for (int64_t task = b; task < e; task++) {
        int64_t jb = task % s->j_super, ib = task / s->j_super % s->t_super;
        int64_t u = task / s->j_super / s->t_super, doff = 0, soff = 0;
        for (int d = s->rank - 2; d >= 0; d--) {
            if (d == t) continue;
            int64_t i = u % s->shape[d];
            u /= s->shape[d];
            doff += i * s->dst_st[d];
            soff += i * s->src_st[d];
        }
        int64_t i_end = (ib + 1) * SUPER < nt ? (ib + 1) * SUPER : nt;
        int64_t j_end = (jb + 1) * SUPER < nj ? (jb + 1) * SUPER : nj;
        for (int64_t i0 = ib * SUPER; i0 < i_end; i0 += TILE)
            for (int64_t j0 = jb * SUPER; j0 < j_end; j0 += TILE) {
                int64_t ni = i_end - i0 < TILE ? i_end - i0 : TILE;
                int64_t nj_ = j_end - j0 < TILE ? j_end - j0 : TILE;
                tile_copy(s->dst + (size_t)(doff + i0 * s->dst_st[t] + j0) * s->es, s->dst_st[t],
                          s->src + (size_t)(soff + i0 + j0 * s->src_st[in]) * s->es, s->src_st[in],
                          ni, nj_, s->es);
            }
    }
}

void hp__cpu_strided_copy(hp__cpu *cpu, void *dst, const int64_t *dst_st, const void *src,
                          const int64_t *src_st, const int64_t *shape, int rank, size_t esize) {
    scopy s = {.dst = dst, .src = src, .es = esize, .tdim = -1};
    /* Drop size-1 dims; an empty dim means nothing to copy. */
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 0) return;
        if (shape[d] == 1) continue;
        s.shape[s.rank] = shape[d];
        s.dst_st[s.rank] = dst_st[d];
        s.src_st[s.rank] = src_st[d];
        s.rank++;
    }
    if (s.rank == 0) {
        s.rank = 1;
        s.shape[0] = 1;
        s.dst_st[0] = s.src_st[0] = 1;
    }
    /* Merge a dim into the next inner one when both sides step through them as one. */
    int r = 0;
    for (int d = 1; d < s.rank; d++) {
        if (s.dst_st[r] == s.dst_st[d] * s.shape[d] && s.src_st[r] == s.src_st[d] * s.shape[d]) {
            s.shape[r] *= s.shape[d];
            s.dst_st[r] = s.dst_st[d];
            s.src_st[r] = s.src_st[d];
        } else {
            r++;
            s.shape[r] = s.shape[d];
            s.dst_st[r] = s.dst_st[d];
            s.src_st[r] = s.src_st[d];
        }
    }
    s.rank = r + 1;
    int in = s.rank - 1;
    s.inner = s.shape[in];
    s.n_units = 1;
    for (int d = 0; d < in; d++) s.n_units *= s.shape[d];
    int64_t total = s.n_units * s.inner;

    /* A transpose (dst contiguous inside, src contiguous along another dim) goes by tiles. */
    if (s.dst_st[in] == 1 && s.src_st[in] > 1 && s.inner >= TILE / 4) {
        for (int d = 0; d < in; d++)
            if (s.src_st[d] == 1 && s.shape[d] >= TILE / 4) s.tdim = d;
    }
    if (s.tdim >= 0) {
        s.t_super = (s.shape[s.tdim] + SUPER - 1) / SUPER;
        s.j_super = (s.inner + SUPER - 1) / SUPER;
        int64_t tasks = s.n_units / s.shape[s.tdim] * s.t_super * s.j_super;
        hp_pool_parallel_for(cpu->pool, tasks, hp__cpu_grain(SUPER * SUPER), scopy_tiles, &s);
        return;
    }
    hp_pool_parallel_for(cpu->pool, total, HP__CPU_GRAIN, scopy_chunk, &s);
}

/* ---- the ops -------------------------------------------------------------------------------- */

static size_t type_bytes(const hp_type *t) {
    return (size_t)hp_type_numel(t) * hp_dtype_size(t->dtype);
}

/* Same dtype in and out, any dtype. */
static hp_status same_dtype(const hp_kernel_call *c, hp_err *err) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__ANY_FP, err));
    return hp__cpu_dtype(c, 1, 0, HP__M(c->in_type[0].dtype), err);
}

/* view, reshape, unsqueeze, squeeze, clone, wait_tensor: the same bytes. */
HP__CPU_KERNEL(hp__cpu_copy_op) {
    HP_TRY(same_dtype(c, err));
    HP_TRY(hp__cpu_out_numel(c, 0, hp_type_numel(&c->in_type[0]), err));
    hp__cpu_copy(cpu, c->out[0], c->in[0], type_bytes(&c->out_type[0]));
    return HP_OK;
}

/* permute{perm}, transpose{dim0, dim1}, t: out[idx] = in[idx permuted]. */
HP__CPU_KERNEL(hp__cpu_permute) {
    HP_TRY(same_dtype(c, err));
    const hp_type *t = &c->in_type[0], *o = &c->out_type[0];
    int perm[HP_MAX_RANK]; /* output dim d is input dim perm[d] */
    for (int d = 0; d < t->rank; d++) perm[d] = d;
    const hp_node *n = c->node;
    if (n->op == HP_OP_PERMUTE) {
        const hp_attr *a = hp_node_attr(n, HP_ATTR_PERM);
        if (!a || a->ints.n != t->rank)
            return hp_errf(err, HP_INVALID, "perm does not match the input's rank %d", t->rank);
        bool seen[HP_MAX_RANK] = {false};
        for (int d = 0; d < t->rank; d++) {
            int64_t p = a->ints.v[d] < 0 ? a->ints.v[d] + t->rank : a->ints.v[d];
            if (p < 0 || p >= t->rank || seen[p])
                return hp_errf(err, HP_INVALID, "perm entry %lld is invalid",
                               (long long)a->ints.v[d]);
            seen[p] = true;
            perm[d] = (int)p;
        }
    } else if (n->op == HP_OP_TRANSPOSE) {
        int d0, d1;
        HP_TRY(hp__cpu_attr_dim(n, HP_ATTR_DIM0, t->rank, &d0, err));
        HP_TRY(hp__cpu_attr_dim(n, HP_ATTR_DIM1, t->rank, &d1, err));
        if (t->rank > 0) {
            perm[d0] = d1;
            perm[d1] = d0;
        }
    } else if (t->rank == 2) { /* t: a no-op below rank 2 */
        perm[0] = 1;
        perm[1] = 0;
    }
    bool ok = o->rank == t->rank;
    for (int d = 0; ok && d < t->rank; d++) ok = o->shape[d] == t->shape[perm[d]];
    if (!ok) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "output %s is not a permutation of input %s",
                       hp_type_str(o, x, sizeof x), hp_type_str(t, y, sizeof y));
    }
    int64_t ist[HP_MAX_RANK], sst[HP_MAX_RANK], ost[HP_MAX_RANK];
    hp__cpu_strides(t, ist);
    hp__cpu_strides(o, ost);
    for (int d = 0; d < t->rank; d++) sst[d] = ist[perm[d]];
    hp__cpu_strided_copy(cpu, c->out[0], ost, c->in[0], sst, o->shape, o->rank,
                         hp_dtype_size(o->dtype));
    return HP_OK;
}

/* expand{shape}: broadcast copy. */
HP__CPU_KERNEL(hp__cpu_expand) {
    HP_TRY(same_dtype(c, err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cpu_check_bcast(&c->in_type[0], o, "input", err));
    int64_t sst[HP_MAX_RANK], ost[HP_MAX_RANK];
    hp__cpu_bcast_strides(&c->in_type[0], o, sst);
    hp__cpu_strides(o, ost);
    hp__cpu_strided_copy(cpu, c->out[0], ost, c->in[0], sst, o->shape, o->rank,
                         hp_dtype_size(o->dtype));
    return HP_OK;
}

/* The sliced dim, its first index and its step, checked against the full type and the slice's
 * type (which must agree with it everywhere but the sliced dim). */
static hp_status slice_geometry(const hp_node *n, const hp_type *full, const hp_type *part,
                                int *dim, int64_t *start, int64_t *step, hp_err *err) {
    HP_TRY(hp__cpu_attr_dim(n, HP_ATTR_DIM, full->rank, dim, err));
    if (full->rank == 0) return hp_errf(err, HP_INVALID, "cannot slice a scalar");
    *step = hp_node_int(n, HP_ATTR_STEP, 1);
    if (*step < 1) return hp_errf(err, HP_INVALID, "step %lld must be >= 1", (long long)*step);
    int64_t len = full->shape[*dim], s = hp_node_int(n, HP_ATTR_START, 0);
    if (s < 0) s += len; /* Python semantics: from the end, clamped to [0, len] */
    *start = s < 0 ? 0 : s > len ? len : s;
    bool ok = part->rank == full->rank;
    for (int d = 0; ok && d < full->rank; d++)
        ok = d == *dim ? part->shape[d] == 0 || *start + (part->shape[d] - 1) * *step < len
                       : part->shape[d] == full->shape[d];
    if (!ok) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "slice %s does not fit in %s at dim %d",
                       hp_type_str(part, x, sizeof x), hp_type_str(full, y, sizeof y), *dim);
    }
    return HP_OK;
}

/* slice{dim, start, end, step}: out = in[..., start:end:step, ...]. */
HP__CPU_KERNEL(hp__cpu_slice) {
    HP_TRY(same_dtype(c, err));
    const hp_type *full = &c->in_type[0], *part = &c->out_type[0];
    int dim;
    int64_t start, step, fst[HP_MAX_RANK], pst[HP_MAX_RANK];
    HP_TRY(slice_geometry(c->node, full, part, &dim, &start, &step, err));
    hp__cpu_strides(full, fst);
    hp__cpu_strides(part, pst);
    size_t es = hp_dtype_size(full->dtype);
    const char *src = (const char *)c->in[0] + (size_t)(start * fst[dim]) * es;
    fst[dim] *= step;
    hp__cpu_strided_copy(cpu, c->out[0], pst, src, fst, part->shape, part->rank, es);
    return HP_OK;
}

/* slice_backward(g){shape, dim, start, end, step}: zeros with g written at the slice. */
HP__CPU_KERNEL(hp__cpu_slice_backward) {
    HP_TRY(same_dtype(c, err));
    const hp_type *full = &c->out_type[0], *part = &c->in_type[0];
    int dim;
    int64_t start, step, fst[HP_MAX_RANK], pst[HP_MAX_RANK];
    HP_TRY(slice_geometry(c->node, full, part, &dim, &start, &step, err));
    hp__cpu_strides(full, fst);
    hp__cpu_strides(part, pst);
    size_t es = hp_dtype_size(full->dtype);
    hp__cpu_zero(cpu, c->out[0], type_bytes(full));
    char *dst = (char *)c->out[0] + (size_t)(start * fst[dim]) * es;
    fst[dim] *= step;
    hp__cpu_strided_copy(cpu, dst, fst, c->in[0], pst, part->shape, part->rank, es);
    return HP_OK;
}

/* cat{dim}: inputs side by side along dim. */
HP__CPU_KERNEL(hp__cpu_cat) {
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__ANY_FP, err));
    int dim;
    HP_TRY(hp__cpu_attr_dim(c->node, HP_ATTR_DIM, o->rank, &dim, err));
    if (o->rank == 0) return hp_errf(err, HP_INVALID, "cannot concatenate scalars");
    int64_t ost[HP_MAX_RANK], at = 0;
    hp__cpu_strides(o, ost);
    size_t es = hp_dtype_size(o->dtype);
    for (int k = 0; k < c->n_in; k++) {
        const hp_type *t = &c->in_type[k];
        HP_TRY(hp__cpu_dtype(c, 0, k, HP__M(o->dtype), err));
        bool ok = t->rank == o->rank && at + t->shape[dim] <= o->shape[dim];
        for (int d = 0; ok && d < o->rank; d++) ok = d == dim || t->shape[d] == o->shape[d];
        if (!ok) {
            char x[128], y[128];
            return hp_errf(err, HP_INVALID, "input %d %s does not fit output %s at dim %d", k,
                           hp_type_str(t, x, sizeof x), hp_type_str(o, y, sizeof y), dim);
        }
        at += t->shape[dim];
    }
    if (at != o->shape[dim])
        return hp_errf(err, HP_INVALID, "inputs fill %lld of the %lld entries of dim %d",
                       (long long)at, (long long)o->shape[dim], dim);
    at = 0;
    for (int k = 0; k < c->n_in; k++) {
        const hp_type *t = &c->in_type[k];
        int64_t ist[HP_MAX_RANK];
        hp__cpu_strides(t, ist);
        char *dst = (char *)c->out[0] + (size_t)(at * ost[dim]) * es;
        hp__cpu_strided_copy(cpu, dst, ost, c->in[k], ist, t->shape, t->rank, es);
        at += t->shape[dim];
    }
    return HP_OK;
}
