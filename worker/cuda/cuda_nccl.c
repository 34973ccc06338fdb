/* worker/cuda/cuda_nccl.c — the cuda backend's collectives on NCCL, stream-ordered on the comm
 * stream (HP_STREAM_COMM; the executor's events order it against compute).
 *
 * Bootstrap: the host communicators the trainer already made (the world's and one per mesh
 * dim: shm on one host, tcp across hosts, worker/comm/tcp.c) carry the NCCL unique id (world
 * rank 0 makes it and broadcasts it) and the split colors: each mesh group's NCCL
 * communicator comes from ncclCommSplit of the world one, color = the world rank of the
 * group's rank 0, key = the rank in the group. A multi-host cuda job gets the tcp host
 * communicator (hpd's comm auto under Slurm on several nodes, or comm tcp; hp-worker
 * --comm-backend tcp standalone), so the id crosses hosts over it; the coordinator relays
 * only rank 0's tcp address.
 *
 * A dead or hung peer: collectives only enqueue, so nothing blocks until synchronize, which
 * polls the comm stream and ncclCommGetAsyncError of every communicator up to a deadline;
 * an async error or the deadline aborts every communicator (ncclCommAbort) and is HP_IO, as
 * is an enqueue NCCL refuses (a communicator already in error). After that every collective fails
 * with the same error (the trainer's restart path takes over). Busy time: a pair of timing events
 * around each collective, summed at synchronize.
 */
#define _GNU_SOURCE /* nanosleep */
#include "worker/cuda/cuda_internal.h"

#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SYNC_TIMEOUT_S 300.0 /* a step's collectives must all finish within this */

typedef struct nccl_group {
    char name[HP_MESH_NAME_MAX];
    ncclComm_t comm;
    int rank, world;
} nccl_group;

