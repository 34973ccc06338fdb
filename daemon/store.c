/* daemon/store.c — the job store on SQLite (see store.h for the durability argument). Every
 * statement is prepared once at open, from the table below; every failure names the
 * statement and SQLite's message. */
#include "daemon/store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL,"
    " state INTEGER NOT NULL, job BLOB NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,"
    " world INTEGER NOT NULL, step INTEGER NOT NULL, total_steps INTEGER NOT NULL,"
    " restarts INTEGER NOT NULL, error TEXT NOT NULL, run_dir TEXT NOT NULL,"
    " request_id TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS jobs_request ON jobs(request_id) WHERE request_id != '';"
    "CREATE TABLE IF NOT EXISTS transitions("
    " job_id TEXT NOT NULL, seq INTEGER NOT NULL, from_state INTEGER NOT NULL,"
    " to_state INTEGER NOT NULL, time REAL NOT NULL, reason TEXT NOT NULL,"
    " PRIMARY KEY(job_id, seq));"
    "CREATE TABLE IF NOT EXISTS metrics("
    " job_id TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, record BLOB NOT NULL,"
    " PRIMARY KEY(job_id, step, rank));"
    "CREATE TABLE IF NOT EXISTS worker_exits("
    " job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " status INTEGER NOT NULL, PRIMARY KEY(job_id, attempt, rank));"
    "CREATE TABLE IF NOT EXISTS launches("
    " job_id TEXT NOT NULL, attempt INTEGER NOT NULL, launcher TEXT NOT NULL, ref TEXT NOT NULL,"
    " PRIMARY KEY(job_id, attempt));";

#define JOB_COLS                                                                                   \
    "id, name, state, job, created, updated, world, step, total_steps, restarts, error, "          \
    "run_dir, request_id"

/* X(name, sql) */
#define STMTS(X)                                                                                   \
    X(BEGIN, "BEGIN IMMEDIATE")                                                                    \
    X(COMMIT, "COMMIT")                                                                            \
    X(ROLLBACK, "ROLLBACK")                                                                        \
    X(NEXT_SEQ, "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs")                                      \
    X(INSERT, "INSERT INTO jobs(" JOB_COLS ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)")                  \
    X(GET, "SELECT " JOB_COLS " FROM jobs WHERE id = ?")                                           \
    X(FIND_REQ, "SELECT " JOB_COLS " FROM jobs WHERE request_id = ? AND request_id != ''")         \
    X(EACH, "SELECT " JOB_COLS " FROM jobs ORDER BY seq")                                          \
    X(STATE_OF, "SELECT state FROM jobs WHERE id = ?")                                             \
    X(UPDATE, "UPDATE jobs SET state = ?, step = ?, restarts = ?, error = ?, updated = ? "         \
              "WHERE id = ?")                                                                      \
    X(SET_STEP, "UPDATE jobs SET step = MAX(step, ?), updated = ? WHERE id = ?")                   \
    X(ADD_TRANS, "INSERT INTO transitions(job_id, seq, from_state, to_state, time, reason) "       \
                 "VALUES(?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM transitions "                  \
                 "WHERE job_id = ?1), ?2, ?3, ?4, ?5)")                                            \
    X(EACH_TRANS, "SELECT seq, from_state, to_state, time, reason FROM transitions "               \
                  "WHERE job_id = ? ORDER BY seq")                                                 \
    X(ADD_METRICS, "INSERT OR REPLACE INTO metrics(job_id, step, rank, record) VALUES(?,?,?,?)")   \
    X(EACH_METRICS, "SELECT step, rank, record FROM metrics WHERE job_id = ? AND step >= ? "       \
                    "ORDER BY step, rank")                                                         \
    X(METRICS_HIGH, "SELECT rank, MAX(step) FROM metrics WHERE job_id = ? GROUP BY rank")          \
    X(ADD_EXIT, "INSERT OR REPLACE INTO worker_exits(job_id, attempt, rank, status) "              \
                "VALUES(?,?,?,?)")                                                                 \
    X(GET_EXIT, "SELECT status FROM worker_exits WHERE job_id = ? AND attempt = ? AND rank = ?")   \
    X(SET_LAUNCH, "INSERT OR REPLACE INTO launches(job_id, attempt, launcher, ref) "               \
                  "VALUES(?,?,?,?)")                                                               \
    X(GET_LAUNCH, "SELECT attempt, launcher, ref FROM launches WHERE job_id = ? "                  \
                  "ORDER BY attempt DESC LIMIT 1")

