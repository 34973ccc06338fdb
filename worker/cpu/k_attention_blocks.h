/* worker/cpu/k_attention_blocks.h — the block-level work of k_attention.c, included by it twice
 * (no include guard on purpose): once compiled for AVX2+FMA (ATTN_AVX2 defined: intrinsics in
 * the three matrix microkernels, the plain loops vectorized 8 wide), once for the baseline
 * target (scalar fmaf in the microkernels). Names get ATTN_SFX's suffix.
 *
 * Both copies perform the same IEEE operations in the same order on every element: the
 * microkernels chain fmaf along the same index in both, and the plain loops are compiled
 * without FMA contraction (cpu_internal.h). So the result does not depend on which copy runs;
 * a test forces the baseline one and compares bits.
 *
 * Expects from the includer: attn, bwd_buf, BQ, BK, block_keys, row_of, first_qblock.
 */

/* xt[c · BK + j] = x[j · ld + c] for j < nk; columns nk..BK zeroed so that the full-width
 * microkernels only ever read finite values. */
ATTN_TARGET static void ATTN_SFX(transpose_block)(float *restrict xt, const float *restrict x,
                                                  int64_t nk, int64_t w, int64_t ld) {
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < w; c++) xt[c * BK + j] = x[j * ld + c];
    for (int64_t c = 0; c < w; c++)
        for (int64_t j = nk; j < BK; j++) xt[c * BK + j] = 0;
}

/* s[i · BK + j] = Σ_c x[i · ld + c] · yt[c · BK + j] for i < nq and (at least) j < nk, as an fma
 * chain in c order. The AVX2 copy fills all BK columns (the caller masks j >= nk). */
ATTN_TARGET static void ATTN_SFX(block_dots)(float *restrict s, const float *restrict x,
                                             const float *restrict yt, int64_t nq, int64_t nk,
                                             int64_t w, int64_t ld) {
#ifdef ATTN_AVX2
    (void)nk;
    int64_t i = 0;
    for (; i + 2 <= nq; i += 2) /* two rows share each load of yt */
        for (int64_t j = 0; j < BK; j += 32) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
                   b3 = a0;
            for (int64_t c = 0; c < w; c++) {
                __m256 xa = _mm256_set1_ps(x[i * ld + c]), xb = _mm256_set1_ps(x[(i + 1) * ld + c]);
                const float *y = yt + c * BK + j;
                __m256 y0 = _mm256_loadu_ps(y), y1 = _mm256_loadu_ps(y + 8),
                       y2 = _mm256_loadu_ps(y + 16), y3 = _mm256_loadu_ps(y + 24);
                a0 = _mm256_fmadd_ps(xa, y0, a0);
                a1 = _mm256_fmadd_ps(xa, y1, a1);
                a2 = _mm256_fmadd_ps(xa, y2, a2);
                a3 = _mm256_fmadd_ps(xa, y3, a3);
                b0 = _mm256_fmadd_ps(xb, y0, b0);
                b1 = _mm256_fmadd_ps(xb, y1, b1);
                b2 = _mm256_fmadd_ps(xb, y2, b2);
                b3 = _mm256_fmadd_ps(xb, y3, b3);
            }
            float *sa = s + i * BK + j, *sb = sa + BK;
            _mm256_storeu_ps(sa, a0);
            _mm256_storeu_ps(sa + 8, a1);
            _mm256_storeu_ps(sa + 16, a2);
            _mm256_storeu_ps(sa + 24, a3);
            _mm256_storeu_ps(sb, b0);
            _mm256_storeu_ps(sb + 8, b1);
            _mm256_storeu_ps(sb + 16, b2);
            _mm256_storeu_ps(sb + 24, b3);
        }
    for (; i < nq; i++)
        for (int64_t j = 0; j < BK; j += 32) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t c = 0; c < w; c++) {
                __m256 xa = _mm256_set1_ps(x[i * ld + c]);
                const float *y = yt + c * BK + j;
                a0 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y), a0);
                a1 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y + 8), a1);
                a2 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y + 16), a2);
                a3 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y + 24), a3);
            }
            float *sa = s + i * BK + j;
            _mm256_storeu_ps(sa, a0);
            _mm256_storeu_ps(sa + 8, a1);
            _mm256_storeu_ps(sa + 16, a2);
            _mm256_storeu_ps(sa + 24, a3);
        }
