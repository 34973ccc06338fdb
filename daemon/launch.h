/* daemon/launch.h — launchers: how a job's rank processes start and stop. One vtable; `local`
 * (uv_spawn of hp-worker) now; slurm, systemd and external later. A launcher with
 * register_only set starts nothing: the operator starts the workers, which register with the
 * job token over the worker protocol, and the launcher never reports exits (the coordinator
 * then learns of a rank's end from its connection and heartbeats alone).
 *
 * Lifetime: a launcher lives from hpd_launcher_*_new to free; free sends SIGKILL to nothing —
 * the coordinator stops its jobs first — but closes its handles (the loop must run after it
 * until they are closed). Loop thread only.
 */
#ifndef HP_DAEMON_LAUNCH_H
#define HP_DAEMON_LAUNCH_H

#include "hp/base.h"

#include <stdbool.h>
#include <uv.h>

typedef struct hpd_launch_spec {
    const char *job_id;
    int attempt; /* 0 for the first launch, +1 per restart */
    int rank, world;
    const char *token;       /* the per-job worker token */
    const char *coordinator; /* "HOST:PORT" of the worker protocol */
    const char *log_path;    /* where stdout and stderr go */
} hpd_launch_spec;

/* A rank process of (job_id, attempt) ended: status is its exit code, or 128 + the signal
 * that killed it. */
typedef void (*hpd_exit_fn)(void *ctx, const char *job_id, int attempt, int rank, int status);

typedef struct hpd_launcher hpd_launcher;
typedef struct hpd_launcher_vt {
    const char *name;
    bool register_only;
    /* Starts one rank. On failure nothing was started and on_exit will not be called for it. */
    hp_status (*start)(hpd_launcher *l, const hpd_launch_spec *spec, hp_err *err);
    /* Sends signum to the rank's process group (no-op when it already exited). */
    void (*stop)(hpd_launcher *l, const char *job_id, int attempt, int rank, int signum);
    /* Ranks of this launcher still running for (job_id, attempt). */
    int (*alive)(hpd_launcher *l, const char *job_id, int attempt);
    void (*free)(hpd_launcher *l);
} hpd_launcher_vt;

struct hpd_launcher {
    const hpd_launcher_vt *vt;
    hpd_exit_fn on_exit;
    void *ctx;
};

/* The local launcher: spawns `worker_path --coordinator C --job ID --rank R --token T` in its
 * own process group (UV_PROCESS_DETACHED), stdout and stderr appended to spec->log_path.
 * worker_path NULL: $HP_WORKER, else hp-worker beside the daemon's binary (build tree:
 * ../worker/hp-worker; installed: same dir), else "hp-worker" from PATH. */
hp_status hpd_launcher_local_new(uv_loop_t *loop, const char *worker_path, hpd_exit_fn on_exit,
                                 void *ctx, hpd_launcher **out, hp_err *err);

#endif
