#!/usr/bin/python3
"""tests/graph/llama_ref.py — the PyTorch reference for test_llama_torch.c.

A plain PyTorch Llama-3 written from the spec (torchtitan's model), independent of hp's IR:
RMSNorm (eps from the config), RoPE on adjacent pairs (2i, 2i+1) rotated by
t * theta^(-2i/head_dim) in torchtitan's complex form, grouped-query causal attention scaled
by 1/sqrt(head_dim) with repeat_interleave'd kv heads, SwiGLU w2(silu(w1 x) * w3 x), untied
output, mean cross-entropy over all tokens. Linear weights are [out, in] (x @ W^T).

Usage: llama_ref.py DIR
  DIR/manifest.txt  "config k=v ..." then one "param FQN d0 [d1]" line per parameter in order,
                    then "data tokens B T" and "data labels B T"
  DIR/inputs.bin    the parameters as little-endian f32, in manifest order, then tokens and
                    labels as little-endian i64
Writes DIR/ref_float32.bin and DIR/ref_float64.bin: little-endian f64, the loss and then every
gradient flattened, in manifest order, from the model run in that dtype.

Exit status 3 (with a message) when torch is missing; 2 on a bad manifest.
"""
import math
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - the C test turns this into a failure
    sys.stderr.write(
        "llama_ref.py: cannot import torch (%s): python3-torch is missing; "
        "run scripts/install-deps.sh\n" % e)
    sys.exit(3)


def read_inputs(d):
    cfg, params, data = {}, [], []
    with open(d + "/manifest.txt") as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "config":
                for kv in w[1:]:
                    k, v = kv.split("=")
                    cfg[k] = float(v) if k in ("norm_eps", "rope_theta") else int(v)
            elif w[0] == "param":
                params.append((w[1], [int(x) for x in w[2:]]))
            elif w[0] == "data":
                data.append((w[1], [int(x) for x in w[2:]]))
            else:
                sys.stderr.write("llama_ref.py: bad manifest line: %s" % line)
                sys.exit(2)
    with open(d + "/inputs.bin", "rb") as f:
        blob = f.read()
    off, tensors = 0, {}
    for name, shape in params:
        n = math.prod(shape)
        t = torch.frombuffer(bytearray(blob[off:off + 4 * n]), dtype=torch.float32)
        tensors[name] = t.reshape(shape).clone()
        off += 4 * n
    for name, shape in data:
        n = math.prod(shape)
        t = torch.frombuffer(bytearray(blob[off:off + 8 * n]), dtype=torch.int64)
        tensors[name] = t.reshape(shape).clone()
        off += 8 * n
    if off != len(blob):
        sys.stderr.write("llama_ref.py: inputs.bin has %d bytes, manifest says %d\n"
                         % (len(blob), off))
        sys.exit(2)
    return cfg, [p[0] for p in params], tensors


def rms_norm(x, w, eps):
    if x.dtype == torch.bfloat16:  # fused, as hp's kernel: f32 inside, one rounding
        return rms_norm(x.float(), w.float(), eps).to(torch.bfloat16)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """x [B, T, H, Dh]: pairs (2i, 2i+1) as complex numbers times e^(i t theta^(-2i/Dh))."""
    if x.dtype == torch.bfloat16:  # complex bf16 does not exist: f32, rounded once
        return rope(x.float(), theta).to(torch.bfloat16)
    B, T, H, Dh = x.shape
    freqs = 1.0 / (theta ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # [T, Dh/2]
    cis = torch.polar(torch.ones_like(angles), angles)
    cis = cis.to(torch.complex64 if x.dtype == torch.float32 else torch.complex128)
    xc = torch.view_as_complex(x.reshape(B, T, H, Dh // 2, 2))
    return torch.view_as_real(xc * cis.view(1, T, 1, Dh // 2)).flatten(3)


def attention(x, p, cfg):
    B, T, D = x.shape
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    Dh = D // H
    q = F.linear(x, p["wq"]).view(B, T, H, Dh)
    k = F.linear(x, p["wk"]).view(B, T, Hkv, Dh)
    v = F.linear(x, p["wv"]).view(B, T, Hkv, Dh)
    q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, T, Dh]
    k = k.repeat_interleave(H // Hkv, dim=1)  # query head h reads kv head h // (H/Hkv)
    v = v.repeat_interleave(H // Hkv, dim=1)
    dt = q.dtype  # bf16: fused attention as hp's kernel (f32 inside, output rounded once)
    if dt == torch.bfloat16:
        q, k, v = q.float(), k.float(), v.float()
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)  # [B, H, T, T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    o = (torch.softmax(scores, dim=-1) @ v).to(dt)  # [B, H, T, Dh]
    return F.linear(o.transpose(1, 2).reshape(B, T, H * Dh), p["wo"])


def forward(cfg, w, tokens, labels):
    eps = cfg["norm_eps"]
    h = F.embedding(tokens, w["tok_embeddings.weight"])
    for i in range(cfg["n_layers"]):
        g = lambda n: w["layers.%d.%s.weight" % (i, n)]
        p = {n: g("attention." + n) for n in ("wq", "wk", "wv", "wo")}
        h = h + attention(rms_norm(h, g("attention_norm"), eps), p, cfg)
        x = rms_norm(h, g("ffn_norm"), eps)
        ff = F.linear(F.silu(F.linear(x, g("feed_forward.w1"))) * F.linear(x, g("feed_forward.w3")),
                      g("feed_forward.w2"))
        h = h + ff
    logits = F.linear(rms_norm(h, w["norm.weight"], eps), w["output.weight"])
    if logits.dtype == torch.bfloat16:  # the loss in f32, as torchtitan's pred.float()
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, cfg["vocab"]), labels.reshape(-1))


def run(d, cfg, names, tensors, dtype):
    w = {n: tensors[n].to(dtype).clone().requires_grad_(True) for n in names}
    loss = forward(cfg, w, tensors["tokens"], tensors["labels"])
    loss.backward()
    vals = [loss.item()]
    for n in names:
        vals.extend(w[n].grad.to(torch.float64).reshape(-1).tolist())
    suffix = "float32" if dtype == torch.float32 else "float64"
    with open("%s/ref_%s.bin" % (d, suffix), "wb") as f:
        f.write(struct.pack("<%dd" % len(vals), *vals))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: llama_ref.py DIR\n")
        sys.exit(2)
    d = sys.argv[1]
    torch.set_num_threads(1)  # small tensors; keeps ctest's parallel runs light
    cfg, names, tensors = read_inputs(d)
    for dtype in (torch.float32, torch.float64):
        run(d, cfg, names, tensors, dtype)


if __name__ == "__main__":
    main()
