"""Decompositions of ATen ops models beyond the GPT and the Llama write (regression and
distillation losses, gated units, elementwise math, boolean logic, max over a dim) into hp's
ops (graph/ops.def), beside aten_map.py and aten_extra.py; hp_export looks an op up in all
three.

  exp2(x), log2(x), log10(x)          exp(x · ln 2), log(x) / ln 2, log(x) / ln 10
  pow(c, x) (a scalar base c > 0)     exp(x · ln c)
  pow(a, b) of two tensors            exp(b · ln|a|), negated for a < 0 and an odd whole b, NaN
                                      for a < 0 and a fractional b, 1 where b = 0
  fmod(a, b), remainder(a, b)         a − trunc(a/b) · b, kept within |b| with a's sign
                                      (remainder: then b's); floats
  div(a, b, rounding_mode)            trunc or floor of the quotient; floats
  prod(x[, dim]), cumprod(x, dim)     pairwise products, log2(n) levels; cumprod a scan of
                                      log2(n) rounds of y · (y shifted in by ones): exact where
                                      torch's is, in another order (to rounding)
  atan, asin, acos, atan2             Cephes' single-precision range reductions and
                                      polynomials (≈ 1e-7); atan2 atan(y/x) with the quadrant
  sinh(x), cosh(x)                    (eˣ ∓ e⁻ˣ) / 2; sinh by its Taylor polynomial to x⁷ where
                                      |x| < 0.1 (the difference cancels there)
  celu(x, α)                          elu with input scale 1/α (its backward is elu_backward)
  floor, ceil, trunc, round           through an i64 cast (|x| < 2^23; larger floats are whole);
                                      round half to even, as torch
  isnan(x), nan_to_num(x, n, p, m)    not (x == x); NaN to n, ±inf to p / m (default: the
                                      dtype's largest finite values); isinf |x| == inf
  logaddexp(a, b)                     max + log1p(e^−|a − b|) (the same infinity stays)
  softshrink, hardshrink (+ backward) x ∓ λ beyond ±λ (hard: x), else 0; grad beyond ±λ
  prelu(x, w) (+ backward)            where(x < 0, w · x, x), w over dim 1; Σ grad · x below 0
  index_fill(x, dim, idx, v)          where(the position is one idx names, v, x)
  new_ones, new_full, new_empty,      ones, full, zeros; a view
  squeeze() (every unit dim)
  bitwise_and/or/xor, logical_or      of bools: where(a, b, false), where(a, true, b),
                                      where(a, not b, b)
  any(x, dim), all(x, dim)            of bools: 0 < amax(x as f32); not any(not x)
  glu(x, dim) (+ backward)            a · σ(b) of x's two halves along dim; the backward's
                                      halves grad · σ(b) and grad · a · σ(b)(1 − σ(b))
  addcmul, addcdiv, lerp              x + v · a · b, x + v · a / b, x + w · (y − x)
  var_mean(x, dims, correction)       aten_map's var, and the mean
  max/min(x, dim) → (values, index)   amax (min: −amax(−x)); the index the first position
                                      holding it, as torch's (counted in f32: dims < 2^24)
  argmax/argmin(x, dim)               that index alone (flattened when dim is None)
  max/min(x)                          amax over every dim
  scatter(x, dim, idx, src | value)   with one index along dim (max/min's backward, one-hot
                                      labels by scatter_(1, y, 1)): where(position == idx,
                                      src, x)
  mse_loss, smooth_l1_loss,           their formulas, reduction none / mean / sum, and the
  huber_loss (+ backwards)            backwards as torch's
  xlogy(x, y)                         where(x == 0 and y is not NaN, 0, x · log y) (kl_div)
  binary_cross_entropy (+ backward)   −w (y · max(log p, −100) + (1 − y) · max(log(1 − p),
                                      −100)); backward grad · w · (p − y) / max(p(1 − p), 1e-12)
  binary_cross_entropy_with_logits    (1 − y) · x + (1 + (pw − 1) · y) · (log1p(e^−|x|) +
                                      max(−x, 0)), times weight (its backward torch records
                                      as elementwise ops)
  sqrt_, log_, clamp_min_, logical_or_, scatter_, sigmoid_, tanh_, relu_, silu_, exp_,
  neg_, gelu_, clamp_, mul_/add_ (scalar), transpose_, t_, squeeze_, unsqueeze_   in place,
                                      as their functional forms when nothing reads the
                                      overwritten values afterwards (through any view)
  unsafe_split(_with_sizes)           split (an RNN's gates)
"""
import math

import torch

from . import aten_map
from .aten_extra import _float, _log1p_of, _numel
from .aten_map import Unsupported, _FINITE_MAX, _as, _inplace, _lt, _operand, _t

aten = torch.ops.aten


def _n(cx, op, ins, t, attrs=None):
    return cx.g.node(op, ins, [t], attrs)


def _scaled(cx, x, c):
    t = (x.dtype, x.shape)
    return _n(cx, "mul_scalar", [x], t, {"value": c})


# ---- elementwise math ---------------------------------------------------------------------------

def _exp_scaled(c):
    def f(cx, node, args, kw):
        x = cx.v(args[0])
        _float(x, "exp2")
        return _n(cx, "exp", [_scaled(cx, x, c)], _t(cx, node))
    return f


def _log_scaled(c, what):
    def f(cx, node, args, kw):
        x = cx.v(args[0])
        _float(x, what)
        return _scaled(cx, _n(cx, "log", [x], (x.dtype, x.shape)), c)
    return f


def _pow_scalar(cx, node, args, kw):
    base, x, t = args[0], cx.v(args[1]), _t(cx, node)
    _float(x, "pow of a scalar base")
    if not isinstance(base, (int, float)) or base <= 0:
        raise Unsupported("pow of the scalar base %r (hp takes a positive base)" % (base,))
    return _n(cx, "exp", [_scaled(cx, x, math.log(base))], t)


