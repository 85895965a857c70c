"""A build worker process (:mod:`.opencl_build_workers`): ``python -m malinn.backends.opencl_build_worker
PLATFORM DEVICE`` builds, on the OpenCL device at that index, the programs its stdin names (one JSON
object a line: ``{"build": source, "options": [...]}``, ``{"store": source, "options": [...]}``) and
stores the binaries of those it is asked to store, through the device's program-binary cache; it
ends at the end of its input, once every store asked for is done.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any

import numpy as np

from ..io.cache import build_lock, entry_path
from .opencl import probe
from .opencl_driver import pyopencl_module

__all__ = ["serve"]

_logger = logging.getLogger("malinn.backends.opencl")


def serve(platform_index: int, device_index: int) -> int:
    """The worker: does what its stdin asks for on the device at the index (a store before any
    launch, a launch before any build, launches and builds newest first); ends at the end of its
    input, once each store asked for is done."""
    cl = pyopencl_module()
    platform = cl.get_platforms()[platform_index]
    device = probe(cl, platform, platform.get_devices()[device_index], (platform_index, device_index))
    work: dict[str, list[dict]] = {"store": [], "launch": [], "build": []}
    launched: set = set()
    condition = threading.Condition()
    ended = []

    def read() -> None:
        for line in sys.stdin:
            message = json.loads(line)
            with condition:
                if "store" in message:  # the device ran a pass: it has built and launched them all
                    work["launch"].clear()
                    work["build"].clear()
                work[next(kind for kind in work if kind in message)].append(message)
                condition.notify()
        with condition:
            ended.append(True)
            condition.notify()

    threading.Thread(target=read, daemon=True).start()
    programs: dict[tuple, Any] = {}
    while True:
        with condition:
            while not (any(work.values()) or ended):
                condition.wait()
            kind = next((kind for kind in work if work[kind]), None)
            if kind is None:
                return 0
            message = work[kind].pop(0 if kind == "store" else -1)
        source, options = message[kind], tuple(message["options"])
        try:
            if kind == "launch":
                shape = message["local"] or ("driver", *message["global"])
                if (source, options, message["function"], tuple(shape)) in launched:
                    continue
                launched.add((source, options, message["function"], tuple(shape)))
                program = programs.get((source, options)) or _built(device, source, options, False)
                if program is not None:
                    programs[(source, options)] = program
                    _launch(cl, device, program, message)
            else:
                _built(device, source, options, kind == "store")
        except Exception as exc:  # the device's own build or launch reports a failure
            _logger.debug("a build worker skipped a %s: %s", kind, exc)


def _built(device: Any, source: str, options: tuple, store: bool) -> Any:
    """The program built from source under its build lock (PoCL's kernel cache then holds it) and,
    with ``store``, its binary stored; ``None`` where the cache holds its binary already (a store
    or another process's build: nothing to compile)."""
    key = device._binary_key(source, options)
    with build_lock("programs", device._build_lock_name(source, options)):
        if key is None or entry_path("programs", key).exists():
            return None
        program = device._build_from_source(source, options, "a build worker's program")
        if store:
            device._to_binary(key, program)
        return program


def _launch(cl: Any, device: Any, program: Any, message: dict) -> None:
    """Runs the launch ``message`` describes once, on buffers of zeros: PoCL compiles the kernel's
    work-group function for its shape into its kernel cache."""
    args: list = []
    for arg in message["args"]:
        if "buffer" in arg:
            buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(arg["buffer"], 1))
            cl.enqueue_fill_buffer(device.queue, buffer, np.uint8(0), 0, max(arg["buffer"], 1))
            args.append(buffer)
        elif "local" in arg:
            args.append(cl.LocalMemory(arg["local"]))
        else:
            args.append(np.frombuffer(bytes.fromhex(arg["hex"]), dtype=np.dtype(arg["scalar"]))[0])
    kernel = cl.Kernel(program, message["function"])
    kernel.set_args(*args)
    local = tuple(message["local"]) if message["local"] else None
    cl.enqueue_nd_range_kernel(device.queue, kernel, tuple(message["global"]), local)
    device.queue.finish()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))
