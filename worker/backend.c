/* worker/backend.c — the backend factory (backend.h): the job's device picks the backend.
 * A device this hp-worker has no backend for, or whose hardware is missing, is an error with
 * one line; nothing ever falls back to the CPU. */
#include "worker/backend.h"

#include "hp/device.h"
#include "worker/cpu/cpu_backend.h"
#ifdef HP_CUDA_BACKEND
#include "worker/cuda/cuda_backend.h"
#endif

hp_status hp_backend_new(hp_device_kind device, const hp_backend_opts *opts, hp_backend **out,
                         hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "backend: out is NULL");
    *out = NULL;
    hp_backend_opts none = {0};
    if (!opts) opts = &none;
    HP_TRY(hp_device_built(device, err));
    switch (device) {
    case HP_DEVICE_CPU: {
        hp_backend *b = NULL;
        HP_TRY(hp_cpu_backend_new(opts->threads, &b, err));
        if (opts->comm) {
            hp_status st = hp_cpu_backend_set_comm(b, opts->comm, err);
            if (st == HP_OK && opts->n_groups > 0)
                st = hp_cpu_backend_set_groups(b, opts->groups, opts->n_groups, err);
            if (st != HP_OK) {
                hp_backend_free(b);
                return st;
            }
        }
        *out = b;
        return HP_OK;
    }
    case HP_DEVICE_CUDA: {
#ifdef HP_CUDA_BACKEND
        /* One device per rank: the launcher's CUDA_VISIBLE_DEVICES leaves each rank one, and
         * ranks of one process group that all see every device take rank % count. */
        int count = hp_cuda_device_count(NULL, 0);
        int device = opts->comm && count > 0 ? opts->comm->rank % count : 0;
        hp_backend *b = NULL;
        HP_TRY(hp_cuda_backend_new(device, &b, err));
        if (opts->comm) {
            hp_status st =
                hp_cuda_backend_set_comm(b, opts->comm, opts->groups, opts->n_groups, err);
            if (st != HP_OK) {
                hp_backend_free(b);
                return st;
            }
        }
        *out = b;
        return HP_OK;
#else
        break; /* hp_device_built refused it above */
#endif
    }
    }
    return hp_errf(err, HP_UNSUPPORTED, "device %s: no backend in this hp-worker",
                   hp_device_name(device));
}

hp_status hp_backend_available(hp_device_kind d, hp_err *err) {
    HP_TRY(hp_device_built(d, err));
#ifdef HP_CUDA_BACKEND
    if (d == HP_DEVICE_CUDA) {
        char why[160] = "";
        if (hp_cuda_device_count(why, sizeof why) == 0)
            return hp_errf(err, HP_UNSUPPORTED, "device cuda: no CUDA device (%s)", why);
    }
#endif
    return HP_OK;
}

/* ---- bf16 staging --------------------------------------------------------------------------- */

hp_status hp_dropout_site_of(const hp_kernel_call *c, hp_dropout_site *s, double *p_out,
                             hp_err *err) {
    const hp_type *t = &c->in_type[0];
    const hp_attr *f = hp_node_attr(c->node, HP_ATTR_FQN);
    *s = (hp_dropout_site){.stream = hp_rng_stream_id(f && f->s ? f->s : ""), .rank = t->rank};
    if (c->site) {
        s->seed = c->site->seed;
        s->step = c->site->step;
        if (c->site->rank != t->rank)
            return hp_errf(err, HP_INVALID, "the dropout site has %d dims, the input %d",
                           c->site->rank, t->rank);
    }
    for (int d = 0; d < t->rank; d++) {
        s->local[d] = t->shape[d];
        s->off[d] = c->site ? c->site->off[d] : 0;
        s->global[d] = c->site ? c->site->global[d] : t->shape[d];
        if (s->off[d] < 0 || s->off[d] + s->local[d] > s->global[d])
            return hp_errf(err, HP_INVALID,
                           "dim %d: the piece [%lld, %lld) is outside the whole tensor's %lld", d,
                           (long long)s->off[d], (long long)(s->off[d] + s->local[d]),
                           (long long)s->global[d]);
    }
    double p = hp_node_float(c->node, HP_ATTR_P, 0.0);
    if (!(p >= 0 && p < 1)) return hp_errf(err, HP_INVALID, "p %g is not in [0, 1)", p);
    *p_out = c->site && c->site->eval ? 0.0 : p; /* evaluation: nothing dropped, scale 1 */
    return HP_OK;
}

static size_t stage_slice(const hp_type *t, size_t align) {
    size_t b = (size_t)hp_type_numel(t) * sizeof(float);
    return (b + align - 1) & ~(align - 1);
}

size_t hp_stage_bytes(const hp_kernel_call *c, size_t align) {
    size_t need = 0;
    for (int i = 0; i < c->n_in; i++)
        if (c->in_type[i].dtype == HP_BF16) need += stage_slice(&c->in_type[i], align);
    for (int i = 0; i < c->n_out; i++)
        if (c->out_type[i].dtype == HP_BF16) need += stage_slice(&c->out_type[i], align);
    return need;
}

void hp_stage_view_make(const hp_kernel_call *c, void *stage, size_t align, hp_stage_view *v) {
    char *at = stage;
    for (int i = 0; i < c->n_in; i++) {
        v->in[i] = c->in[i];
        v->in_type[i] = c->in_type[i];
        if (c->in_type[i].dtype != HP_BF16) continue;
        v->in[i] = at;
        v->in_type[i].dtype = HP_F32;
        at += stage_slice(&c->in_type[i], align);
    }
    for (int i = 0; i < c->n_out; i++) {
        v->out[i] = c->out[i];
        v->out_type[i] = c->out_type[i];
        if (c->out_type[i].dtype != HP_BF16) continue;
        v->out[i] = at;
        v->out_type[i].dtype = HP_F32;
        at += stage_slice(&c->out_type[i], align);
    }
    v->node = *c->node;
    v->node.out = v->out_type;
    v->call = *c;
    v->call.node = &v->node;
    v->call.in = v->in;
    v->call.in_type = v->in_type;
    v->call.out = v->out;
    v->call.out_type = v->out_type;
}
