/* worker/cuda/cuda_internal.h — what the cuda backend's C files share (hp__cuda_ prefix): the
 * backend object, the op table's entry signature, error helpers that name the op and carry the
 * CUDA / cuBLAS / NCCL error string, scratch device memory, and the per-family entries
 * (cuda_ops.c: elementwise, shape, reduce; cuda_ops_nn.c: nn, norm, rope, attention;
 * cuda_gemm.c: mm bmm addmm; cuda_nccl.c: collectives).
 *
 * An entry checks a call against the types it relies on (as the cpu kernels do, so a wrong
 * call is an error, never an out-of-bounds access), then enqueues kernels on the stream it is
 * given. Messages name the operand and the cause; cuda_backend.c prefixes "cuda: OP: ".
 */
#ifndef HP_WORKER_CUDA_INTERNAL_H
#define HP_WORKER_CUDA_INTERNAL_H

#include "hp/threads.h"
#include "worker/backend.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_kernels.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

typedef struct hp__cuda_gemm_cache hp__cuda_gemm_cache; /* cuda_gemm.c */
typedef struct hp__cuda_nccl hp__cuda_nccl;             /* cuda_nccl.c */
typedef struct hp__cuda_prof hp__cuda_prof;             /* cuda_profile.c */

typedef struct hp__cuda_alloc {
    void *p;
    size_t bytes;
} hp__cuda_alloc;

typedef struct hp__cuda {
    hp_backend base; /* first: hp_backend * <-> hp__cuda * */
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t stream[HP_STREAM_COUNT];
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt workspace, HP__CUDA_WORKSPACE bytes */
    hp__cuda_gemm_cache *gemm;
    hp__cu_fault *fault; /* device fault word (zeroed); host copy checked at synchronize */
    void *scratch[HP_STREAM_COUNT]; /* device scratch per stream, grown on demand (cudaFree
                                       waits for the device) */
    size_t scratch_cap[HP_STREAM_COUNT];
    void *stage[HP_STREAM_COUNT]; /* f32 staging of bf16 operands per stream (cuda_launch) */
    size_t stage_cap[HP_STREAM_COUNT];
    hp_pool *pool; /* host threads for fill_init's values */
    /* pinned and device: [sumsq_cap · HP__CU_SUMSQ_BLOCKS] partials of each span, then the
     * table of sumsq_cap spans (hp__cu_span) */
    double *sumsq_host;
    double *sumsq_dev;
    int sumsq_cap;          /* spans the two hold */
    hp__cuda_alloc *allocs; /* live allocations of alloc (for the live byte count) */
    int n_allocs, cap_allocs;
    uint64_t live_bytes, peak_bytes; /* of alloc (and scratch, workspace) */
    double peak_flops;
    bool peak_done;
    hp__cuda_nccl *nccl; /* NULL: no communicator (group_size 1 only) */
    bool tf32;           /* $HP_CUDA_TF32=1: f32 GEMMs on TF32 tensor cores */
    bool gemm_tune;      /* $HP_CUDA_GEMM_TUNE=1: time cuBLASLt's candidates once a shape */
    hp__cuda_prof *prof; /* $HP_CUDA_PROFILE=1: device time per op (NULL: off) */
} hp__cuda;

#define HP__CUDA_WORKSPACE ((size_t)32 << 20)

typedef hp_status (*hp__cuda_entry)(hp__cuda *cu, cudaStream_t s, const hp_kernel_call *c,
                                    hp_err *err);
#define HP__CUDA_ENTRY(name)                                                                       \
    hp_status name(hp__cuda *cu, cudaStream_t s, const hp_kernel_call *c, hp_err *err)

/* ---- errors --------------------------------------------------------------------------------- */

/* HP_INTERNAL (HP_NOMEM for cudaErrorMemoryAllocation) "WHAT: cudaErrorX: the string". */
hp_status hp__cuda_fail(hp_err *err, int code, const char *what);
#define HP__CUDA_TRY(call, what)                                                                   \
    do {                                                                                           \
        int hp__e = (int)(call);                                                                   \
        if (hp__e != 0) return hp__cuda_fail(err, hp__e, (what));                                  \
    } while (0)
