/* worker/checkpoint_read.c — reading sharded checkpoints: every rank file validated through
 * the safetensors reader and its "hp.shards" metadata, the index checked record for record
 * against the files, and the resharding read that assembles any dim-0 row range from
 * whichever ranks hold it. See include/hp/checkpoint.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/checkpoint_internal.h"
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

static int cmp_rec(const void *a, const void *b) {
    const rec *x = a, *y = b;
    int c = strcmp(x->fqn, y->fqn);
    if (c) return c;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->owner > y->owner) - (x->owner < y->owner);
}

static bool rec_eq(const rec *x, const rec *y) {
    if (strcmp(x->fqn, y->fqn) || x->owner != y->owner || x->start != y->start ||
        x->end != y->end || x->dtype != y->dtype || x->nd != y->nd ||
        x->has_state != y->has_state || (x->has_state && x->state_dtype != y->state_dtype))
        return false;
    for (int i = 0; i < x->nd; i++)
        if (x->shape[i] != y->shape[i]) return false;
    return true;
}

/* ---- reading a rank file -------------------------------------------------------------------- */

/* Reads and checks rank file r's metadata and turns its "hp.shards" into records appended to
 * *recs (arena memory). */
static hp_status load_rank(hp_arena *a, const char *sdir, int r, int world, hp_st_file **fp,
                           hp_ckpt_scalars *sc, rec **recs, int *n_rec, int *cap, hp_err *err) {
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
    if (!parse_i64(hp_st_meta_get(f, "hp.version"), &ver) || ver != HP_CKPT_VERSION) {
        s = hp_errf(err, HP_PARSE, "%s: metadata 'hp.version' is not %d", path, HP_CKPT_VERSION);
        goto out;
    }
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
        json_int_t st = -1, en = -1, rows = -1;
        if (json_unpack(v, "[III!]", &st, &en, &rows) != 0 || st < 0 || st > en || en > rows ||
            rows > HP_MAX_DIM) {
            s = hp_errf(err, HP_PARSE,
                        "%s: 'hp.shards' entry '%s' is not [start, end, rows] "
                        "with 0 <= start <= end <= rows",
                        path, fqn);
            goto out;
        }
        if (*n_rec == *cap) {
            int nc = *cap ? 2 * *cap : 64;
            rec *nr = hp_arena_alloc(a, (size_t)nc * sizeof *nr);
            if (!nr) goto nomem;
            if (*n_rec) memcpy(nr, *recs, (size_t)*n_rec * sizeof *nr);
            *recs = nr;
            *cap = nc;
        }
        rec *x = &(*recs)[*n_rec];
        memset(x, 0, sizeof *x);
        x->fqn = hp_arena_strdup(a, fqn);
        if (!x->fqn) goto nomem;
        x->owner = r;
        x->start = st;
        x->end = en;
        x->rows = rows;
        for (int p = 0; p < 3; p++) {
            size_t len = strlen(hp__ckpt_part_prefix[p]) + strlen(fqn) + 1;
            char *name = hp_malloc(len);
            if (!name) goto nomem;
            snprintf(name, len, "%s%s", hp__ckpt_part_prefix[p], fqn);
            x->t[p] = hp_st_find(f, name);
            hp_free(name);
        }
        const hp_st_tensor *t = x->t[0];
        if (!t || !hp_st_dtype_to_hp(t->dtype, &x->dtype)) {
            s = hp_errf(err, HP_PARSE, "%s: tensor '%s' is %s", path, fqn,
                        t ? "of a dtype the checkpoint format does not use" : "missing");
            goto out;
        }
        x->nd = t->rank;
        for (int d = 0; d < t->rank; d++) x->shape[d] = t->shape[d];
        if (t->rank) x->shape[0] = rows;
        bool shape_ok = t->rank ? t->shape[0] == en - st : (st == 0 && en == 1 && rows == 1);
        if (!shape_ok) {
            s = hp_errf(err, HP_PARSE,
                        "%s: tensor '%s' has %lld rows, but 'hp.shards' says "
                        "[%lld, %lld)",
                        path, fqn, (long long)(t->rank ? t->shape[0] : 1), (long long)st,
                        (long long)en);
            goto out;
        }
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
        (*n_rec)++;
    }
    goto out;
nomem:
    s = hp_errf(err, HP_NOMEM, "%s: out of memory", path);
out:
    json_decref(sh);
    hp_free(path);
    return s;
}

