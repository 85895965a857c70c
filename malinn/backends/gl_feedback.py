"""OpenGL ES 3.0 GPUs (no compute shaders): kernels as vertex shaders whose outputs transform
feedback captures, after Cronin's GEMM through OpenGL (seeds/cronin-2018-opengl-gemm-embedded.txt).

The devices of this module are :class:`FeedbackDevice` objects of backend ``"gles3"``: a headless
EGL context as the OpenGL backend makes it (``backends/opengl.py``), used without compute shaders.
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

import ctypes
import math
import re
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..environment import switch
from ..errors import DeviceError, KernelBuildError
from ..library.expressions import evaluate
from ..library.layout import Layout
from .base import BoundLaunch
from .gles_context import ESContext
from .opengl import (
    _GL,
    SOFTWARE_RENDERERS,
    GLDevice,
    GLEvent,
    _moderngl,
    _total_memory,
    gl_index_macro,
    launch_error,
    loop_limit,
    requested_gl_api,
    run_probe,
    wanted,
)

__all__ = ["FeedbackDevice", "BACKEND", "discover", "probe", "no_compute", "inverse_index_macros"]

#: the backend name of the devices (and of the kernel sources under "sources" in the library)
BACKEND = "gles3"
#: the shader language of every vertex-stage source
PREAMBLE_VERSION = "#version 300 es"
#: the flat textures' width in texels, at most (a power of two; OpenGL ES 3.0 guarantees 2048)
TEXTURE_WIDTH = 4096
_ES_BACKEND = "malinn-gles30"

_TEXTURE_2D, _RGBA, _FLOAT = 0x0DE1, 0x1908, 0x1406
_PIXEL_UNPACK_BUFFER, _UNIFORM_BUFFER, _TRANSFORM_FEEDBACK_BUFFER = 0x88EC, 0x8A11, 0x8C8E
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


def no_compute() -> bool:
    """Whether ``MALINN_GL_NO_COMPUTE=1`` asks for every OpenGL device as a gles3 device."""
    return bool(switch("MALINN_GL_NO_COMPUTE", False))


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
    return (f"#define MALINN_ROW_{suffix}(I_, P_R, P_C) ({' + '.join(rows)})\n"
            f"#define MALINN_COL_{suffix}(I_, P_R, P_C) ({' + '.join(cols)})")


@dataclass(frozen=True)
class Feedback:
    """What a vertex-stage source declares with ``#pragma malinn_feedback``."""

    buffer: int         # the buffer argument that receives the outputs
    vertices: str       # expression over defines and scalar names ("": the launch's range)
    outputs: str        # expression: how many varyings malinn_out0 ...
    components: int     # floats per varying (1 to 4)
    scalars: tuple      # the names of MALINN_ARGS's members, in order

    @classmethod
    def of(cls, source: str) -> "Feedback | None":
        """The declaration in ``source``, or ``None`` (a compute shader)."""
        found = _PRAGMA.search(source)
        if found is None:
            return None
        parts = [p.strip() for p in found.group(1).split(",")]
        if len(parts) != 4:
            raise KernelBuildError(f"#pragma malinn_feedback({found.group(1)}): expected (BUFFER, VERTICES, "
                                   "OUTPUTS, COMPONENTS)")
        members = _ARGS.search(source)
        names = tuple(m.split()[-1] for m in (members.group(1).split(";") if members else ()) if m.strip())
        try:
            buffer, components = int(parts[0]), int(parts[3])
        except ValueError:
            raise KernelBuildError(f"#pragma malinn_feedback({found.group(1)}): BUFFER and COMPONENTS are "
                                   "integers") from None
        return cls(buffer, parts[1], parts[2], components, names)


