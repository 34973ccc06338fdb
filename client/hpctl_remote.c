/* client/hpctl_remote.c — the verbs that talk to the coordinator: submit, status, list,
 * cancel, watch, logs, trace (GetTrace: a profiled step's Chrome trace into a file) and
 * checkpoint (CheckpointJob: ask the running ranks to checkpoint now).
 *
 * Common flags (every verb): --server HOST:PORT (default $HP_SERVER, else 127.0.0.1:7070),
 * --token T (else $HP_TOKEN, else STATE_DIR/token), --tls-ca PEM, --timeout SECONDS, --json.
 * Exit codes: 0 ok, 1 an error (the server's, printed as "hpctl: VERB: CODE: message"), 2 usage.
 *
 * logs: reads STATE_DIR/jobs/ID/rank-R.log ($HP_STATE_DIR or ~/.local/state/hp), i.e. it runs
 * where the daemon runs (the local launcher writes those files); --follow keeps reading the
 * file until the job is final (asking the daemon with GetJob). When the file is absent and
 * --follow is given, it streams live log lines over WatchJob(logs=true) instead.
 */
#include "client/hpctl.h"
#include "client/rpc_client.h"

#include <grpc/status.h>

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SUBMIT_MAX_BYTES  (64u << 20)
#define WATCH_RECONNECT_S 30

typedef struct remote_opts {
    const char *server, *token, *tls_ca;
    int timeout_ms;
    bool json;
} remote_opts;

/* The common flags of the remote verbs, the ones with a value first (common_flag's k); hpctl
 * also takes them before the verb (hpctl_common_flag_arity). */
static const char *const common_names[] = {"--server", "--token", "--tls-ca", "--timeout",
                                           "--json"};
enum { N_VALUED = 4 };

int hpctl_common_flag_arity(const char *arg) {
    for (size_t k = 0; k < HP_ARRAY_LEN(common_names); k++)
        if (!strcmp(arg, common_names[k])) return k < N_VALUED ? 1 : 0;
    return -1;
}

/* Consumes a common flag at argv[*i]; returns 1 if consumed, 0 if not one, HPCTL_USAGE+100 on
 * a usage error (already printed). */
static int common_flag(const char *verb, int argc, char **argv, int *i, remote_opts *o) {
    const char *a = argv[*i];
    const char *const *names = common_names;
    for (size_t k = 0; k < N_VALUED; k++) {
        if (strcmp(a, names[k])) continue;
        if (*i + 1 >= argc) {
            hpctl_fail(HPCTL_USAGE, verb, "%s needs a value", a);
            return 100 + HPCTL_USAGE;
        }
        const char *v = argv[++*i];
        if (k == 0) o->server = v;
        if (k == 1) o->token = v;
        if (k == 2) o->tls_ca = v;
        if (k == 3) {
            double s;
            if (hpctl_parse_f64(verb, a, v, 0.001, 86400, &s) != HPCTL_OK) return 100 + HPCTL_USAGE;
            o->timeout_ms = (int)(s * 1000);
        }
        return 1;
    }
    if (!strcmp(a, "--json")) {
        o->json = true;
        return 1;
    }
    return 0;
}

static int open_client(const char *verb, const remote_opts *o, hp_rpc_client **c) {
    hp_err err = {0};
    char *token = NULL;
    if (hp_rpc_find_token(o->token, &token, &err) != HP_OK)
        return hpctl_fail(HPCTL_ERROR, verb, "token: %s", err.msg);
    hp_rpc_opts ro = {o->server, token, o->tls_ca, o->timeout_ms};
    hp_status st = hp_rpc_client_open(&ro, c, &err);
    hp_free(token);
    if (st != HP_OK) return hpctl_fail(hp_status_exit(st), verb, "%s", err.msg);
    return HPCTL_OK;
}

static int rpc_fail(const char *verb, const hp_rpc_result *r) {
    return hpctl_fail(HPCTL_ERROR, verb, "%s: %s", hp_rpc_code_name(r->code),
                      r->msg[0] ? r->msg : "(no message)");
}

static const char *state_name(Hp__V1__JobState s) {
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&hp__v1__job_state__descriptor, (int)s);
    if (!v) return "UNKNOWN";
    return strncmp(v->name, "JOB_STATE_", 10) ? v->name : v->name + 10;
}

static int parse_state(const char *s, Hp__V1__JobState *out) {
    for (unsigned i = 0; i < hp__v1__job_state__descriptor.n_values; i++) {
        const ProtobufCEnumValue *v = &hp__v1__job_state__descriptor.values[i];
        const char *short_name = v->name + 10;
        if (!strcasecmp(s, v->name) || !strcasecmp(s, short_name)) {
            *out = (Hp__V1__JobState)v->value;
            return 0;
        }
    }
    return -1;
}

