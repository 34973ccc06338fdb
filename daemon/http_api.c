/* daemon/http_api.c — the JSON API under /api/v1 (docs/http-api.md), on the HTTP threads.
 * Jobs and ranks come from the published snapshot; metrics history and state history from
 * the store through a read-only connection; logs from the ranks' log files; traces from the
 * stored trace files (traces.c). Every document is built with jansson.
 */
#include "daemon/core.h"
#include "daemon/http_internal.h"
#include "daemon/jobsm.h"

#include "hp/v1/telemetry.pb-c.h"

#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIST_DEFAULT    50
#define LIST_MAX        1000
#define METRICS_DEFAULT 1000
#define METRICS_MAX     10000
#define TAIL_DEFAULT    100
#define TAIL_MAX        10000
#define TAIL_BYTES_MAX  (16u << 20) /* at most this much of a log is read for a tail */

/* ---- arguments ---------------------------------------------------------------------------- */
/* Parses a decimal integer in [lo, hi]; false (and r set to 400) otherwise. */
static bool arg_int(const http_args *a, const char *key, int64_t lo, int64_t hi, int64_t dflt,
                    int64_t *out, http_reply *r) {
    const char *v = http_arg(a, key);
    *out = dflt;
    if (!v) return true;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        http_error(r, 400, "%s: '%.40s' is not an integer in [%lld, %lld]", key, v, (long long)lo,
                   (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

static double num(double x) { /* JSON has no NaN/Inf */
    return x == x && x < 1e308 && x > -1e308 ? x : 0;
}

/* ---- objects ------------------------------------------------------------------------------ */
static json_t *mrec_json(const hpd_mrec *m) {
    json_t *o =
        json_pack("{s:I, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:I, "
                  "s:f}",
                  "step", (json_int_t)m->step, "rank", (int)m->rank, "loss", num(m->loss),
                  "loss_max", num(m->loss_max), "grad_norm", num(m->grad_norm), "lr", num(m->lr),
                  "tokens_per_s", num(m->tokens_per_s), "tflops", num(m->tflops), "mfu_pct",
                  num(m->mfu_pct), "peak_memory_bytes", (json_int_t)m->peak_memory_bytes,
                  "peak_memory_pct", num(m->peak_memory_pct), "step_time_s", num(m->step_time_s),
                  "data_time_s", num(m->data_time_s), "exposed_comm_s", num(m->exposed_comm_s),
                  "tokens", (json_int_t)m->tokens, "time_unix_s", num(m->time_unix_s));
    /* the held-out loss evaluated after this step, null when none was */
    if (o && json_object_set_new(o, "eval_loss",
                                 isfinite(m->eval_loss) ? json_real(m->eval_loss) : json_null())) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *job_json(const hpd_snap_job *e) {
    const hpd_job_view *v = &e->v;
    double progress = v->total_steps > 0 ? (double)v->step / (double)v->total_steps : 0;
    if (progress > 1) progress = 1;
    json_t *o = json_pack(
        "{s:s, s:o, s:s, s:f, s:f, s:i, s:I, s:I, s:f, s:i, s:o}", "id", v->id, "name",
        http_jstr(v->name), "state", hpd_sm_state_str(v->state), "created_unix_s",
        num(v->created_unix_s), "updated_unix_s", num(v->updated_unix_s), "world_size",
        v->world_size, "step", (json_int_t)v->step, "total_steps", (json_int_t)v->total_steps,
        "progress", progress, "restarts", v->restarts, "error", http_jstr(v->error));
    if (!o) return NULL;
    int bad = json_object_set_new(o, "eta_s", e->eta_s >= 0 ? json_real(e->eta_s) : json_null());
    bad |= json_object_set_new(o, "launcher", http_jstr(v->launcher));
    bad |= json_object_set_new(o, "launch_ref", http_jstr(v->launch_ref));
    bad |= json_object_set_new(o, "launch_state", http_jstr(v->launch_state));
    bad |= json_object_set_new(o, "last", e->has_last ? mrec_json(&e->last) : json_null());
    bad |= json_object_set_new(o, "eval",
                               e->has_eval ? json_pack("{s:f, s:I}", "loss", num(e->eval_loss),
                                                       "step", (json_int_t)e->eval_step)
                                           : json_null());
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- /jobs -------------------------------------------------------------------------------- */
static bool state_from(const char *s, size_t n, Hp__V1__JobState *out) {
    for (int i = 1; i <= 8; i++) {
        const char *name = hpd_sm_state_str((Hp__V1__JobState)i);
        if (strlen(name) == n && strncasecmp(name, s, n) == 0) {
            *out = (Hp__V1__JobState)i;
            return true;
        }
    }
    return false;
}

static void list_jobs(const hpd_snap *s, const http_args *a, http_reply *r) {
    bool want[9] = {0}, any = false;
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->key[i], "state") != 0) continue;
        for (const char *p = a->val[i]; *p;) { /* comma-separated, may repeat */
            size_t n = strcspn(p, ",");
            Hp__V1__JobState st;
            if (!state_from(p, n, &st)) {
                http_error(r, 400,
                           "state: '%.*s' is not one of QUEUED COMPILING LAUNCHING RUNNING "
                           "RESTARTING SUCCEEDED FAILED CANCELLED",
                           (int)(n > 40 ? 40 : n), p);
                return;
            }
            want[st] = any = true;
            p += n + (p[n] == ',');
        }
    }
    int64_t limit;
    if (!arg_int(a, "limit", 1, LIST_MAX, LIST_DEFAULT, &limit, r)) return;
    const char *tok = http_arg(a, "page_token");
    int start = s->n_jobs - 1;
    if (tok && *tok) {
        const hpd_snap_job *at = hpd_snap_find(s, tok);
        if (!at) {
            http_error(r, 400, "page_token: '%.60s' is not a job id of this list", tok);
            return;
        }
        start = -1;
        for (int i = 0; i < s->n_jobs; i++)
            if (s->jobs[i] == at) start = i - 1; /* the page after: older jobs */
    }
    json_t *jobs = json_array();
    const char *next = "";
    int n = 0;
    for (int i = start; i >= 0 && jobs; i--) {
        const hpd_snap_job *e = s->jobs[i];
        if (any && !want[e->v.state]) continue;
        if (n == limit) {
            next = s->jobs[i + 1 <= start ? i + 1 : i]->v.id;
            /* the token is the last job returned: find it (skipping filtered-out jobs) */
            for (int k = i + 1; k <= start; k++)
                if (!any || want[s->jobs[k]->v.state]) {
                    next = s->jobs[k]->v.id;
                    break;
                }
            break;
        }
        if (json_array_append_new(jobs, job_json(e))) {
            json_decref(jobs);
            jobs = NULL;
        }
        n++;
    }
    if (!jobs) {
        http_error(r, 500, "out of memory");
        return;
    }
    http_json(r, 200, json_pack("{s:o, s:s}", "jobs", jobs, "next_page_token", next));
}

/* ---- /jobs/{id} --------------------------------------------------------------------------- */
static hpd_store *rstore(hpd_http *h, hp_err *err) { /* store_mu held */
    if (h->rstore) return h->rstore;
    char path[1100];
    snprintf(path, sizeof path, "%s/hpd.db", h->state_dir);
    if (hpd_store_open_readonly(path, &h->rstore, err) != HP_OK) return NULL;
    return h->rstore;
}

static bool on_transition(void *ctx, int64_t seq, int from, int to, double time,
                          const char *reason) {
    (void)seq;
    json_t *arr = ctx;
    json_t *t = json_pack("{s:s, s:s, s:f, s:o}", "from",
                          from ? hpd_sm_state_str((Hp__V1__JobState)from) : "", "to",
                          hpd_sm_state_str((Hp__V1__JobState)to), "time_unix_s", num(time),
                          "reason", http_jstr(reason));
    return json_array_append_new(arr, t) == 0;
}

static void get_job(hpd_http *h, const hpd_snap_job *e, http_reply *r) {
    double now = hp__unix_s();
    json_t *ranks = json_array();
    for (int i = 0; ranks && i < e->n_ranks; i++) {
        const hpd_snap_rank *k = &e->ranks[i];
        json_t *o = json_pack(
            "{s:i, s:b, s:o, s:I}", "rank", k->rank, "up", k->up, "heartbeat_age_s",
            k->last_seen_unix > 0 ? json_real(now > k->last_seen_unix ? now - k->last_seen_unix : 0)
                                  : json_null(),
            "step", (json_int_t)k->step);
        if (o && k->has_metrics) {
            json_object_set_new(o, "tokens_per_s", json_real(num(k->last.tokens_per_s)));
            json_object_set_new(o, "mfu_pct", json_real(num(k->last.mfu_pct)));
            json_object_set_new(o, "peak_memory_bytes",
                                json_integer((json_int_t)k->last.peak_memory_bytes));
            json_object_set_new(o, "step_time_s", json_real(num(k->last.step_time_s)));
        }
        if (json_array_append_new(ranks, o)) {
            json_decref(ranks);
            ranks = NULL;
        }
    }
    json_t *trans = json_array();
    hp_err err = {0};
    pthread_mutex_lock(&h->store_mu);
    hpd_store *st = rstore(h, &err);
    hp_status rc = st ? hpd_store_each_transition(st, e->v.id, on_transition, trans, &err) : HP_IO;
    pthread_mutex_unlock(&h->store_mu);
    if (rc != HP_OK) {
        json_decref(ranks);
        json_decref(trans);
        http_error(r, (unsigned)hp_status_http(rc), "store: %s", err.msg);
        return;
    }
    json_t *job = job_json(e);
    if (!job || !ranks || !trans) {
        json_decref(job);
        json_decref(ranks);
        json_decref(trans);
        http_error(r, 500, "out of memory");
        return;
    }
    http_json(r, 200,
              json_pack("{s:o, s:o, s:o}", "job", job, "ranks", ranks, "transitions", trans));
}

/* ---- /jobs/{id}/metrics ------------------------------------------------------------------- */
typedef struct mwalk {
    json_t *records;
    int64_t rank; /* INT64_MIN: all */
    int64_t limit, n, last_step, next_step;
    int64_t upto; /* records past this step are held back (not every rank has it yet) */
    bool more, oom;
} mwalk;

static bool on_metrics_row(void *ctx, int64_t step, int rank, const uint8_t *rec, size_t len) {
    mwalk *w = ctx;
    if (step > w->upto) return false;
    if (w->rank != INT64_MIN && rank != w->rank) return true;
    if (w->n >= w->limit && step != w->last_step) { /* cut at a step boundary */
        w->more = true;
        w->next_step = step;
        return false;
    }
    Hp__V1__StepMetrics *m = hp__v1__step_metrics__unpack(NULL, len, rec);
    if (!m) return true; /* the loop stored it packed by itself: cannot happen; skip */
    hpd_mrec mr;
    hpd_mrec_from(&mr, m);
    mr.step = step;
    mr.rank = rank;
    hp__v1__step_metrics__free_unpacked(m, NULL);
    if (json_array_append_new(w->records, mrec_json(&mr))) {
        w->oom = true;
        return false;
    }
    w->n++;
    w->last_step = step;
    return true;
}

static void get_metrics(hpd_http *h, const hpd_snap_job *e, const http_args *a, http_reply *r) {
    int64_t since, limit, rank;
    if (!arg_int(a, "since", 0, INT64_MAX / 2, 0, &since, r)) return;
    if (!arg_int(a, "limit", 1, METRICS_MAX, METRICS_DEFAULT, &limit, r)) return;
    if (!arg_int(a, "rank", -1, e->v.world_size > 0 ? e->v.world_size - 1 : 0, INT64_MIN, &rank, r))
        return;
    mwalk w = {
        .records = json_array(), .rank = rank, .limit = limit, .last_step = -1, .upto = INT64_MAX};
    /* The ranks of a running job report each step separately: serve a step only once every
     * rank has reported it, so that a poller passing next_since back never skips a record
     * that arrives late. */
    if (!hpd_sm_is_final(e->v.state))
        for (int k = 0; k < e->n_ranks; k++) {
            int64_t r_step = e->ranks[k].has_metrics ? e->ranks[k].last.step : 0;
            if (r_step < w.upto) w.upto = r_step;
        }
    if (!w.records) {
        http_error(r, 500, "out of memory");
        return;
    }
    hp_err err = {0};
    pthread_mutex_lock(&h->store_mu);
    hpd_store *st = rstore(h, &err);
    hp_status rc =
        st ? hpd_store_each_metrics(st, e->v.id, since, on_metrics_row, &w, &err) : HP_IO;
    pthread_mutex_unlock(&h->store_mu);
    if (rc != HP_OK || w.oom) {
        json_decref(w.records);
        http_error(r, (unsigned)hp_status_http(w.oom ? HP_NOMEM : rc), "%s",
                   w.oom ? "out of memory" : err.msg);
        return;
    }
    int64_t next = w.more ? w.next_step : w.n ? w.last_step + 1 : since;
    http_json(r, 200,
              json_pack("{s:s, s:o, s:I, s:b}", "job_id", e->v.id, "records", w.records,
                        "next_since", (json_int_t)next, "more", w.more));
}

/* ---- /jobs/{id}/logs ---------------------------------------------------------------------- */
static void get_logs(hpd_http *h, const hpd_snap_job *e, const http_args *a, http_reply *r) {
    int64_t rank, tail;
    int world = e->v.world_size > 0 ? e->v.world_size : 1;
    if (!arg_int(a, "rank", 0, world - 1, 0, &rank, r)) return;
    if (!arg_int(a, "tail", 1, TAIL_MAX, TAIL_DEFAULT, &tail, r)) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/jobs/%s/rank-%d.log", h->state_dir, e->v.id, (int)rank);
    json_t *lines = json_array();
    if (!lines) {
        http_error(r, 500, "out of memory");
        return;
    }
    FILE *f = fopen(path, "rb");
    if (f) {
        struct stat sb;
        long size = fstat(fileno(f), &sb) == 0 ? (long)sb.st_size : 0;
        long want = (long)tail * 1024;
        if (want > (long)TAIL_BYTES_MAX) want = TAIL_BYTES_MAX;
        long from = size > want ? size - want : 0;
        char *buf = malloc((size_t)(size - from) + 1);
        size_t got = 0;
        if (buf && fseek(f, from, SEEK_SET) == 0) got = fread(buf, 1, (size_t)(size - from), f);
        fclose(f);
        if (!buf) {
            json_decref(lines);
            http_error(r, 500, "out of memory");
            return;
        }
        buf[got] = 0;
        /* Started mid-file: the first line is partial, drop it. A last line without '\n' is
         * being written: keep it. */
        size_t begin = 0, end = got;
        if (from > 0) {
            char *nl = memchr(buf, '\n', got);
            begin = nl ? (size_t)(nl - buf) + 1 : got;
        }
        if (end > begin && buf[end - 1] == '\n') end--;
        /* Walk back over `tail` line starts. */
        size_t start = end, count = 0;
        if (end > begin) {
            start = end;
            while (count < (size_t)tail) {
                while (start > begin && buf[start - 1] != '\n') start--;
                count++;
                if (start == begin || count == (size_t)tail) break;
                start--; /* onto the '\n' ending the previous line */
            }
        }
        for (size_t p = start; count > 0 && p <= end;) {
            char *nl = memchr(buf + p, '\n', end - p);
            size_t q = nl ? (size_t)(nl - buf) : end;
            buf[q] = 0;
            if (json_array_append_new(lines, http_jstr(buf + p))) break;
            p = q + 1;
        }
        free(buf);
    }
    http_json(r, 200,
              json_pack("{s:s, s:i, s:o}", "job_id", e->v.id, "rank", (int)rank, "lines", lines));
}

/* ---- /jobs/{id}/trace --------------------------------------------------------------------- */
static void get_trace(hpd_http *h, const hpd_snap_job *e, const http_args *a, http_reply *r) {
    int64_t step;
    if (!http_arg(a, "step")) {
        http_error(r, 400, "step: missing (the step whose trace to get)");
        return;
    }
    if (!arg_int(a, "step", 0, INT64_MAX / 2, 0, &step, r)) return;
    int32_t ranks[64];
    int nr = 0;
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->key[i], "rank") != 0) continue;
        char *end;
        long v = strtol(a->val[i], &end, 10);
        if (!a->val[i][0] || *end || v < 0 || v >= e->v.world_size || nr == 64) {
            http_error(r, 400, "rank: '%.40s' is not a rank in [0, %d)", a->val[i],
                       e->v.world_size);
            return;
        }
        ranks[nr++] = (int32_t)v;
    }
    char *json = NULL;
    size_t len = 0;
    int64_t *steps = NULL;
    int ns = 0;
    hp_err err = {0};
    hp_status st =
        hp__trace_merge(h->state_dir, e->v.id, step, ranks, nr, &json, &len, &steps, &ns, &err);
    hp_free(steps);
    if (st != HP_OK) {
        /* too big: the request can ask for fewer ranks (rank=R, repeated) */
        http_error(r, (unsigned)hp_status_http(st), "%s", err.msg);
        return;
    }
    char *body = malloc(len + 1);
    if (!body) {
        hp_free(json);
        http_error(r, 500, "out of memory");
        return;
    }
    memcpy(body, json, len + 1);
    hp_free(json);
    free(r->body);
    *r = (http_reply){.status = 200, .type = "application/json", .body = body, .len = len};
}

