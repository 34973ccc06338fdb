/* hp/proto_io.h — the graph on the wire: hp_graph <-> hp.v1.Graph (proto/hp/v1/graph.proto),
 * as protobuf-c messages or as bytes.
 *
 * Import trusts nothing: every count, index, dim, string and attribute is checked before it
 * is used, and the error names the offender ("node 7: unknown op 'foo'", "node 3 (mm): input
 * 1 refers to node 9, not an earlier node"). Memory is bounded: a message over
 * HP_PROTO_MAX_BYTES is refused before decoding, and decoding may use at most
 * HP_PROTO_DECODE_FACTOR times the message size (a hostile message cannot make protobuf-c
 * allocate far more than it sent). After the structural checks the graph runs through
 * hp_graph_verify, so an imported graph is a verified graph.
 *
 * All protobuf-c allocations go through hp_malloc/hp_free (fault injection covers decoding).
 * No I/O here; job files are in hp/job.h.
 */
#ifndef HP_PROTO_IO_H
#define HP_PROTO_IO_H

#include "hp/graph.h"

#include <protobuf-c/protobuf-c.h>

#include "hp/v1/graph.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version written into Graph.format_version; import refuses 0 and anything newer. */
#define HP_GRAPH_FORMAT_VERSION 1

/* Largest message unpack accepts. Graphs carry no weights: a node takes ~40 bytes on the
 * wire, so this holds ~1.5M nodes, far beyond the 405B joint graph. */
#define HP_PROTO_MAX_BYTES ((size_t)64 << 20)
/* Decoding a message of n bytes may allocate at most HP_PROTO_DECODE_FACTOR * n +
 * HP_PROTO_DECODE_SLACK bytes, malloc overhead counted (protobuf-c's structs are larger than
 * their encodings: real graphs take about 14x, a flood of empty repeated messages ~50x).
 * Worst case: 2 GiB for a message at HP_PROTO_MAX_BYTES. */
#define HP_PROTO_DECODE_FACTOR 32
#define HP_PROTO_DECODE_SLACK  ((size_t)1 << 20)

/* A protobuf-c allocator over hp_malloc/hp_free with a byte budget. Caller storage; use one
 * per decode (it counts). `nomem` is set when hp_malloc failed, `over_budget` when the budget
 * would have been exceeded: both make protobuf-c's unpack return NULL. */
typedef struct hp_proto_alloc {
    ProtobufCAllocator base; /* pass &a.base to protobuf-c */
    size_t used, budget;
    bool nomem, over_budget;
    hp_arena *arena; /* hp_proto_alloc_init_arena: allocations from here, frees ignored */
} hp_proto_alloc;

/* Sets up an allocator for decoding a message of msg_len bytes (budget as above). */
void hp_proto_alloc_init(hp_proto_alloc *a, size_t msg_len);
/* The same budget, but every allocation comes from `arena` (caller storage, initialized) and
 * frees are ignored: for a message decoded, imported and dropped at once, the caller's
 * hp_arena_fini frees it all. Never free_unpacked such a message. A malloc per field and
 * free_unpacked's walk were a quarter of reading a 1024-layer job file. */
void hp_proto_alloc_init_arena(hp_proto_alloc *a, size_t msg_len, hp_arena *arena);
/* Turns a failed unpack into an error: HP_NOMEM, HP_LIMIT (over budget) or HP_PARSE
 * ("<what>: malformed message (N bytes)"). */
hp_status hp_proto_unpack_error(const hp_proto_alloc *a, const char *what, size_t len, hp_err *err);

/* protobuf-c copies a `string` field into a NUL-terminated char * without looking inside, so
 * "mm\0evil" on the wire reads as "mm" and invalid UTF-8 passes through to clients that
 * refuse it. This walks the encoded message (len bytes, already unpacked successfully with
 * desc) and checks every `string` field, nested messages included: no NUL byte (HP_INVALID)
 * and valid UTF-8 (HP_INVALID: no overlong forms, surrogates or code points past U+10FFFF).
 * The message names the field ("what: Node.op: string has a NUL byte at byte 2"). Unknown
 * fields are skipped; nesting deeper than HP_PROTO_MAX_DEPTH is HP_LIMIT. Every decoder of
 * untrusted bytes calls it after unpack. */
#define HP_PROTO_MAX_DEPTH 64
hp_status hp_proto_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                 size_t len, const char *what, hp_err *err);

/* ---- message level (for embedding a graph in other messages: jobs, RPCs) --------------------- */

/* Builds msg describing g. Every message, array and string of the result is allocated in
 * `arena` (strings may point into g's arena): the result lives until the first of
 * hp_arena_fini(arena) and hp_graph_free(g), and is never passed to free_unpacked.
 * Errors: HP_NOMEM; HP_INVALID for a graph holding a sticky builder error. */
hp_status hp_graph_export(const hp_graph *g, hp_arena *arena, Hp__V1__Graph **msg, hp_err *err);

/* Builds a new verified graph from msg (borrowed; may come from an untrusted peer). On
 * success *out owns a graph the caller frees with hp_graph_free; on failure *out is NULL and
 * err names the offender: HP_INVALID (bad field or reference), HP_NOT_FOUND (unknown op or
 * attribute name), HP_LIMIT (a count or size over its bound), HP_UNSUPPORTED (a newer
 * format version), HP_NOMEM, or whatever hp_graph_verify reports. */
hp_status hp_graph_import(const Hp__V1__Graph *msg, hp_graph **out, hp_err *err);

/* ---- bytes ----------------------------------------------------------------------------------- */

/* Serialises g. On success *data is hp_malloc'd (caller hp_frees) and *len its size.
 * HP_LIMIT if the encoding exceeds HP_PROTO_MAX_BYTES; HP_NOMEM. */
hp_status hp_graph_pack(const hp_graph *g, uint8_t **data, size_t *len, hp_err *err);

/* Decodes and imports len bytes (untrusted). As hp_graph_import, plus HP_LIMIT for a message
 * over HP_PROTO_MAX_BYTES or one that decodes over budget and HP_PARSE for bytes that are not
 * a Graph message. */
hp_status hp_graph_unpack(const uint8_t *data, size_t len, hp_graph **out, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
