/* tests/fuzz/fuzz_hpir.c — a libFuzzer target for the .hpir parser (hp_graph_parse).
 * Properties: no crash, no leak, no sanitizer report; an accepted input verifies, prints,
 * and the printed text parses back to an equal graph that prints the same text.
 *
 * Not part of the default build (tests/CMakeLists.txt builds only test_*.c files). Build the
 * libraries as for fuzz_job.c (clang, HP_SANITIZE=ON, -fsanitize=fuzzer-no-link), then:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I. -Ibuild-fuzz/proto \
 *       tests/fuzz/fuzz_hpir.c build-fuzz/graph/libhp_graph.a build-fuzz/proto/libhp_proto.a \
 *       -lprotobuf-c -lm -o build-fuzz/fuzz_hpir
 *   mkdir -p build-fuzz/hpir && cp tests/golden/small_mlp.hpir build-fuzz/hpir/
 *   build-fuzz/fuzz_hpir -max_len=8192 build-fuzz/hpir
 *
 * `hpctl inspect job.pb --hpir > build-fuzz/hpir/llama.hpir` adds a whole model to the seeds.
 */
#include "hp/text.h"

#include <stdlib.h>
#include <string.h>

static void check(int ok) {
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hp_graph *g = NULL;
    if (hp_graph_parse((const char *)data, size, &g, NULL) != HP_OK) {
        check(g == NULL);
        return 0;
    }
    check(hp_graph_verify(g, NULL) == HP_OK);
    char *text = NULL, *again = NULL;
    size_t len = 0;
    hp_graph *back = NULL;
    check(hp_graph_print(g, &text, &len, NULL) == HP_OK);
    check(hp_graph_parse(text, len, &back, NULL) == HP_OK);
    check(hp_graph_eq(g, back));
    check(hp_graph_print(back, &again, NULL, NULL) == HP_OK);
    check(strcmp(text, again) == 0);
    hp_free(again);
    hp_graph_free(back);
    hp_free(text);
    hp_graph_free(g);
    return 0;
}
