/* Lowering and the memory plan: a Llama-3 joint graph becomes a verified program whose
 * activation arena is well below the sum of its activations, with no two simultaneously live
 * buffers overlapping; the program survives its wire form; hostile programs are refused. */
#define _GNU_SOURCE /* memmem */
#include "hp/models.h"
#include "hp/passes.h"
#include "hp/program.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static hp_graph *tiny_llama(void) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.dim = 64, spec.n_layers = 2, spec.n_heads = 4, spec.n_kv_heads = 2;
    spec.ffn_hidden = 96, spec.vocab = 128, spec.batch = 2, spec.seq = 16;
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    return g;
}

/* Live ranges recomputed independently of memplan.c: [producer, last reader]. */
static void check_no_live_overlap(const hp_program *p) {
    int32_t nb = p->n_buffers;
    int32_t *def = malloc(sizeof(int32_t) * (size_t)nb),
            *last = malloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) def[b] = last[b] = -2;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        const hp_instr *ins = &p->instrs[i];
        for (int k = 0; k < ins->n_out; k++) {
            int32_t r = hp_program_root(p, ins->out[k]);
            if (def[r] == -2) def[r] = i;
            if (last[r] < i) last[r] = i;
        }
        for (int k = 0; k < ins->n_in; k++) {
            int32_t r = hp_program_root(p, ins->in[k]);
            if (last[r] < i) last[r] = i;
        }
    }
    for (int i = 0; i < p->n_data; i++) def[p->data[i].buffer] = -1;
    last[hp_program_root(p, p->loss)] = p->n_instrs;
    for (int32_t a = 0; a < nb; a++) {
        const hp_buffer *x = &p->buffers[a];
        if (x->alias_of >= 0 || x->mem != HP_MEM_ACT || def[a] == -2) continue;
        for (int32_t b = a + 1; b < nb; b++) {
            const hp_buffer *y = &p->buffers[b];
            if (y->alias_of >= 0 || y->mem != HP_MEM_ACT || def[b] == -2) continue;
            int32_t la = last[a] < def[a] ? def[a] : last[a],
                    lb = last[b] < def[b] ? def[b] : last[b];
            bool live = def[a] <= lb && def[b] <= la;
            bool mem = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
            cr_assert(!(live && mem && x->bytes && y->bytes),
                      "buffers %d and %d are live together and overlap", a, b);
        }
    }
    free(def);
    free(last);
}

