/* tests/daemon/test_store.c — the job store: round trips, transitions with history, stale
 * transitions refused, metrics replay, exits, a child killed with SIGKILL mid-write (everything
 * it committed is there after reopening), an allocation fault loop, and a full-disk fault loop
 * through a pass-through SQLite VFS. */
#include "daemon/store.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], path[300];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/hp-test-store-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/hpd.db", dir);
}
static void teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 60);

static hp_status insert(hpd_store *s, const char *name, hpd_store_row *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->state = 1;
    static uint8_t blob[] = {1, 2, 3, 0, 5};
    r->job = blob;
    r->job_len = sizeof blob;
    r->world = 2;
    r->total_steps = 100;
    snprintf(r->run_dir, sizeof r->run_dir, "/x/%s", name);
    hp_err err = {0};
    hp_status st = hpd_store_insert(s, r, &err);
    r->job = NULL;
    return st;
}

Test(store, roundtrip) {
    hpd_store *s;
    hp_err err = {0};
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "%s", err.msg);
    hpd_store_row r;
    cr_assert_eq(insert(s, "a", &r), HP_OK);
    cr_expect_str_eq(r.id, "j-000001");
    cr_assert_eq(insert(s, "b", &r), HP_OK);
    cr_expect_str_eq(r.id, "j-000002");
    cr_assert_eq(hpd_store_transition(s, "j-000001", 1, 2, "schedule", 0, 0, "", &err), HP_OK, "%s",
                 err.msg);
    /* stale: the stored state is 2 now */
    cr_expect_eq(hpd_store_transition(s, "j-000001", 1, 2, "again", 0, 0, "", &err), HP_INVALID);
    cr_expect_eq(hpd_store_transition(s, "j-999", 1, 2, "x", 0, 0, "", &err), HP_NOT_FOUND);
    cr_assert_eq(
        hpd_store_transition(s, "j-000001", 2, 7, "compile_failed", 0, 0, "node 3: bad", &err),
        HP_OK);
    hpd_store_close(s);

    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "%s", err.msg);
    hpd_store_row g;
    cr_assert_eq(hpd_store_get(s, "j-000001", &g, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(g.state, 7);
    cr_expect_str_eq(g.error, "node 3: bad");
    cr_expect_str_eq(g.name, "a");
    cr_expect_str_eq(g.run_dir, "/x/a");
    cr_expect_eq(g.job_len, 5);
    cr_expect_eq(g.job[4], 5);
    cr_expect_eq(g.world, 2);
    cr_expect_eq(g.total_steps, 100);
    hpd_store_row_fini(&g);
    cr_expect_eq(hpd_store_get(s, "nope", &g, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "nope"));
    hpd_store_close(s);
}

static bool count_trans(void *ctx, int64_t seq, int from, int to, double t, const char *why) {
    int *n = ctx;
    cr_expect_eq(seq, *n + 1);
    (*n)++;
    return true;
}

Test(store, history_and_request_id) {
    hpd_store *s;
    hp_err err = {0};
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK);
    hpd_store_row r;
    memset(&r, 0, sizeof r);
    snprintf(r.request_id, sizeof r.request_id, "req-1");
    r.state = 1;
    cr_assert_eq(hpd_store_insert(s, &r, &err), HP_OK, "%s", err.msg);
    hpd_store_row f;
    cr_assert_eq(hpd_store_find_request(s, "req-1", &f, &err), HP_OK);
    cr_expect_str_eq(f.id, r.id);
    hpd_store_row_fini(&f);
    cr_expect_eq(hpd_store_find_request(s, "req-2", &f, &err), HP_NOT_FOUND);
    const int path_[] = {1, 2, 3, 4, 5, 3, 4, 6};
    for (size_t i = 1; i < HP_ARRAY_LEN(path_); i++)
        cr_assert_eq(
            hpd_store_transition(s, r.id, path_[i - 1], path_[i], "t", (int64_t)i, 1, NULL, &err),
            HP_OK, "%s", err.msg);
    int n = 0;
    cr_assert_eq(hpd_store_each_transition(s, r.id, count_trans, &n, &err), HP_OK);
    cr_expect_eq(n, (int)HP_ARRAY_LEN(path_)); /* the "submitted" row + 7 */
    hpd_store_close(s);
}

static bool sum_metrics(void *ctx, int64_t step, int rank, const uint8_t *rec, size_t len) {
    int64_t *sum = ctx;
    cr_expect_eq(len, 8);
    int64_t v;
    memcpy(&v, rec, 8);
    cr_expect_eq(v, step * 10 + rank);
    *sum += step;
    return true;
}

