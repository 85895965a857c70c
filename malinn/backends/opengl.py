"""The OpenGL backend: GLSL ES 3.10 compute shaders through moderngl, headless through EGL.

It serves the boards that have a capable GPU and no OpenCL driver (Raspberry Pi 4/5, Mali on
Panfrost): the same model file runs there, on the same kernel-library entries, each entry naming
its GLSL source under ``"sources": {"gl": ...}`` (``kernels/gl/``). moderngl is an optional extra
(``pip install malinn[gl]``), imported by ``gl_context.py`` alone.

The modules of the GL backends (docs/BACKENDS.md):

* ``gl_context.py``: the headless contexts (desktop OpenGL through glcontext's EGL backend, OpenGL
  ES through ``gles_context.py``) and the figures read from them;
* ``gl_functions.py``: the GL entry points moderngl does not wrap (ctypes);
* ``gl_base.py``: the device both GL backends share (the context current under the device's lock,
  buffers, the program memo, the ``MalinnArgs`` block) and the steps of discovery;
* ``gl_programs.py``: this backend's compute shaders (the preamble, the fold of a long range into
  z, the program-binary cache);
* this module: the compute-shader device (:class:`GLDevice`: bound launches, timer queries), its
  probe and its discovery; ``gl_feedback.py``: the ``gles3`` backend's vertex-stage kernels.

How the OpenCL notions map:

* a buffer is a shader storage buffer; upload and download are ``glBufferSubData`` /
  ``glGetBufferSubData`` (blocking: the driver copies before returning);
* a program is a compute shader linked once per work-group shape (``gl_programs.py``);
* arguments: the scalars (``uint``/``float``, in the library's ``arglist`` order) fill the uniform
  block ``MalinnArgs`` at binding 0, after the launch's range and fold; the buffers go to
  storage-buffer bindings 0, 1, ... in ``buffers`` order;
* a range not divisible by the work-group is rounded up, and the shader returns early past
  ``malinn_range`` (``MALINN_GUARD``); kernels with barriers always get a dividing work-group;
* a range of more work-groups than a dimension dispatches (65535) is folded into z
  (:func:`~malinn.backends.gl_programs.fold_groups`);
* launches are dispatched in order with a storage-buffer barrier after each; profiling events are
  ``GL_TIMESTAMP`` queries around a launch (``launch_seconds``, a bound launch's ``enqueue``);
* a context is current in one thread at a time: every call makes it current for its duration
  (under the device's lock) and restores the caller's context after.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError, DeviceError, KernelBuildError
from .base import BoundLaunch
from .gl_base import (
    GLBaseDevice,
    GLEvent,
    args_block,
    gl_index_macro,
    launch_error,
    looks_for_devices,
    loop_limit,
    no_compute,
    probe_each,
    run_probe,
    split_args,
    wanted,
)
from .gl_context import SOFTWARE_RENDERERS, ContextFigures, compute_context, total_memory
from .gl_functions import GLFunctions
from .gl_programs import MAX_GROUPS, PREAMBLE_VERSION, BinaryShader, GLProgram, fold_groups, refused_options

# the backend's public names, some defined in the shared GL modules
__all__ = [
    "GLDevice",
    "discover",
    "probe",
    "wanted",
    "gl_index_macro",
    "loop_limit",
    "fold_groups",
    "BinaryShader",
    "DEFAULT_LOCAL",
    "PREAMBLE_VERSION",
    "SOFTWARE_RENDERERS",
]

#: the work-group shape of a launch whose kernel names none (a rounded-up range, guarded)
DEFAULT_LOCAL = {1: (64,), 2: (8, 8)}
_SHADER_STORAGE_BARRIER_BIT = 0x2000
_MAX_COMPUTE_SHARED_MEMORY_SIZE = 0x8262
_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE
_MAX_COMPUTE_WORK_GROUP_INVOCATIONS = 0x90EB
_MAX_COMPUTE_WORK_GROUP_SIZE = 0x91BF  # per axis (glGetIntegeri_v)
_NUM_PROGRAM_BINARY_FORMATS = 0x87FE
_TIMESTAMP = 0x8E28
_QUERY_RESULT = 0x8866

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


@dataclass(eq=False)
class GLDevice(GLBaseDevice):
    """An OpenGL device: a headless EGL context holding OpenGL 4.3+ or OpenGL ES 3.1.

    Its programs are :class:`~malinn.backends.gl_programs.GLProgram` objects, cached as binaries
    where the driver offers program-binary formats (``binary_formats``).
    """

    #: flush the first of several dispatches at once (:meth:`_launch`); off only to time it against no flush
    #: (benchmarks/results/gl_flush_nvidia_h200.json)
    flush_first_dispatch = True

    # ---------------------------------------------------------------- memory and programs
    def image_from(self, buffer: Any, width: int, height: int, what: str = "image") -> Any:
        raise DeviceError(
            f"{what}: the OpenGL backend passes no image operands ({self.name}); "
            'choose a kernel without "image" restrictions'
        )

    def new_program(self, source: str, options: tuple, origin: str) -> GLProgram:
        """A :class:`~malinn.backends.gl_programs.GLProgram` for ``source`` and ``options``; it is
        linked (and its build errors raised) once per work-group shape, when bound.

        Raises:
            BackendError: ``options`` ask for half arithmetic (``HALF_ARITHMETIC``), which no GL
                shader does, or for half or int8 weights (``WEIGHT_BITS`` 16 or 8) from a source
                that does not read them (one without ``gl/weights.glsl``).
        """
        refused = refused_options(source, options)
        if refused:
            raise BackendError(
                f"{origin}: {' '.join(refused)} asks for a weight precision this GL shader does not "
                f"read ({self.name}): fp32 everywhere, fp16-storage and int8-weights in the shaders "
                f"that include gl/weights.glsl, fp16 on OpenCL devices only"
            )
        return GLProgram(self, source, options, origin)

    # ---------------------------------------------------------------- launches
    def bind(
        self,
        program: GLProgram,
        function: str,
        args: list,
        global_size: tuple,
        local_size: Any,
        what: str = "",
        name: str | None = None,
    ) -> BoundLaunch:
        name = name or function
        global_size = tuple(int(g) for g in global_size)
        local = tuple(local_size) if local_size else DEFAULT_LOCAL[len(global_size)]
        groups = tuple(-(-g // l) for g, l in zip(global_size, local))
        dispatch, fold = fold_groups(groups)
        if dispatch is None:
            raise DeviceError(
                f"{what}: kernel {name} over range {global_size} needs {groups} work-groups, "
                f"more than {self.name} dispatches ({MAX_GROUPS} per dimension, "
                f"{MAX_GROUPS} x {MAX_GROUPS} folded): predict fewer samples at a time "
                f"(batch_size, --batch-size) or run the model on an OpenCL device"
            )
        scalars, buffers = split_args(args)
        with self:
            shader = program.linked(local, folded=dispatch[2] > 1)
            try:
                block = shader["MalinnArgs"]
            except KeyError:
                raise KernelBuildError(f"{program.origin}: the shader declares no MALINN_ARGS block") from None
            head = [global_size[0], global_size[1] if len(global_size) > 1 else 1, fold]  # gl_programs.RANGE_WORDS
            uniforms = self.ctx.buffer(args_block(program.origin, block.size, head, scalars))
        return self.bound(name, global_size, local, (shader, uniforms, tuple(buffers), dispatch), what or name)

    def timed(self, launches: list) -> GLEvent:
        """Runs ``launches`` to completion: an event whose profile is their device time (from the
        timestamp before the first to the one after the last, :meth:`launch_seconds`) where the
        context has timer queries, else their wall time until the device finished (GL has no
        per-launch events; the tuner and benchmarks time with it)."""
        if self.timer_queries:
            stamps = self._stamps(launches)
            return GLEvent(stamps[0][0], stamps[-1][1])
        return super().timed(launches)

    def launch_all(self, launches: list) -> None:
        self._launch(launches)

    def _launch(self, launches: list, queries: Any = None) -> None:
        """:meth:`launch_all`; with ``queries`` (two query names per launch), a ``GL_TIMESTAMP``
        right before each dispatch and right after it (its bindings and barrier outside).

        Without queries, the first dispatch of several is flushed (``glFlush``) at once: a driver
        may hold commands until something waits on them, and the GPU then starts only once the
        host has issued every launch (NVIDIA's GL: a predict 1-4% sooner on Table 10.5's Full
        networks, benchmarks/results/gl_flush_nvidia_h200.json)."""
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

    # ---------------------------------------------------------------- timing
    @property
    def timer_queries(self) -> bool:
        """Whether the context records the device's time (``GL_TIMESTAMP`` queries) around compute
        dispatches: desktop OpenGL 3.3+ (every ``gl`` device's desktop context), OpenGL ES with
        ``GL_EXT_disjoint_timer_query``. (Not on a ``gles3`` device: its launches are draws, which
        llvmpipe stamps at 70-100 ns whatever they cost.)"""
        known = self.cache.get("timer_queries")
        if known is None:
            extensions = self.ctx.extensions
            if not self.gl.has_queries:
                known = False
            elif self.platform.startswith("OpenGL ES"):
                known = "GL_EXT_disjoint_timer_query" in extensions
            else:
                known = self.ctx.version_code >= 330 or "GL_ARB_timer_query" in extensions
            self.cache["timer_queries"] = known
        return bool(known)

    def launch_seconds(self, launches: list) -> list[float]:
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
            return super().launch_seconds(launches)
        return [(end - start) * 1e-9 for start, end in self._stamps(launches)]

    def _stamps(self, launches: list) -> list[tuple[int, int]]:
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
                    gl.get_query_object_ui64v(query, _QUERY_RESULT, ctypes.byref(result))  # waits for it
                    stamps.append(result.value)
            finally:
                gl.delete_queries(count, queries)
            error = self._error()
            if error:
                raise DeviceError(f"timing {len(launches)} launches on {self.name} failed ({error})")
        return list(zip(stamps[0::2], stamps[1::2]))


# -------------------------------------------------------------------- discovery
def probe(index: int) -> GLDevice:
    """Creates a headless context on EGL device ``index`` and runs the probe shader; raises on failure."""
    ctx = compute_context(index)
    ctx.gc_mode = "context_gc"
    try:
        gl = GLFunctions()
        figures = ContextFigures.of(ctx)
        if not figures.es and "GL_ARB_ES3_1_compatibility" not in ctx.extensions and ctx.version_code < 460:
            raise DeviceError(f"{figures.renderer} compiles no GLSL ES 3.10 (no GL_ARB_ES3_1_compatibility)")
        max_allocation = gl.integer(_MAX_SHADER_STORAGE_BLOCK_SIZE)
        sizes = tuple(gl.indexed_integer(_MAX_COMPUTE_WORK_GROUP_SIZE, i) for i in range(3))
        formats = gl.integer(_NUM_PROGRAM_BINARY_FORMATS) if gl.get_program_binary else 0
        device = GLDevice(
            backend="gl",
            index=("gl", index),
            name=figures.renderer,
            platform=figures.platform,
            vendor=figures.vendor,
            type=figures.type,
            compute_units=1,
            global_memory=total_memory(ctx, gl, max_allocation),
            max_allocation=max_allocation,
            max_work_group_size=gl.integer(_MAX_COMPUTE_WORK_GROUP_INVOCATIONS),
            max_work_item_sizes=sizes,
            local_memory=gl.integer(_MAX_COMPUTE_SHARED_MEMORY_SIZE),
            image_support=False,
            image2d_max_size=(0, 0),
            opencl_c_version="GLSL ES 3.10",
            driver_version=figures.version,
            host_unified_memory=False,  # no mapped transfers
            ctx=ctx,
            gl=gl,
            binary_formats=formats,
        )
        ctx.error
    finally:
        ctx.__exit__(None, None, None)  # create_context left it current in this thread
    run_probe(device, _PROBE_SOURCE, "the probe shader")
    device.max_loop_iterations = loop_limit(device, _LOOP_PROBE_SOURCE)
    return device


def discover(others: list | None = None, force: bool = False) -> list:
    """Every working OpenGL device (EGL devices in order), probed; warnings for the rest.

    Args:
        others: the devices other backends found (see :func:`~malinn.backends.gl_base.wanted`).
        force: look even where :func:`~malinn.backends.gl_base.wanted` says not to
            (``set_device("gl")`` asked), unless ``MALINN_GL=0``.

    Returns:
        list[GLDevice]: nothing when moderngl is not installed (``pip install malinn[gl]``), when
        TensorFlow is loaded in the process (Mesa's llvmpipe brings an LLVM of its own, as PoCL
        does), or under ``MALINN_GL_NO_COMPUTE=1`` (every device as ``gles3``: gl_feedback.py).
    """
    if no_compute() or not looks_for_devices(others, force, warn=True):
        return []
    return probe_each(probe, "gl")
