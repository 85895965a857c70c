"""A headless OpenGL ES 3.1+ context on an EGL device, for drivers whose desktop OpenGL has no
compute shaders (the Raspberry Pi's V3D: OpenGL 2.1, OpenGL ES 3.1).

glcontext's EGL backend (what moderngl makes its contexts with) binds the desktop OpenGL API only.
:class:`ESContext` makes the context itself through ``libEGL.so.1`` (ctypes: the device by
``eglQueryDevicesEXT``, its display by ``eglGetPlatformDisplayEXT``, ``eglBindAPI(EGL_OPENGL_ES_API)``,
no surface) and offers what moderngl asks of a glcontext object: ``load(name)`` (the entry point's
address, ``eglGetProcAddress``), ``__enter__`` / ``__exit__`` (current in this thread, the caller's
context restored after) and ``release``. ``backends/opengl.py`` registers it with glcontext.
"""

from __future__ import annotations

import ctypes
from typing import Any, Literal

__all__ = ["ESContext"]

_P = ctypes.c_void_p
_EGL_PLATFORM_DEVICE_EXT = 0x313F
_EGL_OPENGL_ES_API = 0x30A0
_EGL_RENDERABLE_TYPE = 0x3040
_EGL_OPENGL_ES3_BIT = 0x0040
_EGL_CONTEXT_MAJOR_VERSION = 0x3098
_EGL_CONTEXT_MINOR_VERSION = 0x30FB
_EGL_NONE = 0x3038
_EGL_DRAW, _EGL_READ = 0x3059, 0x305A


class _EGL:
    """The EGL entry points the context needs, from ``libEGL.so.1`` (loaded once)."""

    _loaded = None

    @classmethod
    def get(cls) -> "_EGL":
        if cls._loaded is None:
            cls._loaded = cls()
        return cls._loaded

    def __init__(self):
        lib = ctypes.CDLL("libEGL.so.1")
        lib.eglGetProcAddress.restype, lib.eglGetProcAddress.argtypes = _P, [ctypes.c_char_p]
        u, i = ctypes.c_uint, ctypes.c_int
        for name, restype, argtypes in (
            ("eglInitialize", u, [_P, _P, _P]),
            ("eglBindAPI", u, [u]),
            ("eglChooseConfig", u, [_P, _P, ctypes.POINTER(_P), i, ctypes.POINTER(i)]),
            ("eglCreateContext", _P, [_P, _P, _P, _P]),
            ("eglDestroyContext", u, [_P, _P]),
            ("eglMakeCurrent", u, [_P, _P, _P, _P]),
            ("eglGetCurrentContext", _P, []),
            ("eglGetCurrentDisplay", _P, []),
            ("eglGetCurrentSurface", _P, [i]),
            ("eglGetError", i, []),
        ):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib
        self.query_devices = self.extension("eglQueryDevicesEXT", u, i, ctypes.POINTER(_P), ctypes.POINTER(i))
        self.platform_display = self.extension("eglGetPlatformDisplayEXT", _P, u, _P, _P)

    def extension(self, name: str, restype: Any, *argtypes: Any) -> Any:
        address = self.lib.eglGetProcAddress(name.encode())
        return ctypes.CFUNCTYPE(restype, *argtypes)(address) if address else None

    def status(self) -> str:
        return f"EGL error 0x{self.lib.eglGetError():04X}"


class ESContext:
    """An OpenGL ES ``major.minor`` context on EGL device ``index``, current after construction
    (as glcontext's standalone contexts are).

    Raises:
        RuntimeError: no such device (the message says "requested device index", as glcontext's
            does), or EGL refused a step; the message names the step and the EGL status.
    """

    def __init__(self, index: int, major: int = 3, minor: int = 1):
        egl = self.egl = _EGL.get()
        if egl.query_devices is None or egl.platform_display is None:
            raise RuntimeError("EGL has no eglQueryDevicesEXT / eglGetPlatformDisplayEXT (EGL_EXT_device_enumeration)")
        devices, count = (_P * 32)(), ctypes.c_int(0)
        if not egl.query_devices(32, devices, ctypes.byref(count)) or index >= count.value:
            raise RuntimeError(f"requested device index {index}, but found {count.value} devices")
        self.display = egl.platform_display(_EGL_PLATFORM_DEVICE_EXT, devices[index], None)
        if not self.display or not egl.lib.eglInitialize(self.display, None, None):
            raise RuntimeError(f"eglInitialize failed on EGL device {index} ({egl.status()})")
        if not egl.lib.eglBindAPI(_EGL_OPENGL_ES_API):
            raise RuntimeError(f"eglBindAPI(EGL_OPENGL_ES_API) failed ({egl.status()})")
        config, found = _P(), ctypes.c_int(0)
        wanted = (ctypes.c_int * 3)(_EGL_RENDERABLE_TYPE, _EGL_OPENGL_ES3_BIT, _EGL_NONE)
        if (
            not egl.lib.eglChooseConfig(self.display, wanted, ctypes.byref(config), 1, ctypes.byref(found))
            or found.value < 1
        ):
            config = _P()  # a device display may list no configuration: EGL_KHR_no_config_context
        attributes = (ctypes.c_int * 5)(_EGL_CONTEXT_MAJOR_VERSION, major, _EGL_CONTEXT_MINOR_VERSION, minor, _EGL_NONE)
        self.context = egl.lib.eglCreateContext(self.display, config, None, attributes)
        if not self.context:
            raise RuntimeError(f"eglCreateContext for OpenGL ES {major}.{minor} failed ({egl.status()})")
        self._saved: list[tuple] = []
        self.__enter__()

    def load(self, name: str | bytes) -> int:
        """The address of GL entry point ``name`` (0 where the driver has none)."""
        return self.egl.lib.eglGetProcAddress(name.encode() if isinstance(name, str) else name) or 0

    def __enter__(self) -> ESContext:
        lib = self.egl.lib
        self._saved.append(
            (
                lib.eglGetCurrentDisplay(),
                lib.eglGetCurrentSurface(_EGL_DRAW),
                lib.eglGetCurrentSurface(_EGL_READ),
                lib.eglGetCurrentContext(),
            )
        )
        if not lib.eglMakeCurrent(self.display, None, None, self.context):
            self._saved.pop()
            raise RuntimeError(f"eglMakeCurrent failed ({self.egl.status()})")
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        display, draw, read, context = self._saved.pop() if self._saved else (None, None, None, None)
        if display:
            self.egl.lib.eglMakeCurrent(display, draw, read, context)
        else:
            self.egl.lib.eglMakeCurrent(self.display, None, None, None)
        return False

    def release(self) -> None:
        """Destroys the context (it must not be current in another thread)."""
        if self.context:
            self.egl.lib.eglMakeCurrent(self.display, None, None, None)
            self.egl.lib.eglDestroyContext(self.display, self.context)
            self.context = None