Test(lower, llama_joint_graph) {
    hp_graph *g = tiny_llama();
    hp_program *p = NULL;
    hp_err e;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    cr_assert_eq(hp_program_verify(p, &e), HP_OK, "%s", e.msg);
    cr_expect_eq(p->n_params, 2 * 9 + 3);
    cr_expect_eq(p->n_data, 2);
    /* every t() feeding a matmul folds; views alias */
    cr_expect_gt(p->stats.n_folded_transposes, 0);
    cr_expect_gt(p->stats.n_aliases, 0);
    /* a t() stays only where it is a graph output (a weight gradient laid out [out, in]) */
    for (int32_t i = 0; i < p->n_instrs; i++) {
        if (p->graph->nodes[p->instrs[i].node].op != HP_OP_T) continue;
        bool is_output = false;
        for (int k = 1; k < p->graph->n_outputs; k++)
            is_output |= p->graph->outputs[k].node == p->instrs[i].node;
        cr_expect(is_output, "instruction %d: a t() was not folded", i);
    }
    /* liveness-based reuse: well below the sum of all activations */
    cr_expect_lt(p->stats.act_arena_bytes * 2, p->stats.act_values_bytes,
                 "arena %lld vs values %lld", (long long)p->stats.act_arena_bytes,
                 (long long)p->stats.act_values_bytes);
    check_no_live_overlap(p);
    for (int i = 0; i < p->n_params; i++) {
        cr_expect_eq(p->buffers[p->params[i].buffer].mem, HP_MEM_PARAM);
        cr_expect_eq(p->buffers[p->params[i].grad].mem, HP_MEM_GRAD);
    }
    char *text = NULL;
    cr_assert_eq(hp_program_print(p, &text, &e), HP_OK);
    cr_expect(strstr(text, "[trans b]"));
    hp_free(text);

    /* wire form round trip */
    uint8_t *data = NULL;
    size_t len = 0;
    cr_assert_eq(hp_program_pack(p, &data, &len, &e), HP_OK, "%s", e.msg);
    hp_program *q = NULL;
    cr_assert_eq(hp_program_unpack(data, len, &q, &e), HP_OK, "%s", e.msg);
    cr_expect(hp_graph_eq(p->graph, q->graph));
    cr_expect_eq(q->n_instrs, p->n_instrs);
    cr_expect_eq(q->n_buffers, p->n_buffers);
    for (int32_t b = 0; b < p->n_buffers; b++) {
        const hp_buffer *x = &p->buffers[b], *y = &q->buffers[b];
        cr_expect(x->mem == y->mem && x->offset == y->offset && x->bytes == y->bytes &&
                      x->alias_of == y->alias_of && hp_type_eq(x->type, y->type) &&
                      x->value_node == y->value_node && x->value_out == y->value_out,
                  "buffer %d differs", b);
    }
    for (int32_t i = 0; i < p->n_instrs; i++) {
        cr_expect_eq(q->instrs[i].node, p->instrs[i].node);
        cr_expect_eq(q->instrs[i].flags, p->instrs[i].flags);
        cr_expect_eq(q->instrs[i].n_in, p->instrs[i].n_in);
        for (int k = 0; k < p->instrs[i].n_in; k++)
            cr_expect_eq(q->instrs[i].in[k], p->instrs[i].in[k]);
    }
    cr_expect(memcmp(q->arena_bytes, p->arena_bytes, sizeof p->arena_bytes) == 0);
    hp_program_free(q);

    /* hostile: every truncation, and random byte flips, are refused or verified, never crash */
    for (size_t n = 0; n < len; n += 1 + len / 300) {
        q = NULL;
        hp_status st = hp_program_unpack(data, n, &q, &e);
        if (st == HP_OK) hp_program_free(q);
    }
    unsigned seed = 7;
    uint8_t *copy = malloc(len);
    for (int it = 0; it < 300; it++) {
        memcpy(copy, data, len);
        for (int k = 0; k < 4; k++) {
            seed = seed * 1103515245u + 12345u;
            copy[(seed >> 8) % len] ^= (uint8_t)(1u << (seed % 8));
        }
        q = NULL;
        if (hp_program_unpack(copy, len, &q, &e) == HP_OK) {
            cr_expect_eq(hp_program_verify(q, &e), HP_OK);
            hp_program_free(q);
        }
    }
    free(copy);
    hp_free(data);
    hp_program_free(p);
    hp_graph_free(g);
}

/* The heads' transposes around each attention (q, k, v in, out back, and the gradients' in
 * the backward) are no instructions: the attention reads and writes [B, T, H, D] itself
 * (HP_INSTR_BTHD_*), the transposes of its output are aliases of its buffer; the verifier
 * refuses a program whose reader disagrees with what a buffer holds. */