def _pow_tensors(cx, node, args, kw):
    """pow(a, b) of two tensors: exp(b · log|a|), negated for a negative a and an odd whole b,
    NaN for a negative a and a fractional b, 1 where b is 0 (0⁰ too), as torch's."""
    a, t = cx.v(args[0]), _t(cx, node)
    _float(a, "pow")
    a = _as(cx, a, t[0])
    b = _as(cx, aten_map._operand(cx, args[1], t[0]), t[0])
    la = _n(cx, "log", [aten_map._abs_of(cx, a)], (a.dtype, a.shape))
    p = _n(cx, "exp", [_n(cx, "mul", [b, la], t)], t)
    zero = cx.full(0.0, t[0])
    neg = _lt(cx, a, zero)
    whole = _n(cx, "eq", [b, _trunc_of(cx, b)], ("bool", b.shape))
    half = _scaled(cx, b, 0.5)
    odd = _n(cx, "bitwise_not", [_n(cx, "eq", [half, _trunc_of(cx, half)], ("bool", b.shape))],
             ("bool", b.shape))
    p = _n(cx, "where", [_n(cx, "where", [neg, odd, cx.full(False, "bool")], ("bool", t[1])),
                         _n(cx, "neg", [p], t), p], t)
    bad = _n(cx, "where", [neg, _n(cx, "bitwise_not", [whole], ("bool", b.shape)),
                           cx.full(False, "bool")], ("bool", t[1]))
    p = _n(cx, "where", [bad, cx.full(float("nan"), t[0]), p], t)
    return _n(cx, "where", [_n(cx, "eq", [b, zero], ("bool", b.shape)), cx.full(1.0, t[0]), p], t)


def _trunc_of(cx, x):
    t = (x.dtype, x.shape)
    up = _n(cx, "neg", [_floor_of(cx, _n(cx, "neg", [x], t))], t)
    return _n(cx, "where", [_lt(cx, x, cx.full(0.0, x.dtype)), up, _floor_of(cx, x)], t)


def _mod(which):
    """fmod (the sign of a) and remainder (the sign of b) of floats, as torch's: a − trunc(a/b)·b,
    brought into (−|b|, |b|) with a's sign where the quotient rounded across a whole number
    (by adding or taking off |b|); remainder then adds b where the sign is not b's; a for an
    infinite b. Only the quotient rounds, so a result differs from torch's exact one by a
    rounding of a, or by b where that lands it on the other side of a multiple of b."""
    def f(cx, node, args, kw):
        a, t = cx.v(args[0]), _t(cx, node)
        _float(a, which)
        a = _as(cx, a, t[0])
        b = _as(cx, aten_map._operand(cx, args[1], t[0]), t[0])
        q = _n(cx, "div", [a, b], t)
        r = _n(cx, "sub", [a, _n(cx, "mul", [_trunc_of(cx, q), b], t)], t)
        zero = cx.full(0.0, t[0])
        ab = aten_map._abs_of(cx, b)
        sa = _n(cx, "where", [_lt(cx, a, zero), _n(cx, "neg", [ab], (ab.dtype, ab.shape)), ab],
                t)  # |b| with a's sign
        flip = _lt(cx, _n(cx, "mul", [r, a], t), zero)
        r = _n(cx, "where", [flip, _n(cx, "add", [r, sa], t), r], t)
        over = _n(cx, "bitwise_not", [_lt(cx, aten_map._abs_of(cx, r), ab)], ("bool", t[1]))
        over = _n(cx, "where", [_n(cx, "eq", [r, r], ("bool", t[1])), over,
                                cx.full(False, "bool")], ("bool", t[1]))  # not for a NaN
        r = _n(cx, "where", [over, _n(cx, "sub", [r, sa], t), r], t)
        r = _n(cx, "where", [_n(cx, "eq", [ab, cx.full(float("inf"), t[0])], ("bool", ab.shape)),
                             a, r], t)
        if which == "fmod":
            return r
        off = _lt(cx, _n(cx, "mul", [r, b], t), zero)
        return _n(cx, "where", [off, _n(cx, "add", [r, b], t), r], t)
    return f


def _div_mode(cx, node, args, kw):
    """div(a, b, rounding_mode=None | 'trunc' | 'floor') of floats (fmod's backward records
    the trunc one)."""
    mode = kw.get("rounding_mode", args[2] if len(args) > 2 else None)
    a, t = cx.v(args[0]), _t(cx, node)
    if mode is not None and a.dtype not in _FINITE_MAX:
        raise Unsupported("div with rounding_mode=%r of a %s tensor (hp rounds floats)"
                          % (mode, a.dtype))
    q = _n(cx, "div", [_as(cx, a, t[0]), _as(cx, aten_map._operand(cx, args[1], t[0]), t[0])],
           t)
    if mode is None:
        return q
    if mode not in ("trunc", "floor"):
        raise Unsupported("div with rounding_mode=%r" % mode)
    return _trunc_of(cx, q) if mode == "trunc" else _floor_of(cx, q)


# ---- products and inverse trigonometry ---------------------------------------------------------

def _halve(cx, y, dim, op):
    """y along dim reduced by op (mul) pairwise, log2(n) levels: exact where torch's is, in
    another order (so to rounding)."""
    n = y.shape[dim]
    while n > 1:
        h = n // 2
        shape = list(y.shape)
        shape[dim] = h
        a = _n(cx, "slice", [y], (y.dtype, tuple(shape)), {"dim": dim, "start": 0, "end": h})
        b = _n(cx, "slice", [y], (y.dtype, tuple(shape)), {"dim": dim, "start": h, "end": 2 * h})
        z = _n(cx, op, [a, b], (y.dtype, tuple(shape)))
        if n % 2:
            last = list(y.shape)
            last[dim] = 1
            tail = _n(cx, "slice", [y], (y.dtype, tuple(last)), {"dim": dim, "start": n - 1,
                                                                 "end": n})
            shape[dim] = h + 1
            z = _n(cx, "cat", [z, tail], (y.dtype, tuple(shape)), {"dim": dim})
        y, n = z, shape[dim]
    return y


def _prod(cx, node, args, kw):
    """prod(x) and prod(x, dim, keepdim): pairwise products over the dim (a flattened x)."""
    x, t = cx.v(args[0]), _t(cx, node)
    x = _as(cx, x, t[0])
    if node.target == aten.prod.default:
        n = _numel(x.shape)
        x = _n(cx, "reshape", [x], (x.dtype, (n,)), {"shape": [n]})
        dim = 0
    else:
        dim = args[1] % max(len(x.shape), 1)
    if not x.shape:
        return x
    if x.shape[dim] == 0:
        return _n(cx, "ones", [], t, {"shape": list(t[1]), "dtype": t[0]})
    y = _halve(cx, x, dim, "mul")
    return _n(cx, "reshape", [y], t, {"shape": list(t[1])})


def _cumprod(cx, node, args, kw):
    """cumprod(x, dim): log2(n) rounds of y · (y shifted by d along dim, ones shifted in)."""
    x, t = cx.v(args[0]), _t(cx, node)
    y = _as(cx, x, t[0])  # a dtype= is the output's
    if not y.shape:
        return y
    dim = args[1] % len(y.shape)
    n, d = y.shape[dim], 1
    while d < n:
        ones = list(y.shape)
        ones[dim] = d
        head = _n(cx, "ones", [], (y.dtype, tuple(ones)), {"shape": ones, "dtype": y.dtype})
        keep = list(y.shape)
        keep[dim] = n - d
        body = _n(cx, "slice", [y], (y.dtype, tuple(keep)), {"dim": dim, "start": 0, "end": n - d})
        shifted = _n(cx, "cat", [head, body], (y.dtype, tuple(y.shape)), {"dim": dim})
        y = _n(cx, "mul", [y, shifted], (y.dtype, tuple(y.shape)))
        d *= 2
    return y


