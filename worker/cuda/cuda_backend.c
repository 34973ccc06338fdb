/* worker/cuda/cuda_backend.c — the cuda backend's vtable (cuda_backend.h): device facts, device
 * memory, the op table and the launch that checks a call and dispatches through it, streams and
 * events, synchronize with the device fault word, the training loop's math on k_optim.cu's
 * kernels, and the helpers the entry files share (dtype and shape checks, scratch, errors).
 *
 * Not here: the entries (cuda_ops*.c, cuda_gemm.c), the kernels (k_*.cu), NCCL (cuda_nccl.c).
 */
#include "worker/cuda/cuda_internal.h"

#include "hp/optim.h"
#include "hp/param_init.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the op table --------------------------------------------------------------------------- */

static const hp__cuda_entry entries[HP_OP_COUNT] = {
    [HP_OP_FULL] = hp__cuda_creation,
    [HP_OP_ZEROS] = hp__cuda_creation,
    [HP_OP_ONES] = hp__cuda_creation,
    [HP_OP_ADD] = hp__cuda_binary,
    [HP_OP_SUB] = hp__cuda_binary,
    [HP_OP_MUL] = hp__cuda_binary,
    [HP_OP_DIV] = hp__cuda_binary,
    [HP_OP_MAXIMUM] = hp__cuda_binary,
    [HP_OP_EQ] = hp__cuda_binary,
    [HP_OP_LT] = hp__cuda_binary,
    [HP_OP_WHERE] = hp__cuda_where,
    [HP_OP_ADD_SCALAR] = hp__cuda_unary,
    [HP_OP_MUL_SCALAR] = hp__cuda_unary,
    [HP_OP_POW] = hp__cuda_unary,
    [HP_OP_NEG] = hp__cuda_unary,
    [HP_OP_EXP] = hp__cuda_unary,
    [HP_OP_LOG] = hp__cuda_unary,
    [HP_OP_SQRT] = hp__cuda_unary,
    [HP_OP_RSQRT] = hp__cuda_unary,
    [HP_OP_TANH] = hp__cuda_unary,
    [HP_OP_SIN] = hp__cuda_unary,
    [HP_OP_COS] = hp__cuda_unary,
    [HP_OP_ERF] = hp__cuda_unary,
    [HP_OP_SIGMOID] = hp__cuda_unary,
    [HP_OP_SILU] = hp__cuda_unary,
    [HP_OP_GELU] = hp__cuda_unary,
    [HP_OP_RELU] = hp__cuda_unary,
    [HP_OP_TO_COPY] = hp__cuda_to_copy,
    [HP_OP_TANH_BACKWARD] = hp__cuda_backward_pair,
    [HP_OP_SIGMOID_BACKWARD] = hp__cuda_backward_pair,
    [HP_OP_SILU_BACKWARD] = hp__cuda_backward_pair,
    [HP_OP_GELU_BACKWARD] = hp__cuda_backward_pair,
    [HP_OP_THRESHOLD_BACKWARD] = hp__cuda_backward_pair,
    [HP_OP_SUM] = hp__cuda_reduce,
    [HP_OP_MEAN] = hp__cuda_reduce,
    [HP_OP_AMAX] = hp__cuda_reduce,
    [HP_OP_VIEW] = hp__cuda_copy_op,
    [HP_OP_RESHAPE] = hp__cuda_copy_op,
    [HP_OP_PERMUTE] = hp__cuda_permute,
    [HP_OP_TRANSPOSE] = hp__cuda_permute,
    [HP_OP_T] = hp__cuda_permute,
    [HP_OP_EXPAND] = hp__cuda_expand,
    [HP_OP_SLICE] = hp__cuda_slice,
    [HP_OP_SLICE_BACKWARD] = hp__cuda_slice_backward,
    [HP_OP_CAT] = hp__cuda_cat,
    [HP_OP_UNSQUEEZE] = hp__cuda_copy_op,
    [HP_OP_SQUEEZE] = hp__cuda_copy_op,
    [HP_OP_CLONE] = hp__cuda_copy_op,
    [HP_OP_DETACH] = hp__cuda_copy_op,
    [HP_OP_MM] = hp__cuda_mm,
    [HP_OP_BMM] = hp__cuda_mm,
    [HP_OP_ADDMM] = hp__cuda_mm,
    [HP_OP_EMBEDDING] = hp__cuda_embedding,
    [HP_OP_EMBEDDING_DENSE_BACKWARD] = hp__cuda_embedding_backward,
    [HP_OP_CHUNKED_EMBEDDING] = hp__cuda_chunked_embedding,
    [HP_OP_CHUNKED_EMBEDDING_BACKWARD] = hp__cuda_chunked_embedding_backward,
    [HP_OP_LOG_SOFTMAX] = hp__cuda_softmax,
    [HP_OP_LOG_SOFTMAX_BACKWARD] = hp__cuda_softmax_backward,
    [HP_OP_SOFTMAX] = hp__cuda_softmax,
    [HP_OP_SOFTMAX_BACKWARD] = hp__cuda_softmax_backward,
    [HP_OP_NLL_LOSS_FORWARD] = hp__cuda_nll_loss,
    [HP_OP_NLL_LOSS_BACKWARD] = hp__cuda_nll_loss_backward,
    [HP_OP_FUSED_CROSS_ENTROPY] = hp__cuda_cross_entropy,
    [HP_OP_FUSED_CROSS_ENTROPY_BACKWARD] = hp__cuda_cross_entropy_backward,
    [HP_OP_SWIGLU] = hp__cuda_swiglu,
    [HP_OP_SWIGLU_BACKWARD] = hp__cuda_swiglu_backward,
    [HP_OP_RMS_NORM] = hp__cuda_rms_norm,
    [HP_OP_RMS_NORM_BACKWARD] = hp__cuda_rms_norm_backward,
    [HP_OP_ROTARY_EMB] = hp__cuda_rotary,
    [HP_OP_SDPA] = hp__cuda_sdpa,
    [HP_OP_SDPA_BACKWARD] = hp__cuda_sdpa_backward,
    [HP_OP_WAIT_TENSOR] = hp__cuda_copy_op,
    [HP_OP_LAYER_NORM] = hp__cuda_layer_norm,
    [HP_OP_LAYER_NORM_BACKWARD] = hp__cuda_layer_norm_backward,
    [HP_OP_TRIL] = hp__cuda_tril,
    [HP_OP_BITWISE_NOT] = hp__cuda_bitwise_not,
    [HP_OP_ARANGE] = hp__cuda_arange,
    [HP_OP_NATIVE_DROPOUT] = hp__cuda_dropout,
    [HP_OP_NATIVE_DROPOUT_BACKWARD] = hp__cuda_dropout_backward,
};

