/* daemon/main.c — hpd, the coordinator: flags, the state dir (lock, token), the loop, signals.
 * Prints "hpd listening grpc=HOST:PORT workers=HOST:PORT state=DIR" on stdout when ready (tests
 * parse it). Settings (daemon/config.h): defaults, then the config file (--config or
 * $HPD_CONFIG), then the flags. SIGTERM/SIGINT: stop accepting, then --on-sigterm: checkpoint
 * (stop running jobs with a checkpoint; they resume at the next start) or cancel; exit 0.
 * SIGHUP: re-reads the config file and applies the live keys (slots, log-level, on-sigterm,
 * heartbeat-ms); without a config file it re-reads $HP_LOG_LEVEL. Logs are stderr (nothing to
 * reopen).
 */
#include "daemon/config.h"
#include "daemon/core.h"
#include "daemon/http.h"
#include "daemon/rpc.h"
#include "daemon/sdnotify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef HPD_VERSION
#define HPD_VERSION "0.0.0"
#endif

/* `hpd --help`: every key of config.def as a flag, then the flags that are not keys. */
static void usage(FILE *f) {
    fputs("usage: hpd [options]\n", f);
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        char flag[80];
        snprintf(flag, sizeof flag, "--%s %s", hpd_settings_key_name((hpd_key)k),
                 hpd_settings_key_arg((hpd_key)k));
        if (strlen(flag) > 26)
            fprintf(f, "  %s\n  %-26s ", flag, "");
        else
            fprintf(f, "  %-26s ", flag);
        for (const char *h = hpd_settings_key_help((hpd_key)k); *h; h++) {
            fputc(*h, f);
            if (*h == '\n') fprintf(f, "  %-26s ", "");
        }
        fputc('\n', f);
    }
    fputs("  --config FILE              'key = value' lines, keys named like these flags (default\n"
          "                             $HPD_CONFIG); flags win; SIGHUP re-reads it\n"
          "  --version, --help\n",
          f);
}

typedef struct opts {
    const char *listen, *worker_listen, *state_dir, *log_level, *tls_cert, *tls_key, *worker;
    const char *http;
    int slots;
} opts;

static uv_timer_t g_watchdog; /* WATCHDOG=1 (only when systemd set WatchdogSec) */
static hpd *g_d;

/* Settings: what the flags said (borrowed from argv), the config file, and the settings now. */
static const char *g_flags[HPD_KEY_COUNT];
static const char *g_config; /* NULL: none */
static hpd_settings g_cur;
static bool g_file_set[HPD_KEY_COUNT]; /* keys the config file set (at start) */
static int g_cpus = 1, g_hb_env;       /* the defaults of slots and heartbeat-ms (0: 1000) */

/* Defaults, then the config file, then the flags. Errors name FILE:LINE or the flag. */
static hp_status build_settings(hpd_settings *s, hp_err *err) {
    hpd_settings_defaults(s);
    if (g_config) HP_TRY(hpd_settings_load(s, g_config, g_file_set, err));
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        if (!g_flags[k]) continue;
        hp_status st = hpd_settings_set(s, (hpd_key)k, g_flags[k], err);
        if (st != HP_OK) {
            char m[HP_ERR_MSG_MAX];
            snprintf(m, sizeof m, "%s", err->msg);
            return hp_errf(err, st, "--%.*s", HP_ERR_MSG_MAX - 8, m);
        }
    }
    return HP_OK;
}

/* SIGHUP: the file again (the flags still win); the live keys change now (slots: the scheduler
 * uses the new capacity at once, running jobs are not touched; heartbeat-ms: from each job's
 * next attempt), the others are logged as needing a restart. A file that does not parse is
 * logged and the settings stay as they were. */
