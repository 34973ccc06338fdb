/* passes/spmd.c — placement propagation and redistribution: turns a global joint graph and
 * the placements of its placeholders on an N-D mesh into the per-rank (SPMD) graph, every
 * value placed (docs/placements.md).
 *
 * Propagation. Nodes are visited in order. For each mesh dim, in mesh order, a node takes one
 * of its op's sharding rules (graph/shard_rules.c, asked about the pieces the earlier mesh dims
 * left) or all-Replicate: the one whose inputs are cheapest to bring into its placements from
 * the placements they have (bytes a rank moves, a Partial output priced as the reduction it
 * will likely need), rules before all-Replicate on a tie; a node
 * whose inputs are all Replicate on a dim stays Replicate there (nothing is sharded that no
 * input asked for). Its size attributes are localized and the shape rule on the local inputs
 * must give the local types the placements say.
 *
 * Redistribution, per mesh dim on that dim's group: Shard(d) -> Replicate all-gather,
 * Partial -> Replicate all-reduce, Partial -> Shard(d) reduce-scatter (a transpose either side
 * when d is not 0; into compute only where a plan asks for it, as sequence parallelism does,
 * so the greedy choice never takes it), Replicate -> Shard(d) local_chunk (the rank's own chunk,
 * nothing exchanged; priced as a local copy), Shard(a) -> Shard(b) all_to_all_single between
 * views (the piece viewed and permuted to a global [n, n, ...] Shard(0) whose transpose the
 * all-to-all is, then back; priced in propagation as the gather and chunk it replaces, so it
 * goes into compute only where all-Replicate would gather more), each followed by its
 * wait_tensor; one redistribution of a value to a placement serves all its consumers.
 * Replicate -> Partial is not offered yet: a rule that would need it is not taken. An embedding
 * whose weight is consumed Shard(0) on a mesh dim is the vocab-parallel lookup: chunked_embedding
 * with the rank's chunk start (local_chunk of a constant) as base, and the gradient of such a
 * weight chunked_embedding_backward (docs/placements.md). Graph outputs are brought to their
 * targets: the loss to Replicate, each gradient to its parameter's placement.
 *
 * Storage and compute placements (FSDP). A placeholder may be stored Shard on a mesh dim and
 * consumed Replicate there (hp_spmd_opts.compute): its consumers never see the stored value,
 * only a gathered copy, made just before its first forward use (nodes up to the loss) and,
 * with reshard_after_forward, again before its first backward use; forward views of it (t(W),
 * casts) that the backward reads are recomputed on the backward copy, so the forward copy dies
 * with the forward. Propagation sees the gathered copy as it sees any Replicate value and
 * never moves Replicate -> Shard into compute, so the parameter, not an activation, is what is
 * gathered. Such a storage split may be uneven: the rank holds its ceil-sized chunk padded
 * with zeros, the gathered copy is sliced back to the real extent, and the gradient is padded
 * (slice_backward) before the reduce-scatter that brings it to the storage placement.
 *
 * Limits of this version, refused with a message: an uneven split other than a gathered
 * storage one, a tensor dim sharded by two mesh dims being gathered, and an all-to-all of a
 * tensor dim another mesh dim splits (propagation never chooses one).
 */
#include "passes/passes_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct memo {
    hp_value src; /* new value */
    hp_placement tgt[HP_MESH_MAX_DIMS];
    hp_value dst;
} memo;

enum { REGION_FWD = 0, REGION_BWD = 1 };

/* A placeholder stored split on some mesh dim and consumed whole there. */
typedef struct gathered {
    bool on;
    hp_type compute;  /* its local type under its compute placements (even) */
    hp_type padded;   /* what gathering its storage gives before the slice (padding included) */
    hp_value copy[2]; /* the gathered copy for the forward / backward, HP_NO_VALUE: not yet */
} gathered;

/* A vocab-parallel embedding's base (the rank's chunk start) on a mesh dim. */
typedef struct vocab_base_memo {
    int dim;
    int64_t vocab;
    hp_dtype dtype;
    hp_value v;
} vocab_base_memo;

typedef struct spmd {
    const hp_graph *in;
    const hp_graph_mesh *mesh;
    hp__rewrite rw;
    memo *memo;
    int n_memo, cap_memo;
    int collectives;
    const hp_placement *store;   /* [n_ph * nd] normalized storage placements */
    const hp_placement *compute; /* [n_ph * nd] normalized compute placements */
    bool reshard;
    int n_ph;
    int32_t loss;     /* the loss node: nodes up to it are the forward */
    gathered *gath;   /* [n_ph] */
    int32_t *derived; /* [n_nodes]: the gathered placeholder a forward view is of, -1 none */
    hp_value *recomp; /* [n_nodes]: a derived view recomputed for the backward */
    vocab_base_memo bases[8];
    int n_bases;
    const hp_spmd_opts *opts; /* NULL: defaults */
} spmd;

static bool pl_eq_all(const hp_placement *a, const hp_placement *b, int nd) {
    for (int i = 0; i < nd; i++)
        if (!hp_placement_eq(a[i], b[i])) return false;
    return true;
}

static const hp_placement *placed(const spmd *s, hp_value v) {
    return hp_value_placements(s->rw.out, v);
}

/* Appends op on new values and gives its outputs placements pl[n_out * nd]. */
static hp_status emit(spmd *s, hp_op op, const hp_value *in, int n_in, const hp_attr *attrs,
                      int n_attrs, const hp_placement *pl, hp_value *out, hp_err *err) {
    hp_err e = {0};
    hp_value v = hp__rewrite_build(&s->rw, op, in, n_in, attrs, n_attrs, &e);
    if (!hp_value_ok(v)) return hp_errf(err, e.status ? e.status : HP_INTERNAL, "%s", e.msg);
    HP_TRY(hp_node_set_placements(s->rw.out, v.node, pl, err));
    *out = v;
    return HP_OK;
}

/* What one collective costs beyond its bytes, in bytes: its latency times the bandwidth of
 * an intra-node link (5 us x 200 GB/s), so that one all-reduce beats a reduce-scatter plus an
 * all-gather of the same bytes. */
#define COLLECTIVE_BYTES 1e6

/* Bytes a rank moves to take a value of `bytes` local bytes from a to b on a dim of n ranks,
 * plus each collective's latency; INFINITY when no redistribution is offered for it. */
