/* daemon/rpc_watch.c — WatchJob's streaming: each watcher's queue of encoded events (refs on
 * one encoding shared by every watcher of an event), one SEND_MESSAGE in flight per stream,
 * the backlog bound (RESOURCE_EXHAUSTED past HPD_RPC_WATCH_BACKLOG: the client reconnects with
 * from_step), batches for watchers that asked (JobEvent{batch} built from the encodings under
 * protobuf length prefixes, no re-encoding) and the flush timer that coalesces them.
 */
#include "daemon/core.h" /* hp__event_seq */
#include "daemon/rpc_internal.h"

#include <stdio.h>
#include <string.h>

/* The last event encoded for watchers (hp__event_seq, the event's address): every watcher of
 * that event takes a ref on the same bytes. Loop thread only. */
static struct {
    bool valid;
    uint64_t seq;
    const void *ev;
    grpc_slice sl;
} g_enc;

void hp__rpc_enc_reset(void) {
    if (g_enc.valid) grpc_slice_unref(g_enc.sl);
    g_enc.valid = false;
}

void hp__rpc_q_clear(rpc_call *c) {
    for (size_t i = 0; i < c->q_n; i++) grpc_slice_unref(c->q[(c->q_first + i) % c->q_cap]);
    c->q_first = c->q_n = 0;
    c->q_bytes = 0;
}

void hp__rpc_wq_remove(rpc_call *c) {
    if (!c->in_wq) return;
    if (c->wq_prev)
        c->wq_prev->wq_next = c->wq_next;
    else
        c->s->wq = c->wq_next;
    if (c->wq_next) c->wq_next->wq_prev = c->wq_prev;
    c->in_wq = false;
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t varint_put(uint8_t *p, uint64_t v) {
    size_t n = 0;
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        p[n++] = byte | (v ? 0x80 : 0);
    } while (v);
    return n;
}

/* The queue's head event, dequeued (the caller owns the ref). */
static grpc_slice q_pop(rpc_call *c) {
    grpc_slice sl = c->q[c->q_first];
    c->q_first = (c->q_first + 1) % c->q_cap;
    c->q_n--;
    c->q_bytes -= GRPC_SLICE_LENGTH(sl);
    return sl;
}

/* The next message for a watcher: the head event as is, or (batch watchers, several queued)
 * JobEvent { JobEventBatch batch = 13 { repeated JobEvent events = 1; } } written around the
 * events' encodings, in queue order, up to the caps (always at least one event). */
static grpc_byte_buffer *watch_next_message(rpc_call *c) {
    size_t n = 0, inner = 0;
    if (c->batch) {
        while (n < c->q_n && n < HPD_RPC_BATCH_EVENTS) {
            size_t l = GRPC_SLICE_LENGTH(c->q[(c->q_first + n) % c->q_cap]);
            size_t add = 1 + varint_len(l) + l;
            if (n && inner + add > HPD_RPC_BATCH_BYTES) break;
            inner += add;
            n++;
        }
    }
    if (n < 2) { /* a batch of one goes as the plain event */
        grpc_slice sl = q_pop(c);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1); /* takes its own ref */
        grpc_slice_unref(sl);
        return bb;
    }
    grpc_slice out = grpc_slice_malloc(1 + varint_len(inner) + inner);
    uint8_t *p = GRPC_SLICE_START_PTR(out);
    *p++ = (13 << 3) | 2; /* JobEvent.batch, length-delimited */
    p += varint_put(p, inner);
    for (size_t i = 0; i < n; i++) {
        grpc_slice sl = q_pop(c);
        size_t l = GRPC_SLICE_LENGTH(sl);
        *p++ = (1 << 3) | 2; /* JobEventBatch.events */
        p += varint_put(p, l);
        memcpy(p, GRPC_SLICE_START_PTR(sl), l);
        p += l;
        grpc_slice_unref(sl);
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&out, 1);
    grpc_slice_unref(out);
    return bb;
}

/* WatchJob: stream events with one send in flight. */
void hp__rpc_watch_pump(rpc_call *c) {
    if (c->send_busy || c->status_sent || c->closed || !c->call) return;
    if (c->q_n) {
        if (c->in_wq && !c->flushing && !c->watch_over && c->q_n < HPD_RPC_BATCH_EARLY)
            return; /* the flush timer sends it, with what else arrives meanwhile */
        hp__rpc_send_batch(c, watch_next_message(c), false, GRPC_STATUS_OK, NULL);
        return;
    }
    if (c->watch_over) hp__rpc_reply_status(c, c->end_code, c->end_msg);
}

static void watch_end(rpc_call *c, grpc_status_code code, const char *msg) {
    if (c->watching && c->watch) hpd_watch_stop(c->watch);
    c->watching = false;
    c->watch = NULL;
    c->watch_over = true;
    c->end_code = code;
    snprintf(c->end_msg, sizeof c->end_msg, "%s", msg ? msg : "");
    if (code != GRPC_STATUS_OK) hp__rpc_q_clear(c); /* drop what is queued: the status goes next */
}