/* Sorts recs and checks, per FQN, that every record agrees on dtype/shape/state and that the
 * non-empty ranges tile [0, rows) (identical ranges are replicas). Reports the number of
 * FQNs in *n_fqn. */
static hp_status check_tiling(const char *what, rec *recs, int n, int *n_fqn, hp_err *err) {
    if (n > 1) qsort(recs, (size_t)n, sizeof *recs, cmp_rec);
    *n_fqn = 0;
    for (int i = 0; i < n;) {
        int j = i;
        int64_t cur = 0;
        const rec *prev = NULL;
        for (; j < n && strcmp(recs[j].fqn, recs[i].fqn) == 0; j++) {
            const rec *x = &recs[j], *f = &recs[i];
            bool same = x->dtype == f->dtype && x->nd == f->nd && x->rows == f->rows &&
                        x->has_state == f->has_state &&
                        (!x->has_state || x->state_dtype == f->state_dtype);
            for (int d = 0; same && d < x->nd; d++) same = x->shape[d] == f->shape[d];
            if (!same)
                return hp_errf(err, HP_PARSE,
                               "%s: tensor '%s': ranks %d and %d disagree on its dtype, shape or "
                               "optimizer state",
                               what, x->fqn, f->owner, x->owner);
            if (x->start == x->end) continue;
            if (prev && x->start == prev->start && x->end == prev->end) continue; /* replica */
            if (x->start != cur)
                return hp_errf(err, HP_PARSE,
                               "%s: tensor '%s': rank %d holds rows [%lld, %lld) but rows up to "
                               "%lld are covered (%s)",
                               what, x->fqn, x->owner, (long long)x->start, (long long)x->end,
                               (long long)cur, x->start > cur ? "gap" : "partial overlap");
            cur = x->end;
            prev = x;
        }
        if (cur != recs[i].rows)
            return hp_errf(err, HP_PARSE, "%s: tensor '%s': rows [%lld, %lld) are in no rank file",
                           what, recs[i].fqn, (long long)cur, (long long)recs[i].rows);
        (*n_fqn)++;
        i = j;
    }
    return HP_OK;
}

/* Loads every rank file of sdir into c (files, records, scalars of rank 0) and checks that
 * they agree. */
