/* worker/cpu/k_nn.c — the neural-network kernels outside attention and normalization:
 * embedding and its dense backward, _softmax / _log_softmax and their backwards, nll_loss
 * forward and backward, the fused cross entropy (the log-softmax and nll_loss of the loss in
 * one, without the [N, C] log-probabilities). f32 values; i32/i64 indices and targets.
 *
 * Data-dependent errors (an index outside [0, V), a target outside [0, C)) are found by a
 * check before any parallel work, and name the value and its position. The embedding
 * backward sorts positions by index (a counting sort) so that each weight row sums its
 * gradient rows in position order, in one task: deterministic without atomics. The softmax
 * loops are also built for AVX2 (HP__CPU_TWIN); sums run in double over fixed lanes.
 */
#include "worker/cpu/cpu_internal.h"

#include <math.h>

/* ---- indices -------------------------------------------------------------------------------- */

static int64_t index_at(const void *idx, hp_dtype dt, int64_t i) {
    return dt == HP_I32 ? ((const int32_t *)idx)[i] : ((const int64_t *)idx)[i];
}

/* Every index in [0, limit), except those equal to `skip` (INT64_MIN for none). */
static hp_status check_indices(const void *idx, hp_dtype dt, int64_t n, int64_t limit, int64_t skip,
                               const char *what, hp_err *err) {
    for (int64_t i = 0; i < n; i++) {
        int64_t v = index_at(idx, dt, i);
        if (v == skip) continue;
        if (v < 0 || v >= limit)
            return hp_errf(err, HP_INVALID, "%s %lld at position %lld out of range [0, %lld)", what,
                           (long long)v, (long long)i, (long long)limit);
    }
    return HP_OK;
}

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct emb_job {
    float *y;
    const float *w, *g;
    const void *idx;
    hp_dtype it;
    int64_t d;
    const int64_t *start,
        *order; /* backward: positions of index v are order[start[v]..start[v+1]) */
    int64_t pad;
} emb_job;

static void emb_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const emb_job *j = ctx;
    for (int64_t i = b; i < e; i++)
        memcpy(j->y + i * j->d, j->w + index_at(j->idx, j->it, i) * j->d,
               (size_t)j->d * sizeof(float));
}

/* embedding(weight [V, D], idx int [...]) -> [..., D]; padding_idx only matters for the
 * gradient. */
HP__CPU_KERNEL(hp__cpu_embedding) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *w = &c->in_type[0];
    if (w->rank != 2) return hp_errf(err, HP_INVALID, "weight must be [V, D]");
    int64_t n = hp_type_numel(&c->in_type[1]);
    HP_TRY(hp__cpu_out_numel(c, 0, n * w->shape[1], err));
    HP_TRY(check_indices(c->in[1], c->in_type[1].dtype, n, w->shape[0], INT64_MIN, "index", err));
    emb_job j = {.y = c->out[0],
                 .w = c->in[0],
                 .idx = c->in[1],
                 .it = c->in_type[1].dtype,
                 .d = w->shape[1]};
    hp_pool_parallel_for(cpu->pool, n, hp__cpu_grain(j.d), emb_rows, &j);
    return HP_OK;
}

static void emb_back_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const emb_job *j = ctx;
    for (int64_t v = b; v < e; v++) {
        float *y = j->y + v * j->d;
        memset(y, 0, (size_t)j->d * sizeof *y);
        if (v == j->pad) continue;
        for (int64_t p = j->start[v]; p < j->start[v + 1]; p++) {
            const float *g = j->g + j->order[p] * j->d;
            for (int64_t k = 0; k < j->d; k++) y[k] += g[k];
        }
    }
}

