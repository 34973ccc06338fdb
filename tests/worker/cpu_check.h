/* tests/worker/cpu_check.h — shared by the cpu and cuda backend tests (header-only, test code):
 * run one node of a harness graph on a backend and compare it with the reference evaluator.
 * Device memory is only touched through copy_in / copy_out, so any backend fits.
 *
 * The node's inputs are fed from the harness placeholders or, when an input is computed by
 * another node (sdpa_backward's out and logsumexp, say), from the evaluator's f32-rounded value
 * of it. With HP_CALL_TRANS_A/B, an operand produced by transpose/t is replaced by that
 * transpose's input and the flag tells the kernel, as the lowering does. With HP_CALL_BTHD_IN(k)
 * attention operand k is handed over in [B, T, H, D] order, and with HP_CALL_BTHD_OUT(k) output
 * k is read back from it.
 *
 * Tolerances are hp_th_expect_close's: absolute for |want| <= 1, relative above.
 */
#ifndef HP_TEST_CPU_CHECK_H
#define HP_TEST_CPU_CHECK_H

#include "tests/util/eval_harness.h"
#include "worker/cpu/cpu_backend.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_SIMPLE 1e-5 /* elementwise, shape, casts, embedding, nll */
#define TOL_REDUCE 1e-4 /* matmul, attention, norms, softmax, reductions */

static inline hp_backend *cc_backend(int threads) {
    hp_backend *be = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_cpu_backend_new(threads, &be, &e), HP_OK, "%s", e.msg);
    return be;
}

static inline uint16_t cc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline uint16_t cc_f32_to_f16(float f) { /* normal range only: tests stay inside it */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7FFFFFFFu;
    if (a < 0x38800000u) return (uint16_t)sign; /* tiny: flush (tests avoid it) */
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

static inline double cc_half_to_double(uint16_t h, bool bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0) return (sign ? -1.0 : 1.0) * ldexp((double)m, -24);
    uint32_t u = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Host bytes of a double tensor in dtype dt (values already representable). */
static inline void *cc_pack(const double *x, int64_t n, hp_dtype dt) {
    size_t es = hp_dtype_size(dt);
    uint8_t *p = calloc((size_t)(n > 0 ? n : 1), es);
    cr_assert(p);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case HP_F32:
            ((float *)p)[i] = (float)x[i];
            break;
        case HP_BF16:
            ((uint16_t *)p)[i] = cc_f32_to_bf16((float)x[i]);
            break;
        case HP_F16:
            ((uint16_t *)p)[i] = cc_f32_to_f16((float)x[i]);
            break;
        case HP_I32:
            ((int32_t *)p)[i] = (int32_t)x[i];
            break;
        case HP_I64:
            ((int64_t *)p)[i] = (int64_t)x[i];
            break;
        default:
            p[i] = x[i] != 0;
            break;
        }
    }
    return p;
}

static inline double cc_unpack1(const void *p, int64_t i, hp_dtype dt) {
    switch (dt) {
    case HP_F32:
        return ((const float *)p)[i];
    case HP_BF16:
        return cc_half_to_double(((const uint16_t *)p)[i], true);
    case HP_F16:
        return cc_half_to_double(((const uint16_t *)p)[i], false);
    case HP_I32:
        return ((const int32_t *)p)[i];
    case HP_I64:
        return (double)((const int64_t *)p)[i];
    default:
        return ((const uint8_t *)p)[i];
    }
}

/* Identity for group_size-1 collectives, so the evaluator can run them. */
static inline hp_status cc_collective(void *ctx, const hp_node *n, const hp_tensor *in,
                                      hp_tensor *out, hp_err *err) {
    (void)ctx, (void)n, (void)err;
    memcpy(out->data, in->data, (size_t)hp_type_numel(&out->type) * sizeof(double));
    return HP_OK;
}

static inline bool cc_is_transpose(const hp_graph *g, hp_value v) {
    hp_op op = g->nodes[v.node].op;
    return op == HP_OP_T || op == HP_OP_TRANSPOSE;
}

/* What a backend run of a node produced: raw output bytes. */
typedef struct cc_result {
    int n_out;
    void *out[HP_MAX_OUTS];
    size_t bytes[HP_MAX_OUTS];
    hp_type type[HP_MAX_OUTS];
} cc_result;

static inline void cc_result_free(cc_result *r) {
    for (int k = 0; k < r->n_out; k++) free(r->out[k]);
    memset(r, 0, sizeof *r);
}

/* Evaluates the graph with outputs = node's outputs followed by `extra` values; ref[] gets the
 * tensors (caller frees with hp_tensor_free). */
