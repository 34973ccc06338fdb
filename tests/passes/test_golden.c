/* Golden .hpir tests for every pass, one generic runner.
 *
 * For each tests/golden/passes/<pass>/<case>.in.hpir the runner parses the input, runs that one
 * pass (looked up by the folder name in the pipeline's table) and compares the printed result
 * with <case>.out.hpir exactly. Optional files beside it:
 *   <case>.job   key=value lines for the job the pass sees: world=N (a dp=N mesh), fsdp=A,B
 *                (globs become patterns, other names exact FQNs), reshard=0|1, overlap=0|1,
 *                prefetch=N, bucket_mb=X, bucket_bytes=N, param_dtype=bf16; '#' starts a
 *                comment.
 *   <case>.err   the pass must fail, with this text in its message (no .out.hpir then).
 *   <case>.warn  the pass's warnings, one per line, exactly (a case that warns needs one).
 * HP_UPDATE_GOLDEN=1 rewrites .out.hpir and .warn from what the passes do now (review the diff).
 */
#include "hp/passes.h"
#include "hp/text.h"
#include "passes/passes_internal.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GOLDEN_DIR HP_SOURCE_DIR "/tests/golden/passes"

/* A whole file, NUL-terminated (malloc'd), or NULL if it does not exist. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n, "%s", path);
    s[n] = 0;
    fclose(f);
    return s;
}

static void write_text(const char *path, const char *text) {
    hp_err e;
    cr_assert_eq(hp_file_write_atomic(path, text, strlen(text), &e), HP_OK, "%s", e.msg);
}

static bool has_glob(const char *s) {
    return strchr(s, '*') || strchr(s, '?');
}

/* Applies a .job file to job; false (with a message) on a bad line. */
static bool read_job(const char *path, const char *text, hp_job *job) {
    char line[512];
    int no = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        no++;
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        p = nl ? nl + 1 : p + len;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *key = line;
        while (*key == ' ' || *key == '\t') key++;
        char *end = key + strlen(key);
        while (end > key && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) *--end = 0;
        if (!*key) continue;
        char *val = strchr(key, '=');
        if (!val) {
            cr_expect_fail("%s:%d: expected key=value, got '%s'", path, no, key);
            return false;
        }
        *val++ = 0;
        hp_err e;
        if (!strcmp(key, "world")) {
            job->plan.mesh[0].size = job->resources.world_size = atoi(val);
        } else if (!strcmp(key, "fsdp")) {
            for (char *tok = strtok(val, ","); tok; tok = strtok(NULL, ",")) {
                hp_status st = has_glob(tok) ? hp_job_add_fsdp_pattern(job, tok, &e)
                                             : hp_job_add_fsdp_fqn(job, tok, &e);
                cr_assert_eq(st, HP_OK, "%s", e.msg);
            }
        } else if (!strcmp(key, "reshard")) {
            job->plan.reshard_after_forward = atoi(val) != 0;
        } else if (!strcmp(key, "overlap")) {
            job->passes.enable_overlap = atoi(val) != 0;
        } else if (!strcmp(key, "prefetch")) {
            job->passes.prefetch_depth = atoi(val);
        } else if (!strcmp(key, "bucket_mb")) {
            job->passes.bucket_bytes = (int64_t)(atof(val) * (1 << 20));
        } else if (!strcmp(key, "bucket_bytes")) {
            job->passes.bucket_bytes = atoll(val);
        } else if (!strcmp(key, "param_dtype")) {
            cr_assert_eq(hp_dtype_parse(val, &job->plan.param_dtype, &e), HP_OK, "%s:%d: %s", path,
                         no, e.msg);
        } else {
            cr_expect_fail("%s:%d: unknown key '%s'", path, no, key);
            return false;
        }
    }
    return true;
}

/* Reports the first line where got and want differ. */
static void expect_same_text(const char *what, const char *got, const char *want) {
    if (!strcmp(got, want)) return;
    int line = 1;
    const char *g = got, *w = want;
    while (*g && *g == *w) {
        if (*g == '\n') line++;
        g++, w++;
    }
    while (g > got && g[-1] != '\n') g--, w--;
    const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
    int gl = ge ? (int)(ge - g) : (int)strlen(g), wl = we ? (int)(we - w) : (int)strlen(w);
    cr_expect_fail("%s: line %d differs (HP_UPDATE_GOLDEN=1 rewrites)\n  want: %.*s\n  got:  %.*s",
                   what, line, wl, w, gl, g);
}

static char *warnings_text(const hp_pass_ctx *ctx) {
    size_t cap = 1;
    for (int i = 0; i < ctx->n_warnings; i++) cap += strlen(ctx->warnings[i]) + 1;
    char *s = malloc(cap);
    s[0] = 0;
    for (int i = 0; i < ctx->n_warnings; i++) {
        strcat(s, ctx->warnings[i]);
        strcat(s, "\n");
    }
    return s;
}