/* embedding_dense_backward(g [..., D], idx [...]){num_weights, padding_idx} -> [V, D]. */
HP__CPU_KERNEL(hp__cpu_embedding_backward) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *o = &c->out_type[0];
    if (o->rank != 2) return hp_errf(err, HP_INVALID, "output must be [num_weights, D]");
    int64_t v = o->shape[0], d = o->shape[1], n = hp_type_numel(&c->in_type[1]);
    if (hp_type_numel(&c->in_type[0]) != n * d)
        return hp_errf(err, HP_INVALID, "grad has %lld elements, expected %lld x %lld",
                       (long long)hp_type_numel(&c->in_type[0]), (long long)n, (long long)d);
    hp_dtype it = c->in_type[1].dtype;
    HP_TRY(check_indices(c->in[1], it, n, v, INT64_MIN, "index", err));
    /* counting sort of positions by index: start[v] .. start[v + 1] in order[] */
    int64_t *start = hp__cpu_scratch(cpu, (size_t)(v + 1 + n) * sizeof(int64_t), err);
    if (!start) return err ? err->status : HP_NOMEM;
    int64_t *order = start + v + 1;
    memset(start, 0, (size_t)(v + 1) * sizeof *start);
    for (int64_t i = 0; i < n; i++) start[index_at(c->in[1], it, i) + 1]++;
    for (int64_t k = 0; k < v; k++) start[k + 1] += start[k];
    for (int64_t i = 0; i < n; i++) { /* positions land in increasing order within a row */
        int64_t *slot = &start[index_at(c->in[1], it, i)];
        order[(*slot)++] = i;
    }
    for (int64_t k = v; k > 0; k--) start[k] = start[k - 1]; /* undo the bumps */
    start[0] = 0;
    emb_job j = {.y = c->out[0],
                 .g = c->in[0],
                 .d = d,
                 .start = start,
                 .order = order,
                 .pad = hp_node_int(c->node, HP_ATTR_PADDING_IDX, -1)};
    hp_pool_parallel_for(cpu->pool, v, hp__cpu_grain(d + 2 * n / (v > 0 ? v : 1)), emb_back_rows,
                         &j);
    return HP_OK;
}

/* ---- chunked embedding (the vocab-parallel lookup) ------------------------------------------ */

typedef struct chunk_emb_job {
    float *y;
    const float *w;
    const void *idx, *base;
    hp_dtype it, bt;
    int64_t d, k, rows;
} chunk_emb_job;

static void chunk_emb_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const chunk_emb_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        float *y = j->y + i * j->d;
        memset(y, 0, (size_t)j->d * sizeof *y);
        int64_t id = index_at(j->idx, j->it, i);
        for (int64_t c = 0; c < j->k; c++) {
            int64_t at = id - index_at(j->base, j->bt, c);
            if (at < 0 || at >= j->rows) continue;
            const float *w = j->w + (c * j->rows + at) * j->d;
            for (int64_t x = 0; x < j->d; x++) y[x] += w[x];
        }
    }
}

/* chunked_embedding(weight [V, D], idx [...], base [k]) -> [..., D] (graph/ops.def): indices no
 * chunk holds read zeros, so no index is out of range. */
HP__CPU_KERNEL(hp__cpu_chunked_embedding) {
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 0, 2, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *w = &c->in_type[0], *bt = &c->in_type[2];
    if (w->rank != 2 || bt->rank != 1 || bt->shape[0] < 1 || w->shape[0] % bt->shape[0])
        return hp_errf(err, HP_INVALID, "weight must be [V, D] and base [k], k dividing V");
    int64_t n = hp_type_numel(&c->in_type[1]);
    HP_TRY(hp__cpu_out_numel(c, 0, n * w->shape[1], err));
    chunk_emb_job j = {.y = c->out[0],
                       .w = c->in[0],
                       .idx = c->in[1],
                       .base = c->in[2],
                       .it = c->in_type[1].dtype,
                       .bt = bt->dtype,
                       .d = w->shape[1],
                       .k = bt->shape[0],
                       .rows = w->shape[0] / bt->shape[0]};
    hp_pool_parallel_for(cpu->pool, n, hp__cpu_grain(j.d), chunk_emb_rows, &j);
    return HP_OK;
}

