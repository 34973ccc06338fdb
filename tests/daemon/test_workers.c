/* tests/daemon/test_workers.c — the worker protocol server with fake workers over 127.0.0.1
 * (port 0): hostile peers (wrong token, unknown job, bad rank, garbage, oversized length,
 * no hello) are disconnected and the daemon keeps serving; a good hello gets a Welcome with the
 * program, the comm setup and the run dir; under comm tcp rank 0's CommSetup reaches a rank
 * whose Hello comes after it; a rank that stops sending heartbeats is declared
 * dead and the job fails (max_restarts 0). The launcher starts a stand-in script (sleep) so no
 * real worker runs; the fake workers are threads with blocking sockets while the test pumps
 * the daemon's loop. */
#include "daemon/config.h"
#include "daemon/core.h"
#include "daemon/jobsm.h"

#include "hp/frame.h"
#include "hp/models.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static uv_loop_t loop;
static hpd *d;
static int wport;
static char job_id[HPD_ID_MAX];

static uint8_t *job_bytes(size_t *len, int world);

static uint8_t *tiny_job_bytes(size_t *len) {
    return job_bytes(len, 1);
}

static uint8_t *job_bytes(size_t *len, int world) {
    hp_model_spec s;
    hp_err e = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &e), HP_OK, "%s", e.msg);
    s.dim = 32, s.n_layers = 1, s.n_heads = 2, s.n_kv_heads = 1, s.ffn_hidden = 48;
    s.vocab = 64, s.batch = world, s.seq = 8;
    hp_job *job = hp_job_new();
    cr_assert(job);
    snprintf(job->name, sizeof job->name, "workers-test");
    job->model = s;
    cr_assert_eq(hp_model_build_joint(&s, &job->graph, &e), HP_OK, "%s", e.msg);
    job->train.steps = 5;
    job->train.local_batch = 1;
    job->train.seq = s.seq;
    job->resources.max_restarts = 0;
    if (world > 1) {
        job->resources.world_size = world;
        job->plan.mesh[0].size = world;
    }
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    uint8_t *b;
    cr_assert_eq(hp_job_pack(job, &b, len, &e), HP_OK, "%s", e.msg);
    hp_job_free(job);
    return b;
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/hp-test-workers-XXXXXX");
    cr_assert(mkdtemp(dir));
    char script[300], state[300];
    snprintf(script, sizeof script, "%s/fake-worker.sh", dir);
    snprintf(state, sizeof state, "%s/state", dir);
    FILE *f = fopen(script, "w");
    cr_assert(f);
    fputs("#!/bin/sh\nexec sleep 30\n", f);
    fclose(f);
    chmod(script, 0755);
    uv_loop_init(&loop);
    hpd_config cfg = {.state_dir = state, .slots = 2, .worker_path = script, .heartbeat_ms = 100};
    hp_err e = {0};
    cr_assert_eq(hpd_new(&loop, &cfg, &d, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp__workers_start(d, "127.0.0.1:0", &wport, &e), HP_OK, "%s", e.msg);
    snprintf(d->worker_addr, sizeof d->worker_addr, "127.0.0.1:%d", wport);
    size_t len;
    uint8_t *b = tiny_job_bytes(&len);
    hpd_job_view v;
    cr_assert_eq(hpd_submit(d, b, len, NULL, &v, &e), HP_OK, "%s", e.msg);
    hp_free(b);
    snprintf(job_id, sizeof job_id, "%s", v.id);
    /* It compiles on the loop's thread pool, then launches. */
    for (int i = 0; i < 10000 && v.state == HP__V1__JOB_STATE__JOB_STATE_COMPILING; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
        cr_assert_eq(hpd_get(d, job_id, &v, &e), HP_OK, "%s", e.msg);
    }
    cr_assert_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_LAUNCHING, "%s", hpd_sm_state_str(v.state));
}

