/* worker/cpu/cpu_backend.c — the cpu backend's vtable (cpu_backend.h): device facts, host
 * memory, the kernel table indexed by hp_op and the launch that checks a call and dispatches
 * through it, group-size-1 collectives, trivial events, and the training loop's math
 * (AdamW, grad norm, scaling, init: hp/optim.h and hp/param_init.h on the backend's pool).
 * Also the helpers every kernel file shares (dtype and shape checks, scratch, strides).
 *
 * Not here: the kernels (k_*.c, one family each) and the executor that decides what to launch.
 */
#define _GNU_SOURCE /* sysconf's _SC_PHYS_PAGES */
#include "worker/cpu/cpu_backend.h"
#include "worker/cpu/cpu_internal.h"

#include "hp/metrics.h"
#include "hp/optim.h"
#include "hp/param_init.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 64

/* ---- the kernel table ----------------------------------------------------------------------- */

static const hp__cpu_kernel kernels[HP_OP_COUNT] = {
    [HP_OP_FULL] = hp__cpu_creation,
    [HP_OP_ZEROS] = hp__cpu_creation,
    [HP_OP_ONES] = hp__cpu_creation,
    [HP_OP_ADD] = hp__cpu_binary,
    [HP_OP_SUB] = hp__cpu_binary,
    [HP_OP_MUL] = hp__cpu_binary,
    [HP_OP_DIV] = hp__cpu_binary,
    [HP_OP_MAXIMUM] = hp__cpu_binary,
    [HP_OP_EQ] = hp__cpu_binary,
    [HP_OP_LT] = hp__cpu_binary,
    [HP_OP_WHERE] = hp__cpu_where,
    [HP_OP_ADD_SCALAR] = hp__cpu_unary,
    [HP_OP_MUL_SCALAR] = hp__cpu_unary,
    [HP_OP_POW] = hp__cpu_unary,
    [HP_OP_NEG] = hp__cpu_unary,
    [HP_OP_EXP] = hp__cpu_unary,
    [HP_OP_LOG] = hp__cpu_unary,
    [HP_OP_SQRT] = hp__cpu_unary,
    [HP_OP_RSQRT] = hp__cpu_unary,
    [HP_OP_TANH] = hp__cpu_unary,
    [HP_OP_SIN] = hp__cpu_unary,
    [HP_OP_COS] = hp__cpu_unary,
    [HP_OP_ERF] = hp__cpu_unary,
    [HP_OP_SIGMOID] = hp__cpu_unary,
    [HP_OP_SILU] = hp__cpu_unary,
    [HP_OP_GELU] = hp__cpu_unary,
    [HP_OP_RELU] = hp__cpu_unary,
    [HP_OP_TO_COPY] = hp__cpu_to_copy,
    [HP_OP_TANH_BACKWARD] = hp__cpu_backward_pair,
    [HP_OP_SIGMOID_BACKWARD] = hp__cpu_backward_pair,
    [HP_OP_SILU_BACKWARD] = hp__cpu_backward_pair,
    [HP_OP_GELU_BACKWARD] = hp__cpu_backward_pair,
    [HP_OP_THRESHOLD_BACKWARD] = hp__cpu_backward_pair,
    [HP_OP_SUM] = hp__cpu_reduce,
    [HP_OP_MEAN] = hp__cpu_reduce,
    [HP_OP_AMAX] = hp__cpu_reduce,
    [HP_OP_VIEW] = hp__cpu_copy_op,
    [HP_OP_RESHAPE] = hp__cpu_copy_op,
    [HP_OP_PERMUTE] = hp__cpu_permute,
    [HP_OP_TRANSPOSE] = hp__cpu_permute,
    [HP_OP_T] = hp__cpu_permute,
    [HP_OP_EXPAND] = hp__cpu_expand,
    [HP_OP_SLICE] = hp__cpu_slice,
    [HP_OP_SLICE_BACKWARD] = hp__cpu_slice_backward,
    [HP_OP_CAT] = hp__cpu_cat,
    [HP_OP_UNSQUEEZE] = hp__cpu_copy_op,
    [HP_OP_SQUEEZE] = hp__cpu_copy_op,
    [HP_OP_CLONE] = hp__cpu_copy_op,
    [HP_OP_DETACH] = hp__cpu_copy_op,
    [HP_OP_MM] = hp__cpu_mm,
    [HP_OP_BMM] = hp__cpu_bmm,
    [HP_OP_ADDMM] = hp__cpu_addmm,
    [HP_OP_EMBEDDING] = hp__cpu_embedding,
    [HP_OP_EMBEDDING_DENSE_BACKWARD] = hp__cpu_embedding_backward,
    [HP_OP_CHUNKED_EMBEDDING] = hp__cpu_chunked_embedding,
    [HP_OP_CHUNKED_EMBEDDING_BACKWARD] = hp__cpu_chunked_embedding_backward,
    [HP_OP_LOG_SOFTMAX] = hp__cpu_softmax,
    [HP_OP_LOG_SOFTMAX_BACKWARD] = hp__cpu_softmax_backward,
    [HP_OP_SOFTMAX] = hp__cpu_softmax,
    [HP_OP_SOFTMAX_BACKWARD] = hp__cpu_softmax_backward,
    [HP_OP_NLL_LOSS_FORWARD] = hp__cpu_nll_loss,
    [HP_OP_NLL_LOSS_BACKWARD] = hp__cpu_nll_loss_backward,
    [HP_OP_FUSED_CROSS_ENTROPY] = hp__cpu_fused_cross_entropy,
    [HP_OP_FUSED_CROSS_ENTROPY_BACKWARD] = hp__cpu_fused_cross_entropy_backward,
    [HP_OP_SWIGLU] = hp__cpu_swiglu,
    [HP_OP_SWIGLU_BACKWARD] = hp__cpu_swiglu_backward,
    [HP_OP_RMS_NORM] = hp__cpu_rms_norm,
    [HP_OP_RMS_NORM_BACKWARD] = hp__cpu_rms_norm_backward,
    [HP_OP_LAYER_NORM] = hp__cpu_layer_norm,
    [HP_OP_LAYER_NORM_BACKWARD] = hp__cpu_layer_norm_backward,
    [HP_OP_TRIL] = hp__cpu_tril,
    [HP_OP_NATIVE_DROPOUT] = hp__cpu_dropout,
    [HP_OP_NATIVE_DROPOUT_BACKWARD] = hp__cpu_dropout_backward,
    [HP_OP_BITWISE_NOT] = hp__cpu_bitwise_not,
    [HP_OP_ARANGE] = hp__cpu_arange,
    [HP_OP_ROTARY_EMB] = hp__cpu_rotary,
    [HP_OP_SDPA] = hp__cpu_sdpa,
    [HP_OP_SDPA_BACKWARD] = hp__cpu_sdpa_backward,
    [HP_OP_WAIT_TENSOR] = hp__cpu_copy_op,
};

