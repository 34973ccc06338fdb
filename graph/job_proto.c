/* graph/job_proto.c — hp_job <-> hp.v1.Job (proto/hp/v1/job.proto), bytes and files.
 *
 * Export builds the message in an arena, copying each fixed-size string only up to its
 * capacity (a draft job may be written as is). Import copies field by field, bounding every
 * count and string before using it and naming the field in each error, imports the graph
 * (graph/proto_io.c) and finishes with the same validation hp_job_validate runs.
 */
#include "hp/job.h"
#include "hp/proto_io.h"

#include "graph/proto_internal.h"

#include <stdio.h>
#include <string.h>

/* hp_job_unpack's size check is what bounds decoding (hp_proto_alloc_init clamps). */
_Static_assert(HP_JOB_FILE_MAX <= HP_PROTO_MAX_BYTES, "job files must fit a proto message");

/* ---- enum maps (C value <-> wire value; 0 on the wire is "unset") ------------------------------
 */

typedef struct enum_map {
    int c, pb;
} enum_map;

static const enum_map modes[] = {{HP_PLAN_FSDP, HP__V1__PARALLEL_MODE__PARALLEL_MODE_FSDP},
                                 {HP_PLAN_AUTO, HP__V1__PARALLEL_MODE__PARALLEL_MODE_AUTO}};
static const enum_map ac_modes[] = {
    {HP_AC_NONE, HP__V1__ACTIVATION_CHECKPOINT_MODE__ACTIVATION_CHECKPOINT_MODE_NONE},
    {HP_AC_FULL, HP__V1__ACTIVATION_CHECKPOINT_MODE__ACTIVATION_CHECKPOINT_MODE_FULL},
    {HP_AC_SELECTIVE, HP__V1__ACTIVATION_CHECKPOINT_MODE__ACTIVATION_CHECKPOINT_MODE_SELECTIVE},
    {HP_AC_AUTO, HP__V1__ACTIVATION_CHECKPOINT_MODE__ACTIVATION_CHECKPOINT_MODE_AUTO}};
static const enum_map decays[] = {{HP_DECAY_LINEAR, HP__V1__DECAY_KIND__DECAY_KIND_LINEAR},
                                  {HP_DECAY_COSINE, HP__V1__DECAY_KIND__DECAY_KIND_COSINE},
                                  {HP_DECAY_NONE, HP__V1__DECAY_KIND__DECAY_KIND_NONE}};
static const enum_map nonfinites[] = {
    {HP_NONFINITE_STOP, HP__V1__NONFINITE_ACTION__NONFINITE_ACTION_STOP},
    {HP_NONFINITE_SKIP, HP__V1__NONFINITE_ACTION__NONFINITE_ACTION_SKIP}};
static const enum_map devices[] = {{HP_DEVICE_CPU, HP__V1__DEVICE_KIND__DEVICE_KIND_CPU},
                                   {HP_DEVICE_CUDA, HP__V1__DEVICE_KIND__DEVICE_KIND_CUDA}};
static const enum_map places[] = {{HP_PLACE_REPLICATE, HP__V1__PLACEMENT__KIND__REPLICATE},
                                  {HP_PLACE_SHARD, HP__V1__PLACEMENT__KIND__SHARD},
                                  {HP_PLACE_PARTIAL, HP__V1__PLACEMENT__KIND__PARTIAL}};
static const enum_map reduces[] = {{HP_REDUCE_SUM, HP__V1__REDUCE_KIND__REDUCE_KIND_SUM},
                                   {HP_REDUCE_AVG, HP__V1__REDUCE_KIND__REDUCE_KIND_AVG}};

static const enum_map dtypes[] = {
    {HP_F32, HP__V1__DTYPE__DTYPE_F32}, {HP_BF16, HP__V1__DTYPE__DTYPE_BF16},
    {HP_F16, HP__V1__DTYPE__DTYPE_F16}, {HP_I32, HP__V1__DTYPE__DTYPE_I32},
    {HP_I64, HP__V1__DTYPE__DTYPE_I64}, {HP_BOOL, HP__V1__DTYPE__DTYPE_BOOL}};

static int to_pb(const enum_map *m, size_t n, int c) {
    for (size_t i = 0; i < n; i++)
        if (m[i].c == c) return m[i].pb;
    return 0; /* an out-of-range C value goes out as "unset", which readers refuse */
}

