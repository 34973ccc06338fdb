/* client/hpctl_job.c — the offline job verbs: `new` builds a job file from a model spec and
 * training flags; `inspect` reads one back and prints its summary, its graph as text, or JSON. */
#include "client/hpctl.h"

#include "hp/device.h"
#include "hp/job.h"
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/text.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- new ------------------------------------------------------------------------------------ */

typedef enum { FLAG_I64, FLAG_F64 } flag_kind;

/* Numeric flags of `new`, as one table: flag, field in hp_job, range, help. */
static const struct num_flag {
    const char *flag;
    flag_kind kind;
    size_t offset;
    double lo, hi;
    const char *help;
} num_flags[] = {
    {"--batch", FLAG_I64, offsetof(hp_job, model.batch), 1, 1 << 20,
     "sequences a micro-step, all ranks together"},
    {"--global-batch", FLAG_I64, offsetof(hp_job, train.global_batch), 1, 1e12,
     "sequences an optimizer step (a multiple of --batch: the mean gradient of that many "
     "micro-steps; default --batch)"},
    {"--seq", FLAG_I64, offsetof(hp_job, model.seq), 1, 1 << 24, "sequence length"},
    {"--dim", FLAG_I64, offsetof(hp_job, model.dim), 1, 1 << 20, "model dim"},
    {"--layers", FLAG_I64, offsetof(hp_job, model.n_layers), 1, 4096, "layers"},
    {"--heads", FLAG_I64, offsetof(hp_job, model.n_heads), 1, 4096, "attention heads"},
    {"--kv-heads", FLAG_I64, offsetof(hp_job, model.n_kv_heads), 1, 4096, "key/value heads"},
    {"--ffn-hidden", FLAG_I64, offsetof(hp_job, model.ffn_hidden), 1, 1 << 22, "FFN hidden"},
    {"--vocab", FLAG_I64, offsetof(hp_job, model.vocab), 2, 1 << 24, "vocabulary size"},
    {"--steps", FLAG_I64, offsetof(hp_job, train.steps), 1, 1e12, "training steps"},
    {"--warmup", FLAG_I64, offsetof(hp_job, train.warmup_steps), 0, 1e12, "warmup steps"},
    {"--seed", FLAG_I64, offsetof(hp_job, train.seed), 0, 9.2e18, "RNG seed"},
    {"--log-interval", FLAG_I64, offsetof(hp_job, train.log_interval), 0, 1e12,
     "steps between metrics lines (0: never)"},
    {"--checkpoint-interval", FLAG_I64, offsetof(hp_job, train.checkpoint_interval), 0, 1e12,
     "steps between checkpoints (0: never)"},
    {"--lr", FLAG_F64, offsetof(hp_job, train.lr), 1e-12, 1e3, "peak learning rate"},
    {"--min-lr-ratio", FLAG_F64, offsetof(hp_job, train.min_lr_ratio), 0, 1, "final lr / peak lr"},
    {"--weight-decay", FLAG_F64, offsetof(hp_job, train.weight_decay), 0, 1e3, "AdamW decay"},
    {"--grad-clip", FLAG_F64, offsetof(hp_job, train.grad_clip), 0, 1e12,
     "max global grad norm (0: off)"},
    {"--eval-interval", FLAG_I64, offsetof(hp_job, train.eval_interval), 0, 1e12,
     "steps between evaluations on --eval-data (0: never; also after the last step)"},
    {"--eval-steps", FLAG_I64, offsetof(hp_job, train.eval_steps), 1, HP_MAX_EVAL_STEPS,
     "batches an evaluation reads (default 20)"},
};

static void new_usage(FILE *f) {
    fputs("usage: hpctl new --model FAMILY[:FLAVOR] [flags] -o JOB.pb\n"
          "       hpctl new --graph MODEL.hpir [flags] -o JOB.pb\n"
          "\n"
          "  --model SPEC          llama3:debugmodel | llama3:8B | llama3:70B | llama3:405B | mlp\n"
          "  --graph FILE.hpir     the model as a graph in hp's text IR (e.g. from hp_export):\n"
          "                        a forward graph (one output, the loss: hp's autodiff adds\n"
          "                        the backward) or a joint one (the loss, then one gradient per\n"
          "                        parameter); its shapes fix the batch and sequence\n"
          "  --name NAME           job name (default: the flavor)\n"
          "  --decay KIND          linear | cosine | none (after warmup)\n"
          "  --on-nonfinite WHAT   stop | skip: a step with a NaN/Inf loss or grad norm fails\n"
          "                        the run (default) or skips its update (counted in the\n"
          "                        metrics' skipped_steps)\n"
          "  --data PATH           llm.c token shard (.bin); default: the built-in corpus\n"
          "  --eval-data PATH      held-out token data for --eval-interval (the same forms as\n"
          "                        --data: a shard, a directory or glob of shards, text:FILE)\n"
          "  --init-from PATH      initial weights (safetensors)\n"
          "  --device cpu|cuda     what the ranks compute on (default cpu); a device the\n"
          "                        workers cannot run is refused, never run on the CPU\n"
          "  --max-restarts N      restarts after a worker failure under hpd (default 0)\n"
          "  --profile-steps S,..  steps to trace (Chrome trace per rank; hpctl trace fetches it)\n"
          "  -o, --output PATH     where to write the job (written atomically)\n"
          "\n"
          "parallel plan and compiler:\n"
          "  --mesh NAME=N[,...]   the device mesh, e.g. dp=8 (the world size is its product)\n"
          "  --fsdp PATTERN        shard the parameters it names (a glob such as 'layers.*', an\n"
          "                        exact FQN, or a module such as tok_embeddings); repeatable\n"
          "  --no-reshard-after-forward  keep gathered parameters from forward to backward\n"
          "  --bucket-mb X         collective bucket size in MiB (0: no bucketing; default 25)\n"
          "  --prefetch N          all-gathers in flight ahead of their use (default 1)\n"
          "  --no-overlap          do not reorder communication behind compute\n"
          "  --no-fuse-attention   keep an exported model's unfused attention (bmm, mask,\n"
          "                        softmax, bmm) as it is, not the fused flash attention\n"
          "  --place PAT=DIM:PL[,..]  place the inputs a glob matches, e.g.\n"
          "                        'layers.*.attention.wq.weight=tp:S(0)' (R, S(d), P(sum)); "
          "repeatable\n"
          "  --tp-plan llama       torchtitan's Llama TP plan on the mesh dim 'tp' (the\n"
          "                        embedding and output projection vocab-sharded too)\n"
          "  --loss-parallel       cross entropy on vocab-sharded logits over 'tp' (the\n"
          "                        logits are not gathered)\n"
          "  --param-dtype DT      mixed precision: all-gather and compute parameters in DT\n"
          "                        (f32 or bf16; the f32 master weights stay f32)\n"
          "  --reduce-dtype DT     reduce gradients in DT (f32, the only one supported)\n"
          "  --ac none|full|selective|auto  activation checkpointing: the backward recomputes\n"
          "                        each repeated block's forward (full), or its cheap ops between\n"
          "                        the kept matrix products and attention (selective); auto: the\n"
          "                        fastest of those (and full every 4th, 2nd block) that fits the\n"
          "                        device profile's memory; default none\n"
          "  --ac-every N          checkpoint every N-th block only (default 1: all)\n"
          "  --mode fsdp|auto      auto: placements chosen by the auto-sharding ILP (default\n"
          "                        fsdp: the hand-written plan above)\n"
          "  --param-memory-budget LOW,HIGH  auto: parameter bytes per rank as fractions of\n"
          "                        the unsharded total, e.g. 0,0.125\n"
          "  --constrain PAT=DIM:PL[,..]  auto: fix the storage of the inputs a glob matches\n"
          "                        (the same as --place); repeatable\n"
          "  --device-profile P    the cost model's device: cpu, h100, h200, a100, b200 (default: "
          "by\n"
          "                        --device)\n"
          "  --gpus-per-node N     ranks per node for the cost model's link classes\n"
          "\n"
          "model and training:\n",
          f);
    for (size_t i = 0; i < HP_ARRAY_LEN(num_flags); i++)
        fprintf(f, "  %-21s %s\n", num_flags[i].flag, num_flags[i].help);
}

