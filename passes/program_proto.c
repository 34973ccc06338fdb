/* passes/program_proto.c — the Program on the wire (hp.v1.Program). Types and init specs are
 * not trusted from the message: they are taken from the program's own graph (which the
 * importer verifies), then hp_program_verify checks every index and offset. */
#include "hp/proto_io.h"
#include "passes/passes_internal.h"

#include "hp/v1/program.pb-c.h"

#include <math.h>
#include <string.h>

#define MAX_BUFFERS (4 * HP_MAX_NODES)

/* ---- pack ----------------------------------------------------------------------------------- */

#define ARENA_NEW(a, T)    ((T *)hp_arena_alloc((a), sizeof(T)))
#define ARENA_ARR(a, T, n) ((T *)hp_arena_alloc((a), sizeof(T) * (size_t)((n) ? (n) : 1)))

hp_status hp_program_pack(const hp_program *p, uint8_t **data, size_t *len, hp_err *err) {
    *data = NULL;
    *len = 0;
    hp_arena a;
    hp_arena_init(&a);
    hp_status st = HP_NOMEM;
    Hp__V1__Program m = HP__V1__PROGRAM__INIT;
    m.format_version = HP_PROGRAM_FORMAT_VERSION;
    m.rank = p->rank;
    m.world_size = p->world;
    m.n_mesh = (size_t)p->mesh.ndim;
    if (!(m.mesh = ARENA_ARR(&a, Hp__V1__MeshDim *, p->mesh.ndim))) goto nomem;
    for (int d = 0; d < p->mesh.ndim; d++) {
        Hp__V1__MeshDim *md = ARENA_NEW(&a, Hp__V1__MeshDim);
        if (!md) goto nomem;
        hp__v1__mesh_dim__init(md);
        md->name = (char *)p->mesh.name[d];
        md->size = (int32_t)p->mesh.size[d];
        if (p->link_bandwidth[d] > 0) {
            Hp__V1__LinkClass *lc = ARENA_NEW(&a, Hp__V1__LinkClass);
            if (!lc) goto nomem;
            hp__v1__link_class__init(lc);
            lc->bandwidth_bytes_per_s = p->link_bandwidth[d];
            lc->latency_s = p->link_latency[d];
            md->link = lc;
        }
        m.mesh[d] = md;
    }
    if ((st = hp_graph_export(p->graph, &a, &m.graph, err)) != HP_OK) goto done;
    st = HP_NOMEM;
    m.n_arena_bytes = HP_MEM_COUNT;
    if (!(m.arena_bytes = ARENA_ARR(&a, int64_t, HP_MEM_COUNT))) goto nomem;
    memcpy(m.arena_bytes, p->arena_bytes, sizeof p->arena_bytes);
    m.loss_buffer = p->loss;

    m.n_buffers = (size_t)p->n_buffers;
    if (!(m.buffers = ARENA_ARR(&a, Hp__V1__Buffer *, p->n_buffers))) goto nomem;
    for (int32_t i = 0; i < p->n_buffers; i++) {
        const hp_buffer *b = &p->buffers[i];
        Hp__V1__Buffer *mb = ARENA_NEW(&a, Hp__V1__Buffer);
        if (!mb) goto nomem;
        hp__v1__buffer__init(mb);
        mb->id = i;
        mb->memory_class = (Hp__V1__MemoryClass)b->mem;
        mb->offset = b->offset;
        mb->bytes = b->bytes;
        mb->alias_of = b->alias_of + 1;
        mb->value_node = b->value_node;
        mb->value_output = b->value_out;
        m.buffers[i] = mb;
    }
    m.n_instructions = (size_t)p->n_instrs;
    if (!(m.instructions = ARENA_ARR(&a, Hp__V1__Instruction *, p->n_instrs))) goto nomem;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        Hp__V1__Instruction *mi = ARENA_NEW(&a, Hp__V1__Instruction);
        if (!mi) goto nomem;
        hp__v1__instruction__init(mi);
        mi->op = (char *)hp_op_get(p->graph->nodes[ins->node].op)->name;
        mi->node = ins->node;
        mi->stream = ins->stream ? HP__V1__STREAM__STREAM_COMM : HP__V1__STREAM__STREAM_COMPUTE;
        mi->flags = ins->flags;
        mi->record_event = -1;
        mi->n_inputs = (size_t)ins->n_in;
        mi->inputs = ins->in;
        mi->n_outputs = (size_t)ins->n_out;
        mi->outputs = (int32_t *)ins->out;
        m.instructions[i] = mi;
    }
    m.n_params = (size_t)p->n_params;
    m.n_buffer_inputs = (size_t)p->n_bufs;
    if (!(m.params = ARENA_ARR(&a, Hp__V1__ParamShard *, p->n_params)) ||
        !(m.buffer_inputs = ARENA_ARR(&a, Hp__V1__ParamShard *, p->n_bufs)))
        goto nomem;
    for (int32_t i = 0; i < p->n_params + p->n_bufs; i++) {
        const hp_param_slot *ps = &p->params[i];
        Hp__V1__ParamShard *mp = ARENA_NEW(&a, Hp__V1__ParamShard);
        if (!mp) goto nomem;
        hp__v1__param_shard__init(mp);
        mp->fqn = (char *)ps->fqn;
        int r = ps->global.rank;
        mp->count = 1;
        for (int d = 0; d < p->mesh.ndim; d++) /* informational: a dim-0 split's count */
            if (ps->pl[d].kind == HP_PLACE_SHARD && ps->pl[d].dim == 0) {
                mp->index = mp->index * (int32_t)p->mesh.size[d] + (int32_t)p->coord[d];
                mp->count *= (int32_t)p->mesh.size[d];
            }
        mp->padded_dim0 = r ? p->buffers[ps->buffer].type->shape[0] * mp->count : 1;
        mp->n_box_offset = mp->n_box_length = (size_t)r;
        mp->box_offset = (int64_t *)ps->off;
        mp->box_length = (int64_t *)ps->len;
        mp->buffer = ps->buffer;
        mp->grad_buffer = ps->grad;
        mp->node = ps->node;
        if (i < p->n_params)
            m.params[i] = mp;
        else
            m.buffer_inputs[i - p->n_params] = mp;
    }
    m.n_data = (size_t)p->n_data;
    if (!(m.data = ARENA_ARR(&a, Hp__V1__DataInput *, p->n_data))) goto nomem;
    for (int32_t i = 0; i < p->n_data; i++) {
        Hp__V1__DataInput *md = ARENA_NEW(&a, Hp__V1__DataInput);
        if (!md) goto nomem;
        hp__v1__data_input__init(md);
        md->name = (char *)p->data[i].name;
        md->node = p->data[i].node;
        md->buffer = p->data[i].buffer;
        m.data[i] = md;
    }
    size_t n = protobuf_c_message_get_packed_size(&m.base);
    if (n > HP_PROTO_MAX_BYTES) {
        st = hp_errf(err, HP_LIMIT, "program encodes to %zu bytes, over the limit of %zu", n,
                     HP_PROTO_MAX_BYTES);
        goto done;
    }
    if (!(*data = hp_malloc(n))) goto nomem;
    *len = protobuf_c_message_pack(&m.base, *data);
    st = HP_OK;
    goto done;
