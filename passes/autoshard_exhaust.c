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
 * A factor does not tell apart every strategy of a class it mentions: an edge prices only the
 * placement the producer gives (p group) and the one the consumer needs (q group), so its
 * table has one entry per group, and each class it mentions comes with a map from strategy to
 * entry index (a slot). Eliminating a class gives the new factor, per class of its scope, the
 * joint map of the factors it came from (strategies alike in all of them share an entry).
 * That is exact (the sum is the same for strategies alike everywhere) and it is what makes
 * the 2-D tables smaller: an edge often sees a handful of groups (activations' 25 on a 2-D
 * mesh remain the cost).
 *
 * With a budget each table entry holds, instead of one minimum, the Pareto set of
 * (parameter bytes, cost) pairs its sub-assignments reach: a pair is dropped only when another
 * holds no more bytes (exactly as many when the budget has a lower end) at no more cost, or
 * when its bytes plus the fewest bytes the classes not yet in it can add exceed the budget's
 * high end (bytes only grow). The answer is the cheapest pair of the last factor within
 * [low, high].
 *
 * Before that, a strategy another can replace in every assignment at no more cost and no more
 * bytes (dead-end elimination: its own cost and each edge's worst difference over the far
 * end) leaves the tables, one of equals staying: the minimum is unchanged. Then bound
 * pruning: per class and strategy a lower bound on every assignment using it (mini-bucket
 * elimination, that class last, the budget priced in by a Lagrange multiplier lambda >= 0:
 * cost + lambda * (bytes - high) is no more than the cost of any assignment within the high
 * end), against an upper bound that is a real assignment's cost (the exact minimum over each
 * class's few best-bounded strategies per byte count, or the solver's assignment priced here
 * when cheaper); a strategy bounded above it is in no optimum and goes, with a relative slack
 * of 1e-9 so that rounding keeps ties.
 *
 * Classes are eliminated smallest resulting table first, recomputed after each step.
 * HP_UNSUPPORTED when a table would exceed max_work entries (or F_MAX_ENTRIES, the memory
 * cap) or the pairs combined exceed max_work: the caller's bound on the time spent.
 * HP_AUTOSHARD_TRACE=1 prints the domains, each elimination and the time to stderr.
 */
#include "passes/autoshard_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define F_MAX_VARS     8
#define F_MAX_IN       64
#define F_MAX_ENTRIES  ((int64_t)1 << 24) /* one table's entries: the memory cap */
#define F_MINI_ENTRIES 4096               /* the bounds' tables (mini-bucket elimination) */

typedef struct pt {
    double mem, cost;
} pt;

/* A class as one factor sees it: map[i] is the entry index of its i-th strategy in play. */
typedef struct slot {
    int cls;
    int k; /* distinct indices */
    int *map;
    int64_t stride;
} slot;

typedef struct factor {
    int nv;
    slot v[F_MAX_VARS];
    int64_t size;
    int64_t *off; /* [size + 1]: entry x's pairs are pts[off[x] .. off[x + 1]) */
    pt *pts;
    int64_t n_pts, cap_pts;
    uint64_t *in_mem; /* the classes whose bytes its pairs count (a bitset) */
    bool alive;
} factor;

typedef struct ve {
    const hp_autoshard *a;
    factor *f;
    int n_f, cap_f;
    bool budget, exact_mem; /* exact_mem: the budget has a lower end */
    double lo, hi;
    double lambda;   /* the bounds' price of a byte (a Lagrange multiplier of the high end) */
    double *min_mem; /* [n_cls]: the fewest bytes each class can hold */
    int words;       /* of a class bitset */
    int64_t work, max_work, max_entries;
    struct {
        int finite, after_dominance, after_bounds; /* strategies, summed over the classes */
        int64_t biggest;                           /* entries of the exact search's largest table */
    } stats;
    pt *tmp, *tmp2, *out; /* scratch lists */
    int cap_tmp, cap_out;
    int **dom; /* [n_cls]: the strategies still in play (maps index these) */
    int *tab;  /* [max nd^2]: joint_map's relabelling */
    int *nd;   /* [n_cls] */
    bool trace;
} ve;

static hp_status nomem(hp_err *err) {
    return hp_errf(err, HP_NOMEM, "exhaustive search: out of memory");
}

static int cmp_pt(const void *x, const void *y) {
    const pt *p = x, *q = y;
    if (p->mem != q->mem) return p->mem < q->mem ? -1 : 1;
    return p->cost < q->cost ? -1 : p->cost > q->cost;
}

/* Keeps the pairs no other dominates and whose bytes plus `rest` (the fewest the classes not
 * yet counted add) fit the high end, sorted by bytes. */