/* chunked_embedding_backward(g [..., D], idx [...], base [k]){num_weights} -> [V, D]: one pass
 * in position order (deterministic); the rows a rank holds are few next to the positions. */
HP__CPU_KERNEL(hp__cpu_chunked_embedding_backward) {
    (void)cpu;
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 1, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 0, 2, HP__INTS, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *o = &c->out_type[0], *bt = &c->in_type[2];
    if (o->rank != 2 || bt->rank != 1 || bt->shape[0] < 1 || o->shape[0] % bt->shape[0])
        return hp_errf(err, HP_INVALID,
                       "output must be [num_weights, D] and base [k], k dividing "
                       "num_weights");
    int64_t v = o->shape[0], d = o->shape[1], n = hp_type_numel(&c->in_type[1]);
    int64_t k = bt->shape[0], rows = v / k;
    if (hp_type_numel(&c->in_type[0]) != n * d)
        return hp_errf(err, HP_INVALID, "grad has %lld elements, expected %lld x %lld",
                       (long long)hp_type_numel(&c->in_type[0]), (long long)n, (long long)d);
    float *y = c->out[0];
    const float *g = c->in[0];
    memset(y, 0, (size_t)(v * d) * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = index_at(c->in[1], c->in_type[1].dtype, i);
        for (int64_t ch = 0; ch < k; ch++) {
            int64_t at = id - index_at(c->in[2], bt->dtype, ch);
            if (at < 0 || at >= rows) continue;
            float *row = y + (ch * rows + at) * d;
            for (int64_t x = 0; x < d; x++) row[x] += g[i * d + x];
        }
    }
    return HP_OK;
}

/* ---- softmax family ------------------------------------------------------------------------- */

/* Lines of `len` elements `inner` apart: line l starts at (l / inner) · len · inner + l % inner. */
typedef struct sm_job {
    float *y;
    const float *x, *g; /* backward: g the incoming gradient, x the forward output */
    int64_t len, inner;
    bool log;
} sm_job;

static int64_t line_base(const sm_job *j, int64_t l) {
    return l / j->inner * j->len * j->inner + l % j->inner;
}

/* One contiguous line: max-shifted, the exp sum in double. */
HP__CPU_INLINE void softmax_row(float *y, const float *x, int64_t n, bool log_out) {
    float m = hp__cpu_max(x, n, -INFINITY);
    for (int64_t i = 0; i < n; i++) y[i] = hp__cpu_expf(x[i] - m);
    double sum = hp__cpu_sum_d(y, n);
    if (log_out) {
        float lse = (float)((double)m + log(sum));
        for (int64_t i = 0; i < n; i++) y[i] = x[i] - lse;
    } else {
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) y[i] *= inv;
    }
}

/* A strided line (softmax over a dim that is not the last): the same formulas. */
HP__CPU_INLINE void softmax_strided(float *y, const float *x, int64_t n, int64_t s, bool log_out) {
    float m = -INFINITY;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        nan |= x[i * s] != x[i * s];
        m = x[i * s] > m ? x[i * s] : m;
    }
    if (nan) m = NAN;
    double acc[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        float e = hp__cpu_expf(x[i * s] - m);
        y[i * s] = e;
        acc[i % 8] += (double)e;
    }
    double sum = 0;
    for (int k = 0; k < 8; k++) sum += acc[k];
    if (log_out) {
        float lse = (float)((double)m + log(sum));
        for (int64_t i = 0; i < n; i++) y[i * s] = x[i * s] - lse;
    } else {
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) y[i * s] *= inv;
    }
}

HP__CPU_INLINE void softmax_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const sm_job *j = ctx;
    for (int64_t l = b; l < e; l++) {
        int64_t o = line_base(j, l);
        if (j->inner == 1)
            softmax_row(j->y + o, j->x + o, j->len, j->log);
        else
            softmax_strided(j->y + o, j->x + o, j->len, j->inner, j->log);
    }
}
HP__CPU_TWIN(softmax_lines, softmax_body)

