/* tests/worker/test_optim.c — AdamW, gradient clipping and the LR schedule.
 *
 * Against PyTorch: the test draws parameters and ten steps of gradients, writes them to a temp
 * directory, runs tests/worker/adamw_ref.py under Debian's /usr/bin/python3 (torch 1.13:
 * AdamW(foreach=False) + clip_grad_norm_ + LambdaLR with torchtitan's lambda) and compares,
 * every step, the grad norm (1e-6 relative), the lr (1e-15) and every parameter
 * (|hp - torch| <= 1e-6 max|torch| per tensor); it also reports how many parameters agree
 * bit for bit. A missing python3-torch is a failure, not a skip.
 *
 * Without PyTorch: 1, 2 and 3 threads and the scalar and AVX2 paths give bit-identical
 * parameters and norms; clip semantics; schedule values; bad input.
 */
#include "hp/optim.h"
#include "hp/param_init.h"
#include "worker/simd.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef HP_SOURCE_DIR
#define HP_SOURCE_DIR "."
#endif

/* ---- helpers --------------------------------------------------------------------------------- */

static void normal_fill(float *out, int64_t n, double std, const char *name) {
    hp_init spec = {.kind = HP_INIT_NORMAL, .mean = 0, .std = std};
    hp_err e;
    cr_assert_eq(hp_param_init_fill(&spec, 2024, name, 0, n, out, &e), HP_OK, "%s", e.msg);
}

typedef struct model {
    int n;
    const int64_t *sizes;
    int64_t total;
    float *p, *g, *m, *v; /* [total] each, tensors back to back */
    hp_adamw_param *params;
    hp_fspan *grads;
} model;

static void model_init(model *md, int n, const int64_t *sizes) {
    md->n = n;
    md->sizes = sizes;
    md->total = 0;
    for (int i = 0; i < n; i++) md->total += sizes[i];
    size_t bytes = (size_t)md->total * sizeof(float);
    md->p = malloc(bytes), md->g = malloc(bytes);
    md->m = calloc(1, bytes), md->v = calloc(1, bytes);
    md->params = calloc((size_t)n, sizeof *md->params);
    md->grads = calloc((size_t)n, sizeof *md->grads);
    cr_assert(md->p && md->g && md->m && md->v && md->params && md->grads);
    normal_fill(md->p, md->total, 0.5, "init");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        md->params[i] =
            (hp_adamw_param){md->p + off, md->g + off, md->m + off, md->v + off, sizes[i], NULL};
        md->grads[i] = (hp_fspan){md->g + off, sizes[i]};
        off += sizes[i];
    }
}

static void model_fini(model *md) {
    free(md->p), free(md->g), free(md->m), free(md->v), free(md->params), free(md->grads);
}

/* Step s's gradients: normal with a std that makes the global norm alternate around 1. */
static void grads_for_step(float *g, int64_t total, int s) {
    char name[32];
    snprintf(name, sizeof name, "grad.%d", s);
    double target_norm = (s % 3 == 0) ? 0.4 : (s % 3 == 1) ? 2.5 : 1.3;
    normal_fill(g, total, target_norm / sqrt((double)total), name);
}

/* One training step as the runtime does it: clip, lr, AdamW. */
static void train_step(model *md, const hp_lr_schedule *sched, int s, double max_norm,
                       hp_pool *pool, double *norm, double *lr) {
    hp_adamw_config cfg = hp_adamw_defaults();
    hp_err e;
    cr_assert_eq(hp_clip_grad_norm(md->grads, md->n, max_norm, pool, norm, &e), HP_OK, "%s", e.msg);
    *lr = hp_lr_at(sched, s);
    cr_assert_eq(hp_adamw_step(&cfg, *lr, s, md->params, md->n, pool, &e), HP_OK, "%s", e.msg);
}

