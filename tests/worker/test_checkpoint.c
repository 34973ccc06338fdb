/* tests/worker/test_checkpoint.c — sharded checkpoints: bit-exact round trip, resharding
 * 2 ranks -> 3 ranks (and arbitrary row ranges) equal to the unsharded tensors, N-D boxes
 * from a (2, 2) mesh with padded buffers and replicas read back as other layouts, overlapping,
 * gapped and out-of-shape boxes and bad read arguments rejected, a hand-written version-1
 * checkpoint read, interrupted writes ignored by `latest`, keep-last-K pruning, and the
 * allocation fault loops. Corrupt files and checksums: test_checkpoint_integrity.c.
 */
#define _GNU_SOURCE /* memmem */
#include "tests/worker/ckpt_fixture.h"
#include "hp/safetensors.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(checkpoint, .init = make_tmp, .fini = rm_tmp);

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

/* ---- boxes on a (dp, tp) = (2, 2) mesh ----------------------------------------------------- */

/* W [5, 3]: dim 0 over dp (rows [0,3) [3,5)), dim 1 over tp (cols [0,2) [2,3)), every rank's
 * buffer [3, 2] (the last boxes shorter: padding). b [3]: dim 0 over tp, replicated over dp.
 * s: a scalar on every rank. Rank r = dp * 2 + tp. */
#define MESH_PAD -777.0f
enum { MW, MB, MS, N_MESH };
typedef struct mesh_model {
    float full[3][N_MESH][16];  /* [part][tensor]: the global tensors */
    float buf[4][3][N_MESH][8]; /* [rank][part][tensor]: each rank's padded local buffers */
} mesh_model;

static void mesh_init(mesh_model *mm) {
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < N_MESH; t++)
            for (int k = 0; k < 16; k++)
                mm->full[p][t][k] = (float)(p * 1000 + t * 100 + k) + 0.25f;
}

/* Rank r's shards (boxes cut from the full tensors into padded buffers). */
static int mesh_shards(mesh_model *mm, int r, hp_ckpt_shard *sh) {
    int dp = r / 2, tp = r % 2;
    int64_t r0 = dp * 3, nr = dp ? 2 : 3, c0 = tp * 2, nc = tp ? 1 : 2;
    int64_t b0 = tp * 2, nb = tp ? 1 : 2;
    for (int p = 0; p < 3; p++) {
        float *w = mm->buf[r][p][MW], *b = mm->buf[r][p][MB];
        for (int k = 0; k < 8; k++) w[k] = b[k] = MESH_PAD;
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < nc; j++) w[i * 2 + j] = mm->full[p][MW][(r0 + i) * 3 + c0 + j];
        for (int64_t i = 0; i < nb; i++) b[i] = mm->full[p][MB][b0 + i];
        mm->buf[r][p][MS][0] = mm->full[p][MS][0];
    }
    sh[MW] = (hp_ckpt_shard){
        .fqn = "W", .rank = 2, .shape = {5, 3}, .off = {r0, c0}, .len = {nr, nc}, .held = {3, 2}};
    sh[MB] =
        (hp_ckpt_shard){.fqn = "b", .rank = 1, .shape = {3}, .off = {b0}, .len = {nb}, .held = {2}};
    sh[MS] = (hp_ckpt_shard){.fqn = "s", .rank = 0};
    for (int t = 0; t < N_MESH; t++) {
        sh[t].dtype = sh[t].state_dtype = HP_F32;
        sh[t].param = mm->buf[r][0][t];
        sh[t].exp_avg = mm->buf[r][1][t];
        sh[t].exp_avg_sq = mm->buf[r][2][t];
    }
    return N_MESH;
}

static hp_status mesh_write(const char *dir, mesh_model *mm, int64_t step, hp_err *err) {
    hp_ckpt_shard sh[N_MESH];
    hp_ckpt_scalars sc = scalars(step);
    for (int r = 0; r < 4; r++) {
        int n = mesh_shards(mm, r, sh);
        HP_TRY(hp_ckpt_write_rank(dir, r, 4, &sc, sh, n, err));
    }
    return hp_ckpt_commit(dir, step, 4, 0, err);
}

/* Reads box [off, off + len) of t's part p into a held-shaped buffer pre-filled with a
 * sentinel and checks it against the full tensor, the sentinel intact outside the box. */
