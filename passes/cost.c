/* passes/cost.c — what the compiler reports before anything runs: per-rank memory, the
 * communication volume of each collective, and a cost model of one step.
 *
 * The cost model's assumptions (also printed by `hpctl plan`), on the job's device profile
 * (hp/autoshard.h: h100/h200/a100 figures, or this machine's probed cpu figures), the same
 * model auto-sharding prices its strategies with (docs/autoshard.md):
 *   * compute: each kernel the larger of its FLOPs over peak x efficiency and its bytes (local
 *     inputs read and outputs written) over memory bandwidth, plus a launch. The kernels are
 *     the lowered program's instructions: a view costs nothing unless the lowering
 *     materializes it (a transpose not folded into a GEMM, a slice: a copy of its output). FLOPs:
 *     2*M*N*K per mm/addmm (times the batch for bmm), 4*B*H*T*S*D per attention forward and
 *     8*B*H*T*S*D per attention backward (causal masking not discounted, as torchtitan's
 *     6N + 12LdT convention); a fused attention works them off at the profile's attention
 *     rate (hp_device_profile_attn_rate: its efficiency at the head dim, over the fraction of
 *     pairs a causal mask leaves, since the kernels skip the masked blocks).
 *   * communication: each collective costs the link latency plus its bytes (hp_collective_bytes'
 *     convention) over the bandwidth of its mesh dimension's link class on the profile (its
 *     `group` attribute, else the dim named "dp", else the first).
 *   * schedule: one compute stream and one comm stream, in graph order. A collective starts
 *     when both its input is ready (the compute stream has reached it) and the comm stream is
 *     free; a wait_tensor stalls the compute stream until its collective is done. The stall
 *     is the exposed communication.
 *   * the optimizer: AdamW over the local parameters at memory bandwidth (28 bytes an element,
 *     and 2 more where it rewrites a parameter's bf16 copy; those casts are not the step's).
 *   * gradient accumulation: a step runs the program grad_accum times and adds up all but
 *     the last run's gradients at memory bandwidth (12 bytes an element each).
 *   step time = grad_accum x (compute + exposed communication) + accumulation + optimizer.
 *   * an evaluated batch (forward_s): the nodes the loss depends on, each collective after
 *     the compute before it (hp_exec_forward synchronizes before collectives).
 * It does not model contention between the streams, nor the host's own work per step.
 */
#include "passes/passes_internal.h"
#include "hp/autoshard.h"

#include <stdio.h>
#include <string.h>

static int64_t type_bytes(const hp_type *t) {
    return hp_type_numel(t) * (int64_t)hp_dtype_size(t->dtype);
}

/* bytes * (n - 1) / n without overflow (bytes < 2^53, n <= 2^16) */
static int64_t frac(int64_t bytes, int64_t n) {
    return bytes / n * (n - 1) + bytes % n * (n - 1) / n;
}

int64_t hp_collective_bytes(const hp_graph *g, int id) {
    const hp_node *n = &g->nodes[id];
    if (!(hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE)) return 0;
    int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1);
    if (gs <= 1) return 0;
    switch (n->op) {
    case HP_OP_ALL_GATHER:
        return frac(type_bytes(&n->out[0]), gs);
    case HP_OP_ALL_REDUCE:
        return 2 * frac(type_bytes(&n->out[0]), gs);
    case HP_OP_LOCAL_CHUNK: /* the rank's own chunk: a local copy */
        return 0;
    default: /* reduce_scatter, all_to_all: their input */
        return frac(type_bytes(hp_graph_type(g, n->in[0])), gs);
    }
}

double hp__node_flops(const hp_graph *g, int id) {
    const hp_node *n = &g->nodes[id];
    switch (n->op) {
    case HP_OP_MM:
    case HP_OP_ADDMM: {
        const hp_type *a = hp_graph_type(g, n->in[n->op == HP_OP_ADDMM ? 1 : 0]);
        return 2.0 * (double)n->out[0].shape[0] * (double)n->out[0].shape[1] * (double)a->shape[1];
    }
    case HP_OP_BMM: {
        const hp_type *a = hp_graph_type(g, n->in[0]);
        return 2.0 * (double)hp_type_numel(&n->out[0]) * (double)a->shape[2];
    }
    case HP_OP_SDPA:
    case HP_OP_SDPA_BACKWARD: {
        int q = n->op == HP_OP_SDPA ? 0 : 1; /* the backward's inputs start with grad_out */
        const hp_type *qt = hp_graph_type(g, n->in[q]), *kt = hp_graph_type(g, n->in[q + 1]);
        double f = (double)hp_type_numel(qt) * (double)kt->shape[2]; /* B*H*T*D * S */
        return (n->op == HP_OP_SDPA ? 4.0 : 8.0) * f;
    }
    default:
        return 0;
    }
}

