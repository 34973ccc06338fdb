/* passes/autoshard_internal.h — what the files of auto-sharding share (hp/autoshard.h is the
 * interface; docs/autoshard.md the model).
 *
 *   autoshard_enum.c  classes of identical nodes, each class's strategies, their costs, the
 *                     class-edges and their redistribution costs
 *   autoshard_solve.c the integer program (GLPK)
 *   autoshard_exhaust.c the exhaustive check of its optimum (dynamic programming, no GLPK)
 *   autoshard.c       hp_autoshard_solve/apply/explain, the pipeline pass
 */
#ifndef HP_PASSES_AUTOSHARD_INTERNAL_H
#define HP_PASSES_AUTOSHARD_INTERNAL_H

#include "hp/autoshard.h"
#include "passes/passes_internal.h"

#define AS_MAX_IN (HP_SHARD_MAX_IN + 1) /* + a vocab-parallel embedding's chunk base */

/* One way to run a node: the placements its inputs must arrive in and its outputs get, per
 * mesh dim. A placeholder's out[0] is its compute placement, store its storage. */
typedef struct as_strat {
    hp_placement in[AS_MAX_IN][HP_MESH_MAX_DIMS];
    hp_placement out[HP_MAX_OUTS][HP_MESH_MAX_DIMS];
    hp_placement store[HP_MESH_MAX_DIMS];
    int vocab_dim;    /* embedding(_dense_backward) run vocab-parallel on this mesh dim; -1 */
    double compute_s; /* one node's kernel (roofline) */
    double gather_s;  /* placeholder: storage -> compute, times the regions that gather it */
    double opt_s;     /* parameter: the optimizer over its local storage */
    double loss_s;    /* the loss node: its output brought to Replicate */
    double mem_bytes; /* parameter: local storage bytes (padding included) */
} as_strat;

/* Nodes that share one decision: identical op, attributes, types, and inputs at the same
 * relative position (or the same placeholder class), so the layers of a model collapse. */
typedef struct as_class {
    int rep;   /* representative node */
    int count; /* nodes in the class */
    int strat0, n_strat;
    int col0; /* its first ILP column (x variables, one per strategy) */
    int chosen;
    bool placeholder, param, data;
    double bytes; /* parameter: global bytes of one node */
    /* what restricted its strategies: -1 none; k >= 0 plan.constraints[k]; -2 an FSDP mark;
     * -3 the data input's batch split */
    int bound_by;
    /* A view or one-input elementwise node follows its input (docs/autoshard.md): leader is
     * the class that decides for it (-1: it decides itself), follow[s] its strategy when the
     * leader takes its strategy s (-1: none fits). */
    int leader;
    int *follow;
} as_class;

enum { AS_EDGE_GRAD = -1 }; /* as_edge.j of a gradient brought to its parameter's storage */

/* Every value (cu, k) read by class cv as input j (j = AS_EDGE_GRAD: the gradient of parameter
 * class cv), counted over the nodes, priced by group: the distinct placements the producer's
 * strategies give (p) against those the consumer's strategies need (q). */
typedef struct as_edge {
    int cu, k, cv, j;
    int count;
    hp_type type; /* the value's global type */
    int n_p, n_q;
    int *p_of;    /* [cls[cu].n_strat] -> p group */
    int *q_of;    /* [cls[cv].n_strat] -> q group */
    double *cost; /* [n_p * n_q], seconds; INFINITY: no redistribution offered */
    int col0;     /* ILP columns of the feasible pairs, in (p, q) order */
} as_edge;

struct hp_autoshard {
    hp_graph *g; /* a copy of the global graph */
    struct {
        int n_ph, n_params, n_buffers, n_data;
        int32_t loss;
        bool reshard;
        double mem_low, mem_high, total_param_bytes;
    } v;
    hp_graph_mesh mesh;
    hp_link_class link[HP_MESH_MAX_DIMS];
    hp_device_profile prof;
    int *cls_of; /* [n_nodes] */
    as_class *cls;
    int n_cls;
    as_strat *st;
    int n_st, cap_st;
    as_edge *edges;
    int n_edges;
    /* the problem the solvers see, over the deciding classes: each strategy's cost with its
     * followers' and the edges among them folded in (lunary[strat], count-weighted), and the
     * edges between different deciding classes (p_of, q_of over the deciders' strategies) */
    double *lunary;
    as_edge *ledges;
    int n_ledges;
    hp_autoshard_stats stats;
    char (*constraint_text)[160]; /* [n_constraints]: "FQN=PLACEMENTS" for explain */
    int n_constraints;
};

/* autoshard_enum.c */
hp_status hp__as_enumerate(hp_autoshard *a, const hp_job *job, hp_err *err);
/* Seconds to bring a value of global type t from placements p to q (spmd's walk); INFINITY
 * when a step is not offered. */
double hp__as_move(const hp_autoshard *a, const hp_type *t, const hp_placement *p,
                   const hp_placement *q);
/* A strategy's unary cost for one node (compute + gather + optimizer + loss). */
static inline double hp__as_unary(const as_strat *s) {
    return s->compute_s + s->gather_s + s->opt_s + s->loss_s;
}
/* What strategy s of cv needs for input j (a variadic op's inputs share in[0]). */
const hp_placement *hp__as_want(const hp_autoshard *a, int cv, const as_strat *s, int j);

/* autoshard_follow.c: lunary, ledges and the followers (after hp__as_enumerate); with follow
 * false every class decides. hp__as_unfold undoes it (for a fold without followers). */
hp_status hp__as_fold(hp_autoshard *a, bool follow, hp_err *err);
void hp__as_unfold(hp_autoshard *a);
void hp__as_follow_choices(hp_autoshard *a);

/* autoshard_solve.c */
hp_status hp__as_ilp(hp_autoshard *a, const hp_autoshard_opts *opts, hp_err *err);
/* The parameter bytes one rank may hold under the budget, or false when it is (0, 1). */
bool hp__as_budget(const hp_autoshard *a, double *lo, double *hi);

/* autoshard_clp.c: GLPK's LP solved by Clp, the optimal basis set in lp. From scratch (Clp's
 * dual simplex) unless warm and the model of the last solve has lp's shape: then with lp's new
 * objective by the primal simplex from the basis it ended on (afresh past an eighth of the
 * iterations of the last solve from scratch). 0, GLP_ENOPFS when the LP has no feasible solution,
 * GLP_ETMLIM past limit_s, or -1 (Clp failed: solve it with GLPK). */
typedef struct hp_as_clp {
    void *model;          /* Clp_Simplex: the problem as last loaded; NULL: none yet */
    int fresh_iterations; /* the last solve from scratch took this many */
} hp_as_clp;
struct glp_prob;
int hp__as_clp_simplex(hp_as_clp *c, struct glp_prob *lp, bool warm, double limit_s, bool trace);
void hp__as_clp_free(hp_as_clp *c);

#endif
