/* worker/cpu/cpu_comm.c — the cpu backend's communication stream: a thread that runs the
 * collectives issued on stream 1 through an hp_comm, in issue order, while the caller's
 * thread goes on computing. Each issued collective gets a sequence number; an event recorded
 * on the comm stream remembers the last issued number, and waiting on it blocks until the
 * thread has completed that many. The first error sticks: it is reported by the next wait
 * and every later enqueue. */
#include "worker/cpu/cpu_comm.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define QUEUE_CAP 4096

typedef struct comm_op {
    hp_comm *comm;       /* the group's communicator */
    const hp_node *node; /* for the trace hook */
    hp_op op;
    hp_reduce_op reduce;
    const void *in;
    void *out;
    size_t in_bytes;
    int64_t out_count;
    hp_comm_dtype dt;
    /* local_chunk: `outer` rows of in_bytes / outer bytes, each giving its chunk_bytes chunk at
     * the rank's coordinate */
    int64_t outer;
    size_t chunk_bytes;
} comm_op;

struct hp__cpu_comm {
    hp_comm *comm; /* the world */
    hp_comm_group groups[HP_MESH_MAX_DIMS];
    char group_names[HP_MESH_MAX_DIMS][HP_MESH_NAME_MAX];
    int n_groups;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* work arrived or stop */
    pthread_cond_t done; /* completed advanced */
    comm_op queue[QUEUE_CAP];
    uint64_t issued, completed; /* sequence numbers: queue holds (completed, issued] */
    bool stop, failed;
    hp_err err;
    double busy_s;              /* seconds spent inside collectives */
    hp_cpu_comm_trace_fn trace; /* under mu; read once per collective */
    void *trace_ctx;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static hp_status run_op(hp_comm *c, const comm_op *o, hp_err *err) {
    switch (o->op) {
    case HP_OP_ALL_GATHER:
        return c->vt->all_gather(c, o->in, o->out, o->in_bytes, err);
    case HP_OP_REDUCE_SCATTER:
        return c->vt->reduce_scatter(c, o->in, o->out, o->out_count, o->dt, o->reduce, err);
    case HP_OP_ALL_REDUCE:
        return c->vt->all_reduce(c, o->in, o->out, o->out_count, o->dt, o->reduce, err);
    case HP_OP_ALL_TO_ALL: /* n equal flat parts (the shape rule: dim 0, or dim 1 under a dim 0 of
                              1) */
        return c->vt->all_to_all(c, o->in, o->out, o->in_bytes / (size_t)c->world, err);
    case HP_OP_LOCAL_CHUNK: { /* the rank's own chunk along dim: a local copy, no exchange */
        size_t row = o->in_bytes / (size_t)o->outer;
        for (int64_t r = 0; r < o->outer; r++)
            memcpy((char *)o->out + (size_t)r * o->chunk_bytes,
                   (const char *)o->in + (size_t)r * row + (size_t)c->rank * o->chunk_bytes,
                   o->chunk_bytes);
        return HP_OK;
    }
    default:
        return hp_errf(err, HP_UNSUPPORTED, "%s is not supported by the cpu comm stream",
                       hp_op_get(o->op)->name);
    }
}

static void *comm_main(void *arg) {
    hp__cpu_comm *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->completed == q->issued) pthread_cond_wait(&q->cv, &q->mu);
        if (q->completed == q->issued) break; /* stop, nothing left */
        comm_op o = q->queue[q->completed % QUEUE_CAP];
        bool failed = q->failed;
        hp_cpu_comm_trace_fn trace = q->trace;
        void *trace_ctx = q->trace_ctx;
        pthread_mutex_unlock(&q->mu);
        hp_err e = {0};
        double t0 = now_s();
        hp_status st = failed ? HP_OK : run_op(o.comm, &o, &e);
        double t1 = now_s(), dt = t1 - t0;
        if (trace && !failed) trace(trace_ctx, o.node, (int64_t)o.in_bytes, t0, t1);
        pthread_mutex_lock(&q->mu);
        q->busy_s += dt;
        if (st != HP_OK && !q->failed) {
            q->failed = true;
            q->err = e;
        }
        q->completed++;
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

hp_status hp__cpu_comm_start(hp_comm *comm, hp__cpu_comm **out, hp_err *err) {
    *out = NULL;
    hp__cpu_comm *q = hp_calloc(1, sizeof *q);
    if (!q) return hp_errf(err, HP_NOMEM, "cpu: out of memory for the comm stream");
    q->comm = comm;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_cond_init(&q->done, NULL);
    if (pthread_create(&q->thread, NULL, comm_main, q) != 0) {
        pthread_cond_destroy(&q->done);
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        hp_free(q);
        return hp_errf(err, HP_INTERNAL, "cpu: cannot start the comm thread");
    }
    *out = q;
    return HP_OK;
}

void hp__cpu_comm_stop(hp__cpu_comm *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->done);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    hp_free(q);
}

int hp__cpu_comm_world(const hp__cpu_comm *q) {
    return q->comm->world;
}

