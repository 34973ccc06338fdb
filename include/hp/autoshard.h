/* hp/autoshard.h — auto-sharding (AutoParallel's global ILP, docs/autoshard.md): every node's
 * candidate strategies from the op table's sharding rules, priced by one cost model on a device
 * profile, one integer program solved with GLPK, the chosen placements applied by the spmd pass.
 *
 *   hp_autoshard *a;
 *   HP_TRY(hp_autoshard_solve(graph, job, &profile, NULL, &a, err)); // enumerate, build, solve
 *   HP_TRY(hp_autoshard_apply(a, &placed, err));                     // the per-rank graph
 *   hp_autoshard_explain(a, "layers.0.attention.wq.weight", &text, err);
 *   hp_autoshard_free(a);
 *
 * In the pipeline it is the spmd pass of a plan with mode auto (passes/pipeline.c); hp_compiled
 * keeps the solved problem for `hpctl plan --explain` and `--json`.
 */
#ifndef HP_AUTOSHARD_H
#define HP_AUTOSHARD_H

#include "hp/job.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the cost model knows of a device and its links. */
typedef struct hp_device_profile {
    char name[16];       /* "cpu", "h100", "h200", "a100" */
    double peak_flops;   /* dense FLOP/s of the compute dtype (bf16 on GPUs, f32 on cpu) */
    double efficiency;   /* fraction of the peak a large matmul reaches */
    double mem_bw;       /* bytes/s of device memory */
    double mem_capacity; /* bytes one rank may hold: the GPU's memory; a cpu rank's share of RAM */
    double kernel_s;     /* fixed cost of one kernel launch */
    hp_link_class intra; /* a mesh dim inside one node */
    hp_link_class inter; /* a mesh dim spanning nodes */
    int gpus_per_node;   /* ranks per node; 0: every dim is intra-node */
    bool measured;       /* cpu: figures probed on this machine (else assumed) */
    /* cpu: the host's CPUs, and a collective's latency when more ranks than CPUs share them
     * (each waiting rank sleeps, and a woken one waits for a CPU the others compute on);
     * 0: unknown (a version-1 probe), the latency above is used */
    int cpus;
    double oversubscribed_latency;
    /* cpu: the fraction of peak_flops the causal attention kernels (forward + backward, the
     * FLOPs of the pairs the mask leaves) reach at head dims 16, 32, 64, 128; 0: `efficiency` */
    double attn_efficiency[4];
} hp_device_profile;

/* The efficiency a fused attention of head dim d reaches on p: the probed figure at the
 * nearest probed head dims (interpolated in log2 d, clamped at the ends), else p->efficiency. */
double hp_device_profile_attn_efficiency(const hp_device_profile *p, int64_t d);
/* The rate at which a fused attention (q [.., T, d], keys S) works off the FLOPs the cost
 * model counts for it (hp__node_flops: every (query, key) pair, as torchtitan counts): the
 * peak times its efficiency, over the fraction of pairs a causal mask leaves (T = S: (T+1)/2T),
 * since the kernels skip the masked blocks. */
double hp_device_profile_attn_rate(const hp_device_profile *p, int64_t d, bool causal, int64_t t,
                                   int64_t s);

/* The profile by name: "h100", "h200", "a100" (peak from torchtitan's table, NCCL-derived
 * bus bandwidths, docs/autoshard.md), "cpu" (this machine's probe figures cached by
 * `hp-worker --probe-profile`, else assumed ones with measured false). gpus_per_node <= 0: the
 * profile's default (8 for GPUs, 0 for cpu). HP_INVALID naming an unknown name. */
hp_status hp_device_profile_get(const char *name, int gpus_per_node, hp_device_profile *out,
                                hp_err *err);

/* The profile a job is planned on: its plan's device_profile, else "h100" for a cuda job and
 * "cpu" for a cpu one; gpus_per_node from the plan. A cpu profile is the host's: a rank of a
 * multi-rank job gets its share of the peak and memory bandwidth (the ranks on one host,
 * gpus_per_node of them or the whole world, share its cores). */
hp_status hp_device_profile_for_job(const hp_job *job, hp_device_profile *out, hp_err *err);

/* The link class of each of job's mesh dims on profile p: with gpus_per_node, a dim is
 * intra-node when its ranks (row-major, the last dim fastest) fit in one node, else
 * inter-node; the cpu profile's probed shm link for every dim; without gpus_per_node, the
 * plan's own figures. link[job->plan.n_mesh]. */
void hp_device_profile_links(const hp_device_profile *p, const hp_job *job, hp_link_class *link);

/* The cpu probe's cache ($XDG_CACHE_HOME/hp, else ~/.cache/hp; one file per CPU model):
 * read into *out (HP_NOT_FOUND when absent or unreadable), or written (atomically). */
