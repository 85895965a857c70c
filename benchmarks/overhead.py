"""malinn's predict beside the driver's floor: what malinn's own Python costs on top of the launches.

For each network of Rovder's Table 10.5 (Partial MNIST 640-150-10, Partial CIFAR 256-128-10, Full
MNIST 784-2500-2000-10, Full CIFAR 3072-4096-3072-10; ReLU between layers) at batch 1 and --batch,
in one run on one device:

* ``floor``: plain pyopencl doing exactly the device work of malinn's compiled plan: one
  non-blocking upload of the input buffer's bytes (padding included) from a numpy array (its event
  held until the download: pyopencl's event waits for its copy when freed), the plan's
  N kernels (the same kernel objects, arguments and ranges) enqueued with
  ``pyopencl.enqueue_nd_range_kernel``, one blocking download of the output buffer's bytes into a
  numpy array. malinn stages both in page-locked memory on a discrete GPU (``Device.host_array``),
  which plain pyopencl does not: there it can beat the floor;
* ``empty``: the same upload, N launches of an empty kernel and the download (the driver alone);
* ``profiling_floor``: the floor on a queue with profiling enabled (``Device.timing_queue``), what
  malinn's queue was before it became a plain one, timed in rounds of its own beside the floor
  (``profiling_cost``: their ratio);
* ``malinn``: ``model.predict(x)`` (input checks, plan look-up, the same work, the output array).

The ratio malinn / floor is malinn's overhead (1.0 = none). Medians of --repeat rounds after a warm-up,
each round one call of the three in turn (the order turned each round: a drift of the machine moves
all three, not one side of the ratio; the blocks of one after another that earlier runs timed moved
Partial MNIST's ratio from 1.24x to 1.48x between four runs of one tree on one H200).

With ``--cycle N [N ...]``, each network is also called with batches of those sizes in turn (a
server's calls, padded to a few sizes, alternate so): ``predict`` on each, beside each size's plan
run directly (``Plan.run``: the same device work without predict's checks and look-ups), per call;
the ``cycled`` rows' ``overhead`` is their ratio.

The results go to ``benchmarks/results/overhead_<device>.json`` unless --out says otherwise.
--quick: the two Partial networks, 20 rounds.

Run:  python benchmarks/overhead.py [--device D] [--batch 100] [--cycle 16 32 64] [--repeat 200] [--quick] [--out PATH]
"""

from __future__ import annotations

import sys

import harness
import numpy as np
import pyopencl as cl
from harness import interleaved_median_times
from models import MODELS, build


def floor_runner(plan, x, empty: bool = False, queue=None):
    """Plain pyopencl doing the plan's device work on input ``x`` (``empty``: empty kernels instead
    of the plan's) on ``queue`` (None: the device's)."""
    device = plan.device
    queue = queue or device.queue
    ((in_buffer, in_staging, value, _, _),) = plan._io[0]
    (output,) = plan._io[1]
    out_buffer = output.buffer
    # the plan's buffers whole (padding included), in plain memory, the input laid out as Plan.run does
    x_whole, out = np.zeros(in_staging.shape, np.float32), np.empty(plan._staging_shape(plan.outputs[0]), np.float32)
    x_whole[: x.shape[0], : value.rows] = x.reshape(x.shape[0], value.rows)
    if empty:
        program = cl.Program(device.context, "__kernel void nothing(__global float *x) { }").build()
        kernel = cl.Kernel(program, "nothing")
        kernel.set_args(in_buffer)
        launches = [(kernel, (1,), None)] * len(plan.launches)
    else:
        launches = [(launch.handle, launch.global_size, launch.local_size) for launch in plan.launches]

    def run():
        upload = cl.enqueue_copy(queue, in_buffer, x_whole, is_blocking=False)  # held: freed, it waits for the copy
        for kernel, global_size, local_size in launches:
            cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
        cl.enqueue_copy(queue, out, out_buffer, is_blocking=True)
        del upload
        return out

    return run