/* Runs one case; returns 1 if it ran. */
static int run_case(const char *pass, const char *dir, const char *name, bool update) {
    const hp__pass_entry *e = hp__pass_find(pass);
    char base[2100], path[2200];
    snprintf(base, sizeof base, "%s/%s", dir, name);
    snprintf(path, sizeof path, "%s.in.hpir", base);
    hp_graph *in = NULL, *out = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_graph_read_file(path, &in, &err), HP_OK, "%s", err.msg);

    hp_job job;
    hp_job_init_defaults(&job);
    snprintf(path, sizeof path, "%s.job", base);
    char *job_text = slurp(path);
    bool ok = !job_text || read_job(path, job_text, &job);
    free(job_text);
    hp_pass_report rep = {0};
    hp_pass_ctx *ctx = calloc(1, sizeof *ctx);
    ctx->job = &job;
    ctx->world = job.resources.world_size;
    ctx->report = &rep;

    snprintf(path, sizeof path, "%s.err", base);
    char *want_err = slurp(path);
    hp_status st = ok ? e->fn(in, ctx, &out, &err) : HP_INVALID;
    if (!ok) {
        /* reported by read_job */
    } else if (want_err) {
        char *nl = strchr(want_err, '\n');
        if (nl) *nl = 0;
        cr_expect_neq(st, HP_OK, "%s/%s: the pass should fail with '%s'", pass, name, want_err);
        cr_expect(st == HP_OK || strstr(err.msg, want_err), "%s/%s: error '%s' lacks '%s'", pass,
                  name, err.msg, want_err);
    } else if (st != HP_OK) {
        cr_expect_fail("%s/%s: %s", pass, name, err.msg);
    } else {
        hp_err ve;
        cr_expect_eq(hp_graph_verify(out, &ve), HP_OK, "%s/%s: the result does not verify: %s",
                     pass, name, ve.msg);
        char *got = NULL;
        cr_assert_eq(hp_graph_print(out, &got, NULL, &err), HP_OK);
        snprintf(path, sizeof path, "%s.out.hpir", base);
        char *want = slurp(path);
        char what[300];
        snprintf(what, sizeof what, "%s/%s", pass, name);
        if (update) {
            if (!want || strcmp(want, got)) write_text(path, got);
        } else if (!want) {
            cr_expect_fail("%s: %s is missing (HP_UPDATE_GOLDEN=1 writes it)", what, path);
        } else {
            expect_same_text(what, got, want);
        }
        free(want);
        hp_free(got);
        /* warnings: exactly the .warn file (none without one) */
        snprintf(path, sizeof path, "%s.warn", base);
        char *want_warn = slurp(path), *got_warn = warnings_text(ctx);
        if (update && (*got_warn || want_warn)) {
            if (*got_warn)
                write_text(path, got_warn);
            else
                remove(path);
        } else if (!update) {
            snprintf(what, sizeof what, "%s/%s warnings", pass, name);
            expect_same_text(what, got_warn, want_warn ? want_warn : "");
        }
        free(want_warn);
        free(got_warn);
    }
    free(want_err);
    free(ctx);
    hp_job_fini(&job);
    hp_graph_free(in);
    hp_graph_free(out);
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of a folder, sorted (malloc'd array of malloc'd names). */
static int list_dir(const char *dir, char ***names) {
    DIR *d = opendir(dir);
    cr_assert(d, "cannot open %s", dir);
    int n = 0, cap = 16;
    *names = malloc((size_t)cap * sizeof **names);
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) *names = realloc(*names, (size_t)(cap *= 2) * sizeof **names);
        (*names)[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(*names, (size_t)n, sizeof **names, cmp_str);
    return n;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static int run_pass_dir(const char *pass, bool update) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, pass);
    char **files;
    int n = list_dir(dir, &files), ran = 0;
    for (int i = 0; i < n; i++) {
        if (!ends_with(files[i], ".in.hpir")) continue;
        files[i][strlen(files[i]) - strlen(".in.hpir")] = 0;
        ran += run_case(pass, dir, files[i], update);
    }
    free_list(files, n);
    return ran;
}

Test(golden, every_pass_case) {
    const char *u = getenv("HP_UPDATE_GOLDEN");
    bool update = u && !strcmp(u, "1");
    char **dirs;
    int n = list_dir(GOLDEN_DIR, &dirs), total = 0;
    for (int i = 0; i < n; i++) {
        char path[1024];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, dirs[i]);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue; /* README.md */
        if (!hp__pass_find(dirs[i])) {
            cr_expect_fail("%s/%s: no pass is named '%s'", GOLDEN_DIR, dirs[i], dirs[i]);
            continue;
        }
        int ran = run_pass_dir(dirs[i], update);
        cr_expect_gt(ran, 0, "%s/%s has no cases", GOLDEN_DIR, dirs[i]);
        total += ran;
    }
    free_list(dirs, n);
    cr_expect_gt(total, 0);
}

/* The passes that must have golden cases, whatever else the folder holds. */
Test(golden, passes_covered) {
    static const char *const required[] = {"dce", "canonicalize"};
    for (size_t i = 0; i < HP_ARRAY_LEN(required); i++) {
        char dir[1024];
        struct stat st;
        snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, required[i]);
        cr_expect(stat(dir, &st) == 0 && S_ISDIR(st.st_mode), "%s is missing", dir);
    }
}
