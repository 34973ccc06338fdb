/* tests/fuzz/fuzz_safetensors.c — a libFuzzer target for the safetensors reader (hp_st_parse,
 * the in-memory form of hp_st_open: --init-from weights and checkpoint shards). Properties:
 * no crash, no leak, no sanitizer report; every tensor of an accepted file lies inside the
 * input, is found by its name, and a floating one converts to f32.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/safetensors/.
 */
#include "hp/safetensors.h"

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
    /* a copy of exactly size bytes: ASan sees any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    hp_st_file *f = NULL;
    if (hp_st_parse(buf, size, "fuzz", &f, NULL) != HP_OK) {
        check(f == NULL);
        free(buf);
        return 0;
    }
    for (int i = 0; i < hp_st_count(f); i++) {
        const hp_st_tensor *t = hp_st_at(f, i);
        check(t && t->name);
        check(t->nbytes == 0 || ((const uint8_t *)t->data >= buf &&
                                 (const uint8_t *)t->data + t->nbytes <= buf + size));
        check(hp_st_find(f, t->name) == t);
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++) n *= t->shape[d];
        if (n <= 4096) {
            float *out = malloc((size_t)(n ? n : 1) * sizeof *out);
            if (out) {
                (void)hp_st_to_f32(t, out, n, NULL); /* HP_INVALID for integer dtypes */
                free(out);
            }
        }
    }
    for (int i = 0; i < hp_st_meta_count(f); i++) {
        const hp_st_kv *kv = hp_st_meta_at(f, i);
        check(kv && kv->key && kv->value && hp_st_meta_get(f, kv->key) != NULL);
    }
    hp_st_close(f);
    free(buf);
    return 0;
}
