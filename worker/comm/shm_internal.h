/* worker/comm/shm_internal.h — the shm communicator's segment layout, its in-process state and
 * the helpers shared by shm.c (segment, join, waiting, errors) and shm_coll.c (collectives).
 * Not a public API: tests and benchmarks use the two constructors at the end.
 *
 * Segment layout (one mapping per process; offsets are the same in every process):
 *
 *   [hdr: 1 page] [ranks: world x hp__shm_rank, page-rounded]
 *   [slots: world x slot_bytes, each split in two halves] [result: slot_bytes / 2]
 *
 * Synchronization is one counter per rank (`phase`): a rank publishes its writes with a
 * release store of phase+1 and reads peers' data only after seeing (acquire) every rank at
 * that phase. Every data step writes the half `step % 2` of the rank's own slot, and every
 * read of a step's slots happens before the reader's next arrive, so a writer that has seen
 * all ranks reach its previous step's phase knows nobody still reads the half it writes.
 * Waiters sleep on one futex word (`epoch`) that every arrive bumps.
 */
#ifndef HP_WORKER_COMM_SHM_INTERNAL_H
#define HP_WORKER_COMM_SHM_INTERNAL_H

#include "hp/comm.h"

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define HP__SHM_MAGIC     0x31306d68732d7068ull /* "hp-shm01" little-endian */
#define HP__SHM_VERSION   1u
#define HP__SHM_MAX_WORLD 1024
#define HP__SHM_NAME_MAX  64 /* names a caller passes */
/* Names split derives ("<parent>.s<k>c<color>", nested), hashed beyond this (shm.c). */
#define HP__SHM_GROUP_NAME_MAX 200
/* Per-rank staging slot: two 1 MiB halves (double buffering) up to world 16, then smaller so
 * that the segment stays near 32 MiB (a Docker default /dev/shm is 64 MiB). Chosen with
 * bench_comm_shm: 1 MiB steps beat 4 MiB steps by 1.3-1.7x from 4 MB up (they stay in L2),
 * and the per-step sync (about a microsecond) is noise against a 1 MiB copy. */
#define HP__SHM_SLOT_DEFAULT ((size_t)2 << 20)
#define HP__SHM_MSG_MAX      384
#define HP__SHM_PAGE         4096u

typedef enum {
    HP__SHM_ALL_GATHER = 1,
    HP__SHM_REDUCE_SCATTER = 2,
    HP__SHM_ALL_REDUCE = 3,
    HP__SHM_BROADCAST = 4,
    HP__SHM_BARRIER = 5,
    HP__SHM_ALL_TO_ALL = 6,
    HP__SHM_SPLIT = 7,
} hp__shm_kind;

/* What a rank called: compared across ranks at the first sync of every collective. */
typedef struct hp__shm_desc {
    uint64_t seq;  /* 1, 2, ... per communicator */
    uint64_t size; /* bytes (all_gather, broadcast, all_to_all per rank) or elements */
    int32_t kind, dtype, op, root;
} hp__shm_desc;

typedef struct hp__shm_hdr {
    _Atomic uint64_t magic; /* stored last by rank 0 (release): the rest is valid */
    uint32_t version, world;
    uint64_t slot_bytes, total_bytes;
    int32_t creator_pid;
    _Atomic uint32_t joined;
    alignas(64) _Atomic uint32_t epoch; /* futex word, bumped by every arrive */
    _Atomic uint32_t waiters;           /* ranks sleeping on epoch (skip FUTEX_WAKE when 0) */
    /* 0; -1 while the first failing rank writes broken_msg; then that rank + 1. */
    alignas(64) _Atomic int32_t broken;
    char broken_msg[HP__SHM_MSG_MAX];
} hp__shm_hdr;

typedef struct hp__shm_rank {
    alignas(128) _Atomic uint64_t phase; /* syncs this rank has arrived at */
    _Atomic int32_t pid;                 /* 0 until the rank has joined */
    hp__shm_desc desc[2];                /* desc[seq % 2]: the call in progress */
} hp__shm_rank;

