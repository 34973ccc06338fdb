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
    FILE *log, *metrics;
    hp_compiled *compiled; /* the pipeline's output: owns prog */
    hp_program *prog;
    hp_comm *comm; /* world > 1 */
    int rank, world;
    hp_backend *be;
    bool owns_be;      /* be came from the factory (else opts->backend, borrowed) */
    bool host_visible; /* the backend's info: device pointers are host pointers */
    hp_exec *ex;
    hp_data *data;
    int32_t tokens_buf, labels_buf;
    int64_t batch, seq, total_steps;
    int64_t *tokens, *labels;    /* [B*T] host staging */
    float **m, **v;              /* AdamW moments per parameter (device buffers) */
    hp_adamw_param *adam_params; /* [n_params] device pointers */
    hp_fspan *grads;             /* [n_params] device spans */
    hp_adamw_config adam;
    hp_lr_schedule lr;
    double flops_per_token, peak_flops;
    uint64_t device_memory;
    bool mfu_warned; /* said once that the achieved FLOP/s exceeded the peak */
    char ckpt_dir[HP__TRAIN_PATH_MAX];
    hp_trace *trace;        /* profiled steps only; NULL when none are asked for */
    int32_t *instr_of_node; /* [graph nodes]: the instruction running each node, or -1 */
    int64_t *profile;       /* sorted steps to trace */
    int n_profile;
} trainer;

/* Which rows of parameter i this rank holds: local rows [0, real) are global rows
 * [start, start + real); local rows [real, s) are padding (zero). Unsharded: all rows. */
typedef struct hp__shard_geo {
    int64_t rows;  /* global dim 0 (1 for a scalar) */
    int64_t s;     /* local dim 0 */
    int64_t start; /* first global row held */
    int64_t real;  /* real rows held */
    int64_t row;   /* elements per row */
} hp__shard_geo;

/* ---- train.c: the shard geometry (the only place that knows it) ----------------------------- */

hp__shard_geo hp__train_geo(const trainer *t, int i);
/* Parameter i is split over the ranks (else every rank holds all of it). */
bool hp__train_sharded(const trainer *t, int i);
/* The device buffer of parameter i (this rank's shard, padding included) and its elements. */
float *hp__train_param(const trainer *t, int i);
int64_t hp__train_numel(const trainer *t, int i);
bool hp__train_is_dir(const char *p);

/* ---- train_state.c -------------------------------------------------------------------------- */

/* Fresh parameters: the counter-based init of every element held (sharding-independent). */
hp_status hp__train_init_params(trainer *t, hp_err *err);
/* Weights from a safetensors file keyed by FQN (extra tensors are ignored). */
hp_status hp__train_load_weights(trainer *t, const char *path, hp_err *err);
/* AdamW moments (zero, on the device), the tensor lists, the config and the LR schedule. */
hp_status hp__train_alloc_optimizer(trainer *t, hp_err *err);
void hp__train_free_optimizer(trainer *t);
/* This rank's shards, moments and the scalars to t->ckpt_dir/step-N (every rank takes part). */
hp_status hp__train_save_checkpoint(trainer *t, int64_t step, hp_err *err);
/* --resume DIR: a run's out dir (holding checkpoints/) or a checkpoint root. */
void hp__train_resume_root(const char *dir, char *root, size_t len);
/* This rank's rows of the newest checkpoint under dir, whatever world wrote it; *step. */
hp_status hp__train_load_checkpoint(trainer *t, const char *dir, int64_t *step, hp_err *err);
/* The full parameters, gathered from the shards (every rank takes part; rank 0 writes). */
hp_status hp__train_export_weights(trainer *t, const char *path, hp_err *err);

#endif