static hp_status from_pb(const enum_map *m, size_t n, int pb, int *c, const char *what,
                         hp_err *err) {
    for (size_t i = 0; i < n; i++) {
        if (m[i].pb == pb) {
            *c = m[i].c;
            return HP_OK;
        }
    }
    if (pb == 0) return hp_errf(err, HP_INVALID, "%s: unset", what);
    return hp_errf(err, HP_INVALID, "%s: unknown value %d", what, pb);
}

#define TO_PB(map, c) to_pb(map, HP_ARRAY_LEN(map), (int)(c))
#define FROM_PB(map, pb, cptr, what)                                                               \
    do {                                                                                           \
        int v_ = 0;                                                                                \
        HP_TRY(from_pb(map, HP_ARRAY_LEN(map), (int)(pb), &v_, what, err));                        \
        *(cptr) = v_;                                                                              \
    } while (0)

/* ---- export ------------------------------------------------------------------------------------
 */

typedef struct exporter {
    hp_arena *arena;
    bool ok;
} exporter;

static void *xalloc(exporter *x, size_t n) {
    if (n == 0) return NULL;
    void *p = hp_arena_alloc(x->arena, n);
    if (!p) x->ok = false;
    return p;
}

/* A copy of a fixed-size field, bounded by its capacity. */
static char *xstr(exporter *x, const char *s, size_t cap) {
    size_t n = 0;
    while (n < cap && s[n]) n++;
    char *c = hp_arena_alloc(x->arena, n + 1);
    if (!c) {
        x->ok = false;
        return (char *)"";
    }
    memcpy(c, s, n);
    return c;
}

/* var = a new message in the arena, initialised (NULL on failure). */
#define XNEW(x, var, init_fn)                                                                      \
    do {                                                                                           \
        (var) = xalloc(x, sizeof *(var));                                                          \
        if (var) init_fn(var);                                                                     \
    } while (0)

static Hp__V1__ModelSpec *export_model(exporter *x, const hp_model_spec *s) {
    Hp__V1__ModelSpec *m;
    XNEW(x, m, hp__v1__model_spec__init);
    if (!m) return NULL;
    m->family = xstr(x, s->family, sizeof s->family);
    m->flavor = xstr(x, s->flavor, sizeof s->flavor);
    m->batch = s->batch;
    m->seq = s->seq;
    m->dim = s->dim;
    m->n_layers = s->n_layers;
    m->n_heads = s->n_heads;
    m->n_kv_heads = s->n_kv_heads;
    m->ffn_hidden = s->ffn_hidden;
    m->vocab = s->vocab;
    m->norm_eps = s->norm_eps;
    m->rope_theta = s->rope_theta;
    return m;
}

static char **export_strs(exporter *x, char *const *v, int n) {
    char **out = xalloc(x, (size_t)n * sizeof *out);
    for (int i = 0; out && i < n; i++) out[i] = v[i] ? v[i] : (char *)"";
    return out;
}

static Hp__V1__PlacementConstraint *export_constraint(exporter *x, const hp_place_constraint *c) {
    Hp__V1__PlacementConstraint *m;
    XNEW(x, m, hp__v1__placement_constraint__init);
    int n = c->n_placements < 0                  ? 0
            : c->n_placements > HP_MESH_MAX_DIMS ? HP_MESH_MAX_DIMS
                                                 : c->n_placements;
    if (!m) return NULL;
    if (c->input_fqn && c->pattern) {
        m->target_case = HP__V1__PLACEMENT_CONSTRAINT__TARGET_INPUT_PATTERN;
        m->input_pattern = c->input_fqn;
    } else if (c->input_fqn) {
        m->target_case = HP__V1__PLACEMENT_CONSTRAINT__TARGET_INPUT_FQN;
        m->input_fqn = c->input_fqn;
    } else {
        m->target_case = HP__V1__PLACEMENT_CONSTRAINT__TARGET_OUTPUT_INDEX;
        m->output_index = c->output;
    }
    m->placements = xalloc(x, (size_t)n * sizeof *m->placements);
    for (int d = 0; m->placements && d < n; d++) {
        Hp__V1__Placement *p;
        XNEW(x, p, hp__v1__placement__init);
        if (!p) return m;
        p->kind = TO_PB(places, c->placements[d].kind);
        p->dim = c->placements[d].dim;
        if (c->placements[d].kind == HP_PLACE_PARTIAL)
            p->reduce = TO_PB(reduces, c->placements[d].reduce);
        m->placements[d] = p;
        m->n_placements = (size_t)d + 1;
    }
    return m;
}

