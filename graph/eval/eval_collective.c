/* graph/eval/eval_collective.c — collectives in the reference evaluator. A single process has
 * no peers, so all_gather_into_tensor, reduce_scatter_tensor, all_reduce and
 * all_to_all_single go to the caller's hook (hp_eval_opts.collective), which plays the other
 * ranks (a test harness, an N-rank simulator). Without a hook they are HP_UNSUPPORTED, but for
 * an all_to_all_single of group_size 1 (the identity).
 * wait_tensor is the identity on the pending value.
 */
#include "graph/eval/eval_internal.h"

#include <string.h>

HP__EVAL_KERNEL(hp__eval_collective) {
    const hp_eval_opts *o = cx->opts;
    /* an all-to-all of one rank keeps its one part (the transpose of a global [1, 1, ...]) */
    if (!o->collective && n->op == HP_OP_ALL_TO_ALL && hp_node_int(n, HP_ATTR_GROUP_SIZE, 0) == 1) {
        memcpy(out[0].data, in[0]->data, (size_t)hp__eval_numel(&out[0]) * sizeof(double));
        return HP_OK;
    }
    if (!o->collective)
        return hp_errf(err, HP_UNSUPPORTED,
                       "collective %s needs a collective hook (hp_eval_opts.collective)",
                       hp_op_get(n->op)->name);
    return o->collective(o->collective_ctx, n, in[0], &out[0], err);
}

HP__EVAL_KERNEL(hp__eval_wait) {
    memcpy(out[0].data, in[0]->data, (size_t)hp__eval_numel(&out[0]) * sizeof(double));
    return HP_OK;
}
