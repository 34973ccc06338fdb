/* worker/checkpoint_read.c — reading sharded checkpoints: every rank file validated through
 * the safetensors reader and its "hp.shards" metadata, the index checked record for record
 * against the files, the box validation (inside the shape, replicas or disjoint, covering),
 * and the resharding read that assembles any box from whichever ranks hold it. Version-1
 * files (dim-0 row ranges) are turned into boxes as they are read. See
 * include/hp/checkpoint.h.
 */
#define _GNU_SOURCE
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

typedef hp__ckpt_rec rec;

/* ---- small helpers -------------------------------------------------------------------------- */

/* jansson's unpack reports a failed allocation as a format error: re-classify it. */
static hp_status json_fail(hp_status s, const char *path, hp_err *err) {
    if (hp__alloc_failing()) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    return s;
}

static bool parse_i64(const char *s, int64_t *v) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *v = x;
    return true;
}

static bool parse_u64(const char *s, uint64_t *v) {
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *v = x;
    return true;
}

static bool scalars_eq(const hp_ckpt_scalars *a, const hp_ckpt_scalars *b) {
    return a->step == b->step && a->seed == b->seed && a->rng_offset == b->rng_offset &&
           a->data_step == b->data_step && a->data_fingerprint == b->data_fingerprint &&
           (a->loss_scale == b->loss_scale);
}

static int cmp_i64(int64_t a, int64_t b) {
    return (a > b) - (a < b);
}

/* Orders by fqn, then box (offsets, then extents), then owner: replicas end up adjacent and
 * the boxes of a tensor in order of their dim-0 offset. */
static int cmp_rec(const void *a, const void *b) {
    const rec *x = a, *y = b;
    int c = strcmp(x->fqn, y->fqn);
    if (c) return c;
    int nd = x->nd < y->nd ? x->nd : y->nd;
    for (int d = 0; d < nd; d++)
        if ((c = cmp_i64(x->off[d], y->off[d]))) return c;
    for (int d = 0; d < nd; d++)
        if ((c = cmp_i64(x->len[d], y->len[d]))) return c;
    if ((c = cmp_i64(x->nd, y->nd))) return c;
    return cmp_i64(x->owner, y->owner);
}

static bool box_eq(const rec *x, const rec *y) {
    if (x->nd != y->nd) return false;
    for (int d = 0; d < x->nd; d++)
        if (x->off[d] != y->off[d] || x->len[d] != y->len[d]) return false;
    return true;
}

static bool box_empty(const rec *x) {
    return hp__ckpt_volume(x->len, x->nd) == 0;
}

/* An empty box is saved as all zeros whatever its offsets were. */
static void box_normalize(rec *x) {
    if (!box_empty(x)) return;
    for (int d = 0; d < x->nd; d++) x->off[d] = x->len[d] = 0;
}

/* Whether the box lies inside the shape. */
static bool box_inside(const rec *x) {
    for (int d = 0; d < x->nd; d++)
        if (x->off[d] < 0 || x->len[d] < 0 || x->off[d] > x->shape[d] - x->len[d]) return false;
    return true;
}

/* "[0,3)x[2,3)" ("[]" for a rank-0 tensor) into buf. */
static const char *box_str(char *buf, size_t cap, int nd, const int64_t *off, const int64_t *len) {
    size_t n = 0;
    buf[0] = 0;
    if (nd == 0) snprintf(buf, cap, "[]");
    for (int d = 0; d < nd && n < cap; d++) {
        int k = snprintf(buf + n, cap - n, "%s[%lld,%lld)", d ? "x" : "", (long long)off[d],
                         (long long)(off[d] + len[d]));
        if (k < 0) break;
        n += (size_t)k;
    }
    return buf;
}

#define BOX_STR 320

static bool rec_eq(const rec *x, const rec *y) {
    if (strcmp(x->fqn, y->fqn) || x->owner != y->owner || !box_eq(x, y) || x->dtype != y->dtype ||
        x->has_state != y->has_state || (x->has_state && x->state_dtype != y->state_dtype))
        return false;
    for (int i = 0; i < x->nd; i++)
        if (x->shape[i] != y->shape[i]) return false;
    return true;
}

/* A JSON array of at most HP_MAX_RANK dims, each in [0, HP_MAX_DIM], into v (count in *nd). */
static bool parse_dims(json_t *a, int64_t *v, int *nd) {
    if (!json_is_array(a) || json_array_size(a) > HP_MAX_RANK) return false;
    *nd = (int)json_array_size(a);
    for (int d = 0; d < *nd; d++) {
        json_t *x = json_array_get(a, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > HP_MAX_DIM)
            return false;
        v[d] = json_integer_value(x);
    }
    return true;
}

