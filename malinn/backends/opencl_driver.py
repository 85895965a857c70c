"""pyopencl's calls that every part of the OpenCL backend shares: the module itself (imported on
first use), status names, builds without pyopencl's warnings, build logs that name the kernel file
and line, and the names of a device's driver (:mod:`malinn.backends.opencl` and the modules beside it
are the only importers of pyopencl).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyopencl

# Programs (pyopencl's ``Program`` and its underlying ``_cl._Program``) are typed ``Any`` here: their
# ``get_info`` and ``get_build_info`` answer ``object`` whatever the key asks, and this module reads
# strings, lists and statuses from them.

__all__ = ["status_name", "POCL_PLATFORM", "QUIET_BUILD_OPTIONS"]

#: the platform name PoCL reports (its CPU device here)
POCL_PLATFORM = "Portable Computing Language"
#: added to every build's options: a build that succeeded may still have compiler warnings, about
#: the driver's own headers (PoCL on a CPU without AVX-512, of its float16 built-ins); "-w" keeps
#: PoCL's compiler from printing "3 warnings generated" on stderr. Part of a cached binary's key: one
#: built without it by an earlier malinn is not found (PoCL would print its warnings again)
QUIET_BUILD_OPTIONS = ("-w",)


def pyopencl_module() -> ModuleType:
    import pyopencl as cl  # imported on first use so that `import malinn` never fails for lack of a driver

    return cl


def caches_its_builds(cl_device: pyopencl.Device) -> bool:
    """Whether ``cl_device``'s driver caches builds from source itself (pyopencl knows NVIDIA's and
    PoCL's); asked once, when the device is probed."""
    from pyopencl.characterize import has_src_build_cache  # pyopencl on first use, as in pyopencl_module()

    return bool(has_src_build_cache(cl_device))


def status_name(error: Exception) -> str:
    """The OpenCL status name (e.g. ``CL_OUT_OF_RESOURCES``) carried by a pyopencl error."""
    cl = pyopencl_module()
    try:
        code = int(getattr(error, "code"))  # pyopencl.Error's; another exception has none
    except Exception:
        code = None
    if code is not None:
        for name in dir(cl.status_code):
            if not name.startswith("_") and getattr(cl.status_code, name) == code:
                return f"CL_{name}"
        return f"OpenCL status {code}"
    return type(error).__name__


def defined_names(options: Iterable[str]) -> set[str]:
    """The macro names compiler ``options`` define or undefine (``-DNAME``, ``-DNAME=V``, ``-D NAME=V``,
    ``-UNAME``)."""
    names: set[str] = set()
    tokens = list(options)
    for i, token in enumerate(tokens):
        if token in ("-D", "-U") and i + 1 < len(tokens):
            token = token + tokens[i + 1]
        if token[:2] in ("-D", "-U") and len(token) > 2:
            names.add(token[2:].split("=", 1)[0])
    return names


def build_quietly(raw: Any, cl_device: pyopencl.Device, options: list) -> str:
    """Builds pyopencl's underlying program ``raw`` for ``cl_device``; returns the build log.

    pyopencl's ``Program.build`` turns any non-empty log into a ``CompilerWarning``, and NVIDIA's
    driver (580) logs a line for every kernel, "-w" or not ("Function f is a kernel, so overriding
    noinline attribute"): a warning on every build that a user can neither act on nor silence but
    with a process-wide warnings filter, which is not thread-safe. The underlying build call
    (``_build``, which pyopencl's own ``build`` wraps) warns of nothing; the caller keeps the log.

    Raises:
        pyopencl.Error: the build failed (its log: :func:`build_log`).
    """
    cl = pyopencl_module()
    # the options pyopencl's build adds (its include folder; a define on Oclgrind) too: a driver
    # caches builds by their options (PoCL's kernel cache), and these are the ones it has seen
    options_bytes, _ = cl.Program._process_build_options(raw.get_info(cl.program_info.CONTEXT), options)
    raw._build(options=options_bytes, devices=[cl_device])
    return build_log(raw, cl_device)


def wrapped_program(raw: Any, source: str | None) -> pyopencl.Program:
    """pyopencl's ``Program`` around its built underlying program ``raw``, with the ``_source``
    attribute its ``Kernel`` reads: without it the lookup falls through to a kernel of that name, a
    failed clCreateKernel (which Oclgrind's API check reports)."""
    program = pyopencl_module().Program(raw)
    program._source = source
    return program


_LOG_PLACE = re.compile(r"^(\S+?):(\d+):(?:\d+:)?", re.M)


def with_files(log: str, source: str) -> str:
    """``log`` with each place a compiler names in the joined program (``<kernel>:64:`` on NVIDIA,
    which ignores ``#line``; a temporary file's name elsewhere) followed by the kernel file and line
    it is (``[activation.cl:22]``), from the ``#line 1 "file"`` markers the library puts before
    each file (:meth:`~malinn.library.kernel_library.KernelSpec.program_source`)."""
    marks = [
        (i + 1, name) for i, line in enumerate(source.splitlines()) for name in re.findall(r'^#line 1 "([^"]+)"$', line)
    ]
    if not marks:
        return log
    names = {name for _, name in marks}

    def place(match: re.Match[str]) -> str:
        if match.group(1) in names:  # the driver honoured #line
            return match.group(0)
        line = int(match.group(2))
        found = [(start, name) for start, name in marks if start < line]
        return f"{match.group(0)} [{found[-1][1]}:{line - found[-1][0]}]" if found else match.group(0)

    return _LOG_PLACE.sub(place, log)


def build_log(raw: Any, cl_device: pyopencl.Device) -> str:
    """The build log of pyopencl's underlying program ``raw`` for ``cl_device``, stripped."""
    cl = pyopencl_module()
    try:
        return (raw.get_build_info(cl_device, cl.program_build_info.LOG) or "").strip()
    except cl.Error:
        return ""


#: CL_BUILD_SUCCESS, a program's build status once built (pyopencl names no such constant)
CL_BUILD_SUCCESS = 0
#: C comments, for telling programs apart as a compiler's preprocessor does
SOURCE_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def kernel_names(program: Any) -> list[str]:
    """The kernel names of a built program, sorted (``[]`` where the driver does not say: OpenCL 1.1)."""
    try:
        return sorted(filter(None, program.get_info(pyopencl_module().program_info.KERNEL_NAMES).split(";")))
    except Exception:
        return []


def safe_name(obj: Any) -> str:
    try:
        return obj.name.strip()
    except Exception:
        return "unnamed"


def safe_attr(obj: Any, name: str) -> str:
    try:
        return str(getattr(obj, name))
    except Exception:
        return ""
