"""The one table from ATen ops (as make_fx records them: `aten.addmm.default`) to hp's ops
(graph/ops.def). Each entry takes the conversion context, the FX node and its arguments and
emits hp nodes, returning the node's value(s); an op missing here, or an argument hp cannot
represent (Unsupported), fails the export with every such op listed once.

Most entries are one-to-one (hp's op names follow ATen). The others:
  detach                              folds away in a joint graph; hp's detach in a forward one
  alias, dropout p=0                  fold away (the value itself)
  native_dropout p>0 (+ backward)     native_dropout (hp's counter-RNG mask, named by module
                                      path: `transformer.drop#0`) and its backward
  bernoulli_(empty_like(x), 1-p)      cast of native_dropout(x)'s mask: aten.dropout's CPU
                                      decomposition (then div_ and mul as traced)
  _reshape_alias, _unsafe_view        view (hp values are contiguous: a reshape)
  split, split_with_sizes             one slice per piece
  select, unbind                      slice(s) of one, the dim viewed away
  stack                               cat of the inputs viewed with the new dim
  empty_like                          zeros (its values are never defined: written before read)
  fill_, add_/sub_/mul_/div_          functional (full, add, ...) when nothing reads the
                                      overwritten input afterwards (make_fx's decompositions
                                      of silu_backward); refused otherwise
  masked_fill.Scalar                  where(mask, full(value), x)
  index_put(_)(x, [mask], v)          where(mask, v, x) for one bool mask of x's shape, v scalar
  masked_select, masked_scatter       a view, where the mask is known true everywhere: the
                                      negation of `labels == c` with c < 0 (token ids never
                                      are), as label smoothing's loss has it; else refused
  lift_fresh_copy                     folds away
  triu(x, k)                          where(tril(ones, k - 1) == 1, 0, x)
  gt / ge / le / ne                   lt swapped / not lt / not swapped lt / not eq
  logical_and(a, b)                   where(a, b, false)
  clamp, clamp_min, clamp_max         where(x < lo, lo, where(hi < x, hi, x))
  leaky_relu, softplus (+ backward)   where, mul_scalar, exp, log, sigmoid (torch's threshold)
  var(x, dims, correction)            Σ (x − mean)² / (n − correction)
  baddbmm(input, b1, b2)              add(beta·input, alpha·bmm(b1, b2)) (nn.MultiheadAttention's
                                      masked scores)
  div by a scalar, eq.Scalar          the scalar as a 0-d full
  add/sub/mul by a scalar             add_scalar / mul_scalar
  ones_like/zeros_like/full_like      ones / zeros / full of the input's shape
  native_layer_norm without affine    ones / zeros as weight and bias
"""
import operator

import torch

from .hpir import Unsupported

aten = torch.ops.aten


def _t(cx, node):
    return cx.type_of(node)


def _one(op):
    """ATen op with the same inputs and no attributes."""
    def f(cx, node, args, kw):
        return cx.g.node(op, [cx.v(a) for a in args if _is_node(a)], [_t(cx, node)])
    return f


def _is_node(a):
    return isinstance(a, torch.fx.Node)


def _shape_op(op):
    def f(cx, node, args, kw):
        t = _t(cx, node)
        return cx.g.node(op, [cx.v(args[0])], [t], {"shape": t[1]})
    return f


def _fold(cx, node, args, kw):
    return cx.v(args[0])


def _detach(cx, node, args, kw):
    """The value itself in a joint graph (torch's backward is recorded already); hp's detach
    in a forward graph, so hp's autodiff sends no gradient through it."""
    x = cx.v(args[0])
    if cx.cap.autodiff != "hp" or x.dtype not in _FINITE_MAX:
        return x
    return cx.g.node("detach", [x], [(x.dtype, x.shape)])


def _reshape_alias(cx, node, args, kw):
    # make_fx emits _reshape_alias for a reshape that can be a view; a reshape's values are
    # the logical row-major order whatever the strides, which is what hp's view computes
    t = _t(cx, node)
    return cx.g.node("view", [cx.v(args[0])], [t], {"shape": t[1]})


def _as(cx, v, dtype):
    """v cast to dtype (torch's type promotion made explicit: hp's operands share one dtype)."""
    if v.dtype == dtype:
        return v
    return cx.g.node("_to_copy", [v], [(dtype, v.shape)], {"dtype": dtype})


def _binary(op, scalar_op):
    def f(cx, node, args, kw):
        a, b = args[0], args[1]
        alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
        t = _t(cx, node)
        if t[0] == "bool" and op in ("mul", "add") and _is_node(a) and _is_node(b):
            # of two bools (isfinite's decomposition): and, or
            va, vb = cx.v(a), cx.v(b)
            if op == "mul":
                return cx.g.node("where", [va, vb, cx.full(False, "bool")], [t])
            return cx.g.node("where", [va, cx.full(True, "bool"), vb], [t])
        if _is_node(a) and _is_node(b):
            vb = _as(cx, cx.v(b), t[0])
            if alpha != 1:
                vb = cx.g.node("mul_scalar", [vb], [(vb.dtype, vb.shape)], {"value": alpha})
            return cx.g.node(op, [_as(cx, cx.v(a), t[0]), vb], [t])
        if op == "div":
            if not _is_node(a):
                raise Unsupported("a scalar divided by a tensor")
            return cx.g.node("div", [cx.v(a), cx.full(b, t[0])], [t])
        if not _is_node(a):  # scalar op tensor: only the commutative ones
            if op == "sub":
                raise Unsupported("a scalar minus a tensor")
            a, b = b, a
        va = _as(cx, cx.v(a), t[0])  # an integer tensor times a float: promoted, as torch
        if op == "add":
            return cx.g.node("add_scalar", [va], [t], {"value": b * alpha})
        if op == "sub":
            return cx.g.node("add_scalar", [va], [t], {"value": -b * alpha})
        return cx.g.node(scalar_op, [va], [t], {"value": b})
    return f


def _rsub(cx, node, args, kw):
    x, other = cx.v(args[0]), args[1]
    alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
    t = _t(cx, node)
    if not _is_node(args[1]):
        nx = cx.g.node("mul_scalar", [_as(cx, x, t[0])], [t], {"value": -alpha})
        return cx.g.node("add_scalar", [nx], [t], {"value": other})
    raise Unsupported("rsub of two tensors")


def _mul_scalar(cx, node, args, kw):
    t = _t(cx, node)
    return cx.g.node("mul_scalar", [_as(cx, cx.v(args[0]), t[0])], [t], {"value": args[1]})


def _pow(cx, node, args, kw):
    return cx.g.node("pow", [cx.v(args[0])], [_t(cx, node)], {"exponent": args[1]})


def _operand(cx, a, dtype):
    return cx.v(a) if _is_node(a) else cx.full(a, dtype)


def _compare(op):
    def f(cx, node, args, kw):
        a = cx.v(args[0])
        b = _operand(cx, args[1], a.dtype)
        return cx.g.node(op, [a, b], [_t(cx, node)])
    return f


def _not_compare(op, swap):
    """ge (not lt), le (not swapped lt), gt (swapped lt): hp compares with eq and lt only
    (NaN compares false in both, so ge/le of a NaN come out true here where torch says false)."""
    def f(cx, node, args, kw):
        a = cx.v(args[0])
        b = _operand(cx, args[1], a.dtype)
        x, y = (b, a) if swap else (a, b)
        t = _t(cx, node)
        r = cx.g.node("lt", [x, y], [t])
        return cx.g.node("bitwise_not", [r], [t]) if op == "not" else r
    return f


