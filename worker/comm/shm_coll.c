/* worker/comm/shm_coll.c — the shm communicator's collectives and reduction kernels.
 *
 * Every collective posts a descriptor (kind, size, dtype, op, root, sequence number), then
 * moves its data in steps of at most half a slot: each rank copies its part into the current
 * half of its own slot, syncs (hp__shm_sync: release our writes, acquire everyone's), and
 * reads what it needs from the peers' slots. At the first sync every rank compares all
 * descriptors, so a rank making a different call or size is reported by every rank.
 *
 *   all_gather      rank r copies its chunk in, arrives, copies its own chunk to recv while
 *                   the peers catch up, then copies the peers' chunks out.
 *   reduce_scatter  rank r copies in the step's piece of every destination chunk; rank r then
 *                   reduces only its own destination's pieces, reading all slots.
 *   all_reduce      rank r copies its window in; rank r reduces its 1/world of the window
 *                   into the result area; sync; everyone copies the result out (reduce-scatter
 *                   + all-gather, so the reduction work splits across ranks). Windows of at
 *                   most 16 KiB skip the second sync: every rank reduces the whole window.
 *   broadcast       the root copies in, the others copy out.
 *   barrier         one sync.
 *   all_to_all      rank r copies in the step's piece of its chunk for every other rank
 *                   (piece d for rank d), syncs, and copies piece r out of every peer's slot
 *                   into recv chunk j; its own chunk never goes through the slot. In place
 *                   works because a step's pieces are staged before any is overwritten.
 *   split           all_gather of every rank's (color, key), posted as "split" so that a
 *                   rank making another call is reported as such; then each rank sorts its
 *                   color's members by (key, rank) and joins the group's own segment
 *                   (hp__shm_group_new, shm.c), named "<name>.s<k>c<color>" for this
 *                   communicator's k-th split, with this communicator's timeout and slot size
 *                   and its members' pids (a member that dies before joining is reported at
 *                   once). The group shares nothing with this communicator afterwards: it has
 *                   its own sequence numbers, broken flag and dead-peer checks, and either
 *                   may be freed first.
 *
 * The two halves of a slot alternate by step, so a rank fills step s+1 while slower peers
 * still read step s (one step of pipelining) and waits only when two steps ahead.
 * reduce_scatter also works in place (recv = send + rank * count, or recv = send), and
 * all_reduce with send == recv, as comm.h allows.
 *
 * Reductions fold ranks in rank order, ((x0 + x1) + x2) ..., element by element, so every
 * rank gets bitwise the same result run after run, whoever computes an element. HP_REDUCE_AVG
 * divides that sum by world (i64: C integer division, truncating toward zero); i64 sums wrap
 * (two's complement) instead of overflowing. HP_REDUCE_MAX propagates NaN. Buffers must be
 * aligned to their dtype; apart from the aliasing comm.h allows they must not overlap.
 */
#include "worker/comm/shm_internal.h"
#include "worker/comm/fold.h"

#include <stdio.h>
#include <string.h>

#define SMALL_WIN (16 << 10) /* all_reduce windows up to this many bytes: one sync */

static const size_t esize[] = {4, 8, 8};
static const char *const dt_name[] = {"f32", "f64", "i64"};
static const char *const op_name[] = {"sum", "avg", "max"};

/* ---- descriptors ----------------------------------------------------------------------------- */

static void describe(char *buf, size_t cap, const hp__shm_desc *d) {
    const char *k = hp__shm_kind_name(d->kind);
    unsigned long long n = (unsigned long long)d->size;
    switch (d->kind) {
    case HP__SHM_ALL_GATHER:
        snprintf(buf, cap, "%s(%llu bytes)", k, n);
        break;
    case HP__SHM_REDUCE_SCATTER:
    case HP__SHM_ALL_REDUCE:
        snprintf(buf, cap, "%s(%llu x %s, %s)", k, n,
                 d->dtype >= 0 && d->dtype < 3 ? dt_name[d->dtype] : "?",
                 d->op >= 0 && d->op < 3 ? op_name[d->op] : "?");
        break;
    case HP__SHM_BROADCAST:
        snprintf(buf, cap, "%s(%llu bytes, root %d)", k, n, d->root);
        break;
    case HP__SHM_ALL_TO_ALL:
        snprintf(buf, cap, "%s(%llu bytes per rank)", k, n);
        break;
    default:
        snprintf(buf, cap, "%s", k);
        break;
    }
}

