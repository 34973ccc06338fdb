/* worker/train_state.c — the training state in and out of the device (train_internal.h):
 * parameter init, weights from safetensors, AdamW state, checkpoints, the final export.
 *
 * Device buffers are never read or written here: init and math go through the backend's
 * vtable, and files stage through copy_in / copy_out. A host-visible backend (cpu) lends its
 * buffers directly, so the CPU pays no copy; which part of a parameter a rank holds is its
 * program slot's box (hp__train_param_runs walks it).
 */
#include "worker/train_internal.h"

#include "worker/bf16.h"

#include "hp/checkpoint.h"
#include "hp/param_init.h"
#include "hp/safetensors.h"

#include <math.h>
#include <string.h>

/* ---- staging between device and host -------------------------------------------------------- */

/* *host: `bytes` of device memory at dev, readable on the host: dev itself when the backend's
 * memory is host-visible, else a copy (copy_out). Give it back with view_done. */
static hp_status view(trainer *t, const void *dev, size_t bytes, void **host, hp_err *err) {
    if (t->host_visible) {
        *host = (void *)dev;
        return HP_OK;
    }
    if (!(*host = hp_malloc(bytes ? bytes : 1)))
        return hp_errf(err, HP_NOMEM, "out of memory staging %zu bytes", bytes);
    hp_status st = t->be->vt->copy_out(t->be, *host, dev, bytes, err);
    if (st != HP_OK) {
        hp_free(*host);
        *host = NULL;
    }
    return st;
}

static void view_done(void *host, const void *dev) {
    if (host != dev) hp_free(host);
}

/* *host: a zeroed host buffer of `bytes` to fill, then land at dev with land (dev itself
 * when host-visible). */
static hp_status stage(trainer *t, void *dev, size_t bytes, void **host, hp_err *err) {
    if (t->host_visible) {
        *host = dev;
        return HP_OK;
    }
    if (!(*host = hp_calloc(1, bytes ? bytes : 1)))
        return hp_errf(err, HP_NOMEM, "out of memory staging %zu bytes", bytes);
    return HP_OK;
}

/* Copies a staged buffer to the device (when it is not the device buffer) and frees it. */
static hp_status land(trainer *t, void *dev, void *host, size_t bytes, hp_status st, hp_err *err) {
    if (host == dev) return st;
    if (st == HP_OK) st = t->be->vt->copy_in(t->be, dev, host, bytes, err);
    hp_free(host);
    return st;
}

/* ---- init and weights in ------------------------------------------------------------------ */

/* Fresh parameters: each run of the box gets the init of its global elements. */
typedef struct init_ctx {
    trainer *t;
    float *dst;
    const hp_init *init;
    const char *fqn;
} init_ctx;

static hp_status init_run(void *ctx, int64_t g, int64_t l, int64_t count, hp_err *err) {
    init_ctx *c = ctx;
    return c->t->be->vt->fill_init(c->t->be, c->dst + l, c->init, c->t->job->train.seed, c->fqn, g,
                                   count, err);
}

/* A buffer of another dtype (an exported model's i64 positions, a bool mask, a bf16 table):
 * its init computed in f32 on the host (exact for the integers an arange or constant holds
 * below 2^24), converted to the dtype and copied in. */
typedef struct init_cast_ctx {
    trainer *t;
    uint8_t *dst;
    const hp_param_slot *ps;
} init_cast_ctx;

static hp_status init_cast_run(void *ctx, int64_t g, int64_t l, int64_t count, hp_err *err) {
    init_cast_ctx *c = ctx;
    hp_dtype dt = c->ps->global.dtype;
    size_t size = hp_dtype_size(dt);
    float *f = hp_malloc((size_t)(count ? count : 1) * sizeof *f);
    uint8_t *b = hp_malloc((size_t)(count ? count : 1) * size);
    hp_status st = f && b ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory");
    if (st == HP_OK)
        st = hp_param_init_fill(&c->ps->init, c->t->job->train.seed, c->ps->fqn, g, count, f, err);
    for (int64_t k = 0; st == HP_OK && k < count; k++) {
        double v = isnan(f[k]) ? 0 : f[k]; /* an integer saturates, as _to_copy's cast */
        switch (dt) {
        case HP_I64:
            ((int64_t *)b)[k] = v >= 0x1p63 ? INT64_MAX : v < -0x1p63 ? INT64_MIN : (int64_t)v;
            break;
        case HP_I32:
            ((int32_t *)b)[k] = v >= 0x1p31 ? INT32_MAX : v < -0x1p31 ? INT32_MIN : (int32_t)v;
            break;
        case HP_BOOL:
            b[k] = f[k] != 0;
            break;
        default:
            ((uint16_t *)b)[k] = hp__bf16_round(f[k]);
            break; /* HP_BF16 */
        }
    }
    if (st == HP_OK)
        st = c->t->be->vt->copy_in(c->t->be, c->dst + (size_t)l * size, b, (size_t)count * size,
                                   err);
    hp_free(f);
    hp_free(b);
    return st;
}

