/* tests/worker/test_cpu_attention.c — flash-style attention on the cpu backend against the
 * reference evaluator: grouped-query heads, causal and not, T != S both ways, D != Dv, sizes
 * that cross the query/key block edges, no keys at all; the backward from (g_out, q, k, v,
 * out, logsumexp) with out and logsumexp the evaluator's forward; and the two backward
 * schedules giving bit-identical gradients. Tolerance 1e-4 (absolute below 1, relative above).
 */
#include "cpu_check.h"

#include "hp/build.h"
#include "worker/simd.h"

void hp__cpu_sdpa_backward_mode(int mode); /* worker/cpu/cpu_internal.h (tests only) */

typedef struct acfg {
    int64_t b, h, hkv, t, s, d, dv;
    int causal;
    double scale; /* 0: 1/sqrt(D) */
} acfg;

static const acfg configs[] = {
    {1, 1, 1, 1, 1, 4, 4, 1, 0},       {1, 2, 2, 5, 5, 4, 4, 1, 0.5},
    {2, 4, 2, 37, 37, 16, 16, 1, 0},   {1, 4, 1, 70, 45, 8, 12, 0, 0.3},
    {1, 2, 1, 45, 70, 8, 8, 1, 0},     {1, 2, 2, 100, 60, 16, 16, 1, 0},
    {1, 4, 2, 130, 130, 32, 32, 1, 0}, {2, 6, 3, 65, 129, 16, 8, 0, 0},
    {1, 2, 1, 4, 0, 8, 8, 0, 0},       {1, 8, 1, 33, 97, 64, 64, 1, 0.125},
};

typedef struct agraph {
    hp_th h;
    hp_value fwd, bwd;
} agraph;

static void build(agraph *g, const acfg *c, uint64_t seed) {
    hp_th_init(&g->h);
    hp_th *h = &g->h;
    hp_value go = cc_rand_input(h, TY(HP_F32, c->b, c->h, c->t, c->dv), seed, -1, 1);
    hp_value q = cc_rand_input(h, TY(HP_F32, c->b, c->h, c->t, c->d), seed + 1, -2, 2);
    hp_value k = cc_rand_input(h, TY(HP_F32, c->b, c->hkv, c->s, c->d), seed + 2, -2, 2);
    hp_value v = cc_rand_input(h, TY(HP_F32, c->b, c->hkv, c->s, c->dv), seed + 3, -1, 1);
    double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d);
    hp_attr a[2] = {hp_attr_int(HP_ATTR_CAUSAL, c->causal), hp_attr_float(HP_ATTR_SCALE, scale)};
    int na = 2;
    g->fwd = hp_build(h->g, HP_OP_SDPA, (hp_value[]){q, k, v}, 3, a, na);
    g->bwd = hp_build(h->g, HP_OP_SDPA_BACKWARD,
                      (hp_value[]){go, q, k, v, g->fwd, hp_out(g->fwd, 1)}, 6, a, na);
    cr_assert(!hp_graph_failed(h->g), "%s", h->g->err.msg);
}

Test(cpu_attention, forward_matches_eval) {
    hp_backend *be = cc_backend(3);
    for (size_t i = 0; i < HP_ARRAY_LEN(configs); i++) {
        agraph g;
        build(&g, &configs[i], 10 * i);
        cc_check(be, &g.h, g.fwd, 0, TOL_REDUCE);
        hp_th_fini(&g.h);
    }
    hp_backend_free(be);
}

Test(cpu_attention, backward_matches_eval) {
    hp_backend *be = cc_backend(3);
    for (int mode = 0; mode <= 2; mode++) {
        hp__cpu_sdpa_backward_mode(mode);
        for (size_t i = 0; i < HP_ARRAY_LEN(configs); i++) {
            agraph g;
            build(&g, &configs[i], 10 * i);
            cc_check(be, &g.h, g.bwd, 0, TOL_REDUCE);
            hp_th_fini(&g.h);
        }
    }
    hp__cpu_sdpa_backward_mode(0);
    hp_backend_free(be);
}

/* The flag sets the lowering gives an attention whose operands are stored [B, T, H, D]
 * (HP_CALL_BTHD_*): all of them (the Llama graphs' head transposes folded), only some, one. */
static const unsigned bthd_fwd[] = {
    HP_CALL_BTHD_IN(0) | HP_CALL_BTHD_IN(1) | HP_CALL_BTHD_IN(2) | HP_CALL_BTHD_OUT(0),
    HP_CALL_BTHD_IN(1) | HP_CALL_BTHD_OUT(0),
    HP_CALL_BTHD_IN(0) | HP_CALL_BTHD_IN(2),
};
static const unsigned bthd_bwd[] = {
    HP_CALL_BTHD_MASK,
    HP_CALL_BTHD_IN(0) | HP_CALL_BTHD_IN(4) | HP_CALL_BTHD_OUT(1),
    HP_CALL_BTHD_IN(2) | HP_CALL_BTHD_IN(3) | HP_CALL_BTHD_OUT(0) | HP_CALL_BTHD_OUT(2),
};