/* Starts collective #(seq + 1): fails fast on a broken communicator. */
static hp_status start(hp__shm_comm *c, hp_err *err) {
    if (c->broken) {
        return hp_errf(err, HP_IO, "shm '%s': unusable after an earlier error: %s", c->name,
                       c->broken_msg);
    }
    c->seq++;
    return HP_OK;
}

/* Publishes what this rank calls (made visible by the next sync's release store). */
static void post(hp__shm_comm *c, int kind, uint64_t size, int dt, int op, int root) {
    hp__shm_desc *d = &c->ranks[c->base.rank].desc[c->seq & 1];
    d->seq = c->seq;
    d->size = size;
    d->kind = kind;
    d->dtype = dt;
    d->op = op;
    d->root = root;
}

/* After the first sync: every rank's descriptor must equal ours. A peer cannot overwrite
 * desc[seq % 2] before we arrive at the next sync, so the read is stable. */
static hp_status check_descs(hp__shm_comm *c, hp_err *err) {
    int me = c->base.rank;
    const hp__shm_desc *mine = &c->ranks[me].desc[c->seq & 1];
    for (int j = 0; j < c->base.world; j++) {
        const hp__shm_desc *d = &c->ranks[j].desc[c->seq & 1];
        if (j == me || (d->seq == mine->seq && d->size == mine->size && d->kind == mine->kind &&
                        d->dtype == mine->dtype && d->op == mine->op && d->root == mine->root)) {
            continue;
        }
        char a[128], b[128];
        describe(a, sizeof a, j < me ? d : mine);
        describe(b, sizeof b, j < me ? mine : d);
        if (d->seq != mine->seq) {
            return hp__shm_fail(
                c, err, HP_IO,
                "ranks out of step: rank %d is at collective #%llu, rank %d at #%llu", me,
                (unsigned long long)mine->seq, j, (unsigned long long)d->seq);
        }
        return hp__shm_fail(c, err, HP_IO,
                            "collective #%llu differs: rank %d called %s, rank %d called %s",
                            (unsigned long long)c->seq, j < me ? j : me, a, j < me ? me : j, b);
    }
    return HP_OK;
}

/* The step's half of rank r's slot. */
static inline uint8_t *slot(const hp__shm_comm *c, int r) {
    return c->slots + (size_t)r * c->slot_bytes + (size_t)(c->step & 1) * c->half;
}

/* After the first sync of step s: the descriptors (first step), then the peers' failures. */
static hp_status step_checks(hp__shm_comm *c, int kind, size_t s, hp_err *err) {
    if (s == 0) HP_TRY(check_descs(c, err));
    return hp__shm_peer_check(c, kind, err);
}

static hp_status step_sync(hp__shm_comm *c, int kind, size_t s, hp_err *err) {
    HP_TRY(hp__shm_sync(c, kind, err));
    return step_checks(c, kind, s, err);
}

static hp_status bad_arg(hp__shm_comm *c, int kind, const char *what, hp_err *err) {
    return hp__shm_fail(c, err, HP_INVALID, "%s #%llu: %s", hp__shm_kind_name(kind),
                        (unsigned long long)c->seq, what);
}

/* Validates a reduction's dtype, op and count; *bytes = count * esize. */
static hp_status check_reduce(hp__shm_comm *c, int kind, const void *send, void *recv,
                              int64_t count, hp_comm_dtype dt, hp_reduce_op op, int64_t mult,
                              hp_err *err) {
    if ((int)dt < 0 || (int)dt > 2) {
        return hp__shm_fail(c, err, HP_INVALID, "%s #%llu: bad dtype %d", hp__shm_kind_name(kind),
                            (unsigned long long)c->seq, (int)dt);
    }
    if ((int)op < 0 || (int)op > 2) {
        return hp__shm_fail(c, err, HP_INVALID, "%s #%llu: bad reduce op %d",
                            hp__shm_kind_name(kind), (unsigned long long)c->seq, (int)op);
    }
    if (count < 0 || (uint64_t)count > SIZE_MAX / esize[dt] / (uint64_t)mult) {
        return hp__shm_fail(c, err, HP_INVALID, "%s #%llu: bad count %lld", hp__shm_kind_name(kind),
                            (unsigned long long)c->seq, (long long)count);
    }
    if (count > 0 && !send) return bad_arg(c, kind, "send is NULL", err);
    if (count > 0 && !recv) return bad_arg(c, kind, "recv is NULL", err);
    return HP_OK;
}

