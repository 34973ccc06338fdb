/* tests/daemon/test_config.c — hpd's settings (daemon/config.c): defaults, a good file, every
 * error with FILE:LINE and the key, flags over the file, what SIGHUP may change live. */
#include "daemon/config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static hp_status parse(hpd_settings *s, const char *text, hp_err *e) {
    return hpd_settings_parse(s, "hpd.conf", text, strlen(text), NULL, e);
}

Test(config, defaults) {
    hpd_settings s;
    hpd_settings_defaults(&s);
    cr_expect_str_eq(s.listen, "127.0.0.1:7070");
    cr_expect_str_eq(s.worker_listen, "127.0.0.1:0");
    cr_expect_str_eq(s.http, "127.0.0.1:7071");
    cr_expect_str_eq(s.log_level, "info");
    cr_expect_str_eq(s.state_dir, "");
    cr_expect_eq(s.slots, 0);
    cr_expect_eq(s.gpus, -1, "unset: main counts /dev/nvidiaN");
    cr_expect_eq(s.heartbeat_ms, 0);
    cr_expect_eq(s.on_sigterm, HPD_ON_SIGTERM_CHECKPOINT);
    cr_expect_eq(s.launcher, HPD_LAUNCHER_LOCAL);
    cr_expect_eq(s.comm, HPD_COMM_AUTO);
    cr_expect_str_eq(s.advertise, "");
    cr_expect_eq(s.launch_timeout_s, 120);
    cr_expect_eq(s.slurm_poll_ms, 1000);
}

Test(config, good_file_every_key) {
    const char *text = "# hpd config\n"
                       "\n"
                       "listen = 0.0.0.0:9000\n"
                       "worker-listen=127.0.0.1:9001\n"
                       "  state-dir =   /var/lib/hp  \n"
                       "slots = 4   # four CPUs\n"
                       "gpus = 0\n"
                       "log-level = debug\r\n"
                       "http = [::1]:7072\n"
                       "tls-cert = /etc/hp/cert#1.pem\n"
                       "tls-key = /etc/hp/key.pem\n"
                       "\t# indented comment\n"
                       "worker = /opt/hp/bin/hp-worker\n"
                       "on-sigterm = cancel\n"
                       "metrics-retention = 30\n"
                       "launcher = slurm\n"
                       "comm = tcp\n"
                       "advertise = node7.cluster:7100\n"
                       "launch-timeout-s = 900\n"
                       "slurm-partition = gpu-h100\n"
                       "slurm-account = ml_team\n"
                       "slurm-qos = normal\n"
                       "slurm-time = 1-12:00:00\n"
                       "slurm-poll-ms = 500\n"
                       "systemd-manager = user\n"
                       "systemd-slice = hp-ranks.slice\n"
                       "systemd-token = file\n"
                       "systemd-poll-ms = 300\n"
                       "auth = all\n"
                       "heartbeat-ms = 250"; /* no final newline */
    hpd_settings s;
    hpd_settings_defaults(&s);
    bool given[HPD_KEY_COUNT] = {0};
    hp_err e = {0};
    cr_assert_eq(hpd_settings_parse(&s, "hpd.conf", text, strlen(text), given, &e), HP_OK, "%s",
                 e.msg);
    cr_expect_str_eq(s.listen, "0.0.0.0:9000");
    cr_expect_str_eq(s.worker_listen, "127.0.0.1:9001");
    cr_expect_str_eq(s.state_dir, "/var/lib/hp");
    cr_expect_eq(s.slots, 4);
    cr_expect_eq(s.gpus, 0, "0 is a value (no GPU), not unset");
    cr_expect_str_eq(s.log_level, "debug");
    cr_expect_str_eq(s.http, "[::1]:7072");
    cr_expect_str_eq(s.tls_cert, "/etc/hp/cert#1.pem", "a '#' inside a value is kept");
    cr_expect_str_eq(s.tls_key, "/etc/hp/key.pem");
    cr_expect_str_eq(s.worker, "/opt/hp/bin/hp-worker");
    cr_expect_eq(s.on_sigterm, HPD_ON_SIGTERM_CANCEL);
    cr_expect_eq(s.heartbeat_ms, 250);
    cr_expect_eq(s.metrics_retention_s, 30);
    cr_expect_eq(s.launcher, HPD_LAUNCHER_SLURM);
    cr_expect_eq(s.comm, HPD_COMM_TCP);
    cr_expect_str_eq(s.advertise, "node7.cluster:7100");
    cr_expect_eq(s.launch_timeout_s, 900);
    cr_expect_str_eq(s.slurm_partition, "gpu-h100");
    cr_expect_str_eq(s.slurm_account, "ml_team");
    cr_expect_str_eq(s.slurm_qos, "normal");
    cr_expect_str_eq(s.slurm_time, "1-12:00:00");
    cr_expect_eq(s.slurm_poll_ms, 500);
    cr_expect_eq(s.systemd_manager, HPD_SYSTEMD_USER);
    cr_expect_str_eq(s.systemd_slice, "hp-ranks.slice");
    cr_expect(s.systemd_token_file);
    cr_expect_eq(s.systemd_poll_ms, 300);
    cr_expect(s.auth_all);
    for (int k = 0; k < HPD_KEY_COUNT; k++)
        cr_expect(given[k], "%s not marked given", hpd_settings_key_name((hpd_key)k));
}

