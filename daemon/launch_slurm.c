/* daemon/launch_slurm.c — the Slurm launcher: one Slurm job per attempt. hpd writes
 * ATTEMPT_DIR/launch.sh (exports, then `exec srun --ntasks=W ... hp-worker`), and submits it
 * with `sbatch --parsable --ntasks=W --nodes=N --job-name hp-JOB-ATTEMPT ...`; when hpd itself
 * runs inside an allocation ($SLURM_JOB_ID) it runs the script directly, so srun starts a step
 * of that allocation. Each task runs hp-worker under a small sh wrapper that records the
 * rank's own exit status (128 + signal when killed) in ATTEMPT_DIR/rank-R.exit: srun's own
 * status (143 after --kill-on-bad-exit) says nothing about which rank failed or how.
 *
 * State: every poll_ms one child process (never a blocking call on the loop) runs `squeue -h
 * -t all --name=hp-... -o %i|%T|%r` and lists the exit files of every attempt it tracks; its
 * output comes back through a pipe. A new rank exit → HPD_LEV_EXIT; a new squeue state →
 * HPD_LEV_STATE; NODE_FAIL, PREEMPTED, BOOT_FAIL, TIMEOUT, DEADLINE, OUT_OF_MEMORY or a requeue
 * → HPD_LEV_LOST (and scancel); a terminal state → the ranks not yet reported end with
 * HPD_EXIT_UNKNOWN and the attempt is forgotten. A job absent from squeue on two polls with
 * ranks not yet reported (purged after MinJobAge while hpd was down, a missed poll) is asked of
 * `sacct -j ID -P -n` (a child process too): its final state maps as squeue's would (lost
 * states → HPD_LEV_LOST), COMPLETED with every step 0:0 → exit 0 for the rest, else unknown;
 * where sacct fails or has no record (accounting_storage/none) the attempt is lost, logged as
 * event=slurm_sacct_unavailable with sacct's own words.
 * stop(SIGTERM) is `scancel --signal=TERM` (the steps only), stop(SIGKILL) is `scancel` (Slurm
 * signals, waits KillWait, kills). In an allocation both signal the step (`scancel --signal=SIG
 * ALLOC.STEP`), never srun with TERM (srun SIGKILLs its tasks on one). The state dir must be on
 * a filesystem the nodes share (logs, exits, token). In an allocation srun's own status is never
 * a rank's: the exit files are, read by the first poll that starts after srun ended.
 *
 * Lifetimes: an sjob lives from start (or adopt) until its last rank is reported and no
 * command of its is in flight. Commands hold the loop alive (their handles are referenced;
 * the poll timer is not), so when the loop has run dry none is in flight and free only drops
 * the sjobs.
 */
#include "daemon/core.h" /* hp__log */
#include "daemon/launch.h"
#include "daemon/launch_cmd.h"
#include "daemon/launch_slurm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD_TIMEOUT_MS 30000
#define CMD_MAX_OUT    (1u << 20)
#define REF_MAX        32

typedef struct sjob {
    struct sjob *next;
    uint64_t serial; /* unique per launcher: a poll's snapshot tells a freed sjob from a new one */
    char job_id[64];
    int attempt, world;
    char dir[PATH_MAX]; /* the attempt dir: launch.sh, rank-R.exit, sbatch.log */
    char ref[REF_MAX];  /* the Slurm job id ("" until sbatch answered; in-allocation: "") */
    char state[32];     /* the last squeue state seen */
    bool ran;           /* was RUNNING once (PENDING after that: requeued) */
    bool *reported;     /* [world] exit reported */
    int n_reported;
    bool submitting;    /* sbatch in flight */
    bool over;          /* the Slurm job (or srun step) ended: report what is left, forget */
    bool lost;          /* HPD_LEV_LOST sent */
    int pending_sig;    /* stop() before sbatch answered: scancel once it has */
    int misses;         /* polls that did not list it */
    bool sacct_running; /* sacct in flight (it left squeue before its end was seen) */
    int sacct_tries;    /* sacct runs that found it still active */
    uv_process_t srun;  /* in-allocation mode */
    bool srun_running;
    uint64_t over_after; /* over only once a poll started after this one (srun's exit) */
    struct slurm *owner;
} sjob;

typedef struct slurm {
    hpd_launcher base;
    uv_loop_t *loop;
    char worker[PATH_MAX];
    char sbatch[PATH_MAX], squeue[PATH_MAX], scancel[PATH_MAX], srun[PATH_MAX], sacct[PATH_MAX];
    char partition[128], account[128], qos[128], time_limit[32];
    char alloc[32]; /* $SLURM_JOB_ID when hpd runs inside an allocation */
    int poll_ms;
    bool in_alloc;
    uv_timer_t timer;
    bool polling;      /* a poll command in flight */
    uint64_t poll_seq; /* polls started */
    sjob *jobs;
    uint64_t serial;
} slurm;

/* ---- small helpers ------------------------------------------------------------------------ */
static void emit(slurm *s, sjob *j, hpd_launch_event_kind kind, int rank, int status,
                 const char *text) {
    hpd_launch_event ev = {.kind = kind,
                           .job_id = j->job_id,
                           .attempt = j->attempt,
                           .rank = rank,
                           .status = status,
                           .text = text};
    if (s->base.on_event) s->base.on_event(s->base.ctx, &ev);
}

static sjob *find(slurm *s, const char *job_id, int attempt) {
    for (sjob *j = s->jobs; j; j = j->next)
        if (j->attempt == attempt && strcmp(j->job_id, job_id) == 0) return j;
    return NULL;
}

