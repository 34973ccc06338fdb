/* worker/safetensors.c — the safetensors reader (mmap + full validation) and the atomic
 * writer. See include/hp/safetensors.h for the format and the contracts.
 *
 * Reading never trusts the file: the header length is bounded before anything is parsed,
 * jansson rejects duplicate keys, and every tensor's offsets are checked against its shape
 * and the data region, which the tensors must tile exactly. All per-file memory comes from
 * one arena, bounded by the header size.
 */
#define _GNU_SOURCE /* qsort_r */
#include "hp/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/fsio.h"

struct hp_st_file {
    hp_arena arena;   /* everything below but the mapping */
    const char *what; /* the path, for messages */
    void *map;        /* mmap'd file, or NULL when parsing borrowed memory */
    size_t map_len;
    int n; /* tensors, by data offset */
    hp_st_tensor *t;
    int *by_name; /* [n] indices into t, sorted by name */
    int n_meta;
    hp_st_kv *meta;
};

/* ---- dtypes --------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
#define X(e, name, size) {name, size},
    HP_ST_DTYPE_LIST(X)
#undef X
};

const char *hp_st_dtype_name(hp_st_dtype dt) {
    return (unsigned)dt < HP_ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

size_t hp_st_dtype_size(hp_st_dtype dt) {
    return (unsigned)dt < HP_ST_DTYPE_COUNT ? st_dtypes[dt].size : 0;
}

bool hp_st_dtype_to_hp(hp_st_dtype dt, hp_dtype *out) {
    switch (dt) {
    case HP_ST_F32:
        *out = HP_F32;
        return true;
    case HP_ST_BF16:
        *out = HP_BF16;
        return true;
    case HP_ST_F16:
        *out = HP_F16;
        return true;
    case HP_ST_I32:
        *out = HP_I32;
        return true;
    case HP_ST_I64:
        *out = HP_I64;
        return true;
    case HP_ST_BOOL:
        *out = HP_BOOL;
        return true;
    default:
        return false;
    }
}

hp_st_dtype hp_st_dtype_from_hp(hp_dtype dt) {
    switch (dt) {
    case HP_F32:
        return HP_ST_F32;
    case HP_BF16:
        return HP_ST_BF16;
    case HP_F16:
        return HP_ST_F16;
    case HP_I32:
        return HP_ST_I32;
    case HP_I64:
        return HP_ST_I64;
    case HP_BOOL:
        return HP_ST_BOOL;
    default:
        break;
    }
    HP_ASSERT(!"hp_dtype without a safetensors dtype");
    return HP_ST_F32;
}

static bool dtype_parse(const char *s, hp_st_dtype *out) {
    for (int i = 0; i < HP_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (hp_st_dtype)i;
            return true;
        }
    }
    return false;
}

int64_t hp_st_numel(const hp_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

/* numel * dtype size of a shape whose dims are already known to be in [0, HP_MAX_DIM];
 * false when the element count passes HP_MAX_NUMEL. */
static bool shape_bytes(const int64_t *shape, int rank, hp_st_dtype dt, uint64_t *bytes) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) {
            n = 0;
            break;
        }
        if (n > HP_MAX_NUMEL / shape[i]) return false;
        n *= shape[i];
    }
    *bytes = (uint64_t)n * hp_st_dtype_size(dt);
    return true;
}

/* ---- reading -------------------------------------------------------------------------------- */

