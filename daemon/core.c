/* daemon/core.c — the coordinator's state and its public API (hpd.h): jobs in memory mirrored
 * from the store, submit/get/list/cancel/plan, watch subscriptions (replay from the store, then
 * live fan-out), transitions (committed to the store, then acted on), recovery at start and
 * shutdown. The job lifecycle — scheduling, launching, worker frames, restarts — is in
 * lifecycle.c. Everything runs on the loop thread.
 */
#include "daemon/core.h"
#include "daemon/config.h"
#include "daemon/jobsm.h"
#include "daemon/observe.h"
#include "daemon/pbcheck.h"

#include "hp/device.h"
#include "hp/program.h"

#include "hp/v1/program.pb-c.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

/* ---- logging ------------------------------------------------------------------------------ */
static int log_level = 1; /* 0 debug, 1 info, 2 warn, 3 error */

static int level_of(const char *s) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

void hp__log_set_level(const char *level) {
    int l = level_of(level);
    if (l >= 0) log_level = l;
}

void hp__log(const char *level, const char *fmt, ...) {
    int l = level_of(level);
    if (l < log_level) return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "time=%s.%03dZ level=%s %s\n", ts, (int)(tv.tv_usec / 1000), level, line);
}

uint64_t hp__now_ms(void) {
    return uv_hrtime() / 1000000u;
}

double hp__unix_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* ---- jobs --------------------------------------------------------------------------------- */
hpd_job *hp__job_find(hpd *d, const char *id) {
    if (!id) return NULL;
    for (hpd_job *j = d->jobs; j; j = j->next)
        if (strcmp(j->v.id, id) == 0) return j;
    return NULL;
}

static long id_seq(const char *id) {
    return strncmp(id, "j-", 2) == 0 ? atol(id + 2) : -1;
}

/* A new in-memory job from a row (not yet linked into d->jobs). */
static hpd_job *job_new(const hpd_store_row *r, hp_err *err) {
    hpd_job *j = hp_calloc(1, sizeof *j);
    if (!j) return hp_errf(err, HP_NOMEM, "out of memory"), NULL;
    j->packed = hp_malloc(r->job_len ? r->job_len : 1);
    if (!j->packed) {
        hp_free(j);
        return hp_errf(err, HP_NOMEM, "out of memory"), NULL;
    }
    memcpy(j->packed, r->job, r->job_len);
    j->packed_len = r->job_len;
    snprintf(j->v.id, sizeof j->v.id, "%s", r->id);
    /* Names and errors go out as proto `string`s: a tampered or old store's invalid UTF-8
     * would make strict clients refuse the whole ListJobs reply. */
    if (hp__utf8_sanitize(j->v.name, sizeof j->v.name, r->name))
        hp__log("warn", "event=store_row_fixed job=%s what=\"name: invalid UTF-8 replaced by '?'\"",
                r->id);
    j->v.state = (Hp__V1__JobState)r->state;
    j->v.created_unix_s = r->created;
    j->v.updated_unix_s = r->updated;
    j->v.world_size = r->world;
    j->v.step = r->step;
    j->v.total_steps = r->total_steps;
    j->v.restarts = r->restarts;
    hp__utf8_sanitize(j->v.error, sizeof j->v.error, r->error);
    snprintf(j->run_dir, sizeof j->run_dir, "%s", r->run_dir);
    snprintf(j->request_id, sizeof j->request_id, "%s", r->request_id);
    j->attempt = r->restarts;
    /* max_restarts lives in the job bytes: read it once (the bytes were validated at submit). */
    hp_job *job = NULL;
    if (hp_job_unpack(j->packed, j->packed_len, &job, NULL) == HP_OK) {
        j->max_restarts = job->resources.max_restarts;
        j->cuda = job->resources.device == HP_DEVICE_CUDA;
        j->gpus_per_node = job->resources.gpus_per_node;
        hp_job_free(job);
    }
    return j;
}

static void job_link(hpd *d, hpd_job *j) {
    if (d->jobs_tail)
        d->jobs_tail->next = j;
    else
        d->jobs = j;
    d->jobs_tail = j;
    d->n_jobs++;
}

static void job_free(hpd_job *j) {
    hp__obs_job_free(j);
    hp_free(j->packed);
    hp_free(j->comm_setup);
    hp_compiled_free(j->compiled);
    hp_free(j->ranks);
    hp_free(j->gpu_ids);
    hp_free(j);
}

/* ---- watches ------------------------------------------------------------------------------ */
struct hpd_watch {
    struct hpd_watch *next, *prev;
    hpd *d;
    hpd_job *j;
    bool logs, dead;
    hpd_event_fn fn;
    void *ctx;
};

static int emitting; /* >0 while fanning out: stopped watches are freed after */

static void watch_unlink(hpd_watch *w) {
    hpd *d = w->d;
    if (w->prev)
        w->prev->next = w->next;
    else if (d->watches == w)
        d->watches = w->next;
    if (w->next) w->next->prev = w->prev;
    d->n_watches--;
    hp_free(w);
}

