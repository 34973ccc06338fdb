#!/usr/bin/python3
"""bench/gpu/roofline.py — how far each op of a profiled hp run is from its roofline, for
bench/gpu/check.sh. Reads the device time per op that HP_CUDA_PROFILE=1 prints
(worker/cuda/cuda_profile.c: op, calls, total ms, ...) and `hpctl plan --json`'s
estimate.compute_by_op for the same job on the device's profile (passes/cost.c: per op its
kernels in one step, their FLOPs and the bytes they move). Per op: the measured mean time a
kernel, the roofline's (the larger of FLOPs over the profile's peak and bytes over its memory
bandwidth, at 100% of both) and their ratio: the fraction of the roofline reached. Ops on one
side only (the optimizer's, casts the executor skips) are listed without a ratio.

Prints one line per op, the dearest measured first, then a summary line: the measured device
time of the ops both sides know, per step, against their roofline.

usage: roofline.py HP_PROFILE_LOG PLAN_JSON
Exit 2 when either input lacks its table.
"""
import json
import sys


def profile_rows(path):
    """The "device time per op" table: {op: (calls, total ms)}."""
    rows, inside = {}, False
    for line in open(path, errors="replace"):
        if line.startswith("cuda profile (HP_CUDA_PROFILE=1)"):
            inside = True
            continue
        if not inside:
            continue
        f = line.split()
        if not line.startswith(" ") or not f or f[0] == "all":
            if f and f[0] == "all" or not line.startswith(" "):
                inside = False
            continue
        if f[0] == "op" or len(f) < 6:
            continue
        try:
            rows[f[0]] = (int(f[1]), float(f[2]))
        except ValueError:
            continue
    return rows


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    prof = profile_rows(sys.argv[1])
    plan = json.load(open(sys.argv[2]))
    est = plan.get("estimate", {})
    by_op = est.get("compute_by_op", {})
    peak, bw = est.get("peak_flops", 0), est.get("memory_bandwidth", 0)
    if not prof or not by_op or peak <= 0 or bw <= 0:
        print("roofline: no profile table or no estimate.compute_by_op", file=sys.stderr)
        return 2
    rows = []
    for op in set(prof) | set(by_op):
        calls, ms = prof.get(op, (0, 0.0))
        e = by_op.get(op)
        mean_us = 1e3 * ms / calls if calls else None
        roof_us = None
        if e and e["kernels"] > 0:
            roof_us = 1e6 * max(e["flops"] / peak, e["bytes"] / bw) / e["kernels"]
        rows.append((ms, op, calls, mean_us, roof_us, e["kernels"] if e else 0))
    rows.sort(key=lambda r: (-r[0], r[1]))
    both_ms = both_roof_ms = 0.0
    steps = []
    for ms, op, calls, mean_us, roof_us, kernels in rows:
        if mean_us is not None and roof_us is not None:
            frac = roof_us / mean_us if mean_us > 0 else 0.0
            print("  %-44s %7d calls %10.1f us a call, roofline %9.1f us: %5.1f%%"
                  % (op, calls, mean_us, roof_us, 100 * frac))
            both_ms += ms
            both_roof_ms += roof_us * calls / 1e3
            steps.append(calls / kernels)
        elif mean_us is not None:
            print("  %-44s %7d calls %10.1f us a call (not in the estimate)" % (op, calls, mean_us))
        else:
            print("  %-44s %7s       (%d kernels a step in the estimate; not run or not profiled)"
                  % (op, "-", kernels))
    n = max(set(steps), key=steps.count) if steps else 0
    if n <= 0:
        print("roofline: no op on both sides", file=sys.stderr)
        return 2
    print(json.dumps({"steps": n, "measured_ms_per_step": both_ms / n,
                      "roofline_ms_per_step": both_roof_ms / n,
                      "fraction": both_roof_ms / both_ms if both_ms > 0 else 0.0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
