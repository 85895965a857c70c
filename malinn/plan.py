"""The compiled plan: every choice made once per model, device and batch; ``predict`` only launches.

A model is lowered into a plan by its layers (``layer.lower(builder, x)``): each records the
steps it needs on symbolic tensors (:class:`Value`). :meth:`PlanBuilder.compile` then decides,
once:

1. fusion: an activation, a per-feature affine step (a BatchNormalization) or a softmax right after
   a matmul becomes that matmul's epilogue where the kernel library says the kernel can fuse it;
2. in-place safety: an in-place step whose input is read again later, or is an output, works on a
   copy;
3. layouts: each tensor is in its producer's layout (the input in Keras's own order); a consumer
   that reads another layout gets a re-layout step;
4. paddings: every buffer is padded to what all its readers and writers ask (a matmul's right
   operand and result share their column padding);
5. weights: each matrix weight uploaded in the layout and padding its kernel reads (kept by the
   layer, shared by every plan that asks for the same), vectors uploaded once;
6. an activation arena: buffers reused by liveness;
7. launches: every kernel bound to its arguments once.

:meth:`Plan.run` is then one upload per input, the bound launches, one blocking download per
output. A chain is the special case of the DAG of steps over named tensors.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .backends.base import Device
from .kernel_call import bind
from .kernel_choice import choose, explicit_choice, holding_columns
from .ops import elementwise_kernel, with_epilogue
from .kernel_library import DEFAULT_PRECISION, KernelSpec, load_library
from .layout import Layout, parse_layout
from .matrix import DeviceMatrix
from .precision import device_bytes
from .tensor import format_shape, keras_order, matrix_view

__all__ = ["Weight", "Vector", "Value", "PlanBuilder", "Plan", "broadcast_shape"]

C = parse_layout("C")
#: the defines a window kernel's geometry sets per layer (left out of summaries: the shapes say them)
_GEOMETRY = frozenset("IH IW OH OW KH KW SH SW DH DW PT PL CG MG GROUPS DM CIN OY OX UY UX MAXPOOL".split())


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
            (read from a model file; ``flat`` as :func:`malinn.precision.device_bytes` makes it).
        quantized: a callable returning ``(q, scales)``, the int8 form to upload for
            ``int8-weights`` (a Keras int8-quantized layer's own), or ``None`` to quantize ``host()``.
    """

    def __init__(self, what: str, shape, host, copies: dict, prepacked=None, quantized=None):
        self.what, self.shape, self.host, self.copies, self.prepacked = what, tuple(shape), host, copies, prepacked
        self.quantized = quantized

    def on_device(self, device: Device, restriction, need, prefer=None, precision: str = "fp32") -> DeviceMatrix:
        """The weight on ``device`` as a kernel with ``restriction`` reads it in ``precision``, padded
        at least to ``need``: a copy already there that fits (kernels index A with its own padded
        shape, so a copy padded more serves), else the model file's laid-out copy where it fits,
        else a new upload padded to ``prefer`` (a padding that also fits the device's other
        kernels) or ``need``.
        """
        layout = restriction.layout

        def fits(padded) -> bool:
            return (padded[0] >= need[0] and padded[1] >= need[1] and padded[0] % restriction.row_multiple == 0
                    and padded[1] % restriction.col_multiple == 0)

        for key, matrix in self.copies.items():
            if (len(key) == 4 and key[0] == device.identity and key[1] == str(layout) and key[3] == precision
                    and fits(key[2])):
                return matrix
        if (self.prepacked is not None and str(self.prepacked[0]) == str(layout) and fits(self.prepacked[1])
                and self.prepacked[3] == precision):
            padded = tuple(self.prepacked[1])
            flat = self.prepacked[2]
        else:
            shared = (prefer is not None and fits(prefer)
                      and self.nbytes(prefer, precision) <= device.max_allocation)
            padded = tuple(prefer) if shared else tuple(need)
            quantized = self.quantized() if self.quantized is not None else None
            flat = device_bytes(self.host(), precision, layout, padded, quantized)
        matrix = DeviceMatrix.upload_weights(device, flat, self.shape, layout, padded, precision, self.what)
        matrix.host = None   # the layer keeps the weights; the copy need not
        self.copies[(device.identity, str(layout), padded, precision)] = matrix
        return matrix

    def nbytes(self, padded, precision: str = "fp32") -> int:
        """Bytes of a device copy padded to ``padded`` in ``precision``."""
        return load_library().precision(precision).weights_nbytes(padded[0], padded[1], self.shape[0])


class Vector:
    """A constant per-feature vector (bias, scale, shift), uploaded once per device.

    Args:
        what: a description for messages; values: the float32 values; copies: the owner's dict.
    """

    def __init__(self, what: str, values, copies: dict):
        self.what, self.values, self.copies = what, np.ascontiguousarray(values, np.float32).reshape(-1), copies

    def on_device(self, device: Device):
        key = (device.identity, self.what)
        buffer = self.copies.get(key)
        if buffer is None:
            buffer = device.alloc(self.values.nbytes, self.what)
            with device.lock:
                device.upload(buffer, self.values, blocking=True, what=self.what)
            self.copies[key] = buffer
        return buffer


# ======================================================================== symbolic tensors and steps
class _Storage:
    """One buffer's worth of a tensor: its layout and padding once decided (in-place steps share it)."""

    def __init__(self, rows: int, cols: int, layout: Layout | None = None):
        self.rows, self.cols, self.layout = rows, cols, layout
        self.row_mult = self.col_mult = 1
        self.padded = None
        self.group = self          # union-find: storages whose column padding must be equal
        self.base = None           # for a view: the storage whose buffer it shares
        self.min_elements = 0
        self.first = self.last = 0
        self.buffer = None

    def root(self) -> "_Storage":
        node = self
        while node.group is not node:
            node.group = node.group.group
            node = node.group
        return node

    def elements(self) -> int:
        return max(self.padded[0] * self.padded[1], self.min_elements)


class Value:
    """A tensor of the plan: Keras's shape (with the plan's batch) and the storage that holds it."""

    def __init__(self, shape, storage: _Storage, producer=None, name: str = ""):
        self.shape = tuple(int(d) for d in shape)
        self.storage, self.producer, self.name = storage, producer, name
        self.consumers: list = []

    @property
    def rows(self) -> int:
        return self.shape[-1]

    @property
    def cols(self) -> int:
        return math.prod(self.shape[:-1])

    def __repr__(self) -> str:
        return f"Value({self.name or '?'} {self.shape})"


