/* The backend factory (worker/backend.h): the job's device picks the backend; a device this
 * hp-worker cannot run is one clear line, never a CPU backend; every vtable entry the
 * training loop calls exists; hp/device.h's names round-trip. */
#include "cpu_check.h"
#include "hp/device.h"
#include "hp/param_init.h"
#include "worker/backend.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(backend, cpu_from_the_factory) {
    setenv("HP_CPU_PEAK_FLOPS", "2e11", 1);
    hp_backend_opts o = {.threads = 2};
    hp_backend *b = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CPU, &o, &b, &e), HP_OK, "%s", e.msg);
    cr_assert_str_eq(b->vt->name, "cpu");
    const hp_backend_vtable *v = b->vt;
    /* the training loop calls every one of these */
    cr_assert(v->info && v->alloc && v->free && v->copy_in && v->copy_out && v->launch &&
              v->collective && v->event_new && v->event_free && v->event_record && v->event_wait &&
              v->synchronize && v->destroy && v->adamw && v->sum_squares && v->scale &&
              v->fill_init && v->memory_peak && v->comm_busy && v->set_comm_trace);
    hp_device_info di;
    cr_assert_eq(v->info(b, &di, &e), HP_OK);
    cr_assert_eq(di.threads, 2);
    cr_assert_eq(di.peak_flops, 2e11, "the peak comes from the backend's info");
    cr_assert_gt(di.memory_bytes, 1 << 20);
    uint64_t peak = 0;
    cr_assert_eq(v->memory_peak(b, &peak, &e), HP_OK);
    cr_assert_gt(peak, 0);
    cr_assert_eq(v->comm_busy(b), 0);
    hp_backend_free(b);
    /* no options: the default thread count */
    cr_assert_eq(hp_backend_new(HP_DEVICE_CPU, NULL, &b, &e), HP_OK, "%s", e.msg);
    hp_backend_free(b);
}