class FeedbackProgram:
    """A vertex-stage source, its defines and its declaration; linked on first use (one program:
    a vertex shader has no work-group shape)."""

    def __init__(self, device: "FeedbackDevice", source: str, options: tuple, origin: str, feedback: Feedback):
        self.device, self.source, self.options, self.origin, self.feedback = device, source, options, origin, feedback
        self.defines = {}
        for option in options:
            if not option.startswith("-D"):
                raise KernelBuildError(f"option {option!r}: the OpenGL backend takes -DNAME=VALUE defines only")
            name, _, value = option[2:].partition("=")
            self.defines[name] = value or "1"
        try:
            self.outputs = evaluate(feedback.outputs, self.defines)
        except ValueError as exc:
            raise KernelBuildError(f"{origin}: #pragma malinn_feedback, OUTPUTS: {exc}") from None
        self.program = None

    def text(self) -> str:
        lines = [PREAMBLE_VERSION, "#pragma optionNV(unroll all)", "precision highp float;", "precision highp int;",
                 "precision highp sampler2D;"]
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

    def linked(self):
        """The linked program with its varyings; KernelBuildError with the compiler's log."""
        if self.program is None:
            device = self.device
            if not 1 <= self.outputs <= device.feedback_outputs or not 1 <= self.feedback.components <= 4:
                raise KernelBuildError(f"{self.origin}: {self.outputs} outputs of {self.feedback.components} floats "
                                       f"per vertex; {device.name} captures 1 to {device.feedback_outputs} "
                                       "outputs (GL_MAX_TRANSFORM_FEEDBACK_SEPARATE_ATTRIBS) of 1 to 4 floats")
            varyings = [f"malinn_out{j}" for j in range(self.outputs)]
            try:
                program = device.ctx.program(vertex_shader=self.text(), fragment_shader=_FRAGMENT, varyings=varyings,
                                             varyings_capture_mode="separate")
            except Exception as exc:
                raise KernelBuildError(f"{self.origin}: the GLSL vertex shader did not build on {device.name} "
                                       f"(options {' '.join(self.options) or 'none'}):\n{str(exc).strip()}") from None
            try:
                program["MalinnArgs"].binding = 0
            except KeyError:
                raise KernelBuildError(f"{self.origin}: the shader declares no MALINN_ARGS block") from None
            for name in program:
                if name.startswith("malinn_tex"):
                    program[name].value = int(name[len("malinn_tex"):])
            device.count("builds")
            self.program = (program, device.ctx.vertex_array(program, []))
        return self.program


class _FeedbackGL(_GL):
    """The GL entry points a draw with transform feedback needs (besides the backend's)."""

    def __init__(self):
        super().__init__()
        egl = ctypes.CDLL("libEGL.so.1")
        egl.eglGetProcAddress.restype = ctypes.c_void_p
        egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]

        def fn(name, *argtypes):
            address = egl.eglGetProcAddress(name.encode())
            if not address:
                raise DeviceError(f"the driver has no {name}")
            return ctypes.CFUNCTYPE(None, *argtypes)(address)

        u, i, p, s = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t
        self.bind_buffer = fn("glBindBuffer", u, u)
        self.bind_buffer_base = fn("glBindBufferBase", u, u, u)
        self.bind_buffer_range = fn("glBindBufferRange", u, u, u, s, s)
        self.bind_texture = fn("glBindTexture", u, u)
        self.active_texture = fn("glActiveTexture", u)
        self.tex_sub_image = fn("glTexSubImage2D", u, i, i, i, i, i, u, u, p)
        self.begin_feedback = fn("glBeginTransformFeedback", u)
        self.end_feedback = fn("glEndTransformFeedback")
        self.draw_arrays = fn("glDrawArrays", u, i, i)
        self.enable = fn("glEnable", u)
        self.disable = fn("glDisable", u)
        self.bind_vertex_array = fn("glBindVertexArray", u)
        self.use_program = fn("glUseProgram", u)

    def copy_to_texture(self, buffer, texture, width: int, texels: int) -> None:
        """Texels ``0 .. texels`` of ``buffer`` into ``texture`` (rows of ``width``), on the device."""
        full, rest = divmod(texels, width)
        self.bind_buffer(_PIXEL_UNPACK_BUFFER, buffer.glo)
        self.bind_texture(_TEXTURE_2D, texture.glo)
        if full:
            self.tex_sub_image(_TEXTURE_2D, 0, 0, 0, width, full, _RGBA, _FLOAT, None)
        if rest:
            self.tex_sub_image(_TEXTURE_2D, 0, 0, full, rest, 1, _RGBA, _FLOAT, ctypes.c_void_p(full * width * 16))
        self.bind_buffer(_PIXEL_UNPACK_BUFFER, 0)


