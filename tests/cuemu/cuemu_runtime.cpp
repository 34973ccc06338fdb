/* tests/cuemu/cuemu_runtime.cpp — cuemu's CUDA runtime API (include/cuda_runtime_api.h): devices
 * ($HP_CUEMU_DEVICES of them, default 1; 0 behaves as a machine without a GPU), memory
 * (cudaMalloc is host memory of exactly the size asked, 256-byte aligned, so AddressSanitizer
 * sees a kernel's out-of-bounds access; copies check that their device side is device memory
 * and their host side is not), streams and events (work runs at enqueue, except on a stream
 * that carries collectives, which lags: see CUstream_st; events hold host times) and errors. */
#include "cuemu_internal.h"

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A stream runs its work at enqueue until it carries a collective; from then on it lags: its
 * work queues (items, in order) and runs as late as the program lets it: when the host waits
 * for it, or another stream waits for one of its events. A missing event wait between it and
 * another stream then reads data the collective has not written yet, or lets the collective
 * read data already overwritten, and the results show it.
 *
 * hung_by: the communicator whose collective this stream (or the work an event marks) waits
 * behind and that can never finish (a peer is gone), until ncclCommAbort releases it. */
struct emu_item {
    std::function<void()> fn;
    cudaStream_t wait_on; /* a wait: wait_on must first have run wait_seq items */
    uint64_t wait_seq;
};
struct CUstream_st {
    unsigned flags;
    const void *hung_by;
    bool lagging;
    std::deque<emu_item> q;
    uint64_t enq, done; /* items queued and run since the stream began to lag */
};
struct CUevent_st {
    unsigned flags;
    bool recorded;
    std::chrono::steady_clock::time_point t;
    const void *hung_by;
    cudaStream_t rs; /* its latest record, if queued on a lagging stream: rs's item rseq */
    uint64_t rseq;
};

namespace hp_emu {
namespace {

std::mutex mu;
std::map<uintptr_t, size_t> device_mem; /* start -> bytes */
std::set<void *> host_mem;              /* cudaMallocHost */
std::set<cudaStream_t> streams;
std::set<cudaEvent_t> events;
cudaError_t sticky = cudaSuccess;
thread_local cudaError_t last = cudaSuccess;
int current_device = 0;
const void *legacy_hung_by; /* the null stream's */
std::recursive_mutex qmu;   /* the lagging streams' queues; held while their work runs */
/* Destroyed streams (waits may still name them) and events destroyed with a record still
 * queued: kept until exit. */
struct graveyard {
    std::vector<cudaStream_t> streams;
    std::vector<cudaEvent_t> events;
    ~graveyard() {
        for (cudaStream_t s : streams) delete s;
        for (cudaEvent_t e : events) delete e;
    }
} dead;

int physical_count() {
    const char *e = getenv("HP_CUEMU_DEVICES");
    if (!e || !*e) return 1;
    char *end;
    long n = strtol(e, &end, 10);
    return *end || n < 0 || n > 16 ? 1 : (int)n;
}

/* The devices this process sees, as the driver reads CUDA_VISIBLE_DEVICES: a comma-separated
 * list of ordinals of the machine's devices, ended by the first entry that is not one (or
 * repeats one); unset, all of them. ids[i] is the machine's ordinal of visible device i. */
int visible(int ids[16]) {
    int phys = physical_count();
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int i = 0; i < phys; i++) ids[i] = i;
        return phys;
    }
    int n = 0;
    while (n < 16) {
        while (*v == ' ') v++;
        char *end;
        long d = strtol(v, &end, 10);
        if (end == v || d < 0 || d >= phys) break;
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= ids[i] == d;
        if (seen) break;
        ids[n++] = (int)d;
        while (*end == ' ') end++;
        if (*end != ',') break;
        v = end + 1;
    }
    return n;
}

int device_count() {
    int ids[16];
    return visible(ids);
}

cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) last = e;
    return e;
}

cudaError_t sync_state() {
    std::lock_guard<std::mutex> g(mu);
    return sticky;
}

const void *&hung_of(cudaStream_t s) {
    return s ? s->hung_by : legacy_hung_by;
}

bool any_hung() {
    std::lock_guard<std::mutex> g(mu);
    if (legacy_hung_by) return true;
    for (cudaStream_t s : streams)
        if (s->hung_by) return true;
    return false;
}

bool hung_locked(cudaStream_t s) {
    std::lock_guard<std::mutex> g(mu);
    return hung_of(s) != nullptr;
}

