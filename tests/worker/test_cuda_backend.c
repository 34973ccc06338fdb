/* tests/worker/test_cuda_backend.c — the cuda backend's vtable outside the kernels: without a
 * device (or without CUDA in the build) a cuda backend is one clear line, never the CPU — this
 * runs everywhere; with a device: device facts, memory round trips, stream ordering by events,
 * the training loop's math (AdamW, grad norm, scaling, init) against the host functions, the
 * peak-memory count, and device faults (an injected one, an embedding index out of range)
 * reported at synchronize with the op named, the backend still usable afterwards. */
#include "cpu_check.h"
#include "cuda_check.h"

#include "hp/build.h"
#include "hp/device.h"
#include "hp/optim.h"
#include "hp/param_init.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- no device: runs on every machine ------------------------------------------------------- */

Test(cuda_backend, without_a_device_is_one_line_never_the_cpu) {
    char why[200] = "";
    if (cu_present(why, sizeof why)) cr_skip_test("a CUDA device is present");
    hp_backend *b = (hp_backend *)1;
    hp_err e = {0};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CUDA, NULL, &b, &e), HP_UNSUPPORTED);
    cr_assert_null(b);
    cr_assert_null(strchr(e.msg, '\n'), "not one line: %s", e.msg);
    if (hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK)
        cr_assert(!strncmp(e.msg, "device cuda: no CUDA device (", 29), "%s", e.msg);
    else
        cr_assert(strstr(e.msg, "built without CUDA"), "%s", e.msg);
#ifdef HP_CUDA_BACKEND
    cr_assert_eq(hp_cuda_device_count(NULL, 0), 0);
    cr_assert_eq(hp_cuda_backend_new(0, &b, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "no CUDA device"), "%s", e.msg);
    cr_assert_eq(hp_cuda_backend_new(0, NULL, &e), HP_INVALID);
#endif
}

/* ---- with a device -------------------------------------------------------------------------- */

