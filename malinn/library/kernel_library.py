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
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..errors import BackendError, LayoutError, LibraryError
from ..resources import kernels_dir, kernels_overridden
from .expressions import evaluate
from .layout import Layout, parse_layout, round_up

__all__ = ["KernelSpec", "MatrixRestriction", "KernelLibrary", "Precision", "load_library", "DEFAULT_PRECISION"]

OPS = ("matmul", "matmul_head", "bias", "affine", "activation", "relayout", "reshape", "broadcast", "normalize", "permute", "repeat",
       "conv", "depthwise", "conv_transpose", "resize", "pool", "spatial", "im2col", "merge", "concat", "dot",
       "gather", "recurrent", "recurrent_masked", "attention")
#: ops whose kernels read a weight matrix ``a`` and may fuse the epilogue (epilogue.clh)
EPILOGUE_OPS = ("matmul", "matmul_head", "conv", "depthwise", "conv_transpose")
#: the ops whose kernels read a layer's weights, and so may read them in a reduced precision
WEIGHT_OPS = ("matmul", "matmul_head", "conv", "depthwise", "conv_transpose")
#: the header that reads weights in each precision (LOAD_W): a kernel listing a reduced one includes it
WEIGHTS_HEADER = "weights.clh"
SCALAR_LETTERS = {
    "l": "padded common dimension K",
    "h": "padded rows of r",
    "w": "padded columns of r",
    "m": "logical rows of r",
    "n": "logical columns of r",
    "H": "padded rows of a",
    "W": "padded columns of a",
    "M": "logical rows of a",
    "N": "logical columns of a",
    "K": "logical rows of b",
    "c": "padded columns of b",
    "p": "the next float parameter",
}
#: what a kernel library file says it is (its "format" and "version"): another is refused by name
LIBRARY_FORMAT, LIBRARY_VERSION = "malinn-kernel-library", 1
MATRIX_NAMES = ("a", "b", "r")
VECTOR_NAMES = ("bias", "scale", "shift", "head", "head_bias")
#: a buffer the runtime allocates for the kernel's own use (its size: the entry's ``scratch_bytes``)
SCRATCH_NAME = "scratch"
#: what a matmul kernel can fuse into its final write -> the define that switches it on
EPILOGUE_DEFINES = {"bias": "BIAS", "activation": "ACTIVATION", "affine": "AFFINE", "softmax": "SOFTMAX",
                    "view": "R_VIEW"}
#: the defines besides R_VIEW that place a ``view`` kernel's R in a larger buffer (epilogue.clh)
VIEW_DEFINES = ("R_OFFSET", "R_LD", "R_ROWS", "R_SPARE")
#: those of them a ``view`` kernel's OpenCL source takes as its last arguments (epilogue.clh
#: ``R_VIEW_ARGS``): the slice's place, which differs for every input of a concatenation
VIEW_ARGUMENTS = ("R_OFFSET", "R_SPARE")
PRECONDITIONS = ("min_m", "max_m", "min_k", "max_k", "min_n", "max_n")
#: the ``defaults`` tables that name matmul kernels: the choice, the fallbacks where its
#: preconditions fail (a list: the first whose preconditions hold), the kernel that fuses softmax
MATMUL_CHOICES = ("matmul", "matmul_fallback", "matmul_softmax")
#: the precision every kernel supports and every model runs in unless asked otherwise
DEFAULT_PRECISION = "fp32"



def letter_values(r_shape: tuple, r_padded: tuple, a_shape: tuple | None = None, a_padded: tuple | None = None,
                  b_shape: tuple | None = None, b_padded: tuple | None = None) -> dict:
    """The value of each scalar letter (:data:`SCALAR_LETTERS`) for a result ``r`` and operands
    ``a``, ``b`` (absent: None) of these logical shapes and paddings."""
    common = b_padded[0] if b_padded is not None else (a_padded[1] if a_padded is not None else 0)
    return {"l": common, "h": r_padded[0], "w": r_padded[1], "m": r_shape[0], "n": r_shape[1],
            "H": a_padded[0] if a_padded is not None else 0, "W": a_padded[1] if a_padded is not None else 0,
            "M": a_shape[0] if a_shape is not None else 0, "N": a_shape[1] if a_shape is not None else 0,
            "K": b_shape[0] if b_shape is not None else 0, "c": b_padded[1] if b_padded is not None else 0}

