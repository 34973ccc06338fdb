/* worker/trace.h — per-rank Chrome/Perfetto traces of chosen training steps.
 *
 * A recorder holds the slices of one step at a time: hp_trace_begin starts a step, every
 * kernel and collective adds a slice (from any thread), hp_trace_end turns them into one
 * Chrome trace document and stops recording:
 *
 *   {"traceEvents": [metadata..., {"ph":"X","name":"mm","cat":"compute","pid":R,"tid":1,
 *                                  "ts":US,"dur":US,"args":{"instr":41}}, ...],
 *    "displayTimeUnit": "ms", "otherData": {"rank":R,"step":S,"job":"NAME"}}
 *
 * Track (tid) 1 is compute, 2 communication; pid is the rank. Slice times are given in
 * CLOCK_MONOTONIC seconds (what the executor and the comm thread measure) and written as
 * CLOCK_REALTIME microseconds since the epoch, so that the ranks of one host line up.
 *
 * What it does not do: decide which steps to trace (the training loop does), or write files.
 *
 * Threads: hp_trace_add may be called from any thread; it is a relaxed atomic load and a
 * return while no step is being recorded. The other calls belong to one thread (the training
 * loop), and hp_trace_end must only run when no other thread can still add to the step.
 */
#ifndef HP_WORKER_TRACE_H
#define HP_WORKER_TRACE_H

#include "hp/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { HP_TRACE_COMPUTE = 1, HP_TRACE_COMM = 2 }; /* the tracks (Chrome tids) */

typedef struct hp_trace hp_trace;

/* A recorder for `rank` of job `job` (copied; may be NULL or ""). HP_NOMEM. */
hp_status hp_trace_new(int rank, const char *job, hp_trace **out, hp_err *err);
/* NULL is fine. */
void hp_trace_free(hp_trace *t);

/* Starts recording `step` (dropping anything left from an earlier step). */
void hp_trace_begin(hp_trace *t, int64_t step);
/* Whether a step is being recorded. Any thread. */
bool hp_trace_recording(const hp_trace *t);

/* Adds a slice to the step being recorded (a no-op when none is): track HP_TRACE_COMPUTE or
 * HP_TRACE_COMM; name is copied (any bytes: JSON escaping and UTF-8 repair happen at the end);
 * start_s/end_s CLOCK_MONOTONIC seconds; instr the program instruction (< 0: none); bytes the
 * collective's payload (< 0: unknown). A slice that cannot be stored (out of memory) is
 * counted as dropped. Any thread. */
void hp_trace_add(hp_trace *t, int track, const char *name, double start_s, double end_s,
                  int32_t instr, int64_t bytes);

/* Stops recording and returns the step's trace document: *json hp_malloc'd (free with
 * hp_free), *len its length without the terminating NUL. max_bytes > 0 bounds the document:
 * the latest slices are dropped until it fits (otherData.dropped_slices says how many;
 * *dropped too, when not NULL). HP_INVALID when no step is being recorded; HP_LIMIT when even
 * the metadata alone exceeds max_bytes; HP_NOMEM. */
hp_status hp_trace_end(hp_trace *t, size_t max_bytes, char **json, size_t *len, int64_t *dropped,
                       hp_err *err);

/* The step being (or last) recorded. */
int64_t hp_trace_step(const hp_trace *t);

/* CLOCK_MONOTONIC seconds, the clock slices are given in. */
double hp_trace_now_s(void);

#endif
