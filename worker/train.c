/* worker/train.c — the training loop of one rank (see train.h). Setup, then one function per
 * stage of a step; the loop itself reads top to bottom. The state's way in and out of the
 * device (init, weights, optimizer state, checkpoints, export) is train_state.c.
 *
 * Device-agnostic: the backend comes from the job's device (hp_backend_new), and every touch
 * of a parameter, gradient or moment goes through its vtable; this file never dereferences a
 * device pointer. Which part of a parameter a rank holds is its program slot's box. */
#include "worker/train_internal.h"

#include "hp/checkpoint.h"
#include "hp/device.h"
#include "hp/metrics.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/threads.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

float *hp__train_param(const trainer *t, int i) {
    return hp_exec_ptr(t->ex, t->prog->params[i].buffer);
}

int64_t hp__train_numel(const trainer *t, int i) {
    return hp_type_numel(t->prog->buffers[t->prog->params[i].buffer].type);
}

/* ---- which part of a parameter a rank holds: its slot's box ------------------------------- */

bool hp__train_owned(const trainer *t, int i) {
    return hp_program_owns(t->prog, i, t->rank);
}

hp_status hp__train_box_runs(const hp_type *global, const int64_t *off, const int64_t *len,
                             const hp_type *held, hp__run_fn fn, void *ctx, hp_err *err) {
    int r = global->rank;
    for (int d = 0; d < r; d++)
        if (len[d] <= 0) return HP_OK; /* this rank holds padding only */
    /* dims k.. are whole on both sides: one run covers them */
    int k = r;
    while (k > 0 && off[k - 1] == 0 && len[k - 1] == global->shape[k - 1] &&
           held->shape[k - 1] == global->shape[k - 1])
        k--;
    int outer = k > 0 ? k - 1 : 0; /* dims [0, outer) are iterated; dim outer starts each run */
    int64_t count = 1, gstride[HP_MAX_RANK], lstride[HP_MAX_RANK], gs = 1, ls = 1;
    for (int d = r - 1; d >= 0; d--) {
        gstride[d] = gs, lstride[d] = ls;
        gs *= global->shape[d], ls *= held->shape[d];
    }
    for (int d = k > 0 ? k - 1 : 0; d < r; d++) count *= d == k - 1 ? len[d] : global->shape[d];
    int64_t idx[HP_MAX_RANK] = {0};
    for (;;) {
        int64_t g = 0, l = 0;
        for (int d = 0; d < outer; d++)
            g += (off[d] + idx[d]) * gstride[d], l += idx[d] * lstride[d];
        if (k > 0) g += off[k - 1] * gstride[k - 1];
        HP_TRY(fn(ctx, g, l, count, err));
        int d = outer - 1;
        while (d >= 0 && ++idx[d] == len[d]) idx[d--] = 0;
        if (d < 0) return HP_OK;
    }
}

hp_status hp__train_param_runs(const trainer *t, int i, int rank, hp__run_fn fn, void *ctx,
                               hp_err *err) {
    const hp_param_slot *ps = &t->prog->params[i];
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
    HP_TRY(hp_program_box(t->prog, i, rank, off, len, err));
    return hp__train_box_runs(&ps->global, off, len, t->prog->buffers[ps->buffer].type, fn, ctx,
                              err);
}

bool hp__train_is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* The data inputs must be `tokens` and `labels`, i64 [B, T]. */
static hp_status find_data(trainer *t, hp_err *err) {
    const hp_program *p = t->prog;
    t->tokens_buf = t->labels_buf = -1;
    for (int i = 0; i < p->n_data; i++) {
        if (!strcmp(p->data[i].name, "tokens"))
            t->tokens_buf = p->data[i].buffer;
        else if (!strcmp(p->data[i].name, "labels"))
            t->labels_buf = p->data[i].buffer;
        else
            return hp_errf(err, HP_UNSUPPORTED,
                           "data input '%s': training reads token data into inputs named "
                           "'tokens' and 'labels' only",
                           p->data[i].name);
    }
    if (t->tokens_buf < 0 || t->labels_buf < 0)
        return hp_errf(err, HP_UNSUPPORTED, "the graph needs data inputs 'tokens' and 'labels'");
    const hp_type *tt = p->buffers[t->tokens_buf].type, *lt = p->buffers[t->labels_buf].type;
    if (tt->dtype != HP_I64 || tt->rank != 2 || !hp_type_eq(tt, lt))
        return hp_errf(err, HP_UNSUPPORTED, "'tokens' and 'labels' must both be i64 [B, T]");
    t->batch = tt->shape[0];
    t->seq = tt->shape[1];
    t->tokens = hp_calloc((size_t)(t->batch * t->seq), sizeof *t->tokens);
    t->labels = hp_calloc((size_t)(t->batch * t->seq), sizeof *t->labels);
    if (!t->tokens || !t->labels) return hp_errf(err, HP_NOMEM, "out of memory for the batch");
    return HP_OK;
}

/* The node a value of g comes from past the ops that only move or retype it: collectives,
 * their waits, local chunks and casts (a plan may gather the tokens, or shard, cast or gather
 * the embedding's weight, before the lookup). */
