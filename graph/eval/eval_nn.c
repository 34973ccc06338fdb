/* graph/eval/eval_nn.c — reference kernels for the neural-network ops: embedding and its dense
 * backward, (log_)softmax and their backwards, nll_loss forward/backward, fused RMSNorm and
 * its backward, rotary embedding. (Attention lives in eval_attention.c.) Each is the textbook
 * formula of docs/op-semantics.md over doubles; the only runtime errors are data-dependent
 * indices (embedding ids, nll targets), reported with the offending value and position.
 */
#include "graph/eval/eval_internal.h"

#include <math.h>

/* An index read from an integer tensor, checked against [0, limit). NaN fails the test. */
static hp_status check_index(double v, int64_t limit, const char *what, int64_t pos, hp_err *err) {
    if (!(v >= 0 && v < (double)limit))
        return hp_errf(err, HP_INVALID, "%s %.0f at position %lld out of range [0, %lld)", what, v,
                       (long long)pos, (long long)limit);
    return HP_OK;
}

/* ---- embedding ------------------------------------------------------------------------------ */

/* embedding(weight [V, D], idx [...]) -> [..., D]. padding_idx only matters for the gradient. */
HP__EVAL_KERNEL(hp__eval_embedding) {
    const hp_type *w = &in[0]->type;
    int64_t v = w->shape[0], d = w->shape[1], n_idx = hp__eval_numel(in[1]);
    for (int64_t i = 0; i < n_idx; i++) {
        double id = in[1]->data[i];
        HP_TRY(check_index(id, v, "index", i, err));
        const double *row = in[0]->data + (int64_t)id * d;
        for (int64_t c = 0; c < d; c++) out[0].data[i * d + c] = row[c];
    }
    return HP_OK;
}

/* embedding_dense_backward(g [..., D], idx [...]){num_weights, padding_idx} -> [num_weights, D]:
 * rows of g summed into the rows their index names; the padding row stays zero. */
HP__EVAL_KERNEL(hp__eval_embedding_backward) {
    int64_t v = out[0].type.shape[0], d = out[0].type.shape[1], n_idx = hp__eval_numel(in[1]);
    int64_t pad = hp_node_int(n, HP_ATTR_PADDING_IDX, -1);
    for (int64_t i = 0; i < n_idx; i++) {
        double id = in[1]->data[i];
        HP_TRY(check_index(id, v, "index", i, err));
        if ((int64_t)id == pad) continue;
        double *row = out[0].data + (int64_t)id * d;
        for (int64_t c = 0; c < d; c++) row[c] += in[0]->data[i * d + c];
    }
    return HP_OK;
}

/* chunked_embedding(weight [V, D], idx [...], base [k]) -> [..., D]: for each chunk c of
 * R = V / k rows, the indices in [base[c], base[c] + R) read row c * R + idx - base[c]; the
 * others add nothing. */
HP__EVAL_KERNEL(hp__eval_chunked_embedding) {
    (void)n;
    int64_t v = in[0]->type.shape[0], d = in[0]->type.shape[1], n_idx = hp__eval_numel(in[1]);
    int64_t k = in[2]->type.shape[0], rows = v / k;
    for (int64_t i = 0; i < n_idx; i++) {
        double *y = out[0].data + i * d;
        for (int64_t c = 0; c < k; c++) {
            double at = in[1]->data[i] - in[2]->data[c];
            if (at < 0 || at >= (double)rows) continue;
            const double *row = in[0]->data + (c * rows + (int64_t)at) * d;
            for (int64_t e = 0; e < d; e++) y[e] += row[e];
        }
    }
    (void)err;
    return HP_OK;
}

/* chunked_embedding_backward(g [..., D], idx [...], base [k]){num_weights} -> [num_weights, D]:
 * rows of g summed into the row each chunk holding their index names. */
HP__EVAL_KERNEL(hp__eval_chunked_embedding_backward) {
    (void)n;
    int64_t v = out[0].type.shape[0], d = out[0].type.shape[1], n_idx = hp__eval_numel(in[1]);
    int64_t k = in[2]->type.shape[0], rows = v / k;
    for (int64_t i = 0; i < n_idx; i++) {
        for (int64_t c = 0; c < k; c++) {
            double at = in[1]->data[i] - in[2]->data[c];
            if (at < 0 || at >= (double)rows) continue;
            double *row = out[0].data + (c * rows + (int64_t)at) * d;
            for (int64_t e = 0; e < d; e++) row[e] += in[0]->data[i * d + e];
        }
    }
    (void)err;
    return HP_OK;
}

