/* client/hpctl_plan.c — `hpctl plan JOB.pb [--world N] [--json]`: compiles a job offline
 * (hp_compile: the whole pass pipeline and the lowering) and prints what a run would do per
 * rank — the pass table, warnings, memory, communication per step and the cost model's step
 * estimate with its assumptions — without launching anything. */
#include "client/hpctl.h"

#include "hp/autoshard.h"
#include "hp/device.h"
#include "hp/job.h"
#include "hp/passes.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cost model's assumptions, as passes/cost.c implements them. */
static const char *const assumptions[] = {
    "one cost model, auto-sharding's (docs/autoshard.md), on the job's device profile (cpu: this "
    "machine's figures from `hp-worker --probe-profile`, else assumed; h100, h200, a100, b200: "
    "planning figures)",
    "a kernel costs the larger of its FLOPs / (peak x efficiency) and its bytes / memory "
    "bandwidth, plus a launch; views are free. FLOPs: 2*M*N*K per mm/addmm (x batch for bmm), "
    "4*B*H*T*S*D per attention forward, 8*B*H*T*S*D per attention backward (causal masking not "
    "discounted)",
    "a collective costs the link latency + its bytes / the link bandwidth of its mesh dim's link "
    "class (intra- or inter-node by --gpus-per-node)",
    "communication bytes per rank per step: all-gather receives (N-1)/N of its output, "
    "reduce-scatter sends (N-1)/N of its input, all-reduce 2(N-1)/N of its tensor",
    "one compute and one comm stream in graph order; a wait_tensor stalls compute until its "
    "collective is done, and that stall is the exposed communication",
    "the optimizer: AdamW over the local parameters at memory bandwidth (28 bytes an element, "
    "2 more where it rewrites a bf16 parameter copy: those casts are not in the step)",
    "memory: parameters and gradients at their local (sharded) size, AdamW's two f32 moments "
    "per local element, activations as the liveness-planned arena",
    "gradient accumulation (--global-batch): a step runs the program once per micro-step, "
    "collectives included, and adds up all but the last micro-step's gradients in one f32 "
    "buffer (12 bytes an element per addition, at memory bandwidth)",
    "evaluation (--eval-interval): an evaluated batch runs the nodes the loss depends on, its "
    "collectives not overlapped with compute",
};
/* 34884612 -> "33.3 MiB" */
static const char *human(int64_t bytes, char *buf) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return buf;
}
#define HUMAN(b) human((b), (char[32]){0})

static const char *seconds(double s, char *buf) {
    if (s >= 1)
        snprintf(buf, 32, "%.3g s", s);
    else if (s >= 1e-3)
        snprintf(buf, 32, "%.3g ms", s * 1e3);
    else
        snprintf(buf, 32, "%.3g us", s * 1e6);
    return buf;
}
#define SECONDS(s) seconds((s), (char[32]){0})

/* Collectives of the final graph by op: count and bytes. */
typedef struct comm_kind {
    int count;
    int64_t bytes;
    unsigned dtypes; /* 1 << dtype of each one's input (mixed precision shows here) */
} comm_kind;

static void comm_by_kind(const hp_graph *g, comm_kind *k) {
    memset(k, 0, sizeof(comm_kind) * HP_OP_COUNT);
    for (int i = 0; i < g->n_nodes; i++) {
        if (!(hp_op_get(g->nodes[i].op)->flags & HP_OPF_COLLECTIVE)) continue;
        k[g->nodes[i].op].count++;
        k[g->nodes[i].op].bytes += hp_collective_bytes(g, i);
        k[g->nodes[i].op].dtypes |= 1u << hp_graph_type(g, g->nodes[i].in[0])->dtype;
    }
}

/* "bf16", "f32+bf16": the dtypes a comm_kind moved. */
static const char *dtypes_text(unsigned m, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (int dt = 0; dt < HP_DTYPE_COUNT; dt++)
        if (m & (1u << dt) && at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? "+" : "",
                                   hp_dtype_name((hp_dtype)dt));
    return buf;
}

/* A parameter's placement on each mesh dim of the plan, from the compiled graph: the value's
 * own placements when the graph carries them; else (1-D FSDP) Shard(0) on the group its
 * shard was made over, Replicate elsewhere. */
static void param_placements(const hp_job *job, const hp_graph *g, int node, hp_placement *pl) {
    const hp_node *n = &g->nodes[node];
    const hp_placement *own = hp_value_placements(g, (hp_value){node, 0});
    const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
    bool sharded = hp_node_attr(n, HP_ATTR_GLOBAL_SHAPE) != NULL;
    for (int d = 0; d < job->plan.n_mesh; d++) {
        pl[d] = HP_REPLICATE;
        if (own && d < g->mesh.ndim)
            pl[d] = own[d];
        else if (sharded && (job->plan.n_mesh == 1 ||
                             (grp && grp->s && !strcmp(grp->s, job->plan.mesh[d].name))))
            pl[d] = HP_SHARD(0);
    }
}

