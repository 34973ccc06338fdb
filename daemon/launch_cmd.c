/* daemon/launch_cmd.c — see launch_cmd.h. A command is one uv_process_t, two pipes and a
 * timer; it finishes (fn is called) once the process exited and both pipes reached EOF, then
 * its four handles are closed and it frees itself after the last close callback.
 */
#include "daemon/launch.h"
#include "daemon/launch_cmd.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

void hpd_launcher_worker_path(const char *worker_path, char *out, size_t len) {
    const char *env = getenv("HP_WORKER");
    if (worker_path && *worker_path) {
        snprintf(out, len, "%s", worker_path);
        return;
    }
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            const char *cands[] = {"/../worker/hp-worker", "/hp-worker"};
            for (size_t i = 0; i < HP_ARRAY_LEN(cands); i++) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof path, "%s%s", self, cands[i]);
                char real[PATH_MAX];
                if (access(path, X_OK) == 0 && realpath(path, real) && strlen(real) < len) {
                    snprintf(out, len, "%s", real);
                    return;
                }
            }
        }
    }
    snprintf(out, len, "hp-worker"); /* uv_spawn: PATH */
}

char **hpd_cmd_env(const char *const *add) {
    size_t n = 0, k = 0;
    while (environ[n]) n++;
    while (add && add[2 * k]) k++;
    char **env = hp_calloc(n + k + 1, sizeof *env);
    if (!env) return NULL;
    size_t m = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        bool replaced = false;
        for (size_t a = 0; a < k && !replaced; a++) {
            size_t nl = strlen(add[2 * a]);
            replaced = strncmp(environ[i], add[2 * a], nl) == 0 && environ[i][nl] == '=';
        }
        if (replaced) continue;
        size_t len = strlen(environ[i]) + 1;
        env[m] = hp_malloc(len);
        ok = env[m] != NULL;
        if (ok) memcpy(env[m++], environ[i], len);
    }
    for (size_t a = 0; a < k && ok; a++) {
        if (!add[2 * a + 1]) continue; /* NULL: unset */
        size_t len = strlen(add[2 * a]) + strlen(add[2 * a + 1]) + 2;
        env[m] = hp_malloc(len);
        ok = env[m] != NULL;
        if (ok) snprintf(env[m++], len, "%s=%s", add[2 * a], add[2 * a + 1]);
    }
    env[m] = NULL;
    if (!ok) {
        hpd_cmd_env_free(env);
        return NULL;
    }
    return env;
}

void hpd_cmd_env_free(char **env) {
    if (!env) return;
    for (size_t i = 0; env[i]; i++) hp_free(env[i]);
    hp_free(env);
}

typedef struct buf {
    char *p;
    size_t len, max;
    int truncated;
} buf;

typedef struct cmd {
    uv_process_t proc;
    uv_pipe_t out, err;
    uv_timer_t timer;
    buf b_out, b_err;
    int open_handles; /* closes still to come */
    int eofs;         /* pipes at EOF (2: both) */
    bool exited, timed_out, done;
    int status;
    hpd_cmd_fn fn;
    void *ctx;
} cmd;

static void on_close(uv_handle_t *h) {
    cmd *c = h->data;
    if (--c->open_handles > 0) return;
    hp_free(c->b_out.p);
    hp_free(c->b_err.p);
    hp_free(c);
}