/* ---- softmax family ------------------------------------------------------------------------- */

/* The [outer, len, inner] view around the node's dim attribute. */
static void softmax_lines(const hp_node *n, const hp_type *t, int64_t *outer, int64_t *len,
                          int64_t *inner) {
    int dim = 0;
    if (t->rank > 0) {
        hp_status st = hp__norm_dim(hp_node_int(n, HP_ATTR_DIM, 0), t->rank, "dim", &dim, NULL);
        HP_ASSERT(st == HP_OK);
        hp__eval_split(t, dim, outer, len, inner);
    } else { /* a scalar is one line of one element */
        *outer = *len = *inner = 1;
    }
}

/* _softmax / _log_softmax: max-shifted, so large logits do not overflow. */
HP__EVAL_KERNEL(hp__eval_softmax) {
    int64_t outer, len, inner;
    softmax_lines(n, &in[0]->type, &outer, &len, &inner);
    bool log_out = n->op == HP_OP_LOG_SOFTMAX;
    if (len == 0) return HP_OK; /* nothing to normalise */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const double *x = in[0]->data + o * len * inner + i;
            double *y = out[0].data + o * len * inner + i;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; j++)
                if (x[j * inner] > m || isnan(x[j * inner])) m = x[j * inner];
            for (int64_t j = 0; j < len; j++) sum += exp(x[j * inner] - m);
            double lse = m + log(sum);
            for (int64_t j = 0; j < len; j++)
                y[j * inner] = log_out ? x[j * inner] - lse : exp(x[j * inner] - lse);
        }
    return HP_OK;
}

/* _log_softmax_backward_data(g, out) = g − exp(out)·Σg;
 * _softmax_backward_data(g, out) = out·(g − Σ g·out). Sums along the node's dim. */
HP__EVAL_KERNEL(hp__eval_softmax_backward) {
    int64_t outer, len, inner;
    softmax_lines(n, &out[0].type, &outer, &len, &inner);
    bool log_out = n->op == HP_OP_LOG_SOFTMAX_BACKWARD;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            const double *g = in[0]->data + base, *y = in[1]->data + base;
            double *gx = out[0].data + base;
            double s = 0;
            for (int64_t j = 0; j < len; j++)
                s += log_out ? g[j * inner] : g[j * inner] * y[j * inner];
            for (int64_t j = 0; j < len; j++)
                gx[j * inner] = log_out ? g[j * inner] - exp(y[j * inner]) * s
                                        : y[j * inner] * (g[j * inner] - s);
        }
    return HP_OK;
}

/* ---- nll_loss ------------------------------------------------------------------------------- */

/* logp [N, C] (the shape rule allows no other rank). */
static void nll_dims(const hp_type *logp, int64_t *rows, int64_t *classes) {
    *rows = logp->shape[0];
    *classes = logp->shape[1];
}

/* A target that is not ignore_index, checked against [0, C); *skip for an ignored one. */
static hp_status nll_target(double t, int64_t classes, int64_t ignore, int64_t row, bool *skip,
                            hp_err *err) {
    *skip = t == (double)ignore;
    if (*skip) return HP_OK;
    return check_index(t, classes, "target", row, err);
}

/* nll_loss_forward(logp, target){reduction, ignore_index} -> (loss, total_weight). */
HP__EVAL_KERNEL(hp__eval_nll_loss) {
    int64_t rows, classes;
    nll_dims(&in[0]->type, &rows, &classes);
    int64_t red = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(n, HP_ATTR_IGNORE_INDEX, -100);
    double sum = 0, count = 0;
    for (int64_t r = 0; r < rows; r++) {
        bool skip;
        double t = in[1]->data[r];
        HP_TRY(nll_target(t, classes, ignore, r, &skip, err));
        double l = skip ? 0.0 : -in[0]->data[r * classes + (int64_t)t];
        if (red == HP_NLL_NONE) out[0].data[r] = l;
        sum += l;
        count += !skip;
    }
    if (red == HP_NLL_MEAN) out[0].data[0] = sum / count; /* all ignored: 0/0 = NaN, as torch */
    if (red == HP_NLL_SUM) out[0].data[0] = sum;
    out[1].data[0] = count;
    return HP_OK;
}

/* nll_loss_backward(g, logp, target, total_weight) -> [N, C]: −g (÷ total_weight for mean) at
 * each row's target, zero elsewhere and on ignored rows. */
