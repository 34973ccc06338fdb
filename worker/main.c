/* worker/main.c — hp-worker: one rank of a job. Standalone mode runs a job file with no
 * coordinator (the way to try a model in seconds):
 *
 *   hp-worker --standalone JOB.pb [--world N] [--steps N] [--out DIR]
 *             [--init-from W.safetensors] [--data F.bin] [--resume DIR] [--threads N]
 *             [--profile-steps S,S,...]
 *
 * With --world N > 1 this process is a launcher (like torchrun --standalone): it starts N
 * rank processes of itself (--rank R --comm NAME), joined by the shm communicator, passes
 * rank 0's output through, and if any rank dies it stops the others and fails naming it.
 *
 * Coordinator mode takes the job from hpd (worker/agent.h):
 *
 *   hp-worker --coordinator HOST:PORT --job ID --rank R --token T [--threads N]
 *             [--profile-steps S,S,...]
 *
 * Under Slurm the rank and world come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, and
 * --coordinator, --job and --token may come from HP_COORDINATOR, HP_JOB and HP_TOKEN (or the
 * token from the file --token-file / $HP_TOKEN_FILE names: hpd's launchers pass it so).
 *
 * The job's device picks the backend (worker/backend.h); one this hp-worker cannot run (cuda
 * without a CUDA backend or device) fails at start with one line, exit 1.
 *
 * Ctrl-C (SIGINT) or SIGTERM stops after the current step, writes a checkpoint when --out is
 * given, and exits 130. Exit codes: 0 done, 1 error, 2 usage, 130 interrupted (or stopped by
 * the coordinator). */
#include "hp/comm.h"
#include "hp/device.h"
#include "hp/job.h"
#include "hp/passes.h"
#include "hp/threads.h"
#include "worker/agent.h"
#include "worker/backend.h"
#include "worker/probe.h"
#include "worker/train.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    /* atomic: the agent's I/O thread sets the same flag (a Stop frame) while the handler runs
     * on the main thread; a plain store would race with it (found by TSan). */
    __atomic_store_n(&stop_requested, 1, __ATOMIC_RELAXED);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "hp-worker: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (try hp-worker --help)\n");
    return 2;
}

