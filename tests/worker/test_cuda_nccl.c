/* tests/worker/test_cuda_nccl.c — the cuda backend's NCCL collectives (the bootstrap over the
 * shm communicator, the unique id, the comm stream, every collective the executor issues,
 * busy time): on a 1-rank world against the identity, and on world 2 (two processes, a GPU
 * each) against the collectives' definitions, exactly; a peer that dies makes the survivor's
 * collective fail with an NCCL error, sticky, instead of hanging. Skips cleanly without a
 * device or, for world 2, with fewer than 2 (cuda_check.h); on cuemu the ranks get emulated
 * devices of their own and NCCL runs over shared memory (tests/cuemu/README.md). */
#include "cpu_check.h"
#include "cuda_check.h"

#include "hp/comm.h"
#ifdef HP_CUDA_BACKEND
#include "worker/cuda/cuda_internal.h"
#endif

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(cuda_nccl, .timeout = 600);

Test(cuda_nccl, one_rank_collectives_run_on_nccl) {
    CU_SKIP_WITHOUT_DEVICE();
#ifdef HP_CUDA_BACKEND
    char name[64];
    snprintf(name, sizeof name, "hp-cuda-nccl-%d", (int)getpid());
    hp_comm *world = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_shm_comm_new(name, 0, 1, 10, &world, &e), HP_OK, "%s", e.msg);
    hp_backend_opts bo = {.comm = world};
    hp_backend *be = NULL;
    cr_assert_eq(hp_backend_new(HP_DEVICE_CUDA, &bo, &be, &e), HP_OK, "%s", e.msg);
    hp__cuda *cu = (hp__cuda *)be;
    cr_assert(cu->nccl, "no NCCL communicator");
    const hp_op ops[] = {HP_OP_ALL_GATHER, HP_OP_REDUCE_SCATTER, HP_OP_ALL_REDUCE, HP_OP_ALL_TO_ALL,
                         HP_OP_LOCAL_CHUNK};
    /* gathers and all-to-alls move any dtype's bytes (bool: loss parallel's masks, which an
     * auto plan may gather); reductions take NCCL's float types */
    const hp_dtype dts[] = {HP_F32, HP_BF16, HP_BOOL, HP_I64};
    for (size_t o = 0; o < HP_ARRAY_LEN(ops); o++)
        for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++) {
            bool reduces = ops[o] == HP_OP_REDUCE_SCATTER || ops[o] == HP_OP_ALL_REDUCE;
            if (reduces && (dts[d] == HP_BOOL || dts[d] == HP_I64)) continue;
            hp_th h;
            hp_th_init(&h);
            hp_value x = cc_rand_input(&h, TY(dts[d], 64, 33), 5 + o, -3, 3);
            hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 1),
                            ops[o] == HP_OP_LOCAL_CHUNK ? hp_attr_int(HP_ATTR_DIM, 1)
                                                        : hp_attr_int(HP_ATTR_REDUCE_OP, 1)};
            bool two = ops[o] != HP_OP_ALL_GATHER && ops[o] != HP_OP_ALL_TO_ALL;
            hp_value v = hp_build(h.g, ops[o], &x, 1, a, two ? 2 : 1);
            cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
            /* through the NCCL path directly (the backend sends group_size 1 to a copy) */
            const hp_node *n = &h.g->nodes[v.node];
            size_t bytes = (size_t)hp_type_numel(&n->out[0]) * hp_dtype_size(dts[d]);
            void *host = cc_pack(h.in[0].data, hp_type_numel(&h.in[0].type), dts[d]);
            void *din = NULL, *dout = NULL, *back = malloc(bytes);
            cr_assert_eq(be->vt->alloc(be, bytes, &din, &e), HP_OK);
            cr_assert_eq(be->vt->alloc(be, bytes, &dout, &e), HP_OK);
            cr_assert_eq(be->vt->copy_in(be, din, host, bytes, &e), HP_OK);
            hp_type tin = h.in[0].type;
            hp_kernel_call c = {.node = n,
                                .n_in = 1,
                                .n_out = 1,
                                .in = (const void *const[]){din},
                                .in_type = &tin,
                                .out = (void *const[]){dout},
                                .out_type = &n->out[0]};
            cr_assert_eq(hp__cuda_nccl_collective(cu, &c, &e), HP_OK, "%s: %s",
                         hp_op_get(ops[o])->name, e.msg);
            cr_assert_eq(be->vt->synchronize(be, &e), HP_OK, "%s", e.msg);
            cr_assert_eq(be->vt->copy_out(be, back, dout, bytes, &e), HP_OK);
            cr_assert(!memcmp(back, host, bytes), "%s of %s: not the identity on one rank",
                      hp_op_get(ops[o])->name, hp_dtype_name(dts[d]));
            be->vt->free(be, din), be->vt->free(be, dout);
            free(host), free(back);
            hp_th_fini(&h);
        }
    cr_expect_gt(be->vt->comm_busy(be), 0, "no comm time measured");
    { /* a reduction NCCL has no type for is refused naming it */
        hp_th h;
        hp_th_init(&h);
        hp_value x = cc_rand_input(&h, TY(HP_BOOL, 8), 1, 0, 1);
        hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 1), hp_attr_int(HP_ATTR_REDUCE_OP, 1)};
        hp_value v = hp_build(h.g, HP_OP_ALL_REDUCE, &x, 1, a, 2);
        cr_assert(!hp_graph_failed(h.g), "%s", h.g->err.msg);
        void *buf = NULL;
        cr_assert_eq(be->vt->alloc(be, 8, &buf, &e), HP_OK);
        hp_type t = h.in[0].type;
        hp_kernel_call c = {.node = &h.g->nodes[v.node],
                            .n_in = 1,
                            .n_out = 1,
                            .in = (const void *const[]){buf},
                            .in_type = &t,
                            .out = (void *const[]){buf},
                            .out_type = &t};
        cr_expect_eq(hp__cuda_nccl_collective(cu, &c, &e), HP_UNSUPPORTED);
        cr_expect(strstr(e.msg, "all_reduce of dtype bool: NCCL has no type to reduce it in"), "%s",
                  e.msg);
        be->vt->free(be, buf);
        hp_th_fini(&h);
    }
    hp_backend_free(be);
    hp_comm_free(world);
