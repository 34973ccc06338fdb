/* daemon/http_prom.c — GET /metrics: the Prometheus text exposition (format 0.0.4) of the
 * snapshot. Names start with hp_, are in base units (seconds, bytes, ratios), counters end in
 * _total; per-job series carry job_id (never `job`: Prometheus owns that label) and per-rank
 * series job_id and rank. Jobs that finished more than the retention ago leave the exposition,
 * so the number of series is bounded by the recently active jobs.
 */
#include "daemon/core.h"
#include "daemon/http_internal.h"
#include "daemon/jobsm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HPD_VERSION
#define HPD_VERSION "0.0.0"
#endif

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A sample value: Go's float syntax, NaN and ±Inf spelled as Prometheus wants them. */
static void sb_val(sbuf *b, double v) {
    if (isnan(v))
        sb_put(b, " NaN\n", 5);
    else if (isinf(v))
        sb_put(b, v > 0 ? " +Inf\n" : " -Inf\n", 6);
    else
        sb_printf(b, " %.17g\n", v);
}

/* A label value, escaped (\\, \", \n); invalid UTF-8 bytes become '?'. */
static void sb_label(sbuf *b, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\')
            sb_put(b, "\\\\", 2);
        else if (c == '"')
            sb_put(b, "\\\"", 2);
        else if (c == '\n')
            sb_put(b, "\\n", 2);
        else if (c < 0x20 || c == 0x7f)
            sb_put(b, "?", 1);
        else
            sb_put(b, (const char *)&c, 1);
    }
}

static void family(sbuf *b, const char *name, const char *type, const char *help) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void job_sample(sbuf *b, const char *name, const hpd_snap_job *e, double v) {
    sb_printf(b, "%s{job_id=\"%s\"}", name, e->v.id);
    sb_val(b, v);
}

static void rank_sample(sbuf *b, const char *name, const hpd_snap_job *e, int rank, double v) {
    sb_printf(b, "%s{job_id=\"%s\",rank=\"%d\"}", name, e->v.id, rank);
    sb_val(b, v);
}

/* The jobs the exposition covers: not finished, or finished within the retention. */
static int pick_jobs(hpd_http *h, const hpd_snap *s, const hpd_snap_job **out, double now) {
    int n = 0;
    for (int i = 0; i < s->n_jobs; i++) {
        const hpd_snap_job *e = s->jobs[i];
        double keep;
        __atomic_load(&h->retention_s, &keep, __ATOMIC_RELAXED);
        if (e->finished_unix_s > 0 && now - e->finished_unix_s > keep) continue;
        out[n++] = e;
    }
    return n;
}

