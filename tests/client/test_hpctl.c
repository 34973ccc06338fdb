/* hpctl as a user runs it: the real binary, its exit codes, its one-line errors, and its
 * outputs read back (the --hpir text parses to the job's graph; --json is valid JSON). */
#include "hp/device.h"
#include "hp/job.h"
#include "hp/text.h"
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void setup(void) {
    hp_th_tmpdir_make(tmpdir, sizeof tmpdir, "hpctl-test");
}
static void teardown(void) {
    hp_th_tmpdir_remove(tmpdir);
}

/* args are already a full command line (no format) */
static hp_th_run hpctl(const char *args) {
    return hp_th_run_bin(tmpdir, "client/hpctl", "%s", args);
}

static void expect_error(const char *args, int code, const char *want) {
    hp_th_expect_cli_error(hpctl(args), code, "hpctl", want);
}

TestSuite(hpctl, .init = setup, .fini = teardown, .timeout = 120);

Test(hpctl, new_then_inspect_debugmodel) {
    char args[512];
    snprintf(args, sizeof args,
             "new --model llama3:debugmodel --batch 2 --seq 64 --steps 30 "
             "--lr 1e-3 --decay cosine -o %s/job.pb",
             tmpdir);
    hp_th_run r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);

    snprintf(args, sizeof args, "inspect %s/job.pb", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "parameters  6,163,712"), "%s", r.out);
    cr_expect(strstr(r.out, "2 x seq 64 per step"), "%s", r.out);
    cr_expect(strstr(r.out, "30 steps"), "%s", r.out);
    cr_expect(strstr(r.out, "cosine decay"), "%s", r.out);
    cr_expect(strstr(r.out, "58 outputs (loss + 57 gradients)"), "%s", r.out);
    cr_expect(strstr(r.out, "job         debugmodel"), "%s", r.out);
    hp_th_run_free(&r);

    /* --hpir prints the graph: it parses back to the very graph in the job file */
    snprintf(args, sizeof args, "inspect %s/job.pb --hpir", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_graph_parse(r.out, strlen(r.out), &g, &e), HP_OK, "%s", e.msg);
    hp_job *job = NULL;
    snprintf(args, sizeof args, "%s/job.pb", tmpdir);
    cr_assert_eq(hp_job_read_file(args, &job, &e), HP_OK, "%s", e.msg);
    cr_expect(hp_graph_eq(g, job->graph));
    cr_expect_eq(job->train.steps, 30);
    cr_expect_eq(job->train.decay, HP_DECAY_COSINE);
    cr_expect_eq(job->train.local_batch, 2);
    cr_expect_eq(job->train.seq, 64);
    hp_job_free(job);
    hp_graph_free(g);
    hp_th_run_free(&r);

    snprintf(args, sizeof args, "inspect %s/job.pb --json", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_error_t je;
    json_t *root = json_loads(r.out, 0, &je);
    cr_assert(root, "invalid JSON: %s", je.text);
    cr_expect_eq(json_integer_value(json_object_get(root, "params")), 6163712);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(root, "graph"), "outputs")),
                 58);
    json_decref(root);
    hp_th_run_free(&r);
}

/* --device writes the job's device (default cpu); inspect and plan show it, and the plan
 * says when this build cannot run it. */
Test(hpctl, device_flag) {
    char args[512];
    const char *small = "--model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                        "--ffn-hidden 96 --vocab 256 --batch 2 --seq 32";
    snprintf(args, sizeof args, "new %s -o %s/cpu.pb", small, tmpdir);
    hp_th_run r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "new %s --device cuda -o %s/cuda.pb", small, tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    hp_job *job = NULL;
    snprintf(args, sizeof args, "%s/cuda.pb", tmpdir);
    cr_assert_eq(hp_job_read_file(args, &job, NULL), HP_OK);
    cr_expect_eq(job->resources.device, HP_DEVICE_CUDA);
    cr_expect_eq(job->resources.gpus_per_node, 1);
    hp_job_free(job);
    snprintf(args, sizeof args, "%s/cpu.pb", tmpdir);
    cr_assert_eq(hp_job_read_file(args, &job, NULL), HP_OK);
    cr_expect_eq(job->resources.device, HP_DEVICE_CPU);
    hp_job_free(job);

    snprintf(args, sizeof args, "inspect %s/cuda.pb", tmpdir);
    r = hpctl(args);
    cr_expect(strstr(r.out, "resources   world 1, device cuda"), "%s", r.out);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "inspect %s/cuda.pb --json", tmpdir);
    r = hpctl(args);
    json_t *root = json_loads(r.out, 0, NULL);
    cr_assert(root, "%s", r.out);
    cr_expect_str_eq(
        json_string_value(json_object_get(json_object_get(root, "resources"), "device")), "cuda");
    json_decref(root);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "plan %s/cuda.pb", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "device cuda"), "%s", r.out);
    bool built = hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK;
    cr_expect_eq(strstr(r.out, "refuse the job") != NULL, !built, "%s", r.out);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "plan %s/cpu.pb --json", tmpdir);
    r = hpctl(args);
    root = json_loads(r.out, 0, NULL);
    cr_assert(root, "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(root, "device")), "cpu");
    cr_expect(json_is_true(json_object_get(root, "device_runnable")));
    json_decref(root);
    hp_th_run_free(&r);
}

