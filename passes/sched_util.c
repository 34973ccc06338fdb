/* passes/sched_util.c — helpers shared by the scheduling passes (overlap, bucketing): user
 * lists, FSDP units, communication counts. See sched_util.h. */
#include "passes/sched_util.h"

#include <ctype.h>
#include <string.h>

hp_status hp__users_init(hp__users *u, const hp_graph *g, hp_err *err) {
    memset(u, 0, sizeof *u);
    int n = g->n_nodes;
    int64_t edges = 0;
    for (int i = 0; i < n; i++) {
        const hp_node *nd = &g->nodes[i];
        if (!hp_op_get(nd->op) || nd->n_out < 0 || nd->n_out > HP_MAX_OUTS)
            return hp_errf(err, HP_INVALID, "node %d: op %d or its %d outputs out of range", i,
                           (int)nd->op, nd->n_out);
        for (int k = 0; k < nd->n_in; k++) {
            hp_value v = nd->in[k];
            if (v.node < 0 || v.node >= i || v.out < 0 || v.out >= g->nodes[v.node].n_out)
                return hp_errf(err, HP_INVALID,
                               "node %d (%s): input %d refers to %%%d.%d, not an output of an "
                               "earlier node",
                               i, hp_op_get(nd->op)->name, k, (int)v.node, (int)v.out);
        }
        edges += nd->n_in;
    }
    if (edges > INT32_MAX) return hp_errf(err, HP_LIMIT, "%lld edges", (long long)edges);
    for (int i = 0; i < g->n_outputs; i++) {
        hp_value v = g->outputs[i];
        if (v.node < 0 || v.node >= n || v.out < 0 || v.out >= g->nodes[v.node].n_out)
            return hp_errf(err, HP_INVALID, "graph output %d refers to %%%d.%d, not a value", i,
                           (int)v.node, (int)v.out);
    }
    u->off = hp_calloc((size_t)n + 1, sizeof *u->off);
    u->user = hp_malloc((size_t)(edges ? edges : 1) * sizeof *u->user);
    u->is_output = hp_calloc((size_t)(n ? n : 1), sizeof *u->is_output);
    if (!u->off || !u->user || !u->is_output) {
        hp__users_fini(u);
        return hp_errf(err, HP_NOMEM, "out of memory listing the users of %d nodes", n);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) u->off[g->nodes[i].in[k].node + 1]++;
    for (int i = 0; i < n; i++) u->off[i + 1] += u->off[i];
    /* fill with a moving cursor per node (off[i] advanced, then shifted back) */
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) u->user[u->off[g->nodes[i].in[k].node]++] = i;
    for (int i = n; i > 0; i--) u->off[i] = u->off[i - 1];
    u->off[0] = 0;
    for (int i = 0; i < g->n_outputs; i++) u->is_output[g->outputs[i].node] = true;
    return HP_OK;
}

void hp__users_fini(hp__users *u) {
    hp_free(u->off);
    hp_free(u->user);
    hp_free(u->is_output);
    memset(u, 0, sizeof *u);
}

static bool all_digits(const char *s, size_t n) {
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    return true;
}

size_t hp__block_len(const char *fqn) {
    size_t len = strlen(fqn), start = 0;
    for (size_t i = 0; i < len; i++) {
        if (fqn[i] != '.') continue;
        /* component [start, i), followed by more */
        if (start > 0 && all_digits(fqn + start, i - start)) return i;
        start = i + 1;
    }
    return 0;
}

size_t hp__fsdp_unit_len(const char *fqn) {
    size_t block = hp__block_len(fqn);
    if (block) return block;
    const char *last = strrchr(fqn, '.');
    return last ? (size_t)(last - fqn) : strlen(fqn);
}

bool hp__same_unit(const hp_graph *g, int32_t a, int32_t b) {
    if (a == b) return true;
    const hp_attr *fa = hp_node_attr(&g->nodes[a], HP_ATTR_FQN);
    const hp_attr *fb = hp_node_attr(&g->nodes[b], HP_ATTR_FQN);
    if (!fa || !fb || fa->kind != HP_ATTR_KIND_STR || fb->kind != HP_ATTR_KIND_STR) return false;
    size_t la = hp__fsdp_unit_len(fa->s), lb = hp__fsdp_unit_len(fb->s);
    return la == lb && memcmp(fa->s, fb->s, la) == 0;
}

bool hp__is_data_movement(hp_op op) {
    switch (op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE:
    case HP_OP_PERMUTE:
    case HP_OP_TRANSPOSE:
    case HP_OP_T:
    case HP_OP_UNSQUEEZE:
    case HP_OP_SQUEEZE:
        return true;
    default:
        return false;
    }
}

int32_t hp__gathered_param(const hp_graph *g, int32_t id) {
    const hp_node *n = &g->nodes[id];
    if (n->op != HP_OP_ALL_GATHER || n->n_in != 1) return -1;
    int32_t x = n->in[0].node;
    while (g->nodes[x].op != HP_OP_PLACEHOLDER) {
        const hp_node *m = &g->nodes[x];
        if (!hp__is_data_movement(m->op) || m->n_in != 1) return -1;
        x = m->in[0].node;
    }
    return x;
}

bool hp__is_param_gather(const hp_graph *g, int32_t id) {
    return hp__gathered_param(g, id) >= 0;
}

hp_status hp__copy_mesh(hp_graph *o, const hp_graph *g, hp_err *err) {
    return g->mesh.ndim > 0 ? hp_graph_set_mesh(o, &g->mesh, err) : HP_OK;
}

int64_t hp__type_bytes(const hp_type *t) {
    return hp_type_numel(t) * (int64_t)hp_dtype_size(t->dtype);
}

void hp__sched_report(hp_pass_report *r, const hp_graph *in, const hp_graph *out, bool ran) {
    if (!r) return;
    r->ran = ran;
    r->nodes_in = in->n_nodes;
    r->nodes_out = out->n_nodes;
    r->collectives = 0;
    r->comm_bytes = 0;
    for (int i = 0; i < out->n_nodes; i++) {
        if (!(hp_op_get(out->nodes[i].op)->flags & HP_OPF_COLLECTIVE)) continue;
        r->collectives++;
        r->comm_bytes += hp_collective_bytes(out, i);
    }
}
