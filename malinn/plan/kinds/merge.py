"""Steps that combine tensors: Keras's element-wise merges (one in-place step per further input,
shapes broadcast as Keras does), Concatenate (each input written into its slice of one buffer) and
Dot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ...library.kernel_library import KernelSpec, load_library
from ...ops import elementwise_kernel
from ..tensor import format_shape
from ..tensors import Step, Value, broadcast_defines, broadcast_shape
from .base import OpKind, register
from .elementwise import ACTIVATION

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Planned, Recorder

__all__ = ["MERGE", "CONCAT", "DOT", "merge", "concat", "batch_dot"]

#: Keras merge -> the merge kernel's OP for each further input
_MERGE_OPS = {
    "add": "op_add",
    "subtract": "op_sub",
    "multiply": "op_mul",
    "average": "op_add",
    "maximum": "op_max",
    "minimum": "op_min",
    "divide": "op_div",
}
#: the merge kernel's OP with its operands exchanged
_SWAPPED = {
    "op_add": "op_add",
    "op_mul": "op_mul",
    "op_max": "op_max",
    "op_min": "op_min",
    "op_sub": "op_rsub",
    "op_rsub": "op_sub",
    "op_div": "op_rdiv",
    "op_rdiv": "op_div",
}


class Merge(OpKind):
    """One element-wise merge of operand ``a`` into the running result ``b`` (in place), or, for
    the first input of a result no input's shape has, ``a`` broadcast into a new one."""

    name = "merge"
    shows_activation = True
    shape_generic = True

    def absorb(self, step: Step, after: Step, device: Device) -> bool:
        """An element-wise activation after the merge runs in the merge's kernel."""
        if (
            after.kind is not ACTIVATION
            or step.explicit
            or step.spec.config.get("ACTIVATION") != "act_linear"
            or elementwise_kernel(after.activation) is None
        ):
            return False
        step.spec = step.spec.configure({"ACTIVATION": f"act_{after.activation}"})
        step.activation, step.params = after.activation, after.params
        return True

    def swapped(self, step: Step) -> KernelSpec | None:
        op = step.spec.config.get("OP")
        if "a" not in step.inputs or op not in _SWAPPED:
            return None
        return step.spec.configure({"OP": _SWAPPED[op]})

    def operands(self, plan: Planned, step: Step) -> tuple:
        matrices = {"r": plan.matrix(step.out), "a": plan.matrix(step.inputs["a"])}
        params = step.params
        if step.activation not in (None, "linear"):  # a fused activation's p0..p3
            values = load_library().activation_spec(step.activation, step.what).param_values(step.params)
            params = {f"p{i}": v for i, v in enumerate(values)}
        return step.spec, matrices, {}, params

    def fused(self, step: Step) -> list:
        return [step.activation] if step.activation not in (None, "linear") else []


class Concat(OpKind):
    """Operand ``a`` written into its slice of the result (in place over the earlier slices)."""

    name = "concat"
    shape_generic = True

    def operands(self, plan: Planned, step: Step) -> tuple:
        return step.spec, {"r": plan.matrix(step.out), "a": plan.matrix(step.inputs["a"])}, {}, step.params


class Dot(OpKind):
    name = "dot"
    shape_generic = True


MERGE, CONCAT, DOT = register(Merge()), register(Concat()), register(Dot())


def merge(builder: Recorder, xs: Sequence[Value], op: str, what: str = "merge") -> Value:
    """Keras's element-wise merge of ``xs`` (two or more values): ``op`` is ``add``, ``subtract``
    (two inputs), ``multiply``, ``divide`` (two inputs), ``average``, ``maximum`` or ``minimum``.

    Shapes broadcast as Keras does (:func:`broadcast_shape`). The result is computed in the buffer of
    the first input of the result's shape (a copy of it where another step reads it later), one
    in-place step per further input.
    """
    xs = list(xs)
    pair = op in ("subtract", "divide")  # of exactly two inputs, in order
    if len(xs) < 2 or (pair and len(xs) != 2):
        raise ValueError(f"{what}: {op} takes {'exactly 2' if pair else 'at least 2'} inputs, got {len(xs)}")
    shape = (builder.batch,) + broadcast_shape([x.shape for x in xs], what)[1:]
    # the running result lives in the buffer of an input of the result's shape, preferably one a
    # kernel wrote (in the layout the next kernels read) rather than a model input (Keras's order)
    full = sorted((i for i, x in enumerate(xs) if x.shape == shape), key=lambda i: xs[i] in builder.inputs)
    code = _MERGE_OPS[op]
    if pair and full and full[0] == 1:
        order, codes = [1, 0], [_SWAPPED[code]]
    else:
        first = full[0] if full else 0
        order = [first] + [i for i in range(len(xs)) if i != first]
        codes = [code] * (len(xs) - 1)
    running = xs[order[0]]
    if running.shape != shape:  # no input has the result's shape: broadcast the first one into it
        running = _merge_step(builder, None, running, "op_copy", shape, 1, what)
    for step, (i, code) in enumerate(zip(order[1:], codes)):
        divisor = len(xs) if op == "average" and step == len(codes) - 1 else 1
        running = _merge_step(builder, running, xs[i], code, shape, divisor, what)
    return running


