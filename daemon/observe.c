/* daemon/observe.c — per-job statistics on the loop thread and the snapshot the HTTP threads
 * read (see observe.h).
 */
#include "daemon/observe.h"
#include "daemon/core.h"
#include "daemon/jobsm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const double hpd_hist_bounds[HPD_HIST_N] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60,   300};

struct hpd_obs {
    pthread_mutex_t mu; /* guards cur */
    hpd_snap *cur;
};

struct hpd_jstats {
    bool has_last;
    hpd_mrec last;
    bool has_eval;
    double eval_loss;
    int64_t eval_step;
    int64_t steps_total, tokens_total, counted_step;
    uint64_t hist[HPD_HIST_N + 1];
    double hist_sum;
    uint64_t hist_count;
    double step_ema; /* seconds per step, for the ETA */
    int n_ranks;
    bool *rank_has;
    hpd_mrec *rank_last;
};

void hpd_mrec_from(hpd_mrec *r, const Hp__V1__StepMetrics *m) {
    *r = (hpd_mrec){
        .step = m->step,
        .rank = m->rank,
        .loss = m->loss,
        .loss_max = m->loss_max,
        .grad_norm = m->grad_norm,
        .lr = m->lr,
        .tokens_per_s = m->tokens_per_s,
        .tflops = m->tflops,
        .mfu_pct = m->mfu_pct,
        .peak_memory_pct = m->peak_memory_pct,
        .step_time_s = m->step_time_s,
        .data_time_s = m->data_time_s,
        .exposed_comm_s = m->exposed_comm_s,
        .time_unix_s = m->time_unix_s,
        .peak_memory_bytes = m->peak_memory_bytes,
        .tokens = m->tokens,
        .eval_loss = m->evaluated ? m->eval_loss : NAN,
    };
}

/* ---- snapshots (any thread) ----------------------------------------------------------- */
static void entry_put(hpd_snap_job *e) {
    if (e && __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) hp_free(e);
}

static void entry_ref(hpd_snap_job *e) {
    __atomic_add_fetch(&e->refs, 1, __ATOMIC_RELAXED);
}

void hpd_snap_put(hpd_snap *s) {
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (int i = 0; i < s->n_jobs; i++) entry_put(s->jobs[i]);
    hp_free(s->jobs);
    hp_free(s);
}

hpd_snap *hpd_snap_get(hpd_obs *o) {
    if (!o) return NULL;
    pthread_mutex_lock(&o->mu);
    hpd_snap *s = o->cur;
    if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&o->mu);
    return s;
}

const hpd_snap_job *hpd_snap_find(const hpd_snap *s, const char *id) {
    if (!s || !id) return NULL;
    /* Ids are "j-%06d" in submission order and jobs are oldest first: try the index the
     * number suggests before scanning (ids start at 1, none is ever deleted). */
    if (strncmp(id, "j-", 2) == 0) {
        char *end;
        long n = strtol(id + 2, &end, 10);
        if (*end == 0 && n >= 1 && n <= s->n_jobs && strcmp(s->jobs[n - 1]->v.id, id) == 0)
            return s->jobs[n - 1];
    }
    for (int i = 0; i < s->n_jobs; i++)
        if (strcmp(s->jobs[i]->v.id, id) == 0) return s->jobs[i];
    return NULL;
}

hp_status hp__obs_new(hpd_obs **out, hp_err *err) {
    hpd_obs *o = hp_calloc(1, sizeof *o);
    if (!o) return hp_errf(err, HP_NOMEM, "observe: out of memory");
    pthread_mutex_init(&o->mu, NULL);
    *out = o;
    return HP_OK;
}

void hp__obs_free(hpd_obs *o) {
    if (!o) return;
    hpd_snap_put(o->cur);
    pthread_mutex_destroy(&o->mu);
    hp_free(o);
}

/* ---- statistics (loop thread) --------------------------------------------------------- */
static hpd_jstats *stats_of(hpd_job *j) {
    if (j->stats) return j->stats;
    int n = j->v.world_size > 0 ? j->v.world_size : 1;
    hpd_jstats *s = hp_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->rank_has = hp_calloc((size_t)n, sizeof *s->rank_has);
    s->rank_last = hp_calloc((size_t)n, sizeof *s->rank_last);
    if (!s->rank_has || !s->rank_last) {
        hp_free(s->rank_has);
        hp_free(s->rank_last);
        hp_free(s);
        return NULL;
    }
    s->n_ranks = n;
    s->step_ema = -1;
    j->stats = s;
    return s;
}

