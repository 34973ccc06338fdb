/* graph/job.c — the job as C data: defaults, lifetime, the plan's list helpers, placement
 * words, validation and equality. The wire form (hp.v1.Job, bytes, files) is job_proto.c.
 *
 * Validation is the single place a job's ranges are written down; decoding calls it, and so
 * do hpctl and the coordinator before acting on a job. Each message names the field.
 */
#include "hp/job.h"

#include "graph/proto_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- defaults and lifetime ---------------------------------------------------------------------
 */

void hp_job_init_defaults(hp_job *job) {
    memset(job, 0, sizeof *job);
    snprintf(job->name, sizeof job->name, "job");

    hp_plan *p = &job->plan;
    p->n_mesh = 1;
    snprintf(p->mesh[0].name, sizeof p->mesh[0].name, "dp");
    p->mesh[0].size = 1;
    p->mesh[0].link = HP_LINK_INTRA_NODE;
    p->mode = HP_PLAN_FSDP;
    p->reshard_after_forward = true;
    p->param_dtype = HP_F32;
    p->reduce_dtype = HP_F32;
    p->mem_low = 0.0;
    p->mem_high = 1.0;
    p->ac_mode = HP_AC_NONE;
    p->ac_every = 1;

    hp_pass_config *c = &job->passes;
    c->enable_overlap = true;
    c->bucket_bytes = (int64_t)25 << 20; /* as DDP's default bucket */
    c->prefetch_depth = 1;

    /* torchtitan's debug_model.toml */
    hp_train_config *t = &job->train;
    t->steps = 10;
    t->lr = 8e-4;
    t->min_lr_ratio = 0.0;
    t->warmup_steps = 2;
    t->decay = HP_DECAY_LINEAR;
    t->weight_decay = 0.1;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->grad_clip = 1.0;
    t->seed = 0;
    t->log_interval = 1;
    t->checkpoint_interval = 0;
    t->global_batch = 0;
    t->local_batch = 8;
    t->seq = 2048;
    t->on_nonfinite = HP_NONFINITE_STOP;
    t->eval_interval = 0;
    t->eval_steps = 0;
    t->eval_data_path[0] = 0;

    hp_resources *r = &job->resources;
    r->world_size = 1;
    r->device = HP_DEVICE_CPU;
    r->gpus_per_node = 0;
    r->max_restarts = 0;
}

static void free_strs(char **v, int n) {
    for (int i = 0; i < n; i++) hp_free(v[i]);
    hp_free(v);
}

void hp_job_fini(hp_job *job) {
    if (!job) return;
    hp_graph_free(job->graph);
    free_strs(job->plan.fsdp_fqns, job->plan.n_fsdp_fqns);
    free_strs(job->plan.fsdp_patterns, job->plan.n_fsdp_patterns);
    for (int i = 0; i < job->plan.n_constraints; i++) hp_free(job->plan.constraints[i].input_fqn);
    hp_free(job->plan.constraints);
    hp_job_init_defaults(job);
}

hp_job *hp_job_new(void) {
    hp_job *job = hp_malloc(sizeof *job);
    if (job) hp_job_init_defaults(job);
    return job;
}

void hp_job_free(hp_job *job) {
    if (!job) return;
    hp_job_fini(job);
    hp_free(job);
}

/* ---- list helpers ------------------------------------------------------------------------------
 */

/* Grows *v (of *n elements of `size`) by one zeroed element; NULL on out of memory. */
static void *grow(void **v, int *n, size_t size) {
    void *nv = hp_realloc(*v, (size_t)(*n + 1) * size);
    if (!nv) return NULL;
    *v = nv;
    void *e = (char *)nv + (size_t)*n * size;
    memset(e, 0, size);
    (*n)++;
    return e;
}

static hp_status add_str(char ***v, int *n, const char *s, const char *what, hp_err *err) {
    if (*n >= HP_PLAN_MAX_ITEMS)
        return hp_errf(err, HP_LIMIT, "%s: over the limit of %d entries", what, HP_PLAN_MAX_ITEMS);
    HP_TRY(hp__check_str(s, HP_MAX_STR, what, err));
    char *copy = hp_strdup(s ? s : "");
    if (!copy) return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
    char **slot = grow((void **)v, n, sizeof *slot);
    if (!slot) {
        hp_free(copy);
        return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
    }
    *slot = copy;
    return HP_OK;
}

hp_status hp_job_add_fsdp_fqn(hp_job *job, const char *fqn, hp_err *err) {
    return add_str(&job->plan.fsdp_fqns, &job->plan.n_fsdp_fqns, fqn, "plan.fsdp_fqns", err);
}

hp_status hp_job_add_fsdp_pattern(hp_job *job, const char *pattern, hp_err *err) {
    return add_str(&job->plan.fsdp_patterns, &job->plan.n_fsdp_patterns, pattern,
                   "plan.fsdp_patterns", err);
}

hp_status hp_job_add_constraint(hp_job *job, const char *input_fqn, int output,
                                const hp_placement *placements, int n, hp_err *err) {
    hp_plan *p = &job->plan;
    if (p->n_constraints >= HP_PLAN_MAX_ITEMS)
        return hp_errf(err, HP_LIMIT, "plan.constraints: over the limit of %d entries",
                       HP_PLAN_MAX_ITEMS);
    if (n < 0 || n > HP_MESH_MAX_DIMS)
        return hp_errf(err, HP_INVALID, "plan.constraints: %d placements, must be 0 to %d", n,
                       HP_MESH_MAX_DIMS);
    char *fqn = NULL;
    if (input_fqn) {
        HP_TRY(hp__check_str(input_fqn, HP_MAX_STR, "plan.constraints.input_fqn", err));
        if (!(fqn = hp_strdup(input_fqn)))
            return hp_errf(err, HP_NOMEM, "plan.constraints: out of memory");
    }
    hp_place_constraint *c = grow((void **)&p->constraints, &p->n_constraints, sizeof *c);
    if (!c) {
        hp_free(fqn);
        return hp_errf(err, HP_NOMEM, "plan.constraints: out of memory");
    }
    c->input_fqn = fqn;
    c->output = output;
    c->n_placements = n;
    if (n) memcpy(c->placements, placements, (size_t)n * sizeof *placements);
    return HP_OK;
}

