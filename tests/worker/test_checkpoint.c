/* tests/worker/test_checkpoint.c — sharded checkpoints: bit-exact round trip, resharding
 * 2 ranks -> 3 ranks (and arbitrary row ranges) equal to the unsharded tensors, interrupted
 * writes ignored by `latest`, keep-last-K pruning, corrupt and truncated files rejected with
 * errors naming the file, and the allocation fault loop.
 */
#include "hp/checkpoint.h"
#include "hp/safetensors.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_ckpt_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(checkpoint, .init = make_tmp, .fini = rm_tmp);

static char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *tpath(const char *fmt, ...) {
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

static int64_t rows_of(const model *md, int i) {
    return md->rank[i] ? md->shape[i][0] : 1;
}

static int64_t row_len(const model *md, int i) {
    return md->rank[i] == 2 ? md->shape[i][1] : 1;
}

static void model_init(model *md, float salt) {
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

static void model_fini(model *md) {
    for (int i = 0; i < N_T; i++) {
        free(md->p[i]);
        free(md->m[i]);
        free(md->v[i]);
    }
}

/* Rank r of `world`'s shards (FSDP chunking: ceil(rows / world) rows per rank, the last ones
 * shorter or empty); the rank-0 tensor is replicated on every rank. */
static int shards_of(const model *md, int r, int world, hp_ckpt_shard *out) {
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

static hp_ckpt_scalars scalars(int64_t step) {
    return (hp_ckpt_scalars){.step = step,
                             .seed = 0xfedcba9876543210ull,
                             .rng_offset = 3,
                             .data_step = step,
                             .data_fingerprint = 0x8000000000000001ull,
                             .loss_scale = 0.1};
}

static void write_world(const char *dir, const model *md, int64_t step, int world, int keep) {
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
static hp_status read_rows(const hp_ckpt *c, const char *fqn, hp_ckpt_part part, int64_t s,
                           int64_t e, void *buf, size_t bytes, hp_err *err) {
    const hp_ckpt_entry *en = hp_ckpt_find(c, fqn);
    int nd = en ? en->rank : 0;
    int64_t off[HP_MAX_RANK] = {s}, len[HP_MAX_RANK] = {e - s};
    for (int d = 1; d < nd; d++) len[d] = en->shape[d];
    return hp_ckpt_read_box(c, fqn, part, nd, off, len, NULL, buf, bytes, err);
}

/* Reads every tensor part back as `world` ranks would and compares with the full tensors. */
static void check_read_as(const hp_ckpt *c, const model *md, int world) {
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

Test(checkpoint, round_trip) {
    model md;
    model_init(&md, 1.0f);
    hp_ckpt_shard sh[N_T];
    shards_of(&md, 0, 1, sh);
    sh[1].exp_avg = sh[1].exp_avg_sq = NULL; /* a tensor without optimizer state */
    hp_ckpt_scalars sc = scalars(10);
    hp_err err;
    cr_assert_eq(hp_ckpt_save(tmpdir, &sc, sh, N_T, 0, &err), HP_OK, "%s", err.msg);
    int64_t step = -1;
    cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(step, 10);

    hp_ckpt *c;
    cr_assert_eq(hp_ckpt_open(tmpdir, -1, &c, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_step(c), 10);
    cr_expect_eq(hp_ckpt_world(c), 1);
    const hp_ckpt_scalars *got = hp_ckpt_get_scalars(c);
    cr_expect(got->step == 10 && got->seed == sc.seed && got->rng_offset == 3 &&
              got->data_step == 10 && got->data_fingerprint == sc.data_fingerprint &&
              got->loss_scale == 0.1);
    cr_assert_eq(hp_ckpt_count(c), N_T);
    const hp_ckpt_entry *e = hp_ckpt_find(c, "layers.0.attention.wq.weight");
    cr_assert_not_null(e);
    cr_expect(e->dtype == HP_F32 && e->rank == 2 && e->shape[0] == 7 && e->shape[1] == 4 &&
              e->rows == 7 && e->has_state);
    cr_expect(!hp_ckpt_find(c, "norm.weight")->has_state);
    cr_expect_eq(hp_ckpt_find(c, "temperature")->rank, 0);
    cr_expect_null(hp_ckpt_find(c, "nope"));
    float buf[64];
    cr_expect_eq(read_rows(c, "norm.weight", HP_CKPT_EXP_AVG, 0, 5, buf, 20, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "without optimizer state"), "%s", err.msg);
    cr_expect_eq(read_rows(c, "nope", HP_CKPT_PARAM, 0, 1, buf, 4, &err), HP_NOT_FOUND);
    cr_expect_eq(read_rows(c, "norm.weight", HP_CKPT_PARAM, 0, 6, buf, 24, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "norm.weight") && strstr(err.msg, "box [0, 6)"), "%s", err.msg);
    cr_expect_eq(read_rows(c, "norm.weight", HP_CKPT_PARAM, 0, 5, buf, 16, &err), HP_INVALID);
    cr_assert_eq(read_rows(c, "norm.weight", HP_CKPT_PARAM, 0, 5, buf, 20, &err), HP_OK);
    cr_expect_eq(memcmp(buf, md.p[1], 20), 0);
    md.m[1][0] = md.m[1][0]; /* (norm.weight's moments were not saved) */
    for (int i = 0; i < N_T; i++) {
        if (i == 1) continue;
        int64_t n = rows_of(&md, i) * row_len(&md, i);
        for (int part = 0; part < 3; part++) {
            const float *want = part == 0 ? md.p[i] : part == 1 ? md.m[i] : md.v[i];
            cr_assert_eq(read_rows(c, md.fqn[i], (hp_ckpt_part)part, 0, rows_of(&md, i), buf,
                                   (size_t)n * 4, &err),
                         HP_OK, "%s", err.msg);
            cr_expect_eq(memcmp(buf, want, (size_t)n * 4), 0, "%s part %d", md.fqn[i], part);
        }
    }

    /* the exported weights are a plain safetensors state dict */
    cr_assert_eq(hp_ckpt_export(c, tpath("w.safetensors"), &err), HP_OK, "%s", err.msg);
    hp_ckpt_close(c);
    hp_st_file *f;
    cr_assert_eq(hp_st_open(tpath("w.safetensors"), &f, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_st_count(f), N_T);
    const hp_st_tensor *t = hp_st_find(f, "layers.0.attention.wq.weight");
    cr_assert(t && t->dtype == HP_ST_F32 && t->rank == 2 && t->shape[0] == 7);
    cr_expect_eq(memcmp(t->data, md.p[0], 7 * 4 * 4), 0);
    hp_st_close(f);

    /* the rank file itself is readable by any safetensors reader */
    cr_assert_eq(hp_st_open(tpath("step-00000010/rank-00000.safetensors"), &f, &err), HP_OK, "%s",
                 err.msg);
    cr_expect_not_null(hp_st_find(f, "exp_avg_sq/tok_embeddings.weight"));
    cr_expect_str_eq(hp_st_meta_get(f, "hp.step"), "10");
    hp_st_close(f);
    model_fini(&md);
}

Test(checkpoint, reshard_2_to_3) {
    model md;
    model_init(&md, -3.0f);
    write_world(tmpdir, &md, 5, 2, 0);
    hp_ckpt *c;
    hp_err err;
    cr_assert_eq(hp_ckpt_open(tmpdir, 5, &c, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_world(c), 2);
    check_read_as(c, &md, 3);
    check_read_as(c, &md, 1);
    check_read_as(c, &md, 5);
    /* an arbitrary range across the rank boundary (rows 2..6 of 7, ranks hold [0,4) [4,7)) */
    float buf[16];
    cr_assert_eq(read_rows(c, md.fqn[0], HP_CKPT_EXP_AVG_SQ, 2, 6, buf, sizeof buf, &err), HP_OK);
    cr_expect_eq(memcmp(buf, md.v[0] + 8, sizeof buf), 0);
    hp_ckpt_close(c);

    /* and back: the 3-rank layout written from the same tensors reads as 2 ranks */
    write_world(tmpdir, &md, 6, 3, 0);
    cr_assert_eq(hp_ckpt_open(tmpdir, -1, &c, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_world(c), 3);
    cr_expect_eq(hp_ckpt_step(c), 6);
    check_read_as(c, &md, 2);
    hp_ckpt_close(c);
    model_fini(&md);
}

Test(checkpoint, interrupted_write_ignored) {
    model md;
    model_init(&md, 0.5f);
    write_world(tmpdir, &md, 10, 2, 0);
    /* step 20: only rank 0 finished, no commit */
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(20);
    hp_err err;
    shards_of(&md, 0, 2, sh);
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 0, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    int64_t step;
    cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &err), HP_OK);
    cr_expect_eq(step, 10);
    hp_ckpt *c;
    cr_expect_eq(hp_ckpt_open(tmpdir, 20, &c, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "step 20"), "%s", err.msg);
    /* committing with a rank missing fails and writes no index */
    cr_expect_eq(hp_ckpt_commit(tmpdir, 20, 2, 0, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "rank-00001.safetensors") && strstr(err.msg, "rank 1 of 2"), "%s",
              err.msg);
    cr_expect_eq(access(tpath("step-00000020/index.json"), F_OK), -1);
    cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &err), HP_OK);
    cr_expect_eq(step, 10);
    /* a pruning pass keeps the in-progress newer directory */
    cr_assert_eq(hp_ckpt_prune(tmpdir, 1, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(access(tpath("step-00000020/rank-00000.safetensors"), F_OK), 0);
    /* once rank 1 lands, the commit completes it */
    shards_of(&md, 1, 2, sh);
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 1, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_ckpt_commit(tmpdir, 20, 2, 0, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_ckpt_latest(tmpdir, &step, &err), HP_OK);
    cr_expect_eq(step, 20);
    /* an empty or missing root has no checkpoint */
    cr_expect_eq(hp_ckpt_latest(tpath("none"), &step, &err), HP_NOT_FOUND);
    cr_expect_eq(hp_ckpt_open(tpath("none"), -1, &c, &err), HP_NOT_FOUND);
    model_fini(&md);
}

static int count_step_dirs(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strncmp(e->d_name, "step-", 5) == 0;
    closedir(d);
    return n;
}

Test(checkpoint, keep_last_k) {
    model md;
    model_init(&md, 2.0f);
    /* a stale interrupted write older than everything */
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(1);
    shards_of(&md, 0, 2, sh);
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 0, 2, &sc, sh, N_T, NULL), HP_OK);
    for (int64_t s = 2; s <= 6; s++) write_world(tmpdir, &md, s * 100, 1, 2);
    cr_expect_eq(count_step_dirs(), 2);
    cr_expect_eq(access(tpath("step-00000600/index.json"), F_OK), 0);
    cr_expect_eq(access(tpath("step-00000500/index.json"), F_OK), 0);
    cr_expect_eq(access(tpath("step-00000001"), F_OK), -1, "stale partial checkpoint pruned");
    model_fini(&md);
}

/* Copies src to dst byte for byte. */
static void copy_file(const char *src, const char *dst) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    cr_assert_eq(system(cmd), 0);
}

static void expect_open_fails(hp_status want, const char *n1, const char *n2) {
    hp_ckpt *c = (hp_ckpt *)1;
    hp_err err = {0};
    hp_status s = hp_ckpt_open(tmpdir, 7, &c, &err);
    cr_expect_eq(s, want, "status %s, want %s: %s", hp_status_str(s), hp_status_str(want), err.msg);
    cr_expect_null(c);
    if (n1) cr_expect(strstr(err.msg, n1), "message '%s' lacks '%s'", err.msg, n1);
    if (n2) cr_expect(strstr(err.msg, n2), "message '%s' lacks '%s'", err.msg, n2);
}

static void replace_in_file(const char *path, const char *from, const char *to) {
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

Test(checkpoint, corrupt_files_rejected) {
    model md;
    model_init(&md, 4.0f);
    write_world(tmpdir, &md, 7, 2, 0);
    const char *r1 = tpath("step-00000007/rank-00001.safetensors");
    const char *idx = tpath("step-00000007/index.json");
    char saved_r1[300], saved_idx[300];
    snprintf(saved_r1, sizeof saved_r1, "%s/r1.bak", tmpdir);
    snprintf(saved_idx, sizeof saved_idx, "%s/idx.bak", tmpdir);
    copy_file(r1, saved_r1);
    copy_file(idx, saved_idx);
    hp_ckpt *c;
    hp_err err;
    cr_assert_eq(hp_ckpt_open(tmpdir, 7, &c, &err), HP_OK, "%s", err.msg);
    hp_ckpt_close(c);

    /* a truncated rank file */
    struct stat st;
    stat(r1, &st);
    for (off_t cut = 0; cut < st.st_size; cut += 1 + st.st_size / 13) {
        copy_file(saved_r1, r1);
        cr_assert_eq(truncate(r1, cut), 0);
        expect_open_fails(cut < 8 ? HP_PARSE : HP_PARSE, "rank-00001.safetensors", NULL);
    }
    copy_file(saved_r1, r1);

    /* a missing rank file */
    unlink(r1);
    expect_open_fails(HP_NOT_FOUND, "rank-00001.safetensors", "missing");
    copy_file(saved_r1, r1);

    /* a rank file from another step */
    write_world(tmpdir, &md, 8, 2, 0);
    copy_file(tpath("step-00000008/rank-00001.safetensors"), r1);
    expect_open_fails(HP_PARSE, "rank 1's scalars", "step 8");
    copy_file(saved_r1, r1);

    /* a broken or inconsistent index */
    FILE *f = fopen(idx, "w");
    fputs("{\"format\": \"hp-checkpoint\", ", f);
    fclose(f);
    expect_open_fails(HP_PARSE, "index.json", NULL);
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"version\":2", "\"version\":9");
    expect_open_fails(HP_PARSE, "index.json", "version 9");
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"world\":2", "\"world\":3");
    expect_open_fails(HP_PARSE, "rank-00000.safetensors", "expected 0/3");
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"seed\":\"", "\"seed\":\"1");
    expect_open_fails(HP_PARSE, "index.json", "scalars");
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"norm.weight\"", "\"norm.weigh\"");
    expect_open_fails(HP_PARSE, "index.json", "disagrees");
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"shape\":[7,", "\"shape\":[8,");
    expect_open_fails(HP_PARSE, "index.json", NULL);
    copy_file(saved_idx, idx);
    replace_in_file(idx, "\"dtype\":\"F32\"", "\"dtype\":\"F99\"");
    expect_open_fails(HP_PARSE, "index.json", "dtype");
    copy_file(saved_idx, idx);
    cr_assert_eq(hp_ckpt_open(tmpdir, 7, &c, &err), HP_OK, "%s", err.msg);
    hp_ckpt_close(c);
    model_fini(&md);
}

