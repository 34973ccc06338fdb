/* graph/verify.c — the verifier: one node at a time (shared with the builder), then the graph
 * as a whole (placeholder order, unique FQNs, outputs). Everything a file or a peer can get
 * wrong is checked here before any pass or backend looks at the graph. */
#include "graph/graph_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static hp_status check_attrs(const hp_node *n, const hp_op_info *info, hp_err *err) {
    uint64_t seen = 0;
    for (int i = 0; i < n->n_attrs; i++) {
        const hp_attr *a = &n->attrs[i];
        if ((unsigned)a->key >= HP_ATTR_COUNT)
            return hp_errf(err, HP_INVALID, "attribute key %d out of range", (int)a->key);
        const char *name = hp_attr_key_name(a->key);
        uint64_t bit = UINT64_C(1) << a->key;
        if (!((info->required | info->optional) & bit))
            return hp_errf(err, HP_INVALID, "attribute '%s' is not accepted by %s", name,
                           info->name);
        if (seen & bit) return hp_errf(err, HP_INVALID, "duplicate attribute '%s'", name);
        seen |= bit;
        if (a->kind != hp_attr_key_kind(a->key))
            return hp_errf(err, HP_INVALID, "attribute '%s' has the wrong kind", name);
        switch (a->kind) {
        case HP_ATTR_KIND_INTS:
            if (a->ints.n < 0 || a->ints.n > HP_MAX_ATTR_INTS)
                return hp_errf(err, HP_INVALID, "attribute '%s' has %d values, at most %d allowed",
                               name, a->ints.n, HP_MAX_ATTR_INTS);
            break;
        case HP_ATTR_KIND_DTYPE:
            if ((unsigned)a->dtype >= HP_DTYPE_COUNT)
                return hp_errf(err, HP_INVALID, "attribute '%s': dtype %d out of range", name,
                               (int)a->dtype);
            break;
        case HP_ATTR_KIND_STR:
            if (!a->s) return hp_errf(err, HP_INVALID, "attribute '%s' has no string", name);
            if (strnlen(a->s, HP_MAX_STR + 1) > HP_MAX_STR)
                return hp_errf(err, HP_INVALID, "attribute '%s' is longer than %d bytes", name,
                               HP_MAX_STR);
            break;
        case HP_ATTR_KIND_INIT: {
            hp_status s = hp_init_check(&a->init, err);
            if (s != HP_OK) return s;
            break;
        }
        default:
            break;
        }
    }
    uint64_t missing = info->required & ~seen;
    if (missing) {
        int k = __builtin_ctzll(missing);
        return hp_errf(err, HP_INVALID, "missing required attribute '%s'",
                       hp_attr_key_name((hp_attr_key)k));
    }
    return HP_OK;
}

