/* tests/worker/test_cuda_nccl.c — the cuda backend's NCCL collectives on a 1-rank world (NCCL
 * runs a 1-rank communicator: the bootstrap over the shm communicator, the unique id, the comm
 * stream, every collective the executor issues, busy time), compared with what the identity
 * gives. More ranks need more GPUs: `bench/gpu/check.sh` runs what the machine has. Skips
 * cleanly without a device (cuda_check.h). */
#include "cpu_check.h"
#include "cuda_check.h"

#include "hp/comm.h"
#ifdef HP_CUDA_BACKEND
#include "worker/cuda/cuda_internal.h"
#endif

#include <unistd.h>

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
    const hp_dtype dts[] = {HP_F32, HP_BF16};
    for (size_t o = 0; o < HP_ARRAY_LEN(ops); o++)
        for (size_t d = 0; d < HP_ARRAY_LEN(dts); d++) {
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
    hp_backend_free(be);
    hp_comm_free(world);
#endif
}