static void usage(void) {
    puts("usage: hp-worker --standalone JOB.pb [flags]\n"
         "       hp-worker --probe-profile [--threads N]   measure and cache the cpu cost "
         "profile\n"
         "       hp-worker --coordinator HOST:PORT --job ID --rank R --token T [--threads N]\n"
         "                 [--profile-steps S,S]\n"
         "\n"
         "  --standalone JOB.pb    run the job in this process, no coordinator\n"
         "  --steps N              train N steps (default: the job's)\n"
         "  --on-nonfinite stop|skip  a NaN/Inf loss or grad norm fails the run (default: the\n"
         "                         job's, stop) or skips that step's update (counted)\n"
         "  --out DIR              write metrics.jsonl, checkpoints/ and model.safetensors here\n"
         "  --init-from FILE       initial weights (safetensors, PyTorch FQNs)\n"
         "  --data PATH            llm.c token shard(s) (.bin, dir or glob), or text:PATH\n"
         "                         (default: the job's; else the built-in corpus)\n"
         "  --resume DIR           continue from the latest checkpoint in DIR\n"
         "  --world N              run N ranks on this host (FSDP over the shm backend)\n"
         "  --comm-backend shm|tcp how the ranks talk (default shm: one host); tcp also runs\n"
         "                         ranks on several hosts (each started with --rank R)\n"
         "  --comm-addr HOST:PORT  tcp: rank 0 listens there, the others connect (secret in\n"
         "                         $HP_COMM_SECRET, at least 16 characters, the same on all)\n"
         "  --comm-file PATH       tcp: rank 0 writes its address and a fresh secret there\n"
         "                         (a shared directory), the others wait for it (default:\n"
         "                         $TMPDIR/NAME.tcp for the ranks of one --world launch)\n"
         "  --comm-bind ADDR       tcp: the local address to listen on (default: rank 0\n"
         "                         127.0.0.1, the others the address that reaches rank 0)\n"
         "  --threads N            compute threads per rank (default: $HP_NUM_THREADS, or the\n"
         "                         CPUs divided among the ranks)\n"
         "  --profile-steps S,S    trace these steps (besides the job's profile_steps): a\n"
         "                         Chrome/Perfetto trace per rank and step, in\n"
         "                         OUT/traces/step-S-rank-R.json (standalone; OUT is --out or\n"
         "                         .) or sent to the coordinator; the flag may repeat\n"
         "\n"
         "  --coordinator HOST:PORT  take the job from hpd ($HP_COORDINATOR)\n"
         "  --job ID               the job's id ($HP_JOB)\n"
         "  --token T              the job's worker token ($HP_TOKEN)\n"
         "  --token-file F         read the token from F ($HP_TOKEN_FILE; launchers use this)\n"
         "  --rank R               this rank (default: $SLURM_PROCID)\n"
         "\n"
         "Ctrl-C stops after the current step with a checkpoint (exit 130).");
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "hp-worker: %s: '%s' is not an integer in [%lld, %lld]\n", flag, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

/* --profile-steps 5,6: positive steps separated by commas, appended to *steps. 2 (usage) when
 * an item is not a step or there are more than HP_JOB_PROFILE_MAX. */
static int parse_profile_steps(const char *v, int64_t *steps, int *n) {
    const char *p = v;
    for (;;) {
        size_t k = strcspn(p, ",");
        char item[32];
        long long step = 0;
        char *end = NULL;
        bool ok = k > 0 && k < sizeof item;
        if (ok) {
            memcpy(item, p, k);
            item[k] = 0;
            errno = 0;
            step = strtoll(item, &end, 10);
            ok = *end == 0 && errno == 0 && step >= 1 && item[0] != '+';
        }
        if (!ok) {
            fprintf(stderr,
                    "hp-worker: --profile-steps: '%.*s' is not a step (want positive integers "
                    "separated by commas, e.g. 5,6)\n",
                    (int)(k < 40 ? k : 40), p);
            return 2;
        }
        if (*n >= HP_JOB_PROFILE_MAX) {
            fprintf(stderr, "hp-worker: --profile-steps: more than %d steps (at '%s')\n",
                    HP_JOB_PROFILE_MAX, item);
            return 2;
        }
        steps[(*n)++] = step;
        if (!p[k]) return 0;
        p += k + 1;
    }
}

/* ---- launcher (--world N without --rank) --------------------------------------------------- */

static pid_t children[1024];
static int n_children;

static void forward_signal(int sig) {
    for (int r = 0; r < n_children; r++)
        if (children[r] > 0) kill(children[r], sig);
}

static void describe(int status, char *buf, size_t len) {
    if (WIFEXITED(status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "was killed by signal %d", WTERMSIG(status));
    else
        snprintf(buf, len, "ended (status 0x%x)", status);
}

/* Starts `world` copies of this program with --rank R --comm NAME appended, waits for them,
 * and returns the exit code: 0 when all succeed, 130 when they were interrupted, 1 when a
 * rank failed (the others are stopped: SIGTERM, then SIGKILL after 10 s). */
static int launch(int argc, char **argv, int world, int threads) {
    char comm[64], rank_s[16], threads_s[16];
    snprintf(comm, sizeof comm, "hp-%ld-%ld", (long)getpid(), (long)time(NULL));
    snprintf(threads_s, sizeof threads_s, "%d", threads);
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) return 1;
    for (int i = 0; i < argc; i++) args[i] = argv[i];
    struct sigaction sa = {.sa_handler = forward_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (int r = 0; r < world; r++) {
        snprintf(rank_s, sizeof rank_s, "%d", r);
        int k = argc;
        args[k++] = "--rank", args[k++] = rank_s, args[k++] = "--comm", args[k++] = comm;
        args[k++] = "--threads", args[k++] = threads_s, args[k] = NULL;
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "hp-worker: fork: %s\n", strerror(errno));
            forward_signal(SIGKILL);
            free(args);
            return 1;
        }
        if (pid == 0) {
            if (r > 0 && !freopen("/dev/null", "w", stdout)) _exit(127); /* rank 0 speaks */
            execv("/proc/self/exe", args);
            fprintf(stderr, "hp-worker: exec: %s\n", strerror(errno));
            _exit(127);
        }
        children[n_children++] = pid;
    }
    free(args);
    int rc = 0, left = world;
    bool stopping = false;
    time_t kill_at = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, stopping ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) break;
        if (pid == 0) { /* stopping: escalate after the grace period */
            if (time(NULL) >= kill_at) forward_signal(SIGKILL);
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int r = 0;
        while (r < n_children && children[r] != pid) r++;
        if (r == n_children) continue;
        children[r] = 0;
        left--;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        bool interrupted = WIFEXITED(status) && WEXITSTATUS(status) == 130;
        if (interrupted && rc == 0) rc = 130;
        if (!ok && !interrupted && rc != 1) {
            /* The other ranks soon fail too, *because* of this one (a dead peer). On a loaded
             * machine the kernel may hand us such a follower first: a peer killed by a signal
             * is seen dead by its peers (its thread-group leader is a zombie) while its other
             * threads still exit, before waitpid can report it. So when the first exit is
             * not a signal, wait up to 1 s for the others, and name one killed by a signal
             * (the cause) before one that exited with an error of its own. */
            int st2;
            pid_t p2;
            struct timespec deadline;
            clock_gettime(CLOCK_MONOTONIC, &deadline);
            deadline.tv_sec += 1;
            for (;;) {
                p2 = waitpid(-1, &st2, WNOHANG);
                if (p2 < 0 && errno == EINTR) continue;
                if (p2 == 0 && !WIFSIGNALED(status) && left > 0) {
                    struct timespec now, nap = {0, 10 * 1000 * 1000};
                    clock_gettime(CLOCK_MONOTONIC, &now);
                    if (now.tv_sec > deadline.tv_sec ||
                        (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec))
                        break;
                    nanosleep(&nap, NULL);
                    continue;
                }
                if (p2 <= 0) break;
                int r2 = 0;
                while (r2 < n_children && children[r2] != p2) r2++;
                if (r2 == n_children) continue;
                children[r2] = 0;
                left--;
                if (WIFSIGNALED(st2) && !WIFSIGNALED(status)) {
                    char later[64];
                    describe(status, later, sizeof later);
                    fprintf(stderr, "hp-worker: rank %d (pid %ld) %s\n", r, (long)pid, later);
                    r = r2, pid = p2, status = st2;
                } else {
                    char later[64];
                    describe(st2, later, sizeof later);
                    fprintf(stderr, "hp-worker: rank %d (pid %ld) %s\n", r2, (long)p2, later);
                }
            }
            char what[64];
            describe(status, what, sizeof what);
            fprintf(stderr, "hp-worker: rank %d (pid %ld) %s; stopping the other ranks\n", r,
                    (long)pid, what);
            rc = 1;
            if (!stopping) {
                stopping = true;
                kill_at = time(NULL) + 10;
                forward_signal(SIGTERM);
            }
        }
    }
    /* --comm-backend tcp's rendezvous file, if rank 0 died before removing it */
    char file[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(file, sizeof file, "%s/%s.tcp", tmp && *tmp ? tmp : "/tmp", comm);
    unlink(file);
    return rc;
}