static void placements_text(const hp_job *job, const hp_placement *pl, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (int d = 0; d < job->plan.n_mesh && at < len; d++) {
        char w[24];
        at += (size_t)snprintf(buf + at, len - at, "%s%s:%s", d ? ", " : "", job->plan.mesh[d].name,
                               hp_placement_short(&pl[d], w, sizeof w));
    }
}

/* The collectives of the final graph per mesh dim (their group; a 1-D mesh's unnamed ones
 * belong to its dim) and op. */
typedef struct comm_dim {
    comm_kind op[HP_OP_COUNT];
} comm_dim;

static void comm_by_dim(const hp_job *job, const hp_graph *g, comm_dim *out) {
    memset(out, 0, sizeof(comm_dim) * HP_MESH_MAX_DIMS);
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        if (!(hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE)) continue;
        const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
        int d = 0;
        for (int k = 0; grp && grp->s && k < job->plan.n_mesh; k++)
            if (!strcmp(grp->s, job->plan.mesh[k].name)) d = k;
        out[d].op[n->op].count++;
        out[d].op[n->op].bytes += hp_collective_bytes(g, i);
    }
}

/* "  - text", wrapped at 96 columns with a hanging indent. */
static void print_wrapped(const char *text) {
    const char *p = text, *lead = "  - ";
    while (*p) {
        size_t len = strlen(p), cut = len;
        if (len > 92) {
            cut = 92;
            while (cut > 0 && p[cut] != ' ') cut--;
            if (cut == 0) cut = 92;
        }
        printf("%s%.*s\n", lead, (int)cut, p);
        p += cut;
        while (*p == ' ') p++;
        lead = "    ";
    }
}

static void print_autoshard(const hp_job *job, const hp_autoshard *a) {
    const hp_autoshard_stats *st = hp_autoshard_get_stats(a);
    hp_device_profile prof;
    hp_err e = {0};
    hp_device_profile_for_job(job, &prof, &e);
    double comp, comm, opt;
    hp_autoshard_breakdown(a, &comp, &comm, &opt);
    printf("\nauto-sharding (plan.mode auto) on profile %s%s\n", prof.name,
           !strcmp(prof.name, "cpu") && !prof.measured
               ? " (assumed figures: `hp-worker --probe-profile` measures this machine)"
               : "");
    printf("  %d nodes in %d classes, %d strategies; ILP %d variables (%d binary), %d "
           "constraints; LP relaxation by %s\n",
           st->nodes, st->classes, st->strategies, st->variables, st->binaries, st->constraints,
           !strcmp(st->lp_solver, "glpk") ? "GLPK (Clp failed)" : "Clp's dual simplex");
    printf("  enumerate %s, build %s, solve %s, apply %s; %s, gap %.3g%%\n",
           SECONDS(st->enumerate_s), SECONDS(st->build_s), SECONDS(st->solve_s),
           SECONDS(st->apply_s),
           st->optimal        ? "optimal"
           : st->time_limited ? "time limit"
                              : "feasible",
           st->gap * 100);
    printf("  modelled step %s = compute %s + redistribution %s + optimizer %s\n",
           SECONDS(st->objective_s), SECONDS(comp), SECONDS(comm), SECONDS(opt));
    if (st->refolded)
        printf("  every node decided its placement: with views and one-input elementwise ops "
               "following their inputs, no plan was found\n");
}

/* The estimate's compute by op, dearest first: its kernels, roofline time and share, the rate
 * its FLOPs run at and the bytes it moves (the floor a device profile measures against). */
