/* tests/fuzz/fuzz_hpir.c — a libFuzzer target for the .hpir parser (hp_graph_parse).
 * Properties: no crash, no leak, no sanitizer report; an accepted input verifies, prints,
 * and the printed text parses back to an equal graph that prints the same text.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/hpir/.
 */
#include "hp/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A property that does not hold: abort (libFuzzer keeps the input), saying which. */
#define check(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

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
