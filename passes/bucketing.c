/* passes/bucketing.c — merges runs of small collectives into one collective per bucket of at
 * most job->passes.bucket_bytes (0 disables the pass: it returns a copy of its input).
 *
 * What merges: collectives of the same kind (all_gather_into_tensor, reduce_scatter_tensor,
 * all_reduce), dtype, group, group_size and reduce_op, each consumed only by wait_tensor
 * nodes (never directly, never a graph output):
 *   * all-gathers that sit next to each other in the node list (as overlap issues one FSDP
 *     unit's gathers; only their feeders, spmd's transposes of a stored parameter, between
 *     them) and gather parameters of the same FSDP unit (hp__fsdp_unit_len), no parameter
 *     twice; such a cluster is bucketed one signature at a time (placed: a unit's TP'd weights
 *     and its replicated norms make two buckets);
 *   * reduce-scatters / all-reduces that follow each other in the sequence of collectives
 *     (compute in between is fine, another collective ends the run unless it is on another
 *     mesh dim of a placed graph), as long as no member's
 *     wait comes before the last member: the bucket is issued where its last member was, when
 *     every input exists, and is waited where the first member's wait was.
 * A bucket's size is its unsharded bytes (the gather's output, the scatter's input, the
 * all-reduce's tensor) and stays <= bucket_bytes; a tensor larger than that stays alone.
 * At most HP_MAX_INPUTS members (cat's limit).
 *
 * The rewrite only moves data, so every value is bit-identical to the unbucketed graph's.
 * N = group_size; member i has n_i elements (m_i = n_i / N for a scatter):
 *   all-gather   x_i [s_i, ...] -> view [n_i] -> cat [S] -> all_gather [N*S] -> wait
 *                -> view [N, S] -> slice dim 1 [off_i, off_i + n_i) -> view [N*s_i, ...]
 *   scatter      y_i [N*s_i, ...] -> view [N, m_i] -> cat dim 1 [N, M] -> view [N*M]
 *                -> reduce_scatter [M] -> wait -> slice [off_i, off_i + m_i) -> view [s_i, ...]
 *   all-reduce   z_i -> view [n_i] -> cat [S] -> all_reduce [S] -> wait -> slice -> view back
 * The collective and its input views are placed at the run's last member (every input exists
 * there); the one wait where the first member wait was; each member's slice + view where that
 * member's first wait was (its other waits read the same value).
 * A placed graph (with a mesh) keeps its mesh and every placement, and lays members out in a
 * canonical form whose every step has a sharding rule (see "placed graphs" below).
 */
#include "hp/build.h"
#include "hp/passes.h"
#include "passes/sched_util.h"

#include <string.h>

typedef struct bucket {
    int32_t first, count; /* members[first .. first + count) */
    int32_t anchor;       /* node id where the bucket collective is emitted */
    int64_t elems;        /* S (gathers, all-reduces) or M (scatters) */
    hp_value coll;        /* new graph: the bucket collective */
    hp_value waited;      /* new graph: the waited bucket ([N, S] for gathers, flat else) */
} bucket;

typedef struct bk {
    const hp_graph *g;
    int n;
    hp__users u;
    int32_t *first_wait; /* [n] collectives: id of the first wait reading them, -1 none */
    int32_t *bucket_of;  /* [n] member collectives: their bucket, -1 otherwise */
    int64_t *offset;     /* [n] member collectives: element offset in the bucket */
    int32_t *stamp;      /* [n] inputs already in the open gather run */
    int32_t *members;    /* [n] member ids, bucket after bucket */
    bucket *buckets;     /* [n / 2] */
    int32_t *newid;      /* [n] node id in the output graph; member waits: their value */
    uint8_t *done;       /* [n] gathers already given to a run (gather_cluster) */
    hp_value *ins;       /* [HP_MAX_INPUTS] */
    int n_members, n_buckets;
    bool placed;  /* the graph has a mesh: every new value gets placements */
    hp_status st; /* the first placement failure (err) */
    hp_err err;
} bk;

static void bk_fini(bk *b) {
    hp__users_fini(&b->u);
    hp_free(b->first_wait);
    hp_free(b->bucket_of);
    hp_free(b->offset);
    hp_free(b->stamp);
    hp_free(b->members);
    hp_free(b->buckets);
    hp_free(b->newid);
    hp_free(b->done);
    hp_free(b->ins);
}

