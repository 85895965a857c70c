"""Element-wise steps in place: a bias, an activation, a per-feature affine step (a folded
BatchNormalization). Each is computed in the epilogue of the kernel before it where that kernel
can (:meth:`OpKind.absorb`), else by a kernel of its own in the buffer it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ...library.kernel_library import load_library
from ...ops import elementwise_kernel
from ..tensors import Step, Value, Vector
from .base import OpKind, register
from .weighted import WeightedKind

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Planned, Recorder

__all__ = ["BIAS", "ACTIVATION", "AFFINE", "bias_and_activation", "activation", "affine"]


class EpilogueStep(OpKind):
    """A step that a kernel with an epilogue (``kernels/epilogue.clh``) can compute instead."""

    in_place = True

    def fold_into(self, producer: Step, step: Step, device: Device) -> bool:
        """Puts ``step`` into ``producer``'s epilogue where its kernel computes it; returns whether it did."""
        return False


class Bias(EpilogueStep):
    name = "bias"

    def fold_into(self, producer: Step, step: Step, device: Device) -> bool:
        if (
            "bias" not in producer.spec.epilogue
            or producer.bias is not None
            or producer.activation not in (None, "linear")
        ):
            return False
        producer.bias = step.bias
        return True

    def operands(self, plan: Planned, step: Step) -> tuple:
        assert step.bias is not None, f"{step.what}: a bias step without a bias"
        return step.spec, {"r": plan.matrix(step.out)}, {"bias": step.bias.on_device(plan.device)}, step.params


class Affine(EpilogueStep):
    name = "affine"

    def fold_into(self, producer: Step, step: Step, device: Device) -> bool:
        if "affine" not in producer.spec.epilogue:
            return False
        producer.affine = step.affine
        return True

    def operands(self, plan: Planned, step: Step) -> tuple:
        assert step.affine is not None, f"{step.what}: an affine step without its vectors"
        scale, shift = (v.on_device(plan.device) for v in step.affine)
        return step.spec, {"r": plan.matrix(step.out)}, {"scale": scale, "shift": shift}, step.params


class Activation(EpilogueStep):
    name = "activation"

    def fold_into(self, producer: Step, step: Step, device: Device) -> bool:
        if producer.activation not in (None, "linear"):
            return False
        if step.activation == "softmax":  # over each sample's features: the producer's kernel must hold them
            kind = producer.kind
            assert isinstance(kind, WeightedKind), "steps fold only into a weighted kind's (WeightedKind.absorb)"
            spec = kind.softmax_spec(producer, device)
            if spec is None:
                return False
            producer.spec = spec
        elif "activation" not in producer.spec.epilogue or elementwise_kernel(step.activation) is None:
            return False
        producer.activation, producer.params = step.activation, step.params
        return True

    def operands(self, plan: Planned, step: Step) -> tuple:
        return step.spec, {"r": plan.matrix(step.out)}, {}, step.params

    def fused(self, step: Step) -> list:
        return []


BIAS, AFFINE, ACTIVATION = register(Bias()), register(Affine()), register(Activation())


# ---------------------------------------------------------------- lowering
def bias_and_activation(
    builder: Recorder, out: Value, bias: Vector | None, function: str | None, params: dict | None, what: str
) -> Value:
    """``out`` with a bias step (in place) and an activation step (``function``) after it, where given (what a
    kernel that fuses no epilogue leaves to steps of their own)."""
    if bias is not None:
        out = builder.record(
            BIAS, choose("bias", builder.device), out.shape, {"b": out}, what, storage=out.storage, bias=bias
        )
    if function not in (None, "linear"):
        out = activation(builder, out, function, params, what)
    return out


def activation(builder: Recorder, x: Value, name: str, params: dict | None = None, what: str = "activation") -> Value:
    """Activation ``name`` applied to ``x`` (in place where ``x`` is read by nothing else)."""
    if name in (None, "linear"):
        return x
    spec = load_library().activation_spec(name, what)
    spec.param_values(params)  # names the parameter a kernel does not take, now
    return builder.record(
        ACTIVATION, spec, x.shape, {"b": x}, what, storage=x.storage, activation=name, params=dict(params or {})
    )


def affine(builder: Recorder, x: Value, scale: Vector, shift: Vector, what: str = "affine") -> Value:
    """``x * scale + shift`` per feature (last axis)."""
    return builder.record(
        AFFINE, choose("affine", builder.device), x.shape, {"b": x}, what, storage=x.storage, affine=(scale, shift)
    )