static int pareto(const ve *w, pt *v, int n, double rest) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i].cost) && (!w->budget || v[i].mem + rest <= w->hi)) v[k++] = v[i];
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

static bool grow(pt **v, int *cap, int n) {
    if (n <= *cap) return true;
    int c = n * 2;
    pt *p = hp_realloc(*v, (size_t)c * sizeof *p);
    if (!p) return false;
    *v = p;
    *cap = c;
    return true;
}

static bool room(ve *w, int n) {
    int cap = w->cap_tmp;
    if (!grow(&w->tmp, &cap, n)) return false;
    if (!grow(&w->tmp2, &w->cap_tmp, n)) return false;
    return true;
}

static bool push_pts(factor *f, const pt *v, int n) {
    if (f->n_pts + n > f->cap_pts) {
        int64_t cap = 2 * (f->n_pts + n) + 16;
        pt *p = hp_realloc(f->pts, (size_t)cap * sizeof *p);
        if (!p) return false;
        f->pts = p;
        f->cap_pts = cap;
    }
    if (n > 0) memcpy(f->pts + f->n_pts, v, (size_t)n * sizeof *v); /* v may be NULL then */
    f->n_pts += n;
    return true;
}

static void free_factor(factor *f) {
    for (int j = 0; j < f->nv; j++) hp_free(f->v[j].map);
    hp_free(f->off);
    hp_free(f->pts);
    hp_free(f->in_mem);
    *f = (factor){0};
}

/* A factor over the given slots (maps taken); its entries are filled in order by push_pts
 * and off. */
static factor *new_factor(ve *w, int nv, slot *v) {
    if (w->n_f == w->cap_f) {
        int cap = w->cap_f ? 2 * w->cap_f : 64;
        factor *f = hp_realloc(w->f, (size_t)cap * sizeof *f);
        if (!f) return NULL;
        w->f = f;
        w->cap_f = cap;
    }
    factor *f = &w->f[w->n_f++];
    *f = (factor){.nv = nv, .size = 1, .alive = true};
    for (int i = nv - 1; i >= 0; i--) {
        f->v[i] = v[i];
        f->v[i].stride = f->size;
        f->size *= v[i].k;
    }
    f->off = hp_calloc((size_t)f->size + 1, sizeof *f->off);
    f->in_mem = hp_calloc((size_t)w->words, sizeof *f->in_mem);
    if (!f->off || !f->in_mem) return NULL;
    return f;
}

static int slot_of(const factor *f, int c) {
    for (int i = 0; i < f->nv; i++)
        if (f->v[i].cls == c) return i;
    return -1;
}