static void print_compute_by_op(const hp_cost_estimate *e) {
    int order[HP_OP_COUNT], n = 0;
    for (int op = 0; op < HP_OP_COUNT; op++)
        if (e->by_op[op].count) order[n++] = op;
    for (int i = 1; i < n; i++) /* insertion sort by time, ties by op: a stable listing */
        for (int j = i; j > 0 && e->by_op[order[j]].seconds > e->by_op[order[j - 1]].seconds; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    if (!n || e->compute_s <= 0) return;
    printf("            compute by op (roofline):\n");
    int shown = n > 10 ? 9 : n;
    for (int i = 0; i < shown; i++) {
        int op = order[i];
        double t = e->by_op[op].seconds, f = e->by_op[op].flops;
        printf("              %-44s %5d  %9s  %5.1f%%", hp_op_get((hp_op)op)->name,
               e->by_op[op].count, SECONDS(t), 100 * t / e->compute_s);
        if (f > 0) printf("  %.3g TFLOP", f / 1e12);
        printf("  %s\n", HUMAN((int64_t)e->by_op[op].bytes));
    }
    if (shown < n) {
        double t = 0, b = 0;
        int k = 0;
        for (int i = shown; i < n; i++)
            t += e->by_op[order[i]].seconds, b += e->by_op[order[i]].bytes,
                k += e->by_op[order[i]].count;
        char what[40];
        snprintf(what, sizeof what, "(%d other ops)", n - shown);
        printf("              %-44s %5d  %9s  %5.1f%%  %s\n", what, k, SECONDS(t),
               100 * t / e->compute_s, HUMAN((int64_t)b));
    }
}

/* What a rank's memory needs against what the profile's device holds; over it, what the
 * activation checkpointing modes (every block) would need where that is less (each compiled
 * here). */
typedef struct mem_fit {
    double capacity; /* bytes; 0: unknown */
    bool over;
    int64_t with_ac[3]; /* total under each hp_ac_mode; 0: not compiled */
} mem_fit;

static void fit_memory(hp_job *job, int world, const hp_compiled *c, mem_fit *f) {
    *f = (mem_fit){.capacity = c->cost.mem_capacity};
    f->over = f->capacity > 0 && (double)c->memory.total > f->capacity;
    if (!f->over || c->ac_auto) return; /* auto compiled them all already */
    hp_ac_mode mine = job->plan.ac_mode;
    int every = job->plan.ac_every;
    for (int m = HP_AC_FULL; m <= HP_AC_SELECTIVE; m++) {
        if ((m == (int)mine && every == 1) || (mine == HP_AC_FULL && every == 1)) continue;
        job->plan.ac_mode = (hp_ac_mode)m;
        job->plan.ac_every = 1;
        hp_compiled *alt = NULL;
        hp_err e = {0};
        if (hp_compile(job, world, &alt, &e) == HP_OK && alt->memory.total < c->memory.total)
            f->with_ac[m] = alt->memory.total; /* only what would help */
        hp_compiled_free(alt);
    }
    job->plan.ac_mode = mine;
    job->plan.ac_every = every;
}

static void print_fit(const hp_compiled *c, const mem_fit *f) {
    if (c->ac_auto) {
        printf("  --ac auto chose %s", hp_ac_mode_name(c->ac_mode));
        if (c->ac_mode != HP_AC_NONE && c->ac_every > 1) printf(" every %d-th block", c->ac_every);
        if (c->ac_fits)
            printf(": the shortest estimated step within %.0f%% of the %s profile's %s\n",
                   100 * HP_AC_AUTO_MEMORY_FRACTION, c->cost.profile,
                   HUMAN((int64_t)c->cost.mem_capacity));
        else
            printf(": nothing fits within %.0f%% of the %s profile's %s; this needs the least\n",
                   100 * HP_AC_AUTO_MEMORY_FRACTION, c->cost.profile,
                   HUMAN((int64_t)c->cost.mem_capacity));
    }
    if (!(f->capacity > 0)) return;
    bool cpu = !strcmp(c->cost.profile, "cpu");
    printf("  device       %12s   %s: %.0f%% used\n", HUMAN((int64_t)f->capacity),
           cpu ? "a rank's share of this host's RAM" : "the profile's GPU memory",
           100.0 * (double)c->memory.total / f->capacity);
    if (!f->over) return;
    printf("note: a rank needs %s, more than the %s device holds (%s)", HUMAN(c->memory.total),
           c->cost.profile, HUMAN((int64_t)f->capacity));
    const char *sep = "; activation checkpointing would need: ";
    for (int m = HP_AC_FULL; m <= HP_AC_SELECTIVE; m++) {
        int k = m == HP_AC_FULL ? HP_AC_SELECTIVE : HP_AC_FULL; /* selective first */
        if (!f->with_ac[k]) continue;
        printf("%s--ac %s %s%s", sep, hp_ac_mode_name((hp_ac_mode)k), HUMAN(f->with_ac[k]),
               (double)f->with_ac[k] > f->capacity ? " (over too)" : "");
        sep = ", ";
    }
    printf("; sharding more (--fsdp, a larger dp) or a smaller --batch also helps\n");
}

static void print_text(const hp_job *job, const hp_compiled *c, const mem_fit *fit) {
    if (job->model.family[0])
        printf("job         %s (%s:%s), world %d, mesh", job->name, job->model.family,
               job->model.flavor, c->world);
    else /* a job built from a graph (hpctl new --graph) */
        printf("job         %s (graph), world %d, mesh", job->name, c->world);
    for (int d = 0; d < job->plan.n_mesh; d++)
        printf("%s%s=%d (%.3g GB/s, %.3g us)", d ? ", " : " ", job->plan.mesh[d].name,
               job->plan.mesh[d].size, job->plan.mesh[d].link.bandwidth / 1e9,
               job->plan.mesh[d].link.latency * 1e6);
    printf(", device %s\n", hp_device_name(job->resources.device));
    printf("precision   param %s (all-gathers and compute), reduce %s (gradients); master "
           "weights and AdamW state f32\n",
           hp_dtype_name(job->plan.param_dtype), hp_dtype_name(job->plan.reduce_dtype));
    hp_err derr = {0};
    if (hp_device_built(job->resources.device, &derr) != HP_OK) /* priced, but not runnable */
        printf("note: %s: hpd and hp-worker of this build refuse the job\n", derr.msg);
    printf("\n");

    printf("%-22s %-4s %9s %11s %12s %16s %10s\n", "pass", "ran", "nodes in", "nodes out",
           "collectives", "comm/step/rank", "time");
    for (int i = 0; i < c->n_passes; i++) {
        const hp_pass_report *r = &c->passes[i];
        bool lower = !strcmp(r->name, "lower");
        char out[32];
        snprintf(out, sizeof out, lower ? "%d instr" : "%d", r->nodes_out);
        printf("%-22s %-4s %9d %11s %12d %16s %10s\n", r->name, r->ran ? "yes" : "no", r->nodes_in,
               out, r->collectives, HUMAN(r->comm_bytes), r->ran ? SECONDS(r->seconds) : "-");
    }
    for (int i = 0; i < c->n_passes; i++) {
        const hp_pass_report *r = &c->passes[i];
        if (r->fused_attention || r->fused_attention_backward)
            printf("%s: fused %d causal attention%s and %d backward%s into "
                   "_scaled_dot_product_flash_attention\n",
                   r->name, r->fused_attention, r->fused_attention == 1 ? "" : "s",
                   r->fused_attention_backward, r->fused_attention_backward == 1 ? "" : "s");
        if (r->fused_cross_entropy)
            printf("%s: fused %d loss%s (_log_softmax, nll_loss and their backwards) into "
                   "fused_cross_entropy\n",
                   r->name, r->fused_cross_entropy, r->fused_cross_entropy == 1 ? "" : "es");
        if (r->fused_swiglu)
            printf("%s: fused %d MLP gate%s (silu, mul and their backwards) into swiglu\n", r->name,
                   r->fused_swiglu, r->fused_swiglu == 1 ? "" : "s");
        if (r->ac_blocks)
            printf("%s: the backward recomputes %d block%s' forward (%s): %d node%s, %.3g %s "
                   "a micro-step\n",
                   r->name, r->ac_blocks, r->ac_blocks == 1 ? "" : "s", hp_ac_mode_name(c->ac_mode),
                   r->ac_recomputed, r->ac_recomputed == 1 ? "" : "s",
                   r->ac_recompute_flops / (r->ac_recompute_flops >= 1e11 ? 1e12 : 1e9),
                   r->ac_recompute_flops >= 1e11 ? "TFLOP" : "GFLOP");
        if (r->placed_by_spmd[0])
            printf("%s: placed by spmd, since the per-rank batch rewrite refuses the graph: %s\n",
                   r->name, r->placed_by_spmd);
    }
    if (c->n_warnings) {
        printf("\nwarnings\n");
        for (int i = 0; i < c->n_warnings; i++) printf("  %s\n", c->warnings[i]);
    }

    const hp_memory_report *m = &c->memory;
    printf("\nmemory per rank\n");
    printf("  params       %12s   local shards as the compiled graph declares them\n",
           HUMAN(m->params));
    printf("  grads        %12s\n", HUMAN(m->grads));
    printf("  optimizer    %12s   AdamW: two f32 moments per local element\n", HUMAN(m->optimizer));
    if (m->param_copies)
        printf("  param copies %12s   param_dtype copies the optimizer rewrites\n",
               HUMAN(m->param_copies));
    if (m->grad_accum)
        printf("  grad accum   %12s   the micro-steps' gradients added up (f32)\n",
               HUMAN(m->grad_accum));
    printf("  activations  %12s   liveness-planned arena\n", HUMAN(m->activations));
    printf("  comm         %12s\n", HUMAN(m->comm));
    printf("  total        %12s\n", HUMAN(m->total));
    print_fit(c, fit);

    const hp_program *prog = c->program;
    printf("\nparameters (%d): placements and local shape per rank\n", prog->n_params);
    for (int i = 0; i < prog->n_params; i++) {
        const hp_param_slot *ps = &prog->params[i];
        hp_placement pl[HP_MESH_MAX_DIMS];
        char where[96], gl[96], lo[96];
        param_placements(job, c->graph, ps->node, pl);
        placements_text(job, pl, where, sizeof where);
        const hp_type *local = prog->buffers[ps->buffer].type;
        printf("  %-40s %-16s {%s} -> %-16s %10s\n", ps->fqn,
               hp_type_str(&ps->global, gl, sizeof gl), where, hp_type_str(local, lo, sizeof lo),
               HUMAN(hp_type_numel(local) * (int64_t)hp_dtype_size(local->dtype)));
    }

    comm_kind k[HP_OP_COUNT];
    comm_by_kind(c->graph, k);
    comm_dim dims[HP_MESH_MAX_DIMS];
    comm_by_dim(job, c->graph, dims);
    const hp_pass_report *last = &c->passes[c->n_passes - 1];
    for (int d = 0; d < job->plan.n_mesh; d++) {
        printf("\ncommunication on mesh dim %s (%d ranks):", job->plan.mesh[d].name,
               job->plan.mesh[d].size);
        bool any = false;
        for (int op = 0; op < HP_OP_COUNT; op++) {
            if (!dims[d].op[op].count) continue;
            printf("%s %s x%d %s", any ? "," : "", hp_op_get((hp_op)op)->name, dims[d].op[op].count,
                   HUMAN(dims[d].op[op].bytes));
            any = true;
        }
        printf("%s", any ? "\n" : " none\n");
    }
    printf("\ncommunication per %s per rank: %s in %d collectives",
           c->cost.grad_accum > 1 ? "micro-step" : "step", HUMAN(last->comm_bytes),
           last->collectives);
    const char *sep = " (";
    for (int op = 0; op < HP_OP_COUNT; op++) {
        if (!k[op].count) continue;
        char dts[48];
        printf("%s%s %d: %s %s", sep, hp_op_get((hp_op)op)->name, k[op].count, HUMAN(k[op].bytes),
               dtypes_text(k[op].dtypes, dts, sizeof dts));
        sep = ", ";
    }
    printf("%s\n", strcmp(sep, ", ") ? "" : ")");

    const hp_cost_estimate *e = &c->cost;
    double hidden = e->comm_s > 0 ? 100 * (1 - e->exposed_comm_s / e->comm_s) : 100;
    if (e->grad_accum > 1)
        printf("\nestimate    step %s = %lld micro-steps x (compute %s + exposed comm %s) + "
               "accumulation %s + optimizer %s",
               SECONDS(e->step_s), (long long)e->grad_accum, SECONDS(e->compute_s),
               SECONDS(e->exposed_comm_s), SECONDS(e->accumulate_s), SECONDS(e->optimizer_s));
    else
        printf("\nestimate    step %s = compute %s + exposed comm %s + optimizer %s",
               SECONDS(e->step_s), SECONDS(e->compute_s), SECONDS(e->exposed_comm_s),
               SECONDS(e->optimizer_s));
    if (e->comm_s > 0) printf(" (comm %s in all, %.0f%% hidden)", SECONDS(e->comm_s), hidden);
    printf("\n            %.4g FLOPs per rank per %s; profile %s%s: %.4g FLOP/s x %.2g "
           "efficiency, memory %.4g B/s\n",
           e->flops, e->grad_accum > 1 ? "micro-step" : "step", e->profile,
           !strcmp(e->profile, "cpu") && !e->profile_measured
               ? " (assumed: `hp-worker --probe-profile` measures it)"
               : "",
           e->peak_flops, e->efficiency, e->mem_bw);
    if (job->train.eval_interval > 0) {
        double ev = (double)job->train.eval_steps * e->forward_s;
        printf("            evaluation every %lld steps: %lld batches x forward %s = %s (%s a step "
               "on average)\n",
               (long long)job->train.eval_interval, (long long)job->train.eval_steps,
               SECONDS(e->forward_s), SECONDS(ev), SECONDS(ev / (double)job->train.eval_interval));
    }
    print_compute_by_op(e);
    if (c->autoshard) print_autoshard(job, c->autoshard);
    printf("\nassumptions\n");
    for (size_t i = 0; i < HP_ARRAY_LEN(assumptions); i++) print_wrapped(assumptions[i]);
}

static int print_json(const hp_job *job, const hp_compiled *c, const mem_fit *fit) {
    json_t *root = json_object(), *passes = json_array(), *warnings = json_array(),
           *mesh = json_array(), *kinds = json_object(), *assume = json_array();
    for (int d = 0; d < job->plan.n_mesh; d++)
        json_array_append_new(
            mesh, json_pack("{s:s, s:i, s:f, s:f}", "name", job->plan.mesh[d].name, "size",
                            job->plan.mesh[d].size, "bandwidth", job->plan.mesh[d].link.bandwidth,
                            "latency", job->plan.mesh[d].link.latency));
    for (int i = 0; i < c->n_passes; i++) {
        const hp_pass_report *r = &c->passes[i];
        json_t *pass = json_pack("{s:s, s:b, s:i, s:i, s:i, s:I, s:f, s:i, s:i, s:i, s:i}", "name",
                                 r->name, "ran", r->ran, "nodes_in", r->nodes_in, "nodes_out",
                                 r->nodes_out, "collectives", r->collectives, "comm_bytes",
                                 (json_int_t)r->comm_bytes, "seconds", r->seconds,
                                 "fused_attention", r->fused_attention, "fused_attention_backward",
                                 r->fused_attention_backward, "fused_cross_entropy",
                                 r->fused_cross_entropy, "fused_swiglu", r->fused_swiglu);
        if (r->placed_by_spmd[0])
            json_object_set_new(pass, "placed_by_spmd", json_string(r->placed_by_spmd));
        if (r->ac_blocks)
            json_object_update_new(pass, json_pack("{s:i, s:i, s:f}", "ac_blocks", r->ac_blocks,
                                                   "ac_recomputed", r->ac_recomputed,
                                                   "ac_recompute_flops", r->ac_recompute_flops));
        json_array_append_new(passes, pass);
    }
    for (int i = 0; i < c->n_warnings; i++)
        json_array_append_new(warnings, json_string(c->warnings[i]));
    comm_kind k[HP_OP_COUNT];
    comm_by_kind(c->graph, k);
    for (int op = 0; op < HP_OP_COUNT; op++) {
        char dts[48];
        if (k[op].count)
            json_object_set_new(kinds, hp_op_get((hp_op)op)->name,
                                json_pack("{s:i, s:I, s:s}", "count", k[op].count, "bytes",
                                          (json_int_t)k[op].bytes, "dtype",
                                          dtypes_text(k[op].dtypes, dts, sizeof dts)));
    }
    for (size_t i = 0; i < HP_ARRAY_LEN(assumptions); i++)
        json_array_append_new(assume, json_string(assumptions[i]));
    json_t *params = json_array(), *by_dim = json_object();
    for (int i = 0; i < c->program->n_params; i++) {
        const hp_param_slot *ps = &c->program->params[i];
        const hp_type *local = c->program->buffers[ps->buffer].type;
        hp_placement pl[HP_MESH_MAX_DIMS];
        param_placements(job, c->graph, ps->node, pl);
        json_t *gshape = json_array(), *lshape = json_array(), *where = json_object();
        for (int d = 0; d < ps->global.rank; d++)
            json_array_append_new(gshape, json_integer(ps->global.shape[d]));
        for (int d = 0; d < local->rank; d++)
            json_array_append_new(lshape, json_integer(local->shape[d]));
        for (int d = 0; d < job->plan.n_mesh; d++) {
            char w[24];
            json_object_set_new(where, job->plan.mesh[d].name,
                                json_string(hp_placement_short(&pl[d], w, sizeof w)));
        }
        int64_t esz = (int64_t)hp_dtype_size(local->dtype);
        json_array_append_new(
            params, json_pack("{s:s, s:o, s:o, s:o, s:I, s:I}", "fqn", ps->fqn, "global_shape",
                              gshape, "local_shape", lshape, "placements", where, "global_bytes",
                              (json_int_t)(hp_type_numel(&ps->global) * esz), "local_bytes",
                              (json_int_t)(hp_type_numel(local) * esz)));
    }
    comm_dim dims[HP_MESH_MAX_DIMS];
    comm_by_dim(job, c->graph, dims);
    for (int d = 0; d < job->plan.n_mesh; d++) {
        json_t *ops = json_object();
        for (int op = 0; op < HP_OP_COUNT; op++)
            if (dims[d].op[op].count)
                json_object_set_new(ops, hp_op_get((hp_op)op)->name,
                                    json_pack("{s:i, s:I}", "count", dims[d].op[op].count, "bytes",
                                              (json_int_t)dims[d].op[op].bytes));
        json_object_set_new(by_dim, job->plan.mesh[d].name, ops);
    }
    json_object_set_new(root, "parameters", params);
    const hp_memory_report *m = &c->memory;
    const hp_cost_estimate *e = &c->cost;
    const hp_pass_report *last = &c->passes[c->n_passes - 1];
    json_object_set_new(root, "job", json_string(job->name));
    json_object_set_new(
        root, "model",
        json_pack("{s:s, s:s}", "family", job->model.family, "flavor", job->model.flavor));
    json_object_set_new(root, "world", json_integer(c->world));
    json_object_set_new(root, "mixed_precision",
                        json_pack("{s:s, s:s}", "param_dtype", hp_dtype_name(job->plan.param_dtype),
                                  "reduce_dtype", hp_dtype_name(job->plan.reduce_dtype)));
    json_object_set_new(root, "device", json_string(hp_device_name(job->resources.device)));
    hp_err derr = {0};
    json_object_set_new(root, "device_runnable",
                        json_boolean(hp_device_built(job->resources.device, &derr) == HP_OK));
    json_object_set_new(root, "mesh", mesh);
    json_object_set_new(root, "passes", passes);
    json_object_set_new(root, "warnings", warnings);
    json_object_set_new(
        root, "memory",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "params", (json_int_t)m->params,
                  "grads", (json_int_t)m->grads, "optimizer", (json_int_t)m->optimizer,
                  "param_copies", (json_int_t)m->param_copies, "grad_accum",
                  (json_int_t)m->grad_accum, "activations", (json_int_t)m->activations, "comm",
                  (json_int_t)m->comm, "total", (json_int_t)m->total));
    json_t *mem = json_object_get(root, "memory");
    if (fit->capacity > 0) {
        json_object_set_new(mem, "device_capacity", json_integer((json_int_t)fit->capacity));
        json_object_set_new(mem, "fits", json_boolean(!fit->over));
    }
    if (c->ac_auto) {
        json_t *ch = json_pack("{s:s, s:i, s:b}", "mode", hp_ac_mode_name(c->ac_mode), "every",
                               c->ac_every, "fits", (int)c->ac_fits);
        json_object_set_new(root, "activation_checkpoint_auto", ch);
    }
    if (fit->with_ac[HP_AC_FULL] || fit->with_ac[HP_AC_SELECTIVE]) {
        json_t *w = json_object();
        for (int k = HP_AC_FULL; k <= HP_AC_SELECTIVE; k++)
            if (fit->with_ac[k])
                json_object_set_new(w, hp_ac_mode_name((hp_ac_mode)k),
                                    json_integer((json_int_t)fit->with_ac[k]));
        json_object_set_new(mem, "total_with_ac", w);
    }
    json_object_set_new(root, "communication",
                        json_pack("{s:I, s:i, s:o, s:o}", "bytes_per_step",
                                  (json_int_t)last->comm_bytes, "collectives", last->collectives,
                                  "by_op", kinds, "by_mesh_dim", by_dim));
    json_t *by_op = json_object();
    for (int op = 0; op < HP_OP_COUNT; op++)
        if (e->by_op[op].count)
            json_object_set_new(by_op, hp_op_get((hp_op)op)->name,
                                json_pack("{s:i, s:f, s:f, s:f}", "kernels", e->by_op[op].count,
                                          "seconds", e->by_op[op].seconds, "flops",
                                          e->by_op[op].flops, "bytes", e->by_op[op].bytes));
    json_object_set_new(root, "estimate",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, "
                                  "s:b, s:o}",
                                  "step_s", e->step_s, "compute_s", e->compute_s, "comm_s",
                                  e->comm_s, "exposed_comm_s", e->exposed_comm_s, "optimizer_s",
                                  e->optimizer_s, "flops", e->flops, "peak_flops", e->peak_flops,
                                  "efficiency", e->efficiency, "memory_bandwidth", e->mem_bw,
                                  "bandwidth", e->bandwidth, "latency", e->latency, "profile",
                                  e->profile, "profile_measured", e->profile_measured,
                                  "compute_by_op", by_op));
    json_t *est = json_object_get(root, "estimate");
    json_object_set_new(est, "grad_accum_steps", json_integer((json_int_t)e->grad_accum));
    json_object_set_new(est, "accumulate_s", json_real(e->accumulate_s));
    json_object_set_new(est, "eval_batch_s", json_real(e->forward_s));
    json_object_set_new(root, "assumptions", assume);
    if (c->autoshard) {
        const hp_autoshard_stats *st = hp_autoshard_get_stats(c->autoshard);
        double comp, comm, opt;
        hp_autoshard_breakdown(c->autoshard, &comp, &comm, &opt);
        hp_device_profile prof;
        hp_err e = {0};
        hp_device_profile_for_job(job, &prof, &e);
        json_object_set_new(
            root, "solver",
            json_pack("{s:s, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:f, s:f, s:f, "
                      "s:f, s:b, s:b, s:b, s:f, s:f, s:f}",
                      "profile", prof.name, "profile_measured", prof.measured, "nodes", st->nodes,
                      "classes", st->classes, "strategies", st->strategies, "variables",
                      st->variables, "binaries", st->binaries, "constraints", st->constraints,
                      "lp_solver", st->lp_solver, "enumerate_s", st->enumerate_s, "build_s",
                      st->build_s, "solve_s", st->solve_s, "apply_s", st->apply_s, "objective_s",
                      st->objective_s, "gap", st->gap, "optimal", st->optimal, "time_limited",
                      st->time_limited, "refolded", st->refolded, "compute_s", comp,
                      "redistribution_s", comm, "optimizer_s", opt));
    }
    int rc = HPCTL_OK;
    if (json_dumpf(root, stdout, JSON_INDENT(2)) != 0)
        rc = hpctl_fail(HPCTL_ERROR, "plan", "cannot write the JSON");
    putchar('\n');
    json_decref(root);
    return rc;
}

