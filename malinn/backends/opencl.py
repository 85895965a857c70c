"""The OpenCL backend: the device interface over pyopencl (with the modules beside it, the only
importers of pyopencl: :mod:`.opencl_driver`, :mod:`.opencl_binaries`, :mod:`.opencl_tensorflow`).

It discovers and probes OpenCL devices (a tiny kernel must build, run and return the right values
before a device counts as working; a broken platform or device is skipped with a warning that says
why), and gives each one the :class:`~malinn.backends.base.Device` interface: buffers, uploads and
downloads (mapped in place on devices that share memory with the host), programs built once per
device, several at once, with their binaries cached on disk, kernel arguments bound once, and
layout index macros in OpenCL C.

Programs are built on the device's build threads (``MALINN_BUILD_THREADS``, default the CPU count,
at most 8; 1: one after another in the caller's thread): a plan asks for all of its programs
(:meth:`OpenCLDevice.compile_async`) and binds each launch before its program is ready
(:meth:`OpenCLDevice.bind` of a program not yet built: its kernel is made when the build ends);
:meth:`OpenCLDevice.wait_for_builds`, and any run of a launch whose kernel is not made yet, wait
for them. pyopencl releases the GIL while a driver builds, so the builds run side by side (PoCL:
3.2 s for eight programs one after another, 2.0 s on two threads of a busy 2-core CPU). On PoCL,
whose compiles take turns within a process, a plan whose programs the binary cache lacks also has
build worker processes build and launch them and store their binaries (:mod:`.opencl_build_workers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..environment import switch
from ..errors import DeviceError, KernelBuildError, SettingError
from ..io.cache import build_lock, entry_path, read_entry, write_entry
from ..library.layout import Layout
from ..version import __version__
from .base import BoundLaunch, Device
from .opencl_binaries import BinaryCache, pocl_binary_problem
from .opencl_build_workers import BuildWorkers, build_workers, cache_writable
from .opencl_driver import (
    POCL_PLATFORM,
    QUIET_BUILD_OPTIONS,
    build_log,
    build_quietly,
    caches_its_builds,
    defined_names,
    pyopencl_module,
    safe_name,
    status_name,
    with_files,
    wrapped_program,
)
from .opencl_memory import DIRECT_MIN_BYTES, PINNED_MIN_BYTES, DeviceMemory, zero_copy_enabled
from .opencl_tensorflow import (
    TENSORFLOW_HINT,
    forget_skips,
    icd_loader_without_pocl,
    is_pocl,
    skip_pocl_for_tensorflow,
    skipped_for_tensorflow,
    tensorflow_loaded,
)

if TYPE_CHECKING:
    import pyopencl

__all__ = [
    "OpenCLDevice",
    "discover",
    "first_gpu",
    "status_name",
    "zero_copy_enabled",
    "tensorflow_loaded",
    "skipped_for_tensorflow",
    "TENSORFLOW_HINT",
    "pocl_binary_problem",
    "build_threads",
    "POCL_PLATFORM",
    "QUIET_BUILD_OPTIONS",
    "PINNED_MIN_BYTES",
    "DIRECT_MIN_BYTES",
]

_logger = logging.getLogger(__name__)

_PROBE_SOURCE = """
__kernel void malinn_probe(__global const float *x, __global float *y) {
    size_t i = get_global_id(0);
    y[i] = 2.0f * x[i] + 1.0f;
}
"""


def build_threads() -> int:
    """``MALINN_BUILD_THREADS``: how many programs a device builds at once (default: the CPU count,
    at most 8; 1 builds each in the thread that asks for it, one after another).

    Raises:
        SettingError: the variable is not a whole number of at least 1.
    """
    value = os.environ.get("MALINN_BUILD_THREADS", "").strip()
    if not value:
        return max(1, min(8, os.cpu_count() or 1))
    if not value.isdigit() or int(value) < 1:
        raise SettingError(
            f"MALINN_BUILD_THREADS={value!r}: expected a whole number of at least 1 "
            f"(the programs a device builds at once); unset it for the CPU count"
        )
    return int(value)


@dataclass(eq=False)
class OpenCLDevice(DeviceMemory, BinaryCache, Device):
    """An OpenCL device with its context and its in-order queue, which has no profiling: a queue
    with profiling costs the driver more for each command (``benchmarks/overhead.py``'s
    ``profiling_cost``). A launch whose event is timed (:meth:`_enqueue_one`: the tuner, the
    benchmarks) runs on :attr:`timing_queue`, ordered with the queue's work before and after it."""

    # the driver's objects, which the probe gives (keyword-only: the fields before them have defaults)
    cl_device: pyopencl.Device = field(repr=False, kw_only=True)
    context: pyopencl.Context = field(repr=False, kw_only=True)
    queue: pyopencl.CommandQueue = field(repr=False, kw_only=True)
    #: whether the driver caches builds from source itself (NVIDIA's, PoCL), decided by the probe:
    #: such builds go around pyopencl's own cache of builds (see :meth:`_build_from_source`)
    driver_caches_builds: bool = False
    #: held while the device's memo of programs or its pending launches change (not ``lock``:
    #: another model's predict enqueues meanwhile; the builds themselves run outside it, side by side)
    build_lock: threading.Lock = field(repr=False, default_factory=threading.Lock)
    #: the threads that build programs (made with the first build that may run beside others)
    build_pool: ThreadPoolExecutor | None = field(repr=False, default=None)
    #: launches bound before their program was built: launch -> Future of the launch, done once its
    #: kernel is made (:meth:`wait_for_builds`)
    pending: dict[BoundLaunch, Future[BoundLaunch]] = field(repr=False, default_factory=dict)
    #: the profiling queue of timed launches (:attr:`timing_queue`, made on first use)
    timing: pyopencl.CommandQueue | None = field(repr=False, default=None)
    #: the queues and locks of replicas 1, 2, ... (made on first use)
    streams: dict[int, tuple[pyopencl.CommandQueue, threading.RLock]] = field(repr=False, default_factory=dict)
    #: PoCL: the worker processes that build a cold plan's programs beside the build threads and
    #: store their binaries (:mod:`.opencl_build_workers`; ``None`` until a plan asks for programs)
    workers: BuildWorkers | None = field(repr=False, default=None)
    #: whether this device starts no build workers (decided at the first plan's programs)
    workers_refused: bool = field(repr=False, default=False)

    @property
    def extensions(self) -> tuple:
        """The extensions the driver reports for the device."""
        return tuple(self.cl_device.extensions.split()) if self.cl_device is not None else ()

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>") -> pyopencl.Program:
        """Builds (once) and returns an OpenCL program for this device.

        Programs are memoised per (source, options and ``MALINN_CL_OPTIONS``) in the device's cache,
        and their binaries are cached on disk (``<cache dir>/programs``, keyed by source, options,
        device and driver, each entry verified before it reaches the driver; ``MALINN_BINARY_CACHE=0``
        turns that off), so a new process does not recompile. A binary is stored only once it is
        known to load (:meth:`_to_binary`), and processes sharing the cache build a program one at
        a time (:func:`~malinn.io.cache.build_lock`): the first builds and stores it, the others
        load it.

        Raises:
            KernelBuildError: the build failed; the message has the build log and the options.
        """
        return self.compile_async(source, options, origin, wait=True).result()

    def compile_async(
        self, source: str, options: tuple = (), origin: str = "<source>", wait: bool = False, defer: bool = False
    ) -> Future[pyopencl.Program]:
        """:meth:`compile` without waiting for the build: the ``Future`` of the program, built on the
        device's build threads (:func:`build_threads`; on a driver other than NVIDIA's or PoCL, only
        where ``MALINN_BUILD_THREADS`` is set) beside the other programs asked for. A program
        asked for again while it builds is the same ``Future``; a build that failed is forgotten (the
        next call builds it again). With ``wait`` (or one build thread) it is built in this thread.
        A program asked for without ``wait`` (a plan's), or with ``defer``, on PoCL goes to the build
        workers too (:mod:`.opencl_build_workers`), which store its binary after the next pass.

        Raises:
            KernelBuildError: PoCL beside TensorFlow (the build's own failure is the Future's).
            SettingError: ``MALINN_CL_OPTIONS`` sets a define the kernel takes from its configuration.
        """
        if self.is_pocl and tensorflow_loaded():
            raise KernelBuildError(f"building {origin} for {self.name}: {TENSORFLOW_HINT}")
        extra = self.extra_build_options()
        clash = sorted(defined_names(extra) & defined_names(options))
        if clash:  # the launch is sized for the kernel's own value: another would compute wrong results
            raise SettingError(
                f"MALINN_CL_OPTIONS={' '.join(extra)!r} sets {', '.join(clash)}, which {origin} takes "
                f"from its configuration (its launch is sized for it); choose a configuration with "
                f"malinn.ops.use(op, codename, config=...) or malinn tune instead"
            )
        options = tuple(options) + extra + self.compiler_defines + QUIET_BUILD_OPTIONS
        digest = hashlib.sha256(source.encode() + b"\0" + "\0".join(options).encode()).hexdigest()
        # side by side on the drivers known to build so (NVIDIA's, PoCL: those that cache builds
        # themselves); elsewhere (Oclgrind, whose process died so, a board's driver) one at a time,
        # unless MALINN_BUILD_THREADS says otherwise
        threads = (
            1 if wait or not (self.driver_caches_builds or os.environ.get("MALINN_BUILD_THREADS")) else build_threads()
        )
        with self.build_lock:
            programs = self.cache.setdefault("programs", {})
            future = programs.get(digest)
            if future is not None:
                return future
            future = programs[digest] = Future()
            workers = None if wait and not defer else self._build_workers()
            if threads > 1 and self.build_pool is None:
                self.build_pool = ThreadPoolExecutor(threads, thread_name_prefix="malinn-build")
            pool = self.build_pool
        key = self._binary_key(source, options) if workers is not None else None
        if workers is not None and key is not None and not entry_path("programs", key).exists():
            future.build_request = (source, options)  # type: ignore[attr-defined]  # for bind's launches
            workers.ask(source, options)  # a program the cache lacks: the workers start
        if threads > 1 and pool is not None:  # made above where threads > 1
            pool.submit(self._build_into, future, digest, source, options, origin, workers)
        else:
            self._build_into(future, digest, source, options, origin, workers)
        return future

    def _build_workers(self) -> BuildWorkers | None:
        """The device's build workers (under :attr:`build_lock`): on PoCL with the binary cache on
        and ``MALINN_BUILD_WORKERS`` above 0, else ``None``; made, not started, on first use."""
        if self.workers is None and not self.workers_refused:
            count = build_workers() if self.is_pocl and switch("MALINN_BINARY_CACHE", True) else 0
            if count == 0 or not cache_writable():
                self.workers_refused = True
                return None
            self.workers = BuildWorkers(self, count)
        return self.workers

    def count_build(self, key: str) -> None:
        """Adds one to ``counters[key]`` (``builds``, ``binary_hits``) under the build lock, not the
        device's lock: a build thread never waits for ``lock``, which a run holds while it waits for
        the builds."""
        with self.build_lock:
            self.counters[key] = self.counters.get(key, 0) + 1

    def _build_into(
        self,
        future: Future[pyopencl.Program],
        digest: str,
        source: str,
        options: tuple,
        origin: str,
        workers: BuildWorkers | None = None,
    ) -> None:
        """Builds the program (:meth:`_build`) and settles ``future`` with it, or with the error (the
        memo then forgets it)."""
        try:
            program = self._build(source, options, origin, workers)
        except BaseException as exc:
            with self.build_lock:
                self.cache.get("programs", {}).pop(digest, None)
            future.set_exception(exc)
        else:
            future.set_result(program)

    def _build(self, source: str, options: tuple, origin: str, workers: BuildWorkers | None = None) -> pyopencl.Program:
        """The program from its binary in the cache, else built from source and its binary stored,
        under the program's build lock (in the build thread: the stores of several programs, on PoCL
        a compile of each kernel and a load of the binary, run side by side as their builds do).
        With ``workers`` (a plan's program on PoCL) the store is theirs, after the device's next
        pass (:meth:`BuildWorkers.defer`)."""
        key = self._binary_key(source, options)
        # of several processes building this program at once, one builds and stores it and the
        # others load it: PoCL's builds of one program in two processes at once race in its kernel
        # cache (a failed build, or a binary without its program.bc)
        with (
            build_lock("programs", self._build_lock_name(source, options))
            if key is not None or self.is_pocl
            else contextlib.nullcontext()
        ):
            program = self._from_binary(key, options)
            if program is None:
                program = self._build_from_source(source, options, origin)
                self.count_build("builds")
                if workers is not None and key is not None:
                    workers.defer(source, options, key, program)
                else:
                    self._to_binary(key, program)
            return program

    def _build_from_source(self, source: str, options: tuple, origin: str) -> pyopencl.Program:
        """A program built from ``source`` with ``options``: quietly (:func:`build_quietly`)
        where the driver caches builds from source itself (NVIDIA's, PoCL: pyopencl builds them
        uncached too); elsewhere through pyopencl's ``build`` and its cache of builds (Oclgrind's, a
        board's driver), which may warn of a non-empty log.

        Raises:
            KernelBuildError: the build failed; the message has the build log and the options.
        """
        cl = pyopencl_module()
        raw = cl._cl._Program(self.context, source) if self.driver_caches_builds else None
        try:
            if raw is None:
                return cl.Program(self.context, source).build(options=list(options))
            build_quietly(raw, self.cl_device, list(options))
            log = build_log(raw, self.cl_device)
        except cl.Error as exc:
            log = with_files(build_log(raw, self.cl_device) if raw is not None else str(exc), source)
            raise KernelBuildError(
                f"building {origin} for {self.name} failed ({status_name(exc)})\n"
                f"options: {' '.join(options) or '(none)'}\nbuild log:\n{log}"
            ) from exc
        if log:
            _logger.debug("building %s for %s: the compiler said:\n%s", origin, self.name, log)
        return wrapped_program(raw, source)

    @property
    def is_pocl(self) -> bool:
        """Whether this is a PoCL device (the CPU here): its compiler is an LLVM that clashes with
        TensorFlow's in one process, and it compiles a kernel again for each work-group size."""
        return POCL_PLATFORM in self.platform

    @property
    def compiler_defines(self) -> tuple:
        """Defines naming the compiler that builds this device's programs, for what OpenCL C 1.2 cannot
        say portably (kernels/device_fence.clh): ``-DNVIDIA_OPENCL=1`` on NVIDIA's platform, whose
        compiler takes PTX inline assembly (its ``mem_fence`` orders memory for the work-group only)."""
        return ("-DNVIDIA_OPENCL=1",) if "NVIDIA" in self.platform.upper() else ()

    def extra_build_options(self) -> tuple:
        """``MALINN_CL_OPTIONS``: OpenCL compiler options (space-separated) added to every build, for
        example ``-cl-opt-disable`` to tell a driver's optimiser from a kernel's arithmetic, or to
        build many programs fast (the test suite's kernel grids on PoCL: tests/conftest.py)."""
        return tuple(os.environ.get("MALINN_CL_OPTIONS", "").split())

    def render_index(self, layout: Layout, name: str) -> str:
        return opencl_index_macro(layout, name)

    # ---------------------------------------------------------------- launches
    def bind(
        self,
        program: Any,
        function: str,
        args: list,
        global_size: tuple,
        local_size: tuple | None,
        what: str = "",
        name: str | None = None,
    ) -> BoundLaunch:
        """:meth:`Device.bind`; ``program`` may be the ``Future`` of :meth:`compile_async`: a launch
        whose program is still building gets its kernel when the build ends (:meth:`wait_for_builds`)."""
        global_size = tuple(int(g) for g in global_size)
        local_size = tuple(int(v) for v in local_size) if local_size else None
        held = [a for a in args if not isinstance(a, np.generic)]
        if isinstance(program, Future):
            request = getattr(program, "build_request", None)
            if request is not None and self.workers is not None:  # a cold plan's: a worker launches it too
                self.workers.ask_launch(request[0], request[1], function, args, global_size, local_size)
            if not program.done():
                return self._bind_when_built(program, function, args, global_size, local_size, what, name, held)
            program = program.result()  # a failed build raises its error here
        bound = BoundLaunch(
            name or function,
            global_size,
            local_size,
            self._kernel(program, function, args, what),
            None,
            what,
            held=held,
        )
        bound.enqueue = lambda: self._enqueue_one(bound)
        return bound

    def _kernel(self, program: Any, function: str, args: list, what: str) -> pyopencl.Kernel:
        """The kernel ``function`` of ``program`` with ``args`` set."""
        cl = pyopencl_module()
        try:
            kernel = cl.Kernel(program, function)
            kernel.set_args(*args)
        except cl.Error as exc:
            raise DeviceError(
                f"{what + ': ' if what else ''}setting the arguments of kernel {function} on "
                f"{self.name} failed ({status_name(exc)})"
            ) from exc
        return kernel

    def _bind_when_built(
        self,
        program: Future[Any],
        function: str,
        args: list,
        global_size: tuple,
        local_size: tuple | None,
        what: str,
        name: str | None,
        held: list,
    ) -> BoundLaunch:
        bound = BoundLaunch(name or function, global_size, local_size, None, None, what, held=held)
        bound.enqueue = lambda: self._enqueue_one(bound)
        made: Future[BoundLaunch] = Future()

        def make(built: Future[Any]) -> None:  # in the build thread, once the program is built
            try:
                bound.handle = self._kernel(built.result(), function, args, what)
            except BaseException as exc:
                made.set_exception(exc)
            else:
                made.set_result(bound)

        with self.build_lock:
            self.pending[bound] = made
        program.add_done_callback(make)
        return bound

    def wait_for_builds(self, on_done: Callable[[], object] | None = None, discard: bool = False) -> None:
        """Waits until every launch bound before its program was built has its kernel, calling
        ``on_done()`` as each one's is made. With ``discard`` (a plan that failed) they are forgotten.

        Raises:
            KernelBuildError: a program did not build (the first such launch, in the order they were
                bound; it stays pending, so that a later run raises it again).
            DeviceError: a kernel's arguments could not be set.
        """
        with self.build_lock:
            pending = dict(self.pending)
        if not pending:
            return
        for _ in as_completed(pending.values()):
            if on_done is not None:
                on_done()
        failed = [made for made in pending.values() if made.exception() is not None]
        with self.build_lock:
            for bound, made in pending.items():
                if discard or made.exception() is None:
                    self.pending.pop(bound, None)
        if failed and not discard:
            failed[0].result()

    @property
    def timing_queue(self) -> pyopencl.CommandQueue:
        """A second in-order queue of the device, with profiling: where a launch whose event's
        ``profile`` is read runs (:meth:`_enqueue_one`), and where a benchmark times a copy."""
        if self.timing is None:
            cl = pyopencl_module()
            with self.build_lock:
                if self.timing is None:
                    try:
                        self.timing = cl.CommandQueue(
                            self.context, self.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE
                        )
                    except cl.Error as exc:
                        raise DeviceError(
                            f"making a profiling command queue on {self.name} failed ({status_name(exc)})"
                        ) from exc
        return self.timing

    def _enqueue_one(self, launch: BoundLaunch) -> pyopencl.Event:
        """A bound launch enqueued alone (``BoundLaunch.enqueue``: ``malinn.ops``, the tuner, the
        benchmarks), on :attr:`timing_queue` so that its event has the device's times: after the
        work enqueued on :attr:`queue` before it (a marker), and before the work enqueued there
        after it (a barrier). Each queue is flushed before the other waits on its event, as OpenCL
        asks of events waited for across queues."""
        if self.pending:
            self.wait_for_builds()
        cl = pyopencl_module()
        queue, timing = self.queue, self.timing_queue
        try:
            before = cl.enqueue_marker(queue)
            queue.flush()
            event = cl.enqueue_nd_range_kernel(
                timing, launch.handle, launch.global_size, launch.local_size, wait_for=[before]
            )
            timing.flush()
            cl.enqueue_barrier(queue, wait_for=[event])
        except cl.Error as exc:
            raise self._launch_error(launch, exc) from exc
        self.counters["launches"] += 1
        return event

    def launch_all(self, launches: list) -> None:
        if self.pending:
            self.wait_for_builds()
        cl = pyopencl_module()
        enqueue, queue = cl.enqueue_nd_range_kernel, self.queue
        for launch in launches:
            try:
                enqueue(queue, launch.handle, launch.global_size, launch.local_size)
            except cl.Error as exc:
                raise self._launch_error(launch, exc) from exc
        self.counters["launches"] += len(launches)

    def stream(self, replica: int = 0) -> tuple[pyopencl.CommandQueue, Any]:
        """:meth:`Device.stream`: replica 0, and every replica where :attr:`overlap_queues` is off,
        the device's queue and :attr:`lock`; a further replica its own in-order queue and lock (a
        pass holds them while it enqueues and waits for its download, so another replica's pass
        uploads meanwhile)."""
        if replica == 0 or not self.overlap_queues:
            return self.queue, self.lock
        cl = pyopencl_module()
        with self.build_lock:
            if replica not in self.streams:
                try:
                    queue = cl.CommandQueue(self.context, self.cl_device)
                except cl.Error as exc:
                    raise DeviceError(
                        f"making a second command queue on {self.name} failed ({status_name(exc)}); "
                        f"set MALINN_OVERLAP=0 to run every pass on one queue"
                    ) from exc
                self.streams[replica] = (queue, threading.RLock())
            return self.streams[replica]

    def run_pass(
        self,
        uploads: list[tuple[pyopencl.Buffer, np.ndarray]],
        launches: list[BoundLaunch],
        downloads: list[tuple[pyopencl.Buffer, np.ndarray]],
        queue: pyopencl.CommandQueue | None = None,
    ) -> None:
        """:meth:`Device.run_pass` as pyopencl's calls alone (plain copies, the upload events held
        until the blocking download): what a plain pyopencl program does, the messages of
        :meth:`upload`, :meth:`launch_all` and :meth:`download` made only on a failure. A first run
        of launches bound before their programs were built waits for them first."""
        self._enqueue_pass(uploads, launches, downloads, queue, True)
        self._passed()

    def start_pass(
        self,
        uploads: list[tuple[pyopencl.Buffer, np.ndarray]],
        launches: list[BoundLaunch],
        downloads: list[tuple[pyopencl.Buffer, np.ndarray]],
        queue: pyopencl.CommandQueue | None = None,
    ) -> tuple:
        """:meth:`Device.start_pass`: :meth:`run_pass`'s uploads and launches enqueued and flushed
        to the device; the downloads wait for :meth:`wait_pass`. NVIDIA's driver returns from a
        non-blocking read into pageable memory only once the queue has reached it (the pass
        done), where it returns from a write from page-locked memory at once: reads enqueued here
        would keep the next device from starting until this one finished."""
        queue = queue or self.queue
        in_flight = self._enqueue_pass(uploads, launches, [], queue, False)
        cl = pyopencl_module()
        try:
            queue.flush()
        except cl.Error as exc:
            raise DeviceError(f"submitting a pass to {self.name} failed ({status_name(exc)})") from exc
        return queue, downloads, in_flight

    def wait_pass(self, started: tuple) -> None:
        """:meth:`Device.wait_pass`: the pass's downloads, the last one blocking (its queue runs in
        order: every copy and launch before it is done when it returns)."""
        queue, downloads, in_flight = started
        self._enqueue_pass([], [], downloads, queue, True)
        del in_flight
        self._passed()

    def _enqueue_pass(
        self,
        uploads: list[tuple[pyopencl.Buffer, np.ndarray]],
        launches: list[BoundLaunch],
        downloads: list[tuple[pyopencl.Buffer, np.ndarray]],
        queue: pyopencl.CommandQueue | None,
        blocking: bool,
    ) -> list:
        """Enqueues a pass: the uploads non-blocking, the launches, the downloads (the last one
        ``blocking``); returns the copies' events (pyopencl's: each waits for its copy when freed)."""
        if self.pending:
            self.wait_for_builds()
        cl = pyopencl_module()
        copy, enqueue, queue = cl.enqueue_copy, cl.enqueue_nd_range_kernel, queue or self.queue
        in_flight: list = []
        doing: BoundLaunch | tuple[pyopencl.Buffer, np.ndarray] | None = None
        try:
            for doing in uploads:
                in_flight.append(copy(queue, doing[0], doing[1], is_blocking=False))
            doing = None
            for doing in launches:
                enqueue(queue, doing.handle, doing.global_size, doing.local_size)
            doing = None
            for doing in downloads:
                in_flight.append(copy(queue, doing[1], doing[0], is_blocking=blocking and doing is downloads[-1]))
        except cl.Error as exc:
            if isinstance(doing, BoundLaunch):
                raise self._launch_error(doing, exc) from exc
            assert doing is not None  # the error came from a copy or a launch
            where = "uploading the input" if any(doing is u for u in uploads) else "downloading the output"
            raise DeviceError(
                f"{where} ({doing[1].nbytes} bytes) {'to' if where[0] == 'u' else 'from'} {self.name} "
                f"failed ({status_name(exc)})"
            ) from exc
        counters = self.counters
        with self.build_lock:  # replicas' passes on queues of their own count at once
            counters["uploads"] += len(uploads)
            counters["launches"] += len(launches)
            counters["downloads"] += len(downloads)
        return in_flight

    def _passed(self) -> None:
        """After a pass completed: binaries whose kernels waited for a first run are stored."""
        if self.workers is not None and self.workers.deferred:
            self.workers.release()

    def _launch_error(self, launch: BoundLaunch, exc: Exception) -> DeviceError:
        return DeviceError(
            f"{launch.what + ': ' if launch.what else ''}kernel {launch.function} failed on "
            f"{self.name} ({status_name(exc)}); global {launch.global_size}, local {launch.local_size}"
        )


