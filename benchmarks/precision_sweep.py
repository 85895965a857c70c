"""Batch-1 weight streaming per precision: gemv_split_c's configurations for fp16-storage and
int8-weights weights beside fp32's, on the two Full CIFAR layers.

For each product ``m x k x 1`` (units x inputs; default 4096x3072 and 3072x4096, Keras's memory order:
gemv_split_c) and each precision it times (OpenCL profiling events, median of --repeat launches, each
"cold": after a kernel that reads --flush MiB, so that the weights are not in the last-level cache,
as benchmarks/gemv_sweep.py does):

* ``chosen``: the configuration the library's GPU ``matmul_fallback`` names for the precision now
  (an entry with ``"precisions"`` serves those precisions only);
* the precision's grid below: fp32's current default and the winners of the earlier sweeps (the
  baseline); for fp16-storage (and fp16, on request, where the device has cl_khr_fp16) and
  int8-weights, 16-byte loads of rows (VW 8 halves, VW 16 chars; a few VW 16 halves: two loads per
  column) with COLS columns per item and step (32 bytes per item and step at COLS 2, as fp32's VW 4
  UNROLL 2). A layer has (m / VW) * KSPLIT * SLICES items, so the grid spans: as many items as fp32
  with its bytes per step (fp32's bytes in flight; each item does a half or a quarter of fp32's
  steps), fewer items with more bytes per step (the same bytes in flight and per item), fewer items
  with fp32's bytes per step, and a few more or fewer; beside the former default (VW 4, the columns
  scaled by 32 / WEIGHT_BITS: narrower loads, as many items as fp32), one vloadN variant (WIDE 0)
  and, for int8, two with INT8_BIAS 1 (bytes converted through the exponent bias, not by type
  conversion instructions).

Past --budget seconds only the chosen configuration and the first 3 of each grid run. Every
configuration is first checked against numpy (the weights as the precision stores them).
Per product and precision: the best time, GB/s (the weights' bytes in the precision over the time)
and its share of the copy bandwidth measured in the same run; the speed-up over fp32 (best against
best, and the chosen configuration against fp32's chosen: the targets, >= 1.7x for
fp16-storage and >= 3x for int8-weights); per precision, the configurations ranked by the geometric
mean of their time over the best on each product, and the first of them written as a
``matmul_fallback`` entry to paste into kernels/library.json. ``floor_ms``: a 4 KiB copy's event time
(what any launch costs on the device's clock); per product and precision the cold time of a copy
moving the same bytes (half read, half written).

Run:  python3 benchmarks/precision_sweep.py [--device D] [--shapes 4096x3072 3072x4096]
                                            [--precisions fp32 fp16-storage int8-weights [fp16]]
                                            [--repeat 9] [--flush 256] [--budget 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

import malinn
from malinn.errors import MalinnError
from malinn.library.kernel_library import load_library
from malinn.library.precision import effective

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_sweep import Flush, Weights, copy_ms, label, time_spec  # noqa: E402
from models import copy_bandwidth  # noqa: E402

SHAPES = [(4096, 3072), (3072, 4096)]
KEYS = ("VW", "MDIM", "KSPLIT", "SLICES", "UNROLL", "COLS")
#: gemv_split_c configurations per precision: (VW, MDIM, KSPLIT, SLICES, UNROLL, COLS[, other defines]), NB 1
FP32 = [(4, 32, 8, 16, 2, 0), (4, 64, 4, 32, 4, 0), (4, 16, 16, 16, 2, 0), (4, 64, 4, 32, 4, 0, {"WIDE": 0})]
HALF = [(4, 32, 8, 16, 2, 0), (8, 32, 8, 16, 2, 2), (8, 16, 16, 16, 2, 2), (8, 32, 8, 32, 2, 2),
        (8, 64, 4, 32, 2, 2), (8, 32, 8, 16, 2, 4), (16, 16, 8, 32, 2, 2), (8, 32, 8, 32, 2, 4),
        (8, 16, 16, 32, 2, 1), (8, 32, 8, 8, 2, 2), (8, 16, 16, 8, 2, 4), (8, 64, 4, 16, 2, 2),
        (8, 32, 8, 16, 2, 2, {"WIDE": 0})]
CHAR = [(4, 32, 8, 16, 2, 0), (16, 16, 16, 16, 2, 4), (16, 16, 16, 16, 2, 4, {"INT8_BIAS": 1}), (16, 8, 32, 16, 2, 2),
        (16, 16, 16, 32, 2, 2), (16, 32, 8, 32, 2, 4), (16, 32, 8, 32, 2, 4, {"INT8_BIAS": 1}), (16, 32, 8, 16, 2, 8),
        (16, 8, 32, 16, 2, 4), (16, 16, 16, 16, 2, 2), (16, 32, 8, 32, 2, 2), (16, 16, 16, 8, 2, 4),
        (8, 32, 8, 16, 2, 4), (16, 64, 4, 64, 2, 2), (16, 16, 16, 16, 2, 4, {"WIDE": 0})]
GRIDS = {"fp32": FP32, "fp16-storage": HALF, "fp16": HALF, "int8-weights": CHAR}


def configs(precision: str) -> list:
    """The grid of ``precision`` as define dicts (NB 1, and the tuple's other defines)."""
    return [{**dict(zip(KEYS, values[:6])), "NB": 1, **(values[6] if len(values) > 6 else {})}
            for values in GRIDS[precision]]


def chosen_spec(library, precision: str, m: int, k: int):
    """What the library's GPU ``matmul_fallback`` names for a batch-1 product in ``precision``."""
    fallbacks = library.default_specs("matmul_fallback", "gpu", precision=precision)
    spec = next((f for f in fallbacks if f.accepts(m, k, 1) and precision in f.precisions), None)
    return spec.in_precision(precision) if spec is not None else None


def geomean(values) -> float:
    return math.exp(float(np.mean(np.log(values))))


def summarize(rows, shapes, precisions) -> dict:
    def best(m, k, precision, family=None):
        found = [r for r in rows if (r["m"], r["k"], r["precision"]) == (m, k, precision)
                 and (family is None or r["family"] == family)]
        return min(found, key=lambda r: r["ms"]) if found else None

    per_product = []
    for m, k in shapes:
        fp32, fp32_chosen = best(m, k, "fp32"), best(m, k, "fp32", "chosen")
        for precision in precisions:
            mine, chosen = best(m, k, precision), best(m, k, precision, "chosen")
            if mine is None:
                continue
            entry = {"m": m, "k": k, "precision": precision,
                     "best": {"ms": mine["ms"], "gbs": mine["gbs"], "of_copy": mine["of_copy"], "label": mine["label"]}}
            if chosen:
                entry["chosen"] = {"ms": chosen["ms"], "gbs": chosen["gbs"], "label": chosen["label"]}
            if fp32:
                entry["speedup_best_vs_best_fp32"] = round(fp32["ms"] / mine["ms"], 3)
            if fp32_chosen and chosen:
                entry["speedup_chosen_vs_chosen_fp32"] = round(fp32_chosen["ms"] / chosen["ms"], 3)
            per_product.append(entry)
    ranking = {}
    for precision in precisions:
        scores = {}
        for r in rows:
            if r["precision"] == precision and r["family"] == "grid":
                scores.setdefault(r["label"], []).append(r["ms"] / best(r["m"], r["k"], precision)["ms"])
        complete = {lab: s for lab, s in scores.items() if len(s) == len(shapes)}
        ranked = sorted(complete.items(), key=lambda item: geomean(item[1]))
        ranking[precision] = [{"label": lab, "geomean_vs_best": round(geomean(s), 3), "worst_vs_best": round(max(s), 3),
                               "config": next(r["config"] for r in rows if r["label"] == lab
                                              and r["precision"] == precision)} for lab, s in ranked[:6]]
    entries = []
    for precision in precisions:
        if precision == "fp32" or not ranking.get(precision):
            continue
        config = {k: int(v) for k, v in ranking[precision][0]["config"].items()
                  if k not in ("KERAS_ORDER", "WEIGHT_BITS", "HALF_ARITHMETIC")}
        entries.append({"codename": "gemv_split_c", "precisions": [precision], "defines": config})
    return {"per_product": per_product, "ranking": ranking, "suggested_matmul_fallback_entries": entries}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--shapes", nargs="+", help="units x inputs, e.g. 4096x3072 (default: 4096x3072 3072x4096)")
    parser.add_argument("--precisions", nargs="+", choices=list(GRIDS),
                        help="default: fp32 fp16-storage int8-weights (fp16: half arithmetic, where the device has it)")
    parser.add_argument("--repeat", type=int, default=9, help="timed launches per configuration (the median counts)")
    parser.add_argument("--flush", type=int, default=256, help="MiB read before each cold launch (0: none)")
    parser.add_argument("--budget", type=float, default=100,
                        help="seconds; past them only the chosen configuration and the first 3 of a grid run")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    library = load_library()
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes] if args.shapes else SHAPES
    precisions = args.precisions or ["fp32", "fp16-storage", "int8-weights"]
    if "fp16" in precisions and "cl_khr_fp16" not in device.extensions:
        print(f"{device.name} has no cl_khr_fp16: fp16 (half arithmetic) left out", flush=True)
        precisions = [p for p in precisions if p != "fp16"]
    copy_gbs = copy_bandwidth(device, 2**30 if device.kind == "gpu" else 2**28) / 1e9
    print(f"device: {device}\ndevice-to-device copy: {copy_gbs:.0f} GB/s (read + written)", flush=True)
    flush = Flush(device, args.flush)
    floor_ms = copy_ms(device, 4096, flush, args.repeat)[1]
    print(f"floor (a 4 KiB copy's event): {floor_ms:.4f} ms", flush=True)
    rows, copies = [], []
    for m, k in shapes:
        weights = Weights(device, m, k, seed=m + 7 * k)
        b = np.random.default_rng(1).standard_normal((k, 1)).astype(np.float32)
        for precision in precisions:
            nbytes = library.precision(precision).weight_bytes * m * k
            cold, warm = copy_ms(device, nbytes // 2, flush, args.repeat)
            copies.append({"m": m, "k": k, "precision": precision, "bytes": nbytes, "cold_ms": round(cold, 5),
                           "warm_ms": round(warm, 5)})
            want = effective(weights.a, precision).astype(np.float64) @ b
            timed = [(library["gemv_split_c"].configure(c).in_precision(precision), "grid") for c in configs(precision)]
            chosen = chosen_spec(library, precision, m, k)
            if chosen is not None:
                timed.insert(0, (chosen, "chosen"))
            if time.perf_counter() - started > args.budget:
                timed = timed[:4 if chosen is not None else 3]
                print(f"  over the budget of {args.budget:.0f} s: a few configurations only", flush=True)
            for spec, family in timed:
                try:
                    cold, warm, fastest, error = time_spec(spec, device, weights, b, flush, args.repeat, want)
                except MalinnError as exc:
                    print(f"  skipped {label(spec)} [{precision}]: {str(exc).splitlines()[0]}", flush=True)
                    continue
                row = {"m": m, "k": k, "n": 1, "precision": precision, "family": family, "kernel": spec.codename,
                       "config": spec.config, "label": label(spec), "ms": round(cold * 1e3, 5),
                       "ms_min": round(fastest * 1e3, 5), "warm_ms": round(warm * 1e3, 5), "weight_bytes": nbytes,
                       "gbs": round(nbytes / cold / 1e9, 1), "of_copy": round(nbytes / cold / 1e9 / copy_gbs, 3),
                       "error": error}
                rows.append(row)
                print(f"{m}x{k} {precision:<13} {family:<6} {row['ms']:.4f} ms {row['gbs']:7.1f} GB/s "
                      f"({row['of_copy']:.0%} of copy)  {row['label']}", flush=True)
    summary = summarize(rows, shapes, precisions)
    for entry in summary["per_product"]:
        print(f"{entry['m']}x{entry['k']} {entry['precision']:<13} best {entry['best']['ms']:.4f} ms "
              f"{entry['best']['gbs']:.0f} GB/s"
              + (f", chosen {entry['chosen']['ms']:.4f} ms" if "chosen" in entry else "")
              + (f"; vs fp32: best {entry['speedup_best_vs_best_fp32']:.2f}x" if "speedup_best_vs_best_fp32" in entry else "")
              + (f", chosen {entry['speedup_chosen_vs_chosen_fp32']:.2f}x"
                 if "speedup_chosen_vs_chosen_fp32" in entry else ""), flush=True)
    print(json.dumps(summary["suggested_matmul_fallback_entries"], indent=1))
    print(f"{time.perf_counter() - started:.0f} s")
    if args.json:
        result = {"device": {"name": device.name, "platform": device.platform, "type": device.kind,
                             "compute_units": device.compute_units},
                  "driver": device.driver_version, "host": platform.processor() or platform.machine(),
                  "copy_gbs": copy_gbs, "repeat": args.repeat, "flush_mib": args.flush, "floor_ms": floor_ms,
                  "time": "median of --repeat launches (OpenCL profiling events), each after a kernel reading "
                          "flush_mib MiB (cold); warm_ms: back to back",
                  "copies": copies, "rows": rows, "summary": summary,
                  "command": "benchmarks/precision_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
