/* worker/cpu/k_matmul.c — mm, bmm and addmm on OpenBLAS's cblas_sgemm, f32 only.
 *
 * HP_CALL_TRANS_A / TRANS_B mean the lowering folded a transpose into the call: the buffer
 * holds the operand untransposed (in_type[] describes that buffer), and sgemm reads it
 * transposed. bmm is a loop of sgemm calls, one per batch entry (OpenBLAS threads each).
 * OpenBLAS splits a product over M and N, never K, so each output element sums in the same
 * order whatever the thread count.
 *
 * Never called from inside a pool task: OpenBLAS runs its own threads.
 */
#include "worker/cpu/cpu_internal.h"

#include <cblas.h>

void hp__cpu_blas_threads(int n) {
    if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
}

/* The logical product [M, K] x [K, N] of a call's operands a = in[ia], b = in[ia + 1], given
 * the output type; checks every dim against the buffers' types. */
typedef struct gemm_dims {
    int64_t batch, m, n, k;
    bool ta, tb;
} gemm_dims;

static hp_status gemm_check(const hp_kernel_call *c, int ia, int rank, gemm_dims *g, hp_err *err) {
    HP_TRY(hp__cpu_dtype(c, 0, ia, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, ia + 1, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    const hp_type *a = &c->in_type[ia], *b = &c->in_type[ia + 1], *o = &c->out_type[0];
    g->ta = c->flags & HP_CALL_TRANS_A;
    g->tb = c->flags & HP_CALL_TRANS_B;
    if (a->rank != rank || b->rank != rank || o->rank != rank)
        return hp_errf(err, HP_INVALID, "operands must have rank %d", rank);
    int r = rank - 2;
    int64_t am = a->shape[r + g->ta], ak = a->shape[r + !g->ta];
    int64_t bk = b->shape[r + g->tb], bn = b->shape[r + !g->tb];
    g->batch = rank == 3 ? o->shape[0] : 1;
    g->m = o->shape[r];
    g->n = o->shape[r + 1];
    g->k = ak;
    bool ok = am == g->m && bn == g->n && bk == ak;
    if (rank == 3) ok = ok && a->shape[0] == g->batch && b->shape[0] == g->batch;
    /* cblas takes int dims */
    ok = ok && g->m <= INT32_MAX && g->n <= INT32_MAX && g->k <= INT32_MAX;
    if (!ok) {
        char x[128], y[128], z[128];
        return hp_errf(err, HP_INVALID, "%s%s x %s%s does not give %s", hp_type_str(a, x, sizeof x),
                       g->ta ? "^T" : "", hp_type_str(b, y, sizeof y), g->tb ? "^T" : "",
                       hp_type_str(o, z, sizeof z));
    }
    return HP_OK;
}

/* y[M, N] = alpha · op(a) op(b) + beta · y for one batch entry. */
static void sgemm(const gemm_dims *g, const float *a, const float *b, float *y, float alpha,
                  float beta) {
    int m = (int)g->m, n = (int)g->n, k = (int)g->k;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                m, n, k, alpha, a, g->ta ? m : k, b, g->tb ? k : n, beta, y, n);
}

/* The batched product into out (zeros when K is 0, which sgemm may not touch). */
static void gemm_run(hp__cpu *cpu, const gemm_dims *g, const float *a, const float *b, float *y,
                     float alpha, float beta) {
    if (g->m == 0 || g->n == 0) return;
    if (g->k == 0) {
        if (beta == 0)
            hp__cpu_zero(cpu, y, (size_t)(g->batch * g->m * g->n) * sizeof *y);
        else
            for (int64_t i = 0; i < g->batch * g->m * g->n; i++) y[i] *= beta;
        return;
    }
    hp__cpu_blas_threads(cpu->threads);
    for (int64_t i = 0; i < g->batch; i++)
        sgemm(g, a + i * g->m * g->k, b + i * g->k * g->n, y + i * g->m * g->n, alpha, beta);
}

/* mm(a [M, K], b [K, N]) -> [M, N] */
HP__CPU_KERNEL(hp__cpu_mm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 0, 2, &g, err));
    gemm_run(cpu, &g, c->in[0], c->in[1], c->out[0], 1.0f, 0.0f);
    return HP_OK;
}

/* bmm(a [B, M, K], b [B, K, N]) -> [B, M, N] */
HP__CPU_KERNEL(hp__cpu_bmm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 0, 3, &g, err));
    gemm_run(cpu, &g, c->in[0], c->in[1], c->out[0], 1.0f, 0.0f);
    return HP_OK;
}

/* addmm(bias, a, b){beta = 1, alpha = 1} = beta · bias + alpha · (a @ b), bias broadcast to
 * [M, N]. beta = 0 ignores bias entirely (NaN in it does not propagate), as torch documents. */
HP__CPU_KERNEL(hp__cpu_addmm) {
    gemm_dims g;
    HP_TRY(gemm_check(c, 1, 2, &g, err));
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    const hp_type *o = &c->out_type[0];
    HP_TRY(hp__cpu_check_bcast(&c->in_type[0], o, "bias", err));
    float alpha = (float)hp_node_float(c->node, HP_ATTR_ALPHA, 1);
    float beta = (float)hp_node_float(c->node, HP_ATTR_BETA, 1);
    if (beta != 0) {
        int64_t sst[HP_MAX_RANK], ost[HP_MAX_RANK];
        hp__cpu_bcast_strides(&c->in_type[0], o, sst);
        hp__cpu_strides(o, ost);
        hp__cpu_strided_copy(cpu, c->out[0], ost, c->in[0], sst, o->shape, o->rank, sizeof(float));
    }
    gemm_run(cpu, &g, c->in[1], c->in[2], c->out[0], alpha, beta);
    return HP_OK;
}