@dataclasses.dataclass(eq=False)
class _Step:
    kind: str                   # "matmul", "bias", "activation", "affine", "relayout", "reshape", "conv",
                                # "pool", "spatial", "im2col", "broadcast", "normalize", "permute", "repeat",
                                # "merge", "concat", "dot"
    spec: KernelSpec
    out: Value
    inputs: dict                # slot ("a" or "b") -> Value
    what: str
    weight: Weight | None = None
    bias: Vector | None = None
    activation: str = "linear"
    params: dict = dataclasses.field(default_factory=dict)
    affine: tuple | None = None   # (scale, shift) Vectors applied after the activation
    layers: list = dataclasses.field(default_factory=list)   # the layers this step runs (for summary)
    explicit: bool = False        # the kernel was chosen with use(): never swapped by fusion
    launch: object = None
    vectors: dict = dataclasses.field(default_factory=dict)   # kernel buffer name -> Vector (layer steps)
    overwrites: bool = False      # a layer step that rewrites its input "b" in place

    @property
    def in_place(self) -> bool:
        """Whether the step writes into its input ``b``'s buffer (bias, activation, affine; a layer
        step that ``overwrites`` it: a broadcast or normalize, a merge's running result, a
        Concatenate's buffer that earlier inputs wrote their slices into)."""
        return self.kind in ("bias", "activation", "affine") or self.overwrites


