/* worker/trace.c — the per-step trace recorder and its Chrome JSON form (see trace.h). Slices
 * go into one growing array under a mutex; the document is built with jansson at the end of
 * the step, so the hot path is a copy of a short name and two doubles. */
#include "worker/trace.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define NAME_MAX_HP 64 /* longer names are cut (op names are far shorter) */

typedef struct slice {
    double start_s, end_s; /* CLOCK_MONOTONIC */
    int64_t bytes;
    int32_t instr;
    int track;
    char name[NAME_MAX_HP];
} slice;

struct hp_trace {
    int rank;
    char *job;
    atomic_bool recording;
    int64_t step;
    double offset_s; /* CLOCK_REALTIME - CLOCK_MONOTONIC at the step's start */
    pthread_mutex_t mu;
    slice *slices;
    size_t n, cap;
    int64_t dropped; /* slices lost to out-of-memory while recording */
};

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double hp_trace_now_s(void) {
    return clock_s(CLOCK_MONOTONIC);
}

hp_status hp_trace_new(int rank, const char *job, hp_trace **out, hp_err *err) {
    *out = NULL;
    hp_trace *t = hp_calloc(1, sizeof *t);
    if (!t) return hp_errf(err, HP_NOMEM, "trace: out of memory");
    t->job = hp_strdup(job ? job : "");
    if (!t->job) {
        hp_free(t);
        return hp_errf(err, HP_NOMEM, "trace: out of memory");
    }
    t->rank = rank;
    atomic_init(&t->recording, false);
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return HP_OK;
}

void hp_trace_free(hp_trace *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    hp_free(t->slices);
    hp_free(t->job);
    hp_free(t);
}

void hp_trace_begin(hp_trace *t, int64_t step) {
    pthread_mutex_lock(&t->mu);
    t->n = 0;
    t->dropped = 0;
    t->step = step;
    /* the two clocks read back to back: their difference is the same on every rank of a host */
    double mono = clock_s(CLOCK_MONOTONIC);
    t->offset_s = clock_s(CLOCK_REALTIME) - mono;
    atomic_store(&t->recording, true);
    pthread_mutex_unlock(&t->mu);
}

bool hp_trace_recording(const hp_trace *t) {
    return t && atomic_load_explicit(&((hp_trace *)t)->recording, memory_order_relaxed);
}

int64_t hp_trace_step(const hp_trace *t) {
    return t->step;
}

void hp_trace_add(hp_trace *t, int track, const char *name, double start_s, double end_s,
                  int32_t instr, int64_t bytes) {
    if (!hp_trace_recording(t)) return;
    pthread_mutex_lock(&t->mu);
    if (!atomic_load(&t->recording)) goto out; /* the step ended meanwhile */
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        slice *s = hp_realloc(t->slices, cap * sizeof *s);
        if (!s) {
            t->dropped++;
            goto out;
        }
        t->slices = s;
        t->cap = cap;
    }
    slice *s = &t->slices[t->n++];
    s->track = track == HP_TRACE_COMM ? HP_TRACE_COMM : HP_TRACE_COMPUTE;
    s->start_s = start_s;
    s->end_s = end_s;
    s->instr = instr;
    s->bytes = bytes;
    snprintf(s->name, sizeof s->name, "%s", name && name[0] ? name : "(unnamed)");
out:
    pthread_mutex_unlock(&t->mu);
}

/* ---- the document ---------------------------------------------------------------------------- */

/* A JSON string of any bytes: jansson refuses invalid UTF-8, so such a name keeps its ASCII
 * and shows '?' for the rest. */
static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    char buf[NAME_MAX_HP * 2];
    size_t i = 0;
    for (; s[i] && i + 1 < sizeof buf; i++) buf[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    buf[i] = 0;
    return json_string(buf);
}

/* json_object_set_new that remembers a failure instead of returning it at every call. */
static void set(json_t *o, const char *key, json_t *v, bool *ok) {
    if (!o) json_decref(v); /* json_object_set_new takes v even when it fails */
    if (!v || !o || json_object_set_new(o, key, v) != 0) *ok = false;
}

static void push(json_t *a, json_t *v, bool *ok) {
    if (!v || json_array_append_new(a, v) != 0) *ok = false;
}

static json_t *meta(const char *what, int rank, int tid, const char *key, json_t *value, bool *ok) {
    json_t *e = json_object(), *args = json_object();
    set(e, "ph", json_string("M"), ok);
    set(e, "name", json_string(what), ok);
    set(e, "pid", json_integer(rank), ok);
    if (tid > 0) set(e, "tid", json_integer(tid), ok);
    set(args, key, value, ok);
    set(e, "args", args, ok);
    return e;
}

