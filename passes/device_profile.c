/* passes/device_profile.c — the device profiles the cost model prices plans on
 * (hp/autoshard.h, docs/autoshard.md).
 *
 * GPU profiles: the dense bf16 peak of torchtitan's table, an efficiency a large matmul
 * reaches, HBM bandwidth from the data sheets, and link figures in the spirit of the NCCL
 * model AutoParallel prices collectives with (Inductor's comm_analysis): a ring's bus bandwidth
 * within a node (NVLink) and across nodes (one 400 Gb/s NIC per GPU, 200 Gb/s on A100
 * clusters), with a per-collective latency. These are planning figures, not measurements.
 *
 * The cpu profile is this machine's: `hp-worker --probe-profile` measures the SGEMM peak (the
 * kernels' own GEMM path, as for MFU), memcpy bandwidth and the shm communicator's all-reduce
 * bandwidth and latency between two ranks, the cost of dispatching one kernel to the compute
 * threads, and a collective's latency when twice as many ranks as CPUs compute and meet
 * (worker/probe.c), and caches them here as one line of text per CPU model:
 *     hp-cpu-profile 2 <peak_flops> <mem_bw> <shm_bw> <shm_latency> <kernel_s> <cpus>
 *                      <oversubscribed_latency> <attn_eff_d16> <_d32> <_d64> <_d128>
 *                      <gemm_efficiency>
 * (version 1, without the last seven, still reads with the assumed efficiency 0.8).
 * Without a cached probe the cpu profile is an assumed one (measured = false) and `hpctl plan`
 * says so. The figures are the whole host's: the ranks of a job share it (--gpus-per-node
 * ranks per host, else all of them), each priced at its share of the peak and bandwidth, and
 * at the oversubscribed latency when they outnumber the CPUs.
 */
#include "hp/autoshard.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CPU_PROFILE_VERSION 2

typedef struct known {
    const char *name;
    double peak, efficiency, mem_bw, kernel_s;
    hp_link_class intra, inter;
    double mem_mib; /* the memory the driver reports (nvidia-smi's total, MiB) */
} known;

static const known GPUS[] = {
    /* name   peak      eff   HBM      launch  NVLink busbw  lat     IB per GPU  lat   memory */
    {"h100", 989e12, 0.60, 3.35e12, 3e-6, {360e9, 8e-6}, {45e9, 20e-6}, 81559},
    {"h200", 989e12, 0.60, 4.8e12, 3e-6, {360e9, 8e-6}, {45e9, 20e-6}, 143771},
    {"a100", 312e12, 0.60, 2.0e12, 4e-6, {230e9, 10e-6}, {22e9, 25e-6}, 81920},
    {"b200", 2.25e15, 0.60, 8.0e12, 3e-6, {720e9, 8e-6}, {45e9, 20e-6}, 183359},
};

/* Assumed figures of a CPU nobody probed: conservative, flagged measured = false (its memory
 * is the host's RAM, always read: hp_device_profile_get). */
static const known CPU_ASSUMED = {"cpu", 1e11, 0.8, 1e10, 5e-6, {4e9, 30e-6}, {4e9, 30e-6}, 0};

/* The host's RAM in bytes (0 when unknown). */
static double host_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int profile_path(char *out, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[900];
    if (xdg && xdg[0] == '/')
        snprintf(dir, sizeof dir, "%s/hp", xdg);
    else if (home && home[0] == '/')
        snprintf(dir, sizeof dir, "%s/.cache/hp", home);
    else
        return -1;
    char model[256];
    hp_cpu_model(model, sizeof model);
    int n = snprintf(out, len, "%s/cpu-profile-%016llx.txt", dir, (unsigned long long)fnv1a(model));
    return n > 0 && (size_t)n < len ? 0 : -1;
}

static void from_known(const known *k, hp_device_profile *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", k->name);
    out->peak_flops = k->peak;
    out->efficiency = k->efficiency;
    out->mem_bw = k->mem_bw;
    out->kernel_s = k->kernel_s;
    out->intra = k->intra;
    out->inter = k->inter;
    out->mem_capacity = k->mem_mib * 1048576.0;
}

