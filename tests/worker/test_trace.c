/* Per-rank Chrome/Perfetto traces (worker/trace.h, hp-worker --profile-steps): the recorder's
 * document (escaping, an empty step, the size bound, adds from many threads, allocation
 * failures), TrainConfig.profile_steps through the job's wire form, and the real binary at
 * world 2 writing one trace per rank and profiled step with compute and comm slices. */
#include "hp/job.h"
#include "tests/util/cli_harness.h"
#include "worker/trace.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parses a document, asserting it is one JSON object. */
static json_t *parse(const char *json, size_t len) {
    json_error_t je;
    json_t *doc = json_loadb(json, len, 0, &je);
    cr_assert(doc, "not JSON: %s (line %d): %.200s", je.text, je.line, json);
    cr_assert(json_is_object(doc));
    return doc;
}

static json_t *end_step(hp_trace *t, size_t max, int64_t *dropped) {
    char *json = NULL;
    size_t len = 0;
    hp_err err = {0};
    cr_assert_eq(hp_trace_end(t, max, &json, &len, dropped, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(strlen(json), len);
    json_t *doc = parse(json, len);
    hp_free(json);
    return doc;
}

/* The "X" events of a document. */
static size_t count_slices(json_t *doc, int tid) {
    json_t *ev = json_object_get(doc, "traceEvents"), *e;
    size_t i, n = 0;
    cr_assert(json_is_array(ev));
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (ph && !strcmp(ph, "X") &&
            (tid == 0 || json_integer_value(json_object_get(e, "tid")) == tid))
            n++;
    }
    return n;
}

/* Whether the document has the metadata event `name` (for tid > 0: of that thread) whose
 * args.name is `value`. */
static bool has_meta(json_t *doc, const char *name, int tid, const char *value) {
    json_t *ev = json_object_get(doc, "traceEvents"), *e;
    size_t i;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *n = json_string_value(json_object_get(e, "name"));
        if (!ph || strcmp(ph, "M") || !n || strcmp(n, name)) continue;
        if (tid > 0 && json_integer_value(json_object_get(e, "tid")) != tid) continue;
        const char *v = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        if (v && !strcmp(v, value)) return true;
    }
    return false;
}

/* ---- the recorder ---------------------------------------------------------------------------- */

Test(trace, empty_step_has_metadata_only) {
    hp_trace *t;
    cr_assert_eq(hp_trace_new(3, "job-a", &t, NULL), HP_OK);
    hp_trace_add(t, HP_TRACE_COMPUTE, "before", 1, 2, 0, -1); /* not recording: ignored */
    cr_assert(!hp_trace_recording(t));
    hp_trace_begin(t, 7);
    cr_assert(hp_trace_recording(t));
    json_t *doc = end_step(t, 0, NULL);
    cr_assert(!hp_trace_recording(t));
    cr_assert_eq(count_slices(doc, 0), 0);
    cr_assert(has_meta(doc, "process_name", 0, "rank 3"));
    cr_assert(has_meta(doc, "thread_name", HP_TRACE_COMPUTE, "compute"));
    cr_assert(has_meta(doc, "thread_name", HP_TRACE_COMM, "comm"));
    cr_assert_str_eq(json_string_value(json_object_get(doc, "displayTimeUnit")), "ms");
    json_t *other = json_object_get(doc, "otherData");
    cr_assert_eq(json_integer_value(json_object_get(other, "rank")), 3);
    cr_assert_eq(json_integer_value(json_object_get(other, "step")), 7);
    cr_assert_str_eq(json_string_value(json_object_get(other, "job")), "job-a");
    json_decref(doc);

    char *json = NULL;
    size_t len;
    hp_err err = {0};
    cr_assert_eq(hp_trace_end(t, 0, &json, &len, NULL, &err), HP_INVALID); /* not recording */
    cr_assert(strstr(err.msg, "no step"), "%s", err.msg);
    cr_assert_null(json);
    hp_trace_free(t);
    hp_trace_free(NULL);
}