static const hp_node *moved_from(const hp_graph *g, hp_value v) {
    const hp_node *n = &g->nodes[v.node];
    while (n->n_in == 1 &&
           (n->op == HP_OP_WAIT_TENSOR || n->op == HP_OP_ALL_GATHER || n->op == HP_OP_ALL_TO_ALL ||
            n->op == HP_OP_LOCAL_CHUNK || n->op == HP_OP_TO_COPY))
        n = &g->nodes[n->in[0].node];
    return n;
}

/* The global rows of the parameter an embedding of the data input `tokens` looks up in g (-1
 * if none): an exported model names its embedding as it likes (transformer.wte.weight). */
static int64_t token_vocab(const hp_graph *g) {
    for (int i = 0; g && i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (n->op != HP_OP_EMBEDDING) continue;
        const hp_node *idx = moved_from(g, n->in[1]), *w = moved_from(g, n->in[0]);
        const hp_attr *f = hp_node_attr(idx, HP_ATTR_FQN);
        if (idx->op != HP_OP_PLACEHOLDER || !f || strcmp(f->s, "tokens")) continue;
        if (w->op != HP_OP_PLACEHOLDER || hp_node_int(w, HP_ATTR_KIND, -1) != HP_INPUT_PARAM)
            continue;
        const hp_attr *gs = hp_node_attr(w, HP_ATTR_GLOBAL_SHAPE); /* a shard's */
        return gs && gs->ints.n > 0 ? gs->ints.v[0] : w->out[0].shape[0];
    }
    return -1;
}

static hp_status open_data(trainer *t, hp_err *err) {
    /* the vocabulary: the embedding's global rows. A builtin model's is tok_embeddings; an
     * exported one's is found in the job's graph, where the lookup reads the placeholders
     * (the compiled graph may reach them through gathered buckets), else in the compiled one */
    int64_t vocab = -1;
    for (int i = 0; i < t->prog->n_params; i++)
        if (!strcmp(t->prog->params[i].fqn, "tok_embeddings.weight"))
            vocab = t->prog->params[i].global.shape[0];
    if (vocab < 0) vocab = token_vocab(t->job->graph);
    if (vocab < 0) vocab = token_vocab(t->prog->graph);
    if (vocab < 0)
        return hp_errf(err, HP_UNSUPPORTED, "no embedding of 'tokens' to size the vocab");
    const char *path = t->opts->data ? t->opts->data : t->job->train.data_path;
    hp_data_config dc = {.path = path && path[0] ? path : NULL,
                         .vocab = vocab,
                         .batch = t->batch,
                         .seq = t->seq,
                         .world = t->data_world,
                         .seed = t->job->train.seed};
    HP_TRY(hp_data_open(&dc, &t->data, err));
    const hp_train_config *tc = &t->job->train;
    if (tc->eval_interval > 0) { /* the same batches at every evaluation: in order */
        dc.path = tc->eval_data_path;
        dc.sequential = true;
        if (hp_data_open(&dc, &t->eval_data, err) != HP_OK)
            return hp_err_prefix(err, "eval data (train.eval_data_path)");
    }
    return HP_OK;
}

/* ---- traces (worker/trace.h) ------------------------------------------------------------------
 */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The steps to trace: the job's and the options', sorted. No recorder when there are none. */
static hp_status setup_trace(trainer *t, hp_err *err) {
    const hp_train_config *tc = &t->job->train;
    int n = tc->n_profile_steps + (t->opts->n_profile_steps > 0 ? t->opts->n_profile_steps : 0);
    if (n == 0) return HP_OK;
    if (!(t->profile = hp_malloc((size_t)n * sizeof *t->profile)))
        return hp_errf(err, HP_NOMEM, "out of memory");
    for (int i = 0; i < tc->n_profile_steps; i++) t->profile[t->n_profile++] = tc->profile_steps[i];
    for (int i = 0; i < t->opts->n_profile_steps; i++)
        t->profile[t->n_profile++] = t->opts->profile_steps[i];
    qsort(t->profile, (size_t)t->n_profile, sizeof *t->profile, cmp_i64);
    const hp_graph *g = t->prog->graph;
    if (!(t->instr_of_node = hp_malloc((size_t)(g->n_nodes + 1) * sizeof *t->instr_of_node)))
        return hp_errf(err, HP_NOMEM, "out of memory");
    for (int32_t i = 0; i < g->n_nodes; i++) t->instr_of_node[i] = -1;
    for (int32_t i = 0; i < t->prog->n_instrs; i++) t->instr_of_node[t->prog->instrs[i].node] = i;
    return hp_trace_new(t->rank, t->job->name, &t->trace, err);
}

static bool profiled(const trainer *t, int64_t step) {
    return t->n_profile > 0 &&
           bsearch(&step, t->profile, (size_t)t->n_profile, sizeof step, cmp_i64) != NULL;
}

/* The executor's hook: compute instructions (waits included: their time is exposed
 * communication) on the compute track. Collectives are reported by the comm thread when there
 * is one; without one (world 1) they ran inside their launch. */