/* The [outer, len, inner] view of t around the node's dim (a scalar: one line of one). */
static hp_status sm_lines(const hp_kernel_call *c, const hp_type *t, sm_job *j, int64_t *lines,
                          hp_err *err) {
    int dim = 0;
    j->len = j->inner = 1;
    if (t->rank > 0) {
        HP_TRY(hp__cpu_attr_dim(c->node, HP_ATTR_DIM, t->rank, &dim, err));
        j->len = t->shape[dim];
        for (int d = dim + 1; d < t->rank; d++) j->inner *= t->shape[d];
    }
    *lines = j->len > 0 ? hp_type_numel(t) / j->len : 0;
    return HP_OK;
}

/* _softmax{dim}, _log_softmax{dim} */
HP__CPU_KERNEL(hp__cpu_softmax) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    sm_job j = {.y = c->out[0], .x = c->in[0], .log = c->node->op == HP_OP_LOG_SOFTMAX};
    int64_t lines;
    HP_TRY(sm_lines(c, &c->in_type[0], &j, &lines, err));
    hp_pool_parallel_for(cpu->pool, lines, hp__cpu_grain(4 * j.len), softmax_lines_pick(), &j);
    return HP_OK;
}

/* _log_softmax_backward_data(g, out) = g − exp(out)·Σg;
 * _softmax_backward_data(g, out) = out·(g − Σ g·out). Sums in double. */
HP__CPU_INLINE void softmax_back_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const sm_job *j = ctx;
    int64_t s = j->inner, n = j->len;
    for (int64_t l = b; l < e; l++) {
        int64_t o = line_base(j, l);
        const float *g = j->g + o, *y = j->x + o;
        float *gx = j->y + o;
        double sum = 0;
        if (s == 1) {
            sum = j->log ? hp__cpu_sum_d(g, n) : hp__cpu_dot_d(g, y, n);
        } else {
            double acc[8] = {0};
            for (int64_t i = 0; i < n; i++)
                acc[i % 8] += j->log ? (double)g[i * s] : (double)g[i * s] * (double)y[i * s];
            for (int k = 0; k < 8; k++) sum += acc[k];
        }
        float sf = (float)sum;
        if (j->log)
            for (int64_t k = 0; k < n; k++) gx[k * s] = g[k * s] - hp__cpu_expf(y[k * s]) * sf;
        else
            for (int64_t k = 0; k < n; k++) gx[k * s] = y[k * s] * (g[k * s] - sf);
    }
}
HP__CPU_TWIN(softmax_back_lines, softmax_back_body)

HP__CPU_KERNEL(hp__cpu_softmax_backward) {
    HP_TRY(hp__cpu_dtypes_all(c, HP__F32, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 1, 0, err));
    HP_TRY(hp__cpu_same_shape(c, 0, 0, 1, err));
    sm_job j = {.y = c->out[0],
                .g = c->in[0],
                .x = c->in[1],
                .log = c->node->op == HP_OP_LOG_SOFTMAX_BACKWARD};
    int64_t lines;
    HP_TRY(sm_lines(c, &c->out_type[0], &j, &lines, err));
    hp_pool_parallel_for(cpu->pool, lines, hp__cpu_grain(3 * j.len), softmax_back_lines_pick(), &j);
    return HP_OK;
}

/* ---- nll_loss ------------------------------------------------------------------------------- */

