/* passes/autoshard_solve.c — the integer program (GLPK) of auto-sharding (docs/autoshard.md;
 * autoshard_exhaust.c checks its optimum).
 *
 * Columns: x[c, s] binary, class c runs strategy s; y[e, p, q] in [0, 1], class-edge e's value
 * leaves its producer in group p and is needed in group q (only the pairs with a finite
 * redistribution). Rows: each class takes one strategy; per edge, for every p the y[e, p, .]
 * sum to the x of the producer's strategies in p, and for every q the y[e, ., q] to the x of
 * the consumer's strategies needing q (with integral x this forces the one pair that holds,
 * so y need not be integral; a group with no feasible pair forbids its strategies); the
 * parameter bytes a rank holds within the budget. Objective: the modelled step time in
 * microseconds, each class's strategy cost times its nodes plus each edge's redistribution
 * times its count.
 */
#include "passes/autoshard_internal.h"

#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define US 1e6 /* objective unit: microseconds keep GLPK's tolerances meaningful */
/* glp_intopt's root LP is GLPK's own up to this many columns (below, hp__as_ilp) */
#define AS_GLPK_ROOT_COLS 50000

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The process's CPU seconds (the LP's limit counts them: load does not cut a solve short) */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct rowbuf {
    int *ind;
    double *val;
    int n, cap;
} rowbuf;

static bool rb_add(rowbuf *r, int col, double v) {
    if (r->n + 1 >= r->cap) {
        int cap = r->cap ? 2 * r->cap : 256;
        int *ind = hp_realloc(r->ind, (size_t)cap * sizeof *ind);
        if (!ind) return false;
        r->ind = ind;
        double *val = hp_realloc(r->val, (size_t)cap * sizeof *val);
        if (!val) return false;
        r->val = val;
        r->cap = cap;
    }
    r->n++;
    r->ind[r->n] = col; /* GLPK rows are 1-based */
    r->val[r->n] = v;
    return true;
}

static int add_row(glp_prob *lp, rowbuf *r, int type, double lo, double hi) {
    int row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, type, lo, hi);
    if (r->n) glp_set_mat_row(lp, row, r->n, r->ind, r->val);
    r->n = 0;
    return row;
}

typedef struct cb_state {
    double gap;
    bool seen;
} cb_state;

static void callback(glp_tree *t, void *info) {
    cb_state *s = info;
    int r = glp_ios_reason(t);
    if (r == GLP_IBINGO || r == GLP_ISELECT || r == GLP_IBRANCH) {
        double g = glp_ios_mip_gap(t);
        if (isfinite(g)) {
            s->gap = g;
            s->seen = true;
        }
    }
}

/* Parameter bytes bounds of the budget row (autoshard_internal.h). */
bool hp__as_budget(const hp_autoshard *a, double *lo, double *hi) {
    if (a->v.mem_low <= 0 && a->v.mem_high >= 1) return false;
    /* bytes one rank may hold; a hair of slack so that exactly 1/N is met despite rounding */
    *lo = a->v.mem_low * a->v.total_param_bytes * (1 - 1e-9);
    *hi = a->v.mem_high * a->v.total_param_bytes * (1 + 1e-9);
    return true;
}

/* The least and most parameter bytes a rank can hold, each class alone. */
static void memory_range(const hp_autoshard *a, double *lo, double *hi) {
    *lo = *hi = 0;
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (!cl->param) continue;
        double mn = INFINITY, mx = 0;
        for (int s = 0; s < cl->n_strat; s++) {
            double m = a->st[cl->strat0 + s].mem_bytes;
            mn = fmin(mn, m);
            mx = fmax(mx, m);
        }
        *lo += cl->count * mn;
        *hi += cl->count * mx;
    }
}

