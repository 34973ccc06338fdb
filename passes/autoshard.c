/* passes/autoshard.c — auto-sharding: solve (enumerate, price, ILP), apply (the spmd pass with
 * the chosen strategies), explain, and the pipeline's pass for plan.mode auto
 * (hp/autoshard.h, docs/autoshard.md).
 */
#include "passes/autoshard_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hp_autoshard_free(hp_autoshard *a) {
    if (!a) return;
    for (int e = 0; a->edges && e < a->n_edges; e++) {
        hp_free(a->edges[e].p_of);
        hp_free(a->edges[e].q_of);
        hp_free(a->edges[e].cost);
    }
    hp_free(a->edges);
    hp__as_unfold(a);
    hp_free(a->cls);
    hp_free(a->cls_of);
    hp_free(a->st);
    hp_free(a->constraint_text);
    hp_graph_free(a->g);
    hp_free(a);
}

hp_status hp_autoshard_solve(const hp_graph *g, const hp_job *job, const hp_device_profile *profile,
                             const hp_autoshard_opts *opts, hp_autoshard **out, hp_err *err) {
    *out = NULL;
    if (g->mesh.ndim) return hp_errf(err, HP_INVALID, "autoshard: the graph is already placed");
    const hp_plan *p = &job->plan;
    if (p->n_mesh < 1) return hp_errf(err, HP_INVALID, "autoshard: the plan has no mesh");
    hp_autoshard *a = hp_calloc(1, sizeof *a);
    if (!a) return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    double t0 = now_s();
    a->g = hp_graph_clone(g);
    a->prof = *profile;
    a->mesh.ndim = p->n_mesh;
    for (int d = 0; d < p->n_mesh; d++) {
        snprintf(a->mesh.name[d], sizeof a->mesh.name[d], "%s", p->mesh[d].name);
        a->mesh.size[d] = p->mesh[d].size;
    }
    hp_device_profile_links(&a->prof, job, a->link);
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    a->v.n_params = gi.n_params;
    a->v.n_buffers = gi.n_buffers;
    a->v.n_data = gi.n_data;
    a->v.n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    a->v.loss = g->n_outputs ? g->outputs[0].node : g->n_nodes;
    a->v.reshard = p->reshard_after_forward;
    a->v.mem_low = p->mem_low;
    a->v.mem_high = p->mem_high;
    for (int i = 0; i < gi.n_params; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        a->v.total_param_bytes += (double)hp_type_numel(t) * (double)hp_dtype_size(t->dtype);
    }
    a->n_constraints = p->n_constraints;
    a->constraint_text = hp_calloc((size_t)p->n_constraints + 1, sizeof *a->constraint_text);
    hp_status st =
        a->g && a->constraint_text ? HP_OK : hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    for (int k = 0; k < p->n_constraints && st == HP_OK; k++) {
        const hp_place_constraint *c = &p->constraints[k];
        int n = snprintf(a->constraint_text[k], sizeof a->constraint_text[k],
                         "%.100s=", c->input_fqn ? c->input_fqn : "(output)");
        for (int d = 0; d < c->n_placements && n < (int)sizeof a->constraint_text[k]; d++) {
            char w[24];
            n += snprintf(a->constraint_text[k] + n, sizeof a->constraint_text[k] - (size_t)n,
                          "%s%s", d ? "," : "", hp_placement_short(&c->placements[d], w, sizeof w));
        }
    }
    if (st == HP_OK) st = hp__as_enumerate(a, job, err);
    if (st == HP_OK) st = hp__as_fold(a, true, err);
    a->stats.enumerate_s = now_s() - t0;
    a->stats.nodes = g->n_nodes;
    a->stats.classes = a->n_cls;
    a->stats.strategies = a->n_st;
    bool solved = false;
    if (st == HP_OK) st = hp__as_ilp(a, opts, err), solved = true;
    if (solved && !a->stats.lp_timed_out &&
        (st == HP_UNSUPPORTED || st == HP_LIMIT || st == HP_INVALID)) {
        /* A follower takes its cheapest placement given its leader's; that greedy choice can
         * leave no way on (an expand of a replicated value split over one tensor dim by two
         * mesh dims, which nothing redistributes): every class decides, once more. */
        hp_err again = {0};
        hp__as_unfold(a);
        double t1 = now_s();
        hp_status st2 = hp__as_fold(a, false, &again);
        a->stats.enumerate_s += now_s() - t1;
        if (st2 == HP_OK) st2 = hp__as_ilp(a, opts, &again);
        /* a named budget or constraint stays the reason; else the plain problem's */
        if (st2 != HP_OK && st != HP_INVALID && err) *err = again;
        if (st2 == HP_OK || st != HP_INVALID) st = st2;
        a->stats.refolded = true;
    }
    if (st != HP_OK) {
        hp_err_prefix(err, "autoshard");
        if (!strncmp(err->msg, "autoshard: autoshard: ", 22))
            memmove(err->msg, err->msg + 11, strlen(err->msg + 11) + 1);
        hp_autoshard_free(a);
        return st;
    }
    *out = a;
    return HP_OK;
}