static void expect_box(const hp_ckpt *c, const float *full, const char *fqn, int p, int nd,
                       const int64_t *shape, const int64_t *off, const int64_t *len,
                       const int64_t *held) {
    float out[64];
    int64_t h0 = nd ? held[0] : 1, h1 = nd == 2 ? held[1] : 1, s1 = nd == 2 ? shape[1] : 1;
    int64_t l0 = nd ? len[0] : 1, l1 = nd == 2 ? len[1] : 1;
    int64_t o0 = nd ? off[0] : 0, o1 = nd == 2 ? off[1] : 0;
    for (int k = 0; k < 64; k++) out[k] = 12345.0f;
    hp_err err;
    cr_assert_eq(hp_ckpt_read_box(c, fqn, (hp_ckpt_part)p, nd, off, len, held, out,
                                  (size_t)(h0 * h1) * 4, &err),
                 HP_OK, "%s", err.msg);
    for (int64_t i = 0; i < h0; i++)
        for (int64_t j = 0; j < h1; j++) {
            float got = out[i * h1 + j];
            float want = i < l0 && j < l1 ? full[(o0 + i) * s1 + o1 + j] : 12345.0f;
            cr_assert_eq(got, want, "%s part %d box off (%lld,%lld) at (%lld,%lld): %g != %g", fqn,
                         p, (long long)o0, (long long)o1, (long long)i, (long long)j, got, want);
        }
}

