/* hp/text.h — the text form of the IR (`.hpir`): print a graph, parse it back.
 *
 * One node per line, QBE/MLIR-like (the grammar is in docs/hpir.md):
 *
 *     hpir 1
 *     %0: f32[2048,256] = placeholder() {kind=param, fqn="tok_embeddings.weight", init=normal(0,1)}
 *     %5: f32[8,16,256] = embedding(%0, %4) {padding_idx=-1}
 *     %9: (f32[8,16,256], f32[8,16]) = _fused_rms_norm(%5, %1) {eps=1e-05}
 *     %12: f32[128,256] = view(%9) {shape=[128,256]}
 *     return %40, %41
 *
 * parse(print(g)) equals g (hp_graph_eq) for every graph, floats included: they are printed
 * with the fewest digits that read back to the same double (inf, -inf, nan spelled so).
 * The parser is bounded (HP_MAX_NODES, HP_MAX_INPUTS, HP_MAX_RANK, HP_MAX_STR, int64
 * overflow) and never returns a graph that hp_graph_verify rejects.
 * Numbers assume the C numeric locale (the libraries never call setlocale).
 * No threads; no I/O but the two file helpers.
 */
#ifndef HP_TEXT_H
#define HP_TEXT_H

#include "hp/graph.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HP_TEXT_VERSION 1
/* Largest .hpir text hp_graph_parse and hp_graph_read_file accept (a 405B joint graph is a
 * few MiB). */
#define HP_TEXT_MAX_FILE ((size_t)1 << 30)

/* Prints g into a fresh hp_malloc'd, NUL-terminated buffer (*text, caller frees with
 * hp_free; *len excludes the NUL; len may be NULL). Works on any graph, verified or not (a
 * dump of a broken graph is how one debugs it); only a verified graph is sure to parse back.
 * Errors: HP_NOMEM (then *text is NULL). */
hp_status hp_graph_print(const hp_graph *g, char **text, size_t *len, hp_err *err);

/* Prints g to f. HP_NOMEM, or HP_IO if the stream reports an error. */
hp_status hp_graph_fprint(const hp_graph *g, FILE *f, hp_err *err);

/* Writes node `id` of g as its one-line text form (no newline) into buf, truncated to len-1
 * bytes; returns buf. For error messages and pass explanations; never fails. */
char *hp_node_str(const hp_graph *g, int id, char *buf, size_t len);

/* Parses text[0..len) (need not be NUL-terminated) into a new graph (*out, caller frees with
 * hp_graph_free), built with hp_graph_append and then checked with hp_graph_verify.
 * On failure *out is NULL and err names the line (and column where there is one) and what
 * was expected: "line 12:21: expected ')' after the inputs, got '%0'". Errors: HP_PARSE (syntax,
 * unknown names, bad references), HP_LIMIT (a bound above exceeded), HP_INVALID (the
 * verifier's verdict, prefixed with the node's line), HP_NOMEM. */
hp_status hp_graph_parse(const char *text, size_t len, hp_graph **out, hp_err *err);

/* Reads and parses a .hpir file (at most HP_TEXT_MAX_FILE bytes); errors are prefixed with
 * the path. */
hp_status hp_graph_read_file(const char *path, hp_graph **out, hp_err *err);

/* Prints g and writes it to path atomically (temp file, fsync, rename). */
hp_status hp_graph_write_file(const hp_graph *g, const char *path, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