static void sjob_free(slurm *s, sjob *j) {
    for (sjob **p = &s->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    hp_free(j->reported);
    hp_free(j);
}

/* Reports every rank not yet reported (status unknown) and forgets the attempt. Events may
 * re-enter the launcher (stop, alive): j is unlinked first. */
static void finish(slurm *s, sjob *j) {
    if (j->submitting || j->srun_running || j->sacct_running) {
        j->over = true; /* finished when its command returns */
        return;
    }
    for (sjob **p = &s->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    j->next = NULL;
    for (int r = 0; r < j->world; r++)
        if (!j->reported[r]) {
            j->reported[r] = true;
            emit(s, j, HPD_LEV_EXIT, r, HPD_EXIT_UNKNOWN, NULL);
        }
    hp_free(j->reported);
    hp_free(j);
}

/* 'text' for sh, into out. */
static bool sh_quote(const char *in, char *out, size_t len) {
    size_t k = 0;
    if (len < 3) return false;
    out[k++] = '\'';
    for (const char *p = in; *p; p++) {
        if (*p == '\'') {
            if (k + 5 >= len) return false;
            memcpy(out + k, "'\\''", 4);
            k += 4;
        } else {
            if (k + 2 >= len) return false;
            out[k++] = *p;
        }
    }
    out[k++] = '\'';
    out[k] = 0;
    return true;
}

typedef struct cmd_ctx {
    slurm *s;
    char job_id[64];
    int attempt;
} cmd_ctx;

static cmd_ctx *ctx_new(slurm *s, const sjob *j) {
    cmd_ctx *c = hp_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    if (j) snprintf(c->job_id, sizeof c->job_id, "%s", j->job_id);
    c->attempt = j ? j->attempt : -1;
    return c;
}

/* The first line of a command's stderr (or stdout), for messages. */
static void first_line(const hpd_cmd_result *r, char *out, size_t len) {
    const char *t = r->err_len ? r->err : r->out;
    size_t n = strcspn(t, "\n");
    snprintf(out, len, "%.*s", (int)(n < 300 ? n : 300), t);
    for (char *p = out; *p; p++)
        if (*p == '"' || (unsigned char)*p < 0x20) *p = '\'';
}

/* ---- scancel ------------------------------------------------------------------------------- */
static void on_scancel(void *ctx, const hpd_cmd_result *r) {
    cmd_ctx *c = ctx;
    if (r->status != 0 || r->error) {
        char why[320];
        first_line(r, why, sizeof why);
        hp__log("warn", "event=scancel_failed job=%s attempt=%d status=%d error=\"%s\"", c->job_id,
                c->attempt, r->status, r->error ? r->error : why);
    }
    hp_free(c);
}

static void scancel(slurm *s, sjob *j, int sig) {
    if (!j->ref[0]) return;
    /* SIGTERM: signal the steps only (not the batch shell: srun would take it as a reason to
     * SIGKILL the step before the wrappers record the ranks' statuses); the workers stop on
     * their own and the job ends. SIGKILL: cancel the job (Slurm signals, waits KillWait,
     * kills). */
    char *argv[6];
    int n = 0;
    argv[n++] = s->scancel;
    if (sig != SIGKILL) {
        argv[n++] = "--signal=TERM";
    }
    argv[n++] = j->ref;
    argv[n] = NULL;
    cmd_ctx *c = ctx_new(s, j);
    hp_err e = {0};
    if (!c) {
        hp__log("error", "event=scancel_failed job=%s ref=%s error=\"out of memory\"", j->job_id,
                j->ref);
        return;
    }
    if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 4096, on_scancel, c, &e) != HP_OK) {
        hp_free(c);
        hp__log("error", "event=scancel_failed job=%s ref=%s error=\"%s\"", j->job_id, j->ref,
                e.msg);
        return;
    }
    hp__log("info", "event=scancel job=%s attempt=%d ref=%s signal=%s", j->job_id, j->attempt,
            j->ref, sig == SIGKILL ? "KILL" : "TERM");
}

/* ---- sbatch -------------------------------------------------------------------------------- */
/* sbatch --parsable prints "JOBID" or "JOBID;CLUSTER". */
static bool parse_jobid(const char *out, char *ref, size_t len) {
    size_t n = 0;
    while (isdigit((unsigned char)out[n])) n++;
    if (n == 0 || n >= len || n > 18) return false;
    if (out[n] && out[n] != ';' && out[n] != '\n') return false;
    const char *rest = out + n + strcspn(out + n, "\n");
    if (*rest == '\n') rest++;
    while (*rest == ' ' || *rest == '\n' || *rest == '\t') rest++;
    if (*rest) return false; /* more than one line: not what sbatch --parsable prints */
    memcpy(ref, out, n);
    ref[n] = 0;
    return true;
}

static void on_sbatch(void *ctx, const hpd_cmd_result *r) {
    cmd_ctx *c = ctx;
    slurm *s = c->s;
    sjob *j = find(s, c->job_id, c->attempt);
    hp_free(c);
    if (!j) return;
    j->submitting = false;
    char why[400];
    if (r->error || r->status != 0) {
        char line[320];
        first_line(r, line, sizeof line);
        snprintf(why, sizeof why, "sbatch %s: %s", r->error ? r->error : "failed",
                 line[0] ? line : "(no output)");
    } else if (!parse_jobid(r->out, j->ref, sizeof j->ref)) {
        char line[320];
        first_line(&(hpd_cmd_result){.out = r->out, .err = ""}, line, sizeof line);
        snprintf(why, sizeof why, "sbatch printed '%s', not a job id", line);
    } else {
        emit(s, j, HPD_LEV_REF, -1, 0, j->ref);
        if (j->pending_sig) scancel(s, j, j->pending_sig);
        if (j->over) finish(s, j);
        return;
    }
    j->lost = true;
    emit(s, j, HPD_LEV_LOST, -1, 0, why);
    finish(s, j);
}

