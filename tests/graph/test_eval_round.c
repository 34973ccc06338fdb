/* tests/graph/test_eval_round.c — hp_eval_round: f32, bf16 and f16 round to nearest with ties
 * to even, including subnormals and overflow to infinity; integers truncate toward zero; bool
 * is x != 0. bf16 is cross-checked against the usual bit trick on f32 values, f16 against the
 * compiler's _Float16 conversion where it has one. */
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define R(dt, x) hp_eval_round((dt), (x))

Test(eval_round, bf16_ties_to_even) {
    double u = ldexp(1, -7); /* bf16 ulp at 1 */
    cr_expect_eq(R(HP_BF16, 1.0), 1.0);
    cr_expect_eq(R(HP_BF16, 1 + u / 2), 1.0);                   /* tie: to even (1.0) */
    cr_expect_eq(R(HP_BF16, 1 + 3 * u / 2), 1 + 2 * u);         /* tie: to even (1 + 2u) */
    cr_expect_eq(R(HP_BF16, 1 + u / 2 + ldexp(1, -30)), 1 + u); /* just above the tie */
    cr_expect_eq(R(HP_BF16, 1 + u / 2 - ldexp(1, -30)), 1.0);
    cr_expect_eq(R(HP_BF16, -(1 + 3 * u / 2)), -(1 + 2 * u));
    cr_expect_eq(R(HP_BF16, 3.14159265358979), 3.140625);
    cr_expect_eq(R(HP_BF16, 1e10), 9999220736.0);
}

Test(eval_round, bf16_overflow_and_specials) {
    double max = ldexp(255, 120); /* 3.3895313892515355e38 */
    cr_expect_eq(R(HP_BF16, max), max);
    cr_expect_eq(R(HP_BF16, max + ldexp(1, 119) - ldexp(1, 100)), max); /* below the tie */
    cr_expect(isinf(R(HP_BF16, max + ldexp(1, 119))));                  /* tie to even: 2^128 */
    cr_expect_eq(R(HP_BF16, -1e39), -INFINITY);
    cr_expect_eq(R(HP_BF16, INFINITY), INFINITY);
    cr_expect(isnan(R(HP_BF16, NAN)));
    cr_expect(signbit(R(HP_BF16, -0.0)) && R(HP_BF16, -0.0) == 0);
}

Test(eval_round, bf16_subnormals) {
    double tiny = ldexp(1, -133); /* smallest bf16 subnormal */
    cr_expect_eq(R(HP_BF16, tiny), tiny);
    cr_expect_eq(R(HP_BF16, tiny / 2), 0.0); /* tie between 0 and tiny: 0 is even */
    cr_expect_eq(R(HP_BF16, tiny * 0.50001), tiny);
    cr_expect_eq(R(HP_BF16, tiny * 1.5), 2 * tiny);                      /* tie: to even (2 tiny) */
    cr_expect_eq(R(HP_BF16, tiny * 2.5), 2 * tiny);                      /* tie: to even (2 tiny) */
    cr_expect_eq(R(HP_BF16, ldexp(1, -126) - tiny / 4), ldexp(1, -126)); /* rounds up to normal */
    cr_expect(signbit(R(HP_BF16, -tiny / 4)));
}

/* The standard f32 -> bf16 bit trick (round to nearest even on the upper 16 bits). */
static double bf16_from_f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7FFF + ((b >> 16) & 1);
    b &= 0xFFFF0000u;
    float r;
    memcpy(&r, &b, 4);
    return r;
}

Test(eval_round, bf16_matches_bit_trick) {
    double x[4096];
    hp_th_rand(x, 4096, 7, -1, 1);
    for (int i = 0; i < 4096; i++) {
        /* spread the exponents over the whole f32 range, subnormals included */
        float f = (float)ldexp(x[i], (i % 280) - 150);
        if (!isfinite(f)) continue;
        cr_assert_eq(R(HP_BF16, f), bf16_from_f32_bits(f), "x = %a", (double)f);
    }
}

Test(eval_round, f16_ties_overflow_subnormals) {
    double u = ldexp(1, -10);
    cr_expect_eq(R(HP_F16, 1 + u / 2), 1.0);
    cr_expect_eq(R(HP_F16, 1 + 3 * u / 2), 1 + 2 * u);
    cr_expect_eq(R(HP_F16, 0.1), 0.0999755859375);
    cr_expect_eq(R(HP_F16, 65504), 65504);
    cr_expect_eq(R(HP_F16, 65519.99), 65504);
    cr_expect(isinf(R(HP_F16, 65520))); /* the tie above the max rounds to even: inf */
    cr_expect_eq(R(HP_F16, -70000), -INFINITY);
    double tiny = ldexp(1, -24);
    cr_expect_eq(R(HP_F16, tiny), tiny);
    cr_expect_eq(R(HP_F16, tiny / 2), 0.0);
    cr_expect_eq(R(HP_F16, tiny * 0.75), tiny);
    cr_expect_eq(R(HP_F16, tiny * 3.5), 4 * tiny);
    cr_expect_eq(R(HP_F16, 1000 * tiny + 0.3 * tiny), 1000 * tiny);
}

#ifdef __FLT16_MAX__
Test(eval_round, f16_matches_compiler_float16) {
    double x[4096];
    hp_th_rand(x, 4096, 9, -1, 1);
    for (int i = 0; i < 4096; i++) {
        double v = ldexp(x[i], (i % 48) - 30);
        _Float16 h = (_Float16)v;
        cr_assert_eq(R(HP_F16, v), (double)h, "x = %a", v);
    }
}
#endif

Test(eval_round, f32_ints_bool) {
    cr_expect_eq(R(HP_F32, 0.1), (double)0.1f);
    cr_expect_eq(R(HP_F32, 1e39), INFINITY);
    cr_expect_eq(R(HP_F32, ldexp(1, -149)), ldexp(1, -149));
    cr_expect_eq(R(HP_F32, ldexp(1, -150)), 0.0);
    cr_expect_eq(R(HP_I32, 2.9), 2);
    cr_expect_eq(R(HP_I32, -2.9), -2);
    cr_expect_eq(R(HP_I64, -0.5), 0);
    cr_expect_eq(R(HP_I64, 1e15 + 0.5), 1e15);
    cr_expect_eq(R(HP_BOOL, -0.1), 1);
    cr_expect_eq(R(HP_BOOL, 0.0), 0);
    cr_expect_eq(R(HP_BOOL, NAN), 1);
}
