/* hp/metrics.h — the per-step metrics record: computing it, printing it, peak FLOPs.
 *
 * Definitions are torchtitan's (shared notes/training-facts.md): tps is per rank (this rank's
 * tokens over the wall time between logs), FLOPs per token 6 (N - embedding params) + 12 L d T,
 * tflops = FLOPs/token * tps / 1e12, mfu = 100 * FLOPs/token * tps / peak; memory is the peak
 * over the window in GiB and % of the device. This is the torchtitan convention, not llm.c's
 * (global tok/s, 6N + 6 L C T).
 *
 * The record is printed two ways: a torchtitan-style line for people,
 *   step: 10 loss: 7.3361 grad_norm: 1.23 lr: 8.0e-04 memory: 0.12GiB(0.8%) tps: 1,234
 *   tflops: 0.09 mfu: 4.1%
 * (one line), and one JSON object per line for files and tools, with the loss at full
 * precision (%.17g). The fields are listed once, in hp/metrics.def.
 *
 * Peak FLOPs: a table of GPUs by name (bf16 dense) and, for the CPU, a measured SGEMM rate
 * cached on disk; the backend's info reports the one of its device. An unknown device has no
 * peak (and the MFU prints "unknown"); it never borrows another device's number. MFU is never
 * above 100%: a window whose achieved FLOP/s exceed the peak proves the peak wrong, and its
 * MFU is unknown.
 */
#ifndef HP_METRICS_H
#define HP_METRICS_H

#include "hp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_metrics {
    int64_t step;   /* the last step of the window, 1-based */
    int rank;       /* who measured it */
    int64_t steps;  /* steps in the window */
    int64_t tokens; /* tokens this rank processed in the window */
#define X(field, key, unit, help) double field;
#include "hp/metrics.def"
#undef X
} hp_metrics;

/* What the training loop measured over one logging window (the steps since the last log). */
typedef struct hp_metrics_window {
    int64_t step;       /* last step of the window, >= 1 */
    int rank;           /* >= 0 */
    int64_t steps;      /* >= 1 */
    int64_t tokens;     /* this rank's tokens (labels.numel()), divided by any non-data-parallel
                           degree as torchtitan does; >= 0 */
    double wall_s;      /* wall seconds since the last log, > 0 */
    double data_s;      /* seconds waiting for data in the window, >= 0 */
    double comm_s;      /* exposed communication seconds in the window, >= 0 */
    double comm_busy_s; /* seconds the communication stream was busy in the window, >= 0 */
    double loss, loss_max, grad_norm, lr; /* of the last step; NaN allowed */
    double flops_per_token;               /* >= 0 (hp_flops_per_token) */
    double peak_flops;                    /* device peak FLOP/s; <= 0 or NaN: unknown */
    uint64_t memory_bytes;                /* peak over the window */
    uint64_t device_memory;               /* device size in bytes; 0: unknown */
    int64_t skipped_steps;                /* updates skipped so far (non-finite), >= 0 */
    bool has_eval;                        /* the last step was followed by an evaluation */
    double eval_loss;                     /* its loss (has_eval) */
} hp_metrics_window;

/* Fills *out from *w. Errors (HP_INVALID, naming the field): any bound above violated or a
 * time that is not finite. */
hp_status hp_metrics_compute(const hp_metrics_window *w, hp_metrics *out, hp_err *err);

/* 6 (n_params - n_embedding_params) + 12 n_layers dim seq_len (full T x T attention, no
 * causal halving). HP_INVALID on negative inputs or embedding params > params. */
hp_status hp_flops_per_token(int64_t n_params, int64_t n_embedding_params, int64_t n_layers,
                             int64_t dim, int64_t seq_len, double *out, hp_err *err);

#define HP_METRICS_LINE_MAX 1024

/* The torchtitan-style line (no newline): loss %.4f, grad_norm %.2f, lr %.1e, memory %.2f GiB
 * and %.1f %%, tps rounded with thousands separators, tflops %.2f, mfu %.1f %%; an unknown
 * value prints "unknown". HP_LIMIT if buf (len bytes) is too small; buf always terminated
 * when len > 0. */
hp_status hp_metrics_format(const hp_metrics *m, char *buf, size_t len, hp_err *err);

/* The record as one compact JSON object (no newline): "step", "rank", "steps", "tokens", then
 * every hp/metrics.def key in order; NaN and infinities as null; doubles with 17 significant
 * digits. HP_LIMIT if buf is too small, HP_NOMEM if jansson fails. */
hp_status hp_metrics_to_json(const hp_metrics *m, char *buf, size_t len, hp_err *err);

/* Parses what hp_metrics_to_json wrote. Missing or null fields become NaN (0 for the integer
 * ones); unknown keys are ignored. HP_PARSE on malformed JSON or a field of the wrong type. */
hp_status hp_metrics_from_json(const char *json, hp_metrics *out, hp_err *err);

/* ---- peak FLOPs ---------------------------------------------------------------------------- */

/* Dense bf16 peak of a GPU by its name as the driver reports it ("NVIDIA H100 80GB HBM3"),
 * matched as torchtitan's get_peak_flops does: A100 312e12; H100 989e12 (SXM), "PCIe"
 * 756e12, "NVL" 835e12; H200 989e12; B200 2.25e15. Anything else is HP_NOT_FOUND ("peak FLOPs
 * of device '...' are unknown"), with *peak set to NaN. */
hp_status hp_gpu_peak_flops(const char *device_name, double *peak, hp_err *err);

/* The CPU's peak FLOP/s with n_threads threads (worker/cpu/cpu_peak.c): the kernels' tiled
 * SGEMM path (1024^3, OpenBLAS single-threaded, tiles on a pool of n_threads) rated by each
 * thread's CPU time, the best of several runs, so that other processes on the same cores
 * cannot shrink it. Cached in $XDG_CACHE_HOME/hp/ (else ~/.cache/hp/), one file per CPU model,
 * OpenBLAS core type and probe version, holding a figure per thread count. A cached figure
 * below the 1-thread figure, below one for fewer threads or above 1.5x linear scaling is
 * implausible and measured again; no figure below those floors is ever returned or cached.
 * The 1-thread figure is measured too when it is not cached. $HP_CPU_PEAK_FLOPS, if set to a
 * positive number, is returned as is. An unwritable cache is not an error (the value is just
 * not cached). Errors: n_threads outside [1, HP_POOL_MAX_THREADS] (HP_INVALID), no memory or
 * thread for the probe (HP_NOMEM, HP_INTERNAL), a bad $HP_CPU_PEAK_FLOPS (HP_INVALID); *peak
 * is NaN then. */
hp_status hp_cpu_peak_flops(int n_threads, double *peak, hp_err *err);

/* The CPU "device": this process's peak resident set size so far and the machine's physical
 * memory, in bytes. */
hp_status hp_cpu_memory(uint64_t *peak_rss, uint64_t *total, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
