/* graph/eval/eval_elementwise.c — reference kernels for creation ops (full, zeros, ones),
 * broadcasting binary ops (add sub mul div maximum eq lt where), scalar and unary math, and
 * the elementwise backward pairs (tanh/sigmoid/silu/gelu/threshold). Formulas follow
 * docs/op-semantics.md; outputs are rounded by the driver, not here.
 */
#include "graph/eval/eval_internal.h"

#include <math.h>

#define SQRT_2_OVER_PI 0.79788456080286535588 /* sqrt(2/pi), gelu's tanh approximation */
#define INV_SQRT_2     0.70710678118654752440
#define INV_SQRT_2PI   0.39894228040143267794 /* 1/sqrt(2 pi), the normal density at 0 */
#define GELU_C         0.044715

/* ---- creation ------------------------------------------------------------------------------- */

HP__EVAL_KERNEL(hp__eval_creation) {
    double v = n->op == HP_OP_FULL ? hp_node_float(n, HP_ATTR_VALUE, 0) : n->op == HP_OP_ONES;
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++) out[0].data[i] = v;
    return HP_OK;
}

/* ---- broadcasting --------------------------------------------------------------------------- */

/* Walks out's elements; off[k] is the offset of input k (broadcast) at each one. Calls f with
 * the output position and the input offsets. An odometer keeps the offsets incremental. */
typedef struct bcast {
    int rank, n_in;
    int64_t shape[HP_MAX_RANK];
    int64_t st[3][HP_MAX_RANK];
    int64_t idx[HP_MAX_RANK];
    int64_t off[3];
} bcast;

static void bcast_init(bcast *b, const hp_type *out, int n_in, const hp_tensor *const *in) {
    *b = (bcast){.rank = out->rank, .n_in = n_in};
    for (int d = 0; d < out->rank; d++) b->shape[d] = out->shape[d];
    for (int k = 0; k < n_in; k++) hp__eval_bcast_strides(&in[k]->type, out, b->st[k]);
}

static void bcast_next(bcast *b) {
    for (int d = b->rank - 1; d >= 0; d--) {
        b->idx[d]++;
        for (int k = 0; k < b->n_in; k++) b->off[k] += b->st[k][d];
        if (b->idx[d] < b->shape[d]) return;
        for (int k = 0; k < b->n_in; k++) b->off[k] -= b->st[k][d] * b->shape[d];
        b->idx[d] = 0;
    }
}

/* ---- binary --------------------------------------------------------------------------------- */

static double nan_max(double a, double b) {
    if (isnan(a) || isnan(b)) return NAN; /* torch.maximum propagates NaN */
    return a > b ? a : b;
}

HP__EVAL_KERNEL(hp__eval_binary) {
    const double *a = in[0]->data, *b = in[1]->data;
    double *y = out[0].data;
    bool int_div = n->op == HP_OP_DIV && !hp_dtype_is_float(in[0]->type.dtype);
    bcast it;
    bcast_init(&it, &out[0].type, 2, in);
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++, bcast_next(&it)) {
        double x0 = a[it.off[0]], x1 = b[it.off[1]];
        double r = 0;
        switch (n->op) {
        case HP_OP_ADD:
            r = x0 + x1;
            break;
        case HP_OP_SUB:
            r = x0 - x1;
            break;
        case HP_OP_MUL:
            r = x0 * x1;
            break;
        case HP_OP_DIV:
            if (int_div && x1 == 0)
                return hp_errf(err, HP_INVALID, "integer division by zero at element %lld",
                               (long long)i);
            r = x0 / x1;
            break;
        case HP_OP_MAXIMUM:
            r = nan_max(x0, x1);
            break;
        case HP_OP_EQ:
            r = x0 == x1;
            break;
        case HP_OP_LT:
            r = x0 < x1;
            break;
        default:
            HP_ASSERT(!"not a binary op");
        }
        y[i] = r;
    }
    return HP_OK;
}

HP__EVAL_KERNEL(hp__eval_where) {
    bcast it;
    bcast_init(&it, &out[0].type, 3, in);
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++, bcast_next(&it))
        out[0].data[i] =
            in[0]->data[it.off[0]] != 0 ? in[1]->data[it.off[1]] : in[2]->data[it.off[2]];
    return HP_OK;
}

/* ---- unary ---------------------------------------------------------------------------------- */

static double sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}

static double gelu(double x, bool tanh_approx) {
    if (tanh_approx) return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
    return 0.5 * x * (1.0 + erf(x * INV_SQRT_2));
}

