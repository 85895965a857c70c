"""The Python between the driver's floor and ``predict``, one layer of malinn's call at a time.

For each network of Rovder's Table 10.5 (``models.py``) at batch 1 on one device, medians of
--repeat rounds, each round one call of every variant in turn (the order turned each round, as
``overhead.py`` times them):

* ``floor``: ``overhead.py``'s plain pyopencl program (its own input and output arrays);
* ``bare``: the same pyopencl calls on the plan's buffers and staging (``pyopencl.enqueue_copy``,
  ``enqueue_nd_range_kernel``): the floor as the plan holds its data;
* ``run_pass``: ``Device.run_pass`` (the backend's one call for a pass);
* ``plan_run``: ``Plan.run`` (the device's lock, the input's staging, the outputs cut and copied);
* ``predict``: ``model.predict(x)`` (its checks, or the last call's plan for an array of its shape).

Each difference is what one layer of malinn costs per call (the target: ``predict`` within 1.3x of the
floor). OpenCL devices only.

Run:  python3 benchmarks/python_overhead.py [--device D] [--repeat 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

import malinn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build  # noqa: E402
from overhead import floor_runner  # noqa: E402
from peers import interleaved_median_times, write_results  # noqa: E402


def variants(model, x) -> dict:
    """``{name: callable}`` of every layer of ``model.predict(x)``, each checked against predict."""
    want = model.predict(x)
    plan = model.plan(x.shape[0])
    device, queue = plan.device, plan.device.queue
    (in_buffer, _, _, direct), = plan._io[0]
    (out_buffer, out_staging), = plan._io[1]
    if not direct:
        raise SystemExit("this probe times inputs uploaded from the caller's array (Plan._direct)")
    launches = [(launch.handle, launch.global_size, launch.local_size) for launch in plan.launches]

    def bare():
        event = cl.enqueue_copy(queue, in_buffer, x, is_blocking=False)
        for kernel, global_size, local_size in launches:
            cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
        cl.enqueue_copy(queue, out_staging, out_buffer, is_blocking=True)
        del event

    def run_pass():
        with device.lock:
            device.run_pass([(in_buffer, x)], plan.launches, plan._io[1])

    found = {"floor": floor_runner(plan, x), "bare": bare, "run_pass": run_pass,
             "plan_run": lambda: plan.run([x]), "predict": lambda: model.predict(x)}
    np.testing.assert_array_equal(plan.run([x])[0], want)
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default device)")
    parser.add_argument("--repeat", type=int, default=400, help="rounds; the medians count (default: 400)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    if device.backend != "opencl":
        raise SystemExit(f"{device.name} is a {device.backend} device: this probe times pyopencl's calls")
    print(f"device: {device}")
    rows = []
    for name, widths in MODELS.items():
        model = build(widths)
        x = np.random.default_rng(1).random((1, widths[0]), dtype=np.float32)
        row = {"model": name, "batch": 1,
               **interleaved_median_times(variants(model, x), args.repeat, warmup=20)}
        rows.append(row)
        steps = ["floor", "bare", "run_pass", "plan_run", "predict"]
        print(f"{name:<14} " + "  ".join(f"{s} {row[s] * 1e6:6.1f}" for s in steps) + " us;  "
              + ", ".join(f"{b} +{(row[b] - row[a]) * 1e6:.1f}" for a, b in zip(steps[1:], steps[2:])), flush=True)
    if args.json:
        write_results(args.json, device, rows)


if __name__ == "__main__":
    main()
