/* graph/eval/eval_attention.c — reference kernels for scaled dot-product attention
 * (_scaled_dot_product_flash_attention and its backward): grouped-query heads, optional causal
 * mask, one query row at a time with the full score row in a scratch buffer. No tiling, no
 * online softmax: the point is to be obviously right, not fast.
 *
 * Layouts: q [B, H, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], out [B, H, T, Dv],
 * logsumexp [B, H, T]. Query head h reads kv head h / (H / Hkv); causal hides key s > t.
 */
#include "graph/eval/eval_internal.h"

#include <math.h>

typedef struct attn_dims {
    int64_t b, h, hkv, t, s, d, dv;
    double scale;
    bool causal;
} attn_dims;

static attn_dims attn_get(const hp_node *n, const hp_type *q, const hp_type *k, const hp_type *v) {
    return (attn_dims){
        .b = q->shape[0],
        .h = q->shape[1],
        .hkv = k->shape[1],
        .t = q->shape[2],
        .s = k->shape[2],
        .d = q->shape[3],
        .dv = v->shape[3],
        .scale = hp_node_float(n, HP_ATTR_SCALE, 1.0 / sqrt((double)q->shape[3])),
        .causal = hp_node_int(n, HP_ATTR_CAUSAL, 0) != 0,
    };
}

/* Keys query row t may see: [0, n_keys). */
static int64_t attn_keys(const attn_dims *a, int64_t t) {
    return a->causal ? (t + 1 < a->s ? t + 1 : a->s) : a->s;
}

/* Pointers to the rows of one (batch, head, query) triple. */
static const double *row4(const hp_tensor *x, int64_t b, int64_t h, int64_t i) {
    const int64_t *s = x->type.shape;
    return x->data + ((b * s[1] + h) * s[2] + i) * s[3];
}

static double dot(const double *x, const double *y, int64_t n) {
    double r = 0;
    for (int64_t i = 0; i < n; i++) r += x[i] * y[i];
    return r;
}

static hp_status scratch(double **p, int64_t n, hp_err *err) {
    *p = hp_calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!*p) return hp_errf(err, HP_NOMEM, "out of memory for an attention score row");
    return HP_OK;
}

/* (q, k, v){scale, causal} -> (out, logsumexp). A row with no visible key gets out 0 and
 * logsumexp −inf. */
HP__EVAL_KERNEL(hp__eval_sdpa) {
    attn_dims a = attn_get(n, &in[0]->type, &in[1]->type, &in[2]->type);
    int64_t group = a.h / a.hkv;
    double *p;
    HP_TRY(scratch(&p, a.s, err));
    for (int64_t b = 0; b < a.b; b++)
        for (int64_t h = 0; h < a.h; h++)
            for (int64_t t = 0; t < a.t; t++) {
                int64_t hk = h / group, keys = attn_keys(&a, t);
                const double *q = row4(in[0], b, h, t);
                double m = -INFINITY, sum = 0;
                for (int64_t s = 0; s < keys; s++) {
                    p[s] = a.scale * dot(q, row4(in[1], b, hk, s), a.d);
                    if (p[s] > m) m = p[s];
                }
                for (int64_t s = 0; s < keys; s++) sum += exp(p[s] - m);
                double lse = keys > 0 ? m + log(sum) : -INFINITY;
                double *o = out[0].data + ((b * a.h + h) * a.t + t) * a.dv;
                for (int64_t s = 0; s < keys; s++) {
                    double w = exp(p[s] - lse);
                    const double *v = row4(in[2], b, hk, s);
                    for (int64_t c = 0; c < a.dv; c++) o[c] += w * v[c];
                }
                out[1].data[(b * a.h + h) * a.t + t] = lse;
            }
    hp_free(p);
    return HP_OK;
}

/* (g_out, q, k, v, out, logsumexp) -> (gq, gk, gv). With P the attention weights recomputed
 * from logsumexp and dP = g_out·vᵀ: gv = Pᵀ g_out, dS = P ∘ (dP − rowsum(P ∘ dP)),
 * gq = scale · dS k, gk = scale · dSᵀ q; gk and gv sum over the query heads of a kv head.
 * rowsum(P ∘ dP) is computed from P directly (it equals g_out·out for the true out). */
HP__EVAL_KERNEL(hp__eval_sdpa_backward) {
    attn_dims a = attn_get(n, &in[1]->type, &in[2]->type, &in[3]->type);
    int64_t group = a.h / a.hkv;
    double *p, *dp;
    HP_TRY(scratch(&p, a.s, err));
    hp_status st = scratch(&dp, a.s, err);
    if (st != HP_OK) {
        hp_free(p);
        return st;
    }
    for (int64_t b = 0; b < a.b; b++)
        for (int64_t h = 0; h < a.h; h++)
            for (int64_t t = 0; t < a.t; t++) {
                int64_t hk = h / group, keys = attn_keys(&a, t);
                const double *q = row4(in[1], b, h, t), *go = row4(in[0], b, h, t);
                double lse = in[5]->data[(b * a.h + h) * a.t + t], delta = 0;
                for (int64_t s = 0; s < keys; s++) {
                    p[s] = exp(a.scale * dot(q, row4(in[2], b, hk, s), a.d) - lse);
                    dp[s] = dot(go, row4(in[3], b, hk, s), a.dv);
                    delta += p[s] * dp[s];
                }
                double *gq = out[0].data + ((b * a.h + h) * a.t + t) * a.d;
                for (int64_t s = 0; s < keys; s++) {
                    double ds = p[s] * (dp[s] - delta) * a.scale;
                    const double *k = row4(in[2], b, hk, s);
                    double *gk = out[1].data + ((b * a.hkv + hk) * a.s + s) * a.d;
                    double *gv = out[2].data + ((b * a.hkv + hk) * a.s + s) * a.dv;
                    for (int64_t c = 0; c < a.d; c++) {
                        gq[c] += ds * k[c];
                        gk[c] += ds * q[c];
                    }
                    for (int64_t c = 0; c < a.dv; c++) gv[c] += p[s] * go[c];
                }
            }
    hp_free(p);
    hp_free(dp);
    return HP_OK;
}