static void on_instr(void *ctx, int32_t i, double start_s, double end_s) {
    trainer *t = ctx;
    const hp_instr *ins = &t->prog->instrs[i];
    const hp_node *n = &t->prog->graph->nodes[ins->node];
    bool comm = ins->stream == HP_STREAM_COMM;
    if (comm && t->comm) return;
    int64_t bytes = -1;
    if (comm && ins->n_in > 0) {
        const hp_type *ty = t->prog->buffers[ins->in[0]].type;
        bytes = hp_type_numel(ty) * (int64_t)hp_dtype_size(ty->dtype);
    }
    hp_trace_add(t->trace, comm ? HP_TRACE_COMM : HP_TRACE_COMPUTE, hp_op_get(n->op)->name, start_s,
                 end_s, i, bytes);
}

/* The comm thread's hook (runs on that thread). */
static void on_collective(void *ctx, const hp_node *n, int64_t bytes, double start_s,
                          double end_s) {
    trainer *t = ctx;
    int32_t i = t->instr_of_node[n - t->prog->graph->nodes];
    hp_trace_add(t->trace, HP_TRACE_COMM, hp_op_get(n->op)->name, start_s, end_s, i, bytes);
}

/* Turns hooks on (before the program runs) or off (after it synchronized). */
static void trace_hooks(trainer *t, bool on) {
    hp_exec_set_trace(t->ex, on ? on_instr : NULL, on ? t : NULL);
    t->be->vt->set_comm_trace(t->be, on ? on_collective : NULL, on ? t : NULL);
}

/* Ends the step's recording and hands the trace on: to opts->on_trace, else to
 * OUT_DIR/traces/step-S-rank-R.json. */
static hp_status finish_trace(trainer *t, int64_t step, hp_err *err) {
    char *json = NULL;
    size_t len = 0;
    int64_t dropped = 0;
    HP_TRY(hp_trace_end(t->trace, t->opts->trace_max_bytes, &json, &len, &dropped, err));
    if (dropped > 0)
        fprintf(t->log, "warning: rank=%d step=%lld trace: dropped %lld slices (limit %zu bytes)\n",
                t->rank, (long long)step, (long long)dropped, t->opts->trace_max_bytes);
    hp_status st = HP_OK;
    if (t->opts->on_trace) {
        t->opts->on_trace(t->opts->trace_ctx, step, json, len);
    } else {
        char dir[HP__TRAIN_PATH_MAX], path[HP__TRAIN_PATH_MAX + 64];
        const char *out = t->opts->out_dir ? t->opts->out_dir : ".";
        if (snprintf(dir, sizeof dir, "%s/traces", out) >= (int)sizeof dir)
            st = hp_errf(err, HP_INVALID, "path too long: %s/traces", out);
        if (st == HP_OK && snprintf(path, sizeof path, "%s/step-%lld-rank-%d.json", dir,
                                    (long long)step, t->rank) >= (int)sizeof path)
            st = hp_errf(err, HP_INVALID, "path too long: %s", dir);
        if (st == HP_OK) st = hp_mkdir_p(dir, err);
        if (st == HP_OK) st = hp_file_write_atomic(path, json, len, err);
        if (st != HP_OK) hp_err_prefix(err, "trace of step %lld", (long long)step);
    }
    hp_free(json);
    return st;
}

/* ---- one step ------------------------------------------------------------------------------- */

/* The norm of the whole gradient: the pieces' sums of squares all-reduced over the ranks
 * (padding is zero), each distinct piece counted once (by its owner). */
