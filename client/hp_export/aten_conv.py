"""Convolution over 1 or 2 spatial dims (a causal depthwise Conv1d in Mamba- or Canon-style
blocks, an audio front end, a patch embedding) and pooling as hp's ops (graph/ops.def): hp has
no convolution kernel, so it is a matrix product of the input's patches (im2col).

  convolution(x, w, b, stride, padding, dilation, transposed=False, groups)
      x [N, Cin, S...] padded (zeros concatenated), then one strided slice per kernel
      offset (Πk of them: at most MAX_OFFSETS), stacked into patches P [g, N·ΠO, Πk·Cin/g];
      with w as [g, Πk·Cin/g, Cout/g], out = bmm(P, w) back to [N, Cout, O...], plus b
  convolution_backward(dy, x, w, ..., output_mask)
      dw = bmm(Pᵀ, dy), db = Σ dy over the batch and positions, dx = bmm(dy, wᵀ) put back
      at each offset's positions (slice_backward) and summed, the padding cut off

  avg_pool2d (+ backward)             the window sums of the patches over the divisor (Πk,
                                      divisor_override, or the real inputs in the window
                                      without count_include_pad); backward: dy / divisor put
                                      back at every offset
  max_pool2d_with_indices (+ backward)  amax over the patches (padding reads -inf); the index
                                      the flat input position of the first offset holding it
                                      (torch's scan order); backward: dy put back at each offset
                                      where the index is the position it read
  _adaptive_avg_pool2d (+ backward)   avg_pool2d with kernel = stride = in / out, for sizes
                                      that divide (1-d pools come as 2-d ones with a unit dim)

Transposed convolution, more than 2 spatial dims and a ceil_mode that adds a window are
refused by name.
"""
import torch

from .aten_map import Unsupported, _FINITE_MAX, _as, _t

aten = torch.ops.aten

MAX_OFFSETS = 64


def _n(cx, op, ins, t, attrs=None):
    return cx.g.node(op, ins, [t], attrs)


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


class _Geometry:
    """Shapes of one convolution: batch, channels, groups, kernel, strides, output sizes."""
    def __init__(self, xshape, wshape, stride, padding, dilation, transposed, groups, what):
        nd = len(xshape) - 2
        if transposed:
            raise Unsupported("a transposed %s: hp composes the forward kind only" % what)
        if nd not in (1, 2) or len(wshape) != nd + 2:
            raise Unsupported("%s over %d spatial dims (hp takes 1 or 2)" % (what, nd))
        self.nd, self.n, self.cin, self.g = nd, xshape[0], xshape[1], groups
        self.cout, self.cg, self.k = wshape[0], wshape[1], list(wshape[2:])
        self.size = list(xshape[2:])
        rep = (lambda v: list(v) * nd if len(v) == 1 else list(v))
        self.s, self.p, self.d = rep(stride), rep(padding), rep(dilation)
        if self.cin != self.cg * groups or self.cout % groups:
            raise Unsupported("%s of %d channels in %d groups with weight %s"
                              % (what, self.cin, groups, list(wshape)))
        self.og = self.cout // groups
        self.o = [(L + 2 * p - d * (k - 1) - 1) // s + 1
                  for L, p, d, k, s in zip(self.size, self.p, self.d, self.k, self.s)]
        if min(self.o) < 1:
            raise Unsupported("%s whose output would be empty (%s)" % (what, self.o))
        self.kk = _prod(self.k)
        if self.kk > MAX_OFFSETS:
            raise Unsupported("%s with a %s kernel (hp composes one slice per kernel offset, "
                              "%d at most)" % (what, "x".join(map(str, self.k)), MAX_OFFSETS))
        self.padded = [L + 2 * p for L, p in zip(self.size, self.p)]
        self.op = _prod(self.o)

    def offsets(self):
        if self.nd == 1:
            return [(a,) for a in range(self.k[0])]
        return [(a, b) for a in range(self.k[0]) for b in range(self.k[1])]

    def window(self, i, k):
        """The slice of padded dim i that kernel offset k reads: start, end, step."""
        start = k * self.d[i]
        return start, start + self.s[i] * (self.o[i] - 1) + 1, self.s[i]


