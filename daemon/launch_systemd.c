/* daemon/launch_systemd.c — the systemd launcher: each rank of an attempt is a transient
 * service hp-JOB-ATTEMPT-RANK.service started with `systemd-run` (one command per rank, all in
 * flight at once, none blocking the loop). The unit keeps its exit status after its process
 * ended (RemainAfterExit=yes: "active (exited)", or "failed"), so that a poll that comes late,
 * or a restarted hpd, still reads it. The token goes in as a credential (LoadCredential=, the
 * worker reads ${CREDENTIALS_DIRECTORY}/hp-token) or, with systemd-token = file, as the 0600
 * file's path in $HP_TOKEN_FILE; never on a command line.
 *
 * State: every poll_ms one `systemctl show -p Id,LoadState,... UNIT...` for every started unit
 * of every tracked attempt; a unit whose main process ended → HPD_LEV_EXIT with its own exit
 * status (128 + signal when killed); a unit the manager does not know on two polls → its rank
 * ends with HPD_EXIT_UNKNOWN. A systemd-run that fails → HPD_LEV_LOST (the other ranks are
 * killed and reported as they end). stop() is `systemctl kill --signal=SIG`; once every rank of
 * an attempt is reported its units are removed: `systemctl stop` and `reset-failed`.
 *
 * Lifetimes: an sdjob lives from start (or adopt) until its last rank is reported and none of
 * its systemd-run commands is in flight. Commands hold the loop alive (the poll timer does
 * not), so when the loop has run dry none is in flight and free only drops the sdjobs.
 */
#include "daemon/core.h" /* hp__log */
#include "daemon/launch.h"
#include "daemon/launch_cmd.h"
#include "daemon/launch_systemd.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD_TIMEOUT_MS 30000
#define CMD_MAX_OUT    (1u << 20)
#define WORLD_MAX      4096 /* ranks one attempt may have as units (a show lists them all) */

/* ---- the pure pieces (launch_systemd.h) ---------------------------------------------------- */
hp_status hpd__sd_unit_name(const char *job_id, int attempt, int rank, char *out, size_t len,
                            hp_err *err) {
    if (!job_id[0]) return hp_errf(err, HP_INVALID, "an empty job id cannot name a unit");
    for (const char *p = job_id; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.' && *p != '-')
            return hp_errf(err, HP_INVALID,
                           "job id '%.64s' has a byte (0x%02x) a systemd unit name cannot hold",
                           job_id, (unsigned char)*p);
    int n = rank < 0 ? snprintf(out, len, "hp-%s-%d", job_id, attempt)
                     : snprintf(out, len, "hp-%s-%d-%d.service", job_id, attempt, rank);
    /* the prefix "hp-JOB-ATTEMPT" is at most 100 bytes: room for "-RANK.service" */
    if (n < 0 || (size_t)n >= len || (size_t)n >= HPD_SD_UNIT_MAX || strlen(job_id) > 80)
        return hp_errf(err, HP_INVALID, "job id '%.64s': the unit name is too long", job_id);
    return HP_OK;
}

/* Appends one argument printf'd into out's store. */
static bool add(hpd__sd_argv *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool add(hpd__sd_argv *out, const char *fmt, ...) {
    if (out->argc + 1 >= (int)HP_ARRAY_LEN(out->argv)) return false;
    size_t room = sizeof out->store - out->used;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out->store + out->used, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room) return false;
    out->argv[out->argc++] = out->store + out->used;
    out->argv[out->argc] = NULL;
    out->used += (size_t)n + 1;
    return true;
}

/* A value that goes into a unit property or onto ExecStart verbatim: no control bytes (a
 * newline would end the property), no '$' or '%' (the manager expands those), bounded. */
static bool plain(const char *v) {
    if (strlen(v) > 4000) return false;
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '$' || *p == '%') return false;
    return true;
}

