/* worker/data.c — token sources (byte-level text, llm.c shards) and the counter-based batch
 * sampler. See include/hp/data.h for the sources, the shard format and the sampling scheme.
 *
 * Shards are mmap'd read-only and validated once at open (header, size, every token against
 * the vocabulary); text is read into one buffer of at most HP_DATA_TEXT_MAX bytes. Sampling
 * keeps no state: a batch is a pure function of (config, rank, step).
 */
#define _GNU_SOURCE
#include "hp/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/fsio.h"

typedef struct shard {
    char *path;
    const uint8_t *tok;   /* token bytes: `width` bytes per token, little-endian */
    int width;            /* 1 (text bytes), 2 (llm.c v1), 4 (llm.c v7) */
    int64_t n;            /* tokens */
    int64_t first_window; /* global number of this shard's window 0 */
    void *map;            /* the mapped file (llm.c shards), or NULL */
    size_t map_len;
    uint8_t *owned; /* the text buffer (byte-level), or NULL */
} shard;

struct hp_data {
    hp_data_config cfg; /* path points at path_copy */
    char *path_copy;
    int n_shards;
    shard *shards;
    hp_data_info info;
    int half_bits; /* Feistel halves: the permutation domain is 4^half_bits >= W */
};

/* ---- hashing -------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    uint64_t tail = 0;
    for (size_t k = 0; i + k < n; k++) tail |= (uint64_t)p[i + k] << (8 * k);
    return mix64(h ^ tail ^ (uint64_t)n);
}

/* ---- sources -------------------------------------------------------------------------------- */

typedef struct name_list {
    char **v;
    int n, cap;
} name_list;

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++) hp_free(l->v[i]);
    hp_free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* Appends a copy of s; takes nothing on failure. */
