/* worker/comm/tcp_coll.c — the tcp communicator's collectives, split and reduction kernels.
 *
 * Each collective is one or two runs of the progress engine (tcp.c): a run sends at most one
 * frame to every peer and receives at most one from each, all at once, straight from and into
 * the caller's buffers where the layout allows.
 *
 *   all_gather      our buffer to every peer; peer j's frame lands in recv chunk j.
 *   reduce_scatter  send chunk j goes to rank j; we receive every rank's piece of our chunk
 *                   into a staging slot per rank and fold them in rank order into recv.
 *   all_reduce      a reduce_scatter over world (uneven) chunks of the buffer, then an
 *                   all_gather of the reduced chunks straight into recv (two runs).
 *   broadcast       the root sends to every rank; the others receive into buf.
 *   barrier         an empty frame to and from every peer.
 *   all_to_all      send chunk j goes to rank j, rank j's frame lands in recv chunk j; in
 *                   place, frames land in staging first (send chunk j is still being sent).
 *   split           an all_gather of (color, key, port of a fresh listener), posted as split;
 *                   each member sorts its color by (key, rank) and builds the group's own mesh
 *                   (new connections: a group is used from its own thread, and shares nothing
 *                   with this communicator afterwards).
 *
 * Reductions fold ranks in rank order, ((x0 + x1) + x2) ..., element by element, with the same
 * kernels as shm_coll.c (same operations in the same order: bitwise the same results);
 * HP_REDUCE_AVG divides that sum by world (i64: C division), i64 sums wrap, HP_REDUCE_MAX
 * propagates NaN.
 */
#include "worker/comm/tcp_internal.h"
#include "worker/comm/fold.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const size_t esize[] = {4, 8, 8};

/* ---- shared checks --------------------------------------------------------------------------- */

static hp_status start(hp__tcp_comm *c, int kind, hp__tcp_desc *d, hp_err *err) {
    if (c->broken) {
        return hp_errf(err, HP_IO,
                       "tcp rank %d/%d: %s: communicator broken by an earlier error: %s",
                       c->base.rank, c->base.world, hp__tcp_kind_name(kind), c->broken_msg);
    }
    *d = (hp__tcp_desc){.kind = (uint32_t)kind, .seq = ++c->seq};
    hp__tcp_run_reset(c);
    return HP_OK;
}

static hp_status bad_arg(hp__tcp_comm *c, int kind, const char *what, hp_err *err) {
    return hp__tcp_fail(c, err, HP_INVALID, "%s #%llu: %s", hp__tcp_kind_name(kind),
                        (unsigned long long)c->seq, what);
}