/* Runs s's queued items until it has run `upto` of them, stopping at a stuck one (or a wait on
 * a stuck stream, which makes s stuck too). True when s got there. */
bool run_to(cudaStream_t s, uint64_t upto) {
    if (!s) return true;
    std::lock_guard<std::recursive_mutex> g(qmu);
    while (s->done < upto && !s->q.empty() && !hung_locked(s)) {
        emu_item &it = s->q.front();
        if (it.wait_on && !run_to(it.wait_on, it.wait_seq)) {
            std::lock_guard<std::mutex> g2(mu);
            if (!s->hung_by) s->hung_by = it.wait_on->hung_by;
            break;
        }
        std::function<void()> fn = std::move(it.fn);
        s->q.pop_front();
        s->done++;
        if (fn) fn();
    }
    return s->done >= upto;
}

bool run_all(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    return run_to(s, s ? s->enq : 0);
}

/* Whether e's latest record has run (running its stream up to it). */
bool event_reached(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    return !e->rs || run_to(e->rs, e->rseq);
}

std::vector<cudaStream_t> all_streams() {
    std::lock_guard<std::mutex> g(mu);
    return std::vector<cudaStream_t>(streams.begin(), streams.end());
}

/* A synchronizing call on work that can never finish: a device waits forever; cuemu says so
 * and fails the call, so a test finds the wait instead of hanging. */
cudaError_t would_hang(const char *call) {
    fprintf(stderr,
            "cuemu: %s waits on work queued behind a collective that cannot finish (a peer is "
            "gone): a device would wait here forever\n",
            call);
    return ret(cudaErrorLaunchTimeout);
}

} // namespace

int machine_device(int ordinal) {
    int ids[16];
    int n = visible(ids);
    return ordinal >= 0 && ordinal < n ? ids[ordinal] : -1;
}

int current() {
    return current_device;
}

void submit(cudaStream_t s, std::function<void()> fn) {
    if (s) {
        std::lock_guard<std::recursive_mutex> g(qmu);
        if (s->lagging) {
            s->q.push_back({std::move(fn), nullptr, 0});
            s->enq++;
            return;
        }
    }
    fn();
}

void make_lagging(cudaStream_t s) {
    if (!s) return;
    std::lock_guard<std::recursive_mutex> g(qmu);
    s->lagging = true;
}

bool drain(cudaStream_t s) {
    return run_all(s) && !hung_locked(s);
}

void drain_all() {
    for (cudaStream_t s : all_streams()) run_all(s);
}

void stream_hang(cudaStream_t s, const void *by) {
    std::lock_guard<std::mutex> g(mu);
    if (!s || streams.count(s)) hung_of(s) = by;
}

void release_hangs(const void *by) {
    std::lock_guard<std::recursive_mutex> gq(qmu);
    std::lock_guard<std::mutex> g(mu);
    if (legacy_hung_by == by) legacy_hung_by = nullptr;
    for (cudaStream_t s : streams)
        if (s->hung_by == by) { /* the work stuck behind it is dropped with the communicator */
            s->hung_by = nullptr;
            s->q.clear();
            s->done = s->enq;
        }
    for (cudaEvent_t e : events)
        if (e->hung_by == by) e->hung_by = nullptr;
}

void set_launch_error(cudaError_t e, const char *kernel, const char *why) {
    fprintf(stderr, "cuemu: launch of %s refused: %s\n", kernel, why);
    last = e;
}

void set_sticky_error(cudaError_t e, const char *kernel, const char *why) {
    fprintf(stderr, "cuemu: kernel %s failed: %s\n", kernel, why);
    std::lock_guard<std::mutex> g(mu);
    if (sticky == cudaSuccess) sticky = e;
    last = e;
}

cudaError_t sticky_error() {
    return sync_state();
}

bool stream_ok(cudaStream_t s) {
    std::lock_guard<std::mutex> g(mu);
    return !s || streams.count(s);
}

bool on_device(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    uintptr_t a = (uintptr_t)p;
    auto it = device_mem.upper_bound(a);
    if (it == device_mem.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
}

} // namespace hp_emu