void hp__obs_metrics(hpd *d, hpd_job *j, const Hp__V1__StepMetrics *m) {
    d->metrics_records_total++;
    hpd_jstats *s = stats_of(j);
    if (!s) return;
    j->obs_dirty = true;
    if (m->tokens > 0) s->tokens_total += m->tokens;
    if (m->rank >= 0 && m->rank < s->n_ranks) {
        s->rank_has[m->rank] = true;
        hpd_mrec_from(&s->rank_last[m->rank], m);
    }
    if (m->rank > 0) return;
    /* The job's own series: the aggregated record (-1) or rank 0's. */
    hpd_mrec_from(&s->last, m);
    s->has_last = true;
    if (m->evaluated) {
        s->has_eval = true;
        s->eval_loss = m->eval_loss;
        s->eval_step = m->step;
    }
    if (m->step <= s->counted_step) return; /* a restarted attempt re-running steps */
    int64_t delta = m->step - s->counted_step;
    s->counted_step = m->step;
    s->steps_total += delta;
    double t = m->step_time_s;
    if (!(t >= 0)) return;
    int b = 0;
    while (b < HPD_HIST_N && t > hpd_hist_bounds[b]) b++;
    s->hist[b] += (uint64_t)delta;
    s->hist_sum += t * (double)delta;
    s->hist_count += (uint64_t)delta;
    s->step_ema = s->step_ema < 0 ? t : 0.8 * s->step_ema + 0.2 * t;
}

void hp__obs_job_changed(hpd_job *j) {
    j->obs_dirty = true;
}

void hp__obs_job_free(hpd_job *j) {
    if (j->stats) {
        hp_free(j->stats->rank_has);
        hp_free(j->stats->rank_last);
        hp_free(j->stats);
        j->stats = NULL;
    }
    entry_put(j->snap);
    j->snap = NULL;
}

static hpd_snap_job *entry_build(hpd_job *j, double now_unix, uint64_t now_ms) {
    int n = j->ranks ? j->v.world_size : 0;
    hpd_snap_job *e = hp_calloc(1, sizeof *e + (size_t)n * sizeof(hpd_snap_rank));
    if (!e) return NULL;
    e->refs = 1;
    e->v = j->v;
    e->eta_s = -1;
    const hpd_jstats *s = j->stats;
    if (s) {
        e->has_last = s->has_last;
        e->last = s->last;
        e->has_eval = s->has_eval;
        e->eval_loss = s->eval_loss;
        e->eval_step = s->eval_step;
        e->steps_total = s->steps_total;
        e->tokens_total = s->tokens_total;
        memcpy(e->hist, s->hist, sizeof e->hist);
        e->hist_sum = s->hist_sum;
        e->hist_count = s->hist_count;
        if (j->v.state == HP__V1__JOB_STATE__JOB_STATE_RUNNING && s->step_ema >= 0 &&
            j->v.total_steps > 0)
            e->eta_s = (double)(j->v.total_steps > j->v.step ? j->v.total_steps - j->v.step : 0) *
                       s->step_ema;
    }
    if (hpd_sm_is_final(j->v.state)) e->finished_unix_s = j->v.updated_unix_s;
    e->n_ranks = n;
    for (int r = 0; r < n; r++) {
        const hpd_rank *rk = &j->ranks[r];
        hpd_snap_rank *o = &e->ranks[r];
        o->rank = r;
        o->up = rk->conn && rk->hello;
        if (rk->last_seen_ms && rk->last_seen_ms <= now_ms)
            o->last_seen_unix = now_unix - (double)(now_ms - rk->last_seen_ms) / 1e3;
        o->step = rk->step;
        if (s && r < s->n_ranks && s->rank_has[r]) {
            o->has_metrics = true;
            o->last = s->rank_last[r];
            if (o->last.step > o->step) o->step = o->last.step;
        }
    }
    return e;
}

void hp__obs_publish(hpd *d) {
    hpd_obs *o = d->obs;
    if (!o) return;
    double now_unix = hp__unix_s();
    uint64_t now_ms = hp__now_ms();
    bool changed = false;
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (j->snap && !j->obs_dirty && !j->ranks) continue;
        hpd_snap_job *e = entry_build(j, now_unix, now_ms);
        if (!e) continue; /* out of memory: the old entry stays */
        entry_put(j->snap);
        j->snap = e;
        j->obs_dirty = false;
        changed = true;
    }
    pthread_mutex_lock(&o->mu);
    bool same = o->cur && o->cur->n_jobs == d->n_jobs && !changed && o->cur->slots == d->slots &&
                o->cur->slots_used == d->slots_used && o->cur->gpus_used == d->gpus_used &&
                o->cur->metrics_records_total == d->metrics_records_total &&
                o->cur->watches == d->n_watches;
    pthread_mutex_unlock(&o->mu);
    if (same) return;
    hpd_snap *s = hp_calloc(1, sizeof *s);
    hpd_snap_job **jobs = hp_malloc(sizeof *jobs * (size_t)(d->n_jobs ? d->n_jobs : 1));
    if (!s || !jobs) {
        hp_free(s);
        hp_free(jobs);
        return;
    }
    s->refs = 1;
    s->jobs = jobs;
    for (hpd_job *j = d->jobs; j; j = j->next) {
        if (!j->snap) continue;
        entry_ref(j->snap);
        s->jobs[s->n_jobs++] = j->snap;
    }
    s->metrics_records_total = d->metrics_records_total;
    s->slots = d->slots;
    s->slots_used = d->slots_used;
    s->gpus = d->gpus;
    s->gpus_used = d->gpus_used;
    s->watches = d->n_watches;
    pthread_mutex_lock(&o->mu);
    hpd_snap *old = o->cur;
    o->cur = s;
    pthread_mutex_unlock(&o->mu);
    hpd_snap_put(old);
}
