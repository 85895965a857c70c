"""The parsed kernel library: kernel specs by codename, op and activation, the precisions, and the
default kernels per op, device kind and backend."""

from __future__ import annotations

from pathlib import Path

from ..errors import BackendError, LibraryError
from .entry_fields import MATMUL_CHOICES
from .kernel_spec import KernelSpec
from .precision_table import DEFAULT_PRECISION, Precision

__all__ = ["KernelLibrary"]


class KernelLibrary:
    """The parsed library: kernel specs by codename plus the default codename per op and device."""

    def __init__(
        self, kernels: dict, defaults: dict, path: Path, precisions: dict | None = None, sections: dict | None = None
    ):
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
            raise LibraryError(
                f"{self.path}: no kernel with codename {codename!r}; known: {', '.join(sorted(self.kernels))}"
            ) from None

    def __contains__(self, codename: str) -> bool:
        return codename in self.kernels

    def codenames(self, op: str, backend: str | None = None) -> list[str]:
        """Every codename that implements ``op`` (on ``backend``, when given), in library order."""
        return [c for c, k in self.kernels.items() if k.op == op and (backend is None or k.has_source(backend))]

    def default_specs(
        self, op: str, device_kind: str, backend: str = "opencl", precision: str = DEFAULT_PRECISION
    ) -> list[KernelSpec]:
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
            specs = [
                self[c["codename"]].configure(c.get("defines")) if isinstance(c, dict) else self[c] for c in choices
            ]
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
            raise ValueError(
                f"{what}: no kernel computes activation {activation!r}; "
                f"available: {', '.join(['linear'] + self.activations())}"
            )
        return spec

    def activations(self) -> list[str]:
        """Every activation name a kernel computes, aliases included."""
        return [name for k in self.kernels.values() if k.op == "activation" for name in (k.activation,) + k.aliases]

    def default(self, op: str, device_kind: str, backend: str = "opencl") -> str:
        """The default codename for ``op`` on a device of kind ``gpu``/``cpu``/``accelerator``
        (the first, where the table lists several; see :meth:`default_specs`)."""
        return self.default_spec(op, device_kind, backend).codename
