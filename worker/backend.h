/* worker/backend.h — the device interface the executor runs a Program on: memory, one kernel
 * launch per instruction, collectives, streams and events, device facts. One vtable; the
 * `cpu` backend (worker/cpu/) implements it now, a `cuda` backend (a compute stream and a
 * comm stream ordered by events, cuBLASLt GEMMs) fits it without change.
 *
 * Streams: 0 is compute, 1 is communication. Work on one stream runs in issue order; an
 * event recorded on one stream and waited on another orders the two. A backend whose
 * launches are synchronous (cpu compute) may complete work inside launch and make events
 * trivial.
 *
 * Memory: pointers from alloc are device pointers, only dereferenceable on the host when
 * info.host_visible is true (cpu). Host <-> device transfers go through copy_in / copy_out.
 *
 * The training loop (worker/train*.c) never touches device memory itself: the optimizer, the
 * gradient norm and clipping, and parameter init are vtable entries (the cpu backend runs
 * hp/optim.h and hp/param_init.h on its pool), and checkpoint and weight I/O stage through
 * copy_in / copy_out (zero-copy when host_visible). Peak FLOPs and device memory come from
 * info. A new backend implements this vtable and is added to hp_backend_new; train.c does
 * not change.
 *
 * Threads: a backend is used by one executor thread; the backend may run its own threads.
 * Errors: every call returns hp_status with err naming the op and the cause.
 */
#ifndef HP_WORKER_BACKEND_H
#define HP_WORKER_BACKEND_H

#include "hp/comm.h"
#include "hp/graph.h"
#include "hp/job.h"
#include "hp/optim.h"
#include "hp/rng.h"
#include "worker/attn_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { HP_STREAM_COMPUTE = 0, HP_STREAM_COMM = 1, HP_STREAM_COUNT = 2 };

/* Kernel call flags: the lowering folds a transpose feeding a matrix product into the call,
 * so the kernel reads the untransposed buffer (whose type in_type[] describes). */
enum {
    HP_CALL_TRANS_A = 1 << 0, /* mm/bmm/addmm: operand a is given transposed (last two dims) */
    HP_CALL_TRANS_B = 1 << 1, /* mm/bmm/addmm: operand b is given transposed (last two dims) */
};
/* Attention calls take HP_CALL_BTHD_IN/OUT (worker/attn_layout.h). The call flags an op
 * takes: */
static inline unsigned hp_call_flags_allowed(hp_op op) {
    switch (op) {
    case HP_OP_MM:
    case HP_OP_BMM:
    case HP_OP_ADDMM:
        return HP_CALL_TRANS_A | HP_CALL_TRANS_B;
    case HP_OP_SDPA: /* q, k, v; out */
        return 0x7u << 4 | HP_CALL_BTHD_OUT(0);
    case HP_OP_SDPA_BACKWARD: /* g_out, q, k, v, out; gq, gk, gv */
        return HP_CALL_BTHD_MASK;
    default:
        return 0;
    }
}

/* One kernel launch: the node says the op, its attributes and its declared output types;
 * buffers are contiguous, row-major, of the types given (but an attention operand under
 * HP_CALL_BTHD_*, which lies in [B, T, H, D] order for its [B, H, T, D] type). */
typedef struct hp_kernel_call {
    const hp_node *node;
    unsigned flags;
    int n_in, n_out;
    const void *const *in;   /* [n_in] device pointers */
    const hp_type *in_type;  /* [n_in] */
    void *const *out;        /* [n_out] device pointers */
    const hp_type *out_type; /* [n_out] */
    /* native_dropout: the draw and where this rank's piece sits in the whole tensor (the
     * executor's, hp_exec_set_rng); NULL: seed 0, step 0, the buffer is the whole tensor. */
    const hp_dropout_site *site;
} hp_kernel_call;

typedef struct hp_device_info {
    char name[128];       /* "cpu: AMD EPYC 7B13 (2 threads)", "NVIDIA H200" */
    int64_t memory_bytes; /* device memory (cpu: physical RAM) */
    double peak_flops;    /* dense peak used for MFU (bf16 on GPUs; measured f32 on cpu); 0
                             when unknown */
    bool host_visible;    /* device pointers are host pointers */
    int threads;          /* cpu: compute threads */
} hp_device_info;

typedef struct hp_backend hp_backend;
typedef struct hp_event hp_event;

