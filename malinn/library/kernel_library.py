"""The kernel library (Rovder 4.4.1, 8.3): ``kernels/library.json`` read, validated and rendered.

Each entry maps a codename to an OpenCL function, its source file and its restrictions:

* one entry per matrix argument (``a``, ``b``, ``r``): ``representation`` (a layout string, or
  ``"*"`` for a kernel that works in any layout through the ``MALINN_INDEX_<X>`` macro),
  ``rowAlign`` and ``colAlign`` (the padded shape must be a multiple of these), ``image``
  (true: passed as an RGBA float image2d, four rows of a column per texel) and, for ``a``,
  ``logicalRows`` (true: the kernel reads A only in rows below m rounded up to A's own
  alignment, so A needs no more rows than that, however far R is padded);
* ``arglist``: the scalar arguments, one letter each, in order (``l`` padded common dimension,
  ``h``/``w`` padded rows/columns of ``r``, ``m``/``n`` logical rows/columns of ``r``,
  ``H``/``W`` padded rows/columns of ``a``, all ``uint``; ``p`` the next float parameter);
* ``params``: names and defaults of the float parameters, in the order of the ``p`` letters
  (e.g. ``{"alpha": 1.0}``); ``p`` letters beyond them get 0;
* ``buffers``: the buffer arguments after the scalars, in order (matrix names, or the vectors
  ``bias``, ``scale``, ``shift``, or ``scratch``: a buffer of the entry's ``scratch_bytes``, an
  expression over the defines and the scalar letters, that the runtime allocates zeroed, keeps per
  device and size and passes to every launch: the kernel must leave it as it expects to find it);
* ``ndrange``: the letters whose values make the global range, divided by ``scale`` and
  multiplied by ``split`` (items that share one block of results, e.g. a K loop split across a
  work-group and reduced in local memory; default 1);
* ``flop``: floating-point operations per result, for GFLOP/s figures;
* ``workgroup``: the preferred local size, used when it divides the range, else ``null``;
* ``argdefines``: defines that the OpenCL source takes as 32-bit (``uint``, or ``int`` where one may
  be negative) arguments after its buffers, in order, rather than as ``-D`` options (sizes and offsets that vary from layer to layer: one
  program then serves every layer, :meth:`KernelSpec.define_arguments`); their values are the
  configuration's defines, as for any define. ``divide:NAME`` is two ``uint`` arguments, the magic
  numbers that divide by define ``NAME`` with a multiplication (:func:`division_magic`: a division
  by a number known only at run time is a hardware divide per work item, which a CPU does not
  vectorise). Another backend's source takes them all as defines.

An entry may carry ``defines`` (rendered as ``-DNAME=VALUE``), so one source serves many variants:
choosing another implementation is choosing another codename, and adding one needs no Python.
Restriction numbers may be expressions over the defines (``"rowAlign": "MWG"``); an entry with
``candidates`` (a list of define overrides) and ``constraints`` (expressions every configuration
must satisfy) is a family the tuner times (:meth:`KernelSpec.configurations`, :meth:`KernelSpec.configure`).
``sources`` gives the kernel in another backend's language, by backend name (``{"gl": {"source":
"gl/gemv.comp", "includes": [...]}}``, or just the file): the entry's restrictions, defines and
epilogue serve every backend, and a backend uses only the entries that have a source for it
(:meth:`KernelSpec.has_source`; OpenCL's is ``source``); a source's ``loop_iterations`` bounds the loop
iterations one invocation runs, for devices whose driver ends loops early (:meth:`KernelSpec.loops_fit`). ``includes`` lists headers prepended to the source; ``epilogue`` lists what a matmul can fuse into
its final write (``bias``, ``activation``, ``affine``, ``softmax``: defines ``BIAS``, ``ACTIVATION``,
``AFFINE``, ``SOFTMAX``; kernels/epilogue.clh) and ``view`` (it writes R only through ``R_AT``, so
``R_VIEW`` with ``R_OFFSET``, ``R_LD``, ``R_ROWS``, ``R_SPARE`` puts R in a slice of a larger buffer); ``preconditions`` (``min_m``/``max_m``, ``min_k``/
``max_k``, ``min_n``/``max_n``, numbers or expressions over the defines) say for which product
shapes a kernel is worth choosing (or, for a softmax epilogue, able to hold whole columns).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..errors import LibraryError
from ..resources import kernels_dir, kernels_overridden
from .entry_fields import (
    EPILOGUE_DEFINES,
    EPILOGUE_OPS,
    MATMUL_CHOICES,
    OPS,
    PRECONDITIONS,
    VIEW_ARGUMENTS,
    VIEW_DEFINES,
)
from .entry_validation import (
    CHOICE_FIELDS,
    ENTRY_FIELDS,
    MATRIX_FIELDS,
    RESTRICTION_FIELDS,
    SOURCE_FIELDS,
    unknown_fields,
    validate_entry,
    with_base,
)
from .kernel_spec import KernelSpec
from .library_lookups import KernelLibrary
from .matrix_restriction import MATRIX_NAMES, SCRATCH_NAME, VECTOR_NAMES, MatrixRestriction
from .precision_table import DEFAULT_PRECISION, WEIGHT_OPS, WEIGHTS_HEADER, Precision, parse_precisions
from .scalar_arguments import DIVIDE, SCALAR_LETTERS, division_magic, letter_values

__all__ = [
    "KernelSpec",
    "MatrixRestriction",
    "KernelLibrary",
    "Precision",
    "load_library",
    "DEFAULT_PRECISION",
    "OPS",
    "EPILOGUE_OPS",
    "WEIGHT_OPS",
    "WEIGHTS_HEADER",
    "SCALAR_LETTERS",
    "LIBRARY_FORMAT",
    "LIBRARY_VERSION",
    "MATRIX_NAMES",
    "VECTOR_NAMES",
    "SCRATCH_NAME",
    "EPILOGUE_DEFINES",
    "VIEW_DEFINES",
    "VIEW_ARGUMENTS",
    "PRECONDITIONS",
    "MATMUL_CHOICES",
    "ENTRY_FIELDS",
    "RESTRICTION_FIELDS",
    "MATRIX_FIELDS",
    "SOURCE_FIELDS",
    "CHOICE_FIELDS",
    "DIVIDE",
    "division_magic",
    "letter_values",
]

#: what a kernel library file says it is (its "format" and "version"): another is refused by name
LIBRARY_FORMAT, LIBRARY_VERSION = "malinn-kernel-library", 1


def load_library(path: "str | Path | None" = None) -> KernelLibrary:  # noqa: D417
    """Reads and validates a kernel library JSON file.

    Every entry's fields are checked. A library named here or by ``MALINN_KERNELS`` is also checked
    in depth: every configuration its candidates give resolves, and every define appears in its
    sources (a misspelled one). The shipped library's depth is checked by its tests
    (tests/test_kernel_library.py), not again at every start of a process (``benchmarks/cold_start.py``'s
    ``load_model`` phase went from 53.5 to 24.1 ms on a 2-core CPU's PoCL); a configuration is still
    checked when it is used.

    Args:
        path: the JSON file (default: ``library.json`` in the kernels folder: the shipped one, or
            ``MALINN_KERNELS``'s).

    Returns:
        A :class:`KernelLibrary`.

    Raises:
        LibraryError: the file is missing or not JSON, or an entry is wrong; the message names the
            entry and the field.
    """
    if path is None:
        return _default_library()
    return _load(Path(path).resolve())


@lru_cache(maxsize=1)
def _default_library() -> KernelLibrary:
    return _load((kernels_dir() / "library.json").resolve(), deep=kernels_overridden())


@lru_cache(maxsize=8)
def _load(path: Path, deep: bool = True) -> KernelLibrary:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise LibraryError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise LibraryError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise LibraryError(f"{path}: expected an object with a 'kernels' object")
    if (data.get("format"), data.get("version")) != (LIBRARY_FORMAT, LIBRARY_VERSION):
        raise LibraryError(
            f'{path}: expected "format": {LIBRARY_FORMAT!r} and "version": {LIBRARY_VERSION} '
            f"(this malinn reads that library), got {data.get('format')!r} and {data.get('version')!r}"
        )
    precisions = parse_precisions(path, data.get("precisions"))
    kernels = {}
    for codename, entry in data["kernels"].items():
        kernels[codename] = validate_entry(
            path,
            codename,
            with_base(path, codename, entry, data["kernels"], (codename,)),
            precisions,
            entry.get("variant_of") if isinstance(entry, dict) else None,
            deep,
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise LibraryError(f"{path}: field 'defaults': expected an object")
    for name, table in defaults.items():
        op = "matmul" if name in MATMUL_CHOICES else name
        if op not in OPS or not isinstance(table, dict):
            raise LibraryError(
                f"{path}: field 'defaults.{name}': expected one of {OPS + MATMUL_CHOICES[1:]} mapping to an object"
            )
        for kind, value in table.items():
            choices = value if isinstance(value, list) and value else [value]
            for choice in choices:
                codename = choice.get("codename") if isinstance(choice, dict) else choice
                if not isinstance(codename, str) or codename not in kernels or kernels[codename].op != op:
                    raise LibraryError(f"{path}: field 'defaults.{name}.{kind}': {codename!r} is not a {op} kernel")
                if isinstance(choice, dict):
                    unknown = unknown_fields(choice, CHOICE_FIELDS)
                    if unknown:
                        raise LibraryError(
                            f"{path}: field 'defaults.{name}.{kind}': unknown field {unknown[0]!r} of "
                            f"{codename!r}; expected one of {', '.join(CHOICE_FIELDS)}"
                        )
                    try:
                        kernels[codename].configure(choice.get("defines"))
                    except LibraryError as exc:
                        raise LibraryError(f"{path}: field 'defaults.{name}.{kind}.defines': {exc}") from None
                    serves = choice.get("precisions", [DEFAULT_PRECISION])
                    if (
                        not isinstance(serves, list)
                        or not serves
                        or not set(serves) <= set(kernels[codename].precisions)
                    ):
                        raise LibraryError(
                            f"{path}: field 'defaults.{name}.{kind}.precisions': expected a list of "
                            f"precisions {codename!r} supports ({', '.join(kernels[codename].precisions)}), "
                            f"got {serves!r}"
                        )
    sections = {k: v for k, v in data.items() if k not in ("kernels", "defaults", "precisions")}
    return KernelLibrary(kernels, defaults, path, precisions, sections)
