/* passes/memplan.c — the memory plan: liveness of every activation buffer over the
 * instruction list, then placement by a sweep in instruction order: buffers whose last use is
 * behind give their bytes back (coalesced), each new buffer takes the lowest free block that
 * fits (address-ordered first fit over a treap of free blocks). O(n log n): the greedy-by-size
 * planner it replaces compared every buffer with every placed one, O(n^2), and took seconds
 * at 1024 layers. Persistent classes (parameters, gradients) are laid out one after another. */
#include "passes/passes_internal.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t x) {
    return (x + HP_BUFFER_ALIGN - 1) / HP_BUFFER_ALIGN * HP_BUFFER_ALIGN;
}

typedef struct live {
    int32_t buf;
    int32_t def, last; /* instruction indices; def -1 = before the first */
    int64_t bytes, offset;
} live;

/* Allocation order: by definition, larger first among buffers defined together (they cannot
 * share, and big-first leaves the smaller gaps to the small ones); ties by buffer id. */
static int by_def(const void *a, const void *b) {
    const live *x = a, *y = b;
    if (x->def != y->def) return x->def < y->def ? -1 : 1;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return (x->buf > y->buf) - (x->buf < y->buf);
}

/* Counting sort of lv[0..n) (in buffer order) by key(x) in [0, range): stable, into out. */
static void counting_sort(const live *lv, int32_t n, int32_t range, bool by_last_use,
                          int32_t *count, int32_t *out) {
    memset(count, 0, ((size_t)range + 1) * sizeof *count);
    for (int32_t i = 0; i < n; i++) count[(by_last_use ? lv[i].last : lv[i].def) + 1 + 1]++;
    for (int32_t k = 0; k < range; k++) count[k + 1] += count[k];
    for (int32_t i = 0; i < n; i++) out[count[(by_last_use ? lv[i].last : lv[i].def) + 1]++] = i;
}

/* Sorts lv (built in buffer order, def in [-1, n_instrs), last in [-1, n_instrs]) into by_def
 * order in place, and by_end by (last use, buffer id), by counting sorts on the instruction index:
 * the order two qsorts gave (a tenth of the lowering at 1024 layers), ties broken the same. */
static hp_status sort_lives(live *lv, int32_t n, int32_t n_instrs, int32_t nb, live **by_end,
                            hp_err *err) {
    int32_t range = n_instrs + 2; /* keys -1 .. n_instrs, shifted by one */
    int32_t *count = hp_malloc(((size_t)range + 2) * sizeof *count);
    int32_t *order = hp_malloc(((size_t)n + 1) * sizeof *order);
    int32_t *pos = hp_malloc(((size_t)nb + 1) * sizeof *pos); /* by buffer id */
    live *sorted = hp_malloc(((size_t)n + 1) * sizeof *sorted);
    hp_status st = HP_OK;
    if (!count || !order || !pos || !sorted) {
        st = hp_errf(err, HP_NOMEM, "out of memory planning memory");
        goto out;
    }
    /* by definition, ties in buffer order; then each group of one definition by size,
     * larger first (stable: equal sizes stay in buffer order) */
    counting_sort(lv, n, range, false, count, order);
    for (int32_t i = 0; i < n; i++) sorted[i] = lv[order[i]];
    for (int32_t g = 0; g < n;) {
        int32_t e = g + 1;
        while (e < n && sorted[e].def == sorted[g].def) e++;
        if (e - g > 32) {
            qsort(sorted + g, (size_t)(e - g), sizeof *sorted, by_def);
        } else {
            for (int32_t i = g + 1; i < e; i++) {
                live x = sorted[i];
                int32_t j = i;
                for (; j > g && sorted[j - 1].bytes < x.bytes; j--) sorted[j] = sorted[j - 1];
                sorted[j] = x;
            }
        }
        g = e;
    }
    for (int32_t i = 0; i < n; i++) pos[sorted[i].buf] = i;
    /* by last use, ties in buffer order: positions in the sorted array */
    counting_sort(lv, n, range, true, count, order);
    for (int32_t i = 0; i < n; i++) order[i] = pos[lv[order[i]].buf];
    memcpy(lv, sorted, (size_t)n * sizeof *lv);
    for (int32_t i = 0; i < n; i++) by_end[i] = &lv[order[i]];
out:
    hp_free(count);
    hp_free(order);
    hp_free(pos);
    hp_free(sorted);
    return st;
}

