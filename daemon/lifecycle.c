/* daemon/lifecycle.c — a job's life after submit: the FIFO scheduler over the slots (and a cuda
 * job's GPUs, hp__core_fits), compile, launch (one rank per slot through the launcher), the worker
 * protocol's meaning (hello → Welcome, heartbeats, metrics, logs, done), failure detection (exit
 * status, lost connection, missed heartbeats) and restarts from the last checkpoint. Every state
 * change goes through hp__transition (committed before acted on). Loop thread only.
 */
#include "daemon/core.h"
#include "daemon/config.h"
#include "daemon/jobsm.h"
#include "daemon/observe.h"

#include "hp/frame.h"
#include "hp/program.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define STOP_GRACE_MS     10000 /* Stop/SIGTERM, then SIGKILL after this */
#define MISSED_HEARTBEATS 3

#define ST_QUEUED     HP__V1__JOB_STATE__JOB_STATE_QUEUED
#define ST_COMPILING  HP__V1__JOB_STATE__JOB_STATE_COMPILING
#define ST_LAUNCHING  HP__V1__JOB_STATE__JOB_STATE_LAUNCHING
#define ST_RUNNING    HP__V1__JOB_STATE__JOB_STATE_RUNNING
#define ST_RESTARTING HP__V1__JOB_STATE__JOB_STATE_RESTARTING
#define ST_SUCCEEDED  HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED

static bool active(const hpd_job *j) {
    return j->v.state == ST_LAUNCHING || j->v.state == ST_RUNNING;
}

static void log_err(const char *what, const hpd_job *j, const hp_err *e) {
    hp__log("error", "event=%s job=%s error=\"%s\"", what, j->v.id, e->msg);
}

/* A rank failed: the attempt is over; RESTARTING (the tick relaunches once the old ranks are
 * gone) or FAILED. */
static void fail_attempt(hpd *d, hpd_job *j, const char *reason) {
    if (d->stopping || j->stop_ms || !active(j)) return;
    hp_err e = {0};
    if (hp__transition(d, j, HPD_EV_RANK_FAILED, reason, reason, &e) != HP_OK) {
        log_err("transition_failed", j, &e);
        return;
    }
    hp__stop_attempt(d, j, reason, false);
}

static void fail_rank(hpd *d, hpd_job *j, int rank, const char *why) {
    char reason[HP_ERR_MSG_MAX];
    snprintf(reason, sizeof reason, "rank %d: %s", rank, why);
    fail_attempt(d, j, reason);
}

void hp__stop_attempt(hpd *d, hpd_job *j, const char *reason, bool checkpoint) {
    if (!j->ranks) return;
    if (!j->stop_ms) j->stop_ms = hp__now_ms();
    Hp__V1__Stop stop;
    hp__v1__stop__init(&stop);
    stop.reason = (char *)reason;
    stop.grace_s = STOP_GRACE_MS / 2000.0;
    stop.checkpoint = checkpoint;
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_STOP;
    f.stop = &stop;
    for (int r = 0; r < j->v.world_size; r++)
        if (j->ranks[r].conn) (void)hp__conn_send(j->ranks[r].conn, &f, NULL);
    /* With a checkpoint asked for, give the ranks the grace period before the signal. */
    if (!checkpoint) d->launcher->vt->stop(d->launcher, j->v.id, j->attempt, SIGTERM);
}

/* ---- checkpoint now ------------------------------------------------------------------------ */
/* The ranks agree on the step themselves: each one's training loop folds the number of requests
 * it has seen into the all-reduce it already does after every step to agree on stopping
 * (worker/train.c), so the first step after which any rank has the frame is the step they all
 * checkpoint, once per request. */
hp_status hpd_checkpoint(hpd *d, const char *id, hpd_job_view *out, hp_err *err) {
    char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
    hpd_job *j = hp__job_find(d, id);
    if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
    if (d->stopping) return hp_errf(err, HP_LIMIT, "the coordinator is shutting down");
    if (j->v.state != ST_RUNNING || !j->ranks || j->stop_ms)
        return hp_errf(err, HP_STATE, "job %s is %s: only a RUNNING job can checkpoint", j->v.id,
                       j->v.state == ST_RUNNING ? "stopping" : hpd_sm_state_str(j->v.state));
    Hp__V1__CheckpointNow c;
    hp__v1__checkpoint_now__init(&c);
    c.reason = "requested";
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_CHECKPOINT_NOW;
    f.checkpoint_now = &c;
    int sent = 0;
    for (int r = 0; r < j->v.world_size; r++)
        if (j->ranks[r].conn && hp__conn_send(j->ranks[r].conn, &f, NULL) == HP_OK) sent++;
    if (sent == 0) return hp_errf(err, HP_STATE, "job %s: no rank is connected", j->v.id);
    hp__log("info", "event=checkpoint_requested job=%s step=%lld ranks=%d", j->v.id,
            (long long)j->v.step, sent);
    *out = j->v;
    return HP_OK;
}