def opencl_index_macro(layout: Layout, name: str) -> str:
    """An OpenCL C macro ``name(r, c, prows, pcols)`` computing :meth:`Layout.index` on the device.

    ``prows`` and ``pcols`` are the padded shape, known only at launch time; the chunk sizes are
    literals, so one built program serves every matrix size.
    """
    body = layout.index_expression(row="((size_t)(R_))", col="((size_t)(C_))")
    return f"#define {name}(R_, C_, P_R, P_C) ((size_t)({body}))"


# -------------------------------------------------------------------- discovery
#: what the probes of this process did: ``run`` (the probe kernel ran and passed), ``cached`` (skipped:
#: this device and driver passed it before, :func:`probe_key`)
probe_stats = {"run": 0, "cached": 0}


def probe_key(device: OpenCLDevice) -> dict | None:
    """The key of ``device``'s probe result in the cache (kind ``probes``), ``None`` when
    ``MALINN_PROBE_CACHE=0``: the device's identity (platform, name, vendor, driver version), its
    OpenCL C version, the probe kernel's source and malinn's version. A driver update changes the
    key, so the probe kernel runs again."""
    if not switch("MALINN_PROBE_CACHE", True):
        return None
    return {
        "identity": device.identity,
        "opencl_c": device.opencl_c_version,
        "malinn": __version__,
        "probe_sha256": hashlib.sha256(_PROBE_SOURCE.encode()).hexdigest(),
    }


