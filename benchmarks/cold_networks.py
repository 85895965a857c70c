"""Cold start of real networks: keras.applications models' first prediction from a new process, with
empty caches and warm ones, beside a peer's new process; and their kernels' steady-state times.
``benchmarks/cold_start.py --networks`` and ``--kernel-times`` run these.

Real networks (``--networks``): keras.applications models with random weights, saved once by Keras
in a process of its own (``.keras``), and for each, seconds from a new process to its first
prediction of one sample:

* ``cold``: malinn with every cache empty (a new ``MALINN_CACHE_DIR``, ``POCL_CACHE_DIR``,
  ``XDG_CACHE_HOME`` and ``CUDA_CACHE_PATH``): import malinn, load the ``.keras`` file, first
  ``predict``; with the programs it built and the distinct programs it holds, its plan's launches
  and their distinct (program, kernel, work-group shape) triples (a launch whose shape the driver
  chooses counted by its range: PoCL picks a shape per range), and on PoCL the work-group functions
  it compiled into its empty kernel cache (``specialised``: one per local size a kernel was launched
  with; ``generic``: one per kernel of each program, compiled when malinn reads the binary);
* ``warm``: the same again in another new process with the caches the cold one filled;
* ``cpu``: the CPU seconds of each such process (every thread, ``time.process_time``) up to its
  first prediction: what the start-up costs whatever else the machine runs;
* the peer's own new process on the same file or network, timed back to back with malinn's:
  TensorFlow-cpu (import, ``keras.models.load_model``, first call) or, with ``--peer torch``
  (the default where torch sees a CUDA GPU), torch (import, the torchvision network built on the
  GPU, first forward, synchronised).

Each sample keeps the 1-minute load average when it started (``cold_load``, ``warm_load``,
``peer_load``): on a shared machine compare figures of one run. With ``--compare-tree DIR`` another
checkout's malinn (the code before a change) runs its own cold and warm processes in each round, in
turn with this one's (the order alternating), beside the same peer process (``compare`` in each
row, ``compare_sum``).

Run:  python3 benchmarks/cold_start.py --networks [MobileNetV2 ResNet50 DenseNet121] [--size 32]
      [--peer auto|tensorflow|torch] [--network-repeat 1] [--compare-tree DIR] [--json PATH]
(default PATH: benchmarks/results/cold_start_<device>.json)

Steady state (``--kernel-times``): fewer programs must not cost the device time. For each network
(warm caches: a first process per checkout fills them, untimed), the device time of each launch of its plan (OpenCL profiling events, the median of
``--repeat`` passes), summed per kernel (codename), and the median host-to-host ``predict``; with
``--compare-tree DIR`` the same from another checkout of malinn (the code before a change), the two
run in turn in each round so that a busy spell touches both. Where the library bounds some kernels'
work-group shapes (``workgroup_bound``), ``pass_s`` times whole passes (every launch enqueued, then
a finish) host to host in one process, those launches in their bound shapes (``bound``) and in the
driver's own (``driver``, ``NULL``) in turn: a comparison that a busy machine touches evenly. Writes
benchmarks/results/cold_start_kernels_<device>.json (or --json).
"""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


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

#: the child's function that counts a plan's distinct (program, kernel, work-group shape) triples, a
#: launch left to the driver counted by its range (PoCL chooses a shape per range); PoCL on a CPU
#: compiles a kernel once per shape it is launched with
LAUNCH_SHAPES = """
def launch_shapes(launches):
    def program(launch):
        try:
            import pyopencl as cl
            return launch.handle.get_info(cl.kernel_info.PROGRAM).int_ptr
        except Exception:  # another backend's launch
            return launch.function
    return len({(program(l), l.function, l.local_size or ("driver",) + tuple(l.global_size)) for l in launches})
"""

