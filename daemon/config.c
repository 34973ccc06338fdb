/* daemon/config.c — hpd's settings (daemon/config.h): the table of config.def (types, ranges,
 * defaults, checks, live, help) read generically by defaults/set/format, and the
 * `key = value` file parser. No I/O beyond reading the file it is given. */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- the checks of string keys: false and *why the text after the quoted value ---------- */
static bool check_addr(const char *v, char *why, size_t n) {
    if (is_addr(v)) return true;
    snprintf(why, n, " is not HOST:PORT (port in [0, 65535])");
    return false;
}

static bool check_addr_or_off(const char *v, char *why, size_t n) {
    return strcmp(v, "off") == 0 || check_addr(v, why, n);
}

static bool check_advertise(const char *v, char *why, size_t n) {
    const char *p = advertise_problem(v);
    if (p) snprintf(why, n, ": %s (want HOST or HOST:PORT)", p);
    return !p;
}

static bool check_slurm_time(const char *v, char *why, size_t n) {
    if (is_slurm_time(v)) return true;
    snprintf(why, n, " is not a Slurm time limit (MM, HH:MM:SS, D-HH:MM, ...)");
    return false;
}

static bool check_slurm_name(const char *v, char *why, size_t n) {
    if (is_slurm_name(v)) return true;
    snprintf(why, n, " is not a Slurm name (letters, digits, _ - . ,)");
    return false;
}

static bool check_slice(const char *v, char *why, size_t n) {
    if (is_slice(v)) return true;
    snprintf(why, n, " is not a slice unit name (letters, digits, _ - . \\ and ending in .slice)");
    return false;
}

static bool check_log_level(const char *v, char *why, size_t n) {
    if (!strcmp(v, "debug") || !strcmp(v, "info") || !strcmp(v, "warn") || !strcmp(v, "error"))
        return true;
    snprintf(why, n, " is not debug|info|warn|error");
    return false;
}

/* ---- the table (config.def) --------------------------------------------------------------- */
typedef enum { T_STR, T_INT, T_SECS, T_ENUM } key_type;

static const struct key {
    const char *name;
    key_type type;
    size_t off, size;                                  /* the field in hpd_settings */
    long lo, hi;                                       /* INT / SECS */
    bool (*check)(const char *v, char *why, size_t n); /* STR; NULL: any non-empty text */
    const char *names;                                 /* ENUM: "a|b|c" */
    const char *def;
    bool live;
    const char *arg, *help;
} KEYS[HPD_KEY_COUNT] = {
#define X(id, key, type, field, lo, hi, check, names, def, live, arg, help)                        \
    [HPD_KEY_##id] = {key,                                                                         \
                      T_##type,                                                                    \
                      offsetof(hpd_settings, field),                                               \
                      sizeof(((hpd_settings *)0)->field),                                          \
                      lo,                                                                          \
                      hi,                                                                          \
                      check,                                                                       \
                      names,                                                                       \
                      def,                                                                         \
                      live,                                                                        \
                      arg,                                                                         \
                      help},
#include "daemon/config.def"
#undef X
};

/* ENUM fields are int-sized (plain int, or an enum of int's size). */
_Static_assert(sizeof(hpd_on_sigterm) == sizeof(int) && sizeof(hpd_launcher_kind) == sizeof(int) &&
                   sizeof(hpd_comm_kind) == sizeof(int) &&
                   sizeof(hpd_systemd_manager) == sizeof(int),
               "ENUM settings are stored as int");

/* The index of v in names ("a|b|c"), or -1. */
static int enum_index(const char *names, const char *v) {
    size_t vl = strlen(v);
    int i = 0;
    for (const char *p = names; p; i++) {
        size_t n = strcspn(p, "|");
        if (n == vl && strncmp(p, v, n) == 0) return i;
        p = p[n] ? p + n + 1 : NULL;
    }
    return -1;
}

void hpd_settings_defaults(hpd_settings *s) {
    memset(s, 0, sizeof *s);
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        const struct key *d = &KEYS[k];
        char *f = (char *)s + d->off;
        if (d->type == T_STR)
            snprintf(f, d->size, "%s", d->def);
        else if (d->type == T_ENUM)
            *(int *)(void *)f = enum_index(d->names, d->def) > 0 ? enum_index(d->names, d->def) : 0;
        else
            *(int *)(void *)f = atoi(d->def); /* "0": unset (main decides); not range-checked */
    }
}

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

const char *hpd_settings_key_arg(hpd_key k) {
    return k >= 0 && k < HPD_KEY_COUNT ? KEYS[k].arg : "";
}

const char *hpd_settings_key_help(hpd_key k) {
    return k >= 0 && k < HPD_KEY_COUNT ? KEYS[k].help : "";
}

hp_status hpd_settings_set(hpd_settings *s, hpd_key k, const char *v, hp_err *err) {
    if (k < 0 || k >= HPD_KEY_COUNT) return hp_errf(err, HP_INVALID, "unknown key %d", (int)k);
    const struct key *d = &KEYS[k];
    const char *name = d->name;
    char *f = (char *)s + d->off;
    char why[160];
    switch (d->type) {
    case T_STR:
        if (!*v) return hp_errf(err, HP_INVALID, "%s: empty value", name);
        if (d->check && !d->check(v, why, sizeof why))
            return hp_errf(err, HP_INVALID, "%s: '%.200s'%s", name, v, why);
        if (strlen(v) >= d->size)
            return hp_errf(err, HP_INVALID, "%s: longer than %zu bytes", name, d->size - 1);
        snprintf(f, d->size, "%s", v);
        return HP_OK;
    case T_INT:
    case T_SECS: {
        int x;
        if (!parse_int(v, d->lo, d->hi, &x))
            return hp_errf(err, HP_INVALID, "%s: '%.200s' must be %s in [%ld, %ld]", name, v,
                           d->type == T_SECS ? "seconds" : "an integer", d->lo, d->hi);
        *(int *)(void *)f = x;
        return HP_OK;
    }
    case T_ENUM: {
        int i = enum_index(d->names, v);
        if (i < 0) return hp_errf(err, HP_INVALID, "%s: '%.200s' is not %s", name, v, d->arg);
        *(int *)(void *)f = i;
        return HP_OK;
    }
    }
    return hp_errf(err, HP_INVALID, "%s: unknown type", name);
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
    if (k < 0 || k >= HPD_KEY_COUNT) {
        snprintf(buf, len, "?");
        return;
    }
    const struct key *d = &KEYS[k];
    const char *f = (const char *)s + d->off;
    if (d->type == T_STR) {
        snprintf(buf, len, "%s", f);
    } else if (d->type == T_ENUM) {
        const char *n = d->names;
        int want = *(const int *)(const void *)f;
        for (int i = 0; i < want && n; i++) {
            n = strchr(n, '|');
            if (n) n++;
        }
        size_t nl = n ? strcspn(n, "|") : 1;
        snprintf(buf, len, "%.*s", (int)nl, n ? n : "?");
    } else {
        snprintf(buf, len, "%d", *(const int *)(const void *)f);
    }
}

bool hpd_settings_same(const hpd_settings *a, const hpd_settings *b, hpd_key k) {
    char x[HPD_VALUE_MAX], y[HPD_VALUE_MAX];
    hpd_settings_format(a, k, x, sizeof x);
    hpd_settings_format(b, k, y, sizeof y);
    return strcmp(x, y) == 0;
}