static bool state_final(Hp__V1__JobState s) {
    return s == HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
           s == HP__V1__JOB_STATE__JOB_STATE_FAILED || s == HP__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

/* ---- JSON -------------------------------------------------------------------------------- */

static json_t *metrics_json(const Hp__V1__StepMetrics *m) {
    json_t *o = json_pack("{s:I, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:f}",
                          "step", (json_int_t)m->step, "rank", m->rank, "loss", m->loss, "loss_max",
                          m->loss_max, "grad_norm", m->grad_norm, "lr", m->lr, "tokens_per_s",
                          m->tokens_per_s, "tflops", m->tflops, "mfu_pct", m->mfu_pct,
                          "peak_memory_bytes", (json_int_t)m->peak_memory_bytes, "peak_memory_pct",
                          m->peak_memory_pct, "step_time_s", m->step_time_s, "data_time_s",
                          m->data_time_s, "time_unix_s", m->time_unix_s);
    if (o && m->evaluated) json_object_set_new(o, "eval_loss", json_real(m->eval_loss));
    return o;
}

static json_t *job_json(const Hp__V1__JobInfo *j) {
    json_t *o = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:I, s:I, s:i, s:s}", "id", j->id, "name",
                          j->name, "state", state_name(j->state), "created_unix_s",
                          j->created_unix_s, "updated_unix_s", j->updated_unix_s, "world_size",
                          j->world_size, "step", (json_int_t)j->step, "total_steps",
                          (json_int_t)j->total_steps, "restarts", j->restarts, "error", j->error);
    if (o && j->last_metrics) json_object_set_new(o, "last_metrics", metrics_json(j->last_metrics));
    if (o) {
        json_object_set_new(o, "launcher", json_string(j->launcher ? j->launcher : ""));
        json_object_set_new(o, "launch_ref", json_string(j->launch_ref ? j->launch_ref : ""));
        json_object_set_new(o, "launch_state", json_string(j->launch_state ? j->launch_state : ""));
    }
    return o;
}

static void print_json(json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) {
        puts(s);
        free(s);
    }
    json_decref(o);
    fflush(stdout);
}

static void print_job(const Hp__V1__JobInfo *j) {
    printf("id:        %s\n", j->id);
    printf("name:      %s\n", j->name);
    printf("state:     %s\n", state_name(j->state));
    printf("world:     %d\n", j->world_size);
    printf("step:      %lld/%lld\n", (long long)j->step, (long long)j->total_steps);
    printf("restarts:  %d\n", j->restarts);
    if (j->launcher && *j->launcher) {
        bool slurm = !strcmp(j->launcher, "slurm");
        printf("launcher:  %s", j->launcher);
        if (j->launch_ref && *j->launch_ref)
            printf("  %s %s", slurm ? "slurm job" : "ref", j->launch_ref);
        if (j->launch_state && *j->launch_state) printf("  (%s)", j->launch_state);
        printf("\n");
    }
    if (j->last_metrics)
        printf("loss:      %.4f  tps %.0f  mfu %.2f%%\n", j->last_metrics->loss,
               j->last_metrics->tokens_per_s, j->last_metrics->mfu_pct);
    if (j->error && *j->error) printf("error:     %s\n", j->error);
}

/* ---- calls -------------------------------------------------------------------------------- */

static int get_job(hp_rpc_client *c, const char *id, Hp__V1__GetJobResponse **resp,
                   hp_rpc_result *r) {
    Hp__V1__GetJobRequest req = HP__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    return hp_rpc_unary(c, "/hp.v1.Coordinator/GetJob", &req.base, true,
                        &hp__v1__get_job_response__descriptor, (ProtobufCMessage **)resp, r);
}

/* ---- watch ------------------------------------------------------------------------------- */

