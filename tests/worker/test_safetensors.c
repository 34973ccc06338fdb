/* tests/worker/test_safetensors.c — the safetensors reader and writer: round trips, every
 * validation error (named tensor and field), truncation and byte-flip robustness, the
 * allocation fault loop, and interop with PyTorch both ways (tests/worker/st_torch.py, which
 * parses and writes the format by hand: Debian has no `safetensors` Python package).
 * A missing python3-torch is a failure, not a skip.
 */
#include "hp/safetensors.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_st_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(safetensors, .init = make_tmp, .fini = rm_tmp);

/* A file image: 8-byte length, header text, data bytes. */
static uint8_t *image(const char *header, const void *data, size_t dlen, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + dlen;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    return b;
}

/* Parses header+data; expects status want and a message containing each of the needles. */
static void expect_bad(const char *header, size_t dlen, hp_status want, const char *n1,
                       const char *n2) {
    uint8_t data[256] = {0};
    size_t len;
    uint8_t *b = image(header, data, dlen, &len);
    hp_st_file *f = (hp_st_file *)1;
    hp_err err = {0};
    hp_status s = hp_st_parse(b, len, "x.safetensors", &f, &err);
    cr_expect_eq(s, want, "header %s: status %s, want %s (%s)", header, hp_status_str(s),
                 hp_status_str(want), err.msg);
    cr_expect_null(f);
    if (n1) cr_expect(strstr(err.msg, n1), "message '%s' lacks '%s'", err.msg, n1);
    if (n2) cr_expect(strstr(err.msg, n2), "message '%s' lacks '%s'", err.msg, n2);
    cr_expect(strstr(err.msg, "x.safetensors"), "message '%s' lacks the file name", err.msg);
    free(b);
}

Test(safetensors, round_trip) {
    float a[6] = {1, 2, 3, 4, 5, -6.5f};
    uint16_t b[4] = {0x3f80, 0xc000, 0x3f00, 0x4050}; /* bf16 1, -2, 0.5, 3.25 */
    int64_t c = -123456789012345;
    uint8_t d[3] = {1, 0, 1};
    hp_st_tensor ts[5] = {
        {.name = "layers.0.w",
         .dtype = HP_ST_F32,
         .rank = 2,
         .shape = {2, 3},
         .data = a,
         .nbytes = 24},
        {.name = "b", .dtype = HP_ST_BF16, .rank = 1, .shape = {4}, .data = b, .nbytes = 8},
        {.name = "scalar", .dtype = HP_ST_I64, .rank = 0, .data = &c, .nbytes = 8},
        {.name = "empty", .dtype = HP_ST_F32, .rank = 2, .shape = {0, 5}, .nbytes = 0},
        {.name = "mask", .dtype = HP_ST_BOOL, .rank = 1, .shape = {3}, .data = d, .nbytes = 3},
    };
    hp_st_kv meta[2] = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"q\""}};
    char path[128];
    snprintf(path, sizeof path, "%s/a.safetensors", tmpdir);
    hp_err err = {0};
    cr_assert_eq(hp_st_write(path, ts, 5, meta, 2, &err), HP_OK, "%s", err.msg);

    hp_st_file *f;
    cr_assert_eq(hp_st_open(path, &f, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_st_count(f), 5);
    cr_assert_eq(hp_st_meta_count(f), 2);
    cr_expect_str_eq(hp_st_meta_get(f, "format"), "pt");
    cr_expect_str_eq(hp_st_meta_get(f, "note"), "h\xc3\xa9llo \"q\"");
    cr_expect_null(hp_st_meta_get(f, "nope"));
    for (int i = 0; i < 5; i++) {
        const hp_st_tensor *t = hp_st_find(f, ts[i].name);
        cr_assert_not_null(t, "%s", ts[i].name);
        cr_expect_eq(t->dtype, ts[i].dtype);
        cr_expect_eq(t->rank, ts[i].rank);
        for (int d = 0; d < t->rank; d++) cr_expect_eq(t->shape[d], ts[i].shape[d]);
        cr_assert_eq(t->nbytes, ts[i].nbytes);
        if (t->nbytes) cr_expect_eq(memcmp(t->data, ts[i].data, t->nbytes), 0, "%s", t->name);
    }
    /* file order is the write order */
    cr_expect_str_eq(hp_st_at(f, 0)->name, "layers.0.w");
    const hp_st_tensor *t;
    cr_expect_eq(hp_st_get(f, "missing", &t, &err), HP_NOT_FOUND);
    cr_expect(strstr(err.msg, "missing"));
    float fb[4];
    cr_assert_eq(hp_st_to_f32(hp_st_find(f, "b"), fb, 4, &err), HP_OK);
    cr_expect(fb[0] == 1 && fb[1] == -2 && fb[2] == 0.5f && fb[3] == 3.25f);
    cr_expect_eq(hp_st_to_f32(hp_st_find(f, "mask"), fb, 3, &err), HP_INVALID);
    hp_st_close(f);

    /* the header is padded to a multiple of 8 */
    FILE *fp = fopen(path, "rb");
    uint64_t hlen;
    cr_assert_eq(fread(&hlen, 8, 1, fp), 1);
    fclose(fp);
    cr_expect_eq(hlen % 8, 0);
}

