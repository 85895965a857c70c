"""GEMM GFLOP/s of every matmul kernel in kernels/library.json and the runtime's choice, beside peers.

Times square products R = A x B at the thesis's sizes (Table 8.2: 96 ... 2880) and 4096 on one
OpenCL device: the time of a launch until the queue is finished, operands already on the device in
each kernel's layouts (the median of --repeat runs after a warm-up).

Each kernel runs in the configuration the runtime would give it on this device (as
malinn.ops.kernel_for chooses): a configurable kernel such as gemm_tiled in the configuration
`malinn tune` stored for this device when the tuner chose it, else in the library default's
configuration for the device kind, else as its entry writes it. "tuned" is the kernel the runtime
uses for a matmul (the tuner's winner, else the library default); it is timed once with the column
of the same kernel and configuration. The summary names the fastest of malinn's kernels (every column
above, "tuned" included) and the fastest of everything measured.

Peers are timed in the same run the same way: CLBlast's SGEMM on the same pyopencl queue, numpy on
the host CPU, and torch's cuBLAS (TF32 off) when a CUDA GPU is present. CLBlast needs Debian's
libclblast1 (apt-get install libclblast1; or MALINN_CLBLAST=/path/to/libclblast.so): without it
the script says so on stderr and skips that peer.

With several devices (``--device 0:0,gl:0``: the OpenCL GPU and the same GPU through OpenGL) every
device's kernels are timed in the same run, the columns of each device after the first named
``INDEX/column`` (``gl:0/tuned``), the host and CUDA peers timed once; ``ratios`` gives, per size,
each further device's time for its runtime choice ("tuned") and for its fastest kernel over the
first device's (above 1: slower than the first device).

Run:  python3 benchmarks/gemm_variants.py [--device D[,D2...]] [--sizes 96 192 ...] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time

import numpy as np

import malinn
from malinn import ops
from malinn.library.kernel_library import load_library
from malinn.tuning.tuner import Product

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from peers import CLBlast, median_time, torch_cuda  # noqa: E402

THESIS_SIZES = [96, 192, 384, 768, 1440, 2880, 4096]
#: the kernels and sizes that computed a wrong product in this run
WRONG: list = []


def time_variant(spec, device, n, repeat, budget_s):
    """Median time (s) of spec on an n x n x n product, launch to queue finished; None, said on
    stderr, where the kernel refuses the shape on this device (its image operand beyond the device's
    image limits) or computes it wrong (the run goes on; main's exit status is then 1)."""
    if any(r.image for r in spec.matrices.values()) and not spec.accepts(n, n, n, device):
        print(f"gemm_variants: {label(spec)} refuses n={n} on {device.name} (its image operand is beyond the "
              f"device's image limits); not timed", file=sys.stderr)
        return None
    product = Product(spec, device, n, n, n)
    if not product.correct():
        print(f"gemm_variants: {label(spec)} at n={n} on {device.name} is WRONG; not timed", file=sys.stderr)
        WRONG.append(f"{label(spec)} at n={n}")
        return None
    run = lambda: (product.launch(), device.finish())  # noqa: E731
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


def runtime_spec(library, codename, device):
    """Kernel ``codename`` in the configuration the runtime would run it in on ``device``.

    The runtime's matmul choice (malinn.ops.kernel_for: the tuner's winner, else the library default
    for the device kind) when it is this kernel, else the library default for the device kind when
    that is this kernel, else the entry as written.
    """
    chosen = ops.kernel_for("matmul", device)
    if chosen.codename == codename:
        return chosen
    default = library.default_spec("matmul", device.kind, device.backend)
    return default if default.codename == codename else library[codename]


def label(spec):
    """``codename DEFINE=VALUE ...``: which kernel and configuration a column measured."""
    return f"{spec.codename} {' '.join(f'{k}={v}' for k, v in spec.config.items())}".strip()


def usable_clblast(device):
    """``(CLBlast, None)`` when CLBlast loads and multiplies correctly on ``device``, else ``(None, why)``."""
    if device.backend != "opencl":
        return None, f"CLBlast runs on OpenCL devices, not on {device.backend} ({device.name})"
    clblast, why = CLBlast.load()
    if clblast is None:
        return None, why
    try:
        time_clblast(clblast, device, 64, 1)
    except Exception as exc:   # a status, a wrong result or a pyopencl error: skip the peer, say why
        return None, f"CLBlast fails on {device.name}: {exc}"
    return clblast, None


def most_often_fastest(rows, columns):
    """The column fastest on the most rows, and on how many."""
    wins = {}
    for row in rows:
        timed = [c for c in columns if row.get(c) is not None]
        if not timed:
            continue
        fastest = max(timed, key=lambda c: row[c])
        wins[fastest] = wins.get(fastest, 0) + 1
    if not wins:
        return columns[0], 0
    winner = max(wins, key=wins.get)
    return winner, wins[winner]


def device_ratios(rows, prefixes, columns):
    """Per size: each further device's time over the first's, for its runtime choice ("tuned") and
    for its fastest kernel (times are inverse to the GFLOP/s in ``rows``)."""
    first = prefixes[0]
    out = []
    for row in rows:
        best_first = max((row[c] for c in columns[first] if row.get(c) is not None), default=None)
        for prefix in prefixes[1:]:
            best = max((row[c] for c in columns[prefix] if row.get(c) is not None), default=None)
            tuned, tuned_first = row.get(prefix + "tuned"), row.get(first + "tuned")
            out.append({"n": row["n"], "device": prefix.rstrip("/"), "over": first.rstrip("/") or "first",
                        "tuned": tuned_first / tuned if tuned and tuned_first else None,
                        "fastest": best_first / best if best and best_first else None})
    return out


def main(argv=None):
    library = load_library()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="gpu, cpu, P:D, part of a device name, or gl for the OpenGL backend; "
                                         "several, comma-separated (0:0,gl:0), time each device's kernels in "
                                         "one run (default: malinn's default device)")
    parser.add_argument("--sizes", type=int, nargs="+", default=THESIS_SIZES, metavar="N",
                        help=f"n of the square n x n x n products (default: {' '.join(map(str, THESIS_SIZES))})")
    parser.add_argument("--variants", nargs="+", metavar="CODENAME", choices=library.codenames("matmul"),
                        help="matmul kernel codenames to time, among " + ", ".join(library.codenames("matmul"))
                        + " (default: all that each device's backend has a source for)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per kernel and size; the median counts "
                        "(default: 5)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per kernel and size: when one run "
                        "times --repeat exceeds it, that one run counts (default: 10)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH "
                        "(benchmarks/report.py reads them)")
    args = parser.parse_args(argv)

    names = [s for s in (args.device or "").split(",") if s.strip()]
    devices = [malinn.set_device(s) for s in names] if names else [malinn.get_device()]
    if len({id(d) for d in devices}) < len(devices):
        parser.error(f"--device {args.device} names one device twice")
    prefixes = [""] + [d.describe()["index"] + "/" for d in devices[1:]]
    specs, configurations, clblasts, why_not = {}, {}, {}, {}
    for device, prefix in zip(devices, prefixes):
        variants = [v for v in (args.variants or library.codenames("matmul", device.backend))
                    if library[v].has_source(device.backend)]
        mine = {codename: runtime_spec(library, codename, device) for codename in variants}
        mine["tuned"] = ops.kernel_for("matmul", device)
        specs[prefix] = mine
        configurations.update({prefix + column: label(spec) for column, spec in mine.items()})
        clblast, why = usable_clblast(device)
        if clblast is None:
            print(f"gemm_variants: skipping the CLBlast peer on {device.name}: {why}", file=sys.stderr)
            why_not[prefix] = why
        else:
            clblasts[prefix] = clblast
    rows = []
    for device, prefix in zip(devices, prefixes):
        print(f"device {device.describe()['index']}" + (f" (columns {prefix}...)" if prefix else "") + f": {device}")
    print(f"host: {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print("configurations: " + "; ".join(f"{c} = {v}" if c.endswith("tuned") or v != c.split("/")[-1] else c
                                         for c, v in configurations.items()))
    print(f"CLBlast: {'found' if clblasts else 'skipped (see stderr)'}")
    columns = {prefix: [prefix + column for column in specs[prefix]] for prefix in prefixes}
    mine_all = [c for prefix in prefixes for c in columns[prefix]]
    header = (["n"] + mine_all + [prefix + "CLBlast" for prefix in prefixes if prefix in clblasts] + ["numpy"]
              + (["cuBLAS"] if time_torch(8, 1) is not None else []))
    print("GFLOP/s; " + " | ".join(header))
    for n in args.sizes:
        flop = 2.0 * n ** 3
        row = {"n": n}
        for device, prefix in zip(devices, prefixes):
            malinn.set_device(device)
            seconds = {}   # (codename, defines) -> seconds: "tuned" is timed once with its own kernel's column
            for column, spec in specs[prefix].items():
                key = (spec.codename, spec.defines)
                if key not in seconds:
                    seconds[key] = time_variant(spec, device, n, args.repeat, args.budget)
                row[prefix + column] = None if seconds[key] is None else flop / seconds[key] / 1e9
            if prefix in clblasts:
                row[prefix + "CLBlast"] = flop / time_clblast(clblasts[prefix], device, n, args.repeat) / 1e9
        row["numpy"] = flop / time_numpy(n, args.repeat) / 1e9
        torch_s = time_torch(n, args.repeat)
        if torch_s is not None:
            row["cuBLAS"] = flop / torch_s / 1e9
        rows.append(row)
        print(" | ".join([str(n)] + ["-" if row[h] is None else f"{row[h]:.1f}" for h in header[1:]]), flush=True)
    names = {**configurations, **{p + "tuned": f"{configurations[p + 'tuned']} (the runtime's choice"
                                  + (f" on {p.rstrip('/')})" if p else ")") for p in prefixes}}
    fastest, wins = most_often_fastest(rows, mine_all)
    overall, overall_wins = most_often_fastest(rows, header[1:])
    print(f"fastest of malinn's kernels on most sizes: {names[fastest]} ({wins} of {len(rows)})")
    print(f"fastest of everything measured on most sizes: {names.get(overall, overall)} "
          f"({overall_wins} of {len(rows)})")
    ratios = device_ratios(rows, prefixes, columns) if len(devices) > 1 else []
    for r in ratios:
        if r["tuned"] is None or r["fastest"] is None:
            continue
        print(f"n {r['n']:>5}: {r['device']} / {devices[0].describe()['index']} time = {r['tuned']:.2f}x "
              f"(runtime choices), {r['fastest']:.2f}x (fastest kernels)")
    if args.json:
        first = devices[0]
        result = {"device": first.describe(), "driver": first.driver_version, "rows": rows,
                  "fastest": names[fastest], "fastest_overall": names.get(overall, overall),
                  "tuned": configurations["tuned"], "configurations": configurations,
                  "clblast": "used" if "" in clblasts else why_not.get(""), "wrong": WRONG,
                  "command": shlex.join(sys.argv)}
        if len(devices) > 1:
            result["devices"] = [{**d.describe(), "driver": d.driver_version, "columns": p or "(unprefixed)"}
                                 for d, p in zip(devices, prefixes)]
            result["ratios"] = ratios
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if WRONG:
        print(f"gemm_variants: wrong products (not timed): {'; '.join(WRONG)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
