/* passes/autoshard_follow.c — the problem the solvers see: views and one-input elementwise
 * nodes follow their input instead of deciding (AutoParallel does the same for views), and
 * costs that depend on one decision only are folded into it (docs/autoshard.md).
 *
 * A class follows when its nodes have one input each, all read from one producer class, and
 * make no graph output. For each strategy of the deciding class behind that producer (its
 * leader), the follower takes its cheapest strategy given the placement the producer then
 * gives: its own cost plus bringing the input to what it needs. So the leader's strategies
 * carry their followers' costs, the edge into a follower disappears, and the edges out of it
 * leave the leader. An edge whose two ends have the same leader is a cost of that leader's
 * choice alone. What is left is fewer, larger decisions: the same plans, priced the same,
 * except that a follower never takes a placement its input does not make cheapest for it.
 */
#include "passes/autoshard_internal.h"

#include <math.h>
#include <string.h>

static bool follower_op(const hp_node *n) {
    unsigned f = hp_op_get(n->op)->flags;
    return n->n_in == 1 && ((f & HP_OPF_VIEW) || (f & HP_OPF_ELEMENTWISE));
}

/* Strategy index of class c when its leader takes s (c itself deciding: s). */
static int strat_of(const hp_autoshard *a, int c, int s) {
    const as_class *cl = &a->cls[c];
    return cl->leader < 0 || s < 0 ? s : cl->follow[s];
}

static int decider(const hp_autoshard *a, int c) {
    return a->cls[c].leader < 0 ? c : a->cls[c].leader;
}

/* Remaps of[] (over class c's strategies) to leader L's strategies, groups re-indexed densely
 * in first use; -1 where the leader's strategy leaves c without one. Returns the groups used
 * and their old indices in used[]. */
static int remap(const hp_autoshard *a, int c, const int *of, int n_groups, int *out, int *used) {
    int L = decider(a, c), n = 0;
    int *newidx = hp_malloc((size_t)(n_groups + 1) * sizeof *newidx);
    if (!newidx) return -1;
    for (int g = 0; g < n_groups; g++) newidx[g] = -1;
    for (int s = 0; s < a->cls[L].n_strat; s++) {
        int t = strat_of(a, c, s);
        if (t < 0) {
            out[s] = -1;
            continue;
        }
        int g = of[t];
        if (newidx[g] < 0) {
            newidx[g] = n;
            used[n++] = g;
        }
        out[s] = newidx[g];
    }
    hp_free(newidx);
    return n;
}

void hp__as_unfold(hp_autoshard *a) {
    for (int e = 0; a->ledges && e < a->n_ledges; e++) {
        hp_free(a->ledges[e].p_of);
        hp_free(a->ledges[e].q_of);
        hp_free(a->ledges[e].cost);
    }
    hp_free(a->ledges);
    hp_free(a->lunary);
    a->ledges = NULL;
    a->lunary = NULL;
    a->n_ledges = 0;
    for (int c = 0; a->cls && c < a->n_cls; c++) {
        hp_free(a->cls[c].follow);
        a->cls[c].follow = NULL;
        a->cls[c].leader = -1;
    }
}

