/* passes/pipeline.c — the pass manager: the pass order as one table, the verifier between
 * passes, a report per pass, .hpir dumps by name, then lowering to the Program and the
 * memory and cost reports (cost.c).
 *
 * Verification: the input graph and the last pass's output are always checked with
 * hp_graph_verify (shape rules and all); between passes too in debug builds, or wherever
 * HP_VERIFY_PASSES=1 (the tests; HP_VERIFY_PASSES=0 turns it off in debug builds).
 * Dumps: the job's passes.dump list plus $HP_DUMP (comma-separated pass names; "all"; also
 * "input" for the graph before the first pass and "lower" for the program listing) write
 * $HP_DUMP_DIR/NN-<name>.hpir (default dir "."), NN the position in the pipeline (00 the
 * input, the last number the lowering, which writes NN-lower.txt).
 * Storage: every graph the compile made itself lends its storage to the next pass (see
 * passes_internal.h: the output's unchanged nodes point at its types and attributes) and its
 * arena moves into that output once the pass is done, so each rebuild writes only node
 * records, inputs and what the pass changed (once per distinct array: graph/intern.c); the
 * program's graph shares the compiled graph's storage the same way. The job's own graph is
 * never lent (it may be freed before the result). A pass whose no_op check says it would change
 * nothing (DCE with nothing dead) is not run: its input goes on as it is. Nothing here prints;
 * warnings are collected in the result.
 */
#include "passes/passes_internal.h"
#include "hp/autoshard.h"

#include "hp/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void hp_pass_warn(hp_pass_ctx *ctx, const char *fmt, ...) {
    if (ctx->n_warnings >= HP_MAX_WARNINGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->warnings[ctx->n_warnings++], HP_ERR_MSG_MAX, fmt, ap);
    va_end(ap);
}

/* ---- the pipeline --------------------------------------------------------------------------- */

static bool always(const hp_pass_ctx *ctx) {
    (void)ctx;
    return true;
}
/* With more than one rank FSDP always runs: marked parameters are sharded, the others stay
 * replicated with all-reduced gradients, data is split on the batch dim (plain data
 * parallelism when nothing is marked). */
static bool placed(const hp_pass_ctx *ctx) {
    return hp_plan_uses_placements(ctx->job, ctx->world) || ctx->fsdp_placed_by_spmd;
}
static bool loss_parallel_on(const hp_pass_ctx *ctx) {
    return ctx->job->plan.loss_parallel && placed(ctx);
}
static bool multi_rank(const hp_pass_ctx *ctx) {
    return ctx->world > 1 && !placed(ctx);
}
/* On placed graphs too: both keep the mesh and every placement, and bucketing merges only
 * collectives of one mesh dim (group and size), op, dtype and reduce op. */
static bool mixed_on(const hp_pass_ctx *ctx) {
    return ctx->job->plan.param_dtype != HP_F32 || ctx->job->plan.reduce_dtype != HP_F32;
}
/* Graphs without placements: a placed loss (loss parallel, tp) keeps its unfused ops. */
static bool unplaced(const hp_pass_ctx *ctx) {
    return !placed(ctx);
}
static bool ac_on(const hp_pass_ctx *ctx) {
    return ctx->job->plan.ac_mode != HP_AC_NONE;
}
static bool overlap_on(const hp_pass_ctx *ctx) {
    return ctx->job->passes.enable_overlap;
}
static bool buckets_on(const hp_pass_ctx *ctx) {
    return ctx->job->passes.bucket_bytes > 0;
}

/* The parameters the plan's FSDP marks select (marked[P]), as passes/fsdp.c resolves them: an
 * exact FQN or '.'-boundary module prefix (hp_plan_mark_names), or a glob; scalars stay
 * replicated. */
static hp_status fsdp_marks(const hp_graph *g, hp_pass_ctx *ctx, int n_params, bool *marked,
                            hp_err *err) {
    const hp_plan *p = &ctx->job->plan;
    if (p->n_fsdp_fqns > 0)
        HP_TRY(hp_plan_mark_names(g, p->fsdp_fqns, p->n_fsdp_fqns, marked, err));
    for (int k = 0; k < p->n_fsdp_patterns; k++) {
        bool hit = false;
        for (int i = 0; i < n_params; i++) {
            const hp_attr *fqn = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
            if (fqn && fqn->s && hp_fqn_match(p->fsdp_patterns[k], fqn->s)) hit = marked[i] = true;
        }
        if (!hit)
            hp_pass_warn(ctx, "spmd: FSDP pattern '%.200s' matches no parameter",
                         p->fsdp_patterns[k]);
    }
    for (int i = 0; i < n_params; i++) marked[i] &= g->nodes[i].out[0].rank > 0;
    return HP_OK;
}

