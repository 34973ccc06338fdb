/* tests/worker/test_data.c — token sources and the batch sampler: the built-in corpus,
 * llm.c shards (every kind of bad shard named), directories and globs, determinism per
 * (seed, rank, step), world-N local batches == the world-1 global batch, every window read
 * once per epoch, and the allocation fault loop.
 */
#include "hp/data.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(data, .init = make_tmp, .fini = rm_tmp);

static char *tpath(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

/* A shard whose token i is base + i (so a sample's first token names its window). */
static void write_counting_shard(const char *path, uint32_t base, int64_t n, int version) {
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
    hp_err err;
    cr_assert_eq(hp_data_write_shard(path, t, n, version, &err), HP_OK, "%s", err.msg);
    free(t);
}

static hp_data *open_ok(hp_data_config c) {
    hp_data *d;
    hp_err err;
    cr_assert_eq(hp_data_open(&c, &d, &err), HP_OK, "%s", err.msg);
    return d;
}

static void next_ok(hp_data *d, int rank, int64_t step, int64_t *tok, int64_t *lab) {
    hp_err err;
    cr_assert_eq(hp_data_next(d, rank, step, tok, lab, &err), HP_OK, "%s", err.msg);
}

Test(data, builtin_corpus) {
    hp_data_config c = {.vocab = 2048, .batch = 4, .seq = 64, .world = 1, .seed = 7};
    hp_data *d = open_ok(c);
    const hp_data_info *info = hp_data_get_info(d);
    cr_expect(info->byte_level);
    cr_expect_gt(info->n_tokens, 100000, "the license texts are ~260 KB, got %lld",
                 (long long)info->n_tokens);
    cr_expect_eq(info->n_windows, (info->n_tokens - 1) / 64);
    int64_t tok[256], lab[256];
    next_ok(d, 0, 0, tok, lab);
    int printable = 0;
    for (int b = 0; b < 4; b++) {
        for (int t = 0; t < 64; t++) {
            int64_t v = tok[b * 64 + t];
            cr_assert(v >= 0 && v < 256);
            printable += (v >= 32 && v < 127) || v == '\n';
            if (t < 63) cr_assert_eq(lab[b * 64 + t], tok[b * 64 + t + 1]);
        }
    }
    cr_expect_gt(printable, 240, "English text: %d of 256 bytes printable", printable);
    /* the same step twice gives the same batch; another step another one */
    int64_t tok2[256], lab2[256];
    next_ok(d, 0, 0, tok2, lab2);
    cr_expect_eq(memcmp(tok, tok2, sizeof tok), 0);
    cr_expect_eq(memcmp(lab, lab2, sizeof lab), 0);
    next_ok(d, 0, 1, tok2, lab2);
    cr_expect_neq(memcmp(tok, tok2, sizeof tok), 0);
    hp_data_free(d);

    /* a model vocab < 256 sees bytes modulo vocab */
    c.vocab = 50;
    d = open_ok(c);
    next_ok(d, 0, 3, tok, lab);
    for (int i = 0; i < 256; i++) cr_assert(tok[i] < 50 && lab[i] < 50 && tok[i] >= 0);
    hp_data_free(d);
}

Test(data, text_file) {
    FILE *f = fopen(tpath("a.txt"), "w");
    fputs("abcdefghijklmnopqrstuvwxyz", f);
    fclose(f);
    char src[300];
    snprintf(src, sizeof src, "text:%s", tpath("a.txt"));
    hp_data_config c = {
        .path = src, .vocab = 256, .batch = 1, .seq = 5, .world = 1, .sequential = true};
    hp_data *d = open_ok(c);
    cr_expect_eq(hp_data_get_info(d)->n_tokens, 26);
    cr_expect_eq(hp_data_get_info(d)->n_windows, 5);
    int64_t tok[5], lab[5];
    next_ok(d, 0, 1, tok, lab); /* window 1: "fghij" -> "ghijk" */
    cr_expect(tok[0] == 'f' && tok[4] == 'j' && lab[0] == 'g' && lab[4] == 'k');
    next_ok(d, 0, 5, tok, lab); /* epoch 1 starts over (sequential) */
    cr_expect(tok[0] == 'a');
    hp_data_free(d);
}

Test(data, shards_dir_and_glob) {
    cr_assert_eq(mkdir(tpath("d"), 0755), 0);
    write_counting_shard(tpath("d/s_000.bin"), 0, 1000, 1);
    write_counting_shard(tpath("d/s_001.bin"), 1000, 500, 7);
    write_counting_shard(tpath("d/s_002.bin"), 1500, 10, 1); /* too short for one window */
    FILE *f = fopen(tpath("d/README.txt"), "w");
    fputs("not a shard", f);
    fclose(f);
    hp_data_config c = {
        .path = tpath("d"), .vocab = 5000, .batch = 3, .seq = 16, .world = 1, .sequential = true};
    hp_data *d = open_ok(c);
    const hp_data_info *info = hp_data_get_info(d);
    cr_expect_eq(info->n_shards, 3);
    cr_expect_eq(info->n_tokens, 1510);
    cr_expect_eq(info->n_windows, 999 / 16 + 499 / 16);
    cr_expect(!info->byte_level);
    int64_t tok[48], lab[48];
    /* sequential: sample g reads window g; window 62 is the first of shard 1 */
    next_ok(d, 0, 20, tok, lab);
    cr_expect_eq(tok[0], 60 * 16);
    cr_expect_eq(tok[16], 61 * 16);
    cr_expect_eq(tok[32], 1000, "window 62 starts shard 1, got %lld", (long long)tok[32]);
    cr_expect_eq(lab[47], 1000 + 16);
    uint64_t fp = info->fingerprint;
    hp_data_free(d);

    c.path = tpath("d/s_00[01].bin");
    d = open_ok(c);
    cr_expect_eq(hp_data_get_info(d)->n_shards, 2);
    cr_expect_eq(hp_data_get_info(d)->n_tokens, 1500);
    cr_expect_neq(hp_data_get_info(d)->fingerprint, fp);
    hp_data_free(d);

    c.path = tpath("d/s_001.bin");
    d = open_ok(c);
    cr_expect_eq(hp_data_get_info(d)->n_tokens, 500);
    next_ok(d, 0, 0, tok, lab);
    cr_expect_eq(tok[0], 1000);
    hp_data_free(d);
}

/* Opens path with vocab and expects status want and a message holding n1 and n2. */
static void expect_bad(const char *path, int64_t vocab, hp_status want, const char *n1,
                       const char *n2) {
    hp_data_config c = {.path = path, .vocab = vocab, .batch = 1, .seq = 4, .world = 1};
    hp_data *d = (hp_data *)1;
    hp_err err = {0};
    hp_status s = hp_data_open(&c, &d, &err);
    cr_expect_eq(s, want, "%s: status %s, want %s (%s)", path, hp_status_str(s),
                 hp_status_str(want), err.msg);
    cr_expect_null(d);
    if (n1) cr_expect(strstr(err.msg, n1), "message '%s' lacks '%s'", err.msg, n1);
    if (n2) cr_expect(strstr(err.msg, n2), "message '%s' lacks '%s'", err.msg, n2);
}

static void write_raw(const char *path, const int32_t *hdr, const void *body, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    if (hdr) fwrite(hdr, 4, HP_LLMC_HEADER_INTS, f);
    if (n) fwrite(body, 1, n, f);
    fclose(f);
}

Test(data, bad_shards) {
    int32_t h[HP_LLMC_HEADER_INTS] = {HP_LLMC_MAGIC_U16, 1, 8};
    uint16_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};

    write_raw(tpath("ok.bin"), h, toks, 16);
    hp_data_config c = {.path = tpath("ok.bin"), .vocab = 9, .batch = 1, .seq = 4, .world = 1};
    hp_data *d = open_ok(c);
    hp_data_free(d);

    expect_bad(tpath("ok.bin"), 8, HP_PARSE, "token 8 at index 7", "byte offset 1038");
    cr_expect(strstr(tpath("ok.bin"), "ok.bin"));
    expect_bad(tpath("ok.bin"), 8, HP_PARSE, "ok.bin", ">= vocab 8");

    int32_t bad_magic[HP_LLMC_HEADER_INTS] = {12345, 1, 8};
    write_raw(tpath("magic.bin"), bad_magic, toks, 16);
    expect_bad(tpath("magic.bin"), 100, HP_PARSE, "magic.bin", "magic 12345");

    int32_t bad_ver[HP_LLMC_HEADER_INTS] = {HP_LLMC_MAGIC_U16, 7, 8};
    write_raw(tpath("ver.bin"), bad_ver, toks, 16);
    expect_bad(tpath("ver.bin"), 100, HP_PARSE, "ver.bin", "version 7");
    int32_t bad_ver2[HP_LLMC_HEADER_INTS] = {HP_LLMC_MAGIC_U32, 1, 4};
    write_raw(tpath("ver2.bin"), bad_ver2, toks, 16);
    expect_bad(tpath("ver2.bin"), 100, HP_PARSE, "ver2.bin", "expected version 7");

    write_raw(tpath("short.bin"), NULL, h, 100);
    expect_bad(tpath("short.bin"), 100, HP_PARSE, "short.bin", "100 bytes");

    write_raw(tpath("trunc.bin"), h, toks, 15);
    expect_bad(tpath("trunc.bin"), 100, HP_PARSE, "says 8 tokens", "truncated");
    write_raw(tpath("long.bin"), h, toks, 16);
    FILE *f = fopen(tpath("long.bin"), "ab");
    fputc(0, f);
    fclose(f);
    expect_bad(tpath("long.bin"), 100, HP_PARSE, "long.bin", "trailing bytes");

    int32_t neg[HP_LLMC_HEADER_INTS] = {HP_LLMC_MAGIC_U16, 1, -5};
    write_raw(tpath("neg.bin"), neg, NULL, 0);
    expect_bad(tpath("neg.bin"), 100, HP_PARSE, "neg.bin", "-5");

    uint32_t big[2] = {3, 4000000000u};
    hp_err err;
    cr_assert_eq(hp_data_write_shard(tpath("u32.bin"), big, 2, 7, &err), HP_OK, "%s", err.msg);
    expect_bad(tpath("u32.bin"), 50000, HP_PARSE, "token 4000000000 at index 1", NULL);
    cr_expect_eq(hp_data_write_shard(tpath("x.bin"), big, 2, 1, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "4000000000"), "%s", err.msg);

    /* sources that do not exist or hold nothing */
    expect_bad(tpath("nope.bin"), 100, HP_IO, "nope.bin", NULL);
    cr_assert_eq(mkdir(tpath("empty"), 0755), 0);
    expect_bad(tpath("empty"), 100, HP_NOT_FOUND, "no *.bin", NULL);
    expect_bad(tpath("zz*.bin"), 100, HP_NOT_FOUND, "no file matches", NULL);
    /* a shard too short for one sample */
    int32_t tiny[HP_LLMC_HEADER_INTS] = {HP_LLMC_MAGIC_U16, 1, 3};
    write_raw(tpath("tiny.bin"), tiny, toks, 6);
    expect_bad(tpath("tiny.bin"), 100, HP_LIMIT, "5 tokens", NULL);
}

