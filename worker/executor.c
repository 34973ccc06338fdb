/* worker/executor.c — the Program executor (see executor.h). */
#include "worker/executor.h"

#include <string.h>
#include <time.h>

typedef struct exec_call {
    hp_kernel_call call;
    int32_t wait_for; /* instruction whose event to wait on first (-1: none) */
} exec_call;

struct hp_exec {
    const hp_program *p;
    hp_backend *b;
    void *region[HP_MEM_COUNT];
    exec_call *calls;     /* [n_instrs] */
    const void **in_ptrs; /* all instructions' input pointers */
    void **out_ptrs;      /* all instructions' output pointers */
    hp_type *types;       /* input types, then output types, per instruction */
    hp_event **events;    /* [n_instrs]: recorded after a cross-stream producer */
    int64_t bytes;
    hp_exec_trace_fn trace;
    void *trace_ctx;
    double exposed_s;       /* compute blocked on the comm stream */
    hp_dropout_site *sites; /* [n_instrs]: each native_dropout's (hp_exec_set_rng) */
    bool copies_current;    /* the HP_INSTR_PARAM_CAST outputs hold the parameters' values */
    bool *forward;          /* [n_instrs]: the loss depends on it (hp_exec_forward), or NULL */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *hp_exec_ptr(const hp_exec *e, int32_t b) {
    const hp_buffer *buf = &e->p->buffers[b];
    return (char *)e->region[buf->mem] + buf->offset;
}

int64_t hp_exec_bytes(const hp_exec *e) {
    return e->bytes;
}

void hp_exec_set_trace(hp_exec *e, hp_exec_trace_fn fn, void *ctx) {
    e->trace = fn;
    e->trace_ctx = ctx;
}

void hp_exec_free(hp_exec *e) {
    if (!e) return;
    for (int m = 0; m < HP_MEM_COUNT; m++) e->b->vt->free(e->b, e->region[m]);
    if (e->events)
        for (int32_t i = 0; i < e->p->n_instrs; i++)
            if (e->events[i]) e->b->vt->event_free(e->b, e->events[i]);
    hp_free(e->events);
    hp_free(e->sites);
    hp_free(e->forward);
    hp_free(e->calls);
    hp_free(e->in_ptrs);
    hp_free(e->out_ptrs);
    hp_free(e->types);
    hp_free(e);
}

/* Which instruction produced each root buffer (for cross-stream ordering). */
static hp_status plan_events(hp_exec *e, hp_err *err) {
    const hp_program *p = e->p;
    int32_t *producer = hp_malloc((size_t)(p->n_buffers + 1) * sizeof *producer);
    if (!producer) return hp_errf(err, HP_NOMEM, "out of memory");
    for (int32_t b = 0; b < p->n_buffers; b++) producer[b] = -1;
    hp_status st = HP_OK;
    for (int32_t i = 0; i < p->n_instrs && st == HP_OK; i++) {
        const hp_instr *ins = &p->instrs[i];
        e->calls[i].wait_for = -1;
        for (int k = 0; k < ins->n_in; k++) {
            int32_t src = producer[hp_program_root(p, ins->in[k])];
            if (src < 0 || p->instrs[src].stream == ins->stream) continue;
            if (!e->events[src]) st = e->b->vt->event_new(e->b, &e->events[src], err);
            /* the latest cross-stream producer covers earlier ones on its stream */
            if (src > e->calls[i].wait_for) e->calls[i].wait_for = src;
        }
        for (int k = 0; k < ins->n_out; k++) producer[hp_program_root(p, ins->out[k])] = i;
    }
    hp_free(producer);
    return st;
}

/* Where native_dropout node n's local piece (type t) sits in the whole tensor on this rank: from
 * its placements on the program's mesh, else (FSDP) its global_shape split over the world on
 * the one dim that differs, else it is the whole tensor. */
static hp_status dropout_site(const hp_program *p, const hp_node *n, const hp_type *t,
                              hp_dropout_site *s, hp_err *err) {
    const hp_attr *f = hp_node_attr(n, HP_ATTR_FQN);
    *s = (hp_dropout_site){.stream = hp_rng_stream_id(f && f->s ? f->s : ""), .rank = t->rank};
    for (int d = 0; d < t->rank; d++) s->local[d] = s->global[d] = t->shape[d];
    const hp_graph_mesh *m = &p->graph->mesh;
    const hp_attr *gs = hp_node_attr(n, HP_ATTR_GLOBAL_SHAPE);
    if (m->ndim > 0 && n->pl) {
        hp_type g = *t;
        for (int i = 0; i < m->ndim; i++)
            if (n->pl[i].kind == HP_PLACE_SHARD && n->pl[i].dim < g.rank)
                g.shape[n->pl[i].dim] *= m->size[i];
        int64_t len[HP_MAX_RANK];
        HP_TRY(hp_local_box(&g, n->pl, m->size, p->coord, m->ndim, s->off, len, err));
        for (int d = 0; d < t->rank; d++) s->global[d] = g.shape[d];
    } else if (gs) {
        int index, count;
        hp_program_data_rank(p, p->rank, &index, &count);
        for (int d = 0; d < t->rank && d < gs->ints.n; d++) {
            if (gs->ints.v[d] == t->shape[d]) continue;
            if (gs->ints.v[d] != t->shape[d] * count)
                return hp_errf(err, HP_INVALID,
                               "native_dropout: global dim %d is %lld, not %d ranks' %lld", d,
                               (long long)gs->ints.v[d], count, (long long)t->shape[d]);
            s->global[d] = gs->ints.v[d];
            s->off[d] = (int64_t)index * t->shape[d];
        }
    }
    return HP_OK;
}

void hp_exec_set_eval(hp_exec *e, bool eval) {
    for (int32_t i = 0; e->sites && i < e->p->n_instrs; i++) e->sites[i].eval = eval;
}

void hp_exec_set_rng(hp_exec *e, uint64_t seed, uint64_t step) {
    for (int32_t i = 0; e->sites && i < e->p->n_instrs; i++) {
        e->sites[i].seed = seed;
        e->sites[i].step = step;
    }
}

_Static_assert((int)HP_INSTR_TRANS_A == (int)HP_CALL_TRANS_A &&
                   (int)HP_INSTR_TRANS_B == (int)HP_CALL_TRANS_B &&
                   HP_INSTR_BTHD_IN(0) == HP_CALL_BTHD_IN(0) &&
                   HP_INSTR_BTHD_OUT(0) == HP_CALL_BTHD_OUT(0) &&
                   HP_INSTR_BTHD_MASK == HP_CALL_BTHD_MASK,
               "program and kernel call flags share their bits");

hp_status hp_exec_new(const hp_program *p, hp_backend *b, hp_exec **out, hp_err *err) {
    *out = NULL;
    hp_exec *e = hp_calloc(1, sizeof *e);
    if (!e) return hp_errf(err, HP_NOMEM, "out of memory creating the executor");
    e->p = p;
    e->b = b;
    hp_status st;
    for (int m = HP_MEM_PARAM; m < HP_MEM_COUNT; m++) {
        if ((st = b->vt->alloc(b, (size_t)p->arena_bytes[m], &e->region[m], err)) != HP_OK) {
            hp_err_prefix(err, "allocating the %s arena (%lld bytes%s)",
                          hp_mem_class_name((hp_mem_class)m), (long long)p->arena_bytes[m],
                          m == HP_MEM_ACT ? "; hpctl new --ac selective or --ac full, or a "
                                            "smaller --batch, shrinks it: hpctl plan shows each"
                                          : "");
            goto fail;
        }
        e->bytes += p->arena_bytes[m];
    }
    size_t n_in = 0, n_out = 0;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        n_in += (size_t)p->instrs[i].n_in;
        n_out += (size_t)p->instrs[i].n_out;
    }
    e->calls = hp_calloc((size_t)p->n_instrs + 1, sizeof *e->calls);
    e->events = hp_calloc((size_t)p->n_instrs + 1, sizeof *e->events);
    e->in_ptrs = hp_calloc(n_in + 1, sizeof *e->in_ptrs);
    e->out_ptrs = hp_calloc(n_out + 1, sizeof *e->out_ptrs);
    e->types = hp_calloc(n_in + n_out + 1, sizeof *e->types);
    e->sites = hp_calloc((size_t)p->n_instrs + 1, sizeof *e->sites);
    if (!e->calls || !e->events || !e->in_ptrs || !e->out_ptrs || !e->types || !e->sites) {
        st = hp_errf(err, HP_NOMEM, "out of memory creating the executor");
        goto fail;
    }
    size_t ki = 0, ko = 0, kt = 0;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        hp_kernel_call *c = &e->calls[i].call;
        c->node = &p->graph->nodes[ins->node];
        /* the kernel's flags (the same bits) */
        c->flags = ins->flags & (HP_INSTR_TRANS_A | HP_INSTR_TRANS_B | HP_INSTR_BTHD_MASK);
        c->n_in = ins->n_in;
        c->n_out = ins->n_out;
        c->in = &e->in_ptrs[ki];
        c->in_type = &e->types[kt];
        for (int k = 0; k < ins->n_in; k++) {
            e->in_ptrs[ki++] = hp_exec_ptr(e, ins->in[k]);
            /* an operand stored [B, T, H, D] is described as the [B, H, T, D] it stands for */
            bool bthd = k < 5 && (ins->flags & HP_INSTR_BTHD_IN(k));
            e->types[kt++] =
                bthd ? *hp_graph_type(p->graph, c->node->in[k]) : *p->buffers[ins->in[k]].type;
        }
        c->out = &e->out_ptrs[ko];
        c->out_type = &e->types[kt];
        for (int k = 0; k < ins->n_out; k++) {
            e->out_ptrs[ko++] = hp_exec_ptr(e, ins->out[k]);
            e->types[kt++] = *p->buffers[ins->out[k]].type;
        }
        if (c->node->op == HP_OP_NATIVE_DROPOUT && ins->n_in == 1) {
            if ((st = dropout_site(p, c->node, &c->in_type[0], &e->sites[i], err)) != HP_OK) {
                hp_err_prefix(err, "instruction %d (node %d)", i, ins->node);
                goto fail;
            }
            c->site = &e->sites[i];
        }
    }
    if ((st = plan_events(e, err)) != HP_OK) goto fail;
    *out = e;
    return HP_OK;