/* ---- errors --------------------------------------------------------------------------------- */

hp_status hp__cuda_fail(hp_err *err, int code, const char *what) {
    cudaError_t e = (cudaError_t)code;
    hp_status st = e == cudaErrorMemoryAllocation ? HP_NOMEM : HP_INTERNAL;
    return hp_errf(err, st, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* ---- shared helpers ------------------------------------------------------------------------- */

int hp__cuda_dt(hp_dtype dt) {
    switch (dt) {
    case HP_F32:
        return HP__CU_F32;
    case HP_BF16:
        return HP__CU_BF16;
    case HP_F16:
        return HP__CU_F16;
    case HP_I32:
        return HP__CU_I32;
    case HP_I64:
        return HP__CU_I64;
    case HP_BOOL:
        return HP__CU_BOOL;
    default:
        return -1;
    }
}

hp_status hp__cuda_dtype(const hp_kernel_call *c, int out, int k, unsigned allowed, hp_err *err) {
    hp_dtype dt = out ? c->out_type[k].dtype : c->in_type[k].dtype;
    if ((unsigned)dt < HP_DTYPE_COUNT && (allowed & HP__CM(dt))) return HP_OK;
    const char *what = out ? "output" : "input";
    if ((unsigned)dt >= HP_DTYPE_COUNT)
        return hp_errf(err, HP_INVALID, "%s %d has no valid dtype (%d)", what, k, (int)dt);
    return hp_errf(err, HP_UNSUPPORTED,
                   "dtype %s of %s %d is not supported by the cuda backend for this op",
                   hp_dtype_name(dt), what, k);
}

hp_status hp__cuda_dtypes_all(const hp_kernel_call *c, unsigned allowed, hp_err *err) {
    for (int k = 0; k < c->n_in; k++) HP_TRY(hp__cuda_dtype(c, 0, k, allowed, err));
    for (int k = 0; k < c->n_out; k++) HP_TRY(hp__cuda_dtype(c, 1, k, allowed, err));
    return HP_OK;
}

hp_status hp__cuda_out_numel(const hp_kernel_call *c, int k, int64_t n, hp_err *err) {
    int64_t have = hp_type_numel(&c->out_type[k]);
    if (have != n) {
        char buf[128];
        return hp_errf(err, HP_INVALID, "output %d %s has %lld elements, expected %lld", k,
                       hp_type_str(&c->out_type[k], buf, sizeof buf), (long long)have,
                       (long long)n);
    }
    return HP_OK;
}

hp_status hp__cuda_same_shape(const hp_kernel_call *c, int a, int b, int b_out, hp_err *err) {
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

hp_status hp__cuda_check_bcast(const hp_type *in, const hp_type *out, const char *what,
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

hp_status hp__cuda_attr_dim(const hp_node *n, hp_attr_key k, int rank, int *out, hp_err *err) {
    int64_t d = hp_node_int(n, k, 0);
    if (d < -rank || d >= (rank > 0 ? rank : 1))
        return hp_errf(err, HP_INVALID, "%s %lld is out of range for rank %d", hp_attr_key_name(k),
                       (long long)d, rank);
    *out = (int)(d < 0 ? d + rank : d);
    return HP_OK;
}

void hp__cuda_strides(const hp_type *t, int64_t st[HP_MAX_RANK]) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->shape[d];
    }
}

void hp__cuda_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]) {
    int64_t ist[HP_MAX_RANK];
    hp__cuda_strides(in, ist);
    int off = out->rank - in->rank;
    for (int d = 0; d < out->rank; d++) {
        int di = d - off;
        st[d] = di < 0 || in->shape[di] == 1 ? 0 : ist[di];
    }
}

hp_status hp__cuda_copy(cudaStream_t s, void *dst, const void *src, size_t bytes, hp_err *err) {
    if (bytes == 0 || dst == src) return HP_OK;
    HP__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    return HP_OK;
}

static void note_alloc(hp__cuda *cu, size_t bytes) {
    cu->live_bytes += bytes;
    if (cu->live_bytes > cu->peak_bytes) cu->peak_bytes = cu->live_bytes;
}

void *hp__cuda_scratch(hp__cuda *cu, int stream, size_t bytes, hp_err *err) {
    if (bytes <= cu->scratch_cap[stream] && cu->scratch[stream]) return cu->scratch[stream];
    size_t cap = cu->scratch_cap[stream] * 2 > bytes ? cu->scratch_cap[stream] * 2 : bytes;
    if (cu->scratch[stream]) {
        /* cudaFree waits for the device, so in-flight kernels finish with the old block */
        cudaFree(cu->scratch[stream]);
        cu->live_bytes -= cu->scratch_cap[stream];
        cu->scratch[stream] = NULL;
        cu->scratch_cap[stream] = 0;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, cap);
    if (e != cudaSuccess) {
        hp__cuda_fail(err, (int)e, "cudaMalloc of kernel scratch");
        return NULL;
    }
    cu->scratch[stream] = p;
    cu->scratch_cap[stream] = cap;
    note_alloc(cu, cap);
    return p;
}

/* ---- device facts --------------------------------------------------------------------------- */

static hp__cuda *as_cuda(hp_backend *b) {
    return (hp__cuda *)b;
}

/* Dense bf16 peaks (no sparsity) by device name; 0 when the device is not in the table. */
static double table_peak(const char *name) {
    if (strstr(name, "H200")) return 989e12;
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 756e12;
    if (strstr(name, "H100")) return 989e12; /* SXM, HBM3 */
    if (strstr(name, "B200")) return 2.25e15;
    if (strstr(name, "A100")) return 312e12;
    return 0;
}

