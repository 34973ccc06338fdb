/* worker/comm/tcp_internal.h — the tcp communicator's in-process state, its frame format and
 * the helpers shared by tcp.c (sockets, handshake, mesh, progress engine, errors) and
 * tcp_coll.c (collectives, split). Not a public API.
 *
 * Every pair of ranks holds one TCP connection (a full mesh: hp's CPU world sizes are small).
 * A collective is one or two "runs" of the progress engine: in a run, each peer gets at most
 * one frame from us and sends us at most one; the engine polls all sockets (non-blocking)
 * until every frame of the run is sent and received, so two ranks sending each other large
 * frames never deadlock on full socket buffers. Payloads go straight from the caller's
 * buffer into the socket and from the socket into their destination (or a staging buffer
 * that a reduction folds from): nothing is copied whole before it is sent.
 *
 * Frame: a fixed 48-byte header (little-endian fields, below), then payload_len bytes. The
 * receiver knows what it expects (the same collective, seq, description, phase and payload
 * length), so any difference is an error naming the rank: out of step, a different call, or
 * a bad frame — never a crash.
 */
#ifndef HP_WORKER_COMM_TCP_INTERNAL_H
#define HP_WORKER_COMM_TCP_INTERNAL_H

#include "hp/comm.h"

#include <stdint.h>

#define HP__TCP_FRAME_MAGIC 0x31544370u /* "pCT1" */
#define HP__TCP_MAX_WORLD   256
#define HP__TCP_MSG_MAX     384
#define HP__TCP_HOST_MAX    64 /* numeric host text (IPv6 fits) */
#define HP__TCP_HDR_BYTES   48

typedef enum {
    HP__TCP_ALL_GATHER = 1,
    HP__TCP_REDUCE_SCATTER = 2,
    HP__TCP_ALL_REDUCE = 3,
    HP__TCP_BROADCAST = 4,
    HP__TCP_BARRIER = 5,
    HP__TCP_ALL_TO_ALL = 6,
    HP__TCP_SPLIT = 7,
} hp__tcp_kind;

/* What a rank called: sent in every frame header and compared by the receiver. */
typedef struct hp__tcp_desc {
    uint32_t kind;
    uint64_t seq;  /* 1, 2, ... per communicator */
    uint64_t size; /* bytes (all_gather, broadcast, all_to_all per rank) or elements */
    int32_t dtype, op, root;
} hp__tcp_desc;

/* One peer's part of a run: the frame we send it and the frame we expect from it. */
typedef struct hp__tcp_xfer {
    int sending, receiving;
    const uint8_t *send;
    uint64_t send_len;
    uint8_t *recv;
    uint64_t recv_len;
    /* engine state */
    uint8_t hdr_out[HP__TCP_HDR_BYTES], hdr_in[HP__TCP_HDR_BYTES];
    uint64_t out_done, in_done; /* bytes of header + payload moved */
} hp__tcp_xfer;

typedef struct hp__tcp_comm {
    hp_comm base;
    double timeout_s;
    uint64_t comm_id; /* names this communicator in handshakes (groups derive theirs) */
    uint64_t seq;     /* collectives started */
    uint64_t splits;  /* split calls done */
    int *fds;         /* [world]: connection to each peer, -1 for ourselves */
    char (*hosts)[HP__TCP_HOST_MAX]; /* [world]: numeric host each rank listens on */
    char *secret;
    hp__tcp_xfer *xfers; /* [world]: the current run */
    void *stage;         /* scratch for reductions and in-place all_to_all */
    size_t stage_cap;
    int broken;
    char broken_msg[HP__TCP_MSG_MAX];
} hp__tcp_comm;

/* ---- tcp.c ---------------------------------------------------------------------------------- */

const char *hp__tcp_kind_name(int kind);

/* Marks the communicator broken and returns status with err = "tcp rank R: msg". */
hp_status hp__tcp_fail(hp__tcp_comm *c, hp_err *err, hp_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Clears every peer's transfer for a new run. */
void hp__tcp_run_reset(hp__tcp_comm *c);
/* Runs the engine until every transfer set in c->xfers is done, tagging frames with *d and
 * `phase`. A peer that sends nothing for the timeout, closes its connection, or sends a frame
 * that differs from what we expect breaks the communicator with HP_IO naming the collective,
 * its sequence number and the rank. */
hp_status hp__tcp_run(hp__tcp_comm *c, const hp__tcp_desc *d, uint32_t phase, hp_err *err);

/* At least `bytes` of c->stage (HP_NOMEM breaks the communicator). */
hp_status hp__tcp_stage(hp__tcp_comm *c, size_t bytes, const char *what, hp_err *err);

/* Builds the group communicator for split: this rank is `rank` of `world` members; member i
 * is parent rank members[i], listening on the parent's host of that rank at ports[i]; lfd is
 * this rank's listening socket (taken over, closed either way). */
hp_status hp__tcp_group_new(hp__tcp_comm *parent, int rank, int world, const int *members,
                            const uint16_t *ports, int lfd, uint64_t comm_id, hp_comm **out,
                            hp_err *err);
/* A listening socket on host, port 0 (the kernel picks); *port is the one it got. */
hp_status hp__tcp_listen_on(const char *host, int want_port, int *lfd, uint16_t *port, hp_err *err);

void hp__tcp_destroy(hp_comm *c);

/* ---- tcp_coll.c ----------------------------------------------------------------------------- */

extern const hp_comm_vtable hp__tcp_vtable;

#endif