void hp__on_checkpoint_done(hpd *d, hpd_job *j, int rank, const Hp__V1__CheckpointDone *c) {
    (void)d;
    hpd_rank *rk = &j->ranks[rank];
    if (c->step > rk->ckpt_step) rk->ckpt_step = c->step;
    hp__log("info", "event=checkpoint job=%s step=%lld rank=%d path=\"%.512s\"", j->v.id,
            (long long)c->step, rank, c->path ? c->path : "");
    int64_t all = rk->ckpt_step; /* the newest step every rank has written */
    for (int r = 0; r < j->v.world_size; r++)
        if (j->ranks[r].ckpt_step < all) all = j->ranks[r].ckpt_step;
    if (all > j->ckpt_step) {
        j->ckpt_step = all;
        hp__log("info", "event=checkpoint_complete job=%s step=%lld ranks=%d", j->v.id,
                (long long)all, j->v.world_size);
    }
}

/* Frees what the attempt holds once its processes are gone (the program too when the job is
 * over). */
static void release_attempt(hpd *d, hpd_job *j) {
    if (j->ranks)
        for (int r = 0; r < j->v.world_size; r++)
            if (j->ranks[r].conn) hp__conn_close(j->ranks[r].conn, "attempt over");
    hp_free(j->ranks);
    j->ranks = NULL;
    hp_free(j->comm_setup); /* the next attempt's rank 0 listens anew */
    j->comm_setup = NULL;
    j->comm_setup_len = 0;
    if (hpd_sm_is_final(j->v.state)) { /* a restart reuses the program */
        hp_compiled_free(j->compiled);
        j->compiled = NULL;
    }
}

/* The Welcome's comm.backend: shm joins the ranks of one host, tcp any. auto picks tcp where
 * the launcher may put the ranks on several hosts: Slurm runs a cuda job of more ranks than
 * gpus_per_node on several nodes (CPU jobs on one); an external launcher's workers run
 * wherever the operator starts them. */
static const char *comm_backend(const hpd *d, const hpd_job *j) {
    if (d->comm_kind == HPD_COMM_SHM) return "shm";
    if (d->comm_kind == HPD_COMM_TCP) return "tcp";
    int gpn = j->gpus_per_node > 0 ? j->gpus_per_node : 1;
    if (d->launcher_kind == HPD_LAUNCHER_SLURM && j->cuda && j->v.world_size > gpn) return "tcp";
    if (d->launcher_kind == HPD_LAUNCHER_EXTERNAL && j->v.world_size > 1) return "tcp";
    return "shm";
}

/* Sends rank 0's CommSetup of the attempt (if it came) to c. */
static void send_comm_setup(hpd_job *j, hpd_conn *c) {
    if (!j->comm_setup) return;
    Hp__V1__CommSetup *cs = hp__v1__comm_setup__unpack(NULL, j->comm_setup_len, j->comm_setup);
    if (!cs) return;
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_COMM_SETUP;
    f.comm_setup = cs;
    (void)hp__conn_send(c, &f, NULL); /* a failed send drops the connection: the rank is lost */
    hp__v1__comm_setup__free_unpacked(cs, NULL);
}

static void hex_token(char out[65]) {
    uint8_t b[32];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* getrandom on Linux >= 3.17 does not fail for 32 bytes; a fallback anyway */
        uint64_t t = uv_hrtime();
        for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)((t >> (i % 8 * 8)) ^ (i * 131));
    }
    for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* STATE/jobs/ID/attempt-N/token, mode 0600: the launchers hand its path to the workers
 * ($HP_TOKEN_FILE) so that the token never shows in ps. */
