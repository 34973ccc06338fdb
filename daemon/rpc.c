/* daemon/rpc.c — hp.v1.Coordinator on the gRPC C core (see ../shared/notes/grpc-c-core.md).
 *
 * Threads: one completion-queue thread runs grpc_completion_queue_next() and appends every
 * event's tag to a mutex-protected list, then uv_async_send()s the loop. The loop thread
 * drains the list and runs each tag's handler; every gRPC batch, every re-arm and every hpd_*
 * call happens there. Nothing here blocks the loop: a request over HPD_RPC_DECODE_INLINE is
 * decoded on libuv's pool before its handler runs (rpc_decode.c).
 *
 * Calls: each registered method keeps HPD_RPC_SLOTS request slots armed
 * (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER: the request arrives with the call); one generic
 * slot answers UNIMPLEMENTED. A call context owns up to three tags (new, close, send) and is
 * freed when all its outstanding tags have come back (pending == 0). Every call gets a
 * RECV_CLOSE_ON_SERVER batch, whose `cancelled` stops a watch. WatchJob's streaming (queues,
 * backpressure, batches) is in rpc_watch.c. SubmitJob answers from hpd_submit_async's callback
 * (the compile check runs off the loop).
 *
 * Status codes: core errors map through hp__rpc_code_of (HP_NOT_FOUND -> NOT_FOUND, HP_INVALID ->
 * INVALID_ARGUMENT, ...), except CheckpointJob's HP_INVALID ("the job is not running"), which
 * is FAILED_PRECONDITION: the request is well-formed, the job's state forbids it.
 *
 * Shutdown (hpd_rpc_stop): stop re-arming, grpc_server_shutdown_and_notify, a grace timer that
 * cancels all calls; on the shutdown tag: grpc_server_destroy + grpc_completion_queue_shutdown;
 * when the CQ thread sees GRPC_QUEUE_SHUTDOWN the loop joins it, destroys the CQ, closes its
 * handles and calls grpc_shutdown.
 */
#include "daemon/rpc.h"
#include "daemon/rpc_internal.h"

#include "daemon/core.h" /* hp__log */

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *path;
    bool mutating;                         /* or costly (GetPlan compiles): needs the token */
    const ProtobufCMessageDescriptor *req; /* a large one is decoded off the loop */
} k_methods[M_COUNT] = {
    [M_SUBMIT] = {"/hp.v1.Coordinator/SubmitJob", true, &hp__v1__submit_job_request__descriptor},
    [M_GET] = {"/hp.v1.Coordinator/GetJob", false, &hp__v1__get_job_request__descriptor},
    [M_LIST] = {"/hp.v1.Coordinator/ListJobs", false, &hp__v1__list_jobs_request__descriptor},
    [M_CANCEL] = {"/hp.v1.Coordinator/CancelJob", true, &hp__v1__cancel_job_request__descriptor},
    [M_WATCH] = {"/hp.v1.Coordinator/WatchJob", false, &hp__v1__watch_job_request__descriptor},
    /* compiles: the token's to ask */
    [M_PLAN] = {"/hp.v1.Coordinator/GetPlan", true, &hp__v1__get_plan_request__descriptor},
    [M_TRACE] = {"/hp.v1.Coordinator/GetTrace", false, &hp__v1__get_trace_request__descriptor},
    [M_CHECKPOINT] = {"/hp.v1.Coordinator/CheckpointJob", true,
                      &hp__v1__checkpoint_job_request__descriptor},
};

static rpc_server *g_rpc; /* one server per process */

/* Debian's gRPC is not built with ThreadSanitizer, so TSan cannot see that a tag handed to
 * gRPC (request_call, start_batch, shutdown_and_notify) on the loop thread happens before the
 * CQ thread gets it back from grpc_completion_queue_next. These two say so (no-ops in other
 * builds), so that TSan still checks everything else the two threads share. */
#if defined(__SANITIZE_THREAD__) /* gcc */
#define HP_RPC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) /* clang */
#define HP_RPC_TSAN 1
#endif
#endif
#ifdef HP_RPC_TSAN
#include <sanitizer/tsan_interface.h>
#define tag_release(t) __tsan_release(t)
#define tag_acquire(t) __tsan_acquire(t)
#else
#define tag_release(t) ((void)(t))
#define tag_acquire(t) ((void)(t))
#endif