static hp_status build(hp_autoshard *a, glp_prob *lp, bool with_budget, hp_err *err) {
    int ncol = 0, nbin = 0;
    for (int c = 0; c < a->n_cls; c++) {
        a->cls[c].col0 = ncol + 1;
        if (a->cls[c].leader < 0) ncol += a->cls[c].n_strat;
    }
    nbin = ncol;
    for (int e = 0; e < a->n_ledges; e++) {
        as_edge *ed = &a->ledges[e];
        ed->col0 = ncol + 1;
        for (int i = 0; i < ed->n_p * ed->n_q; i++) ncol += isfinite(ed->cost[i]);
    }
    glp_set_obj_dir(lp, GLP_MIN);
    if (ncol) glp_add_cols(lp, ncol);
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        for (int s = 0; s < cl->n_strat; s++) {
            int col = cl->col0 + s;
            double u = a->lunary[cl->strat0 + s];
            glp_set_col_kind(lp, col, GLP_BV);
            if (isfinite(u))
                glp_set_obj_coef(lp, col, US * u);
            else
                glp_set_col_bnds(lp, col, GLP_FX, 0, 0); /* a follower has no strategy for it */
        }
    }
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        int col = ed->col0;
        for (int i = 0; i < ed->n_p * ed->n_q; i++) {
            if (!isfinite(ed->cost[i])) continue;
            glp_set_col_bnds(lp, col, GLP_DB, 0.0, 1.0);
            glp_set_obj_coef(lp, col, US * ed->count * ed->cost[i]);
            col++;
        }
    }
    rowbuf r = {0};
    bool ok = true;
    for (int c = 0; c < a->n_cls && ok; c++) {
        if (a->cls[c].leader >= 0) continue;
        for (int s = 0; s < a->cls[c].n_strat && ok; s++) ok = rb_add(&r, a->cls[c].col0 + s, 1);
        if (ok) add_row(lp, &r, GLP_FX, 1, 1);
    }
    for (int e = 0; e < a->n_ledges && ok; e++) {
        const as_edge *ed = &a->ledges[e];
        const as_class *u = &a->cls[ed->cu], *v = &a->cls[ed->cv];
        int *colof = hp_malloc((size_t)(ed->n_p * ed->n_q + 1) * sizeof *colof);
        if (!colof) {
            ok = false;
            break;
        }
        int col = ed->col0;
        for (int i = 0; i < ed->n_p * ed->n_q; i++) colof[i] = isfinite(ed->cost[i]) ? col++ : 0;
        for (int p = 0; p < ed->n_p && ok; p++) {
            for (int q = 0; q < ed->n_q && ok; q++)
                if (colof[p * ed->n_q + q]) ok = rb_add(&r, colof[p * ed->n_q + q], 1);
            for (int s = 0; s < u->n_strat && ok; s++)
                if (ed->p_of[s] == p) ok = rb_add(&r, u->col0 + s, -1);
            if (ok) add_row(lp, &r, GLP_FX, 0, 0);
        }
        /* the last q row is implied (the p rows and the classes' rows sum to it): left out,
         * or the simplex meets a singular basis */
        for (int q = 0; q < ed->n_q - 1 && ok; q++) {
            for (int p = 0; p < ed->n_p && ok; p++)
                if (colof[p * ed->n_q + q]) ok = rb_add(&r, colof[p * ed->n_q + q], 1);
            for (int s = 0; s < v->n_strat && ok; s++)
                if (ed->q_of[s] == q) ok = rb_add(&r, v->col0 + s, -1);
            if (ok) add_row(lp, &r, GLP_FX, 0, 0);
        }
        hp_free(colof);
    }
    double lo, hi;
    if (ok && with_budget && hp__as_budget(a, &lo, &hi)) {
        for (int c = 0; c < a->n_cls && ok; c++) {
            const as_class *cl = &a->cls[c];
            if (!cl->param) continue;
            for (int s = 0; s < cl->n_strat && ok; s++)
                ok = rb_add(&r, cl->col0 + s,
                            cl->count * a->st[cl->strat0 + s].mem_bytes / a->v.total_param_bytes);
        }
        /* in fractions of the parameters' bytes: coefficients near 1 keep the basis sound */
        if (ok)
            add_row(lp, &r, lo > 0 ? GLP_DB : GLP_UP, lo / a->v.total_param_bytes,
                    hi / a->v.total_param_bytes);
    }
    hp_free(r.ind);
    hp_free(r.val);
    a->stats.variables = ncol;
    a->stats.binaries = nbin;
    a->stats.constraints = glp_get_num_rows(lp);
    return ok ? HP_OK : hp_errf(err, HP_NOMEM, "autoshard: out of memory building the ILP");
}

