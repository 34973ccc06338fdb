/* worker/cuda/cuda_gemm.c — mm, bmm and addmm on cuBLASLt: f32, bf16 or f16 inputs (both the
 * same), an f32 or same-typed output, f32 accumulation (CUBLAS_COMPUTE_32F: no TF32, so f32
 * products match the reference to rounding; $HP_CUDA_TF32=1 puts f32 products on TF32 tensor
 * cores instead, for speed). Transposes folded into the call (HP_CALL_TRANS_A/B) become
 * cuBLASLt's op flags, as the cpu backend folds them into sgemm.
 *
 * Row-major C [M, N] = A' [M, K] · B' [K, N] is computed as the column-major product
 * Cᵀ = B'ᵀ · A'ᵀ, so B's buffer is cuBLASLt's first operand and A's the second, and no data
 * moves. The matmul descriptor, the four layouts and the algorithm (cuBLASLt's first heuristic
 * for the workspace we have) are made once per (node, buffer types, flags, alignment) and kept
 * for the backend's life: a training step does no descriptor work.
 *
 * $HP_CUDA_GEMM_TUNE=1 asks the heuristic for up to TUNE_ALGOS candidates instead and, at a
 * shape's first product (beta 0: nothing read from the output), times each on the real operands
 * (TUNE_REPS runs after one warm-up, CUDA events) and keeps the fastest for every node of that
 * shape; the backend's end prints each shape's first candidate against the kept one. Off by
 * default: which candidate wins can change from run to run with the timing noise, and two
 * algorithms may round differently, so a tuned run is not bit-reproducible across runs.
 */
#include "worker/cuda/cuda_internal.h"

#include <stdio.h>
#include <string.h>

const char *hp__cublas_status_name(int st) {
    switch ((cublasStatus_t)st) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED (no driver or device)";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
        return "unknown cuBLAS status";
    }
}

#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t lt__s = (call);                                                             \
        if (lt__s != CUBLAS_STATUS_SUCCESS)                                                        \
            return hp_errf(err, HP_INTERNAL, "%s: %s", (what),                                     \
                           hp__cublas_status_name((int)lt__s));                                    \
    } while (0)

#define TUNE_ALGOS 8 /* candidates asked of the heuristic when tuning */
#define TUNE_REPS  3 /* timed runs of each */

/* One prepared product. */
typedef struct plan {
    const hp_node *node;
    unsigned flags;
    hp_dtype in_dt, out_dt;
    int64_t batch, m, n, k;
    unsigned align; /* the smallest alignment of the four pointers, capped at 256 */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;             /* the one run */
    cublasLtMatmulAlgo_t cand[TUNE_ALGOS]; /* tuning: the heuristic's candidates, best first */
    int n_cand;                            /* 0: not tuning, or tuned */
    int chosen;                            /* tuned: the candidate kept */
    float first_us, chosen_us;             /* tuned: candidate 0's and the kept one's time */
} plan;

struct hp__cuda_gemm_cache {
    plan *v;
    int n, cap;
};

hp_status hp__cuda_gemm_new(hp__cuda *cu, hp_err *err) {
    cu->gemm = hp_calloc(1, sizeof *cu->gemm);
    if (!cu->gemm) return hp_errf(err, HP_NOMEM, "cuda: out of memory for the GEMM cache");
    return HP_OK;
}

static void plan_fini(plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
}

/* $HP_CUDA_GEMM_TUNE=1: what tuning chose, a line a shape, to stderr. */
static void tune_report(const hp__cuda_gemm_cache *g) {
    bool head = false;
    for (int i = 0; i < g->n; i++) {
        const plan *p = &g->v[i];
        if (p->chosen < 0 || p->first_us <= 0 || p->chosen_us <= 0) continue; /* none, or a copy */
        if (!head)
            fprintf(stderr, "cuda GEMM tuning (HP_CUDA_GEMM_TUNE=1): out [batch x] m x n, k; "
                            "cuBLASLt's first candidate against the one kept\n");
        head = true;
        fprintf(stderr,
                "  tune %7lld %7lld %7lld %7lld %-2s %s>%s: first %.1f us, kept #%d %.1f us "
                "(%.2fx)\n",
                (long long)p->batch, (long long)p->m, (long long)p->n, (long long)p->k,
                hp__cuda_trans_name(p->flags & HP_CALL_TRANS_A, p->flags & HP_CALL_TRANS_B),
                hp_dtype_name(p->in_dt), hp_dtype_name(p->out_dt), p->first_us, p->chosen,
                p->chosen_us, p->first_us / p->chosen_us);
    }
}

