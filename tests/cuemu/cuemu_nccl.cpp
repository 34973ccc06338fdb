/* tests/cuemu/cuemu_nccl.cpp — cuemu's NCCL (include/nccl.h): communicators of any number of
 * ranks, each rank a process (or thread) of this host, on hp's own shared-memory communicator
 * (worker/comm/shm.c), which moves the data between them.
 *
 * A communicator is an hp shm communicator named after the unique id ("cuemu-nccl-<hex>");
 * ncclCommInitRank joins it (blocking until every rank has, as NCCL's init does) and refuses
 * two ranks on one device, as NCCL does ("Duplicate GPU detected"): devices are told apart by
 * their machine ordinal, so CUDA_VISIBLE_DEVICES counts. ncclCommSplit is the shm split, with
 * ncclCommSplit's color and key.
 *
 * A collective is checked when it is enqueued and runs in its stream's order; the stream lags
 * from its first collective on (cuemu_runtime.cpp), so a missing event wait shows. Running, a
 * collective blocks the thread that made its stream run until every rank's runs too. Reductions
 * fold in rank order; bf16 and f16 are widened to f32 and rounded once, 8- and 32-bit integers are
 * widened to 64 bits. A group's sends and receives are emulated when they form an all-to-all (one
 * send to and one receive from every rank, all of one size, which is what the cuda backend issues);
 * any other pattern, and a send or receive outside a group, is ncclInvalidUsage with the reason on
 * stderr.
 *
 * A peer that is gone (dead, or not arriving within $HP_CUEMU_NCCL_TIMEOUT_S, default 300 s)
 * behaves as on a device: the communicator's async error becomes ncclRemoteError, and the
 * stream is left stuck behind the collective (cuemu_internal.h: queries say not ready; a
 * synchronizing call fails with a message where a device would wait forever) until
 * ncclCommAbort, which drops the stuck work. A later collective on the communicator returns
 * its error. */
#include "cuemu_internal.h"
#include "include/cuda_bf16.h"
#include "include/cuda_fp16.h"
#include "include/nccl.h"

#include "hp/comm.h"

#include <random>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

struct ncclComm {
    int magic;
    hp_comm *hc;
    ncclResult_t async; /* ncclRemoteError once a collective could not finish */
    bool dead;          /* destroyed: its queued work is dropped (the struct is kept for it) */
};

namespace {

constexpr int kMagic = 0x6e63;

struct p2p {
    ncclComm_t comm;
    bool send;
    int peer;
    void *buf;
    size_t bytes;
    cudaStream_t stream;
};
thread_local int group_depth;
thread_local std::vector<p2p> pending;

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    }
    return 0;
}

double timeout_s() {
    const char *e = getenv("HP_CUEMU_NCCL_TIMEOUT_S");
    double t = e && *e ? strtod(e, nullptr) : 0;
    return t > 0 ? t : 300;
}

ncclResult_t usage(const char *why) {
    fprintf(stderr, "cuemu nccl: %s\n", why);
    return ncclInvalidUsage;
}

ncclResult_t check(ncclComm_t c, cudaStream_t s) {
    if (!c || c->magic != kMagic) return ncclInvalidArgument;
    if (!hp_emu::stream_ok(s)) return ncclInvalidArgument;
    if (hp_emu::sticky_error() != cudaSuccess) return ncclUnhandledCudaError;
    if (c->async != ncclSuccess) {
        fprintf(stderr, "cuemu nccl: a collective on a communicator in error (%s)\n",
                ncclGetErrorString(c->async));
        return c->async;
    }
    return ncclSuccess;
}

bool on_device(const void *p, size_t bytes) {
    return !bytes || hp_emu::on_device(p, bytes);
}

/* Destroyed communicators, kept until exit: queued work may still name them. */
struct graveyard {
    std::vector<ncclComm_t> comms;
    ~graveyard() {
        for (ncclComm_t c : comms) delete c;
    }
} dead_comms;

/* The end of a collective's exchange, run in stream order: a failure (a peer is gone) leaves
 * the communicator in error and the stream stuck behind it, as on a device. */