void http_prom(hpd_http *h, const hpd_snap *s, http_reply *r) {
    double now = hp__unix_s();
    const hpd_snap_job **jobs = malloc(sizeof *jobs * (size_t)(s->n_jobs ? s->n_jobs : 1));
    if (!jobs) {
        http_error(r, 500, "out of memory");
        return;
    }
    int n = pick_jobs(h, s, jobs, now);
    sbuf b = {0};

    /* ---- the daemon ---- */
    family(&b, "hp_build_info", "gauge", "The version of hpd, as a label.");
    sb_printf(&b, "hp_build_info{version=\"%s\"} 1\n", HPD_VERSION);
    family(&b, "hp_slots", "gauge", "Ranks hpd may run at once (--slots).");
    sb_printf(&b, "hp_slots %d\n", s->slots);
    family(&b, "hp_slots_used", "gauge", "Ranks of running jobs.");
    sb_printf(&b, "hp_slots_used %d\n", s->slots_used);
    if (s->gpus >= 0) { /* the local launcher's (the others place GPUs themselves) */
        family(&b, "hp_gpus", "gauge", "GPUs hpd hands to cuda ranks (--gpus).");
        sb_printf(&b, "hp_gpus %d\n", s->gpus);
        family(&b, "hp_gpus_used", "gauge", "GPUs held by running cuda jobs.");
        sb_printf(&b, "hp_gpus_used %d\n", s->gpus_used);
    }
    family(&b, "hp_watch_streams", "gauge", "Open WatchJob streams.");
    sb_printf(&b, "hp_watch_streams %d\n", s->watches);
    family(&b, "hp_metrics_records_total", "counter",
           "Metrics records received from workers since hpd started.");
    sb_printf(&b, "hp_metrics_records_total %lld\n", (long long)s->metrics_records_total);
    int by_state[9] = {0};
    for (int i = 0; i < s->n_jobs; i++)
        if (s->jobs[i]->v.state >= 0 && s->jobs[i]->v.state <= 8) by_state[s->jobs[i]->v.state]++;
    family(&b, "hp_jobs_submitted_total", "counter", "Jobs ever submitted to this state dir.");
    sb_printf(&b, "hp_jobs_submitted_total %d\n", s->n_jobs);
    family(&b, "hp_jobs_finished_total", "counter",
           "Jobs that reached a final state, by that state.");
    for (int st = 6; st <= 8; st++) {
        sb_printf(&b, "hp_jobs_finished_total{state=\"%s\"} %d\n",
                  hpd_sm_state_str((Hp__V1__JobState)st), by_state[st]);
    }
    family(&b, "hp_jobs", "gauge", "Jobs by their current state.");
    for (int st = 1; st <= 8; st++)
        sb_printf(&b, "hp_jobs{state=\"%s\"} %d\n", hpd_sm_state_str((Hp__V1__JobState)st),
                  by_state[st]);

    /* ---- per job ---- */
    family(&b, "hp_job_info", "gauge",
           "One series per job (running or recently finished): its name and state as labels.");
    for (int i = 0; i < n; i++) {
        sb_printf(&b, "hp_job_info{job_id=\"%s\",name=\"", jobs[i]->v.id);
        sb_label(&b, jobs[i]->v.name);
        sb_printf(&b, "\",state=\"%s\"} 1\n", hpd_sm_state_str(jobs[i]->v.state));
    }
    family(&b, "hp_job_step", "gauge", "The job's latest completed step.");
    for (int i = 0; i < n; i++) job_sample(&b, "hp_job_step", jobs[i], (double)jobs[i]->v.step);
    family(&b, "hp_job_total_steps", "gauge", "The steps the job trains for.");
    for (int i = 0; i < n; i++)
        job_sample(&b, "hp_job_total_steps", jobs[i], (double)jobs[i]->v.total_steps);
    family(&b, "hp_job_steps_total", "counter", "Training steps completed (counted once).");
    for (int i = 0; i < n; i++)
        job_sample(&b, "hp_job_steps_total", jobs[i], (double)jobs[i]->steps_total);
    family(&b, "hp_job_tokens_total", "counter", "Tokens processed, all ranks together.");
    for (int i = 0; i < n; i++)
        job_sample(&b, "hp_job_tokens_total", jobs[i], (double)jobs[i]->tokens_total);
    family(&b, "hp_job_restarts_total", "counter", "Restarts after a worker failure.");
    for (int i = 0; i < n; i++)
        job_sample(&b, "hp_job_restarts_total", jobs[i], (double)jobs[i]->v.restarts);
    family(&b, "hp_job_loss", "gauge", "Training loss (global mean) at the latest step.");
    for (int i = 0; i < n; i++)
        if (jobs[i]->has_last) job_sample(&b, "hp_job_loss", jobs[i], jobs[i]->last.loss);
    family(&b, "hp_job_eval_loss", "gauge",
           "Held-out loss of the latest evaluation (train.eval_interval).");
    for (int i = 0; i < n; i++)
        if (jobs[i]->has_eval) job_sample(&b, "hp_job_eval_loss", jobs[i], jobs[i]->eval_loss);
    family(&b, "hp_job_grad_norm", "gauge", "Global gradient norm before clipping.");
    for (int i = 0; i < n; i++)
        if (jobs[i]->has_last) job_sample(&b, "hp_job_grad_norm", jobs[i], jobs[i]->last.grad_norm);
    family(&b, "hp_job_learning_rate", "gauge", "Learning rate at the latest step.");
    for (int i = 0; i < n; i++)
        if (jobs[i]->has_last) job_sample(&b, "hp_job_learning_rate", jobs[i], jobs[i]->last.lr);
    family(&b, "hp_job_tokens_per_second", "gauge", "Throughput, all ranks together.");
    for (int i = 0; i < n; i++) {
        double t = 0;
        bool any = false;
        for (int k = 0; k < jobs[i]->n_ranks; k++)
            if (jobs[i]->ranks[k].has_metrics) {
                t += jobs[i]->ranks[k].last.tokens_per_s;
                any = true;
            }
        if (any) job_sample(&b, "hp_job_tokens_per_second", jobs[i], t);
    }
    family(&b, "hp_job_eta_seconds", "gauge", "Estimated time to the last step (running jobs).");
    for (int i = 0; i < n; i++)
        if (jobs[i]->eta_s >= 0) job_sample(&b, "hp_job_eta_seconds", jobs[i], jobs[i]->eta_s);
    family(&b, "hp_job_step_seconds", "histogram", "Wall time of a training step.");
    for (int i = 0; i < n; i++) {
        const hpd_snap_job *e = jobs[i];
        uint64_t cum = 0;
        for (int k = 0; k <= HPD_HIST_N; k++) {
            cum += e->hist[k];
            if (k < HPD_HIST_N)
                sb_printf(&b, "hp_job_step_seconds_bucket{job_id=\"%s\",le=\"%g\"} %llu\n", e->v.id,
                          hpd_hist_bounds[k], (unsigned long long)cum);
            else
                sb_printf(&b, "hp_job_step_seconds_bucket{job_id=\"%s\",le=\"+Inf\"} %llu\n",
                          e->v.id, (unsigned long long)cum);
        }
        sb_printf(&b, "hp_job_step_seconds_sum{job_id=\"%s\"}", e->v.id);
        sb_val(&b, e->hist_sum);
        sb_printf(&b, "hp_job_step_seconds_count{job_id=\"%s\"} %llu\n", e->v.id,
                  (unsigned long long)e->hist_count);
    }

    /* ---- per rank (ranks of a running attempt) ---- */
    family(&b, "hp_rank_up", "gauge", "1 while the rank is connected to hpd.");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < jobs[i]->n_ranks; k++)
            rank_sample(&b, "hp_rank_up", jobs[i], k, jobs[i]->ranks[k].up);
    family(&b, "hp_rank_heartbeat_age_seconds", "gauge", "Time since the rank was last heard.");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < jobs[i]->n_ranks; k++)
            if (jobs[i]->ranks[k].last_seen_unix > 0) {
                double age = now - jobs[i]->ranks[k].last_seen_unix;
                rank_sample(&b, "hp_rank_heartbeat_age_seconds", jobs[i], k, age > 0 ? age : 0);
            }
    family(&b, "hp_rank_step", "gauge", "The rank's latest step.");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < jobs[i]->n_ranks; k++)
            rank_sample(&b, "hp_rank_step", jobs[i], k, (double)jobs[i]->ranks[k].step);
    struct {
        const char *name, *help;
        int field;
    } rank_gauges[] = {
        {"hp_rank_tokens_per_second", "The rank's throughput.", 0},
        {"hp_rank_mfu_ratio", "Model FLOPs utilization of the rank's device (0..1).", 1},
        {"hp_rank_peak_memory_bytes", "Peak memory of the rank's device.", 2},
        {"hp_rank_step_seconds", "The rank's latest step time.", 3},
        {"hp_rank_exposed_comm_seconds", "Communication not hidden behind compute, per step.", 4},
    };
    for (size_t g = 0; g < HP_ARRAY_LEN(rank_gauges); g++) {
        family(&b, rank_gauges[g].name, "gauge", rank_gauges[g].help);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < jobs[i]->n_ranks; k++) {
                const hpd_snap_rank *rk = &jobs[i]->ranks[k];
                if (!rk->has_metrics) continue;
                double v = g == 0   ? rk->last.tokens_per_s
                           : g == 1 ? rk->last.mfu_pct / 100
                           : g == 2 ? (double)rk->last.peak_memory_bytes
                           : g == 3 ? rk->last.step_time_s
                                    : rk->last.exposed_comm_s;
                rank_sample(&b, rank_gauges[g].name, jobs[i], k, v);
            }
    }
    free(jobs);
    if (b.oom) {
        free(b.p);
        http_error(r, 500, "out of memory");
        return;
    }
    free(r->body);
    *r = (http_reply){
        .status = 200, .type = "text/plain; version=0.0.4; charset=utf-8", .body = b.p, .len = b.n};
}