/* Grows an arena-held record array by one; NULL when out of memory. */
static rec *rec_push(hp_arena *a, rec **recs, int *n, int *cap) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        rec *nr = hp_arena_alloc(a, (size_t)nc * sizeof *nr);
        if (!nr) return NULL;
        if (*n) memcpy(nr, *recs, (size_t)*n * sizeof *nr);
        *recs = nr;
        *cap = nc;
    }
    rec *x = &(*recs)[(*n)++];
    memset(x, 0, sizeof *x);
    return x;
}

/* ---- reading a rank file -------------------------------------------------------------------- */

/* Reads and checks rank file r's metadata and turns its "hp.shards" into records appended to
 * *recs (arena memory). */
/* Version 3: "hp.crc32c" names every tensor of the file, and (verify) each one's bytes have
 * that CRC-32C. Older versions carry no checksums. */
static hp_status check_crcs(const hp_st_file *f, const char *path, bool verify, hp_err *err) {
    const char *text = hp_st_meta_get(f, "hp.crc32c");
    json_error_t je;
    json_t *o = text ? json_loads(text, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!o && text && hp__alloc_failing()) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    hp_status s = HP_OK;
    if (!json_is_object(o) || json_object_size(o) != (size_t)hp_st_count(f)) {
        s = hp_errf(err, HP_PARSE, "%s: metadata 'hp.crc32c' is %s", path,
                    !text                ? "missing (version 3 files carry checksums)"
                    : !json_is_object(o) ? "not a JSON object"
                                         : "not one checksum per tensor");
        goto out;
    }
    for (int i = 0; i < hp_st_count(f); i++) {
        const hp_st_tensor *t = hp_st_at(f, i);
        const char *hex = json_string_value(json_object_get(o, t->name));
        char *end = NULL;
        unsigned long want = hex ? strtoul(hex, &end, 16) : 0;
        if (!hex || strlen(hex) != 8 || *end) {
            s = hp_errf(err, HP_PARSE, "%s: tensor '%s': 'hp.crc32c' has no 8-hex-digit checksum",
                        path, t->name);
            goto out;
        }
        if (!verify) continue;
        uint32_t got = hp__crc32c(0, t->data, t->nbytes);
        if (got != (uint32_t)want) {
            s = hp_errf(err, HP_PARSE,
                        "%s: tensor '%s' is corrupt: CRC-32C %08" PRIx32 ", the file says %s", path,
                        t->name, got, hex);
            goto out;
        }
    }
out:
    json_decref(o);
    return s;
}