static int cmp_offset(const void *a, const void *b) {
    const hp_st_tensor *x = a, *y = b;
    const char *bx = x->data, *by = y->data; /* offsets relative to one base: comparable */
    if (bx != by) return bx < by ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name_idx(const void *a, const void *b, void *ctx) {
    const hp_st_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Parses one tensor entry into t. off_begin is returned for the contiguity check. */
static hp_status parse_tensor(hp_st_file *f, const char *name, json_t *v, uint64_t data_len,
                              hp_st_tensor *t, uint64_t *begin, hp_err *err) {
    const char *w = f->what;
    if (!json_is_object(v))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': entry is not a JSON object", w, name);
    t->name = hp_arena_strdup(&f->arena, name);
    if (!t->name) return hp_errf(err, HP_NOMEM, "%s: out of memory", w);

    json_t *dt = json_object_get(v, "dtype");
    if (!dt) return hp_errf(err, HP_PARSE, "%s: tensor '%s': missing field 'dtype'", w, name);
    if (!json_is_string(dt))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': field 'dtype' is not a string", w, name);
    if (!dtype_parse(json_string_value(dt), &t->dtype))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': unknown dtype '%.32s'", w, name,
                       json_string_value(dt));

    json_t *sh = json_object_get(v, "shape");
    if (!sh) return hp_errf(err, HP_PARSE, "%s: tensor '%s': missing field 'shape'", w, name);
    if (!json_is_array(sh))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': field 'shape' is not an array", w, name);
    if (json_array_size(sh) > HP_ST_MAX_RANK)
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': shape has %zu dims, at most %d supported",
                       w, name, json_array_size(sh), HP_ST_MAX_RANK);
    t->rank = (int)json_array_size(sh);
    for (int i = 0; i < t->rank; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d))
            return hp_errf(err, HP_PARSE, "%s: tensor '%s': shape[%d] is not an integer", w, name,
                           i);
        json_int_t x = json_integer_value(d);
        if (x < 0 || x > HP_MAX_DIM)
            return hp_errf(err, HP_PARSE,
                           "%s: tensor '%s': shape[%d] = %lld is out of range [0, %lld]", w, name,
                           i, (long long)x, (long long)HP_MAX_DIM);
        t->shape[i] = x;
    }

    json_t *of = json_object_get(v, "data_offsets");
    if (!of)
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': missing field 'data_offsets'", w, name);
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(json_array_get(of, 0)) ||
        !json_is_integer(json_array_get(of, 1)))
        return hp_errf(err, HP_PARSE,
                       "%s: tensor '%s': field 'data_offsets' is not an array of two integers", w,
                       name);
    json_int_t b = json_integer_value(json_array_get(of, 0));
    json_int_t e = json_integer_value(json_array_get(of, 1));
    if (b < 0 || e < b || (uint64_t)e > data_len)
        return hp_errf(err, HP_PARSE,
                       "%s: tensor '%s': data_offsets [%lld, %lld] out of range (data region is "
                       "%llu bytes)",
                       w, name, (long long)b, (long long)e, (unsigned long long)data_len);
    uint64_t need;
    if (!shape_bytes(t->shape, t->rank, t->dtype, &need))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': shape has more than %lld elements", w, name,
                       (long long)HP_MAX_NUMEL);
    if ((uint64_t)(e - b) != need)
        return hp_errf(err, HP_PARSE,
                       "%s: tensor '%s': data_offsets [%lld, %lld] span %lld bytes, but %s with "
                       "%lld elements needs %llu",
                       w, name, (long long)b, (long long)e, (long long)(e - b),
                       st_dtypes[t->dtype].name, (long long)hp_st_numel(t),
                       (unsigned long long)need);
    *begin = (uint64_t)b;
    t->nbytes = (size_t)need;
    return HP_OK;
}

static hp_status parse_metadata(hp_st_file *f, json_t *m, hp_err *err) {
    if (!json_is_object(m))
        return hp_errf(err, HP_PARSE, "%s: '__metadata__' is not a JSON object", f->what);
    size_t n = json_object_size(m);
    f->meta = hp_arena_alloc(&f->arena, (n ? n : 1) * sizeof *f->meta);
    if (!f->meta) return hp_errf(err, HP_NOMEM, "%s: out of memory", f->what);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return hp_errf(err, HP_PARSE, "%s: '__metadata__' entry '%s' is not a string", f->what,
                           k);
        hp_st_kv *kv = &f->meta[f->n_meta++];
        kv->key = hp_arena_strdup(&f->arena, k);
        kv->value = hp_arena_strdup(&f->arena, json_string_value(v));
        if (!kv->key || !kv->value) return hp_errf(err, HP_NOMEM, "%s: out of memory", f->what);
    }
    return HP_OK;
}