/* glp_intopt's returns after which its incumbent, if any, stands: a finished search, and the
 * searches stopped at the time limit or at the requested MIP gap (GLP_EMIPGAP is how GLPK
 * reports "gap reached", not a failure) */
static bool intopt_stopped_sound(int ret) {
    return ret == 0 || ret == GLP_ETMLIM || ret == GLP_EMIPGAP;
}

static int solve(glp_prob *lp, const hp_autoshard_opts *opts, cb_state *cb) {
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.msg_lev = getenv("HP_AUTOSHARD_TRACE") ? GLP_MSG_ALL : GLP_MSG_OFF; /* GLPK's log */
    parm.presolve = GLP_ON;
    double tl = opts && opts->time_limit_s > 0 ? opts->time_limit_s : 60;
    parm.tm_lim = (int)fmin(tl * 1000, 2e9);
    parm.mip_gap = opts && opts->mip_gap >= 0 ? opts->mip_gap : 1e-4;
    parm.fp_heur = GLP_ON; /* a feasible plan early: the feasibility pump */
    parm.ps_heur = GLP_ON; /* and proximity search around it */
    parm.ps_tm_lim = 2000;
    parm.cb_func = callback;
    parm.cb_info = cb;
    return glp_intopt(lp, &parm);
}

/* Arc consistency over the deciding classes: a strategy stays while it has a finite unary cost
 * and every edge offers it a partner strategy that stays. The first class left with none
 * (*dead) and the edge that emptied it (*edge, -1: its own costs) name a node no plan can
 * place. False when every class keeps a strategy (the infeasibility is subtler). */
static bool dead_class(const hp_autoshard *a, int *dead, int *edge) {
    bool *alive = hp_calloc((size_t)(a->n_st ? a->n_st : 1), sizeof *alive);
    int max_g = 1; /* the most groups an edge end has */
    for (int e = 0; e < a->n_ledges; e++) {
        if (a->ledges[e].n_p > max_g) max_g = a->ledges[e].n_p;
        if (a->ledges[e].n_q > max_g) max_g = a->ledges[e].n_q;
    }
    bool *live = hp_calloc((size_t)max_g, sizeof *live); /* the other end's groups still live */
    bool *ok = hp_calloc((size_t)max_g, sizeof *ok);     /* this end's groups with a partner */
    bool found = false;
    *dead = *edge = -1;
    if (!alive || !live || !ok) goto done;
    for (int c = 0; c < a->n_cls && !found; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        int n = 0;
        for (int s = 0; s < cl->n_strat; s++)
            n += alive[cl->strat0 + s] = isfinite(a->lunary[cl->strat0 + s]);
        if (n == 0) found = true, *dead = c;
    }
    for (bool changed = !found; changed && !found;) {
        changed = false;
        for (int e = 0; e < a->n_ledges && !found; e++) {
            const as_edge *ed = &a->ledges[e];
            for (int side = 0; side < 2 && !found; side++) {
                /* side 0 prunes the producer by the consumer's live groups, 1 the reverse */
                const as_class *keep = &a->cls[side ? ed->cv : ed->cu];
                const as_class *other = &a->cls[side ? ed->cu : ed->cv];
                const int *kg = side ? ed->q_of : ed->p_of, *og = side ? ed->p_of : ed->q_of;
                int nk = side ? ed->n_q : ed->n_p, no = side ? ed->n_p : ed->n_q;
                memset(live, 0, (size_t)max_g * sizeof *live);
                for (int s = 0; s < other->n_strat; s++)
                    if (alive[other->strat0 + s] && og[s] >= 0) live[og[s]] = true;
                for (int k = 0; k < nk; k++) {
                    ok[k] = false;
                    for (int o = 0; o < no && !ok[k]; o++)
                        ok[k] = live[o] && isfinite(side ? ed->cost[o * ed->n_q + k]
                                                         : ed->cost[k * ed->n_q + o]);
                }
                int left = 0;
                for (int s = 0; s < keep->n_strat; s++) {
                    bool *al = &alive[keep->strat0 + s];
                    if (*al && (kg[s] < 0 || !ok[kg[s]])) *al = false, changed = true;
                    left += *al;
                }
                if (left == 0) found = true, *dead = side ? ed->cv : ed->cu, *edge = e;
            }
        }
    }
done:
    hp_free(alive);
    hp_free(live);
    hp_free(ok);
    return found;
}

