/* graph/frame.c — the worker protocol's framing (hp/frame.h): a 4-byte little-endian length,
 * then a packed hp.v1.Frame. The reader buffers what the socket gave it and hands out whole
 * frames; it never trusts the length (bounded by the reader's max before anything is sized
 * from it) and decodes through the budgeted allocator of hp/proto_io.h, so a hostile peer
 * can make it allocate neither a huge buffer nor a huge decoded message.
 *
 * It lives in libhp_graph (not libhp_proto, which holds only generated code) because it needs
 * the allocator there. No I/O: the daemon (libuv) and the worker (blocking sockets) do that.
 */
#include "hp/frame.h"

#include "hp/proto_io.h"

#include <stdbool.h>
#include <string.h>

#define HEADER 4

hp_status hp_frame_encode(const Hp__V1__Frame *f, uint8_t **out, size_t *len, hp_err *err) {
    *out = NULL;
    *len = 0;
    size_t n = hp__v1__frame__get_packed_size(f);
    if (n > HP_FRAME_MAX)
        return hp_errf(err, HP_LIMIT, "frame: message of %zu bytes is over the limit of %zu", n,
                       HP_FRAME_MAX);
    uint8_t *buf = hp_malloc(HEADER + n);
    if (!buf) return hp_errf(err, HP_NOMEM, "frame: out of memory encoding %zu bytes", n);
    for (int i = 0; i < HEADER; i++) buf[i] = (uint8_t)(n >> (8 * i));
    size_t wrote = hp__v1__frame__pack(f, buf + HEADER);
    HP_ASSERT(wrote == n);
    *out = buf;
    *len = HEADER + n;
    return HP_OK;
}

void hp_frame_reader_init(hp_frame_reader *r, size_t max) {
    memset(r, 0, sizeof *r);
    r->max = max > HP_FRAME_MAX ? HP_FRAME_MAX : max;
}

void hp_frame_reader_fini(hp_frame_reader *r) {
    hp_free(r->buf);
    memset(r, 0, sizeof *r);
}

hp_status hp_frame_reader_feed(hp_frame_reader *r, const void *data, size_t n, hp_err *err) {
    if (n == 0) return HP_OK;
    if (r->off) { /* drop what next() consumed: one move per feed */
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
    }
    size_t limit = r->max + HEADER;
    if (n > limit || r->len > limit - n)
        return hp_errf(err, HP_LIMIT,
                       "frame: %zu bytes buffered without a complete frame (limit %zu)",
                       r->len + (n > limit ? limit : n), limit);
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n) cap = cap > limit / 2 ? limit : cap * 2;
        uint8_t *p = hp_realloc(r->buf, cap);
        if (!p) return hp_errf(err, HP_NOMEM, "frame: out of memory buffering %zu bytes", cap);
        r->buf = p;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return HP_OK;
}

/* Whether m or a message inside it kept an unknown field numbered 0. protobuf-c rejects tag 0
 * written in one byte but keeps it as an unknown field when the varint is padded ("82 00"),
 * and would then re-encode it in one byte, which no decoder accepts (found by fuzz_frame).
 * Field 0 is never valid protobuf: such a frame is refused. */
static bool has_field_zero(const ProtobufCMessage *m) {
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0) return true;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        if (fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const char *base = (const char *)m;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + fd->offset);
            for (size_t j = 0; j < n; j++)
                if (v[j] && has_field_zero(v[j])) return true;
            continue;
        }
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + fd->offset);
        if (sub && has_field_zero(sub)) return true;
    }
    return false;
}

hp_status hp_frame_reader_next(hp_frame_reader *r, Hp__V1__Frame **f, hp_err *err) {
    *f = NULL;
    const uint8_t *p = r->buf + r->off;
    size_t have = r->len - r->off;
    if (have < HEADER) return HP_OK;
    size_t n = 0;
    for (int i = 0; i < HEADER; i++) n |= (size_t)p[i] << (8 * i);
    if (n > r->max)
        return hp_errf(err, HP_LIMIT, "frame: length %zu is over the limit of %zu", n, r->max);
    if (have - HEADER < n) return HP_OK;
    hp_proto_alloc a;
    hp_proto_alloc_init(&a, n);
    Hp__V1__Frame *msg = hp__v1__frame__unpack(&a.base, n, p + HEADER);
    /* On failure the bytes stay: HP_NOMEM may be retried; after HP_PARSE/HP_LIMIT the caller
     * drops the connection, as the contract says. */
    if (!msg) return hp_proto_unpack_error(&a, "frame", n, err);
    if (has_field_zero(&msg->base)) {
        hp__v1__frame__free_unpacked(msg, &a.base);
        return hp_errf(err, HP_PARSE, "frame: not a valid message (%zu bytes): field number 0", n);
    }
    r->off += HEADER + n;
    if (r->off == r->len) r->off = r->len = 0;
    *f = msg;
    return HP_OK;
}

void hp_frame_free(Hp__V1__Frame *f) {
    if (!f) return;
    /* The allocator's free ignores its budget state: a fresh one frees what any decode made. */
    hp_proto_alloc a;
    hp_proto_alloc_init(&a, 0);
    hp__v1__frame__free_unpacked(f, &a.base);
}
