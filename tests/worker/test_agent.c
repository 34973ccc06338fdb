/* hp-worker in coordinator mode (worker/agent.c), run as the real binary against a fake
 * coordinator: a TCP listener on 127.0.0.1 port 0 in a thread, speaking the frame codec. It
 * answers Hello with a Welcome carrying a program compiled here, records what the worker
 * sends (Hello, heartbeats, StepMetrics, Done), and can send Stop mid-run. */
#include "tests/util/cli_harness.h"
#include "hp/checkpoint.h"
#include "hp/frame.h"
#include "hp/job.h"
#include "hp/passes.h"
#include "hp/program.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/hp-agent-XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(agent, .init = setup, .fini = teardown, .timeout = 300);

/* ---- the fake coordinator -------------------------------------------------------------------- */

typedef struct fake {
    /* configuration */
    int listen_fd, port;
    Hp__V1__Job *job;         /* exported job (graph omitted) */
    Hp__V1__Program *program; /* what the Welcome carries */
    int64_t stop_at;          /* > 0: send Stop after the StepMetrics of this step */
    int64_t close_at;         /* > 0: drop the connection after the StepMetrics of this step */
    bool closing;
    int workers;       /* connections to serve (world size); 0: 1 */
    char shm_name[64]; /* world > 1 */
    int dones, dones_ok;
    int64_t resume_step;
    uint32_t version; /* 0: HP_PROTOCOL_VERSION */
    char run_dir[512];
    /* what the worker sent */
    char token[64], job_id[64];
    int hello_rank, hello_version;
    int heartbeats;
    int64_t metric_steps[1024];
    int n_metrics;
    bool done, done_ok;
    int64_t done_step;
    char done_error[512];
    bool stop_sent;
    char error[HP_ERR_MSG_MAX]; /* a protocol error the fake saw */
} fake;

static void fake_send(int fd, Hp__V1__Frame *f) {
    uint8_t *buf;
    size_t len;
    cr_assert_eq(hp_frame_encode(f, &buf, &len, NULL), HP_OK);
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
    hp_free(buf);
}

static void on_frame(fake *fk, int fd, const Hp__V1__Frame *f) {
    switch (f->body_case) {
    case HP__V1__FRAME__BODY_HELLO: {
        snprintf(fk->token, sizeof fk->token, "%s", f->hello->token);
        snprintf(fk->job_id, sizeof fk->job_id, "%s", f->hello->job_id);
        fk->hello_rank = f->hello->rank;
        fk->hello_version = (int)f->hello->protocol_version;
        Hp__V1__CommSetup comm = HP__V1__COMM_SETUP__INIT;
        comm.backend = "shm";
        comm.shm_name = fk->shm_name;
        Hp__V1__Welcome w = HP__V1__WELCOME__INIT;
        w.protocol_version = fk->version ? fk->version : HP_PROTOCOL_VERSION;
        w.world_size = fk->workers > 1 ? fk->workers : 1;
        w.program = fk->program;
        w.heartbeat_interval_ms = 20;
        w.resume_step = fk->resume_step;
        w.job = fk->job;
        w.run_dir = fk->run_dir;
        w.comm = &comm;
        w.rank = f->hello->rank;
        Hp__V1__Frame out = HP__V1__FRAME__INIT;
        out.body_case = HP__V1__FRAME__BODY_WELCOME;
        out.welcome = &w;
        fake_send(fd, &out);
        break;
    }
    case HP__V1__FRAME__BODY_HEARTBEAT:
        fk->heartbeats++;
        break;
    case HP__V1__FRAME__BODY_METRICS:
        if (fk->n_metrics < 1024) fk->metric_steps[fk->n_metrics++] = f->metrics->step;
        if (fk->close_at > 0 && f->metrics->step >= fk->close_at) fk->closing = true;
        if (fk->stop_at > 0 && f->metrics->step >= fk->stop_at && !fk->stop_sent) {
            Hp__V1__Stop st = HP__V1__STOP__INIT;
            st.reason = "cancelled by the test";
            st.checkpoint = true;
            Hp__V1__Frame out = HP__V1__FRAME__INIT;
            out.body_case = HP__V1__FRAME__BODY_STOP;
            out.stop = &st;
            fake_send(fd, &out);
            fk->stop_sent = true;
        }
        break;
    case HP__V1__FRAME__BODY_DONE:
        fk->dones++;
        fk->dones_ok += f->done->ok;
        fk->done = true;
        fk->done_ok = f->done->ok;
        fk->done_step = f->done->final_step;
        snprintf(fk->done_error, sizeof fk->done_error, "%s", f->done->error);
        break;
    default:
        snprintf(fk->error, sizeof fk->error, "unexpected frame %d", (int)f->body_case);
    }
}

