"""Global average pooling: kernels/pool.cl against kernels/global_pool.cl, beside torch.

For each image size and channel count of EfficientNetB0's squeeze-and-excitation squeezes and its
final GlobalAveragePooling2D (112 x 112 x 32 to 7 x 7 x 1280) and each batch, a
GlobalAveragePooling2D model is planned with each pool kernel the library has for a global window
(``pool``, ``global_pool``, ``global_pool_sliced`` where its constraints take the image; each chosen
with ``malinn.ops.use``; ``--configs`` adds the entries' candidates) and with the library's own
choice (``default``). Its launch is timed on the device (OpenCL profiling events, OpenGL timer
queries; median of ``--repeat`` after a warm-up), the result checked against numpy's mean in float64 (the largest
difference is recorded). Peer: torch's ``adaptive_avg_pool2d`` to 1 x 1 on a channels-last CUDA
tensor (the same memory order as malinn's), timed with CUDA events, where torch sees a CUDA GPU.

    python benchmarks/global_pool.py --device gpu            # the H200: batches 1, 32, 256
    python benchmarks/global_pool.py --device cpu --quick    # PoCL: three shapes at batch 1
    python benchmarks/global_pool.py --device gl:gpu         # the same kernels' GLSL twins

Writes benchmarks/results/global_pool_<device>.json.
"""

from __future__ import annotations

import sys

import numpy as np
from harness import arguments, devices, parse, save, torch_cuda

import malinn
from malinn import ops
from malinn.choice import kernel_choice
from malinn.layers import GlobalAveragePooling2D
from malinn.library.kernel_library import load_library

#: (image side, channels): EfficientNetB0's squeezes at 224 x 224, then its final pooling
SHAPES = [(112, 32), (56, 96), (56, 144), (28, 144), (28, 240), (14, 240), (14, 480), (14, 672), (7, 672), (7, 1152)]
SHAPES += [(7, 1280)]
QUICK = [(112, 32), (56, 144), (7, 1280)]


def pool_seconds(plan, repeat: int) -> float:
    """Median device seconds of the plan's pool launch (its only compute step)."""
    device = plan.device
    index = [s for s in plan.steps if s.launch is not None].index(
        next(s for s in plan.steps if s.launch is not None and s.kind.name == "pool")
    )
    times = []
    for _ in range(repeat + 1):
        with device.lock:
            events = [launch.enqueue() for launch in plan.launches]
            device.finish()
        times.append((events[index].profile.end - events[index].profile.start) * 1e-9)
    return float(np.median(times[1:]))


def configurations(args) -> list:
    """(label, codename, defines) of every pool kernel timed."""
    library = load_library()
    found = [("pool", "pool", None)]
    for codename in ("global_pool", "global_pool_sliced"):
        configs = library[codename].configurations() if args.configs else [dict(library[codename].defines)]
        for config in configs:
            tuned = {k: config[k] for k in ("LC", "LP", "SLICES", "UNROLL")}
            label = codename + ("" if config == dict(library[codename].defines) else f" {tuned}")
            found.append((label, codename, tuned))
    return found


def measure(device, side: int, channels: int, batch: int, codename: str | None, config, repeat: int):
    """(seconds, largest difference from numpy, the kernel the plan ran) or None where the kernel
    does not take the shape."""
    kernel_choice.forget(device)
    if codename is not None:
        ops.use("pool", codename, device, config)
    model = malinn.Sequential([GlobalAveragePooling2D()])
    model.build((None, side, side, channels))
    plan = model.plan(batch, device)
    step = next(s for s in plan.steps if s.launch is not None and s.kind.name == "pool")
    chosen = step.spec.codename
    if codename is not None and chosen != codename:
        return None
    x = np.random.default_rng(side + channels).standard_normal((batch, side, side, channels), dtype=np.float32)
    got = model.predict(x, batch_size=batch)
    error = float(np.abs(got - x.astype(np.float64).mean(axis=(1, 2))).max())
    return pool_seconds(plan, repeat), error, chosen


def torch_seconds(torch, side: int, channels: int, batch: int, repeat: int) -> float:
    """Median CUDA-event seconds of adaptive_avg_pool2d(x, 1) on a channels-last tensor."""
    x = torch.randn(batch, channels, side, side, device="cuda").contiguous(memory_format=torch.channels_last)
    for _ in range(3):
        torch.nn.functional.adaptive_avg_pool2d(x, 1)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.nn.functional.adaptive_avg_pool2d(x, 1)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = arguments(__doc__, repeat=20, quick_repeat=5)
    parser.add_argument("--batches", help="comma-separated batch sizes (default: 1,32,256 on a GPU, 1,8 on a CPU)")
    parser.add_argument("--configs", action="store_true", help="time every configuration of the new kernels")
    args = parse(parser, argv)
    (device,) = devices(args.device)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([1] if args.quick else None)
    batches = batches or ([1, 32, 256] if device.kind == "gpu" else [1, 8])
    torch = torch_cuda()
    rows = []
    for side, channels in QUICK if args.quick else SHAPES:
        for batch in batches:
            row = {"image": side, "channels": channels, "batch": batch, "ms": {}, "max_error": {}}
            for label, codename, config in configurations(args) + [("default", None, None)]:
                found = measure(device, side, channels, batch, codename, config, args.repeat)
                if found is None:
                    continue
                seconds, error, chosen = found
                row["ms"][label] = round(seconds * 1e3, 4)
                row["max_error"][label] = error
                if codename is None:
                    row["default_kernel"] = chosen
            if torch is not None:
                row["ms"]["torch adaptive_avg_pool2d"] = round(
                    torch_seconds(torch, side, channels, batch, args.repeat) * 1e3, 4
                )
            print(f"{side}x{side}x{channels} batch {batch}: " + ", ".join(f"{k} {v} ms" for k, v in row["ms"].items()))
            rows.append(row)
    kernel_choice.forget(device)
    save("global_pool", device, rows, args, torch=getattr(torch, "__version__", None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
