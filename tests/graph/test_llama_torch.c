/* tests/graph/test_llama_torch.c — the Llama-3 joint graph against PyTorch's autograd.
 *
 * For a tiny config (dim 64, 2 layers, 4 heads, 2 kv heads, ffn 96, vocab 128, batch 2,
 * seq 16) this test draws random weights and tokens, writes them to a temp directory
 * (manifest.txt + inputs.bin, format in tests/graph/llama_ref.py), runs
 * `/usr/bin/python3 tests/graph/llama_ref.py DIR` — a Llama-3 written in plain PyTorch from
 * the spec, independent of the IR — and compares its loss and every gradient with the joint
 * graph run on the reference evaluator:
 *
 *   HP_EVAL_F32 vs torch float32: loss to 1e-5 relative; each gradient element to 1e-4 of
 *                                  that gradient tensor's max-abs (|a - b| <= 1e-4 * max|b|).
 *   HP_EVAL_F64 vs torch float64: loss to 1e-12 relative; gradients to 1e-10 of the max-abs.
 *
 * A missing python3-torch is a failure (not a skip) saying to run scripts/install-deps.sh.
 */
#include "hp/eval.h"
#include "hp/models.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct ref_case {
    hp_graph *g;       /* joint graph */
    hp_tensor *inputs; /* one per placeholder */
    int n_inputs, n_params;
    char dir[64]; /* temp directory holding the exchanged files */
} ref_case;

/* ---- deterministic random numbers ------------------------------------------------------------ */

static uint64_t rng_state = 0x243f6a8885a308d3u;

static uint64_t splitmix64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double uniform01(void) {
    return ((double)(splitmix64() >> 11) + 0.5) * 0x1.0p-53;
}

static double normal(void) {
    return sqrt(-2 * log(uniform01())) * cos(2 * M_PI * uniform01());
}

/* ---- the exchange files ---------------------------------------------------------------------- */

static void write_all(FILE *f, const void *p, size_t n) {
    cr_assert_eq(fwrite(p, 1, n, f), n, "short write");
}

static void write_inputs(const ref_case *rc, const hp_llama3_config *c) {
    char path[128];
    snprintf(path, sizeof path, "%s/manifest.txt", rc->dir);
    FILE *m = fopen(path, "w");
    snprintf(path, sizeof path, "%s/inputs.bin", rc->dir);
    FILE *b = fopen(path, "wb");
    cr_assert(m && b, "cannot create files in %s", rc->dir);
    fprintf(m,
            "config dim=%lld n_layers=%lld n_heads=%lld n_kv_heads=%lld ffn_hidden=%lld "
            "vocab=%lld batch=%lld seq=%lld norm_eps=%.17g rope_theta=%.17g\n",
            (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads,
            (long long)c->n_kv_heads, (long long)c->ffn_hidden, (long long)c->vocab,
            (long long)c->batch, (long long)c->seq, c->norm_eps, c->rope_theta);
    for (int i = 0; i < rc->n_inputs; i++) {
        const hp_node *n = &rc->g->nodes[i];
        const hp_tensor *t = &rc->inputs[i];
        bool param = i < rc->n_params;
        fprintf(m, "%s %s", param ? "param" : "data", hp_node_attr(n, HP_ATTR_FQN)->s);
        for (int d = 0; d < t->type.rank; d++) fprintf(m, " %lld", (long long)t->type.shape[d]);
        fputc('\n', m);
        int64_t numel = hp_type_numel(&t->type);
        for (int64_t k = 0; k < numel; k++) {
            if (param) {
                float v = (float)t->data[k];
                write_all(b, &v, sizeof v);
            } else {
                int64_t v = (int64_t)t->data[k];
                write_all(b, &v, sizeof v);
            }
        }
    }
    cr_assert_eq(fclose(m), 0);
    cr_assert_eq(fclose(b), 0);
}

static void run_reference(const ref_case *rc) {
    const char *src = getenv("HP_SOURCE_DIR");
    if (!src || !src[0]) src = HP_SOURCE_DIR;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/graph/llama_ref.py' '%s'", src, rc->dir);
    int st = system(cmd);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code == 3 || code == 127)
        cr_assert_fail("python3-torch is missing (%s exited %d): run scripts/install-deps.sh", cmd,
                       code);
    cr_assert_eq(code, 0, "%s exited %d", cmd, code);
}