def _regroup(cx, v, first, perm, flat):
    """v reshaped to first, permuted by perm, reshaped to flat."""
    v = _n(cx, "reshape", [v], (v.dtype, tuple(first)), {"shape": list(first)})
    v = _n(cx, "permute", [v], (v.dtype, tuple(first[i] for i in perm)), {"perm": list(perm)})
    return _n(cx, "reshape", [v], (v.dtype, tuple(flat)), {"shape": list(flat)})


def _pad(cx, x, geo, value=0.0):
    """x with value concatenated around each spatial dim (differentiable for hp's autodiff)."""
    for i in range(geo.nd):
        p = geo.p[i]
        if not p:
            continue
        side = list(x.shape)
        side[2 + i] = p
        z = _n(cx, "full", [], (x.dtype, tuple(side)),
               {"shape": side, "value": value, "dtype": x.dtype})
        shape = list(x.shape)
        shape[2 + i] = geo.padded[i]
        x = _n(cx, "cat", [z, x, z], (x.dtype, tuple(shape)), {"dim": 2 + i})
    return x


def _patches(cx, x, geo, value=0.0):
    """P [g, N·ΠO, Πk·cg]: the input padded with value at every kernel offset, group-major."""
    xp = _pad(cx, x, geo, value)
    pieces = []
    for off in geo.offsets():
        v = xp
        for i, k in enumerate(off):
            start, end, step = geo.window(i, k)
            shape = list(v.shape)
            shape[2 + i] = geo.o[i]
            a = {"dim": 2 + i, "start": start, "end": end}
            if step != 1:
                a["step"] = step
            v = _n(cx, "slice", [v], (v.dtype, tuple(shape)), a)
        five = [geo.n, 1, geo.g, geo.cg, geo.op]
        pieces.append(_n(cx, "reshape", [v], (x.dtype, tuple(five)), {"shape": five}))
    kk = [geo.n, geo.kk, geo.g, geo.cg, geo.op]
    p = pieces[0] if len(pieces) == 1 else _n(cx, "cat", pieces, (x.dtype, tuple(kk)), {"dim": 1})
    return _regroup(cx, p, kk, [2, 0, 4, 1, 3], [geo.g, geo.n * geo.op, geo.kk * geo.cg])


def _weight(cx, w, geo):
    """w [Cout, cg, k...] as [g, Πk·cg, og], matching _patches' order."""
    return _regroup(cx, w, [geo.g, geo.og, geo.cg, geo.kk], [0, 3, 2, 1],
                    [geo.g, geo.kk * geo.cg, geo.og])


def _put_back(cx, pieces, geo, lead, dt):
    """Σ over kernel offsets of pieces[j] (lead + O) placed where offset j read the padded
    input (slice_backward per spatial dim, the last slice undone first), the padding cut off:
    the input's gradient, lead + the input's spatial size."""
    padded = list(lead) + geo.padded
    total = None
    for v, off in zip(pieces, geo.offsets()):
        shape = list(v.shape)
        for i in reversed(range(geo.nd)):
            start, end, step = geo.window(i, off[i])
            shape = list(shape)
            shape[2 + i] = geo.padded[i]
            a = {"shape": shape, "dim": 2 + i, "start": start, "end": end}
            if step != 1:
                a["step"] = step
            v = _n(cx, "slice_backward", [v], (dt, tuple(shape)), a)
        total = v if total is None else _n(cx, "add", [total, v], (dt, tuple(padded)))
    for i in range(geo.nd):
        if geo.p[i]:
            shape = list(padded)
            shape[2 + i] = geo.size[i]
            total = _n(cx, "slice", [total], (dt, tuple(shape)),
                       {"dim": 2 + i, "start": geo.p[i], "end": geo.p[i] + geo.size[i]})
            padded = shape
    return total