static void sweep(hpd *d) {
    if (emitting) return;
    for (hpd_watch *w = d->watches, *next; w; w = next) {
        next = w->next;
        if (w->dead) watch_unlink(w);
    }
}

void hpd_watch_stop(hpd_watch *w) {
    if (!w || w->dead) return;
    w->dead = true;
    sweep(w->d);
}

uint64_t hp__event_seq;

static void fill_event(Hp__V1__JobEvent *ev, hpd_job *j) {
    hp__event_seq++; /* a new event: watchers may share its encoding until the next one */
    hp__v1__job_event__init(ev);
    ev->job_id = j->v.id;
    ev->time_unix_s = hp__unix_s();
}

void hp__emit_state(hpd *d, hpd_job *j) {
    Hp__V1__JobEvent ev;
    fill_event(&ev, j);
    ev.event_case = HP__V1__JOB_EVENT__EVENT_STATE;
    ev.state = j->v.state;
    bool final = hpd_sm_is_final(j->v.state);
    emitting++;
    for (hpd_watch *w = d->watches; w; w = w->next) {
        if (w->dead || w->j != j) continue;
        w->fn(w->ctx, &ev);
        if (final && !w->dead) {
            w->dead = true;
            w->fn(w->ctx, NULL);
        }
    }
    emitting--;
    sweep(d);
}

void hp__emit_metrics(hpd *d, hpd_job *j, const Hp__V1__StepMetrics *m) {
    Hp__V1__JobEvent ev;
    fill_event(&ev, j);
    ev.event_case = HP__V1__JOB_EVENT__EVENT_METRICS;
    ev.metrics = (Hp__V1__StepMetrics *)m;
    emitting++;
    for (hpd_watch *w = d->watches; w; w = w->next)
        if (!w->dead && w->j == j) w->fn(w->ctx, &ev);
    emitting--;
    sweep(d);
}

void hp__emit_log(hpd *d, hpd_job *j, const Hp__V1__LogLine *l) {
    Hp__V1__JobEvent ev;
    fill_event(&ev, j);
    ev.event_case = HP__V1__JOB_EVENT__EVENT_LOG;
    ev.log = (Hp__V1__LogLine *)l;
    emitting++;
    for (hpd_watch *w = d->watches; w; w = w->next)
        if (!w->dead && w->logs && w->j == j) w->fn(w->ctx, &ev);
    emitting--;
    sweep(d);
}

typedef struct replay_ctx {
    hpd_watch *w;
    hpd_job *j;
} replay_ctx;

static bool replay_one(void *ctx, int64_t step, int rank, const uint8_t *rec, size_t len) {
    replay_ctx *r = ctx;
    if (r->w->dead) return false;
    Hp__V1__StepMetrics *m = hp__v1__step_metrics__unpack(NULL, len, rec);
    if (!m) return true; /* a record we wrote ourselves; skip rather than end the watch */
    Hp__V1__JobEvent ev;
    fill_event(&ev, r->j);
    ev.event_case = HP__V1__JOB_EVENT__EVENT_METRICS;
    ev.metrics = m;
    r->w->fn(r->w->ctx, &ev);
    hp__v1__step_metrics__free_unpacked(m, NULL);
    return !r->w->dead;
}

hp_status hpd_watch_start(hpd *d, const char *id, int64_t from_step, bool logs, hpd_event_fn fn,
                          void *ctx, hpd_watch **out, hp_err *err) {
    *out = NULL;
    char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
    hpd_job *j = hp__job_find(d, id);
    if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
    hpd_watch *w = hp_calloc(1, sizeof *w);
    if (!w) return hp_errf(err, HP_NOMEM, "out of memory");
    w->d = d;
    w->j = j;
    w->logs = logs;
    w->fn = fn;
    w->ctx = ctx;
    /* Linked first (dead to fan-out until the replay is through: we are on the loop thread,
     * so nothing live can interleave anyway). */
    w->next = d->watches;
    if (d->watches) d->watches->prev = w;
    d->watches = w;
    d->n_watches++;
    emitting++;
    /* A live job: its state, the replay, then live events. A finished one: the replay, then
     * its final state — a stream always ends with the final state. */
    bool final = hpd_sm_is_final(j->v.state);
    Hp__V1__JobEvent ev;
    if (!final) {
        fill_event(&ev, j);
        ev.event_case = HP__V1__JOB_EVENT__EVENT_STATE;
        ev.state = j->v.state;
        fn(ctx, &ev);
    }
    hp_status st = HP_OK;
    if (!w->dead && from_step > 0) {
        replay_ctx r = {w, j};
        st = hpd_store_each_metrics(d->store, j->v.id, from_step, replay_one, &r, err);
    }
    if (!w->dead && final && st == HP_OK) {
        fill_event(&ev, j);
        ev.event_case = HP__V1__JOB_EVENT__EVENT_STATE;
        ev.state = j->v.state;
        fn(ctx, &ev);
    }
    if (!w->dead && final) {
        w->dead = true;
        fn(ctx, NULL);
    }
    emitting--;
    if (st != HP_OK) w->dead = true;
    bool live = !w->dead;
    if (live) *out = w;
    sweep(d);
    return st;
}