static double move_cost(hp_placement a, hp_placement b, double bytes, int64_t n) {
    if (hp_placement_eq(a, b)) return 0;
    if (b.kind == HP_PLACE_REPLICATE && a.kind == HP_PLACE_SHARD)
        return COLLECTIVE_BYTES + bytes * (double)(n - 1);
    if (b.kind == HP_PLACE_REPLICATE && a.kind == HP_PLACE_PARTIAL)
        return COLLECTIVE_BYTES + 2 * bytes * (double)(n - 1) / (double)n;
    if (b.kind == HP_PLACE_SHARD && a.kind == HP_PLACE_PARTIAL && a.reduce != HP_REDUCE_MAX)
        return COLLECTIVE_BYTES + bytes * (double)(n - 1) / (double)n;
    /* a rank's own chunk: a local copy of its piece, dearer than nothing, cheaper than any
     * exchange */
    if (b.kind == HP_PLACE_SHARD && a.kind == HP_PLACE_REPLICATE) return bytes / (double)n;
    /* all-to-all: a rank keeps one of its n parts and sends the others (bytes (n-1)/n), but it
     * is priced as the gather and local chunk it replaces. Greedy propagation sees no
     * consumer: the value moved to another split is as likely as any to be gathered later (the
     * colwise logits moved to rows for _log_softmax, then gathered for the loss: two
     * collectives where one gather did), so an all-to-all into compute is taken only where the
     * all-Replicate alternative costs more than that gather, e.g. where the other inputs are
     * already split on the new dim. */
    if (b.kind == HP_PLACE_SHARD && a.kind == HP_PLACE_SHARD)
        return COLLECTIVE_BYTES + bytes * (double)(n - 1) + bytes / (double)n;
    return INFINITY;
}

/* Whether Shard(a) -> Shard(b) on mesh dim i is offered for a value placed pl (and, on the
 * mesh dims before i, going to tgt, NULL none): no other mesh dim splits a or b. */
static bool a2a_ok(const spmd *s, const hp_placement *pl, const hp_placement *tgt, int i,
                   hp_placement want) {
    hp_placement have = pl[i];
    if (have.kind != HP_PLACE_SHARD || want.kind != HP_PLACE_SHARD || have.dim == want.dim)
        return true;
    for (int k = 0; k < s->mesh->ndim; k++) {
        if (k == i) continue;
        hp_placement o[2] = {pl[k], tgt && k < i ? tgt[k] : pl[k]};
        for (int j = 0; j < 2; j++)
            if (o[j].kind == HP_PLACE_SHARD && (o[j].dim == have.dim || o[j].dim == want.dim))
                return false;
    }
    return true;
}

/* The placements after swapping tensor dims 0 and d (a transpose). */
static void swap_dims(const hp_placement *a, int nd, int d, hp_placement *out) {
    for (int i = 0; i < nd; i++) {
        out[i] = a[i];
        if (a[i].kind != HP_PLACE_SHARD) continue;
        if (a[i].dim == 0)
            out[i].dim = d;
        else if (a[i].dim == d)
            out[i].dim = 0;
    }
}

/* The placements pl with each Shard(d) moved to Shard(map[d]). */
static void map_dims(const hp_placement *pl, int nd, const int *map, hp_placement *out) {
    for (int k = 0; k < nd; k++) {
        out[k] = pl[k];
        if (pl[k].kind == HP_PLACE_SHARD) out[k].dim = map[pl[k].dim];
    }
}

/* Shard(a) -> Shard(b) on mesh dim i (n ranks): all_to_all_single between views. The rank's
 * piece L is viewed with dim a split into (1, L[a]) and dim b into (n, L[b] / n) (on mesh dim
 * i globally (n, A / n) and (n, B / n), the shard on a's leading factor: the view's rule), then
 * permuted to [a-factor, b-factor, the rest] (globally [n, n, ...], Shard(0)); the all-to-all
 * is the transpose of those two dims (rank r sends its part j to rank j), after which the
 * b-factor is the split one; permuted back with the factors' roles swapped and viewed back,
 * the value is Shard(b). Other mesh dims' Shards (of other dims) and Partials go through every
 * step. */
static hp_status all_to_all(spmd *s, hp_value v, int i, int b, hp_value *out, hp_err *err) {
    const hp_graph_mesh *m = s->mesh;
    int nd = m->ndim;
    int64_t n = m->size[i];
    hp_placement cur[HP_MESH_MAX_DIMS], t[HP_MESH_MAX_DIMS];
    memcpy(cur, placed(s, v), sizeof(hp_placement) * (size_t)nd);
    int a = cur[i].dim;
    hp_type L = *hp_graph_type(s->rw.out, v);
    if (!a2a_ok(s, cur, NULL, i, HP_SHARD(b)))
        return hp_errf(err, HP_UNSUPPORTED,
                       "Shard(%d) -> Shard(%d) on mesh dim %s while another mesh dim splits one "
                       "of those tensor dims is not supported yet",
                       a, b, m->name[i]);
    if (L.rank + 2 > HP_MAX_RANK || a >= L.rank || b >= L.rank)
        return hp_errf(err, HP_UNSUPPORTED, "Shard(%d) -> Shard(%d) of a rank-%d value", a, b,
                       L.rank);
    if (L.shape[b] % n)
        return hp_errf(err, HP_UNSUPPORTED,
                       "Shard(%d) -> Shard(%d) on mesh dim %s: dim %d (%lld) does not split "
                       "evenly over %lld ranks",
                       a, b, m->name[i], b, (long long)L.shape[b], (long long)n);
    /* the split view: pos[d] where L's dim d (or its leading factor) lands, orig its inverse */
    int64_t sp[HP_MAX_RANK];
    int pos[HP_MAX_RANK] = {0}, orig[HP_MAX_RANK] = {0}, r2 = 0;
    for (int d = 0; d < L.rank; d++) {
        pos[d] = r2;
        orig[r2] = d;
        if (d == a || d == b) {
            sp[r2++] = d == a ? 1 : n;
            orig[r2] = d;
            sp[r2++] = d == a ? L.shape[a] : L.shape[b] / n;
        } else {
            sp[r2++] = L.shape[d];
        }
    }
    int ja = pos[a], jb = pos[b];
    /* perm: [ja, jb, the rest]; back: position jb <- W's dim 0, ja <- dim 1, the rest home */
    int64_t perm[HP_MAX_RANK], back[HP_MAX_RANK];
    int inv[HP_MAX_RANK] = {0}, inv_back[HP_MAX_RANK] = {0};
    perm[0] = ja;
    perm[1] = jb;
    for (int d = 0, j = 2; d < r2; d++)
        if (d != ja && d != jb) perm[j++] = d;
    for (int j = 0; j < r2; j++) inv[perm[j]] = j;
    back[jb] = 0;
    back[ja] = 1;
    for (int j = 2; j < r2; j++) back[perm[j]] = j;
    for (int j = 0; j < r2; j++) inv_back[back[j]] = j;

    hp_value x = v;
    hp_attr va = hp_attr_ints(HP_ATTR_SHAPE, r2, sp);
    map_dims(cur, nd, pos, t);
    HP_TRY(emit(s, HP_OP_VIEW, &x, 1, &va, 1, t, &x, err));
    memcpy(cur, t, sizeof t);
    hp_attr pa = hp_attr_ints(HP_ATTR_PERM, r2, perm);
    map_dims(cur, nd, inv, t);
    HP_TRY(emit(s, HP_OP_PERMUTE, &x, 1, &pa, 1, t, &x, err));
    memcpy(cur, t, sizeof t);
    hp_attr ca[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, n), hp_attr_str(HP_ATTR_GROUP, m->name[i])};
    HP_TRY(emit(s, HP_OP_ALL_TO_ALL, &x, 1, ca, 2, cur, &x, err));
    HP_TRY(emit(s, HP_OP_WAIT_TENSOR, &x, 1, NULL, 0, cur, &x, err));
    s->collectives++;
    hp_attr ba = hp_attr_ints(HP_ATTR_PERM, r2, back);
    map_dims(cur, nd, inv_back, t);
    HP_TRY(emit(s, HP_OP_PERMUTE, &x, 1, &ba, 1, t, &x, err));
    memcpy(cur, t, sizeof t);
    hp_type o = L;
    o.shape[a] *= n;
    o.shape[b] /= n;
    hp_attr oa = hp_attr_ints(HP_ATTR_SHAPE, o.rank, o.shape);
    map_dims(cur, nd, orig, t);
    return emit(s, HP_OP_VIEW, &x, 1, &oa, 1, t, out, err);
}

