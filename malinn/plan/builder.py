"""The plan builder: a model lowered to steps, and every choice made once per model, device and batch.

A model is lowered into a plan by its layers (``layer.lower(builder, x)``): each records the
steps it needs on symbolic tensors (:class:`Value`) with the lowering functions of the op kinds
(:mod:`malinn.plan.kinds`: ``matmul(builder, x, weight, ...)``). :meth:`PlanBuilder.compile` then
runs the passes (:mod:`malinn.plan.passes`), each deciding one thing once:

1. fusion: an activation, a per-feature affine step (a BatchNormalization) or a softmax right after
   a matmul becomes that matmul's epilogue where the kernel library says the kernel can fuse it;
2. in-place safety: an in-place step whose input is read again later, or is an output, works on a
   copy;
3. layouts: each tensor is in its producer's layout (the input in Keras's own order); a consumer
   that reads another layout gets a re-layout step;
4. paddings: every buffer is padded to what all its readers and writers ask (a matmul's right
   operand and result share their column padding); a padded input that the device pads itself
   (``Device.pads_on_device``) is uploaded unpadded and copied into its padded buffer by a first
   re-layout step; an output whose features are padded that the device unpads itself
   (``Device.unpads_on_device``) is copied by a re-layout step into an unpadded buffer, the one downloaded;
5. weights: each matrix weight uploaded in the layout and padding its kernel reads (kept by the
   layer, shared by every plan that asks for the same), vectors uploaded once;
6. an activation arena: buffers reused by liveness;
7. launches: every kernel bound to its arguments once.

:meth:`Plan.run` is then one upload per input, the bound launches, one blocking download per
output. A chain is the special case of the DAG of steps over named tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..backends.base import Device
from ..errors import BackendError
from ..library.kernel_library import DEFAULT_PRECISION, KernelSpec
from .kinds.base import OpKind
from .passes.fusion import fuse_epilogues
from .passes.heads import fuse_heads
from .passes.in_place import protect_in_place
from .passes.input_padding import pad_inputs_on_device
from .passes.layouts import download_ready, relayout_inputs, unalias
from .passes.output_padding import unpad_outputs_on_device
from .passes.paddings import resolve_paddings
from .passes.views import concat_slices, view_concat_slices, view_reshapes
from .plan import Plan
from .tensor import matrix_view
from .tensors import C, Step, Storage, Value

__all__ = ["PlanBuilder"]


class PlanBuilder:
    """Records the steps of a model for one device and batch, then compiles them into a :class:`Plan`.

    Layers record steps from their ``lower`` method with the op kinds' lowering functions
    (:mod:`malinn.plan.kinds`), each of which returns the :class:`Value` it produces.

    Args:
        device: the device the plan runs on.
        batch: the samples one run takes (inputs with fewer samples are padded).
        precision: the precision of every matmul's weights (the kernel library's ``precisions``).
    """

    def __init__(self, device: Device, batch: int, precision: str = DEFAULT_PRECISION):
        self.device, self.batch, self.precision = device, int(batch), precision
        self.steps: list[Step] = []
        self.inputs: list[Value] = []
        self.layer = None  # the layer being lowered (its name goes into every step it records)
        self._uses: dict = {}  # id(input value) -> how many layer calls read it
        self.convs: list = []  # the ConvGeometry of each convolution lowered (not 1x1 matmuls)

    # ---------------------------------------------------------------- recording
    def lower(self, layer, x):
        """``layer.lower(self, x)`` with ``layer`` named in every step it records; a layer the
        device's backend has no kernel for raises BackendError naming the layer and the device
        (and what the device lacks, where its backend says: ``Device.limitation``)."""
        self.layer = layer
        try:
            return layer.lower(self, x)
        except BackendError as exc:
            device = self.device
            lacks = getattr(device, "limitation", "")
            why = str(exc).removeprefix(f"layer {layer.name!r}: ")
            raise BackendError(
                f"layer {layer.name!r} ({type(layer).__name__}) cannot run on {device.name} "
                f"({device.backend}{': ' + lacks if lacks else ''}): {why}"
            ) from None

    def input(self, sample_shape: Iterable[int], name: str = "input", uses: int = 1) -> Value:
        """A model input: ``batch`` samples of ``sample_shape``, uploaded in Keras's own order
        (column-major: each sample's values contiguous, the samples as far apart as the readers pad).

        ``uses``: how many layer calls read it (a Reshape of an input read once is a free view)."""
        shape = (self.batch,) + tuple(sample_shape)
        rows, cols = matrix_view(shape)
        value = Value(shape, Storage(rows, cols, C), name=name)
        self.inputs.append(value)
        self._uses[id(value)] = uses
        return value

    def read_once(self, x: Value) -> bool:
        """Whether ``x`` is a model input that one layer call reads and no step has read yet."""
        return x in self.inputs and not x.consumers and self._uses.get(id(x), 1) <= 1

    def record(
        self,
        kind: OpKind,
        spec: KernelSpec,
        out_shape: Sequence[int],
        inputs: dict[str, Value],
        what: str,
        storage: Storage | None = None,
        **fields: Any,
    ) -> Value:
        """Appends a step of ``kind`` running ``spec`` on ``inputs`` (slot -> Value) and returns its
        result, a new Value of ``out_shape`` (in ``storage`` for an in-place step)."""
        rows, cols = matrix_view(out_shape)
        out = Value(out_shape, storage or Storage(rows, cols), name=what)
        step = Step(
            kind, spec, out, dict(inputs), what, layers=[self.layer] if self.layer is not None else [], **fields
        )
        out.producer = step
        for value in inputs.values():
            value.consumers.append(step)
        self.steps.append(step)
        return out

    # ---------------------------------------------------------------- compiling
    def compile(self, outputs: list) -> Plan:
        """Makes every decision (see the module docstring) and returns the runnable :class:`Plan`.

        Args:
            outputs: the values the plan downloads, in order.

        Raises:
            DeviceError: a buffer or weight does not fit the device (the message names the layer).
            BackendError: a step's kernel (an explicit choice) has no source for the device's backend.
        """
        outputs = list(outputs)
        fuse_epilogues(self, outputs)
        fuse_heads(self, outputs)
        protect_in_place(self, outputs)
        aliases = relayout_inputs(self)
        slices = concat_slices(self, outputs)
        resolve_paddings(self)
        unalias(self, aliases)
        outputs = download_ready(self, outputs)
        view_reshapes(self, outputs)
        view_concat_slices(slices)
        copies = pad_inputs_on_device(self)
        outputs, unpadded = unpad_outputs_on_device(self, outputs, copies)
        backend = self.device.backend
        for step in self.steps:  # refused here, as predict would: summary and max_batch say so too
            if step.spec is not None and not step.spec.has_source(backend):
                raise BackendError(
                    f"{step.what}: kernel {step.spec.codename!r} has no {backend} source "
                    f'(kernels/library.json: its "sources" name {", ".join(step.spec.backends())}); '
                    f"choose another kernel (malinn.use)"
                )
        plan = Plan(self.device, self.batch, self.inputs, outputs, self.steps, self.precision)
        plan.convs = list(self.convs)  # the convolution geometries (malinn tune --model times them)
        plan.input_copies = copies  # the inputs padded on the device: their buffers free after the copy
        plan.output_copies = unpadded  # the outputs unpadded on the device: what is downloaded
        return plan
