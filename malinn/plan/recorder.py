"""What an op kind asks of the plan being made and of the plan made, as two protocols.

The op kinds (:mod:`malinn.plan.kinds`) record steps on a :class:`~malinn.plan.builder.PlanBuilder`
and bind them on a :class:`~malinn.plan.plan.Plan`, and the compile passes (:mod:`malinn.plan.passes`)
rewrite the builder's steps; the builder and the plan import the kinds and the passes. Those name
the two protocols below instead, so they stand beneath the builder and the plan, which have what
the protocols declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..backends.base import Device
    from ..choice.matrix import DeviceMatrix
    from ..library.kernel_library import KernelSpec
    from .tensors import Step, Storage, Value

__all__ = ["Recorder", "Planned"]


class Recorder(Protocol):
    """What a kind's lowering function and a compile pass (:mod:`malinn.plan.passes`) use of
    :class:`~malinn.plan.builder.PlanBuilder`."""

    device: Device
    batch: int
    precision: str
    inputs: list[Value]
    steps: list[Step]
    convs: list

    def read_once(self, x: Value) -> bool: ...

    def record(
        self,
        kind: Any,
        spec: KernelSpec,
        out_shape: Sequence[int],
        inputs: dict[str, Value],
        what: str,
        storage: Storage | None = None,
        **fields: Any,
    ) -> Value: ...


class Planned(Protocol):
    """What a kind uses of :class:`~malinn.plan.plan.Plan` when it binds a step's launch."""

    device: Device

    def matrix(self, value: Value, rows: int | None = None) -> DeviceMatrix: ...