static hp_status parse_header(hp_st_file *f, const uint8_t *buf, size_t len, hp_err *err) {
    const char *w = f->what;
    if (len < 8)
        return hp_errf(err, HP_PARSE,
                       "%s: file is %zu bytes, shorter than the 8-byte header length", w, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > HP_ST_MAX_HEADER)
        return hp_errf(err, HP_LIMIT, "%s: header length %llu exceeds the limit of %llu bytes", w,
                       (unsigned long long)hlen, (unsigned long long)HP_ST_MAX_HEADER);
    if (hlen > len - 8)
        return hp_errf(err, HP_PARSE,
                       "%s: header length %llu exceeds the file (%zu bytes after the length; "
                       "truncated?)",
                       w, (unsigned long long)hlen, len - 8);
    if (hlen < 2 || buf[8] != '{')
        return hp_errf(err, HP_PARSE, "%s: header does not start with a JSON object", w);
    uint64_t data_len = len - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_out_of_memory || hp__alloc_failing())
            return hp_errf(err, HP_NOMEM, "%s: out of memory parsing the header", w);
        return hp_errf(err, HP_PARSE, "%s: header JSON: %s (at byte %d of the header)", w,
                       jerr.text, jerr.position);
    }
    hp_status s = HP_OK;
    if (!json_is_object(root)) {
        s = hp_errf(err, HP_PARSE, "%s: header is not a JSON object", w);
        goto out;
    }
    size_t n = json_object_size(root);
    f->t = hp_arena_alloc(&f->arena, (n ? n : 1) * sizeof *f->t);
    uint64_t *begins = hp_calloc(n ? n : 1, sizeof *begins);
    if (!f->t || !begins) {
        hp_free(begins);
        s = hp_errf(err, HP_NOMEM, "%s: out of memory", w);
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            s = parse_metadata(f, v, err);
        } else {
            s = parse_tensor(f, k, v, data_len, &f->t[f->n], &begins[f->n], err);
            f->n++;
        }
        if (s != HP_OK) break;
    }
    /* Sort by offset through the data pointers (same base), then check the tiling. */
    for (int i = 0; s == HP_OK && i < f->n; i++) f->t[i].data = data + begins[i];
    hp_free(begins);
    if (s != HP_OK) goto out;
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        uint64_t b = (uint64_t)((const uint8_t *)f->t[i].data - data);
        if (b != at) {
            s = hp_errf(
                err, HP_PARSE,
                "%s: tensor '%s': data_offsets begin at %llu, but the previous tensor%s%s%s "
                "ends at %llu (%s)",
                w, f->t[i].name, (unsigned long long)b, i ? " '" : "", i ? f->t[i - 1].name : "",
                i ? "'" : "", (unsigned long long)at, b < at ? "overlap" : "gap");
            goto out;
        }
        at = b + f->t[i].nbytes;
    }
    if (at != data_len) {
        s = hp_errf(err, HP_PARSE,
                    "%s: tensors cover %llu bytes but the data region has %llu (truncated or "
                    "trailing bytes)",
                    w, (unsigned long long)at, (unsigned long long)data_len);
        goto out;
    }
    f->by_name = hp_arena_alloc(&f->arena, (size_t)(f->n ? f->n : 1) * sizeof *f->by_name);
    if (!f->by_name) {
        s = hp_errf(err, HP_NOMEM, "%s: out of memory", w);
        goto out;
    }
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_idx, f->t);
out:
    json_decref(root);
    return s;
}

static hp_status file_new(const char *what, hp_st_file **out, hp_err *err) {
    hp_st_file *f = hp_calloc(1, sizeof *f);
    if (!f) return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
    hp_arena_init(&f->arena);
    f->what = hp_arena_strdup(&f->arena, what);
    if (!f->what) {
        hp_free(f);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
    }
    *out = f;
    return HP_OK;
}

hp_status hp_st_parse(const void *buf, size_t len, const char *what, hp_st_file **out,
                      hp_err *err) {
    *out = NULL;
    hp__json_init();
    hp_st_file *f = NULL;
    HP_TRY(file_new(what ? what : "safetensors", &f, err));
    hp_status s = parse_header(f, buf, len, err);
    if (s != HP_OK) {
        hp_st_close(f);
        return s;
    }
    *out = f;
    return HP_OK;
}

hp_status hp_st_open(const char *path, hp_st_file **out, hp_err *err) {
    *out = NULL;
    hp__json_init();
    int fd;
    uint64_t fsize;
    HP_TRY(hp_file_open_read(path, &fd, &fsize, err));
    if (fsize < 8) {
        close(fd);
        return hp_errf(err, HP_PARSE,
                       "%s: file is %llu bytes, shorter than the 8-byte header length", path,
                       (unsigned long long)fsize);
    }
    if (fsize > SIZE_MAX) {
        close(fd);
        return hp_errf(err, HP_LIMIT, "%s: file too large to map", path);
    }
    size_t len = (size_t)fsize;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return hp_errf(err, HP_IO, "%s: mmap: %s", path, strerror(e));
    hp_st_file *f = NULL;
    hp_status s = file_new(path, &f, err);
    if (s != HP_OK) {
        munmap(map, len);
        return s;
    }
    f->map = map;
    f->map_len = len;
    s = parse_header(f, map, len, err);
    if (s != HP_OK) {
        hp_st_close(f);
        return s;
    }
    *out = f;
    return HP_OK;
}

void hp_st_close(hp_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    hp_arena_fini(&f->arena);
    hp_free(f);
}

int hp_st_count(const hp_st_file *f) {
    return f->n;
}

const hp_st_tensor *hp_st_at(const hp_st_file *f, int i) {
    HP_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}