static inline void cc_eval(hp_th *h, int node, const hp_value *extra, int n_extra, hp_tensor *ref) {
    const hp_node *n = &h->g->nodes[node];
    hp_value outs[HP_MAX_OUTS + HP_MAX_INPUTS];
    int k = 0;
    for (int i = 0; i < n->n_out; i++) outs[k++] = (hp_value){node, i};
    for (int i = 0; i < n_extra; i++) outs[k++] = extra[i];
    cr_assert(!hp_graph_failed(h->g), "building the graph failed: %s", h->g->err.msg);
    cr_assert_eq(hp_graph_set_outputs(h->g, outs, k, NULL), HP_OK);
    hp_eval_opts o = {.precision = HP_EVAL_F32, .collective = cc_collective};
    hp_err e = {0};
    cr_assert_eq(hp_eval(h->g, h->in, h->n_in, &o, ref, &e), HP_OK, "eval: %s", e.msg);
}

/* Rows of d elements of esz bytes between [B, H, T, D] order (to_bthd: from it) and
 * [B, T, H, D] order, for t of rank 4 (its [B, H, T, D] type): what an HP_CALL_BTHD_* operand
 * holds. */
static inline void cc_swap_heads(void *dst, const void *src, const hp_type *t, size_t esz,
                                 bool to_bthd) {
    int64_t B = t->shape[0], H = t->shape[1], T = t->shape[2], D = t->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < T; r++) {
                size_t bhtd = (size_t)(((b * H + h) * T + r) * D) * esz;
                size_t bthd = (size_t)(((b * T + r) * H + h) * D) * esz;
                memcpy((char *)dst + (to_bthd ? bthd : bhtd),
                       (const char *)src + (to_bthd ? bhtd : bthd), (size_t)D * esz);
            }
}

/* Runs node `node` of h's graph on be. The evaluator's results for the node's outputs are put
 * in ref[0..n_out) when ref is not NULL (free them); with ref NULL and every input a
 * placeholder the evaluator does not run. Returns the launch status; on success *res holds the
 * outputs' bytes. */
static inline hp_status cc_run(hp_backend *be, hp_th *h, int node, unsigned flags, cc_result *res,
                               hp_tensor *ref, hp_err *err) {
    const hp_graph *g = h->g;
    hp_node n = g->nodes[node]; /* a copy: the graph does not change below, but be safe */
    int n_in = n.n_in;
    hp_value src[HP_MAX_INPUTS], extra[HP_MAX_INPUTS];
    int n_extra = 0, extra_of[HP_MAX_INPUTS];
    for (int i = 0; i < n_in; i++) {
        src[i] = n.in[i];
        bool mat_operand = (n.op == HP_OP_ADDMM) ? i >= 1 : i < 2;
        int which = n.op == HP_OP_ADDMM ? i - 1 : i;
        bool trans = mat_operand && ((which == 0 && (flags & HP_CALL_TRANS_A)) ||
                                     (which == 1 && (flags & HP_CALL_TRANS_B)));
        if (trans) {
            cr_assert(cc_is_transpose(g, src[i]), "TRANS flag on an operand that is no transpose");
            src[i] = g->nodes[src[i].node].in[0];
        }
        extra_of[i] = -1;
        if (g->nodes[src[i].node].op != HP_OP_PLACEHOLDER) {
            extra_of[i] = n_extra;
            extra[n_extra++] = src[i];
        }
    }
    hp_tensor ev[HP_MAX_OUTS + HP_MAX_INPUTS];
    bool evaluated = ref || n_extra > 0; /* bad-input tests launch what the evaluator refuses */
    if (evaluated) cc_eval(h, node, extra, n_extra, ev);
    const hp_backend_vtable *vt = be->vt;
    void *din[HP_MAX_INPUTS];
    hp_type tin[HP_MAX_INPUTS];
    for (int i = 0; i < n_in; i++) {
        const hp_tensor *t = extra_of[i] >= 0 ? &ev[n.n_out + extra_of[i]] : &h->in[src[i].node];
        tin[i] = *hp_graph_type(g, src[i]);
        int64_t numel = hp_type_numel(&tin[i]);
        size_t bytes = (size_t)numel * hp_dtype_size(tin[i].dtype);
        void *host = cc_pack(t->data, numel, tin[i].dtype);
        if (i < 5 &&
            (flags & HP_CALL_BTHD_IN(i))) { /* stored [B, T, H, D], as the lowering has it */
            cr_assert_eq(tin[i].rank, 4, "BTHD flag on an operand of rank %d", tin[i].rank);
            void *sw = malloc(bytes + 1);
            cr_assert(sw);
            cc_swap_heads(sw, host, &tin[i], hp_dtype_size(tin[i].dtype), true);
            free(host);
            host = sw;
        }
        cr_assert_eq(vt->alloc(be, bytes, &din[i], err), HP_OK);
        cr_assert_eq(vt->copy_in(be, din[i], host, bytes, err), HP_OK);
        free(host);
    }
    void *dout[HP_MAX_OUTS];
    for (int k = 0; k < n.n_out; k++) {
        size_t bytes = (size_t)hp_type_numel(&n.out[k]) * hp_dtype_size(n.out[k].dtype);
        cr_assert_eq(vt->alloc(be, bytes, &dout[k], err), HP_OK);
        /* garbage: kernels must write every element (through copy_in: the backend's memory
         * may not be the host's); all ones is NaN in every float dtype, so an element left
         * unwritten fails the comparison at any tolerance */
        void *junk = malloc(bytes + 1);
        cr_assert(junk);
        memset(junk, 0xFF, bytes);
        cr_assert_eq(vt->copy_in(be, dout[k], junk, bytes, err), HP_OK);
        free(junk);
    }
    hp_kernel_call call = {.node = &g->nodes[node],
                           .flags = flags,
                           .n_in = n_in,
                           .n_out = n.n_out,
                           .in = (const void *const *)din,
                           .in_type = tin,
                           .out = dout,
                           .out_type = n.out};
    hp_status st = vt->launch(be, HP_STREAM_COMPUTE, &call, err);
    memset(res, 0, sizeof *res);
    if (st == HP_OK) {
        cr_assert_eq(vt->synchronize(be, err), HP_OK);
        res->n_out = n.n_out;
        for (int k = 0; k < n.n_out; k++) {
            res->type[k] = n.out[k];
            res->bytes[k] = (size_t)hp_type_numel(&n.out[k]) * hp_dtype_size(n.out[k].dtype);
            res->out[k] = malloc(res->bytes[k] + 1);
            cr_assert_eq(vt->copy_out(be, res->out[k], dout[k], res->bytes[k], err), HP_OK);
            if (k < 3 && (flags & HP_CALL_BTHD_OUT(k))) { /* written [B, T, H, D] */
                void *sw = malloc(res->bytes[k] + 1);
                cr_assert(sw);
                cc_swap_heads(sw, res->out[k], &n.out[k], hp_dtype_size(n.out[k].dtype), false);
                free(res->out[k]);
                res->out[k] = sw;
            }
        }
    }
    for (int i = 0; i < n_in; i++) vt->free(be, din[i]);
    for (int k = 0; k < n.n_out; k++) vt->free(be, dout[k]);
    for (int k = 0; evaluated && k < n.n_out + n_extra; k++) {
        if (ref && k < n.n_out)
            ref[k] = ev[k];
        else
            hp_tensor_free(&ev[k]);
    }
    return st;
}