static hp_status load_rank(hp_arena *a, const char *sdir, int r, int world, bool verify,
                           hp_st_file **fp, hp_ckpt_scalars *sc, rec **recs, int *n_rec, int *cap,
                           hp_err *err) {
    char *path = hp__ckpt_rank_path(sdir, r);
    if (!path) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    hp_status s = hp_st_open(path, fp, err);
    if (s != HP_OK) {
        if (s == HP_IO && access(path, F_OK) != 0)
            s = hp_errf(err, HP_NOT_FOUND, "%s: missing: rank %d of %d did not write its file",
                        path, r, world);
        hp_free(path);
        return s;
    }
    const hp_st_file *f = *fp;
    json_t *sh = NULL;
    const char *fmt = hp_st_meta_get(f, "hp.format");
    int64_t ver, rank, w;
    if (!fmt || strcmp(fmt, HP__CKPT_RANK_FORMAT) != 0) {
        s = hp_errf(err, HP_PARSE, "%s: metadata 'hp.format' is not '%s'", path,
                    HP__CKPT_RANK_FORMAT);
        goto out;
    }
    if (!parse_i64(hp_st_meta_get(f, "hp.version"), &ver) || ver < 1 || ver > HP_CKPT_VERSION) {
        s = hp_errf(err, HP_PARSE, "%s: metadata 'hp.version' is not 1..%d", path, HP_CKPT_VERSION);
        goto out;
    }
    if (ver >= 3 && (s = check_crcs(f, path, verify, err)) != HP_OK) goto out;
    if (!parse_i64(hp_st_meta_get(f, "hp.rank"), &rank) || rank != r ||
        !parse_i64(hp_st_meta_get(f, "hp.world"), &w) || w != world) {
        s = hp_errf(
            err, HP_PARSE, "%s: metadata 'hp.rank'/'hp.world' are '%s'/'%s', expected %d/%d", path,
            hp_st_meta_get(f, "hp.rank") ? hp_st_meta_get(f, "hp.rank") : "(none)",
            hp_st_meta_get(f, "hp.world") ? hp_st_meta_get(f, "hp.world") : "(none)", r, world);
        goto out;
    }
    static const char *const keys[6] = {
        "hp.step",      "hp.seed", "hp.rng_offset", "hp.data_step", "hp.data_fingerprint",
        "hp.loss_scale"};
    for (int i = 0; i < 6; i++) {
        const char *v = hp_st_meta_get(f, keys[i]);
        bool ok = v != NULL;
        char *end = NULL;
        switch (i) {
        case 0:
            ok = ok && parse_i64(v, &sc->step) && sc->step >= 0;
            break;
        case 1:
            ok = ok && parse_u64(v, &sc->seed);
            break;
        case 2:
            ok = ok && parse_u64(v, &sc->rng_offset);
            break;
        case 3:
            ok = ok && parse_i64(v, &sc->data_step);
            break;
        case 4:
            ok = ok && parse_u64(v, &sc->data_fingerprint);
            break;
        default:
            ok = ok && *v && (sc->loss_scale = strtod(v, &end), !*end) && isfinite(sc->loss_scale);
        }
        if (!ok) {
            s = hp_errf(err, HP_PARSE, "%s: metadata '%s' is %s%.40s%s", path, keys[i],
                        v ? "'" : "missing", v ? v : "", v ? "', not a valid value" : "");
            goto out;
        }
    }
    const char *shards = hp_st_meta_get(f, "hp.shards");
    json_error_t je;
    sh = shards ? json_loads(shards, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!sh && shards && hp__alloc_failing()) {
        s = hp_errf(err, HP_NOMEM, "%s: out of memory", path);
        goto out;
    }
    if (!sh || !json_is_object(sh)) {
        s = hp_errf(err, HP_PARSE, "%s: metadata 'hp.shards' is %s", path,
                    shards ? "not a JSON object" : "missing");
        goto out;
    }
    const char *fqn;
    json_t *v;
    json_object_foreach(sh, fqn, v) {
        /* version 2: {"shape": [...], "off": [...], "len": [...]}; 1: [start, end, rows] */
        int64_t shape[HP_MAX_RANK] = {0}, off[HP_MAX_RANK] = {0}, len[HP_MAX_RANK] = {0};
        json_int_t st = -1, en = -1, rows = -1;
        int nd = 0, n_off = -1, n_len = -1;
        bool ok;
        if (ver == 1) {
            ok = json_unpack(v, "[III!]", &st, &en, &rows) == 0 && st >= 0 && st <= en &&
                 en <= rows && rows <= HP_MAX_DIM;
        } else {
            json_t *js = NULL, *jo = NULL, *jl = NULL;
            ok = json_unpack(v, "{s:o, s:o, s:o!}", "shape", &js, "off", &jo, "len", &jl) == 0 &&
                 parse_dims(js, shape, &nd) && parse_dims(jo, off, &n_off) &&
                 parse_dims(jl, len, &n_len) && n_off == nd && n_len == nd;
        }
        if (!ok && hp__alloc_failing()) goto nomem; /* jansson's unpack allocates */
        if (!ok) {
            s = hp_errf(err, HP_PARSE,
                        ver == 1 ? "%s: 'hp.shards' entry '%s' is not [start, end, rows] with 0 "
                                   "<= start <= end <= rows"
                                 : "%s: 'hp.shards' entry '%s' is not {\"shape\", \"off\", "
                                   "\"len\"} arrays of one rank",
                        path, fqn);
            goto out;
        }
        rec *x = rec_push(a, recs, n_rec, cap);
        if (!x) goto nomem;
        x->fqn = hp_arena_strdup(a, fqn);
        if (!x->fqn) goto nomem;
        x->owner = r;
        for (int p = 0; p < 3; p++) {
            size_t plen = strlen(hp__ckpt_part_prefix[p]) + strlen(fqn) + 1;
            char *name = hp_malloc(plen);
            if (!name) goto nomem;
            snprintf(name, plen, "%s%s", hp__ckpt_part_prefix[p], fqn);
            x->t[p] = hp_st_find(f, name);
            hp_free(name);
        }
        const hp_st_tensor *t = x->t[0];
        if (!t || !hp_st_dtype_to_hp(t->dtype, &x->dtype)) {
            s = hp_errf(err, HP_PARSE, "%s: tensor '%s' is %s", path, fqn,
                        t ? "of a dtype the checkpoint format does not use" : "missing");
            goto out;
        }
        if (ver == 1) { /* rows [st, en) x every other dim whole */
            x->nd = t->rank;
            for (int d = 0; d < t->rank; d++) x->shape[d] = x->len[d] = t->shape[d];
            if (t->rank) {
                x->shape[0] = rows;
                x->off[0] = st;
                x->len[0] = en - st;
            }
            bool shape_ok = t->rank ? t->shape[0] == en - st : (st == 0 && en == 1 && rows == 1);
            if (!shape_ok) {
                s = hp_errf(err, HP_PARSE,
                            "%s: tensor '%s' has %lld rows, but 'hp.shards' says [%lld, %lld)",
                            path, fqn, (long long)(t->rank ? t->shape[0] : 1), (long long)st,
                            (long long)en);
                goto out;
            }
        } else {
            x->nd = nd;
            memcpy(x->shape, shape, sizeof shape);
            memcpy(x->off, off, sizeof off);
            memcpy(x->len, len, sizeof len);
            bool shape_ok = t->rank == nd;
            for (int d = 0; shape_ok && d < nd; d++) shape_ok = t->shape[d] == len[d];
            char bs[BOX_STR];
            if (!shape_ok || !box_inside(x)) {
                s = hp_errf(err, HP_PARSE, "%s: tensor '%s': 'hp.shards' box %s %s", path, fqn,
                            box_str(bs, sizeof bs, nd, off, len),
                            shape_ok ? "is outside the tensor's shape"
                                     : "does not match the stored tensor's shape");
                goto out;
            }
        }
        box_normalize(x);
        x->has_state = x->t[1] || x->t[2];
        for (int p = 1; x->has_state && p < 3; p++) {
            const hp_st_tensor *m = x->t[p];
            bool same = m && m->rank == t->rank && m->dtype == x->t[1]->dtype &&
                        hp_st_dtype_to_hp(m->dtype, &x->state_dtype);
            for (int d = 0; same && d < t->rank; d++) same = m->shape[d] == t->shape[d];
            if (!same) {
                s = hp_errf(err, HP_PARSE,
                            "%s: tensor '%s%s' is missing or does not match "
                            "the parameter's shape",
                            path, hp__ckpt_part_prefix[p], fqn);
                goto out;
            }
        }
    }
    goto out;
nomem:
    s = hp_errf(err, HP_NOMEM, "%s: out of memory", path);
out:
    json_decref(sh);
    hp_free(path);
    return s;
}

