/* daemon/sdnotify.h — the systemd notification protocol (sd_notify(3)) without libsystemd:
 * one datagram per message to $NOTIFY_SOCKET (a path, or '@' for the abstract namespace).
 * hpd sends READY=1 once it listens, WATCHDOG=1 from a loop timer at half of $WATCHDOG_USEC,
 * STOPPING=1 when it starts shutting down. Without $NOTIFY_SOCKET every call is a no-op.
 */
#ifndef HP_DAEMON_SDNOTIFY_H
#define HP_DAEMON_SDNOTIFY_H

#include <stdint.h>

/* Reads and unsets NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID (the workers hpd starts must not
 * speak for it). Call once, first thing in main, before any thread starts. */
void hpd_sd_init(void);
/* Sends msg ("READY=1\nSTATUS=..."); 0 on success or when not under systemd, -errno else.
 * Never blocks (MSG_DONTWAIT). */
int hpd_sd_notify(const char *msg);
/* The watchdog interval systemd asked for, in microseconds (0: none). */
uint64_t hpd_sd_watchdog_usec(void);

#endif