static void reload(void) {
    if (!g_config) {
        const char *lvl = getenv("HP_LOG_LEVEL");
        if (lvl) hp__log_set_level(lvl);
        hp__log("info", "event=reload signal=SIGHUP config=none log_level=%s",
                lvl ? lvl : "unchanged");
        return;
    }
    hpd_settings s;
    hp_err e = {0};
    if (build_settings(&s, &e) != HP_OK) {
        hp__log("error", "event=reload_failed config=%s error=\"%s\" note=\"kept the old config\"",
                g_config, e.msg);
        return;
    }
    int changed = 0;
    /* log-level first: the lines about the other keys are logged at the new level */
    for (int i = -1; i < HPD_KEY_COUNT; i++) {
        hpd_key k = i < 0 ? HPD_KEY_LOG_LEVEL : (hpd_key)i;
        if (i >= 0 && k == HPD_KEY_LOG_LEVEL) continue;
        if (hpd_settings_same(&g_cur, &s, k)) continue;
        char from[256], to[256];
        hpd_settings_format(&g_cur, k, from, sizeof from);
        hpd_settings_format(&s, k, to, sizeof to);
        if (k == HPD_KEY_LOG_LEVEL) {
            snprintf(g_cur.log_level, sizeof g_cur.log_level, "%s", s.log_level);
            hp__log_set_level(s.log_level);
        }
        if (!hpd_settings_key_live(k)) {
            hp__log("warn", "event=reload key=%s from=\"%s\" to=\"%s\" note=\"needs a restart\"",
                    hpd_settings_key_name(k), from, to);
            continue;
        }
        hp__log("info", "event=config_changed key=%s from=%s to=%s", hpd_settings_key_name(k), from,
                to);
        changed++;
        switch (k) {
        case HPD_KEY_SLOTS:
            g_cur.slots = s.slots;
            g_d->slots = s.slots > 0 ? s.slots : g_cpus;
            break;
        case HPD_KEY_LOG_LEVEL: /* applied above */
            break;
        case HPD_KEY_ON_SIGTERM:
            g_cur.on_sigterm = s.on_sigterm;
            g_d->on_sigterm = (int)s.on_sigterm;
            break;
        case HPD_KEY_METRICS_RETENTION:
            g_cur.metrics_retention_s = s.metrics_retention_s;
            hpd_http_set_retention(g_d, s.metrics_retention_s);
            break;
        case HPD_KEY_LAUNCH_TIMEOUT_S:
            g_cur.launch_timeout_s = s.launch_timeout_s;
            g_d->launch_timeout_ms = s.launch_timeout_s * 1000; /* the next tick uses it */
            break;
        case HPD_KEY_HEARTBEAT_MS:
            g_cur.heartbeat_ms = s.heartbeat_ms;
            g_d->heartbeat_ms = s.heartbeat_ms > 0 ? s.heartbeat_ms
                                : g_hb_env > 0     ? g_hb_env
                                                   : 1000;
            break;
        default:
            break;
        }
    }
    hp__log("info", "event=reload signal=SIGHUP config=%s changed=%d", g_config, changed);
    hp__core_tick(g_d); /* more slots: queued jobs start now */
}

/* ---- signals -------------------------------------------------------------------------------
 * SIGTERM, SIGINT and SIGHUP are blocked in every thread main starts (it blocks them first
 * thing; gRPC's threads and libuv's pool inherit the mask), and one thread takes them with
 * sigwait() and hands them to the loop. Left to the kernel, a process-wide signal goes to any
 * thread that has it unblocked, and under ThreadSanitizer one that landed on a gRPC thread could
 * stay pending there for good: hpd never stopped. Threads that exist before main (OpenBLAS
 * starts its pool from a constructor) still have them unblocked: there a handler passes the
 * signal on to the signal thread. Before the loop is ready, and once the first SIGTERM/SIGINT
 * has started the shutdown, a signal takes its default action (terminate), as before and as a
 * second Ctrl-C should. uv_spawn clears the mask in the processes it starts. */
enum { SIGS_STARTING, SIGS_SERVING, SIGS_STOPPING };
static sigset_t g_sig_set;
static uv_mutex_t g_sig_mu;
static int g_sig_state;        /* SIGS_*, under g_sig_mu */
static unsigned g_sig_bits;    /* signals for the loop (1 << signum), under g_sig_mu */
static uv_async_t g_sig_async; /* open only in SIGS_SERVING */
static uv_thread_t g_sig_thread;

static void sig_default(int signum) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(signum, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, signum);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(signum);
    _exit(128 + signum); /* not reached: all three terminate by default */
}

