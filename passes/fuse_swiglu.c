/* passes/fuse_swiglu.c — the fuse_swiglu pass: the Llama MLP's gate, mul(silu(A), B), and its
 * backward become swiglu and swiglu_backward (graph/ops.def), so silu(A) is never stored and
 * the five elementwise kernels of the pair (silu, mul; two muls and silu_backward) are two.
 * On the ~1B Llama each of those tensors is [4096, 8192] bf16, 64 MiB, per layer.
 *
 * It runs after fuse_cross_entropy, on graphs without placements, and matches, with A, B, G
 * of one type (no broadcasting):
 *
 *   forward   S = silu(A),  Y = mul(S, B)          (either operand order)
 *   backward  dS = mul(B, G),  dB = mul(S, G),  dA = silu_backward(dS, A)      optional
 *
 * where S is read by those muls alone, dS by dA alone, and neither is a graph output; and
 * replaces Y by swiglu(A, B) and (dA, dB) by swiglu_backward(G, A, B). The fused kernels
 * compute in f32 and round each output once, where the unfused ops rounded silu(A) and dS to
 * the storage dtype on the way (in f32 the values agree to rounding). Anything else is left as
 * it is. The report's fused_swiglu counts the gates fused.
 */
#include "passes/passes_internal.h"
#include "passes/sched_util.h"

#include <string.h>

typedef struct sw_match {
    int silu, fwd_mul;      /* S, Y */
    int ds_mul, db_mul, da; /* the backward; -1 without one */
    hp_value a, b, g;
} sw_match;

static bool same(hp_value a, hp_value b) {
    return a.node == b.node && a.out == b.out;
}

/* Node m is mul(x, y) in either order? Its other operand (the one not x) in *other. */
static bool mul_of(const hp_graph *g, int m, hp_value x, hp_value *other) {
    const hp_node *n = &g->nodes[m];
    if (n->op != HP_OP_MUL || n->n_in != 2) return false;
    if (same(n->in[0], x))
        *other = n->in[1];
    else if (same(n->in[1], x))
        *other = n->in[0];
    else
        return false;
    return true;
}

/* The one user of node id, or -1 (none, several, or a graph output). */
static int only_user(const hp__users *u, int id) {
    if (u->is_output[id] || u->off[id + 1] - u->off[id] != 1) return -1;
    return u->user[u->off[id]];
}

static bool match(const hp_graph *g, const hp__users *u, int s, sw_match *m) {
    const hp_node *sn = &g->nodes[s];
    if (sn->op != HP_OP_SILU || u->is_output[s]) return false;
    const hp_type *t = &sn->out[0];
    *m = (sw_match){.silu = s, .fwd_mul = -1, .ds_mul = -1, .db_mul = -1, .da = -1, .a = sn->in[0]};
    hp_value S = {s, 0};
    /* S's readers: the forward mul (whose other operand is B), at most one more mul (dB) */
    hp_value other[2];
    int muls[2], n_muls = 0;
    for (int k = u->off[s]; k < u->off[s + 1]; k++) {
        int id = u->user[k];
        if (n_muls == 2 || !mul_of(g, id, S, &other[n_muls])) return false;
        if (!hp_type_eq(hp_graph_type(g, other[n_muls]), t) || !hp_type_eq(&g->nodes[id].out[0], t))
            return false;
        muls[n_muls++] = id;
    }
    if (n_muls == 0 || (n_muls == 2 && muls[0] == muls[1])) return false;
    /* the forward mul is the earlier: the backward one reads G, which comes after it (the
     * products are symmetric, so which is which matters only for where the fused ops go) */
    int f = n_muls == 2 && muls[1] < muls[0] ? 1 : 0;
    m->fwd_mul = muls[f];
    m->b = other[f];
    if (n_muls == 1) return true;
    int bw = muls[1 - f];
    m->db_mul = bw;
    m->g = other[1 - f];
    /* dS: a mul of B and G, whose one reader is silu_backward(dS, A) */
    for (int k = u->off[m->g.node]; k < u->off[m->g.node + 1]; k++) {
        int id = u->user[k];
        hp_value o;
        if (id == bw || !mul_of(g, id, m->g, &o) || !same(o, m->b)) continue;
        int da = only_user(u, id);
        if (da < 0) continue;
        const hp_node *dn = &g->nodes[da];
        if (dn->op != HP_OP_SILU_BACKWARD || !same(dn->in[0], (hp_value){id, 0}) ||
            !same(dn->in[1], m->a) || !hp_type_eq(&dn->out[0], t))
            continue;
        m->ds_mul = id;
        m->da = da;
        return true;
    }
    return false;
}

