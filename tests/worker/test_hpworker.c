/* hp-worker as an operator runs it: the real binary, killed with SIGKILL mid-run and resumed
 * (the losses after the resume equal an uninterrupted run's, bit for bit), and stopped with
 * Ctrl-C (SIGINT: it finishes the step, writes a checkpoint and exits 130), and a cuda job
 * refused at start where there is no CUDA. */
#include "hp/checkpoint.h"
#include "hp/device.h"
#include "worker/backend.h"
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/hp-worker-XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(hpworker, .init = setup, .fini = teardown, .timeout = 300);

/* A tiny Llama job: steps, checkpoint interval. */
static void make_job(const char *path, int steps, int ckpt) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new --model llama3:debugmodel --dim 128 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn-hidden 256 --vocab 256 --batch 4 --seq 128 --steps %d "
             "--log-interval 1 --checkpoint-interval %d -o %s >/dev/null",
             HP_BINARY_DIR, steps, ckpt, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static pid_t start_worker(const char *job, const char *out, const char *extra) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char bin[512];
        snprintf(bin, sizeof bin, "%s/worker/hp-worker", HP_BINARY_DIR);
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        if (extra)
            execl(bin, bin, "--standalone", job, "--out", out, "--threads", "1", extra, out,
                  (char *)NULL);
        else
            execl(bin, bin, "--standalone", job, "--out", out, "--threads", "1", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Lines in DIR/metrics.jsonl so far. */
static int count_lines(const char *dir) {
    char path[512], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    while (fgets(line, sizeof line, f)) n++;
    fclose(f);
    return n;
}

/* The "loss" texts of DIR/metrics.jsonl (compared as text: bit-exact at %.17g). */
static int read_losses(const char *dir, char losses[][40], int max) {
    char path[512], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\"loss\":");
        cr_assert(p);
        p += 7;
        size_t k = strcspn(p, ",}");
        snprintf(losses[n++], 40, "%.*s", (int)k, p);
    }
    fclose(f);
    return n;
}

static void wait_lines(const char *dir, int n, pid_t pid) {
    for (int i = 0; i < 30000 && count_lines(dir) < n; i++) {
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "hp-worker ended early");
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert_geq(count_lines(dir), n, "hp-worker made no progress");
}

