"""What the kinds whose kernels read a layer's weights share (a matmul, a convolution): the
weights bound in the plan's precision, and bias, activation and affine computed in the kernel's
epilogue (``kernels/epilogue.clh``) where it can."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...library.kernel_library import KernelSpec
from ...ops import with_epilogue
from ..tensors import Step, Weight
from .base import OpKind

if TYPE_CHECKING:
    from ...backends.base import Device

__all__ = ["WeightedKind", "step_weight"]


def step_weight(step: Step) -> Weight:
    """``step.weight``, which every step of a weighted kind has."""
    assert step.weight is not None, f"{step.what}: a step of kind {step.kind.name} without weights"
    return step.weight


class WeightedKind(OpKind):
    """A kind whose steps read ``step.weight`` as operand ``a`` and may fuse an epilogue."""

    weighted = True
    shows_activation = True

    def absorb(self, step: Step, after: Step, device: Device) -> bool:
        fold = getattr(after.kind, "fold_into", None)
        return step.affine is None and fold is not None and fold(step, after, device)

    def softmax_spec(self, step: Step, device: Device) -> KernelSpec | None:
        """``step``'s kernel computing a softmax over each sample's features in its epilogue, or None."""
        return None

    def weight_padding(self, step: Step) -> tuple:
        """The least padded shape of the weight copy ``step``'s kernel reads."""
        raise NotImplementedError

    def weights(self, step: Step) -> list:
        return [(step_weight(step), self.weight_padding(step))]

    def epilogue(self, step: Step, device: Device) -> KernelSpec:
        """The step's kernel configured for what the fusion pass put in its epilogue (the same
        configuring the eager ``ops.matmul`` does), writing its slice of a shared buffer where its
        result is one (``R_VIEW``)."""
        shape = step_weight(step).shape + (step.inputs["b"].cols,)
        spec, fused = with_epilogue(
            step.spec, shape, device, step.bias is not None, step.activation, step.affine is not None
        )
        wanted = (step.bias is not None) + (step.activation not in (None, "linear")) + (step.affine is not None)
        if len(fused) != wanted:
            raise AssertionError(f"{step.what}: {spec.codename} fuses only {fused}")
        if step.out.storage.view is not None:  # R is a slice of a larger buffer (epilogue.clh R_VIEW)
            spec = spec.configure(step.out.storage.view)
        return spec

    def epilogue_vectors(self, step: Step, device: Device) -> dict:
        """The bias and the affine step's scale and shift, on the device, as the epilogue reads them."""
        vectors: dict = {}
        if step.bias is not None:
            vectors["bias"] = step.bias.on_device(device)
        if step.affine is not None:
            vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
        return vectors

    def fused(self, step: Step) -> list:
        found = ["bias"] if step.bias is not None else []
        if step.activation not in (None, "linear"):
            found.append(step.activation)
        if step.affine is not None:
            found.append("affine")
        return found
