/* daemon/launch_cmd.h — what the launchers share: the hp-worker path, an environment built for
 * a child, and scheduler commands (sbatch, squeue, scancel, systemd-run) run without blocking
 * the loop: uv_spawn with stdout and stderr read through pipes, bounded in size and time.
 * Loop thread only.
 */
#ifndef HP_DAEMON_LAUNCH_CMD_H
#define HP_DAEMON_LAUNCH_CMD_H

#include "hp/base.h"

#include <stddef.h>
#include <uv.h>

/* A copy of this process's environment with add's NAME, VALUE pairs (NULL-terminated list)
 * set or replaced (VALUE NULL: removed); NULL on out of memory. Free with hpd_cmd_env_free. */
char **hpd_cmd_env(const char *const *add);
void hpd_cmd_env_free(char **env);

/* The result of a command. status: its exit code, 128 + signal, or -1 when it ran past its
 * time and was killed (error says so). out/err: what it wrote (NUL-terminated, at most the
 * bound; the rest was dropped and truncated is set). Borrowed for the callback. */
typedef struct hpd_cmd_result {
    int status;
    const char *out, *err;
    size_t out_len, err_len;
    int truncated;
    const char *error; /* non-NULL: why the command did not complete */
} hpd_cmd_result;

typedef void (*hpd_cmd_fn)(void *ctx, const hpd_cmd_result *r);

/* Runs argv[0] (PATH searched) with argv and env (NULL: ours); fn is called once on the loop
 * when it ended and its pipes are drained. Killed (SIGKILL) after timeout_ms. On failure to
 * start it returns the error and fn is never called. */
hp_status hpd_cmd_run(uv_loop_t *loop, char *const *argv, char **env, int timeout_ms,
                      size_t max_out, hpd_cmd_fn fn, void *ctx, hp_err *err);

/* The path of a scheduler tool: dir/name when dir is set, else name (uv_spawn searches PATH). */
void hpd_cmd_tool(char *out, size_t len, const char *dir, const char *name);

#endif
