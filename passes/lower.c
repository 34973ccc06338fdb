/* passes/lower.c — lowering a joint graph to a Program: one buffer per graph value (aliases
 * for views that move no data), one instruction per remaining node, transposes folded into
 * the matrix products that consume them, gradients written straight into their persistent
 * buffers, then the memory plan (memplan.c) gives every activation its arena offset. */
#include "passes/passes_internal.h"

#include <string.h>

/* Ops whose output is the input's bytes unchanged (row-major, contiguous). */
static bool is_alias_op(const hp_graph *g, const hp_node *n) {
    switch (n->op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE:
    case HP_OP_SQUEEZE:
    case HP_OP_UNSQUEEZE:
    case HP_OP_CLONE: /* values are immutable: a clone may share storage */
    case HP_OP_DETACH:
        return true;
    case HP_OP_TO_COPY:
        return n->out[0].dtype == hp_graph_type(g, n->in[0])->dtype;
    case HP_OP_EXPAND:
        return hp_type_eq(&n->out[0], hp_graph_type(g, n->in[0]));
    default:
        return false;
    }
}

/* An f32 -> bf16 cast of a parameter or buffer input (the mixed-precision pass's param_dtype
 * copy): its output is kept between steps (HP_INSTR_PARAM_CAST). */
static bool is_param_cast(const hp_graph *g, const hp_node *n) {
    if (n->op != HP_OP_TO_COPY || n->n_in != 1 || n->out[0].dtype != HP_BF16) return false;
    const hp_node *src = &g->nodes[n->in[0].node];
    return src->op == HP_OP_PLACEHOLDER && src->out[0].dtype == HP_F32 &&
           hp_node_int(src, HP_ATTR_KIND, HP_INPUT_DATA) != HP_INPUT_DATA;
}

/* A transpose of the last two dims of a rank-2 (mm) or rank-3 (bmm) value. */
static bool is_matrix_transpose(const hp_node *n) {
    if (n->op == HP_OP_T) return n->out[0].rank == 2;
    if (n->op != HP_OP_TRANSPOSE) return false;
    int r = n->out[0].rank;
    if (r != 2 && r != 3) return false;
    int64_t a = hp_node_int(n, HP_ATTR_DIM0, 0), b = hp_node_int(n, HP_ATTR_DIM1, 0);
    if (a < 0) a += r;
    if (b < 0) b += r;
    return (a == r - 1 && b == r - 2) || (a == r - 2 && b == r - 1);
}

/* A transpose of dims 1 and 2 of a rank-4 value: [B, H, T, D] <-> [B, T, H, D] around a fused
 * attention. */
static bool is_head_transpose(const hp_node *n) {
    if (n->op != HP_OP_TRANSPOSE || n->out[0].rank != 4) return false;
    int64_t a = hp_node_int(n, HP_ATTR_DIM0, 0), b = hp_node_int(n, HP_ATTR_DIM1, 0);
    if (a < 0) a += 4;
    if (b < 0) b += 4;
    return (a == 1 && b == 2) || (a == 2 && b == 1);
}

/* Operand i of a fused attention that may be stored [B, T, H, D] (HP_INSTR_BTHD_IN): q, k, v
 * of the forward; g_out, q, k, v, out of the backward. */
static bool is_attention_operand(const hp_node *n, int i) {
    return (n->op == HP_OP_SDPA && i < 3) || (n->op == HP_OP_SDPA_BACKWARD && i < 5);
}

/* Outputs of a fused attention that may be written [B, T, H, D] (HP_INSTR_BTHD_OUT). */
static int attention_outputs(const hp_node *n) {
    return n->op == HP_OP_SDPA ? 1 : n->op == HP_OP_SDPA_BACKWARD ? 3 : 0;
}