static hp_status write_token(const char *dir, const char *token, char *path, size_t len,
                             hp_err *err) {
    snprintf(path, len, "%s/token", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return hp_errf(err, HP_IO, "open %s: %s", path, strerror(errno));
    size_t n = strlen(token);
    bool ok = fchmod(fd, 0600) == 0 && write(fd, token, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    int e = errno;
    close(fd);
    if (!ok) return hp_errf(err, HP_IO, "write %s: %s", path, strerror(e));
    return HP_OK;
}

static void launch(hpd *d, hpd_job *j) {
    hp_err e = {0};
    j->attempt = j->v.restarts;
    j->stop_ms = 0;
    j->launched_ms = hp__now_ms();
    j->heartbeat_ms = d->heartbeat_ms; /* a SIGHUP'd new interval applies from this attempt */
    memcpy(j->prev_token, j->token, sizeof j->token);
    hex_token(j->token);
    snprintf(j->v.launcher, sizeof j->v.launcher, "%s", d->launcher->vt->name);
    j->v.launch_ref[0] = j->v.launch_state[0] = 0;
    hp__obs_job_changed(j);
    hp_free(j->ranks);
    j->ranks = hp_calloc((size_t)j->v.world_size, sizeof *j->ranks);
    char dir[HPD_STORE_PATH_MAX - 24], job_dir[HPD_STORE_PATH_MAX - 24],
        att_dir[HPD_STORE_PATH_MAX];
    snprintf(job_dir, sizeof job_dir, "%.900s/jobs/%.40s", d->state_dir, j->v.id);
    snprintf(dir, sizeof dir, "%.900s/jobs/%.40s/run", d->state_dir, j->v.id);
    snprintf(att_dir, sizeof att_dir, "%s/attempt-%d", job_dir, j->attempt);
    hp_status st = j->ranks ? hp_mkdir_p(dir, &e) : hp_errf(&e, HP_NOMEM, "out of memory");
    if (st == HP_OK) st = hp_mkdir_p(att_dir, &e);
    char token_file[HPD_STORE_PATH_MAX + 16];
    if (st == HP_OK) st = write_token(att_dir, j->token, token_file, sizeof token_file, &e);
    snprintf(j->run_dir, sizeof j->run_dir, "%s", dir);
    if (st == HP_OK && !j->compiled) { /* recovery only: a restart reuses the program */
        hp_job *job = NULL;
        st = hp_job_unpack(j->packed, j->packed_len, &job, &e);
        if (st == HP_OK) st = hp_compile(job, j->v.world_size, &j->compiled, &e);
        hp_job_free(job);
    }
    if (st == HP_OK) {
        hpd_attempt_spec s = {.job_id = j->v.id,
                              .attempt = j->attempt,
                              .world = j->v.world_size,
                              .token = j->token,
                              .token_file = token_file,
                              .coordinator = d->worker_addr,
                              .job_dir = job_dir,
                              .attempt_dir = att_dir,
                              .cuda = j->cuda,
                              .gpus_per_node = j->gpus_per_node,
                              .gpu_ids = j->gpu_ids};
        st = d->launcher->vt->start(d->launcher, &s, &e);
        for (int r = 0; st == HP_OK && r < j->v.world_size; r++)
            j->ranks[r].proc = !d->launcher->vt->register_only;
    }
    hp_err e2 = {0};
    if (st != HP_OK) {
        log_err("launch_failed", j, &e);
        if (hp__transition(d, j, HPD_EV_LAUNCH_FAILED, e.msg, e.msg, &e2) != HP_OK)
            log_err("transition_failed", j, &e2);
        hp__stop_attempt(d, j, e.msg, false);
        return;
    }
    hp__log("info", "event=launched job=%s attempt=%d world=%d launcher=%s", j->v.id, j->attempt,
            j->v.world_size, d->launcher->vt->name);
    if (hp__transition(d, j, HPD_EV_LAUNCHED, "launched", NULL, &e2) != HP_OK)
        log_err("transition_failed", j, &e2);
}

/* Compiling runs on libuv's thread pool (a 405B graph at world 64 takes ~75 ms): the loop goes
 * on serving. The job's packed bytes are immutable and the job outlives the work (jobs are
 * freed only by hpd_free, after the loop ran dry), so the worker thread reads them freely. */
typedef struct compile_work {
    uv_work_t req;
    hpd *d;
    hpd_job *j;
    int world;
    hp_compiled *out;
    hp_status st;
    hp_err err;
} compile_work;

static void compile_run(uv_work_t *req) { /* a pool thread */
    compile_work *w = req->data;
    hp_job *job = NULL;
    w->st = hp_job_unpack(w->j->packed, w->j->packed_len, &job, &w->err);
    if (w->st == HP_OK) w->st = hp_compile(job, w->world, &w->out, &w->err);
    hp_job_free(job);
}

static void compile_done(uv_work_t *req, int status) { /* the loop */
    compile_work *w = req->data;
    hpd *d = w->d;
    hpd_job *j = w->j;
    hp_err e2 = {0};
    if (status == UV_ECANCELED || d->stopping || j->v.state != ST_COMPILING) {
        /* cancelled meanwhile, or shutting down (the job stays COMPILING in the store and
         * recovery takes it at the next start) */
        hp_compiled_free(w->out);
    } else if (w->st != HP_OK) {
        if (hp__transition(d, j, HPD_EV_COMPILE_FAILED, w->err.msg, w->err.msg, &e2) != HP_OK)
            log_err("transition_failed", j, &e2);
    } else {
        hp_compiled_free(j->compiled);
        j->compiled = w->out;
        if (hp__transition(d, j, HPD_EV_COMPILED, "compiled", NULL, &e2) != HP_OK)
            log_err("transition_failed", j, &e2);
        else
            launch(d, j);
    }
    hp_free(w);
    hp__core_tick(d);
}

static void start_job(hpd *d, hpd_job *j) {
    hp_err e = {0};
    if (hp__transition(d, j, HPD_EV_SCHEDULE, "scheduled", NULL, &e) != HP_OK) {
        log_err("transition_failed", j, &e);
        return;
    }
    int rc = UV_ENOMEM;
    compile_work *w = NULL;
    /* It fits (the tick's test): only memory can fail the hold. */
    if (hp__core_hold(d, j)) w = hp_calloc(1, sizeof *w);
    if (w) {
        *w = (compile_work){.d = d, .j = j, .world = j->v.world_size};
        w->req.data = w;
        rc = uv_queue_work(d->loop, &w->req, compile_run, compile_done);
    }
    if (rc != 0) {
        hp_free(w);
        hp_errf(&e, HP_NOMEM, "cannot queue the compile: %s", uv_strerror(rc));
        hp_err e2 = {0};
        if (hp__transition(d, j, HPD_EV_COMPILE_FAILED, e.msg, e.msg, &e2) != HP_OK)
            log_err("transition_failed", j, &e2);
        return;
    }
}

static int connected(const hpd_job *j) {
    int n = 0;
    if (j->ranks)
        for (int r = 0; r < j->v.world_size; r++) n += j->ranks[r].conn != NULL;
    return n;
}

void hp__core_tick(hpd *d) {
    if (d->stopping) return;
    uint64_t now = hp__now_ms();
    hp_err e = {0};
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (!j->ranks && j->v.state != ST_RESTARTING) continue;
        int alive = d->launcher->vt->alive(d->launcher, j->v.id, j->attempt);
        bool over_grace = j->stop_ms && now - j->stop_ms > STOP_GRACE_MS;
        if (j->stop_ms && alive && over_grace)
            d->launcher->vt->stop(d->launcher, j->v.id, j->attempt, SIGKILL);
        /* The attempt is gone when its processes are; with operator-started workers (no
         * processes of ours) when their connections closed or the grace ran out. */
        bool gone =
            alive == 0 && (!d->launcher->vt->register_only || connected(j) == 0 || over_grace);
        if (j->v.state == ST_RESTARTING) {
            if (gone) {
                release_attempt(d, j);
                if (hp__transition(d, j, HPD_EV_RESTART_READY, "restarting from checkpoint", NULL,
                                   &e) != HP_OK) {
                    log_err("transition_failed", j, &e);
                    continue;
                }
                launch(d, j);
            }
        } else if (hpd_sm_is_final(j->v.state)) {
            if (gone) release_attempt(d, j);
        } else if (j->v.state == ST_LAUNCHING && !j->stop_ms &&
                   strncmp(j->v.launch_state, "PENDING", 7) != 0 &&
                   now - j->launched_ms > (uint64_t)d->launch_timeout_ms) {
            /* (a job waiting in the scheduler's queue is not late: its clock starts when the
             * scheduler starts it) */
            for (int r = 0; r < j->v.world_size; r++)
                if (!j->ranks[r].hello) {
                    char why[200];
                    snprintf(why, sizeof why, "never said hello within launch-timeout-s %d%s%s",
                             d->launch_timeout_ms / 1000,
                             j->v.launch_state[0] ? "; the scheduler says " : "",
                             j->v.launch_state);
                    fail_rank(d, j, r, why);
                    break;
                }
        } else if (j->v.state == ST_RUNNING && !j->stop_ms) {
            for (int r = 0; r < j->v.world_size; r++) {
                hpd_rank *rk = &j->ranks[r];
                if (rk->hello && !rk->done &&
                    now - rk->last_seen_ms > (uint64_t)MISSED_HEARTBEATS * j->heartbeat_ms) {
                    fail_rank(d, j, r, "missed 3 heartbeats");
                    break;
                }
            }
        }
    }
    /* FIFO: the oldest queued job first; a job that does not fit holds the line. */
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (j->v.state != ST_QUEUED) continue;
        if (!hp__core_fits(d, j)) break;
        start_job(d, j);
    }
}

