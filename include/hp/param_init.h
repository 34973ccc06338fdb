/* hp/param_init.h — parameter initialisation that does not depend on sharding.
 *
 * Element g (the global, row-major element index) of the parameter `fqn` gets a value that is
 * a pure function of (init spec, seed, fqn, g): the 128 Philox bits at
 * (seed, hp_rng_stream_id(fqn), g) (see hp/rng.h) mapped through the distribution:
 *
 *   zeros, ones, constant(a)    the value; no random bits used
 *   arange                      g itself (exact: g < 2^24 or refused); a buffer placed
 *                               Shard(0) then holds its own global indices (loss parallel's
 *                               vocab_index)
 *   uniform(a, b)               a + (b - a) * u, u = top 53 bits of w0:w1 in [0, 1); in [a, b)
 *   normal(mean, std)           mean + std * sqrt(-2 ln u1) * cos(2 pi u2),
 *                               u1 from w0:w1 in (0, 1], u2 from w2:w3 in [0, 1) (Box-Muller,
 *                               one value per element: no state passes between elements)
 *   trunc_normal(m, s, a, b)    inverse CDF: with alpha = (a - m) / s, beta = (b - m) / s,
 *                               z = Phi^-1(Phi(alpha) + u (Phi(beta) - Phi(alpha))), u from w0:w1
 *                               in (0, 1); computed on the mirrored interval when alpha > 0
 *                               so the tail keeps its precision; m + s z clamped to [a, b]
 *
 * all in double precision, rounded to float once at the end. So filling [0, N) in one call
 * equals filling any split of it in pieces, on any rank, in any order. Values are computed on
 * the host; a device backend copies them rather than recomputing with its own libm.
 */
#ifndef HP_PARAM_INIT_H
#define HP_PARAM_INIT_H

#include "hp/base.h"
#include "hp/graph.h"
#include "hp/threads.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes elements [first_index, first_index + count) of parameter `fqn` to out[0..count).
 * Errors (nothing is written): spec invalid (hp_init_check) or HP_INIT_NONE; fqn NULL or
 * empty; first_index < 0, count < 0 or their sum overflowing; out NULL with count > 0; a
 * trunc_normal interval with no probability mass in double precision (bounds beyond ~37 std
 * on the same side). Thread-safe; out is borrowed. */
hp_status hp_param_init_fill(const hp_init *spec, uint64_t seed, const char *fqn,
                             int64_t first_index, int64_t count, float *out, hp_err *err);

/* The same, with the elements spread over `pool` (NULL: the calling thread). The values are
 * identical to hp_param_init_fill's whatever the pool size. */
hp_status hp_param_init_fill_par(hp_pool *pool, const hp_init *spec, uint64_t seed, const char *fqn,
                                 int64_t first_index, int64_t count, float *out, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