/* Operand index i of a matrix-product node that may be given transposed (not addmm's bias). */
static bool is_matrix_operand(const hp_node *n, int i) {
    switch (n->op) {
    case HP_OP_MM:
    case HP_OP_BMM:
        return i == 0 || i == 1;
    case HP_OP_ADDMM:
        return i == 1 || i == 2;
    default:
        return false;
    }
}

typedef struct lower_state {
    hp_program *p;
    const hp_graph *g;
    int32_t *slot0; /* [n_nodes] first value slot of each node */
    int32_t *buf;   /* [n_slots] buffer of each value, -1 none */
    bool *folded;   /* [n_nodes] a transpose folded into its consumers */
    bool *bthd;     /* [n_slots] an attention output written [B, T, H, D] */
    int32_t cap_bufs, cap_instrs;
} lower_state;

static int32_t add_buffer(lower_state *s, hp_mem_class mem, const hp_type *t, int32_t alias_of,
                          int32_t node, int32_t out, hp_err *err) {
    hp_program *p = s->p;
    if (p->n_buffers == s->cap_bufs) {
        int32_t cap = s->cap_bufs ? s->cap_bufs * 2 : 256;
        hp_buffer *b = hp_realloc(p->buffers, (size_t)cap * sizeof *b);
        if (!b) {
            hp_errf(err, HP_NOMEM, "out of memory planning buffers");
            return -1;
        }
        p->buffers = b;
        s->cap_bufs = cap;
    }
    hp_buffer *b = &p->buffers[p->n_buffers];
    memset(b, 0, sizeof *b);
    b->mem = mem;
    b->type = t;
    b->bytes = hp_type_numel(t) * (int64_t)hp_dtype_size(t->dtype);
    b->alias_of = alias_of;
    b->value_node = node;
    b->value_out = out;
    return p->n_buffers++;
}

static hp_status add_instr(lower_state *s, int32_t node, uint32_t flags, const int32_t *in,
                           int n_in, const int32_t *out, int n_out, hp_err *err) {
    hp_program *p = s->p;
    if (p->n_instrs == s->cap_instrs) {
        int32_t cap = s->cap_instrs ? s->cap_instrs * 2 : 256;
        hp_instr *v = hp_realloc(p->instrs, (size_t)cap * sizeof *v);
        if (!v) return hp_errf(err, HP_NOMEM, "out of memory lowering");
        p->instrs = v;
        s->cap_instrs = cap;
    }
    hp_instr *ins = &p->instrs[p->n_instrs];
    memset(ins, 0, sizeof *ins);
    ins->node = node;
    ins->stream = hp_op_get(s->g->nodes[node].op)->flags & HP_OPF_COLLECTIVE ? 1 : 0;
    ins->flags = flags;
    ins->n_in = n_in;
    ins->n_out = n_out;
    if (n_in && !(ins->in = hp_arena_memdup(&p->arena, in, (size_t)n_in * sizeof *in)))
        return hp_errf(err, HP_NOMEM, "out of memory lowering");
    memcpy(ins->out, out, (size_t)n_out * sizeof *out);
    p->n_instrs++;
    return HP_OK;
}

/* Marks the transposes that need no instruction: every consumer is a matrix product taking
 * it as an operand (a matrix transpose), or a fused attention taking it as q, k, v, g_out or
 * out (a head transpose), or another such transpose (t(t(x)) from the backward of mm).
 * Consumers come after producers, so one pass from the end decides each node after all its
 * users. */
