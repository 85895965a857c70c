"""OpenGL ES 3.0 GPUs (no compute shaders): kernels as vertex shaders whose outputs transform
feedback captures, after Cronin's GEMM through OpenGL (seeds/cronin-2018-opengl-gemm-embedded.txt).

The devices of this module are :class:`FeedbackDevice` objects of backend ``"gles3"``: a headless
EGL context (``backends/gl_context.py``) on the device both GL backends share
(``backends/gl_base.py``), used without compute shaders.
They run the kernel-library entries that name a source under ``"sources": {"gles3": ...}``
(``kernels/gl/*.vert``, GLSL ES 3.00), so a new variant needs no Python change. They are listed
where a device has no compute shaders (OpenGL ES 3.0, or desktop OpenGL 3.3 with
``GL_ARB_ES3_compatibility``), and for every EGL device under ``MALINN_GL_NO_COMPUTE=1`` (then the
``gl`` backend lists none: for testing the path on llvmpipe or any GPU).

How a kernel runs (docs/BACKENDS.md, "Vertex-stage kernels"):

* the source declares ``#pragma malinn_feedback(BUFFER, VERTICES, OUTPUTS, COMPONENTS)``:
  buffer argument ``BUFFER`` (in the entry's ``buffers`` order) receives the results; the launch
  is a draw of ``VERTICES`` points (an expression over the entry's defines and the names of
  ``MALINN_ARGS``; empty: the product of the launch's range) with rasterization off, each vertex
  writing ``OUTPUTS`` varyings ``malinn_out0 ...`` of ``COMPONENTS`` floats, captured in separate
  mode: output ``j`` of vertex ``v`` lands at float ``(j * VERTICES + v) * COMPONENTS`` of the
  buffer (each output fills its own section, one after another);
* the scalars fill the ``MalinnArgs`` uniform block as on the compute path (``MALINN_ARGS``);
* buffer argument ``i`` is read through the sampler ``malinn_tex<i>`` where the shader declares
  one: an operand the library passes as an image (``"image": true``, the weights) is an RGBA32F
  texture made once (texel ``(x, y)`` = rows ``4x .. 4x+3`` of column ``y``); any other buffer is
  copied on the device (``GL_PIXEL_UNPACK_BUFFER``) into a flat RGBA32F texture before each draw
  (one texture per sampler unit and height, shared by the launches),
  float ``i`` at texel ``i / 4`` of rows ``MALINN_TEXW`` texels wide (``MALINN_LOAD(s, i)``,
  ``MALINN_TEXEL(s, q)``), so a kernel may read the buffer it writes (in place);
* ``render_index`` gives, besides ``MALINN_INDEX_<X>(r, c, P_R, P_C)``, its inverses
  ``MALINN_ROW_<X>(i, P_R, P_C)`` and ``MALINN_COL_<X>(i, P_R, P_C)``: a vertex writes its
  element's memory position, so kernels for any layout find the element a position holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DeviceError, KernelBuildError
from ..library.expressions import evaluate
from ..library.layout import Layout
from .base import BoundLaunch
from .gl_base import (
    GLBaseDevice,
    args_block,
    gl_index_macro,
    launch_error,
    looks_for_devices,
    loop_limit,
    no_compute,
    probe_each,
    run_probe,
    split_args,
)
from .gl_context import ContextFigures, load_moderngl, total_memory, vertex_context
from .gl_functions import FeedbackFunctions

__all__ = ["FeedbackDevice", "BACKEND", "discover", "probe", "no_compute", "inverse_index_macros"]

#: the backend name of the devices (and of the kernel sources under "sources" in the library)
BACKEND = "gles3"
#: the shader language of every vertex-stage source
PREAMBLE_VERSION = "#version 300 es"
#: the flat textures' width in texels, at most (a power of two; OpenGL ES 3.0 guarantees 2048)
TEXTURE_WIDTH = 4096

_TEXTURE_2D = 0x0DE1
_UNIFORM_BUFFER, _TRANSFORM_FEEDBACK_BUFFER = 0x8A11, 0x8C8E
_RASTERIZER_DISCARD, _POINTS, _TEXTURE0 = 0x8C89, 0x0000, 0x84C0
_MAX_TEXTURE_SIZE, _MAX_SEPARATE_ATTRIBS, _MAX_SEPARATE_COMPONENTS = 0x0D33, 0x8C8B, 0x8C80
_MAX_COMBINED_TEXTURE_UNITS, _MAX_VERTEX_TEXTURE_UNITS = 0x8B4D, 0x8B4C

_PRAGMA = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+malinn_feedback[ \t]*\((.*)\)[ \t]*$", re.M)
_ARGS = re.compile(r"MALINN_ARGS\s*\(([^)]*)\)")

_FRAGMENT = f"""{PREAMBLE_VERSION}
precision highp float;
out vec4 malinn_colour;
void main() {{ malinn_colour = vec4(0.0); }}
"""

_PROBE_SOURCE = """/* malinn: the gles3 probe */
#pragma malinn_feedback(1, n, 1, 1)
MALINN_ARGS(uint n;)
uniform highp sampler2D malinn_tex0;
out float malinn_out0;
void main() {
    malinn_out0 = 2.0 * MALINN_LOAD(malinn_tex0, MALINN_VERTEX) + 1.0;
}
"""


#: counts the iterations of one loop of ``n`` (each adds a value read from the texture, so that no
#: compiler folds the loop): fewer than ``n`` where the driver ends loops early (llvmpipe's vertex
#: shaders, as its compute shaders: after 65535); the twin of the gl backend's loop probe
_LOOP_PROBE_SOURCE = """/* malinn: the gles3 loop probe */
#pragma malinn_feedback(1, 1, 1, 1)
MALINN_ARGS(uint n;)
uniform highp sampler2D malinn_tex0;
out float malinn_out0;
void main() {
    float count = 0.0;
    for (uint i = 0u; i < n; ++i)
        count += MALINN_LOAD(malinn_tex0, i & 1u);
    malinn_out0 = count;
}
"""


def inverse_index_macros(layout: Layout, suffix: str) -> str:
    """GLSL macros ``MALINN_ROW_<suffix>(I_, P_R, P_C)`` and ``MALINN_COL_<suffix>(...)``: the row
    and column of the element at memory index ``I_`` of a ``P_R x P_C`` matrix in ``layout``, the
    inverse of :meth:`Layout.index` (uint arithmetic)."""
    sizes = [("uint(P_R)", "uint(P_C)")] + [(f"{y}u", f"{x}u") for y, x in layout.blocks] + [("1u", "1u")]
    rows, cols = [], []
    for k, base in enumerate(layout.bases):
        (py, px), (cy, cx) = sizes[k], sizes[k + 1]
        chunk = f"({cy} * {cx})"
        nrows, ncols = f"({py} / {cy})", f"({px} / {cx})"
        q = f"((uint(I_) / {chunk}) % ({nrows} * {ncols}))" if k else f"(uint(I_) / {chunk})"
        if base == "R":
            ci, cj = f"({q} / {ncols})", f"({q} % {ncols})"
        else:
            ci, cj = f"({q} % {nrows})", f"({q} / {nrows})"
        rows.append(f"{ci} * {cy}")
        cols.append(f"{cj} * {cx}")
    return (
        f"#define MALINN_ROW_{suffix}(I_, P_R, P_C) ({' + '.join(rows)})\n"
        f"#define MALINN_COL_{suffix}(I_, P_R, P_C) ({' + '.join(cols)})"
    )


@dataclass(frozen=True)
class Feedback:
    """What a vertex-stage source declares with ``#pragma malinn_feedback``."""

    buffer: int  # the buffer argument that receives the outputs
    vertices: str  # expression over defines and scalar names ("": the launch's range)
    outputs: str  # expression: how many varyings malinn_out0 ...
    components: int  # floats per varying (1 to 4)
    scalars: tuple  # the names of MALINN_ARGS's members, in order

    @classmethod
    def of(cls, source: str) -> "Feedback | None":
        """The declaration in ``source``, or ``None`` (a compute shader)."""
        found = _PRAGMA.search(source)
        if found is None:
            return None
        parts = [p.strip() for p in found.group(1).split(",")]
        if len(parts) != 4:
            raise KernelBuildError(
                f"#pragma malinn_feedback({found.group(1)}): expected (BUFFER, VERTICES, OUTPUTS, COMPONENTS)"
            )
        members = _ARGS.search(source)
        names = tuple(m.split()[-1] for m in (members.group(1).split(";") if members else ()) if m.strip())
        try:
            buffer, components = int(parts[0]), int(parts[3])
        except ValueError:
            raise KernelBuildError(
                f"#pragma malinn_feedback({found.group(1)}): BUFFER and COMPONENTS are integers"
            ) from None
        return cls(buffer, parts[1], parts[2], components, names)