/* ---- against PyTorch ------------------------------------------------------------------------- */

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void *read_file(const char *dir, const char *name, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "reference output %s is missing", path);
    void *p = malloc(n);
    cr_assert_eq(fread(p, 1, n, f), n, "reference output %s is short", path);
    fclose(f);
    return p;
}

static void require_torch(void) {
    int rc = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1");
    cr_assert_eq(rc, 0,
                 "PyTorch is missing: /usr/bin/python3 cannot import torch; install "
                 "Debian's python3-torch (scripts/install-deps.sh)");
}

static void run_ref(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/worker/adamw_ref.py %s", HP_SOURCE_DIR,
             dir);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed (status %d)", cmd, rc);
}

typedef struct probe {
    int64_t total, warmup;
    double ratio;
    const char *kind;
    double min;
} probe;

static const probe probes[] = {
    {10, 2, -1, "linear", 0},   {10, 2, -1, "cosine", 0.1}, {20, 3, 0.5, "linear", 0.05},
    {20, 0, -1, "sqrt", 0},     {7, 9, -1, "linear", 0},    {15, 4, 0.25, "cosine", 0},
    {12, 2, -1, "none", 0},     {1, 0, -1, "linear", 0},    {30, 5, 0.9, "sqrt", 0.2},
    {10, 2, 0.25, "linear", 0}, /* round(2.5) = 2: Python rounds half to even */
};

/* Runs the ten steps here and in torch with clipping at max_norm; returns the fraction of
 * parameter values that agree bit for bit. */
