"""Which global loads NVIDIA's OpenCL compiler emits for each batch-1 matmul program of Full CIFAR
in each precision: the PTX of every program the plan built, its ld.global instructions counted by
width (a vload_half8 of 16 bytes may become eight 2-byte loads).

Run:  python3 benchmarks/ptx_loads.py [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np

import malinn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build  # noqa: E402


def loads(ptx: str) -> dict:
    found = collections.Counter(re.findall(r"\b(ld\.global(?:\.nc)?(?:\.v[248])?\.[a-z]+\d+)", ptx))
    return dict(sorted(found.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--model", default="Full CIFAR")
    parser.add_argument("--dump", help="folder to write each program's PTX")
    args = parser.parse_args()
    device = malinn.get_device()
    if "NVIDIA" not in device.platform:
        sys.exit(f"ptx_loads.py reads NVIDIA's PTX; {device.name} ({device.platform}) builds no PTX")
    import pyopencl as cl
    rows = []
    for precision in ("fp32", "fp16-storage", "int8-weights"):
        device.cache.pop("programs", None)
        model = build(MODELS[args.model])
        model.precision = precision
        model.predict(np.ones((1, MODELS[args.model][0]), np.float32))
        for i, program in enumerate(device.cache.get("programs", {}).values()):
            binary = bytes(program.get_info(cl.program_info.BINARIES)[0])
            ptx = binary.decode("latin-1")
            names = re.findall(r"\.entry\s+(\w+)", ptx)
            row = {"precision": precision, "entries": names, "loads": loads(ptx), "bytes": len(binary)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                Path(args.dump, f"{precision}_{i}.ptx").write_text(ptx)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.name, "rows": rows,
                                               "command": shlex.join(sys.argv)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