/* ---- coordinator mode ---------------------------------------------------------------------- */

/* An integer environment variable; 0 when unset, 2 (usage) when malformed. */
static int env_int(const char *name, long long lo, long long hi, long long *out, bool *set) {
    const char *v = getenv(name);
    *set = v && *v;
    if (!*set) return 0;
    return parse_int(name, v, lo, hi, out);
}

/* A launcher's 0600 token file: the token stays off the command line (ps shows that). 2 (usage)
 * when it cannot be read or is empty. */
static int read_token_file(const char *path, char *out, size_t len) {
    hp_err err = {0};
    int fd;
    FILE *f = NULL;
    if (hp_file_open_read(path, &fd, NULL, &err) == HP_OK && !(f = fdopen(fd, "r"))) {
        snprintf(err.msg, sizeof err.msg, "%s: %s", path, strerror(errno));
        close(fd);
    }
    if (!f) {
        fprintf(stderr, "hp-worker: token file %s\n", err.msg);
        return 2;
    }
    char fmt[16];
    snprintf(fmt, sizeof fmt, "%%%zus", len - 1);
    int ok = fscanf(f, fmt, out) == 1;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "hp-worker: token file %s: empty\n", path);
        return 2;
    }
    return 0;
}

static int run_agent(hp_agent_opts *ao, bool rank_given, const char *token_file) {
    long long n;
    bool set;
    hp_err aerr = {0};
    if (hp_agent_check_addr(ao->coordinator, &aerr) != HP_OK) { /* never wait on a bad one */
        fprintf(stderr, "hp-worker: %s (try hp-worker --help)\n", aerr.msg);
        return 2;
    }
    if (!ao->job_id) ao->job_id = getenv("HP_JOB");
    /* --token, then --token-file, then $HP_TOKEN, then $HP_TOKEN_FILE */
    static char file_token[128];
    if (!ao->token && token_file && read_token_file(token_file, file_token, sizeof file_token))
        return 2;
    if (!ao->token && token_file) ao->token = file_token;
    if (!ao->token) ao->token = getenv("HP_TOKEN");
    const char *tf = getenv("HP_TOKEN_FILE");
    if (!ao->token && tf && *tf) {
        if (read_token_file(tf, file_token, sizeof file_token)) return 2;
        ao->token = file_token;
    }
    if (!ao->token)
        return usage_error("%s",
                           "--token T, $HP_TOKEN, --token-file F or $HP_TOKEN_FILE is required");
    if (env_int("SLURM_PROCID", 0, 65535, &n, &set)) return 2;
    if (set && !rank_given) ao->rank = (int)n, rank_given = true;
    if (!rank_given) return usage_error("%s", "--rank R (or $SLURM_PROCID) is required");
    if (env_int("SLURM_NTASKS", 1, 65536, &n, &set)) return 2;
    if (set) ao->world = (int)n;
    if (env_int("SLURM_LOCALID", 0, 65535, &n, &set)) return 2;
    if (set) ao->local_rank = (int)n;
    if (env_int("HP_WELCOME_TIMEOUT_S", 1, 86400, &n, &set)) return 2;
    if (set) ao->welcome_timeout_s = (double)n;

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    ao->stop = &stop_requested;

    hp_agent_result res;
    hp_err err = {0};
    if (hp_agent_run(ao, &res, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: rank %d: %s\n", ao->rank, err.msg);
        return 1;
    }
    return res.stopped ? 130 : 0;
}

/* ---- --comm-backend tcp -----------------------------------------------------------------------
 */

typedef struct tcp_flags {
    bool tcp;
    const char *addr, *file, *bind;
} tcp_flags;

/* The rendezvous file of this run: --comm-file, else $TMPDIR/NAME.tcp for a --world launch. */
static void tcp_file_path(const tcp_flags *tc, const char *comm_name, char *out, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    if (tc->file)
        snprintf(out, cap, "%s", tc->file);
    else
        snprintf(out, cap, "%s/%s.tcp", tmp && *tmp ? tmp : "/tmp", comm_name ? comm_name : "hp");
}

static hp_status publish_file(const char *addr, void *ctx, hp_err *err) {
    const char *const *file_secret = ctx;
    return hp_tcp_addr_file_write(file_secret[0], addr, file_secret[1], err);
}

/* Joins the tcp communicator as this rank: through --comm-addr and $HP_COMM_SECRET, or the
 * rendezvous file (rank 0 writes its address and a fresh secret, removed once all joined). */
static hp_status tcp_join(const tcp_flags *tc, int rank, int world, const char *comm_name,
                          hp_comm **out, hp_err *err) {
    char path[4096], addr[256] = "", secret[256] = "", host[256] = "";
    hp_tcp_opts to = {.rank = rank, .world = world, .timeout_s = 60, .bind_host = tc->bind};
    const char *file_secret[2] = {path, secret};
    if (tc->addr) {
        const char *env = getenv("HP_COMM_SECRET");
        if (!env || !*env) return hp_errf(err, HP_INVALID, "--comm-addr needs $HP_COMM_SECRET");
        snprintf(secret, sizeof secret, "%s", env);
        to.addr = tc->addr;
        const char *colon = strrchr(tc->addr, ':');
        if (rank == 0) { /* listen where the others will connect */
            if (!colon || colon == tc->addr || (size_t)(colon - tc->addr) >= sizeof host)
                return hp_errf(err, HP_INVALID, "--comm-addr %.200s is not HOST:PORT", tc->addr);
            memcpy(host, tc->addr, (size_t)(colon - tc->addr));
            size_t hl = strlen(host);
            if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
                memmove(host, host + 1, hl - 2);
                host[hl - 2] = '\0';
            }
            char *end = NULL;
            long port = strtol(colon + 1, &end, 10);
            if (!end || *end || port < 1 || port > 65535)
                return hp_errf(err, HP_INVALID, "--comm-addr %.200s: bad port", tc->addr);
            to.port = (int)port;
            if (!tc->bind) to.bind_host = host;
        }
    } else {
        tcp_file_path(tc, comm_name, path, sizeof path);
        if (rank == 0) {
            hp_tcp_secret_new(secret);
            to.publish = publish_file;
            to.publish_ctx = file_secret;
        } else {
            HP_TRY(hp_tcp_addr_file_wait(path, to.timeout_s, addr, sizeof addr, secret,
                                         sizeof secret, err));
            to.addr = addr;
        }
    }
    to.secret = secret;
    hp_status st = hp_tcp_comm_new(&to, out, err);
    if (!tc->addr && rank == 0) unlink(path); /* everyone has read it (or the join failed) */
    return st;
}

