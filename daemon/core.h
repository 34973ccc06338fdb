/* daemon/core.h — what the coordinator's files share inside daemon/ (hp__ names): the hpd
 * struct, the in-memory job, and the calls between the worker protocol server (workers.c)
 * and the core (core.c). Not a public header. Loop thread only.
 */
#ifndef HP_DAEMON_CORE_H
#define HP_DAEMON_CORE_H

#include "daemon/hpd.h"
#include "daemon/launch.h"
#include "daemon/store.h"

#include "hp/job.h"
#include "hp/passes.h"

#include "hp/v1/worker.pb-c.h"

#include <limits.h>

typedef struct hpd_conn hpd_conn; /* a worker connection (workers.c) */
typedef struct hpd_workers hpd_workers;

/* One rank of the current attempt. */
typedef struct hpd_rank {
    hpd_conn *conn; /* NULL: not connected */
    bool hello, done, proc;
    uint64_t last_seen_ms;
    int64_t step;
    int64_t ckpt_step; /* the newest checkpoint this rank reported (CheckpointDone) */
} hpd_rank;

typedef struct hpd_job {
    struct hpd_job *next; /* d->jobs, oldest first */
    hpd_job_view v;
    int max_restarts;
    bool cuda;         /* resources.device (read once: the launchers need it per attempt) */
    int gpus_per_node; /* resources.gpus_per_node */
    char request_id[64];
    char run_dir[HPD_STORE_PATH_MAX];
    uint8_t *packed; /* the submitted hp.v1.Job */
    size_t packed_len;
    hp_compiled *compiled; /* while active */
    char token[65];        /* per-job worker token (fresh per attempt) */
    /* Rank 0's CommSetup of this attempt (packed; NULL: none yet): relayed to every rank,
     * also to one whose Hello comes after it (its address must reach late ranks too). */
    uint8_t *comm_setup;
    size_t comm_setup_len;
    char prev_token[65]; /* the previous attempt's (a worker presenting it is stale) */
    int attempt;
    uint64_t launched_ms, stop_ms; /* stop_ms: when the attempt was told to stop (0: not) */
    bool holds_slots;
    int *gpu_ids;      /* [v.world_size]: the GPUs rank r runs on, while holds_slots (NULL: none) */
    bool step_dirty;   /* v.step not yet in the store: hp__core_flush_steps writes it */
    int64_t ckpt_step; /* the newest checkpoint every rank reported (CheckpointDone); 0: none */
    int heartbeat_ms;  /* the interval this attempt's Welcome gave (SIGHUP may change d's) */
    int64_t resume_before;     /* this attempt's Welcome resume_before (one value for every rank) */
    int resume_attempt;        /* 1 + the attempt resume_before was computed for (0: none yet) */
    hpd_rank *ranks;           /* [v.world_size] while active */
    struct hpd_jstats *stats;  /* observe.c: counters, last records (NULL: none yet) */
    struct hpd_snap_job *snap; /* observe.c: the published entry (the loop's reference) */
    bool obs_dirty;            /* the entry must be rebuilt */
} hpd_job;

struct hpd {
    uv_loop_t *loop;
    hpd_store *store;
    hpd_launcher *launcher;
    hpd_workers *workers;
    char state_dir[PATH_MAX];
    char token[65];
    bool auth_all;         /* --auth all: reads need the token too (rpc.c, http.c) */
    char worker_addr[300]; /* "HOST:PORT" the workers dial (--advertise) */
    int launch_timeout_ms; /* LAUNCHING longer than this fails the attempt */
    int comm_kind;         /* hpd_comm_kind: the Welcome's comm.backend (lifecycle.c) */
    int launcher_kind;     /* hpd_launcher_kind */
    int slots, slots_used;
    int gpus, gpus_used;     /* gpus -1: not counted (a launcher other than local places them) */
    unsigned char *gpu_busy; /* [gpus] */
    int heartbeat_ms;
    int on_sigterm; /* hpd_on_sigterm (config.h): what hpd_shutdown does with running jobs */
    bool stopping;
    bool steps_dirty; /* some job's step_dirty is set */
    uint64_t stop_started_ms;
    hpd_job *jobs, *jobs_tail;
    int n_jobs;
    struct hpd_watch *watches;
    uv_timer_t cron;
    struct hpd_obs *obs;   /* observe.c: the snapshot for the HTTP threads */
    struct hpd_http *http; /* http.c (NULL: not serving) */
    int n_watches;
    int64_t metrics_records_total;
};

/* ---- core.c --------------------------------------------------------------------------- */
typedef struct hpd_config {
    const char *state_dir;
    int slots;
    int gpus;                 /* the local launcher's GPUs (other launchers: not counted) */
    const char *worker_path;  /* NULL: the launcher's default */
    int heartbeat_ms;         /* 0: 1000 */
    int on_sigterm;           /* hpd_on_sigterm (config.h); 0: checkpoint */
    int launcher;             /* hpd_launcher_kind (config.h); 0: local */
    int launch_timeout_s;     /* 0: 120 */
    int comm;                 /* hpd_comm_kind (config.h); 0: auto */
    hpd_slurm_opts slurm;     /* launcher slurm (worker_path is set from the above) */
    hpd_systemd_opts systemd; /* launcher systemd (worker_path is set from the above) */
} hpd_config;

/* Opens the store, recovers jobs in flight, starts the cron. The worker server is started
 * separately (hp__workers_start) so that main can print its port. */