static bool boxes_overlap(const rec *x, const rec *y) {
    for (int d = 0; d < x->nd; d++)
        if (x->off[d] >= y->off[d] + y->len[d] || y->off[d] >= x->off[d] + x->len[d]) return false;
    return true;
}

/* Sorts recs and checks, per FQN, that every record agrees on dtype/shape/state, that any two
 * non-empty boxes are identical (replicas) or disjoint, and that the distinct boxes cover
 * every element (disjoint boxes inside the shape cover it exactly when their volumes add up
 * to its numel). Boxes are sorted by dim-0 offset, so each is compared only with those that
 * start before it ends on dim 0. Reports the number of FQNs in *n_fqn. */
static hp_status check_tiling(const char *what, rec *recs, int n, int *n_fqn, hp_err *err) {
    if (n > 1) qsort(recs, (size_t)n, sizeof *recs, cmp_rec);
    *n_fqn = 0;
    for (int i = 0; i < n;) {
        int j = i;
        const rec *f = &recs[i];
        while (j < n && strcmp(recs[j].fqn, f->fqn) == 0) j++;
        for (int k = i; k < j; k++) {
            const rec *x = &recs[k];
            bool same = x->dtype == f->dtype && x->nd == f->nd && x->has_state == f->has_state &&
                        (!x->has_state || x->state_dtype == f->state_dtype);
            for (int d = 0; same && d < x->nd; d++) same = x->shape[d] == f->shape[d];
            if (!same)
                return hp_errf(err, HP_PARSE,
                               "%s: tensor '%s': ranks %d and %d disagree on its dtype, shape or "
                               "optimizer state",
                               what, x->fqn, f->owner, x->owner);
        }
        int64_t covered = 0;
        const rec *prev = NULL;
        for (int k = i; k < j; k++) {
            const rec *x = &recs[k];
            if (box_empty(x)) continue;
            if (prev && box_eq(x, prev)) continue; /* a replica */
            prev = x;
            for (int l = k + 1; l < j; l++) {
                const rec *y = &recs[l];
                if (x->nd && y->off[0] >= x->off[0] + x->len[0]) break;
                if (box_empty(y) || box_eq(x, y) || !boxes_overlap(x, y)) continue;
                char bx[BOX_STR], by[BOX_STR];
                return hp_errf(err, HP_PARSE,
                               "%s: tensor '%s': rank-%05d.safetensors holds %s, which partially "
                               "overlaps rank-%05d.safetensors's %s (overlap)",
                               what, x->fqn, y->owner,
                               box_str(by, sizeof by, y->nd, y->off, y->len), x->owner,
                               box_str(bx, sizeof bx, x->nd, x->off, x->len));
            }
            covered += hp__ckpt_volume(x->len, x->nd);
        }
        int64_t numel = hp__ckpt_volume(f->shape, f->nd);
        if (covered != numel)
            return hp_errf(err, HP_PARSE,
                           "%s: tensor '%s': the rank files' boxes cover %lld of its %lld "
                           "elements (gap)",
                           what, f->fqn, (long long)covered, (long long)numel);
        (*n_fqn)++;
        i = j;
    }
    return HP_OK;
}

/* Loads every rank file of sdir into c (files, records, scalars of rank 0) and checks that
 * they agree. */