/* The optimizer entries are hp/optim.h's functions, bit for bit. */
Test(backend, math_entries_match_optim) {
    hp_backend *b = NULL;
    hp_backend_opts o = {.threads = 3};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CPU, &o, &b, NULL), HP_OK);
    enum { N = 70000 };
    void *p, *g, *m, *v;
    cr_assert_eq(b->vt->alloc(b, N * sizeof(float), &p, NULL), HP_OK);
    cr_assert_eq(b->vt->alloc(b, N * sizeof(float), &g, NULL), HP_OK);
    cr_assert_eq(b->vt->alloc(b, N * sizeof(float), &m, NULL), HP_OK);
    cr_assert_eq(b->vt->alloc(b, N * sizeof(float), &v, NULL), HP_OK);
    float *hp_ = malloc(N * sizeof(float)), *hg = malloc(N * sizeof(float));
    float *hm = calloc(N, sizeof(float)), *hv = calloc(N, sizeof(float));
    hp_init init = {.kind = HP_INIT_NORMAL, .mean = 0, .std = 0.02};
    cr_assert_eq(b->vt->fill_init(b, p, &init, 7, "w", 100, N, NULL), HP_OK);
    cr_assert_eq(hp_param_init_fill(&init, 7, "w", 100, N, hp_, NULL), HP_OK);
    for (int i = 0; i < N; i++) hg[i] = (float)((i % 97) - 48) * 1e-3f;
    cr_assert_eq(b->vt->copy_in(b, g, hg, N * sizeof(float), NULL), HP_OK);
    hp_fspan dev = {g, N}, host = {hg, N};
    double s1, s2;
    cr_assert_eq(b->vt->sum_squares(b, &dev, 1, &s1, NULL), HP_OK);
    cr_assert_eq(hp_grad_sumsq(&host, 1, NULL, &s2, NULL), HP_OK);
    cr_assert_eq(memcmp(&s1, &s2, sizeof s1), 0);
    cr_assert_eq(b->vt->scale(b, &dev, 1, 0.5f, NULL), HP_OK);
    cr_assert_eq(hp_grad_scale(&host, 1, 0.5f, NULL, NULL), HP_OK);
    hp_adamw_config cfg = hp_adamw_defaults();
    void *pb;
    cr_assert_eq(b->vt->alloc(b, N * sizeof(uint16_t), &pb, NULL), HP_OK);
    hp_adamw_param dp = {p, g, m, v, N, pb}, hq = {hp_, hg, hm, hv, N, NULL};
    cr_assert_eq(b->vt->adamw(b, &cfg, 1e-3, 1.0f, 1, &dp, 1, NULL), HP_OK);
    cr_assert_eq(hp_adamw_step(&cfg, 1e-3, 1, &hq, 1, NULL, NULL), HP_OK);
    float *back = malloc(N * sizeof(float));
    cr_assert_eq(b->vt->copy_out(b, back, p, N * sizeof(float), NULL), HP_OK);
    cr_assert_eq(memcmp(back, hp_, N * sizeof(float)), 0, "adamw differs from hp_adamw_step");
    /* the bf16 copy holds the updated parameters rounded to nearest even (_to_copy's bits) */
    uint16_t *bb = malloc(N * sizeof(uint16_t));
    cr_assert_eq(b->vt->copy_out(b, bb, pb, N * sizeof(uint16_t), NULL), HP_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(bb[i], cc_f32_to_bf16(hp_[i]), "bf16 copy at %d: 0x%04x, not 0x%04x", i, bb[i],
                     cc_f32_to_bf16(hp_[i]));
    free(bb);
    b->vt->free(b, pb);
    /* errors are the functions' errors */
    hp_err e = {0};
    cr_assert_eq(b->vt->adamw(b, &cfg, -1, 1.0f, 1, &dp, 1, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "lr"), "%s", e.msg);
    cr_assert_eq(b->vt->fill_init(b, p, &init, 7, "", 0, 1, &e), HP_INVALID);
    cr_assert_eq(b->vt->memory_peak(b, NULL, &e), HP_INVALID);
    free(hp_), free(hg), free(hm), free(hv), free(back);
    b->vt->free(b, p), b->vt->free(b, g), b->vt->free(b, m), b->vt->free(b, v);
    hp_backend_free(b);
}

Test(backend, cuda_without_cuda_is_one_line_never_the_cpu) {
    if (hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK) cr_skip_test("this build has CUDA");
    hp_backend *b = (hp_backend *)1;
    hp_err e = {0};
    cr_assert_eq(hp_backend_new(HP_DEVICE_CUDA, NULL, &b, &e), HP_UNSUPPORTED);
    cr_assert_null(b);
    cr_assert(!strncmp(e.msg, "device cuda: this hp-worker was built without CUDA", 50), "%s",
              e.msg);
    cr_assert_null(strchr(e.msg, '\n'));
    cr_assert_eq(hp_backend_new((hp_device_kind)7, NULL, &b, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "device 7"), "%s", e.msg);
    cr_assert_eq(hp_backend_new(HP_DEVICE_CPU, NULL, NULL, &e), HP_INVALID);
}

Test(backend, device_names) {
    hp_device_kind d;
    cr_assert_eq(hp_device_parse("cpu", &d, NULL), HP_OK);
    cr_assert_eq(d, HP_DEVICE_CPU);
    cr_assert_eq(hp_device_parse("cuda", &d, NULL), HP_OK);
    cr_assert_eq(d, HP_DEVICE_CUDA);
    cr_assert_str_eq(hp_device_name(HP_DEVICE_CPU), "cpu");
    cr_assert_str_eq(hp_device_name(HP_DEVICE_CUDA), "cuda");
    cr_assert_str_eq(hp_device_name((hp_device_kind)9), "?");
    hp_err e = {0};
    cr_assert_eq(hp_device_parse("CUDA", &d, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "'CUDA'") && strstr(e.msg, "cpu or cuda"), "%s", e.msg);
    cr_assert_eq(hp_device_parse(NULL, &d, &e), HP_INVALID);
    cr_assert_eq(hp_device_built(HP_DEVICE_CPU, NULL), HP_OK);
}
