"""Build worker processes: PoCL's compiles of a cold plan spread over the CPU's other cores.

PoCL 3.1 compiles under process-wide locks (its LLVM context, its code generator), so a process's
build threads take turns, and storing a program's binary makes PoCL compile a generic (any
work-group size) function of every kernel in it first (``clGetProgramInfo(CL_PROGRAM_BINARIES)``,
``pocl_driver_build_poclbinary``): 29 of ResNet50's 52 work-group functions at 32 x 32, none of
them needed by the process that builds them (it runs functions specialised per work-group size).
Where a plan's programs are not in the program-binary cache, a device on PoCL starts worker
processes (``MALINN_BUILD_WORKERS``: how many, default one where the CPU has two or more cores; 0
none) that

* build the plan's programs from source while the device's own build threads do, from the last
  asked for (the device's threads start from the first): a worker's build leaves the program in
  PoCL's kernel cache (``POCL_CACHE_DIR``, shared by the user's processes), where the device's own
  build of it then finds it instead of compiling it again;
* launch each of the plan's launches once, from the last bound, in its work-group shape on buffers
  of zeros of the same sizes: PoCL's work-group function specialised for that shape then waits in
  its kernel cache for the device's first run of it;
* store the binaries of the programs the device built, once the device has run a pass of them
  (its kernels' specialised functions are then in PoCL's kernel cache, and go into the binary
  too): the generic functions are compiled in the worker, off the first prediction's path.

A worker takes each program's build lock (:func:`~malinn.io.cache.build_lock`) as the device's
threads do, and stores a binary through the same checks (:meth:`BinaryCache._to_binary`). A worker
is a new interpreter (``python -m malinn.backends.opencl_build_worker``: no module of the
caller's is imported in it) that reads its work from its stdin, one JSON object a line, and ends
at the end of it; nothing of it is shared but the cache folders. A worker that dies costs time
only: the device builds every program it asks for itself, and stores the binaries a dead worker
was given itself. A process with workers waits, when it exits, for them to store what it gave them
(the next process then loads every program). A device whose programs are all in the cache starts
none, nor one whose cache folder cannot be written.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import SettingError
from ..io.cache import cache_dir
from .opencl_driver import pyopencl_module


class StoresBinaries(Protocol):
    """What the workers need of their device (:class:`~.opencl.OpenCLDevice`): its name and index,
    and its binary cache's store, for the programs no worker took."""

    name: str
    index: tuple

    def _to_binary(self, key: dict | None, program: Any) -> None: ...


__all__ = ["BuildWorkers", "build_workers", "cache_writable"]

_logger = logging.getLogger("malinn.backends.opencl")

#: the environment variable that sets how many worker processes a device on PoCL starts
WORKERS_VARIABLE = "MALINN_BUILD_WORKERS"
#: the module a worker process runs
WORKER_MODULE = "malinn.backends.opencl_build_worker"
#: how long an exiting process waits for its workers to store the binaries it gave them
EXIT_WAIT_S = 300.0


def build_workers() -> int:
    """``MALINN_BUILD_WORKERS``: how many worker processes a device on PoCL starts for a cold plan
    (default: one where the CPU has two or more cores, else none; 0: none).

    Raises:
        SettingError: the variable is not a whole number from 0 to 16.
    """
    value = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not value:
        return 1 if (os.cpu_count() or 1) >= 2 else 0
    if not value.isdigit() or int(value) > 16:
        raise SettingError(
            f"{WORKERS_VARIABLE}={value!r}: expected a whole number from 0 to 16 (the build worker "
            f"processes a device on PoCL starts for a cold plan); unset it for the default"
        )
    return int(value)


def cache_writable() -> bool:
    """Whether the program-binary cache folder takes a file now (made where missing). Where it does
    not, the device stores (and warns) itself, and starts no worker."""
    folder = cache_dir() / "programs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


