/* passes/autoshard_exhaust.c — the exhaustive check of the ILP's optimum (docs/autoshard.md):
 * the minimum over every assignment of a strategy to each deciding class, under the same cost
 * tables the ILP is built from (lunary, ledges) and the same parameter-memory budget, computed
 * without GLPK by exact dynamic programming (variable elimination).
 *
 * The step time is a sum of terms over one class (its strategy's cost, lunary) and over two
 * (an edge's redistribution, ledges): a factor graph over the deciding classes. Eliminating a
 * class replaces the factors that mention it by one over their other classes: for every
 * assignment of those, the minimum over the eliminated class's strategies of the factors'
 * sum. No assignment is skipped: each is priced in some table entry and only a dearer one
 * with the same rest is dropped, so the last (empty-scope) factor is the exact minimum.
 *
 * With a budget each table entry holds, instead of one minimum, the Pareto set of
 * (parameter bytes, cost) pairs its sub-assignments reach: a pair is dropped only when another
 * holds no more bytes (exactly as many when the budget has a lower end) at no more cost, or
 * when its bytes already exceed the budget's high end (bytes only grow). The answer is the
 * cheapest pair of the last factor within [low, high].
 *
 * Before that, a strategy another can replace in every assignment at no more cost and no more
 * bytes (dead-end elimination: its own cost and each edge's worst difference over the far
 * end) leaves the tables, one of equals staying: the minimum is unchanged.
 *
 * Classes are eliminated smallest resulting table first; HP_UNSUPPORTED when a table would
 * exceed F_MAX_ENTRIES or the pairs combined max_work (hp_autoshard_exhaustive's max_nodes).
 */
#include "passes/autoshard_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define F_MAX_VARS    8
#define F_MAX_ENTRIES ((int64_t)1 << 22) /* one table's entries */

typedef struct pt {
    double mem, cost;
} pt;

typedef struct plist {
    pt *v;
    int n;
} plist;

typedef struct factor {
    int nv;
    int var[F_MAX_VARS]; /* class ids */
    int64_t stride[F_MAX_VARS];
    int64_t size;
    plist *e; /* [size] */
    bool alive;
} factor;

typedef struct ve {
    const hp_autoshard *a;
    factor *f;
    int n_f, cap_f;
    bool budget, exact_mem; /* exact_mem: the budget has a lower end */
    double lo, hi;
    int64_t work, max_work;
    pt *tmp, *tmp2; /* scratch lists */
    int **dom;      /* [n_cls]: the strategies still in play (tables index these) */
    int *nd;        /* [n_cls] */
    int cap_tmp;
} ve;

static int cmp_pt(const void *x, const void *y) {
    const pt *p = x, *q = y;
    if (p->mem != q->mem) return p->mem < q->mem ? -1 : 1;
    return p->cost < q->cost ? -1 : p->cost > q->cost;
}

/* Keeps the pairs no other dominates (and within the high end), sorted by bytes. */
static int pareto(const ve *w, pt *v, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i].cost) && (!w->budget || v[i].mem <= w->hi)) v[k++] = v[i];
    n = k;
    if (n <= 1) return n;
    qsort(v, (size_t)n, sizeof *v, cmp_pt);
    k = 0;
    for (int i = 0; i < n; i++) {
        /* equal bytes: the first is the cheapest; else: dearer than one with fewer bytes */
        bool dominated =
            k > 0 && (w->exact_mem ? v[k - 1].mem == v[i].mem : v[i].cost >= v[k - 1].cost);
        if (dominated) continue;
        v[k++] = v[i];
    }
    return k;
}

static bool room(ve *w, int n) {
    if (n <= w->cap_tmp) return true;
    int cap = n * 2;
    pt *a = hp_realloc(w->tmp, (size_t)cap * sizeof *a);
    if (!a) return false;
    w->tmp = a;
    pt *b = hp_realloc(w->tmp2, (size_t)cap * sizeof *b);
    if (!b) return false;
    w->tmp2 = b;
    w->cap_tmp = cap;
    return true;
}

