/* tests/worker/test_metrics.c — the metrics record: formulas, the torchtitan-style line, the
 * JSON line and its round trip, the GPU peak table, the cached CPU SGEMM probe (a
 * contaminated cache is refused), MFU never above 100%. */
#include "hp/metrics.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static hp_metrics example(void) {
    hp_metrics m = {
        .step = 10,
        .rank = 0,
        .steps = 10,
        .tokens = 12340,
        .loss = 7.336112345678901,
        .loss_max = 7.5,
        .grad_norm = 1.2345,
        .lr = 8e-4,
        .tps = 1234.4,
        .tflops = 0.0912,
        .mfu_pct = 4.0999,
        .memory_bytes = 128849018.0,
        .memory_gib = 0.12,
        .memory_pct = 0.8,
        .step_time_s = 1.0,
        .data_time_s = 0.01,
        .comm_time_s = 0,
        .flops_per_token = 7.3e7,
    };
    return m;
}

Test(metrics, flops_per_token) {
    double f;
    /* debugmodel-sized: N = 6,139,136, embedding 524,288, 6 layers, dim 256, seq 2048. */
    cr_assert_eq(hp_flops_per_token(6139136, 524288, 6, 256, 2048, &f, NULL), HP_OK);
    cr_assert_eq(f, 6.0 * (6139136 - 524288) + 12.0 * 6 * 256 * 2048);
    /* Llama-3 8B at seq 8192: the classic ~4.9e10 FLOPs/token. */
    cr_assert_eq(hp_flops_per_token(8030261248, 525336576, 32, 4096, 8192, &f, NULL), HP_OK);
    cr_assert(fabs(f - 5.791e10) / 5.791e10 < 1e-3, "%g", f);
    hp_err e;
    cr_assert_eq(hp_flops_per_token(10, 11, 1, 1, 1, &f, &e), HP_INVALID);
    cr_assert_eq(hp_flops_per_token(-1, 0, 1, 1, 1, &f, &e), HP_INVALID);
    cr_assert_eq(hp_flops_per_token(10, 0, 1, 1, -1, &f, &e), HP_INVALID);
    cr_assert_eq(hp_flops_per_token(10, 0, 1, 1, 1, NULL, &e), HP_INVALID);
}

Test(metrics, compute_follows_torchtitan) {
    hp_metrics_window w = {
        .step = 20,
        .rank = 3,
        .steps = 10,
        .tokens = 10 * 8 * 2048,
        .wall_s = 40.0,
        .data_s = 0.5,
        .comm_s = 2.0,
        .loss = 3.5,
        .loss_max = 3.7,
        .grad_norm = 0.9,
        .lr = 1e-4,
        .flops_per_token = 1e9,
        .peak_flops = 989e12,
        .memory_bytes = 3ull << 30,
        .device_memory = 80ull << 30,
    };
    hp_metrics m;
    hp_err e;
    cr_assert_eq(hp_metrics_compute(&w, &m, &e), HP_OK, "%s", e.msg);
    double tps = 163840.0 / 40.0;
    cr_assert_eq(m.step, 20);
    cr_assert_eq(m.rank, 3);
    cr_assert_eq(m.tokens, 163840);
    cr_assert_eq(m.tps, tps);
    cr_assert_eq(m.tflops, 1e9 * tps / 1e12);
    cr_assert(fabs(m.mfu_pct - 100 * 1e9 * tps / 989e12) < 1e-12);
    cr_assert_eq(m.memory_gib, 3.0);
    cr_assert_eq(m.memory_pct, 100.0 * 3 / 80);
    cr_assert_eq(m.step_time_s, 4.0);
    cr_assert_eq(m.data_time_s, 0.05);
    cr_assert_eq(m.comm_time_s, 0.2);
    cr_assert_eq(m.loss, 3.5);

    /* Unknown peak and device size: NaN, never another device's number. */
    w.peak_flops = 0;
    w.device_memory = 0;
    cr_assert_eq(hp_metrics_compute(&w, &m, &e), HP_OK);
    cr_assert(isnan(m.mfu_pct) && isnan(m.memory_pct));
    w.peak_flops = NAN;
    cr_assert_eq(hp_metrics_compute(&w, &m, &e), HP_OK);
    cr_assert(isnan(m.mfu_pct));

    hp_metrics_window bad = w;
    bad.wall_s = 0;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "wall time"), "%s", e.msg);
    bad = w, bad.wall_s = INFINITY;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.steps = 0;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.tokens = -1;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.step = 0;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.rank = -1;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.data_s = -1;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.comm_s = NAN;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    bad = w, bad.flops_per_token = -5;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_INVALID);
    cr_assert_eq(hp_metrics_compute(NULL, &m, &e), HP_INVALID);
    /* A NaN loss is a measurement, not an error. */
    bad = w, bad.loss = NAN;
    cr_assert_eq(hp_metrics_compute(&bad, &m, &e), HP_OK);
}

