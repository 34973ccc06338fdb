/* tests/util/fsdp_fixture.h — FSDP-shaped per-rank graphs for the scheduling-pass tests
 * (overlap, bucketing) without the FSDP pass, and a collective hook that simulates N ranks on
 * the reference evaluator. Test code only: failures are Criterion assertions.
 */
#ifndef HP_TEST_FSDP_FIXTURE_H
#define HP_TEST_FSDP_FIXTURE_H

#include "hp/eval.h"
#include "hp/passes.h"

/* The per-rank graph docs/fsdp.md describes, built independently of passes/fsdp.c from a
 * joint graph (outputs: loss, then one gradient per parameter): parameters whose FQN matches
 * `pattern` (hp_fqn_match; NULL: all) become shards [ceil(d0/N), ...] with global_shape,
 * group_size and group "dp"; each is gathered (all_gather_into_tensor, wait_tensor, slice
 * when padded) just before its first forward use and, with `reshard`, again before the first
 * backward node that reads the parameter itself (unlike passes/fsdp.c, a backward reading a
 * forward view of it, such as a linear layer's t(W), keeps the forward copy); its gradient goes
 * through (slice_backward when padded,) reduce_scatter_tensor (avg) and wait_tensor. Unmarked
 * parameters' gradients and the loss (viewed [1]) are all-reduced (avg). Data inputs stay as they
 * are. Returns a verified graph (free it). */
hp_graph *hp_fx_fsdp(const hp_graph *joint, int world, bool reshard, const char *pattern);

/* A tiny Llama-3 joint graph (dim 64, `layers` layers, 4 heads, 2 kv heads, ffn 96, vocab
 * 128, batch 2, seq 8). */
hp_graph *hp_fx_llama(int layers);

/* Collective hook simulating every rank j with a different input that is a fixed function of
 * this one, so that a wrong layout shows: all_gather chunk j = in + j; reduce_scatter =
 * reduce over j of chunk j of in (as if rank j sent its chunk); all_reduce = reduce over j of
 * in + j; all_to_all = in. ctx is unused. */
hp_status hp_fx_collective(void *ctx, const hp_node *n, const hp_tensor *in, hp_tensor *out,
                           hp_err *err);

/* Evaluates a and b (same placeholders) on the same random inputs (floats in [-1, 1), integers
 * in [0, int_bound)) with hp_fx_collective, in F32, and asserts every output bitwise equal. */
void hp_fx_expect_same_values(const hp_graph *a, const hp_graph *b, int64_t int_bound);

/* A job (caller storage, hp_job_fini it) with the defaults and the given pass config. */
void hp_fx_job(hp_job *job, bool overlap, int prefetch, int64_t bucket_bytes);

/* Runs pass on g with job and world 2, asserting success and a verified result. */
hp_graph *hp_fx_run_pass(hp_pass_fn pass, const hp_graph *g, const hp_job *job);

#endif
