/* daemon/rpc.h — the control service hp.v1.Coordinator on the gRPC C core.
 *
 * One server per process. A completion-queue thread hands every gRPC event to the daemon's
 * libuv loop (uv_async); all service logic, every hpd_* call and every batch start runs on the
 * loop thread. Mutating RPCs (SubmitJob, CancelJob, CheckpointJob) need
 * `authorization: Bearer <hpd_token>`; reads (GetJob, ListJobs, WatchJob, GetPlan, GetTrace) are
 * allowed without a token. CheckpointJob of a job that is not RUNNING is FAILED_PRECONDITION.
 */
#ifndef HP_DAEMON_RPC_H
#define HP_DAEMON_RPC_H

#include "daemon/hpd.h"

/* Starts serving on listen ("HOST:PORT"; port 0 picks a free one) on hpd_loop(d). With
 * tls_cert and tls_key (PEM file paths, both or neither) the port speaks TLS. *port gets the
 * bound port. Calls grpc_init (the matching grpc_shutdown runs when the server is gone).
 * Fails with HP_IO when the address cannot be bound, HP_INVALID for a bad address or TLS
 * files. Loop thread only; at most one server at a time. */
hp_status hpd_rpc_start(hpd *d, const char *listen, const char *tls_cert, const char *tls_key,
                        int *port, hp_err *err);

/* Begins the graceful shutdown: the port closes at once, running calls get a grace period
 * (HPD_RPC_GRACE_MS) and are then cancelled. Returns at once; the loop must keep running until
 * the server's handles close (the loop then has nothing left of the RPC layer). Idempotent;
 * a no-op when no server runs. Loop thread only. */
void hpd_rpc_stop(hpd *d);

#define HPD_RPC_GRACE_MS 2000
/* The largest request the server accepts (a Job with an inline graph). */
#define HPD_RPC_MAX_RECV (64 << 20)
/* What decoding one request may allocate (protobuf-c's structs, estimated from the wire before
 * decoding and counted while it runs): 8x the largest request, and nothing is allocated past it: a
 * bomb costs a scan of its head. */
#define HPD_RPC_DECODE_MAX ((size_t)512 << 20)

#endif
