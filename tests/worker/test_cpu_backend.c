/* tests/worker/test_cpu_backend.c — the cpu backend's vtable outside the kernels' math: device
 * info, aligned zeroed memory, copies, trivial events, the kernel table covering every op,
 * clear errors (unsupported dtypes naming the op and dtype, out-of-range indices and targets,
 * integer division by zero, collectives that need a communicator, calls that disagree with
 * their node), aliasing views, and failed allocations that leave nothing behind.
 */
#include "cpu_check.h"

#include "hp/build.h"
#include "hp/threads.h"

#include <stdint.h>
#include <stdlib.h>

Test(cpu_backend, info) {
    setenv("HP_CPU_PEAK_FLOPS", "1.25e11", 1); /* the peak comes from hp_cpu_peak_flops */
    hp_backend *be = cc_backend(3);
    hp_device_info info;
    hp_err e = {0};
    cr_assert_eq(be->vt->info(be, &info, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(strncmp(info.name, "cpu: ", 5), 0, "name '%s'", info.name);
    cr_assert(strstr(info.name, "(3 threads)"), "name '%s'", info.name);
    cr_assert_gt(info.memory_bytes, (int64_t)1 << 20);
    cr_assert(info.host_visible);
    cr_assert_eq(info.threads, 3);
    cr_assert_eq(info.peak_flops, 1.25e11);
    cr_assert_str_eq(be->vt->name, "cpu");
    hp_backend_free(be);
}

Test(cpu_backend, default_threads) {
    hp_backend *be = cc_backend(0);
    hp_device_info info;
    cr_assert_eq(be->vt->info(be, &info, NULL), HP_OK);
    cr_assert_eq(info.threads, hp_default_threads());
    hp_backend_free(be);
    hp_err e = {0};
    hp_backend *bad = NULL;
    cr_assert_eq(hp_cpu_backend_new(HP_POOL_MAX_THREADS + 1, &bad, &e), HP_INVALID);
    cr_assert_null(bad);
}

Test(cpu_backend, memory_and_copies) {
    hp_backend *be = cc_backend(2);
    const hp_backend_vtable *vt = be->vt;
    size_t sizes[] = {0, 1, 63, 4096, (size_t)3 << 20};
    for (size_t i = 0; i < HP_ARRAY_LEN(sizes); i++) {
        void *p = NULL;
        cr_assert_eq(vt->alloc(be, sizes[i], &p, NULL), HP_OK);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0, "not 64-byte aligned");
        for (size_t k = 0; k < sizes[i]; k++) cr_assert_eq(((uint8_t *)p)[k], 0, "not zeroed");
        uint8_t *host = malloc(sizes[i] + 1), *back = malloc(sizes[i] + 1);
        for (size_t k = 0; k < sizes[i]; k++) host[k] = (uint8_t)(k * 7 + 1);
        cr_assert_eq(vt->copy_in(be, p, host, sizes[i], NULL), HP_OK);
        cr_assert_eq(vt->copy_out(be, back, p, sizes[i], NULL), HP_OK);
        cr_assert_eq(memcmp(host, back, sizes[i]), 0);
        free(host);
        free(back);
        vt->free(be, p);
    }
    vt->free(be, NULL);
    hp_backend_free(be);
    hp_backend_free(NULL);
}

Test(cpu_backend, events_and_streams) {
    hp_backend *be = cc_backend(1);
    const hp_backend_vtable *vt = be->vt;
    hp_event *ev = NULL;
    cr_assert_eq(vt->event_new(be, &ev, NULL), HP_OK);
    cr_assert_eq(vt->event_record(be, ev, HP_STREAM_COMPUTE, NULL), HP_OK);
    cr_assert_eq(vt->event_wait(be, ev, HP_STREAM_COMM, NULL), HP_OK);
    hp_err e = {0};
    cr_assert_eq(vt->event_wait(be, ev, 7, &e), HP_INVALID);
    cr_assert_eq(vt->synchronize(be, NULL), HP_OK);
    vt->event_free(be, ev);
    hp_backend_free(be);
}

/* Builds `op` over inputs of the given types and launches it; returns the status and err. */
static hp_status launch_one(hp_backend *be, hp_op op, const hp_type *types, int n_in,
                            const double *const *data, const hp_attr *a, int na, hp_err *e) {
    hp_th h;
    hp_th_init(&h);
    hp_value in[8];
    for (int i = 0; i < n_in; i++)
        in[i] = data && data[i] ? cc_input(&h, types[i], data[i])
                                : cc_rand_input(&h, types[i], (uint64_t)i, -1, 1);
    hp_value v = hp_build(h.g, op, in, n_in, a, na);
    cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
    cc_result r;
    hp_status st = cc_run(be, &h, v.node, 0, &r, NULL, e);
    cc_result_free(&r);
    hp_th_fini(&h);
    return st;
}

/* f16 storage is not implemented (bf16 is: test_cpu_ops.c's bf16 cases): refused naming the
 * op and the dtype. */
Test(cpu_backend, unsupported_dtype_names_op_and_dtype) {
    hp_backend *be = cc_backend(2);
    hp_err e = {0};
    hp_type bf = TY(HP_BF16, 4, 4), f16 = TY(HP_F16, 3, 3);
    cr_assert_eq(launch_one(be, HP_OP_EXP, &f16, 1, NULL, NULL, 0, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "exp") && strstr(e.msg, "f16"), "message: %s", e.msg);
    hp_type two[2] = {f16, f16};
    cr_assert_eq(launch_one(be, HP_OP_MM, two, 2, NULL, NULL, 0, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "mm") && strstr(e.msg, "f16"), "message: %s", e.msg);
    hp_type bf2[2] = {bf, bf};
    cr_assert_eq(launch_one(be, HP_OP_ADD, bf2, 2, NULL, NULL, 0, &e), HP_OK, "%s", e.msg);
    /* data movement takes any dtype */
    cr_assert_eq(launch_one(be, HP_OP_T, &f16, 1, NULL, NULL, 0, &e), HP_OK, "%s", e.msg);
    hp_backend_free(be);
}

Test(cpu_backend, bad_indices_and_targets) {
    hp_backend *be = cc_backend(2);
    hp_err e = {0};
    double idx[4] = {1, 2, 50, 0};
    hp_type et[2] = {TY(HP_F32, 50, 4), TY(HP_I64, 4)};
    const double *ed[2] = {NULL, idx};
    cr_assert_eq(launch_one(be, HP_OP_EMBEDDING, et, 2, ed, NULL, 0, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "embedding") && strstr(e.msg, "index 50 at position 2"), "%s", e.msg);
    idx[2] = -1;
    cr_assert_eq(launch_one(be, HP_OP_EMBEDDING, et, 2, ed, NULL, 0, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "index -1"), "%s", e.msg);
    double tg[3] = {0, -100, 9};
    hp_type nt[2] = {TY(HP_F32, 3, 9), TY(HP_I32, 3)};
    const double *nd[2] = {NULL, tg};
    cr_assert_eq(launch_one(be, HP_OP_NLL_LOSS_FORWARD, nt, 2, nd, NULL, 0, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "nll_loss_forward") && strstr(e.msg, "target 9 at position 2"), "%s",
              e.msg);
    double a[3] = {7, 8, 9}, b[3] = {1, 0, 2};
    hp_type it[2] = {TY(HP_I32, 3), TY(HP_I32, 3)};
    const double *dd[2] = {a, b};
    cr_assert_eq(launch_one(be, HP_OP_DIV, it, 2, dd, NULL, 0, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "division by zero"), "%s", e.msg);
    hp_backend_free(be);
}

/* A hand-made call on node `node` of g with host buffers. */
static hp_status call(hp_backend *be, const hp_graph *g, int node, unsigned flags, void **in,
                      const hp_type *in_type, void **out, const hp_type *out_type, hp_err *e) {
    const hp_node *n = &g->nodes[node];
    hp_kernel_call c = {.node = n,
                        .flags = flags,
                        .n_in = n->n_in,
                        .n_out = n->n_out,
                        .in = (const void *const *)in,
                        .in_type = in_type,
                        .out = out,
                        .out_type = out_type};
    return be->vt->launch(be, HP_STREAM_COMPUTE, &c, e);
}

Test(cpu_backend, calls_that_disagree_with_their_node) {
    hp_backend *be = cc_backend(2);
    hp_graph *g = hp_graph_new();
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, TY(HP_F32, 4, 3), NULL);
    hp_value y = hp_build_placeholder(g, HP_INPUT_DATA, NULL, TY(HP_F32, 4, 3), NULL);
    hp_value s = hp_add(g, x, y);
    hp_value c = hp_build(
        g, HP_OP_ALL_REDUCE, &x, 1,
        (hp_attr[]){hp_attr_int(HP_ATTR_GROUP_SIZE, 4), hp_attr_int(HP_ATTR_REDUCE_OP, 0)}, 2);
    cr_assert(!hp_graph_failed(g), "%s", g->err.msg);
    float a[12] = {0}, b[12] = {0}, o[12];
    void *in[2] = {a, b}, *out[1] = {o};
    hp_type tt[2] = {TY(HP_F32, 4, 3), TY(HP_F32, 4, 3)}, wrong = TY(HP_F32, 3, 4);
    hp_err e = {0};
    /* output type differs from the node's */
    cr_assert_eq(call(be, g, s.node, 0, in, tt, out, &wrong, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "add") && strstr(e.msg, "declares"), "%s", e.msg);
    /* transpose flags on an elementwise op */
    cr_assert_eq(call(be, g, s.node, HP_CALL_TRANS_A, in, tt, out, tt, &e), HP_INVALID);
    /* input that does not broadcast */
    hp_type bad_in[2] = {TY(HP_F32, 4, 3), TY(HP_F32, 2, 3)};
    cr_assert_eq(call(be, g, s.node, 0, in, bad_in, out, tt, &e), HP_INVALID);
    cr_assert(strstr(e.msg, "broadcast"), "%s", e.msg);
    /* placeholders are fed, not launched */
    cr_assert_eq(call(be, g, x.node, 0, NULL, NULL, out, tt, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "placeholder"), "%s", e.msg);
    /* a collective over 4 ranks needs a communicator */
    cr_assert_eq(call(be, g, c.node, 0, in, tt, out, tt, &e), HP_UNSUPPORTED);
    cr_assert(strstr(e.msg, "all_reduce") && strstr(e.msg, "communicator"), "%s", e.msg);
    hp_kernel_call cc = {.node = &g->nodes[c.node],
                         .n_in = 1,
                         .n_out = 1,
                         .in = (const void *const *)in,
                         .in_type = tt,
                         .out = out,
                         .out_type = tt};
    cr_assert_eq(be->vt->collective(be, HP_STREAM_COMM, &cc, &e), HP_UNSUPPORTED);
    /* a stream that does not exist */
    hp_kernel_call sc = {.node = &g->nodes[s.node],
                         .n_in = 2,
                         .n_out = 1,
                         .in = (const void *const *)in,
                         .in_type = tt,
                         .out = out,
                         .out_type = tt};
    cr_assert_eq(be->vt->launch(be, 2, &sc, &e), HP_INVALID);
    hp_graph_free(g);
    hp_backend_free(be);
}

