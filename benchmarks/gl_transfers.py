"""What a GL predict's upload and download cost on a GL device, by way of doing them (one run).

For Full CIFAR's input at batch 100 (1.2 MB) and batch 1 (12 KB), medians of --repeat, each until
the device finished (``glFinish``): ``glBufferSubData`` into a buffer made with ``GL_STATIC_DRAW``
(moderngl's default, what ``GLDevice.alloc`` makes) and with ``GL_DYNAMIC_DRAW``, the same after
orphaning the buffer (a fresh store: no wait on earlier reads), the call alone without the finish,
the same bytes in 2 to 16 calls (``chunked_N``: whether the driver moves one piece while the next is
copied), and a 4 KB ``glGetBufferSubData`` (a predict's download) after a finish.

Run:  MALINN_GL=1 python3 benchmarks/gl_transfers.py [--device gl:gpu] [--repeat 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import malinn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import median_time  # noqa: E402


def median_us(fn, repeat: int) -> float:
    return median_time(fn, repeat) * 1e6


def chunked(buffer, x, pieces: int) -> None:
    """``x`` written in ``pieces`` ``glBufferSubData`` calls (the driver may move one while the next
    is copied)."""
    step = -(-x.size // pieces)
    for start in range(0, x.size, step):
        buffer.write(x[start:start + step], offset=4 * start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gl:gpu")
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    malinn.set_device(args.device)
    device = malinn.get_device()
    ctx = device.ctx
    rows = []
    with device:
        out = np.empty(1000, np.float32)
        small = ctx.buffer(reserve=out.nbytes)
        for nbytes in (100 * 3072 * 4, 3072 * 4):
            x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
            static, dynamic = ctx.buffer(reserve=nbytes), ctx.buffer(reserve=nbytes, dynamic=True)
            row = {"bytes": nbytes,
                   "static_us": median_us(lambda: (static.write(x), ctx.finish()), args.repeat),
                   "dynamic_us": median_us(lambda: (dynamic.write(x), ctx.finish()), args.repeat),
                   "orphan_static_us": median_us(lambda: (static.orphan(), static.write(x), ctx.finish()), args.repeat),
                   "orphan_dynamic_us": median_us(lambda: (dynamic.orphan(), dynamic.write(x), ctx.finish()), args.repeat),
                   "call_only_us": median_us(lambda: static.write(x), args.repeat),
                   **{f"chunked_{pieces}_us": median_us(lambda pieces=pieces: (chunked(static, x, pieces), ctx.finish()),
                                                        args.repeat) for pieces in (2, 4, 8, 16)},
                   "finish_us": median_us(ctx.finish, args.repeat),
                   "download_4kb_us": median_us(lambda: small.read_into(out), args.repeat)}
            rows.append(row)
            print(" ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