/* Builds match role - 1's fused op at node i: swiglu at the forward mul, swiglu_backward at
 * the first of dA and dB (G, A and B come before both), standing for both. */
static hp_status emit(hp__rewrite *rw, int i, int role, void *ctx, hp_err *err) {
    const sw_match *a = &((const sw_match *)ctx)[role - 1];
    hp_value A = hp__rewrite_get(rw, a->a), B = hp__rewrite_get(rw, a->b);
    if (i == a->fwd_mul) {
        hp_value y = hp__rewrite_build(rw, HP_OP_SWIGLU, (hp_value[]){A, B}, 2, NULL, 0, err);
        if (!hp_value_ok(y)) return err ? err->status : HP_INTERNAL;
        hp__rewrite_set(rw, (hp_value){i, 0}, y);
        return HP_OK;
    }
    hp_value G = hp__rewrite_get(rw, a->g);
    hp_value d =
        hp__rewrite_build(rw, HP_OP_SWIGLU_BACKWARD, (hp_value[]){G, A, B}, 3, NULL, 0, err);
    if (!hp_value_ok(d)) return err ? err->status : HP_INTERNAL;
    hp__rewrite_set(rw, (hp_value){a->da, 0}, d);
    hp__rewrite_set(rw, (hp_value){a->db_mul, 0}, hp_out(d, 1));
    return HP_OK;
}

hp_status hp_pass_fuse_swiglu(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out, hp_err *err) {
    *out = NULL;
    int n = in->n_nodes, heads = 0;
    if (in->mesh.ndim > 0) return hp__dce(in, out, NULL, err); /* placed: left as it is */
    for (int i = 0; i < n; i++) heads += in->nodes[i].op == HP_OP_SILU;
    hp__users u = {0};
    HP_TRY(hp__users_init(&u, in, err));
    /* role[i]: 1 + the match whose forward mul node i is, or whose backward it is (the first
     * of dA and dB, where swiglu_backward goes), -1 the second (mapped there), 0 none */
    int32_t *role = hp_calloc((size_t)(n ? n : 1), sizeof *role);
    sw_match *m = hp_calloc((size_t)(heads ? heads : 1), sizeof *m);
    int n_m = 0;
    hp_status st = role && m ? HP_OK : hp_errf(err, HP_NOMEM, "out of memory in fuse_swiglu");
    for (int i = 0; i < n && st == HP_OK; i++) {
        sw_match *a = &m[n_m];
        if (in->nodes[i].op != HP_OP_SILU || !match(in, &u, i, a)) continue;
        if (role[a->fwd_mul] || (a->da >= 0 && (role[a->da] || role[a->db_mul]))) continue;
        role[a->fwd_mul] = ++n_m;
        if (a->da >= 0) {
            int first = a->da < a->db_mul ? a->da : a->db_mul;
            role[first] = n_m;
            role[first == a->da ? a->db_mul : a->da] = -1;
        }
    }
    hp__users_fini(&u);
    if (st == HP_OK) st = hp__rewrite_fused(in, role, emit, m, out, err);
    if (st == HP_OK && ctx && ctx->report) ctx->report->fused_swiglu = n_m;
    hp_free(role);
    hp_free(m);
    return st;
}
