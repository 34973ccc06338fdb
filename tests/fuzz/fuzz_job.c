/* tests/fuzz/fuzz_job.c — a libFuzzer target for the job and graph decoders (hp_job_unpack,
 * hp_graph_unpack). Properties: no crash, no leak, no sanitizer report; an accepted input
 * validates, and re-encodes to bytes that decode to an equal job (graph).
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/job/.
 */
#include "hp/job.h"
#include "hp/proto_io.h"

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

static void fuzz_job(const uint8_t *data, size_t size) {
    hp_job *job = NULL;
    if (hp_job_unpack(data, size, &job, NULL) != HP_OK) {
        check(job == NULL);
        return;
    }
    check(hp_job_validate(job, NULL) == HP_OK);
    uint8_t *again = NULL;
    size_t len = 0;
    hp_job *back = NULL;
    check(hp_job_pack(job, &again, &len, NULL) == HP_OK);
    check(hp_job_unpack(again, len, &back, NULL) == HP_OK);
    check(hp_job_eq(job, back));
    hp_job_free(back);
    hp_free(again);
    hp_job_free(job);
}

static void fuzz_graph(const uint8_t *data, size_t size) {
    hp_graph *g = NULL;
    if (hp_graph_unpack(data, size, &g, NULL) != HP_OK) {
        check(g == NULL);
        return;
    }
    check(hp_graph_verify(g, NULL) == HP_OK);
    uint8_t *again = NULL;
    size_t len = 0;
    hp_graph *back = NULL;
    check(hp_graph_pack(g, &again, &len, NULL) == HP_OK);
    check(hp_graph_unpack(again, len, &back, NULL) == HP_OK);
    check(hp_graph_eq(g, back));
    hp_graph_free(back);
    hp_free(again);
    hp_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_job(data, size);
    fuzz_graph(data, size);
    return 0;
}
