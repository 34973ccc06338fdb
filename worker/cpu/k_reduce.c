/* worker/cpu/k_reduce.c — sum, mean, amax over any set of dims (keepdim does not change the
 * layout), for f32 (accumulated in double) and i32/i64 (accumulated in int64, wrapping).
 *
 * The input's dims collapse into alternating kept/reduced groups. When the innermost group is
 * reduced each output sums contiguous runs; when it is kept, rows of outputs accumulate whole
 * input rows (vectorizable, cache-friendly for bias gradients). The reduced index space is cut
 * into chunks whose size depends only on the shape, each chunk's partial lands in its own
 * slot, and the slots combine in chunk order: the result is the same for any thread count,
 * and a full reduction still spreads over every thread.
 */
#include "worker/cpu/cpu_internal.h"

#include <math.h>

#define RCHUNK 32768 /* input elements per reduction chunk (a constant: fixes the sum order) */
#define WBLOCK 4096  /* kept-inner outputs per task */
#define LANES  8     /* independent accumulators of a contiguous sum */

typedef union slot {
    double d;
    int64_t i;
} slot;

/* An index walker over some dims (sizes, strides): linear position -> element offset. */
typedef struct odo {
    int n;
    int64_t size[HP_MAX_RANK], st[HP_MAX_RANK], idx[HP_MAX_RANK];
    int64_t off;
} odo;

static void odo_set(odo *o, int64_t lin) {
    o->off = 0;
    for (int d = o->n - 1; d >= 0; d--) {
        o->idx[d] = lin % o->size[d];
        lin /= o->size[d];
        o->off += o->idx[d] * o->st[d];
    }
}

static void odo_next(odo *o) {
    for (int d = o->n - 1; d >= 0; d--) {
        o->idx[d]++;
        o->off += o->st[d];
        if (o->idx[d] < o->size[d]) return;
        o->off -= o->st[d] * o->size[d];
        o->idx[d] = 0;
    }
}

typedef struct red_job {
    const void *x;
    hp_dtype dt;
    bool max;      /* amax; else sum */
    bool a;        /* case A: innermost group reduced (runs of `len`); else kept (rows of `len`) */
    odo kept, red; /* kept groups (case B: without the innermost), reduced (A: without it) */
    int64_t len;   /* innermost group's size */
    int64_t n_out, count;    /* outputs; reduced elements per output */
    int64_t chunk, n_chunks; /* reduced-space positions per chunk (A: elements, B: rows) */
    int64_t n_units, n_wblk; /* tasks = n_units x n_chunks; B: units are (row, column block) */
    slot *part;              /* [n_chunks][n_out] */
} red_job;

/* ---- contiguous runs (case A) ---------------------------------------------------------------- */

