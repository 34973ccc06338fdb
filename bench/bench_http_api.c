/* bench/bench_http_api.c — latency of hpd's HTTP JSON API under load (issue 6's target: p99
 * under 10 ms with 100 jobs and 20 pollers).
 *
 * Starts a real hpd on 127.0.0.1 (temp state dir, --slots 2), submits --jobs small debugmodel
 * jobs (1 rank, --steps steps, metrics every step) with the real hpctl, so that while we
 * measure some run, most wait in the queue and the first ones have finished with metrics
 * history. Then --pollers threads, each with its own keep-alive HTTP/1.1 connection, poll in a
 * closed loop for --seconds what a dashboard polls: the job list (all jobs), one job's detail,
 * one job's metrics (the whole history), and /metrics, in turn. Every request's latency is
 * recorded; p50/p99/max per endpoint and overall are printed.
 *
 * Peers, measured in the same run with the same pollers:
 *   - hpd's /healthz: the floor (HTTP parsing, the server's threads, this client);
 *   - Prometheus (Debian's prometheus, when installed), scraping this hpd, answering
 *     /api/v1/query?query=hp_job_step — an HTTP JSON API over the same jobs' series.
 *
 * Two rounds: pollers paced at --interval-ms (default 100 ms: 20 pollers offer 200 req/s, a
 * dashboard polls every 2 s), where the target applies; then a closed loop (no pause), which
 * shows the saturation throughput and the queueing it causes on this machine's cores.
 *
 * usage: bench_http_api [--jobs N] [--pollers P] [--seconds S] [--interval-ms MS] [--steps K]
 *                       [--build DIR]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_port;      /* hpd's HTTP port */
static int g_prom_port; /* Prometheus' (0: none) */
static int g_jobs = 100, g_pollers = 20, g_steps = 20;
static double g_seconds = 5;
static double g_interval = 0.1; /* seconds between a poller's requests (0: closed loop) */
static atomic_int g_stop;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- a minimal keep-alive HTTP/1.1 client -------------------------------------------------- */
typedef struct conn {
    int fd, port;
    char *buf;
    size_t cap;
} conn;

static int conn_open(conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

/* GET path; returns the status (0 on a transport error) and the body length in *blen. */
static int http_get(conn *c, const char *path, size_t *blen) {
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->fd < 0 && conn_open(c) != 0) return 0;
        char req[1024];
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
        if (send(c->fd, req, (size_t)n, MSG_NOSIGNAL) != n) goto reconnect;
        size_t got = 0;
        long clen = -1;
        size_t hdr_end = 0;
        for (;;) {
            if (got + 65536 > c->cap) {
                c->cap = c->cap ? c->cap * 2 : 1 << 20;
                c->buf = realloc(c->buf, c->cap);
            }
            ssize_t k = recv(c->fd, c->buf + got, c->cap - got - 1, 0);
            if (k <= 0) goto reconnect;
            got += (size_t)k;
            c->buf[got] = 0;
            if (!hdr_end) {
                char *e = strstr(c->buf, "\r\n\r\n");
                if (!e) continue;
                hdr_end = (size_t)(e - c->buf) + 4;
                char *cl = strcasestr(c->buf, "\r\nContent-Length:");
                char *te = strcasestr(c->buf, "\r\nTransfer-Encoding: chunked");
                if (cl && cl < e)
                    clen = strtol(cl + 17, NULL, 10);
                else if (!te || te > e)
                    return 0; /* neither: not a keep-alive answer we can frame */
            }
            if (clen >= 0 && got >= hdr_end + (size_t)clen) break;
            /* chunked (Go's net/http for larger bodies): ends with the zero-length chunk */
            if (clen < 0 && got >= hdr_end + 5 && !memcmp(c->buf + got - 5, "0\r\n\r\n", 5)) {
                clen = (long)(got - hdr_end);
                break;
            }
        }
        *blen = (size_t)clen;
        return atoi(c->buf + 9);
    reconnect:
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
    }
    return 0;
}

/* ---- pollers ----------------------------------------------------------------------------------
 */
