/* bench/bench_fake_worker.c — a synthetic rank for bench_hpd_ingest: speaks the real worker
 * protocol (hp/frame.h) but trains nothing. Started by hpd in place of hp-worker (hpd --worker)
 * with hp-worker's flags (--coordinator HOST:PORT --job ID --rank R --token T): says Hello,
 * reads the Welcome, waits until the file $HP_BENCH_GATE exists (heartbeating meanwhile, so the
 * watchers can attach first), then sends $HP_BENCH_RECORDS StepMetrics frames (steps 1..N) as
 * fast as it can, several frames to a write, then Done(ok) and exits once the coordinator has
 * closed the connection (or after 60 s). Prints its send rate on stdout (the rank's log).
 */
#include "hp/frame.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_frame(int fd, Hp__V1__Frame *f, uint64_t *seq) {
    f->seq = ++*seq;
    uint8_t *buf = NULL;
    size_t len = 0;
    hp_err err = {0};
    if (hp_frame_encode(f, &buf, &len, &err) != HP_OK) {
        fprintf(stderr, "fake worker: encode: %s\n", err.msg);
        return -1;
    }
    int rc = write_all(fd, buf, len);
    hp_free(buf);
    return rc;
}

int main(int argc, char **argv) {
    const char *coord = NULL, *job = NULL, *token = "";
    int rank = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--coordinator")) coord = argv[i + 1];
        if (!strcmp(argv[i], "--job")) job = argv[i + 1];
        if (!strcmp(argv[i], "--rank")) rank = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--token")) token = argv[i + 1];
    }
    const char *env = getenv("HP_BENCH_RECORDS"), *gate = getenv("HP_BENCH_GATE");
    long n = env ? atol(env) : 100000;
    if (!coord || !job) {
        fprintf(stderr, "fake worker: need --coordinator and --job\n");
        return 2;
    }
    char host[64];
    const char *colon = strrchr(coord, ':');
    if (!colon || (size_t)(colon - coord) >= sizeof host) return 2;
    memcpy(host, coord, (size_t)(colon - coord));
    host[colon - coord] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return 2;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("fake worker: connect");
        return 1;
    }
    uint64_t seq = 0;
    Hp__V1__Hello hello;
    hp__v1__hello__init(&hello);
    hello.protocol_version = HP_PROTOCOL_VERSION;
    hello.job_id = (char *)job;
    hello.rank = rank;
    hello.token = (char *)token;
    hello.pid = (int)getpid();
    hello.hostname = "bench";
    hello.device = "cpu";
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_HELLO;
    f.hello = &hello;
    if (send_frame(fd, &f, &seq) != 0) return 1;
    /* The Welcome: read whole frames until it arrives. */
    hp_frame_reader rd;
    hp_frame_reader_init(&rd, HP_FRAME_MAX);
    bool welcomed = false;
    static uint8_t rbuf[1 << 16];
    while (!welcomed) {
        ssize_t r = read(fd, rbuf, sizeof rbuf);
        hp_err err = {0};
        if (r <= 0 || hp_frame_reader_feed(&rd, rbuf, (size_t)r, &err) != HP_OK) {
            fprintf(stderr, "fake worker: no welcome\n");
            return 1;
        }
        for (;;) {
            Hp__V1__Frame *in = NULL;
            if (hp_frame_reader_next(&rd, &in, &err) != HP_OK) return 1;
            if (!in) break;
            welcomed |= in->body_case == HP__V1__FRAME__BODY_WELCOME;
            hp_frame_free(in);
        }
    }
    hp_frame_reader_fini(&rd);
    /* Wait for the gate, heartbeating. */
    Hp__V1__Heartbeat hb;
    hp__v1__heartbeat__init(&hb);
    while (gate && access(gate, F_OK) != 0) {
        hp__v1__frame__init(&f);
        f.body_case = HP__V1__FRAME__BODY_HEARTBEAT;
        f.heartbeat = &hb;
        if (send_frame(fd, &f, &seq) != 0) return 1;
        usleep(20000);
    }
    /* N metrics frames, encoded into a 256 KiB buffer that is written when full. */
    size_t cap = 256 << 10, used = 0;
    uint8_t *out = malloc(cap);
    if (!out) return 1;
    double t0 = now_s();
    Hp__V1__StepMetrics m;
    hp__v1__step_metrics__init(&m);
    for (long i = 1; i <= n; i++) {
        m.step = i;
        m.rank = rank;
        m.loss = 10.0 / (double)i;
        m.loss_max = m.loss;
        m.grad_norm = 1.5;
        m.lr = 8e-4;
        m.tokens_per_s = 12345.0;
        m.tflops = 0.5;
        m.mfu_pct = 1.25;
        m.peak_memory_bytes = 123456789;
        m.step_time_s = 0.01;
        m.tokens = 256;
        m.time_unix_s = 1.7e9 + (double)i;
        hp__v1__frame__init(&f);
        f.seq = ++seq;
        f.body_case = HP__V1__FRAME__BODY_METRICS;
        f.metrics = &m;
        size_t len = hp__v1__frame__get_packed_size(&f);
        if (used + len + 4 > cap) {
            if (write_all(fd, out, used) != 0) return 1;
            used = 0;
        }
        out[used] = (uint8_t)len;
        out[used + 1] = (uint8_t)(len >> 8);
        out[used + 2] = (uint8_t)(len >> 16);
        out[used + 3] = (uint8_t)(len >> 24);
        hp__v1__frame__pack(&f, out + used + 4);
        used += len + 4;
    }
    if (used && write_all(fd, out, used) != 0) return 1;
    double t1 = now_s();
    free(out);
    Hp__V1__Done done;
    hp__v1__done__init(&done);
    done.ok = true;
    done.final_step = n;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_DONE;
    f.done = &done;
    if (send_frame(fd, &f, &seq) != 0) return 1;
    printf("fake worker rank %d: sent %ld metrics frames in %.3f s (%.0f/s)\n", rank, n, t1 - t0,
           (double)n / (t1 - t0));
    fflush(stdout);
    /* Linger until the coordinator closes (it then knows we are done) or 60 s. */
    shutdown(fd, SHUT_WR);
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (read(fd, rbuf, sizeof rbuf) > 0) {
    }
    close(fd);
    return 0;
}
