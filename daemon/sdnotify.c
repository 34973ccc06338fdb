/* daemon/sdnotify.c — see sdnotify.h. */
#include "daemon/sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char g_sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
static uint64_t g_wd_usec;

#define LISTEN_MAX 16
static struct {
    int fd;
    char name[64]; /* "" : unnamed */
    bool taken;
} g_listen[LISTEN_MAX];
static int g_n_listen;

/* sd_listen_fds(3): the fds are ours only when LISTEN_PID is our pid. */
static void listen_init(void) {
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    const char *names = getenv("LISTEN_FDNAMES");
    if (pid && fds && atol(pid) == (long)getpid()) {
        char *end;
        long n = strtol(fds, &end, 10);
        if (*fds && !*end && n > 0) {
            if (n > LISTEN_MAX) n = LISTEN_MAX; /* more than hpd can use: leave them */
            const char *p = names ? names : "";
            for (int i = 0; i < n; i++) {
                int fd = 3 + i;
                fcntl(fd, F_SETFD, FD_CLOEXEC);
                g_listen[i].fd = fd;
                size_t len = strcspn(p, ":");
                if (len < sizeof g_listen[i].name && !(len == 7 && !strncmp(p, "unknown", 7))) {
                    memcpy(g_listen[i].name, p, len);
                    g_listen[i].name[len] = 0;
                }
                p += len + (p[len] == ':');
            }
            g_n_listen = (int)n;
        }
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
}

int hpd_sd_listen_take(const char *name, char *why, size_t why_len) {
    int k = -1;
    for (int i = 0; i < g_n_listen && k < 0; i++)
        if (!g_listen[i].taken && !strcmp(g_listen[i].name, name)) k = i;
    for (int i = 0; i < g_n_listen && k < 0; i++)
        if (!g_listen[i].taken && !g_listen[i].name[0]) k = i;
    if (k < 0) return -1;
    g_listen[k].taken = true;
    int fd = g_listen[k].fd, type = 0, acc = 0;
    socklen_t l1 = sizeof type, l2 = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l1) != 0 || type != SOCK_STREAM ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l2) != 0 || !acc) {
        snprintf(why, why_len,
                 "socket activation: fd %d ('%s', for %s) is not a listening stream socket "
                 "(ListenStream= in the socket unit)",
                 fd, g_listen[k].name[0] ? g_listen[k].name : "unnamed", name);
        return -2;
    }
    return fd;
}

int hpd_sd_listen_unused(char *names, size_t len) {
    int n = 0;
    size_t used = 0;
    if (len) names[0] = 0;
    for (int i = 0; i < g_n_listen; i++) {
        if (g_listen[i].taken) continue;
        n++;
        int w = snprintf(names + used, len - used, "%s%s", used ? ", " : "",
                         g_listen[i].name[0] ? g_listen[i].name : "unnamed");
        if (w > 0 && (size_t)w < len - used) used += (size_t)w;
    }
    return n;
}

void hpd_sd_init(void) {
    const char *s = getenv("NOTIFY_SOCKET");
    if (s && (s[0] == '/' || s[0] == '@') && strlen(s) < sizeof g_sock)
        snprintf(g_sock, sizeof g_sock, "%s", s);
    const char *w = getenv("WATCHDOG_USEC"), *wp = getenv("WATCHDOG_PID");
    if (w && (!wp || atol(wp) == (long)getpid())) {
        char *end;
        unsigned long long v = strtoull(w, &end, 10);
        if (!*end && v > 0) g_wd_usec = v;
    }
    listen_init();
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

uint64_t hpd_sd_watchdog_usec(void) {
    return g_sock[0] ? g_wd_usec : 0;
}

int hpd_sd_notify(const char *msg) {
    if (!g_sock[0]) return 0;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(g_sock);
    memcpy(a.sun_path, g_sock, n);
    if (a.sun_path[0] == '@') a.sun_path[0] = 0; /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    ssize_t k =
        sendto(fd, msg, strlen(msg), MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&a, len);
    int e = errno;
    close(fd);
    return k < 0 ? -e : 0;
}