/* View-like ops may be handed an output that aliases the input: then nothing moves. */
Test(cpu_backend, aliasing_view) {
    hp_backend *be = cc_backend(2);
    hp_graph *g = hp_graph_new();
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, TY(HP_F32, 4, 6), NULL);
    hp_value v = hp_view(g, x, 2, (int64_t[]){2, 12});
    hp_value u = hp_unsqueeze(g, x, 0);
    cr_assert(!hp_graph_failed(g));
    float buf[24];
    for (int i = 0; i < 24; i++) buf[i] = (float)i;
    void *in[1] = {buf}, *out[1] = {buf};
    hp_type it = TY(HP_F32, 4, 6);
    hp_err e = {0};
    cr_assert_eq(call(be, g, v.node, 0, in, &it, out, hp_graph_type(g, v), &e), HP_OK, "%s", e.msg);
    cr_assert_eq(call(be, g, u.node, 0, in, &it, out, hp_graph_type(g, u), &e), HP_OK, "%s", e.msg);
    for (int i = 0; i < 24; i++) cr_assert_eq(buf[i], (float)i);
    hp_graph_free(g);
    hp_backend_free(be);
}

/* Every failing allocation while creating a backend and running a scratch-hungry kernel is a
 * clean HP_NOMEM (run under ASan to see that nothing leaks). */
