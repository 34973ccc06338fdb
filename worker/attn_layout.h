/* worker/attn_layout.h — where the rows of a fused attention's operands lie. An operand of
 * [B, H, T, W] (q, k, v, out, g_out, gq, gk, gv) is stored in that order, or — where the call's
 * HP_CALL_BTHD_* flag says so (the lowering folded the heads' transpose into the call) — in
 * [B, T, H, W] order; a row of W elements is contiguous either way. Plain C, no dependencies:
 * the cuda kernels' header (worker/cuda/cuda_kernels.h) includes it too. */
#ifndef HP_WORKER_ATTN_LAYOUT_H
#define HP_WORKER_ATTN_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

/* Input k (q, k, v; the backward's g_out, q, k, v, out) or output k (out; gq, gk, gv) of an
 * attention call is stored [B, T, H, D], dims 1 and 2 exchanged, while its in_type/out_type is
 * the operand's [B, H, T, D] (hp/program.h: HP_INSTR_BTHD_*, the same bits). */
#define HP_CALL_BTHD_IN(k)  (1u << (4 + (k)))
#define HP_CALL_BTHD_OUT(k) (1u << (10 + (k)))
#define HP_CALL_BTHD_MASK   (0x1fu << 4 | 0x7u << 10)

/* Row (b, h, t) starts b·sb + h·sh + t·st elements in. */
typedef struct hp_attn_lay {
    int64_t sb, sh, st;
} hp_attn_lay;

/* Every operand's: q, k, v, out (the forward's output, the backward's input), g_out, gq, gk,
 * gv. */
typedef struct hp_attn_lays {
    hp_attn_lay q, k, v, o, go, gq, gk, gv;
} hp_attn_lays;

static inline hp_attn_lay hp_attn_lay_of(int64_t heads, int64_t t, int64_t w, bool bthd) {
    hp_attn_lay l;
    l.sb = heads * t * w;
    l.sh = bthd ? w : t * w;
    l.st = bthd ? heads * w : w;
    return l;
}

/* The layouts a call's flags give: the forward's (q, k, v; out) when !backward, else the
 * backward's (g_out, q, k, v, out; gq, gk, gv); the others stay [B, H, T, W]. */
static inline hp_attn_lays hp_attn_lays_of(unsigned flags, bool backward, int64_t h, int64_t hkv,
                                           int64_t t, int64_t s, int64_t d, int64_t dv) {
    int iq = backward ? 1 : 0; /* q's input index */
    hp_attn_lays l;
    l.q = hp_attn_lay_of(h, t, d, flags & HP_CALL_BTHD_IN(iq));
    l.k = hp_attn_lay_of(hkv, s, d, flags & HP_CALL_BTHD_IN(iq + 1));
    l.v = hp_attn_lay_of(hkv, s, dv, flags & HP_CALL_BTHD_IN(iq + 2));
    l.o = hp_attn_lay_of(h, t, dv, flags & (backward ? HP_CALL_BTHD_IN(4) : HP_CALL_BTHD_OUT(0)));
    l.go = hp_attn_lay_of(h, t, dv, backward && (flags & HP_CALL_BTHD_IN(0)));
    l.gq = hp_attn_lay_of(h, t, d, backward && (flags & HP_CALL_BTHD_OUT(0)));
    l.gk = hp_attn_lay_of(hkv, s, d, backward && (flags & HP_CALL_BTHD_OUT(1)));
    l.gv = hp_attn_lay_of(hkv, s, dv, backward && (flags & HP_CALL_BTHD_OUT(2)));
    return l;
}

#endif