/* Reads n doubles (the loss, then every gradient in parameter order). */
static double *read_reference(const ref_case *rc, const char *suffix, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/ref_%s.bin", rc->dir, suffix);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s missing", path);
    double *v = malloc(n * sizeof *v);
    cr_assert_not_null(v);
    cr_assert_eq(fread(v, sizeof *v, n, f), n, "%s is short", path);
    char extra;
    cr_assert_eq(fread(&extra, 1, 1, f), 0, "%s is too long", path);
    fclose(f);
    return v;
}

static void remove_dir(const ref_case *rc) {
    static const char *const files[] = {"manifest.txt", "inputs.bin", "ref_float32.bin",
                                        "ref_float64.bin"};
    char path[128];
    for (size_t i = 0; i < HP_ARRAY_LEN(files); i++) {
        snprintf(path, sizeof path, "%s/%s", rc->dir, files[i]);
        unlink(path);
    }
    rmdir(rc->dir);
}

/* ---- the case -------------------------------------------------------------------------------- */

static const hp_model_spec *tiny_spec(void) {
    static hp_model_spec s;
    hp_err err = {0};
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, &err), HP_OK, "%s", err.msg);
    s.dim = 64;
    s.n_layers = 2;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.ffn_hidden = 96;
    s.vocab = 128;
    s.batch = 2;
    s.seq = 16;
    return &s;
}

/* Random weights at a scale that keeps every activation O(1), so that attention is far from
 * uniform and every gradient is well away from zero: linears N(0, 1/fan_in), norms
 * 1 + N(0, 0.1^2), embeddings N(0, 1). All values are f32-representable. */
static void fill_inputs(ref_case *rc, const hp_llama3_config *c) {
    hp_err err = {0};
    rc->inputs = calloc((size_t)rc->n_inputs, sizeof *rc->inputs);
    cr_assert_not_null(rc->inputs);
    for (int i = 0; i < rc->n_inputs; i++) {
        const hp_node *n = &rc->g->nodes[i];
        hp_tensor *t = &rc->inputs[i];
        cr_assert_eq(hp_tensor_alloc(t, n->out[0], &err), HP_OK, "%s", err.msg);
        int64_t numel = hp_type_numel(&t->type);
        const char *fqn = hp_node_attr(n, HP_ATTR_FQN)->s;
        for (int64_t k = 0; k < numel; k++) {
            double v;
            if (i >= rc->n_params)
                v = (double)(splitmix64() % (uint64_t)c->vocab); /* tokens, labels */
            else if (t->type.rank == 1)
                v = 1 + 0.1 * normal();
            else if (strcmp(fqn, "tok_embeddings.weight") == 0)
                v = normal();
            else
                v = normal() / sqrt((double)t->type.shape[1]);
            t->data[k] = i < rc->n_params ? (double)(float)v : v;
        }
    }
}