Test(config, empty_and_comment_only_files) {
    hpd_settings s, d;
    hpd_settings_defaults(&s);
    hpd_settings_defaults(&d);
    hp_err e = {0};
    cr_expect_eq(parse(&s, "", &e), HP_OK);
    cr_expect_eq(parse(&s, "\n\n# nothing\n   \n", &e), HP_OK, "%s", e.msg);
    cr_expect_eq(memcmp(&s, &d, sizeof s), 0);
}

typedef struct bad {
    const char *text, *want;
} bad;

Test(config, errors_name_file_line_and_key) {
    static const bad cases[] = {
        {"slots = 2\nfoo = 1\n", "hpd.conf:2: unknown key 'foo'"},
        {"# c\n\nslots 4\n", "hpd.conf:3: expected 'key = value', got 'slots 4'"},
        {"= 4\n", "hpd.conf:1: no key before '='"},
        {"slots =\n", "hpd.conf:1: slots: missing value"},
        {"slots = # none\n", "hpd.conf:1: slots: missing value"},
        {"slots = four\n", "hpd.conf:1: slots: 'four' must be an integer in [1, 65536]"},
        {"slots = 0\n", "hpd.conf:1: slots: '0' must be an integer in [1, 65536]"},
        {"slots = 70000\n", "hpd.conf:1: slots: '70000' must be an integer in [1, 65536]"},
        {"\nlog-level = verbose\n",
         "hpd.conf:2: log-level: 'verbose' is not debug|info|warn|error"},
        {"on-sigterm = leave\n", "hpd.conf:1: on-sigterm: 'leave' is not checkpoint|cancel"},
        {"heartbeat-ms = 5\n", "hpd.conf:1: heartbeat-ms: '5' must be an integer in [10, 600000]"},
        {"metrics-retention = -1\n",
         "hpd.conf:1: metrics-retention: '-1' must be seconds in [0, 1000000000]"},
        {"listen = localhost\n", "hpd.conf:1: listen: 'localhost' is not HOST:PORT"},
        {"http = h:99999\n", "hpd.conf:1: http: 'h:99999' is not HOST:PORT"},
        {"slots = 2\nslots = 3\n", "hpd.conf:2: slots: given twice (first at line 1)"},
        {"Slots = 2\n", "hpd.conf:1: unknown key 'Slots'"},
        {"--slots = 2\n", "hpd.conf:1: unknown key '--slots'"},
        {"launcher = kubernetes\n",
         "hpd.conf:1: launcher: 'kubernetes' is not local|slurm|systemd|external"},
        {"comm = rdma\n", "hpd.conf:1: comm: 'rdma' is not auto|shm|tcp"},
        {"systemd-manager = session\n", "systemd-manager: 'session' is not auto|system|user"},
        {"systemd-token = env\n", "systemd-token: 'env' is not credential|file"},
        {"systemd-slice = hp\n", "systemd-slice: 'hp' is not a slice unit name"},
        {"systemd-slice = a b.slice\n", "systemd-slice: 'a b.slice' is not a slice unit name"},
        {"systemd-poll-ms = 10\n", "systemd-poll-ms: '10' must be an integer in [50, 600000]"},
        {"advertise = 0.0.0.0\n", "advertise: '0.0.0.0': a wildcard is not an address"},
        {"advertise = [::]:7000\n", "advertise: '[::]:7000': a wildcard is not an address"},
        {"advertise = h:0\n", "advertise: 'h:0': the port must be in [1, 65535]"},
        {"advertise = ::1\n", "advertise: '::1': an IPv6 address goes in brackets"},
        {"advertise = :7000\n", "advertise: ':7000': no host"},
        {"advertise = a b\n", "advertise: 'a b': not a host name"},
        {"advertise = [::1]x\n", "advertise: '[::1]x': junk after the host"},
        {"launch-timeout-s = 0\n", "launch-timeout-s: '0' must be seconds in [1, 604800]"},
        {"slurm-time = 2h\n", "slurm-time: '2h' is not a Slurm time limit"},
        {"slurm-time = 1-2-3\n", "slurm-time: '1-2-3' is not a Slurm time limit"},
        {"slurm-time = 10:\n", "slurm-time: '10:' is not a Slurm time limit"},
        {"slurm-partition = gpu;rm\n", "slurm-partition: 'gpu;rm' is not a Slurm name"},
        {"slurm-account = a b\n", "slurm-account: 'a b' is not a Slurm name"},
        {"slurm-poll-ms = 10\n", "slurm-poll-ms: '10' must be an integer in [50, 600000]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hpd_settings s;
        hpd_settings_defaults(&s);
        hp_err e = {0};
        cr_expect_eq(parse(&s, cases[i].text, &e), HP_INVALID, "case %zu accepted", i);
        cr_expect(strstr(e.msg, cases[i].want), "case %zu: got '%s', want '%s'", i, e.msg,
                  cases[i].want);
    }
    /* An error needs no err to report into. */
    hpd_settings s;
    hpd_settings_defaults(&s);
    cr_expect_eq(parse(&s, "slots = x\n", NULL), HP_INVALID);
}

Test(config, load_file_and_flags_override) {
    char path[] = "/tmp/hp-config-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char *text = "slots = 3\nlog-level = warn\non-sigterm = cancel\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    hpd_settings s;
    hpd_settings_defaults(&s);
    hp_err e = {0};
    cr_assert_eq(hpd_settings_load(&s, path, NULL, &e), HP_OK, "%s", e.msg);
    /* main applies the flags after the file: the flag wins */
    cr_assert_eq(hpd_settings_set(&s, HPD_KEY_SLOTS, "5", &e), HP_OK, "%s", e.msg);
    cr_expect_eq(s.slots, 5);
    cr_expect_str_eq(s.log_level, "warn");
    cr_expect_eq(s.on_sigterm, HPD_ON_SIGTERM_CANCEL);
    unlink(path);
    cr_expect_eq(hpd_settings_load(&s, path, NULL, &e), HP_IO);
    cr_expect(strstr(e.msg, path) && strstr(e.msg, "No such file"), "%s", e.msg);

    /* errors in a file name the file */
    snprintf(path, sizeof path, "/tmp/hp-config-XXXXXX");
    fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "\nbogus = 1\n", 11), 11);
    close(fd);
    cr_expect_eq(hpd_settings_load(&s, path, NULL, &e), HP_INVALID);
    char want[64];
    snprintf(want, sizeof want, "%s:2: unknown key 'bogus'", path);
    cr_expect(strstr(e.msg, want), "got '%s'", e.msg);
    unlink(path);
}