/* Accepts fk->workers workers (default 1) and serves them until each closes its connection. */
static void *fake_main(void *arg) {
    fake *fk = arg;
    int want = fk->workers > 0 ? fk->workers : 1, accepted = 0, open_n = 0;
    struct pollfd p[9];
    hp_frame_reader r[8];
    p[0] = (struct pollfd){.fd = fk->listen_fd, .events = POLLIN};
    uint8_t chunk[4096];
    while (accepted < want || open_n > 0) {
        int n = poll(p, (nfds_t)(1 + accepted), 120000);
        if (n <= 0) {
            snprintf(fk->error, sizeof fk->error, "no activity for 120 s");
            break;
        }
        if (accepted < want && (p[0].revents & POLLIN)) {
            int fd = accept(fk->listen_fd, NULL, NULL);
            if (fd >= 0) {
                p[1 + accepted] = (struct pollfd){.fd = fd, .events = POLLIN};
                hp_frame_reader_init(&r[accepted], HP_FRAME_MAX);
                accepted++, open_n++;
            }
        }
        for (int i = 0; i < accepted; i++) {
            if (p[1 + i].fd < 0 || !p[1 + i].revents) continue;
            ssize_t got = recv(p[1 + i].fd, chunk, sizeof chunk, 0);
            hp_err err = {0};
            bool drop = got <= 0 || hp_frame_reader_feed(&r[i], chunk, (size_t)got, &err) != HP_OK;
            Hp__V1__Frame *f;
            while (!drop && hp_frame_reader_next(&r[i], &f, &err) == HP_OK && f) {
                on_frame(fk, p[1 + i].fd, f);
                hp_frame_free(f);
            }
            if (err.status != HP_OK) snprintf(fk->error, sizeof fk->error, "%s", err.msg);
            if (drop || err.status != HP_OK || fk->closing) {
                close(p[1 + i].fd);
                p[1 + i].fd = -1;
                open_n--;
            }
        }
    }
    for (int i = 0; i < accepted; i++) {
        if (p[1 + i].fd >= 0) close(p[1 + i].fd);
        hp_frame_reader_fini(&r[i]);
    }
    return NULL;
}

static void fake_listen(fake *fk) {
    fk->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fk->listen_fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fk->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fk->listen_fd, 4), 0);
    socklen_t len = sizeof a;
    cr_assert_eq(getsockname(fk->listen_fd, (struct sockaddr *)&a, &len), 0);
    fk->port = ntohs(a.sin_port);
    snprintf(fk->run_dir, sizeof fk->run_dir, "%s/run", tmp);
}

/* ---- the job --------------------------------------------------------------------------------- */

static hp_arena arena;
static hp_job *job;
static hp_compiled *compiled;
static Hp__V1__Program *program_msg;

/* Compiles the tiny Llama for world 1 and prepares the Welcome's messages. */
static void prepare(fake *fk, int64_t steps, int64_t ckpt_interval) {
    hp_model_spec s;
    hp_err e = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &e), HP_OK, "%s", e.msg);
    s.dim = 64, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.ffn_hidden = 96;
    int world = fk->workers > 1 ? fk->workers : 1;
    s.vocab = 256, s.batch = 2 * world, s.seq = 32; /* the global batch: 2 per rank */
    job = hp_job_new();
    cr_assert(job);
    snprintf(job->name, sizeof job->name, "agent-test");
    job->model = s;
    cr_assert_eq(hp_model_build_joint(&s, &job->graph, &e), HP_OK, "%s", e.msg);
    job->train.steps = steps;
    job->train.local_batch = 2;
    job->train.seq = s.seq;
    job->train.log_interval = 1;
    job->train.checkpoint_interval = ckpt_interval;
    job->train.warmup_steps = 2;
    job->train.lr = 1e-3;
    if (world > 1) { /* FSDP over every parameter, one data-parallel mesh dim */
        job->plan.mesh[0].size = world;
        job->resources.world_size = world;
        const char *marks[] = {"layers.*", "tok_embeddings.*", "output.*", "norm.*"};
        for (int i = 0; i < 4; i++)
            cr_assert_eq(hp_job_add_fsdp_pattern(job, marks[i], &e), HP_OK, "%s", e.msg);
    }
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_compile(job, world, &compiled, &e), HP_OK, "%s", e.msg);
    uint8_t *bytes;
    size_t len;
    cr_assert_eq(hp_program_pack(compiled->program, &bytes, &len, &e), HP_OK, "%s", e.msg);
    program_msg = hp__v1__program__unpack(NULL, len, bytes);
    cr_assert(program_msg);
    hp_free(bytes);
    hp_arena_init(&arena);
    Hp__V1__Job *jm;
    cr_assert_eq(hp_job_export(job, &arena, &jm, &e), HP_OK, "%s", e.msg);
    jm->graph = NULL; /* the worker runs the program; the graph need not travel */
    fk->job = jm;
    fk->program = program_msg;
}