static hp_status infeasible(hp_autoshard *a, const hp_autoshard_opts *opts, hp_err *err) {
    double lo, hi, mn, mx;
    if (hp__as_budget(a, &lo, &hi)) {
        memory_range(a, &mn, &mx);
        double tot = a->v.total_param_bytes;
        if (mn > hi || mx < lo)
            return hp_errf(err, HP_INVALID,
                           "plan.param_memory_budget (%g, %g) cannot be met: a rank holds "
                           "between %.4g and %.4g of the parameters' bytes under every other "
                           "constraint",
                           a->v.mem_low, a->v.mem_high, mn / tot, mx / tot);
        glp_prob *lp = glp_create_prob();
        cb_state cb = {0};
        hp_status st = build(a, lp, false, err);
        int ret = st == HP_OK ? solve(lp, opts, &cb) : -1;
        int status = intopt_stopped_sound(ret) ? glp_mip_status(lp) : GLP_UNDEF;
        glp_delete_prob(lp);
        HP_TRY(st);
        if (status == GLP_OPT || status == GLP_FEAS)
            return hp_errf(err, HP_INVALID,
                           "plan.param_memory_budget (%g, %g) cannot be met together with the "
                           "placement constraints and FSDP marks",
                           a->v.mem_low, a->v.mem_high);
    }
    int dead, e;
    if (dead_class(a, &dead, &e)) {
        int n = a->cls[dead].rep;
        const char *op = hp_op_get(a->g->nodes[n].op)->name;
        if (e < 0)
            return hp_errf(err, HP_UNSUPPORTED,
                           "no plan places node %d (%s): none of its placements fits what its "
                           "inputs can be given on this mesh",
                           n, op);
        const as_edge *ed = &a->ledges[e];
        int u = a->cls[ed->cu].rep, v = a->cls[ed->cv].rep;
        return hp_errf(err, HP_UNSUPPORTED,
                       "no plan places node %d (%s): under the data's batch split, the "
                       "placement constraints and FSDP marks, no placement is left for it that "
                       "the value from node %d (%s) to node %d (%s) can be redistributed "
                       "between on this mesh",
                       n, op, u, hp_op_get(a->g->nodes[u].op)->name, v,
                       hp_op_get(a->g->nodes[v].op)->name);
    }
    return hp_errf(err, HP_INVALID,
                   "the placement constraints and FSDP marks cannot be met together (no plan "
                   "redistributes every value they fix)");
}

/* ---- the solve ----------------------------------------------------------------------------
 *
 * Without a binding budget the LP relaxation is integral in practice (its strategies and flows
 * are a network), so one simplex solves it. A budget row breaks that and GLPK's branch and
 * bound stalls on it; so first a Lagrangian search prices the parameter bytes (lambda per byte,
 * bisected until the cheapest plan at that price fits the budget), each step a warm simplex
 * re-solve, keeping the cheapest plan that fits as the incumbent and max L(lambda) as the lower
 * bound. Only when their gap exceeds the requested MIP gap does glp_intopt continue, from that
 * incumbent, within the time limit. */

typedef struct plan_state {
    int *assign;   /* [n_cls] the deciders' strategies */
    double cost;   /* modelled seconds */
    double mem;    /* parameter bytes a rank holds */
    bool feasible; /* every edge priced and the budget met */
} plan_state;

static void evaluate(const hp_autoshard *a, plan_state *p, double lo, double hi, bool with_budget) {
    double k = 0, m = 0;
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        k += a->lunary[cl->strat0 + p->assign[c]];
        if (cl->param) m += cl->count * a->st[cl->strat0 + p->assign[c]].mem_bytes;
    }
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        k += ed->count *
             ed->cost[ed->p_of[p->assign[ed->cu]] * ed->n_q + ed->q_of[p->assign[ed->cv]]];
    }
    p->cost = k;
    p->mem = m;
    p->feasible = isfinite(k) && (!with_budget || (m >= lo && m <= hi));
}

/* The current LP solution's strategies (the largest x of each class); integral tells whether
 * it was a 0/1 solution. */