class BuildWorkers:
    """A device's worker processes (started on the first program its binary cache lacks) and the
    binaries it gives them to store."""

    def __init__(self, device: StoresBinaries, count: int) -> None:
        self.device = device
        self.count = count
        self.lock = threading.Lock()
        self.processes: list[subprocess.Popen] = []
        #: what the workers are to build or launch, asked for before they started (messages)
        self.asked: list[dict] = []
        #: programs the device built, whose binaries wait for a pass: (source, options, key, program)
        self.deferred: list[tuple[str, tuple, dict, Any]] = []
        self.sent = 0
        self.closed = False

    # ------------------------------------------------------------------ device side
    def ask(self, source: str, options: tuple) -> None:
        """A program the device is about to build, whose binary the cache lacks: the workers start
        (where they are not running) and one builds it too."""
        self._ask({"build": source, "options": list(options)}, start=True)

    def ask_launch(
        self, source: str, options: tuple, function: str, args: list, global_size: tuple, local_size: tuple | None
    ) -> None:
        """A launch the device bound: a worker launches its kernel once in the same shape (on
        buffers of the same sizes, zeros), so that PoCL's work-group function for that shape is in
        its kernel cache when the device first runs it. A launch of arguments other than buffers,
        scalars and local memory is left to the device."""
        cl = pyopencl_module()
        described: list[dict] = []
        for arg in args:
            if isinstance(arg, np.generic):
                described.append({"scalar": arg.dtype.str, "hex": arg.tobytes().hex()})
            elif isinstance(arg, cl.MemoryObject):
                described.append({"buffer": int(arg.size)})
            elif isinstance(arg, cl.LocalMemory):
                described.append({"local": int(arg.size)})
            else:
                return
        self._ask(
            {
                "launch": source,
                "options": list(options),
                "function": function,
                "args": described,
                "global": list(global_size),
                "local": list(local_size) if local_size else None,
            }
        )

    def start(self) -> None:
        """Starts the workers now, where they are not running (the device's probe kernel is built
        from source: a cold machine, whose first plan will build too)."""
        with self.lock:
            if self.processes or self.closed:
                return
            self._start()
            asked, self.asked = self.asked, []
        for message in asked:
            self._send(message)

    def _ask(self, message: dict, start: bool = False) -> None:
        with self.lock:
            if not self.processes:
                if not self.closed:
                    self.asked.append(message)
                if not start or self.closed:
                    return
                self._start()
                asked, self.asked = self.asked, []
            else:
                asked = [message]
        for each in asked:
            self._send(each)

    def defer(self, source: str, options: tuple, key: dict, program: Any) -> None:
        """Takes the store of ``program``'s binary (built from source by the device) for a worker,
        which stores it once the device has run a pass (:meth:`release`); starts the workers."""
        with self.lock:
            self.deferred.append((source, options, key, program))
            if self.processes or self.closed:
                return
            self._start()
            asked, self.asked = self.asked, []
        for message in asked:
            self._send(message)

    def release(self) -> None:
        """The device ran a pass: its programs' specialised functions are in PoCL's kernel cache.
        Hands the deferred stores to the workers; where none is alive, stores them here."""
        with self.lock:
            deferred, self.deferred = self.deferred, []
        left = [item for item in deferred if not self._send({"store": item[0], "options": list(item[1])})]
        for _, _, key, program in left:  # no worker took it: as a device without workers does
            self.device._to_binary(key, program)

    def close(self, timeout: float = EXIT_WAIT_S) -> None:
        """Hands over what is deferred, ends the workers' input and waits for them (at exit)."""
        self.release()
        with self.lock:
            self.closed = True
            processes, self.processes = self.processes, []
        for process in processes:
            try:
                if process.stdin is not None:
                    process.stdin.close()
            except OSError:
                pass
        for process in processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()

    def _start(self) -> None:
        """Starts the workers (under :attr:`lock`); one that cannot start is left out."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            WORKERS_VARIABLE: "0",  # a worker starts none of its own
            "PYTHONPATH": os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        }
        index = self.device.index
        for _ in range(self.count):
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", WORKER_MODULE, str(index[0]), str(index[1])],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    env=env,
                    text=True,
                )
            except OSError as exc:
                _logger.debug("no build worker for %s: %s", self.device.name, exc)
                continue
            self.processes.append(process)
        if self.processes:
            atexit.register(self.close)
        else:  # none could start: the device does everything itself, and tries no more
            self.closed = True

    def _send(self, message: dict) -> bool:
        """Sends ``message`` to a live worker (in turn); whether one took it."""
        with self.lock:
            alive = [p for p in self.processes if p.poll() is None]
            for turn in range(len(alive)):
                process = alive[(self.sent + turn) % len(alive)]
                try:
                    assert process.stdin is not None
                    process.stdin.write(json.dumps(message) + "\n")
                    process.stdin.flush()
                except (OSError, ValueError):  # it died: the next one
                    continue
                self.sent += 1
                return True
        return False