class FeedbackProgram:
    """A vertex-stage source, its defines and its declaration; linked on first use (one program:
    a vertex shader has no work-group shape)."""

    def __init__(self, device: "FeedbackDevice", source: str, options: tuple, origin: str, feedback: Feedback):
        self.device, self.source, self.options, self.origin, self.feedback = device, source, options, origin, feedback
        self.defines: dict[str, str] = {}
        for option in options:
            if not option.startswith("-D"):
                raise KernelBuildError(f"option {option!r}: the OpenGL backend takes -DNAME=VALUE defines only")
            name, _, value = option[2:].partition("=")
            self.defines[name] = value or "1"
        try:
            self.outputs = evaluate(feedback.outputs, self.defines)
        except ValueError as exc:
            raise KernelBuildError(f"{origin}: #pragma malinn_feedback, OUTPUTS: {exc}") from None
        self.program: tuple[Any, Any] | None = None

    def text(self) -> str:
        lines = [
            PREAMBLE_VERSION,
            "#pragma optionNV(unroll all)",
            "precision highp float;",
            "precision highp int;",
            "precision highp sampler2D;",
        ]
        lines += [f"#define {name} {value}" for name, value in self.defines.items()]
        shift = int(math.log2(self.device.texture_width))
        lines += [
            f"#define MALINN_TEXW {self.device.texture_width}u",
            f"#define MALINN_TEXEL(s, q) texelFetch(s, ivec2(int((q) & {self.device.texture_width - 1}u), "
            f"int((q) >> {shift}u)), 0)",
            "#define MALINN_LOAD(s, i) MALINN_TEXEL(s, (i) >> 2u)[int((i) & 3u)]",
            "#define MALINN_VERTEX uint(gl_VertexID)",
            "#define MALINN_ARGS(members) layout(std140) uniform MalinnArgs "
            "{ uint malinn_range0; uint malinn_range1; members };",
            "#define MALINN_INFINITY uintBitsToFloat(0x7F800000u)",
        ]
        # the declaration is for malinn: the compiler never sees it
        return "\n".join(lines) + "\n" + _PRAGMA.sub("/* malinn_feedback declared */", self.source)

    def linked(self) -> tuple[Any, Any]:
        """The linked program with its varyings; KernelBuildError with the compiler's log."""
        if self.program is None:
            device = self.device
            if not 1 <= self.outputs <= device.feedback_outputs or not 1 <= self.feedback.components <= 4:
                raise KernelBuildError(
                    f"{self.origin}: {self.outputs} outputs of {self.feedback.components} floats "
                    f"per vertex; {device.name} captures 1 to {device.feedback_outputs} "
                    "outputs (GL_MAX_TRANSFORM_FEEDBACK_SEPARATE_ATTRIBS) of 1 to 4 floats"
                )
            varyings = [f"malinn_out{j}" for j in range(self.outputs)]
            try:
                program = device.ctx.program(
                    vertex_shader=self.text(),
                    fragment_shader=_FRAGMENT,
                    varyings=varyings,
                    varyings_capture_mode="separate",
                )
            except Exception as exc:
                raise KernelBuildError(
                    f"{self.origin}: the GLSL vertex shader did not build on {device.name} "
                    f"(options {' '.join(self.options) or 'none'}):\n{str(exc).strip()}"
                ) from None
            try:
                program["MalinnArgs"].binding = 0
            except KeyError:
                raise KernelBuildError(f"{self.origin}: the shader declares no MALINN_ARGS block") from None
            for name in program:
                if name.startswith("malinn_tex"):
                    program[name].value = int(name[len("malinn_tex") :])
            device.count("builds")
            self.program = (program, device.ctx.vertex_array(program, []))
        return self.program


