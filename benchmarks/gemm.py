"""GEMM GFLOP/s of every matmul kernel in kernels/library.json and the runtime's choice, beside peers.

By default it times square products R = A x B at the thesis's sizes (Table 8.2: 96 ... 2880) and
4096; with --networks, the Dense products of the Table 10.5 networks (units x inputs, at batch 1 and
100) instead, where the runtime picks a kernel per shape (``chosen``). Each is timed on one OpenCL
device from a launch until the queue is finished, operands already on the device in each kernel's
layouts (the median of --repeat runs after a warm-up), every product first checked against numpy.

Each kernel runs in the configuration the runtime would give it on this device (as
malinn.ops.kernel_for chooses): a configurable kernel such as gemm_tiled in the configuration
`malinn tune` stored for this device when the tuner chose it, else in the library default's
configuration for the device kind, else as its entry writes it. "tuned" is the kernel the runtime
uses for a square matmul (the tuner's winner, else the library default); it is timed once with the
column of the same kernel and configuration. Every kernel runs every shape; one that refuses a size
(an image operand beyond the device's limits) is skipped with a word; a wrong product is reported and
not timed, and the script then exits 1. The summary names the fastest of malinn's kernels and the
fastest of everything measured.

Peers are timed in the same run the same way: CLBlast's SGEMM on the same pyopencl queue, numpy on
the host CPU, and torch's cuBLAS (TF32 off) when a CUDA GPU is present. CLBlast needs Debian's
libclblast1 (apt-get install libclblast1; or MALINN_CLBLAST=/path/to/libclblast.so): without it
the script says so on stderr and skips that peer.

With several devices (``--device 0:0,gl:0``: the OpenCL GPU and the same GPU through OpenGL) every
device's kernels are timed in the same run, the columns of each device after the first named
``INDEX/column`` (``gl:0/tuned``), the host and CUDA peers timed once; ``ratios`` gives, per size,
each further device's time for its runtime choice ("tuned") and for its fastest kernel over the
first device's (above 1: slower than the first device).

The results go to ``benchmarks/results/gemm_<device>.json`` (``gemm_networks_<device>.json`` with
--networks, ``gemm_backends_<device>.json`` with several devices) unless --out says otherwise.
--quick: sizes 96 and 192 (the Partial networks' products with --networks), 3 repeats.

With ``--sweep CODENAME`` it times one configurable kernel in many configurations instead: every
configuration its library entry offers the device (its defaults and ``candidates``) plus those of
``--sweep-configs FILE`` (a JSON list of define dicts), on the products ``--shape MxKxN`` names
(units x inputs x batch; default: squares of --sizes), each checked against one float64 numpy
product per shape, beside CLBlast and cuBLAS timed on the same shapes in the same run. It writes
``gemm_sweep_<codename>_<device>.json``: a row per shape and configuration, and per shape the
fastest configuration with its ratio to each peer. That is how a library entry's configuration for
a range of shapes is found (the entry's description cites the file).

Run:  python benchmarks/gemm.py [--device D[,D2...]] [--sizes 96 192 ...] [--networks] [--variants ...] [--quick]
      python benchmarks/gemm.py --sweep gemm_keras [--sweep-configs FILE] [--shape 4096x4096x4096 ...]
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import harness
import numpy as np
from harness import CLBlast, median_time, torch_cuda
from models import MODELS

import malinn
from malinn import ops
from malinn.choice.kernel_choice import choose
from malinn.errors import LibraryError
from malinn.library.kernel_library import load_library
from malinn.tuning.tuner import Product

THESIS_SIZES = [96, 192, 384, 768, 1440, 2880, 4096]
QUICK_SIZES = [96, 192]
#: The batches the networks' products are timed at: latency and the thesis's batch.
NETWORK_BATCHES = (1, 100)
#: the kernels and sizes that computed a wrong product in this run
WRONG: list = []


def network_shapes(quick: bool) -> list:
    """The Dense products ``(m, k, n)`` of the Table 10.5 networks at NETWORK_BATCHES (units x inputs
    x batch), each once; with ``quick`` the Partial networks' alone."""
    shapes = []
    for name, widths in MODELS.items():
        if quick and not name.startswith("Partial"):
            continue
        for n in NETWORK_BATCHES:
            shapes += [s for s in ((m, k, n) for k, m in zip(widths, widths[1:])) if s not in shapes]
    return shapes


