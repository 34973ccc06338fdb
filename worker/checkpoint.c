/* worker/checkpoint.c — writing sharded checkpoints: per-rank safetensors files, the
 * commit that validates them all and writes the index last, `latest` by scanning the step
 * directories, and pruning. Reading lives in checkpoint_read.c. See include/hp/checkpoint.h.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/checkpoint_internal.h"
#include "worker/crc32c.h"
#include "worker/fsio.h"

#define MAX_STEP_DIRS 1000000

typedef hp__ckpt_rec rec;

const char *const hp__ckpt_part_prefix[3] = {"", "exp_avg/", "exp_avg_sq/"};

/* ---- small helpers -------------------------------------------------------------------------- */

char *hp__ckpt_step_dir(const char *dir, int64_t step) {
    char name[40];
    snprintf(name, sizeof name, "step-%08" PRId64, step);
    return hp__path_join(dir, name);
}

char *hp__ckpt_rank_path(const char *sdir, int rank) {
    char name[40];
    snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
    return hp__path_join(sdir, name);
}

int64_t hp__ckpt_volume(const int64_t *len, int nd) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= len[d];
    return n;
}

void hp__ckpt_copy_box(void *dst, const int64_t *ds, const int64_t *dorg, const void *src,
                       const int64_t *ss, const int64_t *so, const int64_t *n, int nd, size_t esz) {
    if (hp__ckpt_volume(n, nd) == 0) return;
    /* Merge trailing dims that both layouts hold whole into one run: dims [inner, nd). */
    int inner = nd;
    size_t run = esz;
    while (inner > 0) {
        int d = inner - 1;
        run *= (size_t)n[d];
        inner = d;
        if (n[d] != ss[d] || n[d] != ds[d]) break;
    }
    /* Byte strides of each dim in both layouts, and the origins' byte offsets. */
    size_t sst[HP_MAX_RANK], dst_st[HP_MAX_RANK], sb = 0, db = 0, sz = esz, dz = esz;
    for (int d = nd - 1; d >= 0; d--) {
        sst[d] = sz;
        dst_st[d] = dz;
        sb += (size_t)so[d] * sz;
        db += (size_t)dorg[d] * dz;
        sz *= (size_t)ss[d];
        dz *= (size_t)ds[d];
    }
    const uint8_t *s = (const uint8_t *)src + sb;
    uint8_t *o = (uint8_t *)dst + db;
    /* An odometer over the outer dims [0, inner). */
    int64_t idx[HP_MAX_RANK] = {0};
    for (;;) {
        memcpy(o, s, run);
        int d = inner - 1;
        while (d >= 0 && ++idx[d] == n[d]) {
            idx[d] = 0;
            s -= (size_t)(n[d] - 1) * sst[d];
            o -= (size_t)(n[d] - 1) * dst_st[d];
            d--;
        }
        if (d < 0) return;
        s += sst[d];
        o += dst_st[d];
    }
}

/* ---- writing a rank file -------------------------------------------------------------------- */

static bool dtype_ok(hp_dtype dt) {
    return (unsigned)dt < HP_DTYPE_COUNT;
}

static bool shard_empty(const hp_ckpt_shard *t) {
    return hp__ckpt_volume(t->len, t->rank) == 0;
}

static bool held_given(const hp_ckpt_shard *t) {
    for (int d = 0; d < t->rank; d++)
        if (t->held[d]) return true;
    return false;
}

/* Whether the box (at the origin of the held layout) is one contiguous run of it: past the
 * outermost dim where the box is narrower than the buffer, it must be whole, and before it
 * one element wide. */
static bool box_contiguous(const hp_ckpt_shard *t) {
    if (!held_given(t) || shard_empty(t)) return true;
    int k = -1;
    for (int d = t->rank - 1; d >= 0 && k < 0; d--)
        if (t->len[d] != t->held[d]) k = d;
    for (int d = 0; d < k; d++)
        if (t->len[d] != 1) return false;
    return true;
}