/* FSDP's storage dim of a parameter whose other mesh dims are placed row[]: the first tensor
 * dim no other mesh dim shards (colwise [out, in] tp:S(0) stores dp:S(1)), so no tensor dim is
 * split by two mesh dims (DTensor's strided shards); -1 when every dim is taken. */
static int fsdp_dim(const hp_type *t, const hp_placement *row, int nd, int dp) {
    for (int k = 0; k < t->rank; k++) {
        bool taken = false;
        for (int m = 0; m < nd; m++)
            taken |= m != dp && row[m].kind == HP_PLACE_SHARD && row[m].dim == k;
        if (!taken) return k;
    }
    return -1;
}

/* plan.mode auto: the placements auto-sharding chooses (hp/autoshard.h), applied by spmd. */
static hp_status pass_autoshard(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    hp_device_profile prof;
    HP_TRY(hp_device_profile_for_job(ctx->job, &prof, err));
    hp_autoshard *a = NULL;
    HP_TRY(hp_autoshard_solve(in, ctx->job, &prof, NULL, &a, err));
    hp_status st = hp_autoshard_apply(a, out, err);
    if (st != HP_OK) {
        hp_autoshard_free(a);
        return st;
    }
    hp_autoshard_free(ctx->autoshard);
    ctx->autoshard = a;
    return HP_OK;
}

/* The placement passes on the plan: each parameter takes the last constraint naming it (an
 * exact FQN or a glob), Replicate where none does; data inputs are split on dim 0 (the batch)
 * over the mesh dim named "dp"; buffers are replicated. A parameter the FSDP marks select is
 * stored Shard(fsdp_dim) on dp, and one a constraint places Shard on dp keeps that storage:
 * either is gathered before use (computed Replicate on dp), its gradient reduce-scattered. */
static hp_status place(const hp_graph *in, hp_pass_ctx *ctx, const hp_graph_mesh *mesh, int dp,
                       hp_graph **out, hp_err *err) {
    const hp_plan *p = &ctx->job->plan;
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(in);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    size_t n_pl = (size_t)(n_ph ? n_ph : 1) * (size_t)nd;
    hp_placement *pl = hp_calloc(n_pl, sizeof *pl);
    hp_placement *compute = hp_calloc(n_pl, sizeof *compute);
    bool *marked = hp_calloc((size_t)(gi.n_params ? gi.n_params : 1), sizeof *marked);
    hp_status st = pl && compute && marked
                       ? fsdp_marks(in, ctx, gi.n_params, marked, err)
                       : hp_errf(err, HP_NOMEM, "out of memory placing the inputs");
    const hp_placement *vocab_row = NULL; /* output.weight's compute placements: the vocab split */
    for (int i = 0; i < n_ph && st == HP_OK; i++) {
        hp_placement *row = pl + (size_t)i * (size_t)nd;
        for (int d = 0; d < nd; d++) row[d] = HP_REPLICATE;
        const hp_attr *fqn = hp_node_attr(&in->nodes[i], HP_ATTR_FQN);
        int k = hp_plan_constraint_for(p, fqn ? fqn->s : NULL);
        if (k >= 0) memcpy(row, p->constraints[k].placements, sizeof *row * (size_t)nd);
        if (i >= gi.n_params + gi.n_buffers && dp >= 0 && in->nodes[i].out[0].rank >= 1)
            row[dp] = HP_SHARD(0);
        if (fqn && fqn->s && !strcmp(fqn->s, HP_VOCAB_INDEX_FQN)) /* loss parallel's vocab */
            for (int d = 0; d < nd; d++)
                row[d] = vocab_row && vocab_row[d].kind == HP_PLACE_SHARD && vocab_row[d].dim == 0
                             ? HP_SHARD(0)
                             : HP_REPLICATE;
        hp_placement *crow = compute + (size_t)i * (size_t)nd;
        if (i < gi.n_params && dp >= 0 && row[dp].kind == HP_PLACE_PARTIAL) {
            char w[24];
            st = hp_errf(err, HP_UNSUPPORTED,
                         "'%s' is placed %s on the data-parallel dim dp: a parameter is stored "
                         "Replicate or Shard there",
                         fqn && fqn->s ? fqn->s : "?", hp_placement_short(&row[dp], w, sizeof w));
            break;
        }
        if (i < gi.n_params && dp >= 0 && marked[i] && row[dp].kind == HP_PLACE_REPLICATE) {
            int k = fsdp_dim(&in->nodes[i].out[0], row, nd, dp);
            if (k >= 0) row[dp] = HP_SHARD(k);
        }
        memcpy(crow, row, sizeof *row * (size_t)nd);
        if (i < gi.n_params && dp >= 0) crow[dp] = HP_REPLICATE; /* gathered before use */
        if (i < gi.n_params && fqn && fqn->s && !strcmp(fqn->s, "output.weight")) vocab_row = crow;
    }
    hp_spmd_opts opts = {.compute = compute, .reshard_after_forward = p->reshard_after_forward};
    if (st == HP_OK) st = hp_pass_spmd_ex(in, mesh, pl, NULL, &opts, out, err);
    hp_free(pl);
    hp_free(compute);
    hp_free(marked);
    if (st != HP_OK && err && !strncmp(err->msg, "spmd: ", 6)) /* the manager names the pass */
        memmove(err->msg, err->msg + 6, strlen(err->msg + 6) + 1);
    return st;
}