#else
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++) {
            float acc = 0;
            for (int64_t c = 0; c < w; c++) acc = fmaf(x[i * ld + c], yt[c * BK + j], acc);
            s[i * BK + j] = acc;
        }
#endif
}

/* yi[c] += Σ_j pi[j] · x[j · ldx + c] for c0 <= c < w: an fma chain in j order per element. */
ATTN_TARGET static void ATTN_SFX(pv_row)(float *restrict yi, const float *restrict pi,
                                         const float *restrict x, int64_t ldx, int64_t nk,
                                         int64_t c0, int64_t w) {
    int64_t c = c0;
#ifdef ATTN_AVX2
    for (; c + 32 <= w; c += 32) {
        __m256 a0 = _mm256_loadu_ps(yi + c), a1 = _mm256_loadu_ps(yi + c + 8),
               a2 = _mm256_loadu_ps(yi + c + 16), a3 = _mm256_loadu_ps(yi + c + 24);
        for (int64_t j = 0; j < nk; j++) {
            __m256 pj = _mm256_set1_ps(pi[j]);
            const float *xj = x + j * ldx + c;
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(xj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(xj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(xj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(xj + 24), a3);
        }
        _mm256_storeu_ps(yi + c, a0);
        _mm256_storeu_ps(yi + c + 8, a1);
        _mm256_storeu_ps(yi + c + 16, a2);
        _mm256_storeu_ps(yi + c + 24, a3);
    }
    for (; c + 8 <= w; c += 8) {
        __m256 a0 = _mm256_loadu_ps(yi + c);
        for (int64_t j = 0; j < nk; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(pi[j]), _mm256_loadu_ps(x + j * ldx + c), a0);
        _mm256_storeu_ps(yi + c, a0);
    }
#endif
    for (; c < w; c++) {
        float acc = yi[c];
        for (int64_t j = 0; j < nk; j++) acc = fmaf(pi[j], x[j * ldx + c], acc);
        yi[c] = acc;
    }
}

/* y[i · ldy + c] += Σ_j p[i · BK + j] · x[j · ldx + c] for i < nq, c < w: fma chain in j order.
 * The AVX2 copy runs four rows at once over 16-column strips (each load of x feeds 8 FMAs). */
ATTN_TARGET static void ATTN_SFX(block_pv)(float *restrict y, int64_t ldy, const float *restrict p,
                                           const float *restrict x, int64_t ldx, int64_t nq,
                                           int64_t nk, int64_t w) {
    int64_t i = 0;
#ifdef ATTN_AVX2
    for (; i + 4 <= nq && w >= 16; i += 4) {
        float *y0 = y + i * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
        const float *p0 = p + i * BK;
        int64_t c = 0;
        for (; c + 16 <= w; c += 16) {
            __m256 a0 = _mm256_loadu_ps(y0 + c), b0 = _mm256_loadu_ps(y0 + c + 8);
            __m256 a1 = _mm256_loadu_ps(y1 + c), b1 = _mm256_loadu_ps(y1 + c + 8);
            __m256 a2 = _mm256_loadu_ps(y2 + c), b2 = _mm256_loadu_ps(y2 + c + 8);
            __m256 a3 = _mm256_loadu_ps(y3 + c), b3 = _mm256_loadu_ps(y3 + c + 8);
            for (int64_t j = 0; j < nk; j++) {
                const float *xj = x + j * ldx + c;
                __m256 xa = _mm256_loadu_ps(xj), xb = _mm256_loadu_ps(xj + 8);
                __m256 q0 = _mm256_set1_ps(p0[j]), q1 = _mm256_set1_ps(p0[BK + j]);
                __m256 q2 = _mm256_set1_ps(p0[2 * BK + j]), q3 = _mm256_set1_ps(p0[3 * BK + j]);
                a0 = _mm256_fmadd_ps(q0, xa, a0);
                b0 = _mm256_fmadd_ps(q0, xb, b0);
                a1 = _mm256_fmadd_ps(q1, xa, a1);
                b1 = _mm256_fmadd_ps(q1, xb, b1);
                a2 = _mm256_fmadd_ps(q2, xa, a2);
                b2 = _mm256_fmadd_ps(q2, xb, b2);
                a3 = _mm256_fmadd_ps(q3, xa, a3);
                b3 = _mm256_fmadd_ps(q3, xb, b3);
            }
            _mm256_storeu_ps(y0 + c, a0);
            _mm256_storeu_ps(y0 + c + 8, b0);
            _mm256_storeu_ps(y1 + c, a1);
            _mm256_storeu_ps(y1 + c + 8, b1);
            _mm256_storeu_ps(y2 + c, a2);
            _mm256_storeu_ps(y2 + c + 8, b2);
            _mm256_storeu_ps(y3 + c, a3);
            _mm256_storeu_ps(y3 + c + 8, b3);
        }
        for (int r = 0; r < 4; r++)
            ATTN_SFX(pv_row)(y + (i + r) * ldy, p0 + r * BK, x, ldx, nk, c, w);
    }
#endif
    for (; i < nq; i++) ATTN_SFX(pv_row)(y + i * ldy, p + i * BK, x, ldx, nk, 0, w);
}

/* yj[c] += Σ_i p[i · BK + j] · x[i · ldx + c] for c0 <= c < w: an fma chain in i order. */
ATTN_TARGET static void ATTN_SFX(ptx_row)(float *restrict yj, const float *restrict p, int64_t j,
                                          const float *restrict x, int64_t ldx, int64_t nq,
                                          int64_t c0, int64_t w) {
    int64_t c = c0;
#ifdef ATTN_AVX2
    for (; c + 32 <= w; c += 32) {
        __m256 a0 = _mm256_loadu_ps(yj + c), a1 = _mm256_loadu_ps(yj + c + 8),
               a2 = _mm256_loadu_ps(yj + c + 16), a3 = _mm256_loadu_ps(yj + c + 24);
        for (int64_t i = 0; i < nq; i++) {
            __m256 pij = _mm256_set1_ps(p[i * BK + j]);
            const float *xi = x + i * ldx + c;
            a0 = _mm256_fmadd_ps(pij, _mm256_loadu_ps(xi), a0);
            a1 = _mm256_fmadd_ps(pij, _mm256_loadu_ps(xi + 8), a1);
            a2 = _mm256_fmadd_ps(pij, _mm256_loadu_ps(xi + 16), a2);
            a3 = _mm256_fmadd_ps(pij, _mm256_loadu_ps(xi + 24), a3);
        }
        _mm256_storeu_ps(yj + c, a0);
        _mm256_storeu_ps(yj + c + 8, a1);
        _mm256_storeu_ps(yj + c + 16, a2);
        _mm256_storeu_ps(yj + c + 24, a3);
    }
    for (; c + 8 <= w; c += 8) {
        __m256 a0 = _mm256_loadu_ps(yj + c);
        for (int64_t i = 0; i < nq; i++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i * BK + j]), _mm256_loadu_ps(x + i * ldx + c),
                                 a0);
        _mm256_storeu_ps(yj + c, a0);
    }
#endif
    for (; c < w; c++) {
        float acc = yj[c];
        for (int64_t i = 0; i < nq; i++) acc = fmaf(p[i * BK + j], x[i * ldx + c], acc);
        yj[c] = acc;
    }
}

