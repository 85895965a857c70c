"""Views in a plan: Concatenate inputs written by their Dense layers straight into the
concatenation's buffer and Reshapes that launch nothing, beside the same plans with every view
turned back into its copy kernel, on one device.

Models (float32, weights random):

* ``towers``: input 256 -> four Dense(512, relu) towers -> Concatenate -> Dense(512, relu) -> Dense(10);
* ``tabular``: numeric (32) -> Dense(64, relu) and one-hot (16) -> Concatenate -> Dense(64) -> Dense(1)
  (the one-hot input's slice stays a concat launch);
* ``reshapes``: input 512 -> Dense(1024) -> Reshape((16, 64)) -> Dense(64, relu) -> Reshape((8, 2, 64))
  -> Dense(32) -> Flatten -> Dense(10) (the views where the layout keeps the flat order).

For each model and batch: the launches of each plan, the median and min time of ``Plan.run`` (upload,
launches, download; --repeat runs after a warm-up, the two plans in turns), the ratio copies/views, and the largest
difference between the two plans' results and from numpy in float64 (every view checked on this
device's kernels: C-layout writers on a GPU, R-layout ones on a CPU).

Run:  python3 benchmarks/views.py [--device D] [--batches 1 100] [--repeat 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import malinn
from malinn import Functional, Input, Sequential
from malinn.layers import Concatenate, Dense, Flatten, Reshape
from malinn.plan.builder import PlanBuilder


def towers():
    x = Input((256,), name="x")
    cat = Concatenate()([Dense(512, activation="relu")(x) for _ in range(4)])
    return Functional(x, Dense(10)(Dense(512, activation="relu")(cat)), name="towers"), [(256,)]


def tabular():
    num, hot = Input((32,), name="num"), Input((16,), name="hot")
    cat = Concatenate()([Dense(64, activation="relu")(num), hot])
    return Functional([num, hot], Dense(1)(Dense(64)(cat)), name="tabular"), [(32,), (16,)]


def reshapes():
    model = Sequential([Dense(1024), Reshape((16, 64)), Dense(64, activation="relu"), Reshape((8, 2, 64)),
                        Dense(32), Flatten(), Dense(10)], name="reshapes")
    model.build((None, 512))
    return model, [(512,)]


MODELS = {"towers": towers, "tabular": tabular, "reshapes": reshapes}


class _Copies:
    """PlanBuilder with every view turned back into its copy kernel (what the plans were before)."""

    def __enter__(self):
        self.saved = PlanBuilder._concat_slices, PlanBuilder._view_reshapes
        PlanBuilder._concat_slices = lambda builder, outputs: []
        PlanBuilder._view_reshapes = lambda builder, outputs: None

    def __exit__(self, *exc):
        PlanBuilder._concat_slices, PlanBuilder._view_reshapes = self.saved


def numpy_forward(model, xs):
    """float64 forward pass of these models' layers (Dense, Concatenate, Reshape, Flatten)."""
    values = {}
    inputs = model.inputs if isinstance(model, Functional) else None
    if inputs is None:
        y = xs[0].astype(np.float64)
        for layer in model.layers:
            y = _layer(layer, [y])
        return y
    for t, x in zip(inputs, xs):
        values[id(t)] = x.astype(np.float64)
    for node in model.nodes:
        values[id(node.output)] = _layer(node.layer, [values[id(t)] for t in node.inputs])
    return values[id(model.outputs[0])]


def _layer(layer, ys):
    if isinstance(layer, Dense):
        kernel, bias = layer.get_weights()
        y = ys[0] @ kernel + bias
        return np.maximum(y, 0) if layer.activation == "relu" else y
    if isinstance(layer, Concatenate):
        return np.concatenate(ys, axis=-1)
    if isinstance(layer, Reshape):
        return ys[0].reshape((ys[0].shape[0],) + layer.target_shape)
    return ys[0].reshape(ys[0].shape[0], -1)


def time_plans(plans, xs, repeat):
    """``[(first output, median s, min s)]`` of each plan, timed in turns (both see the same machine)."""
    outs = [plan.run(xs)[0] for plan in plans]   # warm-up
    times = [[] for _ in plans]
    for _ in range(repeat):
        for plan, spent in zip(plans, times):
            start = time.perf_counter()
            plan.run(xs)
            spent.append(time.perf_counter() - start)
    return [(out, statistics.median(t), min(t)) for out, t in zip(outs, times)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    if args.device:
        malinn.set_device(args.device)
    device = malinn.get_device()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{device.name} ({device.platform})")
    print(f"{'model':10} {'batch':>5} {'launches':>13} {'copies ms':>10} {'views ms':>9} {'ratio':>6} "
          f"{'|views-copies|':>14} {'|views-numpy|':>13}")
    for name in args.models:
        model, shapes = MODELS[name]()
        for batch in args.batches:
            xs = [rng.uniform(-1, 1, (batch,) + s).astype(np.float32) for s in shapes]
            with _Copies():
                plan_c = model._compile(device, batch, False).allocate()
            plan_v = model._compile(device, batch, False).allocate()
            (out_c, med_c, min_c), (out_v, med_v, min_v) = time_plans([plan_c, plan_v], xs, args.repeat)
            want = numpy_forward(model, xs)
            row = {"model": name, "batch": batch, "launches_copies": len(plan_c.launches),
                   "launches_views": len(plan_v.launches),
                   "views": [r["layers"] for r in plan_v.describe() if r["view"]],
                   "copies_ms": {"median": med_c * 1e3, "min": min_c * 1e3},
                   "views_ms": {"median": med_v * 1e3, "min": min_v * 1e3}, "ratio": med_c / med_v,
                   "max_diff_views_copies": float(np.abs(out_v - out_c).max()),
                   "max_error_views": float(np.abs(out_v - want).max() / max(1.0, np.abs(want).max()))}
            rows.append(row)
            print(f"{name:10} {batch:5} {row['launches_copies']:6} -> {row['launches_views']:4} {med_c * 1e3:10.3f} "
                  f"{med_v * 1e3:9.3f} {row['ratio']:6.2f} {row['max_diff_views_copies']:14.2e} "
                  f"{row['max_error_views']:13.2e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device.name, "platform": device.platform, "host": platform.node(),
                       "repeat": args.repeat, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
