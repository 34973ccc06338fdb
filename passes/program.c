/* passes/program.c — the Program's lifetime, its verifier (a program from the wire is
 * untrusted: every index, offset and type is checked against the graph and the arenas before a
 * worker touches memory) and its human-readable listing. */
#include "passes/passes_internal.h"
#include "hp/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *hp_mem_class_name(hp_mem_class m) {
    switch (m) {
    case HP_MEM_PARAM:
        return "param";
    case HP_MEM_GRAD:
        return "grad";
    case HP_MEM_ACT:
        return "act";
    case HP_MEM_COMM:
        return "comm";
    default:
        return "?";
    }
}

void hp__param_slot_init(hp_param_slot *ps, const hp_graph *g, int32_t id) {
    const hp_node *n = &g->nodes[id];
    const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN), *init = hp_node_attr(n, HP_ATTR_INIT);
    const hp_attr *gs = hp_node_attr(n, HP_ATTR_GLOBAL_SHAPE);
    ps->fqn = fqn ? fqn->s : "";
    ps->node = id;
    ps->global = n->out[0];
    if (init) ps->init = init->init;
    for (int i = 0; i < HP_MESH_MAX_DIMS; i++) ps->pl[i] = HP_REPLICATE;
    if (gs) { /* split storage: its global shape */
        ps->global.rank = gs->ints.n;
        for (int d = 0; d < gs->ints.n; d++) ps->global.shape[d] = gs->ints.v[d];
    }
    const hp_placement *pl = hp_value_placements(g, (hp_value){id, 0});
    if (g->mesh.ndim > 0 && pl)
        memcpy(ps->pl, pl, sizeof *pl * (size_t)g->mesh.ndim);
    else if (g->mesh.ndim == 0 && gs && hp_node_int(n, HP_ATTR_GROUP_SIZE, 1) > 1)
        ps->pl[0] = HP_SHARD(0); /* FSDP: dim 0 over the world */
    for (int d = 0; d < HP_MAX_RANK; d++) ps->off[d] = 0, ps->len[d] = ps->global.shape[d];
}

void hp__program_mesh_init(hp_program *p) {
    const hp_graph_mesh *gm = &p->graph->mesh;
    memset(&p->mesh, 0, sizeof p->mesh);
    if (gm->ndim > 0) {
        p->mesh = *gm;
    } else {
        p->mesh.ndim = 1;
        snprintf(p->mesh.name[0], sizeof p->mesh.name[0], "world");
        p->mesh.size[0] = p->world;
    }
}

void hp_program_coords(const hp_program *p, int rank, int64_t *coord) {
    int64_t r = rank;
    for (int i = p->mesh.ndim - 1; i >= 0; i--) {
        int64_t n = p->mesh.size[i] > 0 ? p->mesh.size[i] : 1;
        coord[i] = r % n;
        r /= n;
    }
}

hp_status hp_program_box(const hp_program *p, int i, int rank, int64_t *off, int64_t *len,
                         hp_err *err) {
    if (i < 0 || i >= p->n_params + p->n_bufs || rank < 0 || rank >= p->world)
        return hp_errf(err, HP_INVALID, "parameter %d at rank %d of %d", i, rank, p->world);
    int64_t coord[HP_MESH_MAX_DIMS];
    hp_program_coords(p, rank, coord);
    const hp_param_slot *ps = &p->params[i];
    hp_status st =
        hp_local_box(&ps->global, ps->pl, p->mesh.size, coord, p->mesh.ndim, off, len, err);
    if (st != HP_OK) hp_err_prefix(err, "parameter '%s'", ps->fqn);
    return st;
}

hp_status hp_program_set_rank(hp_program *p, int rank, hp_err *err) {
    if (rank < 0 || rank >= p->world)
        return hp_errf(err, HP_INVALID, "rank %d of world %d", rank, p->world);
    p->rank = rank;
    hp_program_coords(p, rank, p->coord);
    for (int i = 0; i < p->n_params + p->n_bufs; i++)
        HP_TRY(hp_program_box(p, i, rank, p->params[i].off, p->params[i].len, err));
    return HP_OK;
}

