/* tests/cuemu/cuemu_launch.cpp — cuemu's kernel launches (cuemu_device.h): a block's threads as
 * fibers (ucontext) on the calling host thread, scheduled until each finishes or waits at a
 * barrier; __syncthreads releases when every live thread of the block waits, a warp exchange
 * when every live lane of the warp does. Launch configurations are checked against the limits
 * of a compute-capability 9.0 device (1024 threads, 48 KiB of dynamic shared memory, up to
 * 227 KiB for a kernel whose limit cudaFuncSetAttribute raised). */
#include "cuemu_internal.h"

#include <chrono>
#include <map>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define HP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HP_EMU_ASAN 1
#endif
#endif
#ifdef HP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace hp_emu {

thread_local block_ctx *cur_block;
thread_local thread_ctx *cur_thread;

namespace {

enum { READY, AT_BLOCK, AT_WARP, DONE };
constexpr size_t STACK = 256 << 10;
constexpr int MAX_THREADS = 1024;
constexpr size_t MAX_DYN_SMEM = 48 << 10;
constexpr size_t MAX_DYN_SMEM_OPTIN = 227 << 10; /* cudaDeviceProp.sharedMemPerBlockOptin */

/* cudaFuncAttributeMaxDynamicSharedMemorySize per kernel (the function's address) */
std::mutex attr_mu;
std::map<const void *, size_t> smem_limit;

/* ---- context switches ------------------------------------------------------------------------
 * x86-64: a switch saves the callee-saved registers, MXCSR and the x87 control word on the
 * old stack and loads them from the new one (no system call, unlike swapcontext, which also
 * saves the signal mask: a launch switches twice per thread at least). Elsewhere: ucontext. */
#if defined(__x86_64__)
#define HP_EMU_FAST_SWITCH 1
extern "C" void hp_emu_switch(void **save_sp, void *new_sp);
asm(".text\n"
    ".globl hp_emu_switch\n"
    ".type hp_emu_switch,@function\n"
    "hp_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size hp_emu_switch,.-hp_emu_switch\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");
#endif

struct fiber {
#ifdef HP_EMU_FAST_SWITCH
    void *sp = nullptr;
#endif
    ucontext_t ctx;
    char *stack = nullptr;
    int state = DONE;
    thread_ctx t;
    void *fake = nullptr; /* ASan's fake stack while switched away */
};

struct runner {
    ucontext_t sched;
#ifdef HP_EMU_FAST_SWITCH
    void *sched_sp = nullptr;
#endif
    std::vector<fiber> f;
    std::vector<uint64_t> slots[2]; /* per thread, by the exchange's parity */
    std::vector<unsigned> seq;      /* exchanges each thread has entered */
    std::vector<unsigned char> smem;
    block_ctx blk;
    const std::function<void()> *body = nullptr;
    int cur = 0, n = 0;
    bool failed = false;
    std::string why;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    unsigned long long launches = 0;
    runner()
        : f(MAX_THREADS), slots{std::vector<uint64_t>(MAX_THREADS),
                                std::vector<uint64_t>(MAX_THREADS)},
          seq(MAX_THREADS) {}
    ~runner() {
        for (fiber &x : f)
            if (x.stack) munmap(x.stack, STACK);
    }
};

thread_local runner *R;

runner &get() {
    if (!R) R = new runner(); /* one per host thread for the process's life */
    return *R;
}

void to_fiber(runner &r, fiber &x) {
#ifdef HP_EMU_ASAN
    void *save = nullptr;
    __sanitizer_start_switch_fiber(&save, x.stack, STACK);
#endif
#ifdef HP_EMU_FAST_SWITCH
    hp_emu_switch(&r.sched_sp, x.sp);
#else
    swapcontext(&r.sched, &x.ctx);
#endif
#ifdef HP_EMU_ASAN
    __sanitizer_finish_switch_fiber(save, nullptr, nullptr);
#endif
}

void to_sched(runner &r, fiber &x) {
#ifdef HP_EMU_ASAN
    __sanitizer_start_switch_fiber(&x.fake, r.sched_bottom, r.sched_size);
#endif
#ifdef HP_EMU_FAST_SWITCH
    hp_emu_switch(&x.sp, r.sched_sp);
#else
    swapcontext(&x.ctx, &r.sched);
#endif
#ifdef HP_EMU_ASAN
    __sanitizer_finish_switch_fiber(x.fake, &r.sched_bottom, &r.sched_size);
#endif
    cur_thread = &x.t;
}

void entry() {
    runner &r = *R;
    fiber &x = r.f[r.cur];
#ifdef HP_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r.sched_bottom, &r.sched_size);
#endif
    cur_thread = &x.t;
    (*r.body)();
    x.state = DONE;
#ifdef HP_EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, r.sched_bottom, r.sched_size);
#endif
#ifdef HP_EMU_FAST_SWITCH
    void *dead;
    hp_emu_switch(&dead, r.sched_sp); /* never resumed */
    __builtin_unreachable();
#endif
    /* returning resumes uc_link: the scheduler */
}

void wait_as(int state) {
    runner &r = *R;
    fiber &x = r.f[r.cur];
    x.state = state;
    to_sched(r, x);
}

void fail(runner &r, const std::string &why) {
    if (!r.failed) r.why = why;
    r.failed = true;
}

std::string where(const runner &r, const char *name) {
    char b[160];
    snprintf(b, sizeof b, "%s block (%u, %u, %u)", name, r.blk.idx.x, r.blk.idx.y, r.blk.idx.z);
    return b;
}

void run_block(runner &r, const char *name, bool reverse_first) {
    for (int i = 0; i < r.n; i++) {
        fiber &x = r.f[i];
        if (!x.stack) {
            void *p = mmap(nullptr, STACK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                fail(r, "no memory for a thread's stack");
                return;
            }
            x.stack = (char *)p;
        }
        unsigned dx = r.blk.dim.x, dy = r.blk.dim.y;
        x.t.linear = i;
        x.t.idx = uint3{(unsigned)i % dx, (unsigned)i / dx % dy, (unsigned)i / (dx * dy)};
        x.state = READY;
        r.seq[i] = 0;
#ifdef HP_EMU_FAST_SWITCH
        /* the frame hp_emu_switch pops: control words, six registers, entry's address, and a
         * never-used return slot that leaves entry's stack aligned as after a call */
        uint64_t *top = (uint64_t *)(x.stack + STACK);
#ifdef HP_EMU_ASAN
        /* the last fiber on this stack never unwound: its frames' redzones are still poisoned
         * where this initial frame goes (a new frame's prologue resets the rest) */
        __asan_unpoison_memory_region(x.stack + STACK - 4096, 4096);
#endif
        uint64_t *sp = top - 9;
        uint32_t mxcsr = 0;
        uint16_t fpucw = 0;
        asm volatile("stmxcsr %0" : "=m"(mxcsr));
        asm volatile("fnstcw %0" : "=m"(fpucw));
        uint32_t csr[2] = {mxcsr, fpucw};
        memcpy(&sp[0], csr, 8);
        for (int k = 1; k <= 6; k++) sp[k] = 0;
        sp[7] = (uint64_t)(uintptr_t)&entry;
        sp[8] = 0;
        x.sp = sp;
#else
        getcontext(&x.ctx);
        x.ctx.uc_stack.ss_sp = x.stack;
        x.ctx.uc_stack.ss_size = STACK;
        x.ctx.uc_link = &r.sched;
        makecontext(&x.ctx, entry, 0);
#endif
    }
    bool rev = reverse_first;
    for (;;) {
        for (int j = 0; j < r.n; j++) {
            int i = rev ? r.n - 1 - j : j;
            if (r.f[i].state != READY) continue;
            r.cur = i;
            to_fiber(r, r.f[i]);
            if (r.failed) return;
        }
        rev = !rev;
        int done = 0, at_block = 0;
        for (int i = 0; i < r.n; i++) {
            done += r.f[i].state == DONE;
            at_block += r.f[i].state == AT_BLOCK;
        }
        if (done == r.n) return;
        bool released = false;
        for (int w = 0; w * 32 < r.n; w++) {
            int lo = w * 32, hi = lo + 32 < r.n ? lo + 32 : r.n, waiting = 0, live = 0;
            for (int i = lo; i < hi; i++) {
                live += r.f[i].state != DONE;
                waiting += r.f[i].state == AT_WARP;
            }
            if (waiting > 0 && waiting == live) {
                for (int i = lo; i < hi; i++)
                    if (r.f[i].state == AT_WARP) r.f[i].state = READY;
                released = true;
            }
        }
        if (!released && at_block == r.n - done) {
            for (int i = 0; i < r.n; i++)
                if (r.f[i].state == AT_BLOCK) r.f[i].state = READY;
            released = true;
        }
        if (!released) {
            fail(r, where(r, name) +
                        ": deadlock: threads wait at __syncthreads while others of the block "
                        "wait at a warp shuffle");
            return;
        }
    }
}

} // namespace