static int find(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

/* The factors mentioning class c. */
static int factors_of(const ve *w, int c, int *in) {
    int n = 0;
    for (int i = 0; i < w->n_f; i++)
        if (w->f[i].alive && slot_of(&w->f[i], c) >= 0) {
            if (n == F_MAX_IN) return -1;
            in[n++] = i;
        }
    return n;
}

/* The joint map of class v over factors in[0..n): strategies with the same index in each
 * share one; map[] gets it, rep[] (if given) one strategy of each. Returns their count. Each
 * factor refines the partition so far: (index so far, index there) relabelled via w->tab. */
static int joint_map(const ve *w, int v, const int *in, int n, int *map, int *rep) {
    int nd = w->nd[v], k = 1;
    if (nd == 0) return 0;
    for (int s = 0; s < nd; s++) map[s] = 0;
    for (int j = 0; j < n && k < nd; j++) {
        int p = slot_of(&w->f[in[j]], v);
        if (p < 0) continue;
        const slot *sl = &w->f[in[j]].v[p];
        for (int i = 0; i < k * sl->k; i++) w->tab[i] = -1;
        int nk = 0;
        for (int s = 0; s < nd; s++) {
            int key = map[s] * sl->k + sl->map[s];
            if (w->tab[key] < 0) w->tab[key] = nk++;
            map[s] = w->tab[key];
        }
        k = nk;
    }
    for (int s = 0; rep && s < nd; s++) rep[map[s]] = s;
    return k;
}

/* The scope of eliminating class c from factors in[0..n): their other classes, and the table's
 * size over their joint maps (INT64_MAX past the caps). */
static int64_t scope_of(const ve *w, int c, const int *in, int n, int *vars, int *ks, int *nv,
                        int *scratch) {
    *nv = 0;
    for (int j = 0; j < n; j++) {
        const factor *f = &w->f[in[j]];
        for (int i = 0; i < f->nv; i++)
            if (f->v[i].cls != c && find(vars, *nv, f->v[i].cls) < 0) {
                if (*nv == F_MAX_VARS) return INT64_MAX;
                vars[(*nv)++] = f->v[i].cls;
            }
    }
    int64_t size = 1;
    for (int j = 0; j < *nv; j++) {
        ks[j] = joint_map(w, vars[j], in, n, scratch, NULL);
        size *= ks[j];
        if (size > ((int64_t)1 << 40)) return INT64_MAX;
    }
    return size;
}

/* The fewest bytes the classes outside bitset `in` can add. */
static double rest_mem(const ve *w, const uint64_t *in) {
    double r = 0;
    for (int c = 0; c < w->a->n_cls; c++)
        if (!(in[c / 64] >> (c % 64) & 1)) r += w->min_mem[c];
    return r;
}

/* Entry x's pairs of factor f. */
static inline const pt *entry(const factor *f, int64_t x, int *n) {
    *n = (int)(f->off[x + 1] - f->off[x]);
    return f->pts + f->off[x];
}

/* Replaces factors in_[0..n_in) (all mentioning c) by one over their other classes `vars`:
 * per assignment of those, the minimum over c of their sum. */
static hp_status eliminate(ve *w, int c, const int *in_, int n_in, const int *vars, int nv,
                           hp_err *err) {
    int in[F_MAX_IN];
    if (n_in > 0) memcpy(in, in_, (size_t)n_in * sizeof *in);
    slot sl[F_MAX_VARS];
    int *rep[F_MAX_VARS] = {0};
    hp_status st = HP_OK;
    for (int j = 0; j < nv; j++) {
        sl[j] = (slot){.cls = vars[j]};
        sl[j].map = hp_malloc(((size_t)w->nd[vars[j]] + 1) * sizeof *sl[j].map);
        rep[j] = hp_malloc(((size_t)w->nd[vars[j]] + 1) * sizeof *rep[j]);
        if (!sl[j].map || !rep[j]) {
            for (int i = 0; i <= j; i++) hp_free(sl[i].map), hp_free(rep[i]);
            return nomem(err);
        }
        sl[j].k = joint_map(w, vars[j], in, n_in, sl[j].map, rep[j]);
    }
    /* per input factor: the offset each scope class's index adds (0 when absent), c's slot */
    int64_t *add[F_MAX_IN][F_MAX_VARS] = {{0}};
    const int *cmap[F_MAX_IN];
    int64_t cstride[F_MAX_IN];
    factor *nf = new_factor(w, nv, sl); /* takes the maps */
    if (!nf) {
        for (int j = 0; j < nv; j++) hp_free(rep[j]);
        for (int j = 0; j < nv; j++) hp_free(sl[j].map);
        return nomem(err);
    }
    int64_t nf_size = nf->size;
    for (int k = 0; k < n_in && st == HP_OK; k++) {
        const factor *f = &w->f[in[k]];
        int p = slot_of(f, c);
        cmap[k] = f->v[p].map, cstride[k] = f->v[p].stride;
        for (int j = 0; j < nv && st == HP_OK; j++) {
            add[k][j] = hp_calloc((size_t)sl[j].k, sizeof *add[k][j]);
            if (!add[k][j]) {
                st = nomem(err);
                break;
            }
            int q = slot_of(f, vars[j]);
            for (int d = 0; q >= 0 && d < sl[j].k; d++)
                add[k][j][d] = f->v[q].map[rep[j][d]] * f->v[q].stride;
        }
    }
    for (int j = 0; j < nv; j++) hp_free(rep[j]);
    /* the classes whose bytes the new pairs count: the inputs' and c's */
    factor *nfp = &w->f[w->n_f - 1];
    for (int k = 0; k < n_in; k++)
        for (int i = 0; i < w->words; i++) nfp->in_mem[i] |= w->f[in[k]].in_mem[i];
    double rest = w->budget ? rest_mem(w, nfp->in_mem) : 0;
    int ns = w->nd[c];
    int digit[F_MAX_VARS] = {0};
    for (int64_t x = 0; x < nf_size && st == HP_OK; x++) {
        factor *out_f = &w->f[w->n_f - 1]; /* w->f does not move here; read it afresh anyway */
        int64_t base[F_MAX_IN];
        for (int k = 0; k < n_in; k++) {
            base[k] = 0;
            for (int j = 0; j < nv; j++) base[k] += add[k][j][digit[j]];
        }
        if (!w->budget) { /* one pair per entry at most: the cheapest sum */
            double best = INFINITY;
            for (int s = 0; s < ns; s++) {
                double sum = 0;
                for (int k = 0; k < n_in && isfinite(sum); k++) {
                    int n;
                    const pt *l = entry(&w->f[in[k]], base[k] + cmap[k][s] * cstride[k], &n);
                    sum = n ? sum + l->cost : INFINITY;
                }
                best = fmin(best, sum);
            }
            w->work += (int64_t)ns * n_in;
            pt one = {0, best};
            if (isfinite(best) && !push_pts(out_f, &one, 1)) st = nomem(err);
        } else {
            int n_out = 0;
            for (int s = 0; s < ns && st == HP_OK; s++) {
                /* the sum over the factors: the Minkowski sum of their lists */
                if (!room(w, 1)) {
                    st = nomem(err);
                    break;
                }
                w->tmp[0] = (pt){0, 0};
                int n = 1;
                for (int k = 0; k < n_in && n > 0; k++) {
                    int ln;
                    const pt *l = entry(&w->f[in[k]], base[k] + cmap[k][s] * cstride[k], &ln);
                    if (!room(w, n * ln + 1)) {
                        st = nomem(err);
                        break;
                    }
                    int m = 0;
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < ln; j++)
                            w->tmp2[m++] =
                                (pt){w->tmp[i].mem + l[j].mem, w->tmp[i].cost + l[j].cost};
                    w->work += m;
                    pt *t = w->tmp;
                    w->tmp = w->tmp2;
                    w->tmp2 = t;
                    n = pareto(w, w->tmp, m, rest);
                }
                if (st != HP_OK || n == 0) continue;
                if (!grow(&w->out, &w->cap_out, n_out + n)) {
                    st = nomem(err);
                    break;
                }
                if (n > 0) memcpy(w->out + n_out, w->tmp, (size_t)n * sizeof *w->out);
                n_out = pareto(w, w->out, n_out + n, rest);
            }
            if (st == HP_OK && !push_pts(out_f, w->out, n_out)) st = nomem(err);
        }
        out_f->off[x + 1] = out_f->n_pts;
        if (st == HP_OK && w->work > w->max_work)
            st = hp_errf(err, HP_UNSUPPORTED,
                         "exhaustive search: more than %lld pairs to combine (the limit)",
                         (long long)w->max_work);
        for (int j = nv - 1; j >= 0; j--) { /* the next assignment, last class fastest */
            if (++digit[j] < sl[j].k) break;
            digit[j] = 0;
        }
    }
    for (int k = 0; k < n_in; k++)
        for (int j = 0; j < nv; j++) hp_free(add[k][j]);
    for (int k = 0; k < n_in; k++) free_factor(&w->f[in[k]]);
    return st;
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

/* Drops from the strategies in play those another dominates (one of equals stays), repeated
 * while any goes. */
static void dead_end_elimination(ve *w) {
    const hp_autoshard *a = w->a;
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
}

/* The strategies in play: the finite ones, less the dominated. */
static hp_status domains(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    w->dom = hp_calloc((size_t)a->n_cls + 1, sizeof *w->dom);
    w->nd = hp_calloc((size_t)a->n_cls + 1, sizeof *w->nd);
    if (!w->dom || !w->nd) return nomem(err);
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        w->dom[c] = hp_malloc(((size_t)cl->n_strat + 1) * sizeof **w->dom);
        if (!w->dom[c]) return nomem(err);
        for (int s = 0; s < cl->n_strat; s++)
            if (isfinite(a->lunary[cl->strat0 + s])) w->dom[c][w->nd[c]++] = s;
        w->stats.finite += w->nd[c];
    }
    dead_end_elimination(w);
    for (int c = 0; c < a->n_cls; c++) w->stats.after_dominance += w->nd[c];
    return HP_OK;
}

