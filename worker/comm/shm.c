/* worker/comm/shm.c — the shm communicator's segment: create / join / unlink, waiting with a
 * deadline, dead-peer detection and error propagation. The collectives are in shm_coll.c; the
 * layout and the synchronization scheme are described in shm_internal.h.
 *
 * Segment names. Rank 0 creates "/hp-<name>" with O_CREAT|O_EXCL. If the name exists it is
 * replaced when stale (its header is incomplete, or its creator process is gone: a dead run)
 * and refused with HP_IO when its creator still lives (two live runs chose the same name; the
 * launcher should put a nonce in the name). The other ranks retry opening the name until the
 * timeout, skipping a stale segment. Anyone unlinking a name first takes flock(LOCK_EX) on the
 * file it opened and checks that the name still refers to that file, so a stale segment's
 * cleanup can never remove a fresh segment made under the same name. Rank 0 unlinks its
 * segment as soon as every rank has joined: nothing is left in /dev/shm whatever happens next.
 * If rank 0 dies before that, a rank waiting to join removes the segment; with nobody waiting
 * it stays until a run reuses the name (and replaces it).
 *
 * Waiting. A rank spins briefly (only when there are at least as many CPUs as ranks), then
 * sleeps on the segment's futex word in slices of at most 10 ms; every 10 ms it checks that
 * the ranks it waits for still exist (kill(pid, 0), and /proc/<pid>/stat for zombies, which a
 * parent that has not reaped them yet would otherwise hide), and it checks the segment's
 * broken flag, so a dead or failed peer is reported at once, a hung one after the timeout.
 * Pids assume all ranks share one PID namespace (one host, no per-rank containers); a pid
 * reused within a run would hide a death until the timeout.
 *
 * Groups. split (shm_coll.c) joins each group through a segment of its own, named from the
 * parent's ("<name>.s<k>c<color>", at most HP__SHM_GROUP_NAME_MAX chars, hashed beyond), made
 * and unlinked exactly like a top-level one. Its members' pids are known from the parent, so
 * a member that dies before it has joined (or a rank 0 that dies before it has created the
 * segment) is reported at once rather than at the timeout.
 *
 * Not here: the collectives' data movement and the reduction kernels (shm_coll.c).
 */
#define _GNU_SOURCE
#include "worker/comm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free in shared memory");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free in shared memory");
_Static_assert(sizeof(hp__shm_hdr) <= HP__SHM_PAGE, "the header fits its page");

#define NS_PER_S     1000000000LL
#define SLICE_NS     (10 * 1000 * 1000LL) /* longest sleep between checks */
#define LIVENESS_NS  (10 * 1000 * 1000LL) /* how often waiters check peers' pids */
#define SPIN_NS      (50 * 1000LL)
#define SHM_DIR      "/dev/shm"
#define PATH_MAX_LEN (HP__SHM_GROUP_NAME_MAX + 8)