static hp_status cuda_info(hp_backend *b, hp_device_info *out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "cuda: info: out is NULL");
    hp__cuda *cu = as_cuda(b);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%.127s", cu->prop.name);
    out->memory_bytes = (int64_t)cu->prop.totalGlobalMem;
    if (!cu->peak_done) {
        /* a device not in the table: a measured cuBLASLt bf16 peak, never another's number */
        cu->peak_flops = table_peak(cu->prop.name);
        if (cu->peak_flops == 0 && hp__cuda_gemm_probe(cu, &cu->peak_flops, NULL) != HP_OK)
            cu->peak_flops = 0;
        cu->peak_done = true;
    }
    out->peak_flops = cu->peak_flops;
    out->host_visible = false;
    out->threads = 1;
    return HP_OK;
}

/* ---- memory --------------------------------------------------------------------------------- */

static hp_status cuda_alloc(hp_backend *b, size_t bytes, void **out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "cuda: alloc: out is NULL");
    hp__cuda *cu = as_cuda(b);
    *out = NULL;
    if (bytes == 0) bytes = 64; /* a valid, distinct pointer for an empty arena */
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cuda: cudaMalloc of %zu bytes", bytes);
        return hp__cuda_fail(err, (int)e, what);
    }
    e = cudaMemsetAsync(p, 0, bytes, cu->stream[HP_STREAM_COMPUTE]);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream[HP_STREAM_COMPUTE]);
    if (e != cudaSuccess) {
        cudaFree(p);
        return hp__cuda_fail(err, (int)e, "cuda: zeroing a new allocation");
    }
    if (cu->n_allocs == cu->cap_allocs) {
        int cap = cu->cap_allocs ? 2 * cu->cap_allocs : 16;
        void *na = hp_realloc(cu->allocs, (size_t)cap * sizeof *cu->allocs);
        if (!na) {
            cudaFree(p);
            return hp_errf(err, HP_NOMEM, "cuda: out of host memory tracking allocations");
        }
        cu->allocs = na;
        cu->cap_allocs = cap;
    }
    cu->allocs[cu->n_allocs++] = (hp__cuda_alloc){p, bytes};
    note_alloc(cu, bytes);
    *out = p;
    return HP_OK;
}

static void cuda_free(hp_backend *b, void *p) {
    if (!p) return;
    hp__cuda *cu = as_cuda(b);
    for (int i = 0; i < cu->n_allocs; i++)
        if (cu->allocs[i].p == p) {
            cu->live_bytes -= cu->allocs[i].bytes;
            cu->allocs[i] = cu->allocs[--cu->n_allocs];
            break;
        }
    cudaFree(p); /* waits for the device: no kernel still reads it */
}

/* Reports (and clears) the device fault word: HP_INVALID naming what a kernel found. */
static hp_status check_fault(hp__cuda *cu, hp_err *err) {
    hp__cu_fault f;
    HP__CUDA_TRY(cudaMemcpy(&f, cu->fault, sizeof f, cudaMemcpyDeviceToHost),
                 "cuda: reading the fault word");
    if (f.code == HP__CU_FAULT_NONE) return HP_OK;
    HP__CUDA_TRY(cudaMemset(cu->fault, 0, sizeof f), "cuda: clearing the fault word");
    switch (f.code) {
    case HP__CU_FAULT_EMBEDDING_INDEX:
        return hp_errf(err, HP_INVALID,
                       "cuda: embedding: index %lld at position %lld out of "
                       "range [0, %lld)",
                       f.value, f.position, f.limit);
    case HP__CU_FAULT_NLL_TARGET:
        return hp_errf(err, HP_INVALID,
                       "cuda: nll_loss: target %lld at position %lld out of range [0, %lld)",
                       f.value, f.position, f.limit);
    case HP__CU_FAULT_INJECTED:
        return hp_errf(err, HP_INTERNAL, "cuda: injected kernel fault (value %lld)", f.value);
    default:
        return hp_errf(err, HP_INTERNAL, "cuda: unknown device fault %lld", f.code);
    }
}

static hp_status sync_all(hp__cuda *cu, hp_err *err) {
    if (cu->nccl) HP_TRY(hp__cuda_nccl_sync(cu, err));
    for (int s = 0; s < HP_STREAM_COUNT; s++)
        HP__CUDA_TRY(cudaStreamSynchronize(cu->stream[s]), "cuda: synchronize");
    hp__cuda_prof_collect(cu);
    return check_fault(cu, err);
}

static hp_status cuda_copy_in(hp_backend *b, void *dst, const void *src, size_t bytes,
                              hp_err *err) {
    if (bytes == 0) return HP_OK;
    if (!dst || !src)
        return hp_errf(err, HP_INVALID, "cuda: copy_in of %zu bytes with NULL", bytes);
    hp__cuda *cu = as_cuda(b);
    cudaStream_t s = cu->stream[HP_STREAM_COMPUTE];
    /* on the compute stream (ordered after the kernels that may still read dst), then wait:
     * the host buffer is the caller's again on return */
    HP__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cuda: copy_in");
    HP__CUDA_TRY(cudaStreamSynchronize(s), "cuda: copy_in");
    return HP_OK;
}

static hp_status cuda_copy_out(hp_backend *b, void *dst, const void *src, size_t bytes,
                               hp_err *err) {
    if (bytes == 0) return HP_OK;
    if (!dst || !src)
        return hp_errf(err, HP_INVALID, "cuda: copy_out of %zu bytes with NULL", bytes);
    hp__cuda *cu = as_cuda(b);
    cudaStream_t s = cu->stream[HP_STREAM_COMPUTE];
    HP__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cuda: copy_out");
    HP__CUDA_TRY(cudaStreamSynchronize(s), "cuda: copy_out");
    return check_fault(cu, err);
}

/* ---- launch --------------------------------------------------------------------------------- */