/* ---- srun inside hpd's allocation ----------------------------------------------------------- */
static void on_srun_closed(uv_handle_t *h) {
    sjob *j = h->data;
    j->srun_running = false;
    j->over = true;
    /* The ranks' exit files are all written now (each wrapper wrote its own before it ended):
     * a poll that listed them before srun ended may have missed some, so only the next poll
     * finishes the attempt (else the ranks it missed would end "unknown"). */
    j->over_after = j->owner->poll_seq;
}

static void on_srun_exit(uv_process_t *p, int64_t code, int sig) {
    sjob *j = p->data;
    hp__log("info", "event=srun_exit job=%s attempt=%d status=%d", j->job_id, j->attempt,
            sig ? 128 + sig : (int)code);
    uv_close((uv_handle_t *)p, on_srun_closed);
}

/* ---- the script ---------------------------------------------------------------------------- */
static hp_status write_script(slurm *s, const hpd_attempt_spec *a, char *path, size_t len,
                              hp_err *err) {
    snprintf(path, len, "%s/launch.sh", a->attempt_dir);
    char q_coord[600], q_job[200], q_tok[PATH_MAX * 4 + 8], q_dir[PATH_MAX * 4 + 8],
        q_worker[PATH_MAX * 4 + 8], q_srun[PATH_MAX * 4 + 8], q_out[PATH_MAX * 4 + 8];
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/rank-%%t.log", a->job_dir);
    if (!sh_quote(a->coordinator, q_coord, sizeof q_coord) ||
        !sh_quote(a->job_id, q_job, sizeof q_job) ||
        !sh_quote(a->token_file, q_tok, sizeof q_tok) ||
        !sh_quote(a->attempt_dir, q_dir, sizeof q_dir) ||
        !sh_quote(s->worker, q_worker, sizeof q_worker) ||
        !sh_quote(s->srun, q_srun, sizeof q_srun) || !sh_quote(out, q_out, sizeof q_out))
        return hp_errf(err, HP_INVALID, "job %s: a path is too long for the launch script",
                       a->job_id);
    FILE *f = fopen(path, "w");
    if (!f) return hp_errf(err, HP_IO, "open %s: %s", path, strerror(errno));
    fprintf(f,
            "#!/bin/sh\n"
            "# hpd: attempt %d of job %s (written by hpd; each run writes a new one)\n"
            "export HP_COORDINATOR=%s HP_JOB=%s HP_TOKEN_FILE=%s HP_EXIT_DIR=%s\n"
            "unset HP_TOKEN\n",
            a->attempt, a->job_id, q_coord, q_job, q_tok, q_dir);
    fprintf(f, "exec %s --kill-on-bad-exit=0 --ntasks=%d", q_srun, a->world);
    if (a->cuda) fprintf(f, " --gpus-per-task=1");
    /* Each task: hp-worker under a wrapper that records the rank's own exit status; it traps
     * TERM so that it outlives the signal that stops the worker. */
    fprintf(f,
            " --output=%s --open-mode=append \\\n"
            "    /bin/sh -c 'trap : TERM INT; [ \"$SLURM_PROCID\" != 0 ] || "
            "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID\" >\"$HP_EXIT_DIR/step\"; \"$@\"; rc=$?; "
            "echo $rc >\"$HP_EXIT_DIR/rank-$SLURM_PROCID.tmp\" && "
            "mv \"$HP_EXIT_DIR/rank-$SLURM_PROCID.tmp\" \"$HP_EXIT_DIR/rank-$SLURM_PROCID.exit\"; "
            "exit $rc' hp-rank \\\n"
            "    %s --coordinator %s --job %s\n",
            q_out, q_worker, q_coord, q_job);
    bool ok = fflush(f) == 0 && !ferror(f);
    int e = errno;
    if (fclose(f) != 0) ok = false;
    if (!ok) return hp_errf(err, HP_IO, "write %s: %s", path, strerror(e));
    if (chmod(path, 0700) != 0) return hp_errf(err, HP_IO, "chmod %s: %s", path, strerror(errno));
    return HP_OK;
}

static sjob *sjob_new(slurm *s, const char *job_id, int attempt, int world, const char *dir) {
    sjob *j = hp_calloc(1, sizeof *j);
    if (!j) return NULL;
    j->reported = hp_calloc((size_t)world, sizeof *j->reported);
    if (!j->reported) {
        hp_free(j);
        return NULL;
    }
    snprintf(j->job_id, sizeof j->job_id, "%s", job_id);
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    j->attempt = attempt;
    j->world = world;
    j->serial = ++s->serial;
    j->owner = s;
    j->next = s->jobs;
    s->jobs = j;
    return j;
}