static int set_string(const char *verb, const char *flag, const char *v, char *dst, size_t cap) {
    if (strlen(v) >= cap)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: longer than %zu bytes", flag, cap - 1);
    strcpy(dst, v);
    return HPCTL_OK;
}

static bool has_glob(const char *s) {
    return strchr(s, '*') || strchr(s, '?');
}

/* "dp=8" or "dp=2,tp=4": the plan's mesh and the world size (their product). */
static int parse_mesh(const char *verb, const char *v, hp_job *job) {
    hp_plan *p = &job->plan;
    int n = 0;
    int64_t world = 1;
    for (const char *s = v; *s;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        size_t name_len = eq ? (size_t)(eq - s) : 0;
        if (!eq || name_len == 0 || name_len >= HP_MESH_NAME_MAX)
            return hpctl_fail(HPCTL_USAGE, verb, "--mesh: '%s' is not NAME=N[,NAME=N...]", v);
        if (n == HP_MESH_MAX_DIMS)
            return hpctl_fail(HPCTL_USAGE, verb, "--mesh: more than %d dims", HP_MESH_MAX_DIMS);
        char size[32];
        snprintf(size, sizeof size, "%.*s", (int)(len - name_len - 1), eq + 1);
        int64_t x;
        int rc = hpctl_parse_i64(verb, "--mesh", size, 1, HP_MAX_WORLD, &x);
        if (rc != HPCTL_OK) return rc;
        world *= x;
        if (world > HP_MAX_WORLD)
            return hpctl_fail(HPCTL_USAGE, verb, "--mesh: '%s' has more than %d ranks", v,
                              HP_MAX_WORLD);
        hp_mesh_dim *d = &p->mesh[n++];
        snprintf(d->name, sizeof d->name, "%.*s", (int)name_len, s);
        d->size = (int)x;
        d->link = HP_LINK_INTRA_NODE;
        s = comma ? comma + 1 : s + len;
    }
    if (n == 0) return hpctl_fail(HPCTL_USAGE, verb, "--mesh: empty");
    p->n_mesh = n;
    job->resources.world_size = (int)world;
    return HPCTL_OK;
}

/* "5,6": train.profile_steps (each >= 1, at most HP_JOB_PROFILE_MAX). */
static int parse_profile_steps(const char *verb, const char *v, hp_job *job) {
    int n = 0;
    for (const char *s = v;;) {
        size_t len = strcspn(s, ",");
        char num[32];
        if (len == 0 || len >= sizeof num)
            return hpctl_fail(HPCTL_USAGE, verb, "--profile-steps: '%s' is not S[,S...]", v);
        if (n == HP_JOB_PROFILE_MAX)
            return hpctl_fail(HPCTL_USAGE, verb, "--profile-steps: more than %d steps",
                              HP_JOB_PROFILE_MAX);
        memcpy(num, s, len);
        num[len] = 0;
        int64_t x;
        int rc = hpctl_parse_i64(verb, "--profile-steps", num, 1, (int64_t)1e12, &x);
        if (rc != HPCTL_OK) return rc;
        job->train.profile_steps[n++] = x;
        if (!s[len]) break;
        s += len + 1;
    }
    job->train.n_profile_steps = n;
    return HPCTL_OK;
}

/* Parses `new`'s flags into job; returns an exit code. */
/* --place and --tp-plan name mesh dims, which --mesh may set after them: kept until the
 * flags are read, then resolved. */
#define MAX_PLACES 256
static const char *places[MAX_PLACES];
static int n_places;
static const char *tp_plan;
static int n_tp_plan_constraints; /* the plan's first constraints, --tp-plan's */
static const char *graph_path;    /* --graph */
static bool warmup_given;         /* --warmup */

/* "PATTERN=DIM:PL[,DIM:PL...]": a constraint on every graph input the glob matches, Replicate
 * on the mesh dims it does not name. */