static hp_status find_folds(lower_state *s, hp_err *err) {
    const hp_graph *g = s->g;
    bool *ok = hp_malloc((size_t)g->n_nodes + 1);
    bool *used = hp_calloc((size_t)g->n_nodes + 1, 1);
    if (!ok || !used) {
        hp_free(ok);
        hp_free(used);
        return hp_errf(err, HP_NOMEM, "out of memory lowering");
    }
    for (int i = 0; i < g->n_nodes; i++)
        ok[i] = is_matrix_transpose(&g->nodes[i]) || is_head_transpose(&g->nodes[i]);
    for (int i = 0; i < g->n_outputs; i++) ok[g->outputs[i].node] = false;
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        const hp_node *n = &g->nodes[j];
        s->folded[j] = ok[j] && used[j]; /* all users seen: unused ones are DCE's business */
        for (int k = 0; k < n->n_in; k++) {
            int src = n->in[k].node;
            used[src] = true;
            bool takes = is_head_transpose(&g->nodes[src]) ? is_attention_operand(n, k)
                                                           : is_matrix_operand(n, k);
            if (!takes && !s->folded[j]) ok[src] = false;
        }
    }
    hp_free(ok);
    hp_free(used);
    return HP_OK;
}

/* Marks the attention outputs written [B, T, H, D]: those read only by head transposes (at
 * least one: they become aliases of the output's buffer) and as attention operands (which read
 * it with HP_INSTR_BTHD_IN), and not graph outputs. */