Test(hpctl, usage_errors_exit_2) {
    expect_error("", 2, "missing verb");
    expect_error("frobnicate", 2, "unknown verb 'frobnicate'");
    expect_error("new -o x.pb", 2, "--model is required");
    expect_error("new --model llama3:debugmodel", 2, "-o JOB.pb is required");
    expect_error("new --model llama3:tiny9 -o x.pb", 2, "tiny9");
    expect_error("new --model gpt9 -o x.pb", 2, "gpt9");
    expect_error("new --model llama3:debugmodel --batch 0 -o x.pb", 2, "--batch: 0 is outside");
    expect_error("new --model llama3:debugmodel --batch x -o x.pb", 2, "'x' is not an integer");
    expect_error("new --model llama3:debugmodel --lr nan -o x.pb", 2, "--lr: 'nan'");
    expect_error("new --model llama3:debugmodel --heads 5 -o x.pb", 2, "heads");
    expect_error("new --model llama3:debugmodel --decay step -o x.pb", 2, "--decay: 'step'");
    expect_error("new --model llama3:debugmodel --steps 3 --warmup 4 -o x.pb", 2,
                 "--warmup: 4 steps exceed --steps 3");
    expect_error("new --model llama3:debugmodel --on-nonfinite ignore -o x.pb", 2,
                 "--on-nonfinite: 'ignore' is not stop or skip");
    expect_error("new --model llama3:debugmodel --bogus 1 -o x.pb", 2, "unknown flag '--bogus'");
    expect_error("new --model llama3:debugmodel --batch", 2, "--batch: missing value");
    expect_error("new --model llama3:debugmodel --device tpu -o x.pb", 2,
                 "--device: device 'tpu' is unknown (expected cpu or cuda)");
    expect_error("new --model llama3:debugmodel --device", 2, "--device: missing value");
    /* a flag that swallowed the next flag leaves a stray argument: named as one */
    expect_error("new --model llama3:debugmodel --fsdp -o x.pb", 2, "unexpected argument 'x.pb'");
    expect_error("new --model llama3:debugmodel --wat", 2, "unknown flag '--wat'");
    expect_error("inspect", 2, "which job file");
    expect_error("inspect a.pb --wat", 2, "unknown flag '--wat'");
}

/* A job hp-worker cannot train (the mlp's data inputs are not token data) is still written, for
 * hpctl plan and inspect, with one warning line saying that hpd and hp-worker refuse it. */
Test(hpctl, new_warns_of_an_untrainable_job) {
    char args[512];
    snprintf(args, sizeof args, "new --model mlp -o %s/mlp.pb", tmpdir);
    hp_th_run r = hpctl(args);
    cr_expect_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "hpctl: new: warning: data input 'x': training reads token data") &&
                  strstr(r.err, "hpd and hp-worker refuse to train it"),
              "stderr: %s", r.err);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "new --model llama3:debugmodel --steps 1 -o %s/l.pb", tmpdir);
    r = hpctl(args);
    cr_expect_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect_str_empty(r.err, "a trainable job warned: %s", r.err);
    hp_th_run_free(&r);
}

/* The common flags may come before the verb (hpctl --server X submit job.pb); anything else
 * there is refused by name, and a verb that takes no such flag refuses it, never ignores it. */