/* Structural checks shared by launch and collective: the call agrees with its node. */
static hp_status check_call(const hp_kernel_call *c, hp_err *err) {
    if (!c || !c->node) return hp_errf(err, HP_INVALID, "cuda: launch without a node");
    const hp_node *n = c->node;
    if ((unsigned)n->op >= HP_OP_COUNT)
        return hp_errf(err, HP_INVALID, "cuda: launch of unknown op %d", (int)n->op);
    const hp_op_info *info = hp_op_get(n->op);
    if (c->n_in != n->n_in || c->n_out != n->n_out || c->n_out != info->n_out ||
        (info->n_in != HP_VARIADIC && c->n_in != info->n_in))
        return hp_errf(err, HP_INVALID,
                       "cuda: %s: call has %d inputs / %d outputs, the node %d / %d", info->name,
                       c->n_in, c->n_out, n->n_in, n->n_out);
    if ((c->n_in && (!c->in || !c->in_type)) || (c->n_out && (!c->out || !c->out_type)))
        return hp_errf(err, HP_INVALID, "cuda: %s: call without buffers", info->name);
    if (c->flags & ~hp_call_flags_allowed(n->op))
        return hp_errf(err, HP_INVALID, "cuda: %s: call flags 0x%x are not valid for this op",
                       info->name, c->flags);
    for (int k = 0; k < c->n_out; k++) {
        if (!hp_type_eq(&c->out_type[k], &n->out[k])) {
            char x[128], y[128];
            return hp_errf(err, HP_INVALID, "cuda: %s: output %d is %s but the node declares %s",
                           info->name, k, hp_type_str(&c->out_type[k], x, sizeof x),
                           hp_type_str(&n->out[k], y, sizeof y));
        }
        if (!c->out[k] && hp_type_numel(&c->out_type[k]) > 0)
            return hp_errf(err, HP_INVALID, "cuda: %s: output %d is NULL", info->name, k);
    }
    for (int k = 0; k < c->n_in; k++) {
        if (c->in_type[k].rank < 0 || c->in_type[k].rank > HP_MAX_RANK)
            return hp_errf(err, HP_INVALID, "cuda: %s: input %d has rank %d", info->name, k,
                           c->in_type[k].rank);
        if (!c->in[k] && hp_type_numel(&c->in_type[k]) > 0)
            return hp_errf(err, HP_INVALID, "cuda: %s: input %d is NULL", info->name, k);
    }
    return HP_OK;
}

static bool is_collective(hp_op op) {
    return hp_op_get(op)->flags & HP_OPF_COLLECTIVE;
}

/* A call's operand bytes for the profile (nothing to count when it is off). */
static double call_bytes(const hp__cuda *cu, const hp_kernel_call *c) {
    return cu->prof ? hp__cuda_call_bytes(c) : 0;
}

static hp_status cuda_collective(hp_backend *b, int stream, const hp_kernel_call *c, hp_err *err) {
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cuda: stream %d does not exist", stream);
    HP_TRY(check_call(c, err));
    const char *name = hp_op_get(c->node->op)->name;
    if (!is_collective(c->node->op))
        return hp_errf(err, HP_INVALID, "cuda: %s is not a collective", name);
    hp__cuda *cu = as_cuda(b);
    int64_t gs = hp_node_int(c->node, HP_ATTR_GROUP_SIZE, 1);
    if (gs > 1) {
        if (!cu->nccl)
            return hp_errf(err, HP_UNSUPPORTED,
                           "cuda: %s with group_size %lld needs a communicator, and this backend "
                           "has none (only group_size 1 runs, as a copy)",
                           name, (long long)gs);
        int rec = hp__cuda_prof_begin(cu, stream);
        hp_status st = hp__cuda_nccl_collective(cu, c, err);
        if (st == HP_OK) hp__cuda_prof_end(cu, rec, stream, (int)c->node->op, call_bytes(cu, c));
        if (st != HP_OK) hp_err_prefix(err, "cuda: %s", name);
        return st;
    }
    if (gs != 1) return hp_errf(err, HP_INVALID, "cuda: %s: group_size %lld", name, (long long)gs);
    /* one rank: every collective is the identity */
    hp_status st = hp__cuda_same_shape(c, 0, 0, 1, err);
    if (st == HP_OK) st = hp__cuda_dtype(c, 1, 0, HP__CM(c->in_type[0].dtype), err);
    if (st == HP_OK) {
        size_t bytes = (size_t)hp_type_numel(&c->out_type[0]) * hp_dtype_size(c->out_type[0].dtype);
        st = hp__cuda_copy(cu->stream[stream], c->out[0], c->in[0], bytes, err);
    }
    if (st != HP_OK) hp_err_prefix(err, "cuda: %s", name);
    return st;
}

/* ---- bf16 operands of f32 kernels --------------------------------------------------------------
 * Elementwise ops, casts, data movement, tril, GEMMs and the embeddings take bf16 natively, and
 * so do RMSNorm, rotary and the tensor-core attention when their operands fit
 * (hp__cuda_native_bf16). The other kernels (softmax, nll_loss, layer_norm, dropout, arange,
 * reductions, attention of other shapes) compute in f32 and run
 * staged when an operand is bf16, as on the cpu backend: each bf16 input is widened into f32
 * staging (exact), the entry runs on a copy of the call whose bf16 types read f32, and each bf16
 * output is rounded to nearest even from its staging. So every op has a bf16 form that computes
 * and accumulates in f32 and rounds once per stored element, as the reference evaluator does. */

static bool staged_op(hp_op op) {
    switch (op) {
    case HP_OP_SUM:
    case HP_OP_MEAN:
    case HP_OP_AMAX:
    case HP_OP_LOG_SOFTMAX:
    case HP_OP_LOG_SOFTMAX_BACKWARD:
    case HP_OP_SOFTMAX:
    case HP_OP_SOFTMAX_BACKWARD:
    case HP_OP_NLL_LOSS_FORWARD:
    case HP_OP_NLL_LOSS_BACKWARD:
    case HP_OP_RMS_NORM:
    case HP_OP_RMS_NORM_BACKWARD:
    case HP_OP_ROTARY_EMB:
    case HP_OP_SDPA:
    case HP_OP_SDPA_BACKWARD:
    case HP_OP_LAYER_NORM:
    case HP_OP_LAYER_NORM_BACKWARD:
    case HP_OP_NATIVE_DROPOUT:
    case HP_OP_NATIVE_DROPOUT_BACKWARD:
    case HP_OP_ARANGE:
        return true;
    default:
        return false;
    }
}

