"""The four networks of Rovder's Table 10.5 end to end, beside numpy, TensorFlow and torch.

Partial MNIST 640-150-10, Partial CIFAR 256-128-10, Full MNIST 784-2500-2000-10 and Full CIFAR
3072-4096-3072-10, ReLU between layers, random weights. Each is timed from a host numpy batch to a
host numpy result (malinn: one upload, the layers on the device, one download), median of
--repeat runs after a warm-up, at --batch (the thesis: 100) and at batch 1 (latency). Peers in the
same run: numpy float32 on the host CPU, TensorFlow-cpu ``model(x)`` (in a subprocess), and torch
on the CUDA GPU (when present, TF32 off, host to host like malinn).

Besides the host-to-host times: ``kernels`` is the device time of malinn's launches alone (OpenCL
profiling events, median of --repeat), ``matmul_kernels`` that of its matmul launches, and
``weights_gbs`` the weights' bytes over the matmuls' time (the launches that read weights), beside
``copy_gbs``, a device-to-device copy of 1 GiB on the same device measured in the same run (bytes
read plus written over its time): the bandwidth a batch-1 Dense layer can reach. ``steps`` lists each
launching step's kernel and median device time (OpenCL profiling events; on the OpenGL backend,
``GL_TIMESTAMP`` queries around each launch), printed under its row: where a network's time goes.

With ``--precision fp32 fp16-storage int8-weights`` each network runs in every precision listed, in
the same run (peers once, beside the first): each row then gives ``precision``, ``matmul_kernels``
(device time of the weight-streaming matmul launches alone, profiling events) and
``speedup_matmul`` / ``speedup_e2e`` over the row of the first precision, and ``weight_bytes`` (the
weights' device memory in that precision). ``speedup_matmul`` comes from passes of every precision's
plan interleaved (one pass of each in turn, --repeat times, medians: ``matmul_interleaved``), so
that a machine whose speed drifts during the run, as a shared CPU's does, moves every precision alike. Results are checked against numpy computed with the
weights that precision stores.

With several devices (``--device 0:0,gl:0``: the OpenCL GPU and the same GPU through OpenGL) each
network runs on each device in the same run, the peers timed once per network and batch and
shared by the devices' rows (each row names its ``device``); ``ratios`` then gives, per network,
batch and precision, each further device's times over the first's (``malinn``: host to host,
``launch_wall``: the plan's launches from enqueue until the device finished, measured the same way
on every backend): with --device opencl:gpu,gl:gpu, GL over OpenCL (the target: below 1.5).

The results go to ``benchmarks/results/models_<device>.json`` (``models_precision_<device>.json``
with several precisions, ``models_backends_<device>.json`` with several devices) unless --out says
otherwise. --quick: the two Partial networks, 3 repeats, no TensorFlow.

Run:  python benchmarks/models.py [--device D[,D2...]] [--batch 100] [--repeat 10] [--precision P ...] [--quick]
"""

from __future__ import annotations

import sys
import time

import harness
import numpy as np
from harness import median_time, tensorflow_times, torch_cuda

import malinn
from malinn.errors import BackendError
from malinn.layers import Dense
from malinn.library.precision import effective

MODELS = {
    "Partial MNIST": [640, 150, 10],
    "Partial CIFAR": [256, 128, 10],
    "Full MNIST": [784, 2500, 2000, 10],
    "Full CIFAR": [3072, 4096, 3072, 10],
}


def build(widths, seed=0):
    rng = np.random.default_rng(seed)
    layers = [Dense(w, activation="relu" if i < len(widths) - 2 else None) for i, w in enumerate(widths[1:])]
    model = malinn.Sequential(layers)
    model.build((None, widths[0]))
    model.set_weights(
        [(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32) for w in model.get_weights()]
    )
    return model


def numpy_forward(weights, x):
    h = x
    for i in range(0, len(weights), 2):
        h = h @ weights[i] + weights[i + 1]
        if i < len(weights) - 2:
            h = np.maximum(h, 0)
    return h


def torch_forward(torch, weights):
    ws = [torch.from_numpy(w).cuda() for w in weights]

    def run(x):
        """``x``: a numpy array, or a torch tensor on the host (a ``pin_memory()`` one is copied
        without blocking, as a page-locked upload is)."""
        h = (x if isinstance(x, torch.Tensor) else torch.from_numpy(x)).cuda(non_blocking=True)
        for i in range(0, len(ws), 2):
            h = h @ ws[i] + ws[i + 1]
            if i < len(ws) - 2:
                h = torch.relu(h)
        return h.cpu().numpy()

    return run


