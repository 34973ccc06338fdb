/* hp/passes.h — the compiler: the pass pipeline that turns a job's joint graph into the
 * per-rank (SPMD) graph and Program, with a report of what each pass did.
 *
 * The order is one readable list in passes/pipeline.c:
 *   dce → canonicalize → fuse_attention → activation_checkpoint → loss_parallel → spmd | fsdp
 *   → mixed_precision → fuse_cross_entropy → fuse_swiglu → overlap → bucketing
 *   → (memory plan + lowering: hp_lower)
 * Between passes the verifier runs (always: it costs a few ms on the 405B graph;
 * HP_VERIFY_PASSES=0 turns it off); each pass reports nodes in/out, collectives after it,
 * bytes moved per step and its time; the IR after a pass is dumped as $HP_DUMP_DIR/NN-<pass>.hpir
 * when the pass config's dump list or $HP_DUMP (comma-separated pass names, or "all") names
 * it.
 *
 * Passes are functions from a graph to a new graph (the input is not modified); they never
 * print. Ownership: everything in an hp_compiled belongs to it (hp_compiled_free).
 */
#ifndef HP_PASSES_H
#define HP_PASSES_H

#include "hp/job.h"
#include "hp/program.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_PASS_NAME_LEN 32
#define HP_MAX_WARNINGS  64

/* What one pass did. */
typedef struct hp_pass_report {
    char name[HP_PASS_NAME_LEN];
    int nodes_in, nodes_out;
    int collectives;    /* collectives in the graph after the pass */
    int64_t comm_bytes; /* per rank per step, summed hp_collective_bytes of its collectives */
    double seconds;
    bool ran; /* false: disabled by the pass config */
    /* fuse_attention: unfused causal attentions (bmm, scale, mask, softmax, bmm) it made fused
     * attention forwards, and how many of their backwards it fused with them */
    int fused_attention, fused_attention_backward;
    /* fuse_cross_entropy: losses (_log_softmax + nll_loss, with their backwards) it made
     * fused_cross_entropy */
    int fused_cross_entropy;
    /* fuse_swiglu: MLP gates (silu, mul and their backward) it made swiglu */
    int fused_swiglu;
    /* activation_checkpoint: blocks whose forward the backward recomputes, nodes it copies for
     * that, and their FLOPs (hp/passes.h's cost convention: matrix products and attention) */
    int ac_blocks, ac_recomputed;
    double ac_recompute_flops;
    /* fsdp: why the 1-D FSDP rewrite refused the graph, which spmd then placed ("": it did not) */
    char placed_by_spmd[HP_ERR_MSG_MAX];
} hp_pass_report;

/* Everything a pass may read: the job (plan, pass config), the world size, and where to put
 * warnings (one line each, e.g. "fsdp: pattern 'layer.*' matches no parameter"). */
typedef struct hp_pass_ctx {
    const hp_job *job;
    int world;
    int n_warnings;
    char warnings[HP_MAX_WARNINGS][HP_ERR_MSG_MAX];
    /* the pass being run records its own counters here (the manager adds timing) */
    hp_pass_report *report;
    /* plan.mode auto: the solved problem (hp/autoshard.h), which hp_compile keeps */
    struct hp_autoshard *autoshard;
    /* the fsdp pass handed a graph it refuses to spmd: the later passes see a placed graph */
    bool fsdp_placed_by_spmd;
} hp_pass_ctx;

/* A pass: reads `in`, returns a new verified-shape graph in *out (which may be a clone of in
 * when nothing changes). Errors name the node. */
typedef hp_status (*hp_pass_fn)(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);

