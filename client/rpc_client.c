/* client/rpc_client.c — the blocking Coordinator client (see rpc_client.h and
 * ../shared/notes/grpc-c-core.md, section 4): one channel, one pluck CQ, one batch for a
 * unary call, and for the watch stream one RECV_STATUS batch up front plus one RECV_MESSAGE at
 * a time. A JobEvent{batch} message is unpacked into its events, handed over one at a time.
 */
#include "client/rpc_client.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HP_RPC_TOKEN_MAX 4096
#define HP_RPC_PEM_MAX   (1u << 20)

struct hp_rpc_client {
    grpc_channel *ch;
    grpc_completion_queue *cq;
    char *auth; /* "Bearer <token>" or NULL */
    int timeout_ms;
};

const char *hp_rpc_code_name(int code) {
    static const char *names[] = {"OK",
                                  "CANCELLED",
                                  "UNKNOWN",
                                  "INVALID_ARGUMENT",
                                  "DEADLINE_EXCEEDED",
                                  "NOT_FOUND",
                                  "ALREADY_EXISTS",
                                  "PERMISSION_DENIED",
                                  "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION",
                                  "ABORTED",
                                  "OUT_OF_RANGE",
                                  "UNIMPLEMENTED",
                                  "INTERNAL",
                                  "UNAVAILABLE",
                                  "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    if (code >= 0 && code < (int)HP_ARRAY_LEN(names)) return names[code];
    return "UNKNOWN";
}

static hp_status read_text(const char *path, size_t max, char **out, hp_err *err) {
    uint8_t *data = NULL;
    size_t len = 0;
    HP_TRY(hp_file_read(path, max, &data, &len, err));
    char *s = hp_malloc(len + 1);
    if (!s) {
        hp_free(data);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    }
    memcpy(s, data, len);
    s[len] = 0;
    hp_free(data);
    *out = s;
    return HP_OK;
}

hp_status hp_rpc_state_dir(char *buf, size_t n, hp_err *err) {
    const char *e = getenv("HP_STATE_DIR");
    int w;
    if (e && *e) {
        w = snprintf(buf, n, "%s", e);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) return hp_errf(err, HP_NOT_FOUND, "neither HP_STATE_DIR nor HOME set");
        w = snprintf(buf, n, "%s/.local/state/hp", home);
    }
    if (w < 0 || (size_t)w >= n) return hp_errf(err, HP_LIMIT, "state dir path too long");
    return HP_OK;
}

hp_status hp_rpc_find_token(const char *flag, char **out, hp_err *err) {
    *out = NULL;
    const char *t = flag && *flag ? flag : getenv("HP_TOKEN");
    if (t && *t) {
        *out = hp_strdup(t);
        return *out ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory");
    }
    char dir[4096], path[4200];
    if (hp_rpc_state_dir(dir, sizeof dir, NULL) != HP_OK) return HP_OK;
    snprintf(path, sizeof path, "%s/token", dir);
    if (access(path, F_OK) != 0) return HP_OK; /* no token: reads still work */
    char *s = NULL;
    HP_TRY(read_text(path, HP_RPC_TOKEN_MAX, &s, err));
    size_t l = strlen(s);
    while (l && isspace((unsigned char)s[l - 1])) s[--l] = 0;
    if (!l) {
        hp_free(s);
        return HP_OK;
    }
    *out = s;
    return HP_OK;
}

hp_status hp_rpc_client_open(const hp_rpc_opts *o, hp_rpc_client **out, hp_err *err) {
    const char *server = o->server;
    if (!server || !*server) server = getenv("HP_SERVER");
    if (!server || !*server) server = HP_RPC_DEFAULT_SERVER;
    char *ca = NULL;
    if (o->tls_ca && *o->tls_ca) {
        if (read_text(o->tls_ca, HP_RPC_PEM_MAX, &ca, err) != HP_OK)
            return hp_err_prefix(err, "--tls-ca");
    }
    hp_rpc_client *c = hp_calloc(1, sizeof *c);
    if (!c) {
        hp_free(ca);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    if (o->token && *o->token) {
        size_t n = strlen(o->token) + 8;
        c->auth = hp_malloc(n);
        if (!c->auth) {
            hp_free(c);
            hp_free(ca);
            return hp_errf(err, HP_NOMEM, "out of memory");
        }
        snprintf(c->auth, n, "Bearer %s", o->token);
    }
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : HP_RPC_DEFAULT_TIMEOUT_MS;
    grpc_init();
    grpc_channel_credentials *cr =
        ca ? grpc_ssl_credentials_create(ca, NULL, NULL, NULL) : grpc_insecure_credentials_create();
    hp_free(ca);
    grpc_arg a[] = {
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_ENABLE_HTTP_PROXY, {.integer = 0}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         {.integer = HP_RPC_MAX_RECV}},
    };
    grpc_channel_args args = {2, a};
    c->ch = grpc_channel_create(server, cr, &args);
    grpc_channel_credentials_release(cr);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    *out = c;
    return HP_OK;
}