/* ---- the free blocks of the arena: a treap keyed by offset, each node knowing the largest
 * block under it, so the lowest-offset block that fits is found in O(log n) expected. ----- */

typedef struct fnode {
    int64_t off, size, max; /* max: the largest size in this subtree */
    uint32_t prio;
    int32_t l, r; /* -1: none */
} fnode;

typedef struct freeset {
    fnode *n;
    int32_t root, free_list; /* free_list: unused nodes, chained through .l */
    int32_t n_used;          /* nodes [0, n_used) handed out once; the rest untouched */
    uint32_t rng;
    int32_t *path; /* the last recorded descent, root first (room for every node) */
    int depth;     /* its length */
} freeset;

static int64_t fmax_of(const freeset *f, int32_t t) {
    return t < 0 ? 0 : f->n[t].max;
}

static void fupdate(freeset *f, int32_t t) {
    fnode *x = &f->n[t];
    int64_t m = x->size, a = fmax_of(f, x->l), b = fmax_of(f, x->r);
    x->max = m > a ? (m > b ? m : b) : (a > b ? a : b);
}

/* Splits t into offsets < key (*a) and >= key (*b). */
static void fsplit(freeset *f, int32_t t, int64_t key, int32_t *a, int32_t *b) {
    if (t < 0) {
        *a = *b = -1;
        return;
    }
    if (f->n[t].off < key) {
        fsplit(f, f->n[t].r, key, &f->n[t].r, b);
        *a = t;
    } else {
        fsplit(f, f->n[t].l, key, a, &f->n[t].l);
        *b = t;
    }
    fupdate(f, t);
}

/* Joins a and b, every offset in a below every offset in b. */
static int32_t fmerge(freeset *f, int32_t a, int32_t b) {
    if (a < 0) return b;
    if (b < 0) return a;
    if (f->n[a].prio > f->n[b].prio) {
        f->n[a].r = fmerge(f, f->n[a].r, b);
        fupdate(f, a);
        return a;
    }
    f->n[b].l = fmerge(f, a, f->n[b].l);
    fupdate(f, b);
    return b;
}

/* Inserts node k below t (by descent to where its priority belongs, then one split):
 * returns the new subtree root. */
static int32_t finsert_at(freeset *f, int32_t t, int32_t k) {
    if (t < 0) return k;
    if (f->n[k].prio > f->n[t].prio) {
        fsplit(f, t, f->n[k].off, &f->n[k].l, &f->n[k].r);
        fupdate(f, k);
        return k;
    }
    if (f->n[k].off < f->n[t].off)
        f->n[t].l = finsert_at(f, f->n[t].l, k);
    else
        f->n[t].r = finsert_at(f, f->n[t].r, k);
    fupdate(f, t);
    return t;
}

static void finsert(freeset *f, int64_t off, int64_t size) {
    int32_t k = f->free_list;
    if (k >= 0)
        f->free_list = f->n[k].l;
    else
        k = f->n_used++;
    f->rng = f->rng * 1664525u + 1013904223u;
    f->n[k] = (fnode){.off = off, .size = size, .max = size, .prio = f->rng, .l = -1, .r = -1};
    f->root = finsert_at(f, f->root, k);
}

/* Removes the block at exactly `off` below t (it must be there): returns the new root. */
static int32_t fremove_at(freeset *f, int32_t t, int64_t off) {
    if (t < 0) return -1;
    if (f->n[t].off == off) {
        int32_t m = fmerge(f, f->n[t].l, f->n[t].r);
        f->n[t].l = f->free_list;
        f->free_list = t;
        return m;
    }
    if (off < f->n[t].off)
        f->n[t].l = fremove_at(f, f->n[t].l, off);
    else
        f->n[t].r = fremove_at(f, f->n[t].r, off);
    fupdate(f, t);
    return t;
}

static void fremove(freeset *f, int64_t off) {
    f->root = fremove_at(f, f->root, off);
}

/* Gives the block at `off` the new offset and size in place: the caller keeps the order
 * (no other block lies between the old and the new offset). Updates the maxima on the path. */
static void freshape_at(freeset *f, int32_t t, int64_t off, int64_t new_off, int64_t new_size) {
    if (f->n[t].off == off) {
        f->n[t].off = new_off;
        f->n[t].size = new_size;
    } else if (off < f->n[t].off) {
        freshape_at(f, f->n[t].l, off, new_off, new_size);
    } else {
        freshape_at(f, f->n[t].r, off, new_off, new_size);
    }
    fupdate(f, t);
}

