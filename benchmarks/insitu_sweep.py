"""Matmul configurations timed inside a network's plan, where each layer's weights are as cold as in
``predict``: the evidence for the library's defaults on a network's own shapes.

A sweep of one product (``gemm_sweep.py``) launches the same kernel back to back, so weights that fit
the last-level cache (a 2000x2500 layer's 20 MB in an H200's 50 MB) stay there, and a latency-bound
configuration looks fast. In a network the layers before it have evicted them. Here each layer of
a Table 10.5 network (``models.py``) is given, one at a time, each candidate configuration through a
per-shape tuning-database entry (a temporary cache folder: the user's is untouched); the plan is
re-made, checked against numpy, and every launch is timed with profiling events in the plan's own
order (median of --repeat passes). Each layer's other neighbours keep the library's choice.

Candidates: the library's choice, every ``gemm_keras`` configuration the library lists
(``candidates``), the defaults' named variants, the top configurations of gemm_sweep.py JSON
files given with --from (those timed on this layer's shape), and every configuration of --configs
files (``{"codename": [defines, ...]}``, e.g. ``benchmarks/configs/gemv_batch1.json``); those a
layer's shape, batch or precision cannot take are skipped. --precision runs the network in that
precision (its tuning entries and numpy reference too).

Run:  python3 benchmarks/insitu_sweep.py [--models "Full MNIST"] [--batch 100] [--from sweep.json ...]
                                        [--configs configs.json ...] [--precision P] [--repeat 20]
                                        [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ["MALINN_CACHE_DIR"] = tempfile.mkdtemp(prefix="malinn-insitu-")  # before malinn reads it
atexit.register(shutil.rmtree, os.environ["MALINN_CACHE_DIR"], True)

import malinn  # noqa: E402
from malinn.choice import tuning_db  # noqa: E402
from malinn.library.kernel_library import load_library  # noqa: E402
from malinn.resources import kernels_dir  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build, effective_weights, numpy_forward, step_seconds  # noqa: E402


def candidates(shape, sources, configs=()) -> list:
    """``(codename, defines)`` pairs to try on the product ``shape`` = (m, k, n)."""
    library = load_library()
    entries = json.loads(library.path.read_text())["kernels"]
    found = [("gemm_keras", dict(c)) for c in entries["gemm_keras"].get("candidates") or []]
    for name in ("gemm_keras_large", "gemm_keras_full_batch", "gemm_keras_narrow", "gemv_batch_c",
                 "gemv_batch_small_c"):
        found.append((entries[name].get("variant_of", name), dict(entries[name].get("defines", {}))))
    key = "x".join(map(str, shape))
    for data in sources:
        for row in data.get("best_per_shape", {}).get(key, []):
            found.append((data["kernel"], dict(row["defines"])))
    for data in configs:
        found.extend((codename, dict(defines)) for codename, listed in data.items() for defines in listed)
    unique, seen = [], set()
    for codename, defines in found:
        tag = (codename, tuple(sorted((k, str(v)) for k, v in defines.items())))
        if tag not in seen:
            seen.add(tag)
            unique.append((codename, defines))
    return unique


def full(entries, codename, overrides) -> dict:
    """An entry's complete defines (its base's, its own, then ``overrides``), as strings."""
    entry = entries[codename]
    base = full(entries, entry["variant_of"], {}) if "variant_of" in entry else {}
    return {k: str(v) for k, v in {**base, **entry.get("defines", {}), **overrides}.items()}


def use_kernels_with(config_files) -> None:
    """Points malinn (``MALINN_KERNELS``, before the library is first read) at a temporary copy of
    its kernels folder whose ``library.json`` lists each --configs file's configurations among its
    kernels' ``candidates``, so that the tuning database accepts them as configurations it offers."""
    shipped = kernels_dir()
    library = json.loads((shipped / "library.json").read_text())
    for path in config_files:
        for codename, listed in json.loads(Path(path).read_text()).items():
            entry = library["kernels"][codename]
            known = list(entry.get("candidates") or [])
            seen = [full(library["kernels"], codename, c) for c in [{}] + known]
            for defines in listed:
                if full(library["kernels"], codename, defines) not in seen:
                    known.append(defines)
                    seen.append(full(library["kernels"], codename, defines))
            entry["candidates"] = known
    folder = Path(tempfile.mkdtemp(prefix="malinn-insitu-kernels-"))
    atexit.register(shutil.rmtree, str(folder), True)
    for item in shipped.iterdir():
        if item.name != "library.json":
            (folder / item.name).symlink_to(item)
    (folder / "library.json").write_text(json.dumps(library))
    os.environ["MALINN_KERNELS"] = str(folder)


