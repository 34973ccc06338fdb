"""Selection along a dim by data (a mixture of experts' top-k router, top-k accuracy, a sort of
scores) as hp's ops (graph/ops.def), composed of one round per entry selected: hp has no sort
kernel, and these dims are short (experts, classes of a metric). hp_export looks an op up here
first; the single-index cases go on to aten_map / aten_more's decompositions.

  topk(x, k, dim, largest)            k rounds of: m = amax(rest); the first position of the rest
                                      holding m (counted in f32: dims < 2^24); the value there
                                      picked by where(position == it, x, 0) summed over dim (so
                                      the gradient goes to that entry alone, as torch's); the
                                      entry taken out of the rest. Sorted; ties by position,
                                      smaller first, also for largest=False; NaN ranks highest
  sort(x, dim, descending, stable)    topk of every entry (stable: ties by position)
  argsort(x, dim, descending)         its indices
  gather(x, dim, idx)                 with several indices along dim: one round per index,
                                      sum(where(position == idx_j, x, 0)) over dim, concatenated
  scatter(x, dim, idx, src | value)   with several indices along dim: where(position == idx_j,
                                      src_j, ·) in turn (a repeated index: the last one wins)
  scatter_add(x, dim, idx, src)       x + Σ_j where(position == idx_j, src_j, 0) (sort and topk's
                                      backward in a torch-traced graph)

At most MAX_ROUNDS entries along the dim: beyond that the graph would grow by one round per
entry, and the op is refused naming the count.
"""
import torch

from . import aten_map, aten_more
from .aten_extra import _float
from .aten_map import Unsupported, _as, _t
from .aten_more import _n, _positions

aten = torch.ops.aten

MAX_ROUNDS = 64


def _dim(x, d):
    return d % max(len(x.shape), 1)


def _rounds(k, what):
    if k > MAX_ROUNDS:
        raise Unsupported("%s of %d entries along a dim (hp composes it of one round per entry, "
                          "%d at most)" % (what, k, MAX_ROUNDS))


def _reduced(shape, dim):
    return tuple(1 if i == dim else s for i, s in enumerate(shape))


def _pick(cx, x, hit, dim):
    """The entry of x where hit (one per line along dim), keeping dim: sum(where(hit, x, 0))."""
    z = _n(cx, "where", [hit, x, cx.full(0.0, x.dtype)], (x.dtype, x.shape))
    return _n(cx, "sum", [z], (x.dtype, _reduced(x.shape, dim)), {"dims": [dim], "keepdim": 1})


def _ranked(cx, x, k, dim, largest, what):
    """x's k largest (smallest) entries along dim, in order: [values, indices (i64)], each of x's
    shape with k along dim."""
    _float(x, what)
    n = x.shape[dim]
    if k < 0 or k > n:
        raise Unsupported("%s of %d entries from a dim of %d" % (what, k, n))
    _rounds(k, what)
    kshape = _reduced(x.shape, dim)
    pos = _positions(cx, x.shape, dim, "f32")
    past = cx.full(float(n), "f32")
    # NaN ranks above everything, as torch's: +inf in the key (its value is still x's NaN)
    key = _n(cx, "where", [_n(cx, "eq", [x, x], ("bool", x.shape)), x,
                           cx.full(float("inf"), x.dtype)], (x.dtype, x.shape))
    rest = key if largest else _n(cx, "neg", [key], (x.dtype, x.shape))
    taken = None
    values, firsts = [], []
    for _ in range(k):
        m = _n(cx, "amax", [rest], (x.dtype, kshape), {"dims": [dim], "keepdim": 1})
        at = _n(cx, "where", [_n(cx, "eq", [rest, m], ("bool", x.shape)), pos, past],
                ("f32", x.shape))
        if taken is not None:  # an entry taken already ties with the rest at -inf
            at = _n(cx, "where", [taken, past, at], ("f32", x.shape))
        first = _n(cx, "neg", [_n(cx, "amax", [_n(cx, "neg", [at], ("f32", x.shape))],
                                  ("f32", kshape), {"dims": [dim], "keepdim": 1})],
                   ("f32", kshape))
        hit = _n(cx, "eq", [pos, first], ("bool", x.shape))
        values.append(_pick(cx, x, hit, dim))
        firsts.append(first)
        taken = hit if taken is None else _n(cx, "where", [taken, cx.full(True, "bool"), hit],
                                             ("bool", x.shape))
        rest = _n(cx, "where", [hit, cx.full(float("-inf"), x.dtype), rest], (x.dtype, x.shape))
    oshape = tuple(k if i == dim else s for i, s in enumerate(x.shape))
    if k == 0:
        return [_n(cx, "zeros", [], (x.dtype, oshape), {"shape": list(oshape), "dtype": x.dtype}),
                _n(cx, "zeros", [], ("i64", oshape), {"shape": list(oshape), "dtype": "i64"})]
    v = values[0] if k == 1 else _n(cx, "cat", values, (x.dtype, oshape), {"dim": dim})
    i = firsts[0] if k == 1 else _n(cx, "cat", firsts, ("f32", oshape), {"dim": dim})
    return [v, _as(cx, i, "i64")]