Test(trace, odd_names_are_escaped) {
    static const char *names[] = {"quote\"back\\slash", "line\nbreak\ttab\x01", "</script>",
                                  "caf\xc3\xa9", "mm"};
    hp_trace *t;
    cr_assert_eq(hp_trace_new(0, "j\"ob\n", &t, NULL), HP_OK);
    hp_trace_begin(t, 1);
    double t0 = hp_trace_now_s();
    for (int i = 0; i < 5; i++)
        hp_trace_add(t, i % 2 ? HP_TRACE_COMM : HP_TRACE_COMPUTE, names[i], t0 + i, t0 + i + 0.5, i,
                     i % 2 ? 100 : -1);
    hp_trace_add(t, HP_TRACE_COMPUTE, "bad\xff\xfeutf8", t0, t0, -1, -1);
    hp_trace_add(t, HP_TRACE_COMPUTE, "", t0, t0 - 1, -1, -1); /* empty name, negative span */
    json_t *doc = end_step(t, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "otherData"), "job")),
                     "j\"ob\n");
    json_t *ev = json_object_get(doc, "traceEvents"), *e;
    size_t i, k = 0;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
        const char *name = json_string_value(json_object_get(e, "name"));
        cr_assert(name && name[0]);
        if (k < 5) cr_assert_str_eq(name, names[k]);
        if (k == 5) cr_assert_str_eq(name, "bad??utf8");
        cr_assert_geq(json_number_value(json_object_get(e, "dur")), 0);
        cr_assert_gt(json_number_value(json_object_get(e, "ts")), 0);
        json_t *args = json_object_get(e, "args");
        if (k < 5) {
            cr_assert_eq(json_integer_value(json_object_get(args, "instr")), (json_int_t)k);
            cr_assert_eq(json_object_get(args, "bytes") != NULL, k % 2 == 1);
            cr_assert_str_eq(json_string_value(json_object_get(e, "cat")),
                             k % 2 ? "comm" : "compute");
        }
        k++;
    }
    cr_assert_eq(k, 7);
    json_decref(doc);
    hp_trace_free(t);
}

Test(trace, a_bound_drops_slices_to_fit) {
    hp_trace *t;
    cr_assert_eq(hp_trace_new(1, "j", &t, NULL), HP_OK);
    hp_trace_begin(t, 2);
    for (int i = 0; i < 5000; i++) hp_trace_add(t, 1 + i % 2, "all_gather", i, i + 1, i, 4096);
    int64_t dropped = 0;
    char *json = NULL;
    size_t len = 0;
    cr_assert_eq(hp_trace_end(t, 100000, &json, &len, &dropped, NULL), HP_OK);
    cr_assert_leq(len, 100000);
    cr_assert_gt(dropped, 0);
    json_t *doc = parse(json, len);
    cr_assert_eq(count_slices(doc, 0) + (size_t)dropped, 5000);
    json_t *other = json_object_get(doc, "otherData");
    cr_assert_eq(json_integer_value(json_object_get(other, "dropped_slices")), dropped);
    json_decref(doc);
    hp_free(json);

    hp_trace_begin(t, 3); /* a new step starts empty */
    hp_err err = {0};
    cr_assert_eq(hp_trace_end(t, 10, &json, &len, NULL, &err), HP_LIMIT);
    cr_assert(strstr(err.msg, "step 3"), "%s", err.msg);
    hp_trace_free(t);
}

static void *adder(void *arg) {
    hp_trace *t = arg;
    for (int i = 0; i < 2000; i++) hp_trace_add(t, HP_TRACE_COMM, "reduce_scatter", i, i + 1, i, 8);
    return NULL;
}

