#!/usr/bin/python3
"""Reference for tests/worker/test_optim.c: torch.optim.AdamW + clip_grad_norm_ + torchtitan's
LR schedule, run on inputs the C test wrote.

Usage: adamw_ref.py DIR

DIR/config.txt, one "key value..." per line:
    sizes N1 N2 ...            parameter tensor sizes (float32)
    steps S                    training steps
    adamw LR BETA1 BETA2 EPS WD
    clip MAX_NORM
    sched TOTAL WARMUP DECAY_RATIO TYPE MIN_LR_FACTOR   the run's schedule (ratio < 0: none)
    probe TOTAL WARMUP DECAY_RATIO TYPE MIN_LR_FACTOR   extra schedules to tabulate (any number)
DIR/init.bin   the initial parameters, concatenated, float32
DIR/grads.bin  S x (all gradients concatenated), float32

Writes DIR/out.bin: per step, float64 grad norm (before clipping), float64 lr, then all
parameters after the step (float32); and DIR/probe.bin: for each probe line, float64 lr factors
for steps 1..TOTAL+2.
"""
import functools
import math
import os
import struct
import sys

import torch
from torch.optim.lr_scheduler import LambdaLR


def linear_warmup_stable_decay(current_step, warmup_steps, stable_steps, decay_steps,
                               lr_decay_type, min_lr_factor):
    # torchtitan/components/lr_scheduler.py (the min_lr_factor version), verbatim in logic.
    warmup_stable_steps = warmup_steps + stable_steps
    if current_step < warmup_steps:
        current_step += 1
        curr_adjustment = float(current_step / warmup_steps)
    elif current_step < warmup_stable_steps:
        curr_adjustment = 1.0
    else:
        current_step += 1
        progress = float(current_step - warmup_stable_steps) / decay_steps
        if lr_decay_type == "linear":
            curr_adjustment = 1 - progress
        elif lr_decay_type == "sqrt":
            curr_adjustment = 1 - math.sqrt(progress)
        elif lr_decay_type == "cosine":
            curr_adjustment = 0.5 * (1.0 + math.cos(math.pi * progress))
        curr_adjustment = min_lr_factor + (1 - min_lr_factor) * curr_adjustment
    return curr_adjustment


def build_lambda(total, warmup, ratio, kind, min_lr):
    # torchtitan's build_lr_schedulers; kind "none" = no decay phase.
    warmup = min(warmup, total)
    if kind == "none":
        decay = 0
    elif ratio >= 0:
        decay = round(total * ratio)
        if warmup + decay > total:
            decay = total - warmup
    else:
        decay = total - warmup
    stable = total + 1 - warmup - decay
    return functools.partial(linear_warmup_stable_decay, warmup_steps=warmup,
                             stable_steps=stable, decay_steps=decay, lr_decay_type=kind,
                             min_lr_factor=min_lr)


def main():
    d = sys.argv[1]
    cfg = {}
    probes = []
    with open(os.path.join(d, "config.txt")) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "probe":
                probes.append(parts[1:])
            else:
                cfg[parts[0]] = parts[1:]
    sizes = [int(x) for x in cfg["sizes"]]
    steps = int(cfg["steps"][0])
    lr, b1, b2, eps, wd = (float(x) for x in cfg["adamw"])
    max_norm = float(cfg["clip"][0])
    st = cfg["sched"]
    lam = build_lambda(int(st[0]), int(st[1]), float(st[2]), st[3], float(st[4]))
    total = sum(sizes)

    init = torch.from_file(os.path.join(d, "init.bin"), size=total, dtype=torch.float32)
    grads = torch.from_file(os.path.join(d, "grads.bin"), size=steps * total,
                            dtype=torch.float32).view(steps, total)
    params, off = [], 0
    for n in sizes:
        params.append(torch.nn.Parameter(init[off:off + n].clone()))
        off += n
    opt = torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                            foreach=False)
    sched = LambdaLR(opt, lam)
    with open(os.path.join(d, "out.bin"), "wb") as out:
        for s in range(steps):
            off = 0
            for p, n in zip(params, sizes):
                p.grad = grads[s, off:off + n].clone()
                off += n
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            used_lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            out.write(struct.pack("<dd", float(norm), used_lr))
            for p in params:
                out.write(p.detach().numpy().astype("<f4").tobytes())
    with open(os.path.join(d, "probe.bin"), "wb") as out:
        for pr in probes:
            total_p = int(pr[0])
            f = build_lambda(total_p, int(pr[1]), float(pr[2]), pr[3], float(pr[4]))
            for step in range(1, total_p + 3):
                c = step - 1
                try:
                    v = f(c)
                except ZeroDivisionError:
                    v = float("nan")
                out.write(struct.pack("<d", v))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
