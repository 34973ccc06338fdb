/* The worker protocol's framing (hp/frame.h): round trips, frames split at every byte, bounds
 * on the length prefix, garbage and truncated input, random bytes, and a fault-injection loop
 * over encoding and decoding (nothing leaks under ASan, every failure is reported). */
#include "hp/frame.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static Hp__V1__Hello hello;
static Hp__V1__Frame frame;

static void make_hello(void) {
    hp__v1__hello__init(&hello);
    hello.protocol_version = HP_PROTOCOL_VERSION;
    hello.job_id = "job-42";
    hello.rank = 3;
    hello.token = "secret";
    hello.pid = 1234;
    hello.hostname = "host";
    hello.device = "cpu";
    hp__v1__frame__init(&frame);
    frame.seq = 7;
    frame.body_case = HP__V1__FRAME__BODY_HELLO;
    frame.hello = &hello;
}

static void check_hello(const Hp__V1__Frame *f) {
    cr_assert_eq(f->seq, 7);
    cr_assert_eq(f->body_case, HP__V1__FRAME__BODY_HELLO);
    cr_assert_str_eq(f->hello->job_id, "job-42");
    cr_assert_str_eq(f->hello->token, "secret");
    cr_assert_eq(f->hello->rank, 3);
    cr_assert_eq(f->hello->pid, 1234);
}

Test(frame, round_trip) {
    make_hello();
    uint8_t *buf;
    size_t len;
    cr_assert_eq(hp_frame_encode(&frame, &buf, &len, NULL), HP_OK);
    cr_assert_eq(len, 4 + hp__v1__frame__get_packed_size(&frame));
    cr_assert_eq(buf[0] | buf[1] << 8 | buf[2] << 16 | buf[3] << 24, (int)len - 4);
    hp_frame_reader r;
    hp_frame_reader_init(&r, HP_FRAME_MAX);
    /* two frames in one feed come out one by one */
    cr_assert_eq(hp_frame_reader_feed(&r, buf, len, NULL), HP_OK);
    cr_assert_eq(hp_frame_reader_feed(&r, buf, len, NULL), HP_OK);
    for (int i = 0; i < 2; i++) {
        Hp__V1__Frame *f;
        cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
        cr_assert(f);
        check_hello(f);
        hp_frame_free(f);
    }
    Hp__V1__Frame *f;
    cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
    cr_assert_null(f);
    cr_assert_eq(r.len, 0);
    hp_frame_reader_fini(&r);
    hp_free(buf);
    hp_frame_free(NULL);
}

Test(frame, empty_frame) {
    Hp__V1__Frame empty = HP__V1__FRAME__INIT;
    uint8_t *buf;
    size_t len;
    cr_assert_eq(hp_frame_encode(&empty, &buf, &len, NULL), HP_OK);
    cr_assert_eq(len, 4);
    hp_frame_reader r;
    hp_frame_reader_init(&r, 16);
    cr_assert_eq(hp_frame_reader_feed(&r, buf, len, NULL), HP_OK);
    Hp__V1__Frame *f;
    cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
    cr_assert(f);
    cr_assert_eq(f->body_case, HP__V1__FRAME__BODY__NOT_SET);
    hp_frame_free(f);
    hp_frame_reader_fini(&r);
    hp_free(buf);
}

Test(frame, split_byte_by_byte) {
    make_hello();
    uint8_t *buf;
    size_t len;
    cr_assert_eq(hp_frame_encode(&frame, &buf, &len, NULL), HP_OK);
    hp_frame_reader r;
    hp_frame_reader_init(&r, 1024);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < len; i++) {
            Hp__V1__Frame *f;
            cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
            cr_assert_null(f, "a frame after %zu of %zu bytes", i, len);
            cr_assert_eq(hp_frame_reader_feed(&r, buf + i, 1, NULL), HP_OK);
        }
        Hp__V1__Frame *f;
        cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
        cr_assert(f);
        check_hello(f);
        hp_frame_free(f);
    }
    hp_frame_reader_fini(&r);
    hp_free(buf);
}