bool hp_program_owns(const hp_program *p, int i, int rank) {
    int64_t coord[HP_MESH_MAX_DIMS];
    hp_program_coords(p, rank, coord);
    for (int d = 0; d < p->mesh.ndim; d++)
        if (p->params[i].pl[d].kind != HP_PLACE_SHARD && coord[d] != 0) return false;
    return true;
}

void hp_program_data_rank(const hp_program *p, int rank, int *index, int *count) {
    *index = 0;
    *count = 1;
    if (p->graph->mesh.ndim == 0) { /* FSDP: the batch is split over the world */
        *index = rank;
        *count = p->world;
        return;
    }
    int64_t coord[HP_MESH_MAX_DIMS];
    hp_program_coords(p, rank, coord);
    const hp_placement *pl =
        p->n_data > 0 ? hp_value_placements(p->graph, (hp_value){p->data[0].node, 0}) : NULL;
    for (int d = 0; pl && d < p->mesh.ndim; d++)
        if (pl[d].kind == HP_PLACE_SHARD && pl[d].dim == 0) {
            *index = *index * (int)p->mesh.size[d] + (int)coord[d];
            *count *= (int)p->mesh.size[d];
        }
}

void hp_program_free(hp_program *p) {
    if (!p) return;
    hp_graph_free(p->graph);
    hp_free(p->buffers);
    hp_free(p->instrs);
    hp_arena_fini(&p->arena);
    hp_free(p);
}

static hp_status check_buffer(const hp_program *p, int32_t b, const char *what, int32_t at,
                              hp_err *err) {
    if (b < 0 || b >= p->n_buffers)
        return hp_errf(err, HP_INVALID, "%s %d refers to buffer %d of %d", what, at, b,
                       p->n_buffers);
    return HP_OK;
}

static hp_status verify_buffers(const hp_program *p, hp_err *err) {
    const hp_graph *g = p->graph;
    for (int32_t b = 0; b < p->n_buffers; b++) {
        const hp_buffer *buf = &p->buffers[b];
        if (buf->mem < HP_MEM_PARAM || buf->mem >= HP_MEM_COUNT)
            return hp_errf(err, HP_INVALID, "buffer %d: memory class %d", b, (int)buf->mem);
        const hp_type *t = hp_graph_type(g, (hp_value){buf->value_node, buf->value_out});
        if (!t)
            return hp_errf(err, HP_INVALID, "buffer %d: holds value %d.%d, not in the graph", b,
                           buf->value_node, buf->value_out);
        if (!buf->type || !hp_type_eq(t, buf->type))
            return hp_errf(err, HP_INVALID, "buffer %d: type differs from its graph value", b);
        if (buf->bytes != hp_type_numel(t) * (int64_t)hp_dtype_size(t->dtype))
            return hp_errf(err, HP_INVALID, "buffer %d: %lld bytes for its type", b,
                           (long long)buf->bytes);
        int32_t root = b;
        if (buf->alias_of >= 0) {
            HP_TRY(check_buffer(p, buf->alias_of, "alias of buffer", b, err));
            root = buf->alias_of;
            const hp_buffer *r = &p->buffers[root];
            if (r->alias_of >= 0 || r->mem != buf->mem || r->offset != buf->offset ||
                r->bytes < buf->bytes)
                return hp_errf(err, HP_INVALID, "buffer %d: a bad alias of buffer %d", b, root);
        }
        if (buf->offset < 0 || buf->offset % HP_BUFFER_ALIGN ||
            buf->offset > p->arena_bytes[buf->mem] ||
            buf->bytes > p->arena_bytes[buf->mem] - buf->offset)
            return hp_errf(err, HP_INVALID,
                           "buffer %d: [%lld, +%lld) lies outside the %s arena of %lld bytes", b,
                           (long long)buf->offset, (long long)buf->bytes,
                           hp_mem_class_name(buf->mem), (long long)p->arena_bytes[buf->mem]);
    }
    return HP_OK;
}

