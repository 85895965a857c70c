"""Models: :class:`PlannedModel`, what every model shares: plans per device and batch bucket,
predict, memory, weights, saving and the summary. :class:`~malinn.model.sequential.Sequential` and
:class:`~malinn.model.functional.Functional` are its two kinds."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from ..backends.base import Device, size_text
from ..backends.selection import get_device
from ..choice.kernel_choice import epoch as choice_epoch
from ..errors import BackendError, DeviceError
from ..library.precision import check_precision
from ..plan.builder import PlanBuilder
from ..plan.plan import Plan
from ..registry import lookup
from .predicting import Predicting
from .saving import save_model
from .summary import column_widths, wrapped

__all__ = ["PlannedModel", "batch_bucket"]

#: more than any kernel pads a dimension by (layout chunks and work-group tiles are at most 128)
_PAD_BOUND = 1024
#: plans kept per model (each holds its activation buffers): always the last _PLANS_KEPT, and up to
#: _PLANS_KEPT_MOST while the kept plans' activation buffers total at most _PLANS_KEPT_BYTES (a
#: service that answers 1..N samples at a time would otherwise make a plan on every call past N = 8:
#: 2 ms a predict against 0.1 ms for a small model)
_PLANS_KEPT = 8
_PLANS_KEPT_MOST = 128
_PLANS_KEPT_BYTES = 64 * 2**20


def batch_bucket(n: int) -> int:
    """The batch size a pass of ``n`` samples is planned for: ``n`` itself up to 256 (a plan of its
    own per size, so nothing is padded where serving latency matters), then the next multiple of
    64 (large passes share plans; padded samples are computed and dropped).

    Raises:
        ValueError: ``n`` is not a positive whole number of samples.
    """
    n = _samples(n, "a pass holds")
    return n if n <= 256 else -(-n // 64) * 64


def _samples(n, what: str) -> int:
    """``n`` as an int where it is a positive whole number of samples, else a ValueError saying ``what``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what} a positive whole number of samples, got {n!r}")
    return int(n)