def _round_up(value: int, multiple: int) -> int:
    return max(1, -(-value // multiple)) * multiple


#: Keras merge -> the merge kernel's OP for each further input
_MERGE_OPS = {"add": "op_add", "subtract": "op_sub", "multiply": "op_mul", "average": "op_add",
              "maximum": "op_max", "minimum": "op_min"}
#: sample axes the merge kernel broadcasts over (D1..D8)
_MAX_BROADCAST_RANK = 8


def broadcast_shape(shapes, what: str = "merge") -> tuple:
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
            raise ValueError(f"{what}: inputs of shapes {', '.join(format_shape(s) for s in shapes)} do not "
                             f"broadcast (axis {axis} has sizes {sorted(sizes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _broadcast_defines(shape, out, what: str) -> dict:
    """The merge kernel's defines reading a tensor of ``shape`` broadcast to ``out`` (batch first)."""
    rank = len(out) - 1
    if rank > _MAX_BROADCAST_RANK:
        raise ValueError(f"{what}: malinn broadcasts samples of up to {_MAX_BROADCAST_RANK} axes, not "
                         f"{format_shape(out)}")
    sample = (1,) * (rank - (len(shape) - 1)) + tuple(shape[1:])
    defines = {"BROADCAST": 1, "S0": math.prod(sample)}
    for axis in range(1, rank + 1):
        size = sample[axis - 1]
        defines[f"D{axis}"] = out[axis]
        defines[f"S{axis}"] = 0 if size == 1 else math.prod(sample[axis:])
    return defines


# ======================================================================== the builder
class PlanBuilder:
    """Records the steps of a model for one device and batch, then compiles them into a :class:`Plan`.

    Layers call :meth:`input`, :meth:`matmul`, :meth:`activation`, :meth:`affine` and
    :meth:`reshape` from their ``lower`` method; each returns the :class:`Value` it produces.

    Args:
        device: the device the plan runs on.
        batch: the samples one run takes (inputs with fewer samples are padded).
        precision: the precision of every matmul's weights (the kernel library's ``precisions``).
    """

    def __init__(self, device: Device, batch: int, precision: str = DEFAULT_PRECISION):
        self.device, self.batch, self.precision = device, int(batch), precision
        self.steps: list = []
        self.inputs: list = []
        self.layer = None   # the layer being lowered (its name goes into every step it records)
        self._uses: dict = {}   # id(input value) -> how many layer calls read it

    # ---------------------------------------------------------------- recording
    def input(self, sample_shape, name: str = "input", uses: int = 1) -> Value:
        """A model input: ``batch`` samples of ``sample_shape``, uploaded in Keras's own order
        (column-major: each sample's values contiguous, the samples as far apart as the readers pad).

        ``uses``: how many layer calls read it (a Reshape of an input read once is a free view)."""
        shape = (self.batch,) + tuple(sample_shape)
        rows, cols = matrix_view(shape)
        value = Value(shape, _Storage(rows, cols, C), name=name)
        self.inputs.append(value)
        self._uses[id(value)] = uses
        return value

    def _record(self, kind, spec, out_shape, inputs, what, storage=None, **fields) -> Value:
        rows, cols = matrix_view(out_shape)
        out = Value(out_shape, storage or _Storage(rows, cols), name=what)
        step = _Step(kind, spec, out, dict(inputs), what, layers=[self.layer] if self.layer is not None else [],
                     **fields)
        out.producer = step
        for value in inputs.values():
            value.consumers.append(step)
        self.steps.append(step)
        return out

    def matmul(self, x: Value, weight: Weight, bias: Vector | None = None, activation: str = "linear",
               params: dict | None = None, what: str = "matmul") -> Value:
        """``activation(W x X + bias)``: ``weight`` is ``units x x.rows``; the result has ``x``'s shape
        with ``units`` in place of the last axis."""
        m, k = weight.shape
        if k != x.rows:
            raise ValueError(f"{what}: the weights expect {k} input features, but the input has shape "
                             f"{format_shape(x.shape)}")
        spec = choose("matmul", self.device, (m, k, x.cols), precision=self.precision)
        out = self._record("matmul", spec, x.shape[:-1] + (m,), {"b": x}, what, weight=weight,
                           explicit=explicit_choice("matmul", self.device) is not None)
        if bias is not None:
            out = self._record("bias", choose("bias", self.device), out.shape, {"b": out}, what, storage=out.storage,
                               bias=bias)
        if activation not in (None, "linear"):
            out = self.activation(out, activation, params, what)
        return out

    def activation(self, x: Value, name: str, params: dict | None = None, what: str = "activation") -> Value:
        """Activation ``name`` applied to ``x`` (in place where ``x`` is read by nothing else)."""
        if name in (None, "linear"):
            return x
        spec = load_library().activation_spec(name, what)
        spec.param_values(params)   # names the parameter a kernel does not take, now
        return self._record("activation", spec, x.shape, {"b": x}, what, storage=x.storage, activation=name,
                            params=dict(params or {}))

    def affine(self, x: Value, scale: Vector, shift: Vector, what: str = "affine") -> Value:
        """``x * scale + shift`` per feature (last axis)."""
        spec = choose("affine", self.device)
        return self._record("affine", spec, x.shape, {"b": x}, what, storage=x.storage, affine=(scale, shift))

    def reshape(self, x: Value, shape, what: str = "reshape") -> Value:
        """``x`` with another Keras shape of the same size (flat order kept)."""
        shape = (self.batch,) + tuple(int(d) for d in shape[1:])
        if math.prod(shape) != math.prod(x.shape):
            raise ValueError(f"{what}: cannot reshape {format_shape(x.shape)} to {format_shape(shape)}")
        if shape == x.shape:
            return x
        if x in self.inputs and not x.consumers and self._uses.get(id(x), 1) <= 1:
            # the input is uploaded in Keras's order and read by nothing else: a view is free
            x.shape = shape
            x.storage.rows, x.storage.cols = matrix_view(shape)
            return x
        spec = choose("reshape", self.device)
        return self._record("reshape", spec, shape, {"a": x}, what)

    # ---------------------------------------------------------------- merge layers (layers/merging.py)
    def merge(self, xs: list, op: str, what: str = "merge") -> Value:
        """Keras's element-wise merge of ``xs`` (two or more values): ``op`` is ``add``,
        ``subtract`` (two inputs), ``multiply``, ``average``, ``maximum`` or ``minimum``.

        Shapes broadcast as Keras does (:func:`broadcast_shape`). The result is computed in the
        buffer of the first input of the result's shape (a copy of it where another step reads it
        later), one in-place step per further input.
        """
        xs = list(xs)
        if len(xs) < 2 or (op == "subtract" and len(xs) != 2):
            raise ValueError(f"{what}: {op} takes {'exactly 2' if op == 'subtract' else 'at least 2'} inputs, "
                             f"got {len(xs)}")
        shape = (self.batch,) + broadcast_shape([x.shape for x in xs], what)[1:]
        # the running result lives in the buffer of an input of the result's shape, preferably one a
        # kernel wrote (in the layout the next kernels read) rather than a model input (Keras's order)
        full = sorted((i for i, x in enumerate(xs) if x.shape == shape), key=lambda i: xs[i] in self.inputs)
        code = _MERGE_OPS[op]
        if op == "subtract" and full and full[0] == 1:
            order, codes = [1, 0], ["op_rsub"]
        else:
            first = full[0] if full else 0
            order = [first] + [i for i in range(len(xs)) if i != first]
            codes = [code] * (len(xs) - 1)
        running = xs[order[0]]
        if running.shape != shape:   # no input has the result's shape: broadcast the first one into it
            running = self._merge_step(None, running, "op_copy", shape, 1, what)
        for step, (i, code) in enumerate(zip(order[1:], codes)):
            divisor = len(xs) if op == "average" and step == len(codes) - 1 else 1
            running = self._merge_step(running, xs[i], code, shape, divisor, what)
        return running

    def _merge_step(self, running: Value | None, x: Value, code: str, shape, divisor: int, what: str) -> Value:
        defines = {"OP": code, "DIVISOR": f"{divisor}.0f"}
        if x.shape != shape:
            defines.update(_broadcast_defines(x.shape, shape, what))
        spec = choose("merge", self.device).configure(defines)
        inputs = {"b": running, "a": x} if running is not None else {"a": x}
        return self._record("merge", spec, shape, inputs, what, storage=running.storage if running else None,
                            overwrites=running is not None)

    def concat(self, xs: list, axis: int, what: str = "concatenate") -> Value:
        """Keras's Concatenate of ``xs`` along ``axis`` (of the Keras shape, batch axis 0): one
        buffer, each input written into its slice by one step."""
        xs = list(xs)
        rank = len(xs[0].shape)
        axis = axis + rank if axis < 0 else axis
        if not 1 <= axis < rank or any(len(x.shape) != rank for x in xs):
            raise ValueError(f"{what}: cannot concatenate shapes {', '.join(format_shape(x.shape) for x in xs)} "
                             f"along axis {axis}")
        for x in xs:
            if x.shape[:axis] + x.shape[axis + 1:] != xs[0].shape[:axis] + xs[0].shape[axis + 1:]:
                raise ValueError(f"{what}: shapes {', '.join(format_shape(x.shape) for x in xs)} differ off the "
                                 f"concatenation axis {axis}")
        total = sum(x.shape[axis] for x in xs)
        shape = xs[0].shape[:axis] + (total,) + xs[0].shape[axis + 1:]
        inner = math.prod(shape[axis + 1:])
        out, offset = None, 0
        for i, x in enumerate(xs):
            spec = choose("concat", self.device).configure(
                {"FIRST": int(i == 0), "INNER": inner, "ALEN": x.shape[axis], "RLEN": total, "OFFSET": offset})
            inputs = {"a": x} if out is None else {"b": out, "a": x}
            out = self._record("concat", spec, shape, inputs, what, storage=out.storage if out is not None else None,
                               overwrites=out is not None)
            offset += x.shape[axis]
        return out

    def dot(self, x: Value, y: Value, axes: tuple, normalize: bool = False, norm_floor: float = 1e-12,
            what: str = "dot") -> Value:
        """Keras's Dot: ``batch_dot(x, y, axes)`` of two values of rank 2 or 3 (batch first),
        optionally L2-normalised along ``axes`` (each sum of squares at least ``norm_floor``)."""
        ax, ay = axes
        if not (2 <= len(x.shape) <= 3 and 2 <= len(y.shape) <= 3) or x.shape[ax] != y.shape[ay] \
                or not (1 <= ax < len(x.shape) and 1 <= ay < len(y.shape)):
            raise ValueError(f"{what}: cannot take the dot product of {format_shape(x.shape)} and "
                             f"{format_shape(y.shape)} over axes {list(axes)}")

        def strides(shape, axis):   # (per sample, along the kept axis, along the summed axis)
            kept = [d for d in range(1, len(shape)) if d != axis]
            row_major = {d: math.prod(shape[d + 1:]) for d in range(len(shape))}
            return row_major[0], (row_major[kept[0]] if kept else 0), row_major[axis], (shape[kept[0]] if kept else 1)

        xb, xp, xk, dp = strides(x.shape, ax)
        yb, yq, yk, dq = strides(y.shape, ay)
        shape = (self.batch,) + tuple(d for d in (dp if len(x.shape) == 3 else None,
                                                  dq if len(y.shape) == 3 else None) if d is not None)
        if len(shape) == 1:
            shape += (1,)
        spec = choose("dot", self.device).configure(
            {"DP": dp, "DQ": dq, "DK": x.shape[ax], "AB": xb, "AP": xp, "AK": xk, "BB": yb, "BQ": yq, "BK": yk,
             "NORMALIZE": int(bool(normalize)), "NORM_FLOOR": f"{float(norm_floor):.1e}f"})
        return self._record("dot", spec, shape, {"a": x, "b": y}, what)

    # ---------------------------------------------------------------- layers beyond Dense (issue 10)
    def broadcast(self, x: Value, form: int, scale: Vector, shift: Vector | None, period_cols: int,
                  what: str = "broadcast") -> Value:
        """Per-element parameters applied to ``x`` in place (kernels/broadcast.cl): ``form`` 0 is
        ``x * scale + shift``, 1 ``(x + shift) * scale``, 2 PReLU (``scale`` holds alpha). The
        vectors hold ``period_cols * x.rows`` values: element (row, col) of ``x``'s matrix view
        reads ``(col % period_cols) * x.rows + row`` (parameters over the sample's trailing axes)."""
        if x.cols % period_cols or any(v.values.size != period_cols * x.rows for v in (scale, shift) if v is not None):
            raise ValueError(f"{what}: parameters of {scale.values.size} values do not tile {format_shape(x.shape)}")
        spec = choose("broadcast", self.device).configure({"FORM": int(form), "PCOLS": int(period_cols)})
        vectors = {"scale": scale, **({"shift": shift} if shift is not None else {})}
        return self._record("broadcast", spec, x.shape, {"b": x}, what, storage=x.storage, vectors=vectors,
                            overwrites=True)

    #: what :meth:`normalize` computes over each group -> the kernel's MODE (kernels/normalize_axes.cl)
    NORMALIZE_MODES = {"softmax": 0, "softmax_logsumexp": 1, "layer": 2, "rms": 3, "unit": 4}

    def normalize(self, x: Value, mode: str, axes, epsilon: float = 0.0, scale: Vector | None = None,
                  shift: Vector | None = None, what: str = "normalize") -> Value:
        """Each group of ``x``'s elements along ``axes`` normalized (softmax, layer normalization,
        RMS scaling, L2 normalization: :data:`NORMALIZE_MODES`), in place, one kernel. ``axes`` are
        indices into ``x.shape`` (the batch axis is 0 and is never one of them); axes that are not
        one run are permuted to the end and back. ``scale`` / ``shift`` (gamma / beta) hold one
        value per element of a group, in the row-major order of the sorted axes."""
        axes = tuple(sorted(set(int(a) for a in axes)))
        rank = len(x.shape)
        if not axes or axes[0] < 1 or axes[-1] >= rank:
            raise ValueError(f"{what}: axes {axes} are not sample axes of {format_shape(x.shape)}")
        if axes != tuple(range(axes[0], axes[-1] + 1)):
            order = [a for a in range(1, rank) if a not in axes] + list(axes)
            y = self.normalize(self.permute(x, order, what), mode, range(rank - len(axes), rank), epsilon, scale,
                               shift, what)
            return self.permute(y, [order.index(a) + 1 for a in range(1, rank)], what)
        group, inner = math.prod(x.shape[axes[0]:axes[-1] + 1]), math.prod(x.shape[axes[-1] + 1:])
        split = {"SR": x.rows, "SC": group // x.rows} if inner == 1 else {"SR": 1, "SC": group}
        spec = choose("normalize", self.device).configure(
            {"GROUP": group, "INNER": inner, "MODE": self.NORMALIZE_MODES[mode], "CENTER": int(shift is not None),
             "SCALE": int(scale is not None), **split})
        vectors = {name: v for name, v in (("scale", scale), ("shift", shift)) if v is not None}
        return self._record("normalize", spec, x.shape, {"b": x}, what, storage=x.storage, vectors=vectors,
                            overwrites=True, params={"epsilon": float(epsilon)})

    def permute(self, x: Value, dims, what: str = "permute") -> Value:
        """``x`` with its sample axes in the order ``dims`` (Keras's ``Permute(dims)``: 1-based, the
        batch axis stays first), copied by kernels/permute.cl."""
        dims = tuple(int(d) for d in dims)
        rank = len(x.shape)
        if sorted(dims) != list(range(1, rank)):
            raise ValueError(f"{what}: {dims} is not an order of the sample axes of {format_shape(x.shape)}")
        if dims == tuple(range(1, rank)):
            return x
        if rank - 1 > 8:
            raise ValueError(f"{what}: malinn permutes samples of at most 8 axes, not {rank - 1}")
        shape = (x.shape[0],) + tuple(x.shape[d] for d in dims)
        defines = {"NAX": rank - 1, "SAMPLE": math.prod(x.shape[1:])}
        for k, d in enumerate(dims):
            defines.update({f"ODIM{k}": shape[k + 1], f"OSTR{k}": math.prod(shape[k + 2:]),
                            f"ISTR{k}": math.prod(x.shape[d + 1:])})
        spec = choose("permute", self.device).configure(defines)
        return self._record("permute", spec, shape, {"a": x}, what)

    def repeat(self, x: Value, times: int, what: str = "repeat") -> Value:
        """``x`` of shape ``(batch, features)`` repeated into ``(batch, times, features)``
        (Keras's ``RepeatVector``), by kernels/repeat.cl."""
        if len(x.shape) != 2:
            raise ValueError(f"{what}: RepeatVector takes (batch, features), not {format_shape(x.shape)}")
        return self._record("repeat", choose("repeat", self.device), (x.shape[0], int(times), x.shape[1]), {"a": x},
                            what)

    # ---------------------------------------------------------------- convolutions (layers/convolution.py)
    def conv(self, x: Value, weight: Weight, geometry: dict, out_shape, bias: Vector | None = None,
             activation: str = "linear", params: dict | None = None, what: str = "conv") -> Value:
        """A convolution of ``x`` (Keras ``(batch, H, W, C)`` or ``(batch, L, C)``) by ``weight``
        (``COUT x KH*KW*CG``, column ``(ky*KW + kx)*CG + c``), then bias and activation.

        ``geometry`` holds the window defines (:func:`malinn.layers.windows.window_defines`) and
        ``GROUPS``. The algorithm is chosen here, per layer shape: a 1x1 convolution with stride 1
        is a plain matmul on the input's matrix view (no transform); where :func:`use` chose an
        ``im2col`` kernel (and there is one group) the patch matrix is built and multiplied by the
        device's matmul; otherwise the ``conv`` kernel (kn2row or kn2col accumulating GEMMs: an
        explicit choice, else the first of the library's defaults for the device's kind whose
        preconditions hold for ``(COUT, KH*KW*CG, batch*OH*OW)``).
        """
        g = dict(geometry)
        groups = int(g.pop("GROUPS", 1))
        cin, cout = x.rows, weight.shape[0]
        out_shape = (self.batch,) + tuple(out_shape[1:])
        pointwise = (g["KH"], g["KW"], g["SH"], g["SW"], g["PT"], g["PL"], groups) == (1, 1, 1, 1, 0, 0, 1)
        if pointwise and (g["IH"], g["IW"]) == (g["OH"], g["OW"]):
            return self.matmul(x, weight, bias, activation, params, what)
        if groups == 1 and explicit_choice("im2col", self.device) is not None:
            patches = self.gather(x, "im2col", {**g, "CIN": cin}, out_shape[:-1] + (weight.shape[1],), what)
            return self.matmul(patches, weight, bias, activation, params, what)
        defines = {**g, "CG": cin // groups, "MG": cout // groups, "GROUPS": groups}
        spec = self._conv_spec("conv", (cout, weight.shape[1], math.prod(out_shape[:-1]))).configure(defines)
        return self._conv_step(spec, x, weight, out_shape, bias, activation, params, what)

    def depthwise(self, x: Value, weight: Weight, geometry: dict, out_shape, bias: Vector | None = None,
                  activation: str = "linear", params: dict | None = None, what: str = "depthwise") -> Value:
        """A depthwise convolution of ``x`` by ``weight`` (``C*DM x KH*KW``, row ``c*DM + j``), then
        bias and activation; ``geometry`` as for :meth:`conv`, with ``DM`` the depth multiplier."""
        out_shape = (self.batch,) + tuple(out_shape[1:])
        spec = self._conv_spec("depthwise", (weight.shape[0], weight.shape[1], math.prod(out_shape[:-1])))
        return self._conv_step(spec.configure(geometry), x, weight, out_shape, bias, activation, params, what)

    def _conv_spec(self, op: str, shape: tuple) -> KernelSpec:
        """The kernel of ``op``: :func:`use`'s choice, else the first library default for the device's
        kind whose preconditions hold for ``shape`` (the last one, the general kernel, otherwise)."""
        if explicit_choice(op, self.device) is not None:
            return choose(op, self.device)
        specs = load_library().default_specs(op, self.device.kind, self.device.backend)
        return next((s for s in specs if s.accepts(*shape)), specs[-1])

    def _conv_step(self, spec, x, weight, out_shape, bias, activation, params, what) -> Value:
        out = self._record("conv", spec, out_shape, {"b": x}, what, weight=weight)
        if bias is not None:
            out = self._record("bias", choose("bias", self.device), out.shape, {"b": out}, what, storage=out.storage,
                               bias=bias)
        if activation not in (None, "linear"):
            out = self.activation(out, activation, params, what)
        return out

    def gather(self, x: Value, op: str, defines: dict, out_shape, what: str) -> Value:
        """A kernel of ``op`` (``"pool"``, ``"spatial"``, ``"im2col"``) that reads ``x`` (slot ``a``)
        and writes a new tensor of ``out_shape``, configured with ``defines``."""
        spec = choose(op, self.device).configure(defines)
        return self._record(op, spec, (self.batch,) + tuple(out_shape[1:]), {"a": x}, what)

    # ---------------------------------------------------------------- compiling
    def compile(self, outputs: list) -> "Plan":
        """Makes every decision (see the module docstring) and returns the runnable :class:`Plan`.

        Args:
            outputs: the values the plan downloads, in order.

        Raises:
            DeviceError: a buffer or weight does not fit the device (the message names the layer).
        """
        outputs = list(outputs)
        self._fuse(outputs)
        self._protect_in_place(outputs)
        aliases = self._relayout_inputs()
        self._resolve_paddings()
        self._unalias(aliases)
        outputs = self._download_ready(outputs)
        return Plan(self.device, self.batch, self.inputs, outputs, self.steps, self.precision)

    def _fuse(self, outputs) -> None:
        """Folds activation, affine and softmax steps into the matmul before them where allowed, and
        an element-wise activation into the merge step before it."""
        keep = []
        for step in self.steps:
            x = step.inputs.get("b")
            producer = x.producer if x is not None else None
            if (step.kind == "activation" and producer is not None and producer.kind == "merge" and x not in outputs
                    and len(x.consumers) == 1 and producer.spec.config.get("ACTIVATION") == "act_linear"
                    and elementwise_kernel(step.activation) is not None and not producer.explicit):
                producer.spec = producer.spec.configure({"ACTIVATION": f"act_{step.activation}"})
                producer.activation, producer.params = step.activation, step.params
                producer.layers += [layer for layer in step.layers if layer not in producer.layers]
                producer.out = step.out
                step.out.producer = producer
                continue
            if (step.in_place and producer is not None and producer.kind in ("matmul", "conv") and len(x.consumers) == 1
                    and x not in outputs and producer.affine is None and self._absorb(producer, step)):
                producer.layers += [layer for layer in step.layers if layer not in producer.layers]
                producer.out = step.out
                step.out.producer = producer
                continue
            keep.append(step)
        self.steps = keep

    def _absorb(self, matmul: _Step, step: _Step) -> bool:
        if step.kind not in ("bias", "affine", "activation"):
            return False
        features = set(matmul.spec.epilogue)
        if step.kind == "bias":
            if "bias" not in features or matmul.bias is not None or matmul.activation not in (None, "linear"):
                return False
            matmul.bias = step.bias
            return True
        if step.kind == "affine":
            if "affine" not in features:
                return False
            matmul.affine = step.affine
            return True
        if matmul.activation not in (None, "linear"):
            return False
        if step.activation == "softmax" and matmul.kind != "matmul":
            return False
        if step.activation == "softmax":
            spec = holding_columns(matmul.spec, self._shape(matmul), self.device)
            if spec is None and not matmul.explicit:
                spec = self._softmax_kernel(matmul)
            if spec is None:
                return False
            matmul.spec = spec
        elif "activation" not in features or elementwise_kernel(step.activation) is None:
            return False
        matmul.activation, matmul.params = step.activation, step.params
        return True

    @staticmethod
    def _shape(matmul: _Step) -> tuple:
        return matmul.weight.shape + (matmul.inputs["b"].cols,)

    def _softmax_kernel(self, matmul: _Step):
        """The library's ``matmul_softmax`` kernel, in a configuration whose work-groups hold this
        product's columns, where it reads and writes the layouts the chosen kernel does; or None."""
        library = load_library()
        if "matmul_softmax" not in library.defaults:
            return None
        for candidate in library.default_specs("matmul_softmax", self.device.kind, self.device.backend):
            if matmul.spec.precision not in candidate.precisions:
                continue
            candidate = candidate.in_precision(matmul.spec.precision)
            if all(candidate.matrices[x].layout == matmul.spec.matrices[x].layout for x in "br"):
                spec = holding_columns(candidate, self._shape(matmul), self.device)
                if spec is not None:
                    return spec
        return None

    def _protect_in_place(self, outputs) -> None:
        """An in-place step whose input is read later (or downloaded) first copies it."""
        steps = []
        for i, step in enumerate(self.steps):
            if step.in_place:
                x = step.inputs["b"]
                later = any(self.steps.index(c) > i for c in x.consumers if c is not step and c in self.steps)
                if (later or x in outputs) and self._swap_operands(step, i, outputs):
                    x, later = step.inputs["b"], False
                if later or x in outputs:
                    copy = self._relayout_step(x, None, step.what)
                    steps.append(copy)
                    x.consumers.remove(step)
                    step.inputs["b"] = copy.out
                    copy.out.consumers.append(step)
                    step.out.storage = copy.out.storage
                    self._share_storage(step.out, copy.out.storage)
            steps.append(step)
        self.steps = steps

    _SWAPPED = {"op_add": "op_add", "op_mul": "op_mul", "op_max": "op_max", "op_min": "op_min",
                "op_sub": "op_rsub", "op_rsub": "op_sub"}

    def _swap_operands(self, step: _Step, index: int, outputs) -> bool:
        """A merge step whose in-place operand is read again works in its other operand's buffer
        instead, where that one has the result's shape and is read by nothing after it (no copy)."""
        if step.kind != "merge" or "a" not in step.inputs:
            return False
        b, a = step.inputs["b"], step.inputs["a"]
        op = step.spec.config.get("OP")
        if op not in self._SWAPPED or a.shape != b.shape or a in outputs or a.storage is b.storage:
            return False
        if any(self.steps.index(c) > index for c in a.consumers if c is not step and c in self.steps):
            return False
        step.inputs["b"], step.inputs["a"] = a, b
        step.spec = step.spec.configure({"OP": self._SWAPPED[op]})
        self._share_storage(step.out, a.storage)
        return True

    def _share_storage(self, value: Value, storage: _Storage) -> None:
        """Points every in-place successor of ``value`` at ``storage`` too."""
        value.storage = storage
        for consumer in value.consumers:
            if consumer.in_place and consumer.inputs.get("b") is value and consumer.out is not value:
                self._share_storage(consumer.out, storage)

    def _relayout_step(self, x: Value, layout: Layout | None, what: str) -> _Step:
        """A step copying ``x`` into a new storage in ``layout`` (None: decided like any result)."""
        spec = choose("relayout", self.device)
        out = Value(x.shape, _Storage(x.rows, x.cols, layout), name=f"{what} (re-laid out)")
        step = _Step("relayout", spec, out, {"a": x}, what)
        out.producer = step
        x.consumers.append(step)
        return step

    def _wanted(self, step: _Step, slot: str):
        """``(layout or None for any, row multiple, column multiple)`` that ``step`` asks of ``slot``."""
        spec = step.spec
        if step.kind == "matmul":
            a, b, r = spec.matrices["a"], spec.matrices["b"], spec.matrices["r"]
            if slot == "b":
                return b.layout, math.lcm(b.row_multiple, a.col_multiple), math.lcm(b.col_multiple, r.col_multiple, spec.scale[1])
            return r.layout, math.lcm(r.row_multiple, a.row_multiple, spec.scale[0]), math.lcm(b.col_multiple, r.col_multiple, spec.scale[1])
        if step.kind == "conv":
            restriction = spec.matrices[slot]
            layout = None if restriction.any_layout else restriction.layout
            return layout, restriction.row_multiple, restriction.col_multiple
        restriction = spec.matrices["a" if slot == "a" else "r"]
        layout = None if restriction.any_layout else restriction.layout
        return layout, restriction.row_multiple, restriction.col_multiple

    def _relayout_inputs(self) -> None:
        """Decides each result's layout and gives readers of another layout a re-layout step."""
        steps, relaid, aliases = [], {}, []
        for step in self.steps:
            for slot, x in list(step.inputs.items()):
                layout, row_mult, col_mult = self._wanted(step, slot)
                storage = x.storage
                alias = layout is not None and storage.layout != layout and _may_alias(storage, layout, x, col_mult)
                ok = layout is None or storage.layout == layout or alias
                if not ok:
                    key = (id(x), str(layout), row_mult)
                    if key not in relaid:
                        copy = self._relayout_step(x, layout, step.what)
                        steps.append(copy)
                        relaid[key] = copy.out
                    x.consumers.remove(step)
                    step.inputs[slot] = relaid[key]
                    relaid[key].consumers.append(step)
                elif alias:
                    aliases.append((step, slot, layout))   # R and C are one memory while there is one column
            if step.out.storage.layout is None:
                layout = self._wanted(step, "r")[0] or self._readers_layout(step.out)
                step.out.storage.layout = layout if layout is not None else step.inputs["b" if "b" in step.inputs else "a"].storage.layout
            steps.append(step)
        self.steps = steps
        return aliases

    def _readers_layout(self, value: Value):
        """The one layout every reader of ``value`` that asks for one wants (a result in any layout
        is then written in it, saving a re-layout), or None."""
        wanted = {str(self._wanted(reader, slot)[0]) for reader in value.consumers
                  for slot, x in reader.inputs.items() if x is value and self._wanted(reader, slot)[0] is not None}
        return parse_layout(wanted.pop()) if len(wanted) == 1 else None

    def _unalias(self, aliases) -> None:
        """Readers that took a plain R buffer for C (or the reverse) get a re-layout step where the
        buffer was padded to more than one column after all."""
        for step, slot, layout in aliases:
            x = step.inputs[slot]
            if x.storage.padded[1] == 1:
                continue
            _, row_mult, _ = self._wanted(step, slot)
            copy = self._relayout_step(x, layout, step.what)
            copy.out.storage.padded = (_round_up(x.rows, row_mult), x.storage.padded[1])
            x.consumers.remove(step)
            step.inputs[slot] = copy.out
            copy.out.consumers.append(step)
            self.steps.insert(self.steps.index(step), copy)

    def _download_ready(self, outputs) -> list:
        """Outputs whose buffers are not in Keras's order get a last re-layout step into it."""
        result = []
        for value in outputs:
            storage = value.storage
            if not keras_order(storage.layout, value.rows, value.cols, storage.padded):
                step = self._relayout_step(value, C, value.name or "output")
                step.out.storage.padded = (value.rows, value.cols)
                self.steps.append(step)
                value = step.out
            result.append(value)
        return result

    def _resolve_paddings(self) -> None:
        """Pads every storage to what its producer and readers ask; couples matmul columns."""
        for step in self.steps:
            storages = [(slot, x.storage) for slot, x in step.inputs.items()] + [("r", step.out.storage)]
            for slot, storage in storages:
                _, row_mult, col_mult = self._wanted(step, slot)
                storage.row_mult = math.lcm(storage.row_mult, row_mult)
                storage.col_mult = math.lcm(storage.col_mult, col_mult)
            if step.kind == "matmul":
                left, right = step.inputs["b"].storage.root(), step.out.storage.root()
                if left is not right:
                    right.group = left
        groups: dict = {}
        storages = self._storages()
        for storage in storages:
            # a kernel that takes any layout writes the layout's whole chunks too (a blocked layout
            # inherited from the producer's kernel)
            if storage.layout is not None:
                storage.row_mult = math.lcm(storage.row_mult, storage.layout.row_multiple)
                storage.col_mult = math.lcm(storage.col_mult, storage.layout.col_multiple)
            root = storage.root()
            col_mult, cols = groups.get(id(root), (1, 0))
            groups[id(root)] = (math.lcm(col_mult, storage.col_mult), max(cols, storage.cols))
        for storage in storages:
            col_mult, cols = groups[id(storage.root())]
            storage.padded = (_round_up(storage.rows, storage.row_mult), _round_up(storage.cols, col_mult))

    def _storages(self) -> list:
        return _storages_of(self.inputs, self.steps)


def _storages_of(values, steps) -> list:
    """Every storage of ``values`` and of the steps' inputs and results, each once, in first-seen order."""
    seen, result = set(), []
    for value in list(values) + [s.out for s in steps] + [x for s in steps for x in s.inputs.values()]:
        if id(value.storage) not in seen:
            seen.add(id(value.storage))
            result.append(value.storage)
    return result


def _may_alias(storage: _Storage, layout: Layout, x: Value, col_mult: int) -> bool:
    """Whether a plain R or C buffer of one logical column may be read as the other layout (it may
    while it is padded to one column; :meth:`PlanBuilder._unalias` checks that once padded)."""
    return {str(storage.layout), str(layout)} == {"R", "C"} and x.cols == 1 and col_mult == 1


# ======================================================================== the plan
class Plan:
    """A model compiled for one device and batch size: its steps, buffers and bound launches.

    Attributes:
        device: where it runs; batch: the samples one run takes; precision: the weights' precision.
        inputs, outputs: the input and output values, in order.
        steps: the steps, in launch order (each with its kernel, layers and fused epilogue).
    """

    def __init__(self, device: Device, batch: int, inputs: list, outputs: list, steps: list,
                 precision: str = DEFAULT_PRECISION):
        self.device, self.batch, self.inputs, self.outputs, self.steps = device, batch, inputs, outputs, steps
        self.precision = precision
        self.buffers: list = []
        self.launches: list = []
        self._assign_lifetimes()

    # ---------------------------------------------------------------- memory, before allocating
    def _assign_lifetimes(self) -> None:
        end = len(self.steps)
        for storage in self._storages():
            storage.first, storage.last = end + 1, -1
        for value in self.inputs:
            value.storage.first = -1
        for i, step in enumerate(self.steps):
            for storage in [x.storage for x in step.inputs.values()] + [step.out.storage]:
                storage.first, storage.last = min(storage.first, i), max(storage.last, i)
        for value in self.outputs:
            value.storage.last = end

    def _storages(self) -> list:
        return _storages_of(self.inputs + self.outputs, self.steps)

    def _arena(self) -> list:
        """``[(bytes, [storages])]``: buffers reused by liveness (best fit, first-come).

        Each input has a buffer of its own, exactly its size, written whole by every run (no other
        tensor shares it, so an upload never covers part of a larger buffer)."""
        inputs = {id(v.storage) for v in self.inputs}
        buffers = [[4 * v.storage.elements(), 2**62, [v.storage]] for v in self.inputs]
        for storage in sorted(self._storages(), key=lambda s: (s.first, -s.elements())):
            if id(storage) in inputs:
                continue
            need = 4 * storage.elements()
            free = [b for b in buffers if b[1] < storage.first and b[0] >= need]
            if free:
                chosen = min(free, key=lambda b: b[0])
            else:
                grow = [b for b in buffers if b[1] < storage.first]
                chosen = max(grow, key=lambda b: b[0]) if grow else None
                if chosen is None:
                    chosen = [0, -2, []]
                    buffers.append(chosen)
                chosen[0] = max(chosen[0], need)
            chosen[1] = storage.last
            chosen[2].append(storage)
        return [(size, storages) for size, _, storages in buffers]

    def weight_paddings(self) -> list:
        """The least padded shape of each matmul's weight in this plan (a copy padded more may serve)."""
        return [self._weight_padding(step) for step in self.steps if step.weight is not None]

    def weight_sizes(self) -> list:
        """Bytes of each matmul's weight copy in this plan, in its precision."""
        return [step.weight.nbytes(self._weight_padding(step), step.spec.precision)
                for step in self.steps if step.weight is not None]

    def weight_bytes(self) -> int:
        """Bytes of the weight copies this plan reads (shared with other plans of the model)."""
        seen, total = set(), 0
        for step in self.steps:
            if step.weight is not None:
                key = (id(step.weight), self._weight_padding(step), step.spec.precision)
                if key not in seen:
                    seen.add(key)
                    total += step.weight.nbytes(key[1], key[2])
            for vector in (step.bias,) + (step.affine or ()) + tuple(step.vectors.values()):
                if vector is not None and id(vector) not in seen:
                    seen.add(id(vector))
                    total += vector.values.nbytes
        return total

    def activation_bytes(self) -> tuple:
        """``(largest buffer bytes, what it holds, arena bytes)`` of this plan's activations."""
        arena = self._arena()
        size, storages = max(arena, key=lambda item: item[0]) if arena else (0, [])
        what = ""
        if storages:
            storage = max(storages, key=lambda s: s.elements())
            value = next((v for v in self._values() if v.storage is storage), None)
            what = self._describe_storage(value, storage)
        return size, what, sum(s for s, _ in arena)

    def _describe_storage(self, value, storage) -> str:
        """``layer 'x' output (13 features x 7 samples, padded to 16x8 in R for kernel k)``."""
        step = value.producer if value is not None else None
        if step is None:
            who, role = "the model's", "input"
            reader = next((s for s in self.steps if value in s.inputs.values()), None)
            kernel = reader.spec.codename if reader is not None else "none"
        else:
            who, role, kernel = (step.layers[-1]._what() if step.layers else step.what), "output", step.spec.codename
        unit = "samples" if storage.cols == self.batch else "columns"
        return (f"{who} {role} ({storage.rows} features x {storage.cols} {unit}, padded to "
                f"{storage.padded[0]}x{storage.padded[1]} in {storage.layout} for kernel {kernel})")

    def _values(self):
        yield from self.inputs
        for step in self.steps:
            yield step.out

    @staticmethod
    def _weight_padding(step: _Step) -> tuple:
        """The least padded shape of a matmul's left operand: its result's padded rows (or, for a
        kernel that reads A's logical rows only, the units rounded up to A's alignment) by the
        common K (the right operand's padded rows)."""
        a = step.spec.matrices["a"]
        if step.kind == "conv":   # a convolution reads A's rows up to R's padded rows
            return (_round_up(step.out.storage.padded[0], a.row_multiple),
                    _round_up(step.weight.shape[1], a.col_multiple))
        rows = _round_up(step.weight.shape[0], a.row_multiple) if a.logical_rows else step.out.storage.padded[0]
        return (rows, Plan._common_rows(step))

    def _shared_padding(self, step: _Step, need) -> tuple | None:
        """A padding of the weight that the device's large-batch kernel can read too, where it reads
        the same layout: a model used at batch 1 and at large batches keeps one copy."""
        m, k = step.weight.shape
        restriction = step.spec.matrices["a"]
        big = choose("matmul", self.device, (m, k, 4096), precision=step.spec.precision)
        other = big.matrices["a"]
        if other.any_layout or restriction.any_layout or other.layout != restriction.layout:
            return None
        theirs = big.padded_shapes(m, k, 4096)["a"]
        return (_round_up(max(need[0], theirs[0]), math.lcm(restriction.row_multiple, other.row_multiple)),
                _round_up(max(need[1], theirs[1]), math.lcm(restriction.col_multiple, other.col_multiple)))

    # ---------------------------------------------------------------- allocating and binding
    def allocate(self) -> "Plan":
        """Uploads the weights, allocates the arena and binds every launch. Returns ``self``."""
        device = self.device
        for size, storages in self._arena():
            what = " / ".join(sorted({f"{s.rows}x{s.cols}" for s in storages}))
            buffer = device.alloc(size, f"activations ({what})")
            with device.lock:
                device.fill_zero(buffer, size, what=f"activations ({what})")
            for storage in storages:
                storage.buffer = buffer
        self.launches = []
        for step in self.steps:
            launch = self._bind(step)
            step.launch = launch
            if launch is not None:
                self.launches.append(launch)
        # inputs and outputs travel through staging arrays the size of their whole buffers, padding
        # included (page-locked on a discrete GPU): a run writes every float of an input's buffer
        # (padded rows and samples as zeros, never an earlier call's data) with one plain copy
        self._io = [(v.storage.buffer, self._staging(v, "input"), v) for v in self.inputs], [
            (v.storage.buffer, self._staging(v, "output"), v) for v in self.outputs]
        return self

    def _staging(self, value: Value, what: str) -> np.ndarray:
        """Host memory laid out as ``value``'s buffer: a row per column of its matrix view (the
        padded columns too), each as long as the padded rows."""
        rows, cols = value.storage.padded
        return self.device.host_array((cols, rows), f"the {what} staging of {value.name or what} "
                                                    f"{format_shape(value.shape)}")

    def _matrix(self, value: Value, rows: int | None = None) -> DeviceMatrix:
        s = value.storage
        padded = s.padded if rows is None else (rows, s.padded[1])
        return DeviceMatrix((value.rows, value.cols), device=self.device, layout=s.layout, padded=padded,
                            buffer=s.buffer)

    @staticmethod
    def _common_rows(step: _Step) -> int:
        """The rows of a matmul's right operand its kernel reads (K padded as the kernel asks).

        A row-major buffer's first rows are a matrix of their own, so a result padded to more rows
        by its producer (a small-batch kernel writes whole blocks of rows) is read only to what this
        kernel needs: the weights need no more columns than that either."""
        x = step.inputs["b"]
        a, b = step.spec.matrices["a"], step.spec.matrices["b"]
        if str(x.storage.layout) != "R":
            return x.storage.padded[0]
        return min(x.storage.padded[0], _round_up(x.rows, math.lcm(b.row_multiple, a.col_multiple)))

    def _bind(self, step: _Step):
        device, spec = self.device, step.spec
        matrices = {slot: self._matrix(x, self._common_rows(step) if step.kind == "matmul" else None)
                    for slot, x in step.inputs.items()}
        matrices["r"] = self._matrix(step.out)
        vectors, params = {}, step.params
        if step.kind == "conv":
            matrices["a"] = step.weight.on_device(device, spec.matrices["a"], self._weight_padding(step))
            spec = self._epilogue(step, device)
            if step.bias is not None:
                vectors["bias"] = step.bias.on_device(device)
            if step.affine is not None:
                vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
        elif step.kind == "matmul":
            need = self._weight_padding(step)
            matrices["a"] = step.weight.on_device(device, spec.matrices["a"], need,
                                                  self._shared_padding(step, need), spec.precision)
            spec = self._epilogue(step, device)
            if step.bias is not None:
                vectors["bias"] = step.bias.on_device(device)
            if step.affine is not None:
                vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
        elif step.kind == "affine":
            vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
            matrices = {"r": matrices["r"]}
        elif step.kind == "bias":
            vectors["bias"] = step.bias.on_device(device)
            matrices = {"r": matrices["r"]}
        elif step.kind in ("merge", "concat"):
            matrices = {"r": matrices["r"], "a": matrices["a"]}
            if step.activation not in (None, "linear"):   # a fused activation's p0..p3
                values = load_library().activation_spec(step.activation, step.what).param_values(step.params)
                params = {f"p{i}": v for i, v in enumerate(values)}
        elif step.kind == "activation" or step.overwrites:
            matrices = {"r": matrices["r"]}
        for name, vector in step.vectors.items():
            vectors[name] = vector.on_device(device)
        return bind(spec, device, matrices, vectors, params, what=step.what)

    @staticmethod
    def _epilogue(step: _Step, device: Device) -> KernelSpec:
        """The matmul's kernel configured for what the fusion pass put in its epilogue (the same
        configuring the eager ``ops.matmul`` does)."""
        shape = step.weight.shape + (step.inputs["b"].cols,)
        spec, fused = with_epilogue(step.spec, shape, device, step.bias is not None, step.activation,
                                   step.affine is not None)
        wanted = (step.bias is not None) + (step.activation not in (None, "linear")) + (step.affine is not None)
        if len(fused) != wanted:
            raise AssertionError(f"{step.what}: {spec.codename} fuses only {fused}")
        return spec

    # ---------------------------------------------------------------- running
    def run(self, arrays: list) -> list:
        """Uploads ``arrays`` (float32, C-contiguous, at most ``batch`` samples each), launches every
        step and downloads the outputs.

        Returns:
            One float32 array per output, with the inputs' number of samples.

        Raises:
            DeviceError: a launch, an upload or a download failed.
        """
        n = arrays[0].shape[0]
        device = self.device
        (ins, outs) = self._io
        with device.lock:
            for (buffer, staging, value), array in zip(ins, arrays):
                cols = value.cols // self.batch * n
                staging[:cols, :value.rows] = array.reshape(cols, value.rows)
                staging[cols:value.cols] = 0
                device.upload(buffer, staging, blocking=False, what="the input", mapped=False)
            device.launch_all(self.launches)
            results = []
            for buffer, staging, value in outs:
                device.download(buffer, staging, blocking=True, what="the output", mapped=False)
                cols = value.cols // self.batch * n
                results.append(staging[:cols, :value.rows].reshape((n,) + value.shape[1:]).copy())
        return results

    # ---------------------------------------------------------------- reports
    def describe(self) -> list:
        """One row per step: ``{"layers", "kernel", "fused", "shape"}`` (what ``summary`` shows; a
        matmul's kernel ends with its precision in brackets where it is not fp32)."""
        precision_defines = {k for p in load_library().precisions.values() for k, _ in p.defines}
        rows = []
        for step in self.steps:
            fused = [f for f, on in (("bias", step.bias is not None),
                                     (step.activation, step.kind in ("matmul", "conv", "merge")
                                      and step.activation not in (None, "linear")),
                                     ("affine", step.kind in ("matmul", "conv") and step.affine is not None)) if on]
            plain = {}   # a shape-generic kernel (merge, concat, dot) shows only what this step sets
            if step.kind in ("merge", "concat", "dot") and step.spec.template is not None:
                plain = {k: str(v) for k, v in step.spec.template[1].get("defines", {}).items()}
            config = " ".join(f"{k}={v}" for k, v in step.spec.defines
                              if k not in ("BIAS", "ACTIVATION", "AFFINE") and k not in precision_defines
                              and k not in _GEOMETRY and plain.get(k) != v)
            rows.append({"layers": [getattr(layer, "name", str(layer)) for layer in step.layers],
                         "kernel": step.spec.codename + (f" ({config})" if config else "")
                         + (f" [{step.spec.precision}]" if step.spec.precision != DEFAULT_PRECISION else ""),
                         "fused": fused, "shape": step.out.shape, "what": step.what, "kind": step.kind})
        return rows

    def matmul_shapes(self) -> list:
        """``(m, k, n)`` of every matmul step (what ``malinn tune --model`` times)."""
        return [(s.weight.shape[0], s.weight.shape[1], s.inputs["b"].cols) for s in self.steps if s.kind == "matmul"]
