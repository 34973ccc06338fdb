/* graph/proto_internal.h — helpers shared by the proto importers in graph/ (proto_io.c,
 * job.c, job_proto.c): quoting untrusted strings for error messages, checking them, and
 * job validation without the graph verify. */
#ifndef HP_PROTO_INTERNAL_H
#define HP_PROTO_INTERNAL_H

#include "hp/graph.h"

/* Writes s into buf for an error message: printable ASCII as is, other bytes as \xNN, cut
 * with "..." past about 48 characters. NULL prints as an empty string. Returns buf. */
#define HP__QUOTE_MAX 64
const char *hp__quote(const char *s, char buf[HP__QUOTE_MAX]);

/* Checks an untrusted string: strlen(s) < max (HP_LIMIT otherwise) and only printable
 * ASCII other than space, quotes and backslash (HP_INVALID), so that it prints and parses
 * back in the text IR. `what` names the field for the message. NULL counts as "". */
hp_status hp__check_str(const char *s, size_t max, const char *what, hp_err *err);

/* hp_job_validate, optionally without re-verifying the graph (job_proto.c has just imported,
 * and so verified, it). Defined in job.c. */
struct hp_job;
hp_status hp__job_validate(const struct hp_job *job, bool verify_graph, hp_err *err);

/* The length of s (0 for NULL). */
static inline size_t hp__strlen0(const char *s) {
    size_t n = 0;
    if (s)
        while (s[n]) n++;
    return n;
}

#endif