#endif
}

#ifdef HP_CUDA_BACKEND
/* ---- world 2 ------------------------------------------------------------------------------- */

/* Skips unless `world` devices exist (cuemu: gives this process and its ranks that many). */
static void need_devices(int world) {
    CU_SKIP_WITHOUT_DEVICE();
#ifdef HP_CUDA_EMU
    char n[8];
    snprintf(n, sizeof n, "%d", world);
    setenv("HP_CUEMU_DEVICES", n, 1);
#endif
    int have = hp_cuda_device_count(NULL, 0);
    if (have < world) cr_skip_test("needs %d GPUs, one a rank; this machine has %d", world, have);
}

typedef int (*rank_fn)(hp_backend *be, int rank, int world);

/* Runs fn on `world` forked ranks, each with the backend on an shm communicator (device: rank
 * % count, as hp-worker takes it). A rank reports a failure on stderr and exits non-zero;
 * returns the ranks' wait statuses. */
static void on_ranks(int world, rank_fn fn, int *status) {
    char name[64];
    snprintf(name, sizeof name, "hp-cuda-nccl-w%d-%d", world, (int)getpid());
    pid_t pid[8];
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        cr_assert(pid[r] >= 0, "fork");
        if (pid[r] > 0) continue;
        hp_comm *comm = NULL;
        hp_err e = {0};
        if (hp_shm_comm_new(name, r, world, 60, &comm, &e) != HP_OK) {
            fprintf(stderr, "rank %d: %s\n", r, e.msg);
            _exit(2);
        }
        hp_backend_opts bo = {.comm = comm};
        hp_backend *be = NULL;
        if (hp_backend_new(HP_DEVICE_CUDA, &bo, &be, &e) != HP_OK) {
            fprintf(stderr, "rank %d: %s\n", r, e.msg);
            _exit(3);
        }
        int rc = fn(be, r, world);
        hp_backend_free(be);
        hp_comm_free(comm);
        _exit(rc);
    }
    for (int r = 0; r < world; r++) cr_assert_eq(waitpid(pid[r], &status[r], 0), pid[r]);
}

/* Rank r's input element i: quarter steps in [-2, 2], so sums and averages of 2 are exact
 * in f32 and in bf16. */
