"""Decompositions of less common ATen ops into hp's (graph/ops.def), beside aten_map.py's table
(which holds the common ones and the helpers these use). hp_export looks an op up in both.

  amin(x, dims, keepdim)              −amax(−x)
  log1p(x)                            where(u == 1, x, log(u) · x / (u − 1)), u = 1 + x
                                      (Goldberg's formula: as exact as log near 0, where
                                      log(1 + x) is not)
  expm1(x)                            its Taylor polynomial to x⁷ where |x| < 0.1, else
                                      exp(x) − 1
  log_sigmoid_forward (+ backward)    min(x, 0) − log1p(exp(−|x|)); grad · sigmoid(−x)
  hardsigmoid, hardswish (+ backward) clamp(x + 3, 0, 6) / 6 and x times it; their slopes
                                      (1/6 inside (−3, 3); x/3 + 1/2 on [−3, 3] for hardswish)
  cumsum(x, dim)                      a product with the upper-triangular ones over that dim
                                      (float x; sums in another order than torch's, to rounding)
  flip(x, dims)                       a product with the anti-identity per dim (float x; each
                                      output one input times 1 plus zeros: exact for finite x)
  index_select(x, dim, idx)           embedding of x with dim moved first and the rest flattened
  index_add(zeros, dim, idx, src)     embedding_dense_backward (index_select's backward), added
                                      to self when self is not new zeros
  repeat(x, reps)                     x viewed with a unit dim before each, expanded, reshaped
  index.Tensor(x, [..., idx])         x[:, idx]: one integer index after full slices, an
                                      embedding of x with that dim moved first
  index_put(x, [..., idx], v, True)   its backward: embedding_dense_backward (aten_map's
                                      index_put hands this form over)
  empty                               zeros (never read before written: fill_ follows)
  select_backward(g, sizes, dim, i)   x[:, 0]'s backward (a [CLS] or last-token pooling):
                                      g viewed with a unit dim at dim, then slice_backward
                                      into zeros of sizes at i
  repeat_interleave(repeats)          the index arange(n) with each entry r times, for one
                                      repeat count r made from constants (x.repeat_interleave(r,
                                      dim) records it before an index_select); then
  index_select(x, dim, that index)    x viewed with a unit dim after dim, expanded r times and
                                      reshaped (repeat_kv's form: no gather), and
  index_add(zeros, dim, that, g)      g viewed [..., n, r, ...] and summed over r
  native_group_norm (+ backward)      native_layer_norm over x viewed [N, G, C/G·HxW] without
                                      affine, then the per-channel weight and bias; backward:
                                      native_layer_norm_backward of dy·w, dw = Σ dy·x̂,
                                      db = Σ dy over the batch and spatial dims
"""
import torch
import torch.fx

from .aten_map import Unsupported, _FINITE_MAX, _as, _lt, _t

aten = torch.ops.aten


def _float(x, what):
    if x.dtype not in _FINITE_MAX:
        raise Unsupported("%s of a %s tensor (hp decomposes it for floats)" % (what, x.dtype))