hp_status hp__check_node(const hp_graph *g, int id, const hp_node *n, hp_type *inferred,
                         hp_err *err) {
    const hp_op_info *info = hp_op_get(n->op);
    if (!info) {
        hp_errf(err, HP_INVALID, "op %d out of range", (int)n->op);
        return hp_err_prefix(err, "node %d", id);
    }
    hp_status s = HP_OK;
    hp_type small[8], *in = small;
    if (info->n_in == HP_VARIADIC ? (n->n_in < 1 || n->n_in > HP_MAX_INPUTS)
                                  : n->n_in != info->n_in) {
        s = info->n_in == HP_VARIADIC
                ? hp_errf(err, HP_INVALID, "takes 1 to %d inputs, got %d", HP_MAX_INPUTS, n->n_in)
                : hp_errf(err, HP_INVALID, "takes %d inputs, got %d", info->n_in, n->n_in);
        goto out;
    }
    if (n->n_out != info->n_out) {
        s = hp_errf(err, HP_INVALID, "has %d outputs, got %d", info->n_out, n->n_out);
        goto out;
    }
    if (n->n_in > (int)HP_ARRAY_LEN(small)) {
        in = hp_calloc((size_t)n->n_in, sizeof *in);
        if (!in) {
            s = hp_errf(err, HP_NOMEM, "out of memory");
            goto out;
        }
    }
    for (int i = 0; i < n->n_in; i++) {
        hp_value v = n->in[i];
        if (v.node < 0 || v.node >= id) {
            s = v.node >= id && v.node < g->n_nodes
                    ? hp_errf(err, HP_INVALID,
                              "input %d refers to node %d, which does not come before it "
                              "(cycle or wrong order)",
                              i, v.node)
                    : hp_errf(err, HP_INVALID, "input %d refers to node %d, which does not exist",
                              i, v.node);
            goto out;
        }
        const hp_node *src = &g->nodes[v.node];
        if (v.out < 0 || v.out >= src->n_out) {
            s = hp_errf(err, HP_INVALID, "input %d refers to output %d of node %d, which has %d", i,
                        v.out, v.node, src->n_out);
            goto out;
        }
        in[i] = src->out[v.out];
    }
    s = check_attrs(n, info, err);
    if (s != HP_OK) goto out;
    memset(inferred, 0, (size_t)info->n_out * sizeof *inferred);
    s = info->shape(n, in, inferred, err);
    if (s != HP_OK) goto out;
    for (int k = 0; k < info->n_out; k++) {
        s = hp_type_check(&inferred[k], err);
        if (s != HP_OK) {
            hp_err_prefix(err, "output %d", k);
            goto out;
        }
    }
out:
    if (in != small) hp_free(in);
    if (s != HP_OK) hp_err_prefix(err, "node %d (%s)", id, info ? info->name : "?");
    return s;
}

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Placeholders first, ordered param, buffer, data; params and buffers named, names unique. */
static hp_status check_placeholders(const hp_graph *g, hp_err *err) {
    int n_ph = 0;
    int64_t last_kind = HP_INPUT_PARAM;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (n->op != HP_OP_PLACEHOLDER) continue;
        if (i != n_ph)
            return hp_errf(err, HP_INVALID,
                           "node %d (placeholder): placeholders must come before all other nodes",
                           i);
        n_ph++;
        int64_t kind = hp_node_int(n, HP_ATTR_KIND, -1);
        if (kind < last_kind)
            return hp_errf(err, HP_INVALID,
                           "node %d (placeholder): inputs must be ordered parameters, buffers, "
                           "then data",
                           i);
        last_kind = kind;
    }
    if (n_ph < 2) return HP_OK;
    const char **names = hp_calloc((size_t)n_ph, sizeof *names);
    if (!names) return hp_errf(err, HP_NOMEM, "out of memory checking names");
    int k = 0;
    for (int i = 0; i < n_ph; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        if (a) names[k++] = a->s;
    }
    qsort(names, (size_t)k, sizeof *names, str_ptr_cmp);
    hp_status s = HP_OK;
    for (int i = 1; i < k; i++) {
        if (strcmp(names[i], names[i - 1]) == 0) {
            s = hp_errf(err, HP_INVALID, "placeholder name '%s' is used twice", names[i]);
            break;
        }
    }
    hp_free(names);
    return s;
}

/* ---- placements ------------------------------------------------------------------------------
 * With a mesh, every value carries one placement per mesh dim and its type is the rank's
 * local piece. A placeholder's piece must be its global_shape (or its type times the mesh's
 * split) cut as the placements say, padding allowed; every other node's placements must be,
 * on each mesh dim, one of its op's sharding rules asked about the pieces the mesh dims
 * before it left (or all Replicate), so compute never meets an uneven split. */

/* The type of value v before mesh dims [from, ndim) split it: its local type with those
 * dims' Shards multiplied back. */
static hp_type unsplit(const hp_graph *g, const hp_type *local, const hp_placement *pl, int from) {
    hp_type t = *local;
    for (int i = from; i < g->mesh.ndim; i++)
        if (pl[i].kind == HP_PLACE_SHARD && pl[i].dim < t.rank)
            t.shape[pl[i].dim] *= g->mesh.size[i];
    return t;
}

static bool rule_matches(const hp_shard_rule *r, const hp_node *n, const hp_placement *in,
                         const hp_placement *out, bool variadic) {
    for (int j = 0; j < n->n_in; j++) {
        hp_placement want = variadic || j >= HP_SHARD_MAX_IN ? r->in[0] : r->in[j];
        if (!hp_placement_eq(want, in[j])) return false;
    }
    for (int k = 0; k < n->n_out; k++)
        if (!hp_placement_eq(r->out[k], out[k])) return false;
    return true;
}

