/* hp/job.h — a training job as C data: the joint graph, the model it came from, the parallel
 * plan, the pass config, the training config and the resources; and its wire form
 * (hp.v1.Job, proto/hp/v1/job.proto) as bytes and files.
 *
 * Defaults follow torchtitan's debug_model.toml (AdamW lr 8e-4, betas 0.9/0.95, weight decay
 * 0.1, eps 1e-8, warmup 2 steps, linear decay, grad clip 1.0, 10 steps, local batch 8 x seq
 * 2048) on one CPU rank with a 1-D mesh (dp=1).
 *
 * Ownership: a job owns its graph (hp_graph_free'd with it) and its plan lists (hp_malloc'd;
 * use the hp_job_add_* helpers to grow them). Everything else is plain values.
 * Decoding (hp_job_unpack, hp_job_read_file) trusts nothing: every field is range-checked by
 * hp_job_validate and the graph is imported with full validation (hp/proto_io.h); errors
 * name the field ("train.lr: -1 must be > 0 and finite", "plan.mesh[1].size: ...").
 * Not thread-safe; no I/O but hp_job_read_file / hp_job_write_file.
 */
#ifndef HP_JOB_H
#define HP_JOB_H

#include "hp/graph.h"
#include "hp/models.h"

#include "hp/v1/job.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_JOB_FORMAT_VERSION 1

#define HP_JOB_NAME_MAX   64    /* [A-Za-z0-9._-], 1..63 chars */
#define HP_JOB_PATH_MAX   1024  /* data_path, init_from */
#define HP_MAX_WORLD      65536 /* ranks */
#define HP_PASS_NAME_MAX  32    /* pass names in dump lists and switches */
#define HP_PASS_MAX       32    /* entries in a dump list / switch list */
#define HP_PLAN_MAX_ITEMS 65536 /* FSDP marks, patterns, constraints (each list) */
/* hp_job_read_file reads at most this much (the largest message decoding accepts). */
#define HP_JOB_FILE_MAX ((size_t)64 << 20)
/* train.profile_steps holds at most this many steps. */
#define HP_JOB_PROFILE_MAX 64
/* Gradient-accumulation steps (train.global_batch over one micro-step's batch) at most. */
#define HP_MAX_GRAD_ACCUM 65536
/* Batches one evaluation reads at most (train.eval_steps). */
#define HP_MAX_EVAL_STEPS 1000000

/* ---- the parallel plan ----------------------------------------------------------------------- */
typedef enum { HP_PLAN_FSDP = 0, HP_PLAN_AUTO = 1 } hp_plan_mode;

/* Activation checkpointing (torchtitan's [activation_checkpoint] mode; the activation_checkpoint
 * pass, passes/activation_checkpoint.c): what the backward recomputes instead of keeping from
 * the forward. NONE keeps everything; FULL keeps only what leaves a repeated block ("layers.3"),
 * recomputing the rest of the block for its backward; SELECTIVE also keeps the block's matrix
 * products and attention outputs, recomputing the cheap ops between them. AUTO: hp_compile
 * picks, of none, selective and full every 4th, 2nd or every block, the one with the shortest
 * estimated step whose memory fits the device profile's (hp_compiled.ac_mode). */
typedef enum { HP_AC_NONE = 0, HP_AC_FULL = 1, HP_AC_SELECTIVE = 2, HP_AC_AUTO = 3 } hp_ac_mode;
/* "none", "full", "selective", "auto"; NULL for an out-of-range value. */
const char *hp_ac_mode_name(hp_ac_mode m);
/* Parses one of those names; HP_INVALID naming the text and the choices. */
hp_status hp_ac_mode_parse(const char *s, hp_ac_mode *m, hp_err *err);
#define HP_MAX_AC_EVERY 65536

/* A link class for the cost model: bytes per second and seconds per message. */
typedef struct hp_link_class {
    double bandwidth; /* bytes/s, > 0 */
    double latency;   /* s, >= 0 */
} hp_link_class;

/* Typical links: NVLink within a node, InfiniBand across nodes. */
#define HP_LINK_INTRA_NODE ((hp_link_class){200e9, 5e-6})
#define HP_LINK_INTER_NODE ((hp_link_class){25e9, 20e-6})

