/* graph/base.c — status strings, error messages, the fault-injectable allocator, the arena
 * and the file helpers (whole-file read with a cap; the one durable atomic write, directory
 * fsync and mkdir -p, all fault-injectable like the allocator). */
#include "hp/base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One row of hp/status.def; a value outside it (a corrupt hp_err) reads as UNKNOWN. */
typedef struct status_row {
    const char *text, *name;
    int http, exit;
} status_row;

static const status_row status_rows[] = {
#define X(code, text, grpc, http, exit) [HP_##code] = {text, #code, http, exit},
#include "hp/status.def"
#undef X
};

static const status_row *status_row_of(hp_status s) {
    static const status_row unknown = {"unknown status", "UNKNOWN", 500, 1};
    return (unsigned)s < HP_ARRAY_LEN(status_rows) ? &status_rows[s] : &unknown;
}

const char *hp_status_str(hp_status s) {
    return status_row_of(s)->text;
}
const char *hp_status_name(hp_status s) {
    return status_row_of(s)->name;
}
int hp_status_http(hp_status s) {
    return status_row_of(s)->http;
}
int hp_status_exit(hp_status s) {
    return status_row_of(s)->exit;
}

hp_status hp_errf(hp_err *err, hp_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

hp_status hp_err_prefix(hp_err *err, const char *fmt, ...) {
    if (!err) return HP_OK;
    char prefix[HP_ERR_MSG_MAX], old[HP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* a message cut at HP_ERR_MSG_MAX still names what matters first */
    size_t o = 0, cap = sizeof err->msg - 1;
    for (const char *parts[3] = {prefix, ": ", old}, **p = parts; p < parts + 3; p++) {
        size_t n = strlen(*p);
        if (n > cap - o) n = cap - o;
        memcpy(err->msg + o, *p, n);
        o += n;
    }
    err->msg[o] = 0;
    return err->status;
}

void hp__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "hp: internal invariant failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

/* ---- allocator ------------------------------------------------------------------------------ */

static atomic_long alloc_count;        /* allocations since the last hp_alloc_fail_at */
static atomic_long alloc_fail_at = -1; /* fail this one and every later one; -1 never */

static bool alloc_should_fail(void) {
    long n = atomic_fetch_add(&alloc_count, 1);
    long at = atomic_load(&alloc_fail_at);
    return at >= 0 && n >= at;
}

long hp_alloc_fail_at(long n) {
    long made = atomic_exchange(&alloc_count, 0);
    atomic_store(&alloc_fail_at, n);
    return made;
}

/* Large blocks (4 MiB and up) ask for transparent huge pages: a compile fills hundreds of
 * megabytes of fresh arrays, and faulting them in 4 KiB at a time cost a fifth of the
 * 4096-layer compile. Only a hint: where THP is off it does nothing. */
#define HUGE_MIN  ((size_t)4 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

static void *huge_hint(void *p, size_t n) {
    if (p && n >= HUGE_MIN) {
        uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        uintptr_t e = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
        if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
    }
    return p;
}

/* While a hp_arena_cache_begin is open (a compile), the calling thread keeps what it frees for
 * its next allocations: arena chunks of the minimum size, and up to POOL_SLOTS large blocks
 * (POOL_MIN and up). A compile frees each pass's input graph and scratch arrays once the next
 * pass has its own, and reusing those pages instead of giving them back to the kernel, which
 * zeroes fresh ones on the first touch, saved a third of the 4096-layer compile's time (the
 * chunks; the large blocks another 3%, the huge-page hint 6%). */
#define POOL_MIN   ((size_t)1 << 20)
#define POOL_SLOTS 128

/* Large blocks kept for reuse: a thread's in a compile, and the process's between compiles. */
typedef struct block_pool {
    void *blk[POOL_SLOTS];
    size_t bytes[POOL_SLOTS];
    int n;
} block_pool;

static _Thread_local struct {
    int depth;
    hp_arena_chunk *spare;
    block_pool blocks;
} cache;

/* Under ASan freed memory goes back to malloc, so that a use after free still shows. */
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_CACHE 0
#endif
#endif
#ifndef ARENA_CACHE
#define ARENA_CACHE 1
#endif

/* The kept block to hand out for `n` bytes: the smallest of at least n, and (unless any size
 * will do: slack) at most 1.5 n, so that what the caller keeps wastes little; -1 none. */
static int pool_find(const block_pool *bp, size_t n, bool slack) {
    int best = -1;
    for (int i = 0; i < bp->n; i++) {
        size_t b = bp->bytes[i];
        if (b < n || (!slack && b > n + n / 2)) continue;
        if (best < 0 || b < bp->bytes[best]) best = i;
    }
    return best;
}

static void *pool_take(block_pool *bp, int i, size_t *got) {
    void *p = bp->blk[i];
    if (got) *got = bp->bytes[i];
    bp->n--;
    bp->blk[i] = bp->blk[bp->n];
    bp->bytes[i] = bp->bytes[bp->n];
    return p;
}

static void pool_add(block_pool *bp, void *p, size_t bytes) {
    bp->blk[bp->n] = p;
    bp->bytes[bp->n++] = bytes;
}

/* Keeps p (`bytes` usable) when a cache is open; a full pool drops its smallest block for a
 * larger one. False: the caller frees p. */
static bool pool_put(void *p, size_t bytes) {
    if (cache.depth == 0 || bytes < POOL_MIN) return false;
    block_pool *bp = &cache.blocks;
    if (bp->n == POOL_SLOTS) {
        int small = 0;
        for (int i = 1; i < bp->n; i++)
            if (bp->bytes[i] < bp->bytes[small]) small = i;
        if (bp->bytes[small] >= bytes) return false;
        free(pool_take(bp, small, NULL));
    }
    pool_add(bp, p, bytes);
    return true;
}

static void *reserve_take(size_t n);

/* A kept block for n bytes (n >= POOL_MIN): the thread's own in a compile, else the
 * process's (graph/base.c's reserve, below); NULL if none fits. */
static void *kept_block(size_t n) {
    int i = pool_find(&cache.blocks, n, false);
    if (i >= 0) return pool_take(&cache.blocks, i, NULL);
    return cache.depth == 0 ? reserve_take(n) : NULL;
}

void *hp_malloc(size_t n) {
    if (alloc_should_fail()) return NULL;
    void *p = n >= POOL_MIN ? kept_block(n) : NULL;
    return p ? p : huge_hint(malloc(n ? n : 1), n);
}

void *hp_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    if (alloc_should_fail()) return NULL;
    size_t n = count * size;
    void *p = n >= POOL_MIN ? kept_block(n) : NULL;
    return p ? memset(p, 0, n) : huge_hint(calloc(count ? count : 1, size ? size : 1), n);
}

void *hp_realloc(void *p, size_t n) {
    if (alloc_should_fail()) return NULL;
    size_t had = p ? malloc_usable_size(p) : 0;
    void *kept = n >= POOL_MIN && n > had ? kept_block(n) : NULL;
    if (kept) { /* a copy into faulted-in pages beats fresh ones for the grown part */
        if (had) memcpy(kept, p, had);
        hp_free(p);
        return kept;
    }
    return huge_hint(realloc(p, n ? n : 1), n);
}

void hp_free(void *p) {
    if (!p) return;
    if (cache.depth > 0 && pool_put(p, malloc_usable_size(p))) return;
    free(p);
}

char *hp_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = hp_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- arena ---------------------------------------------------------------------------------- */

struct hp_arena_chunk {
    hp_arena_chunk *next;
    size_t size; /* usable bytes after the header */
    _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK_MIN ((size_t)64 * 1024)

void hp_arena_init(hp_arena *a) {
    memset(a, 0, sizeof *a);
}

/* Between compiles the process keeps what the outermost end had left, up to RESERVE_MAX bytes,
 * for the next compile on any thread: a daemon compiles job after job, and a fresh page costs
 * a fault and the kernel's zeroing on first touch (on this kind of virtual machine a second
 * fault in the host too, so the cost varies fourfold from run to run: the 4096-layer compile
 * spent 0.12 to 0.86 s in the kernel, against 0.03 s warm). What is kept is marked MADV_FREE:
 * under memory pressure the kernel takes those pages back without swapping them (they read
 * as zeros after; nothing kept is read before it is written), otherwise they come back as
 * they were, with no fault. */
#define RESERVE_MAX ((size_t)1 << 30)

static struct {
    pthread_mutex_t mu;
    hp_arena_chunk *spare;
    block_pool blocks;
    size_t bytes; /* of the blocks and chunks */
} reserve = {.mu = PTHREAD_MUTEX_INITIALIZER};
static atomic_int reserve_blocks; /* reserve.blocks.n, readable without the lock */

/* Outside a compile a large hp_malloc may take a kept block too, so that a process that
 * compiled once (a standalone worker) reuses those pages instead of holding them idle. */
static void *reserve_take(size_t n) {
    if (!atomic_load_explicit(&reserve_blocks, memory_order_relaxed)) return NULL;
    void *p = NULL;
    pthread_mutex_lock(&reserve.mu);
    int i = pool_find(&reserve.blocks, n, false);
    if (i >= 0) {
        size_t got;
        p = pool_take(&reserve.blocks, i, &got);
        reserve.bytes -= got;
        atomic_store_explicit(&reserve_blocks, reserve.blocks.n, memory_order_relaxed);
    }
    pthread_mutex_unlock(&reserve.mu);
    return p;
}

static void lazy_free(void *p, size_t n) {
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095,
              e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (e > a) (void)madvise((void *)a, e - a, MADV_FREE);
}

void hp_arena_cache_begin(void) {
    if (!ARENA_CACHE || cache.depth++ > 0) return;
    pthread_mutex_lock(&reserve.mu);
    cache.blocks = reserve.blocks; /* the thread's pool is empty between compiles */
    cache.spare = reserve.spare;
    reserve.spare = NULL;
    reserve.blocks.n = 0;
    reserve.bytes = 0;
    atomic_store_explicit(&reserve_blocks, 0, memory_order_relaxed);
    pthread_mutex_unlock(&reserve.mu);
}

void hp_arena_cache_end(void) {
    if (cache.depth > 0 && --cache.depth > 0) return;
    pthread_mutex_lock(&reserve.mu);
    while (cache.blocks.n) {
        size_t b;
        void *p = pool_take(&cache.blocks, 0, &b);
        if (reserve.blocks.n < POOL_SLOTS && reserve.bytes + b <= RESERVE_MAX) {
            lazy_free(p, b);
            pool_add(&reserve.blocks, p, b);
            reserve.bytes += b;
        } else {
            free(p);
        }
    }
    while (cache.spare) {
        hp_arena_chunk *c = cache.spare;
        cache.spare = c->next;
        if (reserve.bytes + sizeof *c + ARENA_CHUNK_MIN <= RESERVE_MAX) {
            lazy_free(c->data, ARENA_CHUNK_MIN);
            reserve.bytes += sizeof *c + ARENA_CHUNK_MIN;
            c->next = reserve.spare;
            reserve.spare = c;
        } else {
            free(c);
        }
    }
    atomic_store_explicit(&reserve_blocks, reserve.blocks.n, memory_order_relaxed);
    pthread_mutex_unlock(&reserve.mu);
}

void *hp_cache_take(size_t bytes, size_t *got) {
    int i = bytes >= POOL_MIN ? pool_find(&cache.blocks, bytes, true) : -1;
    return i < 0 ? NULL : pool_take(&cache.blocks, i, got);
}

void hp_arena_fini(hp_arena *a) {
    hp_arena_chunk *c = a->head;
    while (c) {
        hp_arena_chunk *next = c->next;
        if (cache.depth > 0 && c->size == ARENA_CHUNK_MIN) {
            c->next = cache.spare;
            cache.spare = c;
        } else {
            hp_free(c);
        }
        c = next;
    }
    memset(a, 0, sizeof *a);
}

/* n bytes, 16-aligned, not cleared: for callers that overwrite them all. */
void *hp_arena_take(hp_arena *a, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    size_t need = (n + 15) & ~(size_t)15;
    if (!a->head || a->used + need > a->head->size) {
        size_t size = need > ARENA_CHUNK_MIN ? need : ARENA_CHUNK_MIN;
        hp_arena_chunk *c = NULL;
        if (size == ARENA_CHUNK_MIN && cache.spare) {
            c = cache.spare;
            cache.spare = c->next;
        } else if (!(c = hp_malloc(sizeof *c + size))) {
            return NULL;
        }
        c->next = a->head;
        c->size = size;
        a->head = c;
        a->used = 0;
    }
    void *p = a->head->data + a->used;
    a->used += need;
    a->total += need;
    return p;
}

void hp_arena_adopt(hp_arena *dst, hp_arena *src) {
    if (!src->head) return;
    if (!dst->head) {
        *dst = *src; /* dst bumps on in src's head chunk */
    } else {
        /* behind dst's head, which stays the chunk dst bumps in */
        hp_arena_chunk *last = src->head;
        while (last->next) last = last->next;
        last->next = dst->head->next;
        dst->head->next = src->head;
        dst->total += src->total;
    }
    memset(src, 0, sizeof *src);
}

void *hp_arena_alloc(hp_arena *a, size_t n) {
    void *p = hp_arena_take(a, n);
    if (p) memset(p, 0, n);
    return p;
}

char *hp_arena_strdup(hp_arena *a, const char *s) {
    return hp_arena_memdup(a, s, strlen(s) + 1);
}

void *hp_arena_memdup(hp_arena *a, const void *p, size_t n) {
    void *d = hp_arena_take(a, n);
    if (d && n) memcpy(d, p, n);
    return d;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

size_t hp_utf8_check(const char *str, size_t n, bool nul_ok) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (!c && !nul_ok) return i;
            i++;
            continue;
        }
        size_t k;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, cp = c & 0x07, min = 0x10000;
        else
            return i; /* a continuation byte, an overlong lead (C0, C1) or past F4 */
        if (n - i <= k) return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += k + 1;
    }
    return n;
}

