"""Where a cold start's compile time goes on PoCL: each program's build from source and each
kernel's work-group function specialised for a launch shape, timed one at a time in a new process
with empty caches, summed per kernel family.

For each network (keras.applications, random weights, saved by Keras in a process of its own, or
``--models DIR``'s ``<name>.keras``), one new process with a new empty ``MALINN_CACHE_DIR`` and
``POCL_CACHE_DIR``, no build workers (``MALINN_BUILD_WORKERS=0``), one build at a time
(``MALINN_BUILD_THREADS=1``) and no binary stores (``MALINN_BINARY_CACHE=0``: storing a binary
makes PoCL compile generic work-group functions too, which the workers do off the first
prediction's path):

* ``build``: the seconds of each program's build from source (``clBuildProgram``: PoCL's front
  end, its optimiser and its kernel cache's ``program.bc``), by the origin the library gives it;
* ``specialise``: each of the plan's launches run one at a time, once cold (the first launch of a
  (program, kernel, shape) makes PoCL compile its work-group function for that shape) and again
  warm; the difference is that compile, summed per kernel codename.

Writes benchmarks/results/cold_compiles_<device>.json (or --json).

Run:  python3 benchmarks/cold_compiles.py [MobileNetV2 ResNet50 DenseNet121] [--size 32] [--models DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from cold_networks import SAVE_NETWORK, device_slug, fresh_caches, run_child  # noqa: E402

CHILD = """
import json, sys, time
from collections import defaultdict
import numpy as np
import malinn
from malinn.backends.opencl import OpenCLDevice

builds = []
original = OpenCLDevice._build_from_source
def timed(self, source, options, origin):
    start = time.perf_counter()
    try:
        return original(self, source, options, origin)
    finally:
        builds.append({"origin": origin, "options": [o for o in options if o.startswith("-D")][:12],
                       "s": time.perf_counter() - start, "lines": source.count(chr(10))})
OpenCLDevice._build_from_source = timed

start = time.perf_counter()
device = malinn.get_device()
device_s = time.perf_counter() - start
model = malinn.load_model(sys.argv[1])
size = int(sys.argv[2])
plan = model.plan(1)
device.wait_for_builds()
launches = plan.launches
def run_each():
    times = []
    for launch in launches:
        s = time.perf_counter()
        launch()
        device.queue.finish()
        times.append(time.perf_counter() - s)
    return times
cold = run_each()
warm = [min(a, b) for a, b in zip(run_each(), run_each())]
specialise = defaultdict(float)
shapes = defaultdict(set)
for launch, c, w in zip(launches, cold, warm):
    specialise[launch.function] += max(c - w, 0.0)
    shapes[launch.function].add(tuple(launch.local_size or ("driver",) + tuple(launch.global_size)))
print(json.dumps({"device_s": device_s, "builds": builds, "specialise": dict(specialise),
                  "shapes": {k: len(v) for k, v in shapes.items()},
                  "name": device.name, "platform": device.platform, "driver": device.driver_version,
                  "type": device.type}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("networks", nargs="*", default=["MobileNetV2", "ResNet50", "DenseNet121"])
    parser.add_argument("--size", type=int, default=32, help="the networks' input height and width (default: 32)")
    parser.add_argument("--models", metavar="DIR", help="saved keras.applications files <name>.keras of --size")
    parser.add_argument("--json", metavar="PATH", help="where to write the results")
    args = parser.parse_args(argv)
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    }
    rows, described = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.networks:
            path = Path(args.models or tmp) / f"{name}.keras"
            if not path.exists():
                run_child(["-c", SAVE_NETWORK, name, str(args.size), str(path)], base)
            env = {
                **fresh_caches(Path(tmp) / f"caches_{name}", base),
                "MALINN_BUILD_WORKERS": "0",
                "MALINN_BUILD_THREADS": "1",
                "MALINN_BINARY_CACHE": "0",
            }
            load = os.getloadavg()[0]
            sample = json.loads(run_child(["-c", CHILD, str(path), str(args.size)], env, cwd=tmp)[0])
            described = described or sample
            by_origin: dict = {}
            for build in sample["builds"]:
                entry = by_origin.setdefault(build["origin"], {"programs": 0, "s": 0.0})
                entry["programs"] += 1
                entry["s"] += build["s"]
            row = {
                "network": name,
                "load": load,
                "device_s": sample["device_s"],
                "build_s": sum(b["s"] for b in sample["builds"]),
                "specialise_s": sum(sample["specialise"].values()),
                "builds": sample["builds"],
                "build_by_origin": by_origin,
                "specialise": sample["specialise"],
                "shapes": sample["shapes"],
            }
            rows.append(row)
            print(
                f"{name}: device open {row['device_s']:.2f} s, {len(sample['builds'])} programs built in "
                f"{row['build_s']:.2f} s, work-group functions specialised in {row['specialise_s']:.2f} s "
                f"(1-minute load {load:.1f})"
            )
            for origin, entry in sorted(by_origin.items(), key=lambda kv: -kv[1]["s"]):
                print(f"    build  {entry['s']:7.2f} s  {entry['programs']:3d} programs  {origin[:90]}")
            for function, seconds in sorted(sample["specialise"].items(), key=lambda kv: -kv[1]):
                print(f"    shapes {seconds:7.2f} s  {sample['shapes'][function]:3d} shapes    {function}")
    out = (
        Path(args.json)
        if args.json
        else ROOT / "benchmarks" / "results" / f"cold_compiles_{device_slug(described)}.json"
    )
    out.write_text(json.dumps({"rows": rows, "size": args.size, "command": " ".join(sys.argv)}, indent=2) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