hp_status hp__ckpt_load_all(hp_ckpt *c, const char *sdir, bool verify, hp_err *err) {
    c->files = hp_arena_alloc(&c->arena, (size_t)c->world * sizeof *c->files);
    if (!c->files) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    int cap = 0;
    for (int r = 0; r < c->world; r++) {
        hp_ckpt_scalars sc = {0};
        HP_TRY(load_rank(&c->arena, sdir, r, c->world, verify, &c->files[r], &sc, &c->recs,
                         &c->n_rec, &cap, err));
        if (r == 0) {
            c->sc = sc;
        } else if (!scalars_eq(&sc, &c->sc)) {
            return hp_errf(err, HP_PARSE,
                           "%s: rank %d's scalars (step %lld, seed %llu, ...) differ from rank "
                           "0's (step %lld, seed %llu, ...): files from different runs?",
                           sdir, r, (long long)sc.step, (unsigned long long)sc.seed,
                           (long long)c->sc.step, (unsigned long long)c->sc.seed);
        }
    }
    int n_fqn;
    HP_TRY(check_tiling(sdir, c->recs, c->n_rec, &n_fqn, err));
    c->n = n_fqn;
    c->e = hp_arena_alloc(&c->arena, (size_t)(n_fqn + 1) * sizeof *c->e);
    c->first = hp_arena_alloc(&c->arena, (size_t)(n_fqn + 1) * sizeof *c->first);
    c->count = hp_arena_alloc(&c->arena, (size_t)(n_fqn + 1) * sizeof *c->count);
    if (!c->e || !c->first || !c->count) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    int k = 0;
    for (int i = 0; i < c->n_rec; k++) {
        const rec *x = &c->recs[i];
        hp_ckpt_entry *e = &c->e[k];
        e->fqn = x->fqn;
        e->dtype = x->dtype;
        e->rank = x->nd;
        memcpy(e->shape, x->shape, sizeof e->shape);
        e->rows = x->nd ? x->shape[0] : 1;
        e->has_state = x->has_state;
        e->state_dtype = x->state_dtype;
        c->first[k] = i;
        while (i < c->n_rec && strcmp(c->recs[i].fqn, x->fqn) == 0) i++;
        c->count[k] = i - c->first[k];
    }
    return HP_OK;
}

void hp__ckpt_free(hp_ckpt *c) {
    for (int r = 0; c->files && r < c->world; r++) hp_st_close(c->files[r]);
    hp_arena_fini(&c->arena);
    hp_free(c);
}

void hp_ckpt_close(hp_ckpt *c) {
    if (c) hp__ckpt_free(c);
}

hp_status hp__ckpt_new(int64_t step, int world, hp_ckpt **out, hp_err *err) {
    hp_ckpt *c = hp_calloc(1, sizeof *c);
    if (!c) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    hp_arena_init(&c->arena);
    c->step = step;
    c->world = world;
    *out = c;
    return HP_OK;
}

/* ---- the index ------------------------------------------------------------------------------ */

static bool st_dtype_parse(const char *s, hp_dtype *dt) {
    for (int i = 0; s && i < HP_ST_DTYPE_COUNT; i++)
        if (strcmp(s, hp_st_dtype_name((hp_st_dtype)i)) == 0)
            return hp_st_dtype_to_hp((hp_st_dtype)i, dt);
    return false;
}

static hp_status parse_scalars(const char *path, json_t *o, hp_ckpt_scalars *sc, hp_err *err) {
    json_int_t step = -1, data_step = 0;
    const char *seed = NULL, *rng = NULL, *fp = NULL;
    double ls = 0;
    json_error_t je;
    if (json_unpack_ex(o, &je, JSON_STRICT, "{s:I, s:s, s:s, s:I, s:s, s:F}", "step", &step, "seed",
                       &seed, "rng_offset", &rng, "data_step", &data_step, "data_fingerprint", &fp,
                       "loss_scale", &ls) != 0)
        return json_fail(hp_errf(err, HP_PARSE, "%s: 'scalars': %s", path, je.text), path, err);
    sc->step = step;
    sc->data_step = data_step;
    sc->loss_scale = ls;
    if (step < 0 || !parse_u64(seed, &sc->seed) || !parse_u64(rng, &sc->rng_offset) ||
        !parse_u64(fp, &sc->data_fingerprint) || !isfinite(ls))
        return hp_errf(err, HP_PARSE, "%s: 'scalars': a value is out of range or not a number",
                       path);
    return HP_OK;
}

/* Parses one index entry of version ver into records appended at recs[*n] (arena memory,
 * grown). Shards: version 2 [{"rank", "off", "len"}, ...], version 1 [[rank, start, end],
 * ...] (rows of dim 0). */