/* Adds a warning to ctx (dropped past HP_MAX_WARNINGS). */
void hp_pass_warn(hp_pass_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The passes, each usable alone (tests call them directly). */
hp_status hp_pass_dce(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
hp_status hp_pass_canonicalize(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
/* The unfused causal attention of exported models into the fused op (canonicalize_attention.c):
 * expects a canonicalized graph, returns one. */
hp_status hp_pass_fuse_attention(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
/* Activation checkpointing (passes/activation_checkpoint.c): the backward recomputes the
 * forward of the repeated blocks ("layers.N") that plan.ac_mode and plan.ac_every select instead
 * of keeping it; the outputs are the input's bit for bit. On the global joint graph, after
 * fuse_attention. hp_activation_checkpoint is the pass with explicit options (r may be NULL;
 * its ac_* counters are added to). */
hp_status hp_pass_activation_checkpoint(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                        hp_err *err);
hp_status hp_activation_checkpoint(const hp_graph *in, hp_ac_mode mode, int every,
                                   hp_pass_report *r, hp_graph **out, hp_err *err);
hp_status hp_pass_fsdp(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
/* The mixed-precision policy (plan.param_dtype / reduce_dtype) on a per-rank graph (1-D FSDP
 * or DDP, world 1, or placed by spmd): passes/mixed_precision.c. */
hp_status hp_pass_mixed_precision(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                  hp_err *err);
/* The loss's _log_softmax + nll_loss (and backwards) into fused_cross_entropy, after
 * mixed_precision on graphs without placements: passes/fuse_cross_entropy.c. */
hp_status hp_pass_fuse_cross_entropy(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                     hp_err *err);
/* The MLP gate mul(silu(a), b) (and its backward) into swiglu, after fuse_cross_entropy on
 * graphs without placements: passes/fuse_swiglu.c. */
hp_status hp_pass_fuse_swiglu(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
hp_status hp_pass_overlap(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);
hp_status hp_pass_bucketing(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err);

/* Placement propagation and redistribution (passes/spmd.c, docs/placements.md): the global
 * joint graph `in` on `mesh`, placeholder p placed inputs[p * ndim + i] on mesh dim i; the
 * graph outputs brought to outputs[k * ndim + i] (NULL: the loss Replicate, gradient k to
 * parameter k's placements). *out is verified. Not in the pipeline yet: the runtime does not
 * run N-D programs. HP_UNSUPPORTED naming what this version cannot place. */
hp_status hp_pass_spmd(const hp_graph *in, const hp_graph_mesh *mesh, const hp_placement *inputs,
                       const hp_placement *outputs, hp_graph **out, hp_err *err);

/* What hp_pass_spmd_ex takes beyond placements. */
typedef struct hp_spmd_opts {
    /* NULL, or compute[p * ndim + i]: the placement placeholder p's consumers see on mesh dim
     * i. Equal to its storage placement (inputs[...]), or Replicate where the storage is
     * Shard: the placeholder is gathered before use (FSDP), its graph-output gradient brought
     * back to the storage split by a reduce-scatter. Only such a gathered storage split may be
     * uneven (ceil chunks padded with zeros, as passes/fsdp.c pads). */
    const hp_placement *compute;
    /* Gathered placeholders are gathered again for their backward uses (nodes after the loss
     * node, the forward views they read recomputed), so no gathered copy lives across the
     * step; false: one gather serves both. */
    bool reshard_after_forward;
    /* NULL: propagation chooses each compute node's placements (greedy, per mesh dim). Else
     * they were chosen elsewhere (auto-sharding): called once per compute node id of `in`,
     * it writes the placements node id's inputs must have (in_pl[j * ndim + i]) and its
     * outputs get (out_pl[k * ndim + i]), and *vocab_dim: the mesh dim an embedding (or the
     * gradient of its weight) runs vocab-parallel on (chunked_embedding(_backward), whose third
     * input, the chunk base, then takes in_pl[2 * ndim + ...]), -1 none. The choice must be
     * one the op's sharding rules offer on the pieces the earlier mesh dims leave. */
    hp_status (*choose)(void *ctx, int id, hp_placement *in_pl, hp_placement *out_pl,
                        int *vocab_dim, hp_err *err);
    void *choose_ctx;
} hp_spmd_opts;

/* hp_pass_spmd with opts (NULL: every placeholder computed in its storage placements). The
 * placed graph's placeholders carry their storage placements (the rank's local box). */
hp_status hp_pass_spmd_ex(const hp_graph *in, const hp_graph_mesh *mesh, const hp_placement *inputs,
                          const hp_placement *outputs, const hp_spmd_opts *opts, hp_graph **out,
                          hp_err *err);

/* Loss parallel (passes/loss_parallel.c, docs/placements.md): rewrites the cross entropy of a
 * global joint graph (_log_softmax, nll_loss_forward and their backward ops) into ops that
 * all have vocab-sharded forms (amax -> Partial(max), sum -> Partial(sum)), reading the rank's
 * vocab indices from a new buffer placeholder `vocab_index_fqn` f32[V] with init arange (placed
 * tp:Shard(0) with output.weight, each rank holds its own vocab range). The result equals `in`
 * on the reference evaluator; a graph without nll_loss is returned as a clone. HP_UNSUPPORTED:
 * nll ops of different class counts, V >= 2^24; HP_INVALID: `in` already placed, or already
 * holding a placeholder of that FQN. As a pipeline pass it sets f32_logits under a bf16
 * policy. */
#define HP_VOCAB_INDEX_FQN "hp.vocab_index"
typedef struct hp_loss_parallel_opts {
    const char *vocab_index_fqn; /* NULL: HP_VOCAB_INDEX_FQN */
    /* the logits cast to f32 before the cross entropy (torchtitan's `pred.float()`): a cast
     * that changes nothing in an f32 graph, where the mixed-precision pass will narrow the
     * logits to bf16 (plan.param_dtype), and keeps the whole vocab-sharded loss, its
     * collectives and its first gradients in f32 there */
    bool f32_logits;
} hp_loss_parallel_opts;
hp_status hp_pass_loss_parallel(const hp_graph *in, const hp_loss_parallel_opts *o, hp_graph **out,
                                hp_err *err);
/* The same as a pipeline pass (default options). */
hp_status hp_pass_loss_parallel_run(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                    hp_err *err);

/* Bytes one rank moves per step through collective node `id` of g, the convention of every
 * comm_bytes in this header (N = the node's group_size; a ring, links full-duplex, so this
 * is what one direction of a rank's link carries): all_gather receives (N-1)/N of its output,
 * reduce_scatter sends (N-1)/N of its input, all_reduce 2(N-1)/N of its tensor, all_to_all
 * (N-1)/N of its input. 0 for any other node and for N = 1. */
int64_t hp_collective_bytes(const hp_graph *g, int id);

/* Per-rank memory, bytes, before anything runs. param_copies: the param_dtype copies of the
 * parameters (mixed precision) kept between steps and rewritten by the optimizer. */
typedef struct hp_memory_report {
    int64_t params, grads, optimizer, param_copies, activations, comm, total;
    int64_t grad_accum; /* gradient accumulation (hp_job_grad_accum > 1): one f32 gradient */
} hp_memory_report;

/* The cost model's estimate for one step of one rank, with its stated assumptions. A step
 * is grad_accum micro-steps (runs of the program); compute, comm, flops and by_op are one
 * micro-step's. */
typedef struct hp_cost_estimate {
    double compute_s;      /* sum over kernels of the roofline on the device profile */
    double comm_s;         /* sum over collectives of latency + bytes / bandwidth */
    double exposed_comm_s; /* comm not hidden behind compute, given the schedule */
    double optimizer_s;    /* AdamW over the local parameters, at memory bandwidth */
    int64_t grad_accum;    /* micro-steps a step (hp_job_grad_accum) */
    double accumulate_s;   /* adding the micro-steps' gradients (grad_accum - 1 passes) */
    double step_s;         /* grad_accum x (compute + exposed comm) + accumulate + optimizer */
    double forward_s;      /* one evaluated batch: the loss's nodes, collectives not overlapped */
    double flops;          /* per micro-step per rank */
    double peak_flops, efficiency, mem_bw; /* of the device profile */
    double mem_capacity;       /* bytes one rank may hold on the profile's device (0: unknown) */
    double bandwidth, latency; /* of the mesh's dp link */
    char profile[16];          /* the profile's name (hp/autoshard.h) */
    bool profile_measured;     /* cpu: probed on this machine */
    /* compute_s by op: the kernels of each op, their roofline time, FLOPs and bytes moved */
    struct {
        int count;
        double seconds, flops, bytes;
    } by_op[HP_OP_COUNT];
} hp_cost_estimate;

typedef struct hp_compiled {
    hp_graph *graph; /* the per-rank graph after all passes */
    /* its lowering (rank 0's; other ranks differ only in rank), whose own graph may share
     * graph's node types and attributes: the two are freed together (hp_compiled_free) */
    hp_program *program;
    int world;
    int n_passes;
    hp_pass_report passes[16];
    int n_warnings;
    char warnings[HP_MAX_WARNINGS][HP_ERR_MSG_MAX];
    hp_memory_report memory;
    hp_cost_estimate cost;
    /* plan.mode auto on more than one rank: the solved auto-sharding problem (stats, explain;
     * hp/autoshard.h), else NULL */
    struct hp_autoshard *autoshard;
    /* the activation checkpointing compiled: the plan's, or what plan.ac_mode auto chose
     * (ac_auto) — and then ac_fits: whether the choice fits the profile's memory */
    hp_ac_mode ac_mode;
    int ac_every;
    bool ac_auto, ac_fits;
} hp_compiled;

/* The share of a device profile's memory (hp_cost_estimate.mem_capacity) plan.ac_mode auto
 * fills at most: the rest is the CUDA context's, cuBLAS's workspace and NCCL's buffers. */
#define HP_AC_AUTO_MEMORY_FRACTION 0.9

/* Compiles job for `world` ranks (world <= 0: the job's resources.world_size). With
 * plan.ac_mode auto it compiles the candidates (see hp/job.h) and keeps the chosen one. Errors: the
 * job invalid for that world (mesh, batch divisibility), a pass failing (prefixed with its
 * name), the verifier failing after a pass ("after fsdp: node 12 (mm): ..."). */
hp_status hp_compile(const hp_job *job, int world, hp_compiled **out, hp_err *err);
void hp_compiled_free(hp_compiled *c);

#ifdef __cplusplus
}
#endif
#endif