Test(lower, attention_reads_and_writes_bthd_instead_of_transposing) {
    hp_graph *g = tiny_llama();
    hp_program *p = NULL;
    hp_err e;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    int fwd = -1, bwd = -1;
    for (int32_t i = 0; i < p->n_instrs; i++) {
        hp_op op = p->graph->nodes[p->instrs[i].node].op;
        cr_expect_neq(op, HP_OP_TRANSPOSE, "instruction %d copies a transpose", i);
        if (op == HP_OP_SDPA) {
            cr_expect_eq(p->instrs[i].flags, HP_INSTR_BTHD_IN(0) | HP_INSTR_BTHD_IN(1) |
                                                 HP_INSTR_BTHD_IN(2) | HP_INSTR_BTHD_OUT(0));
            fwd = i;
        }
        if (op == HP_OP_SDPA_BACKWARD) {
            cr_expect_eq(p->instrs[i].flags, HP_INSTR_BTHD_MASK);
            bwd = i;
        }
    }
    cr_assert(fwd >= 0 && bwd >= 0);
    cr_expect_geq(p->stats.n_folded_transposes, 2 * 8, "eight head transposes a layer");
    int aliases = 0; /* of the forward's output: its transpose to [B, T, H, D], and views of it */
    for (int32_t b = 0; b < p->n_buffers; b++)
        aliases += p->buffers[b].alias_of == p->instrs[fwd].out[0];
    cr_expect_gt(aliases, 0);
    char *text = NULL;
    cr_assert_eq(hp_program_print(p, &text, &e), HP_OK);
    cr_expect(strstr(text, "[bthd in0 in1 in2 out0]"), "%s", text);
    hp_free(text);
    cr_assert_eq(hp_program_verify(p, &e), HP_OK, "%s", e.msg);

    /* the backward reading the forward's output as if it were [B, H, T, D] */
    p->instrs[bwd].flags &= ~HP_INSTR_BTHD_IN(4);
    cr_expect_eq(hp_program_verify(p, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "input 4 reads buffer"), "%s", e.msg);
    p->instrs[bwd].flags |= HP_INSTR_BTHD_IN(4);
    /* a matrix product with an attention's flag, an attention flag past its outputs */
    for (int32_t i = 0; i < p->n_instrs; i++) {
        if (p->graph->nodes[p->instrs[i].node].op != HP_OP_MM) continue;
        p->instrs[i].flags |= HP_INSTR_BTHD_IN(0);
        cr_expect_eq(hp_program_verify(p, &e), HP_INVALID);
        cr_expect(strstr(e.msg, "flags"), "%s", e.msg);
        p->instrs[i].flags &= ~HP_INSTR_BTHD_IN(0);
        break;
    }
    p->instrs[fwd].flags |= HP_INSTR_BTHD_OUT(1);
    cr_expect_eq(hp_program_verify(p, &e), HP_INVALID);
    p->instrs[fwd].flags &= ~HP_INSTR_BTHD_OUT(1);
    cr_expect_eq(hp_program_verify(p, &e), HP_OK, "%s", e.msg);
    hp_program_free(p);
    hp_graph_free(g);
}

Test(lower, refuses_non_joint_graphs) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("mlp", &spec, NULL), HP_OK);
    hp_graph *g = NULL;
    cr_assert_eq(hp_model_build(&spec, &g, NULL), HP_OK);
    hp_program *p = NULL;
    hp_err e;
    cr_assert_eq(hp_lower(g, &p, &e), HP_INVALID);
    cr_expect(strstr(e.msg, "not a joint graph"), "%s", e.msg);
    cr_assert_null(p);
    hp_graph_free(g);
}

Test(lower, fault_injection) {
    hp_graph *g = tiny_llama();
    for (long n = 0;; n++) {
        hp_alloc_fail_at(n);
        hp_program *p = NULL;
        hp_err e;
        hp_status st = hp_lower(g, &p, &e);
        hp_alloc_fail_at(-1);
        if (st == HP_OK) {
            hp_program_free(p);
            break;
        }
        cr_assert_eq(st, HP_NOMEM, "step %ld: %s", n, e.msg);
        cr_assert_null(p);
        cr_assert_lt(n, 100000);
    }
    hp_graph_free(g);
}

/* A placed (dp=2, tp=2) program: one program serves every rank. Each rank's boxes follow from
 * its coordinates; the wire form carries the mesh and the boxes, and a message whose boxes
 * are another rank's is refused. */
