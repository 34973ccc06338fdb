/* worker/metrics.c — the per-step metrics record: formulas, the torchtitan-style line, JSON.
 *
 * Peak FLOPs (the GPU table and the CPU probe) live in peak_flops.c. Nothing here prints:
 * the caller decides where the line and the JSON go.
 */
#include "hp/metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- formulas -------------------------------------------------------------------------------- */

hp_status hp_flops_per_token(int64_t n_params, int64_t n_embedding_params, int64_t n_layers,
                             int64_t dim, int64_t seq_len, double *out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "flops per token: out is NULL");
    if (n_params < 0 || n_embedding_params < 0 || n_layers < 0 || dim < 0 || seq_len < 0)
        return hp_errf(err, HP_INVALID,
                       "flops per token: negative input (params %lld, embedding %lld, layers "
                       "%lld, dim %lld, seq %lld)",
                       (long long)n_params, (long long)n_embedding_params, (long long)n_layers,
                       (long long)dim, (long long)seq_len);
    if (n_embedding_params > n_params)
        return hp_errf(err, HP_INVALID,
                       "flops per token: %lld embedding params exceed the %lld params in all",
                       (long long)n_embedding_params, (long long)n_params);
    *out = 6.0 * (double)(n_params - n_embedding_params) +
           12.0 * (double)n_layers * (double)dim * (double)seq_len;
    return HP_OK;
}

static int finite_nonneg(double x) {
    return isfinite(x) && x >= 0;
}

hp_status hp_metrics_compute(const hp_metrics_window *w, hp_metrics *out, hp_err *err) {
    if (!w || !out) return hp_errf(err, HP_INVALID, "metrics: NULL argument");
    if (w->step < 1)
        return hp_errf(err, HP_INVALID, "metrics: step %lld must be >= 1", (long long)w->step);
    if (w->rank < 0) return hp_errf(err, HP_INVALID, "metrics: rank %d must be >= 0", w->rank);
    if (w->steps < 1)
        return hp_errf(err, HP_INVALID, "metrics: window of %lld steps (must be >= 1)",
                       (long long)w->steps);
    if (w->tokens < 0)
        return hp_errf(err, HP_INVALID, "metrics: token count %lld is negative",
                       (long long)w->tokens);
    if (!(isfinite(w->wall_s) && w->wall_s > 0))
        return hp_errf(err, HP_INVALID, "metrics: wall time %g s must be finite and > 0",
                       w->wall_s);
    if (!finite_nonneg(w->data_s))
        return hp_errf(err, HP_INVALID, "metrics: data time %g s must be finite and >= 0",
                       w->data_s);
    if (!finite_nonneg(w->comm_s))
        return hp_errf(err, HP_INVALID, "metrics: comm time %g s must be finite and >= 0",
                       w->comm_s);
    if (!finite_nonneg(w->comm_busy_s))
        return hp_errf(err, HP_INVALID, "metrics: comm busy time %g s must be finite and >= 0",
                       w->comm_busy_s);
    if (!finite_nonneg(w->flops_per_token))
        return hp_errf(err, HP_INVALID, "metrics: FLOPs per token %g must be finite and >= 0",
                       w->flops_per_token);

    double steps = (double)w->steps;
    double tps = (double)w->tokens / w->wall_s;
    double achieved = w->flops_per_token * tps; /* FLOP/s */
    int peak_known = isfinite(w->peak_flops) && w->peak_flops > 0;
    *out = (hp_metrics){
        .step = w->step,
        .rank = w->rank,
        .steps = w->steps,
        .tokens = w->tokens,
        .loss = w->loss,
        .loss_max = w->loss_max,
        .grad_norm = w->grad_norm,
        .lr = w->lr,
        .tps = tps,
        .tflops = achieved / 1e12,
        /* above the peak, the peak is wrong (a contaminated probe): MFU is unknown then */
        .mfu_pct = peak_known && achieved <= w->peak_flops ? 100.0 * achieved / w->peak_flops : NAN,
        .memory_bytes = (double)w->memory_bytes,
        .memory_gib = (double)w->memory_bytes / (1024.0 * 1024.0 * 1024.0),
        .memory_pct =
            w->device_memory > 0 ? 100.0 * (double)w->memory_bytes / (double)w->device_memory : NAN,
        .step_time_s = w->wall_s / steps,
        .data_time_s = w->data_s / steps,
        .comm_time_s = w->comm_s / steps,
        .comm_busy_s = w->comm_busy_s / steps,
        .skipped_steps = (double)w->skipped_steps,
        .eval_loss = w->has_eval ? w->eval_loss : NAN,
        .flops_per_token = w->flops_per_token,
    };
    return HP_OK;
}

/* ---- the torchtitan-style line --------------------------------------------------------------- */

/* Appends printf output at *pos, tracking overflow in *over. */
static void put(char *buf, size_t len, size_t *pos, int *over, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void put(char *buf, size_t len, size_t *pos, int *over, const char *fmt, ...) {
    if (*over) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *pos, len - *pos, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len - *pos) {
        *over = 1;
        return;
    }
    *pos += (size_t)n;
}

/* A non-negative count rounded to an integer (half to even, as Python's round) with commas:
 * 1234567.5 -> "1,234,568". Non-finite or huge values print as "unknown". */
