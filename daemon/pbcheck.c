/* daemon/pbcheck.c — see pbcheck.h. The estimate follows protobuf-c 1.4's unpack: one block of
 * sizeof_message per (sub)message, one array per repeated field (a pointer or a scalar slot per
 * element, counted as 8 bytes), a copy of each string or bytes value, one
 * ProtobufCMessageUnknownField and a copy of the data per unknown field; each allocation is
 * charged ALLOC_OVERHEAD more for malloc's header. It stops as soon as the estimate passes the
 * limit, so a bomb costs a scan of its first few megabytes, not its decoding.
 */
#include "daemon/pbcheck.h"

#include <stdio.h>
#include <string.h>

#define ALLOC_OVERHEAD 16

typedef struct scan {
    const hpd_pb_limits *lim;
    size_t est;
    char path[256];
    hp_err *err;
} scan;

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

bool hp__utf8_sanitize(char *dst, size_t n, const char *s) {
    if (!n) return false;
    size_t len = strnlen(s, n - 1), o = 0;
    bool changed = false;
    while (o < len) {
        size_t ok = hp_utf8_check(s + o, len - o, true);
        memcpy(dst + o, s + o, ok);
        o += ok;
        if (o < len) {
            dst[o++] = '?';
            changed = true;
        }
    }
    dst[len] = 0;
    return changed;
}

static hp_status charge(scan *s, size_t bytes) {
    if (bytes > s->lim->max_alloc || s->est > s->lim->max_alloc - bytes)
        return hp_errf(s->err, HP_LIMIT,
                       "decoding the request would allocate more than %zu MiB (the daemon's "
                       "decode budget)",
                       s->lim->max_alloc >> 20);
    s->est += bytes;
    return HP_OK;
}

static size_t elem_count(const ProtobufCFieldDescriptor *fd, const uint8_t *p, size_t len) {
    switch (fd->type) {
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return len / 4;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return len / 8;
    default: { /* varints: one per byte without the continuation bit */
        size_t k = 0;
        for (size_t i = 0; i < len; i++) k += !(p[i] & 0x80);
        return k;
    }
    }
}

static hp_status walk(scan *s, const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t len,
                      int depth) {
    if (depth > s->lim->max_depth)
        return hp_errf(s->err, HP_LIMIT, "%s: messages nested deeper than %d", s->path,
                       s->lim->max_depth);
    HP_TRY(charge(s, desc->sizeof_message + ALLOC_OVERHEAD));
    const uint8_t *end = p + len;
    size_t plen = strlen(s->path);
    while (p < end) {
        uint64_t tag, v;
        if (!varint(&p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
            return hp_errf(s->err, HP_PARSE, "malformed %s", desc->short_name);
        unsigned wt = (unsigned)(tag & 7);
        const ProtobufCFieldDescriptor *fd =
            protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3));
        const uint8_t *val = p;
        size_t vlen = 0;
        switch (wt) {
        case 0:
            if (!varint(&p, end, &v))
                return hp_errf(s->err, HP_PARSE, "malformed %s", desc->short_name);
            vlen = (size_t)(p - val);
            break;
        case 1:
        case 5:
            vlen = wt == 1 ? 8 : 4;
            if ((size_t)(end - p) < vlen)
                return hp_errf(s->err, HP_PARSE, "malformed %s", desc->short_name);
            p += vlen;
            break;
        case 2:
            if (!varint(&p, end, &v) || v > (uint64_t)(end - p))
                return hp_errf(s->err, HP_PARSE, "malformed %s", desc->short_name);
            val = p;
            vlen = (size_t)v;
            p += vlen;
            break;
        default: /* groups: protobuf-c refuses them too */
            return hp_errf(s->err, HP_PARSE, "malformed %s", desc->short_name);
        }
        if (!fd) {
            HP_TRY(charge(s, sizeof(ProtobufCMessageUnknownField) + 8 + vlen + ALLOC_OVERHEAD));
            continue;
        }
        bool repeated = fd->label == PROTOBUF_C_LABEL_REPEATED;
        if (repeated) HP_TRY(charge(s, 8)); /* its slot in the field's array */
        if (wt != 2) continue;
        snprintf(s->path + plen, sizeof s->path - plen, "%s%s", plen ? "." : "", fd->name);
        switch (fd->type) {
        case PROTOBUF_C_TYPE_MESSAGE:
            HP_TRY(walk(s, fd->descriptor, val, vlen, depth + 1));
            break;
        case PROTOBUF_C_TYPE_STRING:
            HP_TRY(charge(s, vlen + 1 + ALLOC_OVERHEAD));
            if (s->lim->check_strings) {
                const uint8_t *nul = memchr(val, 0, vlen);
                if (nul)
                    return hp_errf(s->err, HP_INVALID, "%s: holds a NUL byte (at offset %zu)",
                                   s->path, (size_t)(nul - val));
                size_t bad = hp_utf8_check((const char *)val, vlen, true);
                if (bad < vlen)
                    return hp_errf(s->err, HP_INVALID, "%s: not valid UTF-8 (at offset %zu)",
                                   s->path, bad);
            }
            break;
        case PROTOBUF_C_TYPE_BYTES:
            HP_TRY(charge(s, vlen + ALLOC_OVERHEAD));
            break;
        default: /* a packed repeated scalar */
            if (repeated) HP_TRY(charge(s, 8 * elem_count(fd, val, vlen)));
            break;
        }
        s->path[plen] = 0;
    }
    return HP_OK;
}

hp_status hp__pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                       const hpd_pb_limits *lim, size_t *est, hp_err *err) {
    scan s = {.lim = lim, .err = err};
    hp_status st = walk(&s, desc, data, len, 0);
    if (est) *est = s.est;
    return st;
}