/* A slot of class c whose map is `group` of each strategy in play, relabelled densely. */
static bool group_slot(const ve *w, int c, const int *group, slot *out) {
    *out = (slot){.cls = c};
    out->map = hp_malloc(((size_t)w->nd[c] + 1) * sizeof *out->map);
    if (!out->map) return false;
    for (int i = 0; i < w->nd[c]; i++) {
        int g = group ? group[w->dom[c][i]] : i, label = -1;
        for (int t = 0; t < i && label < 0; t++) {
            int h = group ? group[w->dom[c][t]] : t;
            if (h == g) label = out->map[t];
        }
        out->map[i] = label >= 0 ? label : out->k++;
    }
    return true;
}

static void drop_factors(ve *w) {
    for (int i = 0; i < w->n_f; i++) free_factor(&w->f[i]);
    w->n_f = 0;
}

/* The factor graph over the strategies in play: a unary factor per class, one per edge. */
static hp_status build_factors(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    drop_factors(w);
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        slot sl;
        if (!group_slot(w, c, NULL, &sl)) return nomem(err);
        factor *f = new_factor(w, 1, &sl);
        if (!f) return nomem(err);
        f->in_mem[c / 64] |= (uint64_t)1 << (c % 64);
        w->min_mem[c] = w->nd[c] ? INFINITY : 0;
        for (int i = 0; i < w->nd[c]; i++) {
            int s = w->dom[c][i];
            double bytes = cl->param ? cl->count * a->st[cl->strat0 + s].mem_bytes : 0;
            pt one = {smem(w, c, s), a->lunary[cl->strat0 + s] + w->lambda * bytes};
            w->min_mem[c] = fmin(w->min_mem[c], one.mem);
            if (!push_pts(f, &one, 1)) return nomem(err);
            f->off[i + 1] = f->n_pts;
        }
    }
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        slot sl[2];
        if (!group_slot(w, ed->cu, ed->p_of, &sl[0])) return nomem(err);
        if (!group_slot(w, ed->cv, ed->q_of, &sl[1])) {
            hp_free(sl[0].map);
            return nomem(err);
        }
        /* a group's p (q) index: that of any strategy in it (w->tab holds both) */
        int ku = sl[0].k, kv = sl[1].k, *p_of_k = w->tab, *q_of_k = w->tab + ku;
        for (int i = 0; i < w->nd[ed->cu]; i++) p_of_k[sl[0].map[i]] = ed->p_of[w->dom[ed->cu][i]];
        for (int i = 0; i < w->nd[ed->cv]; i++) q_of_k[sl[1].map[i]] = ed->q_of[w->dom[ed->cv][i]];
        factor *f = new_factor(w, 2, sl);
        if (!f) return nomem(err);
        for (int i = 0; i < ku; i++)
            for (int j = 0; j < kv; j++) {
                pt one = {0, ed->count * ed->cost[p_of_k[i] * ed->n_q + q_of_k[j]]};
                if (isfinite(one.cost) && !push_pts(f, &one, 1)) return nomem(err);
                f->off[i * kv + j + 1] = f->n_pts;
            }
    }
    return HP_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Eliminates every deciding class but `keep` (-1: none), smallest resulting table first.
 * mini > 0: a relaxation, for bounds: where c's table would exceed mini entries its factors
 * are split in groups whose tables fit and c leaves each on its own (the sum of the minima is
 * at most the minimum of the sum: a lower bound, mini-bucket elimination). */
