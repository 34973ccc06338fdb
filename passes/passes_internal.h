/* passes/passes_internal.h — what the files of passes/ share (hp__ prefix).
 *
 * Besides the memory plan, this is the toolkit the graph passes are written with:
 *
 * The rewriter (rewrite.c). A pass never edits its input: it builds a new graph node by
 * node while keeping a map from every old value (node, output) to its new value.
 *
 *     hp__rewrite rw;
 *     HP_TRY(hp__rewrite_start(&rw, in, err));
 *     for (int i = 0; i < in->n_nodes; i++) {
 *         if (want_to_change(i)) {
 *             hp_value x = hp__rewrite_get(&rw, in->nodes[i].in[0]);  // the new input
 *             hp_value y = hp__rewrite_build(&rw, HP_OP_..., &x, 1, attrs, n, err);
 *             if (!hp_value_ok(y)) goto fail;
 *             hp__rewrite_set(&rw, (hp_value){i, 0}, y);              // old value -> y
 *         } else if (hp__rewrite_copy(&rw, i, err) < 0) {
 *             goto fail;                                          // copy, inputs remapped
 *         }
 *     }
 *     return hp__rewrite_finish(&rw, out, err);  // outputs remapped; frees rw either way
 * fail:
 *     hp__rewrite_abort(&rw);
 *
 * hp__rewrite_set may be called again for the same old value (e.g. forward uses read one
 * gather, backward uses another): later copies read the latest mapping. A value may map to
 * any earlier new value (folding x -> its input). New-graph node ids are what
 * hp__rewrite_append / _build / _copy return; rw.out is the new graph, readable at any time
 * (its `nodes` array moves as nodes are added: hold ids, not pointers).
 *
 * Shared storage: hp__rewrite_copy (and hp_graph_append_like, which overlap, bucketing, fsdp
 * and canonicalize call for a node they keep as it is) copies only a node's inputs when the
 * input graph lends (in->lends, set by hp_compile on its own graphs): the new node points at
 * the old one's type and attribute arrays. So a pass must never write through an output
 * node's `out` or `attrs` (append a new node instead); hp_compile keeps every lender's arena
 * alive in the next graph (hp_graph_adopt_storage).
 *
 * Dead-code removal (dce.c) and the FLOPs of a node (cost.c) are here too, so that every pass
 * and the report agree on them (the bytes of a collective are public: hp_collective_bytes).
 * User lists and FSDP units for the scheduling passes are in sched_util.h.
 */
#ifndef HP_PASSES_INTERNAL_H
#define HP_PASSES_INTERNAL_H

#include "hp/passes.h"
#include "hp/program.h"

/* Memory plan: gives every own-storage buffer an offset in its class's arena. Activations
 * (HP_MEM_ACT) reuse space: two buffers share bytes only if their live ranges (producing
 * instruction to last reader, aliases included; graph outputs live to the end) are disjoint.
 * Fills p->arena_bytes and p->stats. */
hp_status hp__memplan(hp_program *p, hp_err *err);
/* hp_lower for hp_compile: `verified` says hp_graph_verify just passed on joint (the
 * verifier between passes), so the joint-graph checks skip a second full verify. */
hp_status hp__lower(const hp_graph *joint, bool verified, hp_program **out, hp_err *err);
/* hp_program_verify for hp_compile, which lowered p itself from a verified graph: with
 * graph_verified, p->graph (that graph plus the gradient copies the lowering appended, whose
 * types the instruction checks cover) is not verified a second time. */
hp_status hp__program_verify(const hp_program *p, bool graph_verified, hp_err *err);

/* Fills what a parameter slot takes from its placeholder node `id` of g: fqn, global type (its
 * global_shape when its storage is split), init, storage placements (the node's on a graph
 * mesh; FSDP's Shard(0) over the world otherwise). The box is the whole tensor until
 * hp_program_set_rank; buffers are left to the caller. */
void hp__param_slot_init(hp_param_slot *ps, const hp_graph *g, int32_t id);
/* p->mesh from p->graph's mesh, or one dim "world" of p->world ranks. */
void hp__program_mesh_init(hp_program *p);

/* ---- the rewriter ------------------------------------------------------------------------- */
typedef struct hp__rewrite {
    const hp_graph *in; /* borrowed: the graph being rewritten */
    hp_graph *out;      /* the new graph, owned by the rewriter until finish */
    int32_t *slot0;     /* [in->n_nodes + 1]: first value slot of each old node */
    hp_value *map;      /* [slots]: old value -> new value; HP_NO_VALUE until set */
} hp__rewrite;

/* Starts an empty new graph for `in`. HP_NOMEM (then nothing needs freeing). */
hp_status hp__rewrite_start(hp__rewrite *rw, const hp_graph *in, hp_err *err);
/* The new value of old value v (HP_NO_VALUE if not mapped yet). */
hp_value hp__rewrite_get(const hp__rewrite *rw, hp_value v);
/* Maps old value `v` to new value `now`. */
void hp__rewrite_set(hp__rewrite *rw, hp_value v, hp_value now);
/* Appends a copy of old node `id` (op, attributes, output types) reading the new values of
 * its inputs, and maps its outputs to the copy. Returns the new node id, or -1 with err set
 * (an input not mapped yet is HP_INTERNAL naming the node; HP_NOMEM; HP_LIMIT). */