/* ---- the collectives ------------------------------------------------------------------------- */

/* all_gather's data movement, posted as `kind` (all_gather, or split's exchange); the caller
 * has started the collective and checked the arguments. */
static hp_status gather(hp__shm_comm *c, int kind, const void *send, void *recv, size_t bytes,
                        hp_err *err) {
    const int me = c->base.rank, world = c->base.world;
    post(c, kind, bytes, 0, 0, 0);
    const uint8_t *src = send;
    uint8_t *dst = recv;
    if (world == 1) {
        if (bytes && dst != src) memmove(dst, src, bytes);
        return HP_OK;
    }
    size_t steps = bytes ? (bytes + c->half - 1) / c->half : 1;
    for (size_t s = 0; s < steps; s++) {
        size_t off = s * c->half, len = bytes - off < c->half ? bytes - off : c->half;
        if (len) memcpy(slot(c, me), src + off, len);
        hp__shm_arrive(c);
        /* Our own chunk while the peers catch up (a no-op when send is our part of recv). */
        uint8_t *own = dst + (size_t)me * bytes + off;
        if (len && own != src + off) memcpy(own, src + off, len);
        HP_TRY(hp__shm_wait(c, kind, err));
        HP_TRY(step_checks(c, kind, s, err));
        for (int k = 1; k < world && len; k++) {
            int j = (me + k) % world; /* after our own chunk: spreads the ranks' reads */
            memcpy(dst + (size_t)j * bytes + off, slot(c, j), len);
        }
        c->step++;
    }
    return HP_OK;
}

static hp_status shm_all_gather(hp_comm *base, const void *send, void *recv, size_t bytes,
                                hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_ALL_GATHER;
    HP_TRY(start(c, err));
    if (bytes > 0 && (!send || !recv)) {
        return bad_arg(c, kind, send ? "recv is NULL" : "send is NULL", err);
    }
    if (bytes > SIZE_MAX / (size_t)base->world) return bad_arg(c, kind, "size overflows", err);
    return gather(c, kind, send, recv, bytes, err);
}

static hp_status shm_reduce_scatter(hp_comm *base, const void *send, void *recv, int64_t count,
                                    hp_comm_dtype dt, hp_reduce_op op, hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_REDUCE_SCATTER, me = base->rank, world = base->world;
    HP_TRY(start(c, err));
    HP_TRY(check_reduce(c, kind, send, recv, count, dt, op, world, err));
    post(c, kind, (uint64_t)count, dt, op, 0);
    const size_t es = esize[dt], total = (size_t)count;
    const uint8_t *src = send;
    if (world == 1) {
        if (total && recv != send) memmove(recv, send, total * es);
        return HP_OK; /* sum, avg (/1) and max of one rank are the identity */
    }
    size_t m = c->half / ((size_t)world * es); /* elements per destination per step (>= 1) */
    size_t steps = total ? (total + m - 1) / m : 1;
    for (size_t s = 0; s < steps; s++) {
        size_t e0 = s * m, n = total - e0 < m ? total - e0 : m;
        uint8_t *mine = slot(c, me);
        for (int d = 0; d < world && n; d++) {
            memcpy(mine + (size_t)d * n * es, src + ((size_t)d * total + e0) * es, n * es);
        }
        HP_TRY(step_sync(c, kind, s, err));
        if (n) {
            for (int j = 0; j < world; j++) c->srcs[j] = slot(c, j) + (size_t)me * n * es;
            hp__comm_fold((uint8_t *)recv + e0 * es, c->srcs, world, n, dt, op);
        }
        c->step++;
    }
    return HP_OK;
}