Test(data, config_errors) {
    hp_data *d;
    hp_err err;
    hp_data_config c = {.vocab = 0, .batch = 1, .seq = 4, .world = 1};
    cr_expect_eq(hp_data_open(&c, &d, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "vocab 0"), "%s", err.msg);
    c.vocab = 256;
    c.batch = 0;
    cr_expect_eq(hp_data_open(&c, &d, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "batch 0"), "%s", err.msg);
    c.batch = 1;
    c.world = 0;
    cr_expect_eq(hp_data_open(&c, &d, &err), HP_INVALID);
    c.world = 2;
    c.seq = -1;
    cr_expect_eq(hp_data_open(&c, &d, &err), HP_INVALID);
    c.seq = 4;
    d = open_ok(c);
    int64_t tok[4], lab[4];
    cr_expect_eq(hp_data_next(d, 2, 0, tok, lab, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "rank 2"), "%s", err.msg);
    cr_expect_eq(hp_data_next(d, -1, 0, tok, lab, &err), HP_INVALID);
    cr_expect_eq(hp_data_next(d, 0, -3, tok, lab, &err), HP_INVALID);
    cr_expect_eq(hp_data_next(d, 0, INT64_MAX / 2, tok, lab, &err), HP_LIMIT);
    hp_data_free(d);
}

