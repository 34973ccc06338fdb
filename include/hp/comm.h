/* hp/comm.h — communicators: the collectives a rank runs with its peers, behind one vtable.
 * `shm` (worker/comm/shm.c) connects the ranks of one host through a shared-memory segment;
 * `tcp` (worker/comm/tcp.c) connects ranks on several hosts over TCP; `nccl` comes with the
 * CUDA backend (its bootstrap travels over shm or tcp).
 *
 * Every call is blocking and collective: all ranks of the communicator must make the same
 * calls in the same order with the same sizes. The backend runs them on its communication
 * thread, which is what makes them asynchronous to compute. Reductions combine ranks in rank
 * order (((x0 + x1) + x2) ...), so every rank gets bitwise the same result, run after run.
 *
 * split makes sub-communicators (MPI_Comm_split semantics): on a (dp, tp) mesh each rank holds
 * the world communicator, its dp group and its tp group. Each is a communicator of its own
 * (the rules above hold per communicator); interleave them in the same program order on
 * every rank, since the calls block and two ranks that order them differently can wait on
 * each other until the timeout. Reductions in a group fold in the group's rank order, so
 * they are deterministic too.
 *
 * A peer that does not arrive within the communicator's timeout (dead, hung, or making a
 * different call) is an HP_IO error naming the collective, its sequence number and the
 * missing rank — never a hang. After an error the communicator is unusable (destroy it).
 * Threads: one thread calls into a communicator at a time (different communicators may be used
 * from different threads).
 */
#ifndef HP_COMM_H
#define HP_COMM_H

#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HP_COMM_F32 = 0, HP_COMM_F64 = 1, HP_COMM_I64 = 2 } hp_comm_dtype;

typedef struct hp_comm hp_comm;

typedef struct hp_comm_vtable {
    const char *name;
    /* recv[r * bytes .. (r+1) * bytes) = rank r's send[0 .. bytes). send may alias its slot
     * of recv. */
    hp_status (*all_gather)(hp_comm *c, const void *send, void *recv, size_t bytes, hp_err *err);
    /* send holds world * count elements; this rank receives the reduction of chunk `rank`
     * (count elements) over all ranks. HP_REDUCE_AVG divides the sum by world. */
    hp_status (*reduce_scatter)(hp_comm *c, const void *send, void *recv, int64_t count,
                                hp_comm_dtype dt, hp_reduce_op op, hp_err *err);
    /* recv (count elements) = the reduction of every rank's send; send may equal recv. */
    hp_status (*all_reduce)(hp_comm *c, const void *send, void *recv, int64_t count,
                            hp_comm_dtype dt, hp_reduce_op op, hp_err *err);
    /* Every rank's buf (bytes) becomes root's. */
    hp_status (*broadcast)(hp_comm *c, void *buf, size_t bytes, int root, hp_err *err);
    hp_status (*barrier)(hp_comm *c, hp_err *err);
    /* send holds world chunks of bytes_per_rank bytes; recv chunk r = rank r's send chunk
     * [this rank] (all_to_all_single with equal splits). send may equal recv; otherwise the
     * two must not overlap (HP_INVALID). */
    hp_status (*all_to_all)(hp_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                            hp_err *err);
    /* MPI_Comm_split / ncclCommSplit: every rank calls it; the ranks passing the same
     * color >= 0 form a new communicator in which they are ranked by (key, rank here), and
     * *out is this rank's handle on it (the caller frees it, before or after this one); a
     * rank passing color < 0 joins no group and gets *out = NULL. The new communicator is
     * independent of this one (its own calls, sequence numbers, failures and timeout, which
     * it inherits), and this one stays usable, also when joining the group fails. */
    hp_status (*split)(hp_comm *c, int color, int key, hp_comm **out, hp_err *err);
    void (*destroy)(hp_comm *c);
} hp_comm_vtable;

struct hp_comm {
    const hp_comm_vtable *vt;
    int rank, world;
};

static inline void hp_comm_free(hp_comm *c) {
    if (c) c->vt->destroy(c);
}

/* Joins (rank 0: creates) the shared-memory communicator `name` ([A-Za-z0-9._-], at most 64
 * chars) of `world` ranks. Blocks until all ranks have joined or timeout_s passes (HP_IO
 * naming the ranks that did not come). The segment is unlinked once all have joined, so
 * nothing is left in /dev/shm even if the ranks die later. */
hp_status hp_shm_comm_new(const char *name, int rank, int world, double timeout_s, hp_comm **out,
                          hp_err *err);

/* ---- tcp: ranks on several hosts (worker/comm/tcp.c, tcp_coll.c) -----------------------------
 * Every pair of ranks holds one TCP connection (TCP_NODELAY); the collectives keep the rules
 * above (reductions fold in rank order: results are bitwise those of shm). Rank 0 listens on
 * bind_host (default 127.0.0.1) at `port` (0: the kernel picks) and hands its "host:port" to
 * publish; the other ranks get it as addr (the caller carries it: hpd's CommSetup relay, or
 * the address file below). Each rank > 0 listens for its higher peers on the local address of
 * its connection to rank 0 (or its own bind_host, which must then be the address that
 * connection leaves from: the peers learn it from rank 0, which sees that one). Every connection
 * proves both ends hold `secret` (HMAC-SHA-256 challenge-response; the secret never crosses the
 * wire); a stranger is logged to stderr and dropped. Joining blocks until every rank has connected
 * or timeout_s passes (HP_IO naming the rank that did not come). In a collective the timeout counts
 * from the last byte moved, so a large message over a slow link is not cut off while it flows. A
 * peer that closes its connection is HP_IO at once; a frame that is not what the receiver
 * expects is HP_IO naming the rank. A connection that has not completed the handshake within
 * 5 s is dropped (a silent stranger delays the join by that much at most). */
typedef struct hp_tcp_opts {
    int rank, world;
    double timeout_s;
    const char *secret;    /* the job's shared secret, at least 16 characters */
    const char *addr;      /* ranks > 0: rank 0's "host:port" ("[v6]:port") */
    const char *bind_host; /* numeric address to listen on; NULL: see above */
    int port;              /* rank 0's port; 0: the kernel picks */
    /* Rank 0, once it listens: makes addr reach the other ranks (may be NULL). */
    hp_status (*publish)(const char *addr, void *ctx, hp_err *err);
    void *publish_ctx;
} hp_tcp_opts;

hp_status hp_tcp_comm_new(const hp_tcp_opts *o, hp_comm **out, hp_err *err);

#define HP_TCP_SECRET_LEN 64
/* A fresh random secret: HP_TCP_SECRET_LEN hex characters. */
hp_status hp_tcp_secret_new(char out[HP_TCP_SECRET_LEN + 1]);
/* Standalone rendezvous: rank 0 writes "host:port secret\n" to path (mode 0600, atomically:
 * written beside it, then renamed); the others poll for it until timeout_s (HP_IO naming the
 * path), HP_PARSE for a file that does not hold the line. A file an earlier run left is read
 * as it is: give every run a fresh path (hp-worker's default holds its launcher's pid). */
hp_status hp_tcp_addr_file_write(const char *path, const char *addr, const char *secret,
                                 hp_err *err);
hp_status hp_tcp_addr_file_wait(const char *path, double timeout_s, char *addr, size_t addr_cap,
                                char *secret, size_t secret_cap, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
