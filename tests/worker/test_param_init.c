/* tests/worker/test_param_init.c — sharding-independent parameter init.
 *
 * Shard invariance (one fill == any concatenation of pieces == a parallel fill), the
 * distributions' moments on 1e6 draws, truncation bounds and a Kolmogorov–Smirnov check of
 * the truncated normal against its exact CDF, distinct streams per FQN and seed, bad input.
 */
#include "hp/param_init.h"
#include "hp/rng.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 1000000

static float *fill(const hp_init *spec, uint64_t seed, const char *fqn, int64_t first,
                   int64_t count) {
    float *out = malloc((size_t)(count > 0 ? count : 1) * sizeof *out);
    cr_assert_not_null(out);
    hp_err e;
    cr_assert_eq(hp_param_init_fill(spec, seed, fqn, first, count, out, &e), HP_OK, "%s", e.msg);
    return out;
}

static const hp_init specs[] = {
    {.kind = HP_INIT_ZEROS},
    {.kind = HP_INIT_ONES},
    {.kind = HP_INIT_CONSTANT, .a = 0.25},
    {.kind = HP_INIT_UNIFORM, .a = -0.1, .b = 0.3},
    {.kind = HP_INIT_NORMAL, .mean = 0.5, .std = 0.02},
    {.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 0.02, .a = -0.04, .b = 0.04},
    {.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 1, .a = 1, .b = 3}, /* mirrored path */
};

Test(param_init, any_split_equals_one_fill) {
    const int64_t n = 10007;
    for (size_t s = 0; s < HP_ARRAY_LEN(specs); s++) {
        float *whole = fill(&specs[s], 1234, "layers.0.attention.wq.weight", 0, n);
        float *pieces = malloc(n * sizeof *pieces);
        /* Irregular cuts, filled out of order. */
        int64_t cuts[] = {0, 1, 2, 17, 4096, 4097, 9000, n};
        for (int c = (int)HP_ARRAY_LEN(cuts) - 2; c >= 0; c--) {
            hp_err e;
            cr_assert_eq(hp_param_init_fill(&specs[s], 1234, "layers.0.attention.wq.weight",
                                            cuts[c], cuts[c + 1] - cuts[c], pieces + cuts[c], &e),
                         HP_OK);
        }
        cr_assert_eq(memcmp(whole, pieces, n * sizeof *whole), 0, "spec %zu", s);
        /* A shard far into a big tensor equals the same slice of a fill from index 0. */
        float *tail = fill(&specs[s], 1234, "layers.0.attention.wq.weight", 5000, n - 5000);
        cr_assert_eq(memcmp(whole + 5000, tail, (n - 5000) * sizeof *tail), 0);
        free(tail);
        free(pieces);
        free(whole);
    }
}

Test(param_init, parallel_fill_equals_serial) {
    hp_pool *pool;
    cr_assert_eq(hp_pool_new(3, &pool, NULL), HP_OK);
    for (size_t s = 0; s < HP_ARRAY_LEN(specs); s++) {
        float *serial = fill(&specs[s], 7, "tok_embeddings.weight", 123, 50001);
        float *par = malloc(50001 * sizeof *par);
        cr_assert_eq(hp_param_init_fill_par(pool, &specs[s], 7, "tok_embeddings.weight", 123, 50001,
                                            par, NULL),
                     HP_OK);
        cr_assert_eq(memcmp(serial, par, 50001 * sizeof *par), 0, "spec %zu", s);
        free(par);
        free(serial);
    }
    hp_pool_free(pool);
}

Test(param_init, constants) {
    float *z = fill(&specs[0], 1, "a", 0, 100), *o = fill(&specs[1], 1, "a", 0, 100);
    float *c = fill(&specs[2], 1, "a", 0, 100);
    for (int i = 0; i < 100; i++) {
        cr_assert(z[i] == 0.0f && !signbit(z[i]));
        cr_assert_eq(o[i], 1.0f);
        cr_assert_eq(c[i], 0.25f);
    }
    free(z), free(o), free(c);
}

/* arange: element g is g, in any piece (a Shard(0) buffer holds its own global indices);
 * exact in f32 up to 2^24, refused past it. */