def _geometry(x, w, args, what):
    stride, padding, dilation, transposed, _, groups = args
    return _Geometry(tuple(x.shape), tuple(w.shape), stride, padding, dilation, transposed,
                     groups, what)


def _floats(what, *vs):
    for v in vs:
        if v.dtype not in _FINITE_MAX:
            raise Unsupported("%s of a %s tensor" % (what, v.dtype))


def _convolution(cx, node, args, kw):
    x, w, b = cx.v(args[0]), cx.v(args[1]), args[2]
    _floats("convolution", x, w)
    t = _t(cx, node)
    geo = _geometry(x, w, args[3:9], "convolution")
    w = _as(cx, w, x.dtype)
    y = _n(cx, "bmm", [_patches(cx, x, geo), _weight(cx, w, geo)],
           (x.dtype, (geo.g, geo.n * geo.op, geo.og)))
    y = _regroup(cx, y, [geo.g, geo.n, geo.op, geo.og], [1, 0, 3, 2], t[1])
    if b is not None:
        view = [1, geo.cout] + [1] * geo.nd
        bv = _n(cx, "view", [_as(cx, cx.v(b), x.dtype)], (x.dtype, tuple(view)), {"shape": view})
        y = _n(cx, "add", [y, bv], (x.dtype, t[1]))
    return _as(cx, y, t[0])


def _grad_rows(cx, dy, geo):
    """dy [N, Cout, O...] as [g, N·ΠO, og]."""
    return _regroup(cx, dy, [geo.n, geo.g, geo.og, geo.op], [1, 0, 3, 2],
                    [geo.g, geo.n * geo.op, geo.og])


def _convolution_backward(cx, node, args, kw):
    dy, x, w = cx.v(args[0]), cx.v(args[1]), cx.v(args[2])
    _floats("convolution_backward", dy, x, w)
    geo = _geometry(x, w, args[4:10], "convolution_backward")
    ts = cx.types_of(node)
    dt = x.dtype
    dy = _as(cx, dy, dt)
    g = _grad_rows(cx, dy, geo)
    out = [None, None, None]
    if ts[2] is not None:
        dims = [0] + list(range(2, 2 + geo.nd))
        out[2] = _as(cx, _n(cx, "sum", [dy], (dt, (geo.cout,)), {"dims": dims}), ts[2][0])
    if ts[1] is not None:
        p = _patches(cx, x, geo)
        pt = _n(cx, "transpose", [p], (dt, (geo.g, geo.kk * geo.cg, geo.n * geo.op)),
                {"dim0": 1, "dim1": 2})
        dw = _n(cx, "bmm", [pt, g], (dt, (geo.g, geo.kk * geo.cg, geo.og)))
        dw = _regroup(cx, dw, [geo.g, geo.kk, geo.cg, geo.og], [0, 3, 2, 1], ts[1][1])
        out[1] = _as(cx, dw, ts[1][0])
    if ts[0] is not None:
        wv = _weight(cx, _as(cx, w, dt), geo)
        wt = _n(cx, "transpose", [wv], (dt, (geo.g, geo.og, geo.kk * geo.cg)),
                {"dim0": 1, "dim1": 2})
        dp = _n(cx, "bmm", [g, wt], (dt, (geo.g, geo.n * geo.op, geo.kk * geo.cg)))
        five = [geo.g, geo.n, geo.op, geo.kk, geo.cg]
        dp = _n(cx, "reshape", [dp], (dt, tuple(five)), {"shape": five})
        perm = [1, 3, 0, 4, 2]  # [N, kk, g, cg, ΠO]
        dp = _n(cx, "permute", [dp], (dt, tuple(five[i] for i in perm)), {"perm": perm})
        pieces = []
        for j in range(geo.kk):
            one = [geo.n, 1, geo.g, geo.cg, geo.op]
            v = _n(cx, "slice", [dp], (dt, tuple(one)), {"dim": 1, "start": j, "end": j + 1})
            shape = [geo.n, geo.cin] + geo.o
            pieces.append(_n(cx, "reshape", [v], (dt, tuple(shape)), {"shape": shape}))
        total = _put_back(cx, pieces, geo, [geo.n, geo.cin], dt)
        out[0] = _as(cx, total, ts[0][0])
    return out