typedef struct hp_mesh_dim {
    char name[HP_MESH_NAME_MAX];
    int size; /* ranks along this dim, >= 1 */
    hp_link_class link;
} hp_mesh_dim;

/* A constraint on one graph input (by FQN) or output (by index): one placement per mesh dim. */
typedef struct hp_place_constraint {
    char *input_fqn; /* hp_malloc'd; NULL: the constraint is on graph output `output` */
    bool pattern;    /* input_fqn is an hp_fqn_match glob over the graph's inputs */
    int output;
    int n_placements; /* == the mesh's dims */
    hp_placement placements[HP_MESH_MAX_DIMS];
} hp_place_constraint;

typedef struct hp_plan {
    int n_mesh;
    hp_mesh_dim mesh[HP_MESH_MAX_DIMS];
    hp_plan_mode mode;
    char **fsdp_fqns; /* [n_fsdp_fqns], exact parameter FQNs, hp_malloc'd */
    int n_fsdp_fqns;
    char **fsdp_patterns; /* [n_fsdp_patterns], hp_fqn_match globs over parameter FQNs */
    int n_fsdp_patterns;
    bool reshard_after_forward;
    /* Parameter bytes one rank may hold, as fractions of the unsharded total (0 <= low <= high
     * <= 1); (0, 1) is no constraint. */
    double mem_low, mem_high;
    hp_place_constraint *constraints; /* [n_constraints], hp_malloc'd */
    int n_constraints;
    /* Loss parallel: the cross entropy runs on vocab-sharded logits over the mesh dim "tp"
     * (the loss_parallel pass; the mesh must have that dim). */
    bool loss_parallel;
    /* Mixed precision (FSDP2's MixedPrecisionPolicy, passes/mixed_precision.c): parameters are
     * cast from their f32 master shard to param_dtype before the all-gather and computed in
     * it; gradients are cast to reduce_dtype before their reduction and reach the optimizer in
     * f32. Default (f32, f32): no casts. hp_job_validate accepts (f32, f32) and (bf16, f32). */
    hp_dtype param_dtype, reduce_dtype;
    /* The cost model's device profile (hp/autoshard.h): one of HP_DEVICE_PROFILES; "": by the
     * job's device. gpus_per_node: ranks per node (0: the profile's default). */
    char device_profile[16];
    int gpus_per_node;
    /* Activation checkpointing: the mode, applied to every ac_every-th repeated block (the
     * ac_every-th, 2 ac_every-th, ...: torchtitan's layer frequency); 1 (the default): all. */
    hp_ac_mode ac_mode;
    int ac_every;
} hp_plan;

/* ---- the compiler's pass config -------------------------------------------------------------- */
typedef struct hp_pass_switch {
    char name[HP_PASS_NAME_MAX];
    bool enabled;
} hp_pass_switch;

typedef struct hp_pass_config {
    bool enable_overlap;
    int64_t bucket_bytes; /* all-gather / reduce-scatter bucket size; 0: no bucketing */
    int prefetch_depth;   /* all-gathers in flight ahead of use */
    int n_dump;
    char dump[HP_PASS_MAX][HP_PASS_NAME_MAX]; /* passes whose IR to dump; "all" */
    int n_switches;
    hp_pass_switch switches[HP_PASS_MAX]; /* unique names */
} hp_pass_config;

/* ---- training -------------------------------------------------------------------------------- */
typedef enum { HP_DECAY_LINEAR = 0, HP_DECAY_COSINE = 1, HP_DECAY_NONE = 2 } hp_decay_kind;
/* A step whose loss or global grad norm is not finite: stop the run (naming the step), or
 * skip its optimizer update and count it (metrics "skipped_steps"). */
typedef enum { HP_NONFINITE_STOP = 0, HP_NONFINITE_SKIP = 1 } hp_nonfinite_action;