static void maybe_finish(cmd *c) {
    if (c->done || !c->exited || c->eofs < 2) return;
    c->done = true;
    uv_timer_stop(&c->timer);
    hpd_cmd_result r = {.status = c->timed_out ? -1 : c->status,
                        .out = c->b_out.p ? c->b_out.p : "",
                        .err = c->b_err.p ? c->b_err.p : "",
                        .out_len = c->b_out.len,
                        .err_len = c->b_err.len,
                        .truncated = c->b_out.truncated || c->b_err.truncated,
                        .error = c->timed_out ? "timed out" : NULL};
    c->fn(c->ctx, &r);
    uv_close((uv_handle_t *)&c->proc, on_close);
    uv_close((uv_handle_t *)&c->out, on_close);
    uv_close((uv_handle_t *)&c->err, on_close);
    uv_close((uv_handle_t *)&c->timer, on_close);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
    (void)suggested;
    cmd *c = h->data;
    buf *bb = (uv_pipe_t *)h == &c->out ? &c->b_out : &c->b_err;
    static char sink[4096]; /* past the bound: read and drop */
    if (bb->len + 1 >= bb->max) {
        *b = uv_buf_init(sink, sizeof sink);
        return;
    }
    *b = uv_buf_init(bb->p + bb->len, (unsigned)(bb->max - 1 - bb->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    cmd *c = s->data;
    buf *bb = (uv_pipe_t *)s == &c->out ? &c->b_out : &c->b_err;
    if (n > 0) {
        if (b->base >= bb->p && b->base < bb->p + bb->max) {
            bb->len += (size_t)n;
            bb->p[bb->len] = 0;
        } else {
            bb->truncated = 1;
        }
    }
    if (n < 0) { /* EOF or an error: this pipe is done */
        uv_read_stop(s);
        c->eofs++;
        maybe_finish(c);
    }
}

static void on_exit_cb(uv_process_t *p, int64_t code, int sig) {
    cmd *c = p->data;
    c->exited = true;
    c->status = sig ? 128 + sig : (int)code;
    maybe_finish(c);
}

static void on_timeout(uv_timer_t *t) {
    cmd *c = t->data;
    c->timed_out = true;
    if (!c->exited) uv_process_kill(&c->proc, SIGKILL);
}

hp_status hpd_cmd_run(uv_loop_t *loop, char *const *argv, char **env, int timeout_ms,
                      size_t max_out, hpd_cmd_fn fn, void *ctx, hp_err *err) {
    cmd *c = hp_calloc(1, sizeof *c);
    if (!c) return hp_errf(err, HP_NOMEM, "out of memory");
    c->b_out.max = c->b_err.max = max_out < 64 ? 64 : max_out;
    c->b_out.p = hp_malloc(c->b_out.max);
    c->b_err.p = hp_malloc(c->b_err.max);
    if (!c->b_out.p || !c->b_err.p) {
        hp_free(c->b_out.p);
        hp_free(c->b_err.p);
        hp_free(c);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    c->b_out.p[0] = c->b_err.p[0] = 0;
    c->fn = fn;
    c->ctx = ctx;
    uv_pipe_init(loop, &c->out, 0);
    uv_pipe_init(loop, &c->err, 0);
    uv_timer_init(loop, &c->timer);
    c->proc.data = c->out.data = c->err.data = c->timer.data = c;
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&c->out;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&c->err;
    uv_process_options_t o;
    memset(&o, 0, sizeof o);
    o.file = argv[0];
    o.args = (char **)argv;
    o.env = env;
    o.exit_cb = on_exit_cb;
    o.stdio = stdio;
    o.stdio_count = 3;
    int rc = uv_spawn(loop, &c->proc, &o);
    if (rc < 0) {
        /* nothing will be called: close the handles, then fail */
        c->done = true;
        c->open_handles = 4;
        uv_close((uv_handle_t *)&c->proc, on_close);
        uv_close((uv_handle_t *)&c->out, on_close);
        uv_close((uv_handle_t *)&c->err, on_close);
        uv_close((uv_handle_t *)&c->timer, on_close);
        return hp_errf(err, HP_IO, "spawn %s: %s", argv[0], uv_strerror(rc));
    }
    c->open_handles = 4;
    uv_read_start((uv_stream_t *)&c->out, on_alloc, on_read);
    uv_read_start((uv_stream_t *)&c->err, on_alloc, on_read);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)(timeout_ms > 0 ? timeout_ms : 30000), 0);
    return HP_OK;
}

void hpd_cmd_tool(char *out, size_t len, const char *dir, const char *name) {
    if (dir && *dir)
        snprintf(out, len, "%s/%s", dir, name);
    else
        snprintf(out, len, "%s", name);
}