Test(param_init, arange_is_the_global_index) {
    hp_init a = {.kind = HP_INIT_ARANGE};
    float *x = fill(&a, 1, "hp.vocab_index", 4096, 100);
    for (int i = 0; i < 100; i++) cr_assert_eq(x[i], (float)(4096 + i));
    free(x);
    float y[2];
    hp_err e;
    cr_assert_eq(hp_param_init_fill(&a, 1, "v", ((int64_t)1 << 24) - 1, 2, y, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "not exact in f32"), "%s", e.msg);
}

static void moments(const float *x, int64_t n, double *mean, double *std) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *std = sqrt(ss / (double)(n - 1));
}

Test(param_init, normal_moments) {
    hp_init spec = {.kind = HP_INIT_NORMAL, .mean = 0.5, .std = 0.02};
    float *x = fill(&spec, 42, "w", 0, N);
    double mean, std;
    moments(x, N, &mean, &std);
    /* Standard error of the mean 2e-5; of the std ~1.4e-5. Allow 5 sigma. */
    cr_assert(fabs(mean - 0.5) < 1e-4, "mean %g", mean);
    cr_assert(fabs(std - 0.02) < 7e-5, "std %g", std);
    /* Tail mass beyond 3 sigma: 0.27 %. */
    int64_t tail = 0;
    for (int64_t i = 0; i < N; i++) tail += fabs(x[i] - 0.5) > 0.06;
    cr_assert(fabs((double)tail / N - 0.0026998) < 0.0003, "tail fraction %g", (double)tail / N);
    free(x);
}

Test(param_init, uniform_moments_and_range) {
    hp_init spec = {.kind = HP_INIT_UNIFORM, .a = -0.1, .b = 0.3};
    float *x = fill(&specs[3], 42, "w", 0, N);
    double mean, std;
    moments(x, N, &mean, &std);
    for (int64_t i = 0; i < N; i++) cr_assert(x[i] >= (float)spec.a && x[i] < (float)spec.b);
    cr_assert(fabs(mean - 0.1) < 5 * 0.4 / sqrt(12.0 * N), "mean %g", mean);
    cr_assert(fabs(std - 0.4 / sqrt(12.0)) < 3e-4, "std %g", std);
    free(x);
}

/* Exact CDF of the normal(m, s) truncated to [a, b]. */
static double tn_cdf(double x, double m, double s, double a, double b) {
    double lo = hp_normal_cdf((a - m) / s), hi = hp_normal_cdf((b - m) / s);
    return (hp_normal_cdf((x - m) / s) - lo) / (hi - lo);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void check_trunc(double m, double s, double a, double b) {
    hp_init spec = {.kind = HP_INIT_TRUNC_NORMAL, .mean = m, .std = s, .a = a, .b = b};
    float *x = fill(&spec, 99, "layers.3.feed_forward.w2.weight", 0, N);
    for (int64_t i = 0; i < N; i++)
        cr_assert(x[i] >= (float)a && x[i] <= (float)b, "x[%lld] = %g outside [%g, %g]",
                  (long long)i, x[i], a, b);
    qsort(x, N, sizeof *x, cmp_float);
    double d = 0;
    for (int64_t i = 0; i < N; i++) {
        double f = tn_cdf(x[i], m, s, a, b);
        double lo = f - (double)i / N, hi = (double)(i + 1) / N - f;
        if (lo > d) d = lo;
        if (hi > d) d = hi;
    }
    /* KS critical value at alpha = 0.001: 1.95 / sqrt(N) = 0.00195. */
    cr_assert(d < 1.95 / sqrt((double)N), "KS distance %g for trunc_normal(%g,%g,%g,%g)", d, m, s,
              a, b);
    free(x);
}

Test(param_init, trunc_normal_bounds_and_ks) {
    check_trunc(0, 0.02, -0.04, 0.04); /* torchtitan's +-2 std */
    check_trunc(0, 1, 1, 3);           /* one-sided, mirrored */
    check_trunc(0, 1, -4, -2.5);       /* lower tail */
    check_trunc(1, 0.5, -10, 10);      /* effectively untruncated */
}

Test(param_init, trunc_normal_far_tail_stays_in_bounds) {
    hp_init spec = {.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 1, .a = 8, .b = 9};
    float *x = fill(&spec, 5, "w", 0, 10000);
    for (int i = 0; i < 10000; i++) cr_assert(x[i] >= 8.0f && x[i] <= 9.0f, "%g", x[i]);
    free(x);
    /* No mass in double precision: a clear error, not garbage. */
    hp_init none = {.kind = HP_INIT_TRUNC_NORMAL, .mean = 0, .std = 1, .a = 40, .b = 41};
    float out[4];
    hp_err e;
    cr_assert_eq(hp_param_init_fill(&none, 5, "w", 0, 4, out, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "no probability mass"), "%s", e.msg);
}

Test(param_init, streams_differ_by_fqn_seed_and_index) {
    hp_init spec = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 1};
    float *a = fill(&spec, 1, "layers.0.attention.wq.weight", 0, 1000);
    float *b = fill(&spec, 1, "layers.0.attention.wk.weight", 0, 1000);
    float *c = fill(&spec, 2, "layers.0.attention.wq.weight", 0, 1000);
    float *d = fill(&spec, 1ull << 32, "layers.0.attention.wq.weight", 0, 1000);
    int same_ab = 0, same_ac = 0, same_ad = 0, same_shift = 0;
    for (int i = 0; i < 1000; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
        same_ad += a[i] == d[i];
        if (i > 0) same_shift += a[i] == a[i - 1];
    }
    cr_assert(same_ab == 0 && same_ac == 0 && same_ad == 0 && same_shift == 0, "%d %d %d %d",
              same_ab, same_ac, same_ad, same_shift);
    /* Correlation between two streams is ~ 1/sqrt(n). */
    double dot = 0;
    for (int i = 0; i < 1000; i++) dot += (double)a[i] * b[i];
    cr_assert(fabs(dot / 1000) < 0.15, "correlation %g", dot / 1000);
    free(a), free(b), free(c), free(d);
}