/* y[j · ldy + c] += Σ_i p[i · BK + j] · x[i · ldx + c] for j < nk, c < w: fma chain in i order.
 * The AVX2 copy runs four key rows at once over 16-column strips. */
ATTN_TARGET static void ATTN_SFX(block_ptx)(float *restrict y, int64_t ldy, const float *restrict p,
                                            const float *restrict x, int64_t ldx, int64_t nq,
                                            int64_t nk, int64_t w) {
    int64_t j = 0;
#ifdef ATTN_AVX2
    for (; j + 4 <= nk && w >= 16; j += 4) {
        float *y0 = y + j * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
        int64_t c = 0;
        for (; c + 16 <= w; c += 16) {
            __m256 a0 = _mm256_loadu_ps(y0 + c), b0 = _mm256_loadu_ps(y0 + c + 8);
            __m256 a1 = _mm256_loadu_ps(y1 + c), b1 = _mm256_loadu_ps(y1 + c + 8);
            __m256 a2 = _mm256_loadu_ps(y2 + c), b2 = _mm256_loadu_ps(y2 + c + 8);
            __m256 a3 = _mm256_loadu_ps(y3 + c), b3 = _mm256_loadu_ps(y3 + c + 8);
            for (int64_t i = 0; i < nq; i++) {
                const float *xi = x + i * ldx + c, *pi = p + i * BK + j;
                __m256 xa = _mm256_loadu_ps(xi), xb = _mm256_loadu_ps(xi + 8);
                __m256 q0 = _mm256_set1_ps(pi[0]), q1 = _mm256_set1_ps(pi[1]);
                __m256 q2 = _mm256_set1_ps(pi[2]), q3 = _mm256_set1_ps(pi[3]);
                a0 = _mm256_fmadd_ps(q0, xa, a0);
                b0 = _mm256_fmadd_ps(q0, xb, b0);
                a1 = _mm256_fmadd_ps(q1, xa, a1);
                b1 = _mm256_fmadd_ps(q1, xb, b1);
                a2 = _mm256_fmadd_ps(q2, xa, a2);
                b2 = _mm256_fmadd_ps(q2, xb, b2);
                a3 = _mm256_fmadd_ps(q3, xa, a3);
                b3 = _mm256_fmadd_ps(q3, xb, b3);
            }
            _mm256_storeu_ps(y0 + c, a0);
            _mm256_storeu_ps(y0 + c + 8, b0);
            _mm256_storeu_ps(y1 + c, a1);
            _mm256_storeu_ps(y1 + c + 8, b1);
            _mm256_storeu_ps(y2 + c, a2);
            _mm256_storeu_ps(y2 + c + 8, b2);
            _mm256_storeu_ps(y3 + c, a3);
            _mm256_storeu_ps(y3 + c + 8, b3);
        }
        for (int r = 0; r < 4; r++)
            ATTN_SFX(ptx_row)(y + (j + r) * ldy, p, j + r, x, ldx, nq, c, w);
    }
#endif
    for (; j < nk; j++) ATTN_SFX(ptx_row)(y + j * ldy, p, j, x, ldx, nq, 0, w);
}

