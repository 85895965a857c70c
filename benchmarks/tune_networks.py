"""Tunes the Table 10.5 networks' own layer shapes on a device (what ``malinn tune --model`` does for
a model file): each Dense product at --batch (as the plan runs it) and at batch 1, a winner per shape
stored in the tuning database, then prints the winners.

Run:  python3 benchmarks/tune_networks.py [--device D] [--batch 100] [--budget 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import malinn
from malinn.tuning.tuner import tune

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default device)")
    parser.add_argument("--batch", type=int, default=100, help="the batch tuned for besides 1, as the plan runs it (default: 100)")
    parser.add_argument("--budget", type=float, default=120, help="seconds of timing at most (default: 120)")
    parser.add_argument("--quick", action="store_true", help="a sample of configurations per tunable kernel")
    parser.add_argument("--json", metavar="PATH", help="also write the winners, as JSON, to PATH")
    args = parser.parse_args(argv)
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    shapes = []
    for widths in MODELS.values():
        model = build(widths)
        for batch in (args.batch, 1):
            shapes += [s for s in model.matmul_shapes(batch, device) if s not in shapes]
    result = tune(device, shapes=shapes, quick=args.quick, budget_s=args.budget, per_shape=True)
    for shape, won in result["shapes"].items():
        config = " ".join(f"{k}={v}" for k, v in won["defines"].items())
        print(f"{shape}: {won['codename']} {config}  {won['seconds'] * 1e3:.4f} ms  {won['gflops']:.0f} GFLOP/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.describe(), "driver": device.driver_version,
                                               **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