typedef struct watch_ctx {
    bool json, tty, line_open, logs_only;
    int rank; /* logs_only: -2 all */
    int64_t total_steps;
    Hp__V1__JobState last_state;
    bool have_state;
    bool final_pending; /* text mode: the final state is printed after the replayed metrics */
    int64_t last_step;  /* of the last metrics event: a reconnect resumes after it */
    bool got_event;     /* a new step since the last (re)connect */
} watch_ctx;

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || !isfinite(s)) {
        snprintf(buf, n, "-");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

static int on_event(void *ctx, const Hp__V1__JobEvent *ev) {
    watch_ctx *w = ctx;
    if (w->logs_only) {
        if (ev->event_case == HP__V1__JOB_EVENT__EVENT_LOG && ev->log &&
            (w->rank == -2 || ev->log->rank == w->rank)) {
            if (w->json)
                print_json(json_pack("{s:i, s:s}", "rank", ev->log->rank, "text", ev->log->text));
            else
                printf("%s\n", ev->log->text);
            fflush(stdout);
        }
        if (ev->event_case == HP__V1__JOB_EVENT__EVENT_STATE) {
            w->last_state = ev->state;
            w->have_state = true;
        }
        return 0;
    }
    if (ev->event_case == HP__V1__JOB_EVENT__EVENT_METRICS && ev->metrics &&
        ev->metrics->step > w->last_step) {
        w->last_step = ev->metrics->step;
        w->got_event = true; /* progress: a later loss of the connection starts a new budget */
    }
    if (w->json) {
        json_t *o = json_pack("{s:s, s:f}", "job_id", ev->job_id, "time_unix_s", ev->time_unix_s);
        if (!o) return 0;
        if (ev->event_case == HP__V1__JOB_EVENT__EVENT_STATE)
            json_object_set_new(o, "state", json_string(state_name(ev->state)));
        else if (ev->event_case == HP__V1__JOB_EVENT__EVENT_METRICS && ev->metrics)
            json_object_set_new(o, "metrics", metrics_json(ev->metrics));
        else if (ev->event_case == HP__V1__JOB_EVENT__EVENT_LOG && ev->log)
            json_object_set_new(
                o, "log", json_pack("{s:i, s:s}", "rank", ev->log->rank, "text", ev->log->text));
        print_json(o);
        if (ev->event_case == HP__V1__JOB_EVENT__EVENT_STATE) {
            w->last_state = ev->state;
            w->have_state = true;
        }
        return 0;
    }
    if (ev->event_case == HP__V1__JOB_EVENT__EVENT_STATE) {
        bool repeat = w->have_state && w->last_state == ev->state; /* after a reconnect */
        w->last_state = ev->state;
        w->have_state = true;
        if (state_final(ev->state)) {
            w->final_pending = true;
        } else if (!repeat) {
            if (w->line_open) fputc('\n', stdout);
            w->line_open = false;
            printf("%s %s\n", ev->job_id, state_name(ev->state));
        }
    } else if (ev->event_case == HP__V1__JOB_EVENT__EVENT_METRICS && ev->metrics) {
        const Hp__V1__StepMetrics *m = ev->metrics;
        if (m->rank > 0) return 0; /* one line per step: the job's (rank 0's) record */
        char eta[32];
        double left = (double)(w->total_steps - m->step);
        fmt_eta(w->total_steps > 0 ? left * m->step_time_s : NAN, eta, sizeof eta);
        char steps[48];
        if (w->total_steps > 0)
            snprintf(steps, sizeof steps, "%lld/%lld", (long long)m->step,
                     (long long)w->total_steps);
        else
            snprintf(steps, sizeof steps, "%lld", (long long)m->step);
        if (w->tty) {
            printf("\r\033[Kstep %s  loss %.4f  tps %.0f  mfu %.2f%%  eta %s", steps, m->loss,
                   m->tokens_per_s, m->mfu_pct, eta);
            w->line_open = true;
        } else {
            printf("step %s loss %.4f tps %.0f mfu %.2f%% eta %s\n", steps, m->loss,
                   m->tokens_per_s, m->mfu_pct, eta);
        }
        if (m->evaluated) { /* an evaluation after this step: its own line */
            if (w->line_open) fputc('\n', stdout);
            w->line_open = false;
            printf("eval after step %lld: loss %.4f\n", (long long)m->step, m->eval_loss);
        }
    } else if (ev->event_case == HP__V1__JOB_EVENT__EVENT_LOG && ev->log) {
        if (w->line_open) fputc('\n', stdout);
        w->line_open = false;
        printf("[rank %d] %s\n", ev->log->rank, ev->log->text);
    }
    fflush(stdout);
    return 0;
}

/* Watches id to the end; returns the exit code (0 SUCCEEDED, 1 otherwise). */
static int do_watch(const char *verb, hp_rpc_client *c, const char *id, int64_t from_step,
                    bool json) {
    hp_rpc_result r;
    watch_ctx w = {.json = json, .tty = isatty(STDOUT_FILENO), .rank = -2};
    Hp__V1__GetJobResponse *g = NULL;
    if (get_job(c, id, &g, &r) != 0) return rpc_fail(verb, &r);
    if (g->job) w.total_steps = g->job->total_steps;
    protobuf_c_message_free_unpacked(&g->base, NULL);
    Hp__V1__WatchJobRequest req = HP__V1__WATCH_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    req.from_step = from_step;
    req.batch = true; /* hp_rpc_watch unpacks batches: on_event sees single events */
    int code;
    /* A lost connection (the daemon restarting) is retried for WATCH_RECONNECT_S, resuming
     * after the last step seen, so that nothing is missed or repeated. */
    for (int tries = 0;; tries++) {
        w.got_event = false;
        code = hp_rpc_watch(c, &req, on_event, &w, &r);
        if (w.got_event) tries = 0;
        /* A stream that ends OK before the final state was ended by a stopping daemon. */
        if ((code != GRPC_STATUS_UNAVAILABLE && code != GRPC_STATUS_OK) ||
            (w.have_state && state_final(w.last_state)) || tries >= WATCH_RECONNECT_S)
            break;
        if (code == GRPC_STATUS_OK) snprintf(r.msg, sizeof r.msg, "the daemon ended the stream");
        if (tries == 0) {
            if (w.line_open) fputc('\n', stdout);
            w.line_open = false;
            fprintf(stderr, "hpctl: %s: connection lost (%s); reconnecting\n", verb, r.msg);
        }
        sleep(1);
        if (w.last_step > 0) req.from_step = w.last_step + 1;
    }
    if (w.line_open) fputc('\n', stdout);
    w.line_open = false;
    if (w.final_pending) printf("%s %s\n", id, state_name(w.last_state));
    fflush(stdout);
    if (code != 0) return rpc_fail(verb, &r);
    if (!w.have_state || !state_final(w.last_state)) {
        /* The stream ended without a final state: ask once more. */
        if (get_job(c, id, &g, &r) != 0) return rpc_fail(verb, &r);
        w.last_state = g->job ? g->job->state : HP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
        protobuf_c_message_free_unpacked(&g->base, NULL);
    }
    if (w.last_state == HP__V1__JOB_STATE__JOB_STATE_SUCCEEDED) return HPCTL_OK;
    if (!json) fprintf(stderr, "hpctl: %s: job %s ended %s\n", verb, id, state_name(w.last_state));
    return HPCTL_ERROR;
}

/* ---- verbs --------------------------------------------------------------------------------- */

int hpctl_submit(int argc, char **argv) {
    const char *verb = "submit";
    remote_opts o = {0};
    const char *path = NULL, *request_id = "";
    bool watch = false;
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, &o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        if (!strcmp(argv[i], "--watch")) {
            watch = true;
        } else if (!strcmp(argv[i], "--request-id") && i + 1 < argc) {
            request_id = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: hpctl submit JOB.pb [--watch] [--request-id ID] [--server HOST:PORT] "
                 "[--token T] [--tls-ca PEM] [--json]");
            return HPCTL_OK;
        } else if (argv[i][0] == '-' || path) {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) return hpctl_fail(HPCTL_USAGE, verb, "missing JOB.pb");
    uint8_t *data = NULL;
    size_t len = 0;
    hp_err err = {0};
    if (hp_file_read(path, SUBMIT_MAX_BYTES, &data, &len, &err) != HP_OK)
        return hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    Hp__V1__Job *job = hp__v1__job__unpack(NULL, len, data);
    if (!job) {
        hp_free(data);
        return hpctl_fail(HPCTL_ERROR, verb, "%s: not a job file (hp.v1.Job does not parse)", path);
    }
    hp__v1__job__free_unpacked(job, NULL);
    /* SubmitJobRequest { Job job = 1; string request_id = 2; } wrapped by hand: no re-pack. */
    size_t rid = strlen(request_id);
    uint8_t *req = hp_malloc(len + rid + 24);
    if (!req) {
        hp_free(data);
        return hpctl_fail(HPCTL_ERROR, verb, "out of memory");
    }
    size_t n = 0;
    req[n++] = 0x0a;
    for (uint64_t l = len;;) {
        uint8_t b = l & 0x7f;
        l >>= 7;
        req[n++] = b | (l ? 0x80 : 0);
        if (!l) break;
    }
    memcpy(req + n, data, len);
    n += len;
    hp_free(data);
    if (rid) {
        req[n++] = 0x12;
        for (uint64_t l = rid;;) {
            uint8_t b = l & 0x7f;
            l >>= 7;
            req[n++] = b | (l ? 0x80 : 0);
            if (!l) break;
        }
        memcpy(req + n, request_id, rid);
        n += rid;
    }
    hp_rpc_client *c;
    int rc = open_client(verb, &o, &c);
    if (rc) {
        hp_free(req);
        return rc;
    }
    hp_rpc_result r;
    Hp__V1__SubmitJobResponse *resp = NULL;
    hp_rpc_unary_raw(c, "/hp.v1.Coordinator/SubmitJob", req, n, true,
                     &hp__v1__submit_job_response__descriptor, (ProtobufCMessage **)&resp, &r);
    hp_free(req);
    if (r.code != 0) {
        rc = rpc_fail(verb, &r);
        hp_rpc_client_close(c);
        return rc;
    }
    char id[128] = "";
    if (resp->job) {
        snprintf(id, sizeof id, "%s", resp->job->id);
        if (o.json)
            print_json(job_json(resp->job));
        else
            printf("%s\n", resp->job->id);
        fflush(stdout);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    rc = HPCTL_OK;
    if (watch && id[0]) rc = do_watch(verb, c, id, 1, o.json);
    hp_rpc_client_close(c);
    return rc;
}

/* Parses "VERB ID [common flags]" for status and cancel. */
static int parse_id_verb(const char *verb, int argc, char **argv, remote_opts *o, const char **id,
                         const char **reason, bool *worker_cmd) {
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        if (reason && !strcmp(argv[i], "--reason") && i + 1 < argc) {
            *reason = argv[++i];
        } else if (worker_cmd && !strcmp(argv[i], "--worker-cmd")) {
            *worker_cmd = true;
        } else if (argv[i][0] == '-' || *id) {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", argv[i]);
        } else {
            *id = argv[i];
        }
    }
    if (!*id) return hpctl_fail(HPCTL_USAGE, verb, "missing job ID");
    return HPCTL_OK;
}