static void sig_thread(void *arg) {
    (void)arg;
    for (;;) {
        int signum = 0;
        if (sigwait(&g_sig_set, &signum) != 0) continue;
        uv_mutex_lock(&g_sig_mu);
        bool serving = g_sig_state == SIGS_SERVING;
        if (serving) {
            g_sig_bits |= 1u << signum;
            uv_async_send(&g_sig_async); /* under the lock: the loop closes it under the lock */
        }
        uv_mutex_unlock(&g_sig_mu);
        if (!serving) sig_default(signum);
    }
}

/* On a thread that has them unblocked (one started before main): to the signal thread, where
 * they are blocked and sigwait() takes them. pthread_kill is async-signal-safe. */
static void sig_forward(int signum) {
    int e = errno;
    pthread_kill(g_sig_thread, signum);
    errno = e;
}

/* First thing in main, before main starts any thread. */
static int signals_block(void) {
    sigemptyset(&g_sig_set);
    sigaddset(&g_sig_set, SIGTERM);
    sigaddset(&g_sig_set, SIGINT);
    sigaddset(&g_sig_set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &g_sig_set, NULL);
    int rc = uv_mutex_init(&g_sig_mu);
    if (rc == 0) rc = uv_thread_create(&g_sig_thread, sig_thread, NULL);
    if (rc != 0) {
        fprintf(stderr, "hpd: cannot start the signal thread: %s\n", uv_strerror(rc));
        return rc;
    }
    struct sigaction fw = {.sa_handler = sig_forward, .sa_flags = SA_RESTART};
    sigfillset(&fw.sa_mask);
    for (int sig = 1; sig < 32; sig++)
        if (sigismember(&g_sig_set, sig)) sigaction(sig, &fw, NULL);
    return 0;
}

static void on_signal(uv_async_t *h) {
    (void)h;
    uv_mutex_lock(&g_sig_mu);
    unsigned bits = g_sig_bits;
    g_sig_bits = 0;
    uv_mutex_unlock(&g_sig_mu);
    if (bits & (1u << SIGHUP)) reload();
    if (!(bits & (1u << SIGTERM | 1u << SIGINT))) return;
    hp__log("info", "event=shutdown signal=%s", bits & (1u << SIGTERM) ? "SIGTERM" : "SIGINT");
    hpd_sd_notify("STOPPING=1");
    if (uv_is_active((uv_handle_t *)&g_watchdog)) uv_close((uv_handle_t *)&g_watchdog, NULL);
    hpd_rpc_stop(g_d);
    hpd_http_stop(g_d);
    hpd_shutdown(g_d);
    uv_mutex_lock(&g_sig_mu);
    g_sig_state = SIGS_STOPPING;
    uv_close((uv_handle_t *)&g_sig_async, NULL);
    uv_mutex_unlock(&g_sig_mu);
}

/* The loop is ready: signals go to on_signal from now on. */
static void signals_serve(uv_loop_t *loop) {
    uv_async_init(loop, &g_sig_async, on_signal);
    uv_mutex_lock(&g_sig_mu);
    g_sig_state = SIGS_SERVING;
    uv_mutex_unlock(&g_sig_mu);
}

