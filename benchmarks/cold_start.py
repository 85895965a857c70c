"""Cold start: seconds from a new Python process to the first prediction of Partial MNIST, beside the floor.

Each sample is a fresh process. In one run, on the device malinn chooses (``MALINN_DEVICE`` is honoured):

* ``warm``: the process imports malinn, loads a converted Partial MNIST model file and predicts one
  sample, with the program-binary cache filled by a previous process; its phases are timed with
  ``time.perf_counter`` markers in the process: importing numpy, importing malinn, the device
  (``malinn.get_device()``: pyopencl, the platforms, the context, the probe), ``load_model``, the
  plan (``model.plan(1)``: kernels chosen, programs from the cache, weights uploaded) and the first
  ``predict``;
* ``cold``: the same with every cache off (MALINN_BINARY_CACHE=0, MALINN_PROBE_CACHE=0,
  PYOPENCL_NO_CACHE=1, POCL_KERNEL_CACHE=0, CUDA_CACHE_DISABLE=1), so every kernel is compiled from
  source and the probe kernel runs;
* ``floor``: plain pyopencl doing what a first prediction cannot avoid, on the same device: import
  numpy and pyopencl, list the platforms and their devices, create a context and a profiling queue,
  create one program from a binary (written by an earlier process: the cache warm), one upload, one
  launch and one blocking download; each part timed the same way;
* ``import_and_probe``: ``import malinn; malinn.get_device()`` alone;
* ``warm_from_source``: as ``warm``, from a copy of the checkout without bytecode and with
  PYTHONDONTWRITEBYTECODE=1, so every process compiles malinn's modules from source (a checkout run
  where bytecode cannot be written; ``pip install`` compiles it once).

Before measuring, malinn's modules are compiled to bytecode (``compileall``, as ``pip install`` does),
so ``warm`` reads them even where PYTHONDONTWRITEBYTECODE is set; numpy and pyopencl are installed
packages and have theirs.

``above_floor_s`` = warm - floor is what malinn adds (the part malinn owns); the target is
warm <= 0.3 s. ``process`` figures are the parent's wall time of the whole child process (the
interpreter's own start included). Medians of --repeat processes each, the kinds interleaved.

Run:  python3 benchmarks/cold_start.py [--repeat 7] [--json out.json]

Real networks (``--networks``): keras.applications models with random weights, saved once by Keras
in a process of its own (``.keras``), and for each, seconds from a new process to its first
prediction of one sample:

* ``cold``: malinn with every cache empty (a new ``MALINN_CACHE_DIR``, ``POCL_CACHE_DIR``,
  ``XDG_CACHE_HOME`` and ``CUDA_CACHE_PATH``): import malinn, load the ``.keras`` file, first
  ``predict``; with the programs it built and the distinct programs it holds;
* ``warm``: the same again in another new process with the caches the cold one filled;
* ``cpu``: the CPU seconds of each such process (every thread, ``time.process_time``) up to its
  first prediction: what the start-up costs whatever else the machine runs;
* the peer's own new process on the same file or network, timed back to back with malinn's:
  TensorFlow-cpu (import, ``keras.models.load_model``, first call) or, with ``--peer torch``
  (the default where torch sees a CUDA GPU), torch (import, the torchvision network built on the
  GPU, first forward, synchronised).

Run:  python3 benchmarks/cold_start.py --networks [MobileNetV2 ResNet50 DenseNet121] [--size 32]
      [--peer auto|tensorflow|torch] [--network-repeat 1] [--json PATH]
(default PATH: benchmarks/results/cold_start_<device>.json)

Steady state (``--kernel-times``): fewer programs must not cost the device time. For each network
(warm caches), the device time of each launch of its plan (OpenCL profiling events, the median of
``--repeat`` passes), summed per kernel (codename), and the median host-to-host ``predict``; with
``--compare-tree DIR`` the same from another checkout of malinn (the code before a change), the two
run in turn in each round so that a busy spell touches both. Writes
benchmarks/results/cold_start_kernels_<device>.json (or --json).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # this checkout's malinn, here and in the children

MALINN_PHASES = ("import_numpy", "import_malinn", "device", "load_model", "plan", "predict")
FLOOR_PHASES = ("import_numpy", "import_pyopencl", "enumerate", "context", "program", "run")

CHILD = """
import time
marks = [time.perf_counter()]
import json, sys
import numpy as np
marks.append(time.perf_counter())
import malinn
marks.append(time.perf_counter())
device = malinn.get_device()
marks.append(time.perf_counter())
model = malinn.load_model(sys.argv[1])
marks.append(time.perf_counter())
model.plan(1)
marks.append(time.perf_counter())
model.predict(np.zeros((1, 640), np.float32))
marks.append(time.perf_counter())
import os
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])],
                  "counters": dict(device.counters), "index": list(device.index), "name": device.name,
                  "platform": device.platform, "driver": device.driver_version, "backend": device.backend,
                  "bytecode": all(os.path.exists(m.__cached__) for name, m in list(sys.modules.items())
                                  if name.startswith("malinn.") and getattr(m, "__cached__", None))}))