def probe(
    cl: ModuleType, platform: pyopencl.Platform, cl_device: pyopencl.Device, index: tuple[int, int]
) -> OpenCLDevice:
    """Creates a context and queue on ``cl_device`` and runs the probe kernel; raises on failure.

    The probe program goes through :meth:`OpenCLDevice.compile`, so its binary is cached like any
    kernel's and a new process does not compile it again (the device counters start at zero after).
    A device whose driver passed the probe before (same device, driver and malinn: a ``probes``
    entry in the cache folder, :func:`probe_key`) gets its context and queue but no probe kernel:
    a new process starts without building, uploading or launching anything.
    """
    context = cl.Context([cl_device])
    queue = cl.CommandQueue(context, cl_device)
    d = cl_device
    version = d.opencl_c_version if hasattr(d, "opencl_c_version") else d.version
    try:
        unified = bool(d.host_unified_memory)
    except Exception:  # removed from OpenCL 3.0 headers on some drivers
        unified = d.type & cl.device_type.CPU != 0
    device = OpenCLDevice(
        backend="opencl",
        index=index,
        name=d.name.strip(),
        platform=platform.name.strip(),
        vendor=d.vendor.strip(),
        type=_type_name(cl, d.type),
        compute_units=d.max_compute_units,
        global_memory=d.global_mem_size,
        max_allocation=d.max_mem_alloc_size,
        max_work_group_size=d.max_work_group_size,
        max_work_item_sizes=tuple(d.max_work_item_sizes),
        local_memory=d.local_mem_size,
        image_support=bool(d.image_support),
        image2d_max_size=(d.image2d_max_width, d.image2d_max_height) if d.image_support else (0, 0),
        opencl_c_version=version.strip(),
        driver_version=d.driver_version.strip(),
        host_unified_memory=unified,
        overlap_queues=not unified and bool(switch("MALINN_OVERLAP", True)),
        cl_device=d,
        context=context,
        queue=queue,
        driver_caches_builds=caches_its_builds(d),
    )
    key = probe_key(device)
    if key is not None and read_entry("probes", key) == _PROBE_PASSED:
        probe_stats["cached"] += 1
        return device
    workers = device._build_workers() if device.is_pocl else None
    if workers is not None:  # a machine new to malinn: its first plan builds programs beside them
        workers.start()
    x = np.arange(16, dtype=np.float32)
    y = np.empty_like(x)
    xb, yb = device.alloc(x.nbytes, "probe input"), device.alloc(y.nbytes, "probe output")
    # its binary stored by the build workers where they run (off the first prediction's path)
    program = device.compile_async(_PROBE_SOURCE, origin="the probe kernel", wait=True, defer=True).result()
    device.upload(xb, x, mapped=False)
    device.bind(program, "malinn_probe", [xb, yb], (16,), None, what="probe")()
    device.download(yb, y, mapped=False)
    if not np.array_equal(y, 2 * x + 1):
        raise DeviceError("the probe kernel ran but returned wrong values")
    device.counters.update({key: 0 for key in device.counters})
    probe_stats["run"] += 1
    if key is not None:
        write_entry("probes", key, _PROBE_PASSED)
    return device


