/* passes/rewrite.c — the rewriter every graph pass builds its output with: a new graph plus a
 * map from old values to new ones. The contracts are in passes_internal.h. Nothing here knows
 * about any particular pass. */
#include "passes/passes_internal.h"

#include <string.h>

hp_status hp__rewrite_start(hp__rewrite *rw, const hp_graph *in, hp_err *err) {
    memset(rw, 0, sizeof *rw);
    rw->in = in;
    rw->slot0 = hp_malloc(((size_t)in->n_nodes + 1) * sizeof *rw->slot0);
    int32_t slots = 0;
    if (rw->slot0) {
        for (int i = 0; i < in->n_nodes; i++) {
            rw->slot0[i] = slots;
            slots += in->nodes[i].n_out;
        }
        rw->slot0[in->n_nodes] = slots;
    }
    rw->map = hp_malloc(((size_t)slots + 1) * sizeof *rw->map);
    rw->out = hp_graph_new();
    /* room for a copy (passes that add nodes grow the array past it) */
    if (!rw->slot0 || !rw->map || !rw->out || hp_graph_reserve(rw->out, in->n_nodes, NULL)) {
        hp__rewrite_abort(rw);
        return hp_errf(err, HP_NOMEM, "out of memory starting a rewrite");
    }
    for (int32_t s = 0; s < slots; s++) rw->map[s] = HP_NO_VALUE;
    return HP_OK;
}

static bool old_ok(const hp__rewrite *rw, hp_value v) {
    return v.node >= 0 && v.node < rw->in->n_nodes && v.out >= 0 &&
           v.out < rw->in->nodes[v.node].n_out;
}

hp_value hp__rewrite_get(const hp__rewrite *rw, hp_value v) {
    if (!old_ok(rw, v)) return HP_NO_VALUE;
    return rw->map[rw->slot0[v.node] + v.out];
}

void hp__rewrite_set(hp__rewrite *rw, hp_value v, hp_value now) {
    HP_ASSERT(old_ok(rw, v));
    rw->map[rw->slot0[v.node] + v.out] = now;
}

int hp__rewrite_copy(hp__rewrite *rw, int id, hp_err *err) {
    const hp_node *n = &rw->in->nodes[id];
    hp_value small[8], *in = small;
    if (n->n_in > (int)HP_ARRAY_LEN(small) && !(in = hp_malloc((size_t)n->n_in * sizeof *in))) {
        hp_errf(err, HP_NOMEM, "out of memory copying node %d", id);
        return -1;
    }
    int nid = -1;
    for (int k = 0; k < n->n_in; k++) {
        in[k] = hp__rewrite_get(rw, n->in[k]);
        if (!hp_value_ok(in[k])) {
            hp_errf(err, HP_INTERNAL, "node %d (%s): input %d (%%%d.%d) has no rewritten value", id,
                    hp_op_get(n->op)->name, k, n->in[k].node, n->in[k].out);
            goto done;
        }
    }
    nid = hp_graph_append_like(rw->out, rw->in, n, in, err);
    if (nid >= 0)
        for (int k = 0; k < n->n_out; k++)
            hp__rewrite_set(rw, (hp_value){id, k}, (hp_value){nid, k});
done:
    if (in != small) hp_free(in);
    return nid;
}

int hp__rewrite_append(hp__rewrite *rw, hp_op op, const hp_value *in, int n_in, const hp_type *out,
                       int n_out, const hp_attr *attrs, int n_attrs, hp_err *err) {
    return hp_graph_append(rw->out, op, in, n_in, out, n_out, attrs, n_attrs, err);
}

hp_value hp__rewrite_build(hp__rewrite *rw, hp_op op, const hp_value *in, int n_in,
                           const hp_attr *attrs, int n_attrs, hp_err *err) {
    hp_value v = hp_build(rw->out, op, in, n_in, attrs, n_attrs);
    if (hp_graph_failed(rw->out)) {
        if (err) *err = rw->out->err;
        return HP_NO_VALUE;
    }
    return v;
}

static void free_state(hp__rewrite *rw) {
    hp_free(rw->slot0);
    hp_free(rw->map);
    rw->slot0 = NULL;
    rw->map = NULL;
}

hp_status hp__rewrite_finish(hp__rewrite *rw, hp_graph **out, hp_err *err) {
    *out = NULL;
    hp_status st = HP_OK;
    const hp_graph *in = rw->in;
    for (int i = 0; i < in->n_outputs && st == HP_OK; i++) {
        hp_value v = hp__rewrite_get(rw, in->outputs[i]);
        if (!hp_value_ok(v))
            st = hp_errf(err, HP_INTERNAL, "graph output %d (%%%d.%d) has no rewritten value", i,
                         in->outputs[i].node, in->outputs[i].out);
        else
            st = hp_graph_add_output(rw->out, v, err);
    }
    if (st != HP_OK) {
        hp__rewrite_abort(rw);
        return st;
    }
    *out = rw->out;
    rw->out = NULL;
    free_state(rw);
    return HP_OK;
}

void hp__rewrite_abort(hp__rewrite *rw) {
    hp_graph_free(rw->out);
    rw->out = NULL;
    free_state(rw);
}

hp_status hp__rewrite_fused(const hp_graph *in, const int32_t *role, hp__fuse_emit emit, void *ctx,
                            hp_graph **out, hp_err *err) {
    *out = NULL;
    bool any = false;
    for (int i = 0; i < in->n_nodes && !any; i++) any = role[i] > 0;
    if (!any) return hp__dce(in, out, NULL, err); /* a copy: nothing to fuse */
    hp__rewrite rw;
    HP_TRY(hp__rewrite_start(&rw, in, err));
    hp_status st = HP_OK;
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) {
        if (role[i] > 0)
            st = emit(&rw, i, role[i], ctx, err);
        else if (role[i] == 0 && hp__rewrite_copy(&rw, i, err) < 0)
            st = err ? err->status : HP_INTERNAL;
    }
    if (st != HP_OK) {
        hp__rewrite_abort(&rw);
        return st;
    }
    hp_graph *mid = NULL;
    HP_TRY(hp__rewrite_finish(&rw, &mid, err));
    return hp__dce_take(mid, out, err);
}
