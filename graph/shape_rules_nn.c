/* graph/shape_rules_nn.c — the shape rules of the neural-network ops (graph/ops.def): embedding,
 * softmax and the losses (nll_loss, the fused cross entropy), swiglu, RMSNorm, LayerNorm, tril,
 * arange, rotary embedding and attention. The conventions are shape_rules.c's. */
#include "graph/shape_rules_internal.h"

/* ---- embedding, softmax, loss --------------------------------------------------------------- */

static hp_status padding_idx(const hp_node *n, int64_t rows, hp_err *err) {
    const hp_attr *a = attr(n, HP_ATTR_PADDING_IDX);
    if (a && (a->i < -1 || a->i >= rows))
        return hp_errf(err, HP_INVALID, "padding_idx %lld outside [-1, %lld)", (long long)a->i,
                       (long long)rows);
    return HP_OK;
}

hp_status hp__shape_embedding(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_rank(&in[0], 2, "weight", err));
    HP_TRY(need_float(&in[0], "weight", err));
    HP_TRY(need_int(&in[1], "indices", err));
    if (in[1].rank >= HP_MAX_RANK) return hp_errf(err, HP_INVALID, "indices rank too large");
    HP_TRY(padding_idx(n, in[0].shape[0], err));
    out[0] = in[1];
    out[0].dtype = in[0].dtype;
    out[0].shape[out[0].rank++] = in[0].shape[1];
    return HP_OK;
}

hp_status hp__shape_embedding_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                       hp_err *err) {
    HP_TRY(need_float(&in[0], "grad", err));
    HP_TRY(need_int(&in[1], "indices", err));
    if (in[0].rank != in[1].rank + 1)
        return hp_errf(err, HP_INVALID, "grad %s must be indices %s plus one dim", DIMS(&in[0]),
                       DIMS(&in[1]));
    for (int i = 0; i < in[1].rank; i++)
        if (in[0].shape[i] != in[1].shape[i])
            return hp_errf(err, HP_INVALID, "grad %s does not match indices %s", DIMS(&in[0]),
                           DIMS(&in[1]));
    int64_t rows = attr(n, HP_ATTR_NUM_WEIGHTS)->i;
    if (rows < 1 || rows > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "num_weights %lld must be >= 1", (long long)rows);
    HP_TRY(padding_idx(n, rows, err));
    int64_t s[2] = {rows, in[0].shape[in[0].rank - 1]};
    out[0] = hp_type_make(in[0].dtype, 2, s);
    return widened(n, &out[0], "the weight gradient is grad's dtype or f32", err);
}

hp_status hp__shape_softmax(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    int d;
    HP_TRY(hp__norm_dim(attr(n, HP_ATTR_DIM)->i, in[0].rank, "dim", &d, err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_softmax_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                     hp_err *err) {
    HP_TRY(same_type(&in[0], &in[1], "grad and output differ", err));
    return hp__shape_softmax(n, in, out, err);
}

static hp_status nll_args(const hp_node *n, const hp_type *logp, const hp_type *target,
                          hp_err *err) {
    HP_TRY(need_rank(logp, 2, "log-probabilities", err));
    HP_TRY(need_float(logp, "log-probabilities", err));
    HP_TRY(need_rank(target, 1, "target", err));
    HP_TRY(need_int(target, "target", err));
    if (target->shape[0] != logp->shape[0])
        return hp_errf(err, HP_INVALID, "target %s does not match log-probabilities %s",
                       DIMS(target), DIMS(logp));
    int64_t r = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (r < HP_NLL_NONE || r > HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not none (0), mean (1) or sum (2)",
                       (long long)r);
    return HP_OK;
}

hp_status hp__shape_nll_loss(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(nll_args(n, &in[0], &in[1], err));
    out[0] = (hp_type){.dtype = in[0].dtype, .rank = 0};
    if (hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_NONE) {
        out[0].rank = 1;
        out[0].shape[0] = in[0].shape[0];
    }
    out[1] = (hp_type){.dtype = in[0].dtype, .rank = 0};
    return HP_OK;
}

hp_status hp__shape_nll_loss_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                      hp_err *err) {
    HP_TRY(nll_args(n, &in[1], &in[2], err));
    HP_TRY(same_dtype(&in[0], &in[1], err));
    bool none = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN) == HP_NLL_NONE;
    if (none ? (in[0].rank != 1 || in[0].shape[0] != in[1].shape[0]) : in[0].rank != 0)
        return hp_errf(err, HP_INVALID, "grad %s does not match the loss", DIMS(&in[0]));
    if (in[3].rank != 0) return hp_errf(err, HP_INVALID, "total_weight must be a scalar");
    out[0] = in[1];
    return HP_OK;
}

