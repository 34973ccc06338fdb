/* hp/program.h — the compiled form a worker runs: an ordered list of instructions (kernel or
 * collective, buffer refs, stream), a buffer plan (every value an offset into the arena of
 * its memory class, activations reusing space by liveness), and the parameter table
 * (parameter, gradient, init, shard). The compiler produces it (hp_lower), the coordinator
 * ships it (hp_program_pack, hp.v1.Program), the worker executes it and never compiles.
 *
 * A program owns its graph: instructions name a node, which gives the op, the attributes and
 * the output types. Views that do not move data (view, reshape, squeeze, unsqueeze, clone,
 * wait_tensor, same-dtype casts) become aliases of their input's storage, not instructions;
 * a transpose feeding only matrix products is folded into their calls (HP_INSTR_TRANS_*).
 *
 * Ownership: hp_program_free frees everything. Not thread-safe while being built.
 */
#ifndef HP_PROGRAM_H
#define HP_PROGRAM_H

#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_PROGRAM_FORMAT_VERSION 1

/* Memory classes (values match hp.v1.MemoryClass). */
typedef enum {
    HP_MEM_PARAM = 1, /* parameters and buffers: persistent */
    HP_MEM_GRAD = 2,  /* gradients: persistent, written by the step */
    HP_MEM_ACT = 3,   /* activations and data: one arena, reused by liveness */
    HP_MEM_COMM = 4,  /* collective staging (FSDP) */
    HP_MEM_COUNT
} hp_mem_class;

const char *hp_mem_class_name(hp_mem_class m);

#define HP_BUFFER_ALIGN 64

typedef struct hp_buffer {
    hp_mem_class mem;
    int64_t offset; /* bytes into the class's arena (of alias_of's storage for an alias) */
    int64_t bytes;  /* numel * dtype size */
    /* its value's type: the output type in the program's graph (graph storage, which lives as
     * long as the graph), never a copy */
    const hp_type *type;
    int32_t alias_of;              /* -1: own storage; else the buffer whose storage this is */
    int32_t value_node, value_out; /* the graph value it holds */
} hp_buffer;

enum {
    HP_INSTR_TRANS_A = 1 << 0, /* same bits as the backend's HP_CALL_TRANS_* */
    HP_INSTR_TRANS_B = 1 << 1,
    /* A parameter's (or buffer input's) f32 -> bf16 cast (mixed precision's param_dtype copy)
     * into a PARAM-class buffer that outlives the step: it runs only while the copy is stale
     * (the executor's first step, hp_exec_params_changed); the optimizer writes the copy
     * with each update (hp_adamw_param.param_bf16), so the step reads the f32 master once
     * instead of twice. */
    HP_INSTR_PARAM_CAST = 1 << 2,
};
/* Attention operands in [B, T, H, D] storage (same bits as the backend's HP_CALL_BTHD_*): the
 * lowering folds the head transposes around a fused attention (transpose(x, 1, 2) of a rank-4
 * value) into its instruction. Input k of _scaled_dot_product_flash_attention (q, k, v: k < 3)
 * or of its backward (g_out, q, k, v, out: k < 5) with HP_INSTR_BTHD_IN(k) reads the buffer of
 * the transpose's input (or a BTHD output's own buffer) as the [B, H, T, D] operand; output k
 * (the forward's out, the backward's gq, gk, gv) with HP_INSTR_BTHD_OUT(k) is written in
 * [B, T, H, D] order into its buffer, whose type stays the graph value's [B, H, T, D]; the
 * transposes that read it are aliases of that buffer. */
#define HP_INSTR_BTHD_IN(k)  (1u << (4 + (k)))
#define HP_INSTR_BTHD_OUT(k) (1u << (10 + (k)))
#define HP_INSTR_BTHD_MASK   (0x1fu << 4 | 0x7u << 10)

typedef struct hp_instr {
    int32_t node;   /* graph node this runs */
    int32_t stream; /* 0 compute, 1 comm */
    uint32_t flags;
    int n_in, n_out;
    int32_t *in; /* [n_in] buffer ids (program arena) */
    int32_t out[HP_MAX_OUTS];
} hp_instr;

/* A parameter as this rank holds it. Its storage placements on the program's mesh say how it
 * is split; the box says which part is this rank's: global elements [off[d], off[d] + len[d])
 * on each dim d sit at local [0, len[d]) of the local buffer, whose type (the placeholder's)
 * may be larger: the rest is padding, zero (an uneven split). */
typedef struct hp_param_slot {
    const char *fqn; /* graph arena */
    hp_type global;  /* the unsharded parameter */
    hp_init init;
    int32_t node;                               /* its placeholder */
    int32_t buffer;                             /* the local value (PARAM) */
    int32_t grad;                               /* its gradient (GRAD) */
    hp_placement pl[HP_MESH_MAX_DIMS];          /* storage placements, one per mesh dim */
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK]; /* this rank's box (hp_program_set_rank) */
} hp_param_slot;