/* One step on mesh dim i: v (placements cur) to `want` there. */
static hp_status step(spmd *s, hp_value v, int i, hp_placement want, hp_value *out, hp_err *err) {
    const hp_graph_mesh *m = s->mesh;
    int nd = m->ndim;
    hp_placement cur[HP_MESH_MAX_DIMS], t[HP_MESH_MAX_DIMS];
    memcpy(cur, placed(s, v), sizeof(hp_placement) * (size_t)nd);
    hp_placement have = cur[i];
    bool gather = have.kind == HP_PLACE_SHARD && want.kind == HP_PLACE_REPLICATE;
    bool reduce = have.kind == HP_PLACE_PARTIAL && want.kind == HP_PLACE_REPLICATE;
    bool scatter = have.kind == HP_PLACE_PARTIAL && want.kind == HP_PLACE_SHARD;
    /* Replicate -> Shard: every rank holds the whole value and keeps its own chunk
     * (local_chunk: the rank's coordinate, known where collectives run; nothing exchanged) */
    if (have.kind == HP_PLACE_REPLICATE && want.kind == HP_PLACE_SHARD) {
        hp_attr la[3] = {hp_attr_int(HP_ATTR_DIM, want.dim),
                         hp_attr_int(HP_ATTR_GROUP_SIZE, m->size[i]),
                         hp_attr_str(HP_ATTR_GROUP, m->name[i])};
        cur[i] = want;
        HP_TRY(emit(s, HP_OP_LOCAL_CHUNK, &v, 1, la, 3, cur, out, err));
        return emit(s, HP_OP_WAIT_TENSOR, out, 1, NULL, 0, cur, out, err);
    }
    if (have.kind == HP_PLACE_SHARD && want.kind == HP_PLACE_SHARD)
        return all_to_all(s, v, i, want.dim, out, err);
    char a[24], b[24];
    if (!gather && !reduce && !scatter)
        return hp_errf(err, HP_UNSUPPORTED, "no redistribution %s -> %s on mesh dim %s yet",
                       hp_placement_short(&have, a, sizeof a),
                       hp_placement_short(&want, b, sizeof b), m->name[i]);
    int d = gather ? have.dim : scatter ? want.dim : 0;
    for (int k = 0; k < nd; k++)
        if (gather && k != i && cur[k].kind == HP_PLACE_SHARD && cur[k].dim == d)
            return hp_errf(err, HP_UNSUPPORTED,
                           "tensor dim %d is split by mesh dims %s and %s; gathering one "
                           "of them is not supported yet",
                           d, m->name[k], m->name[i]);
    hp_value x = v;
    if (d != 0) {
        hp_attr ta[2] = {hp_attr_int(HP_ATTR_DIM0, 0), hp_attr_int(HP_ATTR_DIM1, d)};
        swap_dims(cur, nd, d, t);
        HP_TRY(emit(s, HP_OP_TRANSPOSE, &x, 1, ta, 2, t, &x, err));
        memcpy(cur, t, sizeof t);
    }
    hp_attr ca[3] = {hp_attr_int(HP_ATTR_GROUP_SIZE, m->size[i]),
                     hp_attr_str(HP_ATTR_GROUP, m->name[i]),
                     hp_attr_int(HP_ATTR_REDUCE_OP, have.reduce)};
    hp_op op = gather ? HP_OP_ALL_GATHER : reduce ? HP_OP_ALL_REDUCE : HP_OP_REDUCE_SCATTER;
    cur[i] = gather || reduce ? HP_REPLICATE : HP_SHARD(0);
    HP_TRY(emit(s, op, &x, 1, ca, gather ? 2 : 3, cur, &x, err));
    HP_TRY(emit(s, HP_OP_WAIT_TENSOR, &x, 1, NULL, 0, cur, &x, err));
    s->collectives++;
    if (d != 0) {
        hp_attr ta[2] = {hp_attr_int(HP_ATTR_DIM0, 0), hp_attr_int(HP_ATTR_DIM1, d)};
        swap_dims(cur, nd, d, t);
        HP_TRY(emit(s, HP_OP_TRANSPOSE, &x, 1, ta, 2, t, &x, err));
    }
    *out = x;
    return HP_OK;
}

/* v brought to placements tgt, one step per mesh dim, last to first (an inner split is undone
 * before an outer one). */
static hp_status walk(spmd *s, hp_value v, const hp_placement *tgt, hp_value *out, hp_err *err) {
    hp_value x = v;
    for (int i = s->mesh->ndim - 1; i >= 0; i--)
        if (!hp_placement_eq(placed(s, x)[i], tgt[i])) HP_TRY(step(s, x, i, tgt[i], &x, err));
    *out = x;
    return HP_OK;
}