static int add_place(const char *verb, const char *flag, const char *v, hp_job *job) {
    const char *eq = strrchr(v, '=');
    if (!eq || eq == v || !eq[1])
        return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not PATTERN=DIM:PLACEMENT[,...]", flag,
                          v);
    char pattern[HP_MAX_STR], spec[256];
    if ((size_t)(eq - v) >= sizeof pattern || strlen(eq + 1) >= sizeof spec)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is too long", flag, v);
    memcpy(pattern, v, (size_t)(eq - v));
    pattern[eq - v] = 0;
    snprintf(spec, sizeof spec, "%s", eq + 1);
    hp_placement pl[HP_MESH_MAX_DIMS];
    bool seen[HP_MESH_MAX_DIMS] = {0};
    for (int d = 0; d < HP_MESH_MAX_DIMS; d++) pl[d] = HP_REPLICATE;
    for (char *save = NULL, *item = strtok_r(spec, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        if (!colon)
            return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not DIM:PLACEMENT (e.g. tp:S(0))",
                              flag, item);
        *colon = 0;
        int d = -1;
        for (int k = 0; k < job->plan.n_mesh; k++)
            if (!strcmp(job->plan.mesh[k].name, item)) d = k;
        if (d < 0)
            return hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not a dim of the mesh (--mesh)", flag,
                              item);
        if (seen[d]) return hpctl_fail(HPCTL_USAGE, verb, "%s: mesh dim '%s' twice", flag, item);
        seen[d] = true;
        hp_err err = {0};
        if (hp_placement_parse(colon + 1, &pl[d], &err) != HP_OK)
            return hpctl_fail(HPCTL_USAGE, verb, "%s: %s", flag, err.msg);
    }
    hp_err err = {0};
    if (hp_job_add_place_pattern(job, pattern, pl, job->plan.n_mesh, &err) != HP_OK)
        return hpctl_fail(HPCTL_USAGE, verb, "%s: %s", flag, err.msg);
    return HPCTL_OK;
}

/* --tp-plan llama: torchtitan's Llama tensor-parallel plan on the mesh dim "tp" without
 * sequence parallel: colwise (Shard(0) of [out, in]) wq, wk, wv, w1, w3 and the output
 * projection (vocab-sharded logits: gathered before the cross entropy, or with loss parallel
 * the cross entropy runs on them, passes/loss_parallel.c); rowwise (Shard(1)) wo, w2; the
 * embedding rowwise, i.e. its table vocab-sharded (Shard(0): the masked local lookup, a
 * Partial sum all-reduced, docs/placements.md); the norms replicated. */
static int add_tp_plan(const char *verb, const char *v, hp_job *job) {
    if (strcmp(v, "llama"))
        return hpctl_fail(HPCTL_USAGE, verb, "--tp-plan: '%s' is not a known plan (llama)", v);
    bool has_tp = false;
    for (int k = 0; k < job->plan.n_mesh; k++) has_tp |= !strcmp(job->plan.mesh[k].name, "tp");
    if (!has_tp) return hpctl_fail(HPCTL_USAGE, verb, "--tp-plan: the mesh has no 'tp' dim");
    static const char *const plan[] = {"layers.*.attention.wq.weight=tp:S(0)",
                                       "layers.*.attention.wk.weight=tp:S(0)",
                                       "layers.*.attention.wv.weight=tp:S(0)",
                                       "layers.*.attention.wo.weight=tp:S(1)",
                                       "layers.*.feed_forward.w1.weight=tp:S(0)",
                                       "layers.*.feed_forward.w3.weight=tp:S(0)",
                                       "layers.*.feed_forward.w2.weight=tp:S(1)",
                                       "tok_embeddings.weight=tp:S(0)",
                                       "output.weight=tp:S(0)"};
    for (size_t i = 0; i < HP_ARRAY_LEN(plan); i++) {
        int rc = add_place(verb, "--tp-plan", plan[i], job);
        if (rc != HPCTL_OK) return rc;
    }
    return HPCTL_OK;
}

/* The model flag that sets a Llama parameter's dim, for a split that does not divide it. */
static const char *llama_size_flag(const char *fqn, int dim) {
    static const struct {
        const char *suffix;
        int dim;
        const char *flag;
    } src[] = {{"attention.wq.weight", 0, "--dim"},
               {"attention.wk.weight", 0, "--kv-heads"},
               {"attention.wv.weight", 0, "--kv-heads"},
               {"attention.wo.weight", 1, "--dim"},
               {"feed_forward.w1.weight", 0, "--ffn-hidden"},
               {"feed_forward.w3.weight", 0, "--ffn-hidden"},
               {"feed_forward.w2.weight", 1, "--ffn-hidden"},
               {"tok_embeddings.weight", 0, "--vocab"},
               {"output.weight", 0, "--vocab"}};
    size_t n = strlen(fqn);
    for (size_t i = 0; i < HP_ARRAY_LEN(src); i++) {
        size_t k = strlen(src[i].suffix);
        if (src[i].dim == dim && n >= k && !strcmp(fqn + n - k, src[i].suffix)) return src[i].flag;
    }
    return NULL;
}

/* A hand-written plan's parameter split over a mesh dim other than dp must divide the dim it
 * splits (uneven splits are FSDP's gathered storage only, passes/spmd.c): refuse it here, naming
 * the flag that placed it and the one that sized it, rather than when the job compiles. */
static int check_even_splits(const char *verb, const hp_job *job, bool built) {
    const hp_plan *p = &job->plan;
    if (p->mode == HP_PLAN_AUTO || !p->n_constraints) return HPCTL_OK;
    const hp_graph *g = job->graph;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int i = 0; i < gi.n_params; i++) {
        const hp_attr *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        if (!fqn || !fqn->s) continue;
        int hit = hp_plan_constraint_for(p, fqn->s); /* as the passes place it */
        if (hit < 0) continue;
        const hp_place_constraint *c = &p->constraints[hit];
        const hp_type *t = &g->nodes[i].out[0];
        int64_t ways[HP_MAX_RANK];
        for (int d = 0; d < HP_MAX_RANK; d++) ways[d] = 1;
        for (int m = 0; m < c->n_placements && m < p->n_mesh; m++) {
            const hp_placement *pl = &c->placements[m];
            if (pl->kind != HP_PLACE_SHARD || pl->dim < 0 || pl->dim >= t->rank ||
                !strcmp(p->mesh[m].name, "dp"))
                continue;
            ways[pl->dim] *= p->mesh[m].size;
            if (t->shape[pl->dim] % ways[pl->dim] == 0) continue;
            const char *sized = built ? llama_size_flag(fqn->s, pl->dim) : NULL;
            return hpctl_fail(HPCTL_USAGE, verb,
                              "%s: '%s' splits its dim %d of size %lld over mesh dim '%s' into "
                              "%lld pieces, which does not divide it%s%s%s",
                              hit < n_tp_plan_constraints ? "--tp-plan" : "--place", fqn->s,
                              pl->dim, (long long)t->shape[pl->dim], p->mesh[m].name,
                              (long long)ways[pl->dim], sized ? " (sized by " : "",
                              sized ? sized : "", sized ? ")" : "");
        }
    }
    return HPCTL_OK;
}

/* Whether 'a' is one of new's flags that take a value (only to tell "missing value" from an
 * unknown flag at the end of the line; the chain in new_flags is what parses them). */