def _poly(cx, z, coeffs):
    """((c0 z + c1) z + c2) ... as nodes (Horner)."""
    t = (z.dtype, z.shape)
    acc = _scaled(cx, z, coeffs[0])
    for c in coeffs[1:-1]:
        acc = _n(cx, "mul", [_n(cx, "add_scalar", [acc], t, {"value": c}), z], t)
    return _n(cx, "add_scalar", [acc], t, {"value": coeffs[-1]})


def _atan_of(cx, x):
    """Cephes' atanf: reduced to |x| ≤ tan(π/8) by π/2 − atan(1/x) above tan(3π/8) and
    π/4 + atan((x − 1)/(x + 1)) above tan(π/8), then an odd polynomial (≈ 1e-7 relative)."""
    t = (x.dtype, x.shape)
    a = aten_map._abs_of(cx, x)
    big = _lt(cx, cx.full(2.414213562373095, x.dtype), a)
    mid = _lt(cx, cx.full(0.4142135623730950, x.dtype), a)
    one = cx.full(1.0, x.dtype)
    safe = _n(cx, "where", [big, a, one], t)  # no division by 0 on the lanes not taken
    r = _n(cx, "where", [big, _n(cx, "neg", [_n(cx, "div", [one, safe], t)], t),
                         _n(cx, "where", [mid, _n(cx, "div", [_n(cx, "add_scalar", [a], t,
                                                                   {"value": -1.0}),
                                                              _n(cx, "add_scalar", [a], t,
                                                                 {"value": 1.0})], t), a], t)], t)
    base = _n(cx, "where", [big, cx.full(math.pi / 2, x.dtype),
                            _n(cx, "where", [mid, cx.full(math.pi / 4, x.dtype),
                                             cx.full(0.0, x.dtype)], t)], t)
    z = _n(cx, "mul", [r, r], t)
    p = _poly(cx, z, [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1,
                      0.0])
    y = _n(cx, "add", [base, _n(cx, "add", [_n(cx, "mul", [p, r], t), r], t)], t)
    neg = _lt(cx, x, cx.full(0.0, x.dtype))
    return _n(cx, "where", [neg, _n(cx, "neg", [y], t), y], t)


def _asin_of(cx, x):
    """Cephes' asinf: above |x| = 0.5, π/2 − 2 asin(√((1 − |x|)/2)); a polynomial below."""
    t = (x.dtype, x.shape)
    a = aten_map._abs_of(cx, x)
    hi = _lt(cx, cx.full(0.5, x.dtype), a)
    zh = _scaled(cx, _n(cx, "add_scalar", [_n(cx, "neg", [a], t)], t, {"value": 1.0}), 0.5)
    zh = _n(cx, "where", [hi, zh, cx.full(0.0, x.dtype)], t)  # no sqrt of < 0 beyond |x| > 1
    r = _n(cx, "where", [hi, _n(cx, "sqrt", [zh], t), a], t)
    z = _n(cx, "mul", [r, r], t)
    p = _poly(cx, z, [4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2,
                      1.6666752422e-1, 0.0])
    y = _n(cx, "add", [_n(cx, "mul", [p, r], t), r], t)
    y = _n(cx, "where", [hi, _n(cx, "add_scalar", [_scaled(cx, y, -2.0)], t,
                                {"value": math.pi / 2}), y], t)
    y = _n(cx, "where", [_lt(cx, cx.full(1.0, x.dtype), a), cx.full(float("nan"), x.dtype), y], t)
    neg = _lt(cx, x, cx.full(0.0, x.dtype))
    return _n(cx, "where", [neg, _n(cx, "neg", [y], t), y], t)


def _inverse_trig(which):
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        _float(x, which)
        x = _as(cx, x, t[0])
        if which == "atan":
            return _atan_of(cx, x)
        y = _asin_of(cx, x)
        if which == "asin":
            return y
        return _n(cx, "add_scalar", [_n(cx, "neg", [y], t)], t, {"value": math.pi / 2})
    return f


def _atan2(cx, node, args, kw):
    """atan2(y, x): atan(y / x), plus π (y ≥ 0) or −π (y < 0) where x < 0; ±π/2 where x = 0
    (0 where both are), as torch's."""
    t = _t(cx, node)
    y, x = cx.v(args[0]), _as(cx, aten_map._operand(cx, args[1], t[0]), t[0])
    _float(y, "atan2")
    y = _as(cx, y, t[0])
    zero, one = cx.full(0.0, t[0]), cx.full(1.0, t[0])
    xz = _n(cx, "eq", [x, zero], ("bool", x.shape))
    q = _n(cx, "div", [y, _n(cx, "where", [xz, one, x], (x.dtype, x.shape))], t)
    a = _atan_of(cx, q)
    yneg = _lt(cx, y, zero)
    turn = _n(cx, "where", [yneg, cx.full(-math.pi, t[0]), cx.full(math.pi, t[0])], t)
    a = _n(cx, "where", [_lt(cx, x, zero), _n(cx, "add", [a, turn], t), a], t)
    side = _n(cx, "where", [yneg, cx.full(-math.pi / 2, t[0]),
                            _n(cx, "where", [_n(cx, "eq", [y, zero], ("bool", y.shape)), zero,
                                             cx.full(math.pi / 2, t[0])], t)], t)
    return _n(cx, "where", [xz, side, a], t)


def _sinh_cosh(sign):
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        _float(x, "sinh" if sign < 0 else "cosh")
        e = _n(cx, "exp", [x], t)
        en = _n(cx, "exp", [_n(cx, "neg", [x], t)], t)
        y = _scaled(cx, _n(cx, "sub" if sign < 0 else "add", [e, en], t), 0.5)
        if sign > 0:
            return y
        # x (1 + x²/6 (1 + x²/20 (1 + x²/42))): truncation below 1e-11 of x for |x| < 0.1
        x2 = _n(cx, "mul", [x, x], t)
        p = cx.full(1.0, x.dtype)
        for k in (42.0, 20.0, 6.0):
            p = _n(cx, "add_scalar", [_n(cx, "mul", [_scaled(cx, x2, 1.0 / k), p], t)], t,
                   {"value": 1.0})
        small = _n(cx, "mul", [x, p], t)
        ax = aten_map._abs_of(cx, x)
        return _n(cx, "where", [_lt(cx, ax, cx.full(0.1, x.dtype)), small, y], t)
    return f