void hp__cuda_gemm_free(hp__cuda *cu) {
    if (!cu->gemm) return;
    if (cu->gemm_tune) tune_report(cu->gemm);
    for (int i = 0; i < cu->gemm->n; i++) plan_fini(&cu->gemm->v[i]);
    hp_free(cu->gemm->v);
    hp_free(cu->gemm);
    cu->gemm = NULL;
}

static cudaDataType_t lt_type(hp_dtype dt) {
    return dt == HP_BF16 ? CUDA_R_16BF : dt == HP_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static unsigned align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
}

static hp_status layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols,
                        int64_t ld, int64_t batch, int64_t stride, hp_err *err) {
    LT_TRY(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld),
           "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                                sizeof bc),
               "cublasLtMatrixLayoutSetAttribute(batch count)");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof stride),
               "cublasLtMatrixLayoutSetAttribute(batch stride)");
    }
    return HP_OK;
}

static hp_status plan_make(hp__cuda *cu, plan *p, hp_err *err) {
    bool ta = p->flags & HP_CALL_TRANS_A, tb = p->flags & HP_CALL_TRANS_B;
    cudaDataType_t it = lt_type(p->in_dt), ot = lt_type(p->out_dt);
    cublasComputeType_t ct =
        cu->tf32 && p->in_dt == HP_F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F), "cublasLtMatmulDescCreate");
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* Lt's A is our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "cublasLtMatmulDescSetAttribute(transa)");
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "cublasLtMatmulDescSetAttribute(transb)");
    int64_t m = p->m, n = p->n, k = p->k;
    /* Lt A = our B: stored [K, N] row-major = N x K column-major (ld N), or transposed */
    HP_TRY(layout(&p->la, it, tb ? k : n, tb ? n : k, tb ? k : n, p->batch, k * n, err));
    /* Lt B = our A: stored [M, K] row-major = K x M column-major (ld K), or transposed */
    HP_TRY(layout(&p->lb, it, ta ? m : k, ta ? k : m, ta ? m : k, p->batch, m * k, err));
    HP_TRY(layout(&p->lc, ot, n, m, n, p->batch, m * n, err));
    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    size_t ws = HP__CUDA_WORKSPACE;
    uint32_t al = p->align;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res[TUNE_ALGOS];
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(cu->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref,
                                           cu->gemm_tune ? TUNE_ALGOS : 1, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return hp_errf(err, HP_INTERNAL, "cublasLtMatmulAlgoGetHeuristic: %s",
                       hp__cublas_status_name((int)s));
    if (found < 1)
        return hp_errf(err, HP_UNSUPPORTED,
                       "cuBLASLt has no algorithm for %s x %s -> %s [%lld x %lld x %lld]%s%s",
                       hp_dtype_name(p->in_dt), hp_dtype_name(p->in_dt), hp_dtype_name(p->out_dt),
                       (long long)m, (long long)n, (long long)k, ta ? " A^T" : "",
                       tb ? " B^T" : "");
    p->algo = res[0].algo;
    p->n_cand = 0;
    p->chosen = -1;
    for (int i = 0; cu->gemm_tune && found > 1 && i < found && i < TUNE_ALGOS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->n_cand++] = res[i].algo;
    if (p->n_cand < 2) p->n_cand = 0; /* nothing to choose between */
    return HP_OK;
}

/* Two plans for the same product shape (of any nodes). */
static bool same_shape(const plan *x, const plan *y) {
    return x->flags == y->flags && x->in_dt == y->in_dt && x->out_dt == y->out_dt &&
           x->batch == y->batch && x->m == y->m && x->n == y->n && x->k == y->k &&
           x->align == y->align;
}

