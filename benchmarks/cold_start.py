"""Cold start: seconds from a new Python process to the first prediction of Partial MNIST.

Each sample is a fresh process that imports malinn, loads a converted Partial MNIST model file and
predicts one batch. "warm" runs with the program-binary cache filled by a previous process;
"cold" turns every cache off (MALINN_BINARY_CACHE=0, PYOPENCL_NO_CACHE=1, POCL_KERNEL_CACHE=0,
CUDA_CACHE_DISABLE=1) so every kernel is compiled from source. Median of --repeat processes each.

Run:  python3 benchmarks/cold_start.py [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = """
import time
start = time.perf_counter()
import sys, numpy as np, malinn
model = malinn.load_model(sys.argv[1])
model.predict(np.zeros((1, 640), np.float32))
print(time.perf_counter() - start)
"""


def sample(path, env):
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5,
                        help="new processes per measurement; the median counts (default: 5)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH "
                        "(benchmarks/report.py reads them)")
    args = parser.parse_args(argv)
    from models import MODELS, build

    with tempfile.TemporaryDirectory() as tmp:
        path = build(MODELS["Partial MNIST"]).save(Path(tmp) / "partial_mnist.malinn")
        warm_env = {**os.environ, "MALINN_CACHE_DIR": os.path.join(tmp, "cache")}
        cold_env = {**warm_env, "MALINN_BINARY_CACHE": "0", "PYOPENCL_NO_CACHE": "1", "POCL_KERNEL_CACHE": "0",
                    "CUDA_CACHE_DISABLE": "1"}
        sample(path, warm_env)  # fills the binary cache
        warm = [sample(path, warm_env) for _ in range(args.repeat)]
        cold = [sample(path, cold_env) for _ in range(args.repeat)]
        import_only = [float(subprocess.run([sys.executable, "-c", "import time; s=time.perf_counter(); "
                                             "import malinn; malinn.get_device(); print(time.perf_counter()-s)"],
                                            env=warm_env, capture_output=True, text=True).stdout) for _ in range(args.repeat)]
    result = {"warm_s": float(np.median(warm)), "cold_s": float(np.median(cold)),
              "import_and_probe_s": float(np.median(import_only)), "repeat": args.repeat}
    print(f"first prediction of Partial MNIST in a new process: warm binary cache {result['warm_s']:.3f} s, "
          f"no caches {result['cold_s']:.3f} s (import + device probe alone {result['import_and_probe_s']:.3f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