static void release(void) {
    hp__v1__program__free_unpacked(program_msg, NULL);
    hp_arena_fini(&arena);
    hp_compiled_free(compiled);
    hp_job_free(job);
}

/* Runs hp-worker against the fake; returns its exit status (waitpid's). */
static int run_worker(fake *fk, const char *token) {
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fake_main, fk), 0);
    int world = fk->workers > 1 ? fk->workers : 1;
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            char bin[512], addr[64], out[512], errp[512], rank[16];
            snprintf(bin, sizeof bin, "%s/worker/hp-worker", hp_th_binary_dir());
            snprintf(addr, sizeof addr, "127.0.0.1:%d", fk->port);
            snprintf(out, sizeof out, "%s/stdout%d.txt", tmp, r);
            snprintf(errp, sizeof errp, r ? "%s/stderr%d.txt" : "%s/stderr.txt", tmp, r);
            snprintf(rank, sizeof rank, "%d", r);
            if (!freopen(out, "w", stdout) || !freopen(errp, "w", stderr)) _exit(127);
            unsetenv("SLURM_PROCID");
            unsetenv("SLURM_NTASKS");
            execl(bin, bin, "--coordinator", addr, "--job", "job-7", "--rank", rank, "--token",
                  token, "--threads", "1", (char *)NULL);
            _exit(127);
        }
        pids[r] = pid;
    }
    int worst = 0;
    for (int r = 0; r < world; r++) {
        int status;
        cr_assert_eq(waitpid(pids[r], &status, 0), pids[r]);
        if (r == 0 || status != 0) worst = status;
    }
    pthread_join(th, NULL);
    close(fk->listen_fd);
    return worst;
}

