/* tests/worker/test_rng.c — Philox4x32-10 against Random123's known answers, the stream hash,
 * the uniform mappings and the normal quantile. */
#include "hp/rng.h"

#include <criterion/criterion.h>
#include <math.h>

static void kat(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4]) {
    uint32_t out[4];
    hp_philox4x32_10(ctr, key, out);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(out[i], want[i], "word %d: got 0x%08x, want 0x%08x", i, out[i], want[i]);
}

/* Random123 kat_vectors, philox4x32_10. */
Test(rng, philox_known_answers) {
    kat((uint32_t[4]){0, 0, 0, 0}, (uint32_t[2]){0, 0},
        (uint32_t[4]){0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    kat((uint32_t[4]){0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
        (uint32_t[2]){0xffffffff, 0xffffffff},
        (uint32_t[4]){0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
    kat((uint32_t[4]){0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
        (uint32_t[2]){0xa4093822, 0x299f31d0},
        (uint32_t[4]){0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

Test(rng, philox_output_may_alias_counter) {
    uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    hp_philox4x32_10(c, (uint32_t[2]){0xa4093822, 0x299f31d0}, c);
    cr_assert_eq(c[0], 0xd16cfe09);
    cr_assert_eq(c[3], 0x24126ea1);
}

Test(rng, stream_id_is_fnv1a_64) {
    cr_assert_eq(hp_rng_stream_id(""), 0xcbf29ce484222325ull);
    cr_assert_eq(hp_rng_stream_id("a"), 0xaf63dc4c8601ec8cull);
    cr_assert_eq(hp_rng_stream_id("foobar"), 0x85944171f73967e8ull);
}

Test(rng, bits_layout) {
    /* key = seed words, counter = index then stream words. */
    uint64_t seed = 0x299f31d0a4093822ull, stream = 0x0370734413198a2eull;
    uint64_t index = 0x85a308d3243f6a88ull;
    uint32_t out[4];
    hp_rng_bits(seed, stream, index, out);
    cr_assert_eq(out[0], 0xd16cfe09);
    cr_assert_eq(out[1], 0x94fdcceb);
    cr_assert_eq(out[2], 0x5001e420);
    cr_assert_eq(out[3], 0x24126ea1);
}

Test(rng, uniform_mappings_cover_their_intervals) {
    uint32_t zero[2] = {0, 0}, ones[2] = {0xffffffff, 0xffffffff};
    cr_assert_eq(hp_rng_u01_co(zero), 0.0);
    cr_assert(hp_rng_u01_co(ones) < 1.0);
    cr_assert_eq(hp_rng_u01_co(ones), 1.0 - 0x1.0p-53);
    cr_assert_eq(hp_rng_u01_oc(zero), 0x1.0p-53);
    cr_assert_eq(hp_rng_u01_oc(ones), 1.0);
    cr_assert(hp_rng_u01_oo(zero) > 0 && hp_rng_u01_oo(ones) < 1);
}

Test(rng, normal_quantile_is_accurate) {
    cr_assert_eq(hp_normal_quantile(0.5), 0.0);
    cr_assert(fabs(hp_normal_quantile(0.975) - 1.959963984540054) < 1e-15);
    cr_assert(fabs(hp_normal_quantile(0.025) + 1.959963984540054) < 1e-15);
    cr_assert(fabs(hp_normal_quantile(0.8413447460685429) - 1.0) < 1e-14);
    cr_assert(fabs(hp_normal_quantile(1e-10) + 6.361340902404056) < 1e-12);
    cr_assert(fabs(hp_normal_quantile(1 - 1e-10) - 6.361340889697422) < 1e-6);
    /* Round trip over the whole range, in the tail where precision is kept. */
    double worst = 0;
    for (int i = 1; i < 2000; i++) {
        double p = i / 2000.0;
        double x = hp_normal_quantile(p);
        double back = hp_normal_cdf(x);
        double rel = fabs(back - p) / p;
        if (rel > worst) worst = rel;
    }
    cr_assert(worst < 1e-14, "worst relative round-trip error %g", worst);
    for (double p = 1e-300; p < 0.02; p *= 7.3) {
        double x = hp_normal_quantile(p);
        double rel = fabs(hp_normal_cdf(x) - p) / p;
        /* d ln(Phi) / dx ~ |x|: one ulp of x moves p by about x^2 ulps, relatively. */
        cr_assert(rel < 4e-16 * (1 + x * x), "p=%g x=%.17g rel %g", p, x, rel);
    }
    cr_assert(isinf(hp_normal_quantile(0)) && hp_normal_quantile(0) < 0);
    cr_assert(isinf(hp_normal_quantile(1)) && hp_normal_quantile(1) > 0);
    cr_assert(isnan(hp_normal_quantile(-0.1)));
    cr_assert(isnan(hp_normal_quantile(NAN)));
    cr_assert(isfinite(hp_normal_quantile(4.9e-324)));
}

/* ---- dropout masks -------------------------------------------------------------------------- */

static hp_dropout_site whole(int rank, const int64_t *shape, uint64_t step, const char *fqn) {
    hp_dropout_site s = {.seed = 42, .step = step, .stream = hp_rng_stream_id(fqn), .rank = rank};
    for (int d = 0; d < rank; d++) s.local[d] = s.global[d] = shape[d];
    return s;
}

/* The fraction dropped is p within 6 standard deviations of a Bernoulli(p) mean (the draw is
 * fixed by the seed: the bound is deterministic), for each p, and p = 0 drops nothing. */
Test(rng, dropout_drops_a_fraction_p) {
    enum { N = 1 << 20 };
    static uint8_t keep[N];
    const double ps[] = {0, 0.1, 0.5, 0.9};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        hp_dropout_site s = whole(1, (int64_t[]){N}, 1, "h.0.drop#0");
        hp_dropout_keep(&s, hp_dropout_threshold(ps[i]), 0, N, keep);
        int64_t dropped = 0;
        for (int k = 0; k < N; k++) dropped += !keep[k];
        double f = (double)dropped / N, sd = sqrt(ps[i] * (1 - ps[i]) / N);
        cr_expect(fabs(f - ps[i]) <= 6 * sd, "p %g: dropped %.6f (6 sd = %.2e)", ps[i], f, 6 * sd);
        if (ps[i] == 0) cr_expect_eq(dropped, 0);
    }
    cr_expect_eq(hp_dropout_threshold(0.5), 1u << 31);
    cr_expect_eq(hp_dropout_threshold(0.9999999999999), UINT32_MAX);
}

/* A piece (any box of the whole tensor, any chunk of it) drops exactly what the whole drops at
 * its global indices; another step or another fqn draws another mask. */
Test(rng, dropout_piece_drops_what_the_whole_drops) {
    const int64_t shape[3] = {6, 5, 7};
    enum { N = 6 * 5 * 7 };
    uint8_t all[N], step2[N], other[N];
    uint32_t th = hp_dropout_threshold(0.3);
    hp_dropout_site s = whole(3, shape, 1, "a");
    hp_dropout_keep(&s, th, 0, N, all);
    s.step = 2;
    hp_dropout_keep(&s, th, 0, N, step2);
    hp_dropout_site o = whole(3, shape, 1, "b");
    hp_dropout_keep(&o, th, 0, N, other);
    int same_step = 0, same_fqn = 0;
    for (int i = 0; i < N; i++) same_step += all[i] == step2[i], same_fqn += all[i] == other[i];
    cr_expect(same_step < N && same_fqn < N, "step or fqn does not change the mask");
    /* box [2, 6) x [1, 4) x [3, 7), computed in two chunks split mid-row */
    hp_dropout_site p = whole(3, shape, 1, "a");
    const int64_t off[3] = {2, 1, 3}, len[3] = {4, 3, 4};
    for (int d = 0; d < 3; d++) p.off[d] = off[d], p.local[d] = len[d];
    uint8_t piece[4 * 3 * 4];
    hp_dropout_keep(&p, th, 0, 5, piece);
    hp_dropout_keep(&p, th, 5, 4 * 3 * 4 - 5, piece + 5);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) {
                int g = ((a + 2) * 5 + (b + 1)) * 7 + (c + 3);
                cr_expect_eq(piece[(a * 3 + b) * 4 + c], all[g], "element (%d, %d, %d)", a, b, c);
            }
}