/* ---- the worker protocol ------------------------------------------------------------------ */
static bool token_eq(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < lb; i++)
        diff |= (unsigned char)a[i % (la ? la : 1)] ^ (unsigned char)b[i];
    return diff == 0 && la > 0;
}

/* The Welcome's resume_before: the first step after the store's last record for every rank
 * that this job logs (step 1, every log_interval-th, the last). The ranks resume from a
 * checkpoint below it, so a step whose metrics never reached the store (sent to a coordinator
 * killed before it committed them, or trained by ranks that lost their coordinator and
 * checkpointed on the way out) is trained again and recorded, never skipped. Computed once
 * per attempt: every rank must pick the same checkpoint. */
static hp_status resume_before(hpd *d, hpd_job *j, const hp_job *job, int64_t *out, hp_err *err) {
    if (j->resume_attempt == j->attempt + 1) {
        *out = j->resume_before;
        return HP_OK;
    }
    int64_t high = 0, total = j->v.total_steps, every = job->train.log_interval, next;
    HP_TRY(hpd_store_metrics_high(d->store, j->v.id, j->v.world_size, &high, err));
    if (high <= 0)
        next = 1;
    else if (total > 0 && high >= total)
        next = total + 1;
    else if (every > 0 && (total <= 0 || (high / every + 1) * every < total))
        next = (high / every + 1) * every;
    else
        next = total > 0 ? total : high + 1;
    j->resume_before = next;
    j->resume_attempt = j->attempt + 1;
    if (high > 0)
        hp__log("info", "event=resume_bound job=%s attempt=%d stored_step=%lld resume_before=%lld",
                j->v.id, j->attempt, (long long)high, (long long)next);
    *out = next;
    return HP_OK;
}