/* logp [N, C] f32, target [N] int; checks shapes and targets. */
static hp_status nll_args(const hp_kernel_call *c, int lp, int64_t *rows, int64_t *classes,
                          hp_err *err) {
    HP_TRY(hp__cpu_dtype(c, 0, lp, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, lp + 1, HP__INTS, err));
    const hp_type *l = &c->in_type[lp], *t = &c->in_type[lp + 1];
    if (l->rank != 2 || t->rank != 1 || t->shape[0] != l->shape[0]) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "scores %s and target %s must be [N, C], [N]",
                       hp_type_str(l, x, sizeof x), hp_type_str(t, y, sizeof y));
    }
    *rows = l->shape[0];
    *classes = l->shape[1];
    int64_t ignore = hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100);
    return check_indices(c->in[lp + 1], t->dtype, *rows, *classes, ignore, "target", err);
}

/* nll_loss_forward(logp, target){reduction, ignore_index} -> (loss, total_weight). The sum runs
 * in row order in double: a loss is one number, so no parallelism is worth its nondeterminism. */
HP__CPU_KERNEL(hp__cpu_nll_loss) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 0, &rows, &classes, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 1, HP__F32, err));
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100);
    HP_TRY(hp__cpu_out_numel(c, 0, red == HP_NLL_NONE ? rows : 1, err));
    HP_TRY(hp__cpu_out_numel(c, 1, 1, err));
    const float *lp = c->in[0];
    float *loss = c->out[0];
    double sum = 0, count = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = index_at(c->in[1], c->in_type[1].dtype, r);
        bool skip = t == ignore;
        float l = skip ? 0.0f : -lp[r * classes + t];
        if (red == HP_NLL_NONE) loss[r] = l;
        sum += l;
        count += !skip;
    }
    if (red == HP_NLL_MEAN) loss[0] = (float)(sum / count); /* all ignored: NaN, as torch */
    if (red == HP_NLL_SUM) loss[0] = (float)sum;
    *(float *)c->out[1] = (float)count;
    return HP_OK;
}

/* nll_loss_backward(g, logp, target, total_weight) -> [N, C]: −g (÷ total_weight for mean) at
 * each row's target, zero elsewhere and on ignored rows. */
HP__CPU_KERNEL(hp__cpu_nll_loss_backward) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 1, &rows, &classes, err));
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 3, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_out_numel(c, 0, rows * classes, err));
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100);
    if (hp_type_numel(&c->in_type[0]) != (red == HP_NLL_NONE ? rows : 1) ||
        hp_type_numel(&c->in_type[3]) != 1)
        return hp_errf(err, HP_INVALID, "grad or total_weight has the wrong size");
    const float *g = c->in[0];
    float tw = *(const float *)c->in[3], *y = c->out[0];
    hp__cpu_zero(cpu, y, (size_t)(rows * classes) * sizeof *y);
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = index_at(c->in[2], c->in_type[2].dtype, r);
        if (t == ignore) continue;
        float gr = red == HP_NLL_NONE ? g[r] : g[0];
        if (red == HP_NLL_MEAN) gr = (float)((double)gr / (double)tw);
        y[r * classes + t] = -gr;
    }
    return HP_OK;
}

/* ---- the fused cross entropy ---------------------------------------------------------------- */

typedef struct ce_job {
    const float *x; /* logits [rows, classes] */
    const void *target;
    hp_dtype target_dt;
    const float *lse_in;
    float *lse, *gx;
    int64_t classes, ignore;
    float g; /* the backward's g' */
} ce_job;

/* Each row's logsumexp, max-shifted, the exp sum in double. */
HP__CPU_INLINE void ce_lse_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const ce_job *j = ctx;
    int64_t n = j->classes;
    for (int64_t r = b; r < e; r++) {
        const float *x = j->x + r * n;
        float m = hp__cpu_max(x, n, -INFINITY);
        double acc[8] = {0}, sum = 0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) { /* acc[i % 8] as below, eight exps at once */
            float ex[8];
            for (int k = 0; k < 8; k++) ex[k] = hp__cpu_expf(x[i + k] - m);
            for (int k = 0; k < 8; k++) acc[k] += (double)ex[k];
        }
        for (; i < n; i++) acc[i % 8] += (double)hp__cpu_expf(x[i] - m);
        for (int k = 0; k < 8; k++) sum += acc[k];
        j->lse[r] = m == -INFINITY ? -INFINITY : (float)((double)m + log(sum)); /* ln 0 */
    }
}
HP__CPU_TWIN(ce_lse_rows, ce_lse_body)