/* The fused cross entropy's (logits, target): nll_loss's, over logits, and a scalar loss. */
static hp_status ce_args(const hp_node *n, const hp_type *logits, const hp_type *target,
                         hp_err *err) {
    HP_TRY(need_rank(logits, 2, "logits", err));
    HP_TRY(need_float(logits, "logits", err));
    HP_TRY(need_rank(target, 1, "target", err));
    HP_TRY(need_int(target, "target", err));
    if (target->shape[0] != logits->shape[0])
        return hp_errf(err, HP_INVALID, "target %s does not match logits %s", DIMS(target),
                       DIMS(logits));
    int64_t r = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    if (r != HP_NLL_MEAN && r != HP_NLL_SUM)
        return hp_errf(err, HP_INVALID, "reduction %lld is not mean (1) or sum (2)", (long long)r);
    return HP_OK;
}

static hp_status need_f32_scalar(const hp_type *t, const char *what, hp_err *err) {
    if (t->dtype != HP_F32 || t->rank != 0)
        return hp_errf(err, HP_INVALID, "%s must be an f32 scalar, got %s %s", what,
                       hp_dtype_name(t->dtype), DIMS(t));
    return HP_OK;
}

hp_status hp__shape_fused_cross_entropy(const hp_node *n, const hp_type *in, hp_type *out,
                                        hp_err *err) {
    HP_TRY(ce_args(n, &in[0], &in[1], err));
    out[0] = out[1] = (hp_type){.dtype = HP_F32, .rank = 0};
    out[2] = (hp_type){.dtype = HP_F32, .rank = 1, .shape = {in[0].shape[0]}};
    return HP_OK;
}

hp_status hp__shape_fused_cross_entropy_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                                 hp_err *err) {
    HP_TRY(ce_args(n, &in[1], &in[2], err));
    HP_TRY(need_f32_scalar(&in[0], "grad", err));
    HP_TRY(need_f32_scalar(&in[4], "total_weight", err));
    if (in[3].dtype != HP_F32 || in[3].rank != 1 || in[3].shape[0] != in[1].shape[0])
        return hp_errf(err, HP_INVALID, "lse must be f32 [%lld] for logits %s, got %s %s",
                       (long long)in[1].shape[0], DIMS(&in[1]), hp_dtype_name(in[3].dtype),
                       DIMS(&in[3]));
    out[0] = in[1];
    return HP_OK;
}