static const char *group_of(const hp_node *n) {
    const hp_attr *a = hp_node_attr(n, HP_ATTR_GROUP);
    return a && a->kind == HP_ATTR_KIND_STR ? a->s : "";
}

/* ---- placed graphs ----------------------------------------------------------------------------
 * With a mesh every new value needs placements the sharding rules accept, and a plain flatten
 * of a value another mesh dim splits on a dim other than its leading one has none. So a member
 * x (local type L) is brought to a canonical form [lead?, 1 per other split mesh dim, m]:
 *   split view: dim 0 -> (lead, L0 / lead) for a gather (lead 1: S(0) on the group's dim) or
 *               a scatter (lead N: the group's chunks), each dim d another mesh dim j shards
 *               -> (1, L_d) (the global factor n_j carries S on j);
 *   permute:    the lead, then those factors in mesh order, to the front (a local no-op: only
 *               size-1 dims move);
 *   view:       the remainder merged into m (unsharded, contiguous).
 * Members of one bucket have the same placements in that form (same_signature); they are
 * concatenated on the last dim, the collective acts on dim 0 (gather S(0) -> R, scatter
 * P -> S(0), all-reduce P -> R), and each member is sliced out and walked back (view, inverse
 * permute, view) to the original collective's output type and placements. Every step is one of
 * its op's rules (graph/shard_rules.c: view splits/merges a shard on its leading factor,
 * permute moves it, cat/slice keep shards off their dim, collectives keep other mesh dims' shards
 * off dim 0), so the result verifies. Refused (the member stays alone): a tensor dim split by
 * two mesh dims, a gather or scatter whose dim 0 another mesh dim splits, Partial(max) on another
 * mesh dim (cat sums only). */
typedef struct layout {
    int rank, n_lead;           /* split rank; leading dims of the canonical form */
    int64_t split[HP_MAX_RANK]; /* local split shape */
    int64_t perm[HP_MAX_RANK];  /* canonical dim c is split dim perm[c] */
    hp_placement spl[HP_MESH_MAX_DIMS], cpl[HP_MESH_MAX_DIMS]; /* split / canonical form */
} layout;

static int mesh_dim_of(const hp_graph *g, const char *name) {
    for (int i = 0; i < g->mesh.ndim; i++)
        if (!strcmp(g->mesh.name[i], name)) return i;
    return -1;
}

static bool member_layout(const hp_graph *g, int32_t id, layout *l) {
    const hp_node *n = &g->nodes[id];
    const hp_type *t = hp_graph_type(g, n->in[0]);
    const hp_placement *p = hp_value_placements(g, n->in[0]);
    int nd = g->mesh.ndim, gi = mesh_dim_of(g, group_of(n));
    if (!p || gi < 0 || g->mesh.size[gi] != hp_node_int(n, HP_ATTR_GROUP_SIZE, 0) || t->rank < 1)
        return false;
    bool gather = n->op == HP_OP_ALL_GATHER, lead = n->op != HP_OP_ALL_REDUCE;
    if (gather ? !hp_placement_eq(p[gi], HP_SHARD(0)) : p[gi].kind == HP_PLACE_SHARD) return false;
    int owner[HP_MAX_RANK], fpos[HP_MESH_MAX_DIMS], rem[HP_MAX_RANK], pos = 0, nr = 0;
    for (int k = 0; k < t->rank; k++) owner[k] = -1;
    for (int j = 0; j < nd; j++) {
        fpos[j] = -1;
        if (j == gi) continue;
        if (p[j].kind == HP_PLACE_PARTIAL && p[j].reduce == HP_REDUCE_MAX) return false;
        if (p[j].kind != HP_PLACE_SHARD) continue;
        int d = p[j].dim;
        if (d < 0 || d >= t->rank || owner[d] >= 0 || (lead && d == 0)) return false;
        owner[d] = j;
    }
    for (int k = 0; k < t->rank; k++) {
        if (pos + 2 > HP_MAX_RANK) return false;
        int64_t f = gather ? 1 : g->mesh.size[gi];
        if (k == 0 && lead) {
            if (t->shape[0] % f) return false;
            l->split[pos++] = f;
            l->split[pos] = t->shape[0] / f;
        } else if (owner[k] >= 0) {
            fpos[owner[k]] = pos;
            l->split[pos++] = 1;
            l->split[pos] = t->shape[k];
        } else {
            l->split[pos] = t->shape[k];
        }
        rem[nr++] = pos++;
    }
    l->rank = pos;
    int c = 0;
    if (lead) l->perm[c++] = 0;
    for (int j = 0; j < nd; j++) {
        l->spl[j] = l->cpl[j] = p[j];
        if (fpos[j] < 0) continue;
        l->spl[j] = HP_SHARD(fpos[j]);
        l->cpl[j] = HP_SHARD(c);
        l->perm[c++] = fpos[j];
    }
    l->n_lead = c;
    for (int k = 0; k < nr; k++) l->perm[c++] = rem[k];
    return true;
}

