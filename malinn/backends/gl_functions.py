"""The GL entry points moderngl does not wrap, called through ctypes: program binaries, integer
limits, compute dispatches and timer queries (:class:`GLFunctions`, both GL backends), and the
draws, textures and transform feedback of the vertex-stage kernels (:class:`FeedbackFunctions`).

Each is looked up with ``eglGetProcAddress`` in the context current when the object is made; a
function the driver lacks is ``None`` in :class:`GLFunctions` (the caller asks
:attr:`~GLFunctions.has_binaries`, :attr:`~GLFunctions.has_queries` first) and a DeviceError in
:class:`FeedbackFunctions` (a device without them runs no vertex-stage kernel).
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..errors import DeviceError

__all__ = ["GLFunctions", "FeedbackFunctions"]

_TEXTURE_2D, _RGBA, _FLOAT = 0x0DE1, 0x1908, 0x1406
_PIXEL_UNPACK_BUFFER = 0x88EC
_U, _I, _P, _S = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t


class _EGL:
    """``libEGL.so.1``'s ``eglGetProcAddress``, loaded once."""

    _loaded: Any = None

    @classmethod
    def address(cls, name: str) -> int | None:
        if cls._loaded is None:
            egl = ctypes.CDLL("libEGL.so.1")
            egl.eglGetProcAddress.restype = ctypes.c_void_p
            egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
            cls._loaded = egl
        return cls._loaded.eglGetProcAddress(name.encode())


def _entry(name: str, *argtypes: Any, restype: Any = None) -> Any:
    """The ctypes function of GL entry point ``name``, or None where the driver has none."""
    address = _EGL.address(name)
    return ctypes.CFUNCTYPE(restype, *argtypes)(address) if address else None


def _required(name: str, *argtypes: Any) -> Any:
    """The ctypes function of GL entry point ``name`` (no result).

    Raises:
        DeviceError: the driver has none.
    """
    function = _entry(name, *argtypes)
    if function is None:
        raise DeviceError(f"the driver has no {name}")
    return function


class GLFunctions:
    """The few GL entry points moderngl does not wrap (program binaries, integer limits, compute
    dispatches of a program made from a binary, timer queries); each a ctypes function or None."""

    def __init__(self) -> None:
        u, i, p = _U, _I, _P
        self.get_integerv = _entry("glGetIntegerv", u, p)
        self.get_integeri_v = _entry("glGetIntegeri_v", u, u, p)
        self.get_programiv = _entry("glGetProgramiv", u, u, p)
        self.get_program_binary = _entry("glGetProgramBinary", u, i, p, p, p)
        self.program_binary = _entry("glProgramBinary", u, u, p, i)
        self.program_parameteri = _entry("glProgramParameteri", u, u, i)
        self.create_program = _entry("glCreateProgram", restype=u)
        self.delete_program = _entry("glDeleteProgram", u)
        self.use_program = _entry("glUseProgram", u)
        self.dispatch_compute = _entry("glDispatchCompute", u, u, u)
        self.flush = _entry("glFlush")
        self.get_uniform_block_index = _entry("glGetUniformBlockIndex", u, ctypes.c_char_p, restype=u)
        self.get_active_uniform_blockiv = _entry("glGetActiveUniformBlockiv", u, u, u, p)
        # timer queries (desktop OpenGL 3.3+; OpenGL ES through GL_EXT_disjoint_timer_query)
        self.gen_queries = _entry("glGenQueries", i, p)
        self.delete_queries = _entry("glDeleteQueries", i, p)
        self.query_counter = _entry("glQueryCounter", u, u) or _entry("glQueryCounterEXT", u, u)
        self.get_query_object_ui64v = _entry("glGetQueryObjectui64v", u, u, p) or _entry(
            "glGetQueryObjectui64vEXT", u, u, p
        )

    @property
    def has_binaries(self) -> bool:
        """Whether every entry point that program binaries need was found."""
        return all(
            (
                self.get_programiv,
                self.get_program_binary,
                self.program_binary,
                self.create_program,
                self.delete_program,
                self.use_program,
                self.dispatch_compute,
                self.get_uniform_block_index,
                self.get_active_uniform_blockiv,
            )
        )

    @property
    def has_queries(self) -> bool:
        """Whether every entry point that timer queries need was found."""
        return all((self.gen_queries, self.delete_queries, self.query_counter, self.get_query_object_ui64v))

    def program_integer(self, program: int, pname: int) -> int:
        """``glGetProgramiv(program, pname)``."""
        value = ctypes.c_int(0)
        self.get_programiv(program, pname, ctypes.byref(value))
        return int(value.value)

    def integer(self, pname: int) -> int:
        """``glGetIntegerv(pname)``'s first value."""
        value = (ctypes.c_int * 4)()
        self.get_integerv(pname, value)
        return int(value[0])

    def indexed_integer(self, pname: int, index: int) -> int:
        """``glGetIntegeri_v(pname, index)``'s first value."""
        value = (ctypes.c_int * 4)()
        self.get_integeri_v(pname, index, value)
        return int(value[0])


class FeedbackFunctions(GLFunctions):
    """:class:`GLFunctions` and the entry points a draw with transform feedback needs.

    Raises:
        DeviceError: the driver lacks one of them (named).
    """

    def __init__(self) -> None:
        super().__init__()
        u, i, p, s = _U, _I, _P, _S
        self.bind_buffer = _required("glBindBuffer", u, u)
        self.bind_buffer_base = _required("glBindBufferBase", u, u, u)
        self.bind_buffer_range = _required("glBindBufferRange", u, u, u, s, s)
        self.bind_texture = _required("glBindTexture", u, u)
        self.active_texture = _required("glActiveTexture", u)
        self.tex_sub_image = _required("glTexSubImage2D", u, i, i, i, i, i, u, u, p)
        self.begin_feedback = _required("glBeginTransformFeedback", u)
        self.end_feedback = _required("glEndTransformFeedback")
        self.draw_arrays = _required("glDrawArrays", u, i, i)
        self.enable = _required("glEnable", u)
        self.disable = _required("glDisable", u)
        self.bind_vertex_array = _required("glBindVertexArray", u)
        self.use_program = _required("glUseProgram", u)

    def copy_to_texture(self, buffer: Any, texture: Any, width: int, texels: int) -> None:
        """Texels ``0 .. texels`` of ``buffer`` into ``texture`` (rows of ``width``), on the device
        (moderngl objects: a ``Buffer`` read as RGBA32F texels, a ``Texture``)."""
        full, rest = divmod(texels, width)
        self.bind_buffer(_PIXEL_UNPACK_BUFFER, buffer.glo)
        self.bind_texture(_TEXTURE_2D, texture.glo)
        if full:
            self.tex_sub_image(_TEXTURE_2D, 0, 0, 0, width, full, _RGBA, _FLOAT, None)
        if rest:
            self.tex_sub_image(_TEXTURE_2D, 0, 0, full, rest, 1, _RGBA, _FLOAT, ctypes.c_void_p(full * width * 16))
        self.bind_buffer(_PIXEL_UNPACK_BUFFER, 0)