Test(metrics, torchtitan_line) {
    hp_metrics m = example();
    char buf[HP_METRICS_LINE_MAX];
    hp_err e;
    cr_assert_eq(hp_metrics_format(&m, buf, sizeof buf, &e), HP_OK, "%s", e.msg);
    cr_assert_str_eq(buf, "step: 10 loss: 7.3361 grad_norm: 1.23 lr: 8.0e-04 memory: "
                          "0.12GiB(0.8%) tps: 1,234 tflops: 0.09 mfu: 4.1%");
    m.mfu_pct = NAN;
    m.memory_pct = NAN;
    m.tps = 1234567.5;
    cr_assert_eq(hp_metrics_format(&m, buf, sizeof buf, &e), HP_OK);
    cr_assert_str_eq(buf, "step: 10 loss: 7.3361 grad_norm: 1.23 lr: 8.0e-04 memory: "
                          "0.12GiB(unknown) tps: 1,234,568 tflops: 0.09 mfu: unknown");
    const double tps[] = {0, 2.5, 999, 1000, 999999.4, 1e6};
    const char *want[] = {"tps: 0 ",     "tps: 2 ",       "tps: 999 ",
                          "tps: 1,000 ", "tps: 999,999 ", "tps: 1,000,000 "};
    for (int i = 0; i < 6; i++) {
        m.tps = tps[i];
        cr_assert_eq(hp_metrics_format(&m, buf, sizeof buf, &e), HP_OK);
        cr_assert(strstr(buf, want[i]), "%g -> %s", tps[i], buf);
    }
    char small[20];
    cr_assert_eq(hp_metrics_format(&m, small, sizeof small, &e), HP_LIMIT);
    cr_assert_str_eq(small, "");
    cr_assert_eq(hp_metrics_format(&m, NULL, 10, &e), HP_INVALID);
}

Test(metrics, json_line) {
    hp_metrics m = example();
    m.comm_time_s = NAN;
    char buf[2048];
    hp_err e;
    cr_assert_eq(hp_metrics_to_json(&m, buf, sizeof buf, &e), HP_OK, "%s", e.msg);
    cr_assert_null(strchr(buf, '\n'), "one line");
    cr_assert(strncmp(buf, "{\"step\":10,\"rank\":0,\"steps\":10,\"tokens\":12340,\"loss\":", 52) ==
                  0,
              "%s", buf);
    /* Full precision: the loss reads back exactly. */
    cr_assert(strstr(buf, "\"loss\":7.3361123456789"), "%s", buf);
    cr_assert(strstr(buf, "\"comm_time_s\":null"), "%s", buf);
    json_t *o = json_loads(buf, 0, NULL);
    cr_assert_not_null(o);
    cr_assert_eq(json_real_value(json_object_get(o, "loss")), m.loss);
    json_decref(o);

    hp_metrics back;
    cr_assert_eq(hp_metrics_from_json(buf, &back, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(back.step, m.step);
    cr_assert_eq(back.tokens, m.tokens);
#define X(field, key, unit, help)                                                                  \
    if (isnan(m.field))                                                                            \
        cr_assert(isnan(back.field), key);                                                         \
    else                                                                                           \
        cr_assert_eq(back.field, m.field, key);
#include "hp/metrics.def"
#undef X

    char small[40];
    cr_assert_eq(hp_metrics_to_json(&m, small, sizeof small, &e), HP_LIMIT);
    cr_assert_eq(hp_metrics_from_json("{\"step\":", &back, &e), HP_PARSE);
    cr_assert_eq(hp_metrics_from_json("[1,2]", &back, &e), HP_PARSE);
    cr_assert_eq(hp_metrics_from_json("{\"loss\":\"high\"}", &back, &e), HP_PARSE);
    cr_assert(strstr(e.msg, "loss"), "%s", e.msg);
    cr_assert_eq(hp_metrics_from_json("{\"step\":1.5}", &back, &e), HP_PARSE);
    cr_assert_eq(hp_metrics_from_json("{\"rank\":-2}", &back, &e), HP_PARSE);
    cr_assert_eq(hp_metrics_from_json("{\"step\":3}", &back, &e), HP_OK);
    cr_assert(back.step == 3 && isnan(back.loss));
}

Test(metrics, gpu_peaks) {
    struct {
        const char *name;
        double peak;
    } known[] = {
        {"NVIDIA H100 80GB HBM3", 989e12}, {"NVIDIA H100 PCIe", 756e12},
        {"NVIDIA H100 NVL", 835e12},       {"NVIDIA H200", 989e12},
        {"NVIDIA A100-SXM4-80GB", 312e12}, {"NVIDIA A100 80GB PCIe", 312e12},
        {"NVIDIA B200", 2.25e15},
    };
    for (size_t i = 0; i < HP_ARRAY_LEN(known); i++) {
        double p;
        cr_assert_eq(hp_gpu_peak_flops(known[i].name, &p, NULL), HP_OK, "%s", known[i].name);
        cr_assert_eq(p, known[i].peak, "%s", known[i].name);
    }
    double p = 1;
    hp_err e;
    cr_assert_eq(hp_gpu_peak_flops("NVIDIA GeForce RTX 4090", &p, &e), HP_NOT_FOUND);
    cr_assert(isnan(p));
    cr_assert(strstr(e.msg, "RTX 4090") && strstr(e.msg, "unknown"), "%s", e.msg);
    cr_assert_eq(hp_gpu_peak_flops(NULL, &p, &e), HP_INVALID);
    cr_assert_eq(hp_gpu_peak_flops("NVIDIA H100", NULL, &e), HP_INVALID);
}

Test(metrics, cpu_peak_env_override) {
    double p;
    hp_err e;
    setenv("HP_CPU_PEAK_FLOPS", "1.5e11", 1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p, &e), HP_OK);
    cr_assert_eq(p, 1.5e11);
    setenv("HP_CPU_PEAK_FLOPS", "fast", 1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "HP_CPU_PEAK_FLOPS"), "%s", e.msg);
    setenv("HP_CPU_PEAK_FLOPS", "-3", 1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p, &e), HP_INVALID);
    cr_assert_eq(hp_cpu_peak_flops(0, &p, &e), HP_INVALID);
    cr_assert_eq(hp_cpu_peak_flops(1, NULL, &e), HP_INVALID);
}

