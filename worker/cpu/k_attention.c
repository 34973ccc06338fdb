/* worker/cpu/k_attention.c — scaled dot-product attention, flash-style on the CPU:
 * _scaled_dot_product_flash_attention (q, k, v) -> (out, logsumexp) and its backward
 * (g_out, q, k, v, out, logsumexp) -> (gq, gk, gv). Grouped-query heads (query head h reads kv
 * head h / (H / Hkv)), optional causal mask (key s is hidden from query t when s > t), T != S.
 *
 * No [T, S] matrix is ever built. The forward runs one task per (batch, head, block of BQ
 * queries) and walks the keys in blocks of BK with an online softmax: running max and sum per
 * row, the output accumulator rescaled when the max grows. Scores come from a transposed key
 * block (so the inner loops run along keys), probabilities times values along the head dim.
 *
 * The backward recomputes P = exp(scale·q·k − lse) per (query block, key block) and uses
 * delta = rowsum(g_out ∘ out) (so `out` must be the forward's output, as in FlashAttention).
 * gk/gv sum over every query head of their kv head and every query; gq over every key. To stay
 * deterministic without atomics it has two schedules that perform the very same float
 * operations in the same order on every output element:
 *   fused     one task per (batch, kv head): key blocks in order, inside them the query heads
 *             and query blocks in order, accumulating gq, gk and gv in place;
 *   two-pass  tasks per (batch, kv head, key block) accumulate gk/gv the same way, then tasks
 *             per (batch, head, query block) accumulate gq over the key blocks in order.
 * The fused one does the least work; the two-pass one is used when the (batch, kv head) pairs
 * would leave threads idle. Results are bit-identical either way, so
 * the choice (which depends on the thread count) never shows in the numbers.
 *
 * The block-level work lives in k_attention_blocks.h, compiled twice: for AVX2+FMA (explicit
 * intrinsics in the matrix microkernels) and for the baseline target (scalar fmaf), with the
 * same operations in the same order, so both give the same bits; worker/simd.h picks one.
 */
#include "worker/cpu/cpu_internal.h"
#include "worker/simd.h"

#include <math.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#define BQ 32 /* queries per block */
#define BK 64 /* keys per block */

static int backward_mode; /* 0 automatic, 1 fused, 2 two-pass (tests) */

void hp__cpu_sdpa_backward_mode(int mode) {
    backward_mode = mode;
}

typedef struct attn {
    int64_t b, h, hkv, t, s, d, dv, group;
    float scale;
    bool causal;
    hp_attn_lays l; /* the operands' layouts (worker/attn_layout.h) */
    const float *q, *k, *v;
    /* forward */
    float *out, *lse;
    /* backward */
    const float *go, *o, *lse_in;
    float *gq, *gk, *gv, *delta;
    /* per-thread scratch: `per_thread` floats from `scratch` */
    float *scratch;
    int64_t per_thread;
} attn;

static hp_status attn_check(const hp_kernel_call *c, int iq, attn *a, hp_err *err) {
    for (int k = iq; k < iq + 3; k++) HP_TRY(hp__cpu_dtype(c, 0, k, HP__F32, err));
    const hp_type *q = &c->in_type[iq], *k = &c->in_type[iq + 1], *v = &c->in_type[iq + 2];
    bool ok = q->rank == 4 && k->rank == 4 && v->rank == 4;
    ok = ok && k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0];
    ok = ok && k->shape[1] == v->shape[1] && k->shape[2] == v->shape[2];
    ok = ok && k->shape[3] == q->shape[3] && k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0;
    if (!ok) {
        char x[128], y[128], z[128];
        return hp_errf(err, HP_INVALID,
                       "q %s, k %s, v %s are not [B,H,T,D], [B,Hkv,S,D], "
                       "[B,Hkv,S,Dv] with H a multiple of Hkv",
                       hp_type_str(q, x, sizeof x), hp_type_str(k, y, sizeof y),
                       hp_type_str(v, z, sizeof z));
    }
    *a = (attn){.b = q->shape[0],
                .h = q->shape[1],
                .hkv = k->shape[1],
                .t = q->shape[2],
                .s = k->shape[2],
                .d = q->shape[3],
                .dv = v->shape[3],
                .causal = hp_node_int(c->node, HP_ATTR_CAUSAL, 0) != 0,
                .q = c->in[iq],
                .k = c->in[iq + 1],
                .v = c->in[iq + 2]};
    a->group = a->h / a->hkv;
    a->scale = (float)hp_node_float(c->node, HP_ATTR_SCALE, 1.0 / sqrt((double)(a->d ? a->d : 1)));
    a->l = hp_attn_lays_of(c->flags, iq == 1, a->h, a->hkv, a->t, a->s, a->d, a->dv);
    return HP_OK;
}