def matmul_steps(plan, x, repeat: int) -> list:
    """:func:`models.step_seconds` of the plan's matmul steps alone (one per layer shape)."""
    return [s for s in step_seconds(plan, x, repeat) if s["kind"] == "matmul"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default)")
    parser.add_argument("--models", nargs="+", default=["Full MNIST"], choices=list(MODELS), metavar="NAME")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--from", dest="sources", nargs="*", default=[], metavar="JSON",
                        help="gemm_sweep.py results whose top configurations per shape are tried too")
    parser.add_argument("--configs", nargs="*", default=[], metavar="JSON",
                        help='files of {"codename": [defines, ...]} tried on every layer')
    parser.add_argument("--precision", default="fp32", help="the network's precision (default fp32)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.configs:
        use_kernels_with(args.configs)
    if args.device:
        malinn.set_device(args.device)
    device = malinn.get_device()
    sources = [json.loads(Path(p).read_text()) for p in args.sources]
    configs = [json.loads(Path(p).read_text()) for p in args.configs]
    print(f"device: {device}", flush=True)
    results = []
    for name in args.models:
        widths = MODELS[name]
        model = build(widths)
        model.precision = args.precision
        x = np.random.default_rng(1).standard_normal((args.batch, widths[0])).astype(np.float32)
        want = numpy_forward(effective_weights(model.get_weights(), args.precision), x)
        plan = model.plan(args.batch, device)
        # one shape per matmul step (a head fused into a step is timed in it, never alone here)
        shapes = [(s.weight.shape[0], s.weight.shape[1], s.inputs["b"].cols) for s in plan.steps
                  if s.kind == "matmul"]
        base = matmul_steps(plan, x, args.repeat)
        print(f"{name} batch {args.batch} {args.precision}: library's choice " + ", ".join(
            f"{s['seconds'] * 1e6:.1f} us {s['kernel']}" for s in base), flush=True)
        layers = []
        for index, shape in enumerate(shapes):
            key = tuning_db.shape_key(shape)
            rows = [{"codename": "library", "defines": None, "kernel": base[index]["kernel"],
                     "seconds": base[index]["seconds"], "total": sum(s["seconds"] for s in base)}]
            for codename, defines in candidates(shape, sources, configs):
                try:
                    if not tuning_db.offered({"codename": codename, "defines": defines}, device, shape,
                                             args.precision):
                        continue                          # not offered here (or its preconditions fail)
                    tuning_db.save(device, shapes={key: {"codename": codename, "defines": defines}},
                                   precision=args.precision)
                    plan = model.plan(args.batch, device)
                    y = model.predict(x)
                    if np.abs(y - want).max() > 1e-4 * max(1.0, float(np.abs(want).max())):
                        print(f"  {key}: {codename} {defines}: WRONG", flush=True)
                        continue
                    steps = matmul_steps(plan, x, args.repeat)
                except malinn.MalinnError as exc:
                    print(f"  {key}: {codename} {defines}: skipped ({exc})", flush=True)
                    continue
                rows.append({"codename": codename, "defines": defines, "kernel": steps[index]["kernel"],
                             "seconds": steps[index]["seconds"], "total": sum(s["seconds"] for s in steps)})
            rows.sort(key=lambda r: r["seconds"])
            print(f"  {key}: library {base[index]['seconds'] * 1e6:.1f} us; best:", flush=True)
            for r in rows[:8]:
                print(f"    {r['seconds'] * 1e6:7.1f} us (network {r['total'] * 1e6:6.1f})  {r['kernel']}", flush=True)
            layers.append({"shape": list(shape), "rows": rows})
            write(args.json, device, args.repeat, results + [{"model": name, "batch": args.batch,
                                                              "precision": args.precision, "library": base,
                                                              "layers": layers, "partial": True}])
            # later layers are timed with the library's choice here again
            path = tuning_db.tuning_file()
            path.unlink(missing_ok=True)
            tuning_db.forget()
        results.append({"model": name, "batch": args.batch, "precision": args.precision, "library": base,
                        "layers": layers})
    write(args.json, device, args.repeat, results)


def write(path, device, repeat, results) -> None:
    """Writes the results so far to ``path`` (when given): a run stopped by a time limit keeps them."""
    if path:
        Path(path).write_text(json.dumps({"device": device.describe(), "driver": device.driver_version,
                                          "repeat": repeat, "results": results,
                                          "command": " ".join(sys.argv)}, indent=1) + "\n")

if __name__ == "__main__":
    main()
