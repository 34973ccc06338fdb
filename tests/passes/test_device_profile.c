/* tests/passes/test_device_profile.c — the cpu probe's cache and how the cost model reads it
 * (passes/device_profile.c): a version-2 line round-trips, a version-1 line (before the
 * dispatch, oversubscription, attention and GEMM figures) still reads with those unknown, garbage
 * and implausible figures fall back to the assumed profile, attention's efficiency is
 * interpolated between the probed head dims, a causal attention's rate counts only the pairs
 * its mask leaves, and ranks that outnumber the host's CPUs are priced at the oversubscribed
 * latency.
 */
#include "hp/autoshard.h"
#include "hp/job.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char cache[64];

static void make_cache(void) {
    snprintf(cache, sizeof cache, "/tmp/hp_profile_XXXXXX");
    cr_assert_not_null(mkdtemp(cache));
    setenv("XDG_CACHE_HOME", cache, 1);
}

static void rm_cache(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(device_profile, .init = make_cache, .fini = rm_cache);

/* The one profile file the store wrote (its name hashes the CPU model). */
static void profile_file(char *out, size_t len) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/hp", cache);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "no %s", dir);
    struct dirent *e;
    out[0] = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "cpu-profile-", 12)) snprintf(out, len, "%s/%s", dir, e->d_name);
    closedir(d);
    cr_assert(out[0], "no cpu-profile file in %s", dir);
}

static void overwrite(const char *text) {
    char path[512];
    profile_file(path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static hp_device_profile probed(void) {
    hp_device_profile p;
    hp_err e;
    cr_assert_eq(hp_device_profile_get("cpu", 0, &p, &e), HP_OK, "%s", e.msg);
    p.peak_flops = 1e11, p.mem_bw = 1e10, p.kernel_s = 8e-6, p.cpus = 2;
    p.intra = p.inter = (hp_link_class){2e9, 1e-6};
    p.oversubscribed_latency = 2e-4;
    p.efficiency = 0.9;
    double attn[4] = {0.3, 0.4, 0.5, 0.6};
    memcpy(p.attn_efficiency, attn, sizeof attn);
    return p;
}

Test(device_profile, version2_round_trips) {
    hp_device_profile p = probed(), q;
    hp_err e;
    cr_assert_eq(hp_cpu_profile_store(&p, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_cpu_profile_load(&q, &e), HP_OK, "%s", e.msg);
    cr_expect(q.measured);
    cr_expect_float_eq(q.peak_flops, 1e11, 1e-3);
    cr_expect_float_eq(q.kernel_s, 8e-6, 1e-9);
    cr_expect_eq(q.cpus, 2);
    cr_expect_float_eq(q.oversubscribed_latency, 2e-4, 1e-9);
    for (int i = 0; i < 4; i++) cr_expect_float_eq(q.attn_efficiency[i], 0.3 + 0.1 * i, 1e-6);
    cr_expect_float_eq(q.efficiency, 0.9, 1e-6);
}

Test(device_profile, version1_reads_without_the_new_figures) {
    hp_device_profile p = probed(), q;
    hp_err e;
    cr_assert_eq(hp_cpu_profile_store(&p, &e), HP_OK, "%s", e.msg);
    overwrite("hp-cpu-profile 1 5e+10 8e+09 1e+09 2e-06 5e-06\n");
    cr_assert_eq(hp_cpu_profile_load(&q, &e), HP_OK, "%s", e.msg);
    cr_expect_float_eq(q.peak_flops, 5e10, 1);
    cr_expect_eq(q.cpus, 0);
    cr_expect_eq(q.oversubscribed_latency, 0);
    cr_expect_eq(q.attn_efficiency[0], 0);
    cr_expect_float_eq(q.efficiency, 0.8, 1e-12, "version 1: the assumed GEMM efficiency");
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&q, 64), q.efficiency, 1e-12);
}

Test(device_profile, bad_files_fall_back_to_the_assumed_profile) {
    hp_device_profile p = probed(), q;
    hp_err e;
    cr_assert_eq(hp_cpu_profile_store(&p, &e), HP_OK, "%s", e.msg);
    const char *bad[] = {
        "garbage\n",
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 2\n",                         /* short */
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 2 2e-4 0.3 0.4 0.5 0.6\n",    /* no GEMM */
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 2 2e-4 0.3 0.4 0.5 9 0.9\n",  /* attn 900% */
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 2 2e-4 0.3 0.4 0.5 0.6 0\n",  /* GEMM 0 */
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 -1 2e-4 0.3 0.4 0.5 0.6 1\n", /* cpus < 0 */
        "hp-cpu-profile 2 1e11 1e10 2e9 1e-6 8e-6 2 nan 0.3 0.4 0.5 0.6 1\n",
        "hp-cpu-profile 3 1e11 1e10 2e9 1e-6 8e-6 2 2e-4 0.3 0.4 0.5 0.6 1\n", /* the future */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        overwrite(bad[i]);
        cr_expect_neq(hp_cpu_profile_load(&q, &e), HP_OK, "accepted %s", bad[i]);
        cr_assert_eq(hp_device_profile_get("cpu", 0, &q, &e), HP_OK, "%s", e.msg);
        cr_expect(!q.measured, "%s: not the assumed profile", bad[i]);
    }
    p.attn_efficiency[2] = NAN;
    cr_expect_eq(hp_cpu_profile_store(&p, &e), HP_INVALID, "stored a NaN efficiency");
}

Test(device_profile, attention_efficiency_interpolates_in_log2_head_dim) {
    hp_device_profile p = probed();
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&p, 16), 0.3, 1e-12);
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&p, 128), 0.6, 1e-12);
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&p, 8), 0.3, 1e-12);   /* clamped */
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&p, 512), 0.6, 1e-12); /* clamped */
    double e48 = hp_device_profile_attn_efficiency(&p, 48); /* log2 48 = 5.58: 0.4 .. 0.5 */
    cr_expect_float_eq(e48, 0.4 + (log2(48.0) - 5) * 0.1, 1e-12);
    /* causal, T = S: only (T + 1) / 2T of the counted pairs are computed */
    cr_expect_float_eq(hp_device_profile_attn_rate(&p, 64, false, 256, 256), 0.5e11, 1);
    cr_expect_float_eq(hp_device_profile_attn_rate(&p, 64, true, 256, 256), 0.5e11 * 512.0 / 257.0,
                       1);
    hp_device_profile h;
    hp_err e;
    cr_assert_eq(hp_device_profile_get("h100", 0, &h, &e), HP_OK, "%s", e.msg);
    cr_expect_float_eq(hp_device_profile_attn_efficiency(&h, 128), h.efficiency, 1e-12);
}