static json_t *slice_event(const hp_trace *t, const slice *s, bool *ok) {
    json_t *e = json_object(), *args = json_object();
    double dur = (s->end_s - s->start_s) * 1e6;
    set(e, "ph", json_string("X"), ok);
    set(e, "name", jstr(s->name), ok);
    set(e, "cat", json_string(s->track == HP_TRACE_COMM ? "comm" : "compute"), ok);
    set(e, "pid", json_integer(t->rank), ok);
    set(e, "tid", json_integer(s->track), ok);
    set(e, "ts", json_real((s->start_s + t->offset_s) * 1e6), ok);
    set(e, "dur", json_real(dur > 0 ? dur : 0), ok);
    if (s->instr >= 0) set(args, "instr", json_integer(s->instr), ok);
    if (s->bytes >= 0) set(args, "bytes", json_integer(s->bytes), ok);
    set(e, "args", args, ok);
    return e;
}

/* The document with the first `keep` slices, dumped: *out is malloc'd (jansson's). */
static char *dump(const hp_trace *t, size_t keep, int64_t dropped) {
    bool ok = true;
    json_t *doc = json_object(), *ev = json_array(), *other = json_object();
    if (!doc || !ev || !other) ok = false;
    char pname[32];
    snprintf(pname, sizeof pname, "rank %d", t->rank);
    if (ev) {
        push(ev, meta("process_name", t->rank, 0, "name", json_string(pname), &ok), &ok);
        push(ev, meta("process_sort_index", t->rank, 0, "sort_index", json_integer(t->rank), &ok),
             &ok);
        push(ev,
             meta("thread_name", t->rank, HP_TRACE_COMPUTE, "name", json_string("compute"), &ok),
             &ok);
        push(ev, meta("thread_name", t->rank, HP_TRACE_COMM, "name", json_string("comm"), &ok),
             &ok);
        for (size_t i = 0; i < keep && ok; i++) push(ev, slice_event(t, &t->slices[i], &ok), &ok);
    }
    set(other, "rank", json_integer(t->rank), &ok);
    set(other, "step", json_integer(t->step), &ok);
    set(other, "job", jstr(t->job), &ok);
    if (dropped > 0) set(other, "dropped_slices", json_integer(dropped), &ok);
    set(doc, "traceEvents", ev, &ok);
    set(doc, "displayTimeUnit", json_string("ms"), &ok);
    set(doc, "otherData", other, &ok);
    char *s = ok ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return s;
}

hp_status hp_trace_end(hp_trace *t, size_t max_bytes, char **json, size_t *len, int64_t *dropped,
                       hp_err *err) {
    *json = NULL;
    *len = 0;
    if (dropped) *dropped = 0;
    pthread_mutex_lock(&t->mu);
    bool was = atomic_exchange(&t->recording, false);
    pthread_mutex_unlock(&t->mu);
    if (!was) return hp_errf(err, HP_INVALID, "trace: no step is being recorded");
    /* no thread adds any more: the slices are ours */
    size_t keep = t->n;
    char *s = NULL;
    size_t n = 0;
    for (;;) {
        int64_t lost = t->dropped + (int64_t)(t->n - keep);
        if (!(s = dump(t, keep, lost)))
            return hp_errf(err, HP_NOMEM, "trace: out of memory writing step %lld",
                           (long long)t->step);
        n = strlen(s);
        if (!max_bytes || n <= max_bytes) break;
        free(s);
        s = NULL;
        if (keep == 0)
            return hp_errf(err, HP_LIMIT, "trace: step %lld: even an empty trace exceeds %zu bytes",
                           (long long)t->step, max_bytes);
        /* scale by the bytes per slice seen, with a margin; at least one fewer each round */
        double ratio = (double)max_bytes / (double)n * 0.95;
        size_t next = (size_t)((double)keep * ratio);
        keep = next < keep ? next : keep - 1;
    }
    *json = hp_malloc(n + 1);
    if (!*json) {
        free(s);
        return hp_errf(err, HP_NOMEM, "trace: out of memory (%zu bytes)", n + 1);
    }
    memcpy(*json, s, n + 1);
    free(s);
    *len = n;
    if (dropped) *dropped = t->dropped + (int64_t)(t->n - keep);
    return HP_OK;
}