static hp_status find_bthd_outputs(lower_state *s, hp_err *err) {
    const hp_graph *g = s->g;
    int32_t n_slots = s->slot0[g->n_nodes];
    unsigned char *use = hp_calloc((size_t)n_slots + 1, 1); /* 1: a transpose reads it, 2: other */
    if (!use) return hp_errf(err, HP_NOMEM, "out of memory lowering");
    for (int j = 0; j < g->n_nodes; j++) {
        const hp_node *n = &g->nodes[j];
        for (int k = 0; k < n->n_in; k++) {
            int32_t slot = s->slot0[n->in[k].node] + n->in[k].out;
            if (is_head_transpose(n))
                use[slot] |= 1;
            else if (!is_attention_operand(n, k))
                use[slot] |= 2;
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        use[s->slot0[g->outputs[i].node] + g->outputs[i].out] |= 2;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < attention_outputs(&g->nodes[i]); k++)
            s->bthd[s->slot0[i] + k] = use[s->slot0[i] + k] == 1;
    hp_free(use);
    return HP_OK;
}

/* Buffers and instructions for every node, in graph order. */
static hp_status lower_nodes(lower_state *s, hp_err *err) {
    const hp_graph *g = s->g;
    hp_program *p = s->p;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        int32_t *vb = &s->buf[s->slot0[i]];
        if (n->op == HP_OP_PLACEHOLDER) {
            int64_t kind = hp_node_int(n, HP_ATTR_KIND, HP_INPUT_DATA);
            vb[0] = add_buffer(s, kind == HP_INPUT_DATA ? HP_MEM_ACT : HP_MEM_PARAM, &n->out[0], -1,
                               i, 0, err);
            if (vb[0] < 0) return err ? err->status : HP_NOMEM;
            continue;
        }
        if (s->folded[i]) continue; /* its consumers read the input buffer */
        if (is_head_transpose(n) && s->bthd[s->slot0[n->in[0].node] + n->in[0].out]) {
            /* the attention wrote this transpose's value: its [B, T, H, D] storage */
            int32_t src = s->buf[s->slot0[n->in[0].node] + n->in[0].out];
            HP_ASSERT(src >= 0 && p->buffers[src].alias_of < 0);
            vb[0] = add_buffer(s, p->buffers[src].mem, &n->out[0], src, i, 0, err);
            if (vb[0] < 0) return err ? err->status : HP_NOMEM;
            p->stats.n_folded_transposes++;
            continue;
        }
        if (is_alias_op(g, n)) {
            int32_t src = s->buf[s->slot0[n->in[0].node] + n->in[0].out];
            HP_ASSERT(src >= 0);
            vb[0] = add_buffer(s, p->buffers[hp_program_root(p, src)].mem, &n->out[0],
                               hp_program_root(p, src), i, 0, err);
            if (vb[0] < 0) return err ? err->status : HP_NOMEM;
            p->stats.n_aliases++;
            continue;
        }
        if (n->op == HP_OP_WAIT_TENSOR) {
            /* a synchronisation point: an instruction (stream 0 waits for the collective that
             * produced its input) whose output is the input's storage */
            int32_t src = s->buf[s->slot0[n->in[0].node] + n->in[0].out];
            int32_t root = hp_program_root(p, src);
            vb[0] = add_buffer(s, p->buffers[root].mem, &n->out[0], root, i, 0, err);
            if (vb[0] < 0) return err ? err->status : HP_NOMEM;
            HP_TRY(add_instr(s, i, 0, &src, 1, vb, 1, err));
            continue;
        }
        int32_t in[HP_MAX_INPUTS];
        uint32_t flags = 0;
        for (int k = 0; k < n->n_in; k++) {
            hp_value v = n->in[k];
            bool flip = false;
            while (s->folded[v.node]) { /* a chain of folded transposes: its parity counts */
                v = g->nodes[v.node].in[0];
                flip = !flip;
            }
            if (s->bthd[s->slot0[v.node] + v.out]) flip = !flip; /* stored [B, T, H, D] */
            if (flip && is_attention_operand(n, k))
                flags |= HP_INSTR_BTHD_IN(k);
            else if (flip)
                flags |=
                    (n->op == HP_OP_ADDMM ? k - 1 : k) == 0 ? HP_INSTR_TRANS_A : HP_INSTR_TRANS_B;
            in[k] = s->buf[s->slot0[v.node] + v.out];
            HP_ASSERT(in[k] >= 0);
        }
        int32_t out[HP_MAX_OUTS];
        hp_mem_class mem = HP_MEM_ACT;
        if (is_param_cast(g, n)) {
            flags |= HP_INSTR_PARAM_CAST;
            mem = HP_MEM_PARAM;
        }
        for (int k = 0; k < n->n_out; k++) {
            out[k] = vb[k] = add_buffer(s, mem, &n->out[k], -1, i, k, err);
            if (out[k] < 0) return err ? err->status : HP_NOMEM;
            if (s->bthd[s->slot0[i] + k]) flags |= HP_INSTR_BTHD_OUT(k);
        }
        HP_TRY(add_instr(s, i, flags, in, n->n_in, out, n->n_out, err));
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (s->folded[i]) p->stats.n_folded_transposes++;
    return HP_OK;
}

/* Gradients land in persistent GRAD buffers: the producing instruction writes there directly
 * when the gradient owns its storage; otherwise a copy (a clone node appended to the graph)
 * moves it there. */
static hp_status place_grads(lower_state *s, hp_err *err) {
    hp_program *p = s->p;
    hp_graph *g = p->graph;
    for (int i = 0; i < p->n_params; i++) {
        hp_value v = g->outputs[1 + i];
        int32_t b = s->buf[s->slot0[v.node] + v.out];
        hp_buffer *buf = &p->buffers[b];
        bool direct = buf->alias_of < 0 && buf->mem == HP_MEM_ACT &&
                      g->nodes[v.node].op != HP_OP_PLACEHOLDER && v.node != g->outputs[0].node;
        /* A gradient that is also an activation read later is fine in GRAD (persistent). */
        if (direct) {
            buf->mem = HP_MEM_GRAD;
            p->params[i].grad = b;
            continue;
        }
        int id = hp_graph_append(g, HP_OP_CLONE, &v, 1, buf->type, 1, NULL, 0, err);
        if (id < 0) return err ? err->status : HP_NOMEM;
        const hp_placement *pl = hp_value_placements(g, v); /* a placed graph: the same */
        if (pl) HP_TRY(hp_node_set_placements(g, id, pl, err));
        /* the clone's own output type: a buffer's type lives in the graph */
        int32_t gb = add_buffer(s, HP_MEM_GRAD, g->nodes[id].out, -1, id, 0, err);
        if (gb < 0) return err ? err->status : HP_NOMEM;
        HP_TRY(add_instr(s, id, 0, &b, 1, &gb, 1, err));
        p->params[i].grad = gb;
    }
    return HP_OK;
}

/* The parameter and data tables. */
static hp_status fill_tables(lower_state *s, hp_err *err) {
    hp_program *p = s->p;
    const hp_graph *g = p->graph;
    hp_graph_inputs in = hp_graph_count_inputs(g);
    p->n_params = in.n_params;
    p->n_bufs = in.n_buffers;
    p->n_data = in.n_data;
    p->params =
        hp_arena_alloc(&p->arena, (size_t)(in.n_params + in.n_buffers + 1) * sizeof *p->params);
    p->data = hp_arena_alloc(&p->arena, (size_t)(in.n_data + 1) * sizeof *p->data);
    if (!p->params || !p->data) return hp_errf(err, HP_NOMEM, "out of memory lowering");
    for (int i = 0; i < in.n_params + in.n_buffers; i++) { /* parameters, then buffers */
        hp_param_slot *ps = &p->params[i];
        hp__param_slot_init(ps, g, i);
        ps->buffer = s->buf[s->slot0[i]];
        ps->grad = -1;
    }
    int first = in.n_params + in.n_buffers;
    for (int i = 0; i < in.n_data; i++) {
        const hp_node *n = &g->nodes[first + i];
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        p->data[i].name = fqn ? fqn->s : "";
        p->data[i].node = first + i;
        p->data[i].buffer = s->buf[s->slot0[first + i]];
    }
    return HP_OK;
}

static hp_status check_joint(const hp_graph *g, bool verified, hp_err *err) {
    if (!verified) HP_TRY(hp_graph_verify(g, err));
    hp_graph_inputs in = hp_graph_count_inputs(g);
    if (g->n_outputs != 1 + in.n_params)
        return hp_errf(err, HP_INVALID,
                       "not a joint graph: %d outputs for %d parameters (expected the loss, "
                       "then one gradient per parameter)",
                       g->n_outputs, in.n_params);
    const hp_type *loss = hp_graph_type(g, g->outputs[0]);
    if (loss->rank != 0 || !hp_dtype_is_float(loss->dtype))
        return hp_errf(err, HP_INVALID, "output 0 (the loss) must be a floating scalar");
    for (int i = 0; i < in.n_params; i++) {
        const hp_type *gt = hp_graph_type(g, g->outputs[1 + i]);
        if (!hp_type_eq(gt, &g->nodes[i].out[0]))
            return hp_errf(err, HP_INVALID, "output %d (gradient of '%s') has the wrong type",
                           1 + i, hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s);
    }
    return HP_OK;
}

/* The program's own graph: the joint graph with room for place_grads' gradient copies. Where
 * the joint graph lends its storage (hp_compile's, which frees it with the program) the copy
 * shares its nodes' types and attributes; otherwise it is a deep copy. */
static hp_graph *copy_joint(const hp_graph *joint, int extra) {
    if (!joint->lends) return hp_graph_clone_room(joint, extra);
    hp_graph *c = hp_graph_new();
    if (!c || hp_graph_reserve(c, joint->n_nodes + extra, NULL) != HP_OK) goto fail;
    c->mesh = joint->mesh;
    for (int i = 0; i < joint->n_nodes; i++) {
        const hp_node *n = &joint->nodes[i];
        if (hp_graph_append_like(c, joint, n, n->in, NULL) < 0) goto fail;
        if (n->pl && hp_node_set_placements(c, i, n->pl, NULL) != HP_OK) goto fail;
    }
    if (hp_graph_set_outputs(c, joint->outputs, joint->n_outputs, NULL) != HP_OK) goto fail;
    return c;
fail:
    hp_graph_free(c);
    return NULL;
}

hp_status hp_lower(const hp_graph *joint, hp_program **out, hp_err *err) {
    return hp__lower(joint, false, out, err);
}

hp_status hp__lower(const hp_graph *joint, bool verified, hp_program **out, hp_err *err) {
    *out = NULL;
    HP_TRY(check_joint(joint, verified, err));
    hp_program *p = hp_calloc(1, sizeof *p);
    if (!p) return hp_errf(err, HP_NOMEM, "out of memory lowering");
    hp_arena_init(&p->arena);
    /* SPMD: one program for every rank; the world is the mesh's ranks, or (FSDP) the widest
     * group the graph uses */
    p->world = 1;
    for (int i = 0; i < joint->n_nodes; i++) {
        /* only placeholders and collectives take a group_size (graph/ops.def): the others'
         * attributes are not worth a cache miss each */
        const hp_node *n = &joint->nodes[i];
        if (n->op != HP_OP_PLACEHOLDER && !(hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE)) continue;
        int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1);
        if (gs > p->world) p->world = (int)gs;
    }
    if (joint->mesh.ndim > 0) {
        p->world = 1;
        for (int d = 0; d < joint->mesh.ndim; d++) p->world *= (int)joint->mesh.size[d];
    }
    lower_state s = {.p = p};
    hp_status st = HP_NOMEM;
    /* room for place_grads' gradient copies (at most one per parameter) */
    hp_graph_inputs gin = hp_graph_count_inputs(joint);
    if (!(p->graph = copy_joint(joint, gin.n_params))) goto nomem;
    const hp_graph *g = s.g = p->graph;
    s.slot0 = hp_calloc((size_t)g->n_nodes + 1, sizeof *s.slot0);
    s.folded = hp_calloc((size_t)g->n_nodes + 1, sizeof *s.folded);
    if (!s.slot0 || !s.folded) goto nomem;
    int32_t n_slots = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        s.slot0[i] = n_slots;
        n_slots += g->nodes[i].n_out;
    }
    s.slot0[g->n_nodes] = n_slots;
    if (!(s.buf = hp_malloc((size_t)(n_slots + 1) * sizeof *s.buf))) goto nomem;
    if (!(s.bthd = hp_calloc((size_t)n_slots + 1, sizeof *s.bthd))) goto nomem;
    /* at most a buffer per value and an instruction per node, plus the gradient copies */
    s.cap_bufs = n_slots + gin.n_params + 1;
    s.cap_instrs = g->n_nodes + gin.n_params + 1;
    p->buffers = hp_malloc((size_t)s.cap_bufs * sizeof *p->buffers);
    p->instrs = hp_malloc((size_t)s.cap_instrs * sizeof *p->instrs);
    if (!p->buffers || !p->instrs) goto nomem;
    for (int32_t i = 0; i < n_slots; i++) s.buf[i] = -1;
    if ((st = find_folds(&s, err)) != HP_OK) goto fail;
    if ((st = find_bthd_outputs(&s, err)) != HP_OK) goto fail;
    if ((st = lower_nodes(&s, err)) != HP_OK) goto fail;
    if ((st = fill_tables(&s, err)) != HP_OK) goto fail;
    if ((st = place_grads(&s, err)) != HP_OK) goto fail;
    p->loss = s.buf[s.slot0[g->outputs[0].node] + g->outputs[0].out];
    if ((st = hp__memplan(p, err)) != HP_OK) goto fail;
    hp__program_mesh_init(p);
    if ((st = hp_program_set_rank(p, 0, err)) != HP_OK) goto fail;
    hp_free(s.slot0);
    hp_free(s.folded);
    hp_free(s.bthd);
    hp_free(s.buf);
    *out = p;
    return HP_OK;
nomem:
    st = hp_errf(err, HP_NOMEM, "out of memory lowering");
fail:
    hp_free(s.slot0);
    hp_free(s.folded);
    hp_free(s.bthd);
    hp_free(s.buf);
    hp_program_free(p);
    return st;
}