Test(checkpoint, mesh_boxes_reshard) {
    static mesh_model mm;
    mesh_init(&mm);
    hp_err err;
    cr_assert_eq(mesh_write(tmpdir, &mm, 9, &err), HP_OK, "%s", err.msg);

    /* a rank file holds exactly its box, packed, the padding not saved */
    hp_st_file *f;
    cr_assert_eq(hp_st_open(tpath("step-00000009/rank-00003.safetensors"), &f, &err), HP_OK);
    const hp_st_tensor *t = hp_st_find(f, "exp_avg/W");
    cr_assert(t && t->rank == 2 && t->shape[0] == 2 && t->shape[1] == 1);
    cr_expect_eq(((const float *)t->data)[0], mm.full[1][MW][3 * 3 + 2]);
    cr_expect_eq(((const float *)t->data)[1], mm.full[1][MW][4 * 3 + 2]);
    cr_expect(strstr(hp_st_meta_get(f, "hp.shards"), "\"W\":{\"shape\":[5,3],\"off\":[3,2],"
                                                     "\"len\":[2,1]}"),
              "%s", hp_st_meta_get(f, "hp.shards"));
    hp_st_close(f);

    hp_ckpt *c;
    cr_assert_eq(hp_ckpt_open(tmpdir, 9, &c, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_world(c), 4);
    const int64_t wshape[2] = {5, 3}, bshape[1] = {3};
    for (int p = 0; p < 3; p++) {
        const float *w = mm.full[p][MW], *b = mm.full[p][MB];
        /* (a) the full tensors */
        expect_box(c, w, "W", p, 2, wshape, (int64_t[]){0, 0}, wshape, wshape);
        expect_box(c, b, "b", p, 1, bshape, (int64_t[]){0}, bshape, bshape);
        expect_box(c, mm.full[p][MS], "s", p, 0, NULL, NULL, NULL, NULL);
        /* (b) dim-0 rows over 4 ranks: [0,2) [2,4) [4,5) [5,5), buffers [2, 3] */
        for (int r = 0; r < 4; r++) {
            int64_t s = r * 2 < 5 ? r * 2 : 5, e = s + 2 < 5 ? s + 2 : 5;
            expect_box(c, w, "W", p, 2, wshape, (int64_t[]){s, 0}, (int64_t[]){e - s, 3},
                       (int64_t[]){2, 3});
        }
        /* (c) dim 1 over 3 ranks, buffers [6, 2] (padded on both dims) */
        for (int r = 0; r < 3; r++)
            expect_box(c, w, "W", p, 2, wshape, (int64_t[]){0, r}, (int64_t[]){5, 1},
                       (int64_t[]){6, 2});
        /* an arbitrary box across all four saved boxes */
        expect_box(c, w, "W", p, 2, wshape, (int64_t[]){1, 1}, (int64_t[]){3, 2},
                   (int64_t[]){4, 4});
        expect_box(c, b, "b", p, 1, bshape, (int64_t[]){1}, (int64_t[]){2}, (int64_t[]){3});
    }
    /* the export assembles the full tensors too */
    cr_assert_eq(hp_ckpt_export(c, tpath("mesh.safetensors"), &err), HP_OK, "%s", err.msg);
    hp_ckpt_close(c);
    cr_assert_eq(hp_st_open(tpath("mesh.safetensors"), &f, &err), HP_OK, "%s", err.msg);
    t = hp_st_find(f, "W");
    cr_assert(t && t->shape[0] == 5 && t->shape[1] == 3);
    cr_expect_eq(memcmp(t->data, mm.full[0][MW], 15 * 4), 0);
    hp_st_close(f);

    /* the index records the boxes, one per rank */
    FILE *ix = fopen(tpath("step-00000009/index.json"), "r");
    char text[4096] = {0};
    cr_assert_not_null(ix);
    cr_assert_gt(fread(text, 1, sizeof text - 1, ix), 0);
    fclose(ix);
    cr_expect(strstr(text, "\"version\":3"), "%s", text);
    cr_expect(strstr(text, "{\"rank\":3,\"off\":[3,2],\"len\":[2,1]}"), "%s", text);
}

Test(checkpoint, mesh_write_fault_injection) {
    static mesh_model mm;
    mesh_init(&mm);
    hp_err err;
    int n;
    for (n = 0; n < 100000; n++) {
        hp_alloc_fail_at(n);
        hp_status s = mesh_write(tmpdir, &mm, 2, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) break;
        cr_assert_eq(s, HP_NOMEM, "failing allocation %d: %s", n, err.msg);
    }
    cr_expect_gt(n, 10);
}

Test(checkpoint, mesh_bad_boxes_rejected) {
    static mesh_model mm;
    mesh_init(&mm);
    hp_ckpt_shard sh[N_MESH];
    hp_ckpt_scalars sc = scalars(3);
    hp_err err;
    for (int r = 0; r < 3; r++) {
        mesh_shards(&mm, r, sh);
        cr_assert_eq(hp_ckpt_write_rank(tmpdir, r, 4, &sc, sh, N_MESH, &err), HP_OK, "%s", err.msg);
    }
    /* a partial overlap on dim 1: rank 3 claims cols [1,3) of rows [3,5) */
    mesh_shards(&mm, 3, sh);
    sh[MW].off[1] = 1;
    sh[MW].len[1] = 2;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 3, 4, &sc, sh, N_MESH, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 4, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "overlap") &&
                  strstr(err.msg, "rank-00003.safetensors") && strstr(err.msg, "[3,5)x[1,3)"),
              "%s", err.msg);
    /* a gap: rank 3 saves nothing of W */
    mesh_shards(&mm, 3, sh);
    sh[MW].len[0] = 0;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 3, 4, &sc, sh, N_MESH, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 4, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "gap") && strstr(err.msg, "13 of its 15"),
              "%s", err.msg);
    /* a replica that differs from its twin is a partial overlap too: b [0,2) vs [0,3) */
    mesh_shards(&mm, 3, sh);
    sh[MB].off[0] = 0;
    sh[MB].len[0] = 3;
    sh[MB].held[0] = 3;
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 3, 4, &sc, sh, N_MESH, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 4, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "'b'") && strstr(err.msg, "overlap"), "%s", err.msg);
    /* a box outside the shape is refused by the writer ... */
    mesh_shards(&mm, 3, sh);
    sh[MW].off[0] = 4;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 3, 4, &sc, sh, N_MESH, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "dim 0") && strstr(err.msg, "[4, 6)"), "%s",
              err.msg);
    /* ... and by the commit when a file says so */
    mesh_shards(&mm, 3, sh);
    cr_assert_eq(hp_ckpt_write_rank(tmpdir, 3, 4, &sc, sh, N_MESH, &err), HP_OK, "%s", err.msg);
    const char *r3 = tpath("step-00000003/rank-00003.safetensors");
    patch_file(r3, "\\\"off\\\":[3,2]", "\\\"off\\\":[4,2]");
    cr_expect_eq(hp_ckpt_commit(tmpdir, 3, 4, 0, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "rank-00003.safetensors") && strstr(err.msg, "'W'") &&
                  strstr(err.msg, "outside"),
              "%s", err.msg);
    cr_expect_eq(access(tpath("step-00000003/index.json"), F_OK), -1, "nothing written");
    /* held smaller than the box */
    mesh_shards(&mm, 0, sh);
    sh[MW].held[1] = 1;
    cr_expect_eq(hp_ckpt_write_rank(tmpdir, 0, 4, &sc, sh, N_MESH, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "held[1]"), "%s", err.msg);
}