/* An HP_INSTR_PARAM_CAST: a bf16 _to_copy of one parameter or buffer input's storage (the graph's
 * first n_placed placeholders). */
static bool param_cast_ok(const hp_program *p, const hp_instr *ins, int n_placed) {
    const hp_node *n = &p->graph->nodes[ins->node];
    if (n->op != HP_OP_TO_COPY || ins->n_in != 1 || ins->n_out != 1 || n->out[0].dtype != HP_BF16 ||
        ins->in[0] < 0 || ins->in[0] >= p->n_buffers)
        return false;
    const hp_buffer *src = &p->buffers[hp_program_root(p, ins->in[0])];
    return src->mem == HP_MEM_PARAM && src->value_node >= 0 && src->value_node < n_placed;
}

int32_t hp_program_param_cast(const hp_program *p, int i) {
    if (i < 0 || i >= p->n_params + p->n_bufs) return -1;
    for (int32_t k = 0; k < p->n_instrs; k++) {
        const hp_instr *ins = &p->instrs[k];
        if ((ins->flags & HP_INSTR_PARAM_CAST) && ins->n_in == 1 &&
            hp_program_root(p, ins->in[0]) == p->params[i].buffer)
            return ins->out[0];
    }
    return -1;
}

/* t with dims 1 and 2 exchanged (rank 4). */
static hp_type swap_heads(const hp_type *t) {
    hp_type r = *t;
    if (r.rank == 4) {
        r.shape[1] = t->shape[2];
        r.shape[2] = t->shape[1];
    }
    return r;
}

/* Which buffers an attention writes [B, T, H, D] (HP_INSTR_BTHD_OUT): each must be a rank-4
 * root whose value's aliases are all head transposes (their types its dims 1 and 2 exchanged);
 * aliases of those (views of the transposed value) share the root too. */
static hp_status find_bthd_buffers(const hp_program *p, bool *bthd, hp_err *err) {
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        for (int k = 0; k < ins->n_out && k < 3; k++)
            if ((ins->flags & HP_INSTR_BTHD_OUT(k)) && ins->out[k] >= 0 &&
                ins->out[k] < p->n_buffers)
                bthd[ins->out[k]] = true;
    }
    for (int32_t b = 0; b < p->n_buffers; b++) {
        const hp_buffer *buf = &p->buffers[b];
        if (bthd[b] && buf->type->rank != 4)
            return hp_errf(err, HP_INVALID, "buffer %d: written [B, T, H, D], but of rank %d", b,
                           buf->type->rank);
        if (buf->alias_of < 0 || !bthd[buf->alias_of]) continue;
        const hp_buffer *root = &p->buffers[buf->alias_of];
        const hp_node *n = &p->graph->nodes[buf->value_node];
        if (n->n_in < 1 || n->in[0].node != root->value_node || n->in[0].out != root->value_out)
            continue; /* a view of a value derived from the root's: of its transpose */
        hp_type want = swap_heads(root->type);
        if (n->op != HP_OP_TRANSPOSE || !hp_type_eq(buf->type, &want))
            return hp_errf(err, HP_INVALID,
                           "buffer %d: an alias of buffer %d, which is stored [B, T, H, D], "
                           "but not its head transpose",
                           b, buf->alias_of);
    }
    return HP_OK;
}