/* The plan's mesh, its dim named "dp" the data-parallel one. */
static hp_status pass_spmd(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    const hp_plan *p = &ctx->job->plan;
    if (p->mode == HP_PLAN_AUTO) return pass_autoshard(in, ctx, out, err);
    hp_graph_mesh mesh = {.ndim = p->n_mesh};
    int dp = -1;
    for (int d = 0; d < p->n_mesh; d++) {
        snprintf(mesh.name[d], sizeof mesh.name[d], "%s", p->mesh[d].name);
        mesh.size[d] = p->mesh[d].size;
        if (!strcmp(p->mesh[d].name, "dp") && p->mesh[d].size > 1) dp = d;
    }
    return place(in, ctx, &mesh, dp, out, err);
}

/* A 1-D data-parallel plan: the FSDP pass, which runs the graph on each rank's slice of the
 * batch. A graph it refuses, whose values a rank cannot compute from its slice alone (a sum or
 * a plain mean over the batch: reduction='sum', label smoothing's mean; a slice of the batch),
 * gets the same plan from spmd: one mesh dim of the world's ranks, the data split on it,
 * marked parameters stored sharded on it; its Partial placements keep world 1's values. The
 * later passes then see a placed graph. Both refusing: FSDP's reason, then spmd's. */
static hp_status pass_fsdp(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    hp_err why = {0};
    hp_status st = hp_pass_fsdp(in, ctx, out, &why);
    if (st != HP_UNSUPPORTED) {
        if (st != HP_OK && err) *err = why;
        return st;
    }
    const hp_plan *p = &ctx->job->plan;
    hp_graph_mesh mesh = {.ndim = 1, .size = {ctx->world}};
    snprintf(mesh.name[0], sizeof mesh.name[0], "%s",
             p->n_mesh == 1 && p->mesh[0].name[0] ? p->mesh[0].name : "dp");
    hp_err spmd = {0};
    st = place(in, ctx, &mesh, 0, out, &spmd);
    if (st == HP_OK) {
        ctx->fsdp_placed_by_spmd = true;
        if (ctx->report)
            snprintf(ctx->report->placed_by_spmd, sizeof ctx->report->placed_by_spmd, "%s",
                     why.msg);
        return HP_OK;
    }
    if (st != HP_UNSUPPORTED) { /* out of memory, say: that is the error */
        if (err) *err = spmd;
        return st;
    }
    return hp_errf(err, st, "%.240s (placing it with spmd instead: %.240s)", why.msg, spmd.msg);
}

