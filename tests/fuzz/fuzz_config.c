/* tests/fuzz/fuzz_config.c — a libFuzzer target for hpd's config file parser
 * (hpd_settings_parse, daemon/config.c: the --config file, read again on SIGHUP).
 * Properties: no crash, no leak, no sanitizer report; every key an accepted file gives
 * formats, and that text is accepted again by hpd_settings_set with the same result.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/config/.
 */
#include "daemon/config.h"

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
    hpd_settings s;
    hpd_settings_defaults(&s);
    bool given[HPD_KEY_COUNT] = {0};
    if (hpd_settings_parse(&s, "fuzz.conf", (const char *)data, size, given, NULL) != HP_OK)
        return 0;
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        if (!given[k]) continue;
        char buf[4096];
        hpd_settings_format(&s, (hpd_key)k, buf, sizeof buf);
        hpd_settings t;
        hpd_settings_defaults(&t);
        check(hpd_settings_set(&t, (hpd_key)k, buf, NULL) == HP_OK);
        check(hpd_settings_same(&s, &t, (hpd_key)k));
    }
    return 0;
}