/* The probe measures once (failing cleanly at each allocation first), caches, and reuses. */
Test(metrics, cpu_peak_probe_is_cached, .timeout = 120) {
    char dir[] = "/tmp/hp-cache-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    unsetenv("HP_CPU_PEAK_FLOPS");
    double p = 0;
    hp_err e;
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hp_status s = hp_cpu_peak_flops(1, &p, &e);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) break;
        cr_assert_eq(s, HP_NOMEM, "allocation %ld: %s", n, e.msg);
        cr_assert(isnan(p));
        cr_assert(n < 10);
    }
    cr_assert(p > 1e8 && p < 1e14, "measured %g FLOP/s", p);
    /* Writing the cache may have failed under injection (best effort): measure once more. */
    cr_assert_eq(hp_cpu_peak_flops(1, &p, &e), HP_OK);
    double again;
    cr_assert_eq(hp_cpu_peak_flops(1, &again, &e), HP_OK);
    cr_assert_eq(again, p, "the second call must read the cache");
    /* The file names the CPU, OpenBLAS's core type and the figure per thread count. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "grep -q '\"coretype\":.*\"peaks\":{\"1\":' %s/hp/cpu-peak-*.json",
             dir);
    cr_assert_eq(system(cmd), 0, "no cache file under %s/hp", dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* ---- a cache that load contaminated ------------------------------------------------------- */

/* The one cache file under DIR/hp (the probe wrote it), parsed. */
static json_t *read_cache(const char *dir, char *path, size_t len) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s/hp/cpu-peak-*.json", dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    cr_assert(fgets(path, (int)len, p), "no cache file under %s/hp", dir);
    pclose(p);
    path[strcspn(path, "\n")] = 0;
    json_error_t e;
    json_t *o = json_load_file(path, 0, &e);
    cr_assert(o, "%s: %s", path, e.text);
    return o;
}

static double peak_of(json_t *o, const char *threads) {
    json_t *v = json_object_get(json_object_get(o, "peaks"), threads);
    return json_is_number(v) ? json_number_value(v) : 0;
}

/* Plants figures for 1 and 2 threads (0: none) in the cache file. */
static void plant(const char *path, json_t *o, double p1, double p2) {
    json_t *peaks = json_object();
    if (p1) json_object_set_new(peaks, "1", json_real(p1));
    if (p2) json_object_set_new(peaks, "2", json_real(p2));
    json_object_set_new(o, "peaks", peaks);
    cr_assert_eq(json_dump_file(o, path, JSON_COMPACT), 0);
}

