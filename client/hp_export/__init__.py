"""hp_export: bring your own PyTorch model to hp.

    job = hp_export.export(model, (tokens, labels), loss_fn, plan={"fsdp": ["transformer.h.*"],
                           "mesh": "dp=2"}, train={"steps": 100, "lr": 3e-4},
                           out="job.pb", weights="w.safetensors")

captures the model's training step with make_fx (as HyperParallel's graph mode does): a joint
forward + backward graph of `functional_call` and `torch.autograd.grad` (autodiff="torch"),
or the forward only, hp's autodiff deriving the backward (autodiff="hp"). Placeholders are
the parameters in FQN order (tied weights once: one parameter, gradients summed), the
buffers (the tensor constants the trace captured among them, as `_constants.NAME`), then the
data `tokens` and `labels`; outputs the loss, then one gradient per
parameter. The ATen graph is mapped to hp's ops (the TABLEs of aten_select, aten_map,
aten_extra, aten_more and aten_conv) and written as hp's text IR; `hpctl new --graph` builds
the job from it with all of hpctl's flags
and checks. The model's state goes to safetensors under its own FQNs and is the job's
--init-from.

An op hp cannot represent fails the export with one message listing every such op, its count
and the module it came from; nothing is written then.
"""
import collections
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils import stateless
import torch.utils._python_dispatch as _pd

from . import aten_conv, aten_extra, aten_map, aten_more, aten_select, hpir, safetensors
from .hpir import Unsupported, dtype_name

aten = torch.ops.aten

__all__ = ["export", "capture", "to_hpir", "ExportError", "default_loss"]


class ExportError(Exception):
    """The model cannot be exported; str() is the whole message for the user."""


