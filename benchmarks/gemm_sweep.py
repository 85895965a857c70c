"""Sweeps a tunable matmul kernel's configuration space on the skinny products of inference.

The library's ``candidates`` for a tunable kernel are a short list (what ``malinn tune`` times); this
script searches the space they were picked from: every combination of the grid below that meets the
entry's ``constraints`` and the device's limits, timed (OpenCL profiling events, median of --repeat,
each configuration first checked against numpy) on each product ``m x k x n`` given, by default the
Dense layers of the thesis's Table 10.5 networks at batch 100. It prints the best configurations
per shape and overall (geometric mean over the shapes) and writes them as JSON: the evidence behind
the library's candidates and defaults.

Beside the sweep, in the same run: the default configuration of each ``--compare`` entry, and
cuBLAS through torch (float32, TF32 off, device to device) where torch sees a CUDA GPU.

Run:  python3 benchmarks/gemm_sweep.py [--kernel gemm_tiled_c] [--shapes 2500x784x100 ...]
                                        [--compare gemv_batch_c ...] [--budget 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path

import malinn
from malinn.errors import LibraryError, MalinnError
from malinn.library.expressions import evaluate
from malinn.library.kernel_library import load_library
from malinn.tuning.tuner import _time_product

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import torch_cuda  # noqa: E402

#: The Table 10.5 networks' Dense products at batch 100, (m, k, n).
SHAPES = [(150, 640, 100), (128, 256, 100), (2500, 784, 100), (2000, 2500, 100), (4096, 3072, 100),
          (3072, 4096, 100)]
#: The grids the configurations are drawn from, for tiled kernels (gemm_tiled*) and gemv ones.
GRIDS = {"tiled": {"MWG": [16, 32, 64, 128], "NWG": [16, 32, 64, 128], "KWG": [8, 16, 32],
                   "MDIMC": [4, 8, 16, 32], "NDIMC": [4, 8, 16, 32], "VW": [1, 2, 4], "LOCAL": [1],
                   "STRIDED": [0, 1]},
         "gemv": {"VW": [1, 2, 4], "WPT": [1, 2], "MDIM": [1, 2, 4, 8, 16, 32], "KSPLIT": [4, 8, 16, 32, 64],
                  "NB": [1, 2, 4, 8, 16]},
         "rows": {"VW": [1, 2, 4], "ROWS": [1, 2, 4, 8], "THREADS": [64, 128, 256, 512, 1024], "NB": [1, 2, 4, 8]},
         "keras": {"TM": [32, 64, 128, 256], "TN": [4, 8, 10, 16, 20, 25, 32, 50, 64], "RM": [4, 8, 16],
                   "RN": [1, 2, 4, 5, 8, 10], "KT": [8, 16, 32], "PREFETCH": [0, 1],
                   "SLICES": [1, 2, 4, 8]}}


def grid_of(spec) -> dict:
    if "NWG" in spec.config:
        return GRIDS["tiled"]
    return GRIDS["rows" if "THREADS" in spec.config else "keras" if "TM" in spec.config else "gemv"]


def parse_shape(text: str) -> tuple:
    m, k, n = (int(v) for v in text.lower().split("x"))
    return m, k, n


def configurations(spec, device) -> list[dict]:
    """Every grid point meeting the entry's constraints and the device's limits, as define dicts."""
    grid = grid_of(spec)
    names = list(grid)
    found = []
    for values in itertools.product(*(grid[n] for n in names)):
        config = dict(zip(names, values))
        if "VW" in config and config.get("KWG", config["VW"]) % config["VW"]:
            continue
        try:
            configured = spec.configure(config)
        except LibraryError:
            continue
        if not 32 <= math.prod(configured.workgroup) <= min(1024, device.max_work_group_size):
            continue
        local = configured.template[1].get("local_bytes")
        if local is not None and evaluate(local, configured.config) > device.local_memory:
            continue
        found.append(config)
    return found


def _time_or_none(spec, device, shape, repeat):
    try:
        return _time_product(spec, device, shape, repeat)
    except MalinnError:
        return None


def torch_times(shapes, repeat: int) -> list | None:
    """Seconds of torch's float32 matmul (n x k) @ (k x m) on the CUDA GPU per shape (CUDA events,
    median of ``repeat`` after a warm-up), or None without torch or a CUDA GPU."""
    torch = torch_cuda()
    if torch is None:
        return None
    times = []
    for m, k, n in shapes:
        x, w = torch.rand(n, k, device="cuda"), torch.rand(k, m, device="cuda")
        for _ in range(3):
            x @ w
        runs = []
        for _ in range(max(repeat, 5)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x @ w
            end.record()
            torch.cuda.synchronize()
            runs.append(start.elapsed_time(end) / 1e3)
        times.append(sorted(runs)[len(runs) // 2])
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default device)")
    parser.add_argument("--kernel", default="gemm_tiled_c", help="the tunable matmul entry (default: gemm_tiled_c)")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES, metavar="MxKxN",
                        help="products to time (default: the Table 10.5 layers at batch 100)")
    parser.add_argument("--budget", type=float, default=300, help="seconds of sweeping at most; a random "
                        "sample of the space is timed first (default: 300)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per configuration and shape (default: 5)")
    parser.add_argument("--top", type=int, default=8, help="configurations listed per shape (default: 8)")
    parser.add_argument("--grid", nargs="+", default=[], metavar="NAME=V1,V2",
                        help="narrow (or widen) the grid of a define, e.g. MWG=32,64")
    parser.add_argument("--compare", nargs="*", default=[], metavar="CODENAME",
                        help="library entries whose default configuration is timed on the same shapes")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    spec = load_library()[args.kernel]
    for item in args.grid:
        name, _, values = item.partition("=")
        grid_of(spec)[name] = [int(v) for v in values.split(",")]
    configs = configurations(spec, device)
    random.Random(0).shuffle(configs)
    default = {k: int(v) for k, v in spec.config.items() if k in grid_of(spec)}
    configs = [default] + [c for c in configs if c != default]
    print(f"device: {device}; {args.kernel}: {len(configs)} configurations, budget {args.budget:.0f} s", flush=True)
    started, timed = time.perf_counter(), []
    for config in configs:
        if time.perf_counter() - started > args.budget:
            break
        configured = spec.configure(config)
        seconds = []
        for shape in args.shapes:
            try:
                seconds.append(_time_product(configured, device, shape, args.repeat))
            except MalinnError:
                seconds.append(None)
        if None not in seconds:
            timed.append({"defines": config, "seconds": seconds})
    print(f"timed {len(timed)} correct configurations of {len(configs)} in {time.perf_counter() - started:.0f} s")
    peers = {}
    for codename in args.compare:
        peers[codename] = [_time_or_none(load_library()[codename], device, shape, args.repeat) for shape in args.shapes]
    cublas = torch_times(args.shapes, args.repeat)
    if cublas:
        peers["cublas (torch)"] = cublas
    for name, seconds in peers.items():
        print(f"{name:>16}: " + "  ".join("-" if s is None else f"{2 * math.prod(shape) / s / 1e9:7.0f}"
                                          for shape, s in zip(args.shapes, seconds)) + " GFLOP/s")
    best = {}
    for i, shape in enumerate(args.shapes):
        ranked = sorted(timed, key=lambda row: row["seconds"][i])
        flop = 2 * math.prod(shape)
        best["x".join(map(str, shape))] = [{"defines": r["defines"], "seconds": r["seconds"][i],
                                            "gflops": flop / r["seconds"][i] / 1e9} for r in ranked[:args.top]]
        print(f"{'x'.join(map(str, shape)):>16}: " + "  ".join(
            f"{flop / r['seconds'][i] / 1e9:7.0f}" for r in ranked[:3]) + " GFLOP/s; best "
            + json.dumps(ranked[0]["defines"]) + f"; default {flop / timed[0]['seconds'][i] / 1e9:.0f}")
    overall = sorted(timed, key=lambda r: math.prod(r["seconds"]))
    for row in overall[:args.top]:
        print("overall " + json.dumps(row["defines"]) + " " + " ".join(f"{s * 1e6:7.1f}" for s in row["seconds"]) + " us")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.describe(), "driver": device.driver_version, "kernel": args.kernel,
            "shapes": [list(s) for s in args.shapes], "grid": grid_of(spec), "timed": len(timed), "space": len(configs),
            "best_per_shape": best, "best_overall": [{"defines": r["defines"], "seconds": r["seconds"]}
                                                     for r in overall[:args.top]],
            "default": timed[0] if timed else None, "peers": peers, "command": " ".join(sys.argv)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