static hp_status slurm_start(hpd_launcher *base, const hpd_attempt_spec *a, hp_err *err) {
    slurm *s = (slurm *)base;
    if (find(s, a->job_id, a->attempt))
        return hp_errf(err, HP_INVALID, "job %s attempt %d is already launched", a->job_id,
                       a->attempt);
    char script[PATH_MAX + 16];
    HP_TRY(write_script(s, a, script, sizeof script, err));
    sjob *j = sjob_new(s, a->job_id, a->attempt, a->world, a->attempt_dir);
    if (!j) return hp_errf(err, HP_NOMEM, "out of memory");
    if (s->in_alloc) {
        char log[PATH_MAX + 16];
        snprintf(log, sizeof log, "%s/srun.log", a->attempt_dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
            sjob_free(s, j);
            return hp_errf(err, HP_IO, "open %s: %s", log, strerror(errno));
        }
        char *argv[] = {"/bin/sh", script, NULL};
        uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE},
                                         {.flags = UV_INHERIT_FD, .data.fd = fd},
                                         {.flags = UV_INHERIT_FD, .data.fd = fd}};
        uv_process_options_t o = {.file = argv[0],
                                  .args = argv,
                                  .exit_cb = on_srun_exit,
                                  .flags = UV_PROCESS_DETACHED,
                                  .stdio = stdio,
                                  .stdio_count = 3};
        j->srun.data = j;
        int rc = uv_spawn(s->loop, &j->srun, &o);
        close(fd);
        if (rc < 0) {
            j->srun_running = true; /* until the close callback */
            uv_close((uv_handle_t *)&j->srun, on_srun_closed);
            j->over = true;
            for (int r = 0; r < j->world; r++) j->reported[r] = true;
            return hp_errf(err, HP_IO, "spawn %s: %s", script, uv_strerror(rc));
        }
        j->srun_running = true;
        char st[64];
        snprintf(st, sizeof st, "RUNNING (srun in allocation %.20s)", s->alloc);
        snprintf(j->state, sizeof j->state, "RUNNING");
        emit(s, j, HPD_LEV_STATE, -1, 0, st);
        return HP_OK;
    }
    char *argv[28];
    int n = 0;
    char ntasks[32], nodes[32], name[128], output[PATH_MAX + 32], per_node[48];
    char part[160], acct[160], qos[160], tl[64], chdir_arg[PATH_MAX + 16];
    snprintf(chdir_arg, sizeof chdir_arg, "--chdir=%s", a->attempt_dir);
    snprintf(ntasks, sizeof ntasks, "--ntasks=%d", a->world);
    int gpn = a->gpus_per_node > 0 ? a->gpus_per_node : 1;
    /* CPU ranks talk over shared memory: one node. GPU ranks: gpus_per_node per node. */
    snprintf(nodes, sizeof nodes, "--nodes=%d", a->cuda ? (a->world + gpn - 1) / gpn : 1);
    snprintf(name, sizeof name, "--job-name=hp-%s-%d", a->job_id, a->attempt);
    snprintf(output, sizeof output, "--output=%s/sbatch.log", a->attempt_dir);
    argv[n++] = s->sbatch;
    argv[n++] = "--parsable";
    argv[n++] = name;
    argv[n++] = ntasks;
    argv[n++] = nodes;
    argv[n++] = "--no-requeue"; /* hpd restarts the attempt itself, from its checkpoint */
    argv[n++] = output;
    argv[n++] = "--open-mode=append";
    argv[n++] = chdir_arg; /* not hpd's cwd, which the nodes may not have */
    if (a->cuda) {
        argv[n++] = "--gpus-per-task=1";
        snprintf(per_node, sizeof per_node, "--ntasks-per-node=%d", gpn);
        argv[n++] = per_node;
    }
    if (s->partition[0])
        snprintf(part, sizeof part, "--partition=%s", s->partition), argv[n++] = part;
    if (s->account[0]) snprintf(acct, sizeof acct, "--account=%s", s->account), argv[n++] = acct;
    if (s->qos[0]) snprintf(qos, sizeof qos, "--qos=%s", s->qos), argv[n++] = qos;
    if (s->time_limit[0]) snprintf(tl, sizeof tl, "--time=%s", s->time_limit), argv[n++] = tl;
    argv[n++] = script;
    argv[n] = NULL;
    cmd_ctx *c = ctx_new(s, j);
    if (!c) {
        sjob_free(s, j);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    hp_status st = hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 64 * 1024, on_sbatch, c, err);
    if (st != HP_OK) {
        hp_free(c);
        sjob_free(s, j);
        return st;
    }
    j->submitting = true;
    return HP_OK;
}

/* ---- the poll ------------------------------------------------------------------------------ */
/* One child per poll: squeue for the tracked Slurm jobs (by name), then the exit files of every
 * tracked attempt, as "exit INDEX R.exit STATUS" lines. */
static const char POLL_SH[] =
    "sq=$1; names=$2; shift 2\n"
    "if [ -n \"$names\" ]; then \"$sq\" -h -t all --name=\"$names\" -o '%i|%T|%r'; "
    "echo \"squeue_rc=$?\"; fi\n"
    "i=0\n"
    "for d in \"$@\"; do\n"
    "  for f in \"$d\"/rank-*.exit; do\n"
    "    [ -f \"$f\" ] && printf 'exit %s %s %s\\n' \"$i\" \"${f##*/rank-}\" \"$(cat \"$f\")\"\n"
    "  done\n"
    "  i=$((i+1))\n"
    "done\n";

