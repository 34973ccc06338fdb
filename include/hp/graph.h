/* hp/graph.h — the IR: dtypes, tensor types, the op table, nodes, graphs and the builder.
 *
 * A graph is a list of nodes in topological order. A node has an op from the op table
 * (graph/ops.def), input value refs (node, output index) to earlier nodes, attributes, and
 * typed outputs (dtype + static shape). Placeholders come first: parameters (FQN order),
 * buffers, then data. Outputs are value refs; for a joint graph the loss first, then one
 * gradient per parameter in parameter order.
 *
 * Ownership: a graph owns everything reachable from it (nodes, attributes, strings) in its
 * arena; pointers into it are borrowed and stay valid until hp_graph_free, except `nodes`,
 * which may move when nodes are added: hold node ids, not hp_node pointers, across additions.
 * Threads: a graph is not shared between threads while it is being modified.
 * No I/O here: the text form, proto import/export and evaluation live in their own headers.
 */
#ifndef HP_GRAPH_H
#define HP_GRAPH_H

#include "hp/base.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ---------------------------------------------------------------------------------- */
#define HP_DTYPE_LIST(X)                                                                           \
    X(F32, "f32", 4, 1)                                                                            \
    X(BF16, "bf16", 2, 1)                                                                          \
    X(F16, "f16", 2, 1)                                                                            \
    X(I32, "i32", 4, 0)                                                                            \
    X(I64, "i64", 8, 0)                                                                            \
    X(BOOL, "bool", 1, 0)

typedef enum {
#define X(e, name, size, is_float) HP_##e,
    HP_DTYPE_LIST(X)
#undef X
        HP_DTYPE_COUNT
} hp_dtype;

const char *hp_dtype_name(hp_dtype dt);
size_t hp_dtype_size(hp_dtype dt);
bool hp_dtype_is_float(hp_dtype dt);
/* Parses "f32", "bf16", ...; HP_PARSE naming the text otherwise. */
hp_status hp_dtype_parse(const char *s, hp_dtype *dt, hp_err *err);

/* ---- tensor types ---------------------------------------------------------------------------- */
#define HP_MAX_RANK 8
/* Upper bound on any dim and on a tensor's element count: keeps size arithmetic in int64 and
 * rejects absurd shapes from files before anything is allocated. */
#define HP_MAX_DIM   ((int64_t)1 << 40)
#define HP_MAX_NUMEL ((int64_t)1 << 50)

typedef struct hp_type {
    hp_dtype dtype;
    int rank;
    int64_t shape[HP_MAX_RANK];
} hp_type;

hp_type hp_type_make(hp_dtype dt, int rank, const int64_t *shape);
int64_t hp_type_numel(const hp_type *t);
bool hp_type_eq(const hp_type *a, const hp_type *b);
/* Writes "f32[8,256]" (scalars "f32[]") into buf; returns buf. */
char *hp_type_str(const hp_type *t, char *buf, size_t len);
/* Checks rank, dims (>= 0, <= HP_MAX_DIM) and numel bound. */
hp_status hp_type_check(const hp_type *t, hp_err *err);

/* ---- attributes ------------------------------------------------------------------------------
 * X(ENUM, "name", KIND). The op table says which keys an op requires and which it accepts. */