static const hp__pass_entry pipeline[] = {
    /* name, pass, runs by default when (passes.switches override), its no-op check */
    {"dce", hp_pass_dce, always, hp__dce_no_op},
    {"canonicalize", hp_pass_canonicalize, always, NULL},
    {"fuse_attention", hp_pass_fuse_attention, always, NULL},
    {"activation_checkpoint", hp_pass_activation_checkpoint, ac_on, NULL},
    {"loss_parallel", hp_pass_loss_parallel_run, loss_parallel_on, NULL},
    {"spmd", pass_spmd, placed, NULL},
    {"fsdp", pass_fsdp, multi_rank, NULL},
    {"mixed_precision", hp_pass_mixed_precision, mixed_on, NULL},
    {"fuse_cross_entropy", hp_pass_fuse_cross_entropy, unplaced, NULL},
    {"fuse_swiglu", hp_pass_fuse_swiglu, unplaced, NULL},
    {"overlap", hp_pass_overlap, overlap_on, NULL},
    {"bucketing", hp_pass_bucketing, buckets_on, NULL},
    /* then: hp_lower (lowering + memory plan), hp_program_verify */
};
#define N_PASSES ((int)HP_ARRAY_LEN(pipeline))

const hp__pass_entry *hp__passes(int *n) {
    *n = N_PASSES;
    return pipeline;
}

const hp__pass_entry *hp__pass_find(const char *name) {
    for (int i = 0; i < N_PASSES; i++)
        if (!strcmp(pipeline[i].name, name)) return &pipeline[i];
    return NULL;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* HP_VERIFY_PASSES=1 or 0 decides; unset, debug builds verify between passes and release
 * builds (NDEBUG: CMake's Release and RelWithDebInfo) do not. It is a few ms on the 405B
 * graph but ~20% of the compile at 4096 layers (six full verifies of ~700k nodes); release
 * builds still verify the input graph and the last pass's output (the lowering's joint-graph
 * check), and the tests run with it on (tests/CMakeLists.txt). */
static bool verify_between_passes(void) {
    const char *v = getenv("HP_VERIFY_PASSES");
    if (v && !strcmp(v, "0")) return false;
    if (v && !strcmp(v, "1")) return true;
#ifdef NDEBUG
    return false;
#else
    return true;
#endif
}

static bool known_dump_name(const char *s) {
    return hp__pass_find(s) || !strcmp(s, "all") || !strcmp(s, "input") || !strcmp(s, "lower");
}

/* Is `name` in the comma-separated list `list`? */
static bool in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((len == n && !strncmp(p, name, n)) || (len == 3 && !strncmp(p, "all", 3))) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

typedef struct dumper {
    const hp_pass_config *cfg;
    const char *env; /* $HP_DUMP */
    const char *dir; /* $HP_DUMP_DIR or "." */
} dumper;

static bool dump_wanted(const dumper *d, const char *name) {
    for (int i = 0; i < d->cfg->n_dump; i++)
        if (!strcmp(d->cfg->dump[i], name) || !strcmp(d->cfg->dump[i], "all")) return true;
    return in_list(d->env, name);
}

static hp_status dump_graph(const dumper *d, int index, const char *name, const hp_graph *g,
                            hp_err *err) {
    if (!dump_wanted(d, name)) return HP_OK;
    char path[1024];
    snprintf(path, sizeof path, "%s/%02d-%s.hpir", d->dir, index, name);
    hp_status st = hp_graph_write_file(g, path, err);
    if (st != HP_OK) hp_err_prefix(err, "dump after %s", name);
    return st;
}

static hp_status dump_program(const dumper *d, int index, const hp_program *p, hp_err *err) {
    if (!dump_wanted(d, "lower")) return HP_OK;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/%02d-lower.txt", d->dir, index);
    hp_status st = hp_program_print(p, &text, err);
    if (st == HP_OK) st = hp_file_write_atomic(path, text, strlen(text), err);
    hp_free(text);
    if (st != HP_OK) hp_err_prefix(err, "dump after lower");
    return st;
}

/* The graph-level counters of a report. */
static void count(const hp_graph *g, hp_pass_report *r) {
    r->nodes_out = g->n_nodes;
    r->collectives = 0;
    r->comm_bytes = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!(hp_op_get(g->nodes[i].op)->flags & HP_OPF_COLLECTIVE)) continue;
        r->collectives++;
        r->comm_bytes += hp_collective_bytes(g, i);
    }
}

/* r's pass did not run or left g as it was: the previous pass's report counted g already (no
 * walk over every collective's types); the first pass counts it. */
