/* worker/param_init.c — sharding-independent parameter init (hp/param_init.h).
 *
 * A fill is prepared once (validate, hash the FQN, precompute the truncated normal's CDF
 * bounds) and then each element is drawn from its own Philox counter, so the same code serves
 * a whole tensor, a shard of it, or one chunk of a parallel fill.
 */
#include "hp/param_init.h"

#include "hp/rng.h"

#include <math.h>

#define ARANGE_MAX ((int64_t)1 << 24) /* f32 holds every integer up to here exactly */

typedef struct plan {
    hp_init spec;
    uint64_t seed, stream;
    double alpha, beta; /* trunc_normal: standardized bounds, mirrored when flip */
    double cdf_lo, mass;
    int flip;
} plan;

static hp_status prepare(const hp_init *spec, uint64_t seed, const char *fqn, int64_t first,
                         int64_t count, const float *out, plan *p, hp_err *err) {
    if (!spec) return hp_errf(err, HP_INVALID, "param init: spec is NULL");
    if (!fqn || !*fqn) return hp_errf(err, HP_INVALID, "param init: FQN is NULL or empty");
    HP_TRY(hp_init_check(spec, err));
    if (spec->kind == HP_INIT_NONE)
        return hp_errf(err, HP_INVALID, "param init %s: init spec is none (nothing to fill)", fqn);
    if (first < 0 || count < 0 || first > INT64_MAX - count)
        return hp_errf(err, HP_INVALID,
                       "param init %s: element range [%lld, +%lld) is negative or overflows", fqn,
                       (long long)first, (long long)count);
    if (count > 0 && !out) return hp_errf(err, HP_INVALID, "param init %s: out is NULL", fqn);
    if (spec->kind == HP_INIT_ARANGE && first + count > ARANGE_MAX)
        return hp_errf(err, HP_INVALID,
                       "param init %s: arange up to %lld is not exact in f32 (at most 2^24)", fqn,
                       (long long)(first + count));
    *p = (plan){.spec = *spec, .seed = seed, .stream = hp_rng_stream_id(fqn)};
    if (spec->kind == HP_INIT_TRUNC_NORMAL) {
        double alpha = (spec->a - spec->mean) / spec->std;
        double beta = (spec->b - spec->mean) / spec->std;
        p->flip = alpha > 0;
        p->alpha = p->flip ? -beta : alpha;
        p->beta = p->flip ? -alpha : beta;
        p->cdf_lo = hp_normal_cdf(p->alpha);
        p->mass = hp_normal_cdf(p->beta) - p->cdf_lo;
        if (!(p->mass > 0) || !isfinite(p->alpha) || !isfinite(p->beta))
            return hp_errf(err, HP_INVALID,
                           "param init %s: trunc_normal(%g, %g, %g, %g) has no probability mass "
                           "in double precision (bounds %g and %g std from the mean)",
                           fqn, spec->mean, spec->std, spec->a, spec->b, alpha, beta);
    }
    return HP_OK;
}

/* Largest float strictly below b, for keeping uniform draws in [a, b). */
static float below(double b) {
    float f = (float)b;
    while ((double)f >= b) f = nextafterf(f, -INFINITY);
    return f;
}

static void fill_range(const plan *p, int64_t first, int64_t count, float *out) {
    const hp_init *s = &p->spec;
    switch (s->kind) {
    case HP_INIT_ZEROS:
        for (int64_t i = 0; i < count; i++) out[i] = 0.0f;
        return;
    case HP_INIT_ONES:
        for (int64_t i = 0; i < count; i++) out[i] = 1.0f;
        return;
    case HP_INIT_CONSTANT:
        for (int64_t i = 0; i < count; i++) out[i] = (float)s->a;
        return;
    case HP_INIT_ARANGE: /* exact below 2^24 (prepare refuses more) */
        for (int64_t i = 0; i < count; i++) out[i] = (float)(first + i);
        return;
    case HP_INIT_UNIFORM: {
        float top = below(s->b);
        for (int64_t i = 0; i < count; i++) {
            uint32_t w[4];
            hp_rng_bits(p->seed, p->stream, (uint64_t)(first + i), w);
            float f = (float)(s->a + (s->b - s->a) * hp_rng_u01_co(w));
            out[i] = f > top ? top : f;
        }
        return;
    }
    case HP_INIT_NORMAL:
        for (int64_t i = 0; i < count; i++) {
            uint32_t w[4];
            hp_rng_bits(p->seed, p->stream, (uint64_t)(first + i), w);
            double r = sqrt(-2 * log(hp_rng_u01_oc(w)));
            double z = r * cos(2 * M_PI * hp_rng_u01_co(w + 2));
            out[i] = (float)(s->mean + s->std * z);
        }
        return;
    case HP_INIT_TRUNC_NORMAL:
        for (int64_t i = 0; i < count; i++) {
            uint32_t w[4];
            hp_rng_bits(p->seed, p->stream, (uint64_t)(first + i), w);
            double z = hp_normal_quantile(p->cdf_lo + hp_rng_u01_oo(w) * p->mass);
            z = z < p->alpha ? p->alpha : z > p->beta ? p->beta : z;
            if (p->flip) z = -z;
            double x = s->mean + s->std * z;
            x = x < s->a ? s->a : x > s->b ? s->b : x;
            out[i] = (float)x;
        }
        return;
    case HP_INIT_NONE:
        break;
    }
    HP_ASSERT(0 && "init kind validated in prepare");
}

hp_status hp_param_init_fill(const hp_init *spec, uint64_t seed, const char *fqn,
                             int64_t first_index, int64_t count, float *out, hp_err *err) {
    plan p;
    HP_TRY(prepare(spec, seed, fqn, first_index, count, out, &p, err));
    fill_range(&p, first_index, count, out);
    return HP_OK;
}

typedef struct par_ctx {
    const plan *p;
    int64_t first;
    float *out;
} par_ctx;

static void par_chunk(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const par_ctx *c = ctx;
    fill_range(c->p, c->first + begin, end - begin, c->out + begin);
}

hp_status hp_param_init_fill_par(hp_pool *pool, const hp_init *spec, uint64_t seed, const char *fqn,
                                 int64_t first_index, int64_t count, float *out, hp_err *err) {
    plan p;
    HP_TRY(prepare(spec, seed, fqn, first_index, count, out, &p, err));
    par_ctx c = {&p, first_index, out};
    hp_pool_parallel_for(pool, count, 4096, par_chunk, &c);
    return HP_OK;
}
