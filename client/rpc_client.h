/* client/rpc_client.h — a small blocking client for hp.v1.Coordinator over the gRPC C core.
 *
 * One channel and one pluck completion queue per client; every call blocks the calling thread
 * until it completes or its deadline passes. Not thread-safe: one call at a time per client.
 * The result of a call is a gRPC status code (GRPC_STATUS_OK = 0) with its message in
 * hp_rpc_result; transport failures come back the same way (UNAVAILABLE, DEADLINE_EXCEEDED).
 */
#ifndef HP_CLIENT_RPC_CLIENT_H
#define HP_CLIENT_RPC_CLIENT_H

#include "hp/base.h"

#include "hp/v1/control.pb-c.h"

#include <stdbool.h>

#define HP_RPC_DEFAULT_SERVER     "127.0.0.1:7070"
#define HP_RPC_DEFAULT_TIMEOUT_MS 30000
#define HP_RPC_MAX_RECV           (64 << 20)

typedef struct hp_rpc_client hp_rpc_client;

typedef struct hp_rpc_opts {
    const char *server; /* HOST:PORT; NULL: $HP_SERVER or HP_RPC_DEFAULT_SERVER */
    const char *token;  /* bearer token for mutating calls; NULL: none sent */
    const char *tls_ca; /* PEM file of the CA that signed the server's certificate; NULL: plain */
    int timeout_ms;     /* per unary call; <= 0: HP_RPC_DEFAULT_TIMEOUT_MS */
} hp_rpc_opts;

typedef struct hp_rpc_result {
    int code;                 /* grpc_status_code */
    char msg[HP_ERR_MSG_MAX]; /* the server's (or the transport's) message */
} hp_rpc_result;

/* Opens a channel (connects lazily). Calls grpc_init; hp_rpc_client_close undoes it. */
hp_status hp_rpc_client_open(const hp_rpc_opts *o, hp_rpc_client **out, hp_err *err);
void hp_rpc_client_close(hp_rpc_client *c);

/* One unary call: method is the full path ("/hp.v1.Coordinator/GetJob"); the request is
 * already packed; auth sends the token. On OK, *resp is the unpacked reply (free with
 * protobuf_c_message_free_unpacked). Returns res->code. */
int hp_rpc_unary_raw(hp_rpc_client *c, const char *method, const uint8_t *req, size_t req_len,
                     bool auth, const ProtobufCMessageDescriptor *resp_desc,
                     ProtobufCMessage **resp, hp_rpc_result *res);
/* The same with a message to pack. */
int hp_rpc_unary(hp_rpc_client *c, const char *method, const ProtobufCMessage *req, bool auth,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 hp_rpc_result *res);

/* WatchJob: calls fn for every event until the stream ends (the job finished: OK), fn returns
 * nonzero (the call is cancelled; the result is OK), or an error. No deadline. The request goes
 * as given: set req->batch to let the server coalesce events; JobEvent{batch} messages are
 * unpacked here, so fn sees one plain event at a time either way (never a batch). */
typedef int (*hp_rpc_event_fn)(void *ctx, const Hp__V1__JobEvent *ev);
int hp_rpc_watch(hp_rpc_client *c, const Hp__V1__WatchJobRequest *req, hp_rpc_event_fn fn,
                 void *ctx, hp_rpc_result *res);

/* "NOT_FOUND" for 5 and so on. */
const char *hp_rpc_code_name(int code);

/* The state dir: $HP_STATE_DIR, else ~/.local/state/hp. Writes into buf (size n). */
hp_status hp_rpc_state_dir(char *buf, size_t n, hp_err *err);

/* The token: flag (if non-NULL and non-empty), else $HP_TOKEN, else the content of
 * STATE_DIR/token (trailing whitespace removed). *out is hp_malloc'd, or NULL when there is
 * no token anywhere (not an error: reads need none). */
hp_status hp_rpc_find_token(const char *flag, char **out, hp_err *err);

#endif