/* The lowest-offset block of at least `need` bytes, or -1; the descent is recorded. */
static int32_t ffirst_fit(freeset *f, int64_t need) {
    int32_t t = f->root;
    f->depth = 0;
    while (t >= 0 && f->n[t].max >= need) {
        f->path[f->depth++] = t;
        if (fmax_of(f, f->n[t].l) >= need)
            t = f->n[t].l;
        else if (f->n[t].size >= need)
            return t;
        else
            t = f->n[t].r;
    }
    return -1;
}

/* Recomputes the maxima of the recorded path from index i up to the root. */
static void fpath_update(freeset *f, int i) {
    for (; i >= 0; i--) fupdate(f, f->path[i]);
}

/* Removes the block at path index i (recorded): its parent takes the merge of its children. */
static void fpath_remove(freeset *f, int i) {
    int32_t t = f->path[i];
    int32_t m = fmerge(f, f->n[t].l, f->n[t].r);
    f->n[t].l = f->free_list;
    f->free_list = t;
    if (i == 0) {
        f->root = m;
        return;
    }
    int32_t up = f->path[i - 1];
    if (f->n[up].l == t)
        f->n[up].l = m;
    else
        f->n[up].r = m;
    fpath_update(f, i - 1);
}

/* The block with the largest offset below `off` (-1: none). */
static int32_t fbelow(const freeset *f, int64_t off) {
    int32_t t = f->root, best = -1;
    while (t >= 0) {
        if (f->n[t].off < off) {
            best = t;
            t = f->n[t].r;
        } else {
            t = f->n[t].l;
        }
    }
    return best;
}

/* Gives [off, off + size) back, merged with the free blocks it touches (the block below
 * grows, or the one above moves down, in place: the order of the others stays). One descent
 * towards `off` passes both neighbours (no free block lies inside the range): the block below
 * is the last on it with a lower offset, the one above the last with a higher one, and the
 * maxima are mended along the recorded path. */
static void frelease(freeset *f, int64_t off, int64_t size) {
    int32_t t = f->root, lo = -1, hi = -1;
    int i_lo = -1, i_hi = -1;
    f->depth = 0;
    while (t >= 0) {
        f->path[f->depth++] = t;
        if (f->n[t].off < off) {
            lo = t, i_lo = f->depth - 1;
            t = f->n[t].r;
        } else {
            hi = t, i_hi = f->depth - 1;
            t = f->n[t].l;
        }
    }
    bool join_lo = lo >= 0 && f->n[lo].off + f->n[lo].size == off;
    bool join_hi = hi >= 0 && f->n[hi].off == off + size;
    if (join_lo && join_hi) {
        int64_t lo_off = f->n[lo].off, total = f->n[lo].size + size + f->n[hi].size;
        fremove(f, f->n[hi].off);
        freshape_at(f, f->root, lo_off, lo_off, total);
    } else if (join_lo) {
        f->n[lo].size += size;
        fpath_update(f, i_lo);
    } else if (join_hi) {
        f->n[hi].off = off;
        f->n[hi].size += size;
        fpath_update(f, i_hi);
    } else {
        finsert(f, off, size);
    }
}

/* A place for `need` bytes: the lowest free block that fits, else the free block ending at
 * the top (grown), else the top. *top is the arena's high-water mark. */
static int64_t fallocate(freeset *f, int64_t need, int64_t *top) {
    int32_t t = ffirst_fit(f, need);
    if (t < 0) {
        int32_t last = fbelow(f, *top);
        int64_t off = *top;
        if (last >= 0 && f->n[last].off + f->n[last].size == *top) {
            off = f->n[last].off;
            fremove(f, off);
        }
        *top = off + need;
        return off;
    }
    int64_t off = f->n[t].off, size = f->n[t].size;
    if (size > need) { /* the rest, at the same place */
        f->n[t].off = off + need;
        f->n[t].size = size - need;
        fpath_update(f, f->depth - 1);
    } else {
        fpath_remove(f, f->depth - 1);
    }
    return off;
}

