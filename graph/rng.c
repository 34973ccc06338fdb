/* worker/rng.c — Philox4x32-10, the (seed, stream, index) layout and the normal quantile.
 *
 * Philox constants are the paper's: multipliers 0xD2511F53 and 0xCD9E8D57, Weyl key
 * increments 0x9E3779B9 (golden ratio) and 0xBB67AE85 (sqrt 3 - 1). The quantile is Peter
 * Acklam's rational approximation (relative error 1.15e-9) polished by one Halley step
 * against libm's erfc, which brings it to double precision.
 */
#include "hp/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void hp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    philox_round(c, k);
    for (int r = 1; r < 10; r++) {
        k[0] += PHILOX_W0;
        k[1] += PHILOX_W1;
        philox_round(c, k);
    }
    out[0] = c[0], out[1] = c[1], out[2] = c[2], out[3] = c[3];
}

uint64_t hp_rng_stream_id(const char *name) {
    uint64_t h = 0xcbf29ce484222325u;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) {
        h ^= *s;
        h *= 0x100000001b3u;
    }
    return h;
}

void hp_rng_bits(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    hp_philox4x32_10(ctr, key, out);
}

static inline uint64_t top53(const uint32_t w[2]) {
    return (((uint64_t)w[0] << 32) | w[1]) >> 11;
}

double hp_rng_u01_co(const uint32_t w[2]) {
    return (double)top53(w) * 0x1.0p-53;
}

double hp_rng_u01_oc(const uint32_t w[2]) {
    return (double)(top53(w) + 1) * 0x1.0p-53;
}

double hp_rng_u01_oo(const uint32_t w[2]) {
    /* 52 bits: (2^53 - 1 + 0.5) 2^-53 would round up to 1. */
    return ((double)(top53(w) >> 1) + 0.5) * 0x1.0p-52;
}

double hp_normal_cdf(double x) {
    return 0.5 * erfc(-x * M_SQRT1_2);
}

double hp_normal_quantile(double p) {
    static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                -2.759285104469687e+02, 1.383577518672690e+02,
                                -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                -1.556989798598866e+02, 6.680131188771972e+01,
                                -1.328068155288572e+01};
    static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                -2.400758277161838e+00, -2.549732539343734e+00,
                                4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                3.754408661907416e+00};
    const double p_low = 0.02425;
    if (isnan(p) || p < 0 || p > 1) return NAN;
    if (p == 0) return -INFINITY;
    if (p == 1) return INFINITY;

    double x;
    if (p < p_low) {
        double q = sqrt(-2 * log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else if (p <= 1 - p_low) {
        double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    } else {
        double q = sqrt(-2 * log1p(-p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    }
    /* Halley on f(x) = Phi(x) - p. In the upper half the error is taken on the complement,
     * 1 - Phi(x) = erfc(x / sqrt 2) / 2, which keeps its relative precision near p = 1. */
    double e = p <= 0.5 ? hp_normal_cdf(x) - p : (1 - p) - 0.5 * erfc(x * M_SQRT1_2);
    double u = e * sqrt(2 * M_PI) * exp(0.5 * x * x);
    if (!isfinite(u)) return x; /* |x| > ~37.6: the density underflows, Acklam must do */
    return x - u / (1 + 0.5 * x * u);
}

/* ---- dropout -------------------------------------------------------------------------------- */

#include "hp/graph.h"
_Static_assert(HP_RNG_MAX_RANK == HP_MAX_RANK, "hp_dropout_site holds a tensor's dims");

#define DROPOUT_STEP_MUL 0x9E3779B97F4A7C15u

uint32_t hp_dropout_threshold(double p) {
    if (!(p > 0)) return 0;
    double t = nearbyint(p * 4294967296.0);
    return t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
}

uint64_t hp_dropout_stream(const hp_dropout_site *s) {
    return s->stream + s->step * DROPOUT_STEP_MUL;
}

void hp_dropout_keep(const hp_dropout_site *s, uint32_t threshold, int64_t first, int64_t count,
                     uint8_t *keep) {
    if (count <= 0) return;
    uint64_t stream = hp_dropout_stream(s);
    int r = s->rank;
    if (r == 0) { /* a scalar: global element 0 */
        uint32_t w[4];
        hp_rng_bits(s->seed, stream, 0, w);
        keep[0] = w[0] >= threshold;
        return;
    }
    int64_t gst[HP_RNG_MAX_RANK], idx[HP_RNG_MAX_RANK];
    gst[r - 1] = 1;
    for (int d = r - 2; d >= 0; d--) gst[d] = gst[d + 1] * s->global[d + 1];
    int64_t rem = first;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = s->local[d] ? rem % s->local[d] : 0;
        rem = s->local[d] ? rem / s->local[d] : 0;
    }
    int64_t last = s->local[r - 1], done = 0;
    uint64_t have = UINT64_MAX;
    uint32_t w[4] = {0};
    while (done < count) {
        uint64_t g = 0;
        for (int d = 0; d < r; d++) g += (uint64_t)(s->off[d] + idx[d]) * (uint64_t)gst[d];
        int64_t run = last - idx[r - 1];
        if (run > count - done) run = count - done;
        for (int64_t j = 0; j < run; j++, g++) {
            if (g >> 2 != have) {
                have = g >> 2;
                hp_rng_bits(s->seed, stream, have, w);
            }
            keep[done + j] = w[g & 3] >= threshold;
        }
        done += run;
        idx[r - 1] = 0;
        for (int d = r - 2; d >= 0 && run; d--) {
            if (++idx[d] < s->local[d]) break;
            idx[d] = 0;
        }
    }
}