static hp_status eliminate_all(ve *w, int keep, int64_t mini, hp_err *err) {
    const hp_autoshard *a = w->a;
    bool *done = hp_calloc((size_t)a->n_cls + 1, sizeof *done);
    int *scratch = hp_malloc(((size_t)a->n_st + 1) * sizeof *scratch);
    hp_status st = done && scratch ? HP_OK : nomem(err);
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) done[c] = a->cls[c].leader >= 0 || c == keep;
    int64_t cap = w->max_entries < F_MAX_ENTRIES ? w->max_entries : F_MAX_ENTRIES;
    while (st == HP_OK) {
        int pick = -1, in[F_MAX_IN], n_in = 0, vars[F_MAX_VARS], ks[F_MAX_VARS], nv = 0;
        int64_t best = INT64_MAX;
        for (int c = 0; c < a->n_cls; c++) {
            if (done[c]) continue;
            int v[F_MAX_VARS] = {0}, k[F_MAX_VARS] = {0}, n = 0, fi[F_MAX_IN];
            int nf = factors_of(w, c, fi);
            int64_t size = nf < 0 ? INT64_MAX : scope_of(w, c, fi, nf, v, k, &n, scratch);
            if (pick < 0 || size < best) {
                pick = c, best = size, nv = n, n_in = nf;
                memcpy(vars, v, sizeof v);
                memcpy(ks, k, sizeof k);
                if (nf > 0) memcpy(in, fi, (size_t)nf * sizeof *in);
            }
        }
        if (pick < 0) break;
        done[pick] = true;
        if (n_in < 0) {
            st = hp_errf(err, HP_UNSUPPORTED, "exhaustive search: class %d in more than %d factors",
                         pick, F_MAX_IN);
            break;
        }
        if (mini > 0 && best > mini) { /* greedy groups, biggest factor first */
            int group[F_MAX_IN], n_group = 0, members[F_MAX_IN][F_MAX_IN], n_mem[F_MAX_IN];
            for (int i = 0; i < n_in; i++) group[i] = -1;
            for (int round = 0; round < n_in; round++) {
                int big = -1;
                for (int i = 0; i < n_in; i++)
                    if (group[i] < 0 && (big < 0 || w->f[in[i]].size > w->f[in[big]].size)) big = i;
                for (int g = 0; g < n_group && group[big] < 0; g++) {
                    members[g][n_mem[g]] = in[big];
                    int v[F_MAX_VARS], k[F_MAX_VARS], n;
                    if (scope_of(w, pick, members[g], n_mem[g] + 1, v, k, &n, scratch) <= mini)
                        group[big] = g, n_mem[g]++;
                }
                if (group[big] < 0) {
                    group[big] = n_group;
                    members[n_group][0] = in[big];
                    n_mem[n_group++] = 1;
                }
            }
            for (int g = 0; g < n_group && st == HP_OK; g++) {
                int v[F_MAX_VARS], k[F_MAX_VARS], n;
                int64_t size = scope_of(w, pick, members[g], n_mem[g], v, k, &n, scratch);
                if (size > cap) /* one factor alone: cannot happen below the cap */
                    st = hp_errf(err, HP_UNSUPPORTED,
                                 "exhaustive search: a bound's table of more than %lld entries",
                                 (long long)cap);
                else
                    st = eliminate(w, pick, members[g], n_mem[g], v, n, err);
            }
            continue;
        }
        if (best > cap) {
            st = hp_errf(err, HP_UNSUPPORTED,
                         "exhaustive search: eliminating class %d needs a table of more than "
                         "%lld entries (the limit)",
                         pick, (long long)cap);
            break;
        }
        if (w->trace && mini == 0) {
            fprintf(stderr, "autoshard: exhaustive: eliminate class %d (%d in play): %lld entries",
                    pick, w->nd[pick], (long long)best);
            for (int j = 0; j < nv; j++) fprintf(stderr, " %s%d:%d", j ? "x " : "", vars[j], ks[j]);
            fprintf(stderr, "\n");
        }
        if (mini == 0 && best > w->stats.biggest) w->stats.biggest = best;
        st = eliminate(w, pick, in, n_in, vars, nv, err);
    }
    hp_free(done);
    hp_free(scratch);
    return st;
}