void finish(ncclComm_t c, cudaStream_t s, const char *what, hp_status st, const hp_err &e) {
    if (st == HP_OK) return;
    fprintf(stderr, "cuemu nccl: %s cannot finish: %s\n", what, e.msg);
    c->async = st == HP_IO ? ncclRemoteError : ncclInternalError;
    hp_emu::stream_hang(s, c);
}

/* Queues a collective's exchange on s, which lags from now on (cuemu_runtime.cpp). */
void enqueue(ncclComm_t c, cudaStream_t s, std::function<void()> exchange) {
    hp_emu::make_lagging(s);
    hp_emu::submit(s, [c, exchange]() {
        if (!c->dead && c->async == ncclSuccess) exchange();
    });
}

/* The hp comm type a reduction of t runs in, and whether t is widened into it. */
bool reduce_type(ncclDataType_t t, hp_comm_dtype *dt, bool *widen) {
    *widen = true;
    switch (t) {
    case ncclFloat32:
        *widen = false;
        *dt = HP_COMM_F32;
        return true;
    case ncclFloat64:
        *widen = false;
        *dt = HP_COMM_F64;
        return true;
    case ncclInt64:
        *widen = false;
        *dt = HP_COMM_I64;
        return true;
    case ncclFloat16:
    case ncclBfloat16:
        *dt = HP_COMM_F32;
        return true;
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
        *dt = HP_COMM_I64;
        return true;
    case ncclUint64:
        return false;
    }
    return false;
}

void widen(ncclDataType_t t, const void *src, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) switch (t) {
        case ncclFloat16:
            ((float *)dst)[i] = __half2float(((const __half *)src)[i]);
            break;
        case ncclBfloat16:
            ((float *)dst)[i] = __bfloat162float(((const __nv_bfloat16 *)src)[i]);
            break;
        case ncclInt8:
            ((int64_t *)dst)[i] = ((const int8_t *)src)[i];
            break;
        case ncclUint8:
            ((int64_t *)dst)[i] = ((const uint8_t *)src)[i];
            break;
        case ncclInt32:
            ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
            break;
        case ncclUint32:
            ((int64_t *)dst)[i] = ((const uint32_t *)src)[i];
            break;
        default:
            break;
        }
}

void narrow(ncclDataType_t t, const void *src, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) switch (t) {
        case ncclFloat16:
            ((__half *)dst)[i] = __float2half_rn(((const float *)src)[i]);
            break;
        case ncclBfloat16:
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(((const float *)src)[i]);
            break;
        case ncclInt8:
        case ncclUint8:
            ((uint8_t *)dst)[i] = (uint8_t)((const int64_t *)src)[i];
            break;
        case ncclInt32:
        case ncclUint32:
            ((uint32_t *)dst)[i] = (uint32_t)((const int64_t *)src)[i];
            break;
        default:
            break;
        }
}

/* A reduction's arguments, checked; *hop is hp's op. */
ncclResult_t reduction(ncclComm_t c, ncclDataType_t t, ncclRedOp_t op, cudaStream_t s,
                       hp_comm_dtype *dt, bool *wide, hp_reduce_op *hop) {
    ncclResult_t r = check(c, s);
    if (r != ncclSuccess) return r;
    if (!type_size(t) || (unsigned)op > ncclAvg) return ncclInvalidArgument;
    if (!reduce_type(t, dt, wide)) return usage("cuemu does not reduce ncclUint64");
    if (op == ncclProd || op == ncclMin) return usage("cuemu reduces with sum, avg and max only");
    *hop = op == ncclAvg ? HP_REDUCE_AVG : op == ncclMax ? HP_REDUCE_MAX : HP_REDUCE_SUM;
    return ncclSuccess;
}

/* Runs reduce_scatter (scatter) or all_reduce of count output elements, widening t where it
 * needs to; in_n is the input's element count. */
