"""``malinn tune``: the device's kernels timed per product shape and convolution, the winners kept."""

from __future__ import annotations

import argparse
import sys
import time

from ..backends.base import Device
from ..errors import MalinnError
from ..model.saving import load_model
from ..tuning.conv_tuner import tune_convs
from ..tuning.tuner import cache_dir, tune
from .arguments import UsageError, check_cache_dir, device_of


def cmd_tune(args: argparse.Namespace) -> int:

    check_cache_dir(cache_dir())
    device = device_of(args)
    shapes = args.shape
    if shapes:
        for m, k, n in shapes:
            largest = 4 * max(m * k, k * n, m * n)
            if largest > device.max_allocation:
                raise MalinnError(
                    f"--shape {m}x{k}x{n}: a matrix of {largest / 2**20:.0f} MiB exceeds "
                    f"{device.name}'s largest allocation ({device.max_allocation // 2**20} MiB)"
                )
    convs = []
    if args.model and shapes:
        raise UsageError(
            "tune: --model tunes the model's own shapes; give --model or --shape, not both (see malinn tune --help)"
        )
    if args.batch is not None and not args.model:
        raise UsageError(
            "tune: --batch is the batch a --model is tuned for; give --model with it (see malinn tune --help)"
        )
    batch = 100 if args.batch is None else args.batch
    if args.model:
        model = load_model(args.model, precision=args.precision)
        largest = model.max_batch(device, limit=batch)
        if largest < batch:  # no pass runs it: predict splits such a batch into passes of the largest
            raise UsageError(
                f"tune: --batch {batch} is more samples than one pass of {args.model} holds on "
                f"{device.name} (at most {largest}: predict runs a larger batch in passes of {largest}); "
                f"give --batch {largest} or less"
            )
        shapes = [shape for size in (batch, 1) for shape in model.matmul_shapes(size, device)]
        convs = [g for size in (batch, 1) for g in model.conv_geometries(size, device)]
        if not shapes and not convs:
            raise MalinnError(f"{args.model} has no Dense or convolution layer to tune for")
    started = time.perf_counter()  # --budget covers the whole run: the convolutions get what is left
    if shapes or not args.model:  # the shapes asked for, or else the standard set
        _tune_matmuls(args, device, shapes)
    if convs:
        left = None if args.budget is None else max(0.0, args.budget - (time.perf_counter() - started))
        print(f"tuning {len(set(convs))} convolution layers on {device.name}", flush=True)
        found = tune_convs(convs, device, quick=args.quick, budget_s=left, stream=sys.stdout)
        print(
            f"{len(found['convs'])} convolutions tuned ({', '.join(found['untuned']) or 'none'} left untuned), "
            f"{found['candidates']} candidates timed; stored in {found['path']}"
        )
    return 0


def _tune_matmuls(args: argparse.Namespace, device: Device, shapes: list | None) -> None:
    print(f"tuning matmul on {device.name}" + (f" for {args.model}" if args.model else ""), flush=True)
    best = tune(
        device,
        shapes=shapes,
        quick=args.quick,
        budget_s=args.budget,
        per_shape=bool(args.model),
        precision=args.precision,
    )
    failed = best.get("failed") or []
    for entry in failed[:5]:
        print(f"failed: {_described(entry)}: {entry['why']}")
    if len(failed) > 5:
        print(f"... and {len(failed) - 5} more candidates failed")
    if args.model:
        for shape, won in best["shapes"].items():
            kept = " (kept: the stored winner measured faster than this run's)" if shape in best["kept"] else ""
            print(f"{shape}: {_described(won)} - {won['gflops']:.1f} GFLOP/s{kept}")
        print(
            f"{len(best['shapes'])} shapes tuned ({', '.join(best['untuned']) or 'none'} left untuned), "
            f"{best['candidates']} candidates timed; stored in {best['path']}"
        )
        return
    if best.get("kept"):
        print(
            f"kept the stored winner {_described(best)} - {best['gflops']:.1f} GFLOP/s: it measured faster than "
            f"this run's best, cut short by its budget after {best['candidates']} candidates ({best['path']})"
        )
        return
    print(
        f"best: {_described(best)} - {best['gflops']:.1f} GFLOP/s over {len(best['shapes'])} shapes, "
        f"{best['candidates']} candidates timed; stored in {best['path']}"
    )


def _described(winner: dict) -> str:
    """A winner's codename and its defines (``gemm_tiled MWG=64 ...``; the codename alone where it has none)."""
    found = winner.get("defines")
    defines = found if isinstance(found, dict) else {}
    return " ".join([str(winner["codename"])] + [f"{k}={v}" for k, v in defines.items()])
