/* daemon/launch_local.c — the local launcher: one hp-worker process per rank, started with
 * uv_spawn (fork+exec: the only safe way next to the gRPC library's threads), detached into its
 * own process group so a stop signal reaches everything it started, stdout and stderr appended
 * to the rank's log file. Exit statuses go to the launcher's on_exit.
 *
 * Lifetimes: a proc lives from a successful spawn to its handle's close callback (after the
 * exit callback); free closes the handles of procs still running without killing them.
 */
#include "daemon/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct proc {
    struct proc *next, *prev;
    struct local *l;
    uv_process_t h;
    char job_id[64];
    int attempt, rank;
    bool exited;
} proc;

typedef struct local {
    hpd_launcher base;
    uv_loop_t *loop;
    char worker[PATH_MAX];
    proc *procs;
    bool freeing;
} local;

static void unlink_proc(local *l, proc *p) {
    if (p->prev)
        p->prev->next = p->next;
    else if (l->procs == p)
        l->procs = p->next;
    if (p->next) p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

static void on_closed(uv_handle_t *h) {
    proc *p = h->data;
    hp_free(p);
}

static void on_exit_cb(uv_process_t *h, int64_t code, int sig) {
    proc *p = h->data;
    local *l = p->l;
    p->exited = true;
    unlink_proc(l, p);
    int status = sig ? 128 + sig : (int)code;
    char job[64];
    snprintf(job, sizeof job, "%s", p->job_id);
    int attempt = p->attempt, rank = p->rank;
    uv_close((uv_handle_t *)h, on_closed);
    if (l->base.on_exit && !l->freeing) l->base.on_exit(l->base.ctx, job, attempt, rank, status);
}

static hp_status local_start(hpd_launcher *base, const hpd_launch_spec *s, hp_err *err) {
    local *l = (local *)base;
    proc *p = hp_calloc(1, sizeof *p);
    if (!p) return hp_errf(err, HP_NOMEM, "out of memory");
    p->l = l;
    snprintf(p->job_id, sizeof p->job_id, "%s", s->job_id);
    p->attempt = s->attempt;
    p->rank = s->rank;
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        hp_free(p);
        return hp_errf(err, HP_IO, "open %s: %s", s->log_path, strerror(errno));
    }
    char rank[16];
    snprintf(rank, sizeof rank, "%d", s->rank);
    char *args[] = {
        l->worker, "--coordinator", (char *)s->coordinator, "--job", (char *)s->job_id, "--rank",
        rank,      "--token",       (char *)s->token,       NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = fd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = fd;
    uv_process_options_t o;
    memset(&o, 0, sizeof o);
    o.file = l->worker;
    o.args = args;
    o.exit_cb = on_exit_cb;
    o.flags = UV_PROCESS_DETACHED;
    o.stdio = stdio;
    o.stdio_count = 3;
    p->h.data = p;
    int rc = uv_spawn(l->loop, &p->h, &o);
    close(fd);
    if (rc < 0) {
        /* uv_spawn's handle must still be closed */
        uv_close((uv_handle_t *)&p->h, on_closed);
        return hp_errf(err, HP_IO, "spawn %s (job %s rank %d): %s", l->worker, s->job_id, s->rank,
                       uv_strerror(rc));
    }
    p->next = l->procs;
    if (l->procs) l->procs->prev = p;
    l->procs = p;
    return HP_OK;
}

static void local_stop(hpd_launcher *base, const char *job_id, int attempt, int rank, int signum) {
    local *l = (local *)base;
    for (proc *p = l->procs; p; p = p->next)
        if (!p->exited && p->attempt == attempt && (rank < 0 || p->rank == rank) &&
            strcmp(p->job_id, job_id) == 0)
            uv_kill(-p->h.pid, signum); /* the whole group (detached: pgid == pid) */
}

static int local_alive(hpd_launcher *base, const char *job_id, int attempt) {
    local *l = (local *)base;
    int n = 0;
    for (proc *p = l->procs; p; p = p->next)
        if (!p->exited && p->attempt == attempt && strcmp(p->job_id, job_id) == 0) n++;
    return n;
}

static void local_free(hpd_launcher *base) {
    local *l = (local *)base;
    l->freeing = true;
    while (l->procs) {
        proc *p = l->procs;
        unlink_proc(l, p);
        uv_close((uv_handle_t *)&p->h, on_closed);
    }
    hp_free(l);
}

static const hpd_launcher_vt local_vt = {
    .name = "local",
    .register_only = false,
    .start = local_start,
    .stop = local_stop,
    .alive = local_alive,
    .free = local_free,
};

static bool executable(const char *path) {
    return access(path, X_OK) == 0;
}

hp_status hpd_launcher_local_new(uv_loop_t *loop, const char *worker_path, hpd_exit_fn on_exit,
                                 void *ctx, hpd_launcher **out, hp_err *err) {
    *out = NULL;
    local *l = hp_calloc(1, sizeof *l);
    if (!l) return hp_errf(err, HP_NOMEM, "out of memory");
    l->base.vt = &local_vt;
    l->base.on_exit = on_exit;
    l->base.ctx = ctx;
    l->loop = loop;
    const char *env = getenv("HP_WORKER");
    if (worker_path && *worker_path) {
        snprintf(l->worker, sizeof l->worker, "%s", worker_path);
    } else if (env && *env) {
        snprintf(l->worker, sizeof l->worker, "%s", env);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        bool found = false;
        if (n > 0) {
            self[n] = 0;
            char *slash = strrchr(self, '/');
            if (slash) {
                *slash = 0;
                const char *cands[] = {"/../worker/hp-worker", "/hp-worker"};
                for (size_t i = 0; i < HP_ARRAY_LEN(cands) && !found; i++) {
                    size_t a = strlen(self), b = strlen(cands[i]);
                    if (a + b >= sizeof l->worker) continue;
                    memcpy(l->worker, self, a);
                    memcpy(l->worker + a, cands[i], b + 1);
                    found = executable(l->worker);
                }
            }
        }
        if (!found) snprintf(l->worker, sizeof l->worker, "hp-worker"); /* uv_spawn: PATH */
    }
    *out = &l->base;
    return HP_OK;
}