static hp_status send_welcome(hpd *d, hpd_conn *c, hpd_job *j, int rank, hp_err *err) {
    if (!j->compiled) return hp_errf(err, HP_INTERNAL, "job %s has no compiled program", j->v.id);
    uint8_t *pp = NULL;
    size_t pl = 0;
    HP_TRY(hp_program_pack(j->compiled->program, &pp, &pl, err));
    Hp__V1__Program *prog = hp__v1__program__unpack(NULL, pl, pp);
    hp_free(pp);
    if (!prog) return hp_errf(err, HP_NOMEM, "program of job %s: unpack failed", j->v.id);
    prog->rank = rank;
    /* each rank's message carries its own boxes (the reader checks them against its rank) */
    const hp_program *cp = j->compiled->program;
    hp_status bst = HP_OK;
    size_t n_slots = prog->n_params + prog->n_buffer_inputs;
    for (size_t i = 0; i < n_slots && i < (size_t)(cp->n_params + cp->n_bufs) && bst == HP_OK;
         i++) {
        Hp__V1__ParamShard *mp =
            i < prog->n_params ? prog->params[i] : prog->buffer_inputs[i - prog->n_params];
        int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
        bst = hp_program_box(cp, (int)i, rank, off, len, err);
        for (size_t d = 0; bst == HP_OK && d < mp->n_box_offset && d < mp->n_box_length; d++) {
            mp->box_offset[d] = off[d];
            mp->box_length[d] = len[d];
        }
    }
    if (bst != HP_OK) {
        hp__v1__program__free_unpacked(prog, NULL);
        return bst;
    }
    hp_job *job = NULL;
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Job *jm = NULL;
    hp_status st = hp_job_unpack(j->packed, j->packed_len, &job, err);
    if (st == HP_OK) st = hp_job_export(job, &arena, &jm, err);
    if (st == HP_OK) {
        jm->graph = NULL; /* the program carries the compiled graph */
        Hp__V1__CommSetup comm;
        hp__v1__comm_setup__init(&comm);
        comm.backend = (char *)comm_backend(d, j);
        char shm[96];
        snprintf(shm, sizeof shm, "hp-%s-a%d-%.8s", j->v.id, j->attempt, j->token);
        comm.shm_name = shm;
        Hp__V1__Welcome w;
        hp__v1__welcome__init(&w);
        w.protocol_version = HP_PROTOCOL_VERSION;
        w.world_size = j->v.world_size;
        w.program = prog;
        w.heartbeat_interval_ms = j->heartbeat_ms;
        /* The worker resumes from run_dir's newest complete checkpoint; resume_step (the
         * newest every rank reported, 0: none known) makes it fail rather than start over
         * when that checkpoint is missing. */
        w.resume_step = j->ckpt_step;
        st = resume_before(d, j, job, &w.resume_before, err);
        w.job = jm;
        w.run_dir = j->run_dir;
        w.comm = &comm;
        w.rank = rank;
        Hp__V1__Frame f;
        hp__v1__frame__init(&f);
        f.body_case = HP__V1__FRAME__BODY_WELCOME;
        f.welcome = &w;
        if (st == HP_OK) st = hp__conn_send(c, &f, err);
    }
    hp_job_free(job);
    hp_arena_fini(&arena);
    hp__v1__program__free_unpacked(prog, NULL);
    return st;
}