Test(store, metrics_and_exits) {
    hpd_store *s;
    hp_err err = {0};
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK);
    hpd_store_row r;
    cr_assert_eq(insert(s, "m", &r), HP_OK);
    cr_assert_eq(hpd_store_begin(s, &err), HP_OK);
    for (int64_t step = 1; step <= 100; step++)
        for (int rank = 0; rank < 2; rank++) {
            int64_t v = step * 10 + rank;
            cr_assert_eq(hpd_store_add_metrics(s, r.id, step, rank, (uint8_t *)&v, 8, &err), HP_OK,
                         "%s", err.msg);
        }
    cr_assert_eq(hpd_store_commit(s, &err), HP_OK);
    int64_t sum = 0;
    cr_assert_eq(hpd_store_each_metrics(s, r.id, 91, sum_metrics, &sum, &err), HP_OK);
    cr_expect_eq(sum, 2 * (91 + 100) * 10 / 2);
    cr_assert_eq(hpd_store_add_exit(s, r.id, 0, 1, 137, &err), HP_OK);
    int status = 0;
    cr_assert_eq(hpd_store_get_exit(s, r.id, 0, 1, &status, &err), HP_OK);
    cr_expect_eq(status, 137);
    cr_expect_eq(hpd_store_get_exit(s, r.id, 1, 1, &status, &err), HP_NOT_FOUND);
    cr_expect_eq(hpd_store_commit(s, &err), HP_INVALID);
    hpd_store_close(s);
}

static bool count_metrics(void *ctx, int64_t step, int rank, const uint8_t *rec, size_t len) {
    (*(int64_t *)ctx)++;
    return true;
}

static bool max_state(void *ctx, const hpd_store_row *row) {
    int *n = ctx;
    n[0]++;
    if (row->state > n[1]) n[1] = row->state;
    /* each job is inserted then moved 1→2→3 in single transactions: never half-written */
    cr_expect(row->state >= 1 && row->state <= 3);
    return true;
}

/* A child inserts and transitions jobs as fast as it can and reports each commit through a
 * pipe; the parent SIGKILLs it mid-stream. Every job it reported committed must be there. */
Test(store, sigkill_durability) {
    for (int round = 0; round < 5; round++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            hpd_store *s;
            if (hpd_store_open(path, &s, NULL) != HP_OK) _exit(2);
            for (;;) {
                hpd_store_row r;
                if (insert(s, "k", &r) != HP_OK) _exit(3);
                if (hpd_store_transition(s, r.id, 1, 2, "a", 0, 0, "", NULL) != HP_OK) _exit(4);
                if (hpd_store_transition(s, r.id, 2, 3, "b", 0, 0, "", NULL) != HP_OK) _exit(5);
                char c = 1;
                if (write(fds[1], &c, 1) != 1) _exit(6);
            }
        }
        close(fds[1]);
        int reported = 0;
        char c;
        while (reported < 20 + round * 13 && read(fds[0], &c, 1) == 1) reported++;
        kill(pid, SIGKILL);
        int ws;
        waitpid(pid, &ws, 0);
        cr_assert(WIFSIGNALED(ws), "child exited %d before the kill", WEXITSTATUS(ws));
        while (read(fds[0], &c, 1) == 1) reported++;
        close(fds[0]);

        hpd_store *s;
        hp_err err = {0};
        cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "%s", err.msg);
        static int total_reported = 0;
        total_reported += reported;
        int n[2] = {0, 0};
        cr_assert_eq(hpd_store_each_job(s, max_state, n, &err), HP_OK);
        cr_expect_geq(n[0], total_reported, "round %d: %d jobs stored, %d reported", round, n[0],
                      total_reported);
        total_reported = n[0];
        hpd_store_close(s);
    }
}

/* Every hp_malloc the store makes failing in turn: an error (never a crash or leak), and the
 * store usable afterwards. */
Test(store, alloc_fault_loop) {
    hpd_store *s;
    hp_err err = {0};
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK);
    hpd_store_row r;
    cr_assert_eq(insert(s, "f", &r), HP_OK);
    hpd_store_close(s);
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hpd_store *t = NULL;
        hp_status st = hpd_store_open(path, &t, &err);
        hpd_store_row g;
        if (st == HP_OK) {
            st = hpd_store_get(t, r.id, &g, &err);
            if (st == HP_OK) hpd_store_row_fini(&g);
        }
        hpd_store_close(t);
        long made = hp_alloc_fail_at(-1);
        if (st == HP_OK) break;
        cr_expect_eq(st, HP_NOMEM, "n=%ld: %s", n, err.msg);
        cr_assert(n < 100 && made >= 0);
    }
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK);
    hpd_store_row g;
    cr_assert_eq(hpd_store_get(s, r.id, &g, &err), HP_OK);
    hpd_store_row_fini(&g);
    hpd_store_close(s);
}

