/* tests/worker/test_io_faults.c — I/O fault loops (hp_io_fail_at, the hook in the one durable
 * writer, the line log and mkdir -p of graph/base.c) over every write path of a run:
 * - checkpoints: a clean write of step 8 by two ranks (rank files, then the index) is counted,
 *   then every one of those calls fails in turn, with ENOSPC from there on (a full disk) and
 *   with a single EIO. After each fault: the error names a path under the checkpoint dir and
 *   the errno text (ENOSPC: HP_NOSPACE), no temporary file stays, the newest complete
 *   checkpoint is the last good one (step 4) unless the fault came after step 8's index was in
 *   place, it opens and reads back bit for bit, and a retry without the fault commits step 8;
 * - metrics.jsonl: the open and each append fail in turn; the error names the file and the
 *   cause, every line left is a whole record (the steps before the fault, in order), the log
 *   goes on after it; a torn last line is cut off at the next open;
 * - traces: mkdir -p of the traces dir and the atomic write fail in turn; no temporary file, no
 *   half-written trace, a retry writes it.
 */
#include "hp/checkpoint.h"
#include "hp/metrics.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tmpdir[64];

static void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_iofault_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    hp_io_fail_at(-1, 0, false);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(io_faults, .init = make_tmp, .fini = rm_tmp, .timeout = 120);

/* Two tensors, [6, 3] row-sharded over the ranks and a replicated [4]; values from the step. */
#define ROWS 6
#define COLS 3
static float w_full[ROWS * COLS], b_full[4], m_full[ROWS * COLS], v_full[ROWS * COLS];

static void fill(int64_t step) {
    for (int i = 0; i < ROWS * COLS; i++) {
        w_full[i] = (float)step + 0.25f * (float)i;
        m_full[i] = -(float)i / (float)(step + 1);
        v_full[i] = (float)(i * i) + (float)step;
    }
    for (int i = 0; i < 4; i++) b_full[i] = (float)(step * 10 + i);
}

static hp_status write_step(int64_t step, hp_err *err) {
    fill(step);
    hp_ckpt_scalars sc = {.step = step, .seed = 7, .data_step = step, .loss_scale = 1};
    int world = 2, chunk = ROWS / world;
    for (int r = 0; r < world; r++) {
        int64_t off = (int64_t)r * chunk * COLS;
        hp_ckpt_shard sh[2] = {
            {.fqn = "layers.0.w",
             .dtype = HP_F32,
             .rank = 2,
             .shape = {ROWS, COLS},
             .off = {r * chunk, 0},
             .len = {chunk, COLS},
             .param = w_full + off,
             .state_dtype = HP_F32,
             .exp_avg = m_full + off,
             .exp_avg_sq = v_full + off},
            {.fqn = "norm.b",
             .dtype = HP_F32,
             .rank = 1,
             .shape = {4},
             .off = {0},
             .len = {4},
             .param = b_full,
             .state_dtype = HP_F32},
        };
        HP_TRY(hp_ckpt_write_rank(tmpdir, r, world, &sc, sh, 2, err));
    }
    return hp_ckpt_commit(tmpdir, step, world, 0, err);
}

