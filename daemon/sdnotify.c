/* daemon/sdnotify.c — see sdnotify.h. */
#include "daemon/sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char g_sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
static uint64_t g_wd_usec;

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