/* Called on the backend's comm thread after each collective it ran, with the collective's
 * node, the bytes of its input on this rank, and its start and end (CLOCK_MONOTONIC
 * seconds). */
typedef void (*hp_comm_trace_fn)(void *ctx, const hp_node *node, int64_t bytes, double start_s,
                                 double end_s);

typedef struct hp_backend_vtable {
    const char *name;
    hp_status (*info)(hp_backend *b, hp_device_info *out, hp_err *err);

    /* memory: zeroed, 64-byte aligned; free(NULL) is a no-op */
    hp_status (*alloc)(hp_backend *b, size_t bytes, void **out, hp_err *err);
    void (*free)(hp_backend *b, void *p);
    hp_status (*copy_in)(hp_backend *b, void *dst, const void *host_src, size_t bytes, hp_err *err);
    hp_status (*copy_out)(hp_backend *b, void *host_dst, const void *src, size_t bytes,
                          hp_err *err);

    /* Launches call on a stream. HP_UNSUPPORTED naming the op and dtype when the backend has
     * no kernel for it. */
    hp_status (*launch)(hp_backend *b, int stream, const hp_kernel_call *call, hp_err *err);

    /* Runs a collective node (all_gather_into_tensor, reduce_scatter_tensor, all_reduce,
     * all_to_all_single) among the ranks of its group: the mesh dim its HP_ATTR_GROUP names
     * (hp_backend_opts.groups), else the world communicator when group_size is the world's;
     * usually on HP_STREAM_COMM. Without a communicator only group_size 1 is allowed (a copy). */
    hp_status (*collective)(hp_backend *b, int stream, const hp_kernel_call *call, hp_err *err);

    /* Events order streams: record after the work issued so far on `stream`; wait makes later
     * work on `stream` wait for the event. */
    hp_status (*event_new)(hp_backend *b, hp_event **out, hp_err *err);
    void (*event_free)(hp_backend *b, hp_event *e);
    hp_status (*event_record)(hp_backend *b, hp_event *e, int stream, hp_err *err);
    hp_status (*event_wait)(hp_backend *b, hp_event *e, int stream, hp_err *err);

    /* Waits until all work on all streams is done; reports the first asynchronous error. */
    hp_status (*synchronize)(hp_backend *b, hp_err *err);
    void (*destroy)(hp_backend *b);

    /* ---- the training loop's math on device buffers (f32; pointers from alloc) ----------
     * Same arguments, checks, errors and bits as the hp/optim.h / hp/param_init.h functions
     * they name, whose contracts they share; the backend picks the threads (results never
     * depend on them). Compute-stream work, ordered after what was launched before. */

    /* hp_adamw_step_scaled: every hp_adamw_param's param, grad, exp_avg and exp_avg_sq is a
     * device pointer; the gradients are read times grad_scale (clipping's coefficient, 1:
     * none), so the trainer makes no separate pass to scale them. */
    hp_status (*adamw)(hp_backend *b, const hp_adamw_config *cfg, double lr, float grad_scale,
                       int64_t step, const hp_adamw_param *params, int n_params, hp_err *err);
    /* hp_grad_sumsq over device spans: the local part of a global norm, into host *sumsq. */
    hp_status (*sum_squares)(hp_backend *b, const hp_fspan *x, int n, double *sumsq, hp_err *err);
    /* hp_grad_scale: every element of the device spans times coef (the trainer clips through
     * adamw's grad_scale instead; this serves callers that scale gradients on their own). */
    hp_status (*scale)(hp_backend *b, const hp_fspan *x, int n, float coef, hp_err *err);
    /* hp_grad_accumulate: dst[i] += src[i] over device spans (first: dst[i] = src[i]); the
     * trainer adds up the gradients of a step's micro-steps (gradient accumulation). */
    hp_status (*accumulate)(hp_backend *b, const hp_fspan *dst, const hp_fspan *src, int n,
                            bool first, hp_err *err);
    /* hp_param_init_fill: elements [first, first + count) of parameter fqn's init into the
     * device buffer dst[0..count). */
    hp_status (*fill_init)(hp_backend *b, float *dst, const hp_init *spec, uint64_t seed,
                           const char *fqn, int64_t first, int64_t count, hp_err *err);

    /* ---- facts for the metrics ------------------------------------------------------------ */

    /* The most device memory this process has held so far, in bytes (cpu: peak RSS). */
    hp_status (*memory_peak)(hp_backend *b, uint64_t *bytes, hp_err *err);
    /* Seconds the comm stream has spent inside collectives (0 without a communicator). */
    double (*comm_busy)(hp_backend *b);
    /* Sets (fn NULL: clears) the per-collective hook of the comm stream; applies to the
     * collectives started afterwards; a no-op without a communicator. fn must be thread-safe;
     * ctx must outlive the hook (clear it, then synchronize, before freeing ctx). */
    void (*set_comm_trace)(hp_backend *b, hp_comm_trace_fn fn, void *ctx);
} hp_backend_vtable;