void hp__memory_report(const hp_graph *g, const hp_program *p, int64_t grad_accum,
                       hp_memory_report *m) {
    memset(m, 0, sizeof *m);
    hp_graph_inputs in = hp_graph_count_inputs(g);
    int64_t numel = 0;
    for (int i = 0; i < in.n_params; i++) {
        m->params += type_bytes(&g->nodes[i].out[0]);
        numel += hp_type_numel(&g->nodes[i].out[0]);
    }
    m->grads = m->params;
    m->optimizer = 2 * numel * (int64_t)sizeof(float);
    if (p) {
        m->activations = p->arena_bytes[HP_MEM_ACT];
        m->comm = p->arena_bytes[HP_MEM_COMM];
        for (int32_t i = 0; i < p->n_instrs; i++)
            if (p->instrs[i].flags & HP_INSTR_PARAM_CAST)
                m->param_copies += p->buffers[p->instrs[i].out[0]].bytes;
    }
    /* the micro-steps' gradients add up in one f32 buffer per parameter (the last one adds
     * it into its own gradients) */
    if (grad_accum > 1) m->grad_accum = numel * (int64_t)sizeof(float);
    m->total = m->params + m->grads + m->optimizer + m->param_copies + m->activations + m->comm +
               m->grad_accum;
}

/* The mesh dim a collective runs on: its group's, else "dp", else the first; -1 none. */
static int mesh_dim(const hp_plan *plan, const char *group) {
    int dp = -1;
    for (int d = 0; d < plan->n_mesh; d++) {
        if (group && !strcmp(plan->mesh[d].name, group)) return d;
        if (!strcmp(plan->mesh[d].name, "dp")) dp = d;
    }
    return dp >= 0 ? dp : plan->n_mesh ? 0 : -1;
}

/* A kernel's time on the profile: the larger of its FLOPs at peak x efficiency (attention: at
 * its rate) and its bytes (inputs read, outputs written, local shapes; a materialized view: its
 * output copied) at memory bandwidth, plus one launch (the same roofline auto-sharding prices
 * strategies with). */
static double node_time(const hp_graph *g, int id, const hp_device_profile *p, double flops,
                        double *bytes_out) {
    const hp_node *n = &g->nodes[id];
    double bytes = 0;
    if (hp_op_get(n->op)->flags & HP_OPF_VIEW) {
        /* a materialized view copies its output's elements (a slice reads only its part) */
        bytes = 2.0 * (double)type_bytes(&n->out[0]);
    } else {
        for (int j = 0; j < n->n_in; j++) bytes += (double)type_bytes(hp_graph_type(g, n->in[j]));
        for (int k = 0; k < n->n_out; k++) bytes += (double)type_bytes(&n->out[k]);
    }
    double rate = p->peak_flops * p->efficiency;
    if (n->op == HP_OP_SDPA || n->op == HP_OP_SDPA_BACKWARD) { /* q: input 0, or 1 after g_out */
        int q = n->op == HP_OP_SDPA ? 0 : 1;
        const hp_type *qt = hp_graph_type(g, n->in[q]), *kt = hp_graph_type(g, n->in[q + 1]);
        if (qt->rank == 4 && kt->rank == 4)
            rate = hp_device_profile_attn_rate(p, qt->shape[3], hp_node_int(n, HP_ATTR_CAUSAL, 0),
                                               qt->shape[2], kt->shape[2]);
    }
    double t = flops / rate;
    if (bytes / p->mem_bw > t) t = bytes / p->mem_bw;
    *bytes_out = bytes;
    return t + p->kernel_s;
}

/* Collective node id's time: the latency and bandwidth of its mesh dim's link (def without
 * one); local_chunk runs on the comm stream but exchanges nothing: a local copy. */
static double collective_time(const hp_graph *g, int id, const hp_job *job,
                              const hp_link_class *link, hp_link_class def,
                              const hp_device_profile *prof) {
    const hp_node *n = &g->nodes[id];
    if (n->op == HP_OP_LOCAL_CHUNK) return (double)type_bytes(&n->out[0]) / prof->mem_bw;
    const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
    int d = mesh_dim(&job->plan, grp ? grp->s : NULL);
    double bw = d >= 0 ? link[d].bandwidth : def.bandwidth,
           lat = d >= 0 ? link[d].latency : def.latency;
    return lat + (double)hp_collective_bytes(g, id) / bw;
}

