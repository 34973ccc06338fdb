/* worker/cpu/cpu_peak.c — the CPU's peak FLOP/s (hp_cpu_peak_flops, hp/metrics.h), which the
 * cpu backend reports in its info and MFU is measured against.
 *
 * A peak must not shrink under load, or MFU reads above 100%. So:
 *   * the probe runs the kernels' own GEMM path (the tiles of k_matmul.c on a pool of the
 *     run's threads, OpenBLAS single-threaded) and rates each thread by its own CPU time, so
 *     cores lent to other processes during the probe do not lower it; best of several runs;
 *   * a figure is never below the 1-thread peak or below one cached for fewer threads (more
 *     threads cannot have a lower peak): a cached figure that is, or that is more than 1.5x
 *     linear in the threads, is implausible and measured again; a measurement that still
 *     comes out below that floor (after three tries) is raised to it;
 *   * the cache is one JSON file per (CPU model, OpenBLAS core type, probe version) under
 *     $XDG_CACHE_HOME/hp (else ~/.cache/hp), mapping thread counts to figures:
 *       {"cpu":"AMD EPYC 7B13","coretype":"Zen","probe":3,"sgemm_n":1024,
 *        "peaks":{"1":3.6e10,"2":7.1e10}}
 *     written atomically, merged with what another process wrote meanwhile.
 */
#include "hp/metrics.h"
#include "worker/cpu/cpu_internal.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROBE_VERSION 3   /* bump when the probe changes: old figures are not comparable */
#define PROBE_REPS    8   /* timed runs at most */
#define PROBE_S       0.3 /* and stop once this much time has been spent (two runs at least) */
#define PROBE_TRIES   3   /* measurements while one comes out below the floor */
#define MAX_SCALING   1.5 /* per-thread rate at most this many times the 1-thread rate */

/* OpenBLAS's kernel family ("Zen", "Haswell", ...): OPENBLAS_CORETYPE changes it. */
static void core_type(char *out, size_t len) {
    const char *c = openblas_get_corename();
    snprintf(out, len, "%s", c && *c ? c : "unknown");
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

typedef struct cache {
    char model[256], core[64], path[4300];
    bool usable;   /* path names a cache file (it may not exist yet) */
    json_t *peaks; /* threads (as text) -> FLOP/s; never NULL after cache_open */
} cache;

/* The "peaks" object of the file when it is this machine's and this probe's; else empty. */
static json_t *cache_load(const cache *c) {
    json_t *o = c->usable ? json_load_file(c->path, 0, NULL) : NULL;
    json_t *cpu = json_object_get(o, "cpu"), *core = json_object_get(o, "coretype");
    json_t *ver = json_object_get(o, "probe"), *peaks = json_object_get(o, "peaks");
    json_t *out = NULL;
    if (json_is_string(cpu) && !strcmp(json_string_value(cpu), c->model) && json_is_string(core) &&
        !strcmp(json_string_value(core), c->core) && json_is_integer(ver) &&
        json_integer_value(ver) == PROBE_VERSION && json_is_object(peaks))
        out = json_deep_copy(peaks);
    json_decref(o);
    return out ? out : json_object();
}

static void cache_open(cache *c) {
    hp_cpu_model(c->model, sizeof c->model);
    core_type(c->core, sizeof c->core);
    char key[400], dir[4096];
    snprintf(key, sizeof key, "%s|%s|%d", c->model, c->core, PROBE_VERSION);
    c->usable = cache_dir(dir, sizeof dir) &&
                snprintf(c->path, sizeof c->path, "%s/cpu-peak-%016llx.json", dir,
                         (unsigned long long)fnv1a(key)) < (int)sizeof c->path;
    c->peaks = cache_load(c);
}

/* The figure for `threads` in peaks, or 0 when there is none that is a positive number. */
static double get(json_t *peaks, int threads) {
    char k[16];
    snprintf(k, sizeof k, "%d", threads);
    json_t *v = json_object_get(peaks, k);
    double x = json_is_number(v) ? json_number_value(v) : 0;
    return x > 0 && isfinite(x) ? x : 0;
}

static void set(json_t *peaks, int threads, double v) {
    char k[16];
    snprintf(k, sizeof k, "%d", threads);
    json_object_set_new(peaks, k, json_real(v));
}

/* The highest figure cached for fewer threads than `threads`. */
static double floor_below(json_t *peaks, int threads) {
    double f = 0;
    const char *k;
    json_t *v;
    json_object_foreach(peaks, k, v) {
        char *end;
        long t = strtol(k, &end, 10);
        if (*end || t < 1 || t >= threads) continue;
        double x = get(peaks, (int)t);
        if (x > f) f = x;
    }
    return f;
}

/* Adds our figures to whatever the file holds now (another rank may have written), writes it
 * atomically; best effort. */
static void cache_store(const cache *c, int threads, double v, double p1) {
    if (!c->usable) return;
    json_t *peaks = cache_load(c);
    set(peaks, threads, v);
    if (threads > 1 && p1 > 0) set(peaks, 1, p1);
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:o}", "cpu", c->model, "coretype", c->core,
                          "probe", PROBE_VERSION, "sgemm_n", 1024, "peaks", peaks);
    if (!o) return;
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return;
    hp_file_write_atomic(c->path, text, strlen(text), NULL);
    free(text);
}

static hp_status measure(int threads, double *rate, hp_err *err) {
    hp_pool *pool = NULL;
    HP_TRY(hp_pool_new(threads, &pool, err));
    hp_status st = hp__cpu_gemm_probe(pool, PROBE_REPS, PROBE_S, rate, err);
    hp_pool_free(pool);
    return st;
}

/* A cached figure for `threads` is used only when it is at least every figure for fewer
 * threads and at most MAX_SCALING x linear in the 1-thread figure p1. */
static bool plausible(json_t *peaks, int threads, double v, double p1) {
    if (!(v > 0)) return false;
    if (v < floor_below(peaks, threads)) return false;
    return threads == 1 || (v >= p1 && v <= MAX_SCALING * (double)threads * p1);
}

hp_status hp_cpu_peak_flops(int n_threads, double *peak, hp_err *err) {
    if (!peak) return hp_errf(err, HP_INVALID, "cpu peak flops: peak is NULL");
    *peak = NAN;
    if (n_threads < 1 || n_threads > HP_POOL_MAX_THREADS)
        return hp_errf(err, HP_INVALID, "cpu peak flops: %d threads is outside [1, %d]", n_threads,
                       HP_POOL_MAX_THREADS);
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
    cache c;
    cache_open(&c);
    hp_status st = HP_OK;
    double p1 = get(c.peaks, 1), v = get(c.peaks, n_threads);
    bool p1_new = false;
    if (n_threads > 1 && !plausible(c.peaks, 1, p1, 0)) {
        if ((st = measure(1, &p1, err)) != HP_OK) goto done;
        set(c.peaks, 1, p1);
        p1_new = true;
    }
    if (!plausible(c.peaks, n_threads, v, p1)) {
        double floor = floor_below(c.peaks, n_threads);
        if (p1 > floor && n_threads > 1) floor = p1;
        for (int i = 0; i < PROBE_TRIES; i++) {
            if ((st = measure(n_threads, &v, err)) != HP_OK) goto done;
            if (v >= floor) break;
        }
        if (v < floor) v = floor; /* still loaded: the peak is at least what fewer threads did */
        cache_store(&c, n_threads, v, p1);
    } else if (p1_new) {
        cache_store(&c, 1, p1, 0);
    }
    *peak = v;
done:
    json_decref(c.peaks);
    return st;
}