Test(cuda_backend, info_memory_and_streams) {
    hp_backend *b = cu_backend();
    const hp_backend_vtable *vt = b->vt;
    hp_err e = {0};
    hp_device_info di;
    cr_assert_eq(vt->info(b, &di, &e), HP_OK, "%s", e.msg);
    cr_assert(di.name[0]);
    cr_assert_gt(di.memory_bytes, (int64_t)1 << 30);
    cr_assert(!di.host_visible);
    if (strstr(di.name, "H200") || strstr(di.name, "H100 80GB HBM3"))
        cr_expect_eq(di.peak_flops, 989e12, "%s: %g", di.name, di.peak_flops);
    cr_expect_gt(di.peak_flops, 0, "%s: no peak (table or probe)", di.name);

    enum { N = 1 << 20 };
    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f;
    void *a = NULL, *c = NULL;
    cr_assert_eq(vt->alloc(b, N * sizeof(float), &a, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->alloc(b, N * sizeof(float), &c, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->copy_out(b, back, a, N * sizeof(float), &e), HP_OK);
    for (int i = 0; i < N; i++) cr_assert_eq(back[i], 0.0f, "alloc is not zeroed at %d", i);
    cr_assert_eq(vt->copy_in(b, a, h, N * sizeof(float), &e), HP_OK);

    /* a copy on the comm stream ordered after compute by an event, compute after it again */
    hp_graph *g = hp_graph_new();
    int64_t shape[1] = {N};
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, hp_type_make(HP_F32, 1, shape), NULL);
    hp_value y =
        hp_build(g, HP_OP_MUL_SCALAR, &x, 1, (hp_attr[]){hp_attr_float(HP_ATTR_VALUE, 2.0)}, 1);
    hp_value w = hp_build(g, HP_OP_WAIT_TENSOR, &y, 1, NULL, 0);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    hp_type t = hp_type_make(HP_F32, 1, shape);
    hp_kernel_call k1 = {.node = &g->nodes[y.node],
                         .n_in = 1,
                         .n_out = 1,
                         .in = (const void *const[]){a},
                         .in_type = &t,
                         .out = (void *const[]){c},
                         .out_type = &g->nodes[y.node].out[0]};
    hp_event *ev = NULL;
    cr_assert_eq(vt->event_new(b, &ev, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->launch(b, HP_STREAM_COMPUTE, &k1, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->event_record(b, ev, HP_STREAM_COMPUTE, &e), HP_OK);
    cr_assert_eq(vt->event_wait(b, ev, HP_STREAM_COMM, &e), HP_OK);
    hp_kernel_call k2 = k1; /* wait_tensor as a copy c -> a on the comm stream */
    k2.node = &g->nodes[w.node];
    k2.in = (const void *const[]){c};
    k2.out = (void *const[]){a};
    k2.out_type = &g->nodes[w.node].out[0];
    cr_assert_eq(vt->launch(b, HP_STREAM_COMM, &k2, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->synchronize(b, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->copy_out(b, back, a, N * sizeof(float), &e), HP_OK);
    for (int i = 0; i < N; i++) cr_assert_eq(back[i], h[i] * 2.0f, "at %d", i);
    uint64_t peak = 0;
    cr_assert_eq(vt->memory_peak(b, &peak, &e), HP_OK);
    cr_assert_geq(peak, 2 * N * sizeof(float));
    cr_assert_eq(vt->launch(b, 5, &k1, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "stream 5"), "%s", e.msg);
    vt->event_free(b, ev);
    vt->free(b, a), vt->free(b, c);
    hp_graph_free(g);
    free(h), free(back);
    hp_backend_free(b);
}

static void *dev_of(hp_backend *b, const float *h, int64_t n) {
    void *p = NULL;
    hp_err e = {0};
    cr_assert_eq(b->vt->alloc(b, (size_t)n * 4, &p, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(b->vt->copy_in(b, p, h, (size_t)n * 4, &e), HP_OK, "%s", e.msg);
    return p;
}

Test(cuda_backend, training_math_matches_the_host_functions) {
    hp_backend *b = cu_backend();
    const hp_backend_vtable *vt = b->vt;
    hp_err e = {0};
    enum { N = 300001 };
    float *p = malloc(N * 4), *g = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4);
    float *back = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        p[i] = sinf((float)i * 0.01f);
        g[i] = cosf((float)i * 0.37f) * 0.1f;
    }
    float *dp = dev_of(b, p, N), *dg = dev_of(b, g, N), *dm = dev_of(b, m, N),
          *dv = dev_of(b, v, N);
    hp_adamw_config cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    void *dpb = NULL; /* the parameters' bf16 copy, written with each update */
    cr_assert_eq(vt->alloc(b, N * 2, &dpb, &e), HP_OK, "%s", e.msg);
    uint16_t *pb = malloc(N * 2);
    for (int step = 1; step <= 3; step++) {
        hp_adamw_param hq = {p, g, m, v, N, NULL}, dq = {dp, dg, dm, dv, N, dpb};
        cr_assert_eq(hp_adamw_step(&cfg, 1e-3, step, &hq, 1, NULL, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(vt->adamw(b, &cfg, 1e-3, 1.0f, step, &dq, 1, &e), HP_OK, "%s", e.msg);
    }
    cr_assert_eq(vt->copy_out(b, back, dp, N * 4, &e), HP_OK, "%s", e.msg);
    for (int i = 0; i < N; i++)
        cr_assert(fabsf(back[i] - p[i]) <= 1e-6f * fmaxf(1.0f, fabsf(p[i])), "adamw at %d: %g %g",
                  i, back[i], p[i]);
    cr_assert_eq(vt->copy_out(b, pb, dpb, N * 2, &e), HP_OK, "%s", e.msg);
    for (int i = 0; i < N; i++) cr_assert_eq(pb[i], cc_f32_to_bf16(back[i]), "bf16 copy at %d", i);
    cr_assert_eq(vt->adamw(b, &cfg, -1, 1.0f, 1, NULL, 0, &e), HP_INVALID);
    cr_assert_eq(vt->adamw(b, &cfg, 1e-3, 0.0f, 1, NULL, 0, &e), HP_INVALID);
    /* clipping folded in: the host's scale-then-step bits */
    {
        hp_adamw_param hq = {p, g, m, v, N, NULL}, dq = {dp, dg, dm, dv, N, NULL};
        hp_fspan hs1 = {g, N};
        float *g0 = malloc(N * 4);
        memcpy(g0, g, N * 4);
        cr_assert_eq(hp_grad_scale(&hs1, 1, 0.25f, NULL, &e), HP_OK);
        cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 4, &hq, 1, NULL, &e), HP_OK, "%s", e.msg);
        memcpy(g, g0, N * 4);
        cr_assert_eq(vt->adamw(b, &cfg, 1e-3, 0.25f, 4, &dq, 1, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(vt->copy_out(b, back, dp, N * 4, &e), HP_OK, "%s", e.msg);
        for (int i = 0; i < N; i++)
            cr_assert(fabsf(back[i] - p[i]) <= 1e-6f * fmaxf(1.0f, fabsf(p[i])),
                      "scaled adamw at %d: %g %g", i, back[i], p[i]);
        cr_assert_eq(vt->copy_out(b, back, dg, N * 4, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(memcmp(back, g, N * 4), 0, "the device gradients changed");
        free(g0);
    }

    hp_fspan hs[2] = {{g, N}, {p, 1000}}, ds[2] = {{dg, N}, {dp, 1000}};
    double want = 0, got = 0;
    cr_assert_eq(hp_grad_sumsq(hs, 2, NULL, &want, &e), HP_OK);
    cr_assert_eq(vt->sum_squares(b, ds, 2, &got, &e), HP_OK, "%s", e.msg);
    cr_assert(fabs(got - want) <= 1e-12 * want, "sumsq %.17g vs %.17g", got, want);
    /* spans that start off 16-byte alignment take the kernels' one-element paths */
    {
        hp_fspan hu = {g + 1, N - 2}, du = {dg + 1, N - 2};
        cr_assert_eq(hp_grad_sumsq(&hu, 1, NULL, &want, &e), HP_OK);
        cr_assert_eq(vt->sum_squares(b, &du, 1, &got, &e), HP_OK, "%s", e.msg);
        cr_assert(fabs(got - want) <= 1e-12 * want, "unaligned sumsq %.17g vs %.17g", got, want);
        hp_adamw_param hq = {p + 3, g + 3, m + 3, v + 3, N - 3, NULL};
        hp_adamw_param dq = {dp + 3, dg + 3, dm + 3, dv + 3, N - 3, (uint16_t *)dpb + 3};
        cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 5, &hq, 1, NULL, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(vt->adamw(b, &cfg, 1e-3, 1.0f, 5, &dq, 1, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(vt->copy_out(b, back, dp, N * 4, &e), HP_OK, "%s", e.msg);
        for (int i = 0; i < N; i++)
            cr_assert(fabsf(back[i] - p[i]) <= 1e-6f * fmaxf(1.0f, fabsf(p[i])),
                      "unaligned adamw at %d: %g %g", i, back[i], p[i]);
        cr_assert_eq(vt->copy_out(b, pb, dpb, N * 2, &e), HP_OK, "%s", e.msg);
        for (int i = 3; i < N; i++)
            cr_assert_eq(pb[i], cc_f32_to_bf16(back[i]), "unaligned bf16 copy at %d", i);
    }
    cr_assert_eq(vt->scale(b, ds, 1, 0.5f, &e), HP_OK);
    cr_assert_eq(vt->copy_out(b, back, dg, N * 4, &e), HP_OK);
    for (int i = 0; i < N; i++) cr_assert_eq(back[i], g[i] * 0.5f, "scale at %d", i);

    hp_init init;
    cr_assert_eq(hp_init_parse("normal(0, 0.02)", &init, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(vt->fill_init(b, dm, &init, 7, "layers.0.w", 1000, N, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_param_init_fill(&init, 7, "layers.0.w", 1000, N, m, &e), HP_OK);
    cr_assert_eq(vt->copy_out(b, back, dm, N * 4, &e), HP_OK);
    cr_assert(!memcmp(back, m, N * 4), "fill_init differs from hp_param_init_fill");
    vt->free(b, dp), vt->free(b, dg), vt->free(b, dm), vt->free(b, dv), vt->free(b, dpb);
    free(p), free(g), free(m), free(v), free(back), free(pb);
    hp_backend_free(b);
}

Test(cuda_backend, device_faults_are_reported_not_a_crash) {
    hp_backend *b = cu_backend();
    hp_err e = {0};
#ifdef HP_CUDA_BACKEND
    cr_assert_eq(hp_cuda_backend_inject_fault(b, 42, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(b->vt->synchronize(b, &e), HP_INTERNAL);
    cr_assert(strstr(e.msg, "injected kernel fault (value 42)"), "%s", e.msg);
    cr_assert_eq(b->vt->synchronize(b, &e), HP_OK, "the fault stuck: %s", e.msg);
#endif
    /* an embedding index out of range: found on the device, named at synchronize */
    hp_graph *g = hp_graph_new();
    hp_value w = hp_build_placeholder(g, HP_INPUT_DATA, NULL,
                                      hp_type_make(HP_F32, 2, (int64_t[]){8, 4}), NULL);
    hp_value i =
        hp_build_placeholder(g, HP_INPUT_DATA, NULL, hp_type_make(HP_I64, 1, (int64_t[]){3}), NULL);
    hp_value y = hp_build(g, HP_OP_EMBEDDING, (hp_value[]){w, i}, 2, NULL, 0);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    float wh[32] = {0};
    int64_t ih[3] = {1, 9, 2};
    void *dw = dev_of(b, wh, 32), *di = NULL, *dy = NULL;
    cr_assert_eq(b->vt->alloc(b, sizeof ih, &di, &e), HP_OK);
    cr_assert_eq(b->vt->copy_in(b, di, ih, sizeof ih, &e), HP_OK);
    cr_assert_eq(b->vt->alloc(b, 12 * 4, &dy, &e), HP_OK);
    hp_type ti[2] = {*hp_graph_type(g, w), *hp_graph_type(g, i)};
    hp_kernel_call k = {.node = &g->nodes[y.node],
                        .n_in = 2,
                        .n_out = 1,
                        .in = (const void *const[]){dw, di},
                        .in_type = ti,
                        .out = (void *const[]){dy},
                        .out_type = &g->nodes[y.node].out[0]};
    cr_assert_eq(b->vt->launch(b, HP_STREAM_COMPUTE, &k, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(b->vt->synchronize(b, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "embedding: index 9 at position 1 out of range [0, 8)"), "%s", e.msg);
    ih[1] = 3;
    cr_assert_eq(b->vt->copy_in(b, di, ih, sizeof ih, &e), HP_OK);
    cr_assert_eq(b->vt->launch(b, HP_STREAM_COMPUTE, &k, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(b->vt->synchronize(b, &e), HP_OK, "%s", e.msg);
    b->vt->free(b, dw), b->vt->free(b, di), b->vt->free(b, dy);
    hp_graph_free(g);
    hp_backend_free(b);
}
