"""Convolution over 1 or 2 spatial dims (a causal depthwise Conv1d in Mamba- or Canon-style
blocks, an audio front end, a patch embedding) as hp's ops (graph/ops.def): hp has no
convolution kernel, so it is a matrix product of the input's patches (im2col).

  convolution(x, w, b, stride, padding, dilation, transposed=False, groups)
      x [N, Cin, S...] padded (zeros concatenated), then one strided slice per kernel
      offset (Πk of them: at most MAX_OFFSETS), stacked into patches P [g, N·ΠO, Πk·Cin/g];
      with w as [g, Πk·Cin/g, Cout/g], out = bmm(P, w) back to [N, Cout, O...], plus b
  convolution_backward(dy, x, w, ..., output_mask)
      dw = bmm(Pᵀ, dy), db = Σ dy over the batch and positions, dx = bmm(dy, wᵀ) put back
      at each offset's positions (slice_backward) and summed, the padding cut off

Transposed convolution and more than 2 spatial dims are refused by name.
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


def _pad(cx, x, geo):
    """x with zeros concatenated around each spatial dim (differentiable for hp's autodiff)."""
    for i in range(geo.nd):
        p = geo.p[i]
        if not p:
            continue
        side = list(x.shape)
        side[2 + i] = p
        z = _n(cx, "zeros", [], (x.dtype, tuple(side)), {"shape": side, "dtype": x.dtype})
        shape = list(x.shape)
        shape[2 + i] = geo.padded[i]
        x = _n(cx, "cat", [z, x, z], (x.dtype, tuple(shape)), {"dim": 2 + i})
    return x


def _patches(cx, x, geo):
    """P [g, N·ΠO, Πk·cg]: the padded input at every kernel offset, group-major."""
    xp = _pad(cx, x, geo)
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
    perm = [2, 0, 4, 1, 3]
    p = _n(cx, "permute", [p], (x.dtype, tuple(kk[i] for i in perm)), {"perm": perm})
    flat = [geo.g, geo.n * geo.op, geo.kk * geo.cg]
    return _n(cx, "reshape", [p], (x.dtype, tuple(flat)), {"shape": flat})


def _weight(cx, w, geo):
    """w [Cout, cg, k...] as [g, Πk·cg, og], matching _patches' order."""
    four = [geo.g, geo.og, geo.cg, geo.kk]
    v = _n(cx, "reshape", [w], (w.dtype, tuple(four)), {"shape": four})
    perm = [0, 3, 2, 1]
    v = _n(cx, "permute", [v], (w.dtype, tuple(four[i] for i in perm)), {"perm": perm})
    flat = [geo.g, geo.kk * geo.cg, geo.og]
    return _n(cx, "reshape", [v], (w.dtype, tuple(flat)), {"shape": flat})


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
    four = [geo.g, geo.n, geo.op, geo.og]
    y = _n(cx, "reshape", [y], (x.dtype, tuple(four)), {"shape": four})
    perm = [1, 0, 3, 2]
    y = _n(cx, "permute", [y], (x.dtype, tuple(four[i] for i in perm)), {"perm": perm})
    y = _n(cx, "reshape", [y], (x.dtype, t[1]), {"shape": list(t[1])})
    if b is not None:
        view = [1, geo.cout] + [1] * geo.nd
        bv = _n(cx, "view", [_as(cx, cx.v(b), x.dtype)], (x.dtype, tuple(view)), {"shape": view})
        y = _n(cx, "add", [y, bv], (x.dtype, t[1]))
    return _as(cx, y, t[0])


def _grad_rows(cx, dy, geo):
    """dy [N, Cout, O...] as [g, N·ΠO, og]."""
    four = [geo.n, geo.g, geo.og, geo.op]
    v = _n(cx, "reshape", [dy], (dy.dtype, tuple(four)), {"shape": four})
    perm = [1, 0, 3, 2]
    v = _n(cx, "permute", [v], (dy.dtype, tuple(four[i] for i in perm)), {"perm": perm})
    flat = [geo.g, geo.n * geo.op, geo.og]
    return _n(cx, "reshape", [v], (dy.dtype, tuple(flat)), {"shape": flat})


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
        four = [geo.g, geo.kk, geo.cg, geo.og]
        dw = _n(cx, "reshape", [dw], (dt, tuple(four)), {"shape": four})
        perm = [0, 3, 2, 1]
        dw = _n(cx, "permute", [dw], (dt, tuple(four[i] for i in perm)), {"perm": perm})
        out[1] = _as(cx, _n(cx, "reshape", [dw], (dt, ts[1][1]), {"shape": list(ts[1][1])}),
                     ts[1][0])
    if ts[0] is not None:
        wv = _weight(cx, _as(cx, w, dt), geo)
        wt = _n(cx, "transpose", [wv], (dt, (geo.g, geo.og, geo.kk * geo.cg)),
                {"dim0": 1, "dim1": 2})
        dp = _n(cx, "bmm", [g, wt], (dt, (geo.g, geo.n * geo.op, geo.kk * geo.cg)))
        five = [geo.g, geo.n, geo.op, geo.kk, geo.cg]
        dp = _n(cx, "reshape", [dp], (dt, tuple(five)), {"shape": five})
        perm = [1, 3, 0, 4, 2]  # [N, kk, g, cg, ΠO]
        dp = _n(cx, "permute", [dp], (dt, tuple(five[i] for i in perm)), {"perm": perm})
        padded = [geo.n, geo.cin] + geo.padded
        total = None
        for j, off in enumerate(geo.offsets()):
            one = [geo.n, 1, geo.g, geo.cg, geo.op]
            v = _n(cx, "slice", [dp], (dt, tuple(one)), {"dim": 1, "start": j, "end": j + 1})
            shape = [geo.n, geo.cin] + geo.o
            v = _n(cx, "reshape", [v], (dt, tuple(shape)), {"shape": shape})
            for i in reversed(range(geo.nd)):  # undo the slices, the last taken first
                start, end, step = geo.window(i, off[i])
                shape = list(shape)
                shape[2 + i] = geo.padded[i]
                a = {"shape": shape, "dim": 2 + i, "start": start, "end": end}
                if step != 1:
                    a["step"] = step
                v = _n(cx, "slice_backward", [v], (dt, tuple(shape)), a)
            total = v if total is None else _n(cx, "add", [total, v], (dt, tuple(padded)))
        for i in range(geo.nd):  # the padding cut off
            if geo.p[i]:
                shape = list(padded)
                shape[2 + i] = geo.size[i]
                total = _n(cx, "slice", [total], (dt, tuple(shape)),
                           {"dim": 2 + i, "start": geo.p[i], "end": geo.p[i] + geo.size[i]})
                padded = shape
        out[0] = _as(cx, total, ts[0][0])
    return out


TABLE = {
    aten.convolution.default: _convolution,
    aten.convolution_backward.default: _convolution_backward,
}