/* Scales a score row, sets the hidden keys j >= vis to -inf, and returns the max of the row and
 * `m`: 8 lane maxima (lane = v > lane ? v : lane, as maxps) folded in lane order, in both
 * copies, so even NaN lands the same way. */
ATTN_TARGET static float ATTN_SFX(scale_mask_max)(float *restrict si, float scale, int64_t vis,
                                                  float m) {
    float lane[8];
#ifdef ATTN_AVX2
    __m256 sc = _mm256_set1_ps(scale), mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < BK; j += 8)
        _mm256_storeu_ps(si + j, _mm256_mul_ps(_mm256_loadu_ps(si + j), sc));
    for (int64_t j = vis; j < BK; j++) si[j] = -INFINITY;
    for (int64_t j = 0; j < BK; j += 8) mx = _mm256_max_ps(_mm256_loadu_ps(si + j), mx);
    _mm256_storeu_ps(lane, mx);
#else
    for (int64_t j = 0; j < BK; j++) si[j] *= scale;
    for (int64_t j = vis; j < BK; j++) si[j] = -INFINITY;
    for (int k = 0; k < 8; k++) lane[k] = -INFINITY;
    for (int64_t j = 0; j < BK; j += 8)
        for (int k = 0; k < 8; k++) lane[k] = si[j + k] > lane[k] ? si[j + k] : lane[k];
#endif
    for (int k = 0; k < 8; k++) m = lane[k] > m ? lane[k] : m;
    return m;
}

/* ---- forward: one task per (batch, head, query block) --------------------------------------- */

