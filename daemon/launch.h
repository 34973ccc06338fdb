/* daemon/launch.h — launchers: how a job's rank processes start and stop. One vtable, four
 * launchers: `local` (uv_spawn of hp-worker per rank, the default), `slurm` (one sbatch job
 * per attempt, or srun inside hpd's own allocation), `systemd` (one transient service per rank,
 * started with systemd-run) and `external` (the operator starts the workers; they register
 * with the job token over the worker protocol).
 *
 * The launcher takes a whole attempt at once (Slurm wants one gang submission) and reports
 * what happens to it later through one event callback, always on the loop: a rank's exit
 * status, the scheduler's id for the attempt once it has one (a Slurm job id), the
 * scheduler's state as it changes (PENDING, RUNNING), and the loss of the attempt (sbatch
 * refused it, NODE_FAIL, PREEMPTED, a requeue). Nothing here blocks the loop: scheduler
 * commands run as child processes whose output is read through pipes.
 *
 * A launcher with register_only set starts nothing and reports no exits (the coordinator then
 * learns of a rank's end from its connection and heartbeats alone).
 *
 * Lifetime: a launcher lives from hpd_launcher_*_new to free; free kills nothing — the
 * coordinator stops its jobs first — but closes its handles (the loop must run after it until
 * they are closed). Loop thread only.
 */
#ifndef HP_DAEMON_LAUNCH_H
#define HP_DAEMON_LAUNCH_H

#include "hp/base.h"

#include <stdbool.h>
#include <uv.h>

/* An attempt: every rank of one launch of a job. */
typedef struct hpd_attempt_spec {
    const char *job_id;
    int attempt; /* 0 for the first launch, +1 per restart */
    int world;
    const char *token;       /* this attempt's worker token */
    const char *token_file;  /* the same token in a 0600 file (never put it on a command line) */
    const char *coordinator; /* "HOST:PORT" the workers dial (hpd's --advertise) */
    const char *job_dir;     /* STATE/jobs/ID: rank R logs to job_dir/rank-R.log */
    const char *attempt_dir; /* job_dir/attempt-N: the launcher's own files (scripts, exits) */
    bool cuda;               /* the job runs on GPUs: one GPU per rank */
    int gpus_per_node;       /* cuda: ranks per node */
    const int *gpu_ids;      /* cuda, local launcher: [world], rank r's GPU (NULL: not placed) */
} hpd_attempt_spec;

/* Status of a rank whose end the launcher saw but whose own exit code it could not learn
 * (Slurm killed its task before the wrapper recorded it). */
#define HPD_EXIT_UNKNOWN (-1)

typedef enum {
    HPD_LEV_EXIT,  /* rank ended with status: its exit code, or 128 + the signal */
    HPD_LEV_REF,   /* the scheduler's id for the attempt is text ("1234") */
    HPD_LEV_STATE, /* the scheduler's state of the attempt is now text ("PENDING") */
    HPD_LEV_LOST,  /* the attempt is lost (text says why); the ranks' exits follow */
} hpd_launch_event_kind;

typedef struct hpd_launch_event {
    hpd_launch_event_kind kind;
    const char *job_id;
    int attempt;
    int rank, status; /* HPD_LEV_EXIT */
    const char *text; /* HPD_LEV_REF, _STATE, _LOST */
} hpd_launch_event;

typedef void (*hpd_launch_event_fn)(void *ctx, const hpd_launch_event *ev);

typedef struct hpd_launcher hpd_launcher;
typedef struct hpd_launcher_vt {
    const char *name;
    bool register_only;
    /* Starts every rank of the attempt. On failure nothing was started and no event will come
     * for it; a failure found later (sbatch exits 1) comes as HPD_LEV_LOST. */
    hp_status (*start)(hpd_launcher *l, const hpd_attempt_spec *spec, hp_err *err);
    /* Sends signum to the attempt's ranks (SIGTERM: stop; SIGKILL: kill; Slurm: scancel).
     * No-op when they already exited. */
    void (*stop)(hpd_launcher *l, const char *job_id, int attempt, int signum);
    /* Ranks of the attempt the launcher has not yet reported as ended. */
    int (*alive)(hpd_launcher *l, const char *job_id, int attempt);
    /* Recovery after a coordinator restart: the previous hpd had started (job_id, attempt)
     * as ref (the scheduler's id): track it, so that alive() counts it until it is gone and
     * stop() reaches it. NULL when the launcher cannot (local: its ranks died with hpd). */
    hp_status (*adopt)(hpd_launcher *l, const char *job_id, int attempt, int world,
                       const char *attempt_dir, const char *ref, hp_err *err);
    void (*free)(hpd_launcher *l);
} hpd_launcher_vt;