def _celu(cx, node, args, kw):
    alpha = args[1] if len(args) > 1 else kw.get("alpha", 1.0)
    if alpha == 0:
        raise Unsupported("celu with alpha 0")
    return aten_map._elu(cx, node, [args[0], alpha, 1.0, 1.0 / alpha], {})


def _floor_of(cx, x):
    """floor(x): x through i64 and back, less 1 where that rounded up (a negative fraction);
    |x| >= 2^23 holds integers already (and may not fit in i64)."""
    t = (x.dtype, x.shape)
    tr = _as(cx, _n(cx, "_to_copy", [x], ("i64", x.shape), {"dtype": "i64"}), x.dtype)
    tr = _n(cx, "sub", [tr, _as(cx, _lt(cx, x, tr), x.dtype)], t)
    small = _lt(cx, aten_map._abs_of(cx, x), cx.full(float(1 << 23), x.dtype))
    return _n(cx, "where", [small, tr, x], t)  # NaN and ±inf stay


def _rounding(which):
    """floor, ceil (−floor(−x)), trunc (toward 0) and round (half to even, as torch)."""
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        if x.dtype not in _FINITE_MAX:
            return x  # integers are whole already
        if which == "floor":
            return _floor_of(cx, x)
        if which == "ceil":
            return _n(cx, "neg", [_floor_of(cx, _n(cx, "neg", [x], t))], t)
        if which == "trunc":
            return _trunc_of(cx, x)
        r = _floor_of(cx, _n(cx, "add_scalar", [x], t, {"value": 0.5}))
        tie = _n(cx, "eq", [_n(cx, "sub", [r, x], t), cx.full(0.5, x.dtype)], ("bool", x.shape))
        half = _floor_of(cx, _scaled(cx, r, 0.5))
        odd = _n(cx, "eq", [_n(cx, "sub", [r, _scaled(cx, half, 2.0)], t),
                            cx.full(1.0, x.dtype)], ("bool", x.shape))
        down = _n(cx, "where", [tie, odd, cx.full(False, "bool")], ("bool", x.shape))
        return _n(cx, "sub", [r, _as(cx, down, x.dtype)], t)
    return f


def _isnan_of(cx, x):
    s = ("bool", x.shape)
    return _n(cx, "bitwise_not", [_n(cx, "eq", [x, x], s)], s)


def _isnan(cx, node, args, kw):
    x = cx.v(args[0])
    _float(x, "isnan")
    return _isnan_of(cx, x)