int main(int argc, char **argv) {
    /* OpenBLAS's idle threads spin ~0.1 s after each GEMM and steal the cores our own pool
     * computes on; it reads its timeout only when it loads, so set it and start again. */
    if (!getenv("OPENBLAS_THREAD_TIMEOUT") && setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) == 0)
        execv("/proc/self/exe", argv); /* on failure, go on as we are */

    const char *job_path = NULL;
    hp_train_opts o = {.stop = &stop_requested};
    hp_agent_opts ao = {.coordinator = NULL};
    tcp_flags tc = {0};
    bool rank_given = false;
    const char *token_file = NULL;
    int64_t profile[HP_JOB_PROFILE_MAX];
    int n_profile = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--version")) {
            puts("hp-worker 0.1.0");
            return 0;
        }
        if (!strcmp(a, "--probe-profile")) { /* worker/probe.h */
            long long t = 0;
            for (int k = i + 1; k + 1 < argc; k++)
                if (!strcmp(argv[k], "--threads") &&
                    parse_int("--threads", argv[k + 1], 1, 1024, &t))
                    return 2;
            return hp__probe_profile((int)t, false);
        }
        if (i + 1 >= argc) return usage_error("%s: missing value", a);
        const char *v = argv[++i];
        long long n;
        if (!strcmp(a, "--standalone"))
            job_path = v;
        else if (!strcmp(a, "--coordinator"))
            ao.coordinator = v;
        else if (!strcmp(a, "--job"))
            ao.job_id = v;
        else if (!strcmp(a, "--token"))
            ao.token = v;
        else if (!strcmp(a, "--token-file"))
            token_file = v;
        else if (!strcmp(a, "--out"))
            o.out_dir = v;
        else if (!strcmp(a, "--init-from"))
            o.init_from = v;
        else if (!strcmp(a, "--data"))
            o.data = v;
        else if (!strcmp(a, "--resume"))
            o.resume = v;
        else if (!strcmp(a, "--on-nonfinite")) {
            if (strcmp(v, "stop") && strcmp(v, "skip"))
                return usage_error("--on-nonfinite: '%s' is not stop or skip", v);
            o.on_nonfinite = !strcmp(v, "skip") ? HP_TRAIN_NONFINITE_SKIP : HP_TRAIN_NONFINITE_STOP;
        } else if (!strcmp(a, "--steps")) {
            if (parse_int(a, v, 1, (long long)1e12, &n)) return 2;
            o.steps = n;
        } else if (!strcmp(a, "--threads")) {
            if (parse_int(a, v, 1, 1024, &n)) return 2;
            o.threads = (int)n;
        } else if (!strcmp(a, "--world")) {
            if (parse_int(a, v, 1, 1024, &n)) return 2;
            o.world = (int)n;
        } else if (!strcmp(a, "--rank")) { /* set by the launcher */
            if (parse_int(a, v, 0, 1023, &n)) return 2;
            o.rank = (int)n;
            rank_given = true;
        } else if (!strcmp(a, "--comm")) { /* set by the launcher */
            o.comm_name = v;
        } else if (!strcmp(a, "--comm-backend")) {
            if (strcmp(v, "shm") && strcmp(v, "tcp"))
                return usage_error("--comm-backend: '%s' is not shm or tcp", v);
            tc.tcp = !strcmp(v, "tcp");
        } else if (!strcmp(a, "--comm-addr")) {
            tc.addr = v;
        } else if (!strcmp(a, "--comm-file")) {
            tc.file = v;
        } else if (!strcmp(a, "--comm-bind")) {
            tc.bind = v;
        } else if (!strcmp(a, "--profile-steps")) {
            if (parse_profile_steps(v, profile, &n_profile)) return 2;
        } else
            return usage_error("unknown flag '%s'", a);
    }
    o.profile_steps = ao.profile_steps = profile;
    o.n_profile_steps = ao.n_profile_steps = n_profile;
    if (!job_path && !ao.coordinator) ao.coordinator = getenv("HP_COORDINATOR");
    if (ao.coordinator && *ao.coordinator) {
        if (job_path) return usage_error("%s", "--standalone and --coordinator exclude each other");
        ao.rank = o.rank;
        ao.threads = o.threads;
        return run_agent(&ao, rank_given, token_file);
    }
    if (!job_path)
        return usage_error("%s", "--standalone JOB.pb or --coordinator HOST:PORT is required");

    hp_job *job = NULL;
    hp_err err = {0};
    if (hp_job_read_file(job_path, &job, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: %s\n", err.msg);
        return 1;
    }
    /* before any rank starts: a device this hp-worker cannot run (not built, or no such
     * device here) is one line, exit 1 */
    if (hp_backend_available(job->resources.device, &err) != HP_OK ||
        hp_job_check_trainable(job, &err) != HP_OK) {
        fprintf(stderr, "hp-worker: %s\n", err.msg);
        hp_job_free(job);
        return 1;
    }
    if (o.world == 0) o.world = job->resources.world_size; /* the job's mesh, unless told */
    if (o.world != job->resources.world_size && job->plan.n_mesh == 1) {
        job->plan.mesh[0].size = o.world; /* the same 1-D plan on --world ranks */
        job->resources.world_size = o.world;
    } else if (o.world != job->resources.world_size) { /* an N-D mesh is not resized */
        char mesh[160] = "";
        size_t len = 0;
        for (int d = 0; d < job->plan.n_mesh && len < sizeof mesh; d++)
            len += (size_t)snprintf(mesh + len, sizeof mesh - len, "%s%s=%d", d ? "," : "",
                                    job->plan.mesh[d].name, job->plan.mesh[d].size);
        char what[320];
        snprintf(what, sizeof what,
                 "--world %d: the job's mesh (%s) has %d ranks; make the job with another "
                 "--mesh (hpctl new)",
                 o.world, mesh, job->resources.world_size);
        hp_job_free(job);
        return usage_error("%s", what);
    }
    if (rank_given && o.world <= 1) {
        hp_job_free(job);
        return usage_error("%s", "--rank needs --world N > 1");
    }
    if ((tc.addr || tc.file || tc.bind) && !tc.tcp) {
        hp_job_free(job);
        return usage_error("%s",
                           "--comm-addr, --comm-file and --comm-bind need --comm-backend tcp");
    }
    if (tc.addr && tc.file) {
        hp_job_free(job);
        return usage_error("%s", "--comm-addr and --comm-file exclude each other");
    }
    if (o.world > 1 && rank_given && !o.comm_name && !tc.addr && !tc.file) {
        hp_job_free(job);
        return usage_error("%s", "--rank needs --comm NAME (the launcher sets both)");
    }
    if (o.world > 1 && !rank_given) {
        /* a plan that cannot compile is one line here, not one from each rank's setup */
        hp_compiled *compiled = NULL;
        hp_status cst = hp_compile(job, o.world, &compiled, &err);
        hp_compiled_free(compiled);
        if (cst != HP_OK) {
            fprintf(stderr, "hp-worker: %s\n", err.msg);
            hp_job_free(job);
            return hp_status_exit(cst);
        }
        hp_job_free(job);
        int threads = o.threads > 0 ? o.threads : hp_default_threads() / o.world;
        char world_s[16];
        snprintf(world_s, sizeof world_s, "%d", o.world);
        /* the ranks need the world on their command line when it came from the job */
        char **args = calloc((size_t)argc + 3, sizeof *args);
        if (!args) return 1;
        for (int i = 0; i < argc; i++) args[i] = argv[i];
        args[argc] = "--world", args[argc + 1] = world_s;
        int rc = launch(argc + 2, args, o.world, threads > 0 ? threads : 1);
        free(args);
        return rc;
    }
    hp_comm *tcp_comm = NULL;
    if (o.world > 1 && tc.tcp) {
        if (tcp_join(&tc, o.rank, o.world, o.comm_name, &tcp_comm, &err) != HP_OK) {
            fprintf(stderr, "hp-worker: rank %d: %s\n", o.rank, err.msg);
            hp_job_free(job);
            return hp_status_exit(err.status);
        }
        o.comm = tcp_comm;
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    hp_train_result res;
    hp_status st = hp_train(job, &o, &res, &err);
    hp_job_free(job);
    hp_comm_free(tcp_comm);
    if (st != HP_OK) {
        if (o.world > 1)
            fprintf(stderr, "hp-worker: rank %d: %s\n", o.rank, err.msg);
        else
            fprintf(stderr, "hp-worker: %s\n", err.msg);
        return hp_status_exit(st);
    }
    if (res.last_step >= res.first_step && o.rank == 0)
        printf("done: steps %lld..%lld, loss %.4f -> %.4f\n", (long long)res.first_step,
               (long long)res.last_step, res.first_loss, res.last_loss);
    return res.interrupted ? 130 : 0;
}
