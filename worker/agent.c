/* worker/agent.c — coordinator mode of hp-worker (worker/agent.h): the worker protocol over a
 * blocking TCP socket, an I/O thread for heartbeats and incoming Stop frames, and hp_train
 * with the program the coordinator compiled.
 *
 * Blocking sockets, not libuv: the worker has one connection and a training loop that owns
 * its thread; a second thread blocked in poll() is the simplest way to keep heartbeats on
 * time while a step computes. The socket's write side is shared (heartbeats from the I/O
 * thread, metrics and Done from the training thread) under one mutex; a send timeout keeps a
 * wedged coordinator from freezing training for ever (it counts as a lost connection).
 */
#include "worker/agent.h"

#include "hp/checkpoint.h"
#include "hp/comm.h"
#include "hp/frame.h"
#include "hp/job.h"
#include "hp/metrics.h"
#include "hp/program.h"
#include "worker/comm/sha256.h"
#include "worker/train.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define SEND_TIMEOUT_S       10
#define HEARTBEAT_DEFAULT_MS 1000
#define MAX_WORLD            65536

typedef struct agent {
    const hp_agent_opts *o;
    int fd;
    int wake[2]; /* the training thread writes here to end the I/O thread */
    pthread_mutex_t send_mu;
    uint64_t seq; /* under send_mu */
    hp_frame_reader rd;
    int heartbeat_ms;
    _Atomic int64_t step;         /* the last step rank 0 reported (heartbeats carry it) */
    atomic_bool lost, stop_frame; /* set once each, under why_mu with their reason */
    pthread_mutex_t why_mu;
    char lost_why[HP_ERR_MSG_MAX], stop_why[HP_ERR_MSG_MAX];
    volatile sig_atomic_t own_stop;
    volatile sig_atomic_t *stop;
    volatile sig_atomic_t ckpt_now; /* CheckpointNow frames seen (hp_train checkpoints on growth) */
    /* comm tcp: rank 0's address from the coordinator's CommSetup relay (under why_mu; the
     * I/O thread sets it and signals comm_cv) */
    pthread_cond_t comm_cv;
    char tcp_addr[256];
} agent;

static double now_unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- connection ------------------------------------------------------------------------------ */

/* Splits "HOST:PORT" / "[V6]:PORT" into caller buffers. */
static hp_status split_addr(const char *s, char *host, size_t hlen, char *port, size_t plen,
                            hp_err *err) {
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || !colon[1] || strlen(colon + 1) >= plen)
        return hp_errf(err, HP_INVALID, "coordinator '%s': expected HOST:PORT", s);
    const char *h = s;
    size_t n = (size_t)(colon - s);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') h++, n -= 2;
    if (n == 0 || n >= hlen) return hp_errf(err, HP_INVALID, "coordinator '%s': bad host", s);
    /* getaddrinfo takes "99999" and connects to 99999 mod 65536: refuse it here */
    const char *pt = colon + 1;
    long v = 0;
    for (const char *q = pt; *q && v <= 65535; q++)
        v = *q >= '0' && *q <= '9' ? v * 10 + (*q - '0') : 65536;
    if (v < 1 || v > 65535)
        return hp_errf(err, HP_INVALID, "coordinator '%s': port '%s' is not a number in [1, 65535]",
                       s, pt);
    memcpy(host, h, n);
    host[n] = 0;
    snprintf(port, plen, "%s", colon + 1);
    return HP_OK;
}

hp_status hp_agent_check_addr(const char *addr, hp_err *err) {
    char host[256], port[32];
    if (!addr) return hp_errf(err, HP_INVALID, "no coordinator address");
    return split_addr(addr, host, sizeof host, port, sizeof port, err);
}

/* Connects, retrying refused connections until the deadline (the coordinator may be starting,
 * or restarting, when an externally launched worker comes up). */