const hp_autoshard_stats *hp_autoshard_get_stats(const hp_autoshard *a) {
    return &a->stats;
}

static const as_strat *chosen(const hp_autoshard *a, int node) {
    const as_class *cl = &a->cls[a->cls_of[node]];
    return &a->st[cl->strat0 + cl->chosen];
}

bool hp_autoshard_placeholder(const hp_autoshard *a, int i, hp_placement *storage,
                              hp_placement *compute) {
    if (i < 0 || i >= a->v.n_ph) return false;
    const as_strat *s = chosen(a, i);
    memcpy(storage, s->store, sizeof(hp_placement) * (size_t)a->mesh.ndim);
    memcpy(compute, s->out[0], sizeof(hp_placement) * (size_t)a->mesh.ndim);
    return true;
}

void hp_autoshard_breakdown(const hp_autoshard *a, double *compute_s, double *comm_s,
                            double *optimizer_s) {
    double c = 0, m = 0, o = 0;
    for (int k = 0; k < a->n_cls; k++) {
        const as_class *cl = &a->cls[k];
        const as_strat *s = &a->st[cl->strat0 + cl->chosen];
        c += cl->count * s->compute_s;
        m += cl->count * (s->gather_s + s->loss_s);
        o += cl->count * s->opt_s;
    }
    for (int e = 0; e < a->n_edges; e++) {
        const as_edge *ed = &a->edges[e];
        int p = ed->p_of[a->cls[ed->cu].chosen], q = ed->q_of[a->cls[ed->cv].chosen];
        m += ed->count * ed->cost[p * ed->n_q + q];
    }
    *compute_s = c;
    *comm_s = m;
    *optimizer_s = o;
}

/* ---- apply --------------------------------------------------------------------------------- */

static hp_status choose_cb(void *ctx, int id, hp_placement *in_pl, hp_placement *out_pl,
                           int *vocab_dim, hp_err *err) {
    const hp_autoshard *a = ctx;
    if (id < 0 || id >= a->g->n_nodes)
        return hp_errf(err, HP_INTERNAL, "autoshard: node %d is not in the solved graph", id);
    const as_class *cl = &a->cls[a->cls_of[id]];
    const as_strat *s = &a->st[cl->strat0 + cl->chosen];
    const hp_node *n = &a->g->nodes[id];
    int nd = a->mesh.ndim, ni = s->vocab_dim >= 0 ? 3 : n->n_in;
    for (int j = 0; j < ni; j++)
        memcpy(in_pl + (size_t)j * (size_t)nd,
               s->vocab_dim >= 0 ? s->in[j] : hp__as_want(a, a->cls_of[id], s, j),
               sizeof(hp_placement) * (size_t)nd);
    for (int k = 0; k < n->n_out; k++)
        memcpy(out_pl + (size_t)k * (size_t)nd, s->out[k], sizeof(hp_placement) * (size_t)nd);
    *vocab_dim = s->vocab_dim;
    return HP_OK;
}

hp_status hp_autoshard_apply(const hp_autoshard *a, hp_graph **out, hp_err *err) {
    int nd = a->mesh.ndim;
    size_t n = (size_t)(a->v.n_ph ? a->v.n_ph : 1) * (size_t)nd;
    hp_placement *store = hp_calloc(n, sizeof *store), *compute = hp_calloc(n, sizeof *compute);
    if (!store || !compute) {
        hp_free(store);
        hp_free(compute);
        return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    }
    for (int i = 0; i < a->v.n_ph; i++)
        hp_autoshard_placeholder(a, i, store + (size_t)i * (size_t)nd,
                                 compute + (size_t)i * (size_t)nd);
    hp_spmd_opts o = {.compute = compute,
                      .reshard_after_forward = a->v.reshard,
                      .choose = choose_cb,
                      .choose_ctx = (void *)a};
    double t0 = now_s();
    hp_status st = hp_pass_spmd_ex(a->g, &a->mesh, store, NULL, &o, out, err);
    ((hp_autoshard *)a)->stats.apply_s = now_s() - t0;
    hp_free(store);
    hp_free(compute);
    return st;
}