def default_loss(logits, labels):
    """Mean cross entropy over every position (logits [..., V], labels [...])."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


# ---- the model's state -----------------------------------------------------------------------

def _params_and_aliases(model):
    """[(fqn, tensor)] deduplicated in named_parameters order, and {every name: its fqn}
    (torch 1.13's functional_call does not follow tied weights: each alias is passed)."""
    params = list(model.named_parameters())
    by_id = {id(p): n for n, p in params}
    alias = {}
    for mn, mod in model.named_modules(remove_duplicate=False):
        for pn, p in mod._parameters.items():
            if p is not None:
                alias[(mn + "." if mn else "") + pn] = by_id[id(p)]
    return params, alias


def _storage_key(t):
    """What identifies a tensor's values in memory: the same key is the same tensor's data
    (None for what has no memory of its own: not a tensor, empty, on the meta device)."""
    if not torch.is_tensor(t) or t.numel() == 0 or t.data_ptr() == 0:
        return None
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _storage_of(t):
    """The address of the memory t is a view of (None as _storage_key)."""
    if _storage_key(t) is None:
        return None
    try:
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        return s.data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return None


def _buffers(model):
    return list(model.named_buffers())


def _init_spec(t):
    """An init spec that reproduces t's distribution roughly, for runs without --init-from."""
    x = t.detach().float()
    if x.numel() == 0 or bool((x == 0).all()):
        return "zeros"
    if bool((x == 1).all()):
        return "ones"
    fin = x[torch.isfinite(x)]
    if fin.numel() < x.numel():
        # ±inf or NaN (an additive mask of -inf): no init spec holds them, so a normal one of
        # the finite values stands in, which marks the values as the weights file's to load
        m = fin.mean().item() if fin.numel() else 0.0
        sd = fin.std().item() if fin.numel() > 1 else 0.0
        return "normal(%s,%s)" % (hpir._float(m), hpir._float(sd if sd > 0 else 1.0))
    if bool((x == x.flatten()[0]).all()):
        return "constant(%s)" % hpir._float(x.flatten()[0].item())
    std = x.std().item() if x.numel() > 1 else 0.0
    if not (std > 0 and math.isfinite(std)):
        return "constant(%s)" % hpir._float(x.mean().item())
    return "normal(%s,%s)" % (hpir._float(x.mean().item()), hpir._float(std))


def _is_causal_tril(t):
    """A [1, ..., 1, T, T] buffer of tril(ones): a causal mask."""
    if t.dim() < 2 or t.shape[-1] != t.shape[-2] or any(s != 1 for s in t.shape[:-2]):
        return False
    n = t.shape[-1]
    return bool((t.reshape(n, n) == torch.tril(torch.ones(n, n, dtype=t.dtype))).all())


def _is_causal_additive(t):
    """A [1, ..., 1, T, T] float buffer of 0 on and below the diagonal, -inf above: the additive
    causal mask (triu(full(-inf), 1), as nn.Transformer.generate_square_subsequent_mask)."""
    if not t.is_floating_point() or t.dim() < 2 or t.shape[-1] != t.shape[-2] or \
            any(s != 1 for s in t.shape[:-2]):
        return False
    n = t.shape[-1]
    x = t.reshape(n, n)
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    return bool((x[~upper] == 0).all()) and bool((x[upper] == float("-inf")).all()) and n > 1


def _buffer_init(name, t):
    x = t.detach()
    if x.numel() == 0 or bool((x == 0).all()):
        return "zeros"
    if bool((x == 1).all()):
        return "ones"
    if bool((x == x.flatten()[0]).all()):
        return "constant(%s)" % hpir._float(x.flatten()[0].item())
    if x.dtype != torch.bool and bool((x.flatten() == torch.arange(x.numel(),
                                                                    dtype=x.dtype)).all()):
        return "arange"
    if not x.is_floating_point():
        raise Unsupported("buffer '%s' holds integers hp cannot recreate (a constant or "
                          "arange only); compute it in forward instead" % name)
    # any other values (RoPE's cos/sin tables): the weights file holds them and hp-worker
    # loads buffers from --init-from as it does parameters; the spec is for runs without it
    return _init_spec(x)


# ---- capture ---------------------------------------------------------------------------------

class _ModulePaths:
    """Which module each traced node came from: forward hooks note the tracer's node count
    on entry and claim the nodes added by exit (the innermost module first)."""

    def __init__(self, model):
        self.path = {}
        self.handles = []
        self.starts = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self.handles.append(mod.register_forward_hook(self._post(name)))

    @staticmethod
    def _graph():
        mode = _pd._get_current_dispatch_mode()
        tracer = getattr(mode, "tracer", None)
        return getattr(tracer, "graph", None)

    @staticmethod
    def _tracer():
        mode = _pd._get_current_dispatch_mode()
        return getattr(mode, "tracer", None)

    def _pre(self, name):
        def hook(mod, inp):
            tracer = self._tracer()
            if tracer is not None:  # node.stack_trace: the user's line for error messages
                tracer.record_stack_traces = True
            g = self._graph()
            self.starts.append(len(g.nodes) if g is not None else None)
        return hook

    def _post(self, name):
        def hook(mod, inp, out):
            start = self.starts.pop() if self.starts else None
            g = self._graph()
            if g is None or start is None:
                return
            for k, n in enumerate(g.nodes):
                if k >= start and n not in self.path:
                    self.path[n] = name
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


class Captured:
    """A traced training step: the FX graph, the inputs it was traced with, the state."""

    def __init__(self, gm, inputs, params, buffers, alias, paths, autodiff):
        self.gm, self.inputs, self.params, self.buffers = gm, inputs, params, buffers
        self.alias, self.paths, self.autodiff = alias, paths, autodiff
        self.constants = {}  # buffer fqn -> the f32 tensor: constants the trace captured


def capture(model, example_inputs, loss_fn=None, autodiff="torch"):
    """Traces one training step of model on example_inputs = (tokens, labels) with make_fx.
    loss_fn(output, labels) gives the scalar loss (default: mean cross entropy); None with a
    model whose forward(tokens, labels) returns the loss (or a tuple holding it) uses that."""
    if autodiff not in ("torch", "hp"):
        raise ValueError("autodiff must be 'torch' or 'hp', not %r" % autodiff)
    tokens, labels = example_inputs
    params, alias = _params_and_aliases(model)
    buffers = _buffers(model)
    pnames = [n for n, _ in params]
    bnames = [n for n, _ in buffers]

    def loss_of(ps, bs, x, y):
        d = {n: ps[pnames.index(f)] for n, f in alias.items()}
        d.update(zip(bnames, bs))
        if loss_fn is None:
            out = stateless.functional_call(model, d, (x, y))
            if isinstance(out, (tuple, list)):
                out = [o for o in out if torch.is_tensor(o) and o.dim() == 0][-1]
            return out
        return loss_fn(stateless.functional_call(model, d, (x,)), y)

    def joint(ps, bs, x, y):
        loss = loss_of(ps, bs, x, y)
        grads = torch.autograd.grad(loss, ps, allow_unused=True)
        return [loss] + [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, ps)]

    def forward(ps, bs, x, y):
        return [loss_of(ps, bs, x, y)]

    ps = [p.detach().clone().requires_grad_(autodiff == "torch") for _, p in params]
    bs = [b.detach().clone() for _, b in buffers]
    paths = _ModulePaths(model)
    try:
        gm = make_fx(joint if autodiff == "torch" else forward)(ps, bs, tokens, labels)
    finally:
        paths.close()
    return Captured(gm, (ps, bs, tokens, labels), params, buffers, alias, paths.path, autodiff)