static Hp__V1__ParallelPlan *export_plan(exporter *x, const hp_plan *p) {
    Hp__V1__ParallelPlan *m;
    XNEW(x, m, hp__v1__parallel_plan__init);
    if (!m) return NULL;
    int n_mesh = p->n_mesh < 0 ? 0 : p->n_mesh > HP_MESH_MAX_DIMS ? HP_MESH_MAX_DIMS : p->n_mesh;
    m->mesh = xalloc(x, (size_t)n_mesh * sizeof *m->mesh);
    for (int d = 0; m->mesh && d < n_mesh; d++) {
        Hp__V1__MeshDim *md;
        XNEW(x, md, hp__v1__mesh_dim__init);
        Hp__V1__LinkClass *l;
        XNEW(x, l, hp__v1__link_class__init);
        if (!md || !l) return m;
        md->name = xstr(x, p->mesh[d].name, sizeof p->mesh[d].name);
        md->size = p->mesh[d].size;
        l->bandwidth_bytes_per_s = p->mesh[d].link.bandwidth;
        l->latency_s = p->mesh[d].link.latency;
        md->link = l;
        m->mesh[d] = md;
        m->n_mesh = (size_t)d + 1;
    }
    if ((m->fsdp_fqns = export_strs(x, p->fsdp_fqns, p->n_fsdp_fqns)))
        m->n_fsdp_fqns = (size_t)p->n_fsdp_fqns;
    if ((m->fsdp_patterns = export_strs(x, p->fsdp_patterns, p->n_fsdp_patterns)))
        m->n_fsdp_patterns = (size_t)p->n_fsdp_patterns;
    m->mode = TO_PB(modes, p->mode);
    m->reshard_after_forward = p->reshard_after_forward;
    m->loss_parallel = p->loss_parallel;
    if (p->param_dtype != HP_F32 || p->reduce_dtype != HP_F32) {
        Hp__V1__MixedPrecision *mp;
        XNEW(x, mp, hp__v1__mixed_precision__init);
        if (mp) {
            mp->param_dtype = TO_PB(dtypes, p->param_dtype);
            mp->reduce_dtype = TO_PB(dtypes, p->reduce_dtype);
            m->mixed_precision = mp;
        }
    }
    if (p->device_profile[0])
        m->device_profile = xstr(x, p->device_profile, sizeof p->device_profile);
    m->gpus_per_node = p->gpus_per_node;
    if (p->ac_mode != HP_AC_NONE || p->ac_every != 1) {
        Hp__V1__ActivationCheckpoint *ac;
        XNEW(x, ac, hp__v1__activation_checkpoint__init);
        if (ac) {
            ac->mode = TO_PB(ac_modes, p->ac_mode);
            /* 0 reads as the default, 1: an out-of-range value goes out as one readers refuse */
            ac->every = p->ac_every >= 1 ? p->ac_every : -1;
            m->activation_checkpoint = ac;
        }
    }
    Hp__V1__MemoryBudget *b;
    XNEW(x, b, hp__v1__memory_budget__init);
    if (b) {
        b->low = p->mem_low;
        b->high = p->mem_high;
        m->param_memory_budget = b;
    }
    m->constraints = xalloc(x, (size_t)p->n_constraints * sizeof *m->constraints);
    for (int i = 0; m->constraints && i < p->n_constraints; i++) {
        if (!(m->constraints[i] = export_constraint(x, &p->constraints[i]))) return m;
        m->n_constraints = (size_t)i + 1;
    }
    return m;
}