Test(checkpoint, bad_layouts_rejected) {
    model md;
    model_init(&md, 1.0f);
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(3);
    hp_err err;
    /* overlapping ranges: both ranks claim rows [0, 4) and [2, 7) */
    shards_of(&md, 0, 2, sh);
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 0, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    shards_of(&md, 1, 2, sh);
    sh[0].off[0] = 2;
    sh[0].len[0] = 5;
    sh[0].param = md.p[0] + 8;
    sh[0].exp_avg = md.m[0] + 8;
    sh[0].exp_avg_sq = md.v[0] + 8;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 1, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 2, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "layers.0.attention.wq.weight") && strstr(err.msg, "overlap"), "%s",
              err.msg);
    /* a gap: rank 1 holds [5, 7) */
    sh[0].off[0] = 5;
    sh[0].len[0] = 2;
    sh[0].param = md.p[0] + 20;
    sh[0].exp_avg = md.m[0] + 20;
    sh[0].exp_avg_sq = md.v[0] + 20;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 1, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 2, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "gap"), "%s", err.msg);
    /* ranks disagree on a dtype */
    shards_of(&md, 1, 2, sh);
    sh[1].dtype = HP_I32;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 1, 2, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 2, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "norm.weight") && strstr(err.msg, "disagree"), "%s", err.msg);
    /* ranks disagree on the scalars */
    shards_of(&md, 1, 2, sh);
    hp_ckpt_scalars sc2 = sc;
    sc2.seed++;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 1, 2, &sc2, sh, N_T, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 2, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "scalars"), "%s", err.msg);
    cr_expect_eq(access(tpath("step-00000003/index.json"), F_OK), -1);
    int64_t step;
    cr_expect_eq(hp_ckpt_latest(tmpdir, &step, &err), HP_NOT_FOUND);

    /* argument errors name the shard and the field */
    shards_of(&md, 0, 1, sh);
    sh[0].fqn = "a/b";
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'a/b'"), "%s", err.msg);
    shards_of(&md, 0, 1, sh);
    sh[0].len[0] = 8;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "box [0, 8)"), "%s", err.msg);
    shards_of(&md, 0, 1, sh);
    sh[2].exp_avg_sq = NULL;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "exp_avg_sq"), "%s", err.msg);
    shards_of(&md, 0, 1, sh);
    sh[1].param = NULL;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    shards_of(&md, 0, 1, sh);
    sh[0].held[0] = 6; /* a buffer smaller than the box */
    sh[0].held[1] = 4;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "held[0]"), "%s", err.msg);
    shards_of(&md, 0, 1, sh);
    sh[0].len[1] = -1;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    shards_of(&md, 0, 1, sh);
    sh[1].fqn = sh[0].fqn;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 1, &sc, sh, N_T, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "appears twice"), "%s", err.msg);
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 1, 1, &sc, sh, N_T, &err), HP_INVALID);
    model_fini(&md);
}

