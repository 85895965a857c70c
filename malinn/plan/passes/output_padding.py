"""Output padding removed on the device: an output whose buffer pads its features (rows padded to a
kernel's tile, a 10-unit head's result in a buffer of 64 rows) gets an unpadded buffer of its own,
``rows x samples`` in Keras's order (the caller's array as laid out), written by a last re-layout
step reading the padded buffer, where the device copies faster than the host would cut the samples
out of the padded buffer (:meth:`~malinn.backends.base.Device.unpads_on_device`). The download then
moves only the caller's floats, and a shorter pass only its own samples. The mirror of
:mod:`.input_padding`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..kinds.layout import RELAYOUT
from ..tensors import Step, Storage, Value

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["unpad_outputs_on_device"]


def unpad_outputs_on_device(
    builder: Recorder, outputs: list[Value], input_copies: list[Step]
) -> tuple[list[Value], list[Step]]:
    """Gives each output whose features are padded (every storage's padding decided; not a view)
    and that the device unpads a new value in an unpadded buffer, written by a re-layout step placed
    right after the step that produced it (its padded buffer then free for later tensors once every
    reader ran), and downloads that value instead. An output that is a model input the device pads
    (``input_copies``) is downloaded from the unpadded buffer it was uploaded into.

    Only padded features count: padded samples alone (columns past the batch) leave a pass's
    samples at the start of the buffer, read as they are. Every output of a plan is treated alike
    (``predict_layers``' plans download every layer's output, each copy saving its own download).

    Returns:
        The values to download, in order, and the copy steps, in launch order.
    """
    uploaded = {id(copy.out): copy.inputs["a"] for copy in input_copies}
    done: dict[int, Value] = {}
    copies: list[Step] = []
    result = []
    for value in outputs:
        if id(value) in uploaded:
            result.append(uploaded[id(value)])
            continue
        if id(value) not in done:
            done[id(value)] = _unpadded(builder, value, copies, len(input_copies))
        result.append(done[id(value)])
    copies.sort(key=builder.steps.index)
    return result, copies


def _unpadded(builder: Recorder, value: Value, copies: list[Step], first: int) -> Value:
    """``value``, or its copy in an unpadded buffer (the step appended to ``copies`` and placed
    among the builder's steps: after its producer, or for an input after the ``first`` steps, which
    pad inputs) where its features are padded and the device unpads it."""
    storage = value.storage
    rows, cols = storage.padded_size
    if rows == value.rows or storage.base is not None or storage.view is not None:
        return value
    if not builder.device.unpads_on_device(4 * rows * cols):
        return value
    plain = Storage(value.rows, value.cols, storage.layout)
    plain.padded = (value.rows, value.cols)
    out = Value(value.shape, plain, name=value.name)
    producer = value.producer
    copy = Step(
        RELAYOUT,
        choose("relayout", builder.device),
        out,
        {"a": value},
        f"{value.name or 'the'} output unpadded on the device",
        layers=list(producer.layers) if producer is not None else [],  # the layer it is the output of shows it
    )
    out.producer = copy
    value.consumers.append(copy)
    if producer is None:  # a model input: after the steps that pad inputs
        at = first
    elif producer in builder.steps:
        at = builder.steps.index(producer) + 1
    else:
        at = len(builder.steps)
    builder.steps.insert(at, copy)
    copies.append(copy)
    return out