struct hp__cuda_nccl {
    nccl_group world;
    nccl_group groups[HP_MESH_MAX_DIMS];
    int n_groups;
    cudaEvent_t *ev; /* [2 * cap]: start, end of each pending collective */
    int n_pending, cap;
    double busy_s;
    bool failed;
    hp_err err; /* the failure, repeated to every later call */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static hp_status fail(hp__cuda_nccl *q, hp_err *err);

/* An enqueue NCCL refused (a communicator in error after a peer died, or a bad argument):
 * what is queued on the comm stream may never finish, and ncclCommDestroy would wait for it,
 * so the communicators are aborted and the failure is sticky, as at synchronize. */
#define NCCL_ENQUEUE(call, what)                                                                   \
    do {                                                                                           \
        ncclResult_t nc__r = (call);                                                               \
        if (nc__r != ncclSuccess) {                                                                \
            hp_errf(&q->err, HP_IO, "nccl: %s on '%s': %s; communicators aborted", (what),         \
                    g->name, ncclGetErrorString(nc__r));                                           \
            return fail(q, err);                                                                   \
        }                                                                                          \
    } while (0)

static void abort_all(hp__cuda_nccl *q) {
    for (int i = 0; i < q->n_groups; i++)
        if (q->groups[i].comm) ncclCommAbort(q->groups[i].comm), q->groups[i].comm = NULL;
    if (q->world.comm) ncclCommAbort(q->world.comm), q->world.comm = NULL;
}

void hp__cuda_nccl_free(hp__cuda *cu) {
    hp__cuda_nccl *q = cu->nccl;
    if (!q) return;
    for (int i = 0; i < q->n_groups; i++)
        if (q->groups[i].comm) ncclCommDestroy(q->groups[i].comm);
    if (q->world.comm) ncclCommDestroy(q->world.comm);
    for (int i = 0; i < 2 * q->cap; i++)
        if (q->ev[i]) cudaEventDestroy(q->ev[i]);
    hp_free(q->ev);
    hp_free(q);
    cu->nccl = NULL;
}

hp_status hp_cuda_backend_set_comm(hp_backend *b, hp_comm *comm, const hp_comm_group *groups,
                                   int n_groups, hp_err *err) {
    hp__cuda *cu = (hp__cuda *)b;
    if (cu->nccl) return hp_errf(err, HP_INVALID, "cuda: the backend already has a communicator");
    if (!comm) return hp_errf(err, HP_INVALID, "cuda: set_comm without a communicator");
    if (n_groups < 0 || n_groups > HP_MESH_MAX_DIMS || (n_groups > 0 && !groups))
        return hp_errf(err, HP_INVALID, "cuda: %d mesh groups", n_groups);
    hp__cuda_nccl *q = hp_calloc(1, sizeof *q);
    if (!q) return hp_errf(err, HP_NOMEM, "cuda: out of memory for the NCCL state");
    cu->nccl = q;
    hp_status st = HP_OK;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (comm->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        /* the others wait in the broadcast: give them an id that fails, not a hang */
        memset(&id, 0, sizeof id);
    }
    st = comm->vt->broadcast(comm, &id, sizeof id, 0, err);
    if (st == HP_OK && r != ncclSuccess)
        st = hp_errf(err, HP_IO, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
    if (st == HP_OK) {
        r = ncclCommInitRank(&q->world.comm, comm->world, id, comm->rank);
        if (r != ncclSuccess) {
            q->world.comm = NULL;
            int n = 0;
            cudaGetDeviceCount(&n);
            st = hp_errf(err, HP_IO,
                         "nccl: ncclCommInitRank (rank %d of %d): %s (each rank needs a GPU of "
                         "its own; this process sees %d)",
                         comm->rank, comm->world, ncclGetErrorString(r), n);
        }
    }
    q->world.rank = comm->rank;
    q->world.world = comm->world;
    snprintf(q->world.name, sizeof q->world.name, "world");
    for (int i = 0; i < n_groups && st == HP_OK; i++) {
        hp_comm *g = groups[i].comm;
        if (!g || !groups[i].name) {
            st = hp_errf(err, HP_INVALID, "cuda: mesh group %d: no name or communicator", i);
            break;
        }
        int32_t mine = comm->rank, *all = hp_calloc((size_t)g->world, sizeof *all);
        if (!all) {
            st = hp_errf(err, HP_NOMEM, "cuda: out of memory splitting '%s'", groups[i].name);
            break;
        }
        st = g->vt->all_gather(g, &mine, all, sizeof mine, err);
        int color = all[0];
        hp_free(all);
        if (st != HP_OK) break;
        nccl_group *ng = &q->groups[q->n_groups];
        r = ncclCommSplit(q->world.comm, color, g->rank, &ng->comm, NULL);
        if (r != ncclSuccess) {
            ng->comm = NULL;
            st = hp_errf(err, HP_IO, "nccl: ncclCommSplit for mesh dim '%s': %s", groups[i].name,
                         ncclGetErrorString(r));
            break;
        }
        snprintf(ng->name, sizeof ng->name, "%s", groups[i].name);
        ng->rank = g->rank;
        ng->world = g->world;
        q->n_groups++;
    }
    if (st != HP_OK) {
        abort_all(q);
        hp__cuda_nccl_free(cu);
    }
    return st;
}

/* The communicator a collective runs on: its group's, else the world's (as the cpu backend). */
static hp_status group_of(hp__cuda_nccl *q, const hp_node *n, nccl_group **out, hp_err *err) {
    const char *name = hp_op_get(n->op)->name;
    const hp_attr *g = hp_node_attr(n, HP_ATTR_GROUP);
    int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1);
    *out = &q->world;
    for (int i = 0; g && g->s && i < q->n_groups; i++)
        if (!strcmp(g->s, q->groups[i].name)) *out = &q->groups[i];
    if (*out == &q->world && g && g->s && q->n_groups > 0 && gs != q->world.world)
        return hp_errf(err, HP_UNSUPPORTED, "%s on group '%s': not a mesh dim of this rank", name,
                       g->s);
    if (gs != (*out)->world)
        return hp_errf(err, HP_UNSUPPORTED, "%s over %lld ranks, but the communicator has %d", name,
                       (long long)gs, (*out)->world);
    return HP_OK;
}

static bool nccl_type(hp_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case HP_F32:
        *out = ncclFloat32;
        return true;
    case HP_BF16:
        *out = ncclBfloat16;
        return true;
    case HP_F16:
        *out = ncclFloat16;
        return true;
    case HP_I32:
        *out = ncclInt32;
        return true;
    case HP_I64:
        *out = ncclInt64;
        return true;
    default:
        return false;
    }
}