static void read_lp(const hp_autoshard *a, glp_prob *lp, int *assign, bool *integral) {
    *integral = true;
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        double best = -1;
        for (int s = 0; s < cl->n_strat; s++) {
            double v = glp_get_col_prim(lp, cl->col0 + s);
            if (v > 1e-6 && v < 1 - 1e-6) *integral = false;
            if (v > best) best = v, assign[c] = s;
        }
    }
}

static void set_price(const hp_autoshard *a, glp_prob *lp, double lambda) {
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        for (int s = 0; s < cl->n_strat; s++) {
            double u = a->lunary[cl->strat0 + s];
            if (!isfinite(u)) continue;
            double m = cl->param
                           ? cl->count * a->st[cl->strat0 + s].mem_bytes / a->v.total_param_bytes
                           : 0;
            glp_set_obj_coef(lp, cl->col0 + s, US * u + lambda * m);
        }
    }
}

/* The LP relaxation by GLPK alone, from scratch: its presolver halves its simplex (or better)
 * on the problems with few repeated layers (an exported model's ~200 distinct nodes: 7.3 s to
 * 3.4 s). 0, GLP_ENOPFS, GLP_ETMLIM, or another failure. */
static int glpk_simplex(glp_prob *lp, double limit_s) {
    glp_smcp sp;
    glp_init_smcp(&sp);
    bool trace = getenv("HP_AUTOSHARD_TRACE") != NULL;
    sp.msg_lev = trace ? GLP_MSG_ON : GLP_MSG_OFF;
    sp.tm_lim = (int)fmin(fmax(limit_s, 1e-3) * 1000, 2e9);
    sp.presolve = GLP_ON;
    glp_adv_basis(lp, 0);
    double t0 = cpu_s();
    int r = glp_simplex(lp, &sp);
    if (trace)
        fprintf(stderr, "autoshard: simplex (glpk): %d, status %d, %.3f s CPU\n", r,
                glp_get_status(lp), cpu_s() - t0);
    if (r == 0 && glp_get_status(lp) == GLP_NOFEAS) return GLP_ENOPFS;
    if (r == 0 && glp_get_status(lp) != GLP_OPT) r = -1;
    return r;
}

/* The LP relaxation by Clp (autoshard_clp.c), GLPK taking its basis: fresh, from scratch by
 * the dual simplex; else warm, the last basis with lp's new objective by the primal simplex (a
 * few pivots). Should Clp fail, GLPK's primal simplex, warm from the last basis or presolved
 * from scratch. 0, GLP_ENOPFS (no feasible solution), GLP_ETMLIM, or another failure;
 * *by_glpk set when GLPK solved it alone. */
static int simplex(hp_as_clp *clp, glp_prob *lp, bool fresh, double limit_s, bool *by_glpk) {
    double t0 = cpu_s();
    bool trace = getenv("HP_AUTOSHARD_TRACE") != NULL;
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = trace ? GLP_MSG_ON : GLP_MSG_OFF;
    int r = hp__as_clp_simplex(clp, lp, !fresh, limit_s, trace);
    if (r == GLP_ETMLIM || r == GLP_ENOPFS) return r;
    double t1 = cpu_s();
    /* GLPK's limit is wall time: the whole limit, not what Clp's CPU time left, or a loaded
     * machine stops a refactorization that takes no pivots */
    sp.tm_lim = (int)fmin(fmax(limit_s, 1e-3) * 1000, 2e9);
    if (r == 0) { /* GLPK's factorization of Clp's basis: optimal as it stands, or nearly */
        r = glp_simplex(lp, &sp);
        if (trace)
            fprintf(stderr,
                    "autoshard: simplex (clp%s) %.3f s CPU, then glpk: %d, status %d, %.3f s CPU\n",
                    fresh ? "" : ", warm", t1 - t0, r, glp_get_status(lp), cpu_s() - t1);
        if (r == 0 && glp_get_status(lp) == GLP_OPT) return 0;
        if (r == GLP_ETMLIM) return r;
    } else if (!fresh) {
        r = glp_simplex(lp, &sp);
        if (r == 0 && glp_get_status(lp) == GLP_OPT) return 0;
        if (r == GLP_ETMLIM) return r;
    }
    *by_glpk = true;
    return glpk_simplex(lp, fmax(limit_s - (cpu_s() - t0), 1e-3));
}