/* The cached plan for this call, made on first use. */
static hp_status plan_get(hp__cuda *cu, const plan *key, plan **out, hp_err *err) {
    hp__cuda_gemm_cache *g = cu->gemm;
    for (int i = 0; i < g->n; i++) {
        plan *p = &g->v[i];
        if (p->node == key->node && same_shape(p, key)) {
            *out = p;
            return HP_OK;
        }
    }
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        plan *v = hp_realloc(g->v, (size_t)cap * sizeof *v);
        if (!v) return hp_errf(err, HP_NOMEM, "cuda: out of memory for the GEMM cache");
        g->v = v;
        g->cap = cap;
    }
    plan p = *key;
    p.desc = NULL;
    p.la = p.lb = p.lc = NULL;
    hp_status st = plan_make(cu, &p, err);
    if (st != HP_OK) {
        plan_fini(&p);
        return st;
    }
    g->v[g->n] = p;
    *out = &g->v[g->n++];
    return HP_OK;
}

static cublasStatus_t matmul(hp__cuda *cu, cudaStream_t s, const plan *p,
                             const cublasLtMatmulAlgo_t *algo, const void *a, const void *b,
                             void *c, float alpha, float beta) {
    /* our B is Lt's A, our A Lt's B */
    return cublasLtMatmul(cu->lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc,
                          algo, cu->workspace, HP__CUDA_WORKSPACE, s);
}

static hp_status run(hp__cuda *cu, cudaStream_t s, const plan *p, const void *a, const void *b,
                     void *c, float alpha, float beta, hp_err *err) {
    cublasStatus_t st = matmul(cu, s, p, &p->algo, a, b, c, alpha, beta);
    if (st != CUBLAS_STATUS_SUCCESS)
        return hp_errf(err, HP_INTERNAL, "cublasLtMatmul: %s", hp__cublas_status_name((int)st));
    return HP_OK;
}

/* Microseconds a run of candidate i takes (the mean of TUNE_REPS after a warm-up); a negative
 * value when it fails (the candidate is then passed over). */
