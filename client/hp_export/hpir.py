"""Writing hp's text IR (docs/hpir.md): a graph builder that numbers nodes 0, 1, 2, ... in
order, spells types, attributes and references as the parser reads them, and prints the
file. It knows nothing of PyTorch beyond dtypes."""
import math

import torch

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int32: "i32", torch.int64: "i64", torch.bool: "bool"}


class Unsupported(Exception):
    """An op (or an argument of one) hp cannot represent; the message says what."""


class Value:
    """Output `out` of node `node`, with its type (dtype name, shape tuple)."""
    __slots__ = ("node", "out", "dtype", "shape")

    def __init__(self, node, out, dtype, shape):
        self.node, self.out, self.dtype, self.shape = node, out, dtype, tuple(shape)

    def ref(self):
        return "%%%d" % self.node if self.out == 0 else "%%%d.%d" % (self.node, self.out)


def dtype_name(dt):
    if dt not in DTYPES:
        raise Unsupported("dtype %s" % dt)
    return DTYPES[dt]


def type_str(dtype, shape):
    return "%s[%s]" % (dtype, ",".join(str(int(d)) for d in shape))


def _float(v):
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _str(s):
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7f:
            out.append(ch)
        else:
            out.extend("\\x%02x" % b for b in ch.encode())
    return '"' + "".join(out) + '"'


# The kind of each attribute key hp reads (HP_ATTR_LIST in include/hp/graph.h).
_FLOAT_KEYS = {"value", "exponent", "alpha", "beta", "eps", "theta", "scale", "p"}
_INTS_KEYS = {"dims", "shape", "perm", "global_shape"}
_STR_KEYS = {"fqn", "group"}


def attr_str(key, v):
    if key in _FLOAT_KEYS:
        return "%s=%s" % (key, _float(v))
    if key in _INTS_KEYS:
        return "%s=[%s]" % (key, ",".join(str(int(x)) for x in v))
    if key in _STR_KEYS:
        return "%s=%s" % (key, _str(v))
    if key == "dtype":
        return "dtype=%s" % v
    if key in ("init", "kind"):
        return "%s=%s" % (key, v)
    return "%s=%d" % (key, int(v))


class Graph:
    def __init__(self):
        self.lines = []
        self.n = 0
        self.outputs = []

    def node(self, op, inputs, types, attrs=None):
        """Appends a node; types is a list of (dtype name, shape) per output. Returns its
        Values (one, or a list when there are several outputs)."""
        ids = self.n
        self.n += 1
        ts = [type_str(d, s) for d, s in types]
        tt = ts[0] if len(ts) == 1 else "(" + ", ".join(ts) + ")"
        a = ""
        if attrs:
            a = " {" + ", ".join(attr_str(k, attrs[k]) for k in sorted(attrs)) + "}"
        ins = ", ".join(v.ref() for v in inputs)
        self.lines.append("%%%d: %s = %s(%s)%s" % (ids, tt, op, ins, a))
        vals = [Value(ids, k, d, s) for k, (d, s) in enumerate(types)]
        return vals[0] if len(vals) == 1 else vals

    def text(self):
        ret = "return" + ("" if not self.outputs else " " + ", ".join(v.ref() for v in self.outputs))
        return "hpir 1\n" + "\n".join(self.lines) + "\n" + ret + "\n"
