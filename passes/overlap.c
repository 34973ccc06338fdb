/* passes/overlap.c — AutoOverlap: reorders the per-rank graph so that communication runs
 * behind compute. Node ids change; nothing is added or removed; values are untouched.
 *
 * The schedule keeps the compute nodes in their original relative order (the "backbone") and
 * places the communication around it:
 *   * Parameter all-gathers (an all_gather_into_tensor of a placeholder: a shard, as FSDP
 *     emits it, or of a transpose of one, as spmd gathers a dp:S(k) storage; the transpose
 *     travels with its gather) are prefetched. They are grouped into FSDP units: the
 *     gathers, in order of first use, form one group per contiguous run of the same unit
 *     (hp__fsdp_unit_len: "layers.3", "tok_embeddings", ...; a run is also cut where a
 *     parameter would repeat, so a forward and a backward re-gather of the same unit are two
 *     groups). With depth
 *     d = prefetch_depth, group k is issued just before the first use of group k-d, so group
 *     i+1 gathers while group i computes; groups k < d are issued at the start; d = 0 issues
 *     each group just before its own first use (no prefetch). A byte budget bounds what is
 *     gathered ahead: B = bucket_bytes * (d + 1) (none when bucket_bytes is 0). When group k
 *     would be issued at the first use of group j, the groups j+1..k are in flight ahead of
 *     the compute; if their gathered bytes exceed B the issue moves to group j+1's first
 *     use, and so on. The very next group (j = k-1) is always allowed, so a unit larger than
 *     B is still prefetched one ahead (FSDP2's behaviour) and B only bounds deeper prefetch.
 *     Issue points never move backwards from one group to the next, so the communication
 *     stream runs the gathers in the order they are needed.
 *   * Every wait_tensor sinks to just before its first user (the end for graph outputs).
 *   * Other collectives (reduce_scatter_tensor, all_reduce, all_to_all_single, gathers of
 *     computed values) are issued right after their input is produced, together with the
 *     cheap data-movement nodes (views, slice_backward, casts, ...) that only feed them. Their
 *     waits sink no further than the issue of the second such collective after them (two in
 *     flight; FSDP2 bounds its reduce-scatters the same way), or, with bucketing, the one
 *     after two buckets' bytes of them: the unsharded gradient a reduce-scatter reads lives
 *     until its wait, so a wait sunk to the gradient's use at the end of the step would keep
 *     every layer's alive at once (29 GiB of the 8B's f32 gradients on a rank, dp=8).
 *
 * How: every node gets a key (pos, sub, tie, id) — compute nodes (own id, 1), waits (first
 * user's id, 0), prefetched gathers (first use of the issuing group, -1), early collectives
 * (their input's pos, 2) — and the nodes are emitted by Kahn's algorithm taking the smallest
 * ready key (a binary heap): O(n log n), deterministic, and a valid topological order whatever
 * the keys. The keys never decrease along an edge, so the result is exactly the key order.
 * The rebuilt graph is checked node by node (every input emitted before its user).
 *
 * A placed graph (spmd's: a mesh, placements on every value) keeps its mesh and placements;
 * since only the order changes, every collective of every mesh dim is handled alike.
 * Runs when job->passes.enable_overlap; otherwise returns a copy of its input.
 */
#include "hp/passes.h"
#include "passes/sched_util.h"

#include <stdlib.h>
#include <string.h>

/* K_FEED: a data-movement node between a stored parameter and its gather (spmd transposes a
 * dp:S(k) storage to dim 0 first): it travels with the gather it feeds. */
typedef enum { K_INPUT, K_COMPUTE, K_WAIT, K_GATHER, K_EARLY, K_FEED } node_kind;

typedef struct sched_key {
    int64_t pos, tie;
    int32_t sub, id;
} sched_key;