static Hp__V1__PassConfig *export_passes(exporter *x, const hp_pass_config *c) {
    Hp__V1__PassConfig *m;
    XNEW(x, m, hp__v1__pass_config__init);
    if (!m) return NULL;
    m->enable_overlap = c->enable_overlap;
    m->bucket_bytes = c->bucket_bytes;
    m->prefetch_depth = c->prefetch_depth;
    int n_dump = c->n_dump < 0 ? 0 : c->n_dump > HP_PASS_MAX ? HP_PASS_MAX : c->n_dump;
    m->dump = xalloc(x, (size_t)n_dump * sizeof *m->dump);
    for (int i = 0; m->dump && i < n_dump; i++) {
        m->dump[i] = xstr(x, c->dump[i], sizeof c->dump[i]);
        m->n_dump = (size_t)i + 1;
    }
    int n_sw = c->n_switches < 0 ? 0 : c->n_switches > HP_PASS_MAX ? HP_PASS_MAX : c->n_switches;
    m->passes = xalloc(x, (size_t)n_sw * sizeof *m->passes);
    for (int i = 0; m->passes && i < n_sw; i++) {
        Hp__V1__PassSwitch *s;
        XNEW(x, s, hp__v1__pass_switch__init);
        if (!s) return m;
        s->name = xstr(x, c->switches[i].name, sizeof c->switches[i].name);
        s->enabled = c->switches[i].enabled;
        m->passes[i] = s;
        m->n_passes = (size_t)i + 1;
    }
    return m;
}

static Hp__V1__TrainConfig *export_train(exporter *x, const hp_train_config *t) {
    Hp__V1__TrainConfig *m;
    XNEW(x, m, hp__v1__train_config__init);
    if (!m) return NULL;
    m->steps = t->steps;
    m->lr = t->lr;
    m->min_lr_ratio = t->min_lr_ratio;
    m->warmup_steps = t->warmup_steps;
    m->decay = TO_PB(decays, t->decay);
    m->weight_decay = t->weight_decay;
    m->beta1 = t->beta1;
    m->beta2 = t->beta2;
    m->eps = t->eps;
    m->grad_clip = t->grad_clip;
    m->seed = t->seed;
    m->log_interval = t->log_interval;
    m->checkpoint_interval = t->checkpoint_interval;
    m->data_path = xstr(x, t->data_path, sizeof t->data_path);
    m->init_from = xstr(x, t->init_from, sizeof t->init_from);
    m->global_batch = t->global_batch;
    m->local_batch = t->local_batch;
    m->seq = t->seq;
    m->on_nonfinite = TO_PB(nonfinites, t->on_nonfinite);
    m->eval_interval = t->eval_interval;
    m->eval_steps = t->eval_steps;
    m->eval_data_path = xstr(x, t->eval_data_path, sizeof t->eval_data_path);
    if (t->n_profile_steps > 0) {
        size_t n = (size_t)t->n_profile_steps;
        m->profile_steps = xalloc(x, n * sizeof *m->profile_steps);
        if (!m->profile_steps) return NULL;
        memcpy(m->profile_steps, t->profile_steps, n * sizeof *m->profile_steps);
        m->n_profile_steps = n;
    }
    return m;
}

static Hp__V1__Resources *export_resources(exporter *x, const hp_resources *r) {
    Hp__V1__Resources *m;
    XNEW(x, m, hp__v1__resources__init);
    if (!m) return NULL;
    m->world_size = r->world_size;
    m->device = TO_PB(devices, r->device);
    m->gpus_per_node = r->gpus_per_node;
    m->max_restarts = r->max_restarts;
    return m;
}

hp_status hp_job_export(const hp_job *job, hp_arena *arena, Hp__V1__Job **msg, hp_err *err) {
    exporter x = {arena, true};
    *msg = NULL;
    Hp__V1__Job *m;
    XNEW(&x, m, hp__v1__job__init);
    if (!m) return hp_errf(err, HP_NOMEM, "job export: out of memory");
    m->format_version = HP_JOB_FORMAT_VERSION;
    m->name = xstr(&x, job->name, sizeof job->name);
    if (job->graph) HP_TRY(hp_graph_export(job->graph, arena, &m->graph, err));
    m->model = export_model(&x, &job->model);
    m->plan = export_plan(&x, &job->plan);
    m->passes = export_passes(&x, &job->passes);
    m->train = export_train(&x, &job->train);
    m->resources = export_resources(&x, &job->resources);
    if (!x.ok) return hp_errf(err, HP_NOMEM, "job export: out of memory");
    *msg = m;
    return HP_OK;
}

/* ---- import ------------------------------------------------------------------------------------
 */

/* Copies an untrusted string into a fixed-size field. */
static hp_status copy_str(const char *s, char *dst, size_t cap, const char *what, hp_err *err) {
    char q[HP__QUOTE_MAX];
    size_t n = hp__strlen0(s);
    if (n >= cap)
        return hp_errf(err, HP_LIMIT, "%s: '%s' is %zu characters, over the limit of %zu", what,
                       hp__quote(s, q), n, cap - 1);
    if (n) memcpy(dst, s, n);
    dst[n] = 0;
    return HP_OK;
}

