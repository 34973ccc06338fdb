/* passes/dce.c — dead-code elimination: a node stays if one of its outputs reaches a graph
 * output (or it is a placeholder: placeholders are the graph's interface — the parameter and
 * data tables are built from them — so an unused parameter keeps its slot). One backward
 * sweep marks the live nodes (inputs always precede their readers), one forward sweep copies
 * them. Everything is pure, so nothing else keeps a node alive: there are no side effects in
 * the op table (collectives are consumed by wait_tensor, which an output must reach). */
#include "passes/passes_internal.h"

/* live[i] for every node; returns the number of dead ones. */
static int mark_live(const hp_graph *in, bool *live) {
    for (int i = 0; i < in->n_outputs; i++)
        if (in->outputs[i].node >= 0 && in->outputs[i].node < in->n_nodes)
            live[in->outputs[i].node] = true;
    int dead = 0;
    for (int i = in->n_nodes - 1; i >= 0; i--) {
        const hp_node *n = &in->nodes[i];
        if (n->op == HP_OP_PLACEHOLDER) live[i] = true;
        if (!live[i]) {
            dead++;
            continue;
        }
        for (int k = 0; k < n->n_in; k++) live[n->in[k].node] = true;
    }
    return dead;
}

/* The live nodes, with their placements and the graph's mesh (a placed graph stays placed). */
static hp_status sweep(const hp_graph *in, const bool *live, hp_graph **out, hp_err *err) {
    hp__rewrite rw;
    hp_err e = {0};
    HP_TRY(hp__rewrite_start(&rw, in, err));
    hp_status st = in->mesh.ndim > 0 ? hp_graph_set_mesh(rw.out, &in->mesh, &e) : HP_OK;
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) {
        if (!live[i]) continue;
        int id = hp__rewrite_copy(&rw, i, &e);
        if (id < 0)
            st = e.status;
        else if (in->nodes[i].pl)
            st = hp_node_set_placements(rw.out, id, in->nodes[i].pl, &e);
    }
    if (st != HP_OK) {
        if (err) *err = e;
        hp__rewrite_abort(&rw);
        return st;
    }
    return hp__rewrite_finish(&rw, out, err);
}

hp_status hp__dce(const hp_graph *in, hp_graph **out, int *removed, hp_err *err) {
    *out = NULL;
    bool *live = hp_calloc((size_t)in->n_nodes + 1, sizeof *live);
    if (!live) return hp_errf(err, HP_NOMEM, "out of memory in dce");
    int dead = mark_live(in, live);
    hp_status st = sweep(in, live, out, err);
    if (st == HP_OK && removed) *removed = dead;
    hp_free(live);
    return st;
}

hp_status hp__dce_take(hp_graph *g, hp_graph **out, hp_err *err) {
    *out = NULL;
    bool *live = hp_calloc((size_t)g->n_nodes + 1, sizeof *live);
    if (!live) {
        hp_graph_free(g);
        return hp_errf(err, HP_NOMEM, "out of memory in dce");
    }
    hp_status st = HP_OK;
    if (mark_live(g, live) == 0) /* a copy would equal g */
        *out = g;
    else {
        st = sweep(g, live, out, err);
        hp_graph_free(g);
    }
    hp_free(live);
    return st;
}

bool hp__dce_no_op(const hp_graph *in) {
    bool *live = hp_calloc((size_t)in->n_nodes + 1, sizeof *live);
    bool none = live && mark_live(in, live) == 0; /* out of memory: let the pass say so */
    hp_free(live);
    return none;
}

hp_status hp_pass_dce(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    (void)ctx;
    return hp__dce(in, out, NULL, err);
}