static double f32_sum(const float *x, int64_t n) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += (double)x[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += (double)x[i];
    double s = 0;
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

/* max folding NaN in: once NaN, stays NaN */
#define FOLD_MAX(m, v) ((v) > (m) || (v) != (v) ? (v) : (m))

static double f32_max(const float *x, int64_t n, double m) {
    float mf = (float)m;
    bool nan = m != m;
    for (int64_t i = 0; i < n; i++) {
        nan |= x[i] != x[i];
        mf = x[i] > mf ? x[i] : mf;
    }
    return nan ? NAN : (double)mf;
}

static void run_fold(const red_job *j, int64_t off, int64_t n, slot *acc) {
    switch (j->dt) {
    case HP_F32: {
        const float *x = (const float *)j->x + off;
        acc->d = j->max ? f32_max(x, n, acc->d) : acc->d + f32_sum(x, n);
        break;
    }
    case HP_I32: {
        const int32_t *x = (const int32_t *)j->x + off;
        uint64_t s = (uint64_t)acc->i;
        int64_t m = acc->i;
        for (int64_t i = 0; i < n; i++) {
            s += (uint64_t)(int64_t)x[i];
            m = x[i] > m ? x[i] : m;
        }
        acc->i = j->max ? m : (int64_t)s;
        break;
    }
    default: {
        const int64_t *x = (const int64_t *)j->x + off;
        uint64_t s = (uint64_t)acc->i;
        int64_t m = acc->i;
        for (int64_t i = 0; i < n; i++) {
            s += (uint64_t)x[i];
            m = x[i] > m ? x[i] : m;
        }
        acc->i = j->max ? m : (int64_t)s;
        break;
    }
    }
}

static slot slot_init(const red_job *j) {
    slot s;
    if (j->dt == HP_F32)
        s.d = j->max ? -INFINITY : 0.0;
    else
        s.i = j->max ? INT64_MIN : 0;
    return s;
}

/* Case A task: output o, reduced elements [r0, r1) as runs along the innermost group. */
static void task_a(const red_job *j, int64_t o, int64_t ch) {
    odo kept = j->kept, red = j->red;
    odo_set(&kept, o);
    int64_t r0 = ch * j->chunk, r1 = r0 + j->chunk < j->count ? r0 + j->chunk : j->count;
    odo_set(&red, r0 / j->len);
    int64_t l = r0 % j->len;
    slot acc = slot_init(j);
    for (int64_t r = r0; r < r1;) {
        int64_t n = j->len - l < r1 - r ? j->len - l : r1 - r;
        run_fold(j, kept.off + red.off + l, n, &acc);
        r += n;
        l = 0;
        if (r < r1) odo_next(&red);
    }
    j->part[ch * j->n_out + o] = acc;
}

/* ---- rows (case B) --------------------------------------------------------------------------- */

/* Case B task: output row `row`, columns [w0, w1) of the innermost group, reduced rows of the
 * chunk accumulated into the chunk's partial row. */
static void task_b(const red_job *j, int64_t unit, int64_t ch) {
    int64_t row = unit / j->n_wblk, w0 = unit % j->n_wblk * WBLOCK;
    int64_t w1 = w0 + WBLOCK < j->len ? w0 + WBLOCK : j->len, n = w1 - w0;
    odo kept = j->kept, red = j->red;
    odo_set(&kept, row);
    int64_t r0 = ch * j->chunk, r1 = r0 + j->chunk < j->count ? r0 + j->chunk : j->count;
    odo_set(&red, r0);
    slot *acc = j->part + ch * j->n_out + row * j->len + w0;
    slot init = slot_init(j);
    for (int64_t i = 0; i < n; i++) acc[i] = init;
    for (int64_t r = r0; r < r1; r++) {
        int64_t off = kept.off + red.off + w0;
        switch (j->dt) {
        case HP_F32: {
            const float *x = (const float *)j->x + off;
            if (j->max)
                for (int64_t i = 0; i < n; i++) acc[i].d = FOLD_MAX(acc[i].d, (double)x[i]);
            else
                for (int64_t i = 0; i < n; i++) acc[i].d += (double)x[i];
            break;
        }
        case HP_I32: {
            const int32_t *x = (const int32_t *)j->x + off;
            if (j->max)
                for (int64_t i = 0; i < n; i++) acc[i].i = x[i] > acc[i].i ? x[i] : acc[i].i;
            else
                for (int64_t i = 0; i < n; i++)
                    acc[i].i = (int64_t)((uint64_t)acc[i].i + (uint64_t)(int64_t)x[i]);
            break;
        }
        default: {
            const int64_t *x = (const int64_t *)j->x + off;
            if (j->max)
                for (int64_t i = 0; i < n; i++) acc[i].i = x[i] > acc[i].i ? x[i] : acc[i].i;
            else
                for (int64_t i = 0; i < n; i++)
                    acc[i].i = (int64_t)((uint64_t)acc[i].i + (uint64_t)x[i]);
            break;
        }
        }
        if (r + 1 < r1) odo_next(&red);
    }
}

static void red_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const red_job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t unit = t / j->n_chunks, ch = t % j->n_chunks;
        if (j->a)
            task_a(j, unit, ch);
        else
            task_b(j, unit, ch);
    }
}

/* ---- combining the chunks -------------------------------------------------------------------- */

typedef struct fin_job {
    const red_job *r;
    void *y;
    bool mean;
} fin_job;

static void fin_chunk(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const fin_job *f = ctx;
    const red_job *j = f->r;
    for (int64_t o = b; o < e; o++) {
        slot acc = j->part[o];
        for (int64_t ch = 1; ch < j->n_chunks; ch++) {
            slot p = j->part[ch * j->n_out + o];
            if (j->dt == HP_F32)
                acc.d = j->max ? FOLD_MAX(acc.d, p.d) : acc.d + p.d;
            else
                acc.i = j->max ? (p.i > acc.i ? p.i : acc.i)
                               : (int64_t)((uint64_t)acc.i + (uint64_t)p.i);
        }
        switch (j->dt) {
        case HP_F32:
            ((float *)f->y)[o] = (float)(f->mean ? acc.d / (double)j->count : acc.d);
            break;
        case HP_I32:
            ((int32_t *)f->y)[o] = (int32_t)(uint32_t)(uint64_t)acc.i;
            break;
        default:
            ((int64_t *)f->y)[o] = acc.i;
            break;
        }
    }
}

/* ---- the kernel ----------------------------------------------------------------------------- */