Test(checkpoint, fault_injection) {
    model md;
    model_init(&md, 1.0f);
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(4);
    hp_err err;
    int n;
    for (n = 0; n < 100000; n++) {
        hp_status s = HP_OK;
        hp_alloc_fail_at(n);
        for (int r = 0; s == HP_OK && r < 2; r++) {
            shards_of(&md, r, 2, sh);
            s = hp_ckpt_write_rank(tmpdir, r, 2, &sc, sh, N_T, &err);
        }
        if (s == HP_OK) s = hp_ckpt_commit(tmpdir, 4, 2, 1, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) break;
        cr_assert_eq(s, HP_NOMEM, "write, failing allocation %d: %s", n, err.msg);
    }
    cr_expect_gt(n, 10);
    for (n = 0; n < 100000; n++) {
        hp_ckpt *c = NULL;
        hp_alloc_fail_at(n);
        hp_status s = hp_ckpt_open(tmpdir, -1, &c, &err);
        if (s == HP_OK) s = hp_ckpt_export(c, tpath("x.safetensors"), &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            check_read_as(c, &md, 3);
            hp_ckpt_close(c);
            break;
        }
        hp_ckpt_close(c);
        cr_assert_eq(s, HP_NOMEM, "open, failing allocation %d: %s", n, err.msg);
    }
    cr_expect_gt(n, 10);
    model_fini(&md);
}

