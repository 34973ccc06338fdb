/* passes/autoshard_enum.c — the problem auto-sharding solves: classes of identical nodes, the
 * strategies of each class from the op table's sharding rules, and what each costs
 * (docs/autoshard.md).
 *
 * Classes. A node's signature is its op, attributes, output types, whether and which graph
 * output it makes, and per input either the class of the value it reads (a placeholder, or a
 * forward value read by the backward) or the relative position (this node's id minus the
 * producer's) and type of the value. The layers of a model are emitted alike, so layer k's
 * nodes have layer k+1's signatures and share their decisions:
 * the problem does not grow with the layers. Placeholders are classed by their FQN with the
 * digits masked ("layers.#.attention.wq.weight"), type, and the constraint and FSDP mark that
 * apply to them.
 *
 * Strategies. A compute node takes, mesh dim by mesh dim in mesh order, one of its op's rules
 * asked about the pieces the earlier dims leave (as the spmd pass asks) or all-Replicate; an
 * embedding may also run vocab-parallel (weight and chunk base Shard(0)) on one dim, and the
 * gradient of its weight chunked (base Shard(0), out Shard(0)). A parameter or buffer takes per
 * mesh dim Replicate, Shard(d) computed Shard(d), or Shard(d) gathered before use (FSDP; its
 * split may be uneven, padded); a data input its batch Shard(0) on "dp".
 *
 * Costs (seconds, on the device profile). A node: max(FLOPs / (peak x efficiency), bytes /
 * memory bandwidth) + one kernel launch, on its local shapes; views are free. A
 * redistribution: spmd's walk, dim by dim from the last, each collective its link's latency
 * plus the bytes it moves over the link's bandwidth (hp_collective_bytes' convention), a
 * gathered or scattered non-leading dim two transposes more, Replicate -> Shard a local copy.
 * A parameter: its gather per region that reads it (forward, and backward when resharded after
 * forward) and the optimizer over its local storage (AdamW reads 4 and writes 3 f32 per
 * element).
 */
#include "passes/autoshard_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define AS_MAX_STRATS 512 /* of one class */

/* ---- redistribution costs ------------------------------------------------------------------ */

static double local_bytes(const hp_autoshard *a, const hp_type *t, const hp_placement *pl) {
    double n = (double)hp_dtype_size(t->dtype);
    int64_t shape[HP_MAX_RANK];
    for (int d = 0; d < t->rank; d++) shape[d] = t->shape[d];
    for (int i = 0; i < a->mesh.ndim; i++)
        if (pl[i].kind == HP_PLACE_SHARD && pl[i].dim < t->rank)
            shape[pl[i].dim] = (shape[pl[i].dim] + a->mesh.size[i] - 1) / a->mesh.size[i];
    for (int d = 0; d < t->rank; d++) n *= (double)shape[d];
    return n;
}

/* The extent of tensor dim d of t under pl on every mesh dim but `skip`. */
static int64_t extent_without(const hp_autoshard *a, const hp_type *t, const hp_placement *pl,
                              int d, int skip) {
    int64_t e = t->shape[d];
    for (int i = 0; i < a->mesh.ndim; i++)
        if (i != skip && pl[i].kind == HP_PLACE_SHARD && pl[i].dim == d)
            e = (e + a->mesh.size[i] - 1) / a->mesh.size[i];
    return e;
}

static bool split_elsewhere(const hp_autoshard *a, const hp_placement *pl, int d, int skip) {
    for (int k = 0; k < a->mesh.ndim; k++)
        if (k != skip && pl[k].kind == HP_PLACE_SHARD && pl[k].dim == d) return true;
    return false;
}

double hp__as_move(const hp_autoshard *a, const hp_type *t, const hp_placement *p,
                   const hp_placement *q) {
    const hp_device_profile *pr = &a->prof;
    hp_placement cur[HP_MESH_MAX_DIMS];
    memcpy(cur, p, sizeof(hp_placement) * (size_t)a->mesh.ndim);
    double c = 0;
    for (int i = a->mesh.ndim - 1; i >= 0; i--) {
        hp_placement have = cur[i], want = q[i];
        if (hp_placement_eq(have, want)) continue;
        double n = (double)a->mesh.size[i], b = local_bytes(a, t, cur);
        const hp_link_class *l = &a->link[i];
        if (have.kind == HP_PLACE_REPLICATE && want.kind == HP_PLACE_SHARD) {
            if (want.dim >= t->rank || split_elsewhere(a, cur, want.dim, i) ||
                extent_without(a, t, cur, want.dim, i) % a->mesh.size[i])
                return INFINITY;
            c += b / n / pr->mem_bw + pr->kernel_s; /* the rank's own chunk, copied */
        } else if (have.kind == HP_PLACE_SHARD && want.kind == HP_PLACE_SHARD) {
            if (split_elsewhere(a, cur, have.dim, i) || split_elsewhere(a, cur, want.dim, i) ||
                want.dim >= t->rank || extent_without(a, t, cur, want.dim, i) % a->mesh.size[i] ||
                extent_without(a, t, cur, have.dim, i) % a->mesh.size[i])
                return INFINITY;
            c += l->latency + b * (n - 1) / n / l->bandwidth + 2 * b / pr->mem_bw;
        } else if (have.kind == HP_PLACE_SHARD && want.kind == HP_PLACE_REPLICATE) {
            if (split_elsewhere(a, cur, have.dim, i)) return INFINITY;
            c += l->latency + b * (n - 1) / l->bandwidth;
            if (have.dim != 0) c += 2 * b * n / pr->mem_bw;
        } else if (have.kind == HP_PLACE_PARTIAL && want.kind == HP_PLACE_REPLICATE) {
            c += l->latency + 2 * b * (n - 1) / n / l->bandwidth;
        } else if (have.kind == HP_PLACE_PARTIAL && want.kind == HP_PLACE_SHARD &&
                   have.reduce != HP_REDUCE_MAX) {
            if (want.dim >= t->rank || split_elsewhere(a, cur, want.dim, i) ||
                extent_without(a, t, cur, want.dim, i) % a->mesh.size[i])
                return INFINITY;
            c += l->latency + b * (n - 1) / n / l->bandwidth;
            if (want.dim != 0) c += 2 * b / pr->mem_bw;
        } else {
            return INFINITY; /* Replicate -> Partial, Partial(max) -> Shard, between Partials */
        }
        cur[i] = want;
    }
    return c;
}