/* ---- the CQ thread ----------------------------------------------------------------------- */

static void cq_thread(void *arg) {
    rpc_server *s = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        rpc_tag *t = ev.tag;
        tag_acquire(t);
        t->ok = ev.success;
        t->next = NULL;
        uv_mutex_lock(&s->mu);
        bool was_empty = !s->head;
        if (s->tail)
            s->tail->next = t;
        else
            s->head = t;
        s->tail = t;
        uv_mutex_unlock(&s->mu);
        /* A non-empty list has a wakeup pending already: the loop takes the whole list. */
        if (was_empty) uv_async_send(&s->async);
    }
    uv_mutex_lock(&s->mu);
    s->cq_done = true;
    uv_mutex_unlock(&s->mu);
    uv_async_send(&s->async);
}

/* Drops one of s's handle counts (uv handles, decodes in flight); the last frees s. */
void hp__rpc_server_unref(rpc_server *s) {
    if (--s->handles > 0) return;
    if (g_rpc == s) g_rpc = NULL;
    free(s);
    hp__rpc_enc_reset();
    grpc_shutdown();
}

static void on_handle_closed(uv_handle_t *h) {
    hp__rpc_server_unref(h->data);
}

static void on_async(uv_async_t *h) {
    rpc_server *s = h->data;
    for (;;) {
        uv_mutex_lock(&s->mu);
        rpc_tag *t = s->head;
        s->head = s->tail = NULL;
        bool done = s->cq_done;
        uv_mutex_unlock(&s->mu);
        if (!t) {
            if (done && !s->closing) {
                s->closing = true;
                uv_thread_join(&s->thread);
                grpc_completion_queue_destroy(s->cq);
                s->cq = NULL;
                uv_mutex_destroy(&s->mu);
                uv_close((uv_handle_t *)&s->flush, on_handle_closed);
                uv_close((uv_handle_t *)&s->async, on_handle_closed);
            }
            return;
        }
        while (t) {
            rpc_tag *next = t->next;
            t->fn(t, t->ok); /* may free t */
            t = next;
        }
    }
}

/* ---- call contexts ----------------------------------------------------------------------- */

static void on_new(rpc_tag *t, int ok);
static void on_close(rpc_tag *t, int ok);
static void on_send(rpc_tag *t, int ok);

static void call_free(rpc_call *c) {
    hp__rpc_wq_remove(c);
    hpd_submit_cancel(c->submit); /* its answer has no one to go to */
    hpd_plan_cancel(c->plan);
    if (c->watching && c->watch) hpd_watch_stop(c->watch);
    hp__rpc_q_clear(c);
    hp_free(c->q);
    if (c->call) grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    if (c->dec && c->dec->msg) protobuf_c_message_free_unpacked(c->dec->msg, NULL);
    hp_free(c->dec);
    if (c->method == M_GENERIC) grpc_call_details_destroy(&c->details);
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    if (c->has_details) grpc_slice_unref(c->status_details);
    c->s->live_calls--;
    hp_free(c);
}

void hp__rpc_call_maybe_free(rpc_call *c) {
    if (c->pending == 0) call_free(c);
}

/* Arms one request slot for method m (M_GENERIC: the unknown-method slot). */
static void arm(rpc_server *s, int m) {
    if (s->shutting_down) return;
    rpc_call *c = hp_calloc(1, sizeof *c);
    if (!c) {
        hp__log("error", "event=rpc_error what=\"out of memory arming a request slot\"");
        return;
    }
    c->s = s;
    c->method = m;
    c->t_new.fn = on_new;
    c->t_close.fn = on_close;
    c->t_send.fn = on_send;
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    tag_release(&c->t_new);
    if (m == M_GENERIC) {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->t_new);
    } else {
        e = grpc_server_request_registered_call(s->server, s->methods[m], &c->call, &c->deadline,
                                                &c->md, &c->payload, s->cq, s->cq, &c->t_new);
    }
    s->live_calls++;
    if (e != GRPC_CALL_OK) {
        hp__log("error", "event=rpc_error what=request_call code=%d", (int)e);
        call_free(c);
        return;
    }
    c->pending = 1;
}