/* The newest complete checkpoint is `want` and reads back as write_step(want) wrote it. */
static void expect_latest(int64_t want, long fault) {
    hp_err e;
    int64_t step = -1;
    cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &e), HP_OK, "fault %ld: %s", fault, e.msg);
    cr_assert_eq(step, want, "fault %ld: latest %lld", fault, (long long)step);
    hp_ckpt *c = NULL;
    cr_assert_eq(hp_ckpt_open(tmpdir, -1, &c, &e), HP_OK, "fault %ld: %s", fault, e.msg);
    fill(want);
    float w[ROWS * COLS], b[4], m[ROWS * COLS];
    int64_t off[2] = {0, 0}, len[2] = {ROWS, COLS}, boff[1] = {0}, blen[1] = {4};
    cr_assert_eq(
        hp_ckpt_read_box(c, "layers.0.w", HP_CKPT_PARAM, 2, off, len, NULL, w, sizeof w, &e), HP_OK,
        "fault %ld: %s", fault, e.msg);
    cr_assert_eq(
        hp_ckpt_read_box(c, "layers.0.w", HP_CKPT_EXP_AVG, 2, off, len, NULL, m, sizeof m, &e),
        HP_OK, "fault %ld: %s", fault, e.msg);
    cr_assert_eq(hp_ckpt_read_box(c, "norm.b", HP_CKPT_PARAM, 1, boff, blen, NULL, b, sizeof b, &e),
                 HP_OK, "fault %ld: %s", fault, e.msg);
    cr_expect_eq(memcmp(w, w_full, sizeof w), 0, "fault %ld: parameters differ", fault);
    cr_expect_eq(memcmp(m, m_full, sizeof m), 0, "fault %ld: exp_avg differs", fault);
    cr_expect_eq(memcmp(b, b_full, sizeof b), 0, "fault %ld: replicated tensor differs", fault);
    hp_ckpt_close(c);
}

static int temp_files(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.tmp.*' | grep -q .", tmpdir);
    return system(cmd) == 0;
}

static void fault_loop(int errnum, bool sticky, hp_status want) {
    hp_err e;
    cr_assert_eq(write_step(4, &e), HP_OK, "%s", e.msg);
    hp_io_fail_at(-1, 0, false);
    cr_assert_eq(write_step(8, &e), HP_OK, "%s", e.msg);
    long calls = hp_io_fail_at(-1, 0, false);
    cr_assert_gt(calls, 10, "a checkpoint write made only %ld counted calls", calls);
    expect_latest(8, -1);
    for (long i = 0; i < calls; i++) {
        /* back to "step 4 is the newest": drop step 8 */
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'/step-*8", tmpdir);
        cr_assert_eq(system(cmd), 0);
        expect_latest(4, i);
        hp_io_fail_at(i, errnum, sticky);
        hp_status s = write_step(8, &e);
        hp_io_fail_at(-1, 0, false);
        cr_assert_eq(s, want, "fault %ld of %ld (%s): %s: %s", i, calls, strerror(errnum),
                     hp_status_name(s), e.msg);
        cr_expect(strstr(e.msg, tmpdir) && strstr(e.msg, strerror(errnum)),
                  "fault %ld: the error names no path or cause: %s", i, e.msg);
        cr_expect(!temp_files(), "fault %ld left a temporary file", i);
        /* the index is the last write: only a fault after its rename (opening or fsyncing
         * the directory, the last two calls) can leave step 8 complete */
        int64_t step = -1;
        cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &e), HP_OK, "%s", e.msg);
        cr_expect(step == 4 || i >= calls - 2, "fault %ld of %ld: step %lld complete", i, calls,
                  (long long)step);
        expect_latest(step, i);
        cr_assert_eq(write_step(8, &e), HP_OK, "retry after fault %ld: %s", i, e.msg);
        expect_latest(8, i);
    }
}

Test(io_faults, checkpoint_every_fault_point_disk_full) {
    fault_loop(ENOSPC, true, HP_NOSPACE);
}

Test(io_faults, checkpoint_every_fault_point_one_io_error) {
    fault_loop(EIO, false, HP_IO);
}

/* ---- metrics.jsonl (hp_file_log_open / hp_file_log_append) ----------------------------------- */

static hp_status log_line(int fd, const char *path, int64_t step, hp_err *err) {
    hp_metrics m = {.step = step, .steps = 1, .tokens = 64, .loss = 1.0 / (double)step};
    char json[4096];
    HP_TRY(hp_metrics_to_json(&m, json, sizeof json - 1, err));
    size_t n = strlen(json);
    json[n++] = '\n';
    return hp_file_log_append(fd, path, json, n, err);
}