@dataclass(frozen=True)
class Precision:
    """One entry of the library's ``precisions`` table: how a matmul's weights are stored and summed."""

    name: str
    description: str
    weight_bytes: int         # bytes per stored weight: 4, 2 or 1
    defines: tuple            # (("WEIGHT_BITS", "16"), ...) that switch a kernel to it
    extension: str | None = None   # the device extension it needs (cl_khr_fp16), or None
    row_scales: bool = False  # int8: one float scale per row of A follows the values

    def weights_nbytes(self, rows: int, cols: int, scales: int) -> int:
        """Bytes of a ``rows x cols`` weight buffer in this precision with ``scales`` row scales."""
        values = self.weight_bytes * rows * cols
        return (-(-values // 4) * 4 + 4 * scales) if self.row_scales else values


@dataclass(frozen=True)
class MatrixRestriction:
    """What a kernel asks of one matrix argument."""

    representation: str          # a layout string, or "*" for any layout
    row_align: int
    col_align: int
    image: bool = False          # passed as an RGBA float image2d (texel = 4 rows of a column)
    logical_rows: bool = False   # reads rows < m rounded up to the alignment only: A needs no more

    @property
    def any_layout(self) -> bool:
        return self.representation == "*"

    @property
    def layout(self) -> Layout:
        if self.any_layout:
            raise LayoutError("this restriction accepts any layout; ask the matrix for its own")
        return parse_layout(self.representation)

    @property
    def row_multiple(self) -> int:
        """Rows must be a multiple of this: the alignment and the layout's top chunk."""
        return self.row_align if self.any_layout else math.lcm(self.row_align, self.layout.row_multiple)

    @property
    def col_multiple(self) -> int:
        return self.col_align if self.any_layout else math.lcm(self.col_align, self.layout.col_multiple)


@dataclass(frozen=True)
class KernelSpec:
    """One validated entry of the kernel library."""

    codename: str
    op: str
    source: str
    function: str
    description: str
    matrices: dict            # name -> MatrixRestriction
    arglist: str
    buffers: tuple
    ndrange: str
    scale: tuple              # (rows, cols) divisors of the ndrange letters, in order
    flop: float
    workgroup: tuple | None
    defines: tuple            # (("NAME", "VALUE"), ...)
    activation: str | None
    source_path: Path
    params: tuple = ()        # (("name", default), ...) in the order of the 'p' letters
    aliases: tuple = ()       # other activation names this kernel answers to
    includes: tuple = ()      # header paths prepended to the source
    epilogue: tuple = ()      # what it can fuse: ("bias", "activation", "affine", "softmax")
    preconditions: tuple = () # (("min_m", 64), ("max_n", 8), ...), evaluated for this configuration
    split: tuple = (1, 1)     # (rows, cols) multipliers of the ndrange (items sharing one result block)
    candidates: tuple = ()    # define overrides the tuner times, besides the defaults
    constraints: tuple = ()   # expressions every configuration satisfies
    template: Any = None      # (path, raw entry, precisions table) to configure from (JSON: untyped)
    sources: tuple = ()       # (("gl", source path, (include paths...)), ...): other backends' sources
    precisions: tuple = (DEFAULT_PRECISION,)   # the precisions it supports
    precision: str = DEFAULT_PRECISION         # the precision of this configuration
    scratch_bytes: object = None   # expression over the defines and scalar letters: the scratch buffer's size
    loop_bounds: tuple = ()   # (("gl", expression), ...): the loop iterations one invocation of that source runs
    argdefines: tuple = ()    # defines the OpenCL source takes as uint arguments after its buffers

    def in_precision(self, precision: str) -> "KernelSpec":
        """This configuration with its weights (and sums) in ``precision``.

        Raises:
            LibraryError: the kernel does not support ``precision``.
        """
        if precision == self.precision:
            return self
        if precision not in self.precisions:
            raise LibraryError(f"kernel {self.codename!r} supports precisions {list(self.precisions)}, "
                               f"not {precision!r}")
        table = self.template[2]
        drop = {name for p in self.precisions for name, _ in table[p].defines}
        merged = {k: v for k, v in self.defines if k not in drop}
        merged.update(dict(table[precision].defines))
        return self._with_defines(merged)

    def _with_defines(self, merged: dict) -> "KernelSpec":
        """The entry's spec for the complete define dict ``merged`` (built once per entry and
        defines), carrying this spec's float parameters: a fused activation's, which the entry does
        not name."""
        path, entry, table = self.template
        spec = _cached(entry, merged)
        if spec is None:
            spec = _remember(entry, merged, _build(path, self.codename, entry, merged, table))
        return spec if spec.params == self.params else replace(spec, params=self.params)

    def has_source(self, backend: str) -> bool:
        """Whether this kernel runs on ``backend`` (OpenCL always; another backend where the entry's
        ``sources`` names a file for it)."""
        return backend == "opencl" or any(name == backend for name, _, _ in self.sources)

    def backends(self) -> tuple:
        """The backends this kernel has a source for: ``("opencl", ...)``."""
        return ("opencl",) + tuple(name for name, _, _ in self.sources)

    @property
    def config(self) -> dict:
        """The defines of this configuration, as a dict."""
        return dict(self.defines)

    def configure(self, overrides: dict | None = None) -> "KernelSpec":
        """This kernel with some defines replaced, restrictions re-evaluated, and the float
        parameters this spec carries kept (a fused activation's, which its entry does not name).

        Raises:
            LibraryError: a define is unknown to the entry, or a constraint or restriction fails.
        """
        if not overrides:
            return self
        _, entry, table = self.template
        unknown = set(overrides) - set(dict(self.defines)) - {EPILOGUE_DEFINES[f] for f in self.epilogue} \
            - {name for p in self.precisions for name, _ in table[p].defines} \
            - (set(VIEW_DEFINES) if "view" in self.epilogue else set())
        if unknown:
            raise LibraryError(f"kernel {self.codename!r} has no defines {sorted(unknown)}; its defines are "
                               f"{', '.join(name for name, _ in self.defines)}")
        merged = {**dict(self.defines), **{k: str(v) for k, v in overrides.items()}}
        if _cached(entry, merged) is None:
            try:
                failed = [c for c in self.constraints if not evaluate(c, merged)]
                if not failed:
                    return self._with_defines(merged)
            except (LibraryError, ValueError) as exc:   # the configuration's fault, not the file's
                why = str(exc).split(f"kernel {self.codename!r}", 1)[-1].lstrip(":, ")
                raise LibraryError(f"kernel {self.codename!r}: configuration {overrides}: {why}") from None
            raise LibraryError(f"kernel {self.codename!r}: configuration {overrides} breaks {failed}")
        return self._with_defines(merged)

    def configurations(self, device: Any = None) -> list[dict]:
        """The defaults and every ``candidates`` entry that meet ``constraints`` and ``device``.

        Args:
            device: a :class:`~malinn.backends.base.Device`; drops work-groups too large for it and
                local memory beyond it (when the entry says ``local_bytes``).

        Returns:
            A list of complete define dicts, the entry's defaults first.
        """
        base = dict(self.defines)
        found = []
        for overrides in ({},) + self.candidates:
            config = {**base, **{k: str(v) for k, v in overrides.items()}}
            if not all(evaluate(c, config) for c in self.constraints):
                continue
            if device is not None:
                try:
                    if not self.configure(config).fits(device):
                        continue
                except LibraryError:
                    continue
            if config not in found:
                found.append(config)
        return found

    def fits(self, device: Any) -> bool:
        """Whether ``device`` can launch this configuration: its work-group within the device's
        largest and its local memory (when the entry says ``local_bytes``) within the device's."""
        if self.workgroup and math.prod(self.workgroup) > device.max_work_group_size:
            return False
        local = self.template[1].get("local_bytes")
        return local is None or evaluate(local, self.config) <= device.local_memory

    def launch_limit(self, device: Any) -> str | None:
        """What keeps ``device`` from launching this configuration, in words (its work-group or its
        local memory beyond the device's), else None (also where the local memory it needs depends on
        a layer's geometry that this configuration does not hold: a convolution's)."""
        items = math.prod(self.workgroup) if self.workgroup else 0
        if items > device.max_work_group_size:
            return f"runs work-groups of {items} items; {device.name} launches at most {device.max_work_group_size}"
        local = self.template[1].get("local_bytes")
        try:
            needed = evaluate(local, self.config) if local is not None else 0
        except (ValueError, TypeError):
            return None
        if needed > device.local_memory:
            return f"needs {needed:,} bytes of local memory; {device.name} has {device.local_memory:,}"
        return None

    def loop_iterations(self, backend: str, values: dict) -> int | None:
        """The loop iterations one invocation of ``backend``'s source runs for the scalar ``values``
        (:func:`~malinn.choice.kernel_call.scalar_values`), where the entry's ``sources.<backend>.loop_iterations``
        says (an upper bound); else None."""
        for name, text in self.loop_bounds:
            if name == backend:
                return evaluate(text, {**dict(self.defines), **values})
        return None

    @property
    def requires_workgroup(self) -> bool:
        """Whether the kernel runs only in its configuration's work-group shape: its OpenCL source
        declares ``reqd_work_group_size`` (a launch in another shape fails there, and another
        backend's port of it, built in that shape, would compute wrong values)."""
        return bool(self.workgroup) and self.function in _fixed_workgroup_kernels(self.source_path)

    def loops_fit(self, device: Any, values: dict) -> bool:
        """Whether ``device`` runs this kernel's loops to their end for these scalar ``values``: it
        ends none early, or the entry bounds them within its limit (:meth:`loop_iterations`)."""
        limit = getattr(device, "max_loop_iterations", None)
        if not limit:
            return True
        count = self.loop_iterations(device.backend, values)
        return count is None or count <= limit

    def accepts(self, m: int, k: int, n: int, device: Any = None) -> bool:
        """Whether a product of this shape meets the entry's ``preconditions`` and ``device`` can
        launch this configuration (:meth:`fits`; for image operands, the device's image support and
        size limits too; on a device that ends long loops early, :meth:`loops_fit`)."""
        if device is not None and not self.fits(device):
            return False
        if device is not None and getattr(device, "max_loop_iterations", None) and self.loop_bounds:
            padded = self.padded_shapes(m, k, n)
            values = letter_values((m, n), padded["r"], (m, k), padded["a"], (k, n), padded["b"])
            if not self.loops_fit(device, values):
                return False
        for name, limit in self.preconditions:
            value = {"m": m, "k": k, "n": n}[name[-1]]
            if value < limit if name.startswith("min_") else value > limit:
                return False
        if device is not None and any(r.image for r in self.matrices.values()):
            a = self.matrices["a"]
            rows, cols = -(-m // a.row_multiple) * a.row_multiple, -(-k // a.col_multiple) * a.col_multiple
            return (device.image_support and rows // 4 <= device.image2d_max_size[0]
                    and cols <= device.image2d_max_size[1])
        return True

    def padded_shapes(self, m: int, k: int, n: int) -> dict:
        """The smallest padded shapes of ``a`` (m x k), ``b`` (k x n) and ``r`` (m x n) this matmul takes.

        ``a`` has as many rows as ``r`` (the kernel reads A's rows up to R's padded rows; A may have
        more), or only its own alignment's where the kernel reads A's logical rows only
        (``logicalRows``)."""
        a, b, r = self.matrices["a"], self.matrices["b"], self.matrices["r"]
        mp = round_up(m, math.lcm(a.row_multiple, r.row_multiple, self.scale[0]))
        kp = round_up(k, math.lcm(a.col_multiple, b.row_multiple))
        np_ = round_up(n, math.lcm(b.col_multiple, r.col_multiple, self.scale[1]))
        return {"a": (round_up(m, a.row_multiple) if a.logical_rows else mp, kp), "b": (kp, np_), "r": (mp, np_)}

    def param_values(self, given: dict | None = None) -> list[float]:
        """The float parameters in ``p`` order: ``given`` values, else defaults, else 0.

        Raises:
            ValueError: ``given`` names a parameter the kernel does not take.
        """
        given = dict(given or {})
        names = [name for name, _ in self.params]
        unknown = set(given) - set(names)
        if unknown:
            raise ValueError(f"kernel {self.codename!r} takes parameters {names or 'none'}, "
                             f"not {sorted(unknown)}")
        values = [float(given.get(name, default)) for name, default in self.params]
        return values + [0.0] * (self.arglist.count("p") - len(values))

    def options(self) -> tuple[str, ...]:
        """Compiler options of the OpenCL source: the entry's defines as ``-DNAME=VALUE``, but for
        those it takes as arguments (:meth:`build_options`)."""
        return self.build_options("opencl")

    def define_arguments(self, backend: str = "opencl") -> tuple:
        """The defines that ``backend``'s source takes as ``uint`` arguments after its buffers, in
        order: the entry's ``argdefines``, then, for a kernel writing R into a slice (``R_VIEW=1``),
        :data:`VIEW_ARGUMENTS`. None for another backend than OpenCL (its sources take them as defines)."""
        if backend != "opencl":
            return ()
        view = "view" in self.epilogue and dict(self.defines).get("R_VIEW", "0") not in ("0", "")
        return self.argdefines + (VIEW_ARGUMENTS if view else ())

    def build_options(self, backend: str = "opencl") -> tuple[str, ...]:
        """Compiler options for ``backend``'s source: :meth:`options` without the defines it takes
        as arguments (:meth:`define_arguments`), so that layers that differ only in those share one program."""
        arguments = {name for name in self.define_arguments(backend) if not name.startswith(DIVIDE)}
        return tuple(f"-D{k}={v}" for k, v in self.defines if k not in arguments)

    def define_argument_values(self, backend: str = "opencl") -> list:
        """The values of :meth:`define_arguments`, in order, as the 32 bits of a ``uint`` argument
        (a negative one, a crop's offset for a kernel's ``int`` argument, in two's complement; 0 for
        a view define the plan did not set)."""
        defines, values = dict(self.defines), []
        for name in self.define_arguments(backend):
            if name.startswith(DIVIDE):
                values += division_magic(int(defines[name[len(DIVIDE):]]))
            else:
                values.append(int(defines.get(name, 0)) & 0xFFFFFFFF)
        return values

    def program_source(self, layouts: dict, render_index: Callable[[Layout, str], str], backend: str = "opencl") -> str:
        """The source with a ``MALINN_INDEX_<X>`` macro prepended for each matrix's layout (and the
        includes; in OpenCL C each file after a ``#line`` naming it, for the build log).

        Args:
            layouts: matrix name -> :class:`Layout` of the matrix passed for it.
            render_index: the backend's renderer, ``render_index(layout, macro_name) -> str``
                (:meth:`malinn.backends.base.Device.render_index`).
            backend: whose source: ``"opencl"`` (the entry's ``source``) or a name under ``sources``.

        Raises:
            LibraryError: the entry has no source for ``backend``.
        """
        if backend == "opencl":
            source, source_path, includes = self.source, self.source_path, self.includes
        else:
            found = [(path, inc) for name, path, inc in self.sources if name == backend]
            if not found:
                raise BackendError(f"kernel {self.codename!r} has no {backend} source (kernels/library.json: "
                                   f"its \"sources\" name {', '.join(self.backends())}); choose another kernel")
            source_path, includes = found[0]
            source = source_path.name
        head = [f"/* malinn: {self.codename} ({source}) */"]
        for name in sorted(layouts):
            head.append(render_index(parse_layout(layouts[name]), f"MALINN_INDEX_{name.upper()}"))
        # OpenCL C's #line names each file, so a build log points into kernels/, not the joined source
        line = (lambda path: f'#line 1 "{path.name}"\n') if backend == "opencl" else (lambda path: "")
        head += [line(path) + _read_source(path) for path in includes]
        return "\n".join(head) + "\n" + line(source_path) + _read_source(source_path)


_configured: dict = {}   # (entry id, defines) -> (the entry, KernelSpec)


def _cached(entry: dict, defines: dict) -> KernelSpec | None:
    """The configured spec of ``entry`` with ``defines``, if made before. The entry itself is kept
    beside it and compared, so a new entry that reuses a freed one's id never gets its spec."""
    found = _configured.get((id(entry), tuple(sorted(defines.items()))))
    return found[1] if found is not None and found[0] is entry else None


def _remember(entry: dict, defines: dict, spec: KernelSpec) -> KernelSpec:
    _configured[(id(entry), tuple(sorted(defines.items())))] = (entry, spec)
    return spec



@lru_cache(maxsize=256)
def _identifiers(path: Path) -> frozenset:
    """The identifiers of the source file ``path`` (a define an entry names must be one of them)."""
    return frozenset(_IDENTIFIER.findall(_read_source(path)))


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@lru_cache(maxsize=256)
def _read_source(path: Path) -> str:
    return path.read_text()


_KERNEL_FUNCTION = re.compile(r"(?:__)?kernel\s+(?:__attribute__\(\(.*\)\)\s+)?void\s+(\w+)\s*\(")


def _defines_kernel(path: Path, function: str) -> bool:
    """Whether the source file ``path`` defines the kernel ``function``."""
    return function in _kernel_functions(path)


@lru_cache(maxsize=256)
def _kernel_functions(path: Path) -> frozenset:
    """The kernel functions the source file ``path`` defines (read once: every configuration of every
    entry naming the file is checked against it)."""
    return frozenset(_KERNEL_FUNCTION.findall(_read_source(path)))


@lru_cache(maxsize=256)
def _fixed_workgroup_kernels(path: Path) -> frozenset:
    """The kernel functions of the OpenCL source ``path`` that declare ``reqd_work_group_size`` (in
    their attribute, or through a macro the source defines as it)."""
    source = _read_source(path)
    words = {"reqd_work_group_size"} | set(_REQD_MACRO.findall(source))
    return frozenset(name for attribute, name in _KERNEL_ATTRIBUTES.findall(source)
                     if words & set(_IDENTIFIER.findall(attribute)))


_REQD_MACRO = re.compile(r"#\s*define\s+(\w+)\s+reqd_work_group_size\b")
_KERNEL_ATTRIBUTES = re.compile(r"(?:__)?kernel\s+(__attribute__\(\(.*\)\)\s+)?void\s+(\w+)\s*\(")


@lru_cache(maxsize=1024)
def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file, asked once per process (the kernel files do not come and go while
    the library is read; configuring an entry checks the same files again)."""
    return path.is_file()


class KernelLibrary:
    """The parsed library: kernel specs by codename plus the default codename per op and device."""

    def __init__(self, kernels: dict, defaults: dict, path: Path, precisions: dict | None = None,
                 sections: dict | None = None):
        self.kernels = kernels
        self.defaults = defaults
        self.path = path
        self.precisions = precisions or {DEFAULT_PRECISION: Precision(DEFAULT_PRECISION, "float", 4, ())}
        self.sections = sections or {}

    def section(self, name: str) -> dict:
        """The file's top-level object ``name`` as written (``conv_algorithms``: read by
        :mod:`malinn.choice.conv_choice`), or an empty one.

        Raises:
            LibraryError: ``name`` is there but not an object.
        """
        found = self.sections.get(name, {})
        if not isinstance(found, dict):
            raise LibraryError(f"{self.path}: field {name!r}: expected an object")
        return found

    def precision(self, name: str) -> Precision:
        """The precision called ``name``.

        Raises:
            ValueError: the library has no such precision; the message lists those it has.
        """
        try:
            return self.precisions[name]
        except KeyError:
            raise ValueError(f"unknown precision {name!r}; use one of {', '.join(self.precisions)}") from None

    def __getitem__(self, codename: str) -> KernelSpec:
        try:
            return self.kernels[codename]
        except KeyError:
            raise LibraryError(f"{self.path}: no kernel with codename {codename!r}; "
                               f"known: {', '.join(sorted(self.kernels))}") from None

    def __contains__(self, codename: str) -> bool:
        return codename in self.kernels

    def codenames(self, op: str, backend: str | None = None) -> list[str]:
        """Every codename that implements ``op`` (on ``backend``, when given), in library order."""
        return [c for c, k in self.kernels.items() if k.op == op and (backend is None or k.has_source(backend))]

    def default_specs(self, op: str, device_kind: str, backend: str = "opencl",
                      precision: str = DEFAULT_PRECISION) -> list[KernelSpec]:
        """The default kernels for ``op`` on a device kind, in order of preference, each in the
        configuration the table names.

        A ``defaults`` value is a codename, ``{"codename": ..., "defines": {...}}`` for a
        configurable kernel whose best configuration differs by device kind, or a list of those
        (``matmul_fallback``: the first whose preconditions hold serves a product). An object may
        add ``"precisions": [...]``: it then serves matmuls whose weights are in one of those
        precisions only (a configuration for half or int8 weights, say), and is skipped for the
        others, ``precision`` (the weights' precision) deciding; the specs are returned in fp32,
        the caller puts them in the precision. ``op`` may be
        ``"matmul_fallback"`` (the kernels used where the chosen matmul's preconditions do not
        hold: small batches, say) or ``"matmul_softmax"`` (the kernel that fuses a softmax; an empty
        list when the library names none).

        ``backend`` keeps the kernels that have a source for it (an OpenGL device runs only the
        entries whose ``sources`` name a GLSL file); a table may name kernels for one backend under
        ``"<backend>:<kind>"`` or ``"<backend>"``, looked up before the kind.
        """
        table = self.defaults.get(op, {})
        keys = (f"{backend}:{device_kind}", backend, device_kind, "*")
        value = next((table[k] for k in keys if k in table), None)
        specs = []
        if value is not None:
            choices = value if isinstance(value, list) else [value]
            choices = [c for c in choices if not isinstance(c, dict) or precision in c.get("precisions", [precision])]
            specs = [self[c["codename"]].configure(c.get("defines")) if isinstance(c, dict) else self[c]
                     for c in choices]
            specs = [s for s in specs if s.has_source(backend)]
        if not specs:
            if op in ("matmul_softmax", "matmul_head"):
                return []
            codenames = self.codenames("matmul" if op in MATMUL_CHOICES else op, backend)
            if not codenames:
                raise BackendError(f"{self.path}: no kernel implements {op!r} on the {backend} backend")
            specs = [self[codenames[0]]]
        return specs

    def default_spec(self, op: str, device_kind: str, backend: str = "opencl") -> KernelSpec:
        """The first of :meth:`default_specs`.

        Raises:
            LibraryError: the library names no kernel for ``op``.
        """
        specs = self.default_specs(op, device_kind, backend)
        if not specs:
            raise LibraryError(f"{self.path}: no default kernel for {op!r} on a {device_kind}")
        return specs[0]

    def activation_kernel(self, activation: str) -> KernelSpec | None:
        """The kernel that applies ``activation`` (``None`` if the library has none)."""
        for k in self.kernels.values():
            if k.op == "activation" and (k.activation == activation or activation in k.aliases):
                return k
        return None

    def activation_spec(self, activation: str, what: str = "activation") -> KernelSpec:
        """The kernel that applies ``activation``.

        Raises:
            ValueError: no kernel computes it; the message names ``what`` and lists the activations.
        """
        spec = self.activation_kernel(activation)
        if spec is None:
            raise ValueError(f"{what}: no kernel computes activation {activation!r}; "
                             f"available: {', '.join(['linear'] + self.activations())}")
        return spec

    def activations(self) -> list[str]:
        """Every activation name a kernel computes, aliases included."""
        return [name for k in self.kernels.values() if k.op == "activation" for name in (k.activation,) + k.aliases]

    def default(self, op: str, device_kind: str, backend: str = "opencl") -> str:
        """The default codename for ``op`` on a device of kind ``gpu``/``cpu``/``accelerator``
        (the first, where the table lists several; see :meth:`default_specs`)."""
        return self.default_spec(op, device_kind, backend).codename


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
        raise LibraryError(f"{path}: expected \"format\": {LIBRARY_FORMAT!r} and \"version\": {LIBRARY_VERSION} "
                           f"(this malinn reads that library), got {data.get('format')!r} and {data.get('version')!r}")
    precisions = _precisions(path, data.get("precisions"))
    kernels = {}
    for codename, entry in data["kernels"].items():
        kernels[codename] = _validate(path, codename, _with_base(path, codename, entry, data["kernels"], (codename,)),
                                      precisions, entry.get("variant_of") if isinstance(entry, dict) else None, deep)
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise LibraryError(f"{path}: field 'defaults': expected an object")
    for name, table in defaults.items():
        op = "matmul" if name in MATMUL_CHOICES else name
        if op not in OPS or not isinstance(table, dict):
            raise LibraryError(f"{path}: field 'defaults.{name}': expected one of {OPS + MATMUL_CHOICES[1:]} "
                               f"mapping to an object")
        for kind, value in table.items():
            choices = value if isinstance(value, list) and value else [value]
            for choice in choices:
                codename = choice.get("codename") if isinstance(choice, dict) else choice
                if not isinstance(codename, str) or codename not in kernels or kernels[codename].op != op:
                    raise LibraryError(f"{path}: field 'defaults.{name}.{kind}': {codename!r} is not a {op} kernel")
                if isinstance(choice, dict):
                    unknown = _unknown(choice, CHOICE_FIELDS)
                    if unknown:
                        raise LibraryError(f"{path}: field 'defaults.{name}.{kind}': unknown field {unknown[0]!r} of "
                                           f"{codename!r}; expected one of {', '.join(CHOICE_FIELDS)}")
                    try:
                        kernels[codename].configure(choice.get("defines"))
                    except LibraryError as exc:
                        raise LibraryError(f"{path}: field 'defaults.{name}.{kind}.defines': {exc}") from None
                    serves = choice.get("precisions", [DEFAULT_PRECISION])
                    if not isinstance(serves, list) or not serves or not set(serves) <= set(kernels[codename].precisions):
                        raise LibraryError(f"{path}: field 'defaults.{name}.{kind}.precisions': expected a list of "
                                           f"precisions {codename!r} supports ({', '.join(kernels[codename].precisions)}), "
                                           f"got {serves!r}")
    sections = {k: v for k, v in data.items() if k not in ("kernels", "defaults", "precisions")}
    return KernelLibrary(kernels, defaults, path, precisions, sections)


def _with_base(path: Path, codename: str, entry: Any, entries: dict, seen: tuple = ()) -> Any:
    """``entry`` with the fields of the entry it is a ``variant_of`` under its own, as a JSON Merge
    Patch (RFC 7386) would: objects (``defines``, ``restrictions``, each matrix's restriction,
    ``preconditions``) merged key by key, a null removing the base's field, anything else replaced.
    The base may itself be a variant (resolved first).
    A variant changes a define, a layout or a precondition of a kernel without repeating the rest."""
    if not isinstance(entry, dict) or "variant_of" not in entry:
        return entry
    base = entries.get(entry["variant_of"])
    if not isinstance(base, dict) or len(seen) > len(entries) or entry["variant_of"] in seen:
        raise LibraryError(f"{path}: kernel {codename!r}, field 'variant_of': {entry['variant_of']!r} is not "
                           f"an entry of the library (or its variants lead back to {codename!r})")
    base = _with_base(path, codename, base, entries, seen + (entry["variant_of"],))

    def merge(under, over):
        if not (isinstance(under, dict) and isinstance(over, dict)):
            return over
        merged = dict(under)
        for key, value in over.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = merge(under.get(key), value)
        return merged

    return {key: value for key, value in merge(base, entry).items() if key != "variant_of"}


def _precisions(path: Path, table: Any) -> dict:
    """The ``precisions`` table as :class:`Precision` objects (``fp32`` alone where there is none)."""
    if table is None:
        table = {DEFAULT_PRECISION: {"description": "float", "weight_bytes": 4, "defines": {}}}
    if not isinstance(table, dict) or DEFAULT_PRECISION not in table:
        raise LibraryError(f"{path}: field 'precisions': expected an object of name: precision, with {DEFAULT_PRECISION!r}")
    found = {}
    for name, entry in table.items():
        field = f"{path}: field 'precisions.{name}'"
        if not isinstance(entry, dict):
            raise LibraryError(f"{field}: expected an object")
        defines = entry.get("defines", {})
        if not isinstance(defines, dict) or not all(
                re.fullmatch(r"[A-Za-z_]\w*", str(k)) and re.fullmatch(r"[\w.+-]+", str(v)) for k, v in defines.items()):
            raise LibraryError(f"{field}.defines: expected an object of NAME: simple value")
        if entry.get("weight_bytes") not in (1, 2, 4):
            raise LibraryError(f"{field}.weight_bytes: expected 1, 2 or 4, got {entry.get('weight_bytes')!r}")
        extension = entry.get("extension")
        if extension is not None and not isinstance(extension, str):
            raise LibraryError(f"{field}.extension: expected an extension name")
        found[name] = Precision(name, str(entry.get("description", "")), entry["weight_bytes"],
                                tuple((str(k), str(v)) for k, v in defines.items()), extension,
                                bool(entry.get("row_scales", False)))
    return found


def _validate(path: Path, codename: str, entry: Any, precisions: dict, variant_of: str | None = None,
              deep: bool = True) -> KernelSpec:
    if not isinstance(entry, dict):
        raise LibraryError(f"{path}: kernel {codename!r}, field '': expected an object")
    defines = entry.get("defines", {})
    if not isinstance(defines, dict):
        raise LibraryError(f"{path}: kernel {codename!r}, field 'defines': expected an object of NAME: simple value")
    _check_fields(path, codename, entry)
    spec = _build(path, codename, entry, dict(defines), precisions)
    if deep:
        _check_defines_used(path, codename, entry, defines)
    if spec.precisions != (DEFAULT_PRECISION,) and WEIGHTS_HEADER not in entry.get("includes", []):
        raise LibraryError(f"{path}: kernel {codename!r}, field 'precisions': lists "
                           f"{', '.join(p for p in spec.precisions if p != DEFAULT_PRECISION)}, but the source does not "
                           f"include {WEIGHTS_HEADER}, which reads the weights in them (docs/KERNELS.md)")
    if not deep:
        return spec
    configs = spec.configurations()
    if len(configs) < 1 + len(spec.candidates):
        base = dict(spec.defines)
        seen: list[dict] = []
        for i, overrides in enumerate(({},) + spec.candidates):
            config = {**base, **{k: str(v) for k, v in overrides.items()}}
            broken = [c for c in spec.constraints if not evaluate(c, config)]
            what = "the defines" if i == 0 else f"candidate {i - 1} {overrides}"
            if broken or config in seen:
                inherited = (f" (a variant inherits the candidates of {variant_of!r}: give it "
                             "\"candidates\": null or its own)" if i and variant_of else "")
                why = f"breaks {broken[0]!r}" if broken else "repeats " + (
                    "the defines" if config == seen[0] else "another candidate")
                raise LibraryError(f"{path}: kernel {codename!r}, field 'candidates': {what} {why}{inherited}")
            seen.append(config)
    for config in configs:                        # every configuration the tuner can emit must resolve
        try:
            spec.configure(config)
        except LibraryError as exc:
            raise LibraryError(f"{path}: {exc}") from None
        if entry.get("local_bytes") is not None:
            try:
                evaluate(entry["local_bytes"], config)
            except (ValueError, TypeError) as exc:
                raise LibraryError(f"{path}: kernel {codename!r}, field 'local_bytes': {exc}") from None
    return spec


def _check_fields(path: Path, codename: str, entry: dict) -> None:
    """Refuses a field the entry, its restrictions, a matrix's restriction or another backend's
    source does not have (a misspelled ``precondition`` was ignored)."""
    def unknown(fields, known, where):
        found = _unknown(fields, known) if isinstance(fields, dict) else []
        if found:
            raise LibraryError(f"{path}: kernel {codename!r}, field {where + found[0]!r}: unknown field; expected one "
                               f"of {', '.join(known)} (or a *_doc note)")

    unknown(entry, ENTRY_FIELDS, "")
    restrictions = entry.get("restrictions")
    unknown(restrictions, RESTRICTION_FIELDS, "restrictions.")
    for name in MATRIX_NAMES:
        unknown((restrictions or {}).get(name) if isinstance(restrictions, dict) else None, MATRIX_FIELDS,
                f"restrictions.{name}.")
    for backend, value in (entry.get("sources") or {}).items() if isinstance(entry.get("sources"), dict) else ():
        unknown(value, SOURCE_FIELDS, f"sources.{backend}.")


#: the fields a kernel entry, its restrictions, a matrix's restriction, another backend's source
#: and a defaults choice may have (besides ``*_doc`` notes): a misspelled one is refused by name
ENTRY_FIELDS = ("op", "source", "function", "restrictions", "includes", "sources", "defines", "candidates",
                "constraints", "preconditions", "precisions", "epilogue", "activation", "aliases", "local_bytes",
                "scratch_bytes", "description", "variant_of")
RESTRICTION_FIELDS = ("a", "b", "r", "arglist", "buffers", "flop", "ndrange", "params", "scale", "split", "workgroup",
                      "argdefines")
MATRIX_FIELDS = ("representation", "rowAlign", "colAlign", "image", "logicalRows")
SOURCE_FIELDS = ("source", "includes", "loop_iterations")
CHOICE_FIELDS = ("codename", "defines", "precisions")


def _unknown(fields: dict, known: tuple) -> list:
    """The keys of ``fields`` that are neither in ``known`` nor a ``*_doc`` note."""
    return [k for k in fields if k not in known and not str(k).endswith("_doc")]


def _check_defines_used(path: Path, codename: str, entry: dict, defines: dict) -> None:
    """Refuses a define that none of the entry's sources mention (once per entry, after
    :func:`_build` checked the files exist): a misspelled one would be passed and ignored."""
    names = [entry["source"], *entry.get("includes", [])]
    for value in entry.get("sources", {}).values():
        value = {"source": value} if isinstance(value, str) else value
        names += [value["source"], *value.get("includes", [])]
    unused = [name for name in defines if not any(name in _identifiers(path.parent / str(f)) for f in names)]
    if unused:
        raise LibraryError(f"{path}: kernel {codename!r}, field 'defines': {', '.join(map(repr, unused))} "
                           f"{'appears' if len(unused) == 1 else 'appear'} in none of its sources "
                           f"({', '.join(map(str, names))}): a misspelled define would be passed and ignored")


def _build(path: Path, codename: str, entry: dict, defines: dict, table: dict) -> KernelSpec:
    """The entry's spec for the complete define dict ``defines``: the fields no define changes are
    checked once per entry (:func:`_fixed_fields`), the expressions of the defines here."""
    def fail(field, why):
        raise LibraryError(f"{path}: kernel {codename!r}, field {field!r}: {why}")

    def positive_int(field, value):
        try:
            value = evaluate(value, defines) if isinstance(value, str) else value
        except ValueError as exc:
            fail(field, str(exc))
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            fail(field, f"expected a positive integer, got {value!r}")
        return value

    fixed = _fixed_fields(path, codename, entry, table)
    rs = entry["restrictions"]
    scalars = {**defines, **{c: 1 for c in SCALAR_LETTERS if c != "p"}}
    for backend, bound in fixed.loop_bounds:
        try:
            evaluate(bound, scalars)
        except (ValueError, TypeError) as exc:
            fail(f"sources.{backend}.loop_iterations", str(exc))
    matrices = {name: MatrixRestriction(rep, positive_int(f"restrictions.{name}.rowAlign", rs[name].get("rowAlign")),
                                        positive_int(f"restrictions.{name}.colAlign", rs[name].get("colAlign")),
                                        image, logical_rows)
                for name, rep, image, logical_rows in fixed.matrices}
    scale = rs.get("scale", {"rows": 1, "cols": 1})
    scale_t = (positive_int("restrictions.scale.rows", scale.get("rows", 1)),
               positive_int("restrictions.scale.cols", scale.get("cols", 1)))
    wg = rs.get("workgroup")
    if wg is not None:
        if not isinstance(wg, list) or len(wg) != len(fixed.ndrange):
            fail("restrictions.workgroup", f"expected null or a list of {len(fixed.ndrange)} positive integers")
        wg = tuple(positive_int("restrictions.workgroup", v) for v in wg)
    if not all(_DEFINE_NAME.fullmatch(str(k)) and _DEFINE_VALUE.fullmatch(str(v)) for k, v in defines.items()):
        fail("defines", "expected an object of NAME: simple value")
    candidates = entry.get("candidates", [])
    if not isinstance(candidates, list) or not all(
            isinstance(c, dict) and set(c) <= set(defines) for c in candidates):
        fail("candidates", "expected a list of objects overriding this entry's defines")
    for c in fixed.constraints:
        try:
            evaluate(c, defines)
        except ValueError as exc:
            fail("constraints", str(exc))
    preconditions = {k: positive_int(f"preconditions.{k}", v) for k, v in entry.get("preconditions", {}).items()}
    split = rs.get("split", {"rows": 1, "cols": 1})
    split_t = (positive_int("restrictions.split.rows", split.get("rows", 1)),
               positive_int("restrictions.split.cols", split.get("cols", 1)))
    scratch = entry.get("scratch_bytes")
    if scratch is not None:
        try:
            evaluate(scratch, scalars)
        except ValueError as exc:
            fail("scratch_bytes", str(exc))
    given = {k: str(v) for k, v in defines.items()}
    matching = [p for p in fixed.precisions if all(given.get(k) == v for k, v in table[p].defines)]
    precision = max(matching, key=lambda p: len(table[p].defines))
    return KernelSpec(codename=codename, op=fixed.op, source=str(entry["source"]), function=entry["function"],
                      description=str(entry.get("description", "")), matrices=matrices, arglist=fixed.arglist,
                      buffers=fixed.buffers, ndrange=fixed.ndrange, scale=scale_t, flop=fixed.flop,
                      workgroup=wg, defines=tuple((str(k), str(v)) for k, v in defines.items()),
                      activation=entry.get("activation"), source_path=fixed.source_path,
                      params=fixed.params, aliases=fixed.aliases, includes=fixed.includes, epilogue=fixed.epilogue,
                      preconditions=tuple(preconditions.items()), split=split_t,
                      candidates=tuple(candidates), constraints=fixed.constraints,
                      template=(path, entry, table), precisions=fixed.precisions, precision=precision,
                      sources=fixed.sources, scratch_bytes=scratch, loop_bounds=fixed.loop_bounds,
                      argdefines=_argdefines(rs.get("argdefines", []), defines, fail))


#: an ``argdefines`` entry ``divide:NAME``: the two magic numbers that divide by define NAME
DIVIDE = "divide:"


def division_magic(divisor: int) -> list:
    """``[M, L]`` that divide any 32-bit ``n`` by ``divisor`` with a multiplication (Granlund and
    Montgomery, as a compiler does for a constant): ``t = mul_hi(M, n)``, ``n / divisor = (t + ((n -
    t) >> min(L, 1))) >> (max(L, 1) - 1)``, with ``L = ceil(log2 divisor)`` (kernels/window.clh
    ``window_divide``). A divisor below 1 divides as 1."""
    d = max(1, int(divisor))
    shift = (d - 1).bit_length()
    return [((1 << 32) * ((1 << shift) - d) // d + 1) & 0xFFFFFFFF, shift]


def _argdefines(names: Any, defines: dict, fail: Callable[[str, str], None]) -> tuple:
    """The entry's ``argdefines``, checked: names of its defines (or ``divide:`` one of them, a
    positive one), whose values are whole numbers."""
    plain = [n[len(DIVIDE):] if isinstance(n, str) and n.startswith(DIVIDE) else n for n in names] \
        if isinstance(names, list) else None
    if plain is None or not all(isinstance(n, str) and n in defines for n in plain) or len(set(names)) < len(names):
        fail("restrictions.argdefines", f"expected a list of the entry's define names (or divide:NAME), got {names!r}")
        return ()
    for name, define in zip(names, plain):
        try:
            value = int(str(defines[define]))
        except ValueError:
            fail("restrictions.argdefines", f"define {define} is {defines[define]!r}, not a whole number")
            continue
        if not -2 ** 31 <= value < 2 ** 32 or (name != define and value < 1):
            fail("restrictions.argdefines", f"define {define} is {value}, not a 32-bit int or uint"
                                            f"{' (a divisor: 1 or more)' if name != define else ''}")
    return tuple(names)


_DEFINE_NAME = re.compile(r"[A-Za-z_]\w*")
_DEFINE_VALUE = re.compile(r"[\w.+-]+")


class _FixedFields(NamedTuple):
    """The fields of a kernel entry that no define changes (checked once per entry)."""
    op: str
    source_path: Path
    includes: tuple
    sources: tuple
    loop_bounds: tuple
    matrices: tuple          # (name, representation, image, logicalRows): the alignments are expressions
    buffers: tuple
    arglist: str
    ndrange: str
    flop: float
    params: tuple
    aliases: tuple
    epilogue: tuple
    constraints: tuple
    precisions: tuple


_fixed: dict = {}   # entry id -> (the entry, _FixedFields), kept and compared as in _configured


def _fixed_fields(path: Path, codename: str, entry: dict, table: dict) -> _FixedFields:
    """Checks the fields of ``entry`` that do not depend on its defines, once per entry (every
    configuration of the entry shares them: its files, op, buffers, layouts, epilogue and
    precisions), and returns them."""
    found = _fixed.get(id(entry))
    if found is not None and found[0] is entry:
        return found[1]

    def fail(field, why):
        raise LibraryError(f"{path}: kernel {codename!r}, field {field!r}: {why}")

    for key in ("op", "source", "function", "restrictions"):
        if key not in entry:
            fail(key, "missing")
    op = entry["op"]
    if op not in OPS:
        fail("op", f"expected one of {', '.join(OPS)}, got {op!r}")
    source_path = path.parent / str(entry["source"])
    if not _is_file(source_path):
        fail("source", f"no file {source_path}")
    function = entry["function"]
    if not isinstance(function, str) or not _defines_kernel(source_path, function):
        fail("function", f"no kernel function {function!r} in {entry['source']}")
    includes = entry.get("includes", [])
    if not isinstance(includes, list) or not all(_is_file(path.parent / str(i)) for i in includes):
        fail("includes", "expected a list of files in the kernels folder")
    sources, loop_bounds = [], []
    raw_sources = entry.get("sources", {})
    if not isinstance(raw_sources, dict):
        fail("sources", 'expected an object of backend: file or {"source": file, "includes": [files]}')
    for backend, value in raw_sources.items():
        value = {"source": value} if isinstance(value, str) else value
        if backend == "opencl" or not isinstance(value, dict) or not isinstance(value.get("source"), str):
            fail(f"sources.{backend}", 'expected a file or {"source": file, "includes": [files]} '
                                       '(OpenCL\'s source is the entry\'s "source")')
        other = path.parent / value["source"]
        if not _is_file(other):
            fail(f"sources.{backend}.source", f"no file {other}")
        other_includes = value.get("includes", [])
        if not isinstance(other_includes, list) or not all(_is_file(path.parent / str(i)) for i in other_includes):
            fail(f"sources.{backend}.includes", "expected a list of files in the kernels folder")
        sources.append((str(backend), other, tuple(path.parent / str(i) for i in other_includes)))
        if "loop_iterations" in value:
            loop_bounds.append((str(backend), value["loop_iterations"]))
    rs = entry["restrictions"]
    if not isinstance(rs, dict):
        fail("restrictions", "expected an object")
    buffers = rs.get("buffers")
    if not isinstance(buffers, list) or not buffers:
        fail("restrictions.buffers", "expected a non-empty list of argument names")
    matrices = []
    for name in buffers:
        if name in VECTOR_NAMES or name == SCRATCH_NAME:
            continue
        if name not in MATRIX_NAMES:
            fail("restrictions.buffers", f"unknown buffer {name!r}; expected {MATRIX_NAMES + VECTOR_NAMES + (SCRATCH_NAME,)}")
        m = rs.get(name)
        if not isinstance(m, dict):
            fail(f"restrictions.{name}", "missing: every matrix buffer needs a restriction object")
        rep = m.get("representation")
        if rep != "*":
            try:
                parse_layout(rep)
            except LayoutError as exc:
                fail(f"restrictions.{name}.representation", str(exc))
        image = m.get("image", False)
        if not isinstance(image, bool) or (image and rep != "C"):
            fail(f"restrictions.{name}.image", "expected true or false; an image operand is laid out 'C'")
        logical_rows = m.get("logicalRows", False)
        if not isinstance(logical_rows, bool) or (logical_rows and name != "a"):
            fail(f"restrictions.{name}.logicalRows", "expected true or false, and only for 'a'")
        matrices.append((name, rep, image, logical_rows))
    if "r" not in [name for name, *_ in matrices]:
        fail("restrictions.r", "every kernel writes a result matrix 'r'")
    arglist = rs.get("arglist", "")
    if not isinstance(arglist, str) or any(c not in SCALAR_LETTERS for c in arglist):
        fail("restrictions.arglist", f"expected letters from {''.join(SCALAR_LETTERS)}, got {arglist!r}")
    ndrange = rs.get("ndrange")
    if not isinstance(ndrange, str) or not 1 <= len(ndrange) <= 2 or any(c not in SCALAR_LETTERS for c in ndrange):
        fail("restrictions.ndrange", f"expected 1 or 2 letters from {''.join(SCALAR_LETTERS)}, got {ndrange!r}")
    if not isinstance(rs.get("scale", {}), dict):
        fail("restrictions.scale", "expected an object with rows and cols")
    flop = rs.get("flop", 0)
    if not isinstance(flop, (int, float)) or flop < 0:
        fail("restrictions.flop", f"expected a number >= 0, got {flop!r}")
    if op == "activation" and not isinstance(entry.get("activation"), str):
        fail("activation", "an activation kernel names the activation it computes")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        fail("aliases", "expected a list of activation names")
    params = rs.get("params", {})
    if not isinstance(params, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in params.values()):
        fail("restrictions.params", "expected an object of name: default number")
    if len(params) > arglist.count("p"):
        fail("restrictions.params", f"{len(params)} parameters but only {arglist.count('p')} 'p' letters in arglist")
    constraints = entry.get("constraints", [])
    if not isinstance(constraints, list):
        fail("constraints", "expected a list of expressions")
    preconditions = entry.get("preconditions", {})
    if not isinstance(preconditions, dict) or not all(k in PRECONDITIONS for k in preconditions):
        fail("preconditions", f"expected an object with some of {', '.join(PRECONDITIONS)}")
    split = rs.get("split", {"rows": 1, "cols": 1})
    if not isinstance(split, dict) or not set(split) <= {"rows", "cols"}:
        fail("restrictions.split", "expected an object with rows and cols")
    epilogue = entry.get("epilogue", [])
    if not isinstance(epilogue, list) or not set(epilogue) <= set(EPILOGUE_DEFINES) or len(set(epilogue)) < len(epilogue):
        fail("epilogue", f"expected a list of some of {', '.join(EPILOGUE_DEFINES)}, got {epilogue!r}")
    if epilogue:
        needs = {"bias": ["bias"], "affine": ["scale", "shift"]}
        missing = [v for f in epilogue for v in needs.get(f, []) if v not in buffers]
        if op not in EPILOGUE_OPS or missing or "m" not in arglist or "n" not in arglist:
            fail("epilogue", f"a fused epilogue needs a matmul or convolution with 'm' and 'n' in its arglist "
                             f"(R's padding is written as 0) and the buffers it reads; missing {missing}")
        if "activation" in epilogue and arglist.count("p") < 4:
            fail("epilogue", "a fused activation needs 4 'p' parameters in the arglist (p0..p3)")
        if "softmax" in epilogue and "max_m" not in preconditions:
            fail("epilogue", "a softmax epilogue holds whole columns in one work-group: "
                             "give the largest m as preconditions.max_m")
    if (entry.get("scratch_bytes") is None) != (SCRATCH_NAME not in buffers):
        fail("scratch_bytes", f"a kernel with a {SCRATCH_NAME!r} buffer gives its size (and only such a kernel)")
    supported = entry.get("precisions", [DEFAULT_PRECISION])
    if not isinstance(supported, list) or DEFAULT_PRECISION not in supported or not set(supported) <= set(table):
        fail("precisions", f"expected a list of some of {', '.join(table)}, with {DEFAULT_PRECISION!r}")
    if op not in WEIGHT_OPS and supported != [DEFAULT_PRECISION]:
        fail("precisions", f"only the kernels that read weights ({', '.join(WEIGHT_OPS)}) read them in another precision")
    fields = _FixedFields(op, source_path, tuple(path.parent / str(i) for i in includes), tuple(sources),
                          tuple(loop_bounds), tuple(matrices), tuple(buffers), arglist, ndrange, float(flop),
                          tuple((str(k), float(v)) for k, v in params.items()), tuple(aliases), tuple(epilogue),
                          tuple(constraints), tuple(supported))
    _fixed[id(entry)] = (entry, fields)
    return fields