struct hpd_launcher {
    const hpd_launcher_vt *vt;
    hpd_launch_event_fn on_event;
    void *ctx;
};

/* The hp-worker binary: worker_path, else $HP_WORKER, else hp-worker beside the daemon's
 * binary (build tree: ../worker/hp-worker; installed: same dir), else "hp-worker" (PATH). */
void hpd_launcher_worker_path(const char *worker_path, char *out, size_t len);

/* The local launcher: spawns `worker --coordinator C --job ID --rank R` (the token in
 * $HP_TOKEN_FILE) in its own process group (UV_PROCESS_DETACHED), stdout and stderr appended
 * to job_dir/rank-R.log. A cuda attempt's rank R sees only its GPU: CUDA_VISIBLE_DEVICES is
 * gpu_ids[R], or, where hpd itself runs under a CUDA_VISIBLE_DEVICES list (read when the
 * launcher is made), that list's entry gpu_ids[R] (an attempt without gpu_ids, or with an index
 * past the list, is refused). */
hp_status hpd_launcher_local_new(uv_loop_t *loop, const char *worker_path,
                                 hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                 hp_err *err);

/* The GPUs a CUDA_VISIBLE_DEVICES value names, as CUDA reads it: comma-separated entries
 * (a device index, or a GPU-/MIG- UUID or its prefix; blanks around an entry ignored), up to the
 * first entry that is none of those ("", "-1" and "none" name no GPU). Returns how many; with
 * index >= 0 and index < that count, copies entry `index` into out (len bytes). */
int hpd_visible_gpus(const char *list, int index, char *out, size_t len);

/* The external launcher: starts nothing (register_only). */
hp_status hpd_launcher_external_new(hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                    hp_err *err);

/* What the Slurm launcher passes to sbatch besides the attempt's shape ("" / 0: not passed). */
typedef struct hpd_slurm_opts {
    const char *worker_path;
    const char *partition, *account, *qos, *time_limit; /* --time: "MM", "HH:MM:SS", "D-HH" */
    int poll_ms;                                        /* squeue interval (0: 1000) */
    const char *bin_dir; /* where sbatch/squeue/scancel/srun are ("" : PATH) */
    bool in_allocation;  /* hpd runs inside a Slurm allocation: srun, not sbatch */
} hpd_slurm_opts;

hp_status hpd_launcher_slurm_new(uv_loop_t *loop, const hpd_slurm_opts *o,
                                 hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                 hp_err *err);

/* What the systemd launcher needs besides the attempt. */
typedef struct hpd_systemd_opts {
    const char *worker_path;
    bool user;           /* the calling user's manager (systemctl --user), else the system's */
    bool token_file;     /* hand the worker the token file's path, not a credential */
    const char *slice;   /* Slice= of the rank units ("": the manager's default) */
    int poll_ms;         /* systemctl show interval (0: 1000) */
    const char *bin_dir; /* where systemd-run and systemctl are ("": PATH) */
} hpd_systemd_opts;

/* The systemd launcher: rank R of attempt A of job J runs as the transient service
 * hp-J-A-R.service (systemd-run), its state polled with `systemctl show` off the loop, stopped
 * with `systemctl kill`, and the units stopped and reset-failed once their exits are reported.
 * A restarted hpd adopts the units of an attempt by their names. */
hp_status hpd_launcher_systemd_new(uv_loop_t *loop, const hpd_systemd_opts *o,
                                   hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                   hp_err *err);

#endif