Test(frame, oversized_length) {
    hp_frame_reader r;
    hp_frame_reader_init(&r, 100);
    uint8_t hdr[4] = {101, 0, 0, 0};
    cr_assert_eq(hp_frame_reader_feed(&r, hdr, 4, NULL), HP_OK);
    Hp__V1__Frame *f;
    hp_err err = {0};
    cr_assert_eq(hp_frame_reader_next(&r, &f, &err), HP_LIMIT);
    cr_assert_null(f);
    cr_assert(strstr(err.msg, "101"), "%s", err.msg);
    hp_frame_reader_fini(&r);

    /* a length near 4 GiB is refused from the prefix alone, before any buffering */
    hp_frame_reader_init(&r, HP_FRAME_MAX);
    uint8_t big[4] = {0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(hp_frame_reader_feed(&r, big, 4, NULL), HP_OK);
    cr_assert_eq(hp_frame_reader_next(&r, &f, &err), HP_LIMIT);
    cr_assert_null(f);
    hp_frame_reader_fini(&r);

    /* flooding: more than max + 4 bytes buffered */
    hp_frame_reader_init(&r, 100);
    uint8_t junk[200] = {0};
    cr_assert_eq(hp_frame_reader_feed(&r, junk, 104, NULL), HP_OK);
    cr_assert_eq(hp_frame_reader_feed(&r, junk, 1, &err), HP_LIMIT);
    cr_assert_eq(hp_frame_reader_feed(&r, junk, 200, &err), HP_LIMIT);
    hp_frame_reader_fini(&r);
}

Test(frame, encode_over_limit) {
    static Hp__V1__LogLine log = HP__V1__LOG_LINE__INIT;
    size_t n = HP_FRAME_MAX + 1;
    char *text = malloc(n + 1);
    cr_assert(text);
    memset(text, 'x', n);
    text[n] = 0;
    log.text = text;
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_LOG;
    f.log = &log;
    uint8_t *buf;
    size_t len;
    hp_err err = {0};
    cr_assert_eq(hp_frame_encode(&f, &buf, &len, &err), HP_LIMIT);
    cr_assert_null(buf);
    free(text);
}

Test(frame, garbage) {
    /* a length of 3, then a field tag with wire type 7 (invalid) */
    uint8_t bad[] = {3, 0, 0, 0, 0x0f, 0xff, 0xff};
    hp_frame_reader r;
    hp_frame_reader_init(&r, 1024);
    cr_assert_eq(hp_frame_reader_feed(&r, bad, sizeof bad, NULL), HP_OK);
    Hp__V1__Frame *f;
    hp_err err = {0};
    cr_assert_eq(hp_frame_reader_next(&r, &f, &err), HP_PARSE);
    cr_assert_null(f);
    cr_assert(strstr(err.msg, "frame"), "%s", err.msg);
    hp_frame_reader_fini(&r);
}

Test(frame, truncated) {
    make_hello();
    uint8_t *buf;
    size_t len;
    cr_assert_eq(hp_frame_encode(&frame, &buf, &len, NULL), HP_OK);
    /* the message cut short but the prefix claiming the cut length: not a Frame */
    for (size_t cut = 1; cut < len - 4; cut++) {
        uint8_t *copy = malloc(4 + cut);
        memcpy(copy + 4, buf + 4, cut);
        for (int i = 0; i < 4; i++) copy[i] = (uint8_t)(cut >> (8 * i));
        hp_frame_reader r;
        hp_frame_reader_init(&r, 1024);
        cr_assert_eq(hp_frame_reader_feed(&r, copy, 4 + cut, NULL), HP_OK);
        Hp__V1__Frame *f = NULL;
        hp_status s = hp_frame_reader_next(&r, &f, NULL);
        /* some prefixes end on a field boundary and decode as a shorter frame */
        cr_assert(s == HP_OK || s == HP_PARSE, "cut %zu: %d", cut, s);
        if (s == HP_OK) cr_assert(f);
        hp_frame_free(f);
        hp_frame_reader_fini(&r);
        free(copy);
    }
    hp_free(buf);
}

Test(frame, random_bytes) {
    srand(12345);
    for (int iter = 0; iter < 2000; iter++) {
        uint8_t data[256];
        size_t n = (size_t)(rand() % (int)sizeof data);
        for (size_t i = 0; i < n; i++) data[i] = (uint8_t)rand();
        if (n >= 4 && iter % 2) { /* a plausible length half the time */
            size_t l = (n - 4) ? (size_t)rand() % (n - 4 + 1) : 0;
            for (int i = 0; i < 4; i++) data[i] = (uint8_t)(l >> (8 * i));
        }
        hp_frame_reader r;
        hp_frame_reader_init(&r, 512);
        /* feed in random pieces, draining after each like a real reader */
        size_t off = 0;
        bool dead = false;
        while (off < n && !dead) {
            size_t k = 1 + (size_t)rand() % (n - off);
            if (hp_frame_reader_feed(&r, data + off, k, NULL) != HP_OK) break;
            off += k;
            for (;;) {
                Hp__V1__Frame *f;
                if (hp_frame_reader_next(&r, &f, NULL) != HP_OK) {
                    dead = true;
                    break;
                }
                if (!f) break;
                hp_frame_free(f);
            }
        }
        hp_frame_reader_fini(&r);
    }
}

/* Fail every allocation of an encode + feed + decode in turn: each failure is HP_NOMEM and
 * leaks nothing; a decode that failed for memory succeeds on retry. */
Test(frame, fault_injection) {
    static Hp__V1__Welcome welcome = HP__V1__WELCOME__INIT;
    static Hp__V1__CommSetup comm = HP__V1__COMM_SETUP__INIT;
    comm.backend = "shm";
    comm.shm_name = "hp-test";
    welcome.protocol_version = 1;
    welcome.world_size = 2;
    welcome.run_dir = "/tmp/run";
    welcome.comm = &comm;
    Hp__V1__Frame w = HP__V1__FRAME__INIT;
    w.body_case = HP__V1__FRAME__BODY_WELCOME;
    w.welcome = &welcome;
    int ok_runs = 0;
    for (long n = 0; n < 200; n++) {
        hp_alloc_fail_at(n);
        uint8_t *buf = NULL;
        size_t len;
        hp_frame_reader r;
        hp_frame_reader_init(&r, 1024);
        Hp__V1__Frame *f = NULL;
        hp_err err = {0};
        hp_status s = hp_frame_encode(&w, &buf, &len, &err);
        if (s == HP_OK) s = hp_frame_reader_feed(&r, buf, len, &err);
        if (s == HP_OK) s = hp_frame_reader_next(&r, &f, &err);
        bool decoding = s != HP_OK && len > 0 && r.len == len;
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            cr_assert(f);
            cr_assert_str_eq(f->welcome->comm->shm_name, "hp-test");
            ok_runs++;
        } else {
            cr_assert_eq(s, HP_NOMEM, "n=%ld: %s", n, err.msg);
            cr_assert_null(f);
            if (decoding) { /* the bytes stayed: a retry decodes them */
                cr_assert_eq(hp_frame_reader_next(&r, &f, NULL), HP_OK);
                cr_assert(f);
            }
        }
        hp_frame_free(f);
        hp_frame_reader_fini(&r);
        hp_free(buf);
        if (ok_runs) break;
    }
    cr_assert_eq(ok_runs, 1);
}