using namespace hp_emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x)                                                                                       \
    case x:                                                                                        \
        return #x;
        N(cudaSuccess)
        N(cudaErrorInvalidValue)
        N(cudaErrorMemoryAllocation)
        N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration)
        N(cudaErrorInvalidDevicePointer)
        N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorNoDevice)
        N(cudaErrorInvalidDevice)
        N(cudaErrorInvalidResourceHandle)
        N(cudaErrorNotReady)
        N(cudaErrorIllegalAddress)
        N(cudaErrorLaunchOutOfResources)
        N(cudaErrorLaunchTimeout)
        N(cudaErrorLaunchFailure)
        N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorLaunchTimeout:
        return "the launch timed out and was terminated";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    default:
        return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t s = sync_state();
    cudaError_t e = last;
    last = cudaSuccess;
    return s != cudaSuccess ? s : e;
}

cudaError_t cudaPeekAtLastError(void) {
    cudaError_t s = sync_state();
    return s != cudaSuccess ? s : last;
}

cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return ret(cudaErrorInvalidValue);
    *n = device_count();
    return *n ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return ret(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (!p) return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "hp cuemu (CUDA emulated on the CPU)");
    p->totalGlobalMem = (size_t)8 << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 1;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    drain_all();
    if (any_hung()) return would_hang("cudaDeviceSynchronize");
    return ret(sync_state());
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (!p) return ret(cudaErrorInvalidValue);
    *p = nullptr;
    if (device_count() == 0) return ret(cudaErrorNoDevice);
    if (bytes == 0) return cudaSuccess;
    const char *cap = getenv("HP_CUEMU_MEMORY_BYTES"); /* to test out-of-memory paths */
    if (cap && *cap && bytes > strtoull(cap, nullptr, 10)) return ret(cudaErrorMemoryAllocation);
    void *q = nullptr;
    if (posix_memalign(&q, 256, bytes) != 0) return ret(cudaErrorMemoryAllocation);
    memset(q, 0xff, bytes); /* fresh device memory holds no values to rely on: NaN in f32, bf16 */
    std::lock_guard<std::mutex> g(mu);
    device_mem[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    drain_all(); /* it synchronizes the device: no queued work still uses p */
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = device_mem.find((uintptr_t)p);
        if (it == device_mem.end()) {
            last = cudaErrorInvalidDevicePointer;
            return cudaErrorInvalidDevicePointer;
        }
        device_mem.erase(it);
    }
    free(p);
    if (any_hung()) return would_hang("cudaFree (it synchronizes the device)");
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    if (!p) return ret(cudaErrorInvalidValue);
    *p = nullptr;
    void *q = nullptr;
    if (posix_memalign(&q, 256, bytes ? bytes : 1) != 0) return ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(mu);
    host_mem.insert(q);
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(mu);
        if (!host_mem.erase(p)) {
            last = cudaErrorInvalidValue;
            return cudaErrorInvalidValue;
        }
    }
    free(p);
    return cudaSuccess;
}

