"""Transform feedback against compute shaders on the same GPU: the gles3 backend's
vertex-stage kernels (Cronin's GEMM: gemm_feedback, the weights in a texture) beside the gl
backend's compute shaders, and OpenCL where given, on Rovder's Table 10.5 networks.

For each network (Partial MNIST 640-150-10, Partial CIFAR 256-128-10, Full MNIST 784-2500-2000-10,
Full CIFAR 3072-4096-3072-10, ReLU between layers, softmax last) at batch 1 and --batch, on each
device: ``malinn``, host to host (one upload, the launches, one download), median of --repeat;
``launch_wall``, the plan's launches from enqueue until the device finished (the same measure on
every backend); ``layers``, each launch alone (its kernel and median seconds: GL has no profiling
events, so a launch is timed from the device idle to the device finished). Every result is checked
against numpy (``max_error``; ``correct``: at most 1e-4, else said in the output too). ``ratios`` gives each device's ``malinn`` and ``launch_wall`` over the first device's,
and ``feedback_over_compute`` the gles3 device's over the gl device's.

Run:  python3 benchmarks/gl_feedback.py [--device gl,gles3] [--batch 100] [--repeat 10] [--json out.json]
On the H200:  python3 benchmarks/gl_feedback.py --device opencl:gpu,gl:gpu,gles3:gpu --json
      benchmarks/results/gl_feedback_nvidia_h200.json
(``gles3`` named on a GPU with compute shaders serves it through its vertex stage, beside ``gl``.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MALINN_GL", "1")   # look for the OpenGL devices even beside an OpenCL GPU

import malinn  # noqa: E402
from malinn.layers import Dense  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import median_time  # noqa: E402

MODELS = {
    "Partial MNIST": [640, 150, 10],
    "Partial CIFAR": [256, 128, 10],
    "Full MNIST": [784, 2500, 2000, 10],
    "Full CIFAR": [3072, 4096, 3072, 10],
}


def build(widths, seed=0):
    rng = np.random.default_rng(seed)
    layers = [Dense(w, activation="relu" if i < len(widths) - 2 else "softmax") for i, w in enumerate(widths[1:])]
    model = malinn.Sequential(layers)
    model.build((None, widths[0]))
    model.set_weights([(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32)
                       for w in model.get_weights()])
    return model


def numpy_forward(weights, x):
    h = x.astype(np.float64)
    for i in range(0, len(weights), 2):
        h = h @ weights[i] + weights[i + 1]
        if i < len(weights) - 2:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def launch_wall(plan, x, repeat: int) -> float:
    """Median seconds of the plan's launches, enqueue to finished, its input uploaded first."""
    device = plan.device
    plan.run([x])
    totals = []
    for _ in range(repeat):
        device.finish()
        t = time.perf_counter()
        device.launch_all(plan.launches)
        device.finish()
        totals.append(time.perf_counter() - t)
    return float(np.median(totals))


def layer_times(plan, repeat: int) -> list:
    """``[kernel, median seconds]`` of each launch alone (an event's profile: OpenCL's profiling,
    GL's wall time from the device idle to the device finished)."""
    rows = []
    for launch in plan.launches:
        times = []
        for _ in range(repeat + 1):
            with plan.device.lock:
                event = launch.enqueue()
                plan.device.finish()
            times.append((event.profile.end - event.profile.start) * 1e-9)
        rows.append([launch.function, float(np.median(times[1:]))])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gl,gles3",
                        help="devices, comma-separated, the first the base of the ratios (default: gl,gles3)")
    parser.add_argument("--batch", type=int, default=100, help="samples per predict; batch 1 is timed too")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs; the median counts (default: 10)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), metavar="NAME")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    devices = [malinn.set_device(spec.strip()) for spec in args.device.split(",")]
    rows = []
    for name in args.models:
        widths = MODELS[name]
        model = build(widths)
        weights = model.get_weights()
        for batch in sorted({1, args.batch}):
            x = np.random.default_rng(batch).standard_normal((batch, widths[0])).astype(np.float32)
            want = numpy_forward(weights, x)
            for device in devices:
                plan = model.plan(batch, device)
                got = plan.run([x])[0]
                err = float(np.abs(got - want).max())
                if err > 1e-4:   # kept in the results (and said), not fatal: the run times every device
                    print(f"WRONG RESULT: {name} batch {batch} on {device.describe()['index']} ({device.name}): "
                          f"max |malinn - numpy| = {err:.3g}", flush=True)
                row = {"model": name, "batch": batch, "device": device.describe()["index"], "backend": device.backend,
                       "name": device.name, "max_error": err, "correct": err <= 1e-4,
                       "malinn": median_time(lambda: plan.run([x]), args.repeat),
                       "launch_wall": launch_wall(plan, x, args.repeat), "launches": len(plan.launches),
                       "layers": layer_times(plan, args.repeat)}
                rows.append(row)
                print(f"{name:14s} batch {batch:4d} {row['device']:9s} host to host {row['malinn'] * 1e3:8.3f} ms, "
                      f"launches {row['launch_wall'] * 1e3:8.3f} ms  "
                      + " ".join(f"{k}:{t * 1e3:.3f}" for k, t in row["layers"]), flush=True)
    first = devices[0].describe()["index"]
    by_key = {(r["model"], r["batch"], r["device"]): r for r in rows}
    ratios = [{"model": r["model"], "batch": r["batch"], "device": r["device"], "over": first,
               **{key: r[key] / by_key[(r["model"], r["batch"], first)][key] for key in ("malinn", "launch_wall")}}
              for r in rows if r["device"] != first]
    compute = next((d.describe()["index"] for d in devices if d.backend == "gl"), None)
    feedback = next((d.describe()["index"] for d in devices if d.backend == "gles3"), None)
    versus = []
    if compute and feedback:
        for r in rows:
            if r["device"] == feedback:
                base = by_key[(r["model"], r["batch"], compute)]
                versus.append({"model": r["model"], "batch": r["batch"],
                               **{key: r[key] / base[key] for key in ("malinn", "launch_wall")}})
                print(f"feedback / compute  {r['model']:14s} batch {r['batch']:4d}: host to host "
                      f"{versus[-1]['malinn']:.2f}x, launches {versus[-1]['launch_wall']:.2f}x")
    result = {"devices": [d.describe() | {"platform": d.platform} for d in devices], "batch": args.batch,
              "repeat": args.repeat, "rows": rows, "ratios": ratios, "feedback_over_compute": versus}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