/* pl after the collective of `op` on mesh dim gi. */
static void after(const hp_placement *pl, int nd, hp_op op, int gi, hp_placement *out) {
    for (int j = 0; j < nd; j++) out[j] = pl[j];
    out[gi] = op == HP_OP_REDUCE_SCATTER ? HP_SHARD(0) : HP_REPLICATE;
}

static bool identity(const int64_t *perm, int rank) {
    for (int k = 0; k < rank; k++)
        if (perm[k] != k) return false;
    return true;
}

/* May collective `id` join a bucket at all? */
static bool bucketable(const bk *b, int32_t id) {
    const hp_node *n = &b->g->nodes[id];
    if (n->op != HP_OP_ALL_GATHER && n->op != HP_OP_REDUCE_SCATTER && n->op != HP_OP_ALL_REDUCE)
        return false;
    if (n->n_in != 1 || n->n_out != 1 || b->u.is_output[id] || b->first_wait[id] < 0) return false;
    if (hp_node_int(n, HP_ATTR_GROUP_SIZE, 0) < 1) return false;
    for (int32_t e = b->u.off[id]; e < b->u.off[id + 1]; e++)
        if (b->g->nodes[b->u.user[e]].op != HP_OP_WAIT_TENSOR) return false;
    layout l;
    if (b->placed && (!member_layout(b->g, id, &l) || !b->g->nodes[b->first_wait[id]].pl))
        return false;
    return hp_graph_type(b->g, n->in[0])->rank >= 1;
}

static int64_t coll_bytes(const hp_graph *g, int32_t id) {
    const hp_node *n = &g->nodes[id];
    return n->op == HP_OP_ALL_GATHER ? hp__type_bytes(&n->out[0])
                                     : hp__type_bytes(hp_graph_type(g, n->in[0]));
}

/* Same kind, dtype, group, group_size and reduce_op; placed, the same placements in the
 * canonical form (so never two mesh dims' collectives, nor differently split members). */
static bool same_signature(const hp_graph *g, int32_t a, int32_t b) {
    const hp_node *x = &g->nodes[a], *y = &g->nodes[b];
    if (g->mesh.ndim > 0) {
        layout la, lb;
        if (!member_layout(g, a, &la) || !member_layout(g, b, &lb) || la.n_lead != lb.n_lead)
            return false;
        for (int j = 0; j < g->mesh.ndim; j++)
            if (!hp_placement_eq(la.cpl[j], lb.cpl[j])) return false;
    }
    return x->op == y->op &&
           hp_graph_type(g, x->in[0])->dtype == hp_graph_type(g, y->in[0])->dtype &&
           hp_node_int(x, HP_ATTR_GROUP_SIZE, 0) == hp_node_int(y, HP_ATTR_GROUP_SIZE, 0) &&
           hp_node_int(x, HP_ATTR_REDUCE_OP, -1) == hp_node_int(y, HP_ATTR_REDUCE_OP, -1) &&
           strcmp(group_of(x), group_of(y)) == 0;
}

/* The run being formed. */
typedef struct run {
    int32_t count, last, min_wait;
    int64_t bytes;
} run;

static void close_run(bk *b, run *r) {
    if (r->count >= 2) {
        bucket *bu = &b->buckets[b->n_buckets];
        *bu = (bucket){.first = b->n_members - r->count,
                       .count = r->count,
                       .coll = HP_NO_VALUE,
                       .waited = HP_NO_VALUE};
        const hp_node *an = &b->g->nodes[b->members[bu->first]];
        bu->anchor = r->last; /* every member's input exists there */
        int64_t gs = hp_node_int(an, HP_ATTR_GROUP_SIZE, 1), off = 0;
        for (int k = 0; k < bu->count; k++) {
            int32_t m = b->members[bu->first + k];
            int64_t e = hp_type_numel(hp_graph_type(b->g, b->g->nodes[m].in[0]));
            if (an->op == HP_OP_REDUCE_SCATTER) e /= gs;
            b->bucket_of[m] = b->n_buckets;
            b->offset[m] = off;
            off += e;
        }
        bu->elems = off;
        b->n_buckets++;
    } else {
        b->n_members -= r->count;
    }
    *r = (run){0};
}

