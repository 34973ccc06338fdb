/* tests/worker/test_checkpoint_integrity.c — checkpoints that must not be read as valid:
 * corrupt and truncated files and bad layouts rejected with errors naming the file, CRC32C
 * checksums (known values, one flipped tensor byte caught), version-2 checkpoints (before
 * checksums) still read unverified, and a FIFO in place of a file refused at once.
 */
#define _GNU_SOURCE /* memmem */
#include "tests/worker/ckpt_fixture.h"
#include "hp/safetensors.h"
#include "worker/crc32c.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(checkpoint, .init = make_tmp, .fini = rm_tmp);

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
    replace_in_file(idx, "\"version\":3", "\"version\":9");
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

/* ---- checksums (version 3) ------------------------------------------------------------------ */

Test(checkpoint, crc32c_known_values) {
    /* the check value of CRC-32C (RFC 3720 / the Castagnoli catalogue) */
    cr_expect_eq(hp__crc32c(0, "123456789", 9), 0xE3069283u);
    cr_expect_eq(hp__crc32c(0, "", 0), 0u);
    static uint8_t zeros[32], buf[1000];
    cr_expect_eq(hp__crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4: 32 zero bytes */
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t off = 0; off < 9; off++) /* every alignment, hardware == portable, chained */
        for (size_t n = 0; n + off <= sizeof buf; n += 97) {
            uint32_t a = hp__crc32c(0, buf + off, n), b = hp__crc32c_portable(0, buf + off, n);
            cr_expect_eq(a, b, "off %zu n %zu", off, n);
            cr_expect_eq(hp__crc32c(hp__crc32c(0, buf + off, n / 2), buf + off + n / 2, n - n / 2),
                         a);
        }
}

/* One flipped byte of a tensor's data: the open fails naming the rank file and the tensor. */
Test(checkpoint, corrupt_tensor_byte_is_caught) {
    model md;
    model_init(&md, 2.0f);
    write_world(tmpdir, &md, 7, 2, 0);
    const char *r1 = tpath("step-00000007/rank-00001.safetensors");
    hp_st_file *f = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_st_open(r1, &f, &err), HP_OK, "%s", err.msg);
    cr_assert(hp_st_meta_get(f, "hp.crc32c"), "rank files carry checksums");
    hp_st_close(f);
    struct stat st;
    cr_assert_eq(stat(r1, &st), 0);
    FILE *fp = fopen(r1, "r+b");
    cr_assert_eq(fseek(fp, st.st_size - 3, SEEK_SET), 0); /* inside the last tensor */
    int ch = fgetc(fp);
    cr_assert_eq(fseek(fp, st.st_size - 3, SEEK_SET), 0);
    fputc(ch ^ 0x10, fp);
    fclose(fp);
    expect_open_fails(HP_PARSE, "rank-00001.safetensors", "is corrupt: CRC-32C");
    /* commit does not re-read the bytes (they were checksummed as written) */
    cr_expect_eq(hp_ckpt_commit(tmpdir, 7, 2, 0, &err), HP_OK, "%s", err.msg);
    /* a version-3 file without checksums is refused, not read unverified */
    const char *r0 = tpath("step-00000007/rank-00000.safetensors");
    patch_file(r0, "\"hp.crc32c\"", "\"hp.crc32x\"");
    expect_open_fails(HP_PARSE, "rank-00000.safetensors", "'hp.crc32c' is missing");
    model_fini(&md);
}

/* Version-2 checkpoints (written before checksums) still open and read, unverified. */
Test(checkpoint, version2_without_checksums_still_reads) {
    model md;
    model_init(&md, 3.0f);
    write_world(tmpdir, &md, 7, 2, 0);
    hp_err err = {0};
    for (int r = 0; r < 2; r++) { /* rewrite each rank file as version 2 wrote it */
        const char *path = tpath("step-00000007/rank-%05d.safetensors", r);
        hp_st_file *f = NULL;
        cr_assert_eq(hp_st_open(path, &f, &err), HP_OK, "%s", err.msg);
        int n = hp_st_count(f), nm = hp_st_meta_count(f), k = 0;
        hp_st_tensor *ts = calloc((size_t)n, sizeof *ts);
        hp_st_kv *meta = calloc((size_t)nm, sizeof *meta);
        for (int i = 0; i < n; i++) ts[i] = *hp_st_at(f, i);
        for (int i = 0; i < nm; i++) {
            const hp_st_kv *kv = hp_st_meta_at(f, i);
            if (!strcmp(kv->key, "hp.crc32c")) continue;
            meta[k] = *kv;
            if (!strcmp(kv->key, "hp.version")) meta[k].value = "2";
            k++;
        }
        char tmp2[300];
        snprintf(tmp2, sizeof tmp2, "%s.v2", path);
        cr_assert_eq(hp_st_write(tmp2, ts, n, meta, k, &err), HP_OK, "%s", err.msg);
        hp_st_close(f);
        cr_assert_eq(rename(tmp2, path), 0);
        free(ts);
        free(meta);
    }
    replace_in_file(tpath("step-00000007/index.json"), "\"version\":3", "\"version\":2");
    hp_ckpt *c = NULL;
    cr_assert_eq(hp_ckpt_open(tmpdir, 7, &c, &err), HP_OK, "%s", err.msg);
    check_read_as(c, &md, 3);
    hp_ckpt_close(c);
    model_fini(&md);
}

/* A FIFO (no writer) in place of a rank file or the index: refused at once, never a hang in
 * open() (the suite's timeout would turn a regression into a failure). */
Test(checkpoint, fifo_in_place_of_a_file_is_refused, .timeout = 20) {
    model md;
    model_init(&md, 5.0f);
    write_world(tmpdir, &md, 7, 2, 0);
    const char *r1 = tpath("step-00000007/rank-00001.safetensors");
    cr_assert_eq(unlink(r1), 0);
    cr_assert_eq(mkfifo(r1, 0600), 0);
    expect_open_fails(HP_IO, "rank-00001.safetensors", "not a regular file (a fifo)");
    cr_assert_eq(unlink(r1), 0);
    write_world(tmpdir, &md, 7, 2, 0);
    const char *idx = tpath("step-00000007/index.json");
    cr_assert_eq(unlink(idx), 0);
    cr_assert_eq(mkfifo(idx, 0600), 0);
    int64_t step = 0;
    cr_expect_eq(hp_ckpt_latest(tmpdir, &step, NULL), HP_NOT_FOUND, "a fifo index is no commit");
    expect_open_fails(HP_IO, "index.json", "not a regular file (a fifo)");
    model_fini(&md);
}