def _amin(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _float(x, "amin")
    dims = list(args[1]) if len(args) > 1 and args[1] is not None else []
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    a = {"dims": dims}
    if keep:
        a["keepdim"] = 1
    nx = cx.g.node("neg", [x], [(x.dtype, x.shape)])
    return cx.g.node("neg", [cx.g.node("amax", [nx], [t], a)], [t])


def _log1p_of(cx, x):
    t = (x.dtype, x.shape)
    u = cx.g.node("add_scalar", [x], [t], {"value": 1.0})
    one = cx.g.node("eq", [u, cx.full(1.0, x.dtype)], [("bool", x.shape)])
    um1 = cx.g.node("add_scalar", [u], [t], {"value": -1.0})
    # where u == 1 the quotient's 0/0 is not taken, but computed: divide by 1 there instead
    den = cx.g.node("where", [one, cx.full(1.0, x.dtype), um1], [t])
    q = cx.g.node("div", [cx.g.node("mul", [cx.g.node("log", [u], [t]), x], [t]), den], [t])
    return cx.g.node("where", [one, x, q], [t])


def _log1p(cx, node, args, kw):
    x = cx.v(args[0])
    _float(x, "log1p")
    return _log1p_of(cx, x)


def _expm1(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _float(x, "expm1")
    # x (1 + x/2 (1 + x/3 (1 + ... (1 + x/7)))): truncation below 1e-9 of x for |x| < 0.1
    p = cx.full(1.0, x.dtype)
    for k in range(7, 1, -1):
        p = cx.g.node("add_scalar", [cx.g.node("mul", [cx.g.node("mul_scalar", [x], [t],
                                                                 {"value": 1.0 / k}), p], [t])],
                      [t], {"value": 1.0})
    small = cx.g.node("mul", [x, p], [t])
    big = cx.g.node("add_scalar", [cx.g.node("exp", [x], [t])], [t], {"value": -1.0})
    ax = cx.g.node("where", [_lt(cx, x, cx.full(0.0, x.dtype)), cx.g.node("neg", [x], [t]), x],
                   [t])
    return cx.g.node("where", [_lt(cx, ax, cx.full(0.1, x.dtype)), small, big], [t])


def _log_sigmoid_forward(cx, node, args, kw):
    """(min(x, 0) − log1p(exp(−|x|)), buffer): the buffer (empty on the CPU) is zeros."""
    x = cx.v(args[0])
    _float(x, "log_sigmoid")
    t = (x.dtype, x.shape)
    neg = _lt(cx, x, cx.full(0.0, x.dtype))
    mn = cx.g.node("where", [neg, x, cx.full(0.0, x.dtype)], [t])
    nabs = cx.g.node("where", [neg, x, cx.g.node("neg", [x], [t])], [t])  # −|x|
    out = cx.g.node("sub", [mn, _log1p_of(cx, cx.g.node("exp", [nabs], [t]))], [t])
    types = cx.types_of(node)
    if len(types) != 2 or types[1] is None:
        raise Unsupported("log_sigmoid_forward without its buffer")
    bt = types[1]
    buf = cx.g.node("zeros", [], [bt], {"shape": list(bt[1]), "dtype": bt[0]})
    return [out, buf]


def _log_sigmoid_backward(cx, node, args, kw):
    g, x, t = cx.v(args[0]), cx.v(args[1]), _t(cx, node)
    s = cx.g.node("sigmoid", [cx.g.node("neg", [x], [(x.dtype, x.shape)])], [(x.dtype, x.shape)])
    return cx.g.node("mul", [g, s], [t])


def _hardsigmoid_of(cx, x):
    t = (x.dtype, x.shape)
    y = cx.g.node("add_scalar", [x], [t], {"value": 3.0})
    zero, six = cx.full(0.0, x.dtype), cx.full(6.0, x.dtype)
    y = cx.g.node("where", [_lt(cx, y, zero), zero, y], [t])
    y = cx.g.node("where", [_lt(cx, six, y), six, y], [t])
    return cx.g.node("mul_scalar", [y], [t], {"value": 1.0 / 6.0})


def _hardsigmoid(cx, node, args, kw):
    x = cx.v(args[0])
    _float(x, "hardsigmoid")
    return _hardsigmoid_of(cx, x)


def _inside(cx, x, lo, hi, closed):
    """lo < x < hi (closed: lo <= x <= hi) as bools."""
    t = ("bool", x.shape)
    lo_v, hi_v = cx.full(lo, x.dtype), cx.full(hi, x.dtype)
    if closed:  # not (x < lo) and not (hi < x)
        a = cx.g.node("bitwise_not", [_lt(cx, x, lo_v)], [t])
        b = cx.g.node("bitwise_not", [_lt(cx, hi_v, x)], [t])
    else:
        a, b = _lt(cx, lo_v, x), _lt(cx, x, hi_v)
    return cx.g.node("where", [a, b, cx.full(False, "bool")], [t])


def _hardsigmoid_backward(cx, node, args, kw):
    """grad / 6 inside (−3, 3), else 0 (torch's rule)."""
    g, x, t = cx.v(args[0]), cx.v(args[1]), _t(cx, node)
    d = cx.g.node("mul_scalar", [g], [t], {"value": 1.0 / 6.0})
    return cx.g.node("where", [_inside(cx, x, -3.0, 3.0, False), d, cx.full(0.0, t[0])], [t])


def _hardswish(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _float(x, "hardswish")
    return cx.g.node("mul", [x, _hardsigmoid_of(cx, x)], [t])


def _hardswish_backward(cx, node, args, kw):
    """grad · (x/3 + 1/2) on [−3, 3], grad where x > 3, 0 where x < −3 (torch's rule)."""
    g, x, t = cx.v(args[0]), cx.v(args[1]), _t(cx, node)
    xt = (x.dtype, x.shape)
    slope = cx.g.node("add_scalar", [cx.g.node("mul_scalar", [x], [xt], {"value": 1.0 / 3.0})],
                      [xt], {"value": 0.5})
    mid = cx.g.node("mul", [g, slope], [t])
    above = _lt(cx, cx.full(3.0, x.dtype), x)
    outer = cx.g.node("where", [above, g, cx.full(0.0, t[0])], [t])
    return cx.g.node("where", [_inside(cx, x, -3.0, 3.0, True), mid, outer], [t])


def _last_dim_product(cx, x, dim, mat):
    """x with dim moved last, times the [n, n] matrix mat (x's dtype), moved back."""
    r = len(x.shape)
    n = x.shape[dim]
    shape = list(x.shape)
    if dim != r - 1:
        shape[dim], shape[-1] = shape[-1], shape[dim]
        x = cx.g.node("transpose", [x], [(x.dtype, tuple(shape))], {"dim0": dim, "dim1": r - 1})
    rows = 1
    for s in shape[:-1]:
        rows *= s
    flat = cx.g.node("view", [x], [(x.dtype, (rows, n))], {"shape": [rows, n]})
    y = cx.g.node("mm", [flat, mat], [(x.dtype, (rows, n))])
    y = cx.g.node("view", [y], [(x.dtype, tuple(shape))], {"shape": shape})
    if dim != r - 1:
        back = list(shape)
        back[dim], back[-1] = back[-1], back[dim]
        y = cx.g.node("transpose", [y], [(x.dtype, tuple(back))], {"dim0": dim, "dim1": r - 1})
    return y


def _index_matrix(cx, n, dtype, relation):
    """The [n, n] matrix of relation(i, j) over row i and column j, as 0/1 of dtype:
    "le" (i <= j: the upper triangle, a cumsum's), "anti" (i + j == n − 1: a flip's)."""
    if n >= 1 << 24:
        raise Unsupported("a dim of %d elements (its index matrix counts in f32)" % n)
    col = cx.g.node("arange", [], [("f32", (n,))], {"start": 0, "end": n, "dtype": "f32"})
    row = cx.g.node("view", [col], [("f32", (n, 1))], {"shape": [n, 1]})
    if relation == "le":  # not (j < i)
        m = cx.g.node("bitwise_not", [cx.g.node("lt", [col, row], [("bool", (n, n))])],
                      [("bool", (n, n))])
    else:  # j == n − 1 − i, exact in f32 below 2^24
        rev = cx.g.node("add_scalar", [cx.g.node("neg", [row], [("f32", (n, 1))])],
                        [("f32", (n, 1))], {"value": n - 1})
        m = cx.g.node("eq", [col, rev], [("bool", (n, n))])
    return _as(cx, m, dtype)


def _cumsum(cx, node, args, kw):
    x = cx.v(args[0])
    if kw.get("dtype") is not None and kw["dtype"] != x.dtype:
        raise Unsupported("cumsum with dtype=%s" % kw["dtype"])
    _float(x, "cumsum")
    if not x.shape:
        return x
    dim = args[1] % len(x.shape)
    n = x.shape[dim]
    return _last_dim_product(cx, x, dim, _index_matrix(cx, n, x.dtype, "le"))


def _flip(cx, node, args, kw):
    x = cx.v(args[0])
    _float(x, "flip")
    y = x
    for d in sorted({d % len(x.shape) for d in args[1]}):
        if x.shape[d] > 1:
            y = _last_dim_product(cx, y, d, _index_matrix(cx, x.shape[d], x.dtype, "anti"))
    return y


def _rows_first(cx, x, dim):
    """x with dim moved first and the other dims flattened: [n, rest] (and rest's shape)."""
    r = len(x.shape)
    shape = list(x.shape)
    if dim != 0:
        shape[0], shape[dim] = shape[dim], shape[0]
        x = cx.g.node("transpose", [x], [(x.dtype, tuple(shape))], {"dim0": 0, "dim1": dim})
    rest = 1
    for s in shape[1:]:
        rest *= s
    if r != 2:
        x = cx.g.node("view", [x], [(x.dtype, (shape[0], rest))], {"shape": [shape[0], rest]})
    return x, shape[1:]


def _rows_back(cx, y, n, rest_shape, dim, t):
    """The inverse of _rows_first for a [n, rest] value: reshaped, dim moved back."""
    shape = [n] + list(rest_shape)
    if len(shape) != 2:
        y = cx.g.node("view", [y], [(t[0], tuple(shape))], {"shape": shape})
    if dim != 0:
        shape[0], shape[dim] = shape[dim], shape[0]
        y = cx.g.node("transpose", [y], [(t[0], tuple(shape))], {"dim0": 0, "dim1": dim})
    return y


def _empty(cx, node, args, kw):
    t = _t(cx, node)
    return cx.g.node("zeros", [], [t], {"shape": list(t[1]), "dtype": t[0]})


def _upstream(node, pred):
    """Whether pred holds for FX node or any node its value is computed from."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if pred(n):
            return True
        todo.extend(n.all_input_nodes)
    return False


def _from_constants(node):
    """Whether FX node is computed from constants only (no placeholder upstream): the value
    the trace recorded is then its value for every input."""
    return not _upstream(node, lambda n: n.op == "placeholder")


def _uniform_repeats(cx, node):
    """(n, r) when FX value node is repeat_interleave(repeats) of n counts all r, made from
    constants; None when it is not a repeat_interleave; Unsupported for other repeats."""
    if not isinstance(node, torch.fx.Node) or node.target != aten.repeat_interleave.Tensor:
        return None
    reps = node.args[0]
    if not _from_constants(reps):
        raise Unsupported("repeats computed from the model's inputs (the output's length would "
                          "depend on the data)")
    counts = cx.results[reps].reshape(-1).tolist()
    if not counts or any(c != counts[0] for c in counts):
        raise Unsupported("repeats that differ (hp repeats every entry the same count)")
    if counts[0] < 1:
        raise Unsupported("a repeat count of %d" % counts[0])
    return len(counts), int(counts[0])


def _repeat_interleave(cx, node, args, kw):
    n, r = _uniform_repeats(cx, node)
    t = _t(cx, node)
    idx = cx.g.node("arange", [], [(t[0], (n,))], {"start": 0, "end": n, "dtype": t[0]})
    idx = cx.g.node("view", [idx], [(t[0], (n, 1))], {"shape": [n, 1]})
    idx = cx.g.node("expand", [idx], [(t[0], (n, r))], {"shape": [n, r]})
    return cx.g.node("view", [idx], [t], {"shape": [n * r]})


def _repeat_along(cx, x, dim, r, t):
    """x with each entry along dim repeated r times in place: viewed with a unit dim after
    dim, expanded to r, reshaped (no gather)."""
    shape = list(x.shape)
    unit = shape[:dim + 1] + [1] + shape[dim + 1:]
    big = shape[:dim + 1] + [r] + shape[dim + 1:]
    v = cx.g.node("view", [x], [(x.dtype, tuple(unit))], {"shape": unit})
    e = cx.g.node("expand", [v], [(x.dtype, tuple(big))], {"shape": big})
    return cx.g.node("view", [e], [t], {"shape": list(t[1])})


def _index_select(cx, node, args, kw):
    x, idx, t = cx.v(args[0]), cx.v(args[2]), _t(cx, node)
    if not x.shape or len(idx.shape) != 1:
        raise Unsupported("index_select of a 0-d tensor or with a non-vector index")
    dim = args[1] % len(x.shape)
    rep = _uniform_repeats(cx, args[2])
    if rep is not None and rep[0] == x.shape[dim]:
        return _repeat_along(cx, x, dim, rep[1], t)
    w, rest = _rows_first(cx, x, dim)
    k = idx.shape[0]
    y = cx.g.node("embedding", [w, idx], [(x.dtype, (k, w.shape[1]))])
    return _rows_back(cx, y, k, rest, dim, t)


def _is_new_zeros(node):
    """Whether an FX node is a fresh tensor of zeros (new_zeros, zeros, zeros_like)."""
    return isinstance(node, torch.fx.Node) and node.target in (
        aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default)


def _index_add(cx, node, args, kw):
    self_, dim, idx, src = args[:4]
    alpha = args[4] if len(args) > 4 else kw.get("alpha", 1)
    s, i, g, t = cx.v(self_), cx.v(idx), cx.v(src), _t(cx, node)
    if not s.shape or len(i.shape) != 1:
        raise Unsupported("index_add into a 0-d tensor or with a non-vector index")
    dim %= len(s.shape)
    if alpha != 1:
        g = cx.g.node("mul_scalar", [g], [(g.dtype, g.shape)], {"value": alpha})
    n = s.shape[dim]
    rep = _uniform_repeats(cx, idx)
    if rep is not None and rep[0] == n:  # a repeat_interleave's backward: sum each r copies
        split = list(g.shape[:dim]) + [n, rep[1]] + list(g.shape[dim + 1:])
        v = cx.g.node("view", [g], [(g.dtype, tuple(split))], {"shape": split})
        y = cx.g.node("sum", [v], [(g.dtype, tuple(s.shape))], {"dims": [dim + 1]})
    else:
        rows, rest = _rows_first(cx, g, dim)
        acc = cx.g.node("embedding_dense_backward", [rows, i], [(g.dtype, (n, rows.shape[1]))],
                        {"num_weights": n})
        y = _rows_back(cx, acc, n, rest, dim, (g.dtype, None))
    y = _as(cx, y, t[0])
    return y if _is_new_zeros(self_) else cx.g.node("add", [s, y], [t])


def _one_index(cx, indices):
    """(k, index node) for indices [None] * k + [an integer tensor], as x[:, ..., idx] records
    them; None for any other form."""
    indices = list(indices)
    k = 0
    while k < len(indices) and indices[k] is None:
        k += 1
    if k != len(indices) - 1 or not isinstance(indices[k], torch.fx.Node):
        return None
    if cx.type_of(indices[k])[0] not in ("i64", "i32"):
        return None
    return k, indices[k]


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _index(cx, node, args, kw):
    """x[..., idx] (index.Tensor with one integer index after full slices): an embedding of x
    with that dim moved first and the others flattened, the index's dims put back in its
    place."""
    x, t = cx.v(args[0]), _t(cx, node)
    one = _one_index(cx, args[1])
    if one is None or not x.shape:
        raise Unsupported("indexing by other than one integer tensor after full slices")
    k, inode = one
    idx = cx.v(inode)
    q, m = len(idx.shape), _numel(idx.shape)
    others = [d for d in range(len(x.shape)) if d != k]
    rest = [x.shape[d] for d in others]
    w = x
    if k != 0:
        w = cx.g.node("permute", [x], [(x.dtype, tuple([x.shape[k]] + rest))],
                      {"perm": [k] + others})
    w = cx.g.node("view", [w], [(x.dtype, (x.shape[k], _numel(rest)))],
                  {"shape": [x.shape[k], _numel(rest)]})
    flat = idx if q == 1 else cx.g.node("view", [idx], [(idx.dtype, (m,))], {"shape": [m]})
    y = cx.g.node("embedding", [w, flat], [(x.dtype, (m, _numel(rest)))])
    shape = list(idx.shape) + rest  # the index's dims, then x's others in order
    y = cx.g.node("view", [y], [(x.dtype, tuple(shape))], {"shape": shape})
    if k == 0:
        return y
    perm = [q + i for i in range(k)] + list(range(q)) + [q + i for i in range(k, len(rest))]
    return cx.g.node("permute", [y], [t], {"perm": perm})


def index_put_by_index(cx, node, args, kw):
    """x.index_put([..., idx], values, accumulate=True) (index.Tensor's backward, into new
    zeros): values summed into the rows the index names, by embedding_dense_backward over x's
    dim; added to x unless x is new zeros. A write without accumulate is refused (with a
    repeated index torch keeps one of the values, unspecified which). None: not this form."""
    self_, indices, values = args[0], args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kw.get("accumulate", False)
    one = _one_index(cx, indices)
    if one is None:
        return None
    if not accumulate:
        raise Unsupported("index_put by an integer index without accumulate=True")
    s, v, t = cx.v(self_), cx.v(values), _t(cx, node)
    k, inode = one
    idx = cx.v(inode)
    q, m = len(idx.shape), _numel(idx.shape)
    others = [d for d in range(len(s.shape)) if d != k]
    rest = [s.shape[d] for d in others]
    if tuple(v.shape) != tuple(list(s.shape[:k]) + list(idx.shape) + list(s.shape[k + 1:])):
        raise Unsupported("index_put of values that are not the indexed shape")
    v = _as(cx, v, t[0])
    if k != 0:  # the index's dims first, then the others in order
        perm = list(range(k, k + q)) + list(range(k)) + list(range(k + q, len(v.shape)))
        v = cx.g.node("permute", [v], [(t[0], tuple(list(idx.shape) + rest))], {"perm": perm})
    v = cx.g.node("view", [v], [(t[0], (m, _numel(rest)))], {"shape": [m, _numel(rest)]})
    flat = idx if q == 1 else cx.g.node("view", [idx], [(idx.dtype, (m,))], {"shape": [m]})
    n = s.shape[k]
    acc = cx.g.node("embedding_dense_backward", [v, flat], [(t[0], (n, _numel(rest)))],
                    {"num_weights": n})
    acc = cx.g.node("view", [acc], [(t[0], tuple([n] + rest))], {"shape": [n] + rest})
    if k != 0:
        inv = [0] * len(s.shape)
        for i, d in enumerate([k] + others):
            inv[d] = i
        acc = cx.g.node("permute", [acc], [t], {"perm": inv})
    return acc if _is_new_zeros(self_) else cx.g.node("add", [s, acc], [t])


def _repeat(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    reps = list(args[1])
    shape = [1] * (len(reps) - len(x.shape)) + list(x.shape)
    if len(reps) < len(x.shape):
        raise Unsupported("repeat with fewer repeats than dims")
    unit = []
    for s in shape:
        unit += [1, s]
    big = []
    for r, s in zip(reps, shape):
        big += [r, s]
    v = cx.g.node("view", [x], [(x.dtype, tuple(unit))], {"shape": unit})
    e = cx.g.node("expand", [v], [(x.dtype, tuple(big))], {"shape": big})
    return cx.g.node("view", [e], [t], {"shape": list(t[1])})


def _group_norm_view(cx, x, n, c, hxw, g):
    """x [N, C, *] viewed [N, G, C/G·HxW] for group_norm; Unsupported when the sizes do not
    say so."""
    _float(x, "group_norm")
    if g < 1 or c % g or n * c * hxw != _numel(x.shape) or len(x.shape) < 2 or x.shape[1] != c:
        raise Unsupported("group_norm of %s with N=%d, C=%d, HxW=%d, %d groups"
                          % (list(x.shape), n, c, hxw, g))
    d = c // g * hxw
    return cx.g.node("view", [x], [(x.dtype, (n, g, d))], {"shape": [n, g, d]}), d


def _vec(cx, d, value, dtype):
    return cx.g.node("full", [], [(dtype, (d,))], {"shape": [d], "value": value, "dtype": dtype})


def _channel(cx, p, x, c):
    """A per-channel parameter [C] viewed [C, 1] against x [N, C, HxW], in x's dtype."""
    return _as(cx, cx.g.node("view", [cx.v(p)], [(cx.v(p).dtype, (c, 1))], {"shape": [c, 1]}),
               x.dtype)


def _native_group_norm(cx, node, args, kw):
    x, w, b, n, c, hxw, g, eps = args[:8]
    xv = cx.v(x)
    ts = cx.types_of(node)
    xg, d = _group_norm_view(cx, xv, n, c, hxw, g)
    y, mean, rstd = cx.g.node("native_layer_norm", [xg, _vec(cx, d, 1.0, xv.dtype),
                                                    _vec(cx, d, 0.0, xv.dtype)],
                              [(xv.dtype, (n, g, d)), ("f32", (n, g, 1)), ("f32", (n, g, 1))],
                              {"eps": eps})
    y = cx.g.node("view", [y], [(xv.dtype, (n, c, hxw))], {"shape": [n, c, hxw]})
    if w is not None:
        y = cx.g.node("mul", [y, _channel(cx, w, xv, c)], [(xv.dtype, (n, c, hxw))])
    if b is not None:
        y = cx.g.node("add", [y, _channel(cx, b, xv, c)], [(xv.dtype, (n, c, hxw))])
    y = cx.g.node("view", [y], [ts[0]], {"shape": list(ts[0][1])})
    stats = []
    for v, tt in ((mean, ts[1]), (rstd, ts[2])):
        v = cx.g.node("view", [v], [("f32", (n, g))], {"shape": [n, g]})
        stats.append(_as(cx, v, tt[0]))
    return [y] + stats


def _native_group_norm_backward(cx, node, args, kw):
    dy, x, mean, rstd, w, n, c, hxw, g = args[:9]
    xv, dyv = cx.v(x), cx.v(dy)
    ts = cx.types_of(node)
    xg, d = _group_norm_view(cx, xv, n, c, hxw, g)
    mean3 = cx.g.node("view", [_as(cx, cx.v(mean), "f32")], [("f32", (n, g, 1))],
                      {"shape": [n, g, 1]})
    rstd3 = cx.g.node("view", [_as(cx, cx.v(rstd), "f32")], [("f32", (n, g, 1))],
                      {"shape": [n, g, 1]})
    ct = (xv.dtype, (n, c, hxw))
    dy3 = cx.g.node("view", [_as(cx, dyv, xv.dtype)], [ct], {"shape": [n, c, hxw]})
    out = [None, None, None]
    if ts[0] is not None:
        dyw = dy3 if w is None else cx.g.node("mul", [dy3, _channel(cx, w, xv, c)], [ct])
        dyw = cx.g.node("view", [dyw], [(xv.dtype, (n, g, d))], {"shape": [n, g, d]})
        dx = cx.g.node("native_layer_norm_backward",
                       [dyw, xg, mean3, rstd3, _vec(cx, d, 1.0, xv.dtype)],
                       [(xv.dtype, (n, g, d)), (xv.dtype, (d,)), (xv.dtype, (d,))])[0]
        out[0] = cx.g.node("view", [dx], [ts[0]], {"shape": list(ts[0][1])})
    if ts[1] is not None:  # Σ dy · x̂ over the batch and spatial dims; x̂ = (x − mean) · rstd
        xhat = cx.g.node("mul", [cx.g.node("sub", [_as(cx, xg, "f32"), mean3],
                                           [("f32", (n, g, d))]), rstd3], [("f32", (n, g, d))])
        xhat = cx.g.node("view", [_as(cx, xhat, xv.dtype)], [ct], {"shape": [n, c, hxw]})
        dw = cx.g.node("sum", [cx.g.node("mul", [dy3, xhat], [ct])], [(xv.dtype, (c,))],
                       {"dims": [0, 2]})
        out[1] = _as(cx, dw, ts[1][0])
    if ts[2] is not None:
        out[2] = _as(cx, cx.g.node("sum", [dy3], [(xv.dtype, (c,))], {"dims": [0, 2]}), ts[2][0])
    return out


def _select_backward(cx, node, args, kw):
    g, sizes, dim, index = cx.v(args[0]), list(args[1]), args[2], args[3]
    dim %= len(sizes)
    n = sizes[dim]
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        raise Unsupported("select_backward at %d of a dim of %d" % (index, n))
    one = [1 if d == dim else s for d, s in enumerate(sizes)]
    g = cx.g.node("view", [g], [(g.dtype, tuple(one))], {"shape": one})
    return cx.g.node("slice_backward", [g], [_t(cx, node)],
                     {"shape": sizes, "dim": dim, "start": i, "end": i + 1})


TABLE = {
    aten.empty.memory_format: _empty,
    aten.select_backward.default: _select_backward,
    aten.repeat_interleave.Tensor: _repeat_interleave,
    aten.native_group_norm.default: _native_group_norm,
    aten.native_group_norm_backward.default: _native_group_norm_backward,
    aten.amin.default: _amin,
    aten.log1p.default: _log1p,
    aten.expm1.default: _expm1,
    aten.log_sigmoid_forward.default: _log_sigmoid_forward,
    aten.log_sigmoid_backward.default: _log_sigmoid_backward,
    aten.hardsigmoid.default: _hardsigmoid,
    aten.hardsigmoid_backward.default: _hardsigmoid_backward,
    aten.hardswish.default: _hardswish,
    aten.hardswish_backward.default: _hardswish_backward,
    aten.cumsum.default: _cumsum,
    aten.flip.default: _flip,
    aten.index_select.default: _index_select,
    aten.index_add.default: _index_add,
    aten.repeat.default: _repeat,
    aten.index.Tensor: _index,
}
