"""The kernel source files as the library reads them: their text, identifiers and kernel functions,
each read once per process."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

__all__ = [
    "read_source",
    "source_identifiers",
    "defines_kernel",
    "kernel_functions",
    "fixed_workgroup_kernels",
    "is_file",
]


@lru_cache(maxsize=256)
def source_identifiers(path: Path) -> frozenset:
    """The identifiers of the source file ``path`` (a define an entry names must be one of them)."""
    return frozenset(_IDENTIFIER.findall(read_source(path)))


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@lru_cache(maxsize=256)
def read_source(path: Path) -> str:
    """The text of the source file ``path``."""
    return path.read_text()


_KERNEL_FUNCTION = re.compile(r"(?:__)?kernel\s+(?:__attribute__\(\(.*\)\)\s+)?void\s+(\w+)\s*\(")


def defines_kernel(path: Path, function: str) -> bool:
    """Whether the source file ``path`` defines the kernel ``function``."""
    return function in kernel_functions(path)


@lru_cache(maxsize=256)
def kernel_functions(path: Path) -> frozenset:
    """The kernel functions the source file ``path`` defines (read once: every configuration of every
    entry naming the file is checked against it)."""
    return frozenset(_KERNEL_FUNCTION.findall(read_source(path)))


@lru_cache(maxsize=256)
def fixed_workgroup_kernels(path: Path) -> frozenset:
    """The kernel functions of the OpenCL source ``path`` that declare ``reqd_work_group_size`` (in
    their attribute, or through a macro the source defines as it)."""
    source = read_source(path)
    words = {"reqd_work_group_size"} | set(_REQD_MACRO.findall(source))
    return frozenset(
        name for attribute, name in _KERNEL_ATTRIBUTES.findall(source) if words & set(_IDENTIFIER.findall(attribute))
    )


_REQD_MACRO = re.compile(r"#\s*define\s+(\w+)\s+reqd_work_group_size\b")
_KERNEL_ATTRIBUTES = re.compile(r"(?:__)?kernel\s+(__attribute__\(\(.*\)\)\s+)?void\s+(\w+)\s*\(")


@lru_cache(maxsize=1024)
def is_file(path: Path) -> bool:
    """Whether ``path`` is a file, asked once per process (the kernel files do not come and go while
    the library is read; configuring an entry checks the same files again)."""
    return path.is_file()