static void same_count(const hp_compiled *c, hp_pass_report *r, const hp_graph *g) {
    if (c->n_passes < 2) {
        count(g, r);
        return;
    }
    r->nodes_out = r[-1].nodes_out;
    r->collectives = r[-1].collectives;
    r->comm_bytes = r[-1].comm_bytes;
}

/* Does pass `e` run? Its default, unless the job's switches name it. */
static bool pass_on(const hp__pass_entry *e, const hp_pass_ctx *ctx) {
    const hp_pass_config *c = &ctx->job->passes;
    /* a placed graph runs spmd, never fsdp (which does not place values) */
    if (placed(ctx) && e->fn == pass_fsdp) return false;
    for (int i = 0; i < c->n_switches; i++)
        if (!strcmp(c->switches[i].name, e->name)) return c->switches[i].enabled;
    return e->wanted(ctx);
}

/* The job against the world it is compiled for. */
static hp_status check_world(const hp_job *job, int world, const hp_graph *g, bool fsdp,
                             hp_err *err) {
    if (world < 1 || world > HP_MAX_WORLD)
        return hp_errf(err, HP_INVALID, "world %d must be in [1, %d]", world, HP_MAX_WORLD);
    int64_t product = 1;
    char mesh[160] = "";
    size_t len = 0;
    for (int d = 0; d < job->plan.n_mesh && d < HP_MESH_MAX_DIMS; d++) {
        product *= job->plan.mesh[d].size;
        len += (size_t)snprintf(mesh + len, len < sizeof mesh ? sizeof mesh - len : 0, "%s%s=%d",
                                d ? "," : "", job->plan.mesh[d].name, job->plan.mesh[d].size);
        if (len >= sizeof mesh) len = sizeof mesh - 1;
    }
    if (product != world)
        return hp_errf(err, HP_INVALID,
                       "world %d does not match the plan's mesh (%s), which has %lld ranks", world,
                       mesh, (long long)product);
    /* what a plan may say that no pass reads yet is refused, never silently dropped */
    if ((job->plan.mem_low != 0 || job->plan.mem_high != 1) && job->plan.mode != HP_PLAN_AUTO)
        return hp_errf(err, HP_UNSUPPORTED,
                       "plan.param_memory_budget: (%g, %g) is only honoured by auto-sharding "
                       "(plan.mode auto); remove it or plan with --mode auto",
                       job->plan.mem_low, job->plan.mem_high);
    hp_pass_ctx probe = {.job = job, .world = world};
    HP_TRY(hp_plan_check_precision(job->plan.param_dtype, job->plan.reduce_dtype, err));
    if (mixed_on(&probe)) {
        const hp__pass_entry *mp = hp__pass_find("mixed_precision");
        if (mp && !pass_on(mp, &probe))
            return hp_errf(err, HP_INVALID,
                           "passes: mixed_precision is switched off but the plan sets "
                           "param_dtype %s; drop the switch or the policy",
                           hp_dtype_name(job->plan.param_dtype));
    }
    bool has_dp = false; /* FSDP in the placement passes shards over the mesh dim "dp" */
    for (int d = 0; d < job->plan.n_mesh && d < HP_MESH_MAX_DIMS; d++)
        has_dp |= !strcmp(job->plan.mesh[d].name, "dp");
    /* a dim that splits nothing (not dp, no placement on it) would have its ranks repeat each
     * other's work: refused rather than run redundantly (auto-sharding places every dim) */
    bool check_dims = placed(&probe) && job->plan.mode != HP_PLAN_AUTO;
    for (int d = 0; check_dims && d < job->plan.n_mesh && d < HP_MESH_MAX_DIMS; d++) {
        bool used = !strcmp(job->plan.mesh[d].name, "dp") || job->plan.mesh[d].size == 1;
        for (int k = 0; !used && k < job->plan.n_constraints; k++)
            used = d < job->plan.constraints[k].n_placements &&
                   job->plan.constraints[k].placements[d].kind != HP_PLACE_REPLICATE;
        if (!used)
            return hp_errf(err, HP_UNSUPPORTED,
                           "plan (mesh %s): nothing is split over mesh dim '%s' (%d ranks), so "
                           "its ranks would repeat each other's work; place parameters on it "
                           "(--tp-plan llama, --place PATTERN=%s:S(d)), or drop it",
                           mesh, job->plan.mesh[d].name, job->plan.mesh[d].size,
                           job->plan.mesh[d].name);
    }
    if (placed(&probe) && (job->plan.n_fsdp_fqns || job->plan.n_fsdp_patterns) && !has_dp)
        return hp_errf(err, HP_UNSUPPORTED,
                       "plan (mesh %s): FSDP marks shard parameters over the mesh dim named dp, "
                       "which this mesh has none of; name the data-parallel dim dp or drop "
                       "--fsdp",
                       mesh);
    for (int k = 0; k < job->plan.n_constraints; k++)
        if (!job->plan.constraints[k].input_fqn)
            return hp_errf(err, HP_UNSUPPORTED,
                           "plan.constraints[%d]: a constraint on graph output %d is not applied "
                           "yet (outputs take the loss Replicate, each gradient its parameter's "
                           "placements); remove it",
                           k, job->plan.constraints[k].output);
    if (placed(&probe)) return HP_OK; /* the placement pass checks every split */
    if (!fsdp || world == 1) return HP_OK;
    hp_graph_inputs in = hp_graph_count_inputs(g);
    for (int i = in.n_params + in.n_buffers; i < in.n_params + in.n_buffers + in.n_data; i++) {
        const hp_node *n = &g->nodes[i];
        const hp_attr *fqn = hp_node_attr(n, HP_ATTR_FQN);
        if (n->out[0].rank >= 1 && n->out[0].shape[0] % world)
            return hp_errf(err, HP_INVALID,
                           "data input '%s': batch %lld is not divisible by world %d (FSDP "
                           "splits the batch over the ranks)",
                           fqn ? fqn->s : "?", (long long)n->out[0].shape[0], world);
    }
    return HP_OK;
}