static void teardown(void) {
    hpd_job_view v;
    hpd_cancel(d, job_id, "test over", &v, NULL);
    hpd_shutdown(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    hpd_free(d);
    cr_expect_eq(uv_loop_close(&loop), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(workers, .init = setup, .fini = teardown, .timeout = 60);

/* ---- a fake worker in a thread ------------------------------------------------------------- */
typedef struct peer {
    uint8_t *send;
    size_t send_len;
    bool keep_open_ms; /* after the reply, stay connected without heartbeats */
    atomic_bool done;
    bool disconnected;
    Hp__V1__Frame *reply; /* the first frame the daemon sent, if any */
    pthread_t th;
} peer;

static void *peer_main(void *arg) {
    peer *p = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wport)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) goto out;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (p->send_len && write(fd, p->send, p->send_len) != (ssize_t)p->send_len) goto out;
    hp_frame_reader rd;
    hp_frame_reader_init(&rd, HP_FRAME_MAX);
    uint8_t buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) {
            p->disconnected = n == 0;
            break;
        }
        hp_frame_reader_feed(&rd, buf, (size_t)n, NULL);
        Hp__V1__Frame *f = NULL;
        hp_frame_reader_next(&rd, &f, NULL);
        if (f && !p->reply) {
            p->reply = f;
            if (!p->keep_open_ms) break;
        } else if (f) {
            hp_frame_free(f);
        }
    }
    hp_frame_reader_fini(&rd);
out:
    close(fd);
    atomic_store(&p->done, true);
    return NULL;
}

