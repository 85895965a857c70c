"""The compute shaders of the ``gl`` backend: the GLSL preamble every kernel source gets, the fold
of a range of too many work-groups into z, and programs linked once per work-group shape, their
binaries cached on disk.

* a program is the source with the kernel-library entry's defines as ``#define`` lines after
  ``#version 310 es`` and the work-group size as ``layout(local_size_x ...)`` (a compile-time
  constant in GLSL, so one source is linked once per work-group shape it is launched with);
* the scalars fill a uniform block ``MalinnArgs`` at binding 0 (std140: one 4-byte slot each, after
  the launch's range ``malinn_range0``, ``malinn_range1`` and its fold ``malinn_fold``), declared
  by the shader with ``MALINN_ARGS(...)``;
* a range of more work-groups than a dimension dispatches (65535) is folded into z
  (:func:`fold_groups`), linked with index macros that add the fold back; shaders index through
  ``MALINN_GLOBAL_X`` ... ``MALINN_GROUP_Y`` (the plain built-ins where nothing is folded).
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from typing import TYPE_CHECKING, Any

from ..environment import switch
from ..errors import KernelBuildError
from ..io.cache import read_entry, write_entry

if TYPE_CHECKING:
    from .gl_base import GLBaseDevice
    from .gl_functions import GLFunctions

__all__ = [
    "GLProgram",
    "BinaryShader",
    "preamble",
    "fold_groups",
    "refused_options",
    "MAX_GROUPS",
    "RANGE_WORDS",
    "PREAMBLE_VERSION",
]

#: the shader language every GL compute source is written in
PREAMBLE_VERSION = "#version 310 es"
#: work-groups one dimension of a dispatch may hold: GL_MAX_COMPUTE_WORK_GROUP_COUNT's least value
#: (OpenGL ES 3.1 and desktop GL 4.3 alike; llvmpipe's and NVIDIA's y and z)
MAX_GROUPS = 65535
#: the words of MalinnArgs before a kernel's scalars: malinn_range0, malinn_range1, malinn_fold
RANGE_WORDS = 3

_PROGRAM_BINARY_LENGTH = 0x8741
_LINK_STATUS = 0x8B82
_UNIFORM_BLOCK_DATA_SIZE = 0x8A40
_INVALID_INDEX = 0xFFFFFFFF

#: defines of a reduced weight precision (kernels/weights.clh): a program asking for one from a
#: source that does not read it (no _WEIGHTS_MARK: gl/weights.glsl), or for half arithmetic (no GL
#: shader has it), is refused (BackendError) rather than reading half or int8 bytes as floats
_FP32_ONLY = ("-DWEIGHT_BITS", "-DHALF_ARITHMETIC")
_WEIGHTS_MARK = "#define MALINN_WEIGHT_BITS_READ"


def refused_options(source: str, options: tuple) -> list[str]:
    """The defines of ``options`` that ask for a weight precision ``source`` does not read: half
    arithmetic (``HALF_ARITHMETIC``, which no GL shader does), or half or int8 weights
    (``WEIGHT_BITS`` 16 or 8) from a source without ``gl/weights.glsl``."""
    return [
        o
        for o in options
        if o.partition("=")[0] in _FP32_ONLY
        and o.partition("=")[2] not in ("0", "32")
        and (o.startswith("-DHALF_ARITHMETIC") or _WEIGHTS_MARK not in source)
    ]


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


def preamble(options: tuple, local: tuple, folded: bool = False) -> str:
    """``#version``, the defines of ``options`` (``-DNAME=VALUE``), the work-group shape and the
    argument-block, index and range-guard macros every GL source uses; ``folded``: the indices of a
    dispatch folded along z (:func:`fold_groups`), else the plain built-ins (no cost where no
    launch needs the fold: NVIDIA's GL ran a gemm_keras head 19% slower with the folded ones).

    Raises:
        KernelBuildError: an option is not a ``-DNAME=VALUE`` define.
    """
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


class GLProgram:
    """A compute-shader source and its defines, linked once per work-group shape.

    Linked programs are cached on disk as program binaries (``glGetProgramBinary``) where the driver
    offers them, through :mod:`malinn.io.cache` like the OpenCL backend's (``MALINN_BINARY_CACHE=0``
    turns it off).
    """

    def __init__(self, device: GLBaseDevice, source: str, options: tuple, origin: str):
        self.device, self.source, self.options, self.origin = device, source, options, origin
        self.shaders: dict[tuple, Any] = {}

    def text(self, local: tuple, folded: bool = False) -> str:
        """The full GLSL source for work-group shape ``local`` (``folded``: for a dispatch folded
        along z, :func:`fold_groups`)."""
        return preamble(self.options, local, folded) + self.source

    def linked(self, local: tuple, folded: bool = False) -> Any:
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
                    raise KernelBuildError(
                        f"{self.origin}: the GLSL compute shader did not build on {device.name} "
                        f"(options {' '.join(self.options) or 'none'}, work-group {local}):\n"
                        f"{str(exc).strip()}"
                    ) from None
                device.count("builds")
                self._to_binary(key, shader.glo)
            self.shaders[(local, folded)] = shader
        return shader

    def binary_key(self, local: tuple, text: str) -> dict | None:
        """The full key of this program's binary in the cache, keyed like the OpenCL backend's (the
        source's hash, the defines, the renderer and the driver), with the work-group shape; ``None``
        where binaries are off (``MALINN_BINARY_CACHE=0``) or the driver offers no binary format."""
        device = self.device
        if not switch("MALINN_BINARY_CACHE", True) or not device.binary_formats or not device.gl.has_binaries:
            return None
        return {
            "backend": "gl",
            "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "options": list(self.options),
            "local": list(local),
            "device": device.name,
            "vendor": device.vendor,
            "driver": device.driver_version,
            "platform": device.platform,
        }

    def _from_binary(self, key: dict | None) -> BinaryShader | None:
        """A :class:`BinaryShader` from the cache entry for ``key``, or ``None`` (no entry, or the
        driver refuses it: a driver update; the caller then builds from source)."""
        if key is None:
            return None
        payload = read_entry("programs", key)
        if payload is None or len(payload) < 5:
            return None
        device, gl = self.device, self.device.gl
        (binary_format,) = struct.unpack("<I", payload[:4])
        blob = payload[4:]
        program = gl.create_program()
        gl.program_binary(program, binary_format, blob, len(blob))
        device.ctx.error  # clears an INVALID_ENUM for a format the driver no longer offers
        if not program or not gl.program_integer(program, _LINK_STATUS):
            gl.delete_program(program)
            return None
        index = gl.get_uniform_block_index(program, b"MalinnArgs")
        size = ctypes.c_int(0)
        if index != _INVALID_INDEX:
            gl.get_active_uniform_blockiv(program, index, _UNIFORM_BLOCK_DATA_SIZE, ctypes.byref(size))
        device.count("binary_hits")
        return BinaryShader(gl, program, None if index == _INVALID_INDEX else size.value)

    def _to_binary(self, key: dict | None, program: int) -> None:
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
        if self.device.ctx.error == "GL_NO_ERROR" and written.value > 0:
            write_entry("programs", key, struct.pack("<I", binary_format.value) + blob.raw[: written.value])


class BinaryShader:
    """A compute shader made from a cached program binary (moderngl builds only from source): what
    :meth:`GLDevice.bind` and :meth:`GLDevice.launch_all` use of moderngl's ``ComputeShader``, its
    ``MalinnArgs`` block's size and ``run``. The program lives as long as the device's context."""

    __slots__ = ("gl", "glo", "block")

    def __init__(self, gl: GLFunctions, program: int, block_size: int | None):
        self.gl, self.glo = gl, program
        self.block = None if block_size is None else type("UniformBlock", (), {"size": block_size})()

    def __getitem__(self, name: str) -> Any:
        if name != "MalinnArgs" or self.block is None:
            raise KeyError(name)
        return self.block

    def run(self, group_x: int = 1, group_y: int = 1, group_z: int = 1) -> None:
        """Dispatches the program over ``group_x x group_y x group_z`` work-groups."""
        self.gl.use_program(self.glo)
        self.gl.dispatch_compute(group_x, group_y, group_z)
