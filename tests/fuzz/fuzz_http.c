/* tests/fuzz/fuzz_http.c — a libFuzzer target for hpd's HTTP request handling: request paths
 * and query strings, through the real server (daemon/http.c on libmicrohttpd, its URI
 * callback, unescaping, argument checks, routing, the JSON API and /metrics) of a real hpd
 * (hpd_new on a temp state dir, no loop needed: the HTTP threads read the published snapshot).
 *
 * Each input is a request target: bytes outside the printable ASCII range and spaces are
 * percent-encoded so that the request line stays one well-formed line, then it is sent as
 * `GET TARGET HTTP/1.1` over 127.0.0.1. Properties: no crash, no sanitizer report, and an
 * answer within 20 s whose status is one hpd documents (200 400 401 404 405 414 431 503); a
 * held connection (≈ 500 query arguments did that, for 30 s) or a 500 aborts.
 *
 * Built with -DHP_FUZZ=ON (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/http/.
 */
#include "daemon/core.h"
#include "daemon/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define fail(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "fuzz_http: " __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)

static int g_port;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static char dir[] = "/tmp/hp-fuzz-http-XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp: %m");
    hpd_config cfg = {.state_dir = dir, .slots = 1};
    hpd *d = NULL;
    hp_err err = {0};
    if (hpd_new(uv_default_loop(), &cfg, &d, &err) != HP_OK) fail("hpd_new: %s", err.msg);
    hpd_http_config hc = {.addr = "127.0.0.1:0", .retention_s = 600};
    char bound[80];
    if (hpd_http_start(d, &hc, bound, sizeof bound, &err) != HP_OK)
        fail("hpd_http_start: %s", err.msg);
    const char *colon = strrchr(bound, ':');
    g_port = colon ? atoi(colon + 1) : 0;
    if (g_port <= 0) fail("bound address '%s'", bound);
    return 0; /* d lives as long as the process */
}

static const unsigned k_ok[] = {200, 400, 401, 404, 405, 414, 431, 503};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char hex[] = "0123456789ABCDEF";
    size_t cap = 64 + size * 3;
    char *req = malloc(cap);
    if (!req) return 0;
    size_t n = (size_t)snprintf(req, cap, "GET ");
    for (size_t i = 0; i < size; i++) {
        uint8_t b = data[i];
        if (b <= 0x20 || b >= 0x7f) {
            req[n++] = '%';
            req[n++] = hex[b >> 4];
            req[n++] = hex[b & 15];
        } else {
            req[n++] = (char)b;
        }
    }
    if (size == 0) req[n++] = '/';
    n += (size_t)snprintf(req + n, cap - n, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket: %m");
    /* 20 s: a hang, not a loaded machine (5 s fired for a fuzzer at nice 19 beside a CI run) */
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* libFuzzer's timer signal interrupts these calls (a socket with a timeout is never
     * restarted, SA_RESTART or not): EINTR is retried, never taken for a refusal or a hang. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno != EINTR) fail("connect: %m");
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int rc, soerr = 0;
        socklen_t len = sizeof soerr;
        while ((rc = poll(&pf, 1, 20000)) < 0 && errno == EINTR) continue;
        if (rc <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr)
            fail("connect: %s", soerr ? strerror(soerr) : "no connection within 20 s");
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the server may answer (414) and close before reading it all */
        off += (size_t)w;
    }
    char head[64];
    size_t got = 0;
    while (got < sizeof head - 1) {
        ssize_t r = recv(fd, head + got, sizeof head - 1 - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("no answer within 20 s to a %zu-byte target: %.200s", size, req + 4);
        if (r == 0) break;
        got += (size_t)r;
    }
    head[got] = 0;
    unsigned status = 0;
    if (sscanf(head, "HTTP/1.%*d %u", &status) != 1)
        fail("closed without a status line (%zu bytes: '%.60s') for: %.200s", got, head, req + 4);
    bool ok = false;
    for (size_t i = 0; i < sizeof k_ok / sizeof *k_ok; i++) ok |= status == k_ok[i];
    if (!ok) fail("status %u for: %.300s", status, req + 4);
    /* drain the body so that the server's send completes before the close */
    char sink[4096];
    while (recv(fd, sink, sizeof sink, 0) > 0) {
    }
    close(fd);
    free(req);
    return 0;
}