typedef struct hp__shm_comm {
    hp_comm base;
    char name[HP__SHM_GROUP_NAME_MAX + 1];
    double timeout_s;
    uint8_t *map;
    size_t map_bytes;
    _Atomic int *local_refs; /* in-process group: comms still using the shared map; else NULL */
    hp__shm_hdr *hdr;
    hp__shm_rank *ranks; /* [world] */
    uint8_t *slots;      /* [world][slot_bytes] */
    uint8_t *result;     /* [slot_bytes / 2]: all_reduce's reduced window */
    size_t slot_bytes, half;
    uint64_t phase;    /* this rank's phase (mirrors ranks[rank].phase) */
    uint64_t seq;      /* collectives started */
    uint64_t step;     /* data steps done: selects the slot half */
    uint64_t splits;   /* split calls done: names the groups */
    const void **srcs; /* [world]: scratch for the reduction kernels */
    int64_t spin_ns;
    int broken;
    char broken_msg[HP__SHM_MSG_MAX];
} hp__shm_comm;

/* ---- shm.c: waiting and errors, used by the collectives ------------------------------------- */

const char *hp__shm_kind_name(int kind);

/* Marks the communicator broken with the formatted message, publishes it to the peers (the
 * first failing rank's message wins there) and returns `status` with err = "shm 'name': msg". */
hp_status hp__shm_fail(hp__shm_comm *c, hp_err *err, hp_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Arrives at the next phase (release: the rank's slot writes and descriptor become visible)
 * and waits until every rank has arrived there (acquire). A rank that does not come within
 * the timeout, or whose process died, or a peer that failed while we wait, breaks the
 * communicator with an HP_IO error naming the collective `kind` #seq and the rank. Returns
 * HP_OK once all have arrived even if a peer has failed meanwhile: follow with
 * hp__shm_peer_check (after checking the descriptors, so a mismatch is reported first). */
hp_status hp__shm_sync(hp__shm_comm *c, int kind, hp_err *err);
/* The two halves of hp__shm_sync, for work that can overlap the wait (it must not touch the
 * slots: they belong to the peers between the arrive and the end of the wait). */
void hp__shm_arrive(hp__shm_comm *c);
hp_status hp__shm_wait(hp__shm_comm *c, int kind, hp_err *err);

/* HP_IO (and broken) if a peer has published a failure. */
hp_status hp__shm_peer_check(hp__shm_comm *c, int kind, hp_err *err);

/* The vtable's destroy (lifetime code stays in shm.c). */
void hp__shm_destroy(hp_comm *c);

/* Joins the sub-communicator `name` (derived by split, not checked against the caller-name
 * rules) as rank `rank` of `world`, with the parent's timeout and slot size. pids[r] is the
 * process of the group's rank r (from the parent's rank table): a member that dies before it
 * has joined is reported at once instead of after the timeout. */
hp_status hp__shm_group_new(const char *name, int rank, int world, double timeout_s,
                            size_t slot_bytes, const int32_t *pids, hp_comm **out, hp_err *err);

/* ---- shm_coll.c ------------------------------------------------------------------------------ */

extern const hp_comm_vtable hp__shm_vtable;

/* ---- hooks for tests and benchmarks ---------------------------------------------------------- */

/* hp_shm_comm_new with an explicit slot size (rank 0's choice wins; 0 = the default; else a
 * multiple of 128, at least 16 * world and 256). */
hp_status hp__shm_comm_new_ex(const char *name, int rank, int world, double timeout_s,
                              size_t slot_bytes, hp_comm **out, hp_err *err);

/* A group of `world` communicators in this process (one per thread) over one anonymous shared
 * mapping; comms[r] is rank r. Lets TSan see the synchronization (one address per word).
 * Free each with hp_comm_free; the mapping goes with the last. */
hp_status hp__shm_comm_new_local(int world, double timeout_s, size_t slot_bytes, hp_comm **comms,
                                 hp_err *err);

/* True if process pid is gone, or a zombie whose threads have all exited (shm.c's liveness
 * check, exposed for its test). */
int hp__shm_pid_dead(pid_t pid);

/* Test hook: when set, a rank > 0 calls it in hp__shm_comm_new_ex right after registering
 * (before it waits for the others), so a test can hold a joiner there deterministically. */
extern void (*hp__shm_join_hook)(int rank);

#endif