hp_status hp__cost_estimate(const hp_graph *g, const hp_program *prog, const hp_job *job,
                            hp_cost_estimate *c, hp_err *err) {
    memset(c, 0, sizeof *c);
    hp_device_profile prof;
    HP_TRY(hp_device_profile_for_job(job, &prof, err));
    hp_link_class link[HP_MESH_MAX_DIMS];
    hp_device_profile_links(&prof, job, link);
    c->peak_flops = prof.peak_flops;
    c->efficiency = prof.efficiency;
    c->mem_bw = prof.mem_bw;
    c->mem_capacity = prof.mem_capacity;
    c->profile_measured = prof.measured;
    snprintf(c->profile, sizeof c->profile, "%s", prof.name);
    int dp = mesh_dim(&job->plan, NULL);
    hp_link_class def = !strcmp(prof.name, "cpu") ? prof.intra : HP_LINK_INTRA_NODE;
    c->bandwidth = dp >= 0 ? link[dp].bandwidth : def.bandwidth;
    c->latency = dp >= 0 ? link[dp].latency : def.latency;
    double *done = hp_malloc(((size_t)g->n_nodes + 1) * sizeof *done);
    bool *runs = hp_malloc((size_t)g->n_nodes + 1); /* the node is a compute kernel */
    if (!done || !runs) {
        hp_free(done);
        hp_free(runs);
        return hp_errf(err, HP_NOMEM, "out of memory estimating the step");
    }
    for (int i = 0; i < g->n_nodes; i++)
        runs[i] = !prog && !(hp_op_get(g->nodes[i].op)->flags & HP_OPF_VIEW);
    /* a parameter's bf16 copy is written by the optimizer's update (2 bytes an element more
     * there), not by its cast in the step: the executor skips those while the copies are
     * current */
    double copy_bytes = 0;
    for (int k = 0; prog && k < prog->n_instrs; k++) {
        const hp_instr *ins = &prog->instrs[k];
        if (ins->node < 0 || ins->node >= g->n_nodes) continue;
        if (ins->flags & HP_INSTR_PARAM_CAST)
            copy_bytes += (double)type_bytes(&g->nodes[ins->node].out[0]);
        else
            runs[ins->node] = true;
    }
    double t_compute = 0, t_comm = 0; /* when each stream is next free */
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        done[i] = 0;
        if (n->op == HP_OP_PLACEHOLDER) continue;
        if (hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE) {
            double t = collective_time(g, i, job, link, def, &prof);
            double start = t_comm > t_compute ? t_comm : t_compute;
            c->comm_s += t;
            t_comm = done[i] = start + t;
        } else if (n->op == HP_OP_WAIT_TENSOR) {
            double ready = done[n->in[0].node];
            if (ready > t_compute) {
                c->exposed_comm_s += ready - t_compute;
                t_compute = ready;
            }
        } else if (runs[i]) {
            double f = hp__node_flops(g, i), bytes = 0, t = node_time(g, i, &prof, f, &bytes);
            c->flops += f;
            c->compute_s += t;
            t_compute += t;
            if (n->op >= 0 && n->op < HP_OP_COUNT) {
                c->by_op[n->op].count++;
                c->by_op[n->op].seconds += t;
                c->by_op[n->op].flops += f;
                c->by_op[n->op].bytes += bytes;
            }
        }
    }
    /* the optimizer: AdamW over every local parameter element (4 f32 reads, 3 writes), and the
     * bf16 copies it rewrites */
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    for (int i = 0; i < gi.n_params; i++) {
        double t = (double)hp_type_numel(&g->nodes[i].out[0]) * 28.0 / prof.mem_bw;
        c->optimizer_s += t;
    }
    c->optimizer_s += copy_bytes / prof.mem_bw;
    /* collectives nobody waited for still finish within the step */
    if (t_comm > t_compute) c->exposed_comm_s += t_comm - t_compute;
    /* gradient accumulation: the program runs grad_accum times a step, and all but the last
     * run's gradients are added up (2 f32 reads and a write an element each) */
    c->grad_accum = hp_job_grad_accum(job);
    for (int i = 0; i < gi.n_params; i++)
        c->accumulate_s += (double)(c->grad_accum - 1) *
                           (double)hp_type_numel(&g->nodes[i].out[0]) * 12.0 / prof.mem_bw;
    c->step_s = (double)c->grad_accum * (c->compute_s + c->exposed_comm_s) + c->accumulate_s +
                c->optimizer_s;
    /* an evaluated batch: the nodes the loss depends on, each collective after the compute
     * before it (hp_exec_forward synchronizes before each) */
    bool *needed = hp_calloc((size_t)g->n_nodes + 1, 1);
    if (!needed) {
        hp_free(done);
        hp_free(runs);
        return hp_errf(err, HP_NOMEM, "out of memory estimating the step");
    }
    if (g->n_outputs > 0) needed[g->outputs[0].node] = true;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const hp_node *n = &g->nodes[i];
        if (!needed[i]) continue;
        for (int k = 0; k < n->n_in; k++) needed[n->in[k].node] = true;
        if (n->op == HP_OP_PLACEHOLDER) continue;
        if (hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE) {
            c->forward_s += collective_time(g, i, job, link, def, &prof);
        } else if (runs[i]) {
            double bytes = 0;
            c->forward_s += node_time(g, i, &prof, hp__node_flops(g, i), &bytes);
        }
    }
    hp_free(needed);
    hp_free(done);
    hp_free(runs);
    return HP_OK;
}
