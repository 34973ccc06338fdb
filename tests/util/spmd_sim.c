/* tests/util/spmd_sim.c — simulated ranks for SPMD graphs (spmd_sim.h). */
#include "tests/util/spmd_sim.h"

#include "hp/eval.h"
#include "hp/param_init.h"
#include "hp/passes.h"
#include "tests/util/eval_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS HP_TH_SPMD_MAX_RANKS
#define VOCAB     HP_TH_SPMD_VOCAB

/* ---- simulated ranks ------------------------------------------------------------------------
 * One thread per rank of the mesh (row-major coordinates, the last dim fastest). A collective
 * on mesh dim i runs among the ranks that share every other coordinate: each posts its input
 * in its slot of that group, waits on the group's barrier, computes, waits again. */

typedef struct group {
    pthread_barrier_t bar;
    const hp_tensor *slot[MAX_RANKS];
} group;

typedef struct sim {
    hp_graph_mesh mesh;
    int world;
    int64_t stride[HP_MESH_MAX_DIMS];
    group g[HP_MESH_MAX_DIMS][MAX_RANKS]; /* [dim][the rank with that dim's coordinate 0] */
} sim;

typedef struct rank_ctx {
    sim *s;
    int rank;
    const hp_graph *g;
    hp_tensor *ins;
    hp_tensor *outs;
    hp_status st;
    hp_err err;
} rank_ctx;

static int coord(const sim *s, int rank, int i) {
    return (int)((rank / s->stride[i]) % s->mesh.size[i]);
}

static void sim_init(sim *s, const hp_graph_mesh *m) {
    memset(s, 0, sizeof *s);
    s->mesh = *m;
    s->world = 1;
    for (int i = m->ndim - 1; i >= 0; i--) {
        s->stride[i] = s->world;
        s->world *= (int)m->size[i];
    }
    cr_assert(s->world <= MAX_RANKS);
    for (int i = 0; i < m->ndim; i++)
        for (int r = 0; r < s->world; r++)
            if (coord(s, r, i) == 0)
                pthread_barrier_init(&s->g[i][r].bar, NULL, (unsigned)m->size[i]);
}

static void sim_fini(sim *s) {
    for (int i = 0; i < s->mesh.ndim; i++)
        for (int r = 0; r < s->world; r++)
            if (coord(s, r, i) == 0) pthread_barrier_destroy(&s->g[i][r].bar);
}

/* piece <-> chunk r of full along dim d (copy in either direction); a chunk past full's end
 * (padded storage) reads as zeros and writes nowhere. */
static void chunk_of(const hp_tensor *full, int d, int r, hp_tensor *piece, bool to_piece) {
    int64_t fst[HP_MAX_RANK], pst[HP_MAX_RANK];
    const hp_type *ft = &full->type, *pt = &piece->type;
    for (int k = ft->rank - 1, a = 1, b = 1; k >= 0; k--) {
        fst[k] = a, pst[k] = b;
        a *= (int)ft->shape[k], b *= (int)pt->shape[k];
    }
    int64_t numel = hp_type_numel(pt);
    for (int64_t e = 0; e < numel; e++) {
        int64_t rem = e, at = 0;
        bool pad = false;
        for (int k = 0; k < pt->rank; k++) {
            int64_t i = rem / pst[k];
            rem %= pst[k];
            if (k == d) i += r * pt->shape[d];
            pad |= i >= ft->shape[k];
            at += i * fst[k];
        }
        if (to_piece)
            piece->data[e] = pad ? 0 : full->data[at];
        else if (!pad)
            full->data[at] = piece->data[e];
    }
}

/* A rank's piece of full under placements pl (Shard or Replicate), mesh dims in order, each
 * split ceil-sized (an uneven one padded with zeros, as storage is). */
static hp_tensor piece_of(const sim *s, const hp_tensor *full, const hp_placement *pl, int rank) {
    hp_err err = {0};
    hp_tensor cur;
    cr_assert_eq(hp_tensor_alloc(&cur, full->type, &err), HP_OK);
    memcpy(cur.data, full->data, sizeof(double) * (size_t)hp_type_numel(&full->type));
    for (int i = 0; i < s->mesh.ndim; i++) {
        if (pl[i].kind != HP_PLACE_SHARD) continue;
        hp_type t = cur.type;
        t.shape[pl[i].dim] = (t.shape[pl[i].dim] + s->mesh.size[i] - 1) / s->mesh.size[i];
        hp_tensor next;
        cr_assert_eq(hp_tensor_alloc(&next, t, &err), HP_OK);
        chunk_of(&cur, pl[i].dim, coord(s, rank, i), &next, true);
        hp_tensor_free(&cur);
        cur = next;
    }
    return cur;
}

