"""The program-binary cache of an OpenCL device: binaries keyed by source, options, device and
driver, each checked before the driver sees it and stored only once it is known to load.

A binary is checked and stored by the thread that built its program, under the program's build
lock (:func:`~malinn.io.cache.build_lock`: of several processes building it at once, one builds and
stores it, the others load it). Storing it after the first prediction instead, from a thread of
its own while the plan's kernels ran, made PoCL 3.1 abort a process once in twelve
(``pocl_release_dlhandle_cache: Assertion 'found->ref_count > 0'``; none in fourteen with the
stores in the build threads), so the stores run beside the other builds only.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..environment import switch
from ..io.cache import DamagedEntry, in_use, read_entry, users_died, write_entry
from .opencl_driver import (
    CL_BUILD_SUCCESS,
    SOURCE_COMMENTS,
    build_quietly,
    kernel_names,
    pyopencl_module,
    status_name,
    wrapped_program,
)

if TYPE_CHECKING:
    import pyopencl

__all__ = ["BinaryCache", "pocl_binary_problem"]

_logger = logging.getLogger("malinn.backends.opencl")

#: the magic numbers of LLVM bitcode, raw and in its wrapper
_BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
_POCL_MAGIC = b"poclbin\0"


def pocl_binary_problem(binary: bytes) -> str | None:
    """What makes a PoCL program binary incomplete, or ``None`` for a whole one.

    PoCL's binary (``lib/CL/pocl_binary.c``: format versions 6-11, PoCL 1.x-7.x) is a header, the
    files of the program's folder in PoCL's kernel cache (its ``program.bc``, the program's LLVM
    bitcode, above all) and a record per kernel. PoCL serialises that folder as it finds it on disk:
    a build of the same program in another process that replaces ``program.bc`` at that moment
    (PoCL 3.1 removes the old file before renaming the new one in) leaves a binary without it, and
    PoCL aborts the process that loads it (``pocl_binary_get_kernels_metadata: Assertion 'len > 0'``).
    So a binary reaches PoCL only when its ``program.bc`` is there and is bitcode, every file and
    kernel record is whole and the records end where the binary does. A format version this does not
    know passes on the magic and a kernel count.
    """
    data = memoryview(binary)
    if len(data) < 32 or bytes(data[:8]) != _POCL_MAGIC:
        return "not a PoCL binary (no 'poclbin' magic)"
    version, kernels = struct.unpack_from("<II", data, 16)
    flags = struct.unpack_from("<Q", data, 24)[0]
    if kernels == 0:
        return "a PoCL binary of no kernel"
    if not 6 <= version <= 11:
        return None
    try:
        if version <= 8:  # program.bc's path and contents right after the header and the build hash
            files, offset = _pocl_files(data, 32 + 41, 1)
        else:  # root entries, each its size and then its files
            entries, offset = struct.unpack_from("<I", data, 32)[0], 36 + 41
            if version >= 10 and flags & 2:  # the size of the program's scope variables
                offset += 8
            files = {}
            for _ in range(entries):
                size = struct.unpack_from("<Q", data, offset)[0]
                if size == 0:  # the folder's file was missing when PoCL serialised it
                    return (
                        f"a PoCL binary whose root entry at byte {offset} is empty (its program.bc, the "
                        f"program's LLVM bitcode, was missing when PoCL wrote it): PoCL would abort loading it"
                    )
                if offset + 8 + size > len(data):
                    return f"a PoCL binary cut short in its root entry at byte {offset}"
                found, end = _pocl_files(data[: offset + 8 + size], offset + 8, None)
                if end != offset + 8 + size:
                    return f"a PoCL binary whose root entry at byte {offset} does not end with its files"
                files.update(found)
                offset = end
        bitcode = files.get("/program.bc")
        if bitcode is None:
            return "a PoCL binary without its program.bc (the program's LLVM bitcode): PoCL would abort loading it"
        if bytes(bitcode[:4]) not in _BITCODE_MAGICS:
            return (
                f"a PoCL binary whose program.bc is {'empty' if not len(bitcode) else 'not LLVM bitcode'}: "
                f"PoCL would abort loading it"
            )
        for index in range(kernels):
            size = struct.unpack_from("<Q", data, offset)[0]
            if size < 24 or offset + size > len(data):
                return f"a PoCL binary whose kernel record {index + 1} of {kernels} is cut (at byte {offset})"
            offset += size
    except struct.error:
        return "a PoCL binary cut short"
    if offset != len(data):
        return f"a PoCL binary with {len(data) - offset} bytes after its {kernels} kernel records"
    return None


def _pocl_files(data: memoryview, offset: int, count: int | None) -> tuple[dict[str, memoryview], int]:
    """PoCL's serialised files from ``offset``: ``count`` of them, or (None) up to the end of
    ``data``; returns ({path: contents}, the offset after them). A file is its path's length (4
    bytes), the path, its contents' length (4 bytes) and the contents."""
    files: dict[str, memoryview] = {}
    while (count is None and offset < len(data)) or (count is not None and len(files) < count):
        n = struct.unpack_from("<I", data, offset)[0]
        path = bytes(data[offset + 4 : offset + 4 + n]).decode("utf-8", "replace")
        if n == 0 or offset + 4 + n > len(data):
            raise struct.error("a file without a path")
        offset += 4 + n
        n = struct.unpack_from("<I", data, offset)[0]
        if offset + 4 + n > len(data):
            raise struct.error("a file cut short")
        files[path] = data[offset + 4 : offset + 4 + n]
        offset += 4 + n
    return files, offset


