/* hp/build.h — one-line builder helpers over hp_build, for model builders and gradient
 * rules. Each returns output 0 of the new node, or HP_NO_VALUE with the sticky error set on
 * the graph (so callers check hp_graph_failed once at the end). Multi-output ops return the
 * node's output 0; take the others with hp_out(v, k).
 */
#ifndef HP_BUILD_H
#define HP_BUILD_H

#include "hp/graph.h"

static inline hp_value hp_un(hp_graph *g, hp_op op, hp_value x) {
    return hp_build(g, op, &x, 1, NULL, 0);
}
static inline hp_value hp_bin(hp_graph *g, hp_op op, hp_value a, hp_value b) {
    hp_value in[2] = {a, b};
    return hp_build(g, op, in, 2, NULL, 0);
}
static inline hp_value hp_un1(hp_graph *g, hp_op op, hp_value x, hp_attr a) {
    return hp_build(g, op, &x, 1, &a, 1);
}

#define hp_add(g, a, b)  hp_bin(g, HP_OP_ADD, a, b)
#define hp_sub(g, a, b)  hp_bin(g, HP_OP_SUB, a, b)
#define hp_mul(g, a, b)  hp_bin(g, HP_OP_MUL, a, b)
#define hp_div(g, a, b)  hp_bin(g, HP_OP_DIV, a, b)
#define hp_mm(g, a, b)   hp_bin(g, HP_OP_MM, a, b)
#define hp_bmm(g, a, b)  hp_bin(g, HP_OP_BMM, a, b)
#define hp_neg(g, x)     hp_un(g, HP_OP_NEG, x)
#define hp_exp(g, x)     hp_un(g, HP_OP_EXP, x)
#define hp_log(g, x)     hp_un(g, HP_OP_LOG, x)
#define hp_sqrt(g, x)    hp_un(g, HP_OP_SQRT, x)
#define hp_rsqrt(g, x)   hp_un(g, HP_OP_RSQRT, x)
#define hp_silu(g, x)    hp_un(g, HP_OP_SILU, x)
#define hp_sigmoid(g, x) hp_un(g, HP_OP_SIGMOID, x)
#define hp_relu(g, x)    hp_un(g, HP_OP_RELU, x)
#define hp_t(g, x)       hp_un(g, HP_OP_T, x)