static double gelu_grad(double x, bool tanh_approx) {
    if (tanh_approx) {
        double u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
        double du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
        double t = tanh(u);
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
    }
    double cdf = 0.5 * (1.0 + erf(x * INV_SQRT_2));
    double pdf = INV_SQRT_2PI * exp(-0.5 * x * x);
    return cdf + x * pdf;
}

HP__EVAL_KERNEL(hp__eval_unary) {
    const double *x = in[0]->data;
    double *y = out[0].data;
    int64_t numel = hp__eval_numel(&out[0]);
    double v = hp_node_float(n, HP_ATTR_VALUE, 0);
    double e = hp_node_float(n, HP_ATTR_EXPONENT, 1);
    bool approx = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0;
    for (int64_t i = 0; i < numel; i++) {
        double a = x[i], r = 0;
        switch (n->op) {
        case HP_OP_ADD_SCALAR:
            r = a + v;
            break;
        case HP_OP_MUL_SCALAR:
            r = a * v;
            break;
        case HP_OP_POW:
            r = pow(a, e);
            break;
        case HP_OP_NEG:
            r = -a;
            break;
        case HP_OP_EXP:
            r = exp(a);
            break;
        case HP_OP_LOG:
            r = log(a);
            break;
        case HP_OP_SQRT:
            r = sqrt(a);
            break;
        case HP_OP_RSQRT:
            r = 1.0 / sqrt(a);
            break;
        case HP_OP_TANH:
            r = tanh(a);
            break;
        case HP_OP_SIN:
            r = sin(a);
            break;
        case HP_OP_COS:
            r = cos(a);
            break;
        case HP_OP_ERF:
            r = erf(a);
            break;
        case HP_OP_SIGMOID:
            r = sigmoid(a);
            break;
        case HP_OP_SILU:
            r = a * sigmoid(a);
            break;
        case HP_OP_GELU:
            r = gelu(a, approx);
            break;
        case HP_OP_RELU:
            r = a < 0 ? 0.0 : a;
            break; /* NaN stays NaN, as torch.relu */
        default:
            HP_ASSERT(!"not a unary op");
        }
        y[i] = r;
    }
    return HP_OK;
}

/* ---- backward pairs: (grad, saved) -> grad_in ------------------------------------------------ */

/* swiglu(a, b) = silu(a)·b; swiglu_backward(g, a, b) = (g·b·silu'(a), g·silu(a)). The
 * operands share one type (the shape rule). */
HP__EVAL_KERNEL(hp__eval_swiglu) {
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++) {
        double a = in[0]->data[i];
        out[0].data[i] = a * sigmoid(a) * in[1]->data[i];
    }
    return HP_OK;
}

HP__EVAL_KERNEL(hp__eval_swiglu_backward) {
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++) {
        double g = in[0]->data[i], a = in[1]->data[i], b = in[2]->data[i], sg = sigmoid(a);
        out[0].data[i] = g * b * sg * (1.0 + a * (1.0 - sg));
        out[1].data[i] = g * a * sg;
    }
    return HP_OK;
}

HP__EVAL_KERNEL(hp__eval_backward_pair) {
    double v = hp_node_float(n, HP_ATTR_VALUE, 0);
    bool approx = hp_node_int(n, HP_ATTR_APPROXIMATE, 0) != 0;
    bcast it;
    bcast_init(&it, &out[0].type, 2, in);
    int64_t numel = hp__eval_numel(&out[0]);
    for (int64_t i = 0; i < numel; i++, bcast_next(&it)) {
        double g = in[0]->data[it.off[0]], s = in[1]->data[it.off[1]], r = 0;
        switch (n->op) {
        case HP_OP_TANH_BACKWARD:
            r = g * (1.0 - s * s);
            break;
        case HP_OP_SIGMOID_BACKWARD:
            r = g * s * (1.0 - s);
            break;
        case HP_OP_SILU_BACKWARD: {
            double sg = sigmoid(s);
            r = g * sg * (1.0 + s * (1.0 - sg));
            break;
        }
        case HP_OP_GELU_BACKWARD:
            r = g * gelu_grad(s, approx);
            break;
        case HP_OP_THRESHOLD_BACKWARD:
            r = s > v ? g : 0.0;
            break;
        default:
            HP_ASSERT(!"not a backward pair");
        }
        out[0].data[i] = r;
    }
    return HP_OK;
}