/* n loss targets in [0, classes) drawn from seed, every fifth (r % 5 == 2) `ignore`; *counted
 * gets how many are not ignored. The caller frees the array. */
static inline double *cc_targets(int64_t n, int64_t classes, uint64_t seed, int64_t ignore,
                                 double *counted) {
    double *tg = malloc((size_t)(n > 0 ? n : 1) * sizeof *tg);
    cr_assert(tg);
    hp_th_rand(tg, n, seed, 0, (double)classes);
    *counted = 0;
    for (int64_t r = 0; r < n; r++) {
        tg[r] = floor(tg[r]);
        if (r % 5 == 2) tg[r] = (double)ignore;
        *counted += tg[r] != (double)ignore;
    }
    return tg;
}

/* Runs node `v.node` on be and compares every output with the evaluator within tol. */
static inline void cc_check(hp_backend *be, hp_th *h, hp_value v, unsigned flags, double tol) {
    cc_result r;
    hp_tensor ref[HP_MAX_OUTS];
    hp_err e = {0};
    hp_status st = cc_run(be, h, v.node, flags, &r, ref, &e);
    const hp_node *n = &h->g->nodes[v.node];
    const char *name = hp_op_get(n->op)->name;
    cr_assert_eq(st, HP_OK, "%s: launch failed: %s", name, e.msg);
    for (int k = 0; k < r.n_out; k++) {
        int64_t numel = hp_type_numel(&r.type[k]);
        double *got = malloc((size_t)(numel > 0 ? numel : 1) * sizeof *got);
        for (int64_t i = 0; i < numel; i++) got[i] = cc_unpack1(r.out[k], i, r.type[k].dtype);
        char what[160], tb[96];
        snprintf(what, sizeof what, "%s output %d %s", name, k,
                 hp_type_str(&r.type[k], tb, sizeof tb));
        hp_th_expect_close(got, ref[k].data, numel, tol, what);
        free(got);
        hp_tensor_free(&ref[k]);
    }
    cc_result_free(&r);
}

/* Random feeds. */
static inline hp_value cc_rand_input(hp_th *h, hp_type t, uint64_t seed, double lo, double hi) {
    int64_t n = hp_type_numel(&t);
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    hp_th_rand(x, n, seed, lo, hi);
    if (!hp_dtype_is_float(t.dtype))
        for (int64_t i = 0; i < n; i++) x[i] = t.dtype == HP_BOOL ? (x[i] > 0) : floor(x[i]);
    else /* representable, so that the evaluator and the kernel read the same values */
        for (int64_t i = 0; i < n; i++) x[i] = hp_eval_round(t.dtype, x[i]);
    hp_value v = hp_th_input(h, t, x);
    free(x);
    return v;
}

static inline hp_value cc_input(hp_th *h, hp_type t, const double *x) {
    return hp_th_input(h, t, x);
}

#endif