#define STAGE_ALIGN 256

static hp_status launch_staged(hp__cuda *cu, int stream, hp__cuda_entry k, const hp_kernel_call *c,
                               hp_err *err) {
    enum { SMALL = 16 };
    if (c->n_in > SMALL)
        return hp_errf(err, HP_UNSUPPORTED, "%d inputs (bf16 staging takes at most %d)", c->n_in,
                       SMALL);
    size_t need = hp_stage_bytes(c, STAGE_ALIGN);
    cudaStream_t s = cu->stream[stream];
    if (need > cu->stage_cap[stream]) {
        if (cu->stage[stream]) { /* cudaFree waits for the kernels still using it */
            cudaFree(cu->stage[stream]);
            cu->live_bytes -= cu->stage_cap[stream];
            cu->stage[stream] = NULL;
            cu->stage_cap[stream] = 0;
        }
        size_t cap = need < ((size_t)1 << 20) ? (size_t)1 << 20 : need;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, cap);
        if (e != cudaSuccess) return hp__cuda_fail(err, (int)e, "cudaMalloc of bf16 staging");
        cu->stage[stream] = p;
        cu->stage_cap[stream] = cap;
        note_alloc(cu, cap);
    }
    const void *in[SMALL];
    void *out[HP_MAX_OUTS];
    hp_type in_t[SMALL], out_t[HP_MAX_OUTS];
    hp_stage_view v = {.in = in, .in_type = in_t, .out = out, .out_type = out_t};
    hp_stage_view_make(c, cu->stage[stream], STAGE_ALIGN, &v);
    int rec = hp__cuda_prof_begin(cu, stream);
    double cast_bytes = 0; /* 2 bytes read, 4 written an element, or the reverse */
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = hp_type_numel(&c->in_type[i]);
        if (c->in_type[i].dtype == HP_BF16 && n > 0)
            HP__CUDA_TRY(hp__cu_cast(s, HP__CU_F32, (void *)in[i], HP__CU_BF16, c->in[i], n),
                         "bf16 staging of an input");
        if (c->in_type[i].dtype == HP_BF16) cast_bytes += 6.0 * (double)n;
    }
    hp__cuda_prof_end(cu, rec, stream, HP__PROF_STAGE, cast_bytes);
    rec = hp__cuda_prof_begin(cu, stream);
    HP_TRY(k(cu, s, &v.call, err));
    hp__cuda_prof_end(cu, rec, stream, (int)c->node->op, call_bytes(cu, &v.call));
    rec = hp__cuda_prof_begin(cu, stream);
    cast_bytes = 0;
    for (int i = 0; i < c->n_out; i++) {
        int64_t n = hp_type_numel(&out_t[i]);
        if (c->out_type[i].dtype == HP_BF16 && n > 0)
            HP__CUDA_TRY(hp__cu_cast(s, HP__CU_BF16, c->out[i], HP__CU_F32, out[i], n),
                         "bf16 rounding of an output");
        if (c->out_type[i].dtype == HP_BF16) cast_bytes += 6.0 * (double)n;
    }
    hp__cuda_prof_end(cu, rec, stream, HP__PROF_STAGE, cast_bytes);
    return HP_OK;
}

static hp_status cuda_launch(hp_backend *b, int stream, const hp_kernel_call *c, hp_err *err) {
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cuda: stream %d does not exist", stream);
    HP_TRY(check_call(c, err));
    hp_op op = c->node->op;
    if (is_collective(op)) return cuda_collective(b, stream, c, err);
    const char *name = hp_op_get(op)->name;
    hp__cuda_entry k = entries[op];
    if (!k) {
        const char *dt = c->n_out > 0 ? hp_dtype_name(c->out_type[0].dtype) : "-";
        return hp_errf(err, HP_UNSUPPORTED, "cuda: %s (%s) has no kernel in the cuda backend", name,
                       dt);
    }
    hp__cuda *cu = as_cuda(b);
    bool staged = false, native = hp__cuda_native_bf16(cu, c);
    for (int i = 0; !native && staged_op(op) && i < c->n_in; i++)
        staged |= c->in_type[i].dtype == HP_BF16;
    for (int i = 0; !native && staged_op(op) && i < c->n_out; i++)
        staged |= c->out_type[i].dtype == HP_BF16;
    hp_status st;
    if (staged) {
        st = launch_staged(cu, stream, k, c, err);
    } else {
        int rec = hp__cuda_prof_begin(cu, stream);
        st = k(cu, cu->stream[stream], c, err);
        if (st == HP_OK) hp__cuda_prof_end(cu, rec, stream, (int)op, call_bytes(cu, c));
    }
    if (st != HP_OK) hp_err_prefix(err, "cuda: %s", name);
    return st;
}

/* ---- events --------------------------------------------------------------------------------- */

struct hp_event {
    cudaEvent_t ev;
};

static hp_status cuda_event_new(hp_backend *b, hp_event **out, hp_err *err) {
    (void)b;
    if (!out) return hp_errf(err, HP_INVALID, "cuda: event_new: out is NULL");
    hp_event *e = hp_calloc(1, sizeof *e);
    if (!e) return hp_errf(err, HP_NOMEM, "cuda: out of memory for an event");
    cudaError_t ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        hp_free(e);
        return hp__cuda_fail(err, (int)ce, "cuda: cudaEventCreate");
    }
    *out = e;
    return HP_OK;
}

static void cuda_event_free(hp_backend *b, hp_event *e) {
    (void)b;
    if (!e) return;
    cudaEventDestroy(e->ev);
    hp_free(e);
}

static hp_status check_event(hp_event *e, int stream, hp_err *err) {
    if (!e) return hp_errf(err, HP_INVALID, "cuda: NULL event");
    if (stream < 0 || stream >= HP_STREAM_COUNT)
        return hp_errf(err, HP_INVALID, "cuda: stream %d does not exist", stream);
    return HP_OK;
}