const hp_st_tensor *hp_st_find(const hp_st_file *f, const char *name) {
    int lo = 0, hi = f->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) return &f->t[f->by_name[mid]];
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

hp_status hp_st_get(const hp_st_file *f, const char *name, const hp_st_tensor **t, hp_err *err) {
    *t = hp_st_find(f, name);
    if (!*t) return hp_errf(err, HP_NOT_FOUND, "%s: no tensor named '%s'", f->what, name);
    return HP_OK;
}

int hp_st_meta_count(const hp_st_file *f) {
    return f->n_meta;
}

const hp_st_kv *hp_st_meta_at(const hp_st_file *f, int i) {
    HP_ASSERT(i >= 0 && i < f->n_meta);
    return &f->meta[i];
}

const char *hp_st_meta_get(const hp_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

/* ---- conversion ----------------------------------------------------------------------------- */

static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (ex == 0x1f) {
        bits = sign | 0x7f800000u | man << 13; /* inf / nan */
    } else if (ex != 0) {
        bits = sign | (ex + 112) << 23 | man << 13;
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        ex = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            ex--;
        }
        bits = sign | ex << 23 | (man & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

hp_status hp_st_to_f32(const hp_st_tensor *t, float *out, int64_t n, hp_err *err) {
    if (n != hp_st_numel(t))
        return hp_errf(err, HP_INVALID, "tensor '%s': has %lld elements, caller expects %lld",
                       t->name, (long long)hp_st_numel(t), (long long)n);
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case HP_ST_F32:
        if (n) memcpy(out, p, (size_t)n * 4);
        return HP_OK;
    case HP_ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[i], &bits, 4);
        }
        return HP_OK;
    case HP_ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = half_to_f32(h);
        }
        return HP_OK;
    case HP_ST_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return HP_OK;
    default:
        return hp_errf(err, HP_INVALID, "tensor '%s': dtype %s is not a floating type", t->name,
                       hp_st_dtype_name(t->dtype));
    }
}

/* ---- writing -------------------------------------------------------------------------------- */

/* Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF), as JSON strings need. */
static bool utf8_valid(const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    while (*p) {
        uint32_t c = *p;
        int extra = c < 0x80             ? 0
                    : (c & 0xe0) == 0xc0 ? 1
                    : (c & 0xf0) == 0xe0 ? 2
                    : (c & 0xf8) == 0xf0 ? 3
                                         : -1;
        if (extra < 0) return false;
        c &= extra ? 0x3fu >> extra : 0x7f;
        p++;
        for (int i = 0; i < extra; i++, p++) {
            if ((*p & 0xc0) != 0x80) return false;
            c = c << 6 | (*p & 0x3f);
        }
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (c < min[extra] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
    }
    return true;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* First duplicate among names[0..n) (sorted in place), or NULL. */
static const char *find_dup(const char **names, int n) {
    qsort(names, (size_t)n, sizeof *names, cmp_name_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) return names[i];
    return NULL;
}

static hp_status check_tensor(const char *path, const hp_st_tensor *t, int i, hp_err *err) {
    if (!t->name || !t->name[0])
        return hp_errf(err, HP_INVALID, "%s: tensor %d has an empty name", path, i);
    if (!utf8_valid(t->name))
        return hp_errf(err, HP_INVALID, "%s: tensor %d: name is not valid UTF-8", path, i);
    if (strcmp(t->name, "__metadata__") == 0)
        return hp_errf(err, HP_INVALID, "%s: '__metadata__' is reserved as a tensor name", path);
    if ((unsigned)t->dtype >= HP_ST_DTYPE_COUNT)
        return hp_errf(err, HP_INVALID, "%s: tensor '%s': bad dtype %d", path, t->name,
                       (int)t->dtype);
    if (t->rank < 0 || t->rank > HP_ST_MAX_RANK)
        return hp_errf(err, HP_INVALID, "%s: tensor '%s': rank %d out of range [0, %d]", path,
                       t->name, t->rank, HP_ST_MAX_RANK);
    for (int d = 0; d < t->rank; d++)
        if (t->shape[d] < 0 || t->shape[d] > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID, "%s: tensor '%s': shape[%d] = %lld out of range", path,
                           t->name, d, (long long)t->shape[d]);
    uint64_t need;
    if (!shape_bytes(t->shape, t->rank, t->dtype, &need))
        return hp_errf(err, HP_INVALID, "%s: tensor '%s': more than %lld elements", path, t->name,
                       (long long)HP_MAX_NUMEL);
    if (need != t->nbytes)
        return hp_errf(err, HP_INVALID, "%s: tensor '%s': nbytes %zu, but its shape needs %llu",
                       path, t->name, t->nbytes, (unsigned long long)need);
    if (need && !t->data)
        return hp_errf(err, HP_INVALID, "%s: tensor '%s': data is NULL", path, t->name);
    return HP_OK;
}

/* The header JSON for ts/meta as a fresh hp_malloc'd string padded with spaces to a multiple
 * of 8 (length in *hlen). */
static hp_status build_header(const char *path, const hp_st_tensor *ts, int n, const hp_st_kv *meta,
                              int n_meta, char **out, size_t *hlen, hp_err *err) {
    hp_status s = HP_OK;
    json_t *root = json_object();
    if (!root) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0) goto nomem;
        for (int i = 0; i < n_meta; i++) {
            if (json_object_set_new(m, meta[i].key, json_string(meta[i].value)) != 0) goto nomem;
        }
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const hp_st_tensor *t = &ts[i];
        /* json_object_set_new takes its value even when it fails (or the object is NULL),
         * so each piece has exactly one owner at every point. */
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        json_t *b = json_integer((json_int_t)at);
        at += t->nbytes;
        bool bad = json_object_set_new(e, "dtype", json_string(hp_st_dtype_name(t->dtype))) != 0;
        bad |= json_object_set_new(e, "shape", sh) != 0;
        bad |= json_object_set_new(e, "data_offsets", of) != 0;
        if (bad) {
            json_decref(e);
            json_decref(b);
            goto nomem;
        }
        bad = json_array_append_new(of, b) != 0;
        bad |= json_array_append_new(of, json_integer((json_int_t)at)) != 0;
        for (int d = 0; d < t->rank; d++)
            bad |= json_array_append_new(sh, json_integer(t->shape[d])) != 0;
        if (bad) {
            json_decref(e);
            goto nomem;
        }
        if (json_object_set_new(root, t->name, e) != 0) goto nomem;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) goto nomem;
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char *buf = hp_malloc(padded + 1);
    if (!buf) {
        hp_free(text); /* jansson allocates through hp_malloc (hp__json_init) */
        goto nomem;
    }
    memcpy(buf, text, len);
    memset(buf + len, ' ', padded - len);
    buf[padded] = 0;
    hp_free(text);
    *out = buf;
    *hlen = padded;
    goto out;
nomem:
    s = hp_errf(err, HP_NOMEM, "%s: out of memory building the header", path);
out:
    json_decref(root);
    return s;
}

