/* daemon/config.c — hpd's settings (daemon/config.h): defaults, one checker per key, and the
 * `key = value` file parser. No I/O beyond reading the file it is given. */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    bool live;
} KEYS[HPD_KEY_COUNT] = {
#define X(id, key, live) [HPD_KEY_##id] = {key, live},
#include "daemon/config.def"
#undef X
};

void hpd_settings_defaults(hpd_settings *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->listen, sizeof s->listen, "127.0.0.1:7070");
    snprintf(s->worker_listen, sizeof s->worker_listen, "127.0.0.1:0");
    snprintf(s->http, sizeof s->http, "127.0.0.1:7071");
    snprintf(s->log_level, sizeof s->log_level, "info");
    s->on_sigterm = HPD_ON_SIGTERM_CHECKPOINT;
    s->metrics_retention_s = 600;
    s->launcher = HPD_LAUNCHER_LOCAL;
    s->launch_timeout_s = 120;
    s->slurm_poll_ms = 1000;
    s->systemd_manager = HPD_SYSTEMD_AUTO;
    s->systemd_poll_ms = 1000;
}

static const char *const LAUNCHERS[] = {"local", "slurm", "external", "systemd"};
static const char *const MANAGERS[] = {"auto", "system", "user"};

bool hpd_settings_key(const char *name, hpd_key *out) {
    for (int k = 0; k < HPD_KEY_COUNT; k++)
        if (strcmp(name, KEYS[k].name) == 0) {
            *out = (hpd_key)k;
            return true;
        }
    return false;
}

const char *hpd_settings_key_name(hpd_key k) {
    return k >= 0 && k < HPD_KEY_COUNT ? KEYS[k].name : "?";
}

bool hpd_settings_key_live(hpd_key k) {
    return k >= 0 && k < HPD_KEY_COUNT && KEYS[k].live;
}

/* The string a key is stored in (NULL: not a string key). */
static char *str_of(hpd_settings *s, hpd_key k, size_t *cap) {
    char *p = NULL;
    switch (k) {
    case HPD_KEY_LISTEN:
        p = s->listen;
        break;
    case HPD_KEY_WORKER_LISTEN:
        p = s->worker_listen;
        break;
    case HPD_KEY_HTTP:
        p = s->http;
        break;
    case HPD_KEY_STATE_DIR:
        p = s->state_dir;
        break;
    case HPD_KEY_TLS_CERT:
        p = s->tls_cert;
        break;
    case HPD_KEY_TLS_KEY:
        p = s->tls_key;
        break;
    case HPD_KEY_WORKER:
        p = s->worker;
        break;
    case HPD_KEY_ADVERTISE:
        *cap = sizeof s->advertise;
        return s->advertise;
    case HPD_KEY_SLURM_PARTITION:
        *cap = sizeof s->slurm_partition;
        return s->slurm_partition;
    case HPD_KEY_SLURM_ACCOUNT:
        *cap = sizeof s->slurm_account;
        return s->slurm_account;
    case HPD_KEY_SLURM_QOS:
        *cap = sizeof s->slurm_qos;
        return s->slurm_qos;
    case HPD_KEY_SLURM_TIME:
        *cap = sizeof s->slurm_time;
        return s->slurm_time;
    case HPD_KEY_SYSTEMD_SLICE:
        *cap = sizeof s->systemd_slice;
        return s->systemd_slice;
    default:
        return NULL;
    }
    *cap = HPD_VALUE_MAX;
    return p;
}

