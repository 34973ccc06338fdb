/* tests/util/cli_harness.h — running the project's real binaries from Criterion tests: a temp
 * dir per test, a command through the shell with stdout and stderr captured, and the CLI
 * error convention (exactly one line on stderr, starting with the program's name). */
#ifndef HP_TEST_CLI_HARNESS_H
#define HP_TEST_CLI_HARNESS_H

#include <stddef.h>

typedef struct hp_th_run {
    int code;        /* exit status; -1 when killed by a signal */
    char *out, *err; /* malloc'd, NUL-terminated */
} hp_th_run;

/* mkdtemp("/tmp/PREFIX-XXXXXX") into dir; asserts on failure. */
void hp_th_tmpdir_make(char *dir, size_t len, const char *prefix);
/* rm -rf dir; asserts on failure. */
void hp_th_tmpdir_remove(const char *dir);
/* The whole file, malloc'd and NUL-terminated; asserts when unreadable. */
char *hp_th_slurp(const char *path);

/* Runs `HP_BINARY_DIR/BIN ARGS` (ARGS printf-style) through the shell, capturing its output
 * in files under tmpdir. bin is relative to the build dir, e.g. "client/hpctl". */
hp_th_run hp_th_run_bin(const char *tmpdir, const char *bin, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void hp_th_run_free(hp_th_run *r);
/* hp_th_run_bin, killed after timeout_s seconds (exit 124): for inputs that could hang it. */
hp_th_run hp_th_run_bin_timeout(const char *tmpdir, int timeout_s, const char *bin, const char *fmt,
                                ...) __attribute__((format(printf, 4, 5)));

/* The whole file, malloc'd and NUL-terminated; "" when it does not exist. */
char *hp_th_slurp_or_empty(const char *path);
/* Runs `HP_BINARY_DIR/client/hpctl ARGS` in dir (cd), killed after timeout_s seconds, with
 * stdout and stderr captured in dir/out and dir/err. */
hp_th_run hp_th_hpctl(const char *dir, int timeout_s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* `hpctl submit dir/job` (run in dir), which must succeed: the job id it prints (free it). */
char *hp_th_hpctl_submit(const char *dir, const char *job);

/* The source and build dirs ($HP_SOURCE_DIR / $HP_BINARY_DIR, which ctest sets, else the
 * configured ones). */
const char *hp_th_source_dir(void);
const char *hp_th_binary_dir(void);
/* Runs `/usr/bin/python3 SOURCE/script ARGS` (ARGS printf-style), killed after timeout_s
 * seconds; returns its exit status (-1: killed by a signal). Output goes to the test's. */
int hp_th_python(int timeout_s, const char *script, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Expects r to have failed with `code` and exactly one stderr line starting with `prog` and
 * containing `want`; frees r. */
void hp_th_expect_cli_error(hp_th_run r, int code, const char *prog, const char *want);

#endif
