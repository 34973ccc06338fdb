#!/usr/bin/python3
"""bench/gpu/torch_attention.py — PyTorch's fused attention on the ~1B model's shapes, the
kernel-level peer of hp's k_flash.cu in bench/gpu/check.sh: F.scaled_dot_product_attention
(causal, bf16, GQA by repeating K/V as bench/gpu/torch_llama.py does) forward, and forward plus
backward, timed with CUDA events (median of the timed repeats after warm-up). Prints one JSON
line with TFLOP/s in FlashAttention's accounting (causal forward 2·B·H·T²·D FLOPs, backward 2.5
times that), the same as check.sh's line for hp.

usage: torch_attention.py [--batch 2] [--heads 16] [--kv-heads 8] [--seq 2048] [--dim 128]
                          [--repeat 20]
Exit 3 (and a JSON line with "error") when torch has no CUDA.
"""
import argparse
import json
import sys

import torch_peer


def main():
    ap = argparse.ArgumentParser()
    for k, v in (("batch", 2), ("heads", 16), ("kv-heads", 8), ("seq", 2048), ("dim", 128),
                 ("repeat", 20)):
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    peer = torch_peer.cuda_torch()
    if peer is None:
        return 3
    torch, F = peer
    dev, bf = torch.device("cuda"), torch.bfloat16
    b, h, hk, t, d = a.batch, a.heads, a.kv_heads, a.seq, a.dim
    q = torch.randn(b, h, t, d, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(b, hk, t, d, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(b, hk, t, d, device=dev, dtype=bf, requires_grad=True)
    go = torch.randn(b, h, t, d, device=dev, dtype=bf)

    def fwd():
        kk, vv = k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    def fwd_bwd():
        o = fwd()
        o.backward(go)

    flops = 2.0 * b * h * t * t * d
    with torch.no_grad():
        f_ms = torch_peer.median_ms(torch, fwd, a.repeat)
    fb_ms = torch_peer.median_ms(torch, fwd_bwd, a.repeat)
    b_ms = max(fb_ms - f_ms, 1e-9)
    print(json.dumps({"torch": torch.__version__, "forward_ms": f_ms, "backward_ms": b_ms,
                      "forward_tflops": flops / (f_ms / 1e3) / 1e12,
                      "backward_tflops": 2.5 * flops / (b_ms / 1e3) / 1e12}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
