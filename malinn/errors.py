"""The exceptions malinn raises.

Every error malinn raises about a device, a kernel, a file or a conversion derives from
:class:`MalinnError`, so a service can catch one type; bad arguments (a wrong shape, an unknown
option) raise a plain ``ValueError``, as Keras's do, and errors of that kind that malinn defines
derive from both.
"""


class MalinnError(Exception):
    """Base class of the errors malinn defines (a plain ``ValueError`` for bad arguments is not one)."""


class DeviceError(MalinnError, RuntimeError):
    """No usable OpenCL device, a bad device choice, or an OpenCL call that failed."""


class KernelBuildError(MalinnError, RuntimeError):
    """An OpenCL program failed to build; the message holds the build log and options."""


class LibraryError(MalinnError, ValueError):
    """``kernels/library.json`` is malformed; the message names the entry and field."""


class LayoutError(MalinnError, ValueError):
    """A layout representation string is malformed or a matrix does not fit a layout."""


class ConversionError(MalinnError, ValueError):
    """A model file cannot be read or converted; the message names the file and the cause."""


class SettingError(MalinnError, ValueError):
    """A malinn environment variable holds a value malinn does not read; the message names it."""


class BackendError(LibraryError):
    """What a model needs has no kernel on the device's backend (an op or a weight precision the
    OpenGL backend has no shader for); the message names it and the backends that have one."""