int hpctl_status(int argc, char **argv) {
    const char *verb = "status", *id = NULL;
    remote_opts o = {0};
    bool worker_cmd = false;
    int rc = parse_id_verb(verb, argc, argv, &o, &id, NULL, &worker_cmd);
    if (rc) return rc;
    hp_rpc_client *c;
    if ((rc = open_client(verb, &o, &c))) return rc;
    hp_rpc_result r;
    Hp__V1__GetJobResponse *g = NULL;
    if (worker_cmd) {
        /* the commands carry the attempt's worker token: an authenticated call */
        Hp__V1__GetJobRequest req = HP__V1__GET_JOB_REQUEST__INIT;
        req.job_id = (char *)id;
        req.worker_commands = true;
        if (hp_rpc_unary(c, "/hp.v1.Coordinator/GetJob", &req.base, true,
                         &hp__v1__get_job_response__descriptor, (ProtobufCMessage **)&g, &r) != 0) {
            rc = rpc_fail(verb, &r);
        } else if (o.json) {
            json_t *a = json_array();
            for (size_t i = 0; i < g->n_worker_commands; i++)
                json_array_append_new(a, json_string(g->worker_commands[i]));
            print_json(json_pack("{s:s, s:o}", "id", id, "worker_commands", a));
        } else {
            for (size_t i = 0; i < g->n_worker_commands; i++) printf("%s\n", g->worker_commands[i]);
        }
        if (g) protobuf_c_message_free_unpacked(&g->base, NULL);
        hp_rpc_client_close(c);
        return rc;
    }
    if (get_job(c, id, &g, &r) != 0) {
        rc = rpc_fail(verb, &r);
    } else {
        if (g->job) {
            if (o.json)
                print_json(job_json(g->job));
            else
                print_job(g->job);
        }
        protobuf_c_message_free_unpacked(&g->base, NULL);
    }
    hp_rpc_client_close(c);
    return rc;
}

