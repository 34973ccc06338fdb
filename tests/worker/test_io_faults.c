/* tests/worker/test_io_faults.c — I/O fault loops over checkpoint writes (hp_io_fail_at, the hook
 * in the one durable writer and mkdir -p of graph/base.c): a clean write of checkpoint step 8
 * by two ranks (rank files, then the index) is counted, then every one of those calls fails in
 * turn, with ENOSPC from there on (a full disk) and with a single EIO. After each fault: the
 * error names a path under the checkpoint dir and the errno text (ENOSPC: HP_NOSPACE), no
 * temporary file stays, the newest complete checkpoint is the last good one (step 4) unless the
 * fault came after step 8's index was in place, it opens and reads back bit for bit, and a
 * retry without the fault commits step 8.
 */
#include "hp/checkpoint.h"

#include <criterion/criterion.h>
#include <errno.h>
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