static hp_status check_shard(const hp_ckpt_shard *t, int i, hp_err *err) {
    if (!t->fqn || !t->fqn[0])
        return hp_errf(err, HP_INVALID, "checkpoint: shard %d has an empty fqn", i);
    if (strchr(t->fqn, '/'))
        return hp_errf(err, HP_INVALID, "checkpoint: fqn '%s' contains '/'", t->fqn);
    if (!dtype_ok(t->dtype))
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': bad dtype %d", t->fqn, (int)t->dtype);
    if (t->rank < 0 || t->rank > HP_MAX_RANK)
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': rank %d out of range [0, %d]", t->fqn,
                       t->rank, HP_MAX_RANK);
    hp_type ty = hp_type_make(t->dtype, t->rank, t->shape);
    hp_err e2;
    if (hp_type_check(&ty, &e2) != HP_OK)
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': %s", t->fqn, e2.msg);
    bool empty = false;
    for (int d = 0; d < t->rank; d++) {
        if (t->len[d] < 0)
            return hp_errf(err, HP_INVALID, "checkpoint: '%s': len[%d] = %lld is negative", t->fqn,
                           d, (long long)t->len[d]);
        empty = empty || t->len[d] == 0;
    }
    for (int d = 0; !empty && d < t->rank; d++)
        if (t->off[d] < 0 || t->off[d] > t->shape[d] - t->len[d])
            return hp_errf(err, HP_INVALID,
                           "checkpoint: '%s': dim %d: box [%lld, %lld) out of range for size %lld",
                           t->fqn, d, (long long)t->off[d], (long long)(t->off[d] + t->len[d]),
                           (long long)t->shape[d]);
    if (held_given(t)) {
        for (int d = 0; d < t->rank; d++)
            if (t->held[d] < t->len[d] || t->held[d] > HP_MAX_DIM)
                return hp_errf(err, HP_INVALID,
                               "checkpoint: '%s': held[%d] = %lld is smaller than the box's "
                               "len %lld (or too large)",
                               t->fqn, d, (long long)t->held[d], (long long)t->len[d]);
        hp_type hy = hp_type_make(t->dtype, t->rank, t->held);
        if (hp_type_check(&hy, &e2) != HP_OK)
            return hp_errf(err, HP_INVALID, "checkpoint: '%s': held: %s", t->fqn, e2.msg);
    }
    if (!empty && !t->param)
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': param is NULL", t->fqn);
    if (!t->exp_avg != !t->exp_avg_sq)
        return hp_errf(err, HP_INVALID,
                       "checkpoint: '%s': exp_avg and exp_avg_sq must both be set or both NULL",
                       t->fqn);
    if (t->exp_avg && !dtype_ok(t->state_dtype))
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': bad state_dtype %d", t->fqn,
                       (int)t->state_dtype);
    return HP_OK;
}

/* The box as saved: an empty one is all zeros (its offsets mean nothing). */
static void saved_box(const hp_ckpt_shard *t, int64_t *off, int64_t *len) {
    bool empty = shard_empty(t);
    for (int d = 0; d < t->rank; d++) {
        off[d] = empty ? 0 : t->off[d];
        len[d] = empty ? 0 : t->len[d];
    }
}

/* Describes one part of shard t as the safetensors tensor of its box. When the box is not
 * contiguous in the held buffer, packs it into a fresh buffer stored in *packed (the caller
 * frees it); HP_NOMEM then. */
static hp_status fill_st(hp_st_tensor *o, const char *name, hp_dtype dt, const hp_ckpt_shard *t,
                         const void *data, void **packed) {
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK], zero[HP_MAX_RANK] = {0};
    saved_box(t, off, len);
    o->name = name;
    o->dtype = hp_st_dtype_from_hp(dt);
    o->rank = t->rank;
    for (int d = 0; d < t->rank; d++) o->shape[d] = len[d];
    o->nbytes = (size_t)(hp_st_numel(o) * (int64_t)hp_dtype_size(dt));
    o->data = data;
    if (box_contiguous(t)) return HP_OK;
    void *p = *packed = hp_malloc(o->nbytes);
    if (!p) return HP_NOMEM;
    hp__ckpt_copy_box(p, len, zero, data, t->held, zero, len, t->rank, hp_dtype_size(dt));
    o->data = p;
    return HP_OK;
}