hp_status hp__memplan(hp_program *p, hp_err *err) {
    int32_t nb = p->n_buffers;
    int32_t *def = hp_malloc((size_t)(nb + 1) * sizeof *def);
    int32_t *last = hp_malloc((size_t)(nb + 1) * sizeof *last);
    live *lv = hp_malloc((size_t)(nb + 1) * sizeof *lv);
    live **by_end = hp_malloc((size_t)(nb + 1) * sizeof *by_end);
    fnode *nodes = hp_malloc((size_t)(nb + 2) * sizeof *nodes); /* free blocks <= buffers + 1 */
    int32_t *path = hp_malloc((size_t)(nb + 2) * sizeof *path);
    hp_status st = HP_OK;
    if (!def || !last || !lv || !by_end || !nodes || !path) {
        st = hp_errf(err, HP_NOMEM, "out of memory planning memory");
        goto done;
    }
    for (int32_t b = 0; b < nb; b++) def[b] = last[b] = -1;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        for (int k = 0; k < ins->n_out; k++) {
            int32_t r = hp_program_root(p, ins->out[k]);
            if (def[r] < 0) def[r] = i;
            if (last[r] < i) last[r] = i;
        }
        for (int k = 0; k < ins->n_in; k++) {
            int32_t r = hp_program_root(p, ins->in[k]);
            if (last[r] < i) last[r] = i;
        }
    }
    /* A collective reads its input and writes its output asynchronously until the
     * wait_tensor that consumes it: both stay live until that wait. */
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *w = &p->instrs[i];
        if (p->graph->nodes[w->node].op != HP_OP_WAIT_TENSOR) continue;
        int32_t r = hp_program_root(p, w->in[0]);
        int32_t c = def[r];
        if (c < 0 || !(hp_op_get(p->graph->nodes[p->instrs[c].node].op)->flags & HP_OPF_COLLECTIVE))
            continue;
        const hp_instr *coll = &p->instrs[c];
        for (int k = 0; k < coll->n_in; k++) {
            int32_t ri = hp_program_root(p, coll->in[k]);
            if (last[ri] < i) last[ri] = i;
        }
    }
    /* The loss is read after the step; data is written before it. */
    last[hp_program_root(p, p->loss)] = p->n_instrs;
    for (int i = 0; i < p->n_data; i++) def[hp_program_root(p, p->data[i].buffer)] = -1;

    int64_t next[HP_MEM_COUNT] = {0};
    int32_t n = 0;
    memset(&p->stats.act_values_bytes, 0, sizeof p->stats.act_values_bytes);
    for (int32_t b = 0; b < nb; b++) {
        hp_buffer *buf = &p->buffers[b];
        if (buf->alias_of >= 0) continue;
        if (buf->mem != HP_MEM_ACT) {
            buf->offset = next[buf->mem];
            next[buf->mem] = align_up(buf->offset + buf->bytes);
            continue;
        }
        int32_t d = def[b], l = last[b] < d ? d : last[b];
        lv[n++] =
            (live){.buf = b, .def = d, .last = l, .bytes = align_up(buf->bytes), .offset = -1};
        p->stats.act_values_bytes += buf->bytes;
    }
    /* A sweep over the instructions, as an allocator running the step would: before the
     * buffers defined at instruction i are placed, every buffer last used before i gives its
     * bytes back. Placement is address-ordered first fit over the free blocks. Two buffers
     * share bytes only if their live ranges [def, last] are disjoint. O(n log n). */
    if ((st = sort_lives(lv, n, p->n_instrs, nb, by_end, err)) != HP_OK) goto done;
    freeset fs = {.n = nodes, .root = -1, .free_list = -1, .rng = 0x9e3779b9u, .path = path};
    int64_t top = 0;
    int32_t e = 0;
    for (int32_t i = 0; i < n; i++) {
        live *x = &lv[i];
        while (e < n && by_end[e]->last < x->def) {
            if (by_end[e]->bytes > 0) frelease(&fs, by_end[e]->offset, by_end[e]->bytes);
            e++;
        }
        x->offset = x->bytes ? fallocate(&fs, x->bytes, &top) : 0;
        p->buffers[x->buf].offset = x->offset;
    }
    next[HP_MEM_ACT] = top;
    for (int m = 0; m < HP_MEM_COUNT; m++) p->arena_bytes[m] = next[m];
    p->stats.act_arena_bytes = top;
    /* Aliases sit where their storage is. */
    for (int32_t b = 0; b < nb; b++) {
        hp_buffer *buf = &p->buffers[b];
        if (buf->alias_of >= 0) {
            buf->mem = p->buffers[buf->alias_of].mem;
            buf->offset = p->buffers[buf->alias_of].offset;
        }
    }
done:
    hp_free(def);
    hp_free(last);
    hp_free(lv);
    hp_free(by_end);
    hp_free(nodes);
    hp_free(path);
    return st;
}
