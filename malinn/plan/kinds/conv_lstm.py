"""Keras's convolutional LSTM (ConvLSTM1D, ConvLSTM2D, ConvLSTM3D) as plan steps: the input
convolution of every time step is one convolution over ``batch * steps`` images (:func:`images_conv`,
the convolution lowering of :mod:`.conv` with the images counted right; a ConvLSTM3D's is one
:func:`~.volume.conv3d` over ``batch * steps`` volumes); then, per step, launches recorded once in
the plan: the recurrent convolution of ``h`` (``'same'``, stride 1, no bias: :func:`~.conv.conv`,
or :func:`~.volume.conv3d` for volumes) and two launches of kernels/conv_lstm_gates.cl, which add
the step's part of the input convolution, apply the activations and write the new cell state
``c``, then the new output ``h`` (:func:`conv_lstm_recurrence`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...choice.conv_choice import choose_algorithm
from ...choice.conv_geometry import ConvGeometry
from ...choice.kernel_choice import choose
from ..tensor import format_shape
from ..tensors import C, Step, Value, Vector, Weight
from .base import OpKind, register
from .conv import conv, conv_step, in_weight_precision
from .matmul import matmul
from .merge import CONCAT
from .window import IM2COL

if TYPE_CHECKING:
    from ..recorder import Planned, Recorder

__all__ = ["CONV_LSTM_GATES", "images_conv", "conv_lstm_gates", "conv_lstm_recurrence"]


class ConvLSTMGates(OpKind):
    """Reads the input convolution of every step ``b``, this step's recurrent convolution ``a``
    (absent at the first step) and a cell state ``c`` (bound as the kernel's ``scale`` buffer,
    column-major: the state ``c`` writes); writes the new state (``STATE=0``) or the new ``h``."""

    name = "conv_lstm_gates"
    shape_generic = True

    def wanted(self, step: Step, slot: str) -> tuple:
        if slot == "c" or (slot == "r" and int(step.spec.config["STATE"]) == 0):
            return C, 1, 1  # the state is read column-major, LDS its padded rows
        restriction = step.spec.matrices[slot]
        layout = None if restriction.any_layout else restriction.layout
        return layout, restriction.row_multiple, restriction.col_multiple

    def operands(self, plan: Planned, step: Step) -> tuple:
        matrices = {slot: plan.matrix(x) for slot, x in step.inputs.items() if slot != "c"}
        matrices["r"] = plan.matrix(step.out)
        spec, vectors = step.spec, {}
        state = step.inputs.get("c")
        if state is not None:
            held = plan.matrix(state)
            assert str(held.layout) == "C", "the layouts pass gives a ConvLSTM state column-major"
            vectors["scale"] = held.buffer
            spec = spec.configure({"LDS": state.storage.padded_size[0]})
        return spec, matrices, vectors, step.params


CONV_LSTM_GATES = register(ConvLSTMGates())


def images_conv(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    images: int,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    what: str = "conv",
) -> Value:
    """The convolution of ``x``, ``images`` images of the geometry ``geometry`` (the window defines)
    whatever its Keras shape (a ConvLSTM's ``(batch, steps, H, W, C)``: ``batch * steps`` images),
    by ``weight`` (``COUT x KH*KW*C``), plus ``bias``: :func:`~.conv.conv`'s lowering (a 1x1 stride-1
    convolution a matmul, else the algorithm chosen for the geometry: ``im2col`` and a matmul, or a
    ``conv`` kernel), with the geometry's batch the images it convolves (what the algorithm's rules
    and the tuner see)."""
    g = dict(geometry)
    cin = x.rows
    out_shape = (builder.batch,) + tuple(out_shape[1:])
    pointwise = (g["KH"], g["KW"], g["SH"], g["SW"], g["PT"], g["PL"]) == (1, 1, 1, 1, 0, 0)
    if pointwise and (g["IH"], g["IW"]) == (g["OH"], g["OW"]):
        return matmul(builder, x, weight, bias, "linear", None, what)
    shape = ConvGeometry.of(images, cin, weight.shape[0], 1, g)
    builder.convs.append(shape)
    spec = choose_algorithm(builder.device, shape)[0]
    if spec.op == "im2col":
        patches = builder.record(
            IM2COL, spec.configure({**g, "CIN": cin}), out_shape[:-1] + (weight.shape[1],), {"a": x}, what
        )
        return matmul(builder, patches, weight, bias, "linear", None, what)
    spec = in_weight_precision(builder, spec.configure(shape.defines()))
    return conv_step(builder, spec, x, weight, out_shape, bias, "linear", None, what)


def conv_lstm_gates(
    builder: Recorder,
    xconv: Value,
    recurrent: Value | None,
    state: Value | None,
    filters: int,
    step: int,
    new_state: bool,
    activation: str,
    recurrent_activation: str,
    what: str,
) -> Value:
    """One launch of kernels/conv_lstm_gates.cl for step ``step`` of ``xconv`` (the input
    convolution of every step, ``(batch, steps, ..., 4 * filters)``) and ``recurrent`` (this step's
    recurrent convolution, ``(batch, ..., 4 * filters)``; None at the first step, where ``h`` is
    zero): the new cell state (``new_state``; ``state`` the previous one, None at the first step),
    else the new ``h`` (``state`` this step's new cell state)."""
    batch, steps = xconv.shape[:2]
    sample = xconv.shape[2:-1]
    pixels = 1
    for d in sample:
        pixels *= d
    shape = (batch,) + tuple(sample) + (filters,)
    if recurrent is not None and recurrent.shape != shape[:-1] + (4 * filters,):
        raise ValueError(
            f"{what}: the recurrent sums {format_shape(recurrent.shape)} do not fit the input "
            f"convolution {format_shape(xconv.shape)}"
        )
    spec = choose("conv_lstm_gates", builder.device).configure(
        {
            "FILTERS": int(filters),
            "PIXELS": int(pixels),
            "STEPS": int(steps),
            "STATE": int(not new_state),
            "FIRST": int(recurrent is None),
            "ACT": f"act_{activation}",
            "RACT": f"act_{recurrent_activation}",
            "STEP": int(step),
        }
    )
    inputs = {"b": xconv}
    if recurrent is not None:
        inputs["a"] = recurrent
    if state is not None:
        inputs["c"] = state
    return builder.record(CONV_LSTM_GATES, spec, shape, inputs, what)


def conv_lstm_recurrence(
    builder: Recorder,
    xconv: Value,
    recurrent_kernel: Weight,
    geometry: dict,
    filters: int,
    activation: str = "tanh",
    recurrent_activation: str = "sigmoid",
    go_backwards: bool = False,
    return_sequences: bool = False,
    what: str = "conv_lstm",
    convolve: Callable[..., Value] = conv,
) -> tuple:
    """The recurrence of a ConvLSTM over ``xconv``, the input convolution of every step (bias
    included), ``(batch, steps, OH, OW, 4 * filters)`` (or ``(batch, steps, OW, 4 * filters)``):
    per step the recurrent convolution of ``h`` by ``recurrent_kernel`` (``4 * filters x
    KH*KW*filters``; ``geometry`` its window defines on the ``(OH, OW)`` state: ``'same'``, stride
    1, as Keras's), then the new ``c`` and ``h``. ``go_backwards`` runs the steps from the last.
    ``convolve`` lowers the recurrent convolution (:func:`~.conv.conv`; :func:`~.volume.conv3d`
    for volumes ``(batch, steps, OD, OH, OW, 4 * filters)``, ``geometry`` then its defines).

    Returns:
        ``(output, h, c)``: ``output`` every step's ``h`` in the order the steps run ``(batch, steps,
        ..., filters)`` (``return_sequences``), else the last ``h``; ``h`` and ``c`` the last states.
    """
    steps = xconv.shape[1]
    sample = tuple(xconv.shape[2:-1])
    state_shape = (xconv.shape[0],) + sample + (4 * filters,)
    h = c = recurrent = None
    outputs = []
    for k in range(steps):
        t = steps - 1 - k if go_backwards else k
        label = f"{what} step {k + 1}"
        if h is not None:
            recurrent = convolve(builder, h, recurrent_kernel, geometry, state_shape, what=f"{label} recurrent conv")
        c = conv_lstm_gates(builder, xconv, recurrent, c, filters, t, True, activation, recurrent_activation, label)
        h = conv_lstm_gates(builder, xconv, recurrent, c, filters, t, False, activation, recurrent_activation, label)
        outputs.append(h)
    assert h is not None and c is not None  # a ConvLSTM's input has at least one step
    if not return_sequences:
        return h, h, c
    return _sequence(builder, outputs, what), h, c


def _sequence(builder: Recorder, outputs: list, what: str) -> Value:
    """The steps' outputs ``(batch, ..., filters)`` as one ``(batch, steps, ..., filters)`` value:
    each written into its step's slice by the Concatenate kernel, which reads its input by flat
    index (``INNER`` elements of a sample's step, ``RLEN`` steps): no reshape of each first."""
    first = outputs[0]
    shape = (first.shape[0], len(outputs)) + first.shape[1:]
    inner = math.prod(first.shape[1:])
    out: Value | None = None
    for k, h in enumerate(outputs):
        spec = choose("concat", builder.device).configure(
            {"FIRST": int(k == 0), "INNER": inner, "ALEN": 1, "RLEN": len(outputs), "OFFSET": k}
        )
        inputs = {"a": h} if out is None else {"b": out, "a": h}
        storage = out.storage if out is not None else None
        out = builder.record(CONCAT, spec, shape, inputs, what, storage=storage, overwrites=out is not None)
    assert out is not None
    return out