/* What is left: factors of no class; the cheapest pair of their Minkowski sum in the budget. */
static hp_status answer_of(ve *w, double *answer, hp_err *err) {
    *answer = INFINITY;
    pt *cur = hp_malloc(sizeof *cur);
    if (!cur) return nomem(err);
    cur[0] = (pt){0, 0};
    int n = 1;
    for (int i = 0; i < w->n_f && n > 0; i++) {
        const factor *f = &w->f[i];
        if (!f->alive) continue;
        int ln;
        const pt *l = entry(f, 0, &ln);
        pt *nx = hp_malloc(((size_t)n * (size_t)ln + 1) * sizeof *nx);
        if (!nx) {
            hp_free(cur);
            return nomem(err);
        }
        int m = 0;
        for (int x = 0; x < n; x++)
            for (int y = 0; y < ln; y++)
                nx[m++] = (pt){cur[x].mem + l[y].mem, cur[x].cost + l[y].cost};
        hp_free(cur);
        cur = nx;
        n = pareto(w, cur, m, 0);
    }
    for (int x = 0; x < n; x++)
        if (!w->budget || (cur[x].mem >= w->lo && cur[x].mem <= w->hi))
            *answer = fmin(*answer, cur[x].cost);
    hp_free(cur);
    return HP_OK;
}

/* The exact minimum over the strategies in play (INFINITY: none meets the budget). */
static hp_status exact(ve *w, double *answer, hp_err *err) {
    HP_TRY(build_factors(w, err));
    HP_TRY(eliminate_all(w, -1, 0, err));
    return answer_of(w, answer, err);
}

/* The sum of what is left after eliminating all but class c (-1: all): per strategy in play
 * of c, into v[nd[c]] (or v[0]). */
static void left_sum(const ve *w, int c, double *v) {
    int n_v = c >= 0 ? w->nd[c] : 1;
    double base = 0;
    for (int i = 0; i < n_v; i++) v[i] = 0;
    for (int i = 0; i < w->n_f; i++) {
        const factor *f = &w->f[i];
        if (!f->alive) continue;
        int n;
        if (f->nv == 0) {
            const pt *p = entry(f, 0, &n);
            base += n ? p->cost : INFINITY;
            continue;
        }
        for (int s = 0; s < n_v; s++) { /* nv == 1: over c */
            const pt *p = entry(f, f->v[0].map[s], &n);
            v[s] += n ? p->cost : INFINITY;
        }
    }
    for (int i = 0; i < n_v; i++) v[i] += base;
}

/* A lower bound on the cost of every assignment in the budget: mini-bucket elimination of
 * cost + lambda * (bytes - high) (no more than the cost where bytes <= high, lambda >= 0). */
static hp_status global_bound(ve *w, double lambda, double *lb, hp_err *err) {
    w->lambda = lambda;
    HP_TRY(build_factors(w, err));
    HP_TRY(eliminate_all(w, -1, F_MINI_ENTRIES, err));
    left_sum(w, -1, lb);
    *lb -= w->lambda * (w->hi < INFINITY ? w->hi : 0);
    return HP_OK;
}