ATTN_TARGET static void ATTN_SFX(fwd_task)(void *ctx, int64_t task, int thread) {
    const attn *a = ctx;
    int64_t nqb = (a->t + BQ - 1) / BQ;
    int64_t qb = task % nqb, bh = task / nqb, b = bh / a->h, h = bh % a->h, hk = h / a->group;
    int64_t t0 = qb * BQ, nq = a->t - t0 < BQ ? a->t - t0 : BQ;
    float *kt = a->scratch + thread * a->per_thread;
    float *s = kt + a->d * BK, *acc = s + BQ * BK, *m = acc + BQ * a->dv, *l = m + BQ;
    const float *q = row_of(a->q, a->l.q, b, h, t0);
    for (int64_t i = 0; i < nq * a->dv; i++) acc[i] = 0;
    for (int64_t i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0;
    }
    /* locals: with -fno-strict-aliasing a store through a float * could change *a */
    const int64_t d = a->d, dv = a->dv, keys = block_keys(a, t0, nq);
    const int64_t ldq = a->l.q.st, ldk = a->l.k.st, ldv = a->l.v.st, ldo = a->l.o.st;
    const float scale = a->scale;
    const bool causal = a->causal;
    for (int64_t k0 = 0; k0 < keys; k0 += BK) {
        int64_t nk = keys - k0 < BK ? keys - k0 : BK;
        ATTN_SFX(transpose_block)(kt, row_of(a->k, a->l.k, b, hk, k0), nk, d, ldk);
        ATTN_SFX(block_dots)(s, q, kt, nq, nk, d, ldq);
        for (int64_t i = 0; i < nq; i++) {
            float *si = s + i * BK;
            int64_t vis = causal ? t0 + i + 1 - k0 : nk; /* row t0 + i sees keys <= t0 + i */
            vis = vis < 0 ? 0 : vis > nk ? nk : vis;
            float mb = ATTN_SFX(scale_mask_max)(si, scale, vis, m[i]);
            if (mb == -INFINITY) { /* nothing visible yet: this block adds nothing */
                for (int64_t j = 0; j < BK; j++) si[j] = 0;
                continue;
            }
            float corr = hp__cpu_expf(m[i] - mb), lane[8] = {0};
            for (int64_t j0 = 0; j0 < BK; j0 += 8)
                for (int k = 0; k < 8; k++) {
                    float e = hp__cpu_expf(si[j0 + k] - mb); /* exp(-inf) = 0 */
                    si[j0 + k] = e;
                    lane[k] += e;
                }
            float sum = 0;
            for (int k = 0; k < 8; k++) sum += lane[k];
            l[i] = l[i] * corr + sum;
            m[i] = mb;
            float *ai = acc + i * dv;
            for (int64_t c = 0; c < dv; c++) ai[c] *= corr;
        }
        ATTN_SFX(block_pv)(acc, dv, s, row_of(a->v, a->l.v, b, hk, k0), ldv, nq, nk, dv);
    }
    float *out = row_of(a->out, a->l.o, b, h, t0);
    float *lse = a->lse + (b * a->h + h) * a->t + t0;
    for (int64_t i = 0; i < nq; i++) {
        float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f; /* no visible key: out 0, lse -inf */
        for (int64_t c = 0; c < dv; c++) out[i * ldo + c] = acc[i * dv + c] * inv;
        lse[i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

/* Loads the transposed key and value blocks k0.. (nk rows) of kv head hk. */
ATTN_TARGET static void ATTN_SFX(load_kv)(const attn *a, const bwd_buf *w, int64_t b, int64_t hk,
                                          int64_t k0, int64_t nk) {
    ATTN_SFX(transpose_block)(w->kt, row_of(a->k, a->l.k, b, hk, k0), nk, a->d, a->l.k.st);
    ATTN_SFX(transpose_block)(w->vt, row_of(a->v, a->l.v, b, hk, k0), nk, a->dv, a->l.v.st);
}

/* One (query block, key block) pair of head h: P and dS, then the gv/gk (kv) and gq (q)
 * updates. Both schedules call exactly this. */
ATTN_TARGET static void ATTN_SFX(bwd_block)(const attn *a, const bwd_buf *w, int64_t b, int64_t h,
                                            int64_t qb, int64_t k0, int64_t nk, bool kv, bool q) {
    int64_t hk = h / a->group, t0 = qb * BQ, nq = a->t - t0 < BQ ? a->t - t0 : BQ;
    const float *qv = row_of(a->q, a->l.q, b, h, t0), *go = row_of(a->go, a->l.go, b, h, t0);
    const float *lse = a->lse_in + (b * a->h + h) * a->t + t0;
    const float *delta = a->delta + (b * a->h + h) * a->t + t0;
    float *p = w->p, *dp = w->dp;
    const float scale = a->scale; /* locals: see fwd_task */
    const bool causal = a->causal;
    ATTN_SFX(block_dots)(p, qv, w->kt, nq, nk, a->d, a->l.q.st);
    ATTN_SFX(block_dots)(dp, go, w->vt, nq, nk, a->dv, a->l.go.st);
    for (int64_t i = 0; i < nq; i++) {
        int64_t vis = causal ? t0 + i + 1 - k0 : nk;
        vis = vis < 0 ? 0 : vis > nk ? nk : vis;
        float *pi = p + i * BK, *dpi = dp + i * BK;
        float li = lse[i] == -INFINITY ? INFINITY : lse[i]; /* a row with no key: P = 0 */
        float di = delta[i];
        for (int64_t j = 0; j < BK; j++) {
            float e = hp__cpu_expf(pi[j] * scale - li);
            e = j < vis ? e : 0.0f;
            float ds = e * (dpi[j] - di) * scale;
            pi[j] = e;
            dpi[j] = j < vis ? ds : 0.0f; /* dS, scaled */
        }
    }
    if (kv) {
        float *gv = row_of(a->gv, a->l.gv, b, hk, k0), *gk = row_of(a->gk, a->l.gk, b, hk, k0);
        ATTN_SFX(block_ptx)(gv, a->l.gv.st, p, go, a->l.go.st, nq, nk, a->dv);
        ATTN_SFX(block_ptx)(gk, a->l.gk.st, dp, qv, a->l.q.st, nq, nk, a->d);
    }
    if (q) {
        float *gq = row_of(a->gq, a->l.gq, b, h, t0);
        ATTN_SFX(block_pv)
        (gq, a->l.gq.st, dp, row_of(a->k, a->l.k, b, hk, k0), a->l.k.st, nq, nk, a->d);
    }
}

/* Fused: task = (batch, kv head). */
ATTN_TARGET static void ATTN_SFX(bwd_fused)(void *ctx, int64_t task, int thread) {
    const attn *a = ctx;
    int64_t b = task / a->hkv, hk = task % a->hkv, nqb = (a->t + BQ - 1) / BQ;
    bwd_buf w = bwd_slice(a, thread);
    int64_t keys = block_keys(a, 0, a->t);
    for (int64_t k0 = 0; k0 < keys; k0 += BK) {
        int64_t nk = keys - k0 < BK ? keys - k0 : BK;
        ATTN_SFX(load_kv)(a, &w, b, hk, k0, nk);
        for (int64_t h = hk * a->group; h < (hk + 1) * a->group; h++)
            for (int64_t qb = first_qblock(a, k0); qb < nqb; qb++)
                ATTN_SFX(bwd_block)(a, &w, b, h, qb, k0, nk, true, true);
    }
}

/* Two-pass, pass 1: task = (batch, kv head, key block): gk, gv. */
ATTN_TARGET static void ATTN_SFX(bwd_kv)(void *ctx, int64_t task, int thread) {
    const attn *a = ctx;
    int64_t nkb = (a->s + BK - 1) / BK, nqb = (a->t + BQ - 1) / BQ;
    int64_t kb = task % nkb, b = task / nkb / a->hkv, hk = task / nkb % a->hkv;
    int64_t k0 = kb * BK, keys = block_keys(a, 0, a->t);
    if (k0 >= keys) return;
    int64_t nk = keys - k0 < BK ? keys - k0 : BK;
    bwd_buf w = bwd_slice(a, thread);
    ATTN_SFX(load_kv)(a, &w, b, hk, k0, nk);
    for (int64_t h = hk * a->group; h < (hk + 1) * a->group; h++)
        for (int64_t qb = first_qblock(a, k0); qb < nqb; qb++)
            ATTN_SFX(bwd_block)(a, &w, b, h, qb, k0, nk, true, false);
}

/* Two-pass, pass 2: task = (batch, head, query block): gq over the key blocks in order. */
ATTN_TARGET static void ATTN_SFX(bwd_q)(void *ctx, int64_t task, int thread) {
    const attn *a = ctx;
    int64_t nqb = (a->t + BQ - 1) / BQ;
    int64_t qb = task % nqb, h = task / nqb % a->h, b = task / nqb / a->h;
    bwd_buf w = bwd_slice(a, thread);
    int64_t keys = block_keys(a, 0, a->t);
    for (int64_t k0 = 0; k0 < keys && first_qblock(a, k0) <= qb; k0 += BK) {
        int64_t nk = keys - k0 < BK ? keys - k0 : BK;
        ATTN_SFX(load_kv)(a, &w, b, h / a->group, k0, nk);
        ATTN_SFX(bwd_block)(a, &w, b, h, qb, k0, nk, false, true);
    }
}