/* N ranks' local batches, in rank order, are the world-1 batch of N*B; for several N. */
Test(data, world_equivalence) {
    write_counting_shard(tpath("w.bin"), 0, 5000, 7);
    const int64_t T = 8;
    hp_data_config c1 = {
        .path = tpath("w.bin"), .vocab = 1 << 20, .batch = 12, .seq = T, .world = 1, .seed = 42};
    hp_data *d1 = open_ok(c1);
    int64_t g_tok[12 * 8], g_lab[12 * 8], tok[12 * 8], lab[12 * 8];
    const int worlds[3] = {2, 3, 4};
    for (int wi = 0; wi < 3; wi++) {
        hp_data_config cn = c1;
        cn.world = worlds[wi];
        cn.batch = 12 / worlds[wi];
        hp_data *dn = open_ok(cn);
        for (int64_t step = 0; step < 200; step += 7) { /* crosses epochs (W = 624) */
            next_ok(d1, 0, step, g_tok, g_lab);
            for (int r = 0; r < cn.world; r++) {
                next_ok(dn, r, step, tok, lab);
                size_t off = (size_t)(r * cn.batch * T), n = (size_t)(cn.batch * T);
                cr_assert_eq(memcmp(tok, g_tok + off, n * 8), 0, "world %d rank %d step %lld",
                             cn.world, r, (long long)step);
                cr_assert_eq(memcmp(lab, g_lab + off, n * 8), 0);
            }
        }
        hp_data_free(dn);
    }
    hp_data_free(d1);
}