def shape_name(shape) -> str:
    """``MxKxN`` (units x inputs x batch)."""
    return "x".join(map(str, shape))


def time_variant(spec, device, shape, repeat, budget_s):
    """Median time (s) of spec on an ``m x k`` by ``k x n`` product, launch to queue finished; None,
    said on stderr, where the kernel refuses the shape on this device (its image operand beyond the
    device's image limits) or computes it wrong (the run goes on; main's exit status is then 1).
    Every kernel runs every shape, also outside the shapes its preconditions give it at run time:
    each must compute any product right."""
    m, k, n = shape
    if any(r.image for r in spec.matrices.values()) and not spec.accepts(m, k, n, device):
        print(
            f"gemm: {label(spec)} refuses {shape_name(shape)} on {device.name} (its image operand is beyond "
            f"the device's image limits); not timed",
            file=sys.stderr,
        )
        return None
    product = Product(spec, device, m, k, n)
    if not product.correct():
        print(f"gemm: {label(spec)} at {shape_name(shape)} on {device.name} is WRONG; not timed", file=sys.stderr)
        WRONG.append(f"{label(spec)} at {shape_name(shape)}")
        return None
    run = lambda: (product.launch(), device.finish())  # noqa: E731
    t = time.perf_counter()
    run()
    first = time.perf_counter() - t
    if first * repeat > budget_s:
        return first
    return median_time(run, repeat, warmup=0)