#define HP_ATTR_LIST(X)                                                                            \
    X(DIM, "dim", INT)                    /* one dimension (negative counts from the end) */       \
    X(DIMS, "dims", INTS)                 /* reduction dims */                                     \
    X(KEEPDIM, "keepdim", INT)            /* 0 | 1 */                                              \
    X(SHAPE, "shape", INTS)               /* view, expand, full, zeros, ones, slice_backward */    \
    X(PERM, "perm", INTS)                 /* permute */                                            \
    X(DIM0, "dim0", INT)                  /* transpose */                                          \
    X(DIM1, "dim1", INT)                  /* transpose */                                          \
    X(START, "start", INT)                /* slice */                                              \
    X(END, "end", INT)                    /* slice (clamped to the dim, as Python does) */         \
    X(STEP, "step", INT)                  /* slice, >= 1 */                                        \
    X(VALUE, "value", FLOAT)              /* full, *_scalar, threshold_backward */                 \
    X(EXPONENT, "exponent", FLOAT)        /* pow */                                                \
    X(ALPHA, "alpha", FLOAT)              /* addmm */                                              \
    X(BETA, "beta", FLOAT)                /* addmm */                                              \
    X(DTYPE, "dtype", DTYPE)              /* _to_copy, full, zeros, ones */                        \
    X(EPS, "eps", FLOAT)                  /* _fused_rms_norm */                                    \
    X(THETA, "theta", FLOAT)              /* rotary_emb base */                                    \
    X(INVERSE, "inverse", INT)            /* rotary_emb: rotate by -angle (its gradient) */        \
    X(SCALE, "scale", FLOAT)              /* attention score scale */                              \
    X(CAUSAL, "causal", INT)              /* attention mask */                                     \
    X(APPROXIMATE, "approximate", INT)    /* gelu: 0 none, 1 tanh */                               \
    X(REDUCTION, "reduction", INT)        /* nll_loss: 0 none, 1 mean, 2 sum (ATen's enum) */      \
    X(IGNORE_INDEX, "ignore_index", INT)  /* nll_loss */                                           \
    X(NUM_WEIGHTS, "num_weights", INT)    /* embedding_dense_backward */                           \
    X(PADDING_IDX, "padding_idx", INT)    /* embedding, -1 for none */                             \
    X(GROUP, "group", STR)                /* collectives: mesh dimension name */                   \
    X(GROUP_SIZE, "group_size", INT)      /* collectives: ranks in the group */                    \
    X(REDUCE_OP, "reduce_op", INT)        /* collectives: hp_reduce_op */                          \
    X(KIND, "kind", INT)                  /* placeholder: hp_input_kind */                         \
    X(FQN, "fqn", STR)                    /* placeholder: fully qualified name */                  \
    X(INIT, "init", INIT)                 /* placeholder: parameter init spec */                   \
    X(GLOBAL_SHAPE, "global_shape", INTS) /* placeholder: unsharded shape (FSDP shards dim 0) */   \
    X(DIAGONAL, "diagonal", INT)          /* tril: the diagonal kept last (0: the main one) */     \
    X(P, "p", FLOAT)                      /* native_dropout: the probability of dropping */

typedef enum {
#define X(e, name, kind) HP_ATTR_##e,
    HP_ATTR_LIST(X)
#undef X
        HP_ATTR_COUNT
} hp_attr_key;

typedef enum {
    HP_ATTR_KIND_INT,
    HP_ATTR_KIND_FLOAT,
    HP_ATTR_KIND_INTS,
    HP_ATTR_KIND_DTYPE,
    HP_ATTR_KIND_STR,
    HP_ATTR_KIND_INIT
} hp_attr_kind;

#define HP_MAX_ATTR_INTS HP_MAX_RANK
#define HP_MAX_STR       256 /* FQNs, group names */

/* Parameter initialisation, as torch.nn.init names it. */
typedef enum {
    HP_INIT_NONE = 0, /* data inputs, buffers filled by the runtime */
    HP_INIT_ZEROS,
    HP_INIT_ONES,
    HP_INIT_CONSTANT,     /* value = a */
    HP_INIT_NORMAL,       /* mean, std */
    HP_INIT_TRUNC_NORMAL, /* mean, std, truncated to [a, b] (absolute bounds, as torch) */
    HP_INIT_UNIFORM,      /* [a, b) */
    HP_INIT_ARANGE,       /* element i (its global flat index) = i: a buffer's mesh coordinate */
} hp_init_kind;

typedef struct hp_init {
    hp_init_kind kind;
    double mean, std, a, b;
} hp_init;

