/* tests/util/run_compare.c — comparing two training runs (run_compare.h). */
#include "tests/util/run_compare.h"

#include "hp/safetensors.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hp_th_read_losses(const char *dir, double *losses, int max) {
    char path[1024], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\"loss\":");
        cr_assert(p, "%s", line);
        losses[n++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return n;
}

void hp_th_expect_losses_close(const char *a, const char *b, double abs, double rel,
                               const char *what) {
    double la[256], lb[256];
    int na = hp_th_read_losses(a, la, 256), nb = hp_th_read_losses(b, lb, 256);
    cr_expect_eq(na, nb, "%s: %d and %d logged steps", what, na, nb);
    for (int i = 0; i < na && i < nb; i++)
        cr_expect(fabs(la[i] - lb[i]) <= abs + rel * fabs(la[i]), "%s: line %d: loss %.9g vs %.9g",
                  what, i + 1, lb[i], la[i]);
}

void hp_th_expect_weights_close(const char *a, const char *b, double abs, double rel,
                                const char *what) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    hp_st_file *fa = NULL, *fb = NULL;
    hp_err e = {0};
    cr_assert_eq(hp_st_open(pa, &fa, &e), HP_OK, "%s: %s", what, e.msg);
    cr_assert_eq(hp_st_open(pb, &fb, &e), HP_OK, "%s: %s", what, e.msg);
    cr_expect_eq(hp_st_count(fa), hp_st_count(fb), "%s: tensor counts", what);
    for (int i = 0; i < hp_st_count(fb); i++) {
        const hp_st_tensor *y = hp_st_at(fb, i), *x = hp_st_find(fa, y->name);
        cr_assert(x, "%s: %s missing", what, y->name);
        int64_t n = hp_st_numel(y);
        cr_assert_eq(hp_st_numel(x), n, "%s: %s: shape", what, y->name);
        float *u = malloc(sizeof(float) * (size_t)(n ? n : 1)),
              *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
        cr_assert(u && v);
        cr_assert_eq(hp_st_to_f32(x, u, n, NULL), HP_OK);
        cr_assert_eq(hp_st_to_f32(y, v, n, NULL), HP_OK);
        double worst = 0, top = 0;
        for (int64_t k = 0; k < n; k++) {
            worst = fmax(worst, fabs((double)u[k] - v[k]));
            top = fmax(top, fabs((double)u[k]));
        }
        cr_expect(worst <= abs + rel * top, "%s: %s differs by %g (largest element %g)", what,
                  y->name, worst, top);
        free(u);
        free(v);
    }
    hp_st_close(fa);
    hp_st_close(fb);
}