@dataclass(eq=False)
class FeedbackDevice(GLBaseDevice):
    """An OpenGL device without compute shaders: vertex-stage kernels, results by transform feedback.

    Attributes (besides :class:`~malinn.backends.gl_base.GLBaseDevice`'s): ``texture_width``, the flat
    textures' row in texels; ``max_texture``, ``GL_MAX_TEXTURE_SIZE``; ``feedback_outputs``,
    ``GL_MAX_TRANSFORM_FEEDBACK_SEPARATE_ATTRIBS``; ``texture_units``, the vertex shader's samplers.
    """

    #: what the device lacks, for the errors of a layer it cannot run
    limitation = 'no compute shaders, only the vertex-stage kernels ("gles3" in kernels/library.json)'
    texture_width: int = TEXTURE_WIDTH
    max_texture: int = 2048
    feedback_outputs: int = 4
    texture_units: int = 16
    framebuffer: Any = None
    #: an OpenGL ES 3.0 context has no glMemoryBarrier (draws write buffers through transform feedback)
    storage_barriers = False

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int, what: str) -> Any:
        """A buffer of ``nbytes`` rounded up to whole texels (16 bytes): a buffer is read as a texture."""
        return super().alloc(-(-max(int(nbytes), 4) // 16) * 16, what)

    def image_from(self, buffer: Any, width: int, height: int, what: str = "image") -> Any:
        """An RGBA32F texture of ``width x height`` texels copied from the start of ``buffer`` (texel
        ``(x, y)`` = floats ``4 (y width + x) ..``), made on the device.

        Raises:
            DeviceError: the texture exceeds ``GL_MAX_TEXTURE_SIZE`` or the buffer, or the copy failed.
        """
        if max(width, height) > self.max_texture:
            raise DeviceError(
                f"{what}: a texture of {width} x {height} texels exceeds {self.name}'s largest, "
                f"{self.max_texture} (GL_MAX_TEXTURE_SIZE)"
            )
        if width * height * 16 > buffer.size:
            raise DeviceError(
                f"{what}: {width} x {height} texels need {width * height * 16} bytes; the buffer holds {buffer.size}"
            )
        with self:
            texture = self._texture(width, height, what)
            self.gl.copy_to_texture(buffer, texture, width, width * height)
            error = self._error()
            if error:
                raise DeviceError(
                    f"{what}: copying {width} x {height} texels into a texture on {self.name} failed ({error})"
                )
        return texture

    def _texture(self, width: int, height: int, what: str) -> Any:
        moderngl = load_moderngl()
        try:
            texture = self.ctx.texture((int(width), int(height)), 4, dtype="f4")
        except Exception as exc:
            raise DeviceError(f"{what}: a {width} x {height} RGBA32F texture on {self.name} failed ({exc})") from exc
        texture.filter = (moderngl.NEAREST, moderngl.NEAREST)  # 32-bit floats filter in no ES 3.0 driver
        texture.repeat_x = texture.repeat_y = False
        return texture

    def flat_texture(self, buffer: Any, unit: int, what: str) -> Any:
        """A texture that holds ``buffer``'s floats in rows of ``texture_width`` texels, for sampler
        unit ``unit``. One per unit and height, shared by every launch: each launch copies its
        buffer in before its draw, and GL orders the copy after the draws before it."""
        texels = buffer.size // 16
        rows = max(1, -(-texels // self.texture_width))
        if rows > self.max_texture:
            raise DeviceError(
                f"{what}: {buffer.size / 2**20:.1f} MiB read through a texture of "
                f"{self.texture_width} x {rows} texels exceeds {self.name}'s largest, "
                f"{self.max_texture} (GL_MAX_TEXTURE_SIZE)"
            )
        shared = self.cache.setdefault("flat_textures", {})
        if (unit, rows) not in shared:
            shared[(unit, rows)] = self._texture(self.texture_width, rows, what)
        return shared[(unit, rows)]

    # ---------------------------------------------------------------- programs
    def new_program(self, source: str, options: tuple, origin: str) -> FeedbackProgram:
        """A :class:`FeedbackProgram` for a vertex-stage ``source`` (:meth:`compile` memoises it).

        Raises:
            KernelBuildError: ``source`` is a compute shader (it declares no ``#pragma
                malinn_feedback``), which this device cannot run, or its declaration is wrong.
        """
        feedback = Feedback.of(source)
        if feedback is None:
            raise KernelBuildError(
                f"{origin}: a compute shader; {self.name} runs vertex-stage kernels only "
                "(no compute shaders: OpenGL ES 3.0)"
            )
        return FeedbackProgram(self, source, options, origin, feedback)

    def render_index(self, layout: Layout, name: str) -> str:
        """The index macro ``name`` and its inverses (``MALINN_ROW_<X>``, ``MALINN_COL_<X>``)."""
        suffix = name.rsplit("_", 1)[-1]
        return gl_index_macro(layout, name) + "\n" + inverse_index_macros(layout, suffix)

    # ---------------------------------------------------------------- launches
    def bind(
        self,
        program: FeedbackProgram,
        function: str,
        args: list,
        global_size: tuple,
        local_size: Any,
        what: str = "",
        name: str | None = None,
    ) -> BoundLaunch:
        name = name or function
        what = what or name
        global_size = tuple(int(g) for g in global_size)
        scalars, buffers = split_args(args)
        feedback = program.feedback
        values = {
            **{k: v for k, v in program.defines.items()},
            **{n: int(v) for n, v in zip(feedback.scalars, scalars) if isinstance(v, np.uint32)},
        }
        try:
            vertices = evaluate(feedback.vertices, values) if feedback.vertices else math.prod(global_size)
        except ValueError as exc:
            raise KernelBuildError(f"{program.origin}: #pragma malinn_feedback, VERTICES: {exc}") from None
        if not 0 <= feedback.buffer < len(buffers):
            raise KernelBuildError(
                f"{program.origin}: #pragma malinn_feedback names buffer {feedback.buffer}; "
                f"the library passes {len(buffers)}"
            )
        target = buffers[feedback.buffer]
        section = vertices * feedback.components * 4
        if program.outputs * section > target.size:
            raise DeviceError(
                f"{what}: kernel {name} writes {program.outputs} x {vertices} x {feedback.components} "
                f"floats; its result buffer holds {target.size // 4}"
            )
        with self:
            shader, vao = program.linked()
            head = [global_size[0], global_size[1] if len(global_size) > 1 else 1]  # malinn_range0, _range1
            uniforms = self.ctx.buffer(args_block(program.origin, shader["MalinnArgs"].size, head, scalars))
            textures, copies = [], []
            for i, buffer in enumerate(buffers):
                if f"malinn_tex{i}" not in shader:
                    continue
                if i >= self.texture_units:
                    raise KernelBuildError(
                        f"{program.origin}: sampler malinn_tex{i}; {self.name}'s vertex shaders "
                        f"read {self.texture_units} textures"
                    )
                if isinstance(buffer, load_moderngl().Texture):  # an image (the weights): made once
                    textures.append((i, buffer))
                    continue
                texture = self.flat_texture(buffer, i, f"{what}: buffer {i} of {name}")
                textures.append((i, texture))
                copies.append((buffer, texture, buffer.size // 16))
        ranges = [(target, j * section, section) for j in range(program.outputs)]
        handle = (shader, vao, uniforms, tuple(textures), tuple(copies), tuple(ranges), vertices)
        return self.bound(name, global_size, None, handle, what)

    def launch_all(self, launches: list) -> None:
        gl = self.gl
        with self:
            self.framebuffer.use()  # a draw needs a complete framebuffer, rasterizing or not
            gl.enable(_RASTERIZER_DISCARD)
            try:
                for launch in launches:
                    shader, vao, uniforms, textures, copies, ranges, vertices = launch.handle
                    for buffer, texture, texels in copies:
                        gl.copy_to_texture(buffer, texture, self.texture_width, texels)
                    for unit, texture in textures:
                        gl.active_texture(_TEXTURE0 + unit)
                        gl.bind_texture(_TEXTURE_2D, texture.glo)
                    gl.bind_buffer_base(_UNIFORM_BUFFER, 0, uniforms.glo)
                    gl.use_program(shader.glo)
                    gl.bind_vertex_array(vao.glo)
                    for j, (buffer, offset, size) in enumerate(ranges):
                        gl.bind_buffer_range(_TRANSFORM_FEEDBACK_BUFFER, j, buffer.glo, offset, size)
                    gl.begin_feedback(_POINTS)
                    gl.draw_arrays(_POINTS, 0, vertices)
                    gl.end_feedback()
                    for j in range(len(ranges)):  # the buffer may be read as a texture next
                        gl.bind_buffer_base(_TRANSFORM_FEEDBACK_BUFFER, j, 0)
            finally:
                gl.disable(_RASTERIZER_DISCARD)
                gl.active_texture(_TEXTURE0)
            error = self._error()
            if error:
                raise launch_error(launches, self.name, error)
            self.counters["launches"] += len(launches)


# -------------------------------------------------------------------- discovery
def probe(index: int) -> FeedbackDevice:
    """A :class:`FeedbackDevice` on EGL device ``index``, its probe kernel run; raises on failure."""
    ctx = vertex_context(index)
    ctx.gc_mode = "context_gc"
    try:
        gl = FeedbackFunctions()
        figures = ContextFigures.of(ctx)
        max_texture = gl.integer(_MAX_TEXTURE_SIZE)
        width = min(TEXTURE_WIDTH, 1 << (max_texture.bit_length() - 1))
        max_allocation = min(width * max_texture * 16, 2**31 - 16)
        units = gl.integer(_MAX_VERTEX_TEXTURE_UNITS)
        device = FeedbackDevice(
            backend=BACKEND,
            index=(BACKEND, index),
            name=figures.renderer,
            platform=figures.platform + " (vertex shaders, transform feedback)",
            vendor=figures.vendor,
            type=figures.type,
            compute_units=1,
            global_memory=total_memory(ctx, gl, max_allocation),
            max_allocation=max_allocation,
            max_work_group_size=1,
            max_work_item_sizes=(1, 1, 1),
            local_memory=0,
            image_support=True,
            image2d_max_size=(max_texture, max_texture),
            opencl_c_version="GLSL ES 3.00",
            driver_version=figures.version,
            host_unified_memory=False,
            ctx=ctx,
            gl=gl,
            texture_width=width,
            max_texture=max_texture,
            feedback_outputs=gl.integer(_MAX_SEPARATE_ATTRIBS),
            texture_units=units,
        )
        device.framebuffer = ctx.framebuffer(color_attachments=[ctx.renderbuffer((1, 1))])
        ctx.error
    finally:
        ctx.__exit__(None, None, None)  # create_context left it current in this thread
    run_probe(device, _PROBE_SOURCE, "the gles3 (vertex-stage) probe shader")
    device.max_loop_iterations = loop_limit(device, _LOOP_PROBE_SOURCE, np.float32, None)
    return device


def discover(others: list | None = None, force: bool = False) -> list:
    """The gles3 devices: every EGL device the ``gl`` backend did not list (it has no compute
    shaders), or every EGL device under ``MALINN_GL_NO_COMPUTE=1`` or when asked by name (``force``:
    ``set_device("gles3")``, which then serves a GPU with compute shaders through its vertex stage
    too, beside its ``gl`` device); probed, warnings for the rest.

    Args:
        others: the devices other backends found (an EGL device listed as ``gl`` is not listed
            again unless forced).
        force: look even where :func:`~malinn.backends.gl_base.wanted` says not to, on every EGL device.

    Returns:
        list[FeedbackDevice]: nothing where the ``gl`` backend's discovery looks for none (it says
        why: :func:`~malinn.backends.gl_base.looks_for_devices`).
    """
    if not looks_for_devices(others, force, warn=False):
        return []
    listed = {d.index[1] for d in others or [] if d.backend == "gl"}
    return probe_each(probe, BACKEND, () if force or no_compute() else listed)