hp_status hp__as_fold(hp_autoshard *a, bool follow, hp_err *err) {
    a->lunary = hp_malloc(((size_t)a->n_st + 1) * sizeof *a->lunary);
    int *in_edge = hp_malloc(((size_t)a->n_cls + 1) * sizeof *in_edge);
    int *n_in = hp_calloc((size_t)a->n_cls + 1, sizeof *n_in);
    bool *output = hp_calloc((size_t)a->n_cls + 1, sizeof *output);
    hp_status st = a->lunary && in_edge && n_in && output
                       ? HP_OK
                       : hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    for (int c = 0; st == HP_OK && c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        a->cls[c].leader = -1;
        for (int s = 0; s < cl->n_strat; s++)
            a->lunary[cl->strat0 + s] = cl->count * hp__as_unary(&a->st[cl->strat0 + s]);
    }
    for (int e = 0; st == HP_OK && e < a->n_edges; e++) {
        const as_edge *ed = &a->edges[e];
        if (ed->j == AS_EDGE_GRAD) {
            output[ed->cu] = true;
            continue;
        }
        n_in[ed->cv]++;
        in_edge[ed->cv] = e;
    }
    if (st == HP_OK && a->g->n_outputs > 0) output[a->cls_of[a->g->outputs[0].node]] = true;
    /* followers, in class order (a producer's class comes before its consumers') */
    for (int c = 0; st == HP_OK && c < a->n_cls; c++) {
        as_class *cl = &a->cls[c];
        const hp_node *n = &a->g->nodes[cl->rep];
        if (!follow || cl->placeholder || output[c] || n_in[c] != 1 || !follower_op(n)) continue;
        const as_edge *ed = &a->edges[in_edge[c]];
        if (ed->cu == c) continue;
        int L = decider(a, ed->cu);
        const as_class *lc = &a->cls[L];
        cl->follow = hp_malloc((size_t)lc->n_strat * sizeof *cl->follow);
        if (!cl->follow) {
            st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
            break;
        }
        for (int s = 0; s < lc->n_strat; s++) {
            int su = strat_of(a, ed->cu, s);
            cl->follow[s] = -1;
            if (su < 0) continue;
            int p = ed->p_of[su];
            double best = INFINITY;
            for (int t = 0; t < cl->n_strat; t++) {
                double k = cl->count * hp__as_unary(&a->st[cl->strat0 + t]) +
                           ed->count * ed->cost[p * ed->n_q + ed->q_of[t]];
                if (k < best) {
                    best = k;
                    cl->follow[s] = t;
                }
            }
            a->lunary[lc->strat0 + s] += best; /* INFINITY: the leader cannot take s */
        }
        cl->leader = L;
    }
    /* the edges between deciders; the others fold into one decider's cost */
    a->ledges = hp_calloc((size_t)a->n_edges + 1, sizeof *a->ledges);
    if (st == HP_OK && !a->ledges) st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    for (int e = 0; st == HP_OK && e < a->n_edges; e++) {
        const as_edge *ed = &a->edges[e];
        if (ed->j != AS_EDGE_GRAD && a->cls[ed->cv].leader >= 0) continue; /* into a follower */
        int Lu = decider(a, ed->cu), Lv = decider(a, ed->cv);
        if (Lu == Lv) {
            const as_class *lc = &a->cls[Lu];
            for (int s = 0; s < lc->n_strat; s++) {
                int su = strat_of(a, ed->cu, s), sv = strat_of(a, ed->cv, s);
                a->lunary[lc->strat0 + s] +=
                    su < 0 || sv < 0 ? INFINITY
                                     : ed->count * ed->cost[ed->p_of[su] * ed->n_q + ed->q_of[sv]];
            }
            continue;
        }
        as_edge *le = &a->ledges[a->n_ledges];
        *le = (as_edge){
            .cu = Lu, .k = ed->k, .cv = Lv, .j = ed->j, .count = ed->count, .type = ed->type};
        int nu = a->cls[Lu].n_strat, nv = a->cls[Lv].n_strat;
        le->p_of = hp_malloc((size_t)nu * sizeof *le->p_of);
        le->q_of = hp_malloc((size_t)nv * sizeof *le->q_of);
        int *pu = hp_malloc((size_t)(ed->n_p + 1) * sizeof *pu);
        int *qu = hp_malloc((size_t)(ed->n_q + 1) * sizeof *qu);
        if (!le->p_of || !le->q_of || !pu || !qu) {
            hp_free(le->p_of);
            hp_free(le->q_of);
            hp_free(pu);
            hp_free(qu);
            st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
            break;
        }
        a->n_ledges++;
        le->n_p = remap(a, ed->cu, ed->p_of, ed->n_p, le->p_of, pu);
        le->n_q = remap(a, ed->cv, ed->q_of, ed->n_q, le->q_of, qu);
        le->cost = le->n_p > 0 && le->n_q > 0
                       ? hp_malloc((size_t)le->n_p * (size_t)le->n_q * sizeof *le->cost)
                       : hp_malloc(sizeof *le->cost);
        if (le->n_p < 0 || le->n_q < 0 || !le->cost)
            st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
        for (int p = 0; st == HP_OK && p < le->n_p; p++)
            for (int q = 0; q < le->n_q; q++)
                le->cost[p * le->n_q + q] = ed->cost[pu[p] * ed->n_q + qu[q]];
        /* a leader strategy that leaves an end without one is infeasible */
        for (int s = 0; st == HP_OK && s < nu; s++)
            if (le->p_of[s] < 0) a->lunary[a->cls[Lu].strat0 + s] = INFINITY;
        for (int s = 0; st == HP_OK && s < nv; s++)
            if (le->q_of[s] < 0) a->lunary[a->cls[Lv].strat0 + s] = INFINITY;
        for (int s = 0; s < nu; s++) le->p_of[s] = le->p_of[s] < 0 ? 0 : le->p_of[s];
        for (int s = 0; s < nv; s++) le->q_of[s] = le->q_of[s] < 0 ? 0 : le->q_of[s];
        hp_free(pu);
        hp_free(qu);
    }
    hp_free(in_edge);
    hp_free(n_in);
    hp_free(output);
    return st;
}

/* Followers' choices from their leaders'. */
void hp__as_follow_choices(hp_autoshard *a) {
    for (int c = 0; c < a->n_cls; c++) {
        as_class *cl = &a->cls[c];
        if (cl->leader >= 0) cl->chosen = cl->follow[a->cls[cl->leader].chosen];
    }
}
