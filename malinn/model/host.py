"""What the parts of a model read of the model that mixes them in: :class:`ModelHost`, the base of
:class:`~malinn.model.predicting.Predicting`, :class:`~malinn.model.memory.MemoryLimits` and
:class:`~malinn.model.summary.Summarizing`, declares the attributes and methods that
:class:`~malinn.model.model.PlannedModel` (and its kinds) define, for the type check alone."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..backends.base import Device
    from ..layers.base import Layer
    from ..plan.plan import Plan

    #: a recent one-pass call (``PlannedModel._recent``): its device, samples, model state (``_stamp``),
    #: the device's ``(max_allocation, global_memory)``, its plan, and the plain input shape (a
    #: float32 array taken as it was) or None
    LastCall: TypeAlias = tuple[Device, int, tuple, tuple[int, int], Plan, tuple | None]

__all__ = ["ModelHost"]


class ModelHost:
    """The model's side that its parts read: defined by :class:`~malinn.model.model.PlannedModel`,
    declared here for the type check (nothing at run time)."""

    if TYPE_CHECKING:
        name: str
        layers: list[Layer]
        _precision: str
        _lock: threading.RLock
        _recent: dict[int, LastCall]
        _max_batches: OrderedDict[tuple, int]

        @property
        def input_shapes(self) -> list | None: ...

        @property
        def built(self) -> bool: ...

        def _not_built(self) -> ValueError: ...

        def _stamp(self) -> tuple: ...

        def _compile(self, device: Device, batch: int, every_layer: bool) -> Plan: ...

        def _output_shapes(self, every_layer: bool) -> list: ...

        def plan(
            self, batch: int, device: Device | None = None, every_layer: bool = False, replica: int = 0
        ) -> Plan: ...

        def _kept_plan(
            self, batch: int, device: Device, every_layer: bool = False, replica: int = 0
        ) -> Plan | None: ...

        def max_batch(self, device: Device | None = None, limit: int | None = None) -> int: ...

        def _arena_bytes_per_sample(self) -> int: ...

        def count_params(self) -> int: ...
