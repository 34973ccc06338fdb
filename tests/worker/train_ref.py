#!/usr/bin/python3
"""tests/worker/train_ref.py — PyTorch's side of test_train.c's training check.

  train_ref.py init DIR CONFIG...   writes DIR/init.safetensors: random weights (seeded) for
                                    the Llama-3 config given as k=v words
  train_ref.py train DIR CONFIG...  trains from DIR/init.safetensors on DIR/tokens.bin (an
                                    llm.c shard holding exactly B windows of T+1 tokens: the
                                    same batch every step), with torch.optim.AdamW, torchtitan's
                                    LR schedule and clip_grad_norm_; writes DIR/ref_losses.txt
                                    (one loss a line, %.17g) and DIR/ref_final.safetensors;
                                    with bf16=1, FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
                                    reduce_dtype=f32): each step computes with bf16 parameters
                                    cast from the f32 masters (gradients flow back through the
                                    cast in f32), AdamW on the f32 masters

The model is tests/graph/llama_ref.py's (written from the spec, independent of hp's IR).
Exit status 3 when torch is missing.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "graph"))

import llama_ref  # noqa: E402  (exits 3 without torch)
import st_torch  # noqa: E402
import adamw_ref  # noqa: E402
import torch  # noqa: E402


def parse(words):
    cfg = {}
    for kv in words:
        k, v = kv.split("=")
        cfg[k] = float(v) if k in ("norm_eps", "rope_theta", "lr", "wd", "clip", "min_lr") else int(v)
    return cfg


def shapes(c):
    dim, hd = c["dim"], c["dim"] // c["n_heads"]
    kv = c["n_kv_heads"] * hd
    out = [("tok_embeddings.weight", [c["vocab"], dim])]
    for i in range(c["n_layers"]):
        p = "layers.%d." % i
        out += [(p + "attention.wq.weight", [dim, dim]), (p + "attention.wk.weight", [kv, dim]),
                (p + "attention.wv.weight", [kv, dim]), (p + "attention.wo.weight", [dim, dim]),
                (p + "feed_forward.w1.weight", [c["ffn_hidden"], dim]),
                (p + "feed_forward.w2.weight", [dim, c["ffn_hidden"]]),
                (p + "feed_forward.w3.weight", [c["ffn_hidden"], dim]),
                (p + "attention_norm.weight", [dim]), (p + "ffn_norm.weight", [dim])]
    out += [("norm.weight", [dim]), ("output.weight", [c["vocab"], dim])]
    return out


def init(d, c):
    g = torch.Generator().manual_seed(1234)
    w = {}
    for name, shape in shapes(c):
        if len(shape) == 1:
            w[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            w[name] = 0.08 * torch.randn(shape, generator=g)
    st_torch.save(d + "/init.safetensors", w, {"format": "pt"})


def batch(d, c):
    with open(d + "/tokens.bin", "rb") as f:
        buf = f.read()
    hdr = struct.unpack("<256i", buf[:1024])
    n = hdr[2]
    toks = torch.tensor(struct.unpack("<%dH" % n, buf[1024:1024 + 2 * n]), dtype=torch.int64)
    B, T = c["batch"], c["seq"]
    x = torch.stack([toks[k * T:k * T + T] for k in range(B)])
    y = torch.stack([toks[k * T + 1:k * T + T + 1] for k in range(B)])
    return x, y


def train(d, c):
    w, _ = st_torch.load(d + "/init.safetensors")
    names = [n for n, _ in shapes(c)]
    params = {n: w[n].clone().requires_grad_(True) for n in names}
    opt = torch.optim.AdamW([params[n] for n in names], lr=c["lr"], betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=c["wd"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, adamw_ref.build_lambda(c["steps"], c["warmup"], -1, "linear", c["min_lr"]))
    x, y = batch(d, c)
    losses = []
    for _ in range(c["steps"]):
        opt.zero_grad()
        if c.get("bf16", 0):
            loss = llama_ref.forward(c, {n: params[n].to(torch.bfloat16) for n in names}, x, y)
        else:
            loss = llama_ref.forward(c, params, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([params[n] for n in names], c["clip"])
        opt.step()
        sched.step()
        losses.append(loss.item())
    with open(d + "/ref_losses.txt", "w") as f:
        f.write("".join("%.17g\n" % v for v in losses))
    st_torch.save(d + "/ref_final.safetensors", {n: params[n].detach() for n in names},
                  {"format": "pt"})


def main():
    mode, d, c = sys.argv[1], sys.argv[2], parse(sys.argv[3:])
    c.setdefault("norm_eps", 1e-5)
    c.setdefault("rope_theta", 500000.0)
    torch.set_num_threads(1)
    if mode == "init":
        init(d, c)
    else:
        train(d, c)


if __name__ == "__main__":
    main()