/* Starts a send batch: [initial metadata] [message] [status]. Takes bb; msg may be NULL. */
void hp__rpc_send_batch(rpc_call *c, grpc_byte_buffer *bb, bool with_status, grpc_status_code code,
                        const char *msg) {
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    if (bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
    }
    if (with_status) {
        if (msg && *msg) {
            c->status_details = grpc_slice_from_copied_string(msg);
            c->has_details = true;
        }
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = code;
        ops[n].data.send_status_from_server.status_details =
            c->has_details ? &c->status_details : NULL;
        ops[n].data.send_status_from_server.trailing_metadata_count = 0;
        n++;
    }
    c->send_bb = bb;
    tag_release(&c->t_send);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
    if (e != GRPC_CALL_OK) {
        hp__log("error", "event=rpc_error what=start_batch_send code=%d", (int)e);
        if (bb) grpc_byte_buffer_destroy(bb);
        c->send_bb = NULL;
        if (c->has_details) grpc_slice_unref(c->status_details);
        c->has_details = false;
        grpc_call_cancel(c->call, NULL);
        return;
    }
    c->md_sent = true;
    if (with_status) c->status_sent = true;
    c->send_busy = true;
    c->pending++;
}

void hp__rpc_reply_status(rpc_call *c, grpc_status_code code, const char *msg) {
    hp__rpc_send_batch(c, NULL, true, code, msg);
}

/* Packs m into a byte buffer (pack before building the buffer; see the notes, section 5). */
static grpc_byte_buffer *bb_from_msg(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

static void reply_msg(rpc_call *c, const ProtobufCMessage *m) {
    hp__rpc_send_batch(c, bb_from_msg(m), true, GRPC_STATUS_OK, NULL);
}

grpc_status_code hp__rpc_code_of(hp_status st) {
    switch (st) {
#define X(code, text, grpc, http, exit)                                                            \
    case HP_##code:                                                                                \
        return GRPC_STATUS_##grpc;
#include "hp/status.def"
#undef X
    }
    return GRPC_STATUS_INTERNAL;
}

/* Replies with the status a core call returned (authoritative: err may be unset) and its
 * message. */
static void reply_err(rpc_call *c, hp_status st, const hp_err *err) {
    hp__rpc_reply_status(c, hp__rpc_code_of(st), err->msg[0] ? err->msg : hp_status_str(st));
}

/* Exactly one `authorization: Bearer <token>` header, compared in constant time. */
static bool authorized(rpc_call *c) {
    const char *tok = hpd_token(c->s->d);
    if (!tok || !*tok) return false;
    const grpc_slice *val = NULL;
    int seen = 0;
    for (size_t i = 0; i < c->md.count; i++) {
        if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
            val = &c->md.metadata[i].value;
            seen++;
        }
    }
    if (seen != 1) return false;
    static const char prefix[] = "Bearer ";
    size_t plen = sizeof prefix - 1, tlen = strlen(tok);
    size_t vlen = GRPC_SLICE_LENGTH(*val);
    const uint8_t *v = GRPC_SLICE_START_PTR(*val);
    size_t want = plen + tlen;
    unsigned diff = vlen != want;
    for (size_t i = 0; i < want; i++) {
        uint8_t e = i < plen ? (uint8_t)prefix[i] : (uint8_t)tok[i - plen];
        uint8_t g = i < vlen ? v[i] : 0;
        diff |= (unsigned)(e ^ g);
    }
    return diff == 0;
}

/* ---- JobInfo ------------------------------------------------------------------------------ */

typedef struct {
    Hp__V1__JobInfo info;
    Hp__V1__StepMetrics metrics;
} job_info_buf;