Test(param_init, values_are_pinned) {
    /* Golden values: any change to the layout or the maths changes every checkpoint's init. */
    hp_init spec = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 1};
    float x[3];
    cr_assert_eq(hp_param_init_fill(&spec, 0, "w", 0, 3, x, NULL), HP_OK);
    uint32_t w[4];
    hp_rng_bits(0, hp_rng_stream_id("w"), 1, w);
    double z = sqrt(-2 * log(hp_rng_u01_oc(w))) * cos(2 * M_PI * hp_rng_u01_co(w + 2));
    cr_assert_eq(x[1], (float)z);
}

Test(param_init, bad_input_is_an_error) {
    float out[4];
    hp_err e;
    hp_init ok = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 1};
    cr_assert_eq(hp_param_init_fill(NULL, 0, "w", 0, 4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, NULL, 0, 4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "", 0, 4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", -1, 4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", 0, -4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", INT64_MAX - 2, 4, out, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "overflows"), "%s", e.msg);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", 0, 4, NULL, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", 0, 0, NULL, &e), HP_OK);
    hp_init none = {.kind = HP_INIT_NONE};
    cr_assert_eq(hp_param_init_fill(&none, 0, "w", 0, 4, out, &e), HP_INVALID);
    hp_init neg_std = {.kind = HP_INIT_NORMAL, .mean = 0, .std = -1};
    cr_assert_eq(hp_param_init_fill(&neg_std, 0, "w", 0, 4, out, &e), HP_INVALID);
    hp_init empty = {.kind = HP_INIT_UNIFORM, .a = 1, .b = 1};
    cr_assert_eq(hp_param_init_fill(&empty, 0, "w", 0, 4, out, &e), HP_INVALID);
    hp_init nan = {.kind = HP_INIT_CONSTANT, .a = NAN};
    cr_assert_eq(hp_param_init_fill(&nan, 0, "w", 0, 4, out, &e), HP_INVALID);
    hp_init bad_kind = {.kind = (hp_init_kind)99};
    cr_assert_eq(hp_param_init_fill(&bad_kind, 0, "w", 0, 4, out, &e), HP_INVALID);
    cr_assert_eq(hp_param_init_fill_par(NULL, &bad_kind, 0, "w", 0, 4, out, &e), HP_INVALID);
    /* Indices up to the top of the range are fine. */
    cr_assert_eq(hp_param_init_fill(&ok, 0, "w", INT64_MAX - 4, 4, out, &e), HP_OK);
}