/* v brought to placements tgt (memoized: one redistribution serves every consumer). */
static hp_status redistribute(spmd *s, hp_value v, const hp_placement *tgt, hp_value *out,
                              hp_err *err) {
    int nd = s->mesh->ndim;
    if (pl_eq_all(placed(s, v), tgt, nd)) {
        *out = v;
        return HP_OK;
    }
    for (int k = 0; k < s->n_memo; k++) {
        const memo *e = &s->memo[k];
        if (e->src.node == v.node && e->src.out == v.out && pl_eq_all(e->tgt, tgt, nd)) {
            *out = e->dst;
            return HP_OK;
        }
    }
    hp_value x = v;
    HP_TRY(walk(s, v, tgt, &x, err));
    if (s->n_memo == s->cap_memo) {
        int cap = s->cap_memo ? 2 * s->cap_memo : 64;
        memo *m = hp_realloc(s->memo, (size_t)cap * sizeof *m);
        if (!m) return hp_errf(err, HP_NOMEM, "spmd: out of memory");
        s->memo = m;
        s->cap_memo = cap;
    }
    memo *e = &s->memo[s->n_memo++];
    e->src = v;
    memcpy(e->tgt, tgt, sizeof(hp_placement) * (size_t)nd);
    e->dst = x;
    *out = x;
    return HP_OK;
}

/* ---- gathered placeholders (storage split, consumed whole) ---------------------------------- */

/* Cheap one-input ops on a parameter (views and casts) that the backward recomputes on its
 * re-gathered copy instead of keeping the forward's alive (passes/fsdp.c's list). */
static bool is_param_view(hp_op op) {
    switch (op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE:
    case HP_OP_PERMUTE:
    case HP_OP_TRANSPOSE:
    case HP_OP_T:
    case HP_OP_EXPAND:
    case HP_OP_SLICE:
    case HP_OP_UNSQUEEZE:
    case HP_OP_SQUEEZE:
    case HP_OP_TO_COPY:
        return true;
    default:
        return false;
    }
}

/* The gathered placeholder value v is (or is a forward view of), -1 none. */
static int32_t gathered_of(const spmd *s, hp_value v) {
    if (v.node < s->n_ph) return s->gath[v.node].on ? v.node : -1;
    return v.out == 0 ? s->derived[v.node] : -1;
}

/* The copy of gathered placeholder p for `region`, made on first need (just before the node
 * that reads it): each storage split gathered, then the padding sliced off. */
static hp_status gather_copy(spmd *s, int32_t p, int region, hp_value *out, hp_err *err) {
    gathered *g = &s->gath[p];
    if (hp_value_ok(g->copy[region])) {
        *out = g->copy[region];
        return HP_OK;
    }
    int nd = s->mesh->ndim;
    hp_value x = hp__rewrite_get(&s->rw, (hp_value){p, 0});
    HP_TRY(walk(s, x, s->compute + (size_t)p * (size_t)nd, &x, err));
    for (int d = 0; d < g->compute.rank; d++) {
        if (hp_graph_type(s->rw.out, x)->shape[d] == g->compute.shape[d]) continue;
        hp_attr a[3] = {hp_attr_int(HP_ATTR_DIM, d), hp_attr_int(HP_ATTR_START, 0),
                        hp_attr_int(HP_ATTR_END, g->compute.shape[d])};
        hp_placement pl[HP_MESH_MAX_DIMS];
        memcpy(pl, placed(s, x), sizeof(hp_placement) * (size_t)nd);
        HP_TRY(emit(s, HP_OP_SLICE, &x, 1, a, 3, pl, &x, err));
    }
    g->copy[region] = *out = x;
    return HP_OK;
}

/* The backward's copy of forward view u of gathered placeholder p: the chain of views from p
 * to u emitted again on the backward copy, each with the placements and localized attributes
 * its forward emission got. */
static hp_status recompute(spmd *s, int32_t u, int32_t p, hp_value *out, hp_err *err) {
    if (hp_value_ok(s->recomp[u])) {
        *out = s->recomp[u];
        return HP_OK;
    }
    int nd = s->mesh->ndim;
    hp_value src = s->in->nodes[u].in[0], b;
    if (src.node == p)
        HP_TRY(gather_copy(s, p, REGION_BWD, &b, err));
    else
        HP_TRY(recompute(s, src.node, p, &b, err));
    /* the forward emission is the template; copied out, as emitting grows the node array */
    const hp_node *t = &s->rw.out->nodes[hp__rewrite_get(&s->rw, (hp_value){u, 0}).node];
    hp_op op = t->op;
    int na = t->n_attrs;
    hp_attr attrs[HP_ATTR_COUNT];
    hp_placement in_pl[HP_MESH_MAX_DIMS], pl[HP_MESH_MAX_DIMS];
    if (na) memcpy(attrs, t->attrs, sizeof(hp_attr) * (size_t)na);
    memcpy(pl, t->pl, sizeof(hp_placement) * (size_t)nd);
    memcpy(in_pl, placed(s, t->in[0]), sizeof(hp_placement) * (size_t)nd);
    HP_TRY(redistribute(s, b, in_pl, &b, err));
    HP_TRY(emit(s, op, &b, 1, attrs, na, pl, &s->recomp[u], err));
    *out = s->recomp[u];
    return HP_OK;
}

/* What node id reads for input value v: a gathered placeholder's copy for id's region, and in
 * the backward (with reshard_after_forward) a forward view of one recomputed on the backward
 * copy; anything else its rewritten value. */
static hp_status use(spmd *s, int id, hp_value v, hp_value *out, hp_err *err) {
    int32_t p = gathered_of(s, v);
    int region = s->reshard && id > s->loss ? REGION_BWD : REGION_FWD;
    if (p >= 0 && v.node == p) return gather_copy(s, p, region, out, err);
    if (p >= 0 && region == REGION_BWD) return recompute(s, v.node, p, out, err);
    *out = hp__rewrite_get(&s->rw, v);
    return HP_OK;
}

/* The forward views of gathered placeholders, and the checks on their placements: on each
 * mesh dim compute equals storage, or storage is Shard and compute Replicate (gathered); the
 * compute split is even. */