static bool parse_int(const char *v, long lo, long hi, int *out) {
    if (!*v) return false;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

/* "HOST:PORT" or "[V6]:PORT" with PORT in [0, 65535]. */
static bool is_addr(const char *v) {
    const char *c = strrchr(v, ':');
    int port;
    return c && c != v && parse_int(c + 1, 0, 65535, &port);
}

/* --advertise: "HOST" or "HOST:PORT" (PORT in [1, 65535]) or "[V6]" / "[V6]:PORT"; HOST is a
 * name or address, not a wildcard. */
static const char *advertise_problem(const char *v) {
    const char *host_end = v + strlen(v);
    if (v[0] == '[') {
        const char *rb = strchr(v, ']');
        if (!rb || rb == v + 1) return "an IPv6 address goes in brackets: [::1]:7000";
        host_end = rb + 1;
    } else if (strchr(v, ':')) {
        host_end = strrchr(v, ':');
        if (strchr(v, ':') != host_end) return "an IPv6 address goes in brackets: [::1]:7000";
    }
    if (host_end == v) return "no host";
    if (*host_end == ':') {
        int port;
        if (!parse_int(host_end + 1, 1, 65535, &port)) return "the port must be in [1, 65535]";
    } else if (*host_end) {
        return "junk after the host";
    }
    for (const char *p = v; p < host_end; p++)
        if (!(isalnum((unsigned char)*p) || strchr(".-_[]:", *p))) return "not a host name";
    size_t hl = (size_t)(host_end - v);
    if ((hl == 7 && !strncmp(v, "0.0.0.0", 7)) || (hl == 4 && !strncmp(v, "[::]", 4)))
        return "a wildcard is not an address workers can dial";
    return NULL;
}

/* sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED. */
static bool is_slurm_time(const char *v) {
    if (!strcmp(v, "UNLIMITED") || !strcmp(v, "infinite")) return true;
    const char *p = v;
    int fields = 0, dash = 0;
    if (!isdigit((unsigned char)*p)) return false;
    while (*p) {
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
        fields++;
        if (*p == '-') {
            if (dash || fields != 1) return false;
            dash = 1;
            fields = 0;
            p++;
        } else if (*p == ':') {
            p++;
        } else if (*p) {
            return false;
        }
    }
    return fields >= 1 && fields <= 3 && p[-1] != ':' && p[-1] != '-';
}

/* A Slurm name (partition, account, qos): letters, digits, '_', '-', '.', ',' (a list). */
static bool is_slurm_name(const char *v) {
    for (const char *p = v; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("_-.,", *p))) return false;
    return true;
}

/* A slice unit's name: "hp.slice", "hp-jobs.slice". */
static bool is_slice(const char *v) {
    size_t n = strlen(v);
    if (n <= 6 || strcmp(v + n - 6, ".slice") != 0) return false;
    for (const char *p = v; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("_-.\\:", *p))) return false;
    return true;
}