static hp_status shm_all_reduce(hp_comm *base, const void *send, void *recv, int64_t count,
                                hp_comm_dtype dt, hp_reduce_op op, hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_ALL_REDUCE, me = base->rank, world = base->world;
    HP_TRY(start(c, err));
    HP_TRY(check_reduce(c, kind, send, recv, count, dt, op, 1, err));
    post(c, kind, (uint64_t)count, dt, op, 0);
    const size_t es = esize[dt], total = (size_t)count;
    const uint8_t *src = send;
    uint8_t *dst = recv;
    if (world == 1) {
        if (total && dst != src) memmove(dst, src, total * es);
        return HP_OK;
    }
    size_t w = c->half / es; /* window: elements per step */
    size_t steps = total ? (total + w - 1) / w : 1;
    for (size_t s = 0; s < steps; s++) {
        size_t e0 = s * w, n = total - e0 < w ? total - e0 : w;
        if (n) memcpy(slot(c, me), src + e0 * es, n * es);
        HP_TRY(step_sync(c, kind, s, err));
        if (n * es <= SMALL_WIN) {
            for (int j = 0; j < world; j++) c->srcs[j] = slot(c, j);
            if (n) hp__comm_fold(dst + e0 * es, c->srcs, world, n, dt, op);
        } else {
            /* Our share [lo, hi) of the window into the result area; the result area's previous
             * readers all arrived at this step's sync after reading it. */
            size_t lo = n * (size_t)me / (size_t)world, hi = n * (size_t)(me + 1) / (size_t)world;
            for (int j = 0; j < world; j++) c->srcs[j] = slot(c, j) + lo * es;
            hp__comm_fold(c->result + lo * es, c->srcs, world, hi - lo, dt, op);
            HP_TRY(hp__shm_sync(c, kind, err));
            HP_TRY(hp__shm_peer_check(c, kind, err));
            memcpy(dst + e0 * es, c->result, n * es);
        }
        c->step++;
    }
    return HP_OK;
}

static hp_status shm_broadcast(hp_comm *base, void *buf, size_t bytes, int root, hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_BROADCAST, me = base->rank, world = base->world;
    HP_TRY(start(c, err));
    if (root < 0 || root >= world) {
        return hp__shm_fail(c, err, HP_INVALID, "broadcast #%llu: root %d out of range [0, %d)",
                            (unsigned long long)c->seq, root, world);
    }
    if (bytes > 0 && !buf) return bad_arg(c, kind, "buf is NULL", err);
    post(c, kind, bytes, 0, 0, root);
    if (world == 1) return HP_OK;
    uint8_t *p = buf;
    size_t steps = bytes ? (bytes + c->half - 1) / c->half : 1;
    for (size_t s = 0; s < steps; s++) {
        size_t off = s * c->half, len = bytes - off < c->half ? bytes - off : c->half;
        if (me == root && len) memcpy(slot(c, root), p + off, len);
        HP_TRY(step_sync(c, kind, s, err));
        if (me != root && len) memcpy(p + off, slot(c, root), len);
        c->step++;
    }
    return HP_OK;
}

static hp_status shm_barrier(hp_comm *base, hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    HP_TRY(start(c, err));
    post(c, HP__SHM_BARRIER, 0, 0, 0, 0);
    if (base->world == 1) return HP_OK;
    return step_sync(c, HP__SHM_BARRIER, 0, err);
}

static hp_status shm_all_to_all(hp_comm *base, const void *send, void *recv, size_t bytes,
                                hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_ALL_TO_ALL, me = base->rank, world = base->world;
    HP_TRY(start(c, err));
    if (bytes > 0 && (!send || !recv)) {
        return bad_arg(c, kind, send ? "recv is NULL" : "send is NULL", err);
    }
    if (bytes > SIZE_MAX / (size_t)world) return bad_arg(c, kind, "size overflows", err);
    const size_t total = bytes * (size_t)world;
    const uintptr_t s0 = (uintptr_t)send, r0 = (uintptr_t)recv;
    if (total > 0 && s0 != r0 && s0 < r0 + total && r0 < s0 + total) {
        return bad_arg(c, kind, "send and recv overlap (only send == recv is allowed)", err);
    }
    post(c, kind, bytes, 0, 0, 0);
    const uint8_t *src = send;
    uint8_t *dst = recv;
    /* Our own chunk stays with us (a no-op in place). */
    if (bytes && dst != src) memcpy(dst + (size_t)me * bytes, src + (size_t)me * bytes, bytes);
    if (world == 1) return HP_OK;
    size_t m = c->half / (size_t)world; /* bytes per destination per step (>= 8) */
    if (m >= 64) m -= m % 64;
    size_t steps = bytes ? (bytes + m - 1) / m : 1;
    for (size_t s = 0; s < steps; s++) {
        size_t off = s * m, len = bytes - off < m ? bytes - off : m;
        /* Piece d of our slot: our chunk for rank d. In place this reads send[d][off, off+len)
         * before the loop below overwrites it, and later steps only touch later offsets. */
        uint8_t *mine = slot(c, me);
        for (int d = 0; d < world && len; d++) {
            if (d != me) memcpy(mine + (size_t)d * len, src + (size_t)d * bytes + off, len);
        }
        HP_TRY(step_sync(c, kind, s, err));
        for (int k = 1; k < world && len; k++) {
            int j = (me + k) % world;
            memcpy(dst + (size_t)j * bytes + off, slot(c, j) + (size_t)me * len, len);
        }
        c->step++;
    }
    return HP_OK;
}