/* Keys [0, n) are visible to some row of the query block starting at t0 with nq rows. */
static int64_t block_keys(const attn *a, int64_t t0, int64_t nq) {
    if (!a->causal) return a->s;
    return t0 + nq < a->s ? t0 + nq : a->s;
}

/* Row (b, h, t) of an operand laid out as l; its rows are l.st apart. */
static float *row_of(const float *base, hp_attn_lay l, int64_t b, int64_t h, int64_t t) {
    return (float *)base + b * l.sb + h * l.sh + t * l.st;
}

/* Forward scratch per thread: kt [D, BK], s [BQ, BK], acc [BQ, Dv], m and l [BQ]. */
static int64_t fwd_scratch(const attn *a) {
    return a->d * BK + BQ * BK + BQ * a->dv + 2 * BQ;
}

/* Backward scratch per thread: kt [D, BK], vt [Dv, BK], p [BQ, BK], dp [BQ, BK]. */
static int64_t bwd_scratch(const attn *a) {
    return (a->d + a->dv) * BK + 2 * BQ * BK;
}

typedef struct bwd_buf {
    float *kt, *vt, *p, *dp;
} bwd_buf;

static bwd_buf bwd_slice(const attn *a, int thread) {
    bwd_buf w;
    w.kt = a->scratch + thread * a->per_thread;
    w.vt = w.kt + a->d * BK;
    w.p = w.vt + a->dv * BK;
    w.dp = w.p + BQ * BK;
    return w;
}

/* Query blocks of any head that see key block k0: causal hides the blocks ending before k0. */
static int64_t first_qblock(const attn *a, int64_t k0) {
    return a->causal ? k0 / BQ : 0;
}

/* ---- the block work, compiled twice --------------------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#define ATTN_SFX(name) name##_avx2
#define ATTN_TARGET    __attribute__((target("avx2,fma")))
#define ATTN_AVX2      1
#include "worker/cpu/k_attention_blocks.h"
#undef ATTN_SFX
#undef ATTN_TARGET
#undef ATTN_AVX2
#define HAVE_AVX2_COPY 1
#endif
#define ATTN_SFX(name) name##_base
#define ATTN_TARGET
#include "worker/cpu/k_attention_blocks.h"
#undef ATTN_SFX
#undef ATTN_TARGET

typedef struct attn_tasks {
    hp_pool_fn fwd, bwd_fused, bwd_kv, bwd_q;
} attn_tasks;

static attn_tasks tasks_for_cpu(void) {
#ifdef HAVE_AVX2_COPY
    if (hp__simd_avx2())
        return (attn_tasks){fwd_task_avx2, bwd_fused_avx2, bwd_kv_avx2, bwd_q_avx2};
#endif
    return (attn_tasks){fwd_task_base, bwd_fused_base, bwd_kv_base, bwd_q_base};
}

/* ---- forward -------------------------------------------------------------------------------- */

/* (q, k, v){scale, causal} -> (out [B, H, T, Dv], logsumexp [B, H, T] f32) */
HP__CPU_KERNEL(hp__cpu_sdpa) {
    attn a;
    HP_TRY(attn_check(c, 0, &a, err));
    HP_TRY(hp__cpu_dtype(c, 1, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 1, 1, HP__F32, err));
    HP_TRY(hp__cpu_out_numel(c, 0, a.b * a.h * a.t * a.dv, err));
    HP_TRY(hp__cpu_out_numel(c, 1, a.b * a.h * a.t, err));
    a.out = c->out[0];
    a.lse = c->out[1];
    if (a.b * a.h * a.t == 0) return HP_OK;
    a.per_thread = (fwd_scratch(&a) + 15) / 16 * 16; /* keep each thread's slice 64-byte aligned */
    a.scratch = hp__cpu_scratch(cpu, (size_t)(a.per_thread * cpu->threads) * sizeof(float), err);
    if (!a.scratch) return err ? err->status : HP_NOMEM;
    hp_pool_run(cpu->pool, a.b * a.h * ((a.t + BQ - 1) / BQ), tasks_for_cpu().fwd, &a);
    return HP_OK;
}

