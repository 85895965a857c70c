"""Batch-1..8 Dense products in every weight precision: gemv_split_c's configurations beside gemv_c and
gemv_rows, against the device-to-device copy bandwidth measured in the same run.

For each product ``m x k x n`` (units x inputs x batch; default: 4096x3072, 3072x4096, 2500x784 and
2000x2500 at n = 1 and 8) and each weight precision (fp32, fp16-storage and int8-weights; fp16 with
--precisions), it times with OpenCL profiling events (median of --repeat launches):

* ``gemv_split_c`` in every configuration of the grid below (K split across work-groups);
* ``gemv_c`` in the configuration the GPU's ``matmul_fallback`` named for the batch before gemv_split_c
  (``gemv_c (default)``: what malinn ran before) and in its candidates that hold the batch;
* ``chosen``: what the library's GPU ``matmul_fallback`` names now;
* ``gemv_rows`` (row-major weights, a second layout; fp32 only) in its candidates that hold the batch.

Each launch is timed "cold": before it, a kernel reads --flush MiB on the device (clean lines, no
write-back left for the next kernel), so that the weights are not in the last-level cache (the H200's L2 holds 50 MB: all of an int8 Full CIFAR layer); a Dense
layer in a network reads weights the layers before it have evicted. ``warm`` (back to back) is kept
beside it for the best configurations. Every configuration is first checked against numpy (the
weights as the precision stores them, float64). GB/s: the weights' bytes in the precision over the
median time; ``of_copy``: that over the copy bandwidth (bytes read plus written per second).

The summary gives, per product and precision, the best of each kernel; the speed-up of each precision
over fp32 (best against best: the targets are >= 1.7x for fp16-storage and >= 3x for int8-weights); and per
batch and precision the gemv_split_c configuration with the best geometric mean over the products
(what the library's defaults should name).

Also in the same run: ``floor_ms``, the event time of a 4 KiB copy (what every launch costs on the
device's clock), and per layer and precision a copy of half the weights' bytes (the same bytes read
plus written as the kernel reads), cold; ``split_time_over_copy`` is the best gemv_split_c time over it.

Run:  python3 benchmarks/gemv_sweep.py [--device D] [--shapes 4096x3072 ...] [--batches 1 8]
                                       [--precisions fp32 ...] [--repeat 9] [--grid broad|focused]
                                       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time

import numpy as np
from models import copy_bandwidth

import malinn
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import MalinnError
from malinn.library.kernel_library import load_library
from malinn.library.precision import device_bytes, effective
from malinn.ops import launch, matmul_plan

SHAPES = [(4096, 3072), (3072, 4096), (2500, 784), (2000, 2500)]

#: gemv_split_c configurations per batch bound NB: (VW, MDIM, KSPLIT, SLICES, UNROLL), WIDE 1
GRID_NB1 = [(4, 64, 2, 16, 2), (4, 64, 2, 4, 2), (4, 64, 2, 8, 2), (4, 64, 2, 32, 2), (4, 64, 2, 64, 2),
            (4, 64, 2, 16, 1), (4, 64, 2, 16, 4), (4, 64, 2, 16, 8), (4, 32, 4, 16, 2), (4, 128, 1, 16, 2),
            (4, 128, 2, 16, 2), (4, 64, 4, 16, 2), (4, 32, 8, 16, 2), (8, 32, 2, 16, 2), (8, 64, 2, 16, 1),
            (16, 32, 2, 16, 1), (16, 16, 4, 32, 1), (4, 128, 2, 32, 4), (4, 64, 4, 32, 1), (4, 32, 8, 8, 2),
            (4, 16, 16, 1, 2), (4, 32, 8, 1, 4), (4, 64, 1, 32, 4), (8, 32, 4, 32, 1), (4, 64, 2, 64, 4),
            (4, 64, 4, 32, 4), (4, 128, 2, 64, 2), (8, 64, 2, 32, 2), (4, 32, 4, 64, 4), (16, 32, 2, 32, 2),
            (4, 64, 2, 32, 8), (4, 64, 1, 64, 4), (4, 128, 1, 64, 4), (8, 64, 1, 64, 2)]
GRID_NB8 = [(4, 64, 2, 16, 1), (4, 64, 2, 16, 2), (4, 64, 2, 8, 1), (4, 64, 2, 32, 1), (4, 32, 4, 16, 1),
            (4, 32, 2, 16, 1), (2, 64, 2, 16, 1), (4, 64, 1, 32, 2), (8, 32, 2, 16, 1), (4, 16, 8, 8, 1),
            (4, 64, 2, 64, 1), (4, 64, 1, 64, 2)]
GRIDS = {1: GRID_NB1, 2: GRID_NB8, 4: GRID_NB8, 8: GRID_NB8}
#: --grid focused: around the winners of the broad grid on the H200 (many items: 4-16 K items per
#: work-group, 8-64 slices)
FOCUSED_NB1 = [(4, 32, 8, 16, 2), (4, 64, 4, 32, 4), (4, 64, 4, 32, 1), (4, 32, 4, 64, 4), (4, 32, 8, 16, 4),
               (4, 32, 8, 32, 2), (4, 32, 8, 32, 1), (4, 64, 4, 16, 2), (4, 16, 16, 16, 2), (4, 16, 16, 32, 1),
               (4, 32, 8, 8, 2), (4, 64, 4, 32, 2), (4, 32, 8, 64, 1), (4, 16, 16, 8, 4)]
FOCUSED_NB8 = [(4, 32, 4, 16, 1), (4, 16, 8, 8, 1), (4, 16, 8, 16, 1), (4, 32, 4, 8, 1), (4, 32, 8, 8, 1),
               (4, 16, 16, 8, 1), (4, 32, 4, 32, 1), (4, 16, 8, 4, 1)]
FOCUSED = {1: FOCUSED_NB1, 2: FOCUSED_NB8, 4: FOCUSED_NB8, 8: FOCUSED_NB8}
#: gemv_c's configurations in the GPU's matmul_fallback before gemv_split_c (NB 1, 2, 4, 8)
OLD_GEMV_C = [dict(VW=2, WPT=1, MDIM=4, KSPLIT=64, NB=1), dict(VW=8, WPT=1, MDIM=2, KSPLIT=128, NB=2),
              dict(VW=4, WPT=1, MDIM=4, KSPLIT=64, NB=4), dict(VW=4, WPT=1, MDIM=2, KSPLIT=64, NB=8)]


def split_configs(n: int, grids=GRIDS) -> list:
    """The grid for the batch, then its first 4 configurations with vloadN loads (WIDE 0)."""
    nb = min(b for b in grids if b >= n)
    configs = [dict(VW=vw, MDIM=md, KSPLIT=ks, SLICES=sl, UNROLL=un, NB=nb) for vw, md, ks, sl, un in grids[nb]]
    return configs + [dict(c, WIDE=0) for c in configs[:4]]


def label(spec) -> str:
    return spec.codename + ":" + ",".join(f"{k}{v}" for k, v in spec.config.items() if k != "KERAS_ORDER")


FLUSH_SOURCE = """
__kernel void read_all(__global const float4 *x, uint n, __global float *out)
{
    float4 s = 0.0f;
    for (uint i = get_global_id(0); i < n; i += get_global_size(0))
        s += x[i];
    if (s.x == 1234.5f)   /* never, for these zeros: the reads cannot be dropped */
        out[0] = s.y;
}
"""


class Flush:
    """A kernel that reads ``mib`` MiB (and writes nothing), evicting the last-level cache between
    launches with clean lines: a copy would leave it full of dirty ones, whose write-back the next
    kernel would pay for."""

    def __init__(self, device, mib: int):
        import pyopencl as cl

        self.nbytes = mib * 2**20
        self.device = device
        self.kernel = None
        if mib:
            self.src = device.alloc(self.nbytes, "cache flush source")
            device.fill_zero(self.src, self.nbytes, "cache flush source")
            self.out = device.alloc(4, "cache flush output")
            self.kernel = cl.Program(device.context, FLUSH_SOURCE).build().read_all
            self.kernel.set_args(self.src, np.uint32(self.nbytes // 16), self.out)
            self.cl = cl

    def __call__(self):
        if self.kernel is not None:
            self.cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, (132 * 2048,), (256,))


class Weights:
    """One ``m x k`` weight matrix on the device per (layout, precision), padded for every kernel."""

    def __init__(self, device, m: int, k: int, seed: int):
        self.device, self.m, self.k = device, m, k
        self.a = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
        self.copies = {}

    def on_device(self, spec, padded):
        layout = spec.matrices["a"].layout
        key = (str(layout), spec.precision)
        have = self.copies.get(key)
        if have is None or have.padded[0] < padded[0] or have.padded[1] < padded[1]:
            rows = max(padded[0], -(-self.m // 64) * 64) if str(layout) == "C" else padded[0]
            cols = max(padded[1], -(-self.k // 64) * 64) if str(layout) == "R" else padded[1]
            if have is not None:
                rows, cols = max(rows, have.padded[0]), max(cols, have.padded[1])
            self.copies.pop(key, None)
            have = self.copies[key] = DeviceMatrix.upload_weights(
                self.device, device_bytes(self.a, spec.precision, layout, (rows, cols)), (self.m, self.k), layout,
                (rows, cols), spec.precision)
        return have


def time_spec(spec, device, weights: Weights, b: np.ndarray, flush: Flush, repeat: int, want: np.ndarray):
    m, k = weights.m, weights.k
    n = b.shape[1]
    plan = matmul_plan(spec, m, k, n)
    args = {"a": weights.on_device(spec, plan["a"]),
            "b": DeviceMatrix.upload(device, b, spec.matrices["b"].layout, plan["b"]),
            "r": DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"])}
    launch(spec, device, args).wait()
    got = args["r"].numpy()
    error = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    if not error <= 1e-3:
        raise RuntimeError(f"{label(spec)} [{spec.precision}] is wrong at {m}x{k}x{n}: error {error:.2e}")
    launch(spec, device, args).wait()
    cold, warm = [], []
    for _ in range(repeat):
        flush()
        event = launch(spec, device, args)
        event.wait()
        cold.append((event.profile.end - event.profile.start) * 1e-9)
    for _ in range(repeat):
        event = launch(spec, device, args)
        event.wait()
        warm.append((event.profile.end - event.profile.start) * 1e-9)
    return float(np.median(cold)), float(np.median(warm)), min(cold), error


def copy_ms(device, nbytes: int, flush: Flush, repeat: int) -> tuple:
    """Median ms of a device-to-device copy of ``nbytes`` (cold: after the flush; warm)."""
    import pyopencl as cl

    src, dst = device.alloc(max(nbytes, 4), "copy source"), device.alloc(max(nbytes, 4), "copy destination")
    cold, warm = [], []
    for times, flushing in ((cold, True), (warm, False)):
        for _ in range(repeat + 1):
            if flushing:
                flush()
            event = cl.enqueue_copy(device.queue, dst, src, byte_count=max(nbytes, 4))
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-6)
    return float(np.median(cold[1:])), float(np.median(warm[1:]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--shapes", nargs="+", help="units x inputs, e.g. 4096x3072 (default: 4 Table 10.5 layers)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--precisions", nargs="+", help="default: fp32 fp16-storage int8-weights (fp16 on request)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--flush", type=int, default=256, help="MiB read before each cold launch (0: none)")
    parser.add_argument("--limit", type=int, help="time only the first LIMIT gemv_split_c configurations")
    parser.add_argument("--budget", type=float, default=150,
                        help="seconds; past them only the first 3 gemv_split_c configurations and the defaults run")
    parser.add_argument("--grid", choices=["broad", "focused"], default="broad",
                        help="gemv_split_c configurations: the broad grid, or the focused one around its winners")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    library = load_library()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    precisions = args.precisions or ["fp32", "fp16-storage", "int8-weights"]
    copy_gbs = copy_bandwidth(device, 2**30 if device.kind == "gpu" else 2**28) / 1e9
    print(f"device: {device}\ndevice-to-device copy: {copy_gbs:.0f} GB/s (read + written)", flush=True)
    flush = Flush(device, args.flush)
    floor_ms = copy_ms(device, 4096, flush, args.repeat)[1]
    print(f"floor (a 4 KiB copy's event): {floor_ms:.4f} ms", flush=True)
    copies = {}
    fallbacks = library.default_specs("matmul_fallback", "gpu")
    rows = []
    for m, k in shapes:
        weights = Weights(device, m, k, seed=m + 7 * k)
        for n in args.batches:
            b = np.random.default_rng(n).standard_normal((k, n)).astype(np.float32)
            grid = split_configs(n, FOCUSED if args.grid == "focused" else GRIDS)
            specs = [library["gemv_split_c"].configure(c) for c in grid][:args.limit]
            chosen = next((f for f in fallbacks if f.accepts(m, k, n)), fallbacks[-1])
            gemv_c = library["gemv_c"]
            old = next(gemv_c.configure(c) for c in OLD_GEMV_C if c["NB"] >= n)
            others = [old] + [gemv_c.configure(c) for c in gemv_c.configurations(device)
                              if int(c["NB"]) == int(old.config["NB"]) and int(c["KSPLIT"]) > 1]
            rows_configs = library["gemv_rows"].configurations(device)
            nb = min(int(c["NB"]) for c in rows_configs if int(c["NB"]) >= n)
            rows_specs = [library["gemv_rows"].configure(c) for c in rows_configs if int(c["NB"]) == nb]
            for precision in precisions:
                want = effective(weights.a, precision).astype(np.float64) @ b
                nbytes = library.precision(precision).weight_bytes * m * k
                if (m, k, precision) not in copies:   # the same bytes moved: half read, half written
                    cold, warm = copy_ms(device, nbytes // 2, flush, args.repeat)
                    copies[(m, k, precision)] = {"m": m, "k": k, "precision": precision, "bytes": nbytes,
                                                 "cold_ms": round(cold, 5), "warm_ms": round(warm, 5)}
                timed = [(s.in_precision(precision), "gemv_split_c") for s in specs]
                timed += [(s.in_precision(precision), "gemv_c" + (" (default)" if i == 0 else ""))
                          for i, s in enumerate(others)]
                if precision in chosen.precisions:
                    timed.insert(0, (chosen.in_precision(precision), "chosen"))
                if precision == "fp32":
                    timed += [(s, "gemv_rows") for s in rows_specs]
                if time.perf_counter() - started > args.budget:
                    timed = [t for t in timed if t[1] == "gemv_split_c"][:3] + [
                        t for t in timed if t[1] in ("chosen", "gemv_c (default)")] + [
                        t for t in timed if t[1] == "gemv_rows"][:1]
                    print(f"  over the budget of {args.budget:.0f} s: a few configurations only", flush=True)
                seen = set()
                for spec, family in timed:
                    key = (spec.codename, spec.defines)
                    if key in seen and family in ("gemv_split_c", "gemv_c", "gemv_rows"):
                        continue
                    if family in ("gemv_split_c", "gemv_c", "gemv_rows"):
                        seen.add(key)
                    try:
                        cold, warm, best, error = time_spec(spec, device, weights, b, flush, args.repeat, want)
                    except MalinnError as exc:
                        print(f"  skipped {label(spec)} [{precision}]: {exc}", flush=True)
                        continue
                    nbytes = library.precision(precision).weight_bytes * m * k
                    rows.append({"m": m, "k": k, "n": n, "precision": precision, "family": family,
                                 "kernel": spec.codename, "config": spec.config, "label": label(spec),
                                 "ms": round(cold * 1e3, 5), "ms_min": round(best * 1e3, 5),
                                 "warm_ms": round(warm * 1e3, 5), "weight_bytes": nbytes,
                                 "gbs": round(nbytes / cold / 1e9, 1),
                                 "of_copy": round(nbytes / cold / 1e9 / copy_gbs, 3), "error": error})
                best = {}
                for r in rows:
                    if (r["m"], r["k"], r["n"], r["precision"]) == (m, k, n, precision):
                        fam = r["family"].split(" ")[0]
                        if fam not in best or r["ms"] < best[fam]["ms"]:
                            best[fam] = r
                default = next((r for r in rows if (r["m"], r["k"], r["n"], r["precision"]) == (m, k, n, precision)
                                and r["family"] == "gemv_c (default)"), None)
                print(f"{m}x{k} n={n} {precision}: " + "  ".join(
                    f"{fam} {r['ms']:.4f} ms {r['of_copy']:.0%}" for fam, r in best.items())
                    + (f"  gemv_c default {default['ms']:.4f} ms" if default else "")
                    + (f"  [best split: {best['gemv_split_c']['label']}]" if "gemv_split_c" in best else ""),
                    flush=True)
    summary = summarize(rows, shapes, args.batches, precisions)
    for entry in summary["per_product"]:
        copy = copies.get((entry["m"], entry["k"], entry["precision"]))
        if copy and "gemv_split_c" in entry:
            entry["same_bytes_copy_ms"] = copy["cold_ms"]
            entry["split_time_over_copy"] = round(entry["gemv_split_c"]["ms"] / copy["cold_ms"], 3)
    print(json.dumps(summary, indent=1))
    print(f"{time.perf_counter() - started:.0f} s")
    if args.json:
        result = {"device": {"name": device.name, "platform": device.platform, "type": device.kind,
                             "compute_units": device.compute_units},
                  "driver": device.driver_version, "host": platform.processor() or platform.machine(),
                  "copy_gbs": copy_gbs, "repeat": args.repeat, "flush_mib": args.flush,
                  "time": "median of --repeat launches (OpenCL profiling events), each after a kernel reading flush_mib "
                          "MiB (cold); warm_ms: back to back",
                  "floor_ms": floor_ms, "copies": list(copies.values()),
                  "rows": rows, "summary": summary,
                  "command": "benchmarks/gemv_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")


def summarize(rows, shapes, batches, precisions) -> dict:
    def best(m, k, n, precision, family):
        found = [r for r in rows if (r["m"], r["k"], r["n"], r["precision"]) == (m, k, n, precision)
                 and r["family"].startswith(family)]
        return min(found, key=lambda r: r["ms"]) if found else None

    per_product = []
    for m, k in shapes:
        for n in batches:
            for precision in precisions:
                entry = {"m": m, "k": k, "n": n, "precision": precision}
                for family in ("chosen", "gemv_split_c", "gemv_c (default)", "gemv_c", "gemv_rows"):
                    r = best(m, k, n, precision, family)
                    if r is not None:
                        entry[family] = {"ms": r["ms"], "of_copy": r["of_copy"], "label": r["label"]}
                fp32 = best(m, k, n, "fp32", "gemv_split_c")
                mine = best(m, k, n, precision, "gemv_split_c")
                if fp32 and mine:
                    entry["split_speedup_vs_fp32"] = round(fp32["ms"] / mine["ms"], 3)
                fp32_any = min((x for x in (best(m, k, n, "fp32", f) for f in ("gemv_split_c", "gemv_c", "gemv_rows"))
                                if x), key=lambda r: r["ms"], default=None)
                if fp32_any and mine:
                    entry["split_speedup_vs_best_fp32"] = round(fp32_any["ms"] / mine["ms"], 3)
                per_product.append(entry)
    per_config = {}
    for n in batches:
        for precision in precisions:
            mine = [r for r in rows if r["n"] == n and r["precision"] == precision and r["family"] == "gemv_split_c"]
            scores = {}
            for r in mine:
                scores.setdefault(r["label"], []).append(r["ms"] / best(r["m"], r["k"], n, precision, "gemv_split_c")["ms"])
            most = max((len(s) for s in scores.values()), default=0)   # all shapes, unless the budget ran out
            complete = {lab: s for lab, s in scores.items() if len(s) == most}
            ranked = sorted(complete.items(), key=lambda item: math.exp(np.mean(np.log(item[1]))))
            per_config[f"n={n} {precision}"] = [
                {"label": lab, "geomean_vs_best": round(math.exp(np.mean(np.log(s))), 3), "shapes": len(s),
                 "config": next(r["config"] for r in mine if r["label"] == lab)} for lab, s in ranked[:5]]
    overall = {}   # one configuration per batch serves every precision (the library's defaults)
    for n in batches:
        mine = [r for r in rows if r["n"] == n and r["family"] == "gemv_split_c"]
        scores = {}
        for r in mine:
            key = ",".join(f"{k}{v}" for k, v in r["config"].items() if k not in ("WEIGHT_BITS", "HALF_ARITHMETIC"))
            scores.setdefault(key, []).append(r["ms"] / best(r["m"], r["k"], n, r["precision"], "gemv_split_c")["ms"])
        most = max((len(s) for s in scores.values()), default=0)
        ranked = sorted(((key, s) for key, s in scores.items() if len(s) == most),
                        key=lambda item: math.exp(np.mean(np.log(item[1]))))
        overall[f"n={n}"] = [{"config": key, "geomean_vs_best": round(math.exp(np.mean(np.log(s))), 3),
                              "worst_vs_best": round(max(s), 3), "products": len(s)} for key, s in ranked[:5]]
    return {"per_product": per_product, "best_split_configs": per_config, "best_split_config_every_precision": overall}


if __name__ == "__main__":
    main()