static hp_status parse_index_tensor(hp_arena *a, const char *path, int ver, const char *fqn,
                                    json_t *v, int world, rec **recs, int *n, int *cap,
                                    hp_err *err) {
    const char *dt = NULL, *sdt = NULL;
    json_t *shape = NULL, *shards = NULL, *sdtv = NULL;
    json_error_t je;
    if (json_unpack_ex(v, &je, JSON_STRICT, "{s:s, s:o, s:o, s:o}", "dtype", &dt, "shape", &shape,
                       "state_dtype", &sdtv, "shards", &shards) != 0)
        return json_fail(hp_errf(err, HP_PARSE, "%s: tensor '%s': %s", path, fqn, je.text), path,
                         err);
    rec proto = {0};
    proto.fqn = hp_arena_strdup(a, fqn);
    if (!proto.fqn) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    if (!st_dtype_parse(dt, &proto.dtype))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': bad 'dtype' '%.20s'", path, fqn, dt);
    proto.has_state = !json_is_null(sdtv);
    sdt = json_string_value(sdtv);
    if (proto.has_state && !st_dtype_parse(sdt, &proto.state_dtype))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': bad 'state_dtype'", path, fqn);
    if (!parse_dims(shape, proto.shape, &proto.nd))
        return hp_errf(err, HP_PARSE,
                       "%s: tensor '%s': 'shape' is not an array of at most %d valid dims", path,
                       fqn, HP_MAX_RANK);
    int64_t rows = proto.nd ? proto.shape[0] : 1;
    if (!json_is_array(shards))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': 'shards' is not an array", path, fqn);
    for (size_t i = 0; i < json_array_size(shards); i++) {
        rec x = proto;
        json_t *sv = json_array_get(shards, i);
        bool ok;
        if (ver == 1) {
            json_int_t r = -1, st = -1, en = -1;
            ok = json_unpack(sv, "[III!]", &r, &st, &en) == 0 && r >= 0 && r < world && st >= 0 &&
                 st <= en && en <= rows && (proto.nd || (st == 0 && en == 1));
            x.owner = (int)r;
            for (int d = 0; d < x.nd; d++) x.len[d] = x.shape[d];
            if (x.nd) {
                x.off[0] = st;
                x.len[0] = en - st;
            }
        } else {
            json_int_t r = -1;
            json_t *jo = NULL, *jl = NULL;
            int n_off = -1, n_len = -1;
            ok = json_unpack(sv, "{s:I, s:o, s:o!}", "rank", &r, "off", &jo, "len", &jl) == 0 &&
                 r >= 0 && r < world && parse_dims(jo, x.off, &n_off) &&
                 parse_dims(jl, x.len, &n_len) && n_off == x.nd && n_len == x.nd && box_inside(&x);
            x.owner = (int)r;
        }
        if (!ok)
            return json_fail(
                hp_errf(err, HP_PARSE,
                        ver == 1 ? "%s: tensor '%s': shards[%zu] is not [rank < %d, start, end "
                                   "<= rows]"
                                 : "%s: tensor '%s': shards[%zu] is not {\"rank\" < %d, "
                                   "\"off\", \"len\"} with the box inside the shape",
                        path, fqn, i, world),
                path, err);
        box_normalize(&x);
        rec *y = rec_push(a, recs, n, cap);
        if (!y) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
        *y = x;
    }
    return HP_OK;
}

/* Reads DIR/step-N/index.json and checks it against the rank files (loaded into c). */
static hp_status open_index(hp_ckpt *c, const char *sdir, hp_err *err) {
    char *path = hp__path_join(sdir, HP_CKPT_INDEX);
    if (!path) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    uint8_t *buf = NULL;
    size_t len = 0;
    json_t *root = NULL;
    hp_status s = hp_file_read(path, HP_CKPT_MAX_INDEX, &buf, &len, err);
    if (s != HP_OK) goto out;
    json_error_t je;
    root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        s = json_error_code(&je) == json_error_out_of_memory || hp__alloc_failing()
                ? hp_errf(err, HP_NOMEM, "%s: out of memory", path)
                : hp_errf(err, HP_PARSE, "%s: line %d: %s", path, je.line, je.text);
        goto out;
    }
    const char *fmt = NULL;
    json_int_t ver = 0, step = -1, world = 0;
    json_t *scalars = NULL, *tensors = NULL;
    if (json_unpack_ex(root, &je, JSON_STRICT, "{s:s, s:I, s:I, s:I, s:o, s:o}", "format", &fmt,
                       "version", &ver, "step", &step, "world", &world, "scalars", &scalars,
                       "tensors", &tensors) != 0) {
        s = json_fail(hp_errf(err, HP_PARSE, "%s: %s", path, je.text), path, err);
        goto out;
    }
    if (strcmp(fmt, HP__CKPT_INDEX_FORMAT) != 0 || ver < 1 || ver > HP_CKPT_VERSION) {
        s = hp_errf(err, HP_PARSE, "%s: format '%.40s' version %lld, expected '%s' version 1..%d",
                    path, fmt, (long long)ver, HP__CKPT_INDEX_FORMAT, HP_CKPT_VERSION);
        goto out;
    }
    if (step != c->step || world < 1 || world > HP_CKPT_MAX_WORLD) {
        s = hp_errf(err, HP_PARSE,
                    "%s: 'step' %lld / 'world' %lld (expected step %lld, world in "
                    "[1, %d])",
                    path, (long long)step, (long long)world, (long long)c->step, HP_CKPT_MAX_WORLD);
        goto out;
    }
    c->world = (int)world;
    hp_ckpt_scalars sc = {0};
    if ((s = parse_scalars(path, scalars, &sc, err)) != HP_OK) goto out;
    if (!json_is_object(tensors)) {
        s = hp_errf(err, HP_PARSE, "%s: 'tensors' is not an object", path);
        goto out;
    }
    rec *irecs = NULL;
    int n_irec = 0, cap = 0;
    const char *fqn;
    json_t *v;
    json_object_foreach(tensors, fqn, v) {
        s = parse_index_tensor(&c->arena, path, (int)ver, fqn, v, c->world, &irecs, &n_irec, &cap,
                               err);
        if (s != HP_OK) goto out;
    }
    if ((s = hp__ckpt_load_all(c, sdir, true, err)) != HP_OK) goto out;
    if (!scalars_eq(&sc, &c->sc) || sc.step != c->step) {
        s = hp_errf(err, HP_PARSE, "%s: 'scalars' differ from the rank files' (step %lld vs %lld)",
                    path, (long long)sc.step, (long long)c->sc.step);
        goto out;
    }
    if (n_irec > 1) qsort(irecs, (size_t)n_irec, sizeof *irecs, cmp_rec);
    for (int i = 0; i < n_irec || i < c->n_rec; i++) {
        const rec *x = i < n_irec ? &irecs[i] : NULL, *y = i < c->n_rec ? &c->recs[i] : NULL;
        if (x && y && rec_eq(x, y)) continue;
        const rec *z = x ? x : y;
        char bz[BOX_STR];
        s = hp_errf(err, HP_PARSE,
                    "%s: disagrees with the rank files at tensor '%s' (rank %d box %s%s)", path,
                    z->fqn, z->owner, box_str(bz, sizeof bz, z->nd, z->off, z->len),
                    !x   ? ": not in the index"
                    : !y ? ": in no rank file"
                         : "");
        goto out;
    }
