#!/usr/bin/python3
"""bench/bench_overlap.py — does AutoOverlap hide communication? hp at world 2 on the shm
backend, the same FSDP job with the overlap pass on and off, in the same run.

Prints, for each: the median step time, the communication time per step (the comm thread
busy inside collectives), the part of it left exposed (compute blocked waiting for it), and
the exposed fraction. usage: bench_overlap.py [--build DIR] [--steps N] [--threads N]
[--batch B --seq T --layers L --dim D]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(a, tmp, overlap):
    job = os.path.join(tmp, "job-%s.pb" % overlap)
    cmd = [os.path.join(a.build, "client", "hpctl"), "new", "--model", "llama3:debugmodel",
           "--batch", str(a.batch), "--seq", str(a.seq), "--layers", str(a.layers),
           "--dim", str(a.dim), "--steps", str(a.steps), "--warmup", "1", "--log-interval", "1",
           "--fsdp", "layers.*", "--fsdp", "tok_embeddings.*", "--fsdp", "output.*",
           "--fsdp", "norm.*", "--mesh", "dp=2", "-o", job]
    if not overlap:
        cmd.insert(-2, "--no-overlap")
    subprocess.run(cmd, check=True, capture_output=True)
    out = os.path.join(tmp, "run-%s" % overlap)
    subprocess.run([os.path.join(a.build, "worker", "hp-worker"), "--standalone", job,
                    "--out", out, "--threads", str(a.threads)], check=True, capture_output=True,
                   env=dict(os.environ, HP_CPU_PEAK_FLOPS="1e11"))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][a.warmup:]
    med = lambda k: statistics.median(r[k] for r in rows)
    return med("step_time_s"), med("comm_busy_s"), med("comm_time_s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=256)
    a = ap.parse_args()
    print("llama3 debugmodel shape: dim %d, %d layers, global batch %d x seq %d, world 2 (shm), "
          "%d thread(s) per rank; median of %d steps after %d" %
          (a.dim, a.layers, a.batch, a.seq, a.threads, a.steps - a.warmup, a.warmup))
    with tempfile.TemporaryDirectory() as tmp:
        res = {o: run(a, tmp, o) for o in (False, True)}
    for o in (False, True):
        step, busy, exposed = res[o]
        print("overlap %-3s: step %.4f s, comm %.4f s/step, exposed %.4f s/step (%.0f%% of comm)"
              % ("on" if o else "off", step, busy, exposed, 100 * exposed / busy if busy else 0))
    print("step time on/off: %.3f" % (res[True][0] / res[False][0]))


if __name__ == "__main__":
    sys.exit(main())