static void plan_usage(FILE *f) {
    fputs("usage: hpctl plan JOB.pb [--world N] [--json] [--device-profile P] [--gpus-per-node N]\n"
          "                       [--explain FQN|NODE]\n"
          "\n"
          "Compiles the job offline (every pass, the memory plan, the lowering) and prints the\n"
          "pass table, warnings, per-rank memory, communication per step and the estimated step\n"
          "time with the cost model's assumptions. Nothing is launched.\n"
          "\n"
          "  --world N   compile for N ranks (default: the job's world size); a 1-D mesh is\n"
          "              resized to N, a multi-dimensional one must already multiply to N\n"
          "  --json      the same as JSON, for scripts\n"
          "  --device-profile P  price the plan on cpu, h100, h200, a100 or b200 (default: the "
          "job's)\n"
          "  --gpus-per-node N   ranks per node for the link classes (default: the profile's)\n"
          "  --explain WHAT      plan.mode auto: why parameter/input FQN or node id WHAT got its\n"
          "                      placement (the next best alternatives and their costs)\n",
          f);
}

int hpctl_plan(int argc, char **argv) {
    const char *verb = "plan", *path = NULL, *profile = NULL, *explain = NULL;
    bool json = false;
    int64_t world = 0, gpn = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage(stdout);
            return HPCTL_OK;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--world")) {
            if (i + 1 >= argc) return hpctl_fail(HPCTL_USAGE, verb, "--world: missing value");
            int rc = hpctl_parse_i64(verb, a, argv[++i], 1, HP_MAX_WORLD, &world);
            if (rc != HPCTL_OK) return rc;
        } else if (!strcmp(a, "--device-profile") || !strcmp(a, "--explain")) {
            if (i + 1 >= argc) return hpctl_fail(HPCTL_USAGE, verb, "%s: missing value", a);
            *(!strcmp(a, "--explain") ? &explain : &profile) = argv[++i];
        } else if (!strcmp(a, "--gpus-per-node")) {
            if (i + 1 >= argc) return hpctl_fail(HPCTL_USAGE, verb, "%s: missing value", a);
            int rc = hpctl_parse_i64(verb, a, argv[++i], 1, HP_MAX_WORLD, &gpn);
            if (rc != HPCTL_OK) return rc;
        } else if (a[0] == '-') {
            return hpctl_fail(HPCTL_USAGE, verb, "unknown flag '%s' (try hpctl plan --help)", a);
        } else if (path) {
            return hpctl_fail(HPCTL_USAGE, verb, "one job file at a time ('%s' and '%s')", path, a);
        } else {
            path = a;
        }
    }
    if (!path) return hpctl_fail(HPCTL_USAGE, verb, "which job file? (hpctl plan JOB.pb)");
    hp_job *job = NULL;
    hp_err err = {0};
    if (hp_job_read_file(path, &job, &err) != HP_OK)
        return hpctl_fail(HPCTL_ERROR, verb, "%s", err.msg);
    if (world > 0 && job->plan.n_mesh == 1) { /* what-if: the same plan on N ranks */
        job->plan.mesh[0].size = (int)world;
        job->resources.world_size = (int)world;
    }
    if (profile) {
        hp_device_profile p;
        if (hp_device_profile_get(profile, 0, &p, &err) != HP_OK) {
            hp_job_free(job);
            return hpctl_fail(HPCTL_USAGE, verb, "--device-profile: %s", err.msg);
        }
        snprintf(job->plan.device_profile, sizeof job->plan.device_profile, "%s", profile);
    }
    if (gpn > 0) job->plan.gpus_per_node = (int)gpn;
    hp_compiled *c = NULL;
    int rc = HPCTL_OK;
    if (hp_compile(job, (int)world, &c, &err) != HP_OK) {
        rc = hpctl_fail(HPCTL_ERROR, verb, "%s: %s", path, err.msg);
    } else if (explain) {
        char *text = NULL;
        if (!c->autoshard)
            rc = hpctl_fail(HPCTL_USAGE, verb,
                            "--explain: the job's plan is not auto-sharded (plan.mode auto on "
                            "more than one rank); nothing was chosen to explain");
        else if (hp_autoshard_explain(c->autoshard, explain, &text, &err) != HP_OK)
            rc = hpctl_fail(HPCTL_USAGE, verb, "--explain: %s", err.msg);
        else
            fputs(text, stdout);
        hp_free(text);
    } else {
        mem_fit fit;
        fit_memory(job, (int)world, c, &fit);
        rc = json ? print_json(job, c, &fit) : (print_text(job, c, &fit), HPCTL_OK);
    }
    hp_compiled_free(c);
    hp_job_free(job);
    return rc;
}