static double torch_case(double max_norm) {
    require_torch();
    static const int64_t sizes[] = {100003, 37, 4099, 8, 1, 65536};
    const int n = (int)HP_ARRAY_LEN(sizes), steps = 10;
    model md;
    model_init(&md, n, sizes);
    hp_adamw_config cfg = hp_adamw_defaults();
    const double lr = 8e-4;

    char dir[] = "/tmp/hp-adamw-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cfgtext[2048];
    int len = snprintf(cfgtext, sizeof cfgtext, "sizes");
    for (int i = 0; i < n; i++)
        len += snprintf(cfgtext + len, sizeof cfgtext - len, " %lld", (long long)sizes[i]);
    len += snprintf(cfgtext + len, sizeof cfgtext - len,
                    "\nsteps %d\nadamw %.17g %.17g %.17g %.17g %.17g\nclip %.17g\n"
                    "sched %d 2 -1 linear 0\n",
                    steps, lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, max_norm, steps);
    for (size_t i = 0; i < HP_ARRAY_LEN(probes); i++)
        len += snprintf(cfgtext + len, sizeof cfgtext - len, "probe %lld %lld %.17g %s %.17g\n",
                        (long long)probes[i].total, (long long)probes[i].warmup, probes[i].ratio,
                        probes[i].kind, probes[i].min);
    write_file(dir, "config.txt", cfgtext, (size_t)len);
    write_file(dir, "init.bin", md.p, (size_t)md.total * sizeof(float));
    float *all_grads = malloc((size_t)steps * md.total * sizeof(float));
    for (int s = 0; s < steps; s++) grads_for_step(all_grads + s * md.total, md.total, s + 1);
    write_file(dir, "grads.bin", all_grads, (size_t)steps * md.total * sizeof(float));
    run_ref(dir);

    size_t rec = 16 + (size_t)md.total * sizeof(float);
    unsigned char *ref = read_file(dir, "out.bin", rec * steps);
    hp_lr_schedule sched;
    cr_assert_eq(hp_lr_schedule_init(&sched, lr, steps, 2, -1, HP_LR_DECAY_LINEAR, 0, NULL), HP_OK);
    hp_pool *pool;
    cr_assert_eq(hp_pool_new(2, &pool, NULL), HP_OK);
    int64_t exact = 0, clipped = 0;
    for (int s = 1; s <= steps; s++) {
        memcpy(md.g, all_grads + (s - 1) * md.total, (size_t)md.total * sizeof(float));
        double norm, used_lr, ref_norm, ref_lr;
        train_step(&md, &sched, s, max_norm, pool, &norm, &used_lr);
        const unsigned char *r = ref + (size_t)(s - 1) * rec;
        memcpy(&ref_norm, r, 8);
        memcpy(&ref_lr, r + 8, 8);
        const float *rp = (const float *)(r + 16);
        clipped += norm > max_norm;
        cr_assert(fabs(norm - ref_norm) <= 1e-6 * ref_norm, "step %d: norm %.9g vs torch %.9g", s,
                  norm, ref_norm);
        cr_assert(fabs(used_lr - ref_lr) <= 1e-15 * ref_lr, "step %d: lr %.17g vs torch %.17g", s,
                  used_lr, ref_lr);
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            double maxabs = 0;
            for (int64_t j = 0; j < sizes[i]; j++) maxabs = fmax(maxabs, fabs(rp[off + j]));
            for (int64_t j = 0; j < sizes[i]; j++) {
                float a = md.p[off + j], b = rp[off + j];
                cr_assert(fabs((double)a - b) <= 1e-6 * maxabs,
                          "step %d tensor %d [%lld]: %.9g vs torch %.9g", s, i, (long long)j, a, b);
                exact += a == b;
            }
            off += sizes[i];
        }
        cr_log_info("step %d: norm %.9g (torch %.9g), %lld values bit-identical so far", s, norm,
                    ref_norm, (long long)exact);
    }
    if (max_norm < 10)
        cr_assert(clipped > 0 && clipped < steps, "the test should clip on some steps only");
    double frac = (double)exact / ((double)md.total * steps);
    cr_log_info("AdamW vs torch (max_norm %g): %.4f%% of %lld parameter values bit-identical",
                max_norm, 100 * frac, (long long)md.total * steps);

    /* The schedule against torchtitan's lambda, through the end of training. */
    size_t n_lr = 0;
    for (size_t i = 0; i < HP_ARRAY_LEN(probes); i++) n_lr += (size_t)probes[i].total + 2;
    double *factors = read_file(dir, "probe.bin", n_lr * sizeof(double));
    size_t k = 0;
    for (size_t i = 0; i < HP_ARRAY_LEN(probes); i++) {
        const probe *pr = &probes[i];
        hp_lr_decay kind;
        cr_assert_eq(hp_lr_decay_parse(pr->kind, &kind, NULL), HP_OK);
        hp_lr_schedule s;
        cr_assert_eq(
            hp_lr_schedule_init(&s, 1.0, pr->total, pr->warmup, pr->ratio, kind, pr->min, NULL),
            HP_OK);
        for (int64_t step = 1; step <= pr->total + 2; step++, k++) {
            double f = hp_lr_at(&s, step);
            if (step <= pr->total + 1)
                cr_assert(f == factors[k], "probe %zu step %lld: %.17g vs torchtitan %.17g", i,
                          (long long)step, f, factors[k]);
            else if (s.decay_steps > 0) /* past torchtitan's range: held at the minimum */
                cr_assert_eq(f, pr->min, "probe %zu", i);
        }
    }
    free(factors);
    free(ref);
    free(all_grads);
    hp_pool_free(pool);
    model_fini(&md);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
    return frac;
}

/* With clipping on some steps. torch takes the norm in float32 (a few ulps off the double
 * norm here), so the clip factor, and through it a few percent of the values, differ by an
 * ulp or so; everything stays within 1e-6. */
Test(optim, matches_pytorch, .timeout = 300) {
    double frac = torch_case(1.0);
    cr_assert(frac > 0.9, "only %.2f%% bit-identical", 100 * frac);
}

/* Without clipping the update is torch's to the bit. */
Test(optim, matches_pytorch_bitwise_without_clipping, .timeout = 300) {
    double frac = torch_case(1e6);
    cr_assert_eq(frac, 1.0, "%.6f%% bit-identical, want 100%%", 100 * frac);
}

