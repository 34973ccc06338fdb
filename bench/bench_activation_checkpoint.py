#!/usr/bin/python3
"""bench/bench_activation_checkpoint.py — activation checkpointing on the CPU.

The same Llama job (debugmodel layout, default 6 layers, batch 8, seq 256) trained with
`--ac none` (the peer, measured in the same run), `--ac selective`, `--ac full` and
`--ac full --ac-every 2`: per step, the measured step time and tokens/s, the activation arena
`hpctl plan` reports, the process's peak memory, and the plan's estimated step time, each as a
ratio to the peer. The losses of every run must equal the peer's bit for bit (the backward
recomputes the same values), which the bench checks and prints.

What to expect: full checkpointing keeps only what leaves each block, so the arena shrinks the
most, for about one more forward pass of the blocks (a step's FLOPs grow by about a third of
the blocks' forward share); selective keeps the matrix products and attention and recomputes
only the cheap ops between them, so it costs little time and saves less.

usage: bench_activation_checkpoint.py [--build DIR] [--steps N] [--threads N] [--batch B]
                                      [--seq T] [--layers L]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODES = [("none", []), ("selective", ["--ac", "selective"]), ("full", ["--ac", "full"]),
         ("full/2", ["--ac", "full", "--ac-every", "2"])]


def hpctl(build, *args):
    return subprocess.run([os.path.join(build, "client", "hpctl"), *args], check=True,
                          capture_output=True, text=True).stdout


def run(build, job, out, threads):
    subprocess.run([os.path.join(build, "worker", "hp-worker"), "--standalone", job, "--out", out,
                    "--threads", str(threads)], check=True, capture_output=True,
                   env=dict(os.environ, HP_CPU_PEAK_FLOPS="1e11"))
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    a = ap.parse_args()
    model = ["--model", "llama3:debugmodel", "--batch", str(a.batch), "--seq", str(a.seq),
             "--layers", str(a.layers), "--steps", str(a.steps), "--warmup", "1",
             "--log-interval", "1"]
    print(f"llama3 debugmodel, {a.layers} layers, batch {a.batch}, seq {a.seq}, "
          f"{a.threads} threads, {a.steps} steps (the first not timed); peer: --ac none")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in MODES:
            job = os.path.join(tmp, name.replace("/", "-") + ".pb")
            hpctl(a.build, "new", *model, *flags, "-o", job)
            plan = json.loads(hpctl(a.build, "plan", job, "--json"))
            recs = run(a.build, job, os.path.join(tmp, name.replace("/", "-")), a.threads)
            step = statistics.median(r["step_time_s"] for r in recs[1:])
            ac = next((p for p in plan["passes"] if p["name"] == "activation_checkpoint"), {})
            rows.append(dict(name=name, step=step, tps=recs[-1]["tps"],
                             act=plan["memory"]["activations"],
                             rss=max(r["memory_bytes"] for r in recs),
                             est=plan["estimate"]["step_s"], blocks=ac.get("ac_blocks", 0),
                             nodes=ac.get("ac_recomputed", 0),
                             losses=[r["loss"] for r in recs]))
    base = rows[0]
    print(f"{'mode':>10} {'blocks':>6} {'copies':>6} {'step s':>8} {'x time':>7} {'tokens/s':>9} "
          f"{'act arena MiB':>13} {'x act':>6} {'peak MiB':>9} {'x peak':>7} {'x est':>6} "
          f"{'losses':>9}")
    bad = 0
    for r in rows:
        same = r["losses"] == base["losses"]
        bad += not same
        print(f"{r['name']:>10} {r['blocks']:>6} {r['nodes']:>6} {r['step']:>8.3f} "
              f"{r['step'] / base['step']:>7.2f} {r['tps']:>9.0f} {r['act'] / 2**20:>13.1f} "
              f"{r['act'] / base['act']:>6.2f} {r['rss'] / 2**20:>9.1f} "
              f"{r['rss'] / base['rss']:>7.2f} {r['est'] / base['est']:>6.2f} "
              f"{'same' if same else 'DIFFER':>9}")
    print("x time, x act, x peak: measured against --ac none in this run; x est: the plan's "
          "estimated step time against its estimate for --ac none")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