static bool attn_plausible(const hp_device_profile *p) {
    for (int i = 0; i < 4; i++)
        if (!isfinite(p->attn_efficiency[i]) || p->attn_efficiency[i] < 0 ||
            p->attn_efficiency[i] > 1.5)
            return false;
    return true;
}

static bool plausible(const hp_device_profile *p) {
    return isfinite(p->peak_flops) && p->peak_flops >= 1e8 && p->peak_flops <= 1e16 &&
           isfinite(p->mem_bw) && p->mem_bw >= 1e8 && p->mem_bw <= 1e14 &&
           isfinite(p->intra.bandwidth) && p->intra.bandwidth >= 1e6 &&
           p->intra.bandwidth <= 1e14 && isfinite(p->intra.latency) && p->intra.latency >= 0 &&
           p->intra.latency <= 1 && isfinite(p->kernel_s) && p->kernel_s >= 0 && p->kernel_s <= 1 &&
           p->cpus >= 0 && p->cpus <= 65536 && isfinite(p->oversubscribed_latency) &&
           p->oversubscribed_latency >= 0 && p->oversubscribed_latency <= 1 && attn_plausible(p) &&
           isfinite(p->efficiency) && p->efficiency > 0 && p->efficiency <= 1.5;
}

hp_status hp_cpu_profile_load(hp_device_profile *out, hp_err *err) {
    char path[1024];
    if (profile_path(path, sizeof path) != 0)
        return hp_errf(err, HP_NOT_FOUND, "cpu profile: no cache directory ($HOME unset)");
    FILE *f = fopen(path, "r");
    if (!f) return hp_errf(err, HP_NOT_FOUND, "cpu profile: %s: %s", path, strerror(errno));
    int version = 0, cpus = 0;
    double peak, bw, shm_bw, shm_lat, kernel, oversub = 0, attn[4] = {0}, gemm_eff = 0;
    int n = fscanf(f, "hp-cpu-profile %d %lf %lf %lf %lf %lf %d %lf %lf %lf %lf %lf %lf", &version,
                   &peak, &bw, &shm_bw, &shm_lat, &kernel, &cpus, &oversub, &attn[0], &attn[1],
                   &attn[2], &attn[3], &gemm_eff);
    fclose(f);
    if (!(version == 1 && n >= 6) && !(version == CPU_PROFILE_VERSION && n == 13))
        return hp_errf(err, HP_NOT_FOUND, "cpu profile: %s: not a version-1 or %d profile", path,
                       CPU_PROFILE_VERSION);
    if (version == 1) cpus = 0, oversub = 0, memset(attn, 0, sizeof attn);
    from_known(&CPU_ASSUMED, out);
    out->peak_flops = peak;
    out->mem_bw = bw;
    out->intra = out->inter = (hp_link_class){shm_bw, shm_lat};
    out->kernel_s = kernel;
    out->cpus = cpus;
    out->oversubscribed_latency = oversub;
    memcpy(out->attn_efficiency, attn, sizeof attn);
    if (version == CPU_PROFILE_VERSION) out->efficiency = gemm_eff;
    out->measured = true;
    if (!plausible(out))
        return hp_errf(err, HP_NOT_FOUND, "cpu profile: %s: implausible figures", path);
    return HP_OK;
}

hp_status hp_cpu_profile_store(const hp_device_profile *p, hp_err *err) {
    if (!plausible(p))
        return hp_errf(err, HP_INVALID,
                       "cpu profile: implausible figures (peak %g FLOP/s, memory %g B/s, link %g "
                       "B/s, latency %g s)",
                       p->peak_flops, p->mem_bw, p->intra.bandwidth, p->intra.latency);
    char path[1024];
    if (profile_path(path, sizeof path) != 0)
        return hp_errf(err, HP_IO, "cpu profile: no cache directory ($HOME unset)");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    HP_TRY(hp_mkdir_p(dir, err));
    char text[320];
    int n = snprintf(
        text, sizeof text,
        "hp-cpu-profile %d %.6g %.6g %.6g %.6g %.6g %d %.6g %.4g %.4g %.4g %.4g %.4g\n",
        CPU_PROFILE_VERSION, p->peak_flops, p->mem_bw, p->intra.bandwidth, p->intra.latency,
        p->kernel_s, p->cpus, p->oversubscribed_latency, p->attn_efficiency[0],
        p->attn_efficiency[1], p->attn_efficiency[2], p->attn_efficiency[3], p->efficiency);
    return hp_file_write_atomic(path, text, (size_t)n, err);
}