static bool takes_value(const char *a) {
    static const char *const named[] = {"--param-dtype",
                                        "--reduce-dtype",
                                        "--model",
                                        "--graph",
                                        "-o",
                                        "--output",
                                        "--name",
                                        "--data",
                                        "--eval-data",
                                        "--init-from",
                                        "--fsdp",
                                        "--device",
                                        "--mesh",
                                        "--mode",
                                        "--param-memory-budget",
                                        "--device-profile",
                                        "--gpus-per-node",
                                        "--ac",
                                        "--ac-every",
                                        "--place",
                                        "--constrain",
                                        "--tp-plan",
                                        "--bucket-mb",
                                        "--prefetch",
                                        "--max-restarts",
                                        "--profile-steps",
                                        "--on-nonfinite",
                                        "--decay"};
    for (size_t k = 0; k < HP_ARRAY_LEN(named); k++)
        if (!strcmp(a, named[k])) return true;
    for (size_t k = 0; k < HP_ARRAY_LEN(num_flags); k++)
        if (!strcmp(a, num_flags[k].flag)) return true;
    return false;
}

static int new_flags(int argc, char **argv, hp_job *job, const char **model, const char **out) {
    const char *verb = "new";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            new_usage(stdout);
            exit(HPCTL_OK);
        }
        if (!strcmp(a, "--no-overlap")) {
            job->passes.enable_overlap = false;
            continue;
        }
        if (!strcmp(a, "--no-fuse-attention")) {
            hp_pass_config *pc = &job->passes;
            int k = 0;
            while (k < pc->n_switches && strcmp(pc->switches[k].name, "fuse_attention")) k++;
            if (k == pc->n_switches) {
                if (k == HP_PASS_MAX)
                    return hpctl_fail(HPCTL_USAGE, verb, "%s: more than %d pass switches", a,
                                      HP_PASS_MAX);
                pc->n_switches++;
            }
            snprintf(pc->switches[k].name, sizeof pc->switches[k].name, "fuse_attention");
            pc->switches[k].enabled = false;
            continue;
        }
        if (!strcmp(a, "--no-reshard-after-forward")) {
            job->plan.reshard_after_forward = false;
            continue;
        }
        if (!strcmp(a, "--loss-parallel")) {
            job->plan.loss_parallel = true;
            continue;
        }
        if (a[0] != '-')
            return hpctl_fail(HPCTL_USAGE, verb,
                              "unexpected argument '%s' (flags take one value each; try hpctl new "
                              "--help)",
                              a);
        if (i + 1 >= argc) {
            if (!takes_value(a))
                return hpctl_fail(HPCTL_USAGE, verb, "unknown flag '%s' (try hpctl new --help)", a);
            return hpctl_fail(HPCTL_USAGE, verb, "%s: missing value", a);
        }
        const char *v = argv[++i];
        int rc = HPCTL_OK;
        const struct num_flag *nf = NULL;
        for (size_t k = 0; k < HP_ARRAY_LEN(num_flags); k++)
            if (!strcmp(a, num_flags[k].flag)) nf = &num_flags[k];
        if (nf && nf->kind == FLAG_I64) {
            int64_t x;
            rc = hpctl_parse_i64(verb, a, v, (int64_t)nf->lo, (int64_t)nf->hi, &x);
            if (rc == HPCTL_OK) *(int64_t *)((char *)job + nf->offset) = x;
            if (!strcmp(a, "--warmup")) warmup_given = true;
        } else if (nf) {
            rc = hpctl_parse_f64(verb, a, v, nf->lo, nf->hi, (double *)((char *)job + nf->offset));
        } else if (!strcmp(a, "--param-dtype") || !strcmp(a, "--reduce-dtype")) {
            hp_dtype dt;
            hp_err e = {0};
            if (hp_dtype_parse(v, &dt, &e) != HP_OK || !hp_dtype_is_float(dt) || dt == HP_F16)
                rc = hpctl_fail(HPCTL_USAGE, verb, "%s: '%s' is not f32 or bf16", a, v);
            else if (a[2] == 'p')
                job->plan.param_dtype = dt;
            else if (dt != HP_F32)
                rc = hpctl_fail(HPCTL_USAGE, verb,
                                "%s: '%s' is not supported; gradients are reduced in f32", a, v);
            else
                job->plan.reduce_dtype = dt;
        } else if (!strcmp(a, "--model")) {
            *model = v;
        } else if (!strcmp(a, "--graph")) {
            graph_path = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            *out = v;
        } else if (!strcmp(a, "--name")) {
            rc = set_string(verb, a, v, job->name, sizeof job->name);
        } else if (!strcmp(a, "--data")) {
            rc = set_string(verb, a, v, job->train.data_path, sizeof job->train.data_path);
        } else if (!strcmp(a, "--eval-data")) {
            rc =
                set_string(verb, a, v, job->train.eval_data_path, sizeof job->train.eval_data_path);
        } else if (!strcmp(a, "--init-from")) {
            rc = set_string(verb, a, v, job->train.init_from, sizeof job->train.init_from);
        } else if (!strcmp(a, "--fsdp")) {
            hp_err err = {0};
            hp_status st = has_glob(v) ? hp_job_add_fsdp_pattern(job, v, &err)
                                       : hp_job_add_fsdp_fqn(job, v, &err);
            if (st != HP_OK) rc = hpctl_fail(HPCTL_USAGE, verb, "--fsdp: %s", err.msg);
        } else if (!strcmp(a, "--device")) {
            hp_err err = {0};
            if (hp_device_parse(v, &job->resources.device, &err) != HP_OK)
                rc = hpctl_fail(HPCTL_USAGE, verb, "--device: %s", err.msg);
            /* one GPU per rank on a node until a flag says otherwise; cpu has none */
            job->resources.gpus_per_node = job->resources.device == HP_DEVICE_CUDA ? 1 : 0;
        } else if (!strcmp(a, "--mesh")) {
            rc = parse_mesh(verb, v, job);
        } else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "auto"))
                job->plan.mode = HP_PLAN_AUTO;
            else if (!strcmp(v, "fsdp"))
                job->plan.mode = HP_PLAN_FSDP;
            else
                rc = hpctl_fail(HPCTL_USAGE, verb, "--mode: '%s' is not fsdp or auto", v);
        } else if (!strcmp(a, "--param-memory-budget")) {
            double lo, hi;
            char tail;
            if (sscanf(v, "%lf,%lf%c", &lo, &hi, &tail) != 2 || !(lo >= 0 && lo <= hi && hi <= 1))
                rc = hpctl_fail(HPCTL_USAGE, verb,
                                "--param-memory-budget: '%s' is not LOW,HIGH with 0 <= LOW <= "
                                "HIGH <= 1",
                                v);
            job->plan.mem_low = rc == HPCTL_OK ? lo : 0;
            job->plan.mem_high = rc == HPCTL_OK ? hi : 1;
        } else if (!strcmp(a, "--device-profile")) {
            if (!hp_device_profile_known(v))
                rc = hpctl_fail(
                    HPCTL_USAGE, verb,
                    "--device-profile: '%s' is not a known profile (" HP_DEVICE_PROFILES ")", v);
            else
                snprintf(job->plan.device_profile, sizeof job->plan.device_profile, "%s", v);
        } else if (!strcmp(a, "--gpus-per-node")) {
            int64_t n;
            rc = hpctl_parse_i64(verb, a, v, 1, HP_MAX_WORLD, &n);
            if (rc == HPCTL_OK) job->plan.gpus_per_node = (int)n;
        } else if (!strcmp(a, "--ac")) {
            hp_err e = {0};
            if (hp_ac_mode_parse(v, &job->plan.ac_mode, &e) != HP_OK)
                rc = hpctl_fail(HPCTL_USAGE, verb, "--ac: %s", e.msg);
        } else if (!strcmp(a, "--ac-every")) {
            int64_t n;
            rc = hpctl_parse_i64(verb, a, v, 1, HP_MAX_AC_EVERY, &n);
            if (rc == HPCTL_OK) job->plan.ac_every = (int)n;
        } else if (!strcmp(a, "--place") || !strcmp(a, "--constrain")) {
            if (n_places == MAX_PLACES)
                rc = hpctl_fail(HPCTL_USAGE, verb, "--place: more than %d", MAX_PLACES);
            else
                places[n_places++] = v;
        } else if (!strcmp(a, "--tp-plan")) {
            tp_plan = v;
        } else if (!strcmp(a, "--bucket-mb")) {
            double mb;
            rc = hpctl_parse_f64(verb, a, v, 0, 1 << 20, &mb);
            if (rc == HPCTL_OK) job->passes.bucket_bytes = (int64_t)(mb * (1 << 20) + 0.5);
        } else if (!strcmp(a, "--prefetch")) {
            int64_t x;
            rc = hpctl_parse_i64(verb, a, v, 0, 64, &x);
            if (rc == HPCTL_OK) job->passes.prefetch_depth = (int)x;
        } else if (!strcmp(a, "--max-restarts")) {
            int64_t x;
            rc = hpctl_parse_i64(verb, a, v, 0, 1000, &x);
            if (rc == HPCTL_OK) job->resources.max_restarts = (int)x;
        } else if (!strcmp(a, "--profile-steps")) {
            rc = parse_profile_steps(verb, v, job);
        } else if (!strcmp(a, "--on-nonfinite")) {
            if (!strcmp(v, "stop"))
                job->train.on_nonfinite = HP_NONFINITE_STOP;
            else if (!strcmp(v, "skip"))
                job->train.on_nonfinite = HP_NONFINITE_SKIP;
            else
                rc = hpctl_fail(HPCTL_USAGE, verb, "--on-nonfinite: '%s' is not stop or skip", v);
        } else if (!strcmp(a, "--decay")) {
            if (!strcmp(v, "linear"))
                job->train.decay = HP_DECAY_LINEAR;
            else if (!strcmp(v, "cosine"))
                job->train.decay = HP_DECAY_COSINE;
            else if (!strcmp(v, "none"))
                job->train.decay = HP_DECAY_NONE;
            else
                rc =
                    hpctl_fail(HPCTL_USAGE, verb, "--decay: '%s' is not linear, cosine or none", v);
        } else {
            return hpctl_fail(HPCTL_USAGE, verb, "unknown flag '%s' (try hpctl new --help)", a);
        }
        if (rc != HPCTL_OK) return rc;
    }
    if (*model && graph_path)
        return hpctl_fail(HPCTL_USAGE, verb, "--model and --graph exclude each other");
    if (!*model && !graph_path)
        return hpctl_fail(HPCTL_USAGE, verb, "--model is required (or --graph FILE.hpir)");
    if (!*out) return hpctl_fail(HPCTL_USAGE, verb, "-o JOB.pb is required");
    return HPCTL_OK;
}