_PROBE_PASSED = b"passed"


def _type_name(cl: ModuleType, bits: int) -> str:
    for name in ("GPU", "CPU", "ACCELERATOR", "CUSTOM"):
        if bits & getattr(cl.device_type, name, 0):
            return name
    return cl.device_type.to_string(bits)


def _probe_or_warn(
    cl: ModuleType, platform: pyopencl.Platform, cl_device: pyopencl.Device, index: tuple[int, int], known: dict | None
) -> OpenCLDevice | None:
    """The probed device at ``index`` (``None``: its probe failed, with a warning), reusing ``known``'s
    result for that index where there is one and recording the new one there."""
    if known is not None and index in known:
        return known[index]
    try:
        device = probe(cl, platform, cl_device, index)
    except Exception as exc:
        warnings.warn(
            f"malinn: skipping OpenCL device {index[0]}:{index[1]} ({safe_name(cl_device)} on "
            f"{safe_name(platform)}): the probe kernel failed ({status_name(exc)}: {exc})",
            stacklevel=4,
        )
        device = None
    if known is not None:
        known[index] = device
    return device


def first_gpu(known: dict) -> OpenCLDevice | None:
    """The first working OpenCL GPU in platform then device order, probing only GPUs, and only up to
    it: the default choice of a new process, without a context on every other device.

    Args:
        known: ``{(platform, device): Device or None}``, the probes made so far (read and filled,
            so that a later :func:`discover` with it probes no device twice).

    Returns:
        The device, or ``None`` where no GPU works, TensorFlow is loaded (the full discovery then
        decides, hiding PoCL) or the platforms cannot be listed (the full discovery reports it).
    """
    if tensorflow_loaded():
        return None
    try:
        cl = pyopencl_module()
        platforms = cl.get_platforms()
    except Exception:
        return None
    for pi, platform in enumerate(platforms):
        try:
            cl_devices = platform.get_devices()
        except Exception:
            continue
        for di, cl_device in enumerate(cl_devices):
            try:
                gpu = bool(cl_device.type & cl.device_type.GPU)
            except Exception:
                gpu = True  # the probe decides, and warns
            if gpu:
                device = _probe_or_warn(cl, platform, cl_device, (pi, di), known)
                if device is not None and device.kind == "gpu":
                    return device
    return None


