/* daemon/config.h — hpd's settings: the keys, their types, ranges, defaults, checks,
 * liveness and help (one table, config.def), and the config file parser. Pure: no globals, no
 * logging; the file is read once per call and nothing else is touched. main.c layers them:
 * defaults, then the file (--config or $HPD_CONFIG), then the flags; SIGHUP does the same again and
 * applies the live keys.
 *
 * File format: one `key = value` per line, keys named like the long flags ("slots = 4");
 * blank lines and lines whose first non-blank character is '#' are ignored, and so is a '#'
 * preceded by a blank and everything after it. Values are taken verbatim (no quotes), blanks
 * around them trimmed. A key given twice, an unknown key, a missing '=' or a bad value is an
 * error "FILE:LINE: ...".
 */
#ifndef HP_DAEMON_CONFIG_H
#define HP_DAEMON_CONFIG_H

#include "hp/base.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum {
#define X(id, ...) HPD_KEY_##id,
#include "daemon/config.def"
#undef X
    HPD_KEY_COUNT
} hpd_key;

/* What hpd does with running jobs on SIGTERM/SIGINT. */
typedef enum {
    HPD_ON_SIGTERM_CHECKPOINT, /* Stop with a checkpoint; they resume at the next start */
    HPD_ON_SIGTERM_CANCEL,     /* cancel them (CANCELLED, "coordinator shut down") */
} hpd_on_sigterm;

/* How the ranks start (daemon/launch.h). */
typedef enum {
    HPD_LAUNCHER_LOCAL,    /* uv_spawn of hp-worker on this host (the default) */
    HPD_LAUNCHER_SLURM,    /* one Slurm job per attempt (sbatch; srun inside an allocation) */
    HPD_LAUNCHER_EXTERNAL, /* the operator starts the workers (hpctl status ID --worker-cmd) */
    HPD_LAUNCHER_SYSTEMD,  /* one transient systemd service per rank (systemd-run) */
} hpd_launcher_kind;

/* The communicator a job's ranks use (the Welcome's comm.backend). */
typedef enum {
    HPD_COMM_AUTO, /* tcp where the launcher may place ranks on several hosts, else shm */
    HPD_COMM_SHM,
    HPD_COMM_TCP,
} hpd_comm_kind;

/* Which systemd manager the systemd launcher talks to. */
typedef enum {
    HPD_SYSTEMD_AUTO,   /* the system's when hpd runs as root, else the user's (main decides) */
    HPD_SYSTEMD_SYSTEM, /* systemctl --system */
    HPD_SYSTEMD_USER,   /* systemctl --user */
} hpd_systemd_manager;

#define HPD_VALUE_MAX 1024

typedef struct hpd_settings {
    char listen[HPD_VALUE_MAX], worker_listen[HPD_VALUE_MAX];
    char http[HPD_VALUE_MAX];      /* HOST:PORT or "off" */
    char state_dir[HPD_VALUE_MAX]; /* "": $HP_STATE_DIR or ~/.local/state/hp (main decides) */
    char tls_cert[HPD_VALUE_MAX], tls_key[HPD_VALUE_MAX];
    char worker[HPD_VALUE_MAX]; /* "": the launcher's default */
    char log_level[8];
    int slots;               /* 0: the CPUs (main decides) */
    int gpus;                /* -1: the /dev/nvidiaN devices (main decides) */
    int heartbeat_ms;        /* 0: 1000 */
    int metrics_retention_s; /* finished jobs stay in /metrics this long (default 600) */
    hpd_on_sigterm on_sigterm;
    hpd_launcher_kind launcher;
    hpd_comm_kind comm;
    char advertise[256];  /* HOST or HOST:PORT the workers dial ("": from worker-listen) */
    int launch_timeout_s; /* LAUNCHING longer than this fails the attempt (default 120) */
    char slurm_partition[128], slurm_account[128], slurm_qos[128];
    char slurm_time[32]; /* sbatch --time ("": the partition's default) */
    int slurm_poll_ms;   /* squeue interval (default 1000) */
    hpd_systemd_manager systemd_manager;
    char systemd_slice[128]; /* Slice= of the rank units ("": the manager's default) */
    int systemd_token_file;  /* systemd-token = file (1): $HP_TOKEN_FILE, not a credential */
    int systemd_poll_ms;     /* systemctl show interval (default 1000) */
    int auth_all;            /* auth = all (1): every RPC and HTTP path but /healthz needs it */
} hpd_settings;

/* The defaults of config.def (listen 127.0.0.1:7070, http 127.0.0.1:7071, ...; "" / 0:
 * unset, main decides). */
void hpd_settings_defaults(hpd_settings *s);

/* The key named `name` ("slots"); false when there is none. */
bool hpd_settings_key(const char *name, hpd_key *out);
const char *hpd_settings_key_name(hpd_key k);
/* Whether SIGHUP can apply a new value of k (slots, log-level, on-sigterm, heartbeat-ms,
 * metrics-retention). */
bool hpd_settings_key_live(hpd_key k);
/* `hpd --help`'s metavariable ("HOST:PORT") and text of k ('\n': continued on the next line). */
const char *hpd_settings_key_arg(hpd_key k);
const char *hpd_settings_key_help(hpd_key k);

/* Checks value and sets key k. HP_INVALID names the key and the value ("slots: 'x' must be
 * an integer in [1, 65536]"); s is unchanged then. */
hp_status hpd_settings_set(hpd_settings *s, hpd_key k, const char *value, hp_err *err);

/* Parses config text (len bytes, need not be NUL-terminated) into s; `name` is used in
 * errors ("NAME:LINE: ..."). The keys the text sets are marked in given[] when given is not
 * NULL (HPD_KEY_COUNT entries). On error s may be partly updated: parse into a copy. */
hp_status hpd_settings_parse(hpd_settings *s, const char *name, const char *text, size_t len,
                             bool *given, hp_err *err);
/* Reads the file at path and parses it (hpd_settings_parse). HP_IO when it cannot be read. */
hp_status hpd_settings_load(hpd_settings *s, const char *path, bool *given, hp_err *err);

/* Whether key k has the same value in a and b. */
bool hpd_settings_same(const hpd_settings *a, const hpd_settings *b, hpd_key k);
/* Formats k's value in s into buf ("4", "cancel", "127.0.0.1:7070"). */
void hpd_settings_format(const hpd_settings *s, hpd_key k, char *buf, size_t len);

#endif
