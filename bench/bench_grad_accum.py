#!/usr/bin/python3
"""bench/bench_grad_accum.py — gradient accumulation and evaluation on the CPU.

Gradient accumulation: the same global batch G (default 8 sequences) trained as one micro-step
of G and as k micro-steps of G/k (hpctl new --batch G/k --global-batch G), for k = 2, 4, ...
up to G: per optimizer step, the step time, tokens/s, the activation arena the plan reports
and the process's peak RSS. Peer: the one-micro-step run of the same global batch, measured in
the same run; the ratios say what accumulation costs in time and saves in memory.

Evaluation: the same one-micro-step job with --eval-interval 1 --eval-steps E, against it
without evaluation: the extra wall time per evaluated batch over the step time (the forward
pass alone: about a third of a step, the backward being two thirds of the FLOPs).

usage: bench_grad_accum.py [--build DIR] [--steps N] [--threads N] [--global-batch G]
                           [--seq T] [--layers L] [--eval-steps E]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def hpctl(build, *args):
    return subprocess.run([os.path.join(build, "client", "hpctl"), *args], check=True,
                          capture_output=True, text=True).stdout


def run(build, job, out, threads):
    t0 = time.perf_counter()
    subprocess.run([os.path.join(build, "worker", "hp-worker"), "--standalone", job, "--out", out,
                    "--threads", str(threads)], check=True, capture_output=True,
                   env=dict(os.environ, HP_CPU_PEAK_FLOPS="1e11"))
    wall = time.perf_counter() - t0
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return wall, recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--eval-steps", type=int, default=4)
    a = ap.parse_args()
    G = a.global_batch
    model = ["--model", "llama3:debugmodel", "--seq", str(a.seq), "--layers", str(a.layers),
             "--steps", str(a.steps), "--warmup", "1", "--log-interval", "1"]
    print(f"llama3 debugmodel, {a.layers} layers, seq {a.seq}, global batch {G}, "
          f"{a.threads} threads, {a.steps} steps (the first not timed)")
    with tempfile.TemporaryDirectory() as tmp:
        rows, k = [], 1
        while k <= G:
            if G % k == 0:
                job = os.path.join(tmp, f"k{k}.pb")
                flags = ["--batch", str(G // k)] + (["--global-batch", str(G)] if k > 1 else [])
                hpctl(a.build, "new", *model, *flags, "-o", job)
                plan = json.loads(hpctl(a.build, "plan", job, "--json"))
                _, recs = run(a.build, job, os.path.join(tmp, f"k{k}"), a.threads)
                step = statistics.median(r["step_time_s"] for r in recs[1:])
                rows.append((k, step, recs[-1]["tps"], plan["memory"]["activations"],
                             plan["memory"]["grad_accum"], max(r["memory_bytes"] for r in recs)))
            k *= 2
        base = rows[0]
        print(f"{'micro-steps':>11} {'batch':>5} {'step s':>8} {'x time':>7} {'tokens/s':>9} "
              f"{'act arena MiB':>13} {'x act':>6} {'accum MiB':>9} {'peak RSS MiB':>12} "
              f"{'x RSS':>6}")
        for k, step, tps, act, acc, rss in rows:
            print(f"{k:>11} {G // k:>5} {step:>8.3f} {step / base[1]:>7.2f} {tps:>9.0f} "
                  f"{act / 2**20:>13.1f} {act / base[3]:>6.2f} {acc / 2**20:>9.1f} "
                  f"{rss / 2**20:>12.1f} {rss / base[5]:>6.2f}")
        # evaluation: the forward pass alone, per batch, against a training step
        shard = os.path.join(tmp, "val.bin")
        text = open("/usr/share/common-licenses/GPL-3", "rb").read()
        n = len(text)
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack(f"<{n}H", *text))
        plain = os.path.join(tmp, "plain.pb")
        ev = os.path.join(tmp, "eval.pb")
        hpctl(a.build, "new", *model, "--batch", str(G), "-o", plain)
        hpctl(a.build, "new", *model, "--batch", str(G), "--eval-interval", "1",
              "--eval-steps", str(a.eval_steps), "--eval-data", shard, "-o", ev)
        w0, r0 = run(a.build, plain, os.path.join(tmp, "plain"), a.threads)
        w1, r1 = run(a.build, ev, os.path.join(tmp, "eval"), a.threads)
        step = statistics.median(r["step_time_s"] for r in r0[1:])
        per_batch = (w1 - w0) / (a.steps * a.eval_steps)
        print(f"evaluation: {a.steps} x {a.eval_steps} batches, {per_batch:.3f} s a batch "
              f"= {per_batch / step:.2f} x a training step ({step:.3f} s); "
              f"eval loss {r1[-1]['eval_loss']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