def launch_times(plan, x, repeat: int) -> list:
    """Per pass (``repeat`` of them, the input uploaded first), each launch's device seconds:
    OpenCL profiling events, or on the OpenGL backend ``GL_TIMESTAMP`` queries around each launch
    (``GLDevice.launch_seconds``; only where ``timer_queries``)."""
    device = plan.device
    plan.run([x])
    passes = []
    for _ in range(repeat):
        if device.backend == "opencl":
            passes.append(pass_seconds(plan))
        else:
            passes.append(device.launch_seconds(plan.launches))
    return passes


def pass_seconds(plan) -> list:
    """One pass of an OpenCL plan's launches (its input as last uploaded): each launch's device
    seconds (profiling events)."""
    with plan.device.lock:
        events = [launch.enqueue() for launch in plan.launches]
        plan.device.finish()
    return [(event.profile.end - event.profile.start) * 1e-9 for event in events]


def matmul_launches(plan) -> set:
    """The ids of ``plan``'s matmul launches (the layers that stream the weights)."""
    return {id(step.launch) for step in plan.steps if step.kind.name == "matmul" and step.launch is not None}


def kernel_seconds(plan, x, repeat: int, matmul_only: bool = False) -> float:
    """Median device seconds of the plan's launches (profiling events; on the OpenGL backend, which
    has none here, the launches' wall time until the device finishes), its input uploaded first;
    ``matmul_only``: of its matmul launches alone (the layers that stream the weights)."""
    if plan.device.backend != "opencl":
        return launch_wall_seconds(plan, x, repeat)
    matmuls = matmul_launches(plan)
    counted = [not matmul_only or id(launch) in matmuls for launch in plan.launches]
    return float(np.median([sum(t for t, c in zip(times, counted) if c) for times in launch_times(plan, x, repeat)]))


def interleaved_matmul_seconds(plans, x, repeat: int) -> list:
    """Per plan (of one network on one OpenCL device, in different precisions), the median device
    seconds of its matmul launches, from ``repeat`` rounds that each run one pass of every plan (the
    order turned each round): the same moments of the machine for every plan."""
    matmuls = [matmul_launches(plan) for plan in plans]
    for plan in plans:
        plan.run([x])
    times = [[] for _ in plans]
    for i in range(repeat):
        for j in ((i + k) % len(plans) for k in range(len(plans))):
            seconds = pass_seconds(plans[j])
            times[j].append(sum(t for t, launch in zip(seconds, plans[j].launches) if id(launch) in matmuls[j]))
    return [float(np.median(t)) for t in times]


def step_seconds(plan, x, repeat: int) -> list:
    """Per step that launches: its kernel (as ``summary`` names it), output shape and median device
    seconds (OpenCL: profiling events; OpenGL: ``GL_TIMESTAMP`` queries around each launch,
    ``GLDevice.launch_seconds``; an empty list on a device with neither): where a network's time goes."""
    device = plan.device
    if not (device.backend == "opencl" or getattr(device, "timer_queries", False)):
        return []
    passes = launch_times(plan, x, repeat)
    index = {id(launch): i for i, launch in enumerate(plan.launches)}
    return [
        {
            "layers": row["layers"],
            "kernel": row["kernel"],
            "kind": row["kind"],
            "shape": list(row["shape"]),
            "seconds": float(np.median([times[index[id(step.launch)]] for times in passes])),
        }
        for step, row in zip(plan.steps, plan.describe())
        if step.launch is not None
    ]


def launch_wall_seconds(plan, x, repeat: int) -> float:
    """Median wall seconds of the plan's launches from the first enqueue until the device finished
    (its input uploaded first): the same measure on every backend, for comparing backends."""
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


def backend_ratios(rows, devices):
    """Per network, batch and precision: each device's ``malinn``, ``kernels`` and ``launch_wall``
    over the first device's (above 1: slower than the first device)."""
    first = devices[0].describe()["index"]
    by_key = {(r["model"], r["batch"], r["precision"], r["device"]): r for r in rows}
    ratios = []
    for r in rows:
        base = by_key.get((r["model"], r["batch"], r["precision"], first))
        if r["device"] == first or base is None:
            continue
        ratios.append(
            {
                "model": r["model"],
                "batch": r["batch"],
                "precision": r["precision"],
                "device": r["device"],
                "backend": r["backend"],
                "over": first,
                "over_backend": base["backend"],
                **{key: r[key] / base[key] for key in ("malinn", "kernels", "launch_wall")},
            }
        )
    return ratios


