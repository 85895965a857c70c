"""What every op kind of a plan step is: one registered object that lowers, binds and describes
its steps (as TFLite Micro registers each op once).

A layer lowers itself with the kind modules' functions (``matmul(builder, x, weight, ...)``), each
of which records :class:`~malinn.plan.tensors.Step` objects whose ``kind`` is the registered
:class:`OpKind`. The compile passes (:mod:`malinn.plan.passes`) and the plan
(:mod:`malinn.plan.plan`) ask the step's kind what it needs (layouts, paddings, what it can fuse,
its kernel's arguments) rather than testing names: a new op is a module of its own and its kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_call import bind

if TYPE_CHECKING:
    from ...backends.base import BoundLaunch, Device
    from ...library.kernel_library import KernelSpec
    from ..recorder import Planned
    from ..tensors import Step

__all__ = ["OpKind", "KINDS", "register", "kind_named"]

#: every op kind, by name (filled as the kind modules are imported: :mod:`malinn.plan.kinds`)
KINDS: dict[str, OpKind] = {}


class OpKind:
    """One kind of plan step (matmul, conv, merge, ...): the rules its steps follow.

    Attributes:
        name: the kind's name (``summary``'s and :meth:`Plan.describe`'s ``kind``).
        in_place: its steps always write their input ``b``'s buffer (a bias, an activation).
        weighted: its steps read a layer's weight matrix as operand ``a`` (``step.weight``), in the
            plan's precision, and may compute bias, activation and affine in their epilogue.
        shows_activation: a fused activation is part of what its steps compute (the summary's
            ``fused`` column names it).
        shape_generic: one kernel configured per step for its shapes (the summary shows only the
            defines this step sets).
        couples_columns: its operand ``b`` and result share their column padding (a matmul's).
    """

    name = ""
    in_place = False
    weighted = False
    shows_activation = False
    shape_generic = False
    couples_columns = False

    # ---------------------------------------------------------------- compiling
    def wanted(self, step: "Step", slot: str) -> tuple:
        """``(layout or None for any, row multiple, column multiple)`` that ``step`` asks of the
        tensor in ``slot`` (``"a"``, ``"b"`` or the result ``"r"``): what its kernel's restrictions
        declare for ``a``, and for ``r`` (an in-place input ``b`` is the result's buffer)."""
        restriction = step.spec.matrices["a" if slot == "a" else "r"]
        layout = None if restriction.any_layout else restriction.layout
        return layout, restriction.row_multiple, restriction.col_multiple

    def absorb(self, step: "Step", after: "Step", device: "Device") -> bool:
        """Takes the in-place step ``after``, which alone reads ``step``'s result, into ``step``'s
        kernel (an epilogue) where that kernel can compute it; returns whether it did."""
        return False

    def swapped(self, step: "Step") -> "KernelSpec | None":
        """``step``'s kernel computing the same result in operand ``a``'s buffer instead of ``b``'s
        (the operands exchanged), or None where it cannot."""
        return None

    # ---------------------------------------------------------------- allocating
    def weights(self, step: "Step") -> list:
        """``[(Weight, least padded shape)]`` of the weight copies ``step``'s kernel reads."""
        return []

    def scratch_values(self, step: "Step") -> dict:
        """Scalar letters beyond the result's ``h`` and ``w`` that size its kernel's scratch."""
        return {}

    def operands(self, plan: "Planned", step: "Step") -> tuple:
        """``(kernel, matrices, vectors, params)`` that ``step`` binds: every input and the result,
        the step's own vectors, its parameters."""
        matrices = {slot: plan.matrix(x) for slot, x in step.inputs.items()}
        matrices["r"] = plan.matrix(step.out)
        return step.spec, matrices, {}, step.params

    def bind(self, plan: "Planned", step: "Step") -> "BoundLaunch | None":
        """``step``'s kernel bound to its buffers on the plan's device (built, or taken from the
        program caches), or None where it launches nothing (a view)."""
        if step.view:
            return None
        spec, matrices, vectors, params = self.operands(plan, step)
        for name, vector in step.vectors.items():
            vectors[name] = vector.on_device(plan.device)
        return bind(spec, plan.device, matrices, vectors, params, what=step.what)

    # ---------------------------------------------------------------- describing
    def fused(self, step: "Step") -> list:
        """What ``step``'s kernel computes beyond its own op (the summary's ``fused`` column)."""
        return ["bias"] if step.bias is not None else []

    def __repr__(self) -> str:
        return f"<op kind {self.name}>"


def register(kind: OpKind) -> OpKind:
    """Adds ``kind`` to :data:`KINDS` (once per name) and returns it."""
    if kind.name in KINDS:
        raise ValueError(f"op kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def kind_named(name: str) -> OpKind:
    """The registered op kind called ``name``.

    Raises:
        KeyError: no kind has that name (the message lists those that do).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"no op kind {name!r}; the plan knows {', '.join(sorted(KINDS))}") from None