hp_status hp__core_hello(hpd *d, hpd_conn *c, const Hp__V1__Hello *h, hpd_job **out, int *attempt,
                         hp_err *err) {
    if (d->stopping) return hp_errf(err, HP_LIMIT, "coordinator shutting down");
    if (h->protocol_version != HP_PROTOCOL_VERSION)
        return hp_errf(err, HP_UNSUPPORTED, "protocol_version %u (want %d)", h->protocol_version,
                       HP_PROTOCOL_VERSION);
    char q[HP_QUOTE_MAX]; /* what the peer sent, escaped */
    hpd_job *j = hp__job_find(d, h->job_id);
    if (!j)
        return hp_errf(err, HP_NOT_FOUND, "unknown job %s", hp_quote(q, sizeof q, h->job_id, 64));
    if (!active(j) || !j->ranks || j->stop_ms)
        return hp_errf(err, HP_INVALID, "job %s is %s: not accepting workers", j->v.id,
                       hpd_sm_state_str(j->v.state));
    if (!token_eq(h->token ? h->token : "", j->token)) {
        if (j->prev_token[0] && token_eq(h->token ? h->token : "", j->prev_token))
            return hp_errf(err, HP_INVALID,
                           "stale token for job %s: it belongs to attempt %d, which is over "
                           "(attempt %d runs now)",
                           j->v.id, j->attempt - 1, j->attempt);
        return hp_errf(err, HP_INVALID, "bad token for job %s attempt %d", j->v.id, j->attempt);
    }
    if (h->rank < 0 || h->rank >= j->v.world_size)
        return hp_errf(err, HP_INVALID, "rank %d out of range [0, %d)", h->rank, j->v.world_size);
    hpd_rank *rk = &j->ranks[h->rank];
    if (rk->conn || rk->hello)
        return hp_errf(err, HP_INVALID, "rank %d of job %s already connected", h->rank, j->v.id);
    HP_TRY(send_welcome(d, c, j, h->rank, err));
    if (h->rank != 0) send_comm_setup(j, c); /* rank 0 sent it before this rank came */
    rk->conn = c;
    rk->hello = true;
    rk->last_seen_ms = hp__now_ms();
    *out = j;
    *attempt = j->attempt;
    hp__log("info", "event=worker_hello job=%s rank=%d pid=%d host=%s", j->v.id, h->rank, h->pid,
            hp_quote(q, sizeof q, h->hostname, 64));
    int n = 0;
    for (int r = 0; r < j->v.world_size; r++) n += j->ranks[r].hello;
    if (n == j->v.world_size && j->v.state == ST_LAUNCHING) {
        hp_err e = {0};
        if (hp__transition(d, j, HPD_EV_ALL_STARTED, "all ranks connected", NULL, &e) != HP_OK)
            log_err("transition_failed", j, &e);
    }
    return HP_OK;
}

static void on_metrics(hpd *d, hpd_job *j, int rank, Hp__V1__StepMetrics *m) {
    hp_err e = {0};
    if (m->rank != -1) m->rank = rank; /* a rank speaks for itself only */
    size_t n = hp__v1__step_metrics__get_packed_size(m);
    uint8_t stackbuf[512], *buf = n <= sizeof stackbuf ? stackbuf : hp_malloc(n);
    if (!buf) return;
    hp__v1__step_metrics__pack(m, buf);
    if (hpd_store_add_metrics(d->store, j->v.id, m->step, m->rank, buf, n, &e) != HP_OK)
        log_err("metrics_store_failed", j, &e);
    if (buf != stackbuf) hp_free(buf);
    if (m->rank <= 0) {
        j->v.has_metrics = true;
        j->v.loss = m->loss;
        j->v.tokens_per_s = m->tokens_per_s;
        j->v.mfu_pct = m->mfu_pct;
        j->v.step_time_s = m->step_time_s;
        if (m->step > j->v.step) {
            j->v.step = m->step;
            j->step_dirty = d->steps_dirty = true; /* hp__core_flush_steps */
        }
    }
    hp__obs_metrics(d, j, m);
    hp__emit_metrics(d, j, m);
}

void hp__core_flush_steps(hpd *d) {
    if (!d->steps_dirty) return;
    d->steps_dirty = false;
    for (hpd_job *j = d->jobs; j; j = j->next)
        if (j->step_dirty) {
            j->step_dirty = false;
            (void)hpd_store_set_step(d->store, j->v.id, j->v.step, NULL);
        }
}

/* A step a rank reports is in [0, total_steps] (when the job has a total) and, for a heartbeat
 * or metrics, not behind what it reported before in this attempt: anything else is a broken or
 * hostile rank, logged and ignored (it must never become the job's step). */
static bool step_ok(const hpd_job *j, int rank, const char *what, int64_t step, int64_t prev) {
    if (step >= 0 && (j->v.total_steps <= 0 || step <= j->v.total_steps) && step >= prev)
        return true;
    hp__log("warn", "event=frame_refused job=%s rank=%d what=\"%s step %lld outside [%lld, %lld]\"",
            j->v.id, rank, what, (long long)step, (long long)prev, (long long)j->v.total_steps);
    return false;
}