# ---- conversion ------------------------------------------------------------------------------

class _Poison:
    """The value of a node that failed to convert: its users are skipped, not reported."""


# the largest value computed from constants alone that the export folds to a buffer
_FOLD_MAX_ELEMENTS = 1 << 24


def _foldable(n, results):
    """Whether FX node n's recorded value is its value at every step: computed from constants
    alone (no placeholder upstream), by no random op, a tensor of at most _FOLD_MAX_ELEMENTS."""
    r = results.get(n)
    if not torch.is_tensor(r) or r.dtype not in hpir.DTYPES or r.numel() > _FOLD_MAX_ELEMENTS:
        return False
    return not aten_extra._upstream(n, lambda m: m.op == "placeholder" or (
        torch.Tag.nondeterministic_seeded in getattr(m.target, "tags", ())))


class _Convert:
    def __init__(self, cap, fold=()):
        self.cap = cap
        self.fold = set(fold)  # FX nodes computed from constants hp has no op for: buffers
        self.failed = []  # FX nodes that did not convert
        self.g = hpir.Graph()
        self.vals = {}
        self.results = {}
        self.unmapped = collections.OrderedDict()  # (path, op, reason) -> count
        self.where = {}  # (path, op, reason) -> the user's file:line of each, in order
        self.token_inputs = set()  # the tokens and labels placeholders (token ids, >= 0)
        self.param_reads = []  # (get_attr node, placeholder): a parameter captured as a constant
        self.known_masks = {}  # FX node -> True / False: a bool mask with that value everywhere

    # the context aten_map's entries see
    def value_of(self, a):
        v = self.vals[a]
        if isinstance(v, _Poison):
            raise _Skip()
        return v

    def v(self, a):
        if not isinstance(a, torch.fx.Node):
            raise Unsupported("a constant where a tensor is expected")
        v = self.value_of(a)
        if not isinstance(v, hpir.Value):
            raise Unsupported("a tuple where a tensor is expected")
        return v

    def type_of(self, node):
        r = self.results[node]
        if not torch.is_tensor(r):
            raise Unsupported("a non-tensor result")
        return (_scalar_dtype(r), tuple(r.shape))

    def types_of(self, node):
        r = self.results[node]
        return [(dtype_name(t.dtype), tuple(t.shape)) if torch.is_tensor(t) else None for t in r]

    def full(self, value, dtype):
        if isinstance(value, bool):
            value = float(value)
        return self.g.node("full", [], [(dtype, ())], {"shape": [], "value": value,
                                                       "dtype": dtype})

    def _record(self):
        self.results = {}
        interp = _Recorder(self.cap.gm, self.results)
        ps, bs, x, y = self.cap.inputs
        with torch.no_grad() if self.cap.autodiff == "hp" else _nullcontext():
            interp.run(ps, bs, x, y)

    def run(self):
        cap = self.cap
        self._record()
        nodes = list(cap.gm.graph.nodes)
        self._order = {n: k for k, n in enumerate(nodes)}
        self._last_fwd = max([self._order[n] for n in cap.paths if n in self._order] or [-1])
        phs = [n for n in nodes if n.op == "placeholder"]
        np_, nb = len(cap.params), len(cap.buffers)
        if len(phs) != np_ + nb + 2:
            raise ExportError("the traced graph has %d inputs, expected %d parameters, %d buffers "
                              "and tokens, labels" % (len(phs), np_, nb))
        problems = []
        causal = []  # buffers holding a causal mask: computed in the graph instead
        casts = []
        for k, n in enumerate(phs):
            r = self.results[n]
            t = (dtype_name(r.dtype), tuple(r.shape))
            if k < np_:
                fqn, p = cap.params[k]
                a = {"kind": "param", "fqn": fqn, "init": _init_spec(p)}
            elif k < np_ + nb:
                fqn, b = cap.buffers[k - np_]
                try:
                    if _is_causal_tril(b) or _is_causal_additive(b):
                        causal.append((n, b))
                        a = {"kind": "buffer", "fqn": fqn, "init": "zeros"}
                    else:
                        a = {"kind": "buffer", "fqn": fqn, "init": _buffer_init(fqn, b)}
                except Unsupported as e:
                    problems.append(str(e))
                    a = {"kind": "buffer", "fqn": fqn}
            else:
                if k == np_ + nb:  # the captured constants are buffers, before the data
                    casts += self._captured_constants(nodes, causal, problems)
                a = {"kind": "data", "fqn": "tokens" if k == np_ + nb else "labels"}
                self.token_inputs.add(n)
            if k < np_ + nb and t[0] in ("bf16", "f16"):
                # a model in half precision: hp holds its state in f32 (the parameters are the
                # optimizer's master weights; the weights file gets f32) and computes in the
                # model's dtype from a cast of it, as --param-dtype does
                casts.append((n, self.g.node("placeholder", [], [("f32", t[1])], a), t[0]))
                continue
            self.vals[n] = self.g.node("placeholder", [], [t], a)
        for n, v, dtype in casts:
            self.vals[n] = self.g.node("_to_copy", [v], [(dtype, v.shape)], {"dtype": dtype})
        for n, ph in self.param_reads:
            self.vals[n] = self.vals[ph]
        for n, b in causal:
            # nanoGPT's register_buffer("bias", tril(ones(T, T)).view(1, 1, T, T)), or the
            # additive mask triu(full(-inf), 1): the same values computed in the graph from
            # tril(ones), which the compiler can see is causal; the placeholder stays, unused
            d, s = dtype_name(b.dtype), b.shape[-1]
            m = self.g.node("ones", [], [(d, (s, s))], {"shape": [s, s], "dtype": d})
            m = self.g.node("tril", [m], [(d, (s, s))])
            if _is_causal_additive(b):  # 0 where tril is 1, -inf where it is 0
                above = self.g.node("eq", [m, self.full(0.0, d)], [("bool", (s, s))])
                m = self.g.node("where", [above, self.full(float("-inf"), d), self.full(0.0, d)],
                                [(d, (s, s))])
            if b.dim() != 2:
                m = self.g.node("view", [m], [(d, tuple(b.shape))], {"shape": list(b.shape)})
            self.vals[n] = m
        for n in nodes:
            if n.op in ("placeholder", "output"):
                continue
            if n in self.vals:  # a captured tensor constant (_captured_constants)
                continue
            if n.users and all(u in self.fold for u in n.users):
                self.vals[n] = _Poison()  # only what is folded reads it
                continue
            if n.op == "get_attr" and _is_scalar(self.results.get(n)):
                # a 0-d constant the trace captured (a loss's scale factor, a fill value)
                r = self.results[n]
                v = r.item()
                self.vals[n] = self.full(v if r.dtype != torch.bool else float(v),
                                         _scalar_dtype(r))
                continue
            if n.op != "call_function":
                self._fail(n, "%s %s" % (n.op, n.target), "a constant tensor captured in the graph")
                continue
            fn = aten_select.TABLE.get(n.target) or aten_map.TABLE.get(n.target) or \
                aten_extra.TABLE.get(n.target) or aten_more.TABLE.get(n.target) or \
                aten_conv.TABLE.get(n.target)
            if fn is None:
                self._fail(n, aten_map.op_name(n.target), None)
                continue
            try:
                self.vals[n] = fn(self, n, list(n.args), dict(n.kwargs))
            except _Skip:
                self.vals[n] = _Poison()
            except Unsupported as e:
                self._fail(n, aten_map.op_name(n.target), str(e))
        if self.unmapped:
            # what failed but is computed from constants alone (arange(n) // 4, an argsort of
            # a constant) is the same at every step: its recorded value, as a buffer; again
            # while that lets more convert (and fail)
            fold = set(self.fold)
            for n in self.failed:  # a tuple (sort's values, indices): the pieces taken
                for m in [n] if torch.is_tensor(self.results.get(n)) else list(n.users):
                    if _foldable(m, self.results):
                        fold.add(m)
            if fold != self.fold:
                return _Convert(cap, fold).run()
        if problems or self.unmapped:
            lines = ["the model uses what hp cannot run yet (nothing was written):"]
            for key, cnt in self.unmapped.items():
                path, op, why = key
                at = self.where.get(key, [])
                at = " at " + ", ".join(at[:3]) + (", ..." if len(at) > 3 else "") if at else ""
                lines.append("  %s: %s x%d%s%s" % (path, op, cnt, " (%s)" % why if why else "",
                                                   at))
            lines += ["  " + p for p in problems]
            raise ExportError("\n".join(lines))
        out = [n for n in nodes if n.op == "output"][0].args[0]
        # the loss, and a half-precision model's gradients, in f32 (its parameters' dtype here)
        self.g.outputs = [aten_map._as(self, self.v(a), "f32") for a in out]
        return self.g.text()

    def _captured_constants(self, nodes, causal, problems):
        """The tensor constants the trace captured (torch.tensor([...]) in forward: ALiBi's
        slopes), and the values in self.fold, as buffers named _constants.NAME (the FX node's
        name for a value folded), placeholders of their own: a causal mask
        joins `causal`; others get an init spec (_buffer_init: a constant or an arange hp
        recreates) and, floats and integers or bools not so recreated, the weights file's
        f32 copy (integers exact below 2^24), cast back by the (node, value, dtype) returned."""
        cap, casts = self.cap, []
        taken = {n for n, _ in cap.params} | {n for n, _ in cap.buffers}
        cap.constants = {}
        phs = [n for n in nodes if n.op == "placeholder"]
        owner = {_storage_key(p): (k, fqn) for k, (fqn, p) in enumerate(cap.params)}
        shared = {_storage_of(p): fqn for fqn, p in cap.params}
        owner.pop(None, None)
        shared.pop(None, None)
        for n in nodes:
            r = self.results.get(n)
            if not (n in self.fold or n.op == "get_attr" and torch.is_tensor(r) and
                    not _is_scalar(r)):
                continue
            if n.op == "get_attr" and _storage_key(r) in owner:
                # a parameter the module reads through a reference of its own (nn.LSTM's
                # _flat_weights; checkpoint's recomputation), which the trace captured as a
                # constant: it is the parameter (hp's autodiff differentiates it as such)
                k, fqn = owner[_storage_key(r)]
                if cap.autodiff == "torch":
                    problems.append("the parameter %s is read other than through its module "
                                    "attribute (a reference the module keeps, as nn.LSTM's "
                                    "_flat_weights, or torch.utils.checkpoint's recomputation), "
                                    "which PyTorch's traced backward does not follow: export "
                                    "with autodiff=\"hp\"" % fqn)
                    self.vals[n] = _Poison()
                else:
                    self.param_reads.append((n, phs[k]))
                continue
            if n.op == "get_attr" and _storage_of(r) in shared:
                problems.append("a constant the trace captured (%s) is a view of the parameter "
                                "%s: hp would not train it there; read the parameter itself"
                                % (n.target, shared[_storage_of(r)]))
                self.vals[n] = _Poison()
                continue
            r = r.detach()
            fqn = "_constants." + str(n.target if n.op == "get_attr" else n.name)
            while fqn in taken:
                fqn += "_"
            taken.add(fqn)
            try:
                d = dtype_name(r.dtype)
                if _is_causal_tril(r) or _is_causal_additive(r):
                    causal.append((n, r))
                    continue
                try:
                    init = _buffer_init(fqn, r)
                except Unsupported:
                    init = None  # integers hp cannot recreate: their f32 copy, cast back
                if r.is_floating_point() or init is None:
                    if not r.is_floating_point() and bool((r.long().abs() > 1 << 24).any()):
                        raise Unsupported("%s: integers beyond 2^24 (hp holds them in f32)"
                                          % fqn)
                    f = r.float()
                    cap.constants[fqn] = f
                    v = self.g.node("placeholder", [], [("f32", tuple(r.shape))],
                                    {"kind": "buffer", "fqn": fqn, "init": _init_spec(f)})
                    if d == "f32":
                        self.vals[n] = v
                    else:
                        casts.append((n, v, d))
                else:
                    self.vals[n] = self.g.node("placeholder", [], [(d, tuple(r.shape))],
                                               {"kind": "buffer", "fqn": fqn, "init": init})
            except Unsupported as e:
                problems.append("the constant %s: %s" % (n.target, e))
                self.vals[n] = _Poison()
        return casts

    def _fail(self, n, op, why):
        path = self.cap.paths.get(n)
        if path is None or path == "":
            # outside every submodule: the model's own forward, or (after the last node a
            # module claimed, in a joint capture) the backward
            path = "(backward)" if self.cap.autodiff == "torch" and self._order[n] > self._last_fwd \
                else "(model)"
        key = (path, op, why)
        self.failed.append(n)
        self.unmapped[key] = self.unmapped.get(key, 0) + 1
        line = _user_line(n)
        if line and line not in self.where.setdefault(key, []):
            self.where[key].append(line)
        self.vals[n] = _Poison()


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in ')