static hp_status check_count(size_t n, size_t max, const char *what, hp_err *err) {
    if (n > max)
        return hp_errf(err, HP_LIMIT, "%s: %zu entries, over the limit of %zu", what, n, max);
    return HP_OK;
}

static hp_status import_model(const Hp__V1__ModelSpec *m, hp_model_spec *s, hp_err *err) {
    memset(s, 0, sizeof *s);
    if (!m) return HP_OK; /* no model: the graph stands alone */
    HP_TRY(copy_str(m->family, s->family, sizeof s->family, "model.family", err));
    HP_TRY(copy_str(m->flavor, s->flavor, sizeof s->flavor, "model.flavor", err));
    s->batch = m->batch;
    s->seq = m->seq;
    s->dim = m->dim;
    s->n_layers = m->n_layers;
    s->n_heads = m->n_heads;
    s->n_kv_heads = m->n_kv_heads;
    s->ffn_hidden = m->ffn_hidden;
    s->vocab = m->vocab;
    s->norm_eps = m->norm_eps;
    s->rope_theta = m->rope_theta;
    return HP_OK;
}

static hp_status import_strs(char **src, size_t n, char ***dst, int *n_dst, const char *what,
                             hp_err *err) {
    char sub[64];
    HP_TRY(check_count(n, HP_PLAN_MAX_ITEMS, what, err));
    if (n == 0) return HP_OK;
    if (!src) return hp_errf(err, HP_INVALID, "%s: missing", what);
    if (!(*dst = hp_calloc(n, sizeof **dst)))
        return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < n; i++) {
        snprintf(sub, sizeof sub, "%s[%zu]", what, i);
        HP_TRY(hp__check_str(src[i], HP_MAX_STR, sub, err));
        if (!((*dst)[i] = hp_strdup(src[i] ? src[i] : "")))
            return hp_errf(err, HP_NOMEM, "%s: out of memory", sub);
        *n_dst = (int)i + 1; /* hp_job_fini frees what is counted */
    }
    return HP_OK;
}

static hp_status import_constraint(const Hp__V1__PlacementConstraint *m, hp_place_constraint *c,
                                   const char *what, hp_err *err) {
    char sub[160];
    if (!m) return hp_errf(err, HP_INVALID, "%s: missing", what);
    switch (m->target_case) {
    case HP__V1__PLACEMENT_CONSTRAINT__TARGET_INPUT_FQN:
        snprintf(sub, sizeof sub, "%s.input_fqn", what);
        HP_TRY(hp__check_str(m->input_fqn, HP_MAX_STR, sub, err));
        if (!(c->input_fqn = hp_strdup(m->input_fqn ? m->input_fqn : "")))
            return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
        break;
    case HP__V1__PLACEMENT_CONSTRAINT__TARGET_OUTPUT_INDEX:
        c->output = m->output_index;
        break;
    case HP__V1__PLACEMENT_CONSTRAINT__TARGET_INPUT_PATTERN:
        snprintf(sub, sizeof sub, "%s.input_pattern", what);
        HP_TRY(hp__check_str(m->input_pattern, HP_MAX_STR, sub, err));
        if (!(c->input_fqn = hp_strdup(m->input_pattern ? m->input_pattern : "")))
            return hp_errf(err, HP_NOMEM, "%s: out of memory", what);
        c->pattern = true;
        break;
    default:
        return hp_errf(err, HP_INVALID, "%s: no target (input_fqn, input_pattern or output_index)",
                       what);
    }
    snprintf(sub, sizeof sub, "%s.placements", what);
    HP_TRY(check_count(m->n_placements, HP_MESH_MAX_DIMS, sub, err));
    for (size_t d = 0; d < m->n_placements; d++) {
        const Hp__V1__Placement *p = m->placements ? m->placements[d] : NULL;
        hp_placement *o = &c->placements[d];
        snprintf(sub, sizeof sub, "%s.placements[%zu]", what, d);
        if (!p) return hp_errf(err, HP_INVALID, "%s: missing", sub);
        FROM_PB(places, p->kind, &o->kind, sub);
        o->dim = p->dim;
        if (o->kind == HP_PLACE_PARTIAL) FROM_PB(reduces, p->reduce, &o->reduce, sub);
    }
    c->n_placements = (int)m->n_placements;
    return HP_OK;
}