out:
    json_decref(root);
    hp_free(buf);
    hp_free(path);
    return s;
}

/* ---- opening and reading -------------------------------------------------------------------- */

hp_status hp_ckpt_open(const char *dir, int64_t step, hp_ckpt **out, hp_err *err) {
    *out = NULL;
    hp__json_init();
    if (step < 0) HP_TRY(hp_ckpt_latest(dir, &step, err));
    char *sdir = hp__ckpt_step_dir(dir, step);
    if (!sdir) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    hp_ckpt *c = NULL;
    hp_status s = hp__ckpt_new(step, 0, &c, err);
    if (s == HP_OK) {
        char *idx = hp__path_join(sdir, HP_CKPT_INDEX);
        struct stat st;
        if (!idx) {
            s = hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
        } else if (stat(idx, &st) != 0) {
            s = hp_errf(err, HP_NOT_FOUND, "%s: no complete checkpoint of step %lld (no %s)", dir,
                        (long long)step, HP_CKPT_INDEX);
        } else {
            s = open_index(c, sdir, err);
        }
        hp_free(idx);
    }
    hp_free(sdir);
    if (s != HP_OK) {
        if (c) hp__ckpt_free(c);
        return s;
    }
    *out = c;
    return HP_OK;
}

int64_t hp_ckpt_step(const hp_ckpt *c) {
    return c->step;
}

int hp_ckpt_world(const hp_ckpt *c) {
    return c->world;
}

const hp_ckpt_scalars *hp_ckpt_get_scalars(const hp_ckpt *c) {
    return &c->sc;
}

int hp_ckpt_count(const hp_ckpt *c) {
    return c->n;
}

const hp_ckpt_entry *hp_ckpt_entry_at(const hp_ckpt *c, int i) {
    HP_ASSERT(i >= 0 && i < c->n);
    return &c->e[i];
}