/* Empty input: sums are 0, means 0/0 = NaN (as torch); amax of nothing is refused. */
static hp_status reduce_empty(hp__cpu *cpu, const hp_kernel_call *c, hp_err *err) {
    const hp_type *o = &c->out_type[0];
    int64_t n = hp_type_numel(o);
    if (n == 0) return HP_OK;
    if (c->node->op == HP_OP_AMAX) return hp_errf(err, HP_INVALID, "amax over an empty dimension");
    hp__cpu_zero(cpu, c->out[0], (size_t)n * hp_dtype_size(o->dtype));
    if (c->node->op == HP_OP_MEAN)
        for (int64_t i = 0; i < n; i++) ((float *)c->out[0])[i] = NAN;
    return HP_OK;
}

HP__CPU_KERNEL(hp__cpu_reduce) {
    const hp_node *n = c->node;
    const hp_type *t = &c->in_type[0];
    HP_TRY(hp__cpu_dtype(c, 0, 0, n->op == HP_OP_MEAN ? HP__F32 : HP__NUM, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__M(t->dtype), err));
    /* the reduction mask: dims empty = all */
    bool mask[HP_MAX_RANK] = {false};
    const hp_attr *dims = hp_node_attr(n, HP_ATTR_DIMS);
    int nd = dims ? dims->ints.n : 0;
    for (int i = 0; i < nd; i++) {
        int64_t d = dims->ints.v[i] < 0 ? dims->ints.v[i] + t->rank : dims->ints.v[i];
        if (d < 0 || d >= t->rank)
            return hp_errf(err, HP_INVALID, "dims entry %lld is out of range for rank %d",
                           (long long)dims->ints.v[i], t->rank);
        mask[d] = true;
    }
    if (nd == 0)
        for (int d = 0; d < t->rank; d++) mask[d] = true;
    int64_t count = 1, n_out = 1;
    for (int d = 0; d < t->rank; d++) {
        if (mask[d])
            count *= t->shape[d];
        else
            n_out *= t->shape[d];
    }
    HP_TRY(hp__cpu_out_numel(c, 0, n_out, err));
    if (count == 0 || n_out == 0) return reduce_empty(cpu, c, err);

    /* Groups: drop size-1 dims, merge neighbours of the same kind (contiguous row-major). */
    int ng = 0;
    int64_t gsize[HP_MAX_RANK];
    bool gred[HP_MAX_RANK];
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] == 1) continue;
        if (ng > 0 && gred[ng - 1] == mask[d]) {
            gsize[ng - 1] *= t->shape[d];
        } else {
            gsize[ng] = t->shape[d];
            gred[ng] = mask[d];
            ng++;
        }
    }
    if (ng == 0) { /* one element */
        gsize[0] = 1;
        gred[0] = true;
        ng = 1;
    }
    red_job j = {.x = c->in[0],
                 .dt = t->dtype,
                 .max = n->op == HP_OP_AMAX,
                 .a = gred[ng - 1],
                 .len = gsize[ng - 1],
                 .n_out = n_out,
                 .count = count};
    int64_t st = gsize[ng - 1];
    for (int g = ng - 2; g >= 0; g--) { /* the groups above the innermost, inner to outer */
        odo *w = gred[g] ? &j.red : &j.kept;
        for (int k = w->n; k > 0; k--) { /* prepend: groups are walked outer to inner */
            w->size[k] = w->size[k - 1];
            w->st[k] = w->st[k - 1];
        }
        w->size[0] = gsize[g];
        w->st[0] = st;
        w->n++;
        st *= gsize[g];
    }
    if (j.a) {
        j.chunk = RCHUNK;
        j.n_units = n_out;
        j.n_wblk = 1;
    } else {
        int64_t w = j.len < WBLOCK ? j.len : WBLOCK;
        j.chunk = (RCHUNK + w - 1) / w; /* reduced rows per chunk */
        j.n_wblk = (j.len + WBLOCK - 1) / WBLOCK;
        j.n_units = n_out / j.len * j.n_wblk;
        j.count = count;
    }
    j.n_chunks = (count + j.chunk - 1) / j.chunk;
    size_t bytes = (size_t)(j.n_chunks * n_out) * sizeof(slot);
    j.part = hp__cpu_scratch(cpu, bytes, err);
    if (!j.part) return err ? err->status : HP_NOMEM;
    int64_t task_cost =
        j.a ? (count < j.chunk ? count : j.chunk)
            : (count < j.chunk ? count : j.chunk) * (j.len < WBLOCK ? j.len : WBLOCK);
    hp_pool_parallel_for(cpu->pool, j.n_units * j.n_chunks, hp__cpu_grain(task_cost), red_chunk,
                         &j);
    fin_job f = {&j, c->out[0], n->op == HP_OP_MEAN};
    hp_pool_parallel_for(cpu->pool, n_out, hp__cpu_grain(j.n_chunks), fin_chunk, &f);
    return HP_OK;
}