hp_status hp__ckpt_load_all(hp_ckpt *c, const char *sdir, hp_err *err) {
    c->files = hp_arena_alloc(&c->arena, (size_t)c->world * sizeof *c->files);
    if (!c->files) return hp_errf(err, HP_NOMEM, "checkpoint: out of memory");
    int cap = 0;
    for (int r = 0; r < c->world; r++) {
        hp_ckpt_scalars sc = {0};
        HP_TRY(load_rank(&c->arena, sdir, r, c->world, &c->files[r], &sc, &c->recs, &c->n_rec, &cap,
                         err));
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
        e->rows = x->rows;
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

/* Parses one index entry into records appended at recs[*n] (arena memory, grown). */
static hp_status parse_index_tensor(hp_arena *a, const char *path, const char *fqn, json_t *v,
                                    int world, rec **recs, int *n, int *cap, hp_err *err) {
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
    if (!json_is_array(shape) || json_array_size(shape) > HP_MAX_RANK)
        return hp_errf(err, HP_PARSE,
                       "%s: tensor '%s': 'shape' is not an array of at most %d "
                       "dims",
                       path, fqn, HP_MAX_RANK);
    proto.nd = (int)json_array_size(shape);
    for (int d = 0; d < proto.nd; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > HP_MAX_DIM)
            return hp_errf(err, HP_PARSE, "%s: tensor '%s': shape[%d] is not a valid dim", path,
                           fqn, d);
        proto.shape[d] = json_integer_value(x);
    }
    proto.rows = proto.nd ? proto.shape[0] : 1;
    if (!json_is_array(shards))
        return hp_errf(err, HP_PARSE, "%s: tensor '%s': 'shards' is not an array", path, fqn);
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_int_t r = -1, st = -1, en = -1;
        if (json_unpack(json_array_get(shards, i), "[III!]", &r, &st, &en) != 0 || r < 0 ||
            r >= world || st < 0 || st > en || en > proto.rows)
            return hp_errf(err, HP_PARSE,
                           "%s: tensor '%s': shards[%zu] is not [rank < %d, start, end <= %lld]",
                           path, fqn, i, world, (long long)proto.rows);
        if (*n == *cap) {
            int nc = *cap ? 2 * *cap : 64;
            rec *nr = hp_arena_alloc(a, (size_t)nc * sizeof *nr);
            if (!nr) return hp_errf(err, HP_NOMEM, "%s: out of memory", path);
            if (*n) memcpy(nr, *recs, (size_t)*n * sizeof *nr);
            *recs = nr;
            *cap = nc;
        }
        rec *x = &(*recs)[(*n)++];
        *x = proto;
        x->owner = (int)r;
        x->start = st;
        x->end = en;
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
    if (strcmp(fmt, HP__CKPT_INDEX_FORMAT) != 0 || ver != HP_CKPT_VERSION) {
        s = hp_errf(err, HP_PARSE, "%s: format '%.40s' version %lld, expected '%s' version %d",
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
    hp_ckpt_scalars sc;
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
        s = parse_index_tensor(&c->arena, path, fqn, v, c->world, &irecs, &n_irec, &cap, err);
        if (s != HP_OK) goto out;
    }
    if ((s = hp__ckpt_load_all(c, sdir, err)) != HP_OK) goto out;
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
        s = hp_errf(err, HP_PARSE,
                    "%s: disagrees with the rank files at tensor '%s' (rank %d rows [%lld, %lld)"
                    "%s)",
                    path, z->fqn, z->owner, (long long)z->start, (long long)z->end,
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

hp_status hp_ckpt_read(const hp_ckpt *c, const char *fqn, hp_ckpt_part part, int64_t start,
                       int64_t end, void *out, size_t out_bytes, hp_err *err) {
    int i = find_idx(c, fqn);
    if (i < 0)
        return hp_errf(err, HP_NOT_FOUND, "checkpoint step %lld: no tensor '%s'",
                       (long long)c->step, fqn);
    const hp_ckpt_entry *e = &c->e[i];
    if ((unsigned)part > HP_CKPT_EXP_AVG_SQ)
        return hp_errf(err, HP_INVALID, "checkpoint: bad part %d", (int)part);
    if (part != HP_CKPT_PARAM && !e->has_state)
        return hp_errf(err, HP_NOT_FOUND,
                       "checkpoint step %lld: '%s' was saved without "
                       "optimizer state",
                       (long long)c->step, fqn);
    if (start < 0 || start > end || end > e->rows)
        return hp_errf(err, HP_INVALID,
                       "checkpoint: '%s': rows [%lld, %lld) out of range [0, %lld)", fqn,
                       (long long)start, (long long)end, (long long)e->rows);
    hp_dtype dt = part == HP_CKPT_PARAM ? e->dtype : e->state_dtype;
    size_t row_bytes = (size_t)hp__ckpt_row_elems(e->shape, e->rank) * hp_dtype_size(dt);
    if (out_bytes != (size_t)(end - start) * row_bytes)
        return hp_errf(err, HP_INVALID,
                       "checkpoint: '%s': rows [%lld, %lld) are %zu bytes, "
                       "buffer has %zu",
                       fqn, (long long)start, (long long)end, (size_t)(end - start) * row_bytes,
                       out_bytes);
    int64_t covered = 0;
    for (int j = c->first[i]; j < c->first[i] + c->count[i]; j++) {
        const rec *x = &c->recs[j];
        if (x->start == x->end || x->start < covered) continue; /* empty, or a replica */
        covered = x->end;
        int64_t lo = start > x->start ? start : x->start, hi = end < x->end ? end : x->end;
        if (lo >= hi) continue;
        const uint8_t *src = x->t[part]->data;
        memcpy((uint8_t *)out + (size_t)(lo - start) * row_bytes,
               src + (size_t)(lo - x->start) * row_bytes, (size_t)(hi - lo) * row_bytes);
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
        t->nbytes = (size_t)e->rows * (size_t)hp__ckpt_row_elems(e->shape, e->rank) *
                    hp_dtype_size(e->dtype);
        void *buf = hp_malloc(t->nbytes ? t->nbytes : 1);
        t->data = buf;
        if (!buf)
            s = hp_errf(err, HP_NOMEM, "%s: out of memory for '%s'", path, e->fqn);
        else
            s = hp_ckpt_read(c, e->fqn, HP_CKPT_PARAM, 0, e->rows, buf, t->nbytes, err);
    }
    if (s == HP_OK) s = hp_st_write(path, ts, c->n, NULL, 0, err);
    for (int i = 0; i < c->n; i++) hp_free((void *)ts[i].data);
    hp_free(ts);
    return s;
}