static hp_status plan_gathers(spmd *s, hp_err *err) {
    const hp_graph *in = s->in;
    int nd = s->mesh->ndim;
    for (int p = 0; p < s->n_ph; p++) {
        const hp_node *n = &in->nodes[p];
        const hp_placement *st = s->store + (size_t)p * (size_t)nd;
        const hp_placement *cp = s->compute + (size_t)p * (size_t)nd;
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        const char *name = fqn && fqn->s ? fqn->s : "?";
        gathered *g = &s->gath[p];
        g->copy[0] = g->copy[1] = HP_NO_VALUE;
        hp_type padded = n->out[0];
        for (int i = 0; i < nd; i++) {
            if (hp_placement_eq(st[i], cp[i])) continue;
            char a[24], b[24];
            if (st[i].kind != HP_PLACE_SHARD || cp[i].kind != HP_PLACE_REPLICATE)
                return hp_errf(err, HP_INVALID,
                               "'%s': stored %s but computed %s on mesh dim %s; a placeholder is "
                               "computed in its storage placement or gathered (Shard stored, "
                               "Replicate computed)",
                               name, hp_placement_short(&st[i], a, sizeof a),
                               hp_placement_short(&cp[i], b, sizeof b), s->mesh->name[i]);
            int d = st[i].dim;
            for (int k = 0; k < nd; k++)
                if (k != i && st[k].kind == HP_PLACE_SHARD && st[k].dim == d)
                    return hp_errf(err, HP_UNSUPPORTED,
                                   "'%s': tensor dim %d is stored split by mesh dims %s and %s; "
                                   "gathering one of them is not supported yet (store the "
                                   "gathered split on another dim)",
                                   name, d, s->mesh->name[k], s->mesh->name[i]);
            if (d < padded.rank) {
                int64_t m = s->mesh->size[i];
                padded.shape[d] = (padded.shape[d] + m - 1) / m * m;
            }
            g->on = true;
        }
        if (!g->on) continue;
        hp_err e;
        if (hp_local_type(&n->out[0], cp, s->mesh->size, nd, true, &g->compute, &e) != HP_OK ||
            hp_local_type(&padded, cp, s->mesh->size, nd, true, &g->padded, &e) != HP_OK)
            return hp_errf(err, HP_UNSUPPORTED, "'%s': computed: %s", name, e.msg);
    }
    for (int i = 0; i < in->n_nodes; i++) {
        s->derived[i] = -1;
        s->recomp[i] = HP_NO_VALUE;
        const hp_node *n = &in->nodes[i];
        if (i >= s->n_ph && i <= s->loss && n->n_in == 1 && is_param_view(n->op))
            s->derived[i] = gathered_of(s, n->in[0]);
    }
    return HP_OK;
}

/* Graph output k, the gradient of gathered placeholder p, to p's storage: on the gathered
 * dims it keeps a Partial (or Replicate) it has, elsewhere it takes the compute placements;
 * padded where the storage is (zeros past the real extent), then reduce-scattered. */
static hp_status grad_to_storage(spmd *s, int32_t p, hp_value v, hp_value *out, hp_err *err) {
    int nd = s->mesh->ndim;
    const gathered *g = &s->gath[p];
    const hp_placement *st = s->store + (size_t)p * (size_t)nd;
    const hp_placement *cp = s->compute + (size_t)p * (size_t)nd;
    hp_placement pre[HP_MESH_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        hp_placement have = placed(s, v)[i];
        pre[i] = cp[i];
        if (!hp_placement_eq(st[i], cp[i]) && have.kind == HP_PLACE_PARTIAL &&
            have.reduce != HP_REDUCE_MAX)
            pre[i] = have;
    }
    HP_TRY(redistribute(s, v, pre, &v, err));
    hp_type cur = *hp_graph_type(s->rw.out, v);
    for (int d = 0; d < cur.rank; d++) {
        if (cur.shape[d] == g->padded.shape[d]) continue;
        int64_t end = cur.shape[d]; /* the real extent; zeros up to the padded one */
        cur.shape[d] = g->padded.shape[d];
        hp_attr a[4] = {hp_attr_ints(HP_ATTR_SHAPE, cur.rank, cur.shape),
                        hp_attr_int(HP_ATTR_DIM, d), hp_attr_int(HP_ATTR_START, 0),
                        hp_attr_int(HP_ATTR_END, end)};
        HP_TRY(emit(s, HP_OP_SLICE_BACKWARD, &v, 1, a, 4, pre, &v, err));
    }
    return redistribute(s, v, st, out, err);
}

/* ---- propagation ---------------------------------------------------------------------------- */

/* t split by placements pl on mesh dims [0, upto). */
static hp_type split_upto(const spmd *s, const hp_type *t, const hp_placement *pl, int upto) {
    hp_type r = *t;
    for (int i = 0; i < upto; i++)
        if (pl[i].kind == HP_PLACE_SHARD && pl[i].dim < r.rank)
            r.shape[pl[i].dim] /= s->mesh->size[i];
    return r;
}

static double local_bytes(const spmd *s, hp_value v) {
    const hp_type *t = hp_graph_type(s->rw.out, v);
    return (double)hp_type_numel(t) * (double)hp_dtype_size(t->dtype);
}

/* Chooses, mesh dim by mesh dim, the placements node id's inputs must have (tgt[j * nd + i])
 * and its outputs get (opl[k * nd + i]). */
