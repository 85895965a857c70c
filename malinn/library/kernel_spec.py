"""A configured kernel: one entry of the kernel library with its defines, and what follows from
them (whether a product or a device suits it, padded shapes, arguments, compiler options, source)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..errors import BackendError, LibraryError
from .entry_fields import DEFINE_NAME, DEFINE_VALUE, EPILOGUE_DEFINES, VIEW_ARGUMENTS, VIEW_DEFINES, fixed_fields
from .expressions import evaluate
from .kernel_sources import fixed_workgroup_kernels, read_source
from .layout import Layout, parse_layout, round_up
from .matrix_restriction import MatrixRestriction
from .precision_table import DEFAULT_PRECISION
from .scalar_arguments import DIVIDE, SCALAR_LETTERS, check_argdefines, division_magic, letter_values

__all__ = ["KernelSpec", "build_spec"]


@dataclass(frozen=True)
class KernelSpec:
    """One validated entry of the kernel library."""

    codename: str
    op: str
    source: str
    function: str
    description: str
    matrices: dict  # name -> MatrixRestriction
    arglist: str
    buffers: tuple
    ndrange: str
    scale: tuple  # (rows, cols) divisors of the ndrange letters, in order
    flop: float
    workgroup: tuple | None
    defines: tuple  # (("NAME", "VALUE"), ...)
    activation: str | None
    source_path: Path
    params: tuple = ()  # (("name", default), ...) in the order of the 'p' letters
    aliases: tuple = ()  # other activation names this kernel answers to
    includes: tuple = ()  # header paths prepended to the source
    epilogue: tuple = ()  # what it can fuse: ("bias", "activation", "affine", "softmax")
    preconditions: tuple = ()  # (("min_m", 64), ("max_n", 8), ...), evaluated for this configuration
    split: tuple = (1, 1)  # (rows, cols) multipliers of the ndrange (items sharing one result block)
    candidates: tuple = ()  # define overrides the tuner times, besides the defaults
    constraints: tuple = ()  # expressions every configuration satisfies
    template: Any = None  # (path, raw entry, precisions table) to configure from (JSON: untyped)
    sources: tuple = ()  # (("gl", source path, (include paths...)), ...): other backends' sources
    precisions: tuple = (DEFAULT_PRECISION,)  # the precisions it supports
    precision: str = DEFAULT_PRECISION  # the precision of this configuration
    scratch_bytes: object = None  # expression over the defines and scalar letters: the scratch buffer's size
    loop_bounds: tuple = ()  # (("gl", expression), ...): the loop iterations one invocation of that source runs
    argdefines: tuple = ()  # defines the OpenCL source takes as uint arguments after its buffers
    workgroup_bounds: tuple = ()  # (("opencl:cpu", (16, 16)), ...): work-group bounds by device class
    workgroup_items: tuple = ()  # (("opencl:gpu", 256), ...): the most items of a bounded work-group

    def in_precision(self, precision: str) -> "KernelSpec":
        """This configuration with its weights (and sums) in ``precision``.

        Raises:
            LibraryError: the kernel does not support ``precision``.
        """
        if precision == self.precision:
            return self
        if precision not in self.precisions:
            raise LibraryError(
                f"kernel {self.codename!r} supports precisions {list(self.precisions)}, not {precision!r}"
            )
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
            spec = _remember(entry, merged, build_spec(path, self.codename, entry, merged, table))
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
        unknown = (
            set(overrides)
            - set(dict(self.defines))
            - {EPILOGUE_DEFINES[f] for f in self.epilogue}
            - {name for p in self.precisions for name, _ in table[p].defines}
            - (set(VIEW_DEFINES) if "view" in self.epilogue else set())
        )
        if unknown:
            raise LibraryError(
                f"kernel {self.codename!r} has no defines {sorted(unknown)}; its defines are "
                f"{', '.join(name for name, _ in self.defines)}"
            )
        merged = {**dict(self.defines), **{k: str(v) for k, v in overrides.items()}}
        if _cached(entry, merged) is None:
            try:
                failed = [c for c in self.constraints if not evaluate(c, merged)]
                if not failed:
                    return self._with_defines(merged)
            except (LibraryError, ValueError) as exc:  # the configuration's fault, not the file's
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

    def workgroup_bound(self, device: Any) -> tuple | None:
        """The entry's ``workgroup_bound`` for ``device``'s class: the first of ``"<backend>:<kind>"``,
        ``"<backend>"``, ``"<kind>"`` and ``"*"`` it names (as ``defaults`` are looked up), else None."""
        return _by_class(dict(self.workgroup_bounds), device)

    def workgroup_item_limit(self, device: Any) -> int | None:
        """The entry's ``workgroup_items`` for ``device``'s class (looked up as
        :meth:`workgroup_bound` is): the most items of a work-group its bound gives, filled along
        the first axis first; else None (the bound alone)."""
        return _by_class(dict(self.workgroup_items), device)

    @property
    def requires_workgroup(self) -> bool:
        """Whether the kernel runs only in its configuration's work-group shape: its OpenCL source
        declares ``reqd_work_group_size`` (a launch in another shape fails there, and another
        backend's port of it, built in that shape, would compute wrong values)."""
        return bool(self.workgroup) and self.function in fixed_workgroup_kernels(self.source_path)

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
            return (
                device.image_support and rows // 4 <= device.image2d_max_size[0] and cols <= device.image2d_max_size[1]
            )
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
            raise ValueError(f"kernel {self.codename!r} takes parameters {names or 'none'}, not {sorted(unknown)}")
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
                values += division_magic(int(defines[name[len(DIVIDE) :]]))
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
                raise BackendError(
                    f"kernel {self.codename!r} has no {backend} source (kernels/library.json: "
                    f'its "sources" name {", ".join(self.backends())}); choose another kernel'
                )
            source_path, includes = found[0]
            source = source_path.name
        head = [f"/* malinn: {self.codename} ({source}) */"]
        for name in sorted(layouts):
            head.append(render_index(parse_layout(layouts[name]), f"MALINN_INDEX_{name.upper()}"))
        # OpenCL C's #line names each file, so a build log points into kernels/, not the joined source
        line = (lambda path: f'#line 1 "{path.name}"\n') if backend == "opencl" else (lambda path: "")
        head += [line(path) + read_source(path) for path in includes]
        return "\n".join(head) + "\n" + line(source_path) + read_source(source_path)


_configured: dict = {}  # (entry id, defines) -> (the entry, KernelSpec)


def _cached(entry: dict, defines: dict) -> KernelSpec | None:
    """The configured spec of ``entry`` with ``defines``, if made before. The entry itself is kept
    beside it and compared, so a new entry that reuses a freed one's id never gets its spec."""
    found = _configured.get((id(entry), tuple(sorted(defines.items()))))
    return found[1] if found is not None and found[0] is entry else None


def _remember(entry: dict, defines: dict, spec: KernelSpec) -> KernelSpec:
    _configured[(id(entry), tuple(sorted(defines.items())))] = (entry, spec)
    return spec


def build_spec(path: Path, codename: str, entry: dict, defines: dict, table: dict) -> KernelSpec:
    """The entry's spec for the complete define dict ``defines``: the fields no define changes are
    checked once per entry (:func:`fixed_fields`), the expressions of the defines here."""

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

    fixed = fixed_fields(path, codename, entry, table)
    rs = entry["restrictions"]
    scalars = {**defines, **{c: 1 for c in SCALAR_LETTERS if c != "p"}}
    for backend, bound in fixed.loop_bounds:
        try:
            evaluate(bound, scalars)
        except (ValueError, TypeError) as exc:
            fail(f"sources.{backend}.loop_iterations", str(exc))
    matrices = {
        name: MatrixRestriction(
            rep,
            positive_int(f"restrictions.{name}.rowAlign", rs[name].get("rowAlign")),
            positive_int(f"restrictions.{name}.colAlign", rs[name].get("colAlign")),
            image,
            logical_rows,
        )
        for name, rep, image, logical_rows in fixed.matrices
    }
    scale = rs.get("scale", {"rows": 1, "cols": 1})
    scale_t = (
        positive_int("restrictions.scale.rows", scale.get("rows", 1)),
        positive_int("restrictions.scale.cols", scale.get("cols", 1)),
    )
    wg = rs.get("workgroup")
    if wg is not None:
        if not isinstance(wg, list) or len(wg) != len(fixed.ndrange):
            fail("restrictions.workgroup", f"expected null or a list of {len(fixed.ndrange)} positive integers")
        wg = tuple(positive_int("restrictions.workgroup", v) for v in wg)
    bounds = rs.get("workgroup_bound", {})
    if not isinstance(bounds, dict) or not all(
        isinstance(key, str) and isinstance(shape, list) and len(shape) == len(fixed.ndrange)
        for key, shape in bounds.items()
    ):
        fail(
            "restrictions.workgroup_bound",
            f'expected an object of device class ("opencl:cpu", "gpu", "*", ...): a list of '
            f"{len(fixed.ndrange)} positive integers",
        )
    workgroup_bounds = tuple(
        (key, tuple(positive_int(f"restrictions.workgroup_bound.{key}", v) for v in shape))
        for key, shape in bounds.items()
    )
    items = rs.get("workgroup_items", {})
    if not isinstance(items, dict) or not all(isinstance(key, str) for key in items):
        fail(
            "restrictions.workgroup_items",
            'expected an object of device class ("opencl:gpu", "*", ...): a positive integer',
        )
    workgroup_items = tuple((key, positive_int(f"restrictions.workgroup_items.{key}", v)) for key, v in items.items())
    if not all(DEFINE_NAME.fullmatch(str(k)) and DEFINE_VALUE.fullmatch(str(v)) for k, v in defines.items()):
        fail("defines", "expected an object of NAME: simple value")
    candidates = entry.get("candidates", [])
    if not isinstance(candidates, list) or not all(isinstance(c, dict) and set(c) <= set(defines) for c in candidates):
        fail("candidates", "expected a list of objects overriding this entry's defines")
    for c in fixed.constraints:
        try:
            evaluate(c, defines)
        except ValueError as exc:
            fail("constraints", str(exc))
    preconditions = {k: positive_int(f"preconditions.{k}", v) for k, v in entry.get("preconditions", {}).items()}
    split = rs.get("split", {"rows": 1, "cols": 1})
    split_t = (
        positive_int("restrictions.split.rows", split.get("rows", 1)),
        positive_int("restrictions.split.cols", split.get("cols", 1)),
    )
    scratch = entry.get("scratch_bytes")
    if scratch is not None:
        try:
            evaluate(scratch, scalars)
        except ValueError as exc:
            fail("scratch_bytes", str(exc))
    given = {k: str(v) for k, v in defines.items()}
    matching = [p for p in fixed.precisions if all(given.get(k) == v for k, v in table[p].defines)]
    precision = max(matching, key=lambda p: len(table[p].defines))
    return KernelSpec(
        codename=codename,
        op=fixed.op,
        source=str(entry["source"]),
        function=entry["function"],
        description=str(entry.get("description", "")),
        matrices=matrices,
        arglist=fixed.arglist,
        buffers=fixed.buffers,
        ndrange=fixed.ndrange,
        scale=scale_t,
        flop=fixed.flop,
        workgroup=wg,
        defines=tuple((str(k), str(v)) for k, v in defines.items()),
        activation=entry.get("activation"),
        source_path=fixed.source_path,
        params=fixed.params,
        aliases=fixed.aliases,
        includes=fixed.includes,
        epilogue=fixed.epilogue,
        preconditions=tuple(preconditions.items()),
        split=split_t,
        candidates=tuple(candidates),
        constraints=fixed.constraints,
        template=(path, entry, table),
        precisions=fixed.precisions,
        precision=precision,
        sources=fixed.sources,
        scratch_bytes=scratch,
        loop_bounds=fixed.loop_bounds,
        argdefines=check_argdefines(rs.get("argdefines", []), defines, fail),
        workgroup_bounds=workgroup_bounds,
        workgroup_items=workgroup_items,
    )


def _by_class(values: dict, device: Any) -> Any:
    """The value ``values`` gives ``device``'s class: the first of ``"<backend>:<kind>"``,
    ``"<backend>"``, ``"<kind>"`` and ``"*"`` it names (as ``defaults`` are looked up), else None."""
    keys = (f"{device.backend}:{device.kind}", device.backend, device.kind, "*")
    return next((values[key] for key in keys if key in values), None)