/* ---- routing ------------------------------------------------------------------------------ */
void http_api(hpd_http *h, const hpd_snap *s, const char *path, const http_args *a, http_reply *r) {
    if (!strcmp(path, "jobs") || !strcmp(path, "jobs/")) {
        list_jobs(s, a, r);
        return;
    }
    if (strncmp(path, "jobs/", 5) != 0) {
        http_error(r, 404, "no such path '/api/v1/%.200s' (see /api/v1/jobs)", path);
        return;
    }
    const char *id = path + 5, *slash = strchr(id, '/');
    size_t idn = slash ? (size_t)(slash - id) : strlen(id);
    char idbuf[HPD_ID_MAX];
    if (idn == 0 || idn >= sizeof idbuf) {
        http_error(r, 404, "no job '%.*s'", (int)(idn > 60 ? 60 : idn), id);
        return;
    }
    memcpy(idbuf, id, idn);
    idbuf[idn] = 0;
    const hpd_snap_job *e = hpd_snap_find(s, idbuf);
    if (!e) {
        http_error(r, 404, "no job '%s'", idbuf);
        return;
    }
    const char *sub = slash ? slash + 1 : "";
    if (!*sub)
        get_job(h, e, r);
    else if (!strcmp(sub, "metrics"))
        get_metrics(h, e, a, r);
    else if (!strcmp(sub, "logs"))
        get_logs(h, e, a, r);
    else if (!strcmp(sub, "trace"))
        get_trace(h, e, a, r);
    else
        http_error(r, 404, "no such path '/api/v1/jobs/%s/%.100s' (metrics, logs, trace)", idbuf,
                   sub);
}
