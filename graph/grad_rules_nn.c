/* graph/grad_rules_nn.c — the gradient rules of the matrix products and the NN ops: embedding,
 * softmax family, nll_loss, fused RMSNorm, rotary embedding and flash attention. Most map to
 * the ATen backward op of the same family, fed with the forward's saved outputs (logsumexp,
 * rstd, the log-probabilities), so the joint graph reads like a make_fx trace.
 * Conventions as in grad_rules.c.
 */
#include "graph/grad_internal.h"

#include "hp/build.h"

/* ---- matrix products ------------------------------------------------------------------------ */

/* grad_a = grad @ b^T, grad_b = a^T @ grad (of a widened product mm{dtype=f32}, the grad cast
 * back to the operands' dtype first) */
hp_status hp__grad_mm(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value a = n->in[0], b = n->in[1], go = gout[0];
    const hp_type *at = hp_graph_type(g, a), *gt = hp_graph_type(g, go);
    if (at && gt && at->dtype != gt->dtype) go = hp_to(g, go, at->dtype);
    if (hp__grad_need(fwd, 0)) gin[0] = hp_mm(g, go, hp_t(g, b));
    if (hp__grad_need(fwd, 1)) gin[1] = hp_mm(g, hp_t(g, a), go);
    return HP_OK;
}

hp_status hp__grad_bmm(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value a = n->in[0], b = n->in[1];
    if (hp__grad_need(fwd, 0)) gin[0] = hp_bmm(g, gout[0], hp_transpose(g, b, 1, 2));
    if (hp__grad_need(fwd, 1)) gin[1] = hp_bmm(g, hp_transpose(g, a, 1, 2), gout[0]);
    return HP_OK;
}

/* addmm(bias, a, b) = beta * bias + alpha * a @ b: bias gets beta * grad summed to its shape,
 * a and b the mm gradients times alpha. */
hp_status hp__grad_addmm(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                         hp_value *gin) {
    const hp_node *n = &fwd->node;
    double beta = hp_node_float(n, HP_ATTR_BETA, 1.0);
    double alpha = hp_node_float(n, HP_ATTR_ALPHA, 1.0);
    hp_value a = n->in[1], b = n->in[2];
    if (hp__grad_need(fwd, 0)) {
        hp_value gb = beta == 1.0 ? gout[0] : hp_mul_scalar(g, gout[0], beta);
        gin[0] = hp__grad_sum_to(g, gb, hp_graph_type(g, n->in[0]));
    }
    if (hp__grad_need(fwd, 1)) {
        gin[1] = hp_mm(g, gout[0], hp_t(g, b));
        if (alpha != 1.0) gin[1] = hp_mul_scalar(g, gin[1], alpha);
    }
    if (hp__grad_need(fwd, 2)) {
        gin[2] = hp_mm(g, hp_t(g, a), gout[0]);
        if (alpha != 1.0) gin[2] = hp_mul_scalar(g, gin[2], alpha);
    }
    return HP_OK;
}

/* ---- embedding ------------------------------------------------------------------------------ */

/* embedding_dense_backward(grad, indices){num_weights = V, padding_idx}; the indices take no
 * gradient (they are integers and never vary). */
hp_status hp__grad_embedding(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                             hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp__grad_need(fwd, 0)) return HP_OK;
    hp_attr a[2];
    int na = 0;
    a[na++] = hp_attr_int(HP_ATTR_NUM_WEIGHTS, hp_graph_type(g, n->in[0])->shape[0]);
    const hp_attr *pad = hp_node_attr(n, HP_ATTR_PADDING_IDX);
    if (pad) a[na++] = *pad;
    hp_value in[2] = {gout[0], n->in[1]};
    gin[0] = hp_build(g, HP_OP_EMBEDDING_DENSE_BACKWARD, in, 2, a, na);
    return HP_OK;
}

/* ---- softmax family ------------------------------------------------------------------------- */

/* _log_softmax_backward_data(grad, output){dim}: the forward's attributes are exactly {dim}. */
hp_status hp__grad_log_softmax(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                               hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value in[2] = {gout[0], hp__grad_self(fwd, 0)};
    gin[0] = hp_build(g, HP_OP_LOG_SOFTMAX_BACKWARD, in, 2, n->attrs, n->n_attrs);
    return HP_OK;
}

hp_status hp__grad_softmax(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_value in[2] = {gout[0], hp__grad_self(fwd, 0)};
    gin[0] = hp_build(g, HP_OP_SOFTMAX_BACKWARD, in, 2, n->attrs, n->n_attrs);
    return HP_OK;
}