enum {
#define X(name, sql) ST_##name,
    STMTS(X)
#undef X
        ST_COUNT
};

static const char *const stmt_sql[] = {
#define X(name, sql) sql,
    STMTS(X)
#undef X
};
static const char *const stmt_name[] = {
#define X(name, sql) #name,
    STMTS(X)
#undef X
};

struct hpd_store {
    sqlite3 *db;
    char path[4096]; /* for errors: a full disk names the file */
    sqlite3_stmt *st[ST_COUNT];
    int in_batch; /* hpd_store_begin..commit nesting: writes join the open transaction */
    bool batch_broken;
};

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* SQLITE_FULL (a full disk or quota, or the page limit) is HP_NOSPACE naming the database
 * file, which hpd answers with RESOURCE_EXHAUSTED: the request was fine, there is no room. */
static hp_status db_err(hpd_store *s, int st, const char *what, hp_err *err) {
    const char *msg = s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(st);
    if ((st & 0xff) == SQLITE_FULL)
        return hp_errf(err, HP_NOSPACE, "store: %s: %s: %s", s->path, what, msg);
    return hp_errf(err, st == SQLITE_NOMEM ? HP_NOMEM : HP_IO, "store: %s: %s", what, msg);
}

/* Resets a statement after use (bindings cleared), so that it holds no read lock. */
static void done(sqlite3_stmt *q) {
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
}

static hp_status step_done(hpd_store *s, int which, hp_err *err) {
    int rc = sqlite3_step(s->st[which]);
    done(s->st[which]);
    if (rc != SQLITE_DONE) return db_err(s, rc, stmt_name[which], err);
    return HP_OK;
}

/* A transaction of its own for a write that must be durable when the call returns (a job, a
 * transition). Inside a batch (hpd_store_begin) the batch so far is committed first and a new
 * batch transaction opened after, so that a transition is never held back by a batch. */
static hp_status tx_begin(hpd_store *s, hp_err *err) {
    if (s->in_batch) HP_TRY(step_done(s, ST_COMMIT, err));
    hp_status st = step_done(s, ST_BEGIN, err);
    if (st != HP_OK && s->in_batch) (void)step_done(s, ST_BEGIN, NULL); /* the batch goes on */
    return st;
}

static hp_status tx_end(hpd_store *s, hp_status st, hp_err *err) {
    if (st == HP_OK) st = step_done(s, ST_COMMIT, err);
    if (st != HP_OK && !sqlite3_get_autocommit(s->db)) {
        sqlite3_step(s->st[ST_ROLLBACK]);
        done(s->st[ST_ROLLBACK]);
    }
    if (s->in_batch) {
        hp_err e2 = {0};
        if (step_done(s, ST_BEGIN, &e2) != HP_OK && st == HP_OK) {
            /* The durable write is in; the batch is not open any more: later batched writes
             * autocommit, and hpd_store_commit reports it. */
            s->batch_broken = true;
        }
    }
    return st;
}

/* HPD_STORE_MAX_PAGES=N caps the database at N pages (SQLite's max_page_count; at least the
 * pages it has): a write beyond it fails as on a full disk (SQLITE_FULL, HP_NOSPACE naming the
 * file). For operators who bound the store, and for the tests of a full disk on a real hpd. */