/* ---- shared helpers ------------------------------------------------------------------------- */

hp_status hp__cpu_dtype(const hp_kernel_call *c, int out, int k, unsigned allowed, hp_err *err) {
    hp_dtype dt = out ? c->out_type[k].dtype : c->in_type[k].dtype;
    if ((unsigned)dt < HP_DTYPE_COUNT && (allowed & HP__M(dt))) return HP_OK;
    const char *what = out ? "output" : "input";
    if ((unsigned)dt < HP_DTYPE_COUNT && hp_dtype_is_float(dt))
        return hp_errf(err, HP_UNSUPPORTED,
                       "dtype %s of %s %d is not supported: the cpu backend computes floating "
                       "ops in f32 and stores f32 or bf16",
                       hp_dtype_name(dt), what, k);
    if ((unsigned)dt >= HP_DTYPE_COUNT)
        return hp_errf(err, HP_INVALID, "%s %d has no valid dtype (%d)", what, k, (int)dt);
    return hp_errf(err, HP_INVALID, "dtype %s of %s %d is not allowed here", hp_dtype_name(dt),
                   what, k);
}

hp_status hp__cpu_dtypes_all(const hp_kernel_call *c, unsigned allowed, hp_err *err) {
    for (int k = 0; k < c->n_in; k++) HP_TRY(hp__cpu_dtype(c, 0, k, allowed, err));
    for (int k = 0; k < c->n_out; k++) HP_TRY(hp__cpu_dtype(c, 1, k, allowed, err));
    return HP_OK;
}