/* ---- backward ------------------------------------------------------------------------------- */

/* delta[row] = Σ_c g_out[row, c] · out[row, c], in double (rows in [B, H, T] order). */
static void delta_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const attn *a = ctx;
    for (int64_t r = b; r < e; r++) {
        int64_t t = r % a->t, h = r / a->t % a->h, bb = r / a->t / a->h;
        const float *g = row_of(a->go, a->l.go, bb, h, t), *o = row_of(a->o, a->l.o, bb, h, t);
        double s = 0;
        for (int64_t c = 0; c < a->dv; c++) s += (double)g[c] * (double)o[c];
        a->delta[r] = (float)s;
    }
}

/* (g_out, q, k, v, out, logsumexp) -> (gq, gk, gv) */
HP__CPU_KERNEL(hp__cpu_sdpa_backward) {
    attn a;
    HP_TRY(attn_check(c, 1, &a, err));
    for (int k = 0; k < 3; k++) HP_TRY(hp__cpu_dtype(c, 1, k, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 0, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 4, HP__F32, err));
    HP_TRY(hp__cpu_dtype(c, 0, 5, HP__F32, err));
    int64_t rows = a.b * a.h * a.t;
    if (hp_type_numel(&c->in_type[0]) != rows * a.dv ||
        hp_type_numel(&c->in_type[4]) != rows * a.dv || hp_type_numel(&c->in_type[5]) != rows)
        return hp_errf(err, HP_INVALID, "g_out, out or logsumexp does not match q and v");
    HP_TRY(hp__cpu_out_numel(c, 0, rows * a.d, err));
    HP_TRY(hp__cpu_out_numel(c, 1, a.b * a.hkv * a.s * a.d, err));
    HP_TRY(hp__cpu_out_numel(c, 2, a.b * a.hkv * a.s * a.dv, err));
    a.go = c->in[0];
    a.o = c->in[4];
    a.lse_in = c->in[5];
    a.gq = c->out[0];
    a.gk = c->out[1];
    a.gv = c->out[2];
    hp__cpu_zero(cpu, a.gq, (size_t)(rows * a.d) * sizeof(float));
    hp__cpu_zero(cpu, a.gk, (size_t)(a.b * a.hkv * a.s * a.d) * sizeof(float));
    hp__cpu_zero(cpu, a.gv, (size_t)(a.b * a.hkv * a.s * a.dv) * sizeof(float));
    if (rows == 0 || a.s == 0) return HP_OK;
    a.per_thread = (bwd_scratch(&a) + 15) / 16 * 16;
    size_t delta_n = (size_t)(rows + 15) / 16 * 16;
    float *scratch = hp__cpu_scratch(
        cpu, (delta_n + (size_t)(a.per_thread * cpu->threads)) * sizeof(float), err);
    if (!scratch) return err ? err->status : HP_NOMEM;
    a.delta = scratch;
    a.scratch = scratch + delta_n;
    hp_pool_parallel_for(cpu->pool, rows, hp__cpu_grain(2 * a.dv), delta_rows, &a);
    /* Fused unless its rounds of (batch, kv head) tasks leave threads idle for longer than the
     * two-pass schedule's extra ~40% of work (a second score recomputation) costs. */
    int mode = backward_mode;
    int64_t tasks = a.b * a.hkv, th = cpu->threads;
    if (mode == 0) mode = (tasks + th - 1) / th * th * 10 <= 14 * tasks ? 1 : 2;
    attn_tasks tk = tasks_for_cpu();
    if (mode == 1) {
        hp_pool_run(cpu->pool, a.b * a.hkv, tk.bwd_fused, &a);
    } else {
        hp_pool_run(cpu->pool, a.b * a.hkv * ((a.s + BK - 1) / BK), tk.bwd_kv, &a);
        hp_pool_run(cpu->pool, rows / a.t * ((a.t + BQ - 1) / BQ), tk.bwd_q, &a);
    }
    return HP_OK;
}