hp_status hpd__sd_run_argv(const hpd__sd_conf *c, const hpd_attempt_spec *a, int rank,
                           hpd__sd_argv *out, hp_err *err) {
    memset(out, 0, sizeof *out);
    char unit[HPD_SD_UNIT_MAX];
    HP_TRY(hpd__sd_unit_name(a->job_id, a->attempt, rank, unit, sizeof unit, err));
    if (rank < 0 || rank >= a->world)
        return hp_errf(err, HP_INVALID, "rank %d out of range [0, %d)", rank, a->world);
    const struct {
        const char *what, *v;
    } vals[] = {{"the coordinator address", a->coordinator},
                {"the job dir", a->job_dir},
                {"the attempt dir", a->attempt_dir},
                {"the token file", a->token_file},
                {"the worker path", c->worker},
                {"the slice", c->slice ? c->slice : ""}};
    for (size_t i = 0; i < HP_ARRAY_LEN(vals); i++)
        if (!plain(vals[i].v))
            return hp_errf(err, HP_INVALID,
                           "job %s: %s '%.200s' cannot go into a systemd unit (a control "
                           "byte, '$' or '%%', or longer than 4000 bytes)",
                           a->job_id, vals[i].what, vals[i].v);
    bool ok = add(out, "%s", c->systemd_run);
    if (c->user) ok = ok && add(out, "--user");
    ok = ok && add(out, "--unit=%s", unit) && add(out, "--no-ask-password") &&
         add(out, "--description=hp job %s attempt %d rank %d", a->job_id, a->attempt, rank) &&
         /* exec: systemd-run fails when the worker cannot be executed */
         add(out, "--property=Type=exec") &&
         /* the exit status stays readable until hpd has it (then it stops the unit) */
         add(out, "--property=RemainAfterExit=yes") &&
         add(out, "--property=KillMode=control-group") &&
         add(out, "--property=TimeoutStopSec=20s") &&
         add(out, "--property=WorkingDirectory=%s", a->attempt_dir) &&
         add(out, "--property=StandardOutput=append:%s/rank-%d.log", a->job_dir, rank) &&
         add(out, "--property=StandardError=append:%s/rank-%d.log", a->job_dir, rank);
    if (c->slice && c->slice[0]) ok = ok && add(out, "--property=Slice=%s", c->slice);
    if (c->token_file)
        ok = ok && add(out, "--setenv=HP_TOKEN_FILE=%s", a->token_file);
    else
        ok = ok && add(out, "--property=LoadCredential=hp-token:%s", a->token_file);
    ok = ok && add(out, "%s", c->worker) && add(out, "--coordinator") &&
         add(out, "%s", a->coordinator) && add(out, "--job") && add(out, "%s", a->job_id) &&
         add(out, "--rank") && add(out, "%d", rank);
    if (!c->token_file)
        ok = ok && add(out, "--token-file") && add(out, "${CREDENTIALS_DIRECTORY}/hp-token");
    if (!ok)
        return hp_errf(err, HP_INVALID, "job %s: the systemd-run command is too long", a->job_id);
    return HP_OK;
}

static bool parse_num(const char *v, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < INT_MIN || x > INT_MAX) return false;
    *out = (int)x;
    return true;
}