/* Backends embed this first. */
struct hp_backend {
    const hp_backend_vtable *vt;
};

static inline void hp_backend_free(hp_backend *b) {
    if (b) b->vt->destroy(b);
}

/* The communicator of one mesh dim: collectives whose group attribute names it run on it. */
typedef struct hp_comm_group {
    const char *name; /* the mesh dim ("dp", "tp") */
    hp_comm *comm;    /* its ranks (borrowed) */
} hp_comm_group;

/* What the factory needs to build a backend. */
typedef struct hp_backend_opts {
    int threads;   /* cpu: compute threads; <= 0: hp_default_threads() */
    hp_comm *comm; /* the world communicator (borrowed: it must outlive the backend); NULL:
                      single rank */
    const hp_comm_group *groups; /* [n_groups]: one per mesh dim of more than one rank (copied;
                                    the communicators borrowed). A collective runs on the group
                                    its HP_ATTR_GROUP names, else on comm when its group_size is
                                    the world's. */
    int n_groups;
} hp_backend_opts;

/* The backend for the job's device (worker/backend.c): cpu now; cuda when a CUDA backend is
 * compiled in (hp/device.h) and a device exists. *out is the caller's (hp_backend_free).
 * Errors: a device this hp-worker cannot run is HP_UNSUPPORTED with one line ("device cuda:
 * this hp-worker was built without CUDA (...)", "device cuda: no CUDA device"); never a
 * silent fallback to the CPU. Otherwise the backend's own errors (bad thread count:
 * HP_INVALID; no memory or thread: HP_NOMEM, HP_INTERNAL). */
hp_status hp_backend_new(hp_device_kind device, const hp_backend_opts *opts, hp_backend **out,
                         hp_err *err);

/* HP_OK when this hp-worker can run jobs on device d here: a backend is built for it
 * (hp_device_built) and, for cuda, this process sees at least one CUDA device; otherwise
 * hp_backend_new's one-line error ("device cuda: no CUDA device (...)"). For launchers, to
 * refuse before any rank starts. */
hp_status hp_backend_available(hp_device_kind d, hp_err *err);

/* The draw of a native_dropout call (node's fqn and p, the call's site, its input's shape):
 * seed, step and where this rank's piece sits, checked (the site's rank is the input's, the
 * piece inside the whole tensor, p in [0, 1)); *p_out is p, or 0 where the site is in
 * evaluation (hp_exec_set_eval). The cpu and cuda kernels draw the same mask from it
 * (hp_dropout_keep). */
hp_status hp_dropout_site_of(const hp_kernel_call *c, hp_dropout_site *s, double *p_out,
                             hp_err *err);

/* ---- bf16 staging (the cpu and cuda launches) -------------------------------------------------
 * A kernel that computes in f32 runs a call with bf16 operands on its f32 view: each bf16 input
 * and output gets a slice of the backend's staging (f32, each slice rounded up to `align`
 * bytes) and reads f32 there; the backend widens those inputs into their slices before the
 * kernel and rounds those outputs back from theirs after it. */

/* The staging bytes the call's bf16 operands need. */
size_t hp_stage_bytes(const hp_kernel_call *c, size_t align);

/* The f32 view of c over `stage` (hp_stage_bytes(c, align) bytes): in / in_type [c->n_in],
 * out / out_type [c->n_out] and node are the caller's storage, view the call to launch. An
 * operand that is not bf16 is c's own. */
typedef struct hp_stage_view {
    const void **in;
    hp_type *in_type;
    void **out;
    hp_type *out_type;
    hp_node node;
    hp_kernel_call call;
} hp_stage_view;
void hp_stage_view_make(const hp_kernel_call *c, void *stage, size_t align, hp_stage_view *v);

#ifdef __cplusplus
}
#endif
#endif