/* Within an epoch every window is read exactly once, across ranks; the next epoch reads them
 * again in another order; a different seed gives a different order. */
Test(data, epoch_coverage) {
    const int64_t T = 10, n = 1001; /* W = 100 windows */
    write_counting_shard(tpath("e.bin"), 0, n, 7);
    hp_data_config c = {
        .path = tpath("e.bin"), .vocab = 1 << 20, .batch = 5, .seq = T, .world = 2, .seed = 1};
    hp_data *d = open_ok(c);
    cr_assert_eq(hp_data_get_info(d)->n_windows, 100);
    int64_t order[2][100];
    for (int e = 0; e < 2; e++) {
        int seen[100] = {0};
        for (int64_t step = 10 * e; step < 10 * (e + 1); step++) {
            for (int r = 0; r < 2; r++) {
                int64_t tok[50], lab[50];
                next_ok(d, r, step, tok, lab);
                for (int b = 0; b < 5; b++) {
                    cr_assert_eq(tok[b * T] % T, 0);
                    int64_t w = tok[b * T] / T;
                    cr_assert(w >= 0 && w < 100);
                    seen[w]++;
                    order[e][(step - 10 * e) * 10 + r * 5 + b] = w;
                    for (int t = 0; t < T; t++) cr_assert_eq(lab[b * T + t], tok[b * T + t] + 1);
                }
            }
        }
        for (int w = 0; w < 100; w++) cr_assert_eq(seen[w], 1, "epoch %d window %d", e, w);
    }
    int in_order = 0, same = 0;
    for (int i = 0; i < 100; i++) {
        in_order += order[0][i] == i;
        same += order[0][i] == order[1][i];
    }
    cr_expect_lt(in_order, 20, "shuffled: %d of 100 windows in place", in_order);
    cr_expect_lt(same, 20, "epochs differ: %d of 100 windows at the same place", same);
    hp_data_position p = hp_data_position_at(d, 15);
    cr_expect(p.samples == 150 && p.epoch == 1);
    hp_data_free(d);

    c.seed = 2;
    d = open_ok(c);
    int64_t tok[50], lab[50];
    next_ok(d, 0, 0, tok, lab);
    int diff = 0;
    for (int b = 0; b < 5; b++) diff += tok[b * T] / T != order[0][b];
    cr_expect_gt(diff, 0, "another seed, another order");
    hp_data_free(d);
}

Test(data, fault_injection) {
    cr_assert_eq(mkdir(tpath("f"), 0755), 0);
    write_counting_shard(tpath("f/a.bin"), 0, 100, 1);
    write_counting_shard(tpath("f/b.bin"), 0, 100, 7);
    const char *paths[3] = {tpath("f"), NULL, tpath("f/*.bin")};
    for (int k = 0; k < 3; k++) {
        hp_data_config c = {.path = paths[k], .vocab = 256, .batch = 2, .seq = 8, .world = 1};
        int n;
        for (n = 0; n < 10000; n++) {
            hp_data *d = (hp_data *)1;
            hp_err err;
            hp_alloc_fail_at(n);
            hp_status s = hp_data_open(&c, &d, &err);
            hp_alloc_fail_at(-1);
            if (s == HP_OK) {
                hp_data_free(d);
                break;
            }
            cr_assert_eq(s, HP_NOMEM, "source %d, failing allocation %d: %s", k, n, err.msg);
            cr_assert_null(d);
        }
        cr_expect_gt(n, 0);
    }
}
