/* graph/ops.c — the op table, built from graph/ops.def. */
#include "graph/graph_internal.h"

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

hp_status hp_op_parse(const char *name, hp_op *op, hp_err *err) {
    for (int i = 0; i < HP_OP_COUNT; i++) {
        if (strcmp(op_table[i].name, name) == 0) {
            *op = (hp_op)i;
            return HP_OK;
        }
    }
    return hp_errf(err, HP_NOT_FOUND, "unknown op '%.64s'", name);
}