/* STATE_DIR/token: 32 random bytes as hex, mode 0600, created once. */
static int load_token(const char *dir, char out[65]) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/token", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        int ok = fscanf(f, "%64s", out) == 1 && strlen(out) == 64;
        fclose(f);
        if (ok) return 0;
        fprintf(stderr, "hpd: %s: not a 64-hex-digit token\n", path);
        return -1;
    }
    uint8_t b[32];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        fprintf(stderr, "hpd: getrandom: %s\n", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, out, 64) != 64 || write(fd, "\n", 1) != 1 || fsync(fd) != 0) {
        fprintf(stderr, "hpd: write %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

/* The GPUs this host has: its /dev/nvidiaN device nodes (no CUDA linkage in hpd); hpd's own
 * CUDA_VISIBLE_DEVICES, where set, wins (hpd_visible_gpus). */
static int count_gpus(void) {
    DIR *dir = opendir("/dev");
    if (!dir) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        const char *p = e->d_name;
        if (strncmp(p, "nvidia", 6) != 0 || !p[6]) continue;
        p += 6;
        while (*p >= '0' && *p <= '9') p++;
        n += *p == 0;
    }
    closedir(dir);
    return n;
}

static bool wildcard_host(const char *h) {
    return !*h || !strcmp(h, "0.0.0.0") || !strcmp(h, "[::]") || !strcmp(h, "::") ||
           !strcmp(h, "*");
}

/* The address workers dial: --advertise (its port, else the bound one), else the bind host
 * unless it is a wildcard; a wildcard with the local launcher is loopback (the workers run
 * here). Other launchers with a wildcard need --advertise (checked before starting). */
static void advertised(char *out, size_t len, const char *bind_host, int port) {
    const char *a = g_cur.advertise;
    if (a[0]) {
        const char *rb = a[0] == '[' ? strchr(a, ']') : NULL;
        const char *colon = strrchr(rb ? rb : a, ':');
        if (colon)
            snprintf(out, len, "%s", a);
        else
            snprintf(out, len, "%s:%d", a, port);
        return;
    }
    snprintf(out, len, "%.200s:%d", wildcard_host(bind_host) ? "127.0.0.1" : bind_host, port);
}

/* Whether HOST of "HOST:PORT" / "[V6]:PORT" is a loopback address or name. */
static bool loopback_addr(const char *addr) {
    const char *colon = strrchr(addr, ':');
    size_t n = colon ? (size_t)(colon - addr) : strlen(addr);
    char h[256];
    if (n >= sizeof h) return false;
    memcpy(h, addr, n);
    h[n] = 0;
    if (h[0] == '[' && n > 2 && h[n - 1] == ']') {
        memmove(h, h + 1, n - 2);
        h[n - 2] = 0;
    }
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4) || !strcmp(h, "::1");
}

/* A listener beyond loopback without TLS: the bearer token and every reply travel in clear,
 * and without --auth all anyone who reaches it reads every job. Said once at start. */
static void warn_exposed(const char *what, const char *addr, bool tls, bool auth_all) {
    if (tls || loopback_addr(addr)) return;
    hp__log("warn",
            "event=exposed_without_tls listener=%s addr=%s auth=%s note=\"the token and the "
            "replies travel in clear%s; serve it on loopback behind a TLS proxy%s\"",
            what, addr, auth_all ? "all" : "mutating",
            auth_all ? "" : ", and reads need no token (--auth all)",
            strcmp(what, "grpc") == 0 ? ", or pass --tls-cert/--tls-key" : "");
}

static void on_watchdog(uv_timer_t *t) {
    (void)t;
    hpd_sd_notify("WATCHDOG=1");
}

