/* tests/util/cli_harness.c — see cli_harness.h. */
#include "tests/util/cli_harness.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef HP_BINARY_DIR
#define HP_BINARY_DIR "."
#endif

void hp_th_tmpdir_make(char *dir, size_t len, const char *prefix) {
    snprintf(dir, len, "/tmp/%s-XXXXXX", prefix);
    cr_assert(mkdtemp(dir), "mkdtemp %s", dir);
}

void hp_th_tmpdir_remove(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

char *hp_th_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

hp_th_run hp_th_run_bin(const char *tmpdir, const char *bin, const char *fmt, ...) {
    char args[2048], cmd[4096], p[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s/%s %s >%s/out 2>%s/err", hp_th_binary_dir(), bin, args, tmpdir,
             tmpdir);
    int st = system(cmd);
    hp_th_run r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    snprintf(p, sizeof p, "%s/out", tmpdir);
    r.out = hp_th_slurp(p);
    snprintf(p, sizeof p, "%s/err", tmpdir);
    r.err = hp_th_slurp(p);
    return r;
}

hp_th_run hp_th_run_bin_timeout(const char *tmpdir, int timeout_s, const char *bin, const char *fmt,
                                ...) {
    char args[2048], cmd[4096], p[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "timeout -s KILL %d %s/%s %s >%s/out 2>%s/err", timeout_s,
             hp_th_binary_dir(), bin, args, tmpdir, tmpdir);
    int st = system(cmd);
    hp_th_run r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    snprintf(p, sizeof p, "%s/out", tmpdir);
    r.out = hp_th_slurp(p);
    snprintf(p, sizeof p, "%s/err", tmpdir);
    r.err = hp_th_slurp(p);
    return r;
}

char *hp_th_slurp_or_empty(const char *path) {
    if (access(path, F_OK) != 0) {
        char *s = strdup("");
        cr_assert(s);
        return s;
    }
    return hp_th_slurp(path);
}

#ifndef HP_SOURCE_DIR
#define HP_SOURCE_DIR "."
#endif

const char *hp_th_source_dir(void) {
    const char *v = getenv("HP_SOURCE_DIR");
    return v && *v ? v : HP_SOURCE_DIR;
}

const char *hp_th_binary_dir(void) {
    const char *v = getenv("HP_BINARY_DIR");
    return v && *v ? v : HP_BINARY_DIR;
}

int hp_th_python(int timeout_s, const char *script, const char *fmt, ...) {
    char args[3000], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "timeout %d /usr/bin/python3 %s/%s %s", timeout_s, hp_th_source_dir(),
             script, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

hp_th_run hp_th_hpctl(const char *dir, int timeout_s, const char *fmt, ...) {
    char args[2048], cmd[4096], p[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd %s && timeout %d %s/client/hpctl %s >%s/out 2>%s/err", dir,
             timeout_s, hp_th_binary_dir(), args, dir, dir);
    int st = system(cmd);
    hp_th_run r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    snprintf(p, sizeof p, "%s/out", dir);
    r.out = hp_th_slurp_or_empty(p);
    snprintf(p, sizeof p, "%s/err", dir);
    r.err = hp_th_slurp_or_empty(p);
    return r;
}

char *hp_th_hpctl_submit(const char *dir, const char *job) {
    hp_th_run r = hp_th_hpctl(dir, 300, "submit %s/%s", dir, job);
    cr_assert_eq(r.code, 0, "submit: %s", r.err);
    r.out[strcspn(r.out, "\n")] = 0;
    char *id = strdup(r.out);
    hp_th_run_free(&r);
    cr_assert(id[0], "submit printed no id");
    return id;
}

void hp_th_run_free(hp_th_run *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void hp_th_expect_cli_error(hp_th_run r, int code, const char *prog, const char *want) {
    cr_expect_eq(r.code, code, "exit %d, want %d (stderr: %s)", r.code, code, r.err);
    cr_expect(strncmp(r.err, prog, strlen(prog)) == 0, "stderr '%s'", r.err);
    char *nl = strchr(r.err, '\n');
    cr_expect(nl && nl[1] == 0, "stderr is not one line: '%s'", r.err);
    cr_expect(strstr(r.err, want), "stderr '%s' lacks '%s'", r.err, want);
    hp_th_run_free(&r);
}