hp_status hp_job_add_place_pattern(hp_job *job, const char *pattern, const hp_placement *placements,
                                   int n, hp_err *err) {
    if (!pattern) return hp_errf(err, HP_INVALID, "plan.constraints: no pattern");
    HP_TRY(hp_job_add_constraint(job, pattern, -1, placements, n, err));
    job->plan.constraints[job->plan.n_constraints - 1].pattern = true;
    return HP_OK;
}

bool hp_plan_uses_placements(const hp_job *job, int world) {
    const hp_plan *p = &job->plan;
    int split = 0;
    for (int d = 0; d < p->n_mesh && d < HP_MESH_MAX_DIMS; d++) split += p->mesh[d].size > 1;
    return world > 1 && (split > 1 || p->n_constraints > 0 || p->mode == HP_PLAN_AUTO);
}

/* The parallelism a conventional mesh dim name promises that no pass implements, else NULL. */
static const char *unsupported_dim(const char *name) {
    static const char *const dims[][2] = {
        {"pp", "pipeline"}, {"cp", "context"}, {"ep", "expert"}, {"sp", "sequence"}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (!strcmp(name, dims[i][0])) return dims[i][1];
    return NULL;
}

/* A micro-step's sequences, all ranks together: the graph's batch (its first data input's dim
 * 0, whatever world it is run on), else the model's, else local_batch x the dp ranks. */
static int64_t micro_batch(const hp_job *job) {
    if (job->graph) {
        hp_graph_inputs in = hp_graph_count_inputs(job->graph);
        if (in.n_data > 0) {
            const hp_type *t = &job->graph->nodes[in.n_params + in.n_buffers].out[0];
            if (t->rank >= 1 && t->shape[0] > 0) return t->shape[0];
        }
    }
    if (job->model.batch > 0) return job->model.batch;
    return job->train.local_batch * hp_job_dp_size(job);
}

int64_t hp_job_grad_accum(const hp_job *job) {
    int64_t micro = micro_batch(job), global = job->train.global_batch;
    return global > 0 && micro > 0 && global / micro >= 1 ? global / micro : 1;
}

int hp_job_dp_size(const hp_job *job) {
    int world = job->resources.world_size > 0 ? job->resources.world_size : 1;
    if (job->plan.n_mesh > 1) {
        world = 1;
        for (int d = 0; d < job->plan.n_mesh && d < HP_MESH_MAX_DIMS; d++)
            world *= job->plan.mesh[d].size > 0 ? job->plan.mesh[d].size : 1;
    }
    if (!hp_plan_uses_placements(job, world)) return world;
    for (int d = 0; d < job->plan.n_mesh && d < HP_MESH_MAX_DIMS; d++)
        if (!strcmp(job->plan.mesh[d].name, "dp")) return job->plan.mesh[d].size;
    return 1;
}

hp_status hp_job_check_trainable(const hp_job *job, hp_err *err) {
    const hp_graph *g = job->graph;
    if (!g) return hp_errf(err, HP_INVALID, "graph: missing");
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    const hp_type *tokens = NULL, *labels = NULL;
    char q[HP__QUOTE_MAX];
    for (int i = gi.n_params + gi.n_buffers; i < gi.n_params + gi.n_buffers + gi.n_data; i++) {
        const hp_attr *f = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        const char *name = f && f->s ? f->s : "";
        if (!strcmp(name, "tokens"))
            tokens = &g->nodes[i].out[0];
        else if (!strcmp(name, "labels"))
            labels = &g->nodes[i].out[0];
        else
            return hp_errf(err, HP_UNSUPPORTED,
                           "data input '%s': training reads token data into inputs named "
                           "'tokens' and 'labels' only",
                           hp__quote(name, q));
    }
    if (!tokens || !labels)
        return hp_errf(err, HP_UNSUPPORTED, "the graph needs data inputs 'tokens' and 'labels'");
    if (tokens->dtype != HP_I64 || tokens->rank != 2 || !hp_type_eq(tokens, labels))
        return hp_errf(err, HP_UNSUPPORTED, "'tokens' and 'labels' must both be i64 [B, T]");
    return HP_OK;
}

int hp_plan_constraint_for(const hp_plan *plan, const char *fqn) {
    int hit = -1;
    for (int k = 0; fqn && k < plan->n_constraints; k++) {
        const hp_place_constraint *c = &plan->constraints[k];
        if (c->input_fqn &&
            (c->pattern ? hp_fqn_match(c->input_fqn, fqn) : !strcmp(c->input_fqn, fqn)))
            hit = k;
    }
    return hit;
}

/* ---- FQN patterns ---------------------------------------------------------------------------- */

/* The classic wildcard walk: on a mismatch, retry from just after the last '*' with one more
 * character swallowed. O(len(pattern) * len(fqn)) at worst, unlike a backtracking fnmatch, whose
 * time a pattern such as "*a*a*a*a*b" can make exponential (patterns come from job files). */
static const char *const ac_names[] = {"none", "full", "selective", "auto"};

const char *hp_ac_mode_name(hp_ac_mode m) {
    return (unsigned)m < HP_ARRAY_LEN(ac_names) ? ac_names[m] : NULL;
}

hp_status hp_ac_mode_parse(const char *s, hp_ac_mode *m, hp_err *err) {
    for (size_t i = 0; i < HP_ARRAY_LEN(ac_names); i++) {
        if (s && !strcmp(s, ac_names[i])) {
            *m = (hp_ac_mode)i;
            return HP_OK;
        }
    }
    char q[HP__QUOTE_MAX];
    return hp_errf(err, HP_INVALID,
                   "activation checkpointing mode '%s' is not one of none, full, selective, auto",
                   hp__quote(s ? s : "", q));
}

bool hp_fqn_match(const char *pattern, const char *fqn) {
    const char *star = NULL, *resume = NULL;
    while (*fqn) {
        if (*pattern == '*') {
            star = pattern++;
            resume = fqn;
        } else if (*pattern == '?' || *pattern == *fqn) {
            pattern++;
            fqn++;
        } else if (star) {
            pattern = star + 1;
            fqn = ++resume;
        } else {
            return false;
        }
    }
    while (*pattern == '*') pattern++;
    return !*pattern;
}

/* ---- validation --------------------------------------------------------------------------------
 */

/* A fixed-size string field must hold its NUL; `ident` restricts it to [A-Za-z0-9_.-]
 * (names that print without quoting), `nonempty` forbids "". */
static hp_status check_field_str(const char *s, size_t cap, bool ident, bool nonempty,
                                 const char *what, hp_err *err) {
    char q[HP__QUOTE_MAX];
    if (!memchr(s, 0, cap))
        return hp_errf(err, HP_INVALID, "%s: not terminated within %zu bytes", what, cap);
    if (nonempty && !s[0]) return hp_errf(err, HP_INVALID, "%s: must not be empty", what);
    for (const char *c = s; *c; c++) {
        unsigned char u = (unsigned char)*c;
        bool good = ident ? ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
                             (u >= '0' && u <= '9') || u == '_' || u == '.' || u == '-')
                          : (u >= 0x20 && u < 0x7f);
        if (!good)
            return hp_errf(err, HP_INVALID, "%s: '%s' has a bad character (byte 0x%02x)", what,
                           hp__quote(s, q), u);
    }
    return HP_OK;
}