const char *hp__cublas_status_name(int st);

/* ---- helpers (cuda_backend.c) --------------------------------------------------------------- */

/* Device scratch of at least bytes for work on `stream`, valid until that stream's next
 * request (stream-ordered use only: each stream has its own). */
void *hp__cuda_scratch(hp__cuda *cu, int stream, size_t bytes, hp_err *err);
/* hp_dtype -> HP__CU_*; -1 when the kernels have no such type. */
int hp__cuda_dt(hp_dtype dt);
/* Input k (out == 0) or output k must have a dtype in the mask (1u << hp_dtype); a dtype
 * outside it is HP_UNSUPPORTED naming it ("dtype bf16 of input 0 is not supported by the cuda
 * backend for this op"), a value outside hp_dtype HP_INVALID. */
hp_status hp__cuda_dtype(const hp_kernel_call *c, int out, int k, unsigned allowed, hp_err *err);
hp_status hp__cuda_dtypes_all(const hp_kernel_call *c, unsigned allowed, hp_err *err);
hp_status hp__cuda_out_numel(const hp_kernel_call *c, int k, int64_t n, hp_err *err);
hp_status hp__cuda_same_shape(const hp_kernel_call *c, int a, int b, int b_out, hp_err *err);
hp_status hp__cuda_check_bcast(const hp_type *in, const hp_type *out, const char *what,
                               hp_err *err);
hp_status hp__cuda_attr_dim(const hp_node *n, hp_attr_key k, int rank, int *out, hp_err *err);
void hp__cuda_strides(const hp_type *t, int64_t st[HP_MAX_RANK]);
void hp__cuda_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]);
/* A device-to-device copy on s. */
hp_status hp__cuda_copy(cudaStream_t s, void *dst, const void *src, size_t bytes, hp_err *err);

#define HP__CM(dt) (1u << (dt))
#define HP__CF32   HP__CM(HP_F32)
#define HP__CFP    (HP__CM(HP_F32) | HP__CM(HP_BF16))
#define HP__CINTS  (HP__CM(HP_I32) | HP__CM(HP_I64))
#define HP__CANY   (HP__CM(HP_F32) | HP__CM(HP_BF16) | HP__CM(HP_F16) | HP__CINTS | HP__CM(HP_BOOL))

/* ---- entries by family ---------------------------------------------------------------------- */

/* cuda_ops.c */
HP__CUDA_ENTRY(hp__cuda_creation);
HP__CUDA_ENTRY(hp__cuda_binary);
HP__CUDA_ENTRY(hp__cuda_where);
HP__CUDA_ENTRY(hp__cuda_unary);
HP__CUDA_ENTRY(hp__cuda_backward_pair);
HP__CUDA_ENTRY(hp__cuda_to_copy);
HP__CUDA_ENTRY(hp__cuda_reduce);
HP__CUDA_ENTRY(hp__cuda_copy_op);
HP__CUDA_ENTRY(hp__cuda_permute);
HP__CUDA_ENTRY(hp__cuda_expand);
HP__CUDA_ENTRY(hp__cuda_slice);
HP__CUDA_ENTRY(hp__cuda_slice_backward);
HP__CUDA_ENTRY(hp__cuda_cat);

/* cuda_ops_nn.c */
HP__CUDA_ENTRY(hp__cuda_embedding);
HP__CUDA_ENTRY(hp__cuda_embedding_backward);
HP__CUDA_ENTRY(hp__cuda_chunked_embedding);
HP__CUDA_ENTRY(hp__cuda_chunked_embedding_backward);
HP__CUDA_ENTRY(hp__cuda_softmax);
HP__CUDA_ENTRY(hp__cuda_softmax_backward);
HP__CUDA_ENTRY(hp__cuda_nll_loss);
HP__CUDA_ENTRY(hp__cuda_nll_loss_backward);
HP__CUDA_ENTRY(hp__cuda_cross_entropy);
HP__CUDA_ENTRY(hp__cuda_cross_entropy_backward);
HP__CUDA_ENTRY(hp__cuda_swiglu);
HP__CUDA_ENTRY(hp__cuda_swiglu_backward);
HP__CUDA_ENTRY(hp__cuda_rms_norm);
HP__CUDA_ENTRY(hp__cuda_rms_norm_backward);
HP__CUDA_ENTRY(hp__cuda_rotary);
HP__CUDA_ENTRY(hp__cuda_sdpa);
HP__CUDA_ENTRY(hp__cuda_sdpa_backward);
/* sdpa / its backward with bf16 operands that k_flash.cu's tensor-core kernels take as they are
 * (head dims 16, 32, 48, 64, 80, 96, 128; aligned; a device of compute capability 8 or later):
 * launched without f32 staging. */
