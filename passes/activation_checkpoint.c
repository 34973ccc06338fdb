/* passes/activation_checkpoint.c — the activation_checkpoint pass (plan.ac_mode, torchtitan's
 * activation checkpointing): the backward recomputes part of a repeated block's forward instead
 * of keeping it alive from the forward, trading FLOPs for activation memory.
 *
 * It runs on the global joint graph (after fuse_attention, before the placement passes), whose
 * forward region is the nodes up to the loss node (as fsdp.c and spmd.c read it):
 *
 *   Blocks. A parameter belongs to the repeated block its FQN names ("layers.3" of
 *   "layers.3.attention.wq.weight", hp__block_len); a parameter outside any block (embeddings,
 *   the final norm, the output projection) to none. A forward node belongs to the block of the
 *   last-used parameter it depends on: walking the forward in order, the parameters it reaches
 *   back to, the one first read latest wins. So block 3's nodes are those after its first
 *   parameter read and before the next block's, the residual add that ends it included, and the
 *   head after the last block belongs to none (its parameters are read later). Blocks are
 *   numbered in the order the forward first reads them; with plan.ac_every = N the N-th, 2N-th,
 *   ... are checkpointed (torchtitan's layer frequency), all of them with 1.
 *
 *   What is recomputed. In a checkpointed block, a node is recomputable unless it is a
 *   placeholder, a collective (or its wait), a graph output, read by a forward node outside the
 *   block (what leaves the block — the residual stream — is kept, and is what the recomputation
 *   starts from), or, in selective mode, a matrix product or an attention forward (kept: the
 *   expensive ops; the cheap ones between them are recomputed). The recomputable nodes the
 *   backward reads, and the recomputable nodes those read in turn, are copied once per block,
 *   in forward order, just before the first backward node that reads one of them; from there on
 *   the backward reads the copies, so the forward's values die at their last forward reader.
 *   A native_dropout copy keeps its node's attributes, whose fqn is the dropout's random stream
 *   (hp/rng.h): it draws the forward's mask again.
 *
 * The copies compute the forward's values from the forward's inputs with the same ops, so the
 * graph's outputs are bit for bit the same (tests/passes/test_activation_checkpoint.c); only
 * liveness changes, which the memory plan turns into a smaller activation arena. The report
 * counts the blocks checkpointed (ac_blocks), the nodes copied (ac_recomputed) and their FLOPs
 * (ac_recompute_flops, hp__node_flops). A graph without blocks or without a backward comes
 * back as a copy.
 */
#include "passes/passes_internal.h"
#include "passes/sched_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct ac_state {
    const hp_graph *g;
    int n, loss;
    int32_t *block;   /* [n]: a forward node's block, -1 none; a parameter's too */
    int32_t *first;   /* [n]: a parameter's first forward reader (n: never read there) */
    int32_t *latest;  /* [n]: a forward node's latest-read parameter ancestor, -1 none */
    uint8_t *recomp;  /* [n]: recomputable (see the top) */
    uint8_t *needed;  /* [n]: recomputable and read by the backward or by a needed node */
    int32_t *emitted; /* [blocks]: 1 once the block's copies are in the new graph */
    int32_t *off;     /* [blocks + 1]: block b's needed nodes are list[off[b] .. off[b+1]) */
    int32_t *list;    /* in forward order */
    int n_blocks;
} ac_state;

static bool is_param(const hp_node *nd) {
    return nd->op == HP_OP_PLACEHOLDER && hp_node_int(nd, HP_ATTR_KIND, -1) == HP_INPUT_PARAM;
}

typedef struct ac_param {
    const char *fqn;
    size_t len;    /* of its block's prefix */
    int32_t first; /* its first forward reader; then: its block's */
    int32_t id;
} ac_param;

