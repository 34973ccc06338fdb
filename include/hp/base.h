/* hp/base.h — status codes, error messages, the swappable allocator and the arena.
 *
 * Every fallible function returns hp_status and takes `hp_err *err` last (may be NULL).
 * On failure the message names the bad value; libraries never print and never exit.
 * HP_ASSERT is for invariants of our own code only, never for anything a user, a file
 * or a peer sent.
 */
#ifndef HP_BASE_H
#define HP_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the table is hp/status.def (code, name, text, gRPC status, HTTP status, exit
 * code); define X(NAME, "text", GRPC, HTTP, EXIT) and include it to expand one line per row. */

typedef enum {
#define X(name, text, grpc, http, exit) HP_##name,
#include "hp/status.def"
#undef X
} hp_status;

enum {
    HP_STATUS_COUNT = 0
#define X(name, text, grpc, http, exit) +1
#include "hp/status.def"
#undef X
};

/* The phrase ("invalid argument"), the name ("INVALID"), the HTTP status and the exit code of a
 * status, from hp/status.def; an unknown value gets "unknown status", "UNKNOWN", 500 and 1. */
const char *hp_status_str(hp_status s);
const char *hp_status_name(hp_status s);
int hp_status_http(hp_status s);
int hp_status_exit(hp_status s);

#define HP_ERR_MSG_MAX 512

/* An error: the status and one line a person can act on. Caller storage. */
typedef struct hp_err {
    hp_status status;
    char msg[HP_ERR_MSG_MAX];
} hp_err;

/* Records status and a printf-formatted message in err (if non-NULL); returns status, so that
 * `return hp_errf(err, HP_INVALID, "...")` reads naturally. The first error wins only if the
 * caller wants it to: this always overwrites. */