/* ---- hp_compile ----------------------------------------------------------------------------- */

typedef struct compile_state {
    hp_compiled *c;
    hp_pass_ctx *ctx;
    dumper dump;
    bool verify;
} compile_state;

/* Runs the table over *g (replaced by each pass's output; the caller's graph is never freed
 * here when owned is false). */
static hp_status run_passes(compile_state *s, hp_graph **g, bool *owned, hp_err *err) {
    hp_compiled *c = s->c;
    for (int i = 0; i < N_PASSES; i++) {
        const hp__pass_entry *e = &pipeline[i];
        hp_pass_report *r = &c->passes[c->n_passes++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", e->name);
        r->nodes_in = (*g)->n_nodes;
        if (!pass_on(e, s->ctx)) {
            same_count(c, r, *g);
            continue;
        }
        s->ctx->report = r;
        /* a graph of the compile's own is lent to the pass: nodes it leaves as they were
         * share their types and attributes with it instead of copying them */
        if (*owned) (*g)->lends = true; /* (never the job's graph, which outlives no compile) */
        hp_graph *next = NULL;
        double t0 = now_s();
        bool no_op = e->no_op && e->no_op(*g);
        hp_status st = no_op ? HP_OK : e->fn(*g, s->ctx, &next, err);
        r->seconds = now_s() - t0;
        s->ctx->report = NULL;
        if (st != HP_OK) {
            hp_graph_free(next);
            hp_err_prefix(err, "%s", e->name);
            return st;
        }
        if (!next && !no_op)
            return hp_errf(err, HP_INTERNAL, "%s: the pass returned no graph", e->name);
        r->ran = true;
        if (no_op) { /* the input, verified already, goes on */
            same_count(c, r, *g);
            HP_TRY(dump_graph(&s->dump, i + 1, e->name, *g, err));
            continue;
        }
        if (*owned) { /* its storage lives on in the output, which may point there */
            hp_graph_adopt_storage(next, *g);
            hp_graph_free(*g);
        }
        *g = next;
        *owned = true;
        count(*g, r);
        if (s->verify && (st = hp_graph_verify(*g, err)) != HP_OK) {
            hp_err_prefix(err, "after %s", e->name);
            return st;
        }
        HP_TRY(dump_graph(&s->dump, i + 1, e->name, *g, err));
    }
    return HP_OK;
}

static hp_status lower(compile_state *s, const hp_graph *g, hp_err *err) {
    hp_compiled *c = s->c;
    hp_pass_report *r = &c->passes[c->n_passes++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "lower");
    r->nodes_in = g->n_nodes;
    double t0 = now_s();
    /* with the verifier on, the last pass's output (or the input) was just verified */
    hp_status st = hp__lower(g, s->verify, &c->program, err);
    if (st == HP_OK && c->program->world == 1 && c->world > 1) { /* replicated on every rank */
        c->program->world = c->world;
        hp__program_mesh_init(c->program);
    }
    for (int d = 0; st == HP_OK && d < c->program->mesh.ndim; d++) /* the job's links */
        for (int k = 0; k < s->ctx->job->plan.n_mesh; k++) {
            const hp_mesh_dim *md = &s->ctx->job->plan.mesh[k];
            bool same = !strcmp(md->name, c->program->mesh.name[d]) ||
                        (c->program->graph->mesh.ndim == 0 && s->ctx->job->plan.n_mesh == 1);
            if (!same) continue;
            c->program->link_bandwidth[d] = md->link.bandwidth;
            c->program->link_latency[d] = md->link.latency;
        }
    /* like the passes' outputs: checked when verifying (debug builds, the tests); a worker
     * verifies every program it is sent (hp_program_decode) */
    if (st == HP_OK && s->verify) st = hp__program_verify(c->program, true, err);
    r->seconds = now_s() - t0;
    if (st != HP_OK) {
        hp_err_prefix(err, "lower");
        return st;
    }
    r->ran = true;
    count(g, r);
    r->nodes_out = c->program->n_instrs; /* for the lowering: instructions */
    return dump_program(&s->dump, N_PASSES + 1, c->program, err);
}

static hp_status compile(const hp_job *job, int world, hp_compiled **out, hp_err *err);

/* plan.ac_mode auto: none first (the common case: it fits, one compile); else every candidate,
 * keeping the shortest estimated step that fits, or, when none does, the smallest. */
static const struct {
    hp_ac_mode mode;
    int every;
} ac_candidates[] = {
    {HP_AC_NONE, 1}, {HP_AC_SELECTIVE, 1}, {HP_AC_FULL, 4}, {HP_AC_FULL, 2}, {HP_AC_FULL, 1}};

static bool ac_fits(const hp_compiled *c) {
    return !(c->cost.mem_capacity > 0) ||
           (double)c->memory.total <= HP_AC_AUTO_MEMORY_FRACTION * c->cost.mem_capacity;
}

static bool ac_better(const hp_compiled *a, const hp_compiled *best) {
    if (!best) return true;
    bool fa = ac_fits(a), fb = ac_fits(best);
    if (fa != fb) return fa;
    return fa ? a->cost.step_s < best->cost.step_s : a->memory.total < best->memory.total;
}

static hp_status compile_auto(const hp_job *job, int world, hp_compiled **out, hp_err *err) {
    hp_job each = *job; /* read-only: the copy shares the job's graph and arrays */
    hp_compiled *best = NULL;
    hp_status st = HP_OK;
    for (size_t k = 0; k < HP_ARRAY_LEN(ac_candidates) && st == HP_OK; k++) {
        each.plan.ac_mode = ac_candidates[k].mode;
        each.plan.ac_every = ac_candidates[k].every;
        hp_compiled *c = NULL;
        if ((st = compile(&each, world, &c, err)) != HP_OK) break;
        if (ac_better(c, best)) {
            hp_compiled_free(best);
            best = c;
        } else {
            hp_compiled_free(c);
        }
        if (k == 0 && ac_fits(best)) break;
    }
    if (st != HP_OK) {
        hp_compiled_free(best);
        return st;
    }
    best->ac_auto = true;
    best->ac_fits = ac_fits(best);
    if (!best->ac_fits && best->n_warnings < HP_MAX_WARNINGS)
        snprintf(best->warnings[best->n_warnings++], HP_ERR_MSG_MAX,
                 "activation_checkpoint: auto: no mode fits %.0f%% of the %s profile's %.1f GiB a "
                 "rank; the smallest, %s every %d, needs %.1f GiB (shard more, or a smaller batch)",
                 100 * HP_AC_AUTO_MEMORY_FRACTION, best->cost.profile,
                 best->cost.mem_capacity / 1073741824.0, hp_ac_mode_name(best->ac_mode),
                 best->ac_every, (double)best->memory.total / 1073741824.0);
    *out = best;
    return HP_OK;
}

hp_status hp_compile(const hp_job *job, int world, hp_compiled **out, hp_err *err) {
    hp_arena_cache_begin(); /* each pass's input graph's chunks go to the next pass's graph */
    hp_status st = job->plan.ac_mode == HP_AC_AUTO ? compile_auto(job, world, out, err)
                                                   : compile(job, world, out, err);
    hp_arena_cache_end();
    return st;
}

static hp_status compile(const hp_job *job, int world, hp_compiled **out, hp_err *err) {
    *out = NULL;
    if (world <= 0) world = job->resources.world_size;
    hp_compiled *c = hp_calloc(1, sizeof *c);
    hp_pass_ctx *ctx = hp_calloc(1, sizeof *ctx);
    hp_graph *g = job->graph;
    bool owned = false;
    hp_status st = HP_OK;
    if (!c || !ctx) {
        st = hp_errf(err, HP_NOMEM, "out of memory compiling");
        goto fail;
    }
    c->world = world;
    c->ac_mode = job->plan.ac_mode;
    c->ac_every = job->plan.ac_every;
    *ctx = (hp_pass_ctx){.job = job, .world = world};
    if (!g) {
        if ((st = hp_model_build_joint(&job->model, &g, err)) != HP_OK) goto fail;
        owned = true;
    }
    if ((st = hp_graph_verify(g, err)) != HP_OK) {
        hp_err_prefix(err, "the job's graph");
        goto fail;
    }
    const char *dir = getenv("HP_DUMP_DIR");
    compile_state s = {.c = c,
                       .ctx = ctx,
                       .dump = {&job->passes, getenv("HP_DUMP"), dir && *dir ? dir : "."},
                       .verify = verify_between_passes()};
    if ((st = check_world(job, world, g, pass_on(hp__pass_find("fsdp"), ctx), err)) != HP_OK)
        goto fail;
    for (int i = 0; i < job->passes.n_switches; i++)
        if (!hp__pass_find(job->passes.switches[i].name))
            hp_pass_warn(ctx, "passes: the switch '%s' names no pass",
                         job->passes.switches[i].name);
    const hp_plan *plan = &job->plan;
    if (!plan->reshard_after_forward &&
        (world == 1 || (!plan->n_fsdp_fqns && !plan->n_fsdp_patterns && !plan->n_constraints &&
                        plan->mode != HP_PLAN_AUTO)))
        hp_pass_warn(ctx,
                     "plan: reshard_after_forward off (--no-reshard-after-forward) changes "
                     "nothing: no parameter is sharded (%s)",
                     world == 1 ? "world 1" : "no --fsdp marks");
    for (int i = 0; i < job->passes.n_dump; i++)
        if (!known_dump_name(job->passes.dump[i]))
            hp_pass_warn(ctx, "passes: the dump list names '%s', which is no pass",
                         job->passes.dump[i]);
    if ((st = dump_graph(&s.dump, 0, "input", g, err)) != HP_OK) goto fail;
    if ((st = run_passes(&s, &g, &owned, err)) != HP_OK) goto fail;
    if (owned) g->lends = true; /* the program's graph shares the compiled graph's storage */
    st = lower(&s, g, err);
    if (owned) g->lends = false; /* a rewrite of the compiled graph outside a compile copies */
    if (st != HP_OK) goto fail;
    hp__memory_report(g, c->program, hp_job_grad_accum(job), &c->memory);
    if ((st = hp__cost_estimate(g, c->program, job, &c->cost, err)) != HP_OK) goto fail;
    if (!owned && !(g = hp_graph_clone(g))) {
        st = hp_errf(err, HP_NOMEM, "out of memory compiling");
        goto fail;
    }
    c->graph = g;
    c->autoshard = ctx->autoshard;
    ctx->autoshard = NULL;
    c->n_warnings = ctx->n_warnings;
    memcpy(c->warnings, ctx->warnings, sizeof c->warnings);
    hp_free(ctx);
    *out = c;
    return HP_OK;
fail:
    if (owned) hp_graph_free(g);
    if (ctx) hp_autoshard_free(ctx->autoshard);
    hp_free(ctx);
    hp_compiled_free(c);
    return st;
}

void hp_compiled_free(hp_compiled *c) {
    if (!c) return;
    hp_arena_cache_begin(); /* its pages are kept for the next compile (graph/base.c) */
    hp_graph_free(c->graph);
    hp_program_free(c->program);
    hp_autoshard_free(c->autoshard);
    hp_free(c);
    hp_arena_cache_end();
}
