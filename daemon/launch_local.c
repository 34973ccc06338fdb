/* daemon/launch_local.c — the local launcher: one hp-worker process per rank, started with
 * uv_spawn (fork+exec: the only safe way next to the gRPC library's threads), detached into its
 * own process group so a stop signal reaches everything it started, stdout and stderr appended
 * to the rank's log file, the token passed in a 0600 file ($HP_TOKEN_FILE) rather than on the
 * command line. Exit statuses come back as HPD_LEV_EXIT events.
 *
 * Lifetimes: a proc lives from a successful spawn to its handle's close callback (after the
 * exit callback); free closes the handles of procs still running without killing them.
 */
#include "daemon/launch.h"
#include "daemon/launch_cmd.h"

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
    bool exited, muted; /* muted: part of a start that failed (no events) */
} proc;

typedef struct local {
    hpd_launcher base;
    uv_loop_t *loop;
    char worker[PATH_MAX];
    char *visible; /* hpd's own CUDA_VISIBLE_DEVICES when it has one (NULL: the host's indices) */
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
    hpd_launch_event ev = {.kind = HPD_LEV_EXIT,
                           .job_id = p->job_id,
                           .attempt = p->attempt,
                           .rank = p->rank,
                           .status = sig ? 128 + sig : (int)code};
    if (l->base.on_event && !l->freeing && !p->muted) l->base.on_event(l->base.ctx, &ev);
    uv_close((uv_handle_t *)h, on_closed);
}

static hp_status start_rank(local *l, const hpd_attempt_spec *s, int r, char **env, hp_err *err) {
    proc *p = hp_calloc(1, sizeof *p);
    if (!p) return hp_errf(err, HP_NOMEM, "out of memory");
    p->l = l;
    snprintf(p->job_id, sizeof p->job_id, "%s", s->job_id);
    p->attempt = s->attempt;
    p->rank = r;
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%.3900s/rank-%d.log", s->job_dir, r);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        hp_free(p);
        return hp_errf(err, HP_IO, "open %s: %s", log, strerror(errno));
    }
    char rank[16];
    snprintf(rank, sizeof rank, "%d", r);
    char *args[] = {l->worker,
                    "--coordinator",
                    (char *)s->coordinator,
                    "--job",
                    (char *)s->job_id,
                    "--rank",
                    rank,
                    NULL};
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
    o.env = env;
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
        return hp_errf(err, HP_IO, "spawn %s (job %s rank %d): %s", l->worker, s->job_id, r,
                       uv_strerror(rc));
    }
    p->next = l->procs;
    if (l->procs) l->procs->prev = p;
    l->procs = p;
    return HP_OK;
}

static void local_stop(hpd_launcher *base, const char *job_id, int attempt, int signum) {
    local *l = (local *)base;
    for (proc *p = l->procs; p; p = p->next)
        if (!p->exited && p->attempt == attempt && strcmp(p->job_id, job_id) == 0)
            uv_kill(-p->h.pid, signum); /* the whole group (detached: pgid == pid) */
}

static hp_status local_start(hpd_launcher *base, const hpd_attempt_spec *s, hp_err *err) {
    local *l = (local *)base;
    /* $HP_TOKEN (hpctl's bearer token, say) would win over the file in hp-worker */
    if (s->cuda && !s->gpu_ids)
        return hp_errf(err, HP_STATE, "job %s: a cuda attempt with no GPUs allocated", s->job_id);
    hp_status st = HP_OK;
    for (int r = 0; r < s->world && st == HP_OK; r++) {
        /* cuda: CUDA_VISIBLE_DEVICES is rank r's GPU, an index of the host's or the entry of
         * hpd's own list (a cpu job's env is left as it is). */
        char gpu[128] = "0";
        if (s->cuda && !l->visible) snprintf(gpu, sizeof gpu, "%d", s->gpu_ids[r]);
        if (s->cuda && l->visible) {
            int n = hpd_visible_gpus(l->visible, s->gpu_ids[r], gpu, sizeof gpu);
            if (s->gpu_ids[r] < 0 || s->gpu_ids[r] >= n) {
                st = hp_errf(err, HP_STATE,
                             "job %s: rank %d was given GPU %d, but hpd's CUDA_VISIBLE_DEVICES "
                             "'%.64s' names %d",
                             s->job_id, r, s->gpu_ids[r], l->visible, n);
                break;
            }
        }
        const char *add[] = {"HP_TOKEN_FILE",
                             s->token_file,
                             "HP_TOKEN",
                             NULL,
                             s->cuda ? "CUDA_VISIBLE_DEVICES" : NULL,
                             gpu,
                             NULL};
        char **env = hpd_cmd_env(add);
        if (!env) {
            st = hp_errf(err, HP_NOMEM, "out of memory");
            break;
        }
        st = start_rank(l, s, r, env, err);
        hpd_cmd_env_free(env);
    }
    if (st != HP_OK) { /* nothing of a failed start stays behind */
        local_stop(base, s->job_id, s->attempt, SIGKILL);
        for (proc *p = l->procs; p; p = p->next)
            if (p->attempt == s->attempt && strcmp(p->job_id, s->job_id) == 0) p->muted = true;
    }
    return st;
}

