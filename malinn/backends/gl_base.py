"""What the two GL backends share: a device over a headless moderngl context, current in one
thread at a time under the device's lock; its buffers (shader storage buffers); the memo of its
programs; the ``MalinnArgs`` uniform block of a launch; launch errors and events; and the steps of
discovery (whether to look, the probe kernels, the loop-limit probe, one device after another).

:class:`GLBaseDevice` is the base of the compute-shader devices (``gl``,
:class:`~malinn.backends.opengl.GLDevice`) and of the vertex-stage ones (``gles3``,
:class:`~malinn.backends.gl_feedback.FeedbackDevice`); each adds its programs (``new_program``),
``bind`` and ``launch_all``. A GL context is current in one thread at a time: every call makes it
current for its duration (under the device's lock) and restores the caller's context after.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Literal

import numpy as np

from ..environment import switch
from ..errors import BackendError, DeviceError, KernelBuildError
from ..library.layout import Layout
from .base import ALLOCATION_HINT, BoundLaunch, Device, size_text
from .gl_context import error_line, load_moderngl, requested_gl_api

__all__ = [
    "GLBaseDevice",
    "ContextLock",
    "GLEvent",
    "launch_error",
    "gl_index_macro",
    "split_args",
    "args_block",
    "wanted",
    "no_compute",
    "looks_for_devices",
    "probe_each",
    "run_probe",
    "loop_limit",
    "LOOP_PROBE_ITERATIONS",
]

#: the loop the loop-limit probes run: longer than any limit seen (llvmpipe's 65535)
LOOP_PROBE_ITERATIONS = 1 << 20
#: the EGL devices discovery tries, at most
MAX_EGL_DEVICES = 16
_SCALARS = (np.uint32, np.float32)


class ContextLock:
    """A GL device's lock: a re-entrant lock that also keeps the device's context current in the
    thread holding it, made current on the outermost acquire and released (its freed objects
    collected first) on the outermost release. A plan's run holds ``Device.lock`` across its
    upload, launches and download, so a predict makes the context current once, not once per call
    (releasing a context flushes it on some drivers)."""

    def __init__(self, device: GLBaseDevice):
        self._lock = threading.RLock()
        self._device = device
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock (making the context current on the outermost acquire). Whatever interrupts
        it after the lock is taken, a KeyboardInterrupt from a signal handler too, gives the lock
        back: a predict interrupted there left it held, and every other thread's predict hung."""
        if not self._lock.acquire(blocking, timeout):
            return False
        try:
            if self._depth == 0:
                self._device.ctx.__enter__()
            self._depth += 1
        except BaseException:
            self._lock.release()
            raise
        return True

    def release(self) -> None:
        """Gives the lock back (the context released, its freed objects collected, on the outermost)."""
        self._depth -= 1
        try:
            if self._depth == 0:
                try:
                    self._device.ctx.gc()
                finally:
                    self._device.ctx.__exit__(None, None, None)
        finally:
            self._lock.release()

    def __enter__(self) -> ContextLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.release()
        return False


class GLEvent:
    """What one enqueued GL launch returns: already complete, with ``profile.start``/``end`` in ns."""

    __slots__ = ("profile",)

    def __init__(self, start: int, end: int):
        self.profile = type("Profile", (), {"start": start, "end": end})()

    def wait(self) -> None:
        """Nothing to wait for: the launch finished before the event was made."""


def launch_error(launches: list, device_name: str, error: str) -> DeviceError:
    """The error of a batch of GL launches: GL reports one error state for the batch (checking it
    after each launch would cost every predict), so the message names the launches, at most four."""
    names = [f"{b.what}: {b.function} over {b.global_size}" for b in launches]
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    which = f"one of {len(names)} launches ({listed})" if len(names) > 1 else f"launching {listed}"
    return DeviceError(f"{which} on {device_name} failed ({error})")


