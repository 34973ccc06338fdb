/* worker/cpu/cpu_comm.h — the cpu backend's comm stream (a thread running collectives through
 * an hp_comm in issue order). Internal to worker/cpu/. */
#ifndef HP_WORKER_CPU_COMM_H
#define HP_WORKER_CPU_COMM_H

#include "hp/comm.h"
#include "worker/backend.h"
#include "worker/cpu/cpu_backend.h"

typedef struct hp__cpu_comm hp__cpu_comm;

/* Starts the thread; comm is borrowed and must outlive the stream. */
hp_status hp__cpu_comm_start(hp_comm *comm, hp__cpu_comm **out, hp_err *err);
/* Finishes the queued collectives, then joins the thread. NULL is fine. */
void hp__cpu_comm_stop(hp__cpu_comm *q);
int hp__cpu_comm_world(const hp__cpu_comm *q);
/* The mesh dims' communicators (hp_cpu_backend_set_groups); before the first enqueue. */
hp_status hp__cpu_comm_set_groups(hp__cpu_comm *q, const hp_comm_group *groups, int n, hp_err *err);

/* Queues a collective node's call (its buffers must stay valid until it completes). Errors:
 * an unsupported collective or dtype, a group naming no mesh dim of this rank's groups, a
 * group size other than its communicator's, or the stream's sticky error. */
hp_status hp__cpu_comm_enqueue(hp__cpu_comm *q, const hp_kernel_call *c, hp_err *err);
/* Sets the per-collective hook (hp_cpu_backend_set_comm_trace). */
void hp__cpu_comm_set_trace(hp__cpu_comm *q, hp_cpu_comm_trace_fn fn, void *ctx);
/* Seconds the comm thread has spent inside collectives. */
double hp__cpu_comm_busy(hp__cpu_comm *q);
/* The sequence number of the last queued collective. */
uint64_t hp__cpu_comm_issued(hp__cpu_comm *q);
/* Blocks until the first `seq` collectives have completed; the stream's first error if one
 * failed. */
hp_status hp__cpu_comm_wait(hp__cpu_comm *q, uint64_t seq, hp_err *err);

#endif
