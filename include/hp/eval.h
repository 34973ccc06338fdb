/* hp/eval.h — the reference evaluator: a plain, obviously-correct interpreter of the IR on the
 * CPU. It is the yardstick every fast backend is checked against and what gradient checks
 * run on. Speed is not a goal; clarity is.
 *
 * Every tensor is held as doubles. In HP_EVAL_F32 precision each op computes in double
 * (so reductions accumulate in f64) and rounds its result to the node's dtype (f32, bf16 or
 * f16 rounding to nearest even; integers truncated). In HP_EVAL_F64 nothing is rounded:
 * floating dtypes are treated as f64, which finite-difference checks need.
 * Collectives go through an optional callback (a simulated rank); without one they are
 * HP_UNSUPPORTED.
 */
#ifndef HP_EVAL_H
#define HP_EVAL_H

#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_tensor {
    hp_type type;
    double *data; /* [numel], hp_malloc'd, row-major */
} hp_tensor;

/* Allocates zeroed storage for `type`. HP_LIMIT for more than HP_EVAL_MAX_NUMEL elements. */
#define HP_EVAL_MAX_NUMEL ((int64_t)1 << 31)
hp_status hp_tensor_alloc(hp_tensor *t, hp_type type, hp_err *err);
void hp_tensor_free(hp_tensor *t); /* idempotent; leaves data NULL */

typedef enum { HP_EVAL_F32 = 0, HP_EVAL_F64 = 1 } hp_eval_precision;

/* Collective hook: fill `out` (already allocated with the node's output type) from `in`. */
typedef hp_status (*hp_eval_collective_fn)(void *ctx, const hp_node *n, const hp_tensor *in,
                                           hp_tensor *out, hp_err *err);

/* Dropout hook (a simulated rank): where native_dropout node n's local piece sits in the whole
 * tensor, off[d] and global[d] for each of its dims (hp_dropout_site; both arrive as one rank's:
 * off 0, global = the local shape). */
typedef hp_status (*hp_eval_dropout_fn)(void *ctx, const hp_node *n, int64_t *off, int64_t *global,
                                        hp_err *err);

typedef struct hp_eval_opts {
    hp_eval_precision precision;
    hp_eval_collective_fn collective; /* NULL: collectives are HP_UNSUPPORTED */
    void *collective_ctx;
    uint64_t seed, step;             /* the draw of native_dropout's masks (hp/rng.h) */
    hp_eval_dropout_fn dropout_site; /* NULL: the graph holds whole tensors */
    void *dropout_ctx;
} hp_eval_opts;

/* Runs g. inputs[i] feeds placeholder i (node i), n_inputs must equal the placeholder count
 * and each type must equal the placeholder's. outputs[0..g->n_outputs) are allocated by the
 * callee (free each with hp_tensor_free), and left empty on failure. Intermediates are freed
 * after their last use. Errors name the node: "node 12 (embedding): index 4096 out of range
 * [0, 2048)". opts may be NULL (F32, no collectives). */
hp_status hp_eval(const hp_graph *g, const hp_tensor *inputs, int n_inputs,
                  const hp_eval_opts *opts, hp_tensor *outputs, hp_err *err);

/* Rounds a double to the nearest value of dtype dt (round-to-nearest-even for bf16/f16). */
double hp_eval_round(hp_dtype dt, double x);

#ifdef __cplusplus
}
#endif
#endif
