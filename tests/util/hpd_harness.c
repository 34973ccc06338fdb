/* tests/util/hpd_harness.c — see hpd_harness.h. */
#include "tests/util/hpd_harness.h"
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

void hp_th_hpd_start(hp_th_hpd *h, const char *state_dir, const char *log_path,
                     const char *const *extra) {
    const char *b = getenv("HP_BINARY_DIR");
    char hpd[512];
    snprintf(hpd, sizeof hpd, "%s/daemon/hpd", b && *b ? b : HP_BINARY_DIR);
    const char *argv[48];
    int n = 0;
    argv[n++] = hpd;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--worker-listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--state-dir";
    argv[n++] = state_dir;
    for (int i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    h->pid = fork();
    cr_assert(h->pid >= 0);
    if (h->pid == 0) {
        dup2(fds[1], 1);
        if (log_path) {
            int e = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (e >= 0) dup2(e, 2);
        }
        close(fds[0]);
        close(fds[1]);
        execv(hpd, (char **)argv);
        _exit(127);
    }
    close(fds[1]);
    char buf[4096];
    size_t got = 0;
    h->grpc[0] = h->http[0] = h->workers[0] = 0;
    time_t t0 = time(NULL);
    while (!h->grpc[0] && time(NULL) - t0 < 90 && got < sizeof buf - 1) {
        struct pollfd pf = {fds[0], POLLIN, 0};
        if (poll(&pf, 1, 500) <= 0) continue;
        ssize_t k = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        buf[got] = 0;
        char *l = strstr(buf, "hpd listening");
        if (!l || !strchr(l, '\n')) continue;
        char *g = strstr(l, "grpc="), *w = strstr(l, "http="), *ws = strstr(l, "workers=");
        if (w) sscanf(w, "http=%63s", h->http);
        if (ws) sscanf(ws, "workers=%63s", h->workers);
        if (g) sscanf(g, "grpc=%63s", h->grpc);
    }
    close(fds[0]); /* later lines: hpd ignores SIGPIPE */
    if (!h->grpc[0]) {
        char *log = log_path ? hp_th_slurp(log_path) : strdup("(stderr inherited)");
        hp_th_hpd_stop(h);
        cr_assert_fail("hpd did not print its listening line; stdout: %.*s; stderr: %s", (int)got,
                       buf, log);
    }
}

int hp_th_hpd_stop(hp_th_hpd *h) {
    if (h->pid <= 0) return -2;
    kill(h->pid, SIGTERM);
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 300 && (w = waitpid(h->pid, &st, WNOHANG)) == 0; i++) usleep(100000);
    int code;
    if (w == 0) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, &st, 0);
        code = -1;
    } else {
        code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    h->pid = -1;
    return code;
}