def _logical_and(cx, node, args, kw):
    a, b = cx.v(args[0]), cx.v(args[1])
    t = _t(cx, node)
    if a.dtype != "bool" or b.dtype != "bool":
        raise Unsupported("logical_and of non-bool tensors")
    return cx.g.node("where", [a, b, cx.full(False, "bool")], [t])


def _scalar_tensor(cx, node, args, kw):
    t = _t(cx, node)
    return cx.full(args[0], t[0])


def _clamp(cx, node, args, kw):
    """clamp(x, lo, hi) = where(x < lo, lo, where(hi < x, hi, x)); either bound may be None."""
    x, t = cx.v(args[0]), _t(cx, node)
    lo = args[1] if len(args) > 1 else kw.get("min")
    hi = args[2] if len(args) > 2 else kw.get("max")
    y = x
    if hi is not None:
        h = _operand(cx, hi, t[0])
        y = cx.g.node("where", [cx.g.node("lt", [h, y], [("bool", t[1])]), h, y], [t])
    if lo is not None:
        m = _operand(cx, lo, t[0])
        y = cx.g.node("where", [cx.g.node("lt", [x, m], [("bool", t[1])]), m, y], [t])
    return y


def _clamp_min(cx, node, args, kw):
    return _clamp(cx, node, [args[0], args[1], None], {})


def _clamp_max(cx, node, args, kw):
    return _clamp(cx, node, [args[0], None, args[1]], {})


