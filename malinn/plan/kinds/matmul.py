"""The matmul: ``activation(W x X + bias)`` of a Dense layer (and of a convolution lowered to a
GEMM), one launch with its epilogue; a small Dense head after it may be computed in the same kernel
(:mod:`malinn.plan.passes.heads`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose, explicit_choice, holding_columns
from ...choice.matrix import DeviceMatrix
from ...errors import BackendError
from ...library.kernel_library import KernelSpec, MatrixRestriction, load_library
from ...library.layout import round_up
from ..tensor import format_shape
from ..tensors import Step, Value, Vector, Weight
from .base import register
from .elementwise import bias_and_activation
from .weighted import WeightedKind, step_weight

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Planned, Recorder

__all__ = ["MATMUL", "matmul"]


class MatMul(WeightedKind):
    name = "matmul"
    couples_columns = True

    def wanted(self, step: Step, slot: str) -> tuple:
        spec = step.spec
        a, b, r = spec.matrices["a"], spec.matrices["b"], spec.matrices["r"]
        cols = math.lcm(b.col_multiple, r.col_multiple, spec.scale[1])
        if slot == "b":
            return b.layout, math.lcm(b.row_multiple, a.col_multiple), cols
        return r.layout, math.lcm(r.row_multiple, a.row_multiple, spec.scale[0]), cols

    def softmax_spec(self, step: Step, device: Device) -> KernelSpec | None:
        """The step's kernel in a configuration whose work-groups hold each sample's features, or
        else (where the kernel was not chosen with ``use``) the library's ``matmul_softmax`` kernel
        that reads and writes the same layouts; None where neither can."""
        spec = holding_columns(step.spec, self.shape(step), device)
        if spec is not None or step.explicit:
            return spec
        library = load_library()
        if "matmul_softmax" not in library.defaults:
            return None
        for candidate in library.default_specs("matmul_softmax", device.kind, device.backend):
            if step.spec.precision not in candidate.precisions:
                continue
            candidate = candidate.in_precision(step.spec.precision)
            if all(candidate.matrices[x].layout == step.spec.matrices[x].layout for x in "br"):
                spec = holding_columns(candidate, self.shape(step), device)
                if spec is not None:
                    return spec
        return None

    @staticmethod
    def shape(step: Step) -> tuple:
        """``(m, k, n)``: the weight's rows and columns, the samples (columns of ``b``)."""
        return step_weight(step).shape + (step.inputs["b"].cols,)

    @staticmethod
    def common_rows(step: Step) -> int:
        """The rows of the right operand its kernel reads (K padded as the kernel asks).

        A row-major buffer's first rows are a matrix of their own, so a result padded to more rows
        by its producer (a small-batch kernel writes whole blocks of rows) is read only to what this
        kernel needs: the weights need no more columns than that either."""
        x = step.inputs["b"]
        a, b = step.spec.matrices["a"], step.spec.matrices["b"]
        if str(x.storage.layout) != "R":
            return x.storage.padded_size[0]
        return min(x.storage.padded_size[0], round_up(x.rows, math.lcm(b.row_multiple, a.col_multiple)))

    def weight_padding(self, step: Step) -> tuple:
        """Its result's padded rows (or, for a kernel that reads A's logical rows only, the units
        rounded up to A's alignment) by the common K (the right operand's padded rows)."""
        a = step.spec.matrices["a"]
        rows = (
            round_up(step_weight(step).shape[0], a.row_multiple) if a.logical_rows else step.out.storage.padded_size[0]
        )
        return (rows, self.common_rows(step))

    def head_padding(self, step: Step) -> tuple:
        """The head's weights padded as its kernel reads them: its units by the first layer's
        padded rows (the head's inputs)."""
        assert step.head is not None, f"{step.what}: computes no head"
        return (step.head.weight.shape[0], self.weight_padding(step)[0])

    def weights(self, step: Step) -> list:
        found = [(step_weight(step), self.weight_padding(step))]
        if step.head is not None:
            found.append((step.head.weight, self.head_padding(step)))
        return found

    def scratch_values(self, step: Step) -> dict:
        return {"H": self.weight_padding(step)[0]}  # a kernel that tiles A's rows (a head's)

    def shared_padding(self, step: Step, need: tuple, device: Device) -> tuple | None:
        """A padding of the weight that the device's large-batch kernel can read too, where it reads
        the same layout: a model used at batch 1 and at large batches keeps one copy."""
        m, k = step_weight(step).shape
        restriction = step.spec.matrices["a"]
        big = choose("matmul", device, (m, k, 4096), precision=step.spec.precision)
        other = big.matrices["a"]
        if other.any_layout or restriction.any_layout or other.layout != restriction.layout:
            return None
        theirs = big.padded_shapes(m, k, 4096)["a"]
        return (
            round_up(max(need[0], theirs[0]), math.lcm(restriction.row_multiple, other.row_multiple)),
            round_up(max(need[1], theirs[1]), math.lcm(restriction.col_multiple, other.col_multiple)),
        )

    def operands(self, plan: Planned, step: Step) -> tuple:
        device, spec = plan.device, step.spec
        matrices = {"b": plan.matrix(step.inputs["b"], self.common_rows(step)), "r": plan.matrix(step.out)}
        need = self.weight_padding(step)
        matrices["a"] = step_weight(step).on_device(
            device, spec.matrices["a"], need, self.shared_padding(step, need, device), spec.precision
        )
        spec = self.epilogue(step, device)
        vectors = self.epilogue_vectors(step, device)
        if step.head is not None:
            spec = self._head(step, spec, matrices["a"], vectors, device)
        return spec, matrices, vectors, step.params

    def _head(self, step: Step, spec: KernelSpec, first: DeviceMatrix, vectors: dict, device: Device) -> KernelSpec:
        """Uploads the head of a step that computes one (its weights as the first layer's, units
        by the padded rows of the first layer's copy ``first``; its bias) into ``vectors`` and
        returns ``spec`` with the paddings the kernel indexes them by."""
        head = step.head
        assert head is not None, f"{step.what}: computes no head"
        # the kernel reads the head's inputs up to the first layer's copy's padded rows (a copy shared
        # with another kernel may be padded beyond this plan's least padding)
        assert first.padded is not None, "a weight copy without its padding"
        need = (head.weight.shape[0], first.padded[0])
        restriction: MatrixRestriction = dataclasses.replace(step.spec.matrices["a"], row_align=1)
        matrix = head.weight.on_device(device, restriction, need, precision=spec.precision)
        assert matrix.padded is not None, "a weight copy without its padding"
        vectors["head"] = matrix.buffer
        if head.bias is not None:
            vectors["head_bias"] = head.bias.on_device(device)
        return spec.configure(
            {"HEAD_STRIDE": matrix.padded[0], "HEAD_COLS": matrix.padded[1], "HEAD_INPUTS": step_weight(step).shape[0]}
        )

    def fused(self, step: Step) -> list:
        found = super().fused(step)
        if step.head is not None:
            activation = step.head.activation
            found.append("head" if activation in (None, "linear") else f"head ({activation})")
        return found