@dataclass(eq=False)
class FeedbackDevice(GLDevice):
    """An OpenGL device without compute shaders: vertex-stage kernels, results by transform feedback.

    Attributes (besides :class:`~malinn.backends.opengl.GLDevice`'s): ``texture_width``, the flat
    textures' row in texels; ``max_texture``, ``GL_MAX_TEXTURE_SIZE``; ``feedback_outputs``,
    ``GL_MAX_TRANSFORM_FEEDBACK_SEPARATE_ATTRIBS``; ``texture_units``, the vertex shader's samplers.
    """

    #: what the device lacks, for the errors of a layer it cannot run
    limitation = "no compute shaders, only the vertex-stage kernels (\"gles3\" in kernels/library.json)"
    texture_width: int = TEXTURE_WIDTH
    max_texture: int = 2048
    feedback_outputs: int = 4
    texture_units: int = 16
    framebuffer: object = None

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int, what: str):
        """A buffer of ``nbytes`` rounded up to whole texels (16 bytes): a buffer is read as a texture."""
        return super().alloc(-(-max(int(nbytes), 4) // 16) * 16, what)

    def download(self, buffer, out, blocking: bool = True, what: str = "data", mapped: bool | None = None) -> None:
        with self:
            try:
                buffer.read_into(out, size=out.nbytes)
            except Exception as exc:
                raise DeviceError(f"downloading {what} ({out.nbytes} bytes) from {self.name} failed ({exc})") from exc
        self.counters["downloads"] += 1

    def fill_zero(self, buffer, nbytes: int, what: str = "buffer") -> None:
        with self:
            try:
                buffer.clear(size=int(nbytes))
            except Exception as exc:
                raise DeviceError(f"clearing {what} ({nbytes} bytes) on {self.name} failed ({exc})") from exc

    def image_from(self, buffer, width: int, height: int, what: str = "image"):
        """An RGBA32F texture of ``width x height`` texels copied from the start of ``buffer`` (texel
        ``(x, y)`` = floats ``4 (y width + x) ..``), made on the device.

        Raises:
            DeviceError: the texture exceeds ``GL_MAX_TEXTURE_SIZE`` or the buffer, or the copy failed.
        """
        if max(width, height) > self.max_texture:
            raise DeviceError(f"{what}: a texture of {width} x {height} texels exceeds {self.name}'s largest, "
                              f"{self.max_texture} (GL_MAX_TEXTURE_SIZE)")
        if width * height * 16 > buffer.size:
            raise DeviceError(f"{what}: {width} x {height} texels need {width * height * 16} bytes; the buffer "
                              f"holds {buffer.size}")
        with self:
            texture = self._texture(width, height, what)
            self.gl.copy_to_texture(buffer, texture, width, width * height)
            error = self._error()
            if error:
                raise DeviceError(f"{what}: copying {width} x {height} texels into a texture on {self.name} "
                                  f"failed ({error})")
        return texture

    def _texture(self, width: int, height: int, what: str):
        moderngl = _moderngl()
        try:
            texture = self.ctx.texture((int(width), int(height)), 4, dtype="f4")
        except Exception as exc:
            raise DeviceError(f"{what}: a {width} x {height} RGBA32F texture on {self.name} failed ({exc})") from exc
        texture.filter = (moderngl.NEAREST, moderngl.NEAREST)   # 32-bit floats filter in no ES 3.0 driver
        texture.repeat_x = texture.repeat_y = False
        return texture

    def flat_texture(self, buffer, unit: int, what: str):
        """A texture that holds ``buffer``'s floats in rows of ``texture_width`` texels, for sampler
        unit ``unit``. One per unit and height, shared by every launch: each launch copies its
        buffer in before its draw, and GL orders the copy after the draws before it."""
        texels = buffer.size // 16
        rows = max(1, -(-texels // self.texture_width))
        if rows > self.max_texture:
            raise DeviceError(f"{what}: {buffer.size / 2**20:.1f} MiB read through a texture of "
                              f"{self.texture_width} x {rows} texels exceeds {self.name}'s largest, "
                              f"{self.max_texture} (GL_MAX_TEXTURE_SIZE)")
        shared = self.cache.setdefault("flat_textures", {})
        if (unit, rows) not in shared:
            shared[(unit, rows)] = self._texture(self.texture_width, rows, what)
        return shared[(unit, rows)]

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>"):
        """A :class:`FeedbackProgram` for a vertex-stage ``source``, memoised.

        Raises:
            KernelBuildError: ``source`` is a compute shader (it declares no ``#pragma
                malinn_feedback``), which this device cannot run, or its declaration is wrong.
        """
        key = (source, tuple(options))
        programs = self.cache.setdefault("programs", {})
        with self.lock:
            program = programs.get(key)
            if program is None:
                feedback = Feedback.of(source)
                if feedback is None:
                    raise KernelBuildError(f"{origin}: a compute shader; {self.name} runs vertex-stage kernels only "
                                           "(no compute shaders: OpenGL ES 3.0)")
                program = programs[key] = FeedbackProgram(self, source, tuple(options), origin, feedback)
        return program

    def render_index(self, layout: Layout, name: str) -> str:
        """The index macro ``name`` and its inverses (``MALINN_ROW_<X>``, ``MALINN_COL_<X>``)."""
        suffix = name.rsplit("_", 1)[-1]
        return gl_index_macro(layout, name) + "\n" + inverse_index_macros(layout, suffix)

    # ---------------------------------------------------------------- launches
    def bind(self, program, function: str, args: list, global_size: tuple, local_size, what: str = "",
             name: str | None = None):
        name = name or function
        what = what or name
        global_size = tuple(int(g) for g in global_size)
        scalars = [a for a in args if isinstance(a, (np.uint32, np.float32))]
        buffers = [a for a in args if not isinstance(a, (np.uint32, np.float32))]
        feedback = program.feedback
        values = {**{k: v for k, v in program.defines.items()},
                  **{n: int(v) for n, v in zip(feedback.scalars, scalars) if isinstance(v, np.uint32)}}
        try:
            vertices = evaluate(feedback.vertices, values) if feedback.vertices else math.prod(global_size)
        except ValueError as exc:
            raise KernelBuildError(f"{program.origin}: #pragma malinn_feedback, VERTICES: {exc}") from None
        if not 0 <= feedback.buffer < len(buffers):
            raise KernelBuildError(f"{program.origin}: #pragma malinn_feedback names buffer {feedback.buffer}; "
                                   f"the library passes {len(buffers)}")
        target = buffers[feedback.buffer]
        section = vertices * feedback.components * 4
        if program.outputs * section > target.size:
            raise DeviceError(f"{what}: kernel {name} writes {program.outputs} x {vertices} x {feedback.components} "
                              f"floats; its result buffer holds {target.size // 4}")
        with self:
            shader, vao = program.linked()
            block = shader["MalinnArgs"]
            if block.size < 4 * (2 + len(scalars)):
                raise KernelBuildError(f"{program.origin}: MALINN_ARGS holds {block.size // 4 - 2} scalars, "
                                       f"the library passes {len(scalars)}")
            words = np.zeros(max(block.size // 4, 2 + len(scalars)), np.uint32)
            words[0] = global_size[0]
            words[1] = global_size[1] if len(global_size) > 1 else 1
            for i, value in enumerate(scalars):
                words[2 + i] = np.asarray(value).view(np.uint32)
            uniforms = self.ctx.buffer(words.tobytes())
            textures, copies = [], []
            for i, buffer in enumerate(buffers):
                if f"malinn_tex{i}" not in shader:
                    continue
                if i >= self.texture_units:
                    raise KernelBuildError(f"{program.origin}: sampler malinn_tex{i}; {self.name}'s vertex shaders "
                                           f"read {self.texture_units} textures")
                if isinstance(buffer, _moderngl().Texture):    # an image (the weights): made once
                    textures.append((i, buffer))
                    continue
                texture = self.flat_texture(buffer, i, f"{what}: buffer {i} of {name}")
                textures.append((i, texture))
                copies.append((buffer, texture, buffer.size // 16))
        ranges = [(target, j * section, section) for j in range(program.outputs)]
        handle = (shader, vao, uniforms, tuple(textures), tuple(copies), tuple(ranges), vertices)
        bound = BoundLaunch(name, global_size, None, handle, None, what=what)
        bound.enqueue = lambda: self._timed([bound])
        return bound

    def _timed(self, launches: list) -> GLEvent:
        with self:
            self.ctx.finish()
            start = time.perf_counter_ns()
            self.launch_all(launches)
            self.ctx.finish()
            return GLEvent(start, time.perf_counter_ns())

    def launch_all(self, launches: list) -> None:
        gl = self.gl
        with self:
            self.framebuffer.use()   # a draw needs a complete framebuffer, rasterizing or not
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
                    for j in range(len(ranges)):   # the buffer may be read as a texture next
                        gl.bind_buffer_base(_TRANSFORM_FEEDBACK_BUFFER, j, 0)
            finally:
                gl.disable(_RASTERIZER_DISCARD)
                gl.active_texture(_TEXTURE0)
            error = self._error()
            if error:
                raise launch_error(launches, self.name, error)
            self.counters["launches"] += len(launches)


# -------------------------------------------------------------------- discovery
def _register_es30_backend() -> None:
    """Lets moderngl make an OpenGL ES 3.0 context through :class:`ESContext` (``malinn-gles30``)."""
    import glcontext  # moderngl's own dependency

    if getattr(glcontext.get_backend_by_name, "malinn_gles30", False):
        return
    by_name = glcontext.get_backend_by_name

    def get_backend_by_name(name):
        if name == _ES_BACKEND:
            return lambda mode="standalone", glversion=300, device_index=0, **settings: ESContext(int(device_index), 3, 0)
        return by_name(name)

    get_backend_by_name.malinn_gles30 = True
    glcontext.get_backend_by_name = get_backend_by_name


def _context(index: int):
    """A headless context on EGL device ``index`` that compiles GLSL ES 3.00: desktop OpenGL 3.3+
    (with ``GL_ARB_ES3_compatibility``), else OpenGL ES 3.0+; ``MALINN_GL_API=es`` for OpenGL ES
    only, ``MALINN_GL_API=gl`` for desktop OpenGL only."""
    moderngl = _moderngl()
    api = requested_gl_api()
    libraries = {"libgl": "libGL.so.1", "libegl": "libEGL.so.1"}

    def es():
        _register_es30_backend()
        return moderngl.create_context(standalone=True, backend=_ES_BACKEND, device_index=index, require=300)

    if api == "es":
        return es()
    try:
        ctx = moderngl.create_context(standalone=True, backend="egl", device_index=index, require=330, **libraries)
        if ctx.version_code >= 430 or "GL_ARB_ES3_compatibility" in ctx.extensions:
            return ctx
        ctx.release()
        failure = DeviceError("desktop OpenGL without GL_ARB_ES3_compatibility (GLSL ES 3.00)")
    except Exception as exc:
        if "requested device index" in str(exc):
            raise
        failure = exc
    if api == "gl":
        raise failure
    return es()


def probe(index: int) -> FeedbackDevice:
    """A :class:`FeedbackDevice` on EGL device ``index``, its probe kernel run; raises on failure."""
    ctx = _context(index)
    ctx.gc_mode = "context_gc"
    try:
        gl = _FeedbackGL()
        info = ctx.info
        ctx.error   # moderngl's info asks for desktop-only limits on an ES context: clear the GL error
        renderer, version = str(info["GL_RENDERER"]).strip(), str(info["GL_VERSION"]).strip()
        software = any(s in renderer.lower() for s in SOFTWARE_RENDERERS)
        es = version.startswith("OpenGL ES")
        max_texture = gl.integer(_MAX_TEXTURE_SIZE)
        width = min(TEXTURE_WIDTH, 1 << (max_texture.bit_length() - 1))
        max_allocation = min(width * max_texture * 16, 2**31 - 16)
        units = gl.integer(_MAX_VERTEX_TEXTURE_UNITS)
        device = FeedbackDevice(
            backend=BACKEND, index=(BACKEND, index), name=renderer,
            platform=(version if es else f"OpenGL {version}") + " (vertex shaders, transform feedback)",
            vendor=str(info["GL_VENDOR"]).strip(), type="CPU" if software else "GPU", compute_units=1,
            global_memory=_total_memory(ctx, gl, software, max_allocation), max_allocation=max_allocation,
            max_work_group_size=1, max_work_item_sizes=(1, 1, 1), local_memory=0, image_support=True,
            image2d_max_size=(max_texture, max_texture), opencl_c_version="GLSL ES 3.00",
            driver_version=version, host_unified_memory=False, ctx=ctx, gl=gl, binary_formats=0,
            texture_width=width, max_texture=max_texture, feedback_outputs=gl.integer(_MAX_SEPARATE_ATTRIBS),
            texture_units=units)
        device.framebuffer = ctx.framebuffer(color_attachments=[ctx.renderbuffer((1, 1))])
        ctx.error
    finally:
        ctx.__exit__(None, None, None)   # create_context left it current in this thread
    device = run_probe(device, _PROBE_SOURCE, "the gles3 (vertex-stage) probe shader")
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
        force: look even where :func:`~malinn.backends.opengl.wanted` says not to, on every EGL device.
    """
    if switch("MALINN_GL", None) is False or not (force or wanted(others or [])):
        return []
    try:
        _moderngl()
    except ImportError:
        return []
    if "tensorflow" in sys.modules:
        return []
    try:
        requested_gl_api()
    except DeviceError:   # the gl backend's discovery said so
        return []
    listed = {d.index[1] for d in others or [] if d.backend == "gl"}
    found = []
    for index in range(16):
        if index in listed and not (force or no_compute()):
            continue
        try:
            found.append(probe(index))
        except Exception as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "requested device index" in text:   # past the last EGL device
                break
            warnings.warn(f"malinn: skipping OpenGL device {BACKEND}:{index}: {text}", stacklevel=3)
    return found
