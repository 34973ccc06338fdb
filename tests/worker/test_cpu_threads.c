/* tests/worker/test_cpu_threads.c — the cpu backend's results do not depend on its thread
 * count: every kernel with a reduction or a parallel split (sums, means, amax, norms, softmax,
 * embedding backward, attention forward and backward, GEMMs) gives the same bits with 1, 2
 * 3 and 4 threads, on shapes big enough to be split into many chunks (GEMMs: into many output
 * tiles, with ragged edges), whatever OPENBLAS_CORETYPE picks. Nor on the vector width:
 * the AVX2 builds of the hot loops give the same bits as the baseline builds.
 */
#include "cpu_check.h"

#include "hp/build.h"
#include "worker/simd.h"

typedef hp_value (*builder)(hp_th *h, unsigned *flags);

static hp_value reduce_all(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value x = cc_rand_input(h, TY(HP_F32, 513, 1031), 1, -3, 3);
    return hp_sum(h->g, x, 0, NULL, false);
}

static hp_value reduce_rows(hp_th *h, unsigned *flags) {
    (void)flags;
    static const int64_t dims[] = {0};
    hp_value x = cc_rand_input(h, TY(HP_F32, 20000, 64), 2, -3, 3);
    return hp_mean(h->g, x, 1, dims, true);
}

static hp_value reduce_mid(hp_th *h, unsigned *flags) {
    (void)flags;
    static const int64_t dims[] = {0, 1};
    hp_value x = cc_rand_input(h, TY(HP_F32, 7, 9000, 5), 3, -3, 3);
    return hp_sum(h->g, x, 2, dims, false);
}

static hp_value rms_back(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value gy = cc_rand_input(h, TY(HP_F32, 2000, 96), 4, -1, 1);
    hp_value x = cc_rand_input(h, TY(HP_F32, 2000, 96), 5, -2, 2);
    hp_value w = cc_rand_input(h, TY(HP_F32, 96), 6, 0.5, 1.5);
    hp_value r = cc_rand_input(h, TY(HP_F32, 2000), 7, 0.5, 2);
    return hp_build(h->g, HP_OP_RMS_NORM_BACKWARD, (hp_value[]){gy, x, w, r}, 4, NULL, 0);
}

static hp_value log_softmax(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value x = cc_rand_input(h, TY(HP_F32, 300, 2048), 8, -10, 10);
    hp_attr a = hp_attr_int(HP_ATTR_DIM, -1);
    return hp_build(h->g, HP_OP_LOG_SOFTMAX, &x, 1, &a, 1);
}

static hp_value log_softmax_back(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value g = cc_rand_input(h, TY(HP_F32, 100, 2048), 19, -1, 1);
    hp_value y = cc_rand_input(h, TY(HP_F32, 100, 2048), 20, -12, 0);
    hp_attr a = hp_attr_int(HP_ATTR_DIM, -1);
    return hp_build(h->g, HP_OP_LOG_SOFTMAX_BACKWARD, (hp_value[]){g, y}, 2, &a, 1);
}

static hp_value silu_back(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value g = cc_rand_input(h, TY(HP_F32, 300, 77), 21, -1, 1);
    hp_value x = cc_rand_input(h, TY(HP_F32, 300, 77), 22, -9, 9);
    return hp_build(h->g, HP_OP_SILU_BACKWARD, (hp_value[]){g, x}, 2, NULL, 0);
}

static hp_value gelu(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value x = cc_rand_input(h, TY(HP_F32, 300, 77), 23, -9, 9);
    hp_attr a = hp_attr_int(HP_ATTR_APPROXIMATE, 1);
    return hp_build(h->g, HP_OP_GELU, &x, 1, &a, 1);
}

static hp_value emb_back(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value g = cc_rand_input(h, TY(HP_F32, 8, 512, 32), 9, -1, 1);
    hp_value idx = cc_rand_input(h, TY(HP_I64, 8, 512), 10, 0, 300);
    hp_attr a = hp_attr_int(HP_ATTR_NUM_WEIGHTS, 300);
    return hp_build(h->g, HP_OP_EMBEDDING_DENSE_BACKWARD, (hp_value[]){g, idx}, 2, &a, 1);
}

static hp_value mm_trans(hp_th *h, unsigned *flags) {
    *flags = HP_CALL_TRANS_A;
    hp_value a = cc_rand_input(h, TY(HP_F32, 300, 257), 11, -1, 1);
    hp_value b = cc_rand_input(h, TY(HP_F32, 300, 190), 12, -1, 1);
    return hp_mm(h->g, hp_t(h->g, a), b);
}

static hp_value mm_thin(hp_th *h, unsigned *flags) { /* shapes BLAS may treat as a GEMV */
    (void)flags;
    hp_value a = cc_rand_input(h, TY(HP_F32, 1, 4099), 24, -1, 1);
    hp_value b = cc_rand_input(h, TY(HP_F32, 4099, 300), 25, -1, 1);
    return hp_mm(h->g, a, b);
}

/* Many output tiles, edges that are no multiple of a tile or of OpenBLAS's micro-tile. */
static hp_value mm_tiled(hp_th *h, unsigned *flags) {
    (void)flags;
    hp_value a = cc_rand_input(h, TY(HP_F32, 1037, 301), 26, -1, 1);
    hp_value b = cc_rand_input(h, TY(HP_F32, 301, 2051), 27, -1, 1);
    return hp_mm(h->g, a, b);
}