class PlannedModel(Predicting):
    """What every malinn model shares: plans per device and batch bucket, passes, memory, weights.

    A subclass says what its inputs are and how its layers lower into a plan:

    * ``input_shapes``: one sample's shape per input (``None`` before build);
    * ``_lower(builder, every_layer)``: records the steps on a :class:`~malinn.plan.builder.PlanBuilder`
      and returns the values to download (every layer call's output with ``every_layer``);
    * ``_output_shapes(every_layer)``: the shapes of those values (batch axis first);
    * ``_check_inputs(x, convert=True)``: the inputs as float32 C-contiguous arrays, in input order
      (with ``convert=False``: checked arrays as given, a memory-mapped one not read);
    * ``_input_casts()``: per input, the cast to its dtype or None.

    The first ``predict`` for a device and batch size compiles the model into a plan
    (:mod:`malinn.plan.plan`): kernels, layouts, paddings, weight buffers, an activation arena and the
    launches with their arguments are decided once. Every ``predict`` after that is one upload per
    input, the launches and one download per output. A batch whose activations would not fit in
    one device allocation is split into passes automatically (:meth:`max_batch`).

    ``predict`` may be called from several threads at once on one model; each call gives the
    result a single-threaded call gives (docs/RELIABILITY.md). Changing the model (``add``,
    ``build``, ``set_weights``) while another thread predicts is not supported.

    ``precision`` says how the weights of the layers that read a weight matrix (Dense and the
    convolutions) are stored on the device and summed: ``fp32`` (the default), ``fp16-storage``
    (half weights, float arithmetic), ``fp16`` (half arithmetic too, on devices with
    cl_khr_fp16) or ``int8-weights`` (per-output-channel int8 with float scales, float
    arithmetic); docs/CONVERTING.md gives what each costs in accuracy. Activations, and the
    layers without weights (merges among them), stay float32.

    Args:
        name: the model's name.
        precision: the weights' precision (default ``fp32``).

    Raises:
        ValueError: ``precision`` is unknown.
    """

    def __init__(self, name: str, precision: str = "fp32"):
        self.name = name
        self._precision = check_precision(precision)
        self.layers: list = []
        self.source = None                      # the Keras file it came from, when converted
        self._lock = threading.RLock()          # guards the caches below (never held while planning)
        self._plans: OrderedDict = OrderedDict()
        self._planning: dict = {}               # a lock per plan being made: several threads make it once
        self._last = None       # (device, samples, stamp, limits, plan, plain input shape) of the last one-pass call
        self._max_batches: OrderedDict = OrderedDict()   # what max_batch found, by device, model and limit

    @property
    def input_shapes(self) -> list | None:
        raise NotImplementedError

    @property
    def precision(self) -> str:
        """The weights' precision on the device (``fp32``, ``fp16-storage``, ``fp16``, ``int8-weights``)."""
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        value = check_precision(value)
        with self._lock:
            if value != self._precision:
                self._precision = value
                self._plans.clear()
                self._last = None

    @property
    def built(self) -> bool:
        return self.input_shapes is not None and all(layer.built for layer in self.layers)

    def _not_built(self) -> ValueError:
        return ValueError(f"{type(self).__name__} {self.name!r} is not built; call build(input_shape) first")

    # ---------------------------------------------------------------- plans
    def _stamp(self) -> tuple:
        return tuple(layer.version for layer in self.layers) + (choice_epoch(),)

    def plan(self, batch: int, device: Device | None = None, every_layer: bool = False, replica: int = 0) -> Plan:
        """The compiled plan for passes of ``batch`` samples on ``device`` (made on first use).

        Args:
            batch: the samples one pass takes (it is planned for :func:`batch_bucket` of it).
            device: the device (default: the current one).
            every_layer: download every layer's output (for :meth:`predict_layers` and verify).
            replica: which of the device's plans for this size (a device listed twice in
                ``predict``'s devices runs two: 0 and 1).

        Returns:
            An allocated :class:`~malinn.plan.plan.Plan`.
        """
        device = device or get_device()
        # the device object itself: two GPUs of one model and driver have the same identity string
        key = (device.identity, id(device), batch_bucket(batch), every_layer, self._precision, replica)
        stamp = self._stamp()
        with self._lock:
            cached = self._cached_plan(key, stamp)
            if cached is not None:
                return cached
            planning = self._planning.setdefault(key, threading.Lock())
        # planned under this key's own lock and the device's plan lock (one plan made at a time per
        # device: PoCL's pthread driver aborted now and then when two were bound at once), never the
        # model's: its kept plans run meanwhile, and a second thread asking for this one waits for it
        with planning:
            with self._lock:
                cached = self._cached_plan(key, stamp)
            if cached is not None:
                return cached
            try:
                with device.plan_lock:
                    plan = self._compile(device, batch_bucket(batch), every_layer).allocate(model=self.name)
            except BaseException:
                with self._lock:
                    self._planning.pop(key, None)
                raise
            with self._lock:
                self._plans[key] = (stamp, plan, plan.activation_bytes()[2])
                self._plans.move_to_end(key)
                self._planning.pop(key, None)
                self._evict_plans(stamp)
            return plan

    def _evict_plans(self, stamp: tuple) -> None:
        """Drops the plans made at another model state than ``stamp`` (never used again; they hold
        the weight copies their launches were bound to), then the least recently used beyond
        :data:`_PLANS_KEPT` while more than :data:`_PLANS_KEPT_MOST` are kept or their activation
        buffers exceed :data:`_PLANS_KEPT_BYTES`; called under ``_lock``."""
        for key in [key for key, kept in self._plans.items() if kept[0] != stamp]:
            del self._plans[key]

        def held() -> int:
            return sum(nbytes for _, _, nbytes in self._plans.values())

        while len(self._plans) > _PLANS_KEPT and (len(self._plans) > _PLANS_KEPT_MOST or held() > _PLANS_KEPT_BYTES):
            self._plans.popitem(last=False)

    def _cached_plan(self, key: tuple, stamp: tuple) -> Plan | None:
        """The kept plan for ``key`` made at model state ``stamp`` (moved to the newest), or None;
        called under ``_lock``."""
        cached = self._plans.get(key)
        if cached is None or cached[0] != stamp:
            return None
        self._plans.move_to_end(key)
        return cached[1]

    def _compile(self, device: Device, batch: int, every_layer: bool) -> Plan:
        """A plan, decided but not allocated (what memory estimates read)."""
        if self.input_shapes is None:
            raise self._not_built()
        builder = PlanBuilder(device, batch, self._precision)
        outputs = self._lower(builder, every_layer)
        builder.layer = None
        return builder.compile(outputs)

    def _lower(self, builder: PlanBuilder, every_layer: bool) -> list:
        raise NotImplementedError

    def _output_shapes(self, every_layer: bool) -> list:
        raise NotImplementedError

    # ---------------------------------------------------------------- memory planning
    def activation_bytes(self, batch: int, device: Device | None = None) -> tuple[int, str]:
        """The largest device buffer a pass of ``batch`` samples allocates for activations.

        Args:
            batch: samples in the pass.
            device: the device (default: the current one).

        Returns:
            ``(bytes, what)``: the size and a description naming the layer and padded shape.
        """
        device = device or get_device()
        size, what, _ = self._compile(device, batch_bucket(batch), False).activation_bytes()
        return size, what

    def matmul_shapes(self, batch: int, device: Device | None = None) -> list:
        """``(units, inputs, columns)`` of every matmul a pass of ``batch`` samples runs (the shapes
        ``malinn tune --model`` times: the plan asks the tuning database for exactly these).

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            A list of ``(m, k, n)`` tuples: one per matmul step of the plan, and one for the Dense
            layer a step computes in the same launch (a fused head).

        Raises:
            ValueError: the model is not built.
            DeviceError: there is no working device, or a buffer or weight does not fit it (the
                message names the layer).
        """
        return self._compile(device or get_device(), batch_bucket(batch), False).matmul_shapes()

    def conv_geometries(self, batch: int, device: Device | None = None) -> list:
        """The :class:`~malinn.choice.conv_geometry.ConvGeometry` of every convolution a pass of ``batch``
        samples runs (1x1 convolutions run as matmuls are not among them): what ``malinn tune
        --model`` times, and what the plan asks the tuning database about.

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            A list of :class:`~malinn.choice.conv_geometry.ConvGeometry`, one per convolution lowered.

        Raises:
            ValueError: the model is not built.
            DeviceError: there is no working device, or a buffer or weight does not fit it (the
                message names the layer).
        """
        return self._compile(device or get_device(), batch_bucket(batch), False).convs

    def memory(self, batch: int, device: Device | None = None) -> dict:
        """Bytes a pass of ``batch`` samples holds on the device: ``weights`` (all the weight copies its
        kernels read), ``largest_weight`` (the largest of them, one allocation), ``activations``
        (the arena) and ``largest`` (its largest buffer).

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            ``{"weights", "largest_weight", "activations", "largest"}``, each in bytes.

        Raises:
            ValueError: the model is not built, or ``batch`` is not a positive number of samples.
            DeviceError: there is no working device, or the device cannot run a layer (a kernel
                whose loops it would end). A weight larger than the device's largest allocation is
                reported, not refused (``largest_weight``): ``predict`` refuses it naming the layer.
        """
        device = device or get_device()
        plan = self._compile(device, batch_bucket(batch), False)
        largest, _, arena = plan.activation_bytes()
        weights = plan.weight_sizes()
        return {"weights": plan.weight_bytes(), "largest_weight": max(weights, default=0), "activations": arena,
                "largest": largest}

    def max_batch(self, device: Device | None = None, limit: int | None = None) -> int:
        """The most samples one device pass may take, so that no activation buffer exceeds the
        device's largest single allocation (nor a quarter of its global memory), and the weights
        and the pass's activations together fit the device's global memory.

        ``predict`` splits larger batches into passes of this many samples.

        Args:
            device: the device (default: the current one).
            limit: stop searching at this many samples (default: 2**31).

        Returns:
            A positive number of samples (found once per device, model state and ``limit``; later
            calls read it).

        Raises:
            ValueError: the model is not built, or ``limit`` is not a positive whole number.
            DeviceError: even one sample's activations do not fit (the message names the layer,
                the padded shape and the device's limit), or the weights and one sample's
                activations exceed the device's global memory.
        """
        if self.input_shapes is None:
            raise self._not_built()
        device = device or get_device()
        budget = min(int(device.max_allocation), int(device.global_memory) // 4)
        limit = _samples(limit, "max_batch: limit must be") if limit is not None else 2**31
        key = (device.identity, self._precision, self._stamp(), budget, int(device.global_memory), limit)
        with self._lock:
            found = self._max_batches.get(key)
        if found is None:
            found = self._search_max_batch(device, budget, limit)
            with self._lock:
                self._max_batches[key] = found
                while len(self._max_batches) > 4 * _PLANS_KEPT:
                    self._max_batches.popitem(last=False)
        return found

    def _search_max_batch(self, device: Device, budget: int, limit: int) -> int:
        """:meth:`max_batch`, found (planning the model where the quick bound does not settle it)."""
        # the common case without planning: a tensor is a matrix of its last axis by the batch's
        # other positions, each dimension padded by less than _PAD_BOUND (a convolution's 4
        # channels padded to 32 rows: its columns are batch x pixels); a convolution's patch matrix
        # stays within a quarter of the largest allocation (conv_choice.patch_budget, padded)
        # (and twice as many such tensors as the model has, beside its float32 weights each padded as
        # much, within the device's memory)
        bucket = batch_bucket(limit)
        shapes = list(self.input_shapes) + [s[1:] for s in self._output_shapes(True)]
        bound = max(4 * (s[-1] + _PAD_BOUND) * (bucket * math.prod(s[:-1]) + _PAD_BOUND) for s in shapes)
        weights = sum(4 * (cols + _PAD_BOUND) * (w.size // max(cols, 1) + _PAD_BOUND)
                      for layer in self.layers for w in layer.weight_arrays() for cols in (w.shape[-1] if w.ndim else 1,))
        memory = int(device.global_memory)
        if bound <= budget // 2 and weights + 2 * len(shapes) * bound <= memory:
            return limit

        def fits(batch: int) -> bool:
            plan = self._compile(device, batch_bucket(batch), False)
            largest, _, arena = plan.activation_bytes()
            return largest <= budget and plan.weight_bytes() + arena <= memory

        if fits(limit):
            return limit
        if not fits(1):
            plan = self._compile(device, 1, False)
            size, what, arena = plan.activation_bytes()
            weights = plan.weight_bytes()   # the plan's own (the bound above pads every array generously)
            if size > budget:
                raise DeviceError(f"{what} needs {size_text(size)} ({size:,} bytes), more than {device.name} allows in "
                                  f"one allocation ({size_text(budget)}, {budget:,} bytes): even one sample does not fit")
            raise DeviceError(f"{type(self).__name__} {self.name!r}: its weights ({size_text(weights)}) and one sample's "
                              f"activations ({size_text(arena)}) need more than {device.name}'s global memory "
                              f"({size_text(memory)}, {memory:,} bytes)")
        low, high = 1, limit   # fits(low), not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid):
                low = mid
            else:
                high = mid
        return low

    # ---------------------------------------------------------------- weights and files
    def get_weights(self) -> list:
        """Every layer's weights, in order, in Keras's shapes."""
        return [w for layer in self.layers for w in layer.get_weights()]

    def set_weights(self, weights) -> None:
        """Sets every layer's weights from a flat list, as ``get_weights`` returns it.

        Args:
            weights: the arrays in Keras's shapes and layer order (a Dense layer's kernel
                ``(in, out)``, then its bias ``(out,)``).

        Raises:
            ValueError: the model is not built, or the count or a shape does not match (no layer's
                weights are changed then).
        """
        if isinstance(weights, (str, bytes, dict)) or not hasattr(weights, "__iter__"):
            raise ValueError(f"{type(self).__name__} {self.name!r}: set_weights takes a list of arrays, as "
                             f"get_weights returns it; got {type(weights).__name__}")
        weights = list(weights)
        if not self.built:
            raise self._not_built()
        before = [layer.weight_arrays() for layer in self.layers]   # read-only: kept as they are
        want = sum(len(w) for w in before)
        if len(weights) != want:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects {want} weight arrays, got {len(weights)}")
        done = []
        try:
            for layer, old in zip(self.layers, before):
                layer.set_weights(weights[:len(old)])
                done.append((layer, old))
                weights = weights[len(old):]
        except Exception:   # all or nothing, as Keras: the layers set before the bad array get theirs back
            for layer, old in done:
                layer.set_weights(old)
            raise

    def save(self, path, target=None, overwrite: bool = False):
        """Writes a malinn model file (see :func:`malinn.model.saving.save_model`).

        Args:
            path: the destination; written atomically.
            target: a matmul codename, a device kind (``gpu``, ``cpu``, ``accelerator``) or one of
                a backend (``gl``, ``gl:cpu``, ``gles3``, ``opencl:cpu``, ...) whose layouts the
                weights are stored in (default: the current device's kernel).
            overwrite: allow ``path`` to be the Keras file the model was converted from.

        Returns:
            The path written.

        Raises:
            ConversionError: the model is not built or the file cannot be written.
        """
        return save_model(self, path, target, overwrite=overwrite)

    def count_params(self) -> int:
        """The number of weight values of every layer together, as Keras's ``count_params``.

        Raises:
            ValueError: the model is not built (its weights do not exist yet), as Keras's.
        """
        if not self.built:
            raise self._not_built()
        return sum(layer.count_params() for layer in self.layers)

    def __reduce__(self):
        """Pickles the model as its config and weights, as Keras models pickle (Ray and
        multiprocessing send a model to their workers so); its plans and device buffers stay
        behind: the copy makes its own on its process's device."""
        return (_unpickled, (type(self), self.get_config(), self.get_weights() if self.built else None, self.source))

    @classmethod
    def from_config(cls, config: dict) -> "PlannedModel":
        """The model :meth:`get_config` describes, as Keras's ``from_config`` makes it: its layers
        made from their configs, with new weights (``set_weights`` or ``malinn.load_model`` for
        trained ones).

        Args:
            config: what ``get_config`` returned.

        Returns:
            The model, built where the config names its input shape.

        Raises:
            ValueError: a layer's config is refused by its class, or the config is inconsistent.
            KeyError: a layer class that malinn does not have.
        """
        layers = [lookup("layer", entry["class_name"]).from_config(entry["config"]) for entry in config["layers"]]
        return cls.from_layers(config, layers, precision=check_precision(config.get("precision")))

    def summary(self, line_length: int | None = None, positions=None, print_fn=None, batch: int = 1,
                show_kernels: bool = False) -> str:
        """Prints (and returns) the model as Keras does: each layer with its output shape and
        parameters (a graph's: the tensors it is connected to, ``layer[call][0]``), then the weights'
        device memory; with ``show_kernels``, also the kernels that run each layer on the current
        device for passes of ``batch`` samples, in order (a convolution as patches then a product:
        ``im2col, gemm_tiled + bias+relu``; layers fused into one launch share it).

        Args:
            line_length: the table's width in characters, as Keras's (default: the terminal's
                width, at most :data:`~malinn.model.summary.SUMMARY_WIDTH`; a narrower table where every cell fits). A
                cell longer than its column is wrapped onto the lines below.
            positions: where each column ends, as Keras's: fractions of ``line_length`` (each at
                most 1) or characters, one per column (default with ``line_length``: Keras's, 0.45,
                0.85, 1.0 for three columns and 0.33, 0.55, 0.67, 1.0 for four).
            print_fn: called once with the whole table (default: :func:`print`), as Keras's (also
                taken as the first argument, where earlier malinn code passes it there).
            batch: the pass size whose plan's kernels the table shows (default 1).
            show_kernels: add the column of the kernels that run each layer (default False: Keras's
                columns only; ``malinn summary`` shows them).

        Returns:
            The table's text. Where the device refuses the plan (a buffer that does not fit), the
            layers are still listed and the last line says why; an unbuilt model's parameters are
            counted as 0 (unbuilt).

        Raises:
            ValueError: ``line_length`` is not a positive integer, or ``positions`` do not give one
                increasing end per column.
        """
        if callable(line_length) and print_fn is None:   # summary(print): malinn 0.1's first argument
            line_length, print_fn = None, line_length
        kernels, weights, refused = self._kernels(batch)
        rows = self._summary_rows(kernels)
        if not show_kernels:
            rows = [row[:-1] for row in rows]
        widths = column_widths(rows, line_length, positions)
        return self._table(rows, widths, print_fn or print, weights, refused)

    def _summary_rows(self, kernels: dict) -> list:
        """The table's rows (the header first), each layer's kernels from ``kernels``."""
        raise NotImplementedError

    def _kernels(self, batch: int) -> tuple[dict, tuple | None, str | None]:
        """``(kernels, weights, refused)``: layer name -> the kernel (and what it fuses) that runs it
        on the current device, ``(bytes on the device, bytes in fp32)`` of the weights (None when
        the model is not built or cannot be planned), and why the device refused the plan (None
        where it did not)."""
        kernels, weights, refused = {}, None, None
        if self.built:
            try:
                plan = self._compile(get_device(), batch_bucket(batch), False)
                launched = {}
                for row in plan.describe():
                    for name in row["layers"]:   # every kernel a layer launches, in order, else "view (no copy)"
                        text = row["kernel"] + (" + " + "+".join(row["fused"]) if row["fused"] else "")
                        if row["view"]:
                            kernels.setdefault(name, text)
                        else:
                            launched.setdefault(name, []).append(text)
                kernels.update({name: ", ".join(texts) for name, texts in launched.items()})
                weights = (sum(plan.weight_sizes()), sum(4 * r * c for r, c in plan.weight_paddings()))
            except (DeviceError, BackendError) as exc:   # the table still shows the layers; the last line says why
                refused = " ".join(str(exc).split())
        return kernels, weights, refused

    def _table(self, rows, widths: list, print_fn, weights: tuple | None = None, refused: str | None = None) -> str:
        """Prints (and returns) a Keras-style summary of ``rows`` (the header first) in columns of
        ``widths`` characters (a longer cell wrapped onto the lines below, as Keras's)."""
        line = "-" * sum(widths)
        out = [f'Model: "{self.name}"', line]
        for i, r in enumerate(rows):
            cells = [wrapped(c, w - 1) for c, w in zip(r, widths)]
            for k in range(max(len(c) for c in cells)):
                out.append("".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
            if i == 0:
                out.append("=" * sum(widths))
        out += ["=" * sum(widths), f"Total params: {self.count_params() if self.built else '0 (unbuilt)'}"]
        if weights is not None and weights[1]:
            out.append(f"Weights on the device: {size_text(weights[0])} in {self._precision} "
                       f"({weights[0] / weights[1]:.3f} of {size_text(weights[1])} in fp32)")
        if refused is not None:
            out.append(f"No kernels on {get_device().name}: {refused}")
        out.append(line)
        text = "\n".join(out)
        print_fn(text)
        return text


def _unpickled(cls, config: dict, weights, source) -> PlannedModel:
    """The model :meth:`PlannedModel.__reduce__` pickled."""
    model = cls.from_config(config)
    if weights is not None:
        model.set_weights(weights)
    model.source = source
    return model
