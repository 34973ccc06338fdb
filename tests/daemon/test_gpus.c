/* tests/daemon/test_gpus.c — hpd's GPU slots without a GPU: the scheduler's bookkeeping
 * (hp__core_fits / hold / release: the lowest free indices in rank order, a cuda job that does
 * not fit waits, a cpu job never counts GPUs, other launchers count none) and the local
 * launcher's CUDA_VISIBLE_DEVICES (rank r sees gpu_ids[r]; a cpu job's environment is left as
 * hpd's; a cuda attempt without GPUs is refused). The launcher starts a stand-in script that
 * writes what it saw; the test pumps the loop until every rank exited (with a deadline). */
#include "daemon/core.h"
#include "daemon/launch.h"

#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static hpd_job job(int world, bool cuda) {
    hpd_job j;
    memset(&j, 0, sizeof j);
    j.v.world_size = world;
    j.cuda = cuda;
    return j;
}

Test(gpus, hold_takes_the_lowest_free_gpus_and_release_gives_them_back) {
    unsigned char busy[4] = {0};
    hpd d;
    memset(&d, 0, sizeof d);
    d.slots = 16, d.gpus = 4, d.gpu_busy = busy;
    hpd_job a = job(2, true), b = job(2, true), c = job(1, true), cpu = job(8, false);
    cr_assert(hp__core_fits(&d, &a));
    cr_assert(hp__core_hold(&d, &a));
    cr_assert(hp__core_hold(&d, &b));
    cr_expect_eq(a.gpu_ids[0], 0);
    cr_expect_eq(a.gpu_ids[1], 1);
    cr_expect_eq(b.gpu_ids[0], 2);
    cr_expect_eq(b.gpu_ids[1], 3);
    cr_expect_eq(d.gpus_used, 4);
    cr_expect_eq(d.slots_used, 4);
    /* Every GPU is taken: another cuda job waits, a cpu job (slots only) does not. */
    cr_expect_not(hp__core_fits(&d, &c));
    cr_expect_not(hp__core_hold(&d, &c), "a hold past the free GPUs must fail");
    cr_expect_null(c.gpu_ids);
    cr_expect(hp__core_fits(&d, &cpu));
    cr_assert(hp__core_hold(&d, &cpu));
    cr_expect_null(cpu.gpu_ids, "a cpu job holds no GPU");
    cr_expect_eq(d.gpus_used, 4);
    /* a's GPUs come back and are handed out again, lowest first. */
    hp__core_release(&d, &a);
    cr_expect_null(a.gpu_ids);
    cr_expect_eq(d.gpus_used, 2);
    cr_expect_eq(d.slots_used, 10);
    cr_assert(hp__core_fits(&d, &c));
    cr_assert(hp__core_hold(&d, &c));
    cr_expect_eq(c.gpu_ids[0], 0);
    hp__core_release(&d, &a); /* twice: no-op */
    cr_expect_eq(d.gpus_used, 3);
    hp__core_release(&d, &b);
    hp__core_release(&d, &c);
    hp__core_release(&d, &cpu);
    cr_expect_eq(d.gpus_used, 0);
    cr_expect_eq(d.slots_used, 0);
    for (int g = 0; g < 4; g++) cr_expect_eq(busy[g], 0, "gpu %d still busy", g);
}

Test(gpus, slots_still_bound_a_cuda_job_and_uncounted_gpus_never_do) {
    unsigned char busy[1] = {0};
    hpd d;
    memset(&d, 0, sizeof d);
    d.slots = 2, d.gpus = 8, d.gpu_busy = busy;
    hpd_job big = job(3, true);
    cr_expect_not(hp__core_fits(&d, &big), "3 ranks on 2 slots");
    d.slots = 64, d.gpus = -1; /* slurm / systemd / external: they place the GPUs */
    hpd_job j = job(16, true);
    cr_assert(hp__core_fits(&d, &j));
    cr_assert(hp__core_hold(&d, &j));
    cr_expect_null(j.gpu_ids);
    cr_expect_eq(d.gpus_used, 0);
    hp__core_release(&d, &j);
    cr_expect_eq(d.slots_used, 0);
}