static double val(int r, int64_t i) {
    return (double)((i * 7 + r * 13) % 17 - 8) * 0.25;
}

/* What element j of op's output on rank `me` of `world` is, for inputs of n elements laid
 * out [rows, cols]. */
static double want(hp_op op, int me, int world, int64_t j, int64_t n, int64_t cols) {
    int64_t c = n / world;
    switch (op) {
    case HP_OP_ALL_GATHER:
        return val((int)(j / n), j % n);
    case HP_OP_REDUCE_SCATTER: { /* sum */
        double s = 0;
        for (int r = 0; r < world; r++) s += val(r, me * c + j);
        return s;
    }
    case HP_OP_ALL_REDUCE: { /* avg */
        double s = 0;
        for (int r = 0; r < world; r++) s += val(r, j);
        return s / world;
    }
    case HP_OP_ALL_TO_ALL:
        return val((int)(j / c), me * c + j % c);
    default: { /* local_chunk along dim 1 */
        int64_t w = cols / world;
        return val(me, (j / w) * cols + me * w + j % w);
    }
    }
}

static int collectives_rank(hp_backend *be, int me, int world) {
    hp__cuda *cu = (hp__cuda *)be;
    const hp_op ops[] = {HP_OP_ALL_GATHER, HP_OP_REDUCE_SCATTER, HP_OP_ALL_REDUCE, HP_OP_ALL_TO_ALL,
                         HP_OP_LOCAL_CHUNK};
    const hp_dtype dts[] = {HP_F32, HP_BF16};
    const int64_t rows = 64, cols = 32, n = rows * cols;
    int bad = 0;
    for (size_t o = 0; o < HP_ARRAY_LEN(ops); o++)
        for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++) {
            const char *what = hp_op_get(ops[o])->name, *dt = hp_dtype_name(dts[d]);
            hp_th h;
            hp_th_init(&h);
            hp_value x = cc_rand_input(&h, TY(dts[d], rows, cols), 1, -1, 1);
            int64_t red = ops[o] == HP_OP_ALL_REDUCE ? HP_REDUCE_AVG : HP_REDUCE_SUM;
            hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, world),
                            ops[o] == HP_OP_LOCAL_CHUNK ? hp_attr_int(HP_ATTR_DIM, 1)
                                                        : hp_attr_int(HP_ATTR_REDUCE_OP, red)};
            bool two = ops[o] != HP_OP_ALL_GATHER && ops[o] != HP_OP_ALL_TO_ALL;
            hp_value v = hp_build(h.g, ops[o], &x, 1, a, two ? 2 : 1);
            if (hp_graph_failed(h.g)) {
                fprintf(stderr, "rank %d: %s: %s\n", me, what, h.g->err.msg);
                return 1;
            }
            const hp_node *nd = &h.g->nodes[v.node];
            int64_t out_n = hp_type_numel(&nd->out[0]);
            size_t es = hp_dtype_size(dts[d]), in_b = (size_t)n * es, out_b = (size_t)out_n * es;
            double *xin = malloc((size_t)n * sizeof *xin), *xw = malloc((size_t)out_n * sizeof *xw);
            for (int64_t i = 0; i < n; i++) xin[i] = val(me, i);
            for (int64_t j = 0; j < out_n; j++) xw[j] = want(ops[o], me, world, j, n, cols);
            void *host = cc_pack(xin, n, dts[d]), *expect = cc_pack(xw, out_n, dts[d]);
            void *back = malloc(out_b), *din = NULL, *dout = NULL;
            hp_err e = {0};
            hp_status st = be->vt->alloc(be, in_b, &din, &e);
            if (st == HP_OK) st = be->vt->alloc(be, out_b, &dout, &e);
            if (st == HP_OK) st = be->vt->copy_in(be, din, host, in_b, &e);
            hp_type tin = h.in[0].type;
            hp_kernel_call c = {.node = nd,
                                .n_in = 1,
                                .n_out = 1,
                                .in = (const void *const[]){din},
                                .in_type = &tin,
                                .out = (void *const[]){dout},
                                .out_type = &nd->out[0]};
            if (st == HP_OK) st = hp__cuda_nccl_collective(cu, &c, &e);
            if (st == HP_OK) st = be->vt->synchronize(be, &e);
            if (st == HP_OK) st = be->vt->copy_out(be, back, dout, out_b, &e);
            if (st != HP_OK) {
                fprintf(stderr, "rank %d: %s of %s: %s\n", me, what, dt, e.msg);
                return 1;
            }
            if (memcmp(back, expect, out_b)) {
                fprintf(stderr, "rank %d: %s of %s on world %d: not its definition\n", me, what, dt,
                        world);
                bad++;
            }
            be->vt->free(be, din), be->vt->free(be, dout);
            free(host), free(expect), free(back), free(xin), free(xw);
            hp_th_fini(&h);
        }
    if (!(be->vt->comm_busy(be) > 0)) {
        fprintf(stderr, "rank %d: no comm time measured\n", me);
        bad++;
    }
    return bad ? 1 : 0;
}