def _merge_step(
    builder: Recorder, running: Value | None, x: Value, code: str, shape: tuple, divisor: int, what: str
) -> Value:
    defines = {"OP": code, "DIVISOR": f"{divisor}.0f"}
    if x.shape != shape:
        defines.update(broadcast_defines(x.shape, shape, what))
    spec = choose("merge", builder.device).configure(defines)
    inputs = {"b": running, "a": x} if running is not None else {"a": x}
    return builder.record(
        MERGE, spec, shape, inputs, what, storage=running.storage if running else None, overwrites=running is not None
    )


def concat(builder: Recorder, xs: Sequence[Value], axis: int, what: str = "concatenate") -> Value:
    """Keras's Concatenate of ``xs`` along ``axis`` (of the Keras shape, batch axis 0): one buffer,
    each input written into its slice by one step."""
    xs = list(xs)
    rank = len(xs[0].shape)
    axis = axis + rank if axis < 0 else axis
    if not 1 <= axis < rank or any(len(x.shape) != rank for x in xs):
        raise ValueError(
            f"{what}: cannot concatenate shapes {', '.join(format_shape(x.shape) for x in xs)} along axis {axis}"
        )
    for x in xs:
        if x.shape[:axis] + x.shape[axis + 1 :] != xs[0].shape[:axis] + xs[0].shape[axis + 1 :]:
            raise ValueError(
                f"{what}: shapes {', '.join(format_shape(x.shape) for x in xs)} differ off the "
                f"concatenation axis {axis}"
            )
    total = sum(x.shape[axis] for x in xs)
    shape = xs[0].shape[:axis] + (total,) + xs[0].shape[axis + 1 :]
    inner = math.prod(shape[axis + 1 :])
    out, offset = None, 0
    for i, x in enumerate(xs):
        spec = choose("concat", builder.device).configure(
            {"FIRST": int(i == 0), "INNER": inner, "ALEN": x.shape[axis], "RLEN": total, "OFFSET": offset}
        )
        inputs = {"a": x} if out is None else {"b": out, "a": x}
        out = builder.record(
            CONCAT,
            spec,
            shape,
            inputs,
            what,
            storage=out.storage if out is not None else None,
            overwrites=out is not None,
        )
        offset += x.shape[axis]
    assert out is not None  # xs has at least one value (xs[0] above)
    return out


def batch_dot(
    builder: Recorder,
    x: Value,
    y: Value,
    axes: tuple,
    normalize: bool = False,
    norm_floor: float = 1e-12,
    what: str = "dot",
) -> Value:
    """Keras's Dot: ``batch_dot(x, y, axes)`` of two values of rank 2 or 3 (batch first), optionally
    L2-normalised along ``axes`` (each sum of squares at least ``norm_floor``)."""
    ax, ay = axes
    if (
        not (2 <= len(x.shape) <= 3 and 2 <= len(y.shape) <= 3)
        or x.shape[ax] != y.shape[ay]
        or not (1 <= ax < len(x.shape) and 1 <= ay < len(y.shape))
    ):
        raise ValueError(
            f"{what}: cannot take the dot product of {format_shape(x.shape)} and "
            f"{format_shape(y.shape)} over axes {list(axes)}"
        )

    def strides(shape: tuple, axis: int) -> tuple:  # (per sample, along the kept axis, along the summed axis)
        kept = [d for d in range(1, len(shape)) if d != axis]
        row_major = {d: math.prod(shape[d + 1 :]) for d in range(len(shape))}
        return row_major[0], (row_major[kept[0]] if kept else 0), row_major[axis], (shape[kept[0]] if kept else 1)

    xb, xp, xk, dp = strides(x.shape, ax)
    yb, yq, yk, dq = strides(y.shape, ay)
    shape = (builder.batch,) + tuple(
        d for d in (dp if len(x.shape) == 3 else None, dq if len(y.shape) == 3 else None) if d is not None
    )
    if len(shape) == 1:
        shape += (1,)
    spec = choose("dot", builder.device).configure(
        {
            "DP": dp,
            "DQ": dq,
            "DK": x.shape[ax],
            "AB": xb,
            "AP": xp,
            "AK": xk,
            "BB": yb,
            "BQ": yq,
            "BK": yk,
            "NORMALIZE": int(bool(normalize)),
            "NORM_FLOOR": f"{float(norm_floor):.1e}f",
        }
    )
    return builder.record(DOT, spec, shape, {"a": x, "b": y}, what)