void hp__core_frame(hpd *d, hpd_job *j, int attempt, int rank, const Hp__V1__Frame *f) {
    if (attempt != j->attempt || !j->ranks || rank < 0 || rank >= j->v.world_size) return;
    hpd_rank *rk = &j->ranks[rank];
    rk->last_seen_ms = hp__now_ms();
    if (j->stop_ms && f->body_case != HP__V1__FRAME__BODY_LOG &&
        f->body_case != HP__V1__FRAME__BODY_METRICS &&
        f->body_case != HP__V1__FRAME__BODY_CHECKPOINT_DONE)
        return;
    switch (f->body_case) {
    case HP__V1__FRAME__BODY_HEARTBEAT:
        if (f->heartbeat && step_ok(j, rank, "heartbeat", f->heartbeat->step, rk->step))
            rk->step = f->heartbeat->step;
        break;
    case HP__V1__FRAME__BODY_METRICS:
        if (f->metrics && step_ok(j, rank, "metrics", f->metrics->step, 0))
            on_metrics(d, j, rank, f->metrics);
        break;
    case HP__V1__FRAME__BODY_LOG:
        if (f->log) {
            f->log->rank = rank;
            hp__emit_log(d, j, f->log);
        }
        break;
    case HP__V1__FRAME__BODY_TRACE:
        if (f->trace) hp__trace_store(d, j, rank, f->trace);
        break;
    case HP__V1__FRAME__BODY_COMM_SETUP:
        /* Relay (rank 0's tcp address, the NCCL id) to every other rank; rank 0's is kept
         * for the ranks whose Hello comes later. */
        if (rank == 0 && f->comm_setup) {
            size_t len = hp__v1__comm_setup__get_packed_size(f->comm_setup);
            uint8_t *b = hp_malloc(len ? len : 1);
            if (b) {
                hp__v1__comm_setup__pack(f->comm_setup, b);
                hp_free(j->comm_setup);
                j->comm_setup = b;
                j->comm_setup_len = len;
            }
        }
        for (int r = 0; r < j->v.world_size; r++)
            if (r != rank && j->ranks[r].conn) (void)hp__conn_send(j->ranks[r].conn, f, NULL);
        break;
    case HP__V1__FRAME__BODY_DONE:
        if (!f->done) break;
        if (f->done->ok && !step_ok(j, rank, "done", f->done->final_step, rk->step)) {
            fail_rank(d, j, rank, "reported a final step outside the job's steps");
            break;
        }
        if (!f->done->ok) {
            fail_rank(d, j, rank, f->done->error && *f->done->error ? f->done->error : "failed");
            break;
        }
        if (j->v.total_steps > 0 && f->done->final_step < j->v.total_steps) {
            /* Stopped early without being told to (SIGTERM from a scheduler ending its job:
             * a node failure, a preemption): the job is not done, the attempt is over. */
            char why[400];
            snprintf(why, sizeof why, "stopped at step %lld of %lld (%.300s)",
                     (long long)f->done->final_step, (long long)j->v.total_steps,
                     f->done->error && *f->done->error ? f->done->error : "no reason given");
            fail_rank(d, j, rank, why);
            break;
        }
        rk->done = true;
        if (f->done->final_step > rk->step) rk->step = f->done->final_step;
        {
            int n = 0;
            for (int r = 0; r < j->v.world_size; r++) n += j->ranks[r].done;
            if (n == j->v.world_size && j->v.state == ST_RUNNING) {
                hp_err e = {0};
                if (rk->step > j->v.step) j->v.step = rk->step;
                if (hp__transition(d, j, HPD_EV_ALL_DONE, "all ranks done", NULL, &e) != HP_OK)
                    log_err("transition_failed", j, &e);
                j->stop_ms = hp__now_ms(); /* the ranks exit on their own; SIGKILL if not */
            }
        }
        break;
    case HP__V1__FRAME__BODY_CHECKPOINT_DONE:
        if (f->checkpoint_done) hp__on_checkpoint_done(d, j, rank, f->checkpoint_done);
        break;
    default:
        hp__log("warn", "event=unexpected_frame job=%s rank=%d kind=%d", j->v.id, rank,
                (int)f->body_case);
        break;
    }
}

void hp__core_conn_lost(hpd *d, hpd_job *j, int attempt, int rank) {
    if (attempt != j->attempt || !j->ranks || rank < 0 || rank >= j->v.world_size) return;
    j->ranks[rank].conn = NULL;
    if (!j->ranks[rank].done) fail_rank(d, j, rank, "connection lost");
    hp__core_tick(d);
}