static bool launch_ok(const char *name, const void *kernel, dim3 g, dim3 b, size_t smem,
                      cudaStream_t s);
static void launch_blocks(const char *name, dim3 g, dim3 b, size_t smem,
                          const std::function<void()> &body);

void syncthreads() {
    wait_as(AT_BLOCK);
}

void syncwarp() {
    wait_as(AT_WARP);
}

/* One barrier per exchange: deposits alternate between two slot sets, and no lane can deposit
 * twice before every lane has read (its next deposit waits for all of them at the next one). */
uint64_t warp_exchange(uint64_t v, int src) {
    runner &r = *R;
    int me = r.cur;
    unsigned n = ++r.seq[me];
    std::vector<uint64_t> &slots = r.slots[n & 1];
    slots[me] = v;
    wait_as(AT_WARP);
    int from = (me & ~31) + (src & 31);
    uint64_t got = 0;
    if (from >= r.n || r.seq[from] < n) { /* it never reached this exchange */
        char b[96];
        snprintf(b, sizeof b,
                 ": thread %d shuffles with lane %d, which has exited or does not exist", me, from);
        fail(r, std::string("a warp shuffle") + b);
    } else {
        got = slots[from];
    }
    return got;
}

void *dyn_smem() {
    return R->smem.data();
}