static void job_info(job_info_buf *b, const hpd_job_view *v) {
    Hp__V1__JobInfo init = HP__V1__JOB_INFO__INIT;
    Hp__V1__StepMetrics minit = HP__V1__STEP_METRICS__INIT;
    b->info = init;
    b->metrics = minit;
    b->info.id = (char *)v->id; /* borrowed for the reply */
    b->info.name = (char *)v->name;
    b->info.state = v->state;
    b->info.created_unix_s = v->created_unix_s;
    b->info.updated_unix_s = v->updated_unix_s;
    b->info.world_size = v->world_size;
    b->info.step = v->step;
    b->info.total_steps = v->total_steps;
    b->info.restarts = v->restarts;
    b->info.error = (char *)v->error;
    b->info.launcher = (char *)v->launcher;
    b->info.launch_ref = (char *)v->launch_ref;
    b->info.launch_state = (char *)v->launch_state;
    if (v->has_metrics) {
        b->metrics.step = v->step;
        b->metrics.rank = -1;
        b->metrics.loss = v->loss;
        b->metrics.tokens_per_s = v->tokens_per_s;
        b->metrics.mfu_pct = v->mfu_pct;
        b->metrics.step_time_s = v->step_time_s;
        b->info.last_metrics = &b->metrics;
    }
}

/* Answers with resp, a response whose field `job` (*slot) is the job v. */
static void reply_job(rpc_call *c, ProtobufCMessage *resp, Hp__V1__JobInfo **slot,
                      const hpd_job_view *v) {
    job_info_buf b;
    job_info(&b, v);
    *slot = &b.info;
    reply_msg(c, resp);
}

/* ---- handlers (loop thread) --------------------------------------------------------------- */

static void on_submitted(void *ctx, hp_status st, const hpd_job_view *v, const hp_err *err) {
    rpc_call *c = ctx;
    c->submit = NULL;
    if (st != HP_OK) {
        reply_err(c, st, err);
        return;
    }
    Hp__V1__SubmitJobResponse resp = HP__V1__SUBMIT_JOB_RESPONSE__INIT;
    reply_job(c, &resp.base, &resp.job, v);
}

static void h_submit(rpc_call *c) {
    Hp__V1__SubmitJobRequest *req =
        (Hp__V1__SubmitJobRequest *)hp__rpc_unpack_req(c, &hp__v1__submit_job_request__descriptor);
    if (!req) return; /* answered */
    if (!req->job) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_INVALID_ARGUMENT, "job: missing");
        return;
    }
    size_t n = protobuf_c_message_get_packed_size(&req->job->base);
    uint8_t *buf = hp_malloc(n ? n : 1);
    if (!buf) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(&req->job->base, buf);
    hp_err err = {0};
    /* The compile check runs off the loop; on_submitted answers (maybe before this returns). */
    hpd_submit_req *sr = NULL;
    hp_status st = hpd_submit_async(c->s->d, buf, n, req->request_id, on_submitted, c, &sr, &err);
    hp_free(buf);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        reply_err(c, st, &err);
        return;
    }
    c->submit = sr;
}

static void h_get(rpc_call *c) {
    Hp__V1__GetJobRequest *req =
        (Hp__V1__GetJobRequest *)hp__rpc_unpack_req(c, &hp__v1__get_job_request__descriptor);
    if (!req) return; /* answered */
    hpd_job_view v;
    hp_err err = {0};
    if (req->worker_commands && !authorized(c)) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__log("warn", "event=rpc_unauthenticated method=GetJob(worker_commands)");
        hp__rpc_reply_status(c, GRPC_STATUS_UNAUTHENTICATED,
                             "worker_commands carry the worker token: missing or wrong bearer "
                             "token (authorization: Bearer <STATE_DIR/token>)");
        return;
    }
    hp_status st = hpd_get(c->s->d, req->job_id, &v, &err);
    char **cmds = NULL;
    int n_cmds = 0;
    if (st == HP_OK && req->worker_commands)
        st = hpd_worker_commands(c->s->d, req->job_id, &cmds, &n_cmds, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        reply_err(c, st, &err);
        return;
    }
    Hp__V1__GetJobResponse resp = HP__V1__GET_JOB_RESPONSE__INIT;
    resp.worker_commands = cmds;
    resp.n_worker_commands = (size_t)n_cmds;
    reply_job(c, &resp.base, &resp.job, &v);
    for (int i = 0; i < n_cmds; i++) hp_free(cmds[i]);
    hp_free(cmds);
}

