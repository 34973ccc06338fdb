/* graph/ops.c — the op table, built from graph/ops.def. */
#include "graph/graph_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Ops without a gradient rule name NULL in ops.def; pasted below that becomes hp__NULL. */
#define hp__NULL NULL

static const hp_op_info op_table[HP_OP_COUNT] = {
#define HP_OP(e, nm, nin, nout, req, opt, shape_fn, grad_fn, shard_fn, fl)                         \
    [HP_OP_##e] = {.name = nm,                                                                     \
                   .n_in = nin,                                                                    \
                   .n_out = nout,                                                                  \
                   .required = (req),                                                              \
                   .optional = (opt),                                                              \
                   .shape = hp__##shape_fn,                                                        \
                   .grad = hp__##grad_fn,                                                          \
                   .shard = hp__##shard_fn,                                                        \
                   .flags = (fl)},
#include "graph/ops.def"
#undef HP_OP
};

const hp_op_info *hp_op_get(hp_op op) {
    return (unsigned)op < HP_OP_COUNT ? &op_table[op] : NULL;
}

/* Op ids sorted by name, for hp_op_parse's binary search (a linear scan of strcmp was 4% of
 * reading a 1024-layer job). Built once. */
static int by_name[HP_OP_COUNT];
static pthread_once_t by_name_once = PTHREAD_ONCE_INIT;

static int name_cmp(const void *a, const void *b) {
    return strcmp(op_table[*(const int *)a].name, op_table[*(const int *)b].name);
}

static void by_name_init(void) {
    for (int i = 0; i < HP_OP_COUNT; i++) by_name[i] = i;
    qsort(by_name, HP_OP_COUNT, sizeof *by_name, name_cmp);
}

hp_status hp_op_parse(const char *name, hp_op *op, hp_err *err) {
    pthread_once(&by_name_once, by_name_init);
    int lo = 0, hi = HP_OP_COUNT - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, op_table[by_name[mid]].name);
        if (c == 0) {
            *op = (hp_op)by_name[mid];
            return HP_OK;
        }
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return hp_errf(err, HP_NOT_FOUND, "unknown op '%.64s'", name);
}