"""

FLOOR_SOURCE = (
    "__kernel void twice(__global const float *x, __global float *y) "
    "{ size_t i = get_global_id(0); y[i] = 2.0f * x[i] + 1.0f; }"
)

FLOOR_CHILD = """
import time
marks = [time.perf_counter()]
import json, sys
import numpy as np
marks.append(time.perf_counter())
import pyopencl as cl
marks.append(time.perf_counter())
pi, di, binary_path, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
devices = [p.get_devices() for p in cl.get_platforms()]
device = devices[pi][di]
marks.append(time.perf_counter())
context = cl.Context([device])
queue = cl.CommandQueue(context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
marks.append(time.perf_counter())
try:
    with open(binary_path, "rb") as f:
        program = cl.Program(context, [device], [f.read()]).build()
except FileNotFoundError:   # the preparing run: build from source and keep the binary
    program = cl.Program(context, source).build()
    with open(binary_path, "wb") as f:
        f.write(program.get_info(cl.program_info.BINARIES)[0])
kernel = cl.Kernel(program, "twice")
marks.append(time.perf_counter())
x = np.arange(640, dtype=np.float32)
y = np.empty_like(x)
xb = cl.Buffer(context, cl.mem_flags.READ_WRITE, x.nbytes)
yb = cl.Buffer(context, cl.mem_flags.READ_WRITE, y.nbytes)
kernel.set_args(xb, yb)
cl.enqueue_copy(queue, xb, x, is_blocking=False)
cl.enqueue_nd_range_kernel(queue, kernel, (640,), None)
cl.enqueue_copy(queue, y, yb, is_blocking=True)
marks.append(time.perf_counter())
assert np.array_equal(y, 2 * x + 1), "the floor kernel returned wrong values"
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])]}))
"""

IMPORT_AND_PROBE = (
    "import time; s = time.perf_counter(); import malinn; malinn.get_device(); print(time.perf_counter() - s)"
)


def run_child(args, env, cwd=None) -> tuple:
    """Runs ``python3 args...`` in a fresh process; returns (its last stdout line, wall seconds)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable] + list(args), env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))[:80]} failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1], wall


def median_phases(samples, names) -> dict:
    return {name: float(np.median([s["phases"][i] for s in samples])) for i, name in enumerate(names)}


#: keras.applications name -> torchvision's name of the same network
TORCHVISION = {
    "MobileNetV2": "mobilenet_v2",
    "ResNet50": "resnet50",
    "DenseNet121": "densenet121",
    "EfficientNetB0": "efficientnet_b0",
}