hp_status hp_device_profile_get(const char *name, int gpus_per_node, hp_device_profile *out,
                                hp_err *err) {
    memset(out, 0, sizeof *out);
    if (name && !strcmp(name, "cpu")) {
        hp_err e;
        if (hp_cpu_profile_load(out, &e) != HP_OK) from_known(&CPU_ASSUMED, out);
        out->gpus_per_node = gpus_per_node > 0 ? gpus_per_node : 0;
        out->mem_capacity = host_memory();
        return HP_OK;
    }
    for (size_t i = 0; name && i < HP_ARRAY_LEN(GPUS); i++) {
        if (strcmp(name, GPUS[i].name)) continue;
        from_known(&GPUS[i], out);
        out->gpus_per_node = gpus_per_node > 0 ? gpus_per_node : 8;
        out->measured = false;
        return HP_OK;
    }
    return hp_errf(err, HP_INVALID, "device profile '%.32s' is unknown (" HP_DEVICE_PROFILES ")",
                   name ? name : "(null)");
}

hp_status hp_device_profile_for_job(const hp_job *job, hp_device_profile *out, hp_err *err) {
    const char *name = job->plan.device_profile;
    if (!name[0]) name = job->resources.device == HP_DEVICE_CUDA ? "h100" : "cpu";
    HP_TRY(hp_device_profile_get(name, job->plan.gpus_per_node, out, err));
    /* the ranks of a cpu job share their host (hp-worker gives each its share of the cores):
     * each gets its share of the host's peak and memory bandwidth */
    int world = job->resources.world_size,
        per_host = out->gpus_per_node > 0 ? out->gpus_per_node : world;
    if (!strcmp(out->name, "cpu") && world > 1) {
        int share = per_host < world ? per_host : world;
        out->peak_flops /= share;
        out->mem_bw /= share;
        out->mem_capacity /= share;
        /* more ranks than CPUs: a rank that waits sleeps, and a woken one waits for a CPU */
        if (out->cpus > 0 && share > out->cpus && out->oversubscribed_latency > out->intra.latency)
            out->intra.latency = out->inter.latency = out->oversubscribed_latency;
    }
    return HP_OK;
}

void hp_device_profile_links(const hp_device_profile *p, const hp_job *job, hp_link_class *link) {
    int64_t stride = 1;
    for (int i = job->plan.n_mesh - 1; i >= 0; i--) {
        int64_t span = stride * job->plan.mesh[i].size;
        if (!strcmp(p->name, "cpu"))
            link[i] = p->intra;
        else if (p->gpus_per_node > 0)
            link[i] = span <= p->gpus_per_node ? p->intra : p->inter;
        else
            link[i] = job->plan.mesh[i].link;
        stride = span;
    }
}

double hp_device_profile_attn_efficiency(const hp_device_profile *p, int64_t d) {
    const double *e = p->attn_efficiency; /* at head dims 16, 32, 64, 128 */
    for (int i = 0; i < 4; i++)
        if (!(e[i] > 0)) return p->efficiency;
    double x = log2((double)(d > 0 ? d : 1)) - 4; /* 0 at 16, 3 at 128 */
    if (x <= 0) return e[0];
    if (x >= 3) return e[3];
    int i = (int)x;
    return e[i] + (x - i) * (e[i + 1] - e[i]);
}

double hp_device_profile_attn_rate(const hp_device_profile *p, int64_t d, bool causal, int64_t t,
                                   int64_t s) {
    double visible = causal && t == s && t > 0 ? (double)(t + 1) / (2.0 * (double)t) : 1.0;
    return p->peak_flops * hp_device_profile_attn_efficiency(p, d) / visible;
}