static void cpu_job(hp_job *job, int world, int per_host) {
    memset(job, 0, sizeof *job);
    job->resources.world_size = world;
    job->plan.gpus_per_node = per_host;
    snprintf(job->plan.device_profile, sizeof job->plan.device_profile, "cpu");
}

Test(device_profile, ranks_beyond_the_cpus_pay_the_oversubscribed_latency) {
    hp_device_profile p = probed(), q;
    hp_err e;
    cr_assert_eq(hp_cpu_profile_store(&p, &e), HP_OK, "%s", e.msg);
    hp_job job;
    cpu_job(&job, 2, 0); /* 2 ranks on 2 CPUs */
    cr_assert_eq(hp_device_profile_for_job(&job, &q, &e), HP_OK, "%s", e.msg);
    cr_expect_float_eq(q.intra.latency, 1e-6, 1e-12);
    cr_expect_float_eq(q.peak_flops, 0.5e11, 1);
    cpu_job(&job, 4, 0); /* 4 ranks on 2 CPUs */
    cr_assert_eq(hp_device_profile_for_job(&job, &q, &e), HP_OK, "%s", e.msg);
    cr_expect_float_eq(q.intra.latency, 2e-4, 1e-12);
    cr_expect_float_eq(q.peak_flops, 0.25e11, 1);
    cpu_job(&job, 4, 2); /* 4 ranks, 2 per host: each host's CPUs suffice */
    cr_assert_eq(hp_device_profile_for_job(&job, &q, &e), HP_OK, "%s", e.msg);
    cr_expect_float_eq(q.intra.latency, 1e-6, 1e-12);
}

/* Every name hp_device_profile_known accepts (what hpctl and the job validation take) has
 * figures; the GPUs' peaks are the table's (dense bf16); an unknown name lists them. */
Test(device_profile, every_known_name_resolves_and_an_unknown_one_lists_them) {
    static const struct {
        const char *name;
        double peak, mem_gib; /* nvidia-smi's total, rounded down */
    } gpus[] = {
        {"h100", 989e12, 79}, {"h200", 989e12, 140}, {"a100", 312e12, 80}, {"b200", 2.25e15, 179}};
    hp_err err = {0};
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        hp_device_profile p;
        cr_assert(hp_device_profile_known(gpus[i].name));
        cr_assert_eq(hp_device_profile_get(gpus[i].name, 0, &p, &err), HP_OK, "%s", err.msg);
        cr_expect_eq(p.peak_flops, gpus[i].peak, "%s", gpus[i].name);
        cr_expect(p.mem_bw > 0 && p.intra.bandwidth > p.inter.bandwidth, "%s", gpus[i].name);
        cr_expect(p.mem_capacity >= gpus[i].mem_gib * 1073741824.0 &&
                      p.mem_capacity < (gpus[i].mem_gib + 1) * 1073741824.0,
                  "%s: %g bytes", gpus[i].name, p.mem_capacity);
    }
    hp_device_profile p;
    cr_assert(hp_device_profile_known("cpu"));
    cr_assert_eq(hp_device_profile_get("cpu", 0, &p, &err), HP_OK, "%s", err.msg);
    /* the host's RAM */
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    cr_expect_eq(p.mem_capacity, ram);
    cr_expect(!hp_device_profile_known("h900") && !hp_device_profile_known(""));
    cr_expect_neq(hp_device_profile_get("h900", 0, &p, &err), HP_OK);
    cr_expect(strstr(err.msg, "'h900' is unknown (" HP_DEVICE_PROFILES ")"), "%s", err.msg);
}