static hp_status max_pages(hpd_store *s, hp_err *err) {
    const char *env = getenv("HPD_STORE_MAX_PAGES");
    if (!env || !*env) return HP_OK;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(env, &end, 10);
    if (errno || *end || n < 1 || n > INT32_MAX)
        return hp_errf(err, HP_INVALID,
                       "HPD_STORE_MAX_PAGES '%.32s': expected a number of pages in [1, %d]", env,
                       INT32_MAX);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count=%lld;", n);
    char *msg = NULL;
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, &msg);
    hp_status st = rc == SQLITE_OK ? HP_OK
                                   : hp_errf(err, HP_IO, "store: %s: max_page_count: %s", s->path,
                                             msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return st;
}

static hp_status store_open(const char *path, bool readonly, hpd_store **out, hp_err *err) {
    *out = NULL;
    hpd_store *s = hp_calloc(1, sizeof *s);
    if (!s) return hp_errf(err, HP_NOMEM, "store: out of memory");
    snprintf(s->path, sizeof s->path, "%s", path);
    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    int rc = sqlite3_open_v2(path, &s->db, flags, NULL);
    hp_status st = HP_OK;
    if (rc != SQLITE_OK) {
        st = db_err(s, rc, "open", err);
        hp_err_prefix(err, "%s", path);
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char *msg = NULL;
    if (readonly) goto prepare; /* the writer made the schema and the journal mode */
    const char *env = getenv("HPD_STORE_SYNC_FULL");
    const char *sync =
        env && env[0] == '1' ? "PRAGMA synchronous=FULL;" : "PRAGMA synchronous=NORMAL;";
    rc = sqlite3_exec(s->db, "PRAGMA journal_mode=WAL;", NULL, NULL, &msg);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s->db, sync, NULL, NULL, &msg);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s->db, "PRAGMA foreign_keys=ON;", NULL, NULL, &msg);
    if (rc == SQLITE_OK) rc = sqlite3_exec(s->db, SCHEMA, NULL, NULL, &msg);
    if (rc == SQLITE_OK && (st = max_pages(s, err)) != HP_OK) goto fail;
    if (rc != SQLITE_OK) {
        st = hp_errf(err,
                     rc == SQLITE_NOMEM  ? HP_NOMEM
                     : rc == SQLITE_FULL ? HP_NOSPACE
                                         : HP_IO,
                     "store: %s: schema: %s", path, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        goto fail;
    }
prepare:
    for (int i = 0; i < ST_COUNT; i++) {
        rc = sqlite3_prepare_v3(s->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL);
        if (rc != SQLITE_OK) {
            st = db_err(s, rc, stmt_name[i], err);
            goto fail;
        }
    }
    *out = s;
    return HP_OK;
fail:
    hpd_store_close(s);
    return st;
}

hp_status hpd_store_open(const char *path, hpd_store **out, hp_err *err) {
    return store_open(path, false, out, err);
}

hp_status hpd_store_open_readonly(const char *path, hpd_store **out, hp_err *err) {
    return store_open(path, true, out, err);
}

void hpd_store_close(hpd_store *s) {
    if (!s) return;
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    hp_free(s);
}

void hpd_store_row_fini(hpd_store_row *r) {
    if (!r) return;
    hp_free(r->job);
    r->job = NULL;
    r->job_len = 0;
}