static bool lost_state(const char *st) {
    static const char *const lost[] = {"NODE_FAIL",   "PREEMPTED",     "BOOT_FAIL", "TIMEOUT",
                                       "DEADLINE",    "OUT_OF_MEMORY", "REQUEUED",  "REQUEUE_HOLD",
                                       "REQUEUE_FED", "SUSPENDED"};
    for (size_t i = 0; i < HP_ARRAY_LEN(lost); i++)
        if (!strcmp(st, lost[i])) return true;
    return false;
}

static bool final_state(const char *st) {
    static const char *const fin[] = {"COMPLETED",     "CANCELLED",    "FAILED",    "TIMEOUT",
                                      "NODE_FAIL",     "PREEMPTED",    "BOOT_FAIL", "DEADLINE",
                                      "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"};
    for (size_t i = 0; i < HP_ARRAY_LEN(fin); i++)
        if (!strcmp(st, fin[i])) return true;
    return false;
}

typedef struct poll_ctx {
    slurm *s;
    uint64_t seq; /* this poll's number */
    int n;
    uint64_t *serials; /* the polled attempts, by index */
} poll_ctx;

/* The attempt polled as index i, if it is still tracked (events may have finished it, or a
 * restart started a new one, meanwhile). */
static sjob *polled(poll_ctx *p, int i) {
    for (sjob *x = p->s->jobs; x; x = x->next)
        if (x->serial == p->serials[i]) return x;
    return NULL;
}

static void on_state(slurm *s, sjob *j, const char *st, const char *reason) {
    if (strcmp(st, j->state) != 0) {
        snprintf(j->state, sizeof j->state, "%.31s", st);
        char text[128];
        if (reason[0] && strcmp(reason, "None") != 0)
            snprintf(text, sizeof text, "%.31s (%.80s)", st, reason);
        else
            snprintf(text, sizeof text, "%.31s", st);
        emit(s, j, HPD_LEV_STATE, -1, 0, text);
    }
    bool requeued = j->ran && !strcmp(st, "PENDING");
    if (!strcmp(st, "RUNNING")) j->ran = true;
    if (!j->lost && (lost_state(st) || requeued)) {
        j->lost = true;
        char why[200];
        snprintf(why, sizeof why, "slurm job %s: %s%s%.80s", j->ref, requeued ? "requeued, " : "",
                 st, reason[0] && strcmp(reason, "None") ? " " : "");
        if (reason[0] && strcmp(reason, "None"))
            snprintf(why + strlen(why), sizeof why - strlen(why), "(%.80s)", reason);
        emit(s, j, HPD_LEV_LOST, -1, 0, why);
        if (!final_state(st)) scancel(s, j, SIGKILL); /* requeued or suspended: end it */
    }
}

/* ---- sacct: how a job that left squeue ended ------------------------------------------------ */
static int unreported(const sjob *j) {
    int n = 0;
    for (int r = 0; r < j->world; r++) n += !j->reported[r];
    return n;
}

/* "CODE:SIGNAL", both decimal in [0, 255]. */
static bool parse_exit(const char *t, size_t n, int *code, int *sig) {
    char buf[32];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, t, n);
    buf[n] = 0;
    char *colon = strchr(buf, ':');
    if (!colon || colon == buf || !colon[1]) return false;
    *colon = 0;
    if (strspn(buf, "0123456789") != strlen(buf) ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || strlen(buf) > 3 ||
        strlen(colon + 1) > 3)
        return false;
    *code = atoi(buf);
    *sig = atoi(colon + 1);
    return *code <= 255 && *sig <= 255;
}

/* State's first word ("CANCELLED by 0"), which must be [A-Z_]+. */
static bool parse_state(const char *t, size_t n, char *out, size_t len) {
    size_t w = 0;
    while (w < n && t[w] != ' ') w++;
    if (w == 0 || w >= len) return false;
    for (size_t i = 0; i < w; i++)
        if (!(isupper((unsigned char)t[i]) || t[i] == '_')) return false;
    memcpy(out, t, w);
    out[w] = 0;
    return true;
}

hp_status hpd__slurm_parse_sacct(const char *text, size_t len, const char *ref, hpd__sacct_job *out,
                                 hp_err *err) {
    memset(out, 0, sizeof *out);
    size_t rl = ref ? strlen(ref) : 0;
    if (rl == 0 || strspn(ref, "0123456789") != rl)
        return hp_errf(err, HP_INVALID, "'%.40s' is not a Slurm job id", ref ? ref : "(null)");
    bool found = false;
    for (size_t i = 0; i < len;) {
        const char *l = text + i;
        size_t n = 0;
        while (i + n < len && l[n] != '\n') n++;
        i += n + 1;
        if (n && l[n - 1] == '\r') n--;
        if (n == 0) continue;
        const char *b1 = memchr(l, '|', n);
        const char *b2 = b1 ? memchr(b1 + 1, '|', (size_t)(l + n - b1 - 1)) : NULL;
        char st[32];
        int code = 0, sig = 0;
        if (!b2 || memchr(b2 + 1, '|', (size_t)(l + n - b2 - 1)) || b1 == l ||
            !parse_state(b1 + 1, (size_t)(b2 - b1 - 1), st, sizeof st) ||
            !parse_exit(b2 + 1, (size_t)(l + n - b2 - 1), &code, &sig)) {
            char q[84];
            size_t k = 0;
            for (size_t c = 0; c < n && k < 80; c++)
                q[k++] = (l[c] == '"' || l[c] == '\'' || (unsigned char)l[c] < 0x20 ||
                          (unsigned char)l[c] >= 0x7f)
                             ? '?'
                             : l[c];
            q[k] = 0;
            return hp_errf(err, HP_INVALID, "sacct printed '%s%s', not JobID|State|CODE:SIGNAL", q,
                           n > 80 ? "..." : "");
        }
        size_t idn = (size_t)(b1 - l);
        if (idn < rl || memcmp(l, ref, rl) != 0) continue; /* another job's line */
        if (idn == rl) {
            found = true;
            snprintf(out->state, sizeof out->state, "%s", st);
            out->exit_code = code;
            out->exit_signal = sig;
        } else if (l[rl] == '.' && idn > rl + 1 &&
                   strspn(l + rl + 1, "0123456789") == idn - rl - 1) {
            out->steps++; /* ID.N: a step srun started (ID.batch, ID.extern are not) */
            snprintf(out->step_state, sizeof out->step_state, "%s", st);
            out->step_exit_code = code;
            out->step_exit_signal = sig;
            out->steps_bad += strcmp(st, "COMPLETED") != 0 || code || sig;
        }
    }
    if (!found) return hp_errf(err, HP_NOT_FOUND, "sacct has no record of job %s", ref);
    return HP_OK;
}

