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

Real networks (``--networks``: cold and warm first predictions of keras.applications models beside
TensorFlow's or torch's new process, the programs, launches and work-group shapes each needs) and
their kernels' steady state (``--kernel-times``), each beside another checkout with
``--compare-tree DIR``: benchmarks/cold_networks.py says what each measures.

Run:  python3 benchmarks/cold_start.py --networks [MobileNetV2 ResNet50 DenseNet121] [--size 32]
      [--peer auto|tensorflow|torch] [--network-repeat 1] [--compare-tree DIR] [--json PATH]
      python3 benchmarks/cold_start.py --kernel-times [--compare-tree DIR] [--repeat 20]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # this checkout's malinn, here and in the children

from cold_networks import kernel_times, median_phases, networks, run_child  # noqa: E402

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
        help="with --kernel-times or --networks: also time malinn from this checkout, in turn with this one",
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