/* A mutating call answered with {JobInfo job}: opens the client, calls, prints "ID STATE" (with
 * " step N" when step) or the job as JSON; the exit code. */
static int job_call(const char *verb, const remote_opts *o, const char *method,
                    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                    bool step) {
    hp_rpc_client *c;
    int rc = open_client(verb, o, &c);
    if (rc) return rc;
    hp_rpc_result r;
    ProtobufCMessage *resp = NULL;
    if (hp_rpc_unary(c, method, req, true, resp_desc, &resp, &r) != 0) {
        rc = rpc_fail(verb, &r);
    } else {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(resp_desc, "job");
        const Hp__V1__JobInfo *job =
            f ? *(Hp__V1__JobInfo *const *)((const char *)resp + f->offset) : NULL;
        if (job && o->json)
            print_json(job_json(job));
        else if (job && step)
            printf("%s %s step %lld\n", job->id, state_name(job->state), (long long)job->step);
        else if (job)
            printf("%s %s\n", job->id, state_name(job->state));
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    hp_rpc_client_close(c);
    return rc;
}

int hpctl_cancel(int argc, char **argv) {
    const char *verb = "cancel", *id = NULL, *reason = "cancelled with hpctl";
    remote_opts o = {0};
    int rc = parse_id_verb(verb, argc, argv, &o, &id, &reason, NULL);
    if (rc) return rc;
    Hp__V1__CancelJobRequest req = HP__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    req.reason = (char *)reason;
    return job_call(verb, &o, "/hp.v1.Coordinator/CancelJob", &req.base,
                    &hp__v1__cancel_job_response__descriptor, false);
}

int hpctl_list(int argc, char **argv) {
    const char *verb = "list";
    remote_opts o = {0};
    Hp__V1__JobState states[16];
    size_t n_states = 0;
    int64_t page_size = 0;
    const char *token = "";
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, &o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        if (!strcmp(argv[i], "--state") && i + 1 < argc) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (n_states == HP_ARRAY_LEN(states))
                    return hpctl_fail(HPCTL_USAGE, verb, "--state: too many states");
                if (parse_state(t, &states[n_states]))
                    return hpctl_fail(HPCTL_USAGE, verb,
                                      "--state: unknown state '%s' (QUEUED, COMPILING, "
                                      "LAUNCHING, RUNNING, RESTARTING, SUCCEEDED, FAILED, "
                                      "CANCELLED)",
                                      t);
                n_states++;
            }
        } else if (!strcmp(argv[i], "--page-size") && i + 1 < argc) {
            int rc = hpctl_parse_i64(verb, "--page-size", argv[++i], 1, 1000, &page_size);
            if (rc) return rc;
        } else if (!strcmp(argv[i], "--page-token") && i + 1 < argc) {
            token = argv[++i];
        } else {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", argv[i]);
        }
    }
    hp_rpc_client *c;
    int rc = open_client(verb, &o, &c);
    if (rc) return rc;
    Hp__V1__ListJobsRequest req = HP__V1__LIST_JOBS_REQUEST__INIT;
    req.n_states = n_states;
    req.states = states;
    req.page_size = (int32_t)page_size;
    req.page_token = (char *)token;
    hp_rpc_result r;
    Hp__V1__ListJobsResponse *resp = NULL;
    if (hp_rpc_unary(c, "/hp.v1.Coordinator/ListJobs", &req.base, true,
                     &hp__v1__list_jobs_response__descriptor, (ProtobufCMessage **)&resp,
                     &r) != 0) {
        rc = rpc_fail(verb, &r);
        hp_rpc_client_close(c);
        return rc;
    }
    if (o.json) {
        json_t *arr = json_array();
        for (size_t k = 0; k < resp->n_jobs; k++)
            json_array_append_new(arr, job_json(resp->jobs[k]));
        print_json(json_pack("{s:o, s:s}", "jobs", arr, "next_page_token",
                             resp->next_page_token ? resp->next_page_token : ""));
    } else {
        printf("%-20s %-24s %-10s %5s %13s %s\n", "ID", "NAME", "STATE", "WORLD", "STEP",
               "CREATED");
        for (size_t k = 0; k < resp->n_jobs; k++) {
            const Hp__V1__JobInfo *j = resp->jobs[k];
            char when[32] = "-", steps[40];
            time_t t = (time_t)j->created_unix_s;
            struct tm tm;
            if (t > 0 && localtime_r(&t, &tm))
                strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
            snprintf(steps, sizeof steps, "%lld/%lld", (long long)j->step,
                     (long long)j->total_steps);
            printf("%-20s %-24s %-10s %5d %13s %s\n", j->id, j->name, state_name(j->state),
                   j->world_size, steps, when);
        }
        if (resp->next_page_token && *resp->next_page_token)
            printf("(more: --page-token %s)\n", resp->next_page_token);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    hp_rpc_client_close(c);
    return HPCTL_OK;
}