Test(hpctl, common_flags_before_the_verb) {
    expect_error("--bogus status j-1", 2, "unknown flag '--bogus' before the verb");
    expect_error("--server", 2, "--server needs a value");
    expect_error("--server 127.0.0.1:1 --timeout", 2, "--timeout needs a value");
    expect_error("--server 127.0.0.1:1", 2, "missing verb after the flags");
    expect_error("--timeout 0 status j-1", 2, "--timeout: 0 is outside");
    expect_error("--server 127.0.0.1:1 frobnicate", 2, "unknown verb 'frobnicate'");
    /* offline verbs take no server: refused, naming the flag */
    expect_error("--server 127.0.0.1:1 inspect job.pb", 2, "inspect: unknown flag '--server'");
    /* the flag before the verb is the one used: this address refuses connections */
    hp_th_run r = hpctl("--server 127.0.0.1:1 --timeout 2 status j-1");
    cr_expect_eq(r.code, 1, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "hpctl: status: UNAVAILABLE") && strstr(r.err, "127.0.0.1:1"),
              "stderr: %s", r.err);
    hp_th_run_free(&r);
    /* --json before an offline verb that takes it */
    char args[512];
    snprintf(args, sizeof args, "new --model llama3:debugmodel --layers 1 -o %s/j.pb", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    snprintf(args, sizeof args, "--json inspect %s/j.pb", tmpdir);
    r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_error_t je;
    json_t *j = json_loads(r.out, 0, &je);
    cr_expect(j && json_is_object(j), "not JSON: %s", r.out);
    json_decref(j);
    hp_th_run_free(&r);
}

Test(hpctl, bad_files_exit_1) {
    char args[512], path[300];
    snprintf(args, sizeof args, "inspect %s/missing.pb", tmpdir);
    expect_error(args, 1, "missing.pb");

    /* garbage */
    snprintf(path, sizeof path, "%s/garbage.pb", tmpdir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 4096; i++) fputc((i * 7919 + 13) & 0xff, f);
    fclose(f);
    snprintf(args, sizeof args, "inspect %s", path);
    expect_error(args, 1, "garbage.pb");

    /* a valid job cut in half */
    snprintf(args, sizeof args, "new --model mlp -o %s/ok.pb", tmpdir);
    hp_th_run r = hpctl(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    hp_th_run_free(&r);
    snprintf(path, sizeof path, "%s/ok.pb", tmpdir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(truncate(path, st.st_size / 2), 0);
    snprintf(args, sizeof args, "inspect %s", path);
    expect_error(args, 1, "ok.pb");

    /* a directory */
    snprintf(args, sizeof args, "inspect %s", tmpdir);
    expect_error(args, 1, "not a regular file");

    /* a FIFO with no writer: refused at once (open never blocks), not waited on forever */
    snprintf(path, sizeof path, "%s/fifo.pb", tmpdir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    for (const char **verb = (const char *[]){"inspect", "plan", NULL}; *verb; verb++) {
        r = hp_th_hpctl(tmpdir, 20, "%s %s", *verb, path);
        cr_expect_neq(r.code, 124, "%s: hung on the fifo", *verb);
        hp_th_expect_cli_error(r, 1, "hpctl", "fifo.pb: not a regular file (a fifo)");
    }

    /* an unwritable output */
    expect_error("new --model mlp -o /nonexistent-dir/x.pb", 1, "/nonexistent-dir/x.pb");
}

/* --on-nonfinite: stop by default, skip when asked; written into the job file (train field
 * 20) and shown by inspect. */
Test(hpctl, on_nonfinite_flag) {
    char args[512];
    hp_err e;
    for (int skip = 0; skip < 2; skip++) {
        snprintf(args, sizeof args, "new --model mlp %s -o %s/j.pb",
                 skip ? "--on-nonfinite skip" : "", tmpdir);
        hp_th_run r = hpctl(args);
        cr_assert_eq(r.code, 0, "%s", r.err);
        hp_th_run_free(&r);
        hp_job *job = NULL;
        snprintf(args, sizeof args, "%s/j.pb", tmpdir);
        cr_assert_eq(hp_job_read_file(args, &job, &e), HP_OK, "%s", e.msg);
        cr_expect_eq(job->train.on_nonfinite, skip ? HP_NONFINITE_SKIP : HP_NONFINITE_STOP);
        hp_job_free(job);
        snprintf(args, sizeof args, "inspect %s/j.pb --json", tmpdir);
        r = hpctl(args);
        cr_assert_eq(r.code, 0, "%s", r.err);
        cr_expect(strstr(r.out, skip ? "\"on_nonfinite\": \"skip\"" : "\"on_nonfinite\": \"stop\""),
                  "%s", r.out);
        hp_th_run_free(&r);
    }
}