def cycled_row(model, name: str, sizes: list, device, repeat: int) -> dict:
    """A ``cycled`` row: ``predict`` called with batches of ``sizes`` in turn, beside each size's plan
    run directly in the same turn (seconds per call)."""
    rng = np.random.default_rng(2)
    xs = [rng.random((n, model.input_shapes[0][-1]), dtype=np.float32) for n in sizes]
    plans = [model.plan(n, device) for n in sizes]
    for plan, x in zip(plans, xs):
        np.testing.assert_array_equal(model.predict(x), plan.run([x])[0])

    def by_predict():
        for x in xs:
            model.predict(x)

    def by_plans():
        for plan, x in zip(plans, xs):
            plan.run([x])

    times = interleaved_median_times({"predict": by_predict, "plans": by_plans}, repeat, warmup=5)
    row = {
        "model": name,
        "cycle": list(sizes),
        "predict_s": times["predict"] / len(sizes),
        "plans_s": times["plans"] / len(sizes),
        "overhead": times["predict"] / times["plans"],
    }
    print(
        f"{name:<14} batches {'/'.join(map(str, sizes))} in turn: predict {row['predict_s'] * 1e3:8.4f}  "
        f"plans {row['plans_s'] * 1e3:8.4f} ms a call  overhead {row['overhead']:.2f}x",
        flush=True,
    )
    return row


def main(argv=None):
    parser = harness.arguments(__doc__, repeat=200, quick_repeat=20)
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="samples per predict besides batch 1 (planned for malinn.model.model.batch_bucket of it, so "
        "that the floor uploads what predict uploads; default: 100, the "
        "thesis's batch)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        choices=list(MODELS),
        help="networks to time, among "
        + ", ".join(repr(m) for m in MODELS)
        + " (default: all; the Partial networks with --quick)",
    )
    parser.add_argument(
        "--cycle",
        type=int,
        nargs="+",
        metavar="N",
        help="also call each network with batches of these sizes in turn, predict beside the plans run "
        "directly (the 'cycled' rows)",
    )
    args = harness.parse(parser, argv)
    args.models = args.models or (["Partial MNIST", "Partial CIFAR"] if args.quick else list(MODELS))
    (device,) = harness.devices(args.device)
    print(f"device: {device}")
    print("ms per predict (host to host); overhead = malinn / floor")
    rows, cycled = [], []
    for name in args.models:
        model = build(MODELS[name])
        if args.cycle:
            cycled.append(cycled_row(model, name, args.cycle, device, args.repeat))
        for batch in (1, args.batch):
            x = np.random.default_rng(1).random((batch, MODELS[name][0]), dtype=np.float32)
            want = model.predict(x)
            plan = model.plan(batch, device)
            if plan.batch != batch:
                raise SystemExit(f"{name}: batch {batch} is planned as {plan.batch}; time a bucket size")
            floor = floor_runner(plan, x)
            got = floor()  # the floor does exactly malinn's work
            np.testing.assert_array_equal(
                got[: want.size // want.shape[-1], : want.shape[-1]].reshape(want.shape), want
            )
            row = {
                "model": name,
                "batch": batch,
                "launches": len(plan.launches),
                "kernels": [
                    step["kernel"] + ("+" + "+".join(step["fused"]) if step["fused"] else "")
                    for step in plan.describe()
                ],
                **interleaved_median_times(
                    {"floor": floor, "empty": floor_runner(plan, x, empty=True), "malinn": lambda: model.predict(x)},
                    args.repeat,
                    warmup=5,
                ),
            }
            row["overhead"] = row["malinn"] / row["floor"]
            # apart from the rounds above: a call after one on the other queue pays for the switch
            paired = interleaved_median_times(
                {"floor": floor, "profiling_floor": floor_runner(plan, x, queue=device.timing_queue)},
                args.repeat,
                warmup=5,
            )
            row["profiling_floor"] = paired["profiling_floor"]
            row["profiling_cost"] = paired["profiling_floor"] / paired["floor"]
            rows.append(row)
            print(
                f"{name:<14} batch {batch:>4}: {row['launches']} launches  malinn {row['malinn'] * 1e3:8.4f}  "
                f"floor {row['floor'] * 1e3:8.4f}  empty kernels {row['empty'] * 1e3:8.4f}  "
                f"overhead {row['overhead']:.2f}x  floor on a profiling queue {row['profiling_cost']:.2f}x",
                flush=True,
            )
    harness.save("overhead", device, rows, args, cycled=cycled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