static int find_idx(const hp_ckpt *c, const char *fqn) {
    int lo = 0, hi = c->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, k = strcmp(c->e[mid].fqn, fqn);
        if (k == 0) return mid;
        if (k < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return -1;
}

const hp_ckpt_entry *hp_ckpt_find(const hp_ckpt *c, const char *fqn) {
    int i = find_idx(c, fqn);
    return i < 0 ? NULL : &c->e[i];
}

hp_status hp_ckpt_read_box(const hp_ckpt *c, const char *fqn, hp_ckpt_part part, int rank,
                           const int64_t *off, const int64_t *len, const int64_t *held, void *out,
                           size_t out_bytes, hp_err *err) {
    int i = find_idx(c, fqn);
    if (i < 0)
        return hp_errf(err, HP_NOT_FOUND, "checkpoint step %lld: no tensor '%s'",
                       (long long)c->step, fqn);
    const hp_ckpt_entry *e = &c->e[i];
    if ((unsigned)part > HP_CKPT_EXP_AVG_SQ)
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': bad part %d", fqn, (int)part);
    if (part != HP_CKPT_PARAM && !e->has_state)
        return hp_errf(err, HP_NOT_FOUND,
                       "checkpoint step %lld: '%s' was saved without "
                       "optimizer state",
                       (long long)c->step, fqn);
    int nd = e->rank;
    if (rank != nd)
        return hp_errf(err, HP_INVALID,
                       "checkpoint: '%s': a box of rank %d, the tensor has rank %d", fqn, rank, nd);
    if (nd && (!off || !len))
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': off or len is NULL", fqn);
    for (int d = 0; d < nd; d++)
        if (len[d] < 0 || off[d] < 0 || off[d] > e->shape[d] - len[d])
            return hp_errf(err, HP_INVALID,
                           "checkpoint: '%s': dim %d: box [%lld, %lld) is outside the shape "
                           "(size %lld)",
                           fqn, d, (long long)off[d], (long long)(off[d] + len[d]),
                           (long long)e->shape[d]);
    hp_dtype dt = part == HP_CKPT_PARAM ? e->dtype : e->state_dtype;
    size_t esz = hp_dtype_size(dt), need = esz;
    int64_t h[HP_MAX_RANK];
    bool overflow = false;
    for (int d = 0; d < nd; d++) {
        h[d] = held ? held[d] : len[d];
        if (h[d] < len[d] || h[d] > HP_MAX_DIM)
            return hp_errf(err, HP_INVALID,
                           "checkpoint: '%s': held[%d] = %lld is smaller than the box's len %lld "
                           "(or too large)",
                           fqn, d, (long long)h[d], (long long)len[d]);
        overflow = overflow || __builtin_mul_overflow(need, (size_t)h[d], &need);
    }
    if (overflow)
        return hp_errf(err, HP_INVALID, "checkpoint: '%s': held is too large for a buffer", fqn);
    if (out_bytes != need)
        return hp_errf(err, HP_INVALID,
                       "checkpoint: '%s': a buffer of shape held is %zu bytes, out_bytes is %zu",
                       fqn, need, out_bytes);
    int64_t want = hp__ckpt_volume(len, nd), got = 0;
    const rec *prev = NULL;
    for (int j = c->first[i]; want && j < c->first[i] + c->count[i]; j++) {
        const rec *x = &c->recs[j];
        if (box_empty(x) || (prev && box_eq(x, prev))) continue; /* empty, or a replica */
        prev = x;
        int64_t n[HP_MAX_RANK], so[HP_MAX_RANK], dorg[HP_MAX_RANK];
        bool meets = true;
        for (int d = 0; meets && d < nd; d++) {
            int64_t lo = off[d] > x->off[d] ? off[d] : x->off[d];
            int64_t hi =
                off[d] + len[d] < x->off[d] + x->len[d] ? off[d] + len[d] : x->off[d] + x->len[d];
            meets = lo < hi;
            n[d] = hi - lo;
            so[d] = lo - x->off[d];
            dorg[d] = lo - off[d];
        }
        if (!meets) continue;
        hp__ckpt_copy_box(out, h, dorg, x->t[part]->data, x->len, so, n, nd, esz);
        got += hp__ckpt_volume(n, nd);
    }
    if (got != want) {
        char b[BOX_STR];
        return hp_errf(err, HP_PARSE,
                       "checkpoint step %lld: '%s': %lld of the %lld elements of box %s are in "
                       "no rank file",
                       (long long)c->step, fqn, (long long)(want - got), (long long)want,
                       box_str(b, sizeof b, nd, off, len));
    }
    return HP_OK;
}

hp_status hp_ckpt_export(const hp_ckpt *c, const char *path, hp_err *err) {
    hp_st_tensor *ts = hp_calloc((size_t)c->n + 1, sizeof *ts);
    if (!ts) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
    hp_status s = HP_OK;
    for (int i = 0; s == HP_OK && i < c->n; i++) {
        const hp_ckpt_entry *e = &c->e[i];
        hp_st_tensor *t = &ts[i];
        t->name = e->fqn;
        t->dtype = hp_st_dtype_from_hp(e->dtype);
        t->rank = e->rank;
        memcpy(t->shape, e->shape, sizeof(int64_t) * (size_t)e->rank);
        t->nbytes = (size_t)hp__ckpt_volume(e->shape, e->rank) * hp_dtype_size(e->dtype);
        void *buf = hp_malloc(t->nbytes ? t->nbytes : 1);
        t->data = buf;
        if (!buf)
            s = hp_errf(err, HP_NOMEM, "%s: out of memory for '%s'", path, e->fqn);
        else
            s = hp_ckpt_read_box(c, e->fqn, HP_CKPT_PARAM, e->rank, (const int64_t[HP_MAX_RANK]){0},
                                 e->shape, NULL, buf, t->nbytes, err);
    }
    if (s == HP_OK) s = hp_st_write(path, ts, c->n, NULL, 0, err);
    for (int i = 0; i < c->n; i++) hp_free((void *)ts[i].data);
    hp_free(ts);
    return s;
}
