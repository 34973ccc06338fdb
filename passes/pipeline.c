/* passes/pipeline.c — placeholder until the pass manager lands. */
#include "hp/passes.h"

#include <stdarg.h>
#include <stdio.h>

void hp_pass_warn(hp_pass_ctx *ctx, const char *fmt, ...) {
    if (ctx->n_warnings >= HP_MAX_WARNINGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->warnings[ctx->n_warnings++], HP_ERR_MSG_MAX, fmt, ap);
    va_end(ap);
}

hp_status hp_compile(const hp_job *job, int world, hp_compiled **out, hp_err *err) {
    (void)job, (void)world;
    *out = NULL;
    return hp_errf(err, HP_UNSUPPORTED, "hp_compile: the pass pipeline has not landed yet");
}

void hp_compiled_free(hp_compiled *c) {
    if (!c) return;
    hp_graph_free(c->graph);
    hp_program_free(c->program);
    hp_free(c);
}