ncclResult_t reduce(const void *send, void *recv, size_t count, size_t in_n, ncclDataType_t t,
                    ncclRedOp_t op, ncclComm_t c, cudaStream_t s, bool scatter, const char *what) {
    hp_comm_dtype dt;
    bool wide;
    hp_reduce_op hop;
    ncclResult_t r = reduction(c, t, op, s, &dt, &wide, &hop);
    if (r != ncclSuccess) return r;
    size_t es = type_size(t);
    if (!on_device(send, in_n * es) || !on_device(recv, count * es))
        return usage("a collective's buffer is not device memory");
    enqueue(c, s, [=]() {
        const void *x = send; /* what the exchange reads and writes: widened copies if wide */
        void *y = recv;
        std::vector<char> in, out;
        if (wide) {
            size_t ws = dt == HP_COMM_F32 ? 4 : 8;
            in.resize(in_n * ws), out.resize(count * ws);
            widen(t, send, in.data(), in_n);
            x = in.data(), y = out.data();
        }
        hp_err e = {};
        hp_status st = scatter ? c->hc->vt->reduce_scatter(c->hc, x, y, (int64_t)count, dt, hop, &e)
                               : c->hc->vt->all_reduce(c->hc, x, y, (int64_t)count, dt, hop, &e);
        if (st == HP_OK && wide) narrow(t, y, recv, count);
        finish(c, s, what, st, e);
    });
    return ncclSuccess;
}

/* A group's sends and receives on communicator c, run as one all-to-all. */
ncclResult_t run_all_to_all(ncclComm_t c, const std::vector<p2p> &ops) {
    int n = c->hc->world;
    const char *shape = "cuemu emulates a group's sends and receives only as an all-to-all: one "
                        "send to and one receive from every rank of the communicator, all of "
                        "one size";
    if (ops.size() != 2 * (size_t)n) return usage(shape);
    std::vector<const p2p *> to(n), from(n);
    size_t bytes = ops[0].bytes;
    for (const p2p &o : ops) {
        std::vector<const p2p *> &side = o.send ? to : from;
        if (o.peer < 0 || o.peer >= n || side[o.peer] || o.bytes != bytes) return usage(shape);
        side[o.peer] = &o;
    }
    cudaStream_t s = ops[0].stream;
    for (const p2p &o : ops)
        if (o.stream != s) return usage("a group's sends and receives on different streams");
    std::vector<const void *> src(n);
    std::vector<void *> dst(n);
    for (int r = 0; r < n; r++) src[r] = to[r]->buf, dst[r] = from[r]->buf;
    enqueue(c, s, [=]() {
        std::vector<char> sbuf(bytes * n), rbuf(bytes * n);
        for (int r = 0; r < n; r++)
            if (bytes) memcpy(sbuf.data() + (size_t)r * bytes, src[r], bytes);
        hp_err e = {};
        hp_status st = c->hc->vt->all_to_all(c->hc, sbuf.data(), rbuf.data(), bytes, &e);
        if (st == HP_OK)
            for (int r = 0; r < n; r++)
                if (bytes) memcpy(dst[r], rbuf.data() + (size_t)r * bytes, bytes);
        finish(c, s, "a group's sends and receives", st, e);
    });
    return ncclSuccess;
}

ncclResult_t post(bool send, void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                  cudaStream_t s) {
    ncclResult_t r = check(c, s);
    if (r != ncclSuccess) return r;
    if (!type_size(t)) return ncclInvalidArgument;
    if (peer < 0 || peer >= c->hc->world) return ncclInvalidArgument;
    if (!group_depth)
        return usage("cuemu emulates sends and receives only inside ncclGroupStart/End");
    size_t bytes = count * type_size(t);
    if (!on_device(buf, bytes)) return usage("a send's or receive's buffer is not device memory");
    pending.push_back({c, send, peer, buf, bytes, s});
    return ncclSuccess;
}

ncclComm_t wrap(hp_comm *hc) {
    return new ncclComm{kMagic, hc, ncclSuccess, false};
}