Test(checkpoint, bad_read_box_args) {
    static mesh_model mm;
    mesh_init(&mm);
    hp_err err;
    cr_assert_eq(mesh_write(tmpdir, &mm, 1, &err), HP_OK, "%s", err.msg);
    hp_ckpt *c;
    cr_assert_eq(hp_ckpt_open(tmpdir, 1, &c, &err), HP_OK, "%s", err.msg);
    float out[64];
    const int64_t off[2] = {0, 0}, len[2] = {5, 3};
    cr_expect_eq(hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, len, NULL, out, 60, &err), HP_OK,
                 "%s", err.msg);
    /* rank differs from the entry's */
    cr_expect_eq(hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 1, off, len, NULL, out, 20, &err),
                 HP_INVALID);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "rank 2"), "%s", err.msg);
    /* outside the shape */
    cr_expect_eq(
        hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, (int64_t[]){1, 0}, len, NULL, out, 60, &err),
        HP_INVALID);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "outside the shape"), "%s", err.msg);
    cr_expect_eq(
        hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, (int64_t[]){5, -1}, NULL, out, 0, &err),
        HP_INVALID);
    /* size mismatches: out_bytes vs len, vs held; held smaller than the box */
    cr_expect_eq(hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, len, NULL, out, 56, &err),
                 HP_INVALID);
    cr_expect(strstr(err.msg, "'W'") && strstr(err.msg, "60 bytes") && strstr(err.msg, "56"), "%s",
              err.msg);
    cr_expect_eq(
        hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, len, (int64_t[]){6, 3}, out, 60, &err),
        HP_INVALID);
    cr_expect_eq(
        hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, len, (int64_t[]){5, 2}, out, 40, &err),
        HP_INVALID);
    cr_expect(strstr(err.msg, "held[1]"), "%s", err.msg);
    /* NULL box, bad part, unknown fqn */
    cr_expect_eq(hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, NULL, len, NULL, out, 60, &err),
                 HP_INVALID);
    cr_expect_eq(hp_ckpt_read_box(c, "W", (hp_ckpt_part)7, 2, off, len, NULL, out, 60, &err),
                 HP_INVALID);
    cr_expect_eq(hp_ckpt_read_box(c, "V", HP_CKPT_PARAM, 2, off, len, NULL, out, 60, &err),
                 HP_NOT_FOUND);
    /* a rank-0 tensor: one element, no dims */
    cr_expect_eq(hp_ckpt_read_box(c, "s", HP_CKPT_EXP_AVG, 0, NULL, NULL, NULL, out, 4, &err),
                 HP_OK, "%s", err.msg);
    cr_expect_eq(out[0], mm.full[1][MS][0]);
    cr_expect_eq(hp_ckpt_read_box(c, "s", HP_CKPT_PARAM, 0, NULL, NULL, NULL, out, 8, &err),
                 HP_INVALID);
    /* an empty box reads nothing and needs no buffer */
    cr_expect_eq(
        hp_ckpt_read_box(c, "W", HP_CKPT_PARAM, 2, off, (int64_t[]){0, 3}, NULL, NULL, 0, &err),
        HP_OK, "%s", err.msg);
    hp_ckpt_close(c);
}

/* ---- a version-1 checkpoint (dim-0 row ranges), written by hand as the old code did -------- */

static void write_v1_rank(const char *sdir, int r, const float *w, const float *wm, const float *wv,
                          const char *shards) {
    int64_t s = r ? 3 : 0, e = r ? 5 : 3;
    static const float scalar[1] = {42.5f};
    static const float emb[2] = {-1.0f, -2.0f};
    hp_st_tensor ts[5] = {
        {"w", HP_ST_F32, 2, {e - s, 3}, w + s * 3, (size_t)((e - s) * 3) * 4},
        {"exp_avg/w", HP_ST_F32, 2, {e - s, 3}, wm + s * 3, (size_t)((e - s) * 3) * 4},
        {"exp_avg_sq/w", HP_ST_F32, 2, {e - s, 3}, wv + s * 3, (size_t)((e - s) * 3) * 4},
        {"t", HP_ST_F32, 0, {0}, scalar, 4},
        {"e", HP_ST_F32, 1, {r ? 0 : 2}, r ? NULL : emb, r ? 0 : 8},
    };
    char rank[8], path[512];
    snprintf(rank, sizeof rank, "%d", r);
    snprintf(path, sizeof path, "%s/rank-%05d.safetensors", sdir, r);
    hp_st_kv meta[11] = {
        {"hp.format", "hp-checkpoint-rank"},
        {"hp.version", "1"},
        {"hp.step", "7"},
        {"hp.rank", rank},
        {"hp.world", "2"},
        {"hp.seed", "11"},
        {"hp.rng_offset", "0"},
        {"hp.data_step", "7"},
        {"hp.data_fingerprint", "5"},
        {"hp.loss_scale", "1"},
        {"hp.shards", shards},
    };
    hp_err err;
    cr_assert_eq(hp_st_write(path, ts, 5, meta, 11, &err), HP_OK, "%s", err.msg);
}