/* The job's graph from --graph: a forward graph gets hp's autodiff, a joint one is taken as
 * it is; the model spec stays empty (the graph is the model). The flags that size a built-in
 * model do not apply: the graph's shapes are fixed. */
static int graph_from_file(const char *verb, hp_job *job) {
    const hp_model_spec *m = &job->model;
    const struct {
        const char *flag;
        int64_t v;
    } sized[] = {
        {"--batch", m->batch},           {"--seq", m->seq},       {"--dim", m->dim},
        {"--layers", m->n_layers},       {"--heads", m->n_heads}, {"--kv-heads", m->n_kv_heads},
        {"--ffn-hidden", m->ffn_hidden}, {"--vocab", m->vocab}};
    for (size_t i = 0; i < HP_ARRAY_LEN(sized); i++)
        if (sized[i].v)
            return hpctl_fail(HPCTL_USAGE, verb,
                              "%s: the graph fixes the model's shapes (re-export it to change "
                              "them)",
                              sized[i].flag);
    hp_err err = {0};
    hp_graph *g = NULL;
    if (hp_graph_read_file(graph_path, &g, &err) != HP_OK)
        return hpctl_fail(HPCTL_USAGE, verb, "--graph: %s", err.msg);
    for (int i = 0; i < g->n_nodes && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) {
        const hp_node *n = &g->nodes[i];
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        if (hp_node_int(n, HP_ATTR_KIND, -1) == HP_INPUT_PARAM && n->out[0].dtype != HP_F32) {
            const char *dt = hp_dtype_name(n->out[0].dtype);
            int rc = hpctl_fail(HPCTL_USAGE, verb,
                                "--graph %s: parameter '%s' is %s: hp holds parameters in f32 "
                                "(the master weights); give the graph f32 parameters and ask "
                                "for %s compute with --param-dtype %s",
                                graph_path, fqn && fqn->s ? fqn->s : "?", dt, dt, dt);
            hp_graph_free(g); /* after the message: the fqn is the graph's */
            return rc;
        }
    }
    hp_graph_inputs in = hp_graph_count_inputs(g);
    if (g->n_outputs == 1 && in.n_params > 0) {
        if (hp_autodiff(g, g->outputs[0], &err) != HP_OK) {
            hp_graph_free(g);
            return hpctl_fail(HPCTL_USAGE, verb, "--graph %s: autodiff: %s", graph_path, err.msg);
        }
    } else if (g->n_outputs != 1 + in.n_params) {
        int n_out = g->n_outputs;
        hp_graph_free(g);
        return hpctl_fail(HPCTL_USAGE, verb,
                          "--graph %s: %d outputs; a forward graph has 1 (the loss), a joint "
                          "graph 1 + one gradient per parameter (%d)",
                          graph_path, n_out, 1 + in.n_params);
    }
    job->graph = g;
    if (!job->name[0]) { /* the file's stem, in the characters a job name may hold */
        const char *base = strrchr(graph_path, '/');
        base = base ? base + 1 : graph_path;
        size_t k = 0;
        for (; base[k] && base[k] != '.' && k + 1 < sizeof job->name; k++) {
            char ch = base[k];
            bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
            job->name[k] = ok ? ch : '_';
        }
        job->name[k] = 0;
        if (!k) snprintf(job->name, sizeof job->name, "graph");
    }
    return HPCTL_OK;
}