static void on_rank_exit(hpd *d, const hpd_launch_event *ev) {
    hp_err e = {0};
    const char *job_id = ev->job_id;
    int attempt = ev->attempt, rank = ev->rank, status = ev->status;
    if (hpd_store_add_exit(d->store, job_id, attempt, rank, status, &e) != HP_OK)
        hp__log("error", "event=exit_store_failed job=%s error=\"%s\"", job_id, e.msg);
    hp__log(status ? "warn" : "info", "event=worker_exit job=%s attempt=%d rank=%d status=%d%s",
            job_id, attempt, rank, status,
            status == HPD_EXIT_UNKNOWN ? " note=\"ended without recording its exit status\"" : "");
    hpd_job *j = hp__job_find(d, job_id);
    if (!j || attempt != j->attempt || !j->ranks || rank < 0 || rank >= j->v.world_size) return;
    j->ranks[rank].proc = false;
    if (!(j->ranks[rank].done && status == 0)) {
        char why[96];
        if (status == HPD_EXIT_UNKNOWN)
            snprintf(why, sizeof why, "ended; its exit status is unknown");
        else
            snprintf(why, sizeof why, "exited with status %d", status);
        fail_rank(d, j, rank, why);
    }
}

void hp__on_launch_event(void *ctx, const hpd_launch_event *ev) {
    hpd *d = ctx;
    hpd_job *j = hp__job_find(d, ev->job_id);
    bool current = j && ev->attempt == j->attempt;
    switch (ev->kind) {
    case HPD_LEV_EXIT:
        on_rank_exit(d, ev);
        break;
    case HPD_LEV_REF: {
        hp_err e = {0};
        if (hpd_store_set_launch(d->store, ev->job_id, ev->attempt, d->launcher->vt->name, ev->text,
                                 &e) != HP_OK)
            hp__log("error", "event=launch_store_failed job=%s error=\"%s\"", ev->job_id, e.msg);
        hp__log("info", "event=launch_ref job=%s attempt=%d launcher=%s ref=%s", ev->job_id,
                ev->attempt, d->launcher->vt->name, ev->text);
        if (current) {
            snprintf(j->v.launch_ref, sizeof j->v.launch_ref, "%s", ev->text);
            hp__obs_job_changed(j);
        }
        break;
    }
    case HPD_LEV_STATE:
        hp__log("info", "event=launch_state job=%s attempt=%d state=%s", ev->job_id, ev->attempt,
                ev->text);
        if (current) {
            if (!strncmp(j->v.launch_state, "PENDING", 7) && strncmp(ev->text, "PENDING", 7))
                j->launched_ms = hp__now_ms(); /* out of the queue: the launch clock starts */
            snprintf(j->v.launch_state, sizeof j->v.launch_state, "%s", ev->text);
            hp__obs_job_changed(j);
        }
        break;
    case HPD_LEV_LOST:
        hp__log("warn", "event=attempt_lost job=%s attempt=%d why=\"%s\"", ev->job_id, ev->attempt,
                ev->text);
        if (current && j->ranks) {
            /* A node failure, a preemption, a requeue: the attempt's ranks are gone; restart
             * from the last checkpoint (counts as a restart). */
            fail_attempt(d, j, ev->text);
        }
        break;
    }
    hp__core_tick(d);
}

hp_status hp__worker_cmd(hpd *d, hpd_job *j, int rank, char *buf, size_t len, hp_err *err) {
    if (!active(j) || !j->ranks || j->stop_ms)
        return hp_errf(err, HP_INVALID, "job %s is %s: no attempt is accepting workers", j->v.id,
                       hpd_sm_state_str(j->v.state));
    if (rank < 0 || rank >= j->v.world_size)
        return hp_errf(err, HP_INVALID, "rank %d out of range [0, %d)", rank, j->v.world_size);
    /* The token in the environment, not on hp-worker's command line (ps shows that). */
    snprintf(buf, len, "HP_TOKEN=%s hp-worker --coordinator %s --job %s --rank %d", j->token,
             d->worker_addr, j->v.id, rank);
    return HP_OK;
}

hp_status hpd_worker_commands(hpd *d, const char *id, char ***cmds, int *n, hp_err *err) {
    *cmds = NULL;
    *n = 0;
    char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
    hpd_job *j = hp__job_find(d, id);
    if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
    char one[1024];
    HP_TRY(hp__worker_cmd(d, j, 0, one, sizeof one, err));
    char **v = hp_calloc((size_t)j->v.world_size, sizeof *v);
    if (!v) return hp_errf(err, HP_NOMEM, "out of memory");
    for (int r = 0; r < j->v.world_size; r++) {
        hp_status st = hp__worker_cmd(d, j, r, one, sizeof one, err);
        if (st == HP_OK && !(v[r] = hp_strdup(one))) st = hp_errf(err, HP_NOMEM, "out of memory");
        if (st != HP_OK) {
            for (int k = 0; k < r; k++) hp_free(v[k]);
            hp_free(v);
            return st;
        }
    }
    *cmds = v;
    *n = j->v.world_size;
    return HP_OK;
}
