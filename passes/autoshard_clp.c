/* passes/autoshard_clp.c — the auto-sharding LP relaxation by COIN-OR Clp, its optimal basis
 * handed back to GLPK (docs/autoshard.md, "Solve").
 *
 * GLPK's simplex, primal or dual, stalls on the larger problems: an exported Llama's unfused
 * layers at dp=2 x tp=2 (20k rows x 142k columns) ran past five minutes, while Clp's dual
 * simplex solves the same LP in 2-3 s. Clp solves it from scratch (the dual simplex, without
 * its presolve) and, for the budget's search, again with a new objective from the last basis
 * (the primal simplex); the Lagrangian bookkeeping and glp_intopt's branch and bound stay
 * GLPK's, continuing from the basis Clp ends on, which GLPK takes as it stands (a
 * refactorization, no pivots). Clp sees GLPK's problem exactly: the same columns, rows,
 * bounds and objective.
 */
#include "passes/autoshard_internal.h"

#include <Clp_C_Interface.h>
#include <float.h>
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Clp's status codes of a variable (ClpSimplex::Status) */
enum { CLP_FREE = 0, CLP_BASIC = 1, CLP_AT_UPPER = 2, CLP_AT_LOWER = 3, CLP_FIXED = 5 };

static void bounds_of(int type, double lb, double ub, double *lo, double *hi) {
    *lo = type == GLP_FR || type == GLP_UP ? -DBL_MAX : lb;
    *hi = type == GLP_FR || type == GLP_LO ? DBL_MAX : ub;
    if (type == GLP_FX) *hi = lb;
}

/* GLPK's status of a non-basic or basic variable from Clp's, given its bound type. */
static int glp_stat_of(int clp, int type) {
    if (clp == CLP_BASIC) return GLP_BS;
    switch (type) {
    case GLP_FX:
        return GLP_NS;
    case GLP_FR:
        return GLP_NF;
    case GLP_LO:
        return GLP_NL;
    case GLP_UP:
        return GLP_NU;
    default:
        return clp == CLP_AT_UPPER ? GLP_NU : GLP_NL; /* GLP_DB */
    }
}

/* Loads GLPK's problem into a new Clp model. */
static Clp_Simplex *load(glp_prob *lp) {
    int m = glp_get_num_rows(lp), n = glp_get_num_cols(lp);
    CoinBigIndex nnz = 0;
    for (int j = 1; j <= n; j++) nnz += glp_get_mat_col(lp, j, NULL, NULL);
    CoinBigIndex *start = hp_malloc(((size_t)n + 1) * sizeof *start);
    int *index = hp_malloc(((size_t)nnz + 1) * sizeof *index);
    double *value = hp_malloc(((size_t)nnz + 1) * sizeof *value);
    double *cl = hp_malloc((size_t)n * sizeof *cl), *cu = hp_malloc((size_t)n * sizeof *cu);
    double *obj = hp_malloc((size_t)n * sizeof *obj);
    double *rl = hp_malloc((size_t)m * sizeof *rl), *ru = hp_malloc((size_t)m * sizeof *ru);
    /* glp_get_mat_col fills 1-based arrays: one more slot than the column holds */
    int *ind = hp_malloc(((size_t)m + 1) * sizeof *ind);
    double *val = hp_malloc(((size_t)m + 1) * sizeof *val);
    Clp_Simplex *model = NULL;
    if (start && index && value && cl && cu && obj && rl && ru && ind && val) {
        start[0] = 0;
        for (int j = 1; j <= n; j++) {
            int len = glp_get_mat_col(lp, j, ind, val);
            for (int k = 1; k <= len; k++) {
                index[start[j - 1] + k - 1] = ind[k] - 1;
                value[start[j - 1] + k - 1] = val[k];
            }
            start[j] = start[j - 1] + len;
            bounds_of(glp_get_col_type(lp, j), glp_get_col_lb(lp, j), glp_get_col_ub(lp, j),
                      &cl[j - 1], &cu[j - 1]);
            obj[j - 1] = glp_get_obj_coef(lp, j);
        }
        for (int i = 1; i <= m; i++)
            bounds_of(glp_get_row_type(lp, i), glp_get_row_lb(lp, i), glp_get_row_ub(lp, i),
                      &rl[i - 1], &ru[i - 1]);
        model = Clp_newModel();
        if (model) {
            Clp_loadProblem(model, n, m, start, index, value, cl, cu, obj, rl, ru);
            Clp_setOptimizationDirection(model, glp_get_obj_dir(lp) == GLP_MAX ? -1 : 1);
        }
    }
    hp_free(start);
    hp_free(index);
    hp_free(value);
    hp_free(cl);
    hp_free(cu);
    hp_free(obj);
    hp_free(rl);
    hp_free(ru);
    hp_free(ind);
    hp_free(val);
    return model;
}