/* ---- split ----------------------------------------------------------------------------------- */

/* What each rank tells the others in split's exchange. */
typedef struct split_entry {
    int32_t color, key;
} split_entry;

/* The group's segment name: "<parent>.s<k>c<color>" for the parent's k-th split (unique per
 * parent and call, the same on every member); nested splits append again, and a name that
 * would pass HP__SHM_GROUP_NAME_MAX keeps its first 100 characters and a hash of the rest. */
static void group_name(char *out, size_t cap, const char *parent, uint64_t k, int color) {
    char full[HP__SHM_GROUP_NAME_MAX + 64];
    snprintf(full, sizeof full,
             "%s.s%llu"
             "c%d",
             parent, (unsigned long long)k, color);
    if (strlen(full) <= HP__SHM_GROUP_NAME_MAX) {
        snprintf(out, cap, "%s", full);
        return;
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = full; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    snprintf(out, cap, "%.100s.h%016llx", full, (unsigned long long)h);
}

static hp_status shm_split(hp_comm *base, int color, int key, hp_comm **out, hp_err *err) {
    hp__shm_comm *c = (hp__shm_comm *)base;
    const int kind = HP__SHM_SPLIT, me = base->rank, world = base->world;
    if (out) *out = NULL;
    HP_TRY(start(c, err));
    if (!out) return bad_arg(c, kind, "out is NULL", err);
    split_entry mine = {color < 0 ? -1 : color, key};
    split_entry *all = hp_calloc((size_t)world, sizeof *all);
    int32_t *pids = hp_calloc((size_t)world, sizeof *pids);
    if (!all || !pids) {
        hp_free(all);
        hp_free(pids);
        return hp__shm_fail(c, err, HP_NOMEM, "split #%llu: out of memory for %d ranks",
                            (unsigned long long)c->seq, world);
    }
    hp_status st = gather(c, kind, &mine, all, sizeof mine, err);
    c->splits++;
    if (st != HP_OK || mine.color < 0) goto done;
    /* Members in (key, parent rank) order: an insertion into a sorted list of parent ranks. */
    int n = 0, my_rank = -1;
    for (int j = 0; j < world; j++) {
        if (all[j].color != mine.color) continue;
        int at = n++;
        while (at > 0) {
            const split_entry *prev = &all[pids[at - 1]];
            if (prev->key < all[j].key || (prev->key == all[j].key && pids[at - 1] < j)) break;
            pids[at] = pids[at - 1];
            at--;
        }
        pids[at] = j;
    }
    for (int i = 0; i < n; i++) {
        if (pids[i] == me) my_rank = i;
        pids[i] = atomic_load_explicit(&c->ranks[pids[i]].pid, memory_order_relaxed);
    }
    char name[HP__SHM_GROUP_NAME_MAX + 1];
    group_name(name, sizeof name, c->name, c->splits, mine.color);
    /* A failed join leaves the parent usable: the exchange completed on every rank. */
    st = hp__shm_group_new(name, my_rank, n, c->timeout_s, c->slot_bytes, pids, out, err);
done:
    hp_free(all);
    hp_free(pids);
    return st;
}

const hp_comm_vtable hp__shm_vtable = {
    .name = "shm",
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .all_to_all = shm_all_to_all,
    .split = shm_split,
    .destroy = hp__shm_destroy,
};
