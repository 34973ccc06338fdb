/* tests/fuzz/fuzz_program.c — a libFuzzer target for the program decoder (hp_program_unpack:
 * what a worker reads from its coordinator). Properties: no crash, no leak, no sanitizer
 * report; an accepted program (unpack verifies it) re-encodes to bytes that decode to a
 * program that encodes to the same bytes, and prints.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/program/.
 */
#include "hp/program.h"

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
    hp_program *p = NULL;
    if (hp_program_unpack(data, size, &p, NULL) != HP_OK) {
        check(p == NULL);
        return 0;
    }
    check(hp_program_verify(p, NULL) == HP_OK);
    uint8_t *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    hp_program *back = NULL;
    check(hp_program_pack(p, &a, &la, NULL) == HP_OK);
    check(hp_program_unpack(a, la, &back, NULL) == HP_OK);
    check(hp_program_pack(back, &b, &lb, NULL) == HP_OK);
    check(la == lb && memcmp(a, b, la) == 0);
    char *text = NULL;
    check(hp_program_print(p, &text, NULL) == HP_OK);
    hp_free(text);
    hp_free(b);
    hp_free(a);
    hp_program_free(back);
    hp_program_free(p);
    return 0;
}