hp_status hpd__sd_parse_show(const char *text, size_t len, hpd__sd_unit *out, int max, int *n,
                             hp_err *err) {
    *n = 0;
    if (memchr(text, 0, len)) return hp_errf(err, HP_INVALID, "systemctl show: a NUL byte");
    bool in_block = false;
    const char *p = text, *end = text + len;
    for (int line = 1; p <= end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        bool last = !nl;
        if (e > p && e[-1] == '\r') e--;
        if (e == p) { /* a blank line (or the end) ends a block */
            if (in_block && !out[*n - 1].id[0])
                return hp_errf(err, HP_INVALID,
                               "systemctl show: line %d: a unit without Id=", line);
            in_block = false;
            if (last) break;
            p = nl + 1;
            continue;
        }
        const char *eq = memchr(p, '=', (size_t)(e - p));
        if (!eq)
            return hp_errf(err, HP_INVALID, "systemctl show: line %d: '%.*s' is not KEY=VALUE",
                           line, (int)(e - p > 80 ? 80 : e - p), p);
        if (!in_block) {
            if (*n >= max)
                return hp_errf(err, HP_INVALID, "systemctl show: more than %d units", max);
            memset(&out[*n], 0, sizeof out[*n]);
            (*n)++;
            in_block = true;
        }
        hpd__sd_unit *u = &out[*n - 1];
        char key[32], val[HPD_SD_UNIT_MAX];
        size_t kl = (size_t)(eq - p), vl = (size_t)(e - eq - 1);
        if (kl == 0 || kl >= sizeof key)
            return hp_errf(err, HP_INVALID, "systemctl show: line %d: a bad key", line);
        memcpy(key, p, kl);
        key[kl] = 0;
        struct {
            const char *key;
            char *dst;
            size_t cap;
        } strs[] = {{"Id", u->id, sizeof u->id},
                    {"LoadState", u->load, sizeof u->load},
                    {"ActiveState", u->active, sizeof u->active},
                    {"SubState", u->sub, sizeof u->sub},
                    {"Result", u->result, sizeof u->result}};
        bool known = false;
        for (size_t i = 0; i < HP_ARRAY_LEN(strs) && !known; i++) {
            if (strcmp(key, strs[i].key) != 0) continue;
            known = true;
            if (vl >= strs[i].cap)
                return hp_errf(err, HP_INVALID, "systemctl show: line %d: %s: longer than %zu",
                               line, key, strs[i].cap - 1);
            memcpy(strs[i].dst, eq + 1, vl);
            strs[i].dst[vl] = 0;
        }
        if (!known && (!strcmp(key, "ExecMainCode") || !strcmp(key, "ExecMainStatus"))) {
            if (vl >= sizeof val)
                return hp_errf(err, HP_INVALID, "systemctl show: line %d: %s: not a number", line,
                               key);
            memcpy(val, eq + 1, vl);
            val[vl] = 0;
            int x;
            if (!parse_num(val, &x) || x < 0 || x > 255)
                return hp_errf(err, HP_INVALID,
                               "systemctl show: line %d: %s: '%.40s' is not a number in [0, 255]",
                               line, key, val);
            if (key[8] == 'C')
                u->main_code = x;
            else
                u->main_status = x;
        }
        if (last) {
            if (!u->id[0])
                return hp_errf(err, HP_INVALID,
                               "systemctl show: line %d: a unit without Id=", line);
            break;
        }
        p = nl + 1;
    }
    return HP_OK;
}

hpd__sd_phase hpd__sd_unit_phase(const hpd__sd_unit *u, int *status) {
    *status = HPD_EXIT_UNKNOWN;
    bool has_exit = u->main_code >= 1 && u->main_code <= 3;
    if (has_exit) *status = u->main_code == 1 ? u->main_status : 128 + u->main_status;
    if (!strcmp(u->load, "not-found") || (!u->load[0] && !u->active[0])) return HPD_SD_GONE;
    if (!strcmp(u->active, "failed")) return HPD_SD_ENDED;
    if (!strcmp(u->active, "active") && !strcmp(u->sub, "exited")) return HPD_SD_ENDED;
    if (!strcmp(u->active, "inactive")) return has_exit ? HPD_SD_ENDED : HPD_SD_GONE;
    return HPD_SD_RUNNING; /* active running, activating, deactivating, reloading */
}

/* ---- the launcher -------------------------------------------------------------------------- */
typedef struct sdjob {
    struct sdjob *next;
    uint64_t serial;
    char job_id[64];
    int attempt, world;
    char prefix[HPD_SD_UNIT_MAX]; /* hp-JOB-ATTEMPT: the ref */
    bool *started;                /* [world] systemd-run succeeded (or adopted) */
    bool *reported;               /* [world] exit reported */
    unsigned char *misses;        /* [world] polls that did not find the unit */
    int n_reported;
    int in_flight; /* systemd-run commands not yet answered */
    int unstarted; /* ranks from this one on could not be started (-1: none) */
    char unstarted_why[300];
    int pending_sig;
    bool ref_sent, lost, cleaned;
} sdjob;

typedef struct sd {
    hpd_launcher base;
    uv_loop_t *loop;
    char worker[PATH_MAX];
    char systemd_run[PATH_MAX], systemctl[PATH_MAX];
    char slice[128];
    bool user, token_file;
    int poll_ms;
    uv_timer_t timer;
    bool polling;
    sdjob *jobs;
    uint64_t serial;
} sd;

static void emit(sd *s, sdjob *j, hpd_launch_event_kind kind, int rank, int status,
                 const char *text) {
    hpd_launch_event ev = {.kind = kind,
                           .job_id = j->job_id,
                           .attempt = j->attempt,
                           .rank = rank,
                           .status = status,
                           .text = text};
    if (s->base.on_event) s->base.on_event(s->base.ctx, &ev);
}