static hp_status connect_to(const char *addr, int64_t deadline, int *out, hp_err *err) {
    char host[256], port[32];
    HP_TRY(split_addr(addr, host, sizeof host, port, sizeof port, err));
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
        int rc = getaddrinfo(host, port, &hints, &ai);
        if (rc != 0 && rc != EAI_AGAIN)
            return hp_errf(err, HP_IO, "coordinator %s: %s", addr, gai_strerror(rc));
        int last = ECONNREFUSED;
        for (struct addrinfo *p = rc == 0 ? ai : NULL; p; p = p->ai_next) {
            int fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
            if (fd < 0) {
                last = errno;
                continue;
            }
            if (connect(fd, p->ai_addr, p->ai_addrlen) == 0) {
                freeaddrinfo(ai);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct timeval tv = {.tv_sec = SEND_TIMEOUT_S};
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                *out = fd;
                return HP_OK;
            }
            last = errno;
            close(fd);
        }
        if (rc == 0) freeaddrinfo(ai);
        if (now_ms() >= deadline)
            return hp_errf(err, HP_IO, "coordinator %s: connect: %s", addr, strerror(last));
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Sends f with the next sequence number. Thread-safe. */
static hp_status send_frame(agent *a, Hp__V1__Frame *f, hp_err *err) {
    pthread_mutex_lock(&a->send_mu);
    f->seq = ++a->seq;
    uint8_t *buf;
    size_t len;
    hp_status st = hp_frame_encode(f, &buf, &len, err);
    for (size_t off = 0; st == HP_OK && off < len;) {
        ssize_t n = send(a->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && errno == EINTR)
            continue;
        else
            st = hp_errf(err, HP_IO, "send: %s",
                         n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
                             ? "timed out (the coordinator is not reading)"
                             : strerror(errno));
    }
    if (len) hp_free(buf);
    pthread_mutex_unlock(&a->send_mu);
    return st;
}

/* The next frame, waiting until deadline (monotonic ms). Before the I/O thread starts only. */
static hp_status recv_frame(agent *a, int64_t deadline, double timeout_s, Hp__V1__Frame **f,
                            hp_err *err) {
    uint8_t chunk[65536];
    for (;;) {
        HP_TRY(hp_frame_reader_next(&a->rd, f, err));
        if (*f) return HP_OK;
        int64_t left = deadline - now_ms();
        if (left <= 0) return hp_errf(err, HP_IO, "no answer within %g s", timeout_s);
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        int n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n < 0 && errno != EINTR) return hp_errf(err, HP_IO, "poll: %s", strerror(errno));
        if (n <= 0) continue;
        ssize_t got = recv(a->fd, chunk, sizeof chunk, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return hp_errf(err, HP_IO, "recv: %s", strerror(errno));
        if (got == 0) return hp_errf(err, HP_IO, "the coordinator closed the connection");
        HP_TRY(hp_frame_reader_feed(&a->rd, chunk, (size_t)got, err));
    }
}

/* Records why the connection is gone (first caller wins) and stops training. Either thread. */
static void mark_lost(agent *a, const char *why) {
    pthread_mutex_lock(&a->why_mu);
    if (!atomic_load(&a->lost)) {
        snprintf(a->lost_why, sizeof a->lost_why, "%s", why);
        atomic_store(&a->lost, true);
    }
    pthread_cond_broadcast(&a->comm_cv); /* a rank waiting for rank 0's address gives up */
    pthread_mutex_unlock(&a->why_mu);
    __atomic_store_n(a->stop, 1, __ATOMIC_RELAXED); /* a flag, as a signal handler sets it */
}

/* Copies a reason out under the lock. */
static void get_why(agent *a, const char *why, char *buf, size_t len) {
    pthread_mutex_lock(&a->why_mu);
    snprintf(buf, len, "%s", why);
    pthread_mutex_unlock(&a->why_mu);
}

/* ---- the I/O thread -------------------------------------------------------------------------- */

static void send_heartbeat(agent *a) {
    Hp__V1__Heartbeat hb = HP__V1__HEARTBEAT__INIT;
    hb.step = atomic_load(&a->step);
    hb.time_unix_s = now_unix_s();
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    hp_err err = {0};
    if (send_frame(a, &f, &err) != HP_OK) mark_lost(a, err.msg);
}

/* Handles one frame from the coordinator. Only CommSetup (rank 0's tcp address, while the
 * ranks join), Stop and CheckpointNow mean anything once training runs; the rest (a heartbeat
 * echo, say) is ignored so the protocol can grow. */
static void on_frame(agent *a, const Hp__V1__Frame *f) {
    if (f->body_case == HP__V1__FRAME__BODY_COMM_SETUP) {
        const Hp__V1__CommSetup *cs = f->comm_setup;
        if (!cs || !cs->backend || strcmp(cs->backend, "tcp") || !cs->tcp_addr) return;
        pthread_mutex_lock(&a->why_mu);
        snprintf(a->tcp_addr, sizeof a->tcp_addr, "%s", cs->tcp_addr);
        pthread_cond_broadcast(&a->comm_cv);
        pthread_mutex_unlock(&a->why_mu);
        return;
    }
    if (f->body_case == HP__V1__FRAME__BODY_CHECKPOINT_NOW) {
        __atomic_add_fetch(&a->ckpt_now, 1, __ATOMIC_RELAXED); /* hp_train reads it after a step */
        return;
    }
    if (f->body_case != HP__V1__FRAME__BODY_STOP) return;
    pthread_mutex_lock(&a->why_mu);
    if (!atomic_load(&a->stop_frame)) {
        snprintf(a->stop_why, sizeof a->stop_why, "%s",
                 f->stop->reason && f->stop->reason[0] ? f->stop->reason : "no reason given");
        atomic_store(&a->stop_frame, true);
    }
    pthread_mutex_unlock(&a->why_mu);
    __atomic_store_n(a->stop, 1, __ATOMIC_RELAXED); /* a flag, as a signal handler sets it */
}

/* Handles every whole frame the reader holds; false when the connection is lost. */
static bool drain(agent *a) {
    for (;;) {
        Hp__V1__Frame *f;
        hp_err err = {0};
        if (hp_frame_reader_next(&a->rd, &f, &err) != HP_OK) {
            mark_lost(a, err.msg);
            return false;
        }
        if (!f) return true;
        on_frame(a, f);
        hp_frame_free(f);
    }
}

static void *io_main(void *arg) {
    agent *a = arg;
    /* Frames that came in the Welcome's read (a CommSetup the coordinator kept for us) */
    if (!drain(a)) return NULL;
    uint8_t chunk[65536];
    int64_t next = now_ms(); /* the first heartbeat says "training is starting" */
    while (!atomic_load(&a->lost)) {
        int64_t now = now_ms();
        if (now >= next) {
            send_heartbeat(a);
            next = now + a->heartbeat_ms;
            continue;
        }
        struct pollfd p[2] = {{.fd = a->fd, .events = POLLIN},
                              {.fd = a->wake[0], .events = POLLIN}};
        int n = poll(p, 2, (int)(next - now));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            mark_lost(a, strerror(errno));
            break;
        }
        if (p[1].revents) break; /* training is over */
        if (!p[0].revents) continue;
        ssize_t got = recv(a->fd, chunk, sizeof chunk, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            mark_lost(a, got == 0 ? "the coordinator closed the connection" : strerror(errno));
            break;
        }
        hp_err err = {0};
        if (hp_frame_reader_feed(&a->rd, chunk, (size_t)got, &err) != HP_OK) {
            mark_lost(a, err.msg);
            break;
        }
        if (!drain(a)) break;
    }
    return NULL;
}