NETWORK_CHILD = (
    """
import time
marks = [time.perf_counter()]
"""
    + LAUNCH_SHAPES
    + """
import json, os, sys
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
cpu = time.process_time()
worker_cpu = 0.0  # the build workers' CPU seconds up to here (PoCL: malinn/backends/opencl_build_workers.py)
for process in (device.workers.processes if getattr(device, "workers", None) is not None else []):
    try:
        with open(f"/proc/{process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        worker_cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
names = {key[0] for key in device.cache.get("kernel_programs", {})}
launches = model.plan(1).launches
print(json.dumps({"total": marks[-1] - marks[0], "phases": [b - a for a, b in zip(marks, marks[1:])],
                  "cpu": cpu, "worker_cpu": worker_cpu, "launches": len(launches), "launch_shapes": launch_shapes(launches),
                  "builds": device.counters.get("builds", 0), "binary_hits": device.counters.get("binary_hits", 0),
                  "programs": len(device.cache.get("programs", {})), "kernels": len(names),
                  "name": device.name, "platform": device.platform, "driver": device.driver_version,
                  "type": device.type, "finite": bool(np.isfinite(y).all())}))
"""
)
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


KERNEL_TIMES_CHILD = (
    LAUNCH_SHAPES
    + """
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
# the same passes with the driver's own work-group shape for the launches a library bound shapes
# (workgroup_bound), in turn with the bound shapes, in this process: what the bounds cost host to host
passes = {}
from malinn.library.kernel_library import load_library
library = load_library()
bounded = [getattr(library[l.function], "workgroup_bound", lambda d: None)(device) is not None for l in plan.launches]
if device.backend == "opencl" and any(bounded):
    import pyopencl as cl
    shapes = {"bound": [l.local_size for l in plan.launches],
              "driver": [None if b else l.local_size for l, b in zip(plan.launches, bounded)]}
    passes = {name: [] for name in shapes}
    for i in range(4 * repeat + 4):
        for name in (list(shapes) if i % 2 == 0 else list(shapes)[::-1]):
            with device.lock:
                start = time.perf_counter()
                for launch, local in zip(plan.launches, shapes[name]):
                    cl.enqueue_nd_range_kernel(device.queue, launch.handle, launch.global_size, local)
                device.finish()
                if i >= 4:  # the first passes compile the driver's shapes
                    passes[name].append(time.perf_counter() - start)
    passes = {name: float(np.median(times)) for name, times in passes.items()}
families = {}
for launch, seconds in zip(plan.launches, medians):
    families[launch.function] = families.get(launch.function, 0.0) + float(seconds)
print(json.dumps({"device_s": float(medians.sum()), "predict_s": float(np.median(hosts)), "families": families,
                  "pass_s": passes, "bounded_launches": sum(bounded),
                  "launches": len(plan.launches), "launch_shapes": launch_shapes(plan.launches),
                  "programs": len(device.cache.get("programs", {})),
                  "name": device.name, "platform": device.platform, "driver": device.driver_version,
                  "type": device.type}))
"""
)


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
            for tree in trees:  # fills each tree's caches first: every timed round is warm, none shares
                env = {**envs[tree], "MALINN_CACHE_DIR": os.path.join(tmp, f"cache_{tree}")}  # the CPU
                run_child(["-c", KERNEL_TIMES_CHILD, str(path), str(args.size), "1"], env, cwd=tmp)  # with stores
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
                    "launch_shapes": runs[-1]["launch_shapes"],
                    "bounded_launches": runs[-1].get("bounded_launches", 0),
                    "pass_s": {
                        name: float(np.median([r["pass_s"][name] for r in runs if r.get("pass_s")]))
                        for name in (runs[-1].get("pass_s") or {})
                    },
                    "families": {f: float(np.median([r["families"].get(f, 0.0) for r in runs])) for f in families},
                }
            rows.append(row)
            line = ", ".join(
                f"{tree}: device {row[tree]['device_s'] * 1e3:.2f} ms, predict "
                f"{row[tree]['predict_s'] * 1e3:.2f} ms, {row[tree]['programs']} programs, "
                f"{row[tree]['launches']} launches in {row[tree]['launch_shapes']} work-group shapes"
                for tree in trees
            )
            print(f"{name} {args.size}x{args.size}: {line}", flush=True)
            for tree in trees:
                passes = row[tree]["pass_s"]
                if passes:
                    print(
                        f"    {tree}: a pass host to host in one process, the {row[tree]['bounded_launches']} launches "
                        f"of bounded kernels in their bound shapes {passes['bound'] * 1e3:.2f} ms, in the driver's "
                        f"{passes['driver'] * 1e3:.2f} ms ({passes['bound'] / passes['driver']:.2f}x)"
                    )
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