/* ---- the local launcher ---------------------------------------------------------------------- */
static char g_dir[256];
static int g_exits, g_bad_status;

static void on_event(void *ctx, const hpd_launch_event *ev) {
    (void)ctx;
    if (ev->kind != HPD_LEV_EXIT) return;
    g_exits++;
    if (ev->status != 3) g_bad_status = ev->status;
}

/* A stand-in worker: `script --coordinator C --job ID --rank R` writes
 * "R <CUDA_VISIBLE_DEVICES or unset>" to DIR/seen-ID-R and exits 3. */
static void write_script(char *path, size_t len) {
    snprintf(path, len, "%s/worker.sh", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f,
            "#!/bin/sh\n"
            "echo \"$6 ${CUDA_VISIBLE_DEVICES-unset}\" > \"%s/seen-$4-$6.tmp\"\n"
            "mv \"%s/seen-$4-$6.tmp\" \"%s/seen-$4-$6\"\n"
            "exit 3\n",
            g_dir, g_dir, g_dir);
    fclose(f);
    cr_assert_eq(chmod(path, 0755), 0);
}

/* Starts the attempt and pumps the loop until its world ranks exited (30 s at most). */
static void run_attempt(uv_loop_t *loop, hpd_launcher *l, hpd_attempt_spec *s) {
    hp_err e = {0};
    g_exits = 0, g_bad_status = 0;
    cr_assert_eq(l->vt->start(l, s, &e), HP_OK, "start: %s", e.msg);
    time_t deadline = time(NULL) + 30;
    while (g_exits < s->world && time(NULL) < deadline) uv_run(loop, UV_RUN_ONCE);
    cr_assert_eq(g_exits, s->world, "%d of %d ranks exited in 30 s", g_exits, s->world);
    cr_expect_eq(g_bad_status, 0, "a rank exited %d, not the script's 3", g_bad_status);
}

static char *seen(const char *job_id, int rank) {
    char p[400];
    snprintf(p, sizeof p, "%s/seen-%s-%d", g_dir, job_id, rank);
    return hp_th_slurp_or_empty(p);
}

Test(gpus, local_launcher_gives_rank_r_its_gpu_and_leaves_cpu_jobs_alone) {
    hp_th_tmpdir_make(g_dir, sizeof g_dir, "hp-gpus");
    char script[300];
    write_script(script, sizeof script);
    unsetenv("CUDA_VISIBLE_DEVICES"); /* hpd has none: the ranks get the host's indices */
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    hpd_launcher *l = NULL;
    hp_err e = {0};
    cr_assert_eq(hpd_launcher_local_new(&loop, script, on_event, NULL, &l, &e), HP_OK, "%s", e.msg);
    int ids[2] = {3, 1};
    hpd_attempt_spec s = {.job_id = "j-cuda",
                          .world = 2,
                          .token_file = "/dev/null",
                          .coordinator = "127.0.0.1:1",
                          .job_dir = g_dir,
                          .attempt_dir = g_dir,
                          .cuda = true,
                          .gpu_ids = ids};
    run_attempt(&loop, l, &s);
    char *r0 = seen("j-cuda", 0), *r1 = seen("j-cuda", 1);
    cr_expect_str_eq(r0, "0 3\n");
    cr_expect_str_eq(r1, "1 1\n");
    free(r0), free(r1);

    hpd_attempt_spec cpu = s;
    cpu.job_id = "j-cpu", cpu.cuda = false, cpu.gpu_ids = NULL;
    run_attempt(&loop, l, &cpu);
    r0 = seen("j-cpu", 0), r1 = seen("j-cpu", 1);
    cr_expect_str_eq(r0, "0 unset\n");
    cr_expect_str_eq(r1, "1 unset\n");
    free(r0), free(r1);

    /* A cuda attempt the scheduler placed on no GPU is refused, and nothing starts. */
    hpd_attempt_spec none = s;
    none.job_id = "j-none", none.gpu_ids = NULL;
    hp_err e2 = {0};
    cr_expect_eq(l->vt->start(l, &none, &e2), HP_STATE);
    cr_expect(strstr(e2.msg, "job j-none: a cuda attempt with no GPUs allocated"), "%s", e2.msg);
    cr_expect_eq(l->vt->alive(l, "j-none", 0), 0);

    l->vt->free(l);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_eq(uv_loop_close(&loop), 0);
    hp_th_tmpdir_remove(g_dir);
}