static hp_status check_node_placements(const hp_graph *g, int id, hp_err *err) {
    const hp_node *n = &g->nodes[id];
    const char *op = hp_op_get(n->op)->name;
    int nd = g->mesh.ndim;
    if (!n->pl)
        return hp_errf(err, HP_INVALID,
                       "node %d (%s): no placements (a graph with a mesh places every value)", id,
                       op);
    if (n->op == HP_OP_PLACEHOLDER) {
        const hp_attr *gs = hp_node_attr(n, HP_ATTR_GLOBAL_SHAPE);
        hp_type global = gs ? hp_type_make(n->out[0].dtype, gs->ints.n, gs->ints.v)
                            : unsplit(g, &n->out[0], n->pl, 0);
        hp_type local;
        hp_err e;
        if (hp_local_type(&global, n->pl, g->mesh.size, nd, false, &local, &e) != HP_OK)
            return hp_errf(err, HP_INVALID, "node %d (%s): %s", id, op, e.msg);
        if (!hp_type_eq(&local, &n->out[0])) {
            char a[96], b[96];
            return hp_errf(err, HP_INVALID,
                           "node %d (%s): local type %s does not match global %s under its "
                           "placements",
                           id, op, hp_type_str(&n->out[0], a, sizeof a),
                           hp_type_str(&local, b, sizeof b));
        }
        return HP_OK;
    }
    bool variadic = hp_op_get(n->op)->n_in == HP_VARIADIC;
    hp_type *in = hp_malloc((size_t)(n->n_in ? n->n_in : 1) * sizeof *in);
    hp_placement *inpl = hp_malloc((size_t)(n->n_in ? n->n_in : 1) * sizeof *inpl);
    hp_shard_rule *rules = hp_malloc(HP_SHARD_MAX_RULES * sizeof *rules);
    hp_status st = in && inpl && rules ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory");
    for (int i = 0; i < nd && st == HP_OK; i++) {
        hp_type out[HP_MAX_OUTS];
        hp_placement outpl[HP_MAX_OUTS];
        bool all_r = true;
        for (int j = 0; j < n->n_in && st == HP_OK; j++) {
            const hp_placement *p = hp_value_placements(g, n->in[j]);
            if (!p) {
                st =
                    hp_errf(err, HP_INVALID, "node %d (%s): input %d has no placements", id, op, j);
                break;
            }
            in[j] = unsplit(g, hp_graph_type(g, n->in[j]), p, i);
            inpl[j] = p[i];
            all_r &= p[i].kind == HP_PLACE_REPLICATE;
        }
        if (st != HP_OK) break;
        for (int k = 0; k < n->n_out; k++) {
            out[k] = unsplit(g, &n->out[k], n->pl + k * nd, i);
            outpl[k] = n->pl[k * nd + i];
            all_r &= outpl[k].kind == HP_PLACE_REPLICATE;
        }
        hp_shard_query q = {.node = n,
                            .in = in,
                            .out = out,
                            .mesh_size = g->mesh.size[i],
                            .mesh_dim = g->mesh.name[i]};
        const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
        bool own = (hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE) && grp && grp->s &&
                   !strcmp(grp->s, g->mesh.name[i]);
        if (all_r && !own) continue;
        if (g->mesh.size[i] == 1) continue; /* a size-1 dim splits nothing */
        int nr = hp_op_get(n->op)->shard(&q, rules, HP_SHARD_MAX_RULES);
        bool ok = false;
        for (int r = 0; r < nr && r < HP_SHARD_MAX_RULES && !ok; r++)
            ok = rule_matches(&rules[r], n, inpl, outpl, variadic);
        if (!ok) {
            char ins[256] = "", outs[128] = "", w[24];
            size_t a = 0, b = 0;
            for (int j = 0; j < n->n_in && j < 8 && a < sizeof ins; j++)
                a += (size_t)snprintf(ins + a, sizeof ins - a, "%s%s", j ? ", " : "",
                                      hp_placement_short(&inpl[j], w, sizeof w));
            for (int k = 0; k < n->n_out && b < sizeof outs; k++)
                b += (size_t)snprintf(outs + b, sizeof outs - b, "%s%s", k ? ", " : "",
                                      hp_placement_short(&outpl[k], w, sizeof w));
            st = hp_errf(err, HP_INVALID,
                         "node %d (%s): on mesh dim %s, (%s) -> (%s) is none of its sharding "
                         "rules",
                         id, op, g->mesh.name[i], ins, outs);
        }
    }
    hp_free(in);
    hp_free(inpl);
    hp_free(rules);
    return st;
}