/* The device side of a copy must be device memory, its host side must not be. */
static cudaError_t check_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    bool dd = on_device(dst, bytes), sd = on_device(src, bytes);
    switch (k) {
    case cudaMemcpyHostToHost:
        return dd || sd ? cudaErrorInvalidMemcpyDirection : cudaSuccess;
    case cudaMemcpyHostToDevice:
        return dd && !sd ? cudaSuccess : cudaErrorInvalidMemcpyDirection;
    case cudaMemcpyDeviceToHost:
        return sd && !dd ? cudaSuccess : cudaErrorInvalidMemcpyDirection;
    case cudaMemcpyDeviceToDevice:
        return dd && sd ? cudaSuccess : cudaErrorInvalidMemcpyDirection;
    case cudaMemcpyDefault:
        return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    cudaError_t e = sync_state();
    if (e != cudaSuccess) return ret(e);
    if ((e = check_copy(dst, src, bytes, kind)) != cudaSuccess) return ret(e);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

/* A device-to-device copy runs in stream order; one with host memory on either side is done
 * when the call returns, after the stream's earlier work (as with pageable host memory). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = sync_state();
    if (e != cudaSuccess) return ret(e);
    if ((e = check_copy(dst, src, bytes, kind)) != cudaSuccess) return ret(e);
    if (bytes == 0) return cudaSuccess;
    if (on_device(dst, bytes) && on_device(src, bytes)) {
        submit(s, [=]() { memmove(dst, src, bytes); });
        return cudaSuccess;
    }
    if (!drain(s)) return would_hang("cudaMemcpyAsync with host memory");
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
    if (width == 0 || height == 0) return cudaSuccess;
    cudaError_t e = sync_state();
    if (e != cudaSuccess) return ret(e);
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    bool dd = on_device(dst, dspan), sd = on_device(src, sspan);
    bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
              (kind == cudaMemcpyHostToDevice && dd && !sd) ||
              (kind == cudaMemcpyDeviceToHost && sd && !dd) ||
              (kind == cudaMemcpyHostToHost && !dd && !sd);
    if (!ok) return ret(cudaErrorInvalidMemcpyDirection);
    auto copy = [=]() {
        for (size_t r = 0; r < height; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    };
    if (dd && sd) {
        submit(s, copy);
        return cudaSuccess;
    }
    if (!drain(s)) return would_hang("cudaMemcpy2DAsync with host memory");
    copy();
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    cudaError_t e = sync_state();
    if (e != cudaSuccess) return ret(e);
    if (bytes == 0) return cudaSuccess;
    if (!on_device(p, bytes)) return ret(cudaErrorInvalidValue);
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = sync_state();
    if (e != cudaSuccess) return ret(e);
    if (bytes == 0) return cudaSuccess;
    if (!on_device(p, bytes)) return ret(cudaErrorInvalidValue);
    submit(s, [=]() { memset(p, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (!s) return ret(cudaErrorInvalidValue);
    if (device_count() == 0) return ret(cudaErrorNoDevice);
    *s = new CUstream_st{flags, nullptr, false, {}, 0, 0};
    std::lock_guard<std::mutex> g(mu);
    streams.insert(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    {
        std::lock_guard<std::mutex> g(mu);
        if (!s || !streams.count(s)) {
            last = cudaErrorInvalidResourceHandle;
            return cudaErrorInvalidResourceHandle;
        }
    }
    run_all(s); /* its work completes, as on a device */
    std::lock_guard<std::mutex> g(mu);
    streams.erase(s);
    dead.streams.push_back(s);
    return cudaSuccess;
}

static bool event_hung(cudaEvent_t e) {
    std::lock_guard<std::mutex> g(mu);
    return e->hung_by != nullptr;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (!drain(s)) return would_hang("cudaStreamSynchronize");
    return ret(sync_state());
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (!drain(s)) return cudaErrorNotReady; /* not an error: last is left as it is */
    return ret(sync_state());
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (!stream_ok(s) || !e) return ret(cudaErrorInvalidResourceHandle);
    /* the event's work ran when it was enqueued, unless it waits behind a stuck collective:
     * then so does everything s runs after this */
    std::lock_guard<std::recursive_mutex> gq(qmu);
    if (e->rs && e->rs != s && e->rs->done < e->rseq) {
        if (s && s->lagging) { /* s waits there when it gets to it */
            s->q.push_back({nullptr, e->rs, e->rseq});
            s->enq++;
        } else if (!run_to(e->rs, e->rseq)) {
            std::lock_guard<std::mutex> g(mu);
            if (!hung_of(s)) hung_of(s) = e->rs->hung_by;
        }
    }
    std::lock_guard<std::mutex> g(mu);
    if (e->hung_by && !hung_of(s)) hung_of(s) = e->hung_by;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e) return ret(cudaErrorInvalidValue);
    *e = new CUevent_st{flags, false, {}, nullptr, nullptr, 0};
    std::lock_guard<std::mutex> g(mu);
    events.insert(*e);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    bool queued = !event_reached(e); /* a record stuck in a queue: keep e for it */
    std::lock_guard<std::mutex> g(mu);
    events.erase(e);
    if (queued)
        dead.events.push_back(e);
    else
        delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e || !stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    e->recorded = true;
    std::lock_guard<std::recursive_mutex> gq(qmu);
    if (s && s->lagging) { /* the time is taken when the stream gets there */
        s->q.push_back({[e]() { e->t = std::chrono::steady_clock::now(); }, nullptr, 0});
        e->rs = s;
        e->rseq = ++s->enq;
        e->hung_by = nullptr;
        return cudaSuccess;
    }
    e->rs = nullptr;
    e->t = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(mu);
    e->hung_by = hung_of(s);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (!event_reached(e) || event_hung(e)) return would_hang("cudaEventSynchronize");
    return ret(sync_state());
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (!event_reached(e) || event_hung(e)) return cudaErrorNotReady;
    return ret(sync_state());
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms) return ret(cudaErrorInvalidValue);
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return ret(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
    if (!event_reached(a) || !event_reached(b) || event_hung(a) || event_hung(b))
        return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

} /* extern "C" */