static void h_list(rpc_call *c) {
    Hp__V1__ListJobsRequest *req =
        (Hp__V1__ListJobsRequest *)hp__rpc_unpack_req(c, &hp__v1__list_jobs_request__descriptor);
    if (!req) return; /* answered */
    if (req->page_size < 0) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_INVALID_ARGUMENT, "page_size: must be >= 0");
        return;
    }
    hpd_job_view *views = NULL;
    int n = 0;
    char next[HPD_ID_MAX] = "";
    hp_err err = {0};
    hp_status st = hpd_list(c->s->d, req->states, (int)req->n_states, req->page_size,
                            req->page_token, &views, &n, next, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        hp_free(views);
        reply_err(c, st, &err);
        return;
    }
    job_info_buf *bufs = hp_calloc(n > 0 ? (size_t)n : 1, sizeof *bufs);
    Hp__V1__JobInfo **ptrs = hp_calloc(n > 0 ? (size_t)n : 1, sizeof *ptrs);
    if (!bufs || !ptrs) {
        hp_free(bufs);
        hp_free(ptrs);
        hp_free(views);
        hp__rpc_reply_status(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        job_info(&bufs[i], &views[i]);
        ptrs[i] = &bufs[i].info;
    }
    Hp__V1__ListJobsResponse resp = HP__V1__LIST_JOBS_RESPONSE__INIT;
    resp.n_jobs = (size_t)n;
    resp.jobs = ptrs;
    resp.next_page_token = next;
    reply_msg(c, &resp.base);
    hp_free(bufs);
    hp_free(ptrs);
    hp_free(views);
}

static void h_cancel(rpc_call *c) {
    Hp__V1__CancelJobRequest *req =
        (Hp__V1__CancelJobRequest *)hp__rpc_unpack_req(c, &hp__v1__cancel_job_request__descriptor);
    if (!req) return; /* answered */
    hpd_job_view v;
    hp_err err = {0};
    hp_status st = hpd_cancel(c->s->d, req->job_id, req->reason, &v, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        reply_err(c, st, &err);
        return;
    }
    Hp__V1__CancelJobResponse resp = HP__V1__CANCEL_JOB_RESPONSE__INIT;
    reply_job(c, &resp.base, &resp.job, &v);
}

static void on_planned(void *ctx, hp_status st, const uint8_t *plan, size_t plan_len,
                       const hp_err *err) {
    rpc_call *c = ctx;
    c->plan = NULL;
    if (st != HP_OK) {
        reply_err(c, st, err);
        return;
    }
    /* GetPlanResponse { PlanSummary plan = 1; }: wrap the packed summary by hand. */
    uint8_t hdr[11];
    size_t h = 0;
    hdr[h++] = 0x0a; /* field 1, length-delimited */
    uint64_t l = plan_len;
    do {
        uint8_t byte = l & 0x7f;
        l >>= 7;
        hdr[h++] = byte | (l ? 0x80 : 0);
    } while (l);
    grpc_slice sl = grpc_slice_malloc(h + plan_len);
    memcpy(GRPC_SLICE_START_PTR(sl), hdr, h);
    if (plan_len) memcpy(GRPC_SLICE_START_PTR(sl) + h, plan, plan_len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    hp__rpc_send_batch(c, bb, true, GRPC_STATUS_OK, NULL);
}

static void h_plan(rpc_call *c) {
    Hp__V1__GetPlanRequest *req =
        (Hp__V1__GetPlanRequest *)hp__rpc_unpack_req(c, &hp__v1__get_plan_request__descriptor);
    if (!req) return; /* answered */
    const char *id = NULL;
    uint8_t *job = NULL;
    size_t job_len = 0;
    if (req->source_case == HP__V1__GET_PLAN_REQUEST__SOURCE_JOB_ID) {
        id = req->job_id;
    } else if (req->source_case == HP__V1__GET_PLAN_REQUEST__SOURCE_JOB) {
        job_len = protobuf_c_message_get_packed_size(&req->job->base);
        job = hp_malloc(job_len ? job_len : 1);
        if (job) protobuf_c_message_pack(&req->job->base, job);
    } else {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_INVALID_ARGUMENT, "source: set job_id or job");
        return;
    }
    if (!id && !job) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    hp_err err = {0};
    /* The compile runs on the pool; on_planned answers (never before this returns). */
    hpd_plan_req *pr = NULL;
    hp_status st =
        hpd_plan_async(c->s->d, id, job, job_len, req->world_size, on_planned, c, &pr, &err);
    hp_free(job);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        reply_err(c, st, &err);
        return;
    }
    c->plan = pr;
}

