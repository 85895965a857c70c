"""What a plan is made of: the weights it uploads (:class:`Weight`, :class:`Vector`), its
symbolic tensors (:class:`Value`, each held by a :class:`Storage`) and the steps between them
(:class:`Step`), with the shape arithmetic the builder and the plan share. The builder
(:mod:`malinn.plan.builder`) records and compiles them; the plan (:mod:`malinn.plan.plan`) allocates
and runs them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..backends.base import Device
from ..choice.matrix import DeviceMatrix
from ..library.kernel_library import KernelSpec, MatrixRestriction, load_library
from ..library.layout import Layout, parse_layout
from ..library.precision import device_bytes
from .tensor import format_shape

__all__ = ["Weight", "Vector", "Storage", "Value", "Head", "Step", "broadcast_shape"]

C = parse_layout("C")
#: the defines a window kernel's geometry sets per layer (left out of summaries: the shapes say them)
GEOMETRY = frozenset(
    "IH IW OH OW KH KW SH SW DH DW PT PL CG MG GROUPS DM CIN OY OX UY UX MAXPOOL ID OD KD SD DD PF OZ UZ".split()
)


# ======================================================================== constants of a plan
class Weight:
    """A constant matrix that a matmul reads as its left operand (a Dense layer's ``W = kernel^T``).

    Device copies are kept in ``copies`` (a dict the owning layer holds and clears when its weights
    change), one per device, layout and padding, so every plan of the model shares them.

    Args:
        what: a description for messages (``"layer 'dense' kernel"``).
        shape: the logical ``(rows, cols)``.
        host: a callable returning the ``rows x cols`` float32 matrix.
        copies: the owner's dict of device copies.
        prepacked: ``(layout, padded, flat, precision)`` of a copy already laid out in a precision
            (read from a model file; ``flat`` as :func:`malinn.library.precision.device_bytes` makes it).
        quantized: a callable returning ``(q, scales)``, the int8 form to upload for
            ``int8-weights`` (a Keras int8-quantized layer's own), or ``None`` to quantize ``host()``.
    """

    def __init__(
        self,
        what: str,
        shape: Iterable[int],
        host: Callable[[], np.ndarray],
        copies: dict,
        prepacked: tuple | None = None,
        quantized: Callable[[], tuple] | None = None,
    ):
        self.what, self.shape, self.host, self.copies, self.prepacked = what, tuple(shape), host, copies, prepacked
        self.quantized = quantized

    def on_device(
        self,
        device: Device,
        restriction: MatrixRestriction,
        need: Sequence[int],
        prefer: Sequence[int] | None = None,
        precision: str = "fp32",
    ) -> DeviceMatrix:
        """The weight on ``device`` as a kernel with ``restriction`` reads it in ``precision``, padded
        at least to ``need``: a copy already there that fits (kernels index A with its own padded
        shape, so a copy padded more serves), else the model file's laid-out copy where it fits,
        else a new upload padded to ``prefer`` (a padding that also fits the device's other
        kernels) or ``need``.
        """
        layout = restriction.layout

        def fits(padded: Sequence[int]) -> bool:
            return (
                padded[0] >= need[0]
                and padded[1] >= need[1]
                and padded[0] % restriction.row_multiple == 0
                and padded[1] % restriction.col_multiple == 0
            )

        for key, matrix in list(self.copies.items()):  # a snapshot: another model sharing the layer may add one
            if len(key) == 4 and key[0] is device and key[1] == str(layout) and key[3] == precision and fits(key[2]):
                return matrix
        if (
            self.prepacked is not None
            and str(self.prepacked[0]) == str(layout)
            and fits(self.prepacked[1])
            and self.prepacked[3] == precision
        ):
            padded = tuple(self.prepacked[1])
            flat = self.prepacked[2]
        else:
            shared = prefer is not None and fits(prefer) and self.nbytes(prefer, precision) <= device.max_allocation
            padded = tuple(prefer) if shared and prefer is not None else tuple(need)
            quantized = self.quantized() if self.quantized is not None else None
            flat = device_bytes(self.host(), precision, layout, padded, quantized, self.what)
        matrix = DeviceMatrix.upload_weights(device, flat, self.shape, layout, padded, precision, self.what)
        matrix.host = None  # the layer keeps the weights; the copy need not
        # keyed by the device itself, never its identity: two GPUs of one model (two H200s) share
        # the identity, but a buffer of one's context is no argument of the other's kernels
        self.copies[(device, str(layout), padded, precision)] = matrix
        return matrix

    def nbytes(self, padded: Sequence[int], precision: str = "fp32") -> int:
        """Bytes of a device copy padded to ``padded`` in ``precision``."""
        return load_library().precision(precision).weights_nbytes(padded[0], padded[1], self.shape[0])


class Vector:
    """A constant per-feature vector (bias, scale, shift), uploaded once per device.

    Args:
        what: a description for messages; values: the float32 values; copies: the owner's dict.
    """

    def __init__(self, what: str, values: Any, copies: dict):
        self.what, self.values, self.copies = what, np.ascontiguousarray(values, np.float32).reshape(-1), copies

    def on_device(self, device: Device) -> Any:
        """The values' buffer on ``device`` (uploaded on first use)."""
        key = (device, self.what)  # the device itself: identical GPUs share an identity, not buffers
        buffer = self.copies.get(key)
        if buffer is None:
            buffer = device.alloc(self.values.nbytes, self.what)
            with device.lock:
                device.upload(buffer, self.values, blocking=True, what=self.what)
            self.copies[key] = buffer
        return buffer


# ======================================================================== symbolic tensors and steps
class Storage:
    """One buffer's worth of a tensor: its layout and padding once decided (in-place steps share it).

    A view (``base`` set) has no buffer of its own: it is another matrix view of ``base``'s memory
    (a Reshape whose flat order the layout keeps), or, with ``view`` set, a slice that a matmul
    writes through its epilogue's ``R_AT`` (kernels/epilogue.clh: ``view`` holds the ``R_VIEW``,
    ``R_OFFSET``, ``R_LD``, ``R_ROWS``, ``R_SPARE`` defines), e.g. one input of a Concatenate.
    """

    def __init__(self, rows: int, cols: int, layout: Layout | None = None):
        self.rows, self.cols, self.layout = rows, cols, layout
        self.row_mult = self.col_mult = 1
        self.padded: tuple[int, int] | None = None  # decided by the paddings pass (padded_size)
        self.group = self  # union-find: storages whose column padding must be equal
        self.base: Storage | None = None  # for a view: the storage whose buffer it shares (never itself a view)
        self.view: dict | None = None  # for a slice written by a matmul: its R_* defines (epilogue.clh)
        self.min_elements = 0
        self.first = self.last = 0
        self.buffer: Any = None

    def root(self) -> "Storage":
        node = self
        while node.group is not node:
            node.group = node.group.group
            node = node.group
        return node

    def memory(self) -> "Storage":
        """The storage whose buffer holds this one's values (itself, or a view's base)."""
        return self.base if self.base is not None else self

    @property
    def padded_size(self) -> tuple[int, int]:
        """``padded``, which the paddings pass (:mod:`malinn.plan.passes.paddings`) decides before
        anything reads it."""
        assert self.padded is not None, "a storage's padding is read before the paddings pass decided it"
        return self.padded

    def elements(self) -> int:
        rows, cols = self.padded_size
        return max(rows * cols, self.min_elements)


class Value:
    """A tensor of the plan: Keras's shape (with the plan's batch) and the storage that holds it."""

    def __init__(self, shape: Iterable[int], storage: Storage, producer: Step | None = None, name: str = ""):
        self.shape = tuple(int(d) for d in shape)
        self.storage, self.producer, self.name = storage, producer, name
        self.consumers: list[Step] = []

    @property
    def rows(self) -> int:
        return self.shape[-1]

    @property
    def cols(self) -> int:
        return math.prod(self.shape[:-1])

    def __repr__(self) -> str:
        return f"Value({self.name or '?'} {self.shape})"


@dataclasses.dataclass(frozen=True)
class Head:
    """A small Dense layer computed in the kernel of the matmul before it (``Step.head``)."""

    weight: Weight
    bias: Vector | None
    activation: str | None


@dataclasses.dataclass(eq=False)
class Step:
    # the registered op kind (a malinn.plan.kinds.base.OpKind, which imports this module, so not
    # named here): what the step computes and needs
    kind: Any
    spec: KernelSpec
    out: Value
    inputs: dict[str, Value]  # slot ("a" or "b") -> Value
    what: str
    weight: Weight | None = None
    bias: Vector | None = None
    activation: str = "linear"
    params: dict = dataclasses.field(default_factory=dict)
    affine: tuple | None = None  # (scale, shift) Vectors applied after the activation
    layers: list = dataclasses.field(default_factory=list)  # the layers this step runs (for summary)
    explicit: bool = False  # the kernel was chosen with use(): never swapped by fusion
    launch: object = None
    vectors: dict = dataclasses.field(default_factory=dict)  # kernel buffer name -> Vector (layer steps)
    overwrites: bool = False  # a layer step that rewrites its input "b" in place
    view: bool = False  # the plan made it free: its result is a view (nothing launched)
    head: Head | None = None  # a small Dense layer after this matmul, computed in its kernel;
    # ``out`` is then the head's output

    @property
    def in_place(self) -> bool:
        """Whether the step writes into its input ``b``'s buffer (a kind that always does: bias,
        activation, affine; a layer step that ``overwrites`` it: a broadcast or normalize, a merge's
        running result, a Concatenate's buffer that earlier inputs wrote their slices into)."""
        return self.kind.in_place or self.overwrites


#: sample axes the merge kernel broadcasts over (D1..D8)
_MAX_BROADCAST_RANK = 8


def broadcast_shape(shapes: Sequence[Sequence[int]], what: str = "merge") -> tuple:
    """The shape Keras's merge layers give inputs of ``shapes`` (batch axis first): a sample of
    lower rank gains axes of 1 after the batch axis, then axes of 1 stretch (NumPy broadcasting).

    Raises:
        ValueError: two sizes of one axis differ and neither is 1.
    """
    rank = max(len(s) for s in shapes)
    padded = [(s[0],) + (1,) * (rank - len(s)) + tuple(s[1:]) for s in shapes]
    out = [padded[0][0]]
    for axis in range(1, rank):
        sizes = {p[axis] for p in padded} - {1}
        if len(sizes) > 1:
            raise ValueError(
                f"{what}: inputs of shapes {', '.join(format_shape(s) for s in shapes)} do not "
                f"broadcast (axis {axis} has sizes {sorted(sizes)})"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_defines(shape: Sequence[int], out: Sequence[int], what: str) -> dict:
    """The merge kernel's defines reading a tensor of ``shape`` broadcast to ``out`` (batch first)."""
    rank = len(out) - 1
    if rank > _MAX_BROADCAST_RANK:
        raise ValueError(
            f"{what}: malinn broadcasts samples of up to {_MAX_BROADCAST_RANK} axes, not {format_shape(out)}"
        )
    sample = (1,) * (rank - (len(shape) - 1)) + tuple(shape[1:])
    defines = {"BROADCAST": 1, "S0": math.prod(sample)}
    for axis in range(1, rank + 1):
        size = sample[axis - 1]
        defines[f"D{axis}"] = out[axis]
        defines[f"S{axis}"] = 0 if size == 1 else math.prod(sample[axis:])
    return defines


def storages_of(values: Iterable[Value], steps: Sequence[Step]) -> list[Storage]:
    """Every storage of ``values`` and of the steps' inputs and results, each once, in first-seen order."""
    seen, result = set(), []
    for value in list(values) + [s.out for s in steps] + [x for s in steps for x in s.inputs.values()]:
        if id(value.storage) not in seen:
            seen.add(id(value.storage))
            result.append(value.storage)
    return result


def may_alias(storage: Storage, layout: Layout, x: Value, col_mult: int) -> bool:
    """Whether a plain R or C buffer of one logical column may be read as the other layout (it may
    while it is padded to one column; :func:`malinn.plan.passes.layouts.unalias` checks that once padded)."""
    return {str(storage.layout), str(layout)} == {"R", "C"} and x.cols == 1 and col_mult == 1
