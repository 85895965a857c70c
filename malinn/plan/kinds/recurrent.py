"""A recurrence over every time step of a SimpleRNN, LSTM or GRU layer in one launch
(kernels/recurrent.cl): the input projection of all steps is one matmul before it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ...errors import DeviceError
from ..tensor import format_shape
from ..tensors import Step, Value, Vector
from .base import OpKind, register

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Recorder

__all__ = ["RECURRENT", "CELLS", "recurrence"]

#: a recurrent layer's cell -> the kernel's CELL and its gates (Keras's order)
CELLS = {"simple_rnn": (0, 1), "lstm": (1, 4), "gru": (2, 3), "gru_reset_before": (3, 3)}


class Recurrent(OpKind):
    """Reads the input projection ``b`` (and a mask ``a``), the recurrent kernel
    (``step.vectors["scale"]``) and a GRU's recurrent bias (``"shift"``); writes a new result."""

    name = "recurrent"
    shape_generic = True

    def wanted(self, step: Step, slot: str) -> tuple:
        restriction = step.spec.matrices[slot if slot in step.spec.matrices else "r"]
        layout = None if restriction.any_layout else restriction.layout
        return layout, restriction.row_multiple, restriction.col_multiple


RECURRENT = register(Recurrent())


def recurrence(
    builder: Recorder,
    xproj: Value,
    units: int,
    cell: str,
    recurrent_kernel: Vector,
    recurrent_bias: Vector | None = None,
    activation: str = "tanh",
    recurrent_activation: str = "sigmoid",
    go_backwards: bool = False,
    return_sequences: bool = False,
    state: str = "h",
    mask: Value | None = None,
    zero_masked: bool = False,
    reverse_output: bool = False,
    what: str = "recurrent",
) -> Value:
    """The recurrence of one layer over ``xproj``, the input projection ``(batch, steps, gates *
    units)`` of every step (bias included): every step's output ``(batch, steps, units)`` in the
    order the steps run (``return_sequences``), else the last state ``(batch, units)``: ``h``, or
    an LSTM's ``c`` (``state="c"``). ``mask`` is a ``(batch, steps)`` value of 0 and 1 (0:
    masked: the state is kept, the output is the previous one or, ``zero_masked``, zero).
    ``reverse_output`` writes the sequence in the other order (a Bidirectional's backward layer,
    whose steps run from the last: its outputs then stand at their input steps).

    Raises:
        DeviceError: ``units`` exceeds the work-group the device launches (one item per unit).
        ValueError: the shapes do not fit.
    """
    code, gates = CELLS[cell]
    batch, steps, features = xproj.shape
    if features != gates * units:
        raise ValueError(
            f"{what}: the input projection {format_shape(xproj.shape)} does not hold {gates} gates of {units} units"
        )
    device = builder.device
    limit = min(int(device.max_work_group_size), int(device.max_work_item_sizes[0]))
    if units > limit:
        raise DeviceError(
            f"{what}: its recurrence runs one work item per unit in one work-group, and {units} units "
            f"exceed {device.name}'s largest work-group of {limit} items"
        )
    if mask is not None and mask.shape != (batch, steps):
        raise ValueError(
            f"{what}: the mask {format_shape(mask.shape)} does not fit the input of "
            f"{steps} steps {format_shape(xproj.shape)}"
        )
    defines = {
        "UNITS": int(units),
        "STEPS": int(steps),
        "OUT_STEPS": int(steps) if return_sequences else 1,
        "CELL": code,
        "ACT": f"act_{activation}",
        "RACT": f"act_{recurrent_activation}",
        "BACKWARDS": int(bool(go_backwards)),
        "SEQUENCES": int(bool(return_sequences)),
        "STATE": int(state == "c"),
        "ZERO_MASKED": int(bool(zero_masked)),
        "RBIAS": int(recurrent_bias is not None),
        "FLIP": int(bool(reverse_output and return_sequences)),
    }
    defines["KS"] = _unit_split(device, units, code)
    spec = choose("recurrent_masked" if mask is not None else "recurrent", device).configure(defines)
    shape = (batch, steps, units) if return_sequences else (batch, units)
    inputs = {"b": xproj, **({"a": mask} if mask is not None else {})}
    vectors = {"scale": recurrent_kernel, **({"shift": recurrent_bias} if recurrent_bias is not None else {})}
    return builder.record(RECURRENT, spec, shape, inputs, what, vectors=vectors)


#: the most work items a unit's recurrent sums are split over (kernels/recurrent.cl KS)
_MAX_UNIT_SPLIT = 8
#: local memory the split's partial sums may take (every OpenCL device has 32 KiB)
_PARTIAL_BYTES = 16 * 1024


def _unit_split(device: Device, units: int, cell: int) -> int:
    """KS: on a GPU, each unit's sums over the largest power of two of items (at most
    :data:`_MAX_UNIT_SPLIT`, no more than the units) that the work-group and the partial sums'
    local memory hold, each item keeping its rows of U in registers for the whole sequence (the
    step no longer waits on a unit's UNITS loads); 1 on other devices (a CPU runs the items of a
    group one after another) and for a GRU that resets before (its second product reads r h). The
    partial sums and the state fit the device's local memory (OpenGL ES guarantees 16 KiB)."""
    if device.kind != "gpu" or cell == 3:
        return 1
    limit = min(
        int(device.max_work_group_size), int(device.max_work_item_sizes[0]) * int(device.max_work_item_sizes[1])
    )
    split = 1
    while (
        split * 2 <= min(_MAX_UNIT_SPLIT, units)
        and units * split * 2 <= limit
        and split * 2 <= int(device.max_work_item_sizes[1])
        and 4 * split * 2 * 4 * units <= _PARTIAL_BYTES
        and 4 * units * (split * 2 * 4 + 1) <= int(device.local_memory)  # with h: a GL GPU may have 16 KiB
    ):
        split *= 2
    return split
