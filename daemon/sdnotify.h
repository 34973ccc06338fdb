/* daemon/sdnotify.h — the systemd notification protocol (sd_notify(3)) without libsystemd:
 * one datagram per message to $NOTIFY_SOCKET (a path, or '@' for the abstract namespace).
 * hpd sends READY=1 once it listens, WATCHDOG=1 from a loop timer at half of $WATCHDOG_USEC,
 * STOPPING=1 when it starts shutting down. Without $NOTIFY_SOCKET every call is a no-op.
 *
 * Socket activation (sd_listen_fds(3) semantics): when $LISTEN_PID is this process, the
 * $LISTEN_FDS sockets from fd 3 on are hpd's, named by $LISTEN_FDNAMES (':'-separated, from the
 * socket unit's FileDescriptorName=). hpd takes "workers" (the worker protocol) and "http";
 * unnamed ones ("unknown", or no names) go to them in that order. The gRPC service binds its
 * own port (gRPC's C core cannot adopt a listening socket).
 */
#ifndef HP_DAEMON_SDNOTIFY_H
#define HP_DAEMON_SDNOTIFY_H

#include <stddef.h>
#include <stdint.h>

/* Reads and unsets NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID, and LISTEN_PID/LISTEN_FDS/
 * LISTEN_FDNAMES (marking those fds close-on-exec): the workers hpd starts must not speak for
 * it or inherit its sockets. Call once, first thing in main, before any thread starts. */
void hpd_sd_init(void);
/* Sends msg ("READY=1\nSTATUS=..."); 0 on success or when not under systemd, -errno else.
 * Never blocks (MSG_DONTWAIT). */
int hpd_sd_notify(const char *msg);
/* The watchdog interval systemd asked for, in microseconds (0: none). */
uint64_t hpd_sd_watchdog_usec(void);

/* The passed socket for `name` ("workers", "http"), which the caller now owns: the one of that
 * name, else the next unnamed one; -1 when systemd passed none. -2 with why filled in when the
 * fd found is not a listening stream socket. */
int hpd_sd_listen_take(const char *name, char *why, size_t why_len);
/* How many passed sockets nobody took (hpd logs them: a unit naming a socket hpd has no use
 * for); their names into names (", "-separated). */
int hpd_sd_listen_unused(char *names, size_t len);

#endif
