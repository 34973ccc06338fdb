/* worker/agent.h — coordinator mode of hp-worker: one rank that takes its work from hpd over
 * the worker protocol (hp/frame.h, proto/hp/v1/worker.proto).
 *
 *   connect to HOST:PORT (retrying until the Welcome deadline: the coordinator may still be
 *   starting) → Hello {job id, rank, token, pid, host, device} → Welcome {program, job,
 *   run dir, comm} → hp_train with the coordinator's program (the worker never compiles)
 *   → Done {ok, final step, error} → close.
 *
 * Threads: training runs on the calling thread; a dedicated I/O thread owns the socket's read
 * side and sends a Heartbeat every heartbeat_interval_ms, so heartbeats keep flowing while a
 * step computes. Rank 0 also sends a StepMetrics frame per logged step (from the training
 * thread; writes are serialised by a mutex), and every rank a Trace frame per profiled step
 * (TrainConfig.profile_steps and --profile-steps). A Stop frame sets the stop flag: the step in
 * progress finishes, a checkpoint is written, Done goes out. Losing the connection also sets
 * the stop flag, and then the run fails (the coordinator restarts the job from the last
 * checkpoint). A CheckpointNow frame sets a checkpoint flag: the ranks agree on a step (in
 * hp_train's per-step all-reduce), all write a checkpoint after it and go on. Every checkpoint
 * a rank writes is reported with a CheckpointDone frame {step, path}.
 */
#ifndef HP_WORKER_AGENT_H
#define HP_WORKER_AGENT_H

#include "hp/base.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct hp_agent_opts {
    const char *coordinator; /* "HOST:PORT" or "[V6ADDR]:PORT" */
    const char *job_id;
    const char *token; /* the per-job token */
    int rank;
    int local_rank;
    int world;                   /* > 0: what the launcher says (SLURM_NTASKS); checked against
                                    the Welcome. 0: take the Welcome's */
    int threads;                 /* <= 0: hp_default_threads() */
    double welcome_timeout_s;    /* connect + Welcome deadline; <= 0: 60 s */
    volatile sig_atomic_t *stop; /* may be NULL; set by signals, and by the agent on Stop */
    FILE *log;                   /* training output; NULL: stdout */

    /* Steps to trace besides the job's (borrowed); each traced step's Chrome trace goes to
     * the coordinator in a Trace frame. */
    const int64_t *profile_steps;
    int n_profile_steps;
} hp_agent_opts;

typedef struct hp_agent_result {
    int64_t final_step; /* the last step trained (0: none) */
    bool stopped;       /* by a Stop frame or *stop: a checkpoint was written */
} hp_agent_result;

/* Runs this rank of the job under the coordinator. HP_OK when training finished or was stopped
 * cleanly (res->stopped); otherwise err says why, prefixed by the stage: "coordinator
 * HOST:PORT: connect: ...", "welcome: no answer within 60 s", "welcome: program: ...",
 * "lost the connection to the coordinator at step 12", or hp_train's error. Done is sent
 * (when the connection is still up) in every case after the Welcome. */
hp_status hp_agent_run(const hp_agent_opts *o, hp_agent_result *res, hp_err *err);

/* Checks a coordinator address without connecting: "HOST:PORT" or "[V6]:PORT", a non-empty
 * host and a decimal port in [1, 65535]. HP_INVALID naming the address otherwise (the
 * connect loop retries refused connections for the Welcome deadline; a port that can never
 * answer must not wait that long). */
hp_status hp_agent_check_addr(const char *addr, hp_err *err);

#endif