Test(config, bad_set_leaves_the_value) {
    hpd_settings s;
    hpd_settings_defaults(&s);
    hp_err e = {0};
    cr_assert_eq(hpd_settings_set(&s, HPD_KEY_SLOTS, "2", &e), HP_OK);
    cr_expect_eq(hpd_settings_set(&s, HPD_KEY_SLOTS, "2x", &e), HP_INVALID);
    cr_expect_eq(s.slots, 2);
    cr_expect_eq(hpd_settings_set(&s, HPD_KEY_HTTP, "off", &e), HP_OK, "%s", e.msg);
    cr_expect_str_eq(s.http, "off");
    cr_expect_eq(hpd_settings_set(&s, HPD_KEY_STATE_DIR, "", &e), HP_INVALID);
    cr_expect(strstr(e.msg, "state-dir: empty value"), "%s", e.msg);
}

Test(config, keys_live_and_compare) {
    hpd_key k;
    cr_assert(hpd_settings_key("heartbeat-ms", &k));
    cr_expect_eq(k, HPD_KEY_HEARTBEAT_MS);
    cr_expect_not(hpd_settings_key("nope", &k));
    cr_expect(hpd_settings_key_live(HPD_KEY_SLOTS));
    cr_expect(hpd_settings_key_live(HPD_KEY_LOG_LEVEL));
    cr_expect(hpd_settings_key_live(HPD_KEY_ON_SIGTERM));
    cr_expect(hpd_settings_key_live(HPD_KEY_HEARTBEAT_MS));
    cr_expect_not(hpd_settings_key_live(HPD_KEY_LISTEN));
    cr_expect_not(hpd_settings_key_live(HPD_KEY_STATE_DIR));
    cr_expect_not(hpd_settings_key_live(HPD_KEY_TLS_CERT));
    cr_expect_not(hpd_settings_key_live(HPD_KEY_HTTP));
    cr_expect_not(hpd_settings_key_live(HPD_KEY_LAUNCHER), "a launcher change needs a restart");
    cr_expect_not(hpd_settings_key_live(HPD_KEY_ADVERTISE));
    cr_expect(hpd_settings_key_live(HPD_KEY_LAUNCH_TIMEOUT_S));
    hpd_settings a, b;
    hpd_settings_defaults(&a);
    hpd_settings_defaults(&b);
    for (int i = 0; i < HPD_KEY_COUNT; i++) cr_expect(hpd_settings_same(&a, &b, (hpd_key)i));
    b.on_sigterm = HPD_ON_SIGTERM_CANCEL;
    cr_expect_not(hpd_settings_same(&a, &b, HPD_KEY_ON_SIGTERM));
    char buf[32];
    hpd_settings_format(&b, HPD_KEY_ON_SIGTERM, buf, sizeof buf);
    cr_expect_str_eq(buf, "cancel");
    b.launcher = HPD_LAUNCHER_EXTERNAL;
    hpd_settings_format(&b, HPD_KEY_LAUNCHER, buf, sizeof buf);
    cr_expect_str_eq(buf, "external");
    /* Good Slurm time limits and advertise addresses. */
    const char *times[] = {"30", "30:00", "2:00:00", "1-0", "1-12:30", "1-12:30:00", "UNLIMITED"};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++)
        cr_expect_eq(hpd_settings_set(&b, HPD_KEY_SLURM_TIME, times[i], NULL), HP_OK, "%s",
                     times[i]);
    const char *adv[] = {"10.0.0.5", "node-1", "node-1:7001", "[fd00::1]", "[fd00::1]:7001"};
    for (size_t i = 0; i < sizeof adv / sizeof *adv; i++)
        cr_expect_eq(hpd_settings_set(&b, HPD_KEY_ADVERTISE, adv[i], NULL), HP_OK, "%s", adv[i]);
}