Test(safetensors, f16_conversion) {
    uint16_t h[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x0000}; /* 1 -2 65504 2^-24 inf 0 */
    hp_st_tensor t = {
        .name = "h", .dtype = HP_ST_F16, .rank = 1, .shape = {6}, .data = h, .nbytes = 12};
    float f[6];
    cr_assert_eq(hp_st_to_f32(&t, f, 6, NULL), HP_OK);
    cr_expect(f[0] == 1 && f[1] == -2 && f[2] == 65504 && f[3] == ldexpf(1, -24) && isinf(f[4]) &&
              f[5] == 0);
    cr_expect_eq(hp_st_to_f32(&t, f, 5, NULL), HP_INVALID);
}

Test(safetensors, header_errors) {
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, HP_PARSE,
               "header JSON", NULL);
    expect_bad("[1,2]", 0, HP_PARSE, "JSON object", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, HP_PARSE, "duplicate", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, HP_PARSE,
               "'a'", "dtype 'F31'");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, HP_PARSE, "'a'", "'dtype'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, HP_PARSE, "'a'", "'shape'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, HP_PARSE, "'a'", "'data_offsets'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, HP_PARSE,
               "'a'", "shape[0] = -1");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, HP_PARSE,
               "'a'", "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               4, HP_PARSE, "'a'", "9 dims");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
               "\"data_offsets\":[0,4]}}",
               4, HP_PARSE, "'a'", "elements");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 8, HP_PARSE,
               "'a'", "out of range");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,0]}}", 8, HP_PARSE,
               "'a'", "data_offsets [4, 0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, HP_PARSE, "'a'",
               "two integers");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16, HP_PARSE,
               "'a'", "needs 16");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, HP_PARSE, "'b'", "gap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, HP_PARSE, "'b'", "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, HP_PARSE,
               "'a'", "gap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, HP_PARSE,
               "cover 4 bytes", "has 8");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, HP_PARSE, "'k'", "not a string");
    expect_bad("{\"__metadata__\":[]}", 0, HP_PARSE, "__metadata__", NULL);
    expect_bad("{\"a\":7}", 0, HP_PARSE, "'a'", "not a JSON object");
    expect_bad(" {}", 0, HP_PARSE, "JSON object", NULL);
}

Test(safetensors, length_errors) {
    hp_err err;
    hp_st_file *f;
    uint8_t small[5] = {0};
    cr_expect_eq(hp_st_parse(small, 5, "s", &f, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "shorter than the 8-byte"), "%s", err.msg);
    uint8_t big[16] = {0, 0, 0, 0, 0, 0, 0, 0x10, '{', '}'}; /* 2^60 */
    cr_expect_eq(hp_st_parse(big, 16, "s", &f, &err), HP_LIMIT);
    cr_expect(strstr(err.msg, "exceeds the limit"), "%s", err.msg);
    uint8_t past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_expect_eq(hp_st_parse(past, 16, "s", &f, &err), HP_PARSE);
    cr_expect(strstr(err.msg, "exceeds the file"), "%s", err.msg);
    /* an empty set of tensors is valid */
    uint8_t empty[10] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_assert_eq(hp_st_parse(empty, 10, "s", &f, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_st_count(f), 0);
    hp_st_close(f);
    /* a header padded with spaces, as the reference writer does */
    size_t len;
    float one = 1;
    uint8_t *b = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}      ",
                       &one, 4, &len);
    cr_assert_eq(hp_st_parse(b, len, "s", &f, &err), HP_OK, "%s", err.msg);
    cr_expect_eq(hp_st_find(f, "a")->rank, 0);
    hp_st_close(f);
    free(b);
    cr_expect_eq(hp_st_open("/nonexistent/x.safetensors", &f, &err), HP_IO);
    cr_expect(strstr(err.msg, "/nonexistent/x.safetensors"));
}