/* Field number 0 with its tag varint padded ("82 00"), at the top and inside a Hello:
 * protobuf-c keeps it as an unknown field, and re-encoding it would make bytes no decoder
 * accepts (found by tests/fuzz/fuzz_frame.c). The reader refuses it. */
Test(frame, field_number_zero) {
    static const uint8_t top[] = {5, 0, 0, 0, 0x08, 0x03, 0x82, 0x00, 0x00};
    static const uint8_t nested[] = {7, 0, 0, 0, 0x08, 0x03, 0x52, 0x03, 0x82, 0x00, 0x00};
    const uint8_t *cases[] = {top, nested};
    const size_t lens[] = {sizeof top, sizeof nested};
    for (int i = 0; i < 2; i++) {
        hp_frame_reader r;
        hp_frame_reader_init(&r, 100);
        cr_assert_eq(hp_frame_reader_feed(&r, cases[i], lens[i], NULL), HP_OK);
        Hp__V1__Frame *f;
        hp_err err = {0};
        cr_assert_eq(hp_frame_reader_next(&r, &f, &err), HP_PARSE, "case %d", i);
        cr_assert_null(f);
        cr_assert(strstr(err.msg, "field number 0"), "%s", err.msg);
        hp_frame_reader_fini(&r);
    }
}
