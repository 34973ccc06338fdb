#!/usr/bin/env python3
"""The cost model against reality on this machine (issue: predicted vs measured within 25%).

Measures the cpu device profile (`hp-worker --probe-profile`), then for the debugmodel shape
(dim 256, 6 layers, 16 heads, vocab 2048) at world 1, dp=2 (FSDP), tp=2 (torchtitan's TP plan)
and dp=2,tp=2 (TP plan + FSDP): `hpctl plan --json`'s estimated step time beside the measured
median step time of `hp-worker --standalone` (steps after the first two), and their ratio.

    python3 bench/bench_cost_model.py [--build build] [--batch 4 --seq 256 --steps 8 --threads 1]

Ranks share this machine's cores (hp-worker splits them; the cost model prices each rank at its
share of the host's probed peak and memory bandwidth). --threads T pins each rank's threads and
probes with T.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

FSDP = ["--fsdp", "layers", "--fsdp", "tok_embeddings", "--fsdp", "output", "--fsdp", "norm"]
CONFIGS = [
    ("world 1", []),
    ("dp=2 FSDP", ["--mesh", "dp=2"] + FSDP),
    ("tp=2", ["--mesh", "tp=2", "--tp-plan", "llama"]),
    ("dp=2,tp=2", ["--mesh", "dp=2,tp=2", "--tp-plan", "llama"] + FSDP),
]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench_cost_model: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="0: hp-worker's default (the cores, "
                    "split between the ranks)")
    a = ap.parse_args()
    hpctl = os.path.join(a.build, "client", "hpctl")
    worker = os.path.join(a.build, "worker", "hp-worker")
    probe = [worker, "--probe-profile"] + (["--threads", str(a.threads)] if a.threads else [])
    print(run(probe).strip())
    print(f"uptime: {os.getloadavg()[0]:.1f} load average (the measured steps are wall time: "
          "other processes' load lengthens them)")
    print(f"\n{'plan':<12} {'predicted':>10} {'measured':>10} {'ratio':>7} {'best step':>10}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in CONFIGS:
            job = os.path.join(tmp, name.replace(" ", "_").replace(",", "_").replace("=", "") + ".pb")
            run([hpctl, "new", "--model", "llama3:debugmodel", "--batch", str(a.batch), "--seq",
                 str(a.seq), "--steps", str(a.steps), "--log-interval", "1", "-o", job] + flags)
            plan = json.loads(run([hpctl, "plan", job, "--json"]))
            predicted = plan["estimate"]["step_s"]
            world = plan["world"]
            out = job + ".out"
            cmd = [worker, "--standalone", job, "--out", out]
            if a.threads:
                cmd += ["--threads", str(a.threads)]
            if world > 1:
                cmd += ["--world", str(world)]
            run(cmd)
            times = []
            with open(os.path.join(out, "metrics.jsonl")) as f:
                for line in f:
                    m = json.loads(line)
                    if m.get("step", 0) > 2 and m.get("rank", 0) == 0:
                        times.append(m["step_time_s"])
            measured = statistics.median(times)
            ratio = predicted / measured
            worst = max(worst, abs(ratio - 1))
            print(f"{name:<12} {predicted:>9.3f}s {measured:>9.3f}s {ratio:>7.2f} "
                  f"{min(times):>9.3f}s")
    print(f"\nworst |predicted/measured - 1| = {worst:.0%} (target <= 25%; measured: the median "
          f"step after the first two; load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
