/* daemon/rpc_decode.c — unpacking a request's payload: the pre-scan against the decode budget
 * (pbcheck.c), protobuf-c's unpack with a counting allocator, and the choice of thread.
 *
 * A payload of at most HPD_RPC_DECODE_INLINE bytes is decoded on the loop when its handler
 * asks (hp__rpc_unpack_req): a few microseconds. A larger one is decoded on libuv's thread pool
 * before the handler runs (hp__rpc_decode_async, called by dispatch): scanning and unpacking
 * tens of MiB takes up to seconds, which on the loop would stall every other call (a ListJobs,
 * the workers' heartbeats). The handler then finds the message ready; the budget, the refusals
 * and their messages are the same on both paths. While a decode is in flight the call holds a
 * pending count (it is not freed under the pool thread) and the server a handle count (it is
 * not torn down, nor grpc_shutdown called, before the decode is back).
 */
#include "daemon/rpc_internal.h"

#include "daemon/core.h" /* hp__log */
#include "daemon/pbcheck.h"
#include "daemon/rpc.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* protobuf-c's allocations while unpacking a request, counted against the decode budget (a
 * backstop behind hp__pb_check's estimate). malloc/free: what free_unpacked(NULL) frees with. */
typedef struct decode_budget {
    size_t used, max;
    bool over;
} decode_budget;

static void *budget_alloc(void *data, size_t n) {
    decode_budget *b = data;
    if (n > b->max - b->used) {
        b->over = true;
        return NULL;
    }
    b->used += n;
    return malloc(n);
}

static void budget_free(void *data, void *p) {
    (void)data;
    free(p);
}

/* Decodes and destroys payload (any thread: no rpc_call, no log). HP_OK and *out, or the
 * status and err->msg saying why (`what`: "" when it is plainly malformed). */
static hp_status decode(grpc_byte_buffer *payload, const ProtobufCMessageDescriptor *desc,
                        ProtobufCMessage **out, size_t *len_out, hp_err *err) {
    *out = NULL;
    *len_out = 0;
    grpc_byte_buffer_reader r;
    if (!payload || !grpc_byte_buffer_reader_init(&r, payload)) {
        if (payload) grpc_byte_buffer_destroy(payload);
        err->msg[0] = 0;
        return HP_INVALID;
    }
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    grpc_byte_buffer_destroy(payload); /* the bytes live in `all` until unpacked */
    const uint8_t *data = GRPC_SLICE_START_PTR(all);
    size_t len = GRPC_SLICE_LENGTH(all);
    *len_out = len;
    hpd_pb_limits lim = {.max_alloc = HPD_RPC_DECODE_MAX, .max_depth = 32, .check_strings = true};
    hp_status st = hp__pb_check(desc, data, len, &lim, NULL, err);
    decode_budget b = {.max = HPD_RPC_DECODE_MAX};
    if (st == HP_OK) {
        ProtobufCAllocator a = {budget_alloc, budget_free, &b};
        *out = protobuf_c_message_unpack(desc, &a, len, data);
    }
    grpc_slice_unref(all);
    if (*out) return HP_OK;
    if (st == HP_OK && b.over) {
        snprintf(err->msg, sizeof err->msg,
                 "decoding the request would allocate more than %u MiB (the daemon's decode "
                 "budget)",
                 (unsigned)(HPD_RPC_DECODE_MAX >> 20));
        return HP_LIMIT;
    }
    if (st == HP_OK) { /* it passed the scan but does not decode: malformed */
        err->msg[0] = 0;
        return HP_INVALID;
    }
    if (st != HP_LIMIT && st != HP_INVALID) err->msg[0] = 0;
    return st;
}