static void copy_text(char *dst, size_t cap, const unsigned char *src) {
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* Reads the JOB_COLS of the current row into r (r->job hp_malloc'd). */
static hp_status read_row(sqlite3_stmt *q, hpd_store_row *r, hp_err *err) {
    memset(r, 0, sizeof *r);
    copy_text(r->id, sizeof r->id, sqlite3_column_text(q, 0));
    copy_text(r->name, sizeof r->name, sqlite3_column_text(q, 1));
    r->state = sqlite3_column_int(q, 2);
    const void *blob = sqlite3_column_blob(q, 3);
    int n = sqlite3_column_bytes(q, 3);
    r->job = hp_malloc(n > 0 ? (size_t)n : 1);
    if (!r->job) return hp_errf(err, HP_NOMEM, "store: out of memory reading job %s", r->id);
    if (n > 0) memcpy(r->job, blob, (size_t)n);
    r->job_len = (size_t)n;
    r->created = sqlite3_column_double(q, 4);
    r->updated = sqlite3_column_double(q, 5);
    r->world = sqlite3_column_int(q, 6);
    r->step = sqlite3_column_int64(q, 7);
    r->total_steps = sqlite3_column_int64(q, 8);
    r->restarts = sqlite3_column_int(q, 9);
    copy_text(r->error, sizeof r->error, sqlite3_column_text(q, 10));
    copy_text(r->run_dir, sizeof r->run_dir, sqlite3_column_text(q, 11));
    copy_text(r->request_id, sizeof r->request_id, sqlite3_column_text(q, 12));
    return HP_OK;
}

static hp_status add_transition(hpd_store *s, const char *id, int from, int to, double t,
                                const char *reason, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_ADD_TRANS];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, from);
    sqlite3_bind_int(q, 3, to);
    sqlite3_bind_double(q, 4, t);
    sqlite3_bind_text(q, 5, reason ? reason : "", -1, SQLITE_STATIC);
    return step_done(s, ST_ADD_TRANS, err);
}

hp_status hpd_store_insert(hpd_store *s, hpd_store_row *r, hp_err *err) {
    HP_TRY(tx_begin(s, err));
    hp_status st = HP_OK;
    sqlite3_stmt *q = s->st[ST_NEXT_SEQ];
    int rc = sqlite3_step(q);
    int64_t seq = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0;
    done(q);
    if (rc != SQLITE_ROW) {
        st = db_err(s, rc, "NEXT_SEQ", err);
        return tx_end(s, st, err);
    }
    char id[HPD_STORE_ID_MAX];
    snprintf(id, sizeof id, "j-%06lld", (long long)seq);
    double t = r->created > 0 ? r->created : now_s();
    q = s->st[ST_INSERT];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 3, r->state);
    sqlite3_bind_blob(q, 4, r->job ? (const void *)r->job : "", (int)r->job_len, SQLITE_STATIC);
    sqlite3_bind_double(q, 5, t);
    sqlite3_bind_double(q, 6, t);
    sqlite3_bind_int(q, 7, r->world);
    sqlite3_bind_int64(q, 8, r->step);
    sqlite3_bind_int64(q, 9, r->total_steps);
    sqlite3_bind_int(q, 10, r->restarts);
    sqlite3_bind_text(q, 11, r->error, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 12, r->run_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 13, r->request_id, -1, SQLITE_STATIC);
    st = step_done(s, ST_INSERT, err);
    if (st == HP_OK) st = add_transition(s, id, 0, r->state, t, "submitted", err);
    st = tx_end(s, st, err);
    if (st == HP_OK) {
        memcpy(r->id, id, sizeof id);
        r->created = r->updated = t;
    }
    return st;
}

static hp_status get_by(hpd_store *s, int which, const char *key, hpd_store_row *out, hp_err *err) {
    sqlite3_stmt *q = s->st[which];
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    hp_status st;
    if (rc == SQLITE_ROW)
        st = read_row(q, out, err);
    else if (rc == SQLITE_DONE)
        st = hp_errf(err, HP_NOT_FOUND, "no job %s", key);
    else
        st = db_err(s, rc, stmt_name[which], err);
    done(q);
    return st;
}

hp_status hpd_store_get(hpd_store *s, const char *id, hpd_store_row *out, hp_err *err) {
    return get_by(s, ST_GET, id, out, err);
}

hp_status hpd_store_find_request(hpd_store *s, const char *request_id, hpd_store_row *out,
                                 hp_err *err) {
    return get_by(s, ST_FIND_REQ, request_id, out, err);
}