/* The process's CPU seconds: Clp's own limit counts them too (CoinCpuTime), so that a loaded
 * machine (ranks compiling side by side on few cores) does not cut a solve short. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int hp__as_clp_simplex(hp_as_clp *c, glp_prob *lp, bool warm, double limit_s, bool trace) {
    int m = glp_get_num_rows(lp), n = glp_get_num_cols(lp);
    if (m == 0 || n == 0) return -1;
    /* Debian's Clp asserts (aborts) on an objective coefficient of 1e25 or more: the budget's
     * search can price a byte that high (its multiplier grows 16-fold a step); GLPK takes
     * those */
    for (int j = 1; j <= n; j++)
        if (!(fabs(glp_get_obj_coef(lp, j)) < 1e20)) return -1;
    double t0 = cpu_s();
    Clp_Simplex *model = c->model;
    int status = -1;
    if (warm && model && Clp_numberRows(model) == m && Clp_numberColumns(model) == n) {
        /* A new objective: the basis stays primal feasible and the primal simplex goes on from
         * it, a few pivots for a small change. A large one (the budget's price of a byte
         * multiplied by 16) can take it longer than solving afresh: past an eighth of the last
         * solve's iterations it is solved afresh (iterations, not seconds: the same job gives
         * the same plan on any machine, at any load). */
        double *obj = hp_malloc((size_t)n * sizeof *obj);
        if (!obj) return -1;
        for (int j = 1; j <= n; j++) obj[j - 1] = glp_get_obj_coef(lp, j);
        Clp_chgObjCoefficients(model, obj);
        hp_free(obj);
        int cap = c->fresh_iterations / 8 > 500 ? c->fresh_iterations / 8 : 500;
        Clp_setMaximumIterations(model, cap);
        Clp_setNumberIterations(model, 0);
        Clp_setMaximumSeconds(model, limit_s);
        Clp_primal(model, 0);
        status = Clp_status(model);
        if (trace)
            fprintf(stderr,
                    "autoshard: clp (warm): status %d, %d iterations, objective %.10g, "
                    "%.3f s CPU\n",
                    status, Clp_numberIterations(model), Clp_objectiveValue(model), cpu_s() - t0);
        if (status == 3 && Clp_numberIterations(model) >= cap) status = -1;
    }
    if (status < 0) {
        hp__as_clp_free(c);
        if (!(model = c->model = load(lp))) return -1;
        double t1 = cpu_s();
        Clp_setLogLevel(model, trace ? 1 : 0);
        Clp_setMaximumSeconds(model, fmax(limit_s - (t1 - t0), 1e-3));
        /* without Clp's presolve: the basis its postsolve left took GLPK ~1300 more pivots on
         * the exported Llama (3 s), while Clp's own basis is optimal to GLPK as it stands */
        Clp_dual(model, 0);
        status = Clp_status(model);
        c->fresh_iterations = Clp_numberIterations(model);
        if (trace)
            fprintf(stderr,
                    "autoshard: clp: status %d, %d iterations, objective %.10g, %.3f s CPU\n",
                    status, c->fresh_iterations, Clp_objectiveValue(model), cpu_s() - t1);
    }
    if (status == 1 || status == 3) return status == 1 ? GLP_ENOPFS : GLP_ETMLIM;
    if (status != 0) return -1; /* GLPK's own simplex says what is wrong */
    for (int j = 1; j <= n; j++)
        glp_set_col_stat(lp, j,
                         glp_stat_of(Clp_getColumnStatus(model, j - 1), glp_get_col_type(lp, j)));
    for (int i = 1; i <= m; i++)
        glp_set_row_stat(lp, i,
                         glp_stat_of(Clp_getRowStatus(model, i - 1), glp_get_row_type(lp, i)));
    return 0;
}

void hp__as_clp_free(hp_as_clp *c) {
    if (c->model) Clp_deleteModel(c->model);
    c->model = NULL;
}