/* The loop's half: m, or NULL with the call answered (and a refusal logged). */
static ProtobufCMessage *finish(rpc_call *c, const ProtobufCMessageDescriptor *desc, hp_status st,
                                ProtobufCMessage *m, size_t len, const hp_err *err) {
    if (st == HP_OK) return m;
    char msg[HP_ERR_MSG_MAX + 32];
    if (err->msg[0]) {
        char *peer = grpc_call_get_peer(c->call);
        hp__log("warn", "event=rpc_refused method=%s peer=%s bytes=%zu what=\"%s\"",
                desc->short_name, peer ? peer : "?", len, err->msg);
        gpr_free(peer);
        snprintf(msg, sizeof msg, "%s: %s", desc->short_name, err->msg);
    } else {
        snprintf(msg, sizeof msg, "malformed %s", desc->short_name);
    }
    hp__rpc_reply_status(c, hp__rpc_code_of(st), msg);
    return NULL;
}

/* Unpacks the request payload; NULL when it was refused, the call answered: malformed or absent
 * (INVALID_ARGUMENT), over the decode budget (RESOURCE_EXHAUSTED), or a string field with a NUL
 * byte or invalid UTF-8 (INVALID_ARGUMENT naming the field). The wire bytes are scanned before
 * anything is allocated (hp__pb_check), so a request of millions of empty messages costs a scan,
 * not gigabytes. A large payload was decoded already, off the loop (hp__rpc_decode_async).
 * Free the result with protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *hp__rpc_unpack_req(rpc_call *c, const ProtobufCMessageDescriptor *desc) {
    if (c->dec) { /* decoded on the pool */
        hpd_rpc_decode *dc = c->dec;
        c->dec = NULL;
        ProtobufCMessage *m = dc->desc == desc ? dc->msg : NULL;
        hp_status st = dc->desc == desc ? dc->st : HP_INTERNAL;
        if (dc->desc != desc) {
            snprintf(dc->err.msg, sizeof dc->err.msg, "decoded as %s", dc->desc->short_name);
            if (dc->msg) protobuf_c_message_free_unpacked(dc->msg, NULL);
        }
        m = finish(c, desc, st, m, dc->len, &dc->err);
        hp_free(dc);
        return m;
    }
    ProtobufCMessage *m = NULL;
    size_t len = 0;
    hp_err err = {0};
    grpc_byte_buffer *payload = c->payload;
    c->payload = NULL;
    hp_status st = decode(payload, desc, &m, &len, &err);
    return finish(c, desc, st, m, len, &err);
}

/* ---- off the loop ------------------------------------------------------------------------- */

static void decode_work(uv_work_t *w) { /* a pool thread */
    hpd_rpc_decode *dc = w->data;
    dc->st = decode(dc->payload, dc->desc, &dc->msg, &dc->len, &dc->err);
    dc->payload = NULL;
}

static void decode_after(uv_work_t *w, int status) { /* the loop */
    hpd_rpc_decode *dc = w->data;
    rpc_call *c = dc->call;
    rpc_server *s = c->s;
    c->pending--;
    if (status != 0 || c->closed || s->shutting_down) { /* nobody to answer */
        if (dc->payload) grpc_byte_buffer_destroy(dc->payload);
        if (dc->msg) protobuf_c_message_free_unpacked(dc->msg, NULL);
        hp_free(dc);
        if (!c->closed) grpc_call_cancel(c->call, NULL);
        hp__rpc_call_maybe_free(c);
    } else {
        c->dec = dc;
        dc->then(c);
        if (c->dec) { /* the handler did not ask for it */
            if (dc->msg) protobuf_c_message_free_unpacked(dc->msg, NULL);
            hp_free(dc);
            c->dec = NULL;
        }
        hp__rpc_call_maybe_free(c);
    }
    hp__rpc_server_unref(s);
}

bool hp__rpc_decode_async(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                          void (*then)(rpc_call *c)) {
    if (!desc || !c->payload || grpc_byte_buffer_length(c->payload) <= HPD_RPC_DECODE_INLINE)
        return false;
    hpd_rpc_decode *dc = hp_calloc(1, sizeof *dc);
    if (!dc) return false; /* decoded on the loop, as a small one */
    dc->call = c;
    dc->desc = desc;
    dc->then = then;
    dc->payload = c->payload;
    dc->work.data = dc;
    if (uv_queue_work(hpd_loop(c->s->d), &dc->work, decode_work, decode_after) != 0) {
        hp_free(dc);
        return false;
    }
    c->payload = NULL;
    c->pending++;
    c->s->handles++;
    return true;
}