static void pump_until(bool (*cond)(void *), void *ctx, int ms) {
    for (int i = 0; i < ms && !cond(ctx); i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

static bool peer_done(void *ctx) {
    return atomic_load(&((peer *)ctx)->done);
}

static void run_peer(peer *p) {
    atomic_store(&p->done, false);
    cr_assert_eq(pthread_create(&p->th, NULL, peer_main, p), 0);
    pump_until(peer_done, p, 10000);
    cr_assert(atomic_load(&p->done), "peer did not finish");
    pthread_join(p->th, NULL);
}

static void hello_bytes(peer *p, const char *job, int rank, const char *token, unsigned ver) {
    Hp__V1__Hello h;
    hp__v1__hello__init(&h);
    h.protocol_version = ver;
    h.job_id = (char *)job;
    h.rank = rank;
    h.token = (char *)token;
    h.pid = getpid();
    h.hostname = "test";
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_HELLO;
    f.hello = &h;
    cr_assert_eq(hp_frame_encode(&f, &p->send, &p->send_len, NULL), HP_OK);
}

static const char *token(void) {
    return hp__job_find(d, job_id)->token;
}

static void expect_dropped(peer *p, const char *what) {
    run_peer(p);
    cr_expect(p->disconnected, "%s: not disconnected", what);
    cr_expect_null(p->reply, "%s: got a reply", what);
    hp_free(p->send);
    if (p->reply) hp_frame_free(p->reply);
}

Test(workers, hostile_peers_dropped_daemon_serves) {
    peer p = {0};
    hello_bytes(&p, job_id, 0, "0000000000000000000000000000000000000000000000000000000000000000",
                HP_PROTOCOL_VERSION);
    expect_dropped(&p, "bad token");
    memset(&p, 0, sizeof p);
    hello_bytes(&p, "j-999999", 0, token(), HP_PROTOCOL_VERSION);
    expect_dropped(&p, "unknown job");
    memset(&p, 0, sizeof p);
    hello_bytes(&p, job_id, 7, token(), HP_PROTOCOL_VERSION);
    expect_dropped(&p, "rank out of range");
    memset(&p, 0, sizeof p);
    hello_bytes(&p, job_id, 0, token(), 99);
    expect_dropped(&p, "protocol version");
    /* garbage: a length prefix then bytes that are no Frame */
    memset(&p, 0, sizeof p);
    static const uint8_t garbage[] = {6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    p.send = hp_malloc(sizeof garbage);
    memcpy(p.send, garbage, sizeof garbage);
    p.send_len = sizeof garbage;
    expect_dropped(&p, "garbage");
    /* oversized: a 4 GiB length prefix */
    memset(&p, 0, sizeof p);
    static const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3};
    p.send = hp_malloc(sizeof huge);
    memcpy(p.send, huge, sizeof huge);
    p.send_len = sizeof huge;
    expect_dropped(&p, "oversized");
    /* a first frame that is not hello */
    memset(&p, 0, sizeof p);
    Hp__V1__Heartbeat hb;
    hp__v1__heartbeat__init(&hb);
    Hp__V1__Frame f;
    hp__v1__frame__init(&f);
    f.body_case = HP__V1__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    cr_assert_eq(hp_frame_encode(&f, &p.send, &p.send_len, NULL), HP_OK);
    expect_dropped(&p, "heartbeat before hello");

    /* Still serving: the right hello gets the Welcome. */
    hpd_job_view v;
    cr_assert_eq(hpd_get(d, job_id, &v, NULL), HP_OK);
    cr_expect_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_LAUNCHING, "%s", hpd_sm_state_str(v.state));
    memset(&p, 0, sizeof p);
    hello_bytes(&p, job_id, 0, token(), HP_PROTOCOL_VERSION);
    run_peer(&p);
    hp_free(p.send);
    cr_assert(p.reply, "no welcome");
    cr_assert_eq(p.reply->body_case, HP__V1__FRAME__BODY_WELCOME);
    Hp__V1__Welcome *w = p.reply->welcome;
    cr_expect_eq(w->protocol_version, HP_PROTOCOL_VERSION);
    cr_expect_eq(w->world_size, 1);
    cr_expect_eq(w->rank, 0);
    cr_expect(w->program && w->program->n_instructions > 0);
    cr_expect(w->job && !w->job->graph, "the job travels without its graph");
    cr_expect_eq(w->heartbeat_interval_ms, 100);
    cr_expect(w->comm && strcmp(w->comm->backend, "shm") == 0);
    cr_expect(w->comm && strstr(w->comm->shm_name, job_id), "%s", w->comm->shm_name);
    cr_expect(strstr(w->run_dir, "/jobs/") && strstr(w->run_dir, job_id), "%s", w->run_dir);
    hp_frame_free(p.reply);
}

static bool job_final(void *ctx) {
    hpd_job_view v;
    return hpd_get(d, job_id, &v, NULL) == HP_OK && hpd_sm_is_final(v.state);
}

Test(workers, heartbeat_timeout_fails_rank) {
    peer p = {0};
    p.keep_open_ms = true;
    hello_bytes(&p, job_id, 0, token(), HP_PROTOCOL_VERSION);
    atomic_store(&p.done, false);
    cr_assert_eq(pthread_create(&p.th, NULL, peer_main, &p), 0);
    /* hello → RUNNING, then silence: 3 missed 100 ms heartbeats (the cron checks each second) */
    pump_until(job_final, NULL, 5000);
    hpd_job_view v;
    cr_assert_eq(hpd_get(d, job_id, &v, NULL), HP_OK);
    cr_expect_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_FAILED, "%s", hpd_sm_state_str(v.state));
    cr_expect(strstr(v.error, "rank 0") && strstr(v.error, "heartbeat"), "%s", v.error);
    /* the attempt is torn down: the fake worker's connection closes */
    pump_until(peer_done, &p, 15000);
    cr_expect(atomic_load(&p.done));
    pthread_join(p.th, NULL);
    hp_free(p.send);
    if (p.reply) hp_frame_free(p.reply);
}

