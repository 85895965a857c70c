"""The OpenGL backend: GLSL ES 3.10 compute shaders through moderngl, headless through EGL.

The only module of malinn that imports moderngl (an optional extra: ``pip install malinn[gl]``).
It serves the boards that have a capable GPU and no OpenCL driver (Raspberry Pi 4/5, Mali on
Panfrost): the same model file runs there, on the same kernel-library entries, each entry naming
its GLSL source under ``"sources": {"gl": ...}`` (``kernels/gl/``).

How the OpenCL notions map (docs/BACKENDS.md):

* a buffer is a shader storage buffer; upload and download are ``glBufferSubData`` /
  ``glGetBufferSubData`` (blocking: the driver copies before returning);
* a program is a compute shader: the source with the entry's defines as ``#define`` lines after
  ``#version 310 es``, and the work-group size as ``layout(local_size_x ...)`` (a compile-time
  constant in GLSL, so one source is linked once per work-group shape it is launched with);
* arguments: the scalars (``uint``/``float``, in the library's ``arglist`` order) fill a uniform
  block ``MalinnArgs`` at binding 0 (std140: one 4-byte slot each, after the launch's range
  ``malinn_range0``, ``malinn_range1`` and its fold ``malinn_fold``), declared by the shader with
  ``MALINN_ARGS(...)``; the buffers go to storage-buffer bindings 0, 1, ... in ``buffers`` order;
* a range not divisible by the work-group is rounded up, and the shader returns early past
  ``malinn_range`` (``MALINN_GUARD``); kernels with barriers always get a dividing work-group;
* a range of more work-groups than a dimension dispatches (65535) is folded into z
  (:func:`fold_groups`), linked with index macros that add the fold back; shaders index through
  ``MALINN_GLOBAL_X`` ... ``MALINN_GROUP_Y`` (the plain built-ins where nothing is folded);
* launches are dispatched in order with a storage-buffer barrier after each; profiling events are
  ``GL_TIMESTAMP`` queries around a launch (``launch_seconds``, a bound launch's ``enqueue``);
* a context is current in one thread at a time: every call makes it current for its duration
  (under the device's lock) and restores the caller's context after.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..environment import switch
from ..errors import BackendError, DeviceError, KernelBuildError
from ..io.cache import read_entry, write_entry
from ..library.layout import Layout
from .base import ALLOCATION_HINT, BoundLaunch, Device, size_text
from .gles_context import ESContext

__all__ = ["GLDevice", "discover", "gl_index_macro", "loop_limit", "PREAMBLE_VERSION", "SOFTWARE_RENDERERS"]

#: renderers that run on the CPU (their devices are listed as type CPU)
SOFTWARE_RENDERERS = ("llvmpipe", "softpipe", "swiftshader", "lavapipe", "swrast")
#: the shader language every GL source is written in
PREAMBLE_VERSION = "#version 310 es"
#: the work-group shape of a launch whose kernel names none (a rounded-up range, guarded)
DEFAULT_LOCAL = {1: (64,), 2: (8, 8)}
_SHADER_STORAGE_BARRIER_BIT = 0x2000
_MAX_COMPUTE_SHARED_MEMORY_SIZE = 0x8262
_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE
_MAX_COMPUTE_WORK_GROUP_INVOCATIONS = 0x90EB
_MAX_COMPUTE_WORK_GROUP_SIZE = 0x91BF     # per axis (glGetIntegeri_v)
_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX = 0x9048
_PROGRAM_BINARY_LENGTH = 0x8741
_LINK_STATUS = 0x8B82
_UNIFORM_BLOCK_DATA_SIZE = 0x8A40
_TIMESTAMP = 0x8E28
_QUERY_RESULT = 0x8866
_INVALID_INDEX = 0xFFFFFFFF

#: defines of a reduced weight precision (kernels/weights.clh): a program asking for one from a
#: source that does not read it (no _WEIGHTS_MARK: gl/weights.glsl), or for half arithmetic (no GL
#: shader has it), is refused (BackendError) rather than reading half or int8 bytes as floats
_FP32_ONLY = ("-DWEIGHT_BITS", "-DHALF_ARITHMETIC")
_WEIGHTS_MARK = "#define MALINN_WEIGHT_BITS_READ"

_PROBE_SOURCE = """
MALINN_ARGS(uint n;)
layout(std430, binding = 0) readonly buffer BufX { float x[]; };
layout(std430, binding = 1) writeonly buffer BufY { float y[]; };
void main() {
    MALINN_GUARD
    uint i = MALINN_GLOBAL_X;
    y[i] = 2.0 * x[i] + 1.0;
}
"""


#: counts the iterations of one loop of ``n`` (each adds a value read from memory, so that no compiler
#: folds the loop): fewer than ``n`` where the driver ends loops early (llvmpipe: after 65535)
_LOOP_PROBE_SOURCE = """
MALINN_ARGS(uint n;)
layout(std430, binding = 0) readonly buffer BufX { uint x[]; };
layout(std430, binding = 1) writeonly buffer BufY { uint y[]; };
void main() {
    MALINN_GUARD
    uint count = 0u;
    for (uint i = 0u; i < n; ++i)
        count += x[i & 1u];
    y[0] = count;
}
"""
#: the loop the probe runs: longer than any limit seen (llvmpipe's 65535)
_LOOP_PROBE_ITERATIONS = 1 << 20


#: work-groups one dimension of a dispatch may hold: GL_MAX_COMPUTE_WORK_GROUP_COUNT's least value
#: (OpenGL ES 3.1 and desktop GL 4.3 alike; llvmpipe's and NVIDIA's y and z)
MAX_GROUPS = 65535
#: the words of MalinnArgs before a kernel's scalars: malinn_range0, malinn_range1, malinn_fold
_RANGE_WORDS = 3


def fold_groups(groups: tuple) -> tuple:
    """``(dispatch, fold)``: the ``glDispatchCompute`` counts that run ``groups`` work-groups (one or
    two dimensions) and the x fold the shaders' ``MALINN_GROUP_X``/``_Y`` read; ``(None, 0)`` where
    even folded they do not fit.

    A dimension of more than :data:`MAX_GROUPS` work-groups is split into ``f`` parts along z (x's
    parts at ``z % fold_x``, y's at ``z / fold_x``); the parts round up, so a folded dispatch runs a
    few work-groups past the range, which ``MALINN_GUARD``/``MALINN_GROUP_GUARD`` drop."""
    gx, gy = (tuple(groups) + (1,))[:2]
    fx, fy = -(-gx // MAX_GROUPS), -(-gy // MAX_GROUPS)
    if fx * fy > MAX_GROUPS:
        return None, 0
    return (-(-gx // fx), -(-gy // fy), fx * fy), fx


def _moderngl():
    import moderngl  # the optional extra: imported on first use, so malinn works without it

    return moderngl


def gl_index_macro(layout: Layout, name: str) -> str:
    """A GLSL macro ``name(r, c, prows, pcols)`` computing :meth:`Layout.index` in ``uint``.

    The expression of the OpenCL macro (``Layout.index_expression``), with unsigned literals: GLSL
    converts no ``int`` to ``uint`` implicitly.
    """
    body = layout.index_expression("u", "(uint(R_))", "(uint(C_))", "uint(P_R)", "uint(P_C)")
    return f"#define {name}(R_, C_, P_R, P_C) ({body})"


def _preamble(options: tuple, local: tuple, folded: bool = False) -> str:
    """``#version``, the defines of ``options`` (``-DNAME=VALUE``), the work-group shape and the
    argument-block, index and range-guard macros every GL source uses; ``folded``: the indices of a
    dispatch folded along z (:func:`fold_groups`), else the plain built-ins (no cost where no
    launch needs the fold: NVIDIA's GL ran a gemm_keras head 19% slower with the folded ones)."""
    # NVIDIA's GLSL compiler unrolls a constant-bound loop only when asked (OpenCL C's kernels say
    # #pragma unroll): unrolled, a work item's tile of sums stays in registers; other compilers
    # ignore the pragma, as GLSL requires of one they do not know
    lines = [PREAMBLE_VERSION, "#pragma optionNV(unroll all)", "precision highp float;", "precision highp int;"]
    for option in options:
        if not option.startswith("-D"):
            raise KernelBuildError(f"option {option!r}: the OpenGL backend takes -DNAME=VALUE defines only")
        name, _, value = option[2:].partition("=")
        lines.append(f"#define {name} {value or 1}")
    lx, ly = (tuple(local) + (1, 1))[:2]
    lines += [
        f"#define MALINN_LOCAL_X {lx}",
        f"#define MALINN_LOCAL_Y {ly}",
        f"layout(local_size_x = {lx}, local_size_y = {ly}, local_size_z = 1) in;",
        "#define MALINN_ARGS(members) layout(std140, binding = 0) uniform MalinnArgs "
        "{ uint malinn_range0; uint malinn_range1; uint malinn_fold; members };",
    ]
    if folded:
        lines += [
            # a range of more work-groups than one dimension dispatches is folded into the third
            # (GLDevice.bind): z = fold_x * fold_y, x folds at z % malinn_fold, y at z / malinn_fold
            "#define MALINN_GROUP_X (gl_WorkGroupID.x + (gl_WorkGroupID.z % malinn_fold) * gl_NumWorkGroups.x)",
            "#define MALINN_GROUP_Y (gl_WorkGroupID.y + (gl_WorkGroupID.z / malinn_fold) * gl_NumWorkGroups.y)",
            "#define MALINN_GLOBAL_X (MALINN_GROUP_X * uint(MALINN_LOCAL_X) + gl_LocalInvocationID.x)",
            "#define MALINN_GLOBAL_Y (MALINN_GROUP_Y * uint(MALINN_LOCAL_Y) + gl_LocalInvocationID.y)",
            # a kernel that indexes work-groups (and has barriers) drops the fold's extra groups
            "#define MALINN_GROUP_GUARD if (MALINN_GROUP_X * uint(MALINN_LOCAL_X) >= malinn_range0 || "
            "MALINN_GROUP_Y * uint(MALINN_LOCAL_Y) >= malinn_range1) return;",
        ]
    else:
        lines += [
            "#define MALINN_GROUP_X gl_WorkGroupID.x",
            "#define MALINN_GROUP_Y gl_WorkGroupID.y",
            "#define MALINN_GLOBAL_X gl_GlobalInvocationID.x",
            "#define MALINN_GLOBAL_Y gl_GlobalInvocationID.y",
            "#define MALINN_GROUP_GUARD",
        ]
    lines += [
        "#define MALINN_GUARD if (MALINN_GLOBAL_X >= malinn_range0 || MALINN_GLOBAL_Y >= malinn_range1) return;",
        "#define MALINN_INFINITY uintBitsToFloat(0x7F800000u)",
    ]
    return "\n".join(lines) + "\n"


class _GL:
    """The few GL entry points moderngl does not wrap (program binaries, integer limits), through
    ``eglGetProcAddress``."""

    def __init__(self):
        egl = ctypes.CDLL("libEGL.so.1")
        egl.eglGetProcAddress.restype = ctypes.c_void_p
        egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]

        def fn(name, *argtypes, restype=None):
            address = egl.eglGetProcAddress(name.encode())
            if not address:
                return None
            return ctypes.CFUNCTYPE(restype, *argtypes)(address)

        u, i, p = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p
        self.get_integerv = fn("glGetIntegerv", u, p)
        self.get_integeri_v = fn("glGetIntegeri_v", u, u, p)
        self.get_programiv = fn("glGetProgramiv", u, u, p)
        self.get_program_binary = fn("glGetProgramBinary", u, i, p, p, p)
        self.program_binary = fn("glProgramBinary", u, u, p, i)
        self.program_parameteri = fn("glProgramParameteri", u, u, i)
        self.create_program = fn("glCreateProgram", restype=u)
        self.delete_program = fn("glDeleteProgram", u)
        self.use_program = fn("glUseProgram", u)
        self.dispatch_compute = fn("glDispatchCompute", u, u, u)
        self.flush = fn("glFlush")
        self.get_uniform_block_index = fn("glGetUniformBlockIndex", u, ctypes.c_char_p, restype=u)
        self.get_active_uniform_blockiv = fn("glGetActiveUniformBlockiv", u, u, u, p)
        # timer queries (desktop OpenGL 3.3+; OpenGL ES through GL_EXT_disjoint_timer_query)
        self.gen_queries = fn("glGenQueries", i, p)
        self.delete_queries = fn("glDeleteQueries", i, p)
        self.query_counter = fn("glQueryCounter", u, u) or fn("glQueryCounterEXT", u, u)
        self.get_query_object_ui64v = (fn("glGetQueryObjectui64v", u, u, p)
                                       or fn("glGetQueryObjectui64vEXT", u, u, p))

    @property
    def has_binaries(self) -> bool:
        """Whether every entry point that program binaries need was found."""
        return all((self.get_programiv, self.get_program_binary, self.program_binary, self.create_program,
                    self.delete_program, self.use_program, self.dispatch_compute, self.get_uniform_block_index,
                    self.get_active_uniform_blockiv))

    @property
    def has_queries(self) -> bool:
        """Whether every entry point that timer queries need was found."""
        return all((self.gen_queries, self.delete_queries, self.query_counter, self.get_query_object_ui64v))

    def program_integer(self, program: int, pname: int) -> int:
        value = ctypes.c_int(0)
        self.get_programiv(program, pname, ctypes.byref(value))
        return int(value.value)

    def integer(self, pname: int) -> int:
        value = (ctypes.c_int * 4)()
        self.get_integerv(pname, value)
        return int(value[0])

    def indexed_integer(self, pname: int, index: int) -> int:
        value = (ctypes.c_int * 4)()
        self.get_integeri_v(pname, index, value)
        return int(value[0])


class ContextLock:
    """A GL device's lock: a re-entrant lock that also keeps the device's context current in the
    thread holding it, made current on the outermost acquire and released (its freed objects
    collected first) on the outermost release. A plan's run holds ``Device.lock`` across its
    upload, launches and download, so a predict makes the context current once, not once per call
    (releasing a context flushes it on some drivers)."""

    def __init__(self, device: "GLDevice"):
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
        self._depth -= 1
        try:
            if self._depth == 0:
                try:
                    self._device.ctx.gc()
                finally:
                    self._device.ctx.__exit__(None, None, None)
        finally:
            self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


@dataclass(eq=False)
class GLDevice(Device):
    """An OpenGL device: a headless EGL context holding OpenGL 4.3+ or OpenGL ES 3.1."""

    ctx: object = field(repr=False, default=None)
    gl: object = field(repr=False, default=None)
    binary_formats: int = 0
    #: flush the first of several dispatches at once (:meth:`_launch`); benchmarks/gl_flush.py turns it off
    flush_first_dispatch = True

    def __post_init__(self):
        self.lock = ContextLock(self)

    # ---------------------------------------------------------------- the current context
    def __enter__(self):
        self.lock.acquire()
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False

    def _error(self) -> str | None:
        error = self.ctx.error
        return None if error == "GL_NO_ERROR" else error

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int, what: str):
        if nbytes > self.max_allocation:
            raise DeviceError(f"{what}: {size_text(nbytes)} exceeds the largest single allocation of "
                              f"{self.name} ({size_text(self.max_allocation)}: its largest shader storage buffer)"
                              f"{ALLOCATION_HINT}")
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

    def upload(self, buffer, array, blocking: bool = True, what: str = "data", mapped: bool | None = None) -> None:
        with self:
            try:
                buffer.write(np.ascontiguousarray(array))
            except Exception as exc:
                raise DeviceError(f"uploading {what} ({array.nbytes} bytes) to {self.name} failed ({exc})") from exc
        self.counters["uploads"] += 1

    def download(self, buffer, out, blocking: bool = True, what: str = "data", mapped: bool | None = None) -> None:
        with self:
            try:
                self.ctx.memory_barrier()
                buffer.read_into(out, size=out.nbytes)
            except Exception as exc:
                raise DeviceError(f"downloading {what} ({out.nbytes} bytes) from {self.name} failed ({exc})") from exc
        self.counters["downloads"] += 1

    def fill_zero(self, buffer, nbytes: int, what: str = "buffer") -> None:
        with self:
            try:
                self.ctx.memory_barrier()
                buffer.clear(size=int(nbytes))
            except Exception as exc:
                raise DeviceError(f"clearing {what} ({nbytes} bytes) on {self.name} failed ({exc})") from exc

    def image_from(self, buffer, width: int, height: int, what: str = "image"):
        raise DeviceError(f"{what}: the OpenGL backend passes no image operands ({self.name}); "
                          "choose a kernel without \"image\" restrictions")

    def finish(self) -> None:
        with self:
            self.ctx.finish()

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>"):
        """A :class:`GLProgram` for ``source`` and ``options``, memoised; it is linked (and its
        build errors raised) once per work-group shape, when bound.

        Raises:
            BackendError: ``options`` ask for half arithmetic (``HALF_ARITHMETIC``), which no GL
                shader does, or for half or int8 weights (``WEIGHT_BITS`` 16 or 8) from a source
                that does not read them (one without ``gl/weights.glsl``).
        """
        refused = [o for o in options if o.partition("=")[0] in _FP32_ONLY and o.partition("=")[2] not in ("0", "32")
                   and (o.startswith("-DHALF_ARITHMETIC") or _WEIGHTS_MARK not in source)]
        if refused:
            raise BackendError(f"{origin}: {' '.join(refused)} asks for a weight precision this GL shader does not "
                               f"read ({self.name}): fp32 everywhere, fp16-storage and int8-weights in the shaders "
                               f"that include gl/weights.glsl, fp16 on OpenCL devices only")
        key = (source, tuple(options))
        programs = self.cache.setdefault("programs", {})
        with self.lock:
            program = programs.get(key)
            if program is None:
                program = programs[key] = GLProgram(self, source, tuple(options), origin)
        return program

    def render_index(self, layout: Layout, name: str) -> str:
        return gl_index_macro(layout, name)

    # ---------------------------------------------------------------- launches
    def bind(self, program, function: str, args: list, global_size: tuple, local_size, what: str = "",
             name: str | None = None):
        name = name or function
        global_size = tuple(int(g) for g in global_size)
        local = tuple(local_size) if local_size else DEFAULT_LOCAL[len(global_size)]
        groups = tuple(-(-g // l) for g, l in zip(global_size, local))
        dispatch, fold = fold_groups(groups)
        if dispatch is None:
            raise DeviceError(f"{what}: kernel {name} over range {global_size} needs {groups} work-groups, "
                              f"more than {self.name} dispatches ({MAX_GROUPS} per dimension, "
                              f"{MAX_GROUPS} x {MAX_GROUPS} folded): predict fewer samples at a time "
                              f"(batch_size, --batch-size) or run the model on an OpenCL device")
        scalars = [a for a in args if isinstance(a, (np.uint32, np.float32))]
        buffers = [a for a in args if not isinstance(a, (np.uint32, np.float32))]
        with self:
            shader = program.linked(local, folded=dispatch[2] > 1)
            try:
                block = shader["MalinnArgs"]
            except KeyError:
                raise KernelBuildError(f"{program.origin}: the shader declares no MALINN_ARGS block") from None
            words = np.zeros(max(block.size // 4, _RANGE_WORDS + len(scalars)), np.uint32)
            words[0] = global_size[0]
            words[1] = global_size[1] if len(global_size) > 1 else 1
            words[2] = fold
            for i, value in enumerate(scalars):
                words[_RANGE_WORDS + i] = np.asarray(value).view(np.uint32)
            if block.size < 4 * (_RANGE_WORDS + len(scalars)):
                raise KernelBuildError(f"{program.origin}: MALINN_ARGS holds {block.size // 4 - _RANGE_WORDS} "
                                       f"scalars, the library passes {len(scalars)}")
            uniforms = self.ctx.buffer(words.tobytes())
        handle = (shader, uniforms, tuple(buffers), dispatch)
        bound = BoundLaunch(name, global_size, local, handle, None, what=what or name)
        bound.enqueue = lambda: self._timed([bound])
        return bound

    def _timed(self, launches: list) -> "GLEvent":
        """Runs ``launches`` to completion: an event whose profile is their device time (from the
        timestamp before the first to the one after the last, :meth:`launch_seconds`) where the
        context has timer queries, else their wall time until the device finished (GL has no
        per-launch events; the tuner and benchmarks time with it)."""
        if self.timer_queries:
            stamps = self._stamps(launches)
            return GLEvent(stamps[0][0], stamps[-1][1])
        with self:
            self.ctx.finish()
            start = time.perf_counter_ns()
            self.launch_all(launches)
            self.ctx.finish()
            return GLEvent(start, time.perf_counter_ns())

    def launch_all(self, launches: list) -> None:
        self._launch(launches)

    def _launch(self, launches: list, queries=None) -> None:
        """:meth:`launch_all`; with ``queries`` (two query names per launch), a ``GL_TIMESTAMP``
        right before each dispatch and right after it (its bindings and barrier outside).

        Without queries, the first dispatch of several is flushed (``glFlush``) at once: a driver
        may hold commands until something waits on them, and the GPU then starts only once the
        host has issued every launch (NVIDIA's GL: a predict 1-4% sooner on Table 10.5's Full
        networks, benchmarks/gl_flush.py)."""
        with self:
            for q, launch in enumerate(launches):
                shader, uniforms, buffers, (gx, gy, gz) = launch.handle
                uniforms.bind_to_uniform_block(0)
                for i, buffer in enumerate(buffers):
                    buffer.bind_to_storage_buffer(i)
                if queries is not None:
                    self.gl.query_counter(queries[2 * q], _TIMESTAMP)
                shader.run(gx, gy, gz)
                if queries is not None:
                    self.gl.query_counter(queries[2 * q + 1], _TIMESTAMP)
                self.ctx.memory_barrier(_SHADER_STORAGE_BARRIER_BIT)
                if q == 0 and queries is None and len(launches) > 1 and self.flush_first_dispatch and self.gl.flush:
                    self.gl.flush()
            error = self._error()
            if error:
                raise launch_error(launches, self.name, error)
            self.counters["launches"] += len(launches)

    @property
    def timer_queries(self) -> bool:
        """Whether the context records the device's time (``GL_TIMESTAMP`` queries) around compute
        dispatches: desktop OpenGL 3.3+ (every ``gl`` device's desktop context), OpenGL ES with
        ``GL_EXT_disjoint_timer_query``. Not on a ``gles3`` device: its launches are draws, which
        llvmpipe stamps at 70-100 ns whatever they cost."""
        known = self.cache.get("timer_queries")
        if known is None:
            extensions = self.ctx.extensions
            if not self.gl.has_queries or self.backend != "gl":
                known = False
            elif self.platform.startswith("OpenGL ES"):
                known = "GL_EXT_disjoint_timer_query" in extensions
            else:
                known = self.ctx.version_code >= 330 or "GL_ARB_timer_query" in extensions
            self.cache["timer_queries"] = known
        return known

    def launch_seconds(self, launches: list) -> list:
        """Runs ``launches`` as :meth:`launch_all` runs them, each dispatch between two
        ``GL_TIMESTAMP`` queries (issued right before and after it: its bindings and barrier are
        outside), and returns each one's device seconds: the twin of OpenCL's profiling events, for
        the benchmarks' per-step times (``benchmarks/models.py``: ``step_seconds``). A timestamp is
        taken when the commands before it have finished, so a launch's time also holds any wait of
        the device for its dispatch command (the host's time for one call, where the device runs
        ahead of the host).

        Args:
            launches: bound launches of this device (:meth:`bind`).

        Returns:
            list[float]: seconds per launch, in order, once the device has run them all.

        Raises:
            BackendError: the context has no timer queries (:attr:`timer_queries`: OpenGL ES
                without ``GL_EXT_disjoint_timer_query``).
            DeviceError: a launch failed (as :meth:`launch_all`).
        """
        if not self.timer_queries:
            raise BackendError(f"{self.name} ({self.platform}) has no GL timer queries (GL_TIMESTAMP: desktop "
                               "OpenGL 3.3, or OpenGL ES with GL_EXT_disjoint_timer_query)")
        return [(end - start) * 1e-9 for start, end in self._stamps(launches)]

    def _stamps(self, launches: list) -> list:
        """The device's timestamps (ns) right before and after each of ``launches``' dispatches, run
        as :meth:`launch_all` runs them, once all have run."""
        gl, count = self.gl, 2 * len(launches)
        queries = (ctypes.c_uint * max(count, 1))()
        result = ctypes.c_uint64(0)
        with self:
            gl.gen_queries(count, queries)
            try:
                self._launch(launches, queries)
                stamps = []
                for query in queries[:count]:
                    gl.get_query_object_ui64v(query, _QUERY_RESULT, ctypes.byref(result))   # waits for it
                    stamps.append(result.value)
            finally:
                gl.delete_queries(count, queries)
            error = self._error()
            if error:
                raise DeviceError(f"timing {len(launches)} launches on {self.name} failed ({error})")
        return list(zip(stamps[0::2], stamps[1::2]))


def launch_error(launches: list, device_name: str, error: str) -> DeviceError:
    """The error of a batch of GL launches: GL reports one error state for the batch (checking it
    after each launch would cost every predict), so the message names the launches, at most four."""
    names = [f"{b.what}: {b.function} over {b.global_size}" for b in launches]
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    which = f"one of {len(names)} launches ({listed})" if len(names) > 1 else f"launching {listed}"
    return DeviceError(f"{which} on {device_name} failed ({error})")


class GLEvent:
    """What one enqueued GL launch returns: already complete, with ``profile.start``/``end`` in ns."""

    __slots__ = ("profile",)

    def __init__(self, start: int, end: int):
        self.profile = type("Profile", (), {"start": start, "end": end})()

    def wait(self) -> None:
        """Nothing to wait for: the launch finished before the event was made."""


class GLProgram:
    """A compute-shader source and its defines, linked once per work-group shape.

    Linked programs are cached on disk as program binaries (``glGetProgramBinary``) where the driver
    offers them, through :mod:`malinn.io.cache` like the OpenCL backend's (``MALINN_BINARY_CACHE=0``
    turns it off).
    """

    def __init__(self, device: GLDevice, source: str, options: tuple, origin: str):
        self.device, self.source, self.options, self.origin = device, source, options, origin
        self.shaders = {}

    def text(self, local: tuple, folded: bool = False) -> str:
        """The full GLSL source for work-group shape ``local`` (``folded``: for a dispatch folded
        along z, :func:`fold_groups`)."""
        return _preamble(self.options, local, folded) + self.source

    def linked(self, local: tuple, folded: bool = False):
        """The compute shader for ``local`` (and a folded dispatch): loaded from the program-binary
        cache where an entry for this text, device and driver is there and the driver takes it, else
        built by moderngl from the source (and its binary cached); KernelBuildError with the
        compiler's log."""
        shader = self.shaders.get((local, folded))
        if shader is None:
            device = self.device
            text = self.text(local, folded)
            key = self.binary_key(local, text)
            shader = self._from_binary(key)
            if shader is None:
                try:
                    shader = device.ctx.compute_shader(text)
                except Exception as exc:
                    raise KernelBuildError(f"{self.origin}: the GLSL compute shader did not build on {device.name} "
                                           f"(options {' '.join(self.options) or 'none'}, work-group {local}):\n"
                                           f"{str(exc).strip()}") from None
                device.count("builds")
                self._to_binary(key, shader.glo)
            self.shaders[(local, folded)] = shader
        return shader

    def binary_key(self, local: tuple, text: str) -> dict | None:
        """The full key of this program's binary in the cache, keyed like the OpenCL backend's (the
        source's hash, the defines, the renderer and the driver), with the work-group shape; ``None``
        where binaries are off (``MALINN_BINARY_CACHE=0``) or the driver offers no binary format."""
        device = self.device
        if (not switch("MALINN_BINARY_CACHE", True) or not device.binary_formats
                or not device.gl.has_binaries):
            return None
        return {"backend": "gl", "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "options": list(self.options), "local": list(local), "device": device.name,
                "vendor": device.vendor, "driver": device.driver_version, "platform": device.platform}

    def _from_binary(self, key):
        """A :class:`BinaryShader` from the cache entry for ``key``, or ``None`` (no entry, or the
        driver refuses it: a driver update; the caller then builds from source)."""
        if key is None:
            return None
        payload = read_entry("programs", key)
        if payload is None or len(payload) < 5:
            return None
        device, gl = self.device, self.device.gl
        binary_format, = struct.unpack("<I", payload[:4])
        blob = payload[4:]
        program = gl.create_program()
        gl.program_binary(program, binary_format, blob, len(blob))
        device._error()   # clears an INVALID_ENUM for a format the driver no longer offers
        if not program or not gl.program_integer(program, _LINK_STATUS):
            gl.delete_program(program)
            return None
        index = gl.get_uniform_block_index(program, b"MalinnArgs")
        size = ctypes.c_int(0)
        if index != _INVALID_INDEX:
            gl.get_active_uniform_blockiv(program, index, _UNIFORM_BLOCK_DATA_SIZE, ctypes.byref(size))
        device.count("binary_hits")
        return BinaryShader(gl, program, None if index == _INVALID_INDEX else size.value)

    def _to_binary(self, key, program: int) -> None:
        """Writes the linked program's binary to the cache (nothing where the driver gives none)."""
        if key is None:
            return
        gl = self.device.gl
        length = gl.program_integer(program, _PROGRAM_BINARY_LENGTH)
        if length <= 0:
            return
        blob = ctypes.create_string_buffer(length)
        written, binary_format = ctypes.c_int(0), ctypes.c_uint(0)
        gl.get_program_binary(program, length, ctypes.byref(written), ctypes.byref(binary_format), blob)
        if self.device._error() is None and written.value > 0:
            write_entry("programs", key, struct.pack("<I", binary_format.value) + blob.raw[:written.value])


class BinaryShader:
    """A compute shader made from a cached program binary (moderngl builds only from source): what
    :meth:`GLDevice.bind` and :meth:`GLDevice.launch_all` use of moderngl's ``ComputeShader``, its
    ``MalinnArgs`` block's size and ``run``. The program lives as long as the device's context."""

    __slots__ = ("gl", "glo", "block")

    def __init__(self, gl: _GL, program: int, block_size: int | None):
        self.gl, self.glo = gl, program
        self.block = None if block_size is None else type("UniformBlock", (), {"size": block_size})()

    def __getitem__(self, name: str):
        if name != "MalinnArgs" or self.block is None:
            raise KeyError(name)
        return self.block

    def run(self, group_x: int = 1, group_y: int = 1, group_z: int = 1) -> None:
        self.gl.use_program(self.glo)
        self.gl.dispatch_compute(group_x, group_y, group_z)


# -------------------------------------------------------------------- discovery
def _total_memory(ctx, gl: _GL, software: bool, max_allocation: int) -> int:
    """The device's memory: NVIDIA's figure where it gives one, else the host's (a CPU renderer, or a
    board whose GPU shares the host's memory); GL has no standard query."""
    if "GL_NVX_gpu_memory_info" in ctx.extensions:
        return gl.integer(_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX) * 1024
    try:
        return max(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), max_allocation)
    except (ValueError, OSError, AttributeError):
        return max_allocation


#: the desktop OpenGL version whose compute shaders (and GLSL ES 3.10) the backend needs
REQUIRED_GL = 430
#: the glcontext backend name under which :class:`~malinn.backends.gles_context.ESContext` is found
ES_BACKEND = "malinn-gles"


def _register_es_backend() -> None:
    """Lets moderngl make its context through :class:`ESContext` (``backend="malinn-gles"``):
    glcontext finds backends by name only, and its EGL backend binds desktop OpenGL alone."""
    import glcontext  # moderngl's own dependency

    if getattr(glcontext.get_backend_by_name, "malinn_gles", False):
        return
    by_name = glcontext.get_backend_by_name

    def get_backend_by_name(name):
        if name == ES_BACKEND:
            return lambda mode="standalone", glversion=310, device_index=0, **settings: ESContext(int(device_index))
        return by_name(name)

    get_backend_by_name.malinn_gles = True
    glcontext.get_backend_by_name = get_backend_by_name


def _es_context(index: int):
    """A moderngl context over an OpenGL ES 3.1+ context on EGL device ``index`` (raises on failure)."""
    _register_es_backend()
    return _moderngl().create_context(standalone=True, backend=ES_BACKEND, device_index=index, require=310)


def requested_gl_api() -> str:
    """``MALINN_GL_API``: ``"es"`` (an OpenGL ES context only), ``"gl"`` (a desktop one only) or
    ``""`` (unset: either).

    Raises:
        DeviceError: another value (a typo would otherwise be ignored).
    """
    api = os.environ.get("MALINN_GL_API", "").strip().lower()
    if api not in ("", "es", "gl"):
        raise DeviceError(f"MALINN_GL_API={api!r} is neither 'gl' (desktop OpenGL only) nor 'es' (OpenGL ES "
                          "only); unset it for either")
    return api


def _context(index: int):
    """A headless context on EGL device ``index``: desktop OpenGL 4.3+, else OpenGL ES 3.1+ (the
    Raspberry Pi's V3D has compute shaders in ES alone); ``MALINN_GL_API=es`` for OpenGL ES only,
    ``MALINN_GL_API=gl`` for desktop OpenGL only.

    Raises:
        DeviceError: the device makes neither; the message names the renderer and the version it
            offers (compute shaders came with OpenGL 4.3 and OpenGL ES 3.1).
        Exception: moderngl's own, when no context can be made at all (past the last device, ...).
    """
    moderngl = _moderngl()
    api = requested_gl_api()
    # the runtime packages' names (libgl1, libegl1 ship only the .so.1; glcontext asks for the
    # development links libGL.so / libEGL.so by default)
    libraries = {"libgl": "libGL.so.1", "libegl": "libEGL.so.1"}
    if api == "es":
        return _es_context(index)
    try:
        return moderngl.create_context(standalone=True, backend="egl", device_index=index, require=REQUIRED_GL,
                                       **libraries)
    except Exception as exc:
        if "requested device index" in str(exc):
            raise
        failure = exc
    es_failure = None
    if api != "gl":
        try:
            return _es_context(index)
        except Exception as exc:
            es_failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for version in (330, 210):   # what the device offers instead, to say so
        try:
            ctx = moderngl.create_context(standalone=True, backend="egl", device_index=index, require=version,
                                          **libraries)
        except Exception:
            continue
        try:
            info = ctx.info
            renderer, offered = str(info["GL_RENDERER"]).strip(), str(info["GL_VERSION"]).strip()
        finally:
            ctx.release()
        raise DeviceError(f"{renderer} offers OpenGL {offered}" + (f" and no OpenGL ES 3.1 ({es_failure})"
                                                                    if es_failure else "")
                          + f"; malinn's GL kernels are compute shaders, which need OpenGL "
                          f"{REQUIRED_GL // 100}.{REQUIRED_GL // 10 % 10} or OpenGL ES 3.1 (without them: the gles3 "
                          "backend's vertex shaders, backends/gl_feedback.py)") from None
    raise failure


def probe(index: int) -> GLDevice:
    """Creates a headless context on EGL device ``index`` and runs the probe shader; raises on failure."""
    ctx = _context(index)
    ctx.gc_mode = "context_gc"
    try:
        gl = _GL()
        info = ctx.info
        ctx.error   # moderngl's info asks for desktop-only limits on an ES context: clear the GL error
        renderer, version = str(info["GL_RENDERER"]).strip(), str(info["GL_VERSION"]).strip()
        software = any(s in renderer.lower() for s in SOFTWARE_RENDERERS)
        es = version.startswith("OpenGL ES")
        if not es and "GL_ARB_ES3_1_compatibility" not in ctx.extensions and ctx.version_code < 460:
            raise DeviceError(f"{renderer} compiles no GLSL ES 3.10 (no GL_ARB_ES3_1_compatibility)")
        max_allocation = gl.integer(_MAX_SHADER_STORAGE_BLOCK_SIZE)
        sizes = tuple(gl.indexed_integer(_MAX_COMPUTE_WORK_GROUP_SIZE, i) for i in range(3))
        formats = gl.integer(0x87FE) if gl.get_program_binary else 0   # GL_NUM_PROGRAM_BINARY_FORMATS
        device = GLDevice(
            backend="gl", index=("gl", index), name=renderer, platform=version if es else f"OpenGL {version}",
            vendor=str(info["GL_VENDOR"]).strip(), type="CPU" if software else "GPU", compute_units=1,
            global_memory=_total_memory(ctx, gl, software, max_allocation), max_allocation=max_allocation,
            max_work_group_size=gl.integer(_MAX_COMPUTE_WORK_GROUP_INVOCATIONS), max_work_item_sizes=sizes,
            local_memory=gl.integer(_MAX_COMPUTE_SHARED_MEMORY_SIZE), image_support=False,
            image2d_max_size=(0, 0), opencl_c_version="GLSL ES 3.10",
            driver_version=version, host_unified_memory=False,   # no mapped transfers
            ctx=ctx, gl=gl, binary_formats=formats)
        ctx.error
    finally:
        ctx.__exit__(None, None, None)   # create_context left it current in this thread
    device = run_probe(device, _PROBE_SOURCE, "the probe shader")
    device.max_loop_iterations = loop_limit(device)
    return device


def loop_limit(device: "GLDevice", source: str = _LOOP_PROBE_SOURCE, dtype=np.uint32,
               local: tuple | None = (1,)) -> int | None:
    """The iterations after which ``device``'s driver ends a shader invocation's loops, silently
    (llvmpipe's 65535: Mesa's LP_MAX_TGSI_LOOP_ITERATIONS), or None where a loop of
    :data:`_LOOP_PROBE_ITERATIONS` runs to its end. ``source`` counts a loop of ``n`` iterations
    over two ones of ``dtype`` into its one output (a compute shader here; the gles3 backend
    passes its vertex-stage twin)."""
    x, y = np.ones(2, dtype), np.zeros(1, dtype)
    xb, yb = device.alloc(x.nbytes, "loop probe input"), device.alloc(y.nbytes, "loop probe output")
    program = device.compile(source, origin="the loop probe shader")
    device.upload(xb, x)
    device.bind(program, "main", [np.uint32(_LOOP_PROBE_ITERATIONS), xb, yb], (1,), local, what="loop probe")()
    device.download(yb, y)
    device.counters.update({key: 0 for key in device.counters})
    return int(y[0]) if int(y[0]) < _LOOP_PROBE_ITERATIONS else None


def run_probe(device: "GLDevice", source: str, origin: str) -> "GLDevice":
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


def wanted(others: list) -> bool:
    """Whether a discovery without an explicit request looks for OpenGL devices: ``MALINN_GL=1``
    always, ``MALINN_GL=0`` never, else only where no OpenCL GPU works (the choice order puts an
    OpenGL GPU after any OpenCL GPU). Mesa's drivers bring an LLVM of their own, and importing
    TensorFlow into a process that loaded one crashes it: where OpenCL serves, Mesa stays unloaded."""
    setting = switch("MALINN_GL", None)
    if setting is not None:
        return setting
    return not any(d.kind == "gpu" for d in others)


def discover(others: list | None = None, force: bool = False) -> list:
    """Every working OpenGL device (EGL devices in order), probed; warnings for the rest.

    Args:
        others: the devices other backends found (see :func:`wanted`).
        force: look even where :func:`wanted` says not to (``set_device("gl")`` asked), unless
            ``MALINN_GL=0``.

    Nothing is listed when moderngl is not installed (``pip install malinn[gl]``), or when
    TensorFlow is loaded in the process (Mesa's llvmpipe brings an LLVM of its own, as PoCL does).
    """
    if switch("MALINN_GL", None) is False or not (force or wanted(others or [])):
        return []
    if switch("MALINN_GL_NO_COMPUTE", False):   # every device as gles3 (gl_feedback.py)
        return []
    try:
        _moderngl()
    except ImportError:
        return []
    if "tensorflow" in sys.modules:
        warnings.warn("malinn: skipping the OpenGL devices: TensorFlow is loaded in this process, and Mesa's "
                      "drivers bring an LLVM of their own; run TensorFlow in another process", stacklevel=3)
        return []
    try:
        requested_gl_api()
    except DeviceError as exc:
        warnings.warn(f"malinn: skipping the OpenGL devices: {exc}", stacklevel=3)
        return []
    found = []
    for index in range(16):
        try:
            found.append(probe(index))
        except Exception as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "requested device index" in text:   # past the last EGL device
                break
            warnings.warn(f"malinn: skipping OpenGL device gl:{index}: {text}", stacklevel=3)
    return found