HP__EVAL_KERNEL(hp__eval_nll_loss_backward) {
    int64_t rows, classes;
    nll_dims(&in[1]->type, &rows, &classes);
    int64_t red = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(n, HP_ATTR_IGNORE_INDEX, -100);
    double total_weight = in[3]->data[0];
    for (int64_t r = 0; r < rows; r++) {
        bool skip;
        double t = in[2]->data[r];
        HP_TRY(nll_target(t, classes, ignore, r, &skip, err));
        if (skip) continue;
        double g = red == HP_NLL_NONE ? in[0]->data[r] : in[0]->data[0];
        if (red == HP_NLL_MEAN) g /= total_weight;
        out[0].data[r * classes + (int64_t)t] = -g;
    }
    return HP_OK;
}

/* ---- the fused cross entropy ---------------------------------------------------------------- */

/* fused_cross_entropy(logits, target){reduction, ignore_index} -> (loss, total_weight, lse):
 * nll_loss_forward of _log_softmax(logits, 1), with each row's logsumexp kept. */
HP__EVAL_KERNEL(hp__eval_fused_cross_entropy) {
    int64_t rows, classes;
    nll_dims(&in[0]->type, &rows, &classes);
    int64_t red = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(n, HP_ATTR_IGNORE_INDEX, -100);
    double sum = 0, count = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0]->data + r * classes;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < classes; c++)
            if (x[c] > m || isnan(x[c])) m = x[c];
        for (int64_t c = 0; c < classes; c++) s += exp(x[c] - m);
        double lse = m == -INFINITY ? -INFINITY : m + log(s); /* ln 0 for a row of −inf */
        out[2].data[r] = lse;
        bool skip;
        double t = in[1]->data[r];
        HP_TRY(nll_target(t, classes, ignore, r, &skip, err));
        if (skip) continue;
        sum += lse - x[(int64_t)t];
        count++;
    }
    out[0].data[0] = red == HP_NLL_MEAN ? sum / count : sum; /* all ignored: NaN, as torch */
    out[1].data[0] = count;
    return HP_OK;
}

/* fused_cross_entropy_backward(g, logits, target, lse, total_weight) -> g'·(exp(logits − lse) −
 * onehot(target)), g' = g (÷ total_weight for mean); ignored rows zero. */
HP__EVAL_KERNEL(hp__eval_fused_cross_entropy_backward) {
    int64_t rows, classes;
    nll_dims(&in[1]->type, &rows, &classes);
    int64_t red = hp_node_int(n, HP_ATTR_REDUCTION, HP_NLL_MEAN);
    int64_t ignore = hp_node_int(n, HP_ATTR_IGNORE_INDEX, -100);
    double g = in[0]->data[0];
    if (red == HP_NLL_MEAN) g /= in[4]->data[0];
    for (int64_t r = 0; r < rows; r++) {
        bool skip;
        double t = in[2]->data[r];
        HP_TRY(nll_target(t, classes, ignore, r, &skip, err));
        const double *x = in[1]->data + r * classes;
        double *gx = out[0].data + r * classes, lse = in[3]->data[r];
        for (int64_t c = 0; c < classes; c++)
            gx[c] = skip ? 0.0 : g * (exp(x[c] - lse) - (c == (int64_t)t ? 1.0 : 0.0));
    }
    return HP_OK;
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */

/* _fused_rms_norm(x [..., D], w [D]){eps} -> (y = x·rstd·w, rstd [...]),
 * rstd = 1/sqrt(mean(x², last dim) + eps). */
HP__EVAL_KERNEL(hp__eval_rms_norm) {
    const hp_type *t = &in[0]->type;
    int64_t d = t->rank > 0 ? t->shape[t->rank - 1] : 1;
    int64_t rows = d > 0 ? hp__eval_numel(in[0]) / d : hp__eval_numel(&out[1]);
    double eps = hp_node_float(n, HP_ATTR_EPS, 0);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0]->data + r * d;
        double ss = 0;
        for (int64_t c = 0; c < d; c++) ss += x[c] * x[c];
        double rstd = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t c = 0; c < d; c++) out[0].data[r * d + c] = x[c] * rstd * in[1]->data[c];
        out[1].data[r] = rstd;
    }
    return HP_OK;
}

/* (gy, x, w, rstd) -> (gx, gw): gw = Σ_rows gy·x·rstd;
 * gx = rstd·(gy·w − x·rstd²·mean(gy·w·x, last dim)). */