/* What a gather gathers, for "no parameter twice": the parameter, or its direct input. */
static int32_t gathered_node(const bk *b, int32_t id) {
    int32_t p = hp__gathered_param(b->g, id);
    return p >= 0 ? p : b->g->nodes[id].in[0].node;
}

/* A data-movement node only feeding parameter gathers (spmd's transpose of a dp:S(k)
 * storage): it may sit between the gathers of one run (overlap issues it with its gather). */
static bool gather_feeder(const bk *b, int32_t i) {
    if (!hp__is_data_movement(b->g->nodes[i].op) || b->u.is_output[i] ||
        b->u.off[i] == b->u.off[i + 1])
        return false;
    for (int32_t e = b->u.off[i]; e < b->u.off[i + 1]; e++) {
        int32_t u = b->u.user[e];
        if (!hp__is_param_gather(b->g, u) && !gather_feeder(b, u)) return false;
    }
    return true;
}

static bool joins(const bk *b, const run *r, int32_t id, int64_t limit) {
    int32_t head = b->members[b->n_members - r->count];
    if (!bucketable(b, id) || !same_signature(b->g, head, id)) return false;
    if (r->bytes + coll_bytes(b->g, id) > limit || r->count >= HP_MAX_INPUTS) return false;
    if (id >= r->min_wait) return false;
    if (b->g->nodes[id].op != HP_OP_ALL_GATHER) return true;
    /* gathers: only feeders (form_buckets) lie between them and the run's last member */
    int32_t x = hp__gathered_param(b->g, head), y = hp__gathered_param(b->g, id);
    bool unit = x >= 0 && y >= 0 ? hp__same_unit(b->g, x, y) : (x >= 0) == (y >= 0);
    return unit && b->stamp[gathered_node(b, id)] != head;
}

static void add_member(bk *b, run *r, int32_t id) {
    if (!r->count) r->min_wait = INT32_MAX;
    b->members[b->n_members++] = id;
    int32_t head = b->members[b->n_members - r->count - 1];
    b->stamp[gathered_node(b, id)] = head;
    r->count++;
    r->last = id;
    r->bytes += coll_bytes(b->g, id);
    if (b->first_wait[id] < r->min_wait) r->min_wait = b->first_wait[id];
}

/* The gathers of the cluster starting at i (gathers and their feeders, nothing else: what
 * overlap issues at one point) bucketed one signature at a time, so that a unit's gathers of
 * different placements (a TP'd weight, a replicated norm) make one bucket per placement instead
 * of a run cut at each change. Returns the end of the cluster. */
static int32_t gather_cluster(bk *b, int32_t i, int64_t limit) {
    int32_t end = i;
    while (end < b->n && (b->g->nodes[end].op == HP_OP_ALL_GATHER || gather_feeder(b, end))) end++;
    for (int32_t h = i; h < end; h++) {
        if (b->done[h] || b->g->nodes[h].op != HP_OP_ALL_GATHER) continue;
        run r = {0};
        b->done[h] = 1;
        if (!bucketable(b, h)) continue;
        add_member(b, &r, h);
        for (int32_t t = h + 1; t < end; t++) {
            if (b->done[t] || b->g->nodes[t].op != HP_OP_ALL_GATHER || !bucketable(b, t) ||
                !same_signature(b->g, h, t))
                continue;
            b->done[t] = 1;
            if (r.count && !joins(b, &r, t, limit)) close_run(b, &r);
            add_member(b, &r, t);
        }
        close_run(b, &r);
    }
    return end;
}