/* Frees c's hp communicator; the struct stays (queued work may name it), marked dead. */
void bury(ncclComm_t c) {
    c->dead = true;
    hp_emu::release_hangs(c);
    hp_comm_free(c->hc);
    c->hc = nullptr;
    c->magic = 0;
    dead_comms.comms.push_back(c);
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    std::random_device rd;
    for (size_t i = 0; i < 16; i++) id->internal[i] = (char)(rd() | (i == 0 ? 1 : 0));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return ncclInvalidArgument;
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    bool zero = true;
    for (size_t i = 0; i < 16; i++) zero &= id.internal[i] == 0;
    if (zero) return usage("ncclCommInitRank with an id ncclGetUniqueId did not make");
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ncclUnhandledCudaError;
    }
    char name[64] = "cuemu-nccl-";
    for (size_t i = 0; i < 16; i++)
        snprintf(name + 11 + 2 * i, 3, "%02x", (unsigned)(unsigned char)id.internal[i]);
    hp_comm *hc = nullptr;
    hp_err e = {};
    if (hp_shm_comm_new(name, rank, nranks, timeout_s(), &hc, &e) != HP_OK) {
        fprintf(stderr, "cuemu nccl: ncclCommInitRank (rank %d of %d): %s\n", rank, nranks, e.msg);
        return ncclSystemError;
    }
    /* one rank per device, as NCCL requires */
    int32_t mine = hp_emu::machine_device(hp_emu::current());
    std::vector<int32_t> all(nranks);
    if (hc->vt->all_gather(hc, &mine, all.data(), sizeof mine, &e) != HP_OK) {
        fprintf(stderr, "cuemu nccl: ncclCommInitRank (rank %d of %d): %s\n", rank, nranks, e.msg);
        hp_comm_free(hc);
        return ncclSystemError;
    }
    for (int a = 0; a < nranks; a++)
        for (int b = a + 1; b < nranks; b++)
            if (all[a] == all[b]) {
                fprintf(stderr,
                        "cuemu nccl: Duplicate GPU detected: ranks %d and %d both use device %d "
                        "of this machine\n",
                        a, b, all[a]);
                hp_comm_free(hc);
                return ncclInvalidUsage;
            }
    *comm = wrap(hc);
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *out,
                           ncclConfig_t *config) {
    (void)config;
    if (!out) return ncclInvalidArgument;
    *out = nullptr;
    ncclResult_t r = check(comm, nullptr);
    if (r != ncclSuccess) return r;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return ncclInvalidArgument;
    hp_comm *hc = nullptr;
    hp_err e = {};
    if (comm->hc->vt->split(comm->hc, color < 0 ? -1 : color, key, &hc, &e) != HP_OK) {
        fprintf(stderr, "cuemu nccl: ncclCommSplit: %s\n", e.msg);
        return ncclSystemError;
    }
    if (hc) *out = wrap(hc);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm || comm->magic != kMagic) return ncclInvalidArgument;
    hp_emu::drain_all(); /* its queued collectives complete first */
    bury(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm || comm->magic != kMagic) return ncclInvalidArgument;
    bury(comm); /* its queued work, and what is stuck behind it, is dropped */
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
    if (!comm || comm->magic != kMagic || !async) return ncclInvalidArgument;
    *async = comm->async;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    return reduce(send, recv, count, count, type, op, comm, s, false, "ncclAllReduce");
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    size_t world = comm && comm->magic == kMagic ? (size_t)comm->hc->world : 1;
    return reduce(send, recv, count, count * world, type, op, comm, s, true, "ncclReduceScatter");
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = check(comm, s);
    if (r != ncclSuccess) return r;
    if (!type_size(type)) return ncclInvalidArgument;
    size_t bytes = count * type_size(type);
    if (!on_device(send, bytes) || !on_device(recv, bytes * (size_t)comm->hc->world))
        return usage("a collective's buffer is not device memory");
    enqueue(comm, s, [=]() {
        hp_err e = {};
        hp_status st = comm->hc->vt->all_gather(comm->hc, send, recv, bytes, &e);
        finish(comm, s, "ncclAllGather", st, e);
    });
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t s) {
    return post(true, (void *)send, count, type, peer, comm, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    return post(false, recv, count, type, peer, comm, s);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return usage("ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    std::vector<p2p> ops;
    ops.swap(pending);
    ncclResult_t r = ncclSuccess;
    /* each communicator's operations, in the order of their first one */
    while (!ops.empty() && r == ncclSuccess) {
        ncclComm_t c = ops[0].comm;
        std::vector<p2p> mine, rest;
        for (const p2p &o : ops) (o.comm == c ? mine : rest).push_back(o);
        r = run_all_to_all(c, mine);
        ops.swap(rest);
    }
    return r;
}

} /* extern "C" */