# ---- pooling ----------------------------------------------------------------------------------

def _pool_geometry(x, kernel, stride, padding, dilation, ceil_mode, what):
    """x [..., H, W] as [M, 1, H, W] (M: the leading dims), a one-channel kernel."""
    if len(x.shape) < 3:
        raise Unsupported("%s of a %d-d tensor" % (what, len(x.shape)))
    k = list(kernel) * 2 if len(kernel) == 1 else list(kernel)
    stride = list(stride) if stride else k
    lead = _prod(x.shape[:-2])
    geo = _Geometry((lead, 1) + tuple(x.shape[-2:]), (1, 1) + tuple(k), stride, padding,
                    dilation, False, 1, what)
    if ceil_mode:
        for L, p, d, kk, st, o in zip(geo.size, geo.p, geo.d, geo.k, geo.s, geo.o):
            c = -(-(L + 2 * p - d * (kk - 1) - 1) // st) + 1
            if (c - 1) * st >= L + p:
                c -= 1
            if c != o:
                raise Unsupported("%s with ceil_mode where it adds a window" % what)
    return geo


def _flat(cx, x, geo):
    four = [geo.n, 1] + geo.size
    return _n(cx, "reshape", [x], (x.dtype, tuple(four)), {"shape": four})


def _window_sums(cx, x, geo, value=0.0, op="sum"):
    """[M, ΠO]: op (sum or amax) over each window of x flattened to [M, 1, H, W]."""
    p = _patches(cx, _flat(cx, x, geo), geo, value)  # [1, M·ΠO, Πk]
    r = _n(cx, op, [p], (x.dtype, (1, geo.n * geo.op)), {"dims": [2]})
    return p, _n(cx, "reshape", [r], (x.dtype, (geo.n, geo.op)), {"shape": [geo.n, geo.op]})


def _avg_divisor(cx, geo, count_include_pad, divisor, dt):
    """The divisor of each window: divisor_override, Πk, or the count of real inputs in it."""
    if divisor:
        return cx.full(float(divisor), dt)
    if count_include_pad or not any(geo.p):
        return cx.full(float(geo.kk), dt)
    ones = _n(cx, "ones", [], (dt, (1, 1) + tuple(geo.size)),
              {"shape": [1, 1] + geo.size, "dtype": dt})
    one = _Geometry((1, 1) + tuple(geo.size), (1, 1) + tuple(geo.k), geo.s, geo.p, geo.d, False,
                    1, "avg_pool2d")
    p = _patches(cx, ones, one)
    c = _n(cx, "sum", [p], (dt, (1, one.op)), {"dims": [2]})
    return c  # [1, ΠO]: broadcasts over M


def _pool_args(args, kw, names, at):
    vals = []
    for i, (name, default) in enumerate(names):
        j = at + i
        vals.append(args[j] if len(args) > j else kw.get(name, default))
    return vals


_AVG = (("kernel_size", None), ("stride", []), ("padding", [0]), ("ceil_mode", False),
        ("count_include_pad", True), ("divisor_override", None))


def _avg_pool2d(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _floats("avg_pool2d", x)
    k, st, pad, ceil, inc, div = _pool_args(args, kw, _AVG, 1)
    geo = _pool_geometry(x, k, st, pad, [1], ceil, "avg_pool2d")
    _, s = _window_sums(cx, x, geo)
    y = _n(cx, "div", [s, _avg_divisor(cx, geo, inc, div, x.dtype)], (x.dtype, (geo.n, geo.op)))
    return _n(cx, "reshape", [y], t, {"shape": list(t[1])})


def _spread(cx, g, geo, x, per_offset):
    """The input's gradient from g [M, ΠO]: per_offset(j, g) for each kernel offset j, put
    back where that offset read."""
    dt = x.dtype
    pieces = []
    for j in range(geo.kk):
        v = per_offset(j, g)
        four = [geo.n, 1] + geo.o
        pieces.append(_n(cx, "reshape", [v], (dt, tuple(four)), {"shape": four}))
    total = _put_back(cx, pieces, geo, [geo.n, 1], dt)
    return _n(cx, "reshape", [total], (dt, tuple(x.shape)), {"shape": list(x.shape)})


def _avg_pool2d_backward(cx, node, args, kw):
    g, x, t = cx.v(args[0]), cx.v(args[1]), _t(cx, node)
    _floats("avg_pool2d_backward", g, x)
    k, st, pad, ceil, inc, div = _pool_args(args, kw, _AVG, 2)
    geo = _pool_geometry(x, k, st, pad, [1], ceil, "avg_pool2d_backward")
    g = _n(cx, "reshape", [_as(cx, g, x.dtype)], (x.dtype, (geo.n, geo.op)),
           {"shape": [geo.n, geo.op]})
    g = _n(cx, "div", [g, _avg_divisor(cx, geo, inc, div, x.dtype)], (x.dtype, (geo.n, geo.op)))
    return _as(cx, _spread(cx, g, geo, x, lambda j, v: v), t[0])


_MAX = (("kernel_size", None), ("stride", []), ("padding", [0]), ("dilation", [1]),
        ("ceil_mode", False))


def _read_at(cx, geo, off, w):
    """[1, ΠO] f32: the flat input position (row · W + column) that kernel offset off reads at
    each output position (negative or past the row where it reads padding)."""
    rows = _n(cx, "arange", [], ("f32", (geo.o[0],)), {"start": 0, "end": geo.o[0],
                                                       "dtype": "f32"})
    cols = _n(cx, "arange", [], ("f32", (geo.o[1],)), {"start": 0, "end": geo.o[1],
                                                       "dtype": "f32"})
    r = _n(cx, "add_scalar", [_n(cx, "mul_scalar", [rows], ("f32", (geo.o[0],)),
                                 {"value": float(geo.s[0] * w)})], ("f32", (geo.o[0],)),
           {"value": float((off[0] * geo.d[0] - geo.p[0]) * w)})
    c = _n(cx, "add_scalar", [_n(cx, "mul_scalar", [cols], ("f32", (geo.o[1],)),
                                 {"value": float(geo.s[1])})], ("f32", (geo.o[1],)),
           {"value": float(off[1] * geo.d[1] - geo.p[1])})
    r = _n(cx, "view", [r], ("f32", (geo.o[0], 1)), {"shape": [geo.o[0], 1]})
    c = _n(cx, "view", [c], ("f32", (1, geo.o[1])), {"shape": [1, geo.o[1]]})
    at = _n(cx, "add", [r, c], ("f32", tuple(geo.o)))
    return _n(cx, "view", [at], ("f32", (1, geo.op)), {"shape": [1, geo.op]})


def _max_pool2d_with_indices(cx, node, args, kw):
    """Values: amax over each window (padding reads -inf); indices: the flat input position of
    the first offset holding it, in torch's scan order (rows, then columns)."""
    x = cx.v(args[0])
    _floats("max_pool2d", x)
    ts = cx.types_of(node)
    k, st, pad, dil, ceil = _pool_args(args, kw, _MAX, 1)
    geo = _pool_geometry(x, k, st, pad, dil, ceil, "max_pool2d")
    p, m = _window_sums(cx, x, geo, float("-inf"), "amax")
    vals = _n(cx, "reshape", [m], ts[0], {"shape": list(ts[0][1])})
    mk = _n(cx, "view", [m], (x.dtype, (1, geo.n * geo.op, 1)), {"shape": [1, geo.n * geo.op, 1]})
    pos = _n(cx, "arange", [], ("f32", (geo.kk,)), {"start": 0, "end": geo.kk, "dtype": "f32"})
    pos = _n(cx, "view", [pos], ("f32", (1, 1, geo.kk)), {"shape": [1, 1, geo.kk]})
    pshape = (1, geo.n * geo.op, geo.kk)
    at = _n(cx, "where", [_n(cx, "eq", [p, mk], ("bool", pshape)), pos,
                          cx.full(float(geo.kk), "f32")], ("f32", pshape))
    first = _n(cx, "neg", [_n(cx, "amax", [_n(cx, "neg", [at], ("f32", pshape))],
                              ("f32", (1, geo.n * geo.op)), {"dims": [2]})],
               ("f32", (1, geo.n * geo.op)))
    first = _n(cx, "reshape", [first], ("f32", (geo.n, geo.op)), {"shape": [geo.n, geo.op]})
    idx = None
    w = geo.size[1]
    for j, off in enumerate(geo.offsets()):
        hit = _n(cx, "eq", [first, cx.full(float(j), "f32")], ("bool", (geo.n, geo.op)))
        at_j = _read_at(cx, geo, off, w)
        idx = at_j if idx is None else _n(cx, "where", [hit, at_j, idx], ("f32", (geo.n, geo.op)))
        if j == 0:
            idx = _n(cx, "where", [hit, idx, cx.full(-1.0, "f32")], ("f32", (geo.n, geo.op)))
    idx = _n(cx, "reshape", [idx], ("f32", ts[1][1]), {"shape": list(ts[1][1])})
    return [vals, _as(cx, idx, ts[1][0])]


def _max_pool2d_with_indices_backward(cx, node, args, kw):
    """The gradient to the input position each window's index names: per kernel offset, where
    the index is the position that offset reads, put back there."""
    g, x, t = cx.v(args[0]), cx.v(args[1]), _t(cx, node)
    _floats("max_pool2d_backward", g, x)
    k, st, pad, dil, ceil = _pool_args(args, kw, _MAX, 2)
    geo = _pool_geometry(x, k, st, pad, dil, ceil, "max_pool2d_backward")
    idx = cx.v(args[7] if len(args) > 7 else kw["indices"])
    idx = _n(cx, "reshape", [_as(cx, idx, "f32")], ("f32", (geo.n, geo.op)),
             {"shape": [geo.n, geo.op]})
    g = _n(cx, "reshape", [_as(cx, g, x.dtype)], (x.dtype, (geo.n, geo.op)),
           {"shape": [geo.n, geo.op]})
    offs = geo.offsets()
    zero = cx.full(0.0, x.dtype)

    def taken(j, v):
        hit = _n(cx, "eq", [idx, _read_at(cx, geo, offs[j], geo.size[1])],
                 ("bool", (geo.n, geo.op)))
        return _n(cx, "where", [hit, v, zero], (x.dtype, (geo.n, geo.op)))
    return _as(cx, _spread(cx, g, geo, x, taken), t[0])


def _adaptive_geometry(x, out, what):
    ins = x.shape[-2:]
    if any(o <= 0 or i % o for i, o in zip(ins, out)):
        raise Unsupported("%s from %s to %s (hp takes sizes that divide)" % (what, list(ins),
                                                                             list(out)))
    return [i // o for i, o in zip(ins, out)]


def _adaptive_avg_pool2d(cx, node, args, kw):
    x = cx.v(args[0])
    k = _adaptive_geometry(x, list(args[1]), "adaptive_avg_pool2d")
    return _avg_pool2d(cx, node, [args[0], k, k], {})


def _adaptive_avg_pool2d_backward(cx, node, args, kw):
    g, x = cx.v(args[0]), cx.v(args[1])
    k = _adaptive_geometry(x, list(g.shape[-2:]), "adaptive_avg_pool2d_backward")
    return _avg_pool2d_backward(cx, node, [args[0], args[1], k, k], {})


TABLE = {
    aten.convolution.default: _convolution,
    aten.convolution_backward.default: _convolution_backward,
    aten.avg_pool2d.default: _avg_pool2d,
    aten.avg_pool2d_backward.default: _avg_pool2d_backward,
    aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,
    aten.max_pool2d_with_indices_backward.default: _max_pool2d_with_indices_backward,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d_backward.default: _adaptive_avg_pool2d_backward,
}
