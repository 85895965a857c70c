"""Work-group shapes: each launch of a network's plan in the shape the library gives it and in other
shapes, device time per launch, and time per kernel family.

For each keras.applications network (MobileNetV2 and EfficientNetB0 at 224x224 by default, saved
by TensorFlow in a child process or read from ``--models``) at ``--batch``, every launch of the plan
is timed by the queue's profiling events: in the shape the plan bound (``bound``: the library's
``workgroup_bound`` and ``workgroup_items`` for the device's class where the entry has one, else
the driver's choice), in the driver's own choice (``None``) and in each candidate shape of
``CANDIDATES`` that divides its range. A row per launch gives the times; ``families`` sums each
kernel's launches in the bound shapes, the driver's and the fastest per launch. This is how the
GPU bounds of the element-wise kernels were chosen (docs/KERNELS.md). Launches whose kernel takes
only one shape (``reqd_work_group_size``) or binds its own are timed in that shape alone.

Run:  python benchmarks/workgroups.py [--device gpu] [--models DIR] [--batch 256] [--repeat 4]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import harness
import numpy as np
from throughput import CNN_SIZE, CNNS, keras_network

import malinn

#: shapes tried per two-dimensional launch (each where it divides the range and fits the device)
CANDIDATES = [
    (1, 256), (2, 128), (4, 64), (8, 32), (16, 16), (32, 8), (64, 4), (128, 2), (256, 1),
    (1, 128), (4, 32), (32, 4), (1, 512), (4, 128), (32, 16), (1, 1024), (8, 128), (32, 32),
]  # fmt: skip


def launch_ms(queue, launch, local, repeat: int) -> float | str:
    """Median device milliseconds of ``launch`` enqueued in ``local`` (None: the driver's choice),
    the first run not counted; the driver's refusal as text."""
    import pyopencl as cl

    times = []
    try:
        for _ in range(repeat + 1):
            event = cl.enqueue_nd_range_kernel(queue, launch.handle, launch.global_size, local)
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-6)
    except cl.Error as exc:
        return f"refused: {exc}"[:60]
    return float(np.median(times[1:]))


def fits(local: tuple, launch, device) -> bool:
    return (
        len(local) == len(launch.global_size)
        and np.prod(local) <= device.max_work_group_size
        and all(g % size == 0 for g, size in zip(launch.global_size, local))
    )


def network_rows(model, batch: int, device, repeat: int) -> list:
    x = np.random.default_rng(0).random((batch, CNN_SIZE, CNN_SIZE, 3), dtype=np.float32)
    model.predict(x, batch_size=batch, verbose=0)
    plan = model.plan(batch, device)
    rows = []
    for launch in plan.launches:
        bound = launch.local_size
        times = {"bound": launch_ms(device.timing_queue, launch, bound, repeat)}
        if len(launch.global_size) == 2:
            times["None"] = launch_ms(device.timing_queue, launch, None, repeat)
            for local in CANDIDATES:
                if fits(local, launch, device):
                    times[str(local)] = launch_ms(device.timing_queue, launch, local, repeat)
        measured = {k: v for k, v in times.items() if isinstance(v, float)}
        best = min(measured, key=measured.get)
        rows.append(
            {
                "function": launch.function,
                "what": launch.what,
                "global_size": list(launch.global_size),
                "bound": list(bound) if bound else None,
                "fastest": best,
                "ms": times,
            }
        )
    return rows


def families(rows: list) -> dict:
    """Per kernel: its launches' milliseconds in the bound shapes, the driver's and the fastest."""
    found: dict = {}
    for r in rows:
        ms = {k: v for k, v in r["ms"].items() if isinstance(v, float)}
        family = found.setdefault(r["function"], {"launches": 0, "bound_ms": 0.0, "driver_ms": 0.0, "fastest_ms": 0.0})
        family["launches"] += 1
        family["bound_ms"] += ms["bound"]
        family["driver_ms"] += ms.get("None", ms["bound"])
        family["fastest_ms"] += min(ms.values())
    return dict(sorted(found.items(), key=lambda kv: -kv[1]["driver_ms"]))


def main(argv=None) -> int:
    parser = harness.arguments(__doc__, repeat=4, quick_repeat=2)
    parser.add_argument("--networks", nargs="+", choices=list(CNNS), default=list(CNNS))
    parser.add_argument("--batch", type=int, default=256, help="the batch each plan is made for (default: 256)")
    parser.add_argument("--models", type=Path, help=f"a folder of saved <name>.keras files at {CNN_SIZE}x{CNN_SIZE}")
    args = harness.parse(parser, argv)
    device = harness.devices(args.device)[0]
    if device.backend != "opencl":
        raise SystemExit("workgroups.py times OpenCL launches by their profiling events: give an OpenCL device")
    rows, summary = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.networks:
            model = malinn.load_model(keras_network(name, Path(tmp), args.models))
            found = network_rows(model, args.batch, device, args.repeat)
            rows += [{"network": name, "batch": args.batch, **r} for r in found]
            summary[name] = families(found)
            total = {k: sum(f[k] for f in summary[name].values()) for k in ("bound_ms", "driver_ms", "fastest_ms")}
            print(
                f"{name} at batch {args.batch}: {len(found)} launches, bound shapes {total['bound_ms']:.3f} ms, "
                f"driver's {total['driver_ms']:.3f} ms, fastest per launch {total['fastest_ms']:.3f} ms",
                flush=True,
            )
            for function, f in list(summary[name].items())[:10]:
                print(
                    f"  {function:<20} {f['launches']:3d} launches: bound {f['bound_ms']:8.3f} ms, driver "
                    f"{f['driver_ms']:8.3f}, fastest {f['fastest_ms']:8.3f}",
                    flush=True,
                )
    harness.save("workgroups", device, rows, args, families=summary, candidates=[list(c) for c in CANDIDATES])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
