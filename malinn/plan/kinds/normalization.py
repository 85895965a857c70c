"""Layer steps that rewrite their input in place with per-element parameters or per-group
statistics: broadcast parameters (PReLU, Normalization, a BatchNormalization on another axis:
kernels/broadcast.cl) and normalization over axes (softmax, layer and RMS normalization, L2
normalization: kernels/normalize_axes.cl)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...backends.base import Device
from ...choice.kernel_choice import choose, explicit_choice
from ...errors import BackendError, LibraryError
from ...library.kernel_library import KernelSpec, load_library
from ..tensor import format_shape
from ..tensors import Step, Value, Vector
from .base import OpKind, register
from .layout import permute

if TYPE_CHECKING:
    from ..recorder import Planned, Recorder

__all__ = ["BROADCAST", "NORMALIZE", "NORMALIZE_MODES", "broadcast", "normalize"]


class InPlaceLayerStep(OpKind):
    """Rewrites its input ``b``'s buffer (the step ``overwrites`` it), reading ``step.vectors``."""

    def operands(self, plan: Planned, step: Step) -> tuple:
        return step.spec, {"r": plan.matrix(step.out)}, {}, step.params


class Broadcast(InPlaceLayerStep):
    name = "broadcast"


class Normalize(InPlaceLayerStep):
    name = "normalize"


BROADCAST, NORMALIZE = register(Broadcast()), register(Normalize())

#: what :func:`normalize` computes over each group -> the kernel's MODE (kernels/normalize_axes.cl)
NORMALIZE_MODES = {"softmax": 0, "softmax_logsumexp": 1, "layer": 2, "rms": 3, "unit": 4}


def broadcast(
    builder: Recorder,
    x: Value,
    form: int,
    scale: Vector,
    shift: Vector | None,
    period_cols: int,
    what: str = "broadcast",
) -> Value:
    """Per-element parameters applied to ``x`` in place (kernels/broadcast.cl): ``form`` 0 is
    ``x * scale + shift``, 1 ``(x + shift) * scale``, 2 PReLU (``scale`` holds alpha). The vectors
    hold ``period_cols * x.rows`` values: element (row, col) of ``x``'s matrix view reads
    ``(col % period_cols) * x.rows + row`` (parameters over the sample's trailing axes)."""
    if x.cols % period_cols or any(v.values.size != period_cols * x.rows for v in (scale, shift) if v is not None):
        raise ValueError(f"{what}: parameters of {scale.values.size} values do not tile {format_shape(x.shape)}")
    spec = choose("broadcast", builder.device).configure({"FORM": int(form), "PCOLS": int(period_cols)})
    vectors = {"scale": scale, **({"shift": shift} if shift is not None else {})}
    return builder.record(BROADCAST, spec, x.shape, {"b": x}, what, storage=x.storage, vectors=vectors, overwrites=True)


def normalize(
    builder: Recorder,
    x: Value,
    mode: str,
    axes: Iterable[int],
    epsilon: float = 0.0,
    scale: Vector | None = None,
    shift: Vector | None = None,
    what: str = "normalize",
) -> Value:
    """Each group of ``x``'s elements along ``axes`` normalized (softmax, layer normalization, RMS
    scaling, L2 normalization: :data:`NORMALIZE_MODES`), in place, one kernel. ``axes`` are indices
    into ``x.shape`` (the batch axis is 0 and is never one of them); axes that are not one run are
    permuted to the end and back. ``scale`` / ``shift`` (gamma / beta) hold one value per element of
    a group, in the row-major order of the sorted axes."""
    axes = tuple(sorted(set(int(a) for a in axes)))
    rank = len(x.shape)
    if not axes or axes[0] < 1 or axes[-1] >= rank:
        raise ValueError(f"{what}: axes {axes} are not sample axes of {format_shape(x.shape)}")
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        order = [a for a in range(1, rank) if a not in axes] + list(axes)
        y = normalize(
            builder, permute(builder, x, order, what), mode, range(rank - len(axes), rank), epsilon, scale, shift, what
        )
        return permute(builder, y, [order.index(a) + 1 for a in range(1, rank)], what)
    group, inner = math.prod(x.shape[axes[0] : axes[-1] + 1]), math.prod(x.shape[axes[-1] + 1 :])
    what_defines = {
        "GROUP": group,
        "MODE": NORMALIZE_MODES[mode],
        "CENTER": int(shift is not None),
        "SCALE": int(scale is not None),
    }
    columns = _column_kernel(builder.device, group) if inner == 1 and group == x.rows else None
    if columns is not None:  # each group one column of the matrix view: a work-group per column
        spec = columns.configure({**what_defines, "WG": _column_items(builder.device, group)})
    else:
        split = {"SR": x.rows, "SC": group // x.rows} if inner == 1 else {"SR": 1, "SC": group}
        spec = choose("normalize", builder.device).configure({**what_defines, "INNER": inner, **split})
    vectors = {name: v for name, v in (("scale", scale), ("shift", shift)) if v is not None}
    return builder.record(
        NORMALIZE,
        spec,
        x.shape,
        {"b": x},
        what,
        storage=x.storage,
        vectors=vectors,
        overwrites=True,
        params={"epsilon": float(epsilon)},
    )


#: the most items that share one column's elements (kernels/normalize_columns.cl WG)
_COLUMN_ITEMS = 256


def _column_kernel(device: Device, group: int) -> KernelSpec | None:
    """The library's ``normalize_column`` kernel for the device (a work-group per column), where it
    names one for the device's backend, no kernel was chosen for ``normalize`` with ``use``, and the
    device takes its work-group; else None (normalize_axes: an item per group)."""
    if explicit_choice("normalize", device) is not None:
        return None
    try:
        specs = load_library().default_specs("normalize_column", device.kind, device.backend)
    except (LibraryError, BackendError):  # none for this backend (the gles3 backend runs normalize_axes)
        return None
    if not specs or _column_items(device, group) > int(device.max_work_group_size):
        return None
    return specs[0]


def _column_items(device: Device, group: int) -> int:
    """WG: the power of two of items at least the group's elements, at most :data:`_COLUMN_ITEMS`
    and the device's work-group."""
    items = 1
    while items < min(group, _COLUMN_ITEMS, int(device.max_work_group_size)):
        items *= 2
    return min(items, int(device.max_work_group_size))
