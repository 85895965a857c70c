"""Headless GL contexts on EGL devices for the two GL backends, and the figures read from them.

The only module of malinn that imports moderngl (an optional extra: ``pip install malinn[gl]``);
the others reach it through :func:`load_moderngl`. A context is desktop OpenGL through glcontext's
EGL backend, or OpenGL ES through :class:`~malinn.backends.gles_context.ESContext`, which
:func:`register_es_backends` makes glcontext find by name (its own EGL backend binds desktop OpenGL
alone). ``MALINN_GL_API`` (:func:`requested_gl_api`) restricts either backend to one API.

* :func:`compute_context`: desktop OpenGL 4.3+, else OpenGL ES 3.1+ (compute shaders: the ``gl``
  backend, ``opengl.py``);
* :func:`vertex_context`: desktop OpenGL 3.3+ with ``GL_ARB_ES3_compatibility``, else OpenGL ES 3.0+
  (GLSL ES 3.00 vertex shaders: the ``gles3`` backend, ``gl_feedback.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import DeviceError
from .gl_functions import GLFunctions
from .gles_context import ESContext

__all__ = [
    "load_moderngl",
    "requested_gl_api",
    "register_es_backends",
    "compute_context",
    "vertex_context",
    "ContextFigures",
    "total_memory",
    "error_line",
    "SOFTWARE_RENDERERS",
    "REQUIRED_GL",
    "ES_BACKENDS",
]

#: renderers that run on the CPU (their devices are listed as type CPU)
SOFTWARE_RENDERERS = ("llvmpipe", "softpipe", "swiftshader", "lavapipe", "swrast")
#: the desktop OpenGL version whose compute shaders (and GLSL ES 3.10) the ``gl`` backend needs
REQUIRED_GL = 430
#: the glcontext backend names under which :class:`ESContext` is found: the OpenGL ES version each makes
ES_BACKENDS = {"malinn-gles": (3, 1), "malinn-gles30": (3, 0)}
#: the runtime packages' library names (libgl1, libegl1 ship only the .so.1; glcontext asks for the
#: development links libGL.so / libEGL.so by default)
_LIBRARIES = {"libgl": "libGL.so.1", "libegl": "libEGL.so.1"}
_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX = 0x9048


def load_moderngl() -> Any:
    """The moderngl module, imported on first use, so that malinn works without it.

    Raises:
        ImportError: moderngl is not installed (``pip install malinn[gl]``).
    """
    import moderngl  # the optional extra

    return moderngl


def requested_gl_api() -> str:
    """``MALINN_GL_API``: ``"es"`` (an OpenGL ES context only), ``"gl"`` (a desktop one only) or
    ``""`` (unset: either).

    Raises:
        DeviceError: another value (a typo would otherwise be ignored).
    """
    api = os.environ.get("MALINN_GL_API", "").strip().lower()
    if api not in ("", "es", "gl"):
        raise DeviceError(
            f"MALINN_GL_API={api!r} is neither 'gl' (desktop OpenGL only) nor 'es' (OpenGL ES "
            "only); unset it for either"
        )
    return api


def register_es_backends() -> None:
    """Lets moderngl make its contexts through :class:`ESContext` (``backend="malinn-gles"`` for
    OpenGL ES 3.1, ``"malinn-gles30"`` for 3.0: :data:`ES_BACKENDS`): glcontext finds backends by
    name only. Registering twice changes nothing."""
    import glcontext  # moderngl's own dependency

    if getattr(glcontext.get_backend_by_name, "malinn_gles", False):
        return
    by_name = glcontext.get_backend_by_name

    def get_backend_by_name(name: str) -> Any:
        if name in ES_BACKENDS:
            major, minor = ES_BACKENDS[name]
            return lambda mode="standalone", glversion=0, device_index=0, **settings: ESContext(
                int(device_index), major, minor
            )
        return by_name(name)

    setattr(get_backend_by_name, "malinn_gles", True)  # the mark of the wrapper (a function has no such field)
    glcontext.get_backend_by_name = get_backend_by_name


def _es_context(index: int, backend: str) -> Any:
    """A moderngl context over an OpenGL ES context of ``backend`` (:data:`ES_BACKENDS`) on EGL
    device ``index`` (raises on failure)."""
    register_es_backends()
    major, minor = ES_BACKENDS[backend]
    return load_moderngl().create_context(
        standalone=True, backend=backend, device_index=index, require=100 * major + 10 * minor
    )


def error_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name where it has none), for a warning."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def compute_context(index: int) -> Any:
    """A headless moderngl context on EGL device ``index`` with compute shaders: desktop OpenGL
    4.3+, else OpenGL ES 3.1+ (the Raspberry Pi's V3D has compute shaders in ES alone);
    ``MALINN_GL_API=es`` for OpenGL ES only, ``MALINN_GL_API=gl`` for desktop OpenGL only. It is
    left current in the calling thread, as moderngl leaves a new context.

    Raises:
        DeviceError: the device makes neither; the message names the renderer and the version it
            offers (compute shaders came with OpenGL 4.3 and OpenGL ES 3.1).
        Exception: moderngl's own, when no context can be made at all (past the last device, ...).
    """
    moderngl = load_moderngl()
    api = requested_gl_api()
    if api == "es":
        return _es_context(index, "malinn-gles")
    try:
        return moderngl.create_context(
            standalone=True, backend="egl", device_index=index, require=REQUIRED_GL, **_LIBRARIES
        )
    except Exception as exc:
        if "requested device index" in str(exc):
            raise
        failure = exc
    es_failure = None
    if api != "gl":
        try:
            return _es_context(index, "malinn-gles")
        except Exception as exc:
            es_failure = error_line(exc)
    for version in (330, 210):  # what the device offers instead, to say so
        try:
            ctx = moderngl.create_context(
                standalone=True, backend="egl", device_index=index, require=version, **_LIBRARIES
            )
        except Exception:
            continue
        try:
            info = ctx.info
            renderer, offered = str(info["GL_RENDERER"]).strip(), str(info["GL_VERSION"]).strip()
        finally:
            ctx.release()
        raise DeviceError(
            f"{renderer} offers OpenGL {offered}"
            + (f" and no OpenGL ES 3.1 ({es_failure})" if es_failure else "")
            + f"; malinn's GL kernels are compute shaders, which need OpenGL "
            f"{REQUIRED_GL // 100}.{REQUIRED_GL // 10 % 10} or OpenGL ES 3.1 (without them: the gles3 "
            "backend's vertex shaders, backends/gl_feedback.py)"
        ) from None
    raise failure


def vertex_context(index: int) -> Any:
    """A headless moderngl context on EGL device ``index`` that compiles GLSL ES 3.00: desktop
    OpenGL 3.3+ (with ``GL_ARB_ES3_compatibility``), else OpenGL ES 3.0+; ``MALINN_GL_API=es`` for
    OpenGL ES only, ``MALINN_GL_API=gl`` for desktop OpenGL only. Left current, as
    :func:`compute_context`'s.

    Raises:
        DeviceError: desktop OpenGL only was asked for, and it has no GLSL ES 3.00.
        Exception: moderngl's own, when no context can be made.
    """
    moderngl = load_moderngl()
    api = requested_gl_api()
    if api == "es":
        return _es_context(index, "malinn-gles30")
    failure: Exception
    try:
        ctx = moderngl.create_context(standalone=True, backend="egl", device_index=index, require=330, **_LIBRARIES)
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
    return _es_context(index, "malinn-gles30")


@dataclass(frozen=True)
class ContextFigures:
    """What a new context says of its device: renderer, version and vendor strings, whether it runs
    on the CPU (:data:`SOFTWARE_RENDERERS`) and whether it is an OpenGL ES context."""

    renderer: str
    version: str
    vendor: str
    software: bool
    es: bool

    @classmethod
    def of(cls, ctx: Any) -> "ContextFigures":
        """The figures of moderngl context ``ctx`` (current in this thread)."""
        info = ctx.info
        ctx.error  # moderngl's info asks for desktop-only limits on an ES context: clear the GL error
        renderer, version = str(info["GL_RENDERER"]).strip(), str(info["GL_VERSION"]).strip()
        return cls(
            renderer,
            version,
            str(info["GL_VENDOR"]).strip(),
            any(s in renderer.lower() for s in SOFTWARE_RENDERERS),
            version.startswith("OpenGL ES"),
        )

    @property
    def platform(self) -> str:
        """The device's platform string: the ES version string, or ``OpenGL <version>``."""
        return self.version if self.es else f"OpenGL {self.version}"

    @property
    def type(self) -> str:
        """The device type: ``"CPU"`` for a software renderer, else ``"GPU"``."""
        return "CPU" if self.software else "GPU"


def total_memory(ctx: Any, gl: GLFunctions, max_allocation: int) -> int:
    """The device's memory: NVIDIA's figure where it gives one, else the host's (a CPU renderer, or a
    board whose GPU shares the host's memory); GL has no standard query."""
    if "GL_NVX_gpu_memory_info" in ctx.extensions:
        return gl.integer(_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX) * 1024
    try:
        return max(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), max_allocation)
    except (ValueError, OSError, AttributeError):
        return max_allocation
