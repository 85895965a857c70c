"""GEMM GFLOP/s of every matmul variant in kernels/library.json and the tuned kernel, beside peers.

Times square products R = A x B at the thesis's sizes (Table 8.2: 96 ... 2880) and 4096 on one
OpenCL device: the time of a launch until the queue is finished, operands already on the device in
each kernel's layouts (the median of --repeat runs after a warm-up). Peers are timed in the same run
the same way: CLBlast's SGEMM on the same pyopencl queue (when libclblast is found), numpy on the
host CPU, and torch's cuBLAS (TF32 off) when a CUDA GPU is present. "tuned" is the kernel
`malinn tune` chose for this device (its cache), or the library default when untuned.

Run:  python3 benchmarks/gemm_variants.py [--device D] [--sizes 96 192 ...] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

import malinn
from malinn import ops
from malinn.kernel_library import load_library
from malinn.tuner import Product

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from peers import CLBlast, median_time, torch_cuda  # noqa: E402

THESIS_SIZES = [96, 192, 384, 768, 1440, 2880, 4096]


def time_variant(spec, device, n, repeat, budget_s):
    """Median time (s) of spec on an n x n x n product, launch to queue finished."""
    product = Product(spec, device, n, n, n)
    if not product.correct():
        raise RuntimeError(f"{spec.codename} at n={n} is wrong; not timing it")
    run = lambda: (product.launch(), device.queue.finish())  # noqa: E731
    t = time.perf_counter()
    run()
    first = time.perf_counter() - t
    if first * repeat > budget_s:
        return first
    return median_time(run, repeat, warmup=0)


def time_clblast(clblast, device, n, repeat):
    import pyopencl as cl

    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    mf = cl.mem_flags
    da = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    db = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    dc = cl.Buffer(device.context, mf.READ_WRITE, a.nbytes)
    run = lambda: (clblast.sgemm(device.queue, n, n, n, da, db, dc), device.queue.finish())  # noqa: E731
    run()
    c = np.empty_like(a)
    cl.enqueue_copy(device.queue, c, dc, is_blocking=True)
    ref = a.astype(np.float64) @ b
    if np.abs(c - ref).max() > 1e-4 * max(1.0, np.abs(ref).max()):
        raise RuntimeError(f"CLBlast at n={n} gave wrong results")
    return median_time(run, repeat, warmup=1)


def time_numpy(n, repeat):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    a @ b
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def time_torch(n, repeat):
    torch = torch_cuda()
    if torch is None:
        return None
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--sizes", type=int, nargs="+", default=THESIS_SIZES)
    parser.add_argument("--variants", nargs="+", help="codenames (default: every matmul kernel)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per variant and size before one run is enough")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    library = load_library()
    variants = args.variants or library.codenames("matmul")
    tuned = ops.kernel_for("matmul", device)
    tuned_label = f"{tuned.codename} {' '.join(f'{k}={v}' for k, v in tuned.config.items())}".strip()
    clblast = CLBlast.load()
    rows = []
    print(f"device: {device}\nhost: {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(f"tuned: {tuned_label}; CLBlast: {'found' if clblast else 'not found'}")
    header = (["n"] + variants + ["tuned"] + (["CLBlast"] if clblast else []) + ["numpy"]
              + (["cuBLAS"] if time_torch(8, 1) is not None else []))
    print("GFLOP/s; " + " | ".join(header))
    for n in args.sizes:
        flop = 2.0 * n ** 3
        row = {"n": n}
        for codename in variants:
            seconds = time_variant(library[codename], device, n, args.repeat, args.budget)
            row[codename] = flop / seconds / 1e9
        row["tuned"] = flop / time_variant(tuned, device, n, args.repeat, args.budget) / 1e9
        if clblast:
            row["CLBlast"] = flop / time_clblast(clblast, device, n, args.repeat) / 1e9
        row["numpy"] = flop / time_numpy(n, args.repeat) / 1e9
        torch_s = time_torch(n, args.repeat)
        if torch_s is not None:
            row["cuBLAS"] = flop / torch_s / 1e9
        rows.append(row)
        print(" | ".join([str(n)] + [f"{row[h]:.1f}" for h in header[1:]]), flush=True)
    best = {}
    for row in rows:
        fastest = max(variants, key=lambda c: row[c])
        best[fastest] = best.get(fastest, 0) + 1
    winner = max(best, key=best.get)
    print(f"fastest variant on most sizes: {winner} ({best[winner]} of {len(rows)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.describe(), "driver": device.driver_version, "rows": rows,
                       "fastest": winner, "tuned": tuned_label, "command": " ".join(sys.argv)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