/* ---- the core API on the same fixture -------------------------------------------------------- */
Test(workers, list_paging_newest_first) {
    size_t len;
    uint8_t *b = tiny_job_bytes(&len);
    hp_err e = {0};
    for (int i = 0; i < 4; i++) {
        hpd_job_view v;
        cr_assert_eq(hpd_submit(d, b, len, NULL, &v, &e), HP_OK, "%s", e.msg);
    }
    /* idempotent retry */
    hpd_job_view a, a2;
    cr_assert_eq(hpd_submit(d, b, len, "req-7", &a, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hpd_submit(d, b, len, "req-7", &a2, &e), HP_OK, "%s", e.msg);
    cr_expect_str_eq(a.id, a2.id);
    hp_free(b);
    char token[HPD_ID_MAX] = "", next[HPD_ID_MAX];
    int seen = 0;
    long last = 1L << 30;
    do {
        hpd_job_view *v;
        int n;
        cr_assert_eq(hpd_list(d, NULL, 0, 2, token, &v, &n, next, &e), HP_OK, "%s", e.msg);
        for (int i = 0; i < n; i++) {
            long s = atol(v[i].id + 2);
            cr_expect_lt(s, last, "newest first");
            last = s;
        }
        seen += n;
        hp_free(v);
        snprintf(token, sizeof token, "%s", next);
    } while (next[0]);
    cr_expect_eq(seen, 6);
    /* a state filter */
    Hp__V1__JobState q = HP__V1__JOB_STATE__JOB_STATE_QUEUED;
    hpd_job_view *v;
    int n;
    cr_assert_eq(hpd_list(d, &q, 1, 0, "", &v, &n, next, &e), HP_OK);
    for (int i = 0; i < n; i++) cr_expect_eq(v[i].state, q);
    cr_expect_eq(n, 4, "2 slots: two jobs run, four wait"); /* FIFO over the slots */
    hp_free(v);
    cr_expect_eq(hpd_list(d, NULL, 0, 1001, "", &v, &n, next, &e), HP_LIMIT);
    cr_expect_eq(hpd_list(d, NULL, 0, 0, "bogus", &v, &n, next, &e), HP_INVALID);
    cr_expect_eq(hpd_get(d, "j-424242", &a, &e), HP_NOT_FOUND);
    cr_expect_eq(hpd_cancel(d, "j-424242", "x", &a, &e), HP_NOT_FOUND);
}

Test(workers, submit_rejects_bad_jobs) {
    hpd_job_view v;
    hp_err e = {0};
    static const uint8_t junk[] = {0xff, 0xff, 0xff};
    hp_status st = hpd_submit(d, junk, sizeof junk, NULL, &v, &e);
    cr_expect_neq(st, HP_OK);
    cr_expect(e.msg[0]);
    hpd_job_view *all;
    int n;
    char next[HPD_ID_MAX];
    cr_assert_eq(hpd_list(d, NULL, 0, 0, "", &all, &n, next, &e), HP_OK);
    cr_expect_eq(n, 1, "nothing stored for a rejected job");
    hp_free(all);
}

typedef struct events {
    int n, states, ends;
    Hp__V1__JobState last;
} events;

static void on_event(void *ctx, const Hp__V1__JobEvent *ev) {
    events *e = ctx;
    e->n++;
    if (!ev) {
        e->ends++;
        return;
    }
    cr_expect_eq(e->ends, 0, "no event after the end");
    if (ev->event_case == HP__V1__JOB_EVENT__EVENT_STATE) {
        e->states++;
        e->last = ev->state;
    }
}

Test(workers, watch_sees_states_then_ends) {
    events ev = {0};
    hpd_watch *w = NULL;
    hp_err e = {0};
    cr_assert_eq(hpd_watch_start(d, job_id, 1, true, on_event, &ev, &w, &e), HP_OK, "%s", e.msg);
    cr_assert(w);
    cr_expect_eq(ev.states, 1);
    cr_expect_eq(ev.last, HP__V1__JOB_STATE__JOB_STATE_LAUNCHING);
    hpd_job_view v;
    cr_assert_eq(hpd_cancel(d, job_id, "watched", &v, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_CANCELLED);
    cr_expect_eq(ev.last, HP__V1__JOB_STATE__JOB_STATE_CANCELLED);
    cr_expect_eq(ev.ends, 1);
    /* a watch on a finished job: its state, then the end, at once */
    events ev2 = {0};
    cr_assert_eq(hpd_watch_start(d, job_id, 0, false, on_event, &ev2, &w, &e), HP_OK);
    cr_expect_null(w);
    cr_expect_eq(ev2.states, 1);
    cr_expect_eq(ev2.ends, 1);
    /* stopping early: no more calls */
    cr_expect_eq(hpd_watch_start(d, "j-999999", 0, false, on_event, &ev2, &w, &e), HP_NOT_FOUND);
}

/* Every allocation of a submit failing in turn (sampled): an error or success, never a crash,
 * a leak (ASan) or a job half in memory and half in the store. */
Test(workers, submit_fault_loop) {
    size_t len;
    uint8_t *b = tiny_job_bytes(&len);
    hp_err e = {0};
    hpd_job_view v;
    hp_alloc_fail_at(-1); /* counts from here */
    cr_assert_eq(hpd_submit(d, b, len, "probe", &v, &e), HP_OK, "%s", e.msg);
    long total = hp_alloc_fail_at(-1);
    cr_assert_gt(total, 0);
    int stored_before = d->n_jobs;
    for (long k = 0; k < total; k += 1 + total / 300) {
        hp_alloc_fail_at(k);
        hp_status st = hpd_submit(d, b, len, NULL, &v, &e);
        hp_alloc_fail_at(-1);
        cr_expect(st == HP_OK || st == HP_NOMEM || st == HP_INVALID, "k=%ld: %s", k, e.msg);
        if (st == HP_OK) stored_before++;
        cr_expect_eq(d->n_jobs, stored_before, "k=%ld", k);
    }
    hp_free(b);
    /* memory and store agree */
    hpd_store_row r;
    for (hpd_job *j = d->jobs; j; j = j->next) {
        cr_expect_eq(hpd_store_get(d->store, j->v.id, &r, &e), HP_OK, "%s", e.msg);
        hpd_store_row_fini(&r);
    }
}

/* ---- comm tcp: rank 0's CommSetup reaches a rank that says Hello later ------------------------
 */

/* A fake rank: Hello, then every frame the daemon sends is kept (at most 4); rank 0 answers
 * the Welcome with a CommSetup. Heartbeats every 20 ms until told to stop. */
typedef struct relay_rank {
    int rank;
    const char *id, *token;
    atomic_bool stop, done;
    atomic_int n_frames;
    Hp__V1__Frame *frames[4];
    pthread_t th;
} relay_rank;

static bool send_frame_fd(int fd, Hp__V1__Frame *f) {
    uint8_t *b = NULL;
    size_t n = 0;
    bool ok = hp_frame_encode(f, &b, &n, NULL) == HP_OK && write(fd, b, n) == (ssize_t)n;
    hp_free(b);
    return ok;
}

static void *relay_main(void *arg) {
    relay_rank *p = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wport)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_usec = 20000}; /* read slices between heartbeats */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Hp__V1__Hello h = HP__V1__HELLO__INIT;
    h.protocol_version = HP_PROTOCOL_VERSION;
    h.job_id = (char *)p->id;
    h.rank = p->rank;
    h.token = (char *)p->token;
    h.pid = getpid();
    h.hostname = "test";
    Hp__V1__Frame f = HP__V1__FRAME__INIT;
    f.body_case = HP__V1__FRAME__BODY_HELLO;
    f.hello = &h;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || !send_frame_fd(fd, &f)) goto out;
    hp_frame_reader rd;
    hp_frame_reader_init(&rd, HP_FRAME_MAX);
    uint8_t buf[65536];
    while (!atomic_load(&p->stop)) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0) break;
        if (n > 0) hp_frame_reader_feed(&rd, buf, (size_t)n, NULL);
        Hp__V1__Frame *got = NULL;
        while (hp_frame_reader_next(&rd, &got, NULL) == HP_OK && got) {
            int k = atomic_load(&p->n_frames);
            if (k == 0 && p->rank == 0 && got->body_case == HP__V1__FRAME__BODY_WELCOME) {
                Hp__V1__CommSetup cs = HP__V1__COMM_SETUP__INIT;
                cs.backend = "tcp";
                cs.tcp_addr = "127.0.0.1:5555";
                Hp__V1__Frame r = HP__V1__FRAME__INIT;
                r.body_case = HP__V1__FRAME__BODY_COMM_SETUP;
                r.comm_setup = &cs;
                send_frame_fd(fd, &r);
            }
            if (k < 4) {
                p->frames[k] = got;
                atomic_store(&p->n_frames, k + 1);
            } else {
                hp_frame_free(got);
            }
        }
        Hp__V1__Heartbeat hb = HP__V1__HEARTBEAT__INIT;
        Hp__V1__Frame hf = HP__V1__FRAME__INIT;
        hf.body_case = HP__V1__FRAME__BODY_HEARTBEAT;
        hf.heartbeat = &hb;
        if (atomic_load(&p->n_frames) > 0) send_frame_fd(fd, &hf);
    }
    hp_frame_reader_fini(&rd);