static void h_trace(rpc_call *c) {
    Hp__V1__GetTraceRequest *req =
        (Hp__V1__GetTraceRequest *)hp__rpc_unpack_req(c, &hp__v1__get_trace_request__descriptor);
    if (!req) return; /* answered */
    const char *bad = !*req->job_id   ? "job_id: missing"
                      : req->step < 0 ? "step: must be >= 0"
                                      : NULL;
    for (size_t i = 0; !bad && i < req->n_ranks; i++)
        if (req->ranks[i] < 0) bad = "ranks: must be >= 0";
    if (bad) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_INVALID_ARGUMENT, bad);
        return;
    }
    char *json = NULL;
    size_t len = 0;
    int64_t *steps = NULL;
    int n_steps = 0;
    hp_err err = {0};
    hp_status st = hpd_trace(c->s->d, req->job_id, req->step, req->ranks, (int)req->n_ranks, &json,
                             &len, &steps, &n_steps, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) {
        hp_free(json);
        hp_free(steps);
        reply_err(c, st, &err);
        return;
    }
    Hp__V1__GetTraceResponse resp = HP__V1__GET_TRACE_RESPONSE__INIT;
    resp.chrome_json.data = (uint8_t *)json;
    resp.chrome_json.len = json ? len : 0;
    resp.steps = steps;
    resp.n_steps = steps && n_steps > 0 ? (size_t)n_steps : 0;
    reply_msg(c, &resp.base);
    hp_free(json);
    hp_free(steps);
}

static void h_checkpoint(rpc_call *c) {
    Hp__V1__CheckpointJobRequest *req = (Hp__V1__CheckpointJobRequest *)hp__rpc_unpack_req(
        c, &hp__v1__checkpoint_job_request__descriptor);
    if (!req) return; /* answered */
    if (!*req->job_id) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        hp__rpc_reply_status(c, GRPC_STATUS_INVALID_ARGUMENT, "job_id: missing");
        return;
    }
    hpd_job_view v;
    hp_err err = {0};
    hp_status st = hpd_checkpoint(c->s->d, req->job_id, &v, &err);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    if (st != HP_OK) { /* HP_STATE, the job is not running: FAILED_PRECONDITION */
        reply_err(c, st, &err);
        return;
    }
    Hp__V1__CheckpointJobResponse resp = HP__V1__CHECKPOINT_JOB_RESPONSE__INIT;
    reply_job(c, &resp.base, &resp.job, &v);
}

static void run_handler(rpc_call *c);

static void dispatch(rpc_call *c) {
    if (c->method == M_GENERIC) {
        char *m = grpc_slice_to_c_string(c->details.method);
        char msg[300];
        snprintf(msg, sizeof msg, "unknown method %s", m);
        gpr_free(m);
        hp__rpc_reply_status(c, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }
    if ((k_methods[c->method].mutating || c->s->d->auth_all) && !authorized(c)) {
        char *peer = grpc_call_get_peer(c->call);
        hp__log("warn", "event=rpc_unauthenticated method=%s peer=%s",
                k_methods[c->method].path + strlen("/hp.v1.Coordinator/"), peer ? peer : "?");
        gpr_free(peer);
        hp__rpc_reply_status(
            c, GRPC_STATUS_UNAUTHENTICATED,
            "missing or wrong bearer token (authorization: Bearer <STATE_DIR/token>)");
        return;
    }
    /* A large request is decoded on the pool first; run_handler follows (rpc_decode.c). */
    if (!hp__rpc_decode_async(c, k_methods[c->method].req, run_handler)) run_handler(c);
}

static void run_handler(rpc_call *c) {
    switch (c->method) {
    case M_SUBMIT:
        h_submit(c);
        break;
    case M_GET:
        h_get(c);
        break;
    case M_LIST:
        h_list(c);
        break;
    case M_CANCEL:
        h_cancel(c);
        break;
    case M_WATCH:
        hp__rpc_h_watch(c);
        break;
    case M_PLAN:
        h_plan(c);
        break;
    case M_TRACE:
        h_trace(c);
        break;
    case M_CHECKPOINT:
        h_checkpoint(c);
        break;
    default:
        hp__rpc_reply_status(c, GRPC_STATUS_INTERNAL, "no handler");
        break;
    }
}

static void on_new(rpc_tag *t, int ok) {
    rpc_call *c = CONTAINER_OF(t, rpc_call, t_new);
    c->pending--;
    if (!ok) { /* slot cancelled: the server is shutting down */
        call_free(c);
        return;
    }
    arm(c->s, c->method);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    tag_release(&c->t_close);
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
        hp__log("error", "event=rpc_error what=start_batch_close");
        grpc_call_cancel(c->call, NULL);
        c->closed = true;
        hp__rpc_call_maybe_free(c);
        return;
    }
    c->pending++;
    dispatch(c);
}