hp_status hp_errf(hp_err *err, hp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to an existing message (context as an error travels up). */
hp_status hp_err_prefix(hp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define HP_TRY(expr)                                                                               \
    do {                                                                                           \
        hp_status hp__s = (expr);                                                                  \
        if (hp__s != HP_OK) return hp__s;                                                          \
    } while (0)

/* Invariant of our own code. Never for input validation. */
void hp__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define HP_ASSERT(e) ((e) ? (void)0 : hp__assert_fail(#e, __FILE__, __LINE__))

#define HP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Writes s as a double-quoted, escaped string (\" \\ \n \r \t, \xHH for other control bytes
 * and for bytes >= 0x80) into dst (size n >= 8, else ""), at most max_in bytes of s, then "..."
 * when cut; for echoing what a file or a peer sent into errors and logs, where a raw newline
 * would forge a line. Returns dst. HP_QUOTE_MAX fits a quoted id of up to 64 bytes. */
char *hp_quote(char *dst, size_t n, const char *s, size_t max_in);
#define HP_QUOTE_MAX 272

/* ---- allocator ------------------------------------------------------------------------------
 * All heap memory of the libraries goes through these, so that tests can fail the Nth
 * allocation (fault injection) and check that nothing leaks. They behave as malloc & co.
 */
void *hp_malloc(size_t n);
void *hp_calloc(size_t count, size_t size); /* checks count*size overflow */
void *hp_realloc(void *p, size_t n);
void hp_free(void *p);
char *hp_strdup(const char *s);

/* Fault injection: the allocation numbered `n` (counting from 0 after this call) and every
 * later one fail. n < 0 disables. Returns the number of allocations made since the last call
 * (so a test can learn how many allocations an operation makes). Not for production use. */
long hp_alloc_fail_at(long n);

/* ---- arena ----------------------------------------------------------------------------------
 * A bump allocator for IR objects: everything lives until hp_arena_fini. Chunks come from
 * hp_malloc; a failed allocation returns NULL and leaves the arena usable. */
typedef struct hp_arena_chunk hp_arena_chunk;
typedef struct hp_arena {
    hp_arena_chunk *head;
    size_t used;  /* bytes used in head */
    size_t total; /* bytes handed out, all chunks */
} hp_arena;

void hp_arena_init(hp_arena *a);
void hp_arena_fini(hp_arena *a);
void *hp_arena_alloc(hp_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *hp_arena_strdup(hp_arena *a, const char *s);
void *hp_arena_memdup(hp_arena *a, const void *p, size_t n);
void *hp_arena_take(hp_arena *a, size_t n); /* not cleared, 16-byte aligned: the caller fills it */
/* Moves every chunk of src into dst (freed with dst); src is left empty and usable. */
void hp_arena_adopt(hp_arena *dst, hp_arena *src);
/* Between begin and end (nestable, per thread) the arenas this thread finishes keep their
 * chunks for this thread's next arena allocations instead of freeing them; the outermost end
 * keeps what is left for the next (below). For a sequence of graphs each freed once the next is
 * built (hp_compile); an arena may still be finished on another thread or after the end (its chunks
 * are freed). */
void hp_arena_cache_begin(void);
void hp_arena_cache_end(void);
/* Within the same begin/end, the thread also keeps up to 128 blocks of 1 MiB or more that it
 * frees (hp_free) for its next hp_malloc/hp_calloc/hp_realloc of a size they fit within 1.5x,
 * their pages already faulted in. hp_cache_take(bytes, &got) hands over the smallest kept
 * block of at least `bytes`, however much larger (its size in *got), else NULL. The outermost
 * end moves what is kept to a process-wide reserve (up to 1 GiB, MADV_FREE) that the next
 * outermost begin on any thread takes over, and that a large allocation outside a cache may
 * take a block from. */
void *hp_cache_take(size_t bytes, size_t *got);

/* ---- files ---------------------------------------------------------------------------------- */

/* Where the first byte of s[0..n) that is not valid UTF-8 (or is NUL, when nul_ok is false)
 * begins; n when all is valid. Strict: no overlong forms, surrogates or code points past
 * U+10FFFF. For every `string` read from a file or a peer. */
size_t hp_utf8_check(const char *s, size_t n, bool nul_ok);

/* Opens path for reading without ever blocking in open(): O_RDONLY|O_NONBLOCK|O_CLOEXEC (a
 * FIFO or a device with no writer would otherwise hang the caller forever), fstat, refuse
 * anything but a regular file (HP_IO, "PATH: not a regular file (a fifo)"), then clear
 * O_NONBLOCK so reads behave as usual. On HP_OK *fd is the caller's to close and *size (may be
 * NULL) is the file's size; on failure *fd is -1. Every reader of a user-named path uses it. */
hp_status hp_file_open_read(const char *path, int *fd, uint64_t *size, hp_err *err);

/* Reads a whole file (at most max_bytes) into a fresh hp_malloc'd buffer. A larger file is
 * HP_LIMIT, naming the path and the limit. */
hp_status hp_file_read(const char *path, size_t max_bytes, uint8_t **data, size_t *len,
                       hp_err *err);
/* One piece of a file being written. */
typedef struct hp_iov {
    const void *p;
    size_t n;
} hp_iov;

/* Writes the concatenation of v[0..n) to path durably and atomically: a temp file beside it
 * (`path.tmp.PID`), write, fsync, close, rename over path, fsync the directory. On failure
 * the temp file is removed and path keeps its old contents (or stays absent); a reader never
 * sees a half-written file under path. An existing path that is not a regular file (a
 * device, a fifo, a directory) is refused, never replaced. Errors name the path, the step and
 * the errno text:
 * HP_NOSPACE for a full disk or quota (ENOSPC, EDQUOT), HP_IO otherwise. The one file writer
 * of every library (checkpoints, weights, traces, metrics, jobs, dumps). */
hp_status hp_file_write_atomic_iov(const char *path, const hp_iov *v, int n, hp_err *err);
/* hp_file_write_atomic_iov of one buffer. */
hp_status hp_file_write_atomic(const char *path, const void *data, size_t len, hp_err *err);

/* Append-only line logs (metrics.jsonl). hp_file_log_open opens path for appending (created
 * 0644; emptied first when truncate), refusing what is not a regular file, and cuts off a torn
 * last line (one without its newline: a write cut short by a crash or a full disk), so that
 * every line in the file is whole. hp_file_log_append appends one line (len bytes ending with
 * its newline) and, when a write fails part way, cuts the file back to its length before: no
 * half line stays. Not fsynced (a log, not a commit). Errors name the path, the step and the
 * errno text: HP_NOSPACE for a full disk or quota, HP_IO otherwise. Both count for
 * hp_io_fail_at (the open and every write). */
hp_status hp_file_log_open(const char *path, bool truncate, int *fd, hp_err *err);
hp_status hp_file_log_append(int fd, const char *path, const void *line, size_t len, hp_err *err);

/* fsyncs a directory, so that a rename or create in it is durable (file systems that cannot
 * fsync a directory, EINVAL, are fine). */
hp_status hp_fsync_dir(const char *dir, hp_err *err);

/* Creates dir and its missing parents (mkdir -p, mode 0755); an existing directory is fine,
 * an existing non-directory is HP_IO naming it. */
hp_status hp_mkdir_p(const char *dir, hp_err *err);

/* The CPU's model name from /proc/cpuinfo ("AMD EPYC 7B13"), "unknown CPU" when it has none:
 * what the peak and profile caches are keyed by. */
void hp_cpu_model(char *out, size_t len);

/* I/O fault injection, as hp_alloc_fail_at for memory: every system call of the helpers
 * above that creates or changes a file (open, write, fsync, close, rename, directory fsync,
 * mkdir; the log open and writes) counts; the nth one from now (0-based) fails with errno `errnum`
 * (ENOSPC, EIO, ...) and so does every later one while `sticky`, else only that one. n < 0
 * disables. Returns the number of such calls made since the last call. Process-wide and
 * thread-safe; for tests. */
long hp_io_fail_at(long n, int errnum, bool sticky);

#ifdef __cplusplus
}
#endif
#endif