/* A number no other block run on this host thread had (k_mma.cuh's cp.async queues use it to
 * drop what a previous block left). */
static thread_local unsigned long long serial = 0;
unsigned long long block_serial() {
    return serial;
}

namespace {
/* $HP_CUEMU_PROFILE=1: each kernel's launches and host seconds, printed at exit. */
struct profile {
    std::mutex mu;
    std::map<std::string, std::pair<long, double>> by_kernel;
    bool on = getenv("HP_CUEMU_PROFILE") && !strcmp(getenv("HP_CUEMU_PROFILE"), "1");
    ~profile() {
        if (!on) return;
        for (auto &k : by_kernel)
            fprintf(stderr, "cuemu profile: %-32s %8ld launches %9.3f s\n", k.first.c_str(),
                    k.second.first, k.second.second);
    }
} prof;
} // namespace

/* The configuration is checked at the launch (cudaGetLastError reports it); the blocks run in
 * stream order (cuemu_runtime.cpp's submit). */
void launch(const char *name, const void *kernel, dim3 g, dim3 b, size_t smem, cudaStream_t s,
            const std::function<void()> &body) {
    if (!launch_ok(name, kernel, g, b, smem, s)) return;
    submit(s, [name, g, b, smem, body]() {
        auto t0 = std::chrono::steady_clock::now();
        launch_blocks(name, g, b, smem, body);
        if (prof.on) {
            double sec =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::lock_guard<std::mutex> lk(prof.mu);
            auto &e = prof.by_kernel[name];
            e.first++;
            e.second += sec;
        }
    });
}

static bool launch_ok(const char *name, const void *kernel, dim3 g, dim3 b, size_t smem,
                      cudaStream_t s) {
    if (!stream_ok(s)) {
        set_launch_error(cudaErrorInvalidResourceHandle, name, "unknown stream");
        return false;
    }
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0 || threads > MAX_THREADS || b.x > 1024 ||
        b.y > 1024 || b.z > 64 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        char why[160];
        snprintf(why, sizeof why, "grid (%u, %u, %u), block (%u, %u, %u)", g.x, g.y, g.z, b.x, b.y,
                 b.z);
        set_launch_error(cudaErrorInvalidConfiguration, name, why);
        return false;
    }
    size_t limit = MAX_DYN_SMEM;
    {
        std::lock_guard<std::mutex> lk(attr_mu);
        auto it = smem_limit.find(kernel);
        if (it != smem_limit.end() && it->second > limit) limit = it->second;
    }
    if (smem > limit) {
        char why[160];
        snprintf(why, sizeof why,
                 "%zu bytes of dynamic shared memory (at most %zu; cudaFuncSetAttribute "
                 "raises it to %zu)",
                 smem, limit, MAX_DYN_SMEM_OPTIN);
        set_launch_error(cudaErrorInvalidConfiguration, name, why);
        return false;
    }
    return true;
}

static void launch_blocks(const char *name, dim3 g, dim3 b, size_t smem,
                          const std::function<void()> &body) {
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (sticky_error() != cudaSuccess) return; /* a faulted context runs nothing */
    runner &r = get();
    r.n = (int)threads;
    r.body = &body;
    r.smem.assign(smem ? smem : 1, 0xff);
    r.blk.dim = b;
    r.blk.grid = g;
    block_ctx *saved_b = cur_block;
    thread_ctx *saved_t = cur_thread;
    cur_block = &r.blk;
    bool rev = (r.launches++ & 1) != 0;
    for (unsigned z = 0; z < g.z && !r.failed; z++)
        for (unsigned y = 0; y < g.y && !r.failed; y++)
            for (unsigned x = 0; x < g.x && !r.failed; x++) {
                r.blk.idx = uint3{x, y, z};
                if (smem) memset(r.smem.data(), 0xff, smem);
                serial++;
                run_block(r, name, rev);
            }
    cur_block = saved_b;
    cur_thread = saved_t;
    if (r.failed) {
        set_sticky_error(cudaErrorLaunchFailure, name, r.why.c_str());
        r.failed = false;
        r.why.clear();
    }
}

} // namespace hp_emu

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > hp_emu::MAX_DYN_SMEM_OPTIN)
        return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lk(hp_emu::attr_mu);
    hp_emu::smem_limit[func] = (size_t)value;
    return cudaSuccess;
}