static hp_status verify_instr(const hp_program *p, int32_t i, hp_graph_inputs gi, const bool *bthd,
                              hp_err *err) {
    const hp_graph *g = p->graph;
    const hp_instr *ins = &p->instrs[i];
    if (ins->node < 0 || ins->node >= g->n_nodes)
        return hp_errf(err, HP_INVALID, "instruction %d: node %d of %d", i, ins->node, g->n_nodes);
    const hp_node *n = &g->nodes[ins->node];
    if (ins->n_in != n->n_in || ins->n_out != n->n_out)
        return hp_errf(err, HP_INVALID,
                       "instruction %d (%s): %d inputs, %d outputs for the "
                       "node's %d, %d",
                       i, hp_op_get(n->op)->name, ins->n_in, ins->n_out, n->n_in, n->n_out);
    if (ins->stream < 0 || ins->stream > 1)
        return hp_errf(err, HP_INVALID, "instruction %d: stream %d", i, ins->stream);
    bool mat = n->op == HP_OP_MM || n->op == HP_OP_BMM || n->op == HP_OP_ADDMM;
    uint32_t trans = HP_INSTR_TRANS_A | HP_INSTR_TRANS_B;
    bool cast = ins->flags & HP_INSTR_PARAM_CAST;
    /* the attention operands that may be stored [B, T, H, D] */
    uint32_t bthd_ok = n->op == HP_OP_SDPA            ? 0x7u << 4 | HP_INSTR_BTHD_OUT(0)
                       : n->op == HP_OP_SDPA_BACKWARD ? 0x1fu << 4 | 0x7u << 10
                                                      : 0;
    if (ins->flags & ~(trans | HP_INSTR_PARAM_CAST | bthd_ok) || ((ins->flags & trans) && !mat) ||
        (cast && !param_cast_ok(p, ins, gi.n_params + gi.n_buffers)))
        return hp_errf(err, HP_INVALID, "instruction %d (%s): flags 0x%x", i,
                       hp_op_get(n->op)->name, ins->flags);
    for (int k = 0; k < ins->n_out; k++) {
        HP_TRY(check_buffer(p, ins->out[k], "instruction", i, err));
        const hp_buffer *b = &p->buffers[ins->out[k]];
        bool alias_ok = n->op == HP_OP_WAIT_TENSOR; /* its output is its input's storage */
        if (b->value_node != ins->node || b->value_out != k || (b->alias_of >= 0 && !alias_ok) ||
            (b->mem == HP_MEM_PARAM) != cast)
            return hp_errf(err, HP_INVALID,
                           "instruction %d: output %d writes buffer %d, "
                           "which does not hold it",
                           i, k, ins->out[k]);
    }
    for (int k = 0; k < ins->n_in; k++) {
        HP_TRY(check_buffer(p, ins->in[k], "instruction", i, err));
        const hp_buffer *b = &p->buffers[ins->in[k]];
        const hp_type *want = hp_graph_type(g, n->in[k]);
        hp_type got = *b->type;
        unsigned bit = n->op == HP_OP_ADDMM ? (k == 1   ? HP_INSTR_TRANS_A
                                               : k == 2 ? HP_INSTR_TRANS_B
                                                        : 0)
                                            : (k == 0 ? HP_INSTR_TRANS_A : HP_INSTR_TRANS_B);
        if (mat && (ins->flags & bit) && got.rank >= 2) {
            int64_t t = got.shape[got.rank - 1];
            got.shape[got.rank - 1] = got.shape[got.rank - 2];
            got.shape[got.rank - 2] = t;
        }
        /* [B, T, H, D] storage read as [B, H, T, D] (HP_INSTR_BTHD_IN): what the buffer holds
         * (an attention's BTHD output holds its type with dims 1 and 2 exchanged) must be what
         * the reader takes (its operand, exchanged too under the flag); a BTHD output read
         * without the flag is its head transpose's value, through a folded transpose */
        bool swapped = k < 5 && (ins->flags & HP_INSTR_BTHD_IN(k));
        if ((swapped || bthd[ins->in[k]]) && (got.rank != 4 || want->rank != 4))
            return hp_errf(err, HP_INVALID,
                           "instruction %d (%s): input %d is read [B, T, H, D] but of rank %d", i,
                           hp_op_get(n->op)->name, k, got.rank);
        if (swapped != bthd[ins->in[k]]) got = swap_heads(&got);
        if (!hp_type_eq(&got, want))
            return hp_errf(err, HP_INVALID,
                           "instruction %d (%s): input %d reads buffer %d "
                           "of the wrong type",
                           i, hp_op_get(n->op)->name, k, ins->in[k]);
    }
    return HP_OK;
}