/* ---- training callbacks ---------------------------------------------------------------------- */

static void on_metrics(void *ctx, const hp_metrics *m) {
    agent *a = ctx;
    atomic_store(&a->step, m->step);
    if (atomic_load(&a->lost)) return;
    Hp__V1__StepMetrics sm = HP__V1__STEP_METRICS__INIT;
    sm.step = m->step;
    sm.rank = m->rank;
    sm.loss = m->loss;
    sm.loss_max = m->loss_max;
    sm.grad_norm = m->grad_norm;
    sm.lr = m->lr;
    sm.tokens_per_s = m->tps;
    sm.tflops = m->tflops;
    sm.mfu_pct = m->mfu_pct;
    sm.peak_memory_bytes = (int64_t)m->memory_bytes;
    sm.peak_memory_pct = m->memory_pct;
    sm.step_time_s = m->step_time_s;
    sm.data_time_s = m->data_time_s;
    sm.exposed_comm_s = m->comm_time_s;
    sm.tokens = m->tokens;
    if (isfinite(m->eval_loss)) {
        sm.evaluated = true;
        sm.eval_loss = m->eval_loss;
    }
    sm.time_unix_s = now_unix_s();
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_METRICS;
    f.metrics = &sm;
    hp_err err = {0};
    if (send_frame(a, &f, &err) != HP_OK) mark_lost(a, err.msg);
}

