/* tests/cuemu/cuemu_nccl.cpp — cuemu's NCCL (include/nccl.h): one-rank communicators. Every
 * collective moves its one rank's data (all-reduce, all-gather and reduce-scatter of one rank
 * are copies); a send to and a receive from rank 0 inside ncclGroupStart/End pair up in order
 * and copy at ncclGroupEnd. A communicator of more ranks, a peer other than 0, or a send
 * outside a group (it would wait forever) is ncclInvalidUsage, with the reason on stderr. */
#include "cuemu_internal.h"
#include "include/nccl.h"

#include <random>
#include <stdio.h>
#include <string.h>
#include <vector>

struct ncclComm {
    int magic;
    bool aborted;
};

namespace {

struct p2p {
    const void *send;
    void *recv;
    size_t bytes;
};
thread_local int group_depth;
thread_local std::vector<p2p> sends, recvs;

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

ncclResult_t usage(const char *why) {
    fprintf(stderr, "cuemu nccl: %s\n", why);
    return ncclInvalidUsage;
}

ncclResult_t check(ncclComm_t c, ncclDataType_t t, cudaStream_t s) {
    if (!c || c->magic != 0x6e63) return ncclInvalidArgument;
    if (c->aborted) return usage("collective on an aborted communicator");
    if (!type_size(t) || !hp_emu::stream_ok(s)) return ncclInvalidArgument;
    if (hp_emu::sticky_error() != cudaSuccess) return ncclUnhandledCudaError;
    return ncclSuccess;
}

ncclResult_t copy(void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return ncclSuccess;
    if (!hp_emu::on_device(dst, bytes) || !hp_emu::on_device(src, bytes))
        return usage("a collective's buffer is not device memory");
    memmove(dst, src, bytes);
    return ncclSuccess;
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
        return "invalid usage (cuemu emulates one-rank communicators only)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    std::random_device rd;
    for (size_t i = 0; i < sizeof id->internal; i++) id->internal[i] = (char)rd();
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!comm) return ncclInvalidArgument;
    *comm = nullptr;
    if (nranks != 1) return usage("a communicator of more than one rank");
    if (rank != 0) return ncclInvalidArgument;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ncclUnhandledCudaError;
    }
    *comm = new ncclComm{0x6e63, false};
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *out,
                           ncclConfig_t *config) {
    (void)key, (void)config;
    if (!comm || !out) return ncclInvalidArgument;
    *out = nullptr;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    if (color < 0) return ncclInvalidArgument;
    *out = new ncclComm{0x6e63, false};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
    if (!comm || !async) return ncclInvalidArgument;
    *async = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = check(comm, type, s);
    if (r != ncclSuccess) return r;
    if ((unsigned)op > ncclAvg) return ncclInvalidArgument;
    return copy(recv, send, count * type_size(type));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = check(comm, type, s);
    return r != ncclSuccess ? r : copy(recv, send, count * type_size(type));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = check(comm, type, s);
    if (r != ncclSuccess) return r;
    if ((unsigned)op > ncclAvg) return ncclInvalidArgument;
    return copy(recv, send, count * type_size(type));
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = check(comm, type, s);
    if (r != ncclSuccess) return r;
    if (peer != 0) return usage("a send to a rank other than 0");
    if (!group_depth) return usage("a send to oneself outside a group waits forever");
    sends.push_back({send, nullptr, count * type_size(type)});
    return ncclSuccess;
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    ncclResult_t r = check(comm, type, s);
    if (r != ncclSuccess) return r;
    if (peer != 0) return usage("a receive from a rank other than 0");
    if (!group_depth) return usage("a receive from oneself outside a group waits forever");
    recvs.push_back({nullptr, recv, count * type_size(type)});
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return usage("ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    if (sends.size() != recvs.size()) r = usage("a group's sends and receives do not pair up");
    for (size_t i = 0; r == ncclSuccess && i < sends.size(); i++) {
        if (sends[i].bytes != recvs[i].bytes) {
            r = usage("a send and its receive differ in size");
            break;
        }
        r = copy(recvs[i].recv, sends[i].send, sends[i].bytes);
    }
    sends.clear();
    recvs.clear();
    return r;
}

} /* extern "C" */