/* Rewrites path with the records of steps 1..n. */
static void log_fresh(const char *path, int n) {
    hp_err e;
    int fd;
    cr_assert_eq(hp_file_log_open(path, true, &fd, &e), HP_OK, "%s", e.msg);
    for (int s = 1; s <= n; s++) cr_assert_eq(log_line(fd, path, s, &e), HP_OK, "%s", e.msg);
    close(fd);
}

/* Every line of path is a whole record, the steps 1..k in order; returns k. */
static int log_check(const char *path, long fault) {
    char *text = NULL;
    size_t len = 0;
    hp_err e;
    cr_assert_eq(hp_file_read(path, 1 << 20, (uint8_t **)&text, &len, &e), HP_OK, "%s", e.msg);
    cr_expect(len == 0 || text[len - 1] == '\n', "fault %ld: %s ends in a half line", fault, path);
    int k = 0;
    for (char *line = text, *nl; line < text + len && (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        hp_metrics m;
        cr_expect_eq(hp_metrics_from_json(line, &m, &e), HP_OK, "fault %ld: line %d: %s", fault,
                     k + 1, e.msg);
        cr_expect_eq(m.step, k + 1, "fault %ld: line %d is step %lld", fault, k + 1,
                     (long long)m.step);
        k++;
    }
    hp_free(text);
    return k;
}

static void metrics_fault_loop(int errnum, bool sticky, hp_status want) {
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tmpdir);
    hp_err e;
    log_fresh(path, 2);
    hp_io_fail_at(-1, 0, false);
    int fd;
    cr_assert_eq(hp_file_log_open(path, false, &fd, &e), HP_OK, "%s", e.msg);
    for (int s = 3; s <= 5; s++) cr_assert_eq(log_line(fd, path, s, &e), HP_OK, "%s", e.msg);
    close(fd);
    long calls = hp_io_fail_at(-1, 0, false);
    cr_assert_eq(calls, 4, "open + 3 appends made %ld counted calls", calls);
    cr_assert_eq(log_check(path, -1), 5);
    for (long i = 0; i < calls; i++) {
        log_fresh(path, 2);
        hp_io_fail_at(i, errnum, sticky);
        hp_status s = hp_file_log_open(path, false, &fd, &e);
        for (int step = 3; s == HP_OK && step <= 5; step++) s = log_line(fd, path, step, &e);
        hp_io_fail_at(-1, 0, false);
        if (fd >= 0) close(fd);
        cr_assert_eq(s, want, "fault %ld of %ld (%s): %s: %s", i, calls, strerror(errnum),
                     hp_status_name(s), e.msg);
        cr_expect(strstr(e.msg, path) && strstr(e.msg, strerror(errnum)),
                  "fault %ld: the error names no path or cause: %s", i, e.msg);
        /* whole records only: the two before, and those appended before the fault */
        int k = log_check(path, i);
        cr_expect(k == 2 + (i > 0 ? (int)i - 1 : 0), "fault %ld: %d records", i, k);
        /* and the log goes on after it */
        cr_assert_eq(hp_file_log_open(path, false, &fd, &e), HP_OK, "%s", e.msg);
        cr_assert_eq(log_line(fd, path, k + 1, &e), HP_OK, "retry after fault %ld: %s", i, e.msg);
        close(fd);
        cr_expect_eq(log_check(path, i), k + 1, "fault %ld: the retried record", i);
    }
}

Test(io_faults, metrics_log_every_fault_point_disk_full) {
    metrics_fault_loop(ENOSPC, true, HP_NOSPACE);
}

Test(io_faults, metrics_log_every_fault_point_one_io_error) {
    metrics_fault_loop(EIO, false, HP_IO);
}

/* A line cut short (a crash or a full disk mid-write): the next open cuts it off, so no half
 * record is ever read back as one. */
