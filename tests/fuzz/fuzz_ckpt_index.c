/* tests/fuzz/fuzz_ckpt_index.c — a libFuzzer target for the checkpoint index reader
 * (hp_ckpt_open, worker/checkpoint_read.c: DIR/step-N/index.json, parsed and checked
 * against the rank files). LLVMFuzzerInitialize saves a small real checkpoint
 * (fuzz_ckpt_fixture.h) in a private temporary directory; each input replaces its index.json.
 * Properties: no crash, no leak, no sanitizer report; an index that is accepted describes
 * exactly the tensors saved, which read back as saved.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/ckpt_index/
 * (the index hp_ckpt_save writes for this checkpoint is one: tests/fuzz/make_seeds.c).
 */
#include "hp/checkpoint.h"

#include "fuzz_ckpt_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[4000], index_path[4096];

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
    snprintf(dir, sizeof dir, "%s/hp-fuzz-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    check(mkdtemp(dir) != NULL);
    check(hp_fuzz_ckpt_save(dir) == HP_OK);
    snprintf(index_path, sizeof index_path, "%s/step-%08d/%s", dir, HP_FUZZ_CKPT_STEP,
             HP_CKPT_INDEX);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(index_path, "wb");
    check(f != NULL);
    check(fwrite(data, 1, size, f) == size || size == 0);
    check(fclose(f) == 0);
    hp_ckpt *c = NULL;
    if (hp_ckpt_open(dir, HP_FUZZ_CKPT_STEP, &c, NULL) != HP_OK) {
        check(c == NULL);
        return 0;
    }
    check(hp_ckpt_world(c) == 2 && hp_ckpt_count(c) == 2);
    check(hp_ckpt_get_scalars(c)->step == HP_FUZZ_CKPT_STEP);
    float w[12] = {0};
    const int64_t off[2] = {0, 0}, len[2] = {4, 3};
    check(hp_ckpt_read_box(c, "w", HP_CKPT_PARAM, 2, off, len, NULL, w, sizeof w, NULL) == HP_OK);
    check(memcmp(w, hp_fuzz_w, sizeof w) == 0);
    hp_ckpt_close(c);
    return 0;
}