/* "zeros", "ones", "constant(0.5)", "normal(0,0.02)", "trunc_normal(0,0.02,-0.06,0.06)",
 * "uniform(-0.1,0.1)", "arange": the form the text IR and hpctl use. */
char *hp_init_str(const hp_init *init, char *buf, size_t len);
hp_status hp_init_parse(const char *s, hp_init *init, hp_err *err);
hp_status hp_init_check(const hp_init *init, hp_err *err);

typedef struct hp_attr {
    hp_attr_key key;
    hp_attr_kind kind; /* always hp_attr_key_kind(key) */
    union {
        int64_t i;
        double f;
        struct {
            int n;
            int64_t v[HP_MAX_ATTR_INTS];
        } ints;
        hp_dtype dtype;
        const char *s; /* arena-owned once in a graph */
        hp_init init;
    };
} hp_attr;

const char *hp_attr_key_name(hp_attr_key k);
hp_attr_kind hp_attr_key_kind(hp_attr_key k);
/* Looks a key up by name; HP_NOT_FOUND naming it otherwise. */
hp_status hp_attr_key_parse(const char *name, hp_attr_key *k, hp_err *err);

/* Attribute constructors for the builder. */
hp_attr hp_attr_int(hp_attr_key k, int64_t v);
hp_attr hp_attr_float(hp_attr_key k, double v);
hp_attr hp_attr_ints(hp_attr_key k, int n, const int64_t *v);
hp_attr hp_attr_dtype(hp_attr_key k, hp_dtype dt);
hp_attr hp_attr_str(hp_attr_key k, const char *s);
hp_attr hp_attr_initspec(hp_init init);

typedef enum { HP_INPUT_PARAM = 0, HP_INPUT_BUFFER = 1, HP_INPUT_DATA = 2 } hp_input_kind;
typedef enum { HP_REDUCE_SUM = 0, HP_REDUCE_AVG = 1, HP_REDUCE_MAX = 2 } hp_reduce_op;

#define HP_MAX_OUTS 4 /* outputs of one node */
typedef enum { HP_NLL_NONE = 0, HP_NLL_MEAN = 1, HP_NLL_SUM = 2 } hp_nll_reduction;

/* ---- placements (DTensor's words) -----------------------------------------------------------
 * How a value is laid out over one dimension of the device mesh: Replicate (every rank holds
 * all of it), Shard(d) (tensor dim d is split into equal contiguous chunks, rank i of the mesh
 * dim holding chunk i), Partial(op) (every rank holds a full-shaped term; the value is their
 * sum, average or max). A value has one placement per mesh dim. Short form: R, S(d),
 * P(sum), P(avg), P(max); long form: Replicate, Shard(d), Partial(sum|avg|max). */
#define HP_MESH_MAX_DIMS 4  /* e.g. (pp, dp, tp, cp) */
#define HP_MESH_NAME_MAX 16 /* identifier, 1..15 chars */

typedef enum { HP_PLACE_REPLICATE = 0, HP_PLACE_SHARD = 1, HP_PLACE_PARTIAL = 2 } hp_place_kind;
typedef struct hp_placement {
    hp_place_kind kind;
    int dim;             /* Shard: the tensor dim (>= 0) */
    hp_reduce_op reduce; /* Partial: HP_REDUCE_SUM | HP_REDUCE_AVG | HP_REDUCE_MAX */
} hp_placement;

#define HP_REPLICATE   ((hp_placement){HP_PLACE_REPLICATE, 0, HP_REDUCE_SUM})
#define HP_SHARD(d)    ((hp_placement){HP_PLACE_SHARD, (d), HP_REDUCE_SUM})
#define HP_PARTIAL(op) ((hp_placement){HP_PLACE_PARTIAL, 0, (op)})
bool hp_placement_eq(hp_placement a, hp_placement b);