/* ---- transitions -------------------------------------------------------------------------- */
hp_status hp__transition(hpd *d, hpd_job *j, int ev, const char *reason, const char *error,
                         hp_err *err) {
    Hp__V1__JobState to;
    HP_TRY(hpd_sm_next(j->v.state, (hpd_sm_event)ev, j->v.restarts, j->max_restarts, &to, err));
    int restarts = j->v.restarts + (to == HP__V1__JOB_STATE__JOB_STATE_RESTARTING &&
                                    j->v.state != HP__V1__JOB_STATE__JOB_STATE_RESTARTING);
    const char *e = error ? error : (to == HP__V1__JOB_STATE__JOB_STATE_FAILED ? reason : "");
    if (to != j->v.state || restarts != j->v.restarts) {
        HP_TRY(hpd_store_transition(d->store, j->v.id, j->v.state, to, reason, j->v.step, restarts,
                                    e, err));
    }
    hp__log("info", "event=transition job=%s from=%s to=%s reason=\"%s\"", j->v.id,
            hpd_sm_state_str(j->v.state), hpd_sm_state_str(to), reason);
    bool changed = to != j->v.state;
    j->v.state = to;
    /* The store keeps the error of the latest transition only (the history has them all):
     * memory mirrors it, so a job that recovered and succeeded shows no stale error. */
    if (changed || restarts != j->v.restarts) snprintf(j->v.error, sizeof j->v.error, "%s", e);
    j->v.restarts = restarts;
    j->v.updated_unix_s = hp__unix_s();
    if (hpd_sm_is_final(to)) hp__core_release(d, j);
    hp__obs_job_changed(j);
    if (changed) hp__emit_state(d, j);
    return HP_OK;
}

static bool counts_gpus(const hpd *d, const hpd_job *j) {
    return j->cuda && d->gpus >= 0;
}

bool hp__core_fits(const hpd *d, const hpd_job *j) {
    if (d->slots_used + j->v.world_size > d->slots) return false;
    return !counts_gpus(d, j) || d->gpus_used + j->v.world_size <= d->gpus;
}

bool hp__core_hold(hpd *d, hpd_job *j) {
    if (counts_gpus(d, j)) {
        if (d->gpus_used + j->v.world_size > d->gpus) return false;
        j->gpu_ids = hp_calloc((size_t)j->v.world_size, sizeof *j->gpu_ids);
        if (!j->gpu_ids) return false;
        for (int g = 0, r = 0; g < d->gpus && r < j->v.world_size; g++)
            if (!d->gpu_busy[g]) {
                d->gpu_busy[g] = 1;
                j->gpu_ids[r++] = g;
            }
        d->gpus_used += j->v.world_size;
    }
    j->holds_slots = true;
    d->slots_used += j->v.world_size;
    return true;
}

void hp__core_release(hpd *d, hpd_job *j) {
    if (!j->holds_slots) return;
    j->holds_slots = false;
    d->slots_used -= j->v.world_size;
    if (!j->gpu_ids) return;
    for (int r = 0; r < j->v.world_size; r++) d->gpu_busy[j->gpu_ids[r]] = 0;
    d->gpus_used -= j->v.world_size;
    hp_free(j->gpu_ids);
    j->gpu_ids = NULL;
}

/* ---- the API ------------------------------------------------------------------------------ */
const char *hpd_token(const hpd *d) {
    return d->token;
}
uv_loop_t *hpd_loop(hpd *d) {
    return d->loop;
}

hp_status hpd_get(hpd *d, const char *id, hpd_job_view *out, hp_err *err) {
    char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
    hpd_job *j = hp__job_find(d, id);
    if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
    *out = j->v;
    return HP_OK;
}

/* A retried submit (same request_id) gets the job it made: *found. */
static hp_status submit_dup(hpd *d, const char *request_id, hpd_job_view *out, bool *found,
                            hp_err *err) {
    *found = false;
    if (!request_id || !*request_id) return HP_OK;
    if (strlen(request_id) >= sizeof((hpd_job *)0)->request_id)
        return hp_errf(err, HP_INVALID, "request_id: longer than 63 bytes");
    for (hpd_job *j = d->jobs; j; j = j->next)
        if (strcmp(j->request_id, request_id) == 0) {
            *out = j->v;
            *found = true;
            break;
        }
    return HP_OK;
}

/* The job's ranks against hpd's slots and, for a cuda job, its GPUs (gpus -1: not counted). */
static hp_status submit_fits(const hp_job *job, int slots, int gpus, hp_err *err) {
    int world = job->resources.world_size;
    if (world > slots)
        return hp_errf(err, HP_INVALID,
                       "resources.world_size: %d ranks exceed the coordinator's %d slots", world,
                       slots);
    if (job->resources.device != HP_DEVICE_CUDA || gpus < 0 || world <= gpus) return HP_OK;
    const char *ranks = world == 1 ? "rank" : "ranks", *gpu_s = world == 1 ? "GPU" : "GPUs";
    if (gpus == 0)
        return hp_errf(err, HP_INVALID,
                       "resources: a cuda job of %d %s needs %d %s; this hpd sees no GPU (--gpus)",
                       world, ranks, world, gpu_s);
    return hp_errf(err, HP_INVALID,
                   "resources: a cuda job of %d %s needs %d %s; this hpd has %d (--gpus)", world,
                   ranks, world, gpu_s, gpus);
}

