/* tests/daemon/test_hpd_gpus.c — the real hpd's GPU slots, driven by the real hpctl on
 * 127.0.0.1 (port 0, a temp state dir): with --gpus 2 a cuda job of 4 ranks is refused at submit
 * with one line naming both numbers (INVALID_ARGUMENT, like the slot refusal) and no job is
 * created; hpd's default (the /dev/nvidiaN devices) refuses a cuda job with "sees no GPU" where
 * there is none; /metrics shows hp_gpus and hp_gpus_used. Where this build has CUDA (hpd
 * accepts cuda jobs), a cuda job of 2 ranks starts its ranks (a stand-in --worker script that
 * records CUDA_VISIBLE_DEVICES) on GPUs 0 and 1, and a second one waits QUEUED until the first
 * has ended, then gets them; and, with real hp-worker ranks on NCCL (on cuemu where the build
 * emulates CUDA, else where the machine has 2 GPUs), a cuda job whose rank is killed mid-run
 * restarts from its checkpoint and succeeds. */
#include "tests/util/cli_harness.h"
#include "tests/util/hpd_harness.h"

#include "hp/device.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef hp_th_run run;

static char g_dir[256]; /* temp dir: state/, job files, the stand-in worker and what it saw */
static hp_th_hpd g_h = {.pid = -1};

#define hpctl(...) hp_th_hpctl(g_dir, 300, __VA_ARGS__)

static void setup(void) {
    hp_th_tmpdir_make(g_dir, sizeof g_dir, "hp-hpd-gpus");
    char state[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    cr_assert_eq(mkdir(state, 0700), 0);
    setenv("HP_STATE_DIR", state, 1);
    unsetenv("HP_TOKEN");
    unsetenv("HPD_CONFIG");
    unsetenv("CUDA_VISIBLE_DEVICES"); /* a test that wants hpd under one sets it */
}

static void stop_hpd(void) {
    if (g_h.pid <= 0) return;
    int code = hp_th_hpd_stop(&g_h);
    cr_expect_eq(code, 0, "hpd exit status %d on SIGTERM (-1: killed or not exited in 30 s)", code);
}

static void teardown(void) {
    stop_hpd();
    hp_th_tmpdir_remove(g_dir);
}

TestSuite(hpd_gpus, .init = setup, .fini = teardown, .timeout = 300);

/* hpd with the temp state dir, port 0 and the extra (NULL-terminated) args. */
static void start_hpd(const char *const *extra) {
    char state[300], log[300];
    snprintf(state, sizeof state, "%s/state", g_dir);
    snprintf(log, sizeof log, "%s/hpd.err", g_dir);
    hp_th_hpd_start(&g_h, state, log, extra);
    setenv("HP_SERVER", g_h.grpc, 1);
}

/* A tiny Llama at dp=world on device cuda, written to g_dir/name. */
static void new_cuda_job(const char *name, int world) {
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 4 --seq 32 --steps 2 --device cuda "
                  "--mesh dp=%d -o %s/%s",
                  world, g_dir, name);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
}