def _user_line(n):
    """The innermost frame of the node's stack trace outside torch, inside the traced step:
    the model code's file:line. None when the trace reaches hp_export's own step function
    first (what autograd made: the backward) or make_fx kept no trace."""
    for line in (getattr(n, "stack_trace", None) or "").splitlines():
        m = _FRAME.match(line)
        if not m:
            continue
        f = os.path.abspath(m.group(1))
        if f.startswith(_OWN_DIR):
            return None
        if not f.startswith(_TORCH_DIR):
            return "%s:%s" % (m.group(1), m.group(2))
    return None


class _Skip(Exception):
    pass


def _is_scalar(r):
    return torch.is_tensor(r) and r.dim() == 0


def _scalar_dtype(r):
    """r's dtype name; a 0-d f64 (torch promotes two 0-d operands, one of them a captured
    Python float, to f64: label smoothing's scale factors) computes in f32, hp's widest."""
    if r.dtype == torch.float64 and r.dim() == 0:
        return "f32"
    return dtype_name(r.dtype)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# In-place ops that change their input's shape and strides, not its values.
_META_INPLACE = {aten.transpose_.default, aten.t_.default, aten.squeeze_.dim,
                 aten.unsqueeze_.default}


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm, results):
        super().__init__(gm)
        self.results_ = results

    def run_node(self, n):
        before = None
        if n.op == "call_function" and n.target in _META_INPLACE and n.args and \
                n.args[0] in self.results_ and torch.is_tensor(self.results_[n.args[0]]):
            # the op reshapes the very tensor object its input node recorded: keep a view
            # with the input's shape for that node (nn.GRU's output.transpose_(0, 1))
            x = self.results_[n.args[0]]
            before = x.as_strided(x.size(), x.stride(), x.storage_offset())
        r = super().run_node(n)
        if before is not None:
            self.results_[n.args[0]] = before
        self.results_[n] = r
        return r