Test(checkpoint, version1_fixture) {
    float w[15], wm[15], wv[15];
    for (int k = 0; k < 15; k++) {
        w[k] = (float)k + 0.5f;
        wm[k] = -(float)k;
        wv[k] = (float)(k * k);
    }
    char sdir[300];
    snprintf(sdir, sizeof sdir, "%s/step-00000007", tmpdir);
    cr_assert_eq(mkdir(sdir, 0755), 0);
    write_v1_rank(sdir, 0, w, wm, wv, "{\"w\":[0,3,5],\"t\":[0,1,1],\"e\":[0,2,2]}");
    write_v1_rank(sdir, 1, w, wm, wv, "{\"w\":[3,5,5],\"t\":[0,1,1],\"e\":[0,0,2]}");
    FILE *f = fopen(tpath("step-00000007/index.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"format\":\"hp-checkpoint\",\"version\":1,\"step\":7,\"world\":2,\"scalars\":"
          "{\"step\":7,\"seed\":\"11\",\"rng_offset\":\"0\",\"data_step\":7,"
          "\"data_fingerprint\":\"5\",\"loss_scale\":1.0},\n\"tensors\":{\n"
          "\"e\":{\"dtype\":\"F32\",\"shape\":[2],\"state_dtype\":null,\"shards\":[[0,0,2],[1,0,0]]"
          "},\n"
          "\"t\":{\"dtype\":\"F32\",\"shape\":[],\"state_dtype\":null,\"shards\":[[0,0,1],[1,0,1]]}"
          ",\n"
          "\"w\":{\"dtype\":\"F32\",\"shape\":[5,3],\"state_dtype\":\"F32\","
          "\"shards\":[[0,0,3],[1,3,5]]}\n}}\n",
          f);
    fclose(f);

    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: as found; pass 1: after a commit rewrote the index as version 3 */
        hp_ckpt *c;
        hp_err err;
        cr_assert_eq(hp_ckpt_open(tmpdir, -1, &c, &err), HP_OK, "pass %d: %s", pass, err.msg);
        cr_expect_eq(hp_ckpt_world(c), 2);
        cr_expect_eq(hp_ckpt_get_scalars(c)->seed, 11);
        const hp_ckpt_entry *e = hp_ckpt_find(c, "w");
        cr_assert(e && e->rank == 2 && e->shape[0] == 5 && e->shape[1] == 3 && e->has_state);
        const int64_t shape[2] = {5, 3};
        const float *full[3] = {w, wm, wv};
        for (int p = 0; p < 3; p++) {
            expect_box(c, full[p], "w", p, 2, shape, (int64_t[]){0, 0}, shape, shape);
            /* rows [2, 4) x cols [1, 3): across the two old row ranges, into a padded buffer */
            expect_box(c, full[p], "w", p, 2, shape, (int64_t[]){2, 1}, (int64_t[]){2, 2},
                       (int64_t[]){3, 3});
        }
        float out[2];
        cr_assert_eq(hp_ckpt_read_box(c, "t", HP_CKPT_PARAM, 0, NULL, NULL, NULL, out, 4, &err),
                     HP_OK, "%s", err.msg);
        cr_expect_eq(out[0], 42.5f);
        cr_assert_eq(hp_ckpt_read_box(c, "e", HP_CKPT_PARAM, 1, (int64_t[]){0}, (int64_t[]){2},
                                      NULL, out, 8, &err),
                     HP_OK, "%s", err.msg);
        cr_expect(out[0] == -1.0f && out[1] == -2.0f);
        hp_ckpt_close(c);
        if (pass == 0) cr_assert_eq(hp_ckpt_commit(tmpdir, 7, 2, 0, &err), HP_OK, "%s", err.msg);
    }
    f = fopen(tpath("step-00000007/index.json"), "r");
    char text[2048] = {0};
    cr_assert_gt(fread(text, 1, sizeof text - 1, f), 0);
    fclose(f);
    cr_expect(strstr(text, "\"version\":3") &&
                  strstr(text, "{\"rank\":1,\"off\":[3,0],\"len\":[2,3]}"),
              "%s", text);
}