/* ---- node costs ---------------------------------------------------------------------------- */

static double op_flops(hp_op op, const hp_type *in, const hp_type *out) {
    switch (op) {
    case HP_OP_MM:
        return 2.0 * (double)out[0].shape[0] * (double)out[0].shape[1] * (double)in[0].shape[1];
    case HP_OP_ADDMM:
        return 2.0 * (double)out[0].shape[0] * (double)out[0].shape[1] * (double)in[1].shape[1];
    case HP_OP_BMM:
        return 2.0 * (double)hp_type_numel(&out[0]) * (double)in[0].shape[2];
    case HP_OP_SDPA:
        return 4.0 * (double)hp_type_numel(&in[0]) * (double)in[1].shape[2];
    case HP_OP_SDPA_BACKWARD:
        return 8.0 * (double)hp_type_numel(&in[1]) * (double)in[2].shape[2];
    default:
        return 0;
    }
}

static hp_type split_type(const hp_autoshard *a, const hp_type *t, const hp_placement *pl,
                          int upto) {
    hp_type r = *t;
    for (int i = 0; i < upto; i++)
        if (pl[i].kind == HP_PLACE_SHARD && pl[i].dim < r.rank)
            r.shape[pl[i].dim] = (r.shape[pl[i].dim] + a->mesh.size[i] - 1) / a->mesh.size[i];
    return r;
}

static double node_cost(const hp_autoshard *a, const hp_node *n, const hp_type *gin,
                        const as_strat *s, int ni) {
    if (hp_op_get(n->op)->flags & HP_OPF_VIEW) return 0;
    int nd = a->mesh.ndim;
    hp_type in[AS_MAX_IN + 8], out[HP_MAX_OUTS];
    double bytes = 0;
    int nk = ni < (int)HP_ARRAY_LEN(in) ? ni : (int)HP_ARRAY_LEN(in);
    for (int j = 0; j < nk; j++) {
        in[j] = split_type(a, &gin[j], s->in[j < AS_MAX_IN ? j : 0], nd);
        bytes += (double)hp_type_numel(&in[j]) * (double)hp_dtype_size(in[j].dtype);
    }
    for (int k = 0; k < n->n_out; k++) {
        out[k] = split_type(a, &n->out[k], s->out[k], nd);
        bytes += (double)hp_type_numel(&out[k]) * (double)hp_dtype_size(out[k].dtype);
    }
    double f = op_flops(n->op, in, out), rate = a->prof.peak_flops * a->prof.efficiency;
    if ((n->op == HP_OP_SDPA || n->op == HP_OP_SDPA_BACKWARD) && nk > 2) { /* as cost.c */
        const hp_type *q = &in[n->op == HP_OP_SDPA ? 0 : 1], *k = q + 1;
        if (q->rank == 4 && k->rank == 4)
            rate = hp_device_profile_attn_rate(
                &a->prof, q->shape[3], hp_node_int(n, HP_ATTR_CAUSAL, 0), q->shape[2], k->shape[2]);
    }
    double t = fmax(f / rate, bytes / a->prof.mem_bw);
    return t + a->prof.kernel_s;
}

/* ---- signatures and classes ---------------------------------------------------------------- */

typedef struct sigbuf {
    int64_t *v;
    int n, cap;
    bool oom;
} sigbuf;

static void put(sigbuf *b, int64_t x) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        int64_t *v = hp_realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) {
            b->oom = true;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = x;
}

static void put_str(sigbuf *b, const char *s, bool mask_digits) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = s ? s : ""; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (mask_digits && c >= '0' && c <= '9') {
            while (p[1] >= '0' && p[1] <= '9') p++;
            c = '#';
        }
        h = (h ^ c) * 1099511628211ull;
    }
    put(b, (int64_t)h);
}

static void put_type(sigbuf *b, const hp_type *t) {
    put(b, t->dtype);
    put(b, t->rank);
    for (int d = 0; d < t->rank; d++) put(b, t->shape[d]);
}