static hp_status cuda_event_record(hp_backend *b, hp_event *e, int stream, hp_err *err) {
    HP_TRY(check_event(e, stream, err));
    HP__CUDA_TRY(cudaEventRecord(e->ev, as_cuda(b)->stream[stream]), "cuda: cudaEventRecord");
    return HP_OK;
}

static hp_status cuda_event_wait(hp_backend *b, hp_event *e, int stream, hp_err *err) {
    HP_TRY(check_event(e, stream, err));
    HP__CUDA_TRY(cudaStreamWaitEvent(as_cuda(b)->stream[stream], e->ev, 0),
                 "cuda: cudaStreamWaitEvent");
    return HP_OK;
}

static hp_status cuda_synchronize(hp_backend *b, hp_err *err) {
    return sync_all(as_cuda(b), err);
}

/* ---- the training loop's math --------------------------------------------------------------- */

static hp_status cuda_adamw(hp_backend *b, const hp_adamw_config *cfg, double lr, float grad_scale,
                            int64_t step, const hp_adamw_param *params, int n_params, hp_err *err) {
    /* the same checks and scalars as hp_adamw_step_scaled: run it on an empty list to check */
    HP_TRY(hp_adamw_step_scaled(cfg, lr, grad_scale, step, NULL, 0, NULL, err));
    if (n_params < 0 || (n_params > 0 && !params))
        return hp_errf(err, HP_INVALID, "adamw: bad tensor list (%d tensors)", n_params);
    for (int i = 0; i < n_params; i++) {
        const hp_adamw_param *q = &params[i];
        if (q->numel < 0)
            return hp_errf(err, HP_INVALID, "adamw: tensor %d has numel %lld", i,
                           (long long)q->numel);
        if (q->numel > 0 && (!q->param || !q->grad || !q->exp_avg || !q->exp_avg_sq))
            return hp_errf(err, HP_INVALID,
                           "adamw: tensor %d (numel %lld) has a NULL param, grad or state buffer",
                           i, (long long)q->numel);
    }
    double bc1 = 1 - pow(cfg->beta1, (double)step);
    double bc2 = 1 - pow(cfg->beta2, (double)step);
    hp__cu_adamw k = {
        .decay = (float)(1 - lr * cfg->weight_decay),
        .b1 = (float)cfg->beta1,
        .omb1 = (float)(1 - cfg->beta1),
        .b2 = (float)cfg->beta2,
        .omb2 = (float)(1 - cfg->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)cfg->eps,
        .neg_step = (float)(-(lr / bc1)),
        .g_scale = grad_scale,
    };
    hp__cuda *cu = as_cuda(b);
    int rec = hp__cuda_prof_begin(cu, HP_STREAM_COMPUTE);
    /* param, grad, both moments read; param and moments written: 28 B (30 with a bf16 copy) */
    double bytes = 0;
    for (int i = 0; i < n_params; i++) {
        const hp_adamw_param *q = &params[i];
        HP__CUDA_TRY(hp__cu_adamw_step(cu->stream[HP_STREAM_COMPUTE], &k, q->param, q->grad,
                                       q->exp_avg, q->exp_avg_sq, q->param_bf16, q->numel),
                     "cuda: adamw");
        bytes += (q->param_bf16 ? 30.0 : 28.0) * (double)q->numel;
    }
    hp__cuda_prof_end(cu, rec, HP_STREAM_COMPUTE, HP__PROF_ADAMW, bytes);
    return HP_OK;
}

static hp_status check_spans(const char *what, const hp_fspan *x, int n, hp_err *err) {
    if (n < 0 || (n > 0 && !x))
        return hp_errf(err, HP_INVALID, "%s: bad span list (%d spans)", what, n);
    for (int i = 0; i < n; i++) {
        if (x[i].n < 0)
            return hp_errf(err, HP_INVALID, "%s: span %d has length %lld", what, i,
                           (long long)x[i].n);
        if (x[i].n > 0 && !x[i].data)
            return hp_errf(err, HP_INVALID, "%s: span %d (length %lld) has NULL data", what, i,
                           (long long)x[i].n);
    }
    return HP_OK;
}

/* Bytes of the sumsq buffers for cap spans: the partials, then the span table. */
static size_t sumsq_bytes(int cap) {
    return (size_t)cap * (HP__CU_SUMSQ_BLOCKS * sizeof(double) + sizeof(hp__cu_span));
}

/* Room for the partials and the span table of n spans (grown, never shrunk). */
static hp_status sumsq_room(hp__cuda *cu, int n, hp_err *err) {
    if (n <= cu->sumsq_cap) return HP_OK;
    int cap = cu->sumsq_cap * 2 > n ? cu->sumsq_cap * 2 : n;
    size_t bytes = sumsq_bytes(cap);
    double *dev = NULL, *host = NULL;
    HP__CUDA_TRY(cudaMalloc((void **)&dev, bytes), "cuda: grad sumsq partials");
    if (cudaMallocHost((void **)&host, bytes) != cudaSuccess) {
        cudaFree(dev);
        return hp__cuda_fail(err, (int)cudaErrorMemoryAllocation, "cuda: grad sumsq partials");
    }
    cudaFree(cu->sumsq_dev); /* waits for the device */
    cudaFreeHost(cu->sumsq_host);
    cu->live_bytes -= sumsq_bytes(cu->sumsq_cap);
    note_alloc(cu, bytes);
    cu->sumsq_dev = dev;
    cu->sumsq_host = host;
    cu->sumsq_cap = cap;
    return HP_OK;
}