static void on_close(rpc_tag *t, int ok) {
    rpc_call *c = CONTAINER_OF(t, rpc_call, t_close);
    c->pending--;
    c->closed = true;
    if (c->watching && c->watch) hpd_watch_stop(c->watch); /* client gone: drop the watch */
    c->watching = false;
    c->watch = NULL;
    hp__rpc_call_maybe_free(c);
}

static void on_send(rpc_tag *t, int ok) {
    rpc_call *c = CONTAINER_OF(t, rpc_call, t_send);
    c->pending--;
    c->send_busy = false;
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    if (c->has_details) grpc_slice_unref(c->status_details);
    c->has_details = false;
    if (!ok) { /* the stream broke: stop watching; the close tag ends the call */
        if (c->watching && c->watch) hpd_watch_stop(c->watch);
        c->watching = false;
        c->watch = NULL;
        c->closed = true;
    } else if (c->method == M_WATCH) {
        hp__rpc_watch_pump(c);
    }
    hp__rpc_call_maybe_free(c);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void on_shutdown(rpc_tag *t, int ok) {
    rpc_server *s = CONTAINER_OF(t, rpc_server, t_shutdown);
    if (s->grace_started) {
        uv_timer_stop(&s->grace);
        uv_close((uv_handle_t *)&s->grace, on_handle_closed);
        s->grace_started = false;
    }
    grpc_server_destroy(s->server);
    s->server = NULL;
    s->server_destroyed = true;
    grpc_completion_queue_shutdown(s->cq);
}

static void on_grace(uv_timer_t *tm) {
    rpc_server *s = tm->data;
    if (s->server) grpc_server_cancel_all_calls(s->server);
}

static hp_status read_pem(const char *path, char **out, hp_err *err) {
    uint8_t *data = NULL;
    size_t len = 0;
    hp_status st = hp_file_read(path, HPD_RPC_TLS_MAX, &data, &len, err);
    if (st != HP_OK) return st;
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

/* gRPC's own log lines, into the daemon's key=value log (they are about peers and transports:
 * gRPC's errors are our warnings). */
static void rpc_gpr_log(gpr_log_func_args *a) {
    char msg[512];
    size_t n = 0;
    for (const char *p = a->message; p && *p && n < sizeof msg - 1; p++)
        msg[n++] = *p == '"' ? '\'' : (*p == '\n' || *p == '\r') ? ' ' : *p;
    msg[n] = 0;
    const char *lvl = a->severity == GPR_LOG_SEVERITY_ERROR  ? "warn"
                      : a->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                             : "debug";
    const char *file = a->file ? strrchr(a->file, '/') : NULL;
    hp__log(lvl, "event=grpc src=%s:%d msg=\"%s\"",
            file      ? file + 1
            : a->file ? a->file
                      : "?",
            a->line, msg);
}

/* Startup failure after grpc_server_create: shut the unstarted server down synchronously. */
static void abort_server(grpc_server *server, grpc_completion_queue *cq) {
    rpc_tag t = {0};
    tag_release(&t);
    grpc_server_shutdown_and_notify(server, cq, &t);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN || ev.tag == &t) break;
    }
    grpc_server_destroy(server);
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
    grpc_completion_queue_destroy(cq);
}