static void put_attrs(sigbuf *b, const hp_node *n) {
    put(b, n->n_attrs);
    for (int k = 0; k < n->n_attrs; k++) {
        const hp_attr *at = &n->attrs[k];
        put(b, at->key);
        switch (at->kind) {
        case HP_ATTR_KIND_INT:
            put(b, at->i);
            break;
        case HP_ATTR_KIND_FLOAT: {
            int64_t bits;
            memcpy(&bits, &at->f, sizeof bits);
            put(b, bits);
            break;
        }
        case HP_ATTR_KIND_INTS:
            put(b, at->ints.n);
            for (int i = 0; i < at->ints.n; i++) put(b, at->ints.v[i]);
            break;
        case HP_ATTR_KIND_DTYPE:
            put(b, at->dtype);
            break;
        case HP_ATTR_KIND_STR:
            put_str(b, at->s, false);
            break;
        default: /* init specs: placeholders only, classed by FQN */
            break;
        }
    }
}

typedef struct sig_table {
    int *slot; /* [cap]: class + 1, 0 empty */
    uint64_t *hash;
    int cap;
    int64_t **sig; /* [n_cls]: the representative's signature */
    int *sig_n;
} sig_table;

static uint64_t hash_sig(const sigbuf *b) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < b->n; i++) h = (h ^ (uint64_t)b->v[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

typedef struct enum_ctx {
    hp_autoshard *a;
    const hp_job *job;
    bool *marked;            /* [n_params]: FSDP marks */
    int *constraint;         /* [n_ph] */
    int32_t *out_k;          /* [n_nodes]: first graph output the node makes, -1 */
    int32_t *out_next;       /* [n_outputs] */
    bool *fwd_use, *bwd_use; /* [n_ph] */
} enum_ctx;

static hp_status signature(enum_ctx *e, int i, sigbuf *b) {
    const hp_autoshard *a = e->a;
    const hp_graph *g = a->g;
    const hp_node *n = &g->nodes[i];
    b->n = 0;
    put(b, n->op);
    if (n->op == HP_OP_PLACEHOLDER) {
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        bool data = i >= a->v.n_params + a->v.n_buffers;
        put(b, data ? 2 : i >= a->v.n_params ? 1 : 0);
        put_str(b, fqn ? fqn->s : NULL, true);
        put_type(b, &n->out[0]);
        put(b, e->constraint[i]);
        put(b, i < a->v.n_params && e->marked[i]);
        put(b, e->fwd_use[i] * 2 + e->bwd_use[i]);
        if (data) put(b, i); /* data inputs are their own */
    } else {
        put(b, n->n_in);
        put(b, n->n_out);
        for (int k = 0; k < n->n_out; k++) put_type(b, &n->out[k]);
        put_attrs(b, n);
        put(b, i > a->v.loss);
        for (int j = 0; j < n->n_in; j++) {
            hp_value u = n->in[j];
            /* a placeholder, or a forward value the backward reads (layer k's backward reads
             * layer k's activations, ever farther back): by its class; else by position */
            if (u.node < a->v.n_ph || (i > a->v.loss && u.node <= a->v.loss)) {
                put(b, -1 - a->cls_of[u.node]);
                put(b, u.out);
            } else {
                put(b, i - u.node);
                put(b, u.out);
                put_type(b, hp_graph_type(g, u));
            }
        }
    }
    for (int32_t k = e->out_k[i]; k >= 0; k = e->out_next[k]) { /* graph outputs it makes */
        put(b, INT64_MIN);
        put(b, k == 0 ? -1 : k <= a->v.n_params ? a->cls_of[k - 1] : -2 - k);
    }
    return b->oom ? HP_NOMEM : HP_OK;
}

/* The refinement's signature: the first partition's class, and those of the values read. */
static void refined(const hp_autoshard *a, const int *prev, int i, sigbuf *b) {
    const hp_node *n = &a->g->nodes[i];
    b->n = 0;
    put(b, prev[i]);
    for (int j = 0; i >= a->v.n_ph && j < n->n_in; j++) {
        put(b, prev[n->in[j].node]);
        put(b, n->in[j].out);
    }
}

static hp_status partition(enum_ctx *e, const int *prev, hp_err *err) {
    hp_autoshard *a = e->a;
    const hp_graph *g = a->g;
    int nn = g->n_nodes;
    sig_table t = {.cap = 1};
    while (t.cap < 2 * nn + 16) t.cap *= 2;
    t.slot = hp_calloc((size_t)t.cap, sizeof *t.slot);
    t.hash = hp_calloc((size_t)t.cap, sizeof *t.hash);
    t.sig = hp_calloc((size_t)nn + 1, sizeof *t.sig);
    t.sig_n = hp_calloc((size_t)nn + 1, sizeof *t.sig_n);
    hp_free(a->cls);
    a->cls = hp_calloc((size_t)nn + 1, sizeof *a->cls);
    a->n_cls = 0;
    sigbuf b = {0};
    hp_status st = t.slot && t.hash && t.sig && t.sig_n && a->cls
                       ? HP_OK
                       : hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    for (int i = 0; i < nn && st == HP_OK; i++) {
        if (prev)
            refined(a, prev, i, &b);
        else
            st = signature(e, i, &b);
        if (st != HP_OK || b.oom) {
            st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
            break;
        }
        uint64_t h = hash_sig(&b);
        int at = (int)(h & (uint64_t)(t.cap - 1)), c = -1;
        for (; t.slot[at]; at = (at + 1) & (t.cap - 1)) {
            int k = t.slot[at] - 1;
            if (t.hash[at] == h && t.sig_n[k] == b.n &&
                !memcmp(t.sig[k], b.v, (size_t)b.n * sizeof *b.v)) {
                c = k;
                break;
            }
        }
        if (c < 0) {
            c = a->n_cls++;
            t.slot[at] = c + 1;
            t.hash[at] = h;
            t.sig[c] = hp_malloc((size_t)(b.n ? b.n : 1) * sizeof *b.v);
            if (!t.sig[c]) {
                st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
                break;
            }
            memcpy(t.sig[c], b.v, (size_t)b.n * sizeof *b.v);
            t.sig_n[c] = b.n;
            a->cls[c] = (as_class){.rep = i, .bound_by = -1};
        }
        a->cls[c].count++;
        a->cls_of[i] = c;
    }
    for (int c = 0; t.sig && c < a->n_cls; c++) hp_free(t.sig[c]);
    hp_free(t.sig);
    hp_free(t.sig_n);
    hp_free(t.slot);
    hp_free(t.hash);
    hp_free(b.v);
    return st;
}

/* Classes: nodes alike by signature, then split once more where they read values of different
 * classes (the q and k projections' transposes, alike in themselves), so that a view's class
 * reads one class and can follow it (autoshard_follow.c). Once: refining to a fixed point
 * would tell every layer from the one before it. */
static hp_status classify(enum_ctx *e, hp_err *err) {
    hp_autoshard *a = e->a;
    HP_TRY(partition(e, NULL, err));
    int *prev = hp_malloc(((size_t)a->g->n_nodes + 1) * sizeof *prev);
    if (!prev) return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    memcpy(prev, a->cls_of, (size_t)a->g->n_nodes * sizeof *prev);
    hp_status st = partition(e, prev, err);
    hp_free(prev);
    return st;
}

/* ---- strategies ----------------------------------------------------------------------------- */

static hp_status add_strat(hp_autoshard *a, const as_strat *s, hp_err *err) {
    if (a->n_st == a->cap_st) {
        int cap = a->cap_st ? 2 * a->cap_st : 1024;
        as_strat *v = hp_realloc(a->st, (size_t)cap * sizeof *v);
        if (!v) return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
        a->st = v;
        a->cap_st = cap;
    }
    a->st[a->n_st++] = *s;
    return HP_OK;
}

static void all_replicate(as_strat *s) {
    memset(s, 0, sizeof *s); /* HP_PLACE_REPLICATE is 0 */
    s->vocab_dim = -1;
}

/* Placeholder p's strategies. */
static hp_status placeholder_strats(enum_ctx *e, int c, hp_err *err) {
    hp_autoshard *a = e->a;
    as_class *cl = &a->cls[c];
    int p = cl->rep, nd = a->mesh.ndim;
    const hp_node *n = &a->g->nodes[p];
    const hp_type *t = &n->out[0];
    const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
    bool param = p < a->v.n_params, data = p >= a->v.n_params + a->v.n_buffers;
    cl->placeholder = true;
    cl->param = param;
    cl->data = data;
    cl->bytes = (double)hp_type_numel(t) * (double)hp_dtype_size(t->dtype);
    int dp = -1;
    for (int i = 0; i < nd; i++)
        if (!strcmp(a->mesh.name[i], "dp") && a->mesh.size[i] > 1) dp = i;
    int k = e->constraint[p];
    if (data) {
        as_strat s;
        all_replicate(&s);
        if (dp >= 0 && t->rank >= 1) {
            if (t->shape[0] % a->mesh.size[dp])
                return hp_errf(err, HP_INVALID,
                               "data input '%s': batch %lld does not split over the %lld ranks "
                               "of mesh dim dp",
                               fqn && fqn->s ? fqn->s : "?", (long long)t->shape[0],
                               (long long)a->mesh.size[dp]);
            s.out[0][dp] = s.store[dp] = HP_SHARD(0);
            cl->bound_by = -3;
        }
        return add_strat(a, &s, err);
    }
    /* per mesh dim: 0 Replicate, 1 + 2d Shard(d) computed Shard(d), 2 + 2d Shard(d) gathered */
    int opts = 1 + 2 * t->rank, idx[HP_MESH_MAX_DIMS] = {0};
    int64_t combos = 1;
    for (int i = 0; i < nd; i++) combos *= a->mesh.size[i] > 1 ? opts : 1;
    for (int64_t m = 0; m < combos; m++) {
        int64_t r = m;
        for (int i = nd - 1; i >= 0; i--) {
            int o = a->mesh.size[i] > 1 ? opts : 1;
            idx[i] = (int)(r % o);
            r /= o;
        }
        as_strat s;
        all_replicate(&s);
        bool ok = true, gathered = false;
        for (int i = 0; i < nd && ok; i++) {
            if (!idx[i]) continue;
            int d = (idx[i] - 1) / 2;
            bool gath = (idx[i] - 1) % 2 == 1;
            s.store[i] = HP_SHARD(d);
            s.out[0][i] = gath ? HP_REPLICATE : HP_SHARD(d);
            gathered |= gath;
            for (int j = 0; j < i; j++) /* a tensor dim split by one mesh dim at most */
                if (s.store[j].kind == HP_PLACE_SHARD && s.store[j].dim == d) ok = false;
        }
        if (!ok) continue;
        /* compute splits even; a gathered storage split may be uneven (padded) */
        for (int i = 0; i < nd && ok; i++) {
            if (s.out[0][i].kind != HP_PLACE_SHARD) continue;
            if (extent_without(a, t, s.out[0], s.out[0][i].dim, i) % a->mesh.size[i]) ok = false;
        }
        if (!ok) continue;
        bool fsdp = param && e->marked[p] && dp >= 0 && t->rank > 0;
        if (k >= 0) { /* a constraint fixes the storage */
            const hp_place_constraint *pc = &e->job->plan.constraints[k];
            for (int i = 0; i < nd && ok; i++) {
                hp_placement want = a->mesh.size[i] == 1 ? HP_REPLICATE : pc->placements[i];
                /* a marked parameter the constraint leaves Replicate on dp is stored split
                 * there, the dim free, as the hand-written plan does (passes/pipeline.c):
                 * --tp-plan with --fsdp means FSDP over dp and TP over tp in either mode */
                if (fsdp && i == dp && want.kind == HP_PLACE_REPLICATE) continue;
                ok = hp_placement_eq(want, s.store[i]);
            }
        }
        if (fsdp) /* FSDP: stored split, gathered */
            ok =
                ok && s.store[dp].kind == HP_PLACE_SHARD && s.out[0][dp].kind == HP_PLACE_REPLICATE;
        if (!ok) continue;
        double g = gathered ? hp__as_move(a, t, s.store, s.out[0]) : 0;
        if (!isfinite(g)) continue;
        int regions = a->v.reshard ? e->fwd_use[p] + e->bwd_use[p] : 1;
        s.gather_s = g * (regions ? regions : 1);
        if (param) {
            /* the budget counts the split bytes, padding aside (a 1/N budget is FSDP's) */
            s.mem_bytes = cl->bytes;
            for (int i = 0; i < nd; i++)
                if (s.store[i].kind == HP_PLACE_SHARD) s.mem_bytes /= (double)a->mesh.size[i];
            s.opt_s = s.mem_bytes / (double)hp_dtype_size(t->dtype) * 28.0 / a->prof.mem_bw;
        }
        HP_TRY(add_strat(a, &s, err));
    }
    if (k >= 0) cl->bound_by = k;
    if (param && e->marked[p] && dp >= 0 && t->rank > 0) cl->bound_by = -2;
    return HP_OK;
}

typedef struct node_enum {
    enum_ctx *e;
    const hp_node *n; /* the node as enumerated (a chunked embedding's 3-input form) */
    int ni;
    const hp_type *gin; /* [ni] global */
    as_strat cur;
    int vocab; /* the mesh dim run vocab-parallel, -1 */
    int chunk; /* 0 plain, 1 chunked forward, 2 chunked backward */
    int c;
    int count;
} node_enum;

static hp_status rec(node_enum *ne, int i, hp_err *err) {
    hp_autoshard *a = ne->e->a;
    int nd = a->mesh.ndim;
    const hp_node *n = ne->n;
    if (i == nd) {
        if (ne->chunk && ne->vocab < 0) return HP_OK; /* the plain form enumerates those */
        if (ne->count++ >= AS_MAX_STRATS) return HP_OK;
        as_strat s = ne->cur;
        s.vocab_dim = ne->vocab;
        s.compute_s = node_cost(a, n, ne->gin, &s, ne->ni);
        return add_strat(a, &s, err);
    }
    if (a->mesh.size[i] == 1) return rec(ne, i + 1, err);
    const hp_op_info *info = hp_op_get(n->op);
    hp_type it[AS_MAX_IN + 8], ot[HP_MAX_OUTS];
    int nq = ne->ni < (int)HP_ARRAY_LEN(it) ? ne->ni : (int)HP_ARRAY_LEN(it);
    for (int j = 0; j < nq; j++)
        it[j] = split_type(a, &ne->gin[j], ne->cur.in[j < AS_MAX_IN ? j : 0], i);
    for (int k = 0; k < n->n_out; k++) ot[k] = split_type(a, &n->out[k], ne->cur.out[k], i);
    hp_shard_rule rules[HP_SHARD_MAX_RULES + 1];
    int nr = 0;
    if (info->shard && ne->ni <= (int)HP_ARRAY_LEN(it)) {
        hp_shard_query q = {.node = n,
                            .in = it,
                            .out = ot,
                            .mesh_size = a->mesh.size[i],
                            .mesh_dim = a->mesh.name[i]};
        nr = info->shard(&q, rules, HP_SHARD_MAX_RULES);
        if (nr > HP_SHARD_MAX_RULES) nr = HP_SHARD_MAX_RULES;
    }
    memset(&rules[nr++], 0, sizeof rules[0]); /* all Replicate */
    bool variadic = info->n_in == HP_VARIADIC;
    for (int r = 0; r < nr; r++) {
        bool vocab_rule = ne->chunk && rules[r].in[2].kind == HP_PLACE_SHARD;
        if (ne->chunk && !vocab_rule && ne->ni >= 3 && rules[r].in[2].kind != HP_PLACE_REPLICATE)
            continue;
        if (vocab_rule && ne->vocab >= 0) continue; /* one vocab-parallel dim */
        int saved = ne->vocab;
        if (vocab_rule) ne->vocab = i;
        for (int j = 0; j < ne->ni && j < AS_MAX_IN; j++)
            ne->cur.in[j][i] = variadic || j >= HP_SHARD_MAX_IN ? rules[r].in[0] : rules[r].in[j];
        for (int k = 0; k < n->n_out; k++) ne->cur.out[k][i] = rules[r].out[k];
        hp_status st = rec(ne, i + 1, err);
        ne->vocab = saved;
        HP_TRY(st);
    }
    for (int j = 0; j < ne->ni && j < AS_MAX_IN; j++) ne->cur.in[j][i] = HP_REPLICATE;
    for (int k = 0; k < n->n_out; k++) ne->cur.out[k][i] = HP_REPLICATE;
    return HP_OK;
}

static hp_status node_strats(enum_ctx *e, int c, hp_err *err) {
    hp_autoshard *a = e->a;
    int id = a->cls[c].rep;
    const hp_node *n = &a->g->nodes[id];
    int ni = n->n_in;
    hp_type *gin = hp_malloc((size_t)(ni + 3) * sizeof *gin);
    if (!gin) return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    for (int j = 0; j < ni; j++) gin[j] = *hp_graph_type(a->g, n->in[j]);
    node_enum ne = {.e = e, .n = n, .ni = ni, .gin = gin, .vocab = -1, .c = c};
    all_replicate(&ne.cur);
    hp_status st = rec(&ne, 0, err);
    /* vocab-parallel forms: an embedding with weight and chunk base Shard(0), the gradient of
     * its weight computed per chunk of rows */
    bool fwd = n->op == HP_OP_EMBEDDING;
    bool bwd =
        n->op == HP_OP_EMBEDDING_DENSE_BACKWARD && hp_node_int(n, HP_ATTR_PADDING_IDX, -1) < 0;
    for (int i = 0; st == HP_OK && (fwd || bwd) && i < a->mesh.ndim; i++) {
        if (a->mesh.size[i] < 2) continue;
        int64_t vocab = fwd ? gin[0].shape[0] : hp_node_int(n, HP_ATTR_NUM_WEIGHTS, 0);
        if (vocab <= 0 || vocab % a->mesh.size[i]) continue;
        hp_node chunked = *n;
        hp_attr nw = hp_attr_int(HP_ATTR_NUM_WEIGHTS, vocab);
        chunked.op = fwd ? HP_OP_CHUNKED_EMBEDDING : HP_OP_CHUNKED_EMBEDDING_BACKWARD;
        chunked.n_in = 3;
        chunked.n_attrs = fwd ? 0 : 1;
        chunked.attrs = &nw;
        /* the base: globally one chunk start per rank of mesh dim i (f32 like spmd's) */
        gin[2] = hp_type_make(gin[1].dtype, 1, (int64_t[]){a->mesh.size[i]});
        node_enum cn = {
            .e = e, .n = &chunked, .ni = 3, .gin = gin, .vocab = -1, .c = c, .chunk = fwd ? 1 : 2};
        all_replicate(&cn.cur);
        int before = a->n_st;
        st = rec(&cn, 0, err);
        /* keep the forms vocab-parallel on dim i only */
        int w = before;
        for (int s = before; st == HP_OK && s < a->n_st; s++)
            if (a->st[s].vocab_dim == i) a->st[w++] = a->st[s];
        a->n_st = w;
    }
    hp_free(gin);
    return st;
}

/* ---- edges --------------------------------------------------------------------------------- */

const hp_placement *hp__as_want(const hp_autoshard *a, int cv, const as_strat *s, int j) {
    const hp_node *n = &a->g->nodes[a->cls[cv].rep];
    bool variadic = hp_op_get(n->op)->n_in == HP_VARIADIC;
    return s->in[variadic || j >= HP_SHARD_MAX_IN ? 0 : j];
}

typedef struct edge_key {
    int cu, k, cv, j;
} edge_key;

static int group_of(const hp_placement (*groups)[HP_MESH_MAX_DIMS * 2], int n,
                    const hp_placement *pl, int width) {
    for (int g = 0; g < n; g++) {
        bool eq = true;
        for (int i = 0; i < width && eq; i++) eq = hp_placement_eq(groups[g][i], pl[i]);
        if (eq) return g;
    }
    return -1;
}

/* Groups the placements strategies [s0, s0 + ns) give (pick) into of[], returns the count;
 * groups[] holds each group's placements (width entries). */
typedef const hp_placement *(*pick_fn)(const hp_autoshard *a, int c, const as_strat *s, int arg,
                                       hp_placement *tmp);

static int make_groups(const hp_autoshard *a, int c, int arg, pick_fn pick, int width,
                       hp_placement (*groups)[HP_MESH_MAX_DIMS * 2], int *of) {
    const as_class *cl = &a->cls[c];
    int n = 0;
    for (int s = 0; s < cl->n_strat; s++) {
        hp_placement tmp[HP_MESH_MAX_DIMS * 2];
        const hp_placement *pl = pick(a, c, &a->st[cl->strat0 + s], arg, tmp);
        int g = group_of(groups, n, pl, width);
        if (g < 0) {
            g = n++;
            memcpy(groups[g], pl, sizeof(hp_placement) * (size_t)width);
        }
        of[s] = g;
    }
    return n;
}

static const hp_placement *pick_out(const hp_autoshard *a, int c, const as_strat *s, int k,
                                    hp_placement *tmp) {
    (void)a, (void)c, (void)tmp;
    return s->out[k];
}
static const hp_placement *pick_in(const hp_autoshard *a, int c, const as_strat *s, int j,
                                   hp_placement *tmp) {
    (void)tmp;
    return hp__as_want(a, c, s, j);
}
static const hp_placement *pick_param(const hp_autoshard *a, int c, const as_strat *s, int k,
                                      hp_placement *tmp) {
    (void)c, (void)k;
    memcpy(tmp, s->store, sizeof(hp_placement) * (size_t)a->mesh.ndim);
    memcpy(tmp + a->mesh.ndim, s->out[0], sizeof(hp_placement) * (size_t)a->mesh.ndim);
    return tmp;
}

/* Seconds to bring a gradient placed have to parameter storage st computed cp (spmd's
 * grad_to_storage: a Partial kept on the gathered dims, the compute placements elsewhere, then
 * the storage). */
static double grad_cost(const hp_autoshard *a, const hp_type *t, const hp_placement *have,
                        const hp_placement *st, const hp_placement *cp) {
    int nd = a->mesh.ndim;
    bool gathered = false;
    hp_placement pre[HP_MESH_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        pre[i] = cp[i];
        if (!hp_placement_eq(st[i], cp[i])) {
            gathered = true;
            if (have[i].kind == HP_PLACE_PARTIAL && have[i].reduce != HP_REDUCE_MAX)
                pre[i] = have[i];
        }
    }
    if (!gathered) return hp__as_move(a, t, have, st);
    /* the gathered storage may be uneven: the gradient is padded before the reduce-scatter */
    hp_type padded = *t;
    for (int i = 0; i < nd; i++)
        if (!hp_placement_eq(st[i], cp[i]) && st[i].dim < padded.rank) {
            int64_t m = a->mesh.size[i], *len = &padded.shape[st[i].dim];
            *len = (*len + m - 1) / m * m;
        }
    return hp__as_move(a, t, have, pre) + hp__as_move(a, &padded, pre, st);
}

static hp_status build_edge(hp_autoshard *a, as_edge *e, hp_err *err) {
    const as_class *u = &a->cls[e->cu], *v = &a->cls[e->cv];
    int nd = a->mesh.ndim;
    hp_placement(*pg)[HP_MESH_MAX_DIMS * 2] = hp_malloc((size_t)u->n_strat * sizeof *pg);
    hp_placement(*qg)[HP_MESH_MAX_DIMS * 2] = hp_malloc((size_t)v->n_strat * sizeof *qg);
    e->p_of = hp_malloc((size_t)u->n_strat * sizeof *e->p_of);
    e->q_of = hp_malloc((size_t)v->n_strat * sizeof *e->q_of);
    hp_status st =
        pg && qg && e->p_of && e->q_of ? HP_OK : hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    if (st == HP_OK) {
        e->n_p = make_groups(a, e->cu, e->k, pick_out, nd, pg, e->p_of);
        e->n_q = e->j == AS_EDGE_GRAD ? make_groups(a, e->cv, 0, pick_param, 2 * nd, qg, e->q_of)
                                      : make_groups(a, e->cv, e->j, pick_in, nd, qg, e->q_of);
        e->cost = hp_malloc((size_t)e->n_p * (size_t)e->n_q * sizeof *e->cost);
        if (!e->cost) st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    }
    for (int p = 0; st == HP_OK && p < e->n_p; p++)
        for (int q = 0; q < e->n_q; q++)
            e->cost[p * e->n_q + q] = e->j == AS_EDGE_GRAD
                                          ? grad_cost(a, &e->type, pg[p], qg[q], qg[q] + nd)
                                          : hp__as_move(a, &e->type, pg[p], qg[q]);
    hp_free(pg);
    hp_free(qg);
    return st;
}

static hp_status add_edge(hp_autoshard *a, int *table, int cap, edge_key key, const hp_type *t,
                          hp_err *err) {
    uint64_t h = ((uint64_t)(uint32_t)key.cu * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)(uint32_t)key.cv * 0xC2B2AE3D27D4EB4Full) ^
                 ((uint64_t)(uint32_t)(key.k * 64 + key.j + 8) * 0x165667B19E3779F9ull);
    int at = (int)((h ^ (h >> 31)) & (uint64_t)(cap - 1));
    for (; table[at]; at = (at + 1) & (cap - 1)) {
        as_edge *e = &a->edges[table[at] - 1];
        if (e->cu == key.cu && e->k == key.k && e->cv == key.cv && e->j == key.j) {
            e->count++;
            return HP_OK;
        }
    }
    as_edge *e = &a->edges[a->n_edges++];
    *e = (as_edge){.cu = key.cu, .k = key.k, .cv = key.cv, .j = key.j, .count = 1, .type = *t};
    table[at] = a->n_edges;
    (void)err;
    return HP_OK;
}

static hp_status collect_edges(hp_autoshard *a, hp_err *err) {
    const hp_graph *g = a->g;
    int64_t ne = g->n_outputs;
    for (int i = 0; i < g->n_nodes; i++) ne += g->nodes[i].n_in;
    int cap = 1;
    while (cap < 2 * ne + 16) cap *= 2;
    int *table = hp_calloc((size_t)cap, sizeof *table);
    a->edges = hp_calloc((size_t)ne + 1, sizeof *a->edges);
    if (!table || !a->edges) {
        hp_free(table);
        return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    }
    hp_status st = HP_OK;
    for (int i = a->v.n_ph; i < g->n_nodes && st == HP_OK; i++) {
        const hp_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in && st == HP_OK; j++) {
            hp_value u = n->in[j];
            edge_key key = {a->cls_of[u.node], u.out, a->cls_of[i], j};
            st = add_edge(a, table, cap, key, hp_graph_type(g, u), err);
        }
    }
    for (int k = 1; k <= a->v.n_params && k < g->n_outputs && st == HP_OK; k++) {
        hp_value u = g->outputs[k];
        edge_key key = {a->cls_of[u.node], u.out, a->cls_of[k - 1], AS_EDGE_GRAD};
        st = add_edge(a, table, cap, key, hp_graph_type(g, u), err);
    }
    hp_free(table);
    for (int e = 0; e < a->n_edges && st == HP_OK; e++) st = build_edge(a, &a->edges[e], err);
    return st;
}