typedef struct hp_train_config {
    int64_t steps;
    double lr;
    double min_lr_ratio; /* final lr as a fraction of lr, in [0, 1] */
    int64_t warmup_steps;
    hp_decay_kind decay;
    double weight_decay, beta1, beta2, eps;
    double grad_clip; /* max global grad norm; 0: no clipping */
    uint64_t seed;
    int64_t log_interval;            /* 0: never */
    int64_t checkpoint_interval;     /* 0: never */
    char data_path[HP_JOB_PATH_MAX]; /* "": synthetic data */
    char init_from[HP_JOB_PATH_MAX]; /* "": fresh init */
    /* Sequences per optimizer step, all ranks together: local_batch x the data-parallel degree
     * x the gradient-accumulation steps (hp_job_grad_accum), as torchtitan's
     * global_batch_size. 0: local_batch x data-parallel degree (no accumulation). */
    int64_t global_batch;
    int64_t local_batch; /* sequences per rank per micro-step (a run of the graph) */
    int64_t seq;
    int n_profile_steps; /* steps to trace (worker/trace.h), each >= 1 */
    int64_t profile_steps[HP_JOB_PROFILE_MAX];
    hp_nonfinite_action on_nonfinite; /* default stop */
    /* Evaluation: every eval_interval steps (and after the last), the mean loss of the first
     * eval_steps batches of eval_data_path (read in order, the same batches each time), run
     * forward only with dropout off; not trained on. 0: never. */
    int64_t eval_interval;
    int64_t eval_steps;                   /* >= 1 when eval_interval > 0 */
    char eval_data_path[HP_JOB_PATH_MAX]; /* the held-out data; required when evaluating */
} hp_train_config;

typedef enum { HP_DEVICE_CPU = 0, HP_DEVICE_CUDA = 1 } hp_device_kind;

typedef struct hp_resources {
    int world_size;
    hp_device_kind device;
    int gpus_per_node; /* cuda: >= 1 */
    int max_restarts;
} hp_resources;

/* ---- the job --------------------------------------------------------------------------------- */
typedef struct hp_job {
    char name[HP_JOB_NAME_MAX];
    hp_graph *graph; /* owned; NULL: build it from `model` */
    hp_model_spec model;
    hp_plan plan;
    hp_pass_config passes;
    hp_train_config train;
    hp_resources resources;
} hp_job;

/* Fills caller storage with the defaults (no graph, empty lists). Allocates nothing. */
void hp_job_init_defaults(hp_job *job);
/* Frees what the job owns (graph, lists) and leaves it as after hp_job_init_defaults. */
void hp_job_fini(hp_job *job);
/* A heap job with the defaults (NULL on out of memory); free with hp_job_free. */
hp_job *hp_job_new(void);
void hp_job_free(hp_job *job); /* NULL is fine */

/* Appends to the plan's lists (strings copied). HP_LIMIT past HP_PLAN_MAX_ITEMS, HP_INVALID
 * for a string over HP_MAX_STR, HP_NOMEM. */
hp_status hp_job_add_fsdp_fqn(hp_job *job, const char *fqn, hp_err *err);
hp_status hp_job_add_fsdp_pattern(hp_job *job, const char *pattern, hp_err *err);
/* input_fqn NULL: constrain graph output `output`. */
hp_status hp_job_add_constraint(hp_job *job, const char *input_fqn, int output,
                                const hp_placement *placements, int n, hp_err *err);
/* A constraint on every graph input whose FQN matches the glob (hp_fqn_match). */
hp_status hp_job_add_place_pattern(hp_job *job, const char *pattern, const hp_placement *placements,
                                   int n, hp_err *err);

/* Does the job compile through the placement passes (spmd instead of fsdp, overlap and
 * bucketing) at `world`? When more than one mesh dim splits, or the plan has explicit
 * placements, or auto-sharding chooses them. */
bool hp_plan_uses_placements(const hp_job *job, int world);

/* The ranks the batch is split over. A plan without placements (FSDP or plain data
 * parallelism) splits it over the whole world, whatever its one mesh dim is called; a placed
 * one over the mesh dim named "dp" (1 without one: tensor-parallel ranks share their batch). */
int hp_job_dp_size(const hp_job *job);

/* The micro-steps (runs of the graph) whose mean gradient makes one optimizer step:
 * train.global_batch over the graph's batch (= train.local_batch x hp_job_dp_size on a
 * validated job; the graph's stays right when a run resizes the world), at least 1; 1 when
 * global_batch is 0. hp_job_validate checks that it divides. */
int64_t hp_job_grad_accum(const hp_job *job);