int hpctl_new(int argc, char **argv) {
    const char *verb = "new";
    hp_job *job = hp_job_new();
    if (!job) return hpctl_fail(HPCTL_ERROR, verb, "out of memory");
    const char *model = NULL, *out = NULL;
    hp_model_spec overrides = {0};
    job->name[0] = 0; /* default: the flavor, once known */
    int rc = new_flags(argc, argv, job, &model, &out);
    if (rc != HPCTL_OK) goto done;
    hp_err err = {0};
    if (graph_path) {
        if ((rc = graph_from_file(verb, job)) != HPCTL_OK) goto done;
        goto built;
    }
    overrides = job->model;
    if (hp_model_spec_parse(model, &job->model, &err) != HP_OK) {
        rc = hpctl_fail(HPCTL_USAGE, verb, "--model: %s", err.msg);
        goto done;
    }
    /* the parse zeroes the overrides; put back the ones the flags set */
    strcpy(overrides.family, job->model.family);
    strcpy(overrides.flavor, job->model.flavor);
    job->model = overrides;
    if (!job->name[0]) snprintf(job->name, sizeof job->name, "%s", job->model.flavor);
    if (hp_model_build_joint(&job->model, &job->graph, &err) != HP_OK) {
        rc = hpctl_fail(HPCTL_USAGE, verb, "model: %s", err.msg);
        goto done;
    }
built:;
    /* The training shapes are the graph's: its first data input is [batch, seq, ...]. */
    hp_graph_inputs in = hp_graph_count_inputs(job->graph);
    int64_t micro_batch = 0; /* a micro-step's sequences, all ranks together */
    if (in.n_data > 0) {
        const hp_type *t = &job->graph->nodes[in.n_params + in.n_buffers].out[0];
        if (t->rank >= 2) job->train.seq = t->shape[1];
        if (t->rank >= 1) micro_batch = t->shape[0];
    }
    if (job->train.global_batch > 0) { /* --global-batch: gradient accumulation */
        if (micro_batch <= 0) {
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--global-batch: the graph has no batched data input to accumulate");
            goto done;
        }
        if (job->train.global_batch % micro_batch) {
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--global-batch: %lld is not a multiple of the batch of a micro-step, "
                            "%lld (--batch, or the graph's)",
                            (long long)job->train.global_batch, (long long)micro_batch);
            goto done;
        }
    } else {
        job->train.global_batch = micro_batch;
    }
    if (job->plan.loss_parallel) {
        bool has_tp = false;
        for (int k = 0; k < job->plan.n_mesh; k++) has_tp |= !strcmp(job->plan.mesh[k].name, "tp");
        if (!has_tp) {
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--loss-parallel: the mesh has no 'tp' dim to split the vocabulary "
                            "over (e.g. --mesh tp=2 --tp-plan llama --loss-parallel)");
            goto done;
        }
    }
    if ((job->plan.mem_low != 0 || job->plan.mem_high != 1) && job->plan.mode != HP_PLAN_AUTO) {
        rc = hpctl_fail(HPCTL_USAGE, verb,
                        "--param-memory-budget is honoured by auto-sharding only: add --mode auto");
        goto done;
    }
    if (tp_plan && (rc = add_tp_plan(verb, tp_plan, job)) != HPCTL_OK) goto done;
    n_tp_plan_constraints = job->plan.n_constraints;
    for (int i = 0; i < n_places; i++)
        if ((rc = add_place(verb, "--place", places[i], job)) != HPCTL_OK) goto done;
    if (micro_batch > 0) {
        /* --batch is a micro-step's batch, all ranks together, split over the data-parallel
         * ranks (known once the placements are): say so here rather than at compile time */
        int dp = hp_job_dp_size(job);
        if (micro_batch % dp) {
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--batch: %lld sequences do not split over the mesh's %d "
                            "data-parallel ranks",
                            (long long)micro_batch, dp);
            goto done;
        }
        job->train.local_batch = micro_batch / dp;
        if (job->train.global_batch / micro_batch > HP_MAX_GRAD_ACCUM) {
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--global-batch: %lld is %lld micro-steps of %lld sequences; at "
                            "most %d are supported",
                            (long long)job->train.global_batch,
                            (long long)(job->train.global_batch / micro_batch),
                            (long long)micro_batch, HP_MAX_GRAD_ACCUM);
            goto done;
        }
    }
    /* as torchtitan: a default warmup longer than the run is cut to the run; one asked for is
     * refused naming its flag */
    if (job->train.warmup_steps > job->train.steps) {
        if (warmup_given) {
            rc = hpctl_fail(HPCTL_USAGE, verb, "--warmup: %lld steps exceed --steps %lld",
                            (long long)job->train.warmup_steps, (long long)job->train.steps);
            goto done;
        }
        job->train.warmup_steps = job->train.steps;
    }
    hp_train_config *tc = &job->train;
    if (tc->eval_interval == 0 && (tc->eval_steps || tc->eval_data_path[0])) {
        rc = hpctl_fail(HPCTL_USAGE, verb, "%s: evaluation needs --eval-interval N (N > 0)",
                        tc->eval_data_path[0] ? "--eval-data" : "--eval-steps");
        goto done;
    }
    if (tc->eval_interval > 0 && !tc->eval_data_path[0]) {
        rc = hpctl_fail(HPCTL_USAGE, verb,
                        "--eval-interval: evaluation needs held-out data: --eval-data PATH");
        goto done;
    }
    if (tc->eval_interval > 0 && tc->eval_steps == 0) tc->eval_steps = 20;
    if (hp_job_validate(job, &err) != HP_OK) {
        rc = hpctl_fail(HPCTL_USAGE, verb, "%s", err.msg);
        goto done;
    }
    if ((rc = check_even_splits(verb, job, !graph_path)) != HPCTL_OK) goto done;
    if (hp_job_write_file(out, job, &err) != HP_OK) {
        rc = hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
        goto done;
    }
    if (graph_path)
        printf("wrote %s (graph %s, %lld parameters, %d nodes)\n", out, graph_path,
               (long long)hp_graph_param_count(job->graph), job->graph->n_nodes);
    else
        printf("wrote %s (%s:%s, %lld parameters, %d nodes)\n", out, job->model.family,
               job->model.flavor, (long long)hp_graph_param_count(job->graph), job->graph->n_nodes);
    /* the plan as hpd and every rank will compile it, said now rather than by each rank at
     * its setup; a warning, not a refusal: the job file is still what was asked for (hpctl
     * plan --world N may compile it for another world) */
    hp_compiled *compiled = NULL;
    if (hp_compile(job, 0, &compiled, &err) != HP_OK)
        fprintf(stderr,
                "hpctl: new: warning: the plan does not compile: %s; hpctl plan, hpd and "
                "hp-worker refuse it\n",
                err.msg);
    hp_compiled_free(compiled);
    /* a job only planned (hpctl plan) needs no token data: a warning, not a refusal */
    if (hp_job_check_trainable(job, &err) != HP_OK)
        fprintf(stderr,
                "hpctl: new: warning: %s; hpctl plan and inspect take this job, hpd and "
                "hp-worker refuse to train it\n",
                err.msg);
