/* worker/train_internal.h — what the training loop's files share (hp__train_ prefix): the
 * trainer, the one place that says which part of a parameter this rank holds (geo, in
 * train.c), and the state I/O of train_state.c (init, weights in, optimizer state,
 * checkpoints, weights out).
 *
 * Device rule: nothing here dereferences a device pointer. Parameters, gradients and AdamW
 * moments are device buffers (the executor's or the backend's alloc); math on them goes
 * through the backend's vtable, and file I/O stages through copy_in / copy_out (or uses the
 * buffer itself when the backend's memory is host-visible).
 */
#ifndef HP_WORKER_TRAIN_INTERNAL_H
#define HP_WORKER_TRAIN_INTERNAL_H

#include "hp/comm.h"
#include "hp/data.h"
#include "hp/optim.h"
#include "hp/passes.h"
#include "hp/program.h"
#include "worker/backend.h"
#include "worker/executor.h"
#include "worker/trace.h"
#include "worker/train.h"

#define HP__TRAIN_PATH_MAX 4096

typedef struct trainer {
    const hp_job *job;
    const hp_train_opts *opts;
    FILE *log;
    bool metrics_open; /* rank 0 with an out dir: metrics_fd appends to metrics_path */
    int metrics_fd;
    char metrics_path[HP__TRAIN_PATH_MAX];
    hp_compiled *compiled; /* the pipeline's output: owns prog */
    hp_program *prog;
    hp_comm *comm;                          /* world > 1 */
    bool owns_comm;                         /* false: the caller's (hp_train_opts.comm) */
    hp_comm_group groups[HP_MESH_MAX_DIMS]; /* the mesh dims of more than one rank */
    int n_groups;
    int rank, world;
    int data_rank, data_world; /* this rank's data-parallel position (hp_program_data_rank) */
    hp_backend *be;
    bool owns_be;      /* be came from the factory (else opts->backend, borrowed) */
    bool host_visible; /* the backend's info: device pointers are host pointers */
    hp_exec *ex;
    hp_data *data;
    hp_data *eval_data; /* train.eval_interval > 0: the held-out data, read in order */
    int32_t tokens_buf, labels_buf;
    int64_t batch, seq, total_steps;
    int64_t *tokens, *labels;    /* [B*T] host staging */
    float **m, **v;              /* AdamW moments per parameter (device buffers) */
    hp_adamw_param *adam_params; /* [n_params] device pointers */
    hp_fspan *grads;             /* [n_params] device spans */
    int64_t accum;               /* micro-steps a step (hp_job_grad_accum) */
    hp_fspan *accum_grads;       /* [n_params] accum > 1: the earlier micro-steps' gradients */
    hp_adamw_config adam;
    hp_lr_schedule lr;
    double flops_per_token, peak_flops;
    uint64_t device_memory;
    bool mfu_warned;       /* said once that the achieved FLOP/s exceeded the peak */
    bool skip_nonfinite;   /* --on-nonfinite skip: a non-finite step skips its update */
    int64_t skipped_steps; /* updates skipped so far */
    char ckpt_dir[HP__TRAIN_PATH_MAX];
    hp_trace *trace;        /* profiled steps only; NULL when none are asked for */
    int32_t *instr_of_node; /* [graph nodes]: the instruction running each node, or -1 */
    int64_t *profile;       /* sorted steps to trace */
    int n_profile;
} trainer;

/* ---- train.c: which part of a parameter a rank holds ----------------------------------------
 * Parameter i's slot says it (hp_param_slot: storage placements and this rank's box, set by
 * hp_program_set_rank); nothing else in the worker knows a rank's part. */

/* This rank is the one that counts parameter i's piece (hp_program_owns): in the gradient
 * norm, in checkpoints. */
bool hp__train_owned(const trainer *t, int i);
/* The device buffer of parameter i (this rank's piece, padding included) and its elements. */
float *hp__train_param(const trainer *t, int i);
int64_t hp__train_numel(const trainer *t, int i);
bool hp__train_is_dir(const char *p);

/* One contiguous run of a box: `count` elements at flat index global_first of the global
 * tensor and local_first of the local (held) buffer. */
typedef hp_status (*hp__run_fn)(void *ctx, int64_t global_first, int64_t local_first, int64_t count,
                                hp_err *err);
/* Calls fn for every maximal run of the box [off, off + len) of a `global`-shaped tensor held
 * at the corner of a `held`-shaped local buffer, in row-major order; stops at an error. */
hp_status hp__train_box_runs(const hp_type *global, const int64_t *off, const int64_t *len,
                             const hp_type *held, hp__run_fn fn, void *ctx, hp_err *err);
/* hp__train_box_runs over parameter i's box at `rank`. */
hp_status hp__train_param_runs(const trainer *t, int i, int rank, hp__run_fn fn, void *ctx,
                               hp_err *err);

/* ---- train_state.c -------------------------------------------------------------------------- */

/* The buffer inputs with an init (e.g. loss parallel's vocab indices), over their boxes. */
hp_status hp__train_init_buffers(trainer *t, hp_err *err);
/* Fresh parameters: the counter-based init of every element held (sharding-independent). */
hp_status hp__train_init_params(trainer *t, hp_err *err);
/* Weights from a safetensors file keyed by FQN (extra tensors are ignored); with buffers_only,
 * the buffers alone (a resume: the checkpoint holds the parameters). */
hp_status hp__train_load_weights(trainer *t, const char *path, bool buffers_only, hp_err *err);
/* Whether a buffer's values are the weights file's rather than its init spec's (a spec that
 * only stands in for them: a distribution, not a constant or arange). */
bool hp__train_buffers_from_file(const trainer *t);
/* AdamW moments (zero, on the device), the tensor lists, the config and the LR schedule. */
hp_status hp__train_alloc_optimizer(trainer *t, hp_err *err);
void hp__train_free_optimizer(trainer *t);
/* This rank's shards, moments and the scalars to t->ckpt_dir/step-N (every rank takes part). */
hp_status hp__train_save_checkpoint(trainer *t, int64_t step, hp_err *err);
/* --resume DIR: a run's out dir (holding checkpoints/) or a checkpoint root. */
void hp__train_resume_root(const char *dir, char *root, size_t len);
/* This rank's box of the newest checkpoint under dir, whatever mesh wrote it; *step. */
hp_status hp__train_load_checkpoint(trainer *t, const char *dir, int64_t *step, hp_err *err);
/* The full parameters, gathered from the shards (every rank takes part; rank 0 writes). */
hp_status hp__train_export_weights(trainer *t, const char *path, hp_err *err);

#endif
