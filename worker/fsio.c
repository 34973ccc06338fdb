/* worker/fsio.c — path joins and the jansson allocator hook (see fsio.h). */
#include "worker/fsio.h"

#include <jansson.h>
#include <pthread.h>
#include <string.h>

char *hp__path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = hp_malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    size_t k = la;
    if (la && a[la - 1] != '/') p[k++] = '/';
    memcpy(p + k, b, lb + 1);
    return p;
}

static pthread_once_t json_once = PTHREAD_ONCE_INIT;

static void json_init_once(void) {
    json_set_alloc_funcs(hp_malloc, hp_free);
}

void hp__json_init(void) {
    pthread_once(&json_once, json_init_once);
}

bool hp__alloc_failing(void) {
    void *p = hp_malloc(64);
    hp_free(p);
    return p == NULL;
}
