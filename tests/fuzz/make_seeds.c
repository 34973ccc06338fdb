/* tests/fuzz/make_seeds.c — writes the seed corpora that need hp's own writers:
 *   hp_fuzz_seeds OUT JOB.pb...
 * OUT/program/ (each job compiled for its world and hp_program_pack'd), OUT/frame/ (Hello,
 * Heartbeat, Done and a Welcome carrying the first program, each after the chunk-size byte
 * fuzz_frame.c reads first), OUT/safetensors/ (hp_st_write), OUT/shard/ (hp_data_write_shard,
 * versions 1 and 7) and OUT/ckpt_index/ (the index hp_ckpt_commit writes for the fixture).
 * scripts/fuzz-seeds.sh runs it; the output is committed under tests/fuzz/corpus/.
 */
#include "hp/checkpoint.h"
#include "hp/data.h"
#include "hp/frame.h"
#include "hp/job.h"
#include "hp/passes.h"
#include "hp/program.h"
#include "hp/safetensors.h"

#include "fuzz_ckpt_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *out;

static void die(const char *what, const hp_err *e) {
    fprintf(stderr, "hp_fuzz_seeds: %s: %s\n", what, e ? e->msg : "failed");
    exit(1);
}

static void put(const char *sub, const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out, sub);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/%s/%s", out, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) die(path, NULL);
}

