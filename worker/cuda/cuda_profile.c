/* worker/cuda/cuda_profile.c — $HP_CUDA_PROFILE=1: device time per op, for finding where a
 * step's time goes on a GPU (host timestamps of asynchronous launches say nothing).
 *
 * Each launch (and the training loop's adamw / sum of squares / scale, and the bf16 staging
 * casts) is bracketed by two timing events on its stream; at each synchronize the pairs are
 * read and added to a per-op total. At the backend's end one table goes to stderr: op, calls,
 * total device ms, mean µs, share, and GB/s, sorted by total. GB/s is the bytes the work must
 * move at the least (each operand read or written once; AdamW's four f32 streams, three of
 * them written back) over its device time: for a memory-bound kernel, the rate to hold against
 * the device's bandwidth (H100/H200 SXM: 3.35 / 4.8 TB/s); for GEMMs and attention it means
 * little. The events cost a few µs of host time per launch, so a profiled run's tokens/s is not
 * the figure to report.
 * A second table splits the GEMMs by shape (batch, m, n, k, which operand is transposed, the
 * dtypes) with each shape's TFLOP/s: the rows to hold against the same products in PyTorch
 * (bench/gpu/torch_gemm.py reads them from the log).
 */
#include "worker/cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prof_pair {
    cudaEvent_t a, b;
    int slot, gemm; /* gemm: its row in gemms, or -1 */
    double bytes;
} prof_pair;

#define PROF_GEMMS 64 /* GEMM shapes with a row of their own; more are left out of that table */

typedef struct gemm_row {
    int64_t batch, m, n, k;
    bool ta, tb;
    hp_dtype in, out;
    double ms;
    int64_t calls;
} gemm_row;

struct hp__cuda_prof {
    prof_pair *pairs; /* events of this sync window: [0, used) recorded */
    int used, cap;
    double ms[HP__PROF_SLOTS], bytes[HP__PROF_SLOTS];
    int64_t calls[HP__PROF_SLOTS];
    int64_t syncs;
    gemm_row gemms[PROF_GEMMS];
    int n_gemms;
    int open;     /* the record begun and not ended yet, or -1 */
    bool discard; /* the open record is not to be counted (hp__cuda_prof_discard) */
};

static const char *slot_name(int slot) {
    switch (slot) {
    case HP__PROF_ADAMW:
        return "adamw";
    case HP__PROF_SUMSQ:
        return "grad_sumsq";
    case HP__PROF_SCALE:
        return "grad_scale";
    case HP__PROF_ACCUMULATE:
        return "grad_accumulate";
    case HP__PROF_STAGE:
        return "bf16_staging";
    default:
        return slot >= 0 && slot < HP_OP_COUNT ? hp_op_get((hp_op)slot)->name : "?";
    }
}

void hp__cuda_prof_init(hp__cuda *cu) {
    const char *v = getenv("HP_CUDA_PROFILE");
    if (!v || strcmp(v, "1") != 0) return;
    cu->prof = hp_calloc(1, sizeof *cu->prof);
    if (cu->prof) cu->prof->open = -1;
}