done:
    hp_job_free(job);
    return rc;
}

/* ---- inspect -------------------------------------------------------------------------------- */

typedef struct job_summary {
    int64_t params, embedding_params, param_bytes;
    double flops_per_token;
    int n_nodes, n_backward, n_collectives;
    int op_count[HP_OP_COUNT];
    hp_graph_inputs inputs;
} job_summary;

static void summarize(const hp_job *job, job_summary *s) {
    memset(s, 0, sizeof *s);
    const hp_graph *g = job->graph;
    s->params = hp_graph_param_count(g);
    s->inputs = hp_graph_count_inputs(g);
    for (int i = 0; i < s->inputs.n_params; i++)
        s->param_bytes +=
            hp_type_numel(&g->nodes[i].out[0]) * (int64_t)hp_dtype_size(g->nodes[i].out[0].dtype);
    int e = hp_graph_find_fqn(g, "tok_embeddings.weight");
    if (e >= 0) s->embedding_params = hp_type_numel(&g->nodes[e].out[0]);
    s->flops_per_token = hp_model_flops_per_token(&job->model);
    s->n_nodes = g->n_nodes;
    for (int i = 0; i < g->n_nodes; i++) {
        unsigned flags = hp_op_get(g->nodes[i].op)->flags;
        s->op_count[g->nodes[i].op]++;
        if (flags & HP_OPF_BACKWARD) s->n_backward++;
        if (flags & HP_OPF_COLLECTIVE) s->n_collectives++;
    }
}

static const char *decay_name(hp_decay_kind d) {
    return d == HP_DECAY_LINEAR ? "linear" : d == HP_DECAY_COSINE ? "cosine" : "none";
}

/* 1234567 -> "1,234,567" */
static const char *commas(int64_t v, char *buf) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v)), o = 0;
    if (v < 0) buf[o++] = '-';
    for (int i = 0; i < n; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i != n - 1) buf[o++] = ',';
    }
    buf[o] = 0;
    return buf;
}
#define COMMAS(v) commas((v), (char[40]){0})