static int key_cmp(const sched_key *a, const sched_key *b) {
    if (a->pos != b->pos) return a->pos < b->pos ? -1 : 1;
    if (a->sub != b->sub) return a->sub < b->sub ? -1 : 1;
    if (a->tie != b->tie) return a->tie < b->tie ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

typedef struct gather_use {
    int64_t use; /* position of the first use */
    int32_t id;
} gather_use;

static int gather_use_cmp(const void *pa, const void *pb) {
    const gather_use *a = pa, *b = pb;
    if (a->use != b->use) return a->use < b->use ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

typedef struct sched {
    const hp_graph *g;
    int n;
    hp__users u;
    uint8_t *kind;   /* [n] node_kind */
    int64_t *pos;    /* [n] waits: position of the first user; gathers: first use */
    sched_key *key;  /* [n] */
    gather_use *ag;  /* [n_ag] parameter gathers by first use */
    int32_t *stamp;  /* [n] per placeholder: the last group that gathered it, -1 none */
    int64_t *gbytes; /* [n_groups + 1] prefix sums of gathered bytes per group */
    int32_t *gfirst; /* [n_groups + 1] index into ag of each group's first gather */
    int32_t *heap;   /* [n] */
    int32_t *indeg;  /* [n] */
    int32_t *order;  /* [n] the schedule */
    int n_ag, n_groups;
} sched;

static void sched_fini(sched *s) {
    hp__users_fini(&s->u);
    hp_free(s->kind);
    hp_free(s->pos);
    hp_free(s->key);
    hp_free(s->ag);
    hp_free(s->stamp);
    hp_free(s->gbytes);
    hp_free(s->gfirst);
    hp_free(s->heap);
    hp_free(s->indeg);
    hp_free(s->order);
}

/* Nodes that only move data and may travel with the collective they feed. */
static bool is_movement(hp_op op) {
    if (hp_op_get(op)->flags & HP_OPF_VIEW) return true;
    return op == HP_OP_RESHAPE || op == HP_OP_SLICE_BACKWARD || op == HP_OP_TO_COPY ||
           op == HP_OP_CLONE || op == HP_OP_DETACH;
}

static bool is_collective(hp_op op) {
    return (hp_op_get(op)->flags & HP_OPF_COLLECTIVE) != 0;
}

/* Kinds, and wait positions (reverse pass: users first). */
static void classify(sched *s) {
    const hp_graph *g = s->g;
    for (int i = 0; i < s->n; i++) {
        hp_op op = g->nodes[i].op;
        s->kind[i] = op == HP_OP_PLACEHOLDER     ? K_INPUT
                     : op == HP_OP_WAIT_TENSOR   ? K_WAIT
                     : hp__is_param_gather(g, i) ? K_GATHER
                     : is_collective(op)         ? K_EARLY
                                                 : K_COMPUTE;
    }
    for (int i = s->n - 1; i >= 0; i--) {
        const int32_t *us = s->u.user + s->u.off[i];
        int nu = s->u.off[i + 1] - s->u.off[i];
        if (s->kind[i] == K_WAIT || s->kind[i] == K_GATHER) {
            int64_t p = s->u.is_output[i] ? s->n : (nu ? INT64_MAX : i);
            for (int k = 0; k < nu; k++) {
                int64_t q = s->kind[us[k]] == K_WAIT ? s->pos[us[k]] : us[k];
                if (q < p) p = q;
            }
            s->pos[i] = p;
        } else if (s->kind[i] == K_COMPUTE && nu > 0 && !s->u.is_output[i] &&
                   is_movement(g->nodes[i].op)) {
            /* a feeder: every user is an early collective or another feeder */
            bool feeds = true, gfeeds = g->nodes[i].n_in == 1;
            for (int k = 0; k < nu && feeds; k++) feeds = s->kind[us[k]] == K_EARLY;
            for (int k = 0; k < nu && gfeeds; k++)
                gfeeds = s->kind[us[k]] == K_GATHER || s->kind[us[k]] == K_FEED;
            if (feeds)
                s->kind[i] = K_EARLY;
            else if (gfeeds)
                s->kind[i] = K_FEED;
        }
    }
}

/* Groups the parameter gathers into units by first use and picks each group's issue point. */
static hp_status plan_prefetch(sched *s, const hp_pass_config *pc, hp_err *err) {
    const hp_graph *g = s->g;
    for (int i = 0; i < s->n; i++)
        if (s->kind[i] == K_GATHER) s->ag[s->n_ag++] = (gather_use){s->pos[i], i};
    if (!s->n_ag) return HP_OK;
    qsort(s->ag, (size_t)s->n_ag, sizeof *s->ag, gather_use_cmp);
    s->gbytes = hp_calloc((size_t)s->n_ag + 1, sizeof *s->gbytes);
    s->gfirst = hp_calloc((size_t)s->n_ag + 1, sizeof *s->gfirst);
    if (!s->gbytes || !s->gfirst) return hp_errf(err, HP_NOMEM, "out of memory grouping gathers");
    for (int i = 0; i < s->n; i++) s->stamp[i] = -1;
    int32_t prev_ph = -1;
    for (int a = 0; a < s->n_ag; a++) {
        int32_t id = s->ag[a].id, ph = hp__gathered_param(g, id);
        bool fresh = a == 0 || !hp__same_unit(g, prev_ph, ph) || s->stamp[ph] == s->n_groups - 1;
        if (fresh) {
            s->gfirst[s->n_groups] = a;
            s->gbytes[s->n_groups + 1] = s->gbytes[s->n_groups];
            s->n_groups++;
        }
        s->gbytes[s->n_groups] += hp__type_bytes(&g->nodes[id].out[0]);
        s->stamp[ph] = s->n_groups - 1;
        prev_ph = ph;
    }
    s->gfirst[s->n_groups] = s->n_ag;

    int64_t depth = pc->prefetch_depth > 0 ? pc->prefetch_depth : 0;
    int64_t budget = pc->bucket_bytes > 0 ? pc->bucket_bytes * (depth + 1) : 0;
    int64_t j = -1; /* issue point of the previous group: -1 = the start */
    for (int k = 0; k < s->n_groups; k++) {
        int64_t lo = k - depth;
        if (j < lo) j = lo;
        while (j < k) {
            if (depth > 0 && j == k - 1) break; /* the next unit is always prefetched */
            if (budget == 0 || s->gbytes[k + 1] - s->gbytes[j + 1] <= budget) break;
            j++;
        }
        for (int a = s->gfirst[k]; a < s->gfirst[k + 1]; a++) {
            int32_t id = s->ag[a].id;
            if (j < 0)
                s->key[id] = (sched_key){.pos = -1, .sub = 0, .tie = s->ag[a].use, .id = id};
            else
                s->key[id] = (sched_key){
                    .pos = s->ag[s->gfirst[j]].use, .sub = -1, .tie = s->ag[a].use, .id = id};
        }
    }
    return HP_OK;
}

/* Keys of everything but the prefetched gathers (forward pass: inputs first). */
static void assign_keys(sched *s) {
    for (int i = 0; i < s->n; i++) {
        switch ((node_kind)s->kind[i]) {
        case K_INPUT:
            s->key[i] = (sched_key){.pos = -2, .sub = 0, .tie = 0, .id = i};
            break;
        case K_COMPUTE:
            s->key[i] = (sched_key){.pos = i, .sub = 1, .tie = 0, .id = i};
            break;
        case K_WAIT:
            s->key[i] = (sched_key){.pos = s->pos[i], .sub = 0, .tie = 0, .id = i};
            break;
        case K_GATHER:
        case K_FEED:
            break; /* plan_prefetch; below */
        case K_EARLY: {
            int64_t p = -2;
            const hp_node *nd = &s->g->nodes[i];
            for (int k = 0; k < nd->n_in; k++)
                if (s->key[nd->in[k].node].pos > p) p = s->key[nd->in[k].node].pos;
            s->key[i] = (sched_key){.pos = p, .sub = 2, .tie = 0, .id = i};
            break;
        }
        }
    }
}

/* The waits of the early collectives: a wait comes no later than just before the issue of a
 * collective c_m after its own c_k such that the ones issued between them are both at least
 * IN_FLIGHT - 1 positions (collectives issued at one position count once) and at least two
 * buckets of input bytes (with bucketing on: so that bucketing, which runs next, can still merge
 * a bucket's worth of reductions issued before the wait). Keys never decrease along an edge. */
#define IN_FLIGHT 2
static hp_status bound_waits(sched *s, int64_t bucket_bytes, hp_err *err) {
    int n_ec = 0;
    for (int i = 0; i < s->n; i++)
        n_ec += s->kind[i] == K_EARLY && is_collective(s->g->nodes[i].op);
    if (n_ec <= IN_FLIGHT) return HP_OK;
    gather_use *ec = hp_malloc((size_t)n_ec * sizeof *ec);
    int64_t *bytes = hp_malloc(((size_t)n_ec + 1) * sizeof *bytes); /* prefix sums */
    int32_t *dist = hp_malloc((size_t)n_ec * sizeof *dist);         /* distinct positions up to k */
    if (!ec || !bytes || !dist) {
        hp_free(ec);
        hp_free(bytes);
        hp_free(dist);
        return hp_errf(err, HP_NOMEM, "out of memory ordering collectives");
    }
    n_ec = 0;
    for (int i = 0; i < s->n; i++)
        if (s->kind[i] == K_EARLY && is_collective(s->g->nodes[i].op))
            ec[n_ec++] = (gather_use){s->key[i].pos, i};
    qsort(ec, (size_t)n_ec, sizeof *ec, gather_use_cmp);
    bytes[0] = 0;
    for (int k = 0; k < n_ec; k++) {
        const hp_node *nd = &s->g->nodes[ec[k].id];
        bytes[k + 1] = bytes[k] + hp__type_bytes(hp_graph_type(s->g, nd->in[0]));
        dist[k] = k == 0 ? 0 : dist[k - 1] + (ec[k].use > ec[k - 1].use);
    }
    int64_t budget = bucket_bytes > 0 ? 2 * bucket_bytes : 0;
    int m = 0;
    for (int k = 0; k < n_ec; k++) {
        if (m <= k) m = k + 1;
        while (m < n_ec && (dist[m] - dist[k] < IN_FLIGHT || bytes[m] - bytes[k + 1] < budget)) m++;
        if (m == n_ec) break; /* no such collective: the waits stay where they were */
        sched_key bound = {.pos = ec[m].use, .sub = 2, .tie = -1, .id = 0};
        int32_t c = ec[k].id;
        for (int32_t e = s->u.off[c]; e < s->u.off[c + 1]; e++) {
            int32_t w = s->u.user[e];
            if (s->kind[w] != K_WAIT) continue;
            bound.id = w;
            if (key_cmp(&bound, &s->key[w]) < 0) s->key[w] = bound;
        }
    }
    hp_free(ec);
    hp_free(bytes);
    hp_free(dist);
    return HP_OK;
}

/* A gather's feeders take its key (their own id: just before it). Reverse: users first. */
static void feed_keys(sched *s) {
    for (int i = s->n - 1; i >= 0; i--) {
        if (s->kind[i] != K_FEED) continue;
        const sched_key *best = NULL;
        for (int32_t e = s->u.off[i]; e < s->u.off[i + 1]; e++)
            if (!best || key_cmp(&s->key[s->u.user[e]], best) < 0) best = &s->key[s->u.user[e]];
        s->key[i] = *best;
        s->key[i].id = i;
    }
}

/* ---- Kahn's algorithm with a binary heap on the keys ----------------------------------------- */

static bool heap_less(const sched *s, int32_t a, int32_t b) {
    return key_cmp(&s->key[a], &s->key[b]) < 0;
}

static void heap_push(sched *s, int *len, int32_t v) {
    int i = (*len)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_less(s, v, s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = v;
}

static int32_t heap_pop(sched *s, int *len) {
    int32_t top = s->heap[0], v = s->heap[--(*len)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *len) break;
        if (c + 1 < *len && heap_less(s, s->heap[c + 1], s->heap[c])) c++;
        if (!heap_less(s, s->heap[c], v)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (*len > 0) s->heap[i] = v;
    return top;
}

/* Sorts ids[0..n) by key, stably merging runs (tmp has room for n). */
static void sort_ids(const sched *s, int32_t *ids, int32_t *tmp, int n) {
    if (n < 32) {
        for (int i = 1; i < n; i++) {
            int32_t v = ids[i];
            int j = i;
            for (; j > 0 && heap_less(s, v, ids[j - 1]); j--) ids[j] = ids[j - 1];
            ids[j] = v;
        }
        return;
    }
    int h = n / 2;
    sort_ids(s, ids, tmp, h);
    sort_ids(s, ids + h, tmp, n - h);
    if (!heap_less(s, ids[h], ids[h - 1])) return; /* already in order */
    memcpy(tmp, ids, (size_t)h * sizeof *ids);
    int a = 0, b = h, o = 0;
    while (a < h && b < n) ids[o++] = heap_less(s, ids[b], tmp[a]) ? ids[b++] : tmp[a++];
    while (a < h) ids[o++] = tmp[a++];
}

/* When every key is above its inputs' keys (what the keys are built for), Kahn's algorithm
 * taking the smallest ready key emits exactly the key order: a counting sort on pos (in
 * [-2, n]) then a sort of each pos's few nodes gives it in O(n) plus small sorts, without the
 * heap's cache misses. Returns false (order untouched) when some edge breaks that; the heap
 * then decides. */
static bool key_order(sched *s) {
    const hp_graph *g = s->g;
    int n = s->n;
    for (int i = 0; i < n; i++) {
        const hp_node *nd = &g->nodes[i];
        if (s->key[i].pos < -2 || s->key[i].pos > n) return false;
        for (int k = 0; k < nd->n_in; k++)
            if (!heap_less(s, nd->in[k].node, i)) return false;
    }
    int32_t *start = hp_calloc((size_t)n + 4, sizeof *start);
    if (!start) return false;
    for (int i = 0; i < n; i++) start[s->key[i].pos + 3]++;
    for (int b = 1; b < n + 4; b++) start[b] += start[b - 1];
    for (int i = 0; i < n; i++) s->order[start[s->key[i].pos + 2]++] = i; /* ids ascending */
    /* start[b + 2] is now the end of bucket pos b: sort each bucket by the whole key */
    for (int64_t b = -2, lo = 0; b <= n; b++) {
        int32_t hi = start[b + 2];
        if (hi - lo > 1) sort_ids(s, s->order + lo, s->heap, (int)(hi - lo));
        lo = hi;
    }
    hp_free(start);
    return true;
}

static hp_status topo_order(sched *s, hp_err *err) {
    if (key_order(s)) return HP_OK;
    int len = 0, done = 0;
    for (int i = 0; i < s->n; i++) {
        s->indeg[i] = s->g->nodes[i].n_in;
        if (!s->indeg[i]) heap_push(s, &len, i);
    }
    while (len > 0) {
        int32_t v = heap_pop(s, &len);
        s->order[done++] = v;
        for (int32_t e = s->u.off[v]; e < s->u.off[v + 1]; e++)
            if (--s->indeg[s->u.user[e]] == 0) heap_push(s, &len, s->u.user[e]);
    }
    if (done != s->n) /* unreachable for a graph whose refs point backwards */
        return hp_errf(err, HP_INTERNAL, "overlap: scheduled %d of %d nodes", done, s->n);
    return HP_OK;
}

/* Rebuilds g in `order`, remapping references; checks every input was emitted first. */
static hp_status emit(const hp_graph *g, const int32_t *order, hp_graph **out, hp_err *err) {
    int n = g->n_nodes;
    int32_t *newid = hp_malloc((size_t)(n ? n : 1) * sizeof *newid);
    hp_value *ins = hp_malloc(HP_MAX_INPUTS * sizeof *ins);
    hp_graph *o = hp_graph_new();
    hp_status st = HP_OK;
    if (!newid || !ins || !o || hp_graph_reserve(o, n, NULL) != HP_OK) {
        st = hp_errf(err, HP_NOMEM, "out of memory rebuilding %d nodes", n);
        goto done;
    }
    for (int i = 0; i < n; i++) newid[i] = -1;
    if ((st = hp__copy_mesh(o, g, err)) != HP_OK) goto done;
    for (int t = 0; t < n; t++) {
        int32_t id = order[t];
        const hp_node *nd = &g->nodes[id];
        for (int k = 0; k < nd->n_in; k++) {
            int32_t m = newid[nd->in[k].node];
            if (m < 0) {
                st = hp_errf(err, HP_INTERNAL,
                             "overlap: node %d (%s) scheduled before its input %d (node %d)", id,
                             hp_op_get(nd->op)->name, k, (int)nd->in[k].node);
                goto done;
            }
            ins[k] = (hp_value){m, nd->in[k].out};
        }
        hp_err e;
        int nid = hp_graph_append_like(o, g, nd, ins, &e);
        if (nid < 0) {
            st = e.status;
            if (err) *err = e;
            goto done;
        }
        newid[id] = nid;
        if (nd->pl && (st = hp_node_set_placements(o, nid, nd->pl, err)) != HP_OK) goto done;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        hp_value v = {newid[g->outputs[i].node], g->outputs[i].out};
        if ((st = hp_graph_add_output(o, v, err)) != HP_OK) goto done;
    }
done:
    hp_free(newid);
    hp_free(ins);
    if (st != HP_OK) {
        hp_graph_free(o);
        o = NULL;
    }
    *out = o;
    return st;
}

static hp_status schedule(const hp_graph *in, const hp_pass_config *pc, hp_graph **out,
                          hp_err *err) {
    sched s = {.g = in, .n = in->n_nodes};
    size_t n = (size_t)(s.n ? s.n : 1);
    hp_status st = hp__users_init(&s.u, in, err);
    if (st != HP_OK) goto done;
    s.kind = hp_calloc(n, sizeof *s.kind);
    s.pos = hp_calloc(n, sizeof *s.pos);
    s.key = hp_calloc(n, sizeof *s.key);
    s.ag = hp_calloc(n, sizeof *s.ag);
    s.stamp = hp_calloc(n, sizeof *s.stamp);
    s.heap = hp_calloc(n, sizeof *s.heap);
    s.indeg = hp_calloc(n, sizeof *s.indeg);
    s.order = hp_calloc(n, sizeof *s.order);
    if (!s.kind || !s.pos || !s.key || !s.ag || !s.stamp || !s.heap || !s.indeg || !s.order) {
        st = hp_errf(err, HP_NOMEM, "out of memory scheduling %d nodes", s.n);
        goto done;
    }
    classify(&s);
    if ((st = plan_prefetch(&s, pc, err)) != HP_OK) goto done;
    assign_keys(&s);
    if ((st = bound_waits(&s, pc->bucket_bytes, err)) != HP_OK) goto done;
    feed_keys(&s);
    if ((st = topo_order(&s, err)) != HP_OK) goto done;
    st = emit(in, s.order, out, err);
done:
    sched_fini(&s);
    return st;
}

hp_status hp_pass_overlap(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    *out = NULL;
    if (!ctx || !ctx->job) return hp_errf(err, HP_INVALID, "overlap: no job in the pass context");
    const hp_pass_config *pc = &ctx->job->passes;
    if (pc->enable_overlap) {
        HP_TRY(schedule(in, pc, out, err));
    } else if (!(*out = hp_graph_clone(in))) {
        return hp_errf(err, HP_NOMEM, "out of memory copying the graph");
    }
    hp__sched_report(ctx->report, in, *out, pc->enable_overlap);
    return HP_OK;
}