/* ---- determinism ------------------------------------------------------------------------------
 */

static void run_steps(int threads, int force_scalar, model *md) {
    static const int64_t sizes[] = {300001, 70000, 5, 131072, 17};
    model_init(md, (int)HP_ARRAY_LEN(sizes), sizes);
    hp_pool *pool = NULL;
    if (threads > 0) cr_assert_eq(hp_pool_new(threads, &pool, NULL), HP_OK);
    hp__simd_force_scalar(force_scalar);
    hp_lr_schedule sched;
    cr_assert_eq(hp_lr_schedule_init(&sched, 1e-3, 5, 1, -1, HP_LR_DECAY_COSINE, 0.1, NULL), HP_OK);
    for (int s = 1; s <= 4; s++) {
        grads_for_step(md->g, md->total, s);
        double norm, lr;
        train_step(md, &sched, s, 1.0, pool, &norm, &lr);
    }
    hp__simd_force_scalar(0);
    hp_pool_free(pool);
}

Test(optim, bit_identical_across_threads_and_paths, .timeout = 120) {
    model ref;
    run_steps(0, 0, &ref);
    size_t bytes = (size_t)ref.total * sizeof(float);
    const int configs[][2] = {{1, 0}, {2, 0}, {3, 0}, {3, 1}, {0, 1}};
    for (size_t c = 0; c < HP_ARRAY_LEN(configs); c++) {
        model md;
        run_steps(configs[c][0], configs[c][1], &md);
        cr_assert_eq(memcmp(md.p, ref.p, bytes), 0, "params: threads %d scalar %d", configs[c][0],
                     configs[c][1]);
        cr_assert_eq(memcmp(md.m, ref.m, bytes), 0, "exp_avg: config %zu", c);
        cr_assert_eq(memcmp(md.v, ref.v, bytes), 0, "exp_avg_sq: config %zu", c);
        model_fini(&md);
    }
    model_fini(&ref);
}

Test(optim, grad_sumsq_is_deterministic_and_accurate, .timeout = 120) {
    /* Over 8.4M elements: more than one round of blocks. */
    const int64_t sizes[] = {5000000, 3, 4000001};
    float *buf[3];
    hp_fspan spans[3];
    long double want = 0;
    for (int i = 0; i < 3; i++) {
        buf[i] = malloc((size_t)sizes[i] * sizeof(float));
        normal_fill(buf[i], sizes[i], 1.0 + i, i == 0 ? "a" : i == 1 ? "b" : "c");
        spans[i] = (hp_fspan){buf[i], sizes[i]};
        for (int64_t j = 0; j < sizes[i]; j++) want += (long double)buf[i][j] * buf[i][j];
    }
    double base;
    cr_assert_eq(hp_grad_sumsq(spans, 3, NULL, &base, NULL), HP_OK);
    cr_assert(fabsl(base - want) <= 1e-12L * want, "%.17g vs %.17Lg", base, want);
    for (int t = 1; t <= 3; t++) {
        hp_pool *pool;
        cr_assert_eq(hp_pool_new(t, &pool, NULL), HP_OK);
        double s;
        cr_assert_eq(hp_grad_sumsq(spans, 3, pool, &s, NULL), HP_OK);
        cr_assert(s == base, "%d threads: %.17g vs %.17g", t, s, base);
        hp_pool_free(pool);
    }
    for (int i = 0; i < 3; i++) free(buf[i]);
}

/* ---- clipping ---------------------------------------------------------------------------------
 */

