/* tests/graph/test_fileio.c — the one durable atomic writer (hp_file_write_atomic_iov), directory
 * fsync and mkdir -p from graph/base.c: the write replaces the file whole, fsyncs the file and
 * then its directory (counted through the I/O fault hook), and a fault loop fails every one of
 * its system calls in turn (ENOSPC and EIO): each gives an error naming the path and the step,
 * ENOSPC is HP_NOSPACE, the file holds the old or the new contents and never a mix, and no
 * temporary file stays behind.
 */
#include "hp/base.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hp_fileio_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    hp_io_fail_at(-1, 0, false);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(fileio, .init = make_tmp, .fini = rm_tmp);

static char *slurp(const char *path) {
    uint8_t *d = NULL;
    size_t n = 0;
    hp_err e;
    if (hp_file_read(path, 1 << 20, &d, &n, &e) != HP_OK) return NULL;
    return (char *)d;
}

/* Entries of tmpdir other than "." and ".." whose name contains `part`. */
static int count_named(const char *part) {
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

Test(fileio, write_replaces_the_file_whole) {
    char path[128];
    snprintf(path, sizeof path, "%s/f.txt", tmpdir);
    hp_err e;
    cr_assert_eq(hp_file_write_atomic(path, "old contents", 12, &e), HP_OK, "%s", e.msg);
    hp_iov v[3] = {{"new ", 4}, {"", 0}, {"contents!", 9}};
    cr_assert_eq(hp_file_write_atomic_iov(path, v, 3, &e), HP_OK, "%s", e.msg);
    char *s = slurp(path);
    cr_assert_str_eq(s, "new contents!");
    hp_free(s);
    cr_expect_eq(count_named(".tmp."), 0);
}

/* Durable: file fsync before the rename, then the directory's fsync after it. Counted with the
 * fault hook: open, write, fsync, close, rename, open the directory, fsync it. */
Test(fileio, write_fsyncs_the_file_and_then_its_directory) {
    char path[128];
    snprintf(path, sizeof path, "%s/d.txt", tmpdir);
    hp_err e;
    hp_io_fail_at(-1, 0, false);
    cr_assert_eq(hp_file_write_atomic(path, "x", 1, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(hp_io_fail_at(-1, 0, false), 7, "open+write+fsync+close+rename+dir open+fsync");
    /* the last call is the directory's fsync: failing it is reported, naming the directory */
    hp_io_fail_at(6, EIO, false);
    cr_expect_eq(hp_file_write_atomic(path, "y", 1, &e), HP_IO);
    hp_io_fail_at(-1, 0, false);
    cr_expect(strstr(e.msg, tmpdir) && strstr(e.msg, "fsync"), "%s", e.msg);
}

static void fault_loop(int errnum, hp_status want) {
    char path[128];
    snprintf(path, sizeof path, "%s/loop.bin", tmpdir);
    hp_err e;
    cr_assert_eq(hp_file_write_atomic(path, "OLD", 3, &e), HP_OK, "%s", e.msg);
    hp_iov v[2] = {{"NEW-", 4}, {"CONTENTS", 8}};
    hp_io_fail_at(-1, 0, false);
    cr_assert_eq(hp_file_write_atomic_iov(path, v, 2, &e), HP_OK, "%s", e.msg);
    long calls = hp_io_fail_at(-1, 0, false);
    cr_assert_geq(calls, 7);
    for (long i = 0; i < calls; i++) {
        cr_assert_eq(hp_file_write_atomic(path, "OLD", 3, &e), HP_OK, "%s", e.msg);
        hp_io_fail_at(i, errnum, true);
        hp_status s = hp_file_write_atomic_iov(path, v, 2, &e);
        hp_io_fail_at(-1, 0, false);
        cr_assert_eq(s, want, "fault %ld of %ld: %s (%s)", i, calls, hp_status_name(s), e.msg);
        cr_expect(strstr(e.msg, tmpdir), "fault %ld: the message names no path: %s", i, e.msg);
        cr_expect(strstr(e.msg, strerror(errnum)), "fault %ld: %s", i, e.msg);
        char *got = slurp(path);
        cr_assert_not_null(got, "fault %ld: %s is gone", i, path);
        cr_expect(!strcmp(got, "OLD") || !strcmp(got, "NEW-CONTENTS"),
                  "fault %ld: a mix was read: '%s'", i, got);
        hp_free(got);
        cr_expect_eq(count_named(".tmp."), 0, "fault %ld left a temporary file", i);
    }
}

Test(fileio, every_fault_point_no_space) {
    fault_loop(ENOSPC, HP_NOSPACE);
}

Test(fileio, every_fault_point_io_error) {
    fault_loop(EIO, HP_IO);
}

/* The rename would replace whatever is at the path: a device, a fifo or a directory there is
 * refused, naming it, and left alone. */
Test(fileio, write_refuses_to_replace_what_is_not_a_file) {
    hp_err e;
    cr_expect_eq(hp_file_write_atomic("/dev/null", "x", 1, &e), HP_IO);
    cr_expect(strstr(e.msg, "/dev/null: not a regular file (a character device)"), "%s", e.msg);
    struct stat st;
    cr_expect(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode), "/dev/null was replaced");
    char path[128];
    snprintf(path, sizeof path, "%s/sub", tmpdir);
    cr_assert_eq(hp_mkdir_p(path, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(hp_file_write_atomic(path, "x", 1, &e), HP_IO);
    cr_expect(strstr(e.msg, "a directory"), "%s", e.msg);
    cr_expect(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
}

Test(fileio, mkdir_p) {
    char path[192];
    hp_err e;
    snprintf(path, sizeof path, "%s/a/b//c/", tmpdir);
    cr_assert_eq(hp_mkdir_p(path, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_mkdir_p(path, &e), HP_OK, "an existing directory: %s", e.msg);
    struct stat st;
    snprintf(path, sizeof path, "%s/a/b/c", tmpdir);
    cr_expect(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    snprintf(path, sizeof path, "%s/file", tmpdir);
    cr_assert_eq(hp_file_write_atomic(path, "x", 1, &e), HP_OK, "%s", e.msg);
    snprintf(path, sizeof path, "%s/file/sub", tmpdir);
    cr_expect_eq(hp_mkdir_p(path, &e), HP_IO);
    cr_expect(strstr(e.msg, "/file"), "%s", e.msg);
    cr_expect_eq(hp_mkdir_p("", &e), HP_INVALID);
    snprintf(path, sizeof path, "%s/x/y", tmpdir);
    hp_io_fail_at(1, ENOSPC, false); /* existing parents make no call: x, then y fails */
    cr_expect_eq(hp_mkdir_p(path, &e), HP_NOSPACE);
    hp_io_fail_at(-1, 0, false);
    cr_expect(strstr(e.msg, "/x/y") && strstr(e.msg, strerror(ENOSPC)), "%s", e.msg);
    cr_expect_eq(hp_mkdir_p(path, &e), HP_OK, "%s", e.msg);
}