static hp_status cuda_sum_squares(hp_backend *b, const hp_fspan *x, int n, double *sumsq,
                                  hp_err *err) {
    if (!sumsq) return hp_errf(err, HP_INVALID, "grad sumsq: sumsq is NULL");
    HP_TRY(check_spans("grad sumsq", x, n, err));
    hp__cuda *cu = as_cuda(b);
    HP_TRY(sumsq_room(cu, n, err));
    cudaStream_t s = cu->stream[HP_STREAM_COMPUTE];
    int rec = hp__cuda_prof_begin(cu, HP_STREAM_COMPUTE);
    /* the non-empty spans' table in, every span's fixed partials in one launch, one copy out
     * and one wait; combined on the host in order (span by span, block by block): the norm
     * does not depend on timing */
    size_t table = (size_t)cu->sumsq_cap * HP__CU_SUMSQ_BLOCKS; /* the table's offset, doubles */
    hp__cu_span *spans = (hp__cu_span *)(cu->sumsq_host + table);
    int used = 0;
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        bytes += 4.0 * (double)x[i].n;
        if (x[i].n > 0) spans[used++] = (hp__cu_span){x[i].data, x[i].n};
    }
    size_t nd = (size_t)used * HP__CU_SUMSQ_BLOCKS;
    if (used > 0) {
        hp__cu_span *dev_spans = (hp__cu_span *)(cu->sumsq_dev + table);
        HP__CUDA_TRY(cudaMemcpyAsync(dev_spans, spans, (size_t)used * sizeof *spans,
                                     cudaMemcpyHostToDevice, s),
                     "cuda: grad sumsq");
        HP__CUDA_TRY(hp__cu_sumsq(s, cu->sumsq_dev, dev_spans, used), "cuda: grad sumsq");
        HP__CUDA_TRY(cudaMemcpyAsync(cu->sumsq_host, cu->sumsq_dev, nd * sizeof(double),
                                     cudaMemcpyDeviceToHost, s),
                     "cuda: grad sumsq");
    }
    hp__cuda_prof_end(cu, rec, HP_STREAM_COMPUTE, HP__PROF_SUMSQ, bytes);
    HP__CUDA_TRY(cudaStreamSynchronize(s), "cuda: grad sumsq");
    double total = 0;
    for (size_t k = 0; k < nd; k++) total += cu->sumsq_host[k];
    *sumsq = total;
    return HP_OK;
}

static hp_status cuda_scale(hp_backend *b, const hp_fspan *x, int n, float coef, hp_err *err) {
    HP_TRY(check_spans("grad scale", x, n, err));
    hp__cuda *cu = as_cuda(b);
    int rec = hp__cuda_prof_begin(cu, HP_STREAM_COMPUTE);
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        HP__CUDA_TRY(hp__cu_scale(cu->stream[HP_STREAM_COMPUTE], x[i].data, x[i].n, coef),
                     "cuda: grad scale");
        bytes += 8.0 * (double)x[i].n;
    }
    hp__cuda_prof_end(cu, rec, HP_STREAM_COMPUTE, HP__PROF_SCALE, bytes);
    return HP_OK;
}

static hp_status cuda_accumulate(hp_backend *b, const hp_fspan *dst, const hp_fspan *src, int n,
                                 bool first, hp_err *err) {
    HP_TRY(check_spans("grad accumulate", dst, n, err));
    HP_TRY(check_spans("grad accumulate", src, n, err));
    for (int i = 0; i < n; i++)
        if (dst[i].n != src[i].n)
            return hp_errf(err, HP_INVALID,
                           "grad accumulate: span %d has %lld elements, its source %lld", i,
                           (long long)dst[i].n, (long long)src[i].n);
    hp__cuda *cu = as_cuda(b);
    int rec = hp__cuda_prof_begin(cu, HP_STREAM_COMPUTE);
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        HP__CUDA_TRY(hp__cu_accumulate(cu->stream[HP_STREAM_COMPUTE], dst[i].data, src[i].data,
                                       dst[i].n, first),
                     "cuda: grad accumulate");
        bytes += (first ? 8.0 : 12.0) * (double)dst[i].n;
    }
    hp__cuda_prof_end(cu, rec, HP_STREAM_COMPUTE, HP__PROF_ACCUMULATE, bytes);
    return HP_OK;
}

/* Init values are computed on the host (hp_param_init_fill: the counter-based RNG, the same
 * bits as on every backend) in chunks and copied in. */
#define INIT_CHUNK ((int64_t)1 << 22)

static hp_status cuda_fill_init(hp_backend *b, float *dst, const hp_init *spec, uint64_t seed,
                                const char *fqn, int64_t first, int64_t count, hp_err *err) {
    if (count < 0)
        return hp_errf(err, HP_INVALID, "init %s: count %lld", fqn ? fqn : "?", (long long)count);
    if (count == 0) return HP_OK;
    if (!dst) return hp_errf(err, HP_INVALID, "init %s: NULL destination", fqn ? fqn : "?");
    hp__cuda *cu = as_cuda(b);
    int64_t chunk = count < INIT_CHUNK ? count : INIT_CHUNK;
    float *host = hp_malloc((size_t)chunk * sizeof *host);
    if (!host) return hp_errf(err, HP_NOMEM, "cuda: out of memory for an init chunk");
    hp_status st = HP_OK;
    for (int64_t off = 0; off < count && st == HP_OK; off += chunk) {
        int64_t n = count - off < chunk ? count - off : chunk;
        st = hp_param_init_fill_par(cu->pool, spec, seed, fqn, first + off, n, host, err);
        if (st == HP_OK) st = cuda_copy_in(b, dst + off, host, (size_t)n * sizeof *host, err);
    }
    hp_free(host);
    return st;
}

static hp_status cuda_memory_peak(hp_backend *b, uint64_t *bytes, hp_err *err) {
    if (!bytes) return hp_errf(err, HP_INVALID, "cuda: memory_peak: bytes is NULL");
    *bytes = as_cuda(b)->peak_bytes;
    return HP_OK;
}

static double cuda_comm_busy(hp_backend *b) {
    hp__cuda *cu = as_cuda(b);
    return cu->nccl ? hp__cuda_nccl_busy(cu) : 0;
}

/* The per-collective trace hook needs host times of stream-ordered work; the cuda backend
 * does not produce them yet, so traces of cuda runs carry no comm slices (comm_busy still
 * counts). */
static void cuda_set_comm_trace(hp_backend *b, hp_comm_trace_fn fn, void *ctx) {
    (void)b, (void)fn, (void)ctx;
}

hp_status hp_cuda_backend_inject_fault(hp_backend *b, long long value, hp_err *err) {
    hp__cuda *cu = as_cuda(b);
    HP__CUDA_TRY(
        hp__cu_inject_fault(cu->stream[HP_STREAM_COMPUTE], cu->fault, HP__CU_FAULT_INJECTED, value),
        "cuda: inject fault");
    return HP_OK;
}