static int local_alive(hpd_launcher *base, const char *job_id, int attempt) {
    local *l = (local *)base;
    int n = 0;
    for (proc *p = l->procs; p; p = p->next)
        if (!p->exited && !p->muted && p->attempt == attempt && strcmp(p->job_id, job_id) == 0) n++;
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
    hp_free(l->visible);
    hp_free(l);
}

static const hpd_launcher_vt local_vt = {
    .name = "local",
    .register_only = false,
    .start = local_start,
    .stop = local_stop,
    .alive = local_alive,
    .adopt = NULL,
    .free = local_free,
};

hp_status hpd_launcher_local_new(uv_loop_t *loop, const char *worker_path,
                                 hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                 hp_err *err) {
    *out = NULL;
    local *l = hp_calloc(1, sizeof *l);
    if (!l) return hp_errf(err, HP_NOMEM, "out of memory");
    l->base.vt = &local_vt;
    l->base.on_event = on_event;
    l->base.ctx = ctx;
    l->loop = loop;
    hpd_launcher_worker_path(worker_path, l->worker, sizeof l->worker);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && !(l->visible = hp_strdup(vis))) {
        hp_free(l);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    *out = &l->base;
    return HP_OK;
}

/* An entry CUDA takes: digits, or a GPU-/MIG- UUID (or a prefix of one). */
static bool visible_entry(const char *p, size_t n) {
    if (n > 4 && (!strncmp(p, "GPU-", 4) || !strncmp(p, "MIG-", 4))) return true;
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return false;
    return true;
}

int hpd_visible_gpus(const char *list, int index, char *out, size_t len) {
    int n = 0;
    for (const char *p = list ? list : ""; *p;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (!visible_entry(a, (size_t)(b - a))) break; /* CUDA stops at the first bad entry */
        if (n == index && out && len > 0) snprintf(out, len, "%.*s", (int)(b - a), a);
        n++;
        if (!*end) break;
        p = end + 1;
    }
    return n;
}

/* ---- external: the operator starts the workers ---------------------------------------------- */
static hp_status ext_start(hpd_launcher *l, const hpd_attempt_spec *s, hp_err *err) {
    (void)l, (void)s, (void)err;
    return HP_OK;
}
static void ext_stop(hpd_launcher *l, const char *job_id, int attempt, int signum) {
    (void)l, (void)job_id, (void)attempt, (void)signum; /* Stop frames reach them; no pids */
}
static int ext_alive(hpd_launcher *l, const char *job_id, int attempt) {
    (void)l, (void)job_id, (void)attempt;
    return 0;
}
static void ext_free(hpd_launcher *l) {
    hp_free(l);
}

static const hpd_launcher_vt external_vt = {
    .name = "external",
    .register_only = true,
    .start = ext_start,
    .stop = ext_stop,
    .alive = ext_alive,
    .adopt = NULL,
    .free = ext_free,
};

hp_status hpd_launcher_external_new(hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                    hp_err *err) {
    hpd_launcher *l = hp_calloc(1, sizeof *l);
    if (!l) return hp_errf(err, HP_NOMEM, "out of memory");
    l->vt = &external_vt;
    l->on_event = on_event;
    l->ctx = ctx;
    *out = l;
    return HP_OK;
}