class BinaryCache:
    """The program-binary cache's side of :class:`~malinn.backends.opencl.OpenCLDevice` (a mixin:
    it reads the device's ``context``, ``cl_device``, identity and ``is_pocl``)."""

    # what it reads of the device (:class:`~malinn.backends.base.Device`'s and
    # :class:`~malinn.backends.opencl.OpenCLDevice`'s fields)
    name: str
    vendor: str
    platform: str
    driver_version: str
    context: pyopencl.Context
    cl_device: pyopencl.Device
    if TYPE_CHECKING:

        @property
        def is_pocl(self) -> bool: ...

        def count_build(self, key: str) -> None: ...

    def _binary_key(self, source: str, options: Iterable[str]) -> dict | None:
        """The full key of a program binary in the cache (``None`` when ``MALINN_BINARY_CACHE=0``)."""
        if not switch("MALINN_BINARY_CACHE", True):
            return None
        return {
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "options": list(options),
            "device": self.name,
            "vendor": self.vendor,
            "driver": self.driver_version,
            "platform": self.platform,
        }

    def _build_lock_name(self, source: str, options: Iterable[str]) -> str:
        """What names a program to :func:`~malinn.io.cache.build_lock`: the device, the options and the
        source without its comments and spacing, as PoCL's kernel cache tells programs apart (by
        the preprocessed source): two library entries of one source and configuration are one
        program there."""
        text = " ".join(SOURCE_COMMENTS.sub(" ", source).split())
        return "\0".join([self.platform, self.name, self.driver_version, *options, text])

    def _from_binary(self, key: dict | None, options: Iterable[str]) -> pyopencl.Program | None:
        """The program loaded from its binary in the cache, or ``None`` (absent, damaged, refused).

        Besides the entry's own checks, a binary for PoCL must pass :func:`pocl_binary_problem`
        before the driver sees it, and is marked in use while the driver loads it
        (:func:`~malinn.io.cache.in_use`): a driver that still crashes on it costs this process only,
        the next one discards it."""
        if key is None:
            return None
        binary = read_entry("programs", key, check=self._check_stored_binary)
        if binary is None:
            return None
        cl = pyopencl_module()
        try:
            with in_use("programs", key):
                raw = cl._cl._Program(self.context, [self.cl_device], [binary])
                build_quietly(raw, self.cl_device, list(options))
            program = wrapped_program(raw, None)
        except Exception:  # the driver refuses a verified binary (a driver update): rebuild from source
            return None
        self.count_build("binary_hits")
        return program

    def _check_stored_binary(self, binary: bytes) -> None:
        """Raises :class:`~malinn.io.cache.DamagedEntry` for a stored binary the driver would crash on
        (one stored by an earlier malinn, before binaries were checked when stored)."""
        problem = pocl_binary_problem(binary) if self.is_pocl else (None if binary else "an empty binary")
        if problem:
            raise DamagedEntry(problem)

    def _to_binary(self, key: dict | None, program: Any) -> None:
        """Stores ``program``'s binary under ``key`` once it is known to load: the driver's build
        succeeded, the binary is not empty, its bytes pass :func:`pocl_binary_problem` on PoCL, and
        a new program made from it in this process builds and has the same kernels. A binary that
        fails is not stored (the next process builds the program again), nor one whose check a
        process died in before (the driver crashes on its own binaries of this program)."""
        if key is None or users_died("programs", key):
            return
        binary, problem = self._loadable_binary(program, key)
        if problem or binary is None:  # no binary comes with a problem
            _logger.debug("not caching a binary for %s: %s", self.name, problem)
            return
        write_entry("programs", key, binary)

    def _loadable_binary(self, program: Any, key: dict) -> tuple[bytes | None, str | None]:
        """``(binary, None)``, or ``(binary or None, why it would not load in another process)``."""
        cl = pyopencl_module()
        try:
            status = program.get_build_info(self.cl_device, cl.program_build_info.STATUS)
            binary = bytes(program.get_info(cl.program_info.BINARIES)[0])
        except Exception as exc:  # a driver without binaries: caching is optional
            return None, f"the driver gives no binary ({exc})"
        return binary, self._binary_problem(binary, status, kernel_names(program), key)

    def _binary_problem(self, binary: bytes, status: object, kernels: list[str], key: dict) -> str | None:
        cl = pyopencl_module()
        if status != CL_BUILD_SUCCESS:
            return f"the driver's build status is {status}, not success"
        if not binary:
            return "the driver's binary is empty"
        if self.is_pocl:
            problem = pocl_binary_problem(binary)
            if problem:
                return problem
        try:
            with in_use("programs", key):  # a crash in here is remembered: the next process stores none
                raw = cl._cl._Program(self.context, [self.cl_device], [binary])
                build_quietly(raw, self.cl_device, list(key["options"]))
                again = raw.get_build_info(self.cl_device, cl.program_build_info.STATUS)
                loaded = kernel_names(raw)
        except Exception as exc:  # caching is optional: never a reason for a build to fail
            return f"the driver refuses its own binary ({status_name(exc)})"
        if again != CL_BUILD_SUCCESS:
            return f"the driver's build of its own binary has status {again}"
        if loaded != kernels:
            return f"the binary's kernels are {loaded}, the program's {kernels}"
        return None