static void form_buckets(bk *b, int64_t limit) {
    run r = {0};
    for (int32_t i = 0; i < b->n; i++) {
        const hp_node *n = &b->g->nodes[i];
        if (n->op == HP_OP_ALL_GATHER) {
            close_run(b, &r);
            i = gather_cluster(b, i, limit) - 1;
        } else if (hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE) {
            if (r.count && joins(b, &r, i, limit)) {
                add_member(b, &r, i);
                continue;
            }
            /* another mesh dim's collective (a TP all-reduce between two gradients' scatters on
             * dp) does not end the run: the bucket only issues later, never before its inputs */
            if (r.count && b->placed && strcmp(group_of(n), group_of(&b->g->nodes[r.last])) &&
                i < r.min_wait)
                continue;
            close_run(b, &r);
            if (bucketable(b, i)) add_member(b, &r, i);
        } else if (r.count && i >= r.min_wait) { /* gathers never get here: gather_cluster */
            close_run(b, &r);
        }
    }
    close_run(b, &r);
}

/* ---- emission -------------------------------------------------------------------------------- */

static hp_value remap(const bk *b, hp_value v) {
    return (hp_value){b->newid[v.node], v.out};
}

static hp_value view_as(hp_graph *o, hp_value x, const hp_type *have, int rank,
                        const int64_t *shape) {
    hp_type want = hp_type_make(have->dtype, rank, shape);
    return hp_type_eq(have, &want) ? x : hp_view(o, x, rank, shape);
}

/* Gives new value v placements pl (placed graphs only; the first failure is kept in b). */
static void put(bk *b, hp_graph *o, hp_value v, const hp_placement *pl) {
    if (!b->placed || !hp_value_ok(v) || hp_graph_failed(o) || b->st != HP_OK) return;
    b->st = hp_node_set_placements(o, v.node, pl, &b->err);
}

/* Placed: each member in the canonical form, the cat on its last dim, the collective. */
static void emit_collective_placed(bk *b, hp_graph *o, bucket *bu) {
    const hp_node *an = &b->g->nodes[bu->anchor];
    int nd = b->g->mesh.ndim, gi = mesh_dim_of(b->g, group_of(an));
    layout l;
    for (int k = 0; k < bu->count; k++) {
        int32_t m = b->members[bu->first + k];
        const hp_type *t = hp_graph_type(b->g, b->g->nodes[m].in[0]);
        HP_ASSERT(member_layout(b->g, m, &l)); /* bucketable */
        hp_value v = remap(b, b->g->nodes[m].in[0]);
        if (l.rank != t->rank) {
            v = hp_view(o, v, l.rank, l.split);
            put(b, o, v, l.spl);
        }
        if (!identity(l.perm, l.rank)) {
            v = hp_permute(o, v, l.rank, l.perm);
            put(b, o, v, l.cpl);
        }
        if (l.rank - l.n_lead != 1) {
            int64_t merged[HP_MAX_RANK], e = 1;
            for (int c = 0; c < l.rank; c++)
                if (c < l.n_lead)
                    merged[c] = l.split[l.perm[c]];
                else
                    e *= l.split[l.perm[c]];
            merged[l.n_lead] = e;
            v = hp_view(o, v, l.n_lead + 1, merged);
            put(b, o, v, l.cpl);
        }
        b->ins[k] = v;
    }
    hp_placement post[HP_MESH_MAX_DIMS];
    after(l.cpl, nd, an->op, gi, post);
    hp_value cat = hp_cat(o, b->ins, bu->count, l.n_lead);
    put(b, o, cat, l.cpl);
    bu->coll = hp_build(o, an->op, &cat, 1, an->attrs, an->n_attrs);
    put(b, o, bu->coll, post);
}

/* Placed: member m sliced out of the waited bucket and walked back to its collective's output
 * type, with its first wait's placements. */