static sdjob *find(sd *s, const char *job_id, int attempt) {
    for (sdjob *j = s->jobs; j; j = j->next)
        if (j->attempt == attempt && strcmp(j->job_id, job_id) == 0) return j;
    return NULL;
}

static sdjob *find_serial(sd *s, uint64_t serial) {
    for (sdjob *j = s->jobs; j; j = j->next)
        if (j->serial == serial) return j;
    return NULL;
}

static void sdjob_free(sd *s, sdjob *j) {
    for (sdjob **p = &s->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    hp_free(j->started);
    hp_free(j->reported);
    hp_free(j->misses);
    hp_free(j);
}

static sdjob *sdjob_new(sd *s, const char *job_id, int attempt, int world, const char *prefix) {
    sdjob *j = hp_calloc(1, sizeof *j);
    if (!j) return NULL;
    j->started = hp_calloc((size_t)world, sizeof *j->started);
    j->reported = hp_calloc((size_t)world, sizeof *j->reported);
    j->misses = hp_calloc((size_t)world, sizeof *j->misses);
    if (!j->started || !j->reported || !j->misses) {
        hp_free(j->started);
        hp_free(j->reported);
        hp_free(j->misses);
        hp_free(j);
        return NULL;
    }
    snprintf(j->job_id, sizeof j->job_id, "%s", job_id);
    snprintf(j->prefix, sizeof j->prefix, "%s", prefix);
    j->attempt = attempt;
    j->world = world;
    j->unstarted = -1;
    j->serial = ++s->serial;
    j->next = s->jobs;
    s->jobs = j;
    return j;
}

/* Rank r's unit name into out (HPD_SD_UNIT_MAX bytes); the prefix was checked to leave room. */
static void unit_of(const sdjob *j, int r, char *out) {
    snprintf(out, HPD_SD_UNIT_MAX, "%.100s-%d.service", j->prefix, r);
}

static void first_line(const hpd_cmd_result *r, char *out, size_t len) {
    const char *t = r->err_len ? r->err : r->out;
    size_t n = strcspn(t, "\n");
    snprintf(out, len, "%.*s", (int)(n < 300 ? n : 300), t);
    for (char *p = out; *p; p++)
        if (*p == '"' || (unsigned char)*p < 0x20) *p = '\'';
}

typedef struct cmd_ctx {
    sd *s;
    uint64_t serial;
    int rank;
    char what[16]; /* "kill", "cleanup" */
    char job_id[64];
    int attempt;
} cmd_ctx;

static void on_systemctl(void *ctx, const hpd_cmd_result *r) {
    cmd_ctx *c = ctx;
    if (r->status != 0 || r->error) {
        char why[320];
        first_line(r, why, sizeof why);
        hp__log("warn", "event=systemctl_failed what=%s job=%s attempt=%d status=%d error=\"%s\"",
                c->what, c->job_id, c->attempt, r->status, r->error ? r->error : why);
    }
    hp_free(c);
}

/* `systemctl [--user] ARGS... -- UNIT...` for j's units: rank `only`, or (only < 0) every
 * started rank not yet reported. */
static void systemctl(sd *s, sdjob *j, const char *what, const char *const *args, int only) {
    char **argv = hp_calloc((size_t)j->world + 12, sizeof *argv);
    char *names = hp_calloc((size_t)j->world, HPD_SD_UNIT_MAX);
    cmd_ctx *c = hp_calloc(1, sizeof *c);
    int n = 0, units = 0;
    if (!argv || !names || !c) {
        hp__log("error", "event=systemctl_failed what=%s job=%s error=\"out of memory\"", what,
                j->job_id);
        goto out;
    }
    argv[n++] = s->systemctl;
    if (s->user) argv[n++] = "--user";
    for (; *args; args++) argv[n++] = (char *)*args;
    argv[n++] = "--";
    for (int r = 0; r < j->world; r++) {
        if (only >= 0 ? r != only : !j->started[r] || j->reported[r]) continue;
        char *u = names + (size_t)r * HPD_SD_UNIT_MAX;
        unit_of(j, r, u);
        argv[n++] = u;
        units++;
    }
    argv[n] = NULL;
    if (!units) goto out;
    c->s = s;
    snprintf(c->what, sizeof c->what, "%s", what);
    snprintf(c->job_id, sizeof c->job_id, "%s", j->job_id);
    c->attempt = j->attempt;
    hp_err e = {0};
    if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 4096, on_systemctl, c, &e) != HP_OK) {
        hp__log("error", "event=systemctl_failed what=%s job=%s error=\"%s\"", what, j->job_id,
                e.msg);
        goto out;
    }
    c = NULL;
    hp__log("info", "event=systemctl what=%s job=%s attempt=%d units=%d", what, j->job_id,
            j->attempt, units);