hp_status hpd_rpc_start(hpd *d, const char *listen, const char *tls_cert, const char *tls_key,
                        int *port, hp_err *err) {
    if (g_rpc) return hp_errf(err, HP_INVALID, "rpc: a server is already running");
    if (!listen || !*listen) return hp_errf(err, HP_INVALID, "--listen: empty address");
    if ((tls_cert && *tls_cert) != (tls_key && *tls_key))
        return hp_errf(err, HP_INVALID, "--tls-cert and --tls-key go together");
    bool tls = tls_cert && *tls_cert;
    char *cert = NULL, *key = NULL;
    if (tls) {
        if (read_pem(tls_cert, &cert, err) != HP_OK) return hp_err_prefix(err, "--tls-cert");
        if (read_pem(tls_key, &key, err) != HP_OK) {
            hp_free(cert);
            return hp_err_prefix(err, "--tls-key");
        }
    }
    signal(SIGPIPE, SIG_IGN);
    gpr_set_log_function(rpc_gpr_log);
    rpc_server *s = calloc(1, sizeof *s);
    if (!s) {
        hp_free(cert);
        hp_free(key);
        return hp_errf(err, HP_NOMEM, "rpc: out of memory");
    }
    s->d = d;
    grpc_init();

    grpc_arg args[2] = {
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
        {GRPC_ARG_INTEGER,
         (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         {.integer = HPD_RPC_MAX_RECV}},
    };
    grpc_channel_args ca = {2, args};
    s->server = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    for (int m = 0; m < M_COUNT; m++)
        s->methods[m] = grpc_server_register_method(s->server, k_methods[m].path, NULL,
                                                    GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);

    grpc_server_credentials *cr;
    if (tls) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        cr = grpc_ssl_server_credentials_create_ex(NULL, &pair, 1,
                                                   GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    } else {
        cr = grpc_insecure_server_credentials_create();
    }
    hp_free(cert);
    hp_free(key);
    int p = cr ? grpc_server_add_http2_port(s->server, listen, cr) : 0;
    if (cr) grpc_server_credentials_release(cr);
    if (p == 0) {
        abort_server(s->server, s->cq);
        free(s);
        grpc_shutdown();
        return hp_errf(err, HP_IO, "cannot bind %s%s", listen,
                       tls ? " (address in use or invalid, or a bad TLS certificate/key)"
                           : " (address in use or invalid)");
    }
    grpc_server_start(s->server);

    uv_loop_t *loop = hpd_loop(d);
    uv_mutex_init(&s->mu);
    uv_async_init(loop, &s->async, on_async);
    s->async.data = s;
    uv_timer_init(loop, &s->flush);
    s->flush.data = s;
    s->handles = 2;
    s->t_shutdown.fn = on_shutdown;
    g_rpc = s;
    for (int m = 0; m < M_COUNT; m++)
        for (int i = 0; i < HPD_RPC_SLOTS; i++) arm(s, m);
    arm(s, M_GENERIC);
    if (uv_thread_create(&s->thread, cq_thread, s) != 0) {
        /* No thread: run the shutdown by hand. */
        s->shutting_down = true;
        tag_release(&s->t_shutdown);
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
        grpc_server_cancel_all_calls(s->server);
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
            rpc_tag *t = ev.tag;
            t->fn(t, ev.success); /* on_shutdown destroys the server and shuts the CQ down */
        }
        grpc_completion_queue_destroy(s->cq);
        uv_mutex_destroy(&s->mu);
        s->closing = true;
        uv_close((uv_handle_t *)&s->flush, on_handle_closed);
        uv_close((uv_handle_t *)&s->async, on_handle_closed);
        return hp_errf(err, HP_INTERNAL, "rpc: cannot start the completion-queue thread");
    }
    if (port) *port = p;
    return HP_OK;
}

void hpd_rpc_stop(hpd *d) {
    rpc_server *s = g_rpc;
    if (!s || s->shutting_down) return;
    s->shutting_down = true;
    tag_release(&s->t_shutdown);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    uv_timer_init(hpd_loop(d), &s->grace);
    s->grace.data = s;
    s->handles++;
    s->grace_started = true;
    uv_timer_start(&s->grace, on_grace, HPD_RPC_GRACE_MS, 0);
}