/* Appends sl (the caller's ref moves to the queue); false: out of memory (sl is released). */
static bool q_push(rpc_call *c, grpc_slice sl) {
    if (c->q_n == c->q_cap) {
        size_t cap = c->q_cap ? c->q_cap * 2 : 64;
        grpc_slice *q = hp_calloc(cap, sizeof *q);
        if (!q) {
            grpc_slice_unref(sl);
            return false;
        }
        for (size_t i = 0; i < c->q_n; i++) q[i] = c->q[(c->q_first + i) % c->q_cap];
        hp_free(c->q);
        c->q = q;
        c->q_cap = cap;
        c->q_first = 0;
    }
    c->q[(c->q_first + c->q_n) % c->q_cap] = sl;
    c->q_n++;
    c->q_bytes += GRPC_SLICE_LENGTH(sl);
    return true;
}

/* ev's encoding, shared by all watchers of the same event (a new ref for the caller). */
static grpc_slice enc_event(const Hp__V1__JobEvent *ev) {
    if (!g_enc.valid || g_enc.seq != hp__event_seq || g_enc.ev != (const void *)ev) {
        hp__rpc_enc_reset();
        size_t n = protobuf_c_message_get_packed_size(&ev->base);
        g_enc.sl = grpc_slice_malloc(n);
        protobuf_c_message_pack(&ev->base, GRPC_SLICE_START_PTR(g_enc.sl));
        g_enc.seq = hp__event_seq;
        g_enc.ev = ev;
        g_enc.valid = true;
    }
    return grpc_slice_ref(g_enc.sl);
}

static void on_watch_event(void *ctx, const Hp__V1__JobEvent *ev) {
    rpc_call *c = ctx;
    if (!ev) { /* the watch is over and freed by hpd */
        c->watching = false;
        c->watch = NULL;
        c->watch_over = true;
        c->end_code = GRPC_STATUS_OK;
        c->end_msg[0] = 0;
        hp__rpc_watch_pump(c);
        hp__rpc_call_maybe_free(c);
        return;
    }
    if (c->closed || c->watch_over) return;
    grpc_slice sl = enc_event(ev);
    if (c->q_bytes + GRPC_SLICE_LENGTH(sl) > HPD_RPC_WATCH_BACKLOG) {
        grpc_slice_unref(sl);
        watch_end(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "watcher fell behind; reconnect with from_step");
        hp__rpc_watch_pump(c);
        return;
    }
    if (!q_push(c, sl)) {
        watch_end(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        hp__rpc_watch_pump(c);
        return;
    }
    hp__rpc_watch_pump(c);
}

/* Every HPD_RPC_COALESCE_MS while there are batched watchers: send what waits. */
static void on_flush(uv_timer_t *tm) {
    rpc_server *s = tm->data;
    if (!s->wq) {
        uv_timer_stop(tm);
        s->flush_on = false;
        return;
    }
    for (rpc_call *c = s->wq, *next; c; c = next) {
        next = c->wq_next;
        c->flushing = true;
        hp__rpc_watch_pump(c);
        c->flushing = false;
    }
}

void hp__rpc_h_watch(rpc_call *c) {
    Hp__V1__WatchJobRequest *req =
        (Hp__V1__WatchJobRequest *)hp__rpc_unpack_req(c, &hp__v1__watch_job_request__descriptor);
    if (!req) return; /* answered */
    hpd_watch *w = NULL;
    hp_err err = {0};
    c->batch = req->batch;
    c->watching = true; /* events may arrive before hpd_watch_start returns */
    hp_status st = hpd_watch_start(c->s->d, req->job_id, req->from_step, req->logs, on_watch_event,
                                   c, &w, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        c->watching = false;
        /* drop anything queued by a failed start */
        watch_end(c, hp__rpc_code_of(st), err.msg[0] ? err.msg : hp_status_str(st));
        hp__rpc_watch_pump(c);
        return;
    }
    if (c->watching) c->watch = w;                 /* else it already ended inside start */
    if (c->batch && !c->watch_over && !c->in_wq) { /* coalesce: see HPD_RPC_BATCH_EARLY */
        rpc_server *s = c->s;
        c->wq_next = s->wq;
        c->wq_prev = NULL;
        if (s->wq) s->wq->wq_prev = c;
        s->wq = c;
        c->in_wq = true;
        if (!s->flush_on) {
            s->flush_on = true;
            uv_timer_start(&s->flush, on_flush, HPD_RPC_COALESCE_MS, HPD_RPC_COALESCE_MS);
        }
        hp__rpc_watch_pump(c); /* the replay may have queued a batch's worth already */
    }
}