static inline hp_value hp_add_scalar(hp_graph *g, hp_value x, double v) {
    return hp_un1(g, HP_OP_ADD_SCALAR, x, hp_attr_float(HP_ATTR_VALUE, v));
}
static inline hp_value hp_mul_scalar(hp_graph *g, hp_value x, double v) {
    return hp_un1(g, HP_OP_MUL_SCALAR, x, hp_attr_float(HP_ATTR_VALUE, v));
}
static inline hp_value hp_pow(hp_graph *g, hp_value x, double e) {
    return hp_un1(g, HP_OP_POW, x, hp_attr_float(HP_ATTR_EXPONENT, e));
}
static inline hp_value hp_to(hp_graph *g, hp_value x, hp_dtype dt) {
    return hp_un1(g, HP_OP_TO_COPY, x, hp_attr_dtype(HP_ATTR_DTYPE, dt));
}
static inline hp_value hp_view(hp_graph *g, hp_value x, int rank, const int64_t *shape) {
    return hp_un1(g, HP_OP_VIEW, x, hp_attr_ints(HP_ATTR_SHAPE, rank, shape));
}
static inline hp_value hp_expand(hp_graph *g, hp_value x, int rank, const int64_t *shape) {
    return hp_un1(g, HP_OP_EXPAND, x, hp_attr_ints(HP_ATTR_SHAPE, rank, shape));
}
static inline hp_value hp_permute(hp_graph *g, hp_value x, int rank, const int64_t *perm) {
    return hp_un1(g, HP_OP_PERMUTE, x, hp_attr_ints(HP_ATTR_PERM, rank, perm));
}
static inline hp_value hp_transpose(hp_graph *g, hp_value x, int64_t d0, int64_t d1) {
    hp_attr a[2] = {hp_attr_int(HP_ATTR_DIM0, d0), hp_attr_int(HP_ATTR_DIM1, d1)};
    return hp_build(g, HP_OP_TRANSPOSE, &x, 1, a, 2);
}
static inline hp_value hp_unsqueeze(hp_graph *g, hp_value x, int64_t dim) {
    return hp_un1(g, HP_OP_UNSQUEEZE, x, hp_attr_int(HP_ATTR_DIM, dim));
}
static inline hp_value hp_squeeze(hp_graph *g, hp_value x, int64_t dim) {
    return hp_un1(g, HP_OP_SQUEEZE, x, hp_attr_int(HP_ATTR_DIM, dim));
}
static inline hp_value hp_reduce(hp_graph *g, hp_op op, hp_value x, int n, const int64_t *dims,
                                 bool keepdim) {
    hp_attr a[2] = {hp_attr_ints(HP_ATTR_DIMS, n, dims), hp_attr_int(HP_ATTR_KEEPDIM, keepdim)};
    return hp_build(g, op, &x, 1, a, 2);
}
#define hp_sum(g, x, n, dims, keepdim)  hp_reduce(g, HP_OP_SUM, x, n, dims, keepdim)
#define hp_mean(g, x, n, dims, keepdim) hp_reduce(g, HP_OP_MEAN, x, n, dims, keepdim)
#define hp_amax(g, x, n, dims, keepdim) hp_reduce(g, HP_OP_AMAX, x, n, dims, keepdim)

static inline hp_value hp_slice(hp_graph *g, hp_value x, int64_t dim, int64_t start, int64_t end,
                                int64_t step) {
    hp_attr a[4] = {hp_attr_int(HP_ATTR_DIM, dim), hp_attr_int(HP_ATTR_START, start),
                    hp_attr_int(HP_ATTR_END, end), hp_attr_int(HP_ATTR_STEP, step)};
    return hp_build(g, HP_OP_SLICE, &x, 1, a, 4);
}
static inline hp_value hp_cat(hp_graph *g, const hp_value *xs, int n, int64_t dim) {
    hp_attr a = hp_attr_int(HP_ATTR_DIM, dim);
    return hp_build(g, HP_OP_CAT, xs, n, &a, 1);
}
static inline hp_value hp_full(hp_graph *g, int rank, const int64_t *shape, double value,
                               hp_dtype dt) {
    hp_attr a[3] = {hp_attr_ints(HP_ATTR_SHAPE, rank, shape), hp_attr_float(HP_ATTR_VALUE, value),
                    hp_attr_dtype(HP_ATTR_DTYPE, dt)};
    return hp_build(g, HP_OP_FULL, NULL, 0, a, 3);
}
static inline hp_value hp_zeros(hp_graph *g, int rank, const int64_t *shape, hp_dtype dt) {
    hp_attr a[2] = {hp_attr_ints(HP_ATTR_SHAPE, rank, shape), hp_attr_dtype(HP_ATTR_DTYPE, dt)};
    return hp_build(g, HP_OP_ZEROS, NULL, 0, a, 2);
}
static inline hp_value hp_ones(hp_graph *g, int rank, const int64_t *shape, hp_dtype dt) {
    hp_attr a[2] = {hp_attr_ints(HP_ATTR_SHAPE, rank, shape), hp_attr_dtype(HP_ATTR_DTYPE, dt)};
    return hp_build(g, HP_OP_ONES, NULL, 0, a, 2);
}
static inline hp_value hp_where(hp_graph *g, hp_value c, hp_value a, hp_value b) {
    hp_value in[3] = {c, a, b};
    return hp_build(g, HP_OP_WHERE, in, 3, NULL, 0);
}

#endif