out:
    hp_free(c);
    hp_free(names);
    hp_free(argv);
}

static void kill_units(sd *s, sdjob *j, int sig, int only) {
    const char *args[] = {"kill", sig == SIGKILL ? "--signal=SIGKILL" : "--signal=SIGTERM", NULL};
    systemctl(s, j, "kill", args, only);
}

/* Once every rank is reported and no systemd-run is in flight: remove the units (stop the
 * "active (exited)" ones, reset the failed ones) and forget the attempt. */
static void maybe_done(sd *s, sdjob *j) {
    if (j->n_reported < j->world || j->in_flight) return;
    /* One command: stop, then reset-failed (which fails for units that are not failed). */
    char **argv = hp_calloc((size_t)j->world + 10, sizeof *argv);
    char *names = hp_calloc((size_t)j->world, HPD_SD_UNIT_MAX);
    cmd_ctx *c = hp_calloc(1, sizeof *c);
    if (argv && names && c) {
        int n = 0;
        argv[n++] = "/bin/sh";
        argv[n++] = "-c";
        argv[n++] = "sc=$1 scope=$2; shift 2; \"$sc\" \"$scope\" stop -- \"$@\"; rc=$?; "
                    "\"$sc\" \"$scope\" reset-failed -- \"$@\" 2>/dev/null; exit $rc";
        argv[n++] = "hp-systemd-cleanup";
        argv[n++] = s->systemctl;
        argv[n++] = s->user ? "--user" : "--system";
        for (int r = 0; r < j->world; r++) {
            char *u = names + (size_t)r * HPD_SD_UNIT_MAX;
            unit_of(j, r, u);
            argv[n++] = u;
        }
        argv[n] = NULL;
        c->s = s;
        snprintf(c->what, sizeof c->what, "cleanup");
        snprintf(c->job_id, sizeof c->job_id, "%s", j->job_id);
        c->attempt = j->attempt;
        hp_err e = {0};
        if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, 4096, on_systemctl, c, &e) == HP_OK) {
            c = NULL;
            hp__log("info", "event=systemd_cleanup job=%s attempt=%d units=%d", j->job_id,
                    j->attempt, j->world);
        } else {
            hp__log("warn", "event=systemd_cleanup_failed job=%s error=\"%s\"", j->job_id, e.msg);
        }
    }
    hp_free(c);
    hp_free(names);
    hp_free(argv);
    sdjob_free(s, j);
}

static void report(sd *s, sdjob *j, int rank, int status) {
    if (j->reported[rank]) return;
    j->reported[rank] = true;
    j->n_reported++;
    emit(s, j, HPD_LEV_EXIT, rank, status, NULL);
}

static void on_run(void *ctx, const hpd_cmd_result *r) {
    cmd_ctx *c = ctx;
    sd *s = c->s;
    sdjob *j = find_serial(s, c->serial);
    int rank = c->rank;
    hp_free(c);
    if (!j) return;
    j->in_flight--;
    if (j->unstarted >= 0 && !j->lost) { /* start() could not start them all: say so now */
        j->lost = true;
        j->pending_sig = SIGKILL;
        emit(s, j, HPD_LEV_LOST, -1, 0, j->unstarted_why);
    }
    if (j->unstarted >= 0) {
        for (int k = j->unstarted; k < j->world; k++) report(s, j, k, HPD_EXIT_UNKNOWN);
        j->unstarted = -1;
    }
    if (!r->error && r->status == 0) {
        j->started[rank] = true;
        if (!j->ref_sent) {
            j->ref_sent = true;
            emit(s, j, HPD_LEV_REF, -1, 0, j->prefix);
        }
        /* a stop() that came while it was being started */
        if (j->pending_sig) kill_units(s, j, j->pending_sig, rank);
        if (!j->in_flight && !j->lost) {
            char st[64];
            snprintf(st, sizeof st, "RUNNING (%d units)", j->world);
            emit(s, j, HPD_LEV_STATE, -1, 0, st);
        }
    } else {
        char line[320], why[400];
        first_line(r, line, sizeof line);
        snprintf(why, sizeof why, "systemd-run rank %d: %s: %s", rank,
                 r->error ? r->error : "failed", line[0] ? line : "(no output)");
        hp__log("warn", "event=systemd_run_failed job=%s attempt=%d rank=%d status=%d error=\"%s\"",
                j->job_id, j->attempt, rank, r->status, why);
        if (!j->lost) {
            j->lost = true;
            j->pending_sig = SIGKILL; /* the ranks still being started */
            emit(s, j, HPD_LEV_LOST, -1, 0, why);
            kill_units(s, j, SIGKILL, -1);
        }
        report(s, j, rank, HPD_EXIT_UNKNOWN);
    }
    maybe_done(s, j);
}