/* Parses the long form ("Replicate", "Shard(1)", "Partial(sum)"; "Partial" alone is sum) or
 * the short form ("R", "S(1)", "P(avg)"); Shard dims in [0, HP_MAX_RANK). HP_PARSE naming
 * the text otherwise. */
hp_status hp_placement_parse(const char *s, hp_placement *p, hp_err *err);
/* Long form into buf; returns buf. */
char *hp_placement_str(const hp_placement *p, char *buf, size_t len);
/* Short form into buf; returns buf. */
char *hp_placement_short(const hp_placement *p, char *buf, size_t len);

/* ---- sharding rules (one per op, beside its shape and gradient rules) -----------------------
 * A rule says, for ONE mesh dimension of size n: if the inputs have these placements, running
 * the op on every rank's local pieces gives outputs with these placements. Rules of several
 * mesh dims combine independently (DTensor's per-dim strategies). All-Replicate in and out is
 * always valid and never listed. Shard(d) in a rule means an even split: the rule functions
 * only offer it where dim d of the (global) tensor divides by n, so compute never meets
 * padding. Attributes that spell a size (view shapes, num_weights) take their local value on
 * each rank: hp_localize_attrs. */
#define HP_SHARD_MAX_IN    8  /* rule inputs spelled out; variadic ops (cat): in[0] for all */
#define HP_SHARD_MAX_RULES 64 /* rules of one op on one mesh dim */

typedef struct hp_shard_rule {
    hp_placement in[HP_SHARD_MAX_IN];
    hp_placement out[HP_MAX_OUTS];
} hp_shard_rule;

/* What a rule function is asked about: a node with its global input and output types, and
 * one mesh dim (its name, for collectives: their own group is the one they act on). */
typedef struct hp_shard_query {
    const struct hp_node *node;
    const hp_type *in;  /* [node->n_in], global */
    const hp_type *out; /* [node->n_out], global */
    int64_t mesh_size;  /* ranks along the mesh dim, >= 2 */
    const char *mesh_dim;
} hp_shard_query;

/* Writes at most cap rules; returns how many there are (which may exceed cap: call again
 * with more room). */
typedef int (*hp_shard_fn)(const hp_shard_query *q, hp_shard_rule *rules, int cap);

/* A value's local piece: each mesh dim i (in mesh order) with Shard(d) splits the piece left
 * by the dims before it along d into sizes[i] chunks of ceil(len / sizes[i]) (the last ones
 * padded when it does not divide: only parameter storage may be padded; `even` refuses it).
 * HP_INVALID naming the dim when a Shard names a dim the tensor lacks, or a split is uneven
 * with `even`. */
hp_status hp_local_type(const hp_type *global, const hp_placement *pl, const int64_t *sizes,
                        int ndim, bool even, hp_type *local, hp_err *err);

/* The box of the global tensor the rank at mesh coordinates coord[ndim] holds under pl (the
 * splits of hp_local_type): global elements [off[d], off[d] + len[d]) on each dim d sit at
 * local [0, len[d]); the local piece's elements past len[d] are padding. len[d] may be 0 (a
 * rank past the end of an uneven split holds only padding). Arguments as hp_local_type's, and
 * coord[i] in [0, sizes[i]). */
hp_status hp_local_box(const hp_type *global, const hp_placement *pl, const int64_t *sizes,
                       const int64_t *coord, int ndim, int64_t *off, int64_t *len, hp_err *err);

/* The attributes a rank runs node n with, given its local output types: a copy of n's
 * attributes (strings borrowed) where those that spell the output's size take the local one
 * (the shape of view, reshape, expand, full, zeros, ones, slice_backward; num_weights of
 * embedding_dense_backward). attrs holds n->n_attrs entries. */
void hp_localize_attrs(const struct hp_node *n, const hp_type *local_out, hp_attr *attrs);