Test(store, bad_path) {
    hpd_store *s;
    hp_err err = {0};
    cr_expect_eq(hpd_store_open("/nonexistent-dir/x/hpd.db", &s, &err), HP_IO);
    cr_expect(strstr(err.msg, "/nonexistent-dir/x/hpd.db"), "%s", err.msg);
    cr_expect_null(s);
}

/* A transition inside an ingest batch is committed when the call returns: another connection
 * sees it (and the metrics before it) while the batch is still open. */
Test(store, transition_in_batch_is_durable) {
    hpd_store *s, *o;
    hp_err err = {0};
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK);
    hpd_store_row r;
    cr_assert_eq(insert(s, "b", &r), HP_OK);
    cr_assert_eq(hpd_store_begin(s, &err), HP_OK);
    int64_t v = 1;
    cr_assert_eq(hpd_store_add_metrics(s, r.id, 1, 0, (uint8_t *)&v, 8, &err), HP_OK);
    cr_assert_eq(hpd_store_transition(s, r.id, 1, 2, "in batch", 1, 0, "", &err), HP_OK, "%s",
                 err.msg);
    cr_assert_eq(hpd_store_add_metrics(s, r.id, 2, 0, (uint8_t *)&v, 8, &err), HP_OK);
    cr_assert_eq(hpd_store_open(path, &o, &err), HP_OK);
    hpd_store_row g;
    cr_assert_eq(hpd_store_get(o, r.id, &g, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(g.state, 2, "the transition is visible before the batch commits");
    hpd_store_row_fini(&g);
    hpd_store_close(o);
    cr_assert_eq(hpd_store_commit(s, &err), HP_OK, "%s", err.msg);
    int64_t sum = 0;
    cr_assert_eq(hpd_store_open(path, &o, &err), HP_OK);
    cr_assert_eq(hpd_store_each_metrics(o, r.id, 0, count_metrics, &sum, &err), HP_OK);
    cr_expect_eq(sum, 2);
    hpd_store_close(o);
    hpd_store_close(s);
}

/* ---- a full disk under the store: a pass-through SQLite VFS that fails the Nth write, sync or
 * truncate of any file with SQLITE_FULL (what SQLite reports for ENOSPC) ------------------------
 */

static sqlite3_vfs full_vfs, *real_vfs;
static long full_calls, full_at = -1; /* fail call full_at and every later one; -1 never */

typedef struct full_file {
    sqlite3_file base;
    sqlite3_file *real; /* real_vfs's file, right after this struct */
} full_file;

static bool full_now(void) {
    return full_at >= 0 && full_calls++ >= full_at;
}
static int ff_close(sqlite3_file *f) {
    full_file *p = (full_file *)f;
    return p->real->pMethods ? p->real->pMethods->xClose(p->real) : SQLITE_OK;
}
static int ff_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) {
    return ((full_file *)f)->real->pMethods->xRead(((full_file *)f)->real, b, n, o);
}
static int ff_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
    full_calls += full_at < 0; /* counting a clean run */
    if (full_now()) return SQLITE_FULL;
    return ((full_file *)f)->real->pMethods->xWrite(((full_file *)f)->real, b, n, o);
}
static int ff_truncate(sqlite3_file *f, sqlite3_int64 n) {
    full_calls += full_at < 0;
    if (full_now()) return SQLITE_FULL;
    return ((full_file *)f)->real->pMethods->xTruncate(((full_file *)f)->real, n);
}
static int ff_sync(sqlite3_file *f, int fl) {
    full_calls += full_at < 0;
    if (full_now()) return SQLITE_FULL;
    return ((full_file *)f)->real->pMethods->xSync(((full_file *)f)->real, fl);
}
#define FF_PASS(name, sig, args)                                                                   \
    static int ff_##name sig {                                                                     \
        full_file *p = (full_file *)f;                                                             \
        return p->real->pMethods->x##name args;                                                    \
    }
FF_PASS(FileSize, (sqlite3_file * f, sqlite3_int64 *s), (p->real, s))
FF_PASS(Lock, (sqlite3_file * f, int l), (p->real, l))
FF_PASS(Unlock, (sqlite3_file * f, int l), (p->real, l))
FF_PASS(CheckReservedLock, (sqlite3_file * f, int *r), (p->real, r))
FF_PASS(FileControl, (sqlite3_file * f, int op, void *a), (p->real, op, a))
FF_PASS(SectorSize, (sqlite3_file * f), (p->real))
FF_PASS(DeviceCharacteristics, (sqlite3_file * f), (p->real))
FF_PASS(ShmMap, (sqlite3_file * f, int i, int sz, int e, void volatile **pp),
        (p->real, i, sz, e, pp))