Test(checkpoint, nested_root_and_rewrite) {
    model md;
    model_init(&md, 9.0f);
    char root[300];
    snprintf(root, sizeof root, "%s/runs/a/ckpt/", tmpdir);
    write_world(root, &md, 3, 1, 0);
    /* rewriting a committed step drops its index until the new commit */
    hp_ckpt_shard sh[N_T];
    hp_ckpt_scalars sc = scalars(3);
    hp_err err;
    shards_of(&md, 0, 1, sh);
    cr_assert_eq(hp_ckpt_write_rank(root, 0, 1, &sc, sh, N_T, &err), HP_OK, "%s", err.msg);
    int64_t step;
    cr_expect_eq(hp_ckpt_latest(root, &step, &err), HP_NOT_FOUND);
    cr_assert_eq(hp_ckpt_commit(root, 3, 1, 0, &err), HP_OK, "%s", err.msg);
    hp_ckpt *c;
    cr_assert_eq(hp_ckpt_open(root, -1, &c, &err), HP_OK, "%s", err.msg);
    check_read_as(c, &md, 2);
    hp_ckpt_close(c);
    model_fini(&md);
}

Test(checkpoint, no_tensors) {
    hp_ckpt_scalars sc = scalars(0);
    hp_err err;
    cr_assert_eq(hp_ckpt_save(tmpdir, &sc, NULL, 0, 0, &err), HP_OK, "%s", err.msg);
    hp_ckpt *c;
    cr_assert_eq(hp_ckpt_open(tmpdir, 0, &c, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_count(c), 0);
    cr_expect_eq(hp_ckpt_get_scalars(c)->loss_scale, 0.1);
    hp_ckpt_close(c);
}