/* ---- the op table ---------------------------------------------------------------------------- */
typedef enum {
#define HP_OP(e, name, n_in, n_out, req, opt, shape_fn, grad_fn, shard_fn, flags) HP_OP_##e,
#include "graph/ops.def"
#undef HP_OP
    HP_OP_COUNT
} hp_op;

#define HP_A(k) (UINT64_C(1) << HP_ATTR_##k)

enum {
    HP_OPF_ELEMENTWISE = 1 << 0,    /* output shape = broadcast of inputs */
    HP_OPF_VIEW = 1 << 1,           /* output aliases input memory in a strided runtime */
    HP_OPF_COLLECTIVE = 1 << 2,     /* returns a pending value consumed by wait_tensor */
    HP_OPF_CREATION = 1 << 3,       /* no inputs; output from attributes */
    HP_OPF_BACKWARD = 1 << 4,       /* a gradient op (no gradient rule of its own) */
    HP_OPF_REPLICATE_ONLY = 1 << 5, /* no sharding rule: runs on Replicate inputs only */
};

#define HP_VARIADIC   (-1)
#define HP_MAX_INPUTS 1024 /* variadic ops (cat) */

typedef struct hp_node hp_node;
typedef struct hp_graph hp_graph;

/* A reference to output `out` of node `node`. node < 0 is "no value" (e.g. no gradient). */
typedef struct hp_value {
    int32_t node;
    int32_t out;
} hp_value;

#define HP_NO_VALUE ((hp_value){-1, 0})
static inline bool hp_value_ok(hp_value v) {
    return v.node >= 0;
}

struct hp_node {
    hp_op op;
    int n_in;
    int n_out;
    int n_attrs;
    hp_value *in;   /* [n_in], arena */
    hp_type *out;   /* [n_out], arena */
    hp_attr *attrs; /* [n_attrs], arena, sorted by key, no duplicates */
    /* NULL, or (with a graph mesh) output k's placement on mesh dim i at pl[k * ndim + i];
     * arena. Output types are then the rank's local pieces. */
    hp_placement *pl;
};

/* Shape rule: given the node (attrs; for placeholders also its declared output type in
 * n->out) and its input types, fill out[0..n_out). Validates input dtypes/shapes and
 * attribute ranges; the message names the offending dim or attribute (the caller prefixes
 * the node). */
typedef hp_status (*hp_shape_fn)(const hp_node *n, const hp_type *in, hp_type *out, hp_err *err);

/* What a gradient rule is told about the forward node it differentiates. */
typedef struct hp_grad_node {
    hp_node node;     /* a copy (g->nodes moves as nodes are added); its arrays are arena-stable */
    int32_t id;       /* the node's id: (hp_value){id, k} is its output k, for reuse */
    const bool *need; /* [node.n_in]: whether input i takes a gradient (skip the others) */
} hp_grad_node;

/* Gradient rule: given the forward node and gout[k], the gradient of each output
 * (hp_value_ok false where none flows), append nodes to g computing gin[i] for each input
 * that needs one (left as HP_NO_VALUE otherwise). Builder failures are sticky on g
 * (hp_graph_failed). Called by hp_autodiff only. */
typedef hp_status (*hp_grad_fn)(hp_graph *g, const hp_grad_node *fwd, const hp_value *gout,
                                hp_value *gin);

typedef struct hp_op_info {
    const char *name;
    int n_in; /* HP_VARIADIC for cat */
    int n_out;
    uint64_t required; /* attr key mask */
    uint64_t optional; /* attr key mask */
    hp_shape_fn shape;
    hp_grad_fn grad;   /* NULL: not differentiable */
    hp_shard_fn shard; /* NULL: no rules (HP_OPF_REPLICATE_ONLY, or a placeholder's given) */
    unsigned flags;
} hp_op_info;

const hp_op_info *hp_op_get(hp_op op);
/* By name; HP_NOT_FOUND naming it otherwise ("unknown op 'foo'"). */
hp_status hp_op_parse(const char *name, hp_op *op, hp_err *err);

