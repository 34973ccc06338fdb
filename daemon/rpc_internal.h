/* daemon/rpc_internal.h — what rpc.c (the service: calls, handlers, lifecycle) and
 * rpc_watch.c (WatchJob streaming: queues, batches, the flush timer) and rpc_decode.c (request
 * decoding, large ones on the pool) share. Loop thread only, but for hpd_rpc_decode's work.
 */
#ifndef HP_DAEMON_RPC_INTERNAL_H
#define HP_DAEMON_RPC_INTERNAL_H

#include "daemon/hpd.h"

#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <protobuf-c/protobuf-c.h>

#include <stdbool.h>
#include <stddef.h>

#define HPD_RPC_SLOTS         4
#define HPD_RPC_WATCH_BACKLOG (16u << 20)
#define HPD_RPC_TLS_MAX       (1u << 20)
/* One batch message: far under the clients' receive limits (Python's default is 4 MiB), and
 * under malloc's mmap threshold (128 KiB). */
#define HPD_RPC_BATCH_EVENTS 1024
#define HPD_RPC_BATCH_BYTES  (128u << 10)
/* A batched watcher sends at once only when this many events wait; fewer go out from the
 * flush timer, at most HPD_RPC_COALESCE_MS later: a busy stream sends big batches (gRPC's
 * cost is per message), a quiet one waits a couple of milliseconds. */
#define HPD_RPC_BATCH_EARLY 256
#define HPD_RPC_COALESCE_MS 2

#define CONTAINER_OF(p, T, m) ((T *)((char *)(p)-offsetof(T, m)))

typedef struct rpc_tag rpc_tag;
struct rpc_tag {
    void (*fn)(rpc_tag *t, int ok);
    rpc_tag *next;
    int ok;
};

enum {
    M_SUBMIT,
    M_GET,
    M_LIST,
    M_CANCEL,
    M_WATCH,
    M_PLAN,
    M_TRACE,
    M_CHECKPOINT,
    M_COUNT,
    M_GENERIC = -1
};

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

/* Payloads over this many bytes are decoded on libuv's pool, not the loop (rpc_decode.c). */
#define HPD_RPC_DECODE_INLINE (64u << 10)

/* A request decoded (or being decoded) off the loop. */
typedef struct hpd_rpc_decode {
    uv_work_t work;
    rpc_call *call;
    const ProtobufCMessageDescriptor *desc;
    void (*then)(rpc_call *c); /* the handler, on the loop once decoded */
    grpc_byte_buffer *payload; /* taken from the call; destroyed by the decode */
    ProtobufCMessage *msg;     /* the result, or NULL: st and err say why */
    hp_status st;
    size_t len;
    hp_err err;
} hpd_rpc_decode;

struct rpc_call {
    rpc_server *s;
    int method; /* M_* or M_GENERIC */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* generic slot only */
    rpc_tag t_new, t_close, t_send;
    int pending;      /* outstanding tags */
    int cancelled;    /* RECV_CLOSE_ON_SERVER's output */
    bool closed;      /* the close tag came back */
    bool send_busy;   /* a send batch is in flight */
    bool md_sent;     /* initial metadata went out */
    bool status_sent; /* SEND_STATUS_FROM_SERVER started */
    grpc_byte_buffer *send_bb;
    grpc_slice status_details;
    bool has_details;
    /* WatchJob */
    hpd_watch *watch;
    bool watching;          /* hpd_watch_start succeeded and the watch has not ended */
    bool watch_over;        /* the watch delivered its final NULL */
    bool batch;             /* the client accepts JobEvent{batch} */
    hpd_submit_req *submit; /* SubmitJob: the compile check in flight (hpd_submit_async) */
    hpd_plan_req *plan;     /* GetPlan: the compile in flight (hpd_plan_async) */
    bool flushing;          /* the flush timer is pumping it: send whatever waits */
    bool in_wq;             /* on s->wq (batched watchers the flush timer visits) */
    struct rpc_call *wq_next, *wq_prev;
    grpc_slice *q; /* ring of queued encoded events (refs on slices shared among watchers) */
    size_t q_cap, q_first, q_n;
    size_t q_bytes;
    grpc_status_code end_code; /* status to send when the queue drains after watch_over */
    char end_msg[HP_ERR_MSG_MAX];
    hpd_rpc_decode *dec; /* decoded off the loop, for hp__rpc_unpack_req to hand out */
};

struct rpc_server {
    hpd *d;
    grpc_server *server;
    grpc_completion_queue *cq;
    void *methods[M_COUNT];
    uv_thread_t thread;
    uv_mutex_t mu;
    uv_async_t async;
    uv_timer_t grace;
    rpc_tag *head, *tail; /* guarded by mu */
    bool cq_done;         /* guarded by mu */
    rpc_tag t_shutdown;
    bool shutting_down, server_destroyed, grace_started, closing;
    int live_calls;
    int handles;      /* open uv handles (async, flush and grace timers); s is freed when the last
                         closes */
    uv_timer_t flush; /* HPD_RPC_COALESCE_MS while wq is not empty */
    bool flush_on;
    rpc_call *wq; /* batched watch calls */
};

/* rpc.c */
void hp__rpc_send_batch(rpc_call *c, grpc_byte_buffer *bb, bool with_status, grpc_status_code code,
                        const char *msg);
void hp__rpc_reply_status(rpc_call *c, grpc_status_code code, const char *msg);
void hp__rpc_call_maybe_free(rpc_call *c);
grpc_status_code hp__rpc_code_of(hp_status st);
void hp__rpc_server_unref(rpc_server *s); /* one of s->handles is done; the last frees s */

/* rpc_decode.c */
ProtobufCMessage *hp__rpc_unpack_req(rpc_call *c, const ProtobufCMessageDescriptor *desc);
/* A payload over HPD_RPC_DECODE_INLINE: decodes it on the pool, then runs then(c) on the loop
 * (not when the call ended meanwhile) and returns true; false: decode inline (call then(c)). */
bool hp__rpc_decode_async(rpc_call *c, const ProtobufCMessageDescriptor *desc,
                          void (*then)(rpc_call *c));

/* rpc_watch.c */
void hp__rpc_h_watch(rpc_call *c);    /* WatchJob */
void hp__rpc_watch_pump(rpc_call *c); /* after a send completed */
void hp__rpc_q_clear(rpc_call *c);    /* drops the queued events */
void hp__rpc_wq_remove(rpc_call *c);  /* off the flush timer's list */
void hp__rpc_enc_reset(void);         /* drops the shared encoding (shutdown) */

#endif
