/* tests/util/spmd_sim.h — simulated ranks for SPMD graphs: one thread per rank of a mesh
 * (row-major coordinates, the last dim fastest), each running its piece of a placed graph on
 * the reference evaluator in f64, collectives exchanged among the ranks of their mesh dim's
 * group. The check compares every rank's loss and gradient pieces with the 1-rank graph.
 */
#ifndef HP_TESTS_UTIL_SPMD_SIM_H
#define HP_TESTS_UTIL_SPMD_SIM_H

#include "hp/graph.h"
#include "hp/passes.h"

#define HP_TH_SPMD_MAX_RANKS 4
#define HP_TH_SPMD_VOCAB     128 /* index inputs are drawn in [0, this) */

/* Places g (a joint graph: loss, then one gradient per parameter) on mesh with placeholder
 * placements pl[n_placeholders * ndim] (hp_pass_spmd), runs it on every simulated rank from
 * random inputs (a buffer with an init spec gets its init values, e.g. arange), and expects
 * each rank's loss and gradient pieces to equal the 1-rank graph's within 1e-10. Returns the
 * placed graph (the caller frees it). */
hp_graph *hp_th_spmd_check(const hp_graph *g, const hp_graph_mesh *mesh, const hp_placement *pl);

/* The same with hp_pass_spmd_ex's options: pl are the storage placements (inputs cut and
 * gradients compared by them, uneven splits padded with zeros), opts->compute what the
 * placeholders are consumed in. */
hp_graph *hp_th_spmd_check_opts(const hp_graph *g, const hp_graph_mesh *mesh,
                                const hp_placement *pl, const hp_spmd_opts *opts);

/* A pass run on the placed graph before it is evaluated (e.g. overlap, then bucketing):
 * returns a new graph (placed is borrowed), NULL to fail the check. */
typedef hp_graph *(*hp_th_spmd_post)(const hp_graph *placed, void *ctx);

/* hp_th_spmd_check_opts, evaluating post(placed graph) instead, which must verify and give the
 * same results; returns that graph (the caller frees it). post NULL: check_opts. */
hp_graph *hp_th_spmd_check_post(const hp_graph *g, const hp_graph_mesh *mesh,
                                const hp_placement *pl, const hp_spmd_opts *opts,
                                hp_th_spmd_post post, void *post_ctx);

/* All-reduces of `numel` elements on mesh dim `group` in g. */
int hp_th_spmd_count_all_reduces(const hp_graph *g, int64_t numel, const char *group);

#endif