static hp_status choose(spmd *s, int id, const hp_node *n, const hp_type *gin, const hp_value *ins,
                        hp_placement *tgt, hp_placement *opl, hp_err *err) {
    const hp_op_info *info = hp_op_get(n->op);
    int nd = s->mesh->ndim, ni = n->n_in;
    bool variadic = info->n_in == HP_VARIADIC;
    hp_type *it = hp_malloc((size_t)(ni ? ni : 1) * sizeof *it);
    hp_shard_rule *rules = hp_malloc((HP_SHARD_MAX_RULES + 1) * sizeof *rules);
    if (!it || !rules) {
        hp_free(it);
        hp_free(rules);
        return hp_errf(err, HP_NOMEM, "spmd: out of memory");
    }
    hp_status st = HP_OK;
    for (int i = 0; i < nd && st == HP_OK; i++) {
        bool all_r = true;
        for (int j = 0; j < ni; j++) {
            it[j] = split_upto(s, &gin[j], tgt + j * nd, i);
            all_r &= placed(s, ins[j])[i].kind == HP_PLACE_REPLICATE;
        }
        hp_type ot[HP_MAX_OUTS];
        for (int k = 0; k < n->n_out; k++) ot[k] = split_upto(s, &n->out[k], opl + k * nd, i);
        double later = 1; /* the most any input is split by the mesh dims after i */
        for (int j = 0; j < ni; j++) {
            double f = 1;
            for (int k = i + 1; k < nd; k++)
                if (placed(s, ins[j])[k].kind == HP_PLACE_SHARD) f *= (double)s->mesh->size[k];
            if (f > later) later = f;
        }
        int nr = 0;
        if (!all_r && s->mesh->size[i] > 1) {
            hp_shard_query q = {.node = n,
                                .in = it,
                                .out = ot,
                                .mesh_size = s->mesh->size[i],
                                .mesh_dim = s->mesh->name[i]};
            nr = info->shard(&q, rules, HP_SHARD_MAX_RULES);
            if (nr > HP_SHARD_MAX_RULES) nr = HP_SHARD_MAX_RULES;
        }
        rules[nr++] = (hp_shard_rule){0}; /* all Replicate, last: rules win ties */
        double best = INFINITY;
        int pick = nr - 1;
        for (int r = 0; r < nr; r++) {
            double c = 0;
            for (int j = 0; j < ni && c < best; j++) {
                hp_placement want =
                    variadic || j >= HP_SHARD_MAX_IN ? rules[r].in[0] : rules[r].in[j];
                hp_placement have = placed(s, ins[j])[i];
                /* no reduce-scatter into compute: that is sequence parallelism, a plan's
                 * choice, not a greedy one (graph outputs still scatter to their targets) */
                if (have.kind == HP_PLACE_PARTIAL && want.kind == HP_PLACE_SHARD)
                    c = INFINITY;
                else if (!a2a_ok(s, placed(s, ins[j]), tgt + j * nd, i, want))
                    c = INFINITY; /* an all-to-all of a dim another mesh dim splits */
                else
                    c += move_cost(have, want, local_bytes(s, ins[j]), s->mesh->size[i]);
            }
            /* a Partial output is priced as if reduced: most consumers need it whole, and a
             * deferred reduction must not look free next to reducing the input now; priced
             * at its rank's piece, the later mesh dims splitting it as they split the inputs
             * (inputs are priced at their pieces) */
            for (int k = 0; k < n->n_out && c < best; k++)
                if (rules[r].out[k].kind == HP_PLACE_PARTIAL)
                    c += move_cost(rules[r].out[k], HP_REPLICATE,
                                   (double)hp_type_numel(&ot[k]) *
                                       (double)hp_dtype_size(ot[k].dtype) / later,
                                   s->mesh->size[i]);
            if (c < best) {
                best = c;
                pick = r;
            }
        }
        if (!isfinite(best))
            st = hp_errf(err, HP_UNSUPPORTED,
                         "node %d (%s): no placement its inputs can be redistributed to on "
                         "mesh dim %s",
                         id, info->name, s->mesh->name[i]);
        for (int j = 0; j < ni; j++)
            tgt[j * nd + i] =
                variadic || j >= HP_SHARD_MAX_IN ? rules[pick].in[0] : rules[pick].in[j];
        for (int k = 0; k < n->n_out; k++) opl[k * nd + i] = rules[pick].out[k];
    }
    hp_free(it);
    hp_free(rules);
    return st;
}

/* ---- the vocab-parallel embedding ---------------------------------------------------------- */

/* The mesh dim an embedding (weight ins[0]) or the gradient of its weight is vocab-parallel on:
 * where the weight is consumed Shard(0) (for the backward: the graph output it makes is the
 * gradient of a parameter computed Shard(0) there, num_weights its vocabulary); -1 none. */
static int vocab_dim(const spmd *s, int id, const hp_value *ins) {
    const hp_node *n = &s->in->nodes[id];
    int nd = s->mesh->ndim;
    const hp_placement *pl = NULL;
    if (n->op == HP_OP_EMBEDDING) {
        pl = placed(s, ins[0]);
    } else if (n->op == HP_OP_EMBEDDING_DENSE_BACKWARD &&
               hp_node_int(n, HP_ATTR_PADDING_IDX, -1) < 0) {
        hp_graph_inputs gi = hp_graph_count_inputs(s->in);
        for (int k = 1; k <= gi.n_params && k < s->in->n_outputs && !pl; k++)
            if (s->in->outputs[k].node == id &&
                s->in->nodes[k - 1].out[0].shape[0] == hp_node_int(n, HP_ATTR_NUM_WEIGHTS, 0))
                pl = s->compute + (size_t)(k - 1) * (size_t)nd;
    }
    for (int i = 0; pl && i < nd; i++)
        if (s->mesh->size[i] > 1 && hp_placement_eq(pl[i], HP_SHARD(0))) return i;
    return -1;
}

/* base on mesh dim i: the rank's chunk start, [1] of its chunk of (0, R, 2R, ...) with
 * R = vocab / n (full and cat, Replicate; then local_chunk), memoized. */
static hp_status vocab_base(spmd *s, int i, int64_t vocab, hp_dtype dt, hp_value *out,
                            hp_err *err) {
    for (int k = 0; k < s->n_bases; k++)
        if (s->bases[k].dim == i && s->bases[k].vocab == vocab && s->bases[k].dtype == dt) {
            *out = s->bases[k].v;
            return HP_OK;
        }
    int nd = s->mesh->ndim;
    int64_t n = s->mesh->size[i];
    if (vocab % n)
        return hp_errf(err, HP_UNSUPPORTED,
                       "a vocab-parallel embedding of %lld rows over %lld ranks of mesh dim %s: "
                       "the vocabulary must split evenly",
                       (long long)vocab, (long long)n, s->mesh->name[i]);
    if (s->n_bases == (int)HP_ARRAY_LEN(s->bases))
        return hp_errf(err, HP_UNSUPPORTED, "more than %d vocab-parallel embeddings",
                       (int)HP_ARRAY_LEN(s->bases));
    hp_placement pl[HP_MESH_MAX_DIMS];
    for (int k = 0; k < nd; k++) pl[k] = HP_REPLICATE;
    hp_value starts[HP_MAX_RANK * 16];
    if (n > (int64_t)HP_ARRAY_LEN(starts))
        return hp_errf(err, HP_UNSUPPORTED, "a vocab-parallel embedding over %lld ranks",
                       (long long)n);
    int64_t one = 1;
    for (int64_t c = 0; c < n; c++) {
        hp_attr fa[3] = {hp_attr_ints(HP_ATTR_SHAPE, 1, &one),
                         hp_attr_float(HP_ATTR_VALUE, (double)(c * (vocab / n))),
                         hp_attr_dtype(HP_ATTR_DTYPE, dt)};
        HP_TRY(emit(s, HP_OP_FULL, NULL, 0, fa, 3, pl, &starts[c], err));
    }
    hp_value b;
    hp_attr ca = hp_attr_int(HP_ATTR_DIM, 0);
    HP_TRY(emit(s, HP_OP_CAT, starts, (int)n, &ca, 1, pl, &b, err));
    HP_TRY(step(s, b, i, HP_SHARD(0), &b, err));
    s->bases[s->n_bases++] = (vocab_base_memo){.dim = i, .vocab = vocab, .dtype = dt, .v = b};
    *out = b;
    return HP_OK;
}

