"""Convolutions: a layer's convolution lowered, once per plan, to a 1x1 matmul, an ``im2col``
patch matrix and a matmul, or a ``conv`` kernel (kn2row, kn2col or implicit GEMM: the input read as
it is); a depthwise convolution by its own kernel. Bias and activation go into the kernel's
epilogue."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.conv_choice import choose_algorithm
from ...choice.conv_geometry import ConvGeometry
from ...choice.kernel_choice import check_precision, choose, explicit_choice
from ...library.kernel_library import KernelSpec, load_library
from ...library.layout import round_up
from ..tensors import Step, Value, Vector, Weight
from .base import OpKind, register
from .elementwise import bias_and_activation
from .matmul import matmul
from .weighted import WeightedKind, step_weight
from .window import IM2COL

if TYPE_CHECKING:
    from ..recorder import Planned, Recorder

__all__ = ["CONV", "conv", "depthwise", "conv_step", "in_weight_precision"]


class Conv(WeightedKind):
    name = "conv"

    def wanted(self, step: Step, slot: str) -> tuple:
        restriction = step.spec.matrices[slot]
        layout = None if restriction.any_layout else restriction.layout
        return layout, restriction.row_multiple, restriction.col_multiple

    def weight_padding(self, step: Step) -> tuple:
        """A convolution reads A's rows up to its result's padded rows."""
        a = step.spec.matrices["a"]
        return (
            round_up(step.out.storage.padded_size[0], a.row_multiple),
            round_up(step_weight(step).shape[1], a.col_multiple),
        )

    def operands(self, plan: Planned, step: Step) -> tuple:
        device, spec = plan.device, step.spec
        matrices = {slot: plan.matrix(x) for slot, x in step.inputs.items()}
        matrices["r"] = plan.matrix(step.out)
        matrices["a"] = step_weight(step).on_device(
            device, spec.matrices["a"], self.weight_padding(step), precision=spec.precision
        )
        return self.epilogue(step, device), matrices, self.epilogue_vectors(step, device), step.params


CONV = register(Conv())


def conv(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "conv",
    algorithm: KernelSpec | None = None,
) -> Value:
    """A convolution of ``x`` (Keras ``(batch, H, W, C)`` or ``(batch, L, C)``) by ``weight``
    (``COUT x KH*KW*CG``, column ``(ky*KW + kx)*CG + c``), then bias and activation.

    ``geometry`` holds the window defines (:func:`malinn.layers.windows.window_defines`) and
    ``GROUPS``. The algorithm is chosen here, once per layer and plan: a 1x1 convolution with
    stride 1 is a plain matmul on the input's matrix view (no transform); otherwise ``algorithm``
    where given (the tuner's candidate), else :func:`malinn.choice.conv_choice.choose_algorithm` (an
    explicit choice, the tuned winner for the layer's geometry, the library's ``conv_algorithms``
    rules): an ``im2col`` kernel builds the patch matrix, which the device's matmul multiplies; a
    ``conv`` kernel (kn2row or kn2col accumulating GEMMs) reads the input as it is. Each layer's
    geometry is kept in ``builder.convs`` (what ``malinn tune --model`` times).
    """
    g = dict(geometry)
    groups = int(g.pop("GROUPS", 1))
    cin, cout = x.rows, weight.shape[0]
    out_shape = (builder.batch,) + tuple(out_shape[1:])
    pointwise = (g["KH"], g["KW"], g["SH"], g["SW"], g["PT"], g["PL"], groups) == (1, 1, 1, 1, 0, 0, 1)
    if pointwise and (g["IH"], g["IW"]) == (g["OH"], g["OW"]):
        return matmul(builder, x, weight, bias, activation, params, what)
    shape = ConvGeometry.of(builder.batch, cin, cout, groups, g)
    builder.convs.append(shape)
    spec = algorithm if algorithm is not None else choose_algorithm(builder.device, shape)[0]
    if spec.op == "im2col":
        patches = builder.record(
            IM2COL, spec.configure({**g, "CIN": cin}), out_shape[:-1] + (weight.shape[1],), {"a": x}, what
        )
        return matmul(builder, patches, weight, bias, activation, params, what)
    spec = in_weight_precision(builder, spec.configure(shape.defines()))
    return conv_step(builder, spec, x, weight, out_shape, bias, activation, params, what)


def depthwise(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "depthwise",
) -> Value:
    """A depthwise convolution of ``x`` by ``weight`` (``C*DM x KH*KW``, row ``c*DM + j``), then
    bias and activation; ``geometry`` as for :func:`conv`, with ``DM`` the depth multiplier."""
    device = builder.device
    out_shape = (builder.batch,) + tuple(out_shape[1:])
    shape = (weight.shape[0], weight.shape[1], math.prod(out_shape[:-1]))
    if explicit_choice("depthwise", device) is not None:
        spec = choose("depthwise", device)
    else:  # the first default whose preconditions hold and that the device can launch; else the general one
        specs = load_library().default_specs("depthwise", device.kind, device.backend)
        spec = next((s for s in specs if s.accepts(*shape, device=device)), specs[-1])
    spec = in_weight_precision(builder, spec.configure(geometry))
    return conv_step(builder, spec, x, weight, out_shape, bias, activation, params, what)


def in_weight_precision(builder: Recorder, spec: KernelSpec) -> KernelSpec:
    """A convolution kernel reading its weights in the plan's precision: ``fp16`` (half sums) as
    ``fp16-storage`` (half weights, float sums) where the kernel has no half arithmetic, and fp32
    where it reads no reduced precision (the summary names each step's precision)."""
    check_precision(builder.precision, builder.device)  # as a matmul's: fp16 needs cl_khr_fp16
    wanted = (builder.precision, "fp16-storage") if builder.precision == "fp16" else (builder.precision,)
    return next((spec.in_precision(p) for p in wanted if p in spec.precisions), spec)


def conv_step(
    builder: Recorder,
    spec: KernelSpec,
    x: Value,
    weight: Weight,
    out_shape: Sequence[int],
    bias: Vector | None,
    activation: str,
    params: dict | None,
    what: str,
    kind: OpKind = CONV,
) -> Value:
    """A step of ``kind`` (a convolution's) running ``spec`` on ``x`` with ``weight``, then the bias
    and activation steps that its epilogue takes in where it can (the fusion pass)."""
    out = builder.record(kind, spec, out_shape, {"b": x}, what, weight=weight)
    return bias_and_activation(builder, out, bias, activation, params, what)