def _nan_to_num(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _float(x, "nan_to_num")
    nan, pinf, ninf = (list(args[1:4]) + [None] * 3)[:3]
    nan = kw.get("nan", nan)
    pinf = kw.get("posinf", pinf)
    ninf = kw.get("neginf", ninf)
    big = _FINITE_MAX[x.dtype]
    y = _n(cx, "where", [_isnan_of(cx, x), cx.full(0.0 if nan is None else nan, x.dtype), x], t)
    for inf, to in ((math.inf, big if pinf is None else pinf),
                    (-math.inf, -big if ninf is None else ninf)):
        at = _n(cx, "eq", [x, cx.full(inf, x.dtype)], ("bool", x.shape))
        y = _n(cx, "where", [at, cx.full(to, x.dtype), y], t)
    return y


def _new_full(cx, node, args, kw):
    t = _t(cx, node)
    return _n(cx, "full", [], t, {"shape": list(t[1]), "value": args[2], "dtype": t[0]})


def _squeeze_all(cx, node, args, kw):
    t = _t(cx, node)
    return _n(cx, "view", [cx.v(args[0])], t, {"shape": list(t[1])})


def _isinf(cx, node, args, kw):
    x = cx.v(args[0])
    _float(x, "isinf")
    return _isinf_of(cx, x)


def _logaddexp(cx, node, args, kw):
    """max(a, b) + log1p(exp(−|a − b|)); where both are the same infinity, that infinity."""
    t = _t(cx, node)
    a, b = _as(cx, cx.v(args[0]), t[0]), _as(cx, cx.v(args[1]), t[0])
    _float(a, "logaddexp")
    hi = _n(cx, "maximum", [a, b], t)
    d = aten_map._abs_of(cx, _n(cx, "sub", [a, b], t))
    y = _n(cx, "add", [hi, _log1p_of(cx, _n(cx, "exp", [_n(cx, "neg", [d], t)], t))], t)
    b2 = ("bool", t[1])
    same_inf = _n(cx, "where", [_n(cx, "eq", [a, b], b2), _isinf_of(cx, a), cx.full(False, "bool")],
                  b2)
    return _n(cx, "where", [same_inf, hi, y], t)


def _isinf_of(cx, x):
    return _n(cx, "eq", [aten_map._abs_of(cx, x), cx.full(math.inf, x.dtype)], ("bool", x.shape))


def _shrink(kind):
    """softshrink: x ∓ λ beyond ±λ, else 0; hardshrink: x beyond ±λ, else 0."""
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        lam = args[1] if len(args) > 1 else kw.get("lambd", 0.5)
        _float(x, kind)
        zero = cx.full(0.0, x.dtype)
        above = _lt(cx, cx.full(lam, x.dtype), x)
        below = _lt(cx, x, cx.full(-lam, x.dtype))
        hi, lo = x, x
        if kind == "softshrink":
            hi = _n(cx, "add_scalar", [x], t, {"value": -lam})
            lo = _n(cx, "add_scalar", [x], t, {"value": lam})
        return _n(cx, "where", [above, hi, _n(cx, "where", [below, lo, zero], t)], t)
    return f


def _shrink_backward(cx, node, args, kw):
    """grad where |x| > λ, else 0 (soft and hard alike)."""
    g, x, lam = cx.v(args[0]), cx.v(args[1]), args[2]
    t = _t(cx, node)
    beyond = _lt(cx, cx.full(lam, x.dtype), aten_map._abs_of(cx, x))
    return _n(cx, "where", [beyond, _as(cx, g, t[0]), cx.full(0.0, t[0])], t)


def _prelu_weight(cx, w, x):
    """PReLU's weight [1] or [C] against x [N, C, ...]: viewed to broadcast over dim 1."""
    wv = cx.v(w)
    if _numel(wv.shape) == 1 or len(x.shape) < 2:
        return wv if len(wv.shape) <= 1 else _n(cx, "view", [wv], (wv.dtype, (1,)), {"shape": [1]})
    if _numel(wv.shape) != x.shape[1]:
        raise Unsupported("prelu with %d weights for %d channels" % (_numel(wv.shape), x.shape[1]))
    view = [1] * len(x.shape)
    view[1] = x.shape[1]
    return _n(cx, "view", [wv], (wv.dtype, tuple(view)), {"shape": view})


def _prelu(cx, node, args, kw):
    x, t = cx.v(args[0]), _t(cx, node)
    _float(x, "prelu")
    w = _as(cx, _prelu_weight(cx, args[1], x), x.dtype)
    neg = _lt(cx, x, cx.full(0.0, x.dtype))
    return _n(cx, "where", [neg, _n(cx, "mul", [x, w], t), x], t)


def _prelu_backward(cx, node, args, kw):
    """(grad where x > 0 else grad · w, Σ grad · x where x <= 0 over all but the channel dim)."""
    g, x = cx.v(args[0]), cx.v(args[1])
    ts = cx.types_of(node)
    xt = (x.dtype, x.shape)
    wv = cx.v(args[2])
    w = _as(cx, _prelu_weight(cx, args[2], x), x.dtype)
    pos = _lt(cx, cx.full(0.0, x.dtype), x)
    gx = _n(cx, "where", [pos, g, _n(cx, "mul", [g, w], xt)], xt)
    gw = _n(cx, "where", [pos, cx.full(0.0, x.dtype), _n(cx, "mul", [g, x], xt)], xt)
    if _numel(wv.shape) == 1 or len(x.shape) < 2:
        gw = _n(cx, "sum", [gw], (x.dtype, ()), {"dims": []})
    else:
        gw = _n(cx, "sum", [gw], (x.dtype, (x.shape[1],)),
                {"dims": [d for d in range(len(x.shape)) if d != 1]})
    gw = _n(cx, "view", [gw], (x.dtype, tuple(wv.shape)), {"shape": list(wv.shape)})
    return [gx, _as(cx, gw, ts[1][0])]


# ---- boolean logic -----------------------------------------------------------------------------

def _bools(cx, args, what):
    a = cx.v(args[0])
    b = _operand(cx, args[1], "bool")
    if a.dtype != "bool" or b.dtype != "bool":
        raise Unsupported("%s of %s and %s tensors (hp takes bools)" % (what, a.dtype, b.dtype))
    return a, b


def _logic(op):
    def f(cx, node, args, kw):
        a, b = _bools(cx, args, op)
        t = _t(cx, node)
        if op == "and":
            return _n(cx, "where", [a, b, cx.full(False, "bool")], t)
        if op == "or":
            return _n(cx, "where", [a, cx.full(True, "bool"), b], t)
        return _n(cx, "where", [a, _n(cx, "bitwise_not", [b], (b.dtype, b.shape)), b], t)
    return f


def _reduce_attrs(x, args, kw, at=1):
    dim = args[at] if len(args) > at else kw.get("dim")
    keep = args[at + 1] if len(args) > at + 1 else kw.get("keepdim", False)
    dims = [] if dim is None else [d % len(x.shape) for d in
                                   (dim if isinstance(dim, (list, tuple)) else [dim])]
    a = {"dims": dims}
    if keep:
        a["keepdim"] = 1
    return a


def _any_of(cx, x, a, t):
    m = _n(cx, "amax", [_as(cx, x, "f32")], ("f32", t[1]), a)
    return _n(cx, "lt", [cx.full(0.0, "f32"), m], t)


def _any_all(which):
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        if x.dtype != "bool":
            raise Unsupported("%s of a %s tensor (hp takes bools)" % (which, x.dtype))
        a = _reduce_attrs(x, args, kw)
        if which == "any":
            return _any_of(cx, x, a, t)
        nx = _n(cx, "bitwise_not", [x], (x.dtype, x.shape))
        return _n(cx, "bitwise_not", [_any_of(cx, nx, a, t)], t)
    return f


# ---- gated units and fused arithmetic ------------------------------------------------------------

def _halves(cx, x, dim):
    dim %= len(x.shape)
    n = x.shape[dim]
    if n % 2:
        raise Unsupported("glu over a dim of odd size %d" % n)
    shape = list(x.shape)
    shape[dim] = n // 2
    t = (x.dtype, tuple(shape))
    a = _n(cx, "slice", [x], t, {"dim": dim, "start": 0, "end": n // 2})
    b = _n(cx, "slice", [x], t, {"dim": dim, "start": n // 2, "end": n})
    return a, b, t, dim


def _glu(cx, node, args, kw):
    x = cx.v(args[0])
    a, b, t, _ = _halves(cx, x, args[1] if len(args) > 1 else kw.get("dim", -1))
    return _n(cx, "mul", [a, _n(cx, "sigmoid", [b], t)], _t(cx, node))


def _glu_backward(cx, node, args, kw):
    g, x = cx.v(args[0]), cx.v(args[1])
    a, b, t, dim = _halves(cx, x, args[2])
    s = _n(cx, "sigmoid", [b], t)
    ga = _n(cx, "mul", [g, s], t)
    one_minus = _n(cx, "add_scalar", [_n(cx, "neg", [s], t)], t, {"value": 1.0})
    gb = _n(cx, "mul", [_n(cx, "mul", [ga, a], t), one_minus], t)
    return cx.g.node("cat", [ga, gb], [_t(cx, node)], {"dim": dim})


def _addc(op):
    def f(cx, node, args, kw):
        t = _t(cx, node)
        x, a, b = (_as(cx, cx.v(v), t[0]) for v in args[:3])
        value = args[3] if len(args) > 3 else kw.get("value", 1)
        p = _n(cx, op, [a, b], (t[0], aten_map._bshape(a, b)))
        if value != 1:
            p = _scaled(cx, p, value)
        return _n(cx, "add", [x, p], t)
    return f


def _lerp(cx, node, args, kw):
    t = _t(cx, node)
    x, y = _as(cx, cx.v(args[0]), t[0]), _as(cx, cx.v(args[1]), t[0])
    d = _n(cx, "sub", [y, x], (t[0], aten_map._bshape(x, y)))
    w = args[2]
    if aten_map._is_node(w):
        wv = _as(cx, cx.v(w), t[0])
        d = _n(cx, "mul", [wv, d], (t[0], aten_map._bshape(wv, d)))
    else:
        d = _scaled(cx, d, w)
    return _n(cx, "add", [x, d], t)


def _var_mean(cx, node, args, kw):
    x = cx.v(args[0])
    ts = cx.types_of(node)
    dims = args[1] if len(args) > 1 else kw.get("dim")
    corr = kw.get("correction", args[2] if len(args) > 2 else 1)
    keep = kw.get("keepdim", args[3] if len(args) > 3 else False)
    v = aten_map._var_of(cx, x, dims, corr, keep, ts[0])
    rank = len(x.shape)
    dims = list(range(rank)) if dims is None or dims == [] else [d % rank for d in dims]
    a = {"dims": dims}
    if keep:
        a["keepdim"] = 1
    return [v, cx.g.node("mean", [x], [ts[1]], a)]


# ---- max and min over a dim, and the scatter of their backward --------------------------------

def _positions(cx, shape, dim, dtype):
    """arange(shape[dim]) as dtype, viewed to broadcast along dim of a tensor of shape."""
    n = shape[dim]
    if dtype == "f32" and n >= 1 << 24:
        raise Unsupported("a dim of %d elements (its positions count in f32)" % n)
    p = _n(cx, "arange", [], (dtype, (n,)), {"start": 0, "end": n, "dtype": dtype})
    view = [1] * len(shape)
    view[dim] = n
    return _n(cx, "view", [p], (dtype, tuple(view)), {"shape": view})


def _extreme_dim(which, arg=False):
    """max/min over a dim: [values, indices]; with arg, argmax/argmin: the indices alone (over
    every element, flattened, when dim is None)."""
    def f(cx, node, args, kw):
        x = cx.v(args[0])
        _float(x, which)
        dim = args[1] if len(args) > 1 else kw.get("dim")  # keepdim: in the types
        if arg:
            t = _t(cx, node)
            ts = [(x.dtype, t[1]), t]
            if dim is None:  # over the flattened tensor
                x = _n(cx, "view", [x], (x.dtype, (_numel(x.shape),)), {"shape": [-1]})
                dim = 0
        else:
            ts = cx.types_of(node)
        dim %= len(x.shape)
        kshape = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
        src = x if which == "max" else _n(cx, "neg", [x], (x.dtype, x.shape))
        m = _n(cx, "amax", [src], (x.dtype, kshape), {"dims": [dim], "keepdim": 1})
        # the first position holding it: the least position where x equals it
        n = x.shape[dim]
        pos = _positions(cx, x.shape, dim, "f32")
        at = _n(cx, "where", [_n(cx, "eq", [src, m], ("bool", x.shape)), pos,
                              cx.full(float(n), "f32")], ("f32", x.shape))
        first = _n(cx, "neg", [_n(cx, "amax", [_n(cx, "neg", [at], ("f32", x.shape))],
                                  ("f32", kshape), {"dims": [dim], "keepdim": 1})],
                   ("f32", kshape))
        if which == "min":
            m = _n(cx, "neg", [m], (x.dtype, kshape))
        if tuple(ts[1][1]) != kshape:
            m = _n(cx, "view", [m], ts[0], {"shape": list(ts[0][1])})
            first = _n(cx, "view", [first], ("f32", ts[1][1]), {"shape": list(ts[1][1])})
        first = _as(cx, first, ts[1][0])
        return first if arg else [m, first]
    return f


def _extreme_all(which):
    def f(cx, node, args, kw):
        x, t = cx.v(args[0]), _t(cx, node)
        _float(x, which)
        if which == "max":
            return _n(cx, "amax", [x], t, {"dims": []})
        nx = _n(cx, "neg", [x], (x.dtype, x.shape))
        return _n(cx, "neg", [_n(cx, "amax", [nx], t, {"dims": []})], t)
    return f


def _scatter(cx, node, args, kw):
    """scatter(x, dim, index, src or value) for an index of one entry along dim, the others
    x's: where(position == index, src, x)."""
    x, t = cx.v(args[0]), _t(cx, node)
    dim = args[1] % max(len(x.shape), 1)
    idx = cx.v(args[2])
    if kw.get("reduce") is not None or len(args) > 4:
        raise Unsupported("scatter with reduce")
    want = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
    if tuple(idx.shape) != want:
        raise Unsupported("scatter with an index of shape %s into %s along dim %d (hp takes one "
                          "index along dim)" % (list(idx.shape), list(x.shape), dim))
    src = args[3] if len(args) > 3 else kw.get("src", kw.get("value"))
    if aten_map._is_node(src):
        s = cx.v(src)
        if tuple(s.shape) != want:  # its first entry along dim is the one scattered
            if len(s.shape) != len(want) or any(s.shape[i] != want[i]
                                                for i in range(len(want)) if i != dim):
                raise Unsupported("scatter of a src of shape %s into %s"
                                  % (list(s.shape), list(x.shape)))
            s = _n(cx, "slice", [s], (s.dtype, want), {"dim": dim, "start": 0, "end": 1})
        s = _as(cx, s, t[0])
    else:
        s = cx.full(src, t[0])
    hit = _n(cx, "eq", [_positions(cx, x.shape, dim, idx.dtype), idx], ("bool", x.shape))
    return _n(cx, "where", [hit, s, x], t)


def _index_fill(cx, node, args, kw):
    """index_fill(x, dim, idx, value): value where the position along dim is one idx names:
    where(any(position == idx), value, x)."""
    x, t = cx.v(args[0]), _t(cx, node)
    dim = args[1] % max(len(x.shape), 1)
    idx = cx.v(args[2])
    if len(idx.shape) > 1:
        raise Unsupported("index_fill with a %d-d index" % len(idx.shape))
    k, n = _numel(idx.shape), x.shape[dim]
    flat = idx if len(idx.shape) == 1 else _n(cx, "view", [idx], (idx.dtype, (1,)), {"shape": [1]})
    pos = _n(cx, "arange", [], (idx.dtype, (n,)), {"start": 0, "end": n, "dtype": idx.dtype})
    pos = _n(cx, "view", [pos], (idx.dtype, (n, 1)), {"shape": [n, 1]})
    hits = _as(cx, _n(cx, "eq", [pos, flat], ("bool", (n, k))), "f32")
    most = _n(cx, "amax", [hits], ("f32", (n,)), {"dims": [1]})
    named = _n(cx, "lt", [cx.full(0.0, "f32"), most], ("bool", (n,)))
    view = [1] * len(x.shape)
    view[dim] = n
    named = _n(cx, "view", [named], ("bool", tuple(view)), {"shape": view})
    v = args[3]
    v = _as(cx, cx.v(v), t[0]) if aten_map._is_node(v) else cx.full(v, t[0])
    return _n(cx, "where", [named, v, x], t)


# ---- losses ------------------------------------------------------------------------------------

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduction(args, kw, at):
    r = args[at] if len(args) > at else kw.get("reduction", 1)
    if r not in _REDUCTIONS:
        raise Unsupported("reduction %r" % (r,))
    return r


def _reduce_loss(cx, l, r, t):
    if r == 0:
        return l
    return _n(cx, "mean" if r == 1 else "sum", [l], t, {"dims": []})


def _grad_of(cx, g, r, x, t):
    """The incoming gradient against each element: g / numel for a mean."""
    g = _as(cx, cx.v(g), t[0])
    if r == 1:
        g = _scaled(cx, g, 1.0 / max(_numel(x.shape), 1))
    return g


def _diff(cx, args, t):
    x, y = _as(cx, cx.v(args[0]), t[0]), _as(cx, cx.v(args[1]), t[0])
    _float(x, "a regression loss")
    return x, _n(cx, "sub", [x, y], (t[0], aten_map._bshape(x, y)))


def _mse(cx, node, args, kw):
    t = _t(cx, node)
    x, d = _diff(cx, args, (cx.v(args[0]).dtype, None))
    return _reduce_loss(cx, _n(cx, "mul", [d, d], (x.dtype, d.shape)), _reduction(args, kw, 2), t)


def _mse_backward(cx, node, args, kw):
    t = _t(cx, node)
    x, d = _diff(cx, args[1:], t)
    g = _grad_of(cx, args[0], _reduction(args, kw, 3), x, t)
    return _n(cx, "mul", [_scaled(cx, d, 2.0), g], t)


def _huberish(kind):
    """smooth_l1 (beta) and huber (delta): quadratic inside |d| < c, linear outside."""
    def f(cx, node, args, kw):
        t = _t(cx, node)
        x, d = _diff(cx, args, (cx.v(args[0]).dtype, None))
        c = args[3] if len(args) > 3 else kw.get("beta" if kind == "smooth_l1" else "delta", 1.0)
        dt = (x.dtype, d.shape)
        ad = aten_map._abs_of(cx, d)
        if kind == "smooth_l1" and c == 0:
            return _reduce_loss(cx, ad, _reduction(args, kw, 2), t)
        quad = _scaled(cx, _n(cx, "mul", [d, d], dt), 0.5 / c if kind == "smooth_l1" else 0.5)
        lin = _n(cx, "add_scalar", [ad], dt, {"value": -0.5 * c})
        if kind == "huber":
            lin = _scaled(cx, lin, c)
        inside = _lt(cx, ad, cx.full(c, x.dtype))
        return _reduce_loss(cx, _n(cx, "where", [inside, quad, lin], dt),
                            _reduction(args, kw, 2), t)
    return f


def _huberish_backward(kind):
    def f(cx, node, args, kw):
        t = _t(cx, node)
        x, d = _diff(cx, args[1:], t)
        r = _reduction(args, kw, 3)
        c = args[4] if len(args) > 4 else kw.get("beta" if kind == "smooth_l1" else "delta", 1.0)
        g = _grad_of(cx, args[0], r, x, t)
        zero = cx.full(0.0, t[0])
        sign = _n(cx, "sub", [_as(cx, _lt(cx, zero, d), t[0]), _as(cx, _lt(cx, d, zero), t[0])],
                  t)
        if kind == "smooth_l1" and c == 0:
            return _n(cx, "mul", [sign, g], t)
        inner = _scaled(cx, d, 1.0 / c) if kind == "smooth_l1" else d
        outer = sign if kind == "smooth_l1" else _scaled(cx, sign, c)
        beyond = _lt(cx, cx.full(c, t[0]), aten_map._abs_of(cx, d))
        return _n(cx, "mul", [_n(cx, "where", [beyond, outer, inner], t), g], t)
    return f


def _xlogy(cx, node, args, kw):
    t = _t(cx, node)
    x, y = _operand(cx, args[0], t[0]), _operand(cx, args[1], t[0])
    x, y = _as(cx, x, t[0]), _as(cx, y, t[0])
    _float(x, "xlogy")
    p = _n(cx, "mul", [x, _n(cx, "log", [y], (t[0], y.shape))], t)
    zero = _n(cx, "eq", [x, cx.full(0.0, t[0])], ("bool", x.shape))
    keep = _n(cx, "where", [_isnan_of(cx, y), cx.full(False, "bool"), zero], ("bool", t[1]))
    return _n(cx, "where", [keep, cx.full(0.0, t[0]), p], t)


def _weighted(cx, l, w, t):
    if w is None:
        return l
    wv = _as(cx, cx.v(w), t[0])
    return _n(cx, "mul", [l, wv], (t[0], aten_map._bshape(l, wv)))


def _bce(cx, node, args, kw):
    t = _t(cx, node)
    p, y = cx.v(args[0]), _as(cx, cx.v(args[1]), cx.v(args[0]).dtype)
    _float(p, "binary_cross_entropy")
    et = (p.dtype, p.shape)
    floor = cx.full(-100.0, p.dtype)
    lp = _floor(cx, _n(cx, "log", [p], et), floor, et)
    one_minus = _n(cx, "add_scalar", [_n(cx, "neg", [p], et)], et, {"value": 1.0})
    lq = _floor(cx, _n(cx, "log", [one_minus], et), floor, et)
    ym = _n(cx, "add_scalar", [_n(cx, "neg", [y], et)], et, {"value": 1.0})
    l = _n(cx, "neg", [_n(cx, "add", [_n(cx, "mul", [y, lp], et), _n(cx, "mul", [ym, lq], et)],
                          et)], et)
    w = args[2] if len(args) > 2 else kw.get("weight")
    return _reduce_loss(cx, _weighted(cx, l, w, et), _reduction(args, kw, 3), t)


def _floor(cx, v, lo, t):
    """max(v, lo), NaN kept (torch clamps the logs so)."""
    return _n(cx, "where", [_lt(cx, v, lo), lo, v], t)


def _bce_backward(cx, node, args, kw):
    t = _t(cx, node)
    p, y = cx.v(args[1]), _as(cx, cx.v(args[2]), t[0])
    w = args[3] if len(args) > 3 else kw.get("weight")
    g = _grad_of(cx, args[0], _reduction(args, kw, 4), p, t)
    one_minus = _n(cx, "add_scalar", [_n(cx, "neg", [p], t)], t, {"value": 1.0})
    den = _n(cx, "mul", [p, one_minus], t)
    eps = cx.full(1e-12, t[0])
    den = _n(cx, "where", [_lt(cx, den, eps), eps, den], t)
    r = _n(cx, "div", [_n(cx, "sub", [p, y], t), den], t)
    return _weighted(cx, _n(cx, "mul", [r, g], t), w, t)


def _bce_logits(cx, node, args, kw):
    t = _t(cx, node)
    x = cx.v(args[0])
    _float(x, "binary_cross_entropy_with_logits")
    y = _as(cx, cx.v(args[1]), x.dtype)
    et = (x.dtype, x.shape)
    w = args[2] if len(args) > 2 else kw.get("weight")
    pw = args[3] if len(args) > 3 else kw.get("pos_weight")
    # log(1 + e^−|x|) + max(−x, 0): log σ(x)'s negation without overflow
    ax = aten_map._abs_of(cx, x)
    soft = _log1p_of(cx, _n(cx, "exp", [_n(cx, "neg", [ax], et)], et))
    nx = _n(cx, "neg", [x], et)
    zero = cx.full(0.0, x.dtype)
    soft = _n(cx, "add", [soft, _n(cx, "where", [_lt(cx, zero, nx), nx, zero], et)], et)
    ym = _n(cx, "add_scalar", [_n(cx, "neg", [y], et)], et, {"value": 1.0})
    if pw is not None:
        pwv = _as(cx, cx.v(pw), x.dtype)
        pwm1 = _n(cx, "add_scalar", [pwv], (x.dtype, pwv.shape), {"value": -1.0})
        scale = _n(cx, "add_scalar", [_n(cx, "mul", [pwm1, y], et)], et, {"value": 1.0})
        soft = _n(cx, "mul", [scale, soft], et)
    l = _n(cx, "add", [_n(cx, "mul", [ym, x], et), soft], et)
    return _reduce_loss(cx, _weighted(cx, l, w, et), _reduction(args, kw, 4), t)


TABLE = {
    aten.exp2.default: _exp_scaled(math.log(2.0)),
    aten.log2.default: _log_scaled(1.0 / math.log(2.0), "log2"),
    aten.log10.default: _log_scaled(1.0 / math.log(10.0), "log10"),
    aten.pow.Scalar: _pow_scalar,
    aten.pow.Tensor_Tensor: _pow_tensors,
    aten.prod.default: _prod,
    aten.prod.dim_int: _prod,
    aten.cumprod.default: _cumprod,
    aten.atan.default: _inverse_trig("atan"),
    aten.asin.default: _inverse_trig("asin"),
    aten.acos.default: _inverse_trig("acos"),
    aten.atan2.default: _atan2,
    aten.div.Tensor_mode: _div_mode,
    aten.div.Scalar_mode: _div_mode,
    aten.fmod.Scalar: _mod("fmod"),
    aten.fmod.Tensor: _mod("fmod"),
    aten.remainder.Scalar: _mod("remainder"),
    aten.remainder.Tensor: _mod("remainder"),
    aten.sinh.default: _sinh_cosh(-1),
    aten.cosh.default: _sinh_cosh(1),
    aten.celu.default: _celu,
    aten.floor.default: _rounding("floor"),
    aten.ceil.default: _rounding("ceil"),
    aten.trunc.default: _rounding("trunc"),
    aten.round.default: _rounding("round"),
    aten.isnan.default: _isnan,
    aten.isinf.default: _isinf,
    aten.logaddexp.default: _logaddexp,
    aten.softshrink.default: _shrink("softshrink"),
    aten.hardshrink.default: _shrink("hardshrink"),
    aten.softshrink_backward.default: _shrink_backward,
    aten.hardshrink_backward.default: _shrink_backward,
    aten.prelu.default: _prelu,
    aten.prelu_backward.default: _prelu_backward,
    aten.index_fill.int_Scalar: _index_fill,
    aten.index_fill.int_Tensor: _index_fill,
    aten.new_ones.default: aten_map._creation("ones"),
    aten.new_full.default: _new_full,
    aten.new_empty.default: aten_map._creation("zeros"),
    aten.squeeze.default: _squeeze_all,
    aten.nan_to_num.default: _nan_to_num,
    aten.bitwise_and.Tensor: _logic("and"),
    aten.bitwise_or.Tensor: _logic("or"),
    aten.bitwise_xor.Tensor: _logic("xor"),
    aten.logical_or.default: _logic("or"),
    aten.logical_xor.default: _logic("xor"),
    aten.any.dim: _any_all("any"),
    aten.all.dim: _any_all("all"),
    aten.any.default: _any_all("any"),
    aten.all.default: _any_all("all"),
    aten.glu.default: _glu,
    aten.glu_backward.default: _glu_backward,
    aten.addcmul.default: _addc("mul"),
    aten.addcdiv.default: _addc("div"),
    aten.lerp.Scalar: _lerp,
    aten.lerp.Tensor: _lerp,
    aten.var_mean.correction: _var_mean,
    aten.max.dim: _extreme_dim("max"),
    aten.min.dim: _extreme_dim("min"),
    aten.argmax.default: _extreme_dim("max", arg=True),
    aten.argmin.default: _extreme_dim("min", arg=True),
    aten.max.default: _extreme_all("max"),
    aten.min.default: _extreme_all("min"),
    aten.scatter.src: _scatter,
    aten.scatter.value: _scatter,
    aten.mse_loss.default: _mse,
    aten.mse_loss_backward.default: _mse_backward,
    aten.smooth_l1_loss.default: _huberish("smooth_l1"),
    aten.smooth_l1_loss_backward.default: _huberish_backward("smooth_l1"),
    aten.huber_loss.default: _huberish("huber"),
    aten.huber_loss_backward.default: _huberish_backward("huber"),
    aten.xlogy.Tensor: _xlogy,
    aten.binary_cross_entropy.default: _bce,
    aten.binary_cross_entropy_backward.default: _bce_backward,
    aten.binary_cross_entropy_with_logits.default: _bce_logits,
    aten.sqrt_.default: _inplace(aten_map._one("sqrt")),
    aten.log_.default: _inplace(aten_map._one("log")),
    aten.clamp_min_.default: _inplace(aten_map._clamp_min),
    aten.logical_or_.default: _inplace(_logic("or")),
    aten.sigmoid_.default: _inplace(aten_map._one("sigmoid")),
    aten.tanh_.default: _inplace(aten_map._one("tanh")),
    aten.relu_.default: _inplace(aten_map._one("relu")),
    aten.silu_.default: _inplace(aten_map._one("silu")),
    aten.exp_.default: _inplace(aten_map._one("exp")),
    aten.neg_.default: _inplace(aten_map._one("neg")),
    aten.gelu_.default: _inplace(aten_map._gelu),
    aten.clamp_.default: _inplace(aten_map._clamp),
    aten.mul_.Scalar: _inplace(aten_map._mul_scalar),
    aten.add_.Scalar: _inplace(aten_map._binary("add", "add_scalar")),
    aten.transpose_.default: _inplace(aten_map._transpose),
    aten.t_.default: _inplace(aten_map.TABLE[aten.t.default]),
    aten.squeeze_.dim: _inplace(aten_map.TABLE[aten.squeeze.dim]),
    aten.unsqueeze_.default: _inplace(aten_map.TABLE[aten.unsqueeze.default]),
    aten.unsafe_split.Tensor: aten_map._split,
    aten.unsafe_split_with_sizes.default: aten_map._split,
    aten.scatter_.src: _inplace(_scatter),
    aten.scatter_.value: _inplace(_scatter),
}