/* lb[c][i]: a lower bound on the cost of every assignment in the budget giving class c its
 * i-th strategy in play: mini-bucket elimination of all the other classes, c last, the budget
 * priced in by the multiplier whose global bound is highest (any lambda >= 0 is sound). */
static hp_status lower_bounds(ve *w, double **lb, hp_err *err) {
    const hp_autoshard *a = w->a;
    bool budget = w->budget;
    w->budget = false; /* bytes 0 in the pairs: one pair per entry */
    hp_status st = HP_OK;
    double lambda = 0;
    if (budget && w->hi < a->v.total_param_bytes) {
        double best = -INFINITY, free_lb = 0;
        st = global_bound(w, 0, &free_lb, err);
        /* a byte's price: log-spaced around the free bound over the bytes */
        double unit = fabs(free_lb) / a->v.total_param_bytes;
        for (int k = -12; k <= 12 && st == HP_OK; k++) {
            double l = unit * ldexp(1, k), v;
            st = global_bound(w, l, &v, err);
            if (st == HP_OK && v > best) best = v, lambda = l;
        }
        if (w->trace)
            fprintf(stderr, "autoshard: exhaustive: byte price %.3g s/B: global bound %.12g s\n",
                    lambda, best);
    }
    w->lambda = lambda;
    double shift = lambda * (budget ? w->hi : 0);
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) {
        if (a->cls[c].leader >= 0 || w->nd[c] <= 1) continue;
        st = build_factors(w, err);
        if (st == HP_OK) st = eliminate_all(w, c, F_MINI_ENTRIES, err);
        if (st != HP_OK) break;
        left_sum(w, c, lb[c]);
        for (int i = 0; i < w->nd[c]; i++) lb[c][i] -= shift;
    }
    w->budget = budget;
    w->lambda = 0;
    drop_factors(w);
    return st;
}

/* The cost of the solver's assignment (each deciding class's chosen strategy) priced by the
 * sums this file minimizes, or +inf where it is not one to use: a class without a choice,
 * a term that is infinite, or bytes outside the budget. A candidate for the upper bound only:
 * the bound prunes just the strategies of no assignment cheaper than a real one, so the
 * minimum stays exact whatever the solver chose (had it missed the optimum, the search would
 * find a lower one; the check fails then). */
static double incumbent(const ve *w) {
    const hp_autoshard *a = w->a;
    double cost = 0, bytes = 0;
    for (int c = 0; c < a->n_cls; c++) {
        const as_class *cl = &a->cls[c];
        if (cl->leader >= 0) continue;
        if (cl->chosen < 0 || cl->chosen >= cl->n_strat) return INFINITY;
        cost += a->lunary[cl->strat0 + cl->chosen];
        if (cl->param) bytes += cl->count * a->st[cl->strat0 + cl->chosen].mem_bytes;
    }
    for (int e = 0; e < a->n_ledges; e++) {
        const as_edge *ed = &a->ledges[e];
        cost += scost(ed, a->cls[ed->cu].chosen, a->cls[ed->cv].chosen);
    }
    if (w->budget && (bytes > w->hi || (w->exact_mem && bytes < w->lo))) return INFINITY;
    return isfinite(cost) ? cost : INFINITY;
}

/* Bound pruning: with ub the cost of some assignment in the budget, a strategy whose lower
 * bound exceeds ub is in no optimum. ub: the exact minimum over each class's few strategies
 * of least lower bound (a real assignment's cost), widened until one meets the budget. */