Test(trace, adds_from_many_threads) {
    hp_trace *t;
    cr_assert_eq(hp_trace_new(0, NULL, &t, NULL), HP_OK);
    hp_trace_begin(t, 1);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, adder, t), 0);
    for (int i = 0; i < 2000; i++) hp_trace_add(t, HP_TRACE_COMPUTE, "mm", i, i + 1, i, -1);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    json_t *doc = end_step(t, 0, NULL);
    cr_assert_eq(count_slices(doc, HP_TRACE_COMM), 8000);
    cr_assert_eq(count_slices(doc, HP_TRACE_COMPUTE), 2000);
    json_decref(doc);
    hp_trace_free(t);
}

Test(trace, allocation_failures_leak_nothing) {
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hp_trace *t = NULL;
        hp_status st = hp_trace_new(0, "j", &t, NULL);
        char *json = NULL;
        size_t len = 0;
        if (st == HP_OK) {
            hp_trace_begin(t, 1);
            for (int i = 0; i < 3000; i++) hp_trace_add(t, 1, "mm", i, i + 1, i, -1);
            st = hp_trace_end(t, 0, &json, &len, NULL, NULL);
        }
        long made = hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            json_t *doc = parse(json, len);
            json_decref(doc);
        }
        hp_free(json);
        hp_trace_free(t);
        if (st == HP_OK && made <= n) break; /* no allocation failed: done */
        cr_assert(n < 100);
    }
}

/* ---- a tiny FSDP job ------------------------------------------------------------------------- */

static char tmp[256];

static void setup(void) {
    hp_th_tmpdir_make(tmp, sizeof tmp, "hp-trace");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmp);
}

#define MARKS "--fsdp 'layers.*' --fsdp 'tok_embeddings.*' --fsdp 'output.*' --fsdp 'norm.*'"

static void make_job(const char *path) {
    hp_th_run r = hp_th_run_bin(tmp, "client/hpctl",
                                "new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 "
                                "--kv-heads 2 --ffn-hidden 128 --vocab 256 --batch 4 --seq 32 "
                                "--steps 4 --log-interval 1 " MARKS " --mesh dp=2 -o %s",
                                path);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
}

/* ---- the job's profile_steps ----------------------------------------------------------------- */