static hp_status sd_start(hpd_launcher *base, const hpd_attempt_spec *a, hp_err *err) {
    sd *s = (sd *)base;
    if (a->world < 1 || a->world > WORLD_MAX)
        return hp_errf(err, HP_INVALID, "job %s: world %d: the systemd launcher takes [1, %d]",
                       a->job_id, a->world, WORLD_MAX);
    if (find(s, a->job_id, a->attempt))
        return hp_errf(err, HP_INVALID, "job %s attempt %d is already launched", a->job_id,
                       a->attempt);
    char prefix[HPD_SD_UNIT_MAX];
    HP_TRY(hpd__sd_unit_name(a->job_id, a->attempt, -1, prefix, sizeof prefix, err));
    hpd__sd_conf conf = {.systemd_run = s->systemd_run,
                         .worker = s->worker,
                         .user = s->user,
                         .token_file = s->token_file,
                         .slice = s->slice};
    hpd__sd_argv *cmd = hp_malloc(sizeof *cmd);
    if (!cmd) return hp_errf(err, HP_NOMEM, "out of memory");
    /* Build every command line first: a bad value fails the start before anything runs. */
    for (int r = 0; r < a->world; r++) {
        hp_status st = hpd__sd_run_argv(&conf, a, r, cmd, err);
        if (st != HP_OK) {
            hp_free(cmd);
            return st;
        }
    }
    sdjob *j = sdjob_new(s, a->job_id, a->attempt, a->world, prefix);
    if (!j) {
        hp_free(cmd);
        return hp_errf(err, HP_NOMEM, "out of memory");
    }
    hp_status st = HP_OK;
    for (int r = 0; r < a->world; r++) {
        cmd_ctx *c = hp_calloc(1, sizeof *c);
        if (!c) {
            st = hp_errf(err, HP_NOMEM, "out of memory");
        } else {
            c->s = s;
            c->serial = j->serial;
            c->rank = r;
            (void)hpd__sd_run_argv(&conf, a, r, cmd, NULL);
            st = hpd_cmd_run(s->loop, cmd->argv, NULL, CMD_TIMEOUT_MS, 64 * 1024, on_run, c, err);
            if (st != HP_OK) hp_free(c);
        }
        if (st != HP_OK) {
            if (r == 0) { /* nothing started: fail the start */
                hp_free(cmd);
                sdjob_free(s, j);
                return st;
            }
            /* ranks 0..r-1 are being started: this one is lost (reported as its answers
             * come), and so are the ones after it */
            j->unstarted = r;
            snprintf(j->unstarted_why, sizeof j->unstarted_why, "rank %d: %.250s", r,
                     err ? err->msg : "could not run systemd-run");
            hp__log("warn", "event=systemd_run_failed job=%s attempt=%d rank=%d error=\"%s\"",
                    j->job_id, j->attempt, r, j->unstarted_why);
            /* the loss and these ranks' exits go out when the first in-flight one answers */
            break;
        }
        j->in_flight++;
    }
    hp_free(cmd);
    hp__log("info", "event=systemd_start job=%s attempt=%d units=%s-{0..%d}.service", a->job_id,
            a->attempt, prefix, a->world - 1);
    return HP_OK;
}

/* ---- the poll ------------------------------------------------------------------------------ */
typedef struct poll_ctx {
    sd *s;
    int n;
    uint64_t *serials; /* [n] the attempt of each polled unit */
    int *ranks;        /* [n] */
} poll_ctx;