def gl_index_macro(layout: Layout, name: str) -> str:
    """A GLSL macro ``name(r, c, prows, pcols)`` computing :meth:`Layout.index` in ``uint``.

    The expression of the OpenCL macro (``Layout.index_expression``), with unsigned literals: GLSL
    converts no ``int`` to ``uint`` implicitly.
    """
    body = layout.index_expression("u", "(uint(R_))", "(uint(C_))", "uint(P_R)", "uint(P_C)")
    return f"#define {name}(R_, C_, P_R, P_C) ({body})"


def split_args(args: list) -> tuple[list, list]:
    """``(scalars, buffers)``: a launch's arguments (the library's ``arglist`` order) split into the
    ``uint``/``float`` scalars, which fill ``MalinnArgs``, and the buffers, bound in order."""
    return [a for a in args if isinstance(a, _SCALARS)], [a for a in args if not isinstance(a, _SCALARS)]


def args_block(origin: str, block_size: int, head: list[int], scalars: list) -> bytes:
    """The bytes of a launch's ``MalinnArgs`` uniform block (std140: one 4-byte word each): the
    ``head`` words the shader preamble declares (the range, and the fold on the compute path), then
    the scalars' bits, zeros up to the block's ``block_size`` bytes.

    Raises:
        KernelBuildError: the block holds fewer scalars than the library passes (named by ``origin``).
    """
    if block_size < 4 * (len(head) + len(scalars)):
        raise KernelBuildError(
            f"{origin}: MALINN_ARGS holds {block_size // 4 - len(head)} scalars, the library passes {len(scalars)}"
        )
    words = np.zeros(max(block_size // 4, len(head) + len(scalars)), np.uint32)
    words[: len(head)] = head
    for i, value in enumerate(scalars):
        words[len(head) + i] = np.asarray(value).view(np.uint32)
    return words.tobytes()


@dataclass(eq=False)
class GLBaseDevice(Device):
    """A device over a headless EGL context (a moderngl ``Context``, ``ctx``) and the entry points
    moderngl does not wrap (``gl``: :class:`~malinn.backends.gl_functions.GLFunctions`).

    Buffers are shader storage buffers in whole 4-byte words; upload and download are
    ``glBufferSubData`` / ``glGetBufferSubData`` (blocking: the driver copies before returning).
    """

    ctx: Any = field(repr=False, default=None)
    gl: Any = field(repr=False, default=None)
    #: the program-binary formats the driver offers (0: none, no binary cache of its programs)
    binary_formats: int = 0
    #: whether the context has ``glMemoryBarrier`` (compute contexts), issued before a buffer is read
    storage_barriers: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.lock = ContextLock(self)

    # ---------------------------------------------------------------- the current context
    def __enter__(self) -> GLBaseDevice:
        self.lock.__enter__()  # the ContextLock: the context current in this thread
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.lock.__exit__(None, None, None)
        return False

    def _error(self) -> str | None:
        """The context's GL error (cleared by asking), or None."""
        error = self.ctx.error
        return None if error == "GL_NO_ERROR" else error

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int, what: str) -> Any:
        if nbytes > self.max_allocation:
            raise DeviceError(
                f"{what}: {size_text(nbytes)} exceeds the largest single allocation of "
                f"{self.name} ({size_text(self.max_allocation)}: its largest shader storage buffer)"
                f"{ALLOCATION_HINT}"
            )
        with self:
            try:
                # whole 4-byte words: a shader reads half and int8 weights as uint words
                buffer = self.ctx.buffer(reserve=max(-(-int(nbytes) // 4) * 4, 4))
            except Exception as exc:
                raise DeviceError(f"{what}: allocating {size_text(nbytes)} on {self.name} failed ({exc})") from exc
            error = self._error()
            if error:
                raise DeviceError(f"{what}: allocating {size_text(nbytes)} on {self.name} failed ({error})")
        return buffer

    def upload(
        self, buffer: Any, array: np.ndarray, blocking: bool = True, what: str = "data", mapped: bool | None = None
    ) -> None:
        with self:
            try:
                buffer.write(np.ascontiguousarray(array))
            except Exception as exc:
                raise DeviceError(f"uploading {what} ({array.nbytes} bytes) to {self.name} failed ({exc})") from exc
        self.counters["uploads"] += 1

    def download(
        self, buffer: Any, out: np.ndarray, blocking: bool = True, what: str = "data", mapped: bool | None = None
    ) -> None:
        with self:
            try:
                if self.storage_barriers:
                    self.ctx.memory_barrier()
                buffer.read_into(out, size=out.nbytes)
            except Exception as exc:
                raise DeviceError(f"downloading {what} ({out.nbytes} bytes) from {self.name} failed ({exc})") from exc
        self.counters["downloads"] += 1

    def fill_zero(self, buffer: Any, nbytes: int, what: str = "buffer") -> None:
        with self:
            try:
                if self.storage_barriers:
                    self.ctx.memory_barrier()
                buffer.clear(size=int(nbytes))
            except Exception as exc:
                raise DeviceError(f"clearing {what} ({nbytes} bytes) on {self.name} failed ({exc})") from exc

    def finish(self) -> None:
        with self:
            self.ctx.finish()

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>") -> Any:
        """The program of ``source`` and ``options`` (:meth:`new_program`), memoised per device.

        Raises:
            BackendError, KernelBuildError: what :meth:`new_program` raises.
        """
        key = (source, tuple(options))
        programs = self.cache.setdefault("programs", {})
        with self.lock:
            program = programs.get(key)
            if program is None:
                program = programs[key] = self.new_program(source, tuple(options), origin)
        return program

    def new_program(self, source: str, options: tuple, origin: str) -> Any:
        """A new program object of this backend for ``source`` and ``options`` (linked when bound)."""
        raise NotImplementedError(f"{type(self).__name__} makes no programs")

    def render_index(self, layout: Layout, name: str) -> str:
        return gl_index_macro(layout, name)

    # ---------------------------------------------------------------- timing
    @property
    def timer_queries(self) -> bool:
        """Whether the context records the device's time around each launch (``GL_TIMESTAMP``
        queries: the compute devices' :attr:`~malinn.backends.opengl.GLDevice.timer_queries`)."""
        return False

    def launch_seconds(self, launches: list) -> list[float]:
        """Each launch's device seconds, where :attr:`timer_queries`.

        Raises:
            BackendError: the context has no timer queries.
        """
        raise BackendError(
            f"{self.name} ({self.platform}) has no GL timer queries (GL_TIMESTAMP: desktop "
            "OpenGL 3.3, or OpenGL ES with GL_EXT_disjoint_timer_query)"
        )

    def timed(self, launches: list) -> GLEvent:
        """Runs ``launches`` to completion: an event whose profile is their wall time until the
        device finished (GL has no per-launch events; the tuner and benchmarks time with it)."""
        with self:
            self.ctx.finish()
            start = time.perf_counter_ns()
            self.launch_all(launches)
            self.ctx.finish()
            return GLEvent(start, time.perf_counter_ns())

    def bound(self, name: str, global_size: tuple, local: tuple | None, handle: tuple, what: str) -> BoundLaunch:
        """A bound launch of this device whose ``enqueue`` runs it alone, timed (:meth:`timed`)."""
        launch = BoundLaunch(name, global_size, local, handle, lambda: self.timed([launch]), what=what)
        return launch


# -------------------------------------------------------------------- discovery
def wanted(others: list) -> bool:
    """Whether a discovery without an explicit request looks for OpenGL devices: ``MALINN_GL=1``
    always, ``MALINN_GL=0`` never, else only where no OpenCL GPU works (the choice order puts an
    OpenGL GPU after any OpenCL GPU). Mesa's drivers bring an LLVM of their own, and importing
    TensorFlow into a process that loaded one crashes it: where OpenCL serves, Mesa stays unloaded."""
    setting = switch("MALINN_GL", None)
    if setting is not None:
        return bool(setting)
    return not any(d.kind == "gpu" for d in others)


def no_compute() -> bool:
    """Whether ``MALINN_GL_NO_COMPUTE=1`` asks for every OpenGL device as a ``gles3`` device (the
    ``gl`` backend then lists none: for testing the vertex-stage path on llvmpipe or any GPU)."""
    return bool(switch("MALINN_GL_NO_COMPUTE", False))


def looks_for_devices(others: list | None, force: bool, warn: bool) -> bool:
    """Whether a GL backend's discovery looks for devices: not under ``MALINN_GL=0``, and where
    :func:`wanted` or ``force``; and not when moderngl is not installed (``pip install malinn[gl]``),
    when TensorFlow is loaded in the process (Mesa's llvmpipe brings an LLVM of its own, as PoCL
    does), or when ``MALINN_GL_API`` names no API; ``warn``: say why in the last two cases."""
    if switch("MALINN_GL", None) is False or not (force or wanted(others or [])):
        return False
    try:
        load_moderngl()
    except ImportError:
        return False
    if "tensorflow" in sys.modules:
        if warn:
            warnings.warn(
                "malinn: skipping the OpenGL devices: TensorFlow is loaded in this process, and Mesa's "
                "drivers bring an LLVM of their own; run TensorFlow in another process",
                stacklevel=4,
            )
        return False
    try:
        requested_gl_api()
    except DeviceError as exc:
        if warn:
            warnings.warn(f"malinn: skipping the OpenGL devices: {exc}", stacklevel=4)
        return False
    return True


def probe_each(probe: Callable[[int], Device], backend: str, skip: Collection[int] = ()) -> list:
    """``probe(index)`` for each EGL device in order but those in ``skip``, up to the last; a
    warning naming the device (``backend:index``) and the failure for each one that fails."""
    found = []
    for index in range(MAX_EGL_DEVICES):
        if index in skip:
            continue
        try:
            found.append(probe(index))
        except Exception as exc:
            text = error_line(exc)
            if "requested device index" in text:  # past the last EGL device
                break
            warnings.warn(f"malinn: skipping OpenGL device {backend}:{index}: {text}", stacklevel=4)
    return found


def run_probe(device: GLBaseDevice, source: str, origin: str) -> GLBaseDevice:
    """Runs ``source`` (y = 2 x + 1 over 100 floats) on a new GL device and returns the device with
    its counters at zero.

    Raises:
        DeviceError: the probe ran but returned wrong values (a build failure raises its own error).
    """
    x = np.arange(100, dtype=np.float32)
    y = np.empty_like(x)
    xb, yb = device.alloc(x.nbytes, "probe input"), device.alloc(y.nbytes, "probe output")
    program = device.compile(source, origin=origin)
    device.upload(xb, x)
    device.bind(program, "main", [np.uint32(x.size), xb, yb], (x.size,), None, what="probe")()
    device.download(yb, y)
    if not np.array_equal(y, 2 * x + 1):
        raise DeviceError(f"{origin} ran but returned wrong values")
    device.counters.update({key: 0 for key in device.counters})
    return device


def loop_limit(device: GLBaseDevice, source: str, dtype: type = np.uint32, local: tuple | None = (1,)) -> int | None:
    """The iterations after which ``device``'s driver ends a shader invocation's loops, silently
    (llvmpipe's 65535: Mesa's LP_MAX_TGSI_LOOP_ITERATIONS), or None where a loop of
    :data:`LOOP_PROBE_ITERATIONS` runs to its end. ``source`` counts a loop of ``n`` iterations
    over two ones of ``dtype`` into its one output (a compute shader on the ``gl`` backend, its
    vertex-stage twin on ``gles3``), launched with work-group ``local``."""
    x: np.ndarray = np.ones(2, dtype)
    y: np.ndarray = np.zeros(1, dtype)
    xb, yb = device.alloc(x.nbytes, "loop probe input"), device.alloc(y.nbytes, "loop probe output")
    program = device.compile(source, origin="the loop probe shader")
    device.upload(xb, x)
    device.bind(program, "main", [np.uint32(LOOP_PROBE_ITERATIONS), xb, yb], (1,), local, what="loop probe")()
    device.download(yb, y)
    device.counters.update({key: 0 for key in device.counters})
    return int(y[0]) if int(y[0]) < LOOP_PROBE_ITERATIONS else None