static void read_stderr(char *buf, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", tmp);
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (!f) return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* ---- tests ----------------------------------------------------------------------------------- */

Test(agent, trains_to_done) {
    static fake fk;
    fake_listen(&fk);
    prepare(&fk, 5, 0);
    int status = run_worker(&fk, "tok-123");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x: %s", status, errs);
    cr_assert_str_empty(fk.error, "%s", fk.error);
    cr_assert_str_eq(fk.token, "tok-123");
    cr_assert_str_eq(fk.job_id, "job-7");
    cr_assert_eq(fk.hello_rank, 0);
    cr_assert_eq(fk.hello_version, HP_PROTOCOL_VERSION);
    cr_assert_geq(fk.heartbeats, 1);
    cr_assert_eq(fk.n_metrics, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(fk.metric_steps[i], i + 1);
    cr_assert(fk.done);
    cr_assert(fk.done_ok, "%s", fk.done_error);
    cr_assert_eq(fk.done_step, 5);
    /* the run dir got the usual outputs */
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", fk.run_dir);
    cr_assert_eq(access(path, R_OK), 0, "%s", path);
    release();
}

Test(agent, stop_checkpoints_and_exits) {
    static fake fk;
    fake_listen(&fk);
    prepare(&fk, 100000, 0);
    fk.stop_at = 2;
    int status = run_worker(&fk, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status 0x%x: %s", status, errs);
    cr_assert(fk.stop_sent);
    cr_assert(fk.done);
    cr_assert(fk.done_ok, "%s", fk.done_error);
    cr_assert(strstr(fk.done_error, "cancelled by the test"), "%s", fk.done_error);
    cr_assert_geq(fk.done_step, 2);
    cr_assert_lt(fk.done_step, 100000);
    char root[600];
    snprintf(root, sizeof root, "%s/checkpoints", fk.run_dir);
    int64_t step = 0;
    hp_err e = {0};
    cr_assert_eq(hp_ckpt_latest(root, &step, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(step, fk.done_step);
    release();
}

/* Two ranks, each its own connection: the coordinator relays the shm name; each rank streams
 * its own metrics (5 steps each); both say Done. */
Test(agent, two_ranks_train_over_shm) {
    static fake fk;
    fake_listen(&fk);
    fk.workers = 2;
    snprintf(fk.shm_name, sizeof fk.shm_name, "hp-agent-test-%ld", (long)getpid());
    prepare(&fk, 5, 0);
    int status = run_worker(&fk, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x: %s", status, errs);
    cr_assert_str_empty(fk.error, "%s", fk.error);
    cr_assert_eq(fk.n_metrics, 10);
    cr_assert_eq(fk.dones, 2);
    cr_assert_eq(fk.dones_ok, 2);
    cr_assert_eq(fk.done_step, 5);
    release();
}

/* A restarted job resumes from the run dir's checkpoint: the Welcome says resume_step. */
Test(agent, restart_resumes_from_checkpoint) {
    static fake fk, fk2;
    fake_listen(&fk);
    prepare(&fk, 100000, 0);
    fk.stop_at = 2;
    int status = run_worker(&fk, "tok");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status 0x%x", status);
    int64_t stopped = fk.done_step;
    cr_assert_geq(stopped, 2);

    fake_listen(&fk2);
    fk2.job = fk.job;
    fk2.program = fk.program;
    fk2.resume_step = stopped;
    fk2.stop_at = stopped + 2;
    status = run_worker(&fk2, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status 0x%x: %s", status, errs);
    cr_assert_gt(fk2.n_metrics, 0);
    cr_assert_eq(fk2.metric_steps[0], stopped + 1);
    cr_assert_geq(fk2.done_step, stopped + 2);
    release();
}

Test(agent, connection_loss_stops_and_fails) {
    static fake fk;
    fake_listen(&fk);
    prepare(&fk, 100000, 0);
    fk.close_at = 2;
    int status = run_worker(&fk, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x: %s", status, errs);
    cr_assert(strstr(errs, "lost the connection to the coordinator"), "%s", errs);
    cr_assert_not(fk.done);
    /* it stopped at the next step, with a checkpoint the restart resumes from */
    char root[600];
    snprintf(root, sizeof root, "%s/checkpoints", fk.run_dir);
    int64_t step = 0;
    hp_err e = {0};
    cr_assert_eq(hp_ckpt_latest(root, &step, &e), HP_OK, "%s", e.msg);
    cr_assert_geq(step, 2);
    cr_assert_lt(step, 100);
    release();
}

Test(agent, garbage_program_fails_clearly) {
    static fake fk;
    fake_listen(&fk);
    prepare(&fk, 5, 0);
    static Hp__V1__Program garbage = HP__V1__PROGRAM__INIT;
    garbage.format_version = 1;
    garbage.world_size = 1;
    garbage.loss_buffer = 12345;
    fk.program = &garbage;
    int status = run_worker(&fk, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x: %s", status, errs);
    cr_assert(strstr(errs, "welcome: program"), "%s", errs);
    cr_assert(fk.done);
    cr_assert_not(fk.done_ok);
    cr_assert(strstr(fk.done_error, "program"), "%s", fk.done_error);
    release();
}

Test(agent, newer_protocol_refused) {
    static fake fk;
    fake_listen(&fk);
    prepare(&fk, 5, 0);
    fk.version = HP_PROTOCOL_VERSION + 1;
    int status = run_worker(&fk, "tok");
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x: %s", status, errs);
    cr_assert(strstr(errs, "welcome: protocol version 2"), "%s", errs);
    cr_assert(fk.done);
    cr_assert_not(fk.done_ok);
    release();
}

Test(agent, no_welcome_times_out) {
    /* a listener that never answers */
    static fake fk;
    fake_listen(&fk);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char bin[512], addr[64], errp[512];
        snprintf(bin, sizeof bin, "%s/worker/hp-worker", hp_th_binary_dir());
        snprintf(addr, sizeof addr, "127.0.0.1:%d", fk.port);
        snprintf(errp, sizeof errp, "%s/stderr.txt", tmp);
        if (!freopen(errp, "w", stderr)) _exit(127);
        setenv("HP_WELCOME_TIMEOUT_S", "1", 1);
        setenv("HP_TOKEN", "tok", 1);
        setenv("HP_JOB", "job-1", 1);
        setenv("SLURM_PROCID", "0", 1);
        execl(bin, bin, "--coordinator", addr, (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    close(fk.listen_fd);
    char errs[4096];
    read_stderr(errs, sizeof errs);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x: %s", status, errs);
    cr_assert(strstr(errs, "welcome: no answer within 1 s"), "%s", errs);
}

Test(agent, usage_errors) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "env -u HP_TOKEN -u HP_JOB -u SLURM_PROCID %s/worker/hp-worker --coordinator "
             "127.0.0.1:1 --rank 0 2>/dev/null",
             hp_th_binary_dir());
    int rc = system(cmd);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "rc 0x%x", rc);
}