int hpctl_watch(int argc, char **argv) {
    const char *verb = "watch", *id = NULL;
    remote_opts o = {0};
    int64_t from = 1;
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, &o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        if (!strcmp(argv[i], "--from-step") && i + 1 < argc) {
            int rc = hpctl_parse_i64(verb, "--from-step", argv[++i], 0, INT64_MAX, &from);
            if (rc) return rc;
        } else if (argv[i][0] == '-' || id) {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", argv[i]);
        } else {
            id = argv[i];
        }
    }
    if (!id) return hpctl_fail(HPCTL_USAGE, verb, "missing job ID");
    hp_rpc_client *c;
    int rc = open_client(verb, &o, &c);
    if (rc) return rc;
    rc = do_watch(verb, c, id, from, o.json);
    hp_rpc_client_close(c);
    return rc;
}

/* Copies the complete lines from f to stdout (--json: {"rank":R,"text":LINE} each). A last
 * line without '\n' is printed only when all is set; otherwise it is left for the next call. */
static void copy_lines(FILE *f, int rank, bool json, bool all) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        bool whole = line[n - 1] == '\n';
        if (!whole && !all) {
            fseek(f, -(long)n, SEEK_CUR);
            break;
        }
        if (whole) line[--n] = 0;
        if (json)
            print_json(json_pack("{s:i, s:s}", "rank", rank, "text", line));
        else
            printf("%s\n", line);
    }
    free(line);
    clearerr(f);
    fflush(stdout);
}