static hp_status timing_pair(hp__cuda_nccl *q, cudaEvent_t *start, cudaEvent_t *end, hp_err *err) {
    if (q->n_pending == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        cudaEvent_t *ev = hp_realloc(q->ev, (size_t)(2 * cap) * sizeof *ev);
        if (!ev) return hp_errf(err, HP_NOMEM, "cuda: out of memory for comm timing events");
        memset(ev + 2 * q->cap, 0, (size_t)(2 * (cap - q->cap)) * sizeof *ev);
        q->ev = ev;
        q->cap = cap;
    }
    cudaEvent_t *pair = &q->ev[2 * q->n_pending];
    for (int k = 0; k < 2; k++)
        if (!pair[k]) HP__CUDA_TRY(cudaEventCreate(&pair[k]), "cudaEventCreate");
    *start = pair[0];
    *end = pair[1];
    q->n_pending++;
    return HP_OK;
}

hp_status hp__cuda_nccl_collective(hp__cuda *cu, const hp_kernel_call *c, hp_err *err) {
    hp__cuda_nccl *q = cu->nccl;
    if (q->failed) {
        if (err) *err = q->err;
        return q->err.status;
    }
    const hp_node *n = c->node;
    nccl_group *g;
    HP_TRY(group_of(q, n, &g, err));
    hp_dtype dt = c->in_type[0].dtype;
    /* gathers and all-to-alls move bytes (any dtype, bool masks included); reductions need
     * NCCL's type */
    ncclDataType_t nt = ncclUint8;
    bool reduces = n->op == HP_OP_REDUCE_SCATTER || n->op == HP_OP_ALL_REDUCE;
    if (reduces && !nccl_type(dt, &nt))
        return hp_errf(err, HP_UNSUPPORTED, "%s of dtype %s: NCCL has no type to reduce it in",
                       hp_op_get(n->op)->name, hp_dtype_name(dt));
    cudaStream_t s = cu->stream[HP_STREAM_COMM];
    size_t es = hp_dtype_size(dt);
    int64_t in_n = hp_type_numel(&c->in_type[0]), out_n = hp_type_numel(&c->out_type[0]);
    hp_reduce_op red = (hp_reduce_op)hp_node_int(n, HP_ATTR_REDUCE_OP, HP_REDUCE_SUM);
    ncclRedOp_t op = red == HP_REDUCE_AVG ? ncclAvg : red == HP_REDUCE_MAX ? ncclMax : ncclSum;
    cudaEvent_t e0 = NULL, e1 = NULL;
    HP_TRY(timing_pair(q, &e0, &e1, err));
    HP__CUDA_TRY(cudaEventRecord(e0, s), "cudaEventRecord");
    switch (n->op) {
    case HP_OP_ALL_GATHER:
        if (out_n != in_n * g->world)
            return hp_errf(err, HP_INVALID, "output has %lld elements, not %d x %lld",
                           (long long)out_n, g->world, (long long)in_n);
        NCCL_ENQUEUE(ncclAllGather(c->in[0], c->out[0], (size_t)in_n * es, ncclUint8, g->comm, s),
                     "ncclAllGather");
        break;
    case HP_OP_REDUCE_SCATTER:
        if (in_n != out_n * g->world)
            return hp_errf(err, HP_INVALID, "input has %lld elements, not %d x %lld",
                           (long long)in_n, g->world, (long long)out_n);
        NCCL_ENQUEUE(ncclReduceScatter(c->in[0], c->out[0], (size_t)out_n, nt, op, g->comm, s),
                     "ncclReduceScatter");
        break;
    case HP_OP_ALL_REDUCE:
        if (in_n != out_n) return hp_errf(err, HP_INVALID, "input and output sizes differ");
        NCCL_ENQUEUE(ncclAllReduce(c->in[0], c->out[0], (size_t)out_n, nt, op, g->comm, s),
                     "ncclAllReduce");
        break;
    case HP_OP_ALL_TO_ALL: {
        if (in_n != out_n || in_n % g->world)
            return hp_errf(err, HP_INVALID, "%lld elements do not split %d ways", (long long)in_n,
                           g->world);
        size_t chunk = (size_t)(in_n / g->world) * es;
        const char *src = c->in[0];
        if (c->in[0] == c->out[0]) { /* send and receive buffers must not overlap */
            void *tmp = hp__cuda_scratch(cu, HP_STREAM_COMM, (size_t)in_n * es, err);
            if (!tmp) return err ? err->status : HP_NOMEM;
            HP_TRY(hp__cuda_copy(s, tmp, c->in[0], (size_t)in_n * es, err));
            src = tmp;
        }
        NCCL_ENQUEUE(ncclGroupStart(), "ncclGroupStart");
        ncclResult_t pr = ncclSuccess; /* the group is ended whatever happens inside it */
        for (int r = 0; r < g->world && pr == ncclSuccess; r++) {
            pr = ncclSend(src + (size_t)r * chunk, chunk, ncclUint8, r, g->comm, s);
            if (pr == ncclSuccess)
                pr = ncclRecv((char *)c->out[0] + (size_t)r * chunk, chunk, ncclUint8, r, g->comm,
                              s);
        }
        ncclResult_t er = ncclGroupEnd();
        NCCL_ENQUEUE(pr != ncclSuccess ? pr : er, "ncclSend/ncclRecv (all-to-all)");
        break;
    }
    case HP_OP_LOCAL_CHUNK: { /* the rank's own chunk along dim: a strided copy, no exchange */
        const hp_type *t = &c->in_type[0];
        int d = (int)hp_node_int(n, HP_ATTR_DIM, 0);
        if (d < 0) d += t->rank;
        if (d < 0 || d >= t->rank || t->shape[d] % g->world)
            return hp_errf(err, HP_INVALID, "dim %d of a rank-%d input does not split %d ways", d,
                           t->rank, g->world);
        int64_t outer = 1;
        for (int k = 0; k < d; k++) outer *= t->shape[k];
        size_t row = outer > 0 ? (size_t)in_n * es / (size_t)outer : 0;
        size_t chunk = row / (size_t)g->world;
        if (outer > 0 && chunk > 0)
            HP__CUDA_TRY(cudaMemcpy2DAsync(c->out[0], chunk,
                                           (const char *)c->in[0] + (size_t)g->rank * chunk, row,
                                           chunk, (size_t)outer, cudaMemcpyDeviceToDevice, s),
                         "cudaMemcpy2DAsync");
        break;
    }
    default:
        return hp_errf(err, HP_UNSUPPORTED, "not a collective NCCL runs");
    }
    HP__CUDA_TRY(cudaEventRecord(e1, s), "cudaEventRecord");
    return HP_OK;
}