/* sacct could not say how the job ended: what hpd knows stands (the exits it recorded, the
 * ranks' own Done reports to the core); the rest of the attempt is lost, which the core counts
 * as a restart while max_restarts allows. */
static void sacct_unavailable(slurm *s, sjob *j, const char *why) {
    hp__log("warn",
            "event=slurm_sacct_unavailable job=%s attempt=%d ref=%s why=\"%s\" unreported=%d "
            "fallback=\"the exits and Done reports hpd has; the other ranks lost\"",
            j->job_id, j->attempt, j->ref, why, unreported(j));
    if (!j->lost) {
        j->lost = true;
        char text[360];
        snprintf(text, sizeof text,
                 "slurm job %s left squeue before hpd saw its end; sacct cannot say how (%.200s)",
                 j->ref, why);
        emit(s, j, HPD_LEV_LOST, -1, 0, text);
    }
    j->over = true;
    finish(s, j);
}

#define SACCT_TRIES 5 /* sacct saying "still running" while squeue has no such job */

static void on_sacct(void *ctx, const hpd_cmd_result *r) {
    cmd_ctx *c = ctx;
    slurm *s = c->s;
    sjob *j = find(s, c->job_id, c->attempt);
    hp_free(c);
    if (!j) return;
    j->sacct_running = false;
    char why[400];
    hpd__sacct_job a;
    hp_err e = {0};
    if (r->error || r->status != 0) {
        char line[320];
        first_line(r, line, sizeof line);
        snprintf(why, sizeof why, "sacct %s (status %d): %s", r->error ? r->error : "failed",
                 r->status, line[0] ? line : "(no output)");
        sacct_unavailable(s, j, why);
        return;
    }
    if (hpd__slurm_parse_sacct(r->out, r->out_len, j->ref, &a, &e) != HP_OK) {
        sacct_unavailable(s, j, e.msg);
        return;
    }
    hp__log("info",
            "event=slurm_sacct job=%s attempt=%d ref=%s state=%s exit=%d:%d steps=%d "
            "step_state=%s step_exit=%d:%d",
            j->job_id, j->attempt, j->ref, a.state, a.exit_code, a.exit_signal, a.steps,
            a.steps ? a.step_state : "-", a.step_exit_code, a.step_exit_signal);
    if (!final_state(a.state)) {
        /* squeue missed it, Slurm still has it (PENDING, RUNNING, REQUEUED...): keep watching */
        if (++j->sacct_tries >= SACCT_TRIES) {
            snprintf(why, sizeof why, "sacct still says %s after %d tries, squeue lists nothing",
                     a.state, j->sacct_tries);
            sacct_unavailable(s, j, why);
            return;
        }
        j->misses = 0;
        on_state(s, j, a.state, "");
        return;
    }
    on_state(s, j, a.state, ""); /* NODE_FAIL, PREEMPTED, TIMEOUT, OUT_OF_MEMORY: lost */
    /* A step's code is the highest of its tasks': 0 says every rank exited 0. Anything else
     * names no rank, so the ranks without an exit file end unknown. */
    if (!strcmp(a.state, "COMPLETED") && !a.exit_code && !a.exit_signal && a.steps > 0 &&
        !a.steps_bad) {
        for (int rk = 0; rk < j->world; rk++)
            if (!j->reported[rk]) {
                j->reported[rk] = true;
                emit(s, j, HPD_LEV_EXIT, rk, 0, NULL);
            }
    }
    j->over = true;
    finish(s, j);
}

static void sacct(slurm *s, sjob *j) {
    char *argv[] = {s->sacct, "-j",         j->ref, "--format=JobID,State,ExitCode",
                    "-P",     "--noheader", NULL};
    cmd_ctx *c = ctx_new(s, j);
    hp_err e = {0};
    if (!c) {
        sacct_unavailable(s, j, "out of memory");
        return;
    }
    if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 64 * 1024, on_sacct, c, &e) != HP_OK) {
        hp_free(c);
        sacct_unavailable(s, j, e.msg);
        return;
    }
    j->sacct_running = true;
    hp__log("info", "event=slurm_sacct_query job=%s attempt=%d ref=%s note=\"gone from squeue\"",
            j->job_id, j->attempt, j->ref);
}