Test(io_faults, metrics_log_torn_line_cut_on_open) {
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tmpdir);
    log_fresh(path, 3);
    int raw = open(path, O_WRONLY | O_APPEND);
    cr_assert_geq(raw, 0);
    const char half[] = "{\"step\":4,\"rank\":0,\"steps\":1,\"tok";
    cr_assert_eq(write(raw, half, sizeof half - 1), (ssize_t)(sizeof half - 1));
    close(raw);
    hp_err e;
    int fd;
    cr_assert_eq(hp_file_log_open(path, false, &fd, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(log_line(fd, path, 4, &e), HP_OK, "%s", e.msg);
    close(fd);
    cr_expect_eq(log_check(path, -1), 4, "the torn step 4 replaced by the whole one");
    /* a line without its newline is refused, never half appended */
    cr_assert_eq(hp_file_log_open(path, false, &fd, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(hp_file_log_append(fd, path, "{}", 2, &e), HP_INVALID);
    close(fd);
    /* a path that is not a regular file is refused */
    cr_expect_eq(hp_file_log_open(tmpdir, false, &fd, &e), HP_IO);
    cr_expect(strstr(e.msg, tmpdir), "%s", e.msg);
}

/* ---- traces (the worker's OUT/traces/step-S-rank-R.json, hpd's state/jobs/ID/traces/...) ------
 */

static hp_status write_trace(const char *dir, const char *path, const char *json, hp_err *err) {
    HP_TRY(hp_mkdir_p(dir, err)); /* what worker/train.c and daemon/traces.c do */
    return hp_file_write_atomic(path, json, strlen(json), err);
}

static void trace_fault_loop(int errnum, bool sticky, hp_status want) {
    char dir[128], path[192], cmd[192];
    snprintf(dir, sizeof dir, "%s/run/traces", tmpdir);
    snprintf(path, sizeof path, "%s/step-3-rank-0.json", dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/run'", tmpdir);
    const char *json = "{\"traceEvents\":[{\"name\":\"mm\",\"ph\":\"X\",\"ts\":1,\"dur\":2}]}";
    hp_err e;
    hp_io_fail_at(-1, 0, false);
    cr_assert_eq(write_trace(dir, path, json, &e), HP_OK, "%s", e.msg);
    long calls = hp_io_fail_at(-1, 0, false);
    cr_assert_gt(calls, 6, "a trace write made only %ld counted calls", calls);
    for (long i = 0; i < calls; i++) {
        cr_assert_eq(system(cmd), 0);
        hp_io_fail_at(i, errnum, sticky);
        hp_status s = write_trace(dir, path, json, &e);
        hp_io_fail_at(-1, 0, false);
        cr_assert_eq(s, want, "fault %ld of %ld: %s: %s", i, calls, hp_status_name(s), e.msg);
        cr_expect(strstr(e.msg, tmpdir) && strstr(e.msg, strerror(errnum)),
                  "fault %ld: the error names no path or cause: %s", i, e.msg);
        cr_expect(!temp_files(), "fault %ld left a temporary file", i);
        /* absent, or (a fault after the rename: the directory's fsync) whole */
        uint8_t *got = NULL;
        size_t len = 0;
        if (hp_file_read(path, 1 << 20, &got, &len, NULL) != HP_OK) got = NULL;
        cr_expect(!got || (len == strlen(json) && memcmp(got, json, len) == 0),
                  "fault %ld: a half-written trace: %s", i, got ? (char *)got : "");
        cr_expect(!got || i >= calls - 2, "fault %ld of %ld: the trace is in place", i, calls);
        hp_free(got);
        cr_assert_eq(write_trace(dir, path, json, &e), HP_OK, "retry after fault %ld: %s", i,
                     e.msg);
    }
}

Test(io_faults, trace_every_fault_point_disk_full) {
    trace_fault_loop(ENOSPC, true, HP_NOSPACE);
}

Test(io_faults, trace_every_fault_point_one_io_error) {
    trace_fault_loop(EIO, false, HP_IO);
}