static factor *new_factor(ve *w, int nv, const int *vars) {
    if (w->n_f == w->cap_f) {
        int cap = w->cap_f ? 2 * w->cap_f : 64;
        factor *f = hp_realloc(w->f, (size_t)cap * sizeof *f);
        if (!f) return NULL;
        w->f = f;
        w->cap_f = cap;
    }
    factor *f = &w->f[w->n_f];
    *f = (factor){.nv = nv, .size = 1, .alive = true};
    for (int i = nv - 1; i >= 0; i--) {
        f->var[i] = vars[i];
        f->stride[i] = f->size;
        f->size *= w->nd[vars[i]];
    }
    f->e = hp_calloc((size_t)f->size, sizeof *f->e);
    if (!f->e) return NULL;
    w->n_f++;
    return f;
}

static bool set_one(plist *l, double mem, double cost) {
    if (!isfinite(cost)) return true; /* no pair: infeasible */
    l->v = hp_malloc(sizeof *l->v);
    if (!l->v) return false;
    l->v[0] = (pt){mem, cost};
    l->n = 1;
    return true;
}

static void free_factor(factor *f) {
    for (int64_t i = 0; f->e && i < f->size; i++) hp_free(f->e[i].v);
    hp_free(f->e);
    f->e = NULL;
    f->alive = false;
}

static int find(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

/* The scope of eliminating class c: the other classes of the factors mentioning it, and the
 * size of the table over them. */
static int64_t scope_of(const ve *w, int c, int *vars, int *nv) {
    *nv = 0;
    for (int i = 0; i < w->n_f; i++) {
        const factor *f = &w->f[i];
        if (!f->alive || find(f->var, f->nv, c) < 0) continue;
        for (int j = 0; j < f->nv; j++)
            if (f->var[j] != c && find(vars, *nv, f->var[j]) < 0) {
                if (*nv == F_MAX_VARS) return INT64_MAX;
                vars[(*nv)++] = f->var[j];
            }
    }
    int64_t size = 1;
    for (int j = 0; j < *nv; j++) {
        size *= w->nd[vars[j]];
        if (size > ((int64_t)1 << 40)) return INT64_MAX;
    }
    return size;
}

static hp_status eliminate(ve *w, int c, const int *vars, int nv, hp_err *err) {
    int in[64], n_in = 0; /* the factors mentioning c */
    for (int i = 0; i < w->n_f; i++)
        if (w->f[i].alive && find(w->f[i].var, w->f[i].nv, c) >= 0) {
            if (n_in == 64)
                return hp_errf(err, HP_UNSUPPORTED,
                               "exhaustive search: class %d in "
                               "more than 64 factors",
                               c);
            in[n_in++] = i;
        }
    factor *nf = new_factor(w, nv, vars);
    if (!nf) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
    int ns = w->nd[c];
    /* per input factor: the stride of each new-scope var in it, and of c */
    int64_t st[64][F_MAX_VARS], sc[64];
    for (int k = 0; k < n_in; k++) {
        const factor *f = &w->f[in[k]];
        sc[k] = f->stride[find(f->var, f->nv, c)];
        for (int j = 0; j < nv; j++) {
            int p = find(f->var, f->nv, vars[j]);
            st[k][j] = p < 0 ? 0 : f->stride[p];
        }
    }
    int digit[F_MAX_VARS] = {0};
    for (int64_t x = 0; x < nf->size; x++) {
        int64_t base[64];
        for (int k = 0; k < n_in; k++) {
            base[k] = 0;
            for (int j = 0; j < nv; j++) base[k] += digit[j] * st[k][j];
        }
        int n_out = 0;
        pt *out = NULL;
        for (int s = 0; s < ns; s++) {
            /* the sum over the factors: the Minkowski sum of their lists */
            if (!room(w, 1)) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
            w->tmp[0] = (pt){0, 0};
            int n = 1;
            for (int k = 0; k < n_in && n > 0; k++) {
                const plist *l = &w->f[in[k]].e[base[k] + s * sc[k]];
                if (!room(w, n * l->n + 1))
                    return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
                int m = 0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < l->n; j++)
                        w->tmp2[m++] =
                            (pt){w->tmp[i].mem + l->v[j].mem, w->tmp[i].cost + l->v[j].cost};
                w->work += m;
                pt *t = w->tmp;
                w->tmp = w->tmp2;
                w->tmp2 = t;
                n = pareto(w, w->tmp, m);
            }
            if (n == 0) continue;
            pt *o = hp_realloc(out, (size_t)(n_out + n) * sizeof *o);
            if (!o) {
                hp_free(out);
                return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
            }
            out = o;
            memcpy(out + n_out, w->tmp, (size_t)n * sizeof *out);
            n_out = pareto(w, out, n_out + n);
        }
        nf->e[x] = (plist){out, n_out};
        if (w->work > w->max_work)
            return hp_errf(err, HP_UNSUPPORTED,
                           "exhaustive search: more than %lld pairs to combine",
                           (long long)w->max_work);
        for (int j = nv - 1; j >= 0; j--) { /* the next assignment, last var fastest */
            if (++digit[j] < w->nd[vars[j]]) break;
            digit[j] = 0;
        }
    }
    for (int k = 0; k < n_in; k++) free_factor(&w->f[in[k]]);
    return HP_OK;
}

