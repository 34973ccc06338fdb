/* daemon/store.h — the coordinator's durable job store (SQLite, WAL).
 *
 * Tables: jobs (one row per job, the packed hp.v1.Job included), transitions (the state
 * history: every change of jobs.state is written in the same transaction as a transitions
 * row), metrics (packed hp.v1.StepMetrics per job, step, rank) and worker_exits (how every
 * rank process ended, per attempt) and launches (the scheduler's id of an attempt: a Slurm job
 * id). Every write returns only after its transaction
 * committed: the caller acts on a transition after hpd_store_transition returned HP_OK.
 *
 * Durability: journal_mode=WAL with synchronous=NORMAL. A commit is in the WAL (in the OS)
 * when it returns, so a process killed with SIGKILL loses nothing committed — the failure the
 * daemon must survive. An OS crash or power loss may roll back the last commits (never
 * corrupt the database); FULL would fsync every metrics record, which ingest at 200k
 * records/s cannot afford. Set HPD_STORE_SYNC_FULL=1 in the environment for FULL.
 *
 * Not thread-safe: one store per loop thread. Errors: HP_IO naming the SQLite call and its
 * message, HP_NOT_FOUND for an unknown job id, HP_NOMEM.
 */
#ifndef HP_DAEMON_STORE_H
#define HP_DAEMON_STORE_H

#include "hp/base.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct hpd_store hpd_store;

#define HPD_STORE_ID_MAX   40
#define HPD_STORE_PATH_MAX 1024

/* One jobs row. job/job_len: the packed hp.v1.Job (borrowed on write; hp_malloc'd, owned by
 * the row, on read — free with hpd_store_row_fini). */
typedef struct hpd_store_row {
    char id[HPD_STORE_ID_MAX];
    char name[64];
    int state; /* Hp__V1__JobState */
    uint8_t *job;
    size_t job_len;
    double created, updated; /* unix seconds */
    int world;
    int64_t step, total_steps;
    int restarts;
    char error[HP_ERR_MSG_MAX];
    char run_dir[HPD_STORE_PATH_MAX];
    char request_id[64]; /* "" : none */
} hpd_store_row;

void hpd_store_row_fini(hpd_store_row *r);

/* Opens (creating) the database at path. */
hp_status hpd_store_open(const char *path, hpd_store **out, hp_err *err);
/* A read-only connection to a store another connection (the daemon's loop) writes: for
 * readers on other threads (WAL lets them read while it writes). Only the each/get calls. */
hp_status hpd_store_open_readonly(const char *path, hpd_store **out, hp_err *err);
void hpd_store_close(hpd_store *s); /* NULL is fine */

/* Inserts a new job with a fresh id "j-%06d" (written into r->id) and its first transition
 * (none → r->state, reason "submitted"). */
hp_status hpd_store_insert(hpd_store *s, hpd_store_row *r, hp_err *err);
/* The job with this request_id (HP_NOT_FOUND if none). */
hp_status hpd_store_find_request(hpd_store *s, const char *request_id, hpd_store_row *out,
                                 hp_err *err);
hp_status hpd_store_get(hpd_store *s, const char *id, hpd_store_row *out, hp_err *err);

/* Commits the state change from → to of job id with its history row, plus the row's mutable
 * fields (step, restarts, error, world, updated = now), in one transaction. HP_NOT_FOUND when
 * no such job; HP_INVALID when the stored state is not `from` (a stale caller). */
hp_status hpd_store_transition(hpd_store *s, const char *id, int from, int to, const char *reason,
                               int64_t step, int restarts, const char *error, hp_err *err);
/* Progress only (no state change). */
hp_status hpd_store_set_step(hpd_store *s, const char *id, int64_t step, hp_err *err);

/* Every job, oldest first: fn(ctx, row) (row borrowed for the call). fn returning false
 * stops the walk. */
typedef bool (*hpd_store_row_fn)(void *ctx, const hpd_store_row *row);
hp_status hpd_store_each_job(hpd_store *s, hpd_store_row_fn fn, void *ctx, hp_err *err);

/* The history of a job, oldest first (from/to as Hp__V1__JobState). */
typedef bool (*hpd_store_transition_fn)(void *ctx, int64_t seq, int from, int to, double time,
                                        const char *reason);
hp_status hpd_store_each_transition(hpd_store *s, const char *id, hpd_store_transition_fn fn,
                                    void *ctx, hp_err *err);

/* Metrics: record is a packed hp.v1.StepMetrics. A record for the same (job, step, rank)
 * replaces the old one (a restarted rank re-running steps). */
hp_status hpd_store_add_metrics(hpd_store *s, const char *id, int64_t step, int rank,
                                const uint8_t *record, size_t len, hp_err *err);
typedef bool (*hpd_store_metrics_fn)(void *ctx, int64_t step, int rank, const uint8_t *record,
                                     size_t len);
/* Records of job id with step >= from_step, by step then rank. */
hp_status hpd_store_each_metrics(hpd_store *s, const char *id, int64_t from_step,
                                 hpd_store_metrics_fn fn, void *ctx, hp_err *err);

/* The newest step every rank in [0, world) has a metrics record for (the least of the ranks'
 * highest steps; 0 when a rank has none): a restart resumes no later than the first step after
 * it that the job logs, so every logged step reaches the store (lifecycle.c, the Welcome). */
hp_status hpd_store_metrics_high(hpd_store *s, const char *id, int world, int64_t *step,
                                 hp_err *err);

/* Batching for ingest: between begin and commit the metrics, step and exit writes share one
 * transaction. A durable write (insert, transition) inside a batch still commits before it
 * returns: the batch so far is committed with it and a new batch transaction opened after.
 * Nests (only the outermost commit commits). */
hp_status hpd_store_begin(hpd_store *s, hp_err *err);
hp_status hpd_store_commit(hpd_store *s, hp_err *err);

hp_status hpd_store_add_exit(hpd_store *s, const char *id, int attempt, int rank, int status,
                             hp_err *err);
/* The exit status of (id, attempt, rank): HP_NOT_FOUND if none recorded. */
hp_status hpd_store_get_exit(hpd_store *s, const char *id, int attempt, int rank, int *status,
                             hp_err *err);

/* The scheduler's id of an attempt (launcher "slurm", ref its job id), kept so that a restarted
 * coordinator finds and stops what its predecessor started. */
hp_status hpd_store_set_launch(hpd_store *s, const char *id, int attempt, const char *launcher,
                               const char *ref, hp_err *err);
/* The newest attempt's launch of job id: HP_NOT_FOUND if none recorded. */
hp_status hpd_store_get_launch(hpd_store *s, const char *id, int *attempt, char *launcher,
                               size_t launcher_len, char *ref, size_t ref_len, hp_err *err);

#endif