static void on_poll(void *ctx, const hpd_cmd_result *r) {
    poll_ctx *p = ctx;
    sd *s = p->s;
    s->polling = false;
    hpd__sd_unit *units = NULL;
    if (r->error || r->truncated || r->status != 0) {
        char why[320];
        first_line(r, why, sizeof why);
        hp__log("warn", "event=systemd_poll_failed status=%d error=\"%s\"", r->status,
                r->error       ? r->error
                : r->truncated ? "output over 1 MiB"
                               : why);
        goto out;
    }
    units = hp_calloc((size_t)p->n, sizeof *units);
    if (!units) goto out;
    int n = 0;
    hp_err e = {0};
    if (hpd__sd_parse_show(r->out, r->out_len, units, p->n, &n, &e) != HP_OK) {
        hp__log("warn", "event=systemd_poll_failed error=\"%s\"", e.msg);
        goto out;
    }
    for (int i = 0; i < p->n; i++) {
        sdjob *j = find_serial(s, p->serials[i]);
        int rank = p->ranks[i];
        if (!j || j->reported[rank]) continue;
        char name[HPD_SD_UNIT_MAX];
        unit_of(j, rank, name);
        const hpd__sd_unit *u = NULL;
        for (int k = 0; k < n && !u; k++)
            if (!strcmp(units[k].id, name)) u = &units[k];
        int status = HPD_EXIT_UNKNOWN;
        hpd__sd_phase ph = u ? hpd__sd_unit_phase(u, &status) : HPD_SD_GONE;
        if (ph == HPD_SD_RUNNING) {
            j->misses[rank] = 0;
        } else if (ph == HPD_SD_ENDED) {
            hp__log("info", "event=systemd_unit_ended unit=%s active=%s sub=%s result=%s status=%d",
                    name, u->active, u->sub, u->result, status);
            report(s, j, rank, status);
        } else if (++j->misses[rank] >= 2) {
            hp__log("warn", "event=systemd_unit_gone unit=%s", name);
            report(s, j, rank, HPD_EXIT_UNKNOWN);
        }
    }
    /* Events may have re-entered (stop, a new attempt): look every attempt up again. */
    for (int i = 0; i < p->n; i++) {
        sdjob *j = find_serial(s, p->serials[i]);
        if (j) maybe_done(s, j);
    }
out:
    hp_free(units);
    hp_free(p->serials);
    hp_free(p->ranks);
    hp_free(p);
}

static void on_tick(uv_timer_t *t) {
    sd *s = t->data;
    if (s->polling || !s->jobs) return;
    int n = 0;
    for (sdjob *j = s->jobs; j; j = j->next)
        for (int r = 0; r < j->world; r++) n += j->started[r] && !j->reported[r];
    if (!n) return;
    poll_ctx *p = hp_calloc(1, sizeof *p);
    char **argv = hp_calloc((size_t)n + 8, sizeof *argv);
    char *names = hp_calloc((size_t)n, HPD_SD_UNIT_MAX);
    if (p) {
        p->serials = hp_calloc((size_t)n, sizeof *p->serials);
        p->ranks = hp_calloc((size_t)n, sizeof *p->ranks);
    }
    if (!p || !argv || !names || !p->serials || !p->ranks) goto fail;
    p->s = s;
    int k = 0;
    argv[k++] = s->systemctl;
    if (s->user) argv[k++] = "--user";
    argv[k++] = "show";
    argv[k++] = "-p";
    argv[k++] = "Id,LoadState,ActiveState,SubState,Result,ExecMainCode,ExecMainStatus";
    argv[k++] = "--";
    for (sdjob *j = s->jobs; j; j = j->next)
        for (int r = 0; r < j->world; r++) {
            if (!j->started[r] || j->reported[r]) continue;
            char *u = names + (size_t)p->n * HPD_SD_UNIT_MAX;
            unit_of(j, r, u);
            argv[k++] = u;
            p->serials[p->n] = j->serial;
            p->ranks[p->n++] = r;
        }
    argv[k] = NULL;
    hp_err e = {0};
    if (hpd_cmd_run(s->loop, argv, NULL, CMD_TIMEOUT_MS, CMD_MAX_OUT, on_poll, p, &e) != HP_OK) {
        hp__log("warn", "event=systemd_poll_failed error=\"%s\"", e.msg);
        goto fail;
    }
    s->polling = true;
    hp_free(argv);
    hp_free(names);
    return;
fail:
    if (p) {
        hp_free(p->serials);
        hp_free(p->ranks);
    }
    hp_free(p);
    hp_free(argv);
    hp_free(names);
}

