"""python3 -m hp_export MODULE:FACTORY --batch B --seq T [flags] -o job.pb --weights w.safetensors

MODULE is imported (a dotted name, or a path to a .py file); FACTORY() returns the model (an
nn.Module whose forward(tokens) gives logits [B, T, V]; with --loss none, forward(tokens,
labels) returns the loss). Every flag this command does not know goes to `hpctl new` as it
is (--fsdp, --mesh, --steps, --lr, --data, --place, ...). Exit 0 with the job written, 1 when
the model cannot be exported (one message lists every op hp lacks), 2 on a usage error.
"""
import argparse
import importlib
import importlib.util
import os
import sys

import torch

from . import ExportError, default_loss, export


def _load(spec):
    if ":" not in spec:
        raise SystemExit("hp_export: '%s' is not MODULE:FACTORY" % spec)
    mod, fn = spec.rsplit(":", 1)
    if mod.endswith(".py") or os.sep in mod:
        s = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(mod))[0],
                                                   mod)
        m = importlib.util.module_from_spec(s)
        sys.path.insert(0, os.path.dirname(os.path.abspath(mod)))
        s.loader.exec_module(m)
    else:
        sys.path.insert(0, os.getcwd())
        m = importlib.import_module(mod)
    if not hasattr(m, fn):
        raise SystemExit("hp_export: module '%s' has no '%s'" % (mod, fn))
    return getattr(m, fn)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m hp_export", description=__doc__.split("\n")[0],
                                 epilog="Other flags are passed to hpctl new.")
    ap.add_argument("model", help="MODULE:FACTORY (FACTORY() returns the nn.Module)")
    ap.add_argument("--batch", type=int, required=True, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, required=True, help="sequence length")
    ap.add_argument("-o", "--output", required=True, help="the job file to write")
    ap.add_argument("--weights", help="where the model's state goes (default: JOB.safetensors)")
    ap.add_argument("--hpir", help="keep the graph's text IR here (default: JOB.hpir)")
    ap.add_argument("--autodiff", choices=["torch", "hp"], default="torch",
                    help="torch: capture forward + backward (make_fx of autograd.grad); hp: "
                         "capture the forward, hp's autodiff adds the backward")
    ap.add_argument("--loss", default="cross_entropy",
                    help="cross_entropy (default: logits vs labels), none (the model returns "
                         "its loss), or MODULE:FN with FN(output, labels)")
    ap.add_argument("--torch-seed", dest="seed", type=int, default=None,
                    help="torch.manual_seed before FACTORY()")
    ap.add_argument("--hpctl", help="the hpctl binary (default: $HPCTL, else PATH)")
    args, rest = ap.parse_known_args(argv)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model = _load(args.model)()
    if args.loss == "cross_entropy":
        loss = default_loss
    elif args.loss == "none":
        loss = None
    else:
        loss = _load(args.loss)
    x = torch.zeros(args.batch, args.seq, dtype=torch.int64)
    try:
        job = export(model, (x, x.clone()), loss, out=args.output, weights=args.weights,
                     hpir_path=args.hpir, autodiff=args.autodiff, hpctl=args.hpctl,
                     extra_args=rest)
    except ExportError as e:
        print("hp_export: %s" % e, file=sys.stderr)
        return 1
    print("wrote %s (weights %s)" % (job, args.weights or os.path.splitext(job)[0] +
                                     ".safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
