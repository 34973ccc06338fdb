/* tests/graph/test_eval_memory.c — the reference evaluator on a whole Llama-3 joint graph:
 * it runs, gives a loss near log(vocab) for near-zero weights, and frees intermediates after
 * their last use, so the process's peak resident size stays well below the sum of every
 * value the graph produces. */
#include "hp/eval.h"
#include "hp/models.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#if defined(__SANITIZE_ADDRESS__)
#define HP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HP_TEST_ASAN 1
#endif
#endif

static double peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0; /* Linux reports KiB */
}

Test(eval_memory, llama_joint_frees_intermediates, .timeout = 300) {
    hp_model_spec s;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &err), HP_OK, "%s", err.msg);
    s.batch = 4;
    s.seq = 128;
    s.dim = 128;
    s.n_layers = 8;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.ffn_hidden = 256;
    s.vocab = 512;
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build_joint(&s, &g, &err), HP_OK, "%s", err.msg);

    /* Feeds: small weights (so the logits are near uniform), tokens and labels in range. */
    int n_in = 0;
    while (n_in < g->n_nodes && g->nodes[n_in].op == HP_OP_PLACEHOLDER) n_in++;
    hp_tensor *in = calloc((size_t)n_in, sizeof *in);
    cr_assert(in);
    uint64_t rng = 12345;
    for (int i = 0; i < n_in; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&in[i], *t, &err), HP_OK, "%s", err.msg);
        int64_t numel = hp_type_numel(t);
        for (int64_t k = 0; k < numel; k++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            double u = (double)(rng >> 11) / 9007199254740992.0;
            in[i].data[k] = hp_dtype_is_float(t->dtype) ? 0.002 * (u - 0.5)
                                                        : (double)(int64_t)(u * (double)s.vocab);
        }
    }

    double produced = 0; /* bytes if nothing were ever freed */
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_out; k++)
            produced += (double)hp_type_numel(&g->nodes[j].out[k]) * sizeof(double);

    hp_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
    cr_assert(out);
    double before = peak_rss_bytes();
    cr_assert_eq(hp_eval(g, in, n_in, NULL, out, &err), HP_OK, "%s", err.msg);
    double after = peak_rss_bytes();

    double loss = out[0].data[0];
    cr_expect(fabs(loss - log((double)s.vocab)) < 0.05, "loss %g, log(vocab) %g", loss,
              log((double)s.vocab));
    for (int i = 1; i < g->n_outputs; i++) cr_expect_not_null(out[i].data);
#ifndef HP_TEST_ASAN
    /* The joint graph keeps forward activations for the backward, so the live set is a sizable
     * fraction of the total; without freeing it would be all of it. */
    cr_log_info("peak %.1f MiB produced %.1f MiB", (after - before) / 1048576, produced / 1048576);
    cr_expect_lt(after - before, 0.6 * produced,
                 "peak grew by %.0f MiB while the graph produces %.0f MiB in all",
                 (after - before) / 1048576, produced / 1048576);
#else
    (void)before;
    (void)after;
#endif
    for (int i = 0; i < g->n_outputs; i++) hp_tensor_free(&out[i]);
    for (int i = 0; i < n_in; i++) hp_tensor_free(&in[i]);
    free(out);
    free(in);
    hp_graph_free(g);
}
