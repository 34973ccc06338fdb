/* passes/memplan.c — the memory plan: liveness of every activation buffer over the
 * instruction list, then greedy-by-size placement (largest first, lowest offset that no
 * live-overlapping buffer occupies), as TFLite's and XLA's simple planners do. Placement is
 * O(n^2) in the worst case but with no sorting per buffer (the 405B graph plans in tens of ms).
 * Persistent classes (parameters, gradients) are laid out one after another. */
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

static int by_size_desc(const void *a, const void *b) {
    const live *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->def - y->def;
}

/* A placed activation: its bytes [offset, end) and its live range [def, last]. */
typedef struct placed {
    int64_t offset, end;
    int32_t def, last;
} placed;

hp_status hp__memplan(hp_program *p, hp_err *err) {
    int32_t nb = p->n_buffers;
    int32_t *def = hp_malloc((size_t)(nb + 1) * sizeof *def);
    int32_t *last = hp_malloc((size_t)(nb + 1) * sizeof *last);
    live *lv = hp_malloc((size_t)(nb + 1) * sizeof *lv);
    placed *near = hp_malloc((size_t)(nb + 1) * sizeof *near);
    hp_status st = HP_OK;
    if (!def || !last || !lv || !near) {
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
        lv[n++] = (live){.buf = b, .def = d, .last = l, .bytes = align_up(buf->bytes)};
        p->stats.act_values_bytes += buf->bytes;
    }
    qsort(lv, (size_t)n, sizeof *lv, by_size_desc);
    /* The placed buffers sorted by offset: a new one walks them once, skipping those whose
     * lifetime misses its own, and takes the first gap that fits (the lowest offset clear of
     * every live-overlapping buffer). O(n) per buffer and no sorting inside the loop. */
    int64_t top = 0;
    int32_t n_placed = 0;
    for (int32_t i = 0; i < n; i++) {
        live *x = &lv[i];
        int64_t off = 0;
        int32_t at = 0; /* insertion point: after every placed buffer at offset <= off */
        for (int32_t j = 0; j < n_placed; j++) {
            const placed *q = &near[j];
            if (q->def > x->last || x->def > q->last) continue;
            if (q->offset - off >= x->bytes) break;
            if (q->end > off) off = q->end;
        }
        while (at < n_placed && near[at].offset <= off) at++;
        memmove(&near[at + 1], &near[at], (size_t)(n_placed - at) * sizeof *near);
        near[at] = (placed){.offset = off, .end = off + x->bytes, .def = x->def, .last = x->last};
        n_placed++;
        x->offset = off;
        if (off + x->bytes > top) top = off + x->bytes;
        p->buffers[x->buf].offset = off;
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
    hp_free(near);
    return st;
}