enum { EP_LIST, EP_JOB, EP_METRICS, EP_PROM, EP_HEALTH, EP_PEER, EP_N };
static const char *ep_name[EP_N] = {
    "GET /api/v1/jobs?limit=1000",   "GET /api/v1/jobs/{id}",
    "GET /api/v1/jobs/{id}/metrics", "GET /metrics",
    "GET /healthz (floor)",          "Prometheus /api/v1/query (peer)"};

typedef struct lat {
    double *v;
    size_t n, cap;
} lat;

static void lat_add(lat *l, double x) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = x;
}

typedef struct poller {
    pthread_t t;
    int id, mode; /* mode 0: hpd's API mix, 1: /healthz, 2: the Prometheus peer */
    lat l[EP_N];
    long errors;
} poller;

static void *poll_main(void *arg) {
    poller *p = arg;
    conn c = {.fd = -1, .port = p->mode == 2 ? g_prom_port : g_port};
    unsigned seed = (unsigned)p->id * 2654435761u;
    /* Paced pollers start spread over one interval and keep an absolute schedule. */
    double next = now_s() + g_interval * (double)p->id / (double)g_pollers;
    for (long i = p->id; !atomic_load(&g_stop); i++) {
        if (g_interval > 0) {
            double wait = next - now_s();
            if (wait > 0) usleep((useconds_t)(wait * 1e6));
            next += g_interval;
        }
        char path[256];
        int ep;
        if (p->mode == 1) {
            ep = EP_HEALTH;
            snprintf(path, sizeof path, "/healthz");
        } else if (p->mode == 2) {
            ep = EP_PEER;
            snprintf(path, sizeof path, "/api/v1/query?query=hp_job_step");
        } else {
            ep = (int)(i % 4);
            int job = 1 + (int)(rand_r(&seed) % (unsigned)g_jobs);
            if (ep == EP_LIST)
                snprintf(path, sizeof path, "/api/v1/jobs?limit=1000");
            else if (ep == EP_JOB)
                snprintf(path, sizeof path, "/api/v1/jobs/j-%06d", job);
            else if (ep == EP_METRICS)
                snprintf(path, sizeof path, "/api/v1/jobs/j-%06d/metrics?since=0", job);
            else
                snprintf(path, sizeof path, "/metrics");
        }
        size_t blen = 0;
        double t0 = now_s();
        int st = http_get(&c, path, &blen);
        double dt = now_s() - t0;
        if (st != 200) {
            p->errors++;
            if (st == 0) usleep(1000);
            continue;
        }
        lat_add(&p->l[ep], dt);
    }
    if (c.fd >= 0) close(c.fd);
    free(c.buf);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const lat *l, double q) {
    if (!l->n) return 0;
    size_t i = (size_t)(q * (double)(l->n - 1) + 0.5);
    return l->v[i];
}

/* Runs n pollers in mode for g_seconds; merges their latencies into out[EP_N]. */
static long run_pollers(int n, int mode, lat out[EP_N], double *elapsed) {
    poller *ps = calloc((size_t)n, sizeof *ps);
    atomic_store(&g_stop, 0);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        ps[i].id = i;
        ps[i].mode = mode;
        pthread_create(&ps[i].t, NULL, poll_main, &ps[i]);
    }
    usleep((useconds_t)(g_seconds * 1e6));
    atomic_store(&g_stop, 1);
    long errors = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(ps[i].t, NULL);
        errors += ps[i].errors;
        for (int e = 0; e < EP_N; e++) {
            for (size_t k = 0; k < ps[i].l[e].n; k++) lat_add(&out[e], ps[i].l[e].v[k]);
            free(ps[i].l[e].v);
        }
    }
    *elapsed = now_s() - t0;
    free(ps);
    for (int e = 0; e < EP_N; e++) qsort(out[e].v, out[e].n, sizeof(double), cmp_d);
    return errors;
}

static void report(const char *name, const lat *l, double secs) {
    if (!l->n) return;
    printf("  %-36s n=%-7zu %7.0f req/s  p50 %7.3f ms  p99 %7.3f ms  max %7.2f ms\n", name, l->n,
           (double)l->n / secs, pct(l, 0.5) * 1e3, pct(l, 0.99) * 1e3, l->v[l->n - 1] * 1e3);
}