static double smem(const ve *w, int c, int s) {
    const as_class *cl = &w->a->cls[c];
    return w->budget && cl->param ? cl->count * w->a->st[cl->strat0 + s].mem_bytes : 0;
}

static double scost(const as_edge *e, int su, int sv) {
    return e->count * e->cost[e->p_of[su] * e->n_q + e->q_of[sv]];
}

/* Whether class c's strategy t can replace s in every assignment at no more cost and bytes
 * (Goldstein's dead-end elimination): its own cost and, per edge, the worst difference over
 * the far end's strategies in play. */
static bool dominates(const ve *w, int c, int t, int s) {
    const hp_autoshard *a = w->a;
    double mt = smem(w, c, t), ms = smem(w, c, s);
    if (w->exact_mem ? mt != ms : mt > ms) return false;
    double d = a->lunary[a->cls[c].strat0 + t] - a->lunary[a->cls[c].strat0 + s];
    for (int e = 0; e < a->n_ledges && d <= 0; e++) {
        const as_edge *ed = &a->ledges[e];
        if (ed->cu != c && ed->cv != c) continue;
        int far = ed->cu == c ? ed->cv : ed->cu;
        double worst = -INFINITY;
        for (int i = 0; i < w->nd[far]; i++) {
            int x = w->dom[far][i];
            double kt = ed->cu == c ? scost(ed, t, x) : scost(ed, x, t);
            double ks = ed->cu == c ? scost(ed, s, x) : scost(ed, x, s);
            if (!isfinite(ks)) continue;  /* s cannot meet x: t is no worse there */
            worst = fmax(worst, kt - ks); /* +inf when t cannot and s can */
        }
        if (worst > -INFINITY) d += worst;
    }
    return d <= 0;
}

/* The strategies in play: the finite ones, less those another dominates (one of equals
 * stays), repeated while any goes. */
static hp_status domains(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    w->dom = hp_calloc((size_t)a->n_cls + 1, sizeof *w->dom);
    w->nd = hp_calloc((size_t)a->n_cls + 1, sizeof *w->nd);
    if (!w->dom || !w->nd) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        w->dom[c] = hp_malloc(((size_t)cl->n_strat + 1) * sizeof **w->dom);
        if (!w->dom[c]) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
        for (int s = 0; s < cl->n_strat; s++)
            if (isfinite(a->lunary[cl->strat0 + s])) w->dom[c][w->nd[c]++] = s;
    }
    for (bool gone = true; gone;) {
        gone = false;
        for (int c = 0; c < a->n_cls; c++) {
            for (int i = 0; i < w->nd[c]; i++) {
                int s = w->dom[c][i];
                for (int j = 0; j < w->nd[c]; j++) {
                    if (j == i || !dominates(w, c, w->dom[c][j], s)) continue;
                    memmove(&w->dom[c][i], &w->dom[c][i + 1],
                            (size_t)(w->nd[c] - i - 1) * sizeof **w->dom);
                    w->nd[c]--, i--, gone = true;
                    break;
                }
            }
        }
    }
    return HP_OK;
}

