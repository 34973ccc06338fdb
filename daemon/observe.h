/* daemon/observe.h — what the coordinator knows about its jobs, as an immutable snapshot for
 * readers on other threads (the HTTP server).
 *
 * The loop keeps running statistics per job (counters, the last metrics record of each rank,
 * a histogram of step seconds, an ETA) and publishes every 250 ms a snapshot: an array of
 * refcounted, immutable per-job entries. An entry is rebuilt only for jobs that changed (or
 * are active: their heartbeat ages move), so publishing costs O(active jobs) plus an array of
 * pointers. Readers take a reference (hpd_snap_get), read without locks and drop it
 * (hpd_snap_put); the last reference frees.
 */
#ifndef HP_DAEMON_OBSERVE_H
#define HP_DAEMON_OBSERVE_H

#include "daemon/hpd.h"

#include "hp/v1/telemetry.pb-c.h"

#include <stdint.h>

/* Upper bounds (seconds) of the step-time histogram's buckets; +Inf is implied. */
#define HPD_HIST_N 14
extern const double hpd_hist_bounds[HPD_HIST_N];

/* One metrics record, flattened. */
typedef struct hpd_mrec {
    int64_t step;
    int32_t rank;
    double loss, loss_max, grad_norm, lr, tokens_per_s, tflops, mfu_pct, peak_memory_pct;
    double step_time_s, data_time_s, exposed_comm_s, time_unix_s;
    int64_t peak_memory_bytes, tokens;
    double eval_loss; /* NaN: no evaluation after this step */
} hpd_mrec;

void hpd_mrec_from(hpd_mrec *r, const Hp__V1__StepMetrics *m);

typedef struct hpd_snap_rank {
    int rank;
    bool up;               /* connected and said hello */
    double last_seen_unix; /* last frame from it (0: never) */
    int64_t step;          /* from heartbeats and metrics */
    bool has_metrics;
    hpd_mrec last;
} hpd_snap_rank;

typedef struct hpd_snap_job {
    int refs; /* atomic */
    hpd_job_view v;
    bool has_last; /* last: the latest record of the lowest rank reporting */
    hpd_mrec last;
    bool has_eval; /* the latest evaluation (train.eval_interval): its loss and step */
    double eval_loss;
    int64_t eval_step;
    int64_t steps_total, tokens_total;
    uint64_t hist[HPD_HIST_N + 1]; /* cumulative counts are made when printed */
    double hist_sum;
    uint64_t hist_count;
    double eta_s;           /* < 0: unknown */
    double finished_unix_s; /* 0: not finished */
    int n_ranks;            /* ranks of the current attempt (0: none running) */
    hpd_snap_rank ranks[];
} hpd_snap_job;

typedef struct hpd_snap {
    int refs; /* atomic */
    int n_jobs;
    hpd_snap_job **jobs; /* oldest first */
    int64_t metrics_records_total;
    int slots, slots_used, watches;
    int gpus, gpus_used; /* gpus -1: not counted (a launcher other than local) */
} hpd_snap;

/* ---- loop side ---- */
struct hpd_job;
typedef struct hpd_obs hpd_obs;
typedef struct hpd_jstats hpd_jstats; /* per job, owned by the hpd_job */

hp_status hp__obs_new(hpd_obs **out, hp_err *err);
void hp__obs_free(hpd_obs *o);
/* Rebuilds what changed and publishes a new snapshot. */
void hp__obs_publish(hpd *d);
/* Statistics hooks (loop thread). */
void hp__obs_metrics(hpd *d, struct hpd_job *j, const Hp__V1__StepMetrics *m);
void hp__obs_job_changed(struct hpd_job *j); /* state, restarts, attempt: rebuild its entry */
void hp__obs_job_free(struct hpd_job *j);

/* ---- reader side (any thread) ---- */
hpd_snap *hpd_snap_get(hpd_obs *o); /* NULL before the first publish */
void hpd_snap_put(hpd_snap *s);
const hpd_snap_job *hpd_snap_find(const hpd_snap *s, const char *id);

#endif