static hp_status verify_instrs(const hp_program *p, hp_err *err) {
    const hp_graph *g = p->graph;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    bool *bthd = hp_calloc((size_t)p->n_buffers + 1, sizeof *bthd);
    if (!bthd) return hp_errf(err, HP_NOMEM, "out of memory verifying the program");
    hp_status st = find_bthd_buffers(p, bthd, err);
    for (int32_t i = 0; i < p->n_instrs && st == HP_OK; i++) st = verify_instr(p, i, gi, bthd, err);
    hp_free(bthd);
    return st;
}

hp_status hp_program_verify(const hp_program *p, hp_err *err) {
    return hp__program_verify(p, false, err);
}

hp_status hp__program_verify(const hp_program *p, bool graph_verified, hp_err *err) {
    if (!p->graph) return hp_errf(err, HP_INVALID, "program has no graph");
    if (!graph_verified) HP_TRY(hp_graph_verify(p->graph, err));
    if (p->world < 1 || p->rank < 0 || p->rank >= p->world)
        return hp_errf(err, HP_INVALID, "rank %d of world %d", p->rank, p->world);
    for (int m = 0; m < HP_MEM_COUNT; m++)
        if (p->arena_bytes[m] < 0 || p->arena_bytes[m] > HP_MAX_NUMEL)
            return hp_errf(err, HP_INVALID, "%s arena of %lld bytes",
                           hp_mem_class_name((hp_mem_class)m), (long long)p->arena_bytes[m]);
    HP_TRY(verify_buffers(p, err));
    HP_TRY(verify_instrs(p, err));
    HP_TRY(check_buffer(p, p->loss, "the loss", 0, err));
    hp_graph_inputs in = hp_graph_count_inputs(p->graph);
    if (p->n_params != in.n_params || p->n_bufs != in.n_buffers || p->n_data != in.n_data)
        return hp_errf(err, HP_INVALID,
                       "%d parameters, %d buffers and %d data inputs, the graph has %d, %d, %d",
                       p->n_params, p->n_bufs, p->n_data, in.n_params, in.n_buffers, in.n_data);
    for (int i = 0; i < p->n_params + p->n_bufs; i++) {
        const hp_param_slot *ps = &p->params[i];
        bool param = i < p->n_params;
        HP_TRY(check_buffer(p, ps->buffer, "parameter", i, err));
        if (param) HP_TRY(check_buffer(p, ps->grad, "parameter", i, err));
        if (ps->node != i || p->buffers[ps->buffer].value_node != i ||
            p->buffers[ps->buffer].mem != HP_MEM_PARAM ||
            (param ? p->buffers[ps->grad].mem != HP_MEM_GRAD : ps->grad != -1))
            return hp_errf(err, HP_INVALID, "%s %d: inconsistent buffers",
                           param ? "parameter" : "buffer input", i);
        /* the storage placements must give the local buffer's type (padding allowed) */
        hp_type local;
        hp_err e = {0};
        if (hp_local_type(&ps->global, ps->pl, p->mesh.size, p->mesh.ndim, false, &local, &e) !=
                HP_OK ||
            !hp_type_eq(&local, p->buffers[ps->buffer].type))
            return hp_errf(err, HP_INVALID,
                           "parameter %d ('%s'): its placements do not give its local type%s%s", i,
                           ps->fqn, e.msg[0] ? ": " : "", e.msg);
        int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
        HP_TRY(hp_program_box(p, i, p->rank, off, len, err));
        for (int d = 0; d < ps->global.rank; d++)
            if (off[d] != ps->off[d] || len[d] != ps->len[d])
                return hp_errf(err, HP_INVALID, "parameter %d ('%s'): box is not rank %d's", i,
                               ps->fqn, p->rank);
    }
    int64_t ranks = 1;
    for (int d = 0; d < p->mesh.ndim; d++) ranks *= p->mesh.size[d];
    if (ranks != p->world)
        return hp_errf(err, HP_INVALID, "world %d, but the mesh has %lld ranks", p->world,
                       (long long)ranks);
    for (int i = 0; i < p->n_data; i++) {
        HP_TRY(check_buffer(p, p->data[i].buffer, "data input", i, err));
        if (p->buffers[p->data[i].buffer].value_node != p->data[i].node)
            return hp_errf(err, HP_INVALID, "data input %d: buffer %d holds another value", i,
                           p->data[i].buffer);
    }
    return HP_OK;
}