HP__EVAL_KERNEL(hp__eval_rms_norm_backward) {
    const hp_type *t = &in[1]->type;
    int64_t d = t->rank > 0 ? t->shape[t->rank - 1] : 1;
    int64_t rows = d > 0 ? hp__eval_numel(in[1]) / d : hp__eval_numel(in[3]);
    const double *w = in[2]->data;
    for (int64_t r = 0; r < rows; r++) {
        const double *gy = in[0]->data + r * d, *x = in[1]->data + r * d;
        double rstd = in[3]->data[r], dot = 0;
        for (int64_t c = 0; c < d; c++) dot += gy[c] * w[c] * x[c];
        double mean = dot / (double)d;
        for (int64_t c = 0; c < d; c++) {
            out[0].data[r * d + c] = rstd * (gy[c] * w[c] - x[c] * rstd * rstd * mean);
            out[1].data[c] += gy[c] * x[c] * rstd;
        }
    }
    return HP_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------------------ */

/* native_layer_norm(x [..., D], w [D], b [D]){eps} -> (y, mean, rstd [..., 1]):
 * mean and the biased variance over the last dim, rstd = 1/sqrt(var + eps),
 * y = (x − mean)·rstd·w + b. */
HP__EVAL_KERNEL(hp__eval_layer_norm) {
    const hp_type *t = &in[0]->type;
    int64_t d = t->shape[t->rank - 1];
    int64_t rows = hp__eval_numel(&out[1]);
    double eps = hp_node_float(n, HP_ATTR_EPS, 0);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0]->data + r * d;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < d; c++) mean += x[c];
        mean = d > 0 ? mean / (double)d : 0;
        for (int64_t c = 0; c < d; c++) var += (x[c] - mean) * (x[c] - mean);
        var = d > 0 ? var / (double)d : 0;
        double rstd = 1.0 / sqrt(var + eps);
        for (int64_t c = 0; c < d; c++)
            out[0].data[r * d + c] = (x[c] - mean) * rstd * in[1]->data[c] + in[2]->data[c];
        out[1].data[r] = mean;
        out[2].data[r] = rstd;
    }
    return HP_OK;
}

/* (gy, x, mean, rstd, w) -> (gx, gw, gb): with x̂ = (x − mean)·rstd and g = gy·w,
 * gx = rstd·(g − mean(g) − x̂·mean(g·x̂)), gw = Σ_rows gy·x̂, gb = Σ_rows gy. */
HP__EVAL_KERNEL(hp__eval_layer_norm_backward) {
    (void)n;
    const hp_type *t = &in[1]->type;
    int64_t d = t->shape[t->rank - 1];
    int64_t rows = hp__eval_numel(in[2]);
    const double *w = in[4]->data;
    for (int64_t r = 0; r < rows; r++) {
        const double *gy = in[0]->data + r * d, *x = in[1]->data + r * d;
        double mu = in[2]->data[r], rstd = in[3]->data[r], sg = 0, sgx = 0;
        for (int64_t c = 0; c < d; c++) {
            double xh = (x[c] - mu) * rstd, g = gy[c] * w[c];
            sg += g;
            sgx += g * xh;
            out[1].data[c] += gy[c] * xh;
            out[2].data[c] += gy[c];
        }
        sg /= (double)d;
        sgx /= (double)d;
        for (int64_t c = 0; c < d; c++) {
            double xh = (x[c] - mu) * rstd;
            out[0].data[r * d + c] = rstd * (gy[c] * w[c] - sg - xh * sgx);
        }
    }
    return HP_OK;
}

/* ---- rotary embedding ----------------------------------------------------------------------- */

/* rotary_emb(x [B, T, H, D]){theta, inverse}: pair i of position t rotated by
 * a = t·theta^(−2i/D) (−a when inverse). */
HP__EVAL_KERNEL(hp__eval_rotary) {
    const int64_t *s = in[0]->type.shape;
    int64_t nb = s[0], nt = s[1], nh = s[2], d = s[3];
    double theta = hp_node_float(n, HP_ATTR_THETA, 10000.0);
    double sign = hp_node_int(n, HP_ATTR_INVERSE, 0) ? -1.0 : 1.0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++)
            for (int64_t h = 0; h < nh; h++) {
                int64_t base = ((b * nt + t) * nh + h) * d;
                for (int64_t i = 0; i < d / 2; i++) {
                    double a = sign * (double)t * pow(theta, -2.0 * (double)i / (double)d);
                    double c = cos(a), sn = sin(a);
                    double x0 = in[0]->data[base + 2 * i], x1 = in[0]->data[base + 2 * i + 1];
                    out[0].data[base + 2 * i] = x0 * c - x1 * sn;
                    out[0].data[base + 2 * i + 1] = x0 * sn + x1 * c;
                }
            }
    return HP_OK;
}