hp_status hpd_store_transition(hpd_store *s, const char *id, int from, int to, const char *reason,
                               int64_t step, int restarts, const char *error, hp_err *err) {
    HP_TRY(tx_begin(s, err));
    sqlite3_stmt *q = s->st[ST_STATE_OF];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    int cur = rc == SQLITE_ROW ? sqlite3_column_int(q, 0) : -1;
    done(q);
    hp_status st = HP_OK;
    if (rc == SQLITE_DONE)
        st = hp_errf(err, HP_NOT_FOUND, "no job %s", id);
    else if (rc != SQLITE_ROW)
        st = db_err(s, rc, "STATE_OF", err);
    else if (cur != from)
        st = hp_errf(err, HP_INVALID, "job %s: stored state %d is not %d", id, cur, from);
    double t = now_s();
    if (st == HP_OK) {
        q = s->st[ST_UPDATE];
        sqlite3_bind_int(q, 1, to);
        sqlite3_bind_int64(q, 2, step);
        sqlite3_bind_int(q, 3, restarts);
        sqlite3_bind_text(q, 4, error ? error : "", -1, SQLITE_STATIC);
        sqlite3_bind_double(q, 5, t);
        sqlite3_bind_text(q, 6, id, -1, SQLITE_STATIC);
        st = step_done(s, ST_UPDATE, err);
    }
    if (st == HP_OK) st = add_transition(s, id, from, to, t, reason, err);
    return tx_end(s, st, err);
}

hp_status hpd_store_set_step(hpd_store *s, const char *id, int64_t step, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_SET_STEP];
    sqlite3_bind_int64(q, 1, step);
    sqlite3_bind_double(q, 2, now_s());
    sqlite3_bind_text(q, 3, id, -1, SQLITE_STATIC);
    return step_done(s, ST_SET_STEP, err);
}

hp_status hpd_store_each_job(hpd_store *s, hpd_store_row_fn fn, void *ctx, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_EACH];
    hp_status st = HP_OK;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        hpd_store_row r;
        st = read_row(q, &r, err);
        bool more = st == HP_OK && fn(ctx, &r);
        hpd_store_row_fini(&r);
        if (!more) break;
    }
    if (st == HP_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) st = db_err(s, rc, "EACH", err);
    done(q);
    return st;
}

hp_status hpd_store_each_transition(hpd_store *s, const char *id, hpd_store_transition_fn fn,
                                    void *ctx, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_EACH_TRANS];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (!fn(ctx, sqlite3_column_int64(q, 0), sqlite3_column_int(q, 1), sqlite3_column_int(q, 2),
                sqlite3_column_double(q, 3), (const char *)sqlite3_column_text(q, 4)))
            break;
    }
    hp_status st = HP_OK;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) st = db_err(s, rc, "EACH_TRANS", err);
    done(q);
    return st;
}

hp_status hpd_store_add_metrics(hpd_store *s, const char *id, int64_t step, int rank,
                                const uint8_t *record, size_t len, hp_err *err) {
    if (len > (size_t)1 << 20) return hp_errf(err, HP_LIMIT, "metrics record of %zu bytes", len);
    sqlite3_stmt *q = s->st[ST_ADD_METRICS];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, step);
    sqlite3_bind_int(q, 3, rank);
    sqlite3_bind_blob(q, 4, record ? (const void *)record : "", (int)len, SQLITE_STATIC);
    return step_done(s, ST_ADD_METRICS, err);
}

hp_status hpd_store_each_metrics(hpd_store *s, const char *id, int64_t from_step,
                                 hpd_store_metrics_fn fn, void *ctx, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_EACH_METRICS];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, from_step);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (!fn(ctx, sqlite3_column_int64(q, 0), sqlite3_column_int(q, 1),
                sqlite3_column_blob(q, 2), (size_t)sqlite3_column_bytes(q, 2)))
            break;
    }
    hp_status st = HP_OK;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) st = db_err(s, rc, "EACH_METRICS", err);
    done(q);
    return st;
}