def _leaky_relu(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    slope = args[1] if len(args) > 1 else kw.get("negative_slope", 0.01)
    neg = cx.g.node("lt", [x, cx.full(0.0, t[0])], [("bool", t[1])])
    return cx.g.node("where", [neg, cx.g.node("mul_scalar", [x], [t], {"value": slope}), x], [t])


def _leaky_relu_backward(cx, node, args, kw):
    """grad where x > 0, else grad · slope (torch's rule: x == 0 takes the slope)."""
    g, x, slope = cx.v(args[0]), cx.v(args[1]), args[2]
    t = _t(cx, node)
    pos = cx.g.node("lt", [cx.full(0.0, x.dtype), x], [("bool", x.shape)])
    return cx.g.node("where", [pos, g, cx.g.node("mul_scalar", [g], [t], {"value": slope})], [t])


def _softplus(cx, node, args, kw):
    """log(1 + exp(beta·x)) / beta, x itself where beta·x > threshold (torch's rule)."""
    x, t = cx.v(args[0]), _t(cx, node)
    beta = args[1] if len(args) > 1 else kw.get("beta", 1)
    thr = args[2] if len(args) > 2 else kw.get("threshold", 20)
    bx = cx.g.node("mul_scalar", [x], [t], {"value": beta}) if beta != 1 else x
    big = cx.g.node("lt", [cx.full(thr, t[0]), bx], [("bool", t[1])])
    sp = cx.g.node("log", [cx.g.node("add_scalar", [cx.g.node("exp", [bx], [t])], [t],
                                     {"value": 1.0})], [t])
    if beta != 1:
        sp = cx.g.node("mul_scalar", [sp], [t], {"value": 1.0 / beta})
    return cx.g.node("where", [big, x, sp], [t])


def _softplus_backward(cx, node, args, kw):
    """grad · sigmoid(beta·x), grad itself where beta·x > threshold."""
    g, x, beta, thr = cx.v(args[0]), cx.v(args[1]), args[2], args[3]
    t = _t(cx, node)
    bx = cx.g.node("mul_scalar", [x], [t], {"value": beta}) if beta != 1 else x
    big = cx.g.node("lt", [cx.full(thr, t[0]), bx], [("bool", t[1])])
    gs = cx.g.node("mul", [g, cx.g.node("sigmoid", [bx], [t])], [t])
    return cx.g.node("where", [big, g, gs], [t])


def _var(cx, node, args, kw):
    """var(x, dims, correction, keepdim) = Σ (x − mean)² / (n − correction), over dims (all
    when None)."""
    dims = args[1] if len(args) > 1 else kw.get("dim")
    corr = kw.get("correction", args[2] if len(args) > 2 else 1)
    keep = kw.get("keepdim", args[3] if len(args) > 3 else False)
    return _var_of(cx, cx.v(args[0]), dims, corr, keep, _t(cx, node))


def _var_of(cx, x, dims, corr, keep, t):
    """var over dims (all when None or []) with correction (None: 1), of type t."""
    corr = 1 if corr is None else corr
    rank = len(x.shape)
    dims = list(range(rank)) if dims is None or dims == [] else [d % rank for d in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    if n - corr <= 0:
        raise Unsupported("var over %d elements with correction %s" % (n, corr))
    kshape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    mu = cx.g.node("mean", [x], [(x.dtype, kshape)], {"dims": dims, "keepdim": 1})
    dev = cx.g.node("sub", [x, mu], [(x.dtype, x.shape)])
    sq = cx.g.node("mul", [dev, dev], [(x.dtype, x.shape)])
    a = {"dims": dims}
    if keep:
        a["keepdim"] = 1
    s = cx.g.node("sum", [sq], [t], a)
    return cx.g.node("mul_scalar", [s], [t], {"value": 1.0 / (n - corr)})


# ---- decompositions of elementwise and reduction ops hp has no kernel of its own for ------------

# the float dtypes hp computes in, and their largest finite values
_FINITE_MAX = {"f32": 3.4028234663852886e38, "bf16": 3.3895313892515355e38, "f16": 65504.0}


def _lt(cx, a, b):
    return cx.g.node("lt", [a, b], [("bool", _bshape(a, b))])


def _bshape(a, b):
    """The broadcast shape of two values."""
    ra, rb = list(a.shape), list(b.shape)
    n = max(len(ra), len(rb))
    ra, rb = [1] * (n - len(ra)) + ra, [1] * (n - len(rb)) + rb
    return tuple(max(x, y) if min(x, y) != 0 else 0 for x, y in zip(ra, rb))


def _abs_of(cx, x):
    if x.dtype not in _FINITE_MAX:
        raise Unsupported("abs of a %s tensor" % x.dtype)
    t = (x.dtype, x.shape)
    return cx.g.node("where", [_lt(cx, x, cx.full(0.0, x.dtype)), cx.g.node("neg", [x], [t]), x],
                     [t])


def _abs(cx, node, args, kw):
    """abs(x) = where(x < 0, -x, x) (NaN stays NaN)."""
    return _abs_of(cx, cx.v(args[0]))


def _sign(cx, node, args, kw):
    """sign(x) = (0 < x) − (x < 0) in x's dtype (0 at 0; sgn is the same for real x)."""
    x, t = cx.v(args[0]), _t(cx, node)
    if x.dtype not in _FINITE_MAX:
        raise Unsupported("sign of a %s tensor" % x.dtype)
    zero = cx.full(0.0, x.dtype)
    pos = _as(cx, _lt(cx, zero, x), t[0])
    neg = _as(cx, _lt(cx, x, zero), t[0])
    return cx.g.node("sub", [pos, neg], [t])


def _minimum(cx, node, args, kw):
    """minimum(a, b) = −maximum(−a, −b): negation is exact, NaN propagates as in maximum."""
    t = _t(cx, node)
    a, b = _as(cx, cx.v(args[0]), t[0]), _as(cx, cx.v(args[1]), t[0])
    na = cx.g.node("neg", [a], [(t[0], a.shape)])
    nb = cx.g.node("neg", [b], [(t[0], b.shape)])
    return cx.g.node("neg", [cx.g.node("maximum", [na, nb], [t])], [t])


def _maximum(cx, node, args, kw):
    t = _t(cx, node)
    return cx.g.node("maximum", [_as(cx, cx.v(args[0]), t[0]), _as(cx, cx.v(args[1]), t[0])], [t])


def _reciprocal(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    return cx.g.node("div", [cx.full(1.0, t[0]), _as(cx, x, t[0])], [t])


def _reduce_dims(x, dims):
    rank = len(x.shape)
    if dims is None or len(dims) == 0:
        return list(range(rank))
    return sorted(d % rank for d in dims) if rank else []


def _logsumexp(cx, node, args, kw):
    """logsumexp(x, dims, keepdim) = m + log(Σ exp(x − m)), m = amax(x) clamped to the finite
    range: a row of −inf gives −inf (not NaN), +inf gives +inf, as torch's."""
    x, t = cx.v(args[0]), _t(cx, node)
    dims = _reduce_dims(x, args[1] if len(args) > 1 else kw.get("dim"))
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    if x.dtype not in _FINITE_MAX:
        raise Unsupported("logsumexp of %s" % x.dtype)
    kshape = tuple(1 if i in dims else n for i, n in enumerate(x.shape))
    kt = (x.dtype, kshape)
    m = cx.g.node("amax", [x], [kt], {"dims": dims, "keepdim": 1})
    big = _FINITE_MAX[x.dtype]
    hi, lo = cx.full(big, x.dtype), cx.full(-big, x.dtype)
    m = cx.g.node("where", [_lt(cx, hi, m), hi, m], [kt])
    m = cx.g.node("where", [_lt(cx, m, lo), lo, m], [kt])
    e = cx.g.node("exp", [cx.g.node("sub", [x, m], [(x.dtype, x.shape)])], [(x.dtype, x.shape)])
    s = cx.g.node("log", [cx.g.node("sum", [e], [kt], {"dims": dims, "keepdim": 1})], [kt])
    r = cx.g.node("add", [s, m], [kt])
    return r if keep else cx.g.node("view", [r], [t], {"shape": list(t[1])})


def _std(cx, node, args, kw):
    """std = sqrt(var), var as _var decomposes it."""
    v = _var(cx, node, args, kw)
    return cx.g.node("sqrt", [v], [_t(cx, node)])


def _norm(cx, node, args, kw):
    """The 2-norm (and 1-norm) over dims: sqrt(Σ x²), Σ |x|. Other orders are refused."""
    x, t = cx.v(args[0]), _t(cx, node)
    p = args[1] if len(args) > 1 else kw.get("p", 2)
    p = 2 if p is None else p
    dims = _reduce_dims(x, args[2] if len(args) > 2 else kw.get("dim"))
    keep = args[3] if len(args) > 3 else kw.get("keepdim", False)
    a = {"dims": dims}
    if keep:
        a["keepdim"] = 1
    if p == 1:
        return cx.g.node("sum", [_abs_of(cx, x)], [t], a)
    if p != 2:
        raise Unsupported("norm of order %s (hp takes 1 and 2)" % p)
    sq = cx.g.node("mul", [x, x], [(x.dtype, x.shape)])
    return cx.g.node("sqrt", [cx.g.node("sum", [sq], [t], a)], [t])


def _pad(cx, node, args, kw):
    """constant_pad_nd(x, pad, value): per dim from the last, a negative pad slices, a positive
    one concatenates a block of the value."""
    x, t = cx.v(args[0]), _t(cx, node)
    pad = list(args[1])
    value = args[2] if len(args) > 2 else kw.get("value", 0)
    y = x
    for k in range(len(pad) // 2):
        dim = len(x.shape) - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        n = y.shape[dim]
        start, end = max(0, -before), n - max(0, -after)
        if start > 0 or end < n:
            shape = list(y.shape)
            shape[dim] = max(0, end - start)
            y = cx.g.node("slice", [y], [(y.dtype, tuple(shape))],
                          {"dim": dim, "start": start, "end": max(start, end)})
        parts = []
        for amount in (before, after):
            if amount > 0:
                shape = list(y.shape)
                shape[dim] = amount
                parts.append(cx.g.node("full", [], [(y.dtype, tuple(shape))],
                                       {"shape": shape, "value": value, "dtype": y.dtype}))
            else:
                parts.append(None)
        if parts[0] is not None or parts[1] is not None:
            seq = [v for v in (parts[0], y, parts[1]) if v is not None]
            shape = list(y.shape)
            shape[dim] = sum(v.shape[dim] for v in seq)
            y = cx.g.node("cat", seq, [(y.dtype, tuple(shape))], {"dim": dim})
    if tuple(y.shape) != tuple(t[1]):
        raise Unsupported("constant_pad_nd to %s" % (t[1],))
    return y


def _roll(cx, node, args, kw):
    """roll(x, shifts, dims): per dim, the last `shift` elements moved to the front (a cat of
    two slices). A roll of the flattened tensor (no dims) is refused."""
    x = cx.v(args[0])
    shifts = list(args[1]) if isinstance(args[1], (list, tuple)) else [args[1]]
    dims = args[2] if len(args) > 2 else kw.get("dims", [])
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if len(dims) != len(shifts) or not dims:
        raise Unsupported("roll without a dim per shift")
    y = x
    for shift, dim in zip(shifts, dims):
        dim %= len(x.shape)
        n = y.shape[dim]
        s = shift % n if n else 0
        if s == 0:
            continue
        head = list(y.shape)
        head[dim] = s
        tail = list(y.shape)
        tail[dim] = n - s
        a = cx.g.node("slice", [y], [(y.dtype, tuple(head))], {"dim": dim, "start": n - s, "end": n})
        b = cx.g.node("slice", [y], [(y.dtype, tuple(tail))], {"dim": dim, "start": 0, "end": n - s})
        y = cx.g.node("cat", [a, b], [(y.dtype, tuple(y.shape))], {"dim": dim})
    return y


def _hardtanh(cx, node, args, kw):
    lo = args[1] if len(args) > 1 else kw.get("min_val", -1.0)
    hi = args[2] if len(args) > 2 else kw.get("max_val", 1.0)
    return _clamp(cx, node, [args[0], lo, hi], {})


def _hardtanh_backward(cx, node, args, kw):
    """grad where min < x < max, else 0 (torch's rule)."""
    g, x, lo, hi = cx.v(args[0]), cx.v(args[1]), args[2], args[3]
    t = _t(cx, node)
    above, below = _lt(cx, cx.full(lo, x.dtype), x), _lt(cx, x, cx.full(hi, x.dtype))
    inside = cx.g.node("where", [above, below, cx.full(False, "bool")], [("bool", x.shape)])
    return cx.g.node("where", [inside, g, cx.full(0.0, t[0])], [t])


def _elu(cx, node, args, kw):
    """scale · (x where x > 0, else alpha · (exp(input_scale · x) − 1))."""
    x, t = cx.v(args[0]), _t(cx, node)
    alpha, scale, iscale = (list(args[1:4]) + [1.0, 1.0, 1.0][len(args) - 1:])[:3]
    xs = cx.g.node("mul_scalar", [x], [t], {"value": iscale}) if iscale != 1 else x
    em1 = cx.g.node("add_scalar", [cx.g.node("exp", [xs], [t])], [t], {"value": -1.0})
    neg = cx.g.node("mul_scalar", [em1], [t], {"value": alpha * scale})
    pos = cx.g.node("mul_scalar", [x], [t], {"value": scale}) if scale != 1 else x
    return cx.g.node("where", [_lt(cx, cx.full(0.0, x.dtype), x), pos, neg], [t])


def _elu_backward(cx, node, args, kw):
    """grad · scale where the input (or result) > 0, else grad · alpha · scale · input_scale ·
    exp(input_scale · x) (from the result y: grad · input_scale · (y + alpha · scale))."""
    g, alpha, scale, iscale, is_result, xy = args[:6]
    g, xy, t = cx.v(g), cx.v(xy), _t(cx, node)
    if is_result:
        d = cx.g.node("mul_scalar", [cx.g.node("add_scalar", [xy], [t], {"value": alpha * scale})],
                      [t], {"value": iscale})
    else:
        xs = cx.g.node("mul_scalar", [xy], [t], {"value": iscale}) if iscale != 1 else xy
        d = cx.g.node("mul_scalar", [cx.g.node("exp", [xs], [t])], [t],
                      {"value": alpha * scale * iscale})
    neg = cx.g.node("mul", [g, d], [t])
    pos = cx.g.node("mul_scalar", [g], [t], {"value": scale}) if scale != 1 else g
    return cx.g.node("where", [_lt(cx, cx.full(0.0, xy.dtype), xy), pos, neg], [t])


def _mish(cx, node, args, kw):
    """x · tanh(softplus(x)), softplus with torch's threshold 20."""
    x, t = cx.v(args[0]), _t(cx, node)
    big = _lt(cx, cx.full(20.0, x.dtype), x)
    sp = cx.g.node("log", [cx.g.node("add_scalar", [cx.g.node("exp", [x], [t])], [t],
                                     {"value": 1.0})], [t])
    sp = cx.g.node("where", [big, x, sp], [t])
    return cx.g.node("mul", [x, cx.g.node("tanh", [sp], [t])], [t])


_APPROX = {"none": 0, "tanh": 1}


def _gelu(cx, node, args, kw):
    ap = kw.get("approximate", args[1] if len(args) > 1 else "none")
    return cx.g.node("gelu", [cx.v(args[0])], [_t(cx, node)], {"approximate": _APPROX[ap]})


def _gelu_backward(cx, node, args, kw):
    ap = kw.get("approximate", args[2] if len(args) > 2 else "none")
    return cx.g.node("gelu_backward", [cx.v(args[0]), cx.v(args[1])], [_t(cx, node)],
                     {"approximate": _APPROX[ap]})


def _threshold_backward(cx, node, args, kw):
    return cx.g.node("threshold_backward", [cx.v(args[0]), cx.v(args[1])], [_t(cx, node)],
                     {"value": args[2]})


def _reduce(op):
    def f(cx, node, args, kw):
        dims = list(args[1]) if len(args) > 1 and args[1] is not None else []
        keep = kw.get("keepdim", args[2] if len(args) > 2 else False)
        a = {"dims": dims}  # a dtype= is the output's: the input is cast to it below
        if keep:
            a["keepdim"] = 1
        t = _t(cx, node)  # a sum of bools counts them in i64, as torch's
        return cx.g.node(op, [_as(cx, cx.v(args[0]), t[0])], [t], a)
    return f


def _transpose(cx, node, args, kw):
    return cx.g.node("transpose", [cx.v(args[0])], [_t(cx, node)],
                     {"dim0": args[1], "dim1": args[2]})


def _permute(cx, node, args, kw):
    return cx.g.node("permute", [cx.v(args[0])], [_t(cx, node)], {"perm": list(args[1])})


def _dim_op(op):
    def f(cx, node, args, kw):
        return cx.g.node(op, [cx.v(args[0])], [_t(cx, node)], {"dim": args[1]})
    return f


def _slice(cx, node, args, kw):
    x = cx.v(args[0])
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    start = args[2] if len(args) > 2 else kw.get("start")
    end = args[3] if len(args) > 3 else kw.get("end")
    step = args[4] if len(args) > 4 else kw.get("step", 1)
    n = x.shape[dim]
    start = 0 if start is None else max(-n, min(start, n))
    end = n if end is None else max(-n, min(end, n))
    a = {"dim": dim, "start": start, "end": end}
    if step != 1:
        a["step"] = step
    return cx.g.node("slice", [x], [_t(cx, node)], a)


def _slice_backward(cx, node, args, kw):
    g, sizes, dim, start, end, step = args[:6]
    n = sizes[dim]
    a = {"shape": list(sizes), "dim": dim, "start": max(-n, min(start, n)),
         "end": max(-n, min(end, n))}
    if step != 1:
        a["step"] = step
    return cx.g.node("slice_backward", [cx.v(g)], [_t(cx, node)], a)


class _Split:
    """A split's pieces, emitted as slices when getitem asks for them."""
    def __init__(self, cx, x, dim, bounds, types):
        self.cx, self.x, self.dim, self.bounds, self.types = cx, x, dim, bounds, types
        self.done = {}

    def __getitem__(self, k):
        if k not in self.done:
            s, e = self.bounds[k]
            self.done[k] = self.cx.g.node("slice", [self.x], [self.types[k]],
                                          {"dim": self.dim, "start": s, "end": e})
        return self.done[k]


def _split(cx, node, args, kw):
    x = cx.v(args[0])
    dim = args[2] if len(args) > 2 else kw.get("dim", 0)
    dim = dim % len(x.shape)
    n = x.shape[dim]
    if isinstance(args[1], int):
        sizes = [min(args[1], n - s) for s in range(0, n, args[1])] or [0]
    else:
        sizes = list(args[1])
    bounds, at = [], 0
    for s in sizes:
        bounds.append((at, at + s))
        at += s
    return _Split(cx, x, dim, bounds, cx.types_of(node))


def _select_of(cx, x, dim, i, t):
    n = x.shape[dim]
    i = i + n if i < 0 else i
    if not 0 <= i < n:
        raise Unsupported("index %d out of range for dim %d of size %d" % (i, dim, n))
    shape = list(x.shape)
    shape[dim] = 1
    s = cx.g.node("slice", [x], [(x.dtype, tuple(shape))], {"dim": dim, "start": i, "end": i + 1})
    return cx.g.node("view", [s], [t], {"shape": t[1]})


def _select(cx, node, args, kw):
    x = cx.v(args[0])
    return _select_of(cx, x, args[1] % len(x.shape), args[2], _t(cx, node))


class _Unbind:
    """An unbind's pieces, each a select emitted when getitem asks for it."""
    def __init__(self, cx, x, dim, types):
        self.cx, self.x, self.dim, self.types = cx, x, dim, types
        self.done = {}

    def __getitem__(self, k):
        if k not in self.done:
            self.done[k] = _select_of(self.cx, self.x, self.dim, k, self.types[k])
        return self.done[k]


def _unbind(cx, node, args, kw):
    x = cx.v(args[0])
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    return _Unbind(cx, x, dim % len(x.shape), cx.types_of(node))


def _stack(cx, node, args, kw):
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    t = _t(cx, node)
    dim = dim % len(t[1])
    parts = []
    for a in args[0]:
        x = cx.v(a)
        shape = list(x.shape)
        shape.insert(dim, 1)
        parts.append(cx.g.node("view", [x], [(x.dtype, tuple(shape))], {"shape": shape}))
    if len(parts) == 1:
        return parts[0]
    return cx.g.node("cat", parts, [t], {"dim": dim})


# Ops whose output shares its input's storage (getitem of the multi-output ones takes a piece);
# an in-place op's output is its target too.
_ALIASING = {aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
             aten.alias.default, aten.detach.default, aten.expand.default, aten.slice.Tensor,
             aten.select.int, aten.squeeze.dim, aten.squeeze.default, aten.unsqueeze.default,
             aten.t.default, aten.transpose.int, aten.permute.default, aten.unbind.int,
             aten.split.Tensor, aten.split_with_sizes.default, aten.unsafe_split.Tensor,
             aten.unsafe_split_with_sizes.default, aten.chunk.default, aten.unsafe_chunk.default,
             aten.diagonal.default, aten.as_strided.default}


def _aliases_input(n):
    """The FX value n's output shares storage with (its first argument), or None."""
    if not _is_node(n) or n.op != "call_function":
        return None
    if n.target is operator.getitem:
        return n.args[0]
    name = getattr(getattr(n.target, "_schema", None), "name", "")
    if n.target in _ALIASING or (name.endswith("_") and not name.endswith("__")):
        return n.args[0] if n.args and _is_node(n.args[0]) else None
    return None


def _alias_family(n):
    """Every FX value sharing storage with n: up to the tensor that owns it, then down again,
    leaving out the other pieces of a split (or unbind) n is a piece of: they do not overlap."""
    root, piece = n, {}
    while _aliases_input(root) is not None:
        if root.target is operator.getitem:
            piece[root.args[0]] = root.args[1]
        root = _aliases_input(root)
    return _alias_descendants(root, piece)


def _alias_descendants(n, piece=None):
    seen, todo = {n}, [n]
    while todo:
        for u in todo.pop().users:
            if u in seen or _aliases_input(u) is None or u.args[0] not in seen:
                continue
            if u.target is operator.getitem and piece and u.args[0] in piece and \
                    u.args[1] != piece[u.args[0]]:
                continue
            seen.add(u)
            todo.append(u)
    return seen


def _inplace(f):
    """An in-place op as its functional form: right only when nothing reads what it overwrites
    afterwards, through the input or through any other view of the same storage (make_fx keeps
    the mutation, so a later reader would see new values; an RNN cell writes into the pieces of
    its unsafe_split gates). Reading the op's own result, or views of it, is fine."""
    def g(cx, node, args, kw):
        target = args[0]
        if _is_node(target):
            at = cx._order[node]
            family = _alias_family(target)
            fresh = _alias_descendants(node)  # the overwritten values, read as such
            for a in family - fresh:
                for u in a.users:
                    if u is not node and u not in family and cx._order.get(u, -1) > at:
                        raise Unsupported("in place on a value read afterwards%s"
                                          % ("" if a is target else " through another view"))
                if a is not target and a not in fresh and cx._order.get(a, -1) > at:
                    raise Unsupported("in place on a value read afterwards through another view")
        return f(cx, node, args, kw)
    return g


def _fill(cx, node, args, kw):
    t = _t(cx, node)
    if not isinstance(args[1], (int, float, bool)):
        raise Unsupported("a tensor fill value")
    return cx.g.node("full", [], [t], {"shape": t[1], "value": float(args[1]), "dtype": t[0]})


def _cat(cx, node, args, kw):
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    return cx.g.node("cat", [cx.v(a) for a in args[0]], [_t(cx, node)], {"dim": dim})


def _addmm(cx, node, args, kw):
    a = {}
    beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
    if beta != 1:
        a["beta"] = beta
    if alpha != 1:
        a["alpha"] = alpha
    return cx.g.node("addmm", [cx.v(x) for x in args[:3]], [_t(cx, node)], a)


def _baddbmm(cx, node, args, kw):
    """beta·input + alpha·(b1 @ b2), input broadcast (nn.MultiheadAttention's masked scores)."""
    beta = kw.get("beta", args[3] if len(args) > 3 else 1)
    alpha = kw.get("alpha", args[4] if len(args) > 4 else 1)
    t = _t(cx, node)
    prod = cx.g.node("bmm", [cx.v(args[1]), cx.v(args[2])], [t])
    if alpha != 1:
        prod = cx.g.node("mul_scalar", [prod], [t], {"value": alpha})
    if beta == 0:  # torch ignores input then, NaNs included
        return prod
    inp = cx.v(args[0])
    if beta != 1:
        inp = cx.g.node("mul_scalar", [inp], [(inp.dtype, inp.shape)], {"value": beta})
    return cx.g.node("add", [inp, prod], [t])


def _embedding(cx, node, args, kw):
    pad = args[2] if len(args) > 2 else kw.get("padding_idx", -1)
    if (args[3] if len(args) > 3 else kw.get("scale_grad_by_freq", False)):
        raise Unsupported("scale_grad_by_freq=True")
    a = {"padding_idx": pad} if pad != -1 else {}
    return cx.g.node("embedding", [cx.v(args[0]), cx.v(args[1])], [_t(cx, node)], a)


def _embedding_backward(cx, node, args, kw):
    g, idx, num, pad, scale = args[:5]
    if scale:
        raise Unsupported("scale_grad_by_freq=True")
    a = {"num_weights": num}
    if pad != -1:
        a["padding_idx"] = pad
    return cx.g.node("embedding_dense_backward", [cx.v(g), cx.v(idx)], [_t(cx, node)], a)


def _softmax(op):
    def f(cx, node, args, kw):
        if args[2]:
            raise Unsupported("half_to_float=True")
        return cx.g.node(op, [cx.v(args[0])], [_t(cx, node)], {"dim": args[1]})
    return f


def _softmax_backward(op):
    def f(cx, node, args, kw):
        return cx.g.node(op, [cx.v(args[0]), cx.v(args[1])], [_t(cx, node)], {"dim": args[2]})
    return f


def _nll(cx, node, args, kw):
    x, target, weight, reduction, ignore = args[:5]
    if weight is not None:
        raise Unsupported("class weights")
    return cx.g.node("nll_loss_forward", [cx.v(x), cx.v(target)], cx.types_of(node),
                     {"reduction": reduction, "ignore_index": ignore})


def _nll_backward(cx, node, args, kw):
    g, x, target, weight, reduction, ignore, total = args[:7]
    if weight is not None:
        raise Unsupported("class weights")
    return cx.g.node("nll_loss_backward", [cx.v(g), cx.v(x), cx.v(target), cx.v(total)],
                     [_t(cx, node)], {"reduction": reduction, "ignore_index": ignore})


def _nll_2d_flat(cx, x, target):
    """nll_loss2d's [N, C, H, W] scores and [N, H, W] targets as nll_loss's [N·H·W, C] and
    [N·H·W] (the class dim moved last)."""
    n, c, h, w = x.shape
    xp = cx.g.node("permute", [x], [(x.dtype, (n, h, w, c))], {"perm": [0, 2, 3, 1]})
    xr = cx.g.node("reshape", [xp], [(x.dtype, (n * h * w, c))], {"shape": [n * h * w, c]})
    tr = cx.g.node("reshape", [target], [(target.dtype, (n * h * w,))], {"shape": [n * h * w]})
    return xr, tr


def _nll2d(cx, node, args, kw):
    """F.cross_entropy of [N, C, d...] scores (torch views them as [N, C, 1, d]): nll_loss over
    the flattened positions; reduction 'none' is viewed back to [N, H, W]."""
    x, target, weight, reduction, ignore = args[:5]
    if weight is not None:
        raise Unsupported("class weights")
    x, target = cx.v(x), cx.v(target)
    if len(x.shape) != 4:
        raise Unsupported("nll_loss2d of a rank-%d input" % len(x.shape))
    xr, tr = _nll_2d_flat(cx, x, target)
    types = cx.types_of(node)
    flat = [(types[0][0], (tr.shape[0],) if reduction == 0 else ()), types[1]]
    out = cx.g.node("nll_loss_forward", [xr, tr], flat,
                    {"reduction": reduction, "ignore_index": ignore})
    if reduction != 0:
        return out
    return [cx.g.node("reshape", [out[0]], [types[0]], {"shape": list(types[0][1])}), out[1]]


def _nll2d_backward(cx, node, args, kw):
    g, x, target, weight, reduction, ignore, total = args[:7]
    if weight is not None:
        raise Unsupported("class weights")
    g, x, target = cx.v(g), cx.v(x), cx.v(target)
    if len(x.shape) != 4:
        raise Unsupported("nll_loss2d_backward of a rank-%d input" % len(x.shape))
    n, c, h, w = x.shape
    xr, tr = _nll_2d_flat(cx, x, target)
    if reduction == 0:
        g = cx.g.node("reshape", [g], [(g.dtype, (n * h * w,))], {"shape": [n * h * w]})
    gr = cx.g.node("nll_loss_backward", [g, xr, tr, cx.v(total)], [(x.dtype, xr.shape)],
                   {"reduction": reduction, "ignore_index": ignore})
    gp = cx.g.node("reshape", [gr], [(x.dtype, (n, h, w, c))], {"shape": [n, h, w, c]})
    return cx.g.node("permute", [gp], [_t(cx, node)], {"perm": [0, 3, 1, 2]})


# gather(x, -1, idx) with one index per row picks x[..., idx]: nll_loss (reduction none) is
# exactly −x[i, t_i] per row, with its kernels, sharding rules and gradient on every backend;
# its backward (scatter_add into zeros) is nll_loss_backward's −grad at [i, t_i]. An index
# outside [0, C) fails the step, naming the op, as torch's gather raises.
_NO_IGNORE = -(2 ** 62)


def _gather_rows(cx, x, dim, index, what):
    """x and index flattened to [rows, C] and [rows], for a gather along the last dim with one
    index per row; Unsupported otherwise."""
    rank = len(x.shape)
    if rank == 0 or dim % rank != rank - 1:
        raise Unsupported("%s along dim %s (hp takes the last dim)" % (what, dim))
    if x.dtype not in _FINITE_MAX:
        raise Unsupported("%s of a %s tensor" % (what, x.dtype))
    if tuple(index.shape) != tuple(x.shape[:-1]) + (1,):
        raise Unsupported("%s with index %s of %s (hp takes one index per row)"
                          % (what, list(index.shape), list(x.shape)))
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    c = x.shape[-1]
    xr = cx.g.node("reshape", [x], [(x.dtype, (rows, c))], {"shape": [rows, c]})
    ir = cx.g.node("reshape", [index], [(index.dtype, (rows,))], {"shape": [rows]})
    return xr, ir, rows


def _gather(cx, node, args, kw):
    x, dim, index = cx.v(args[0]), args[1], cx.v(args[2])
    xr, ir, rows = _gather_rows(cx, x, dim, index, "gather")
    nll = cx.g.node("nll_loss_forward", [xr, ir], [(x.dtype, (rows,)), (x.dtype, ())],
                    {"reduction": 0, "ignore_index": _NO_IGNORE})
    picked = cx.g.node("neg", [nll[0]], [(x.dtype, (rows,))])
    return cx.g.node("reshape", [picked], [_t(cx, node)], {"shape": list(index.shape)})


def _scatter_add(cx, node, args, kw):
    """scatter_add(self, -1, idx, src) with one index per row: self + the rows' src at idx."""
    base, dim, index, src = cx.v(args[0]), args[1], cx.v(args[2]), cx.v(args[3])
    if tuple(src.shape) != tuple(index.shape):
        raise Unsupported("scatter_add of src %s by index %s" % (list(src.shape),
                                                                 list(index.shape)))
    xr, ir, rows = _gather_rows(cx, base, dim, index, "scatter_add")
    g = cx.g.node("reshape", [src], [(src.dtype, (rows,))], {"shape": [rows]})
    g = cx.g.node("neg", [_as(cx, g, base.dtype)], [(base.dtype, (rows,))])
    one = cx.full(1.0, base.dtype)
    put = cx.g.node("nll_loss_backward", [g, xr, ir, one], [(base.dtype, xr.shape)],
                    {"reduction": 0, "ignore_index": _NO_IGNORE})
    put = cx.g.node("reshape", [put], [(base.dtype, base.shape)], {"shape": list(base.shape)})
    if args[0].target in (aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default):
        return put
    return cx.g.node("add", [base, put], [_t(cx, node)])


def _affine(cx, p, x, value):
    if p is not None:
        return cx.v(p)
    d = x.shape[-1]
    return cx.g.node("full", [], [(x.dtype, (d,))], {"shape": [d], "value": value,
                                                      "dtype": x.dtype})


def _layer_norm(cx, node, args, kw):
    x, shape, w, b, eps = args[:5]
    x = cx.v(x)
    if len(shape) != 1 or shape[0] != x.shape[-1]:
        raise Unsupported("normalized_shape %s (hp normalizes the last dim only)" % list(shape))
    ts = cx.types_of(node)
    stats = ("f32", tuple(list(x.shape[:-1]) + [1]))  # hp's statistics are f32, torch's x's
    y, mean, rstd = cx.g.node("native_layer_norm",
                              [x, _affine(cx, w, x, 1.0), _affine(cx, b, x, 0.0)],
                              [ts[0], stats, stats], {"eps": eps})
    return [y] + [_as(cx, v, t[0]) if t else v for v, t in ((mean, ts[1]), (rstd, ts[2]))]


def _layer_norm_backward(cx, node, args, kw):
    g, x, shape, mean, rstd, w, b = args[:7]
    xv = cx.v(x)
    if len(shape) != 1 or shape[0] != xv.shape[-1]:
        raise Unsupported("normalized_shape %s (hp normalizes the last dim only)" % list(shape))
    ws = cx.types_of(node)
    d = xv.shape[-1]
    types = [ws[0] if ws[0] else (xv.dtype, xv.shape), (xv.dtype, (d,)), (xv.dtype, (d,))]
    return cx.g.node("native_layer_norm_backward",
                     [cx.v(g), xv, _as(cx, cx.v(mean), "f32"), _as(cx, cx.v(rstd), "f32"),
                      _affine(cx, w, xv, 1.0)], types)


def _creation(op, value=None):
    def f(cx, node, args, kw):
        t = _t(cx, node)
        a = {"shape": t[1], "dtype": t[0]}
        if op == "full":
            a["value"] = args[1] if value is None else value
        return cx.g.node(op, [], [t], a)
    return f


def _like(op):
    def f(cx, node, args, kw):
        t = _t(cx, node)
        a = {"shape": t[1], "dtype": t[0]}
        if op == "full":
            a["value"] = args[1]
        return cx.g.node(op, [], [t], a)
    return f


def _tril(cx, node, args, kw):
    k = args[1] if len(args) > 1 else kw.get("diagonal", 0)
    return cx.g.node("tril", [cx.v(args[0])], [_t(cx, node)], {"diagonal": k} if k else {})


def _triu(cx, node, args, kw):
    """triu(x, k) = where(tril(ones, k - 1) == 1, 0, x): hp has tril only (the mask over the
    last two dims, broadcast; the causal additive mask triu(full(-inf), 1) comes out of it)."""
    k = args[1] if len(args) > 1 else kw.get("diagonal", 0)
    t = _t(cx, node)
    d, shape = t[0], tuple(t[1][-2:])
    ones = cx.g.node("ones", [], [(d, shape)], {"shape": list(shape), "dtype": d})
    below = cx.g.node("tril", [ones], [(d, shape)], {"diagonal": k - 1} if k != 1 else {})
    drop = cx.g.node("eq", [below, cx.full(1, d)], [("bool", shape)])
    return cx.g.node("where", [drop, cx.full(0, d), cx.v(args[0])], [t])


def _masked_fill(cx, node, args, kw):
    x, mask, value = cx.v(args[0]), cx.v(args[1]), args[2]
    return cx.g.node("where", [mask, cx.full(value, x.dtype), x], [_t(cx, node)])


def _where(cx, node, args, kw):
    c = cx.v(args[0])
    t = _t(cx, node)
    a, b = _operand(cx, args[1], t[0]), _operand(cx, args[2], t[0])
    return cx.g.node("where", [c, a, b], [t])


# ---- masks whose values the data fixes -------------------------------------------------------
#
# The data loader fills `tokens` and `labels` with token ids, never negative: `labels == -100`
# (cross entropy's ignore_index) is false everywhere, whatever the batch. torch 1.13 records
# label smoothing's loss with such masks and ops whose output size depends on the mask
# (masked_select, masked_scatter); with the mask's values known they are views.

_VIEWS = {aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
          aten.clone.default, aten.detach.default, aten.alias.default, aten.expand.default,
          aten.slice.Tensor, aten.select.int, aten.squeeze.dim, aten.unsqueeze.default,
          aten.t.default, aten.transpose.int, aten.permute.default}


def _token_ids(cx, a):
    """Whether FX value a is (a view of) the tokens or labels the loader fills."""
    while _is_node(a) and a.op == "call_function" and a.target in _VIEWS:
        a = a.args[0]
    return _is_node(a) and a in cx.token_inputs


def _known_mask(cx, a):
    """True / False when bool FX value a is that everywhere for any batch, else None."""
    return cx.known_masks.get(a) if _is_node(a) else None


def _eq_scalar(cx, node, args, kw):
    v = _compare("eq")(cx, node, args, kw)
    if _token_ids(cx, args[0]) and isinstance(args[1], (int, float)) and args[1] < 0:
        cx.known_masks[node] = False  # a token id is never negative
    return v


def _ne(cx, node, args, kw):
    """a != b: not (a == b) (a NaN compares unequal in both)."""
    t = _t(cx, node)
    a = cx.v(args[0])
    e = cx.g.node("eq", [a, _operand(cx, args[1], a.dtype)], [t])
    v = cx.g.node("bitwise_not", [e], [t])
    if _token_ids(cx, args[0]) and isinstance(args[1], (int, float)) and args[1] < 0:
        cx.known_masks[node] = True  # a token id is never negative
    return v


def _not(cx, node, args, kw):
    v = cx.g.node("bitwise_not", [cx.v(args[0])], [_t(cx, node)])
    m = _known_mask(cx, args[0])
    if m is not None:
        cx.known_masks[node] = not m
    return v


def _index_put(cx, node, args, kw):
    """x[mask] = value with one bool mask of x's shape and a scalar value: where(mask, value,
    x) (x + value where accumulating); x[..., idx] += values by an integer index:
    aten_extra.index_put_by_index. Other index forms are refused."""
    from .aten_extra import index_put_by_index  # x[..., idx] += v: aten_extra's
    by_index = index_put_by_index(cx, node, args, kw)
    if by_index is not None:
        return by_index
    x, indices, value = args[0], args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kw.get("accumulate", False)
    t = _t(cx, node)
    if len(indices) != 1 or not _is_node(indices[0]):
        raise Unsupported("index_put with other than one mask")
    m = indices[0]
    mt = _t(cx, m)
    if mt[0] != "bool" or tuple(mt[1]) != tuple(t[1]):
        raise Unsupported("index_put with an index that is not a bool mask of the input's shape")
    if not _is_node(value) or _t(cx, value)[1] != ():
        raise Unsupported("index_put of a tensor of values (only a scalar)")
    if _known_mask(cx, m) is False:
        return cx.v(x)  # nothing is written
    xv = cx.v(x)
    val = cx.v(value)
    if val.dtype != t[0]:
        val = cx.g.node("_to_copy", [val], [(t[0], ())], {"dtype": t[0]})
    if accumulate:
        val = cx.g.node("add", [xv, val], [t])
    return cx.g.node("where", [cx.v(m), val, xv], [t])


def _masked_select(cx, node, args, kw):
    x, m = args[0], args[1]
    xt, t = _t(cx, x), _t(cx, node)
    if _known_mask(cx, m) is not True or tuple(_t(cx, m)[1]) != tuple(xt[1]):
        raise Unsupported("its output's size depends on the mask's values")
    return cx.g.node("view", [cx.v(x)], [t], {"shape": list(t[1])})


def _masked_scatter(cx, node, args, kw):
    m, src = args[1], args[2]
    t = _t(cx, node)
    n = 1
    for d in t[1]:
        n *= d
    st = _t(cx, src)
    sn = 1
    for d in st[1]:
        sn *= d
    if _known_mask(cx, m) is not True or tuple(_t(cx, m)[1]) != tuple(t[1]) or sn != n:
        raise Unsupported("where it writes depends on the mask's values")
    return cx.g.node("view", [cx.v(src)], [t], {"shape": list(t[1])})


def _arange(cx, node, args, kw):
    t = _t(cx, node)
    if node.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else kw.get("step", 1)
    if not all(isinstance(v, int) for v in (start, end, step)):
        raise Unsupported("non-integer bounds")
    if step < 0:
        # hp's arange counts up: start + step · arange(n), in f32 (exact below 2^24)
        n = t[1][0]
        if max(abs(start), abs(end)) >= 1 << 24:
            raise Unsupported("a descending arange past 2^24")
        up = cx.g.node("arange", [], [("f32", (n,))], {"start": 0, "end": n, "dtype": "f32"})
        v = cx.g.node("add_scalar", [cx.g.node("mul_scalar", [up], [("f32", (n,))],
                                               {"value": float(step)})],
                      [("f32", (n,))], {"value": float(start)})
        return _as(cx, v, t[0])
    a = {"start": start, "end": end, "dtype": t[0]}
    if step != 1:
        a["step"] = step
    return cx.g.node("arange", [], [t], a)


def _to_copy(cx, node, args, kw):
    t = _t(cx, node)
    return cx.g.node("_to_copy", [cx.v(args[0])], [t], {"dtype": t[0]})


def _dropout_name(cx, node):
    """The mask's stream name: the module path and the dropout's index within it, in trace
    order (the same in a joint capture and a forward-only one)."""
    path = cx.cap.paths.get(node) or "(model)"
    seen = cx.__dict__.setdefault("_dropouts", {})
    k = seen.get(path, 0)
    seen[path] = k + 1
    return "%s#%d" % (path, k)


def _dropout_node(cx, node, x, p):
    if not 0 < p < 1:
        raise Unsupported("p=%g (hp drops with p in [0, 1))" % p)
    xv = cx.v(x)
    return cx.g.node("native_dropout", [xv], [(xv.dtype, xv.shape), ("bool", xv.shape)],
                     {"p": float(p), "fqn": _dropout_name(cx, node)})


def _dropout(cx, node, args, kw):
    x, p, train = args[0], args[1], args[2]
    if not train or p == 0:
        xv = cx.v(x)
        mask = cx.g.node("ones", [], [("bool", xv.shape)], {"shape": xv.shape, "dtype": "bool"})
        return [xv, mask]
    return _dropout_node(cx, node, x, p)


def _dropout_backward(cx, node, args, kw):
    g, mask, scale = args[0], args[1], args[2]
    if scale == 1:  # p = 0: the mask is all ones
        return cx.v(g)
    return cx.g.node("native_dropout_backward", [cx.v(g), cx.v(mask)], [_t(cx, node)],
                     {"scale": float(scale)})


def _bernoulli(cx, node, args, kw):
    """aten.dropout on the CPU decomposes to mul(x, div_(bernoulli_(empty_like(x), 1 - p),
    1 - p)) (the backward: mul(grad, that)): the keep mask is hp's native_dropout mask of x,
    cast to x's dtype; the division and products stay as traced."""
    target, q = args[0], args[1] if len(args) > 1 else kw.get("p", 0.5)
    if not (_is_node(target) and target.target == aten.empty_like.default and
            len(target.users) == 1):
        raise Unsupported("bernoulli_ outside dropout's pattern (hp draws only dropout masks)")
    if not isinstance(q, (int, float)):
        raise Unsupported("a tensor probability")
    t = _t(cx, node)
    if q == 1:
        return cx.g.node("ones", [], [t], {"shape": t[1], "dtype": t[0]})
    mask = _dropout_node(cx, node, target.args[0], 1.0 - q)[1]
    return cx.g.node("_to_copy", [mask], [t], {"dtype": t[0]})


def _getitem(cx, node, args, kw):
    seq = cx.value_of(args[0])
    return seq[args[1]]


TABLE = {
    operator.getitem: _getitem,
    aten.t.default: _one("t"),
    aten.mm.default: _one("mm"),
    aten.bmm.default: _one("bmm"),
    aten.addmm.default: _addmm,
    aten.baddbmm.default: _baddbmm,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.view.default: _shape_op("view"),
    aten._unsafe_view.default: _shape_op("view"),
    aten._reshape_alias.default: _reshape_alias,
    aten.expand.default: _shape_op("expand"),
    aten.clone.default: _one("clone"),
    aten.detach.default: _detach,
    aten.alias.default: _fold,
    aten.unsqueeze.default: _dim_op("unsqueeze"),
    aten.squeeze.dim: _dim_op("squeeze"),
    aten.slice.Tensor: _slice,
    aten.slice_backward.default: _slice_backward,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.select.int: _select,
    aten.unbind.int: _unbind,
    aten.stack.default: _stack,
    aten.empty_like.default: _like("zeros"),
    aten.fill_.Scalar: _inplace(_fill),
    aten.add_.Tensor: _inplace(_binary("add", "add_scalar")),
    aten.sub_.Tensor: _inplace(_binary("sub", None)),
    aten.mul_.Tensor: _inplace(_binary("mul", "mul_scalar")),
    aten.div_.Tensor: _inplace(_binary("div", None)),
    aten.div_.Scalar: _inplace(_binary("div", None)),
    aten.bernoulli_.float: _inplace(_bernoulli),
    aten.add.Tensor: _binary("add", "add_scalar"),
    aten.sub.Tensor: _binary("sub", None),
    aten.mul.Tensor: _binary("mul", "mul_scalar"),
    aten.div.Tensor: _binary("div", None),
    aten.add.Scalar: _binary("add", "add_scalar"),
    aten.sub.Scalar: _binary("sub", None),
    aten.mul.Scalar: _mul_scalar,
    aten.div.Scalar: _binary("div", None),
    aten.rsub.Scalar: _rsub,
    aten.pow.Tensor_Scalar: _pow,
    aten.maximum.default: _maximum,
    aten.minimum.default: _minimum,
    aten.abs.default: _abs,
    aten.sign.default: _sign,
    aten.sgn.default: _sign,
    aten.reciprocal.default: _reciprocal,
    aten.logsumexp.default: _logsumexp,
    aten.std.correction: _std,
    aten.std.dim: _std,
    aten.norm.ScalarOpt_dim: _norm,
    aten.constant_pad_nd.default: _pad,
    aten.roll.default: _roll,
    aten.hardtanh.default: _hardtanh,
    aten.hardtanh_backward.default: _hardtanh_backward,
    aten.elu.default: _elu,
    aten.elu_backward.default: _elu_backward,
    aten.mish.default: _mish,
    aten.masked_fill_.Scalar: _inplace(_masked_fill),
    aten.eq.Tensor: _compare("eq"),
    aten.eq.Scalar: _eq_scalar,
    aten.ne.Tensor: _ne,
    aten.ne.Scalar: _ne,
    aten.lt.Tensor: _compare("lt"),
    aten.lt.Scalar: _compare("lt"),
    aten.gt.Tensor: _not_compare("lt", True),
    aten.gt.Scalar: _not_compare("lt", True),
    aten.ge.Tensor: _not_compare("not", False),
    aten.ge.Scalar: _not_compare("not", False),
    aten.le.Tensor: _not_compare("not", True),
    aten.le.Scalar: _not_compare("not", True),
    aten.logical_and.default: _logical_and,
    aten.logical_and_.default: _inplace(_logical_and),
    aten.scalar_tensor.default: _scalar_tensor,
    aten.clamp.default: _clamp,
    aten.clamp.Tensor: _clamp,
    aten.clamp_min.default: _clamp_min,
    aten.clamp_max.default: _clamp_max,
    aten.leaky_relu.default: _leaky_relu,
    aten.leaky_relu_backward.default: _leaky_relu_backward,
    aten.softplus.default: _softplus,
    aten.softplus_backward.default: _softplus_backward,
    aten.var.correction: _var,
    aten.var.dim: _var,
    aten.where.self: _where,
    aten.neg.default: _one("neg"),
    aten.exp.default: _one("exp"),
    aten.log.default: _one("log"),
    aten.sqrt.default: _one("sqrt"),
    aten.rsqrt.default: _one("rsqrt"),
    aten.tanh.default: _one("tanh"),
    aten.sin.default: _one("sin"),
    aten.cos.default: _one("cos"),
    aten.erf.default: _one("erf"),
    aten.sigmoid.default: _one("sigmoid"),
    aten.silu.default: _one("silu"),
    aten.relu.default: _one("relu"),
    aten.gelu.default: _gelu,
    aten.tanh_backward.default: _one("tanh_backward"),
    aten.sigmoid_backward.default: _one("sigmoid_backward"),
    aten.silu_backward.default: _one("silu_backward"),
    aten.gelu_backward.default: _gelu_backward,
    aten.threshold_backward.default: _threshold_backward,
    aten.sum.dim_IntList: _reduce("sum"),
    aten.sum.default: _reduce("sum"),
    aten.mean.dim: _reduce("mean"),
    aten.mean.default: _reduce("mean"),
    aten.amax.default: _reduce("amax"),
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
    aten._softmax.default: _softmax("_softmax"),
    aten._log_softmax.default: _softmax("_log_softmax"),
    aten._softmax_backward_data.default: _softmax_backward("_softmax_backward_data"),
    aten._log_softmax_backward_data.default: _softmax_backward("_log_softmax_backward_data"),
    aten.nll_loss_forward.default: _nll,
    aten.nll_loss_backward.default: _nll_backward,
    aten.nll_loss2d_forward.default: _nll2d,
    aten.gather.default: _gather,
    aten.scatter_add.default: _scatter_add,
    aten.new_zeros.default: _creation("zeros"),
    aten.nll_loss2d_backward.default: _nll2d_backward,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.ones.default: _creation("ones"),
    aten.zeros.default: _creation("zeros"),
    aten.full.default: _creation("full"),
    aten.ones_like.default: _like("ones"),
    aten.zeros_like.default: _like("zeros"),
    aten.full_like.default: _like("full"),
    aten.tril.default: _tril,
    aten.triu.default: _triu,
    aten.bitwise_not.default: _not,
    aten.logical_not.default: _not,
    aten.index_put_.default: _inplace(_index_put),
    aten.index_put.default: _index_put,
    aten.masked_select.default: _masked_select,
    aten.masked_scatter.default: _masked_scatter,
    aten.lift_fresh_copy.default: _fold,
    aten.masked_fill.Scalar: _masked_fill,
    aten.arange.default: _arange,
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
    aten._to_copy.default: _to_copy,
    aten.native_dropout.default: _dropout,
    aten.native_dropout_backward.default: _dropout_backward,
}


def op_name(target):
    """`aten.convolution` for the listing (the overload dropped), or the Python name."""
    if target is operator.getitem:
        return "getitem"
    s = str(target)
    parts = s.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return "aten." + parts[1]
    return s