static hp_status import_plan(const Hp__V1__ParallelPlan *m, hp_plan *p, hp_err *err) {
    char what[64];
    if (!m) return hp_errf(err, HP_INVALID, "plan: missing");
    HP_TRY(check_count(m->n_mesh, HP_MESH_MAX_DIMS, "plan.mesh", err));
    for (size_t d = 0; d < m->n_mesh; d++) {
        const Hp__V1__MeshDim *md = m->mesh ? m->mesh[d] : NULL;
        snprintf(what, sizeof what, "plan.mesh[%zu]", d);
        if (!md) return hp_errf(err, HP_INVALID, "%s: missing", what);
        snprintf(what, sizeof what, "plan.mesh[%zu].name", d);
        HP_TRY(copy_str(md->name, p->mesh[d].name, sizeof p->mesh[d].name, what, err));
        p->mesh[d].size = md->size;
        if (!md->link) return hp_errf(err, HP_INVALID, "plan.mesh[%zu].link: missing", d);
        p->mesh[d].link.bandwidth = md->link->bandwidth_bytes_per_s;
        p->mesh[d].link.latency = md->link->latency_s;
    }
    p->n_mesh = (int)m->n_mesh;
    HP_TRY(import_strs(m->fsdp_fqns, m->n_fsdp_fqns, &p->fsdp_fqns, &p->n_fsdp_fqns,
                       "plan.fsdp_fqns", err));
    HP_TRY(import_strs(m->fsdp_patterns, m->n_fsdp_patterns, &p->fsdp_patterns, &p->n_fsdp_patterns,
                       "plan.fsdp_patterns", err));
    FROM_PB(modes, m->mode, &p->mode, "plan.mode");
    p->reshard_after_forward = m->reshard_after_forward;
    p->loss_parallel = m->loss_parallel;
    p->param_dtype = p->reduce_dtype = HP_F32; /* absent or unset: f32 */
    if (m->mixed_precision && m->mixed_precision->param_dtype)
        FROM_PB(dtypes, m->mixed_precision->param_dtype, &p->param_dtype,
                "plan.mixed_precision.param_dtype");
    if (m->mixed_precision && m->mixed_precision->reduce_dtype)
        FROM_PB(dtypes, m->mixed_precision->reduce_dtype, &p->reduce_dtype,
                "plan.mixed_precision.reduce_dtype");
    HP_TRY(copy_str(m->device_profile, p->device_profile, sizeof p->device_profile,
                    "plan.device_profile", err));
    p->gpus_per_node = m->gpus_per_node;
    p->ac_mode = HP_AC_NONE; /* absent or unset: none, every block */
    p->ac_every = 1;
    if (m->activation_checkpoint) { /* present: its mode must be set */
        FROM_PB(ac_modes, m->activation_checkpoint->mode, &p->ac_mode,
                "plan.activation_checkpoint.mode");
        if (m->activation_checkpoint->every) p->ac_every = m->activation_checkpoint->every;
    }
    p->mem_low = m->param_memory_budget ? m->param_memory_budget->low : 0.0;
    p->mem_high = m->param_memory_budget ? m->param_memory_budget->high : 1.0;

    HP_TRY(check_count(m->n_constraints, HP_PLAN_MAX_ITEMS, "plan.constraints", err));
    if (m->n_constraints) {
        if (!m->constraints) return hp_errf(err, HP_INVALID, "plan.constraints: missing");
        if (!(p->constraints = hp_calloc(m->n_constraints, sizeof *p->constraints)))
            return hp_errf(err, HP_NOMEM, "plan.constraints: out of memory");
        for (size_t i = 0; i < m->n_constraints; i++) {
            snprintf(what, sizeof what, "plan.constraints[%zu]", i);
            p->n_constraints = (int)i + 1; /* counted first: fini frees a half-filled entry */
            HP_TRY(import_constraint(m->constraints[i], &p->constraints[i], what, err));
        }
    }
    return HP_OK;
}