/* ---- the vtable ---------------------------------------------------------------------------- */
static void sd_stop(hpd_launcher *base, const char *job_id, int attempt, int signum) {
    sd *s = (sd *)base;
    sdjob *j = find(s, job_id, attempt);
    if (!j) return;
    if (j->in_flight) j->pending_sig = signum; /* the units not yet started, once they are */
    kill_units(s, j, signum, -1);
}

static int sd_alive(hpd_launcher *base, const char *job_id, int attempt) {
    sd *s = (sd *)base;
    sdjob *j = find(s, job_id, attempt);
    return j ? j->world - j->n_reported : 0;
}

static hp_status sd_adopt(hpd_launcher *base, const char *job_id, int attempt, int world,
                          const char *attempt_dir, const char *ref, hp_err *err) {
    (void)attempt_dir;
    sd *s = (sd *)base;
    char prefix[HPD_SD_UNIT_MAX];
    HP_TRY(hpd__sd_unit_name(job_id, attempt, -1, prefix, sizeof prefix, err));
    if (strcmp(ref, prefix) != 0)
        return hp_errf(err, HP_INVALID, "job %s attempt %d: ref '%.64s' is not its units' '%s'",
                       job_id, attempt, ref, prefix);
    if (world < 1 || world > WORLD_MAX)
        return hp_errf(err, HP_INVALID, "job %s: world %d out of range", job_id, world);
    if (find(s, job_id, attempt)) return HP_OK;
    sdjob *j = sdjob_new(s, job_id, attempt, world, prefix);
    if (!j) return hp_errf(err, HP_NOMEM, "out of memory");
    for (int r = 0; r < world; r++) j->started[r] = true; /* the poll finds out */
    j->ref_sent = true;
    return HP_OK;
}

static void on_timer_closed(uv_handle_t *h) {
    hp_free(h->data);
}

static void sd_free(hpd_launcher *base) {
    sd *s = (sd *)base;
    while (s->jobs) sdjob_free(s, s->jobs);
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

static const hpd_launcher_vt sd_vt = {
    .name = "systemd",
    .register_only = false,
    .start = sd_start,
    .stop = sd_stop,
    .alive = sd_alive,
    .adopt = sd_adopt,
    .free = sd_free,
};

hp_status hpd_launcher_systemd_new(uv_loop_t *loop, const hpd_systemd_opts *o,
                                   hpd_launch_event_fn on_event, void *ctx, hpd_launcher **out,
                                   hp_err *err) {
    *out = NULL;
    if (o->slice && o->slice[0] && !plain(o->slice))
        return hp_errf(err, HP_INVALID, "systemd slice '%.100s' is not a unit name", o->slice);
    sd *s = hp_calloc(1, sizeof *s);
    if (!s) return hp_errf(err, HP_NOMEM, "out of memory");
    s->base.vt = &sd_vt;
    s->base.on_event = on_event;
    s->base.ctx = ctx;
    s->loop = loop;
    hpd_launcher_worker_path(o->worker_path, s->worker, sizeof s->worker);
    hpd_cmd_tool(s->systemd_run, sizeof s->systemd_run, o->bin_dir, "systemd-run");
    hpd_cmd_tool(s->systemctl, sizeof s->systemctl, o->bin_dir, "systemctl");
    snprintf(s->slice, sizeof s->slice, "%s", o->slice ? o->slice : "");
    s->user = o->user;
    s->token_file = o->token_file;
    s->poll_ms = o->poll_ms > 0 ? o->poll_ms : 1000;
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, on_tick, (uint64_t)s->poll_ms, (uint64_t)s->poll_ms);
    uv_unref((uv_handle_t *)&s->timer);
    hp__log("info", "event=systemd_launcher manager=%s worker=%s token=%s",
            s->user ? "user" : "system", s->worker, s->token_file ? "file" : "credential");
    *out = &s->base;
    return HP_OK;
}