def pocl_work_group_functions(folder: Path) -> dict:
    """The work-group functions PoCL compiled into its kernel cache ``folder`` (``<program>/<kernel>/
    <local size>...``): ``specialised`` for one local size each (compiled at the first launch in that
    shape), ``generic`` (``0-0-0``: any size, compiled when the program's binary is read)."""
    found = [p for p in folder.glob("*/*/*/*") if p.is_dir()]
    generic = sum(p.name == "0-0-0" for p in found)
    return {"specialised": len(found) - generic, "generic": generic}


def malinn_sample(path: Path, args, env: dict) -> dict:
    """One malinn process's first prediction, with the 1-minute load average when it started and,
    on PoCL, the work-group functions in its kernel cache after it."""
    load = os.getloadavg()[0]
    cwd = Path(env["MALINN_CACHE_DIR"]).parent  # its caches' folder: ``python -c`` puts the cwd first on sys.path
    sample = json.loads(run_child(["-c", NETWORK_CHILD, str(path), str(args.size)], env, cwd=cwd)[0])
    sample["load"] = load
    if "Portable Computing Language" in sample["platform"]:
        sample["pocl_work_group_functions"] = pocl_work_group_functions(Path(env["POCL_CACHE_DIR"]))
    return sample


def malinn_figures(cold: list, warm: list) -> dict:
    """A tree's medians of cold and warm samples and what its cold processes built."""
    figures = {
        "cold_s": float(np.median([c["total"] for c in cold])),
        "warm_s": float(np.median([w["total"] for w in warm])),
        "cold_cpu_s": float(np.median([c["cpu"] for c in cold])),
        "cold_worker_cpu_s": float(np.median([c.get("worker_cpu", 0.0) for c in cold])),
        "warm_cpu_s": float(np.median([w["cpu"] for w in warm])),
        "cold_phases": median_phases(cold, NETWORK_PHASES),
        "warm_phases": median_phases(warm, NETWORK_PHASES),
        "programs_built": cold[-1]["builds"],
        "programs": cold[-1]["programs"],
        "kernels": cold[-1]["kernels"],
        "launches": cold[-1]["launches"],
        "launch_shapes": cold[-1]["launch_shapes"],
        "warm_builds": warm[-1]["builds"],
        "warm_binary_hits": warm[-1]["binary_hits"],
        "cold_samples_s": [c["total"] for c in cold],
        "warm_samples_s": [w["total"] for w in warm],
        "cold_load": [c["load"] for c in cold],
        "warm_load": [w["load"] for w in warm],
    }
    if "pocl_work_group_functions" in cold[-1]:
        figures["pocl_work_group_functions"] = cold[-1]["pocl_work_group_functions"]
    return figures