fail:
    hp_exec_free(e);
    return st;
}

void hp_exec_param_copies_current(hp_exec *e) {
    e->copies_current = true;
}

/* The instructions the loss depends on: walking back from the end, an instruction is needed
 * when it writes storage that a later needed one reads (or the loss); its inputs then are. */
static hp_status plan_forward(hp_exec *e, hp_err *err) {
    const hp_program *p = e->p;
    bool *needed = hp_calloc((size_t)p->n_buffers + 1, 1);
    e->forward = hp_calloc((size_t)p->n_instrs + 1, sizeof *e->forward);
    if (!needed || !e->forward) {
        hp_free(needed);
        hp_free(e->forward);
        e->forward = NULL;
        return hp_errf(err, HP_NOMEM, "out of memory planning the forward pass");
    }
    needed[hp_program_root(p, p->loss)] = true;
    for (int32_t i = p->n_instrs - 1; i >= 0; i--) {
        const hp_instr *ins = &p->instrs[i];
        for (int k = 0; k < ins->n_out && !e->forward[i]; k++)
            e->forward[i] = needed[hp_program_root(p, ins->out[k])];
        for (int k = 0; e->forward[i] && k < ins->n_in; k++)
            needed[hp_program_root(p, ins->in[k])] = true;
    }
    hp_free(needed);
    return HP_OK;
}