/* The same values whatever the storage order; the backward in both schedules. */
Test(cpu_attention, operands_stored_bthd_match_eval) {
    hp_backend *be = cc_backend(3);
    for (size_t f = 0; f < HP_ARRAY_LEN(bthd_fwd); f++)
        for (size_t i = 0; i < HP_ARRAY_LEN(configs); i++) {
            agraph g;
            build(&g, &configs[i], 10 * i + f);
            cc_check(be, &g.h, g.fwd, bthd_fwd[f], TOL_REDUCE);
            for (int mode = 1; mode <= 2; mode++) {
                hp__cpu_sdpa_backward_mode(mode);
                cc_check(be, &g.h, g.bwd, bthd_bwd[f], TOL_REDUCE);
            }
            hp__cpu_sdpa_backward_mode(0);
            hp_th_fini(&g.h);
        }
    hp_backend_free(be);
}

/* The fused and the two-pass schedules perform the same float operations: same bits. */
Test(cpu_attention, backward_schedules_agree_bitwise) {
    hp_backend *be = cc_backend(2);
    for (size_t i = 0; i < HP_ARRAY_LEN(configs); i++) {
        cc_result r[2];
        for (int m = 0; m < 2; m++) {
            agraph g;
            build(&g, &configs[i], 10 * i + 3);
            hp__cpu_sdpa_backward_mode(m + 1);
            hp_err e = {0};
            cr_assert_eq(cc_run(be, &g.h, g.bwd.node, 0, &r[m], NULL, &e), HP_OK, "%s", e.msg);
            hp_th_fini(&g.h);
        }
        for (int k = 0; k < 3; k++)
            cr_assert_eq(memcmp(r[0].out[k], r[1].out[k], r[0].bytes[k]), 0,
                         "config %zu: gradient %d differs between the schedules", i, k);
        cc_result_free(&r[0]);
        cc_result_free(&r[1]);
    }
    hp__cpu_sdpa_backward_mode(0);
    hp_backend_free(be);
}

/* Extreme logits: the online softmax must neither overflow nor lose the row's mass. The
 * backward is checked at merely large scores: with logsumexp in the thousands its f32
 * rounding (5e-4) moves the reference's P, and the reference's delta = Σ P·dP follows it
 * while ours (g_out · out) does not. */
Test(cpu_attention, large_scores) {
    hp_backend *be = cc_backend(2);
    for (int huge = 0; huge < 2; huge++) {
        acfg c = {1, 2, 1, 80, 80, 16, 16, 1, huge ? 4.0 : 2.0};
        agraph g;
        build(&g, &c, 77);
        for (int k = 1; k <= 2 && huge; k++) { /* q and k scaled up: scores in the thousands */
            int64_t n = hp_type_numel(&g.h.in[k].type);
            for (int64_t i = 0; i < n; i++) g.h.in[k].data[i] *= 4;
        }
        cc_check(be, &g.h, g.fwd, 0, TOL_REDUCE);
        if (!huge) cc_check(be, &g.h, g.bwd, 0, TOL_REDUCE);
        hp_th_fini(&g.h);
    }
    hp_backend_free(be);
}

/* The AVX2 copy of the block code and the baseline copy give the same bits. */
Test(cpu_attention, vector_and_scalar_paths_agree_bitwise) {
    if (!hp__simd_avx2()) cr_skip_test("no AVX2+FMA on this CPU: only the scalar path exists");
    hp_backend *be = cc_backend(2);
    static const acfg small[] = {{1, 4, 2, 45, 70, 16, 8, 1, 0}, {2, 2, 1, 37, 37, 24, 32, 0, 0}};
    for (size_t i = 0; i < HP_ARRAY_LEN(small); i++) {
        cc_result r[2][2];
        for (int scalar = 0; scalar < 2; scalar++) {
            hp__simd_force_scalar(scalar);
            agraph g;
            build(&g, &small[i], 5 + i);
            hp_err e = {0};
            cr_assert_eq(cc_run(be, &g.h, g.fwd.node, 0, &r[scalar][0], NULL, &e), HP_OK, "%s",
                         e.msg);
            cr_assert_eq(cc_run(be, &g.h, g.bwd.node, 0, &r[scalar][1], NULL, &e), HP_OK, "%s",
                         e.msg);
            hp_th_fini(&g.h);
        }
        hp__simd_force_scalar(0);
        for (int f = 0; f < 2; f++) {
            for (int k = 0; k < r[0][f].n_out; k++)
                cr_assert_eq(memcmp(r[0][f].out[k], r[1][f].out[k], r[0][f].bytes[k]), 0,
                             "config %zu, %s output %d: AVX2 and scalar paths differ", i,
                             f ? "backward" : "forward", k);
            cc_result_free(&r[0][f]);
            cc_result_free(&r[1][f]);
        }
    }
    hp_backend_free(be);
}