static hp_status setup(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    HP_TRY(domains(w, err));
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        factor *f = new_factor(w, 1, &c);
        if (!f) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
        for (int i = 0; i < w->nd[c]; i++) {
            int s = w->dom[c][i];
            if (!set_one(&f->e[i], smem(w, c, s), a->lunary[cl->strat0 + s]))
                return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
        }
    }
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        int vars[2] = {ed->cu, ed->cv};
        factor *f = new_factor(w, 2, vars);
        if (!f) return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
        for (int i = 0; i < w->nd[ed->cu]; i++)
            for (int j = 0; j < w->nd[ed->cv]; j++) {
                double k = scost(ed, w->dom[ed->cu][i], w->dom[ed->cv][j]);
                if (!set_one(&f->e[i * f->stride[0] + j], 0, k))
                    return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
            }
    }
    return HP_OK;
}

hp_status hp_autoshard_exhaustive(const hp_autoshard *a, int64_t max_work, double *best_s,
                                  hp_err *err) {
    ve w = {.a = a, .max_work = max_work};
    w.budget = hp__as_budget(a, &w.lo, &w.hi);
    w.exact_mem = w.budget && w.lo > 0;
    hp_status st = setup(&w, err);
    bool *done = hp_calloc((size_t)a->n_cls + 1, sizeof *done);
    if (st == HP_OK && !done) st = hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
    for (int c = 0; c < a->n_cls; c++)
        if (done) done[c] = a->cls[c].leader >= 0;
    for (;;) { /* each step the class whose elimination makes the smallest table */
        if (st != HP_OK) break;
        int pick = -1, vars[F_MAX_VARS], nv = 0;
        int64_t best = INT64_MAX;
        for (int c = 0; c < a->n_cls; c++) {
            if (done[c]) continue;
            int v[F_MAX_VARS], n;
            int64_t size = scope_of(&w, c, v, &n);
            if (pick < 0 || size < best) {
                pick = c, best = size, nv = n;
                memcpy(vars, v, sizeof v);
            }
        }
        if (pick < 0) break;
        if (best > F_MAX_ENTRIES) {
            st = hp_errf(err, HP_UNSUPPORTED,
                         "exhaustive search: a table of more than %lld entries (class %d)",
                         (long long)F_MAX_ENTRIES, pick);
            break;
        }
        st = eliminate(&w, pick, vars, nv, err);
        done[pick] = true;
    }
    /* what is left: factors of no class; their Minkowski sum's cheapest pair in the budget */
    double answer = INFINITY;
    if (st == HP_OK) {
        pt acc = {0, 0};
        pt *cur = hp_malloc(sizeof *cur);
        int n = 1;
        if (!cur) st = hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
        if (cur) cur[0] = acc;
        for (int i = 0; st == HP_OK && i < w.n_f && n > 0; i++) {
            const factor *f = &w.f[i];
            if (!f->alive) continue;
            const plist *l = &f->e[0];
            pt *nx = hp_malloc(((size_t)n * (size_t)l->n + 1) * sizeof *nx);
            if (!nx) {
                st = hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
                break;
            }
            int m = 0;
            for (int x = 0; x < n; x++)
                for (int y = 0; y < l->n; y++)
                    nx[m++] = (pt){cur[x].mem + l->v[y].mem, cur[x].cost + l->v[y].cost};
            hp_free(cur);
            cur = nx;
            n = pareto(&w, cur, m);
        }
        for (int x = 0; st == HP_OK && x < n; x++)
            if (!w.budget || (cur[x].mem >= w.lo && cur[x].mem <= w.hi))
                answer = fmin(answer, cur[x].cost);
        hp_free(cur);
    }
    if (st == HP_OK && !isfinite(answer))
        st = hp_errf(err, HP_INVALID, "exhaustive search: no feasible assignment");
    if (st == HP_OK) *best_s = answer;
    for (int i = 0; i < w.n_f; i++) free_factor(&w.f[i]);
    hp_free(w.f);
    hp_free(w.tmp);
    hp_free(w.tmp2);
    hp_free(done);
    for (int c = 0; w.dom && c < a->n_cls; c++) hp_free(w.dom[c]);
    hp_free(w.dom);
    hp_free(w.nd);
    return st;
}