static void put_frame(const char *name, const Hp__V1__Frame *f, uint8_t chunk) {
    uint8_t *enc = NULL;
    size_t len = 0;
    hp_err e;
    if (hp_frame_encode(f, &enc, &len, &e) != HP_OK) die(name, &e);
    uint8_t *b = malloc(len + 1);
    b[0] = chunk;
    memcpy(b + 1, enc, len);
    put("frame", name, b, len + 1);
    free(b);
    hp_free(enc);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: hp_fuzz_seeds OUT JOB.pb...\n");
        return 2;
    }
    out = argv[1];
    mkdir(out, 0777);
    hp_err e;
    uint8_t *prog0 = NULL;
    size_t prog0_len = 0;
    for (int i = 2; i < argc; i++) {
        uint8_t *buf = NULL, *pp = NULL;
        size_t len = 0, pl = 0;
        hp_job *job = NULL;
        hp_compiled *c = NULL;
        if (hp_file_read(argv[i], (size_t)64 << 20, &buf, &len, &e) != HP_OK) die(argv[i], &e);
        if (hp_job_unpack(buf, len, &job, &e) != HP_OK) die(argv[i], &e);
        if (hp_compile(job, 0, &c, &e) != HP_OK) die(argv[i], &e);
        if (hp_program_pack(c->program, &pp, &pl, &e) != HP_OK) die(argv[i], &e);
        const char *base = strrchr(argv[i], '/');
        char name[256];
        snprintf(name, sizeof name, "%s", base ? base + 1 : argv[i]);
        put("program", name, pp, pl);
        if (!prog0) {
            prog0 = pp, prog0_len = pl;
        } else {
            hp_free(pp);
        }
        hp_compiled_free(c);
        hp_job_free(job);
        hp_free(buf);
    }

    /* frames */
    Hp__V1__Hello hello = HP__V1__HELLO__INIT;
    hello.protocol_version = HP_PROTOCOL_VERSION, hello.job_id = "j-000001", hello.rank = 1;
    hello.token = "0123456789abcdef", hello.pid = 4242, hello.hostname = "node-1";
    hello.device = "cpu";
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.seq = 1, f.body_case = HP__V1__FRAME__BODY_HELLO, f.hello = &hello;
    put_frame("hello", &f, 255);
    put_frame("hello-bytewise", &f, 0);
    Hp__V1__Heartbeat hb = HP__V1__HEARTBEAT__INIT;
    hb.step = 12, hb.time_unix_s = 1.7e9;
    Hp__V1__Frame g = HP__V1__FRAME__INIT;
    g.seq = 2, g.body_case = HP__V1__FRAME__BODY_HEARTBEAT, g.heartbeat = &hb;
    put_frame("heartbeat", &g, 7);
    Hp__V1__Done done = HP__V1__DONE__INIT;
    done.ok = 0, done.final_step = 3, done.error = "rank 1: out of memory";
    Hp__V1__Frame h = HP__V1__FRAME__INIT;
    h.seq = 3, h.body_case = HP__V1__FRAME__BODY_DONE, h.done = &done;
    put_frame("done", &h, 31);
    if (prog0) {
        Hp__V1__Program *p = hp__v1__program__unpack(NULL, prog0_len, prog0);
        if (!p) die("program", NULL);
        Hp__V1__Welcome w = HP__V1__WELCOME__INIT;
        w.protocol_version = HP_PROTOCOL_VERSION, w.world_size = 1, w.program = p;
        w.heartbeat_interval_ms = 1000, w.run_dir = "/tmp/run";
        Hp__V1__Frame k = HP__V1__FRAME__INIT;
        k.seq = 1, k.body_case = HP__V1__FRAME__BODY_WELCOME, k.welcome = &w;
        put_frame("welcome", &k, 127);
        hp__v1__program__free_unpacked(p, NULL);
        hp_free(prog0);
    }

    /* safetensors */
    char tmp[4096], path[4200];
    snprintf(tmp, sizeof tmp, "%s/hp-seeds-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp)) die("mkdtemp", NULL);
    {
        float w[6] = {1, 2, 3, 4, 5, 6};
        uint16_t bf[4] = {0x3f80, 0x4000, 0xbf80, 0};
        int64_t ids[3] = {1, 2, 3};
        hp_st_tensor ts[3] = {
            {.name = "layers.0.w",
             .dtype = HP_ST_F32,
             .rank = 2,
             .shape = {2, 3},
             .data = w,
             .nbytes = sizeof w},
            {.name = "norm",
             .dtype = HP_ST_BF16,
             .rank = 1,
             .shape = {4},
             .data = bf,
             .nbytes = sizeof bf},
            {.name = "ids",
             .dtype = HP_ST_I64,
             .rank = 1,
             .shape = {3},
             .data = ids,
             .nbytes = sizeof ids},
        };
        hp_st_kv meta[1] = {{.key = "format", .value = "pt"}};
        const struct {
            const char *name;
            int n, n_meta;
        } files[] = {{"three", 3, 1}, {"one", 1, 0}, {"empty", 0, 0}};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(path, sizeof path, "%s/%s.safetensors", tmp, files[i].name);
            if (hp_st_write(path, ts, files[i].n, meta, files[i].n_meta, &e) != HP_OK)
                die(path, &e);
            uint8_t *b = NULL;
            size_t l = 0;
            if (hp_file_read(path, 1 << 20, &b, &l, &e) != HP_OK) die(path, &e);
            put("safetensors", files[i].name, b, l);
            hp_free(b);
        }
    }

    /* llm.c shards */
    {
        uint32_t tok[40];
        for (int i = 0; i < 40; i++) tok[i] = (uint32_t)(i * 977 % 50000);
        for (int v = 1; v <= 7; v += 6) {
            snprintf(path, sizeof path, "%s/v%d.bin", tmp, v);
            if (hp_data_write_shard(path, tok, 40, v, &e) != HP_OK) die(path, &e);
            uint8_t *b = NULL;
            size_t l = 0;
            if (hp_file_read(path, 1 << 20, &b, &l, &e) != HP_OK) die(path, &e);
            char name[16];
            snprintf(name, sizeof name, "v%d", v);
            put("shard", name, b, l);
            hp_free(b);
        }
    }

    /* the checkpoint index */
    {
        snprintf(path, sizeof path, "%s/ckpt", tmp);
        if (hp_fuzz_ckpt_save(path) != HP_OK) die("checkpoint", NULL);
        snprintf(path, sizeof path, "%s/ckpt/step-%08d/%s", tmp, HP_FUZZ_CKPT_STEP, HP_CKPT_INDEX);
        uint8_t *b = NULL;
        size_t l = 0;
        if (hp_file_read(path, 1 << 20, &b, &l, &e) != HP_OK) die(path, &e);
        put("ckpt_index", "index.json", b, l);
        hp_free(b);
    }
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : 1;
}