hp_status hp_cpu_profile_load(hp_device_profile *out, hp_err *err);
hp_status hp_cpu_profile_store(const hp_device_profile *p, hp_err *err);

/* Solver settings. */
typedef struct hp_autoshard_opts {
    double time_limit_s;    /* 0: 5 s */
    double lp_time_limit_s; /* the LP relaxation's, CPU seconds (not wall: load does not cut
                             * it short); 0: HP_AUTOSHARD_LP_LIMIT_S or 6 x the above */
    double mip_gap;         /* relative; < 0: 2%; 0: proven optimal */
} hp_autoshard_opts;

/* What the solve did (hpctl plan --json "solver"). */
typedef struct hp_autoshard_stats {
    int nodes;       /* nodes of the graph */
    int classes;     /* decision groups (identical repeated nodes share one) */
    int strategies;  /* candidate strategies over all classes */
    int variables;   /* columns of the ILP (binary strategy choices + continuous edge flows) */
    int binaries;    /* of which binary */
    int constraints; /* rows */
    int presolved_rows, presolved_cols; /* -1: not reported */
    char lp_solver[8]; /* "clp" (its dual simplex); "glpk" where Clp failed and GLPK solved it */
    double enumerate_s, build_s, solve_s, apply_s;
    double objective_s; /* modelled step time of the chosen plan, seconds */
    double gap;         /* relative MIP gap of the reported solution (0: proven optimal) */
    bool optimal;       /* proven within the requested gap */
    bool time_limited;  /* the solver stopped at the time limit with a feasible plan */
    bool refolded;     /* with views following their inputs no plan was found: every node decided */
    bool lp_timed_out; /* the LP relaxation hit its limit (HP_AUTOSHARD_LP_LIMIT_S at least) */
} hp_autoshard_stats;

/* The least time the LP relaxation is given by default (six times the time limit when more),
 * seconds. */
#define HP_AUTOSHARD_LP_LIMIT_S 30.0

typedef struct hp_autoshard hp_autoshard;

/* Enumerates, prices and solves the plan of global joint graph g (unplaced) for job's mesh on
 * profile. Constraints: data inputs Shard(0) on the mesh dim "dp" (Replicate elsewhere), the
 * loss Replicate, each gradient brought to its parameter's storage, the plan's placement
 * constraints (storage of matching inputs), FSDP marks (stored Shard on dp, gathered), the
 * parameter-memory budget weighted by bytes. HP_INVALID naming the constraint set that cannot
 * be met; HP_UNSUPPORTED what this version cannot plan. */
hp_status hp_autoshard_solve(const hp_graph *g, const hp_job *job, const hp_device_profile *profile,
                             const hp_autoshard_opts *opts, hp_autoshard **out, hp_err *err);

/* The placed (per-rank) graph of the chosen plan (the spmd pass with the chosen strategies). */
hp_status hp_autoshard_apply(const hp_autoshard *a, struct hp_graph **out, hp_err *err);

const hp_autoshard_stats *hp_autoshard_get_stats(const hp_autoshard *a);

/* Placeholder i's (graph order: parameters, buffers, data) chosen storage and compute
 * placements (each [ndim]); false when i is not a placeholder. */
bool hp_autoshard_placeholder(const hp_autoshard *a, int i, hp_placement *storage,
                              hp_placement *compute);

/* The modelled step time of the chosen plan split in compute, redistribution and optimizer
 * seconds (sum = stats.objective_s). */
void hp_autoshard_breakdown(const hp_autoshard *a, double *compute_s, double *comm_s,
                            double *optimizer_s);

/* `hpctl plan --explain WHAT`: WHAT is a placeholder's FQN or a node id ("12" or "%12"): the
 * chosen strategy, the next best alternatives with their cost (compute, each redistribution,
 * with the rest of the plan fixed) and the constraint that bound the choice. *text is
 * hp_malloc'd. HP_NOT_FOUND naming WHAT. */
hp_status hp_autoshard_explain(const hp_autoshard *a, const char *what, char **text, hp_err *err);

/* The minimum objective over every assignment of strategies to classes under the same cost
 * model and constraints, by exact dynamic programming without GLPK (passes/autoshard_exhaust.c,
 * docs/autoshard.md; the solver's own assignment, when `a` holds one, only bounds the search's
 * pruning from above); for tests on small graphs. HP_UNSUPPORTED (a message naming the limit,
 * *best_s untouched) when a table would exceed max_work entries or the pairs combined would
 * exceed max_work: the bound on its time. HP_INVALID when no assignment is feasible. */
hp_status hp_autoshard_exhaustive(const hp_autoshard *a, int64_t max_work, double *best_s,
                                  hp_err *err);

void hp_autoshard_free(hp_autoshard *a);

#ifdef __cplusplus
}
#endif
#endif