static void with_commas(double x, char *out, size_t len) {
    if (!isfinite(x) || x < 0 || x >= 1e18) {
        snprintf(out, len, "unknown");
        return;
    }
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", (long long)rint(x));
    size_t nd = strlen(digits), o = 0;
    for (size_t i = 0; i < nd && o + 2 < len; i++) {
        if (i > 0 && (nd - i) % 3 == 0) out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
}

hp_status hp_metrics_format(const hp_metrics *m, char *buf, size_t len, hp_err *err) {
    if (!m || !buf || len == 0) return hp_errf(err, HP_INVALID, "metrics line: NULL buffer");
    size_t pos = 0;
    int over = 0;
    char tps[40];
    with_commas(m->tps, tps, sizeof tps);
    put(buf, len, &pos, &over, "step: %lld loss: %.4f grad_norm: %.2f lr: %.1e memory: %.2fGiB",
        (long long)m->step, m->loss, m->grad_norm, m->lr, m->memory_gib);
    if (isfinite(m->memory_pct))
        put(buf, len, &pos, &over, "(%.1f%%)", m->memory_pct);
    else
        put(buf, len, &pos, &over, "(unknown)");
    put(buf, len, &pos, &over, " tps: %s tflops: %.2f mfu: ", tps, m->tflops);
    if (isfinite(m->mfu_pct))
        put(buf, len, &pos, &over, "%.1f%%", m->mfu_pct);
    else
        put(buf, len, &pos, &over, "unknown");
    if (over) {
        buf[0] = '\0';
        return hp_errf(err, HP_LIMIT, "metrics line: a buffer of %zu bytes is too small", len);
    }
    return HP_OK;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

/* A double as JSON: a real, or null when not finite (JSON has no NaN). */
static json_t *real_or_null(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

hp_status hp_metrics_to_json(const hp_metrics *m, char *buf, size_t len, hp_err *err) {
    if (!m || !buf || len == 0) return hp_errf(err, HP_INVALID, "metrics json: NULL buffer");
    buf[0] = '\0';
    json_t *o = json_object();
    int bad = !o;
    bad = bad || json_object_set_new(o, "step", json_integer((json_int_t)m->step));
    bad = bad || json_object_set_new(o, "rank", json_integer(m->rank));
    bad = bad || json_object_set_new(o, "steps", json_integer((json_int_t)m->steps));
    bad = bad || json_object_set_new(o, "tokens", json_integer((json_int_t)m->tokens));
#define X(field, key, unit, help) bad = bad || json_object_set_new(o, key, real_or_null(m->field));
#include "hp/metrics.def"
#undef X
    if (bad) {
        json_decref(o);
        return hp_errf(err, HP_NOMEM, "metrics json: out of memory building step %lld",
                       (long long)m->step);
    }
    /* Jansson prints reals with 17 significant digits ("%.17g") unless told otherwise. */
    size_t need = json_dumpb(o, buf, len - 1, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (need == 0) return hp_errf(err, HP_NOMEM, "metrics json: jansson failed to encode");
    if (need > len - 1) {
        buf[0] = '\0';
        return hp_errf(err, HP_LIMIT, "metrics json: needs %zu bytes, buffer has %zu", need + 1,
                       len);
    }
    buf[need] = '\0';
    return HP_OK;
}

static hp_status get_int(json_t *o, const char *key, int64_t *out, hp_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = 0;
        return HP_OK;
    }
    if (!json_is_integer(v))
        return hp_errf(err, HP_PARSE, "metrics json: \"%s\" is not an integer", key);
    *out = (int64_t)json_integer_value(v);
    return HP_OK;
}

static hp_status get_real(json_t *o, const char *key, double *out, hp_err *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = NAN;
        return HP_OK;
    }
    if (!json_is_number(v))
        return hp_errf(err, HP_PARSE, "metrics json: \"%s\" is not a number", key);
    *out = json_number_value(v);
    return HP_OK;
}

hp_status hp_metrics_from_json(const char *text, hp_metrics *out, hp_err *err) {
    if (!text || !out) return hp_errf(err, HP_INVALID, "metrics json: NULL argument");
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!o) return hp_errf(err, HP_PARSE, "metrics json: %s at column %d", je.text, je.column);
    hp_status s = HP_OK;
    hp_metrics m = {0};
    int64_t rank = 0;
    if (!json_is_object(o)) {
        s = hp_errf(err, HP_PARSE, "metrics json: not an object");
        goto done;
    }
    if ((s = get_int(o, "step", &m.step, err)) || (s = get_int(o, "rank", &rank, err)) ||
        (s = get_int(o, "steps", &m.steps, err)) || (s = get_int(o, "tokens", &m.tokens, err)))
        goto done;
    if (rank < 0 || rank > INT32_MAX) {
        s = hp_errf(err, HP_PARSE, "metrics json: rank %lld out of range", (long long)rank);
        goto done;
    }
    m.rank = (int)rank;
#define X(field, key, unit, help)                                                                  \
    if ((s = get_real(o, key, &m.field, err))) goto done;
#include "hp/metrics.def"
#undef X
    *out = m;
done:
    json_decref(o);
    return s;
}

/* ---- the CPU as a device --------------------------------------------------------------------- */

hp_status hp_cpu_memory(uint64_t *peak_rss, uint64_t *total, hp_err *err) {
    if (!peak_rss || !total) return hp_errf(err, HP_INVALID, "cpu memory: NULL argument");
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return hp_errf(err, HP_IO, "cpu memory: getrusage failed");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return hp_errf(err, HP_IO, "cpu memory: cannot read the physical memory size");
    *peak_rss = (uint64_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
    *total = (uint64_t)pages * (uint64_t)page;
    return HP_OK;
}