static void case_init(ref_case *rc, hp_llama3_config *cfg) {
    hp_err err = {0};
    memset(rc, 0, sizeof *rc);
    const hp_model_spec *s = tiny_spec();
    cr_assert_eq(hp_llama3_resolve(s, cfg, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_model_build_joint(s, &rc->g, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_graph_verify(rc->g, &err), HP_OK, "%s", err.msg);
    hp_graph_inputs in = hp_graph_count_inputs(rc->g);
    rc->n_params = in.n_params;
    rc->n_inputs = in.n_params + in.n_buffers + in.n_data;
    cr_assert_eq(rc->n_inputs, rc->n_params + 2);
    fill_inputs(rc, cfg);
    snprintf(rc->dir, sizeof rc->dir, "/tmp/hp-llama-ref-XXXXXX");
    cr_assert_not_null(mkdtemp(rc->dir), "mkdtemp failed");
}

/* Criterion runs this even when an assertion ends the test, so the temp dir never stays. */
static ref_case the_case;
static void case_fini(void) {
    ref_case *rc = &the_case;
    if (rc->inputs)
        for (int i = 0; i < rc->n_inputs; i++) hp_tensor_free(&rc->inputs[i]);
    free(rc->inputs);
    hp_graph_free(rc->g);
    if (rc->dir[0]) remove_dir(rc);
    memset(rc, 0, sizeof *rc);
}

/* Runs the joint graph at `prec` and compares with the reference file `suffix`. */
static void compare(const ref_case *rc, hp_eval_precision prec, const char *suffix,
                    double loss_rtol, double grad_tol) {
    hp_err err = {0};
    hp_eval_opts opts = {.precision = prec};
    int n_out = rc->g->n_outputs;
    hp_tensor *out = calloc((size_t)n_out, sizeof *out);
    cr_assert_not_null(out);
    cr_assert_eq(hp_eval(rc->g, rc->inputs, rc->n_inputs, &opts, out, &err), HP_OK, "%s", err.msg);

    size_t total = 1;
    for (int i = 0; i < rc->n_params; i++) total += (size_t)hp_type_numel(&rc->g->nodes[i].out[0]);
    double *ref = read_reference(rc, suffix, total);

    double loss = out[0].data[0], ref_loss = ref[0];
    cr_assert(fabs(loss - ref_loss) <= loss_rtol * fabs(ref_loss),
              "%s: loss %.9g vs torch %.9g (rel %.3g > %.1g)", suffix, loss, ref_loss,
              fabs(loss - ref_loss) / fabs(ref_loss), loss_rtol);

    const double *r = ref + 1;
    double worst = 0;
    const char *worst_fqn = "";
    for (int i = 0; i < rc->n_params; i++) {
        const char *fqn = hp_node_attr(&rc->g->nodes[i], HP_ATTR_FQN)->s;
        const hp_tensor *gt = &out[1 + i];
        int64_t numel = hp_type_numel(&gt->type);
        cr_assert_eq(numel, hp_type_numel(&rc->g->nodes[i].out[0]), "%s gradient size", fqn);
        double scale = 0;
        for (int64_t k = 0; k < numel; k++) scale = fmax(scale, fabs(r[k]));
        cr_assert_gt(scale, 0, "%s: torch gradient is all zeros", fqn);
        for (int64_t k = 0; k < numel; k++) {
            double e = fabs(gt->data[k] - r[k]) / scale;
            cr_assert(e <= grad_tol,
                      "%s: d loss / d %s [%lld] = %.9g vs torch %.9g (%.3g of max %.3g)", suffix,
                      fqn, (long long)k, gt->data[k], r[k], e, scale);
            if (e > worst) worst = e, worst_fqn = fqn;
        }
        r += numel;
    }
    fprintf(
        stderr,
        "llama vs torch %s: loss %.9g (torch %.9g), worst gradient error %.3g of max-abs (%s)\n",
        suffix, loss, ref_loss, worst, worst_fqn);
    free(ref);
    for (int i = 0; i < n_out; i++) hp_tensor_free(&out[i]);
    free(out);
}

Test(llama_torch, joint_graph_matches_pytorch_autograd, .fini = case_fini, .timeout = 600) {
    hp_llama3_config cfg;
    case_init(&the_case, &cfg);
    write_inputs(&the_case, &cfg);
    run_reference(&the_case);
    compare(&the_case, HP_EVAL_F32, "float32", 1e-5, 1e-4);
    compare(&the_case, HP_EVAL_F64, "float64", 1e-12, 1e-10);
}
