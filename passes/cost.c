/* passes/cost.c — what the compiler reports before anything runs: per-rank memory, the
 * communication volume of each collective, and a cost model of one step.
 *
 * The cost model's assumptions (also printed by `hpctl plan`):
 *   * compute: FLOPs counted from the graph's nodes — 2*M*N*K per mm/addmm (times the batch
 *     for bmm), 4*B*H*T*S*D per attention forward and 8*B*H*T*S*D per attention backward
 *     (causal masking not discounted, as torchtitan's 6N + 12LdT convention); every other op
 *     is free (memory-bound work is not modelled). Time = FLOPs / (peak * efficiency), peak
 *     989e12 FLOP/s for cuda (H100/H200 SXM, bf16 dense), an assumed 1e11 for cpu,
 *     efficiency 0.5.
 *   * communication: each collective costs the link latency plus its bytes (hp_collective_bytes'
 *     convention) over the bandwidth of the mesh dimension it runs on (its `group` attribute,
 *     else the dim named "dp", else the first).
 *   * schedule: one compute stream and one comm stream, in graph order. A collective starts
 *     when both its input is ready (the compute stream has reached it) and the comm stream is
 *     free; a wait_tensor stalls the compute stream until its collective is done. The stall
 *     is the exposed communication; step time = compute + exposed.
 * It does not model memory bandwidth, kernel launch overhead, or contention between the
 * streams.
 */
#include "passes/passes_internal.h"

#include <string.h>

#define PEAK_CUDA  989e12
#define PEAK_CPU   1e11
#define EFFICIENCY 0.5

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

void hp__memory_report(const hp_graph *g, const hp_program *p, hp_memory_report *m) {
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
    }
    m->total = m->params + m->grads + m->optimizer + m->activations + m->comm;
}

/* The link a collective runs on: its group's mesh dim, else "dp", else the first. */
static const hp_mesh_dim *mesh_dim(const hp_plan *plan, const char *group) {
    const hp_mesh_dim *dp = NULL;
    for (int d = 0; d < plan->n_mesh; d++) {
        if (group && !strcmp(plan->mesh[d].name, group)) return &plan->mesh[d];
        if (!strcmp(plan->mesh[d].name, "dp")) dp = &plan->mesh[d];
    }
    return dp ? dp : plan->n_mesh ? &plan->mesh[0] : NULL;
}

hp_status hp__cost_estimate(const hp_graph *g, const hp_job *job, hp_cost_estimate *c,
                            hp_err *err) {
    memset(c, 0, sizeof *c);
    c->peak_flops = job->resources.device == HP_DEVICE_CUDA ? PEAK_CUDA : PEAK_CPU;
    c->efficiency = EFFICIENCY;
    hp_link_class def = HP_LINK_INTRA_NODE;
    const hp_mesh_dim *dp = mesh_dim(&job->plan, NULL);
    c->bandwidth = dp ? dp->link.bandwidth : def.bandwidth;
    c->latency = dp ? dp->link.latency : def.latency;
    double *done = hp_malloc(((size_t)g->n_nodes + 1) * sizeof *done);
    if (!done) return hp_errf(err, HP_NOMEM, "out of memory estimating the step");
    double rate = c->peak_flops * c->efficiency;
    double t_compute = 0, t_comm = 0; /* when each stream is next free */
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_node *n = &g->nodes[i];
        done[i] = 0;
        if (hp_op_get(n->op)->flags & HP_OPF_COLLECTIVE) {
            const hp_attr *grp = hp_node_attr(n, HP_ATTR_GROUP);
            const hp_mesh_dim *md = mesh_dim(&job->plan, grp ? grp->s : NULL);
            double bw = md ? md->link.bandwidth : def.bandwidth,
                   lat = md ? md->link.latency : def.latency;
            /* local_chunk runs on the comm stream but exchanges nothing: no latency */
            double t =
                n->op == HP_OP_LOCAL_CHUNK ? 0 : lat + (double)hp_collective_bytes(g, i) / bw;
            double start = t_comm > t_compute ? t_comm : t_compute;
            c->comm_s += t;
            t_comm = done[i] = start + t;
        } else if (n->op == HP_OP_WAIT_TENSOR) {
            double ready = done[n->in[0].node];
            if (ready > t_compute) {
                c->exposed_comm_s += ready - t_compute;
                t_compute = ready;
            }
        } else {
            double f = hp__node_flops(g, i);
            c->flops += f;
            t_compute += f / rate;
        }
    }
    /* collectives nobody waited for still finish within the step */
    if (t_comm > t_compute) c->exposed_comm_s += t_comm - t_compute;
    c->compute_s = c->flops / rate;
    c->step_s = c->compute_s + c->exposed_comm_s;
    hp_free(done);
    return HP_OK;
}
