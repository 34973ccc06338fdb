#!/usr/bin/python3
"""bench/bench_train_cpu.py — hp vs PyTorch training the same Llama-3 on the CPU.

Runs the same config (debugmodel shape unless overridden) for N steps in hp
(`hp-worker --standalone`) and in PyTorch (tests/graph/llama_ref.py's model, AdamW, clipping,
the same threads, batch and sequence), each in its own process, and prints the step-time ratio
hp / PyTorch, tokens/s of each and the peak RSS of each. The first WARMUP steps of each are
not timed.

usage: bench_train_cpu.py [--build DIR] [--steps N] [--warmup N] [--threads N]
                          [--batch B] [--seq T] [--layers L] [--dim D] [--heads H]
                          [--ffn F] [--vocab V] [--param-dtype f32|bf16]
Target (issue 3): hp at most 0.7x PyTorch's step time.
--param-dtype bf16: both sides run FSDP2's MixedPrecisionPolicy(bf16, f32) (PyTorch computes
with bf16 parameters cast from the f32 masters each step), and hp's f32 run is timed too.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TORCH_CHILD = r'''
import sys, time, json, resource
sys.path.insert(0, %(graph)r)
import torch
import llama_ref
torch.set_num_threads(%(threads)d)
torch.manual_seed(0)
c = %(cfg)r
dim, hd = c["dim"], c["dim"] // c["n_heads"]
kv = c["n_kv_heads"] * hd
shapes = [("tok_embeddings.weight", [c["vocab"], dim])]
for i in range(c["n_layers"]):
    p = "layers.%%d." %% i
    shapes += [(p + "attention.wq.weight", [dim, dim]), (p + "attention.wk.weight", [kv, dim]),
               (p + "attention.wv.weight", [kv, dim]), (p + "attention.wo.weight", [dim, dim]),
               (p + "feed_forward.w1.weight", [c["ffn_hidden"], dim]),
               (p + "feed_forward.w2.weight", [dim, c["ffn_hidden"]]),
               (p + "feed_forward.w3.weight", [c["ffn_hidden"], dim]),
               (p + "attention_norm.weight", [dim]), (p + "ffn_norm.weight", [dim])]
shapes += [("norm.weight", [dim]), ("output.weight", [c["vocab"], dim])]
w = {n: (torch.ones(s) if len(s) == 1 else 0.02 * torch.randn(s)).requires_grad_(True)
     for n, s in shapes}
opt = torch.optim.AdamW(list(w.values()), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                        weight_decay=0.1)
B, T = c["batch"], c["seq"]
times = []
for step in range(%(steps)d):
    t0 = time.perf_counter()
    x = torch.randint(0, c["vocab"], (B, T))
    y = torch.randint(0, c["vocab"], (B, T))
    opt.zero_grad(set_to_none=True)
    if %(bf16)d:
        loss = llama_ref.forward(c, {n: t.to(torch.bfloat16) for n, t in w.items()}, x, y)
    else:
        loss = llama_ref.forward(c, w, x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"times": times, "rss": rss}))
'''


def run_torch(cfg, steps, threads, bf16=False):
    code = TORCH_CHILD % {"graph": os.path.join(ROOT, "tests", "graph"), "threads": threads,
                          "cfg": cfg, "steps": steps, "bf16": int(bf16)}
    out = subprocess.run(["/usr/bin/python3", "-c", code], check=True, capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["times"], r["rss"]


def run_hp(build, cfg, steps, threads, tmp, param_dtype="f32"):
    job = os.path.join(tmp, "job.pb")
    subprocess.run([os.path.join(build, "client", "hpctl"), "new", "--model", "llama3:debugmodel",
                    "--batch", str(cfg["batch"]), "--seq", str(cfg["seq"]),
                    "--layers", str(cfg["n_layers"]), "--dim", str(cfg["dim"]),
                    "--heads", str(cfg["n_heads"]), "--kv-heads", str(cfg["n_kv_heads"]),
                    "--ffn-hidden", str(cfg["ffn_hidden"]), "--vocab", str(cfg["vocab"]),
                    "--steps", str(steps), "--warmup", "1", "--log-interval", "1",
                    "--param-dtype", param_dtype, "-o", job],
                   check=True, capture_output=True)
    out = os.path.join(tmp, "run-" + param_dtype)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([os.path.join(build, "worker", "hp-worker"), "--standalone", job,
                    "--out", out, "--threads", str(threads)], check=True, capture_output=True,
                   env=dict(os.environ, HP_CPU_PEAK_FLOPS="1e11"))
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    times = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            times.append(json.loads(line)["step_time_s"])
    return times, rss if rss > before * 1024 else rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--param-dtype", choices=("f32", "bf16"), default="f32")
    a = ap.parse_args()
    bf16 = a.param_dtype == "bf16"
    cfg = {"dim": a.dim, "n_layers": a.layers, "n_heads": a.heads, "n_kv_heads": a.heads,
           "ffn_hidden": a.ffn, "vocab": a.vocab, "batch": a.batch, "seq": a.seq,
           "norm_eps": 1e-5, "rope_theta": 500000.0}
    with tempfile.TemporaryDirectory() as tmp:
        hp_t, hp_rss = run_hp(a.build, cfg, a.steps, a.threads, tmp, a.param_dtype)
        if bf16:
            f32_t, f32_rss = run_hp(a.build, cfg, a.steps, a.threads, tmp, "f32")
    torch_t, torch_rss = run_torch(cfg, a.steps, a.threads, bf16)
    med = lambda t: sorted(t[a.warmup:])[len(t[a.warmup:]) // 2]
    hp_s, torch_s = med(hp_t), med(torch_t)
    tokens = a.batch * a.seq
    print("config: llama3 dim %d, %d layers, %d heads, ffn %d, vocab %d; batch %d x seq %d; "
          "%d threads; median of %d steps after %d warmup; param dtype %s"
          % (a.dim, a.layers, a.heads, a.ffn, a.vocab, a.batch, a.seq, a.threads,
             a.steps - a.warmup, a.warmup, a.param_dtype))
    print("hp:      step %.4f s  %8.0f tokens/s  peak RSS %6.1f MiB"
          % (hp_s, tokens / hp_s, hp_rss / 2**20))
    if bf16:
        f32_s = med(f32_t)
        print("hp f32:  step %.4f s  %8.0f tokens/s  peak RSS %6.1f MiB"
              % (f32_s, tokens / f32_s, f32_rss / 2**20))
    print("pytorch: step %.4f s  %8.0f tokens/s  peak RSS %6.1f MiB  (torch %s)"
          % (torch_s, tokens / torch_s, torch_rss / 2**20, torch_version()))
    print("ratio hp/pytorch step time: %.3f (target <= 0.7)" % (hp_s / torch_s))
    if bf16:
        print("ratio hp bf16/hp f32 step time: %.3f" % (hp_s / f32_s))


def torch_version():
    out = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