def operands(shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def time_clblast(clblast, device, shape, repeat):
    import pyopencl as cl

    m, k, n = shape
    a, b = operands(shape)
    mf = cl.mem_flags
    da = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    db = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    dc = cl.Buffer(device.context, mf.READ_WRITE, m * n * 4)
    run = lambda: (clblast.sgemm(device.queue, m, n, k, da, db, dc), device.queue.finish())  # noqa: E731
    run()
    c = np.empty((m, n), np.float32)
    cl.enqueue_copy(device.queue, c, dc, is_blocking=True)
    ref = a.astype(np.float64) @ b
    if np.abs(c - ref).max() > 1e-4 * max(1.0, np.abs(ref).max()):
        raise RuntimeError(f"CLBlast at {shape_name(shape)} gave wrong results")
    return median_time(run, repeat, warmup=1)


def time_numpy(shape, repeat):
    a, b = operands(shape)
    return median_time(lambda: a @ b, repeat, warmup=1)


def time_torch(shape, repeat):
    torch = torch_cuda()
    if torch is None:
        return None
    m, k, n = shape
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
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
        time_clblast(clblast, device, (64, 64, 64), 1)
    except Exception as exc:  # a status, a wrong result or a pyopencl error: skip the peer, say why
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
            out.append(
                {
                    "n": row["n"],
                    "device": prefix.rstrip("/"),
                    "over": first.rstrip("/") or "first",
                    "tuned": tuned_first / tuned if tuned and tuned_first else None,
                    "fastest": best_first / best if best and best_first else None,
                }
            )
    return out


def main(argv=None):
    library = load_library()
    parser = harness.arguments(__doc__, repeat=5, several_devices=True)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        metavar="N",
        help=f"n of the square n x n x n products (default: {' '.join(map(str, THESIS_SIZES))}; "
        f"{' '.join(map(str, QUICK_SIZES))} with --quick)",
    )
    parser.add_argument(
        "--networks",
        action="store_true",
        help="time the Table 10.5 networks' Dense products at batch 1 and 100 instead of squares",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="CODENAME",
        choices=library.codenames("matmul"),
        help="matmul kernel codenames to time, among "
        + ", ".join(library.codenames("matmul"))
        + " (default: all that each device's backend has a source for)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=10.0,
        help="seconds per kernel and size: when one run times --repeat exceeds it, that one run counts (default: 10)",
    )
    parser.add_argument(
        "--sweep",
        metavar="CODENAME",
        choices=library.codenames("matmul"),
        help="time this kernel in every configuration its entry offers (and --sweep-configs') instead",
    )
    parser.add_argument("--sweep-configs", metavar="FILE", help="a JSON list of define dicts for --sweep")
    parser.add_argument(
        "--shape", action="append", metavar="MxKxN", help="a product for --sweep: units x inputs x batch (repeatable)"
    )
    args = harness.parse(parser, argv)
    devices = harness.devices(args.device)
    if args.sweep:
        return sweep(library, devices[0], args)
    if args.networks and len(devices) > 1:
        parser.error("--networks times one device")
    shapes = (
        network_shapes(args.quick)
        if args.networks
        else [(n, n, n) for n in args.sizes or (QUICK_SIZES if args.quick else THESIS_SIZES)]
    )
    prefixes = [""] + [d.describe()["index"] + "/" for d in devices[1:]]
    specs, configurations, clblasts, why_not = {}, {}, {}, {}
    for device, prefix in zip(devices, prefixes):
        variants = [
            v
            for v in (args.variants or library.codenames("matmul", device.backend))
            if library[v].has_source(device.backend)
        ]
        mine = {codename: runtime_spec(library, codename, device) for codename in variants}
        if not args.networks:
            mine["tuned"] = ops.kernel_for("matmul", device)
        specs[prefix] = mine
        configurations.update({prefix + column: label(spec) for column, spec in mine.items()})
        clblast, why = usable_clblast(device)
        if clblast is None:
            print(f"gemm: skipping the CLBlast peer on {device.name}: {why}", file=sys.stderr)
            why_not[prefix] = why
        else:
            clblasts[prefix] = clblast
    for device, prefix in zip(devices, prefixes):
        print(f"device {device.describe()['index']}" + (f" (columns {prefix}...)" if prefix else "") + f": {device}")
    print(f"host: {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(
        "configurations: "
        + "; ".join(
            f"{c} = {v}" if c.endswith("tuned") or v != c.split("/")[-1] else c for c, v in configurations.items()
        )
    )
    print(f"CLBlast: {'found' if clblasts else 'skipped (see stderr)'}")
    columns = {
        prefix: ([prefix + "chosen"] if args.networks else []) + [prefix + column for column in specs[prefix]]
        for prefix in prefixes
    }
    mine_all = [c for prefix in prefixes for c in columns[prefix]]
    header = (
        [("shape" if args.networks else "n")]
        + mine_all
        + [prefix + "CLBlast" for prefix in prefixes if prefix in clblasts]
        + ["numpy"]
        + (["cuBLAS"] if torch_cuda() is not None else [])
    )
    print("GFLOP/s; " + " | ".join(header))
    rows, chosen = [], {}
    for shape in shapes:
        gflop = 2.0 * shape[0] * shape[1] * shape[2] / 1e9
        row = {"shape": shape_name(shape)} if args.networks else {"n": shape[0]}
        for device, prefix in zip(devices, prefixes):
            malinn.set_device(device)
            seconds = {}  # (codename, defines) -> seconds: a kernel chosen twice is timed once
            mine = dict(specs[prefix])
            if args.networks:
                mine = {"chosen": choose("matmul", device, shape), **mine}
                chosen[shape_name(shape)] = label(mine["chosen"])
            for column, spec in mine.items():
                key = (spec.codename, spec.defines)
                if key not in seconds:
                    seconds[key] = time_variant(spec, device, shape, args.repeat, args.budget)
                row[prefix + column] = None if seconds[key] is None else gflop / seconds[key]
            if prefix in clblasts:
                row[prefix + "CLBlast"] = gflop / time_clblast(clblasts[prefix], device, shape, args.repeat)
        row["numpy"] = gflop / time_numpy(shape, args.repeat)
        torch_s = time_torch(shape, args.repeat)
        if torch_s is not None:
            row["cuBLAS"] = gflop / torch_s
        rows.append(row)
        print(
            " | ".join([str(row[header[0]])] + ["-" if row.get(h) is None else f"{row[h]:.1f}" for h in header[1:]]),
            flush=True,
        )
    names = {
        **configurations,
        **{
            p + "tuned": f"{configurations[p + 'tuned']} (the runtime's choice"
            + (f" on {p.rstrip('/')})" if p else ")")
            for p in prefixes
            if p + "tuned" in configurations
        },
        **{p + "chosen": "the runtime's choice per shape" for p in prefixes},
    }
    fastest, wins = most_often_fastest(rows, mine_all)
    overall, overall_wins = most_often_fastest(rows, header[1:])
    print(f"fastest of malinn's kernels on most shapes: {names[fastest]} ({wins} of {len(rows)})")
    print(
        f"fastest of everything measured on most shapes: {names.get(overall, overall)} ({overall_wins} of {len(rows)})"
    )
    ratios = device_ratios(rows, prefixes, columns) if len(devices) > 1 else []
    for r in ratios:
        if r["tuned"] is None or r["fastest"] is None:
            continue
        print(
            f"n {r['n']:>5}: {r['device']} / {devices[0].describe()['index']} time = {r['tuned']:.2f}x "
            f"(runtime choices), {r['fastest']:.2f}x (fastest kernels)"
        )
    fields = {
        "fastest": names[fastest],
        "fastest_overall": names.get(overall, overall),
        "configurations": configurations,
        "clblast": "used" if "" in clblasts else why_not.get(""),
        "wrong": WRONG,
    }
    if args.networks:
        fields["chosen"] = chosen
    else:
        fields["tuned"] = configurations["tuned"]
    if len(devices) > 1:
        fields["devices"] = [{**harness.describe(d), "columns": p or "(unprefixed)"} for d, p in zip(devices, prefixes)]
        fields["ratios"] = ratios
    name = "gemm_networks" if args.networks else "gemm_backends" if len(devices) > 1 else "gemm"
    harness.save(name, devices[0], rows, args, **fields)
    if WRONG:
        print(f"gemm: wrong products (not timed): {'; '.join(WRONG)}", file=sys.stderr)
        return 1
    return 0