def discover(known: dict | None = None) -> list:
    """Every working OpenCL device, probed, in platform then device order (warnings for the rest).

    PoCL is skipped, never loaded, when TensorFlow is loaded in the process (the two cannot share one).

    Args:
        known: ``{(platform, device): Device or None}`` of probes already made in this process
            (:func:`first_gpu`): those devices are reused, not probed again; filled with the new ones.
    """
    forget_skips()
    try:
        cl = pyopencl_module()
    except ImportError as exc:  # pragma: no cover - pyopencl is a dependency
        warnings.warn(f"malinn: pyopencl cannot be imported ({exc}); no OpenCL device is usable", stacklevel=3)
        return []
    found = []
    tensorflow = tensorflow_loaded()
    try:
        if tensorflow and not icd_loader_without_pocl(lambda: cl.get_platforms()):
            return []
        platforms = cl.get_platforms()
    except Exception as exc:
        warnings.warn(
            f"malinn: no OpenCL platform could be listed ({status_name(exc)}: {exc}); "
            "install an OpenCL driver (e.g. Debian's pocl-opencl-icd)",
            stacklevel=3,
        )
        return []
    for pi, platform in enumerate(platforms):
        if tensorflow and is_pocl(platform):  # PoCL was loaded before TensorFlow: its launches would crash
            skip_pocl_for_tensorflow(f"OpenCL platform {pi} ({safe_name(platform)})")
            continue
        try:
            cl_devices = platform.get_devices()
        except Exception as exc:
            warnings.warn(
                f"malinn: skipping OpenCL platform {pi} ({safe_name(platform)}): its devices cannot be "
                f"listed ({status_name(exc)}: {exc})",
                stacklevel=3,
            )
            continue
        for di, cl_device in enumerate(cl_devices):
            device = _probe_or_warn(cl, platform, cl_device, (pi, di), known)
            if device is not None:
                found.append(device)
    return found