/* ---- files ---------------------------------------------------------------------------------- */

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a fifo";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

hp_status hp_file_open_read(const char *path, int *fd, uint64_t *size, hp_err *err) {
    *fd = -1;
    if (size) *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return hp_errf(err, HP_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return hp_errf(err, HP_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return hp_errf(err, HP_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return hp_errf(err, HP_IO, "%s: fcntl: %s", path, strerror(e));
    }
    *fd = f;
    if (size) *size = (uint64_t)st.st_size;
    return HP_OK;
}

hp_status hp_file_read(const char *path, size_t max_bytes, uint8_t **data, size_t *len,
                       hp_err *err) {
    *data = NULL;
    *len = 0;
    int fd;
    uint64_t fsize;
    HP_TRY(hp_file_open_read(path, &fd, &fsize, err));
    if (fsize > max_bytes) {
        close(fd);
        return hp_errf(err, HP_LIMIT, "%s: file is %llu bytes, over the limit of %zu", path,
                       (unsigned long long)fsize, max_bytes);
    }
    size_t n = (size_t)fsize;
    uint8_t *buf = hp_malloc(n + 1);
    if (!buf) {
        close(fd);
        return hp_errf(err, HP_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            hp_free(buf);
            return hp_errf(err, HP_IO, "%s: %s", path, e ? strerror(e) : "file shrank while read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0; /* text readers may treat the buffer as a C string */
    *data = buf;
    *len = n;
    return HP_OK;
}

/* ---- durable writes ------------------------------------------------------------------------ */

static atomic_long io_count;        /* counted calls since the last hp_io_fail_at */
static atomic_long io_fail_at = -1; /* fail this one (and later ones if sticky); -1 never */
static atomic_int io_fail_errno;
static atomic_bool io_fail_sticky;

long hp_io_fail_at(long n, int errnum, bool sticky) {
    long made = atomic_exchange(&io_count, 0);
    atomic_store(&io_fail_errno, errnum);
    atomic_store(&io_fail_sticky, sticky);
    atomic_store(&io_fail_at, n);
    return made;
}

/* True (errno set) when the injected fault hits this call. */
static bool io_fault(void) {
    long n = atomic_fetch_add(&io_count, 1);
    long at = atomic_load(&io_fail_at);
    if (at < 0 || n < at || (n > at && !atomic_load(&io_fail_sticky))) return false;
    errno = atomic_load(&io_fail_errno);
    return true;
}

static int io_open(const char *path, int flags, mode_t mode) {
    return io_fault() ? -1 : open(path, flags, mode);
}
static ssize_t io_write(int fd, const void *p, size_t n) {
    return io_fault() ? -1 : write(fd, p, n);
}
static int io_fsync(int fd) {
    return io_fault() ? -1 : fsync(fd);
}
static int io_close(int fd) {
    if (io_fault()) {
        int e = errno;
        close(fd); /* the descriptor is gone either way, as with a real close error */
        errno = e;
        return -1;
    }
    return close(fd);
}
static int io_rename(const char *from, const char *to) {
    return io_fault() ? -1 : rename(from, to);
}
static int io_mkdir(const char *path, mode_t mode) {
    return io_fault() ? -1 : mkdir(path, mode);
}

static hp_status io_status(int e) {
    return e == ENOSPC || e == EDQUOT ? HP_NOSPACE : HP_IO;
}

hp_status hp_fsync_dir(const char *dir, hp_err *err) {
    int fd = io_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return hp_errf(err, io_status(errno), "%s: %s", dir, strerror(errno));
    if (io_fsync(fd) != 0 && errno != EINVAL) { /* some file systems cannot fsync a directory */
        int e = errno;
        close(fd);
        return hp_errf(err, io_status(e), "%s: fsync: %s", dir, strerror(e));
    }
    close(fd);
    return HP_OK;
}

/* Creates dir unless it is a directory already (then no mkdir call: only real creations
 * count for fault injection, and only they can fail with ENOSPC). */
static hp_status mkdir_one(const char *dir, hp_err *err) {
    struct stat st0;
    if (stat(dir, &st0) == 0 && S_ISDIR(st0.st_mode)) return HP_OK;
    if (io_mkdir(dir, 0755) == 0) return HP_OK;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return HP_OK;
    return hp_errf(err, e == EEXIST ? HP_IO : io_status(e), "%s: cannot create directory: %s", dir,
                   e == EEXIST ? "exists and is not a directory" : strerror(e));
}

hp_status hp_mkdir_p(const char *dir, hp_err *err) {
    struct stat st;
    if (!dir || !*dir) return hp_errf(err, HP_INVALID, "empty directory name");
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return HP_OK;
    char *p = hp_strdup(dir);
    if (!p) return hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
    hp_status s = HP_OK;
    for (char *q = p + 1; s == HP_OK && *q; q++) {
        if (*q != '/' || q[-1] == '/') continue;
        *q = 0;
        s = mkdir_one(p, err);
        *q = '/';
    }
    if (s == HP_OK) s = mkdir_one(p, err);
    hp_free(p);
    return s;
}

/* The directory part of path ("." when there is none), into buf. */
static void parent_dir(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

hp_status hp_file_write_atomic_iov(const char *path, const hp_iov *v, int n, hp_err *err) {
    /* the rename would replace whatever is there: never a device, fifo or directory (as root,
     * `-o /dev/stdout` would have replaced the device node) */
    struct stat old;
    if (stat(path, &old) == 0 && !S_ISREG(old.st_mode))
        return hp_errf(err, HP_IO, "%s: not a regular file (%s); not replaced", path,
                       file_kind(old.st_mode));
    size_t plen = strlen(path);
    char *tmp = hp_malloc(plen + 32);
    char *dir = hp_malloc(plen + 2);
    if (!tmp || !dir) {
        hp_free(tmp);
        hp_free(dir);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    parent_dir(path, dir, plen + 2);
    const char *what = "open";
    int fd = io_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) goto fail;
    what = "write";
    for (int i = 0; i < n; i++) {
        const unsigned char *p = v[i].p;
        size_t done = 0;
        while (done < v[i].n) {
            ssize_t w = io_write(fd, p + done, v[i].n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) goto fail;
            done += (size_t)w;
        }
    }
    what = "fsync";
    if (io_fsync(fd) != 0) goto fail;
    what = "close";
    int c = io_close(fd);
    fd = -1;
    if (c != 0) goto fail;
    what = "rename";
    if (io_rename(tmp, path) != 0) goto fail;
    hp_free(tmp);
    /* renamed: path holds the new contents; only their durability across a crash is open */
    hp_status s = hp_fsync_dir(dir, err);
    hp_free(dir);
    return s;
fail:;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    hp_free(tmp);
    hp_free(dir);
    return hp_errf(err, io_status(e), "%s: %s: %s", path, what, strerror(e));
}

hp_status hp_file_write_atomic(const char *path, const void *data, size_t len, hp_err *err) {
    hp_iov v = {data, len};
    return hp_file_write_atomic_iov(path, &v, 1, err);
}

/* ---- append-only line logs -------------------------------------------------------------- */

hp_status hp_file_log_open(const char *path, bool truncate, int *fd, hp_err *err) {
    *fd = -1;
    int f = io_open(
        path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | (truncate ? O_TRUNC : 0),
        0644);
    if (f < 0) return hp_errf(err, io_status(errno), "%s: open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return hp_errf(err, HP_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return hp_errf(err, HP_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    /* a torn last line (a write cut short by a crash or a full disk): cut it off */
    int r = open(path, O_RDONLY | O_CLOEXEC);
    off_t end = st.st_size, cut = end;
    char buf[4096];
    while (r >= 0 && cut > 0) {
        off_t lo = cut > (off_t)sizeof buf ? cut - (off_t)sizeof buf : 0;
        ssize_t n = pread(r, buf, (size_t)(cut - lo), lo);
        if (n != cut - lo) break;
        if (cut == end && buf[n - 1] == '\n') break; /* whole */
        ssize_t i = n - 1;
        while (i >= 0 && buf[i] != '\n') i--;
        if (i >= 0) {
            cut = lo + i + 1;
            break;
        }
        cut = lo;
    }
    if (r >= 0) close(r);
    if (cut < end && ftruncate(f, cut) != 0) {
        int e = errno;
        close(f);
        return hp_errf(err, io_status(e), "%s: cutting a torn last line: %s", path, strerror(e));
    }
    *fd = f;
    return HP_OK;
}

hp_status hp_file_log_append(int fd, const char *path, const void *line, size_t len, hp_err *err) {
    const char *p = line;
    if (len == 0 || p[len - 1] != '\n')
        return hp_errf(err, HP_INVALID, "%s: a log line must end with a newline", path);
    struct stat st;
    if (fstat(fd, &st) != 0) return hp_errf(err, HP_IO, "%s: fstat: %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t w = io_write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            /* no half line stays: back to the length before (best effort on a failing disk;
             * hp_file_log_open cuts a torn line too) */
            if (done > 0 && ftruncate(fd, st.st_size) != 0) {
            }
            return hp_errf(err, io_status(e), "%s: write: %s", path, strerror(e));
        }
        done += (size_t)w;
    }
    return HP_OK;
}

char *hp_quote(char *dst, size_t n, const char *s, size_t max_in) {
    size_t o = 0;
    if (n < 8) {
        if (n) dst[0] = 0;
        return dst;
    }
    dst[o++] = '"';
    size_t i = 0;
    for (; s && s[i] && i < max_in; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[5];
        int k;
        if (c == '"' || c == '\\')
            k = snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n')
            k = snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r')
            k = snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t')
            k = snprintf(esc, sizeof esc, "\\t");
        else if (c < 0x20 || c >= 0x7f)
            k = snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            esc[0] = (char)c, esc[1] = 0, k = 1;
        if (o + (size_t)k + 5 > n) break; /* room for ..." and the NUL */
        memcpy(dst + o, esc, (size_t)k);
        o += (size_t)k;
    }
    if (s && s[i]) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o++] = '"';
    dst[o] = 0;
    return dst;
}

void hp_cpu_model(char *out, size_t len) {
    snprintf(out, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *s = colon + 1;
        while (*s == ' ' || *s == '\t') s++;
        size_t n = strcspn(s, "\n");
        if (n > 0) snprintf(out, len, "%.*s", (int)n, s);
        break;
    }
    fclose(f);
}