/* The placement constraint that holds graph input `fqn`: the last of plan's constraints whose
 * exact FQN or glob names it (the order the flags gave them), -1 for none or a NULL fqn. */
int hp_plan_constraint_for(const hp_plan *plan, const char *fqn);

/* Does an FSDP pattern match an FQN? '*' matches any run of characters (dots included:
 * "layers.*" matches "layers.3.attention.wq.weight"), '?' any one character, everything else
 * itself. Linear-time in practice, quadratic at worst: safe on patterns from files. */
bool hp_fqn_match(const char *pattern, const char *fqn);

/* Marks (marked[i] = true, i a parameter index) the parameters each of names[0..n) names: an
 * exact FQN, or a module, i.e. a prefix of FQNs ending at a '.' boundary, as HyperParallel's
 * fsdp_mark("tok_embeddings") does ("layers.1" names "layers.1.attention.wq.weight", not
 * "layers.10..."). A name that names no parameter is HP_INVALID naming it and its index
 * ("plan.fsdp_fqns[2]: 'tok_embedding' names no parameter or module of the graph").
 * O((n + P) log P). */
hp_status hp_plan_mark_names(const hp_graph *g, char *const *names, int n, bool *marked,
                             hp_err *err);

/* The cost model's device profiles (passes/device_profile.c): the names, for messages, and
 * whether name is one of them. */
#define HP_DEVICE_PROFILES "cpu, h100, h200, a100, b200"
bool hp_device_profile_known(const char *name);

/* The mixed-precision pairs a plan may hold: (f32, f32) and (bf16, f32). Anything else is
 * HP_INVALID (not a floating dtype) or HP_UNSUPPORTED (f16, a reduce dtype other than f32),
 * naming the field. */
hp_status hp_plan_check_precision(hp_dtype param, hp_dtype reduce, hp_err *err);

/* Checks every field's range and the fields against each other (mesh product == world size,
 * batch sizes, marks and constraints naming graph inputs, ...) and verifies the graph.
 * HP_INVALID naming the field and the value ("resources.world_size: 0 must be in [1,
 * 65536]"), or what hp_graph_verify says. */
hp_status hp_job_validate(const hp_job *job, hp_err *err);

/* Can hp-worker train the job? Its graph's data inputs must be exactly `tokens` and `labels`,
 * both i64 [batch, seq] (what the data loader fills: llm.c shards or the built-in corpus).
 * HP_UNSUPPORTED naming the input otherwise ("data input 'x': training reads token data into
 * inputs named 'tokens' and 'labels' only"): such a job compiles and plans, but does not train.
 * hpd refuses it at submit; hpctl new warns. */
hp_status hp_job_check_trainable(const hp_job *job, hp_err *err);

/* Field-by-field equality, graphs by hp_graph_eq. */
bool hp_job_eq(const hp_job *a, const hp_job *b);

/* Serialises a job (it need not be valid: `hpctl` may write a draft; readers validate).
 * On success *data is hp_malloc'd and *len its size. HP_LIMIT over HP_JOB_FILE_MAX; HP_NOMEM. */
hp_status hp_job_pack(const hp_job *job, uint8_t **data, size_t *len, hp_err *err);
/* Decodes len untrusted bytes into a new heap job (*out, hp_job_free), imports its graph and
 * runs hp_job_validate. On failure *out is NULL and err names the offender. */
hp_status hp_job_unpack(const uint8_t *data, size_t len, hp_job **out, hp_err *err);

/* Message level, for embedding a job in RPCs. Export allocates everything in `arena` (the
 * result lives until hp_arena_fini(arena) or the job changes). Import checks every field,
 * imports the graph (hp_graph_import) and runs hp_job_validate; on failure *out is NULL. */
hp_status hp_job_export(const hp_job *job, hp_arena *arena, Hp__V1__Job **msg, hp_err *err);
hp_status hp_job_import(const Hp__V1__Job *msg, hp_job **out, hp_err *err);

/* Reads (at most HP_JOB_FILE_MAX bytes) and unpacks a job file; errors are prefixed with the
 * path. Writes atomically (temp file, fsync, rename). */
hp_status hp_job_read_file(const char *path, hp_job **out, hp_err *err);
hp_status hp_job_write_file(const char *path, const hp_job *job, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