/* hpd started under its own CUDA_VISIBLE_DEVICES (a shared host, a scheduler's allocation):
 * GPU index i of its count is that list's entry i, as CUDA numbers them; a cpu job inherits
 * the list untouched; an index past the list is refused before anything starts. */
Test(gpus, local_launcher_maps_gpu_indices_through_hpds_own_visible_devices) {
    hp_th_tmpdir_make(g_dir, sizeof g_dir, "hp-gpus-vis");
    char script[300];
    write_script(script, sizeof script);
    setenv("CUDA_VISIBLE_DEVICES", "7, GPU-5ab3,2,9", 1);
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    hpd_launcher *l = NULL;
    hp_err e = {0};
    cr_assert_eq(hpd_launcher_local_new(&loop, script, on_event, NULL, &l, &e), HP_OK, "%s", e.msg);
    unsetenv("CUDA_VISIBLE_DEVICES"); /* read when the launcher was made */
    int ids[2] = {3, 1};
    hpd_attempt_spec s = {.job_id = "j-cuda",
                          .world = 2,
                          .token_file = "/dev/null",
                          .coordinator = "127.0.0.1:1",
                          .job_dir = g_dir,
                          .attempt_dir = g_dir,
                          .cuda = true,
                          .gpu_ids = ids};
    run_attempt(&loop, l, &s);
    char *r0 = seen("j-cuda", 0), *r1 = seen("j-cuda", 1);
    cr_expect_str_eq(r0, "0 9\n");
    cr_expect_str_eq(r1, "1 GPU-5ab3\n");
    free(r0), free(r1);

    int past[2] = {0, 4};
    hpd_attempt_spec bad = s;
    bad.job_id = "j-past", bad.gpu_ids = past;
    hp_err e2 = {0};
    cr_expect_eq(l->vt->start(l, &bad, &e2), HP_STATE);
    cr_expect(strstr(e2.msg, "job j-past: rank 1 was given GPU 4, but hpd's CUDA_VISIBLE_DEVICES "
                             "'7, GPU-5ab3,2,9' names 4"),
              "%s", e2.msg);
    cr_expect_eq(l->vt->alive(l, "j-past", 0), 0);

    l->vt->free(l);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_eq(uv_loop_close(&loop), 0);
    hp_th_tmpdir_remove(g_dir);
}

Test(gpus, visible_devices_are_read_as_cuda_reads_them) {
    char out[32];
    cr_expect_eq(hpd_visible_gpus("", -1, NULL, 0), 0);
    cr_expect_eq(hpd_visible_gpus("-1", -1, NULL, 0), 0);
    cr_expect_eq(hpd_visible_gpus("none", -1, NULL, 0), 0);
    cr_expect_eq(hpd_visible_gpus("0,1,2", -1, NULL, 0), 3);
    cr_expect_eq(hpd_visible_gpus("0,1,", -1, NULL, 0), 2);
    cr_expect_eq(hpd_visible_gpus("3,x,1", -1, NULL, 0), 1); /* stops at the first bad entry */
    cr_expect_eq(hpd_visible_gpus("2,-1,3", -1, NULL, 0), 1);
    cr_expect_eq(hpd_visible_gpus(" 4 ,MIG-1e2d", 1, out, sizeof out), 2);
    cr_expect_str_eq(out, "MIG-1e2d");
    cr_expect_eq(hpd_visible_gpus(" 4 ,MIG-1e2d", 0, out, sizeof out), 2);
    cr_expect_str_eq(out, "4");
}