static int group_dim(const sim *s, const hp_node *n) {
    const hp_attr *g = hp_node_attr(n, HP_ATTR_GROUP);
    for (int i = 0; g && g->s && i < s->mesh.ndim; i++)
        if (!strcmp(g->s, s->mesh.name[i])) return i;
    cr_assert_fail("collective on no mesh dim");
    return 0;
}

static hp_status sim_collective(void *ctx, const hp_node *n, const hp_tensor *in, hp_tensor *out,
                                hp_err *err) {
    (void)err;
    rank_ctx *rc = ctx;
    sim *s = rc->s;
    int i = group_dim(s, n), me = coord(s, rc->rank, i), size = (int)s->mesh.size[i];
    if (n->op == HP_OP_LOCAL_CHUNK) { /* the rank's own chunk: nothing exchanged */
        chunk_of(in, (int)hp_node_int(n, HP_ATTR_DIM, 0), me, out, true);
        return HP_OK;
    }
    group *g = &s->g[i][rc->rank - me * s->stride[i]];
    g->slot[me] = in;
    pthread_barrier_wait(&g->bar);
    int64_t numel = hp_type_numel(&in->type);
    hp_reduce_op op = (hp_reduce_op)hp_node_int(n, HP_ATTR_REDUCE_OP, HP_REDUCE_SUM);
    if (n->op == HP_OP_ALL_TO_ALL) { /* n equal flat parts: out part k is rank k's part me */
        int64_t part = numel / size;
        for (int k = 0; k < size; k++)
            memcpy(out->data + k * part, g->slot[k]->data + me * part,
                   sizeof(double) * (size_t)part);
    } else if (n->op == HP_OP_ALL_GATHER) {
        for (int r = 0; r < size; r++) {
            hp_tensor piece = *g->slot[r];
            chunk_of(out, 0, r, &piece, false);
        }
    } else {
        double *acc = calloc((size_t)numel, sizeof *acc);
        for (int64_t e = 0; e < numel; e++) {
            double v = g->slot[0]->data[e];
            for (int r = 1; r < size; r++) {
                double w = g->slot[r]->data[e];
                v = op == HP_REDUCE_MAX ? fmax(v, w) : v + w;
            }
            acc[e] = op == HP_REDUCE_AVG ? v / size : v;
        }
        hp_tensor full = {.type = in->type, .data = acc};
        if (n->op == HP_OP_ALL_REDUCE)
            memcpy(out->data, acc, sizeof(double) * (size_t)numel);
        else /* reduce_scatter */
            chunk_of(&full, 0, me, out, true);
        free(acc);
    }
    pthread_barrier_wait(&g->bar);
    return HP_OK;
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;
    hp_eval_opts o = {.precision = HP_EVAL_F64, .collective = sim_collective, .collective_ctx = rc};
    hp_graph_inputs gi = hp_graph_count_inputs(rc->g);
    rc->st =
        hp_eval(rc->g, rc->ins, gi.n_params + gi.n_buffers + gi.n_data, &o, rc->outs, &rc->err);
    return NULL;
}

/* ---- the check ------------------------------------------------------------------------------ */

/* A buffer with an init spec holds its init values, as the runtime fills it (loss parallel's
 * vocab_index: arange); everything else stays random. */
static void fill_buffer(const hp_node *n, hp_tensor *t) {
    const hp_attr *init = hp_node_attr(n, HP_ATTR_INIT);
    if (hp_node_int(n, HP_ATTR_KIND, HP_INPUT_PARAM) != HP_INPUT_BUFFER || !init ||
        init->init.kind == HP_INIT_NONE)
        return;
    int64_t numel = hp_type_numel(&t->type);
    float *f = malloc(sizeof *f * (size_t)(numel ? numel : 1));
    hp_err err = {0};
    cr_assert_eq(
        hp_param_init_fill(&init->init, 1, hp_node_attr(n, HP_ATTR_FQN)->s, 0, numel, f, &err),
        HP_OK, "%s", err.msg);
    for (int64_t e = 0; e < numel; e++) t->data[e] = f[e];
    free(f);
}

int hp_th_spmd_count_all_reduces(const hp_graph *g, int64_t numel, const char *group) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const hp_attr *a = hp_node_attr(&g->nodes[i], HP_ATTR_GROUP);
        if (g->nodes[i].op == HP_OP_ALL_REDUCE && hp_type_numel(&g->nodes[i].out[0]) == numel &&
            a && !strcmp(a->s, group))
            k++;
    }
    return k;
}

/* Places g on mesh with placeholder placements pl, runs it on every simulated rank, and checks
 * each rank's loss and gradient pieces against the 1-rank graph. Returns the placed graph. */
hp_graph *hp_th_spmd_check(const hp_graph *g, const hp_graph_mesh *mesh, const hp_placement *pl) {
    return hp_th_spmd_check_opts(g, mesh, pl, NULL);
}