static hp_status import_passes(const Hp__V1__PassConfig *m, hp_pass_config *c, hp_err *err) {
    char what[64];
    if (!m) return hp_errf(err, HP_INVALID, "passes: missing");
    c->enable_overlap = m->enable_overlap;
    c->bucket_bytes = m->bucket_bytes;
    c->prefetch_depth = m->prefetch_depth;
    HP_TRY(check_count(m->n_dump, HP_PASS_MAX, "passes.dump", err));
    for (size_t i = 0; i < m->n_dump; i++) {
        snprintf(what, sizeof what, "passes.dump[%zu]", i);
        HP_TRY(copy_str(m->dump ? m->dump[i] : NULL, c->dump[i], sizeof c->dump[i], what, err));
    }
    c->n_dump = (int)m->n_dump;
    HP_TRY(check_count(m->n_passes, HP_PASS_MAX, "passes.passes", err));
    for (size_t i = 0; i < m->n_passes; i++) {
        const Hp__V1__PassSwitch *s = m->passes ? m->passes[i] : NULL;
        snprintf(what, sizeof what, "passes.passes[%zu]", i);
        if (!s) return hp_errf(err, HP_INVALID, "%s: missing", what);
        snprintf(what, sizeof what, "passes.passes[%zu].name", i);
        HP_TRY(copy_str(s->name, c->switches[i].name, sizeof c->switches[i].name, what, err));
        c->switches[i].enabled = s->enabled;
    }
    c->n_switches = (int)m->n_passes;
    return HP_OK;
}

static hp_status import_train(const Hp__V1__TrainConfig *m, hp_train_config *t, hp_err *err) {
    if (!m) return hp_errf(err, HP_INVALID, "train: missing");
    t->steps = m->steps;
    t->lr = m->lr;
    t->min_lr_ratio = m->min_lr_ratio;
    t->warmup_steps = m->warmup_steps;
    FROM_PB(decays, m->decay, &t->decay, "train.decay");
    t->weight_decay = m->weight_decay;
    t->beta1 = m->beta1;
    t->beta2 = m->beta2;
    t->eps = m->eps;
    t->grad_clip = m->grad_clip;
    t->seed = m->seed;
    t->log_interval = m->log_interval;
    t->checkpoint_interval = m->checkpoint_interval;
    HP_TRY(copy_str(m->data_path, t->data_path, sizeof t->data_path, "train.data_path", err));
    HP_TRY(copy_str(m->init_from, t->init_from, sizeof t->init_from, "train.init_from", err));
    t->global_batch = m->global_batch;
    t->local_batch = m->local_batch;
    t->seq = m->seq;
    t->eval_interval = m->eval_interval;
    t->eval_steps = m->eval_steps;
    HP_TRY(copy_str(m->eval_data_path, t->eval_data_path, sizeof t->eval_data_path,
                    "train.eval_data_path", err));
    t->on_nonfinite = HP_NONFINITE_STOP; /* unset: files from before the field stop */
    if (m->on_nonfinite != 0)
        FROM_PB(nonfinites, m->on_nonfinite, &t->on_nonfinite, "train.on_nonfinite");
    if (m->n_profile_steps > HP_JOB_PROFILE_MAX)
        return hp_errf(err, HP_LIMIT, "train.profile_steps: %zu steps (at most %d)",
                       m->n_profile_steps, HP_JOB_PROFILE_MAX);
    for (size_t i = 0; i < m->n_profile_steps; i++)
        if (m->profile_steps[i] < 1)
            return hp_errf(err, HP_INVALID, "train.profile_steps: step %lld must be >= 1",
                           (long long)m->profile_steps[i]);
    for (size_t i = 0; i < m->n_profile_steps; i++) t->profile_steps[i] = m->profile_steps[i];
    t->n_profile_steps = (int)m->n_profile_steps;
    return HP_OK;
}

static hp_status import_resources(const Hp__V1__Resources *m, hp_resources *r, hp_err *err) {
    if (!m) return hp_errf(err, HP_INVALID, "resources: missing");
    r->world_size = m->world_size;
    FROM_PB(devices, m->device, &r->device, "resources.device");
    r->gpus_per_node = m->gpus_per_node;
    r->max_restarts = m->max_restarts;
    return HP_OK;
}