/* ---- the whole enumeration ----------------------------------------------------------------- */

static hp_status prepare(enum_ctx *e, hp_err *err) {
    hp_autoshard *a = e->a;
    const hp_graph *g = a->g;
    const hp_plan *p = &e->job->plan;
    int nn = g->n_nodes, no = g->n_outputs;
    e->marked = hp_calloc((size_t)a->v.n_params + 1, sizeof *e->marked);
    e->constraint = hp_malloc(((size_t)a->v.n_ph + 1) * sizeof *e->constraint);
    e->out_k = hp_malloc(((size_t)nn + 1) * sizeof *e->out_k);
    e->out_next = hp_malloc(((size_t)no + 1) * sizeof *e->out_next);
    e->fwd_use = hp_calloc((size_t)a->v.n_ph + 1, sizeof *e->fwd_use);
    e->bwd_use = hp_calloc((size_t)a->v.n_ph + 1, sizeof *e->bwd_use);
    if (!e->marked || !e->constraint || !e->out_k || !e->out_next || !e->fwd_use || !e->bwd_use)
        return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    if (p->n_fsdp_fqns > 0)
        HP_TRY(hp_plan_mark_names(g, p->fsdp_fqns, p->n_fsdp_fqns, e->marked, err));
    for (int k = 0; k < p->n_fsdp_patterns; k++)
        for (int i = 0; i < a->v.n_params; i++) {
            const hp_attr *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
            if (fqn && fqn->s && hp_fqn_match(p->fsdp_patterns[k], fqn->s)) e->marked[i] = true;
        }
    for (int i = 0; i < a->v.n_ph; i++) {
        const hp_attr *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        e->constraint[i] = hp_plan_constraint_for(&e->job->plan, fqn ? fqn->s : NULL);
    }
    for (int i = 0; i < nn; i++) e->out_k[i] = -1;
    for (int k = no - 1; k >= 0; k--) {
        int u = g->outputs[k].node;
        e->out_next[k] = e->out_k[u];
        e->out_k[u] = k;
    }
    /* which regions read each placeholder, directly or through a forward view */
    for (int i = a->v.n_ph; i < nn; i++) {
        const hp_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int u = n->in[j].node;
            if (u >= a->v.n_ph && g->nodes[u].n_in == 1 &&
                (hp_op_get(g->nodes[u].op)->flags & HP_OPF_VIEW))
                u = g->nodes[u].in[0].node;
            if (u >= a->v.n_ph) continue;
            if (i > a->v.loss)
                e->bwd_use[u] = true;
            else
                e->fwd_use[u] = true;
        }
    }
    return HP_OK;
}

