/* graph/eval/eval_index.c — index arithmetic for the reference evaluator: row-major strides,
 * broadcast strides, unravelling a linear position and splitting a shape around one dim.
 * Every kernel addresses its tensors through these, so broadcasting and layout are defined
 * once. */
#include "graph/eval/eval_internal.h"

void hp__eval_strides(const hp_type *t, int64_t st[HP_MAX_RANK]) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->shape[d];
    }
}

void hp__eval_bcast_strides(const hp_type *in, const hp_type *out, int64_t st[HP_MAX_RANK]) {
    int64_t own[HP_MAX_RANK];
    hp__eval_strides(in, own);
    int lead = out->rank - in->rank; /* in is aligned right */
    for (int d = 0; d < out->rank; d++) {
        int di = d - lead;
        st[d] = (di < 0 || in->shape[di] == 1) ? 0 : own[di];
    }
}

void hp__eval_unravel(const hp_type *t, int64_t i, int64_t idx[HP_MAX_RANK]) {
    for (int d = t->rank - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        idx[d] = n > 0 ? i % n : 0;
        i = n > 0 ? i / n : 0;
    }
}

int64_t hp__eval_offset(int rank, const int64_t *idx, const int64_t *st) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off += idx[d] * st[d];
    return off;
}

void hp__eval_split(const hp_type *t, int dim, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < dim; d++) *outer *= t->shape[d];
    for (int d = dim + 1; d < t->rank; d++) *inner *= t->shape[d];
    *n = t->shape[dim];
}

int64_t hp__eval_numel(const hp_tensor *t) {
    return hp_type_numel(&t->type);
}