/* nll_loss_backward(grad, logp, target, total_weight){reduction, ignore_index}, the attributes
 * being the forward's. total_weight (output 1) is constant: autodiff never sends it a
 * gradient. */
hp_status hp__grad_nll_loss(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                            hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp_value_ok(gout[0]) || !hp__grad_need(fwd, 0)) return HP_OK;
    hp_value in[4] = {gout[0], n->in[0], n->in[1], hp__grad_self(fwd, 1)};
    gin[0] = hp_build(g, HP_OP_NLL_LOSS_BACKWARD, in, 4, n->attrs, n->n_attrs);
    return HP_OK;
}

/* ---- fused ops ------------------------------------------------------------------------------ */

/* _fused_rms_norm_backward(grad_y, x, w, rstd) -> (grad_x, grad_w). rstd (output 1) takes no
 * gradient: autodiff refuses a path through it. */
hp_status hp__grad_rms_norm(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                            hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp_value_ok(gout[0])) return HP_OK;
    hp_value in[4] = {gout[0], n->in[0], n->in[1], hp__grad_self(fwd, 1)};
    hp_value r = hp_build(g, HP_OP_RMS_NORM_BACKWARD, in, 4, NULL, 0);
    if (hp__grad_need(fwd, 0)) gin[0] = hp_out(r, 0);
    if (hp__grad_need(fwd, 1)) gin[1] = hp_out(r, 1);
    return HP_OK;
}

/* native_layer_norm_backward(grad_y, x, mean, rstd, w) -> (grad_x, grad_w, grad_b). mean and
 * rstd (outputs 1, 2) take no gradient: autodiff refuses a path through them. */
hp_status hp__grad_layer_norm(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                              hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp_value_ok(gout[0])) return HP_OK;
    hp_value in[5] = {gout[0], n->in[0], hp__grad_self(fwd, 1), hp__grad_self(fwd, 2), n->in[1]};
    hp_value r = hp_build(g, HP_OP_LAYER_NORM_BACKWARD, in, 5, NULL, 0);
    for (int i = 0; i < 3; i++)
        if (hp__grad_need(fwd, i)) gin[i] = hp_out(r, i);
    return HP_OK;
}

/* tril is a mask: its gradient is the same mask on the gradient. */
hp_status hp__grad_tril(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    gin[0] = hp_build(g, HP_OP_TRIL, &gout[0], 1, n->attrs, n->n_attrs);
    return HP_OK;
}

/* A rotation's gradient is the inverse rotation. */
hp_status hp__grad_rotary(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                          hp_value *gin) {
    const hp_node *n = &fwd->node;
    hp_attr a[2] = {hp_attr_float(HP_ATTR_THETA, hp_node_float(n, HP_ATTR_THETA, 0.0)),
                    hp_attr_int(HP_ATTR_INVERSE, !hp_node_int(n, HP_ATTR_INVERSE, 0))};
    gin[0] = hp_build(g, HP_OP_ROTARY_EMB, &gout[0], 1, a, 2);
    return HP_OK;
}

/* _scaled_dot_product_flash_attention_backward(grad_out, q, k, v, out, logsumexp){scale,
 * causal} -> (grad_q, grad_k, grad_v), the attributes being the forward's. */
hp_status hp__grad_sdpa(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout, hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp_value_ok(gout[0])) return HP_OK;
    hp_value in[6] = {
        gout[0], n->in[0], n->in[1], n->in[2], hp__grad_self(fwd, 0), hp__grad_self(fwd, 1)};
    hp_value r = hp_build(g, HP_OP_SDPA_BACKWARD, in, 6, n->attrs, n->n_attrs);
    for (int i = 0; i < 3; i++)
        if (hp__grad_need(fwd, i)) gin[i] = hp_out(r, i);
    return HP_OK;
}

/* Dropout's gradient reuses the forward's mask (its output 1): grad * mask / (1 - p), as ATen's
 * native_dropout_backward, so the backward never draws again. */
hp_status hp__grad_dropout(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                           hp_value *gin) {
    const hp_node *n = &fwd->node;
    if (!hp_value_ok(gout[0])) return HP_OK;
    hp_value in[2] = {gout[0], hp__grad_self(fwd, 1)};
    hp_attr a = hp_attr_float(HP_ATTR_SCALE, 1.0 / (1.0 - hp_node_float(n, HP_ATTR_P, 0.0)));
    gin[0] = hp_build(g, HP_OP_NATIVE_DROPOUT_BACKWARD, in, 2, &a, 1);
    return HP_OK;
}