def sweep_specs(library, device, codename: str, extra: list) -> list:
    """``codename`` in each configuration its entry offers ``device`` and in each of ``extra`` (define
    dicts) that meets its constraints and fits the device, each once."""
    base = library[codename]
    specs, seen = [], set()
    for config in base.configurations(device) + [{**dict(base.defines), **c} for c in extra]:
        try:
            spec = base.configure(config)
        except LibraryError as exc:
            print(f"gemm: skipping {config}: {exc}", file=sys.stderr)
            continue
        if spec.defines in seen or not spec.fits(device):
            continue
        seen.add(spec.defines)
        specs.append(spec)
    return specs


def sweep(library, device, args) -> int:
    """``--sweep``: one kernel's configurations on the ``--shape`` products beside CLBlast and cuBLAS."""
    import json

    extra = json.loads(Path(args.sweep_configs).read_text()) if args.sweep_configs else []
    specs = sweep_specs(library, device, args.sweep, extra)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape or []] or [
        (n, n, n) for n in args.sizes or (QUICK_SIZES if args.quick else THESIS_SIZES)
    ]
    clblast, why = usable_clblast(device)
    print(f"device: {device}; {len(specs)} configurations of {args.sweep}; CLBlast: {'found' if clblast else why}")
    rows, best = [], []
    for shape in shapes:
        m, k, n = shape
        gflop = 2.0 * m * k * n / 1e9
        a, b = operands(shape)
        want = a.astype(np.float64) @ b
        tolerance = 1e-4 * max(1.0, float(np.abs(want).max()))
        peers = {"CLBlast": gflop / time_clblast(clblast, device, shape, args.repeat) if clblast else None}
        torch_s = time_torch(shape, args.repeat)
        peers["cuBLAS"] = gflop / torch_s if torch_s else None
        fastest = None
        for spec in specs:
            if not spec.accepts(m, k, n, device):
                continue
            product = Product(spec, device, m, k, n, operands=(a, b))
            product.launch().wait()
            if float(np.abs(product.r.numpy() - want).max()) > tolerance:
                WRONG.append(f"{label(spec)} at {shape_name(shape)}")
                continue
            run = lambda: (product.launch(), device.finish())  # noqa: E731
            gflops = gflop / median_time(run, args.repeat, warmup=1)
            rows.append({"shape": shape_name(shape), "configuration": label(spec), "gflops": gflops})
            if fastest is None or gflops > fastest["gflops"]:
                fastest = rows[-1]
        entry = {"shape": shape_name(shape), **peers, "fastest": fastest}
        for peer, value in peers.items():
            if fastest is not None and value:
                entry[f"fastest_over_{peer}"] = fastest["gflops"] / value
        best.append(entry)
        print(
            f"{shape_name(shape)}: fastest {fastest and fastest['configuration']} "
            f"{fastest and round(fastest['gflops'])} GFLOP/s; "
            + ", ".join(f"{p} {v:.0f}" for p, v in peers.items() if v),
            flush=True,
        )
        # after each shape, so that a run stopped by a time limit keeps what it measured
        harness.save(f"gemm_sweep_{args.sweep}", device, rows, args, best=best, wrong=WRONG)
    if WRONG:
        print(f"gemm: wrong products (not timed): {'; '.join(WRONG)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
