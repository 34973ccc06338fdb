/* tests/worker/ckpt_fixture.h — shared by the checkpoint tests (header-only, test code): a
 * temporary directory per test, a small 4-tensor model with its FSDP row-range shards,
 * writing a world of ranks, reading every part back as another world, and byte-level file
 * surgery (copy, replace, patch) for the corruption tests.
 */
#ifndef HP_TEST_CKPT_FIXTURE_H
#define HP_TEST_CKPT_FIXTURE_H

#include "hp/checkpoint.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tmpdir[64];

static inline void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_ckpt_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static inline void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static inline char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *tpath(const char *fmt, ...) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    int n = snprintf(p, 256, "%s/", tmpdir);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p + n, (size_t)(256 - n), fmt, ap);
    va_end(ap);
    return p;
}

/* ---- a small model: full tensors and their row-range shards ---------------------------------- */

#define N_T 4
typedef struct model {
    const char *fqn[N_T];
    int rank[N_T];
    int64_t shape[N_T][2];
    float *p[N_T], *m[N_T], *v[N_T]; /* full tensors */
} model;

static inline int64_t rows_of(const model *md, int i) {
    return md->rank[i] ? md->shape[i][0] : 1;
}

static inline int64_t row_len(const model *md, int i) {
    return md->rank[i] == 2 ? md->shape[i][1] : 1;
}

static inline void model_init(model *md, float salt) {
    *md = (model){.fqn = {"layers.0.attention.wq.weight", "norm.weight", "tok_embeddings.weight",
                          "temperature"},
                  .rank = {2, 1, 2, 0},
                  .shape = {{7, 4}, {5, 0}, {2, 3}, {0, 0}}};
    for (int i = 0; i < N_T; i++) {
        int64_t n = rows_of(md, i) * row_len(md, i);
        md->p[i] = malloc((size_t)n * 4);
        md->m[i] = malloc((size_t)n * 4);
        md->v[i] = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) {
            md->p[i][k] = salt + (float)(i * 100 + k) * 0.37f;
            md->m[i][k] = -(float)k / 7.0f;
            md->v[i][k] = (float)(k * k) + 0.5f;
        }
    }
}

static inline void model_fini(model *md) {
    for (int i = 0; i < N_T; i++) {
        free(md->p[i]);
        free(md->m[i]);
        free(md->v[i]);
    }
}

/* Rank r of `world`'s shards (FSDP chunking: ceil(rows / world) rows per rank, the last ones
 * shorter or empty); the rank-0 tensor is replicated on every rank. */
static inline int shards_of(const model *md, int r, int world, hp_ckpt_shard *out) {
    for (int i = 0; i < N_T; i++) {
        int64_t rows = rows_of(md, i), chunk = (rows + world - 1) / world;
        int64_t s = r * chunk < rows ? r * chunk : rows, e = s + chunk < rows ? s + chunk : rows;
        if (md->rank[i] == 0) s = 0, e = 1;
        int64_t off = s * row_len(md, i);
        out[i] = (hp_ckpt_shard){.fqn = md->fqn[i],
                                 .dtype = HP_F32,
                                 .rank = md->rank[i],
                                 .shape = {md->shape[i][0], md->shape[i][1]},
                                 .off = {s},
                                 .len = {e - s, row_len(md, i)},
                                 .param = md->p[i] + off,
                                 .state_dtype = HP_F32,
                                 .exp_avg = md->m[i] + off,
                                 .exp_avg_sq = md->v[i] + off};
    }
    return N_T;
}

static inline hp_ckpt_scalars scalars(int64_t step) {
    return (hp_ckpt_scalars){.step = step,
                             .seed = 0xfedcba9876543210ull,
                             .rng_offset = 3,
                             .data_step = step,
                             .data_fingerprint = 0x8000000000000001ull,
                             .loss_scale = 0.1};
}

static inline void write_world(const char *dir, const model *md, int64_t step, int world,
                               int keep) {
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(step);
    hp_err err;
    for (int r = 0; r < world; r++) {
        int n = shards_of(md, r, world, sh);
        cr_assert_eq(hp_ckpt_write_rank(dir, r, world, &sc, sh, n, &err), HP_OK, "%s", err.msg);
    }
    cr_assert_eq(hp_ckpt_commit(dir, step, world, keep, &err), HP_OK, "%s", err.msg);
}

/* Reads rows [s, e) of fqn (the dim-0 box, other dims whole) into buf. */
static inline hp_status read_rows(const hp_ckpt *c, const char *fqn, hp_ckpt_part part, int64_t s,
                                  int64_t e, void *buf, size_t bytes, hp_err *err) {
    const hp_ckpt_entry *en = hp_ckpt_find(c, fqn);
    int nd = en ? en->rank : 0;
    int64_t off[HP_MAX_RANK] = {s}, len[HP_MAX_RANK] = {e - s};
    for (int d = 1; d < nd; d++) len[d] = en->shape[d];
    return hp_ckpt_read_box(c, fqn, part, nd, off, len, NULL, buf, bytes, err);
}

/* Reads every tensor part back as `world` ranks would and compares with the full tensors. */
static inline void check_read_as(const hp_ckpt *c, const model *md, int world) {
    hp_err err;
    for (int i = 0; i < N_T; i++) {
        int64_t rows = rows_of(md, i), chunk = (rows + world - 1) / world, rl = row_len(md, i);
        for (int part = 0; part < 3; part++) {
            const float *full = part == 0 ? md->p[i] : part == 1 ? md->m[i] : md->v[i];
            for (int r = 0; r < world; r++) {
                int64_t s = r * chunk < rows ? r * chunk : rows;
                int64_t e = s + chunk < rows ? s + chunk : rows;
                if (md->rank[i] == 0) s = 0, e = 1; /* a scalar is one element on every rank */
                float buf[64];
                cr_assert_eq(read_rows(c, md->fqn[i], (hp_ckpt_part)part, s, e, buf,
                                       (size_t)((e - s) * rl) * 4, &err),
                             HP_OK, "%s", err.msg);
                cr_assert_eq(memcmp(buf, full + s * rl, (size_t)((e - s) * rl) * 4), 0,
                             "%s part %d rank %d of %d", md->fqn[i], part, r, world);
            }
        }
    }
}

/* Copies src to dst byte for byte. */
static inline void copy_file(const char *src, const char *dst) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    cr_assert_eq(system(cmd), 0);
}

static inline void expect_open_fails(hp_status want, const char *n1, const char *n2) {
    hp_ckpt *c = (hp_ckpt *)1;
    hp_err err = {0};
    hp_status s = hp_ckpt_open(tmpdir, 7, &c, &err);
    cr_expect_eq(s, want, "status %s, want %s: %s", hp_status_str(s), hp_status_str(want), err.msg);
    cr_expect_null(c);
    if (n1) cr_expect(strstr(err.msg, n1), "message '%s' lacks '%s'", err.msg, n1);
    if (n2) cr_expect(strstr(err.msg, n2), "message '%s' lacks '%s'", err.msg, n2);
}

static inline void replace_in_file(const char *path, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, from);
    cr_assert_not_null(at, "'%s' not in %s", from, path);
    char out[1 << 16];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
}

/* Overwrites the first occurrence of `from` in a (binary) file with `to` of the same length. */
static inline void patch_file(const char *path, const char *from, const char *to) {
    cr_assert_eq(strlen(from), strlen(to));
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    char *at = memmem(buf, n, from, strlen(from));
    cr_assert_not_null(at, "'%s' not in %s", from, path);
    memcpy(at, to, strlen(to));
    cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
}

#endif