/* ---- the Welcome ----------------------------------------------------------------------------- */

/* Checks the Welcome against what this rank is, and decodes its program and job. The program
 * goes through hp_program_unpack (bytes → verified program), so a hostile Welcome is refused
 * by the same checks as a file. */
static hp_status take_welcome(agent *a, const Hp__V1__Welcome *w, int *world, hp_program **prog,
                              hp_job **job, hp_err *err) {
    const hp_agent_opts *o = a->o;
    if (w->protocol_version != HP_PROTOCOL_VERSION)
        return hp_errf(err, HP_UNSUPPORTED, "protocol version %u (this worker speaks %d)",
                       w->protocol_version, HP_PROTOCOL_VERSION);
    if (w->world_size < 1 || w->world_size > MAX_WORLD)
        return hp_errf(err, HP_INVALID, "world_size %d must be in [1, %d]", w->world_size,
                       MAX_WORLD);
    if (o->world > 0 && w->world_size != o->world)
        return hp_errf(err, HP_INVALID, "world_size %d, but the launcher started %d ranks",
                       w->world_size, o->world);
    if (w->rank != o->rank)
        return hp_errf(err, HP_INVALID, "rank %d, but this worker is rank %d", w->rank, o->rank);
    if (!w->run_dir || !w->run_dir[0]) return hp_errf(err, HP_INVALID, "run_dir is empty");
    if (w->world_size > 1) {
        bool tcp = w->comm && w->comm->backend && !strcmp(w->comm->backend, "tcp");
        if (!w->comm || (!tcp && (!w->comm->shm_name || !w->comm->shm_name[0])))
            return hp_errf(err, HP_INVALID, "world_size %d needs comm.shm_name", w->world_size);
        if (!tcp && w->comm->backend && w->comm->backend[0] && strcmp(w->comm->backend, "shm"))
            return hp_errf(err, HP_UNSUPPORTED,
                           "comm backend '%.64s' (this worker supports 'shm' and 'tcp')",
                           w->comm->backend);
    }
    if (!w->program) return hp_errf(err, HP_INVALID, "no program");
    if (!w->job) return hp_errf(err, HP_INVALID, "no job");
    *world = w->world_size;
    a->heartbeat_ms =
        w->heartbeat_interval_ms > 0 ? w->heartbeat_interval_ms : HEARTBEAT_DEFAULT_MS;
    if (a->heartbeat_ms < 10) a->heartbeat_ms = 10;

    size_t len = protobuf_c_message_get_packed_size(&w->program->base);
    uint8_t *bytes = hp_malloc(len ? len : 1);
    if (!bytes) return hp_errf(err, HP_NOMEM, "program: out of memory (%zu bytes)", len);
    protobuf_c_message_pack(&w->program->base, bytes);
    hp_status st = hp_program_unpack(bytes, len, prog, err);
    hp_free(bytes);
    if (st != HP_OK) return hp_err_prefix(err, "program");
    if ((*prog)->world != w->world_size) {
        st = hp_errf(err, HP_INVALID, "program: compiled for world %d, the Welcome says %d",
                     (*prog)->world, w->world_size);
        goto fail;
    }
    /* one program serves every rank: they differ only in rank (and so in their boxes) */
    if ((st = hp_program_set_rank(*prog, o->rank, err)) != HP_OK) goto fail;
    if ((st = hp_job_import(w->job, job, err)) != HP_OK) {
        hp_err_prefix(err, "job");
        goto fail;
    }
    return HP_OK;
fail:
    hp_program_free(*prog);
    *prog = NULL;
    return st;
}