static void cuda_destroy(hp_backend *b) {
    hp__cuda *cu = as_cuda(b);
    for (int s = 0; s < HP_STREAM_COUNT; s++)
        if (cu->stream[s]) cudaStreamSynchronize(cu->stream[s]);
    hp__cuda_prof_collect(cu);
    hp__cuda_prof_free(cu);
    hp__cuda_nccl_free(cu);
    hp__cuda_gemm_free(cu);
    if (cu->lt) cublasLtDestroy(cu->lt);
    cudaFree(cu->workspace);
    cudaFree(cu->fault);
    for (int s = 0; s < HP_STREAM_COUNT; s++) {
        cudaFree(cu->scratch[s]);
        cudaFree(cu->stage[s]);
    }
    hp_pool_free(cu->pool);
    cudaFree(cu->sumsq_dev);
    cudaFreeHost(cu->sumsq_host);
    hp_free(cu->allocs);
    for (int s = 0; s < HP_STREAM_COUNT; s++)
        if (cu->stream[s]) cudaStreamDestroy(cu->stream[s]);
    hp_free(cu);
}

static const hp_backend_vtable cuda_vtable = {
    .name = "cuda",
    .info = cuda_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_in = cuda_copy_in,
    .copy_out = cuda_copy_out,
    .launch = cuda_launch,
    .collective = cuda_collective,
    .event_new = cuda_event_new,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .adamw = cuda_adamw,
    .sum_squares = cuda_sum_squares,
    .scale = cuda_scale,
    .accumulate = cuda_accumulate,
    .fill_init = cuda_fill_init,
    .memory_peak = cuda_memory_peak,
    .comm_busy = cuda_comm_busy,
    .set_comm_trace = cuda_set_comm_trace,
};

/* ---- construction --------------------------------------------------------------------------- */

int hp_cuda_device_count(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && why_len) snprintf(why, why_len, "%s", cudaGetErrorString(e));
        cudaGetLastError(); /* not sticky: clear it */
        return 0;
    }
    if (n == 0 && why && why_len) snprintf(why, why_len, "cudaGetDeviceCount reports 0 devices");
    return n;
}

hp_status hp_cuda_backend_new(int device, hp_backend **out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "cuda backend: out is NULL");
    *out = NULL;
    char why[160] = "";
    int count = hp_cuda_device_count(why, sizeof why);
    if (count == 0) return hp_errf(err, HP_UNSUPPORTED, "device cuda: no CUDA device (%s)", why);
    if (device < 0 || device >= count)
        return hp_errf(err, HP_INVALID, "device cuda: device %d does not exist (%d visible)",
                       device, count);
    const char *tf = getenv("HP_CUDA_TF32");
    if (tf && *tf && strcmp(tf, "0") && strcmp(tf, "1"))
        return hp_errf(err, HP_INVALID, "device cuda: HP_CUDA_TF32 must be 0 or 1, not '%s'", tf);
    const char *gt = getenv("HP_CUDA_GEMM_TUNE");
    if (gt && *gt && strcmp(gt, "0") && strcmp(gt, "1"))
        return hp_errf(err, HP_INVALID, "device cuda: HP_CUDA_GEMM_TUNE must be 0 or 1, not '%s'",
                       gt);
    const char *pf = getenv("HP_CUDA_PROFILE");
    if (pf && *pf && strcmp(pf, "0") && strcmp(pf, "1"))
        return hp_errf(err, HP_INVALID, "device cuda: HP_CUDA_PROFILE must be 0 or 1, not '%s'",
                       pf);
    const char *fr = getenv("HP_CUDA_FLASH_ROWS"); /* read by k_flash.cu at each launch */
    if (fr && *fr && strcmp(fr, "16") && strcmp(fr, "32"))
        return hp_errf(err, HP_INVALID,
                       "device cuda: HP_CUDA_FLASH_ROWS must be 16 or 32, not '%s'", fr);
    hp__cuda *cu = hp_calloc(1, sizeof *cu);
    if (!cu) return hp_errf(err, HP_NOMEM, "cuda backend: out of memory");
    cu->tf32 = tf && !strcmp(tf, "1");
    cu->gemm_tune = gt && !strcmp(gt, "1");
    cu->base.vt = &cuda_vtable;
    hp__cuda_prof_init(cu);
    cu->device = device;
    hp_status st = HP_OK;
#define STEP(call, what)                                                                           \
    do {                                                                                           \
        int hp__e = (int)(call);                                                                   \
        if (hp__e != 0) {                                                                          \
            st = hp__cuda_fail(err, hp__e, (what));                                                \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    STEP(cudaSetDevice(device), "device cuda: cudaSetDevice");
    STEP(cudaGetDeviceProperties(&cu->prop, device), "device cuda: cudaGetDeviceProperties");
    for (int s = 0; s < HP_STREAM_COUNT; s++)
        STEP(cudaStreamCreateWithFlags(&cu->stream[s], cudaStreamNonBlocking),
             "device cuda: cudaStreamCreate");
    STEP(cudaMalloc(&cu->workspace, HP__CUDA_WORKSPACE), "device cuda: cuBLASLt workspace");
    note_alloc(cu, HP__CUDA_WORKSPACE);
    STEP(cudaMalloc((void **)&cu->fault, sizeof *cu->fault), "device cuda: fault word");
    STEP(cudaMemset(cu->fault, 0, sizeof *cu->fault), "device cuda: fault word");
#undef STEP
    cublasStatus_t bs = cublasLtCreate(&cu->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        st = hp_errf(err, HP_INTERNAL, "device cuda: cublasLtCreate: %s",
                     hp__cublas_status_name((int)bs));
        goto fail;
    }
    if ((st = hp__cuda_gemm_new(cu, err)) != HP_OK) goto fail;
    if ((st = hp_pool_new(hp_default_threads(), &cu->pool, err)) != HP_OK) goto fail;
    *out = &cu->base;
    return HP_OK;
fail:
    cuda_destroy(&cu->base);
    return st;
}