int main(int argc, char **argv) {
    if (signals_block() != 0) return 1;
    hpd_sd_init();
    opts o = {.listen = "127.0.0.1:7070",
              .worker_listen = "127.0.0.1:0",
              .log_level = "info",
              .http = "127.0.0.1:7071"};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o.slots = cpus > 0 ? (int)cpus : 1;
    /* The long options: one per config key (config.def; the value is checked with the file's
     * in build_settings), then --config, --version, --help. */
    enum { O_KEY = 256, O_CONFIG = O_KEY + HPD_KEY_COUNT, O_VER };
    struct option longs[HPD_KEY_COUNT + 4];
    for (int k = 0; k < HPD_KEY_COUNT; k++)
        longs[k] =
            (struct option){hpd_settings_key_name((hpd_key)k), required_argument, 0, O_KEY + k};
    longs[HPD_KEY_COUNT] = (struct option){"config", required_argument, 0, O_CONFIG};
    longs[HPD_KEY_COUNT + 1] = (struct option){"version", no_argument, 0, O_VER};
    longs[HPD_KEY_COUNT + 2] = (struct option){"help", no_argument, 0, 'h'};
    longs[HPD_KEY_COUNT + 3] = (struct option){0, 0, 0, 0};
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c >= O_KEY && c < O_KEY + HPD_KEY_COUNT) { /* it overrides the file */
            if (!strncmp(optarg, "--", 2)) {           /* getopt took the next flag for the value */
                fprintf(stderr, "hpd: --%s: missing value (got the flag '%s')\n",
                        hpd_settings_key_name((hpd_key)(c - O_KEY)), optarg);
                return 2;
            }
            g_flags[c - O_KEY] = optarg;
            continue;
        }
        switch (c) {
        case O_CONFIG:
            g_config = optarg;
            break;
        case O_VER:
            printf("hpd %s\n", HPD_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "hpd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!g_config && getenv("HPD_CONFIG") && *getenv("HPD_CONFIG")) g_config = getenv("HPD_CONFIG");
    g_cpus = cpus > 0 ? (int)cpus : 1;
    const char *hb = getenv("HPD_HEARTBEAT_MS"); /* tests shorten it */
    if (hb) g_hb_env = atoi(hb);
    hp_err cerr = {0};
    if (build_settings(&g_cur, &cerr) != HP_OK) {
        fprintf(stderr, "hpd: %s\n", cerr.msg);
        return 2;
    }
    /* o: the settings (defaults, file, flags) as the rest of main uses them. */
    o.listen = g_cur.listen;
    o.worker_listen = g_cur.worker_listen;
    o.http = g_cur.http;
    o.log_level = g_cur.log_level;
    if (g_cur.slots > 0) o.slots = g_cur.slots;
    if (g_cur.state_dir[0]) o.state_dir = g_cur.state_dir;
    if (g_cur.tls_cert[0]) o.tls_cert = g_cur.tls_cert;
    if (g_cur.tls_key[0]) o.tls_key = g_cur.tls_key;
    if (g_cur.worker[0]) o.worker = g_cur.worker;
    if (!o.tls_cert != !o.tls_key) {
        fprintf(stderr, "hpd: --tls-cert and --tls-key go together\n");
        return 2;
    }
    hp__log_set_level(o.log_level);
    {
        const char *c = strrchr(o.worker_listen, ':');
        char h[HPD_VALUE_MAX];
        snprintf(h, sizeof h, "%.*s", (int)(c - o.worker_listen), o.worker_listen);
        if (g_cur.launcher != HPD_LAUNCHER_LOCAL && wildcard_host(h) && !g_cur.advertise[0]) {
            fprintf(stderr,
                    "hpd: --worker-listen %s is a wildcard: with --launcher %s the workers run "
                    "elsewhere, so give the address they dial with --advertise HOST[:PORT]\n",
                    o.worker_listen,
                    g_cur.launcher == HPD_LAUNCHER_SLURM     ? "slurm"
                    : g_cur.launcher == HPD_LAUNCHER_SYSTEMD ? "systemd"
                                                             : "external");
            return 2;
        }
    }

    if (g_cur.gpus >= 0 && g_cur.launcher != HPD_LAUNCHER_LOCAL) {
        fprintf(stderr,
                "hpd: gpus %d: only the local launcher hands out GPUs; with --launcher %s its "
                "scheduler places them (leave gpus unset)\n",
                g_cur.gpus,
                g_cur.launcher == HPD_LAUNCHER_SLURM     ? "slurm"
                : g_cur.launcher == HPD_LAUNCHER_SYSTEMD ? "systemd"
                                                         : "external");
        return 2;
    }

    /* Under a CUDA_VISIBLE_DEVICES of its own (a shared host, a scheduler's allocation) the
     * local launcher hands out that list's GPUs, and no more than it names. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int n_vis = vis ? hpd_visible_gpus(vis, -1, NULL, 0) : -1;
    if (g_cur.launcher == HPD_LAUNCHER_LOCAL && vis && g_cur.gpus > n_vis) {
        fprintf(stderr,
                "hpd: gpus %d: hpd's CUDA_VISIBLE_DEVICES '%.64s' names %d GPU%s, and hpd hands "
                "out only those\n",
                g_cur.gpus, vis, n_vis, n_vis == 1 ? "" : "s");
        return 2;
    }

    char state[PATH_MAX];
    const char *env = getenv("HP_STATE_DIR"), *home = getenv("HOME");
    if (o.state_dir)
        snprintf(state, sizeof state, "%s", o.state_dir);
    else if (env && *env)
        snprintf(state, sizeof state, "%s", env);
    else
        snprintf(state, sizeof state, "%.3000s/.local/state/hp", home ? home : "/tmp");
    hp_err err = {0};
    if (hp_mkdir_p(state, &err) != HP_OK) {
        fprintf(stderr, "hpd: %s\n", err.msg);
        return 1;
    }
    /* Absolute: the launchers hand its paths to processes in other dirs (Slurm jobs). */
    char abs_state[PATH_MAX];
    if (!realpath(state, abs_state)) {
        fprintf(stderr, "hpd: %s: %s\n", state, strerror(errno));
        return 1;
    }
    snprintf(state, sizeof state, "%s", abs_state);
    /* One daemon per state dir: the lock lives as long as the process (kill -9 releases it). */
    char lock[PATH_MAX + 16];
    snprintf(lock, sizeof lock, "%s/hpd.lock", state);
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0 || flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "hpd: %s: %s (another hpd uses this state dir?)\n", lock,
                lfd < 0 ? strerror(errno) : "locked");
        return 1;
    }
    char token[65] = {0};
    if (load_token(state, token) != 0) return 1;

    uv_loop_t *loop = uv_default_loop();
    hpd_config cfg = {
        .state_dir = state,
        .slots = o.slots,
        .gpus = g_cur.gpus >= 0 ? g_cur.gpus
                : vis           ? n_vis
                                : count_gpus(),
        .worker_path = o.worker,
        .heartbeat_ms = g_cur.heartbeat_ms > 0 ? g_cur.heartbeat_ms : g_hb_env,
        .on_sigterm = (int)g_cur.on_sigterm,
        .launcher = (int)g_cur.launcher,
        .comm = (int)g_cur.comm,
        .launch_timeout_s = g_cur.launch_timeout_s,
        .slurm = {.partition = g_cur.slurm_partition,
                  .account = g_cur.slurm_account,
                  .qos = g_cur.slurm_qos,
                  .time_limit = g_cur.slurm_time,
                  .poll_ms = g_cur.slurm_poll_ms,
                  .in_allocation = getenv("SLURM_JOB_ID") != NULL && *getenv("SLURM_JOB_ID") != 0},
        .systemd = {.user = g_cur.systemd_manager == HPD_SYSTEMD_USER ||
                            (g_cur.systemd_manager == HPD_SYSTEMD_AUTO && geteuid() != 0),
                    .token_file = g_cur.systemd_token_file,
                    .slice = g_cur.systemd_slice,
                    .poll_ms = g_cur.systemd_poll_ms}};
    hpd *d = NULL;
    if (hpd_new(loop, &cfg, &d, &err) != HP_OK) {
        fprintf(stderr, "hpd: %s\n", err.msg);
        return 1;
    }
    g_d = d;
    memcpy(d->token, token, sizeof token);
    d->auth_all = g_cur.auth_all;
    int wport = 0, gport = 0;
    char whost[HPD_VALUE_MAX], why[300] = "";
    snprintf(whost, sizeof whost, "%.*s", (int)(strrchr(o.worker_listen, ':') - o.worker_listen),
             o.worker_listen);
    /* Socket activation: the sockets systemd passed win over --worker-listen / --http. */
    int wfd = hpd_sd_listen_take("workers", why, sizeof why);
    int hfd = wfd == -2 ? -1 : hpd_sd_listen_take("http", why, sizeof why);
    hp_status ws_st = HP_OK;
    if (wfd == -2 || hfd == -2)
        ws_st = hp_errf(&err, HP_INVALID, "%s", why);
    else if (wfd >= 0)
        ws_st = hp__workers_start_fd(d, wfd, whost, sizeof whost, &wport, &err);
    else
        ws_st = hp__workers_start(d, o.worker_listen, &wport, &err);
    if (ws_st != HP_OK) {
        fprintf(stderr, "hpd: %s\n", err.msg);
        hpd_shutdown(d);
        uv_run(loop, UV_RUN_DEFAULT);
        hpd_free(d);
        return 1;
    }
    {
        char unused[256];
        if (wfd >= 0 || hfd >= 0)
            hp__log("info", "event=socket_activation workers=%s http=%s",
                    wfd >= 0 ? "passed" : "bound", hfd >= 0 ? "passed" : "bound");
        if (hpd_sd_listen_unused(unused, sizeof unused) > 0)
            hp__log("warn",
                    "event=socket_activation_unused sockets=\"%s\" note=\"hpd takes "
                    "'workers' and 'http' (FileDescriptorName=)\"",
                    unused);
    }
    advertised(d->worker_addr, sizeof d->worker_addr, whost, wport);
    if (hpd_rpc_start(d, o.listen, o.tls_cert, o.tls_key, &gport, &err) != HP_OK) {
        fprintf(stderr, "hpd: --listen %s: %s\n", o.listen, err.msg);
        hpd_shutdown(d);
        uv_run(loop, UV_RUN_DEFAULT);
        hpd_free(d);
        return 1;
    }
    char http_addr[80] = "off";
    if (strcmp(o.http, "off") != 0 || hfd > 0) {
        hpd_http_config hc = {
            .addr = o.http, .retention_s = g_cur.metrics_retention_s, .fd = hfd > 0 ? hfd : 0};
        /* The default address taken (another hpd on this host, say) is not worth refusing to
         * start for: serve without HTTP and say so. An address asked for is. */
        bool asked = g_flags[HPD_KEY_HTTP] || g_file_set[HPD_KEY_HTTP];
        hp_status hs = hpd_http_start(d, &hc, http_addr, sizeof http_addr, &err);
        if (hs != HP_OK && !asked) {
            hp__log("warn",
                    "event=http_disabled addr=%s error=\"%s\" note=\"the default address is "
                    "taken; pass --http HOST:PORT (0: any port) or --http off\"",
                    o.http, err.msg);
            fprintf(stderr, "hpd: warning: --http %s: %s; serving without HTTP\n", o.http, err.msg);
            snprintf(http_addr, sizeof http_addr, "off");
        } else if (hs != HP_OK) {
            fprintf(stderr, "hpd: --http %s: %s\n", o.http, err.msg);
            hpd_rpc_stop(d);
            hpd_shutdown(d);
            uv_run(loop, UV_RUN_DEFAULT);
            hpd_free(d);
            return 1;
        }
    }
    warn_exposed("grpc", o.listen, o.tls_cert != NULL, d->auth_all);
    if (strcmp(http_addr, "off") != 0) warn_exposed("http", http_addr, false, d->auth_all);
    signals_serve(loop);
    char ghost[64];
    snprintf(ghost, sizeof ghost, "%.*s", (int)(strrchr(o.listen, ':') - o.listen), o.listen);
    printf("hpd listening grpc=%s:%d workers=%s state=%s http=%s launcher=%s\n", ghost, gport,
           d->worker_addr, state, http_addr, d->launcher->vt->name);
    fflush(stdout);
    hp__log("info",
            "event=ready grpc=%s:%d workers=%s worker_bind=%s:%d state=%s slots=%d gpus=%d "
            "launcher=%s version=%s",
            ghost, gport, d->worker_addr, whost, wport, state, d->slots, d->gpus,
            d->launcher->vt->name, HPD_VERSION);
    char ready[800];
    snprintf(ready, sizeof ready, "READY=1\nSTATUS=listening grpc=%s:%d workers=%s\nMAINPID=%ld",
             ghost, gport, d->worker_addr, (long)getpid());
    int nr = hpd_sd_notify(ready);
    if (nr < 0) hp__log("warn", "event=sd_notify_failed error=\"%s\"", strerror(-nr));
    uint64_t wd = hpd_sd_watchdog_usec();
    if (wd) {
        uint64_t ms = wd / 2000 > 0 ? wd / 2000 : 1; /* half the interval, as systemd advises */
        uv_timer_init(loop, &g_watchdog);
        uv_timer_start(&g_watchdog, on_watchdog, 0, ms);
        hp__log("info", "event=watchdog interval_ms=%llu", (unsigned long long)ms);
    }
    hp__core_tick(d); /* recovered jobs restart now, not a second later */
    uv_run(loop, UV_RUN_DEFAULT);
    hpd_free(d);
    uv_loop_close(loop);
    hp__log("info", "event=exit status=0");
    close(lfd);
    return 0;
}