static float time_candidate(hp__cuda *cu, cudaStream_t s, const plan *p, int i, const void *a,
                            const void *b, void *c, cudaEvent_t e0, cudaEvent_t e1) {
    if (matmul(cu, s, p, &p->cand[i], a, b, c, 1.0f, 0.0f) != CUBLAS_STATUS_SUCCESS) return -1;
    if (cudaEventRecord(e0, s) != cudaSuccess) return -1;
    for (int r = 0; r < TUNE_REPS; r++)
        if (matmul(cu, s, p, &p->cand[i], a, b, c, 1.0f, 0.0f) != CUBLAS_STATUS_SUCCESS) return -1;
    float ms = 0;
    if (cudaEventRecord(e1, s) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        return -1;
    return 1e3f * ms / TUNE_REPS;
}

/* $HP_CUDA_GEMM_TUNE=1: p's algorithm, the fastest of its candidates on these operands, or the
 * one kept for an earlier node of its shape. Only for beta 0 (the trial runs overwrite c). */
static hp_status tune(hp__cuda *cu, cudaStream_t s, plan *p, const void *a, const void *b, void *c,
                      hp_err *err) {
    hp__cuda_gemm_cache *g = cu->gemm;
    for (int i = 0; i < g->n; i++) {
        const plan *q = &g->v[i];
        if (q != p && q->n_cand == 0 && q->chosen >= 0 && same_shape(p, q)) {
            p->algo = q->algo;
            p->chosen = q->chosen;
            p->n_cand = 0;
            return HP_OK;
        }
    }
    hp__cuda_prof_discard(cu); /* the trials are not the product's time */
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        if (e0) cudaEventDestroy(e0);
        return hp__cuda_fail(err, (int)e, "cudaEventCreate for GEMM tuning");
    }
    int best = -1;
    float best_us = 0;
    for (int i = 0; i < p->n_cand; i++) {
        float us = time_candidate(cu, s, p, i, a, b, c, e0, e1);
        if (i == 0) p->first_us = us;
        if (us >= 0 && (best < 0 || us < best_us)) best = i, best_us = us;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGetLastError(); /* a candidate's failure is not the step's */
    if (best < 0)
        return hp_errf(err, HP_INTERNAL, "cublasLtMatmul: no candidate of %lld x %lld x %lld ran",
                       (long long)p->m, (long long)p->n, (long long)p->k);
    p->algo = p->cand[best];
    p->chosen = best;
    p->chosen_us = best_us;
    p->n_cand = 0;
    return HP_OK;
}

/* mm(a, b), bmm(a, b), addmm(bias, a, b){alpha, beta}. */
HP__CUDA_ENTRY(hp__cuda_mm) {
    hp_op op = c->node->op;
    int ia = op == HP_OP_ADDMM ? 1 : 0, rank = op == HP_OP_BMM ? 3 : 2;
    const unsigned fp = HP__CM(HP_F32) | HP__CM(HP_BF16) | HP__CM(HP_F16);
    HP_TRY(hp__cuda_dtype(c, 0, ia, fp, err));
    hp_dtype in_dt = c->in_type[ia].dtype;
    HP_TRY(hp__cuda_dtype(c, 0, ia + 1, HP__CM(in_dt), err));
    HP_TRY(hp__cuda_dtype(c, 1, 0, HP__CM(in_dt) | HP__CM(HP_F32), err));
    const hp_type *a = &c->in_type[ia], *b = &c->in_type[ia + 1], *o = &c->out_type[0];
    bool ta = c->flags & HP_CALL_TRANS_A, tb = c->flags & HP_CALL_TRANS_B;
    if (a->rank != rank || b->rank != rank || o->rank != rank)
        return hp_errf(err, HP_INVALID, "operands must have rank %d", rank);
    int r = rank - 2;
    int64_t am = a->shape[r + ta], ak = a->shape[r + !ta];
    int64_t bk = b->shape[r + tb], bn = b->shape[r + !tb];
    plan key = {.node = c->node,
                .flags = c->flags & (HP_CALL_TRANS_A | HP_CALL_TRANS_B),
                .in_dt = in_dt,
                .out_dt = o->dtype,
                .batch = rank == 3 ? o->shape[0] : 1,
                .m = o->shape[r],
                .n = o->shape[r + 1],
                .k = ak};
    bool ok = am == key.m && bn == key.n && bk == ak;
    if (rank == 3) ok = ok && a->shape[0] == key.batch && b->shape[0] == key.batch;
    ok = ok && key.m <= INT32_MAX && key.n <= INT32_MAX && key.k <= INT32_MAX &&
         key.batch <= INT32_MAX;
    if (!ok) {
        char x[128], y[128], z[128];
        return hp_errf(err, HP_INVALID, "%s%s x %s%s does not give %s", hp_type_str(a, x, sizeof x),
                       ta ? "^T" : "", hp_type_str(b, y, sizeof y), tb ? "^T" : "",
                       hp_type_str(o, z, sizeof z));
    }
    float alpha = 1.0f, beta = 0.0f;
    if (op == HP_OP_ADDMM) {
        HP_TRY(hp__cuda_dtype(c, 0, 0, HP__CM(o->dtype), err));
        HP_TRY(hp__cuda_check_bcast(&c->in_type[0], o, "bias", err));
        alpha = (float)hp_node_float(c->node, HP_ATTR_ALPHA, 1);
        beta = (float)hp_node_float(c->node, HP_ATTR_BETA, 1);
        if (beta != 0) { /* out = broadcast bias, then out = alpha·a·b + beta·out */
            hp__cu_walk w;
            memset(&w, 0, sizeof w);
            w.rank = o->rank;
            for (int d = 0; d < o->rank; d++) w.shape[d] = o->shape[d];
            hp__cuda_strides(o, w.st[0]);
            hp__cuda_bcast_strides(&c->in_type[0], o, w.st[1]);
            HP__CUDA_TRY(hp__cu_strided_copy(s, hp_dtype_size(o->dtype), c->out[0], c->in[0], &w,
                                             hp_type_numel(o)),
                         "bias copy");
        }
    }
    int64_t numel = hp_type_numel(o);
    if (numel == 0) return HP_OK;
    if (key.k == 0) { /* an empty sum: beta·out (zeros, or the bias scaled) */
        if (beta == 0) {
            HP__CUDA_TRY(cudaMemsetAsync(c->out[0], 0, (size_t)numel * hp_dtype_size(o->dtype), s),
                         "cudaMemsetAsync");
        } else if (beta != 1) {
            HP__CUDA_TRY(hp__cu_unary(s, HP__CU_MUL_SCALAR, hp__cuda_dt(o->dtype), c->out[0],
                                      c->out[0], beta, numel),
                         "scale kernel");
        }
        return HP_OK;
    }
    unsigned al = align_of(c->in[ia]);
    unsigned al2 = align_of(c->in[ia + 1]), al3 = align_of(c->out[0]);
    key.align = al < al2 ? al : al2;
    key.align = key.align < al3 ? key.align : al3;
    hp__cuda_prof_gemm(cu, key.batch, key.m, key.n, key.k, ta, tb, in_dt, o->dtype);
    plan *p = NULL;
    HP_TRY(plan_get(cu, &key, &p, err));
    if (p->n_cand > 0 && beta == 0)
        HP_TRY(tune(cu, s, p, c->in[ia], c->in[ia + 1], c->out[0], err));
    return run(cu, s, p, c->in[ia], c->in[ia + 1], c->out[0], alpha, beta, err);
}

/* ---- the peak probe ----------------------------------------------------------------------------
 * Square bf16 GEMMs from PROBE_MIN_N, doubling until PROBE_REPS of them take at least
 * PROBE_MIN_MS or n reaches PROBE_MAX_N (8192: a large GPU's tensor cores are busy only at
 * that size), so that a slow device is not kept for minutes and a fast one is measured where
 * it peaks. */

#define PROBE_MIN_N  1024
#define PROBE_MAX_N  8192
#define PROBE_REPS   5
#define PROBE_MIN_MS 20.0f

/* PROBE_REPS products of n^3 after one warm-up: the milliseconds they took. */
static hp_status probe_at(hp__cuda *cu, int n, float *ms, hp_err *err) {
    size_t bytes = (size_t)n * n * 2;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    hp_status st = HP_OK;
    cudaStream_t s = cu->stream[HP_STREAM_COMPUTE];
    plan p = {.node = NULL,
              .in_dt = HP_BF16,
              .out_dt = HP_BF16,
              .batch = 1,
              .m = n,
              .n = n,
              .k = n,
              .align = 256};
    bool made = false;
    *ms = 0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaMalloc(&c, bytes) != cudaSuccess) {
        st = hp_errf(err, HP_NOMEM, "cuda peak probe: no memory for three %dx%d bf16 matrices", n,
                     n);
        goto done;
    }
    cudaMemsetAsync(a, 0, bytes, s);
    cudaMemsetAsync(b, 0, bytes, s);
    if ((st = plan_make(cu, &p, err)) != HP_OK) goto done;
    made = true;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        st = hp_errf(err, HP_INTERNAL, "cuda peak probe: cudaEventCreate failed");
        goto done;
    }
    st = run(cu, s, &p, a, b, c, 1.0f, 0.0f, err); /* warm-up */
    cudaEventRecord(e0, s);
    for (int r = 0; r < PROBE_REPS && st == HP_OK; r++)
        st = run(cu, s, &p, a, b, c, 1.0f, 0.0f, err);
    cudaEventRecord(e1, s);
    cudaError_t ce = cudaEventSynchronize(e1);
    if (st == HP_OK && (ce != cudaSuccess || cudaEventElapsedTime(ms, e0, e1) != cudaSuccess))
        st = hp_errf(err, HP_INTERNAL, "cuda peak probe: no time measured");
done:
    if (made) plan_fini(&p);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return st;
}

hp_status hp__cuda_gemm_probe(hp__cuda *cu, double *flops, hp_err *err) {
    *flops = 0;
    for (int n = PROBE_MIN_N;; n *= 2) {
        float ms = 0;
        HP_TRY(probe_at(cu, n, &ms, err));
        if (ms >= PROBE_MIN_MS || n >= PROBE_MAX_N) {
            if (ms <= 0) return hp_errf(err, HP_INTERNAL, "cuda peak probe: no time measured");
            *flops = 2.0 * n * (double)n * n * PROBE_REPS / (ms * 1e-3);
            return HP_OK;
        }
    }
}
