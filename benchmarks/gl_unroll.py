"""What the GL preamble's ``#pragma optionNV(unroll all)`` costs and buys on NVIDIA's OpenGL: the
build time and the kernel time of every GL matmul program the tuner can emit, as shipped and with the
preamble saying ``unroll none`` instead.

NVIDIA's GLSL compiler unrolls a constant-bound loop only when asked; unrolled, a work item's tile of
sums stays in registers. Shaders whose loops run over a tensor's axes, or whose tile cannot fit in
registers anyway, say ``unroll none`` after the preamble themselves (kernels/gl/*.comp). Other GL
drivers ignore the pragma, so this measures something only on NVIDIA.

Each build runs in its own process (``--jobs`` at a time, ``--timeout`` seconds at most: an endless
build is recorded as such, not waited for); then, one variant after the other, each program whose
builds both finished within 10 s is timed on one product (the tuner's: checked against numpy first,
device timer queries, median of --repeat) of SIZE x SIZE weights, 1 sample for the matrix-vector
kernels, 128 for the others. A diagnosis of the GL backend, not a comparison with a peer.

Result: benchmarks/results/gl_unroll_nvidia_h200.json.

Run:  MALINN_GL=1 python3 benchmarks/gl_unroll.py [--jobs 16] [--timeout 60] [--size 2048] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("as_shipped", "unroll_none")
QUICK_BUILD_S = 10.0


def _gl_device():
    from malinn.backends.selection import devices

    found = [d for d in devices() if d.backend == "gl"]
    if not found:
        sys.exit("no OpenGL device: set MALINN_GL=1 on a machine with a GL driver (docs/BACKENDS.md)")
    return found[0]


def _patch(variant: str) -> list:
    """Makes the GL backend build ``variant``; returns the list each build's seconds are added to."""
    import moderngl

    from malinn.backends import opengl

    preamble, compute_shader, seconds = opengl._preamble, moderngl.Context.compute_shader, []

    def _preamble(options, local, *rest):   # rest: what the backend passes besides (the fold)
        text = preamble(options, local, *rest)
        return text.replace("optionNV(unroll all)", "optionNV(unroll none)") if variant == "unroll_none" else text

    def timed(self, source, *args, **kwargs):
        start = time.perf_counter()
        shader = compute_shader(self, source, *args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return shader

    opengl._preamble, moderngl.Context.compute_shader = _preamble, timed
    return seconds


def programs() -> list[dict]:
    """Every distinct GL matmul program the tuner can emit: {codename, config}."""
    from malinn.library.kernel_library import load_library

    library, seen, found = load_library(), set(), []
    for codename in library.codenames("matmul"):
        spec = library[codename]
        gl = (spec.template[1].get("sources") or {}).get("gl")
        if gl is None:
            continue
        for config in spec.configurations() if spec.candidates else [dict(spec.defines)]:
            configured = spec.configure(config)
            key = (gl["source"], tuple(sorted(dict(configured.defines).items())), configured.workgroup)
            if key not in seen:
                seen.add(key)
                found.append({"codename": codename, "config": config})
    return found


def _shape(spec, size: int) -> tuple:
    limits = dict(spec.preconditions)
    m = min(int(limits["max_m"]), 1000) if "max_m" in limits else size
    return m, size, 1 if "max_n" in limits else 128


def build_one(variant: str, job: dict) -> dict:
    """In this process: builds ``job``'s program (by running it once on a small product)."""
    from malinn.library.kernel_library import load_library
    from malinn.tuning.tuner import Product

    seconds = _patch(variant)
    device = _gl_device()
    spec = load_library()[job["codename"]].configure(job["config"])
    if not spec.fits(device):
        return {"fits": False}
    Product(spec, device, 33, 17, 1).launch().wait()
    return {"build_s": round(sum(seconds), 3)}


def time_all(variant: str, jobs: list, size: int, repeat: int) -> list:
    """In this process: the kernel time (us) of each of ``jobs`` in ``variant``."""
    from malinn.library.kernel_library import load_library
    from malinn.tuning.tuner import _time_product

    _patch(variant)
    device, library, out = _gl_device(), load_library(), []
    for job in jobs:
        spec = library[job["codename"]].configure(job["config"])
        shape = _shape(spec, size)
        seconds = _time_product(spec, device, shape, repeat) if spec.accepts(*shape, device) else None
        out.append({"shape": list(shape), "kernel_us": None if seconds is None else round(seconds * 1e6, 2)})
    return out


def _child(args: list, timeout: float):
    """Runs this script with ``args``; its JSON answer, or "timeout"/"failed: ..."."""
    try:
        done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    if done.returncode != 0:
        return "failed: " + done.stderr.strip()[-300:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--build", nargs=2, metavar=("VARIANT", "JOB"), help=argparse.SUPPRESS)
    parser.add_argument("--time", nargs=2, metavar=("VARIANT", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build_one(args.build[0], json.loads(args.build[1]))))
        return
    if args.time:
        print(json.dumps(time_all(args.time[0], json.loads(args.time[1]), args.size, args.repeat)))
        return

    device = _gl_device()
    rows = programs()
    print(f"{device.name}: {len(rows)} GL matmul programs, {len(VARIANTS)} variants", flush=True)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {(i, v): pool.submit(_child, ["--build", v, json.dumps(row)], args.timeout)
                   for i, row in enumerate(rows) for v in VARIANTS}
        for (i, v), future in futures.items():
            rows[i].setdefault("build", {})[v] = future.result()
    print(f"builds: {time.perf_counter() - started:.0f} s", flush=True)

    def fits(row):
        return not any(isinstance(b, dict) and b.get("fits") is False for b in row["build"].values())

    def quick(row):
        return all(isinstance(b, dict) and b.get("build_s", 1e9) < QUICK_BUILD_S for b in row["build"].values())

    timed = [row for row in rows if fits(row) and quick(row)]
    for v in VARIANTS:
        answer = _child(["--time", v, json.dumps([{"codename": r["codename"], "config": r["config"]} for r in timed]),
                         "--size", str(args.size), "--repeat", str(args.repeat)], 600)
        for row, result in zip(timed, answer if isinstance(answer, list) else []):
            row.setdefault("kernel_us", {})[v] = result["kernel_us"]
            row["shape"] = result["shape"]

    failed = [r for r in rows if any(isinstance(b, str) and b.startswith("failed") for b in r["build"].values())]
    slow = [r for r in rows if fits(r) and not quick(r) and r not in failed]
    ratios = [r["kernel_us"]["unroll_none"] / r["kernel_us"]["as_shipped"] for r in timed
              if all(r.get("kernel_us", {}).get(v) for v in VARIANTS)]
    summary = {"programs": len(rows), "too_large_for_the_device": sum(not fits(r) for r in rows),
               "slow_builds": len(slow), "failed_builds": len(failed),
               "build_s_sum": {v: round(sum(r["build"][v].get("build_s", 0) for r in rows
                                            if isinstance(r["build"][v], dict)), 1) for v in VARIANTS},
               "kernel_unroll_none_over_as_shipped": {"median": statistics.median(ratios), "min": min(ratios),
                                                      "max": max(ratios)} if ratios else None}
    for r in slow:
        print("slow build:", r["codename"], r["config"], r["build"], flush=True)
    print(json.dumps(summary, indent=1))
    if failed and len(failed) == len(rows):
        sys.exit(f"every build failed, e.g. {failed[0]['codename']}: {next(iter(failed[0]['build'].values()))}")
    if not args.json:
        return
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": device.name, "timeout_s": args.timeout, "size": args.size, "repeat": args.repeat,
                   "summary": summary, "rows": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