def _topk(cx, node, args, kw):
    x = cx.v(args[0])
    k = args[1]
    dim = _dim(x, args[2] if len(args) > 2 else kw.get("dim", -1))
    largest = args[3] if len(args) > 3 else kw.get("largest", True)
    return _ranked(cx, x, k, dim, largest, "topk")


def _sort_args(node, args, kw, stable):
    """(dim, descending) of sort/argsort's .default(x, dim, descending) or .stable(x, *,
    stable, dim, descending) overload."""
    if node.target == stable:
        return kw.get("dim", -1), kw.get("descending", False)
    return (args[1] if len(args) > 1 else kw.get("dim", -1),
            args[2] if len(args) > 2 else kw.get("descending", False))


def _sort(cx, node, args, kw):
    """sort: ties by position either way, so stable or not gives the same."""
    x = cx.v(args[0])
    dim, desc = _sort_args(node, args, kw, aten.sort.stable)
    if not x.shape:
        return [x, _n(cx, "zeros", [], ("i64", ()), {"shape": [], "dtype": "i64"})]
    dim = _dim(x, dim)
    return _ranked(cx, x, x.shape[dim], dim, desc, "sort")


def _argsort(cx, node, args, kw):
    x = cx.v(args[0])
    dim, desc = _sort_args(node, args, kw, aten.argsort.stable)
    dim = _dim(x, dim)
    return _ranked(cx, x, x.shape[dim], dim, desc, "argsort")[1]


def _index_rounds(cx, x, dim, idx, what, other_dims_equal):
    """The positions along dim of x's shape, and idx's entries along dim one by one (each of
    idx's shape with 1 along dim), after checking the shapes."""
    if len(idx.shape) != len(x.shape):
        raise Unsupported("%s with a %d-d index into a %d-d tensor" % (what, len(idx.shape),
                                                                         len(x.shape)))
    for d, (a, b) in enumerate(zip(idx.shape, x.shape)):
        if d != dim and (a != b if other_dims_equal else a > b):
            raise Unsupported("%s with index %s into %s (hp takes the tensor's size in every dim "
                              "but %d)" % (what, list(idx.shape), list(x.shape), dim))
    k = idx.shape[dim]
    _rounds(k, what)
    one = _reduced(idx.shape, dim)
    parts = [idx if k == 1 else
             _n(cx, "slice", [idx], (idx.dtype, one), {"dim": dim, "start": j, "end": j + 1})
             for j in range(k)]
    return _positions(cx, x.shape, dim, idx.dtype), parts