SAVE_NETWORK = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import keras
name, size, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
keras.utils.set_random_seed(0)
model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
model.save(path)
print(model.count_params())
"""

NETWORK_CHILD = """
import time
marks = [time.perf_counter()]
import json, sys
import numpy as np
import malinn
marks.append(time.perf_counter())
device = malinn.get_device()
marks.append(time.perf_counter())
model = malinn.load_model(sys.argv[1])
marks.append(time.perf_counter())
size = int(sys.argv[2])
y = model.predict(np.random.default_rng(0).random((1, size, size, 3), dtype=np.float32))
marks.append(time.perf_counter())
names = {key[0] for key in device.cache.get("kernel_programs", {})}
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])],
                  "cpu": time.process_time(),
                  "builds": device.counters.get("builds", 0), "binary_hits": device.counters.get("binary_hits", 0),
                  "programs": len(device.cache.get("programs", {})), "kernels": len(names),
                  "name": device.name, "platform": device.platform, "driver": device.driver_version,
                  "type": device.type, "finite": bool(np.isfinite(y).all())}))
"""
NETWORK_PHASES = ("import_malinn", "device", "load_model", "first_predict")

TENSORFLOW_CHILD = """
import time
marks = [time.perf_counter()]
import os, json, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import numpy as np
import keras
marks.append(time.perf_counter())
model = keras.models.load_model(sys.argv[1], compile=False)
marks.append(time.perf_counter())
size = int(sys.argv[2])
y = np.asarray(model(np.random.default_rng(0).random((1, size, size, 3), dtype=np.float32), training=False))
marks.append(time.perf_counter())
import tensorflow as tf
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])],
                  "cpu": time.process_time(),
                  "version": tf.__version__, "finite": bool(np.isfinite(y).all())}))
"""
TENSORFLOW_PHASES = ("import", "load_model", "first_predict")

TORCH_CHILD = """
import time
marks = [time.perf_counter()]
import json, sys
import torch, torchvision
marks.append(time.perf_counter())
name, size = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = getattr(torchvision.models, name)(weights=None).eval().cuda()
marks.append(time.perf_counter())
with torch.inference_mode():
    y = model(torch.rand((1, 3, size, size), device="cuda")).cpu()
torch.cuda.synchronize()
marks.append(time.perf_counter())
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])],
                  "cpu": time.process_time(),
                  "version": torch.__version__, "device": torch.cuda.get_device_name(),
                  "finite": bool(torch.isfinite(y).all())}))
"""
TORCH_PHASES = ("import", "build", "first_forward")


KERNEL_TIMES_CHILD = """
import json, sys, time
import numpy as np
import malinn
path, size, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = malinn.load_model(path)
x = np.random.default_rng(0).random((1, size, size, 3), dtype=np.float32)
model.predict(x)
device = malinn.get_device()
plan = model.plan(1)
per_launch, hosts = [], []
for _ in range(repeat):
    with device.lock:
        events = [launch.enqueue() for launch in plan.launches]
        device.finish()
    per_launch.append([(e.profile.end - e.profile.start) * 1e-9 for e in events])
    start = time.perf_counter()
    model.predict(x)
    hosts.append(time.perf_counter() - start)
medians = np.median(np.array(per_launch), axis=0)
families = {}
for launch, seconds in zip(plan.launches, medians):
    families[launch.function] = families.get(launch.function, 0.0) + float(seconds)
print(json.dumps({"device_s": float(medians.sum()), "predict_s": float(np.median(hosts)), "families": families,
                  "launches": len(plan.launches), "programs": len(device.cache.get("programs", {})),
                  "name": device.name, "platform": device.platform, "driver": device.driver_version,
                  "type": device.type}))