hp_status hp__train_init_buffers(trainer *t, hp_err *err) {
    for (int i = t->prog->n_params; i < t->prog->n_params + t->prog->n_bufs; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        if (ps->init.kind == HP_INIT_NONE) continue; /* the runtime's to fill: stays zero */
        hp_dtype dt = ps->global.dtype;
        hp_status st;
        if (dt == HP_F32) {
            init_ctx c = {t, hp_exec_ptr(t->ex, ps->buffer), &ps->init, ps->fqn};
            st = hp__train_param_runs(t, i, t->rank, init_run, &c, err);
        } else if (dt == HP_I64 || dt == HP_I32 || dt == HP_BOOL || dt == HP_BF16) {
            init_cast_ctx c = {t, hp_exec_ptr(t->ex, ps->buffer), ps};
            st = hp__train_param_runs(t, i, t->rank, init_cast_run, &c, err);
        } else {
            st = hp_errf(err, HP_UNSUPPORTED,
                         "a %s buffer (hp fills f32, bf16, integer and bool buffers)",
                         hp_dtype_name(dt));
        }
        if (st != HP_OK) return hp_err_prefix(err, "init buffer '%s'", ps->fqn);
    }
    return HP_OK;
}

hp_status hp__train_init_params(trainer *t, hp_err *err) {
    for (int i = 0; i < t->prog->n_params; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        hp_init init = ps->init;
        if (init.kind == HP_INIT_NONE) init.kind = HP_INIT_ZEROS;
        init_ctx c = {t, hp__train_param(t, i), &init, ps->fqn};
        hp_status st = hp__train_param_runs(t, i, t->rank, init_run, &c, err);
        if (st != HP_OK) return hp_err_prefix(err, "init '%s'", ps->fqn);
    }
    return HP_OK;
}

/* The box's runs from (to) a full host tensor into (out of) a device buffer. */
typedef struct copy_ctx {
    trainer *t;
    float *dev;  /* the local buffer */
    float *full; /* the global tensor on the host */
    bool in;     /* full -> dev; else dev (a host view) -> full */
} copy_ctx;

static hp_status copy_run(void *ctx, int64_t g, int64_t l, int64_t count, hp_err *err) {
    copy_ctx *c = ctx;
    size_t bytes = (size_t)count * sizeof(float);
    if (c->in) return c->t->be->vt->copy_in(c->t->be, c->dev + l, c->full + g, bytes, err);
    memcpy(c->full + g, c->dev + l, bytes);
    return HP_OK;
}

/* Whether an init spec gives a buffer's values exactly (not a distribution standing in for
 * values the weights file holds). */
static bool exact_init(const hp_init *init) {
    return init->kind == HP_INIT_ZEROS || init->kind == HP_INIT_ONES ||
           init->kind == HP_INIT_CONSTANT || init->kind == HP_INIT_ARANGE;
}

bool hp__train_buffers_from_file(const trainer *t) {
    for (int i = t->prog->n_params; i < t->prog->n_params + t->prog->n_bufs; i++)
        if (t->prog->params[i].init.kind != HP_INIT_NONE && !exact_init(&t->prog->params[i].init))
            return true;
    return false;
}

/* Every parameter from the file, and the buffers it holds (an exported model's state: RoPE
 * tables and the like; a buffer the file lacks keeps its init); with buffers_only, the buffers
 * alone. Replicated buffers take the whole tensor, as parameters take their boxes. */