hp_status hp__cpu_out_numel(const hp_kernel_call *c, int k, int64_t n, hp_err *err) {
    int64_t have = hp_type_numel(&c->out_type[k]);
    if (have != n) {
        char buf[128];
        return hp_errf(err, HP_INVALID, "output %d %s has %lld elements, expected %lld", k,
                       hp_type_str(&c->out_type[k], buf, sizeof buf), (long long)have,
                       (long long)n);
    }
    return HP_OK;
}

hp_status hp__cpu_same_shape(const hp_kernel_call *c, int a, int b, int b_out, hp_err *err) {
    const hp_type *ta = &c->in_type[a], *tb = b_out ? &c->out_type[b] : &c->in_type[b];
    bool same = ta->rank == tb->rank;
    for (int d = 0; same && d < ta->rank; d++) same = ta->shape[d] == tb->shape[d];
    if (!same) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "input %d %s and %s %d %s differ in shape", a,
                       hp_type_str(ta, x, sizeof x), b_out ? "output" : "input", b,
                       hp_type_str(tb, y, sizeof y));
    }
    return HP_OK;
}

hp_status hp__cpu_check_bcast(const hp_type *in, const hp_type *out, const char *what,
                              hp_err *err) {
    bool ok = in->rank <= out->rank;
    for (int d = 0; ok && d < in->rank; d++) {
        int64_t a = in->shape[in->rank - 1 - d], b = out->shape[out->rank - 1 - d];
        ok = a == b || a == 1;
    }
    if (!ok) {
        char x[128], y[128];
        return hp_errf(err, HP_INVALID, "%s %s does not broadcast to %s", what,
                       hp_type_str(in, x, sizeof x), hp_type_str(out, y, sizeof y));
    }
    return HP_OK;
}

hp_status hp__cpu_attr_dim(const hp_node *n, hp_attr_key k, int rank, int *out, hp_err *err) {
    int64_t d = hp_node_int(n, k, 0);
    if (d < -rank || d >= (rank > 0 ? rank : 1))
        return hp_errf(err, HP_INVALID, "%s %lld is out of range for rank %d", hp_attr_key_name(k),
                       (long long)d, rank);
    *out = (int)(d < 0 ? d + rank : d);
    return HP_OK;
}

void hp__cpu_strides(const hp_type *t, int64_t st[HP_MAX_RANK]) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->shape[d];
    }
}

void hp__cpu_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]) {
    int64_t ist[HP_MAX_RANK];
    hp__cpu_strides(in, ist);
    int off = out->rank - in->rank;
    for (int d = 0; d < out->rank; d++) {
        int di = d - off;
        st[d] = di < 0 || in->shape[di] == 1 ? 0 : ist[di];
    }
}

/* 64-byte aligned blocks over hp_calloc (so that fault injection reaches them): the original
 * pointer sits just below the aligned one. */