def effective_weights(weights, precision):
    """The Keras-shaped weights as ``precision`` stores them (kernels only; biases stay float)."""
    return [effective(w.T, precision).T if i % 2 == 0 else w for i, w in enumerate(weights)]


def copy_bandwidth(device, nbytes: int = 2**30, repeat: int = 5) -> float:
    """Bytes read plus written per second by a device-to-device copy of ``nbytes`` (profiling events;
    on the OpenGL backend, ``glCopyBufferSubData`` timed until the device finishes)."""
    nbytes = min(nbytes, device.max_allocation // 2)
    src, dst = device.alloc(nbytes, "copy source"), device.alloc(nbytes, "copy destination")
    times = []
    if device.backend != "opencl":
        for _ in range(repeat + 1):
            with device:
                device.ctx.finish()
                t = time.perf_counter()
                device.ctx.copy_buffer(dst, src, nbytes)
                device.ctx.finish()
                times.append(time.perf_counter() - t)
        return 2 * nbytes / float(np.median(times[1:]))
    import pyopencl as cl

    for _ in range(repeat + 1):
        event = cl.enqueue_copy(device.timing_queue, dst, src, byte_count=nbytes)
        event.wait()
        times.append((event.profile.end - event.profile.start) * 1e-9)
    return 2 * nbytes / float(np.median(times[1:]))


def time_row(model, device, name, widths, batch, precision, weights, x, repeat, copy_gbs):
    """One device's figures for one network, batch and precision (the model set to that precision)."""
    malinn.set_device(device)
    model.precision = precision
    stored = effective_weights(weights, precision)
    y = model.predict(x)
    assert np.abs(y - numpy_forward(stored, x)).max() <= 1e-4 * max(1, np.abs(y).max()), (name, precision, device.name)
    row = {
        "model": name,
        "widths": widths,
        "batch": batch,
        "precision": precision,
        "device": device.describe()["index"],
        "backend": device.backend,
        "malinn": median_time(lambda: model.predict(x), repeat),
    }
    plan = model.plan(batch, device)
    row["kernels"] = kernel_seconds(plan, x, repeat)
    row["matmul_kernels"] = kernel_seconds(plan, x, repeat, matmul_only=True)
    row["launch_wall"] = launch_wall_seconds(plan, x, repeat)
    row["launches"] = len(plan.launches)
    row["steps"] = step_seconds(plan, x, repeat)
    row["weight_bytes"] = sum(plan.weight_sizes())
    row["weights_gbs"] = row["weight_bytes"] / row["matmul_kernels"] / 1e9
    row["copy_gbs"] = copy_gbs
    return row


def main(argv=None):
    parser = harness.arguments(__doc__, repeat=10, several_devices=True)
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="samples per predict; batch 1 (latency) is always timed too (default: 100)",
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
        "--no-tensorflow",
        action="store_true",
        help="skip the TensorFlow-cpu peer (it runs in a subprocess and is slow to start; skipped with --quick)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=["fp32"],
        metavar="P",
        choices=["fp32", "fp16-storage", "fp16", "int8-weights"],
        help="weight precisions to run each network in, the first the baseline (default: fp32)",
    )
    args = harness.parse(parser, argv)
    args.models = args.models or (["Partial MNIST", "Partial CIFAR"] if args.quick else list(MODELS))
    args.no_tensorflow = args.no_tensorflow or args.quick
    devices = harness.devices(args.device)
    torch = torch_cuda()
    for device in devices:
        print(f"device {device.describe()['index']}: {device}")
    print("ms per batch (host to host); ratio = peer / malinn (> 1: malinn faster)")
    copy = {}
    for device in devices:
        copy[device.describe()["index"]] = copy_bandwidth(device, 2**26 if args.quick else 2**30) / 1e9
        print(
            f"{device.describe()['index']}: device-to-device copy: {copy[device.describe()['index']]:.0f} GB/s "
            "(read + written)"
        )
    results = []
    for name in args.models:
        widths = MODELS[name]
        model = build(widths)
        weights = model.get_weights()
        for batch in sorted({args.batch, 1}, reverse=True):
            x = np.random.default_rng(1).random((batch, widths[0]), dtype=np.float32)
            peers = {"numpy": median_time(lambda: numpy_forward(weights, x), args.repeat)}
            if torch is not None:
                run = torch_forward(torch, weights)
                peers["torch"] = median_time(lambda: run(x), args.repeat, warmup=3)
            if not args.no_tensorflow:
                tf = tensorflow_times(widths, batch, args.repeat)
                if tf is not None:
                    peers["tensorflow"] = tf["seconds"]
            for device in devices:
                where = device.describe()["index"]
                base, plans = None, []
                for precision in args.precision:
                    try:
                        row = time_row(
                            model, device, name, widths, batch, precision, weights, x, args.repeat, copy[where]
                        )
                    except BackendError as exc:  # a precision this backend has no kernel for
                        print(f"{name:<14} batch {batch:>4} {precision:<13} on {where}: skipped ({exc})", flush=True)
                        continue
                    if base is None:
                        base = row
                        row.update(peers)
                    else:
                        row["speedup_e2e"] = base["malinn"] / row["malinn"]
                    results.append(row)
                    plans.append((row, model.plan(batch, device)))
                if len(plans) > 1 and device.backend == "opencl":
                    seconds = interleaved_matmul_seconds([plan for _, plan in plans], x, args.repeat)
                    for (row, _), s in zip(plans, seconds):
                        row["matmul_interleaved"] = s
                        if row is not base:
                            row["speedup_matmul"] = seconds[0] / s
                elif len(plans) > 1:
                    for row, _ in plans[1:]:
                        row["speedup_matmul"] = base["matmul_kernels"] / row["matmul_kernels"]
                for row, _ in plans:
                    shown = "  ".join(
                        f"{p} {row[p] * 1e3:8.3f} ({row[p] / row['malinn']:5.2f}x)"
                        for p in ("numpy", "tensorflow", "torch")
                        if p in row
                    )
                    gain = (
                        f"  matmuls {row['speedup_matmul']:.2f}x"
                        + (
                            f" (interleaved: {row['matmul_interleaved'] * 1e3:.3f} against "
                            f"{base['matmul_interleaved'] * 1e3:.3f} ms)"
                            if "matmul_interleaved" in row
                            else ""
                        )
                        + f", end to end {row['speedup_e2e']:.2f}x faster than {base['precision']}"
                        if row is not base
                        else ""
                    )
                    print(
                        f"{name:<14} batch {batch:>4} {row['precision']:<13}"
                        + (f" {where:<5}" if len(devices) > 1 else "")
                        + f": malinn {row['malinn'] * 1e3:8.3f}  {shown}  "
                        f"[{row['launches']} launches, kernels {row['kernels'] * 1e3:.3f} ms, matmuls "
                        f"{row['matmul_kernels'] * 1e3:.3f} ms, weights ({row['weight_bytes'] / 2**20:.1f} MiB) read "
                        f"at {row['weights_gbs']:.0f} GB/s = {row['weights_gbs'] / copy[where]:.0%} of the copy]{gain}",
                        flush=True,
                    )
                    for step in row["steps"]:
                        print(
                            f"    {step['seconds'] * 1e6:8.1f} us  {'x'.join(map(str, step['shape'])):<12} "
                            f"{step['kernel']}",
                            flush=True,
                        )
    ratios = backend_ratios(results, devices) if len(devices) > 1 else []
    for r in ratios:
        print(
            f"{r['model']:<14} batch {r['batch']:>4} {r['precision']:<13}: {r['device']} / {r['over']} = "
            f"{r['malinn']:.2f}x host to host, {r['launch_wall']:.2f}x launches until finished"
        )
    first = devices[0]
    fields = {
        "matmul": malinn.ops.kernel_for("matmul", first).codename,
        "copy_gbs": copy[first.describe()["index"]],
        "precisions": args.precision,
    }
    if len(devices) > 1:
        fields["devices"] = [
            {
                **harness.describe(d),
                "matmul": malinn.ops.kernel_for("matmul", d).codename,
                "copy_gbs": copy[d.describe()["index"]],
            }
            for d in devices
        ]
        fields["ratios"] = ratios
    name = "models_backends" if len(devices) > 1 else "models_precision" if len(args.precision) > 1 else "models"
    harness.save(name, first, results, args, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