hp_status hp__train_load_weights(trainer *t, const char *path, bool buffers_only, hp_err *err) {
    hp_st_file *f = NULL;
    HP_TRY(hp_st_open(path, &f, err));
    hp_status st = HP_OK;
    for (int i = buffers_only ? t->prog->n_params : 0;
         i < t->prog->n_params + t->prog->n_bufs && st == HP_OK; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        bool buffer = i >= t->prog->n_params;
        const hp_st_tensor *w = buffer ? hp_st_find(f, ps->fqn) : NULL;
        if (buffer && w && ps->global.dtype != HP_F32 && !exact_init(&ps->init)) {
            st = hp_errf(err, HP_UNSUPPORTED,
                         "%s: buffer '%s' is %s: hp loads f32 buffers from a weights file (make "
                         "it f32 in the model, or a constant or arange hp recreates)",
                         path, ps->fqn, hp_dtype_name(ps->global.dtype));
            break;
        }
        if (buffer && (!w || ps->global.dtype != HP_F32)) continue; /* f32 state only */
        if (!buffer && (st = hp_st_get(f, ps->fqn, &w, err)) != HP_OK) break;
        bool same = w->rank == ps->global.rank;
        for (int d = 0; same && d < w->rank; d++) same = w->shape[d] == ps->global.shape[d];
        if (!same) {
            char want[96];
            st = hp_errf(err, HP_INVALID, "%s: tensor '%s' has the wrong shape (want %s)", path,
                         ps->fqn, hp_type_str(&ps->global, want, sizeof want));
            break;
        }
        int64_t n = hp_st_numel(w);
        float *full = hp_malloc((size_t)(n ? n : 1) * sizeof *full);
        if (!full) {
            st = hp_errf(err, HP_NOMEM, "out of memory loading '%s'", ps->fqn);
            break;
        }
        st = hp_st_to_f32(w, full, n, err);
        /* training from a non-finite weight would only ever report loss NaN; a buffer may
         * hold infinities (an additive mask's -inf), never NaN */
        for (int64_t k = 0; st == HP_OK && k < n; k++)
            if (buffer ? isnan(full[k]) : !isfinite(full[k]))
                st = hp_errf(err, HP_INVALID, "%s: tensor '%s' holds %g at element %lld", path,
                             ps->fqn, (double)full[k], (long long)k);
        float *dst = buffer ? hp_exec_ptr(t->ex, ps->buffer) : hp__train_param(t, i);
        copy_ctx c = {t, dst, full, true};
        if (st == HP_OK) st = hp__train_param_runs(t, i, t->rank, copy_run, &c, err);
        hp_free(full);
    }
    hp_st_close(f);
    return st;
}

/* ---- optimizer state ---------------------------------------------------------------------- */

hp_status hp__train_alloc_optimizer(trainer *t, hp_err *err) {
    int n = t->prog->n_params;
    t->m = hp_calloc((size_t)n + 1, sizeof *t->m);
    t->v = hp_calloc((size_t)n + 1, sizeof *t->v);
    t->adam_params = hp_calloc((size_t)n + 1, sizeof *t->adam_params);
    t->grads = hp_calloc((size_t)n + 1, sizeof *t->grads);
    if (!t->m || !t->v || !t->adam_params || !t->grads)
        return hp_errf(err, HP_NOMEM, "out of memory for the optimizer state");
    for (int i = 0; i < n; i++) {
        int64_t k = hp__train_numel(t, i);
        size_t bytes = (size_t)k * sizeof(float);
        void *m = NULL, *v = NULL; /* zeroed by alloc, as torch's state before step 1 */
        HP_TRY(t->be->vt->alloc(t->be, bytes, &m, err));
        t->m[i] = m;
        HP_TRY(t->be->vt->alloc(t->be, bytes, &v, err));
        t->v[i] = v;
        float *g = hp_exec_ptr(t->ex, t->prog->params[i].grad);
        /* the parameter's bf16 copy (mixed precision), rewritten by each update */
        int32_t copy = hp_program_param_cast(t->prog, i);
        uint16_t *pb = copy >= 0 ? hp_exec_ptr(t->ex, copy) : NULL;
        t->adam_params[i] = (hp_adamw_param){hp__train_param(t, i), g, t->m[i], t->v[i], k, pb};
        t->grads[i] = (hp_fspan){g, k};
    }
    if (t->accum > 1) { /* gradient accumulation: one f32 buffer beside each gradient */
        if (!(t->accum_grads = hp_calloc((size_t)n + 1, sizeof *t->accum_grads)))
            return hp_errf(err, HP_NOMEM, "out of memory for gradient accumulation");
        for (int i = 0; i < n; i++) {
            void *a = NULL;
            HP_TRY(t->be->vt->alloc(t->be, (size_t)t->grads[i].n * sizeof(float), &a, err));
            t->accum_grads[i] = (hp_fspan){a, t->grads[i].n};
        }
    }
    const hp_train_config *tc = &t->job->train;
    t->adam = (hp_adamw_config){tc->beta1, tc->beta2, tc->eps, tc->weight_decay};
    hp_lr_decay decay = tc->decay == HP_DECAY_COSINE ? HP_LR_DECAY_COSINE
                        : tc->decay == HP_DECAY_NONE ? HP_LR_DECAY_NONE
                                                     : HP_LR_DECAY_LINEAR;
    return hp_lr_schedule_init(&t->lr, tc->lr, t->total_steps, tc->warmup_steps, -1, decay,
                               tc->min_lr_ratio, err);
}