static hp_status import_job(const Hp__V1__Job *m, hp_job *job, hp_err *err) {
    if (m->format_version == 0)
        return hp_errf(err, HP_INVALID, "job: format_version is 0 (unset); this build reads %d",
                       HP_JOB_FORMAT_VERSION);
    if (m->format_version > HP_JOB_FORMAT_VERSION)
        return hp_errf(err, HP_UNSUPPORTED,
                       "job: format_version %u is newer than this build reads (%d)",
                       (unsigned)m->format_version, HP_JOB_FORMAT_VERSION);
    HP_TRY(copy_str(m->name, job->name, sizeof job->name, "name", err));
    HP_TRY(import_resources(m->resources, &job->resources, err));
    HP_TRY(import_model(m->model, &job->model, err));
    HP_TRY(import_plan(m->plan, &job->plan, err));
    HP_TRY(import_passes(m->passes, &job->passes, err));
    HP_TRY(import_train(m->train, &job->train, err));
    if (m->graph) HP_TRY(hp_graph_import(m->graph, &job->graph, err));
    return hp__job_validate(job, false, err);
}

hp_status hp_job_import(const Hp__V1__Job *msg, hp_job **out, hp_err *err) {
    *out = NULL;
    if (!msg) return hp_errf(err, HP_INVALID, "job: missing");
    hp_job *job = hp_malloc(sizeof *job);
    if (!job) return hp_errf(err, HP_NOMEM, "job import: out of memory");
    memset(job, 0, sizeof *job); /* empty lists, no graph: what fini expects */
    hp_status s = import_job(msg, job, err);
    if (s != HP_OK) {
        hp_job_free(job);
        return s;
    }
    *out = job;
    return HP_OK;
}

/* ---- bytes and files ---------------------------------------------------------------------------
 */

hp_status hp_job_pack(const hp_job *job, uint8_t **data, size_t *len, hp_err *err) {
    *data = NULL;
    *len = 0;
    hp_arena arena;
    hp_arena_init(&arena);
    Hp__V1__Job *msg;
    hp_status s = hp_job_export(job, &arena, &msg, err);
    if (s == HP_OK) {
        size_t n = hp__v1__job__get_packed_size(msg);
        uint8_t *buf = NULL;
        if (n > HP_JOB_FILE_MAX)
            s = hp_errf(err, HP_LIMIT, "job: encodes to %zu bytes, over the limit of %zu", n,
                        HP_JOB_FILE_MAX);
        else if (!(buf = hp_malloc(n ? n : 1)))
            s = hp_errf(err, HP_NOMEM, "job: out of memory packing %zu bytes", n);
        if (s == HP_OK) {
            size_t wrote = hp__v1__job__pack(msg, buf);
            HP_ASSERT(wrote == n);
            *data = buf;
            *len = n;
        }
    }
    hp_arena_fini(&arena);
    return s;
}

hp_status hp_job_unpack(const uint8_t *data, size_t len, hp_job **out, hp_err *err) {
    static const uint8_t empty[1];
    *out = NULL;
    if (len > HP_JOB_FILE_MAX)
        return hp_errf(err, HP_LIMIT, "job: message of %zu bytes is over the limit of %zu", len,
                       HP_JOB_FILE_MAX);
    if (!data && len) return hp_errf(err, HP_INVALID, "job: no data");
    hp_proto_alloc a;
    hp_arena arena;
    hp_arena_init(&arena);
    hp_proto_alloc_init_arena(&a, len, &arena);
    Hp__V1__Job *msg = hp__v1__job__unpack(&a.base, len, data ? data : empty);
    hp_status s = msg ? hp_proto_check_strings(&hp__v1__job__descriptor, data, len, "job", err)
                      : hp_proto_unpack_error(&a, "job", len, err);
    if (s == HP_OK) s = hp_job_import(msg, out, err);
    hp_arena_fini(&arena); /* the whole message */
    return s;
}

hp_status hp_job_read_file(const char *path, hp_job **out, hp_err *err) {
    uint8_t *data = NULL;
    size_t len = 0;
    *out = NULL;
    HP_TRY(hp_file_read(path, HP_JOB_FILE_MAX, &data, &len, err));
    hp_status s = hp_job_unpack(data, len, out, err);
    hp_free(data);
    if (s != HP_OK) hp_err_prefix(err, "%s", path);
    return s;
}

hp_status hp_job_write_file(const char *path, const hp_job *job, hp_err *err) {
    uint8_t *data = NULL;
    size_t len = 0;
    hp_status s = hp_job_pack(job, &data, &len, err);
    if (s != HP_OK) {
        hp_err_prefix(err, "%s", path);
        return s;
    }
    s = hp_file_write_atomic(path, data, len, err);
    hp_free(data);
    return s;
}