/* Decodes the job, checks that its device can run here, and compiles it at its world size
 * (any thread: touches no hpd state). *job is the caller's to free, whatever the result. */
static hp_status submit_validate(const uint8_t *bytes, size_t len, int slots, int gpus,
                                 hp_job **job, hp_err *err) {
    *job = NULL;
    HP_TRY(hp_job_unpack(bytes, len, job, err));
    HP_TRY(submit_fits(*job, slots, gpus, err));
    /* The workers are this build's hp-worker (the local launcher starts it): a device it has
     * no backend for is refused now, not after a launch, and never run on the CPU. */
    HP_TRY(hp_device_built((*job)->resources.device, err));
    /* a graph the data loader cannot feed would compile, launch, and fail at every rank's
     * setup: refused now */
    HP_TRY(hp_job_check_trainable(*job, err));
    hp_compiled *c = NULL;
    /* The kind stays: a job that does not compile is INVALID, one that needs what this build
     * lacks UNSUPPORTED, a compiler fault INTERNAL (hp/status.def maps each for the caller). */
    hp_status st = hp_compile(*job, (*job)->resources.world_size, &c, err);
    hp_compiled_free(c);
    return st;
}

/* Stores the validated job and links it (the loop). */
static hp_status submit_commit(hpd *d, const uint8_t *bytes, size_t len, const char *request_id,
                               const hp_job *job, hpd_job_view *out, hp_err *err) {
    hpd_store_row r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", job->name);
    r.state = HP__V1__JOB_STATE__JOB_STATE_QUEUED;
    r.job = (uint8_t *)bytes;
    r.job_len = len;
    r.world = job->resources.world_size;
    r.total_steps = job->train.steps;
    snprintf(r.request_id, sizeof r.request_id, "%s", request_id ? request_id : "");
    /* The memory first, so that a job the store has is never missing from memory. */
    hpd_job *j = job_new(&r, err);
    if (!j) return HP_NOMEM;
    hp_status st = hpd_store_insert(d->store, &r, err);
    if (st != HP_OK) {
        job_free(j);
        return st;
    }
    snprintf(j->v.id, sizeof j->v.id, "%s", r.id);
    j->v.created_unix_s = j->v.updated_unix_s = r.created;
    /* run_dir is derived from the id (the store's row leaves it empty: it moves with
     * the state dir). */
    snprintf(j->run_dir, sizeof j->run_dir, "%.900s/jobs/%.40s/run", d->state_dir, r.id);
    job_link(d, j);
    j->max_restarts = job->resources.max_restarts;
    j->cuda = job->resources.device == HP_DEVICE_CUDA;
    j->gpus_per_node = job->resources.gpus_per_node;
    hp__log("info", "event=submitted job=%s name=\"%s\" world=%d steps=%lld", j->v.id, j->v.name,
            j->v.world_size, (long long)j->v.total_steps);
    hp__core_tick(d);
    *out = j->v;
    hp__obs_publish(d); /* a client that submitted finds the job over HTTP at once */
    return HP_OK;
}

hp_status hpd_submit(hpd *d, const uint8_t *bytes, size_t len, const char *request_id,
                     hpd_job_view *out, hp_err *err) {
    if (d->stopping) return hp_errf(err, HP_LIMIT, "the coordinator is shutting down");
    bool found;
    HP_TRY(submit_dup(d, request_id, out, &found, err));
    if (found) return HP_OK;
    hp_job *job = NULL;
    hp_status st = submit_validate(bytes, len, d->slots, d->gpus, &job, err);
    if (st == HP_OK) st = submit_commit(d, bytes, len, request_id, job, out, err);
    hp_job_free(job);
    return st;
}

struct hpd_submit_req {
    uv_work_t work;
    hpd *d;
    uint8_t *bytes;
    size_t len;
    char request_id[64];
    int slots, gpus;
    hpd_submit_fn fn; /* NULL: cancelled */
    void *ctx;
    hp_job *job;
    hp_status st;
    hp_err err;
};

static void submit_work(uv_work_t *w) { /* a pool thread */
    hpd_submit_req *r = w->data;
    r->st = submit_validate(r->bytes, r->len, r->slots, r->gpus, &r->job, &r->err);
}

static void submit_after(uv_work_t *w, int status) { /* the loop */
    hpd_submit_req *r = w->data;
    hpd *d = r->d;
    hpd_job_view v;
    memset(&v, 0, sizeof v);
    hp_status st = r->st;
    bool found = false;
    if (status == UV_ECANCELED || d->stopping)
        st = hp_errf(&r->err, HP_LIMIT, "the coordinator is shutting down");
    /* What may have changed while it compiled: a twin committed, fewer slots. */
    if (st == HP_OK) st = submit_dup(d, r->request_id, &v, &found, &r->err);
    if (st == HP_OK && !found) st = submit_fits(r->job, d->slots, d->gpus, &r->err);
    /* A client that went away still gets its job (a retry with its request_id finds it). */
    if (st == HP_OK && !found)
        st = submit_commit(d, r->bytes, r->len, r->request_id, r->job, &v, &r->err);
    if (r->fn) r->fn(r->ctx, st, st == HP_OK ? &v : NULL, &r->err);
    hp_job_free(r->job);
    hp_free(r->bytes);
    hp_free(r);
}

