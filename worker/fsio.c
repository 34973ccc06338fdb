/* worker/fsio.c — durable atomic writes, directory fsync and the jansson allocator hook
 * (see fsio.h). POSIX only. */
#include "worker/fsio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *hp__path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = hp_malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    size_t k = la;
    if (la && a[la - 1] != '/') p[k++] = '/';
    memcpy(p + k, b, lb + 1);
    return p;
}

hp_status hp__fsync_dir(const char *dir, hp_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return hp_errf(err, HP_IO, "%s: %s", dir, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) { /* some file systems cannot fsync a directory */
        int e = errno;
        close(fd);
        return hp_errf(err, HP_IO, "%s: fsync: %s", dir, strerror(e));
    }
    close(fd);
    return HP_OK;
}

static hp_status mkdir_one(const char *dir, hp_err *err) {
    if (mkdir(dir, 0755) == 0) return HP_OK;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return HP_OK;
    return hp_errf(err, HP_IO, "%s: cannot create directory: %s", dir,
                   e == EEXIST ? "exists and is not a directory" : strerror(e));
}

hp_status hp__mkdir(const char *dir, hp_err *err) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return HP_OK;
    char *p = hp_strdup(dir);
    if (!p) return hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
    hp_status s = HP_OK;
    for (char *q = p + 1; s == HP_OK && *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        s = mkdir_one(p, err);
        *q = '/';
    }
    if (s == HP_OK) s = mkdir_one(p, err);
    hp_free(p);
    return s;
}

/* The directory part of path ("." when there is none), into buf. */
static void parent_dir(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(buf, len, ".");
    } else if (slash == path) {
        snprintf(buf, len, "/");
    } else {
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
    }
}

hp_status hp__write_atomic_iov(const char *path, const hp__iov *v, int n, hp_err *err) {
    size_t plen = strlen(path);
    char *tmp = hp_malloc(plen + 32);
    char *dir = hp_malloc(plen + 2);
    if (!tmp || !dir) {
        hp_free(tmp);
        hp_free(dir);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    parent_dir(path, dir, plen + 2);
    const char *what = "open";
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) goto fail;
    what = "write";
    for (int i = 0; i < n; i++) {
        const unsigned char *p = v[i].p;
        size_t done = 0;
        while (done < v[i].n) {
            ssize_t w = write(fd, p + done, v[i].n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) goto fail;
            done += (size_t)w;
        }
    }
    what = "fsync";
    if (fsync(fd) != 0) goto fail;
    what = "close";
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    what = "rename";
    if (rename(tmp, path) != 0) goto fail;
    hp_free(tmp);
    hp_status s = hp__fsync_dir(dir, err);
    hp_free(dir);
    return s;
fail:;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    hp_free(tmp);
    hp_free(dir);
    return hp_errf(err, HP_IO, "%s: %s: %s", path, what, strerror(e));
}

static pthread_once_t json_once = PTHREAD_ONCE_INIT;

static void json_init_once(void) {
    json_set_alloc_funcs(hp_malloc, hp_free);
}

void hp__json_init(void) {
    pthread_once(&json_once, json_init_once);
}

bool hp__alloc_failing(void) {
    void *p = hp_malloc(64);
    hp_free(p);
    return p == NULL;
}
