/* tests/fuzz/fuzz_frame.c — a libFuzzer target for the worker protocol's frame reader
 * (hp_frame_reader, include/hp/frame.h: what hpd reads from a worker and a worker from hpd).
 * The first input byte picks the feed chunk size (1..256), the rest is the stream, fed in
 * chunks with every complete frame taken after each. Properties: no crash, no leak, no
 * sanitizer report; the reader never buffers more than max + 4 bytes; every frame read
 * re-encodes and reads back from a fresh reader.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/frame/.
 */
#include "hp/frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX ((size_t)1 << 16) /* small, so that the length limit is reached */

/* A property that does not hold: abort (libFuzzer keeps the input), saying which. */
#define check(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void roundtrip(const Hp__V1__Frame *f) {
    uint8_t *enc = NULL;
    size_t len = 0;
    if (hp_frame_encode(f, &enc, &len, NULL) != HP_OK) return; /* HP_LIMIT / HP_NOMEM */
    hp_frame_reader r;
    hp_frame_reader_init(&r, HP_FRAME_MAX);
    Hp__V1__Frame *g = NULL;
    check(hp_frame_reader_feed(&r, enc, len, NULL) == HP_OK);
    check(hp_frame_reader_next(&r, &g, NULL) == HP_OK && g != NULL);
    check(g->body_case == f->body_case);
    hp_frame_free(g);
    check(hp_frame_reader_next(&r, &g, NULL) == HP_OK && g == NULL);
    hp_frame_reader_fini(&r);
    hp_free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t chunk = (size_t)data[0] + 1;
    data++, size--;
    hp_frame_reader r;
    hp_frame_reader_init(&r, MAX);
    for (size_t off = 0; off < size;) {
        size_t n = size - off < chunk ? size - off : chunk;
        if (hp_frame_reader_feed(&r, data + off, n, NULL) != HP_OK) break;
        off += n;
        check(r.len - r.off <= MAX + 4);
        for (;;) {
            Hp__V1__Frame *f = NULL;
            if (hp_frame_reader_next(&r, &f, NULL) != HP_OK) {
                check(f == NULL);
                goto done;
            }
            if (!f) break;
            roundtrip(f);
            hp_frame_free(f);
        }
    }
done:
    hp_frame_reader_fini(&r);
    return 0;
}