static void on_poll(void *ctx, const hpd_cmd_result *r) {
    poll_ctx *p = ctx;
    slurm *s = p->s;
    s->polling = false;
    if (r->error || r->truncated) {
        hp__log("warn", "event=slurm_poll_failed error=\"%s\"",
                r->error ? r->error : "output over 1 MiB");
        goto out;
    }
    bool sq_ok = false, *listed = hp_calloc((size_t)p->n + 1, sizeof *listed);
    if (!listed) goto out;
    for (const char *l = r->out; *l;) {
        size_t n = strcspn(l, "\n");
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(n < 511 ? n : 511), l);
        l += n + (l[n] == '\n');
        int idx, rank, status;
        char id[REF_MAX], st[64], reason[256];
        if (!strncmp(line, "squeue_rc=", 10)) {
            sq_ok = atoi(line + 10) == 0;
            if (!sq_ok) hp__log("warn", "event=squeue_failed status=%s", line + 10);
        } else if (sscanf(line, "exit %d %d.exit %d", &idx, &rank, &status) == 3) {
            sjob *j = idx >= 0 && idx < p->n ? polled(p, idx) : NULL;
            if (!j || rank < 0 || rank >= j->world || j->reported[rank]) continue;
            j->reported[rank] = true;
            emit(s, j, HPD_LEV_EXIT, rank, status, NULL);
        } else if (sscanf(line, "%31[0-9]|%63[^|]|%255[^\n]", id, st, reason) >= 2) {
            for (int i = 0; i < p->n; i++) {
                sjob *j = polled(p, i);
                if (!j || strcmp(j->ref, id) != 0) continue;
                listed[i] = true;
                j->misses = 0;
                if (sscanf(line, "%*[0-9]|%*[^|]|%255[^\n]", reason) != 1) reason[0] = 0;
                on_state(s, j, st, reason);
                if (final_state(st)) j->over = true;
            }
        } else if (line[0]) {
            hp__log("warn", "event=slurm_poll_unexpected line=\"%.200s\"", line);
        }
    }
    for (int i = 0; i < p->n; i++) {
        sjob *j = polled(p, i);
        if (!j) continue;
        /* Gone from squeue (purged after MinJobAge, or never seen by a new hpd) with ranks not
         * yet reported: ask sacct how it ended; nothing left to learn: over. */
        if (j->ref[0] && sq_ok && !listed[i] && !j->over && !j->sacct_running && ++j->misses >= 2) {
            if (unreported(j) > 0) {
                sacct(s, j); /* may finish (and free) j when sacct cannot start */
                continue;
            }
            j->over = true;
        }
        if (j->over && p->seq > j->over_after && !j->submitting && !j->srun_running &&
            !j->sacct_running)
            finish(s, j);
    }
    hp_free(listed);
out:
    hp_free(p->serials);
    hp_free(p);
}

static void on_tick(uv_timer_t *t) {
    slurm *s = t->data;
    if (s->polling || !s->jobs) return;
    int n = 0;
    for (sjob *j = s->jobs; j; j = j->next) n++;
    poll_ctx *p = hp_calloc(1, sizeof *p);
    char **argv = hp_calloc((size_t)n + 8, sizeof *argv);
    char *names = hp_calloc((size_t)n, 100);
    if (p) p->serials = hp_calloc((size_t)n, sizeof *p->serials);
    if (!p || !argv || !names || !p->serials) goto fail;
    p->s = s;
    p->seq = ++s->poll_seq;
    int k = 0;
    argv[k++] = "/bin/sh";
    argv[k++] = "-c";
    argv[k++] = (char *)POLL_SH;
    argv[k++] = "hp-slurm-poll";
    argv[k++] = s->squeue;
    argv[k++] = names;
    size_t nl = 0;
    for (sjob *j = s->jobs; j; j = j->next) {
        p->serials[p->n++] = j->serial;
        argv[k++] = j->dir;
        if (j->ref[0])
            nl += (size_t)snprintf(names + nl, 100, "%shp-%.60s-%d", nl ? "," : "", j->job_id,
                                   j->attempt);
    }
    argv[k] = NULL;
    hp_err e = {0};
    if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, CMD_MAX_OUT, on_poll, p, &e) != HP_OK) {
        hp__log("warn", "event=slurm_poll_failed error=\"%s\"", e.msg);
        goto fail;
    }
    s->polling = true;
    hp_free(argv);
    hp_free(names);
    return;
fail:
    if (p) hp_free(p->serials);
    hp_free(p);
    hp_free(argv);
    hp_free(names);
}

/* In an allocation the step itself is signalled, its id ("ALLOC.STEP") from the file rank 0's
 * wrapper wrote. TERM: srun takes a SIGTERM of its own as "kill the step now" (it forwards
 * SIGKILL to every task), so the wrappers would die before recording the ranks' statuses;
 * `scancel --signal=TERM STEP` reaches the tasks as in the sbatch mode, where the wrappers trap
 * it. KILL: SIGKILL to srun leaves the step's tasks running (they hold the CPUs the next
 * attempt's step needs). Without a step file yet (no task started) srun itself gets the
 * signal. */
static const char STEP_SIGNAL_SH[] =
    "f=$3/step; if [ -s \"$f\" ]; then exec \"$1\" --signal=\"$2\" \"$(cat \"$f\")\"; fi; "
    "kill -s \"$2\" -- \"-$4\" 2>/dev/null; exit 0";