static json_t *dims_json(const int64_t *v, int nd) {
    json_t *a = json_array();
    for (int d = 0; a && d < nd; d++)
        if (json_array_append_new(a, json_integer(v[d])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The "hp.shards" metadata, {fqn: {"shape": [...], "off": [...], "len": [...]}}, as a fresh
 * jansson-allocated string. */
static char *shards_json(const hp_ckpt_shard *ts, int n) {
    json_t *o = json_object();
    if (!o) return NULL;
    for (int i = 0; i < n; i++) {
        const hp_ckpt_shard *t = &ts[i];
        int64_t off[HP_MAX_RANK], len[HP_MAX_RANK];
        saved_box(t, off, len);
        json_t *a = json_pack("{s:o, s:o, s:o}", "shape", dims_json(t->shape, t->rank), "off",
                              dims_json(off, t->rank), "len", dims_json(len, t->rank));
        if (!a || json_object_set_new(o, t->fqn, a) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* The "hp.crc32c" metadata, {tensor name: "8 hex digits"}, the CRC-32C of each of the
 * file's tensors' bytes as stored, as a fresh jansson-allocated string. */
static char *crc_json(const hp_st_tensor *st, int k) {
    json_t *o = json_object();
    if (!o) return NULL;
    for (int i = 0; i < k; i++) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08" PRIx32, hp__crc32c(0, st[i].data, st[i].nbytes));
        if (json_object_set_new(o, st[i].name, json_string(hex)) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

#define N_META 12

hp_status hp_ckpt_write_rank(const char *dir, int rank, int world, const hp_ckpt_scalars *sc,
                             const hp_ckpt_shard *ts, int n, hp_err *err) {
    hp__json_init();
    if (world < 1 || world > HP_CKPT_MAX_WORLD || rank < 0 || rank >= world)
        return hp_errf(err, HP_INVALID, "checkpoint: rank %d / world %d out of range", rank, world);
    if (sc->step < 0 || !isfinite(sc->loss_scale) || n < 0)
        return hp_errf(err, HP_INVALID, "checkpoint: step %lld / loss_scale %g / %d tensors",
                       (long long)sc->step, sc->loss_scale, n);
    for (int i = 0; i < n; i++) HP_TRY(check_shard(&ts[i], i, err));

    hp_status s = HP_OK;
    char *sdir = hp__ckpt_step_dir(dir, sc->step), *path = NULL, *idx = NULL, *shards = NULL,
         *crcs = NULL;
    hp_st_tensor *st = hp_calloc((size_t)(3 * n + 1), sizeof *st);
    char **names = hp_calloc((size_t)(2 * n + 1), sizeof *names);
    void **packed = hp_calloc((size_t)(3 * n + 1), sizeof *packed); /* boxes copied out */
    if (!sdir || !st || !names || !packed) goto nomem;
    path = hp__ckpt_rank_path(sdir, rank);
    idx = hp__path_join(sdir, HP_CKPT_INDEX);
    shards = shards_json(ts, n);
    if (!path || !idx || !shards) goto nomem;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const hp_ckpt_shard *t = &ts[i];
        if (fill_st(&st[k], t->fqn, t->dtype, t, t->param, &packed[k]) != HP_OK) goto nomem;
        k++;
        if (!t->exp_avg) continue;
        for (int p = 1; p <= 2; p++) {
            size_t len = strlen(hp__ckpt_part_prefix[p]) + strlen(t->fqn) + 1;
            char *nm = names[2 * i + p - 1] = hp_malloc(len);
            if (!nm) goto nomem;
            snprintf(nm, len, "%s%s", hp__ckpt_part_prefix[p], t->fqn);
            if (fill_st(&st[k], nm, t->state_dtype, t, p == 1 ? t->exp_avg : t->exp_avg_sq,
                        &packed[k]) != HP_OK)
                goto nomem;
            k++;
        }
    }
    if (!(crcs = crc_json(st, k))) goto nomem;
    char v[N_META][32];
    snprintf(v[0], 32, "%d", HP_CKPT_VERSION);
    snprintf(v[1], 32, "%" PRId64, sc->step);
    snprintf(v[2], 32, "%d", rank);
    snprintf(v[3], 32, "%d", world);
    snprintf(v[4], 32, "%" PRIu64, sc->seed);
    snprintf(v[5], 32, "%" PRIu64, sc->rng_offset);
    snprintf(v[6], 32, "%" PRId64, sc->data_step);
    snprintf(v[7], 32, "%" PRIu64, sc->data_fingerprint);
    snprintf(v[8], 32, "%.17g", sc->loss_scale);
    hp_st_kv meta[N_META] = {
        {"hp.format", HP__CKPT_RANK_FORMAT},
        {"hp.version", v[0]},
        {"hp.step", v[1]},
        {"hp.rank", v[2]},
        {"hp.world", v[3]},
        {"hp.seed", v[4]},
        {"hp.rng_offset", v[5]},
        {"hp.data_step", v[6]},
        {"hp.data_fingerprint", v[7]},
        {"hp.loss_scale", v[8]},
        {"hp.shards", shards},
        {"hp.crc32c", crcs},
    };
    if ((s = hp_mkdir_p(dir, err)) != HP_OK) goto out;
    struct stat sst;
    bool fresh = stat(sdir, &sst) != 0;
    if ((s = hp_mkdir_p(sdir, err)) != HP_OK) goto out;
    if (fresh && (s = hp_fsync_dir(dir, err)) != HP_OK) goto out;
    /* Rewriting a step that was committed before: drop its index first, so that a crash
     * while the new files land never leaves an index describing a mix of old and new. */
    if (unlink(idx) == 0) {
        if ((s = hp_fsync_dir(sdir, err)) != HP_OK) goto out;
    } else if (errno != ENOENT) {
        s = hp_errf(err, HP_IO, "%s: %s", idx, strerror(errno));
        goto out;
    }
    s = hp_st_write(path, st, k, meta, N_META, err);
    goto out;
nomem:
    s = hp_errf(err, HP_NOMEM, "checkpoint %s: out of memory", dir);
out:
    for (int i = 0; names && i < 2 * n; i++) hp_free(names[i]);
    for (int i = 0; packed && i < 3 * n; i++) hp_free(packed[i]);
    hp_free(packed);
    hp_free(names);
    hp_free(st);
    hp_free(shards); /* jansson allocates through hp_malloc */
    hp_free(crcs);
    hp_free(idx);
    hp_free(path);
    hp_free(sdir);
    return s;
}

/* ---- the index ------------------------------------------------------------------------------ */

static json_t *scalars_json(const hp_ckpt_scalars *sc) {
    char seed[24], rng[24], fp[24];
    snprintf(seed, sizeof seed, "%" PRIu64, sc->seed);
    snprintf(rng, sizeof rng, "%" PRIu64, sc->rng_offset);
    snprintf(fp, sizeof fp, "%" PRIu64, sc->data_fingerprint);
    return json_pack("{s:I, s:s, s:s, s:I, s:s, s:f}", "step", (json_int_t)sc->step, "seed", seed,
                     "rng_offset", rng, "data_step", (json_int_t)sc->data_step, "data_fingerprint",
                     fp, "loss_scale", sc->loss_scale);
}

/* A growable string (hp_malloc'd); a failed append poisons it (p = NULL). */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool failed;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t len = s ? strlen(s) : 0;
    if (b->failed || !s) {
        b->failed = true;
        return;
    }
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        char *p = hp_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len + 1);
    b->n += len;
}

/* Appends json_dumps(v, flags) and releases v (NULL poisons b). */
static void sb_json(sbuf *b, json_t *v, size_t flags) {
    char *t = v ? json_dumps(v, flags) : NULL;
    sb_add(b, t);
    hp_free(t); /* jansson allocates through hp_malloc */
    json_decref(v);
}

/* One index entry: {"dtype", "shape", "state_dtype",
 * "shards": [{"rank": r, "off": [...], "len": [...]}, ...]}. */
static json_t *entry_json(const hp_ckpt *c, int i) {
    const hp_ckpt_entry *e = &c->e[i];
    json_t *shards = json_array();
    json_t *t =
        json_pack("{s:s, s:o, s:o, s:o}", "dtype", hp_st_dtype_name(hp_st_dtype_from_hp(e->dtype)),
                  "shape", dims_json(e->shape, e->rank), "state_dtype",
                  e->has_state ? json_string(hp_st_dtype_name(hp_st_dtype_from_hp(e->state_dtype)))
                               : json_null(),
                  "shards", shards);
    if (!t) return NULL; /* json_pack released the stolen references */
    for (int j = c->first[i]; j < c->first[i] + c->count[i]; j++) {
        const rec *x = &c->recs[j];
        json_t *a = json_pack("{s:i, s:o, s:o}", "rank", x->owner, "off", dims_json(x->off, x->nd),
                              "len", dims_json(x->len, x->nd));
        if (!a || json_array_append_new(shards, a) != 0) goto fail;
    }
    return t;
fail:
    json_decref(t);
    return NULL;
}

/* The index of a loaded (validated) checkpoint as a fresh hp_malloc'd string, one tensor a
 * line so that a person can read and diff it:
 *   {"format":"hp-checkpoint","version":2,"step":10,"world":2,"scalars":{...},
 *   "tensors":{
 *   "FQN":{"dtype":"F32","shape":[7,4],"state_dtype":"F32",
 *          "shards":[{"rank":0,"off":[0,0],"len":[4,4]},{"rank":1,"off":[4,0],"len":[3,4]}]},
 *   ...}} */
static char *index_text(const hp_ckpt *c) {
    sbuf b = {0};
    json_t *head = json_pack("{s:s, s:i, s:I, s:i, s:o}", "format", HP__CKPT_INDEX_FORMAT,
                             "version", HP_CKPT_VERSION, "step", (json_int_t)c->step, "world",
                             c->world, "scalars", scalars_json(&c->sc));
    sb_json(&b, head, JSON_COMPACT);
    if (!b.failed) b.p[--b.n] = 0; /* drop the closing brace */
    sb_add(&b, ",\n\"tensors\":{\n");
    for (int i = 0; i < c->n; i++) {
        sb_json(&b, json_string(c->e[i].fqn), JSON_ENCODE_ANY);
        sb_add(&b, ":");
        sb_json(&b, entry_json(c, i), JSON_COMPACT);
        sb_add(&b, i + 1 < c->n ? ",\n" : "\n");
    }
    sb_add(&b, "}}\n");
    if (b.failed) {
        hp_free(b.p);
        return NULL;
    }
    return b.p;
}

hp_status hp_ckpt_commit(const char *dir, int64_t step, int world, int keep, hp_err *err) {
    hp__json_init();
    if (step < 0 || world < 1 || world > HP_CKPT_MAX_WORLD)
        return hp_errf(err, HP_INVALID, "checkpoint: step %lld / world %d out of range",
                       (long long)step, world);
    char *sdir = hp__ckpt_step_dir(dir, step), *idx = NULL, *text = NULL;
    hp_ckpt *c = NULL;
    hp_status s = HP_OK;
    if (!sdir || (idx = hp__path_join(sdir, HP_CKPT_INDEX)) == NULL) {
        s = hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
        goto out;
    }
    if ((s = hp__ckpt_new(step, world, &c, err)) != HP_OK) goto out;
    /* the headers only: the bytes were checksummed as they were written */
    if ((s = hp__ckpt_load_all(c, sdir, false, err)) != HP_OK) goto out;
    if (c->sc.step != step) {
        s = hp_errf(err, HP_PARSE, "%s: rank files say step %lld", sdir, (long long)c->sc.step);
        goto out;
    }
    text = index_text(c);
    if (!text) {
        s = hp_errf(err, HP_NOMEM, "%s: out of memory building the index", idx);
        goto out;
    }
    hp_iov v[1] = {{text, strlen(text)}};
    if ((s = hp_file_write_atomic_iov(idx, v, 1, err)) != HP_OK) goto out;
    s = hp_ckpt_prune(dir, keep, err);
out:
    hp_free(text); /* jansson allocates through hp_malloc */
    if (c) hp__ckpt_free(c);
    hp_free(idx);
    hp_free(sdir);
    return s;
}

hp_status hp_ckpt_save(const char *dir, const hp_ckpt_scalars *sc, const hp_ckpt_shard *ts, int n,
                       int keep, hp_err *err) {
    HP_TRY(hp_ckpt_write_rank(dir, 0, 1, sc, ts, n, err));
    return hp_ckpt_commit(dir, sc->step, 1, keep, err);
}

/* ---- scanning and pruning ------------------------------------------------------------------- */

typedef struct step_ent {
    int64_t step;
    bool complete;
    char name[32];
} step_ent;

static int cmp_step_desc(const void *a, const void *b) {
    const step_ent *x = a, *y = b;
    return (x->step < y->step) - (x->step > y->step);
}

/* The step directories of dir, newest first. A missing dir is an empty list. */
static hp_status list_steps(const char *dir, step_ent **out, int *n, hp_err *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return HP_OK;
        return hp_errf(err, HP_IO, "%s: %s", dir, strerror(errno));
    }
    hp_status s = HP_OK;
    int cap = 0;
    struct dirent *de;
    while ((errno = 0, de = readdir(d))) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        if (strncmp(nm, "step-", 5) != 0 || len < 6 || len > 5 + 18 ||
            strspn(nm + 5, "0123456789") != len - 5)
            continue;
        if (*n == MAX_STEP_DIRS) {
            s = hp_errf(err, HP_LIMIT, "%s: more than %d step directories", dir, MAX_STEP_DIRS);
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            step_ent *v = hp_realloc(*out, (size_t)cap * sizeof *v);
            if (!v) {
                s = hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
                break;
            }
            *out = v;
        }
        step_ent *e = &(*out)[(*n)++];
        e->step = strtoll(nm + 5, NULL, 10);
        memcpy(e->name, nm, len + 1); /* len <= 23 checked above */
        char *sdir = hp__path_join(dir, nm),
             *idx = sdir ? hp__path_join(sdir, HP_CKPT_INDEX) : NULL;
        struct stat st;
        e->complete = idx && stat(idx, &st) == 0 && S_ISREG(st.st_mode);
        hp_free(idx);
        hp_free(sdir);
        if (!idx) {
            s = hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
            break;
        }
    }
    if (s == HP_OK && errno) s = hp_errf(err, HP_IO, "%s: %s", dir, strerror(errno));
    closedir(d);
    if (s != HP_OK) {
        hp_free(*out);
        *out = NULL;
        *n = 0;
        return s;
    }
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_step_desc);
    return HP_OK;
}

hp_status hp_ckpt_latest(const char *dir, int64_t *step, hp_err *err) {
    return hp_ckpt_latest_before(dir, INT64_MAX, step, err);
}

hp_status hp_ckpt_latest_before(const char *dir, int64_t before, int64_t *step, hp_err *err) {
    step_ent *v;
    int n;
    HP_TRY(list_steps(dir, &v, &n, err));
    int i = 0;
    while (i < n && (!v[i].complete || v[i].step >= before)) i++;
    hp_status s = i < n ? HP_OK
                  : before < INT64_MAX
                      ? hp_errf(err, HP_NOT_FOUND, "%s: no complete checkpoint before step %lld",
                                dir, (long long)before)
                      : hp_errf(err, HP_NOT_FOUND,
                                "%s: no complete checkpoint (%d step "
                                "director%s without %s)",
                                dir, n, n == 1 ? "y" : "ies", HP_CKPT_INDEX);
    if (i < n) *step = v[i].step;
    hp_free(v);
    return s;
}

/* Removes one step directory: the index first (so it never looks complete half-deleted),
 * then every other file, then the directory. */
static hp_status remove_step(const char *dir, const char *name, hp_err *err) {
    char *sdir = hp__path_join(dir, name), *idx = sdir ? hp__path_join(sdir, HP_CKPT_INDEX) : NULL;
    hp_status s = HP_OK;
    if (!idx) {
        s = hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
        goto out;
    }
    if (unlink(idx) != 0 && errno != ENOENT) {
        s = hp_errf(err, HP_IO, "%s: %s", idx, strerror(errno));
        goto out;
    }
    DIR *d = opendir(sdir);
    if (!d) {
        s = hp_errf(err, HP_IO, "%s: %s", sdir, strerror(errno));
        goto out;
    }
    struct dirent *de;
    while (s == HP_OK && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char *p = hp__path_join(sdir, de->d_name);
        if (!p)
            s = hp_errf(err, HP_NOMEM, "%s: out of memory", dir);
        else if (unlink(p) != 0)
            s = hp_errf(err, HP_IO, "%s: %s", p, strerror(errno));
        hp_free(p);
    }
    closedir(d);
    if (s == HP_OK && rmdir(sdir) != 0) s = hp_errf(err, HP_IO, "%s: %s", sdir, strerror(errno));
out:
    hp_free(idx);
    hp_free(sdir);
    return s;
}

hp_status hp_ckpt_prune(const char *dir, int keep, hp_err *err) {
    step_ent *v;
    int n;
    HP_TRY(list_steps(dir, &v, &n, err));
    hp_status s = HP_OK;
    int complete = 0;
    bool removed = false;
    for (int i = 0; s == HP_OK && i < n; i++) {
        bool drop = v[i].complete ? (keep > 0 && ++complete > keep) : complete > 0;
        if (!drop) continue;
        s = remove_step(dir, v[i].name, err);
        removed = true;
    }
    hp_free(v);
    if (s == HP_OK && removed) s = hp_fsync_dir(dir, err);
    return s;
}

hp_status hp_ckpt_remove_from(const char *dir, int64_t from, hp_err *err) {
    step_ent *v;
    int n;
    HP_TRY(list_steps(dir, &v, &n, err));
    hp_status s = HP_OK;
    bool removed = false;
    for (int i = 0; s == HP_OK && i < n && v[i].step >= from; i++) {
        s = remove_step(dir, v[i].name, err);
        removed = true;
    }
    hp_free(v);
    if (s == HP_OK && removed) s = hp_fsync_dir(dir, err);
    return s;
}