/* Aborts every communicator and makes q->err (already written) the sticky failure. */
static hp_status fail(hp__cuda_nccl *q, hp_err *err) {
    abort_all(q);
    q->failed = true;
    if (err) *err = q->err;
    return q->err.status;
}

hp_status hp__cuda_nccl_sync(hp__cuda *cu, hp_err *err) {
    hp__cuda_nccl *q = cu->nccl;
    if (q->failed) {
        if (err) *err = q->err;
        return q->err.status;
    }
    cudaStream_t s = cu->stream[HP_STREAM_COMM];
    double deadline = now_s() + SYNC_TIMEOUT_S;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return hp__cuda_fail(err, (int)e, "cuda: comm stream");
        for (int i = -1; i < q->n_groups; i++) {
            nccl_group *g = i < 0 ? &q->world : &q->groups[i];
            ncclResult_t ar = ncclSuccess;
            if (!g->comm || ncclCommGetAsyncError(g->comm, &ar) != ncclSuccess) continue;
            if (ar != ncclSuccess && ar != ncclInProgress) {
                hp_errf(&q->err, HP_IO,
                        "nccl: communicator '%s' failed (a peer died or broke off): %s; "
                        "communicators aborted",
                        g->name, ncclGetErrorString(ar));
                return fail(q, err);
            }
        }
        if (now_s() > deadline) {
            hp_errf(&q->err, HP_IO,
                    "nccl: the collectives did not finish within %.0f s (a peer is dead or "
                    "hung); communicators aborted",
                    SYNC_TIMEOUT_S);
            return fail(q, err);
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < q->n_pending; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, q->ev[2 * i], q->ev[2 * i + 1]) == cudaSuccess)
            q->busy_s += ms * 1e-3;
    }
    q->n_pending = 0;
    return HP_OK;
}

double hp__cuda_nccl_busy(hp__cuda *cu) {
    return cu->nccl->busy_s;
}