Test(safetensors, write_errors) {
    float a[2] = {1, 2};
    char path[128];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    hp_err err;
    hp_st_tensor ts[2] = {
        {.name = "a", .dtype = HP_ST_F32, .rank = 1, .shape = {2}, .data = a, .nbytes = 8},
        {.name = "a", .dtype = HP_ST_F32, .rank = 1, .shape = {2}, .data = a, .nbytes = 8},
    };
    cr_expect_eq(hp_st_write(path, ts, 2, NULL, 0, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'a' appears twice"), "%s", err.msg);
    ts[1].name = "b";
    ts[1].nbytes = 4;
    cr_expect_eq(hp_st_write(path, ts, 2, NULL, 0, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'b'") && strstr(err.msg, "nbytes 4"), "%s", err.msg);
    ts[1].nbytes = 8;
    ts[1].name = "__metadata__";
    cr_expect_eq(hp_st_write(path, ts, 2, NULL, 0, &err), HP_INVALID);
    ts[1].name = "bad\xff";
    cr_expect_eq(hp_st_write(path, ts, 2, NULL, 0, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "UTF-8"), "%s", err.msg);
    ts[1].name = "b";
    ts[1].shape[0] = -2;
    cr_expect_eq(hp_st_write(path, ts, 2, NULL, 0, &err), HP_INVALID);
    ts[1].shape[0] = 2;
    hp_st_kv meta[2] = {{"k", "1"}, {"k", "2"}};
    cr_expect_eq(hp_st_write(path, ts, 2, meta, 2, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "'k' appears twice"), "%s", err.msg);
    cr_expect_eq(access(path, F_OK), -1, "nothing written on error");
    cr_expect_eq(hp_st_write("/nonexistent/dir/x.safetensors", ts, 2, NULL, 0, &err), HP_IO);
    cr_expect(strstr(err.msg, "/nonexistent/dir/x.safetensors"), "%s", err.msg);
}

/* Truncating a valid file anywhere, or flipping any header byte, gives an error or a valid
 * file, never a crash (ASan checks the reads). */
Test(safetensors, truncation_and_flips) {
    float a[6] = {0};
    int64_t b[3] = {0};
    hp_st_tensor ts[2] = {
        {.name = "a", .dtype = HP_ST_F32, .rank = 2, .shape = {2, 3}, .data = a, .nbytes = 24},
        {.name = "b", .dtype = HP_ST_I64, .rank = 1, .shape = {3}, .data = b, .nbytes = 24},
    };
    hp_st_kv meta[1] = {{"k", "v"}};
    char path[128];
    snprintf(path, sizeof path, "%s/t.safetensors", tmpdir);
    cr_assert_eq(hp_st_write(path, ts, 2, meta, 1, NULL), HP_OK);
    FILE *fp = fopen(path, "rb");
    uint8_t buf[512];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    hp_st_file *f;
    hp_err err;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact-size copy: ASan sees any over-read */
        memcpy(copy, buf, cut);
        cr_expect_neq(hp_st_parse(copy, cut, "t", &f, &err), HP_OK, "cut at %zu accepted", cut);
        free(copy);
    }
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    int ok = 0;
    for (size_t i = 0; i < 8 + hlen; i++) {
        for (int bit = 0; bit < 8; bit++) {
            uint8_t *copy = malloc(len);
            memcpy(copy, buf, len);
            copy[i] ^= (uint8_t)(1u << bit);
            if (hp_st_parse(copy, len, "t", &f, &err) == HP_OK) {
                ok++;
                hp_st_close(f);
            }
            free(copy);
        }
    }
    cr_expect_lt(ok, 8 * (int)(8 + hlen), "most flips are rejected");
}

Test(safetensors, fault_injection) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    hp_st_tensor ts[2] = {
        {.name = "a", .dtype = HP_ST_F32, .rank = 2, .shape = {2, 3}, .data = a, .nbytes = 24},
        {.name = "c", .dtype = HP_ST_F32, .rank = 1, .shape = {2}, .data = a, .nbytes = 8},
    };
    hp_st_kv meta[2] = {{"k", "v"}, {"x", "y"}};
    char path[128];
    snprintf(path, sizeof path, "%s/f.safetensors", tmpdir);
    hp_err err;
    int n;
    for (n = 0; n < 10000; n++) {
        hp_alloc_fail_at(n);
        hp_status s = hp_st_write(path, ts, 2, meta, 2, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) break;
        cr_assert_eq(s, HP_NOMEM, "write, failing allocation %d: %s", n, err.msg);
    }
    cr_expect_gt(n, 0);
    for (n = 0; n < 10000; n++) {
        hp_st_file *f = NULL;
        hp_alloc_fail_at(n);
        hp_status s = hp_st_open(path, &f, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            cr_expect_eq(hp_st_count(f), 2);
            hp_st_close(f);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "open, failing allocation %d: %s", n, err.msg);
        cr_assert_null(f);
    }
    cr_expect_gt(n, 0);
}

static const char *source_dir(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    return src && src[0] ? src : HP_SOURCE_DIR;
}

static void run_py(const char *mode, const char *file) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/worker/st_torch.py' %s '%s'",
             source_dir(), mode, file);
    int st = system(cmd);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code == 3 || code == 127)
        cr_assert_fail("python3-torch is missing (%s exited %d): run scripts/install-deps.sh", cmd,
                       code);
    cr_assert_eq(code, 0, "%s exited %d", cmd, code);
}

