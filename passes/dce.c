/* passes/dce.c — placeholder until the pass lands: returns a copy of its input. */
#include "hp/passes.h"

hp_status hp_pass_dce(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    (void)ctx;
    *out = hp_graph_clone(in);
    return *out ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory");
}