hp_status hpd_store_metrics_high(hpd_store *s, const char *id, int world, int64_t *step,
                                 hp_err *err) {
    *step = 0;
    if (world < 1) return HP_OK;
    sqlite3_stmt *q = s->st[ST_METRICS_HIGH];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc, ranks = 0;
    int64_t low = INT64_MAX;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int rank = sqlite3_column_int(q, 0);
        if (rank < 0 || rank >= world) continue; /* a rank of a wider attempt: not this world's */
        ranks++;
        int64_t high = sqlite3_column_int64(q, 1);
        if (high < low) low = high;
    }
    hp_status st = HP_OK;
    if (rc != SQLITE_DONE) st = db_err(s, rc, "METRICS_HIGH", err);
    done(q);
    if (st == HP_OK && ranks == world) *step = low;
    return st;
}

hp_status hpd_store_begin(hpd_store *s, hp_err *err) {
    if (s->in_batch++) return HP_OK;
    hp_status st = step_done(s, ST_BEGIN, err);
    if (st != HP_OK) s->in_batch = 0;
    return st;
}

hp_status hpd_store_commit(hpd_store *s, hp_err *err) {
    if (s->in_batch == 0) return hp_errf(err, HP_INVALID, "store: commit without begin");
    if (--s->in_batch) return HP_OK;
    if (s->batch_broken || sqlite3_get_autocommit(s->db)) {
        s->batch_broken = false;
        return HP_OK; /* nothing open: every write since autocommitted */
    }
    hp_status st = step_done(s, ST_COMMIT, err);
    if (st != HP_OK && !sqlite3_get_autocommit(s->db)) {
        sqlite3_step(s->st[ST_ROLLBACK]);
        done(s->st[ST_ROLLBACK]);
    }
    return st;
}

hp_status hpd_store_add_exit(hpd_store *s, const char *id, int attempt, int rank, int status,
                             hp_err *err) {
    sqlite3_stmt *q = s->st[ST_ADD_EXIT];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, attempt);
    sqlite3_bind_int(q, 3, rank);
    sqlite3_bind_int(q, 4, status);
    return step_done(s, ST_ADD_EXIT, err);
}

hp_status hpd_store_get_exit(hpd_store *s, const char *id, int attempt, int rank, int *status,
                             hp_err *err) {
    sqlite3_stmt *q = s->st[ST_GET_EXIT];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, attempt);
    sqlite3_bind_int(q, 3, rank);
    int rc = sqlite3_step(q);
    hp_status st = HP_OK;
    if (rc == SQLITE_ROW)
        *status = sqlite3_column_int(q, 0);
    else if (rc == SQLITE_DONE)
        st = hp_errf(err, HP_NOT_FOUND, "no exit recorded for %s attempt %d rank %d", id, attempt,
                     rank);
    else
        st = db_err(s, rc, "GET_EXIT", err);
    done(q);
    return st;
}

hp_status hpd_store_set_launch(hpd_store *s, const char *id, int attempt, const char *launcher,
                               const char *ref, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_SET_LAUNCH];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, attempt);
    sqlite3_bind_text(q, 3, launcher, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, ref, -1, SQLITE_STATIC);
    return step_done(s, ST_SET_LAUNCH, err);
}

hp_status hpd_store_get_launch(hpd_store *s, const char *id, int *attempt, char *launcher,
                               size_t launcher_len, char *ref, size_t ref_len, hp_err *err) {
    sqlite3_stmt *q = s->st[ST_GET_LAUNCH];
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    hp_status st = HP_OK;
    if (rc == SQLITE_ROW) {
        *attempt = sqlite3_column_int(q, 0);
        const unsigned char *l = sqlite3_column_text(q, 1), *r = sqlite3_column_text(q, 2);
        snprintf(launcher, launcher_len, "%s", l ? (const char *)l : "");
        snprintf(ref, ref_len, "%s", r ? (const char *)r : "");
    } else if (rc == SQLITE_DONE) {
        st = hp_errf(err, HP_NOT_FOUND, "no launch recorded for %s", id);
    } else {
        st = db_err(s, rc, "GET_LAUNCH", err);
    }
    done(q);
    return st;
}
