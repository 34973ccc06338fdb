/* daemon/pbcheck.h — a pre-scan of protobuf wire bytes against a message descriptor, run before
 * protobuf-c allocates anything: it bounds what decoding would allocate and checks every
 * `string` field for NUL bytes and UTF-8, which the decoded char * can no longer show (an id
 * "j-1\0junk" decodes as "j-1"). Any thread; allocates nothing.
 */
#ifndef HP_DAEMON_PBCHECK_H
#define HP_DAEMON_PBCHECK_H

#include "hp/base.h"

#include <protobuf-c/protobuf-c.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hpd_pb_limits {
    size_t max_alloc;   /* bytes decoding may allocate (estimated from the wire, an upper bound) */
    int max_depth;      /* nested messages */
    bool check_strings; /* refuse NUL bytes and invalid UTF-8 in `string` fields */
} hpd_pb_limits;

/* HP_OK: decoding data as desc stays within lim (*est, may be NULL: the estimate). HP_LIMIT:
 * the estimate passes max_alloc or the depth max_depth (the message names the limit);
 * HP_INVALID: a string field holds a NUL byte or invalid UTF-8 (the message names the field
 * path, e.g. "job.name"); HP_PARSE: not wire format. */
hp_status hp__pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                       const hpd_pb_limits *lim, size_t *est, hp_err *err);

/* Copies s into dst (size n, NUL-terminated) with each byte of an invalid UTF-8 sequence
 * replaced by '?'. Returns true when something was replaced. */
bool hp__utf8_sanitize(char *dst, size_t n, const char *s);

/* Writes s as a double-quoted, escaped string (\" \\ \n \r \t, \xHH for other control bytes
 * and for bytes >= 0x80) into dst (size n), at most max_in bytes of s then "..."; for echoing
 * what a peer sent into errors and logs. Returns dst. */
char *hp__pb_quote(char *dst, size_t n, const char *s, size_t max_in);

#endif