/* A compute node: redistribute its inputs, append it with localized attributes, check the
 * shape rule gives the local types its placements say. An embedding whose weight is split
 * Shard(0) (and the gradient of that weight) becomes chunked_embedding(_backward) with the
 * rank's chunk start as base: the masked local lookup, a Partial sum (the gradient of its own
 * rows, Shard(0)). */
static hp_status place_node(spmd *s, int id, hp_err *err) {
    const hp_node *n = &s->in->nodes[id];
    const char *op = hp_op_get(n->op)->name;
    int nd = s->mesh->ndim, ni = n->n_in;
    hp_value *ins = hp_malloc((size_t)(ni + 1) * sizeof *ins);
    hp_type *gin = hp_malloc((size_t)(ni + 1) * sizeof *gin);
    hp_placement *tgt = hp_malloc((size_t)(ni + 3) * HP_MESH_MAX_DIMS * sizeof *tgt);
    hp_placement opl[HP_MAX_OUTS * HP_MESH_MAX_DIMS];
    hp_attr attrs[HP_ATTR_COUNT];
    hp_status st = ins && tgt && gin ? HP_OK : hp_errf(err, HP_NOMEM, "spmd: out of memory");
    for (int j = 0; j < ni && st == HP_OK; j++) {
        st = use(s, id, n->in[j], &ins[j], err);
        gin[j] = *hp_graph_type(s->in, n->in[j]);
    }
    hp_node chunked;
    hp_attr nw;
    bool given = s->opts && s->opts->choose;
    int vd = -1;
    if (st == HP_OK && given) {
        st = s->opts->choose(s->opts->choose_ctx, id, tgt, opl, &vd, err);
        if (st != HP_OK) hp_err_prefix(err, "node %d (%s)", id, op);
    } else if (st == HP_OK) {
        vd = vocab_dim(s, id, ins);
    }
    if (vd >= 0) {
        bool fwd = n->op == HP_OP_EMBEDDING;
        int64_t vocab = fwd ? gin[0].shape[0] : hp_node_int(n, HP_ATTR_NUM_WEIGHTS, 0);
        st = vocab_base(s, vd, vocab, gin[1].dtype, &ins[2], err);
        gin[2] = hp_type_make(gin[1].dtype, 1, (int64_t[]){s->mesh->size[vd]});
        chunked = *n;
        chunked.op = fwd ? HP_OP_CHUNKED_EMBEDDING : HP_OP_CHUNKED_EMBEDDING_BACKWARD;
        chunked.n_in = ni = 3;
        nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, vocab);
        chunked.n_attrs = fwd ? 0 : 1; /* padding_idx only ever mattered to the gradient */
        chunked.attrs = &nw;
        n = &chunked;
        if (st != HP_OK) hp_err_prefix(err, "node %d (%s)", id, op);
    }
    if (st == HP_OK && !given) st = choose(s, id, n, gin, ins, tgt, opl, err);
    for (int j = 0; j < ni && st == HP_OK; j++)
        if ((st = redistribute(s, ins[j], tgt + j * nd, &ins[j], err)) != HP_OK)
            hp_err_prefix(err, "node %d (%s): input %d", id, op, j);
    hp_type local[HP_MAX_OUTS];
    for (int k = 0; k < n->n_out && st == HP_OK; k++) {
        hp_err e;
        if (hp_local_type(&n->out[k], opl + k * nd, s->mesh->size, nd, true, &local[k], &e) !=
            HP_OK)
            st = hp_errf(err, HP_INTERNAL, "node %d (%s): output %d: %s", id, op, k, e.msg);
    }
    hp_value v = HP_NO_VALUE;
    if (st == HP_OK) {
        hp_localize_attrs(n, local, attrs);
        st = emit(s, n->op, ins, ni, attrs, n->n_attrs, opl, &v, err);
    }
    for (int k = 0; k < n->n_out && st == HP_OK; k++) {
        const hp_type *got = hp_graph_type(s->rw.out, hp_out(v, k));
        if (!hp_type_eq(got, &local[k])) {
            char a[96], b[96];
            st = hp_errf(err, HP_INTERNAL,
                         "node %d (%s): output %d is %s on a rank, its placements say %s", id, op,
                         k, hp_type_str(got, a, sizeof a), hp_type_str(&local[k], b, sizeof b));
        }
        if (st == HP_OK) hp__rewrite_set(&s->rw, (hp_value){id, k}, hp_out(v, k));
    }
    hp_free(ins);
    hp_free(gin);
    hp_free(tgt);
    return st;
}

static hp_status place_placeholder(spmd *s, int id, const hp_placement *pl, hp_err *err) {
    const hp_node *n = &s->in->nodes[id];
    int nd = s->mesh->ndim;
    const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
    hp_type local;
    hp_err e;
    /* only a gathered storage split may be uneven (padded); its compute split was checked */
    if (hp_local_type(&n->out[0], pl, s->mesh->size, nd, !s->gath[id].on, &local, &e) != HP_OK)
        return hp_errf(err, HP_UNSUPPORTED,
                       "'%s': %s (uneven splits are gathered storage only, as FSDP's)",
                       fqn && fqn->s ? fqn->s : "?", e.msg);
    hp_attr attrs[HP_ATTR_COUNT];
    int na = 0;
    bool split = !hp_type_eq(&local, &n->out[0]);
    for (int k = 0; k < n->n_attrs; k++)
        if (n->attrs[k].key != HP_ATTR_GLOBAL_SHAPE) attrs[na++] = n->attrs[k];
    if (split) attrs[na++] = hp_attr_ints(HP_ATTR_GLOBAL_SHAPE, n->out[0].rank, n->out[0].shape);
    int nid = hp__rewrite_append(&s->rw, HP_OP_PLACEHOLDER, NULL, 0, &local, 1, attrs, na, &e);
    if (nid < 0) return hp_errf(err, e.status, "%s", e.msg);
    HP_TRY(hp_node_set_placements(s->rw.out, nid, pl, err));
    hp__rewrite_set(&s->rw, (hp_value){id, 0}, (hp_value){nid, 0});
    return HP_OK;
}