Test(cpu_backend, allocation_failures) {
    for (long n = 0; n < 64; n++) {
        hp_alloc_fail_at(n);
        hp_backend *be = NULL;
        hp_err e = {0};
        hp_status st = hp_cpu_backend_new(2, &be, &e);
        hp_alloc_fail_at(-1);
        if (st != HP_OK) {
            cr_assert(st == HP_NOMEM || st == HP_INTERNAL, "%s", e.msg);
            cr_assert_null(be);
            continue;
        }
        void *p = NULL;
        hp_alloc_fail_at(0);
        st = be->vt->alloc(be, 1024, &p, &e);
        hp_alloc_fail_at(-1);
        cr_assert_eq(st, HP_NOMEM);
        cr_assert_null(p);
        hp_backend_free(be);
        break;
    }
    /* a kernel whose scratch cannot be allocated */
    hp_backend *be = cc_backend(2);
    hp_graph *g = hp_graph_new();
    hp_value x = hp_build_placeholder(g, HP_INPUT_DATA, NULL, TY(HP_F32, 64, 64), NULL);
    hp_value s = hp_sum(g, x, 0, NULL, false);
    cr_assert(!hp_graph_failed(g));
    float *buf = calloc(64 * 64, sizeof *buf), o = 0;
    void *in[1] = {buf}, *out[1] = {&o};
    hp_type it = TY(HP_F32, 64, 64), ot = TY0(HP_F32);
    hp_err e = {0};
    hp_alloc_fail_at(0);
    hp_status st = call(be, g, s.node, 0, in, &it, out, &ot, &e);
    hp_alloc_fail_at(-1);
    cr_assert_eq(st, HP_NOMEM, "%s", e.msg);
    cr_assert_eq(call(be, g, s.node, 0, in, &it, out, &ot, &e), HP_OK, "%s", e.msg);
    free(buf);
    hp_graph_free(g);
    hp_backend_free(be);
}