/* g'·(exp(x − lse) − onehot(target)) a row, zeros on ignored rows. */
HP__CPU_INLINE void ce_back_body(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const ce_job *j = ctx;
    int64_t n = j->classes;
    for (int64_t r = b; r < e; r++) {
        const float *x = j->x + r * n;
        float *gx = j->gx + r * n, lse = j->lse_in[r];
        int64_t t = index_at(j->target, j->target_dt, r);
        if (t == j->ignore) {
            memset(gx, 0, (size_t)n * sizeof *gx);
            continue;
        }
        for (int64_t i = 0; i < n; i++) gx[i] = j->g * hp__cpu_expf(x[i] - lse);
        gx[t] -= j->g;
    }
}
HP__CPU_TWIN(ce_back_rows, ce_back_body)

/* fused_cross_entropy(logits, target){reduction, ignore_index} -> (loss, total_weight, lse):
 * the rows' logsumexp in parallel, then the loss summed in row order in double (as nll_loss). */
HP__CPU_KERNEL(hp__cpu_fused_cross_entropy) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 0, &rows, &classes, err));
    for (int k = 0; k < 3; k++) HP_TRY(hp__cpu_dtype(c, 1, k, HP__F32, err));
    HP_TRY(hp__cpu_out_numel(c, 0, 1, err));
    HP_TRY(hp__cpu_out_numel(c, 1, 1, err));
    HP_TRY(hp__cpu_out_numel(c, 2, rows, err));
    int64_t red = hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    ce_job j = {.x = c->in[0],
                .lse = c->out[2],
                .classes = classes,
                .ignore = hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100)};
    if (classes > 0)
        hp_pool_parallel_for(cpu->pool, rows, hp__cpu_grain(2 * classes), ce_lse_rows_pick(), &j);
    else
        for (int64_t r = 0; r < rows; r++) j.lse[r] = -INFINITY; /* the empty sum */
    double sum = 0, count = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = index_at(c->in[1], c->in_type[1].dtype, r);
        if (t == j.ignore) continue;
        sum += (double)j.lse[r] - (double)j.x[r * classes + t];
        count++;
    }
    *(float *)c->out[0] = (float)(red == HP_NLL_MEAN ? sum / count : sum); /* 0/0: NaN */
    *(float *)c->out[1] = (float)count;
    return HP_OK;
}

/* fused_cross_entropy_backward(g, logits, target, lse, total_weight) -> [N, C]. */
HP__CPU_KERNEL(hp__cpu_fused_cross_entropy_backward) {
    int64_t rows, classes;
    HP_TRY(nll_args(c, 1, &rows, &classes, err));
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 3, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 4, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_out_numel(c, 0, rows * classes, err));
    if (hp_type_numel(&c->in_type[0]) != 1 || hp_type_numel(&c->in_type[3]) != rows ||
        hp_type_numel(&c->in_type[4]) != 1)
        return hp_errf(err, HP_INVALID, "grad, lse or total_weight has the wrong size");
    double g = *(const float *)c->in[0];
    if (hp_node_int(c->node, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_MEAN)
        g /= (double)*(const float *)c->in[4];
    ce_job j = {.x = c->in[1],
                .target = c->in[2],
                .target_dt = c->in_type[2].dtype,
                .lse_in = c->in[3],
                .gx = c->out[0],
                .classes = classes,
                .ignore = hp_node_int(c->node, HP_ATTR_IGNORE_INDEX, -100),
                .g = (float)g};
    if (classes > 0)
        hp_pool_parallel_for(cpu->pool, rows, hp__cpu_grain(2 * classes), ce_back_rows_pick(), &j);
    return HP_OK;
}