/* A mesh dim of one rank splits nothing: whatever is asked there is Replicate (no collectives
 * of one rank). */
static void normalize(const hp_graph_mesh *mesh, const hp_placement *pl, hp_placement *out) {
    for (int i = 0; i < mesh->ndim; i++) out[i] = mesh->size[i] == 1 ? HP_REPLICATE : pl[i];
}

hp_status hp_pass_spmd(const hp_graph *in, const hp_graph_mesh *mesh, const hp_placement *inputs,
                       const hp_placement *outputs, hp_graph **out, hp_err *err) {
    return hp_pass_spmd_ex(in, mesh, inputs, outputs, NULL, out, err);
}

/* Graph output k to its target: given, or the loss Replicate and gradient k to parameter k's
 * storage. */
static hp_status place_output(spmd *s, int k, const hp_placement *outputs, hp_value *out,
                              hp_err *err) {
    const hp_graph_mesh *mesh = s->mesh;
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(s->in);
    hp_placement tgt[HP_MESH_MAX_DIMS];
    for (int i = 0; i < nd; i++) tgt[i] = HP_REPLICATE;
    bool grad = k >= 1 && k - 1 < gi.n_params;
    const hp_placement *store = grad ? s->store + (size_t)(k - 1) * (size_t)nd : NULL;
    if (outputs)
        normalize(mesh, outputs + (size_t)k * (size_t)nd, tgt);
    else if (grad)
        memcpy(tgt, store, sizeof(hp_placement) * (size_t)nd);
    hp_value v = hp__rewrite_get(&s->rw, s->in->outputs[k]);
    hp_status st = grad && s->gath[k - 1].on && pl_eq_all(tgt, store, nd)
                       ? grad_to_storage(s, k - 1, v, out, err)
                       : redistribute(s, v, tgt, out, err);
    if (st != HP_OK) hp_err_prefix(err, "graph output %d", k);
    return st;
}

/* Nodes in order; each graph output is brought to its target right after the node that makes
 * it (after the last placeholder for placeholders), so a gradient is reduced as soon as it is
 * final, as FSDP does, and its unreduced piece need not live to the end of the step. */
static hp_status run(spmd *s, const hp_placement *outputs, hp_err *err) {
    const hp_graph *in = s->in;
    int nd = s->mesh->ndim, no = in->n_outputs;
    HP_TRY(plan_gathers(s, err));
    HP_TRY(hp_graph_set_mesh(s->rw.out, s->mesh, err));
    int32_t *first = hp_malloc((size_t)(in->n_nodes ? in->n_nodes : 1) * sizeof *first);
    int32_t *next = hp_malloc((size_t)(no ? no : 1) * sizeof *next);
    hp_value *outs = hp_malloc((size_t)(no ? no : 1) * sizeof *outs);
    hp_status st = first && next && outs ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory");
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) first[i] = -1;
    for (int k = no - 1; k >= 0 && st == HP_OK; k--) { /* each list in output order */
        int32_t at = in->outputs[k].node < s->n_ph ? s->n_ph - 1 : in->outputs[k].node;
        next[k] = first[at];
        first[at] = k;
    }
    for (int i = 0; i < in->n_nodes && st == HP_OK; i++) {
        if (in->nodes[i].op == HP_OP_PLACEHOLDER)
            st = place_placeholder(s, i, s->store + (size_t)i * (size_t)nd, err);
        else
            st = place_node(s, i, err);
        for (int32_t k = first[i]; k >= 0 && st == HP_OK; k = next[k])
            st = place_output(s, k, outputs, &outs[k], err);
    }
    if (st == HP_OK) st = hp_graph_set_outputs(s->rw.out, outs, no, err);
    hp_free(first);
    hp_free(next);
    hp_free(outs);
    return st;
}

hp_status hp_pass_spmd_ex(const hp_graph *in, const hp_graph_mesh *mesh, const hp_placement *inputs,
                          const hp_placement *outputs, const hp_spmd_opts *opts, hp_graph **out,
                          hp_err *err) {
    *out = NULL;
    if (in->mesh.ndim) return hp_errf(err, HP_INVALID, "spmd: the input graph is already placed");
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(in);
    spmd s = {.in = in,
              .mesh = mesh,
              .reshard = opts && opts->reshard_after_forward,
              .opts = opts,
              .n_ph = gi.n_params + gi.n_buffers + gi.n_data,
              .loss = in->n_outputs ? in->outputs[0].node : in->n_nodes};
    size_t n_pl = (size_t)(s.n_ph ? s.n_ph : 1) * (size_t)(nd ? nd : 1);
    hp_placement *store = hp_malloc(n_pl * sizeof *store);
    hp_placement *compute = hp_malloc(n_pl * sizeof *compute);
    s.gath = hp_calloc((size_t)(s.n_ph ? s.n_ph : 1), sizeof *s.gath);
    s.derived = hp_malloc((size_t)(in->n_nodes ? in->n_nodes : 1) * sizeof *s.derived);
    s.recomp = hp_malloc((size_t)(in->n_nodes ? in->n_nodes : 1) * sizeof *s.recomp);
    hp_status st = HP_OK;
    if (!store || !compute || !s.gath || !s.derived || !s.recomp)
        st = hp_errf(err, HP_NOMEM, "out of memory");
    for (int p = 0; p < s.n_ph && st == HP_OK; p++) {
        size_t at = (size_t)p * (size_t)nd;
        normalize(mesh, inputs + at, store + at);
        normalize(mesh, opts && opts->compute ? opts->compute + at : inputs + at, compute + at);
    }
    s.store = store;
    s.compute = compute;
    if (st == HP_OK) st = hp__rewrite_start(&s.rw, in, err);
    bool started = st == HP_OK;
    if (st == HP_OK) st = run(&s, outputs, err);
    hp_free(s.memo);
    hp_free(store);
    hp_free(compute);
    hp_free(s.gath);
    hp_free(s.derived);
    hp_free(s.recomp);
    if (st != HP_OK) hp_err_prefix(err, "spmd");
    hp_graph *g = st == HP_OK ? s.rw.out : NULL;
    if (g) s.rw.out = NULL; /* outputs were set here: take the graph, drop the rewriter */
    if (started) hp__rewrite_abort(&s.rw);
    if (st == HP_OK && (st = hp_graph_verify(g, err)) != HP_OK) {
        hp_err_prefix(err, "spmd: the placed graph does not verify");
        hp_graph_free(g);
        g = NULL;
    }
    *out = g;
    return st;
}