typedef struct heur_state {
    cb_state cb;
    const double *x; /* [n_cols + 1] the incumbent, fed to the search once */
    bool fed;
} heur_state;

static void heur_callback(glp_tree *t, void *info) {
    heur_state *h = info;
    if (glp_ios_reason(t) == GLP_IHEUR && h->x && !h->fed) {
        glp_ios_heur_sol(t, h->x);
        h->fed = true;
    }
    callback(t, &h->cb);
}

/* The incumbent as a full column vector (x and the flows it implies). */
static double *as_columns(const hp_autoshard *a, glp_prob *lp, const int *assign) {
    int n = glp_get_num_cols(lp);
    double *x = hp_calloc((size_t)n + 1, sizeof *x);
    if (!x) return NULL;
    for (int c = 0; c < a->n_cls; c++)
        if (a->cls[c].leader < 0) x[a->cls[c].col0 + assign[c]] = 1;
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        int want = ed->p_of[assign[ed->cu]] * ed->n_q + ed->q_of[assign[ed->cv]], col = ed->col0;
        for (int i = 0; i < ed->n_p * ed->n_q; i++) {
            if (!isfinite(ed->cost[i])) continue;
            if (i == want) x[col] = 1;
            col++;
        }
    }
    return x;
}

hp_status hp__as_ilp(hp_autoshard *a, const hp_autoshard_opts *opts, hp_err *err) {
    glp_term_out(getenv("HP_AUTOSHARD_TRACE") ? GLP_ON : GLP_OFF); /* GLPK prints otherwise */
    glp_prob *lp = glp_create_prob();
    if (!lp) return hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    double t0 = now_s(), gap_want = opts && opts->mip_gap >= 0 ? opts->mip_gap : 0.02;
    hp_status st = build(a, lp, true, err);
    const char *mps = getenv("HP_AUTOSHARD_MPS"); /* the ILP for an outside solver */
    if (st == HP_OK && mps && *mps && glp_write_mps(lp, GLP_MPS_FILE, NULL, mps) != 0)
        fprintf(stderr, "autoshard: HP_AUTOSHARD_MPS: cannot write '%s'\n", mps);
    double t1 = now_s();
    a->stats.build_s = t1 - t0;
    a->stats.presolved_rows = a->stats.presolved_cols = -1;
    double lo = 0, hi = INFINITY;
    bool has_budget = hp__as_budget(a, &lo, &hi);
    int brow = has_budget ? glp_get_num_rows(lp) : 0;
    plan_state cur = {.assign = hp_calloc((size_t)a->n_cls + 1, sizeof(int))};
    plan_state best = {.assign = hp_calloc((size_t)a->n_cls + 1, sizeof(int)), .cost = INFINITY};
    if (st == HP_OK && (!cur.assign || !best.assign))
        st = hp_errf(err, HP_NOMEM, "autoshard: out of memory");
    double bound = -INFINITY; /* seconds: no plan that meets every constraint is cheaper */
    bool integral = false, lp_ok = false, lp_infeasible = false, by_glpk = false;
    hp_as_clp clp = {0};
    /* the LP relaxation's own limit: GLPK's simplex slows sharply on problems of ~10^5 columns
     * (an exported Llama's unfused layers at dp × tp), and without one it ran for hours */
    double lp_limit = opts && opts->lp_time_limit_s > 0
                          ? opts->lp_time_limit_s
                          : fmax(HP_AUTOSHARD_LP_LIMIT_S,
                                 6 * (opts && opts->time_limit_s > 0 ? opts->time_limit_s : 5));
    if (st == HP_OK) {
        if (brow) glp_set_row_bnds(lp, brow, GLP_FR, 0, 0); /* priced instead, below */
        int r = simplex(&clp, lp, true, lp_limit, &by_glpk);
        lp_ok = r == 0;
        lp_infeasible = r == GLP_ENOPFS;
        if (r == GLP_ETMLIM) {
            a->stats.lp_timed_out = true;
            st = hp_errf(err, HP_LIMIT,
                         "autoshard: the LP relaxation (%d classes, %d strategies: %d rows x %d "
                         "columns) was not solved within %.3g s of CPU time; a plan written by "
                         "hand (--tp-plan, --place, --fsdp) compiles without the solver",
                         a->n_cls, a->n_st, glp_get_num_rows(lp), glp_get_num_cols(lp), lp_limit);
        }
        if (getenv("HP_AUTOSHARD_TRACE"))
            fprintf(stderr, "autoshard: LP without the budget: %s\n", lp_ok ? "solved" : "failed");
        if (lp_ok) {
            read_lp(a, lp, cur.assign, &integral);
            evaluate(a, &cur, lo, hi, has_budget);
            double lpobj = glp_get_obj_val(lp) / US;
            if (getenv("HP_AUTOSHARD_TRACE"))
                fprintf(stderr, "autoshard: LP %.6g s, its plan %.6g s, %.4g of the bytes, %s\n",
                        lpobj, cur.cost, cur.mem / a->v.total_param_bytes,
                        integral ? "integral" : "fractional");
            if (!has_budget || cur.feasible) bound = lpobj;
            if (cur.feasible) best.cost = INFINITY;
            if (cur.feasible && cur.cost < best.cost) {
                best.cost = cur.cost, best.mem = cur.mem, best.feasible = true;
                memcpy(best.assign, cur.assign, (size_t)a->n_cls * sizeof(int));
            }
            /* the budget binds: price the bytes (lambda > 0 when over high, < 0 under low) */
            if (has_budget && !cur.feasible && (cur.mem > hi || cur.mem < lo)) {
                double sign = cur.mem > hi ? 1 : -1, target = sign > 0 ? hi : lo;
                /* microseconds per fraction of the parameters' bytes held */
                double l0 = 0, l1 = 1e-3 * fmax(glp_get_obj_val(lp), 1);
                bool found = false;
                for (int it = 0; it < 60 && lp_ok; it++) {
                    double lam = found ? 0.5 * (l0 + l1) : l1;
                    set_price(a, lp, sign * lam);
                    if (!(lp_ok = simplex(&clp, lp, false, lp_limit, &by_glpk) == 0)) break;
                    read_lp(a, lp, cur.assign, &integral);
                    evaluate(a, &cur, lo, hi, true);
                    /* L(lambda) = min(cost + lambda (mem - target)) <= the constrained optimum */
                    double L =
                        (glp_get_obj_val(lp) - sign * lam * target / a->v.total_param_bytes) / US;
                    if (integral) bound = fmax(bound, L);
                    if (cur.feasible && cur.cost < best.cost) {
                        best.cost = cur.cost, best.mem = cur.mem, best.feasible = true;
                        memcpy(best.assign, cur.assign, (size_t)a->n_cls * sizeof(int));
                    }
                    bool fits = sign > 0 ? cur.mem <= hi : cur.mem >= lo;
                    if (getenv("HP_AUTOSHARD_TRACE"))
                        fprintf(stderr,
                                "autoshard: lambda %.4g us: cost %.6g s, %.4g of the bytes, "
                                "%s, bound %.6g s%s\n",
                                sign * lam, cur.cost, cur.mem / a->v.total_param_bytes,
                                integral ? "integral" : "fractional", bound, fits ? ", fits" : "");
                    if (fits) {
                        l1 = lam;
                        found = true;
                    } else if (found) {
                        l0 = lam;
                    } else {
                        l0 = l1;
                        l1 *= 16;
                    }
                    if (found && (l1 - l0) <= 1e-3 * l1) break;
                    if (best.feasible && best.cost - bound <= gap_want * best.cost) break;
                }
                set_price(a, lp, 0);
            }
        }
        if (brow)
            glp_set_row_bnds(lp, brow, lo > 0 ? GLP_DB : GLP_UP, lo / a->v.total_param_bytes,
                             hi / a->v.total_param_bytes);
    }
    bool done = st == HP_OK && best.feasible && isfinite(bound) &&
                best.cost - bound <= gap_want * best.cost && (has_budget || integral);
    int ret = 0, status = GLP_UNDEF;
    heur_state hs = {0};
    double *x0 = NULL;
    /* glp_intopt's root: the relaxation with the budget row, or afresh where GLPK's own
     * simplex is quick (up to AS_GLPK_ROOT_COLS columns), since its branch and bound went
     * better from GLPK's vertex of a degenerate optimum than from Clp's (the 2-D 1-layer
     * Llama with a budget: proven optimal after 69k iterations from GLPK's, still 2.3% apart
     * after 72k from Clp's); past that, Clp's */
    bool small = glp_get_num_cols(lp) <= AS_GLPK_ROOT_COLS;
    if (st == HP_OK && !done && !lp_infeasible && (brow || small)) {
        int r = small ? glpk_simplex(lp, lp_limit) : simplex(&clp, lp, true, lp_limit, &by_glpk);
        lp_ok = r == 0;
        lp_infeasible = r == GLP_ENOPFS;
    }
    if (st == HP_OK && !done && !lp_infeasible) { /* branch and bound from the incumbent */
        if (lp_ok && best.feasible) x0 = as_columns(a, lp, best.assign);
        hs.x = x0;
        glp_iocp parm;
        glp_init_iocp(&parm);
        parm.msg_lev = getenv("HP_AUTOSHARD_TRACE") ? GLP_MSG_ALL : GLP_MSG_OFF; /* GLPK's log */
        parm.presolve = lp_ok ? GLP_OFF : GLP_ON;
        double tl = opts && opts->time_limit_s > 0 ? opts->time_limit_s : 5;
        parm.tm_lim = (int)fmin(fmax(tl - (now_s() - t1), 0.1) * 1000, 2e9);
        parm.mip_gap = gap_want;
        parm.fp_heur = best.feasible ? GLP_OFF : GLP_ON;
        parm.cb_func = heur_callback;
        parm.cb_info = &hs;
        ret = glp_intopt(lp, &parm);
        status = intopt_stopped_sound(ret) ? glp_mip_status(lp) : GLP_UNDEF;
        if (status == GLP_OPT || status == GLP_FEAS) {
            for (int c = 0; c < a->n_cls; c++) {
                const as_class *cl = &a->cls[c];
                if (cl->leader >= 0) continue;
                for (int s = 0; s < cl->n_strat; s++)
                    if (glp_mip_col_val(lp, cl->col0 + s) > 0.5) cur.assign[c] = s;
            }
            evaluate(a, &cur, lo, hi, has_budget);
            if (cur.feasible && cur.cost <= best.cost) {
                best.cost = cur.cost, best.mem = cur.mem, best.feasible = true;
                memcpy(best.assign, cur.assign, (size_t)a->n_cls * sizeof(int));
            }
            if (status == GLP_OPT)
                bound = fmax(bound, best.cost * (1 - gap_want));
            else if (hs.cb.seen)
                bound = fmax(bound, best.cost * (1 - hs.cb.gap));
        }
    }
    a->stats.solve_s = now_s() - t1;
    hp__as_clp_free(&clp);
    snprintf(a->stats.lp_solver, sizeof a->stats.lp_solver, "%s", by_glpk ? "glpk" : "clp");
    hp_free(x0);
    if (st == HP_OK && !best.feasible) {
        glp_delete_prob(lp);
        hp_free(cur.assign);
        hp_free(best.assign);
        if (ret == GLP_ETMLIM)
            return hp_errf(err, HP_LIMIT,
                           "autoshard: no plan found within the time limit (glp_intopt %d)", ret);
        return infeasible(a, opts, err);
    }
    if (st == HP_OK) {
        for (int c = 0; c < a->n_cls; c++)
            if (a->cls[c].leader < 0) a->cls[c].chosen = best.assign[c];
        hp__as_follow_choices(a);
        if (getenv("HP_AUTOSHARD_TRACE")) {
            unsigned long long h = 1469598103934665603ull; /* to compare plans across builds */
            for (int c = 0; c < a->n_cls; c++)
                h = (h ^ (unsigned)a->cls[c].chosen) * 1099511628211ull;
            fprintf(stderr, "autoshard: plan hash %016llx\n", h);
        }
        double c, m, o; /* the chosen plan's cost exactly, not GLPK's rounded objective */
        hp_autoshard_breakdown(a, &c, &m, &o);
        a->stats.objective_s = c + m + o;
        a->stats.gap = isfinite(bound) && bound > 0 ? fmax(0, (best.cost - bound) / best.cost) : 1;
        a->stats.optimal = a->stats.gap <= gap_want + 1e-12;
        a->stats.time_limited = ret == GLP_ETMLIM;
    }
    glp_delete_prob(lp);
    hp_free(cur.assign);
    hp_free(best.assign);
    return st;
}