static hp_status check_reduce(hp__tcp_comm *c, int kind, const void *send, void *recv,
                              int64_t count, hp_comm_dtype dt, hp_reduce_op op, int64_t mult,
                              hp_err *err) {
    const char *k = hp__tcp_kind_name(kind);
    const unsigned long long seq = (unsigned long long)c->seq;
    if ((int)dt < 0 || (int)dt > 2)
        return hp__tcp_fail(c, err, HP_INVALID, "%s #%llu: bad dtype %d", k, seq, (int)dt);
    if ((int)op < 0 || (int)op > 2)
        return hp__tcp_fail(c, err, HP_INVALID, "%s #%llu: bad reduce op %d", k, seq, (int)op);
    if (count < 0 || (uint64_t)count > SIZE_MAX / esize[dt] / (uint64_t)mult)
        return hp__tcp_fail(c, err, HP_INVALID, "%s #%llu: bad count %lld", k, seq,
                            (long long)count);
    if (count > 0 && !send) return bad_arg(c, kind, "send is NULL", err);
    if (count > 0 && !recv) return bad_arg(c, kind, "recv is NULL", err);
    return HP_OK;
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

static void set_send(hp__tcp_comm *c, int j, const void *p, uint64_t len) {
    c->xfers[j].sending = 1;
    c->xfers[j].send = p;
    c->xfers[j].send_len = len;
}

static void set_recv(hp__tcp_comm *c, int j, void *p, uint64_t len) {
    c->xfers[j].receiving = 1;
    c->xfers[j].recv = p;
    c->xfers[j].recv_len = len;
}

/* ---- the collectives ------------------------------------------------------------------------- */

/* all_gather's data movement under descriptor d (all_gather, or split's exchange). */
static hp_status gather(hp__tcp_comm *c, hp__tcp_desc *d, const void *send, void *recv,
                        size_t bytes, hp_err *err) {
    const int me = c->base.rank, world = c->base.world;
    d->size = bytes;
    uint8_t *dst = recv;
    if (bytes && dst + (size_t)me * bytes != send) memmove(dst + (size_t)me * bytes, send, bytes);
    for (int j = 0; j < world; j++) {
        if (j == me) continue;
        set_send(c, j, send, bytes);
        set_recv(c, j, dst + (size_t)j * bytes, bytes);
    }
    return hp__tcp_run(c, d, 0, err);
}

static hp_status tcp_all_gather(hp_comm *base, const void *send, void *recv, size_t bytes,
                                hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_ALL_GATHER;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    if (bytes > 0 && (!send || !recv))
        return bad_arg(c, kind, send ? "recv is NULL" : "send is NULL", err);
    if (bytes > SIZE_MAX / (size_t)base->world) return bad_arg(c, kind, "size overflows", err);
    return gather(c, &d, send, recv, bytes, err);
}

/* Receives every peer's piece of our chunk (n elements; peer j sends it from its own buffer)
 * and folds them with our own piece `own` into dst, in rank order. */
static hp_status reduce_chunk(hp__tcp_comm *c, hp__tcp_desc *d, const void *own, void *dst,
                              size_t n, hp_comm_dtype dt, hp_reduce_op op, hp_err *err) {
    const int me = c->base.rank, world = c->base.world;
    const size_t bytes = n * esize[dt];
    HP_TRY(hp__tcp_stage(c, (size_t)world * bytes + (size_t)world * sizeof(void *),
                         hp__tcp_kind_name((int)d->kind), err));
    const void **srcs = c->stage;
    uint8_t *slots = (uint8_t *)c->stage + (size_t)world * sizeof(void *);
    for (int j = 0; j < world; j++) {
        srcs[j] = slots + (size_t)j * bytes;
        if (j != me) set_recv(c, j, slots + (size_t)j * bytes, bytes);
    }
    HP_TRY(hp__tcp_run(c, d, 0, err));
    /* Our own piece is read in place unless dst overlaps it (in-place calls). */
    if (overlaps(own, bytes, dst, bytes)) {
        memcpy(slots + (size_t)me * bytes, own, bytes);
    } else {
        srcs[me] = own;
    }
    if (n) hp__comm_fold(dst, (const void *const *)srcs, world, n, dt, op);
    return HP_OK;
}

static hp_status tcp_reduce_scatter(hp_comm *base, const void *send, void *recv, int64_t count,
                                    hp_comm_dtype dt, hp_reduce_op op, hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_REDUCE_SCATTER, me = base->rank, world = base->world;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    HP_TRY(check_reduce(c, kind, send, recv, count, dt, op, world, err));
    d.size = (uint64_t)count, d.dtype = dt, d.op = op;
    const size_t chunk = (size_t)count * esize[dt];
    const uint8_t *src = send;
    for (int j = 0; j < world; j++)
        if (j != me) set_send(c, j, src + (size_t)j * chunk, chunk);
    return reduce_chunk(c, &d, src + (size_t)me * chunk, recv, (size_t)count, dt, op, err);
}

static hp_status tcp_all_reduce(hp_comm *base, const void *send, void *recv, int64_t count,
                                hp_comm_dtype dt, hp_reduce_op op, hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_ALL_REDUCE, me = base->rank, world = base->world;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    HP_TRY(check_reduce(c, kind, send, recv, count, dt, op, 1, err));
    d.size = (uint64_t)count, d.dtype = dt, d.op = op;
    const size_t es = esize[dt], n = (size_t)count;
    const uint8_t *src = send;
    uint8_t *dst = recv;
#define LO(j) (n * (size_t)(j) / (size_t)world)
    for (int j = 0; j < world; j++)
        if (j != me) set_send(c, j, src + LO(j) * es, (LO(j + 1) - LO(j)) * es);
    const size_t lo = LO(me), my_n = LO(me + 1) - lo;
    /* dst overlaps our own piece only in place; any other of send's chunks was sent by then. */
    HP_TRY(reduce_chunk(c, &d, src + lo * es, dst + lo * es, my_n, dt, op, err));
    hp__tcp_run_reset(c);
    for (int j = 0; j < world; j++) {
        if (j == me) continue;
        set_send(c, j, dst + lo * es, my_n * es);
        set_recv(c, j, dst + LO(j) * es, (LO(j + 1) - LO(j)) * es);
    }
#undef LO
    return hp__tcp_run(c, &d, 1, err);
}

static hp_status tcp_broadcast(hp_comm *base, void *buf, size_t bytes, int root, hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_BROADCAST, me = base->rank, world = base->world;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    if (root < 0 || root >= world) {
        return hp__tcp_fail(c, err, HP_INVALID, "broadcast #%llu: root %d out of range [0, %d)",
                            (unsigned long long)c->seq, root, world);
    }
    if (bytes > 0 && !buf) return bad_arg(c, kind, "buf is NULL", err);
    d.size = bytes, d.root = root;
    if (me == root) {
        for (int j = 0; j < world; j++)
            if (j != me) set_send(c, j, buf, bytes);
    } else {
        set_recv(c, root, buf, bytes);
    }
    return hp__tcp_run(c, &d, 0, err);
}

static hp_status tcp_barrier(hp_comm *base, hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    hp__tcp_desc d;
    HP_TRY(start(c, HP__TCP_BARRIER, &d, err));
    for (int j = 0; j < base->world; j++) {
        if (j == base->rank) continue;
        set_send(c, j, NULL, 0);
        set_recv(c, j, NULL, 0);
    }
    return hp__tcp_run(c, &d, 0, err);
}

static hp_status tcp_all_to_all(hp_comm *base, const void *send, void *recv, size_t bytes,
                                hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_ALL_TO_ALL, me = base->rank, world = base->world;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    if (bytes > 0 && (!send || !recv))
        return bad_arg(c, kind, send ? "recv is NULL" : "send is NULL", err);
    if (bytes > SIZE_MAX / (size_t)world) return bad_arg(c, kind, "size overflows", err);
    const size_t total = bytes * (size_t)world;
    if (send != recv && overlaps(send, total, recv, total))
        return bad_arg(c, kind, "send and recv overlap (only send == recv is allowed)", err);
    d.size = bytes;
    const uint8_t *src = send;
    uint8_t *dst = recv;
    const int in_place = send == recv && bytes > 0;
    if (in_place) HP_TRY(hp__tcp_stage(c, total, "all_to_all", err));
    uint8_t *land = in_place ? c->stage : dst;
    if (bytes && !in_place) memcpy(dst + (size_t)me * bytes, src + (size_t)me * bytes, bytes);
    for (int j = 0; j < world; j++) {
        if (j == me) continue;
        set_send(c, j, src + (size_t)j * bytes, bytes);
        set_recv(c, j, land + (size_t)j * bytes, bytes);
    }
    HP_TRY(hp__tcp_run(c, &d, 0, err));
    for (int j = 0; j < world && in_place; j++)
        if (j != me) memcpy(dst + (size_t)j * bytes, land + (size_t)j * bytes, bytes);
    return HP_OK;
}

/* ---- split ----------------------------------------------------------------------------------- */

/* What each rank tells the others in split's exchange (little-endian on the wire: hp's hosts
 * are all little-endian, and the exchange is checked by size like any frame). */
typedef struct split_entry {
    int32_t color, key;
    uint32_t port;
} split_entry;

static uint64_t group_id(uint64_t parent, uint64_t k, int color) {
    uint64_t v[3] = {parent, k, (uint64_t)(uint32_t)color}, h = 0xcbf29ce484222325ull;
    const uint8_t *p = (const uint8_t *)v;
    for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static hp_status tcp_split(hp_comm *base, int color, int key, hp_comm **out, hp_err *err) {
    hp__tcp_comm *c = (hp__tcp_comm *)base;
    const int kind = HP__TCP_SPLIT, me = base->rank, world = base->world;
    if (out) *out = NULL;
    hp__tcp_desc d;
    HP_TRY(start(c, kind, &d, err));
    if (!out) return bad_arg(c, kind, "out is NULL", err);
    split_entry mine = {color < 0 ? -1 : color, key, 0};
    int lfd = -1;
    hp_err listen_err = {0};
    hp_status listen_st = HP_OK;
    if (mine.color >= 0) {
        uint16_t port = 0;
        listen_st = hp__tcp_listen_on(c->hosts[me], 0, &lfd, &port, &listen_err);
        mine.port = port; /* 0 when it failed: the members' connects fail, naming us */
    }
    split_entry *all = hp_calloc((size_t)world, sizeof *all);
    int *members = hp_calloc((size_t)world, sizeof *members);
    uint16_t *ports = hp_calloc((size_t)world, sizeof *ports);
    if (!all || !members || !ports) {
        hp_free(all), hp_free(members), hp_free(ports);
        if (lfd >= 0) close(lfd);
        return hp__tcp_fail(c, err, HP_NOMEM, "split #%llu: out of memory for %d ranks",
                            (unsigned long long)c->seq, world);
    }
    hp_status st = gather(c, &d, &mine, all, sizeof mine, err);
    c->splits++;
    if (st == HP_OK && listen_st != HP_OK) {
        /* The exchange completed: the parent stays usable, only the group fails. */
        st = hp_errf(err, listen_st, "tcp rank %d/%d: split #%llu: %s", me, world,
                     (unsigned long long)d.seq, listen_err.msg);
    }
    if (st != HP_OK || mine.color < 0) {
        if (lfd >= 0) close(lfd);
        goto done;
    }
    /* Members in (key, parent rank) order: an insertion into a sorted list of parent ranks. */
    int n = 0, my_rank = -1;
    for (int j = 0; j < world; j++) {
        if (all[j].color != mine.color) continue;
        int at = n++;
        while (at > 0) {
            const split_entry *prev = &all[members[at - 1]];
            if (prev->key < all[j].key || (prev->key == all[j].key && members[at - 1] < j)) break;
            members[at] = members[at - 1];
            at--;
        }
        members[at] = j;
    }
    for (int i = 0; i < n; i++) {
        if (members[i] == me) my_rank = i;
        ports[i] = (uint16_t)all[members[i]].port;
    }
    st = hp__tcp_group_new(c, my_rank, n, members, ports, lfd,
                           group_id(c->comm_id, c->splits, mine.color), out, err);
done:
    hp_free(all);
    hp_free(members);
    hp_free(ports);
    return st;
}

const hp_comm_vtable hp__tcp_vtable = {
    .name = "tcp",
    .all_gather = tcp_all_gather,
    .reduce_scatter = tcp_reduce_scatter,
    .all_reduce = tcp_all_reduce,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .all_to_all = tcp_all_to_all,
    .split = tcp_split,
    .destroy = hp__tcp_destroy,
};