void hp_rpc_client_close(hp_rpc_client *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    grpc_completion_queue_shutdown(c->cq);
    while (
        grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
        GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
    hp_free(c->auth);
    hp_free(c);
    grpc_shutdown();
}

static void set_res(hp_rpc_result *res, int code, const char *msg) {
    res->code = code;
    snprintf(res->msg, sizeof res->msg, "%s", msg ? msg : "");
}

static void take_status(hp_rpc_result *res, grpc_status_code st, grpc_slice *details,
                        const char *error_string) {
    res->code = (int)st;
    size_t n = GRPC_SLICE_LENGTH(*details);
    if (n >= sizeof res->msg) n = sizeof res->msg - 1;
    memcpy(res->msg, GRPC_SLICE_START_PTR(*details), n);
    res->msg[n] = 0;
    (void)error_string;
}

static grpc_call *new_call(hp_rpc_client *c, const char *method, gpr_timespec deadline) {
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL,
                                               deadline, NULL);
    grpc_slice_unref(m);
    return call;
}

static bool pluck(hp_rpc_client *c, void *tag) {
    grpc_event ev =
        grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* a: NULL (malloc) or an arena (free with arena_reset, not protobuf_c_message_free_unpacked). */
static ProtobufCMessage *unpack_bb(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                   ProtobufCAllocator *a) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(desc, a, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return m;
}

/* A bump allocator for unpacking watch events: a batch of ~1000 events is ~3000 small
 * allocations, all freed together. Chunks are kept across messages; arena_reset rewinds. */
typedef struct arena_chunk arena_chunk;
struct arena_chunk {
    arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

typedef struct arena {
    ProtobufCAllocator pa;
    arena_chunk *head, *cur;
} arena;

#define ARENA_CHUNK (256u << 10)

static void *arena_alloc(void *data, size_t n) {
    arena *a = data;
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    for (arena_chunk *c = a->cur; c; c = c->next) {
        if (c->cap - c->used >= n) {
            void *p = (char *)c->data + c->used;
            c->used += n;
            a->cur = c;
            return p;
        }
    }
    size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
    arena_chunk *c = hp_malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->cap = cap;
    c->used = n;
    c->next = NULL;
    if (a->cur) { /* append after the last chunk */
        arena_chunk *t = a->cur;
        while (t->next) t = t->next;
        t->next = c;
    } else {
        a->head = c;
    }
    a->cur = c;
    return c->data;
}

static void arena_free_one(void *data, void *p) {
    (void)data;
    (void)p; /* everything goes at arena_reset */
}

static void arena_reset(arena *a) {
    for (arena_chunk *c = a->head; c; c = c->next) c->used = 0;
    a->cur = a->head;
}

static void arena_fini(arena *a) {
    for (arena_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        hp_free(c);
    }
    a->head = a->cur = NULL;
}

static grpc_byte_buffer *bb_from(const uint8_t *p, size_t n) {
    grpc_slice sl = grpc_slice_malloc(n);
    if (n) memcpy(GRPC_SLICE_START_PTR(sl), p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

int hp_rpc_unary_raw(hp_rpc_client *c, const char *method, const uint8_t *req, size_t req_len,
                     bool auth, const ProtobufCMessageDescriptor *resp_desc,
                     ProtobufCMessage **resp, hp_rpc_result *res) {
    *resp = NULL;
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(c->timeout_ms, GPR_TIMESPAN));
    grpc_call *call = new_call(c, method, dl);
    if (!call) {
        set_res(res, GRPC_STATUS_INTERNAL, "cannot create the call");
        return res->code;
    }
    grpc_metadata md;
    memset(&md, 0, sizeof md);
    size_t n_md = 0;
    if (auth && c->auth) {
        md.key = grpc_slice_from_static_string("authorization");
        md.value = grpc_slice_from_copied_string(c->auth);
        n_md = 1;
    }
    grpc_byte_buffer *send = bb_from(req, req_len), *recv = NULL;
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code st = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = n_md ? &md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.status = &st;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    int tag;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
        set_res(res, GRPC_STATUS_INTERNAL, "cannot start the call");
    } else {
        pluck(c, &tag);
        take_status(res, st, &details, error_string);
        if (st == GRPC_STATUS_OK) {
            if (!recv) {
                set_res(res, GRPC_STATUS_INTERNAL, "the server sent no reply message");
            } else if (!(*resp = unpack_bb(recv, resp_desc, NULL))) {
                set_res(res, GRPC_STATUS_INTERNAL, "the server's reply does not parse");
            }
        }
    }
    if (n_md) grpc_slice_unref(md.value);
    grpc_byte_buffer_destroy(send);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_slice_unref(details);
    if (error_string) gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    return res->code;
}

int hp_rpc_unary(hp_rpc_client *c, const char *method, const ProtobufCMessage *req, bool auth,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 hp_rpc_result *res) {
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = hp_malloc(n ? n : 1);
    if (!buf) {
        *resp = NULL;
        set_res(res, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return res->code;
    }
    protobuf_c_message_pack(req, buf);
    int code = hp_rpc_unary_raw(c, method, buf, n, auth, resp_desc, resp, res);
    hp_free(buf);
    return code;
}

int hp_rpc_watch(hp_rpc_client *c, const Hp__V1__WatchJobRequest *req, hp_rpc_event_fn fn,
                 void *ctx, hp_rpc_result *res) {
    grpc_call *call =
        new_call(c, "/hp.v1.Coordinator/WatchJob", gpr_inf_future(GPR_CLOCK_REALTIME));
    if (!call) {
        set_res(res, GRPC_STATUS_INTERNAL, "cannot create the call");
        return res->code;
    }
    size_t n = protobuf_c_message_get_packed_size(&req->base);
    uint8_t *buf = hp_malloc(n ? n : 1);
    if (!buf) {
        grpc_call_unref(call);
        set_res(res, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return res->code;
    }
    protobuf_c_message_pack(&req->base, buf);
    grpc_byte_buffer *send = bb_from(buf, n);
    hp_free(buf);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code st = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op a[4], b[1];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    grpc_metadata md; /* the token when known: hpd --auth all asks it of WatchJob too */
    memset(&md, 0, sizeof md);
    a[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->auth) {
        md.key = grpc_slice_from_static_string("authorization");
        md.value = grpc_slice_from_copied_string(c->auth);
        a[0].data.send_initial_metadata.count = 1;
        a[0].data.send_initial_metadata.metadata = &md;
    }
    a[1].op = GRPC_OP_SEND_MESSAGE;
    a[1].data.send_message.send_message = send;
    a[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    a[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    a[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    b[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    b[0].data.recv_status_on_client.status = &st;
    b[0].data.recv_status_on_client.status_details = &details;
    b[0].data.recv_status_on_client.trailing_metadata = &trail_md;
    b[0].data.recv_status_on_client.error_string = &error_string;
    int tag_a, tag_b, tag_m;
    bool stopped = false;
    arena ar = {{arena_alloc, arena_free_one, &ar}, NULL, NULL};
    bool a_ok = grpc_call_start_batch(call, a, 4, &tag_a, NULL) == GRPC_CALL_OK;
    if (!a_ok || grpc_call_start_batch(call, b, 1, &tag_b, NULL) != GRPC_CALL_OK) {
        /* Nothing was started, or only batch A: cancel and collect what is outstanding. */
        grpc_call_cancel(call, NULL);
        if (a_ok) pluck(c, &tag_a);
        if (c->auth) grpc_slice_unref(md.value);
        grpc_call_unref(call);
        grpc_byte_buffer_destroy(send);
        grpc_metadata_array_destroy(&init_md);
        grpc_metadata_array_destroy(&trail_md);
        set_res(res, GRPC_STATUS_INTERNAL, "cannot start the call");
        return res->code;
    }
    pluck(c, &tag_a);
    if (c->auth) grpc_slice_unref(md.value); /* batch A is done with it */
    for (;;) {
        grpc_byte_buffer *recv = NULL;
        grpc_op m;
        memset(&m, 0, sizeof m);
        m.op = GRPC_OP_RECV_MESSAGE;
        m.data.recv_message.recv_message = &recv;
        if (grpc_call_start_batch(call, &m, 1, &tag_m, NULL) != GRPC_CALL_OK) {
            grpc_call_cancel(call, NULL);
            break;
        }
        bool ok = pluck(c, &tag_m);
        if (!ok || !recv) {
            if (recv) grpc_byte_buffer_destroy(recv);
            break;
        }
        arena_reset(&ar);
        Hp__V1__JobEvent *ev =
            (Hp__V1__JobEvent *)unpack_bb(recv, &hp__v1__job_event__descriptor, &ar.pa);
        grpc_byte_buffer_destroy(recv);
        if (!ev) {
            grpc_call_cancel_with_status(call, GRPC_STATUS_INTERNAL, "bad event", NULL);
            break;
        }
        int stop = 0;
        bool bad = false;
        if (ev->event_case == HP__V1__JOB_EVENT__EVENT_BATCH) {
            size_t k = ev->batch ? ev->batch->n_events : 0;
            for (size_t i = 0; i < k && !stop && !bad; i++) {
                const Hp__V1__JobEvent *e = ev->batch->events[i];
                if (e->event_case == HP__V1__JOB_EVENT__EVENT_BATCH)
                    bad = true; /* batches do not nest */
                else
                    stop = fn(ctx, e);
            }
        } else {
            stop = fn(ctx, ev);
        }
        if (bad) {
            grpc_call_cancel_with_status(call, GRPC_STATUS_INTERNAL, "nested event batch", NULL);
            break;
        }
        if (stop) {
            stopped = true;
            grpc_call_cancel(call, NULL);
            break;
        }
    }
    pluck(c, &tag_b);
    if (stopped)
        set_res(res, GRPC_STATUS_OK, "");
    else
        take_status(res, st, &details, error_string);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    if (error_string) gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    arena_fini(&ar);
    return res->code;
}
