#!/usr/bin/python3
"""bench/gpu/torch_llama.py — the PyTorch peer of bench/gpu/check.sh: the same Llama-3 (the
layout of graph/models/, untied output, GQA, RoPE, RMSNorm, SwiGLU) trained on one CUDA device
with bf16 autocast, F.scaled_dot_product_attention (causal), fused AdamW and grad clipping,
eagerly or under torch.compile. Prints one JSON line: tokens/s (median over the timed steps),
peak memory, the loss of the first and last step.

usage: torch_llama.py --mode eager|compile --dim D --layers L --heads H --kv-heads K
                      --ffn F --vocab V --batch B --seq T --steps N [--warmup W]
Exit 3 (and a JSON line with "error") when torch has no CUDA.
"""
import argparse
import json
import math
import sys
import time

import torch_peer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], required=True)
    for k in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab", "batch", "seq", "steps"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    peer = torch_peer.cuda_torch()
    if peer is None:
        return 3
    torch, F = peer
    dev = torch.device("cuda")
    torch.manual_seed(0)
    D, H, K, Dh = a.dim, a.heads, a.kv_heads, a.dim // a.heads
    theta, eps = 500000.0, 1e-5

    def p(*shape, ones=False):
        t = torch.ones(shape, device=dev) if ones else 0.02 * torch.randn(shape, device=dev)
        return t.requires_grad_(True)

    w = {"emb": p(a.vocab, D), "norm": p(D, ones=True), "out": p(a.vocab, D)}
    for i in range(a.layers):
        w.update({"%d.%s" % (i, n): t for n, t in (
            ("wq", p(D, D)), ("wk", p(K * Dh, D)), ("wv", p(K * Dh, D)), ("wo", p(D, D)),
            ("w1", p(a.ffn, D)), ("w2", p(D, a.ffn)), ("w3", p(a.ffn, D)),
            ("an", p(D, ones=True)), ("fn", p(D, ones=True)))})
    freqs = 1.0 / (theta ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    ang = torch.outer(torch.arange(a.seq, dtype=torch.float64), freqs)
    cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)

    def rms(x, g):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * g

    def rope(x):  # [B, T, h, Dh], pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(3).to(x.dtype)

    def forward(tok, lab):
        B, T = tok.shape
        h = F.embedding(tok, w["emb"])
        for i in range(a.layers):
            g = lambda n: w["%d.%s" % (i, n)]  # noqa: E731
            x = rms(h, g("an"))
            q = rope(F.linear(x, g("wq")).view(B, T, H, Dh)).transpose(1, 2)
            k = rope(F.linear(x, g("wk")).view(B, T, K, Dh)).transpose(1, 2)
            v = F.linear(x, g("wv")).view(B, T, K, Dh).transpose(1, 2)
            k = k.repeat_interleave(H // K, dim=1)
            v = v.repeat_interleave(H // K, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + F.linear(o.transpose(1, 2).reshape(B, T, D), g("wo"))
            x = rms(h, g("fn"))
            h = h + F.linear(F.silu(F.linear(x, g("w1"))) * F.linear(x, g("w3")), g("w2"))
        logits = F.linear(rms(h, w["norm"]), w["out"])
        return F.cross_entropy(logits.float().reshape(-1, a.vocab), lab.reshape(-1))

    fwd = torch.compile(forward) if a.mode == "compile" else forward
    params = list(w.values())
    try:
        opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                fused=True)
    except TypeError:
        opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(a.steps):
        tok = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        lab = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, lab)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    timed = sorted(times[a.warmup:]) or sorted(times)
    med = timed[len(timed) // 2]
    print(json.dumps({"mode": a.mode, "torch": torch.__version__,
                      "tokens_per_s": a.batch * a.seq / med, "step_s": med,
                      "peak_bytes": torch.cuda.max_memory_allocated(),
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "finite": all(math.isfinite(x) for x in losses)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
