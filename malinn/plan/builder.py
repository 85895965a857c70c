"""The plan builder: a model lowered to steps, and every choice made once per model, device and batch.

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

import math

from ..backends.base import Device
from ..choice.conv_choice import choose_algorithm
from ..choice.conv_geometry import ConvGeometry
from ..choice.kernel_choice import check_precision, choose, explicit_choice, holding_columns
from ..errors import BackendError, LibraryError
from ..library.kernel_library import DEFAULT_PRECISION, KernelSpec, load_library
from ..library.layout import Layout, parse_layout, round_up
from ..ops import elementwise_kernel
from .plan import Plan
from .tensor import format_shape, keras_order, matrix_view
from .tensors import C, Step, Storage, Value, Vector, Weight, broadcast_defines, broadcast_shape, may_alias, storages_of

__all__ = ["PlanBuilder"]

#: Keras merge -> the merge kernel's OP for each further input
_MERGE_OPS = {"add": "op_add", "subtract": "op_sub", "multiply": "op_mul", "average": "op_add",
              "maximum": "op_max", "minimum": "op_min"}

def _keras_flat(value: Value) -> bool:
    """Whether ``value``'s buffer holds its elements in Keras's flat order, contiguous from the
    first float on, with all its padding after them: C with unpadded rows (or one column), or R
    with one column or one row."""
    storage = value.storage
    if str(storage.layout) == "C":
        return storage.padded[0] == value.rows or value.cols == 1
    if str(storage.layout) == "R":
        return storage.padded[1] == 1 or value.rows == 1
    return False


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
        self.convs: list = []   # the ConvGeometry of each convolution lowered (not 1x1 matmuls)

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
            raise BackendError(f"layer {layer.name!r} ({type(layer).__name__}) cannot run on {device.name} "
                               f"({device.backend}{': ' + lacks if lacks else ''}): {why}") from None

    def input(self, sample_shape, name: str = "input", uses: int = 1) -> Value:
        """A model input: ``batch`` samples of ``sample_shape``, uploaded in Keras's own order
        (column-major: each sample's values contiguous, the samples as far apart as the readers pad).

        ``uses``: how many layer calls read it (a Reshape of an input read once is a free view)."""
        shape = (self.batch,) + tuple(sample_shape)
        rows, cols = matrix_view(shape)
        value = Value(shape, Storage(rows, cols, C), name=name)
        self.inputs.append(value)
        self._uses[id(value)] = uses
        return value

    def _record(self, kind, spec, out_shape, inputs, what, storage=None, **fields) -> Value:
        rows, cols = matrix_view(out_shape)
        out = Value(out_shape, storage or Storage(rows, cols), name=what)
        step = Step(kind, spec, out, dict(inputs), what, layers=[self.layer] if self.layer is not None else [],
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
        image = spec.matrices["a"]
        if image.image and not spec.accepts(m, k, x.cols, device=self.device):
            rows, cols = round_up(m, image.row_multiple), round_up(k, image.col_multiple)
            raise BackendError(f"{what}: its {m}x{k} weights read as a texture of {rows // 4} x {cols} texels "
                               f"(kernel {spec.codename}) exceed {self.device.name}'s largest texture, "
                               f"{self.device.image2d_max_size[0]} x {self.device.image2d_max_size[1]}")
        out = self._record("matmul", spec, x.shape[:-1] + (m,), {"b": x}, what, weight=weight,
                           explicit=explicit_choice("matmul", self.device) is not None)
        return self._bias_and_activation(out, bias, activation, params, what)

    def _bias_and_activation(self, out: Value, bias, activation: str | None, params, what: str) -> Value:
        """``out`` with a bias step (in place) and an activation step after it, where given (what a
        kernel that fuses no epilogue leaves to steps of their own)."""
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
            defines.update(broadcast_defines(x.shape, shape, what))
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

    # ---------------------------------------------------------------- layers beyond Dense
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
             activation: str = "linear", params: dict | None = None, what: str = "conv",
             algorithm: KernelSpec | None = None) -> Value:
        """A convolution of ``x`` (Keras ``(batch, H, W, C)`` or ``(batch, L, C)``) by ``weight``
        (``COUT x KH*KW*CG``, column ``(ky*KW + kx)*CG + c``), then bias and activation.

        ``geometry`` holds the window defines (:func:`malinn.layers.windows.window_defines`) and
        ``GROUPS``. The algorithm is chosen here, once per layer and plan: a 1x1 convolution with
        stride 1 is a plain matmul on the input's matrix view (no transform); otherwise
        ``algorithm`` where given (the tuner's candidate), else
        :func:`malinn.choice.conv_choice.choose_algorithm` (an explicit choice, the tuned winner for the
        layer's geometry, the library's ``conv_algorithms`` rules): an ``im2col`` kernel builds the
        patch matrix, which the device's matmul multiplies; a ``conv`` kernel (kn2row or kn2col
        accumulating GEMMs) reads the input as it is. Each layer's geometry is kept in
        :attr:`convs` (what ``malinn tune --model`` times).
        """
        g = dict(geometry)
        groups = int(g.pop("GROUPS", 1))
        cin, cout = x.rows, weight.shape[0]
        out_shape = (self.batch,) + tuple(out_shape[1:])
        pointwise = (g["KH"], g["KW"], g["SH"], g["SW"], g["PT"], g["PL"], groups) == (1, 1, 1, 1, 0, 0, 1)
        if pointwise and (g["IH"], g["IW"]) == (g["OH"], g["OW"]):
            return self.matmul(x, weight, bias, activation, params, what)
        shape = ConvGeometry.of(self.batch, cin, cout, groups, g)
        self.convs.append(shape)
        spec = algorithm if algorithm is not None else choose_algorithm(self.device, shape)[0]
        if spec.op == "im2col":
            patches = self._record("im2col", spec.configure({**g, "CIN": cin}), out_shape[:-1] + (weight.shape[1],),
                                   {"a": x}, what)
            return self.matmul(patches, weight, bias, activation, params, what)
        return self._conv_step(self._in_weight_precision(spec.configure(shape.defines())), x, weight, out_shape, bias,
                               activation, params, what)

    def depthwise(self, x: Value, weight: Weight, geometry: dict, out_shape, bias: Vector | None = None,
                  activation: str = "linear", params: dict | None = None, what: str = "depthwise") -> Value:
        """A depthwise convolution of ``x`` by ``weight`` (``C*DM x KH*KW``, row ``c*DM + j``), then
        bias and activation; ``geometry`` as for :meth:`conv`, with ``DM`` the depth multiplier."""
        out_shape = (self.batch,) + tuple(out_shape[1:])
        spec = self._conv_spec("depthwise", (weight.shape[0], weight.shape[1], math.prod(out_shape[:-1])))
        return self._conv_step(self._in_weight_precision(spec.configure(geometry)), x, weight, out_shape, bias,
                               activation, params, what)

    def _in_weight_precision(self, spec: KernelSpec) -> KernelSpec:
        """A convolution kernel reading its weights in the plan's precision: ``fp16`` (half sums)
        as ``fp16-storage`` (half weights, float sums) where the kernel has no half arithmetic, and
        fp32 where it reads no reduced precision (the summary names each step's precision)."""
        check_precision(self.precision, self.device)   # as a matmul's: fp16 needs cl_khr_fp16
        wanted = (self.precision, "fp16-storage") if self.precision == "fp16" else (self.precision,)
        return next((spec.in_precision(p) for p in wanted if p in spec.precisions), spec)

    def _conv_spec(self, op: str, shape: tuple) -> KernelSpec:
        """The kernel of ``op``: :func:`use`'s choice, else the first library default for the device's
        kind whose preconditions hold for ``shape`` and that the device can launch (the last one, the
        general kernel, otherwise)."""
        if explicit_choice(op, self.device) is not None:
            return choose(op, self.device)
        specs = load_library().default_specs(op, self.device.kind, self.device.backend)
        return next((s for s in specs if s.accepts(*shape, device=self.device)), specs[-1])

    def _conv_step(self, spec, x, weight, out_shape, bias, activation, params, what) -> Value:
        out = self._record("conv", spec, out_shape, {"b": x}, what, weight=weight)
        return self._bias_and_activation(out, bias, activation, params, what)

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
            BackendError: a step's kernel (an explicit choice) has no source for the device's backend.
        """
        outputs = list(outputs)
        self._fuse(outputs)
        self._protect_in_place(outputs)
        aliases = self._relayout_inputs()
        slices = self._concat_slices(outputs)
        self._resolve_paddings()
        self._unalias(aliases)
        outputs = self._download_ready(outputs)
        self._view_reshapes(outputs)
        self._view_concat_slices(slices)
        backend = self.device.backend
        for step in self.steps:   # refused here, as predict would: summary and max_batch say so too
            if step.spec is not None and not step.spec.has_source(backend):
                raise BackendError(f"{step.what}: kernel {step.spec.codename!r} has no {backend} source "
                                   f"(kernels/library.json: its \"sources\" name {', '.join(step.spec.backends())}); "
                                   f"choose another kernel (malinn.use)")
        plan = Plan(self.device, self.batch, self.inputs, outputs, self.steps, self.precision)
        plan.convs = list(self.convs)   # the convolution geometries (malinn tune --model times them)
        return plan

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
        self._fuse_heads(outputs)

    def _fuse_heads(self, outputs) -> None:
        """Computes a small Dense head inside the kernel of the matmul before it (one launch fewer at
        small batches): where the library names a ``matmul_head`` kernel for the device (one whose
        source also runs the first matmul's kernel, in the same configuration), the first matmul's
        result is read by the head alone and is no output, the head fits the kernel (its units,
        the batch, its activation: softmax or one without parameters), and neither kernel was
        chosen with ``use``. The first layer's result then never exists in memory."""
        heads = load_library().default_specs("matmul_head", self.device.kind, self.device.backend)
        if not heads:
            return
        removed = set()
        for head in self.steps:
            x = head.inputs.get("b")
            first = x.producer if x is not None else None
            if (head.kind != "matmul" or first is None or first.kind != "matmul" or id(first) in removed
                    or head.explicit or first.explicit or first.head is not None or x in outputs
                    or len(x.consumers) != 1 or first.affine is not None or head.affine is not None
                    or x.storage.view is not None or first.spec.precision != head.spec.precision):
                continue
            spec = self._head_kernel(heads, first, head)
            if spec is None:
                continue
            first.spec, first.head = spec, (head.weight, head.bias, head.activation)
            first.layers += [layer for layer in head.layers if layer not in first.layers]
            first.what = f"{first.what} and {head.what}"
            first.out = head.out
            head.out.producer = first
            x.consumers.remove(head)
            removed.add(id(head))
        self.steps = [step for step in self.steps if id(step) not in removed]

    def _head_kernel(self, heads, first: Step, head: Step) -> KernelSpec | None:
        """The first of ``heads`` that runs ``first``'s kernel in its configuration with ``head``
        computed in it, configured for the head, or ``None``."""
        library = load_library()
        units = head.weight.shape[0]
        activation = head.activation or "linear"
        if activation not in ("linear", "softmax") and (elementwise_kernel(activation) is None
                                                         or library.activation_spec(activation).params):
            return None
        for spec in heads:
            if (spec.source_path != first.spec.source_path or spec.function != first.spec.function
                    or first.spec.precision not in spec.precisions
                    or any(spec.matrices[x].layout != first.spec.matrices[x].layout for x in "ab")
                    or spec.matrices["r"].layout != head.spec.matrices["r"].layout):
                continue
            config = {k: v for k, v in first.spec.config.items() if k in spec.config and not k.startswith("HEAD")}
            config.update(HEAD_UNITS=units, HEAD_BIAS=int(head.bias is not None),
                          HEAD_SOFTMAX=int(activation == "softmax"),
                          HEAD_ACTIVATION="act_linear" if activation == "softmax" else f"act_{activation}")
            try:
                configured = spec.configure(config)
            except LibraryError:
                continue   # more units than the kernel takes
            if configured.accepts(*first.weight.shape, first.inputs["b"].cols, device=self.device) \
                    and configured.fits(self.device):
                return configured.in_precision(first.spec.precision)
        return None

    def _absorb(self, matmul: Step, step: Step) -> bool:
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
    def _shape(matmul: Step) -> tuple:
        return matmul.weight.shape + (matmul.inputs["b"].cols,)

    def _softmax_kernel(self, matmul: Step):
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

    def _swap_operands(self, step: Step, index: int, outputs) -> bool:
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

    def _share_storage(self, value: Value, storage: Storage) -> None:
        """Points every in-place successor of ``value`` at ``storage`` too (walked with a list, not by
        recursion: a chain of thousands of in-place layers has no depth limit)."""
        pending = [value]
        while pending:
            value = pending.pop()
            value.storage = storage
            pending.extend(consumer.out for consumer in reversed(value.consumers)
                           if consumer.in_place and consumer.inputs.get("b") is value and consumer.out is not value)

    def _relayout_step(self, x: Value, layout: Layout | None, what: str) -> Step:
        """A step copying ``x`` into a new storage in ``layout`` (None: decided like any result)."""
        spec = choose("relayout", self.device)
        out = Value(x.shape, Storage(x.rows, x.cols, layout), name=f"{what} (re-laid out)")
        step = Step("relayout", spec, out, {"a": x}, what)
        out.producer = step
        x.consumers.append(step)
        return step

    def _wanted(self, step: Step, slot: str):
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
                alias = layout is not None and storage.layout != layout and may_alias(storage, layout, x, col_mult)
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
            copy.out.storage.padded = (round_up(x.rows, row_mult), x.storage.padded[1])
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
        self._couple_reshapes()
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
            storage.padded = (round_up(storage.rows, storage.row_mult), round_up(storage.cols, col_mult))

    def _couple_reshapes(self) -> None:
        """A reshape that keeps its input's matrix view in the same layout (a Reshape of the leading
        axes) pads its result as its input: so the result can be a view of the input's buffer
        (:meth:`_view_reshapes` needs equal leading dimensions) where the producer pads its rows more
        than the reader asks (a GPU gemv pads a layer's units to its work-group's rows). A matmul
        reading the result then reads the larger K: its weight copy is padded to it, with zeros."""
        for step in self.steps:
            if step.kind != "reshape":
                continue
            x, y = step.inputs["a"], step.out
            xs, ys = x.storage, y.storage
            if (x.rows, x.cols) != (y.rows, y.cols) or xs.layout is None or str(xs.layout) != str(ys.layout):
                continue
            xs.row_mult = ys.row_mult = math.lcm(xs.row_mult, ys.row_mult)
            if xs.root() is not ys.root():
                ys.root().group = xs.root()

    def _storages(self) -> list:
        return storages_of(self.inputs, self.steps)

    # ---------------------------------------------------------------- views (no copy)
    def _view_reshapes(self, outputs) -> None:
        """A reshape whose result's matrix view lies in its input's memory as the layout already
        holds it becomes a view of that memory (nothing launched): the same matrix in the same
        layout (read with the input's leading dimension, no further than its padding), or, where both buffers hold their values in Keras's flat
        order from the first float on (:func:`_keras_flat`), any shape whose padding falls inside
        the input's buffer (where the input's padding, zeros, lies). Kept as a copy where an in-place step would write
        the shared memory while the other tensor is still read."""
        for index, step in enumerate(self.steps):
            if step.kind != "reshape" or step.view:
                continue
            x, y = step.inputs["a"], step.out
            xs, ys = x.storage, y.storage
            same = str(xs.layout) == str(ys.layout) and (x.rows, x.cols) == (y.rows, y.cols) and (
                xs.padded == ys.padded   # (R: fewer padded rows read, C: fewer padded columns; both zeros)
                or str(xs.layout) == "R" and xs.padded[1] == ys.padded[1] and ys.padded[0] <= xs.padded[0]
                or str(xs.layout) == "C" and xs.padded[0] == ys.padded[0] and ys.padded[1] <= xs.padded[1])
            flat = (_keras_flat(x) and _keras_flat(y)
                    and ys.padded[0] * ys.padded[1] <= xs.padded[0] * xs.padded[1])
            if not (same or flat) or ys.base is not None or ys is xs:
                continue
            if self._writes_while_read(index, xs.memory(), ys, outputs):
                continue
            ys.base = xs.memory()
            step.view = True

    def _concat_slices(self, outputs) -> list:
        """The Concatenate steps (on the last axis) whose input a matmul can write straight into
        its slice of the result (its kernel's epilogue takes ``view``, both in R or both in C, the
        input read by nothing else): ``[(concat steps of one result, [the steps whose inputs
        may be views])]``, on OpenCL (the GL kernels take no views). Couples each such input's column padding with the result's, so the
        slice has the result's columns (decided for good by :meth:`_view_concat_slices`)."""
        chains: dict = {}
        for step in self.steps:
            if step.kind == "concat":
                chains.setdefault(id(step.out.storage), []).append(step)
        found = []
        for chain in chains.values():
            result = chain[-1].out.storage
            writable = []
            for step in chain:
                x = step.inputs["a"]
                producer = x.producer
                if (self.device.backend == "opencl" and int(step.spec.config.get("INNER", 0)) == 1
                        and producer is not None and producer.kind == "matmul"
                        and "view" in producer.spec.epilogue and x.consumers == [step] and x not in outputs
                        and x.storage is not result and str(x.storage.layout) in ("R", "C")
                        and str(x.storage.layout) == str(result.layout)
                        and not any(s.out.storage is x.storage for s in self.steps if s is not producer)):
                    writable.append(step)
                    x.storage.root().group = result.root()
            if writable:
                found.append((chain, writable))
        return found

    def _view_concat_slices(self, found) -> None:
        """Makes the inputs :meth:`_concat_slices` found views into the Concatenate's buffer: the
        matmul writes its slice (rows ``OFFSET`` to ``OFFSET + ALEN`` of the result's matrix view)
        through ``R_AT`` with an offset and a leading dimension, and that input's concat step
        launches nothing. The padding of the result is zeroed by a concat step that stays (the
        last input's, where every input was a view and the result has padded rows)."""
        for chain, writable in found:
            result = chain[-1].out.storage
            rows, cols = result.padded
            total = int(chain[0].spec.config["RLEN"])
            views = [step for step in writable if step.inputs["a"].storage.padded[1] == cols]
            last = chain[-1]
            # the last slice's kernel writes the result's padding rows too (as zeros) where its
            # own padded rows reach that far; else a concat launch stays to zero them
            covers = last in views and last.inputs["a"].storage.padded[0] >= rows - int(last.spec.config["OFFSET"])
            if len(views) == len(chain) and rows > total and not covers:
                views = views[:-1]
            if not views:
                continue
            for step in views:
                x = step.inputs["a"]
                offset = int(step.spec.config["OFFSET"])
                row_major = str(result.layout) == "R"
                x.storage.base = result
                x.storage.view = {"R_VIEW": 1, "R_OFFSET": offset * cols if row_major else offset,
                                  "R_LD": cols if row_major else rows,
                                  "R_ROWS": rows - offset if step is last else x.rows, "R_SPARE": rows * cols}
                step.view = True
            result.min_elements = rows * cols + 1   # the spare float that rows past a slice go to
            kept = [step for step in chain if not step.view]
            for i, step in enumerate(kept):
                step.spec = step.spec.configure({"FIRST": int(i == 0)})

    def _writes_while_read(self, index: int, memory: Storage, view: Storage, outputs) -> bool:
        """Whether, after step ``index``, an in-place step writes ``view`` while a tensor in
        ``memory`` is read at or after it, or writes ``memory`` while ``view`` is read then
        (outputs count as read at the end)."""
        end = len(self.steps)

        def held(storage, group) -> bool:
            return storage is group if group is view else storage.memory() is group

        def first_write(group) -> int:
            return next((j for j in range(index + 1, end) if self.steps[j].in_place
                         and held(self.steps[j].out.storage, group)), end + 1)

        def last_read(group) -> int:
            reads = [j for j in range(index + 1, end) for v in self.steps[j].inputs.values() if held(v.storage, group)]
            reads += [end for v in outputs if held(v.storage, group)]
            return max(reads, default=-1)

        return first_write(view) <= last_read(memory) or first_write(memory) <= last_read(view)
