"""Input padding on the device: an input whose kernels read it from a padded buffer is uploaded as
the caller's array is laid out, into a buffer of its own, and copied into the padded buffer by the
plan's first steps (the re-layout kernel, which zeroes the padding), where the device copies faster
than the host would pad it (:meth:`~malinn.backends.base.Device.pads_on_device`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..kinds.layout import RELAYOUT
from ..tensors import Step, Storage, Value

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["pad_inputs_on_device"]


def pad_inputs_on_device(builder: Recorder) -> list[Step]:
    """Gives each padded input the device pads (every storage's padding decided) a new input value
    in an unpadded buffer (``rows x samples``, Keras's order: the caller's array as it is) and a
    first step copying it into the padded buffer the kernels read, which that step now produces.
    Returns the copy steps, in the order of the inputs."""
    copies = []
    for index, x in enumerate(builder.inputs):
        storage = x.storage
        if storage.padded_size == (x.rows, x.cols) or storage.base is not None or storage.view is not None:
            continue
        if not x.consumers or not builder.device.pads_on_device(4 * x.rows * x.cols):
            continue
        plain = Storage(x.rows, x.cols, storage.layout)
        plain.padded = (x.rows, x.cols)
        source = Value(x.shape, plain, name=x.name)
        reader = min(x.consumers, key=builder.steps.index)
        copy = Step(
            RELAYOUT,
            choose("relayout", builder.device),
            x,
            {"a": source},
            f"input {x.name!r} padded on the device",
            layers=list(reader.layers),  # the layer reading it launches the copy (its summary row shows it)
        )
        x.producer = copy
        source.consumers.append(copy)
        builder.inputs[index] = source
        copies.append(copy)
    builder.steps[:0] = copies
    return copies