static hp_status check_i64(int64_t v, int64_t lo, int64_t hi, const char *what, hp_err *err) {
    if (v < lo || v > hi)
        return hp_errf(err, HP_INVALID, "%s: %lld must be in [%lld, %lld]", what, (long long)v,
                       (long long)lo, (long long)hi);
    return HP_OK;
}

/* lo/hi inclusive unless the matching open flag is set. */
static hp_status check_f64(double v, double lo, bool lo_open, double hi, bool hi_open,
                           const char *what, hp_err *err) {
    if (!isfinite(v) || v < lo || (lo_open && v == lo) || v > hi || (hi_open && v == hi))
        return hp_errf(err, HP_INVALID, "%s: %g must be finite and in %c%g, %g%c", what, v,
                       lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    return HP_OK;
}

typedef struct named_param {
    const char *fqn;
    int32_t id;
} named_param;

static int named_cmp(const void *a, const void *b) {
    return strcmp(((const named_param *)a)->fqn, ((const named_param *)b)->fqn);
}

hp_status hp_plan_mark_names(const hp_graph *g, char *const *names, int n, bool *marked,
                             hp_err *err) {
    int np = hp_graph_count_inputs(g).n_params;
    named_param *by = hp_malloc((size_t)(np ? np : 1) * sizeof *by);
    if (!by) return hp_errf(err, HP_NOMEM, "out of memory resolving FSDP marks");
    for (int i = 0; i < np; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        by[i] = (named_param){a && a->s ? a->s : "", i};
    }
    qsort(by, (size_t)np, sizeof *by, named_cmp);
    hp_status st = HP_OK;
    for (int k = 0; k < n && st == HP_OK; k++) {
        const char *name = names[k] ? names[k] : "";
        size_t len = strlen(name);
        /* every FQN starting with name sorts in one run from the first one >= name */
        int lo = 0, hi = np;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (strcmp(by[mid].fqn, name) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        bool hit = false;
        for (int i = lo; i < np && !strncmp(by[i].fqn, name, len); i++) {
            char next = by[i].fqn[len];
            if (len && (next == 0 || next == '.')) hit = marked[by[i].id] = true;
        }
        if (!hit) {
            char q[HP__QUOTE_MAX];
            st = hp_errf(err, HP_INVALID,
                         "plan.fsdp_fqns[%d]: '%s' names no parameter or module of the graph", k,
                         hp__quote(name, q));
        }
    }
    hp_free(by);
    return st;
}

static hp_status validate_model(const hp_job *job, hp_err *err) {
    const hp_model_spec *m = &job->model;
    char what[64], text[2 * HP_MODEL_NAME_MAX + 2];
    HP_TRY(check_field_str(m->family, sizeof m->family, true, false, "model.family", err));
    HP_TRY(check_field_str(m->flavor, sizeof m->flavor, true, false, "model.flavor", err));
    const struct {
        const char *name;
        int64_t v;
    } ints[] = {
        {"batch", m->batch},           {"seq", m->seq},         {"dim", m->dim},
        {"n_layers", m->n_layers},     {"n_heads", m->n_heads}, {"n_kv_heads", m->n_kv_heads},
        {"ffn_hidden", m->ffn_hidden}, {"vocab", m->vocab}};
    for (size_t i = 0; i < HP_ARRAY_LEN(ints); i++) {
        snprintf(what, sizeof what, "model.%s", ints[i].name);
        HP_TRY(check_i64(ints[i].v, 0, HP_MAX_DIM, what, err));
    }
    HP_TRY(check_f64(m->norm_eps, 0, false, 1, false, "model.norm_eps", err));
    HP_TRY(check_f64(m->rope_theta, 0, false, 1e12, false, "model.rope_theta", err));
    if (!m->family[0]) {
        if (m->flavor[0]) return hp_errf(err, HP_INVALID, "model.flavor: set without a family");
        if (!job->graph)
            return hp_errf(err, HP_INVALID, "graph: none, and no model.family to build one from");
        return HP_OK;
    }
    snprintf(text, sizeof text, "%s%s%s", m->family, m->flavor[0] ? ":" : "", m->flavor);
    hp_model_spec parsed;
    hp_status s = hp_model_spec_parse(text, &parsed, err);
    if (s != HP_OK) hp_err_prefix(err, "model");
    return s;
}

static hp_status validate_placements(const hp_place_constraint *c, int n_mesh, const hp_type *t,
                                     const char *what, hp_err *err) {
    char buf[32];
    if (c->n_placements != n_mesh)
        return hp_errf(err, HP_INVALID, "%s: %d placements, the mesh has %d dims", what,
                       c->n_placements, n_mesh);
    for (int d = 0; d < c->n_placements; d++) {
        const hp_placement *p = &c->placements[d];
        switch (p->kind) {
        case HP_PLACE_REPLICATE:
            break;
        case HP_PLACE_SHARD:
            if (p->dim < 0 || p->dim >= (t ? t->rank : HP_MAX_RANK))
                return hp_errf(err, HP_INVALID, "%s: placement %d: Shard(%d) outside rank %d", what,
                               d, p->dim, t ? t->rank : HP_MAX_RANK);
            break;
        case HP_PLACE_PARTIAL:
            if (p->reduce != HP_REDUCE_SUM && p->reduce != HP_REDUCE_AVG)
                return hp_errf(err, HP_INVALID, "%s: placement %d: Partial takes sum or avg", what,
                               d);
            break;
        default:
            return hp_errf(err, HP_INVALID, "%s: placement %d: %s is not a placement", what, d,
                           hp_placement_str(p, buf, sizeof buf));
        }
    }
    return HP_OK;
}

static hp_status validate_plan(const hp_job *job, hp_err *err) {
    const hp_plan *p = &job->plan;
    const hp_graph *g = job->graph;
    char what[96], q[HP__QUOTE_MAX];
    if (p->n_mesh < 1 || p->n_mesh > HP_MESH_MAX_DIMS)
        return hp_errf(err, HP_INVALID, "plan.mesh: %d dims, must be 1 to %d", p->n_mesh,
                       HP_MESH_MAX_DIMS);
    int64_t product = 1;
    for (int d = 0; d < p->n_mesh; d++) {
        const hp_mesh_dim *m = &p->mesh[d];
        snprintf(what, sizeof what, "plan.mesh[%d].name", d);
        HP_TRY(check_field_str(m->name, sizeof m->name, true, true, what, err));
        for (int e = 0; e < d; e++)
            if (!strcmp(p->mesh[e].name, m->name))
                return hp_errf(err, HP_INVALID, "%s: '%s' repeats plan.mesh[%d]", what, m->name, e);
        snprintf(what, sizeof what, "plan.mesh[%d].size", d);
        HP_TRY(check_i64(m->size, 1, HP_MAX_WORLD, what, err));
        product *= m->size; /* <= 65536^4: no overflow */
        const char *kind = unsupported_dim(m->name);
        if (kind && m->size > 1)
            return hp_errf(err, HP_UNSUPPORTED,
                           "plan.mesh[%d]: '%s' names %s parallelism, which hp does not support "
                           "yet: a mesh splits work over dp (data parallel, FSDP) and tp (tensor "
                           "parallel) dims",
                           d, m->name, kind);
        snprintf(what, sizeof what, "plan.mesh[%d].link.bandwidth", d);
        HP_TRY(check_f64(m->link.bandwidth, 0, true, 1e18, false, what, err));
        snprintf(what, sizeof what, "plan.mesh[%d].link.latency", d);
        HP_TRY(check_f64(m->link.latency, 0, false, 1e3, false, what, err));
    }
    if (product != job->resources.world_size)
        return hp_errf(err, HP_INVALID,
                       "plan.mesh: the dims' sizes multiply to %lld, resources.world_size is %d",
                       (long long)product, job->resources.world_size);
    if (p->loss_parallel) {
        bool tp = false;
        for (int d = 0; d < p->n_mesh; d++) tp |= !strcmp(p->mesh[d].name, "tp");
        if (!tp)
            return hp_errf(err, HP_INVALID,
                           "plan.loss_parallel: the mesh has no 'tp' dim to split the "
                           "vocabulary over");
    }
    if (p->mode != HP_PLAN_FSDP && p->mode != HP_PLAN_AUTO)
        return hp_errf(err, HP_INVALID, "plan.mode: %d is not fsdp or auto", (int)p->mode);
    HP_TRY(hp_plan_check_precision(p->param_dtype, p->reduce_dtype, err));
    if (memchr(p->device_profile, 0, sizeof p->device_profile) == NULL)
        return hp_errf(err, HP_INVALID, "plan.device_profile: not terminated");
    if (p->device_profile[0] && !hp_device_profile_known(p->device_profile))
        return hp_errf(err, HP_INVALID,
                       "plan.device_profile: '%s' is not a known profile (" HP_DEVICE_PROFILES ")",
                       p->device_profile);
    if (p->gpus_per_node < 0 || p->gpus_per_node > HP_MAX_WORLD)
        return hp_errf(err, HP_INVALID, "plan.gpus_per_node: %d is not in [0, %d]",
                       p->gpus_per_node, HP_MAX_WORLD);
    if (!hp_ac_mode_name(p->ac_mode))
        return hp_errf(err, HP_INVALID,
                       "plan.activation_checkpoint.mode: %d is not none, full, selective or auto",
                       (int)p->ac_mode);
    if (p->ac_every < 1 || p->ac_every > HP_MAX_AC_EVERY)
        return hp_errf(err, HP_INVALID, "plan.activation_checkpoint.every: %d is not in [1, %d]",
                       p->ac_every, HP_MAX_AC_EVERY);
    if (p->ac_every != 1 && p->ac_mode == HP_AC_AUTO)
        return hp_errf(err, HP_INVALID,
                       "plan.activation_checkpoint.every: %d with mode auto, which chooses the "
                       "frequency itself",
                       p->ac_every);
    if (p->ac_every != 1 && p->ac_mode == HP_AC_NONE)
        return hp_errf(err, HP_INVALID,
                       "plan.activation_checkpoint.every: %d with mode none checkpoints nothing "
                       "(set mode full or selective)",
                       p->ac_every);

    if (p->n_fsdp_fqns < 0 || p->n_fsdp_fqns > HP_PLAN_MAX_ITEMS)
        return hp_errf(err, HP_LIMIT, "plan.fsdp_fqns: %d entries, limit %d", p->n_fsdp_fqns,
                       HP_PLAN_MAX_ITEMS);
    for (int i = 0; i < p->n_fsdp_fqns; i++) {
        snprintf(what, sizeof what, "plan.fsdp_fqns[%d]", i);
        const char *s = p->fsdp_fqns[i];
        HP_TRY(hp__check_str(s, HP_MAX_STR, what, err));
        if (!s || !s[0]) return hp_errf(err, HP_INVALID, "%s: empty", what);
    }
    if (g && p->n_fsdp_fqns > 0) {
        bool *marked = hp_calloc((size_t)hp_graph_count_inputs(g).n_params + 1, sizeof *marked);
        if (!marked) return hp_errf(err, HP_NOMEM, "out of memory checking plan.fsdp_fqns");
        hp_status st = hp_plan_mark_names(g, p->fsdp_fqns, p->n_fsdp_fqns, marked, err);
        hp_free(marked);
        HP_TRY(st);
    }
    if (p->n_fsdp_patterns < 0 || p->n_fsdp_patterns > HP_PLAN_MAX_ITEMS)
        return hp_errf(err, HP_LIMIT, "plan.fsdp_patterns: %d entries, limit %d",
                       p->n_fsdp_patterns, HP_PLAN_MAX_ITEMS);
    /* A pattern matching no parameter is not an error: the FSDP pass warns naming it
     * (docs/fsdp.md), as FSDP2 users expect of a glob. */
    for (int i = 0; i < p->n_fsdp_patterns; i++) {
        snprintf(what, sizeof what, "plan.fsdp_patterns[%d]", i);
        const char *s = p->fsdp_patterns[i];
        HP_TRY(hp__check_str(s, HP_MAX_STR, what, err));
        if (!s || !s[0]) return hp_errf(err, HP_INVALID, "%s: empty", what);
    }

    if (!(p->mem_low >= 0 && p->mem_low <= p->mem_high && p->mem_high <= 1))
        return hp_errf(err, HP_INVALID,
                       "plan.param_memory_budget: (%g, %g) must satisfy 0 <= low <= high <= 1",
                       p->mem_low, p->mem_high);

    if (p->n_constraints < 0 || p->n_constraints > HP_PLAN_MAX_ITEMS)
        return hp_errf(err, HP_LIMIT, "plan.constraints: %d entries, limit %d", p->n_constraints,
                       HP_PLAN_MAX_ITEMS);
    for (int i = 0; i < p->n_constraints; i++) {
        const hp_place_constraint *c = &p->constraints[i];
        const hp_type *t = NULL;
        snprintf(what, sizeof what, "plan.constraints[%d]", i);
        if (c->input_fqn && c->pattern) {
            HP_TRY(hp__check_str(c->input_fqn, HP_MAX_STR, what, err));
            if (!c->input_fqn[0]) return hp_errf(err, HP_INVALID, "%s: empty pattern", what);
            hp_graph_inputs gi = g ? hp_graph_count_inputs(g) : (hp_graph_inputs){0, 0, 0};
            int hits = 0;
            for (int k = 0; g && k < gi.n_params + gi.n_buffers + gi.n_data; k++) {
                const hp_attr *f = hp_node_attr(&g->nodes[k], HP_ATTR_FQN);
                if (!f || !f->s || !hp_fqn_match(c->input_fqn, f->s)) continue;
                hits++;
                HP_TRY(validate_placements(c, p->n_mesh, &g->nodes[k].out[0], what, err));
            }
            if (g && !hits)
                return hp_errf(err, HP_INVALID, "%s: pattern '%s' matches no graph input", what,
                               hp__quote(c->input_fqn, q));
            if (!g) HP_TRY(validate_placements(c, p->n_mesh, NULL, what, err));
            continue;
        }
        if (c->input_fqn) {
            HP_TRY(hp__check_str(c->input_fqn, HP_MAX_STR, what, err));
            int id = g ? hp_graph_find_fqn(g, c->input_fqn) : 0;
            if (id < 0)
                return hp_errf(err, HP_INVALID, "%s: no graph input '%s'", what,
                               hp__quote(c->input_fqn, q));
            if (g) t = &g->nodes[id].out[0];
        } else {
            if (c->output < 0 || (g && c->output >= g->n_outputs))
                return hp_errf(err, HP_INVALID, "%s: output %d outside [0, %d)", what, c->output,
                               g ? g->n_outputs : HP_MAX_NODES);
            if (g) t = hp_graph_type(g, g->outputs[c->output]);
        }
        HP_TRY(validate_placements(c, p->n_mesh, t, what, err));
    }
    return HP_OK;
}

static hp_status check_pass_name(const char *s, const char *what, hp_err *err) {
    HP_TRY(check_field_str(s, HP_PASS_NAME_MAX, true, true, what, err));
    return HP_OK;
}

static const char *const pass_names[] = {
#define X(name) #name,
#include "hp/pass_names.def"
#undef X
};

/* A switch naming no pass would be ignored: refuse it, listing the passes there are. */
static hp_status check_switch_known(const char *s, const char *what, hp_err *err) {
    for (size_t i = 0; i < HP_ARRAY_LEN(pass_names); i++)
        if (!strcmp(s, pass_names[i])) return HP_OK;
    char known[256] = "", q[HP__QUOTE_MAX];
    size_t o = 0;
    for (size_t i = 0; i < HP_ARRAY_LEN(pass_names); i++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", pass_names[i]);
    return hp_errf(err, HP_INVALID, "%s: '%s' names no pass (the passes: %s)", what,
                   hp__quote(s, q), known);
}

static hp_status validate_passes(const hp_pass_config *c, hp_err *err) {
    char what[64];
    HP_TRY(check_i64(c->bucket_bytes, 0, (int64_t)1 << 40, "passes.bucket_bytes", err));
    HP_TRY(check_i64(c->prefetch_depth, 0, 64, "passes.prefetch_depth", err));
    HP_TRY(check_i64(c->n_dump, 0, HP_PASS_MAX, "passes.dump (count)", err));
    for (int i = 0; i < c->n_dump; i++) {
        snprintf(what, sizeof what, "passes.dump[%d]", i);
        HP_TRY(check_pass_name(c->dump[i], what, err));
    }
    HP_TRY(check_i64(c->n_switches, 0, HP_PASS_MAX, "passes.passes (count)", err));
    for (int i = 0; i < c->n_switches; i++) {
        snprintf(what, sizeof what, "passes.passes[%d].name", i);
        HP_TRY(check_pass_name(c->switches[i].name, what, err));
        HP_TRY(check_switch_known(c->switches[i].name, what, err));
        for (int j = 0; j < i; j++)
            if (!strcmp(c->switches[j].name, c->switches[i].name))
                return hp_errf(err, HP_INVALID, "%s: '%s' repeats passes.passes[%d]", what,
                               c->switches[i].name, j);
    }
    return HP_OK;
}

/* The language-model data inputs a worker feeds ('tokens' and 'labels', [B, T] with B the
 * global batch) must agree with train: whatever model.batch/seq say (hpctl new writes 0 for
 * both), the graph is what runs. Only an unplaced graph: a placed one holds local pieces. */
static hp_status check_data_inputs(const hp_job *job, int64_t global, hp_err *err) {
    const hp_graph *g = job->graph;
    if (!g || g->mesh.ndim > 0) return HP_OK;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (n->op != HP_OP_PLACEHOLDER || hp_node_int(n, HP_ATTR_KIND, -1) != HP_INPUT_DATA)
            continue;
        const hp_attr *a = hp_node_attr(n, HP_ATTR_FQN);
        if (!a || (strcmp(a->s, "tokens") && strcmp(a->s, "labels")) || n->out[0].rank != 2)
            continue;
        const int64_t *sh = n->out[0].shape;
        if (sh[1] != job->train.seq)
            return hp_errf(err, HP_INVALID,
                           "train.seq: %lld, but the graph's data input '%s' is [%lld, %lld] "
                           "(seq %lld)",
                           (long long)job->train.seq, a->s, (long long)sh[0], (long long)sh[1],
                           (long long)sh[1]);
        if (sh[0] != global)
            return hp_errf(err, HP_INVALID,
                           "train.local_batch: %lld x %lld data-parallel ranks = %lld, but the "
                           "graph's data input '%s' is [%lld, %lld] (global batch %lld)",
                           (long long)job->train.local_batch, (long long)hp_job_dp_size(job),
                           (long long)global, a->s, (long long)sh[0], (long long)sh[1],
                           (long long)sh[0]);
    }
    return HP_OK;
}

static hp_status validate_train(const hp_job *job, hp_err *err) {
    const hp_train_config *t = &job->train;
    HP_TRY(check_i64(t->steps, 1, (int64_t)1 << 40, "train.steps", err));
    HP_TRY(check_f64(t->lr, 0, true, 1e3, false, "train.lr", err));
    HP_TRY(check_f64(t->min_lr_ratio, 0, false, 1, false, "train.min_lr_ratio", err));
    HP_TRY(check_i64(t->warmup_steps, 0, t->steps, "train.warmup_steps", err));
    if (t->decay != HP_DECAY_LINEAR && t->decay != HP_DECAY_COSINE && t->decay != HP_DECAY_NONE)
        return hp_errf(err, HP_INVALID, "train.decay: %d is not linear, cosine or none",
                       (int)t->decay);
    if (t->on_nonfinite != HP_NONFINITE_STOP && t->on_nonfinite != HP_NONFINITE_SKIP)
        return hp_errf(err, HP_INVALID, "train.on_nonfinite: %d is not stop or skip",
                       (int)t->on_nonfinite);
    HP_TRY(check_f64(t->weight_decay, 0, false, 1e3, false, "train.weight_decay", err));
    HP_TRY(check_f64(t->beta1, 0, false, 1, true, "train.beta1", err));
    HP_TRY(check_f64(t->beta2, 0, false, 1, true, "train.beta2", err));
    HP_TRY(check_f64(t->eps, 0, true, 1, false, "train.eps", err));
    HP_TRY(check_f64(t->grad_clip, 0, false, 1e12, false, "train.grad_clip", err));
    HP_TRY(check_i64(t->log_interval, 0, INT64_MAX, "train.log_interval", err));
    HP_TRY(check_i64(t->checkpoint_interval, 0, INT64_MAX, "train.checkpoint_interval", err));
    HP_TRY(
        check_field_str(t->data_path, sizeof t->data_path, false, false, "train.data_path", err));
    HP_TRY(
        check_field_str(t->init_from, sizeof t->init_from, false, false, "train.init_from", err));
    HP_TRY(check_i64(t->eval_interval, 0, INT64_MAX, "train.eval_interval", err));
    HP_TRY(check_field_str(t->eval_data_path, sizeof t->eval_data_path, false, false,
                           "train.eval_data_path", err));
    if (t->eval_interval > 0) {
        HP_TRY(check_i64(t->eval_steps, 1, HP_MAX_EVAL_STEPS, "train.eval_steps", err));
        if (!t->eval_data_path[0])
            return hp_errf(err, HP_INVALID,
                           "train.eval_data_path: evaluating every %lld steps needs held-out "
                           "data (hpctl new --eval-data PATH)",
                           (long long)t->eval_interval);
    }
    HP_TRY(check_i64(t->local_batch, 1, HP_MAX_DIM, "train.local_batch", err));
    HP_TRY(check_i64(t->seq, 1, HP_MAX_DIM, "train.seq", err));
    HP_TRY(check_i64(t->global_batch, 0, HP_MAX_DIM, "train.global_batch", err));
    /* The graph's batch is one micro-step's batch, all ranks together; each of the
     * data-parallel ranks reads local_batch of it. global_batch is a whole number of those:
     * the gradient-accumulation steps. */
    int64_t world = hp_job_dp_size(job);
    const char *over = job->plan.n_mesh > 1 ? "the mesh's dp size" : "world_size";
    int64_t global = t->local_batch * world;
    if (t->global_batch && t->global_batch % global)
        return hp_errf(err, HP_INVALID,
                       "train.global_batch: %lld is not a multiple of local_batch x %s = %lld "
                       "(the gradient-accumulation steps are global_batch / that)",
                       (long long)t->global_batch, over, (long long)global);
    if (t->global_batch / global > HP_MAX_GRAD_ACCUM)
        return hp_errf(err, HP_INVALID,
                       "train.global_batch: %lld is %lld micro-steps of %lld sequences; at most "
                       "%d are supported",
                       (long long)t->global_batch, (long long)(t->global_batch / global),
                       (long long)global, HP_MAX_GRAD_ACCUM);
    if (job->model.batch && job->model.batch != global)
        return hp_errf(err, HP_INVALID,
                       "model.batch: %lld (the global batch) differs from train.local_batch x "
                       "world_size = %lld",
                       (long long)job->model.batch, (long long)global);
    if (job->model.seq && job->model.seq != t->seq)
        return hp_errf(err, HP_INVALID, "model.seq: %lld differs from train.seq %lld",
                       (long long)job->model.seq, (long long)t->seq);
    return check_data_inputs(job, global, err);
}

static hp_status validate_resources(const hp_resources *r, hp_err *err) {
    HP_TRY(check_i64(r->world_size, 1, HP_MAX_WORLD, "resources.world_size", err));
    if (r->device != HP_DEVICE_CPU && r->device != HP_DEVICE_CUDA)
        return hp_errf(err, HP_INVALID, "resources.device: %d is not cpu or cuda", (int)r->device);
    HP_TRY(check_i64(r->gpus_per_node, r->device == HP_DEVICE_CUDA ? 1 : 0, 1024,
                     "resources.gpus_per_node", err));
    HP_TRY(check_i64(r->max_restarts, 0, 1000, "resources.max_restarts", err));
    return HP_OK;
}

hp_status hp__job_validate(const hp_job *job, bool verify_graph, hp_err *err) {
    HP_TRY(check_field_str(job->name, sizeof job->name, true, true, "name", err));
    HP_TRY(validate_resources(&job->resources, err));
    HP_TRY(validate_model(job, err));
    if (job->graph && verify_graph) HP_TRY(hp_graph_verify(job->graph, err));
    HP_TRY(validate_plan(job, err));
    HP_TRY(validate_passes(&job->passes, err));
    HP_TRY(validate_train(job, err));
    return HP_OK;
}

bool hp_device_profile_known(const char *name) {
    static const char *const names[] = {"cpu", "h100", "h200", "a100", "b200"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return true;
    return false;
}

hp_status hp_plan_check_precision(hp_dtype param, hp_dtype reduce, hp_err *err) {
    if ((unsigned)param >= HP_DTYPE_COUNT || !hp_dtype_is_float(param))
        return hp_errf(err, HP_INVALID,
                       "plan.mixed_precision.param_dtype: %s is not a floating "
                       "dtype (f32 or bf16)",
                       (unsigned)param < HP_DTYPE_COUNT ? hp_dtype_name(param) : "?");
    if ((unsigned)reduce >= HP_DTYPE_COUNT || !hp_dtype_is_float(reduce))
        return hp_errf(err, HP_INVALID,
                       "plan.mixed_precision.reduce_dtype: %s is not a floating "
                       "dtype (f32)",
                       (unsigned)reduce < HP_DTYPE_COUNT ? hp_dtype_name(reduce) : "?");
    if (param == HP_F16)
        return hp_errf(err, HP_UNSUPPORTED,
                       "plan.mixed_precision.param_dtype: f16 is not "
                       "supported (it needs loss scaling); use bf16 or f32");
    if (reduce != HP_F32)
        return hp_errf(err, HP_UNSUPPORTED,
                       "plan.mixed_precision.reduce_dtype: %s is not "
                       "supported; gradients are reduced in f32",
                       hp_dtype_name(reduce));
    return HP_OK;
}

hp_status hp_job_validate(const hp_job *job, hp_err *err) {
    return hp__job_validate(job, true, err);
}

/* ---- equality ----------------------------------------------------------------------------------
 */

static bool strs_eq(char *const *a, int na, char *const *b, int nb) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (strcmp(a[i], b[i])) return false;
    return true;
}

static bool opt_str_eq(const char *a, const char *b) {
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool plan_eq(const hp_plan *a, const hp_plan *b) {
    if (a->n_mesh != b->n_mesh || a->mode != b->mode ||
        a->reshard_after_forward != b->reshard_after_forward || a->mem_low != b->mem_low ||
        a->loss_parallel != b->loss_parallel || a->mem_high != b->mem_high ||
        a->param_dtype != b->param_dtype || a->reduce_dtype != b->reduce_dtype ||
        a->n_constraints != b->n_constraints || a->gpus_per_node != b->gpus_per_node ||
        a->ac_mode != b->ac_mode || a->ac_every != b->ac_every ||
        strcmp(a->device_profile, b->device_profile))
        return false;
    for (int d = 0; d < a->n_mesh; d++) {
        const hp_mesh_dim *x = &a->mesh[d], *y = &b->mesh[d];
        if (strncmp(x->name, y->name, sizeof x->name) || x->size != y->size ||
            x->link.bandwidth != y->link.bandwidth || x->link.latency != y->link.latency)
            return false;
    }
    if (!strs_eq(a->fsdp_fqns, a->n_fsdp_fqns, b->fsdp_fqns, b->n_fsdp_fqns) ||
        !strs_eq(a->fsdp_patterns, a->n_fsdp_patterns, b->fsdp_patterns, b->n_fsdp_patterns))
        return false;
    for (int i = 0; i < a->n_constraints; i++) {
        const hp_place_constraint *x = &a->constraints[i], *y = &b->constraints[i];
        if (!opt_str_eq(x->input_fqn, y->input_fqn) || x->pattern != y->pattern ||
            (!x->input_fqn && x->output != y->output) || x->n_placements != y->n_placements)
            return false;
        for (int d = 0; d < x->n_placements; d++) {
            const hp_placement *p = &x->placements[d], *q = &y->placements[d];
            if (p->kind != q->kind || (p->kind == HP_PLACE_SHARD && p->dim != q->dim) ||
                (p->kind == HP_PLACE_PARTIAL && p->reduce != q->reduce))
                return false;
        }
    }
    return true;
}

static bool passes_eq(const hp_pass_config *a, const hp_pass_config *b) {
    if (a->enable_overlap != b->enable_overlap || a->bucket_bytes != b->bucket_bytes ||
        a->prefetch_depth != b->prefetch_depth || a->n_dump != b->n_dump ||
        a->n_switches != b->n_switches)
        return false;
    for (int i = 0; i < a->n_dump; i++)
        if (strncmp(a->dump[i], b->dump[i], sizeof a->dump[i])) return false;
    for (int i = 0; i < a->n_switches; i++)
        if (strncmp(a->switches[i].name, b->switches[i].name, HP_PASS_NAME_MAX) ||
            a->switches[i].enabled != b->switches[i].enabled)
            return false;
    return true;
}

static bool train_eq(const hp_train_config *a, const hp_train_config *b) {
    return a->steps == b->steps && a->lr == b->lr && a->min_lr_ratio == b->min_lr_ratio &&
           a->warmup_steps == b->warmup_steps && a->decay == b->decay &&
           a->weight_decay == b->weight_decay && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->eps == b->eps && a->grad_clip == b->grad_clip && a->seed == b->seed &&
           a->log_interval == b->log_interval && a->checkpoint_interval == b->checkpoint_interval &&
           !strncmp(a->data_path, b->data_path, sizeof a->data_path) &&
           !strncmp(a->init_from, b->init_from, sizeof a->init_from) &&
           a->eval_interval == b->eval_interval && a->eval_steps == b->eval_steps &&
           !strncmp(a->eval_data_path, b->eval_data_path, sizeof a->eval_data_path) &&
           a->global_batch == b->global_batch && a->local_batch == b->local_batch &&
           a->seq == b->seq && a->on_nonfinite == b->on_nonfinite &&
           a->n_profile_steps == b->n_profile_steps &&
           !memcmp(a->profile_steps, b->profile_steps,
                   (size_t)a->n_profile_steps * sizeof a->profile_steps[0]);
}

static bool model_eq(const hp_model_spec *a, const hp_model_spec *b) {
    return !strncmp(a->family, b->family, sizeof a->family) &&
           !strncmp(a->flavor, b->flavor, sizeof a->flavor) && a->batch == b->batch &&
           a->seq == b->seq && a->dim == b->dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->ffn_hidden == b->ffn_hidden && a->vocab == b->vocab && a->norm_eps == b->norm_eps &&
           a->rope_theta == b->rope_theta;
}

bool hp_job_eq(const hp_job *a, const hp_job *b) {
    if (strncmp(a->name, b->name, sizeof a->name) || !model_eq(&a->model, &b->model) ||
        !plan_eq(&a->plan, &b->plan) || !passes_eq(&a->passes, &b->passes) ||
        !train_eq(&a->train, &b->train))
        return false;
    const hp_resources *x = &a->resources, *y = &b->resources;
    if (x->world_size != y->world_size || x->device != y->device ||
        x->gpus_per_node != y->gpus_per_node || x->max_restarts != y->max_restarts)
        return false;
    if (!a->graph || !b->graph) return !a->graph && !b->graph;
    return hp_graph_eq(a->graph, b->graph);
}
