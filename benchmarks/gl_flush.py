"""Whether flushing GL's command stream early shortens a GL predict (one run, one GL device).

A GL driver may hold a predict's commands (the input's ``glBufferSubData``, the dispatches) in its
command buffer until something forces it out: the download's ``glGetBufferSubData``. The GPU then
starts only when the host has issued everything. ``glFlush`` hands the commands so far to the GPU
without waiting. Each network of Rovder's Table 10.5 (``models.py``) at batch 1 and --batch is
timed host to host (``model.predict``) with the launches made as:

* ``none``: no flush (``GLDevice.flush_first_dispatch`` off);
* ``first``: a ``glFlush`` after the first dispatch (``GLDevice.launch_all``'s own way since this
  benchmark);
* ``upload``: a ``glFlush`` after the input's upload;
* ``finish``: a ``glFinish`` after the input's upload (the upload done before any dispatch);
* ``orphan``: the input's buffer orphaned (a fresh store, no wait on the last predict's reads)
  before its upload;
* ``update``: the download's memory barrier for buffer reads only (``GL_BUFFER_UPDATE_BARRIER_BIT``,
  what ``glGetBufferSubData`` after a shader's writes needs), not every barrier bit;
* ``wait``: a ``glFinish`` before the download (the device idle when ``glGetBufferSubData`` reads);
* ``first_wait``: ``first`` and ``wait`` together;

the variants interleaved over --rounds rounds of --repeat predicts each (median of each round,
then the median over rounds), beside the same network on the OpenCL device given (the
ratio GL over OpenCL, host to host).

Run:  MALINN_GL=1 python3 benchmarks/gl_flush.py [--device gl:gpu] [--opencl gpu] [--batch 100]
                                                 [--repeat 100] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

import malinn
from malinn.backends import opengl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build  # noqa: E402
from peers import median_time  # noqa: E402

VARIANTS = ("none", "first", "upload", "finish", "orphan", "update", "wait", "first_wait")
BUFFER_UPDATE_BARRIER_BIT = 0x200


def gl_flush():
    egl = ctypes.CDLL("libEGL.so.1")
    egl.eglGetProcAddress.restype = ctypes.c_void_p
    egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    return ctypes.CFUNCTYPE(None)(egl.eglGetProcAddress(b"glFlush"))


def install(variant: str, flush) -> None:
    """``GLDevice``'s launch, upload and download as ``variant`` makes them."""
    cls = opengl.GLDevice
    upload, download = cls.__dict__["_original_upload"], cls.__dict__["_original_download"]
    cls.flush_first_dispatch = variant in ("first", "first_wait")

    def upload_variant(self, buffer, array, *args, **kwargs):
        with self:
            if variant == "orphan":
                buffer.orphan()
            upload(self, buffer, array, *args, **kwargs)
            if variant == "upload":
                flush()
            elif variant == "finish":
                self.ctx.finish()

    def download_variant(self, buffer, out, *args, **kwargs):
        if variant in ("wait", "first_wait"):
            with self:
                self.ctx.finish()
                return download(self, buffer, out, *args, **kwargs)
        if variant != "update":
            return download(self, buffer, out, *args, **kwargs)
        with self:
            self.ctx.memory_barrier(BUFFER_UPDATE_BARRIER_BIT)
            buffer.read_into(out, size=out.nbytes)

    cls.upload, cls.download = upload_variant, download_variant


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gl:gpu", help="the GL device (default: gl:gpu)")
    parser.add_argument("--opencl", default="gpu", help="the OpenCL device beside it (default: gpu)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), metavar="NAME")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    cls = opengl.GLDevice
    cls._original_upload, cls._original_download = cls.upload, cls.download
    flush = gl_flush()
    gl, cl = malinn.set_device(args.device), malinn.set_device(args.opencl)
    rows = []
    for name in args.models:
        model = build(MODELS[name])
        for batch in (1, args.batch):
            x = np.random.default_rng(1).random((batch, MODELS[name][0]), dtype=np.float32)
            malinn.set_device(cl)
            want = model.predict(x)
            row = {"model": name, "batch": batch,
                   "opencl": median_time(lambda: model.predict(x), args.repeat * args.rounds, warmup=5)}
            malinn.set_device(gl)
            times = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    install(variant, flush)
                    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-5)
                    times[variant].append(median_time(lambda: model.predict(x), args.repeat, warmup=5))
            install("first", flush)
            for variant in VARIANTS:
                row[variant] = float(np.median(times[variant]))
                row[variant + "_over_opencl"] = row[variant] / row["opencl"]
            rows.append(row)
            print(f"{name:<14} batch {batch:>4}: opencl {row['opencl'] * 1e6:7.1f} us; gl " + "  ".join(
                f"{v} {row[v] * 1e6:7.1f} ({row[v + '_over_opencl']:.2f}x)" for v in VARIANTS), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": gl.describe(), "opencl": cl.describe(), "rows": rows,
                                               "command": " ".join(sys.argv)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