nomem:
    st = hp_errf(err, HP_NOMEM, "out of memory packing the program");
done:
    hp_arena_fini(&a);
    return st;
}

/* ---- unpack --------------------------------------------------------------------------------- */

/* Slot i of the message: a parameter, then the buffer inputs. */
#define SLOT(m, i) ((i) < (m)->n_params ? (m)->params[i] : (m)->buffer_inputs[(i) - (m)->n_params])

static hp_status fill(hp_program *p, const Hp__V1__Program *m, hp_err *err) {
    const hp_graph *g = p->graph;
    if (m->format_version != HP_PROGRAM_FORMAT_VERSION)
        return hp_errf(err, HP_UNSUPPORTED, "program format version %u (this build reads %d)",
                       m->format_version, HP_PROGRAM_FORMAT_VERSION);
    if (m->n_buffers > MAX_BUFFERS || m->n_instructions > MAX_BUFFERS ||
        m->n_params > HP_MAX_NODES || m->n_buffer_inputs > HP_MAX_NODES || m->n_data > HP_MAX_NODES)
        return hp_errf(err, HP_LIMIT, "program has too many buffers, instructions or inputs");
    if (m->n_arena_bytes != HP_MEM_COUNT)
        return hp_errf(err, HP_INVALID, "arena_bytes has %zu entries, expected %d",
                       m->n_arena_bytes, HP_MEM_COUNT);
    memcpy(p->arena_bytes, m->arena_bytes, sizeof p->arena_bytes);
    p->rank = m->rank;
    p->world = m->world_size;
    p->loss = m->loss_buffer;
    p->n_buffers = (int32_t)m->n_buffers;
    p->n_instrs = (int32_t)m->n_instructions;
    p->n_params = (int32_t)m->n_params;
    p->n_bufs = (int32_t)m->n_buffer_inputs;
    p->n_data = (int32_t)m->n_data;
    p->buffers = hp_calloc(m->n_buffers + 1, sizeof *p->buffers);
    p->instrs = hp_calloc(m->n_instructions + 1, sizeof *p->instrs);
    p->params =
        hp_arena_alloc(&p->arena, (m->n_params + m->n_buffer_inputs + 1) * sizeof *p->params);
    p->data = hp_arena_alloc(&p->arena, (m->n_data + 1) * sizeof *p->data);
    if (!p->buffers || !p->instrs || !p->params || !p->data)
        return hp_errf(err, HP_NOMEM, "out of memory reading the program");
    for (size_t i = 0; i < m->n_buffers; i++) {
        const Hp__V1__Buffer *mb = m->buffers[i];
        hp_buffer *b = &p->buffers[i];
        const hp_type *t = hp_graph_type(g, (hp_value){mb->value_node, mb->value_output});
        if (!t)
            return hp_errf(err, HP_INVALID, "buffer %zu: value %d.%d is not in the graph", i,
                           mb->value_node, mb->value_output);
        b->mem = (hp_mem_class)mb->memory_class;
        b->offset = mb->offset;
        b->bytes = mb->bytes;
        b->type = t;
        b->alias_of = mb->alias_of - 1;
        b->value_node = mb->value_node;
        b->value_out = mb->value_output;
    }
    for (size_t i = 0; i < m->n_instructions; i++) {
        const Hp__V1__Instruction *mi = m->instructions[i];
        hp_instr *ins = &p->instrs[i];
        if (mi->n_inputs > HP_MAX_INPUTS || mi->n_outputs > HP_MAX_OUTS)
            return hp_errf(err, HP_LIMIT, "instruction %zu: %zu inputs, %zu outputs", i,
                           mi->n_inputs, mi->n_outputs);
        ins->node = mi->node;
        ins->stream = mi->stream == HP__V1__STREAM__STREAM_COMM ? 1 : 0;
        ins->flags = mi->flags;
        ins->n_in = (int)mi->n_inputs;
        ins->n_out = (int)mi->n_outputs;
        if (mi->n_inputs &&
            !(ins->in = hp_arena_memdup(&p->arena, mi->inputs, mi->n_inputs * sizeof(int32_t))))
            return hp_errf(err, HP_NOMEM, "out of memory reading the program");
        if (mi->n_outputs) /* outputs is NULL when there are none: memcpy(.., NULL, 0) is UB */
            memcpy(ins->out, mi->outputs, mi->n_outputs * sizeof(int32_t));
    }
    size_t n_slots = m->n_params + m->n_buffer_inputs;
    for (size_t i = 0; i < n_slots; i++) {
        const Hp__V1__ParamShard *mp = SLOT(m, i);
        hp_param_slot *ps = &p->params[i];
        if (mp->node < 0 || mp->node >= g->n_nodes || g->nodes[mp->node].op != HP_OP_PLACEHOLDER)
            return hp_errf(err, HP_INVALID, "parameter %zu: node %d is not a placeholder", i,
                           mp->node);
        hp__param_slot_init(ps, g, mp->node);
        ps->buffer = mp->buffer;
        ps->grad = mp->grad_buffer;
    }
    /* the mesh and the boxes follow from the graph and the rank; the message must agree */
    hp__program_mesh_init(p);
    if (m->n_mesh != (size_t)p->mesh.ndim)
        return hp_errf(err, HP_INVALID, "mesh of %zu dims, the graph's has %d", m->n_mesh,
                       p->mesh.ndim);
    for (size_t d = 0; d < m->n_mesh; d++)
        if (!m->mesh[d]->name || strcmp(m->mesh[d]->name, p->mesh.name[d]) ||
            m->mesh[d]->size != p->mesh.size[d])
            return hp_errf(err, HP_INVALID, "mesh dim %zu disagrees with the graph's", d);
    for (size_t d = 0; d < m->n_mesh; d++) {
        const Hp__V1__LinkClass *lc = m->mesh[d]->link;
        if (!lc) continue;
        if (!(lc->bandwidth_bytes_per_s > 0) || !(lc->latency_s >= 0) ||
            !isfinite(lc->bandwidth_bytes_per_s) || !isfinite(lc->latency_s))
            return hp_errf(err, HP_INVALID, "mesh dim %zu: link of %g B/s, %g s", d,
                           lc->bandwidth_bytes_per_s, lc->latency_s);
        p->link_bandwidth[d] = lc->bandwidth_bytes_per_s;
        p->link_latency[d] = lc->latency_s;
    }
    HP_TRY(hp_program_set_rank(p, p->rank, err));
    for (size_t i = 0; i < n_slots; i++) {
        const Hp__V1__ParamShard *mp = SLOT(m, i);
        const hp_param_slot *ps = &p->params[i];
        bool same = mp->n_box_offset == (size_t)ps->global.rank &&
                    mp->n_box_length == (size_t)ps->global.rank;
        for (int d = 0; same && d < ps->global.rank; d++)
            same = mp->box_offset[d] == ps->off[d] && mp->box_length[d] == ps->len[d];
        if (!same)
            return hp_errf(err, HP_INVALID,
                           "parameter %zu ('%s'): its box is not what its placements give rank %d",
                           i, ps->fqn, p->rank);
    }
    for (size_t i = 0; i < m->n_data; i++) {
        const Hp__V1__DataInput *md = m->data[i];
        if (md->node < 0 || md->node >= g->n_nodes)
            return hp_errf(err, HP_INVALID, "data input %zu: node %d", i, md->node);
        const hp_attr *fqn = hp_node_attr(&g->nodes[md->node], HP_ATTR_FQN);
        p->data[i].name = fqn ? fqn->s : "";
        p->data[i].node = md->node;
        p->data[i].buffer = md->buffer;
    }
    return hp_program_verify(p, err);
}