hp_status hp_st_write(const char *path, const hp_st_tensor *ts, int n, const hp_st_kv *meta,
                      int n_meta, hp_err *err) {
    hp__json_init();
    if (n < 0 || n_meta < 0) return hp_errf(err, HP_INVALID, "%s: negative tensor count", path);
    for (int i = 0; i < n; i++) HP_TRY(check_tensor(path, &ts[i], i, err));
    for (int i = 0; i < n_meta; i++)
        if (!meta[i].key || !meta[i].value || !utf8_valid(meta[i].key) ||
            !utf8_valid(meta[i].value))
            return hp_errf(err, HP_INVALID,
                           "%s: metadata entry %d: key or value is NULL or not valid UTF-8", path,
                           i);
    int most = n > n_meta ? n : n_meta;
    const char **names = hp_malloc((size_t)(most ? most : 1) * sizeof *names);
    if (!names) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) names[i] = ts[i].name;
    const char *dup = find_dup(names, n);
    if (dup) {
        hp_status s = hp_errf(err, HP_INVALID, "%s: tensor name '%s' appears twice", path, dup);
        hp_free(names);
        return s;
    }
    for (int i = 0; i < n_meta; i++) names[i] = meta[i].key;
    dup = find_dup(names, n_meta);
    if (dup) {
        hp_status s = hp_errf(err, HP_INVALID, "%s: metadata key '%s' appears twice", path, dup);
        hp_free(names);
        return s;
    }
    hp_free(names);

    char *header = NULL;
    size_t hlen = 0;
    HP_TRY(build_header(path, ts, n, meta, n_meta, &header, &hlen, err));
    hp_iov *v = hp_malloc((size_t)(n + 2) * sizeof *v);
    if (!v) {
        hp_free(header);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    v[0] = (hp_iov){len8, 8};
    v[1] = (hp_iov){header, hlen};
    for (int i = 0; i < n; i++) v[i + 2] = (hp_iov){ts[i].data, ts[i].nbytes};
    hp_status s = hp_file_write_atomic_iov(path, v, n + 2, err);
    hp_free(v);
    hp_free(header);
    return s;
}
