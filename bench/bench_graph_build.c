/* bench/bench_graph_build.c — how long building a Llama-3 joint graph takes: forward build,
 * autodiff and verify, for each flavor, best of N runs.
 *
 * The peer is the 8B graph measured in the same run: the last column is each flavor's cost
 * per node relative to 8B's, which should stay near 1.0 (building is linear in the node
 * count). Usage: bench_graph_build [runs]   (default 5)
 */
#include "hp/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct timing {
    int nodes, fwd_nodes;
    double build, autodiff, verify; /* seconds, best of the runs */
} timing;

static int measure(const char *spec_text, int runs, timing *t) {
    hp_model_spec spec;
    hp_err err = {0};
    if (hp_model_spec_parse(spec_text, &spec, &err) != HP_OK) {
        fprintf(stderr, "bench_graph_build: %s\n", err.msg);
        return -1;
    }
    *t = (timing){.build = 1e30, .autodiff = 1e30, .verify = 1e30};
    for (int r = 0; r < runs; r++) {
        hp_graph *g = NULL;
        double t0 = now_s();
        if (hp_model_build(&spec, &g, &err) != HP_OK) goto fail;
        double t1 = now_s();
        t->fwd_nodes = g->n_nodes;
        if (hp_autodiff(g, g->outputs[0], &err) != HP_OK) goto fail;
        double t2 = now_s();
        if (hp_graph_verify(g, &err) != HP_OK) goto fail;
        double t3 = now_s();
        t->nodes = g->n_nodes;
        hp_graph_free(g);
        if (t1 - t0 < t->build) t->build = t1 - t0;
        if (t2 - t1 < t->autodiff) t->autodiff = t2 - t1;
        if (t3 - t2 < t->verify) t->verify = t3 - t2;
        continue;
    fail:
        fprintf(stderr, "bench_graph_build: %s: %s\n", spec_text, err.msg);
        hp_graph_free(g);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    if (runs < 1) runs = 1;
    static const char *const specs[] = {"llama3:debugmodel", "llama3:8B", "llama3:70B",
                                        "llama3:405B"};
    timing t[4], peer;
    if (measure("llama3:8B", runs, &peer) != 0) return 1;
    double peer_per_node = (peer.build + peer.autodiff + peer.verify) / peer.nodes;
    printf("joint graph build (forward + autodiff + verify), best of %d runs\n", runs);
    printf("%-18s %8s %8s %11s %11s %11s %11s %12s\n", "model", "fwd", "joint", "build_ms",
           "autodiff_ms", "verify_ms", "total_ms", "per_node/8B");
    for (int i = 0; i < 4; i++) {
        if (measure(specs[i], runs, &t[i]) != 0) return 1;
        double total = t[i].build + t[i].autodiff + t[i].verify;
        printf("%-18s %8d %8d %11.3f %11.3f %11.3f %11.3f %12.2f\n", specs[i], t[i].fwd_nodes,
               t[i].nodes, 1e3 * t[i].build, 1e3 * t[i].autodiff, 1e3 * t[i].verify, 1e3 * total,
               total / t[i].nodes / peer_per_node);
    }
    return 0;
}