void hp__train_free_optimizer(trainer *t) {
    if (t->m && t->be)
        for (int i = 0; i < t->prog->n_params; i++) t->be->vt->free(t->be, t->m[i]);
    if (t->v && t->be)
        for (int i = 0; i < t->prog->n_params; i++) t->be->vt->free(t->be, t->v[i]);
    if (t->accum_grads && t->be)
        for (int i = 0; i < t->prog->n_params; i++) t->be->vt->free(t->be, t->accum_grads[i].data);
    hp_free(t->m);
    hp_free(t->v);
    hp_free(t->adam_params);
    hp_free(t->grads);
    hp_free(t->accum_grads);
    t->accum_grads = NULL;
    t->m = t->v = NULL;
    t->adam_params = NULL;
    t->grads = NULL;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

hp_status hp__train_save_checkpoint(trainer *t, int64_t step, hp_err *err) {
    int n = t->prog->n_params;
    hp_ckpt_shard *sh = hp_calloc((size_t)n + 1, sizeof *sh);
    if (!sh) return hp_errf(err, HP_NOMEM, "out of memory");
    hp_status st = HP_OK;
    int viewed = 0; /* shards whose three host views are held */
    for (int i = 0; i < n && st == HP_OK; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        hp_ckpt_shard *s = &sh[i];
        s->fqn = ps->fqn;
        s->dtype = HP_F32;
        s->rank = ps->global.rank;
        memcpy(s->shape, ps->global.shape, sizeof s->shape);
        /* each distinct piece is saved by its owner only: its box in the padded local
         * buffer (the buffer's type is the held shape) */
        const hp_type *held = t->prog->buffers[ps->buffer].type;
        bool mine = hp__train_owned(t, i);
        for (int d = 0; d < s->rank; d++) {
            s->off[d] = ps->off[d];
            s->len[d] = mine ? ps->len[d] : 0;
            s->held[d] = held->shape[d];
        }
        s->state_dtype = HP_F32;
        size_t bytes = (size_t)hp__train_numel(t, i) * sizeof(float);
        void *p = NULL, *m = NULL, *v = NULL;
        st = view(t, hp__train_param(t, i), bytes, &p, err);
        if (st == HP_OK) st = view(t, t->m[i], bytes, &m, err);
        if (st == HP_OK) st = view(t, t->v[i], bytes, &v, err);
        if (st != HP_OK) {
            if (p) view_done(p, hp__train_param(t, i));
            if (m) view_done(m, t->m[i]);
            break;
        }
        s->param = p;
        s->exp_avg = m;
        s->exp_avg_sq = v;
        viewed++;
    }
    hp_ckpt_scalars sc = {.step = step,
                          .seed = t->job->train.seed,
                          .data_step = step,
                          .data_fingerprint = hp_data_get_info(t->data)->fingerprint,
                          .loss_scale = 1};
    int keep = t->opts->keep_checkpoints > 0 ? t->opts->keep_checkpoints : 3;
    if (st == HP_OK && t->world == 1) {
        st = hp_ckpt_save(t->ckpt_dir, &sc, sh, n, keep, err);
    } else if (st == HP_OK) {
        /* every rank writes its file; once all have, rank 0 writes the index */
        st = hp_ckpt_write_rank(t->ckpt_dir, t->rank, t->world, &sc, sh, n, err);
        if (st == HP_OK) st = t->comm->vt->barrier(t->comm, err);
        if (st == HP_OK && t->rank == 0)
            st = hp_ckpt_commit(t->ckpt_dir, step, t->world, keep, err);
        if (st == HP_OK) st = t->comm->vt->barrier(t->comm, err);
    }
    for (int i = 0; i < viewed; i++) {
        view_done((void *)sh[i].param, hp__train_param(t, i));
        view_done((void *)sh[i].exp_avg, t->m[i]);
        view_done((void *)sh[i].exp_avg_sq, t->v[i]);
    }
    hp_free(sh);
    return st;
}

void hp__train_resume_root(const char *dir, char *root, size_t len) {
    char sub[HP__TRAIN_PATH_MAX];
    snprintf(sub, sizeof sub, "%s/checkpoints", dir);
    snprintf(root, len, "%s", hp__train_is_dir(sub) ? sub : dir);
}

/* Parameter i's box of one kind of state into the device buffer dev (its local buffer's
 * shape; elements outside the box, the padding, stay zero). */
static hp_status read_box(trainer *t, hp_ckpt *c, int i, hp_ckpt_part kind, void *dev,
                          hp_err *err) {
    const hp_param_slot *ps = &t->prog->params[i];
    const hp_type *held = t->prog->buffers[ps->buffer].type;
    size_t bytes = (size_t)hp__train_numel(t, i) * sizeof(float);
    void *host;
    HP_TRY(stage(t, dev, bytes, &host, err));
    hp_status st = hp_ckpt_read_box(c, ps->fqn, kind, ps->global.rank, ps->off, ps->len,
                                    held->shape, host, bytes, err);
    return land(t, dev, host, bytes, st, err);
}

/* Opens the newest checkpoint of root that verifies: one that fails (a corrupt tensor, a
 * missing or unreadable rank file) is passed over for the one before it, with the reason
 * logged; all failing is an error naming the newest's reason. Every rank sees the same files,
 * so every rank lands on the same step. */
static hp_status open_verified(trainer *t, const char *root, hp_ckpt **c, hp_err *err) {
    int64_t at, before = t->opts->resume_before > 0 ? t->opts->resume_before : INT64_MAX;
    HP_TRY(hp_ckpt_latest_before(root, before, &at, err));
    hp_err newest = {0};
    int failed = 0;
    for (;;) {
        hp_err e = {0};
        hp_status s = hp_ckpt_open(root, at, c, &e);
        if (s == HP_OK) return HP_OK;
        if (s == HP_NOMEM) return hp_errf(err, s, "%s", e.msg);
        if (failed++ == 0) newest = e;
        int64_t prev;
        hp_status ps = hp_ckpt_latest_before(root, at, &prev, NULL);
        if (t->rank == 0)
            fprintf(t->log, "warning: resume: checkpoint step=%lld fails verification: %s; %s\n",
                    (long long)at, e.msg,
                    ps == HP_OK ? "falling back to the previous one" : "none older to try");
        if (ps != HP_OK)
            return hp_errf(
                err, newest.status,
                "resume: no usable checkpoint in %s: %d complete one%s failed verification; "
                "the newest: %s",
                root, failed, failed == 1 ? "" : "s", newest.msg);
        at = prev;
    }
}

hp_status hp__train_load_checkpoint(trainer *t, const char *dir, int64_t *step, hp_err *err) {
    char root[HP__TRAIN_PATH_MAX];
    hp__train_resume_root(dir, root, sizeof root);
    hp_ckpt *c = NULL;
    HP_TRY(open_verified(t, root, &c, err));
    hp_status st = HP_OK;
    const hp_ckpt_scalars *sc = hp_ckpt_get_scalars(c);
    if (sc->data_fingerprint != hp_data_get_info(t->data)->fingerprint) {
        st = hp_errf(err, HP_INVALID,
                     "%s: the checkpoint was trained on other data (fingerprint differs)", root);
        goto done;
    }
    for (int i = 0; i < t->prog->n_params && st == HP_OK; i++) {
        /* this rank's box, whatever mesh wrote the checkpoint */
        st = read_box(t, c, i, HP_CKPT_PARAM, hp__train_param(t, i), err);
        if (st == HP_OK) st = read_box(t, c, i, HP_CKPT_EXP_AVG, t->m[i], err);
        if (st == HP_OK) st = read_box(t, c, i, HP_CKPT_EXP_AVG_SQ, t->v[i], err);
    }
    *step = sc->step;
done:
    hp_ckpt_close(c);
    if (st != HP_OK) hp_err_prefix(err, "resume");
    return st;
}

/* ---- weights out -------------------------------------------------------------------------- */

/* Does rank 0 hold all of parameter i, unpadded (a replicated parameter)? The same answer on
 * every rank: it decides whether they gather. */
static bool rank0_holds_all(trainer *t, int i) {
    const hp_param_slot *ps = &t->prog->params[i];
    const hp_type *held = t->prog->buffers[ps->buffer].type;
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
    if (hp_program_box(t->prog, i, 0, off, len, NULL) != HP_OK) return false;
    for (int d = 0; d < ps->global.rank; d++)
        if (off[d] != 0 || len[d] != ps->global.shape[d] || held->shape[d] != ps->global.shape[d])
            return false;
    return true;
}

/* Parameter i whole on rank 0, at *data (NULL elsewhere); *owned is what to free (NULL when
 * *data is the device buffer itself). Every distinct piece is gathered over the world and
 * placed at its box, unless rank 0 holds all of it. */
static hp_status gather_full(trainer *t, int i, const float **data, float **owned, hp_err *err) {
    const hp_param_slot *ps = &t->prog->params[i];
    float *dev = hp__train_param(t, i);
    int64_t numel = hp__train_numel(t, i);
    size_t bytes = (size_t)numel * sizeof(float);
    *data = NULL;
    *owned = NULL;
    if (rank0_holds_all(t, i)) { /* nothing to gather: rank 0's own buffer (or its copy) */
        if (t->rank != 0) return HP_OK;
        void *local = NULL;
        HP_TRY(view(t, dev, bytes, &local, err));
        *data = local;
        *owned = local != dev ? local : NULL;
        return HP_OK;
    }
    void *local = NULL;
    HP_TRY(view(t, dev, bytes, &local, err));
    float *all = NULL, *full = NULL;
    hp_status st = HP_OK;
    if (t->world > 1) {
        if (!(all = hp_malloc(bytes * (size_t)t->world)))
            st = hp_errf(err, HP_NOMEM, "out of memory gathering '%s'", ps->fqn);
        else
            st = t->comm->vt->all_gather(t->comm, local, all, bytes, err);
    }
    int64_t total = hp_type_numel(&ps->global);
    if (st == HP_OK && t->rank == 0 &&
        !(full = hp_calloc((size_t)(total ? total : 1), sizeof *full)))
        st = hp_errf(err, HP_NOMEM, "out of memory gathering '%s'", ps->fqn);
    for (int r = 0; st == HP_OK && t->rank == 0 && r < t->world; r++) {
        if (!hp_program_owns(t->prog, i, r)) continue;
        copy_ctx c = {t, all ? all + (size_t)r * (size_t)numel : local, full, false};
        st = hp__train_param_runs(t, i, r, copy_run, &c, err);
    }
    hp_free(all);
    view_done(local, dev);
    if (st != HP_OK) {
        hp_free(full);
        return st;
    }
    *data = *owned = full;
    return HP_OK;
}

hp_status hp__train_export_weights(trainer *t, const char *path, hp_err *err) {
    int n = t->prog->n_params;
    hp_st_tensor *ts = hp_calloc((size_t)n + 1, sizeof *ts);
    float **full = hp_calloc((size_t)n + 1, sizeof *full); /* what to free (rank 0) */
    hp_status st = HP_OK;
    if (!ts || !full) {
        st = hp_errf(err, HP_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n && st == HP_OK; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        const float *data = NULL;
        if ((st = gather_full(t, i, &data, &full[i], err)) != HP_OK) break;
        ts[i].name = ps->fqn;
        ts[i].dtype = HP_ST_F32;
        ts[i].rank = ps->global.rank;
        memcpy(ts[i].shape, ps->global.shape, sizeof(int64_t) * (size_t)ps->global.rank);
        ts[i].data = data;
        ts[i].nbytes = (size_t)hp_type_numel(&ps->global) * sizeof(float);
    }
    hp_st_kv meta[2] = {{"format", "pt"}, {"producer", "hp"}};
    if (st == HP_OK && t->rank == 0) st = hp_st_write(path, ts, n, meta, 2, err);
done:
    if (full)
        for (int i = 0; i < n; i++) hp_free(full[i]);
    hp_free(full);
    hp_free(ts);
    return st;
}