/* deploy/hpd.conf.example loads as it is, and documents every key (set, or as "#key = "). */
Test(config, example_file_loads_and_documents_every_key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/deploy/hpd.conf.example", HP_SOURCE_DIR);
    hpd_settings s;
    hpd_settings_defaults(&s);
    bool given[HPD_KEY_COUNT] = {0};
    hp_err e = {0};
    cr_assert_eq(hpd_settings_load(&s, path, given, &e), HP_OK, "%s", e.msg);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        if (given[k]) continue;
        char want[96];
        snprintf(want, sizeof want, "\n#%s = ", hpd_settings_key_name((hpd_key)k));
        cr_expect(strstr(text, want), "%s is not in the example",
                  hpd_settings_key_name((hpd_key)k));
    }
}

/* config.def is the one table: every key has a help line and a metavariable, `hpd --help`
 * lists each as --KEY ARG, and a bad value given as the flag is refused naming the flag. */
Test(config, the_table_drives_help_and_flags) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s/daemon/hpd --help", HP_BINARY_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    static char help[65536];
    size_t n = fread(help, 1, sizeof help - 1, p);
    help[n] = 0;
    cr_expect_eq(pclose(p), 0, "hpd --help exits 0");
    for (int k = 0; k < HPD_KEY_COUNT; k++) {
        hpd_key key = (hpd_key)k;
        cr_expect(hpd_settings_key_help(key)[0] && hpd_settings_key_arg(key)[0],
                  "%s has no help or metavariable", hpd_settings_key_name(key));
        char want[200];
        snprintf(want, sizeof want, "  --%s %s", hpd_settings_key_name(key),
                 hpd_settings_key_arg(key));
        cr_expect(strstr(help, want), "hpd --help lacks '%s'", want);
    }
    cr_expect(strstr(help, "  --config FILE"), "hpd --help lacks --config");
    static const struct {
        const char *flag, *want;
    } bad[] = {{"--auth maybe", "hpd: --auth: 'maybe' is not mutating|all"},
               {"--slots 0", "hpd: --slots: '0' must be an integer in [1, 65536]"},
               {"--systemd-slice x", "hpd: --systemd-slice: 'x' is not a slice unit name"},
               {"--metrics-retention -5", "must be seconds in [0, 1000000000]"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "%s/daemon/hpd %s 2>&1", HP_BINARY_DIR, bad[i].flag);
        p = popen(cmd, "r");
        cr_assert(p, "%s", cmd);
        n = fread(help, 1, sizeof help - 1, p);
        help[n] = 0;
        int st = pclose(p);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: exit %d", bad[i].flag, st);
        cr_expect(strstr(help, bad[i].want), "%s: got '%s', want '%s'", bad[i].flag, help,
                  bad[i].want);
    }
}