/* ---- small helpers --------------------------------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / NS_PER_S), (long)(ns % NS_PER_S)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleeps while *word == val, at most ns (shared, not _PRIVATE: peers are other processes). */
static void futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ns) {
    struct timespec ts = {(time_t)(ns / NS_PER_S), (long)(ns % NS_PER_S)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Wakes every sleeper after a change they may wait for. The seq_cst RMW on epoch and load of
 * waiters pair with the waiter's increment of waiters and load of epoch: either the waiter
 * sees the new epoch (and the change published before it), or we see it waiting and wake it. */
static void wake_all(hp__shm_hdr *h) {
    atomic_fetch_add(&h->epoch, 1);
    if (atomic_load(&h->waiters) > 0) {
        syscall(SYS_futex, (uint32_t *)&h->epoch, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* Threads left in pid's thread group (the "Threads:" line of /proc/<pid>/status), 0 when the
 * process is gone, -1 when unknown. */
static long threads_left(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    const char *t = strstr(buf, "\nThreads:");
    return t ? strtol(t + 9, NULL, 10) : -1;
}

/* True if pid is gone or a zombie (dead but not yet reaped by its parent). A thread-group
 * leader that has exited shows as a zombie while its other threads still run, and after a
 * SIGKILL while they are still being torn down; the process is dead (and its parent can reap
 * it) only once the leader is the last thread left. Calling it dead earlier would report a
 * live rank whose main thread ended, and let a peer that failed because of a killed rank
 * exit and be reaped by the launcher before the killed rank could be, so that the launcher
 * blamed the peer. */
static int pid_dead(pid_t pid) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
    if (!p || p[1] != ' ') return 0;
    if (p[2] != 'Z' && p[2] != 'X') return 0;
    long left = threads_left(pid);
    return left >= 0 && left <= 1;
}

static size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

static size_t slots_offset(int world) {
    return HP__SHM_PAGE + round_up((size_t)world * sizeof(hp__shm_rank), HP__SHM_PAGE);
}

static size_t segment_bytes(int world, size_t slot_bytes) {
    return round_up(slots_offset(world) + (size_t)world * slot_bytes + slot_bytes / 2,
                    HP__SHM_PAGE);
}

/* Rank 0's default (see HP__SHM_SLOT_DEFAULT), never under 256 KiB. */
static size_t default_slot(int world) {
    size_t s = HP__SHM_SLOT_DEFAULT;
    while (s > ((size_t)256 << 10) && s * (size_t)world > ((size_t)32 << 20)) s /= 2;
    return s;
}

const char *hp__shm_kind_name(int kind) {
    switch (kind) {
    case HP__SHM_ALL_GATHER:
        return "all_gather";
    case HP__SHM_REDUCE_SCATTER:
        return "reduce_scatter";
    case HP__SHM_ALL_REDUCE:
        return "all_reduce";
    case HP__SHM_BROADCAST:
        return "broadcast";
    case HP__SHM_BARRIER:
        return "barrier";
    case HP__SHM_ALL_TO_ALL:
        return "all_to_all";
    case HP__SHM_SPLIT:
        return "split";
    default:
        return "join";
    }
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void publish_broken(hp__shm_comm *c) {
    hp__shm_hdr *h = c->hdr;
    int32_t expect = 0;
    if (!h || !atomic_compare_exchange_strong(&h->broken, &expect, -1)) return;
    snprintf(h->broken_msg, sizeof h->broken_msg, "%s", c->broken_msg);
    atomic_store_explicit(&h->broken, c->base.rank + 1, memory_order_release);
    wake_all(h);
}

static hp_status vfail(hp__shm_comm *c, hp_err *err, hp_status status, int publish, const char *fmt,
                       va_list ap) {
    vsnprintf(c->broken_msg, sizeof c->broken_msg, fmt, ap);
    c->broken = 1;
    if (publish) publish_broken(c);
    return hp_errf(err, status, "shm '%s': %s", c->name, c->broken_msg);
}

hp_status hp__shm_fail(hp__shm_comm *c, hp_err *err, hp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hp_status s = vfail(c, err, status, 1, fmt, ap);
    va_end(ap);
    return s;
}

static hp_status fail_quiet(hp__shm_comm *c, hp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hp_status fail_quiet(hp__shm_comm *c, hp_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hp_status s = vfail(c, err, HP_IO, 0, fmt, ap);
    va_end(ap);
    return s;
}

/* A peer published a failure (b = its rank + 1, or -1 while it writes the message). */
static hp_status peer_failed(hp__shm_comm *c, int kind, int32_t b, hp_err *err) {
    for (int i = 0; b < 0 && i < 1000; i++) {
        sleep_ns(1000);
        b = atomic_load_explicit(&c->hdr->broken, memory_order_acquire);
    }
    char msg[HP__SHM_MSG_MAX];
    if (b > 0) {
        snprintf(msg, sizeof msg, "%s", c->hdr->broken_msg);
    } else {
        snprintf(msg, sizeof msg, "(no message)");
    }
    if (kind == 0) return fail_quiet(c, err, "join aborted: rank %d failed: %s", b - 1, msg);
    return fail_quiet(c, err, "%s #%llu aborted: rank %d failed: %s", hp__shm_kind_name(kind),
                      (unsigned long long)c->seq, b - 1, msg);
}

/* ---- waiting --------------------------------------------------------------------------------- */

static int first_behind(const hp__shm_comm *c, uint64_t target, int from) {
    for (int j = from; j < c->base.world; j++) {
        if (atomic_load_explicit(&c->ranks[j].phase, memory_order_acquire) < target) return j;
    }
    return -1;
}

void hp__shm_arrive(hp__shm_comm *c) {
    atomic_store_explicit(&c->ranks[c->base.rank].phase, ++c->phase, memory_order_release);
    wake_all(c->hdr);
}

hp_status hp__shm_sync(hp__shm_comm *c, int kind, hp_err *err) {
    hp__shm_arrive(c);
    return hp__shm_wait(c, kind, err);
}

hp_status hp__shm_wait(hp__shm_comm *c, int kind, hp_err *err) {
    hp__shm_hdr *h = c->hdr;
    uint64_t target = c->phase;
    /* Ranks below `j` have been seen at target already; phases only grow. */
    int j = first_behind(c, target, 0);
    if (j < 0) return HP_OK;
    int64_t t0 = now_ns();
    while (c->spin_ns > 0 && now_ns() - t0 < c->spin_ns) {
        for (int k = 0; k < 32; k++) cpu_relax();
        if ((j = first_behind(c, target, j)) < 0) return HP_OK;
    }
    int64_t deadline = t0 + (int64_t)(c->timeout_s * (double)NS_PER_S);
    int64_t next_check = t0 + LIVENESS_NS;
    for (;;) {
        atomic_fetch_add(&h->waiters, 1);
        uint32_t e = atomic_load(&h->epoch);
        if ((j = first_behind(c, target, j)) < 0) {
            atomic_fetch_sub(&h->waiters, 1);
            return HP_OK;
        }
        /* Progress first: when all have arrived the caller checks the descriptors itself, so
         * a mismatch is reported by every rank in its own words. */
        int32_t b = atomic_load_explicit(&h->broken, memory_order_acquire);
        if (b != 0) {
            atomic_fetch_sub(&h->waiters, 1);
            return peer_failed(c, kind, b, err);
        }
        int64_t now = now_ns();
        if (now >= deadline) {
            atomic_fetch_sub(&h->waiters, 1);
            return hp__shm_fail(c, err, HP_IO, "rank %d did not reach %s #%llu within %g s", j,
                                hp__shm_kind_name(kind), (unsigned long long)c->seq, c->timeout_s);
        }
        if (now >= next_check) {
            for (int k = j; k < c->base.world; k++) {
                if (atomic_load_explicit(&c->ranks[k].phase, memory_order_acquire) >= target) {
                    continue;
                }
                pid_t pid = atomic_load_explicit(&c->ranks[k].pid, memory_order_relaxed);
                if (pid_dead(pid)) {
                    atomic_fetch_sub(&h->waiters, 1);
                    return hp__shm_fail(
                        c, err, HP_IO, "rank %d (pid %d) died before reaching %s #%llu", k,
                        (int)pid, hp__shm_kind_name(kind), (unsigned long long)c->seq);
                }
            }
            next_check = now + LIVENESS_NS;
        }
        int64_t slice = deadline - now;
        if (slice > next_check - now) slice = next_check - now;
        if (slice > SLICE_NS) slice = SLICE_NS;
        futex_wait(&h->epoch, e, slice > 0 ? slice : 1);
        atomic_fetch_sub(&h->waiters, 1);
    }
}

hp_status hp__shm_peer_check(hp__shm_comm *c, int kind, hp_err *err) {
    int32_t b = atomic_load_explicit(&c->hdr->broken, memory_order_acquire);
    return b == 0 ? HP_OK : peer_failed(c, kind, b, err);
}

/* ---- segment names --------------------------------------------------------------------------- */

static int valid_name(const char *name, size_t max) {
    size_t n = name ? strnlen(name, max + 1) : 0;
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '.' || ch == '_' || ch == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* True if `path` currently names the file open as fd. */
static int names_file(const char *path, int fd) {
    struct stat a, b;
    int fd2 = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd2 < 0) return 0;
    int same =
        fstat(fd, &a) == 0 && fstat(fd2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    close(fd2);
    return same;
}

/* The pid of the live creator of the segment open as fd, or 0 when it is stale (incomplete
 * header, or its creator is gone). */
static pid_t live_creator(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(hp__shm_hdr)) return 0;
    void *p = mmap(NULL, HP__SHM_PAGE, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 0;
    const hp__shm_hdr *h = p;
    pid_t pid = 0;
    if (atomic_load_explicit(&((hp__shm_hdr *)p)->magic, memory_order_acquire) == HP__SHM_MAGIC &&
        !pid_dead(h->creator_pid)) {
        pid = h->creator_pid;
    }
    munmap(p, HP__SHM_PAGE);
    return pid;
}

/* Unlinks `path` if it still names the file open as fd and that segment is stale. Returns
 * the live creator's pid instead when it is not stale (nothing unlinked), else 0. */
static pid_t unlink_if_stale(const char *path, int fd) {
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    pid_t live = live_creator(fd);
    if (live == 0 && names_file(path, fd)) shm_unlink(path);
    flock(fd, LOCK_UN);
    return live;
}

/* ---- create and join ------------------------------------------------------------------------- */

static void attach(hp__shm_comm *c, uint8_t *map, size_t bytes) {
    c->map = map;
    c->map_bytes = bytes;
    c->hdr = (hp__shm_hdr *)map;
    c->ranks = (hp__shm_rank *)(map + HP__SHM_PAGE);
    c->slot_bytes = (size_t)c->hdr->slot_bytes;
    c->half = c->slot_bytes / 2;
    c->slots = map + slots_offset(c->base.world);
    c->result = c->slots + (size_t)c->base.world * c->slot_bytes;
}

static void init_header(uint8_t *map, int world, size_t slot_bytes, size_t bytes) {
    hp__shm_hdr *h = (hp__shm_hdr *)map;
    h->version = HP__SHM_VERSION;
    h->world = (uint32_t)world;
    h->slot_bytes = slot_bytes;
    h->total_bytes = bytes;
    h->creator_pid = (int32_t)getpid();
    hp__shm_rank *ranks = (hp__shm_rank *)(map + HP__SHM_PAGE);
    atomic_store_explicit(&ranks[0].pid, (int32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&h->joined, 1, memory_order_relaxed);
    atomic_store_explicit(&h->magic, HP__SHM_MAGIC, memory_order_release);
}

/* Rank 0: a fresh segment under path (replacing a stale one). */
static hp_status create_segment(hp__shm_comm *c, const char *path, size_t slot_bytes, hp_err *err) {
    int world = c->base.world;
    size_t bytes = segment_bytes(world, slot_bytes);
    int fd = -1;
    for (int tries = 0; fd < 0; tries++) {
        fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) break;
        if (errno != EEXIST || tries >= 5) {
            return hp_errf(err, HP_IO, "shm '%s': shm_open %s%s: %s", c->name, SHM_DIR, path,
                           strerror(errno));
        }
        int old = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (old < 0) continue; /* gone meanwhile */
        pid_t live = unlink_if_stale(path, old);
        close(old);
        if (live > 0) {
            return hp_errf(err, HP_IO,
                           "shm '%s': %s%s belongs to a live run (its rank 0 is pid %d); "
                           "give each run its own name",
                           c->name, SHM_DIR, path, (int)live);
        }
    }
    /* Reserve the pages now: a sparse tmpfs file that runs out of space later would SIGBUS
     * in the middle of a collective instead of failing here. */
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno;
    void *map = MAP_FAILED;
    if (rc == 0) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) rc = errno;
    }
    close(fd);
    if (rc != 0) {
        shm_unlink(path);
        return hp_errf(err, HP_IO, "shm '%s': cannot size %s%s to %zu bytes: %s%s", c->name,
                       SHM_DIR, path, bytes, strerror(rc),
                       rc == ENOSPC ? " (is /dev/shm large enough? docker: --shm-size)" : "");
    }
    init_header(map, world, slot_bytes, bytes);
    attach(c, map, bytes);
    return HP_OK;
}

/* Ranks > 0: open rank 0's segment, retrying until it exists and is complete, skipping (and
 * cleaning up) stale ones. On success *fd_out stays open until the join completes. */
static hp_status open_segment(hp__shm_comm *c, const char *path, int64_t deadline,
                              const int32_t *pids, int *fd_out, hp_err *err) {
    int64_t nap = 100 * 1000;
    for (;; sleep_ns(nap), nap = nap < 5 * 1000 * 1000 ? nap * 2 : nap) {
        if (now_ns() >= deadline) {
            return hp_errf(err, HP_IO, "shm '%s': rank 0 did not create %s%s within %g s", c->name,
                           SHM_DIR, path, c->timeout_s);
        }
        if (pids && pid_dead(pids[0])) {
            return hp_errf(err, HP_IO, "shm '%s': rank 0 (pid %d) died before creating %s%s",
                           c->name, (int)pids[0], SHM_DIR, path);
        }
        int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) {
            if (errno == ENOENT) continue;
            return hp_errf(err, HP_IO, "shm '%s': shm_open %s%s: %s", c->name, SHM_DIR, path,
                           strerror(errno));
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || (size_t)st.st_size < HP__SHM_PAGE) {
            close(fd); /* rank 0 is still sizing it, or it is garbage rank 0 will replace */
            continue;
        }
        uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return hp_errf(err, HP_IO, "shm '%s': mmap %s%s: %s", c->name, SHM_DIR, path,
                           strerror(errno));
        }
        hp__shm_hdr *h = (hp__shm_hdr *)map;
        if (atomic_load_explicit(&h->magic, memory_order_acquire) != HP__SHM_MAGIC) {
            munmap(map, (size_t)st.st_size);
            close(fd);
            continue;
        }
        if (pid_dead(h->creator_pid)) { /* a dead run's leftover: rank 0 will replace it */
            munmap(map, (size_t)st.st_size);
            unlink_if_stale(path, fd);
            close(fd);
            continue;
        }
        if (h->version != HP__SHM_VERSION || h->world != (uint32_t)c->base.world) {
            hp_status s = hp_errf(err, HP_INVALID,
                                  "shm '%s': %s%s is for %u ranks (version %u), this rank was "
                                  "started with world %d (version %u)",
                                  c->name, SHM_DIR, path, h->world, h->version, c->base.world,
                                  HP__SHM_VERSION);
            munmap(map, (size_t)st.st_size);
            close(fd);
            return s;
        }
        size_t slot = (size_t)h->slot_bytes;
        if (slot < 256 || slot % 128 != 0 || h->total_bytes != segment_bytes(c->base.world, slot) ||
            h->total_bytes != (uint64_t)st.st_size) {
            munmap(map, (size_t)st.st_size); /* our fstat predates the final size: look again */
            close(fd);
            continue;
        }
        attach(c, map, (size_t)st.st_size);
        *fd_out = fd;
        return HP_OK;
    }
}

void (*hp__shm_join_hook)(int rank);

/* Registers this rank and waits until all have. */
static hp_status join(hp__shm_comm *c, int64_t deadline, const int32_t *pids, hp_err *err) {
    hp__shm_hdr *h = c->hdr;
    int me = c->base.rank, world = c->base.world;
    if (me != 0) {
        int32_t expect = 0;
        if (!atomic_compare_exchange_strong(&c->ranks[me].pid, &expect, (int32_t)getpid())) {
            return hp__shm_fail(c, err, HP_INVALID, "rank %d joined twice (pids %d and %d)", me,
                                (int)expect, (int)getpid());
        }
        atomic_fetch_add(&h->joined, 1);
        wake_all(h);
        if (hp__shm_join_hook) hp__shm_join_hook(me);
    }
    for (;;) {
        atomic_fetch_add(&h->waiters, 1);
        uint32_t e = atomic_load(&h->epoch);
        /* Completion first, as in hp__shm_wait: once all have joined, the join has succeeded
         * even if a peer has already failed in collective #1 (or died after it), and that
         * failure belongs to our collective #1, which reports it. Checking `broken` first made
         * a joiner that was slow to leave this loop report "join aborted" for it. */
        if (atomic_load(&h->joined) >= (uint32_t)world) {
            atomic_fetch_sub(&h->waiters, 1);
            return HP_OK;
        }
        int32_t b = atomic_load_explicit(&h->broken, memory_order_acquire);
        if (b != 0) {
            atomic_fetch_sub(&h->waiters, 1);
            return peer_failed(c, 0, b, err);
        }
        for (int j = 0; j < world; j++) {
            pid_t pid = atomic_load(&c->ranks[j].pid);
            if (pid == 0 && pids) pid = pids[j]; /* not registered yet: its known process */
            if (j != me && pid_dead(pid)) {
                atomic_fetch_sub(&h->waiters, 1);
                return hp__shm_fail(c, err, HP_IO, "rank %d (pid %d) died while the ranks joined",
                                    j, (int)pid);
            }
        }
        int64_t now = now_ns();
        if (now >= deadline) {
            atomic_fetch_sub(&h->waiters, 1);
            char list[256] = "";
            size_t len = 0;
            int missing = 0;
            for (int j = 0; j < world; j++) {
                if (atomic_load(&c->ranks[j].pid) != 0) continue;
                if (missing++ < 16 && len < sizeof list) {
                    len += (size_t)snprintf(list + len, sizeof list - len, "%s%d",
                                            missing > 1 ? ", " : "", j);
                }
            }
            return hp__shm_fail(c, err, HP_IO, "rank%s %s%s of %d did not join within %g s",
                                missing > 1 ? "s" : "", list, missing > 16 ? ", ..." : "", world,
                                c->timeout_s);
        }
        futex_wait(&h->epoch, e, deadline - now < 5000000 ? deadline - now : 5000000);
        atomic_fetch_sub(&h->waiters, 1);
    }
}

static void shm_destroy(hp_comm *base) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    if (!c) return;
    if (c->map) {
        if (!c->local_refs) {
            munmap(c->map, c->map_bytes);
        } else if (atomic_fetch_sub(c->local_refs, 1) == 1) {
            munmap(c->map, c->map_bytes);
            hp_free((void *)c->local_refs);
        }
    }
    hp_free(c->srcs);
    hp_free(c);
}

static hp_status check_args(const char *name, int rank, int world, double timeout_s,
                            size_t slot_bytes, hp_comm **out, hp_err *err) {
    if (!out) return hp_errf(err, HP_INVALID, "shm: out is NULL");
    *out = NULL;
    if (name && !valid_name(name, HP__SHM_NAME_MAX)) {
        return hp_errf(err, HP_INVALID,
                       "shm: bad segment name '%.80s' (1-%d chars of [A-Za-z0-9._-])", name,
                       HP__SHM_NAME_MAX);
    }
    if (world < 1 || world > HP__SHM_MAX_WORLD) {
        return hp_errf(err, HP_INVALID, "shm: world %d out of range [1, %d]", world,
                       HP__SHM_MAX_WORLD);
    }
    if (rank < 0 || rank >= world) {
        return hp_errf(err, HP_INVALID, "shm: rank %d out of range [0, %d)", rank, world);
    }
    if (!(timeout_s > 0) || !isfinite(timeout_s) || timeout_s > 1e7) {
        return hp_errf(err, HP_INVALID, "shm: timeout %g s out of range (0, 1e7]", timeout_s);
    }
    if (slot_bytes != 0 &&
        (slot_bytes < 256 || slot_bytes % 128 != 0 || slot_bytes < (size_t)16 * (size_t)world ||
         slot_bytes > ((size_t)1 << 32))) {
        return hp_errf(err, HP_INVALID,
                       "shm: slot size %zu must be a multiple of 128 in [max(256, 16 * world), "
                       "4 GiB]",
                       slot_bytes);
    }
    return HP_OK;
}

static hp__shm_comm *comm_alloc(const char *name, int rank, int world, double timeout_s) {
    hp__shm_comm *c = hp_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.vt = &hp__shm_vtable;
    c->base.rank = rank;
    c->base.world = world;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->timeout_s = timeout_s;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->spin_ns = cpus >= world ? SPIN_NS : 0; /* spinning on an oversubscribed host only hurts */
    c->srcs = hp_calloc((size_t)world, sizeof *c->srcs);
    if (!c->srcs) {
        hp_free(c);
        return NULL;
    }
    return c;
}

/* Creates (rank 0) or opens the segment `name`, then joins; name and arguments are checked. */
static hp_status comm_new(const char *name, int rank, int world, double timeout_s,
                          size_t slot_bytes, const int32_t *pids, hp_comm **out, hp_err *err) {
    hp__shm_comm *c = comm_alloc(name, rank, world, timeout_s);
    if (!c) return hp_errf(err, HP_NOMEM, "shm '%s': out of memory", name);
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "/hp-%s", name);
    int64_t deadline = now_ns() + (int64_t)(timeout_s * (double)NS_PER_S);
    hp_status s;
    int fd = -1;
    if (rank == 0) {
        s = create_segment(c, path, slot_bytes ? slot_bytes : default_slot(world), err);
    } else {
        s = open_segment(c, path, deadline, pids, &fd, err);
    }
    if (s == HP_OK) {
        s = join(c, deadline, pids, err);
        if (rank == 0) {
            shm_unlink(path); /* joined or failed: either way the name has served */
        } else if (s != HP_OK && fd >= 0) {
            unlink_if_stale(path, fd); /* rank 0 died before it could unlink */
        }
    }
    if (fd >= 0) close(fd);
    if (s != HP_OK) {
        shm_destroy(&c->base);
        return s;
    }
    *out = &c->base;
    return HP_OK;
}

hp_status hp__shm_comm_new_ex(const char *name, int rank, int world, double timeout_s,
                              size_t slot_bytes, hp_comm **out, hp_err *err) {
    if (!name) return hp_errf(err, HP_INVALID, "shm: name is NULL");
    HP_TRY(check_args(name, rank, world, timeout_s, slot_bytes, out, err));
    return comm_new(name, rank, world, timeout_s, slot_bytes, NULL, out, err);
}

hp_status hp__shm_group_new(const char *name, int rank, int world, double timeout_s,
                            size_t slot_bytes, const int32_t *pids, hp_comm **out, hp_err *err) {
    HP_TRY(check_args(NULL, rank, world, timeout_s, slot_bytes, out, err));
    if (!valid_name(name, HP__SHM_GROUP_NAME_MAX)) {
        return hp_errf(err, HP_INVALID, "shm: bad group name '%.80s'", name ? name : "(null)");
    }
    return comm_new(name, rank, world, timeout_s, slot_bytes, pids, out, err);
}

hp_status hp_shm_comm_new(const char *name, int rank, int world, double timeout_s, hp_comm **out,
                          hp_err *err) {
    return hp__shm_comm_new_ex(name, rank, world, timeout_s, 0, out, err);
}

hp_status hp__shm_comm_new_local(int world, double timeout_s, size_t slot_bytes, hp_comm **comms,
                                 hp_err *err) {
    hp_comm *probe;
    HP_TRY(check_args(NULL, 0, world, timeout_s, slot_bytes, &probe, err));
    if (!comms) return hp_errf(err, HP_INVALID, "shm: comms is NULL");
    if (!slot_bytes) slot_bytes = default_slot(world);
    size_t bytes = segment_bytes(world, slot_bytes);
    _Atomic int *refs = hp_malloc(sizeof *refs);
    hp__shm_comm **cs = hp_calloc((size_t)world, sizeof *cs);
    void *map = MAP_FAILED;
    if (refs && cs)
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int ok = map != MAP_FAILED;
    /* Unique per process and group: split derives its groups' segment names from it. */
    static _Atomic unsigned local_groups;
    char name[64];
    snprintf(name, sizeof name, "local-%d-%u", (int)getpid(), atomic_fetch_add(&local_groups, 1));
    for (int r = 0; ok && r < world; r++)
        ok = (cs[r] = comm_alloc(name, r, world, timeout_s)) != NULL;
    if (!ok) {
        for (int r = 0; cs && r < world; r++) {
            if (cs[r]) hp_free(cs[r]->srcs);
            hp_free(cs[r]);
        }
        if (map != MAP_FAILED) munmap(map, bytes);
        hp_free(cs);
        hp_free((void *)refs);
        return hp_errf(err, HP_NOMEM, "shm 'local': cannot allocate %zu bytes for %d ranks", bytes,
                       world);
    }
    init_header(map, world, slot_bytes, bytes);
    hp__shm_hdr *h = map;
    atomic_init(refs, world);
    for (int r = 0; r < world; r++) {
        attach(cs[r], map, bytes);
        cs[r]->local_refs = refs;
        atomic_store(&cs[r]->ranks[r].pid, (int32_t)getpid());
        comms[r] = &cs[r]->base;
    }
    atomic_store(&h->joined, (uint32_t)world);
    hp_free(cs);
    return HP_OK;
}

void hp__shm_destroy(hp_comm *c) {
    shm_destroy(c);
}

int hp__shm_pid_dead(pid_t pid) {
    return pid_dead(pid);
}