static hp_value emit_member_placed(bk *b, hp_graph *o, const bucket *bu, int32_t m) {
    const hp_node *n = &b->g->nodes[m];
    int nd = b->g->mesh.ndim, gi = mesh_dim_of(b->g, group_of(n));
    int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1);
    layout l;
    HP_ASSERT(member_layout(b->g, m, &l));
    hp_placement cpost[HP_MESH_MAX_DIMS], spost[HP_MESH_MAX_DIMS];
    after(l.cpl, nd, n->op, gi, cpost);
    after(l.spl, nd, n->op, gi, spost);
    int64_t canon[HP_MAX_RANK], split[HP_MAX_RANK], inv[HP_MAX_RANK], e = 1;
    memcpy(split, l.split, sizeof split);
    if (n->op != HP_OP_ALL_REDUCE) split[0] = n->op == HP_OP_ALL_GATHER ? gs : 1;
    for (int c = 0; c < l.rank; c++) {
        canon[c] = split[l.perm[c]];
        inv[l.perm[c]] = c;
        if (c >= l.n_lead) e *= canon[c];
    }
    hp_value v = hp_slice(o, bu->waited, l.n_lead, b->offset[m], b->offset[m] + e, 1);
    put(b, o, v, cpost);
    if (l.rank - l.n_lead != 1) {
        v = hp_view(o, v, l.rank, canon);
        put(b, o, v, cpost);
    }
    if (!identity(l.perm, l.rank)) {
        v = hp_permute(o, v, l.rank, inv);
        put(b, o, v, spost);
    }
    if (l.rank != hp_graph_type(b->g, n->in[0])->rank) {
        v = hp_view(o, v, n->out[0].rank, n->out[0].shape);
        put(b, o, v, b->g->nodes[b->first_wait[m]].pl);
    }
    return v;
}

/* The views feeding the bucket, the cat and the collective, at the anchor. */
static void emit_collective(bk *b, hp_graph *o, bucket *bu) {
    if (b->placed) {
        emit_collective_placed(b, o, bu);
        return;
    }
    const hp_node *an = &b->g->nodes[bu->anchor];
    int64_t gs = hp_node_int(an, HP_ATTR_GROUP_SIZE, 1);
    bool scatter = an->op == HP_OP_REDUCE_SCATTER;
    for (int k = 0; k < bu->count; k++) {
        const hp_node *m = &b->g->nodes[b->members[bu->first + k]];
        const hp_type *t = hp_graph_type(b->g, m->in[0]);
        int64_t e = hp_type_numel(t);
        int64_t shape2[2] = {gs, e / gs};
        b->ins[k] = scatter ? view_as(o, remap(b, m->in[0]), t, 2, shape2)
                            : view_as(o, remap(b, m->in[0]), t, 1, &e);
    }
    hp_value cat = hp_cat(o, b->ins, bu->count, scatter ? 1 : 0);
    if (scatter) {
        int64_t flat = gs * bu->elems;
        cat = hp_view(o, cat, 1, &flat);
    }
    bu->coll = hp_build(o, an->op, &cat, 1, an->attrs, an->n_attrs);
}

/* The bucket's wait, at the first member wait. */
static void emit_wait(hp_graph *o, bk *b, bucket *bu) {
    hp_value w = hp_un(o, HP_OP_WAIT_TENSOR, bu->coll);
    if (b->placed) {
        if (hp_value_ok(bu->coll) && !hp_graph_failed(o))
            put(b, o, w, hp_value_placements(o, bu->coll));
    } else if (b->g->nodes[bu->anchor].op == HP_OP_ALL_GATHER) {
        int64_t shape[2] = {hp_node_int(&b->g->nodes[bu->anchor], HP_ATTR_GROUP_SIZE, 1),
                            bu->elems};
        w = hp_view(o, w, 2, shape);
    }
    bu->waited = w;
}

/* Member m's value (what its wait produced), at its first wait. */
static hp_value emit_member(hp_graph *o, bk *b, const bucket *bu, int32_t m) {
    if (b->placed) return emit_member_placed(b, o, bu, m);
    const hp_node *n = &b->g->nodes[m];
    int64_t off = b->offset[m];
    if (n->op == HP_OP_ALL_GATHER) {
        int64_t e = hp_type_numel(hp_graph_type(b->g, n->in[0]));
        hp_value s = hp_slice(o, bu->waited, 1, off, off + e, 1);
        return hp_view(o, s, n->out[0].rank, n->out[0].shape);
    }
    int64_t e = hp_type_numel(&n->out[0]);
    hp_value s = hp_slice(o, bu->waited, 0, off, off + e, 1);
    hp_type flat = hp_type_make(n->out[0].dtype, 1, &e);
    return view_as(o, s, &flat, n->out[0].rank, n->out[0].shape);
}