static void step_signal(slurm *s, sjob *j, int sig) {
    char pgid[24];
    snprintf(pgid, sizeof pgid, "%d", j->srun.pid);
    char *name = sig == SIGKILL ? "KILL" : "TERM";
    char *argv[] = {"/bin/sh",        "-c",       (char *)STEP_SIGNAL_SH,
                    "hp-step-signal", s->scancel, name,
                    j->dir,           pgid,       NULL};
    cmd_ctx *c = ctx_new(s, j);
    hp_err e = {0};
    if (!c) hp_errf(&e, HP_NOMEM, "out of memory");
    if (!c || hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 4096, on_scancel, c, &e) != HP_OK) {
        hp_free(c);
        hp__log("error", "event=scancel_failed job=%s attempt=%d error=\"%s\"", j->job_id,
                j->attempt, e.msg);
        return;
    }
    hp__log("info", "event=scancel job=%s attempt=%d step=in-allocation signal=%s", j->job_id,
            j->attempt, name);
}

/* ---- the vtable ---------------------------------------------------------------------------- */
static void slurm_stop(hpd_launcher *base, const char *job_id, int attempt, int signum) {
    slurm *s = (slurm *)base;
    sjob *j = find(s, job_id, attempt);
    if (!j) return;
    if (s->in_alloc) {
        if (!j->srun_running) return;
        if (signum == SIGKILL) uv_kill(-j->srun.pid, SIGKILL);
        step_signal(s, j, signum == SIGKILL ? SIGKILL : SIGTERM);
        return;
    }
    if (j->submitting) {
        j->pending_sig = signum;
        return;
    }
    scancel(s, j, signum);
}

static int slurm_alive(hpd_launcher *base, const char *job_id, int attempt) {
    slurm *s = (slurm *)base;
    sjob *j = find(s, job_id, attempt);
    if (!j) return 0;
    int n = 0;
    for (int r = 0; r < j->world; r++) n += !j->reported[r];
    return n;
}

static hp_status slurm_adopt(hpd_launcher *base, const char *job_id, int attempt, int world,
                             const char *attempt_dir, const char *ref, hp_err *err) {
    slurm *s = (slurm *)base;
    size_t n = strspn(ref, "0123456789");
    if (n == 0 || ref[n] || n >= REF_MAX)
        return hp_errf(err, HP_INVALID, "job %s: '%.40s' is not a Slurm job id", job_id, ref);
    if (world < 1 || world > 65536)
        return hp_errf(err, HP_INVALID, "job %s: world %d out of range", job_id, world);
    if (find(s, job_id, attempt)) return HP_OK;
    sjob *j = sjob_new(s, job_id, attempt, world, attempt_dir);
    if (!j) return hp_errf(err, HP_NOMEM, "out of memory");
    snprintf(j->ref, sizeof j->ref, "%s", ref);
    j->ran = true; /* it may have run: PENDING now means requeued */
    return HP_OK;
}

static void on_timer_closed(uv_handle_t *h) {
    hp_free(h->data);
}

static void slurm_free(hpd_launcher *base) {
    slurm *s = (slurm *)base;
    while (s->jobs) sjob_free(s, s->jobs);
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

static const hpd_launcher_vt slurm_vt = {
    .name = "slurm",
    .register_only = false,
    .start = slurm_start,
    .stop = slurm_stop,
    .alive = slurm_alive,
    .adopt = slurm_adopt,
    .free = slurm_free,
};

hp_status hpd_launcher_slurm_new(uv_loop_t *loop, const hpd_slurm_opts *o,
                                 hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                 hp_err *err) {
    *out = NULL;
    slurm *s = hp_calloc(1, sizeof *s);
    if (!s) return hp_errf(err, HP_NOMEM, "out of memory");
    s->base.vt = &slurm_vt;
    s->base.on_event = on_event;
    s->base.ctx = ctx;
    s->loop = loop;
    hpd_launcher_worker_path(o->worker_path, s->worker, sizeof s->worker);
    if (s->worker[0] != '/') {
        /* the tasks run on other nodes, in another cwd: the worker needs an absolute path or
         * to be on their PATH; say which one it will be */
        hp__log("info", "event=slurm_worker path=%s note=\"taken from the nodes' PATH\"",
                s->worker);
    }
    hpd_cmd_tool(s->sbatch, sizeof s->sbatch, o->bin_dir, "sbatch");
    hpd_cmd_tool(s->squeue, sizeof s->squeue, o->bin_dir, "squeue");
    hpd_cmd_tool(s->scancel, sizeof s->scancel, o->bin_dir, "scancel");
    hpd_cmd_tool(s->srun, sizeof s->srun, o->bin_dir, "srun");
    hpd_cmd_tool(s->sacct, sizeof s->sacct, o->bin_dir, "sacct");
    snprintf(s->partition, sizeof s->partition, "%s", o->partition ? o->partition : "");
    snprintf(s->account, sizeof s->account, "%s", o->account ? o->account : "");
    snprintf(s->qos, sizeof s->qos, "%s", o->qos ? o->qos : "");
    snprintf(s->time_limit, sizeof s->time_limit, "%s", o->time_limit ? o->time_limit : "");
    s->in_alloc = o->in_allocation;
    const char *alloc = getenv("SLURM_JOB_ID");
    snprintf(s->alloc, sizeof s->alloc, "%.20s", alloc ? alloc : "");
    s->poll_ms = o->poll_ms > 0 ? o->poll_ms : 1000;
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, on_tick, (uint64_t)s->poll_ms, (uint64_t)s->poll_ms);
    uv_unref((uv_handle_t *)&s->timer); /* a stopping hpd's loop may end with it running */
    *out = &s->base;
    return HP_OK;
}
