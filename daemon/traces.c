/* daemon/traces.c — the ranks' Chrome traces of profiled steps: stored as they arrive (Trace
 * frames), merged into one document per step on request (GetTrace, GET .../trace).
 *
 * Layout: STATE_DIR/jobs/ID/traces/step-S-rank-R.json, one rank's {"traceEvents": [...]}.
 * The merge gives each rank its own process (pid = rank) and keeps the ranks' thread ids
 * (1 compute, 2 comm), so Perfetto shows one compute and one comm track per rank.
 */
#include "daemon/core.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRACE_FILES_MAX 4096 /* per job: a bound on what a listing walks */
/* The ranks' files merged into one reply at most: under the clients' 64 MiB receive limit,
 * and a bound on the memory one request takes. */
#define TRACE_MERGE_MAX ((int64_t)60 << 20)

static void traces_dir(char *out, size_t n, const char *state_dir, const char *id) {
    snprintf(out, n, "%.900s/jobs/%.40s/traces", state_dir, id);
}

void hp__trace_store(hpd *d, hpd_job *j, int rank, const Hp__V1__Trace *t) {
    if (t->step < 0 || t->chrome_json.len == 0) {
        hp__log("warn", "event=trace_dropped job=%s rank=%d why=\"step %lld, %zu bytes\"", j->v.id,
                rank, (long long)t->step, t->chrome_json.len);
        return;
    }
    json_error_t je;
    json_t *doc = json_loadb((const char *)t->chrome_json.data, t->chrome_json.len, 0, &je);
    bool ok = doc && json_is_array(json_object_get(doc, "traceEvents"));
    json_decref(doc);
    if (!ok) {
        hp__log("warn", "event=trace_dropped job=%s rank=%d step=%lld why=\"%s\"", j->v.id, rank,
                (long long)t->step, doc ? "no traceEvents array" : je.text);
        return;
    }
    char dir[1024], path[1100];
    traces_dir(dir, sizeof dir, d->state_dir, j->v.id);
    hp_err e = {0};
    if (hp_mkdir_p(dir, &e) != HP_OK) {
        hp__log("error", "event=trace_store_failed job=%s error=\"%s\"", j->v.id, e.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/step-%lld-rank-%d.json", dir, (long long)t->step, rank);
    if (hp_file_write_atomic(path, t->chrome_json.data, t->chrome_json.len, &e) != HP_OK) {
        hp__log("error", "event=trace_store_failed job=%s error=\"%s\"", j->v.id, e.msg);
        return;
    }
    hp__log("info", "event=trace job=%s rank=%d step=%lld bytes=%zu", j->v.id, rank,
            (long long)t->step, t->chrome_json.len);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static bool want_rank(const int32_t *ranks, int n, int r) {
    if (n == 0) return true;
    for (int i = 0; i < n; i++)
        if (ranks[i] == r) return true;
    return false;
}

/* Appends the events of one rank's file to out (pid forced to the rank). */
static hp_status merge_file(const char *path, int rank, json_t *out, hp_err *err) {
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) return hp_errf(err, HP_IO, "trace %s: %s", path, je.text);
    json_t *evs = json_object_get(doc, "traceEvents");
    size_t i;
    json_t *ev;
    hp_status st = HP_OK;
    json_array_foreach(evs, i, ev) {
        if (!json_is_object(ev)) continue;
        if (json_object_set_new(ev, "pid", json_integer(rank)) || json_array_append(out, ev)) {
            st = hp_errf(err, HP_NOMEM, "trace: out of memory");
            break;
        }
    }
    json_decref(doc);
    return st;
}

hp_status hp__trace_merge(const char *state_dir, const char *id, int64_t step, const int32_t *ranks,
                          int n_ranks, char **json, size_t *len, int64_t **steps, int *n_steps,
                          hp_err *err) {
    *json = NULL;
    *len = 0;
    *steps = NULL;
    *n_steps = 0;
    char dir[1024];
    traces_dir(dir, sizeof dir, state_dir, id);
    int64_t *st_list = hp_malloc(sizeof *st_list * TRACE_FILES_MAX);
    int32_t *rk_list = hp_malloc(sizeof *rk_list * TRACE_FILES_MAX);
    if (!st_list || !rk_list) {
        hp_free(st_list);
        hp_free(rk_list);
        return hp_errf(err, HP_NOMEM, "trace: out of memory");
    }
    int n = 0;
    DIR *dp = opendir(dir);
    if (dp) {
        struct dirent *de;
        while ((de = readdir(dp)) && n < TRACE_FILES_MAX) {
            long long s;
            int r, used = 0;
            if (sscanf(de->d_name, "step-%lld-rank-%d.json%n", &s, &r, &used) == 2 &&
                de->d_name[used] == 0 && s >= 0 && r >= 0) {
                st_list[n] = s;
                rk_list[n] = r;
                n++;
            }
        }
        closedir(dp);
    }
    /* The distinct steps, ascending. */
    int64_t *uniq = hp_malloc(sizeof *uniq * (size_t)(n ? n : 1));
    int nu = 0;
    if (uniq) {
        memcpy(uniq, st_list, sizeof *uniq * (size_t)n);
        qsort(uniq, (size_t)n, sizeof *uniq, cmp_i64);
        for (int i = 0; i < n; i++)
            if (nu == 0 || uniq[nu - 1] != uniq[i]) uniq[nu++] = uniq[i];
    }
    hp_status st = HP_OK;
    json_t *events = json_array(), *doc = NULL;
    int found = 0;
    if (!uniq || !events) {
        st = hp_errf(err, HP_NOMEM, "trace: out of memory");
        goto out;
    }
    /* Too big to merge into one reply? Sum the files first. */
    int64_t total = 0;
    int n_want = 0;
    for (int i = 0; i < n; i++) {
        if (st_list[i] != step || !want_rank(ranks, n_ranks, rk_list[i])) continue;
        char path[1100];
        struct stat sb;
        snprintf(path, sizeof path, "%s/step-%lld-rank-%d.json", dir, (long long)step, rk_list[i]);
        if (stat(path, &sb) == 0) total += (int64_t)sb.st_size;
        n_want++;
    }
    if (total > TRACE_MERGE_MAX) {
        st = hp_errf(err, HP_LIMIT,
                     "the trace of step %lld over %d ranks is %lld MiB, more than one reply "
                     "holds (%lld MiB): ask for fewer ranks",
                     (long long)step, n_want, (long long)(total >> 20),
                     (long long)(TRACE_MERGE_MAX >> 20));
        goto out;
    }
    /* Ranks in order, so the document reads rank 0 first. */
    for (int r = 0; st == HP_OK; r++) {
        int next = -1;
        for (int i = 0; i < n; i++)
            if (st_list[i] == step && rk_list[i] >= r && (next < 0 || rk_list[i] < next)) {
                next = rk_list[i];
            }
        if (next < 0) break;
        r = next;
        if (!want_rank(ranks, n_ranks, next)) continue;
        char path[1100];
        snprintf(path, sizeof path, "%s/step-%lld-rank-%d.json", dir, (long long)step, next);
        st = merge_file(path, next, events, err);
        found++;
    }
    if (st != HP_OK) goto out;
    if (!found) {
        char list[256] = "";
        size_t o = 0;
        for (int i = 0; i < nu && o < sizeof list - 24; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%lld", i ? ", " : "",
                                  (long long)uniq[i]);
        if (nu == 0)
            st = hp_errf(err, HP_NOT_FOUND,
                         "job %s has no traces (set train.profile_steps or hp-worker "
                         "--profile-steps)",
                         id);
        else
            st = hp_errf(err, HP_NOT_FOUND, "job %s has no trace of step %lld%s (traced steps: %s)",
                         id, (long long)step, n_ranks ? " for those ranks" : "", list);
        goto out;
    }
    doc = json_pack("{s:o, s:s, s:{s:s, s:I}}", "traceEvents", events, "displayTimeUnit", "ms",
                    "otherData", "job_id", id, "step", (json_int_t)step);
    events = NULL; /* the pack took it (and frees it on failure) */
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (!text) {
        st = hp_errf(err, HP_NOMEM, "trace: out of memory");
        goto out;
    }
    size_t tl = strlen(text);
    *json = hp_malloc(tl + 1);
    if (!*json) {
        free(text);
        st = hp_errf(err, HP_NOMEM, "trace: out of memory");
        goto out;
    }
    memcpy(*json, text, tl + 1);
    free(text);
    *len = tl;
out:
    json_decref(events);
    json_decref(doc);
    hp_free(st_list);
    hp_free(rk_list);
    if (st == HP_OK || st == HP_NOT_FOUND) {
        *steps = uniq;
        *n_steps = nu;
        if (!nu) {
            hp_free(uniq);
            *steps = NULL;
        }
    } else {
        hp_free(uniq);
    }
    return st;
}

hp_status hpd_trace(hpd *d, const char *id, int64_t step, const int32_t *ranks, int n_ranks,
                    char **json, size_t *len, int64_t **steps, int *n_steps, hp_err *err) {
    *json = NULL;
    *steps = NULL;
    *n_steps = 0;
    *len = 0;
    if (!hp__job_find(d, id)) return hp_errf(err, HP_NOT_FOUND, "no job %s", id ? id : "(null)");
    return hp__trace_merge(d->state_dir, id, step, ranks, n_ranks, json, len, steps, n_steps, err);
}
