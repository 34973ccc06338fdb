/* worker/train_state.c — the training state in and out of the device (train_internal.h):
 * parameter init, weights from safetensors, AdamW state, checkpoints, the final export.
 *
 * Device buffers are never read or written here: init and math go through the backend's
 * vtable, and files stage through copy_in / copy_out. A host-visible backend (cpu) lends its
 * buffers directly, so the CPU pays no copy; which rows a rank holds comes from
 * hp__train_geo alone.
 */
#include "worker/train_internal.h"

#include "hp/checkpoint.h"
#include "hp/param_init.h"
#include "hp/safetensors.h"

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

/* *host: a host buffer of `bytes` to fill, then land at dev with land (dev itself when
 * host-visible). */
static hp_status stage(trainer *t, void *dev, size_t bytes, void **host, hp_err *err) {
    if (t->host_visible) {
        *host = dev;
        return HP_OK;
    }
    if (!(*host = hp_malloc(bytes ? bytes : 1)))
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

hp_status hp__train_init_params(trainer *t, hp_err *err) {
    for (int i = 0; i < t->prog->n_params; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        hp_init init = ps->init;
        if (init.kind == HP_INIT_NONE) init.kind = HP_INIT_ZEROS;
        hp__shard_geo g = hp__train_geo(t, i);
        hp_status st = t->be->vt->fill_init(t->be, hp__train_param(t, i), &init, t->job->train.seed,
                                            ps->fqn, g.start * g.row, g.real * g.row, err);
        if (st != HP_OK) return hp_err_prefix(err, "init '%s'", ps->fqn);
    }
    return HP_OK;
}

hp_status hp__train_load_weights(trainer *t, const char *path, hp_err *err) {
    hp_st_file *f = NULL;
    HP_TRY(hp_st_open(path, &f, err));
    hp_status st = HP_OK;
    for (int i = 0; i < t->prog->n_params && st == HP_OK; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        const hp_st_tensor *w;
        if ((st = hp_st_get(f, ps->fqn, &w, err)) != HP_OK) break;
        bool same = w->rank == ps->global.rank;
        for (int d = 0; same && d < w->rank; d++) same = w->shape[d] == ps->global.shape[d];
        if (!same) {
            char want[96];
            st = hp_errf(err, HP_INVALID, "%s: tensor '%s' has the wrong shape (want %s)", path,
                         ps->fqn, hp_type_str(&ps->global, want, sizeof want));
            break;
        }
        hp__shard_geo g = hp__train_geo(t, i);
        int64_t n = hp_st_numel(w);
        float *full = hp_malloc((size_t)(n ? n : 1) * sizeof *full);
        if (!full) {
            st = hp_errf(err, HP_NOMEM, "out of memory loading '%s'", ps->fqn);
            break;
        }
        st = hp_st_to_f32(w, full, n, err);
        if (st == HP_OK)
            st = t->be->vt->copy_in(t->be, hp__train_param(t, i), full + g.start * g.row,
                                    (size_t)(g.real * g.row) * sizeof *full, err);
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
        t->adam_params[i] = (hp_adamw_param){hp__train_param(t, i), g, t->m[i], t->v[i], k};
        t->grads[i] = (hp_fspan){g, k};
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
    hp_free(t->m);
    hp_free(t->v);
    hp_free(t->adam_params);
    hp_free(t->grads);
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
        hp__shard_geo g = hp__train_geo(t, i);
        /* replicated tensors are saved by rank 0 only */
        bool mine = hp__train_sharded(t, i) || t->rank == 0;
        /* a dim-0 box: rows [start, start + real) x the other dims whole, in a local buffer
         * of g.s rows (the rest padding) */
        for (int d = 0; d < s->rank; d++) s->len[d] = s->held[d] = s->shape[d];
        if (s->rank) {
            s->off[0] = mine ? g.start : 0;
            s->len[0] = mine ? g.real : 0;
            s->held[0] = g.s;
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

/* Rows [a, b) of one kind of state for fqn into the device buffer dev. */
static hp_status read_rows(trainer *t, hp_ckpt *c, const char *fqn, hp_ckpt_part kind, int64_t a,
                           int64_t b, void *dev, size_t bytes, hp_err *err) {
    void *host;
    HP_TRY(stage(t, dev, bytes, &host, err));
    /* the dim-0 box [a, b) x the other dims whole */
    const hp_ckpt_entry *e = hp_ckpt_find(c, fqn);
    int nd = e ? e->rank : 0;
    int64_t off[HP_MAX_RANK] = {0}, len[HP_MAX_RANK] = {0};
    for (int d = 0; d < nd; d++) len[d] = e->shape[d];
    if (nd) {
        off[0] = a;
        len[0] = b - a;
    }
    hp_status st = hp_ckpt_read_box(c, fqn, kind, nd, off, len, NULL, host, bytes, err);
    return land(t, dev, host, bytes, st, err);
}

hp_status hp__train_load_checkpoint(trainer *t, const char *dir, int64_t *step, hp_err *err) {
    char root[HP__TRAIN_PATH_MAX];
    hp__train_resume_root(dir, root, sizeof root);
    hp_ckpt *c = NULL;
    HP_TRY(hp_ckpt_open(root, -1, &c, err));
    hp_status st = HP_OK;
    const hp_ckpt_scalars *sc = hp_ckpt_get_scalars(c);
    if (sc->data_fingerprint != hp_data_get_info(t->data)->fingerprint) {
        st = hp_errf(err, HP_INVALID,
                     "%s: the checkpoint was trained on other data (fingerprint differs)", root);
        goto done;
    }
    for (int i = 0; i < t->prog->n_params && st == HP_OK; i++) {
        /* this rank's rows, whatever world wrote the checkpoint; padding rows stay zero */
        const hp_param_slot *ps = &t->prog->params[i];
        hp__shard_geo g = hp__train_geo(t, i);
        int64_t a = g.start, b = g.start + g.real;
        size_t bytes = (size_t)(g.real * g.row) * sizeof(float);
        st = read_rows(t, c, ps->fqn, HP_CKPT_PARAM, a, b, hp__train_param(t, i), bytes, err);
        if (st == HP_OK) st = read_rows(t, c, ps->fqn, HP_CKPT_EXP_AVG, a, b, t->m[i], bytes, err);
        if (st == HP_OK)
            st = read_rows(t, c, ps->fqn, HP_CKPT_EXP_AVG_SQ, a, b, t->v[i], bytes, err);
    }
    *step = sc->step;
done:
    hp_ckpt_close(c);
    if (st != HP_OK) hp_err_prefix(err, "resume");
    return st;
}

/* ---- weights out -------------------------------------------------------------------------- */

hp_status hp__train_export_weights(trainer *t, const char *path, hp_err *err) {
    int n = t->prog->n_params;
    hp_st_tensor *ts = hp_calloc((size_t)n + 1, sizeof *ts);
    float **full = hp_calloc((size_t)n + 1, sizeof *full); /* gathered, or a staged copy */
    hp_status st = HP_OK;
    if (!ts || !full) {
        st = hp_errf(err, HP_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n && st == HP_OK; i++) {
        const hp_param_slot *ps = &t->prog->params[i];
        hp__shard_geo g = hp__train_geo(t, i);
        float *dev = hp__train_param(t, i);
        size_t bytes = (size_t)hp__train_numel(t, i) * sizeof(float);
        void *local = NULL;
        if ((st = view(t, dev, bytes, &local, err)) != HP_OK) break;
        const float *data = local;
        if (hp__train_sharded(t, i)) {
            if (!(full[i] = hp_malloc(bytes * (size_t)t->world)))
                st = hp_errf(err, HP_NOMEM, "out of memory gathering '%s'", ps->fqn);
            else
                st = t->comm->vt->all_gather(t->comm, local, full[i], bytes, err);
            view_done(local, dev);
            data = full[i]; /* padded: its first `rows` rows are the tensor */
        } else if (local != dev) {
            full[i] = local; /* the staged copy, freed below */
        }
        ts[i].name = ps->fqn;
        ts[i].dtype = HP_ST_F32;
        ts[i].rank = ps->global.rank;
        memcpy(ts[i].shape, ps->global.shape, sizeof(int64_t) * (size_t)ps->global.rank);
        ts[i].data = data;
        ts[i].nbytes = (size_t)(g.rows * g.row) * sizeof(float);
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