Test(optim, clip_semantics) {
    float g[4] = {3, 0, 0, 4}; /* norm 5 */
    float h[1] = {0};
    hp_fspan spans[2] = {{g, 4}, {h, 1}};
    double norm;
    cr_assert_eq(hp_clip_grad_norm(spans, 2, 10.0, NULL, &norm, NULL), HP_OK);
    cr_assert_eq(norm, 5.0);
    cr_assert(g[0] == 3 && g[3] == 4, "below max_norm nothing changes");
    cr_assert_eq(hp_clip_grad_norm(spans, 2, 1.0, NULL, &norm, NULL), HP_OK);
    cr_assert_eq(norm, 5.0);
    float coef = hp_clip_coef(5.0, 1.0);
    cr_assert_eq(coef, (1.0f / (5.0f + 1e-6f)) * 1.0f);
    cr_assert_eq(g[0], 3 * coef);
    cr_assert_eq(g[3], 4 * coef);
    cr_assert_eq(hp_clip_coef(0.5, 1.0), 1.0f);
    cr_assert_eq(hp_clip_coef(0.0, 1.0), 1.0f);
    cr_assert(isnan(hp_clip_coef(NAN, 1.0)));
    /* NaN gradients give a NaN norm and, as in torch, NaN gradients after clipping. */
    float bad[2] = {NAN, 1};
    hp_fspan sb = {bad, 2};
    cr_assert_eq(hp_clip_grad_norm(&sb, 1, 1.0, NULL, &norm, NULL), HP_OK);
    cr_assert(isnan(norm) && isnan(bad[1]));
    /* Empty lists: norm 0. */
    cr_assert_eq(hp_clip_grad_norm(NULL, 0, 1.0, NULL, &norm, NULL), HP_OK);
    cr_assert_eq(norm, 0.0);
}

/* ---- schedule ---------------------------------------------------------------------------------
 */

Test(optim, schedule_debugmodel) {
    /* debug_model.toml: 10 steps, warmup 2, linear decay to 0. */
    hp_lr_schedule s;
    cr_assert_eq(hp_lr_schedule_init(&s, 8e-4, 10, 2, -1, HP_LR_DECAY_LINEAR, 0, NULL), HP_OK);
    cr_assert_eq(s.warmup_steps, 2);
    cr_assert_eq(s.decay_steps, 8);
    cr_assert_eq(s.stable_steps, 1);
    const double want[10] = {0.5, 1, 1, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125};
    for (int i = 0; i < 10; i++)
        cr_assert(fabs(hp_lr_at(&s, i + 1) - 8e-4 * want[i]) < 1e-18, "step %d: %g", i + 1,
                  hp_lr_at(&s, i + 1));
    cr_assert_eq(hp_lr_at(&s, 0), hp_lr_at(&s, 1));
    cr_assert_eq(hp_lr_at(&s, 1000), 0.0);

    cr_assert_eq(hp_lr_schedule_init(&s, 1e-3, 10, 0, -1, HP_LR_DECAY_NONE, 0, NULL), HP_OK);
    for (int i = 1; i <= 12; i++) cr_assert_eq(hp_lr_at(&s, i), 1e-3);
    cr_assert_eq(hp_lr_schedule_init(&s, 1e-3, 10, 3, -1, HP_LR_DECAY_COSINE, 0.1, NULL), HP_OK);
    cr_assert(fabs(hp_lr_at(&s, 1) - 1e-3 / 3) < 1e-18);
    cr_assert(hp_lr_at(&s, 10) > 1e-4 && hp_lr_at(&s, 10) < 1e-3);
}

Test(optim, decay_names) {
    hp_lr_decay d;
    const char *names[] = {"linear", "sqrt", "cosine", "none"};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(hp_lr_decay_parse(names[i], &d, NULL), HP_OK);
        cr_assert_eq((int)d, i);
        cr_assert_str_eq(hp_lr_decay_name(d), names[i]);
    }
    cr_assert_eq(hp_lr_decay_parse("constant", &d, NULL), HP_OK);
    cr_assert_eq(d, HP_LR_DECAY_NONE);
    hp_err e;
    cr_assert_eq(hp_lr_decay_parse("exp", &d, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "'exp'"), "%s", e.msg);
}