hp_status hp_program_unpack(const uint8_t *data, size_t len, hp_program **out, hp_err *err) {
    *out = NULL;
    if (len > HP_PROTO_MAX_BYTES)
        return hp_errf(err, HP_LIMIT, "program message of %zu bytes is over the limit of %zu", len,
                       HP_PROTO_MAX_BYTES);
    hp_proto_alloc a;
    hp_proto_alloc_init(&a, len);
    Hp__V1__Program *m = hp__v1__program__unpack(&a.base, len, data);
    if (!m) return hp_proto_unpack_error(&a, "program", len, err);
    hp_status cs = hp_proto_check_strings(&hp__v1__program__descriptor, data, len, "program", err);
    if (cs != HP_OK) {
        hp__v1__program__free_unpacked(m, &a.base);
        return cs;
    }
    hp_status st;
    hp_program *p = hp_calloc(1, sizeof *p);
    if (!p) {
        st = hp_errf(err, HP_NOMEM, "out of memory reading the program");
        goto done;
    }
    hp_arena_init(&p->arena);
    if (!m->graph) {
        st = hp_errf(err, HP_INVALID, "program has no graph");
        goto done;
    }
    if ((st = hp_graph_import(m->graph, &p->graph, err)) != HP_OK) {
        hp_err_prefix(err, "program graph");
        goto done;
    }
    st = fill(p, m, err);
done:
    hp__v1__program__free_unpacked(m, &a.base);
    if (st != HP_OK)
        hp_program_free(p);
    else
        *out = p;
    return st;
}