Test(trace, profile_steps_survive_the_wire_form, .init = setup, .fini = teardown) {
    char path[512];
    snprintf(path, sizeof path, "%s/job.pb", tmp);
    make_job(path);
    hp_job *job = NULL, *back = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_job_read_file(path, &job, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(job->train.n_profile_steps, 0);
    job->train.n_profile_steps = 2;
    job->train.profile_steps[0] = 5;
    job->train.profile_steps[1] = 9;
    cr_assert_eq(hp_job_write_file(path, job, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_job_read_file(path, &back, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(back->train.n_profile_steps, 2);
    cr_assert_eq(back->train.profile_steps[1], 9);
    cr_assert(hp_job_eq(job, back));
    hp_job_free(back);
    back = NULL;

    hp_arena a;
    hp_arena_init(&a);
    Hp__V1__Job *msg = NULL;
    cr_assert_eq(hp_job_export(job, &a, &msg, &err), HP_OK, "%s", err.msg);
    msg->train->profile_steps[0] = 0; /* a step must be >= 1 */
    cr_assert_neq(hp_job_import(msg, &back, &err), HP_OK);
    cr_assert(strstr(err.msg, "profile_steps"), "%s", err.msg);
    hp_arena_fini(&a);
    hp_job_free(job);
}

/* ---- hp-worker --profile-steps --------------------------------------------------------------- */

/* Checks one rank's trace of one step. */
static void check_trace(const char *path, int rank, int step) {
    char *text = hp_th_slurp(path);
    json_t *doc = parse(text, strlen(text));
    free(text);
    json_t *other = json_object_get(doc, "otherData");
    cr_assert_eq(json_integer_value(json_object_get(other, "rank")), rank, "%s", path);
    cr_assert_eq(json_integer_value(json_object_get(other, "step")), step, "%s", path);
    char pname[32];
    snprintf(pname, sizeof pname, "rank %d", rank);
    cr_assert(has_meta(doc, "process_name", 0, pname), "%s", path);
    cr_assert(has_meta(doc, "thread_name", 1, "compute"), "%s", path);
    cr_assert(has_meta(doc, "thread_name", 2, "comm"), "%s", path);
    bool gather = false, scatter = false, wait = false;
    size_t compute = 0, comm = 0, i;
    json_t *e;
    json_array_foreach(json_object_get(doc, "traceEvents"), i, e) {
        cr_assert_eq(json_integer_value(json_object_get(e, "pid")), rank);
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        cr_assert(name && name[0], "%s: a slice without a name", path);
        cr_assert(json_is_number(json_object_get(e, "ts")) &&
                  json_is_number(json_object_get(e, "dur")));
        cr_assert_geq(json_number_value(json_object_get(e, "ts")), 0);
        cr_assert_geq(json_number_value(json_object_get(e, "dur")), 0);
        cr_assert(json_is_object(json_object_get(e, "args")));
        cr_assert(tid == 1 || tid == 2, "%s: tid %lld", path, (long long)tid);
        cr_assert_str_eq(cat, tid == 1 ? "compute" : "comm");
        if (tid == 1) compute++;
        if (tid == 2) comm++;
        if (tid == 1 && strstr(name, "wait")) wait = true;
        if (tid == 2 && strstr(name, "all_gather")) gather = true;
        if (tid == 2 && strstr(name, "reduce_scatter")) {
            scatter = true;
            cr_assert_gt(json_integer_value(json_object_get(json_object_get(e, "args"), "bytes")),
                         0);
        }
    }
    cr_assert_gt(compute, 10, "%s", path);
    cr_assert_gt(comm, 0, "%s", path);
    cr_assert(gather && scatter, "%s: no all_gather or reduce_scatter on the comm track", path);
    cr_assert(wait, "%s: no wait on the compute track", path);
    json_decref(doc);
}

Test(trace, world_2_writes_a_trace_per_rank_and_profiled_step, .init = setup, .fini = teardown,
     .timeout = 300) {
    char job[512], out[512], path[600];
    snprintf(job, sizeof job, "%s/job.pb", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    make_job(job);
    hp_th_run r = hp_th_run_bin(tmp, "worker/hp-worker",
                                "--standalone %s --world 2 --threads 1 --out %s "
                                "--profile-steps 2,3",
                                job, out);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "done: steps 1..4"), "%s", r.out);
    cr_assert_null(strstr(r.out, "trace"), "%s", r.out); /* nothing extra on stdout */
    hp_th_run_free(&r);
    for (int step = 1; step <= 4; step++)
        for (int rank = 0; rank < 2; rank++) {
            snprintf(path, sizeof path, "%s/traces/step-%d-rank-%d.json", out, step, rank);
            bool want = step == 2 || step == 3;
            cr_assert_eq(access(path, F_OK) == 0, want, "%s", path);
            if (want) check_trace(path, rank, step);
        }
}

Test(trace, bad_profile_steps_are_usage_errors, .init = setup, .fini = teardown) {
    static const struct {
        const char *arg, *want;
    } cases[] = {{"2,x", "'x'"}, {"0", "'0'"}, {"-1", "'-1'"},  {"5,,6", "''"},
                 {"3,", "''"},   {"", "''"},   {"1.5", "'1.5'"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hp_th_run r =
            hp_th_run_bin(tmp, "worker/hp-worker",
                          "--standalone /nonexistent.pb --profile-steps '%s'", cases[i].arg);
        cr_assert(strstr(r.err, "--profile-steps"), "%s: %s", cases[i].arg, r.err);
        hp_th_expect_cli_error(r, 2, "hp-worker", cases[i].want);
    }
    /* coordinator mode checks the flag before it connects */
    hp_th_run r = hp_th_run_bin(tmp, "worker/hp-worker",
                                "--coordinator 127.0.0.1:1 --job j --rank 0 --token t "
                                "--profile-steps 4,five");
    hp_th_expect_cli_error(r, 2, "hp-worker", "'five'");
}