/* Clipping folded into the step: hp_adamw_step_scaled(c) is, bit for bit, hp_grad_scale(c) then
 * hp_adamw_step (the scalar and AVX2 paths, over a pool), and leaves the gradients as they were. */
Test(optim, scaled_step_equals_scale_then_step) {
    enum { N = 70001 };
    float *p[2], *g[2], *m[2], *v[2];
    for (int k = 0; k < 2; k++) {
        p[k] = malloc(N * 4), g[k] = malloc(N * 4), m[k] = calloc(N, 4), v[k] = calloc(N, 4);
        for (int i = 0; i < N; i++) {
            p[k][i] = sinf((float)i * 0.01f);
            g[k][i] = cosf((float)i * 0.37f) * 3.0f;
        }
    }
    hp_pool *pool = NULL;
    hp_err e;
    cr_assert_eq(hp_pool_new(3, &pool, &e), HP_OK, "%s", e.msg);
    hp_adamw_config cfg = hp_adamw_defaults();
    const float coefs[] = {0.3f, 1.0f, 0.0123f};
    for (int step = 1; step <= 3; step++) {
        hp_adamw_param a = {p[0], g[0], m[0], v[0], N, NULL}, b = {p[1], g[1], m[1], v[1], N, NULL};
        hp_fspan sa = {g[0], N};
        float c = coefs[step - 1];
        cr_assert_eq(hp_grad_scale(&sa, 1, c, pool, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(hp_adamw_step(&cfg, 1e-3, step, &a, 1, pool, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(hp_adamw_step_scaled(&cfg, 1e-3, c, step, &b, 1, pool, &e), HP_OK, "%s",
                     e.msg);
        for (int i = 0; i < N; i++) g[0][i] = cosf((float)i * 0.37f) * 3.0f; /* unscale */
    }
    cr_assert_eq(memcmp(p[0], p[1], N * 4), 0, "params differ");
    cr_assert_eq(memcmp(m[0], m[1], N * 4), 0, "exp_avg differs");
    cr_assert_eq(memcmp(v[0], v[1], N * 4), 0, "exp_avg_sq differs");
    cr_assert_eq(memcmp(g[0], g[1], N * 4), 0, "the gradients changed");
    hp_adamw_param b = {p[1], g[1], m[1], v[1], N, NULL};
    const float bad[] = {0.0f, -1.0f, NAN, INFINITY};
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        cr_assert_eq(hp_adamw_step_scaled(&cfg, 1e-3, bad[i], 4, &b, 1, pool, &e), HP_INVALID);
        cr_assert(strstr(e.msg, "grad_scale"), "%s", e.msg);
    }
    hp_pool_free(pool);
    for (int k = 0; k < 2; k++) free(p[k]), free(g[k]), free(m[k]), free(v[k]);
}

/* Gradient accumulation: the first call copies (whatever the destination held, NaN too),
 * later ones add element by element, over spans that cross the pool's chunks; spans of
 * different lengths are refused and nothing is written. */
Test(optim, grad_accumulate_copies_then_adds) {
    enum { N = 50003, M = 17 };
    float *acc = malloc((N + M) * 4), *g = malloc((N + M) * 4);
    for (int i = 0; i < N + M; i++) acc[i] = NAN;
    hp_pool *pool = NULL;
    hp_err e;
    cr_assert_eq(hp_pool_new(3, &pool, &e), HP_OK, "%s", e.msg);
    hp_fspan dst[2] = {{acc, N}, {acc + N, M}}, src[2] = {{g, N}, {g + N, M}};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N + M; i++) g[i] = (float)(i % 101) * 0.25f + (float)k;
        cr_assert_eq(hp_grad_accumulate(dst, src, 2, k == 0, pool, &e), HP_OK, "%s", e.msg);
    }
    for (int i = 0; i < N + M; i++) {
        float want = (float)(i % 101) * 0.25f;
        want = (want + (want + 1.0f)) + (want + 2.0f); /* in float, in call order */
        cr_assert_eq(acc[i], want, "element %d: %g vs %g", i, acc[i], want);
    }
    hp_fspan shorter[2] = {{g, N}, {g + N, M - 1}};
    float before = acc[0];
    cr_assert_eq(hp_grad_accumulate(dst, shorter, 2, false, pool, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "span 1 has 17 elements, its source 16"), "%s", e.msg);
    cr_assert_eq(acc[0], before, "nothing is written on an error");
    hp_pool_free(pool);
    free(acc);
    free(g);
}

/* ---- bad input --------------------------------------------------------------------------------
 */

Test(optim, bad_input_is_an_error) {
    float p[2] = {1, 2}, g[2] = {0.1f, 0.2f}, m[2] = {0}, v[2] = {0};
    hp_adamw_param ok = {p, g, m, v, 2, NULL};
    hp_adamw_config cfg = hp_adamw_defaults();
    hp_err e;
    cr_assert_eq(hp_adamw_step(NULL, 1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    hp_adamw_config bad = cfg;
    bad.beta1 = 1.0;
    cr_assert_eq(hp_adamw_step(&bad, 1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "beta1"), "%s", e.msg);
    bad = cfg, bad.beta2 = -0.1;
    cr_assert_eq(hp_adamw_step(&bad, 1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    bad = cfg, bad.eps = NAN;
    cr_assert_eq(hp_adamw_step(&bad, 1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    bad = cfg, bad.weight_decay = -1;
    cr_assert_eq(hp_adamw_step(&bad, 1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_adamw_step(&cfg, NAN, 1, &ok, 1, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_adamw_step(&cfg, -1e-3, 1, &ok, 1, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 0, &ok, 1, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, NULL, 1, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, &ok, -1, NULL, &e), HP_INVALID);
    hp_adamw_param list[2] = {ok, {p, NULL, m, v, 2, NULL}};
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, list, 2, NULL, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "tensor 1"), "%s", e.msg);
    list[1] = (hp_adamw_param){p, g, m, v, -5, NULL};
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, list, 2, NULL, &e), HP_INVALID);
    cr_assert(p[0] == 1 && p[1] == 2 && m[0] == 0, "a failed step must not update anything");
    list[1] = (hp_adamw_param){NULL, NULL, NULL, NULL, 0, NULL}; /* empty tensors are fine */
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, list, 2, NULL, &e), HP_OK);
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, NULL, 0, NULL, &e), HP_OK);

    hp_fspan bad_span = {NULL, 3};
    double s;
    cr_assert_eq(hp_grad_sumsq(&bad_span, 1, NULL, &s, &e), HP_INVALID);
    cr_assert_eq(hp_grad_sumsq(NULL, 2, NULL, &s, &e), HP_INVALID);
    hp_fspan neg = {g, -1};
    cr_assert_eq(hp_grad_sumsq(&neg, 1, NULL, &s, &e), HP_INVALID);
    hp_fspan fine = {g, 2};
    cr_assert_eq(hp_grad_sumsq(&fine, 1, NULL, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_grad_scale(&bad_span, 1, 0.5f, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_clip_grad_norm(&fine, 1, 0.0, NULL, &s, &e), HP_INVALID);
    cr_assert_eq(hp_clip_grad_norm(&fine, 1, INFINITY, NULL, &s, &e), HP_INVALID);

    hp_lr_schedule sc;
    cr_assert_eq(hp_lr_schedule_init(NULL, 1e-3, 10, 2, -1, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, -1e-3, 10, 2, -1, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 0, 2, -1, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 10, -2, -1, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 10, 2, 1.5, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 10, 2, NAN, 0, 0, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 10, 2, -1, 0, 1.5, &e), HP_INVALID);
    cr_assert_eq(hp_lr_schedule_init(&sc, 1e-3, 10, 2, -1, (hp_lr_decay)9, 0, &e), HP_INVALID);
}
