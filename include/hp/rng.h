/* hp/rng.h — counter-based random numbers: Philox4x32-10 and the stream layout hp uses.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11; the generator of cuRAND and JAX) maps a 128-bit counter and a 64-bit key to 128
 * random bits with no state. hp draws every random number as a pure function of
 *
 *     key     = the 64-bit seed                          {seed & 0xffffffff, seed >> 32}
 *     counter = {index lo32, index hi32, stream lo32, stream hi32}
 *
 * where `stream` is the 64-bit FNV-1a hash of a name (a parameter's FQN, "data", ...) and
 * `index` a 64-bit position (a parameter's global element index). Any slice of any stream can
 * be computed independently, so sharded parameter init equals unsharded init and a resumed
 * run needs no generator state beyond (seed, position).
 *
 * Dropout masks (hp_dropout_keep) draw from the stream of the dropout node's fqn moved by the
 * training step, stream = hp_rng_stream_id(fqn) + step * 0x9E3779B97F4A7C15 (mod 2^64), at
 * index g / 4 of the element's global flat index g, and use word g % 4: element g is dropped when
 * that word is below round(p * 2^32). A piece of a sharded tensor draws from its global
 * indices, so N ranks drop exactly the elements one rank drops.
 *
 * Not here: distributions of parameters (hp/param_init.h) and any stateful generator.
 */
#ifndef HP_RNG_H
#define HP_RNG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The raw generator: 10 rounds of Philox4x32 on ctr with key; out may alias ctr. Matches the
 * Random123 known-answer vectors. */
void hp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* 64-bit FNV-1a of a NUL-terminated string (offset basis 0xcbf29ce484222325, prime
 * 0x100000001b3). Stable forever: checkpoints and other implementations depend on it. */
uint64_t hp_rng_stream_id(const char *name);

/* The 128 random bits at (seed, stream, index), as laid out above. */
void hp_rng_bits(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);

/* Uniform doubles from two 32-bit words w[0] (high) and w[1] (low), using their top 53 bits:
 * _co in [0, 1) (k 2^-53), _oc in (0, 1] ((k + 1) 2^-53); _oo in (0, 1) uses the top 52,
 * (k + 1/2) 2^-52. */
double hp_rng_u01_co(const uint32_t w[2]);
double hp_rng_u01_oc(const uint32_t w[2]);
double hp_rng_u01_oo(const uint32_t w[2]);

/* Standard normal quantile Phi^-1(p) for p in (0, 1) to about 1 ulp (Acklam's rational
 * approximation refined by one Halley step on erfc); p outside (0, 1) gives -inf, +inf or NaN
 * as the limits say. */
double hp_normal_quantile(double p);
/* Standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2. */
double hp_normal_cdf(double x);

/* ---- dropout ----------------------------------------------------------------------------------
 */
#define HP_RNG_MAX_RANK 8 /* = HP_MAX_RANK (graph/rng.c checks) */

/* Where one dropout draws: which draw (seed, step, stream), and where the rank's local piece of
 * shape local[rank] sits in the whole tensor: local element idx[] is global element
 * off[d] + idx[d] of a tensor of shape global[rank] (off 0, global = local on one rank). */
typedef struct hp_dropout_site {
    uint64_t seed, step;
    uint64_t stream; /* hp_rng_stream_id(the node's fqn) */
    int rank;
    int64_t local[HP_RNG_MAX_RANK], off[HP_RNG_MAX_RANK], global[HP_RNG_MAX_RANK];
    bool eval; /* evaluation (torch's model.eval()): the dropout keeps everything, unscaled */
} hp_dropout_site;

/* The stream a site's mask draws from: s->stream + s->step * 0x9E3779B97F4A7C15 (mod 2^64). */
uint64_t hp_dropout_stream(const hp_dropout_site *s);
/* round(p * 2^32), clamped to 2^32 - 1; p in [0, 1). */
uint32_t hp_dropout_threshold(double p);
/* keep[i - first] = 0 (dropped) or 1 for the local flat elements i in [first, first + count)
 * (row-major over s->local), as laid out above. */
void hp_dropout_keep(const hp_dropout_site *s, uint32_t threshold, int64_t first, int64_t count,
                     uint8_t *keep);

#ifdef __cplusplus
}
#endif
#endif