static int wait_exit(pid_t pid) {
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(hpworker, sigkill_then_resume_equals_uninterrupted) {
    char job[300], a[300], b[300];
    snprintf(job, sizeof job, "%s/job.pb", tmp);
    snprintf(a, sizeof a, "%s/a", tmp);
    snprintf(b, sizeof b, "%s/b", tmp);
    make_job(job, 20, 10);
    cr_assert_eq(wait_exit(start_worker(job, a, NULL)), 0);

    pid_t pid = start_worker(job, b, NULL);
    wait_lines(b, 12, pid); /* past the step-10 checkpoint */
    kill(pid, SIGKILL);
    wait_exit(pid);
    int seen = count_lines(b);
    int64_t step = -1;
    char root[400];
    snprintf(root, sizeof root, "%s/checkpoints", b);
    cr_assert_eq(hp_ckpt_latest(root, &step, NULL), HP_OK);
    cr_assert_eq(step, 10);
    cr_assert_eq(wait_exit(start_worker(job, b, "--resume")), 0);

    char la[64][40], lb[64][40];
    cr_assert_eq(read_losses(a, la, 64), 20);
    /* the resume dropped the records after its step 10 (metrics.jsonl holds each step once):
     * 1..10 from before the kill, 11..20 from the resume, all as uninterrupted */
    int n = read_losses(b, lb, 64);
    cr_assert_eq(n, 20, "%d lines after resume, %d before the kill", n, seen);
    for (int i = 0; i < 20; i++)
        cr_expect_str_eq(lb[i], la[i], "step %d (%s the resume)", i + 1,
                         i < 10 ? "before" : "after");
}

Test(hpworker, ctrl_c_stops_after_the_step_with_a_checkpoint) {
    char job[300], out[300];
    snprintf(job, sizeof job, "%s/job.pb", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    make_job(job, 100000, 0);
    pid_t pid = start_worker(job, out, NULL);
    wait_lines(out, 3, pid);
    kill(pid, SIGINT);
    cr_assert_eq(wait_exit(pid), 130);
    int64_t step = -1;
    char root[400];
    snprintf(root, sizeof root, "%s/checkpoints", out);
    cr_assert_eq(hp_ckpt_latest(root, &step, NULL), HP_OK);
    cr_expect_eq(step, count_lines(out), "the checkpoint is the last step logged");
}

/* A cuda job on a machine (or build) without CUDA: one line on stderr, exit 1, nothing run:
 * no metrics, no checkpoint; the --world launcher refuses before starting any rank. */
Test(hpworker, cuda_job_without_cuda_fails_at_start) {
    char cmd[2048], job[300], err[300], out[300];
    snprintf(job, sizeof job, "%s/cuda.pb", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn-hidden 96 --vocab 256 --batch 4 --seq 32 --steps 2 --device cuda "
             "-o %s >/dev/null",
             HP_BINARY_DIR, job);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    /* built without CUDA, or built with it on a machine without a device: either way one line
     * before any rank starts */
    bool built = hp_device_built(HP_DEVICE_CUDA, NULL) == HP_OK;
    if (built && hp_backend_available(HP_DEVICE_CUDA, NULL) == HP_OK) {
        teardown(); /* Criterion runs no .fini after a skip */
        cr_skip_test("a CUDA device is present");
    }
    const char *want = built ? "hp-worker: device cuda: no CUDA device ("
                             : "hp-worker: device cuda: this hp-worker was built without CUDA";
    for (int world = 1; world <= 2; world++) {
        snprintf(cmd, sizeof cmd,
                 "%s/worker/hp-worker --standalone %s --world %d --out %s >/dev/null 2>%s",
                 HP_BINARY_DIR, job, world, out, err);
        int st = system(cmd);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "world %d: status %d", world, st);
        char text[1024] = "";
        FILE *f = fopen(err, "r");
        cr_assert(f);
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
        cr_expect(!strncmp(text, want, strlen(want)), "world %d: %s", world, text);
        cr_expect(strchr(text, '\n') == text + n - 1, "not one line: %s", text);
        cr_expect_eq(count_lines(out), 0, "it trained");
    }
}

/* A job whose graph the data loader cannot feed (the mlp reads 'x' and 'y') is refused before
 * any rank starts, with one line naming the input. */
Test(hpworker, untrainable_job_fails_at_start) {
    char cmd[1024], job[300];
    snprintf(job, sizeof job, "%s/mlp.pb", tmp);
    snprintf(cmd, sizeof cmd, "%s/client/hpctl new --model mlp -o %s >/dev/null 2>&1",
             HP_BINARY_DIR, job);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    for (int world = 1; world <= 2; world++) {
        hp_th_run r = hp_th_run_bin(tmp, "worker/hp-worker",
                                    "--standalone %s --world %d --out %s/o", job, world, tmp);
        hp_th_expect_cli_error(r, 1, "hp-worker",
                               "data input 'x': training reads token data into inputs named "
                               "'tokens' and 'labels' only");
    }
}

/* TMP/NAME.pb: a 1-layer debugmodel job (dim 64, batch 4 x seq 16) with the plan in flags. */
static void new_small_job(char *job, size_t cap, const char *name, const char *flags) {
    char cmd[2048];
    snprintf(job, cap, "%s/%s.pb", tmp, name);
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new --model llama3:debugmodel --dim 64 --layers 1 --heads 4 "
             "--kv-heads 2 --ffn-hidden 96 --vocab 256 --batch 4 --seq 16 --steps 4 %s -o %s "
             ">/dev/null 2>&1",
             HP_BINARY_DIR, flags, job);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* A plan that cannot compile (FSDP marks on a mesh with no dp dim) is refused by the --world
 * launcher before any rank starts: one line, not one from each rank's setup. */
Test(hpworker, uncompilable_plan_fails_at_start) {
    char job[300];
    new_small_job(job, sizeof job, "nodp", "--mesh tp=2 --tp-plan llama --fsdp 'layers.*'");
    hp_th_run r = hp_th_run_bin(tmp, "worker/hp-worker", "--standalone %s --out %s/o", job, tmp);
    hp_th_expect_cli_error(r, 1, "hp-worker",
                           "plan (mesh tp=2): FSDP marks shard parameters over the mesh dim "
                           "named dp");
    char out[320];
    snprintf(out, sizeof out, "%s/o", tmp);
    cr_expect_eq(count_lines(out), 0, "a rank trained");
}

/* --world on a job whose mesh has more than one dim is refused before any rank starts, with
 * one line naming the mesh (a 1-D mesh is resized instead). */
Test(hpworker, world_flag_on_an_nd_mesh_is_refused) {
    char job[300];
    new_small_job(job, sizeof job, "dptp", "--mesh dp=2,tp=2 --tp-plan llama");
    hp_th_run r =
        hp_th_run_bin(tmp, "worker/hp-worker", "--standalone %s --world 2 --out %s/o", job, tmp);
    hp_th_expect_cli_error(r, 2, "hp-worker", "--world 2: the job's mesh (dp=2,tp=2) has 4 ranks");
}

/* Every path hp-worker reads (the job, --data, --init-from, --token-file) as a FIFO with no
 * writer: refused at once with the path named, never a hang in open(). The timeout turns a
 * regression into a failure (exit 137) instead of a stuck test. */
Test(hpworker, fifo_inputs_are_refused_not_waited_on) {
    char job[300], fifo[300], out[300];
    snprintf(job, sizeof job, "%s/job.pb", tmp);
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    make_job(job, 3, 0);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    char cases[4][1024];
    snprintf(cases[0], sizeof cases[0], "--standalone %s --out %s", fifo, out);
    snprintf(cases[1], sizeof cases[1], "--standalone %s --data %s --out %s", job, fifo, out);
    snprintf(cases[2], sizeof cases[2], "--standalone %s --init-from %s --out %s", job, fifo, out);
    snprintf(cases[3], sizeof cases[3], "--coordinator 127.0.0.1:1 --rank 0 --token-file %s", fifo);
    for (int i = 0; i < 4; i++) {
        const char *args = cases[i];
        hp_th_run r = hp_th_run_bin_timeout(tmp, 20, "worker/hp-worker", "%s --threads 1", args);
        cr_expect_neq(r.code, 137, "%s: hung on the fifo", args);
        cr_expect(r.code == 1 || r.code == 2, "%s: exit %d: %s", args, r.code, r.err);
        cr_expect(strstr(r.err, "fifo: not a regular file (a fifo)"), "%s: %s", args, r.err);
        hp_th_run_free(&r);
    }
}

/* A coordinator address that can never answer (port out of range, not a number, no host) is
 * refused at once as a usage error, not retried for the 60 s Welcome deadline. */
Test(hpworker, bad_coordinator_address_refused_at_once) {
    const char *bad[] = {"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:http",
                         ":8080",           "127.0.0.1:",  "127.0.0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* refused at once: a retry loop would run into the 20 s timeout, not exit 2 */
        hp_th_run r = hp_th_run_bin_timeout(
            tmp, 20, "worker/hp-worker", "--coordinator '%s' --job j-1 --rank 0 --token t", bad[i]);
        cr_expect_eq(r.code, 2, "%s: exit %d: %s", bad[i], r.code, r.err);
        cr_expect(strstr(r.err, "hp-worker: coordinator '") && strstr(r.err, bad[i]), "%s: %s",
                  bad[i], r.err);
        hp_th_run_free(&r);
    }
}