/* C writes, PyTorch reads and checks every value (st_torch.py check). */
Test(safetensors, torch_reads_ours) {
    float a[6];
    for (int i = 0; i < 6; i++) a[i] = (float)i * 0.5f - 1;
    uint16_t b[4] = {0x3f80, 0xc000, 0x3f00, 0x4050}; /* 1 -2 0.5 3.25 */
    uint16_t c[3] = {0x2e66, 0xc780, 0x7bff};         /* f16 0.1 -7.5 65504 */
    int64_t d[4] = {-((int64_t)1 << 40), 1, 2, 3};
    int32_t e[5] = {-2, -1, 0, 1, 2};
    uint8_t m[3] = {1, 0, 1};
    hp_st_tensor ts[7] = {
        {.name = "a", .dtype = HP_ST_F32, .rank = 2, .shape = {2, 3}, .data = a, .nbytes = 24},
        {.name = "b", .dtype = HP_ST_BF16, .rank = 1, .shape = {4}, .data = b, .nbytes = 8},
        {.name = "c", .dtype = HP_ST_F16, .rank = 1, .shape = {3}, .data = c, .nbytes = 6},
        {.name = "d", .dtype = HP_ST_I64, .rank = 2, .shape = {2, 2}, .data = d, .nbytes = 32},
        {.name = "e", .dtype = HP_ST_I32, .rank = 1, .shape = {5}, .data = e, .nbytes = 20},
        {.name = "f", .dtype = HP_ST_BOOL, .rank = 1, .shape = {3}, .data = m, .nbytes = 3},
        {.name = "g", .dtype = HP_ST_F32, .rank = 2, .shape = {0, 4}, .nbytes = 0},
    };
    hp_st_kv meta[1] = {{"format", "pt"}};
    char path[128];
    snprintf(path, sizeof path, "%s/ours.safetensors", tmpdir);
    hp_err err;
    cr_assert_eq(hp_st_write(path, ts, 7, meta, 1, &err), HP_OK, "%s", err.msg);
    run_py("check", path);
}

/* PyTorch writes (st_torch.py write), C reads and checks every value. */
Test(safetensors, we_read_torch) {
    char path[128];
    snprintf(path, sizeof path, "%s/torch.safetensors", tmpdir);
    run_py("write", path);
    hp_st_file *f;
    hp_err err;
    cr_assert_eq(hp_st_open(path, &f, &err), HP_OK, "%s", err.msg);
    cr_expect_str_eq(hp_st_meta_get(f, "format"), "pt");
    const hp_st_tensor *x = hp_st_find(f, "x"), *y = hp_st_find(f, "y"), *z = hp_st_find(f, "z"),
                       *w = hp_st_find(f, "w");
    cr_assert(x && y && z && w);
    cr_assert(x->dtype == HP_ST_F32 && x->rank == 2 && x->shape[0] == 3 && x->shape[1] == 2);
    float xv[6];
    cr_assert_eq(hp_st_to_f32(x, xv, 6, &err), HP_OK);
    for (int i = 0; i < 6; i++)
        cr_expect_float_eq(xv[i], -1.0f + 0.4f * (float)i, 1e-6, "x[%d] = %g", i, xv[i]);
    float yv[2], wv[2];
    cr_assert_eq(y->dtype, HP_ST_BF16);
    cr_assert_eq(hp_st_to_f32(y, yv, 2, &err), HP_OK);
    cr_expect(yv[0] == 1.5f && yv[1] == -0.25f);
    cr_assert_eq(w->dtype, HP_ST_F16);
    cr_assert_eq(hp_st_to_f32(w, wv, 2, &err), HP_OK);
    cr_expect(wv[0] == 0.5f && wv[1] == -2.0f);
    cr_assert(z->dtype == HP_ST_I64 && z->shape[0] == 3);
    int64_t zv[3];
    memcpy(zv, z->data, sizeof zv);
    cr_expect(zv[0] == 7 && zv[1] == -8 && zv[2] == ((int64_t)1 << 50));
    hp_st_close(f);
}