static int n_jobs(void) {
    run r = hpctl("list --json");
    cr_assert_eq(r.code, 0, "list: %s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert(j, "not JSON: %s", r.out);
    int n = (int)json_array_size(json_object_get(j, "jobs"));
    json_decref(j);
    hp_th_run_free(&r);
    return n;
}

/* Submits g_dir/name, which must be refused with INVALID_ARGUMENT and one line holding want. */
static void expect_refused(const char *name, const char *want) {
    run r = hpctl("submit %s/%s", g_dir, name);
    cr_expect_eq(r.code, 1, "submit: exit %d, out %s", r.code, r.out);
    cr_expect(strstr(r.err, "hpctl: submit: INVALID_ARGUMENT: ") && strstr(r.err, want),
              "stderr: %s", r.err);
    cr_expect(strchr(r.err, '\n') && strchr(r.err, '\n')[1] == 0, "not one line: %s", r.err);
    hp_th_run_free(&r);
    cr_expect_eq(n_jobs(), 0, "a refused job was created");
}

/* GET path from hpd's HTTP server: the whole response (free it). */
static char *http_get(const char *path) {
    const char *colon = strrchr(g_h.http, ':');
    cr_assert(colon, "hpd's http address: '%s'", g_h.http);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect %s", g_h.http);
    char req[256];
    int n =
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    cr_assert_eq(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    cr_assert(buf);
    for (ssize_t k; (k = read(fd, buf + len, cap - 1 - len)) > 0;) {
        len += (size_t)k;
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
        cr_assert(buf);
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

Test(hpd_gpus, a_cuda_job_for_more_gpus_than_hpd_has_is_refused_at_submit) {
    const char *args[] = {"--http", "127.0.0.1:0", "--slots", "8", "--gpus", "2", NULL};
    start_hpd(args);
    new_cuda_job("four.pb", 4);
    expect_refused("four.pb", "resources: a cuda job of 4 ranks needs 4 GPUs; this hpd has 2 "
                              "(--gpus)");
    char *m = http_get("/metrics");
    cr_expect(strstr(m, "\nhp_gpus 2\n"), "%s", m);
    cr_expect(strstr(m, "\nhp_gpus_used 0\n"), "%s", m);
    free(m);
}

static int dev_nvidia_count(void) {
    DIR *d = opendir("/dev");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *p = e->d_name;
        if (strncmp(p, "nvidia", 6) != 0 || !p[6]) continue;
        p += 6;
        while (*p >= '0' && *p <= '9') p++;
        n += *p == 0;
    }
    if (d) closedir(d);
    return n;
}

Test(hpd_gpus, by_default_hpd_counts_the_nvidia_devices) {
    if (dev_nvidia_count() > 0) cr_skip_test("this host has /dev/nvidiaN devices");
    const char *args[] = {"--http", "off", NULL};
    start_hpd(args);
    new_cuda_job("one.pb", 1);
    expect_refused("one.pb", "resources: a cuda job of 1 rank needs 1 GPU; this hpd sees no "
                             "GPU (--gpus)");
}

/* Started under a CUDA_VISIBLE_DEVICES of its own (a shared host, a scheduler's allocation),
 * hpd counts the GPUs that list names, whatever device nodes the host has. */
Test(hpd_gpus, hpds_own_visible_devices_are_its_gpus) {
    setenv("CUDA_VISIBLE_DEVICES", "6", 1);
    const char *args[] = {"--http", "127.0.0.1:0", "--slots", "8", NULL};
    start_hpd(args);
    new_cuda_job("two.pb", 2);
    expect_refused("two.pb", "resources: a cuda job of 2 ranks needs 2 GPUs; this hpd has 1 "
                             "(--gpus)");
    char *m = http_get("/metrics");
    cr_expect(strstr(m, "\nhp_gpus 1\n"), "%s", m);
    free(m);
}

/* hpd ARGS must stop at the start with exit 2 and a stderr holding want. */
static void expect_start_fails(const char *args, const char *want) {
    char cmd[800], p[300];
    snprintf(p, sizeof p, "%s/bad.err", g_dir);
    snprintf(cmd, sizeof cmd,
             "timeout 30 %s/daemon/hpd --listen 127.0.0.1:0 --worker-listen 127.0.0.1:0 "
             "--http off %s >/dev/null 2>%s",
             hp_th_binary_dir(), args, p);
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: exit status %d", args, st);
    char *err = hp_th_slurp_or_empty(p);
    cr_expect(strstr(err, want), "%s: stderr: %s", args, err);
    free(err);
}

Test(hpd_gpus, a_bad_gpus_value_or_gpus_with_another_launcher_stops_the_start) {
    expect_start_fails("--gpus -2", "gpus: '-2' must be an integer in [0, 4096]");
    setenv("CUDA_VISIBLE_DEVICES", "6", 1);
    expect_start_fails("--gpus 2", "hpd: gpus 2: hpd's CUDA_VISIBLE_DEVICES '6' names 1 GPU, and "
                                   "hpd hands out only those");
    unsetenv("CUDA_VISIBLE_DEVICES");

    expect_start_fails("--gpus 2 --launcher external",
                       "hpd: gpus 2: only the local launcher hands out GPUs; with --launcher "
                       "external its scheduler places them (leave gpus unset)");
}

/* ---- where hpd accepts cuda jobs (a CUDA build) ------------------------------------------ */
/* `hpctl status ID --json`, parsed. */
static json_t *status_json(const char *id) {
    run r = hpctl("status %s --json", id);
    cr_assert_eq(r.code, 0, "status: %s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert(j, "not JSON: %s", r.out);
    hp_th_run_free(&r);
    return j;
}

static char *state_of(const char *id) {
    json_t *j = status_json(id);
    char *s = strdup(json_string_value(json_object_get(j, "state")));
    json_decref(j);
    return s;
}

static bool wait_state(const char *id, const char *want, int seconds) {
    for (int i = 0; i < seconds * 10; i++) {
        char *s = state_of(id);
        bool ok = strcmp(s, want) == 0;
        free(s);
        if (ok) return true;
        usleep(100000);
    }
    return false;
}

/* What rank r of job id saw ("" until it ran). */
static char *seen(const char *id, int r) {
    char p[400];
    snprintf(p, sizeof p, "%s/seen-%s-%d", g_dir, id, r);
    return hp_th_slurp_or_empty(p);
}

static bool wait_seen(const char *id, int r, int seconds) {
    for (int i = 0; i < seconds * 10; i++) {
        char *s = seen(id, r);
        bool ok = *s != 0;
        free(s);
        if (ok) return true;
        usleep(100000);
    }
    return false;
}

/* hpd's stderr and rank 0's log of job id, for a failure's message (leaks: the test ends). */
static char *hpd_log(const char *id) {
    char p[400], *buf = malloc(1 << 20);
    cr_assert(buf);
    snprintf(p, sizeof p, "%s/hpd.err", g_dir);
    char *h = hp_th_slurp_or_empty(p);
    snprintf(p, sizeof p, "%s/state/jobs/%s/rank-0.log", g_dir, id);
    char *r = hp_th_slurp_or_empty(p);
    snprintf(buf, 1 << 20, "%s\nrank 0's log:\n%s", h, r);
    free(h), free(r);
    return buf;
}

/* Lets job id's stand-in ranks exit. */
static void release(const char *id) {
    char p[400];
    snprintf(p, sizeof p, "%s/release-%s", g_dir, id);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fclose(f);
}

Test(hpd_gpus, cuda_ranks_get_their_gpus_and_the_next_job_waits_for_them) {
    if (hp_device_built(HP_DEVICE_CUDA, NULL) != HP_OK)
        cr_skip_test("this build has no CUDA: hpd refuses cuda jobs before they are scheduled");
    /* The stand-in worker records "RANK CUDA_VISIBLE_DEVICES", then waits for
     * g_dir/release-JOB (60 s at most) and fails: the job ends FAILED (max_restarts 0) and gives
     * its GPUs back. */
    char script[300];
    snprintf(script, sizeof script, "%s/worker.sh", g_dir);
    FILE *f = fopen(script, "w");
    cr_assert(f);
    fprintf(f,
            "#!/bin/sh\n"
            "echo \"$6 ${CUDA_VISIBLE_DEVICES-unset}\" > \"%s/seen-$4-$6.tmp\"\n"
            "mv \"%s/seen-$4-$6.tmp\" \"%s/seen-$4-$6\"\n"
            "i=0; while [ ! -e \"%s/release-$4\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
            "done\n"
            "exit 1\n",
            g_dir, g_dir, g_dir, g_dir);
    fclose(f);
    cr_assert_eq(chmod(script, 0755), 0);
    const char *args[] = {"--http", "off", "--slots", "8", "--gpus", "2", "--worker", script, NULL};
    start_hpd(args);
    new_cuda_job("two.pb", 2);
    char *a = hp_th_hpctl_submit(g_dir, "two.pb");
    char *b = hp_th_hpctl_submit(g_dir, "two.pb");
    cr_assert(wait_seen(a, 0, 60) && wait_seen(a, 1, 60), "job %s's ranks did not start: %s", a,
              hpd_log(a));
    char *s0 = seen(a, 0), *s1 = seen(a, 1);
    cr_expect_str_eq(s0, "0 0\n");
    cr_expect_str_eq(s1, "1 1\n");
    free(s0), free(s1);
    /* a holds both GPUs until it ends: b is still waiting (it cannot start before). */
    char *sb = state_of(b);
    cr_expect_str_eq(sb, "QUEUED");
    free(sb);
    release(a);
    cr_expect(wait_state(a, "FAILED", 60), "job %s did not end", a);
    cr_assert(wait_seen(b, 0, 60) && wait_seen(b, 1, 60), "job %s's ranks did not start: %s", b,
              hpd_log(b));
    s0 = seen(b, 0), s1 = seen(b, 1);
    cr_expect_str_eq(s0, "0 0\n");
    cr_expect_str_eq(s1, "1 1\n");
    free(s0), free(s1);
    release(b);
    cr_expect(wait_state(b, "FAILED", 60), "job %s did not end", b);
    free(a), free(b);
}

/* The pid of rank r of job id among this host's processes (its command line holds "--job ID
 * --rank R", as the local launcher starts it), 0 if none. */
static pid_t rank_pid(const char *id, int r) {
    char rank[16];
    snprintf(rank, sizeof rank, "%d", r);
    DIR *d = opendir("/proc");
    pid_t found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        char p[300], buf[4096];
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        bool job = false, rk = false;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            const char *next = i + strlen(buf + i) + 1 < n ? buf + i + strlen(buf + i) + 1 : "";
            job |= !strcmp(buf + i, "--job") && !strcmp(next, id);
            rk |= !strcmp(buf + i, "--rank") && !strcmp(next, rank);
        }
        if (job && rk) found = (pid_t)atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* NCCL surfaces the dead peer as an error on the survivor (not a hang), so the job's ranks all
 * end and hpd's restart path runs as on the cpu: attempt 1 resumes from the last checkpoint. */
Test(hpd_gpus, a_cuda_job_whose_rank_is_killed_restarts_and_succeeds, .timeout = 600) {
    if (hp_device_built(HP_DEVICE_CUDA, NULL) != HP_OK)
        cr_skip_test("this build has no CUDA: hpd refuses cuda jobs before they are scheduled");
#ifdef HP_CUDA_EMU
    if (getenv("HP_CUEMU_DEVICES") && !strcmp(getenv("HP_CUEMU_DEVICES"), "0"))
        cr_skip_test("no CUDA device (HP_CUEMU_DEVICES=0)");
    setenv("HP_CUEMU_DEVICES", "2", 1); /* hpd's ranks inherit it: a GPU each */
#else
    if (dev_nvidia_count() < 2) cr_skip_test("needs 2 GPUs; this host has %d", dev_nvidia_count());
#endif
    char worker[400];
    snprintf(worker, sizeof worker, "%s/worker/hp-worker", hp_th_binary_dir());
    const char *args[] = {"--http", "off", "--slots", "8", "--gpus", "2", "--worker", worker, NULL};
    start_hpd(args);
    run r = hpctl("new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn-hidden 96 --vocab 256 --batch 4 --seq 32 --steps 80 --device cuda "
                  "--mesh dp=2 --fsdp 'layers.*' --checkpoint-interval 5 --max-restarts 1 "
                  "-o %s/job.pb",
                  g_dir);
    cr_assert_eq(r.code, 0, "hpctl new: %s", r.err);
    hp_th_run_free(&r);
    char *id = hp_th_hpctl_submit(g_dir, "job.pb");
    /* kill rank 1 once the job has trained past its first checkpoint */
    pid_t victim = 0;
    for (int i = 0; i < 1200 && !victim; i++) {
        json_t *j = status_json(id);
        json_int_t step = json_integer_value(json_object_get(j, "step"));
        const char *st = json_string_value(json_object_get(j, "state"));
        bool running = st && !strcmp(st, "RUNNING") && step >= 8;
        bool over = st && (!strcmp(st, "SUCCEEDED") || !strcmp(st, "FAILED"));
        json_decref(j);
        cr_assert(!over, "job %s ended before a rank could be killed: %s", id, hpd_log(id));
        if (running) victim = rank_pid(id, 1);
        if (!victim) usleep(100000);
    }
    cr_assert(victim > 0, "job %s's rank 1 never ran past step 8: %s", id, hpd_log(id));
    cr_assert_eq(kill(victim, SIGKILL), 0);
    cr_expect(wait_state(id, "SUCCEEDED", 240), "job %s did not succeed after the restart: %s", id,
              hpd_log(id));
    json_t *j = status_json(id);
    cr_expect_eq(json_integer_value(json_object_get(j, "restarts")), 1, "restarts");
    cr_expect_eq(json_integer_value(json_object_get(j, "step")), 80, "last step");
    json_decref(j);
    free(id);
}