def to_hpir(cap):
    """The captured step as hp's text IR (raises ExportError listing what does not map)."""
    return _Convert(cap).run()


# ---- the job ---------------------------------------------------------------------------------

def _find_hpctl(hpctl):
    for c in (hpctl, os.environ.get("HPCTL"), shutil.which("hpctl")):
        if c and os.path.exists(c):
            return c
    raise ExportError("hpctl not found: pass hpctl=PATH (--hpctl), set $HPCTL, or put it on PATH")


def _flags(plan, train):
    args = []
    plan = dict(plan or {})
    for pat in plan.pop("fsdp", []) or []:
        args += ["--fsdp", pat]
    for pl in plan.pop("place", []) or []:
        args += ["--place", pl]
    for k, v in list(plan.items()) + list((train or {}).items()):
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif v is not False and v is not None:
            args += [flag, str(v)]
    return args


def export(model, example_inputs, loss_fn=default_loss, plan=None, train=None, out="job.pb",
           weights=None, hpir_path=None, autodiff="torch", hpctl=None, extra_args=()):
    """Exports model's training step to the job file `out` (returned). plan: {"mesh": "dp=2",
    "fsdp": [patterns], "place": [...], ...}; train: {"steps": 10, "lr": 1e-3, ...}: both
    become hpctl new flags (underscores as dashes). weights: where the model's state goes
    (default: out's stem + .safetensors); hpir_path: keep the IR there (default: out's stem +
    .hpir). The step is traced in train mode (model.train(), restored after), so dropout with
    p > 0 is exported: hp draws its masks (native_dropout). Raises ExportError with the whole
    message on failure; nothing is written then."""
    stem = os.path.splitext(out)[0]
    weights = weights or stem + ".safetensors"
    hpir_path = hpir_path or stem + ".hpir"
    tool = _find_hpctl(hpctl)
    was_training = model.training
    model.train()
    try:
        try:
            cap = capture(model, example_inputs, loss_fn, autodiff)
            text = to_hpir(cap)
        except Unsupported as e:
            raise ExportError(str(e))
    finally:
        model.train(was_training)
    tmpdir = tempfile.mkdtemp(prefix="hp_export-")
    try:
        ir = os.path.join(tmpdir, os.path.basename(stem) + ".hpir")
        with open(ir, "w") as f:
            f.write(text)
        half = (torch.bfloat16, torch.float16)  # held in f32 (to_hpir's placeholders)
        state = {n: p.float() if p.dtype in half else p for n, p in cap.params}
        state.update({n: b.float() if b.dtype in half else b for n, b in cap.buffers})
        state.update(cap.constants)
        tied = ",".join("%s=%s" % (a, f) for a, f in sorted(cap.alias.items()) if a != f)
        wtmp = os.path.join(tmpdir, "weights.safetensors")
        safetensors.save(wtmp, state, {"format": "pt", "producer": "hp_export",
                                       "tied": tied})
        cmd = [tool, "new", "--graph", ir, "--init-from", os.path.abspath(weights), "-o", out]
        cmd += _flags(plan, train) + list(extra_args)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise ExportError(r.stderr.strip() or "hpctl new failed (exit %d)" % r.returncode)
        if r.stderr.strip():  # hpctl's warnings (a plan that does not compile, say)
            sys.stderr.write(r.stderr if r.stderr.endswith("\n") else r.stderr + "\n")
        shutil.move(wtmp, weights)
        shutil.move(ir, hpir_path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out