/* ---- explain ------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void __attribute__((format(printf, 2, 3))) sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? 2 * b->cap : 1024) + (size_t)k;
        char *s = hp_realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void sb_pl(sbuf *b, const hp_placement *pl, int nd, const hp_graph_mesh *m) {
    sb_printf(b, "(");
    for (int i = 0; i < nd; i++) {
        char w[24];
        sb_printf(b, "%s%s:%s", i ? ", " : "", m->name[i], hp_placement_short(&pl[i], w, sizeof w));
    }
    sb_printf(b, ")");
}

/* Strategy s of class c against the rest of the plan as chosen: its own costs and each
 * incident edge's. */
typedef struct alt {
    int s;
    double total, unary, edges, mem;
    bool feasible;
} alt;

static alt price(const hp_autoshard *a, int c, int s) {
    const as_class *cl = &a->cls[c];
    const as_strat *x = &a->st[cl->strat0 + s];
    alt r = {.s = s, .unary = cl->count * hp__as_unary(x), .mem = x->mem_bytes, .feasible = true};
    for (int e = 0; e < a->n_edges; e++) {
        const as_edge *ed = &a->edges[e];
        if (ed->cu != c && ed->cv != c) continue;
        int su = ed->cu == c ? s : a->cls[ed->cu].chosen,
            sv = ed->cv == c ? s : a->cls[ed->cv].chosen;
        double k = ed->count * ed->cost[ed->p_of[su] * ed->n_q + ed->q_of[sv]];
        if (!isfinite(k)) r.feasible = false;
        r.edges += k;
    }
    r.total = r.unary + r.edges;
    return r;
}

static int cmp_alt(const void *x, const void *y) {
    const alt *a = x, *b = y;
    if (a->total != b->total) return a->total < b->total ? -1 : 1;
    return a->s - b->s;
}

static void describe(sbuf *b, const hp_autoshard *a, int c, const alt *r, bool detail) {
    const as_class *cl = &a->cls[c];
    const as_strat *x = &a->st[cl->strat0 + r->s];
    int nd = a->mesh.ndim;
    const hp_node *n = &a->g->nodes[cl->rep];
    if (cl->placeholder) {
        sb_printf(b, "stored ");
        sb_pl(b, x->store, nd, &a->mesh);
        sb_printf(b, " computed ");
        sb_pl(b, x->out[0], nd, &a->mesh);
    } else {
        for (int j = 0; j < n->n_in; j++) {
            sb_printf(b, "%sin%d ", j ? " " : "", j);
            sb_pl(b, hp__as_want(a, c, x, j), nd, &a->mesh);
        }
        for (int k = 0; k < n->n_out; k++) {
            sb_printf(b, " -> out%d ", k);
            sb_pl(b, x->out[k], nd, &a->mesh);
        }
        if (x->vocab_dim >= 0) sb_printf(b, " vocab-parallel on %s", a->mesh.name[x->vocab_dim]);
    }
    if (!r->feasible) {
        sb_printf(b, "\n      not valid with the rest of the plan (no redistribution offered)\n");
        return;
    }
    sb_printf(b, "\n      cost %.3f ms = compute %.3f + gather %.3f + optimizer %.3f",
              r->total * 1e3, cl->count * x->compute_s * 1e3, cl->count * x->gather_s * 1e3,
              cl->count * x->opt_s * 1e3);
    if (x->loss_s > 0) sb_printf(b, " + loss %.3f", cl->count * x->loss_s * 1e3);
    sb_printf(b, " + redistributions %.3f", r->edges * 1e3);
    if (cl->param) sb_printf(b, "; holds %.4g MB per rank", x->mem_bytes * cl->count / 1e6);
    sb_printf(b, "\n");
    if (!detail) return;
    for (int e = 0; e < a->n_edges; e++) {
        const as_edge *ed = &a->edges[e];
        if (ed->cu != c && ed->cv != c) continue;
        int su = ed->cu == c ? r->s : a->cls[ed->cu].chosen;
        int sv = ed->cv == c ? r->s : a->cls[ed->cv].chosen;
        double k = ed->count * ed->cost[ed->p_of[su] * ed->n_q + ed->q_of[sv]];
        if (k <= 0) continue;
        const hp_node *u = &a->g->nodes[a->cls[ed->cu].rep], *v = &a->g->nodes[a->cls[ed->cv].rep];
        sb_printf(b, "        %.3f ms: %%%d (%s) -> %s%%%d (%s)%s x%d\n", k * 1e3,
                  a->cls[ed->cu].rep, hp_op_get(u->op)->name,
                  ed->j == AS_EDGE_GRAD ? "gradient of " : "", a->cls[ed->cv].rep,
                  hp_op_get(v->op)->name, "", ed->count);
    }
}