int hp__rewrite_copy(hp__rewrite *rw, int id, hp_err *err);
/* Appends a node to the new graph with explicit output types (no shape inference: the
 * verifier between passes checks them). Returns the new id or -1 with err set. */
int hp__rewrite_append(hp__rewrite *rw, hp_op op, const hp_value *in, int n_in, const hp_type *out,
                       int n_out, const hp_attr *attrs, int n_attrs, hp_err *err);
/* Appends a node whose output types come from the op's shape rule (hp_build), for nodes a
 * pass invents. Returns output 0, or HP_NO_VALUE with err set to the builder's message. */
hp_value hp__rewrite_build(hp__rewrite *rw, hp_op op, const hp_value *in, int n_in,
                           const hp_attr *attrs, int n_attrs, hp_err *err);
/* Sets the new graph's outputs to the new values of the old outputs and hands the graph to
 * *out. Frees the rewriter's state whether it succeeds or not (on failure *out is NULL and
 * the new graph is freed). An unmapped output is HP_INTERNAL. */
hp_status hp__rewrite_finish(hp__rewrite *rw, hp_graph **out, hp_err *err);
/* Frees everything, the new graph included (after a failure). */
void hp__rewrite_abort(hp__rewrite *rw);

/* A fusion pass's rebuild of in (fuse_cross_entropy.c, fuse_swiglu.c): node i is left out when
 * role[i] < 0 (a fused op made at another node stands for its values), copied when 0, and
 * handed to emit when > 0, which builds the fused op and sets (hp__rewrite_set) the old values
 * it stands for; then the nodes left unread are removed (hp__dce_take). in without placements;
 * with no role > 0, *out is a copy. */
typedef hp_status (*hp__fuse_emit)(hp__rewrite *rw, int node, int role, void *ctx, hp_err *err);
hp_status hp__rewrite_fused(const hp_graph *in, const int32_t *role, hp__fuse_emit emit, void *ctx,
                            hp_graph **out, hp_err *err);

/* ---- shared analyses ---------------------------------------------------------------------- */

/* Removes nodes none of whose outputs reaches a graph output; placeholders always stay (they
 * are the graph's interface). *removed (may be NULL) gets the count. The survivors keep their
 * order. HP_NOMEM. */
hp_status hp__dce(const hp_graph *in, hp_graph **out, int *removed, hp_err *err);
/* The same on a graph the caller hands over (a rewrite's fresh output, without a mesh or
 * placements, which a copy would drop): g itself when nothing is dead, else a copy of the live
 * nodes and g is freed; g is freed on failure too. */
hp_status hp__dce_take(hp_graph *g, hp_graph **out, hp_err *err);
/* Whether DCE would remove nothing (hp__pass_entry.no_op). */
bool hp__dce_no_op(const hp_graph *in);

/* FLOPs of node `id` as the cost model counts them: 2*M*N*K for mm/addmm (times the batch for
 * bmm), 4*B*H*T*S*D for an attention forward and 8*B*H*T*S*D for its backward (causal
 * masking not discounted), 0 for everything else (memory-bound ops are not modelled). */
double hp__node_flops(const hp_graph *g, int id);

/* Per-rank memory (cost.c): parameters and gradients are the parameter placeholders' (local
 * shard) bytes, the optimizer AdamW's two f32 moments per local element, activations and comm
 * the program's arenas (p may be NULL: then 0). */
void hp__memory_report(const hp_graph *g, const hp_program *p, int64_t grad_accum,
                       hp_memory_report *m);

/* The cost model of one step of one rank (its assumptions are at the top of cost.c). */
/* The cost model of one step of one rank (its assumptions are at the top of cost.c).
 * prog: g's lowering, or NULL. With it, what runs is priced: a view the lowering materializes
 * (a transpose not folded into a matrix product) is a copy, a node with no instruction is
 * free; without it, every non-view node is a kernel and every view free. */
hp_status hp__cost_estimate(const hp_graph *g, const hp_program *prog, const hp_job *job,
                            hp_cost_estimate *c, hp_err *err);

/* ---- the pass table (pipeline.c) ---------------------------------------------------------- */
typedef struct hp__pass_entry {
    const char *name;
    hp_pass_fn fn;
    /* the default switch: does the pass run for this job and world? (the job's switches
     * override it) */
    bool (*wanted)(const hp_pass_ctx *ctx);
    /* NULL, or a quick check that the pass would change nothing on this graph: the pipeline
     * then goes on with its input instead of a copy (fn itself always returns a new graph, as
     * its callers free both) */
    bool (*no_op)(const hp_graph *in);
} hp__pass_entry;

/* The pipeline's passes in order; *n gets the count. */
const hp__pass_entry *hp__passes(int *n);
/* A pass by name, NULL if none. */
const hp__pass_entry *hp__pass_find(const char *name);

#endif
