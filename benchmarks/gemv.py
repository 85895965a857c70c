"""Small-batch Dense products: the gemv kernel beside the general fallback kernels and numpy.

Times R = W x I for the Dense layers of the thesis's Table 10.5 networks (units x inputs: 150x640,
128x256, 2500x784, 2000x2500, 4096x3072, 3072x4096, 10x3072) at batch 1, 2, 4 and 8 on one OpenCL
device: the time from a launch until the queue is finished, operands already on the device in each
kernel's layouts (min and median of --repeat runs after a warm-up), and numpy's ``x @ kernel`` on
the host in the same run, interleaved so that both see the same machine. Columns:

* ``chosen``: what malinn runs for this shape in --precision (``malinn.choice.kernel_choice.choose``: on a small batch the
  first of the library's ``matmul_fallback`` kernels whose preconditions hold: gemv in the
  configuration the library names for the device kind and batch);
* ``gpu``, ``cpu``: the same choice for the other device kind, where it differs (gemv's GPU and
  CPU configurations, timed on whichever device this is);
* ``blocked_rmrm``, ``morton_4_4``: the general kernels that were the cpu and gpu fallbacks before;
* ``gemv:<defines>``: further gemv configurations given with --configs (for tuning the defaults);
* ``numpy``.

``kernel_us`` gives each kernel's own device time beside them (OpenCL profiling events, median): on
a CPU a launch costs more than a small layer's kernel (PoCL: ~0.5 ms from a launch until the queue
is finished), so the wall times of small layers hardly tell their kernels apart.

Each kernel is checked against numpy before it is timed. GB/s is the weights' bytes (m x k floats)
over the min time: at batch 1..8 a Dense layer is bound by reading its weights.

Then the classifier heads of the four networks (10 units after 150, 128, 2000 and 3072 inputs),
Dense(10, activation="softmax") with a bias, at the same batches and at 100, through
``malinn.ops.matmul`` (allocation of the result included): ``fused``, the library's matmul_softmax
kernel in one launch, beside ``separate``, the kernel malinn chooses for the product followed by
the softmax kernel (two launches).

With ``--precision`` the kernels read the weights in that precision (the general kernels only where
they take it); GB/s then counts the stored bytes.

Run:  python3 benchmarks/gemv.py [--device D] [--batches 1 2 4 8] [--repeat 15] [--precision P]
                                 [--configs '{"VW": 16, "WPT": 16, ...}' ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

import malinn
from malinn import ops
from malinn.choice.kernel_choice import choose
from malinn.library.kernel_library import load_library
from malinn.tuning.tuner import Product

#: (units, inputs) of the Dense layers of Table 10.5's networks
SHAPES = [(150, 640), (128, 256), (2500, 784), (2000, 2500), (4096, 3072), (3072, 4096), (10, 3072)]
GENERAL = ["blocked_rmrm", "morton_4_4"]


def label(spec) -> str:
    return f"{spec.codename}:" + ",".join(f"{k}{v}" for k, v in spec.config.items()) if spec.config else spec.codename


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--shapes", nargs="+", help="units x inputs, e.g. 4096x3072 (default: Table 10.5's)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--configs", nargs="+", default=[], help="gemv defines as JSON objects, timed as well")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16-storage", "fp16", "int8-weights"],
                        help="the weights' precision (default: fp32); numpy multiplies the weights as stored")
    parser.add_argument("--heads", type=int, nargs="*", default=[150, 128, 2000, 3072],
                        help="inputs of the softmax heads (10 units) to time; none: skip")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    library = load_library()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    extra = [library["gemv"].configure(json.loads(c)) for c in args.configs]
    print(f"device: {device}\nhost: {platform.processor() or platform.machine()}, numpy {np.__version__}")
    weight_bytes = library.precision(args.precision).weight_bytes
    rows = []
    for m, k in shapes:
        for n in args.batches:
            chosen = choose("matmul", device, (m, k, n), precision=args.precision)
            specs = [("chosen", chosen)]
            for kind in ("gpu", "cpu"):
                fallbacks = library.default_specs("matmul_fallback", kind, precision=args.precision)
                spec = next((f for f in fallbacks if f.accepts(m, k, n, device=device)), fallbacks[-1])
                spec = spec.in_precision(args.precision)
                if all((spec.codename, spec.defines) != (s.codename, s.defines) for _, s in specs):
                    specs.append((kind, spec))
            general = [library[c] for c in GENERAL if args.precision in library[c].precisions]
            specs += [(c.codename, c.in_precision(args.precision)) for c in general]
            specs += [(label(s), s.in_precision(args.precision)) for s in extra]
            products = {name: Product(spec, device, m, k, n) for name, spec in specs}
            for name, product in products.items():
                if not product.correct():
                    raise RuntimeError(f"{name} ({label(specs[[s[0] for s in specs].index(name)][1])}) "
                                       f"is wrong at {m}x{k}x{n}; not timing it")
            rng = np.random.default_rng(m + k + n)
            kernel = rng.standard_normal((k, m)).astype(np.float32)
            x = rng.standard_normal((n, k)).astype(np.float32)
            def launched(p):   # the launch's event, once the queue has finished
                event = p.launch()
                device.queue.finish()
                return event

            runs = {name: (lambda p=p: launched(p)) for name, p in products.items()}
            runs["numpy"] = lambda: x @ kernel
            times = {name: [] for name in runs}
            kernel_times = {name: [] for name in products}
            for run in runs.values():   # warm-up
                run()
            for _ in range(args.repeat):   # interleaved: every candidate sees the same machine
                for name, run in runs.items():
                    t = time.perf_counter()
                    event = run()
                    times[name].append(time.perf_counter() - t)
                    if name in kernel_times:
                        kernel_times[name].append((event.profile.end - event.profile.start) * 1e-9)
            row = {"m": m, "k": k, "n": n, "kernels": {name: label(spec) for name, spec in specs},
                   "ms": {}, "median_ms": {}, "gbps": {}, "kernel_us": {}}
            for name, ts in times.items():
                row["ms"][name] = round(min(ts) * 1e3, 4)
                row["median_ms"][name] = round(float(np.median(ts)) * 1e3, 4)
                row["gbps"][name] = round(weight_bytes * m * k / min(ts) / 1e9, 2)
            for name, ts in kernel_times.items():
                row["kernel_us"][name] = round(float(np.median(ts)) * 1e6, 2)
            rows.append(row)
            print(f"{m:5d}x{k:<5d} n={n}: " + "  ".join(f"{name} {row['ms'][name]:.3f}" for name in runs)
                  + f"   (chosen: {row['kernels']['chosen']})", flush=True)
            print("      kernel (device, median us): " + "  ".join(f"{name} {us:.1f}" for name, us in
                                                               row["kernel_us"].items()), flush=True)
    summary = {}
    for name in rows[0]["ms"]:
        if name != "numpy":
            timed = [r for r in rows if name in r["ms"]]
            ratios = [r["ms"][name] / r["ms"]["numpy"] for r in timed]
            summary[name] = {"geomean_vs_numpy": round(float(np.exp(np.mean(np.log(ratios)))), 3)}
            if name != "chosen":
                speedups = [r["ms"][name] / r["ms"]["chosen"] for r in timed]
                summary[name]["geomean_vs_chosen"] = round(float(np.exp(np.mean(np.log(speedups)))), 3)
    print("geometric mean of time / numpy's (and / chosen's):", json.dumps(summary))
    heads = [time_head(device, k, n, args.repeat) for k in args.heads for n in args.batches + [100]]
    if args.json:
        result = {"device": {"name": device.name, "platform": device.platform, "type": device.kind,
                             "compute_units": device.compute_units},
                  "driver": device.driver_version, "host": platform.processor() or platform.machine(),
                  "numpy": np.__version__, "repeat": args.repeat, "precision": args.precision, "time": "min (and median) of launch to queue "
                  "finished, ms; numpy x @ kernel on the host, interleaved; kernel_us: median device time "
                  "of each launch (profiling events)", "rows": rows, "summary": summary,
                  "heads": heads,
                  "command": "benchmarks/gemv.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")


def time_head(device, k, n, repeat, m=10):
    """Dense(m, softmax) with a bias: the fused kernel (one launch) beside product + softmax."""
    from malinn.choice.matrix import DeviceMatrix

    rng = np.random.default_rng(k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = ops.upload_vector(device, rng.standard_normal(m).astype(np.float32))
    fused = ops.kernel_for("matmul", device, (m, k, n), activation="softmax")
    separate = ops.kernel_for("matmul", device, (m, k, n))
    if "softmax" not in fused.epilogue:
        raise RuntimeError(f"no kernel fuses the softmax of a {m}x{k}x{n} head on {device.name}")
    operands = {}
    for name, spec in (("fused", fused), ("separate", separate)):
        plan = ops.matmul_plan(spec, m, k, n)
        operands[name] = (DeviceMatrix.upload(device, a, spec.matrices["a"].layout, plan["a"]),
                          DeviceMatrix.upload(device, b, spec.matrices["b"].layout, plan["b"]), spec)
    runs = {}
    for name, (da, db, spec) in operands.items():
        def run(da=da, db=db, spec=spec):
            r = ops.matmul(da, db, spec, device, bias=bias, activation="softmax")
            device.queue.finish()
            return r
        runs[name] = run
    want = None
    for name, run in runs.items():
        got = run().numpy()
        want = got if want is None else want
        if not np.allclose(got, want, atol=1e-6):
            raise RuntimeError(f"fused and separate softmax heads differ at {m}x{k}x{n}")
    times = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    row = {"m": m, "k": k, "n": n, "fused": label(fused), "separate": label(separate),
           "ms": {name: round(min(ts) * 1e3, 4) for name, ts in times.items()},
           "median_ms": {name: round(float(np.median(ts)) * 1e3, 4) for name, ts in times.items()}}
    print(f"head {m}x{k} n={n}: fused {row['ms']['fused']:.3f} ({row['fused']})  "
          f"separate {row['ms']['separate']:.3f} ({row['separate']} + softmax)", flush=True)
    return row


if __name__ == "__main__":
    main()