/* ---- listing -------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool nomem;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->nomem) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        /* NULL + 0 is undefined (clang's UBSan reports it): the first call sizes with NULL */
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *s = hp_realloc(b->s, cap);
        if (!s) {
            b->nomem = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

hp_status hp_program_print(const hp_program *p, char **text, hp_err *err) {
    sbuf b = {0};
    sb_printf(&b, "program rank %d of %d: %d instructions, %d buffers\n", p->rank, p->world,
              p->n_instrs, p->n_buffers);
    for (int m = HP_MEM_PARAM; m < HP_MEM_COUNT; m++)
        sb_printf(&b, "arena %-5s %lld bytes\n", hp_mem_class_name((hp_mem_class)m),
                  (long long)p->arena_bytes[m]);
    sb_printf(&b,
              "activations: %lld bytes of values in a %lld-byte arena; %d aliases, %d "
              "transposes folded\n",
              (long long)p->stats.act_values_bytes, (long long)p->stats.act_arena_bytes,
              p->stats.n_aliases, p->stats.n_folded_transposes);
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        char line[256];
        sb_printf(&b, "%5d %s ", i, ins->stream ? "comm" : "comp");
        for (int k = 0; k < ins->n_out; k++) {
            const hp_buffer *o = &p->buffers[ins->out[k]];
            sb_printf(&b, "%sb%d@%s+%lld", k ? "," : "", ins->out[k], hp_mem_class_name(o->mem),
                      (long long)o->offset);
        }
        sb_printf(&b, " <-");
        for (int k = 0; k < ins->n_in; k++) sb_printf(&b, " b%d", ins->in[k]);
        if (ins->flags & (HP_INSTR_TRANS_A | HP_INSTR_TRANS_B))
            sb_printf(&b, " [trans%s%s]", ins->flags & HP_INSTR_TRANS_A ? " a" : "",
                      ins->flags & HP_INSTR_TRANS_B ? " b" : "");
        if (ins->flags & HP_INSTR_BTHD_MASK) {
            sb_printf(&b, " [bthd");
            for (int k = 0; k < 5; k++)
                if (ins->flags & HP_INSTR_BTHD_IN(k)) sb_printf(&b, " in%d", k);
            for (int k = 0; k < 3; k++)
                if (ins->flags & HP_INSTR_BTHD_OUT(k)) sb_printf(&b, " out%d", k);
            sb_printf(&b, "]");
        }
        if (ins->flags & HP_INSTR_PARAM_CAST) sb_printf(&b, " [param copy]");
        sb_printf(&b, "   # %s\n", hp_node_str(p->graph, ins->node, line, sizeof line));
    }
    if (b.nomem) {
        hp_free(b.s);
        *text = NULL;
        return hp_errf(err, HP_NOMEM, "out of memory printing the program");
    }
    *text = b.s;
    return HP_OK;
}