"""


def kernel_times(args) -> int:
    """Each network's device time per kernel and host predict time, here and (--compare-tree) there."""
    trees = {"this": ROOT} | ({"compare": Path(args.compare_tree).resolve()} if args.compare_tree else {})
    envs = {
        name: {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        }
        for name, tree in trees.items()
    }
    rows, described = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.networks:
            path = Path(tmp) / f"{name}.keras"
            run_child(["-c", SAVE_NETWORK, name, str(args.size), str(path)], os.environ)
            samples = {tree: [] for tree in trees}
            for round_ in range(args.network_repeat):
                for tree in list(trees) if round_ % 2 == 0 else list(trees)[::-1]:
                    env = {**envs[tree], "MALINN_CACHE_DIR": os.path.join(tmp, f"cache_{tree}")}
                    samples[tree].append(
                        json.loads(
                            run_child(
                                ["-c", KERNEL_TIMES_CHILD, str(path), str(args.size), str(args.repeat)], env, cwd=tmp
                            )[0]
                        )
                    )
            described = described or samples["this"][0]
            row = {"network": name, "size": args.size}
            for tree, runs in samples.items():
                families = sorted({f for r in runs for f in r["families"]})
                row[tree] = {
                    "device_s": float(np.median([r["device_s"] for r in runs])),
                    "predict_s": float(np.median([r["predict_s"] for r in runs])),
                    "programs": runs[-1]["programs"],
                    "launches": runs[-1]["launches"],
                    "families": {f: float(np.median([r["families"].get(f, 0.0) for r in runs])) for f in families},
                }
            rows.append(row)
            line = ", ".join(
                f"{tree}: device {row[tree]['device_s'] * 1e3:.2f} ms, predict "
                f"{row[tree]['predict_s'] * 1e3:.2f} ms, {row[tree]['programs']} programs"
                for tree in trees
            )
            print(f"{name} {args.size}x{args.size}: {line}", flush=True)
            if "compare" in trees:
                for family in sorted(set(row["this"]["families"]) | set(row["compare"]["families"])):
                    here, there = row["this"]["families"].get(family, 0.0), row["compare"]["families"].get(family, 0.0)
                    print(
                        f"    {family:24s} {here * 1e3:8.3f} ms  (there {there * 1e3:8.3f} ms, "
                        f"{here / there if there else float('nan'):.2f}x)"
                    )
    result = {
        "device": {key: described[key] for key in ("name", "platform", "driver", "type")},
        "rows": rows,
        "repeat": args.repeat,
        "rounds": args.network_repeat,
        "compare_tree": str(trees.get("compare", "")),
        "command": " ".join(sys.argv),
    }
    out = (
        Path(args.json)
        if args.json
        else (ROOT / "benchmarks" / "results" / f"cold_start_kernels_{device_slug(described)}.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")
    return 0


def device_slug(child: dict) -> str:
    """``pocl_cpu`` for PoCL's CPU device, else the device's name in lower case (``nvidia_h200``)."""
    if "Portable Computing Language" in child["platform"]:
        return f"pocl_{child['type'].lower()}"
    return "_".join("".join(c if c.isalnum() else " " for c in child["name"].lower()).split())


def choose_peer(peer: str) -> str:
    """``torch`` where asked, or (``auto``) where torch and torchvision are installed and see a CUDA
    GPU; else ``tensorflow``."""
    if peer != "auto":
        return peer
    probe = "import torch, torchvision; print(torch.cuda.is_available())"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return "tensorflow"
    return "torch" if out.returncode == 0 and out.stdout.strip().endswith("True") else "tensorflow"


def fresh_caches(folder: Path, base_env: dict) -> dict:
    """An environment whose caches (malinn's, PoCL's, pyopencl's and everything under XDG's cache
    folder, CUDA's) are new empty folders under ``folder``."""
    for name in ("malinn", "pocl", "xdg", "cuda"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in base_env.items()
        if k not in ("MALINN_BINARY_CACHE", "PYOPENCL_NO_CACHE", "POCL_KERNEL_CACHE", "CUDA_CACHE_DISABLE")
    }
    return {
        **env,
        "MALINN_CACHE_DIR": str(folder / "malinn"),
        "POCL_CACHE_DIR": str(folder / "pocl"),
        "XDG_CACHE_HOME": str(folder / "xdg"),
        "CUDA_CACHE_PATH": str(folder / "cuda"),
    }


def saved_network(args, name: str, folder: Path, env: dict) -> Path:
    """``name`` at ``args.size`` saved by Keras in a child process into ``folder``, or ``--models``'s
    ``<name>.keras`` where given (a machine without TensorFlow; the file must be of that size)."""
    if args.models is not None and (Path(args.models) / f"{name}.keras").exists():
        return Path(args.models) / f"{name}.keras"
    path = folder / f"{name}.keras"
    run_child(["-c", SAVE_NETWORK, name, str(args.size), str(path)], env)
    return path


def networks(args) -> int:
    """The real networks' cold and warm first predictions beside the peer's new process."""
    peer = choose_peer(args.peer)
    python_path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    base_env = {**os.environ, "PYTHONPATH": python_path}
    for package in ("malinn", "converters"):  # what pip install does: bytecode once
        compileall.compile_dir(str(ROOT / package), quiet=1)
    rows, described = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.networks:
            path = saved_network(args, name, Path(tmp), base_env)
            cold, warm, theirs = [], [], []
            for round_ in range(args.network_repeat):  # malinn and the peer back to back, each round
                env = fresh_caches(Path(tmp) / f"caches_{name}_{round_}", base_env)
                cold.append(json.loads(run_child(["-c", NETWORK_CHILD, str(path), str(args.size)], env)[0]))
                warm.append(json.loads(run_child(["-c", NETWORK_CHILD, str(path), str(args.size)], env)[0]))
                peer_env = fresh_caches(Path(tmp) / f"peer_{name}_{round_}", base_env)
                if peer == "torch":
                    theirs.append(
                        json.loads(run_child(["-c", TORCH_CHILD, TORCHVISION[name], str(args.size)], peer_env)[0])
                    )
                else:
                    theirs.append(
                        json.loads(run_child(["-c", TENSORFLOW_CHILD, str(path), str(args.size)], peer_env)[0])
                    )
            described = described or cold[0]
            peer_phases = TORCH_PHASES if peer == "torch" else TENSORFLOW_PHASES
            row = {
                "network": name,
                "size": args.size,
                "cold_s": float(np.median([c["total"] for c in cold])),
                "warm_s": float(np.median([w["total"] for w in warm])),
                "peer_s": float(np.median([t["total"] for t in theirs])),
                "cold_cpu_s": float(np.median([c["cpu"] for c in cold])),
                "warm_cpu_s": float(np.median([w["cpu"] for w in warm])),
                "peer_cpu_s": float(np.median([t["cpu"] for t in theirs])),
                "cold_phases": median_phases(cold, NETWORK_PHASES),
                "warm_phases": median_phases(warm, NETWORK_PHASES),
                "peer_phases": median_phases(theirs, peer_phases),
                "programs_built": cold[-1]["builds"],
                "programs": cold[-1]["programs"],
                "kernels": cold[-1]["kernels"],
                "warm_builds": warm[-1]["builds"],
                "warm_binary_hits": warm[-1]["binary_hits"],
                "cold_samples_s": [c["total"] for c in cold],
                "warm_samples_s": [w["total"] for w in warm],
                "peer_samples_s": [t["total"] for t in theirs],
                "finite": all(c["finite"] for c in cold + warm + theirs),
            }
            row["cold_over_peer"] = row["cold_s"] / row["peer_s"]
            row["warm_over_peer"] = row["warm_s"] / row["peer_s"]
            rows.append(row)
            print(
                f"{name} {args.size}x{args.size}: malinn cold {row['cold_s']:.2f} s ({row['programs_built']} "
                f"programs built, {row['kernels']} kernels), warm {row['warm_s']:.2f} s "
                f"({row['warm_builds']} built, {row['warm_binary_hits']} loaded); {peer} {row['peer_s']:.2f} s; "
                f"cold / {peer} {row['cold_over_peer']:.2f}, warm / {peer} {row['warm_over_peer']:.2f}; "
                f"CPU seconds (all threads, to the first prediction): cold {row['cold_cpu_s']:.2f}, "
                f"warm {row['warm_cpu_s']:.2f}, {peer} {row['peer_cpu_s']:.2f}",
                flush=True,
            )
    total = {
        key: sum(r[key] for r in rows)
        for key in ("cold_s", "warm_s", "peer_s", "cold_cpu_s", "warm_cpu_s", "peer_cpu_s")
    }
    result = {
        "device": {key: described[key] for key in ("name", "platform", "driver", "type")},
        "peer": peer,
        "peer_version": theirs[-1]["version"],
        "size": args.size,
        "repeat": args.network_repeat,
        "rows": rows,
        "sum": total,
        "cold_over_peer": total["cold_s"] / total["peer_s"],
        "warm_over_peer": total["warm_s"] / total["peer_s"],
        "command": " ".join(sys.argv),
    }
    print(
        f"summed over {len(rows)} networks: malinn cold {total['cold_s']:.2f} s, warm {total['warm_s']:.2f} s, "
        f"{peer} {total['peer_s']:.2f} s (cold {result['cold_over_peer']:.2f}x, warm {result['warm_over_peer']:.2f}x); "
        f"CPU seconds: cold {total['cold_cpu_s']:.2f}, warm {total['warm_cpu_s']:.2f}, {peer} {total['peer_cpu_s']:.2f}"
    )
    out = (
        Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"cold_start_{device_slug(described)}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=7,
        help="new processes per measurement, the kinds interleaved; the median counts (default: 7)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results, as JSON, to PATH (benchmarks/report.py reads them)"
    )
    parser.add_argument(
        "--networks",
        nargs="*",
        metavar="NAME",
        help="time keras.applications networks instead (default: MobileNetV2 ResNet50 DenseNet121)",
    )
    parser.add_argument(
        "--models",
        metavar="DIR",
        help="with --networks: saved keras.applications files "
        "<name>.keras of --size (default: saved here by Keras in a child process)",
    )
    parser.add_argument("--size", type=int, default=32, help="the networks' input height and width (default: 32)")
    parser.add_argument(
        "--peer",
        choices=("auto", "tensorflow", "torch"),
        default="auto",
        help="the networks' peer: torch where it sees a CUDA GPU (auto), else TensorFlow-cpu",
    )
    parser.add_argument(
        "--network-repeat",
        type=int,
        default=1,
        help="rounds of cold, warm and peer processes per network; the median counts (default: 1)",
    )
    parser.add_argument(
        "--kernel-times",
        action="store_true",
        help="the networks' device time per kernel and predict time, warm (not cold start)",
    )
    parser.add_argument(
        "--compare-tree",
        metavar="DIR",
        help="with --kernel-times: also time malinn from this checkout, in turn with this one",
    )
    args = parser.parse_args(argv)
    if args.kernel_times:
        args.networks = args.networks or ["MobileNetV2", "ResNet50", "DenseNet121"]
        return kernel_times(args)
    if args.networks is not None:
        args.networks = args.networks or ["MobileNetV2", "ResNet50", "DenseNet121"]
        return networks(args)
    from models import MODELS, build

    for package in ("malinn", "converters"):  # what pip install does: bytecode once
        compileall.compile_dir(str(ROOT / package), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = build(MODELS["Partial MNIST"]).save(Path(tmp) / "partial_mnist.malinn")
        python_path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        warm_env = {**os.environ, "MALINN_CACHE_DIR": os.path.join(tmp, "cache"), "PYTHONPATH": python_path}
        cold_env = {
            **warm_env,
            "MALINN_BINARY_CACHE": "0",
            "PYOPENCL_NO_CACHE": "1",
            "POCL_KERNEL_CACHE": "0",
            "CUDA_CACHE_DISABLE": "1",
            "MALINN_PROBE_CACHE": "0",
        }
        source = Path(tmp) / "source"
        for package in ("malinn", "converters", "kernels"):
            shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        source_env = {
            **warm_env,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": os.pathsep.join([str(source)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        }
        first = json.loads(run_child(["-c", CHILD, str(path)], warm_env)[0])  # fills the binary cache
        floor_args = [
            "-c",
            FLOOR_CHILD,
            str(first["index"][0]),
            str(first["index"][1]),
            os.path.join(tmp, "floor.bin"),
            FLOOR_SOURCE,
        ]
        with_floor = first["backend"] == "opencl"
        if with_floor:
            run_child(floor_args, warm_env)  # builds the floor program and writes its binary
        warm, floor, from_source, cold, import_only = [], [], [], [], []
        for _ in range(args.repeat):  # the kinds interleaved, so that a busy spell touches them all
            warm.append(run_child(["-c", CHILD, str(path)], warm_env))
            if with_floor:
                floor.append(run_child(floor_args, warm_env))
            from_source.append(json.loads(run_child(["-c", CHILD, str(path)], source_env, cwd=tmp)[0]))
            import_only.append(float(run_child(["-c", IMPORT_AND_PROBE], warm_env)[0]))
            cold.append(json.loads(run_child(["-c", CHILD, str(path)], cold_env)[0]))
        warm_samples = [json.loads(line) for line, _ in warm]
    floor_samples = [json.loads(line) for line, _ in floor]
    result = {
        "warm_s": float(np.median([s["total"] for s in warm_samples])),
        "cold_s": float(np.median([s["total"] for s in cold])),
        "import_and_probe_s": float(np.median(import_only)),
        "repeat": args.repeat,
        "device": {
            "name": first["name"],
            "platform": first["platform"],
            "driver": first["driver"],
            "backend": first["backend"],
        },
        "warm_phases": median_phases(warm_samples, MALINN_PHASES),
        "cold_phases": median_phases(cold, MALINN_PHASES),
        "warm_counters": warm_samples[-1]["counters"],
        "warm_bytecode": all(s["bytecode"] for s in warm_samples),
        "warm_from_source_s": float(np.median([s["total"] for s in from_source])),
        "warm_from_source_phases": median_phases(from_source, MALINN_PHASES),
        "warm_process_s": float(np.median([wall for _, wall in warm])),
    }
    if floor_samples:
        result.update(
            {
                "floor_s": float(np.median([s["total"] for s in floor_samples])),
                "floor_phases": median_phases(floor_samples, FLOOR_PHASES),
                "floor_process_s": float(np.median([wall for _, wall in floor])),
            }
        )
        result["above_floor_s"] = result["warm_s"] - result["floor_s"]
    print(f"device: {first['name']} ({first['platform']}, driver {first['driver']})")
    print(
        f"first prediction of Partial MNIST in a new process: warm binary cache {result['warm_s']:.3f} s, "
        f"no caches {result['cold_s']:.3f} s (import + device probe alone {result['import_and_probe_s']:.3f} s)"
    )
    print(
        "  malinn, warm: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in result["warm_phases"].items())
        + f"; builds {result['warm_counters'].get('builds')}, binary hits {result['warm_counters'].get('binary_hits')}"
    )
    if not result["warm_bytecode"]:
        print("  (malinn's bytecode could not be written here: the warm runs compiled its modules from source)")
    print(
        f"  malinn compiled from source in every process (no bytecode): {result['warm_from_source_s']:.3f} s, "
        f"import malinn {result['warm_from_source_phases']['import_malinn'] * 1e3:.1f} ms"
    )
    if floor_samples:
        print(
            f"plain pyopencl floor {result['floor_s']:.3f} s: "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in result["floor_phases"].items())
        )
        print(
            f"malinn above the floor: {result['above_floor_s']:.3f} s (warm {result['warm_s']:.3f} s "
            f"- floor {result['floor_s']:.3f} s); whole processes: malinn {result['warm_process_s']:.3f} s, "
            f"floor {result['floor_process_s']:.3f} s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