static hp_value mm_both_trans(hp_th *h, unsigned *flags) {
    *flags = HP_CALL_TRANS_A | HP_CALL_TRANS_B;
    hp_value a = cc_rand_input(h, TY(HP_F32, 513, 700), 28, -1, 1);
    hp_value b = cc_rand_input(h, TY(HP_F32, 611, 513), 29, -1, 1);
    return hp_mm(h->g, hp_t(h->g, a), hp_t(h->g, b));
}

static hp_value bmm(hp_th *h, unsigned *flags) {
    *flags = HP_CALL_TRANS_B;
    hp_value a = cc_rand_input(h, TY(HP_F32, 6, 65, 130), 13, -1, 1);
    hp_value b = cc_rand_input(h, TY(HP_F32, 6, 97, 130), 14, -1, 1);
    return hp_bmm(h->g, a, hp_transpose(h->g, b, 1, 2));
}

static hp_value attention(hp_th *h, bool backward) {
    hp_value go = cc_rand_input(h, TY(HP_F32, 1, 8, 150, 16), 15, -1, 1);
    hp_value q = cc_rand_input(h, TY(HP_F32, 1, 8, 150, 16), 16, -1, 1);
    hp_value k = cc_rand_input(h, TY(HP_F32, 1, 2, 150, 16), 17, -1, 1);
    hp_value v = cc_rand_input(h, TY(HP_F32, 1, 2, 150, 16), 18, -1, 1);
    hp_attr a[2] = {hp_attr_float(HP_ATTR_SCALE, 0.25), hp_attr_int(HP_ATTR_CAUSAL, 1)};
    hp_value o = hp_build(h->g, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, 2);
    if (!backward) return o;
    return hp_build(h->g, HP_OP_SDPA_BACKWARD, (hp_value[]){go, q, k, v, o, hp_out(o, 1)}, 6, a, 2);
}

static hp_value attn_fwd(hp_th *h, unsigned *flags) {
    (void)flags;
    return attention(h, false);
}

/* B·Hkv = 2: the fused schedule with 1 and 2 threads, two-pass with 3 — they must agree too. */
static hp_value attn_bwd(hp_th *h, unsigned *flags) {
    (void)flags;
    return attention(h, true);
}

static const builder builders[] = {
    reduce_all,    reduce_rows, reduce_mid, rms_back, log_softmax, log_softmax_back,
    silu_back,     gelu,        emb_back,   mm_trans, mm_thin,     mm_tiled,
    mm_both_trans, bmm,         attn_fwd,   attn_bwd};

Test(cpu_threads, results_do_not_depend_on_thread_count, .timeout = 60) {
    for (size_t bi = 0; bi < HP_ARRAY_LEN(builders); bi++) {
        cc_result first = {0};
        for (int threads = 1; threads <= 4; threads++) {
            hp_backend *be = cc_backend(threads);
            hp_th h;
            hp_th_init(&h);
            unsigned flags = 0;
            hp_value v = builders[bi](&h, &flags);
            cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
            cc_result r;
            hp_err e = {0};
            cr_assert_eq(cc_run(be, &h, v.node, flags, &r, NULL, &e), HP_OK, "%s", e.msg);
            const char *name = hp_op_get(h.g->nodes[v.node].op)->name;
            if (threads == 1) {
                first = r;
            } else {
                for (int k = 0; k < r.n_out; k++)
                    cr_assert_eq(memcmp(first.out[k], r.out[k], r.bytes[k]), 0,
                                 "builder %zu (%s): output %d differs between 1 and %d threads", bi,
                                 name, k, threads);
                cc_result_free(&r);
            }
            hp_th_fini(&h);
            hp_backend_free(be);
        }
        cc_result_free(&first);
    }
}

Test(cpu_threads, vector_width_does_not_change_results, .timeout = 60) {
    if (!hp__simd_avx2()) cr_skip_test("no AVX2+FMA on this CPU: only the baseline build runs");
    hp_backend *be = cc_backend(2);
    for (size_t bi = 0; bi < HP_ARRAY_LEN(builders); bi++) {
        if (builders[bi] == mm_trans || builders[bi] == mm_thin || builders[bi] == mm_tiled ||
            builders[bi] == mm_both_trans || builders[bi] == bmm)
            continue; /* OpenBLAS's own dispatch */
        cc_result r[2];
        const char *name = "";
        for (int scalar = 0; scalar < 2; scalar++) {
            hp__simd_force_scalar(scalar);
            hp_th h;
            hp_th_init(&h);
            unsigned flags = 0;
            hp_value v = builders[bi](&h, &flags);
            cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
            name = hp_op_get(h.g->nodes[v.node].op)->name;
            hp_err e = {0};
            cr_assert_eq(cc_run(be, &h, v.node, flags, &r[scalar], NULL, &e), HP_OK, "%s", e.msg);
            hp_th_fini(&h);
        }
        hp__simd_force_scalar(0);
        for (int k = 0; k < r[0].n_out; k++)
            cr_assert_eq(memcmp(r[0].out[k], r[1].out[k], r[0].bytes[k]), 0,
                         "builder %zu (%s): output %d differs between AVX2 and baseline", bi, name,
                         k);
        cc_result_free(&r[0]);
        cc_result_free(&r[1]);
    }
    hp_backend_free(be);
}