def networks(args) -> int:
    """The real networks' cold and warm first predictions beside the peer's new process (and, with
    ``--compare-tree``, another checkout's, in turn with this one's in each round)."""
    peer = choose_peer(args.peer)
    trees = {"this": ROOT} | ({"compare": Path(args.compare_tree).resolve()} if args.compare_tree else {})
    envs = {
        name: {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        }
        for name, tree in trees.items()
    }
    for tree in trees.values():
        for package in ("malinn", "converters"):  # what pip install does: bytecode once
            compileall.compile_dir(str(tree / package), quiet=1)
    rows, described = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.networks:
            path = saved_network(args, name, Path(tmp), envs["this"])
            cold, warm, theirs, peer_load = {t: [] for t in trees}, {t: [] for t in trees}, [], []
            for round_ in range(args.network_repeat):  # malinn and the peer back to back, each round
                for tree in list(trees) if round_ % 2 == 0 else list(trees)[::-1]:
                    env = fresh_caches(Path(tmp) / f"caches_{name}_{tree}_{round_}", envs[tree])
                    cold[tree].append(malinn_sample(path, args, env))
                    warm[tree].append(malinn_sample(path, args, env))
                    described = described or cold[tree][-1]
                peer_env = fresh_caches(Path(tmp) / f"peer_{name}_{round_}", envs["this"])
                peer_load.append(os.getloadavg()[0])
                if peer == "torch":
                    theirs.append(
                        json.loads(run_child(["-c", TORCH_CHILD, TORCHVISION[name], str(args.size)], peer_env)[0])
                    )
                else:
                    theirs.append(
                        json.loads(run_child(["-c", TENSORFLOW_CHILD, str(path), str(args.size)], peer_env)[0])
                    )
            peer_phases = TORCH_PHASES if peer == "torch" else TENSORFLOW_PHASES
            row = {"network": name, "size": args.size, **malinn_figures(cold["this"], warm["this"])}
            row.update(
                {
                    "peer_s": float(np.median([t["total"] for t in theirs])),
                    "peer_cpu_s": float(np.median([t["cpu"] for t in theirs])),
                    "peer_phases": median_phases(theirs, peer_phases),
                    "peer_samples_s": [t["total"] for t in theirs],
                    "peer_load": peer_load,
                    "finite": all(c["finite"] for t in trees for c in cold[t] + warm[t])
                    and all(t["finite"] for t in theirs),
                }
            )
            row["cold_over_peer"] = row["cold_s"] / row["peer_s"]
            row["warm_over_peer"] = row["warm_s"] / row["peer_s"]
            if "compare" in trees:
                row["compare"] = malinn_figures(cold["compare"], warm["compare"])
                row["compare"]["cold_over_peer"] = row["compare"]["cold_s"] / row["peer_s"]
            rows.append(row)
            for tree in trees:
                figures = row if tree == "this" else row["compare"]
                wg = figures.get("pocl_work_group_functions")
                print(
                    f"{name} {args.size}x{args.size}{'' if tree == 'this' else ' (compare tree)'}: malinn cold "
                    f"{figures['cold_s']:.2f} s ({figures['programs_built']} programs built, {figures['launches']} "
                    f"launches in {figures['launch_shapes']} (program, kernel, work-group shape)"
                    + (
                        f", PoCL compiled {wg['specialised']} + {wg['generic']} generic work-group functions"
                        if wg
                        else ""
                    )
                    + f"), warm {figures['warm_s']:.2f} s ({figures['warm_builds']} built, "
                    f"{figures['warm_binary_hits']} loaded); {peer} {row['peer_s']:.2f} s; cold / {peer} "
                    f"{figures['cold_s'] / row['peer_s']:.2f}, warm / {peer} {figures['warm_s'] / row['peer_s']:.2f}; "
                    f"CPU seconds (all threads, to the first prediction): cold {figures['cold_cpu_s']:.2f} "
                    f"(+ {figures['cold_worker_cpu_s']:.2f} in build workers), "
                    f"warm {figures['warm_cpu_s']:.2f}, {peer} {row['peer_cpu_s']:.2f}; 1-minute load "
                    f"{max(figures['cold_load'] + figures['warm_load'] + peer_load):.1f} at most",
                    flush=True,
                )
    keys = ("cold_s", "warm_s", "cold_cpu_s", "cold_worker_cpu_s", "warm_cpu_s")
    total = {key: sum(r[key] for r in rows) for key in keys + ("peer_s", "peer_cpu_s")}
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
    lines = [("", total)]
    if "compare" in trees:
        result["compare_tree"] = str(trees["compare"])
        result["compare_sum"] = {key: sum(r["compare"][key] for r in rows) for key in keys}
        result["compare_cold_over_peer"] = result["compare_sum"]["cold_s"] / total["peer_s"]
        lines.append((" (compare tree)", result["compare_sum"]))
    for label, figures in lines:
        print(
            f"summed over {len(rows)} networks{label}: malinn cold {figures['cold_s']:.2f} s, warm "
            f"{figures['warm_s']:.2f} s, {peer} {total['peer_s']:.2f} s (cold {figures['cold_s'] / total['peer_s']:.2f}x, "
            f"warm {figures['warm_s'] / total['peer_s']:.2f}x); CPU seconds: cold {figures['cold_cpu_s']:.2f} "
            f"(+ {figures['cold_worker_cpu_s']:.2f} in build workers), "
            f"warm {figures['warm_cpu_s']:.2f}, {peer} {total['peer_cpu_s']:.2f}"
        )
    out = (
        Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"cold_start_{device_slug(described)}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")
    return 0