static hp_status global_grad_norm(trainer *t, double loss, double *norm, hp_err *err) {
    int n = t->prog->n_params, k = 0;
    hp_fspan *mine = hp_calloc((size_t)n + 1, sizeof *mine);
    if (!mine) return hp_errf(err, HP_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if (hp__train_owned(t, i)) mine[k++] = t->grads[i];
    double sumsq = 0, t0 = hp_trace_now_s();
    hp_status st = t->be->vt->sum_squares(t->be, mine, k, &sumsq, err);
    hp_free(mine);
    /* a rank whose loss is not finite makes the norm NaN on every rank: they all see the same
     * non-finite step and stop or skip together */
    if (!isfinite(loss)) sumsq = NAN;
    double t1 = hp_trace_now_s();
    hp_trace_add(t->trace, HP_TRACE_COMPUTE, "grad_norm", t0, t1, -1, -1);
    if (st == HP_OK && t->world > 1) {
        st = t->comm->vt->all_reduce(t->comm, &sumsq, &sumsq, 1, HP_COMM_F64, HP_REDUCE_SUM, err);
        hp_trace_add(t->trace, HP_TRACE_COMM, "all_reduce", t1, hp_trace_now_s(), -1,
                     (int64_t)sizeof sumsq);
    }
    *norm = sqrt(sumsq) / (double)t->accum; /* accumulated micro-steps: their mean's */
    return st;
}

typedef struct step_out {
    double loss, grad_norm, lr, data_s;
    bool skipped; /* non-finite: no optimizer update */
} step_out;

/* One run of the program on micro-batch `micro` (0-based, over the whole run): its data in,
 * its dropout stream, its loss into *loss. */
static hp_status micro_step(trainer *t, int64_t micro, double *loss, double *data_s, hp_err *err) {
    double t0 = now_s();
    HP_TRY(hp_data_next(t->data, t->data_rank, micro, t->tokens, t->labels, err));
    size_t bytes = (size_t)(t->batch * t->seq) * sizeof(int64_t);
    HP_TRY(t->be->vt->copy_in(t->be, hp_exec_ptr(t->ex, t->tokens_buf), t->tokens, bytes, err));
    HP_TRY(t->be->vt->copy_in(t->be, hp_exec_ptr(t->ex, t->labels_buf), t->labels, bytes, err));
    double t1 = now_s();
    *data_s += t1 - t0;
    hp_trace_add(t->trace, HP_TRACE_COMPUTE, "data", t0, t1, -1, -1);
    hp_exec_set_rng(t->ex, t->job->train.seed, (uint64_t)micro + 1); /* dropout: hp/rng.h */
    HP_TRY(hp_exec_step(t->ex, err));
    return hp_exec_loss(t->ex, loss, err);
}

/* A step's micro-steps: with gradient accumulation the first ones' gradients add up in
 * t->accum_grads and the last one adds them into its own, which the optimizer reads (their
 * mean: the update scales them by 1 / accum). The loss is the micro-steps' mean. */
static hp_status run_micro_steps(trainer *t, int64_t step, step_out *o, hp_err *err) {
    int n = t->prog->n_params;
    double sum = 0;
    o->data_s = 0;
    for (int64_t k = 0; k < t->accum; k++) {
        double loss;
        HP_TRY(micro_step(t, (step - 1) * t->accum + k, &loss, &o->data_s, err));
        sum += loss;
        if (k + 1 < t->accum) hp_exec_param_copies_current(t->ex); /* no update in between */
        if (t->accum == 1) break;
        double a0 = hp_trace_now_s();
        bool last = k + 1 == t->accum;
        HP_TRY(last ? t->be->vt->accumulate(t->be, t->grads, t->accum_grads, n, false, err)
                    : t->be->vt->accumulate(t->be, t->accum_grads, t->grads, n, k == 0, err));
        hp_trace_add(t->trace, HP_TRACE_COMPUTE, "grad_accumulate", a0, hp_trace_now_s(), -1, -1);
    }
    o->loss = sum / (double)t->accum;
    return HP_OK;
}

/* The mean loss of the first eval_steps batches of the eval data, forward only with dropout
 * off (every rank takes part: the program's collectives). */
static hp_status evaluate(trainer *t, double *loss, hp_err *err) {
    int64_t n = t->job->train.eval_steps;
    size_t bytes = (size_t)(t->batch * t->seq) * sizeof(int64_t);
    double sum = 0;
    hp_status st = HP_OK;
    hp_exec_set_eval(t->ex, true);
    for (int64_t k = 0; k < n && st == HP_OK; k++) {
        double l = 0;
        st = hp_data_next(t->eval_data, t->data_rank, k, t->tokens, t->labels, err);
        if (st == HP_OK)
            st =
                t->be->vt->copy_in(t->be, hp_exec_ptr(t->ex, t->tokens_buf), t->tokens, bytes, err);
        if (st == HP_OK)
            st =
                t->be->vt->copy_in(t->be, hp_exec_ptr(t->ex, t->labels_buf), t->labels, bytes, err);
        if (st == HP_OK) st = hp_exec_forward(t->ex, err);
        if (st == HP_OK) st = hp_exec_loss(t->ex, &l, err);
        sum += l;
    }
    hp_exec_set_eval(t->ex, false);
    *loss = sum / (double)n;
    return st;
}

static hp_status train_step(trainer *t, int64_t step, step_out *o, hp_err *err) {
    bool prof = profiled(t, step);
    if (prof) {
        hp_trace_begin(t->trace, step);
        trace_hooks(t, true);
    }
    hp_status st = run_micro_steps(t, step, o, err);
    if (prof) trace_hooks(t, false); /* hp_exec_step synchronized, or failed */
    HP_TRY(st);
    int n = t->prog->n_params;
    HP_TRY(global_grad_norm(t, o->loss, &o->grad_norm, err));
    o->lr = hp_lr_at(&t->lr, step);
    o->skipped = !isfinite(o->grad_norm);
    if (o->skipped && !t->skip_nonfinite)
        return hp_errf(err, HP_INVALID,
                       "non-finite %s (loss %g, grad norm %g): stopping rather than training on it "
                       "(hpctl new --on-nonfinite skip, or hp-worker --on-nonfinite skip, skips "
                       "such steps)",
                       isfinite(o->loss) ? "grad norm" : "loss", o->loss, o->grad_norm);
    if (o->skipped) {
        hp_exec_param_copies_current(t->ex); /* no update: the copies still hold the params */
        t->skipped_steps++;
        if (t->rank == 0)
            fprintf(t->log,
                    "warning: step=%lld non-finite loss=%g grad_norm=%g: update skipped "
                    "(skipped_steps=%lld)\n",
                    (long long)step, o->loss, o->grad_norm, (long long)t->skipped_steps);
        return prof ? finish_trace(t, step, err) : HP_OK;
    }
    double t1 = hp_trace_now_s();
    double clip = t->job->train.grad_clip;
    float coef = clip > 0 ? hp_clip_coef(o->grad_norm, clip) : 1.0f;
    /* clipping scales the gradients as AdamW reads them, and so does the mean of accumulated
     * micro-steps: one pass over them fewer */
    float scale = (coef < 1 ? coef : 1.0f) / (float)t->accum;
    HP_TRY(t->be->vt->adamw(t->be, &t->adam, o->lr, scale, step, t->adam_params, n, err));
    hp_exec_param_copies_current(t->ex); /* the update wrote each parameter's bf16 copy */
    hp_trace_add(t->trace, HP_TRACE_COMPUTE, "optimizer", t1, hp_trace_now_s(), -1, -1);
    return prof ? finish_trace(t, step, err) : HP_OK;
}

/* A resume from step `keep`: the records after it (and lines that are not records) at the end
 * of metrics.jsonl go, since those steps are trained and logged again; the file then holds
 * each step once. Scans back from the end one line at a time (lines are < 4 KiB). */
static hp_status trim_metrics(trainer *t, int64_t keep, hp_err *err) {
    const char *path = t->metrics_path;
    int r = open(path, O_RDONLY | O_CLOEXEC);
    if (r < 0) return hp_errf(err, HP_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    off_t cut = fstat(r, &st) == 0 ? st.st_size : 0, size = cut;
    char buf[8192];
    while (cut > 0) {
        off_t lo = cut > (off_t)sizeof buf ? cut - (off_t)sizeof buf : 0;
        ssize_t n = pread(r, buf, (size_t)(cut - lo), lo);
        if (n != cut - lo || buf[n - 1] != '\n') break; /* hp_file_log_open left whole lines */
        ssize_t i = n - 2;
        while (i >= 0 && buf[i] != '\n') i--;
        if (i < 0 && lo > 0) break; /* a line longer than the window: not a record of ours */
        buf[n - 1] = 0;
        hp_metrics m;
        if (hp_metrics_from_json(buf + i + 1, &m, NULL) == HP_OK && m.step <= keep) break;
        cut = lo + i + 1;
    }
    close(r);
    if (cut < size && ftruncate(t->metrics_fd, cut) != 0)
        return hp_errf(err, HP_IO, "%s: dropping the records after step %lld: %s", path,
                       (long long)keep, strerror(errno));
    return HP_OK;
}

/* Rank 0 prints the torchtitan-style line and appends the JSON record; every rank hands its
 * record to on_metrics (the coordinator shows each rank's throughput, memory and step). */
static hp_status log_metrics(trainer *t, const hp_metrics_window *w, hp_err *err) {
    if (t->rank != 0 && !t->opts->on_metrics) return HP_OK;
    hp_metrics m;
    HP_TRY(hp_metrics_compute(w, &m, err));
    if (t->rank == 0 && !t->mfu_warned && w->peak_flops > 0 && isnan(m.mfu_pct)) {
        /* hp_metrics_compute says so when the achieved rate exceeds the peak */
        fprintf(t->log,
                "warning: achieved %.3g FLOP/s exceed the device peak of %.3g FLOP/s: the peak is "
                "wrong, mfu reads unknown\n",
                m.tflops * 1e12, w->peak_flops);
        t->mfu_warned = true;
    }
    if (t->rank != 0) {
        t->opts->on_metrics(t->opts->metrics_ctx, &m);
        return HP_OK;
    }
    char line[HP_METRICS_LINE_MAX];
    HP_TRY(hp_metrics_format(&m, line, sizeof line, err));
    fprintf(t->log, "%s\n", line);
    fflush(t->log);
    if (t->opts->on_metrics) t->opts->on_metrics(t->opts->metrics_ctx, &m);
    if (t->metrics_open) {
        char json[4096];
        HP_TRY(hp_metrics_to_json(&m, json, sizeof json - 1, err));
        size_t n = strlen(json);
        json[n++] = '\n';
        HP_TRY(hp_file_log_append(t->metrics_fd, t->metrics_path, json, n, err));
    }
    return HP_OK;
}

/* ---- the loop ------------------------------------------------------------------------------- */

/* One communicator per mesh dim of more than one rank (every rank splits the world the same
 * way, in mesh order): the ranks that share every other coordinate, ordered by this one. */
/* A fingerprint of the program as rank 0 holds it (FNV-1a over its packed message). */
static hp_status program_fingerprint(hp_program *p, int rank, uint64_t *fp, hp_err *err) {
    HP_TRY(hp_program_set_rank(p, 0, err));
    uint8_t *data = NULL;
    size_t len = 0;
    hp_status st = hp_program_pack(p, &data, &len, err);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; st == HP_OK && i < len; i++) h = (h ^ data[i]) * 1099511628211ull;
    hp_free(data);
    *fp = h;
    if (st == HP_OK) st = hp_program_set_rank(p, rank, err);
    return st;
}

/* Ranks that compiled the job themselves (standalone, a launcher's ranks) must run one
 * program: an auto plan whose solver stopped at its time limit, or two hp versions, can differ,
 * and mismatched collectives would time out or mix shards. Each compares its fingerprint with
 * rank 0's. */
static hp_status check_same_program(trainer *t, uint64_t fp, hp_err *err) {
    uint64_t *all = hp_calloc((size_t)t->world, sizeof *all);
    if (!all) return hp_errf(err, HP_NOMEM, "out of memory");
    hp_status st = t->comm->vt->all_gather(t->comm, &fp, all, sizeof fp, err);
    for (int r = 1; st == HP_OK && r < t->world; r++)
        if (all[r] != all[0])
            st = hp_errf(err, HP_INVALID,
                         "rank %d compiled a different program than rank 0 (fingerprint %016llx, "
                         "rank 0's %016llx): the ranks must run the same hp on the same job; an "
                         "auto plan stopped at the solver's time limit can differ between them: "
                         "compile once (hpd does) or give the solver more time",
                         r, (unsigned long long)all[r], (unsigned long long)all[0]);
    hp_free(all);
    return st;
}

static hp_status split_mesh(trainer *t, hp_err *err) {
    const hp_program *p = t->prog;
    if (p->graph->mesh.ndim == 0) return HP_OK; /* FSDP: the world is the one group */
    int64_t stride = 1;
    for (int d = p->mesh.ndim - 1; d >= 0; d--) {
        int64_t size = p->mesh.size[d];
        if (size > 1) {
            int color = (int)(t->rank - p->coord[d] * stride), key = (int)p->coord[d];
            hp_comm *c = NULL;
            HP_TRY(t->comm->vt->split(t->comm, color, key, &c, err));
            t->groups[t->n_groups++] = (hp_comm_group){p->mesh.name[d], c};
        }
        stride *= size;
    }
    return HP_OK;
}

static hp_status setup(trainer *t, int64_t *start, hp_err *err) {
    const hp_train_opts *o = t->opts;
    const hp_job *job = t->job;
    t->total_steps = o->steps > 0 ? o->steps : job->train.steps;
    t->skip_nonfinite = o->on_nonfinite == HP_TRAIN_NONFINITE_JOB
                            ? job->train.on_nonfinite == HP_NONFINITE_SKIP
                            : o->on_nonfinite == HP_TRAIN_NONFINITE_SKIP;
    if (!job->graph && !o->program) return hp_errf(err, HP_INVALID, "the job has no graph");
    /* a device this hp-worker cannot run fails here, before compiling or joining the ranks */
    if (!o->backend) HP_TRY(hp_device_built(job->resources.device, err));
    t->world = o->world > 1 ? o->world : 1;
    t->rank = t->world > 1 ? o->rank : 0;
    if (t->rank < 0 || t->rank >= t->world)
        return hp_errf(err, HP_INVALID, "rank %d of world %d", t->rank, t->world);
    /* every world goes through the same pipeline (at world 1 FSDP and the schedule passes
     * have nothing to do), so N ranks compute what 1 rank computes */
    if (o->program) { /* compiled by the coordinator: the worker never compiles */
        t->prog = o->program;
        if (t->prog->world != t->world)
            return hp_errf(err, HP_INVALID, "the program is for world %d, this run is world %d",
                           t->prog->world, t->world);
    } else {
        HP_TRY(hp_compile(job, t->world, &t->compiled, err));
        t->prog = t->compiled->program;
    }
    for (int i = 0; i < t->prog->n_params; i++) /* the optimizer's master weights are f32 */
        if (t->prog->params[i].global.dtype != HP_F32)
            return hp_errf(err, HP_UNSUPPORTED,
                           "parameter '%s' is %s: hp holds parameters in f32 (the master "
                           "weights); give the graph f32 parameters and ask for %s compute with "
                           "--param-dtype %s",
                           t->prog->params[i].fqn, hp_dtype_name(t->prog->params[i].global.dtype),
                           hp_dtype_name(t->prog->params[i].global.dtype),
                           hp_dtype_name(t->prog->params[i].global.dtype));
    uint64_t fp = 0;
    if (!o->program && t->world > 1) HP_TRY(program_fingerprint(t->prog, t->rank, &fp, err));
    HP_TRY(hp_program_set_rank(t->prog, t->rank, err));
    hp_program_data_rank(t->prog, t->rank, &t->data_rank, &t->data_world);
    if (t->world > 1) {
        if (o->comm) { /* joined by the caller (tcp across hosts): borrowed */
            if (o->comm->rank != t->rank || o->comm->world != t->world)
                return hp_errf(err, HP_INVALID,
                               "the communicator is rank %d of %d, this run is rank %d of %d",
                               o->comm->rank, o->comm->world, t->rank, t->world);
            t->comm = o->comm;
        } else {
            if (!o->comm_name)
                return hp_errf(err, HP_INVALID, "world %d needs a communicator name", t->world);
            double timeout = o->comm_timeout_s > 0 ? o->comm_timeout_s : 60;
            HP_TRY(hp_shm_comm_new(o->comm_name, t->rank, t->world, timeout, &t->comm, err));
            t->owns_comm = true;
        }
        if (!o->program) HP_TRY(check_same_program(t, fp, err));
        HP_TRY(split_mesh(t, err));
    }
    if (o->backend) { /* the caller's (tests): borrowed */
        if (t->world > 1)
            return hp_errf(err, HP_INVALID, "a borrowed backend runs world 1 only (world %d)",
                           t->world);
        t->be = o->backend;
    } else {
        hp_backend_opts bo = {
            .threads = o->threads, .comm = t->comm, .groups = t->groups, .n_groups = t->n_groups};
        HP_TRY(hp_backend_new(job->resources.device, &bo, &t->be, err));
        t->owns_be = true;
    }
    hp_device_info di;
    HP_TRY(t->be->vt->info(t->be, &di, err));
    t->host_visible = di.host_visible;
    t->device_memory = di.memory_bytes > 0 ? (uint64_t)di.memory_bytes : 0;
    t->peak_flops = di.peak_flops > 0 ? di.peak_flops : NAN;
    HP_TRY(hp_exec_new(t->prog, t->be, &t->ex, err));
    t->accum = hp_job_grad_accum(job);
    HP_TRY(find_data(t, err));
    HP_TRY(open_data(t, err));
    HP_TRY(hp__train_alloc_optimizer(t, err));
    HP_TRY(setup_trace(t, err));
    t->flops_per_token = hp_model_flops_per_token(&job->model);

    if (o->out_dir) {
        HP_TRY(hp_mkdir_p(o->out_dir, err));
        snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s/checkpoints", o->out_dir);
        snprintf(t->metrics_path, sizeof t->metrics_path, "%s/metrics.jsonl", o->out_dir);
        if (t->rank == 0) {
            HP_TRY(hp_file_log_open(t->metrics_path, !o->resume, &t->metrics_fd, err));
            t->metrics_open = true;
        }
    }
    *start = 0;
    HP_TRY(hp__train_init_buffers(t, err));
    const char *init_from = o->init_from ? o->init_from : job->train.init_from;
    bool from_file = init_from && init_from[0];
    if (o->resume) {
        if (!t->ckpt_dir[0]) hp__train_resume_root(o->resume, t->ckpt_dir, sizeof t->ckpt_dir);
        HP_TRY(hp__train_load_checkpoint(t, o->resume, start, err));
        /* a checkpoint holds what training changes; the buffers (an exported model's RoPE
         * tables) never change and are the weights file's, as at the start */
        if (from_file && hp__train_buffers_from_file(t)) {
            hp_status st = hp__train_load_weights(t, init_from, true, err);
            if (st != HP_OK) return hp_err_prefix(err, "resume: the buffers of --init-from");
        }
        if (t->metrics_open) HP_TRY(trim_metrics(t, *start, err));
        if (t->rank == 0) fprintf(t->log, "resumed from step %lld\n", (long long)*start);
        return HP_OK;
    }
    if (from_file) return hp__train_load_weights(t, init_from, false, err);
    return hp__train_init_params(t, err);
}

static void teardown(trainer *t) {
    if (t->metrics_open) close(t->metrics_fd);
    hp_exec_free(t->ex);
    hp__train_free_optimizer(t);
    if (t->owns_be)
        hp_backend_free(t->be); /* joins the comm thread, the last user of the
                                   trace hooks */
    hp_trace_free(t->trace);
    hp_free(t->instr_of_node);
    hp_free(t->profile);
    hp_data_free(t->data);
    hp_data_free(t->eval_data);
    hp_free(t->tokens);
    hp_free(t->labels);
    hp_compiled_free(t->compiled);
    for (int i = 0; i < t->n_groups; i++) hp_comm_free(t->groups[i].comm);
    if (t->owns_comm) hp_comm_free(t->comm);
}

hp_status hp_train(const hp_job *job, const hp_train_opts *opts, hp_train_result *res,
                   hp_err *err) {
    trainer t = {.job = job, .opts = opts, .log = opts->log ? opts->log : stdout};
    memset(res, 0, sizeof *res);
    res->last_eval_loss = NAN;
    int64_t start = 0;
    hp_status st = setup(&t, &start, err);
    if (st != HP_OK) {
        hp_err_prefix(err, "setup");
        goto done;
    }
    int64_t interval = job->train.log_interval, ckpt = job->train.checkpoint_interval;
    hp_metrics_window w = {.rank = 0,
                           .flops_per_token = t.flops_per_token,
                           .peak_flops = t.peak_flops,
                           .device_memory = t.device_memory};
    double window_start = now_s();
    double exposed_mark = 0, busy_mark = 0;
    res->first_step = start + 1;
    int64_t ckpt_requests_done = 0; /* see checkpoint_now below */
    for (int64_t step = start + 1; step <= t.total_steps; step++) {
        step_out o;
        if ((st = train_step(&t, step, &o, err)) != HP_OK) {
            hp_err_prefix(err, "step %lld", (long long)step);
            goto done;
        }
        int64_t every = job->train.eval_interval;
        bool evaluated = every > 0 && (step % every == 0 || step == t.total_steps);
        double eval_loss = NAN;
        if (evaluated) {
            /* the window's throughput and communication are training's */
            double e0 = now_s(), x0 = hp_exec_exposed_seconds(t.ex), b0 = t.be->vt->comm_busy(t.be);
            if ((st = evaluate(&t, &eval_loss, err)) != HP_OK) {
                hp_err_prefix(err, "evaluation after step %lld", (long long)step);
                goto done;
            }
            w.has_eval = true;
            w.eval_loss = eval_loss;
            res->last_eval_loss = eval_loss;
            window_start += now_s() - e0;
            exposed_mark += hp_exec_exposed_seconds(t.ex) - x0;
            busy_mark += t.be->vt->comm_busy(t.be) - b0;
        }
        if (step == start + 1) res->first_loss = o.loss;
        res->last_loss = o.loss;
        res->last_step = step;
        w.steps++;
        w.tokens += t.batch * t.seq * t.accum;
        w.data_s += o.data_s;
        bool stop =
            opts->stop &&
            __atomic_load_n(opts->stop, __ATOMIC_RELAXED); /* set by a signal or the agent thread */
        /* checkpoint_now counts the requests a rank has seen: the ranks take the highest
         * count, so every rank checkpoints once per request however late its copy arrived. */
        int64_t asked_n =
            opts->checkpoint_now ? __atomic_load_n(opts->checkpoint_now, __ATOMIC_RELAXED) : 0;
        if (t.world > 1) { /* the ranks agree on stopping and checkpointing, or they would part
                              ways here */
            int64_t flag[2] = {stop, asked_n};
            st = t.comm->vt->all_reduce(t.comm, flag, flag, 2, HP_COMM_I64, HP_REDUCE_MAX, err);
            if (st != HP_OK) goto done;
            stop = flag[0] != 0;
            asked_n = flag[1];
        }
        if (step == start + 1 && t.rank == 0 && opts->resume_before > 0 && t.ckpt_dir[0]) {
            /* Every rank has loaded its checkpoint, or started over (they all passed the
             * all-reduce above): the ones at or after the bound are a future being trained
             * again, which a later resume or prune must not take for this run's. */
            if ((st = hp_ckpt_remove_from(t.ckpt_dir, opts->resume_before, err)) != HP_OK) {
                hp_err_prefix(err, "resume: removing checkpoints from step %lld",
                              (long long)opts->resume_before);
                goto done;
            }
        }
        bool asked = asked_n > ckpt_requests_done;
        if (asked) ckpt_requests_done = asked_n;
        if (step == 1 || (interval > 0 && step % interval == 0) || step == t.total_steps || stop ||
            evaluated) {
            uint64_t mem = 0;
            if (t.be->vt->memory_peak(t.be, &mem, err) != HP_OK) mem = 0; /* unknown: 0 */
            w.step = step;
            w.wall_s = now_s() - window_start;
            if (!(w.wall_s > 0)) w.wall_s = 1e-9;
            w.loss = w.loss_max = o.loss;
            w.grad_norm = o.grad_norm;
            w.lr = o.lr;
            w.memory_bytes = mem;
            w.skipped_steps = t.skipped_steps;
            double exposed = hp_exec_exposed_seconds(t.ex), busy = t.be->vt->comm_busy(t.be);
            w.comm_s = exposed - exposed_mark;
            w.comm_busy_s = busy - busy_mark;
            exposed_mark = exposed;
            busy_mark = busy;
            /* torchtitan's tps: the tokens a rank processed over the ranks sharing them (its
             * non-data-parallel degree: tp) */
            hp_metrics_window lw = w;
            lw.tokens = w.tokens / (t.world / t.data_world);
            if ((st = log_metrics(&t, &lw, err)) != HP_OK) goto done;
            w.steps = w.tokens = 0;
            w.data_s = 0;
            w.has_eval = false;
            window_start = now_s();
        }
        if (evaluated && t.rank == 0) /* after the step's line */
            fprintf(t.log, "eval: step: %lld loss: %.4f batches: %lld\n", (long long)step,
                    eval_loss, (long long)job->train.eval_steps);
        bool ckpt_now = t.ckpt_dir[0] && ((ckpt > 0 && step % ckpt == 0) || stop || asked);
        if (ckpt_now && (st = hp__train_save_checkpoint(&t, step, err)) != HP_OK) {
            hp_err_prefix(err, "checkpoint at step %lld", (long long)step);
            goto done;
        }
        if (ckpt_now && opts->on_checkpoint) {
            char path[HP__TRAIN_PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/step-%08lld", t.ckpt_dir, (long long)step);
            opts->on_checkpoint(opts->checkpoint_ctx, step, path);
        }
        if (opts->halt_after > 0 && step >= opts->halt_after) goto done;
        if (stop) {
            res->interrupted = true;
            if (t.rank == 0)
                fprintf(t.log, "stopped after step %lld%s\n", (long long)step,
                        t.ckpt_dir[0] ? "; checkpoint written" : "");
            goto done;
        }
    }
    if (opts->out_dir) {
        char path[HP__TRAIN_PATH_MAX];
        if (t.skipped_steps > 0 && t.rank == 0)
            fprintf(t.log, "warning: %lld of the run's updates were skipped (non-finite)\n",
                    (long long)t.skipped_steps);
        snprintf(path, sizeof path, "%s/model.safetensors", opts->out_dir);
        if ((st = hp__train_export_weights(&t, path, err)) != HP_OK) hp_err_prefix(err, "export");
    }
done:
    res->skipped_steps = t.skipped_steps;
    teardown(&t);
    return st;
}