static hp_status bound_prune(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    double **lb = hp_calloc((size_t)a->n_cls + 1, sizeof *lb);
    int *nd = hp_malloc(((size_t)a->n_cls + 1) * sizeof *nd);
    int **dom = hp_calloc((size_t)a->n_cls + 1, sizeof *dom);
    hp_status st = lb && nd && dom ? HP_OK : nomem(err);
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) {
        nd[c] = w->nd[c];
        lb[c] = hp_calloc((size_t)w->nd[c] + 1, sizeof **lb);
        dom[c] = hp_malloc(((size_t)w->nd[c] + 1) * sizeof **dom);
        if (!lb[c] || !dom[c])
            st = nomem(err);
        else if (w->nd[c])
            if (w->nd[c] > 0) memcpy(dom[c], w->dom[c], (size_t)w->nd[c] * sizeof **dom);
    }
    double t0 = now_s();
    if (st == HP_OK) st = lower_bounds(w, lb, err);
    double ub = INFINITY;
    for (int few = 1; st == HP_OK && (few <= 3 || !isfinite(ub)) && few <= 8; few++) {
        /* each class's `few` least bounds per bytes it may hold (so that the budget can be
         * met) */
        for (int c = 0; c < a->n_cls; c++) {
            w->nd[c] = 0;
            for (int i = 0; i < nd[c]; i++) {
                int better = 0;
                double m = smem(w, c, dom[c][i]);
                for (int j = 0; j < nd[c]; j++)
                    better += smem(w, c, dom[c][j]) == m &&
                              (lb[c][j] < lb[c][i] || (lb[c][j] == lb[c][i] && j < i));
                if (better < few) w->dom[c][w->nd[c]++] = dom[c][i];
            }
        }
        double v = INFINITY;
        st = exact(w, &v, err);
        ub = fmin(ub, v);
        if (w->trace) fprintf(stderr, "autoshard: exhaustive: few %d: upper bound %.12g\n", few, v);
    }
    double inc = incumbent(w);
    if (w->trace) fprintf(stderr, "autoshard: exhaustive: the ILP's assignment: %.12g\n", inc);
    ub = fmin(ub, inc);
    double slack = 1e-9 * fabs(ub) + 1e-12; /* the bounds' rounding: keep, never drop, a tie */
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) {
        w->nd[c] = 0;
        for (int i = 0; i < nd[c]; i++)
            if (!(lb[c][i] > ub + slack)) w->dom[c][w->nd[c]++] = dom[c][i];
    }
    if (st == HP_OK) dead_end_elimination(w);
    for (int c = 0; c < a->n_cls && st == HP_OK; c++) w->stats.after_bounds += w->nd[c];
    if (w->trace)
        fprintf(stderr, "autoshard: exhaustive: bounds %.3f s, upper bound %.12g s\n", now_s() - t0,
                ub);
    for (int c = 0; lb && dom && c < a->n_cls; c++) hp_free(lb[c]), hp_free(dom[c]);
    hp_free(lb);
    hp_free(dom);
    hp_free(nd);
    return st;
}

static hp_status setup(ve *w, hp_err *err) {
    const hp_autoshard *a = w->a;
    HP_TRY(domains(w, err));
    w->words = (a->n_cls + 63) / 64;
    int max_nd = 1;
    for (int c = 0; c < a->n_cls; c++) max_nd = w->nd[c] > max_nd ? w->nd[c] : max_nd;
    w->tab = hp_malloc(((size_t)max_nd * (size_t)max_nd + 2) * sizeof *w->tab);
    w->min_mem = hp_calloc((size_t)a->n_cls + 1, sizeof *w->min_mem);
    if (!w->tab || !w->min_mem) return nomem(err);
    return HP_OK;
}

hp_status hp_autoshard_exhaustive(const hp_autoshard *a, int64_t max_work, double *best_s,
                                  hp_err *err) {
    ve w = {.a = a, .max_work = max_work, .max_entries = max_work};
    w.trace = getenv("HP_AUTOSHARD_TRACE") != NULL;
    w.budget = hp__as_budget(a, &w.lo, &w.hi);
    w.exact_mem = w.budget && w.lo > 0;
    double t0 = now_s(), answer = INFINITY;
    hp_status st = setup(&w, err);
    if (st == HP_OK) st = bound_prune(&w, err);
    if (st == HP_OK && w.trace)
        for (int c = 0; c < a->n_cls; c++)
            if (a->cls[c].leader < 0)
                fprintf(stderr, "autoshard: exhaustive: class %d: %d strategies, %d in play\n", c,
                        a->cls[c].n_strat, w.nd[c]);
    if (st == HP_OK) st = exact(&w, &answer, err);
    if (st == HP_OK && !isfinite(answer))
        st = hp_errf(err, HP_INVALID, "exhaustive search: no feasible assignment");
    if (st == HP_OK) *best_s = answer;
    if (w.trace)
        fprintf(stderr,
                "autoshard: exhaustive: %s, minimum %.12g s; strategies %d finite, %d after "
                "dominance, %d after bounds; largest table %lld entries, %lld pairs combined, "
                "%.3f s\n",
                st == HP_OK ? "done" : "refused", answer, w.stats.finite, w.stats.after_dominance,
                w.stats.after_bounds, (long long)w.stats.biggest, (long long)w.work, now_s() - t0);
    drop_factors(&w);
    hp_free(w.f);
    hp_free(w.tmp);
    hp_free(w.tmp2);
    hp_free(w.out);
    hp_free(w.min_mem);
    hp_free(w.tab);
    for (int c = 0; w.dom && c < a->n_cls; c++) hp_free(w.dom[c]);
    hp_free(w.dom);
    hp_free(w.nd);
    return st;
}