static int by_prefix(const void *a, const void *b) {
    const ac_param *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->fqn, y->fqn, n);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static int by_first(const void *a, const void *b) {
    const ac_param *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* The blocks of the parameters (block[] of parameter nodes), numbered by their first forward
 * read: sorted by block prefix, each run (a block) takes its earliest read, the runs sorted by
 * that. O(P log P): a 4096-layer model has tens of thousands of parameters. */
static hp_status number_blocks(ac_state *s, hp_err *err) {
    const hp_graph *g = s->g;
    for (int i = 0; i < s->n; i++) s->first[i] = s->n;
    for (int i = 0; i <= s->loss; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t p = g->nodes[i].in[k].node;
            if (s->first[p] > i) s->first[p] = i;
        }
    int np = 0;
    for (int i = 0; i < s->n && g->nodes[i].op == HP_OP_PLACEHOLDER; i++) np++;
    ac_param *ps = hp_malloc((size_t)(np ? np : 1) * sizeof *ps);
    ac_param *runs = hp_malloc((size_t)(np ? np : 1) * sizeof *runs);
    if (!ps || !runs) {
        hp_free(ps);
        hp_free(runs);
        return hp_errf(err, HP_NOMEM, "out of memory numbering blocks");
    }
    int n_ps = 0;
    for (int i = 0; i < np; i++) {
        s->block[i] = -1;
        const hp_attr *f = hp_node_attr(&g->nodes[i], HP_ATTR_FQN);
        if (!is_param(&g->nodes[i]) || s->first[i] >= s->n || !f || f->kind != HP_ATTR_KIND_STR ||
            !f->s)
            continue;
        size_t len = hp__block_len(f->s);
        if (len) ps[n_ps++] = (ac_param){f->s, len, s->first[i], i};
    }
    qsort(ps, (size_t)n_ps, sizeof *ps, by_prefix);
    int n_runs = 0;
    for (int a = 0; a < n_ps;) { /* runs[r]: {its first param's FQN, len, earliest read, r} */
        int b = a;
        int32_t first = ps[a].first;
        while (b < n_ps && !by_prefix(&ps[a], &ps[b]))
            first = ps[b].first < first ? ps[b].first : first, b++;
        runs[n_runs] = (ac_param){ps[a].fqn, ps[a].len, first, n_runs};
        for (int k = a; k < b; k++) ps[k].first = n_runs; /* the run, until numbered */
        n_runs++;
        a = b;
    }
    qsort(runs, (size_t)n_runs, sizeof *runs, by_first);
    int32_t *number = hp_malloc((size_t)(n_runs ? n_runs : 1) * sizeof *number);
    if (!number) {
        hp_free(ps);
        hp_free(runs);
        return hp_errf(err, HP_NOMEM, "out of memory numbering blocks");
    }
    for (int r = 0; r < n_runs; r++) number[runs[r].id] = r;
    for (int k = 0; k < n_ps; k++) s->block[ps[k].id] = number[ps[k].first];
    s->n_blocks = n_runs;
    hp_free(number);
    hp_free(ps);
    hp_free(runs);
    return HP_OK;
}

/* Selective mode keeps these: the products and the attention, whose recomputation would cost
 * what the backward itself does. */
static bool kept_by_selective(hp_op op) {
    return op == HP_OP_MM || op == HP_OP_BMM || op == HP_OP_ADDMM || op == HP_OP_SDPA;
}

static bool never_recomputed(const hp_node *nd) {
    const hp_op_info *info = hp_op_get(nd->op);
    return nd->op == HP_OP_PLACEHOLDER || nd->op == HP_OP_WAIT_TENSOR || nd->n_out == 0 ||
           (info && (info->flags & HP_OPF_COLLECTIVE));
}

static void classify(ac_state *s, const hp__users *u, hp_ac_mode mode, int every) {
    const hp_graph *g = s->g;
    /* each forward node's block: the one of its latest-read parameter ancestor */
    for (int i = 0; i <= s->loss; i++) {
        const hp_node *nd = &g->nodes[i];
        if (nd->op == HP_OP_PLACEHOLDER) {
            s->latest[i] = is_param(nd) ? i : -1;
            continue;
        }
        int32_t best = -1;
        for (int k = 0; k < nd->n_in; k++) {
            int32_t c = s->latest[nd->in[k].node];
            if (c >= 0 && (best < 0 || s->first[c] > s->first[best])) best = c;
        }
        s->latest[i] = best;
        s->block[i] = best >= 0 ? s->block[best] : -1;
    }
    for (int i = 0; i <= s->loss; i++) {
        const hp_node *nd = &g->nodes[i];
        int b = s->block[i];
        if (b < 0 || (b + 1) % every != 0 || never_recomputed(nd) || u->is_output[i]) continue;
        if (mode == HP_AC_SELECTIVE && kept_by_selective(nd->op)) continue;
        bool leaves = false;
        for (int k = u->off[i]; k < u->off[i + 1] && !leaves; k++) {
            int r = u->user[k];
            leaves = r <= s->loss && s->block[r] != b;
        }
        s->recomp[i] = !leaves;
    }
    /* needed: read by the backward, or by a needed node (whose recomputable inputs are in its
     * own block: one read from another block would leave that block, so is kept) */
    for (int i = s->loss + 1; i < s->n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t v = g->nodes[i].in[k].node;
            if (v <= s->loss && s->recomp[v]) s->needed[v] = 1;
        }
    for (int i = s->loss; i >= 0; i--) {
        if (!s->needed[i]) continue;
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t v = g->nodes[i].in[k].node;
            if (s->recomp[v]) s->needed[v] = 1;
        }
    }
}

/* Copies block b's needed nodes (in forward order) into the new graph; the copies take over
 * the old values' mapping, so the backward copied after them reads them. */
static hp_status emit_block(ac_state *s, hp__rewrite *rw, int b, hp_pass_report *r, hp_err *err) {
    s->emitted[b] = 1;
    for (int k = s->off[b]; k < s->off[b + 1]; k++) {
        int i = s->list[k];
        if (hp__rewrite_copy(rw, i, err) < 0) return err ? err->status : HP_INTERNAL;
        if (r) {
            r->ac_recomputed++;
            r->ac_recompute_flops += hp__node_flops(s->g, i);
        }
    }
    return HP_OK;
}