def _gather(cx, node, args, kw):
    x, idx = cx.v(args[0]), cx.v(args[2])
    dim = _dim(x, args[1])
    if len(x.shape) and len(idx.shape) == len(x.shape) and idx.shape[dim] == 1 and \
            dim == len(x.shape) - 1 and tuple(idx.shape[:-1]) == tuple(x.shape[:-1]):
        return aten_map._gather(cx, node, args, kw)  # one per row: nll_loss's pick
    pos, parts = _index_rounds(cx, x, dim, idx, "gather", False)
    t = _t(cx, node)
    if tuple(idx.shape) != tuple(x.shape):  # the other dims as far as the index reaches
        for d, s in enumerate(idx.shape):
            if d != dim and s != x.shape[d]:
                shape = tuple(s if i == d else n for i, n in enumerate(x.shape))
                x = _n(cx, "slice", [x], (x.dtype, shape), {"dim": d, "start": 0, "end": s})
    if not parts:  # an empty index: an empty result
        return _n(cx, "zeros", [], t, {"shape": list(t[1]), "dtype": t[0]})
    vals = [_pick(cx, x, _n(cx, "eq", [pos, p], ("bool", x.shape)), dim) for p in parts]
    return vals[0] if len(vals) == 1 else _n(cx, "cat", vals, t, {"dim": dim})


def _src_parts(cx, src, idx, dim, dtype, what):
    """src's entries at idx's positions, one per round (a scalar value: the same each round)."""
    k = idx.shape[dim]
    if not aten_map._is_node(src):
        return [cx.full(src, dtype)] * k
    s = _as(cx, cx.v(src), dtype)
    if len(s.shape) != len(idx.shape) or any(a < b for a, b in zip(s.shape, idx.shape)):
        raise Unsupported("%s of a src of shape %s by an index of shape %s"
                          % (what, list(s.shape), list(idx.shape)))
    for d, want in enumerate(idx.shape):  # src as far as the index reaches
        if s.shape[d] != want:
            shape = tuple(want if i == d else n for i, n in enumerate(s.shape))
            s = _n(cx, "slice", [s], (dtype, shape), {"dim": d, "start": 0, "end": want})
    one = _reduced(s.shape, dim)
    return [s if k == 1 else _n(cx, "slice", [s], (dtype, one), {"dim": dim, "start": j,
                                                                   "end": j + 1})
            for j in range(k)]


def _scatter(cx, node, args, kw):
    x, idx = cx.v(args[0]), cx.v(args[2])
    dim = _dim(x, args[1])
    if kw.get("reduce") is not None or len(args) > 4:
        raise Unsupported("scatter with reduce")
    if len(idx.shape) == len(x.shape) and idx.shape[dim] == 1:
        return aten_more._scatter(cx, node, args, kw)
    t = _t(cx, node)
    pos, parts = _index_rounds(cx, x, dim, idx, "scatter", True)
    src = args[3] if len(args) > 3 else kw.get("src", kw.get("value"))
    out = x
    for p, s in zip(parts, _src_parts(cx, src, idx, dim, t[0], "scatter")):
        out = _n(cx, "where", [_n(cx, "eq", [pos, p], ("bool", x.shape)), s, out], t)
    return out


def _scatter_add(cx, node, args, kw):
    base, idx = cx.v(args[0]), cx.v(args[2])
    dim = _dim(base, args[1])
    if len(idx.shape) == len(base.shape) and idx.shape[dim] == 1 and \
            dim == len(base.shape) - 1 and tuple(idx.shape[:-1]) == tuple(base.shape[:-1]):
        return aten_map._scatter_add(cx, node, args, kw)
    t = _t(cx, node)
    pos, parts = _index_rounds(cx, base, dim, idx, "scatter_add", True)
    zero = cx.full(0.0, t[0])
    out = base
    for p, s in zip(parts, _src_parts(cx, args[3], idx, dim, t[0], "scatter_add")):
        put = _n(cx, "where", [_n(cx, "eq", [pos, p], ("bool", base.shape)), s, zero], t)
        out = _n(cx, "add", [out, put], t)
    return out


TABLE = {
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort,
    aten.argsort.default: _argsort,
    aten.argsort.stable: _argsort,
    aten.gather.default: _gather,
    aten.scatter.src: _scatter,
    aten.scatter.value: _scatter,
    aten.scatter_.src: aten_map._inplace(_scatter),
    aten.scatter_.value: aten_map._inplace(_scatter),
    aten.scatter_add.default: _scatter_add,
}