static hp_status emit(bk *b, hp_graph *o, hp_err *err) {
    for (int32_t i = 0; i < b->n; i++) {
        const hp_node *n = &b->g->nodes[i];
        int32_t bi = b->bucket_of[i];
        if (bi >= 0) { /* a member collective: only the anchor emits anything */
            if (i == b->buckets[bi].anchor) emit_collective(b, o, &b->buckets[bi]);
            continue;
        }
        int32_t src = n->op == HP_OP_WAIT_TENSOR ? n->in[0].node : -1;
        if (src >= 0 && b->bucket_of[src] >= 0) {
            bucket *bu = &b->buckets[b->bucket_of[src]];
            if (!hp_value_ok(bu->waited)) emit_wait(o, b, bu);
            if (b->first_wait[src] == i)
                b->newid[i] = emit_member(o, b, bu, src).node;
            else
                b->newid[i] = b->newid[b->first_wait[src]];
        } else {
            for (int k = 0; k < n->n_in; k++) b->ins[k] = remap(b, n->in[k]);
            hp_err e;
            int id = hp_graph_append_like(o, b->g, n, b->ins, &e);
            if (id < 0) {
                if (err) *err = e;
                return e.status;
            }
            b->newid[i] = id;
            if (n->pl) put(b, o, (hp_value){id, 0}, n->pl);
        }
        if (hp_graph_failed(o) || b->st != HP_OK) break;
        if (b->newid[i] < 0) return hp_errf(err, HP_INTERNAL, "bucketing: node %d lost", i);
    }
    if (hp_graph_failed(o)) return hp_graph_status(o, err);
    if (b->st != HP_OK) {
        if (err) *err = b->err;
        return b->st;
    }
    for (int i = 0; i < b->g->n_outputs; i++)
        HP_TRY(hp_graph_add_output(o, remap(b, b->g->outputs[i]), err));
    return HP_OK;
}

static hp_status bucketize(const hp_graph *in, int64_t limit, hp_graph **out, hp_err *err) {
    bk b = {.g = in, .n = in->n_nodes};
    size_t n = (size_t)(b.n ? b.n : 1);
    hp_graph *o = NULL;
    hp_status st = hp__users_init(&b.u, in, err);
    if (st != HP_OK) goto done;
    b.first_wait = hp_malloc(n * sizeof *b.first_wait);
    b.bucket_of = hp_malloc(n * sizeof *b.bucket_of);
    b.offset = hp_calloc(n, sizeof *b.offset);
    b.stamp = hp_malloc(n * sizeof *b.stamp);
    b.members = hp_malloc(n * sizeof *b.members);
    b.buckets = hp_calloc(n / 2 + 1, sizeof *b.buckets);
    b.newid = hp_malloc(n * sizeof *b.newid);
    b.done = hp_calloc(n, sizeof *b.done);
    b.ins = hp_malloc(HP_MAX_INPUTS * sizeof *b.ins);
    o = hp_graph_new();
    if (!b.first_wait || !b.bucket_of || !b.offset || !b.stamp || !b.members || !b.buckets ||
        !b.newid || !b.done || !b.ins || !o || hp_graph_reserve(o, b.n, NULL) != HP_OK) {
        st = hp_errf(err, HP_NOMEM, "out of memory bucketing %d nodes", b.n);
        goto done;
    }
    for (int32_t i = 0; i < b.n; i++) {
        b.first_wait[i] = b.bucket_of[i] = b.stamp[i] = b.newid[i] = -1;
        const hp_node *nd = &in->nodes[i];
        if (nd->op == HP_OP_WAIT_TENSOR && nd->n_in == 1 && b.first_wait[nd->in[0].node] < 0)
            b.first_wait[nd->in[0].node] = i;
    }
    b.placed = in->mesh.ndim > 0;
    if ((st = hp__copy_mesh(o, in, err)) != HP_OK) goto done;
    form_buckets(&b, limit);
    st = emit(&b, o, err);
done:
    bk_fini(&b);
    if (st != HP_OK) {
        hp_graph_free(o);
        o = NULL;
    }
    *out = o;
    return st;
}

hp_status hp_pass_bucketing(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    *out = NULL;
    if (!ctx || !ctx->job) return hp_errf(err, HP_INVALID, "bucketing: no job in the pass context");
    int64_t limit = ctx->job->passes.bucket_bytes;
    if (limit > 0) {
        HP_TRY(bucketize(in, limit, out, err));
    } else if (!(*out = hp_graph_clone(in))) {
        return hp_errf(err, HP_NOMEM, "out of memory copying the graph");
    }
    hp__sched_report(ctx->report, in, *out, limit > 0);
    return HP_OK;
}
