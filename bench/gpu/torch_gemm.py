#!/usr/bin/python3
"""bench/gpu/torch_gemm.py — the GEMMs of a profiled hp run, each timed in PyTorch: the
kernel-level peer of hp's cuBLASLt calls in bench/gpu/check.sh. Reads the "cuda profile GEMMs by
shape" table that HP_CUDA_PROFILE=1 prints (worker/cuda/cuda_profile.c): per shape, out
[batch x] m x n = A' [m x k] . B' [k x n], which operand hp reads transposed (A, B, AB or -) and
the dtypes (in>out). Each is built in torch with the same memory layout (a transposed operand
is a .t() view, which torch hands cuBLAS as a transpose flag, as hp does) and timed with CUDA
events: the median over --repeat runs of --inner products each. bf16>f32 uses torch.mm's
out_dtype where this torch has it (else bf16 output, and the row says so).

Prints one JSON line per shape, longest in hp first: hp's and torch's TFLOP/s and their ratio;
then a summary line: hp's total ms over those shapes and torch's for the same calls, and the
ratio (hp / torch time: below 1, hp is faster).

usage: torch_gemm.py HP_PROFILE_LOG [--rows 16] [--repeat 10] [--inner 5]
Exit 3 (and a JSON line with "error") when torch has no CUDA; 2 when the log has no GEMM table.
"""
import argparse
import json
import os
import sys

import torch_peer


def gemm_rows(path):
    """The rows of hp's GEMM table: dicts of batch, m, n, k, trans, din, dout, calls, ms."""
    rows, inside = [], False
    for line in open(path, errors="replace"):
        if line.startswith("cuda profile GEMMs by shape"):
            inside = True
            continue
        if not inside:
            continue
        f = line.split()
        if len(f) != 10 or f[0] != "gemm":
            if f and not line.startswith(" "):
                inside = False  # the table ended
            continue
        try:
            din, dout = f[6].split(">")
            rows.append({"batch": int(f[1]), "m": int(f[2]), "n": int(f[3]), "k": int(f[4]),
                         "trans": f[5], "din": din, "dout": dout, "calls": int(f[7]),
                         "ms": float(f[8])})
        except ValueError:
            continue
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--inner", type=int, default=5)
    a = ap.parse_args()
    rows = gemm_rows(a.log)
    if not rows:
        print(json.dumps({"error": "%s has no GEMM table (HP_CUDA_PROFILE=1)" % a.log}))
        return 2
    peer = torch_peer.cuda_torch()
    if peer is None:
        return 3
    torch = peer[0]
    tf32 = os.environ.get("HP_CUDA_TF32", "0") == "1"  # as hp's f32 products ran
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    dev = torch.device("cuda")
    rows.sort(key=lambda r: -r["ms"])
    hp_ms = torch_ms = 0.0
    for r in rows[:a.rows]:
        b, m, n, k = r["batch"], r["m"], r["n"], r["k"]
        if r["din"] not in dt or r["dout"] not in dt:
            continue
        din = dt[r["din"]]

        def operand(rows_, cols, trans):
            shape = (cols, rows_) if trans else (rows_, cols)
            x = torch.randn(*((b,) if b > 1 else ()), *shape, device=dev, dtype=din)
            return x.transpose(-2, -1) if trans else x

        x, y = operand(m, k, "A" in r["trans"]), operand(k, n, "B" in r["trans"])
        wide = r["dout"] == "f32" and r["din"] != "f32"
        note = ""
        mm = torch.bmm if b > 1 else torch.mm
        if wide:
            try:
                mm(x, y, out_dtype=torch.float32)
                fn = lambda: mm(x, y, out_dtype=torch.float32)  # noqa: E731
            except (TypeError, RuntimeError):
                fn, note = (lambda: mm(x, y)), "torch wrote %s (no out_dtype)" % r["din"]
        else:
            fn = lambda: mm(x, y)  # noqa: E731
        t_ms = torch_peer.median_ms(torch, fn, a.repeat, a.inner)
        flops = 2.0 * b * m * n * k
        h_call = r["ms"] / r["calls"]
        hp_ms += r["ms"]
        torch_ms += t_ms * r["calls"]
        out = dict(r, hp_tflops=flops / (h_call / 1e3) / 1e12,
                   torch_tflops=flops / (t_ms / 1e3) / 1e12, hp_over_torch_time=h_call / t_ms)
        if note:
            out["note"] = note
        print(json.dumps(out))
    print(json.dumps({"torch": torch.__version__, "tf32": tf32, "hp_ms": hp_ms,
                      "torch_ms": torch_ms,
                      "hp_over_torch_time": hp_ms / torch_ms if torch_ms > 0 else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
