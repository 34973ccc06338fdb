/* tests/cuemu/cuemu_blas.cpp — cuemu's cuBLASLt (include/cublasLt.h). A layout is column-major
 * rows x cols with leading dimension ld (≥ rows), optionally batched by count and element
 * stride; cublasLtMatmul checks that op(A) [m, k], op(B) [k, n], C and D [m, n] agree, then per
 * batch widens A and B to f32 (rounding them to TF32 for CUBLAS_COMPUTE_32F_FAST_TF32), calls
 * OpenBLAS's sgemm (f32 accumulation, as CUBLAS_COMPUTE_32F) and writes
 * D = alpha·(A·B) + beta·C rounded to nearest even in D's type. */
#include "cuemu_internal.h"
#include "include/cublasLt.h"
#include "include/cuda_bf16.h"
#include "include/cuda_fp16.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

struct cublasLtContext {
    int magic;
};
struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
};
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct cublasLtMatmulPreferenceOpaque_t {
    size_t workspace;
};

namespace {

bool float_type(cudaDataType_t t) {
    return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

size_t esize(cudaDataType_t t) {
    return t == CUDA_R_32F ? 4 : 2;
}

float load(cudaDataType_t t, const void *p, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

void store(cudaDataType_t t, void *p, size_t i, float v) {
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((__half *)p)[i] = __float2half_rn(v);
}

float tf32(float v) { /* round to 10 mantissa bits, nearest even */
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* One batch of a layout widened to a packed column-major f32 matrix (ld = rows). */
void widen(const cublasLtMatrixLayoutOpaque_t *l, const void *base, int64_t b, bool round_tf32,
           std::vector<float> &out) {
    out.resize((size_t)(l->rows * l->cols));
    const char *p = (const char *)base + (size_t)(b * l->stride) * esize(l->type);
    for (uint64_t c = 0; c < l->cols; c++)
        for (uint64_t r = 0; r < l->rows; r++) {
            float v = load(l->type, p, (size_t)(c * (uint64_t)l->ld + r));
            out[(size_t)(c * l->rows + r)] = round_tf32 ? tf32(v) : v;
        }
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *h = new cublasLtContext{0x4c74};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new cublasLtMatmulDescOpaque_t{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t op;
        memcpy(&op, buf, sizeof op);
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)op;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED; /* epilogues and the rest: not emulated */
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    if (!float_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)(rows ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->batch, buf, size);
        return l->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
        if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->stride, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = new cublasLtMatmulPreferenceOpaque_t{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->workspace, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        return size == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* m, n, k of the product, or false when the layouts disagree. */
static bool dims(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                 cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, uint64_t *m, uint64_t *n,
                 uint64_t *k) {
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols;
    uint64_t bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    *m = am, *n = bn, *k = ak;
    return ak == bk && c->rows == am && c->cols == bn && dd->rows == am && dd->cols == bn &&
           a->batch == b->batch && a->batch == c->batch && a->batch == dd->batch &&
           a->type == b->type && c->type == dd->type;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *found) {
    if (!h || !d || !a || !b || !c || !dd || !pref || requested < 1 || !results || !found)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, n, k;
    *found = 0;
    if (!dims(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
    /* up to three candidates (a tuner has something to choose between); all compute alike */
    int offer = requested < 3 ? requested : 3;
    for (int i = 0; i < offer; i++) {
        memset(&results[i], 0, sizeof results[i]);
        results[i].algo.data[0] = 0x656d75 + (uint64_t)i; /* "emu" */
        results[i].state = CUBLAS_STATUS_SUCCESS;
        results[i].wavesCount = 1;
    }
    *found = offer;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Ad, const void *B,
                              cublasLtMatrixLayout_t Bd, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSize, cudaStream_t stream) {
    (void)workspace, (void)workspaceSize;
    if (!h || !d || !alpha || !beta || !Ad || !Bd || !Cd || !Dd || !algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!hp_emu::stream_ok(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    if (hp_emu::sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    uint64_t m, n, k;
    if (!dims(d, Ad, Bd, Cd, Dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
    if (Cd->ld != Dd->ld || (C != D && Cd->stride != Dd->stride))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    float al, be;
    memcpy(&al, alpha, sizeof al);
    memcpy(&be, beta, sizeof be);
    bool round = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    size_t ea = esize(Ad->type), eb = esize(Bd->type), ed = esize(Dd->type);
    /* every operand inside device memory */
    auto span = [](cublasLtMatrixLayout_t l, size_t es) {
        uint64_t one = l->cols ? (l->cols - 1) * (uint64_t)l->ld + l->rows : 0;
        return (size_t)(((uint64_t)(l->batch - 1) * (uint64_t)l->stride + one) * es);
    };
    if ((m && k && !hp_emu::on_device(A, span(Ad, ea))) ||
        (k && n && !hp_emu::on_device(B, span(Bd, eb))) ||
        (m && n && !hp_emu::on_device(D, span(Dd, ed))) ||
        (m && n && be != 0 && !hp_emu::on_device(C, span(Cd, esize(Cd->type)))))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* the work, in stream order, on copies of the descriptors (they may be destroyed once
     * the call returns, as cuBLASLt allows) */
    cublasLtMatmulDescOpaque_t dc = *d;
    cublasLtMatrixLayoutOpaque_t ac = *Ad, bc = *Bd, cc = *Cd, dcl = *Dd;
    hp_emu::submit(stream, [=]() {
        std::vector<float> a, b, prod((size_t)(m * n));
        for (int32_t bi = 0; bi < ac.batch; bi++) {
            widen(&ac, A, bi, round, a);
            widen(&bc, B, bi, round, b);
            if (m && n) {
                if (k)
                    cblas_sgemm(CblasColMajor, dc.ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                                dc.tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                                (int)k, 1.0f, a.data(), (int)ac.rows, b.data(), (int)bc.rows, 0.0f,
                                prod.data(), (int)m);
                else
                    std::fill(prod.begin(), prod.end(), 0.0f);
            }
            const char *cp = (const char *)C + (size_t)(bi * cc.stride) * esize(cc.type);
            char *dp = (char *)D + (size_t)(bi * dcl.stride) * ed;
            for (uint64_t col = 0; col < n; col++)
                for (uint64_t r = 0; r < m; r++) {
                    size_t at = (size_t)(col * (uint64_t)dcl.ld + r);
                    float v = al * prod[(size_t)(col * m + r)];
                    if (be != 0) v += be * load(cc.type, cp, at);
                    store(dcl.type, dp, at, v);
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