static hp_status names_push(name_list *l, const char *s, hp_err *err) {
    if (l->n == HP_DATA_MAX_SHARDS)
        return hp_errf(err, HP_LIMIT, "more than %d data files (at %s)", HP_DATA_MAX_SHARDS, s);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **v = hp_realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return hp_errf(err, HP_NOMEM, "out of memory listing data files");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = hp_strdup(s);
    if (!l->v[l->n]) return hp_errf(err, HP_NOMEM, "out of memory listing data files");
    l->n++;
    return HP_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir (symlinks skipped when !follow; only *.bin when bin_only), full
 * paths, sorted byte-wise (not by locale, so every machine agrees). */
static hp_status list_dir(const char *dir, bool bin_only, bool follow, name_list *out,
                          hp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return hp_errf(err, HP_IO, "%s: %s", dir, strerror(errno));
    hp_status s = HP_OK;
    struct dirent *e;
    while (s == HP_OK && (errno = 0, e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.') continue;
        if (bin_only && (len < 4 || strcmp(e->d_name + len - 4, ".bin") != 0)) continue;
        char *p = hp__path_join(dir, e->d_name);
        if (!p) {
            s = hp_errf(err, HP_NOMEM, "out of memory listing %s", dir);
            break;
        }
        struct stat st;
        int r = follow ? stat(p, &st) : lstat(p, &st);
        if (r == 0 && S_ISREG(st.st_mode)) s = names_push(out, p, err);
        hp_free(p);
    }
    if (s == HP_OK && errno) s = hp_errf(err, HP_IO, "%s: %s", dir, strerror(errno));
    closedir(d);
    if (s == HP_OK && out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
    return s;
}

/* Reads up to cap bytes of path into buf; *got is what was read (a short file is fine). */
static hp_status read_prefix(const char *path, uint8_t *buf, size_t cap, size_t *got, hp_err *err) {
    *got = 0;
    int fd;
    HP_TRY(hp_file_open_read(path, &fd, NULL, err));
    while (*got < cap) {
        ssize_t r = read(fd, buf + *got, cap - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return hp_errf(err, HP_IO, "%s: %s", path, strerror(e));
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    close(fd);
    return HP_OK;
}

/* Byte-level text from a file or a directory's regular files, as one shard. */
static hp_status open_text(const char *src, shard *sh, hp_err *err) {
    name_list files = {0};
    struct stat st;
    if (stat(src, &st) != 0) return hp_errf(err, HP_IO, "%s: %s", src, strerror(errno));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) /* a fifo would block the reader */
        return hp_errf(err, HP_IO, "%s: not a regular file or directory", src);
    hp_status s = S_ISDIR(st.st_mode) ? list_dir(src, false, false, &files, err)
                                      : names_push(&files, src, err);
    if (s != HP_OK) goto out;
    if (files.n == 0) {
        s = hp_errf(err, HP_NOT_FOUND, "%s: no regular files to read as text", src);
        goto out;
    }
    size_t total = 0; /* what the files hold now, capped */
    for (int i = 0; i < files.n && total < HP_DATA_TEXT_MAX; i++) {
        if (stat(files.v[i], &st) != 0) {
            s = hp_errf(err, HP_IO, "%s: %s", files.v[i], strerror(errno));
            goto out;
        }
        size_t left = HP_DATA_TEXT_MAX - total;
        total += (uint64_t)st.st_size < left ? (size_t)st.st_size : left;
    }
    sh->owned = hp_malloc(total ? total : 1);
    if (!sh->owned) {
        s = hp_errf(err, HP_NOMEM, "%s: out of memory for %zu bytes of text", src, total);
        goto out;
    }
    size_t at = 0;
    for (int i = 0; i < files.n && at < total; i++) {
        size_t got;
        s = read_prefix(files.v[i], sh->owned + at, total - at, &got, err);
        if (s != HP_OK) goto out;
        at += got;
    }
    sh->path = hp_strdup(src);
    if (!sh->path) {
        s = hp_errf(err, HP_NOMEM, "out of memory");
        goto out;
    }
    sh->tok = sh->owned;
    sh->width = 1;
    sh->n = (int64_t)at;
out:
    names_free(&files);
    return s;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t token_at(const shard *sh, int64_t i) {
    const uint8_t *p = sh->tok + (size_t)i * (size_t)sh->width;
    switch (sh->width) {
    case 1:
        return p[0];
    case 2:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default:
        return rd32(p);
    }
}

/* Maps and validates one llm.c shard. */
static hp_status open_shard(const char *path, int64_t vocab, shard *sh, hp_err *err) {
    sh->path = hp_strdup(path);
    if (!sh->path) return hp_errf(err, HP_NOMEM, "out of memory");
    int fd;
    uint64_t fsize;
    HP_TRY(hp_file_open_read(path, &fd, &fsize, err));
    const size_t hdr = HP_LLMC_HEADER_INTS * 4;
    if (fsize < hdr || fsize > SIZE_MAX) {
        close(fd);
        return hp_errf(err, HP_PARSE,
                       "%s: %s file: %llu bytes, less than the %zu-byte llm.c shard header", path,
                       fsize < hdr ? "short" : "huge", (unsigned long long)fsize, hdr);
    }
    sh->map_len = (size_t)fsize;
    void *map = mmap(NULL, sh->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return hp_errf(err, HP_IO, "%s: mmap: %s", path, strerror(e));
    sh->map = map;
    const uint8_t *h = map;
    uint32_t magic = rd32(h), version = rd32(h + 4);
    int32_t count = (int32_t)rd32(h + 8);
    if (magic == HP_LLMC_MAGIC_U16) {
        if (version != 1)
            return hp_errf(err, HP_PARSE,
                           "%s: header[1] version %u with magic %u, expected version 1", path,
                           version, magic);
        sh->width = 2;
    } else if (magic == HP_LLMC_MAGIC_U32) {
        if (version != 7)
            return hp_errf(err, HP_PARSE,
                           "%s: header[1] version %u with magic %u, expected version 7", path,
                           version, magic);
        sh->width = 4;
    } else {
        return hp_errf(err, HP_PARSE,
                       "%s: header[0] magic %u is not an llm.c token shard's (%d for uint16 "
                       "tokens, %d for uint32)",
                       path, magic, HP_LLMC_MAGIC_U16, HP_LLMC_MAGIC_U32);
    }
    if (count < 0)
        return hp_errf(err, HP_PARSE, "%s: header[2] token count %d is negative", path, count);
    uint64_t want = hdr + (uint64_t)count * (uint64_t)sh->width;
    if (want != sh->map_len)
        return hp_errf(err, HP_PARSE,
                       "%s: header[2] says %d tokens (%llu bytes with the header) but the file "
                       "has %zu bytes (%s)",
                       path, count, (unsigned long long)want, sh->map_len,
                       want > sh->map_len ? "truncated" : "trailing bytes");
    sh->tok = h + hdr;
    sh->n = count;
    for (int64_t i = 0; i < sh->n; i++) {
        uint32_t t = token_at(sh, i);
        if ((int64_t)t >= vocab)
            return hp_errf(
                err, HP_PARSE, "%s: token %u at index %lld (byte offset %llu) is >= vocab %lld",
                path, t, (long long)i,
                (unsigned long long)(hdr + (uint64_t)i * (uint64_t)sh->width), (long long)vocab);
    }
    return HP_OK;
}

static bool has_glob_chars(const char *s) {
    return strpbrk(s, "*?[") != NULL;
}

/* The shard paths a path names (a file, a directory of *.bin, or a glob). */
static hp_status resolve_shards(const char *path, name_list *out, hp_err *err) {
    if (has_glob_chars(path)) {
        glob_t g;
        int r = glob(path, GLOB_ERR, NULL, &g);
        if (r == GLOB_NOMATCH)
            return hp_errf(err, HP_NOT_FOUND, "%s: no file matches the pattern", path);
        if (r != 0) {
            if (r != GLOB_NOSPACE) globfree(&g);
            return hp_errf(err, r == GLOB_NOSPACE ? HP_NOMEM : HP_IO,
                           "%s: cannot expand the pattern", path);
        }
        hp_status s = HP_OK;
        for (size_t i = 0; s == HP_OK && i < g.gl_pathc; i++)
            s = names_push(out, g.gl_pathv[i], err);
        globfree(&g);
        if (s == HP_OK) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
        return s;
    }
    struct stat st;
    if (stat(path, &st) != 0) return hp_errf(err, HP_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return names_push(out, path, err);
    HP_TRY(list_dir(path, true, true, out, err));
    if (out->n == 0) return hp_errf(err, HP_NOT_FOUND, "%s: no *.bin shard in the directory", path);
    return HP_OK;
}

/* ---- open / free ---------------------------------------------------------------------------- */

static hp_status check_config(const hp_data_config *c, hp_err *err) {
    if (c->vocab <= 0 || c->vocab > ((int64_t)1 << 32))
        return hp_errf(err, HP_INVALID, "data: vocab %lld out of range [1, 2^32]",
                       (long long)c->vocab);
    if (c->batch <= 0 || c->batch > ((int64_t)1 << 30))
        return hp_errf(err, HP_INVALID, "data: batch %lld out of range [1, 2^30]",
                       (long long)c->batch);
    if (c->seq <= 0 || c->seq > ((int64_t)1 << 30))
        return hp_errf(err, HP_INVALID, "data: seq %lld out of range [1, 2^30]", (long long)c->seq);
    if (c->world <= 0 || c->world > (1 << 20))
        return hp_errf(err, HP_INVALID, "data: world %d out of range [1, 2^20]", c->world);
    return HP_OK;
}

void hp_data_free(hp_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n_shards; i++) {
        shard *sh = &d->shards[i];
        if (sh->map) munmap(sh->map, sh->map_len);
        hp_free(sh->owned);
        hp_free(sh->path);
    }
    hp_free(d->shards);
    hp_free(d->path_copy);
    hp_free(d);
}

static hp_status open_sources(hp_data *d, hp_err *err) {
    const char *path = d->cfg.path;
    bool text = !path || !path[0] || strncmp(path, "text:", 5) == 0;
    if (text) {
        d->shards = hp_calloc(1, sizeof *d->shards);
        if (!d->shards) return hp_errf(err, HP_NOMEM, "data: out of memory");
        d->n_shards = 1;
        d->info.byte_level = true;
        return open_text(path && path[0] ? path + 5 : HP_DATA_DEFAULT_DIR, &d->shards[0], err);
    }
    name_list files = {0};
    hp_status s = resolve_shards(path, &files, err);
    if (s == HP_OK) {
        d->shards = hp_calloc((size_t)files.n, sizeof *d->shards);
        if (!d->shards) s = hp_errf(err, HP_NOMEM, "data: out of memory");
    }
    for (int i = 0; s == HP_OK && i < files.n; i++) {
        d->n_shards++;
        s = open_shard(files.v[i], d->cfg.vocab, &d->shards[i], err);
    }
    names_free(&files);
    return s;
}

hp_status hp_data_open(const hp_data_config *cfg, hp_data **out, hp_err *err) {
    *out = NULL;
    HP_TRY(check_config(cfg, err));
    hp_data *d = hp_calloc(1, sizeof *d);
    if (!d) return hp_errf(err, HP_NOMEM, "data: out of memory");
    d->cfg = *cfg;
    if (cfg->path) {
        d->path_copy = hp_strdup(cfg->path);
        if (!d->path_copy) {
            hp_data_free(d);
            return hp_errf(err, HP_NOMEM, "data: out of memory");
        }
        d->cfg.path = d->path_copy;
    }
    hp_status s = open_sources(d, err);
    if (s != HP_OK) {
        hp_data_free(d);
        return s;
    }
    int64_t T = cfg->seq, w = 0, tokens = 0;
    uint64_t h = 0x6870646174610001ull; /* "hpdata" v1 */
    for (int i = 0; i < d->n_shards; i++) {
        shard *sh = &d->shards[i];
        sh->first_window = w;
        w += sh->n >= T + 1 ? (sh->n - 1) / T : 0;
        tokens += sh->n;
        h = hash_bytes(h ^ (uint64_t)sh->width, sh->tok, (size_t)sh->n * (size_t)sh->width);
    }
    if (w == 0) {
        s = hp_errf(err, HP_LIMIT,
                    "data %s: no shard has the %lld tokens one sample of seq %lld needs (%lld "
                    "tokens in %d shard%s)",
                    cfg->path && cfg->path[0] ? cfg->path : HP_DATA_DEFAULT_DIR, (long long)(T + 1),
                    (long long)T, (long long)tokens, d->n_shards, d->n_shards == 1 ? "" : "s");
        hp_data_free(d);
        return s;
    }
    d->info.n_shards = d->n_shards;
    d->info.n_tokens = tokens;
    d->info.n_windows = w;
    d->info.fingerprint = h;
    int bits = 0;
    while (bits < 62 && ((int64_t)1 << bits) < w) bits++;
    d->half_bits = bits < 2 ? 1 : (bits + 1) / 2;
    *out = d;
    return HP_OK;
}

const hp_data_info *hp_data_get_info(const hp_data *d) {
    return &d->info;
}

/* ---- sampling ------------------------------------------------------------------------------- */

/* A bijection on [0, 4^half_bits) keyed by key: a 6-round balanced Feistel network. */
static uint64_t feistel(int half_bits, uint64_t key, uint64_t x) {
    uint64_t mask = ((uint64_t)1 << half_bits) - 1;
    uint64_t l = x >> half_bits, r = x & mask;
    for (uint64_t round = 0; round < 6; round++) {
        uint64_t f = mix64(r ^ mix64(key + round * 0x9e3779b97f4a7c15ull)) & mask;
        uint64_t t = l ^ f;
        l = r;
        r = t;
    }
    return l << half_bits | r;
}

/* The window read by the i-th sample of epoch e. Cycle walking keeps the permutation inside
 * [0, W): starting from i < W, the orbit returns below W within a few steps on average
 * (the domain is less than 4 W). */
static int64_t window_of(const hp_data *d, int64_t e, int64_t i) {
    if (d->cfg.sequential) return i;
    uint64_t key = mix64(d->cfg.seed ^ mix64((uint64_t)e + 0x68705f64617461ull));
    uint64_t x = (uint64_t)i;
    do x = feistel(d->half_bits, key, x);
    while (x >= (uint64_t)d->info.n_windows);
    return (int64_t)x;
}

static const shard *shard_of(const hp_data *d, int64_t w) {
    int lo = 0, hi = d->n_shards; /* last shard whose first_window <= w */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (d->shards[mid].first_window <= w) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return &d->shards[lo];
}

hp_status hp_data_next(const hp_data *d, int rank, int64_t step, int64_t *tokens, int64_t *labels,
                       hp_err *err) {
    const int64_t B = d->cfg.batch, T = d->cfg.seq, G = B * d->cfg.world;
    if (rank < 0 || rank >= d->cfg.world)
        return hp_errf(err, HP_INVALID, "data: rank %d out of range [0, %d)", rank, d->cfg.world);
    if (step < 0) return hp_errf(err, HP_INVALID, "data: step %lld is negative", (long long)step);
    if (step > (INT64_MAX - G) / G)
        return hp_errf(err, HP_LIMIT, "data: step %lld overflows the sample index",
                       (long long)step);
    const int64_t W = d->info.n_windows, vocab = d->cfg.vocab;
    const bool wrap = d->info.byte_level && vocab < 256;
    for (int64_t b = 0; b < B; b++) {
        int64_t g = step * G + (int64_t)rank * B + b;
        int64_t w = window_of(d, g / W, g % W);
        const shard *sh = shard_of(d, w);
        int64_t start = (w - sh->first_window) * T;
        for (int64_t t = 0; t <= T; t++) {
            int64_t v = token_at(sh, start + t);
            if (wrap) v %= vocab;
            if (t < T) tokens[b * T + t] = v;
            if (t > 0) labels[b * T + t - 1] = v;
        }
    }
    return HP_OK;
}

hp_data_position hp_data_position_at(const hp_data *d, int64_t step) {
    int64_t G = d->cfg.batch * d->cfg.world;
    hp_data_position p = {0, 0};
    if (step <= 0 || step > INT64_MAX / G) return p;
    p.samples = step * G;
    p.epoch = p.samples / d->info.n_windows;
    return p;
}

/* ---- writing shards ------------------------------------------------------------------------- */

hp_status hp_data_write_shard(const char *path, const uint32_t *tokens, int64_t n, int version,
                              hp_err *err) {
    if (version != 1 && version != 7)
        return hp_errf(err, HP_INVALID, "%s: llm.c shard version %d (1 or 7)", path, version);
    if (n < 0 || n > INT32_MAX)
        return hp_errf(err, HP_INVALID, "%s: %lld tokens do not fit a shard header", path,
                       (long long)n);
    int width = version == 1 ? 2 : 4;
    int32_t hdr[HP_LLMC_HEADER_INTS] = {0};
    hdr[0] = version == 1 ? HP_LLMC_MAGIC_U16 : HP_LLMC_MAGIC_U32;
    hdr[1] = version;
    hdr[2] = (int32_t)n;
    uint8_t *body = hp_malloc((size_t)n * (size_t)width + 1);
    if (!body) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) {
        if (width == 2 && tokens[i] > 0xffff) {
            hp_free(body);
            return hp_errf(err, HP_INVALID, "%s: token %u at index %lld does not fit uint16", path,
                           tokens[i], (long long)i);
        }
        for (int k = 0; k < width; k++) body[i * width + k] = (uint8_t)(tokens[i] >> (8 * k));
    }
    hp_iov v[2] = {{hdr, sizeof hdr}, {body, (size_t)n * (size_t)width}};
    hp_status s = hp_file_write_atomic_iov(path, v, 2, err);
    hp_free(body);
    return s;
}
