/* worker/executor.h — runs a Program on a backend: allocates one region per memory class,
 * resolves every instruction's buffers to device pointers once, then each step issues the
 * instructions in order on their streams (events order a consumer after a producer on
 * another stream). The executor never compiles and never decides anything the program did
 * not say.
 *
 * Ownership: the executor borrows the program and the backend (both must outlive it).
 * Threads: one thread drives an executor.
 */
#ifndef HP_WORKER_EXECUTOR_H
#define HP_WORKER_EXECUTOR_H

#include "hp/program.h"
#include "worker/backend.h"

typedef struct hp_exec hp_exec;

/* Per-instruction timing hook (profiling, traces): called after each instruction with its
 * index and the wall seconds spent issuing it (for synchronous backends: running it). */
typedef void (*hp_exec_trace_fn)(void *ctx, int32_t instr, double start_s, double end_s);

hp_status hp_exec_new(const hp_program *p, hp_backend *b, hp_exec **out, hp_err *err);
void hp_exec_free(hp_exec *e);

/* The device pointer of buffer b (aliases resolve to their storage). */
void *hp_exec_ptr(const hp_exec *e, int32_t b);
/* Bytes allocated per memory class, and in all. */
int64_t hp_exec_bytes(const hp_exec *e);

void hp_exec_set_trace(hp_exec *e, hp_exec_trace_fn fn, void *ctx);

/* The draw of the next steps' dropout masks (hp/rng.h): the run's seed and the training step
 * (0, 0 until set). Each native_dropout also gets where this rank's piece sits in the whole
 * tensor (from its placements, or an FSDP node's global_shape), so every sharding of a graph
 * drops the elements its one-rank form drops. */
void hp_exec_set_rng(hp_exec *e, uint64_t seed, uint64_t step);

/* Runs every instruction once (one forward + backward) and waits for the device. Errors name
 * the instruction and its node: "instruction 41 (node 57, mm): ...". The parameter casts
 * (HP_INSTR_PARAM_CAST: the bf16 copies of the parameters) run unless the caller said, since
 * the last step, that the copies are current. */
hp_status hp_exec_step(hp_exec *e, hp_err *err);

/* Runs only the instructions the loss depends on (the forward pass, and the collectives it
 * needs: every rank of a program skips the same ones) and waits for the device: the loss of
 * the data in the input buffers, for evaluation. Gradients are left as they were or
 * overwritten; the parameters and their copies are not touched. */
hp_status hp_exec_forward(hp_exec *e, hp_err *err);

/* Evaluation mode for the next runs (torch's model.eval()): every native_dropout keeps its
 * input, unscaled. */
void hp_exec_set_eval(hp_exec *e, bool eval);

/* The parameters' bf16 copies (hp_program_param_cast's buffers) hold the parameters' values:
 * the caller left the parameters alone since the last step, or updated every one of them with
 * its copy (hp_adamw_param.param_bf16). The next step skips the casts. */
void hp_exec_param_copies_current(hp_exec *e);

/* Seconds the compute stream spent blocked waiting for the comm stream, since creation:
 * communication that compute did not hide. */
double hp_exec_exposed_seconds(const hp_exec *e);

/* Reads the step's loss (after hp_exec_step). */
hp_status hp_exec_loss(const hp_exec *e, double *loss, hp_err *err);

#endif