out:
    close(fd);
    atomic_store(&p->done, true);
    return NULL;
}

static bool setup_kept(void *ctx) {
    return hp__job_find(d, ctx)->comm_setup != NULL;
}

static bool has_frames(void *ctx) {
    return atomic_load(&((relay_rank *)ctx)->n_frames) >= 2 ||
           atomic_load(&((relay_rank *)ctx)->done);
}

Test(workers, tcp_comm_setup_reaches_a_late_rank) {
    d->comm_kind = HPD_COMM_TCP;
    hpd_job_view v;
    hp_err e = {0};
    cr_assert_eq(hpd_cancel(d, job_id, "make room", &v, &e), HP_OK, "%s", e.msg);
    pump_until(job_final, NULL, 5000);
    size_t len;
    uint8_t *b = job_bytes(&len, 2);
    cr_assert_eq(hpd_submit(d, b, len, NULL, &v, &e), HP_OK, "%s", e.msg);
    hp_free(b);
    snprintf(job_id, sizeof job_id, "%s", v.id); /* teardown cancels this one */
    for (int i = 0; i < 10000 && v.state != HP__V1__JOB_STATE__JOB_STATE_LAUNCHING; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
        cr_assert_eq(hpd_get(d, job_id, &v, &e), HP_OK, "%s", e.msg);
    }
    cr_assert_eq(v.state, HP__V1__JOB_STATE__JOB_STATE_LAUNCHING, "%s", hpd_sm_state_str(v.state));
    relay_rank r0 = {.rank = 0, .id = job_id, .token = token()};
    relay_rank r1 = {.rank = 1, .id = job_id, .token = token()};
    cr_assert_eq(pthread_create(&r0.th, NULL, relay_main, &r0), 0);
    pump_until(setup_kept, job_id, 10000); /* rank 0's CommSetup is in before rank 1 comes */
    cr_assert(setup_kept(job_id), "hpd did not keep rank 0's CommSetup");
    cr_assert_eq(pthread_create(&r1.th, NULL, relay_main, &r1), 0);
    pump_until(has_frames, &r1, 10000);
    atomic_store(&r0.stop, true);
    atomic_store(&r1.stop, true);
    pthread_join(r0.th, NULL);
    pthread_join(r1.th, NULL);
    cr_assert_geq(atomic_load(&r0.n_frames), 1);
    cr_expect_eq(r0.frames[0]->body_case, HP__V1__FRAME__BODY_WELCOME);
    cr_expect_str_eq(r0.frames[0]->welcome->comm->backend, "tcp");
    cr_assert_geq(atomic_load(&r1.n_frames), 2, "rank 1 got %d frames", atomic_load(&r1.n_frames));
    cr_expect_eq(r1.frames[0]->body_case, HP__V1__FRAME__BODY_WELCOME);
    cr_assert_eq(r1.frames[1]->body_case, HP__V1__FRAME__BODY_COMM_SETUP);
    cr_expect_str_eq(r1.frames[1]->comm_setup->backend, "tcp");
    cr_expect_str_eq(r1.frames[1]->comm_setup->tcp_addr, "127.0.0.1:5555");
    for (int k = 0; k < atomic_load(&r0.n_frames); k++) hp_frame_free(r0.frames[k]);
    for (int k = 0; k < atomic_load(&r1.n_frames); k++) hp_frame_free(r1.frames[k]);
}