FF_PASS(ShmLock, (sqlite3_file * f, int o, int n, int fl), (p->real, o, n, fl))
FF_PASS(ShmUnmap, (sqlite3_file * f, int d), (p->real, d))
static void ff_ShmBarrier(sqlite3_file *f) {
    full_file *p = (full_file *)f;
    p->real->pMethods->xShmBarrier(p->real);
}

static const sqlite3_io_methods full_methods = {
    .iVersion = 2,
    .xClose = ff_close,
    .xRead = ff_read,
    .xWrite = ff_write,
    .xTruncate = ff_truncate,
    .xSync = ff_sync,
    .xFileSize = ff_FileSize,
    .xLock = ff_Lock,
    .xUnlock = ff_Unlock,
    .xCheckReservedLock = ff_CheckReservedLock,
    .xFileControl = ff_FileControl,
    .xSectorSize = ff_SectorSize,
    .xDeviceCharacteristics = ff_DeviceCharacteristics,
    .xShmMap = ff_ShmMap,
    .xShmLock = ff_ShmLock,
    .xShmBarrier = ff_ShmBarrier,
    .xShmUnmap = ff_ShmUnmap,
};

static int full_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    (void)v;
    full_file *p = (full_file *)f;
    p->real = (sqlite3_file *)(p + 1);
    int rc = real_vfs->xOpen(real_vfs, name, p->real, flags, out);
    p->base.pMethods = rc == SQLITE_OK ? &full_methods : NULL;
    return rc;
}

/* Makes the shim the default VFS (hpd_store_open passes none). Idempotent. */
static void full_vfs_install(void) {
    if (real_vfs) return;
    real_vfs = sqlite3_vfs_find(NULL);
    full_vfs = *real_vfs;
    full_vfs.zName = "hp-test-full";
    full_vfs.szOsFile = (int)sizeof(full_file) + real_vfs->szOsFile;
    full_vfs.xOpen = full_open;
    cr_assert_eq(sqlite3_vfs_register(&full_vfs, 1), SQLITE_OK);
}

static void expect_job(hpd_store *s, const char *id, const char *name) {
    hpd_store_row r;
    hp_err err = {0};
    cr_assert_eq(hpd_store_get(s, id, &r, &err), HP_OK, "%s: %s", id, err.msg);
    cr_expect_str_eq(r.name, name);
    cr_expect_eq(r.job_len, 5);
    cr_expect_eq(r.total_steps, 100);
    hpd_store_row_fini(&r);
}

/* Every write, sync and truncate of inserting a job fails in turn, the disk full from there on:
 * the insert is HP_NOSPACE naming the database file, the store keeps reading (the jobs it had
 * are there), and after a reopen on a disk with room every earlier job is there as it was, the
 * refused one is absent or whole, and a new insert works. */
Test(store, disk_full_fault_loop) {
    full_vfs_install();
    hpd_store *s;
    hp_err err = {0};
    hpd_store_row r;
    cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(insert(s, "first", &r), HP_OK);
    full_at = -1;
    full_calls = 0;
    cr_assert_eq(insert(s, "counted", &r), HP_OK);
    long calls = full_calls;
    cr_assert_gt(calls, 0, "an insert wrote nothing");
    hpd_store_close(s);
    for (long i = 0; i < calls; i++) {
        cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "%s", err.msg);
        full_calls = 0;
        full_at = i;
        memset(&r, 0, sizeof r);
        snprintf(r.name, sizeof r.name, "refused");
        r.state = 1;
        static uint8_t blob[] = {1, 2, 3, 0, 5};
        r.job = blob;
        r.job_len = sizeof blob;
        r.world = 2;
        r.total_steps = 100;
        hp_status st = hpd_store_insert(s, &r, &err);
        if (st == HP_OK) { /* the fault hit after the commit (a WAL checkpoint): it stays in */
            full_at = -1;
            hpd_store_close(s);
            continue;
        }
        cr_expect_eq(st, HP_NOSPACE, "fault %ld of %ld: %s: %s", i, calls, hp_status_name(st),
                     err.msg);
        cr_expect(strstr(err.msg, path), "fault %ld: the error names no file: %s", i, err.msg);
        expect_job(s, "j-000001", "first"); /* still serving reads */
        expect_job(s, "j-000002", "counted");
        full_at = -1;
        hpd_store_close(s);
        cr_assert_eq(hpd_store_open(path, &s, &err), HP_OK, "reopen after fault %ld: %s", i,
                     err.msg);
        expect_job(s, "j-000001", "first");
        expect_job(s, "j-000002", "counted");
        cr_assert_eq(insert(s, "after", &r), HP_OK, "insert after fault %ld", i);
        expect_job(s, r.id, "after");
        hpd_store_close(s);
    }
}