/* ---- set-up -----------------------------------------------------------------------------------
 */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        close(fd);
        return 0;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

int main(int argc, char **argv) {
    char build[512] = "";
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_http_api: %s needs a value\n", argv[i]);
            return 2;
        } else if (!strcmp(argv[i], "--jobs"))
            g_jobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pollers"))
            g_pollers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds"))
            g_seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--interval-ms"))
            g_interval = atof(argv[++i]) / 1e3;
        else if (!strcmp(argv[i], "--steps"))
            g_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--build"))
            snprintf(build, sizeof build, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: bench_http_api [--jobs N] [--pollers P] [--seconds S] "
                            "[--interval-ms MS] [--steps K] [--build DIR]\n");
            return 2;
        }
    }
    if (g_jobs < 1 || g_pollers < 1 || !(g_seconds > 0) || g_steps < 1 || !(g_interval >= 0))
        return 2;
    if (!build[0]) { /* this binary is BUILD/bench/bench_http_api */
        char self[512];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k <= 0) return 1;
        self[k] = 0;
        *strrchr(self, '/') = 0;
        *strrchr(self, '/') = 0;
        snprintf(build, sizeof build, "%s", self);
    }
    signal(SIGPIPE, SIG_IGN);
    char tmp[] = "/tmp/hp-bench-http-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    char cmd[4096], state[600];
    snprintf(state, sizeof state, "%s/state", tmp);
    snprintf(cmd, sizeof cmd,
             "%s/client/hpctl new --model llama3:debugmodel --dim 64 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn-hidden 96 --vocab 256 --batch 2 --seq 32 --steps %d "
             "--log-interval 1 -o %s/job.pb >/dev/null",
             build, g_steps, tmp);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_http_api: %s failed\n", cmd);
        return 1;
    }
    int pfd[2];
    if (pipe(pfd) != 0) return 1;
    char hpd_path[700], logp[700];
    snprintf(hpd_path, sizeof hpd_path, "%s/daemon/hpd", build);
    snprintf(logp, sizeof logp, "%s/hpd.log", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        FILE *lf = fopen(logp, "w");
        if (lf) dup2(fileno(lf), 2);
        execl(hpd_path, hpd_path, "--listen", "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
              "--http", "127.0.0.1:0", "--state-dir", state, "--slots", "2", "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    FILE *hp = fdopen(pfd[0], "r");
    char line[1024], grpc[128] = "", http[128] = "";
    if (!fgets(line, sizeof line, hp)) {
        fprintf(stderr, "bench_http_api: hpd did not start (log %s)\n", logp);
        return 1;
    }
    char *g = strstr(line, "grpc="), *h = strstr(line, "http=");
    if (!g || !h || sscanf(g, "grpc=%127s", grpc) != 1 || sscanf(h, "http=%127s", http) != 1) {
        fprintf(stderr, "bench_http_api: unexpected first line: %s", line);
        return 1;
    }
    g_port = atoi(strrchr(http, ':') + 1);
    setenv("HP_STATE_DIR", state, 1);
    double t0 = now_s();
    for (int i = 0; i < g_jobs; i++) {
        snprintf(cmd, sizeof cmd, "%s/client/hpctl submit %s/job.pb --server %s >/dev/null", build,
                 tmp, grpc);
        if (system(cmd) != 0) {
            fprintf(stderr, "bench_http_api: submit %d failed\n", i + 1);
            kill(pid, SIGKILL);
            return 1;
        }
    }
    printf("bench_http_api: %d jobs submitted in %.1f s (1 rank, %d steps each, --slots 2); "
           "%d pollers, %.0f s per phase\n",
           g_jobs, now_s() - t0, g_steps, g_pollers, g_seconds);
    sleep(2); /* some jobs finish: metrics history to serve */

    /* Prometheus, scraping this hpd every second, as the peer. */
    pid_t prom = -1;
    if (system("command -v prometheus >/dev/null 2>&1") == 0) {
        g_prom_port = free_port();
        char conf[700];
        snprintf(conf, sizeof conf, "%s/prometheus.yml", tmp);
        FILE *f = fopen(conf, "w");
        fprintf(f,
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hpd\n"
                "    static_configs:\n      - targets: ['%s']\n",
                http);
        fclose(f);
        prom = fork();
        if (prom == 0) {
            char a1[800], a2[800], a3[100];
            snprintf(a1, sizeof a1, "--config.file=%s", conf);
            snprintf(a2, sizeof a2, "--storage.tsdb.path=%s/prom", tmp);
            snprintf(a3, sizeof a3, "--web.listen-address=127.0.0.1:%d", g_prom_port);
            int dn = open("/dev/null", 1);
            dup2(dn, 1);
            dup2(dn, 2);
            execlp("prometheus", "prometheus", a1, a2, a3, (char *)NULL);
            _exit(127);
        }
        conn c = {.fd = -1, .port = g_prom_port};
        size_t bl;
        int ready = 0;
        for (int i = 0; i < 300 && !ready; i++) {
            ready = http_get(&c, "/-/ready", &bl) == 200;
            if (!ready) usleep(100000);
        }
        if (c.fd >= 0) close(c.fd);
        free(c.buf);
        if (!ready) {
            fprintf(stderr, "bench_http_api: prometheus did not become ready; no peer\n");
            g_prom_port = 0;
        } else {
            sleep(3); /* a few scrapes */
        }
    }

    double intervals[2] = {g_interval, 0};
    for (int m = 0; m < (g_interval > 0 ? 2 : 1); m++) {
        g_interval = intervals[m];
        lat api[EP_N] = {0}, floor_[EP_N] = {0}, peer[EP_N] = {0};
        double el;
        if (g_interval > 0)
            printf("\n== %d pollers, each one request every %.0f ms (%.0f req/s offered)\n",
                   g_pollers, g_interval * 1e3, g_pollers / g_interval);
        else
            printf("\n== %d pollers in a closed loop (saturation: latency includes queueing on "
                   "this machine's cores)\n",
                   g_pollers);
        long err = run_pollers(g_pollers, 0, api, &el);
        lat all = {0};
        for (int e = 0; e <= EP_PROM; e++)
            for (size_t k = 0; k < api[e].n; k++) lat_add(&all, api[e].v[k]);
        qsort(all.v, all.n, sizeof(double), cmp_d);
        printf("hpd JSON API + /metrics:\n");
        for (int e = 0; e <= EP_PROM; e++) report(ep_name[e], &api[e], el);
        report("all of the above", &all, el);
        if (err) printf("  (%ld non-200 answers or transport errors)\n", err);
        (void)run_pollers(g_pollers, 1, floor_, &el);
        printf("peers, same pollers:\n");
        report(ep_name[EP_HEALTH], &floor_[EP_HEALTH], el);
        if (g_prom_port) {
            long err3 = run_pollers(g_pollers, 2, peer, &el);
            report(ep_name[EP_PEER], &peer[EP_PEER], el);
            if (err3) printf("  (%ld errors from Prometheus)\n", err3);
        }
        double p99 = pct(&all, 0.99);
        printf("result: API p50 %.3f ms, p99 %.3f ms", pct(&all, 0.5) * 1e3, p99 * 1e3);
        if (g_interval > 0)
            printf(" (target p99 < 10 ms: %s, %.2f of the target)", p99 < 0.010 ? "met" : "MISSED",
                   p99 / 0.010);
        printf("\n        p99 / the /healthz floor's p99: %.2f\n",
               p99 / pct(&floor_[EP_HEALTH], 0.99));
        if (g_prom_port && peer[EP_PEER].n)
            printf("        p99 / Prometheus query API's p99: %.2f (%.3f ms)\n",
                   p99 / pct(&peer[EP_PEER], 0.99), pct(&peer[EP_PEER], 0.99) * 1e3);
        for (int e = 0; e < EP_N; e++) {
            free(api[e].v);
            free(floor_[e].v);
            free(peer[e].v);
        }
        free(all.v);
    }

    if (prom > 0) {
        kill(prom, SIGTERM);
        waitpid(prom, NULL, 0);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) return 1;
    return 0;
}