int hpctl_logs(int argc, char **argv) {
    const char *verb = "logs", *id = NULL;
    remote_opts o = {0};
    int64_t rank = 0;
    bool follow = false;
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, &o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            int rc = hpctl_parse_i64(verb, "--rank", argv[++i], 0, 1 << 20, &rank);
            if (rc) return rc;
        } else if (!strcmp(argv[i], "--follow") || !strcmp(argv[i], "-f")) {
            follow = true;
        } else if (argv[i][0] == '-' || id) {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", argv[i]);
        } else {
            id = argv[i];
        }
    }
    if (!id) return hpctl_fail(HPCTL_USAGE, verb, "missing job ID");
    if (strchr(id, '/') || !strcmp(id, "..") || !strcmp(id, "."))
        return hpctl_fail(HPCTL_USAGE, verb, "'%s' is not a job ID", id);
    char dir[4096], path[4400];
    hp_err err = {0};
    if (hp_rpc_state_dir(dir, sizeof dir, &err) != HP_OK)
        return hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    snprintf(path, sizeof path, "%s/jobs/%s/rank-%lld.log", dir, id, (long long)rank);
    FILE *f = NULL;
    int lfd;
    if (hp_file_open_read(path, &lfd, NULL, &err) == HP_OK) {
        if (!(f = fdopen(lfd, "rb"))) close(lfd);
    } else if (access(path, F_OK) == 0) { /* there but not readable, or a fifo: say so */
        return hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    }
    if (!f && !follow)
        return hpctl_fail(HPCTL_ERROR, verb,
                          "%s: no such file (logs are read from the daemon's state dir: run "
                          "where hpd runs, set HP_STATE_DIR, or use --follow to stream live "
                          "lines)",
                          path);
    hp_rpc_client *c = NULL;
    int rc;
    if (follow && (rc = open_client(verb, &o, &c))) {
        if (f) fclose(f);
        return rc;
    }
    if (!f) { /* live lines over WatchJob(logs=true) */
        watch_ctx w = {.logs_only = true, .json = o.json, .rank = (int)rank};
        Hp__V1__WatchJobRequest req = HP__V1__WATCH_JOB_REQUEST__INIT;
        req.job_id = (char *)id;
        req.logs = true;
        req.batch = true;
        hp_rpc_result r;
        rc = hp_rpc_watch(c, &req, on_event, &w, &r) ? rpc_fail(verb, &r) : HPCTL_OK;
        hp_rpc_client_close(c);
        return rc;
    }
    rc = HPCTL_OK;
    for (;;) {
        copy_lines(f, (int)rank, o.json, !follow);
        if (!follow) break;
        hp_rpc_result r;
        Hp__V1__GetJobResponse *g = NULL;
        if (get_job(c, id, &g, &r) != 0) {
            rc = rpc_fail(verb, &r);
            break;
        }
        bool final = g->job && state_final(g->job->state);
        protobuf_c_message_free_unpacked(&g->base, NULL);
        if (final) { /* one last read for what came before the final state */
            copy_lines(f, (int)rank, o.json, true);
            break;
        }
        usleep(250 * 1000);
    }
    fclose(f);
    if (c) hp_rpc_client_close(c);
    return rc;
}

/* ---- trace, checkpoint ------------------------------------------------------------------- */

#define TRACE_MAX_RANKS 1024