Test(cuda_nccl, world_2_collectives_equal_their_definitions) {
    need_devices(2);
    int status[2];
    on_ranks(2, collectives_rank, status);
    for (int r = 0; r < 2; r++)
        cr_expect(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                  "rank %d failed (status 0x%x; its reasons are above)", r, status[r]);
}

/* Rank 1 is killed once both have set up; rank 0's all_reduce then must fail (at enqueue or
 * at synchronize) with an NCCL error within the deadline, and every later collective with the
 * same error. */
static int dead_peer_rank(hp_backend *be, int me, int world) {
    (void)world;
    if (me == 1) {
        kill(getpid(), SIGKILL);
        return 9;
    }
    hp__cuda *cu = (hp__cuda *)be;
    hp_th h;
    hp_th_init(&h);
    hp_value x = cc_rand_input(&h, TY(HP_F32, 1024), 1, -1, 1);
    hp_attr a[2] = {hp_attr_int(HP_ATTR_GROUP_SIZE, 2),
                    hp_attr_int(HP_ATTR_REDUCE_OP, HP_REDUCE_SUM)};
    hp_value v = hp_build(h.g, HP_OP_ALL_REDUCE, &x, 1, a, 2);
    if (hp_graph_failed(h.g)) {
        fprintf(stderr, "rank 0: all_reduce: %s\n", h.g->err.msg);
        return 1;
    }
    const hp_node *nd = &h.g->nodes[v.node];
    void *buf = NULL;
    hp_err e = {0}, e2 = {0};
    if (be->vt->alloc(be, 4096, &buf, &e) != HP_OK) return 1;
    hp_type tin = h.in[0].type;
    hp_kernel_call c = {.node = nd,
                        .n_in = 1,
                        .n_out = 1,
                        .in = (const void *const[]){buf},
                        .in_type = &tin,
                        .out = (void *const[]){buf},
                        .out_type = &nd->out[0]};
    time_t t0 = time(NULL);
    hp_status st = hp__cuda_nccl_collective(cu, &c, &e);
    if (st == HP_OK) st = be->vt->synchronize(be, &e);
    int rc = 0;
    if (st != HP_IO || !strstr(e.msg, "nccl") || !strstr(e.msg, "aborted")) {
        fprintf(stderr, "rank 0: a dead peer gave status %d: %s\n", st, e.msg);
        rc = 1;
    }
    if (time(NULL) - t0 > 120) {
        fprintf(stderr, "rank 0: the failure took %lld s\n", (long long)(time(NULL) - t0));
        rc = 1;
    }
    st = hp__cuda_nccl_collective(cu, &c, &e2);
    if (st != HP_IO || strcmp(e.msg, e2.msg)) {
        fprintf(stderr, "rank 0: the next collective gave status %d: %s\n", st, e2.msg);
        rc = 1;
    }
    fprintf(stderr, "rank 0 (expected): %s\n", e.msg);
    be->vt->free(be, buf);
    hp_th_fini(&h);
    return rc;
}

Test(cuda_nccl, a_dead_peer_fails_the_collective_instead_of_hanging) {
    need_devices(2);
    int status[2];
    on_ranks(2, dead_peer_rank, status);
    cr_expect(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0,
              "rank 0 failed (status 0x%x; its reasons are above)", status[0]);
    cr_expect(WIFSIGNALED(status[1]), "rank 1 was not killed (status 0x%x)", status[1]);
}
#endif
