"""Tunes the Table 10.5 networks' own layer shapes on a device (what ``malinn tune --model`` does for
a model file): each Dense product at --batch (as the plan runs it) and at batch 1, a winner per shape
stored in the tuning database, then prints the winners. Each shape's untuned choice is timed first,
so every winner is measured against what the plan ran before.

The winners go to ``benchmarks/results/tuning_<device>.json`` unless --out says otherwise; the tuning
database (``malinn tune``'s) holds them for later runs of ``models.py``. --quick: the Partial
networks, a sample of configurations per tunable kernel, 20 s of timing at most.

Run:  python benchmarks/tune_networks.py [--device D] [--batch 100] [--budget 120] [--quick] [--out PATH]
"""

from __future__ import annotations

import sys

import harness
from models import MODELS, build

from malinn.tuning.tuner import tune


def main(argv=None):
    parser = harness.arguments(__doc__)
    parser.add_argument(
        "--batch", type=int, default=100, help="the batch tuned for besides 1, as the plan runs it (default: 100)"
    )
    parser.add_argument("--budget", type=float, help="seconds of timing at most (default: 120, 20 with --quick)")
    args = harness.parse(parser, argv)
    (device,) = harness.devices(args.device)
    budget = args.budget or (20 if args.quick else 120)
    shapes = []
    for name, widths in MODELS.items():
        if args.quick and not name.startswith("Partial"):
            continue
        model = build(widths)
        for batch in (args.batch, 1):
            shapes += [s for s in model.matmul_shapes(batch, device) if s not in shapes]
    result = tune(device, shapes=shapes, quick=args.quick, budget_s=budget, per_shape=True)
    rows = []
    for shape, won in result["shapes"].items():
        config = " ".join(f"{k}={v}" for k, v in won["defines"].items())
        print(f"{shape}: {won['codename']} {config}  {won['seconds'] * 1e3:.4f} ms  {won['gflops']:.0f} GFLOP/s")
        rows.append({"shape": str(shape), **won})
    harness.save("tuning", device, rows, args, **{k: v for k, v in result.items() if k != "shapes"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
