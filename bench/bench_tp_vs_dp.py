#!/usr/bin/python3
"""bench/bench_tp_vs_dp.py — tensor parallelism against data parallelism at world 2.

The same Llama-3 job (debugmodel shape unless overridden) on two ranks of this machine (shm
communicator, CPU backend), in the same run, interleaved `--repeat` times:
  tp=2         torchtitan's Llama TP plan (hpctl new --tp-plan llama), the whole batch on
               both ranks;
  tp=2 lp      the same with loss parallel;
  dp=2 fsdp    FSDP over both ranks (every parameter sharded), half the batch on each;
  dp=2 ddp     parameters replicated, gradients all-reduced, half the batch on each.
For each: the median step time, tokens/s per rank (torchtitan's: tp ranks share their
tokens), communication per step (the plan's bytes and the comm thread's busy time), the
plan's per-rank memory (parameters, gradients, optimizer state, activations), and the
measured peak RSS of rank 0. The ratio printed last is tp=2 / dp=2 fsdp step time.

usage: bench_tp_vs_dp.py [--build DIR] [--steps N] [--warmup N] [--threads N] [--repeat R]
                         [--batch B] [--seq T] [--layers L] [--dim D]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = ["--fsdp", "layers", "--fsdp", "tok_embeddings", "--fsdp", "output", "--fsdp", "norm"]
PLANS = [
    ("tp=2", ["--mesh", "tp=2", "--tp-plan", "llama"]),
    ("tp=2 lp", ["--mesh", "tp=2", "--tp-plan", "llama", "--loss-parallel"]),
    ("dp=2 fsdp", ["--mesh", "dp=2"] + FSDP),
    ("dp=2 ddp", ["--mesh", "dp=2"]),
]


def hp(a, *args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def make_job(a, tmp, k, flags):
    job = os.path.join(tmp, "job%d.pb" % k)
    hp(a, os.path.join(a.build, "client", "hpctl"), "new", "--model", "llama3:debugmodel",
       "--batch", str(a.batch), "--seq", str(a.seq), "--layers", str(a.layers), "--dim",
       str(a.dim), "--steps", str(a.steps), "--log-interval", "1", *flags, "-o", job)
    plan = json.loads(hp(a, os.path.join(a.build, "client", "hpctl"), "plan", job,
                         "--json").stdout)
    return job, plan


def train(a, tmp, k, job, rep):
    out = os.path.join(tmp, "run%d-%d" % (k, rep))
    hp(a, os.path.join(a.build, "worker", "hp-worker"), "--standalone", job, "--out", out,
       "--threads", str(a.threads), env=dict(os.environ, HP_CPU_PEAK_FLOPS="1e11"))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][a.warmup:]
    med = lambda key: statistics.median(r[key] for r in rows)
    return {"step": med("step_time_s"), "tps": med("tps"), "busy": med("comm_busy_s"),
            "rss": max(r["memory_bytes"] for r in rows), "loss": rows[-1]["loss"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=256)
    a = ap.parse_args()
    print("llama3 debugmodel shape: dim %d, %d layers, global batch %d x seq %d, world 2 (shm), "
          "%d thread(s) per rank; median of %d steps after %d, %d interleaved repeats" %
          (a.dim, a.layers, a.batch, a.seq, a.threads, a.steps - a.warmup, a.warmup, a.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [make_job(a, tmp, k, flags) for k, (_, flags) in enumerate(PLANS)]
        runs = [[] for _ in PLANS]
        for rep in range(a.repeat):
            for k, (job, _) in enumerate(jobs):
                runs[k].append(train(a, tmp, k, job, rep))
    mib = 1 << 20
    print("%-10s %9s %9s %10s %9s %8s %8s %8s %8s %9s" %
          ("plan", "step s", "tps/rank", "comm MiB", "busy s", "params", "grads", "optim",
           "acts", "rss MiB"))
    res = {}
    for k, (name, _) in enumerate(PLANS):
        plan = jobs[k][1]
        m, c = plan["memory"], plan["communication"]
        r = {key: statistics.median(x[key] for x in runs[k]) for key in ("step", "tps", "busy")}
        r["rss"] = max(x["rss"] for x in runs[k])
        res[name] = r
        print("%-10s %9.4f %9.0f %10.2f %9.4f %8.2f %8.2f %8.2f %8.2f %9.1f" %
              (name, r["step"], r["tps"], c["bytes_per_step"] / mib, r["busy"],
               m["params"] / mib, m["grads"] / mib, m["optimizer"] / mib,
               m["activations"] / mib, r["rss"] / mib))
    print("(params, grads, optim, acts: the plan's per-rank MiB; rss: rank 0's measured peak)")
    losses = {name: runs[k][0]["loss"] for k, (name, _) in enumerate(PLANS)}
    spread = max(losses.values()) - min(losses.values())
    print("last loss of every plan within %.2g of each other" % spread)
    print("step time tp=2 / dp=2 fsdp: %.3f; tp=2 / dp=2 ddp: %.3f" %
          (res["tp=2"]["step"] / res["dp=2 fsdp"]["step"],
           res["tp=2"]["step"] / res["dp=2 ddp"]["step"]))


if __name__ == "__main__":
    sys.exit(main())