hp_status hpd_submit_async(hpd *d, const uint8_t *bytes, size_t len, const char *request_id,
                           hpd_submit_fn fn, void *ctx, hpd_submit_req **out, hp_err *err) {
    *out = NULL;
    if (d->stopping) return hp_errf(err, HP_LIMIT, "the coordinator is shutting down");
    hpd_job_view v;
    bool found;
    HP_TRY(submit_dup(d, request_id, &v, &found, err));
    if (found) {
        fn(ctx, HP_OK, &v, NULL);
        return HP_OK;
    }
    hpd_submit_req *r = hp_calloc(1, sizeof *r);
    uint8_t *copy = hp_malloc(len ? len : 1);
    if (!r || !copy) {
        hp_free(r);
        hp_free(copy);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    memcpy(copy, bytes, len);
    *r = (hpd_submit_req){.d = d,
                          .bytes = copy,
                          .len = len,
                          .slots = d->slots,
                          .gpus = d->gpus,
                          .fn = fn,
                          .ctx = ctx};
    snprintf(r->request_id, sizeof r->request_id, "%s", request_id ? request_id : "");
    r->work.data = r;
    int rc = uv_queue_work(d->loop, &r->work, submit_work, submit_after);
    if (rc != 0) {
        hp_free(copy);
        hp_free(r);
        return hp_errf(err, HP_NOMEM, "cannot queue the submit: %s", uv_strerror(rc));
    }
    *out = r;
    return HP_OK;
}

void hpd_submit_cancel(hpd_submit_req *r) {
    if (r) r->fn = NULL;
}

static bool state_in(Hp__V1__JobState s, const Hp__V1__JobState *states, int n) {
    if (n <= 0) return true;
    for (int i = 0; i < n; i++)
        if (states[i] == s) return true;
    return false;
}

hp_status hpd_list(hpd *d, const Hp__V1__JobState *states, int n_states, int page_size,
                   const char *page_token, hpd_job_view **out, int *n, char next[HPD_ID_MAX],
                   hp_err *err) {
    *out = NULL;
    *n = 0;
    next[0] = 0;
    if (page_size < 0) return hp_errf(err, HP_INVALID, "page_size: %d is negative", page_size);
    if (page_size > 1000) return hp_errf(err, HP_LIMIT, "page_size: %d exceeds 1000", page_size);
    if (page_size == 0) page_size = 50;
    long below = LONG_MAX;
    if (page_token && *page_token) {
        below = id_seq(page_token);
        char q[HP_QUOTE_MAX];
        if (below <= 0)
            return hp_errf(err, HP_INVALID, "page_token: %s is not a job id",
                           hp_quote(q, sizeof q, page_token, 64));
    }
    /* The list is oldest first; walk it into an index to go newest first. */
    hpd_job **all = hp_malloc(sizeof *all * (size_t)(d->n_jobs ? d->n_jobs : 1));
    hpd_job_view *v = hp_malloc(sizeof *v * (size_t)page_size);
    if (!all || !v) {
        hp_free(all);
        hp_free(v);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    int m = 0;
    for (hpd_job *j = d->jobs; j; j = j->next) all[m++] = j;
    int k = 0;
    for (int i = m - 1; i >= 0; i--) {
        hpd_job *j = all[i];
        if (id_seq(j->v.id) >= below || !state_in(j->v.state, states, n_states)) continue;
        if (k == page_size) {
            snprintf(next, HPD_ID_MAX, "%s", v[k - 1].id);
            break;
        }
        v[k++] = j->v;
    }
    hp_free(all);
    *out = v;
    *n = k;
    return HP_OK;
}

hp_status hpd_cancel(hpd *d, const char *id, const char *reason, hpd_job_view *out, hp_err *err) {
    char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
    hpd_job *j = hp__job_find(d, id);
    if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
    if (!hpd_sm_is_final(j->v.state)) {
        char why[300];
        snprintf(why, sizeof why, "cancelled: %s", reason && *reason ? reason : "by request");
        HP_TRY(hp__transition(d, j, HPD_EV_CANCEL, why, "", err));
        hp__stop_attempt(d, j, why, false);
    }
    *out = j->v;
    return HP_OK;
}

static hp_status plan_summary(const hp_compiled *c, uint8_t **out, size_t *out_len, hp_err *err) {
    Hp__V1__PlanSummary s;
    hp__v1__plan_summary__init(&s);
    Hp__V1__PassReport reps[16], *preps[16];
    s.world_size = c->world;
    s.n_passes = 0;
    for (int i = 0; i < c->n_passes && i < 16; i++) {
        hp__v1__pass_report__init(&reps[i]);
        reps[i].name = (char *)c->passes[i].name;
        reps[i].nodes_before = c->passes[i].nodes_in;
        reps[i].nodes_after = c->passes[i].nodes_out;
        reps[i].time_s = c->passes[i].seconds;
        preps[s.n_passes++] = &reps[i];
    }
    s.passes = preps;
    Hp__V1__CostEstimate e;
    hp__v1__cost_estimate__init(&e);
    /* a whole optimizer step: grad_accum runs of the program */
    double micro = (double)c->cost.grad_accum;
    e.step_time_s = c->cost.step_s;
    e.compute_s = micro * c->cost.compute_s;
    e.comm_s = micro * c->cost.comm_s;
    e.exposed_comm_s = micro * c->cost.exposed_comm_s;
    e.peak_memory_bytes = c->memory.total;
    e.param_bytes = c->memory.params;
    e.flops_per_step = micro * c->cost.flops;
    s.estimate = &e;
    s.graph_nodes = c->graph ? c->graph->n_nodes : 0;
    s.instructions = c->program ? c->program->n_instrs : 0;
    char *warn[HP_MAX_WARNINGS];
    for (int i = 0; i < c->n_warnings && i < HP_MAX_WARNINGS; i++) warn[i] = (char *)c->warnings[i];
    s.n_explanations = (size_t)c->n_warnings;
    s.explanations = warn;
    size_t n = hp__v1__plan_summary__get_packed_size(&s);
    *out = hp_malloc(n ? n : 1);
    if (!*out) return hp_errf(err, HP_NOMEM, "out of memory");
    *out_len = hp__v1__plan_summary__pack(&s, *out);
    return HP_OK;
}

/* Decodes and compiles a job, then packs its summary (any thread: touches no hpd state). */
static hp_status plan_compile(const uint8_t *bytes, size_t len, int world_size, uint8_t **out,
                              size_t *out_len, hp_err *err) {
    hp_job *job = NULL;
    HP_TRY(hp_job_unpack(bytes, len, &job, err));
    hp_compiled *c = NULL;
    hp_status st = hp_compile(job, world_size, &c, err); /* the kind stays, as at submit */
    if (st == HP_OK) st = plan_summary(c, out, out_len, err);
    hp_compiled_free(c);
    hp_job_free(job);
    return st;
}

static hp_status plan_source(hpd *d, const char *id, const uint8_t **bytes, size_t *len,
                             int world_size, hp_err *err) {
    if (world_size < 0 || world_size > 65536)
        return hp_errf(err, HP_INVALID, "world_size: %d must be in [0, 65536]", world_size);
    if (id && *id) {
        char q[HP_QUOTE_MAX]; /* the id as the peer sent it, escaped */
        hpd_job *j = hp__job_find(d, id);
        if (!j) return hp_errf(err, HP_NOT_FOUND, "no job %s", hp_quote(q, sizeof q, id, 64));
        *bytes = j->packed;
        *len = j->packed_len;
    }
    return HP_OK;
}

hp_status hpd_plan(hpd *d, const char *id, const uint8_t *bytes, size_t len, int world_size,
                   uint8_t **out, size_t *out_len, hp_err *err) {
    *out = NULL;
    *out_len = 0;
    HP_TRY(plan_source(d, id, &bytes, &len, world_size, err));
    return plan_compile(bytes, len, world_size, out, out_len, err);
}

struct hpd_plan_req {
    uv_work_t work;
    uint8_t *bytes;
    size_t len;
    int world_size;
    hpd_plan_fn fn; /* NULL: cancelled */
    void *ctx;
    uint8_t *plan;
    size_t plan_len;
    hp_status st;
    hp_err err;
};

static void plan_work(uv_work_t *w) { /* a pool thread */
    hpd_plan_req *r = w->data;
    r->st = plan_compile(r->bytes, r->len, r->world_size, &r->plan, &r->plan_len, &r->err);
}

static void plan_after(uv_work_t *w, int status) { /* the loop */
    hpd_plan_req *r = w->data;
    hp_status st = r->st;
    if (status == UV_ECANCELED) st = hp_errf(&r->err, HP_LIMIT, "the coordinator is shutting down");
    if (r->fn) r->fn(r->ctx, st, st == HP_OK ? r->plan : NULL, r->plan_len, &r->err);
    hp_free(r->plan);
    hp_free(r->bytes);
    hp_free(r);
}

hp_status hpd_plan_async(hpd *d, const char *id, const uint8_t *bytes, size_t len, int world_size,
                         hpd_plan_fn fn, void *ctx, hpd_plan_req **out, hp_err *err) {
    *out = NULL;
    if (d->stopping) return hp_errf(err, HP_LIMIT, "the coordinator is shutting down");
    HP_TRY(plan_source(d, id, &bytes, &len, world_size, err));
    hpd_plan_req *r = hp_calloc(1, sizeof *r);
    uint8_t *copy = hp_malloc(len ? len : 1);
    if (!r || !copy) {
        hp_free(r);
        hp_free(copy);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    if (len) memcpy(copy, bytes, len);
    r->bytes = copy;
    r->len = len;
    r->world_size = world_size;
    r->fn = fn;
    r->ctx = ctx;
    r->work.data = r;
    int rc = uv_queue_work(d->loop, &r->work, plan_work, plan_after);
    if (rc != 0) {
        hp_free(copy);
        hp_free(r);
        return hp_errf(err, HP_NOMEM, "cannot queue the plan: %s", uv_strerror(rc));
    }
    *out = r;
    return HP_OK;
}

void hpd_plan_cancel(hpd_plan_req *r) {
    if (r) r->fn = NULL;
}

/* ---- start, recovery, shutdown ------------------------------------------------------------ */
static bool load_row(void *ctx, const hpd_store_row *r) {
    void **a = ctx;
    hpd *d = a[0];
    hpd_job *j = job_new(r, a[1]);
    if (!j) {
        a[2] = (void *)1;
        return false;
    }
    job_link(d, j);
    return true;
}

static hp_status launcher_new(hpd *d, const hpd_config *cfg, hp_err *err) {
    switch (cfg->launcher) {
    case HPD_LAUNCHER_SLURM: {
        hpd_slurm_opts o = cfg->slurm;
        o.worker_path = cfg->worker_path;
        return hpd_launcher_slurm_new(d->loop, &o, hp__on_launch_event, d, &d->launcher, err);
    }
    case HPD_LAUNCHER_SYSTEMD: {
        hpd_systemd_opts o = cfg->systemd;
        o.worker_path = cfg->worker_path;
        return hpd_launcher_systemd_new(d->loop, &o, hp__on_launch_event, d, &d->launcher, err);
    }
    case HPD_LAUNCHER_EXTERNAL:
        return hpd_launcher_external_new(hp__on_launch_event, d, &d->launcher, err);
    default:
        return hpd_launcher_local_new(d->loop, cfg->worker_path, hp__on_launch_event, d,
                                      &d->launcher, err);
    }
}

/* Recovery of a job whose attempt a previous hpd started: a scheduler's job (Slurm) outlives
 * its coordinator, so the launcher tracks it again, and the restart waits until it is gone
 * (the old ranks lost their coordinator and stop on their own; stop() makes sure). */
static void adopt(hpd *d, hpd_job *j) {
    int attempt;
    char launcher[16], ref[64];
    hp_err e = {0};
    if (hpd_store_get_launch(d->store, j->v.id, &attempt, launcher, sizeof launcher, ref,
                             sizeof ref, &e) != HP_OK)
        return;
    snprintf(j->v.launcher, sizeof j->v.launcher, "%s", launcher);
    snprintf(j->v.launch_ref, sizeof j->v.launch_ref, "%s", ref);
    if (!d->launcher->vt->adopt || strcmp(launcher, d->launcher->vt->name) != 0) {
        if (strcmp(launcher, d->launcher->vt->name) != 0)
            hp__log("warn",
                    "event=adopt_skipped job=%s attempt=%d launcher=%s ref=%s "
                    "note=\"started by another launcher; stop it by hand if it still runs\"",
                    j->v.id, attempt, launcher, ref);
        return;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.900s/jobs/%.40s/attempt-%d", d->state_dir, j->v.id, attempt);
    if (d->launcher->vt->adopt(d->launcher, j->v.id, attempt, j->v.world_size, dir, ref, &e) !=
        HP_OK) {
        hp__log("error", "event=adopt_failed job=%s ref=%s error=\"%s\"", j->v.id, ref, e.msg);
        return;
    }
    /* The tick waits for this attempt's ranks (the one being torn down when hpd died, too);
     * launch() numbers the next one from v.restarts. */
    j->attempt = attempt;
    hp__log("info", "event=adopted job=%s attempt=%d launcher=%s ref=%s", j->v.id, attempt,
            launcher, ref);
    d->launcher->vt->stop(d->launcher, j->v.id, attempt, SIGTERM);
}

static void on_cron(uv_timer_t *t) {
    hp__core_tick(t->data);
}

hp_status hpd_new(uv_loop_t *loop, const hpd_config *cfg, hpd **out, hp_err *err) {
    *out = NULL;
    hpd *d = hp_calloc(1, sizeof *d);
    if (!d) return hp_errf(err, HP_NOMEM, "out of memory");
    d->loop = loop;
    d->slots = cfg->slots > 0 ? cfg->slots : 1;
    d->gpus = cfg->launcher == HPD_LAUNCHER_LOCAL ? (cfg->gpus > 0 ? cfg->gpus : 0) : -1;
    d->gpu_busy = hp_calloc(d->gpus > 0 ? (size_t)d->gpus : 1, 1);
    if (!d->gpu_busy) {
        hp_free(d);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    d->heartbeat_ms = cfg->heartbeat_ms > 0 ? cfg->heartbeat_ms : 1000;
    d->on_sigterm = cfg->on_sigterm;
    if (strlen(cfg->state_dir) > 900) {
        hp_free(d->gpu_busy);
        hp_free(d);
        return hp_errf(err, HP_INVALID, "state dir: longer than 900 bytes");
    }
    snprintf(d->state_dir, sizeof d->state_dir, "%s", cfg->state_dir);
    char path[PATH_MAX + 16];
    hp_status st = hp_mkdir_p(d->state_dir, err);
    if (st == HP_OK) {
        snprintf(path, sizeof path, "%s/hpd.db", d->state_dir);
        st = hpd_store_open(path, &d->store, err);
    }
    void *ctx[3] = {d, err, NULL};
    if (st == HP_OK) st = hpd_store_each_job(d->store, load_row, ctx, err);
    if (st == HP_OK && ctx[2]) st = HP_NOMEM;
    d->launch_timeout_ms = (cfg->launch_timeout_s > 0 ? cfg->launch_timeout_s : 120) * 1000;
    d->comm_kind = cfg->comm;
    d->launcher_kind = cfg->launcher;
    if (st == HP_OK) st = launcher_new(d, cfg, err);
    if (st != HP_OK) {
        hpd_free(d);
        return st;
    }
    /* Recovery: nothing in flight survives a daemon's death unnoticed. */
    for (hpd_job *j = d->jobs; j; j = j->next) {
        Hp__V1__JobState s = j->v.state;
        if (hpd_sm_is_final(s) || s == HP__V1__JOB_STATE__JOB_STATE_QUEUED) continue;
        hp_err e = {0};
        if (hp__transition(d, j, HPD_EV_RECOVER, "coordinator restarted", NULL, &e) != HP_OK) {
            hp__log("error", "event=recover_failed job=%s error=\"%s\"", j->v.id, e.msg);
            continue;
        }
        if (j->v.state == HP__V1__JOB_STATE__JOB_STATE_RESTARTING) {
            /* Its next attempt's launch fails (and the restart count decides) when the GPUs
             * it held are no longer there (--gpus went down). */
            if (!hp__core_hold(d, j))
                hp__log("error", "event=recover_hold_failed job=%s world=%d gpus=%d", j->v.id,
                        j->v.world_size, d->gpus);
            adopt(d, j);
        }
        hp__log("info", "event=recovered job=%s state=%s restarts=%d", j->v.id,
                hpd_sm_state_str(j->v.state), j->v.restarts);
    }
    uv_timer_init(loop, &d->cron);
    d->cron.data = d;
    uv_timer_start(&d->cron, on_cron, 1000, 1000);
    *out = d;
    return HP_OK;
}

/* After shutdown: waits for the ranks to checkpoint and exit (SIGTERM after 10 s, SIGKILL
 * after 15 s), then closes the worker server and itself, so that the loop ends. */
static void on_shutdown_cron(uv_timer_t *t) {
    hpd *d = t->data;
    uint64_t waited = hp__now_ms() - d->stop_started_ms;
    int alive = 0;
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (!j->ranks && j->v.state != HP__V1__JOB_STATE__JOB_STATE_RESTARTING) continue;
        int n = d->launcher->vt->alive(d->launcher, j->v.id, j->attempt);
        if (n && waited > 15000)
            d->launcher->vt->stop(d->launcher, j->v.id, j->attempt, SIGKILL);
        else if (n && waited > 10000)
            d->launcher->vt->stop(d->launcher, j->v.id, j->attempt, SIGTERM);
        alive += n;
    }
    if (alive && waited < 20000) return;
    hp__workers_stop(d);
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, NULL);
}

void hpd_shutdown(hpd *d) {
    if (d->stopping) return;
    d->stopping = true;
    d->stop_started_ms = hp__now_ms();
    /* checkpoint: running jobs checkpoint and stop; they stay RUNNING in the store and are
     * resumed from that checkpoint at the next start (recovery). cancel: every job past the
     * queue (compiling, launching, running, restarting) is CANCELLED; queued jobs stay. */
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (hpd_sm_is_final(j->v.state)) continue;
        if (d->on_sigterm == HPD_ON_SIGTERM_CANCEL &&
            j->v.state != HP__V1__JOB_STATE__JOB_STATE_QUEUED) {
            hpd_job_view v;
            hp_err e = {0};
            if (hpd_cancel(d, j->v.id, "coordinator shut down", &v, &e) != HP_OK)
                hp__log("error", "event=cancel_failed job=%s error=\"%s\"", j->v.id, e.msg);
        } else if (j->ranks) {
            hp__stop_attempt(d, j, "coordinator shutting down", true);
        }
    }
    uv_timer_stop(&d->cron);
    uv_timer_start(&d->cron, on_shutdown_cron, 0, 200);
    /* Watches end: their jobs are not final, but the stream is over. */
    for (hpd_watch *w = d->watches; w; w = w->next)
        if (!w->dead) {
            w->dead = true;
            w->fn(w->ctx, NULL);
        }
    sweep(d);
}

void hpd_free(hpd *d) {
    if (!d) return;
    while (d->watches) watch_unlink(d->watches);
    if (d->launcher) d->launcher->vt->free(d->launcher);
    hpd_store_close(d->store);
    for (hpd_job *j = d->jobs, *next; j; j = next) {
        next = j->next;
        job_free(j);
    }
    hp__obs_free(d->obs);
    hp_free(d->gpu_busy);
    hp_free(d);
}