hp_status hp__shape_swiglu(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)n;
    HP_TRY(need_float(&in[0], "a", err));
    HP_TRY(same_type(&in[0], &in[1], "a and b differ", err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_swiglu_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                    hp_err *err) {
    (void)n;
    HP_TRY(need_float(&in[0], "grad", err));
    HP_TRY(same_type(&in[0], &in[1], "grad and a differ", err));
    HP_TRY(same_type(&in[0], &in[2], "grad and b differ", err));
    out[0] = out[1] = in[0];
    return HP_OK;
}

/* ---- fused transformer ops ------------------------------------------------------------------ */

static hp_type drop_last(const hp_type *t, hp_dtype dt) {
    hp_type r = *t;
    r.dtype = dt;
    r.rank = t->rank - 1;
    return r;
}

hp_status hp__shape_rms_norm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    if (in[0].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(need_rank(&in[1], 1, "weight", err));
    HP_TRY(same_dtype(&in[0], &in[1], err));
    if (in[1].shape[0] != in[0].shape[in[0].rank - 1])
        return hp_errf(err, HP_INVALID, "weight %s does not match the last dim of %s", DIMS(&in[1]),
                       DIMS(&in[0]));
    HP_TRY(finite_attr(n, HP_ATTR_EPS, true, err));
    out[0] = in[0];
    out[1] = drop_last(&in[0], HP_F32);
    return HP_OK;
}

hp_status hp__shape_rms_norm_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                      hp_err *err) {
    HP_TRY(same_type(&in[0], &in[1], "grad and input differ", err));
    hp_type f[2];
    HP_TRY(need_float(&in[1], "input", err));
    if (in[1].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(need_rank(&in[2], 1, "weight", err));
    if (in[2].shape[0] != in[1].shape[in[1].rank - 1])
        return hp_errf(err, HP_INVALID, "weight %s does not match the last dim of %s", DIMS(&in[2]),
                       DIMS(&in[1]));
    HP_TRY(same_dtype(&in[1], &in[2], err));
    f[1] = drop_last(&in[1], HP_F32);
    HP_TRY(same_type(&in[3], &f[1], "rstd does not match the input", err));
    out[0] = in[1];
    out[1] = in[2];
    return HP_OK;
}

/* native_layer_norm's statistics: the input's shape with the normalized (last) dim 1, f32. */
static hp_type keep_last_1(const hp_type *t) {
    hp_type r = *t;
    r.dtype = HP_F32;
    r.shape[t->rank - 1] = 1;
    return r;
}

static hp_status layer_norm_affine(const hp_type *x, const hp_type *p, const char *what,
                                   hp_err *err) {
    HP_TRY(need_rank(p, 1, what, err));
    HP_TRY(same_dtype(x, p, err));
    if (p->shape[0] != x->shape[x->rank - 1])
        return hp_errf(err, HP_INVALID, "%s %s does not match the last dim of %s", what, DIMS(p),
                       DIMS(x));
    return HP_OK;
}

hp_status hp__shape_layer_norm(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    if (in[0].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    HP_TRY(layer_norm_affine(&in[0], &in[1], "weight", err));
    HP_TRY(layer_norm_affine(&in[0], &in[2], "bias", err));
    HP_TRY(finite_attr(n, HP_ATTR_EPS, true, err));
    out[0] = in[0];
    out[1] = out[2] = keep_last_1(&in[0]);
    return HP_OK;
}

hp_status hp__shape_layer_norm_backward(const hp_node *n, const hp_type *in, hp_type *out,
                                        hp_err *err) {
    (void)n;
    HP_TRY(same_type(&in[0], &in[1], "grad and input differ", err));
    HP_TRY(need_float(&in[1], "input", err));
    if (in[1].rank < 1) return hp_errf(err, HP_INVALID, "input must have rank >= 1");
    hp_type stat = keep_last_1(&in[1]);
    HP_TRY(same_type(&in[2], &stat, "mean does not match the input", err));
    HP_TRY(same_type(&in[3], &stat, "rstd does not match the input", err));
    HP_TRY(layer_norm_affine(&in[1], &in[4], "weight", err));
    out[0] = in[1];
    out[1] = out[2] = in[4];
    return HP_OK;
}

hp_status hp__shape_tril(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    if (in[0].rank < 2)
        return hp_errf(err, HP_INVALID, "input must have rank >= 2, got %s", DIMS(&in[0]));
    int64_t k = hp_node_int(n, HP_ATTR_DIAGONAL, 0);
    if (k < -HP_MAX_DIM || k > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "diagonal %lld out of range", (long long)k);
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_bitwise_not(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)n;
    if (in[0].dtype != HP_BOOL) HP_TRY(need_int(&in[0], "input (or bool)", err));
    out[0] = in[0];
    return HP_OK;
}

hp_status hp__shape_arange(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    (void)in;
    int64_t s = hp_node_int(n, HP_ATTR_START, 0), e = attr(n, HP_ATTR_END)->i;
    int64_t step = hp_node_int(n, HP_ATTR_STEP, 1);
    if (step < 1 || step > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "step %lld must be >= 1", (long long)step);
    if (s < -HP_MAX_NUMEL || s > HP_MAX_NUMEL || e < -HP_MAX_NUMEL || e > HP_MAX_NUMEL)
        return hp_errf(err, HP_INVALID, "range [%lld, %lld) out of bounds", (long long)s,
                       (long long)e);
    int64_t len = e > s ? (e - s + step - 1) / step : 0;
    if (len > HP_MAX_DIM)
        return hp_errf(err, HP_INVALID, "range [%lld, %lld) has more than %lld elements",
                       (long long)s, (long long)e, (long long)HP_MAX_DIM);
    const hp_attr *dt = attr(n, HP_ATTR_DTYPE);
    out[0].dtype = dt ? dt->dtype : HP_I64;
    if (out[0].dtype == HP_BOOL) return hp_errf(err, HP_INVALID, "arange of bool");
    out[0].rank = 1;
    out[0].shape[0] = len;
    return HP_OK;
}

hp_status hp__shape_rotary(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(need_float(&in[0], "input", err));
    HP_TRY(need_rank(&in[0], 4, "input [B, T, H, D]", err));
    if (in[0].shape[3] % 2)
        return hp_errf(err, HP_INVALID, "head dim %lld must be even", (long long)in[0].shape[3]);
    HP_TRY(finite_attr(n, HP_ATTR_THETA, true, err));
    HP_TRY(bool_attr(n, HP_ATTR_INVERSE, err));
    out[0] = in[0];
    return HP_OK;
}

/* q [B,H,T,D], k [B,Hkv,S,D], v [B,Hkv,S,Dv] */
static hp_status sdpa_args(const hp_node *n, const hp_type *q, const hp_type *k, const hp_type *v,
                           hp_err *err) {
    HP_TRY(need_float(q, "q", err));
    HP_TRY(need_rank(q, 4, "q [B, H, T, D]", err));
    HP_TRY(need_rank(k, 4, "k [B, Hkv, S, D]", err));
    HP_TRY(need_rank(v, 4, "v [B, Hkv, S, Dv]", err));
    HP_TRY(same_dtype(q, k, err));
    HP_TRY(same_dtype(q, v, err));
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0])
        return hp_errf(err, HP_INVALID, "batch dims differ: q %s, k %s, v %s", DIMS(q), DIMS(k),
                       DIMS(v));
    if (k->shape[1] != v->shape[1] || k->shape[2] != v->shape[2])
        return hp_errf(err, HP_INVALID, "k %s and v %s differ in heads or length", DIMS(k),
                       DIMS(v));
    if (k->shape[3] != q->shape[3])
        return hp_errf(err, HP_INVALID, "q %s and k %s differ in head dim", DIMS(q), DIMS(k));
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1])
        return hp_errf(err, HP_INVALID, "q heads %lld are not a multiple of kv heads %lld",
                       (long long)q->shape[1], (long long)k->shape[1]);
    HP_TRY(finite_attr(n, HP_ATTR_SCALE, true, err));
    HP_TRY(bool_attr(n, HP_ATTR_CAUSAL, err));
    return HP_OK;
}

hp_status hp__shape_sdpa(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(sdpa_args(n, &in[0], &in[1], &in[2], err));
    out[0] = in[0];
    out[0].shape[3] = in[2].shape[3];
    out[1] = drop_last(&in[0], HP_F32);
    return HP_OK;
}

hp_status hp__shape_sdpa_backward(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err) {
    HP_TRY(sdpa_args(n, &in[1], &in[2], &in[3], err));
    hp_type o[2];
    HP_TRY(hp__shape_sdpa(n, in + 1, o, err));
    HP_TRY(same_type(&in[0], &o[0], "grad_out does not match the output", err));
    HP_TRY(same_type(&in[4], &o[0], "out does not match q and v", err));
    HP_TRY(same_type(&in[5], &o[1], "logsumexp does not match q", err));
    out[0] = in[1];
    out[1] = in[2];
    out[2] = in[3];
    return HP_OK;
}