int hp__cuda_prof_begin(hp__cuda *cu, int stream) {
    hp__cuda_prof *p = cu->prof;
    if (!p || stream < 0 || stream >= HP_STREAM_COUNT) return -1;
    p->open = -1;
    p->discard = false;
    if (p->used == p->cap) {
        int cap = p->cap ? 2 * p->cap : 1024;
        prof_pair *np = hp_realloc(p->pairs, (size_t)cap * sizeof *np);
        if (!np) return -1;
        for (int i = p->cap; i < cap; i++) {
            np[i].a = np[i].b = NULL;
            if (cudaEventCreate(&np[i].a) != cudaSuccess ||
                cudaEventCreate(&np[i].b) != cudaSuccess) {
                cudaGetLastError();
                p->pairs = np;
                p->cap = i; /* the pairs made so far */
                if (np[i].a) cudaEventDestroy(np[i].a);
                return -1;
            }
        }
        p->pairs = np;
        p->cap = cap;
    }
    prof_pair *q = &p->pairs[p->used];
    if (cudaEventRecord(q->a, cu->stream[stream]) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    q->slot = q->gemm = -1;
    p->open = p->used;
    return p->used++;
}

void hp__cuda_prof_discard(hp__cuda *cu) {
    if (cu->prof) cu->prof->discard = true;
}

void hp__cuda_prof_gemm(hp__cuda *cu, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta,
                        bool tb, hp_dtype in, hp_dtype out) {
    hp__cuda_prof *p = cu->prof;
    if (!p || p->open < 0) return;
    int i = 0;
    for (; i < p->n_gemms; i++) {
        const gemm_row *r = &p->gemms[i];
        if (r->batch == batch && r->m == m && r->n == n && r->k == k && r->ta == ta &&
            r->tb == tb && r->in == in && r->out == out)
            break;
    }
    if (i == p->n_gemms) {
        if (i == PROF_GEMMS) return;
        p->gemms[p->n_gemms++] = (gemm_row){
            .batch = batch, .m = m, .n = n, .k = k, .ta = ta, .tb = tb, .in = in, .out = out};
    }
    p->pairs[p->open].gemm = i;
}

double hp__cuda_call_bytes(const hp_kernel_call *c) {
    double b = 0;
    for (int i = 0; i < c->n_in; i++)
        b += (double)hp_type_numel(&c->in_type[i]) * (double)hp_dtype_size(c->in_type[i].dtype);
    for (int i = 0; i < c->n_out; i++)
        b += (double)hp_type_numel(&c->out_type[i]) * (double)hp_dtype_size(c->out_type[i].dtype);
    return b;
}

void hp__cuda_prof_end(hp__cuda *cu, int rec, int stream, int slot, double bytes) {
    hp__cuda_prof *p = cu->prof;
    if (!p) return;
    p->open = -1;
    if (p->discard) { /* no end event: collect skips the pair */
        p->discard = false;
        return;
    }
    if (rec < 0 || rec >= p->used || slot < 0 || slot >= HP__PROF_SLOTS) return;
    if (cudaEventRecord(p->pairs[rec].b, cu->stream[stream]) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    p->pairs[rec].slot = slot;
    p->pairs[rec].bytes = bytes;
}

void hp__cuda_prof_collect(hp__cuda *cu) {
    hp__cuda_prof *p = cu->prof;
    if (!p) return;
    for (int i = 0; i < p->used; i++) {
        float ms = 0;
        if (p->pairs[i].slot < 0) continue; /* the launch failed: no end event */
        if (cudaEventElapsedTime(&ms, p->pairs[i].a, p->pairs[i].b) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        p->ms[p->pairs[i].slot] += ms;
        p->bytes[p->pairs[i].slot] += p->pairs[i].bytes;
        p->calls[p->pairs[i].slot]++;
        if (p->pairs[i].gemm >= 0) {
            p->gemms[p->pairs[i].gemm].ms += ms;
            p->gemms[p->pairs[i].gemm].calls++;
        }
    }
    p->used = 0;
    p->syncs++;
}

typedef struct row {
    int slot;
    double ms;
} row;

static int by_ms_desc(const void *x, const void *y) {
    double a = ((const row *)x)->ms, b = ((const row *)y)->ms;
    return (a < b) - (a > b);
}

void hp__cuda_prof_report(hp__cuda *cu, FILE *f) {
    hp__cuda_prof *p = cu->prof;
    if (!p) return;
    row rows[HP__PROF_SLOTS];
    int n = 0;
    double total = 0;
    for (int s = 0; s < HP__PROF_SLOTS; s++)
        if (p->calls[s] > 0) {
            rows[n++] = (row){s, p->ms[s]};
            total += p->ms[s];
        }
    qsort(rows, (size_t)n, sizeof *rows, by_ms_desc);
    fprintf(f, "cuda profile (HP_CUDA_PROFILE=1): device time per op over %lld synchronizes\n",
            (long long)p->syncs);
    fprintf(f, "  %-44s %9s %12s %10s %7s %8s\n", "op", "calls", "total ms", "mean us", "share",
            "GB/s");
    for (int i = 0; i < n; i++) {
        int s = rows[i].slot;
        fprintf(f, "  %-44s %9lld %12.3f %10.1f %6.1f%% %8.0f\n", slot_name(s),
                (long long)p->calls[s], p->ms[s], 1e3 * p->ms[s] / (double)p->calls[s],
                total > 0 ? 100 * p->ms[s] / total : 0.0,
                p->ms[s] > 0 ? p->bytes[s] / (p->ms[s] * 1e6) : 0.0);
    }
    fprintf(f, "  %-44s %9s %12.3f\n", "all", "", total);
    if (p->n_gemms == 0) return;
    /* GEMMs by shape, longest first (a selection sort: at most PROF_GEMMS rows) */
    int order[PROF_GEMMS];
    for (int i = 0; i < p->n_gemms; i++) order[i] = i;
    for (int i = 0; i < p->n_gemms; i++)
        for (int j = i + 1; j < p->n_gemms; j++)
            if (p->gemms[order[j]].ms > p->gemms[order[i]].ms) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    fprintf(f, "cuda profile GEMMs by shape: out [batch x] m x n = A' [m x k] . B' [k x n]\n");
    fprintf(f, "  %-6s %7s %7s %7s %7s %-5s %-10s %9s %12s %8s\n", "gemm", "batch", "m", "n", "k",
            "trans", "dtypes", "calls", "total ms", "TFLOP/s");
    for (int i = 0; i < p->n_gemms; i++) {
        const gemm_row *r = &p->gemms[order[i]];
        if (r->calls == 0) continue;
        char dt[24];
        snprintf(dt, sizeof dt, "%s>%s", hp_dtype_name(r->in), hp_dtype_name(r->out));
        double flops = 2.0 * (double)r->batch * (double)r->m * (double)r->n * (double)r->k;
        fprintf(f, "  %-6s %7lld %7lld %7lld %7lld %-5s %-10s %9lld %12.3f %8.3g\n", "gemm",
                (long long)r->batch, (long long)r->m, (long long)r->n, (long long)r->k,
                hp__cuda_trans_name(r->ta, r->tb), dt, (long long)r->calls, r->ms,
                r->ms > 0 ? flops * (double)r->calls / (r->ms * 1e-3) / 1e12 : 0.0);
    }
}

void hp__cuda_prof_free(hp__cuda *cu) {
    hp__cuda_prof *p = cu->prof;
    if (!p) return;
    hp__cuda_prof_report(cu, stderr);
    for (int i = 0; i < p->cap; i++) {
        cudaEventDestroy(p->pairs[i].a);
        cudaEventDestroy(p->pairs[i].b);
    }
    hp_free(p->pairs);
    hp_free(p);
    cu->prof = NULL;
}