static hp_status check_placements(const hp_graph *g, hp_err *err) {
    if (g->mesh.ndim == 0) {
        for (int i = 0; i < g->n_nodes; i++) {
            const hp_node *n = &g->nodes[i];
            if (n->pl)
                return hp_errf(err, HP_INVALID, "node %d (%s): placements without a mesh", i,
                               hp_op_get(n->op)->name);
            if (n->op == HP_OP_PLACEHOLDER && hp_node_attr(n, HP_ATTR_GLOBAL_SHAPE) &&
                !hp_node_attr(n, HP_ATTR_GROUP_SIZE))
                return hp_errf(err, HP_INVALID,
                               "node %d (placeholder): a global_shape without group_size needs "
                               "the graph's mesh and placements to say the split",
                               i);
        }
        return HP_OK;
    }
    for (int i = 0; i < g->n_nodes; i++) HP_TRY(check_node_placements(g, i, err));
    return HP_OK;
}

/* Nodes [lo, hi) one at a time; bad: the first that fails (its message in err), or -1. */
typedef struct node_range {
    const hp_graph *g;
    int lo, hi, bad;
    hp_err err;
} node_range;

static void *check_range(void *arg) {
    node_range *r = arg;
    for (int i = r->lo; i < r->hi; i++) {
        const hp_node *n = &r->g->nodes[i];
        hp_type inferred[HP_MAX_OUTS];
        if (hp__check_node(r->g, i, n, inferred, &r->err) != HP_OK) {
            r->bad = i;
            return NULL;
        }
        for (int k = 0; k < n->n_out; k++) {
            if (!hp_type_eq(&inferred[k], &n->out[k])) {
                char a[96], b[96];
                hp_errf(&r->err, HP_INVALID,
                        "node %d (%s): output %d is declared %s but its shape rule gives %s", i,
                        hp_op_get(n->op)->name, k, hp_type_str(&n->out[k], a, sizeof a),
                        hp_type_str(&inferred[k], b, sizeof b));
                r->bad = i;
                return NULL;
            }
        }
    }
    return NULL;
}

/* Each node is checked against its inputs' declared types alone, so large graphs are checked
 * in ranges on up to VERIFY_THREADS threads (the 4096-layer graph's ~740k nodes took ~60 ms on
 * one); the error is the first failing node's, as one thread would report it. */
#define VERIFY_THREADS   4
#define VERIFY_PER_RANGE (1 << 16)

static hp_status check_nodes(const hp_graph *g, hp_err *err) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int t = g->n_nodes / VERIFY_PER_RANGE;
    if (t > VERIFY_THREADS) t = VERIFY_THREADS;
    if (t > cpus) t = (int)cpus;
    if (t < 1) t = 1;
    node_range r[VERIFY_THREADS];
    pthread_t tid[VERIFY_THREADS];
    bool started[VERIFY_THREADS] = {false};
    for (int k = 0; k < t; k++)
        r[k] = (node_range){.g = g,
                            .lo = (int)((int64_t)g->n_nodes * k / t),
                            .hi = (int)((int64_t)g->n_nodes * (k + 1) / t),
                            .bad = -1};
    for (int k = 1; k < t; k++) started[k] = pthread_create(&tid[k], NULL, check_range, &r[k]) == 0;
    for (int k = 0; k < t; k++)
        if (k == 0 || !started[k]) check_range(&r[k]); /* here when no thread could start */
    for (int k = 1; k < t; k++)
        if (started[k]) pthread_join(tid[k], NULL);
    for (int k = 0; k < t; k++)
        if (r[k].bad >= 0) {
            if (err) *err = r[k].err;
            return r[k].err.status;
        }
    return HP_OK;
}

hp_status hp_graph_verify(const hp_graph *g, hp_err *err) {
    if (g->failed) {
        if (err) *err = g->err;
        return g->err.status;
    }
    if (g->n_nodes > HP_MAX_NODES)
        return hp_errf(err, HP_LIMIT, "graph has more than %d nodes", HP_MAX_NODES);
    HP_TRY(check_nodes(g, err));
    HP_TRY(check_placeholders(g, err));
    HP_TRY(check_placements(g, err));
    for (int i = 0; i < g->n_outputs; i++) {
        hp_value v = g->outputs[i];
        if (!hp_graph_type(g, v))
            return hp_errf(err, HP_INVALID, "graph output %d refers to %d.%d, which does not exist",
                           i, v.node, v.out);
    }
    return HP_OK;
}