/* The case: the 2-thread figure was probed while another run loaded the same cores,
 * so it came out below the 1-thread one (34 vs 36.5 GFLOP/s) and MFU read 166%. Such a
 * figure, or one below any floor, is refused and measured again; a plausible one is used. */
Test(metrics, cpu_peak_refuses_a_contaminated_cache, .timeout = 300) {
    char dir[] = "/tmp/hp-cache-XXXXXX", path[1024];
    cr_assert_not_null(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    unsetenv("HP_CPU_PEAK_FLOPS");
    double p1, p2;
    cr_assert_eq(hp_cpu_peak_flops(1, &p1, NULL), HP_OK);
    json_t *o = read_cache(dir, path, sizeof path);
    cr_assert_eq(peak_of(o, "1"), p1);

    /* below the 1-thread figure: re-measured, and never below it */
    plant(path, o, p1, 0.93 * p1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p2, NULL), HP_OK);
    cr_assert_geq(p2, p1, "2 threads %g < 1 thread %g", p2, p1);
    json_decref(o);
    o = read_cache(dir, path, sizeof path);
    cr_assert_eq(peak_of(o, "2"), p2, "the fresh figure is cached");
    cr_assert_geq(peak_of(o, "2"), peak_of(o, "1"));

    /* absurdly low (1 kFLOP/s), and no 1-thread figure to compare with: both measured */
    plant(path, o, 0, 1e3);
    cr_assert_eq(hp_cpu_peak_flops(2, &p2, NULL), HP_OK);
    cr_assert_gt(p2, 1e8);
    json_decref(o);
    o = read_cache(dir, path, sizeof path);
    cr_assert_gt(peak_of(o, "1"), 1e8, "the 1-thread figure is measured and cached too");
    cr_assert_geq(p2, peak_of(o, "1"));

    /* superlinear (5x for 2 threads) is implausible too */
    plant(path, o, p1, 5 * p1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p2, NULL), HP_OK);
    cr_assert_lt(p2, 5 * p1);

    /* a plausible figure is the cache's answer, read without probing */
    plant(path, o, p1, 1.75 * p1);
    cr_assert_eq(hp_cpu_peak_flops(2, &p2, NULL), HP_OK);
    cr_assert_eq(p2, 1.75 * p1);
    /* a 2-thread figure is no floor for the 1-thread one: that stays as cached */
    cr_assert_eq(hp_cpu_peak_flops(1, &p2, NULL), HP_OK);
    cr_assert_eq(p2, p1);

    /* a figure from another core type (or probe version) is not this one's: measured */
    json_object_set_new(o, "coretype", json_string("NotACore"));
    plant(path, o, 1e3, 1e3);
    cr_assert_eq(hp_cpu_peak_flops(1, &p2, NULL), HP_OK);
    cr_assert_gt(p2, 1e8);
    json_decref(o);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* A peak below the achieved rate is wrong: MFU is unknown, never above 100%. */
Test(metrics, mfu_never_exceeds_100) {
    hp_metrics_window w = {.step = 1,
                           .steps = 1,
                           .tokens = 1000,
                           .wall_s = 1,
                           .flops_per_token = 1e8,
                           .peak_flops = 1e11};
    hp_metrics m;
    cr_assert_eq(hp_metrics_compute(&w, &m, NULL), HP_OK); /* 1e11 achieved: exactly 100% */
    cr_assert_float_eq(m.mfu_pct, 100.0, 1e-9);
    w.peak_flops = 0.6e11; /* 166%, as the contaminated cache gave */
    cr_assert_eq(hp_metrics_compute(&w, &m, NULL), HP_OK);
    cr_assert(isnan(m.mfu_pct), "mfu %g", m.mfu_pct);
    cr_assert_float_eq(m.tflops, 0.1, 1e-12, "the achieved rate is still reported");
    char line[HP_METRICS_LINE_MAX];
    cr_assert_eq(hp_metrics_format(&m, line, sizeof line, NULL), HP_OK);
    cr_assert(strstr(line, "mfu: unknown"), "%s", line);
    w.peak_flops = 2e11;
    cr_assert_eq(hp_metrics_compute(&w, &m, NULL), HP_OK);
    cr_assert_float_eq(m.mfu_pct, 50.0, 1e-9);
}

Test(metrics, cpu_memory) {
    uint64_t peak, total;
    cr_assert_eq(hp_cpu_memory(&peak, &total, NULL), HP_OK);
    cr_assert(peak > 0 && total > peak, "peak %llu total %llu", (unsigned long long)peak,
              (unsigned long long)total);
    cr_assert_eq(hp_cpu_memory(NULL, &total, NULL), HP_INVALID);
}
