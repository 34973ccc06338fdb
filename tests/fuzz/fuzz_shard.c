/* tests/fuzz/fuzz_shard.c — a libFuzzer target for the llm.c token shard reader
 * (hp_data_open on a file, worker/data.c: the 256-int32 header, the version, the token
 * count against the file size, every token against the vocabulary). The input is written
 * to a file in a private temporary directory and opened as one shard. Properties: no
 * crash, no leak, no sanitizer report; an accepted shard yields batches whose tokens and
 * labels are < vocab.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/shard/.
 */
#include "hp/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 50304
#define B     2
#define T     8

static char path[4096];

/* A property that does not hold: abort (libFuzzer keeps the input), saying which. */
#define check(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *tmp = getenv("TMPDIR");
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/hp-fuzz-shard-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    check(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/shard.bin", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    check(f != NULL);
    check(fwrite(data, 1, size, f) == size || size == 0);
    check(fclose(f) == 0);
    hp_data_config cfg = {
        .path = path, .vocab = VOCAB, .batch = B, .seq = T, .world = 2, .seed = 1};
    hp_data *d = NULL;
    if (hp_data_open(&cfg, &d, NULL) != HP_OK) {
        check(d == NULL);
        return 0;
    }
    int64_t tok[B * T], lab[B * T];
    for (int64_t step = 0; step < 3; step++)
        for (int r = 0; r < 2; r++) {
            check(hp_data_next(d, r, step, tok, lab, NULL) == HP_OK);
            for (int i = 0; i < B * T; i++)
                check(tok[i] >= 0 && tok[i] < VOCAB && lab[i] >= 0 && lab[i] < VOCAB);
        }
    hp_data_free(d);
    return 0;
}