Test(lower, mesh_program_boxes_per_rank_and_on_the_wire) {
    hp_graph *g = tiny_llama();
    hp_graph_inputs gi = hp_graph_count_inputs(g);
    int n_ph = gi.n_params + gi.n_buffers + gi.n_data;
    hp_graph_mesh mesh = {.ndim = 2, .name = {"dp", "tp"}, .size = {2, 2}};
    hp_placement *pl = calloc((size_t)n_ph * 2, sizeof *pl);
    int wq = -1;
    for (int i = 0; i < gi.n_params; i++)
        if (strstr(hp_node_attr(&g->nodes[i], HP_ATTR_FQN)->s, ".wq.")) {
            pl[i * 2 + 1] = HP_SHARD(0); /* colwise on tp */
            if (wq < 0) wq = i;
        }
    for (int i = gi.n_params + gi.n_buffers; i < n_ph; i++) pl[i * 2] = HP_SHARD(0);
    hp_graph *placed = NULL;
    hp_program *p = NULL;
    hp_err err = {0};
    cr_assert_eq(hp_pass_spmd(g, &mesh, pl, NULL, &placed, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(hp_lower(placed, &p, &err), HP_OK, "%s", err.msg);
    cr_assert_eq(p->world, 4);
    cr_assert_eq(hp_program_verify(p, &err), HP_OK, "%s", err.msg);
    int64_t rows = p->params[wq].global.shape[0];
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(hp_program_set_rank(p, r, &err), HP_OK, "%s", err.msg);
        cr_expect_eq(p->coord[0], r / 2);
        cr_expect_eq(p->coord[1], r % 2);
        cr_expect_eq(p->params[wq].off[0], (r % 2) * rows / 2, "rank %d", r);
        cr_expect_eq(p->params[wq].len[0], rows / 2);
        cr_expect(hp_program_owns(p, wq, r) == (r < 2), "wq: replicated over dp");
        int idx = -1, cnt = -1;
        hp_program_data_rank(p, r, &idx, &cnt);
        cr_expect(idx == r / 2 && cnt == 2, "rank %d reads batch %d of %d", r, idx, cnt);
        uint8_t *wire = NULL;
        size_t len = 0;
        hp_program *q = NULL;
        cr_assert_eq(hp_program_pack(p, &wire, &len, &err), HP_OK, "%s", err.msg);
        cr_assert_eq(hp_program_unpack(wire, len, &q, &err), HP_OK, "%s", err.msg);
        cr_expect_eq(q->rank, r);
        cr_expect_eq(q->mesh.ndim, 2);
        cr_expect_eq(q->params[wq].off[0], p->params[wq].off[0]);
        hp_program_free(q);
        hp_free(wire);
    }
    cr_expect_eq(hp_program_set_rank(p, 4, &err), HP_INVALID);
    /* rank 1's boxes in a message that says rank 0 */
    cr_assert_eq(hp_program_set_rank(p, 1, &err), HP_OK);
    uint8_t *wire = NULL;
    size_t len = 0;
    cr_assert_eq(hp_program_pack(p, &wire, &len, &err), HP_OK);
    hp_free(wire);
    p->rank = 0;
    cr_assert_eq(hp_program_pack(p, &wire, &len, &err), HP_OK);
    hp_program *q = NULL;
    cr_expect_eq(hp_program_unpack(wire, len, &q, &err), HP_INVALID);
    cr_expect(strstr(err.msg, "its box is not what its placements give rank 0"), "%s", err.msg);
    cr_expect_null(q);
    hp_free(wire);
    hp_program_free(p);
    hp_graph_free(placed);
    hp_graph_free(g);
    free(pl);
}

/* A program on the wire with a NUL byte or invalid UTF-8 inside a string (a parameter's FQN)
 * is refused naming the field, never read as the string's prefix. */
Test(lower, program_strings_checked_on_the_wire) {
    hp_graph *g = tiny_llama();
    hp_program *p = NULL;
    hp_err e;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    uint8_t *wire = NULL;
    size_t len = 0;
    cr_assert_eq(hp_program_pack(p, &wire, &len, &e), HP_OK, "%s", e.msg);
    const char *fqn = p->params[0].fqn;
    const char *patch[] = {"\0", "\xff"};
    const char *want[] = {"string has a NUL byte at byte 1",
                          "string has a byte that is not valid UTF-8 at byte 1"};
    for (int k = 0; k < 2; k++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, wire, len);
        int hits = 0;
        for (uint8_t *at = copy; (at = memmem(at, len - (size_t)(at - copy), fqn, strlen(fqn)));
             at++, hits++)
            at[1] = (uint8_t)patch[k][0];
        cr_assert_gt(hits, 0, "'%s' not on the wire", fqn);
        hp_program *q = NULL;
        cr_expect_eq(hp_program_unpack(copy, len, &q, &e), HP_INVALID, "%s", e.msg);
        cr_expect(strstr(e.msg, "program: ") && strstr(e.msg, want[k]), "%s", e.msg);
        cr_expect_null(q);
        free(copy);
    }
    hp_free(wire);
    hp_program_free(p);
    hp_graph_free(g);
}

/* A deep graph (512 layers) lowers, and its memory plan never overlaps two live buffers. How
 * lowering time grows with depth is bench_compile's to measure (its x4096 row), not a timed
 * test's: these machines are shared. */
Test(lower, deep_graph_memory_plan_has_no_live_overlap) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.n_layers = 512;
    spec.batch = 2, spec.seq = 64;
    hp_graph *g = NULL;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&spec, &g, &e), HP_OK, "%s", e.msg);
    hp_program *p = NULL;
    cr_assert_eq(hp_lower(g, &p, &e), HP_OK, "%s", e.msg);
    check_no_live_overlap(p);
    hp_program_free(p);
    hp_graph_free(g);
}