/* ---- nodes and graphs ------------------------------------------------------------------------ */

/* The device mesh a compiled (SPMD) graph's placements refer to: names and sizes in mesh
 * order, rank = row-major coordinates (the last dim varies fastest). ndim 0: none. */
typedef struct hp_graph_mesh {
    int ndim;
    char name[HP_MESH_MAX_DIMS][HP_MESH_NAME_MAX];
    int64_t size[HP_MESH_MAX_DIMS];
} hp_graph_mesh;

struct hp_graph {
    hp_arena arena;
    /* What no other graph points at, so freed with the graph even when another graph adopts
     * its arena: the input lists of nodes appended with hp_graph_append_like (their chunks go
     * back to a compile's cache for the next graph). */
    hp_arena inputs;
    /* One copy per distinct array of types, attributes or placements its nodes point at
     * (graph/intern.c): node storage is never changed once appended, so equal arrays are
     * shared. */
    struct hp_intern *intern;
    hp_graph_mesh mesh;
    hp_node *nodes; /* [n_nodes], hp_malloc'd, may move on add */
    int n_nodes, cap_nodes;
    hp_value *outputs; /* [n_outputs], hp_malloc'd */
    int n_outputs, cap_outputs;
    /* Sticky builder error: the first failure of a builder call is kept here and every
     * later call is a no-op returning HP_NO_VALUE, so model code can check once at the end. */
    hp_err err;
    bool failed;
    /* Set by the graph's owner while rewrites of it (hp_graph_append_like) may share its
     * nodes' types and attributes instead of copying them; the owner then keeps its arena
     * alive for the rewrite's output (hp_graph_adopt_storage). hp_compile sets it on its
     * intermediate graphs only: a plain graph is never lent. */
    bool lends;
};

/* Upper bound on nodes in one graph (the 405B joint graph has ~20k). */
#define HP_MAX_NODES (1 << 22)

hp_graph *hp_graph_new(void); /* NULL on out of memory */
void hp_graph_free(hp_graph *g);
static inline bool hp_graph_failed(const hp_graph *g) {
    return g->failed;
}
/* The sticky error (status HP_OK when none). */
hp_status hp_graph_status(const hp_graph *g, hp_err *err);

/* Finds an attribute on a node (NULL if absent). */
const hp_attr *hp_node_attr(const hp_node *n, hp_attr_key k);
int64_t hp_node_int(const hp_node *n, hp_attr_key k, int64_t dflt);
double hp_node_float(const hp_node *n, hp_attr_key k, double dflt);

/* Type of a value (borrowed; NULL if the ref is out of range). */
const hp_type *hp_graph_type(const hp_graph *g, hp_value v);

/* Appends a node without inferring or checking anything beyond memory: the raw form used by
 * parsers and importers, which then run hp_graph_verify. Attributes are copied (strings into
 * the arena) and sorted. Returns the node id, or -1 with err set (HP_NOMEM, HP_LIMIT). */
int hp_graph_append(hp_graph *g, hp_op op, const hp_value *in, int n_in, const hp_type *out,
                    int n_out, const hp_attr *attrs, int n_attrs, hp_err *err);
/* Makes room for n_nodes nodes in all (a rewrite or copy that knows its size appends without
 * moving the node array); at most HP_MAX_NODES. HP_NOMEM. */
hp_status hp_graph_reserve(hp_graph *g, int n_nodes, hp_err *err);
hp_status hp_graph_set_outputs(hp_graph *g, const hp_value *outs, int n, hp_err *err);
/* Appends a copy of node n of graph src (op, output types, attributes; not its placements)
 * reading inputs in[n->n_in] of g. When src lends (src->lends), the copy points at n's type
 * and attribute arrays in src's arena instead of copying them: the caller must keep that
 * storage alive as long as g (hp_graph_adopt_storage). Returns the node id, or -1 with err
 * set as hp_graph_append. */