/* pl are the storage placements: inputs are cut and gradients compared by them. */
hp_graph *hp_th_spmd_check_opts(const hp_graph *g, const hp_graph_mesh *mesh,
                                const hp_placement *pl, const hp_spmd_opts *opts) {
    return hp_th_spmd_check_post(g, mesh, pl, opts, NULL, NULL);
}

/* The same, running post on the placed graph (which must verify after it) before evaluating. */
hp_graph *hp_th_spmd_check_post(const hp_graph *g, const hp_graph_mesh *mesh,
                                const hp_placement *pl, const hp_spmd_opts *opts,
                                hp_th_spmd_post post, void *post_ctx) {
    int nd = mesh->ndim;
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_graph *spmd = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd_ex(g, mesh, pl, NULL, opts, &spmd, &err), HP_OK, "%s", err.msg);
    if (post) {
        hp_graph *next = post(spmd, post_ctx);
        cr_assert_not_null(next, "the post-pass failed");
        cr_assert_eq(hp_graph_verify(next, &err), HP_OK, "after the post-pass: %s", err.msg);
        hp_graph_free(spmd);
        spmd = next;
    }

    hp_tensor *full = calloc((size_t)n_ph, sizeof *full);
    for (int i = 0; i < n_ph; i++) {
        const hp_type *t = &g->nodes[i].out[0];
        cr_assert_eq(hp_tensor_alloc(&full[i], *t, &err), HP_OK);
        bool idx = !hp_dtype_is_float(t->dtype);
        hp_th_rand(full[i].data, hp_type_numel(t), 100 + (uint64_t)i, idx ? 0 : -0.5,
                   idx ? VOCAB : 0.5);
        for (int64_t e = 0; idx && e < hp_type_numel(t); e++)
            full[i].data[e] = floor(full[i].data[e]);
        for (int64_t e = 0; t->rank == 1 && !idx && e < hp_type_numel(t); e++)
            full[i].data[e] += 1; /* norm weights near 1 */
        fill_buffer(&g->nodes[i], &full[i]);
    }
    hp_tensor *want = calloc((size_t)g->n_outputs, sizeof *want);
    hp_eval_opts o = {.precision = HP_EVAL_F64};
    cr_assert_eq(hp_eval(g, full, n_ph, &o, want, &err), HP_OK, "%s", err.msg);

    static sim s;
    sim_init(&s, mesh);
    rank_ctx rc[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < s.world; r++) {
        rc[r] = (rank_ctx){.s = &s, .rank = r, .g = spmd};
        rc[r].ins = calloc((size_t)n_ph, sizeof(hp_tensor));
        rc[r].outs = calloc((size_t)spmd->n_outputs, sizeof(hp_tensor));
        for (int i = 0; i < n_ph; i++) rc[r].ins[i] = piece_of(&s, &full[i], pl + i * nd, r);
        pthread_create(&th[r], NULL, rank_main, &rc[r]);
    }
    for (int r = 0; r < s.world; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < s.world; r++)
        cr_assert_eq(rc[r].st, HP_OK, "rank %d: %s", r, rc[r].err.msg);

    /* every rank's loss, and every rank's piece of every gradient */
    hp_placement repl[HP_MESH_MAX_DIMS] = {0};
    for (int r = 0; r < s.world; r++) {
        hp_tensor w0 = piece_of(&s, &want[0], repl, r);
        cr_expect(fabs(rc[r].outs[0].data[0] - w0.data[0]) < 1e-10,
                  "rank %d loss %.15g, want %.15g", r, rc[r].outs[0].data[0], w0.data[0]);
        hp_tensor_free(&w0);
        for (int k = 1; k < g->n_outputs; k++) {
            hp_tensor wk = piece_of(&s, &want[k], pl + (k - 1) * nd, r);
            char what[128];
            snprintf(what, sizeof what, "rank %d: %s", r,
                     hp_node_attr(&g->nodes[k - 1], HP_ATTR_FQN)->s);
            cr_assert(hp_type_eq(&wk.type, &rc[r].outs[k].type), "%s: shape", what);
            hp_th_expect_close(rc[r].outs[k].data, wk.data, hp_type_numel(&wk.type), 1e-10, what);
            hp_tensor_free(&wk);
        }
    }
    for (int r = 0; r < s.world; r++) {
        for (int i = 0; i < n_ph; i++) hp_tensor_free(&rc[r].ins[i]);
        for (int k = 0; k < spmd->n_outputs; k++) hp_tensor_free(&rc[r].outs[k]);
        free(rc[r].ins);
        free(rc[r].outs);
    }
    for (int i = 0; i < n_ph; i++) hp_tensor_free(&full[i]);
    for (int k = 0; k < g->n_outputs; k++) hp_tensor_free(&want[k]);
    sim_fini(&s);
    free(full);
    free(want);
    return spmd;
}
