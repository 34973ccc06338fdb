/* worker/peak_flops.c — the peak FLOP/s MFU is measured against (hp/metrics.h).
 *
 * GPUs: a table of bf16 dense peaks by device name. CPUs have no such table worth trusting
 * (turbo, AVX-512 licences, SMT), so the peak is the best measured cblas_sgemm rate with the
 * run's thread count, measured once per (CPU model, threads) and cached as a small JSON file.
 */
#include "hp/metrics.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- GPUs ------------------------------------------------------------------------------------ */

hp_status hp_gpu_peak_flops(const char *name, double *peak, hp_err *err) {
    if (!peak) return hp_errf(err, HP_INVALID, "gpu peak flops: peak is NULL");
    *peak = NAN;
    if (!name) return hp_errf(err, HP_INVALID, "gpu peak flops: device name is NULL");
    /* Substring rules in torchtitan's order (tools/utils.py get_peak_flops), without its
     * fall-back to the A100 figure. */
    if (strstr(name, "A100"))
        *peak = 312e12;
    else if (strstr(name, "H100"))
        *peak = strstr(name, "NVL") ? 835e12 : strstr(name, "PCIe") ? 756e12 : 989e12;
    else if (strstr(name, "H200"))
        *peak = 989e12;
    else if (strstr(name, "B200"))
        *peak = 2.25e15;
    else
        return hp_errf(err, HP_NOT_FOUND, "peak FLOPs of device '%s' are unknown", name);
    return HP_OK;
}

/* ---- CPUs ------------------------------------------------------------------------------------ */

#define PROBE_N    1024 /* square SGEMM: 2 N^3 = 2.1 GFLOP per call */
#define PROBE_REPS 8    /* timed calls at most */
#define PROBE_S    0.25 /* and stop once this much time has been spent */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The first "model name" of /proc/cpuinfo, else "unknown-cpu". */
static void cpu_model(char *out, size_t len) {
    snprintf(out, len, "unknown-cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *s = colon + 1;
        while (*s == ' ' || *s == '\t') s++;
        size_t n = strcspn(s, "\n");
        if (n > 0) snprintf(out, len, "%.*s", (int)n, s);
        break;
    }
    fclose(f);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

/* $XDG_CACHE_HOME/hp or $HOME/.cache/hp, created if missing; 0 when there is none. */
static int cache_dir(char *out, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg == '/') {
        if (mkdir(xdg, 0755) != 0 && errno != EEXIST) return 0;
        n = snprintf(out, len, "%s/hp", xdg);
    } else if (home && *home) {
        char parent[4096];
        if (snprintf(parent, sizeof parent, "%s/.cache", home) >= (int)sizeof parent) return 0;
        if (mkdir(parent, 0755) != 0 && errno != EEXIST) return 0;
        n = snprintf(out, len, "%s/hp", parent);
    } else {
        return 0;
    }
    if (n < 0 || (size_t)n >= len) return 0;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) return 0;
    return 1;
}

/* The cached peak for (model, threads), or 0 if there is none that matches. */
static double cache_read(const char *path, const char *model, int threads) {
    json_t *o = json_load_file(path, 0, NULL);
    if (!o) return 0;
    double peak = 0;
    json_t *cpu = json_object_get(o, "cpu"), *th = json_object_get(o, "threads");
    json_t *pk = json_object_get(o, "peak_flops");
    if (json_is_string(cpu) && strcmp(json_string_value(cpu), model) == 0 && json_is_integer(th) &&
        json_integer_value(th) == threads && json_is_number(pk) && json_number_value(pk) > 0 &&
        isfinite(json_number_value(pk)))
        peak = json_number_value(pk);
    json_decref(o);
    return peak;
}

static void cache_write(const char *path, const char *model, int threads, double peak) {
    json_t *o = json_pack("{s:s, s:i, s:f, s:i}", "cpu", model, "threads", threads, "peak_flops",
                          peak, "sgemm_n", PROBE_N);
    if (!o) return;
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return;
    hp_file_write_atomic(path, text, strlen(text), NULL); /* best effort */
    free(text);
}

static hp_status probe(int threads, double *peak, hp_err *err) {
    size_t nn = (size_t)PROBE_N * PROBE_N;
    float *a = hp_malloc(nn * sizeof *a), *b = hp_malloc(nn * sizeof *b);
    float *c = hp_malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        hp_free(a), hp_free(b), hp_free(c);
        return hp_errf(err, HP_NOMEM, "cpu peak flops: no memory for a %dx%d SGEMM probe", PROBE_N,
                       PROBE_N);
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    double best = INFINITY, spent = 0;
    for (int r = 0; r <= PROBE_REPS && spent < PROBE_S; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PROBE_N, PROBE_N, PROBE_N, 1.0f, a,
                    PROBE_N, b, PROBE_N, 0.0f, c, PROBE_N);
        double dt = now_s() - t0;
        spent += dt;
        if (r > 0 && dt < best) best = dt; /* call 0 warms caches and threads up */
    }
    openblas_set_num_threads(saved);
    hp_free(a), hp_free(b), hp_free(c);
    if (!(best > 0 && isfinite(best)))
        return hp_errf(err, HP_INTERNAL, "cpu peak flops: the SGEMM probe took no time");
    *peak = 2.0 * PROBE_N * PROBE_N * (double)PROBE_N / best;
    return HP_OK;
}

hp_status hp_cpu_peak_flops(int n_threads, double *peak, hp_err *err) {
    if (!peak) return hp_errf(err, HP_INVALID, "cpu peak flops: peak is NULL");
    *peak = NAN;
    if (n_threads < 1 || n_threads > 1024)
        return hp_errf(err, HP_INVALID, "cpu peak flops: %d threads is outside [1, 1024]",
                       n_threads);
    const char *env = getenv("HP_CPU_PEAK_FLOPS");
    if (env && *env) {
        char *end;
        errno = 0;
        double v = strtod(env, &end);
        if (errno != 0 || *end != '\0' || !(v > 0) || !isfinite(v))
            return hp_errf(err, HP_INVALID,
                           "HP_CPU_PEAK_FLOPS='%s' is not a positive number of FLOP/s", env);
        *peak = v;
        return HP_OK;
    }
    char model[256], key[320], dir[4096], path[4200];
    cpu_model(model, sizeof model);
    snprintf(key, sizeof key, "%s|%d", model, n_threads);
    int cached = cache_dir(dir, sizeof dir);
    if (cached) {
        snprintf(path, sizeof path, "%s/cpu-peak-%016llx.json", dir,
                 (unsigned long long)fnv1a(key));
        double v = cache_read(path, model, n_threads);
        if (v > 0) {
            *peak = v;
            return HP_OK;
        }
    }
    HP_TRY(probe(n_threads, peak, err));
    if (cached) cache_write(path, model, n_threads, *peak);
    return HP_OK;
}