/* ---- the run --------------------------------------------------------------------------------- */

/* Sends a profiled step's trace (training thread). hp_train bounded it to fit a frame. */
static void on_trace(void *ctx, int64_t step, const char *json, size_t len) {
    agent *a = ctx;
    if (atomic_load(&a->lost)) return;
    Hp__V1__Trace tr = HP__V1__TRACE__INIT;
    tr.step = step;
    tr.chrome_json.data = (uint8_t *)json;
    tr.chrome_json.len = len;
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_TRACE;
    f.trace = &tr;
    hp_err err = {0};
    if (send_frame(a, &f, &err) != HP_OK) mark_lost(a, err.msg);
}

/* A checkpoint was written (training thread, every rank): CheckpointDone. */
static void on_checkpoint(void *ctx, int64_t step, const char *path) {
    agent *a = ctx;
    if (atomic_load(&a->lost)) return;
    Hp__V1__CheckpointDone c = HP__V1__CHECKPOINT_DONE__INIT;
    c.step = step;
    c.path = (char *)path;
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_CHECKPOINT_DONE;
    f.checkpoint_done = &c;
    hp_err err = {0};
    if (send_frame(a, &f, &err) != HP_OK) mark_lost(a, err.msg);
}

static void send_done(agent *a, bool ok, int64_t final_step, const char *error) {
    if (atomic_load(&a->lost)) return;
    Hp__V1__Done d = HP__V1__DONE__INIT;
    d.ok = ok;
    d.final_step = final_step;
    d.error = (char *)(error ? error : "");
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_DONE;
    f.done = &d;
    hp_err err = {0};
    if (send_frame(a, &f, &err) != HP_OK) mark_lost(a, err.msg);
}

static hp_status send_hello(agent *a, hp_err *err) {
    const hp_agent_opts *o = a->o;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    Hp__V1__Hello h = HP__V1__HELLO__INIT;
    h.protocol_version = HP_PROTOCOL_VERSION;
    h.job_id = (char *)o->job_id;
    h.rank = o->rank;
    h.token = (char *)(o->token ? o->token : "");
    h.pid = (int32_t)getpid();
    h.hostname = host;
    h.local_rank = o->local_rank;
    h.device = "cpu";
    h.device_memory_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_HELLO;
    f.hello = &h;
    return send_frame(a, &f, err);
}

/* ---- comm tcp: the rendezvous through the coordinator --------------------------------------- */

#define TCP_JOIN_TIMEOUT_S 60

/* Rank 0 tells the coordinator where it listens; the coordinator relays it to the others. */
static hp_status publish_addr(const char *addr, void *ctx, hp_err *err) {
    agent *a = ctx;
    Hp__V1__CommSetup cs = HP__V1__COMM_SETUP__INIT;
    cs.backend = "tcp";
    cs.tcp_addr = (char *)addr;
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_COMM_SETUP;
    f.comm_setup = &cs;
    return send_frame(a, &f, err);
}

/* Joins the world's tcp communicator. Every rank listens on the local address of its
 * connection to the coordinator (the interface the coordinator reached it on, which its peers
 * reach it on too); the secret is derived from the attempt's token, which every rank holds and
 * which never crosses the ranks' connections. */