static hp_status rebuild(ac_state *s, hp_pass_report *r, hp_graph **out, hp_err *err) {
    const hp_graph *g = s->g;
    hp__rewrite rw;
    HP_TRY(hp__rewrite_start(&rw, g, err));
    hp_status st = hp__copy_mesh(rw.out, g, err);
    for (int i = 0; i < s->n && st == HP_OK; i++) {
        const hp_node *nd = &g->nodes[i];
        for (int k = 0; i > s->loss && k < nd->n_in && st == HP_OK; k++) {
            int32_t v = nd->in[k].node;
            if (s->needed[v] && !s->emitted[s->block[v]])
                st = emit_block(s, &rw, s->block[v], r, err);
        }
        if (st == HP_OK && hp__rewrite_copy(&rw, i, err) < 0) st = err ? err->status : HP_INTERNAL;
    }
    if (st != HP_OK) {
        hp__rewrite_abort(&rw);
        return st;
    }
    return hp__rewrite_finish(&rw, out, err);
}

/* The pass; *n_blocks gets the graph's repeated blocks. */
static hp_status checkpoint(const hp_graph *in, hp_ac_mode mode, int every, hp_pass_report *r,
                            int *n_blocks, hp_graph **out, hp_err *err) {
    *out = NULL;
    *n_blocks = 0;
    if (!hp_ac_mode_name(mode) || mode == HP_AC_AUTO || every < 1)
        return hp_errf(err, HP_INVALID,
                       "activation_checkpoint: mode %d every %d (auto is resolved by hp_compile)",
                       (int)mode, every);
    int n = in->n_nodes;
    if (mode == HP_AC_NONE || in->n_outputs < 2 || n == 0) return hp__dce(in, out, NULL, err);
    ac_state s = {.g = in, .n = n, .loss = in->outputs[0].node};
    s.block = hp_calloc((size_t)n, sizeof *s.block);
    s.first = hp_calloc((size_t)n, sizeof *s.first);
    s.latest = hp_calloc((size_t)n, sizeof *s.latest);
    s.recomp = hp_calloc((size_t)n, 1);
    s.needed = hp_calloc((size_t)n, 1);
    hp__users u = {0};
    hp_status st = s.block && s.first && s.latest && s.recomp && s.needed
                       ? hp__users_init(&u, in, err)
                       : hp_errf(err, HP_NOMEM, "out of memory in activation_checkpoint");
    if (st == HP_OK) st = number_blocks(&s, err);
    if (st == HP_OK) {
        s.emitted = hp_calloc((size_t)s.n_blocks + 1, sizeof *s.emitted);
        s.off = hp_calloc((size_t)s.n_blocks + 1, sizeof *s.off);
        s.list = hp_calloc((size_t)n, sizeof *s.list);
        if (!s.emitted || !s.off || !s.list)
            st = hp_errf(err, HP_NOMEM, "out of memory in activation_checkpoint");
    }
    if (st == HP_OK) {
        classify(&s, &u, mode, every);
        for (int i = 0; i <= s.loss; i++) s.off[s.block[i] + 1] += s.needed[i];
        for (int b = 0; b < s.n_blocks; b++) s.off[b + 1] += s.off[b];
        int32_t *fill = s.emitted; /* borrowed as each block's fill count, then cleared */
        for (int i = 0; i <= s.loss; i++)
            if (s.needed[i]) s.list[s.off[s.block[i]] + fill[s.block[i]]++] = i;
        memset(s.emitted, 0, ((size_t)s.n_blocks + 1) * sizeof *s.emitted);
        st = rebuild(&s, r, out, err);
        for (int b = 0; r && st == HP_OK && b < s.n_blocks; b++) r->ac_blocks += s.emitted[b];
        *n_blocks = s.n_blocks;
    }
    hp__users_fini(&u);
    hp_free(s.block);
    hp_free(s.first);
    hp_free(s.latest);
    hp_free(s.recomp);
    hp_free(s.needed);
    hp_free(s.emitted);
    hp_free(s.off);
    hp_free(s.list);
    return st;
}

hp_status hp_activation_checkpoint(const hp_graph *in, hp_ac_mode mode, int every,
                                   hp_pass_report *r, hp_graph **out, hp_err *err) {
    int n_blocks;
    return checkpoint(in, mode, every, r, &n_blocks, out, err);
}

/* As a pipeline pass it says when the plan's mode recomputes nothing. */
hp_status hp_pass_activation_checkpoint(const hp_graph *in, hp_pass_ctx *ctx, hp_graph **out,
                                        hp_err *err) {
    const hp_plan *p = &ctx->job->plan;
    hp_pass_report own = {0}, *r = ctx->report ? ctx->report : &own;
    int n_blocks;
    HP_TRY(checkpoint(in, p->ac_mode, p->ac_every, r, &n_blocks, out, err));
    if (n_blocks == 0)
        hp_pass_warn(ctx,
                     "activation_checkpoint: the graph has no repeated blocks (parameters named "
                     "<name>.<index>.*, as layers.0.attention.wq.weight): nothing is recomputed");
    else if (r->ac_blocks == 0)
        hp_pass_warn(ctx,
                     "activation_checkpoint: every %d-th of %d blocks selects none: nothing is "
                     "recomputed",
                     p->ac_every, n_blocks);
    return HP_OK;
}