typedef struct hp_data_slot {
    const char *name; /* fqn of the data placeholder, or "" */
    int32_t node;
    int32_t buffer; /* ACT, live from the start of the step */
} hp_data_slot;

typedef struct hp_memplan_stats {
    int64_t act_values_bytes; /* what activations would take with no reuse */
    int64_t act_arena_bytes;  /* what the plan takes */
    int n_aliases, n_folded_transposes;
} hp_memplan_stats;

typedef struct hp_program {
    hp_arena arena;
    hp_graph *graph; /* owned */
    int rank, world;
    /* The mesh the ranks form: the graph's (placement passes), else one dim "world" of all the
     * ranks (FSDP shards dim 0 over it). world is the product of its sizes. */
    hp_graph_mesh mesh;
    int64_t coord[HP_MESH_MAX_DIMS]; /* this rank's coordinates (row-major, last dim fastest) */
    /* Each mesh dim's link, from the job's mesh (0: unknown): bytes/s and seconds/message. */
    double link_bandwidth[HP_MESH_MAX_DIMS], link_latency[HP_MESH_MAX_DIMS];
    int32_t n_buffers, n_instrs, n_params, n_data;
    int32_t n_bufs; /* buffer inputs: slots params[n_params, n_params + n_bufs) (no gradient:
                       grad -1), filled from their init by the worker */
    hp_buffer *buffers;
    hp_instr *instrs;
    hp_param_slot *params;
    hp_data_slot *data;
    int32_t loss; /* buffer of the loss (ACT, live to the end) */
    int64_t arena_bytes[HP_MEM_COUNT];
    hp_memplan_stats stats;
} hp_program;

/* Lowers a verified joint graph (outputs: loss, then one gradient per parameter) to a
 * single-rank program. The graph is copied. Errors: HP_INVALID naming what does not fit the
 * joint-graph convention, HP_NOMEM. */
hp_status hp_lower(const hp_graph *joint, hp_program **out, hp_err *err);

void hp_program_free(hp_program *p);

/* The root buffer holding b's bytes (b itself unless it is an alias). */
static inline int32_t hp_program_root(const hp_program *p, int32_t b) {
    return p->buffers[b].alias_of >= 0 ? p->buffers[b].alias_of : b;
}

/* The PARAM-class buffer that slot i's HP_INSTR_PARAM_CAST instruction writes (its param_dtype
 * copy), -1 without one. */
int32_t hp_program_param_cast(const hp_program *p, int i);

/* Checks every index, offset and type against the graph and the arenas (a program from the
 * wire is untrusted). HP_INVALID naming the instruction or buffer. */
hp_status hp_program_verify(const hp_program *p, hp_err *err);

/* Makes p rank `rank`'s program: its mesh coordinates and every parameter's box. The compiler
 * gives rank 0's; a worker calls this with its own rank. HP_INVALID for a rank outside the
 * world. */
hp_status hp_program_set_rank(hp_program *p, int rank, hp_err *err);
/* The mesh coordinates of `rank`. */
void hp_program_coords(const hp_program *p, int rank, int64_t *coord);
/* Slot i's box at `rank` (any rank, not only p's): as hp_param_slot's off and len. Slots are
 * the parameters, then the buffer inputs. */
hp_status hp_program_box(const hp_program *p, int i, int rank, int64_t *off, int64_t *len,
                         hp_err *err);
/* Does `rank` hold a piece of parameter i that no lower rank holds (its coordinate is 0 on
 * every mesh dim the parameter is replicated over)? Each distinct piece has one owner: the
 * one that counts it in a norm and writes it to a checkpoint. */
bool hp_program_owns(const hp_program *p, int i, int rank);
/* The data-parallel position of `rank`: the data inputs are split on the batch over the mesh
 * dims where they are Shard(0) (flattened in mesh order); *index of *count. A program without
 * such dims reads the whole batch: 0 of 1 (an FSDP program: its rank of the world). */
void hp_program_data_rank(const hp_program *p, int rank, int *index, int *count);

/* Wire form (hp.v1.Program). pack: *data hp_malloc'd. unpack: untrusted bytes, verified. */
hp_status hp_program_pack(const hp_program *p, uint8_t **data, size_t *len, hp_err *err);
hp_status hp_program_unpack(const uint8_t *data, size_t len, hp_program **out, hp_err *err);

/* A human-readable listing: buffers, instructions, arenas (for `hpctl plan` and dumps). */
hp_status hp_program_print(const hp_program *p, char **text, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