static void print_text(const hp_job *job, const job_summary *s) {
    const hp_model_spec *m = &job->model;
    printf("job         %s\n", job->name);
    if (m->family[0])
        printf("model       %s:%s", m->family, m->flavor);
    else
        printf("model       a graph (no built-in family)");
    hp_llama3_config c;
    if (!strcmp(m->family, "llama3") && hp_llama3_resolve(m, &c, NULL) == HP_OK)
        printf("  dim %lld, layers %lld, heads %lld (kv %lld), ffn %lld, vocab %lld",
               (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads,
               (long long)c.n_kv_heads, (long long)c.ffn_hidden, (long long)c.vocab);
    int dp = hp_job_dp_size(job);
    int64_t accum = hp_job_grad_accum(job);
    const char *unit = accum > 1 ? "micro-step" : "step";
    printf("\nbatch       %lld x seq %lld per %s (%lld per rank over %d data-parallel rank%s) = "
           "%s tokens per rank per %s\n",
           (long long)(job->train.local_batch * dp), (long long)job->train.seq, unit,
           (long long)job->train.local_batch, dp, dp == 1 ? "" : "s",
           COMMAS(job->train.local_batch * job->train.seq), unit);
    if (accum > 1)
        printf("            gradient accumulation: %lld micro-steps an optimizer step, global "
               "batch %lld (%s tokens a step)\n",
               (long long)accum, (long long)(job->train.local_batch * dp * accum),
               COMMAS(job->train.local_batch * dp * accum * job->train.seq));
    printf("parameters  %s (%.1f MiB)", COMMAS(s->params), (double)s->param_bytes / (1 << 20));
    if (s->embedding_params) printf(", %s in the embedding", COMMAS(s->embedding_params));
    printf("\nflops/token %.4g (6*(N - embedding) + 12*L*d*T, torchtitan's convention)\n",
           s->flops_per_token);
    printf("graph       %d nodes (%d backward ops, %d collectives); inputs: %d params, %d buffers, "
           "%d data; %d outputs (loss + %d gradients)\n",
           s->n_nodes, s->n_backward, s->n_collectives, s->inputs.n_params, s->inputs.n_buffers,
           s->inputs.n_data, job->graph->n_outputs, job->graph->n_outputs - 1);
    printf("ops        ");
    for (int op = 0; op < HP_OP_COUNT; op++)
        if (s->op_count[op] && op != HP_OP_PLACEHOLDER)
            printf(" %s %d", hp_op_get((hp_op)op)->name, s->op_count[op]);
    const hp_train_config *t = &job->train;
    printf("\ntrain       %lld steps, AdamW lr %g (warmup %lld, %s decay to %g x), betas "
           "%g/%g, eps %g, weight decay %g, clip %g, seed %llu\n",
           (long long)t->steps, t->lr, (long long)t->warmup_steps, decay_name(t->decay),
           t->min_lr_ratio, t->beta1, t->beta2, t->eps, t->weight_decay, t->grad_clip,
           (unsigned long long)t->seed);
    if (t->on_nonfinite == HP_NONFINITE_SKIP)
        printf("            a step with a non-finite loss or grad norm skips its update\n");
    printf("data        %s\n", t->data_path[0] ? t->data_path : "built-in corpus");
    if (t->eval_interval > 0)
        printf("eval        every %lld steps and after the last: %lld batches of %s\n",
               (long long)t->eval_interval, (long long)t->eval_steps, t->eval_data_path);
    printf("plan        mesh");
    for (int i = 0; i < job->plan.n_mesh; i++)
        printf("%s%s=%d", i ? "," : " ", job->plan.mesh[i].name, job->plan.mesh[i].size);
    printf(", mode %s, %d FSDP marks, %d patterns, %d placement constraints, loss parallel %s, "
           "param dtype %s, reduce dtype %s\n",
           job->plan.mode == HP_PLAN_FSDP ? "fsdp" : "auto", job->plan.n_fsdp_fqns,
           job->plan.n_fsdp_patterns, job->plan.n_constraints,
           job->plan.loss_parallel ? "on" : "off", hp_dtype_name(job->plan.param_dtype),
           hp_dtype_name(job->plan.reduce_dtype));
    if (job->plan.ac_mode != HP_AC_NONE) {
        printf("            activation checkpointing %s", hp_ac_mode_name(job->plan.ac_mode));
        if (job->plan.ac_mode == HP_AC_AUTO)
            printf(": the fastest mode that fits the device (hpctl plan shows the choice)");
        else if (job->plan.ac_every > 1)
            printf(", every %d-th block", job->plan.ac_every);
        else
            printf(", every block");
        printf("\n");
    }
    printf("resources   world %d, device %s\n", job->resources.world_size,
           hp_device_name(job->resources.device));
}

static int print_json(const hp_job *job, const job_summary *s) {
    json_t *ops = json_object();
    for (int op = 0; op < HP_OP_COUNT; op++)
        if (s->op_count[op])
            json_object_set_new(ops, hp_op_get((hp_op)op)->name, json_integer(s->op_count[op]));
    const hp_train_config *t = &job->train;
    json_t *root = json_pack(
        "{s:s, s:{s:s, s:s}, s:I, s:I, s:I, s:f, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o},"
        " s:{s:I, s:f, s:I, s:s, s:I, s:I, s:s}, s:{s:i, s:s}}",
        "name", job->name, "model", "family", job->model.family, "flavor", job->model.flavor,
        "params", (json_int_t)s->params, "param_bytes", (json_int_t)s->param_bytes,
        "embedding_params", (json_int_t)s->embedding_params, "flops_per_token", s->flops_per_token,
        "graph", "nodes", s->n_nodes, "backward_ops", s->n_backward, "collectives",
        s->n_collectives, "param_inputs", s->inputs.n_params, "buffer_inputs", s->inputs.n_buffers,
        "data_inputs", s->inputs.n_data, "outputs", job->graph->n_outputs, "ops", ops, "train",
        "steps", (json_int_t)t->steps, "lr", t->lr, "warmup_steps", (json_int_t)t->warmup_steps,
        "decay", decay_name(t->decay), "local_batch", (json_int_t)t->local_batch, "seq",
        (json_int_t)t->seq, "data", t->data_path[0] ? t->data_path : "", "resources", "world_size",
        job->resources.world_size, "device", hp_device_name(job->resources.device));
    if (!root) return hpctl_fail(HPCTL_ERROR, "inspect", "out of memory building JSON");
    json_object_set_new(
        root, "plan",
        json_pack("{s:b, s:s, s:s, s:{s:s, s:i}}", "loss_parallel", (int)job->plan.loss_parallel,
                  "param_dtype", hp_dtype_name(job->plan.param_dtype), "reduce_dtype",
                  hp_dtype_name(job->plan.reduce_dtype), "activation_checkpoint", "mode",
                  hp_ac_mode_name(job->plan.ac_mode), "every", job->plan.ac_every));
    json_t *train = json_object_get(root, "train");
    json_object_set_new(
        train, "global_batch",
        json_integer((json_int_t)(t->local_batch * hp_job_dp_size(job) * hp_job_grad_accum(job))));
    json_object_set_new(train, "eval_interval", json_integer((json_int_t)t->eval_interval));
    json_object_set_new(train, "eval_steps", json_integer((json_int_t)t->eval_steps));
    json_object_set_new(train, "eval_data", json_string(t->eval_data_path));
    json_object_set_new(train, "grad_accum_steps",
                        json_integer((json_int_t)hp_job_grad_accum(job)));
    json_object_set_new(train, "on_nonfinite",
                        json_string(t->on_nonfinite == HP_NONFINITE_SKIP ? "skip" : "stop"));
    json_dumpf(root, stdout, JSON_INDENT(2));
    putchar('\n');
    json_decref(root);
    return HPCTL_OK;
}

int hpctl_inspect(int argc, char **argv) {
    const char *verb = "inspect", *path = NULL;
    bool hpir = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hpir"))
            hpir = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: hpctl inspect JOB.pb [--hpir | --json]");
            return HPCTL_OK;
        } else if (argv[i][0] == '-')
            return hpctl_fail(HPCTL_USAGE, verb, "unknown flag '%s'", argv[i]);
        else if (path)
            return hpctl_fail(HPCTL_USAGE, verb, "one job file at a time ('%s' and '%s')", path,
                              argv[i]);
        else
            path = argv[i];
    }
    if (!path) return hpctl_fail(HPCTL_USAGE, verb, "which job file? (hpctl inspect JOB.pb)");
    if (hpir && json) return hpctl_fail(HPCTL_USAGE, verb, "--hpir and --json exclude each other");
    hp_job *job = NULL;
    hp_err err = {0};
    if (hp_job_read_file(path, &job, &err) != HP_OK)
        return hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    int rc = HPCTL_OK;
    if (!job->graph) {
        rc = hpctl_fail(HPCTL_ERROR, verb, "%s: the job has no graph", path);
    } else if (hpir) {
        if (hp_graph_fprint(job->graph, stdout, &err) != HP_OK)
            rc = hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    } else {
        job_summary s;
        summarize(job, &s);
        if (json)
            rc = print_json(job, &s);
        else
            print_text(job, &s);
    }
    hp_job_free(job);
    return rc;
}