hp_status hp__cpu_comm_set_groups(hp__cpu_comm *q, const hp_comm_group *groups, int n,
                                  hp_err *err) {
    if (n < 0 || n > HP_MESH_MAX_DIMS)
        return hp_errf(err, HP_INVALID, "cpu: %d mesh groups (at most %d)", n, HP_MESH_MAX_DIMS);
    for (int i = 0; i < n; i++) {
        const char *nm = groups[i].name;
        if (!nm || !nm[0] || strlen(nm) >= HP_MESH_NAME_MAX || !groups[i].comm)
            return hp_errf(err, HP_INVALID, "cpu: mesh group %d: no name or communicator", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(nm, groups[j].name))
                return hp_errf(err, HP_INVALID, "cpu: mesh group '%s' given twice", nm);
    }
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < n; i++) {
        snprintf(q->group_names[i], sizeof q->group_names[i], "%s", groups[i].name);
        q->groups[i] = (hp_comm_group){q->group_names[i], groups[i].comm};
    }
    q->n_groups = n;
    pthread_mutex_unlock(&q->mu);
    return HP_OK;
}

/* The communicator a collective runs on: its group's, else the world's. */
static hp_status group_comm(const hp__cpu_comm *q, const hp_node *n, hp_comm **out, hp_err *err) {
    const char *name = hp_op_get(n->op)->name;
    const hp_attr *g = hp_node_attr(n, HP_ATTR_GROUP);
    int64_t gs = hp_node_int(n, HP_ATTR_GROUP_SIZE, 1);
    *out = q->comm;
    for (int i = 0; g && g->s && i < q->n_groups; i++)
        if (!strcmp(g->s, q->groups[i].name)) *out = q->groups[i].comm;
    if (*out == q->comm && g && g->s && q->n_groups > 0 && gs != q->comm->world)
        return hp_errf(err, HP_UNSUPPORTED, "%s on group '%s': not a mesh dim of this rank", name,
                       g->s);
    if (gs != (*out)->world)
        return hp_errf(err, HP_UNSUPPORTED, "%s over %lld ranks, but the communicator has %d", name,
                       (long long)gs, (*out)->world);
    return HP_OK;
}

hp_status hp__cpu_comm_enqueue(hp__cpu_comm *q, const hp_kernel_call *c, hp_err *err) {
    const hp_node *n = c->node;
    const char *name = hp_op_get(n->op)->name;
    hp_comm *comm = NULL;
    HP_TRY(group_comm(q, n, &comm, err));
    hp_dtype dt = c->in_type[0].dtype;
    comm_op o = {.comm = comm,
                 .node = n,
                 .op = n->op,
                 .reduce = (hp_reduce_op)hp_node_int(n, HP_ATTR_REDUCE_OP, HP_REDUCE_SUM),
                 .in = c->in[0],
                 .out = c->out[0],
                 .in_bytes = (size_t)hp_type_numel(&c->in_type[0]) * hp_dtype_size(dt),
                 .out_count = hp_type_numel(&c->out_type[0]),
                 .dt = HP_COMM_F32};
    if (n->op == HP_OP_LOCAL_CHUNK) {
        const hp_type *t = &c->in_type[0];
        int d = (int)hp_node_int(n, HP_ATTR_DIM, 0);
        if (d < 0) d += t->rank;
        if (d < 0 || d >= t->rank || t->shape[d] % comm->world)
            return hp_errf(err, HP_INVALID, "%s: dim %d of a rank-%d input does not split %d ways",
                           name, d, t->rank, comm->world);
        o.outer = 1;
        for (int k = 0; k < d; k++) o.outer *= t->shape[k];
        if (o.outer < 1) o.outer = 1;
        o.chunk_bytes = o.in_bytes / (size_t)o.outer / (size_t)comm->world;
    }
    bool moves_bytes =
        n->op == HP_OP_ALL_GATHER || n->op == HP_OP_ALL_TO_ALL || n->op == HP_OP_LOCAL_CHUNK;
    if (!moves_bytes && dt != HP_F32)
        return hp_errf(err, HP_UNSUPPORTED, "%s of %s: the cpu comm stream reduces f32 only", name,
                       hp_dtype_name(dt));
    pthread_mutex_lock(&q->mu);
    while (!q->failed && q->issued - q->completed >= QUEUE_CAP) pthread_cond_wait(&q->done, &q->mu);
    hp_status st = HP_OK;
    if (q->failed) {
        st = q->err.status;
        if (err) *err = q->err;
    } else {
        q->queue[q->issued % QUEUE_CAP] = o;
        q->issued++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

void hp__cpu_comm_set_trace(hp__cpu_comm *q, hp_cpu_comm_trace_fn fn, void *ctx) {
    pthread_mutex_lock(&q->mu);
    q->trace = fn;
    q->trace_ctx = ctx;
    pthread_mutex_unlock(&q->mu);
}

double hp__cpu_comm_busy(hp__cpu_comm *q) {
    pthread_mutex_lock(&q->mu);
    double s = q->busy_s;
    pthread_mutex_unlock(&q->mu);
    return s;
}

uint64_t hp__cpu_comm_issued(hp__cpu_comm *q) {
    pthread_mutex_lock(&q->mu);
    uint64_t n = q->issued;
    pthread_mutex_unlock(&q->mu);
    return n;
}

hp_status hp__cpu_comm_wait(hp__cpu_comm *q, uint64_t seq, hp_err *err) {
    pthread_mutex_lock(&q->mu);
    while (!q->failed && q->completed < seq) pthread_cond_wait(&q->done, &q->mu);
    hp_status st = HP_OK;
    if (q->failed) {
        st = q->err.status;
        if (err) *err = q->err;
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}
