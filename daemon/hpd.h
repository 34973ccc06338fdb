/* daemon/hpd.h — the coordinator's core, as the control service (rpc.c) and the HTTP server
 * see it. Every function here runs on the daemon's libuv loop thread (the gRPC completion-
 * queue thread hands calls over with uv_async); none blocks.
 *
 * Job lifecycle: QUEUED → COMPILING → LAUNCHING → RUNNING → SUCCEEDED | FAILED | CANCELLED,
 * RESTARTING after a worker failure (back to LAUNCHING from the last checkpoint, at most
 * job.resources.max_restarts times). Every transition is committed to the store before it
 * is acted on.
 *
 * Errors: HP_INVALID (a bad job or argument; the message names the field or node — the RPC
 * layer maps it to INVALID_ARGUMENT), HP_NOT_FOUND (unknown job id), HP_LIMIT (queue full,
 * page size), HP_IO (the store failed), HP_NOMEM.
 */
#ifndef HP_DAEMON_HPD_H
#define HP_DAEMON_HPD_H

#include "hp/base.h"

#include "hp/v1/control.pb-c.h"

#include <stdbool.h>
#include <uv.h>

typedef struct hpd hpd;

#define HPD_ID_MAX 40

/* A job as clients see it (a copy; owns nothing). */
typedef struct hpd_job_view {
    char id[HPD_ID_MAX];
    char name[64];
    Hp__V1__JobState state;
    double created_unix_s, updated_unix_s;
    int world_size;
    int64_t step, total_steps;
    int restarts;
    char error[HP_ERR_MSG_MAX];
    bool has_metrics;
    double loss, tokens_per_s, mfu_pct, step_time_s; /* of the last metrics record */
    char launcher[16];     /* the launcher of the current attempt ("local", "slurm", ...) */
    char launch_ref[64];   /* the scheduler's id of the current attempt (a Slurm job id; "") */
    char launch_state[32]; /* the scheduler's state of it ("PENDING", "RUNNING"; "") */
} hpd_job_view;

/* Submits a job given as packed hp.v1.Job bytes (validated: hp_job_unpack + a compile check
 * of the world). request_id (may be NULL/"") makes retries idempotent. */
hp_status hpd_submit(hpd *d, const uint8_t *job, size_t len, const char *request_id,
                     hpd_job_view *out, hp_err *err);
/* hpd_submit without blocking the loop: the job is decoded and compiled (the check) on libuv's
 * thread pool, then stored on the loop. fn(ctx, status, view or NULL, err) is called once, on
 * the loop — at once, before this returns, for a retried request_id (*out is NULL then).
 * Errors queueing it are returned (fn is not called). The job is stored even when the
 * request was cancelled meanwhile (hpd_submit_cancel: fn is not called). */
typedef struct hpd_submit_req hpd_submit_req;
typedef void (*hpd_submit_fn)(void *ctx, hp_status st, const hpd_job_view *v, const hp_err *err);
hp_status hpd_submit_async(hpd *d, const uint8_t *job, size_t len, const char *request_id,
                           hpd_submit_fn fn, void *ctx, hpd_submit_req **out, hp_err *err);
void hpd_submit_cancel(hpd_submit_req *r);
hp_status hpd_get(hpd *d, const char *id, hpd_job_view *out, hp_err *err);
/* Newest first. states: filter (n_states 0: all). page_size 0: 50, at most 1000. page_token:
 * "" for the first page; *next gets the next page's token ("" at the end). *out is
 * hp_malloc'd (caller frees). */
hp_status hpd_list(hpd *d, const Hp__V1__JobState *states, int n_states, int page_size,
                   const char *page_token, hpd_job_view **out, int *n, char next[HPD_ID_MAX],
                   hp_err *err);
/* Cancels a job that has not finished (stopping its workers); a finished job is returned as
 * is. */
hp_status hpd_cancel(hpd *d, const char *id, const char *reason, hpd_job_view *out, hp_err *err);

/* Watching a job: fn receives, on the loop thread, first the job's current state, then every
 * stored metrics record with step >= from_step (from_step <= 0: none), then live events
 * (state changes, metrics, log lines when logs is true). A job already finished gets the
 * stored records first and then its final state: a stream always ends with the final state.
 * After the terminal state event, fn gets ev == NULL once: the watch is over and freed. A
 * watcher may stop early with hpd_watch_stop (fn is not called again). */
typedef struct hpd_watch hpd_watch;
typedef void (*hpd_event_fn)(void *ctx, const Hp__V1__JobEvent *ev);
hp_status hpd_watch_start(hpd *d, const char *id, int64_t from_step, bool logs, hpd_event_fn fn,
                          void *ctx, hpd_watch **out, hp_err *err);
void hpd_watch_stop(hpd_watch *w);

/* The compiled summary of a submitted job (id) or of job bytes, at world_size (0: the job's).
 * *out is an hp_malloc'd packed hp.v1.PlanSummary. */
hp_status hpd_plan(hpd *d, const char *id, const uint8_t *job, size_t len, int world_size,
                   uint8_t **out, size_t *out_len, hp_err *err);
/* hpd_plan with the compile on the thread pool: the job's bytes are copied (or, by id, looked
 * up) now, fn runs later on the loop with the packed summary (borrowed for the call). Errors
 * found at once (an unknown id, a bad world size, no memory) are returned and fn is not called.
 * hpd_plan_cancel: fn is not called (the compile finishes and is dropped). */
typedef struct hpd_plan_req hpd_plan_req;
typedef void (*hpd_plan_fn)(void *ctx, hp_status st, const uint8_t *plan, size_t len,
                            const hp_err *err);
hp_status hpd_plan_async(hpd *d, const char *id, const uint8_t *job, size_t len, int world_size,
                         hpd_plan_fn fn, void *ctx, hpd_plan_req **out, hp_err *err);
void hpd_plan_cancel(hpd_plan_req *r);

/* Asks the running ranks of job id to write a checkpoint after their current step
 * (CheckpointNow frames); the job keeps running. HP_NOT_FOUND: unknown id; HP_INVALID: the job
 * is not RUNNING (the message says its state). */
hp_status hpd_checkpoint(hpd *d, const char *id, hpd_job_view *out, hp_err *err);

/* The Chrome trace of step `step` of job id, the ranks' traces merged into one
 * {"traceEvents": [...]} document (pid = rank). ranks/n_ranks: which (n_ranks 0: all).
 * *json (hp_malloc'd, NUL-terminated, *len bytes) and *steps (hp_malloc'd, the steps that have
 * traces, ascending, *n_steps of them; may be NULL when none) belong to the caller.
 * HP_NOT_FOUND: unknown id, or no trace for that step (the message lists the traced steps). */
hp_status hpd_trace(hpd *d, const char *id, int64_t step, const int32_t *ranks, int n_ranks,
                    char **json, size_t *len, int64_t **steps, int *n_steps, hp_err *err);

/* The exact command that starts each rank of job id's current attempt by hand (the external
 * launcher's workers): *cmds[world] (each and the array hp_malloc'd; the caller frees), with
 * the attempt's token. HP_NOT_FOUND: unknown id; HP_INVALID: no attempt accepts workers now. */
hp_status hpd_worker_commands(hpd *d, const char *id, char ***cmds, int *n, hp_err *err);

/* The bearer token mutating RPCs need (the content of STATE_DIR/token). */
const char *hpd_token(const hpd *d);
uv_loop_t *hpd_loop(hpd *d);

#endif