int hp_graph_append_like(hp_graph *g, const hp_graph *src, const hp_node *n, const hp_value *in,
                         hp_err *err);
/* Moves lender's arena (its nodes' types, attributes, strings, placements; not lender->inputs)
 * into g's, so that g's nodes may keep pointing there once lender is freed; lender must only
 * be freed after, never read. */
void hp_graph_adopt_storage(hp_graph *g, hp_graph *lender);
hp_status hp_graph_add_output(hp_graph *g, hp_value v, hp_err *err);

/* Sets the mesh the graph's placements refer to (names [A-Za-z0-9_]+ unique, sizes in [1,
 * HP_MAX_DIM]); only while no node carries placements. HP_INVALID naming the dim. */
hp_status hp_graph_set_mesh(hp_graph *g, const hp_graph_mesh *m, hp_err *err);
/* Sets node id's placements, pl[n_out * mesh.ndim] (copied; NULL clears). HP_INVALID when the
 * graph has no mesh or a placement is malformed (a Shard dim outside its output's rank). */
hp_status hp_node_set_placements(hp_graph *g, int id, const hp_placement *pl, hp_err *err);
/* The mesh.ndim placements of a value, or NULL when its node carries none. */
const hp_placement *hp_value_placements(const hp_graph *g, hp_value v);

/* Builder: appends a node whose output types come from the op's shape rule, after checking
 * arity, refs and attributes. Returns output 0 (use hp_out for others). On failure returns
 * HP_NO_VALUE and records the sticky error naming the op and the cause. */
hp_value hp_build(hp_graph *g, hp_op op, const hp_value *in, int n_in, const hp_attr *attrs,
                  int n_attrs);
static inline hp_value hp_out(hp_value v, int k) {
    return (hp_value){v.node, k};
}
/* Declares a placeholder. kind/fqn/init as in the seed convention; fqn may be NULL for data. */
hp_value hp_build_placeholder(hp_graph *g, hp_input_kind kind, const char *fqn, hp_type type,
                              const hp_init *init);

/* Verifier: topological order, dangling refs, arity, attribute presence and kinds, shape
 * rules (inferred types equal the stored ones), placeholders first ordered param, buffer,
 * data with unique FQNs, valid outputs. The message names the node: "node 41 (mm): inner
 * dims differ: [8,256] x [128,768]". */
hp_status hp_graph_verify(const hp_graph *g, hp_err *err);

/* Structural equality (ops, refs, attrs, types, outputs). */
bool hp_graph_eq(const hp_graph *a, const hp_graph *b);

/* A deep copy (NULL on out of memory). */
hp_graph *hp_graph_clone(const hp_graph *g);
/* The same, with room for `extra` more nodes (appended later without moving the array). */
hp_graph *hp_graph_clone_room(const hp_graph *g, int extra);

/* Placeholders: the count of each kind and lookup by FQN. */
typedef struct hp_graph_inputs {
    int n_params, n_buffers, n_data; /* placeholders are nodes [0, n_params+n_buffers+n_data) */
} hp_graph_inputs;
hp_graph_inputs hp_graph_count_inputs(const hp_graph *g);
int hp_graph_find_fqn(const hp_graph *g, const char *fqn); /* node id or -1 */
/* Sum of the element counts of all parameter placeholders. */
int64_t hp_graph_param_count(const hp_graph *g);

/* ---- autodiff ------------------------------------------------------------------------------
 * Turns a forward graph with a scalar floating loss into the joint graph: appends the
 * backward nodes and sets the outputs to (loss, d loss / d param for each parameter in
 * parameter order). A parameter the loss does not depend on gets a zeros gradient. An op on
 * the path from a parameter to the loss without a gradient rule is HP_UNSUPPORTED naming
 * the node. The placeholder order must already follow the convention (param, buffer, data). */
hp_status hp_autodiff(hp_graph *g, hp_value loss, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
