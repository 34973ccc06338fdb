/* worker/train.h — the training loop of one rank: lower the job's joint graph, materialize the
 * parameters (counter-based init keyed by (seed, FQN, element), or safetensors weights), then
 * for each step: read the batch → run the program → global grad norm and clipping → AdamW
 * with the LR schedule → metrics every log_interval → checkpoint every checkpoint_interval.
 *
 * Files under out_dir (when given): metrics.jsonl (one JSON record per logged step),
 * checkpoints/step-N/ (hp/checkpoint.h), model.safetensors (final weights, PyTorch FQNs),
 * traces/step-S-rank-R.json (Chrome traces of the profiled steps, every rank).
 * Resume continues exactly: parameters, AdamW moments and the step come from the checkpoint;
 * data and the LR schedule are functions of the step, so the losses after a resume equal an
 * uninterrupted run's bit for bit.
 *
 * Device: the backend comes from the job's resources.device (hp_backend_new); a device this
 * hp-worker cannot run is an HP_UNSUPPORTED error at setup, never a CPU run. The optimizer,
 * clipping, init and checkpoint I/O go through the backend, so the loop is the same on
 * every device.
 *
 * Threads: runs on the calling thread (the backend runs its own pool).
 */
#ifndef HP_WORKER_TRAIN_H
#define HP_WORKER_TRAIN_H

#include "hp/job.h"
#include "hp/metrics.h"
#include "hp/program.h"

#include <signal.h>
#include <stdio.h>

#define HP_TRAIN_NONFINITE_JOB  0
#define HP_TRAIN_NONFINITE_STOP (1 + HP_NONFINITE_STOP)
#define HP_TRAIN_NONFINITE_SKIP (1 + HP_NONFINITE_SKIP)

typedef struct hp_train_opts {
    int64_t steps;         /* 0: the job's train.steps */
    int on_nonfinite;      /* HP_TRAIN_NONFINITE_JOB: the job's train.on_nonfinite; else 1 +
                              hp_nonfinite_action (hp-worker --on-nonfinite) */
    const char *out_dir;   /* NULL: write nothing (no metrics file, checkpoints, weights) */
    const char *init_from; /* safetensors; NULL: the job's train.init_from ("" = fresh init) */
    const char *data;      /* token shards or "text:PATH"; NULL: the job's train.data_path */
    const char *resume;    /* a run's out dir or a checkpoint root; NULL: start fresh */
    int64_t resume_before; /* > 0: resume from the newest checkpoint at a step below this one,
                              and rank 0 removes those at or after it once every rank loaded
                              (the coordinator's bound, worker.proto Welcome) */
    int threads;           /* <= 0: hp_default_threads() */
    int keep_checkpoints;  /* <= 0: keep 3 */
    FILE *log;             /* metrics lines and notices; NULL: stdout */
    volatile sig_atomic_t *stop; /* when set: finish the step, checkpoint, return */
    int64_t halt_after;          /* > 0: return after this step with no checkpoint of its own, as a
                                    crash would leave the run (for tests of resume) */
    /* Multi-rank (FSDP): this rank of `world` ranks joined through the shared-memory
     * communicator `comm_name` (all ranks pass the same name). world <= 1: single rank. Only
     * rank 0 prints metrics and writes metrics.jsonl and model.safetensors; every rank writes
     * its checkpoint shard. */
    int rank, world;
    const char *comm_name;
    double comm_timeout_s; /* <= 0: 60 s */
    /* world > 1: a communicator the caller has joined (borrowed; rank and world must be
     * this run's), used instead of joining shm `comm_name`: the tcp one of a job whose ranks
     * run on several hosts (hp-worker --comm-backend tcp, the coordinator agent). */
    struct hp_comm *comm;
    /* The backend to run on (borrowed; world 1 only). NULL: hp_backend_new makes the one of
     * the job's device (worker/backend.h). For tests and embedders: the caller answers for
     * it matching the job's device. */
    struct hp_backend *backend;
    /* A program compiled by the coordinator (borrowed; its rank/world are this run's). NULL:
     * compile the job here (standalone mode). */
    hp_program *program;
    /* Called on rank 0 after each logged step with the record also printed (may be NULL):
     * the coordinator agent streams it. */
    void (*on_metrics)(void *ctx, const struct hp_metrics *m);
    void *metrics_ctx;
    /* Steps to trace (worker/trace.h) besides the job's train.profile_steps (borrowed). A
     * profiled step's Chrome trace goes to on_trace when set (called on the training thread;
     * json is borrowed for the call), else to OUT_DIR/traces/step-S-rank-R.json (OUT_DIR "."
     * when out_dir is NULL). trace_max_bytes > 0 bounds a trace: slices are dropped to fit,
     * with a notice on the log. */
    const int64_t *profile_steps;
    int n_profile_steps;
    void (*on_trace)(void *ctx, int64_t step, const char *json, size_t len);
    void *trace_ctx;
    size_t trace_max_bytes;
    /* The number of CheckpointNow requests this rank has seen (the agent's I/O thread adds one
     * per frame): after a step where it grew, checkpoint and go on training. The ranks take
     * the highest count in the all-reduce that agrees on stopping, so they all checkpoint the
     * same step, once per request, however late a rank's copy arrives. May be NULL. */
    volatile sig_atomic_t *checkpoint_now;
    /* Called on every rank after each checkpoint it wrote (scheduled, asked or on stop), with
     * the step's directory (borrowed for the call). May be NULL. */
    void (*on_checkpoint)(void *ctx, int64_t step, const char *path);
    void *checkpoint_ctx;
} hp_train_opts;

typedef struct hp_train_result {
    int64_t first_step, last_step; /* 1-based steps this call ran */
    double first_loss, last_loss;
    double last_eval_loss; /* the last evaluation's loss; NaN when none ran */
    int64_t skipped_steps; /* optimizer updates skipped: non-finite loss or grad norm */
    bool interrupted;      /* stopped by *stop */
} hp_train_result;

/* Runs the job. Errors name the stage ("init: ...", "step 12: instruction 41 (node 57,
 * mm): ...", "checkpoint: ..."). */
hp_status hp_train(const hp_job *job, const hp_train_opts *opts, hp_train_result *res, hp_err *err);

#endif
