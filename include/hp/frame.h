/* hp/frame.h — the worker protocol's framing: each message is a 4-byte little-endian length
 * followed by a packed hp.v1.Frame (proto/hp/v1/worker.proto). Shared by the coordinator and
 * the worker. The reader is incremental (feed it whatever a socket returned) and bounded: a
 * length over the reader's maximum, or bytes that are not a Frame, are errors after which the
 * connection must be dropped. Decoding allocates through hp_malloc (fault injection covers it).
 */
#ifndef HP_FRAME_H
#define HP_FRAME_H

#include "hp/base.h"

#include "hp/v1/worker.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_FRAME_MAX        ((size_t)64 << 20) /* a Program for a 405B graph is a few MB */
#define HP_PROTOCOL_VERSION 1

/* Encodes f: *out (hp_malloc'd) holds the length prefix and the message. HP_LIMIT when the
 * message exceeds HP_FRAME_MAX. */
hp_status hp_frame_encode(const Hp__V1__Frame *f, uint8_t **out, size_t *len, hp_err *err);

typedef struct hp_frame_reader {
    uint8_t *buf;
    size_t off, len, cap; /* unread bytes are buf[off, len): frames are consumed by moving off,
                             and feed compacts once per call, not once per frame */
    size_t max;           /* largest message accepted */
} hp_frame_reader;

void hp_frame_reader_init(hp_frame_reader *r, size_t max);
void hp_frame_reader_fini(hp_frame_reader *r);
/* Appends n bytes. HP_NOMEM; HP_LIMIT when buffered bytes exceed max + 4 (a peer flooding). */
hp_status hp_frame_reader_feed(hp_frame_reader *r, const void *data, size_t n, hp_err *err);
/* The next complete frame: HP_OK with *f set (free with hp_frame_free), or HP_OK with *f NULL
 * when more bytes are needed. HP_LIMIT (length over max) or HP_PARSE (not a Frame) name the
 * length; then the stream is unusable. */
hp_status hp_frame_reader_next(hp_frame_reader *r, Hp__V1__Frame **f, hp_err *err);
void hp_frame_free(Hp__V1__Frame *f);

#ifdef __cplusplus
}
#endif
#endif