static hp_status join_tcp(agent *a, int world, hp_comm **out, hp_err *err) {
    const hp_agent_opts *o = a->o;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[NI_MAXHOST];
    if (getsockname(a->fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0)
        return hp_errf(err, HP_IO, "comm tcp: the local address: %s", strerror(errno));
    const char *token = o->token ? o->token : "";
    const void *parts[1] = {"hp tcp comm"};
    const size_t lens[1] = {11};
    uint8_t mac[HP__SHA256_BYTES];
    hp__hmac_sha256(token, strlen(token), parts, lens, 1, mac);
    char secret[2 * HP__SHA256_BYTES + 1];
    for (int i = 0; i < HP__SHA256_BYTES; i++) snprintf(secret + 2 * i, 3, "%02x", mac[i]);
    hp_tcp_opts to = {.rank = o->rank,
                      .world = world,
                      .timeout_s = TCP_JOIN_TIMEOUT_S,
                      .secret = secret,
                      .bind_host = host,
                      .publish = publish_addr,
                      .publish_ctx = a};
    char addr[256] = "";
    if (o->rank > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += TCP_JOIN_TIMEOUT_S;
        pthread_mutex_lock(&a->why_mu);
        while (!a->tcp_addr[0] && !atomic_load(&a->lost) && !*a->stop)
            if (pthread_cond_timedwait(&a->comm_cv, &a->why_mu, &until) != 0) break;
        snprintf(addr, sizeof addr, "%s", a->tcp_addr);
        pthread_mutex_unlock(&a->why_mu);
        if (!addr[0])
            return hp_errf(err, HP_IO, "comm tcp: rank 0's address did not come within %d s",
                           TCP_JOIN_TIMEOUT_S);
        to.addr = addr;
    }
    return hp_tcp_comm_new(&to, out, err);
}

/* Trains with the Welcome's program; sends Done. The I/O thread runs meanwhile. */
static hp_status train(agent *a, const Hp__V1__Welcome *w, int world, hp_program *prog, hp_job *job,
                       hp_agent_result *res, hp_err *err) {
    const hp_agent_opts *o = a->o;
    /* A restarted job resumes from its run dir's newest checkpoint; the Welcome's resume_step
     * says one must exist. */
    char root[4096];
    snprintf(root, sizeof root, "%s/checkpoints", w->run_dir);
    int64_t ckpt_step = 0, before = w->resume_before > 0 ? w->resume_before : INT64_MAX;
    hp_err probe = {0};
    bool have = hp_ckpt_latest_before(root, before, &ckpt_step, &probe) == HP_OK;
    /* resume_before: the coordinator's store lacks the metrics of the steps from there on, so
     * they are trained again (none below it: start over). */
    if (w->resume_step > 0 && w->resume_step < before && !have) {
        hp_errf(err, HP_NOT_FOUND, "resume_step %lld, but %s holds no checkpoint",
                (long long)w->resume_step, root);
        send_done(a, false, 0, err->msg);
        return err->status;
    }
    int64_t newest = 0;
    if (before != INT64_MAX && hp_ckpt_latest(root, &newest, NULL) == HP_OK && newest >= before)
        fprintf(o->log ? o->log : stdout,
                "resume: the coordinator's store has no record of step %lld: %s, not the newest "
                "checkpoint (step %lld); the steps after it are trained again\n",
                (long long)before,
                have ? "resuming from the newest checkpoint before it" : "starting over",
                (long long)newest);
    if (have) atomic_store(&a->step, ckpt_step);
    hp_comm *tcp = NULL;
    if (world > 1 && w->comm->backend && !strcmp(w->comm->backend, "tcp") &&
        join_tcp(a, world, &tcp, err) != HP_OK) {
        send_done(a, false, 0, err->msg);
        return err->status;
    }
    hp_train_opts t = {
        .out_dir = w->run_dir,
        .resume = have ? w->run_dir : NULL,
        .resume_before = w->resume_before,
        .threads = o->threads,
        .log = o->log,
        .stop = a->stop,
        .rank = o->rank,
        .world = world,
        .comm_name = world > 1 ? w->comm->shm_name : NULL,
        .comm = tcp,
        .program = prog,
        .on_metrics = on_metrics, /* every rank: the coordinator shows each one */
        .metrics_ctx = a,
        .checkpoint_now = &a->ckpt_now,
        .on_checkpoint = on_checkpoint,
        .checkpoint_ctx = a,
        .profile_steps = o->profile_steps,
        .n_profile_steps = o->n_profile_steps,
        .on_trace = on_trace,
        .trace_ctx = a,
        .trace_max_bytes = HP_FRAME_MAX - 4096, /* room for the Frame around the JSON */
    };
    hp_train_result r = {0};
    hp_status st = hp_train(job, &t, &r, err);
    hp_comm_free(tcp);
    int64_t last = r.last_step >= r.first_step && r.last_step > 0 ? r.last_step : ckpt_step;
    res->final_step = last;
    res->stopped = st == HP_OK && r.interrupted;
    if (atomic_load(&a->lost)) {
        char why[HP_ERR_MSG_MAX];
        get_why(a, a->lost_why, why, sizeof why);
        return hp_errf(err, HP_IO, "lost the connection to the coordinator at step %lld: %s",
                       (long long)last, why);
    }
    if (st != HP_OK) {
        send_done(a, false, last, err->msg);
        return st;
    }
    char why[HP_ERR_MSG_MAX] = "interrupted by a signal", note[HP_ERR_MSG_MAX + 16] = "";
    if (atomic_load(&a->stop_frame)) get_why(a, a->stop_why, why, sizeof why);
    if (r.interrupted) snprintf(note, sizeof note, "stopped: %s", why);
    send_done(a, true, last, note);
    return HP_OK;
}

hp_status hp_agent_run(const hp_agent_opts *o, hp_agent_result *res, hp_err *err) {
    *res = (hp_agent_result){0};
    if (!o->coordinator || !o->job_id || !o->job_id[0])
        return hp_errf(err, HP_INVALID, "coordinator mode needs a coordinator and a job id");
    double timeout_s = o->welcome_timeout_s > 0 ? o->welcome_timeout_s : 60;
    int64_t deadline = now_ms() + (int64_t)(timeout_s * 1000);
    agent a = {.o = o, .fd = -1, .wake = {-1, -1}, .heartbeat_ms = HEARTBEAT_DEFAULT_MS};
    a.stop = o->stop ? o->stop : &a.own_stop;
    pthread_mutex_init(&a.send_mu, NULL);
    pthread_mutex_init(&a.why_mu, NULL);
    pthread_cond_init(&a.comm_cv, NULL);
    hp_frame_reader_init(&a.rd, HP_FRAME_MAX);
    Hp__V1__Frame *wf = NULL;
    hp_program *prog = NULL;
    hp_job *job = NULL;
    bool io_started = false;
    pthread_t io;
    int world = 1;

    hp_status st = connect_to(o->coordinator, deadline, &a.fd, err);
    if (st == HP_OK && (st = send_hello(&a, err)) != HP_OK)
        hp_err_prefix(err, "coordinator %s: hello", o->coordinator);
    if (st == HP_OK) {
        /* Anything before the Welcome is out of order: only Stop (cancelled before it began)
         * is understood. */
        while ((st = recv_frame(&a, deadline, timeout_s, &wf, err)) == HP_OK &&
               wf->body_case != HP__V1__FRAME__BODY_WELCOME) {
            bool stop = wf->body_case == HP__V1__FRAME__BODY_STOP;
            hp_frame_free(wf);
            wf = NULL;
            if (stop) {
                res->stopped = true;
                goto out;
            }
        }
        if (st != HP_OK) hp_err_prefix(err, "welcome");
    }
    if (st == HP_OK && (st = take_welcome(&a, wf->welcome, &world, &prog, &job, err)) != HP_OK) {
        hp_err_prefix(err, "welcome");
        send_done(&a, false, 0, err->msg);
    }
    if (st == HP_OK && pipe(a.wake) != 0) st = hp_errf(err, HP_IO, "pipe: %s", strerror(errno));
    if (st == HP_OK && pthread_create(&io, NULL, io_main, &a) != 0)
        st = hp_errf(err, HP_IO, "cannot start the I/O thread");
    if (st == HP_OK) {
        io_started = true;
        st = train(&a, wf->welcome, world, prog, job, res, err);
    }
out:
    if (a.fd >= 0) shutdown(a.fd, SHUT_WR); /* Done is the last word */
    if (io_started) {
        char c = 1;
        if (write(a.wake[1], &c, 1) < 0) { /* the pipe cannot be full: one byte, once */
        }
        pthread_join(io, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (a.wake[i] >= 0) close(a.wake[i]);
    if (a.fd >= 0) close(a.fd);
    hp_frame_free(wf);
    hp_program_free(prog);
    hp_job_free(job);
    hp_frame_reader_fini(&a.rd);
    pthread_mutex_destroy(&a.send_mu);
    pthread_mutex_destroy(&a.why_mu);
    pthread_cond_destroy(&a.comm_cv);
    return st;
}