hp_status hp__as_enumerate(hp_autoshard *a, const hp_job *job, hp_err *err) {
    enum_ctx e = {.a = a, .job = job};
    a->cls_of = hp_malloc(((size_t)a->g->n_nodes + 1) * sizeof *a->cls_of);
    hp_status st =
        a->cls_of ? prepare(&e, err) : hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    if (st == HP_OK) st = classify(&e, err);
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) {
        as_class *cl = &a->cls[c];
        cl->strat0 = a->n_st;
        st = cl->rep < a->v.n_ph ? placeholder_strats(&e, c, err) : node_strats(&e, c, err);
        cl->n_strat = a->n_st - cl->strat0;
        if (st == HP_OK && cl->n_strat == 0) {
            const hp_attr *fqn = hp_node_attr(&a->g->nodes[cl->rep], HP_ATTR_FQN);
            if (cl->bound_by >= 0)
                st = hp_errf(err, HP_INVALID,
                             "plan.constraints[%d] (%s) cannot be met: '%s' has no valid "
                             "placement that equals it",
                             cl->bound_by, a->constraint_text[cl->bound_by],
                             fqn && fqn->s ? fqn->s : "?");
            else if (cl->bound_by == -2)
                st = hp_errf(err, HP_INVALID,
                             "the FSDP mark on '%s' cannot be met: no split of it over dp is "
                             "valid",
                             fqn && fqn->s ? fqn->s : "?");
            else
                st = hp_errf(err, HP_INTERNAL, "autoshard: node %d (%s) has no strategy", cl->rep,
                             hp_op_get(a->g->nodes[cl->rep].op)->name);
        }
    }
    /* the loss is brought to Replicate */
    if (st == HP_OK && a->g->n_outputs > 0) {
        hp_value l = a->g->outputs[0];
        const as_class *cl = &a->cls[a->cls_of[l.node]];
        hp_placement rep[HP_MESH_MAX_DIMS] = {0};
        for (int s = 0; s < cl->n_strat; s++) {
            as_strat *x = &a->st[cl->strat0 + s];
            x->loss_s = hp__as_move(a, hp_graph_type(a->g, l), x->out[l.out], rep) / cl->count;
        }
    }
    if (st == HP_OK) st = collect_edges(a, err);
    hp_free(e.marked);
    hp_free(e.constraint);
    hp_free(e.out_k);
    hp_free(e.out_next);
    hp_free(e.fwd_use);
    hp_free(e.bwd_use);
    return st;
}