static int find(const hp_autoshard *a, const char *what) {
    for (int i = 0; i < a->v.n_ph; i++) {
        const hp_attr *fqn = hp_node_attr(&a->g->nodes[i], HP_ATTR_FQN);
        if (fqn && fqn->s && !strcmp(fqn->s, what)) return i;
    }
    const char *s = what[0] == '%' ? what + 1 : what;
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end && v >= 0 && v < a->g->n_nodes) return (int)v;
    return -1;
}

hp_status hp_autoshard_explain(const hp_autoshard *a, const char *what, char **text, hp_err *err) {
    *text = NULL;
    int id = find(a, what);
    if (id < 0)
        return hp_errf(err, HP_NOT_FOUND,
                       "explain: '%.200s' is neither a parameter, buffer or input FQN nor a node "
                       "id of the graph (0..%d)",
                       what, a->g->n_nodes - 1);
    int c = a->cls_of[id];
    const as_class *cl = &a->cls[c];
    alt *alts = hp_malloc((size_t)cl->n_strat * sizeof *alts);
    if (!alts) return hp_errf(err, HP_NOMEM, "out of memory");
    for (int s = 0; s < cl->n_strat; s++) alts[s] = price(a, c, s);
    alt mine = alts[cl->chosen];
    qsort(alts, (size_t)cl->n_strat, sizeof *alts, cmp_alt);
    sbuf b = {0};
    const hp_node *n = &a->g->nodes[id];
    sb_printf(&b, "%s (node %d, %s): decided with %d node(s) like it, %d candidate strategies\n",
              what, id, hp_op_get(n->op)->name, cl->count, cl->n_strat);
    sb_printf(&b, "  chosen: ");
    describe(&b, a, c, &mine, true);
    int shown = 0;
    for (int k = 0; k < cl->n_strat && shown < 4; k++) {
        if (alts[k].s == cl->chosen) continue;
        sb_printf(&b, "  alternative %d: ", ++shown);
        describe(&b, a, c, &alts[k], false);
    }
    /* what bound the choice */
    double lo = 0, hi = INFINITY;
    if (a->v.mem_low > 0 || a->v.mem_high < 1) {
        double used = 0;
        for (int k = 0; k < a->n_cls; k++)
            if (a->cls[k].param)
                used += a->cls[k].count * a->st[a->cls[k].strat0 + a->cls[k].chosen].mem_bytes;
        lo = a->v.mem_low * a->v.total_param_bytes - (used - cl->count * mine.mem);
        hi = a->v.mem_high * a->v.total_param_bytes - (used - cl->count * mine.mem);
    }
    sb_printf(&b, "  bound by: ");
    if (cl->bound_by >= 0)
        sb_printf(&b, "plan.constraints[%d] (%s) fixes its storage\n", cl->bound_by,
                  a->constraint_text[cl->bound_by]);
    else if (cl->bound_by == -2)
        sb_printf(&b, "an FSDP mark: stored Shard on dp, gathered before use\n");
    else if (cl->bound_by == -3)
        sb_printf(&b, "the data input constraint: the batch Shard(0) on dp\n");
    else if (cl->n_strat == 1)
        sb_printf(&b, "its op: it has one valid strategy\n");
    else {
        const alt *cheaper = NULL;
        for (int k = 0; k < cl->n_strat && !cheaper; k++)
            if (alts[k].s != cl->chosen && alts[k].feasible && alts[k].total < mine.total)
                cheaper = &alts[k];
        if (!cheaper)
            sb_printf(&b, "cost: the cheapest strategy given the rest of the plan\n");
        else if (cl->param && (cl->count * cheaper->mem < lo || cl->count * cheaper->mem > hi))
            sb_printf(&b,
                      "the parameter-memory budget (%g, %g): alternative at %.3f ms would hold "
                      "%.4g MB, outside what the budget leaves it\n",
                      a->v.mem_low, a->v.mem_high, cheaper->total * 1e3,
                      cl->count * cheaper->mem / 1e6);
        else
            sb_printf(&b,
                      "the whole plan: a cheaper strategy alone (%.3f ms) would make its "
                      "neighbours' choices dearer\n",
                      cheaper->total * 1e3);
    }
    hp_free(alts);
    if (b.oom) {
        hp_free(b.s);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    *text = b.s;
    return HP_OK;
}