hp_status hpd_settings_set(hpd_settings *s, hpd_key k, const char *v, hp_err *err) {
    const char *name = hpd_settings_key_name(k);
    size_t cap = 0;
    char *str = str_of(s, k, &cap);
    if (str) {
        if (!*v) return hp_errf(err, HP_INVALID, "%s: empty value", name);
        if (strlen(v) >= cap)
            return hp_errf(err, HP_INVALID, "%s: longer than %zu bytes", name, cap - 1);
        if ((k == HPD_KEY_LISTEN || k == HPD_KEY_WORKER_LISTEN ||
             (k == HPD_KEY_HTTP && strcmp(v, "off") != 0)) &&
            !is_addr(v))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' is not HOST:PORT (port in [0, 65535])",
                           name, v);
        if (k == HPD_KEY_ADVERTISE && advertise_problem(v))
            return hp_errf(err, HP_INVALID, "%s: '%.200s': %s (want HOST or HOST:PORT)", name, v,
                           advertise_problem(v));
        if (k == HPD_KEY_SLURM_TIME && !is_slurm_time(v))
            return hp_errf(err, HP_INVALID,
                           "%s: '%.200s' is not a Slurm time limit (MM, HH:MM:SS, D-HH:MM, ...)",
                           name, v);
        if ((k == HPD_KEY_SLURM_PARTITION || k == HPD_KEY_SLURM_ACCOUNT ||
             k == HPD_KEY_SLURM_QOS) &&
            !is_slurm_name(v))
            return hp_errf(err, HP_INVALID,
                           "%s: '%.200s' is not a Slurm name (letters, digits, _ - . ,)", name, v);
        if (k == HPD_KEY_SYSTEMD_SLICE && !is_slice(v))
            return hp_errf(err, HP_INVALID,
                           "%s: '%.200s' is not a slice unit name (letters, digits, _ - . \\ "
                           "and ending in .slice)",
                           name, v);
        snprintf(str, cap, "%s", v);
        return HP_OK;
    }
    switch (k) {
    case HPD_KEY_SLOTS:
        if (!parse_int(v, 1, 65536, &s->slots))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be an integer in [1, 65536]", name,
                           v);
        return HP_OK;
    case HPD_KEY_HEARTBEAT_MS:
        if (!parse_int(v, 10, 600000, &s->heartbeat_ms))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be an integer in [10, 600000]", name,
                           v);
        return HP_OK;
    case HPD_KEY_METRICS_RETENTION:
        if (!parse_int(v, 0, 1000000000, &s->metrics_retention_s))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be seconds in [0, 1000000000]", name,
                           v);
        return HP_OK;
    case HPD_KEY_LAUNCH_TIMEOUT_S:
        if (!parse_int(v, 1, 604800, &s->launch_timeout_s))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be seconds in [1, 604800]", name, v);
        return HP_OK;
    case HPD_KEY_SLURM_POLL_MS:
        if (!parse_int(v, 50, 600000, &s->slurm_poll_ms))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be an integer in [50, 600000]", name,
                           v);
        return HP_OK;
    case HPD_KEY_SYSTEMD_POLL_MS:
        if (!parse_int(v, 50, 600000, &s->systemd_poll_ms))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be an integer in [50, 600000]", name,
                           v);
        return HP_OK;
    case HPD_KEY_SYSTEMD_MANAGER:
        for (size_t i = 0; i < HP_ARRAY_LEN(MANAGERS); i++)
            if (!strcmp(v, MANAGERS[i])) {
                s->systemd_manager = (hpd_systemd_manager)i;
                return HP_OK;
            }
        return hp_errf(err, HP_INVALID, "%s: '%.200s' is not auto|system|user", name, v);
    case HPD_KEY_SYSTEMD_TOKEN:
        if (strcmp(v, "credential") == 0)
            s->systemd_token_file = false;
        else if (strcmp(v, "file") == 0)
            s->systemd_token_file = true;
        else
            return hp_errf(err, HP_INVALID, "%s: '%.200s' is not credential|file", name, v);
        return HP_OK;
    case HPD_KEY_LAUNCHER:
        for (size_t i = 0; i < HP_ARRAY_LEN(LAUNCHERS); i++)
            if (!strcmp(v, LAUNCHERS[i])) {
                s->launcher = (hpd_launcher_kind)i;
                return HP_OK;
            }
        return hp_errf(err, HP_INVALID, "%s: '%.200s' is not local|slurm|systemd|external", name,
                       v);
    case HPD_KEY_LOG_LEVEL:
        if (strcmp(v, "debug") && strcmp(v, "info") && strcmp(v, "warn") && strcmp(v, "error"))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' is not debug|info|warn|error", name, v);
        snprintf(s->log_level, sizeof s->log_level, "%s", v);
        return HP_OK;
    case HPD_KEY_AUTH:
        if (strcmp(v, "mutating") == 0)
            s->auth_all = false;
        else if (strcmp(v, "all") == 0)
            s->auth_all = true;
        else
            return hp_errf(err, HP_INVALID, "%s: '%.200s' is not mutating|all", name, v);
        return HP_OK;
    case HPD_KEY_ON_SIGTERM:
        if (strcmp(v, "checkpoint") == 0)
            s->on_sigterm = HPD_ON_SIGTERM_CHECKPOINT;
        else if (strcmp(v, "cancel") == 0)
            s->on_sigterm = HPD_ON_SIGTERM_CANCEL;
        else
            return hp_errf(err, HP_INVALID, "%s: '%.200s' is not checkpoint|cancel", name, v);
        return HP_OK;
    default:
        return hp_errf(err, HP_INVALID, "unknown key %d", (int)k);
    }
}

static bool blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