hp_status hpd_new(uv_loop_t *loop, const hpd_config *cfg, hpd **out, hp_err *err);
/* Stops running jobs as d->on_sigterm says (checkpoint: Stop with checkpoint, then SIGTERM;
 * they resume at the next start. cancel: CANCELLED "coordinator shut down"), closes handles;
 * run the loop after it until it has nothing left, then hpd_free. */
void hpd_shutdown(hpd *d);
void hpd_free(hpd *d);
/* Runs the scheduler and timeouts (also every second from the cron). */
void hp__core_tick(hpd *d);

/* A worker said hello: checks job, rank, token and version; on success attaches conn to the
 * rank and sends Welcome. On failure the caller logs err and drops the connection. */
hp_status hp__core_hello(hpd *d, hpd_conn *c, const Hp__V1__Hello *h, hpd_job **job, int *attempt,
                         hp_err *err);
/* A frame from an attached rank (job, attempt, rank as returned by hello). */
void hp__core_frame(hpd *d, hpd_job *j, int attempt, int rank, const Hp__V1__Frame *f);
/* An attached connection closed. */
void hp__core_conn_lost(hpd *d, hpd_job *j, int attempt, int rank);
/* Writes the steps that metrics advanced since the last call (one UPDATE per job, not one per
 * record: the jobs row carries the whole submitted Job, which SQLite rewrites on every UPDATE).
 * The worker server calls it at the end of each read, inside that read's transaction. */
void hp__core_flush_steps(hpd *d);

/* Shared between core.c and lifecycle.c. */
/* The scheduler's test: j's ranks fit in the free slots and, for a cuda job whose GPUs hpd
 * counts, in the free GPUs. */
bool hp__core_fits(const hpd *d, const hpd_job *j);
/* Takes j's slots and GPUs (the lowest free indices, rank order). false: out of memory or
 * too few free GPUs; nothing taken. They go back when j reaches a final state (hp__transition). */
bool hp__core_hold(hpd *d, hpd_job *j);
/* Gives back what hp__core_hold took (no-op when j holds nothing). */
void hp__core_release(hpd *d, hpd_job *j);
hpd_job *hp__job_find(hpd *d, const char *id);
/* Applies event ev (an hpd_sm_event) to j: commits the transition (and the restart count) to
 * the store, then updates memory and tells watchers. error: the job's error text (NULL: the
 * reason when the job fails). */
hp_status hp__transition(hpd *d, hpd_job *j, int ev, const char *reason, const char *error,
                         hp_err *err);
/* Bumped for each event built for watchers (the event passed to every watcher's fn is not
 * changed until the next bump): rpc.c encodes an event once and shares the bytes. */
extern uint64_t hp__event_seq;
void hp__emit_state(hpd *d, hpd_job *j);
void hp__emit_metrics(hpd *d, hpd_job *j, const Hp__V1__StepMetrics *m);
void hp__emit_log(hpd *d, hpd_job *j, const Hp__V1__LogLine *l);
/* Stops the current attempt's ranks: Stop frames, then SIGTERM to their process groups
 * (SIGKILL from the tick after a grace period); connections are detached. */
void hp__stop_attempt(hpd *d, hpd_job *j, const char *reason, bool checkpoint);
/* A rank wrote a checkpoint (CheckpointDone): logs it; once every rank has reported a step,
 * it is the job's ckpt_step (the Welcome's resume_step of the next attempt). */
void hp__on_checkpoint_done(hpd *d, hpd_job *j, int rank, const Hp__V1__CheckpointDone *c);
/* The launcher's event callback (ctx is the hpd). */
void hp__on_launch_event(void *ctx, const hpd_launch_event *ev);
/* The exact command that starts rank `rank` of job j's current attempt by hand (the
 * external launcher): into buf. HP_INVALID when the job has no attempt accepting workers. */
hp_status hp__worker_cmd(hpd *d, hpd_job *j, int rank, char *buf, size_t len, hp_err *err);
double hp__unix_s(void);

void hp__log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hp__log_set_level(const char *level);
uint64_t hp__now_ms(void);

/* ---- traces.c ------------------------------------------------------------------------- */
/* Stores a rank's trace of one step as STATE_DIR/jobs/ID/traces/step-S-rank-R.json (checked to
 * be a JSON object with a traceEvents array; anything else is logged and dropped). */
void hp__trace_store(hpd *d, hpd_job *j, int rank, const Hp__V1__Trace *t);
/* hpd_trace's work on the files alone (any thread): see hpd_trace in hpd.h. */
hp_status hp__trace_merge(const char *state_dir, const char *id, int64_t step, const int32_t *ranks,
                          int n_ranks, char **json, size_t *len, int64_t **steps, int *n_steps,
                          hp_err *err);

/* ---- workers.c ------------------------------------------------------------------------ */
/* Listens on addr ("HOST:PORT", port 0 picks one); *port gets the bound port. */
hp_status hp__workers_start(hpd *d, const char *addr, int *port, hp_err *err);
/* The same on a listening socket systemd passed (socket activation; owned from here); host gets
 * the address it is bound to ("127.0.0.1", "[::]"). */
hp_status hp__workers_start_fd(hpd *d, int fd, char *host, size_t host_len, int *port, hp_err *err);
void hp__workers_stop(hpd *d);
/* Queues f on c. A failure closes the connection. */
hp_status hp__conn_send(hpd_conn *c, const Hp__V1__Frame *f, hp_err *err);
/* Detaches and closes c (no further core callbacks for it). */
void hp__conn_close(hpd_conn *c, const char *reason);

#endif