/* Issues the instructions (forward_only: those the loss depends on) and waits for the device. */
static hp_status run(hp_exec *e, bool forward_only, hp_err *err) {
    const hp_program *p = e->p;
    hp_backend *b = e->b;
    bool copies_current = e->copies_current;
    /* after a step, the copies are stale until the caller says otherwise; a forward pass
     * changes no parameter */
    if (!forward_only) e->copies_current = false;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        const exec_call *c = &e->calls[i];
        if (forward_only && !e->forward[i]) continue;
        double t0 = e->trace ? now_s() : 0;
        hp_status st = HP_OK;
        if ((ins->flags & HP_INSTR_PARAM_CAST) && copies_current) {
            /* the optimizer wrote the copy on this stream: a reader on another stream waits
             * for that, through this instruction's event */
            if (e->events[i]) st = b->vt->event_record(b, e->events[i], ins->stream, err);
            if (st != HP_OK) return st;
            continue;
        }
        bool collective = hp_op_get(c->call.node->op)->flags & HP_OPF_COLLECTIVE;
        /* without the instructions it skips, a forward pass does not have the stream order
         * the memory plan was made for: its collectives start on an idle device */
        if (forward_only && collective) st = b->vt->synchronize(b, err);
        if (st == HP_OK && c->wait_for >= 0) {
            double w0 = now_s();
            st = b->vt->event_wait(b, e->events[c->wait_for], ins->stream, err);
            if (ins->stream == HP_STREAM_COMPUTE) e->exposed_s += now_s() - w0;
        }
        if (st == HP_OK && c->call.node->op != HP_OP_WAIT_TENSOR) {
            /* a wait is only its event wait: its output is its input's storage */
            if (collective)
                st = b->vt->collective(b, ins->stream, &c->call, err);
            else
                st = b->vt->launch(b, ins->stream, &c->call, err);
        }
        if (st == HP_OK && e->events[i])
            st = b->vt->event_record(b, e->events[i], ins->stream, err);
        if (st != HP_OK) {
            hp_err_prefix(err, "instruction %d (node %d, %s)", i, ins->node,
                          hp_op_get(c->call.node->op)->name);
            return st;
        }
        if (e->trace) e->trace(e->trace_ctx, i, t0, now_s());
    }
    return b->vt->synchronize(b, err);
}

hp_status hp_exec_step(hp_exec *e, hp_err *err) {
    return run(e, false, err);
}

hp_status hp_exec_forward(hp_exec *e, hp_err *err) {
    if (!e->forward) HP_TRY(plan_forward(e, err));
    return run(e, true, err);
}

double hp_exec_exposed_seconds(const hp_exec *e) {
    return e->exposed_s;
}

hp_status hp_exec_loss(const hp_exec *e, double *loss, hp_err *err) {
    const hp_buffer *buf = &e->p->buffers[e->p->loss];
    if (buf->type->dtype != HP_F32)
        return hp_errf(err, HP_UNSUPPORTED, "loss of dtype %s", hp_dtype_name(buf->type->dtype));
    float v;
    HP_TRY(e->b->vt->copy_out(e->b, &v, hp_exec_ptr(e, e->p->loss), sizeof v, err));
    *loss = v;
    return HP_OK;
}