MATMUL = register(MatMul())


def matmul(
    builder: Recorder,
    x: Value,
    weight: Weight,
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "matmul",
) -> Value:
    """``activation(W x X + bias)``: ``weight`` is ``units x x.rows``; the result has ``x``'s shape
    with ``units`` in place of the last axis."""
    device = builder.device
    m, k = weight.shape
    if k != x.rows:
        raise ValueError(
            f"{what}: the weights expect {k} input features, but the input has shape {format_shape(x.shape)}"
        )
    spec = choose("matmul", device, (m, k, x.cols), precision=builder.precision)
    image = spec.matrices["a"]
    if image.image and not spec.accepts(m, k, x.cols, device=device):
        rows, cols = round_up(m, image.row_multiple), round_up(k, image.col_multiple)
        raise BackendError(
            f"{what}: its {m}x{k} weights read as a texture of {rows // 4} x {cols} texels "
            f"(kernel {spec.codename}) exceed {device.name}'s largest texture, "
            f"{device.image2d_max_size[0]} x {device.image2d_max_size[1]}"
        )
    out = builder.record(
        MATMUL,
        spec,
        x.shape[:-1] + (m,),
        {"b": x},
        what,
        weight=weight,
        explicit=explicit_choice("matmul", device) is not None,
    )
    return bias_and_activation(builder, out, bias, activation, params, what)