hp_status hpd_settings_parse(hpd_settings *s, const char *name, const char *text, size_t len,
                             bool *given, hp_err *err) {
    int first[HPD_KEY_COUNT] = {0}; /* the line that set each key (0: none) */
    const char *p = text, *end = text + len;
    for (int line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        /* Cut a comment: '#' first on the line or after a blank. */
        for (const char *q = p; q < e; q++)
            if (*q == '#' && (q == p || blank(q[-1]))) {
                e = q;
                break;
            }
        while (p < e && blank(*p)) p++;
        while (e > p && blank(e[-1])) e--;
        if (p == e) {
            p = next;
            continue;
        }
        const char *eq = memchr(p, '=', (size_t)(e - p));
        if (!eq)
            return hp_errf(err, HP_INVALID, "%s:%d: expected 'key = value', got '%.*s'", name, line,
                           (int)(e - p > 100 ? 100 : e - p), p);
        const char *ke = eq, *vb = eq + 1;
        while (ke > p && blank(ke[-1])) ke--;
        while (vb < e && blank(*vb)) vb++;
        char key[64], val[HPD_VALUE_MAX + 1];
        if (ke == p) return hp_errf(err, HP_INVALID, "%s:%d: no key before '='", name, line);
        if ((size_t)(ke - p) >= sizeof key)
            return hp_errf(err, HP_INVALID, "%s:%d: unknown key '%.*s...'", name, line, 40, p);
        memcpy(key, p, (size_t)(ke - p));
        key[ke - p] = 0;
        hpd_key k;
        if (!hpd_settings_key(key, &k))
            return hp_errf(err, HP_INVALID, "%s:%d: unknown key '%s'", name, line, key);
        if (vb == e) return hp_errf(err, HP_INVALID, "%s:%d: %s: missing value", name, line, key);
        if ((size_t)(e - vb) >= sizeof val)
            return hp_errf(err, HP_INVALID, "%s:%d: %s: longer than %d bytes", name, line, key,
                           HPD_VALUE_MAX - 1);
        memcpy(val, vb, (size_t)(e - vb));
        val[e - vb] = 0;
        if (memchr(val, 0, (size_t)(e - vb)))
            return hp_errf(err, HP_INVALID, "%s:%d: %s: a NUL byte in the value", name, line, key);
        if (first[k])
            return hp_errf(err, HP_INVALID, "%s:%d: %s: given twice (first at line %d)", name, line,
                           key, first[k]);
        hp_status st = hpd_settings_set(s, k, val, err);
        if (st != HP_OK) {
            hp_err_prefix(err, "%s:%d", name, line);
            return st;
        }
        first[k] = line;
        if (given) given[k] = true;
        p = next;
    }
    return HP_OK;
}

hp_status hpd_settings_load(hpd_settings *s, const char *path, bool *given, hp_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return hp_errf(err, HP_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    hp_status st = HP_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= (1u << 20)) {
                st = hp_errf(err, HP_INVALID, "%s: larger than 1 MiB", path);
                break;
            }
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb = hp_realloc(buf, ncap);
            if (!nb) {
                st = hp_errf(err, HP_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) st = hp_errf(err, HP_IO, "%s: read: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st == HP_OK) st = hpd_settings_parse(s, path, buf ? buf : "", len, given, err);
    hp_free(buf);
    return st;
}

void hpd_settings_format(const hpd_settings *s, hpd_key k, char *buf, size_t len) {
    size_t cap;
    const char *str = str_of((hpd_settings *)s, k, &cap);
    if (str)
        snprintf(buf, len, "%s", str);
    else if (k == HPD_KEY_SLOTS)
        snprintf(buf, len, "%d", s->slots);
    else if (k == HPD_KEY_HEARTBEAT_MS)
        snprintf(buf, len, "%d", s->heartbeat_ms);
    else if (k == HPD_KEY_LAUNCH_TIMEOUT_S)
        snprintf(buf, len, "%d", s->launch_timeout_s);
    else if (k == HPD_KEY_SLURM_POLL_MS)
        snprintf(buf, len, "%d", s->slurm_poll_ms);
    else if (k == HPD_KEY_SYSTEMD_POLL_MS)
        snprintf(buf, len, "%d", s->systemd_poll_ms);
    else if (k == HPD_KEY_SYSTEMD_MANAGER)
        snprintf(buf, len, "%s", MANAGERS[s->systemd_manager]);
    else if (k == HPD_KEY_SYSTEMD_TOKEN)
        snprintf(buf, len, "%s", s->systemd_token_file ? "file" : "credential");
    else if (k == HPD_KEY_LAUNCHER)
        snprintf(buf, len, "%s", LAUNCHERS[s->launcher]);
    else if (k == HPD_KEY_METRICS_RETENTION)
        snprintf(buf, len, "%d", s->metrics_retention_s);
    else if (k == HPD_KEY_AUTH)
        snprintf(buf, len, "%s", s->auth_all ? "all" : "mutating");
    else if (k == HPD_KEY_LOG_LEVEL)
        snprintf(buf, len, "%s", s->log_level);
    else if (k == HPD_KEY_ON_SIGTERM)
        snprintf(buf, len, "%s", s->on_sigterm == HPD_ON_SIGTERM_CANCEL ? "cancel" : "checkpoint");
    else
        snprintf(buf, len, "?");
}

bool hpd_settings_same(const hpd_settings *a, const hpd_settings *b, hpd_key k) {
    char x[HPD_VALUE_MAX], y[HPD_VALUE_MAX];
    hpd_settings_format(a, k, x, sizeof x);
    hpd_settings_format(b, k, y, sizeof y);
    return strcmp(x, y) == 0;
}