int hpctl_trace(int argc, char **argv) {
    const char *verb = "trace", *id = NULL, *out = NULL;
    remote_opts o = {0};
    int64_t step = -1;
    int32_t ranks[TRACE_MAX_RANKS];
    size_t n_ranks = 0;
    for (int i = 1; i < argc; i++) {
        int cf = common_flag(verb, argc, argv, &i, &o);
        if (cf > 100) return cf - 100;
        if (cf == 1) continue;
        const char *a = argv[i];
        bool takes = !strcmp(a, "--step") || !strcmp(a, "--rank") || !strcmp(a, "-o") ||
                     !strcmp(a, "--output");
        if (takes && i + 1 >= argc) return hpctl_fail(HPCTL_USAGE, verb, "%s needs a value", a);
        if (!strcmp(a, "--step")) {
            int rc = hpctl_parse_i64(verb, "--step", argv[++i], 0, INT64_MAX, &step);
            if (rc) return rc;
        } else if (!strcmp(a, "--rank")) {
            int64_t r;
            int rc = hpctl_parse_i64(verb, "--rank", argv[++i], 0, 1 << 20, &r);
            if (rc) return rc;
            if (n_ranks == TRACE_MAX_RANKS)
                return hpctl_fail(HPCTL_USAGE, verb, "--rank: more than %d ranks", TRACE_MAX_RANKS);
            ranks[n_ranks++] = (int32_t)r;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = argv[++i];
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: hpctl trace ID --step S [--rank R ...] [-o FILE] [--server HOST:PORT] "
                 "[--tls-ca PEM] [--json]\n"
                 "writes the Chrome trace (chrome://tracing, ui.perfetto.dev) of a profiled "
                 "step, the ranks merged, to FILE (default ID-step-S.trace.json)");
            return HPCTL_OK;
        } else if (a[0] == '-' || id) {
            return hpctl_fail(HPCTL_USAGE, verb, "unexpected argument '%s'", a);
        } else {
            id = a;
        }
    }
    if (!id) return hpctl_fail(HPCTL_USAGE, verb, "missing job ID");
    if (step < 0) return hpctl_fail(HPCTL_USAGE, verb, "missing --step S");
    if (strchr(id, '/') || !strcmp(id, "..") || !strcmp(id, "."))
        return hpctl_fail(HPCTL_USAGE, verb, "'%s' is not a job ID", id);
    char def[512];
    if (!out) {
        snprintf(def, sizeof def, "%s-step-%lld.trace.json", id, (long long)step);
        out = def;
    }
    hp_rpc_client *c;
    int rc = open_client(verb, &o, &c);
    if (rc) return rc;
    Hp__V1__GetTraceRequest req = HP__V1__GET_TRACE_REQUEST__INIT;
    req.job_id = (char *)id;
    req.step = step;
    req.n_ranks = n_ranks;
    req.ranks = ranks;
    hp_rpc_result r;
    Hp__V1__GetTraceResponse *resp = NULL;
    if (hp_rpc_unary(c, "/hp.v1.Coordinator/GetTrace", &req.base, true,
                     &hp__v1__get_trace_response__descriptor, (ProtobufCMessage **)&resp,
                     &r) != 0) {
        /* NOT_FOUND for a step without a trace: the server's message lists the traced steps. */
        rc = rpc_fail(verb, &r);
        hp_rpc_client_close(c);
        return rc;
    }
    hp_rpc_client_close(c);
    hp_err we = {0}; /* atomic: a failed write never leaves half a trace under `out` */
    if (hp_file_write_atomic(out, resp->chrome_json.data, resp->chrome_json.len, &we) != HP_OK) {
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        return hpctl_fail(HPCTL_ERROR, verb, "cannot write the trace: %s", we.msg);
    }
    if (o.json) {
        json_t *steps = json_array();
        for (size_t k = 0; k < resp->n_steps; k++)
            json_array_append_new(steps, json_integer((json_int_t)resp->steps[k]));
        print_json(json_pack("{s:s, s:s, s:I, s:I, s:o}", "job_id", id, "path", out, "step",
                             (json_int_t)step, "bytes", (json_int_t)resp->chrome_json.len, "steps",
                             steps));
    } else {
        printf("%s\n", out);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return HPCTL_OK;
}

int hpctl_checkpoint(int argc, char **argv) {
    const char *verb = "checkpoint", *id = NULL;
    remote_opts o = {0};
    int rc = parse_id_verb(verb, argc, argv, &o, &id, NULL, NULL);
    if (rc) return rc;
    Hp__V1__CheckpointJobRequest req = HP__V1__CHECKPOINT_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    return job_call(verb, &o, "/hp.v1.Coordinator/CheckpointJob", &req.base,
                    &hp__v1__checkpoint_job_response__descriptor, true);
}