static void *aligned_calloc(size_t bytes) {
    if (bytes > SIZE_MAX - ALIGN - sizeof(void *)) return NULL;
    char *raw = hp_calloc(1, bytes + ALIGN + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t a = ((uintptr_t)(raw + sizeof(void *)) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
    ((void **)a)[-1] = raw;
    return (void *)a;
}

static void aligned_free(void *p) {
    if (p) hp_free(((void **)p)[-1]);
}

void *hp__cpu_scratch(hp__cpu *cpu, size_t bytes, hp_err *err) {
    if (bytes <= cpu->scratch_cap && cpu->scratch) return cpu->scratch;
    size_t cap = cpu->scratch_cap * 2 > bytes ? cpu->scratch_cap * 2 : bytes;
    void *p = aligned_calloc(cap);
    if (!p) {
        hp_errf(err, HP_NOMEM, "out of memory for %zu bytes of kernel scratch", bytes);
        return NULL;
    }
    aligned_free(cpu->scratch);
    cpu->scratch = p;
    cpu->scratch_cap = cap;
    return p;
}

/* ---- the vtable ----------------------------------------------------------------------------- */

static hp__cpu *as_cpu(hp_backend *b) {
    return (hp__cpu *)b;
}

static hp_status cpu_info(hp_backend *b, hp_device_info *out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "cpu: info: out is NULL");
    hp__cpu *cpu = as_cpu(b);
    memset(out, 0, sizeof *out);
    char model[96];
    hp_cpu_model(model, sizeof model);
    snprintf(out->name, sizeof out->name, "cpu: %s (%d thread%s)", model, cpu->threads,
             cpu->threads == 1 ? "" : "s");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    /* measured once per backend (a cache on disk makes later runs free); unknown when the
     * probe cannot run, never another device's figure */
    if (!cpu->peak_done) {
        if (hp_cpu_peak_flops(cpu->threads, &cpu->peak_flops, NULL) != HP_OK) cpu->peak_flops = 0;
        cpu->peak_done = true;
    }
    out->peak_flops = cpu->peak_flops;
    out->host_visible = true;
    out->threads = cpu->threads;
    return HP_OK;
}

static hp_status cpu_alloc(hp_backend *b, size_t bytes, void **out, hp_err *err) {
    (void)b;
    if (!out) return hp_errf(err, HP_INVALID, "cpu: alloc: out is NULL");
    *out = aligned_calloc(bytes);
    if (!*out) return hp_errf(err, HP_NOMEM, "cpu: out of memory allocating %zu bytes", bytes);
    return HP_OK;
}

static void cpu_free(hp_backend *b, void *p) {
    (void)b;
    aligned_free(p);
}

static hp_status cpu_copy(hp_backend *b, void *dst, const void *src, size_t bytes, hp_err *err) {
    if (bytes == 0) return HP_OK;
    if (!dst || !src) return hp_errf(err, HP_INVALID, "cpu: copy of %zu bytes with NULL", bytes);
    hp__cpu_copy(as_cpu(b), dst, src, bytes);
    return HP_OK;
}

/* Structural checks shared by launch and collective: the call agrees with its node. */
static hp_status check_call(const hp_kernel_call *c, hp_err *err) {
    if (!c || !c->node) return hp_errf(err, HP_INVALID, "cpu: launch without a node");
    const hp_node *n = c->node;
    if ((unsigned)n->op >= HP_OP_COUNT)
        return hp_errf(err, HP_INVALID, "cpu: launch of unknown op %d", (int)n->op);
    const hp_op_info *info = hp_op_get(n->op);
    if (c->n_in != n->n_in || c->n_out != n->n_out || c->n_out != info->n_out ||
        (info->n_in != HP_VARIADIC && c->n_in != info->n_in))
        return hp_errf(err, HP_INVALID,
                       "cpu: %s: call has %d inputs / %d outputs, the node %d / %d", info->name,
                       c->n_in, c->n_out, n->n_in, n->n_out);
    if ((c->n_in && (!c->in || !c->in_type)) || (c->n_out && (!c->out || !c->out_type)))
        return hp_errf(err, HP_INVALID, "cpu: %s: call without buffers", info->name);
    if (c->flags & ~hp_call_flags_allowed(n->op))
        return hp_errf(err, HP_INVALID, "cpu: %s: call flags 0x%x are not valid for this op",
                       info->name, c->flags);
    for (int k = 0; k < c->n_out; k++) {
        if (!hp_type_eq(&c->out_type[k], &n->out[k])) {
            char x[128], y[128];
            return hp_errf(err, HP_INVALID, "cpu: %s: output %d is %s but the node declares %s",
                           info->name, k, hp_type_str(&c->out_type[k], x, sizeof x),
                           hp_type_str(&n->out[k], y, sizeof y));
        }
        if (!c->out[k] && hp_type_numel(&c->out_type[k]) > 0)
            return hp_errf(err, HP_INVALID, "cpu: %s: output %d is NULL", info->name, k);
    }
    for (int k = 0; k < c->n_in; k++) {
        if (c->in_type[k].rank < 0 || c->in_type[k].rank > HP_MAX_RANK)
            return hp_errf(err, HP_INVALID, "cpu: %s: input %d has rank %d", info->name, k,
                           c->in_type[k].rank);
        if (!c->in[k] && hp_type_numel(&c->in_type[k]) > 0)
            return hp_errf(err, HP_INVALID, "cpu: %s: input %d is NULL", info->name, k);
    }
    return HP_OK;
}

static bool is_collective(hp_op op) {
    return hp_op_get(op)->flags & HP_OPF_COLLECTIVE;
}

static hp_status cpu_collective(hp_backend *b, int stream, const hp_kernel_call *c, hp_err *err) {
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cpu: stream %d does not exist", stream);
    HP_TRY(check_call(c, err));
    const char *name = hp_op_get(c->node->op)->name;
    if (!is_collective(c->node->op))
        return hp_errf(err, HP_INVALID, "cpu: %s is not a collective", name);
    int64_t gs = hp_node_int(c->node, HP_ATTR_GROUP_SIZE, 1);
    hp__cpu *cpu = as_cpu(b);
    if (cpu->comm && gs > 1) {
        hp_status st = hp__cpu_comm_enqueue(cpu->comm, c, err);
        if (st != HP_OK) hp_err_prefix(err, "cpu: %s", name);
        return st;
    }
    if (gs != 1)
        return hp_errf(err, HP_UNSUPPORTED,
                       "cpu: %s with group_size %lld needs a communicator, and this backend has "
                       "none (only group_size 1 runs, as a copy)",
                       name, (long long)gs);
    /* One rank: gather, scatter, reduce (sum, avg, max of one), all-to-all and local_chunk (the
     * one chunk) are the identity. */
    hp_status st = hp__cpu_same_shape(c, 0, 0, 1, err);
    if (st == HP_OK) st = hp__cpu_dtype(c, 1, 0, HP__M(c->in_type[0].dtype), err);
    if (st != HP_OK) {
        hp_err_prefix(err, "cpu: %s", name);
        return st;
    }
    size_t bytes = (size_t)hp_type_numel(&c->out_type[0]) * hp_dtype_size(c->out_type[0].dtype);
    hp__cpu_copy(as_cpu(b), c->out[0], c->in[0], bytes);
    return HP_OK;
}

/* ---- bf16 storage ----------------------------------------------------------------------------
 * The kernels compute in f32. A call with bf16 operands runs staged: each bf16 input is
 * widened into f32 staging (exact), the f32 kernel runs on a copy of the call (and node) whose
 * bf16 types read f32, and each bf16 output is rounded to nearest even from its f32 staging on
 * store. So every op has a bf16 form that computes and accumulates in f32 and rounds once per
 * stored element, as the reference evaluator does (hp/eval.h). Ops that only move elements
 * (views, permutes, slices, cat, _to_copy) take bf16 natively and are not staged. */

static bool moves_bf16(hp_op op) {
    switch (op) {
    case HP_OP_VIEW:
    case HP_OP_RESHAPE:
    case HP_OP_PERMUTE:
    case HP_OP_TRANSPOSE:
    case HP_OP_T:
    case HP_OP_EXPAND:
    case HP_OP_SLICE:
    case HP_OP_SLICE_BACKWARD:
    case HP_OP_CAT:
    case HP_OP_UNSQUEEZE:
    case HP_OP_SQUEEZE:
    case HP_OP_CLONE:
    case HP_OP_DETACH:
    case HP_OP_WAIT_TENSOR:
    case HP_OP_TO_COPY:
        return true;
    default:
        return false;
    }
}

static hp_status launch_staged(hp__cpu *cpu, hp__cpu_kernel k, const hp_kernel_call *c,
                               hp_err *err) {
    enum { SMALL = 16 };
    const void *in_s[SMALL];
    void *out_s[HP_MAX_OUTS];
    hp_type in_t[SMALL], out_t[HP_MAX_OUTS];
    hp_stage_view v = {.in = in_s, .in_type = in_t, .out = out_s, .out_type = out_t};
    if (c->n_in > SMALL) {
        v.in = hp_malloc((size_t)c->n_in * sizeof *v.in);
        v.in_type = hp_malloc((size_t)c->n_in * sizeof *v.in_type);
        if (!v.in || !v.in_type) {
            hp_free(v.in);
            hp_free(v.in_type);
            return hp_errf(err, HP_NOMEM, "out of memory staging %d bf16 inputs", c->n_in);
        }
    }
    size_t need = hp_stage_bytes(c, ALIGN);
    hp_status st = HP_OK;
    if (need > cpu->stage_cap) {
        void *p = aligned_calloc(need);
        if (!p) {
            st = hp_errf(err, HP_NOMEM, "out of memory for %zu bytes of bf16 staging", need);
            goto done;
        }
        aligned_free(cpu->stage);
        cpu->stage = p;
        cpu->stage_cap = need;
    }
    hp_stage_view_make(c, cpu->stage, ALIGN, &v);
    for (int i = 0; i < c->n_in; i++)
        if (c->in_type[i].dtype == HP_BF16)
            hp__cpu_cast(cpu, (void *)v.in[i], HP_F32, c->in[i], HP_BF16,
                         hp_type_numel(&c->in_type[i]));
    st = k(cpu, &v.call, err);
    for (int i = 0; st == HP_OK && i < c->n_out; i++)
        if (c->out_type[i].dtype == HP_BF16)
            hp__cpu_cast(cpu, c->out[i], HP_BF16, v.out[i], HP_F32, hp_type_numel(&out_t[i]));
done:
    if (v.in != in_s) {
        hp_free(v.in);
        hp_free(v.in_type);
    }
    return st;
}

static hp_status cpu_launch(hp_backend *b, int stream, const hp_kernel_call *c, hp_err *err) {
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cpu: stream %d does not exist", stream);
    HP_TRY(check_call(c, err));
    hp_op op = c->node->op;
    if (is_collective(op)) return cpu_collective(b, stream, c, err);
    const char *name = hp_op_get(op)->name;
    hp__cpu_kernel k = kernels[op];
    if (!k)
        return hp_errf(err, HP_UNSUPPORTED,
                       "cpu: %s has no kernel (placeholders are fed by the executor)", name);
    bool staged = false;
    for (int i = 0; !moves_bf16(op) && i < c->n_in; i++) staged |= c->in_type[i].dtype == HP_BF16;
    for (int i = 0; !moves_bf16(op) && i < c->n_out; i++) staged |= c->out_type[i].dtype == HP_BF16;
    hp_status st = staged ? launch_staged(as_cpu(b), k, c, err) : k(as_cpu(b), c, err);
    if (st != HP_OK) hp_err_prefix(err, "cpu: %s", name);
    return st;
}

/* Compute work finishes inside launch; collectives run on the comm thread. An event recorded
 * on the comm stream remembers how many collectives had been issued; waiting on it blocks
 * until that many have completed. Events recorded on the compute stream are already done. */
struct hp_event {
    uint64_t seq;
};

static hp_status cpu_event_new(hp_backend *b, hp_event **out, hp_err *err) {
    (void)b;
    if (!out) return hp_errf(err, HP_INVALID, "cpu: event_new: out is NULL");
    *out = hp_calloc(1, sizeof **out);
    if (!*out) return hp_errf(err, HP_NOMEM, "cpu: out of memory for an event");
    return HP_OK;
}

static void cpu_event_free(hp_backend *b, hp_event *e) {
    (void)b;
    hp_free(e);
}

static hp_status check_event(hp_event *e, int stream, hp_err *err) {
    if (!e) return hp_errf(err, HP_INVALID, "cpu: NULL event");
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cpu: stream %d does not exist", stream);
    return HP_OK;
}

static hp_status cpu_event_record(hp_backend *b, hp_event *e, int stream, hp_err *err) {
    HP_TRY(check_event(e, stream, err));
    hp__cpu *cpu = as_cpu(b);
    e->seq = stream == HP_STREAM_COMM && cpu->comm ? hp__cpu_comm_issued(cpu->comm) : 0;
    return HP_OK;
}

static hp_status cpu_event_wait(hp_backend *b, hp_event *e, int stream, hp_err *err) {
    HP_TRY(check_event(e, stream, err));
    hp__cpu *cpu = as_cpu(b);
    /* the comm stream waiting on compute: compute is already done */
    if (stream == HP_STREAM_COMM || !cpu->comm || !e->seq) return HP_OK;
    return hp__cpu_comm_wait(cpu->comm, e->seq, err);
}

static hp_status cpu_synchronize(hp_backend *b, hp_err *err) {
    hp__cpu *cpu = as_cpu(b);
    if (!cpu->comm) return HP_OK;
    return hp__cpu_comm_wait(cpu->comm, hp__cpu_comm_issued(cpu->comm), err);
}

static double cpu_comm_busy(hp_backend *b) {
    hp__cpu *cpu = as_cpu(b);
    return cpu->comm ? hp__cpu_comm_busy(cpu->comm) : 0;
}

static void cpu_set_comm_trace(hp_backend *b, hp_comm_trace_fn fn, void *ctx) {
    hp__cpu *cpu = as_cpu(b);
    if (cpu->comm) hp__cpu_comm_set_trace(cpu->comm, fn, ctx);
}

/* ---- the training loop's math: hp/optim.h and hp/param_init.h on the pool ------------------ */

static hp_status cpu_adamw(hp_backend *b, const hp_adamw_config *cfg, double lr, float grad_scale,
                           int64_t step, const hp_adamw_param *params, int n_params, hp_err *err) {
    return hp_adamw_step_scaled(cfg, lr, grad_scale, step, params, n_params, as_cpu(b)->pool, err);
}

static hp_status cpu_sum_squares(hp_backend *b, const hp_fspan *x, int n, double *sumsq,
                                 hp_err *err) {
    return hp_grad_sumsq(x, n, as_cpu(b)->pool, sumsq, err);
}

static hp_status cpu_scale(hp_backend *b, const hp_fspan *x, int n, float coef, hp_err *err) {
    return hp_grad_scale(x, n, coef, as_cpu(b)->pool, err);
}

static hp_status cpu_accumulate(hp_backend *b, const hp_fspan *dst, const hp_fspan *src, int n,
                                bool first, hp_err *err) {
    return hp_grad_accumulate(dst, src, n, first, as_cpu(b)->pool, err);
}

static hp_status cpu_fill_init(hp_backend *b, float *dst, const hp_init *spec, uint64_t seed,
                               const char *fqn, int64_t first, int64_t count, hp_err *err) {
    return hp_param_init_fill_par(as_cpu(b)->pool, spec, seed, fqn, first, count, dst, err);
}

static hp_status cpu_memory_peak(hp_backend *b, uint64_t *bytes, hp_err *err) {
    (void)b;
    if (!bytes) return hp_errf(err, HP_INVALID, "cpu: memory_peak: bytes is NULL");
    uint64_t total;
    return hp_cpu_memory(bytes, &total, err);
}

hp_status hp_cpu_backend_set_comm(hp_backend *b, hp_comm *comm, hp_err *err) {
    hp__cpu *cpu = as_cpu(b);
    if (cpu->comm) return hp_errf(err, HP_INVALID, "cpu: the backend already has a communicator");
    return hp__cpu_comm_start(comm, &cpu->comm, err);
}

hp_status hp_cpu_backend_set_groups(hp_backend *b, const hp_comm_group *groups, int n,
                                    hp_err *err) {
    hp__cpu *cpu = as_cpu(b);
    if (!cpu->comm) return hp_errf(err, HP_INVALID, "cpu: mesh groups need a communicator first");
    return hp__cpu_comm_set_groups(cpu->comm, groups, n, err);
}

static void cpu_destroy(hp_backend *b) {
    hp__cpu *cpu = as_cpu(b);
    hp__cpu_comm_stop(cpu->comm);
    hp__cpu_rope_fini(cpu);
    aligned_free(cpu->scratch);
    aligned_free(cpu->stage);
    hp_pool_free(cpu->pool);
    hp_free(cpu);
}

static const hp_backend_vtable cpu_vtable = {
    .name = "cpu",
    .info = cpu_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .launch = cpu_launch,
    .collective = cpu_collective,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .accumulate = cpu_accumulate,
    .fill_init = cpu_fill_init,
    .memory_peak = cpu_memory_peak,
    .comm_busy = cpu_comm_busy,
    .set_comm_trace = cpu_set_comm_trace,
};

hp_status hp_cpu_backend_new(int threads, hp_backend **out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "cpu backend: out is NULL");
    *out = NULL;
    if (threads <= 0) threads = hp_default_threads();
    if (threads > HP_POOL_MAX_THREADS)
        return hp_errf(err, HP_INVALID, "cpu backend: %d threads is more than %d", threads,
                       HP_POOL_MAX_THREADS);
    hp__cpu *cpu = hp_calloc(1, sizeof *cpu);
    if (!cpu) return hp_errf(err, HP_NOMEM, "cpu backend: out of memory");
    cpu->base.vt = &cpu_vtable;
    cpu->threads = threads;
    hp_status st = hp_pool_new(threads, &cpu->pool, err);
    if (st != HP_OK) {
        hp_free(cpu);
        return st;
    }
    hp__cpu_blas_single_threaded();
    *out = &cpu->base;
    return HP_OK;
}