bool hp__cuda_sdpa_native(const hp__cuda *cu, const hp_kernel_call *c);
/* Any call whose bf16 operands the kernels take as they are (RMSNorm, rotary, the above). */
bool hp__cuda_native_bf16(const hp__cuda *cu, const hp_kernel_call *c);

HP__CUDA_ENTRY(hp__cuda_layer_norm);
HP__CUDA_ENTRY(hp__cuda_layer_norm_backward);

/* cuda_ops_mask.c */
HP__CUDA_ENTRY(hp__cuda_tril);
HP__CUDA_ENTRY(hp__cuda_bitwise_not);
HP__CUDA_ENTRY(hp__cuda_arange);
HP__CUDA_ENTRY(hp__cuda_dropout);
HP__CUDA_ENTRY(hp__cuda_dropout_backward);

/* cuda_gemm.c: descriptors and the algorithm cached per (node, types). */
HP__CUDA_ENTRY(hp__cuda_mm);
hp_status hp__cuda_gemm_new(hp__cuda *cu, hp_err *err);
void hp__cuda_gemm_free(hp__cuda *cu);
/* A bf16 cuBLASLt GEMM of n^3 timed with events on the compute stream: FLOP/s. */
hp_status hp__cuda_gemm_probe(hp__cuda *cu, double *flops, hp_err *err);

/* cuda_profile.c: $HP_CUDA_PROFILE=1. A record brackets work on a stream with timing events;
 * slots are op codes, then the training loop's math and the staging casts. begin returns -1
 * (and end then does nothing) when profiling is off or an event cannot be had. end takes the
 * bytes the work must move at the least (each operand read or written once), for its rate. */
enum {
    HP__PROF_ADAMW = HP_OP_COUNT,
    HP__PROF_SUMSQ,
    HP__PROF_SCALE,
    HP__PROF_ACCUMULATE,
    HP__PROF_STAGE,
    HP__PROF_SLOTS
};
void hp__cuda_prof_init(hp__cuda *cu);
int hp__cuda_prof_begin(hp__cuda *cu, int stream);
void hp__cuda_prof_end(hp__cuda *cu, int rec, int stream, int slot, double bytes);
/* The bytes of a call's operands: every input and every output once. */
double hp__cuda_call_bytes(const hp_kernel_call *c);
/* Which GEMM operands are read transposed, as the profile and the tuning report print it:
 * "AB", "A", "B" or "-". */
static inline const char *hp__cuda_trans_name(bool ta, bool tb) {
    return ta ? (tb ? "AB" : "A") : (tb ? "B" : "-");
}
/* The record begun last holds one-time work (GEMM tuning): its time is left out. */
void hp__cuda_prof_discard(hp__cuda *cu);
/* The GEMM of the record begun last: its time also goes to a row per shape (batch, m, n, k,
 * transposes, dtypes) in a second table, with its TFLOP/s. */
void hp__cuda_prof_gemm(hp__cuda *cu, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta,
                        bool tb, hp_dtype in, hp_dtype out);
void hp__cuda_prof_collect(hp__cuda *cu); /* after the streams synchronized */
void hp__cuda_prof_free(hp__cuda *cu);    /* prints the table to stderr */

/* cuda_nccl.c */
hp_status hp__cuda_nccl_collective(hp__cuda *cu, const hp_kernel_call *c, hp_err *err);
hp_status hp__cuda_nccl_sync(hp__cuda *cu, hp_err *err);
double hp__cuda_nccl_busy(hp__cuda *cu);
void hp__cuda_nccl_free(hp__cuda *cu);

#endif
